#!/usr/bin/env python3
"""Where a step's time went, from a run trace (FLEXTENSOR_TRACE_OUT, core/run_trace.h).

  python3 bench/trace_summary.py TRACE.json [--last N]
        per step (from one "iteration" mark to the next; the last N steps, default 8, and their
        median): the step's host time, and for each lane (program, mover, finishers) the time
        spent in each kind of span and how many there were; the most slots busy at once; the
        bytes prefetched and the time at least one prefetch was in flight on a slot (from its
        begin to its finish), whose ratio is a lower bound on what the link delivered: below the
        run's W, the copies themselves ran slow (stop 31: 50 GB/s against a W of 53.5)
  python3 bench/trace_summary.py TRACE.json --link-gbps W
        also the host-to-device link as the trace implies it: each prefetch's copy (bytes / W,
        W in GB/s, e.g. the run's measured W) starts when it was begun or when the copy before
        it ends, whichever is later; per step the time the link idled, in how many gaps, how much
        of it the mover was held, and what the mover's held spans waited to begin (an eviction
        or a prefetch)
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
            ident = int(m.group(2)) if m else -1
            nbytes = (e.get("args") or {}).get("bytes", 0)
            spans.append((e["ts"], e["ts"] + e.get("dur", 0.0), e.get("tid", 0), kind, ident,
                          nbytes))
    marks.sort()
    spans.sort()
    return lanes, spans, marks


def covered_ms(intervals):
    """Milliseconds covered by the union of INTERVALS (microsecond pairs)."""
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total, end = total + b - a, b
        elif b > end:
            total, end = total + b - end, b
    return total / 1e3


def steps(lanes, spans, marks, last):
    """One dict per step: ms, per (lane, kind) [total ms, count], most slots busy, bytes
    prefetched and ms with a prefetch in flight on a slot."""
    out = []
    bounds = list(zip(marks, marks[1:]))[-last:] if last > 0 else []
    for t0, t1 in bounds:
        use, events, prefetches, pf_bytes = {}, [], [], 0
        for s0, s1, tid, kind, _, nbytes in spans:
            if s0 < t0 or s0 >= t1:
                continue
            name = lanes.get(tid, str(tid))
            if name.startswith("slot "):
                events += [(s0, 1), (s1, -1)]
                name = "slots"
                if kind == "prefetch":
                    prefetches.append((s0, s1))
                    pf_bytes += nbytes
            acc = use.setdefault((name, kind), [0.0, 0])
            acc[0] += (s1 - s0) / 1e3
            acc[1] += 1
        busy = most = 0
        for _, d in sorted(events):
            busy += d
            most = max(most, busy)
        out.append({"ms": (t1 - t0) / 1e3, "use": use, "slots_max": most,
                    "pf_bytes": pf_bytes, "pf_busy_ms": covered_ms(prefetches)})
    return out


def link(lanes, spans, marks, last, gbps):
    """Per step: the link's idle ms and gaps when the prefetches' copies run one after another at
    GBPS, the ms of those gaps in which the mover was held, and the mover's held ms before an
    eviction and before a prefetch."""
    per_us = gbps * 1e3  # bytes per microsecond
    copies = [(s0, b) for s0, _, tid, kind, _, b in spans
              if lanes.get(tid, "").startswith("slot ") and kind == "prefetch"]
    mover = [sp for sp in spans if lanes.get(sp[2]) == "mover"]
    held = [(s0, s1) for s0, s1, _, kind, _, _ in mover if kind == "held for room"]
    idle, end = [], None
    for begun, nbytes in copies:
        if end is not None and begun > end:
            idle.append((end, begun))
        end = max(begun, end if end is not None else begun) + nbytes / per_us
    # What a held span waited to begin: the mover's next "begin ..." span of the same id.
    before = []
    for i, (s0, s1, _, kind, ident, _) in enumerate(mover):
        if kind != "held for room":
            continue
        nxt = next((k for _, _, _, k, j, _ in mover[i + 1:] if j == ident and
                    k.startswith("begin ")), "")
        before.append((s0, s1, "eviction" if nxt == "begin eviction" else "prefetch"))

    def within(iv, a, b):
        return sum(max(0.0, min(y, b) - max(x, a)) for x, y in iv)

    out = []
    for t0, t1 in (list(zip(marks, marks[1:]))[-last:] if last > 0 else []):
        gaps = [(max(a, t0), min(b, t1)) for a, b in idle if b > t0 and a < t1]
        out.append({
            "idle_ms": sum(b - a for a, b in gaps) / 1e3, "gaps": len(gaps),
            "idle_held_ms": sum(within(held, a, b) for a, b in gaps) / 1e3,
            "held_evict_ms": sum(y - x for x, y, k in before if t0 <= x < t1 and
                                 k == "eviction") / 1e3,
            "held_prefetch_ms": sum(y - x for x, y, k in before if t0 <= x < t1 and
                                    k == "prefetch") / 1e3})
    return out


def report(path, last, out=sys.stdout, gbps=None):
    lanes, spans, marks = load(path)
    st = steps(lanes, spans, marks, last)
    print(f"{path}: {len(spans)} spans, {len(marks)} iteration marks; the last {len(st)} steps",
          file=out)
    if not st:
        return 1
    print("step ms: " + " ".join(f"{s['ms']:.1f}" for s in st) +
          f"  (median {statistics.median(s['ms'] for s in st):.1f})", file=out)
    print("most slots busy at once: " + " ".join(str(s["slots_max"]) for s in st), file=out)
    pf_gb = statistics.median(s["pf_bytes"] for s in st) / 1e9
    pf_ms = statistics.median(s["pf_busy_ms"] for s in st)
    if pf_ms > 0:
        print(f"prefetched {pf_gb:.2f} GB a step with a prefetch in flight {pf_ms:.1f} ms of it: "
              f"the link delivered at least {pf_gb / pf_ms * 1e3:.1f} GB/s (medians over steps)",
              file=out)
    keys = sorted({k for s in st for k in s["use"]})
    print(f"{'lane':<20} {'span':<16} {'ms/step':>9} {'count/step':>11}  (median over steps)",
          file=out)
    for lane, kind in keys:
        ms = statistics.median(s["use"].get((lane, kind), [0.0, 0])[0] for s in st)
        n = statistics.median(s["use"].get((lane, kind), [0.0, 0])[1] for s in st)
        print(f"{lane:<20} {kind:<16} {ms:9.1f} {n:11.0f}", file=out)
    if gbps:
        lk = link(lanes, spans, marks, last, gbps)

        def med(k):
            return statistics.median(x[k] for x in lk)
        print(f"link at {gbps} GB/s (copies one after another from when each was begun), median "
              f"per step: idle {med('idle_ms'):.1f} ms in {med('gaps'):.0f} gaps, the mover held "
              f"during {med('idle_held_ms'):.1f} ms of them; mover held before an eviction "
              f"{med('held_evict_ms'):.1f} ms, before a prefetch {med('held_prefetch_ms'):.1f} ms",
              file=out)
    return 0


def selftest():
    import io
    import os
    import tempfile
    ev = [{"name": "thread_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "program"}},
          {"name": "thread_name", "ph": "M", "pid": 1, "tid": 6, "args": {"name": "slot 0"}},
          {"name": "thread_name", "ph": "M", "pid": 1, "tid": 7, "args": {"name": "slot 1"}},
          {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "mover"}}]
    for step in range(3):
        base = step * 100000.0  # 100 ms steps, in microseconds
        ev.append({"name": "iteration", "ph": "i", "ts": base, "pid": 1, "tid": 0})
        ev.append({"name": "late wait 5", "ph": "X", "ts": base + 10, "dur": 2000.0 * (step + 1),
                   "pid": 1, "tid": 0})
        # 55 MB at 55 GB/s: a 1000 us copy, begun 20 us into the step: the link idles 99 ms of
        # each step, in two gaps (its first 20 us, and from the copy's end to the next step's),
        # the mover held for 300 us of it before an eviction.
        ev.append({"name": "prefetch 5", "ph": "X", "ts": base + 20, "dur": 5000, "pid": 1,
                   "tid": 6, "args": {"bytes": 55_000_000}})
        ev.append({"name": "held for room 6", "ph": "X", "ts": base + 99520.0, "dur": 300.0,
                   "pid": 1, "tid": 1})
        ev.append({"name": "begin eviction 6", "ph": "X", "ts": base + 99830.0, "dur": 1.0,
                   "pid": 1, "tid": 1})
        ev.append({"name": "eviction 6", "ph": "X", "ts": base + 30, "dur": 5000, "pid": 1,
                   "tid": 7})
    ev.append({"name": "iteration", "ph": "i", "ts": 300000.0, "pid": 1, "tid": 0})
    ev.append({"name": "prefetch 5", "ph": "X", "ts": 300020.0, "dur": 5000, "pid": 1, "tid": 6,
               "args": {"bytes": 55_000_000}})
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
    if [(s["pf_bytes"], s["pf_busy_ms"]) for s in st] != [(55_000_000, 5.0)] * 2:
        fails.append(f"prefetched {[(s['pf_bytes'], s['pf_busy_ms']) for s in st]}")
    if covered_ms([(0, 1000), (500, 2000), (3000, 3500), (3100, 3200)]) != 2.5:
        fails.append("covered_ms")
    lk = link(lanes, spans, marks, 2, 55.0)
    want = [{"idle_ms": 99.0, "gaps": 2, "idle_held_ms": 0.3, "held_evict_ms": 0.3,
             "held_prefetch_ms": 0.0}] * 2
    if [{k: round(v, 3) for k, v in x.items()} for x in lk] != want:
        fails.append(f"link {lk}")
    buf = io.StringIO()
    if report(path, 2, buf, 55.0) != 0 or "late wait" not in buf.getvalue() or \
            "idle 99.0 ms in 2 gaps" not in buf.getvalue() or \
            "prefetched 0.06 GB a step with a prefetch in flight 5.0 ms of it: the link delivered " \
            "at least 11.0 GB/s" not in buf.getvalue():
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
    ap.add_argument("--link-gbps", type=float, help="replay the copies at this W (GB/s)")
    a = ap.parse_args(argv)
    return report(a.trace, a.last, gbps=a.link_gbps)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
