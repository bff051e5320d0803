/* The timing report (FLEXTENSOR_TIMING_REPORT): at exit, where the run's managed-memory time went,
 * in a few lines a person reads: every remap kind with its calls, host time and cost per GiB
 * (the driver runs one remap at a time, so this is the budget a step's moves spend there), the
 * moves and the bytes they carried, and under a plan the waits for late prefetches. The run trace
 * (run_trace.h) has the same events one by one. */
#ifndef FS_TIMING_REPORT_H
#define FS_TIMING_REPORT_H

#include <stdbool.h>
#include <stddef.h>

#include "engine.h"

/* The report of S as text in BUF (LEN bytes; cut short if it does not fit). DEVICE names the
 * managed device, or NULL when none was managed; PLANNING: a plan executor ran. Returns BUF. */
char *fs_timing_report(const struct fs_engine_stats *s, const char *device, bool planning,
                       char *buf, size_t len);

/* Write TEXT to PATH, or line by line to the log (level info) when PATH is "-". FS_ERR_IO with
 * errno kept when the file cannot be written. */
int fs_timing_report_write(const char *path, const char *text);

#endif
