/* Fingerprints (core/fingerprint.h): the check that lets an eviction skip its write-back must see
 * every single-word change, moved words, and fold partial results in any split. */
#include <string.h>

#include "fingerprint.h"
#include "test_util.h"

#define WORDS 512

static struct fs_fp fp_of(const uint64_t *w, uint64_t nwords)
{
    uint64_t parts[2 * FS_FP_PARTS];
    fs_fp_host(w, nwords * 8, parts);
    return fs_fp_combine(parts);
}

static void test_every_bit_flip_changes_it(void **state)
{
    (void)state;
    uint64_t w[WORDS];
    for (int i = 0; i < WORDS; i++)
        w[i] = (uint64_t)i * 0x0101010101010101ull;
    struct fs_fp ref = fp_of(w, WORDS);
    assert_true(fs_fp_equal(ref, fp_of(w, WORDS))); /* deterministic */
    for (int i = 0; i < WORDS; i++) {
        for (int b = 0; b < 64; b++) {
            w[i] ^= 1ull << b;
            if (fs_fp_equal(ref, fp_of(w, WORDS)))
                fail_msg("flipping bit %d of word %d went unnoticed", b, i);
            w[i] ^= 1ull << b;
        }
    }
}

static void test_swapped_words_and_zeros(void **state)
{
    (void)state;
    uint64_t w[WORDS] = {0};
    struct fs_fp zeros = fp_of(w, WORDS);
    w[3] = 7;
    struct fs_fp one = fp_of(w, WORDS);
    assert_false(fs_fp_equal(zeros, one));
    w[3] = 0;
    w[300] = 7; /* the same value elsewhere */
    assert_false(fs_fp_equal(one, fp_of(w, WORDS)));
    /* Same words, other length: the padding the engine fingerprints counts too. */
    assert_false(fs_fp_equal(fp_of(w, WORDS), fp_of(w, WORDS - 2)));
}

/* The GPU kernel writes one partial pair per block and the host folds them (sum lane added, xor
 * lane xored): any split of the words must fold to the whole. Fingerprint the first half (the
 * rest zero) and the second half (the rest zero): every zero word adds its own term to each, so
 * lo + hi - zeros holds every word's term exactly once. */
static void test_parts_fold_in_any_split(void **state)
{
    (void)state;
    uint64_t w[WORDS];
    for (int i = 0; i < WORDS; i++)
        w[i] = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
    struct fs_fp whole = fp_of(w, WORDS);
    uint64_t a[2 * FS_FP_PARTS], b[2 * FS_FP_PARTS], m[2 * FS_FP_PARTS];
    uint64_t lo[WORDS] = {0}, hi[WORDS] = {0};
    memcpy(lo, w, sizeof(uint64_t) * WORDS / 2);
    memcpy(hi + WORDS / 2, w + WORDS / 2, sizeof(uint64_t) * WORDS / 2);
    fs_fp_host(lo, sizeof(lo), a);
    fs_fp_host(hi, sizeof(hi), b);
    uint64_t z[WORDS] = {0};
    uint64_t zp[2 * FS_FP_PARTS];
    fs_fp_host(z, sizeof(z), zp);
    memset(m, 0, sizeof(m));
    m[0] = a[0] + b[0];
    m[1] = a[1] ^ b[1];
    m[2 * 7] = -zp[0]; /* in another part: where a part lands does not matter */
    m[2 * 7 + 1] = zp[1];
    struct fs_fp folded = fs_fp_combine(m);
    assert_true(fs_fp_equal(whole, folded));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_bit_flip_changes_it),
        cmocka_unit_test(test_swapped_words_and_zeros),
        cmocka_unit_test(test_parts_fold_in_any_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
