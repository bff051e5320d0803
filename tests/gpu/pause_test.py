"""GPU test of PAUSE_TRACKING (tests/gpu/run.sh step f): a program whose iteration fits the budget
runs with launch tracking paused, then outgrows the budget, which resumes tracking.

    python3 tests/gpu/pause_test.py [--iters 500] [--outgrow-mib 0]

Discovery needs a few thousand launches (about 26 an iteration here), hence 500 iterations.
Eight 64 MiB weights (fp32 4096 x 4096) and one iteration: the activations pass through the eight
layers (matmul, tanh) and are updated. With --outgrow-mib N, after the iterations one more
allocation of N MiB is made (not in the profile: recorded without it), filled and read, then
three more iterations run. Prints one line, a checksum of the final activations and of the
extra allocation's sum: the same with and without the shim.
"""
import argparse
import hashlib

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=500)
    ap.add_argument("--outgrow-mib", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(0)
    weights = [torch.randn(4096, 4096, device="cuda") / 64 for _ in range(8)]
    x = torch.randn(64, 4096, device="cuda")

    def iteration(x):
        y = x
        for w in weights:
            y = torch.tanh(y @ w)
        return x + 0.01 * y

    for _ in range(args.iters):
        x = iteration(x)
    extra = 0.0
    if args.outgrow_mib:
        big = torch.empty(args.outgrow_mib * 2**20 // 4, device="cuda")
        big.fill_(0.25)
        big.mul_(2.0)
        extra = float(big[:: 1 << 16].sum().item())
        for _ in range(3):
            x = iteration(x)
    torch.cuda.synchronize()
    digest = hashlib.sha256(x.cpu().numpy().tobytes()).hexdigest()[:16]
    print(f"activations {digest} extra {extra}")


if __name__ == "__main__":
    main()
