#!/usr/bin/env bash
# The issue-5 benchmark, one command on the GPU machine (from the repository root, with dist/
# built by `make dist` on the development machine and carried along):
#
#   OUT=/some/dir bash bench/run.sh
#
# Compares, on a Llama-style model with random bf16 weights (bench/bench.py says which), at GPU
# memory budgets given as percent of the weight bytes:
#   noshim      all resident, no shim: the compute time C (at 100% only)
#   pipeline    a hand-written per-layer prefetch pipeline (bench/prefetch_pipeline.py)
#   flexshim    LD_PRELOAD=dist/lib/libflexshim.so: per workload one `flexshim-profile record` run
#               at RECORD_PCT, then one run per budget from that profile
#   flexshim_host_read  the same profile run with FLEXTENSOR_OFFLOAD_MODE=host_read (offloaded
#               weights read in place over the link: no copies, no remaps)
#   flexshim_redirect   the same profile run with FLEXTENSOR_OFFLOAD_MODE=redirect (offloaded
#               weights copied into device blocks ahead of use, kernels' pointers rewritten to
#               them: no remaps)
#   accelerate  infer_auto_device_map + dispatch_model with max_memory at the budget
# and the limit L = max(C, B / W), with W measured first, in this run (bench/report.py).
# Order: W, noshim, pipeline, flexshim, accelerate (the slowest) last. One python process per
# system x workload x budget (flexshim is preloaded into its process).
#
# Knobs (environment):
#   MODEL=7b|1b (7b)   WORKLOADS="prefill decode"   BUDGETS="100 50 25"
#   SYSTEMS="noshim flexshim accelerate pipeline" (any subset, plus flexshim_host_read and
#                      flexshim_redirect; the order
#                      above is kept; noshim is
#                      needed for C, so a second GPU call should run it again: SYSTEMS="noshim
#                      accelerate")
#   TOTAL_BUDGET_S=570 the whole run ends before this many seconds: a run is started only when
#                      MIN_RUN_S (60 for 7b, 30 for 1b; ACCEL_MIN_RUN_S for accelerate) are left,
#                      and its `timeout` is cut to what is left; what is skipped is said, in the
#                      log and as a "skipped" JSON line
#   RUN_TIMEOUT_S=240  the most one python run may take
#   RECORD_PCT=50      budget of the flexshim record runs
#   SIM_STRATEGY=adaptive  strategy of `flexshim-profile simulate` (the one the shim runs; "all"
#                      for the four)
#   DECODE_CUDNN_SDPA=1  decode with PyTorch's cuDNN attention (off by default: bench.py says why)
#   CPUS=              run every bench.py process under `taskset -c CPUS` (decode is bound by the
#                      queueing thread: one process on a busy or slow core makes a launch-bound
#                      row slow, as bench.py's import_s shows)
#   FAKE=1             no GPU: bench.py makes numbers up (marked fake); tests this script here
#
# Output in $OUT (at most 8 files come back from the GPU machine; these are 7):
#   bench.log            everything, as it happens (tee)
#   bench.jsonl          one JSON line per measurement, appended as soon as it exists, so a run
#                        cut short keeps what it measured (plus meta/skipped/failed/simulate lines)
#   bench.json, bench.svg, summary.txt   bench/report.py build from bench.jsonl
#   bench-logs.tar.gz    per-run output, the shim's logs, simulate output, the profiles
#   traces.tar.gz        the measured flexshim runs' run traces (FLEXTENSOR_TRACE_OUT)
# To merge two GPU calls: python3 bench/report.py build --out DIR A/bench.jsonl B/bench.jsonl
set -uo pipefail
export PYTHONUNBUFFERED=1
# Nothing can be fetched there; the model is built from a config.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# No INI file from the machine or the tree: only the settings given here.
export FLEXTENSOR_CONFIG=

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
. "$ROOT/tests/gpu/bundle.sh" # bundle_commit, bundle_check
OUT=${OUT:-$ROOT/out/bench}
mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)

MODEL=${MODEL:-7b}
WORKLOADS=${WORKLOADS:-"prefill decode"}
BUDGETS=${BUDGETS:-"100 50 25"}
SYSTEMS=${SYSTEMS:-"noshim flexshim accelerate pipeline"}
TOTAL_BUDGET_S=${TOTAL_BUDGET_S:-570}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-240}
RECORD_PCT=${RECORD_PCT:-50}
SIM_STRATEGY=${SIM_STRATEGY:-adaptive}
SIM_REPLAY=${SIM_REPLAY:-4}
RESERVE_S=${RESERVE_S:-20} # kept for the report and the tarball at the end
FAKE=${FAKE:-0}
if [ "$MODEL" = 1b ]; then
    MIN_RUN_S=${MIN_RUN_S:-30}
    ACCEL_MIN_RUN_S=${ACCEL_MIN_RUN_S:-40}
else
    MIN_RUN_S=${MIN_RUN_S:-60}
    ACCEL_MIN_RUN_S=${ACCEL_MIN_RUN_S:-90}
fi
PY=${PYTHON:-python3}
LIB=$ROOT/dist/lib/libflexshim.so
TOOL=$ROOT/dist/bin/flexshim-profile
START_S=$(date +%s)
DEADLINE_S=$((START_S + TOTAL_BUDGET_S))
RUN_ID=$(date -u +%Y%m%dT%H%M%SZ)-$$
# shellcheck source=bench/shim_env.sh
. "$ROOT/bench/shim_env.sh" # pin_cpus; shim_env MIB LOG PROFILE TRACE: a shimmed run's environment
pin_cpus run.sh || exit 2
WORK=$(mktemp -d "${TMPDIR:-/tmp}/flexshim-bench.XXXXXX") || exit 1
LOGS=$WORK/logs
mkdir -p "$LOGS"
JSONL=$OUT/bench.jsonl
BENCH_ARGS=()
[ "$FAKE" = 1 ] && BENCH_ARGS=(--fake --fake-sleep "${FAKE_SLEEP:-1}")
[ "${DECODE_CUDNN_SDPA:-0}" = 1 ] && BENCH_ARGS+=(--cudnn-sdpa)

has() { case " $SYSTEMS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
# The shim's systems: flexshim, and flexshim_MODE run with FLEXTENSOR_OFFLOAD_MODE=MODE from the
# same profile (offload_env).
SHIM_SYSTEMS="flexshim flexshim_host_read flexshim_redirect"
offload_env() { [ "$1" = flexshim ] || echo "FLEXTENSOR_OFFLOAD_MODE=${1#flexshim_}"; }
left() { echo $((DEADLINE_S - RESERVE_S - $(date +%s))); }
line() { "$PY" bench/report.py line --jsonl "$JSONL" "$@"; }

# skip NAME SYSTEM WORKLOAD PCT REASON: said in the log and as a JSON line.
skip() {
    echo "==== SKIPPED $1: $5"
    line --field kind=skipped --field "run_id=$RUN_ID" --field "model=$MODEL" \
        --field "name=$1" --field "system=$2" --field "workload=$3" --field "budget_pct=$4" \
        --field "reason=$5"
}

# Everything that comes back besides the JSON lines and the log, in one file (written after each
# system, so a run cut short still leaves the logs of what it did).
pack() {
    (cd "$WORK" && find . -type f \( -path './logs/*' -o -name 'prof-*.json' \) \
        ! -name '*.trace.json' -size -60M -print0 | tar --null -czf "$WORK/logs.tar.gz" -T -) &&
        mv -f "$WORK/logs.tar.gz" "$OUT/bench-logs.tar.gz"
    # The run traces apart (tens of MB each before compression; 16 MiB per file come back).
    if compgen -G "$LOGS/*.trace.json" >/dev/null; then
        (cd "$LOGS" && tar -czf "$WORK/traces.tar.gz" ./*.trace.json) &&
            mv -f "$WORK/traces.tar.gz" "$OUT/traces.tar.gz"
    fi
}

# The budgets: "PCT BYTES MIB" per line, from bench.py (the same arithmetic as the runs).
declare -A BUDGET_B BUDGET_MIB
PCTS=()
read_budgets() {
    local pct b mib out
    if ! out=$("$PY" bench/bench.py --model "$MODEL" --print-budgets "$BUDGETS $RECORD_PCT"); then
        echo "bad BUDGETS='$BUDGETS' or RECORD_PCT='$RECORD_PCT'"
        return 1
    fi
    while read -r pct b mib; do
        BUDGET_B[$pct]=$b
        BUDGET_MIB[$pct]=$mib
    done <<<"$out"
    # BUDGETS as bench.py spells them (the last line is RECORD_PCT)
    mapfile -t PCTS < <(echo "$out" | head -n -1 | awk '{print $1}')
    RECORD_PCT=$(echo "$out" | tail -1 | awk '{print $1}')
}

# run_one NAME SYSTEM WORKLOAD PCT KIND NEED_S [-- PREFIX...]: one bench.py process (PREFIX
# before it: env settings, the record tool), its result appended to bench.jsonl with the shim's
# log lines (SHIM_LOG, when set) and the fields in EXTRA. Returns bench.py's exit status.
SHIM_LOG=
EXTRA=()
run_one() {
    local name=$1 system=$2 workload=$3 pct=$4 kind=$5 need=$6 l t rc t0
    shift 6
    [ "${1:-}" = -- ] && shift
    l=$(left)
    if ((l < need)); then
        skip "$name" "$system" "$workload" "$pct" \
            "not started: ${l}s left of TOTAL_BUDGET_S=$TOTAL_BUDGET_S, a run needs ${need}s"
        return 3
    fi
    t=$((l < RUN_TIMEOUT_S ? l : RUN_TIMEOUT_S))
    local res=$WORK/res-$name.json out=$LOGS/$name.out
    rm -f "$res"
    [ -n "$SHIM_LOG" ] && rm -f "$SHIM_LOG"
    echo "---- $name: $system, $workload, ${pct}% (${BUDGET_MIB[$pct]:-?} MiB), $kind;" \
        "timeout ${t}s, ${l}s left [$(date -u +%H:%M:%S)]"
    t0=$SECONDS
    BENCH_T0=$(date +%s.%N) timeout -k 10 "$t" "${PIN[@]}" "$@" "$PY" bench/bench.py --system "$system" \
        --workload "$workload" --model "$MODEL" --budget-pct "$pct" --kind "$kind" \
        --result "$res" --run-id "$RUN_ID" --name "$name" --headroom-from "$JSONL" \
        "${BENCH_ARGS[@]}" 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    local timed_out=""
    ((rc == 124 || rc == 137)) && timed_out=", TIMED OUT after ${t}s"
    echo "     $name: exit $rc, $((SECONDS - t0)) s$timed_out"
    local fields=(--field "run_id=$RUN_ID" --field "model=$MODEL" --field "name=$name"
        --field "system=$system" --field "workload=$workload" --field "budget_pct=$pct"
        --field "kind=$kind")
    for f in "${EXTRA[@]}"; do fields+=(--field "$f"); done
    "$PY" bench/report.py append --jsonl "$JSONL" --result "$res" --rc "$rc" --out-log "$out" \
        ${SHIM_LOG:+--shim-log "$SHIM_LOG"} "${fields[@]}"
    if [ -n "$SHIM_LOG" ]; then
        echo "     shim log ($SHIM_LOG):"
        local pat="\] (info|warn|error): (plan|profile|residency:|launches:|allocations:)"
        grep -E "$pat|\] (warn|error):" \
            "$SHIM_LOG" 2>/dev/null | awk '{ t = $0; sub(/^\[flexshim [0-9]+\] /, "", t) }
                !seen[t]++' | head -25 | sed 's/^/       /'
    fi
    return "$rc"
}

# ---- the steps -------------------------------------------------------------------------------
preamble() {
    echo "flexshim issue-5 benchmark: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(hostname), run $RUN_ID"
    echo "repository: $ROOT ($(bundle_commit "$ROOT")," \
        "$(git -C "$ROOT" status --porcelain 2>/dev/null | wc -l | tr -d ' ') changed files)"
    echo "MODEL=$MODEL WORKLOADS='$WORKLOADS' BUDGETS='$BUDGETS' SYSTEMS='$SYSTEMS'" \
        "TOTAL_BUDGET_S=$TOTAL_BUDGET_S RUN_TIMEOUT_S=$RUN_TIMEOUT_S MIN_RUN_S=$MIN_RUN_S" \
        "RECORD_PCT=$RECORD_PCT FAKE=$FAKE"
    echo "out: $OUT; work: $WORK"
    [ "$FAKE" = 1 ] && echo "*** FAKE=1: no GPU, made-up numbers: a test of the scripts ***"
    local gpu="FAKE (no GPU)" driver=
    local knobs="MODEL=$MODEL WORKLOADS='$WORKLOADS' BUDGETS='$BUDGETS' SYSTEMS='$SYSTEMS'"
    [ "${DECODE_CUDNN_SDPA:-0}" = 1 ] && knobs="DECODE_CUDNN_SDPA=1 $knobs"
    [ -n "${CPUS:-}" ] && knobs="CPUS=$CPUS $knobs"
    if [ "$FAKE" != 1 ]; then
        nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1
        nvidia-smi --query-compute-apps=pid,used_memory --format=csv 2>&1
        gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
        driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
    fi
    bundle_check "$LIB" "$TOOL"
    echo "budgets of the $MODEL (percent, bytes, MiB):"
    for p in "${PCTS[@]}" "$RECORD_PCT"; do echo "  $p ${BUDGET_B[$p]} ${BUDGET_MIB[$p]}"; done
    line --field kind=meta --field "run_id=$RUN_ID" --field "date=$(date -u '+%Y-%m-%d %H:%M UTC')" \
        --field "host=$(hostname)" --field "gpu=$gpu" --field "driver=$driver" \
        --field "commit=$(bundle_commit "$ROOT")" \
        --field "model=$MODEL" --field "workloads=$WORKLOADS" --field "budgets=$BUDGETS" \
        --field "systems=$SYSTEMS" --field "total_budget_s=$TOTAL_BUDGET_S" --field "fake=$FAKE" \
        --field "decode_cudnn_sdpa=${DECODE_CUDNN_SDPA:-0}" \
        --field "command=$knobs OUT=... bash bench/run.sh"
}

step_bandwidth() {
    echo "==== W: pinned host-to-device bandwidth (1 GiB, CUDA events, the fastest of 5)"
    run_one bandwidth bandwidth prefill 100 measure 15
}

step_noshim() {
    local wl
    for wl in $WORKLOADS; do
        echo "==== noshim $wl (C)"
        run_one "noshim-$wl" noshim "$wl" 100 measure "$MIN_RUN_S"
    done
}

step_pipeline() {
    local wl pct
    for wl in $WORKLOADS; do
        for pct in "${PCTS[@]}"; do
            echo "==== pipeline $wl ${pct}%"
            run_one "pipeline-$wl-$pct" pipeline "$wl" "$pct" measure "$MIN_RUN_S"
        done
    done
    pack
}

step_flexshim() {
    local wl pct prof mode list="" budgets="" p
    if [ "$FAKE" != 1 ] && { [ ! -e "$LIB" ] || [ ! -x "$TOOL" ]; }; then
        for wl in $WORKLOADS; do
            for pct in "${PCTS[@]}"; do
                skip "flexshim-$wl-$pct" flexshim "$wl" "$pct" "no dist/ build (make dist)"
            done
        done
        return
    fi
    for p in "${PCTS[@]}"; do
        list+="${list:+,}${BUDGET_MIB[$p]}MiB"
        budgets+="${budgets:+,}$p:${BUDGET_B[$p]}"
    done
    for wl in $WORKLOADS; do
        prof=$WORK/prof-$wl.json
        rm -f "$prof"
        echo "==== flexshim $wl: record at ${RECORD_PCT}% (discovery, profiling, plan; stops 2" \
            "iterations after the profile is saved)"
        SHIM_LOG=$LOGS/shim-flexshim-$wl-record.log
        local rec=()
        if [ "$FAKE" = 1 ]; then
            rec=(env FLEXTENSOR_PROFILE_OUT="$prof")
        else
            rec=(env FLEXTENSOR_GPU_MEMORY_LIMIT="${BUDGET_MIB[$RECORD_PCT]}MiB"
                FLEXTENSOR_REMAP_SAFETY=tracked FLEXTENSOR_LOG_LEVEL=info
                FLEXTENSOR_LOG_FILE="$SHIM_LOG" "$TOOL" record -o "$prof" --)
        fi
        EXTRA=("profile=$prof")
        run_one "flexshim-$wl-record" flexshim "$wl" "$RECORD_PCT" record "$MIN_RUN_S" -- \
            "${rec[@]}"
        if [ -s "$prof" ]; then
            mode=from-profile
            echo "     profile: $prof ($(stat -c %s "$prof") bytes)"
        else
            mode="reactive: the record run wrote no profile"
            echo "     NO PROFILE from the record run: the $wl runs below are reactive"
            prof=
        fi
        local sys
        for sys in $SHIM_SYSTEMS; do
            has "$sys" || continue
            [ "$sys" != flexshim ] && [ -z "$prof" ] && continue # the other modes need a plan
            for pct in "${PCTS[@]}"; do
                echo "==== $sys $wl ${pct}% ($mode)"
                SHIM_LOG=$LOGS/shim-$sys-$wl-$pct.log
                EXTRA=("mode=$mode" "profile=${prof:-none}")
                # A measured run from a profile also writes its run trace (the timeline of the
                # engine's moves, remaps and waits) beside its log.
                # shellcheck disable=SC2046
                run_one "$sys-$wl-$pct" "$sys" "$wl" "$pct" measure "$MIN_RUN_S" -- \
                    $(shim_env "${BUDGET_MIB[$pct]}" "$SHIM_LOG" "$prof" \
                        "${prof:+${SHIM_LOG%.log}.trace.json}") \
                    $(offload_env "$sys")
            done
        done
        SHIM_LOG=
        EXTRA=()
        # The prediction beside the measurement: the timeline model and the replay of the plan
        # on the simulated device, for each budget.
        local sim=$prof
        [ "$FAKE" = 1 ] && sim=$ROOT/tests/data/small.json
        # With flexshim_host_read or flexshim_redirect, their replays too (the timeline model
        # columns stay the prefetch plan's; only the replay runs the other modes).
        for sys in $SHIM_SYSTEMS; do
            has "$sys" || continue
            local mode_args=() tag=$wl
            [ "$sys" != flexshim ] && mode_args=(--offload-mode "${sys#flexshim_}") &&
                tag=$wl-${sys#flexshim_}
            if [ -n "$sim" ] && (($(left) >= 20)); then
                local l t
                l=$(left)
                t=$((l < 90 ? l : 90))
                echo "==== flexshim-profile simulate $wl: --budget $list --strategy" \
                    "$SIM_STRATEGY --replay $SIM_REPLAY ${mode_args[*]} (timeout ${t}s)"
                timeout -k 5 "$t" "$TOOL" simulate "$sim" --budget "$list" \
                    --strategy "$SIM_STRATEGY" --replay "$SIM_REPLAY" "${mode_args[@]}" \
                    >"$LOGS/simulate-$tag.txt" 2>"$LOGS/simulate-$tag.err"
                echo "     exit $?"
                cat "$LOGS/simulate-$tag.txt"
                tail -3 "$LOGS/simulate-$tag.err"
                "$PY" bench/report.py simulate --jsonl "$JSONL" --text "$LOGS/simulate-$tag.txt" \
                    --budgets "$budgets" --field "run_id=$RUN_ID" --field "model=$MODEL" \
                    --field "workload=$wl" --field "profile=$sim" \
                    --field "strategy=$SIM_STRATEGY" --field "system=$sys"
            elif [ -n "$sim" ]; then
                echo "==== SKIPPED simulate $wl ($sys): $(left)s left"
            fi
        done
        pack
    done
}

step_accelerate() {
    local wl pct order=()
    # The offloading budgets first: they are the comparison that matters (at 100% accelerate is
    # the plain model).
    for pct in "${PCTS[@]}"; do
        awk -v p="$pct" 'BEGIN { exit !(p < 100) }' && order+=("$pct")
    done
    for pct in "${PCTS[@]}"; do
        awk -v p="$pct" 'BEGIN { exit !(p >= 100) }' && order+=("$pct")
    done
    for wl in $WORKLOADS; do
        for pct in "${order[@]}"; do
            echo "==== accelerate $wl ${pct}%"
            run_one "accelerate-$wl-$pct" accelerate "$wl" "$pct" measure "$ACCEL_MIN_RUN_S"
        done
    done
    pack
}

main() {
    read_budgets || return 2
    preamble
    local s
    for s in $SYSTEMS; do
        case $s in
        noshim | flexshim | flexshim_host_read | flexshim_redirect | accelerate | pipeline) ;;
        *) echo "unknown system '$s' in SYSTEMS (noshim flexshim flexshim_host_read" \
            "flexshim_redirect accelerate pipeline)" ;;
        esac
    done
    step_bandwidth
    has noshim && step_noshim
    has pipeline && step_pipeline
    local shim
    for shim in $SHIM_SYSTEMS; do
        has "$shim" && { step_flexshim; break; }
    done
    has accelerate && step_accelerate
    echo "==== report ($(($(date +%s) - START_S)) s since the start)"
    "$PY" bench/report.py build --out "$OUT" "$JSONL"
    pack
    echo "done in $(($(date +%s) - START_S)) s; files in $OUT:"
    ls -l "$OUT"
}

main 2>&1 | tee -a "$OUT/bench.log"
rc=${PIPESTATUS[0]}
rm -rf "$WORK"
exit "$rc"
