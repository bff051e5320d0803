#!/usr/bin/env bash
# flexshim-profile's profile commands (check, show, simulate, trace) on the sample profiles in
# tests/data/ (small.json: 10 allocations, 7 launches, a plan saved by adaptive at 112 MiB;
# small-noplan.json: the same without a plan) and broken copies made here. Run from the
# repository root by `make test-tools`; prints "tools: N passed, M failed".
set -u
BUILD=${BUILD:-build}
TOOL=$PWD/$BUILD/flexshim-profile
DATA=$PWD/tests/data
SMALL=$DATA/small.json
NOPLAN=$DATA/small-noplan.json
NAME=tools
. "$PWD/tests/check.sh"

# run OUT ERR ARGS...: the tool's stdout into OUT, stderr into ERR; sets rc
run() { local out=$1 err=$2; shift 2; "$TOOL" "$@" >"$out" 2>"$err"; rc=$?; }
# json_ok FILE: python3 parses it
json_ok() { python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$1" 2>"$tmp/json_err"; }

# Broken copies of the sample, one failure class each.
head -c 900 "$SMALL" >"$tmp/corrupt.json"
sed 's/"flexshim_profile": 1/"flexshim_profile": 2/' "$SMALL" >"$tmp/version.json"
sed 's/"duration_us": 100, "refs": \[4, 5\]/"duration_us": 100, "refs": [4, 6]/' "$SMALL" >"$tmp/refs.json"
sed 's/"first_use": 4, "last_use": 4/"first_use": 3, "last_use": 4/' "$SMALL" >"$tmp/uses.json"
sed 's/"budget": 117440512/"budget": 104857600/' "$SMALL" >"$tmp/overbudget.json"
sed 's/{"prefetch_at": 2, "evict_after": 3}/{"prefetch_at": 4, "evict_after": 2}/' "$SMALL" >"$tmp/window.json"
sed 's/"predicted_us": 20981.7728/"predicted_us": 19000/' "$SMALL" >"$tmp/stale.json"
for f in version refs uses overbudget window stale; do
    cmp -s "$SMALL" "$tmp/$f.json" && fail "broken copy $f.json differs from the sample" "the sed edit matched nothing"
done

# 1. check
run "$tmp/o" "$tmp/e" check "$SMALL"
expect_rc "check: a valid profile exits 0" 0 $rc "$tmp/e"
expect "check: one line with counts, plan, budget and prediction" "$tmp/o" \
    "^$SMALL: profile OK: 10 allocations \(214\.0 MiB\), 7 launches per iteration, plan: adaptive\(global\) at budget 112 MiB \(predicted 20\.982 ms, stall 13\.127 ms\)$"
# The sample's plan names no planning code (saved before plans did): a run would plan it again.
expect "check: a plan of other planning code is noted" "$tmp/e" \
    "^$SMALL: note: the saved plan was made by other planning code \(unnamed; this flexshim's is [0-9a-f]{12}\): a run plans it again$"
planner=$(sed -n "s/.*this flexshim's is \([0-9a-f]*\)).*/\1/p" "$tmp/e")
sed "s/\"plan\": {/\"plan\": {\"planner\": \"$planner\", /" "$SMALL" >"$tmp/ours.json"
run "$tmp/o" "$tmp/e" check "$tmp/ours.json"
[ "$(wc -l <"$tmp/o")" = 1 ] && [ ! -s "$tmp/e" ] && ok "check: this build's plan: exactly one line, nothing on stderr" || fail "check: this build's plan: exactly one line, nothing on stderr" "$(cat "$tmp/o" "$tmp/e")"
run "$tmp/o" "$tmp/e" check "$NOPLAN"
expect "check: a profile without a plan says 'no plan'" "$tmp/o" "^$NOPLAN: profile OK: 10 allocations \(214\.0 MiB\), 7 launches per iteration, no plan$"

check_fails() { # NAME FILE PATTERN
    run "$tmp/o" "$tmp/e" check "$2"
    expect_rc "check: $1 exits 1" 1 $rc "$tmp/e"
    expect "check: $1 says what is wrong" "$tmp/e" "$3"
    [ "$(wc -l <"$tmp/e")" = 1 ] && ok "check: $1 is one line" || fail "check: $1 is one line" "$(cat "$tmp/e")"
}
check_fails "corrupt JSON" "$tmp/corrupt.json" "^flexshim-profile check: profile $tmp/corrupt.json is not valid JSON \(line [0-9]+, column [0-9]+: .*\); record it again$"
check_fails "wrong schema version" "$tmp/version.json" "profile $tmp/version.json has schema version 2; this flexshim reads version 1: record it again"
check_fails "reference outside the use range" "$tmp/refs.json" "launches\[2\]\.refs\[1\] refers to allocation 6, whose first_use\.\.last_use is 3\.\.5 and does not include launch 2"
check_fails "use range not matching the references" "$tmp/uses.json" "allocations\[8\]\.first_use is 3 but the first launch referring to it is 4"
check_fails "missing file" "$tmp/none.json" "cannot read profile $tmp/none.json: No such file or directory"
check_fails "plan over its budget" "$tmp/overbudget.json" "the plan holds 112 MiB on the device at its peak, more than its budget of 100 MiB"
check_fails "plan window missing a use" "$tmp/window.json" "plan\.entries\[2\]: the window from launch 4 \(prefetch_at\) to launch 2 \(evict_after\) does not contain the allocation's uses, launches 3 to 3"
run "$tmp/o" "$tmp/e" check "$tmp/stale.json"
expect_rc "check: a stale saved prediction is not an error" 0 $rc "$tmp/e"
expect "check: a stale saved prediction is noted" "$tmp/e" "note: the saved plan predicts 19\.000 ms .*model predicts 20\.982 ms"

# 2. show
run "$tmp/show" "$tmp/e" show "$SMALL"
expect_rc "show: exits 0" 0 $rc "$tmp/e"
expect "show: device" "$tmp/show" '^device +NVIDIA H200 \(compute capability 9\.0, 140\.40 GiB, CUDA driver 13\.0\)$'
expect "show: program" "$tmp/show" '^program +python infer\.py --model tiny$'
expect "show: link model" "$tmp/show" 'host to device 25\.0 GB/s \+ 10\.0 us'
expect "show: iteration totals" "$tmp/show" '^iteration 7 launches, 7\.855 ms of compute; 10 allocations, 214\.0 MiB on the device \(210\.0 MiB used by launches\)$'
expect_not "show: no host line when the program's host time was not measured" "$tmp/show" '^host '
expect "show: no allocation known unchanged in a profile without the marks" "$tmp/show" '^unchanged 0 of 10 allocations known to be left as they were'
expect_not "show: no read bound when the profile has none" "$tmp/show" '^reads '
python3 - "$SMALL" "$tmp/marks.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
for a in d["allocations"][:3]:
    a["unchanged"] = True
d["bandwidth"]["read_bytes_per_us"] = 6e6
d["bandwidth"]["handover_us"] = 600
json.dump(d, open(sys.argv[2], "w"))
PYEOF
run "$tmp/o" "$tmp/e" show "$tmp/marks.json"
expect "show: the unchanged allocations counted" "$tmp/o" '^unchanged 3 of 10 allocations known to be left as they were by the iteration'
expect "show: the read bound" "$tmp/o" '^reads +a kernel reads at most 6000\.0 GB/s of its allocations'
expect "show: the hand-over" "$tmp/o" '^hand-over 600 us from an unchanged allocation'
sed 's/"duration_us": \([0-9.]*\),/"duration_us": \1, "host_us": 12,/' "$SMALL" >"$tmp/host.json"
run "$tmp/o" "$tmp/e" show "$tmp/host.json"
expect "show: the program's host time per iteration (7 x 12 us)" "$tmp/o" '^host +0\.084 ms per iteration in the program between its launches'
run "$tmp/o" "$tmp/e" simulate "$tmp/host.json" --budget 100% --strategy global
expect "simulate: C waits for the program's host time (12 us before the first launch)" "$tmp/o" 'compute C = 7\.867 ms \(kernels 7\.855 ms, waiting for the program.s host time\)'
expect "simulate: everything resident takes C" "$tmp/o" '^100% = 210 MiB +global +7\.867 +0\.000 +0\.0 +210\.0 +7\.867$'
expect "show: sizes < 1 MiB" "$tmp/show" '^  < 1 MiB +1 +0\.5$'
expect "show: sizes 4-16 MiB" "$tmp/show" '^  4 MiB - 16 MiB +5 +36\.0$'
expect "show: sizes 16-64 MiB" "$tmp/show" '^  16 MiB - 64 MiB +2 +47\.5$'
expect "show: sizes 64-256 MiB" "$tmp/show" '^  64 MiB - 256 MiB +2 +128\.0$'
expect_not "show: no empty size ranges" "$tmp/show" '^  1 MiB - 4 MiB'
expect "show: plan, budget and peak" "$tmp/show" '^plan +adaptive\(global\) at budget 112 MiB, peak 112 MiB$'
expect "show: resident bytes" "$tmp/show" '^  resident +4 allocations +32\.0 MiB$'
expect "show: offloaded bytes" "$tmp/show" '^  offloaded +6 allocations +182\.0 MiB \(178\.0 MiB moved per iteration\)$'
expect "show: predicted step and stall" "$tmp/show" '^  predicted step 20\.982 ms: compute 7\.855 ms \+ stall 13\.127 ms$'
expect "show: top kernel by total time (two launches grouped)" "$tmp/show" '^  gemm_bf16_128x128 +2 +6\.000 +76\.4%$'
expect "show: unnamed kernel by hash" "$tmp/show" '^  0xdeadbeefcafef00d +1 +0\.050 +0\.6%$'
expect "show: copies and memsets" "$tmp/show" '^  copy/memset +1 +0\.005 +0\.1%$'
sed -n '/^  kernel /,$p' "$tmp/show" | sed 1d | awk '{print $(NF-1)}' >"$tmp/ktimes"
sort -rn "$tmp/ktimes" | cmp -s - "$tmp/ktimes" && [ "$(wc -l <"$tmp/ktimes")" = 6 ] && ok "show: kernels sorted by total time" || fail "show: kernels sorted by total time" "$(cat "$tmp/show")"
run "$tmp/o" "$tmp/e" show "$NOPLAN"
expect "show: no plan saved" "$tmp/o" '^plan +none saved'
run "$tmp/o" "$tmp/e" show "$tmp/version.json"
expect_rc "show: a bad profile exits 1" 1 $rc "$tmp/e"
expect "show: a bad profile says why" "$tmp/e" 'has schema version 2'

# 3. simulate
run "$tmp/sim" "$tmp/simerr" simulate "$SMALL" --budget 50%,128MiB
expect_rc "simulate: exits 0" 0 $rc "$tmp/simerr"
expect "simulate: says it is a model, not a GPU run" "$tmp/sim" 'timeline model of the planned iteration, not a GPU run'
expect "simulate: names the smallest feasible budget" "$tmp/sim" 'smallest feasible budget: 80 MiB \(the allocations in use across launch 1\)'
expect "simulate: table header" "$tmp/sim" '^budget +strategy +predicted ms +stall ms +offloaded MiB +peak MiB +limit ms$'
rows() { grep -Ec '^(50% = 105 MiB|128 MiB) ' "$tmp/sim"; }
[ "$(rows)" = 8 ] && ok "simulate: 2 budgets x 4 strategies = 8 rows" || fail "simulate: 2 budgets x 4 strategies = 8 rows" "$(cat "$tmp/sim")"
for s in 'adaptive\(' knapsack greedy global; do
    [ "$(grep -Ec "^(50% = 105 MiB|128 MiB) +$s" "$tmp/sim")" = 2 ] && ok "simulate: $s at both budgets" || fail "simulate: $s at both budgets" "$(cat "$tmp/sim")"
done
expect "simulate: percentage of the managed bytes (50% of 210 MiB)" "$tmp/sim" '^50% = 105 MiB +adaptive\(greedy\) +21\.663 +13\.808 +176\.0 +98\.0 +7\.855$'
expect "simulate: a row with its limit max(C, B/W) (B/W = 210 MiB / 25 GB/s)" "$tmp/sim" '^128 MiB +knapsack +18\.495 +10\.640 +210\.0 +128\.0 +8\.808$'
[ "$(grep -c '^simulate: \[[0-9]/8\]' "$tmp/simerr")" = 8 ] && ok "simulate: progress on stderr for 8 rows" || fail "simulate: progress on stderr for 8 rows" "$(cat "$tmp/simerr")"
expect_not "simulate: no progress on stdout" "$tmp/sim" '\[[0-9]+/[0-9]+\]'
run "$tmp/o" "$tmp/e" simulate "$SMALL" --budget 128MiB --strategy greedy
[ "$(grep -c '^128 MiB ' "$tmp/o")" = 1 ] && grep -Eq '^128 MiB +greedy ' "$tmp/o" && ok "simulate: --strategy picks one" || fail "simulate: --strategy picks one" "$(cat "$tmp/o")"
[ ! -s "$tmp/e" ] && ok "simulate: no progress for a single row" || fail "simulate: no progress for a single row" "$(cat "$tmp/e")"
run "$tmp/o" "$tmp/e" simulate "$SMALL" --budget 40MiB --strategy all
expect_rc "simulate: an infeasible budget is a result, not an error" 0 $rc "$tmp/e"
[ "$(grep -Ec '^40 MiB +[a-z]+ +infeasible( +-){4}$' "$tmp/o")" = 4 ] && ok "simulate: infeasible budget reported for every strategy" || fail "simulate: infeasible budget reported for every strategy" "$(cat "$tmp/o")"
run "$tmp/o" "$tmp/e" simulate "$SMALL" --budget 100%
expect "simulate: 100% keeps everything resident (no stall, time = compute)" "$tmp/o" '^100% = 210 MiB +global +7\.855 +0\.000 +0\.0 +210\.0 +7\.855$'
budgets=80MiB,40%,100MiB,50%,112MiB,120MiB,128MiB,160MiB,200MiB,100%
run "$tmp/o" "$tmp/e" simulate "$SMALL" --budget $budgets --strategy adaptive
awk '$0 ~ /adaptive\(/ { for (i = 1; i <= NF; i++) if ($i ~ /^adaptive\(/) print $(i + 1) }' "$tmp/o" >"$tmp/adaptive"
if [ "$(wc -l <"$tmp/adaptive")" = 10 ] && awk 'NR > 1 && $1 > prev + 1e-9 { bad = 1 } { prev = $1 } END { exit bad }' "$tmp/adaptive"; then
    ok "simulate: adaptive never predicts more time for more budget"
else
    fail "simulate: adaptive never predicts more time for more budget" "$(cat "$tmp/o")"
fi
expect "simulate: 40% of the managed bytes (84 MiB) is planned" "$tmp/o" '^40% = 84 MiB +adaptive\('
run "$tmp/o" "$tmp/e" simulate "$SMALL" --budget 100%,128MiB --strategy knapsack --replay 6
expect_rc "simulate --replay: exits 0" 0 $rc "$tmp/e"
expect "simulate --replay: a replay column" "$tmp/o" 'limit ms +replay ms$'
expect "simulate --replay: everything resident replays at the compute time" "$tmp/o" '^100% = 210 MiB +knapsack +7\.855 +0\.000 +0\.0 +210\.0 +7\.855 +7\.855$'
awk '$1 == "128" && $3 == "knapsack" { exit !($NF > 7.855 * 1.5) } ' "$tmp/o" && ok "simulate --replay: offloading replays slower than compute" || fail "simulate --replay: offloading replays slower than compute" "$(cat "$tmp/o")"
run "$tmp/o" "$tmp/e" simulate "$SMALL" --budget 128MiB --strategy knapsack --replay 6 --offload-mode host_read
expect_rc "simulate --offload-mode host_read: exits 0" 0 $rc "$tmp/e"
expect "simulate --offload-mode host_read: nothing late, nothing faulted in" "$tmp/o" '^128 MiB +knapsack +0\.0 late +0\.0 unplanned +0\.0 fault-ins +0\.0 ordered'
expect "simulate --offload-mode host_read: nothing moves, no device block is made" "$tmp/o" '^128 MiB +knapsack .* ms in the hook +0\.0 device blocks made$'
run "$tmp/o" "$tmp/e" simulate "$SMALL" --budget 128MiB --offload-mode host_read
expect_rc "simulate --offload-mode host_read without --replay exits 2" 2 $rc "$tmp/e"
expect "simulate --offload-mode host_read without --replay says why" "$tmp/e" 'host_read needs --replay N: the timeline model plans prefetches only'
run "$tmp/o" "$tmp/e" simulate "$SMALL" --budget 128MiB --strategy knapsack --replay 6 --offload-mode redirect
expect_rc "simulate --offload-mode redirect: exits 0" 0 $rc "$tmp/e"
expect "simulate --offload-mode redirect: nothing unplanned, nothing faulted in" "$tmp/o" '^128 MiB +knapsack +[0-9.]+ late +0\.0 unplanned +0\.0 fault-ins'
expect "simulate --offload-mode redirect: device blocks made counted" "$tmp/o" '^128 MiB +knapsack .* ms in the hook +[1-9][0-9]*\.[0-9] device blocks made$'
# --set reaches the replayed engine: it logs at the level given (the replay's own is error).
run "$tmp/o" "$tmp/e" simulate "$SMALL" --budget 128MiB --strategy knapsack --replay 4
expect_not "simulate --replay: the replayed engine logs only errors" "$tmp/e" 'info: profile'
run "$tmp/o" "$tmp/e" simulate "$SMALL" --budget 128MiB --strategy knapsack --replay 4 --set LOG_LEVEL=info
expect_rc "simulate --set: exits 0" 0 $rc "$tmp/e"
expect "simulate --set LOG_LEVEL=info: the replayed engine says its plan" "$tmp/e" 'info: profile .*: 7 launches per iteration, 10 allocations; plan knapsack at 128 MiB'
# The replay plans for the whole budget, as the model did; PLAN_HEADROOM given with --set applies.
run "$tmp/o" "$tmp/e" simulate "$SMALL" --budget 128MiB --strategy knapsack --replay 4 --set LOG_LEVEL=info,PLAN_HEADROOM=8MiB
expect "simulate --set PLAN_HEADROOM=8MiB: the replayed engine plans for the budget less it" "$tmp/e" 'plan knapsack at 120 MiB'
run "$tmp/o" "$tmp/e" simulate "$SMALL" --budget 128MiB --replay 4 --set LATE_PREFETCH=soon
expect_rc "simulate --set with a bad value exits 2" 2 $rc "$tmp/e"
expect "simulate --set names the setting and the choices" "$tmp/e" "--set LATE_PREFETCH=soon: unknown choice; use one of wait, read_in_place"
run "$tmp/o" "$tmp/e" simulate "$SMALL" --budget 128MiB --replay 4 --set NO_SUCH=1
expect_rc "simulate --set with an unknown setting exits 2" 2 $rc "$tmp/e"
expect "simulate --set names the unknown setting" "$tmp/e" "--set: NO_SUCH is not a flexshim setting"
run "$tmp/o" "$tmp/e" simulate "$SMALL" --budget 128MiB --replay 3 --set TRACE_OUT="$tmp/never.json"
expect_rc "simulate --set TRACE_OUT: refused (a replay never writes it)" 2 "$rc" "$tmp/e"
expect "simulate --set TRACE_OUT: says so and what draws a replay" "$tmp/e" "--set TRACE_OUT: a replay writes no run trace or timing report; 'flexshim-profile trace FILE -o OUT.json --replay N'"
run "$tmp/o" "$tmp/e" trace "$SMALL" -o "$tmp/never.json" --budget 128MiB --replay 3 --set TIMING_REPORT=-
expect_rc "trace --set TIMING_REPORT: refused too" 2 "$rc" "$tmp/e"
run "$tmp/o" "$tmp/e" simulate "$SMALL" --budget 128MiB --set PLAN_HEADROOM=1MiB
expect_rc "simulate --set without --replay exits 2" 2 $rc "$tmp/e"
expect "simulate --set without --replay says why" "$tmp/e" "--set needs --replay N"
run "$tmp/o" "$tmp/e" simulate "$SMALL" --budget 128MiB --replay 4 --offload-mode sideways
expect_rc "simulate --offload-mode sideways exits 2" 2 $rc "$tmp/e"
expect "simulate --offload-mode sideways names the modes" "$tmp/e" "--offload-mode 'sideways': unknown choice; use one of prefetch, host_read, redirect"
run "$tmp/o" "$tmp/e" simulate "$SMALL" --budget 40MiB --strategy greedy --replay 4
expect "simulate --replay: an infeasible plan has no replay" "$tmp/o" '^40 MiB +greedy +infeasible( +-){5}$'

# 4. trace
run "$tmp/o" "$tmp/e" trace "$SMALL" -o "$tmp/plan.json"
expect_rc "trace: exits 0" 0 $rc "$tmp/e"
expect "trace: says what it wrote" "$tmp/o" "^wrote $tmp/plan\.json: 24 events \(7 launches, 5 prefetches, 5 write-backs; predicted 20\.982 ms, stall 13\.127 ms\)$"
json_ok "$tmp/plan.json" && ok "trace: the file is JSON" || fail "trace: the file is JSON" "$(cat "$tmp/json_err")"
cat >"$tmp/check_trace.py" <<'EOF'
# check_trace.py TRACE NLAUNCHES PREDICTED_MS: the trace's structure; prints what is wrong.
import json, sys
d = json.load(open(sys.argv[1]))
n, predicted = int(sys.argv[2]), float(sys.argv[3])
bad = []
if d.get("displayTimeUnit") != "ms":
    bad.append("displayTimeUnit is not ms")
ev = d["traceEvents"]
procs = [e for e in ev if e["ph"] == "M" and e["name"] == "process_name"]
if [e["args"]["name"] for e in procs] != ["flexshim plan"]:
    bad.append("process name: %r" % procs)
lanes = {e["tid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
if sorted(lanes.values()) != sorted(["compute", "host to device", "device to host"]):
    bad.append("lanes: %r" % lanes)
tid = {v: k for k, v in lanes.items()}
xs = [e for e in ev if e["ph"] == "X"]
for e in xs:
    if not all(k in e for k in ("name", "ts", "dur", "pid", "tid")) or e["dur"] < 0 or e["ts"] < 0:
        bad.append("malformed event %r" % e)
comp = [e for e in xs if e["tid"] == tid.get("compute")]
if sorted(e["args"]["launch"] for e in comp) != list(range(n)):
    bad.append("compute events are not one per launch: %r" % [e["args"]["launch"] for e in comp])
comp.sort(key=lambda e: e["ts"])
for a, b in zip(comp, comp[1:]):
    if b["ts"] < a["ts"] + a["dur"] - 1e-6:
        bad.append("launches overlap: %s, %s" % (a["args"]["launch"], b["args"]["launch"]))
if comp and abs(comp[-1]["ts"] + comp[-1]["dur"] - predicted * 1000) > 1:
    bad.append("last launch ends at %f us, predicted %f ms" % (comp[-1]["ts"] + comp[-1]["dur"], predicted))
for lane, word in (("host to device", "prefetch"), ("device to host", "write-back")):
    for e in xs:
        if e["tid"] == tid.get(lane) and not e["name"].startswith(word + " alloc "):
            bad.append("%s event named %r" % (lane, e["name"]))
if any(not isinstance(e["args"].get("refs"), list) for e in comp):
    bad.append("a compute event without refs")
print("\n".join(bad))
sys.exit(1 if bad else 0)
EOF
python3 "$tmp/check_trace.py" "$tmp/plan.json" 7 20.982 >"$tmp/why" 2>&1 && ok "trace: three lanes, one compute event per launch, times match the prediction" || fail "trace: three lanes, one compute event per launch, times match the prediction" "$(cat "$tmp/why")"
grep -q '"name":"prefetch alloc 1 (64.0 MiB)"' "$tmp/plan.json" && ok "trace: prefetch named by allocation and size" || fail "trace: prefetch named by allocation and size" "$(head -c 600 "$tmp/plan.json")"
grep -q '"name":"gemm_bf16_128x128"' "$tmp/plan.json" && grep -q '"name":"0xdeadbeefcafef00d"' "$tmp/plan.json" && ok "trace: launches named by kernel name, else hash" || fail "trace: launches named by kernel name, else hash"
run "$tmp/o" "$tmp/e" trace "$NOPLAN" -o "$tmp/replan.json" --budget 100% --strategy greedy
expect_rc "trace: re-plans with --budget and --strategy" 0 $rc "$tmp/e"
expect "trace: a plan keeping everything resident moves nothing" "$tmp/o" 'events \(7 launches, 0 prefetches, 0 write-backs; predicted 7\.855 ms, stall 0\.000 ms\)$'
python3 "$tmp/check_trace.py" "$tmp/replan.json" 7 7.855 >"$tmp/why" 2>&1 && ok "trace: re-planned trace is well formed" || fail "trace: re-planned trace is well formed" "$(cat "$tmp/why")"
run "$tmp/o" "$tmp/e" trace "$SMALL" -o "$tmp/b.json" --budget 128MiB
expect "trace: --budget alone keeps the saved plan's strategy" "$tmp/e" 'planning with adaptive at budget 128 MiB'
expect "trace: --budget alone: the new plan's prediction" "$tmp/o" 'predicted 18\.495 ms, stall 10\.640 ms\)$'
# The plan as flexshim's engine ran it on the simulated device (the last replayed iteration).
run "$tmp/o" "$tmp/e" trace "$SMALL" -o "$tmp/replay.json" --budget 128MiB --replay 6
expect_rc "trace --replay: exits 0" 0 $rc "$tmp/e"
expect "trace --replay: says what it drew" "$tmp/o" "^wrote $tmp/replay\.json: [0-9]+ events \(7 launches, [1-9][0-9]* copies in: prefetches and fault-ins, [0-9]+ write-backs, [0-9]+ waits in the launch hook; the last of 6 replayed iterations, median [0-9.]+ ms; timeline model 18\.495 ms\)$"
run "$tmp/o" "$tmp/e" trace "$SMALL" -o "$tmp/replay-redirect.json" --budget 128MiB --replay 6 --offload-mode redirect --set PLAN_HEADROOM=1MiB
expect_rc "trace --replay --offload-mode redirect --set: exits 0" 0 $rc "$tmp/e"
python3 -c 'import json, sys; o = json.load(open(sys.argv[1]))["otherData"]; sys.exit(o.get("replay_offload_mode") != "redirect" or o.get("replay_settings") != "PLAN_HEADROOM=1MiB")' "$tmp/replay-redirect.json" &&
    ok "trace --replay: the trace names the replay's offload mode and settings" ||
    fail "trace --replay: the trace names the replay's offload mode and settings" "$(head -c 400 "$tmp/replay-redirect.json")"
run "$tmp/o" "$tmp/e" trace "$SMALL" -o "$tmp/x.json" --offload-mode redirect
expect_rc "trace --offload-mode redirect without --replay exits 2" 2 $rc "$tmp/e"
expect "trace --offload-mode redirect without --replay says why" "$tmp/e" 'redirect needs --replay N: the timeline model plans prefetches only'
run "$tmp/o" "$tmp/e" trace "$SMALL" -o "$tmp/x.json" --replay 6 --set NO_SUCH=1
expect_rc "trace --set with an unknown setting exits 2" 2 $rc "$tmp/e"
cat >"$tmp/check_replay.py" <<'EOF'
# check_replay.py TRACE NLAUNCHES: a replay trace's structure; prints what is wrong.
import json, sys
d = json.load(open(sys.argv[1]))
n = int(sys.argv[2])
bad = []
ev = d["traceEvents"]
procs = [e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"]
if procs != ["flexshim plan, replayed"]:
    bad.append("process name: %r" % procs)
lanes = {e["tid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
want = ["compute", "host to device", "device to host", "program's thread in the launch hook"]
if sorted(lanes.values()) != sorted(want):
    bad.append("lanes: %r" % lanes)
tid = {v: k for k, v in lanes.items()}
xs = [e for e in ev if e["ph"] == "X"]
comp = sorted((e for e in xs if e["tid"] == tid.get("compute")), key=lambda e: e["ts"])
# One stream in this profile: one event per launch, in order, one after another.
if [e["args"]["launch"] for e in comp] != list(range(n)):
    bad.append("compute events are not one per launch in order: %r" % [e["args"]["launch"] for e in comp])
for a, b in zip(comp, comp[1:]):
    if b["ts"] < a["ts"] + a["dur"] - 1e-6:
        bad.append("launches overlap: %s, %s" % (a["args"]["launch"], b["args"]["launch"]))
median = d["otherData"].get("replay_median_ms")
if not isinstance(median, float) or median <= 0:
    bad.append("no replay median: %r" % d["otherData"])
copies = [e for e in xs if e["tid"] == tid.get("host to device")]
if not copies or any(not (e["name"].startswith("prefetch alloc ") or
                         e["name"].startswith("fault-in alloc ")) for e in copies):
    bad.append("copies in: %r" % [e["name"] for e in copies])
for e in copies:  # the profile's link: 25 GB/s plus its latency per copy
    want_us = e["args"]["bytes"] / 25e3
    if not want_us <= e["dur"] <= want_us + 50:
        bad.append("a copy of %d bytes takes %f us" % (e["args"]["bytes"], e["dur"]))
waits = [e for e in xs if e["tid"] == tid.get("program's thread in the launch hook")]
if any(e["dur"] <= 0 or not 0 <= e["args"]["launch"] < n for e in waits):
    bad.append("waits: %r" % waits)
print("\n".join(bad))
sys.exit(1 if bad else 0)
EOF
python3 "$tmp/check_replay.py" "$tmp/replay.json" 7 >"$tmp/why" 2>&1 && ok "trace --replay: four lanes, one compute event per launch in order, copies named and timed" || fail "trace --replay: four lanes, one compute event per launch in order, copies named and timed" "$(cat "$tmp/why")"
run "$tmp/o" "$tmp/e" trace "$SMALL" -o "$tmp/inf.json" --budget 40MiB
expect_rc "trace: an infeasible budget exits 1" 1 $rc "$tmp/e"
expect "trace: an infeasible budget names the smallest feasible one" "$tmp/e" 'no plan within 40 MiB: the allocations in use across launch 1 need 80 MiB'
[ ! -e "$tmp/inf.json" ] && ok "trace: nothing written on failure" || fail "trace: nothing written on failure"
run "$tmp/o" "$tmp/e" trace "$NOPLAN" -o "$tmp/np.json"
expect_rc "trace: no saved plan and no --budget exits 1" 1 $rc "$tmp/e"
expect "trace: no saved plan says what to give" "$tmp/e" 'has no saved plan; give --budget SIZE'
run "$tmp/o" "$tmp/e" trace "$SMALL" -o "$tmp/nodir/x.json"
expect_rc "trace: an unwritable output exits 1" 1 $rc "$tmp/e"
expect "trace: an unwritable output is named" "$tmp/e" "cannot write $tmp/nodir/x\.json: No such file or directory"
ls "$tmp" | grep -q '\.tmp\.' && fail "trace: no temporary files left" "$(ls "$tmp")" || ok "trace: no temporary files left"

# 5. usage: exit 2 with one line naming the argument; --help exits 0
usage_case() { # NAME PATTERN ARGS...
    local name=$1 pat=$2; shift 2
    run "$tmp/o" "$tmp/e" "$@"
    expect_rc "usage: $name exits 2" 2 $rc "$tmp/e"
    expect "usage: $name says what is accepted" "$tmp/e" "$pat"
}
usage_case "no command" '^usage: flexshim-profile COMMAND'
usage_case "unknown command" "unknown command 'frobnicate'" frobnicate
usage_case "check without FILE" 'check: no profile FILE given' check
usage_case "check with two files" "check: unexpected argument 'b': check takes one profile FILE" check a b
usage_case "unknown option" "show: unknown option '--budget'; show accepts --help" show --budget 1GiB "$SMALL"
usage_case "simulate without --budget" 'simulate: --budget is required' simulate "$SMALL"
usage_case "simulate with a malformed size" "simulate: --budget '8XB' is not a size; use bytes with an optional unit .*8GiB.*60%" simulate "$SMALL" --budget 1GiB,8XB
usage_case "simulate with a percentage over 100" "simulate: --budget '150%': a percentage of the managed bytes must be more than 0% and at most 100%" simulate "$SMALL" --budget 150%
usage_case "simulate with an empty size" "has an empty size" simulate "$SMALL" --budget 1GiB,
usage_case "simulate with an unknown strategy" "simulate: --strategy 'fast' is not a strategy; use one of adaptive, knapsack, greedy, global or all" simulate "$SMALL" --budget 1GiB --strategy fast
usage_case "option without its value" 'simulate: option --budget needs a value' simulate "$SMALL" --budget
usage_case "simulate --replay out of range" "simulate: --replay '2' is not a number of iterations from 3 to 1000" simulate "$SMALL" --budget 1GiB --replay 2
usage_case "trace --replay out of range" "trace: --replay 'x' is not a number of iterations from 3 to 1000" trace "$SMALL" -o "$tmp/x.json" --replay x
usage_case "trace without -o" 'trace: -o OUT.json is required' trace "$SMALL"
usage_case "trace with several budgets" "trace: --budget '1GiB,2GiB': give one size here" trace "$SMALL" -o "$tmp/x.json" --budget 1GiB,2GiB
usage_case "trace with strategy all" "trace: --strategy 'all' is not a strategy" trace "$SMALL" -o "$tmp/x.json" --strategy all
run "$tmp/o" "$tmp/e" simulate --budget 1GiB "$tmp/none.json"
expect_rc "usage is checked before the file is read, then a missing file exits 1" 1 $rc "$tmp/e"
for c in check show simulate trace; do
    run "$tmp/o" "$tmp/e" $c --help
    [ $rc = 0 ] && grep -q "^usage: flexshim-profile $c" "$tmp/o" && ok "$c --help exits 0 with the usage" || fail "$c --help exits 0 with the usage" "exit $rc: $(cat "$tmp/o" "$tmp/e")"
done
run "$tmp/o" "$tmp/e" simulate --help
expect "simulate --help: a model, not a GPU run" "$tmp/o" 'not a run on a GPU'
expect "simulate --help: percent of the managed bytes" "$tmp/o" "percent of the profile's managed bytes, the sum"
run "$tmp/o" "$tmp/e" --help
for c in check show simulate trace config; do
    expect "usage lists $c" "$tmp/o" "^  $c "
done

# Under the sanitizer build the shim needs the ASan runtime preloaded first in the child.
asan_preload=
[ "${SAN:-}" = 1 ] && asan_preload="$(${CC:-gcc} -print-file-name=libasan.so)"
# record: usage errors, and a program whose iteration is never found (no GPU here) writes no
# profile and says what to do.
"$TOOL" record -o "$tmp/r.json" >"$tmp/o" 2>&1; rc=$?
expect_rc "record: no command exits 2" 2 $rc "$tmp/o"
"$TOOL" record --lib /nonexistent/libflexshim.so -- true >"$tmp/o" 2>&1; rc=$?
expect_rc "record: a missing --lib exits 2" 2 $rc "$tmp/o"
(cd "$tmp" && env -u FLEXTENSOR_LOG_LEVEL FLEXTENSOR_CONFIG= LD_PRELOAD="$asan_preload" "$TOOL" record -o r.json -- true) >"$tmp/o" 2>&1; rc=$?
expect_rc "record: no profile written exits 1" 1 $rc "$tmp/o"
expect "record: says no profile was written" "$tmp/o" 'no profile was written \(the command exited 0\)'
expect "record: preloads the library beside the tool" "$tmp/o" "running true with .*/libflexshim.so; profile: $tmp/r.json"
(cd "$tmp" && FLEXTENSOR_CONFIG= LD_PRELOAD="$asan_preload" "$TOOL" record -- false) >"$tmp/o" 2>&1; rc=$?
expect_rc "record: the command's exit code is kept" 1 $rc "$tmp/o"

# bench/overhead.sh without a GPU (FAKE=1: made-up numbers, nothing preloaded): rounds, ratio.
echo '{}' > "$tmp/prof.json"
FAKE=1 PROFILE="$tmp/prof.json" OUT="$tmp/ovh" ROUNDS=2 SIDES="noshim shim watch" bash bench/overhead.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "overhead.sh FAKE=1 exits 0" 0 $rc "$tmp/o"
expect "overhead.sh: two rounds, a ratio" "$tmp/o" '^shim [0-9.]+ ms \(median of 2 runs\): ratio [0-9.]+'
expect "overhead.sh: the watching side too" "$tmp/o" '^watch [0-9.]+ ms \(median of 2 runs\): ratio [0-9.]+'
expect "overhead.sh: compares the outputs" "$tmp/o" '^outputs identical in all 6 runs$'
expect "overhead.sh: start-up per side" "$tmp/o" '^start-up \(median time to the first step.s end\): noshim [0-9.]+ s; shim [0-9.]+ s \([0-9.]+ x\); watch'
expect "overhead.sh: each side's 10th-percentile step" "$tmp/o" '^10th-percentile step \(median over runs\): noshim [0-9.]+ ms; shim [0-9.]+ ms \([0-9.]+\); watch [0-9.]+ ms'
expect "overhead.sh: each side's pooled steps" "$tmp/o" '^pooled: watch +56 steps: pooled p5 [0-9.]+ \([0-9.]+\)'
expect "overhead.sh: each side's host time to queue a step" "$tmp/o" '^host time to queue a step \(median over runs; near the step: host-bound\): noshim [0-9.]+ ms; shim [0-9.]+ ms \([0-9.]+\)'
expect "overhead.sh: the queueing thread's CPU time per side" "$tmp/o" '^the queueing thread.s CPU time a step \(median over runs; .*\): noshim [0-9.]+ ms; shim [0-9.]+ ms \([0-9.]+\); watch'
expect "overhead.sh: the process's CPU time per side" "$tmp/o" '^the whole process.s CPU time in that span \(median over runs; .*\): noshim [0-9.]+ ms; shim [0-9.]+ ms \([0-9.]+\); watch'
expect "overhead.sh: the queueing thread's blocks, preemptions and faults per side" "$tmp/o" '^the queueing thread a step \(median over runs\): noshim 1 blocks, 0 preemptions, 2 minor faults; shim 1 blocks'
expect_not "overhead.sh without --cpu-probe: no probe lines" "$tmp/o" 'CPU probe'

# ROTATE=1: round 2 starts with the second side; --cpu-probe: the host's speed taken out of the
# step (made-up numbers, the same every time: the fake shim's probe 1.02 x noshim's, its step
# 1.019 x, so 0.999 x over the probe; its instructions follow its step; 2 more timer interrupts).
FAKE=1 ROTATE=1 BENCH_ARGS=--cpu-probe PROFILE="$tmp/prof.json" OUT="$tmp/ovr" ROUNDS=2 SIDES="noshim shim" bash bench/overhead.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "overhead.sh ROTATE=1 --cpu-probe exits 0" 0 $rc "$tmp/o"
grep '^---- round' "$tmp/o" | sed 's/ (.*//' | tr '\n' ' ' >"$tmp/o2"
expect "overhead.sh ROTATE=1: round 2 starts with shim" "$tmp/o2" '^---- round 1/2: noshim ---- round 1/2: shim ---- round 2/2: shim ---- round 2/2: noshim $'
expect "overhead.sh --cpu-probe: the host's speed per side" "$tmp/o" '^host speed: the CPU probe beside each step \(median over runs; .*\): noshim 1\.00 ms; shim 1\.02 ms \(1\.020\)$'
expect "overhead.sh --cpu-probe: the step over the probe, near 1 x noshim's" "$tmp/o" '^step over the CPU probe \(median over runs: .*\): noshim [0-9.]+ probes; shim [0-9.]+ probes \(0\.999\)$'
expect "overhead.sh --cpu-probe: the host's counters per side" "$tmp/o" '^the host beside the steps, a step \(median over runs; .*\): noshim irqs LOC 20, steal_ms 0\.5; shim irqs LOC 22, steal_ms 0\.5$'
expect "overhead.sh --cpu-probe: the queueing thread's instructions per side" "$tmp/o" '^the queueing thread.s M instructions \(user\) a step \(median over runs\): noshim 101\.16; shim 103\.05 \(1\.019\)$'
expect "overhead.sh --cpu-probe: its migrations" "$tmp/o" '^the queueing thread.s CPU migrations a step \(median over runs\): noshim 0\.00; shim 0\.00$'
expect_not "overhead.sh --cpu-probe: no line for a counter no run has" "$tmp/o" 'M cycles'
expect "overhead.sh --cpu-probe: the quiet steps beside noshim's" "$tmp/o" '^pooled: quiet: shim +[0-9]+ of [0-9]+ steps with both CPU probes within 5% .*p50 [0-9.]+ \([0-9.]+\)$'
FAKE=1 ROTATE=1 PROFILE="$tmp/prof.json" OUT="$tmp/ovr" ROUNDS=1 SIDES="noshim pipeline" bash bench/overhead.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "overhead.sh ROTATE=1 with pipeline: refused" 2 $rc "$tmp/o"
expect "overhead.sh ROTATE=1 with pipeline: says why" "$tmp/o" 'ROTATE=1 with side pipeline: .*leave ROTATE out'

# ITERS at most the warm-up: every step is a warm-up one, and the summary still prints (it raised
# on the thread counters' empty medians before).
FAKE=1 PROFILE="$tmp/prof.json" OUT="$tmp/ovw" ROUNDS=1 ITERS=4 SIDES="noshim shim" bash bench/overhead.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "overhead.sh ITERS=4 (no step after the warm-up) exits 0" 0 $rc "$tmp/o"
expect "overhead.sh ITERS=4: each side's run and ratio" "$tmp/o" '^shim [0-9.]+ ms \(median of 1 runs\): ratio [0-9.]+'
expect_not "overhead.sh ITERS=4: no traceback" "$tmp/o" 'Traceback'
expect "overhead.sh ITERS=4: pooled_steps.py says why it has nothing" "$tmp/o" 'no noshim-\*\.json with steps after the warm-up ones'

# bench.py --host-check: the CPU probe alone, quiet (exit 0) or noisy (exit 3) by p90/p10 (made-up
# probes under --fake); overhead.sh HOST_CHECK=S says it before the rounds, which run either way.
python3 bench/bench.py --host-check 1 --fake >"$tmp/o" 2>&1; rc=$?
expect_rc "bench.py --host-check on a steady host: exit 0" 0 $rc "$tmp/o"
expect "bench.py --host-check: quiet" "$tmp/o" '^host check: 20 CPU probes over 1 s: p10 1\.000 ms, p50 1\.000, p90 1\.000; p90/p10 1\.000: quiet \(noisy above 1\.1\)$'
python3 bench/bench.py --host-check 1 --fake --fake-probes 1,1,1,1,1,1,1,1,1.3,1.3 >"$tmp/o" 2>&1; rc=$?
expect_rc "bench.py --host-check with probes 1.3 x in a fifth of them: exit 3" 3 $rc "$tmp/o"
expect "bench.py --host-check: noisy, and what to read then" "$tmp/o" 'p90 1\.300; p90/p10 1\.300: NOISY \(noisy above 1\.1; read the A/B.s quiet-step lines'
python3 bench/bench.py --host-check 1 --host-noisy 1.5 --fake --fake-probes 1,1,1,1,1,1,1,1,1.3,1.3 >"$tmp/o" 2>&1; rc=$?
expect_rc "bench.py --host-check --host-noisy 1.5: the same probes are quiet" 0 $rc "$tmp/o"
python3 bench/bench.py --host-check 0 --fake >"$tmp/o" 2>&1; rc=$?
expect_rc "bench.py --host-check 0: refused" 2 $rc "$tmp/o"
expect "bench.py --host-check 0: says what it takes" "$tmp/o" 'error: --host-check 0: seconds, more than 0 and at most 600'
python3 bench/bench.py --host-check 1 --fake --fake-probes 1,x >"$tmp/o" 2>&1; rc=$?
expect_rc "bench.py --fake-probes 1,x: refused" 2 $rc "$tmp/o"
FAKE=1 HOST_CHECK=1 PROFILE="$tmp/prof.json" OUT="$tmp/ovc" ROUNDS=1 ITERS=6 SIDES="noshim shim" bash bench/overhead.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "overhead.sh HOST_CHECK=1 exits 0" 0 $rc "$tmp/o"
head -1 "$tmp/o" >"$tmp/o2"
expect "overhead.sh HOST_CHECK=1: the host check first" "$tmp/o2" '^host check: 20 CPU probes over 1 s: .*: quiet'
expect "overhead.sh HOST_CHECK=1: then the rounds" "$tmp/o" '^round 1 shim +median step'
FAKE=1 HOST_CHECK=soon PROFILE="$tmp/prof.json" OUT="$tmp/ovc" ROUNDS=1 ITERS=6 SIDES="noshim shim" bash bench/overhead.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "overhead.sh HOST_CHECK=soon: refused" 2 $rc "$tmp/o"
expect "overhead.sh HOST_CHECK=soon: names the setting" "$tmp/o" 'overhead.sh: HOST_CHECK=soon: the host check failed \(exit 2\)'

# SAMPLES=1: every run writes its samples (made up under FAKE: the shim's sides 1 ms more a step in
# cuLaunchKernel), and bench/sample_report.py finds that millisecond in them.
FAKE=1 SAMPLES=1 PROFILE="$tmp/prof.json" OUT="$tmp/ovs" ROUNDS=2 SIDES="noshim shim" bash bench/overhead.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "overhead.sh SAMPLES=1 FAKE=1 exits 0" 0 $rc "$tmp/o"
ls "$tmp/ovs" | grep -c '\.samples$' >"$tmp/o"
expect "overhead.sh SAMPLES=1: one samples file a run" "$tmp/o" '^4$'
python3 bench/sample_report.py "$tmp/ovs" >"$tmp/o" 2>&1; rc=$?
expect_rc "sample_report.py on overhead.sh's samples exits 0" 0 $rc "$tmp/o"
expect "sample_report.py: the shim's extra millisecond a step, in cuLaunchKernel" "$tmp/o" '^ +\+1\.000 +5\.000 +4\.000 .*libcuda\.so\.1!cuLaunchKernel$'
# bench/pooled_steps.py on that output: every side's pooled percentiles against noshim's.
python3 bench/pooled_steps.py "$tmp/ovh" shim=plain >"$tmp/o" 2>&1; rc=$?
expect_rc "pooled_steps.py exits 0" 0 $rc "$tmp/o"
expect "pooled_steps.py: noshim against itself" "$tmp/o" '^noshim +56 steps: pooled p5 [0-9.]+ \(1\.000\)'
expect "pooled_steps.py: a renamed side, every statistic" "$tmp/o" '^plain +56 steps: pooled p5 [0-9.]+ \([0-9.]+\), p10 [0-9.]+ \([0-9.]+\), p25 [0-9.]+ \([0-9.]+\), p50 [0-9.]+ \([0-9.]+\); best run.s p10 [0-9.]+ \([0-9.]+\)$'
echo '{"step_ms": [1.0], "warmup' >"$tmp/ovh/shim-9.json" # a run cut short
python3 bench/pooled_steps.py "$tmp/ovh" >"$tmp/o" 2>&1; rc=$?
expect_rc "pooled_steps.py: a half-written result is skipped" 0 $rc "$tmp/o"
expect "pooled_steps.py: and named" "$tmp/o" 'shim-9.json: skipped, not a bench.py result'
expect "pooled_steps.py: the other runs still count" "$tmp/o" '^shim +56 steps: pooled p5'
rm -f "$tmp/ovh/shim-9.json"
# --cpu-probe runs: the "quiet:" lines keep the steps whose probes before and after are near the
# host's fastest. Made up: noshim's steps 10 ms where the probe is 1 ms and 20 where it is 2; the
# shim's 11 and 22, most of them in the slow stretch. All steps pooled: p50 2.2 x; quiet: 1.1 x.
mkdir -p "$tmp/ovq"
printf '{"warmup_steps": 1, "step_ms": [9, 10, 10, 10, 20, 20], "cpu_probe_ms": [1, 1, 1, 1, 2, 2]}' >"$tmp/ovq/noshim-1.json"
printf '{"warmup_steps": 1, "step_ms": [9, 11, 11, 11, 22, 22, 22, 22], "cpu_probe_ms": [1, 1, 1, 1, 2, 2, 2, 2]}' >"$tmp/ovq/shim-1.json"
printf '{"warmup_steps": 1, "step_ms": [9, 11, 11, 22], "cpu_probe_ms": [1, 1, 2, 2]}' >"$tmp/ovq/few-1.json"
python3 bench/pooled_steps.py "$tmp/ovq" >"$tmp/o" 2>&1; rc=$?
expect_rc "pooled_steps.py --cpu-probe runs: exits 0" 0 $rc "$tmp/o"
expect "pooled_steps.py: all steps pooled, the shim 2.2 x at p50" "$tmp/o" '^shim +7 steps: .* p50 22\.00 \(2\.200\)'
expect "pooled_steps.py: noshim's quiet steps" "$tmp/o" '^quiet: noshim +3 of 5 steps with both CPU probes within 5% of the host.s fastest \(<= 1\.050 ms\): p10 10\.00 \(1\.000\), p50 10\.00 \(1\.000\)$'
expect "pooled_steps.py: the shim's quiet steps, 1.1 x" "$tmp/o" '^quiet: shim +3 of 7 steps .*: p10 11\.00 \(1\.100\), p50 11\.00 \(1\.100\)$'
expect "pooled_steps.py: a side with too few quiet steps" "$tmp/o" '^quiet: few +1 of 3 steps .*: too few$'
python3 bench/pooled_steps.py "$tmp/ovq" --quiet 150 >"$tmp/o" 2>&1; rc=$?
expect_rc "pooled_steps.py --quiet 150: refused" 1 $rc "$tmp/o"
expect "pooled_steps.py --quiet 150: says what it takes" "$tmp/o" '^pooled_steps.py: --quiet PCT: a percent from 0 to 100'
printf '{"warmup_steps": 1, "step_ms": [9, 30, 30, 30, 30], "cpu_probe_ms": [2, 2, 2, 2, 2]}' >"$tmp/ovq/noshim-1.json"
python3 bench/pooled_steps.py "$tmp/ovq" >"$tmp/o" 2>&1; rc=$?
expect_rc "pooled_steps.py: no quiet noshim step still exits 0" 0 $rc "$tmp/o"
expect "pooled_steps.py: and says noshim has too few quiet steps" "$tmp/o" '^quiet: noshim has 0 steps .*: too few to compare against$'
python3 bench/pooled_steps.py "$tmp/ovh" >"$tmp/o" 2>&1
expect_not "pooled_steps.py without --cpu-probe: no quiet lines" "$tmp/o" '^quiet:'
python3 bench/pooled_steps.py "$tmp/no-such-dir" >"$tmp/o" 2>&1; rc=$?
expect_rc "pooled_steps.py: no such directory" 1 $rc "$tmp/o"
FAKE=1 PROFILE="$tmp/prof.json" OUT="$tmp/ovh" ROUNDS=1 SIDES="noshim alt1" ALT_LIBS=/x.so bash bench/overhead.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "overhead.sh: another build as side alt1" 0 $rc "$tmp/o"
expect "overhead.sh: alt1's ratio" "$tmp/o" '^alt1 [0-9.]+ ms \(median of 1 runs\): ratio [0-9.]+'
FAKE=1 PROFILE="$tmp/prof.json" OUT="$tmp/ovh" ROUNDS=1 SIDES="noshim entry entrycheck" bash bench/overhead.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "overhead.sh: the entry-point probe's sides" 0 $rc "$tmp/o"
expect "overhead.sh: entrycheck's ratio" "$tmp/o" '^entrycheck [0-9.]+ ms \(median of 1 runs\): ratio [0-9.]+'
FAKE=1 PROFILE="$tmp/prof.json" OUT="$tmp/ovh" ROUNDS=1 SIDES="noshim shim:STRATEGY=greedy,PLAN_HEADROOM=1GiB" bash bench/overhead.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "overhead.sh: a side with settings" 0 $rc "$tmp/o"
expect "overhead.sh: the side with settings has its ratio" "$tmp/o" '^shim:STRATEGY=greedy,PLAN_HEADROOM=1GiB [0-9.]+ ms \(median of 1 runs\): ratio'
[ -f "$tmp/ovh/shim_STRATEGY_greedy_PLAN_HEADROOM_1GiB-1.json" ] && ok "overhead.sh: the side's files are named with _" || fail "overhead.sh: the side's files are named with _" "$(ls "$tmp/ovh")"
rm -rf "$tmp/ovp"
FAKE=1 PROFILE="$tmp/prof.json" OUT="$tmp/ovp" ROUNDS=2 SIDES="noshim shim" BENCH_ARGS="--op-profile 4" bash bench/overhead.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "overhead.sh: --op-profile through BENCH_ARGS" 0 $rc "$tmp/o"
python3 bench/op_profile_diff.py "$tmp/ovp" >"$tmp/o" 2>&1; rc=$?
expect_rc "op_profile_diff.py exits 0" 0 $rc "$tmp/o"
expect "op_profile_diff.py: the side's total against noshim's" "$tmp/o" '^shim against noshim \(2 and 2 runs\): 3 ops in both, self CPU a step 8100 us against 7800 us \(\+300 us\)$'
expect "op_profile_diff.py: the op that differs comes first" "$tmp/o" '^ +\+300\.0 us +3300\.0 against +3000\.0 us a step, 224 against 224 calls +aten::mm$'
rm -f "$tmp"/ovp/noshim-*.json
python3 bench/op_profile_diff.py "$tmp/ovp" >"$tmp/o" 2>&1; rc=$?
expect_rc "op_profile_diff.py without noshim runs exits 1" 1 $rc "$tmp/o"
expect "op_profile_diff.py: says how to get them" "$tmp/o" 'no noshim run with op_cpu_us in .*--op-profile 8'
FAKE=1 PROFILE="$tmp/prof.json" OUT="$tmp/ovh" ROUNDS=1 PCT=50 WORKLOAD=prefill SIDES="noshim pipeline shim" \
    BENCH_ARGS="--layer-times 2" bash bench/overhead.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "overhead.sh: the pipeline as a side" 0 $rc "$tmp/o"
expect "overhead.sh: the pipeline's ratio" "$tmp/o" '^pipeline [0-9.]+ ms \(median of 1 runs\): ratio [0-9.]+'
[ "$(python3 -c 'import sys; sys.path.insert(0, "bench"); import bench; print(bench.headroom_from(sys.argv[1], "7b", "prefill", None)[0])' "$tmp/ovh/pipeline-1.noshim.jsonl" 2>&1)" = 3221225472 ] \
    && ok "overhead.sh: the pipeline's headroom is the round's noshim headroom" \
    || fail "overhead.sh: the pipeline's headroom is the round's noshim headroom" "$(cat "$tmp/ovh/pipeline-1.noshim.jsonl")"
FAKE=1 PROFILE="$tmp/prof.json" OUT="$tmp/ovh" SIDES="pipeline noshim" bash bench/overhead.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "overhead.sh: the pipeline before noshim exits 2" 2 $rc "$tmp/o"
expect "overhead.sh: says noshim must come first" "$tmp/o" 'pipeline takes its headroom from the round.s noshim run: put noshim first'
FAKE=1 PROFILE="$tmp/prof.json" OUT="$tmp/ovh" SIDES="noshim shim:strategy" bash bench/overhead.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "overhead.sh: a setting that is not KEY=VALUE exits 2" 2 $rc "$tmp/o"
expect "overhead.sh: says what a setting must look like" "$tmp/o" "side shim:strategy: 'strategy' is not KEY=VALUE"
FAKE=1 PROFILE="$tmp/prof.json" OUT="$tmp/ovh" SIDES="noshim alt1 alt2" ALT_LIBS=/x.so bash bench/overhead.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "overhead.sh: alt2 without a second library exits 2" 2 $rc "$tmp/o"
expect "overhead.sh: says which word of ALT_LIBS is missing" "$tmp/o" 'side alt2 needs word 2 of ALT_LIBS to be a libflexshim.so that exists \(ALT_LIBS=/x.so\)'
FAKE=1 PROFILE="$tmp/prof.json" OUT="$tmp/ovh" ROUNDS=1 WORKLOAD=prefill bash bench/overhead.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "overhead.sh: WORKLOAD=prefill" 0 $rc "$tmp/o"
[ "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["workload"])' "$tmp/ovh/shim-1.json" 2>&1)" = prefill ] \
    && ok "overhead.sh: WORKLOAD=prefill runs prefill" || fail "overhead.sh: WORKLOAD=prefill runs prefill" "$(cat "$tmp/ovh/shim-1.json")"
# overhead.sh TIME_LIMIT: no run starts that the longest so far says would not end in time (fake
# runs of 2 to 3 s, a limit of 6 s: two runs, then one not started; where both took 2 s to the
# second, as the shell counts them, a third starts and is stopped at the limit), and the summary
# covers the runs made.
FAKE=1 TIME_LIMIT=6 BENCH_ARGS="--fake-sleep 2" PROFILE="$tmp/prof.json" OUT="$tmp/ovt" ROUNDS=4 SIDES="noshim shim" bash bench/overhead.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "overhead.sh: TIME_LIMIT cutting the runs short exits 124" 124 $rc "$tmp/o"
expect "overhead.sh: TIME_LIMIT says which run it did not start (or stopped)" "$tmp/o" "^---- TIME_LIMIT=6: round [0-9]'s (noshim|shim) (not started \([0-9-]+ s left, a run has taken up to [0-9]+ s\)|stopped at the limit)"
expect "overhead.sh: TIME_LIMIT still gives the ratio of the runs made" "$tmp/o" '^shim [0-9.]+ ms \(median of 1 runs\): ratio [0-9.]+'
expect "overhead.sh: TIME_LIMIT names the runs not made" "$tmp/o" '^round 4 shim   no result$'
[ ! -e "$tmp/ovt/noshim-4.json" ] && [ ! -e "$tmp/ovt/noshim-4.out" ] &&
    ok "overhead.sh: TIME_LIMIT starts no run past it" || fail "overhead.sh: TIME_LIMIT starts no run past it" "$(ls "$tmp/ovt")"
# A run still going at the limit is stopped, and leaves no result. The limit leaves the script's
# setup time to start the first run even on a loaded machine (with TIME_LIMIT=1 it once did not).
FAKE=1 TIME_LIMIT=3 BENCH_ARGS="--fake-sleep 6" PROFILE="$tmp/prof.json" OUT="$tmp/ovt2" ROUNDS=1 SIDES="noshim shim" bash bench/overhead.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "overhead.sh: a run stopped at TIME_LIMIT exits 124" 124 $rc "$tmp/o"
expect "overhead.sh: and says so" "$tmp/o" "^---- TIME_LIMIT=3: round 1's noshim stopped at the limit"
[ ! -e "$tmp/ovt2/noshim-1.json" ] && ! grep -q 'OUTPUTS DIFFER' "$tmp/o" &&
    ok "overhead.sh: the stopped run leaves no result, and no outputs are not outputs that differ" ||
    fail "overhead.sh: the stopped run leaves no result, and no outputs are not outputs that differ" "$(cat "$tmp/o")"
FAKE=1 TIME_LIMIT=0 PROFILE="$tmp/prof.json" OUT="$tmp/ovt3" bash bench/overhead.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "overhead.sh: TIME_LIMIT=0 exits 2" 2 $rc "$tmp/o"
expect "overhead.sh: and names the setting" "$tmp/o" 'TIME_LIMIT=0: seconds, a whole number'
# bench/run.sh refuses a CPU list taskset does not take, before any run (FAKE=1).
FAKE=1 CPUS=zz MODEL=1b OUT="$tmp/runcpus" bash bench/run.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "run.sh: CPUS=zz exits 2" 2 $rc "$tmp/o"
expect "run.sh: and names the setting" "$tmp/o" 'CPUS=zz is not a CPU list'
FAKE=1 CPUS=0 MODEL=1b WORKLOADS=decode BUDGETS=50 SYSTEMS=noshim TOTAL_BUDGET_S=60 OUT="$tmp/runcpus0" \
    bash bench/run.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "run.sh: CPUS=0 exits 0" 0 $rc "$tmp/o"
expect "run.sh: the run's command says CPUS=0" "$tmp/runcpus0/bench.jsonl" '"command": "CPUS=0 MODEL=1b'
expect "run.sh: and its runs were on core 0 only" "$tmp/runcpus0/bench.jsonl" '"name": "noshim-decode".*"cpus": \[0\]'
FAKE=1 CPUS=zz PROFILE="$tmp/prof.json" OUT="$tmp/ovc" bash bench/overhead.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "overhead.sh: CPUS=zz exits 2" 2 $rc "$tmp/o"
FAKE=1 CPUS=0 PROFILE="$tmp/prof.json" OUT="$tmp/ovc0" ROUNDS=1 SIDES="noshim shim" bash bench/overhead.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "overhead.sh: CPUS=0 exits 0" 0 $rc "$tmp/o"
expect "overhead.sh: and the shim's run was on core 0 only" "$tmp/ovc0/shim-1.json" '"cpus": \[0\]'
# bench/device_ab.sh: overhead.sh packed into one archive (a gzipped profile, FAKE=1).
gzip -c "$tmp/prof.json" >"$tmp/prof.json.gz"
FAKE=1 NAME=ab1 PROFILE="$tmp/prof.json.gz" OUT="$tmp/dab" ROUNDS=1 SIDES="noshim shim" bash bench/device_ab.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "device_ab.sh FAKE=1 exits 0" 0 $rc "$tmp/o"
tar xzf "$tmp/dab/ab1.tgz" -C "$tmp/dab" 2>"$tmp/e" && [ ! -e "$tmp/dab/ab1/profile.json" ] &&
    ok "device_ab.sh: one archive, without the unpacked profile" || fail "device_ab.sh: one archive, without the unpacked profile" "$(cat "$tmp/e")"
expect "device_ab.sh: the archive holds overhead.sh's summary" "$tmp/dab/ab1/overhead.txt" '^shim [0-9.]+ ms \(median of 1 runs\): ratio [0-9.]+'
# TIME_LIMIT stops overhead.sh (8 fake runs of more than 1 s each, a limit of 6 s) and still packs
# the runs it finished.
FAKE=1 NAME=ab2 TIME_LIMIT=6 BENCH_ARGS="--fake-sleep 1" PROFILE="$tmp/prof.json" OUT="$tmp/dab" ROUNDS=4 SIDES="noshim shim" bash bench/device_ab.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "device_ab.sh: TIME_LIMIT goes to overhead.sh, whose exit status it keeps" 124 $rc "$tmp/o"
tar tzf "$tmp/dab/ab2.tgz" >"$tmp/e" 2>&1
expect "device_ab.sh: TIME_LIMIT still packs the runs finished" "$tmp/e" '^ab2/noshim-1\.json$'
tar xzf "$tmp/dab/ab2.tgz" -C "$tmp/dab" 2>/dev/null
expect "device_ab.sh: and overhead.sh's summary of them" "$tmp/dab/ab2/overhead.txt" '^pooled: noshim +[0-9]+ steps'
FAKE=1 NAME=ab3 TIME_LIMIT=5m PROFILE="$tmp/prof.json" OUT="$tmp/dab" bash bench/device_ab.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "device_ab.sh: a TIME_LIMIT that is not seconds exits 2" 2 $rc "$tmp/o"
expect "device_ab.sh: and says so" "$tmp/o" 'TIME_LIMIT=5m: seconds'
FAKE=1 NAME="a b" PROFILE="$tmp/prof.json" OUT="$tmp/dab" bash bench/device_ab.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "device_ab.sh: a NAME the device tool cannot bring back exits 2" 2 $rc "$tmp/o"
FAKE=1 PROFILE="$tmp/prof.json" OUT="$tmp/ovh" WORKLOAD=train bash bench/overhead.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "overhead.sh: an unknown WORKLOAD exits 2" 2 $rc "$tmp/o"
expect "overhead.sh: names the workloads" "$tmp/o" 'WORKLOAD=train: decode or prefill'
FAKE=1 PROFILE="$tmp/prof.json" OUT="$tmp/ovh" SIDES="noshim shimm" bash bench/overhead.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "overhead.sh: an unknown side exits 2" 2 $rc "$tmp/o"
expect "overhead.sh: names the unknown side" "$tmp/o" 'unknown side shimm'
PROFILE="$tmp/none.json" OUT="$tmp/ovh" bash bench/overhead.sh >"$tmp/o" 2>&1; rc=$?
expect_rc "overhead.sh: a missing profile exits 2" 2 $rc "$tmp/o"
expect "overhead.sh: names the missing profile" "$tmp/o" "PROFILE=$tmp/none.json: no such file"

# The benchmark's Python helpers (they run on the GPU machine; their self-tests run here).
for py in bench/bench.py bench/report.py bench/trace_summary.py bench/layer_steps.py bench/clock_steps.py; do
    if python3 "$py" --selftest >"$tmp/o" 2>&1; then ok "$py --selftest"; else fail "$py --selftest" "$(tail -5 "$tmp/o")"; fi
done

. "$PWD/tests/tools/sampler.sh" # bench/sampler.c and bench/sample_report.py
. "$PWD/tests/tools/entry_probe.sh" # bench/entry_probe.c

finish
