/* A stand-in for libcudart.so.13 (same soname) so preload tests run on machines with no GPU.
 * "Device" memory is host memory; every call is counted so tests can see it arrived. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2 };

static unsigned long fake_mallocs, fake_frees;

unsigned long fake_cudart_mallocs(void);
unsigned long fake_cudart_frees(void);
cudaError_t cudaMalloc(void **p, size_t size);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocPitch(void **p, size_t *pitch, size_t width, size_t height);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total);
cudaError_t cudaGetDevice(int *dev);

unsigned long fake_cudart_mallocs(void) { return fake_mallocs; }
unsigned long fake_cudart_frees(void) { return fake_frees; }

cudaError_t cudaMalloc(void **p, size_t size)
{
    if (!p)
        return cudaErrorInvalidValue;
    *p = malloc(size ? size : 1);
    if (!*p)
        return cudaErrorMemoryAllocation;
    fake_mallocs++;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    if (p)
        fake_frees++;
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMallocPitch(void **p, size_t *pitch, size_t width, size_t height)
{
    if (!pitch)
        return cudaErrorInvalidValue;
    *pitch = (width + 511) / 512 * 512;
    return cudaMalloc(p, *pitch * height);
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    *free_bytes = 7ull << 30;
    *total = 8ull << 30;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *dev)
{
    *dev = 0;
    return cudaSuccess;
}
