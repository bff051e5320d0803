#!/usr/bin/env python3
"""Where a step's time went, from a run trace (FLEXTENSOR_TRACE_OUT, core/run_trace.h).

  python3 bench/trace_summary.py TRACE.json [--last N]
        per step (from one "iteration" mark to the next; the last N steps, default 8, and their
        median): the step's host time, and for each lane (program, mover, finishers) the time
        spent in each kind of span and how many there were; the most slots busy at once
  python3 bench/trace_summary.py --selftest

Times are host-clock milliseconds. A span that crosses a step boundary counts in the step where
it begins. Plain Python 3, no dependencies (it runs on the GPU machine too).
"""
import argparse
import json
import re
import statistics
import sys

NAME = re.compile(r"^(.*?) (\d+)$")


def load(path):
    with open(path) as f:
        doc = json.load(f)
    lanes, spans, marks = {}, [], []
    for e in doc.get("traceEvents", []):
        ph = e.get("ph")
        if ph == "M" and e.get("name") == "thread_name":
            lanes[e["tid"]] = e["args"]["name"]
        elif ph == "i" and e.get("name") == "iteration":
            marks.append(e["ts"])
        elif ph == "X":
            m = NAME.match(e.get("name", ""))
            kind = m.group(1) if m else e.get("name", "")
            spans.append((e["ts"], e["ts"] + e.get("dur", 0.0), e.get("tid", 0), kind))
    marks.sort()
    spans.sort()
    return lanes, spans, marks


def steps(lanes, spans, marks, last):
    """One dict per step: ms, per (lane, kind) [total ms, count], most slots busy."""
    out = []
    bounds = list(zip(marks, marks[1:]))[-last:] if last > 0 else []
    for t0, t1 in bounds:
        use, events = {}, []
        for s0, s1, tid, kind in spans:
            if s0 < t0 or s0 >= t1:
                continue
            name = lanes.get(tid, str(tid))
            if name.startswith("slot "):
                events += [(s0, 1), (s1, -1)]
                name = "slots"
            acc = use.setdefault((name, kind), [0.0, 0])
            acc[0] += (s1 - s0) / 1e3
            acc[1] += 1
        busy = most = 0
        for _, d in sorted(events):
            busy += d
            most = max(most, busy)
        out.append({"ms": (t1 - t0) / 1e3, "use": use, "slots_max": most})
    return out


def report(path, last, out=sys.stdout):
    lanes, spans, marks = load(path)
    st = steps(lanes, spans, marks, last)
    print(f"{path}: {len(spans)} spans, {len(marks)} iteration marks; the last {len(st)} steps",
          file=out)
    if not st:
        return 1
    print("step ms: " + " ".join(f"{s['ms']:.1f}" for s in st) +
          f"  (median {statistics.median(s['ms'] for s in st):.1f})", file=out)
    print("most slots busy at once: " + " ".join(str(s["slots_max"]) for s in st), file=out)
    keys = sorted({k for s in st for k in s["use"]})
    print(f"{'lane':<20} {'span':<16} {'ms/step':>9} {'count/step':>11}  (median over steps)",
          file=out)
    for lane, kind in keys:
        ms = statistics.median(s["use"].get((lane, kind), [0.0, 0])[0] for s in st)
        n = statistics.median(s["use"].get((lane, kind), [0.0, 0])[1] for s in st)
        print(f"{lane:<20} {kind:<16} {ms:9.1f} {n:11.0f}", file=out)
    return 0


def selftest():
    import io
    import os
    import tempfile
    ev = [{"name": "thread_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "program"}},
          {"name": "thread_name", "ph": "M", "pid": 1, "tid": 6, "args": {"name": "slot 0"}},
          {"name": "thread_name", "ph": "M", "pid": 1, "tid": 7, "args": {"name": "slot 1"}}]
    for step in range(3):
        base = step * 100000.0  # 100 ms steps, in microseconds
        ev.append({"name": "iteration", "ph": "i", "ts": base, "pid": 1, "tid": 0})
        ev.append({"name": "late wait 5", "ph": "X", "ts": base + 10, "dur": 2000.0 * (step + 1),
                   "pid": 1, "tid": 0})
        ev.append({"name": "prefetch 5", "ph": "X", "ts": base + 20, "dur": 5000, "pid": 1,
                   "tid": 6})
        ev.append({"name": "eviction 6", "ph": "X", "ts": base + 30, "dur": 5000, "pid": 1,
                   "tid": 7})
    ev.append({"name": "iteration", "ph": "i", "ts": 300000.0, "pid": 1, "tid": 0})
    fd, path = tempfile.mkstemp(suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump({"traceEvents": ev}, f)
    fails = []
    lanes, spans, marks = load(path)
    st = steps(lanes, spans, marks, 2)
    if [round(s["ms"], 3) for s in st] != [100.0, 100.0]:
        fails.append(f"step ms {[s['ms'] for s in st]}")
    if [s["use"][("program", "late wait")] for s in st] != [[4.0, 1], [6.0, 1]]:
        fails.append(f"late wait {[s['use'].get(('program', 'late wait')) for s in st]}")
    if [s["slots_max"] for s in st] != [2, 2] or ("slots", "prefetch") not in st[0]["use"]:
        fails.append("slots")
    buf = io.StringIO()
    if report(path, 2, buf) != 0 or "late wait" not in buf.getvalue():
        fails.append("report")
    os.unlink(path)
    print(f"trace_summary.py selftest: {'PASS' if not fails else 'FAIL: ' + ', '.join(fails)}")
    return 1 if fails else 0


def main(argv):
    if argv[:1] == ["--selftest"]:
        return selftest()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--last", type=int, default=8)
    a = ap.parse_args(argv)
    return report(a.trace, a.last)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
