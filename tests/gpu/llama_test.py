#!/usr/bin/env python3
"""Llama-style model test for flexshim (GPU machine only; no network access).

  python3 llama_test.py run --out FILE --steps N [--layers L] [--seed S] [--prompt-len P]
                            [--time-steps] [--warmup W]
  python3 llama_test.py compare A B [--steps N]

run: builds a LlamaForCausalLM from a transformers LlamaConfig (hidden 2048, intermediate 5632,
22 layers, 32 heads, 8 KV heads, vocab 32000: about 1.1 G parameters, 2.2 GB in bf16) with random
weights (torch.manual_seed(seed)), directly on cuda in bfloat16, SDPA attention; runs a prefill
of a deterministic random prompt (batch 1, P tokens) and N greedy decode steps with the KV cache
(manual argmax loop). A background thread samples this process's GPU memory through NVML every
20 ms (nvidia-smi when pynvml is unusable) and keeps the maximum. Saves to FILE (torch.save):
  prefill_logits  float32 CPU tensor, logits of the last prompt position
  tokens          list of N+1 ints: tokens[0] is the prefill's argmax, tokens[k] the argmax of
                  decode step k (whose input was tokens[k-1])
  decode_logit_sums  list of N floats, float32 sum of each decode step's logits (diagnostic)
  step_times      per-step seconds (only with --time-steps: synchronize around every step)
  max_process_mem bytes (see mem_method), weight_bytes, weight_checksum, ...
and prints one line of JSON (starting with '{') to stdout.

compare: prefill logits must be bit-identical (torch.equal) and the first N+1 tokens equal
(all of them without --steps). Prints the details of a mismatch and exits 1 on one.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

MiB = 1 << 20
# No network: the model is built from a config, nothing is downloaded.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


# ---- memory sampling -------------------------------------------------------------------------
class MemSampler(threading.Thread):
    """Samples this process's GPU memory every INTERVAL seconds and keeps maxima of:
    - pid: NVML's per-process used memory for a process whose pid is ours;
    - single: the same when exactly one compute process is listed (pid namespaces, as in a
      container, can hide our own pid from NVML);
    - device: the device's used memory minus what was used before this process touched CUDA.
    best() returns the first of those that was ever seen, and how it was measured."""

    def __init__(self, interval=0.02):
        super().__init__(daemon=True)
        self.interval = interval
        self.pid = os.getpid()
        self.stop_evt = threading.Event()
        self.max_pid = None
        self.max_single = None
        self.max_device = None
        self.samples = 0
        self.errors = 0
        self.last_error = None
        self.backend = None
        self.nvml = None
        self.handle = None
        self.baseline = None
        idx = 0
        vis = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        if vis.isdigit():
            idx = int(vis)
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(idx)
            self.nvml = pynvml
            self.baseline = pynvml.nvmlDeviceGetMemoryInfo(self.handle).used
            self.backend = "nvml"
        except Exception as e:  # pynvml missing or NVML unusable: nvidia-smi
            self.last_error = f"pynvml: {e!r}"
            self.backend = "nvidia-smi"
            self.baseline = self._smi_device_used()
            self.interval = max(self.interval, 0.2)  # a process per sample
        # The shim must not be preloaded into nvidia-smi (it would log its own counters).
        self.smi_env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}

    def _smi(self, query):
        env = getattr(self, "smi_env", None)
        if env is None:
            env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        r = subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=10, env=env)
        return r.stdout

    def _smi_device_used(self):
        try:
            return int(self._smi("--query-gpu=memory.used").splitlines()[0].strip()) * MiB
        except Exception:
            return None

    @staticmethod
    def _upd(cur, v):
        return v if cur is None or v > cur else cur

    def sample(self):
        procs = []  # (pid, bytes or None)
        dev_used = None
        if self.backend == "nvml":
            nv = self.nvml
            getp = getattr(nv, "nvmlDeviceGetComputeRunningProcesses_v3", None) or \
                nv.nvmlDeviceGetComputeRunningProcesses
            try:
                procs = [(p.pid, p.usedGpuMemory) for p in getp(self.handle)]
            except Exception as e:
                try:
                    procs = [(p.pid, p.usedGpuMemory)
                             for p in nv.nvmlDeviceGetComputeRunningProcesses(self.handle)]
                except Exception:
                    self.errors += 1
                    self.last_error = f"processes: {e!r}"
            try:
                dev_used = nv.nvmlDeviceGetMemoryInfo(self.handle).used
            except Exception as e:
                self.errors += 1
                self.last_error = f"memory info: {e!r}"
        else:
            try:
                for line in self._smi("--query-compute-apps=pid,used_memory").splitlines():
                    parts = [x.strip() for x in line.split(",")]
                    if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                        procs.append((int(parts[0]), int(parts[1]) * MiB))
            except Exception as e:
                self.errors += 1
                self.last_error = f"nvidia-smi: {e!r}"
            dev_used = self._smi_device_used()
        # NVML reports "not available" as None (or as an all-ones value in older bindings).
        procs = [(pid, used if used is not None and 0 <= used < (1 << 60) else None)
                 for pid, used in procs]
        for pid, used in procs:
            if pid == self.pid and used is not None:
                self.max_pid = self._upd(self.max_pid, int(used))
        if len(procs) == 1 and procs[0][1] is not None:
            self.max_single = self._upd(self.max_single, int(procs[0][1]))
        if dev_used is not None and self.baseline is not None:
            self.max_device = self._upd(self.max_device, int(dev_used) - int(self.baseline))
        self.samples += 1

    def run(self):
        while not self.stop_evt.is_set():
            self.sample()
            self.stop_evt.wait(self.interval)

    def stop(self):
        self.stop_evt.set()
        self.join(timeout=5)
        self.sample()

    def best(self):
        if self.max_pid is not None:
            return self.max_pid, f"{self.backend}-pid"
        if self.max_single is not None:
            return self.max_single, f"{self.backend}-single-process"
        if self.max_device is not None:
            return self.max_device, f"{self.backend}-device-delta"
        return None, "unavailable"


# ---- run -------------------------------------------------------------------------------------
def build_llama(seed, **config_kw):
    """LlamaForCausalLM from a LlamaConfig with CONFIG_KW, SDPA attention, random bf16 weights
    built directly on the GPU from torch.manual_seed(SEED), in eval mode. Shared with bench/."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    try:
        config = LlamaConfig(**config_kw, attn_implementation="sdpa")
    except TypeError:
        config = LlamaConfig(**config_kw)
    try:
        config._attn_implementation = "sdpa"
    except Exception:
        pass
    torch.manual_seed(seed)
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(torch.float32)
    model.eval()
    return model


def build_model(args):
    import torch
    import transformers

    model = build_llama(args.seed, hidden_size=2048, intermediate_size=5632,
                        num_hidden_layers=args.layers, num_attention_heads=32,
                        num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096)
    dtypes = sorted({str(p.dtype) for p in model.parameters()})
    devices = sorted({str(p.device) for p in model.parameters()})
    attn = getattr(model.config, "_attn_implementation", None)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}; "
          f"parameter dtypes {dtypes}, devices {devices}, attention {attn}", flush=True)
    if dtypes != ["torch.bfloat16"] or any(not d.startswith("cuda") for d in devices):
        raise SystemExit(f"unexpected parameter dtypes {dtypes} / devices {devices}")
    return model


def cmd_run(args):
    sampler = MemSampler()
    sampler.start()
    t_start = time.perf_counter()

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("CUDA is not available")
    if args.deterministic:
        # Two plain runs of this program diverge after ~130 decode steps (measured): make the
        # kernels deterministic so a long run can be compared token for token.
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cuda.enable_cudnn_sdp(False)
        torch.backends.cuda.enable_flash_sdp(False)
    # The prompt comes from a seeded CPU generator, before any device context.
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 1)
    prompt_cpu = torch.randint(0, 32000, (1, args.prompt_len), generator=gen, dtype=torch.long)

    t0 = time.perf_counter()
    model = build_model(args)
    torch.cuda.synchronize()
    build_s = time.perf_counter() - t0
    params = list(model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in params)
    n_params = sum(p.numel() for p in params)
    print(f"weight bytes: {weight_bytes} ({weight_bytes / 2**30:.3f} GiB, {n_params} parameters, "
          f"{args.layers} layers); built in {build_s:.2f} s", flush=True)

    with torch.inference_mode():
        wsum = torch.stack([p.detach().float().sum() for p in params])
        weight_checksum = float(wsum.double().sum().item())

        prompt = prompt_cpu.to("cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model(input_ids=prompt, use_cache=True)
        last = out.logits[:, -1, :]
        prefill_logits = last[0].float().cpu()
        past = out.past_key_values
        cur = last.argmax(dim=-1, keepdim=True)  # (1, 1)
        torch.cuda.synchronize()
        prefill_s = time.perf_counter() - t0
        del out, last

        tok_list = [cur]
        lsums = []
        step_times = []
        t_dec = time.perf_counter()
        for step in range(args.steps):
            if args.time_steps:
                torch.cuda.synchronize()
                ts = time.perf_counter()
            out = model(input_ids=cur, past_key_values=past, use_cache=True)
            past = out.past_key_values
            lg = out.logits[:, -1, :]
            cur = lg.argmax(dim=-1, keepdim=True)
            tok_list.append(cur)
            lsums.append(lg.float().sum())
            del out, lg
            if args.time_steps:
                torch.cuda.synchronize()
                step_times.append(time.perf_counter() - ts)
            if (step + 1) % 50 == 0 or step + 1 == args.steps:
                torch.cuda.synchronize()
                el = time.perf_counter() - t_dec
                print(f"  decode step {step + 1}/{args.steps}: {el:.2f} s "
                      f"({el / (step + 1) * 1000:.1f} ms/step)", file=sys.stderr, flush=True)
        torch.cuda.synchronize()
        decode_s = time.perf_counter() - t_dec
        tokens = [int(t) for t in torch.cat(tok_list, dim=1).flatten().cpu().tolist()]
        decode_logit_sums = [float(x) for x in torch.stack(lsums).cpu().tolist()] if lsums else []
        # The weights again: an eviction or fault-in that lost data would show here.
        wsum_end = torch.stack([p.detach().float().sum() for p in params])
        weight_checksum_end = float(wsum_end.double().sum().item())

    sampler.stop()
    max_mem, method = sampler.best()
    median_step = None
    if step_times:
        tail = step_times[args.warmup:] if len(step_times) > args.warmup else step_times
        median_step = statistics.median(tail)

    result = {
        "prefill_logits": prefill_logits,
        "tokens": tokens,
        "decode_logit_sums": decode_logit_sums,
        "step_times": step_times,
        "max_process_mem": max_mem,
        "mem_method": method,
        "max_mem_pid": sampler.max_pid,
        "max_mem_single": sampler.max_single,
        "max_mem_device_delta": sampler.max_device,
        "weight_bytes": weight_bytes,
        "weight_checksum": weight_checksum,
        "weight_checksum_end": weight_checksum_end,
        "steps": args.steps,
        "seed": args.seed,
        "layers": args.layers,
        "prompt_len": args.prompt_len,
    }
    torch.save(result, args.out)
    summary = {
        "out": args.out,
        "pid": os.getpid(),
        "steps": args.steps,
        "layers": args.layers,
        "weight_bytes": weight_bytes,
        "weight_mib": round(weight_bytes / MiB, 1),
        "weight_checksum": weight_checksum,
        "weight_checksum_end": weight_checksum_end,
        "max_process_mem": max_mem,
        "max_process_mem_mib": None if max_mem is None else round(max_mem / MiB, 1),
        "mem_method": method,
        "max_mem_pid_mib": None if sampler.max_pid is None else round(sampler.max_pid / MiB, 1),
        "max_mem_single_mib": None if sampler.max_single is None
        else round(sampler.max_single / MiB, 1),
        "max_mem_device_delta_mib": None if sampler.max_device is None
        else round(sampler.max_device / MiB, 1),
        "mem_samples": sampler.samples,
        "mem_errors": sampler.errors,
        "mem_last_error": sampler.last_error,
        "build_s": round(build_s, 3),
        "prefill_s": round(prefill_s, 4),
        "decode_s": round(decode_s, 3),
        "decode_ms_per_step": round(decode_s / args.steps * 1000, 3) if args.steps else None,
        "median_step_ms": None if median_step is None else round(median_step * 1000, 4),
        "timed_steps_used": max(0, len(step_times) - args.warmup) if step_times else 0,
        "tokens_head": tokens[:8],
        "total_s": round(time.perf_counter() - t_start, 2),
    }
    print(json.dumps(summary), flush=True)
    return 0


# ---- compare ---------------------------------------------------------------------------------
def load(path):
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        return torch.load(path, map_location="cpu", weights_only=False)


def cmd_compare(args):
    import torch

    a, b = load(args.a), load(args.b)
    ok = True
    name_a, name_b = os.path.basename(args.a), os.path.basename(args.b)
    print(f"compare {name_a} vs {name_b}")

    for name, r in (("A", a), ("B", b)):
        if r.get("weight_checksum_end") not in (None, r.get("weight_checksum")):
            print(f"  FAIL weights of {name} changed during its run: "
                  f"{r.get('weight_checksum')!r} -> {r.get('weight_checksum_end')!r}")
            ok = False
    if a.get("weight_checksum") != b.get("weight_checksum"):
        print(f"  NOTE weight checksums differ: {a.get('weight_checksum')!r} vs "
              f"{b.get('weight_checksum')!r} (the models are not the same: seed/init?)")
    else:
        print(f"  weight checksum identical ({a.get('weight_checksum')!r})")

    la, lb = a["prefill_logits"], b["prefill_logits"]
    if la.shape != lb.shape or la.dtype != lb.dtype:
        print(f"  FAIL prefill logits: shape/dtype {tuple(la.shape)} {la.dtype} vs "
              f"{tuple(lb.shape)} {lb.dtype}")
        ok = False
    elif not torch.equal(la, lb):
        diff = (la - lb).abs()
        ndiff = int((la != lb).sum().item())
        first = int((la != lb).nonzero()[0].item())
        print(f"  FAIL prefill logits differ: {ndiff}/{la.numel()} elements, max abs diff "
              f"{diff.max().item():.6g}, first at index {first} ({la[first].item()!r} vs "
              f"{lb[first].item()!r}); argmax {int(la.argmax())} vs {int(lb.argmax())}")
        ok = False
    else:
        print(f"  prefill logits bit-identical ({la.numel()} values)")

    ta, tb = a["tokens"], b["tokens"]
    n = min(len(ta), len(tb)) if args.steps is None else args.steps + 1
    if len(ta) < n or len(tb) < n:
        print(f"  FAIL tokens: need {n}, have {len(ta)} and {len(tb)}")
        ok = False
    else:
        first = next((i for i in range(n) if ta[i] != tb[i]), None)
        if first is not None:
            print(f"  FAIL tokens differ: first at index {first} (0 = prefill's token, k = decode "
                  f"step k): {ta[first]} vs {tb[first]}; "
                  f"{sum(1 for i in range(n) if ta[i] != tb[i])}/{n} differ")
            print(f"    A[{first}:{first + 8}] = {ta[first:first + 8]}")
            print(f"    B[{first}:{first + 8}] = {tb[first:first + 8]}")
            ok = False
        else:
            print(f"  tokens identical: {n} (prefill + {n - 1} decode steps)")

    sa, sb = a.get("decode_logit_sums") or [], b.get("decode_logit_sums") or []
    m = min(len(sa), len(sb), n - 1 if n else 0)
    firsts = next((i for i in range(m) if sa[i] != sb[i]), None)
    if firsts is None:
        print(f"  decode logit sums identical over {m} steps")
    else:
        print(f"  NOTE decode logit sums differ first at decode step {firsts + 1}: "
              f"{sa[firsts]!r} vs {sb[firsts]!r} (not bit-identical decode logits)")

    print(f"compare: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--steps", type=int, default=32)
    r.add_argument("--layers", type=int, default=22)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--deterministic", action="store_true",
                   help="deterministic kernels (set CUBLAS_WORKSPACE_CONFIG=:4096:8 too)")
    r.add_argument("--prompt-len", type=int, default=128)
    r.add_argument("--time-steps", action="store_true")
    r.add_argument("--warmup", type=int, default=8, help="timed steps left out of the median")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--steps", type=int, default=None)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        if args.steps < 0 or args.layers < 1 or args.prompt_len < 1:
            ap.error("--steps >= 0, --layers >= 1, --prompt-len >= 1")
        return cmd_run(args)
    return cmd_compare(args)


if __name__ == "__main__":
    sys.exit(main())
