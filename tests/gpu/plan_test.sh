#!/usr/bin/env bash
# Issue 4 on the GPU machine: record a profile of the Llama test model, then run from it.
#
#   OUT=/some/dir bash tests/gpu/plan_test.sh
#
# For each budget (BUDGETS, default 1/2 and 1/4 of the weights, 1071 and 535 MiB):
#   record   flexshim-profile record -o prof-B.json -- llama_test.py run (discovery, profiling,
#            planning, then the plan runs for the rest of the run)
#   plan     LD_PRELOAD + FLEXTENSOR_PROFILE=prof-B.json: discovery and profiling skipped
#   redirect the same with FLEXTENSOR_OFFLOAD_MODE=redirect (device copies, launches' pointers
#            rewritten to them, no remaps)
#   simulate flexshim-profile simulate prof-B.json --budget B --strategy all --replay 8 (the
#            predictions: the timeline model, and the plan replayed on the simulated device)
# plus one unshimmed reference and one reactive run (no profile) at the smallest budget. Every run
# uses deterministic kernels, so outputs are compared bit for bit with the reference (prefill
# logits, tokens, per-step logit sums). Plan runs use REMAP_SAFETY=tracked (strict synchronizes
# the device at every move, which a plan cannot overlap).
# Output: $OUT/plan.log (everything), $OUT/plan-summary.txt, $OUT/prof-*.json, $OUT/plan-logs.tar.gz
set -uo pipefail
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 FLEXTENSOR_CONFIG= HF_HUB_OFFLINE=1
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
OUT=${OUT:-$ROOT/out}
mkdir -p "$OUT"
W=$(mktemp -d)
LIB=$ROOT/dist/lib/libflexshim.so
TOOL=$ROOT/dist/bin/flexshim-profile
STEPS=${STEPS:-40}
BUDGETS=${BUDGETS:-"1071 535"}
LOG=$OUT/plan.log
SUM=$OUT/plan-summary.txt
exec > >(tee "$LOG") 2>&1
: >"$SUM"
say() { echo "$*" | tee -a "$SUM"; }

llama() { # NAME [env...] -- runs llama_test.py, output W/NAME.pt, log W/NAME.out
    local name=$1
    shift
    local t0=$SECONDS
    env "$@" timeout 300 python3 tests/gpu/llama_test.py run --deterministic --time-steps \
        --warmup 16 --steps "$STEPS" --out "$W/$name.pt" >"$W/$name.out" 2>&1
    local rc=$?
    echo "--- $name: exit $rc, $((SECONDS - t0)) s"
    grep -v "decode step" "$W/$name.out" | tail -25
    return $rc
}

# Startup and step times of a run NAME (W/NAME.pt and the JSON line of W/NAME.out): model build,
# prefill, the first 8 decode steps, the median of the steps after the 16th.
times() {
    python3 - "$W/$1.pt" "$W/$1.out" <<'EOF'
import json, sys, statistics, torch
d = torch.load(sys.argv[1], weights_only=False)
j = {}
for line in open(sys.argv[2], errors="replace"):
    if line.startswith("{"):
        j = json.loads(line)
st = [t * 1000 for t in d.get("step_times", [])]
tail = st[16:] if len(st) > 16 else st
print(f"build {j.get('build_s', 0):.2f} s, prefill {j.get('prefill_s', 0) * 1000:.0f} ms, "
      f"steps 1-8 {' '.join(f'{t:.0f}' for t in st[:8])} ms, "
      f"median of steps 17-{len(st)} {statistics.median(tail):.1f} ms, "
      f"max process memory {j.get('max_process_mem_mib')} MiB")
EOF
}

compare() {
    python3 tests/gpu/llama_test.py compare "$W/ref.pt" "$W/$1.pt" >"$W/cmp-$1.out" 2>&1
    local rc=$?
    tail -4 "$W/cmp-$1.out"
    [ $rc -eq 0 ] && echo identical || echo DIFFERENT
}

shim_env() { # NAME LIMIT [more]
    local name=$1 limit=$2
    shift 2
    echo LD_PRELOAD="$LIB" FLEXTENSOR_GPU_MEMORY_LIMIT="$limit" FLEXTENSOR_LOG_LEVEL=info \
        FLEXTENSOR_LOG_FILE="$W/shim-$name.log" FLEXTENSOR_REMAP_SAFETY=tracked "$@"
}

shim_lines() {
    grep -E "plan|profile|discovery|profiling|residency:|launches:|warn|error" "$W/shim-$1.log" |
        grep -v "debug" | head -20
}

echo "plan_test: $(date -u), $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null), steps $STEPS"
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
llama ref
say "reference (no shim): $(times ref)"

for B in $BUDGETS; do
    P=$OUT/prof-$B.json
    echo "================ budget $B MiB"
    # shellcheck disable=SC2046
    FLEXTENSOR_REMAP_SAFETY=tracked FLEXTENSOR_LOG_LEVEL=info \
        FLEXTENSOR_LOG_FILE="$W/shim-rec-$B.log" FLEXTENSOR_GPU_MEMORY_LIMIT=${B}MiB \
        timeout 300 "$TOOL" record -o "$P" -- python3 tests/gpu/llama_test.py run --deterministic \
        --time-steps --warmup 16 --steps "$STEPS" --out "$W/rec-$B.pt" >"$W/rec-$B.out" 2>&1
    echo "--- record: exit $?"
    grep -v "decode step" "$W/rec-$B.out" | tail -8
    shim_lines "rec-$B"
    say "record $B MiB: $(times "rec-$B"); outputs $(compare "rec-$B" | tail -1)"
    # shellcheck disable=SC2046
    llama "plan-$B" $(shim_env "plan-$B" "${B}MiB" FLEXTENSOR_PROFILE="$P")
    shim_lines "plan-$B"
    say "plan   $B MiB: $(times "plan-$B"); outputs $(compare "plan-$B" | tail -1)"
    say "  $(grep -h "plan: [0-9]* installed" "$W/shim-plan-$B.log" | sed 's/.*info: //')"
    say "  $(grep -h "residency:" "$W/shim-plan-$B.log" | sed 's/.*info: //')"
    say "  $(grep -h "launches:" "$W/shim-plan-$B.log" | sed 's/.*info: //')"
    # shellcheck disable=SC2046
    llama "redirect-$B" $(shim_env "redirect-$B" "${B}MiB" FLEXTENSOR_PROFILE="$P" \
        FLEXTENSOR_OFFLOAD_MODE=redirect)
    shim_lines "redirect-$B"
    say "redirect $B MiB: $(times "redirect-$B"); outputs $(compare "redirect-$B" | tail -1)"
    say "  $(grep -h "redirect:" "$W/shim-redirect-$B.log" | sed 's/.*info: //')"
    say "  $(grep -h "remaps:" "$W/shim-redirect-$B.log" | sed 's/.*info: //')"
    "$TOOL" simulate "$P" --budget "${B}MiB" --strategy all --replay 8 2>/dev/null | tee -a "$SUM"
done

B=${BUDGETS##* }
# shellcheck disable=SC2046
llama "reactive-$B" $(shim_env "reactive-$B" "${B}MiB")
say "reactive $B MiB (no profile): $(times "reactive-$B"); outputs $(compare "reactive-$B" | tail -1)"

(cd "$W" && tar czf "$OUT/plan-logs.tar.gz" --exclude='*.pt' .)
echo "================ summary"
cat "$SUM"
