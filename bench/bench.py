#!/usr/bin/env python3
"""One measurement of the issue-5 benchmark: one system, one workload, one budget, one process.

Run by bench/run.sh on the GPU machine (read it first); by hand, from the repository root:

  python3 bench/bench.py --system noshim|flexshim|pipeline|accelerate --workload prefill|decode \
      --model 7b|1b --budget-pct 50 --result FILE [--kind measure|record] [--iters N --warmup W]
  python3 bench/bench.py --system bandwidth --result FILE     # W: pinned host-to-device copies
  python3 bench/bench.py --model 7b --print-budgets 100,50,25  # "PCT BYTES MIB" lines, no torch
  python3 bench/bench.py --selftest                             # the pure-Python parts, no torch

The model is a transformers LlamaForCausalLM with random bf16 weights built on the GPU from a
seeded generator (the same weights in every system and process), SDPA attention:
  7b: hidden 4096, intermediate 14336, 32 layers, 32 heads, 8 KV heads, vocab 32000
  1b: hidden 2048, intermediate 5632, 22 layers, 32 heads, 8 KV heads, vocab 32000
      (the model of tests/gpu/llama_test.py)
Workloads (no gradient, torch.no_grad(); each step is timed with torch.cuda.synchronize() before
and after it; the median of the steps after the warm-up ones is the result):
  prefill  one forward of 4 x 2048 tokens, no KV cache kept; a step is one forward; fingerprint:
           SHA-256 of the float32 row sums of the logits of the last step
  decode   batch 1: a 128-token prompt (not a step), then greedy decode steps with the KV cache
           (manual argmax loop), cuDNN attention off unless --cudnn-sdpa (run.sh:
           DECODE_CUDNN_SDPA=1); fingerprint: the token list
Systems (flexshim itself is preloaded by run.sh; in this process it is the same code as noshim):
  noshim / flexshim  the model as built, all on the GPU
  pipeline           bench/prefetch_pipeline.py: streamed layers through two GPU slots
  accelerate         weights moved to the CPU, infer_auto_device_map(max_memory={0: budget,
                     "cpu": ...}) and dispatch_model; at 100% the plain model
The result (one JSON object) is written to --result; run.sh adds the shim's log lines to it and
appends it to bench.jsonl (bench/report.py append).
With --fake no torch is imported and plausible made-up numbers are written, marked "fake": true:
it exists only to test run.sh and report.py on a machine without a GPU.
"""
import argparse
import contextlib
import hashlib
import inspect
import io
import json
import os
import resource
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpu"))
import llama_test  # noqa: E402  (the Llama builder of the GPU tests)
import shimlog  # noqa: E402  (tests/gpu/shimlog.py: the shim log's format)

MiB = 1 << 20
GiB = 1 << 30
# No network on the GPU machine: the model is built from a config, nothing is downloaded.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

MODELS = {
    "7b": dict(hidden=4096, intermediate=14336, layers=32, heads=32, kv_heads=8, vocab=32000),
    "1b": dict(hidden=2048, intermediate=5632, layers=22, heads=32, kv_heads=8, vocab=32000),
}
BYTES_PER_PARAM = 2  # bf16
PREFILL_SHAPE = (4, 2048)  # batch x tokens
DECODE_PROMPT = 128

# (iterations, warm-up iterations left out of the median) per workload, system and kind.
# Prefill: an iteration is one forward; decode: one decode step (after the prompt).
# Accelerate copies the offloaded layers from pageable memory at every forward, which is slow,
# so it gets fewer steps; the JSON line says how many were timed. A record run (--kind record)
# stops 2 iterations after the shim saved the profile: its count here is only a cap, generous so
# that discovery and profiling finish.
DEFAULT_ITERS = {
    ("prefill", "noshim"): (13, 3),
    ("prefill", "flexshim"): (11, 3),
    ("prefill", "pipeline"): (10, 2),
    ("prefill", "accelerate"): (4, 1),
    ("prefill", "record"): (20, 4),
    ("decode", "noshim"): (32, 4),
    ("decode", "flexshim"): (32, 4),
    ("decode", "pipeline"): (32, 4),
    ("decode", "accelerate"): (12, 2),
    ("decode", "record"): (48, 8),
}
SYSTEMS = ("noshim", "flexshim", "flexshim_host_read", "flexshim_redirect", "pipeline",
           "accelerate", "bandwidth")
# The shim's systems: flexshim_MODE is flexshim run with FLEXTENSOR_OFFLOAD_MODE=MODE (run.sh sets
# it), from the same profile.
SHIM_SYSTEMS = ("flexshim", "flexshim_host_read", "flexshim_redirect")


# ---- model sizes and budgets (pure Python) ---------------------------------------------------
def layer_params(m):
    """Parameters of one LlamaDecoderLayer (no biases): q, k, v, o, gate, up, down, two norms."""
    h, i = m["hidden"], m["intermediate"]
    kv = h // m["heads"] * m["kv_heads"]
    return 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h


def weight_bytes(m):
    """Bytes of all weights: embeddings, layers, final norm and an untied lm_head."""
    params = 2 * m["vocab"] * m["hidden"] + m["layers"] * layer_params(m) + m["hidden"]
    return params * BYTES_PER_PARAM


def budget_bytes(pct, wbytes):
    """PCT percent of the weight bytes, rounded down to whole MiB (the shim is given MiB)."""
    return int(pct * wbytes // 100) // MiB * MiB


def parse_pcts(text):
    out = []
    for tok in text.replace(",", " ").split():
        v = float(tok)
        if not 0 < v <= 1000:
            raise ValueError(f"budget percent {tok!r} is not in (0, 1000]")
        out.append(int(v) if v == int(v) else v)
    return out


def estimated_headroom(model, workload):
    """Rough activation room when no noshim measurement is there (said so in the JSON):
    prefill: a few hidden states, the MLP intermediates and the logits (twice, for the
    fingerprint's reduction); decode: 512 MiB."""
    m = MODELS[model]
    if workload == "prefill":
        tokens = PREFILL_SHAPE[0] * PREFILL_SHAPE[1]
        per_token = (6 * m["hidden"] + 4 * m["intermediate"] + 2 * m["vocab"]) * BYTES_PER_PARAM
        return tokens * per_token + 256 * MiB
    return 512 * MiB


def headroom_from(jsonl, model, workload, run_id):
    """headroom_bytes of the noshim line of this model and workload in JSONL (the same run_id
    when there is one, else the latest): (bytes, source) or (None, why not)."""
    best = None
    try:
        with open(jsonl) as f:
            for line in f:
                try:
                    d = json.loads(line)
                except ValueError:
                    continue
                if (d.get("kind") == "measure" and d.get("system") == "noshim"
                        and d.get("model") == model and d.get("workload") == workload
                        and isinstance(d.get("headroom_bytes"), int)):
                    same = run_id is not None and d.get("run_id") == run_id
                    if best is None or same or not best[1]:
                        best = (d["headroom_bytes"], same, d.get("run_id"))
    except OSError as e:
        return None, f"no {jsonl}: {e.strerror}"
    if best is None:
        return None, f"no noshim {workload} line in {jsonl}"
    return best[0], f"noshim peak reserved - weights (run {best[2]})"


def process_age_s():
    """Seconds since this process started (from /proc: includes the interpreter's start and the
    preloaded shim's initialisation); None where /proc cannot tell."""
    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        fields = stat[stat.rindex(")") + 2:].split()
        start = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
        return max(0.0, up - start)
    except (OSError, ValueError, IndexError):
        return None


def launcher_age_s():
    """Seconds since run.sh launched this process (BENCH_T0, from date +%s.%N), or None."""
    try:
        return time.time() - float(os.environ["BENCH_T0"])
    except (KeyError, ValueError):
        return None


def median_of(times, warmup):
    tail = times[warmup:] if len(times) > warmup else times
    return (statistics.median(tail), len(tail)) if tail else (None, 0)


def r3(x):
    return None if x is None else round(x, 3)


# ---- the model -------------------------------------------------------------------------------
def build_model(name, seed):
    """LlamaForCausalLM with random bf16 weights built directly on the GPU (fast), seeded: the
    test model's builder (tests/gpu/llama_test.py) with this model's sizes."""
    m = MODELS[name]
    model = llama_test.build_llama(
        seed, hidden_size=m["hidden"], intermediate_size=m["intermediate"],
        num_hidden_layers=m["layers"], num_attention_heads=m["heads"],
        num_key_value_heads=m["kv_heads"], vocab_size=m["vocab"], max_position_embeddings=4096,
        tie_word_embeddings=False)
    dtypes = sorted({str(p.dtype) for p in model.parameters()})
    if dtypes != ["torch.bfloat16"]:
        raise SystemExit(f"unexpected parameter dtypes {dtypes}")
    return model


def weight_checksum(model):
    """float64 sum of per-parameter float32 sums (no float copy of the weights)."""
    import torch

    with torch.no_grad():
        sums = torch.stack([p.detach().sum(dtype=torch.float32) for p in model.parameters()])
        return float(sums.double().sum().item())


def gpu_layers(model):
    return model.model.layers


# ---- systems: set-up after the build ---------------------------------------------------------
def setup_pipeline(model, args, res):
    import torch
    import prefetch_pipeline as pl

    layers = gpu_layers(model)
    n = len(layers)
    layer_b = sum(p.numel() * p.element_size() for p in layers[0].parameters())
    total_b = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers_b = sum(b.numel() * b.element_size() for b in model.buffers())
    fixed_b = total_b - n * layer_b + buffers_b
    _, numel = pl.flat_layout([(nm, p.shape, p.numel()) for nm, p in layers[0].named_parameters()],
                              next(layers[0].parameters()).element_size())
    slot_b = numel * next(layers[0].parameters()).element_size()
    headroom, source = (None, None)
    if args.headroom_from:
        headroom, source = headroom_from(args.headroom_from, args.model, args.workload,
                                         args.run_id)
    if headroom is None:
        why = source
        headroom = estimated_headroom(args.model, args.workload)
        source = f"estimated ({why})" if why else "estimated"
    plan = pl.plan_layers(args.budget_bytes, fixed_b, layer_b, slot_b, n, headroom)
    plan["headroom_source"] = source
    res["pipeline"] = plan
    if not plan["fits"]:
        return None, plan["reason"]
    streamed = pl.spread(n, plan["streamed"])
    plan["streamed_layers"] = streamed
    plan["bytes_per_step"] = len(streamed) * slot_b
    if not streamed:
        return None, None
    streamer = pl.LayerStreamer(layers, streamed, torch.device("cuda", 0))
    return streamer, None


def setup_accelerate(model, args, res):
    """Weights to the CPU, then what most users do: infer_auto_device_map + dispatch_model."""
    import torch
    import accelerate
    from accelerate import dispatch_model, infer_auto_device_map

    info = {"version": accelerate.__version__}
    res["accelerate"] = info
    if args.budget_pct >= 100:
        info["device_map"] = "all on GPU 0 (plain model: the budget holds every weight)"
        return model, None
    model.to("cpu")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    cpu_room = max(64 * GiB, 2 * args.weight_bytes)
    max_memory = {0: args.budget_bytes, "cpu": cpu_room}
    try:
        device_map = infer_auto_device_map(model, max_memory=max_memory,
                                           no_split_module_classes=["LlamaDecoderLayer"])
        info["device_map_by"] = "accelerate.infer_auto_device_map"
    except Exception as e:  # transformers 5 has its own copy, the one from_pretrained uses
        from transformers.integrations.accelerate import infer_auto_device_map as tf_infer

        device_map = tf_infer(model, max_memory=max_memory,
                              no_split_module_classes=["LlamaDecoderLayer"])
        info["device_map_by"] = ("transformers.integrations.accelerate.infer_auto_device_map "
                                 f"(accelerate's raised {type(e).__name__}: {e})")
    on_gpu = [k for k, v in device_map.items() if v not in ("cpu", "disk")]
    info["device_map"] = {k: str(v) for k, v in device_map.items()}
    info["modules_on_gpu"] = len(on_gpu)
    info["modules_on_cpu"] = len(device_map) - len(on_gpu)
    info["layers_on_gpu"] = sum(1 for k in on_gpu if ".layers." in k)
    if not on_gpu:
        return None, "infer_auto_device_map put nothing on the GPU"
    kw = {}
    # As transformers' from_pretrained(device_map=...) does: the hooks must not move the KV
    # cache object to the execution device.
    skip = getattr(model, "_skip_keys_device_placement", None)
    if skip and "skip_keys" in inspect.signature(dispatch_model).parameters:
        kw["skip_keys"] = skip
        info["skip_keys"] = sorted(skip) if isinstance(skip, (set, frozenset)) else skip
    model = dispatch_model(model, device_map=device_map, **kw)
    return model, None


# ---- workloads -------------------------------------------------------------------------------
class StopAfterProfile:
    """In a record run: True once the shim has saved the profile (FLEXTENSOR_PROFILE_OUT exists,
    written by rename) and EXTRA more iterations ran."""

    def __init__(self, extra):
        self.path = os.environ.get("FLEXTENSOR_PROFILE_OUT") if extra is not None else None
        self.extra = extra
        self.seen_at = None

    def __call__(self, i):
        if not self.path:
            return False
        if self.seen_at is None and os.path.exists(self.path):
            self.seen_at = i
        return self.seen_at is not None and i - self.seen_at >= self.extra


def hash_tensor_bytes(t):
    """SHA-256 (first 16 hex digits) of a CPU tensor's bytes."""
    try:
        data = t.contiguous().numpy().tobytes()
    except Exception:  # no numpy: slower, same bytes for float32
        import struct

        data = struct.pack(f"<{t.numel()}f", *t.flatten().tolist())
    return hashlib.sha256(data).hexdigest()[:16]


class StepGaps:
    """Where a step's host time leaves the link unable to help: for each module that owns
    weights, q = host time from the step's start (after a synchronize) to the module's forward
    (before any of its kernels is queued) and P = the weight bytes of the modules run before it
    in the step. At q the device holds at most the budget, so of the B bytes beyond it at least
    B - P still have to cross the link after q: no offloader beats q + (B - P)/W. report.py takes
    the largest of these over the step (with the first module, q is the idle start G).

    Measured with forward pre-hooks on extra steps after the timed ones (the hooks' own time,
    measured too, is left out of q), in noshim only, so no timed step carries them."""

    def __init__(self, model):
        self.mods = [(name, m, sum(p.numel() * p.element_size()
                                   for p in m.parameters(recurse=False)))
                     for name, m in model.named_modules()
                     if next(m.parameters(recurse=False), None) is not None]
        self.steps = []
        self.handles = [m.register_forward_pre_hook(self.hook_for(i))
                        for i, (_, m, _) in enumerate(self.mods)]
        self.t0 = None

    def hook_for(self, i):
        def hook(module, inputs):
            t = time.perf_counter()
            if self.t0 is not None:
                self.cur.append((i, (t - self.t0 - self.hooks_s) * 1000))
            self.hooks_s += time.perf_counter() - t
        return hook

    def step(self, fn):
        import torch

        torch.cuda.synchronize()
        self.cur, self.hooks_s = [], 0.0
        self.t0 = time.perf_counter()
        fn()
        self.t0 = None
        torch.cuda.synchronize()
        self.steps.append(self.cur)

    def done(self, res):
        for h in self.handles:
            h.remove()
        # The module order of the last step; q is each position's median over the steps.
        order = [i for i, _ in self.steps[-1]]
        qs = [statistics.median(st[k][1] for st in self.steps
                                if len(st) == len(order) and st[k][0] == i)
              for k, i in enumerate(order)]
        points, seen = [], 0
        for (i, q) in zip(order, qs):
            name, _, nbytes = self.mods[i]
            points.append([round(q, 3), seen, name])
            seen += nbytes
        res["gap_points"] = points
        res["gap_steps"] = len(self.steps)
        res["idle_start_ms"] = points[0][0] if points else None


GAP_STEPS = 3


ALL_STEPS = 0  # --layer-times all


def layer_times_arg(text):
    """--layer-times: a step number from 1, or 'all' (ALL_STEPS)."""
    if text == "all":
        return ALL_STEPS
    try:
        step = int(text)
    except ValueError:
        step = 0
    if step < 1:
        raise argparse.ArgumentTypeError(f"'{text}': a step number from 1, or all")
    return step


def times_step(args, step):
    """Is step STEP (from 1) timed layer by layer?"""
    return args.layer_times is not None and args.layer_times in (step, ALL_STEPS)


def step_layers(model, args, step):
    """A StepLayers for step STEP when it is timed layer by layer, else None."""
    if not times_step(args, step):
        return None
    return StepLayers(model, step, args.layer_times == ALL_STEPS)


class StepLayers:
    """--layer-times N: where step N's time goes, layer by layer (step 1, the first, carries the
    program's first-time work: kernel loading, library heuristics, the shim's first moves; a
    later step shows the steady state). A CUDA event and the host clock at the step's start and
    before each decoder layer and the lm_head (forward pre-hooks, removed after the step); each
    row's device time is the time between its event and the next one, its host time the same on
    the host clock. Decode's step 1 is the prompt's forward (its layers first) and the first
    decode step."""

    def __init__(self, model, step, every=False):
        import torch

        # EVERY: one of every step's (--layer-times all), kept in a list
        self.torch, self.step, self.every = torch, step, every
        mods = [(f"layer{i}", m) for i, m in enumerate(gpu_layers(model))]
        if getattr(model, "lm_head", None) is not None:
            mods.append(("lm_head", model.lm_head))
        self.marks = []
        self.handles = [m.register_forward_pre_hook(self.hook_for(name)) for name, m in mods]
        self.mark("start")

    def mark(self, name):
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record()
        self.marks.append((name, time.perf_counter(), ev))

    def hook_for(self, name):
        return lambda module, inputs: self.mark(name)

    def finish(self, res):
        """After the step's synchronize: the per-layer times into RES, hooks removed."""
        self.mark("end")
        self.torch.cuda.synchronize()
        for h in self.handles:
            h.remove()
        rows = [[name, r3((t1 - t0) * 1000), r3(e0.elapsed_time(e1))]
                for (name, t0, e0), (_, t1, e1) in zip(self.marks, self.marks[1:])]
        # [name, host ms, device ms] from each mark to the next
        if self.every:
            res.setdefault("layers_by_step", []).append({"step": self.step, "rows": rows})
        else:
            res["step_layers"] = {"step": self.step, "rows": rows}
        top = sorted(rows, key=lambda r: -max(r[1], r[2]))[:6]
        print(f"  step {self.step} by layer (host ms / device ms), the longest: " +
              ", ".join(f"{n} {h}/{d}" for n, h, d in top) +
              f"; device ms of all layers {sum(r[2] for r in rows):.3f}", flush=True)


def measure_gaps(model, step, res, steps=GAP_STEPS):
    """StepGaps over STEPS runs of STEP (one step of the workload) into RES."""
    gaps = StepGaps(model)
    for _ in range(steps):
        gaps.step(step)
    gaps.done(res)


def profile_ops(step, steps, res):
    """STEPS more runs of STEP under torch.profiler, CPU activity only, into res["op_cpu_us"]:
    for the 60 ops with the most self CPU time, {name: [self CPU us a step, calls a step]}. Set
    beside another side's (bench/op_profile_diff.py), it says which ops a side makes slower on
    the host. Run after the timed steps: their times are untouched."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    step()  # the profiler's first step pays for its own start
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:60]
    res["op_cpu_us"] = {e.key: [round(e.self_cpu_time_total / steps, 1), round(e.count / steps, 2)]
                        for e in ops}
    res["op_profile_steps"] = steps


class StackSampler:
    """The queueing thread's stacks in the queueing spans of the steps after the warm-up ones,
    sampled by bench/sampler.c (libfs_sampler.so, which must be preloaded beside the shim) every
    INTERVAL_US and written to PATH: where a side's extra host time goes below the ops
    (bench/sample_report.py). Made on the thread that queues the steps."""

    def __init__(self, path, interval_us, warmup):
        import ctypes
        lib = ctypes.CDLL(None)
        if not hasattr(lib, "fs_sampler_start"):
            raise RuntimeError("--samples: libfs_sampler.so is not loaded; run with "
                               "LD_PRELOAD=dist/lib/libfs_sampler.so (make dist builds it)")
        lib.fs_sampler_write.argtypes = [ctypes.c_char_p]
        if lib.fs_sampler_start(interval_us) != 0:
            raise RuntimeError("--samples: fs_sampler_start failed (its reason is on stderr)")
        self.lib, self.path, self.warmup = lib, path, warmup

    def resume(self, step):
        if step >= self.warmup:
            self.lib.fs_sampler_resume()

    def pause(self):
        self.lib.fs_sampler_pause()

    def write(self, res):
        if self.lib.fs_sampler_write(self.path.encode()) != 0:
            raise RuntimeError(f"--samples: writing {self.path} failed (its reason is on stderr)")
        res["samples_file"] = self.path


class ThreadPerf:
    """--cpu-probe: counters of the thread that creates it (perf_event_open through ctypes; there
    is no perf on the GPU machine): instructions and cycles in user mode, all cycles (user and
    kernel, which takes in the interrupts handled while the thread ran), and its moves between
    CPUs. The same instructions in more cycles is the same work done more slowly (caches,
    interrupts, the clock); more instructions is more work. A counter the host refuses (no PMU
    in a VM; perf_event_paranoid 2 refuses the kernel-mode ones to all but root; a seccomp
    filter) is left out, and `refused` says why. A counter the PMU time-shares is scaled up to
    the time it was enabled."""

    SYSCALL = {"x86_64": 298, "aarch64": 241}  # perf_event_open
    # name, PERF_TYPE_HARDWARE (0) or _SOFTWARE (1), config, user mode only
    COUNTERS = (("instructions", 0, 1, True), ("cycles", 0, 0, True), ("cycles_all", 0, 0, False),
                ("migrations", 1, 4, False))
    READ_TIMES = 1 | 2  # read_format: the times the counter was enabled and running

    def __init__(self, counters=COUNTERS):
        import ctypes
        import platform

        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        number = self.SYSCALL.get(platform.machine())
        self.fds, self.refused = {}, {}
        for name, kind, config, user_only in counters:
            if number is None:
                self.refused[name] = f"no perf_event_open number for {platform.machine()}"
                continue
            attr = (ctypes.c_uint64 * 8)()  # PERF_ATTR_SIZE_VER0: 64 bytes
            attr[0] = kind | (64 << 32)  # type, size 64
            attr[1] = config
            attr[4] = self.READ_TIMES
            attr[5] = (1 << 5 | 1 << 6) if user_only else 0  # exclude_kernel, exclude_hv
            fd = libc.syscall(ctypes.c_long(number), attr, ctypes.c_int(0), ctypes.c_int(-1),
                              ctypes.c_int(-1), ctypes.c_ulong(0))  # this thread, any CPU
            if fd >= 0:
                self.fds[name] = fd
            else:
                self.refused[name] = os.strerror(ctypes.get_errno())

    def read(self):
        out = {}
        for name, fd in self.fds.items():
            raw = os.read(fd, 24)
            value, enabled, running = (int.from_bytes(raw[i:i + 8], "little") for i in (0, 8, 16))
            out[name] = value * enabled // running if running and running < enabled else value
        return out

    def close(self):
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}


THREAD_PERF = None  # the queueing thread's ThreadPerf (--cpu-probe)


def note_step_start(res, sampler=None):
    """The step's start on the wall clock (res["step_start_unix"]), to set steps beside samples
    taken outside the process (nvidia-smi's clocks: bench/clock_steps.py). Returns the thread's
    and the process's clocks and counters now, for note_step_queued; SAMPLER (a StackSampler)
    samples from here to note_step_queued."""
    res.setdefault("step_start_unix", []).append(round(time.time(), 4))
    start = (time.thread_time(), time.process_time(), thread_counts(),
             THREAD_PERF.read() if THREAD_PERF else {})
    if sampler:
        sampler.resume(len(res["step_start_unix"]) - 1)
    return start


def thread_counts():
    """This thread's context switches (voluntary, involuntary) and minor page faults so far."""
    ru = resource.getrusage(resource.RUSAGE_THREAD)
    return ru.ru_nvcsw, ru.ru_nivcsw, ru.ru_minflt


def note_step_queued(res, t0, start, sampler=None):
    """The host's time to queue the step's work (res["queue_ms"]), from T0 to before the
    synchronize: well below the step's time when the GPU bounds it and the launch queue does not
    fill; close to it when the host bounds it (or the queue fills). Set beside the step time of
    runs with and without a shim, it says whether the shim's cost is on the host."""
    if sampler:
        sampler.pause()
    res.setdefault("queue_ms", []).append(round((time.perf_counter() - t0) * 1000, 3))
    # The same span on the queueing thread's own clock and counters: CPU time it ran, times it
    # blocked (voluntary switches), was preempted (involuntary) and faulted. A host cost with the
    # thread's CPU time up is work done on it; with the wall time alone up, waiting or preemption.
    # The whole process's CPU time too: well above the thread's, another thread is busy beside it
    # (one spinning on a sibling core slows it without preempting it).
    cpu0, proc0, counts0, perf0 = start
    res.setdefault("queue_cpu_ms", []).append(round((time.thread_time() - cpu0) * 1000, 3))
    res.setdefault("queue_proc_cpu_ms", []).append(round((time.process_time() - proc0) * 1000, 3))
    for key, v0, v1 in zip(("queue_vcsw", "queue_ivcsw", "queue_minflt"), counts0,
                           thread_counts()):
        res.setdefault(key, []).append(v1 - v0)
    if perf0:
        for name, v1 in THREAD_PERF.read().items():
            res.setdefault(f"queue_{name}", []).append(v1 - perf0[name])


CPU_PROBE_REPS = 200


def cpu_probe(res):
    """--cpu-probe: the time of a fixed piece of host work (Python calls and PyTorch ops on small
    CPU tensors, no CUDA), appended to res["cpu_probe_ms"]. A decode step at 100% is bound by the
    queueing thread, and a shared host slows whole processes by up to 30%: a run whose steps and
    probe are slow alike was slowed by the host, one whose steps alone are slow by what it runs
    (the shim's cost)."""
    import torch

    t = torch.zeros(8)
    t0 = time.perf_counter()
    for i in range(CPU_PROBE_REPS):
        t.add_(1.0).mul_(0.5)
        sum(range(i % 50), len(str(i)))
    res.setdefault("cpu_probe_ms", []).append(round((time.perf_counter() - t0) * 1000, 3))


HOST_CHECK_EVERY_S = 0.05  # about one probe per decode step, as --cpu-probe takes them


def host_check(seconds, noisy_ratio, fake_probes=None):
    """--host-check: the CPU probe every HOST_CHECK_EVERY_S for SECONDS, before an A/B is spent on
    a host. Stop 39's hosts ran at 1.2-2.9 ms a probe within single runs (a quiet one at
    1.37-1.41): there the per-run medians compare the host, not the sides. Prints one line;
    returns 0 when p90 / p10 is at most NOISY_RATIO, 3 when not. FAKE_PROBES: made-up probe
    times, cycled (tests)."""
    n = max(1, int(seconds / HOST_CHECK_EVERY_S))
    if fake_probes:
        v = [fake_probes[i % len(fake_probes)] for i in range(n)]
    else:
        res = {}
        for _ in range(n):
            cpu_probe(res)
            time.sleep(HOST_CHECK_EVERY_S)
        v = res["cpu_probe_ms"]
    deciles = statistics.quantiles(v, n=10, method="inclusive") if len(v) > 1 else v * 9
    p10, p50, p90 = deciles[0], deciles[4], deciles[8]
    ratio = p90 / p10 if p10 > 0 else float("inf")
    verdict = "quiet" if ratio <= noisy_ratio else "NOISY"
    print(f"host check: {len(v)} CPU probes over {seconds:g} s: p10 {p10:.3f} ms, p50 {p50:.3f}, "
          f"p90 {p90:.3f}; p90/p10 {ratio:.3f}: {verdict} (noisy above {noisy_ratio:g}"
          + ("; read the A/B's quiet-step lines, not its medians)" if verdict == "NOISY" else ")"),
          flush=True)
    return 0 if verdict == "quiet" else 3


class HostCounters:
    """--cpu-probe: what the host did beside the timed steps, a step (res["host_counters"]): the
    steal, IRQ and soft-IRQ time of the CPUs this process may run on (/proc/stat, 10 ms ticks;
    steal is time a hypervisor gave those CPUs to others) and the interrupts those CPUs took, by
    kind (/proc/interrupts: a device's by its name, e.g. nvidia; the named rows: LOC timer, RES
    rescheduling, TLB shootdown, CAL call IPIs...). A side whose steps are slower with the same
    counters was not slowed by the host."""

    STAT_FIELDS = {"irq_ms": 5, "softirq_ms": 6, "steal_ms": 7}  # after the cpuN name

    def __init__(self):
        self.cpus = os.sched_getaffinity(0)

    def read(self):
        counts = dict.fromkeys(self.STAT_FIELDS, 0.0)
        ms_per_tick = 1000.0 / os.sysconf("SC_CLK_TCK")
        with open("/proc/stat") as f:
            for line in f:
                name, *vals = line.split()
                if name[3:].isdigit() and name.startswith("cpu") and int(name[3:]) in self.cpus:
                    for key, i in self.STAT_FIELDS.items():
                        counts[key] += int(vals[i]) * ms_per_tick
        with open("/proc/interrupts") as f:
            cols = [int(c[3:]) for c in f.readline().split()]  # CPU0 CPU1 ...
            for line in f:
                name, *vals = line.split()
                if len(vals) < len(cols):
                    continue  # ERR, MIS: one count for the whole system
                # a numbered line: the CPUs' counts, its chip, its trigger, then the device(s)
                kind = " ".join(vals[len(cols) + 2:]) if name[:-1].isdigit() else name[:-1]
                mine = sum(int(v) for c, v in zip(cols, vals) if c in self.cpus)
                counts["irqs " + kind] = counts.get("irqs " + kind, 0) + mine
        return counts

    def since(self, start, steps):
        """The counts a step from START (an earlier read) to now, those that moved."""
        end = self.read()
        return {key: round((end[key] - start.get(key, 0)) / steps, 3)
                for key in end if end[key] != start.get(key, 0)}


class StepProbes:
    """--cpu-probe beside a loop of steps: after each step (outside its timed window) the CPU
    probe, and the host's counters over the timed steps (those after the warm-up ones)."""

    def __init__(self, args):
        self.on, self.warmup = args.cpu_probe, args.warmup
        self.host = HostCounters() if self.on else None
        self.start = self.host.read() if self.on else None

    def after_step(self, res, i):
        """Step I (from 0) has ended."""
        if not self.on:
            return
        cpu_probe(res)
        if i + 1 == self.warmup:
            self.start = self.host.read()

    def finish(self, res, steps):
        """STEPS steps ran; none after the warm-up ones: no counters."""
        if self.on and steps > self.warmup:
            res["host_counters"] = self.host.since(self.start, steps - self.warmup)


def run_prefill(model, args, res, stop, sampler):
    import torch

    gen = torch.Generator(device="cpu").manual_seed(args.seed + 1)
    x = torch.randint(0, MODELS[args.model]["vocab"], PREFILL_SHAPE, generator=gen,
                      dtype=torch.long).to("cuda")
    times, hashes = [], []
    last_tokens = None
    probes = StepProbes(args)
    with torch.no_grad():
        for i in range(args.iters):
            torch.cuda.synchronize()
            layers = step_layers(model, args, i + 1)
            start = note_step_start(res, sampler)
            t0 = time.perf_counter()
            out = model(input_ids=x, use_cache=False)
            note_step_queued(res, t0, start, sampler)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            probes.after_step(res, i)
            if layers:
                layers.finish(res)
            if i == 0:
                res["ttfs_s"] = r3(process_age_s())
                res["ttfs_launcher_s"] = r3(launcher_age_s())
            # Outside the timed window, the same in every iteration (discovery sees a regular
            # loop): row sums of the logits (float32 accumulation, no float copy of the logits).
            logits = out.logits
            rows = logits.sum(dim=-1, dtype=torch.float32).cpu()
            hashes.append(hash_tensor_bytes(rows))
            last_tokens = [int(v) for v in logits[:, -1, :].argmax(dim=-1).cpu().tolist()]
            del out, logits
            print(f"  prefill {i + 1}/{args.iters}: {times[-1] * 1000:.1f} ms", flush=True)
            if stop(i):
                print(f"  profile saved at iteration {stop.seen_at + 1}: stopping", flush=True)
                break
        probes.finish(res, len(times))
        if args.system == "noshim":
            measure_gaps(model, lambda: model(input_ids=x, use_cache=False), res)
    res["fingerprint"] = {"kind": "logits-rowsum-sha256", "value": hashes[-1],
                          "last_position_argmax": last_tokens,
                          "stable": len(set(hashes)) == 1, "distinct": len(set(hashes))}
    return times


def run_decode(model, args, res, stop, sampler):
    import torch

    # PyTorch's cuDNN attention builds a new cuDNN graph for every new KV length, so each decode
    # step spent 35-70 ms on the host in layer 0's attention with the GPU idle (measured by
    # StepGaps, docs/PERFORMANCE.md): a host-bound step whose length moved between processes.
    # Decode is meant to be transfer-bound; the other SDPA kernels have no such cost.
    res["cudnn_sdpa"] = bool(args.cudnn_sdpa)
    if not args.cudnn_sdpa:
        torch.backends.cuda.enable_cudnn_sdp(False)
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 2)
    prompt = torch.randint(0, MODELS[args.model]["vocab"], (1, DECODE_PROMPT), generator=gen,
                           dtype=torch.long).to("cuda")
    times = []
    with torch.no_grad():
        torch.cuda.synchronize()
        layers = step_layers(model, args, 1)
        t0 = time.perf_counter()
        out = model(input_ids=prompt, use_cache=True)
        past = out.past_key_values
        cur = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
        torch.cuda.synchronize()
        res["prompt_ms"] = r3((time.perf_counter() - t0) * 1000)
        del out
        toks = [cur]
        probes = StepProbes(args)
        for i in range(args.iters):
            torch.cuda.synchronize()
            if i > 0:
                layers = step_layers(model, args, i + 1)
            start = note_step_start(res, sampler)
            t0 = time.perf_counter()
            out = model(input_ids=cur, past_key_values=past, use_cache=True)
            past = out.past_key_values
            cur = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
            note_step_queued(res, t0, start, sampler)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            probes.after_step(res, i)
            toks.append(cur)
            del out
            if layers:  # step 1: the prompt and decode step 1
                layers.finish(res)
                layers = None
            if i == 0:
                res["ttfs_s"] = r3(process_age_s())
                res["ttfs_launcher_s"] = r3(launcher_age_s())
            if (i + 1) % 8 == 0 or i + 1 == args.iters:
                print(f"  decode {i + 1}/{args.iters}: {times[-1] * 1000:.1f} ms", flush=True)
            if stop(i):
                print(f"  profile saved at step {stop.seen_at + 1}: stopping", flush=True)
                break
        probes.finish(res, len(times))
        # Steps after the timed ones, not in the token list (the fingerprint does not see them).
        state = {"cur": cur, "past": past}

        def extra_step():
            o = model(input_ids=state["cur"], past_key_values=state["past"], use_cache=True)
            state["past"] = o.past_key_values
            state["cur"] = o.logits[:, -1, :].argmax(dim=-1, keepdim=True)

        if args.op_profile:
            profile_ops(extra_step, args.op_profile, res)
        if args.system == "noshim":
            measure_gaps(model, extra_step, res)
        tokens = [int(t) for t in torch.cat(toks, dim=1).flatten().cpu().tolist()]
    res["fingerprint"] = {"kind": "tokens", "value": hashlib.sha256(
        json.dumps(tokens).encode()).hexdigest()[:16], "tokens": tokens}
    return times


# ---- W: pinned host-to-device bandwidth ------------------------------------------------------
def run_bandwidth(args, res):
    import torch

    n = args.bw_bytes
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    host.fill_(1)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    out = {}
    for name, dst, src in (("h2d", dev, host), ("d2h", host, dev)):
        dst.copy_(src, non_blocking=True)  # warm-up
        torch.cuda.synchronize()
        secs = []
        for _ in range(args.bw_reps):
            e0 = torch.cuda.Event(enable_timing=True)
            e1 = torch.cuda.Event(enable_timing=True)
            e0.record()
            dst.copy_(src, non_blocking=True)
            e1.record()
            e1.synchronize()
            secs.append(e0.elapsed_time(e1) / 1000)
        # The fastest copy is what the link can do: L is a lower bound, and a copy slowed by
        # something else on the host (stop 32: 19.5, 19.5, 36.1, 40.6, 25.7 ms) only makes it
        # look larger than it is.
        fast, med = min(secs), statistics.median(secs)
        out[name] = {"bytes": n, "seconds": [round(s, 6) for s in secs],
                     "median_s": round(med, 6), "fastest_s": round(fast, 6),
                     "bytes_per_s": n / fast, "gb_per_s": round(n / fast / 1e9, 2)}
        print(f"  {name}: {n / GiB:.2f} GiB, fastest of {len(secs)} {fast * 1000:.2f} ms "
              f"(median {med * 1000:.2f}), {n / fast / 1e9:.2f} GB/s", flush=True)
    res["bandwidth"] = out
    res["W_bytes_per_s"] = out["h2d"]["bytes_per_s"]


# ---- one run ---------------------------------------------------------------------------------
def versions(res):
    import torch

    res["torch"] = torch.__version__
    try:
        import transformers

        res["transformers"] = transformers.__version__
    except Exception as e:
        res["transformers"] = f"unavailable: {e!r}"
    res["gpu"] = torch.cuda.get_device_name(0)


def measure(args, res):
    t_imp = time.perf_counter()
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("CUDA is not available")
    __import__("transformers")  # timed with torch: the imports are part of the start-up

    res["import_s"] = r3(time.perf_counter() - t_imp)
    versions(res)
    if args.system == "bandwidth":
        run_bandwidth(args, res)
        return 0

    t0 = time.perf_counter()
    model = build_model(args.model, args.seed)
    torch.cuda.synchronize()
    res["build_s"] = r3(time.perf_counter() - t0)
    wb = sum(p.numel() * p.element_size() for p in model.parameters())
    res["weight_bytes_measured"] = wb
    if wb != args.weight_bytes:
        res.setdefault("notes", []).append(
            f"weight bytes {wb} differ from the computed {args.weight_bytes}")
    print(f"  model {args.model} built in {res['build_s']} s: {wb / GiB:.2f} GiB of weights",
          flush=True)
    # Proves that every system runs the same weights; for flexshim at the end (keeps it off the
    # start-up path, and checks the weights survived their moves).
    if args.system not in SHIM_SYSTEMS:
        res["weight_checksum"] = weight_checksum(model)

    t0 = time.perf_counter()
    streamer = None
    if args.system == "pipeline":
        streamer, why = setup_pipeline(model, args, res)
        if why:
            res["kind"] = "skipped"
            res["reason"] = f"pipeline does not fit: {why}"
            return 0
    elif args.system == "accelerate":
        model, why = setup_accelerate(model, args, res)
        if why:
            res["kind"] = "skipped"
            res["reason"] = why
            return 0
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    res["setup_s"] = r3(time.perf_counter() - t0)
    torch.cuda.reset_peak_memory_stats()

    stop = StopAfterProfile(2 if args.kind == "record" else None)
    runner = run_prefill if args.workload == "prefill" else run_decode
    sampler = StackSampler(args.samples, args.sample_us, args.warmup) if args.samples else None
    global THREAD_PERF
    THREAD_PERF = ThreadPerf() if args.cpu_probe else None
    if THREAD_PERF is not None and THREAD_PERF.refused:
        print("--cpu-probe: thread counters refused here: " + "; ".join(
            f"{name} ({why})" for name, why in THREAD_PERF.refused.items()), flush=True)
    times = runner(model, args, res, stop, sampler)
    if sampler:
        sampler.write(res)
    med, n = median_of(times, args.warmup)
    res["step_ms"] = [round(t * 1000, 3) for t in times]
    res["step_ms_median"] = r3(med * 1000) if med is not None else None
    res["timed_steps"] = n
    res["warmup_steps"] = min(args.warmup, len(times)) if n < len(times) else 0
    res["first_step_ms"] = res["step_ms"][0] if times else None
    res["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
    res["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    if args.system == "noshim":
        # What besides the weights must fit: the pipeline charges it against the budget.
        res["headroom_bytes"] = max(0, res["peak_reserved_bytes"] - wb)
    if args.system == "pipeline" and res.get("pipeline", {}).get("fits"):
        res["pipeline"]["within_budget"] = res["peak_reserved_bytes"] <= args.budget_bytes
        if streamer is not None:
            res["pipeline"].update(streamer.stats())
    if args.system in SHIM_SYSTEMS:
        res["weight_checksum"] = weight_checksum(model)
    print(f"  median {res['step_ms_median']} ms over {n} steps; peak reserved "
          f"{res['peak_reserved_bytes'] / GiB:.2f} GiB", flush=True)
    return 0


def fake_measure(args, res):
    """Made-up numbers for testing run.sh and report.py without a GPU (marked fake)."""
    import random

    rnd = random.Random(f"{args.system}{args.workload}{args.budget_pct}")
    time.sleep(args.fake_sleep)
    res["fake"] = True
    res["gpu"] = "FAKE (no GPU)"
    if args.system == "bandwidth":
        res["W_bytes_per_s"] = 53.0e9
        res["bandwidth"] = {"h2d": {"gb_per_s": 53.0}, "d2h": {"gb_per_s": 54.0}}
        return 0
    c = 180.0 if args.workload == "prefill" else 25.0
    moved = max(0, args.weight_bytes - args.budget_bytes) / 53.0e9 * 1000
    factor = {"noshim": 1.0, "flexshim": 1.3, "flexshim_host_read": 1.2,
              "flexshim_redirect": 1.1, "pipeline": 1.15, "accelerate": 4.0}[args.system]
    base = max(c, moved) * (factor if moved > 0 or args.system == "noshim" else 1.02)
    times = [base * (1 + 0.02 * rnd.random()) for _ in range(args.iters)]
    med, n = median_of(times, args.warmup)
    res["idle_start_ms"] = 4.0 if args.workload == "decode" else 1.0
    if args.system == "noshim":  # an idle start, then a long host gap before the second module
        res["gap_points"] = [[res["idle_start_ms"], 0, "model.embed_tokens"],
                             [c / 2, args.weight_bytes // 20, "model.layers.0.self_attn.o_proj"],
                             [c * 0.9, args.weight_bytes * 9 // 10, "lm_head"]]
    res.update(step_ms=[round(t, 3) for t in times], step_ms_median=round(med, 3),
               queue_ms=[round(t * 0.9, 3) for t in times],
               queue_cpu_ms=[round(t * 0.8, 3) for t in times],
               queue_proc_cpu_ms=[round(t * 0.85, 3) for t in times], queue_vcsw=[1] * len(times),
               queue_ivcsw=[0] * len(times), queue_minflt=[2] * len(times), timed_steps=n,
               warmup_steps=args.warmup, build_s=3.0, import_s=4.0,
               ttfs_s=9.0 + (1.5 if args.system in SHIM_SYSTEMS else 0.0),
               weight_checksum=1234.5)
    if args.op_profile and args.workload == "decode":  # the shim's sides 10% slower in aten::mm
        slow = 1.1 if args.system in SHIM_SYSTEMS else 1.0
        res["op_cpu_us"] = {"aten::mm": [round(3000.0 * slow, 1), 224.0],
                            "aten::cat": [800.0, 64.0], "cudaLaunchKernel": [4000.0, 1494.0]}
        res["op_profile_steps"] = args.op_profile
    if args.cpu_probe:  # the host as slow in the shim's runs as their steps (a fake 1.02 x)
        res["cpu_probe_ms"] = [1.02 if args.system in SHIM_SYSTEMS else 1.0] * len(times)
        res["host_counters"] = {"steal_ms": 0.5, "irqs LOC": 22.0 if args.system in SHIM_SYSTEMS
                                else 20.0}
        res["queue_instructions"] = [int(t * 4e6) for t in times]  # the step's length in work
        res["queue_migrations"] = [0] * len(times)
    if args.samples:  # the shim's sides 1 ms more a step in cuLaunchKernel
        write_fake_samples(args.samples, n, 1000 if args.system in SHIM_SYSTEMS else 0, res)
    if args.workload == "prefill":
        res["fingerprint"] = {"kind": "logits-rowsum-sha256", "value": "0123456789abcdef",
                              "stable": True, "distinct": 1}
    else:
        toks = list(range(100, 101 + args.iters))
        res["fingerprint"] = {"kind": "tokens", "value": "x", "tokens": toks}
    if args.system == "noshim":
        res["headroom_bytes"] = 3 * GiB if args.workload == "prefill" else 64 * MiB
    if args.kind == "record" and os.environ.get("FLEXTENSOR_PROFILE_OUT"):
        with open(os.environ["FLEXTENSOR_PROFILE_OUT"], "w") as f:
            f.write("{}\n")
    return 0


def write_fake_samples(path, spans, extra_us, res):
    """--fake --samples: libfs_sampler.so's format, SPANS spans of 500 us samples; 2 ms a span in
    the interpreter, 4 ms in cuLaunchKernel, and EXTRA_US more there."""
    launch = (4000 + extra_us) * spans // 500
    with open(path, "w") as f:
        f.write(f"# fs_sampler 1\n# interval_us 500\n# spans {spans}\n# samples "
                f"{launch + 4 * spans}\n# dropped 0\n")
        f.write(f"python3!main;libcuda.so.1!cuLaunchKernel {launch}\n")
        f.write(f"python3!main;python3!_PyEval_EvalFrameDefault {4 * spans}\n")
    res["samples_file"] = path


def write_json(path, obj):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        # Sets (transformers keeps some settings as sets) are written as sorted lists.
        json.dump(obj, f, default=lambda o: sorted(o) if isinstance(o, (set, frozenset)) else str(o))
        f.write("\n")
    os.replace(tmp, path)


# ---- self-test (pure Python) -----------------------------------------------------------------
def selftest():
    import prefetch_pipeline as pl
    from selfcheck import Checks

    check = Checks("bench.py")

    # The 1b is llama_test.py's model: 2142 MiB of bf16 weights (docs/RESULTS.md).
    wb1 = weight_bytes(MODELS["1b"])
    check("1b weight bytes", wb1 == 2246234112, wb1)
    check("1b is 2142 MiB", round(wb1 / MiB) == 2142, wb1 / MiB)
    wb7 = weight_bytes(MODELS["7b"])
    lp7 = layer_params(MODELS["7b"])
    check("7b layer params", lp7 == 218112000, lp7)
    check("7b weight bytes", wb7 == 2 * (2 * 32000 * 4096 + 32 * lp7 + 4096), wb7)
    check("7b is about 13.5 GiB", 13.3 < wb7 / GiB < 13.7, wb7 / GiB)
    b = budget_bytes(25, wb7)
    check("budget whole MiB", b % MiB == 0 and wb7 / 4 - MiB < b <= wb7 / 4, b)
    check("budget 100% <= weights", budget_bytes(100, wb7) <= wb7)
    check("parse_pcts", parse_pcts("100 50,25 12.5") == [100, 50, 25, 12.5])
    try:
        parse_pcts("0")
        check("parse_pcts rejects 0", False)
    except ValueError:
        check("parse_pcts rejects 0", True)

    # --cpu-probe's counters on this machine, over a busy stretch: the host's (the CPUs' timer
    # interrupts at least), and the thread's through the same code with a software counter that
    # perf_event_paranoid 2 allows in user mode (the task clock), where the host allows any.
    def busy(seconds):
        until = time.perf_counter() + seconds
        while time.perf_counter() < until:
            pass

    host = HostCounters()
    start = host.read()
    busy(0.2)
    moved = host.since(start, 2)
    check("host counters: interrupts counted a step", any(
        k.startswith("irqs ") and v > 0 for k, v in moved.items()), moved)
    clock = ThreadPerf(counters=(("task_clock", 1, 1, True),))
    if clock.refused:
        check("thread counters: refused, and said why", clock.refused["task_clock"], clock.refused)
    else:
        first = clock.read()["task_clock"]
        busy(0.05)
        ns = clock.read()["task_clock"] - first
        check("thread counters: the task clock counts a 50 ms busy loop", 4e7 < ns < 5e8, ns)
    clock.close()

    # StepGaps on stand-ins for torch modules: the module order, q from the step's start with
    # the hooks' own time left out, and P the bytes of the modules before.
    class Param:
        def __init__(self, n):
            self.n = n

        def numel(self):
            return self.n

        def element_size(self):
            return 2

    class Mod:
        def __init__(self, n):
            self.params, self.hooks = ([Param(n)] if n else []), []

        def parameters(self, recurse=True):
            return iter(self.params)

        def register_forward_pre_hook(self, fn):
            self.hooks.append(fn)
            mod = self

            class Handle:
                def remove(self):
                    mod.hooks.remove(fn)
            return Handle()

        def __call__(self):
            for h in self.hooks:
                h(self, ())

    class Model:
        def __init__(self):
            self.mods = [("", Mod(0)), ("embed", Mod(10)), ("proj", Mod(5)), ("head", Mod(7))]

        def named_modules(self):
            return iter(self.mods)

    fake_torch = type(sys)("torch")
    fake_torch.cuda = type("cuda", (), {"synchronize": staticmethod(lambda: None)})
    saved = sys.modules.get("torch")
    sys.modules["torch"] = fake_torch
    try:
        mdl = Model()
        emb, proj, head = (m for _, m in mdl.mods[1:])

        def fake_step():
            emb()
            time.sleep(0.02)
            proj()
            head()

        res = {}
        measure_gaps(mdl, fake_step, res, 2)
    finally:
        if saved is None:
            del sys.modules["torch"]
        else:
            sys.modules["torch"] = saved
    pts = res["gap_points"]
    check("gaps: modules with weights, in step order",
          [p[2] for p in pts] == ["embed", "proj", "head"], pts)
    check("gaps: P = bytes before", [p[1] for p in pts] == [0, 20, 30], pts)
    check("gaps: q from the step's start", pts[0][0] < 5 and 19 < pts[1][0] < 40 and
          pts[2][0] >= pts[1][0], pts)
    check("gaps: hooks removed", not any(m.hooks for _, m in mdl.mods), mdl.mods)
    check("gaps: idle start is the first q", res["idle_start_ms"] == pts[0][0], res)

    check("spread 32/16", pl.spread(32, 16) == list(range(0, 32, 2)))
    for n in (22, 32):
        for k in range(0, n + 1):
            s = pl.spread(n, k)
            if len(s) != k or len(set(s)) != k or s != sorted(s) or (s and s[-1] >= n):
                check(f"spread {n}/{k}", False, s)
                break
    check("spread all sizes", True)
    L = 436 * MiB
    p = pl.plan_layers(100 * GiB, 500 * MiB, L, L, 32, 2 * GiB)
    check("plan: all fit", p["fits"] and p["resident"] == 32 and p["slots"] == 0, p)
    budget = 32 * L + 500 * MiB  # 100% of the weights
    p = pl.plan_layers(budget, 500 * MiB, L, L, 32, 64 * MiB)
    check("plan: 100% with headroom streams 3 layers", p["streamed"] == 3 and p["resident"] == 29,
          p)
    check("plan: within budget", p["planned_bytes"] <= budget, p)
    p = pl.plan_layers(3 * GiB, 500 * MiB, L, L, 32, 2 * GiB)
    check("plan: does not fit", not p["fits"], p)
    p = pl.plan_layers(500 * MiB + 2 * L + 10, 500 * MiB, L, L, 32, 0)
    check("plan: nothing resident, all streamed", p["fits"] and p["resident"] == 0
          and p["streamed"] == 32, p)
    lay, numel = pl.flat_layout([("a", (3, 5), 15), ("b", (7,), 7)], 2)
    check("flat layout aligned", lay[1][2] == 256 and numel == 512, (lay, numel))

    age = process_age_s()
    check("process age from /proc", age is not None and 0 <= age < 3600, age)
    check("median_of", median_of([9, 1, 2, 3], 1) == (2, 3))
    check("median_of short", median_of([5], 3) == (5, 1))
    # headroom_from: prefers the same run_id, else the latest
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        f = os.path.join(d, "b.jsonl")
        with open(f, "w") as fh:
            for rid, h in (("a", 10), ("b", 20), ("c", 30)):
                fh.write(json.dumps({"kind": "measure", "system": "noshim", "model": "7b",
                                     "workload": "prefill", "run_id": rid,
                                     "headroom_bytes": h}) + "\n")
            fh.write("not json\n")
        check("headroom same run", headroom_from(f, "7b", "prefill", "b")[0] == 20)
        check("headroom latest", headroom_from(f, "7b", "prefill", "zz")[0] == 30)
        check("headroom none", headroom_from(f, "7b", "decode", "b")[0] is None)
        check("headroom no file", headroom_from(f + "x", "7b", "decode", "b")[0] is None)
    check("estimated headroom prefill", 1 * GiB < estimated_headroom("7b", "prefill") < 4 * GiB,
          estimated_headroom("7b", "prefill") / GiB)
    args = parse_args(["--system", "accelerate", "--workload", "decode", "--result", "x"])
    check("defaults accelerate decode", (args.iters, args.warmup) == (12, 2))
    args = parse_args(["--system", "flexshim", "--workload", "prefill", "--kind", "record",
                       "--result", "x", "--budget-pct", "50"])
    check("defaults record prefill", (args.iters, args.warmup) == (20, 4)
          and args.budget_bytes == budget_bytes(50, wb7))
    base = ["--system", "noshim", "--result", "x", "--layer-times"]
    one, every = parse_args(base + ["3"]), parse_args(base + ["all"])
    check("--layer-times 3: step 3 only", [times_step(one, n) for n in (1, 3, 4)] ==
          [False, True, False])
    check("--layer-times all: every step", all(times_step(every, n) for n in (1, 2, 17)))
    check("no --layer-times: no step", not times_step(parse_args(base[:-1]), 1))
    for bad in ("0", "-1", "al"):
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                parse_args(base + [bad])
            check(f"--layer-times {bad} rejected", False)
        except SystemExit as e:
            check(f"--layer-times {bad} rejected", e.code == 2)
    return check.done()


# ---- command line ----------------------------------------------------------------------------
def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--system", choices=SYSTEMS)
    ap.add_argument("--workload", choices=("prefill", "decode"), default="prefill")
    ap.add_argument("--model", choices=sorted(MODELS), default="7b")
    ap.add_argument("--budget-pct", type=float, default=100.0,
                    help="GPU memory budget, percent of the weight bytes")
    ap.add_argument("--kind", choices=("measure", "record"), default="measure",
                    help="record: a flexshim-profile record run (stops after the profile)")
    ap.add_argument("--iters", type=int, help="iterations (prefill forwards / decode steps)")
    ap.add_argument("--warmup", type=int, help="iterations left out of the median")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--result", help="write the result (one JSON object) here")
    ap.add_argument("--run-id", default=None)
    ap.add_argument("--name", default=None, help="the run's name (logs)")
    ap.add_argument("--headroom-from", default=None,
                    help="bench.jsonl with the noshim line giving the pipeline's headroom")
    ap.add_argument("--cudnn-sdpa", action="store_true",
                    help="decode with PyTorch's cuDNN attention (its default on this GPU; it "
                    "rebuilds a graph for every new KV length)")
    ap.add_argument("--layer-times", type=layer_times_arg, nargs="?", const=1, metavar="STEP",
                    help="time step STEP (default 1, the first, with its first-time work) layer "
                    "by layer, on the host and the device; 'all': every step (JSON key "
                    "layers_by_step), to set slow steps beside fast ones")
    ap.add_argument("--op-profile", type=int, default=0, metavar="STEPS",
                    help="decode: STEPS more steps after the timed ones under torch.profiler (CPU "
                    "activity only): each op's self CPU time a step (JSON key op_cpu_us; compare "
                    "sides with bench/op_profile_diff.py)")
    ap.add_argument("--cpu-probe", action="store_true",
                    help="after each step, outside its timed window, time a fixed piece of host "
                    "work (JSON key cpu_probe_ms): how fast the host ran beside each step; and "
                    "count the steal, IRQ time and interrupts of the CPUs the run may use over "
                    "the steps (host_counters, a step)")
    ap.add_argument("--host-check", type=float, metavar="SECONDS",
                    help="only time the CPU probe for SECONDS and say whether the host is quiet "
                    "(exit 0) or noisy (exit 3): p90 over p10 of the probe above --host-noisy")
    ap.add_argument("--host-noisy", type=float, default=1.10, metavar="RATIO",
                    help="--host-check: the p90/p10 above which the host is called noisy")
    ap.add_argument("--fake-probes", metavar="MS,...",
                    help="--host-check with --fake: made-up probe times, cycled (tests)")
    ap.add_argument("--bw-bytes", type=int, default=GiB)
    ap.add_argument("--bw-reps", type=int, default=5)
    ap.add_argument("--print-budgets", metavar="PCTS", help="print PCT BYTES MIB lines and exit")
    ap.add_argument("--samples", metavar="FILE",
                    help="write the queueing thread's stacks in the timed steps' queueing spans "
                    "to FILE (needs libfs_sampler.so preloaded; bench/sample_report.py)")
    ap.add_argument("--sample-us", type=int, default=500, metavar="US",
                    help="--samples: the sampling interval in microseconds")
    ap.add_argument("--fake", action="store_true", help="no GPU: made-up numbers (tests only)")
    ap.add_argument("--fake-sleep", type=float, default=0.0)
    ap.add_argument("--selftest", action="store_true")
    args = ap.parse_args(argv)
    if args.host_check is not None:
        if not 0 < args.host_check <= 600:
            ap.error(f"--host-check {args.host_check:g}: seconds, more than 0 and at most 600")
        if not args.host_noisy >= 1:
            ap.error(f"--host-noisy {args.host_noisy:g}: a ratio of at least 1 (e.g. 1.10)")
        try:
            args.fake_probes = ([float(x) for x in args.fake_probes.split(",")]
                                if args.fake and args.fake_probes else None)
        except ValueError:
            ap.error(f"--fake-probes {args.fake_probes}: milliseconds separated by commas")
        if args.fake and not args.fake_probes:
            args.fake_probes = [1.0]
        return args
    if args.selftest or args.print_budgets:
        return args
    if not args.system or not args.result:
        ap.error("--system and --result are needed")
    key = ("record" if args.kind == "record" else
           "flexshim" if args.system in SHIM_SYSTEMS else args.system)
    d_iters, d_warm = DEFAULT_ITERS.get((args.workload, key), (10, 2))
    args.iters = d_iters if args.iters is None else args.iters
    args.warmup = d_warm if args.warmup is None else args.warmup
    if args.iters < 1 or args.warmup < 0:
        ap.error("--iters >= 1 and --warmup >= 0")
    if args.budget_pct <= 0:
        ap.error("--budget-pct > 0")
    args.weight_bytes = weight_bytes(MODELS[args.model])
    args.budget_bytes = budget_bytes(args.budget_pct, args.weight_bytes)
    return args


def main(argv=None):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.selftest:
        return selftest()
    if args.host_check is not None:
        try:
            return host_check(args.host_check, args.host_noisy, args.fake_probes)
        except ImportError as e:
            print(f"bench.py --host-check: the CPU probe's work needs PyTorch ({e}); run it where "
                  f"the benchmark runs, or with --fake", file=sys.stderr)
            return 2
    if args.print_budgets:
        wb = weight_bytes(MODELS[args.model])
        for pct in parse_pcts(args.print_budgets):
            b = budget_bytes(pct, wb)
            print(f"{pct} {b} {b // MiB}")
        return 0
    pct = args.budget_pct
    res = {
        "kind": "bandwidth" if args.system == "bandwidth" else args.kind,
        "run_id": args.run_id, "name": args.name, "model": args.model,
        "workload": None if args.system == "bandwidth" else args.workload,
        "system": args.system, "budget_pct": int(pct) if pct == int(pct) else pct,
        "budget_bytes": args.budget_bytes, "weight_bytes": args.weight_bytes,
        "iters": args.iters, "warmup": args.warmup, "seed": args.seed, "pid": os.getpid(),
        "shim_loaded": shimlog.loaded(),
        "shim_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("FLEXTENSOR_")},
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": sorted(os.sched_getaffinity(0)),  # the cores it may run on (run.sh's CPUS)
    }
    if args.system in SHIM_SYSTEMS and not res["shim_loaded"] and not args.fake:
        res.setdefault("notes", []).append("libflexshim.so is NOT loaded in this process")
    t0 = time.perf_counter()
    rc = 1
    try:
        rc = fake_measure(args, res) if args.fake else measure(args, res)
    except BaseException as e:  # a failed run still leaves its line (and the reason)
        res["kind"] = "failed"
        res["error"] = f"{type(e).__name__}: {e}"
        res["traceback"] = traceback.format_exc().splitlines()[-12:]
        print(traceback.format_exc(), file=sys.stderr, flush=True)
        rc = 1
    res["wall_s"] = r3(time.perf_counter() - t0)
    res["process_s"] = r3(process_age_s())
    if args.result:
        write_json(args.result, res)
    print("RESULT " + json.dumps({k: res.get(k) for k in (
        "kind", "system", "workload", "budget_pct", "step_ms_median", "timed_steps", "ttfs_s",
        "build_s", "reason", "error")}), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
