#!/usr/bin/env bash
# One A/B call on the GPU machine, packed for the trip back: bench/overhead.sh (alternating
# sides, same settings) with the GPU's clocks and power sampled beside it and set beside each
# step (clock_steps.py), every step by layer
# read with layer_steps.py (when BENCH_ARGS times them), and each shimmed run's trace summed with
# trace_summary.py (TRACE=1). The device tool brings back at most 8 files, so all of it goes into
# OUT/NAME.tgz, but the run traces themselves: only round 1's shim and alt1 come back beside it
# (NAME-trace-SIDE-1.json.gz).
#
#   NAME=p50 PROFILE=prof.json OUT=dir [TRACE=1 SMI_MS=100 GBPS=55 TIME_LIMIT=S] \
#       [overhead.sh's settings: WORKLOAD PCT ITERS ROUNDS SIDES ALT_LIBS CPUS BENCH_ARGS ...] \
#       bash bench/device_ab.sh
#
# PROFILE may be gzipped. GBPS: the link for trace_summary.py --link-gbps. TIME_LIMIT=S goes to
# overhead.sh: its runs keep to S seconds (exit 124 when that cut them short), then its summary,
# and the runs it finished are packed. Never wrap this script in `timeout` instead: that kills
# the packing too, and nothing comes back. Without nvidia-smi (FAKE=1 runs) no clocks are
# sampled. Exits with overhead.sh's status.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${NAME:?NAME=a name for this call s files}" "${PROFILE:?PROFILE=a profile}" "${OUT:?OUT=a directory}"
[[ $NAME =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "device_ab.sh: NAME=$NAME: letters, digits, . _ - only" >&2; exit 2; }
d=$OUT/$NAME
mkdir -p "$d"
prof=$PROFILE
if [[ $PROFILE == *.gz ]]; then
    prof=$d/profile.json
    zcat "$PROFILE" >"$prof" || { echo "device_ab.sh: PROFILE=$PROFILE: not gzip" >&2; exit 2; }
fi
smi=
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >"$d/gpu.txt" 2>&1
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu \
        --format=csv,noheader -lms "${SMI_MS:-100}" >"$d/smi.csv" 2>&1 &
    smi=$!
fi
[ "${TRACE:-0}" = 1 ] && export FLEXTENSOR_TRACE_OUT=$d/trace-{pid}.json
PROFILE=$prof OUT=$d bash bench/overhead.sh 2>&1 | tee "$d/overhead.txt"
rc=${PIPESTATUS[0]}
if [ -n "$smi" ]; then
    kill "$smi"
    python3 bench/clock_steps.py "$d/smi.csv" "$d"/*-[0-9].json >"$d/clock_steps.txt" 2>&1
fi
case " ${BENCH_ARGS:-} " in *" --layer-times all "*)
    python3 bench/layer_steps.py "$d"/*-[0-9].json 2>&1 | tee "$d/layer_steps.txt" ;;
esac
# Each trace named after its side (its log's "[flexshim PID]" lines) and summed.
for t in "$d"/trace-*.json; do
    [ -f "$t" ] || continue
    pid=${t##*trace-}
    pid=${pid%.json}
    log=$(grep -l "^\[flexshim $pid\]" "$d"/*.log 2>/dev/null | head -1)
    side=$(basename "${log:-pid-$pid}" .log)
    python3 bench/trace_summary.py "$t" --link-gbps "${GBPS:-55}" >"$d/tsum-$side.txt" 2>&1
    mv "$t" "$d/trace-$side.json"
done
for side in shim alt1; do
    [ -f "$d/trace-$side-1.json" ] && gzip -c "$d/trace-$side-1.json" >"$OUT/$NAME-trace-$side-1.json.gz"
done
rm -f "$d"/trace-*.json "$d/profile.json"
tar czf "$OUT/$NAME.tgz" -C "$OUT" "$NAME" && rm -rf "$d"
echo "device_ab.sh: overhead.sh exit $rc; $OUT/$NAME.tgz"
exit "$rc"
