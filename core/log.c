#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fs.h"

static int log_level = FS_LOG_WARN;
static int log_fd = STDERR_FILENO;
static int log_owned_fd = -1; /* the descriptor fs_log_set_file opened, if any */

static const char *const level_names[] = {"error", "warn", "info", "debug", "trace"};

void fs_log_set_level(enum fs_log_level level)
{
    __atomic_store_n(&log_level, (int)level, __ATOMIC_RELAXED);
}

enum fs_log_level fs_log_get_level(void)
{
    return (enum fs_log_level)__atomic_load_n(&log_level, __ATOMIC_RELAXED);
}

void fs_log_set_fd(int fd)
{
    __atomic_store_n(&log_fd, fd, __ATOMIC_RELEASE);
}

int fs_log_set_file(const char *path)
{
    if (!path || !*path) { /* back to stderr if a file was open; an fd set by the caller stays */
        if (log_owned_fd >= 0)
            fs_log_close();
        return FS_OK;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        return FS_ERR_IO;
    int old = log_owned_fd;
    log_owned_fd = fd;
    fs_log_set_fd(fd);
    if (old >= 0)
        close(old);
    return FS_OK;
}

void fs_log_close(void)
{
    fs_log_set_fd(STDERR_FILENO);
    if (log_owned_fd >= 0) {
        close(log_owned_fd);
        log_owned_fd = -1;
    }
}

void fs_vlog(enum fs_log_level level, const char *fmt, va_list ap)
{
    if (!fs_log_enabled(level))
        return;
    char line[FS_LOG_LINE_MAX];
    int n = snprintf(line, sizeof(line), "[flexshim %ld] %s: ", (long)getpid(),
                     level_names[level]);
    if (n < 0)
        return;
    /* One byte stays free for the newline. */
    size_t room = sizeof(line) - 1;
    int m = vsnprintf(line + n, room - (size_t)n, fmt, ap);
    if (m < 0)
        return;
    size_t len = (size_t)n + (size_t)m;
    if (len >= room) { /* cut: mark it */
        len = room - 1;
        memcpy(line + len - 3, "...", 3);
    }
    line[len++] = '\n';
    int fd = __atomic_load_n(&log_fd, __ATOMIC_ACQUIRE);
    int saved = errno; /* the program may be looking at errno around the hooked call */
    const char *p = line;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        p += w;
        len -= (size_t)w;
    }
    errno = saved;
}

void fs_log(enum fs_log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fs_vlog(level, fmt, ap);
    va_end(ap);
}
