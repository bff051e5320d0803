# Sourced by the GPU scripts (tests/gpu/run.sh, tests/gpu/dist_test.sh, bench/run.sh): what the
# carried dist/ bundle is. The GPU machine's copy of the tree may carry stale git state, so the
# commit comes from dist/COMMIT, written by `make dist`.

# The commit dist/ was built from ("?" when unknown).
bundle_commit() { # ROOT
    cat "$1/dist/COMMIT" 2>/dev/null || git -C "$1" rev-parse --short HEAD 2>/dev/null || echo '?'
}

# Says whether each of FILES is there (size, date); status 1 when one is missing.
bundle_check() { # FILES...
    local f ok=0
    for f in "$@"; do
        if [ -e "$f" ]; then
            echo "found $f ($(stat -c %s "$f") bytes, $(date -u -r "$f" '+%Y-%m-%d %H:%M UTC'))"
        else
            echo "MISSING $f: run 'make dist' on the development machine and carry dist/ along"
            ok=1
        fi
    done
    return $ok
}
