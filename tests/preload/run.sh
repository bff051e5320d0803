#!/usr/bin/env bash
# Preload tests: the real libflexshim.so in a small C program linked against a stand-in libcudart
# (tests/preload/fake_cudart.c), plus the exported-symbol check and flexshim-profile's config
# command. Run from the repository root by `make test-preload`; prints "preload: N passed, M failed".
set -u
BUILD=${BUILD:-build}
LIB=$PWD/$BUILD/libflexshim.so
TOOL=$PWD/$BUILD/flexshim-profile
PROG=$PWD/$BUILD/tests/preload/prog_alloc
PRELOAD=$LIB
if [ "${SAN:-}" = 1 ]; then
    # The sanitizer runtime must come first in a process whose main program is not instrumented.
    PRELOAD="$(${CC:-gcc} -print-file-name=libasan.so):$LIB"
fi
NAME=preload
. "$PWD/tests/check.sh"


# Run a command with none of the caller's FLEXTENSOR_* settings and no configuration file, plus
# the given assignments: clean_env [VAR=VALUE...] COMMAND [ARGS...]
clean_env() { env $(env | sed -n 's/^\(FLEXTENSOR_[A-Za-z0-9_]*\)=.*/-u \1/p') FLEXTENSOR_CONFIG= "$@"; }

# Run the program in $tmp with a clean environment plus the given assignments.
run_prog() { # run_prog OUTFILE [VAR=VALUE...]
    local out=$1; shift
    (cd "$tmp" && clean_env LD_PRELOAD="$PRELOAD" "$@" "$PROG") >"$out" 2>&1
}

# 1. Calls reach the shim and then the real runtime; the configuration is read.
run_prog "$tmp/basic" FLEXTENSOR_LOG_LEVEL=info; rc=$?
[ $rc = 0 ] && ok "program runs under the shim" || fail "program runs under the shim" "exit $rc: $(cat "$tmp/basic")"
expect "calls reach the real runtime" "$tmp/basic" '^runtime saw 4 mallocs, 4 frees$'
expect "calls reach the shim (exit summary)" "$tmp/basic" '^\[flexshim [0-9]+\] info: allocations: 0 managed \(0 bytes\), 4 passed through \([0-9]+ bytes\); 4 frees; 0 pointer queries, 0 memory-info queries$'
expect "log level read from the environment" "$tmp/basic" 'info: flexshim loaded \(enabled\)'

run_prog "$tmp/quiet"
expect_not "default log level shows no info lines" "$tmp/quiet" '\] info:'
expect "no GPU driver: said once, program runs unmanaged" "$tmp/quiet" 'warn: no usable CUDA device 0 \(not supported\): the program runs unmanaged'
[ "$(grep -c '\[flexshim' "$tmp/quiet")" = 1 ] && ok "no GPU driver: one line only" || fail "no GPU driver: one line only" "$(cat "$tmp/quiet")"

# 2. The INI file named by FLEXTENSOR_CONFIG is read; the environment overrides it.
printf '[flexshim]\nlog_level = info\nenabled = 0\n' >"$tmp/f.ini"
run_prog "$tmp/ini" FLEXTENSOR_CONFIG="$tmp/f.ini"
expect "INI file read" "$tmp/ini" 'info: flexshim loaded \(disabled by FLEXTENSOR_ENABLED=0\)'
run_prog "$tmp/ini_env" FLEXTENSOR_CONFIG="$tmp/f.ini" FLEXTENSOR_ENABLED=1
expect "environment overrides INI" "$tmp/ini_env" 'info: flexshim loaded \(enabled\)'
printf 'log_level = info\n' >"$tmp/flexshim.ini"
(cd "$tmp" && env -u FLEXTENSOR_CONFIG LD_PRELOAD="$PRELOAD" "$PROG") >"$tmp/cwd" 2>&1
expect "./flexshim.ini is a default location (and its errors name the line)" "$tmp/cwd" "flexshim.ini:1: key 'log_level' outside the \[flexshim\] section"
rm -f "$tmp/flexshim.ini"

# 3. Bad input: one clear message each, then the program runs unmanaged and still succeeds.
run_prog "$tmp/typo" FLEXTENSOR_GPU_MEMORY_LIMT=8GiB; rc=$?
expect "typo names the closest setting" "$tmp/typo" 'error: FLEXTENSOR_GPU_MEMORY_LIMT is not a flexshim setting; did you mean FLEXTENSOR_GPU_MEMORY_LIMIT\?'
expect "configuration error says the program runs unmanaged" "$tmp/typo" 'the program runs unmanaged'
[ $rc = 0 ] && ok "program still succeeds after a configuration error" || fail "program still succeeds after a configuration error" "exit $rc"
expect "unmanaged program still reaches the runtime" "$tmp/typo" '^runtime saw 4 mallocs, 4 frees$'
run_prog "$tmp/badsize" FLEXTENSOR_GPU_MEMORY_LIMIT=8XB
expect "malformed size names setting, value and accepted forms" "$tmp/badsize" 'FLEXTENSOR_GPU_MEMORY_LIMIT=8XB: not a size; .*GiB.*60%'
run_prog "$tmp/range" FLEXTENSOR_DISCOVERY_ITERS=0
expect "out-of-range value says what is accepted" "$tmp/range" 'FLEXTENSOR_DISCOVERY_ITERS=0: out of range; use a value from 1 to 1000'
run_prog "$tmp/missing" FLEXTENSOR_CONFIG=/nonexistent/flexshim.ini
expect "missing INI file is an error" "$tmp/missing" 'FLEXTENSOR_CONFIG=/nonexistent/flexshim.ini: cannot read the file'
printf '[flexshim]\nstrategy = greedy\ngpu_memry_limit = 4GiB\n[other]\n' >"$tmp/bad.ini"
run_prog "$tmp/badini" FLEXTENSOR_CONFIG="$tmp/bad.ini"
expect "unknown INI key: line number and suggestion" "$tmp/badini" "bad.ini:3: unknown key 'gpu_memry_limit' in \[flexshim\]; did you mean 'gpu_memory_limit'\?"
expect "unknown INI section: line number" "$tmp/badini" 'bad.ini:4: unknown section \[other\]'

run_prog "$tmp/expandable" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
expect "expandable_segments is named with the fix" "$tmp/expandable" 'warn: PYTORCH_CUDA_ALLOC_CONF has expandable_segments:True: .*remove that option'
run_prog "$tmp/asyncpool" PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
expect "cudaMallocAsync backend is named with the fix" "$tmp/asyncpool" 'warn: PYTORCH_CUDA_ALLOC_CONF selects backend:cudaMallocAsync'

run_prog "$tmp/later" FLEXTENSOR_TIMING_REPORT="$tmp/timing.txt"
expect "the timing report is written even when no device was managed" "$tmp/timing.txt" '^no device was managed \(the log says why\); nothing to report$'
run_prog "$tmp/later2" FLEXTENSOR_STRATEGY=greedy
expect "planning settings without a profile say so" "$tmp/later2" 'warn: FLEXTENSOR_STRATEGY is set but has no effect without FLEXTENSOR_PROFILE_OUT or FLEXTENSOR_PROFILE'

# 4. Log file.
run_prog "$tmp/lf" FLEXTENSOR_LOG_LEVEL=info FLEXTENSOR_LOG_FILE="$tmp/shim.log"
expect "log goes to FLEXTENSOR_LOG_FILE" "$tmp/shim.log" 'info: allocations: 0 managed'
expect_not "nothing logged to stderr with a log file" "$tmp/lf" '\[flexshim'

# 5. Only the intercepted CUDA names, dlsym (LAUNCH_HOOK=entry, shim/entry.c) and flexshim_* are
# exported.
allowed='^(dlsym|cudaMalloc|cudaMallocAsync|cudaMallocPitch|cudaFree|cudaMemGetInfo|cudaPointerGetAttributes|cuMemGetInfo_v2|cuPointerGetAttribute|cuPointerGetAttributes|flexshim_[a-z_]+)$'
nm -D --defined-only "$LIB" | awk '$2 ~ /^[TWDBRV]$/ {print $3}' | grep -v '^_' | sort >"$tmp/exports"
grep -Evq "$allowed" "$tmp/exports" && fail "only CUDA hooks and flexshim_* exported" "extra: $(grep -Ev "$allowed" "$tmp/exports" | tr '\n' ' ')" || ok "only CUDA hooks and flexshim_* exported"
expect "cudaMalloc is exported" "$tmp/exports" '^cudaMalloc$'
expect "flexshim_version is exported" "$tmp/exports" '^flexshim_version$'
objdump -T "$LIB" | awk '$NF == "cudaMalloc"' >"$tmp/cm_version"
expect "exports carry no version node" "$tmp/cm_version" ' Base +cudaMalloc$'

# 6. flexshim-profile config.
(cd "$tmp" && clean_env "$TOOL" config --check) >"$tmp/chk_ok" 2>&1 && ok "config --check passes a clean setup" || fail "config --check passes a clean setup" "$(cat "$tmp/chk_ok")"
(cd "$tmp" && clean_env FLEXTENSOR_STRATEGY=fast "$TOOL" config --check) >"$tmp/chk_bad" 2>&1; rc=$?
[ $rc = 1 ] && ok "config --check exits 1 on a bad value" || fail "config --check exits 1 on a bad value" "exit $rc"
expect "config --check prints the same message" "$tmp/chk_bad" 'FLEXTENSOR_STRATEGY=fast: unknown choice; use one of adaptive, knapsack, greedy, global'
(cd "$tmp" && clean_env FLEXTENSOR_CONFIG="$tmp/f.ini" FLEXTENSOR_GPU_MEMORY_LIMIT=60% "$TOOL" config --dump) >"$tmp/dump" 2>&1
expect "dump shows env values and source" "$tmp/dump" '^FLEXTENSOR_GPU_MEMORY_LIMIT +60% +env'
expect "dump shows INI values with file and line" "$tmp/dump" "^FLEXTENSOR_LOG_LEVEL +info +ini .*f.ini:2"
expect "dump shows defaults" "$tmp/dump" '^FLEXTENSOR_STRATEGY +adaptive +default'
"$TOOL" config --ini >"$tmp/gen.ini" 2>&1
if diff -q "$tmp/gen.ini" conf/flexshim.ini >/dev/null; then ok "conf/flexshim.ini is generated from the table"; else
    fail "conf/flexshim.ini is generated from the table" "regenerate: $BUILD/flexshim-profile config --ini > conf/flexshim.ini"; fi
# README's settings table is written by hand: every setting of the table is in it, at its default.
missing=$(sed -nE 's/^# ([a-z_]+) = ?(.*)$/\1 \2/p' "$tmp/gen.ini" | while read -r key def; do
    row="| \`$(echo "$key" | tr a-z A-Z)\` | ${def:+$def }|"
    grep -qF -- "$row" README.md || echo "$row"
done)
[ -z "$missing" ] && ok "README's settings table has every setting at its default" ||
    fail "README's settings table has every setting at its default" "no row starting: $missing"
"$TOOL" frobnicate >/dev/null 2>&1; rc=$?
[ $rc = 2 ] && ok "unknown command exits 2" || fail "unknown command exits 2" "exit $rc"

# 7. The exported dlsym (shim/entry.c). With LAUNCH_HOOK=entry the driver's launch functions that
# a program looks up, by every route the CUDA runtime and Triton use, are flexshim's wrappers, and
# each launch reaches the driver's function asked for with its result (tests/tools/entry_prog.c on
# the stand-in driver tests/tools/entry_fake_cuda.c); with cupti they are the driver's own. A
# dlsym(RTLD_NEXT) stays relative to its caller (tests/preload/next_lib.c).
inc=${CUDA_HOME:-/usr/local/cuda}/include
if ${CC:-cc} -std=c11 -fPIC -shared -I"$inc" -o "$tmp/libcuda.so.1" tests/tools/entry_fake_cuda.c >"$tmp/o" 2>&1 &&
   ${CC:-cc} -std=c11 -I"$inc" -o "$tmp/entry_prog" tests/tools/entry_prog.c -ldl >>"$tmp/o" 2>&1 &&
   ${CC:-cc} -std=c11 -fPIC -shared -DNEXT_VALUE=2 -o "$tmp/libnext2.so" tests/preload/next_lib.c -ldl >>"$tmp/o" 2>&1 &&
   ${CC:-cc} -std=c11 -fPIC -shared -DNEXT_VALUE=3 -o "$tmp/libnext3.so" tests/preload/next_lib.c -ldl >>"$tmp/o" 2>&1; then
    for hook in cupti entry; do
        (cd "$tmp" && clean_env LD_PRELOAD="$PRELOAD" FLEXTENSOR_LAUNCH_HOOK=$hook \
            ./entry_prog "$tmp/libcuda.so.1") >"$tmp/entry_$hook" 2>&1
        expect "LAUNCH_HOOK=$hook: every launch reaches the driver's function asked for, with its result" "$tmp/entry_$hook" \
            '^driver calls: 6 5 7 0; results as the driver gave them$'
    done
    expect "LAUNCH_HOOK=entry: the program is handed flexshim's wrappers, by every route" "$tmp/entry_entry" \
        '^launch functions from: (libflexshim.so ){4}libflexshim.so$'
    expect "LAUNCH_HOOK=cupti: the program is handed the driver's own functions" "$tmp/entry_cupti" \
        '^launch functions from: (libcuda.so.1 ){4}libcuda.so.1$'
    for pre in "$tmp/libnext2.so:$tmp/libnext3.so" "$PRELOAD:$tmp/libnext2.so:$tmp/libnext3.so"; do
        LD_PRELOAD="$pre" python3 -c 'import ctypes; print("chain", ctypes.CDLL(None).next_chain())' \
            >"$tmp/next" 2>&1
        expect "dlsym(RTLD_NEXT) finds the library after its caller (preload: ${pre//$tmp\//})" "$tmp/next" '^chain 23$'
    done
else
    fail "build the stand-in driver, its program and the RTLD_NEXT libraries" "$(tail -5 "$tmp/o")"
fi

# 8. The early start (PROFILE of this program, PIN_MODE=background) asks for the device only once
# its plan moves something: asking loads the driver on the early thread, before main(), which a
# plan that moves nothing never needs (docs/PERFORMANCE.md, stops 38-39: it was not decode's cost,
# but a program that never calls CUDA should not have the driver loaded for it). The
# stand-in driver of section 7, found first through LD_LIBRARY_PATH, lacks cuInit:
# loading it says so. Nothing is managed (MIN_OFFLOAD_BYTES), so only the early thread can load it.
if [ -f "$tmp/libcuda.so.1" ]; then
    sed "s|\"program\": \"[^\"]*\"|\"program\": \"$PROG\"|" tests/data/small.json >"$tmp/early.json"
    for budget in 100% 64MiB; do
        (unset CUDA_VISIBLE_DEVICES && run_prog "$tmp/early_$budget" LD_LIBRARY_PATH="$tmp" \
            FLEXTENSOR_PROFILE="$tmp/early.json" FLEXTENSOR_GPU_MEMORY_LIMIT=$budget \
            FLEXTENSOR_MIN_OFFLOAD_BYTES=64TiB)
        expect "early start at $budget: the program runs" "$tmp/early_$budget" '^runtime saw 4 mallocs, 4 frees$'
    done
    expect_not "early start, a plan that moves nothing: the driver is not loaded" "$tmp/early_100%" 'has no cuInit'
    expect "early start, a plan that moves something: the early thread asks for the device" "$tmp/early_64MiB" \
        'libcuda.so.1 has no cuInit'
fi

finish
