/* Logging: one line per message, "[flexshim PID] level: text", to stderr or FLEXTENSOR_LOG_FILE.
 *
 * Safe from any thread and from inside hooks: a message is formatted on the stack and written with
 * a single write(2), so lines never interleave and nothing here calls back into CUDA or malloc. */
#ifndef FS_LOG_H
#define FS_LOG_H

#include <stdarg.h>

enum fs_log_level { FS_LOG_ERROR, FS_LOG_WARN, FS_LOG_INFO, FS_LOG_DEBUG, FS_LOG_TRACE };

/* Longest line written; longer messages are cut and end in "...". */
#define FS_LOG_LINE_MAX 1024

void fs_log_set_level(enum fs_log_level level);
enum fs_log_level fs_log_get_level(void);

/* Send lines to PATH (appending); NULL or "" means stderr. Returns FS_OK or FS_ERR_IO, and keeps
 * the previous destination on failure. */
int fs_log_set_file(const char *path);

/* Send lines to an already open descriptor (tests). */
void fs_log_set_fd(int fd);

/* Close a file opened by fs_log_set_file and return to stderr. */
void fs_log_close(void);

void fs_log(enum fs_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void fs_vlog(enum fs_log_level level, const char *fmt, va_list ap);

/* The cheap test that keeps hot paths from formatting messages nobody will see. */
#define fs_log_enabled(level) ((int)(level) <= (int)fs_log_get_level())

#define FS_ERROR(...) fs_log(FS_LOG_ERROR, __VA_ARGS__)
#define FS_WARN(...) fs_log(FS_LOG_WARN, __VA_ARGS__)
#define FS_INFO(...) fs_log(FS_LOG_INFO, __VA_ARGS__)
#define FS_DEBUG(...)                                                                              \
    do {                                                                                           \
        if (fs_log_enabled(FS_LOG_DEBUG))                                                          \
            fs_log(FS_LOG_DEBUG, __VA_ARGS__);                                                     \
    } while (0)
#define FS_TRACE(...)                                                                              \
    do {                                                                                           \
        if (fs_log_enabled(FS_LOG_TRACE))                                                          \
            fs_log(FS_LOG_TRACE, __VA_ARGS__);                                                     \
    } while (0)

/* Log a message once per call site (warnings about unmanageable allocations, for instance). */
#define FS_LOG_ONCE(level, ...)                                                                    \
    do {                                                                                           \
        static int fs_once_;                                                                       \
        if (!__atomic_exchange_n(&fs_once_, 1, __ATOMIC_RELAXED))                                  \
            fs_log(level, __VA_ARGS__);                                                            \
    } while (0)

#endif
