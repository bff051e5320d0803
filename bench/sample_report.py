#!/usr/bin/env python3
"""Where one thread's time goes, side against side: libfs_sampler.so's samples compared.

    python3 bench/sample_report.py DIR [SIDE ...] [--top N]

DIR holds SIDE-ROUND.samples files (SIDE a name: noshim, shim, shim_ENABLED_0, ...; ROUND an
integer), each written by fs_sampler_write (bench/sampler.c): '#' header lines (interval_us,
spans, samples, ...), then "root;...;leaf COUNT" per distinct stack. A side's time a span (a
step, where the program opens one span a step) is its samples x interval_us / its spans, over all
its runs. Each SIDE (default: every side found) is set beside noshim (where there is no noshim
run, beside the first side) and printed:
  - the total ms a span, the difference and the ratio; each run's total, the time of the timer's
    expiries that found the thread not running (waiting for a CPU: not sampled) and the
    sampler's own time in its handler (not sampled either);
  - self time by library (the leaf frame's library), ms a span: the difference, both sides and
    the spread over the runs (the lowest and highest run), the largest differences first;
  - self time by leaf frame, the N (default 15) largest differences;
  - inclusive time by frame (counted once a sample wherever it is in the stack), the N largest.
The samples are of wall time within the spans (bench/sampler.c): a blocked thread shows as the
system call's wrapper (libc, vdso, the driver). A file that cannot be read or is not the format
is named on stderr and skipped; exit 2 if no file is usable.
"""
import os
import re
import sys

import side_args

NAME = "sample_report"


class Bad(Exception):
    pass


def library(frame):
    """The library part of a frame name: LIB!SYMBOL, LIB+0xOFFSET, ?+0xADDRESS."""
    if "!" in frame:
        return frame.split("!", 1)[0]
    m = re.fullmatch(r"(.*)\+0x[0-9a-f]+", frame)
    return m.group(1) if m else frame


def parse(path):
    """(header {key: int}, [(frames root first, count)]) of one file; Bad says what is wrong."""
    header, stacks = {}, []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                line = line.rstrip("\n")
                if not line:
                    continue
                if line.startswith("#"):
                    parts = line[1:].split()
                    if len(parts) == 2 and parts[1].isdigit():
                        header[parts[0]] = int(parts[1])
                    continue
                stack, _, count = line.rpartition(" ")
                if not stack or not count.isdigit() or int(count) == 0:
                    raise Bad(f"line {lineno} is not 'STACK COUNT': {line[:80]!r}")
                stacks.append((stack.split(";"), int(count)))
    except OSError as e:
        raise Bad(e.strerror or str(e))
    for key in ("interval_us", "spans", "samples"):
        if key not in header:
            raise Bad(f"no '# {key} N' header line: not a fs_sampler_write file")
    if header["spans"] == 0 or header["interval_us"] == 0:
        raise Bad(f"{header['spans']} spans, interval {header['interval_us']} us: nothing to "
                  f"divide by")
    total = sum(c for _, c in stacks)
    if total != header["samples"]:
        raise Bad(f"its stacks hold {total} samples, its header says {header['samples']} "
                  f"(cut short?)")
    return header, stacks


class Run:
    """One file's time, ms in all (divide by spans for ms a span), by total, library, leaf
    frame and frame anywhere in the stack."""

    def __init__(self, name, header, stacks):
        self.name, self.header, self.spans = name, header, header["spans"]
        ms = header["interval_us"] / 1000.0
        self.total = header["samples"] * ms
        self.lib, self.leaf, self.incl = {}, {}, {}
        for frames, count in stacks:
            leaf = frames[-1]
            for table, key in ((self.lib, library(leaf)), (self.leaf, leaf)):
                table[key] = table.get(key, 0.0) + count * ms
            for frame in set(frames):
                self.incl[frame] = self.incl.get(frame, 0.0) + count * ms


def load(out):
    """{side: [Run, ...]} from DIR's SIDE-ROUND.samples files, rounds in order."""
    found = []
    for name in os.listdir(out):
        m = re.fullmatch(r"(.+)-(\d+)\.samples", name)
        if m:
            found.append((m.group(1), int(m.group(2)), name))
    runs = {}
    for side, _, name in sorted(found):
        try:
            header, stacks = parse(os.path.join(out, name))
        except Bad as e:
            print(f"{NAME}: {name}: skipped: {e}", file=sys.stderr)
            continue
        runs.setdefault(side, []).append(Run(name, header, stacks))
    return runs


class Side:
    """A side's runs pooled: ms a span in all, and each run's."""

    def __init__(self, name, runs):
        self.name, self.runs = name, runs
        self.spans = sum(r.spans for r in runs)
        self.total = sum(r.total for r in runs) / self.spans

    def per_span(self, table):
        """{key: ms a span over all runs} of one of Run's tables ('lib', 'leaf', 'incl')."""
        out = {}
        for r in self.runs:
            for key, ms in getattr(r, table).items():
                out[key] = out.get(key, 0.0) + ms
        return {key: ms / self.spans for key, ms in out.items()}

    def spread(self, table, key):
        """(lowest, highest) run's ms a span of key."""
        values = [getattr(r, table).get(key, 0.0) / r.spans for r in self.runs]
        return min(values), max(values)

    def header_sum(self, key):
        return sum(r.header.get(key, 0) for r in self.runs)


def table(title, what, tab, a, b, top):
    """Rows of one table: the largest |difference| first, then the largest time, then the name."""
    va, vb = a.per_span(tab), b.per_span(tab)

    def order(k):  # |difference|, then the larger side's time, then the name
        x, y = va.get(k, 0.0), vb.get(k, 0.0)
        return -round(abs(x - y), 9), -round(max(x, y), 9), k
    keys = sorted(set(va) | set(vb), key=order)
    shown = keys if top is None else keys[:top]
    more = ""
    if len(shown) < len(keys):
        more = f" (the {len(shown)} largest differences of {len(keys)})"
    print(f"  {title}, ms a span{more}")
    ra, rb = f"{a.name} runs", f"{b.name} runs"
    print(f"    {'difference':>10} {a.name:>10} {b.name:>10}  {ra:>15} {rb:>15}  {what}")
    for k in shown:
        x, y = va.get(k, 0.0), vb.get(k, 0.0)
        sa = "%.3f-%.3f" % a.spread(tab, k)
        sb = "%.3f-%.3f" % b.spread(tab, k)
        print(f"    {x - y:+10.3f} {x:10.3f} {y:10.3f}  {sa:>15} {sb:>15}  {k}")


def notes(side):
    n = side.header_sum("samples")
    dropped, truncated = side.header_sum("dropped"), side.header_sum("truncated")
    if dropped:
        print(f"  note: {side.name}: {dropped} samples dropped (the sampler's buffer was full: "
              f"FS_SAMPLER_BUFFER_MB): its times are low")
    if truncated:
        print(f"  note: {side.name}: {truncated} of {n} samples had deeper stacks than the sampler "
              f"keeps: inclusive times of the frames near the root are low")


def compare(a, b, top):
    ratio = f"{a.total / b.total:.3f} x" if b.total else "-"
    print(f"{a.name} against {b.name} ({len(a.runs)} and {len(b.runs)} runs, {a.spans} and "
          f"{b.spans} spans): {a.total:.3f} ms a span against {b.total:.3f} ms "
          f"({a.total - b.total:+.3f} ms, {ratio})")
    for s in (a, b):
        each = " ".join(f"{r.total / r.spans:.3f}" for r in s.runs)
        missed = sum(r.header.get("overruns", 0) * r.header["interval_us"] for r in s.runs)
        missed /= 1000.0 * s.spans
        handler = s.header_sum("handler_ns") / 1e6 / s.spans
        print(f"  {s.name}: runs {each} ms a span; timer expiries missed {missed:.3f} ms a span "
              f"(the thread waiting for a CPU); the sampler's handler {handler:.3f} ms a span")
    for s in (a, b):
        notes(s)
    table("self time by library", "library", "lib", a, b, None)
    table("self time by leaf frame", "frame", "leaf", a, b, top)
    table("inclusive time by frame", "frame", "incl", a, b, top)


def main(argv):
    args = side_args.parse(argv, NAME, __doc__.strip().splitlines()[2].strip())
    if args is None:
        return 2
    out, wanted, top = args
    runs = load(out)
    if not runs:
        print(f"{NAME}: no usable SIDE-ROUND.samples file in {out}", file=sys.stderr)
        return 2
    wanted = wanted or sorted(runs)
    for side in wanted:
        if side not in runs:
            print(f"{NAME}: {side}: no usable run in {out}", file=sys.stderr)
    present = [s for s in wanted if s in runs]
    base = "noshim" if "noshim" in runs else (present[0] if present else None)
    others = [s for s in present if s != base]
    if not others:
        print(f"{NAME}: {out}: no side to set beside {base} (sides: {' '.join(sorted(runs))})",
              file=sys.stderr)
        return 1
    b = Side(base, runs[base])
    for i, side in enumerate(others):
        if i:
            print()
        compare(Side(side, runs[side]), b, top)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
