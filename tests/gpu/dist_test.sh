#!/usr/bin/env bash
# Issue 6 on the GPU machine: flexshim in every process of a torch.distributed job.
#
#   OUT=/some/dir bash tests/gpu/dist_test.sh        (from the repository root, dist/ carried)
#
# Each job is `python3 -m torch.distributed.run --standalone --nproc-per-node N` (torchrun) running
# tests/gpu/dist_test.py run: a tensor-parallel Llama-style model (about 1 GB of bf16 weights in
# all, split over the ranks), a 512-token prefill and STEPS greedy decode steps with deterministic
# kernels, plus an all_reduce probe on a 64 MiB buffer that is left idle during the model run
# (evicted under a budget). Shimmed ranks are started through a small wrapper ($W/rank_env.sh)
# that preloads dist/lib/libflexshim.so into the worker only (not into torchrun's agent), leaves
# FLEXTENSOR_DEVICE unset as a plain `LD_PRELOAD=... torchrun` would (the shim then manages the
# device of each process's first allocation; DIST_DEVICE_PER_RANK=1 sets FLEXTENSOR_DEVICE=
# LOCAL_RANK instead) and gives each rank its own budget
# (FLEXTENSOR_GPU_MEMORY_LIMIT, a fraction of that rank's weights as measured by the reference).
# FLEXTENSOR_LOG_FILE=...-shim-rank{rank}.log for every shimmed run and, for the runs marked
# "profile", FLEXTENSOR_PROFILE_OUT=...-prof-rank{rank}.json: each rank's file must appear (the
# shim expands {rank}), and each profile must pass `flexshim-profile check`.
#
# Phases (PHASES, default "nccl gloo tp2"); runs per phase as label:fraction:safety[:profile]:
#   nccl  one rank, backend nccl: reference without the shim, then NCCL_RUNS
#         (default "q2:2:strict q4:4:strict q4t:4:tracked:profile")
#   gloo  one rank, backend gloo (collectives on CPU copies): reference, then GLOO_RUNS
#         (default "q2:2:strict q4:4:strict"); the gloo reference is also compared with the nccl
#         one (a NOTE: with one rank they should be identical)
#   tp2   two ranks, nccl (TP2_BACKEND), when `nvidia-smi -L` lists 2 or more GPUs (else SKIP):
#         reference, then TP2_RUNS (default "q2:2:strict q4t:4:tracked:profile"), per-rank
#         budgets, each rank compared with the same rank of the unshimmed 2-rank run
# On a machine of several GPUs, PHASES="tp2 nccl gloo" runs the 2-rank phase first.
# A shimmed run PASSes when it exits 0, every rank's prefill logits are bit-identical to the
# reference's and its tokens the same, the probes' sums are exact, each rank's shim log exists
# with exit counters, something was managed and offloaded in each rank; WARN for internal
# failures, shim error lines, or a missing/invalid profile. Per rank it reports the median decode
# step (after WARMUP steps) against the reference's and against the transfer limit
# max(reference, offloaded bytes / LINK_GBPS), and the shim's counters (evictions, fault-ins,
# host-served references, forced synchronizes, allocations passed through, launches whose
# parameters were unreadable): how NCCL's buffers and kernels were treated.
#
# Time: everything ends within TOTAL_BUDGET_S (default 240 s): each command runs under `timeout`
# cut to what is left (each rank also has a watchdog), a run with less than MIN_RUN_S left is not
# made (FAIL: out of time).
# Output: $OUT/dist.log (everything, as it runs), $OUT/dist-summary.txt (the table),
# $OUT/dist-logs.tar.gz (per-run output, JSON, shim logs, profiles, evaluations; rewritten after
# every phase). Exit 0 when nothing failed.
set -uo pipefail
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 FLEXTENSOR_CONFIG=
# Never NVLink multicast on the shared multi-GPU hosts (KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
# One host: gloo over loopback (its default resolves the host name, which may not resolve).
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
. "$ROOT/tests/gpu/bundle.sh" # bundle_commit, bundle_check
OUT=${OUT:-$ROOT/out}
mkdir -p "$OUT" || exit 1
W=$(mktemp -d "${TMPDIR:-/tmp}/flexshim-dist.XXXXXX") || exit 1
R=$W/runs
mkdir -p "$R" || exit 1
RESULTS=$W/results.tsv
: >"$RESULTS"

LIB=$ROOT/dist/lib/libflexshim.so
TOOL=$ROOT/dist/bin/flexshim-profile
PY=${PYTHON:-python3}
TEST=$ROOT/tests/gpu/dist_test.py
TOTAL_BUDGET_S=${TOTAL_BUDGET_S:-240}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-90}
MIN_RUN_S=${MIN_RUN_S:-25}
MARGIN_S=${MARGIN_S:-12} # kept for the last compare, the summary and the archive
STEPS=${STEPS:-32}
WARMUP=${WARMUP:-8}
PROMPT_LEN=${PROMPT_LEN:-512}
LAYERS=${LAYERS:-8}
PROBE_MIB=${PROBE_MIB:-64}
LINK_GBPS=${LINK_GBPS:-55}
PHASES=${PHASES:-"nccl gloo tp2"}
NCCL_RUNS=${NCCL_RUNS:-"q2:2:strict q4:4:strict q4t:4:tracked:profile"}
GLOO_RUNS=${GLOO_RUNS:-"q2:2:strict q4:4:strict"}
TP2_RUNS=${TP2_RUNS:-"q2:2:strict q4t:4:tracked:profile"}
TP2_BACKEND=${TP2_BACKEND:-nccl}
DIST_DEVICE_PER_RANK=${DIST_DEVICE_PER_RANK:-0}
# For checks off the GPU machine only: RUN_ARGS="--cpu --layers 2 ..." (more dist_test.py run
# options), GPUS=N (instead of counting nvidia-smi -L).
export DIST_DEVICE_PER_RANK
START_S=$(date +%s)
DEADLINE_S=$((START_S + TOTAL_BUDGET_S))

time_left() { echo $((DEADLINE_S - $(date +%s))); }
# Seconds a command may run: WANT, cut to what is left before the deadline less the margin.
tmo() {
    local want=$1 left
    left=$((DEADLINE_S - $(date +%s) - MARGIN_S))
    ((left < want)) && want=$left
    ((want < 1)) && want=1
    echo "$want"
}
record() { # PHASE RUN RESULT NOTES
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$RESULTS"
    echo "==> $1 $2: $3${4:+ ($4)}"
}
jget() { "$PY" "$TEST" jget "$@" 2>/dev/null; }
pack() {
    (cd "$W" && find . -type f ! -name '*.pt' -size -20M -print0 |
        tar --null -czf "$OUT/dist-logs.tar.gz.tmp" -T - 2>/dev/null) &&
        mv -f "$OUT/dist-logs.tar.gz.tmp" "$OUT/dist-logs.tar.gz"
}

# The per-rank wrapper torchrun starts (--no-python): flexshim only in the workers.
cat >"$W/rank_env.sh" <<'EOF'
#!/bin/sh
# One rank of a torchrun job: flexshim preloaded into this worker (DIST_SHIM_LIB), managing this
# rank's device (unset: the device of its first allocation; DIST_DEVICE_PER_RANK=1 sets
# FLEXTENSOR_DEVICE=LOCAL_RANK), with this
# rank's budget: word number RANK (from 0) of DIST_LIMITS.
if [ -n "${DIST_SHIM_LIB:-}" ]; then
    LD_PRELOAD=$DIST_SHIM_LIB${LD_PRELOAD:+:$LD_PRELOAD}
    export LD_PRELOAD
    if [ -z "${FLEXTENSOR_DEVICE:-}" ] && [ "${DIST_DEVICE_PER_RANK:-0}" = 1 ]; then
        FLEXTENSOR_DEVICE=${LOCAL_RANK:-0}
        export FLEXTENSOR_DEVICE
    fi
    i=0
    for l in ${DIST_LIMITS:-}; do
        if [ "$i" = "${RANK:-0}" ]; then
            FLEXTENSOR_GPU_MEMORY_LIMIT=$l
            export FLEXTENSOR_GPU_MEMORY_LIMIT
        fi
        i=$((i + 1))
    done
fi
exec "$@"
EOF

# trun NAME NPROC BACKEND [LIMITS SAFETY PROFILE]: one torchrun job, shimmed when LIMITS (one
# budget per rank) is given; outputs $R/NAME*, its exit status in $R/NAME.rc (125: not made, out
# of time; 126: no libflexshim.so).
trun() {
    local name=$1 nproc=$2 backend=$3 limits=${4:-} safety=${5:-strict} prof=${6:-0}
    local t rc t0=$SECONDS envs=() pj=false
    rm -f "$R/$name".* "$R/$name"-*
    [ "$prof" = 1 ] && pj=true
    printf '{"world": %s, "backend": "%s", "limits": "%s", "safety": "%s", "profile": %s}\n' \
        "$nproc" "$backend" "$limits" "${limits:+$safety}" "$pj" >"$R/$name.meta.json"
    t=$(tmo "$RUN_TIMEOUT_S")
    if ((t < MIN_RUN_S)); then
        echo "--- $name: not run, out of time ($(time_left) s left)"
        echo 125 >"$R/$name.rc"
        return 125
    fi
    if [ -n "$limits" ]; then
        if [ ! -f "$LIB" ]; then
            echo "--- $name: not run: no $LIB (make dist, and carry dist/)"
            echo 126 >"$R/$name.rc"
            return 126
        fi
        envs=("DIST_SHIM_LIB=$LIB" "DIST_LIMITS=$limits" FLEXTENSOR_LOG_LEVEL=info
            "FLEXTENSOR_LOG_FILE=$R/$name-shim-rank{rank}.log" "FLEXTENSOR_REMAP_SAFETY=$safety")
        [ "$prof" = 1 ] && envs+=("FLEXTENSOR_PROFILE_OUT=$R/$name-prof-rank{rank}.json")
        echo "--- $name: $nproc rank(s), $backend, flexshim at $limits (per rank), $safety," \
            "profiles recorded: $pj; timeout ${t} s"
    else
        echo "--- $name: $nproc rank(s), $backend, without the shim; timeout ${t} s"
    fi
    # shellcheck disable=SC2086 # RUN_ARGS: several words
    timeout -k 10 "$t" env ${envs[@]+"${envs[@]}"} "$PY" -m torch.distributed.run --standalone \
        --nproc_per_node "$nproc" --no_python /bin/sh "$W/rank_env.sh" \
        "$PY" "$TEST" run --backend "$backend" --out "$R/$name" --steps "$STEPS" \
        --warmup "$WARMUP" --prompt-len "$PROMPT_LEN" --layers "$LAYERS" --probe-mib "$PROBE_MIB" \
        --deterministic ${RUN_ARGS:-} --max-seconds $((t > 15 ? t - 5 : t)) \
        --dist-timeout $((t > 20 ? t - 10 : t)) 2>&1 | tee "$R/$name.out"
    rc=${PIPESTATUS[0]}
    echo "$rc" >"$R/$name.rc"
    echo "--- $name: exit $rc, $((SECONDS - t0)) s"
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        echo "--- $name: TIMED OUT (a rank's watchdog at $((t > 15 ? t - 5 : t)) s," \
            "or timeout at $t s)"
        # torchrun starts each worker in a session of its own, so timeout's signal reaches them
        # only through torchrun: end any of this run's workers left (by pid).
        local pid
        for pid in $(pgrep -f -- "--out $R/$name --steps" 2>/dev/null); do
            echo "--- $name: killing leftover worker $pid"
            kill -9 "$pid" 2>/dev/null
        done
    fi
    if [ "$rc" != 0 ]; then
        echo "--- GPU processes now:"
        timeout 15 nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>&1
    fi
    return "$rc"
}

# evaluate PHASE NAME [REF] [COMPARE_FILE]: one summary row.
evaluate() {
    local phase=$1 name=$2 ref=${3:-} cmpf=${4:-} row res notes
    timeout -k 5 20 "$PY" "$TEST" evaluate "$R" "$name" "$ref" --compare "$cmpf" --tool "$TOOL" \
        --link-gbps "$LINK_GBPS" 2>&1 | tee "$R/$name.eval"
    row=$(grep '^ROW|' "$R/$name.eval" | tail -1)
    if [ -z "$row" ]; then
        record "$phase" "$name" FAIL "evaluation failed (see $name.eval)"
        return
    fi
    res=${row#ROW|}
    res=${res%%|*}
    notes=${row#ROW|*|}
    if [ "$(cat "$R/$name.rc" 2>/dev/null)" = 125 ]; then
        notes="out of time, not run"
    fi
    record "$phase" "$name" "$res" "$notes"
}

# phase PHASE NPROC BACKEND RUNS [INFO_REF]: the reference, the shimmed runs, one compare, rows.
phase() {
    local p=$1 nproc=$2 backend=$3 runs=$4 info_ref=${5:-}
    local ref="$p-ref" spec label frac safety prof r wb b limits names=() args=()
    echo
    echo "================ $p: $nproc rank(s), $backend ($(time_left) s left) ================"
    trun "$ref" "$nproc" "$backend"
    evaluate "$p" "$ref"
    if [ "$(cat "$R/$ref.rc")" != 0 ]; then
        record "$p" "(shimmed)" FAIL "not run: the reference failed"
        return
    fi
    for spec in $runs; do
        IFS=: read -r label frac safety prof <<<"$spec"
        limits=""
        for ((r = 0; r < nproc; r++)); do
            wb=$(jget "$R/$ref-rank$r.json" weight_bytes)
            if [ -z "$wb" ]; then
                limits=""
                break
            fi
            b=$(((wb >> 20) / frac))
            if ((b < 64)); then # the shim's smallest GPU_MEMORY_LIMIT
                echo "--- $p-$label: rank $r's budget $b MiB raised to 64 MiB"
                b=64
            fi
            limits+="${limits:+ }${b}MiB"
        done
        if [ -z "$limits" ]; then
            record "$p" "$p-$label" FAIL "no weight_bytes in the reference's JSON"
            continue
        fi
        trun "$p-$label" "$nproc" "$backend" "$limits" "${safety:-strict}" \
            "$([ "${prof:-}" = profile ] && echo 1 || echo 0)"
        names+=("$p-$label")
        [ -f "$R/$p-$label-rank0.pt" ] && args+=(--pair "$R/$ref" "$R/$p-$label")
    done
    if [ -n "$info_ref" ] && [ -f "$R/$info_ref-rank0.pt" ]; then
        args+=(--info-pair "$R/$info_ref" "$R/$ref")
    fi
    local cmpf="$R/$p.compare"
    : >"$cmpf"
    if ((${#args[@]})); then
        echo "--- compare ($(time_left) s left)"
        timeout -k 5 "$(tmo 60)" "$PY" "$TEST" compare --world "$nproc" --steps "$STEPS" \
            "${args[@]}" 2>&1 | tee "$cmpf"
    fi
    for r in ${names[@]+"${names[@]}"}; do
        evaluate "$p" "$r" "$ref" "$cmpf"
    done
    if [ -n "$info_ref" ]; then
        local note
        note=$(grep "^NOTE $ref vs $info_ref:" "$cmpf" | tail -1)
        [ -n "$note" ] && record "$p" "vs-$info_ref" NOTE "${note#NOTE }"
    fi
    return 0
}

preamble() {
    echo "flexshim dist test (issue 6): $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(hostname)"
    echo "repository: $ROOT ($(bundle_commit "$ROOT"))"
    echo "work dir $W, out $OUT; time budget ${TOTAL_BUDGET_S} s; phases: $PHASES"
    echo "steps $STEPS (median after $WARMUP), prompt $PROMPT_LEN, layers $LAYERS, probe" \
        "$PROBE_MIB MiB, link ${LINK_GBPS} GB/s assumed for the limit"
    bundle_check "$LIB" "$TOOL"
    [ -e "$LIB" ] && ldd "$LIB" 2>&1 | grep -E 'not found|cupti|cuda' | sed 's/^/  /'
    echo "--- nvidia-smi -L"
    timeout 20 nvidia-smi -L 2>&1
    timeout 20 nvidia-smi --query-compute-apps=pid,used_memory --format=csv 2>&1
    env | grep -E '^(NCCL_|GLOO_|TORCH_|NVSHMEM_|FLEXTENSOR_|CUBLAS_)' | sort
}

main() {
    preamble
    local gpus
    gpus=${GPUS:-$(timeout 20 nvidia-smi -L 2>/dev/null | grep -c '^GPU ')}
    echo "GPUs: ${gpus:-0}"
    local ph
    for ph in $PHASES; do
        if (($(time_left) < MIN_RUN_S + MARGIN_S)); then
            record "$ph" "-" FAIL "out of time: phase not run ($(time_left) s left)"
            continue
        fi
        case $ph in
        nccl) phase nccl 1 nccl "$NCCL_RUNS" ;;
        gloo) phase gloo 1 gloo "$GLOO_RUNS" nccl-ref ;;
        tp2)
            if [ "${gpus:-0}" -ge 2 ]; then
                phase tp2 2 "$TP2_BACKEND" "$TP2_RUNS"
            else
                echo
                echo "================ tp2: SKIP ================"
                record tp2 "-" SKIP \
                    "nvidia-smi -L lists ${gpus:-0} GPU(s); the 2-rank run needs 2 or more"
            fi
            ;;
        *) record "$ph" "-" FAIL "unknown phase (nccl, gloo, tp2)" ;;
        esac
        pack
    done
    {
        echo
        echo "================ summary: $(($(date +%s) - START_S)) s of" \
            "$TOTAL_BUDGET_S ================"
        echo "per rank: median decode step (x the reference's; the transfer limit max(reference," \
            "offloaded/${LINK_GBPS} GB/s)), shim counters: ev(ictions) fi (fault-ins) host-srv(ed" \
            "references) sync (forced synchronizes) pass(ed through: count, MiB) unk(nown launches)"
        printf '%-5s %-12s %-6s %s\n' phase run result "per rank || problems"
        local ph2 run res notes
        while IFS=$'\t' read -r ph2 run res notes; do
            printf '%-5s %-12s %-6s %s\n' "$ph2" "$run" "$res" "$notes"
        done <"$RESULTS"
        local overall=PASS
        grep -q $'\tFAIL\t' "$RESULTS" && overall=FAIL
        echo "overall: $overall"
    } | tee "$OUT/dist-summary.txt"
    pack
    ! grep -q $'\tFAIL\t' "$RESULTS"
}

main 2>&1 | tee "$OUT/dist.log"
exit "${PIPESTATUS[0]}"
