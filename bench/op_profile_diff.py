#!/usr/bin/env python3
"""Which ops a side makes slower on the host: bench.py --op-profile results compared per op.

    python3 bench/op_profile_diff.py DIR [SIDE ...] [--top N]

DIR is overhead.sh's OUT, run with BENCH_ARGS="--op-profile STEPS". Each SIDE (a file-name prefix
there: noshim, shim, shim_ENABLED_0, ...; default: every side found) is set beside noshim: for
each op, the median over that side's runs of its self CPU time a step, and the difference to
noshim's. Prints the ops with the largest differences (N, default 15) and the sum over every op
both sides recorded. An op absent from a run's top 60 counts as not measured in that run.
"""
import json
import os
import re
import statistics
import sys

import side_args


def load(out):
    """{side: [op_cpu_us of each run]} from DIR's SIDE-ROUND.json files."""
    runs = {}
    for name in sorted(os.listdir(out)):
        m = re.fullmatch(r"(.+)-(\d+)\.json", name)
        if not m:
            continue
        try:
            with open(os.path.join(out, name)) as f:
                ops = json.load(f).get("op_cpu_us")
        except (OSError, ValueError) as e:
            print(f"op_profile_diff: {name}: skipped ({e})")
            continue
        if ops:
            runs.setdefault(m.group(1), []).append(ops)
    return runs


def medians(runs):
    """{op: (median self CPU us a step, median calls a step)} over the runs that measured it."""
    names = {op for ops in runs for op in ops}
    return {op: (statistics.median(ops[op][0] for ops in runs if op in ops),
                 statistics.median(ops[op][1] for ops in runs if op in ops)) for op in names}


def main(argv):
    args = side_args.parse(argv, "op_profile_diff", __doc__.strip().splitlines()[2].strip())
    if args is None:
        return 2
    out, wanted, top = args
    runs = load(out)
    if "noshim" not in runs:
        print(f"op_profile_diff: no noshim run with op_cpu_us in {out} (run overhead.sh "
              f"with BENCH_ARGS=\"--op-profile 8\")", file=sys.stderr)
        return 1
    base = medians(runs["noshim"])
    sides = wanted or [s for s in sorted(runs) if s != "noshim"]
    for side in sides:
        if side not in runs:
            print(f"{side}: no run with op_cpu_us")
            continue
        med = medians(runs[side])
        both = sorted(set(base) & set(med))
        total0 = sum(base[op][0] for op in both)
        total1 = sum(med[op][0] for op in both)
        print(f"{side} against noshim ({len(runs[side])} and {len(runs['noshim'])} runs): "
              f"{len(both)} ops in both, self CPU a step {total1:.0f} us against {total0:.0f} us "
              f"({total1 - total0:+.0f} us)")
        for op in sorted(both, key=lambda o: abs(med[o][0] - base[o][0]), reverse=True)[:top]:
            (t1, n1), (t0, n0) = med[op], base[op]
            print(f"  {t1 - t0:+9.1f} us  {t1:9.1f} against {t0:9.1f} us a step, "
                  f"{n1:g} against {n0:g} calls  {op}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
