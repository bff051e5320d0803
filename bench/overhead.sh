#!/usr/bin/env bash
# The launch hook's cost where nothing is offloaded (issue 5: "at 100%, within 3% of no shim on
# decode, the launch-bound case"): decode steps of the model without the shim and with it, from a
# profile, at a budget above the program's peak (PCT of the weights; the activations and the KV
# cache need room too, so at 100% some allocations still move). The two alternate ROUNDS times in
# one session, so that both see the same machine (single runs of the same program differ by up to
# 10% between processes). No run trace, no debug log: the shim as a user runs it.
#
#   PROFILE=prof-decode.json OUT=dir [ROUNDS=3 PCT=105 MODEL=7b MODE=redirect SIDES="noshim shim"] \
#       [ITERS=32 CPUS= ALT_LIBS= WORKLOAD=decode] bash bench/overhead.sh
#
# SIDES, run in this order each round: noshim (no shim), pipeline (the hand-written per-layer
# prefetch pipeline of bench/prefetch_pipeline.py at PCT, its headroom from this round's noshim
# run, so noshim must come first), shim (the shim as a user runs it: with
# nothing to move it stops watching launches), watch (FLEXTENSOR_PAUSE_TRACKING=0: it watches
# every launch, the cost a plan that moves something pays on each), alt1, alt2, ... (the shim as
# a user runs it, preloading the first, second, ... library of ALT_LIBS, space-separated paths,
# instead of dist/'s: other builds, for an A/B between commits in one session), shim:KEY=VALUE,...
# (the shim with these settings, FLEXTENSOR_ prefix left out, e.g. shim:STRATEGY=greedy: an A/B
# of settings; its files are named with _ for : = and ,), entry (no shim: dist/lib/libfs_entry_probe.so
# alone, wrapping the driver's launch entry points: what seeing launches without CUPTI costs;
# bench/entry_probe.c), entrycheck (the same with ENTRY_PROBE_CUPTI=1: the launches CUPTI saw that
# no wrapper passed on; its line is in the run's .out). ITERS: steps per run. WORKLOAD: decode
# (the default) or prefill, the same A/B on the compute-bound workload.
# CPUS: run every side under `taskset -c CPUS` (the step is host-bound: fewer migrations).
# ROTATE=1: round r starts with the r-th side (not with pipeline among SIDES), so that no side
# always runs right after the same one. BENCH_ARGS=--cpu-probe: each run also times fixed host
# work beside each step, and the summary takes the host's speed out of each run's step and prints
# what the host did beside the steps (steal, IRQ time, interrupts by kind, a step).
# SAMPLES=1: every side also preloads dist/lib/libfs_sampler.so and samples the queueing thread's
# stacks in the timed steps' queueing spans (every SAMPLE_US, default 500) into
# OUT/SIDE-ROUND.samples: `python3 bench/sample_report.py OUT` says where a side's extra time goes.
# BENCH_ARGS: more bench.py options for every run, e.g. --layer-times (the first step by layer;
# --layer-times all: every step).
# HOST_CHECK=S: before the rounds, time the CPU probe alone for S seconds and say whether the host
# is quiet (bench.py --host-check; on a noisy one read the "pooled: quiet:" lines).
# PROFILE: a profile of the same model and workload (bench/run.sh leaves one in bench-logs.tar.gz).
# FAKE=1: no GPU; bench.py makes numbers up and nothing is preloaded (tests this script).
# TIME_LIMIT=S: the runs keep to S seconds: a run starts only while the longest run so far fits
# in what is left, one still going at S is stopped, and the summary covers the runs that
# finished (exit status 124 then, unless the outputs differ). Use it, not `timeout` around this
# script, on the GPU machine: a timeout loses the summary (stop 31's first call).
# Prints each run's median step, start-up (time to the first step's end, model build) and output
# fingerprint (decode: the tokens, prefill: the logits; every run must give the same, else the
# exit status is 1), then the median of each side's medians and its ratio to noshim's, each
# side's median start-up, and each side's steps pooled over its runs (bench/pooled_steps.py,
# lines starting "pooled:"; with --cpu-probe also "pooled: quiet:", the steps taken while the host
# ran at full speed, which a noisy host still has); the results (bench.py JSON) and the shim's
# logs stay in OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${PROFILE:?PROFILE=a profile of the workload}" "${OUT:?OUT=a directory}"
ROUNDS=${ROUNDS:-3}
PCT=${PCT:-105}
MODEL=${MODEL:-7b}
MODE=${MODE:-redirect}
read -r -a sides <<<"${SIDES:-noshim shim}"
read -r -a alt_libs <<<"${ALT_LIBS:-}"
ITERS=${ITERS:-32}
read -r -a BENCH_ARGS <<<"${BENCH_ARGS:-}"
WORKLOAD=${WORKLOAD:-decode}
case $WORKLOAD in
decode | prefill) ;;
*) echo "overhead.sh: WORKLOAD=$WORKLOAD: decode or prefill" >&2; exit 2 ;;
esac
if [ -n "${TIME_LIMIT:-}" ] && ! [[ $TIME_LIMIT =~ ^[1-9][0-9]*$ ]]; then
    echo "overhead.sh: TIME_LIMIT=$TIME_LIMIT: seconds, a whole number (e.g. TIME_LIMIT=280)" >&2
    exit 2
fi
PY=${PY:-python3}
SHIM_LIB=$PWD/dist/lib/libflexshim.so
SAMPLER_LIB=$PWD/dist/lib/libfs_sampler.so
ENTRY_LIB=$PWD/dist/lib/libfs_entry_probe.so
[ -f "$PROFILE" ] || { echo "overhead.sh: PROFILE=$PROFILE: no such file" >&2; exit 2; }
# shellcheck source=bench/shim_env.sh
. bench/shim_env.sh # pin_cpus, shim_env
pin_cpus overhead.sh || exit 2
ARGS=()
if [ "${FAKE:-0}" = 1 ]; then
    ARGS=(--fake)
elif [ ! -f "$SHIM_LIB" ] || { [ "${SAMPLES:-0}" = 1 ] && [ ! -f "$SAMPLER_LIB" ]; }; then
    echo "overhead.sh: $SHIM_LIB or $SAMPLER_LIB missing: run make dist" >&2
    exit 2
fi
mkdir -p "$OUT"
mib=$("$PY" bench/bench.py --model "$MODEL" --print-budgets "$PCT" | awk '{print $3}')
export FLEXTENSOR_CONFIG='' PYTHONUNBUFFERED=1

# Each side, checked once: the library it preloads, the settings it adds, the name of its files.
declare -A side_lib side_env side_file
for side in "${sides[@]}"; do
    side_lib[$side]=$SHIM_LIB
    side_file[$side]=$(tr ':=,' '___' <<<"$side")
    case $side in
    noshim | pipeline) side_lib[$side]= ;;
    entry | entrycheck)
        [ "${FAKE:-0}" = 1 ] || [ -f "$ENTRY_LIB" ] || {
            echo "overhead.sh: side $side: $ENTRY_LIB missing: run make dist" >&2
            exit 2
        }
        side_lib[$side]=$ENTRY_LIB
        [ "$side" = entrycheck ] && side_env[$side]=ENTRY_PROBE_CUPTI=1 ;;
    shim) side_env[$side]=FLEXTENSOR_PAUSE_TRACKING=1 ;;
    watch) side_env[$side]=FLEXTENSOR_PAUSE_TRACKING=0 ;;
    shim:*)
        side_env[$side]=FLEXTENSOR_PAUSE_TRACKING=1
        for kv in $(tr , ' ' <<<"${side#shim:}"); do
            [[ $kv =~ ^[A-Z][A-Z0-9_]*=[^=]+$ ]] || {
                echo "overhead.sh: side $side: '$kv' is not KEY=VALUE (a flexshim setting without" \
                    "its FLEXTENSOR_ prefix, e.g. shim:STRATEGY=greedy)" >&2
                exit 2
            }
            side_env[$side]+=" FLEXTENSOR_$kv"
        done ;;
    alt[1-9])
        # No PAUSE_TRACKING: an older build may not know it (an unknown FLEXTENSOR_ name is an error).
        lib=${alt_libs[${side#alt} - 1]:-}
        [ -n "$lib" ] && { [ "${FAKE:-0}" = 1 ] || [ -f "$lib" ]; } || {
            echo "overhead.sh: side $side needs word ${side#alt} of ALT_LIBS to be a" \
                "libflexshim.so that exists (ALT_LIBS=${ALT_LIBS:-})" >&2
            exit 2
        }
        side_lib[$side]=$lib ;;
    *) echo "overhead.sh: SIDES=${sides[*]}: unknown side $side (noshim, pipeline, shim, shim:KEY=VALUE,..., watch, alt1-alt9, entry, entrycheck)" >&2; exit 2 ;;
    esac
done
case " ${sides[*]} " in *" noshim "*) ;; *) echo "overhead.sh: SIDES must include noshim" >&2; exit 2 ;; esac
case " ${sides[*]} " in *" pipeline "*"noshim "*)
    echo "overhead.sh: SIDES: pipeline takes its headroom from the round's noshim run: put noshim first" >&2
    exit 2 ;;
esac
if [ "${ROTATE:-0}" = 1 ] && [[ " ${sides[*]} " == *" pipeline "* ]]; then
    echo "overhead.sh: ROTATE=1 with side pipeline: it takes its headroom from the round's noshim run, which must come first; leave ROTATE out" >&2
    exit 2
fi

SECONDS=0
# HOST_CHECK=S: first the CPU probe alone for S seconds, on the runs' CPUs (bench.py --host-check):
# one line saying whether the host is quiet; the rounds run either way (TIME_LIMIT counts it).
if [ -n "${HOST_CHECK:-}" ]; then
    rc=0
    "${PIN[@]}" "$PY" bench/bench.py --host-check "$HOST_CHECK" "${ARGS[@]}" || rc=$?
    [ $rc = 0 ] || [ $rc = 3 ] || { echo "overhead.sh: HOST_CHECK=$HOST_CHECK: the host check failed (exit $rc)" >&2; exit 2; }
fi
longest=0 cut=0 # the longest run so far (s); 1 once TIME_LIMIT stopped the runs
for r in $(seq 1 "$ROUNDS"); do
    order=("${sides[@]}")
    if [ "${ROTATE:-0}" = 1 ]; then # round r starts at side r: each side runs after each other
        k=$(((r - 1) % ${#sides[@]}))
        order=("${sides[@]:k}" "${sides[@]:0:k}")
    fi
    for side in "${order[@]}"; do
        base=$OUT/${side_file[$side]}-$r
        limit=()
        if [ -n "${TIME_LIMIT:-}" ]; then
            left=$((TIME_LIMIT - SECONDS))
            if ((left <= 0 || left < longest)); then
                echo "---- TIME_LIMIT=$TIME_LIMIT: round $r's $side not started ($left s left, a" \
                    "run has taken up to $longest s); the summary covers the runs that finished"
                cut=1
                break 2
            fi
            limit=(timeout "$left")
        fi
        extra=() preload=${side_lib[$side]}
        if [ "$side" = noshim ]; then
            envs=(env) system=noshim pct=100
            echo "---- round $r/$ROUNDS: noshim"
        elif [ "$side" = entry ] || [ "$side" = entrycheck ]; then
            envs=(env ${side_env[$side]:-}) system=noshim pct=100
            echo "---- round $r/$ROUNDS: $side (no shim; the entry-point probe preloaded)"
        elif [ "$side" = pipeline ]; then
            # Its headroom (activations, KV cache) is this round's noshim peak less the weights.
            "$PY" -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))))' \
                "$OUT/noshim-$r.json" >"$base.noshim.jsonl" 2>/dev/null || : >"$base.noshim.jsonl"
            envs=(env) system=pipeline pct=$PCT extra=(--headroom-from "$base.noshim.jsonl")
            echo "---- round $r/$ROUNDS: pipeline (${PCT}%)"
        else
            LIB=${side_lib[$side]}
            read -r -a envs <<<"$(shim_env "$mib" "$base.log" "$PROFILE") \
                FLEXTENSOR_OFFLOAD_MODE=$MODE ${side_env[$side]:-}" # the side's settings last
            system=flexshim_$MODE pct=$PCT
            echo "---- round $r/$ROUNDS: $side ($MODE, ${PCT}% = ${mib} MiB, $LIB, ${side_env[$side]:-})"
        fi
        if [ "${SAMPLES:-0}" = 1 ]; then
            extra+=(--samples "$base.samples" --sample-us "${SAMPLE_US:-500}")
            preload=${preload:+$preload:}$SAMPLER_LIB # beside the side's own, which comes first
        fi
        # the last LD_PRELOAD= of an env wins over shim_env's
        [ "${FAKE:-0}" = 1 ] || [ -z "$preload" ] || envs+=("LD_PRELOAD=$preload")
        t0=$SECONDS rc=0
        # taskset before the environment: only python gets the preloads
        "${limit[@]}" "${PIN[@]}" "${envs[@]}" "$PY" bench/bench.py --system "$system" \
            --workload "$WORKLOAD" --model "$MODEL" --budget-pct "$pct" --iters "$ITERS" \
            --result "$base.json" "${extra[@]}" "${ARGS[@]}" "${BENCH_ARGS[@]}" >"$base.out" 2>&1 ||
            rc=$?
        ((SECONDS - t0 > longest)) && longest=$((SECONDS - t0))
        if [ ${#limit[@]} -gt 0 ] && [ "$rc" = 124 ]; then
            echo "---- TIME_LIMIT=$TIME_LIMIT: round $r's $side stopped at the limit; the summary" \
                "covers the runs that finished"
            rm -f "$base.json"
            cut=1
            break 2
        fi
        [ "$rc" = 0 ] || tail -5 "$base.out"
    done
done

# The summary: each side's name and the name of its files.
pairs=()
for side in "${sides[@]}"; do pairs+=("$side" "${side_file[$side]}"); done
status=0
"$PY" - "$OUT" "$ROUNDS" "${pairs[@]}" <<'EOF' || status=$?
import json, os, statistics, sys

out, rounds = sys.argv[1], int(sys.argv[2])
sides, files = sys.argv[3::2], dict(zip(sys.argv[3::2], sys.argv[4::2]))
med = {side: [] for side in sides}
# Each run's 10th-percentile step: a shared host's interference (other tenants, CPU steal) only
# ever adds time, so a run's fast steps show the side's own cost more steadily than its median.
fast = {side: [] for side in sides}
# Each run's median over its timed steps of bench.py's per-step values: the host time to queue
# a step; the queueing thread's own account of that span: its CPU time and the whole process's,
# then its blocks (voluntary context switches), preemptions (involuntary) and minor page faults;
# with --cpu-probe (BENCH_ARGS) its hardware counters (ThreadPerf; millions for instructions and
# cycles) and the probe time (fixed host work beside each step).
COUNTS = (("queue_vcsw", "blocks"), ("queue_ivcsw", "preemptions"), ("queue_minflt", "minor faults"))
PERF = (("queue_instructions", "M instructions (user)", 1e6),
        ("queue_cycles", "M cycles (user)", 1e6),
        ("queue_cycles_all", "M cycles (user and kernel)", 1e6),
        ("queue_migrations", "CPU migrations", 1))
STEP_KEYS = (("queue_ms", "queue_cpu_ms", "queue_proc_cpu_ms") + tuple(key for key, _ in COUNTS)
             + tuple(key for key, _, _ in PERF) + ("cpu_probe_ms",))
SCALE = {key: scale for key, _, scale in PERF}
per_run = {key: {side: [] for side in sides} for key in STEP_KEYS}
# --cpu-probe: each run's median step over its median probe (the step with the host's speed in
# that run taken out), and its host counters a step (bench.py host_counters).
per_probe = {side: [] for side in sides}
host = {side: [] for side in sides}
ttfs = {side: [] for side in sides}  # seconds from the process start to the first step's end
outputs = {}  # output fingerprint (decode: the tokens, prefill: the logits) -> runs giving it
for r in range(1, rounds + 1):
    for side in sides:
        path = os.path.join(out, f"{files[side]}-{r}.json")
        if not os.path.exists(path):
            print(f"round {r} {side:6s} no result")
            continue
        try:
            result = json.load(open(path))
        except (OSError, ValueError):
            result = {}
        ms = result.get("step_ms_median")
        fp = (result.get("fingerprint") or {}).get("value")
        print(f"round {r} {side:6s} median step {ms} ms, first step at {result.get('ttfs_s')} s "
              f"(model build {result.get('build_s')} s), output {fp}")
        if ms is not None:
            med[side].append(ms)
        warm = result.get("warmup_steps") or 0
        timed = sorted((result.get("step_ms") or [])[warm:])
        if timed:
            fast[side].append(timed[len(timed) // 10])
        for key in STEP_KEYS:
            timed_values = (result.get(key) or [])[warm:]  # none when ITERS <= the warm-up
            if timed_values:
                per_run[key][side].append(statistics.median(timed_values) / SCALE.get(key, 1))
        if ms is not None and (result.get("cpu_probe_ms") or [])[warm:]:
            per_probe[side].append(ms / per_run["cpu_probe_ms"][side][-1])
        if result.get("host_counters") is not None:
            host[side].append(result["host_counters"])
        if result.get("ttfs_s") is not None:
            ttfs[side].append(result["ttfs_s"])
        if fp is not None:
            outputs.setdefault(fp, []).append(f"{side}-{r}")
if len(outputs) == 1:
    print(f"outputs identical in all {sum(len(v) for v in outputs.values())} runs")
elif outputs:
    print("OUTPUTS DIFFER: " + "; ".join(f"{fp}: {' '.join(runs)}" for fp, runs in outputs.items()))
if not med["noshim"] or not all(med.values()):
    print("no ratio: a side has no result")
    sys.exit(1 if len(outputs) > 1 else 2)
base, low = statistics.median(med["noshim"]), min(med["noshim"])
print(f"noshim {base:.2f} ms (median of {len(med['noshim'])} runs; fastest run {low:.2f} ms)")
for side in sides:
    if side != "noshim":
        m, f = statistics.median(med[side]), min(med[side])
        print(f"{side} {m:.2f} ms (median of {len(med[side])} runs): ratio {m / base:.3f}; "
              f"fastest run {f:.2f} ms: ratio {f / low:.3f}")


def per_side(label, values, unit, ratio):
    """LABEL: each side's median of VALUES, with its ratio to noshim's (written as RATIO says;
    none where noshim's is 0)."""
    if not values["noshim"] or not all(values.values()):
        return
    v0 = statistics.median(values["noshim"])
    print(f"{label}: " + "; ".join(
        f"{side} {statistics.median(values[side]):.2f}" + (f" {unit}" if unit else "")
        + ("" if side == "noshim" or not v0 else ratio.format(statistics.median(values[side]) / v0))
        for side in sides))


per_side("10th-percentile step (median over runs)", fast, "ms", " ({:.3f})")
per_side("host time to queue a step (median over runs; near the step: host-bound)",
         per_run["queue_ms"], "ms", " ({:.3f})")
per_side("the queueing thread's CPU time a step (median over runs; the rest of the host time is "
         "waiting or preemption)", per_run["queue_cpu_ms"], "ms", " ({:.3f})")
per_side("the whole process's CPU time in that span (median over runs; well above the thread's: "
         "another thread busy beside it)", per_run["queue_proc_cpu_ms"], "ms", " ({:.3f})")
if all(all(per_run[key].values()) for key, _ in COUNTS):
    print("the queueing thread a step (median over runs): " + "; ".join(
        f"{side} " + ", ".join(f"{statistics.median(per_run[key][side]):g} {name}"
                               for key, name in COUNTS)
        for side in sides))
per_side("host speed: the CPU probe beside each step (median over runs; higher: a slower host)",
         per_run["cpu_probe_ms"], "ms", " ({:.3f})")
per_side("step over the CPU probe (median over runs: the step with the host's speed taken out)",
         per_probe, "probes", " ({:.3f})")
for key, label, _ in PERF:
    per_side(f"the queueing thread's {label} a step (median over runs)", per_run[key], "",
             " ({:.3f})")
kinds = sorted({k for runs in host.values() for counters in runs for k in counters})
if all(host.values()) and kinds:
    print("the host beside the steps, a step (median over runs; steal, IRQ time and interrupts on "
          "the CPUs a run may use): " + "; ".join(
              f"{side} " + ", ".join(
                  f"{k} {statistics.median(c.get(k, 0) for c in host[side]):g}" for k in kinds)
              for side in sides))
per_side("start-up (median time to the first step's end)", ttfs, "s", " ({:.2f} x)")
sys.exit(0 if len(outputs) <= 1 else 1)
EOF
# Every side's steps pooled over its runs (the floor it reaches, steadier than run medians on a
# host where whole processes run slow).
"$PY" bench/pooled_steps.py "$OUT" | sed 's/^/pooled: /' || true
# 1: the outputs differ; 124: TIME_LIMIT cut the runs short; 1 too: a side has no result.
if [ "$cut" = 1 ] && [ "$status" != 1 ]; then
    status=124
elif [ "$status" = 2 ]; then
    status=1
fi
exit "$status"
