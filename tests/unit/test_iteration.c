/* Finding the iteration in a launch stream. */
#include "fs.h"
#include "iteration.h"
#include "test_util.h"

/* Push the kernels of STR (one letter each), a pause of GAP_NS before the first. */
static void push(struct fs_iter_detector *d, const char *str, uint64_t *t, uint64_t gap_ns)
{
    *t += gap_ns;
    for (const char *c = str; *c; c++) {
        *t += 1000;
        fs_iter_push(d, (uint64_t)*c, *t);
    }
}

static void test_simple_loop(void **state)
{
    (void)state;
    struct fs_iter_detector d;
    assert_int_equal(fs_iter_init(&d, 4096), FS_OK);
    uint64_t t = 0;
    push(&d, "xyzxyzq", &t, 0); /* start-up launches that never repeat */
    for (int i = 0; i < 4; i++)
        push(&d, "abcdefg", &t, 5000000);
    struct fs_iter_result r;
    fs_iter_detect(&d, 2, 3, &r);
    assert_int_equal(r.period, 7);
    assert_int_equal(r.repeats, 4);
    assert_int_equal(d.sig[r.start], 'a'); /* after the pause: where the program's pass begins */
    fs_iter_destroy(&d);
}

static void test_warmup_pass_differs(void **state)
{
    (void)state;
    struct fs_iter_detector d;
    assert_int_equal(fs_iter_init(&d, 4096), FS_OK);
    uint64_t t = 0;
    push(&d, "PPPPPPPPPPabc", &t, 0); /* a prefill: long, different */
    for (int i = 0; i < 3; i++)
        push(&d, "abcDEFabc", &t, 1000000);
    struct fs_iter_result r;
    fs_iter_detect(&d, 2, 2, &r);
    assert_int_equal(r.period, 9);
    assert_int_equal(d.sig[r.start], 'a');
    assert_int_equal(d.sig[r.start + 3], 'D');
    fs_iter_destroy(&d);
}

/* 22 identical layers inside each pass: the layer is not the iteration once three passes ran. */
static void test_layers_inside_the_iteration(void **state)
{
    (void)state;
    struct fs_iter_detector d;
    assert_int_equal(fs_iter_init(&d, 1 << 16), FS_OK);
    uint64_t t = 0;
    for (int pass = 0; pass < 3; pass++) {
        push(&d, "E", &t, 3000000);
        for (int l = 0; l < 22; l++)
            push(&d, "qkvaomlp", &t, 0);
        push(&d, "NHS", &t, 0);
    }
    struct fs_iter_result r;
    fs_iter_detect(&d, 2, 3, &r);
    assert_int_equal(r.period, 1 + 22 * 8 + 3);
    assert_int_equal(d.sig[r.start], 'E');
    fs_iter_destroy(&d);
}

static void test_no_repetition(void **state)
{
    (void)state;
    struct fs_iter_detector d;
    assert_int_equal(fs_iter_init(&d, 64), FS_OK);
    uint64_t t = 0;
    push(&d, "abcdefghijklmnop", &t, 0);
    struct fs_iter_result r;
    fs_iter_detect(&d, 2, 2, &r);
    assert_int_equal(r.period, 0);
    /* One kernel over and over is not an iteration below the minimum period. */
    for (int i = 0; i < 40; i++)
        push(&d, "z", &t, 0);
    fs_iter_detect(&d, 2, 2, &r);
    assert_int_equal(r.period, 0);
    fs_iter_destroy(&d);
}

static void test_buffer_keeps_newest(void **state)
{
    (void)state;
    struct fs_iter_detector d;
    assert_int_equal(fs_iter_init(&d, 32), FS_OK);
    uint64_t t = 0;
    for (int i = 0; i < 50; i++)
        push(&d, "abcde", &t, 100000);
    assert_true(d.n <= 32);
    struct fs_iter_result r;
    fs_iter_detect(&d, 2, 2, &r);
    assert_int_equal(r.period, 5);
    assert_int_equal(d.sig[r.start], 'a');
    fs_iter_destroy(&d);
}

static void test_name_hash_is_stable(void **state)
{
    (void)state;
    assert_int_equal(fs_iter_hash_name(""), 1469598103934665603ull);
    assert_int_equal(fs_iter_hash_name("ampere_gemm"), fs_iter_hash_name("ampere_gemm"));
    assert_int_not_equal(fs_iter_hash_name("kernel_a"), fs_iter_hash_name("kernel_b"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_simple_loop),
        cmocka_unit_test(test_warmup_pass_differs),
        cmocka_unit_test(test_layers_inside_the_iteration),
        cmocka_unit_test(test_no_repetition),
        cmocka_unit_test(test_buffer_keeps_newest),
        cmocka_unit_test(test_name_hash_is_stable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
