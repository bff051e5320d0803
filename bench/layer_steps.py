#!/usr/bin/env python3
"""Slow steps beside fast ones, layer by layer, from bench.py results run with --layer-times all.

  python3 bench/layer_steps.py RESULT.json [RESULT.json ...] [--base SIDE]
        RESULT.json: bench.py's --result files (bench/overhead.sh leaves SIDE-ROUND.json in its
        OUT), each with the key layers_by_step. Per run: every timed step (the warm-up ones left
        out) with its time and its device time, split at the run's median into fast and slow
        steps. Per side (the file name before its last '-', e.g. noshim, pipeline, shim): the
        mean fast and slow step, and each layer's mean device time in fast and in slow steps.
        Then each side against --base (default: the first side given): the layers where it
        spends the most device time more than the base, in fast and in slow steps.
  python3 bench/layer_steps.py --selftest

Times in ms. Plain Python 3, no dependencies (it runs on the GPU machine too).
"""
import argparse
import json
import os
import statistics
import sys


def side_of(path):
    """noshim-2.json -> noshim; shim_STRATEGY_greedy-1.json -> shim_STRATEGY_greedy."""
    name = os.path.basename(path)
    name = name[:-5] if name.endswith(".json") else name
    return name.rsplit("-", 1)[0] if "-" in name else name


def run_steps(res):
    """[(step number, step ms, {layer: device ms})] of the timed steps of one result."""
    warm = res.get("warmup") or 0
    times = res.get("step_ms") or []
    out = []
    for entry in res.get("layers_by_step") or []:
        n = entry["step"]
        if n <= warm or n > len(times):
            continue
        out.append((n, times[n - 1], {row[0]: row[2] for row in entry["rows"]}))
    return out


def split(steps):
    """(fast, slow): the steps at or below the run's median step time, and those above."""
    med = statistics.median(t for _, t, _ in steps)
    return [s for s in steps if s[1] <= med], [s for s in steps if s[1] > med]


def mean_step(steps):
    """Mean step ms of STEPS (0 when none)."""
    return statistics.fmean(t for _, t, _ in steps) if steps else 0.0


def mean_device(steps):
    """Mean device ms of all layers of STEPS (0 when none)."""
    return statistics.fmean(sum(d.values()) for _, _, d in steps) if steps else 0.0


def layer_means(steps):
    """{layer: mean device ms} over STEPS (layers in the order of the first step)."""
    if not steps:
        return {}
    return {k: statistics.fmean(s[2].get(k, 0.0) for s in steps) for k in steps[0][2]}


def summarize(paths, base=None, out=sys.stdout):
    """Print the report; returns {side: (fast steps, slow steps)} (lists over all its runs)."""
    sides = {}
    for path in paths:
        with open(path) as f:
            res = json.load(f)
        steps = run_steps(res)
        if len(steps) < 2:
            print(f"{path}: fewer than two timed steps with layer times (run with "
                  f"--layer-times all)", file=out)
            continue
        fast, slow = split(steps)
        slow_steps = {n for n, _, _ in slow}
        line = " ".join(f"{n}:{t:.1f}{'*' if n in slow_steps else ''}" for n, t, _ in steps)
        if slow:
            line += f"  (* slow; fast {mean_step(fast):.1f}, slow {mean_step(slow):.1f})"
        print(f"{os.path.basename(path)}: {line}", file=out)
        f_all, s_all = sides.setdefault(side_of(path), ([], []))
        f_all.extend(fast)
        s_all.extend(slow)
    if not sides:
        return sides
    print("\nside: mean step ms (fast / slow), device ms of all layers (fast / slow), steps",
          file=out)
    for side, (fast, slow) in sides.items():
        print(f"  {side}: {mean_step(fast):.2f} / {mean_step(slow):.2f}; "
              f"{mean_device(fast):.2f} / {mean_device(slow):.2f}; {len(fast)} fast, "
              f"{len(slow)} slow", file=out)
    base = base or next(iter(sides))
    if base not in sides:
        print(f"--base {base}: no such side (sides: {', '.join(sides)})", file=out)
        return sides
    bf, bs = layer_means(sides[base][0]), layer_means(sides[base][1])
    for side, (fast, slow) in sides.items():
        if side == base:
            continue
        for label, mine, theirs in (("fast", layer_means(fast), bf),
                                    ("slow", layer_means(slow), bs)):
            diff = sorted(((mine[k] - theirs.get(k, 0.0), k) for k in mine), reverse=True)
            total = sum(d for d, _ in diff)
            print(f"{side} - {base}, {label} steps: {total:+.2f} ms over all layers; most: " +
                  ", ".join(f"{k} {d:+.2f}" for d, k in diff[:8]), file=out)
    return sides


def selftest():
    import io
    import tempfile

    from selfcheck import Checks

    check = Checks("layer_steps.py")

    def result(step_ms, extra_layer1):
        # Step i: layer0 5 ms, layer1 5 ms (+ EXTRA in slow steps); step 1 is warm-up.
        return {"warmup": 1, "step_ms": step_ms, "layers_by_step": [
            {"step": i + 1, "rows": [["start", 0.1, 0.0], ["layer0", 1.0, 5.0],
                                     ["layer1", 1.0, 5.0 + (extra_layer1 if t > 11 else 0.0)]]}
            for i, t in enumerate(step_ms)]}

    check("side of a file", side_of("/x/shim_STRATEGY_greedy-2.json") == "shim_STRATEGY_greedy")
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for name, extra in (("noshim-1.json", 1.0), ("shim-1.json", 3.0)):
            paths.append(os.path.join(d, name))
            with open(paths[-1], "w") as f:
                json.dump(result([50.0, 10.0, 12.0, 10.0, 12.0], extra), f)
        buf = io.StringIO()
        sides = summarize(paths, out=buf)
        text = buf.getvalue()
        check("two sides", sorted(sides) == ["noshim", "shim"], sorted(sides))
        check("warm-up left out", all(n > 1 for s in sides["shim"] for n, _, _ in s))
        check("two fast, two slow", [len(x) for x in sides["shim"]] == [2, 2])
        check("slow steps marked", "3:12.0*" in text and "2:10.0 " in text, text)
        check("layer1 is where shim's slow steps lose 2 ms",
              "shim - noshim, slow steps: +2.00 ms over all layers; most: layer1 +2.00" in text,
              text)
        check("fast steps equal", "shim - noshim, fast steps: +0.00 ms" in text, text)
        empty = os.path.join(d, "pipeline-1.json")
        with open(empty, "w") as f:
            json.dump({"step_ms": [1.0]}, f)
        buf = io.StringIO()
        summarize([empty], out=buf)
        check("a run without layer times is named", "fewer than two timed steps" in buf.getvalue())
    return check.done()


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", nargs="*")
    ap.add_argument("--base", help="the side the others are set against (default: the first)")
    ap.add_argument("--selftest", action="store_true")
    args = ap.parse_args(argv)
    if args.selftest:
        return selftest()
    if not args.results:
        ap.error("give bench.py result files (or --selftest)")
    try:
        sides = summarize(args.results, args.base)
    except (OSError, ValueError, KeyError, IndexError) as e:
        print(f"layer_steps.py: {e}", file=sys.stderr)
        return 2
    return 0 if sides else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
