#!/usr/bin/env bash
# The benchmark's sampling profiler: bench/sampler.c ($BUILD/libfs_sampler.so, built here through
# the Makefile's rule) preloaded into tests/tools/sampler_prog.c, and bench/sample_report.py on
# made-up sample files. Sourced by tests/tools/run.sh before its closing line (its checks count
# in the tools line); alone, from the repository root: bash tests/tools/sampler.sh. Skipped under
# SAN=1: the sampler is a benchmark tool, outside the sanitizer and valgrind suites.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -u
    BUILD=${BUILD:-build}
    NAME=sampler
    . "$PWD/tests/check.sh"
fi

# num_ok NAME EXPR DETAIL: awk's EXPR (numbers) holds
num_ok() { if awk "BEGIN { exit !($2) }"; then ok "$1"; else fail "$1" "not ($2): $3"; fi; }

sampler_tests() {
    local lib=$PWD/$BUILD/libfs_sampler.so prog=$tmp/sampler_prog
    if ! make --no-print-directory -s BUILD="$BUILD" "$BUILD/libfs_sampler.so" >"$tmp/o" 2>&1; then
        fail "sampler: make $BUILD/libfs_sampler.so" "$(tail -5 "$tmp/o")"
        return
    fi
    ok "sampler: make $BUILD/libfs_sampler.so"
    nm -D --defined-only "$lib" | awk '$2 == "T" { print $3 }' | sort | tr '\n' ' ' >"$tmp/syms"
    expect "sampler: exports the four functions, nothing else" "$tmp/syms" \
        '^fs_sampler_pause fs_sampler_resume fs_sampler_start fs_sampler_write $'
    mkdir -p "$tmp/s" "$tmp/run" "$tmp/quiet"
    if ! ${CC:-cc} -rdynamic -O1 -o "$prog" tests/tools/sampler_prog.c -ldl >"$tmp/o" 2>&1 ||
       ! ${CC:-cc} -rdynamic -O1 -s -o "$tmp/s/sampler_prog" tests/tools/sampler_prog.c -ldl >"$tmp/o" 2>&1; then
        fail "sampler: build tests/tools/sampler_prog.c" "$(tail -5 "$tmp/o")"
        return
    fi

    # 1. The program's spans: 10 of burn_a 12 ms, burn_b 4 ms and burn_s 4 ms of CPU, burn_c
    # between them, then 8 ms in last_span (main -> at_end -> last_span, calls at their functions'
    # ends). Once as built, once stripped of .symtab (-s).
    (cd "$tmp/run" && LD_PRELOAD=$lib "$prog" "$tmp/prog.samples") >"$tmp/o" 2>"$tmp/e"; rc=$?
    expect_rc "sampler: the program runs, sleeps uninterrupted after the spans (timer disarmed), writes its samples" 0 $rc "$tmp/e"
    expect "sampler: a second fs_sampler_start fails, and says so" "$tmp/e" '^fs_sampler_start: already started$'
    expect "sampler: a write that cannot open its file fails, and names it" "$tmp/e" \
        '^fs_sampler_write: cannot open /nonexistent-dir/x\.samples: No such file or directory$'
    (cd "$tmp/run" && LD_PRELOAD=$lib "$tmp/s/sampler_prog" "$tmp/stripped.samples") >"$tmp/o" 2>&1; rc=$?
    expect_rc "sampler: the stripped program runs" 0 $rc "$tmp/o"
    if [ ! -s "$tmp/prog.samples" ] || [ ! -s "$tmp/stripped.samples" ]; then
        fail "sampler: the programs wrote their samples" "the checks of the samples are skipped"
        return
    fi
    [ -z "$(ls -A "$tmp/run")" ] && ok "sampler: nothing written but the file asked for" || fail "sampler: nothing written but the file asked for" "$(ls -A "$tmp/run")"
    cat >"$tmp/count.py" <<'PYEOF'
# count.py FILE: the numbers the checks below need, "key value" a line.
import re, sys
head, stacks = {}, []
for line in open(sys.argv[1]):
    if line.startswith("#"):
        k, v = line[1:].split()
        head[k] = int(v)
    else:
        stack, count = line.rsplit(" ", 1)
        stacks.append((stack.split(";"), int(count)))
p = "sampler_prog!"
out = dict(head)
out["sum"] = sum(c for _, c in stacks)
for f in ("burn_a", "burn_b", "burn_s"):
    out["self_" + f[-1]] = sum(c for fr, c in stacks if fr[-1] == p + f)
out["unnamed"] = sum(c for f, c in stacks
                     if f[-2] == p + "main" and re.fullmatch(r"sampler_prog\+0x[0-9a-f]+", f[-1]))
out["named_s"] = sum(c for f, c in stacks if p + "burn_s" in f)
out["under"] = sum(c for f, c in stacks
                   if {p + "burn_a", p + "burn_b", p + "burn_s", p + "last_span"} & set(f))
out["end_calls"] = sum(c for f, c in stacks if f[-3:] == [p + "main", p + "at_end", p + "last_span"])
out["main_a"] = sum(c for f, c in stacks if f[-2:] == [p + "main", p + "burn_a"])
out["deep_a"] = sum(c for f, c in stacks if f[-2:] == [p + "deep", p + "burn_a"])
out["burn_c"] = sum(c for f, c in stacks if p + "burn_c" in f)
out["sampler"] = sum(c for f, c in stacks if any(x.startswith("libfs_sampler.so") for x in f))
out["max_depth"] = max(len(f) for f, _ in stacks)
for k, v in out.items():
    print(k, v)
PYEOF
    python3 "$tmp/count.py" "$tmp/prog.samples" >"$tmp/vals" 2>"$tmp/e" || fail "sampler: the file parses" "$(tail -3 "$tmp/e")"
    python3 "$tmp/count.py" "$tmp/stripped.samples" >"$tmp/svals" 2>"$tmp/e" || fail "sampler: the stripped program's file parses" "$(tail -3 "$tmp/e")"
    v() { awk -v k="$1" '$1 == k { print $2 }' "$tmp/vals"; }
    sv() { awk -v k="$1" '$1 == k { print $2 }' "$tmp/svals"; }
    local info="$(head -9 "$tmp/prog.samples" | tr '\n' ' ')"
    [ "$(v interval_us)" = 200 ] && ok "sampler: the interval asked for" || fail "sampler: the interval asked for" "$info"
    [ "$(v spans)" = 11 ] && ok "sampler: spans = the program's 11 resumes" || fail "sampler: spans = the program's 11 resumes" "$info"
    [ "$(v sum)" = "$(v samples)" ] && ok "sampler: the stacks hold the header's samples" || fail "sampler: the stacks hold the header's samples" "$(v sum) against $info"
    [ "$(v dropped)" = 0 ] && ok "sampler: nothing dropped" || fail "sampler: nothing dropped" "$info"
    awk '!/^#/ { if (n++ && $NF > prev) bad = 1; prev = $NF } END { exit bad || n < 5 }' "$tmp/prog.samples" &&
        ok "sampler: the stacks sorted by count, most first" || fail "sampler: the stacks sorted by count, most first" "$(grep -v '^#' "$tmp/prog.samples" | awk '{ print $NF }' | tr '\n' ' ')"
    # 208 ms of CPU in the spans: 1040 samples of 200 us, fewer where the machine is loaded.
    num_ok "sampler: the spans' wall time is at least their CPU time (208 ms)" "$(v span_ns) >= 205e6" "$info"
    num_ok "sampler: at least 400 samples" "$(v samples) >= 400" "$info"
    num_ok "sampler: no more samples than the timer's expiries in the spans" \
        "$(v samples) * 200000 <= $(v span_ns) + 11 * 200000" "$info"
    num_ok "sampler: burn_a (3 x the CPU) has more than 1.8 x burn_b's self samples, less than 5 x" \
        "$(v self_a) > 1.8 * $(v self_b) && $(v self_a) < 5 * $(v self_b)" "burn_a $(v self_a), burn_b $(v self_b)"
    num_ok "sampler: 95% of the samples are under burn_a, burn_b, burn_s or last_span" "$(v under) >= 0.95 * $(v samples)" "$(v under) of $(v samples)"
    num_ok "sampler: the stack unwinds from the interrupted burn_a to main" "$(v main_a) >= 0.5 * $(v self_a)" "main;burn_a $(v main_a), burn_a $(v self_a)"
    num_ok "sampler: a call that ends its function resolves to it (main;at_end;last_span)" "$(v end_calls) >= 10" "$(grep -m2 last_span "$tmp/prog.samples")"
    [ "$(v burn_c)" = 0 ] && ok "sampler: burn_c, outside the spans, has no sample" || fail "sampler: burn_c, outside the spans, has no sample" "$(v burn_c) samples"
    [ "$(v sampler)" = 0 ] && ok "sampler: the handler's own frames are dropped" || fail "sampler: the handler's own frames are dropped" "$(grep -m3 libfs_sampler "$tmp/prog.samples" | cut -c1-300)"
    num_ok "sampler: the stacks 90 calls deep are cut to 64 frames, counted, leaf kept" \
        "$(v max_depth) == 64 && $(v truncated) > 0 && $(v deep_a) > 0" "max depth $(v max_depth), truncated $(v truncated), deep;burn_a $(v deep_a)"
    num_ok "sampler: burn_s, static (no dynamic symbol), named from .symtab" \
        "$(v self_s) > 0.5 * $(v self_b) && $(v unnamed) == 0" "burn_s $(v self_s), burn_b $(v self_b), unnamed under main $(v unnamed)"
    num_ok "sampler: stripped, burn_s is an offset under main and burn_a still has its name" \
        "$(sv named_s) == 0 && $(sv unnamed) > 0.5 * $(sv self_b) && $(sv self_a) > 1.8 * $(sv self_b)" \
        "burn_s named $(sv named_s), unnamed under main $(sv unnamed), burn_a $(sv self_a), burn_b $(sv self_b)"
    # The program without its 10 spans and writing nothing leaves no file.
    (cd "$tmp/quiet" && LD_PRELOAD=$lib "$prog" "$tmp/quiet.samples" nowrite) >"$tmp/o" 2>&1; rc=$?
    expect_rc "sampler: the program runs without writing" 0 $rc "$tmp/o"
    [ -z "$(ls -A "$tmp/quiet")" ] && [ ! -e "$tmp/quiet.samples" ] && ok "sampler: no file unless written" || fail "sampler: no file unless written" "$(ls -A "$tmp/quiet")"
    (cd "$tmp/quiet" && FS_SAMPLER_BUFFER_MB=lots LD_PRELOAD=$lib "$prog" "$tmp/quiet.samples") >"$tmp/o" 2>&1; rc=$?
    expect_rc "sampler: a bad FS_SAMPLER_BUFFER_MB fails fs_sampler_start" 1 $rc "$tmp/o"
    expect "sampler: and says what is wrong" "$tmp/o" '^fs_sampler_start: FS_SAMPLER_BUFFER_MB=lots is not a number of MiB in 1\.\.65536$'

    # 2. bench/sample_report.py on the program's file as two sides: no difference.
    mkdir -p "$tmp/same"
    cp "$tmp/prog.samples" "$tmp/same/noshim-1.samples"
    cp "$tmp/prog.samples" "$tmp/same/shim-1.samples"
    python3 bench/sample_report.py "$tmp/same" >"$tmp/o" 2>&1; rc=$?
    expect_rc "sample_report.py on the sampler's files exits 0" 0 $rc "$tmp/o"
    expect "sample_report.py: the same file on both sides differs by nothing" "$tmp/o" \
        '^shim against noshim \(1 and 1 runs, 11 and 11 spans\): ([0-9.]+) ms a span against \1 ms \(\+0\.000 ms, 1\.000 x\)$'
    expect "sample_report.py: the program's library, self time" "$tmp/o" '^ +\+0\.000 +[0-9.]+ +[0-9.]+ .* sampler_prog$'
}

report_tests() {
    # 3. bench/sample_report.py on made-up files, the numbers known. ms a span = samples x
    # interval_us / 1000 / spans. noshim: 2 runs of 10 spans at 100 us. shim: 10 spans at 100 us,
    # then 10 at 50 us; it adds libflexshim.so (hook, under mm under eval again: 1.2 and 1.4 ms a
    # span, eval counted once in its inclusive time; an unnamed function under eval: 0.4 and 0.6),
    # and poll takes 0.2 ms less.
    local d=$tmp/made
    mkdir -p "$d"
    mk() { # FILE INTERVAL SPANS "STACK COUNT"...
        local f=$1 iv=$2 spans=$3 n=0 l; shift 3
        for l in "$@"; do n=$((n + ${l##* })); done
        { printf '# fs_sampler 1\n# interval_us %s\n# spans %s\n# span_ns 1\n# samples %s\n# dropped 0\n' "$iv" "$spans" "$n"
          printf '%s\n' "$@"; } >"$d/$f"
    }
    M='python!main;python!eval'
    mk noshim-1.samples 100 10 "$M;libtorch.so!mm 500" "$M 300" "python!main;libc.so.6!poll 200"
    mk noshim-2.samples 100 10 "$M;libtorch.so!mm 520" "$M 280" "python!main;libc.so.6!poll 200"
    mk shim-1.samples 100 10 "$M;libtorch.so!mm 500" "$M 300" "python!main;libc.so.6!poll 160" \
        "$M;libtorch.so!mm;python!eval;libflexshim.so!hook 120" "$M;libflexshim.so+0x1a2b 40"
    mk shim-2.samples 50 10 "$M;libtorch.so!mm 1040" "$M 560" "python!main;libc.so.6!poll 400" \
        "$M;libtorch.so!mm;python!eval;libflexshim.so!hook 280" "$M;libflexshim.so+0x1a2b 120"
    sed -i '1a # overruns 20' "$d/shim-1.samples"          # 20 x 100 us / 20 spans
    sed -i '1a # handler_ns 3000000' "$d/shim-2.samples"   # 3 ms / 20 spans
    mk shim-3.samples 100 10 "$M 5"
    sed -i 's/^# samples 5$/# samples 9/' "$d/shim-3.samples" # a file cut short
    echo "python!main 3" >"$d/shim-4.samples"                   # no header
    python3 bench/sample_report.py "$d" --top 3 >"$tmp/o" 2>"$tmp/e"; rc=$?
    expect_rc "sample_report.py: exits 0" 0 $rc "$tmp/e"
    expect "sample_report.py: a file cut short is skipped and says why" "$tmp/e" \
        '^sample_report: shim-3\.samples: skipped: its stacks hold 5 samples, its header says 9 \(cut short\?\)$'
    expect "sample_report.py: a file without the header is skipped and says why" "$tmp/e" \
        "^sample_report: shim-4\.samples: skipped: no '# interval_us N' header line: not a fs_sampler_write file$"
    expect "sample_report.py: the totals, the difference and the ratio" "$tmp/o" \
        '^shim against noshim \(2 and 2 runs, 20 and 20 spans\): 11\.600 ms a span against 10\.000 ms \(\+1\.600 ms, 1\.160 x\)$'
    expect "sample_report.py: each run's total, the expiries missed, the handler's time" "$tmp/o" \
        '^  shim: runs 11\.200 12\.000 ms a span; timer expiries missed 0\.100 ms a span \(the thread waiting for a CPU\); the sampler.s handler 0\.150 ms a span$'
    expect "sample_report.py: self by library, the largest difference first, with each side's runs" "$tmp/o" \
        '^  self time by library, ms a span$' 
    sed -n '/^  self time by library/,/^  self time by leaf/p' "$tmp/o" | sed '1,2d;$d' >"$tmp/lib"
    cat >"$tmp/lib.want" <<'EOF'
        +1.800      1.800      0.000      1.600-2.000     0.000-0.000  libflexshim.so
        -0.200      1.800      2.000      1.600-2.000     2.000-2.000  libc.so.6
        +0.000      5.100      5.100      5.000-5.200     5.000-5.200  libtorch.so
        +0.000      2.900      2.900      2.800-3.000     2.800-3.000  python
EOF
    cmp -s "$tmp/lib" "$tmp/lib.want" && ok "sample_report.py: self time by library, every number" || fail "sample_report.py: self time by library, every number" "$(diff "$tmp/lib.want" "$tmp/lib")"
    sed -n '/^  self time by leaf/,/^  inclusive time/p' "$tmp/o" | sed '$d' >"$tmp/leaf"
    cat >"$tmp/leaf.want" <<'EOF'
  self time by leaf frame, ms a span (the 3 largest differences of 5)
    difference       shim     noshim        shim runs     noshim runs  frame
        +1.300      1.300      0.000      1.200-1.400     0.000-0.000  libflexshim.so!hook
        +0.500      0.500      0.000      0.400-0.600     0.000-0.000  libflexshim.so+0x1a2b
        -0.200      1.800      2.000      1.600-2.000     2.000-2.000  libc.so.6!poll
EOF
    cmp -s "$tmp/leaf" "$tmp/leaf.want" && ok "sample_report.py: self time by leaf frame, top 3, every number" || fail "sample_report.py: self time by leaf frame, top 3, every number" "$(diff "$tmp/leaf.want" "$tmp/leaf")"
    sed -n '/^  inclusive time/,$p' "$tmp/o" >"$tmp/incl"
    cat >"$tmp/incl.want" <<'EOF'
  inclusive time by frame, ms a span (the 3 largest differences of 6)
    difference       shim     noshim        shim runs     noshim runs  frame
        +1.800      9.800      8.000     9.600-10.000     8.000-8.000  python!eval
        +1.600     11.600     10.000    11.200-12.000   10.000-10.000  python!main
        +1.300      6.400      5.100      6.200-6.600     5.000-5.200  libtorch.so!mm
EOF
    cmp -s "$tmp/incl" "$tmp/incl.want" && ok "sample_report.py: inclusive time by frame, top 3, every number" || fail "sample_report.py: inclusive time by frame, top 3, every number" "$(diff "$tmp/incl.want" "$tmp/incl")"
    # Without noshim the first side is the baseline; nothing usable exits 2.
    rm -f "$d"/noshim-*.samples
    mv "$d/shim-1.samples" "$d/a-1.samples"
    python3 bench/sample_report.py "$d" >"$tmp/o" 2>&1; rc=$?
    expect_rc "sample_report.py: without noshim, exits 0" 0 $rc "$tmp/o"
    expect "sample_report.py: without noshim, the first side is the baseline" "$tmp/o" \
        '^shim against a \(1 and 1 runs, 10 and 10 spans\): 12\.000 ms a span against 11\.200 ms \(\+0\.800 ms, 1\.071 x\)$'
    rm -f "$d/a-1.samples" "$d/shim-2.samples"
    python3 bench/sample_report.py "$d" >"$tmp/o" 2>&1; rc=$?
    expect_rc "sample_report.py: no usable file exits 2" 2 $rc "$tmp/o"
    expect "sample_report.py: says so" "$tmp/o" "^sample_report: no usable SIDE-ROUND\.samples file in $d$"
}

if [ "${SAN:-}" = 1 ]; then
    echo "skip bench/sampler.c and bench/sample_report.py under SAN=1 (a benchmark tool, not in the sanitizer suite)"
else
    sampler_tests
    report_tests
fi
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    finish
fi
