"""The hand-written per-layer prefetch pipeline of the issue-5 benchmark (system "pipeline").

Used by bench/bench.py (`--system pipeline`); not run on its own. What it does, for a
transformers Llama model whose weights were built on the GPU:

  - plan_layers(): how many decoder layers stay resident under the budget. Everything else that
    is not a decoder layer (embeddings, final norm, lm_head, the rotary buffer) always stays
    resident. The budget is charged honestly with
        fixed bytes (non-layer weights)
      + headroom (activations, KV cache, logits, allocator rounding: measured by the noshim run
        of the same workload as its peak reserved bytes minus the weight bytes, else estimated)
      + 2 slots of one layer each (only when some layer is streamed)
      + resident layers x layer bytes.
    At 100% of the weight bytes this means that a few layers are streamed: the slots and the
    headroom need room too.
  - spread(): which layers are streamed: spread evenly over the stack, so that the copy of the
    next streamed layer overlaps the compute of the resident layers before it as well.
  - LayerStreamer: the streamed layers' weights live in pinned host memory (one flat buffer per
    layer) and run from two flat GPU slots. Before streamed layer k runs (forward pre-hook),
    the main stream waits for the copy of k (a CUDA event), and the copy of the next streamed
    layer (in cyclic order, so the first one of the next step is fetched during the last one of
    this step) is queued on a side stream into the other slot; that copy first waits for the
    event recorded after the compute of the layer that used the slot before (forward hook).
    A layer's parameters point at views of the slot it runs from (param.data = view), so the
    model's own code runs unchanged.

Needs torch only when LayerStreamer is built; plan_layers() and spread() are pure Python.
"""

ALIGN_BYTES = 512  # each parameter's view in a slot starts 512-byte aligned, as torch's blocks do


def spread(n_layers, n_streamed):
    """Indices of N_STREAMED layers out of N_LAYERS, spread evenly (strictly increasing)."""
    if n_streamed <= 0:
        return []
    if n_streamed >= n_layers:
        return list(range(n_layers))
    return [(i * n_layers) // n_streamed for i in range(n_streamed)]


def plan_layers(budget_bytes, fixed_bytes, layer_bytes, slot_bytes, n_layers, headroom_bytes):
    """How many decoder layers stay resident; a dict with the accounting (see the module doc).

    fits is False when even fixed + headroom + two slots exceed the budget."""
    plan = {
        "budget_bytes": int(budget_bytes),
        "fixed_bytes": int(fixed_bytes),
        "layer_bytes": int(layer_bytes),
        "slot_bytes": int(slot_bytes),
        "headroom_bytes": int(headroom_bytes),
        "n_layers": int(n_layers),
    }
    avail = budget_bytes - fixed_bytes - headroom_bytes
    if avail >= n_layers * layer_bytes:
        plan.update(fits=True, resident=n_layers, streamed=0, slots=0,
                    planned_bytes=fixed_bytes + headroom_bytes + n_layers * layer_bytes)
        return plan
    room = avail - 2 * slot_bytes
    if room < 0:
        plan.update(fits=False, resident=0, streamed=n_layers, slots=2,
                    planned_bytes=fixed_bytes + headroom_bytes + 2 * slot_bytes,
                    reason="fixed weights + headroom + two slots exceed the budget")
        return plan
    resident = min(n_layers - 1, int(room // layer_bytes))
    plan.update(fits=True, resident=resident, streamed=n_layers - resident, slots=2,
                planned_bytes=fixed_bytes + headroom_bytes + 2 * slot_bytes
                + resident * layer_bytes)
    return plan


def _align(n, a):
    return (n + a - 1) // a * a


def flat_layout(named_params, element_size):
    """[(name, shape, offset, numel)] of the parameters packed in one flat buffer, each aligned
    to ALIGN_BYTES; and the buffer's length in elements."""
    step = max(1, ALIGN_BYTES // element_size)
    out, off = [], 0
    for name, shape, numel in named_params:
        off = _align(off, step)
        out.append((name, tuple(shape), off, numel))
        off += numel
    return out, _align(off, step)


class LayerStreamer:
    """Streams the weights of LAYERS[i] for i in STREAMED through two GPU slots (module doc)."""

    def __init__(self, layers, streamed, device):
        import torch

        self.torch = torch
        self.layers = layers
        self.order = list(streamed)  # streamed layer indices, in the order they run
        self.copies = 0  # host-to-device copies queued
        self.mispredicts = 0  # a layer ran that was not the one prefetched into its slot
        self.copied_bytes = 0
        first = layers[self.order[0]]
        params0 = list(first.named_parameters())
        self.dtype = params0[0][1].dtype
        self.layout, self.numel = flat_layout(
            [(n, p.shape, p.numel()) for n, p in params0], params0[0][1].element_size())
        self.slot_bytes = self.numel * params0[0][1].element_size()

        # Pinned host copies: one flat buffer per streamed layer, so one copy moves a layer.
        self.host = []
        for li in self.order:
            named = list(layers[li].named_parameters())
            if [(n, tuple(p.shape), p.dtype) for n, p in named] != \
                    [(n, s, self.dtype) for n, s, _, _ in self.layout]:
                raise RuntimeError(f"layer {li} does not have the parameters of layer "
                                   f"{self.order[0]}: the layers must all be alike")
            buf = torch.empty(self.numel, dtype=self.dtype, pin_memory=True)
            for (_, _, off, numel), (_, p) in zip(self.layout, named):
                buf[off:off + numel].copy_(p.detach().reshape(-1))
            self.host.append(buf)

        # Two GPU slots and, per slot, a view for each parameter.
        self.slots = [torch.empty(self.numel, dtype=self.dtype, device=device) for _ in range(2)]
        self.views = [[s[off:off + numel].view(shape) for _, shape, off, numel in self.layout]
                      for s in self.slots]
        # Point every streamed layer at slot 0: this drops its own GPU weights.
        self.at = {}
        for li in self.order:
            self._point(li, 0)
        torch.cuda.synchronize()

        self.side = torch.cuda.Stream(device=device)
        self.copy_ev = [torch.cuda.Event(), torch.cuda.Event()]  # copy into slot s done
        self.free_ev = [torch.cuda.Event(), torch.cuda.Event()]  # last compute from slot s done
        self.free_recorded = [False, False]
        self.holds = [None, None]  # position (in self.order) of the layer copied into each slot
        self.turn = 0  # the slot the next streamed layer runs from
        self.handles = []
        for k, li in enumerate(self.order):
            layer = layers[li]
            self.handles.append(layer.register_forward_pre_hook(self._pre_hook(k)))
            self.handles.append(layer.register_forward_hook(self._post_hook(k)))
        self._issue(0, 0)  # the first streamed layer, ahead of the first step

    def _point(self, li, s):
        """Makes layer LI's parameters views of slot S (nothing to do when they already are)."""
        if self.at.get(li) == s:
            return
        for (_, p), v in zip(self.layers[li].named_parameters(), self.views[s]):
            p.data = v
        self.at[li] = s

    def _issue(self, s, k):
        """Queues the copy of streamed layer K (position in self.order) into slot S on the side
        stream, after the last compute that read slot S."""
        torch = self.torch
        with torch.cuda.stream(self.side):
            if self.free_recorded[s]:
                self.side.wait_event(self.free_ev[s])
            self.slots[s].copy_(self.host[k], non_blocking=True)
            self.copy_ev[s].record(self.side)
        self.holds[s] = k
        self.copies += 1
        self.copied_bytes += self.slot_bytes

    def _pre_hook(self, k):
        def hook(module, args):
            torch = self.torch
            s = self.turn
            if self.holds[s] != k:  # not the layer prefetched: fetch it now (and count it)
                self.mispredicts += 1
                self._issue(s, k)
            torch.cuda.current_stream().wait_event(self.copy_ev[s])
            self._point(self.order[k], s)
            # The next streamed layer goes into the other slot while this one computes.
            self._issue(1 - s, (k + 1) % len(self.order))
            return None
        return hook

    def _post_hook(self, k):
        def hook(module, args, output):
            s = self.turn
            self.free_ev[s].record(self.torch.cuda.current_stream())
            self.free_recorded[s] = True
            self.turn = 1 - s
            return None
        return hook

    def stats(self):
        return {"copies": self.copies, "mispredicts": self.mispredicts,
                "copied_bytes": self.copied_bytes, "slot_bytes": self.slot_bytes,
                "host_pinned_bytes": self.slot_bytes * len(self.order)}
