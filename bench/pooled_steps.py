#!/usr/bin/env python3
"""Pooled step-time percentiles of an overhead.sh output directory, per side, against noshim.

    python3 bench/pooled_steps.py DIR [--quiet PCT] [NAME=LABEL ...]

Each side's timed steps (bench.py JSON `step_ms` after `warmup_steps`) from all of its runs are
pooled; the lower percentiles show the floor a side reaches, which the per-run medians hide on a
host where whole processes run slow (stop 28: unshimmed runs of one call varied 19-33 ms). Also
prints the best run's 10th percentile. NAME=LABEL renames a side in the output (shim=plain).

Runs made with --cpu-probe also get "quiet:" lines: only the steps whose CPU probes, the one
before the step and the one after it, are both within PCT percent (5 unless --quiet says) of the
host's fastest (the 5th percentile of every timed step's probe, all sides together). On a noisy
host the host's speed changes from second to second (stop 39: probes of 1.2-2.9 ms within one
run, and run medians of noshim 19-42 ms), and whole runs of one side can land in slow stretches;
the steps taken while the host ran at full speed can still be compared.
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


MIN_QUIET_STEPS = 3


def quiet_steps(steps, probes, warmup, bound):
    """The timed steps whose probe before and probe after are both at most BOUND (probes[i] is
    taken right after step i; the first step of a run has no probe before it)."""
    return [s for i, s in enumerate(steps, warmup)
            if probes[i] <= bound and (i == 0 or probes[i - 1] <= bound)]


def print_quiet(sides, probed, labels, tol_pct):
    """The "quiet:" lines (module doc) for the sides whose every run has a probe per step."""
    timed = [p for runs in probed.values() for steps, probes, w in runs for p in probes[w:]]
    if "noshim" not in probed or not timed:
        return
    bound = pct(timed, 0.05) * (1 + tol_pct / 100)
    quiet = {side: [s for steps, probes, w in runs for s in quiet_steps(steps, probes, w, bound)]
             for side, runs in probed.items()}
    what = f"steps with both CPU probes within {tol_pct:g}% of the host's fastest (<= {bound:.3f} ms)"
    if len(quiet["noshim"]) < MIN_QUIET_STEPS:
        print(f"quiet: noshim has {len(quiet['noshim'])} {what}: too few to compare against")
        return
    base = [pct(quiet["noshim"], q) for q in (0.10, 0.5)]
    for side in ["noshim"] + sorted(s for s in quiet if s != "noshim"):
        n, total = len(quiet[side]), sum(map(len, sides[side]))
        if n < MIN_QUIET_STEPS:
            print(f"quiet: {labels.get(side, side):12s} {n} of {total} {what}: too few")
            continue
        s = [pct(quiet[side], q) for q in (0.10, 0.5)]
        print(f"quiet: {labels.get(side, side):12s} {n} of {total} {what}: "
              f"p10 {s[0]:.2f} ({s[0] / base[0]:.3f}), p50 {s[1]:.2f} ({s[1] / base[1]:.3f})")


def main(argv):
    args, tol_pct = argv[1:], 5.0
    if "--quiet" in args:
        i = args.index("--quiet")
        try:
            tol_pct = float(args[i + 1])
            if not 0 <= tol_pct <= 100:
                raise ValueError
        except (IndexError, ValueError):
            sys.exit("pooled_steps.py: --quiet PCT: a percent from 0 to 100 (e.g. --quiet 5)")
        del args[i:i + 2]
    if not args or not os.path.isdir(args[0]):
        sys.exit("usage: pooled_steps.py DIR [--quiet PCT] [NAME=LABEL ...] (DIR: overhead.sh's OUT)")
    labels = dict(a.split("=", 1) for a in args[1:])
    sides, probed = {}, {}
    for f in sorted(glob.glob(os.path.join(args[0], "*.json"))):
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
            probes = j.get("cpu_probe_ms")
            if isinstance(probes, list) and len(probes) == len(j["step_ms"]):
                probed.setdefault(side, []).append((steps, probes, j["warmup_steps"]))
    if "noshim" not in sides:
        sys.exit(f"pooled_steps.py: no noshim-*.json with steps after the warm-up ones in "
                 f"{args[0]} (with ITERS at most the warm-up, every step is one)")
    base = stats(sides["noshim"])
    for side in ["noshim"] + sorted(s for s in sides if s != "noshim"):
        s = stats(sides[side])
        r = [a / b for a, b in zip(s, base)]
        print(f"{labels.get(side, side):12s} {sum(map(len, sides[side]))} steps: pooled "
              f"p5 {s[0]:.2f} ({r[0]:.3f}), p10 {s[1]:.2f} ({r[1]:.3f}), "
              f"p25 {s[2]:.2f} ({r[2]:.3f}), p50 {s[3]:.2f} ({r[3]:.3f}); "
              f"best run's p10 {s[4]:.2f} ({r[4]:.3f})")
    # Only where every run of a side has its probes: a side's quiet steps from some runs only
    # would be set beside another's from all.
    print_quiet(sides, {k: v for k, v in probed.items() if len(v) == len(sides[k])}, labels,
                tol_pct)


if __name__ == "__main__":
    main(sys.argv)
