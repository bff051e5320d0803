// The fingerprint kernel (see fingerprint.h for the function). Compiled to PTX at build time
// (Makefile: nvcc -ptx) and embedded in the library; the driver JIT-compiles it for the GPU on
// first use (core/device_cuda.c), so one build runs on every architecture the toolkit targets.
//
// Launched with FS_FP_PARTS blocks of 512 threads. Each thread reads 16 bytes (two words,
// coalesced) FP_UNROLL times per step; the block sums its threads' terms and writes one partial
// pair straight into PARTS, pinned host memory mapped for the device: plain stores, no atomics
// over the link.

#define FP_THREADS 512
#define FP_UNROLL 4

__device__ __forceinline__ unsigned long long term(unsigned long long i, unsigned long long w)
{
    unsigned long long z = w + i * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ unsigned long long rotl29(unsigned long long v)
{
    return (v << 29) | (v >> 35);
}

__device__ __forceinline__ void add_terms(unsigned long long k, ulonglong2 v,
                                          unsigned long long &sum, unsigned long long &x)
{
    unsigned long long t0 = term(2 * k, v.x), t1 = term(2 * k + 1, v.y);
    sum += t0 + t1;
    x ^= rotl29(t0) ^ rotl29(t1);
}

extern "C" __global__ void __launch_bounds__(FP_THREADS)
fs_fingerprint(const ulonglong2 *__restrict__ data, unsigned long long npairs,
               unsigned long long *parts)
{
    unsigned long long sum = 0, x = 0;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long k = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    // FP_UNROLL loads in flight per thread: with one, the kernel waits on memory latency and
    // holds the SMs the program's kernels wait for longer than it needs. Streaming loads
    // (__ldcs, evict-first) read the data once without pushing the program's working set out
    // of L2.
    for (; k + (FP_UNROLL - 1) * stride < npairs; k += FP_UNROLL * stride) {
        ulonglong2 v[FP_UNROLL];
#pragma unroll
        for (int u = 0; u < FP_UNROLL; u++)
            v[u] = __ldcs(data + k + u * stride);
#pragma unroll
        for (int u = 0; u < FP_UNROLL; u++)
            add_terms(k + u * stride, v[u], sum, x);
    }
    for (; k < npairs; k += stride)
        add_terms(k, __ldcs(data + k), sum, x);
    for (int off = 16; off > 0; off >>= 1) {
        sum += __shfl_down_sync(0xffffffffu, sum, off);
        x ^= __shfl_down_sync(0xffffffffu, x, off);
    }
    __shared__ unsigned long long ssum[FP_THREADS / 32], sx[FP_THREADS / 32];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        ssum[warp] = sum;
        sx[warp] = x;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < FP_THREADS / 32; w++) {
            sum += ssum[w];
            x ^= sx[w];
        }
        parts[2 * blockIdx.x] = sum;
        parts[2 * blockIdx.x + 1] = x;
    }
}
