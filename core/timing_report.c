#include "timing_report.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fs.h"
#include "log.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

struct text {
    char *buf;
    size_t len, used;
};

static void add(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(struct text *t, const char *fmt, ...)
{
    if (t->used + 1 >= t->len)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->buf + t->used, t->len - t->used, fmt, ap);
    va_end(ap);
    if (n > 0)
        t->used = t->used + (size_t)n < t->len ? t->used + (size_t)n : t->len - 1;
}

char *fs_timing_report(const struct fs_engine_stats *s, const char *device, bool planning,
                       char *buf, size_t len)
{
    struct text t = {buf, len, 0};
    buf[0] = '\0';
    add(&t, "flexshim timing report, pid %d\n", (int)getpid());
    if (!device) {
        add(&t, "no device was managed (the log says why); nothing to report\n");
        return buf;
    }
    const struct fs_res_stats *r = &s->res;
    add(&t, "device %s, budget %.2f GiB, device peak %.2f GiB\n", device,
        (double)s->budget / GIB, (double)r->device_bytes_peak / GIB);
    add(&t, "remaps (host time in the driver, which runs one at a time):\n");
    static const struct {
        const char *name;
        int op, loc;
    } kinds[] = {{"map device", FS_REMAP_MAP, FS_LOC_DEVICE},
                 {"map host", FS_REMAP_MAP, FS_LOC_HOST},
                 {"unmap device", FS_REMAP_UNMAP, FS_LOC_DEVICE},
                 {"unmap host", FS_REMAP_UNMAP, FS_LOC_HOST}};
    double total_ms = 0;
    for (size_t k = 0; k < FS_ARRAY_LEN(kinds); k++) {
        double ms = (double)r->remap_ns[kinds[k].op][kinds[k].loc] / 1e6;
        double gib = (double)r->remap_bytes[kinds[k].op][kinds[k].loc] / GIB;
        total_ms += ms;
        add(&t, "  %-13s %9llu calls %11.1f ms %9.2f GiB", kinds[k].name,
            (unsigned long long)r->remaps[kinds[k].op][kinds[k].loc], ms, gib);
        if (gib > 0)
            add(&t, " %8.2f ms/GiB", ms / gib);
        add(&t, "\n");
    }
    add(&t, "  %-13s %9s       %11.1f ms\n", "all", "", total_ms);
    add(&t, "moves: %llu prefetches (%.2f GiB), %llu evictions (%.2f GiB; %llu without "
            "write-back), %llu fault-ins (%.2f GiB), %llu host-served references\n",
        (unsigned long long)r->prefetches, (double)r->prefetched_bytes / GIB,
        (unsigned long long)r->evictions, (double)r->evicted_bytes / GIB,
        (unsigned long long)r->clean_evictions, (unsigned long long)r->faults,
        (double)r->faulted_bytes / GIB, (unsigned long long)r->host_served);
    if (r->stage_ins > 0)
        add(&t, "redirect: %llu device copies (%.2f GiB), %llu ended, %llu launches redirected, "
                "%llu copies ended early\n",
            (unsigned long long)r->stage_ins, (double)r->staged_bytes / GIB,
            (unsigned long long)r->stage_outs, (unsigned long long)r->redirected,
            (unsigned long long)r->unstage_syncs);
    if (planning) {
        const struct fs_exec_stats *x = &s->exec;
        add(&t, "plan: %llu launches followed (place found %llu times), %llu late references "
                "waited %.1f ms, %llu references ordered on their stream, %llu moves in flight "
                "at most\n",
            (unsigned long long)x->synced, (unsigned long long)x->syncs,
            (unsigned long long)x->late, (double)x->late_wait_ns / 1e6,
            (unsigned long long)r->ordered_waits, (unsigned long long)x->max_inflight);
    }
    return buf;
}

static int put_text(FILE *f, void *text)
{
    return fputs(text, f) < 0 ? FS_ERR_IO : FS_OK;
}

int fs_timing_report_write(const char *path, const char *text)
{
    if (!strcmp(path, "-")) {
        for (const char *line = text; *line;) {
            const char *end = strchr(line, '\n');
            int n = end ? (int)(end - line) : (int)strlen(line);
            fs_log(FS_LOG_INFO, "timing: %.*s", n, line);
            line += n + (end ? 1 : 0);
        }
        return FS_OK;
    }
    return fs_write_file(path, put_text, (void *)text);
}
