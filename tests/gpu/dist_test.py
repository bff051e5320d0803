#!/usr/bin/env python3
"""Tensor-parallel Llama-style model under torch.distributed, for flexshim (issue 6; GPU machine).

  torchrun --standalone --nproc-per-node N tests/gpu/dist_test.py run --out PREFIX [options]
  python3 tests/gpu/dist_test.py compare --world N --pair REF TEST [--pair ...] [--info-pair ...]
  python3 tests/gpu/dist_test.py evaluate RUNS_DIR NAME [REF_NAME] [--compare FILE] ...
  python3 tests/gpu/dist_test.py counters SHIM_LOG
  python3 tests/gpu/dist_test.py jget FILE KEY...
(compare needs torch; evaluate, counters and jget do not.)

run: one process per rank (torchrun sets RANK, LOCAL_RANK, WORLD_SIZE; without torchrun it runs
as rank 0 of 1). torch.cuda.set_device(LOCAL_RANK), init_process_group(--backend nccl|gloo).
The model is Megatron-style tensor parallel, written out in plain PyTorch (no transformers):
hidden 2048, intermediate 5632, 8 layers, 16 attention heads, 8 KV heads (head dim 128), vocab
32000, RMSNorm, rotary embeddings, SwiGLU MLP, bf16: about 509 M parameters, 1.02 GB of weights in
all, split evenly over the ranks:
  embedding      vocabulary-parallel (rows split; a token outside the rank's rows gives zeros),
                 then all_reduce
  q/k/v, gate/up column-parallel (the rank's attention heads, KV heads and MLP columns)
  o, down        row-parallel, each followed by all_reduce (the partial sums)
  lm_head        vocabulary-parallel, the logits all_gather'ed (every rank holds all of them)
  norms          replicated
Weights are random, the same model for any world size: each tensor is generated whole on the GPU
from its own seeded generator (seed, tensor index), then the rank's shard is sliced out.
The prompt (--prompt-len tokens, default 512: its all_reduce buffers are 2 MiB, so they land in
PyTorch's 20 MiB segments, which flexshim manages) comes from a seeded CPU generator. One prefill,
then --steps greedy decode steps with a preallocated KV cache; with --deterministic the kernels
are deterministic (set CUBLAS_WORKSPACE_CONFIG=:4096:8 too). Each decode step is timed between
two torch.cuda.synchronize() calls.

gloo: gloo's CUDA support does not cover every collective and dtype, so with --backend gloo every
collective runs on a float32 CPU copy (CPU staging: copy out, collective, copy back); with world
size 1 this is exact, so the gloo and nccl references of one rank should be bit-identical.
--cpu (gloo only) runs the same on the CPU: a check of the model's logic without a GPU.

NCCL probes (--probe-mib, default 64; 0: none): a float32 tensor of that size is filled with
(rank + 1) * (i mod 251) and all_reduce'd; the result must be exactly
(i mod 251) * W(W+1)/2. "early": allocated and reduced at once, before the model is built;
"late": allocated before the model, reduced after the last decode step (under a flexshim budget
it has been evicted by then, so the collective reaches an offloaded buffer); its time is reported.

Per rank, PREFIX-rank{R}.pt (torch.save) holds prefill_logits (float32, the last prompt
position, full vocabulary), tokens (steps + 1 ints: tokens[0] from the prefill, tokens[k] from
decode step k), decode_logit_sums, step_times, weight checksums and the probes' results;
PREFIX-rank{R}.json holds the summary, which is also printed as one line starting with '{'.
On an error the rank prints the traceback, writes the JSON with "error" and exits 1. A watchdog
(--max-seconds) ends a rank that hangs (exit 124), saying at which stage.

compare: for each --pair REF TEST (prefixes) and each rank: prefill logits bit-identical
(torch.equal), the same tokens, the same weights; TEST's ranks agree with each other; TEST's
probes passed. One line per pair: "RESULT <TEST name> PASS|FAIL <why>"; exit 1 if a --pair
failed (--info-pair: the same comparison, reported as NOTE, never a failure).

evaluate: one run of dist_test.sh (its files in RUNS_DIR: NAME.meta.json, NAME.rc,
NAME-rank{R}.json, NAME-shim-rank{R}.log, NAME-prof-rank{R}.json): exit status, compare result,
per-rank shim logs and profiles (the {rank} placeholder), the shim's exit counters per rank, step
time medians against the reference and the transfer limit; the last line is
"ROW|<result>|<notes>".
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shimlog  # noqa: E402  (tests/gpu/shimlog.py: the shim log's format)

MiB = 1 << 20
STAGE = "start"


def set_stage(s):
    global STAGE
    STAGE = s


# ---- the model ----------------------------------------------------------------------------------
class Comm:
    """The collectives the model uses; gloo runs them on float32 CPU copies (see the header)."""

    def __init__(self, dist, backend, world):
        self.dist = dist
        self.backend = backend
        self.world = world
        self.calls = 0

    def all_reduce(self, t):
        self.calls += 1
        if self.backend == "gloo":
            c = t.detach().float().cpu()
            self.dist.all_reduce(c)
            t.copy_(c)
        else:
            self.dist.all_reduce(t)
        return t

    def all_gather_cat(self, t):
        """Concatenates every rank's T along the last dimension, in rank order."""
        import torch

        self.calls += 1
        if self.backend == "gloo":
            c = t.detach().float().cpu().contiguous()
            parts = [torch.empty_like(c) for _ in range(self.world)]
            self.dist.all_gather(parts, c)
            return torch.cat(parts, dim=-1).to(device=t.device, dtype=t.dtype)
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.world)]
        self.dist.all_gather(parts, t)
        return torch.cat(parts, dim=-1)


class TPLlama:
    def __init__(self, a, rank, world, comm, device):
        import torch

        self.torch = torch
        H, I, V = a.hidden, a.intermediate, a.vocab
        NH, NKV = a.heads, a.kv_heads
        D = H // NH
        for what, n in (("heads", NH), ("kv-heads", NKV), ("intermediate", I), ("vocab", V)):
            if n % world:
                raise SystemExit(f"--{what} {n} is not divisible by the world size {world}")
        if H % NH or NH % NKV or D % 2:
            raise SystemExit("hidden must be heads x an even head dim, heads a multiple "
                             "of kv-heads")
        self.H, self.I, self.V, self.D = H, I, V, D
        self.Hl, self.KVl, self.Il, self.Vl = NH // world, NKV // world, I // world, V // world
        self.rep = NH // NKV
        self.rank, self.world, self.comm, self.dev = rank, world, comm, device
        self.seed = a.seed
        self.eps = 1e-5
        self.ntensor = 0
        self.params = []
        r = rank
        std = 0.02

        def rows(n):  # the rank's block of N rows of a dimension split over the ranks
            return (r * n, (r + 1) * n)

        self.emb = self._gen((V, H), std, rows=rows(self.Vl))
        self.layers = []
        for _ in range(a.layers):
            L = {}
            L["ln1"] = self._gen((H,), 0.1, add_one=True)
            L["wq"] = self._gen((NH * D, H), std, rows=rows(self.Hl * D))
            L["wk"] = self._gen((NKV * D, H), std, rows=rows(self.KVl * D))
            L["wv"] = self._gen((NKV * D, H), std, rows=rows(self.KVl * D))
            L["wo"] = self._gen((H, NH * D), std, cols=rows(self.Hl * D))
            L["ln2"] = self._gen((H,), 0.1, add_one=True)
            L["wg"] = self._gen((I, H), std, rows=rows(self.Il))
            L["wu"] = self._gen((I, H), std, rows=rows(self.Il))
            L["wd"] = self._gen((H, I), std, cols=rows(self.Il))
            self.layers.append(L)
        self.norm = self._gen((H,), 0.1, add_one=True)
        self.lm = self._gen((V, H), std, rows=rows(self.Vl))
        # rotary tables (float32), KV cache (bf16), for the whole run
        maxlen = a.prompt_len + a.steps + 1
        inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D))
        t = torch.arange(maxlen, device=device, dtype=torch.float32)
        f = torch.outer(t, inv)
        emb = torch.cat((f, f), dim=-1)
        self.cos, self.sin = emb.cos(), emb.sin()
        self.kc = [torch.zeros((self.KVl, maxlen, D), device=device, dtype=torch.bfloat16)
                   for _ in self.layers]
        self.vc = [torch.zeros((self.KVl, maxlen, D), device=device, dtype=torch.bfloat16)
                   for _ in self.layers]

    def _gen(self, shape, std, rows=None, cols=None, add_one=False):
        """The next weight tensor: generated whole from its own generator, the shard sliced."""
        torch = self.torch
        idx = self.ntensor
        self.ntensor += 1
        g = torch.Generator(device=self.dev)
        g.manual_seed(self.seed * 1000003 + idx)
        full = torch.randn(shape, generator=g, device=self.dev, dtype=torch.float32)
        if rows is not None:
            full = full[rows[0]:rows[1]]
        if cols is not None:
            full = full[:, cols[0]:cols[1]]
        w = full * std
        if add_one:
            w = w + 1.0
        w = w.to(torch.bfloat16).contiguous()
        del full
        self.params.append(w)
        return w

    def weight_bytes(self):
        return sum(p.numel() * p.element_size() for p in self.params)

    def checksum(self):
        torch = self.torch
        return float(torch.stack([p.float().sum() for p in self.params]).double().sum().item())

    def _rms(self, x, w):
        torch = self.torch
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return w * xf.to(torch.bfloat16)

    def _rope(self, x, pos, T):  # x [heads, T, D]
        torch = self.torch
        cos, sin = self.cos[pos:pos + T], self.sin[pos:pos + T]
        xf = x.float()
        h = self.D // 2
        rot = torch.cat((-xf[..., h:], xf[..., :h]), dim=-1)
        return (xf * cos + rot * sin).to(torch.bfloat16)

    def _embed(self, ids):  # ids [T] long
        torch = self.torch
        lo = self.rank * self.Vl
        inside = (ids >= lo) & (ids < lo + self.Vl)
        local = torch.where(inside, ids - lo, torch.zeros_like(ids))
        e = torch.nn.functional.embedding(local, self.emb)
        e = e * inside.unsqueeze(-1).to(e.dtype)
        return self.comm.all_reduce(e)

    def _layer(self, i, x, pos):
        F = self.torch.nn.functional
        L = self.layers[i]
        T = x.shape[0]
        h = self._rms(x, L["ln1"])
        q = F.linear(h, L["wq"]).view(T, self.Hl, self.D).transpose(0, 1)
        k = F.linear(h, L["wk"]).view(T, self.KVl, self.D).transpose(0, 1)
        v = F.linear(h, L["wv"]).view(T, self.KVl, self.D).transpose(0, 1)
        q = self._rope(q, pos, T)
        k = self._rope(k, pos, T)
        self.kc[i][:, pos:pos + T] = k
        self.vc[i][:, pos:pos + T] = v
        K = self.kc[i][:, :pos + T]
        Vv = self.vc[i][:, :pos + T]
        if self.rep > 1:
            K = K.repeat_interleave(self.rep, dim=0)
            Vv = Vv.repeat_interleave(self.rep, dim=0)
        # A prefill starts at position 0 (causal mask aligned top-left); a decode step is 1 token.
        if hasattr(F, "scaled_dot_product_attention"):
            att = F.scaled_dot_product_attention(q.unsqueeze(0), K.unsqueeze(0),
                                                 Vv.unsqueeze(0), is_causal=T > 1).squeeze(0)
        else:  # torch < 2.0 (only for --cpu checks elsewhere)
            sc = (q.float() @ K.float().transpose(1, 2)) / (self.D ** 0.5)
            if T > 1:
                sc = sc + self.torch.full((T, T), float("-inf"), device=sc.device).triu(1)
            att = (sc.softmax(-1) @ Vv.float()).to(q.dtype)
        att = att.transpose(0, 1).reshape(T, self.Hl * self.D)
        o = self.comm.all_reduce(F.linear(att, L["wo"]))
        x = x + o
        h = self._rms(x, L["ln2"])
        m = F.linear(F.silu(F.linear(h, L["wg"])) * F.linear(h, L["wu"]), L["wd"])
        m = self.comm.all_reduce(m)
        return x + m

    def forward(self, ids, pos):
        """Logits (bf16, full vocabulary) of the last of the tokens IDS placed at POS."""
        if ids.shape[0] > 1 and pos != 0:
            raise ValueError("a multi-token forward must start at position 0")
        x = self._embed(ids)
        for i in range(len(self.layers)):
            x = self._layer(i, x, pos)
        h = self._rms(x[-1:], self.norm)
        logits = self.torch.nn.functional.linear(h, self.lm)  # [1, V / world]
        return self.comm.all_gather_cat(logits)[0]


# ---- run ----------------------------------------------------------------------------------------
def pattern(torch, n, dev, factor):
    """N float32 values factor * (i mod 251): small integers, so every sum is exact."""
    return (torch.arange(n, device=dev, dtype=torch.int32) % 251).float().mul_(factor)


def probe(torch, sync, comm, n, rank, world, dev, tensor=None):
    """All-reduces TENSOR (or a fresh one); True when the sum is exact. Returns (ok, ms)."""
    if tensor is None:
        tensor = pattern(torch, n, dev, rank + 1)
    sync()
    t0 = time.perf_counter()
    comm.all_reduce(tensor)
    sync()
    ms = (time.perf_counter() - t0) * 1000
    want = pattern(torch, n, dev, world * (world + 1) // 2)
    ok = bool(torch.equal(tensor, want))
    return ok, ms


def cmd_run(a):
    t_start = time.perf_counter()
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    for k, v in (("RANK", rank), ("LOCAL_RANK", local_rank), ("WORLD_SIZE", world)):
        os.environ.setdefault(k, str(v))  # without torchrun: rank 0 of 1
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    base = f"{a.out}-rank{rank}"
    summary = {"rank": rank, "local_rank": local_rank, "world": world, "backend": a.backend,
               "pid": os.getpid(), "out": base, "shim_loaded": shimlog.loaded(),
               "flextensor_env": {k: v for k, v in sorted(os.environ.items())
                                  if k.startswith("FLEXTENSOR_")},
               "ld_preload": os.environ.get("LD_PRELOAD", "")}

    def fail(msg):
        summary["error"] = msg
        summary["stage"] = STAGE
        summary["total_s"] = round(time.perf_counter() - t_start, 2)
        write_json(base + ".json", summary)
        print(json.dumps(summary), flush=True)

    if a.max_seconds > 0:
        def on_timeout():
            msg = f"watchdog: rank {rank} still at stage '{STAGE}' after {a.max_seconds} s"
            print(f"WATCHDOG {msg}", file=sys.stderr, flush=True)
            try:
                fail(msg)
            finally:
                os._exit(124)

        wd = threading.Timer(a.max_seconds, on_timeout)
        wd.daemon = True
        wd.start()

    dist = None
    try:
        set_stage("import torch")
        import torch
        import torch.distributed as dist

        summary["torch"] = torch.__version__
        summary["cuda"] = torch.version.cuda
        if a.cpu:  # the model's logic without a GPU (gloo only): for checks off the GPU machine
            if a.backend != "gloo":
                raise RuntimeError("--cpu needs --backend gloo")
            return run_model(a, torch, dist, summary, rank, world, torch.device("cpu"),
                             lambda: None, t_start, base)
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA is not available")
        ndev = torch.cuda.device_count()
        if local_rank >= ndev:
            raise RuntimeError(f"LOCAL_RANK {local_rank} but only {ndev} CUDA device(s)")
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
        summary["device"] = f"cuda:{local_rank} {torch.cuda.get_device_name(local_rank)}"
        try:
            summary["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception as e:  # noqa: BLE001
            summary["nccl"] = f"? ({e!r})"
        try:
            free, total = torch.cuda.mem_get_info(local_rank)
            summary["mem_get_info_mib"] = [round(free / MiB), round(total / MiB)]
        except Exception as e:  # noqa: BLE001
            summary["mem_get_info_mib"] = f"? ({e!r})"
        if a.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
            torch.backends.cudnn.deterministic = True
            torch.backends.cuda.enable_cudnn_sdp(False)
            torch.backends.cuda.enable_flash_sdp(False)
        return run_model(a, torch, dist, summary, rank, world, dev, torch.cuda.synchronize,
                         t_start, base)
    except BaseException as e:  # noqa: BLE001 - every failure is reported, then exit 1
        traceback.print_exc()
        fail(f"{type(e).__name__}: {e}")
        try:
            if dist is not None and dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
        return 1


def run_model(a, torch, dist, summary, rank, world, dev, sync, t_start, base):
    """The process group, the probes, the model, prefill and decode; saves the outputs.
    Exceptions go to cmd_run, which reports them."""
    set_stage(f"init_process_group({a.backend})")
    t0 = time.perf_counter()
    kw = dict(backend=a.backend, timeout=datetime.timedelta(seconds=a.dist_timeout))
    if a.backend == "nccl":
        try:
            dist.init_process_group(**kw, device_id=dev)
        except TypeError:  # an older torch without device_id
            dist.init_process_group(**kw)
    else:
        dist.init_process_group(**kw)
    if dist.get_world_size() != world or dist.get_rank() != rank:
        raise RuntimeError(f"process group says rank {dist.get_rank()} of "
                           f"{dist.get_world_size()}, the environment {rank} of {world}")
    comm = Comm(dist, a.backend, world)
    summary["init_s"] = round(time.perf_counter() - t0, 3)

    n = a.probe_mib * MiB // 4
    if n:
        set_stage("early probe")
        ok, ms = probe(torch, sync, comm, n, rank, world, dev)
        summary["probe_early_ok"], summary["probe_early_ms"] = ok, round(ms, 3)
        late = pattern(torch, n, dev, rank + 1)

    gen = torch.Generator(device="cpu").manual_seed(a.seed + 1)
    prompt_cpu = torch.randint(0, a.vocab, (a.prompt_len,), generator=gen, dtype=torch.long)

    set_stage("build")
    t0 = time.perf_counter()
    with torch.no_grad():
        model = TPLlama(a, rank, world, comm, dev)
        sync()
        summary["build_s"] = round(time.perf_counter() - t0, 3)
        wb = model.weight_bytes()
        summary["weight_bytes"] = wb
        summary["weight_mib"] = round(wb / MiB, 1)
        summary["weight_checksum"] = model.checksum()
        print(f"rank {rank}/{world} ({a.backend}, {summary.get('device', dev)}, torch "
              f"{torch.__version__}, nccl {summary.get('nccl', '-')}, flexshim "
              f"{'preloaded' if summary['shim_loaded'] else 'not loaded'}): weights "
              f"{wb / MiB:.1f} MiB, built in {summary['build_s']} s",
              file=sys.stderr, flush=True)

        set_stage("prefill")
        prompt = prompt_cpu.to(dev)
        sync()
        t0 = time.perf_counter()
        logits = model.forward(prompt, 0)
        prefill_logits = logits.float().cpu()
        cur = logits.argmax()
        sync()
        summary["prefill_ms"] = round((time.perf_counter() - t0) * 1000, 3)

        toks = [cur]
        lsums = []
        step_times = []
        t_dec = time.perf_counter()
        for step in range(a.steps):
            set_stage(f"decode step {step + 1}")
            sync()
            ts = time.perf_counter()
            logits = model.forward(cur.view(1), a.prompt_len + step)
            cur = logits.argmax()
            toks.append(cur)
            lsums.append(logits.float().sum())
            sync()
            step_times.append(time.perf_counter() - ts)
        decode_s = time.perf_counter() - t_dec
        tokens = [int(x) for x in torch.stack(toks).cpu().tolist()]
        decode_logit_sums = [float(x) for x in torch.stack(lsums).cpu().tolist()] \
            if lsums else []

        if n:
            set_stage("late probe")
            ok, ms = probe(torch, sync, comm, n, rank, world, dev, tensor=late)
            summary["probe_late_ok"], summary["probe_late_ms"] = ok, round(ms, 3)
            del late
        set_stage("checksum")
        summary["weight_checksum_end"] = model.checksum()
        if dev.type == "cuda":
            summary["max_memory_allocated_mib"] = round(
                torch.cuda.max_memory_allocated(dev) / MiB, 1)
            summary["max_memory_reserved_mib"] = round(
                torch.cuda.max_memory_reserved(dev) / MiB, 1)
    tail = step_times[a.warmup:] if len(step_times) > a.warmup else step_times
    summary.update({
        "steps": a.steps,
        "warmup": a.warmup,
        "layers": a.layers,
        "prompt_len": a.prompt_len,
        "seed": a.seed,
        "collectives": comm.calls,
        "decode_s": round(decode_s, 3),
        "decode_ms_per_step": round(decode_s / a.steps * 1000, 3) if a.steps else None,
        "median_step_ms": round(statistics.median(tail) * 1000, 4) if tail else None,
        "min_step_ms": round(min(tail) * 1000, 4) if tail else None,
        "max_step_ms": round(max(tail) * 1000, 4) if tail else None,
        "tokens_head": tokens[:8],
    })
    set_stage("save")
    torch.save({
        "prefill_logits": prefill_logits,
        "tokens": tokens,
        "decode_logit_sums": decode_logit_sums,
        "step_times": step_times,
        "weight_bytes": wb,
        "weight_checksum": summary["weight_checksum"],
        "weight_checksum_end": summary["weight_checksum_end"],
        "probe_early_ok": summary.get("probe_early_ok"),
        "probe_late_ok": summary.get("probe_late_ok"),
        "rank": rank,
        "world": world,
        "backend": a.backend,
    }, base + ".pt")
    set_stage("destroy_process_group")
    dist.destroy_process_group()
    summary["total_s"] = round(time.perf_counter() - t_start, 2)
    write_json(base + ".json", summary)
    print(json.dumps(summary), flush=True)
    return 0




def write_json(path, obj):
    try:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(obj, f)
            f.write("\n")
        os.replace(tmp, path)
    except OSError as e:
        print(f"cannot write {path}: {e}", file=sys.stderr)


def read_json(path):
    """The JSON object in PATH (the whole file, else its last line starting with '{'); {}."""
    try:
        text = open(path, errors="replace").read()
    except OSError:
        return {}
    try:
        obj = json.loads(text)
        return obj if isinstance(obj, dict) else {}
    except ValueError:
        pass
    obj = {}
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                pass
    return obj


# ---- compare ------------------------------------------------------------------------------------
def load_pt(path):
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001
        return torch.load(path, map_location="cpu", weights_only=False)


def compare_pair(ref, test, world, steps):
    """(ok, why, details): TEST's ranks against REF's, rank by rank."""
    import torch

    problems, details = [], []
    tests = {}
    for r in range(world):
        pa, pb = f"{ref}-rank{r}.pt", f"{test}-rank{r}.pt"
        if not os.path.exists(pa):
            problems.append(f"no reference output for rank {r}")
            continue
        if not os.path.exists(pb):
            problems.append(f"no output for rank {r}")
            continue
        try:
            a, b = load_pt(pa), load_pt(pb)
        except Exception as e:  # noqa: BLE001
            problems.append(f"rank {r}: cannot load: {e!r}")
            continue
        tests[r] = b
        if b.get("weight_checksum_end") != b.get("weight_checksum"):
            problems.append(f"rank {r}: weights changed during the run")
        if a.get("weight_checksum") != b.get("weight_checksum"):
            details.append(f"rank {r}: weight checksums differ ({a.get('weight_checksum')!r} vs "
                           f"{b.get('weight_checksum')!r}): not the same model")
        for p in ("probe_early_ok", "probe_late_ok"):
            if b.get(p) is False:
                problems.append(f"rank {r}: {p.replace('_ok', '')} all_reduce wrong")
        la, lb = a["prefill_logits"], b["prefill_logits"]
        if la.shape != lb.shape or la.dtype != lb.dtype:
            problems.append(f"rank {r}: prefill logits {tuple(la.shape)} vs {tuple(lb.shape)}")
        elif not torch.equal(la, lb):
            nd = int((la != lb).sum().item())
            md = float((la - lb).abs().max().item())
            problems.append(f"rank {r}: prefill logits differ ({nd}/{la.numel()}, max {md:.4g})")
        ta, tb = a["tokens"], b["tokens"]
        n = min(len(ta), len(tb)) if steps is None else steps + 1
        if len(ta) < n or len(tb) < n:
            problems.append(f"rank {r}: {len(ta)} and {len(tb)} tokens, need {n}")
        else:
            first = next((i for i in range(n) if ta[i] != tb[i]), None)
            if first is not None:
                problems.append(f"rank {r}: tokens differ from index {first} "
                                f"({ta[first]} vs {tb[first]})")
            else:
                details.append(f"rank {r}: prefill logits bit-identical, {n} tokens identical")
        sa, sb = a.get("decode_logit_sums") or [], b.get("decode_logit_sums") or []
        m = min(len(sa), len(sb))
        fs = next((i for i in range(m) if sa[i] != sb[i]), None)
        if fs is not None:
            details.append(f"rank {r}: NOTE decode logit sums differ from step {fs + 1}")
    if len(tests) > 1:
        t0 = tests[min(tests)]["tokens"]
        for r, b in tests.items():
            if b["tokens"] != t0:
                problems.append(f"rank {r}'s tokens differ from rank {min(tests)}'s in one run")
    return not problems, "; ".join(problems) or "identical", details


def cmd_compare(a):
    bad = 0
    for kind, pairs in (("pair", a.pair or []), ("info", a.info_pair or [])):
        for ref, test in pairs:
            name = os.path.basename(test)
            try:
                ok, why, details = compare_pair(ref, test, a.world, a.steps)
            except Exception as e:  # noqa: BLE001
                ok, why, details = False, f"compare failed: {e!r}", []
            print(f"compare {os.path.basename(ref)} vs {name} ({a.world} rank(s)):")
            for d in details:
                print(f"  {d}")
            if kind == "info":
                print(f"NOTE {name} vs {os.path.basename(ref)}: "
                      f"{'identical' if ok else 'different: ' + why}")
            else:
                print(f"RESULT {name} {'PASS' if ok else 'FAIL'} {why}")
                bad += 0 if ok else 1
    return 1 if bad else 0


# ---- shim log ----------------------------------------------------------------------------------
def parse_shim_log(path):
    """tests/gpu/shimlog.py's reading of a shim log; warn/error lines of every process of the
    job, as "[pid] level: text", and counted."""
    s = shimlog.parse(path)
    s["warn"] = [f"[{pid}] {level}: {text}" for pid, level, text in s["warn_all"]]
    s["kv"]["warnings"] = sum(1 for w in s["warn_all"] if w[1] == "warn")
    s["kv"]["errors"] = sum(1 for w in s["warn_all"] if w[1] == "error")
    return s


def cmd_counters(a):
    s = parse_shim_log(a.log)
    if not s["exists"]:
        print(f"  (no shim log {a.log}: {s.get('error')})")
    for line in s["exit_lines"]:
        print("  " + line)
    for line in s["warn"][:15]:
        print("  " + line)
    print("COUNTERS " + " ".join(f"{k}={v}" for k, v in s["kv"].items()))
    return 0


def cmd_jget(a):
    obj = read_json(a.file)
    for k in a.keys:
        v = obj.get(k)
        print("" if v is None else v)
    return 0


# ---- evaluate one run ---------------------------------------------------------------------------
def fnum(v, fmt="{:.1f}"):
    return "?" if v is None else fmt.format(v)


def cmd_evaluate(a):
    d = a.runs_dir
    meta = read_json(os.path.join(d, f"{a.name}.meta.json"))
    world = int(meta.get("world", 1))
    shim = bool(meta.get("limits"))
    limits = (meta.get("limits") or "").split()
    try:
        rc = int(open(os.path.join(d, f"{a.name}.rc")).read().strip())
    except (OSError, ValueError):
        rc = None
    fails, warns, notes = [], [], []
    how = f"shim at {' '.join(limits)} per rank, {meta.get('safety')}" if shim else "no shim"
    print(f"=== evaluate {a.name}: {world} rank(s), backend {meta.get('backend')}, {how}"
          f"{', profile recorded' if meta.get('profile') else ''}; exit {rc}")
    if rc is None:
        fails.append("did not run")
    elif rc == 124 or rc == 137:
        fails.append(f"timed out (exit {rc})")
    elif rc != 0:
        fails.append(f"exit {rc}")

    # the comparison with the reference
    cmp_line = None
    if a.compare and a.ref:
        try:
            for line in open(a.compare, errors="replace"):
                if line.startswith(f"RESULT {a.name} "):
                    cmp_line = line.strip()
        except OSError:
            pass
        if cmp_line is None:
            fails.append("not compared")
        elif " FAIL " in cmp_line + " ":
            fails.append("outputs differ: " + cmp_line.split(" FAIL ", 1)[1])
        else:
            notes.append("outputs identical to " + a.ref)

    # literal placeholders: the shim did not expand {rank}
    for f in sorted(os.listdir(d)):
        if f.startswith(a.name + "-") and "{rank}" in f:
            fails.append(f"a file named {f}: {{rank}} not expanded")

    ranks = []
    for r in range(world):
        j = read_json(os.path.join(d, f"{a.name}-rank{r}.json"))
        ref = read_json(os.path.join(d, f"{a.ref}-rank{r}.json")) if a.ref else {}
        part = [f"r{r}"]
        if not j:
            fails.append(f"rank {r}: no JSON output")
            ranks.append(f"r{r}: no output")
            continue
        if j.get("error"):
            fails.append(f"rank {r}: {j['error']}")
        for p in ("probe_early_ok", "probe_late_ok"):
            if j.get(p) is False:
                fails.append(f"rank {r}: {p.replace('_ok', '')} all_reduce result wrong")
        med, rmed = j.get("median_step_ms"), ref.get("median_step_ms")
        part.append(f"{fnum(med, '{:.2f}')}ms")
        if shim and rmed:
            part.append(f"x{med / rmed:.1f} ref" if med else "x? ref")
        if shim and j.get("shim_loaded") is False:
            fails.append(f"rank {r}: flexshim not loaded in the process")
        if not shim and j.get("shim_loaded"):
            fails.append(f"rank {r}: flexshim loaded in a run meant without it")
        if shim:
            budget_mib = None
            if r < len(limits) and limits[r].endswith("MiB"):
                try:
                    budget_mib = float(limits[r][:-3])
                except ValueError:
                    pass
            wb = j.get("weight_bytes")
            if budget_mib is not None and wb and rmed:
                off = max(0.0, wb - budget_mib * MiB)
                lim = max(rmed, off / (a.link_gbps * 1e9) * 1000)
                part.append(f"limit {lim:.2f}ms" + (f" (x{med / lim:.1f})" if med else ""))
            log = os.path.join(d, f"{a.name}-shim-rank{r}.log")
            s = parse_shim_log(log)
            kv = s["kv"]
            print(f"--- rank {r}: shim log {os.path.basename(log)} "
                  f"({'present, %d lines' % kv['lines'] if s['exists'] else 'MISSING'})")
            for line in s["exit_lines"]:
                print("  " + line)
            for line in s["plan"][-6:]:
                print("  " + line)
            if s["warn"]:
                print(f"  {len(s['warn'])} warn/error line(s); the first ones:")
                for line in s["warn"][:12]:
                    print("    " + line)
            if s["nccl"]:
                print(f"  {len(s['nccl'])} line(s) naming NCCL; the first ones:")
                for line in s["nccl"][:6]:
                    print("    " + line)
            unmanaged = [w for w in s["warn"] if "unmanaged" in w or "pass through" in w]
            print("  COUNTERS " + " ".join(f"{k}={v}" for k, v in kv.items()))
            if not s["exists"]:
                fails.append(f"rank {r}: no per-rank shim log {os.path.basename(log)}")
            elif not kv["found"]:
                fails.append(f"rank {r}: no exit counters in its shim log")
            else:
                if kv["managed"] <= 0:
                    fails.append(f"rank {r}: nothing managed"
                                 + (f" ({unmanaged[0]})" if unmanaged else ""))
                elif kv["evictions"] + kv["placed_on_host"] <= 0:
                    lim = limits[r] if r < len(limits) else "?"
                    fails.append(f"rank {r}: nothing offloaded under {lim}")
                if kv["failures"] > 0:
                    warns.append(f"rank {r}: {kv['failures']} internal failures")
                if kv["errors"] > 0:
                    warns.append(f"rank {r}: {kv['errors']} shim error lines")
                part.append(f"ev {kv['evictions']} fi {kv['faults']} host-srv {kv['host_served']} "
                            f"sync {kv['syncs']} pass {kv['passthrough']}"
                            f"({kv['passthrough_bytes'] / MiB:.0f}MiB) unk {kv['unknown']}")
                if unmanaged:
                    part.append(f"{len(unmanaged)} unmanaged/pass-through warning(s)")
            if meta.get("profile"):
                prof = os.path.join(d, f"{a.name}-prof-rank{r}.json")
                if not os.path.exists(prof):
                    warns.append(f"rank {r}: no profile {os.path.basename(prof)} "
                                 "(discovery/profiling did not finish?)")
                elif a.tool and os.path.exists(a.tool):
                    env = dict(os.environ)
                    env.pop("LD_PRELOAD", None)
                    libdir = os.path.join(os.path.dirname(os.path.dirname(a.tool)), "lib")
                    env["LD_LIBRARY_PATH"] = libdir + (":" + env["LD_LIBRARY_PATH"]
                                                       if env.get("LD_LIBRARY_PATH") else "")
                    try:
                        p = subprocess.run([a.tool, "check", prof], capture_output=True,
                                           text=True, timeout=10, env=env)
                        msg = (p.stdout + p.stderr).strip().splitlines()
                        msg = msg[-1] if msg else ""
                        print(f"  profile {os.path.basename(prof)}: check exit "
                              f"{p.returncode}: {msg}")
                        if p.returncode != 0:
                            warns.append(f"rank {r}: profile check failed: {msg}")
                        else:
                            part.append("profile ok")
                    except Exception as e:  # noqa: BLE001
                        warns.append(f"rank {r}: profile check: {e!r}")
                else:
                    part.append("profile present")
        pl, rpl = j.get("probe_late_ms"), ref.get("probe_late_ms")
        if pl is not None:
            part.append(f"late probe {pl:.1f}ms" + (f" (ref {rpl:.1f})" if shim and rpl else ""))
        ranks.append(" ".join(part))
        print(f"  rank {r} JSON: median step {med} ms (reference {rmed}), prefill "
              f"{j.get('prefill_ms')} ms, weights {j.get('weight_mib')} MiB, probes "
              f"{j.get('probe_early_ok')}/{j.get('probe_late_ok')} "
              f"({j.get('probe_early_ms')}/{j.get('probe_late_ms')} ms), mem_get_info "
              f"{j.get('mem_get_info_mib')}, max allocated {j.get('max_memory_allocated_mib')} "
              f"MiB, total {j.get('total_s')} s")
    result = "FAIL" if fails else ("WARN" if warns else "PASS")
    why = "; ".join(fails + warns)
    row = " | ".join(ranks)
    if why:
        row += " || " + why
    elif notes:
        row += " || " + "; ".join(notes)
    print(f"ROW|{result}|{row}")
    return 0


# ---- main ---------------------------------------------------------------------------------------
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True, help="output prefix: PREFIX-rank{R}.pt/.json")
    r.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    r.add_argument("--steps", type=int, default=32)
    r.add_argument("--warmup", type=int, default=8, help="decode steps left out of the median")
    r.add_argument("--prompt-len", type=int, default=512)
    r.add_argument("--layers", type=int, default=8)
    r.add_argument("--hidden", type=int, default=2048)
    r.add_argument("--intermediate", type=int, default=5632)
    r.add_argument("--heads", type=int, default=16)
    r.add_argument("--kv-heads", type=int, default=8)
    r.add_argument("--vocab", type=int, default=32000)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--probe-mib", type=int, default=64)
    r.add_argument("--deterministic", action="store_true")
    r.add_argument("--cpu", action="store_true",
                   help="run on the CPU with gloo: checks the model's logic off the GPU machine")
    r.add_argument("--dist-timeout", type=int, default=120, help="process group timeout (s)")
    r.add_argument("--max-seconds", type=int, default=0, help="watchdog (0: none)")
    c = sub.add_parser("compare")
    c.add_argument("--world", type=int, required=True)
    c.add_argument("--steps", type=int, default=None)
    c.add_argument("--pair", nargs=2, action="append", metavar=("REF", "TEST"))
    c.add_argument("--info-pair", nargs=2, action="append", metavar=("REF", "TEST"))
    e = sub.add_parser("evaluate")
    e.add_argument("runs_dir")
    e.add_argument("name")
    e.add_argument("ref", nargs="?", default="")
    e.add_argument("--compare", default="")
    e.add_argument("--tool", default="")
    e.add_argument("--link-gbps", type=float, default=55.0)
    k = sub.add_parser("counters")
    k.add_argument("log")
    j = sub.add_parser("jget")
    j.add_argument("file")
    j.add_argument("keys", nargs="*")
    a = ap.parse_args(argv)
    if a.cmd == "run":
        if a.steps < 1 or a.layers < 1 or a.prompt_len < 2 or a.probe_mib < 0:
            ap.error("--steps >= 1, --layers >= 1, --prompt-len >= 2, --probe-mib >= 0")
        return cmd_run(a)
    return {"compare": cmd_compare, "evaluate": cmd_evaluate, "counters": cmd_counters,
            "jget": cmd_jget}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
