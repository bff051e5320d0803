# Shared by the shell test scripts (tests/preload/run.sh, tests/tools/run.sh): a scratch folder,
# pass/fail counting and the checks. Source it after setting NAME (the closing line's label).
tmp=$(mktemp -d "/tmp/flexshim-$NAME.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
passed=0; failed=0
if [ "${SAN:-}" = 1 ]; then
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
fi

ok()   { passed=$((passed + 1)); echo "ok   $1"; }
fail() { failed=$((failed + 1)); echo "FAIL $1"; [ -n "${2:-}" ] && printf '     %s\n' "$2"; }
# expect NAME FILE PATTERN: FILE must contain the extended regex PATTERN
expect() { if grep -Eq -- "$3" "$2"; then ok "$1"; else fail "$1" "no /$3/ in: $(head -c 600 "$2")"; fi; }
expect_not() { if grep -Eq -- "$3" "$2"; then fail "$1" "unexpected /$3/ in: $(head -c 600 "$2")"; else ok "$1"; fi; }
# expect_rc NAME WANT GOT [FILE]
expect_rc() { if [ "$3" = "$2" ]; then ok "$1"; else fail "$1" "exit $3, expected $2${4:+: $(head -c 600 "$4")}"; fi; }
# finish: the closing line, and the exit status
finish() { echo "$NAME: $passed passed, $failed failed"; [ "$failed" = 0 ]; }
