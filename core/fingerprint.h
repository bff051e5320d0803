/* Fingerprints of device data: how an eviction proves that an allocation is unchanged since its
 * host copy was last made, so the copy back to host can be skipped (invariant 3).
 *
 * The fingerprint of N 8-byte words w[0..N) is the pair
 *     sum = SUM over i of f(i, w[i])  (mod 2^64)      xor = XOR over i of rotl(f(i, w[i]), 29)
 * with f(i, w) = mix(w + i * golden), mix the splitmix64 finaliser. For a fixed i, f is a
 * bijection of w, so a change of one word always changes sum; several changes go unnoticed only
 * if both lanes cancel at once (about 2^-64 for unrelated data). Both lanes are sums of
 * independent per-word terms, so any split of the words adds up to the same result: the GPU
 * kernel (core/fingerprint.cu) writes FS_FP_PARTS partial pairs, the host folds them, and the
 * simulated device and the tests compute the same value on host memory. */
#ifndef FS_FINGERPRINT_H
#define FS_FINGERPRINT_H

#include <stdbool.h>
#include <stdint.h>

/* Blocks of the GPU kernel, and partial pairs it writes: parts[2b] (sum), parts[2b+1] (xor). */
#define FS_FP_PARTS 256
#define FS_FP_PARTS_BYTES (2 * FS_FP_PARTS * sizeof(uint64_t))

struct fs_fp {
    uint64_t sum, x;
};

static inline bool fs_fp_equal(struct fs_fp a, struct fs_fp b)
{
    return a.sum == b.sum && a.x == b.x;
}

/* Fold FS_FP_PARTS partial pairs into the fingerprint. */
struct fs_fp fs_fp_combine(const uint64_t *parts);

/* Fingerprint of SIZE bytes (a multiple of 8) of host memory, as partial pairs (the whole sum in
 * the first pair, zeros after it), so it folds like the kernel's. */
void fs_fp_host(const void *data, uint64_t size, uint64_t *parts);

#endif
