#!/bin/sh
# Build the GPU test programs (tests/gpu/*.c) against the core library, for the GPU machine.
#
# usage: tests/gpu/build.sh BUILD_DIR OUT_DIR
#   BUILD_DIR  where `make BUILD=BUILD_DIR` put libflexshim_core.a (e.g. build)
#   OUT_DIR    where the programs go (e.g. dist/bin/gpu-tests)
#
# Same compiler flags as the Makefile. Nothing links against libcuda (the driver is dlopen'ed at
# run time). The rpath finds libinih/libjansson in a dist/ bundle's lib/ whether OUT_DIR is
# dist/bin or one level below it (dist/bin/gpu-tests).
set -eu

if [ $# -ne 2 ]; then
    echo "usage: $0 BUILD_DIR OUT_DIR" >&2
    exit 2
fi
BUILD_DIR=$1
OUT_DIR=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CC=${CC:-gcc}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
CORE_A=$BUILD_DIR/libflexshim_core.a
case $CORE_A in /*) ;; *) CORE_A=$PWD/$CORE_A ;; esac

if [ ! -f "$CORE_A" ]; then
    echo "$0: $CORE_A not found; run: make BUILD=$BUILD_DIR $BUILD_DIR/libflexshim_core.a" >&2
    exit 1
fi
mkdir -p "$OUT_DIR"

WARN="-Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes"
CFLAGS="${CFLAGS:--O2 -g} -std=c11 -D_GNU_SOURCE $WARN -fPIC -fvisibility=hidden -pthread"
INCS="-I$ROOT -I$ROOT/core -I$ROOT/shim -I$CUDA_HOME/include"
LIBS="-linih -ljansson -ldl -lpthread -lm"

n=0
for src in "$ROOT"/tests/gpu/*.c; do
    [ -e "$src" ] || continue
    name=$(basename "$src" .c)
    echo "  CC $OUT_DIR/$name"
    # shellcheck disable=SC2086
    $CC $CFLAGS $INCS -o "$OUT_DIR/$name" "$src" "$CORE_A" $LIBS \
        -Wl,-rpath,'$ORIGIN/../lib' -Wl,-rpath,'$ORIGIN/../../lib'
    n=$((n + 1))
done
echo "tests/gpu: $n program(s) in $OUT_DIR"
