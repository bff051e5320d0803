/* The log: prefix and level filtering, cutting of long lines, files, threads. */
#include <pthread.h>

#include "fs.h"
#include "test_util.h"

static void test_prefix_and_level(void **state)
{
    (void)state;
    struct fs_test_capture cap;
    fs_log_set_level(FS_LOG_INFO);
    fs_test_capture_start(&cap);
    FS_INFO("hello %d", 42);
    FS_DEBUG("not shown");
    FS_ERROR("bad");
    const char *text = fs_test_capture_end(&cap);
    char expect[128];
    snprintf(expect, sizeof(expect), "[flexshim %ld] info: hello 42\n[flexshim %ld] error: bad\n",
             (long)getpid(), (long)getpid());
    assert_string_equal(text, expect);
    fs_log_set_level(FS_LOG_WARN);
}

static void test_levels_filter(void **state)
{
    (void)state;
    static const char *const names[] = {"error", "warn", "info", "debug", "trace"};
    for (int level = FS_LOG_ERROR; level <= FS_LOG_TRACE; level++) {
        struct fs_test_capture cap;
        fs_log_set_level((enum fs_log_level)level);
        fs_test_capture_start(&cap);
        for (int l = FS_LOG_ERROR; l <= FS_LOG_TRACE; l++)
            fs_log((enum fs_log_level)l, "m");
        const char *text = fs_test_capture_end(&cap);
        for (int l = FS_LOG_ERROR; l <= FS_LOG_TRACE; l++) {
            char needle[32];
            snprintf(needle, sizeof(needle), "] %s: m\n", names[l]);
            if (l <= level)
                assert_non_null(strstr(text, needle));
            else
                assert_null(strstr(text, needle));
        }
    }
    fs_log_set_level(FS_LOG_WARN);
}

static void test_long_line_is_cut(void **state)
{
    (void)state;
    char big[3 * FS_LOG_LINE_MAX];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    struct fs_test_capture cap;
    fs_test_capture_start(&cap);
    FS_ERROR("%s", big);
    const char *text = fs_test_capture_end(&cap);
    size_t len = strlen(text);
    assert_int_equal(len, FS_LOG_LINE_MAX - 1);
    assert_int_equal(text[len - 1], '\n');
    assert_memory_equal(text + len - 4, "...", 3);
    assert_ptr_equal(strchr(text, '\n'), text + len - 1); /* one line */
}

static void test_log_file(void **state)
{
    (void)state;
    char path[64];
    fs_test_write_file(path, sizeof(path), "existing\n");
    assert_int_equal(fs_log_set_file(path), FS_OK);
    FS_WARN("to the file");
    fs_log_close();
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char buf[256] = {0};
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    unlink(path);
    assert_true(n > 0);
    assert_true(strncmp(buf, "existing\n[flexshim ", 19) == 0); /* appended, not truncated */
    assert_non_null(strstr(buf, "warn: to the file\n"));
    assert_int_equal(fs_log_set_file("/nonexistent-dir/x.log"), FS_ERR_IO);
}

static void *log_many(void *arg)
{
    for (int i = 0; i < 200; i++)
        FS_WARN("thread %ld line %d", (long)(intptr_t)arg, i);
    return NULL;
}

static void test_threads_do_not_interleave(void **state)
{
    (void)state;
    struct fs_test_capture cap;
    fs_test_capture_start(&cap);
    pthread_t t[4];
    for (long i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, log_many, (void *)(intptr_t)i), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    /* 800 lines of ~40 bytes exceed the capture buffer: check the lines that were read whole. */
    const char *text = fs_test_capture_end(&cap);
    int lines = 0;
    for (const char *p = text; (p = strchr(p, '\n')) != NULL; p++) {
        const char *start = p;
        while (start > text && start[-1] != '\n')
            start--;
        assert_true(strncmp(start, "[flexshim ", 10) == 0);
        assert_non_null(strstr(start, "warn: thread "));
        lines++;
    }
    assert_true(lines > 100);
}

static void test_once(void **state)
{
    (void)state;
    struct fs_test_capture cap;
    fs_test_capture_start(&cap);
    for (int i = 0; i < 3; i++)
        FS_LOG_ONCE(FS_LOG_WARN, "only once");
    const char *text = fs_test_capture_end(&cap);
    const char *first = strstr(text, "only once");
    assert_non_null(first);
    assert_null(strstr(first + 1, "only once"));
}

static void test_err_str(void **state)
{
    (void)state;
    assert_string_equal(fs_err_str(FS_OK), "ok");
    assert_string_equal(fs_err_str(FS_ERR_NOMEM), "out of memory");
    assert_string_equal(fs_err_str(12345), "unknown error");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_and_level), cmocka_unit_test(test_levels_filter),
        cmocka_unit_test(test_long_line_is_cut), cmocka_unit_test(test_log_file),
        cmocka_unit_test(test_threads_do_not_interleave), cmocka_unit_test(test_once),
        cmocka_unit_test(test_err_str),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
