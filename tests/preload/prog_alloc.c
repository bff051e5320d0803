/* A small CUDA-runtime program for preload tests: allocates, writes, frees, and prints what the
 * (fake) runtime saw. Exit 0 when every call succeeded and the data survived. */
#include <stdio.h>
#include <string.h>

typedef int cudaError_t;
cudaError_t cudaMalloc(void **p, size_t size);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocPitch(void **p, size_t *pitch, size_t width, size_t height);
unsigned long fake_cudart_mallocs(void);
unsigned long fake_cudart_frees(void);

int main(void)
{
    static const size_t sizes[] = {1 << 10, 4 << 20, 32 << 20};
    void *ptrs[3];
    for (int i = 0; i < 3; i++) {
        if (cudaMalloc(&ptrs[i], sizes[i]) != 0) {
            fprintf(stderr, "cudaMalloc(%zu) failed\n", sizes[i]);
            return 1;
        }
        memset(ptrs[i], 0x5a, sizes[i]); /* the fake runtime's memory is host memory */
    }
    void *pitched;
    size_t pitch = 0;
    if (cudaMallocPitch(&pitched, &pitch, 1000, 10) != 0 || pitch < 1000)
        return 1;
    for (int i = 0; i < 3; i++)
        if (((unsigned char *)ptrs[i])[sizes[i] - 1] != 0x5a || cudaFree(ptrs[i]) != 0)
            return 1;
    cudaFree(pitched);
    printf("runtime saw %lu mallocs, %lu frees\n", fake_cudart_mallocs(), fake_cudart_frees());
    return 0;
}
