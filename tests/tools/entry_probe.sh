#!/usr/bin/env bash
# The benchmark's entry-point probe: bench/entry_probe.c ($BUILD/libfs_entry_probe.so, built here
# through the Makefile's rule) preloaded into tests/tools/entry_prog.c, which reaches the launch
# functions of a stand-in driver (tests/tools/entry_fake_cuda.c) as the CUDA runtime does. Sourced
# by tests/tools/run.sh before its closing line; alone, from the repository root:
# bash tests/tools/entry_probe.sh. Skipped under SAN=1 (a benchmark tool).
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -u
    BUILD=${BUILD:-build}
    NAME=entry_probe
    . "$PWD/tests/check.sh"
fi

entry_probe_tests() {
    local lib=$PWD/$BUILD/libfs_entry_probe.so d=$tmp/entry inc=${CUDA_HOME:-/usr/local/cuda}/include
    mkdir -p "$d"
    if ! make --no-print-directory -s BUILD="$BUILD" "$BUILD/libfs_entry_probe.so" >"$tmp/o" 2>&1; then
        fail "entry probe: make $BUILD/libfs_entry_probe.so" "$(tail -5 "$tmp/o")"
        return
    fi
    nm -D --defined-only "$lib" | awk '$2 == "T" { print $3 }' | tr '\n' ' ' >"$tmp/syms"
    expect "entry probe: exports dlsym, nothing else" "$tmp/syms" '^dlsym $'
    if ! ${CC:-cc} -std=c11 -fPIC -shared -I"$inc" -o "$d/libcuda.so.1" tests/tools/entry_fake_cuda.c >"$tmp/o" 2>&1 ||
       ! ${CC:-cc} -std=c11 -I"$inc" -o "$d/prog" tests/tools/entry_prog.c -ldl >"$tmp/o" 2>&1; then
        fail "entry probe: build the stand-in driver and the program" "$(tail -5 "$tmp/o")"
        return
    fi
    "$d/prog" "$d/libcuda.so.1" >"$d/plain.out" 2>&1
    LD_PRELOAD=$lib "$d/prog" "$d/libcuda.so.1" >"$d/probe.out" 2>"$d/probe.err"; rc=$?
    expect_rc "entry probe: the program runs with it preloaded" 0 $rc "$d/probe.err"
    # Without the probe the driver counts 6 5 7 0; with it, the same: every call forwarded, each
    # to the variant asked for, with the driver's result.
    expect "entry probe: the driver's counts without it" "$d/plain.out" '^driver calls: 6 5 7 0; results as the driver gave them$'
    expect "entry probe: every launch reaches the driver's own function, with its result" "$d/probe.out" \
        '^driver calls: 6 5 7 0; results as the driver gave them$'
    expect "entry probe: the program was handed its wrappers, by every route" "$d/probe.out" \
        '^launch functions from: (libfs_entry_probe.so ){4}libfs_entry_probe.so$'
    expect "entry probe: it counted the 18 launches, by variant" "$d/probe.err" \
        '^entry_probe: pid [0-9]+: 18 launches through the wrappers \(cuLaunchKernel@0x[0-9a-f]+ 6, cuLaunchKernel_ptsz@0x[0-9a-f]+ 5, cuLaunchKernelEx@0x[0-9a-f]+ 7\); 5 cuGetProcAddress queries, 0 launch functions handed out unwrapped'
    LD_PRELOAD=$lib python3 -c 'pass' >"$d/quiet.out" 2>&1
    expect_not "entry probe: silent in a process that never reached a driver" "$d/quiet.out" 'entry_probe'
}

if [ "${SAN:-}" = 1 ]; then
    echo "skip bench/entry_probe.c under SAN=1 (a benchmark tool, not in the sanitizer suite)"
else
    entry_probe_tests
fi

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    finish
fi
