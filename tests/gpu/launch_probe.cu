// The host's cost of queueing a kernel launch, without the shim and with it (tests/gpu/run.sh
// step g). The 7b decode benchmark is host-bound (about 1500 launches in a 20 ms step) and on a
// noisy host its whole processes run 5-30% slow, so a few percent of shim cost cannot be told
// apart there; this program measures the launches alone, in a small process.
//
// usage: launch_probe [STEPS [LAUNCHES [STATE]]]  (defaults: 300 steps of 1000 launches, none)
// build: nvcc -O2 -arch=sm_90 -cudart shared -o launch_probe launch_probe.cu -lcuda
//        (-cudart shared: a static cudaMalloc cannot be interposed by LD_PRELOAD)
//
// STATE, without the shim: the process first sets up one piece of what the shim's started engine
// leaves in a process, to tell which (if any) makes each launch cost more: none; ctx (the primary
// context retained and made current through the driver API before the runtime's first call); va
// (1 TiB of device address space reserved); streams (three non-blocking streams at the greatest
// priority); pinned (20 MiB of pinned host memory); threads (six idle threads with the context
// current); module (a PTX module loaded); plain (the buffers from cuMemAlloc); vmm (the buffers
// created and mapped with the virtual memory API); all (every one of these, vmm for the buffers).
//
// Eight 16 MiB buffers (above the shim's MIN_OFFLOAD_BYTES, so the shim manages them). Each step
// queues LAUNCHES launches of a one-thread kernel that adds 1 to word (step % 64) of buffer
// (launch % 8), the last under another kernel name, then synchronizes: the pause between steps is
// where the shim's discovery finds the iteration. After WARMUP steps, each step's queueing time
// (the launch loop) and whole time (with the synchronize) are kept.
// stdout: one deterministic line (the sum of the counted words; the same with and without the
// shim). stderr: one line, "launch_probe: N steps of L launches (state S): queue per launch
// median Q us, p10 Q10 us; step median S ms, p10 S10 ms". Every CUDA call is checked; on an
// error it prints it and exits 1.
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>

#include <algorithm>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

#define CHECK_CU(call)                                                                             \
    do {                                                                                           \
        CUresult res_ = (call);                                                                    \
        if (res_ != CUDA_SUCCESS) {                                                                \
            const char *msg_ = NULL;                                                               \
            cuGetErrorString(res_, &msg_);                                                         \
            fprintf(stderr, "launch_probe: %s failed: %s\n", #call, msg_ ? msg_ : "?");           \
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

// ---- STATE: one piece of a started engine's state, set up before the measured launches ----

static const char *const STATES[] = {"none", "ctx", "va", "streams", "pinned", "threads",
                                     "module", "plain", "vmm", "all"};

static bool has(const char *state, const char *piece)
{
    return strcmp(state, piece) == 0 || (strcmp(state, "all") == 0 && strcmp(piece, "plain") != 0);
}

static CUcontext primary_ctx(void)
{
    CUdevice dev;
    CUcontext ctx;
    CHECK_CU(cuInit(0));
    CHECK_CU(cuDeviceGet(&dev, 0));
    CHECK_CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    return ctx;
}

static pthread_mutex_t idle_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t idle_wake = PTHREAD_COND_INITIALIZER;
static bool idle_stop;

static void *idle_main(void *arg)
{
    CHECK_CU(cuCtxSetCurrent((CUcontext)arg));
    pthread_mutex_lock(&idle_lock);
    while (!idle_stop)
        pthread_cond_wait(&idle_wake, &idle_lock);
    pthread_mutex_unlock(&idle_lock);
    return NULL;
}

static const char PTX[] = ".version 7.0\n.target sm_50\n.address_size 64\n"
                          ".visible .entry noop()\n{\n ret;\n}\n";

// Are the buffers the driver's (plain, vmm) rather than the runtime's? Then they are not
// cudaFree'd: they go with the process.
static bool driver_buffers(const char *state)
{
    return has(state, "plain") || has(state, "vmm");
}

// The buffers: cudaMalloc, cuMemAlloc (plain) or created and mapped with the VMM API (vmm), in
// the runtime's context (set_up made it current).
static void alloc_buffers(const char *state, uint32_t **buf)
{
    if (!driver_buffers(state)) {
        for (int b = 0; b < BUFFERS; b++)
            CHECK(cudaMalloc((void **)&buf[b], BUFFER_BYTES));
        return;
    }
    for (int b = 0; b < BUFFERS; b++) {
        CUdeviceptr p;
        if (has(state, "plain")) {
            CHECK_CU(cuMemAlloc(&p, BUFFER_BYTES));
        } else {
            CUmemAllocationProp prop = {};
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            prop.location.id = 0;
            CUmemGenericAllocationHandle h;
            CHECK_CU(cuMemCreate(&h, BUFFER_BYTES, &prop, 0));
            CHECK_CU(cuMemAddressReserve(&p, BUFFER_BYTES, 0, 0, 0));
            CHECK_CU(cuMemMap(p, BUFFER_BYTES, 0, h, 0));
            CUmemAccessDesc access = {};
            access.location = prop.location;
            access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            CHECK_CU(cuMemSetAccess(p, BUFFER_BYTES, &access, 1));
        }
        buf[b] = (uint32_t *)(uintptr_t)p;
    }
}

// Sets up STATE's pieces other than the buffers (left in place until the process exits).
static void set_up(const char *state, std::vector<pthread_t> *threads)
{
    CUcontext ctx = NULL;
    if (has(state, "ctx")) {
        ctx = primary_ctx();
        CHECK_CU(cuCtxSetCurrent(ctx));
    }
    CHECK(cudaFree(0));
    CHECK_CU(cuCtxGetCurrent(&ctx));
    if (has(state, "va")) {
        CUdeviceptr va;
        CHECK_CU(cuMemAddressReserve(&va, 1ull << 40, 0, 0, 0));
    }
    if (has(state, "streams")) {
        int least, greatest;
        CHECK_CU(cuCtxGetStreamPriorityRange(&least, &greatest));
        for (int i = 0; i < 3; i++) {
            CUstream st;
            CHECK_CU(cuStreamCreateWithPriority(&st, CU_STREAM_NON_BLOCKING, greatest));
        }
    }
    if (has(state, "pinned")) {
        void *host;
        CHECK_CU(cuMemHostAlloc(&host, 20u << 20, CU_MEMHOSTALLOC_PORTABLE));
    }
    if (has(state, "threads"))
        for (int i = 0; i < 6; i++) {
            pthread_t t;
            if (pthread_create(&t, NULL, idle_main, ctx) != 0) {
                fprintf(stderr, "launch_probe: pthread_create failed\n");
                exit(1);
            }
            threads->push_back(t);
        }
    if (has(state, "module")) {
        CUmodule mod;
        CHECK_CU(cuModuleLoadData(&mod, PTX));
    }
}

static void stop_threads(std::vector<pthread_t> *threads)
{
    pthread_mutex_lock(&idle_lock);
    idle_stop = true;
    pthread_cond_broadcast(&idle_wake);
    pthread_mutex_unlock(&idle_lock);
    for (pthread_t t : *threads)
        pthread_join(t, NULL);
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
    const char *state = argc > 3 ? argv[3] : "none";
    bool known = false;
    for (const char *st : STATES)
        known = known || strcmp(state, st) == 0;
    if (steps <= WARMUP || launches <= 0 || !known) {
        fprintf(stderr, "usage: launch_probe [STEPS > %d [LAUNCHES > 0 [STATE]]]; STATE: none, "
                        "ctx, va, streams, pinned, threads, module, plain, vmm or all\n", WARMUP);
        return 2;
    }
    std::vector<pthread_t> threads;
    set_up(state, &threads);
    uint32_t *buf[BUFFERS];
    alloc_buffers(state, buf);
    for (int b = 0; b < BUFFERS; b++)
        CHECK(cudaMemset(buf[b], 0, BUFFER_BYTES));
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
        if (!driver_buffers(state))
            CHECK(cudaFree(buf[b]));
    }
    stop_threads(&threads);
    printf("launch_probe: %d steps of %d launches, sum %llu\n", steps, launches,
           (unsigned long long)sum);
    fprintf(stderr,
            "launch_probe: %zu steps of %d launches (state %s): queue per launch median %.3f us, "
            "p10 %.3f us; step median %.3f ms, p10 %.3f ms\n",
            step_ms.size(), launches, state, pct(queue_us, 0.5), pct(queue_us, 0.1),
            pct(step_ms, 0.5), pct(step_ms, 0.1));
    return 0;
}
