/* Helpers shared by the CMocka unit tests. */
#ifndef FS_TEST_UTIL_H
#define FS_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "log.h"

/* Capture what the log writes, for tests that check messages. */
struct fs_test_capture {
    FILE *file;
    char text[16384];
};

static inline void fs_test_capture_start(struct fs_test_capture *cap)
{
    cap->file = tmpfile();
    assert_non_null(cap->file);
    cap->text[0] = '\0';
    fs_log_set_fd(fileno(cap->file));
}

/* Stops capturing (back to stderr) and returns everything written since the start. */
static inline const char *fs_test_capture_end(struct fs_test_capture *cap)
{
    fs_log_set_fd(STDERR_FILENO);
    fflush(cap->file);
    rewind(cap->file);
    size_t n = fread(cap->text, 1, sizeof(cap->text) - 1, cap->file);
    cap->text[n] = '\0';
    fclose(cap->file);
    cap->file = NULL;
    return cap->text;
}

/* Writes TEXT to a fresh temporary file and returns its path in PATH (caller unlinks). */
static inline void fs_test_write_file(char *path, size_t len, const char *text)
{
    snprintf(path, len, "/tmp/flexshim-test-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    size_t n = strlen(text);
    assert_int_equal(write(fd, text, n), (ssize_t)n);
    close(fd);
}

/* Reads up to LEN - 1 bytes of PATH into BUF (a string) and empties the file. */
static inline void fs_test_read_file(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, len - 1, f);
    buf[n] = '\0';
    fclose(f);
    assert_int_equal(truncate(path, 0), 0);
}

#endif
