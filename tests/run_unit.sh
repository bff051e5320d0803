#!/usr/bin/env bash
# Runs CMocka test binaries and sums their results into one closing line.
#   tests/run_unit.sh [--valgrind] BIN...
# With --valgrind only the simulated-device tests (test_sim_*, test_engine_*, test_device_*) run,
# under memcheck with leak checking; any error fails the run.
set -u
valgrind=0
if [ "${1:-}" = "--valgrind" ]; then valgrind=1; shift; fi

passed=0; failed=0; bad_bins=()
for bin in "$@"; do
    name=$(basename "$bin")
    if [ $valgrind = 1 ]; then
        case $name in test_sim*|test_replay*|test_engine*|test_device*|test_residency*|test_profile*|test_iteration*|test_strategies*) ;; *) continue ;; esac
        cmd=(valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect "$bin")
    else
        cmd=("$bin")
    fi
    out=$("${cmd[@]}" 2>&1); rc=$?
    p=$(printf '%s\n' "$out" | sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' | tail -1)
    f=$(printf '%s\n' "$out" | sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' | tail -1)
    passed=$((passed + ${p:-0})); failed=$((failed + ${f:-0}))
    if [ $rc -ne 0 ]; then
        bad_bins+=("$name (exit $rc)")
        printf '%s\n' "$out"
        # A crash or a valgrind error without a CMocka failure still counts as one failure.
        [ "${f:-0}" = 0 ] && failed=$((failed + 1))
    else
        printf '%-36s %s passed\n' "$name" "${p:-0}"
    fi
done
label=unit; [ $valgrind = 1 ] && label=valgrind; [ "${SAN:-}" = 1 ] && label=asan
[ ${#bad_bins[@]} -gt 0 ] && echo "failing: ${bad_bins[*]}"
echo "$label: $passed passed, $failed failed"
[ $failed -eq 0 ]
