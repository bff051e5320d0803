#!/usr/bin/env python3
"""Each step beside the GPU's clock and power: bench.py results and nvidia-smi's samples.

  python3 bench/clock_steps.py SMI.csv RESULT.json [RESULT.json ...]
        SMI.csv: `nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu
        --format=csv,noheader -lms N` (bench/device_ab.sh writes it as smi.csv), read on the
        machine that wrote it (its timestamps are in that machine's local time). RESULT.json:
        bench.py's --result files with step_start_unix (each step's start on the wall clock).
        Per run: every timed step (the warm-up ones left out) with its time, the mean SM clock
        and power of the samples within it, and how many there were. Per side (the file name
        before its last '-'): the mean step, the mean clock and power over its steps, and the
        correlation of step time with clock over the steps that had samples.
  python3 bench/clock_steps.py --selftest

Plain Python 3, no dependencies (it runs on the GPU machine too).
"""
import argparse
import json
import os
import statistics
import sys
import time

from layer_steps import side_of  # bench/ is this script's directory, first on sys.path


def read_smi(lines):
    """[(unix time, SM MHz, W)] of the sample lines; others (errors, headers) are skipped."""
    out = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4:
            continue
        try:
            stamp, frac = parts[0].split(".") if "." in parts[0] else (parts[0], "0")
            t = time.mktime(time.strptime(stamp, "%Y/%m/%d %H:%M:%S")) + float("0." + frac)
            sm = float(parts[1].split()[0])
            watts = float(parts[3].split()[0])
        except ValueError:
            continue
        out.append((t, sm, watts))
    return out


def run_steps(res, smi):
    """[(step number, ms, mean SM MHz or None, mean W or None, samples)] of the timed steps."""
    warm = res.get("warmup") or 0
    times = res.get("step_ms") or []
    starts = res.get("step_start_unix") or []
    out = []
    for i, (ms, t0) in enumerate(zip(times, starts)):
        if i < warm:
            continue
        inside = [(sm, w) for t, sm, w in smi if t0 <= t < t0 + ms / 1000]
        sm = statistics.mean(s for s, _ in inside) if inside else None
        watts = statistics.mean(w for _, w in inside) if inside else None
        out.append((i + 1, ms, sm, watts, len(inside)))
    return out


def correlation(xs, ys):
    """Pearson's r, or None with fewer than 3 points or a constant side."""
    if len(xs) < 3:
        return None
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:
        return None


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def report(smi, paths, out):
    sides = {}
    for path in paths:
        with open(path) as f:
            res = json.load(f)
        if not res.get("step_start_unix"):
            print(f"{os.path.basename(path)}: no step_start_unix (bench.py before 2026-12-06)",
                  file=out)
            continue
        steps = run_steps(res, smi)
        print(f"{os.path.basename(path)}: " + "  ".join(
            f"{n}:{ms:.1f}@{fmt(sm, '.0f')}MHz/{fmt(w, '.0f')}W({k})" for n, ms, sm, w, k in steps),
            file=out)
        sides.setdefault(side_of(path), []).extend(steps)
    if not sides:
        return 1
    print("\nside: mean step ms, mean SM MHz, mean W (steps with samples), r(step ms, SM MHz)",
          file=out)
    for side, steps in sides.items():
        seen = [s for s in steps if s[2] is not None]
        r = correlation([s[1] for s in seen], [s[2] for s in seen])
        print(f"  {side}: {statistics.mean(s[1] for s in steps):.2f} ms, "
              f"{fmt(statistics.mean(s[2] for s in seen) if seen else None, '.0f')} MHz, "
              f"{fmt(statistics.mean(s[3] for s in seen) if seen else None, '.0f')} W "
              f"({len(seen)} of {len(steps)} steps), r {fmt(r, '.2f')}", file=out)
    return 0


def selftest():
    import io
    import tempfile

    t0 = 1_780_000_000.0
    # Samples every 100 ms over 2 s: 1980 MHz for the first second, 1500 after.
    stamp = lambda t: time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(t)) + \
        ".%03d" % round((t % 1) * 1000)
    lines = ["timestamp, clocks.current.sm [MHz], x, power.draw [W], temperature"]
    for k in range(20):
        t = t0 + k * 0.1
        lines.append(f"{stamp(t)}, {1980 if k < 10 else 1500} MHz, 2619 MHz, "
                     f"{300 if k < 10 else 700}.00 W, 40")
    lines.append("[Unknown Error]")
    smi = read_smi(lines)
    assert len(smi) == 20, smi
    assert abs(smi[0][0] - t0) < 0.002 and smi[0][1] == 1980 and smi[19][2] == 700
    # A warm-up step, then three steps: 0.5 s at 1980, 0.5 s at 1980, 1 s at 1500 MHz.
    res = {"warmup": 1, "step_ms": [100.0, 500.0, 500.0, 1000.0],
           "step_start_unix": [t0 - 0.2, t0 - 0.0005, t0 + 0.4995, t0 + 0.9995]}
    steps = run_steps(res, smi)
    assert [s[0] for s in steps] == [2, 3, 4], steps
    assert [s[4] for s in steps] == [5, 5, 10], steps
    assert steps[0][2] == 1980 and steps[2][2] == 1500 and steps[2][3] == 700, steps
    assert abs(correlation([1, 2, 3], [3, 2, 1]) + 1.0) < 1e-12
    assert correlation([1, 1, 1], [1, 2, 3]) is None and correlation([1, 2], [2, 1]) is None
    with tempfile.TemporaryDirectory() as d:
        for name, r in (("shim-1.json", res), ("old-1.json", {"step_ms": [1.0]})):
            with open(os.path.join(d, name), "w") as f:
                json.dump(r, f)
        out = io.StringIO()
        rc = report(smi, [os.path.join(d, "shim-1.json"), os.path.join(d, "old-1.json")], out)
        text = out.getvalue()
        assert rc == 0, text
        assert "2:500.0@1980MHz/300W(5)" in text and "4:1000.0@1500MHz/700W(10)" in text, text
        assert "old-1.json: no step_start_unix" in text, text
        assert "shim: 666.67 ms, 1820 MHz, 433 W (3 of 3 steps), r -1.00" in text, text
    print("clock_steps.py selftest: ok")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("smi", nargs="?")
    ap.add_argument("results", nargs="*")
    ap.add_argument("--selftest", action="store_true")
    args = ap.parse_args()
    if args.selftest:
        return selftest()
    if not args.smi or not args.results:
        ap.error("give nvidia-smi's samples and bench.py result files (or --selftest)")
    with open(args.smi) as f:
        smi = read_smi(f)
    if not smi:
        print(f"clock_steps.py: {args.smi}: no samples", file=sys.stderr)
        return 1
    return report(smi, args.results, sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
