#!/usr/bin/env bash
# The launch hook's cost where nothing is offloaded (issue 5: "at 100%, within 3% of no shim on
# decode, the launch-bound case"): decode steps of the model without the shim and with it, from a
# profile, at a budget above the program's peak (PCT of the weights; the activations and the KV
# cache need room too, so at 100% some allocations still move). The two alternate ROUNDS times in
# one session, so that both see the same machine (single runs of the same program differ by up to
# 10% between processes). No run trace, no debug log: the shim as a user runs it.
#
#   PROFILE=prof-decode.json OUT=dir [ROUNDS=3 PCT=105 MODEL=7b MODE=redirect] bash bench/overhead.sh
#
# PROFILE: a decode profile of the same model (bench/run.sh leaves one in bench-logs.tar.gz).
# FAKE=1: no GPU; bench.py makes numbers up and nothing is preloaded (tests this script).
# Prints each run's median step, then the median of each side's medians and their ratio; the
# results (bench.py JSON) and the shim's logs stay in OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${PROFILE:?PROFILE=a decode profile}" "${OUT:?OUT=a directory}"
ROUNDS=${ROUNDS:-3}
PCT=${PCT:-105}
MODEL=${MODEL:-7b}
MODE=${MODE:-redirect}
PY=${PY:-python3}
LIB=$PWD/dist/lib/libflexshim.so
[ -f "$PROFILE" ] || { echo "overhead.sh: PROFILE=$PROFILE: no such file" >&2; exit 2; }
# shellcheck source=bench/shim_env.sh
. bench/shim_env.sh
ARGS=()
if [ "${FAKE:-0}" = 1 ]; then
    ARGS=(--fake)
elif [ ! -f "$LIB" ]; then
    echo "overhead.sh: $LIB missing: run make dist" >&2
    exit 2
fi
mkdir -p "$OUT"
mib=$("$PY" bench/bench.py --model "$MODEL" --print-budgets "$PCT" | awk '{print $3}')
export FLEXTENSOR_CONFIG='' PYTHONUNBUFFERED=1

for r in $(seq 1 "$ROUNDS"); do
    echo "---- round $r/$ROUNDS: noshim"
    "$PY" bench/bench.py --system noshim --workload decode --model "$MODEL" --budget-pct 100 \
        --result "$OUT/noshim-$r.json" "${ARGS[@]}" > "$OUT/noshim-$r.out" 2>&1 || tail -5 "$OUT/noshim-$r.out"
    echo "---- round $r/$ROUNDS: flexshim ($MODE, ${PCT}% = ${mib} MiB)"
    # shellcheck disable=SC2046
    $(shim_env "$mib" "$OUT/shim-$r.log" "$PROFILE") FLEXTENSOR_OFFLOAD_MODE="$MODE" \
        "$PY" bench/bench.py --system "flexshim_$MODE" --workload decode --model "$MODEL" \
        --budget-pct "$PCT" --result "$OUT/shim-$r.json" "${ARGS[@]}" > "$OUT/shim-$r.out" 2>&1 ||
        tail -5 "$OUT/shim-$r.out"
done

"$PY" - "$OUT" "$ROUNDS" <<'EOF'
import json, os, statistics, sys

out, rounds = sys.argv[1], int(sys.argv[2])
med = {"noshim": [], "shim": []}
for r in range(1, rounds + 1):
    for side in med:
        path = os.path.join(out, f"{side}-{r}.json")
        try:
            ms = json.load(open(path)).get("step_ms_median")
        except (OSError, ValueError):
            ms = None
        print(f"round {r} {side:6s} median step {ms} ms")
        if ms is not None:
            med[side].append(ms)
if med["noshim"] and med["shim"]:
    a, b = statistics.median(med["noshim"]), statistics.median(med["shim"])
    print(f"noshim {a:.2f} ms, flexshim {b:.2f} ms (medians of {len(med['noshim'])} and "
          f"{len(med['shim'])} runs): ratio {b / a:.3f}")
else:
    print("no ratio: a side has no result")
    sys.exit(1)
EOF
