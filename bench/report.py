#!/usr/bin/env python3
"""Report of the issue-5 benchmark, from the JSON lines that bench/run.sh appends (no torch, no
matplotlib: plain Python 3, so it runs on the GPU machine and here alike).

  python3 bench/report.py build [--out DIR] A.jsonl [B.jsonl ...]
        the table (printed, and DIR/summary.txt), DIR/bench.json and DIR/bench.svg; several files
        (two GPU calls) are merged: for each model, workload, system and budget the latest line
        counts, and each measurement is set against the limit of its own run where that run
        measured C and W (else the latest run that did, said in the notes)
  python3 bench/report.py append --jsonl FILE --result RES --rc N [--shim-log LOG] [--out-log LOG]
                                 [--field KEY=VALUE ...]
        one line for one bench.py run: its result, the shim's log lines ("plan", "residency",
        "launches", "allocations", "profile", warnings) and the exit status; without a result, a
        "failed" line with the tail of the output
  python3 bench/report.py simulate --jsonl FILE --text SIM.txt --budgets PCT:BYTES,... [--field ...]
        one line with the rows of `flexshim-profile simulate` (the prediction beside the run)
  python3 bench/report.py line --jsonl FILE --field KEY=VALUE ...   (meta and skipped lines)
  python3 bench/report.py --selftest      fake data through every part, checked (no GPU needed)

Definitions (also in docs/PERFORMANCE.md):
  C  noshim's median step time, same model and workload (all weights resident, no shim)
  B  bytes that must move per step: max(0, weight bytes - budget bytes); a lower bound, since
     activations and the KV cache need room under the budget too
  W  pinned host-to-device bandwidth, 1 GiB copies timed with CUDA events, the fastest of 5
     (lines written before stop 32 hold the median)
  L  max(C, B / W): no offloading schedule runs a step faster, so a step more than 2% below it
     says this run measured C or W wrong, and its x L targets are not counted (SUSPECT)
"""
import argparse
import json
import math
import os
import re
import sys
import time
from xml.sax.saxutils import escape

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpu"))
import shimlog  # noqa: E402  (tests/gpu/shimlog.py: the shim log's format)

MiB = 1 << 20
GiB = 1 << 30
SYSTEM_ORDER = ["noshim", "flexshim", "flexshim_host_read", "flexshim_redirect", "pipeline",
                "accelerate"]
# flexshim_MODE: flexshim with FLEXTENSOR_OFFLOAD_MODE=MODE, from the same profile
SHIM_SYSTEMS = ("flexshim", "flexshim_host_read", "flexshim_redirect")
# A step this far below its limit L (as a ratio) cannot be: L is a lower bound.
BELOW_LIMIT = 0.98
COLORS = {"noshim": "#444444", "flexshim": "#d62728", "flexshim_host_read": "#ff7f0e",
          "flexshim_redirect": "#9467bd", "pipeline": "#1f77b4",
          "accelerate": "#2ca02c", "L": "#000000"}


# ---- reading ---------------------------------------------------------------------------------
def load(files):
    """All JSON objects of FILES (one per line); lines that do not parse are counted."""
    out, bad = [], 0
    for path in files:
        try:
            with open(path, errors="replace") as f:
                for n, line in enumerate(f, 1):
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        d = json.loads(line)
                    except ValueError:
                        bad += 1
                        continue
                    if isinstance(d, dict):
                        d.setdefault("_src", f"{os.path.basename(path)}:{n}")
                        out.append(d)
        except OSError as e:
            print(f"report: cannot read {path}: {e.strerror}", file=sys.stderr)
    return out, bad


def num(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def pct_key(p):
    p = num(p)
    return None if p is None else (int(p) if p == int(p) else p)


# ---- the shim's log --------------------------------------------------------------------------
SHIM_LINE, RES_RX, ALLOC_RX = shimlog.LINE, shimlog.RES, shimlog.ALLOC
# the device pool's blocks made and given back for another size (driver work on the mover's path)
BLOCKS_RX = re.compile(r"device blocks (\d+) made \(([\d.]+) ms\), (\d+) given back for another "
                       r"size \(([\d.]+) ms\)")
PLAN_COUNTERS = {
    "installed": r"plan: (\d+) installed",
    "followed": r"(\d+) launches followed",
    "departures": r"(\d+) departures",
    "run_reactively": r"(\d+) launches run reactively",
    "prefetches": r"(\d+) prefetches",
    "prefetched_bytes": r"\((\d+) bytes moved in\)",
    "evictions_queued": r"(\d+) evictions queued",
    "late": r"(\d+) late and",
    "unplanned": r"(\d+) unplanned references",
    "late_wait_ms": r"([\d.]+) ms waited for late prefetches",
    "ordered": r"(\d+) references ordered after",
    "early_maps": r"(\d+) prefetches mapped early",
    "failed_moves": r"(\d+) failed moves",
    "give_ups": r"(\d+) give-ups",
    "evictions_passed": r"(\d+) evictions begun ahead of a prefetch",
    "restaged": r"(\d+) prefetches queued by a launch that found none",
}
# The run trace's measures of the program's stream (lines of their own, after the exit line):
# idle in the late waits, and waiting on the device for the copies launches were ordered after.
PLAN_STREAM_WAITS = {
    "stream_idle_ms": r"plan: the launches' streams had run out of work for ([\d.]+) ms",
    "ordered_wait_ms": r"plan: the launches ordered after a prefetch's copy waited ([\d.]+) ms",
}


def parse_shim_log(path, keep=40):
    """The shim's summary lines of the main process of PATH (the one that managed the most
    bytes: children of the program log their own, mostly empty, counters)."""
    per = {}
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        return {"error": f"no shim log: {e.strerror}"}
    for line in lines:
        m = SHIM_LINE.match(line)
        if not m:
            continue
        pid, level, text = m.groups()
        d = per.setdefault(pid, {"lines": 0, "managed": -1, "plan": [], "profile": [],
                                 "warn": [], "nwarn": 0, "nerror": 0})
        d["lines"] += 1
        if level in ("warn", "error"):
            d["n" + level] += 1
            if len(d["warn"]) < 8:
                d["warn"].append(f"{level}: {text}")
        if level in ("debug", "trace"):
            continue
        if text.startswith("plan"):
            if len(d["plan"]) < keep:
                d["plan"].append(text)
        elif text.startswith("profile"):
            if len(d["profile"]) < keep:
                d["profile"].append(text)
        elif text.startswith("residency:"):
            d["residency"] = text
        elif text.startswith("launches:"):
            d["launches"] = text
        elif text.startswith("allocations:"):
            d["allocations"] = text
            a = ALLOC_RX.search(text)
            if a:
                d["managed"] = int(a.group(2))
    if not per:
        return {"error": f"no flexshim lines in {path} ({len(lines)} lines)"}
    pid = max(per, key=lambda p: (per[p]["managed"], per[p]["lines"]))
    d = per[pid]
    out = {"pid": int(pid), "processes": len(per), "plan": d["plan"], "profile": d["profile"],
           "warnings": d["nwarn"], "errors": d["nerror"], "first_warnings": d["warn"]}
    for k in ("residency", "launches", "allocations"):
        if k in d:
            out[k] = d[k]
    r = RES_RX.search(d.get("residency", ""))
    if r:
        g = r.groups()
        out["counters"] = {"budget": g[0], "device_peak": g[1], "pinned_host": g[2],
                           "evictions": int(g[3]), "evicted_bytes": int(g[4]),
                           "fault_ins": int(g[5]), "faulted_bytes": int(g[6]),
                           "placed_on_host": int(g[7]), "host_served": int(g[8]),
                           "forced_syncs": int(g[9]), "failures": int(g[10])}
        b = BLOCKS_RX.search(d["residency"])
        if b:
            out["counters"].update(blocks_made=int(b.group(1)), blocks_given_back=int(b.group(3)),
                                   blocks_ms=round(float(b.group(2)) + float(b.group(4)), 1))
    exit_plan = [t for t in d["plan"] if re.match(r"plan: \d+ installed", t)]
    if exit_plan:
        pc = {}
        for k, rx in PLAN_COUNTERS.items():
            m = re.search(rx, exit_plan[-1])
            if m:
                pc[k] = float(m.group(1)) if "." in m.group(1) else int(m.group(1))
        for k, rx in PLAN_STREAM_WAITS.items():
            for t in d["plan"]:
                m = re.match(rx, t)
                if m:
                    pc[k] = float(m.group(1))
        out["plan_counters"] = pc
    return out


# ---- flexshim-profile simulate ---------------------------------------------------------------
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": MiB, "GiB": GiB, "TiB": 1 << 40}
SIM_ROW = re.compile(r"^(\d+(?:\.\d+)?) (B|KiB|MiB|GiB|TiB)\s+(\S+)\s+(.*)$")


def parse_simulate(text, budgets):
    """Rows of `flexshim-profile simulate` output; BUDGETS [(pct, bytes)] name each row's budget
    by its bytes (within 1%)."""
    out = {"rows": []}
    m = re.search(r"compute C = ([\d.]+) ms", text)
    if m:
        out["C_ms"] = float(m.group(1))
    m = re.search(r"host to device W = ([\d.]+) GB/s", text)
    if m:
        out["W_gb_per_s"] = float(m.group(1))
    section = None  # "table", then "replay" (per timed iteration: late, unplanned, fault-ins)
    for line in text.splitlines():
        if line.startswith("budget "):
            section = "table"
            continue
        if line.startswith("replay, per"):
            section = "replay"
            continue
        m = SIM_ROW.match(line.strip())
        if not m or section is None:
            continue
        val, unit, strategy, rest = m.groups()
        cols = rest.split()
        if section == "replay":
            for row in out["rows"]:
                if row["budget_text"] == f"{val} {unit}" and row["strategy"] == strategy:
                    for name, c in zip(["late_per_iter", "unplanned_per_iter",
                                        "faults_per_iter", "ordered_per_iter",
                                        "hook_ms_per_iter"], cols[0::2]):
                        row[name] = float(c)
                    b = re.search(r"([\d.]+) device blocks made", rest)
                    if b:
                        row["blocks_per_iter"] = float(b.group(1))
            continue
        nbytes = float(val) * UNITS[unit]
        row = {"budget_text": f"{val} {unit}", "budget_bytes": int(nbytes), "strategy": strategy}
        if cols and cols[0] == "infeasible":
            row["infeasible"] = True
        else:
            names = ["predicted_ms", "stall_ms", "offloaded_mib", "peak_mib", "limit_ms",
                     "replay_ms"]
            for name, c in zip(names, cols):
                try:
                    row[name] = float(c)
                except ValueError:
                    row[name] = None
        for pct, b in budgets:
            if b and abs(nbytes - b) <= 0.01 * b:
                row["budget_pct"] = pct
        out["rows"].append(row)
    return out


# ---- the analysis ----------------------------------------------------------------------------
def latest(lines):
    return max(lines, key=lambda d: (str(d.get("time") or ""), d.get("_order", 0)))


def analyse(lines):
    """Everything the table, the JSON and the plot show."""
    for i, d in enumerate(lines):
        d["_order"] = i
    meas = [d for d in lines if d.get("kind") == "measure" and num(d.get("step_ms_median"))]
    bw = [d for d in lines if d.get("kind") == "bandwidth" and num(d.get("W_bytes_per_s"))]
    sims = [d for d in lines if d.get("kind") == "simulate"]
    other = [d for d in lines if d.get("kind") in ("skipped", "failed")
             or (d.get("kind") == "measure" and not num(d.get("step_ms_median")))]
    records = [d for d in lines if d.get("kind") == "record"]
    metas = [d for d in lines if d.get("kind") == "meta"]
    fake = any(d.get("fake") for d in lines)

    def pick_W(run_id):
        same = [d for d in bw if d.get("run_id") == run_id]
        if same:
            return latest(same), True
        return (latest(bw), False) if bw else (None, False)

    # The runs that measured flexshim: their noshim is the one a merge shows (below).
    shim_runs = {(d.get("run_id"), d.get("model"), d.get("workload")) for d in meas
                 if d.get("system") in SHIM_SYSTEMS}

    def preferred(noshims):
        """The latest of NOSHIMS from a run that measured flexshim, else the latest."""
        with_shim = [d for d in noshims
                     if (d.get("run_id"), d.get("model"), d.get("workload")) in shim_runs]
        return latest(with_shim or noshims)

    def pick_C(run_id, model, workload):
        cand = [d for d in meas if d.get("system") == "noshim" and d.get("model") == model
                and d.get("workload") == workload]
        same = [d for d in cand if d.get("run_id") == run_id]
        if same:
            return latest(same), True
        return (preferred(cand), False) if cand else (None, False)

    def cell_of(d):
        return d.get("model"), d.get("workload"), d.get("system"), pct_key(d.get("budget_pct"))

    # The latest measurement of each (model, workload, system, budget); for noshim, the latest of
    # a run that also measured flexshim, whose C the flexshim rows and targets are taken against
    # (merged files: another call's noshim is only that call's reference).
    cells = {}
    for d in meas:
        cells.setdefault(cell_of(d), []).append(d)
    rows = []
    for key, group in cells.items():
        d = preferred(group) if key[2] == "noshim" else latest(group)
        model, workload, system, pct = key
        row = {"model": model, "workload": workload, "system": system, "budget_pct": pct,
               "budget_bytes": d.get("budget_bytes"), "weight_bytes": d.get("weight_bytes"),
               "step_ms": d["step_ms_median"], "timed_steps": d.get("timed_steps"),
               "run_id": d.get("run_id"), "measurements": len(group), "notes": []}
        for k in ("ttfs_s", "build_s", "import_s", "setup_s", "first_step_ms", "prompt_ms",
                  "peak_reserved_bytes", "gpu", "weight_checksum", "fake", "mode", "shim",
                  "pipeline", "accelerate", "fingerprint"):
            if d.get(k) is not None:
                row[k] = d[k]
        lim = limit_for(d, pick_C, pick_W)
        row.update(lim)
        if lim.get("L_ms"):
            row["ratio_to_L"] = round(row["step_ms"] / lim["L_ms"], 3)
        ref, _ = pick_C(d.get("run_id"), model, workload)
        row["identical"], why = same_outputs(d, ref)
        if why:
            row["notes"].append(why)
        if ref is not None and num(ref.get("weight_checksum")) is not None and \
                num(d.get("weight_checksum")) is not None and \
                ref["weight_checksum"] != d["weight_checksum"]:
            row["notes"].append("weight checksum differs from noshim's")
        add_system_notes(row, d)
        rows.append(row)

    # A row whose C is its own run's noshim, not the one shown, says so.
    shown = {(r["model"], r["workload"]): r["run_id"] for r in rows if r["system"] == "noshim"}
    for r in rows:
        if (r["system"] != "noshim" and r.get("C_ms") is not None and not r.get("limit_from")
                and shown.get((r["model"], r["workload"]), r["run_id"]) != r["run_id"]):
            r["notes"].append(f"C {r['C_ms']:g} ms from its own run {r['run_id']}")

    # The limit of each (model, workload, budget) that has a measurement, for the table/plot:
    # noshim's, else flexshim's (the targets' reference), else any row's.
    def rank(r):
        return 2 if r["system"] == "noshim" else 1 if r["system"] in SHIM_SYSTEMS else 0

    limits, limit_rank = {}, {}
    for r in rows:
        k = (r["model"], r["workload"], r["budget_pct"])
        if r.get("L_ms") and rank(r) > limit_rank.get(k, -1):
            limit_rank[k] = rank(r)
            limits[k] = {x: r.get(x) for x in ("model", "workload", "budget_pct", "budget_bytes",
                                               "L_ms", "C_ms", "B_bytes", "BW_ms", "W_gb_per_s",
                                               "G_ms", "G_at", "Lg_ms")}
    # Predictions from simulate, keyed like the flexshim rows.
    for s in sims:
        for sr in s.get("rows", []):
            if sr.get("budget_pct") is None:
                continue
            for r in rows:
                # the replay of the system's own mode (lines before it existed: flexshim)
                if (r["system"] == s.get("system", "flexshim") and r["model"] == s.get("model")
                        and r["workload"] == s.get("workload")
                        and r["budget_pct"] == pct_key(sr["budget_pct"])
                        and sr.get("predicted_ms") is not None):
                    r.setdefault("predicted", []).append(
                        {k: sr.get(k) for k in ("strategy", "predicted_ms", "replay_ms",
                                                "limit_ms", "blocks_per_iter")})
    return {"rows": sort_rows(rows), "limits": sorted(limits.values(), key=limit_sort),
            "targets": targets(rows), "startup": startup(rows),
            # a skip that another merged file measured is no gap; a failure stays listed
            "not_measured": [compact(d) for d in other
                             if d.get("kind") != "skipped" or cell_of(d) not in cells],
            "records": [compact(d) for d in records],
            "bandwidth": [{k: d.get(k) for k in ("run_id", "W_bytes_per_s", "bandwidth", "gpu")}
                          for d in bw],
            "simulate": sims, "meta": metas, "fake": fake}


def limit_for(d, pick_C, pick_W):
    out = {}
    c, c_same = pick_C(d.get("run_id"), d.get("model"), d.get("workload"))
    w, w_same = pick_W(d.get("run_id"))
    wb, bb = num(d.get("weight_bytes")), num(d.get("budget_bytes"))
    if wb is not None and bb is not None:
        out["B_bytes"] = max(0, wb - bb)
    if c is not None:
        out["C_ms"] = c["step_ms_median"]
        if num(c.get("ttfs_s")) is not None:
            out["ref_ttfs_s"] = c["ttfs_s"]  # noshim's time to first step, same run
    if w is not None:
        out["W_gb_per_s"] = round(w["W_bytes_per_s"] / 1e9, 2)
    if c is None or w is None or "B_bytes" not in out:
        return out
    out["BW_ms"] = round(out["B_bytes"] / w["W_bytes_per_s"] * 1000, 3)
    out["L_ms"] = round(max(out["C_ms"], out["BW_ms"]), 3)
    # L': when the program reaches a module q ms into the step (noshim, bench.py StepGaps), the
    # device holds at most the budget, so of the B bytes beyond it at least B - P (P: the weights
    # of the modules before) cross the link after q: no offloader beats q + (B - P)/W. The
    # largest such bound over the step; G is its q and G_at its module. Older lines carry only
    # the idle start (the first module, P = 0).
    pts = c.get("gap_points")
    if not pts and num(c.get("idle_start_ms")) is not None:
        pts = [[c["idle_start_ms"], 0, "first kernel"]]
    best = None
    for q, p_bytes, name in pts or []:
        if num(q) is None or num(p_bytes) is None:
            continue
        bound = q + max(0, out["B_bytes"] - p_bytes) / w["W_bytes_per_s"] * 1000
        if best is None or bound > best[0]:
            best = (bound, q, name)
    if best is not None:
        out["G_ms"], out["G_at"] = round(best[1], 3), best[2]
        out["Lg_ms"] = round(max(out["C_ms"], best[0]), 3)
    src = []
    if not c_same:
        src.append(f"C from run {c.get('run_id')}")
    if not w_same:
        src.append(f"W from run {w.get('run_id')}")
    if src:
        out["limit_from"] = ", ".join(src)
    return out


def same_outputs(d, ref):
    """('ref'|'yes'|'NO'|'-', note) comparing d's fingerprint with noshim's."""
    fp = d.get("fingerprint") or {}
    if d.get("system") == "noshim":
        if fp.get("stable") is False:
            return "ref", f"noshim's own iterations differ ({fp.get('distinct')} fingerprints)"
        return "ref", None
    rf = (ref or {}).get("fingerprint") or {}
    if not fp or not rf:
        return "-", None if fp else "no fingerprint"
    if fp.get("kind") != rf.get("kind"):
        return "-", "fingerprints of different kinds"
    if fp.get("kind") == "tokens":
        a, b = fp.get("tokens") or [], rf.get("tokens") or []
        n = min(len(a), len(b))
        if n == 0:
            return "-", "no tokens"
        if a[:n] != b[:n]:
            first = next(i for i in range(n) if a[i] != b[i])
            return "NO", f"tokens differ from step {first} on"
        return "yes", (f"first {n} tokens compared" if len(a) != len(b) else None)
    if fp.get("value") == rf.get("value"):
        note = None if fp.get("stable", True) else \
            f"its own iterations differ ({fp.get('distinct')} fingerprints)"
        return "yes", note
    return "NO", "logits checksum differs"


def add_system_notes(row, d):
    if d.get("fake"):
        row["notes"].append("FAKE")
    for n in d.get("notes") or []:
        row["notes"].append(n)
    if num(d.get("rc")) not in (None, 0):
        row["notes"].append(f"exit {d['rc']}")
    p = d.get("pipeline")
    if isinstance(p, dict) and p.get("fits"):
        row["notes"].append(f"{p.get('resident')} layers resident, {p.get('streamed')} streamed")
        if p.get("within_budget") is False:
            row["notes"].append("peak reserved over budget")
        if p.get("mispredicts"):
            row["notes"].append(f"{p['mispredicts']} mispredicted prefetches")
    a = d.get("accelerate")
    if isinstance(a, dict) and "layers_on_gpu" in a:
        row["notes"].append(f"{a['layers_on_gpu']} layers on GPU")
    s = d.get("shim")
    if isinstance(s, dict):
        c = s.get("counters") or {}
        pc = s.get("plan_counters") or {}
        bits = []
        if "late" in pc:
            bits.append(f"late {pc['late']}")
        if "late_wait_ms" in pc:
            bits.append(f"waited {pc['late_wait_ms']} ms")
        if pc.get("ordered"):
            bits.append(f"ordered on stream {pc['ordered']}")
        if "ordered_wait_ms" in pc:
            bits.append(f"waited on the device {pc['ordered_wait_ms']} ms")
        if "stream_idle_ms" in pc:
            bits.append(f"stream idle in late waits {pc['stream_idle_ms']} ms")
        if "fault_ins" in c:
            bits.append(f"fault-ins {c['fault_ins']}")
        if c.get("forced_syncs"):
            bits.append(f"syncs {c['forced_syncs']}")
        if c.get("failures"):
            bits.append(f"FAILURES {c['failures']}")
        if "device_peak" in c:
            bits.append(f"device peak {c['device_peak']}")
        if c.get("blocks_made"):
            bits.append(f"blocks made {c['blocks_made']}, given back {c['blocks_given_back']} "
                        f"({c['blocks_ms']} ms)")
        if s.get("warnings"):
            bits.append(f"{s['warnings']} shim warnings")
        if s.get("error"):
            bits.append(s["error"])
        row["notes"].extend(bits)
    if d.get("system") in SHIM_SYSTEMS and d.get("mode") not in (None, "from-profile"):
        row["notes"].append(d["mode"])
    env = d.get("shim_env") if isinstance(d.get("shim_env"), dict) else {}
    for key in ("FLEXTENSOR_OFFLOAD_MODE", "FLEXTENSOR_PLAN_HEADROOM", "FLEXTENSOR_LATE_PREFETCH"):
        if d.get("system") in SHIM_SYSTEMS and env.get(key):
            row["notes"].insert(0, f"{key[len('FLEXTENSOR_'):]}={env[key]}")
    if d.get("system") in SHIM_SYSTEMS and d.get("shim_loaded") is False and not d.get("fake"):
        row["notes"].append("SHIM NOT LOADED")


def compact(d):
    keep = ("kind", "model", "workload", "system", "budget_pct", "name", "reason", "error", "rc",
            "step_ms_median", "timed_steps", "run_id", "tail")
    return {k: d.get(k) for k in keep if d.get(k) is not None}


def sort_rows(rows):
    def key(r):
        s = r["system"]
        return (str(r["model"]), 0 if r["workload"] == "prefill" else 1, str(r["workload"]),
                -(r["budget_pct"] or 0),
                SYSTEM_ORDER.index(s) if s in SYSTEM_ORDER else 99, s)
    return sorted(rows, key=key)


def limit_sort(r):
    return (str(r["model"]), 0 if r["workload"] == "prefill" else 1, -(r["budget_pct"] or 0))


# ---- targets of issue 5 ----------------------------------------------------------------------
def targets(rows):
    by = {(r["model"], r["workload"], r["system"], r["budget_pct"]): r for r in rows}
    out = []

    def add(name, model, workload, budget, value, bound, text, limit_row=None):
        """LIMIT_ROW: the row whose ratio to its limit VALUE is; below BELOW_LIMIT that cannot
        be, so the row's run measured its inputs wrong and the target is not counted."""
        met = None if value is None or bound is None else value <= bound
        suspect = met is not None and limit_row is not None and value < BELOW_LIMIT
        if suspect:
            met = None
            text += (f"; below the limit, which no offloader can be: this run measured its "
                     f"inputs (C, W {limit_row.get('W_gb_per_s')} GB/s, or G) wrong, so it is "
                     f"not counted")
        out.append({"target": name, "model": model, "workload": workload, "budget_pct": budget,
                    "value": value, "bound": bound, "met": met, "suspect": suspect,
                    "text": text})

    for r in sort_rows(rows):
        model, workload, system, pct = r["model"], r["workload"], r["system"], r["budget_pct"]
        if system not in SHIM_SYSTEMS:
            continue
        t = r["step_ms"]
        if pct is not None and pct < 100:
            add(f"{system} <= 1.10 x L", model, workload, pct, r.get("ratio_to_L"), 1.10,
                f"{t:.1f} ms vs L {r.get('L_ms')} ms", limit_row=r)
            if r.get("Lg_ms"):
                add(f"(not a target) {system} <= 1.10 x L' = max(C, G + (B - P)/W)", model,
                    workload, pct, t / r["Lg_ms"], 1.10,
                    f"{t:.1f} ms vs L' {r['Lg_ms']} ms (G {r.get('G_ms')} ms at "
                    f"{r.get('G_at')})", limit_row=r)
            acc = by.get((model, workload, "accelerate", pct))
            add(f"{system} faster than accelerate", model, workload, pct,
                None if not acc else t / acc["step_ms"], 1.0,
                f"{t:.1f} ms vs {acc['step_ms']:.1f} ms" if acc else "no accelerate run")
            pip = by.get((model, workload, "pipeline", pct))
            add(f"{system} at least as fast as the pipeline", model, workload, pct,
                None if not pip else t / pip["step_ms"], 1.0,
                f"{t:.1f} ms vs {pip['step_ms']:.1f} ms" if pip else "no pipeline run")
        # Against noshim of the same run (C), where that run measured it.
        c = r.get("C_ms")
        if pct is not None and pct >= 100 and workload == "decode":
            add(f"{system} at {pct:g}% within 3% of noshim (decode)", model, workload, pct,
                None if not c else t / c, 1.03,
                f"{t:.2f} ms vs {c:.2f} ms" if c else "no noshim run")
        ref_t = r.get("ref_ttfs_s")
        if r.get("ttfs_s") is not None and r.get("mode", "from-profile") == "from-profile":
            add("time to first step <= 1.2 x noshim (from a profile)", model, workload, pct,
                None if not ref_t else r["ttfs_s"] / ref_t, 1.2,
                f"{r['ttfs_s']:.2f} s vs {ref_t:.2f} s" if ref_t else "no noshim time")
    return out


def startup(rows):
    out = []
    for r in rows:
        if r["system"] not in ("noshim",) + SHIM_SYSTEMS or r.get("ttfs_s") is None:
            continue
        ref = r.get("ref_ttfs_s")
        out.append({"model": r["model"], "workload": r["workload"], "system": r["system"],
                    "budget_pct": r["budget_pct"], "import_s": r.get("import_s"),
                    "build_s": r.get("build_s"), "ttfs_s": r["ttfs_s"],
                    "ratio_to_noshim": round(r["ttfs_s"] / ref, 3) if ref else None})
    return out


# ---- text ------------------------------------------------------------------------------------
def fmt(v, spec=".1f", dash="-"):
    return dash if v is None else format(v, spec)


def gib(b):
    return "-" if b is None else f"{b / GiB:.2f}"


def table_text(a):
    out = []
    if a["fake"]:
        out.append("*** FAKE DATA (bench.py --fake): a test of the scripts, not a measurement ***")
    for m in a["meta"][-3:]:
        out.append("run " + ", ".join(f"{k} {m[k]}" for k in (
            "run_id", "date", "model", "gpu", "commit", "command") if m.get(k)))
    for b in a["bandwidth"]:
        bwd = b.get("bandwidth") or {}
        out.append(f"W (run {b.get('run_id')}): host to device "
                   f"{(bwd.get('h2d') or {}).get('gb_per_s')} GB/s, device to host "
                   f"{(bwd.get('d2h') or {}).get('gb_per_s')} GB/s (1 GiB pinned, "
                   f"{'fastest' if 'fastest_s' in (bwd.get('h2d') or {}) else 'median'} of 5)")
    out.append("")
    hdr = ["model", "workload", "budget", "system", "step ms", "x L", "identical", "steps",
           "peak GiB", "notes"]
    body = []
    lim = {(x["model"], x["workload"], x["budget_pct"]): x for x in a["limits"]}
    shown_l = set()
    for r in a["rows"]:
        k = (r["model"], r["workload"], r["budget_pct"])
        budget = f"{fmt(r['budget_pct'], 'g')}% ({gib(r.get('budget_bytes'))} GiB)"
        if k in lim and k not in shown_l:
            x = lim[k]
            shown_l.add(k)
            body.append([r["model"], r["workload"], budget, "L", fmt(x["L_ms"]), "1.00", "", "",
                         "", f"max(C {fmt(x['C_ms'])}, B/W {fmt(x['BW_ms'])}) ms, B "
                         f"{gib(x['B_bytes'])} GiB"])
            if x.get("Lg_ms") is not None and x.get("budget_pct", 100) < 100:
                body.append([r["model"], r["workload"], budget, "L'", fmt(x["Lg_ms"]),
                             fmt(x["Lg_ms"] / x["L_ms"], ".2f"), "", "", "",
                             f"max(C, G {fmt(x['G_ms'])} + (B - P)/W) ms: G = host time "
                             f"before {x.get('G_at')}"])
        body.append([r["model"], r["workload"], budget, r["system"], fmt(r["step_ms"]),
                     fmt(r.get("ratio_to_L"), ".3f"), r["identical"],  # as stored: no second rounding
                     str(r.get("timed_steps", "-")), gib(r.get("peak_reserved_bytes"))
                     if r["system"] not in SHIM_SYSTEMS else "-",
                     "; ".join(r["notes"] + ([r["limit_from"]] if r.get("limit_from") else []))])
        for p in r.get("predicted", []):
            blocks = p.get("blocks_per_iter")
            body.append(["", "", "", "  simulate", fmt(p.get("predicted_ms")),
                         "", "", "", "", f"{p.get('strategy')}: timeline model; replay "
                         f"{fmt(p.get('replay_ms'))} ms, its limit {fmt(p.get('limit_ms'))} ms"
                         + (f"; {blocks:g} device blocks made per iteration"
                            if blocks is not None else "")])
    out += columns(hdr, body)
    if a["not_measured"]:
        out.append("")
        out.append("Not measured:")
        for d in a["not_measured"]:
            out.append(f"  {d.get('kind')}: {d.get('model', '')} {d.get('workload', '')} "
                       f"{d.get('system', '')} {fmt(d.get('budget_pct'), 'g', '')}%: "
                       f"{d.get('reason') or d.get('error') or ''}"
                       f"{' (exit ' + str(d['rc']) + ')' if d.get('rc') not in (None, 0) else ''}")
    if a["startup"]:
        out.append("")
        out.append("Start-up (seconds from process start; first step = first forward, or the "
                   "prompt and the first decode step):")
        out += columns(["model", "workload", "system", "budget", "import", "build",
                        "first step done", "x noshim"],
                       [[s["model"], s["workload"], s["system"], f"{fmt(s['budget_pct'], 'g')}%",
                         fmt(s["import_s"], ".2f"), fmt(s["build_s"], ".2f"),
                         fmt(s["ttfs_s"], ".2f"), fmt(s["ratio_to_noshim"], ".2f")]
                        for s in a["startup"]])
    if a["records"]:
        out.append("")
        out.append("flexshim record runs (discovery, profiling, then the plan in-process):")
        for d in a["records"]:
            out.append(f"  {d.get('model')} {d.get('workload')} at {fmt(d.get('budget_pct'), 'g')}"
                       f"%: median {fmt(d.get('step_ms_median'))} ms over "
                       f"{d.get('timed_steps', '-')} steps")
    out.append("")
    out.append("Targets of issue 5:")
    for t in a["targets"]:
        state = ("SUSPECT" if t.get("suspect") else "no data" if t["met"] is None
                 else "met" if t["met"] else "MISSED")
        val = "" if t["value"] is None else f" ({t['value']:.3f} vs {t['bound']})"
        out.append(f"  {state:7s} {t['target']}: {t['model']} {t['workload']} "
                   f"{fmt(t['budget_pct'], 'g')}%{val}: {t['text']}")
    out.append("")
    out.append("B = max(0, weight bytes - budget bytes) per step (a lower bound: activations need "
               "room too); W = pinned host-to-device bandwidth of this run; L = max(C, B/W). "
               "L' = max(C, G + (B - P)/W), the largest over the step's modules: G = noshim's "
               "host time from a step's start (after a synchronize) to the module, P = the "
               "weight bytes used before it. At G the device holds at most the budget, so at "
               "least B - P bytes cross the link after G: no offloader can beat L'.")
    return "\n".join(out) + "\n"


def columns(hdr, body):
    w = [max(len(str(x)) for x in col) for col in zip(hdr, *body)] if body \
        else [len(h) for h in hdr]
    w[-1] = 0  # the notes column is not padded
    line = lambda cells: "  ".join(str(c).ljust(n) for c, n in zip(cells, w)).rstrip()  # noqa
    return [line(hdr), line(["-" * max(n, 3) for n in w])] + [line(r) for r in body]


# ---- SVG -------------------------------------------------------------------------------------
def nice_ticks(lo, hi):
    """1-2-5 ticks between LO and HI (log scale)."""
    ticks = []
    e = math.floor(math.log10(lo))
    while 10 ** e <= hi * 10:
        for m in (1, 2, 5):
            v = m * 10 ** e
            if lo <= v <= hi:
                ticks.append(v)
        e += 1
    return ticks or [lo, hi]


def svg(a, title):
    """Step time (log scale) against the budget, one panel per model and workload."""
    panels = []
    for r in a["rows"]:
        k = (r["model"], r["workload"])
        if k not in panels:
            panels.append(k)
    pw, ph, ml, mr, mt, mb = 500, 330, 70, 20, 50, 60
    width = max(1, len(panels)) * pw + 20
    height = ph + 60
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="10" y="20" font-size="14" font-weight="bold">{escape(title)}</text>']
    if not panels:
        parts.append('<text x="10" y="60">no measurements</text>')
    for i, (model, workload) in enumerate(panels):
        x0 = 10 + i * pw
        rows = [r for r in a["rows"] if (r["model"], r["workload"]) == (model, workload)]
        lims = [x for x in a["limits"] if (x["model"], x["workload"]) == (model, workload)]
        series = {}
        for r in rows:
            series.setdefault(r["system"], []).append((r["budget_pct"], r["step_ms"]))
        if lims:
            series["L"] = [(x["budget_pct"], x["L_ms"]) for x in lims]
        vals = [v for s in series.values() for _, v in s if v and v > 0]
        pcts = [p for s in series.values() for p, _ in s if p is not None]
        if not vals or not pcts:
            continue
        lo, hi = min(vals) / 1.3, max(vals) * 1.3
        xmax = max(100, max(pcts))
        ax_l, ax_r, ax_t, ax_b = x0 + ml, x0 + pw - mr, mt, mt + ph - mb

        def X(p):
            return ax_l + (ax_r - ax_l) * p / xmax

        def Y(v):
            return ax_b - (ax_b - ax_t) * (math.log10(v) - math.log10(lo)) / \
                (math.log10(hi) - math.log10(lo))

        parts.append(f'<text x="{(ax_l + ax_r) / 2}" y="{ax_t - 12}" text-anchor="middle" '
                     f'font-weight="bold">{escape(f"{model} {workload}")}</text>')
        parts.append(f'<rect x="{ax_l}" y="{ax_t}" width="{ax_r - ax_l}" height="{ax_b - ax_t}" '
                     f'fill="none" stroke="#888"/>')
        for t in nice_ticks(lo, hi):
            y = Y(t)
            parts.append(f'<line x1="{ax_l}" y1="{y:.1f}" x2="{ax_r}" y2="{y:.1f}" '
                         f'stroke="#eee"/>')
            parts.append(f'<text x="{ax_l - 5}" y="{y + 4:.1f}" text-anchor="end">{t:g}</text>')
        for p in sorted(set(pcts)):
            x = X(p)
            parts.append(f'<line x1="{x:.1f}" y1="{ax_b}" x2="{x:.1f}" y2="{ax_b + 4}" '
                         f'stroke="#888"/>')
            parts.append(f'<text x="{x:.1f}" y="{ax_b + 17}" text-anchor="middle">{p:g}%</text>')
        parts.append(f'<text x="{(ax_l + ax_r) / 2}" y="{ax_b + 34}" text-anchor="middle">'
                     f'budget (percent of the weight bytes)</text>')
        parts.append(f'<text x="{x0 + 16}" y="{(ax_t + ax_b) / 2}" text-anchor="middle" '
                     f'transform="rotate(-90 {x0 + 16} {(ax_t + ax_b) / 2})">step time (ms, log)'
                     f'</text>')
        names = [s for s in SYSTEM_ORDER if s in series] + \
            [s for s in series if s not in SYSTEM_ORDER and s != "L"] + \
            (["L"] if "L" in series else [])
        lx = x0 + 12  # legend, left to right under the axis
        for name in names:
            pts = sorted((p, v) for p, v in series[name] if p is not None and v and v > 0)
            color = COLORS.get(name, "#9467bd")
            dash = ' stroke-dasharray="6 4"' if name == "L" else ""
            if len(pts) > 1:
                d = " ".join(f"{X(p):.1f},{Y(v):.1f}" for p, v in pts)
                parts.append(f'<polyline points="{d}" fill="none" stroke="{color}" '
                             f'stroke-width="2"{dash}/>')
            for p, v in pts:
                tip = f'<title>{escape(f"{name} {p:g}%: {v:.1f} ms")}</title>'
                if name == "noshim":  # one point (C, at 100%): a hollow square, seen over L's dot
                    parts.append(f'<rect x="{X(p) - 6:.1f}" y="{Y(v) - 6:.1f}" width="12" '
                                 f'height="12" fill="none" stroke="{color}" stroke-width="2">'
                                 f'{tip}</rect>')
                else:
                    parts.append(f'<circle cx="{X(p):.1f}" cy="{Y(v):.1f}" r="3.5" '
                                 f'fill="{color}">{tip}</circle>')
            label = "limit L" if name == "L" else ("noshim (C)" if name == "noshim" else name)
            ly = ax_b + 50
            parts.append(f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 16}" y2="{ly - 4}" '
                         f'stroke="{color}" stroke-width="2"{dash}/>')
            parts.append(f'<text x="{lx + 20}" y="{ly}">{escape(label)}</text>')
            lx += 20 + 7 * len(label) + 10
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


# ---- commands --------------------------------------------------------------------------------
def cmd_build(args):
    lines, bad = load(args.files)
    out = args.out or os.path.dirname(os.path.abspath(args.files[0]))
    os.makedirs(out, exist_ok=True)
    a = analyse(lines)
    title_bits = [m.get("gpu") for m in a["meta"] if m.get("gpu")] or \
        [r.get("gpu") for r in a["rows"] if r.get("gpu")]
    title = "flexshim issue-5 benchmark" + (f" on {title_bits[-1]}" if title_bits else "") + \
        (" (FAKE DATA)" if a["fake"] else "")
    text = table_text(a)
    if bad:
        text += f"({bad} line(s) of the JSON files did not parse)\n"
    with open(os.path.join(out, "summary.txt"), "w") as f:
        f.write(text)
    doc = {"generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "files": [os.path.abspath(p) for p in args.files], "unparsed_lines": bad,
           "definitions": {"C": "noshim median step time, same model and workload",
                           "B": "max(0, weight_bytes - budget_bytes) per step (lower bound)",
                           "W": "pinned host-to-device bytes/s, 1 GiB copy, fastest of 5 "
                                "(median in lines before stop 32)",
                           "L": "max(C, B / W)"}}
    doc.update(a)
    with open(os.path.join(out, "bench.json"), "w") as f:
        json.dump(doc, f, indent=1, default=str)
        f.write("\n")
    with open(os.path.join(out, "bench.svg"), "w") as f:
        f.write(svg(a, title))
    sys.stdout.write(text)
    return 0


# Fields kept as text even when they read as numbers (commit 313e205 is a float to Python).
TEXT_FIELDS = ("commit", "run_id", "name", "host", "gpu", "driver", "command", "model",
               "workloads", "budgets", "systems")


def parse_fields(fields):
    out = {}
    for kv in fields or []:
        k, _, v = kv.partition("=")
        if not k:
            continue
        if k in TEXT_FIELDS:
            out[k] = v
            continue
        for conv in (int, float):
            try:
                out[k] = conv(v)
                break
            except ValueError:
                pass
        else:
            out[k] = v
    return out


def append_line(path, obj):
    """One line, one write: a run cut short never leaves half a line."""
    data = (json.dumps(obj, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def tail(path, n=15):
    try:
        with open(path, errors="replace") as f:
            return [line.rstrip("\n")[:300] for line in f.read().splitlines()[-n:]]
    except OSError:
        return []


def cmd_append(args):
    fields = parse_fields(args.field)
    res = None
    if args.result and os.path.exists(args.result):
        try:
            with open(args.result) as f:
                res = json.load(f)
        except ValueError:
            res = None
    if res is None:
        res = dict(fields)
        res["kind"] = "failed"
        why = "timed out" if args.rc in (124, 137) else f"exit {args.rc}"
        res["reason"] = f"{why}, no result written"
        res["tail"] = tail(args.out_log) if args.out_log else []
    else:
        for k, v in fields.items():
            res.setdefault(k, v)
        if args.rc not in (0, None):
            res.setdefault("notes", []).append(f"process exit {args.rc}")
    res["rc"] = args.rc
    if args.shim_log:
        res["shim"] = parse_shim_log(args.shim_log)
    append_line(args.jsonl, res)
    return 0


def cmd_simulate(args):
    budgets = []
    for tok in (args.budgets or "").split(","):
        if ":" in tok:
            p, b = tok.split(":", 1)
            budgets.append((pct_key(float(p)), int(b)))
    try:
        with open(args.text, errors="replace") as f:
            text = f.read()
    except OSError as e:
        text = ""
        print(f"report: {e}", file=sys.stderr)
    d = parse_fields(args.field)
    d["kind"] = "simulate"
    d.update(parse_simulate(text, budgets))
    d["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    append_line(args.jsonl, d)
    return 0


def cmd_line(args):
    d = parse_fields(args.field)
    d.setdefault("time", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    append_line(args.jsonl, d)
    return 0


# ---- self-test -------------------------------------------------------------------------------
SIM_SAMPLE = """simulate prof.json: timeline model of the planned iteration, not a GPU run
  7 launches, compute C = 7.855 ms; managed 210.0 MiB (percentages are of this); host to device W = 25.0 GB/s
  smallest feasible budget: 80 MiB (the allocations in use across launch 1)

budget                 strategy             predicted ms   stall ms  offloaded MiB   peak MiB   limit ms  replay ms
6906 MiB               adaptive(knapsack)         18.495     10.640          210.0      128.0      8.808     16.825
3453 MiB               adaptive(greedy)           21.663     13.808          176.0       98.0      7.855          -
1.50 GiB               knapsack               infeasible          -              -          -          -          -

replay, per timed iteration (warm-up left out): launches that waited for a late prefetch, references to allocations the plan had on host, fault-ins
6906 MiB               adaptive(knapsack)       19.2 late      0.0 unplanned      0.5 fault-ins     92.0 ordered   12.500 ms in the hook     88.5 device blocks made
"""

SHIM_SAMPLE = """[flexshim 99] info: allocations: 0 managed (0 bytes), 0 passed through (0 bytes); 0 frees
[flexshim 42] info: profile /w/prof.json: 2210 launches per iteration, 40 allocations; plan adaptive at 6906 MiB
[flexshim 42] info: plan: running it from the next launch
[flexshim 42] warn: something odd
[flexshim 42] debug: plan: noise
[flexshim 42] info: allocations: 300 managed (14483464192 bytes), 20 passed through (1000 bytes); 5 frees
[flexshim 42] info: residency: budget 3.37 GiB, device peak 3.36 GiB, pinned host 10.1 GiB; 100 evictions (2000 bytes), 7 fault-ins (70 bytes), 0 placed on host, 0 host-served references, 0 forced synchronizes, 0 internal failures; device blocks 300 made (240.5 ms), 290 given back for another size (30.1 ms); background pinner started (3 blocks)
[flexshim 42] info: launches: 5000 seen, 4000 referencing managed memory, 0 unknown (parameters unreadable), 30 layout queries
[flexshim 42] info: plan: 1 installed; 4000 launches followed (3 of the plan's skipped, 4 extra), 1 departures, 10 launches run reactively, found 2 times; 500 prefetches (123456 bytes moved in) and 480 evictions queued; 12 late and 3 unplanned references; 34.5 ms waited for late prefetches; 88 references ordered after a prefetch's copy on their stream (90 prefetches mapped early); 0 evictions skipped (in use), 0 failed moves, 0 dropped, 0 give-ups
[flexshim 42] info: plan: the launches' streams had run out of work for 1.5 ms of those waits (12 waits measured, 0 not; measured only with the run trace on)
[flexshim 42] info: plan: the launches ordered after a prefetch's copy waited 41.0 ms for it on the device (80 launches measured, 2 not; measured only with the run trace on)
"""


def selftest():
    import tempfile

    from selfcheck import Checks

    check = Checks("report.py")

    f = parse_fields(["commit=313e205", "run_id=20261203", "total_budget_s=520", "fake=0"])
    check("fields: a commit stays text, numbers are numbers",
          f == {"commit": "313e205", "run_id": "20261203", "total_budget_s": 520, "fake": 0}, f)
    s = parse_simulate(SIM_SAMPLE, [(50, 6906 * MiB), (25, 3453 * MiB)])
    check("simulate C", s.get("C_ms") == 7.855, s)
    check("simulate rows", len(s["rows"]) == 3, s)
    check("simulate replay counters", s["rows"][0].get("late_per_iter") == 19.2 and
          s["rows"][0].get("faults_per_iter") == 0.5 and s["rows"][0].get("ordered_per_iter") == 92
          and s["rows"][0].get("hook_ms_per_iter") == 12.5 and "late_per_iter" not in s["rows"][1]
          and s["rows"][0].get("blocks_per_iter") == 88.5,
          s)
    check("simulate row 1", s["rows"][0]["budget_pct"] == 50 and s["rows"][0]["replay_ms"] == 16.825
          and s["rows"][0]["strategy"] == "adaptive(knapsack)", s["rows"][0])
    check("simulate row 2 no replay", s["rows"][1]["replay_ms"] is None
          and s["rows"][1]["budget_pct"] == 25, s["rows"][1])
    check("simulate infeasible", s["rows"][2].get("infeasible") and
          s["rows"][2]["budget_bytes"] == int(1.5 * GiB), s["rows"][2])

    with tempfile.TemporaryDirectory() as d:
        log = os.path.join(d, "shim.log")
        with open(log, "w") as f:
            f.write(SHIM_SAMPLE)
        sh = parse_shim_log(log)
        check("shim: main pid", sh.get("pid") == 42 and sh.get("processes") == 2, sh)
        check("shim: residency", sh.get("counters", {}).get("evictions") == 100
              and sh["counters"]["device_peak"] == "3.36 GiB", sh)
        check("shim: device blocks", sh["counters"].get("blocks_made") == 300
              and sh["counters"]["blocks_given_back"] == 290
              and sh["counters"]["blocks_ms"] == 270.6, sh["counters"])
        check("shim: plan counters", sh.get("plan_counters", {}).get("late") == 12
              and sh["plan_counters"]["prefetches"] == 500
              and sh["plan_counters"]["prefetched_bytes"] == 123456
              and sh["plan_counters"]["late_wait_ms"] == 34.5
              and sh["plan_counters"]["ordered"] == 88
              and sh["plan_counters"]["early_maps"] == 90
              and sh["plan_counters"]["stream_idle_ms"] == 1.5
              and sh["plan_counters"]["ordered_wait_ms"] == 41.0, sh.get("plan_counters"))
        check("shim: plan lines (no debug)", len(sh["plan"]) == 4, sh["plan"])
        check("shim: warnings", sh["warnings"] == 1, sh)
        check("shim: missing file", "error" in parse_shim_log(log + "x"))

        # Two runs, two files: run A measured W, noshim, flexshim and pipeline; run B (a second
        # GPU call) noshim and accelerate, with a slightly different W.
        wb, mib = 14483464192, MiB
        def bud(p):
            return int(p * wb // 100) // mib * mib
        fa, fb = os.path.join(d, "a.jsonl"), os.path.join(d, "b.jsonl")
        toks = list(range(33))

        def m(run, system, workload, pct, ms, **kw):
            d = {"kind": "measure", "run_id": run, "model": "7b", "workload": workload,
                 "system": system, "budget_pct": pct, "budget_bytes": bud(pct),
                 "weight_bytes": wb, "step_ms_median": ms, "timed_steps": 8,
                 "time": f"2026-12-0{1 if run == 'A' else 2}T00:00:{int(ms) % 60:02d}Z",
                 "gpu": "NVIDIA H200", "weight_checksum": 1.5}
            if workload == "prefill":
                d["fingerprint"] = {"kind": "logits-rowsum-sha256", "value": "abc",
                                    "stable": True}
            else:
                d["fingerprint"] = {"kind": "tokens", "tokens": toks}
            d.update(kw)
            return d
        a_lines = [
            {"kind": "meta", "run_id": "A", "date": "2026-12-01", "model": "7b",
             "gpu": "NVIDIA H200", "command": "OUT=x bash bench/run.sh"},
            {"kind": "bandwidth", "run_id": "A", "W_bytes_per_s": 50e9,
             "bandwidth": {"h2d": {"gb_per_s": 50.0}, "d2h": {"gb_per_s": 51.0}}},
            m("A", "noshim", "prefill", 100, 200.0, ttfs_s=10.0, build_s=4.0,
              gap_points=[[1.0, 0, "model.embed_tokens"], [50.0, wb // 10, "o_proj"],
                          [190.0, wb - 1, "lm_head"]]),
            m("A", "noshim", "decode", 100, 20.0, ttfs_s=9.0, idle_start_ms=6.0),
            m("A", "flexshim", "prefill", 50, 210.0, ttfs_s=11.0),
            m("A", "flexshim", "prefill", 25, 300.0,
              fingerprint={"kind": "logits-rowsum-sha256", "value": "zzz", "stable": True}),
            m("A", "flexshim", "decode", 100, 20.5, ttfs_s=11.5),
            # Below B/W (144.8 ms): impossible, so run A's W must have been measured low.
            m("A", "flexshim", "decode", 50, 120.0),
            m("A", "flexshim", "decode", 25, 250.0, fingerprint={"kind": "tokens",
                                                                 "tokens": toks[:5] + [9] * 28}),
            m("A", "pipeline", "decode", 25, 240.0),
            m("A", "flexshim_host_read", "decode", 25, 230.0,
              shim_env={"FLEXTENSOR_OFFLOAD_MODE": "host_read"}),
            {"kind": "skipped", "run_id": "A", "model": "7b", "workload": "prefill",
             "system": "pipeline", "budget_pct": 25, "reason": "does not fit"},
            {"kind": "simulate", "model": "7b", "workload": "prefill", "run_id": "A",
             **parse_simulate(SIM_SAMPLE, [(50, 6906 * MiB), (25, 3453 * MiB)])},
            {"kind": "simulate", "model": "7b", "workload": "decode", "run_id": "A",
             "system": "flexshim_host_read",
             **parse_simulate(SIM_SAMPLE, [(50, 6906 * MiB), (25, 3453 * MiB)])},
        ]
        b_lines = [
            {"kind": "bandwidth", "run_id": "B", "W_bytes_per_s": 40e9},
            m("B", "noshim", "decode", 100, 22.0),
            m("B", "pipeline", "prefill", 25, 260.0),  # run A skipped it
            m("B", "accelerate", "decode", 25, 900.0, fingerprint={"kind": "tokens",
                                                                   "tokens": toks[:13]}),
            {"kind": "failed", "run_id": "B", "model": "7b", "workload": "prefill",
             "system": "accelerate", "budget_pct": 25, "rc": 124, "reason": "timed out"},
            # a later failure of a cell run A measured: still listed
            {"kind": "failed", "run_id": "B", "model": "7b", "workload": "prefill",
             "system": "flexshim", "budget_pct": 50, "rc": 1, "reason": "CUDA error"},
        ]
        for path, ls in ((fa, a_lines), (fb, b_lines)):
            for x in ls:
                append_line(path, x)
        with open(fa, "a") as f:
            f.write("{broken\n")
        out = os.path.join(d, "out")
        ns = argparse.Namespace(files=[fa, fb], out=out)
        import io
        import contextlib

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            cmd_build(ns)
        text = buf.getvalue()
        doc = json.load(open(os.path.join(out, "bench.json")))
        rows = {(r["workload"], r["system"], r["budget_pct"]): r for r in doc["rows"]}
        # prefill 50%: B = wb - bud(50); W = 50 GB/s; C = 200
        b50 = wb - bud(50)
        r = rows[("prefill", "flexshim", 50)]
        check("L prefill 50% = max(C, B/W)", abs(r["L_ms"] - max(200.0, b50 / 50e9 * 1000)) < 1e-3,
              r)
        check("ratio to L", abs(r["ratio_to_L"] - round(210.0 / r["L_ms"], 3)) < 1e-9, r)
        r = rows[("prefill", "flexshim", 25)]
        b25 = wb - bud(25)
        check("L prefill 25% is B/W", abs(r["L_ms"] - b25 / 50e9 * 1000) < 1e-3, r)
        check("L' prefill 25%: the largest bound of the step's modules",
              r.get("G_at") == "o_proj" and r.get("G_ms") == 50.0 and
              abs(r["Lg_ms"] - (50.0 + (b25 - wb // 10) / 50e9 * 1000)) < 1e-3, r)
        check("L' row names the module", "G 50.0 + (B - P)/W) ms: G = host time before o_proj"
              in text, text)
        r = rows[("decode", "accelerate", 25)]
        check("no L' without noshim's G", "Lg_ms" not in r and r.get("L_ms"), r)
        r = rows[("decode", "flexshim", 25)]
        check("L' decode 25% = max(C, G + B/W)", r.get("G_ms") == 6.0 and
              abs(r["Lg_ms"] - max(20.0, 6.0 + b25 / 50e9 * 1000)) < 1e-3, r)
        check("L' row in the table", "L'" in text and "G 6.0" in text, text)
        check("prefill 25% not identical", r["identical"] == "NO", r)
        check("prefill 50% identical", rows[("prefill", "flexshim", 50)]["identical"] == "yes")
        hr = rows.get(("decode", "flexshim_host_read", 25), {})
        check("a host_read replay goes beside the host_read row only",
              hr.get("predicted") and not rows[("decode", "flexshim", 25)].get("predicted"), hr)
        check("host_read row: identical, noted, its own targets",
              hr.get("identical") == "yes" and "OFFLOAD_MODE=host_read" in hr.get("notes", [])
              and "flexshim_host_read at least as fast as the pipeline" in text, hr)
        check("decode 25% tokens differ", rows[("decode", "flexshim", 25)]["identical"] == "NO")
        check("pipeline identical", rows[("decode", "pipeline", 25)]["identical"] == "yes")
        acc = rows[("decode", "accelerate", 25)]
        check("accelerate: own run's C and W", abs(acc["L_ms"] - max(22.0, b25 / 40e9 * 1000))
              < 1e-3 and "limit_from" not in acc, acc)
        check("accelerate: prefix compared", acc["identical"] == "yes"
              and any("first 13" in n for n in acc["notes"]), acc)
        check("noshim decode: the run that measured flexshim, not the latest",
              rows[("decode", "noshim", 100)]["step_ms"] == 20.0, rows[("decode", "noshim", 100)])
        check("flexshim decode uses its own run's C", rows[("decode", "flexshim", 100)]["C_ms"]
              == 20.0)
        t = {(x["target"], x["workload"], x["budget_pct"]): x for x in doc["targets"]}
        check("target 1.10 L met", t[("flexshim <= 1.10 x L", "prefill", 50)]["met"] is True)
        check("target vs accelerate", t[("flexshim faster than accelerate", "decode", 25)]["met"]
              is True)
        check("target vs pipeline missed", t[("flexshim at least as fast as the pipeline",
                                               "decode", 25)]["met"] is False)
        k = ("flexshim <= 1.10 x L", "decode", 50)
        check("a step below L is not counted as met", t[k]["met"] is None and t[k]["suspect"]
              and "  SUSPECT flexshim <= 1.10 x L: 7b decode 50% (0.829 vs 1.1)" in text
              and "W 50.0 GB/s, or G) wrong" in t[k]["text"], t[k])
        check("a step above L is not suspect", not t[("flexshim <= 1.10 x L", "prefill", 50)]
              ["suspect"])
        k = ("flexshim at 100% within 3% of noshim (decode)", "decode", 100)
        check("target 100% decode (vs its own run's noshim: 20.5/20)", t[k]["met"] is True
              and abs(t[k]["value"] - 1.025) < 1e-9, t[k])
        k = ("time to first step <= 1.2 x noshim (from a profile)", "prefill", 50)
        check("target ttfs", t[k]["met"] is True and abs(t[k]["value"] - 1.1) < 1e-9, t[k])
        check("simulate beside flexshim", rows[("prefill", "flexshim", 50)].get("predicted", [{}])
              [0].get("replay_ms") == 16.825)
        check("failures listed, even of a measured cell; a skip the other file measured not",
              [(x["system"], x["kind"]) for x in doc["not_measured"]]
              == [("accelerate", "failed"), ("flexshim", "failed")]
              and rows[("prefill", "pipeline", 25)]["step_ms"] == 260.0, doc["not_measured"])
        check("a row against its own run's C, not the shown noshim's, says so",
              "C 22 ms from its own run B" in rows[("decode", "accelerate", 25)]["notes"]
              and not any("from its own run" in n for n in rows[("decode", "flexshim", 25)]
                          ["notes"]), rows[("decode", "accelerate", 25)]["notes"])
        limit25 = {(x["workload"], x["budget_pct"]): x for x in doc["limits"]}[("decode", 25)]
        with contextlib.redirect_stdout(io.StringIO()):
            cmd_build(argparse.Namespace(files=[fb, fa], out=out + "-ba"))
        doc_ba = json.load(open(os.path.join(out + "-ba", "bench.json")))
        limit25_ba = {(x["workload"], x["budget_pct"]): x for x in doc_ba["limits"]}[("decode", 25)]
        check("the L row below 100% is flexshim's run's, in either file order",
              limit25["C_ms"] == 20.0 and limit25_ba == limit25, (limit25, limit25_ba))
        check("unparsed counted", doc["unparsed_lines"] == 1)
        check("table has L rows", "  L  " in text and "MISSED" in text, text)
        check("summary.txt written", open(os.path.join(out, "summary.txt")).read() == text)
        import xml.etree.ElementTree as ET

        root = ET.parse(os.path.join(out, "bench.svg")).getroot()
        polylines = root.findall("{http://www.w3.org/2000/svg}polyline")
        check("svg parses, has lines", len(polylines) >= 3, len(polylines))
        check("svg has two panels", open(os.path.join(out, "bench.svg")).read().count(
            "budget (percent") == 2)
        # append: a result plus the shim log; a run with no result
        res = os.path.join(d, "res.json")
        with open(res, "w") as f:
            json.dump(m("A", "flexshim", "decode", 50, 100.0), f)
        jl = os.path.join(d, "c.jsonl")
        cmd_append(argparse.Namespace(jsonl=jl, result=res, rc=0, shim_log=log, out_log=None,
                                      field=["mode=from-profile"]))
        outlog = os.path.join(d, "out.log")
        with open(outlog, "w") as f:
            f.write("line1\nTraceback...\nCUDA out of memory\n")
        cmd_append(argparse.Namespace(jsonl=jl, result=res + "none", rc=124, shim_log=None,
                                      out_log=outlog, field=["system=accelerate", "budget_pct=25",
                                                             "model=7b", "workload=decode"]))
        got = [json.loads(x) for x in open(jl)]
        check("append: measurement with shim", got[0]["kind"] == "measure"
              and got[0]["shim"]["counters"]["evictions"] == 100 and got[0]["mode"] ==
              "from-profile", got[0])
        check("append: failed line", got[1]["kind"] == "failed" and got[1]["budget_pct"] == 25
              and "timed out" in got[1]["reason"] and got[1]["tail"][-1] == "CUDA out of memory",
              got[1])
        check("nice ticks", nice_ticks(15, 900) == [20, 50, 100, 200, 500])
        # empty input still writes the three files
        empty = os.path.join(d, "empty.jsonl")
        open(empty, "w").close()
        with contextlib.redirect_stdout(io.StringIO()):
            cmd_build(argparse.Namespace(files=[empty], out=os.path.join(d, "o2")))
        check("empty input", all(os.path.exists(os.path.join(d, "o2", f))
                                 for f in ("bench.json", "bench.svg", "summary.txt")))
    return check.done()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--selftest"]:
        return selftest()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", help="folder for summary.txt, bench.json, bench.svg")
    b.add_argument("files", nargs="+")
    p = sub.add_parser("append")
    p.add_argument("--jsonl", required=True)
    p.add_argument("--result")
    p.add_argument("--rc", type=int, default=None)
    p.add_argument("--shim-log")
    p.add_argument("--out-log")
    p.add_argument("--field", action="append")
    s = sub.add_parser("simulate")
    s.add_argument("--jsonl", required=True)
    s.add_argument("--text", required=True)
    s.add_argument("--budgets", default="")
    s.add_argument("--field", action="append")
    ln = sub.add_parser("line")
    ln.add_argument("--jsonl", required=True)
    ln.add_argument("--field", action="append")
    args = ap.parse_args(argv)
    return {"build": cmd_build, "append": cmd_append, "simulate": cmd_simulate,
            "line": cmd_line}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
