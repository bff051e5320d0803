#!/usr/bin/env bash
# flexshim-profile record on the Llama test model, then check/show/simulate on the profile.
#   OUT=... bash tests/gpu/record_probe.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 FLEXTENSOR_CONFIG= HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/probe}
mkdir -p "$OUT"
T=dist/bin/flexshim-profile
SECONDS=0
FLEXTENSOR_GPU_MEMORY_LIMIT=${LIMIT:-1071MiB} "$T" record -o "$OUT/llama-profile.json" -- \
    python3 tests/gpu/llama_test.py run --out /tmp/rec.pt --steps "${STEPS:-40}" 2>&1 |
    grep -E "flexshim|decode|record" | grep -v "decode step" | tail -20
echo "record took ${SECONDS} s"
"$T" check "$OUT/llama-profile.json"
"$T" show "$OUT/llama-profile.json" | head -40
"$T" simulate "$OUT/llama-profile.json" --budget 25%,50%,100% 2>/dev/null
"$T" trace "$OUT/llama-profile.json" -o "$OUT/llama-trace.json"
