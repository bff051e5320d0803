#!/usr/bin/env python3
"""Checks the stream and event ordering of bench/prefetch_pipeline.py's LayerStreamer without a
GPU or torch:

  python3 bench/pipeline_order_test.py

A fake `torch` logs what the streamer queues (copies on the side stream, each layer's compute on
the main stream, event records and waits) and gives every queued operation a vector clock. Then,
for every compute of a streamed layer: the last copy into the slot its weights point at that is
ordered before the compute must be of that layer, and every other copy into that slot must be
ordered before or after the compute (never concurrent with it). It also checks that the checker
itself sees the two bugs a streamer could have (no wait for the copy, no wait for the slot to be
free). Exit 0 when all holds.
"""
import itertools
import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
OPS = []  # ["copy", slot id, host buffer, clock] and ("compute", layer, slot ids, clock)


class FakeStream:
    def __init__(self, device=None, name="side"):
        self.name, self.t, self.clock = name, 0, {}

    def tick(self):
        self.t += 1
        self.clock[self.name] = self.t
        return dict(self.clock)

    def wait_event(self, ev):
        for k, v in (ev.clock or {}).items():
            self.clock[k] = max(self.clock.get(k, 0), v)


class FakeEvent:
    def __init__(self, enable_timing=False):
        self.clock = None

    def record(self, stream=None):
        self.clock = dict((stream or cuda.cur).clock)


class FakeBuf:
    ids = itertools.count()

    def __init__(self, n, kind, base=None):
        self.n, self.kind = n, kind
        self.base = base if base is not None else self
        self.id = next(FakeBuf.ids) if base is None else base.id

    def __getitem__(self, sl):
        return FakeBuf(sl.stop - sl.start, self.kind, self.base)

    def view(self, shape):
        return self

    def reshape(self, *shape):
        return self

    def copy_(self, src, non_blocking=False):
        if self.kind == "gpu" and src.kind == "host":
            OPS.append(["copy", self.base.id, src.base, cuda.cur.tick()])
        return self


class _StreamCtx:
    def __init__(self, s):
        self.s = s

    def __enter__(self):
        self.prev, cuda.cur = cuda.cur, self.s

    def __exit__(self, *exc):
        cuda.cur = self.prev


cuda = types.SimpleNamespace(cur=FakeStream(name="main"), Stream=FakeStream, Event=FakeEvent,
                             stream=_StreamCtx, current_stream=lambda: cuda.cur,
                             synchronize=lambda: None)
sys.modules["torch"] = types.SimpleNamespace(
    cuda=cuda, device=lambda *a: "cuda",
    empty=lambda n, dtype=None, pin_memory=False, device=None:
        FakeBuf(n, "host" if pin_memory else "gpu"))

import prefetch_pipeline as pl  # noqa: E402  (after the fake torch)


class FakeParam:
    def __init__(self, shape):
        self.shape, self.dtype = shape, "bf16"
        self.data = FakeBuf(self.numel(), "gpu")

    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def element_size(self):
        return 2

    def detach(self):
        return self.data


class FakeLayer:
    def __init__(self, i):
        self.i = i
        self.params = [("q", FakeParam((4, 4))), ("norm", FakeParam((4,))),
                       ("mlp", FakeParam((4, 8)))]
        self.pre, self.post = [], []

    def named_parameters(self):
        return list(self.params)

    def register_forward_pre_hook(self, h):
        self.pre.append(h)

    def register_forward_hook(self, h):
        self.post.append(h)

    def __call__(self):
        for h in self.pre:
            h(self, ())
        reads = tuple(sorted({p.data.base.id for _, p in self.params}))
        OPS.append(("compute", self.i, reads, cuda.cur.tick()))
        for h in self.post:
            h(self, (), None)


def before(a, b):
    """Clock a happens before clock b."""
    return a != b and all(b.get(k, 0) >= v for k, v in a.items())


def run(n, streamed, steps):
    """Violations of the ordering rules over STEPS forwards of N layers; the streamer's stats."""
    OPS.clear()
    cuda.cur = FakeStream(name="main")
    layers = [FakeLayer(i) for i in range(n)]
    st = pl.LayerStreamer(layers, streamed, "cuda")
    for _ in range(steps):
        for layer in layers:
            layer()
    which = {id(st.host[k]): li for k, li in enumerate(st.order)}
    for o in OPS:
        if o[0] == "copy":
            o[2] = which[id(o[2])]
    bad = 0
    for op in OPS:
        if op[0] != "compute" or op[1] not in streamed:
            continue
        if len(op[2]) != 1:  # all of a streamed layer's weights come from one slot
            bad += 1
            continue
        copies = [o for o in OPS if o[0] == "copy" and o[1] == op[2][0]]
        ordered = [o for o in copies if before(o[3], op[3])]
        concurrent = [o for o in copies if not before(o[3], op[3]) and not before(op[3], o[3])]
        last = max(ordered, key=lambda o: o[3].get("side", 0)) if ordered else None
        if last is None or last[2] != op[1] or concurrent:
            bad += 1
    return bad, st.stats()


def main():
    fails = 0
    for n, k, steps in ((8, 8, 3), (8, 3, 3), (8, 1, 3), (32, 16, 2), (22, 5, 4), (6, 2, 5),
                        (7, 7, 3)):
        streamed = pl.spread(n, k)
        bad, stats = run(n, streamed, steps)
        ok = bad == 0 and stats["copies"] == k * steps + 1 and stats["mispredicts"] == 0
        fails += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {n} layers, streamed {streamed}, {steps} steps: "
              f"{bad} violations, {stats['copies']} copies, {stats['mispredicts']} mispredicts")
    # The checker sees a streamer that does not wait for the slot to be free...
    issue = pl.LayerStreamer._issue

    def issue_no_free_wait(self, s, k):
        self.free_recorded[s] = False
        return issue(self, s, k)

    pl.LayerStreamer._issue = issue_no_free_wait
    bad = run(8, [0, 2, 5], 3)[0]
    pl.LayerStreamer._issue = issue
    fails += bad == 0
    print(f"{'ok  ' if bad else 'FAIL'} a streamer without the slot-free wait: {bad} violations")
    # ... and one whose compute does not wait for the copy.
    wait = FakeStream.wait_event
    FakeStream.wait_event = lambda self, ev: None if self.name == "main" else wait(self, ev)
    bad = run(8, [0, 2, 5], 3)[0]
    FakeStream.wait_event = wait
    fails += bad == 0
    print(f"{'ok  ' if bad else 'FAIL'} a streamer without the copy wait: {bad} violations")
    print(f"pipeline_order_test: {'PASS' if not fails else f'FAIL ({fails})'}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
