"""Reading flexshim's log: the one place that knows the format of its exit summary.

The shim writes, at LOG_LEVEL=info, one line each at exit (core/engine.c):
  [flexshim PID] info: allocations: N managed (B bytes), N passed through (B bytes); N frees;
      N pointer queries, N memory-info queries
  [flexshim PID] info: residency: budget ..., device peak ..., pinned host ...; N evictions ...
  [flexshim PID] info: launches: N seen, N referencing managed memory, N unknown ...
Used by tests/gpu/run.sh (its helpers), tests/gpu/dist_test.py and bench/report.py.
"""
import re

LINE = re.compile(r"^\[flexshim (\d+)\] (\w+): (.*)$")
ALLOC = re.compile(r"allocations: (\d+) managed \((\d+) bytes\), (\d+) passed through "
                   r"\((\d+) bytes\); (\d+) frees")
RES = re.compile(r"residency: budget (.+?), device peak (.+?), pinned host (.+?); (\d+) evictions "
                 r"\((\d+) bytes\), (\d+) fault-ins \((\d+) bytes\), (\d+) placed on host, "
                 r"(\d+) host-served references, (\d+) forced synchronizes, "
                 r"(\d+) internal failures")
LAUNCH = re.compile(r"launches: (\d+) seen, (\d+) referencing managed memory, (\d+) unknown "
                    r"\(parameters unreadable\), (\d+) layout queries")

ALLOC_KEYS = ("managed", "managed_bytes", "passthrough", "passthrough_bytes", "frees")
RES_KEYS = ("evictions", "evicted_bytes", "faults", "faulted_bytes", "placed_on_host",
            "host_served", "syncs", "failures")
LAUNCH_KEYS = ("launches", "with_refs", "unknown", "layout_queries")


def loaded():
    """Is libflexshim mapped into this process? None when it cannot be told."""
    try:
        with open("/proc/self/maps") as f:
            return "libflexshim" in f.read()
    except OSError:
        return None


def parse(path, want_pid=None):
    """The exit counters of a shim log, summed over the chosen processes: WANT_PID, else those
    that managed something, else any with counters (children of the program log their own,
    mostly empty, counters). Returns a dict:
      kv          counters (ALLOC_KEYS, RES_KEYS, LAUNCH_KEYS, budget/device_peak/pinned_host,
                  found, pids, warnings, errors, nccl_lines, lines)
      exit_lines  the chosen processes' summary lines
      warn        (pid, level, text) of every warn/error line of the chosen processes;
                  warn_all the same for every process
      nccl, plan  lines naming NCCL; plan/profile/discovery/profiling lines
      exists      the file could be read (else error says why)"""
    kv = dict(found=0, pids=0, **{k: 0 for k in ALLOC_KEYS + RES_KEYS + LAUNCH_KEYS},
              warnings=0, errors=0, nccl_lines=0, lines=0)
    out = {"kv": kv, "exit_lines": [], "warn": [], "warn_all": [], "nccl": [], "plan": [],
           "exists": False}
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
        out["exists"] = True
    except OSError as e:
        out["error"] = str(e)
        return out
    kv["lines"] = len(lines)
    per = {}
    warn = []
    for line in lines:
        m = LINE.match(line)
        if not m:
            continue
        pid, level, text = m.groups()
        d = per.setdefault(pid, {"lines": []})
        if level in ("warn", "error"):
            warn.append((pid, level, text))
        if "nccl" in text.lower():
            out["nccl"].append(line)
        if re.match(r"(plan|profile|discovery|profiling)\b", text):
            out["plan"].append(line)
        for key, rx in (("alloc", ALLOC), ("res", RES), ("launch", LAUNCH)):
            mm = rx.match(text)
            if mm:
                d[key] = mm.groups()
                d["lines"].append(line)
    if want_pid:
        chosen = [want_pid] if want_pid in per else []
    else:
        chosen = [p for p, d in per.items() if "alloc" in d and int(d["alloc"][0]) > 0]
        if not chosen:
            chosen = [p for p, d in per.items() if "alloc" in d]
    out["warn_all"] = warn
    out["warn"] = [w for w in warn if not chosen or w[0] in chosen]
    kv["warnings"] = sum(1 for w in out["warn"] if w[1] == "warn")
    kv["errors"] = sum(1 for w in out["warn"] if w[1] == "error")
    kv["nccl_lines"] = len(out["nccl"])
    kv["pids"] = len(chosen)
    for p in chosen:
        d = per[p]
        out["exit_lines"] += d["lines"]
        if "alloc" in d:
            kv["found"] = 1
            for k, v in zip(ALLOC_KEYS, d["alloc"]):
                kv[k] += int(v)
        if "res" in d:
            r = d["res"]
            kv["budget"] = r[0].replace(" ", "")
            kv["device_peak"] = r[1].replace(" ", "")
            kv["pinned_host"] = r[2].replace(" ", "")
            for k, v in zip(RES_KEYS, r[3:]):
                kv[k] += int(v)
        if "launch" in d:
            for k, v in zip(LAUNCH_KEYS, d["launch"]):
                kv[k] += int(v)
    return out
