#!/usr/bin/env bash
# Diagnostic for a soak divergence: reference, shim at 100% (no eviction), shim at a quarter of
# the weights with the background pinner and without; STEPS decode steps each, compared.
#   OUT=... STEPS=260 bash tests/gpu/soak_probe.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 FLEXTENSOR_CONFIG= HF_HUB_OFFLINE=1
STEPS=${STEPS:-260}
OUT=${OUT:-/tmp/probe}
mkdir -p "$OUT"
LIB=$PWD/dist/lib/libflexshim.so
W=/tmp/probe-work
mkdir -p $W
python3 tests/gpu/llama_test.py run --out $W/ref.pt --steps "$STEPS" | tail -1
quarter=$(( 2246234112 / 4 / 1048576 ))
run_shim() { # name limit|none [VAR=VALUE...]   (none: a second run without the shim)
    local name=$1 limit=$2; shift 2
    if [ "$limit" = none ]; then
        env "$@" python3 tests/gpu/llama_test.py run --out $W/$name.pt --steps "$STEPS" | tail -1
    else
        env LD_PRELOAD=$LIB FLEXTENSOR_GPU_MEMORY_LIMIT=$limit FLEXTENSOR_LOG_LEVEL=info \
            FLEXTENSOR_LOG_FILE=$W/$name.shim.log "$@" \
            python3 tests/gpu/llama_test.py run --out $W/$name.pt --steps "$STEPS" | tail -1
        grep -E "residency|launches" $W/$name.shim.log
    fi
    python3 tests/gpu/llama_test.py compare $W/ref.pt $W/$name.pt
}
for spec in "$@"; do
    eval "run_shim $spec"
done
tar czf "$OUT/probe.tar.gz" -C $W . 2>/dev/null
