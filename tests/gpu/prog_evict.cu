// GPU test program for flexshim: many allocations under a budget far below their total.
//
// usage: prog_evict [N_BUFFERS [BUFFER_MIB]]      (defaults: 48 buffers of 64 MiB = 3 GiB)
// build: nvcc -O2 -arch=sm_90 -cudart shared -o prog_evict prog_evict.cu
//        (-cudart shared matters: nvcc links cudart statically by default, and a static
//        cudaMalloc inside the executable cannot be interposed by LD_PRELOAD)
//
// Run it once without the shim and once with it (LD_PRELOAD=libflexshim.so
// FLEXTENSOR_GPU_MEMORY_LIMIT=512MiB): stdout must be identical. stdout is deterministic (no
// timings, no addresses); timings and progress go to stderr.
//
// Phases:
//   1. cudaMalloc N buffers; a kernel fills buffer i with a pattern hashed from (i, index).
//   2. R=3 rounds: for each i, buf[i] += 0.5f * buf[(i+7)%N] (reads two buffers, writes one).
//      Under a small budget every launch faults buffers in and evicts others.
//   3. A pointer table (struct with N float* in a small cudaMalloc'd block, filled by cudaMemcpy)
//      and a kernel whose only parameters are the table and an output array: it sums a strided
//      sample of every buffer, reaching them only through pointers held in device memory, so an
//      evicted buffer is read where it lies (host memory mapped at the same address).
//   4. A second table kernel WRITES through the table (adds 1.0f to every sampled element): the
//      shim never sees these buffers referenced, so it must not treat a resident buffer as
//      unchanged when it evicts it later (DESIGN invariant 3).
//   5. One more update round (evicts the buffers written in phase 4 and faults them back).
//   6. The table sum again, then every buffer is copied back with cudaMemcpy and checksummed on
//      the host (sum of doubles in index order, and a 64-bit FNV-1a over the 64-bit words).
//   7. cudaFree everything.
// Every CUDA call is checked: on any error it prints the error and exits 1.
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ROUNDS 3
#define SAMPLE_STRIDE 4099u   // elements between samples in the table kernels (odd: spans pages)
#define TABLE_THREADS 256

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "prog_evict: %s:%d: %s failed: %s (%s, %d)\n", __FILE__, __LINE__,    \
                    #call, cudaGetErrorString(e_), cudaGetErrorName(e_), (int)e_);                 \
            printf("ERROR %s: %s\n", #call, cudaGetErrorName(e_));                                 \
            fflush(stdout);                                                                        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

// After a launch: the launch error, if any.
#define CK_LAUNCH(what) CK(cudaGetLastError())

struct Table {
    unsigned long long n;       // number of buffers
    unsigned long long elems;   // floats per buffer
    unsigned long long stride;  // sample stride
    float *bufs[1];             // n entries (allocated with room for all)
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

__host__ __device__ static inline uint32_t hash2(uint32_t a, uint32_t b)
{
    uint32_t h = a * 0x9E3779B1u ^ (b + 0x7F4A7C15u);
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    return h;
}

// Values in [-1, 1) with 24 significant bits: exactly representable.
__global__ void fill_kernel(float *p, unsigned long long n, uint32_t buf)
{
    for (unsigned long long j = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; j < n;
         j += (unsigned long long)gridDim.x * blockDim.x) {
        uint32_t h = hash2(buf, (uint32_t)j ^ (uint32_t)(j >> 32) * 0x27D4EB2Fu);
        p[j] = (float)(h >> 8) * (1.0f / 8388608.0f) - 1.0f;
    }
}

__global__ void update_kernel(float *dst, const float *src, unsigned long long n)
{
    for (unsigned long long j = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; j < n;
         j += (unsigned long long)gridDim.x * blockDim.x)
        dst[j] += 0.5f * src[j];
}

// One block per buffer; a fixed-order reduction (deterministic for a fixed block size).
// Parameters: only the table and the output.
__global__ void table_sum_kernel(const Table *t, double *out)
{
    __shared__ double part[TABLE_THREADS];
    unsigned long long b = blockIdx.x;
    if (b >= t->n)
        return;
    const float *p = t->bufs[b];
    unsigned long long elems = t->elems, stride = t->stride;
    double s = 0.0;
    for (unsigned long long k = threadIdx.x; k * stride < elems; k += blockDim.x)
        s += (double)p[k * stride];
    part[threadIdx.x] = s;
    __syncthreads();
    for (unsigned w = blockDim.x / 2; w > 0; w /= 2) {
        if (threadIdx.x < w)
            part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        out[b] = part[0];
}

// Writes through the table: every sampled element += 1.0f. Parameters: only the table.
__global__ void table_bump_kernel(const Table *t)
{
    unsigned long long b = blockIdx.x;
    if (b >= t->n)
        return;
    float *p = t->bufs[b];
    unsigned long long elems = t->elems, stride = t->stride;
    for (unsigned long long k = threadIdx.x; k * stride < elems; k += blockDim.x)
        p[k * stride] += 1.0f;
}

static void launch_dims(unsigned long long n, int *grid, int *block)
{
    *block = 256;
    unsigned long long g = (n + 255) / 256;
    if (g > 132ull * 16)
        g = 132ull * 16;
    *grid = (int)g;
}

static void update_round(float **bufs, int nbuf, unsigned long long elems, int round)
{
    int grid, block;
    launch_dims(elems, &grid, &block);
    double t0 = now_s();
    for (int i = 0; i < nbuf; i++) {
        update_kernel<<<grid, block>>>(bufs[i], bufs[(i + 7) % nbuf], elems);
        CK_LAUNCH("update_kernel");
    }
    CK(cudaDeviceSynchronize());
    fprintf(stderr, "prog_evict: round %d: %.3f s\n", round, now_s() - t0);
}

static void table_sums(const Table *d_table, double *d_out, double *h_out, int nbuf,
                       const char *tag)
{
    double t0 = now_s();
    table_sum_kernel<<<nbuf, TABLE_THREADS>>>(d_table, d_out);
    CK_LAUNCH("table_sum_kernel");
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h_out, d_out, sizeof(double) * (size_t)nbuf, cudaMemcpyDeviceToHost));
    fprintf(stderr, "prog_evict: table sums (%s): %.3f s\n", tag, now_s() - t0);
    for (int i = 0; i < nbuf; i++)
        printf("table %s buf %3d sample_sum %.17g\n", tag, i, h_out[i]);
}

int main(int argc, char **argv)
{
    int nbuf = 48;
    long mib = 64;
    if (argc > 1)
        nbuf = atoi(argv[1]);
    if (argc > 2)
        mib = atol(argv[2]);
    if (argc > 3 || nbuf < 1 || nbuf > 100000 || mib < 1 || mib > 65536) {
        fprintf(stderr, "usage: %s [N_BUFFERS (1..100000, default 48) [BUFFER_MIB (default 64)]]\n",
                argv[0]);
        return 2;
    }
    size_t bytes = (size_t)mib << 20;
    unsigned long long elems = bytes / sizeof(float);
    double t_start = now_s();

    printf("prog_evict: %d buffers of %ld MiB (%.2f GiB), %d rounds, sample stride %u\n", nbuf, mib,
           (double)nbuf * (double)mib / 1024.0, ROUNDS, SAMPLE_STRIDE);

    CK(cudaSetDevice(0));
    size_t free0 = 0, total0 = 0;
    CK(cudaMemGetInfo(&free0, &total0));
    fprintf(stderr, "prog_evict: cudaMemGetInfo: free %zu MiB of %zu MiB\n", free0 >> 20,
            total0 >> 20);

    // 1. allocate and fill
    float **bufs = (float **)calloc((size_t)nbuf, sizeof(float *));
    if (!bufs) {
        printf("ERROR out of host memory\n");
        return 1;
    }
    int grid, block;
    launch_dims(elems, &grid, &block);
    double t0 = now_s();
    for (int i = 0; i < nbuf; i++) {
        CK(cudaMalloc((void **)&bufs[i], bytes));
        fill_kernel<<<grid, block>>>(bufs[i], elems, (uint32_t)i);
        CK_LAUNCH("fill_kernel");
    }
    CK(cudaDeviceSynchronize());
    fprintf(stderr, "prog_evict: allocate + fill: %.3f s\n", now_s() - t0);

    // 2. update rounds
    for (int r = 0; r < ROUNDS; r++)
        update_round(bufs, nbuf, elems, r);

    // 3. pointer table in device memory, read-only kernel through it
    size_t table_bytes = sizeof(Table) + sizeof(float *) * (size_t)nbuf;
    Table *h_table = (Table *)calloc(1, table_bytes);
    double *h_out = (double *)calloc((size_t)nbuf, sizeof(double));
    if (!h_table || !h_out) {
        printf("ERROR out of host memory\n");
        return 1;
    }
    h_table->n = (unsigned long long)nbuf;
    h_table->elems = elems;
    h_table->stride = SAMPLE_STRIDE;
    for (int i = 0; i < nbuf; i++)
        h_table->bufs[i] = bufs[i];
    Table *d_table = NULL;
    double *d_out = NULL;
    CK(cudaMalloc((void **)&d_table, table_bytes));
    CK(cudaMalloc((void **)&d_out, sizeof(double) * (size_t)nbuf));
    CK(cudaMemcpy(d_table, h_table, table_bytes, cudaMemcpyHostToDevice));
    CK(cudaMemset(d_out, 0, sizeof(double) * (size_t)nbuf));
    table_sums(d_table, d_out, h_out, nbuf, "read");

    // 4. write through the table (buffers the shim never sees referenced)
    t0 = now_s();
    table_bump_kernel<<<nbuf, TABLE_THREADS>>>(d_table);
    CK_LAUNCH("table_bump_kernel");
    CK(cudaDeviceSynchronize());
    fprintf(stderr, "prog_evict: table bump: %.3f s\n", now_s() - t0);

    // 5. one more round: every buffer goes through eviction and fault-in again
    update_round(bufs, nbuf, elems, ROUNDS);

    // 6. table sums again, then whole-buffer checksums on the host
    table_sums(d_table, d_out, h_out, nbuf, "final");

    t0 = now_s();
    float *host = (float *)malloc(bytes);
    if (!host) {
        printf("ERROR out of host memory\n");
        return 1;
    }
    double grand = 0.0;
    uint64_t grand_fnv = 1469598103934665603ull;
    for (int i = 0; i < nbuf; i++) {
        CK(cudaMemcpy(host, bufs[i], bytes, cudaMemcpyDeviceToHost));
        double sum = 0.0;
        for (unsigned long long j = 0; j < elems; j++)
            sum += (double)host[j];
        uint64_t fnv = 1469598103934665603ull;
        const uint64_t *w = (const uint64_t *)host;
        for (size_t j = 0; j < bytes / 8; j++) {
            fnv ^= w[j];
            fnv *= 1099511628211ull;
        }
        uint32_t first, last;
        memcpy(&first, &host[0], 4);
        memcpy(&last, &host[elems - 1], 4);
        printf("buf %3d sum %.17g fnv %016llx first %08x last %08x\n", i, sum,
               (unsigned long long)fnv, first, last);
        grand += sum;
        grand_fnv = (grand_fnv ^ fnv) * 1099511628211ull;
    }
    printf("total sum %.17g fnv %016llx\n", grand, (unsigned long long)grand_fnv);
    fprintf(stderr, "prog_evict: copy back + checksums: %.3f s\n", now_s() - t0);

    // 7. free
    for (int i = 0; i < nbuf; i++)
        CK(cudaFree(bufs[i]));
    CK(cudaFree(d_table));
    CK(cudaFree(d_out));
    CK(cudaDeviceSynchronize());
    free(host);
    free(h_table);
    free(h_out);
    free(bufs);
    printf("prog_evict: done\n");
    fprintf(stderr, "prog_evict: total %.3f s\n", now_s() - t_start);
    return 0;
}
