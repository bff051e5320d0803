// The host's cost of queueing a kernel launch, without the shim and with it (tests/gpu/run.sh
// step g). The 7b decode benchmark is host-bound (about 1500 launches in a 20 ms step) and on a
// noisy host its whole processes run 5-30% slow, so a few percent of shim cost cannot be told
// apart there; this program measures the launches alone, in a small process.
//
// usage: launch_probe [STEPS [LAUNCHES]]        (defaults: 300 steps of 1000 launches)
// build: nvcc -O2 -arch=sm_90 -cudart shared -o launch_probe launch_probe.cu
//        (-cudart shared: a static cudaMalloc cannot be interposed by LD_PRELOAD)
//
// Eight 16 MiB buffers (above the shim's MIN_OFFLOAD_BYTES, so the shim manages them). Each step
// queues LAUNCHES launches of a one-thread kernel that adds 1 to word (step % 64) of buffer
// (launch % 8), the last under another kernel name, then synchronizes: the pause between steps is where the shim's discovery finds
// the iteration. After WARMUP steps, each step's queueing time (the launch loop) and whole time
// (with the synchronize) are kept.
// stdout: one deterministic line (the sum of the counted words; the same with and without the
// shim). stderr: one line, "launch_probe: N steps of L launches: queue per launch median Q us,
// p10 Q10 us; step median S ms, p10 S10 ms". Every CUDA call is checked; on an error it prints
// it and exits 1.
#include <cuda_runtime.h>

#include <algorithm>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <vector>

#define CHECK(call)                                                                                \
    do {                                                                                           \
        cudaError_t err_ = (call);                                                                 \
        if (err_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "launch_probe: %s failed: %s\n", #call, cudaGetErrorString(err_));     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static const int BUFFERS = 8;
static const size_t BUFFER_BYTES = 16u << 20;
static const int WARMUP = 20;

__global__ void bump(uint32_t *buf, int word)
{
    buf[word] += 1;
}

// The same work under another name, ending each step: the shim's iteration detector finds an
// iteration by kernel names and does not take a loop of one kernel for one (period 1).
__global__ void bump_last(uint32_t *buf, int word)
{
    buf[word] += 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double pct(std::vector<double> v, double p)
{
    std::sort(v.begin(), v.end());
    return v[(size_t)(p * (double)(v.size() - 1) + 0.5)];
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 300;
    int launches = argc > 2 ? atoi(argv[2]) : 1000;
    if (steps <= WARMUP || launches <= 0) {
        fprintf(stderr, "usage: launch_probe [STEPS > %d [LAUNCHES > 0]]\n", WARMUP);
        return 2;
    }
    uint32_t *buf[BUFFERS];
    for (int b = 0; b < BUFFERS; b++) {
        CHECK(cudaMalloc((void **)&buf[b], BUFFER_BYTES));
        CHECK(cudaMemset(buf[b], 0, BUFFER_BYTES));
    }
    CHECK(cudaDeviceSynchronize());
    std::vector<double> queue_us, step_ms;
    for (int s = 0; s < steps; s++) {
        double t0 = now_s();
        for (int i = 0; i < launches - 1; i++)
            bump<<<1, 1>>>(buf[i % BUFFERS], s % 64);
        bump_last<<<1, 1>>>(buf[(launches - 1) % BUFFERS], s % 64);
        CHECK(cudaGetLastError());
        double t1 = now_s();
        CHECK(cudaDeviceSynchronize());
        double t2 = now_s();
        if (s >= WARMUP) {
            queue_us.push_back((t1 - t0) * 1e6 / launches);
            step_ms.push_back((t2 - t0) * 1e3);
        }
    }
    uint64_t sum = 0;
    std::vector<uint32_t> words(64);
    for (int b = 0; b < BUFFERS; b++) {
        CHECK(cudaMemcpy(words.data(), buf[b], words.size() * sizeof(uint32_t),
                         cudaMemcpyDeviceToHost));
        for (uint32_t w : words)
            sum += w;
        CHECK(cudaFree(buf[b]));
    }
    printf("launch_probe: %d steps of %d launches, sum %llu\n", steps, launches,
           (unsigned long long)sum);
    fprintf(stderr,
            "launch_probe: %zu steps of %d launches: queue per launch median %.3f us, p10 %.3f "
            "us; step median %.3f ms, p10 %.3f ms\n",
            step_ms.size(), launches, pct(queue_us, 0.5), pct(queue_us, 0.1), pct(step_ms, 0.5),
            pct(step_ms, 0.1));
    return 0;
}
