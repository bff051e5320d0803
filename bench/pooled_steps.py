#!/usr/bin/env python3
"""Pooled step-time percentiles of an overhead.sh output directory, per side, against noshim.

    python3 bench/pooled_steps.py DIR [NAME=LABEL ...]

Each side's timed steps (bench.py JSON `step_ms` after `warmup_steps`) from all of its runs are
pooled; the lower percentiles show the floor a side reaches, which the per-run medians hide on a
host where whole processes run slow (stop 28: unshimmed runs of one call varied 19-33 ms). Also
prints the best run's 10th percentile. NAME=LABEL renames a side in the output (shim=plain).
"""
import glob
import json
import os
import sys


def pct(values, p):
    v = sorted(values)
    k = (len(v) - 1) * p
    f = int(k)
    c = min(f + 1, len(v) - 1)
    return v[f] + (v[c] - v[f]) * (k - f)


def stats(runs):
    pooled = [x for r in runs for x in r]
    return [pct(pooled, q) for q in (0.05, 0.10, 0.25, 0.5)] + [min(pct(r, 0.1) for r in runs)]


def main(argv):
    if len(argv) < 2 or not os.path.isdir(argv[1]):
        sys.exit("usage: pooled_steps.py DIR [NAME=LABEL ...] (DIR: overhead.sh's OUT)")
    labels = dict(a.split("=", 1) for a in argv[2:])
    sides = {}
    for f in sorted(glob.glob(os.path.join(argv[1], "*.json"))):
        side = os.path.basename(f).rsplit("-", 1)[0]
        try:
            with open(f) as fh:
                j = json.load(fh)
            steps = j["step_ms"][j["warmup_steps"]:]
        except (OSError, ValueError, KeyError, TypeError) as e:
            # A run that failed leaves no result, or half of one: the others still count.
            print(f"pooled_steps.py: {f}: skipped, not a bench.py result ({e!r})", file=sys.stderr)
            continue
        if steps:
            sides.setdefault(side, []).append(steps)
    if "noshim" not in sides:
        sys.exit(f"pooled_steps.py: no noshim-*.json with steps after the warm-up ones in "
                 f"{argv[1]} (with ITERS at most the warm-up, every step is one)")
    base = stats(sides["noshim"])
    for side in ["noshim"] + sorted(s for s in sides if s != "noshim"):
        s = stats(sides[side])
        r = [a / b for a, b in zip(s, base)]
        print(f"{labels.get(side, side):12s} {sum(map(len, sides[side]))} steps: pooled "
              f"p5 {s[0]:.2f} ({r[0]:.3f}), p10 {s[1]:.2f} ({r[1]:.3f}), "
              f"p25 {s[2]:.2f} ({r[2]:.3f}), p50 {s[3]:.2f} ({r[3]:.3f}); "
              f"best run's p10 {s[4]:.2f} ({r[4]:.3f})")


if __name__ == "__main__":
    main(sys.argv)
