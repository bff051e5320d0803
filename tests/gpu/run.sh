#!/usr/bin/env bash
# flexshim GPU test suite: the one script run on the GPU machine, from the repository root.
#
#   OUT=/some/dir bash tests/gpu/run.sh            # every step
#   STEPS_ONLY="a b" OUT=... bash tests/gpu/run.sh  # a subset
#
# Needs, built on the development machine and carried along (the GPU machine has no libinih,
# libjansson or package registry):
#   dist/lib/libflexshim.so, dist/bin/flexshim-profile   (`make dist`)
#   dist/bin/gpu-tests/test_device_cuda                  (`make dist` runs tests/gpu/build.sh)
#   (without that program, step a builds it here with tests/gpu/build.sh from
#   build/libflexshim_core.a, if build/ was carried along)
# On the GPU machine itself: nvcc (step b builds tests/gpu/prog_evict.cu), gcc, python3 with
# torch, transformers and nvidia-ml-py.
#
# Steps (each logged, each ends with a PASS/WARN/FAIL/SKIP line; a failure does not stop the run):
#   a  device     tests/gpu/test_device_cuda.c: core/device_cuda.c on the real device
#   b  evict      tests/gpu/prog_evict.cu, 48 x 64 MiB buffers (3 GiB) under a 512 MiB budget:
#                 output identical to the unshimmed run, and evictions > 0
#   c  llama      tests/gpu/llama_test.py, ~2.2 GB bf16 Llama with random weights, budgets of
#                 1/2 and 1/4 of its weights: prefill logits bit-identical and the same greedy
#                 tokens over 32 decode steps; peak process GPU memory vs budget (stated)
#   d  soak       500 decode steps at 1/4 of the weights, tokens identical to an unshimmed run
#   e  overhead   64 timed decode steps without and with the shim at 100% (no eviction
#                 needed): median step time after 8 warm-up steps, ratio
#   f  pause      tests/gpu/pause_test.py: a profile recorded at 4 GiB, then run from it at
#                 PAUSE_LIMIT (its plan moves nothing: launch tracking pauses), outgrowing it at
#                 the end (tracking resumes): output identical to the unshimmed run; the
#                 profile's allocations all fit PAUSE_LIMIT, so the engine does not start as the
#                 library loads (nothing to pin early); the allocations made while paused are in
#                 plain device memory
#   g  launch     tests/gpu/launch_probe.cu: the host's time to queue a launch, without the
#                 shim, with it started paused from a profile, with the library loaded but
#                 disabled (FLEXTENSOR_ENABLED=0), watching every launch (PAUSE_TRACKING=0),
#                 and watching them through the driver entry points (LAUNCH_HOOK=entry: its
#                 check must end); LAUNCH_ROUNDS rounds, pinned to LAUNCH_CPUS; outputs
#                 identical (the numbers are reported, not judged)
# Every shimmed process runs with FLEXTENSOR_LOG_LEVEL=info and its own FLEXTENSOR_LOG_FILE; the
# shim's exit counters (allocations / residency / launches) are extracted and printed.
#
# Output (at most 8 files come back from $OUT, so only three are written there):
#   $OUT/run.log        everything, as it runs (so a run cut short still leaves its log)
#   $OUT/summary.txt    the final table
#   $OUT/details.tar.gz per-step logs, shim logs, program outputs, JSON lines (written after
#                       every step)
# The whole run keeps under TOTAL_BUDGET_S seconds (default 570: one device command may run 600):
# each command's `timeout` is cut to what is left, and a step with too little time left is
# skipped.
set -uo pipefail
export PYTHONUNBUFFERED=1
# Steps c and d compare long decodes token for token: two plain runs of the test model diverge
# after ~130 decode steps (measured 2026-12-02), so they run with deterministic kernels
# (llama_test.py --deterministic; cuBLAS needs this too). Step e times the default kernels.
export CUBLAS_WORKSPACE_CONFIG=:4096:8

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
. "$ROOT/tests/gpu/bundle.sh" # bundle_commit, bundle_check
OUT=${OUT:-$ROOT/out}
mkdir -p "$OUT" || exit 1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/flexshim-gpu.XXXXXX") || exit 1
LOGS=$WORK/logs
RESULTS=$WORK/results
mkdir -p "$LOGS" "$RESULTS"
export ROOT OUT WORK LOGS RESULTS

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC=${NVCC:-$CUDA_HOME/bin/nvcc}
LIB=$ROOT/dist/lib/libflexshim.so
PY=${PYTHON:-python3}
STEPS_ONLY=${STEPS_ONLY:-a b c d e f g}
TOTAL_BUDGET_S=${TOTAL_BUDGET_S:-570}
CMD_TIMEOUT_S=${CMD_TIMEOUT_S:-300}
EVICT_LIMIT=${EVICT_LIMIT:-512MiB}
LLAMA_STEPS=${LLAMA_STEPS:-32}
SOAK_STEPS=${SOAK_STEPS:-500}
OVERHEAD_STEPS=${OVERHEAD_STEPS:-64}
OVERHEAD_WARMUP=${OVERHEAD_WARMUP:-8}
MEM_FLAG_MIB=${MEM_FLAG_MIB:-3072}
PAUSE_LIMIT=${PAUSE_LIMIT:-1536MiB}
LAUNCH_ROUNDS=${LAUNCH_ROUNDS:-3}
LAUNCH_CPUS=${LAUNCH_CPUS:-4-11}
START_S=$(date +%s)
DEADLINE_S=$((START_S + TOTAL_BUDGET_S))
export CUDA_HOME NVCC LIB PY DEADLINE_S
# No INI file from the machine or the tree: only the settings given here.
export FLEXTENSOR_CONFIG=
# Nothing can be fetched there; the models are built from a config.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

want() { case " $STEPS_ONLY " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# Seconds a command may run: CMD_TIMEOUT_S (or $1), cut to what is left before the deadline.
tmo() {
    local want_s=${1:-$CMD_TIMEOUT_S} left=$((DEADLINE_S - $(date +%s) - 10))
    ((left < want_s)) && want_s=$left
    ((want_s < 1)) && want_s=1
    echo "$want_s"
}
time_left() { echo $((DEADLINE_S - $(date +%s))); }

# record STEP RESULT NOTES: one row of the summary table.
record() {
    printf '%s|%s|%s\n' "$1" "$2" "$3" >"$RESULTS/$1"
    echo "==> $1: $2${3:+ ($3)}"
}

# Collects what comes back in one file; run after every step.
pack() {
    (cd "$WORK" && find . -type f ! -name '*.pt' ! -name 'prog_evict' ! -name 'launch_probe' -size -20M -print0 |
        tar --null -czf "$OUT/details.tar.gz.tmp" -T - 2>/dev/null) &&
        mv -f "$OUT/details.tar.gz.tmp" "$OUT/details.tar.gz"
}

# Small helpers in Python: shim-log counters, JSON fields, comparisons of numbers.
cat >"$WORK/helpers.py" <<'PYEOF'
import json, os, sys

sys.path.insert(0, os.path.join(os.environ["ROOT"], "tests", "gpu"))
import shimlog  # the shim log's format


def counters(path, want_pid=None):
    """Prints the shim's exit counters of the chosen process(es) and a COUNTERS key=value line
    (summed over the chosen processes)."""
    s = shimlog.parse(path, want_pid)
    if not s["exists"]:
        print(f"  (no shim log: {s['error']})")
    for line in s["exit_lines"]:
        print("  " + line)
    kv = s["kv"]
    if not kv["pids"]:
        print(f"  (no exit counters in {path}; {kv['lines']} lines; its last lines:)")
        if s["exists"]:
            with open(path, errors="replace") as f:
                for line in f.read().splitlines()[-15:]:
                    print("    " + line)
    if s["warn"]:
        print(f"  {len(s['warn'])} warn/error line(s) from the shim; the first ones:")
        for pid, level, text in s["warn"][:15]:
            print(f"    [{pid}] {level}: {text}")
    print("COUNTERS " + " ".join(f"{k}={v}" for k, v in kv.items()))


def jget(path, *keys):
    """Fields of the last line starting with '{' in PATH, one per line ('' for none/null)."""
    obj = {}
    for line in open(path, errors="replace"):
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                pass
    for k in keys:
        v = obj.get(k)
        print("" if v is None else v)


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "counters":
        counters(args[0], args[1] if len(args) > 1 and args[1] else None)
    elif cmd == "jget":
        jget(args[0], *args[1:])
    else:
        sys.exit(f"helpers.py: unknown command {cmd}")
PYEOF
H() { "$PY" "$WORK/helpers.py" "$@"; }
# kv FILE KEY: a value from the COUNTERS line in FILE (empty if none).
kv() { grep '^COUNTERS ' "$1" 2>/dev/null | tail -1 | tr ' ' '\n' | sed -n "s/^$2=//p"; }
# Shim counters of LOG (optionally of PID) into FILE, shown too.
show_counters() { # LOG FILE [PID]
    echo "shim counters ($1):"
    H counters "$1" "${3:-}" | tee "$2"
}

# shim_env LOGFILE LIMIT: the environment of a shimmed run (use: env $(shim_env ...) cmd).
shim_env() {
    echo "LD_PRELOAD=$LIB FLEXTENSOR_GPU_MEMORY_LIMIT=$2 FLEXTENSOR_LOG_LEVEL=info FLEXTENSOR_LOG_FILE=$1"
}

# ---- preamble --------------------------------------------------------------------------------
preamble() {
    echo "flexshim GPU tests: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(hostname), steps: $STEPS_ONLY"
    echo "repository: $ROOT ($(bundle_commit "$ROOT")" \
        "$(git -C "$ROOT" status --porcelain 2>/dev/null | wc -l | tr -d ' ') changed files)"
    echo "work dir: $WORK; out: $OUT; time budget ${TOTAL_BUDGET_S}s"
    local ok=1
    bundle_check dist/lib/libflexshim.so dist/bin/flexshim-profile || ok=0
    echo "--- nvidia-smi -L"
    nvidia-smi -L 2>&1
    echo "--- driver, memory"
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,pci.bus_id \
        --format=csv 2>&1
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv 2>&1
    echo "--- toolchain"
    "$NVCC" --version 2>&1 | tail -2
    gcc --version 2>&1 | head -1
    "$PY" --version 2>&1
    echo "--- libflexshim.so"
    ldd "$LIB" 2>&1
    env | grep '^FLEXTENSOR_' | sort
    if [ -x dist/bin/flexshim-profile ]; then
        echo "--- flexshim-profile config --check (environment of this script)"
        LD_LIBRARY_PATH=$ROOT/dist/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
            dist/bin/flexshim-profile config --check 2>&1
        echo "(exit $?)"
    fi
    [ "$ok" = 1 ]
}

# ---- a: test_device_cuda ---------------------------------------------------------------------
step_a() {
    local t0 bin=dist/bin/gpu-tests/test_device_cuda rc
    t0=$(now)
    if [ -x "$bin" ]; then
        echo "using $bin, built by make dist ($(date -u -r "$bin" '+%Y-%m-%d %H:%M UTC'))"
    elif [ -f build/libflexshim_core.a ]; then
        # build.sh links -linih -ljansson; the GPU machine has neither, only the sonamed
        # copies that `make dist` put in dist/lib (just those libflexshim.so needs), so give the
        # linker unversioned names for them, and an empty linker script for one not there
        # (nothing links against it then: libflexshim.so itself does not need it).
        local ld=$WORK/linkdir lib f
        mkdir -p "$ld"
        for lib in inih jansson; do
            f=$(find dist/lib -maxdepth 1 -name "lib$lib.so*" | head -1)
            if [ -n "$f" ]; then
                ln -sf "$ROOT/$f" "$ld/lib$lib.so"
            else
                echo "/* lib$lib: not in dist/lib, not needed */" >"$ld/lib$lib.so"
            fi
        done
        echo "building tests/gpu/*.c: tests/gpu/build.sh build dist/bin/gpu-tests"
        if ! CC="${CC:-gcc} -L$ld" sh tests/gpu/build.sh build dist/bin/gpu-tests 2>&1; then
            echo "build failed"
        fi
    else
        echo "neither $bin (make dist) nor build/libflexshim_core.a (make) is here"
    fi
    if [ ! -x "$bin" ]; then
        record a FAIL "no $bin: run make dist (or carry build/ along)"
        return
    fi
    LD_LIBRARY_PATH=$ROOT/dist/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
        timeout -k 10 "$(tmo 120)" "$bin" 2>&1 | tee "$WORK/device.out"
    rc=${PIPESTATUS[0]}
    local line
    line=$(grep -E '^device_cuda: [0-9]+ passed' "$WORK/device.out" | tail -1)
    echo "exit $rc, $(elapsed "$t0") s"
    grep '^FAIL ' "$WORK/device.out" | head -20 | sed 's/^/  /'
    if [ "$rc" = 0 ]; then
        record a PASS "${line:-?}"
    else
        record a FAIL "exit $rc; ${line:-no summary line}"
    fi
}

# ---- b: prog_evict ---------------------------------------------------------------------------
step_b() {
    local t0 bin=$WORK/prog_evict rc_ref rc_shim slog=$WORK/shim-evict.log
    t0=$(now)
    echo "building: $NVCC -O2 -arch=sm_90 -cudart shared -o $bin tests/gpu/prog_evict.cu"
    if ! "$NVCC" -O2 -arch=sm_90 -cudart shared -Xlinker -rpath -Xlinker "$CUDA_HOME/lib64" \
        -o "$bin" tests/gpu/prog_evict.cu 2>&1; then
        record b FAIL "nvcc failed"
        return
    fi
    ldd "$bin" | grep -E 'cudart|not found'
    echo "--- without the shim"
    local t1
    t1=$(now)
    timeout -k 10 "$(tmo 120)" "$bin" >"$WORK/evict-ref.txt" 2>"$WORK/evict-ref.err"
    rc_ref=$?
    cat "$WORK/evict-ref.err"
    echo "exit $rc_ref, $(elapsed "$t1") s"
    echo "--- with the shim: FLEXTENSOR_GPU_MEMORY_LIMIT=$EVICT_LIMIT"
    rm -f "$slog"
    t1=$(now)
    # shellcheck disable=SC2046
    timeout -k 10 "$(tmo 150)" env $(shim_env "$slog" "$EVICT_LIMIT") "$bin" \
        >"$WORK/evict-shim.txt" 2>"$WORK/evict-shim.err"
    rc_shim=$?
    cat "$WORK/evict-shim.err"
    echo "exit $rc_shim, $(elapsed "$t1") s"
    show_counters "$slog" "$WORK/evict.counters"
    local same=0 ndiff=0
    if cmp -s "$WORK/evict-ref.txt" "$WORK/evict-shim.txt"; then
        same=1
        echo "outputs identical ($(wc -l <"$WORK/evict-ref.txt") lines)"
    else
        ndiff=$(diff "$WORK/evict-ref.txt" "$WORK/evict-shim.txt" | grep -c '^[<>]')
        echo "outputs DIFFER ($ndiff lines of diff); the first differences:"
        diff "$WORK/evict-ref.txt" "$WORK/evict-shim.txt" | head -40
    fi
    local ev managed found fail
    ev=$(kv "$WORK/evict.counters" evictions)
    managed=$(kv "$WORK/evict.counters" managed)
    found=$(kv "$WORK/evict.counters" found)
    fail=$(kv "$WORK/evict.counters" failures)
    local notes="ref exit $rc_ref, shim exit $rc_shim, managed ${managed:-?}, evictions ${ev:-?}"
    notes+=", fault-ins $(kv "$WORK/evict.counters" faults), host-served"
    notes+=" $(kv "$WORK/evict.counters" host_served), failures ${fail:-?}"
    echo "total $(elapsed "$t0") s"
    if [ "$rc_ref" != 0 ] || [ "$rc_shim" != 0 ]; then
        record b FAIL "$notes"
    elif [ "$same" != 1 ]; then
        record b FAIL "outputs differ ($ndiff diff lines); $notes"
    elif [ "$found" != 1 ]; then
        record b FAIL "no shim counters in the log; $notes"
    elif [ "${ev:-0}" -le 0 ]; then
        record b FAIL "identical but no eviction happened; $notes"
    elif [ "${fail:-0}" -gt 0 ]; then
        record b WARN "identical, but internal failures; $notes"
    else
        record b PASS "identical; $notes"
    fi
}

# ---- llama helpers ---------------------------------------------------------------------------
# llama_run NAME STEPS TIMEOUT [LIMIT] [extra args]: runs llama_test.py run (shimmed when LIMIT is
# given) with output to $WORK/NAME.pt and log $WORK/NAME.log; returns its exit status.
llama_run() {
    local name=$1 steps=$2 t=$3 limit=${4:-} rc t0
    shift 4 2>/dev/null || shift $#
    local slog=$WORK/shim-$name.log
    rm -f "$slog" "$WORK/$name.pt"
    t0=$(now)
    if [ -n "$limit" ]; then
        echo "--- $name: shimmed, FLEXTENSOR_GPU_MEMORY_LIMIT=$limit, $steps decode steps"
        # shellcheck disable=SC2046
        timeout -k 10 "$t" env $(shim_env "$slog" "$limit") "$PY" tests/gpu/llama_test.py run \
            --out "$WORK/$name.pt" --steps "$steps" "$@" 2>&1 | tee "$WORK/$name.log"
        rc=${PIPESTATUS[0]}
    else
        echo "--- $name: without the shim, $steps decode steps"
        timeout -k 10 "$t" "$PY" tests/gpu/llama_test.py run --out "$WORK/$name.pt" --steps "$steps" \
            "$@" 2>&1 | tee "$WORK/$name.log"
        rc=${PIPESTATUS[0]}
    fi
    echo "$name: exit $rc, $(elapsed "$t0") s"
    [ "$rc" = 124 ] && echo "$name: TIMED OUT after $t s"
    return "$rc"
}

# The unshimmed reference (prefill logits, tokens, weight bytes), made once: with SOAK_STEPS
# decode steps when step d runs too (its first LLAMA_STEPS tokens serve step c).
ensure_ref() {
    if [ -f "$WORK/llama-ref.pt" ] && [ -f "$WORK/llama-ref.log" ]; then
        echo "reference: reusing $WORK/llama-ref.pt"
        return 0
    fi
    local steps=$LLAMA_STEPS
    want d && steps=$((SOAK_STEPS > LLAMA_STEPS ? SOAK_STEPS : LLAMA_STEPS))
    llama_run llama-ref "$steps" "$(tmo 180)" "" --deterministic || {
        rm -f "$WORK/llama-ref.pt"
        return 1
    }
}

weight_bytes() { H jget "$WORK/llama-ref.log" weight_bytes; }

# ---- c: llama under 1/2 and 1/4 of the weights -----------------------------------------------
step_c() {
    local t0
    t0=$(now)
    if ! ensure_ref; then
        record c FAIL "the unshimmed reference run failed"
        return
    fi
    local wb ref_mem
    wb=$(weight_bytes)
    ref_mem=$(H jget "$WORK/llama-ref.log" max_process_mem_mib)
    if [ -z "$wb" ]; then
        record c FAIL "no weight_bytes in the reference run's JSON line"
        return
    fi
    echo "weights: $wb bytes ($((wb >> 20)) MiB); reference (no shim) max process memory:" \
        "${ref_mem:-?} MiB ($(H jget "$WORK/llama-ref.log" mem_method)), that is" \
        "$(awk -v m="$ref_mem" -v w="$wb" 'BEGIN { if (m == "") print "?"; else printf "%.0f", m - w / 1048576 }')" \
        "MiB beyond the weights (CUDA context, workspace, activations, allocator cache)"
    local result=PASS notes="" frac
    for frac in 2 4; do
        local name=llama-q$frac budget rc cmp_rc
        budget=$(((wb >> 20) / frac))
        if (($(time_left) < 60)); then
            echo "$name: skipped, out of time"
            result=FAIL
            notes+="1/$frac: skipped (time); "
            continue
        fi
        llama_run "$name" "$LLAMA_STEPS" "$(tmo 150)" "${budget}MiB" --deterministic
        rc=$?
        local pid mem method
        pid=$(H jget "$WORK/$name.log" pid)
        show_counters "$WORK/shim-$name.log" "$WORK/$name.counters" "$pid"
        if [ "$rc" != 0 ] || [ ! -f "$WORK/$name.pt" ]; then
            result=FAIL
            notes+="1/$frac: exit $rc; "
            continue
        fi
        "$PY" tests/gpu/llama_test.py compare "$WORK/llama-ref.pt" "$WORK/$name.pt" \
            --steps "$LLAMA_STEPS" 2>&1 | tee "$WORK/$name.compare"
        cmp_rc=${PIPESTATUS[0]}
        mem=$(H jget "$WORK/$name.log" max_process_mem_mib)
        method=$(H jget "$WORK/$name.log" mem_method)
        local over="?" flag=""
        if [ -n "$mem" ]; then
            over=$(awk -v m="$mem" -v b="$budget" 'BEGIN { printf "%.0f", m - b }')
            if awk -v o="$over" -v f="$MEM_FLAG_MIB" 'BEGIN { exit !(o > f) }'; then
                flag=" OVER budget+${MEM_FLAG_MIB}MiB"
            fi
        fi
        local ev placed managed found fail
        ev=$(kv "$WORK/$name.counters" evictions)
        placed=$(kv "$WORK/$name.counters" placed_on_host)
        managed=$(kv "$WORK/$name.counters" managed)
        found=$(kv "$WORK/$name.counters" found)
        fail=$(kv "$WORK/$name.counters" failures)
        local pt_mib
        pt_mib=$(awk -v b="$(kv "$WORK/$name.counters" passthrough_bytes)" \
            'BEGIN { printf "%.0f", b / 1048576 }')
        echo "MEMORY 1/$frac: budget $budget MiB, max process GPU memory ${mem:-?} MiB" \
            "($method), overhead ${over} MiB over the budget (CUDA context and module code," \
            "cuBLAS workspace, pass-through allocations: $pt_mib MiB passed through in all," \
            "shim staging)$flag; shim: device peak $(kv "$WORK/$name.counters" device_peak)," \
            "pinned host $(kv "$WORK/$name.counters" pinned_host)"
        echo "TIME 1/$frac: $(H jget "$WORK/$name.log" decode_ms_per_step) ms/decode step," \
            "reference $(H jget "$WORK/llama-ref.log" decode_ms_per_step) ms"
        local part="1/$frac=${budget}MiB: mem ${mem:-?}MiB (+${over}), ev ${ev:-?}"
        if [ "$cmp_rc" != 0 ]; then
            result=FAIL
            part+=", MISMATCH"
        elif [ "$found" != 1 ]; then
            [ "$result" = PASS ] && result=WARN
            part+=", no counters"
        elif [ "${managed:-0}" -le 0 ] || [ $((${ev:-0} + ${placed:-0})) -le 0 ]; then
            result=FAIL
            part+=", nothing offloaded (managed ${managed:-0})"
        else
            part+=", identical"
        fi
        if [ -n "$flag" ] || [ "${fail:-0}" -gt 0 ]; then
            [ "$result" = PASS ] && result=WARN
            [ -n "$flag" ] && part+=",$flag"
            [ "${fail:-0}" -gt 0 ] && part+=", $fail internal failures"
        fi
        notes+="$part; "
    done
    echo "total $(elapsed "$t0") s"
    record c "$result" "ref mem ${ref_mem:-?}MiB; ${notes%; }"
}

# ---- d: soak, SOAK_STEPS decode steps at 1/4 of the weights ----------------------------------
step_d() {
    local t0
    t0=$(now)
    if ! ensure_ref; then
        record d FAIL "the unshimmed reference run failed"
        return
    fi
    local ref_steps
    ref_steps=$(H jget "$WORK/llama-ref.log" steps)
    if [ "${ref_steps:-0}" -lt "$SOAK_STEPS" ]; then
        echo "the reference has $ref_steps steps; making one of $SOAK_STEPS"
        rm -f "$WORK/llama-ref.pt" "$WORK/llama-ref.log"
        LLAMA_STEPS=$SOAK_STEPS ensure_ref || {
            record d FAIL "the unshimmed reference run failed"
            return
        }
    fi
    local wb budget
    wb=$(weight_bytes)
    budget=$(((wb >> 20) / 4))
    local need=90
    want e && need=190
    if (($(time_left) < need)); then
        record d SKIP "out of time ($(time_left) s left)"
        return
    fi
    # Leave step e its time: a soak that runs too long is cut (and fails) rather than e skipped.
    local rc cmp_rc=1 pid soak_t=400
    if want e; then
        soak_t=$(($(time_left) - 100))
        ((soak_t > 400)) && soak_t=400
    fi
    llama_run llama-soak "$SOAK_STEPS" "$(tmo "$soak_t")" "${budget}MiB" --deterministic
    rc=$?
    pid=$(H jget "$WORK/llama-soak.log" pid)
    show_counters "$WORK/shim-llama-soak.log" "$WORK/soak.counters" "$pid"
    if [ "$rc" = 0 ] && [ -f "$WORK/llama-soak.pt" ]; then
        "$PY" tests/gpu/llama_test.py compare "$WORK/llama-ref.pt" "$WORK/llama-soak.pt" \
            --steps "$SOAK_STEPS" 2>&1 | tee "$WORK/soak.compare"
        cmp_rc=${PIPESTATUS[0]}
    fi
    local ev fail errs mem notes
    ev=$(kv "$WORK/soak.counters" evictions)
    fail=$(kv "$WORK/soak.counters" failures)
    errs=$(kv "$WORK/soak.counters" errors)
    mem=$(H jget "$WORK/llama-soak.log" max_process_mem_mib)
    notes="budget ${budget}MiB, exit $rc, $(H jget "$WORK/llama-soak.log" decode_ms_per_step)"
    notes+=" ms/step, evictions ${ev:-?}, fault-ins $(kv "$WORK/soak.counters" faults),"
    notes+=" failures ${fail:-?}, shim errors ${errs:-?}, max mem ${mem:-?}MiB"
    echo "total $(elapsed "$t0") s"
    if [ "$rc" != 0 ]; then
        record d FAIL "$notes"
    elif [ "$cmp_rc" != 0 ]; then
        record d FAIL "tokens differ; $notes"
    elif [ "${fail:-0}" -gt 0 ] || [ "${errs:-0}" -gt 0 ]; then
        record d FAIL "identical, but the shim reported errors; $notes"
    elif [ "${ev:-0}" -le 0 ]; then
        record d WARN "identical, but no eviction seen; $notes"
    else
        record d PASS "$SOAK_STEPS steps identical; $notes"
    fi
}

# ---- e: overhead at 100% (no eviction needed) ------------------------------------------------
step_e() {
    local t0 rc1 rc2
    t0=$(now)
    if (($(time_left) < 60)); then
        record e SKIP "out of time ($(time_left) s left)"
        return
    fi
    local args=(--time-steps --warmup "$OVERHEAD_WARMUP")
    llama_run llama-time-plain "$OVERHEAD_STEPS" "$(tmo 120)" "" "${args[@]}"
    rc1=$?
    llama_run llama-time-shim "$OVERHEAD_STEPS" "$(tmo 120)" "100%" "${args[@]}"
    rc2=$?
    local pid
    pid=$(H jget "$WORK/llama-time-shim.log" pid)
    show_counters "$WORK/shim-llama-time-shim.log" "$WORK/time.counters" "$pid"
    if [ "$rc1" != 0 ] || [ "$rc2" != 0 ]; then
        record e FAIL "exit $rc1 (plain), $rc2 (shim)"
        return
    fi
    local cmp_rc
    "$PY" tests/gpu/llama_test.py compare "$WORK/llama-time-plain.pt" \
        "$WORK/llama-time-shim.pt" 2>&1 | tee "$WORK/time.compare"
    cmp_rc=${PIPESTATUS[0]}
    local a b ratio ev
    a=$(H jget "$WORK/llama-time-plain.log" median_step_ms)
    b=$(H jget "$WORK/llama-time-shim.log" median_step_ms)
    ev=$(kv "$WORK/time.counters" evictions)
    ratio=$(awk -v a="$a" -v b="$b" 'BEGIN { if (a > 0) printf "%.3f", b / a; else print "?" }')
    echo "OVERHEAD: median decode step (after $OVERHEAD_WARMUP warm-up of $OVERHEAD_STEPS):" \
        "${a:-?} ms without the shim, ${b:-?} ms with it at 100%: ratio $ratio" \
        "(evictions ${ev:-?}, launches $(kv "$WORK/time.counters" launches))"
    local notes="plain ${a:-?} ms, shim ${b:-?} ms, ratio $ratio, evictions ${ev:-?}"
    echo "total $(elapsed "$t0") s"
    if [ -z "$a" ] || [ -z "$b" ]; then
        record e FAIL "no step times; $notes"
    elif [ "$cmp_rc" != 0 ]; then
        record e WARN "tokens differ between the two timed runs; $notes"
    else
        record e PASS "$notes"
    fi
}

# ---- f: launch tracking paused, then resumed ------------------------------------------------
step_f() {
    local t0 d=$WORK/pause slog=$WORK/shim-pause.log rc_ref rc_rec rc_shim
    t0=$(now)
    mkdir -p "$d"
    local prog=(tests/gpu/pause_test.py --outgrow-mib 1024)
    echo "--- without the shim: ${prog[*]}"
    timeout -k 10 "$(tmo 60)" "$PY" "${prog[@]}" >"$d/plain.out" 2>&1
    rc_ref=$?
    cat "$d/plain.out"
    echo "--- record (4 GiB, without the extra allocation)"
    timeout -k 10 "$(tmo 120)" env FLEXTENSOR_GPU_MEMORY_LIMIT=4GiB FLEXTENSOR_LOG_LEVEL=info \
        FLEXTENSOR_LOG_FILE="$WORK/shim-pause-record.log" "$ROOT/dist/bin/flexshim-profile" record \
        -o "$d/prof.json" -- "$PY" tests/gpu/pause_test.py >"$d/record.out" 2>&1
    rc_rec=$?
    tail -3 "$d/record.out"
    echo "--- from the profile at $PAUSE_LIMIT, outgrowing it"
    rm -f "$slog"
    # shellcheck disable=SC2046
    timeout -k 10 "$(tmo 60)" env $(shim_env "$slog" "$PAUSE_LIMIT") FLEXTENSOR_PROFILE="$d/prof.json" \
        FLEXTENSOR_REMAP_SAFETY=tracked "$PY" "${prog[@]}" >"$d/shim.out" 2>&1
    rc_shim=$?
    cat "$d/shim.out"
    show_counters "$slog" "$WORK/pause.counters"
    grep -h "launch tracking\|tracking paused" "$slog" | cut -c1-400
    local paused resumed early plain
    paused=$(grep -cE "launch tracking (starts )?paused:" "$slog")
    resumed=$(grep -c "launch tracking resumed" "$slog")
    early=$(grep -c "starting early" "$slog")
    plain=$(grep -oE "[0-9]+ of them in plain device memory" "$slog" | tail -1 | cut -d' ' -f1)
    local notes="exits $rc_ref/$rc_rec/$rc_shim, paused $paused, resumed $resumed, early start $early, plain ${plain:-none}"
    echo "total $(elapsed "$t0") s"
    if [ "$rc_ref" != 0 ] || [ "$rc_rec" != 0 ] || [ "$rc_shim" != 0 ] || [ ! -s "$d/prof.json" ]; then
        record f FAIL "a run failed or no profile; $notes"
    elif ! cmp -s "$d/plain.out" "$d/shim.out"; then
        record f FAIL "outputs differ; $notes"
    elif [ "$paused" -lt 1 ] || [ "$resumed" -lt 1 ]; then
        record f FAIL "identical, but tracking did not pause and resume; $notes"
    elif [ "$early" -gt 0 ]; then
        record f FAIL "identical, but the engine started early though the profile's allocations all fit $PAUSE_LIMIT (nothing to pin); $notes"
    elif [ "${plain:-0}" -lt 1 ]; then
        record f FAIL "identical, but no allocation made while paused got plain device memory; $notes"
    else
        record f PASS "identical; $notes"
    fi
}

# ---- g: the host's cost of a launch --------------------------------------------------------------
# median of the numbers on stdin
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }

step_g() {
    local t0 bin=$WORK/launch_probe d=$WORK/launch prof=$WORK/launch/prof.json r side rc
    local sides=(noshim shim off watch entry) bad=0 notes="" base q
    t0=$(now)
    mkdir -p "$d"
    echo "building: $NVCC -O2 -arch=sm_90 -cudart shared -o $bin tests/gpu/launch_probe.cu -lcuda"
    if ! "$NVCC" -O2 -arch=sm_90 -cudart shared -o "$bin" tests/gpu/launch_probe.cu -lcuda 2>&1; then
        record g FAIL "nvcc failed"
        return
    fi
    echo "--- record a profile at 1 GiB (the program uses 128 MiB: its plan moves nothing)"
    timeout -k 10 "$(tmo 120)" env FLEXTENSOR_GPU_MEMORY_LIMIT=1GiB FLEXTENSOR_LOG_LEVEL=info \
        FLEXTENSOR_LOG_FILE="$d/record.log" "$ROOT/dist/bin/flexshim-profile" record -o "$prof" \
        -- "$bin" >"$d/record.out" 2>&1
    rc=$?
    tail -3 "$d/record.out"
    if [ "$rc" != 0 ] || [ ! -s "$prof" ]; then
        record g FAIL "recording the profile failed (exit $rc)"
        return
    fi
    # Sides alternate in each round, pinned to the same cores: noshim; shim (from the profile:
    # starts paused, CUPTI not loaded); off (the library loaded, FLEXTENSOR_ENABLED=0); watch
    # (FLEXTENSOR_PAUSE_TRACKING=0: every launch seen through CUPTI); entry (the same with
    # FLEXTENSOR_LAUNCH_HOOK=entry: every launch seen through the driver entry points' wrappers,
    # CUPTI's launch callbacks off once two iterations of the plan came through them).
    for r in $(seq 1 "$LAUNCH_ROUNDS"); do
        for side in "${sides[@]}"; do
            local envs=()
            case $side in
            shim) envs=($(shim_env "$d/$side-$r.log" 1GiB) FLEXTENSOR_PROFILE="$prof") ;;
            off) envs=($(shim_env "$d/$side-$r.log" 1GiB) FLEXTENSOR_ENABLED=0) ;;
            watch) envs=($(shim_env "$d/$side-$r.log" 1GiB) FLEXTENSOR_PROFILE="$prof"
                FLEXTENSOR_PAUSE_TRACKING=0) ;;
            entry) envs=($(shim_env "$d/$side-$r.log" 1GiB) FLEXTENSOR_PROFILE="$prof"
                FLEXTENSOR_PAUSE_TRACKING=0 FLEXTENSOR_LAUNCH_HOOK=entry) ;;
            esac
            timeout -k 10 "$(tmo 60)" env "${envs[@]}" taskset -c "$LAUNCH_CPUS" "$bin" \
                >"$d/$side-$r.out" 2>"$d/$side-$r.err"
            rc=$?
            echo "round $r $side (exit $rc): $(grep '^launch_probe:' "$d/$side-$r.err")"
            if [ "$rc" != 0 ] || ! cmp -s "$d/noshim-1.out" "$d/$side-$r.out"; then
                bad=1
            fi
            grep -oE 'queue per launch median [0-9.]+' "$d/$side-$r.err" |
                awk '{ print $5 }' >>"$d/$side.queue"
        done
    done
    grep -h "launch tracking\|launches:\|LAUNCH_HOOK" "$d"/shim-1.log "$d"/watch-1.log "$d"/entry-1.log \
        2>/dev/null | cut -c1-300
    base=$(median <"$d/noshim.queue")
    for side in "${sides[@]}"; do
        q=$(median <"$d/$side.queue")
        notes="$notes${notes:+; }$side ${q:-?} us$(awk -v a="$base" -v b="$q" \
            'BEGIN { if (a > 0 && b > 0) printf " (%.3f)", b / a }')"
    done
    notes="queue per launch, median of $LAUNCH_ROUNDS runs: $notes"
    echo "total $(elapsed "$t0") s"
    if [ "$bad" = 1 ]; then
        record g FAIL "a run failed or its output differs; $notes"
    elif ! grep -q "launch tracking starts paused" "$d/shim-1.log"; then
        record g FAIL "the shim did not start paused from the profile; $notes"
    elif ! grep -q "LAUNCH_HOOK=entry: every launch of" "$d/entry-1.log"; then
        record g FAIL "LAUNCH_HOOK=entry did not end its check (CUPTI still reporting launches); $notes"
    else
        record g PASS "$notes"
    fi
}

# ---- main ------------------------------------------------------------------------------------
run_step() { # LETTER NAME
    local letter=$1 name=$2
    want "$letter" || return 0
    echo
    echo "================ $letter: $name ($(time_left) s left) ================"
    if (($(time_left) < 20)); then
        record "$letter" SKIP "out of time"
    else
        "step_$letter" 2>&1 | tee "$LOGS/$letter-$name.log"
    fi
    [ -f "$RESULTS/$letter" ] || record "$letter" FAIL "the step ended without a result"
    pack
}

main() {
    if ! preamble 2>&1 | tee "$LOGS/0-preamble.log"; then
        echo "the build bundle is incomplete: every step needs dist/ (make dist)"
    fi
    # Each step's letter and name, in order: the runs and the summary both follow it.
    local steps=(a:device b:evict c:llama d:soak e:overhead f:pause g:launch) step
    for step in "${steps[@]}"; do run_step "${step%%:*}" "${step#*:}"; done
    {
        echo
        echo "================ summary ($(elapsed "$START_S") s) ================"
        printf '%-4s %-9s %-5s %s\n' step name result notes
        local l r notes name
        for step in "${steps[@]}"; do
            l=${step%%:*} name=${step#*:}
            want "$l" || continue
            if [ -f "$RESULTS/$l" ]; then
                IFS='|' read -r _ r notes <"$RESULTS/$l"
            else
                r=NONE notes=""
            fi
            printf '%-4s %-9s %-5s %s\n' "$l" "$name" "$r" "$notes"
        done
    } | tee "$OUT/summary.txt"
    pack
    # exit status: 0 when no step failed
    ! grep -q '|FAIL|' "$RESULTS"/* 2>/dev/null
}

main 2>&1 | tee "$OUT/run.log"
exit "${PIPESTATUS[0]}"
