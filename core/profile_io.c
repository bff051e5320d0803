/* Profiles on disk: JSON through jansson, written atomically, read back with every field checked.
 *
 * The document (one object; keys in this order, unknown keys are ignored on reading):
 *   "flexshim_profile": FS_PROFILE_SCHEMA_VERSION,
 *   "device":      {"name", "cc": [major, minor], "total_bytes", "driver_version"},
 *   "program":     "...",
 *   "allocations": [{"order", "size", "mapped", "first_use", "last_use",
 *                    "unchanged" (optional, false when absent)}, ...],
 *   "launches":    [{"kernel": "0x<16 hex digits>", "name" (optional), "stream", "duration_us",
 *                    "host_us" (optional, 0 when absent), "refs": [allocation indices]}, ...],
 *   "bandwidth":   {"h2d_latency_us", "h2d_bytes_per_us", "d2h_latency_us", "d2h_bytes_per_us",
 *                   "read_bytes_per_us", "handover_us" (optional, 0 when absent),
 *                   "points": [{"bytes", "h2d_us", "d2h_us"}, ...]},
 *   "plan" (absent before planning):
 *                  {"strategy", "budget", "predicted_us", "predicted_stall_us", "peak_bytes",
 *                   "planner" (optional, "" when absent: the planning code, fs_planner_id),
 *                   "entries": [{"resident": true} or {"prefetch_at": i, "evict_after": j}
 *                               (-1 and -1: not used, or read in place), ...]}
 *
 * Byte counts are JSON integers (at most 2^63 - 1); the kernel hash is a hex string because JSON
 * readers lose integer precision above 2^53. Saving checks the document with the same code that
 * loading uses, so a profile that was saved can always be loaded again. */
#include "profile.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fs.h"

/* Limits against absurd files: larger ones are "too large", not an attempt to allocate. */
#define PIO_MAX_FILE_BYTES (1LL << 30)
#define PIO_MAX_ALLOCS 10000000
#define PIO_MAX_LAUNCHES 10000000
#define PIO_MAX_REFS 10000000
#define PIO_MAX_POINTS 4096

#define PIO_WHERE_MAX 64  /* an element's path, "bandwidth.points[4095]" */
#define PIO_PATH_MAX 128  /* a field's path, "launches[9999999].refs[9999999]" */
#define PIO_DETAIL_MAX 512

static void seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ---- reading: the checked getters ------------------------------------------------------- */

/* The reader's state: the first problem found (a field path and what is wrong with it). */
struct rd {
    char *detail;
    size_t len;
    int rc;
};

static bool fail(struct rd *r, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static bool fail(struct rd *r, int rc, const char *fmt, ...)
{
    if (r->rc == FS_OK) {
        r->rc = rc;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->detail, r->len, fmt, ap);
        va_end(ap);
    }
    return false;
}

static bool nomem(struct rd *r)
{
    return fail(r, FS_ERR_NOMEM, "out of memory");
}

/* PATH = WHERE.KEY, or KEY at the top level. */
static void join(char *path, size_t len, const char *where, const char *key)
{
    if (where[0])
        snprintf(path, len, "%s.%s", where, key);
    else
        snprintf(path, len, "%s", key);
}

static json_t *field(struct rd *r, json_t *obj, const char *where, const char *key, char *path)
{
    join(path, PIO_PATH_MAX, where, key);
    json_t *v = json_object_get(obj, key);
    if (!v)
        fail(r, FS_ERR_CONFIG, "%s is missing", path);
    return v;
}

static bool as_u64(struct rd *r, json_t *v, const char *path, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return fail(r, FS_ERR_CONFIG, "%s must be a non-negative integer", path);
    *out = (uint64_t)json_integer_value(v);
    return true;
}

static bool as_ll(struct rd *r, json_t *v, const char *path, long long lo, long long hi,
                  long long *out)
{
    if (!json_is_integer(v))
        return fail(r, FS_ERR_CONFIG, "%s must be an integer", path);
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return fail(r, FS_ERR_CONFIG, "%s is %lld; it must be from %lld to %lld", path, x, lo, hi);
    *out = x;
    return true;
}

static bool as_int(struct rd *r, json_t *v, const char *path, int lo, int hi, int *out)
{
    long long x = 0;
    if (!as_ll(r, v, path, lo, hi, &x))
        return false;
    *out = (int)x;
    return true;
}

static bool get_u64(struct rd *r, json_t *obj, const char *where, const char *key, uint64_t *out)
{
    char path[PIO_PATH_MAX];
    json_t *v = field(r, obj, where, key, path);
    return v && as_u64(r, v, path, out);
}

static bool get_int(struct rd *r, json_t *obj, const char *where, const char *key, int lo, int hi,
                    int *out)
{
    char path[PIO_PATH_MAX];
    json_t *v = field(r, obj, where, key, path);
    return v && as_int(r, v, path, lo, hi, out);
}

static bool get_number(struct rd *r, json_t *obj, const char *where, const char *key, double *out)
{
    char path[PIO_PATH_MAX];
    json_t *v = field(r, obj, where, key, path);
    if (!v)
        return false;
    if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) < 0)
        return fail(r, FS_ERR_CONFIG, "%s must be a non-negative number", path);
    *out = json_number_value(v);
    return true;
}

static bool as_string(struct rd *r, json_t *v, const char *path, const char **out)
{
    if (!json_is_string(v))
        return fail(r, FS_ERR_CONFIG, "%s must be a string", path);
    if (strlen(json_string_value(v)) != json_string_length(v))
        return fail(r, FS_ERR_CONFIG, "%s must not contain a NUL character", path);
    *out = json_string_value(v);
    return true;
}

/* A string into a fixed buffer of CAP bytes. */
static bool get_string(struct rd *r, json_t *obj, const char *where, const char *key, char *buf,
                       size_t cap)
{
    char path[PIO_PATH_MAX];
    json_t *v = field(r, obj, where, key, path);
    const char *s = NULL;
    if (!v || !as_string(r, v, path, &s))
        return false;
    size_t n = strlen(s);
    if (n >= cap)
        return fail(r, FS_ERR_CONFIG, "%s is longer than %zu bytes", path, cap - 1);
    memcpy(buf, s, n + 1);
    return true;
}

static bool as_array(struct rd *r, json_t *v, const char *path, size_t max)
{
    if (!json_is_array(v))
        return fail(r, FS_ERR_CONFIG, "%s must be an array", path);
    if (json_array_size(v) > max)
        return fail(r, FS_ERR_CONFIG, "%s is too large (%zu entries, at most %zu are read)", path,
                    json_array_size(v), max);
    return true;
}

static json_t *get_array(struct rd *r, json_t *obj, const char *where, const char *key, size_t max)
{
    char path[PIO_PATH_MAX];
    json_t *v = field(r, obj, where, key, path);
    return v && as_array(r, v, path, max) ? v : NULL;
}

static json_t *get_object(struct rd *r, json_t *obj, const char *where, const char *key)
{
    char path[PIO_PATH_MAX];
    json_t *v = field(r, obj, where, key, path);
    if (v && !json_is_object(v)) {
        fail(r, FS_ERR_CONFIG, "%s must be an object", path);
        return NULL;
    }
    return v;
}

/* Element I of array A (at PATH), which must be an object; its own path goes to WHERE. */
static json_t *element(struct rd *r, json_t *a, const char *path, size_t i, char *where)
{
    snprintf(where, PIO_WHERE_MAX, "%s[%zu]", path, i);
    json_t *v = json_array_get(a, i);
    if (!json_is_object(v)) {
        fail(r, FS_ERR_CONFIG, "%s must be an object", where);
        return NULL;
    }
    return v;
}

/* "0x" (optional) and 1 to 16 hex digits. */
static bool parse_hash(const char *s, uint64_t *out)
{
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X'))
        s += 2;
    size_t n = strlen(s);
    if (n == 0 || n > 16)
        return false;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        unsigned d;
        if (c >= '0' && c <= '9')
            d = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            d = (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            d = (unsigned)(c - 'A' + 10);
        else
            return false;
        x = x << 4 | d;
    }
    *out = x;
    return true;
}

/* ---- reading: the sections -------------------------------------------------------------- */

static bool parse_device(struct rd *r, json_t *root, struct fs_profile *p)
{
    json_t *dev = get_object(r, root, "", "device");
    if (!dev || !get_string(r, dev, "device", "name", p->device_name, sizeof(p->device_name)))
        return false;
    json_t *cc = get_array(r, dev, "device", "cc", SIZE_MAX);
    if (!cc)
        return false;
    if (json_array_size(cc) != 2)
        return fail(r, FS_ERR_CONFIG, "device.cc must be [major, minor]");
    if (!as_int(r, json_array_get(cc, 0), "device.cc[0]", 0, 1000, &p->cc_major) ||
        !as_int(r, json_array_get(cc, 1), "device.cc[1]", 0, 1000, &p->cc_minor))
        return false;
    return get_u64(r, dev, "device", "total_bytes", &p->device_total) &&
           get_int(r, dev, "device", "driver_version", 0, INT_MAX, &p->driver_version);
}

static bool parse_allocs(struct rd *r, json_t *arr, struct fs_profile *p)
{
    size_t n = json_array_size(arr);
    if (n == 0)
        return true;
    p->allocs = calloc(n, sizeof(*p->allocs));
    if (!p->allocs)
        return nomem(r);
    p->nallocs = (int)n;
    int last = p->nlaunches - 1;
    for (size_t i = 0; i < n; i++) {
        char w[PIO_WHERE_MAX];
        json_t *o = element(r, arr, "allocations", i, w);
        struct fs_prof_alloc *a = &p->allocs[i];
        if (!o || !get_u64(r, o, w, "order", &a->order) || !get_u64(r, o, w, "size", &a->size) ||
            !get_u64(r, o, w, "mapped", &a->mapped) ||
            !get_int(r, o, w, "first_use", -1, last, &a->first_use) ||
            !get_int(r, o, w, "last_use", -1, last, &a->last_use))
            return false;
        json_t *unchanged = json_object_get(o, "unchanged");
        if (unchanged && !json_is_boolean(unchanged))
            return fail(r, FS_ERR_CONFIG, "%s.unchanged must be true or false", w);
        a->unchanged = json_is_true(unchanged);
        if (a->mapped < a->size)
            return fail(r, FS_ERR_CONFIG,
                        "%s.mapped (%" PRIu64 ") is smaller than its size (%" PRIu64 ")", w,
                        a->mapped, a->size);
        if ((a->first_use < 0) != (a->last_use < 0))
            return fail(r, FS_ERR_CONFIG,
                        "%s.first_use and last_use must both be -1 (unused) or both launch "
                        "indices, not %d and %d",
                        w, a->first_use, a->last_use);
        if (a->first_use > a->last_use)
            return fail(r, FS_ERR_CONFIG, "%s.first_use (%d) is after its last_use (%d)", w,
                        a->first_use, a->last_use);
    }
    return true;
}

static bool parse_launches(struct rd *r, json_t *arr, struct fs_profile *p)
{
    size_t n = json_array_size(arr);
    if (n == 0)
        return true;
    /* First pass: the refs arrays, so that all references fit one allocation. */
    size_t total = 0;
    bool named = false;
    for (size_t i = 0; i < n; i++) {
        char w[PIO_WHERE_MAX];
        json_t *o = element(r, arr, "launches", i, w);
        json_t *refs = o ? get_array(r, o, w, "refs", PIO_MAX_REFS) : NULL;
        if (!refs)
            return false;
        total += json_array_size(refs);
        if (total > PIO_MAX_REFS)
            return fail(r, FS_ERR_CONFIG,
                        "launches is too large (more than %d allocation references in all)",
                        PIO_MAX_REFS);
        named = named || json_object_get(o, "name");
    }
    p->launches = calloc(n, sizeof(*p->launches));
    if (!p->launches)
        return nomem(r);
    p->nlaunches = (int)n;
    if (total) {
        p->refs = calloc(total, sizeof(*p->refs));
        if (!p->refs)
            return nomem(r);
        p->nrefs = (int)total;
    }
    if (named) {
        p->kernel_names = calloc(n, sizeof(*p->kernel_names));
        if (!p->kernel_names)
            return nomem(r);
    }
    int next = 0;
    for (size_t i = 0; i < n; i++) {
        char w[PIO_WHERE_MAX], path[PIO_PATH_MAX];
        json_t *o = json_array_get(arr, i);
        snprintf(w, sizeof(w), "launches[%zu]", i);
        struct fs_prof_launch *l = &p->launches[i];
        const char *s = NULL;
        json_t *v = field(r, o, w, "kernel", path);
        if (!v || !as_string(r, v, path, &s))
            return false;
        if (!parse_hash(s, &l->kernel))
            return fail(r, FS_ERR_CONFIG,
                        "%s must be a hexadecimal string of up to 16 digits, not \"%.40s\"", path,
                        s);
        if ((v = json_object_get(o, "name"))) {
            join(path, sizeof(path), w, "name");
            if (!as_string(r, v, path, &s))
                return false;
            if (!(p->kernel_names[i] = strdup(s)))
                return nomem(r);
        }
        long long stream = 0;
        if (!(v = field(r, o, w, "stream", path)) || !as_ll(r, v, path, 0, UINT32_MAX, &stream) ||
            !get_number(r, o, w, "duration_us", &l->duration_us) ||
            (json_object_get(o, "host_us") && !get_number(r, o, w, "host_us", &l->host_us)))
            return false;
        l->stream = (uint32_t)stream;
        json_t *refs = json_object_get(o, "refs");
        l->ref_start = next;
        l->nrefs = (int)json_array_size(refs);
        for (int k = 0; k < l->nrefs; k++) {
            /* The common case builds no path: references can number millions. */
            json_t *e = json_array_get(refs, (size_t)k);
            json_int_t ref = json_is_integer(e) ? json_integer_value(e) : -1;
            const struct fs_prof_alloc *a = ref >= 0 && ref < p->nallocs ? &p->allocs[ref] : NULL;
            if (a && (int)i >= a->first_use && (int)i <= a->last_use) {
                p->refs[next++] = (int)ref;
                continue;
            }
            snprintf(path, sizeof(path), "%s.refs[%d]", w, k);
            if (ref < 0)
                return fail(r, FS_ERR_CONFIG, "%s must be a non-negative integer", path);
            if (!a)
                return fail(r, FS_ERR_CONFIG, "%s refers to allocation %lld of %d", path,
                            (long long)ref, p->nallocs);
            return fail(r, FS_ERR_CONFIG,
                        "%s refers to allocation %lld, whose first_use..last_use is %d..%d and "
                        "does not include launch %zu",
                        path, (long long)ref, a->first_use, a->last_use, i);
        }
    }
    return true;
}

/* Every allocation's first_use and last_use must be the first and last launch referring to it
 * (the references were already checked to lie inside them). */
static bool check_uses(struct rd *r, struct fs_profile *p)
{
    if (p->nallocs == 0)
        return true;
    int *first = malloc((size_t)p->nallocs * sizeof(int));
    int *last = malloc((size_t)p->nallocs * sizeof(int));
    if (!first || !last) {
        free(first);
        free(last);
        return nomem(r);
    }
    for (int a = 0; a < p->nallocs; a++)
        first[a] = last[a] = -1;
    for (int i = 0; i < p->nlaunches; i++) {
        const struct fs_prof_launch *l = &p->launches[i];
        for (int k = 0; k < l->nrefs; k++) {
            int a = p->refs[l->ref_start + k];
            if (first[a] < 0)
                first[a] = i;
            last[a] = i;
        }
    }
    bool ok = true;
    for (int a = 0; a < p->nallocs && ok; a++) {
        const struct fs_prof_alloc *pa = &p->allocs[a];
        if (first[a] < 0 && pa->first_use >= 0)
            ok = fail(r, FS_ERR_CONFIG,
                      "allocations[%d].first_use is %d but no launch refers to it (it must be -1)",
                      a, pa->first_use);
        else if (first[a] != pa->first_use)
            ok = fail(r, FS_ERR_CONFIG,
                      "allocations[%d].first_use is %d but the first launch referring to it is %d",
                      a, pa->first_use, first[a]);
        else if (last[a] != pa->last_use)
            ok = fail(r, FS_ERR_CONFIG,
                      "allocations[%d].last_use is %d but the last launch referring to it is %d",
                      a, pa->last_use, last[a]);
    }
    free(first);
    free(last);
    return ok;
}

static bool parse_bandwidth(struct rd *r, json_t *root, struct fs_profile *p)
{
    struct fs_bw_model *bw = &p->bw;
    json_t *o = get_object(r, root, "", "bandwidth");
    if (!o || !get_number(r, o, "bandwidth", "h2d_latency_us", &bw->h2d_latency_us) ||
        !get_number(r, o, "bandwidth", "h2d_bytes_per_us", &bw->h2d_bytes_per_us) ||
        !get_number(r, o, "bandwidth", "d2h_latency_us", &bw->d2h_latency_us) ||
        !get_number(r, o, "bandwidth", "d2h_bytes_per_us", &bw->d2h_bytes_per_us) ||
        (json_object_get(o, "read_bytes_per_us") &&
         !get_number(r, o, "bandwidth", "read_bytes_per_us", &bw->read_bytes_per_us)) ||
        (json_object_get(o, "handover_us") &&
         !get_number(r, o, "bandwidth", "handover_us", &bw->handover_us)))
        return false;
    /* bounds that keep the model's sums finite (a petabyte per microsecond, a second) */
    if (bw->read_bytes_per_us > 1e9)
        return fail(r, FS_ERR_CONFIG, "bandwidth.read_bytes_per_us (%g) is more than 1e9",
                    bw->read_bytes_per_us);
    if (bw->handover_us > 1e6)
        return fail(r, FS_ERR_CONFIG, "bandwidth.handover_us (%g) is more than 1e6 (a second)",
                    bw->handover_us);
    json_t *pts = get_array(r, o, "bandwidth", "points", PIO_MAX_POINTS);
    if (!pts)
        return false;
    size_t n = json_array_size(pts);
    if (n == 0)
        return true;
    bw->points = calloc(n, sizeof(*bw->points));
    if (!bw->points)
        return nomem(r);
    bw->npoints = (int)n;
    for (size_t i = 0; i < n; i++) {
        char w[PIO_WHERE_MAX];
        json_t *e = element(r, pts, "bandwidth.points", i, w);
        struct fs_bw_point *pt = &bw->points[i];
        if (!e || !get_u64(r, e, w, "bytes", &pt->bytes) ||
            !get_number(r, e, w, "h2d_us", &pt->h2d_us) ||
            !get_number(r, e, w, "d2h_us", &pt->d2h_us))
            return false;
    }
    return true;
}

static bool parse_plan(struct rd *r, json_t *root, struct fs_profile *p)
{
    struct fs_plan *plan = &p->plan;
    json_t *o = json_object_get(root, "plan");
    if (!o)
        return true; /* saved before planning */
    if (!json_is_object(o))
        return fail(r, FS_ERR_CONFIG, "plan must be an object");
    if (!get_string(r, o, "plan", "strategy", plan->strategy, sizeof(plan->strategy)) ||
        !get_u64(r, o, "plan", "budget", &plan->budget) ||
        !get_number(r, o, "plan", "predicted_us", &plan->predicted_us) ||
        !get_number(r, o, "plan", "predicted_stall_us", &plan->predicted_stall_us) ||
        !get_u64(r, o, "plan", "peak_bytes", &plan->peak_bytes) ||
        (json_object_get(o, "planner") &&
         !get_string(r, o, "plan", "planner", plan->planner, sizeof(plan->planner))))
        return false;
    json_t *entries = get_array(r, o, "plan", "entries", PIO_MAX_ALLOCS);
    if (!entries)
        return false;
    size_t n = json_array_size(entries);
    if (n != (size_t)p->nallocs)
        return fail(r, FS_ERR_CONFIG, "plan.entries has %zu entries for %d allocations", n,
                    p->nallocs);
    if (n == 0)
        return true;
    plan->entries = calloc(n, sizeof(*plan->entries));
    if (!plan->entries)
        return nomem(r);
    plan->nallocs = (int)n;
    for (size_t i = 0; i < n; i++) {
        char w[PIO_WHERE_MAX];
        json_t *e = element(r, entries, "plan.entries", i, w);
        if (!e)
            return false;
        struct fs_plan_entry *pe = &plan->entries[i];
        json_t *res = json_object_get(e, "resident");
        if (res && !json_is_boolean(res))
            return fail(r, FS_ERR_CONFIG, "%s.resident must be true or false", w);
        if (json_is_true(res)) {
            pe->resident = true;
            pe->prefetch_at = pe->evict_after = -1;
            continue;
        }
        /* No prefetch or eviction point (-1): an offloaded allocation no launch uses, or one the
         * plan reads in place. */
        if (!get_int(r, e, w, "prefetch_at", -1, p->nlaunches - 1, &pe->prefetch_at) ||
            !get_int(r, e, w, "evict_after", -1, p->nlaunches - 1, &pe->evict_after))
            return false;
        if ((pe->prefetch_at < 0) != (pe->evict_after < 0))
            return fail(r, FS_ERR_CONFIG,
                        "%s: prefetch_at and evict_after must both be -1 (read in place) or both "
                        "launch indices, not %d and %d",
                        w, pe->prefetch_at, pe->evict_after);
        if (p->allocs[i].first_use < 0 && pe->prefetch_at >= 0)
            return fail(r, FS_ERR_CONFIG,
                        "%s: allocation %zu is used by no launch, so its prefetch_at and "
                        "evict_after must be -1",
                        w, i);
    }
    return true;
}

/* Fills P from ROOT (whose version was checked). On failure P is freed and empty, and DETAIL says
 * which field is wrong; the result is FS_ERR_CONFIG, or FS_ERR_NOMEM. */
static int parse_doc(json_t *root, struct fs_profile *p, char *detail, size_t len)
{
    struct rd r = {detail, len, FS_OK};
    memset(p, 0, sizeof(*p));
    p->version = FS_PROFILE_SCHEMA_VERSION;
    json_t *allocs = NULL, *launches = NULL;
    bool ok = parse_device(&r, root, p) &&
              get_string(&r, root, "", "program", p->program, sizeof(p->program)) &&
              (allocs = get_array(&r, root, "", "allocations", PIO_MAX_ALLOCS)) &&
              (launches = get_array(&r, root, "", "launches", PIO_MAX_LAUNCHES));
    if (ok) {
        /* The allocations' use ranges are checked against the launch count before the launches
         * themselves are read. */
        p->nlaunches = (int)json_array_size(launches);
        ok = parse_allocs(&r, allocs, p);
        p->nlaunches = 0;
        ok = ok && parse_launches(&r, launches, p) && check_uses(&r, p) &&
             parse_bandwidth(&r, root, p) && parse_plan(&r, root, p);
    }
    if (ok)
        return FS_OK;
    fs_profile_free(p);
    memset(p, 0, sizeof(*p));
    return r.rc;
}

/* The whole file into *TEXT (malloc'd); 0 or an errno value (EFBIG: over the size limit). */
static int read_file(const char *path, char **text, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno;
    struct stat st;
    int se = fstat(fd, &st) != 0 ? errno : S_ISDIR(st.st_mode) ? EISDIR : 0;
    if (se) {
        close(fd);
        return se;
    }
    size_t cap = S_ISREG(st.st_mode) && st.st_size > 0 ? (size_t)st.st_size + 1 : 65536;
    size_t n = 0;
    char *buf = NULL;
    int e = 0;
    for (;;) {
        if (n + 1 > (size_t)PIO_MAX_FILE_BYTES) {
            e = EFBIG;
            break;
        }
        if (!buf || n == cap) {
            if (buf)
                cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                e = ENOMEM;
                break;
            }
            buf = nb;
        }
        ssize_t k = read(fd, buf + n, cap - n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            e = errno;
            break;
        }
        if (k == 0)
            break;
        n += (size_t)k;
    }
    close(fd);
    if (e) {
        free(buf);
        return e;
    }
    *text = buf;
    *len = n;
    return 0;
}

int fs_profile_load(const char *path, struct fs_profile *out, char *err, size_t errlen)
{
    if (out)
        memset(out, 0, sizeof(*out));
    if (!path || !out) {
        seterr(err, errlen, "cannot read profile: no file name given");
        return FS_ERR_INVALID;
    }
    char *text = NULL;
    size_t len = 0;
    int e = read_file(path, &text, &len);
    if (e == EFBIG) {
        seterr(err, errlen, "profile %s is too large (more than %lld bytes)", path,
               PIO_MAX_FILE_BYTES);
        return FS_ERR_CONFIG;
    }
    if (e) {
        seterr(err, errlen, "cannot read profile %s: %s", path, strerror(e));
        return FS_ERR_IO;
    }
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!root) {
        if (json_error_code(&je) == json_error_out_of_memory) {
            seterr(err, errlen, "cannot read profile %s: %s", path, strerror(ENOMEM));
            return FS_ERR_IO;
        }
        seterr(err, errlen,
               "profile %s is not valid JSON (line %d, column %d: %s); record it again", path,
               je.line, je.column, je.text);
        return FS_ERR_CONFIG;
    }

    int rc = FS_ERR_CONFIG;
    json_t *ver = json_object_get(root, "flexshim_profile");
    if (!json_is_object(root)) {
        seterr(err, errlen, "%s is not a flexshim profile (it is not a JSON object)", path);
    } else if (!ver) {
        seterr(err, errlen, "%s is not a flexshim profile (no \"flexshim_profile\" version field)",
               path);
    } else if (!json_is_integer(ver)) {
        seterr(err, errlen,
               "profile %s: flexshim_profile must be an integer (the schema version); record it "
               "again",
               path);
    } else if (json_integer_value(ver) != FS_PROFILE_SCHEMA_VERSION) {
        seterr(err, errlen,
               "profile %s has schema version %lld; this flexshim reads version %d: "
               "record it again",
               path, (long long)json_integer_value(ver), FS_PROFILE_SCHEMA_VERSION);
    } else {
        char detail[PIO_DETAIL_MAX];
        rc = parse_doc(root, out, detail, sizeof(detail));
        if (rc == FS_ERR_NOMEM) {
            seterr(err, errlen, "cannot read profile %s: %s", path, strerror(ENOMEM));
            rc = FS_ERR_IO;
        } else if (rc != FS_OK) {
            seterr(err, errlen, "profile %s: %s; record it again", path, detail);
        }
    }
    json_decref(root);
    return rc;
}

/* ---- writing ---------------------------------------------------------------------------- */

/* The builder's state: whether everything went in, and if not because of the profile itself
 * (rather than memory), what is wrong. */
struct wr {
    bool ok;
    char detail[PIO_DETAIL_MAX];
};

static void wfail(struct wr *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void wfail(struct wr *w, const char *fmt, ...)
{
    if (w->ok || !w->detail[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->detail, sizeof(w->detail), fmt, ap);
        va_end(ap);
    }
    w->ok = false;
}

/* Adds V (NULL: out of memory) under KEY; V is consumed either way. */
static void put(struct wr *w, json_t *o, const char *key, json_t *v)
{
    if (json_object_set_new(o, key, v) != 0)
        w->ok = false;
}

static void append(struct wr *w, json_t *a, json_t *v)
{
    if (json_array_append_new(a, v) != 0)
        w->ok = false;
}

static void put_u64(struct wr *w, json_t *o, const char *where, const char *key, uint64_t x)
{
    if (x > (uint64_t)INT64_MAX) {
        char path[PIO_PATH_MAX];
        join(path, sizeof(path), where, key);
        wfail(w, "%s (%" PRIu64 ") is larger than a profile can hold", path, x);
        return;
    }
    put(w, o, key, json_integer((json_int_t)x));
}

static void put_real(struct wr *w, json_t *o, const char *where, const char *key, double x)
{
    if (!isfinite(x)) {
        char path[PIO_PATH_MAX];
        join(path, sizeof(path), where, key);
        wfail(w, "%s is not a finite number", path);
        return;
    }
    put(w, o, key, json_real(x));
}

/* A string, cut at CAP bytes if the fixed buffer lacks its terminator. Bytes that are not valid
 * UTF-8 (a command line may hold any) become '?', since JSON text is UTF-8. */
static void put_str(struct wr *w, json_t *o, const char *key, const char *s, size_t cap)
{
    size_t n = strnlen(s, cap);
    json_t *v = json_stringn(s, n);
    if (!v) {
        char *copy = malloc(n + 1);
        if (copy) {
            for (size_t i = 0; i < n; i++)
                copy[i] = (unsigned char)s[i] < 0x80 ? s[i] : '?';
            v = json_stringn(copy, n);
            free(copy);
        }
    }
    put(w, o, key, v);
}

static json_t *build_doc(const struct fs_profile *p, struct wr *w)
{
    json_t *root = json_object();
    if (!root) {
        w->ok = false;
        return NULL;
    }
    if (p->nallocs < 0 || p->nlaunches < 0 || p->nrefs < 0 || p->bw.npoints < 0 ||
        p->plan.nallocs < 0 || (p->nallocs && !p->allocs) || (p->nlaunches && !p->launches) ||
        (p->nrefs && !p->refs) || (p->bw.npoints && !p->bw.points) ||
        (p->plan.nallocs && !p->plan.entries)) {
        wfail(w, "the profile's counts and arrays do not agree");
        return root;
    }
    put(w, root, "flexshim_profile", json_integer(FS_PROFILE_SCHEMA_VERSION));

    json_t *dev = json_object();
    put(w, root, "device", dev);
    if (dev) {
        put_str(w, dev, "name", p->device_name, sizeof(p->device_name));
        put(w, dev, "cc", json_pack("[ii]", p->cc_major, p->cc_minor));
        put_u64(w, dev, "device", "total_bytes", p->device_total);
        put(w, dev, "driver_version", json_integer(p->driver_version));
    }
    put_str(w, root, "program", p->program, sizeof(p->program));

    json_t *allocs = json_array();
    put(w, root, "allocations", allocs);
    for (int i = 0; allocs && i < p->nallocs && w->ok; i++) {
        const struct fs_prof_alloc *a = &p->allocs[i];
        char where[PIO_WHERE_MAX];
        snprintf(where, sizeof(where), "allocations[%d]", i);
        json_t *o = json_object();
        append(w, allocs, o);
        if (!o)
            break;
        put_u64(w, o, where, "order", a->order);
        put_u64(w, o, where, "size", a->size);
        put_u64(w, o, where, "mapped", a->mapped);
        put(w, o, "first_use", json_integer(a->first_use));
        put(w, o, "last_use", json_integer(a->last_use));
        if (a->unchanged)
            put(w, o, "unchanged", json_true());
    }

    json_t *launches = json_array();
    put(w, root, "launches", launches);
    for (int i = 0; launches && i < p->nlaunches && w->ok; i++) {
        const struct fs_prof_launch *l = &p->launches[i];
        char where[PIO_WHERE_MAX], hash[24];
        snprintf(where, sizeof(where), "launches[%d]", i);
        if (l->nrefs < 0 || l->ref_start < 0 || l->ref_start > p->nrefs ||
            l->nrefs > p->nrefs - l->ref_start) {
            wfail(w, "%s.refs lie outside the profile's references", where);
            break;
        }
        json_t *o = json_object();
        append(w, launches, o);
        if (!o)
            break;
        snprintf(hash, sizeof(hash), "0x%016" PRIx64, l->kernel);
        put(w, o, "kernel", json_string(hash));
        if (p->kernel_names && p->kernel_names[i])
            put_str(w, o, "name", p->kernel_names[i], SIZE_MAX);
        put(w, o, "stream", json_integer(l->stream));
        put_real(w, o, where, "duration_us", l->duration_us);
        if (l->host_us > 0)
            put_real(w, o, where, "host_us", l->host_us);
        json_t *refs = json_array();
        put(w, o, "refs", refs);
        for (int k = 0; refs && k < l->nrefs; k++)
            append(w, refs, json_integer(p->refs[l->ref_start + k]));
    }

    const struct fs_bw_model *bw = &p->bw;
    json_t *b = json_object();
    put(w, root, "bandwidth", b);
    if (b) {
        put_real(w, b, "bandwidth", "h2d_latency_us", bw->h2d_latency_us);
        put_real(w, b, "bandwidth", "h2d_bytes_per_us", bw->h2d_bytes_per_us);
        put_real(w, b, "bandwidth", "d2h_latency_us", bw->d2h_latency_us);
        put_real(w, b, "bandwidth", "d2h_bytes_per_us", bw->d2h_bytes_per_us);
        if (bw->read_bytes_per_us > 0)
            put_real(w, b, "bandwidth", "read_bytes_per_us", bw->read_bytes_per_us);
        if (bw->handover_us > 0)
            put_real(w, b, "bandwidth", "handover_us", bw->handover_us);
        json_t *pts = json_array();
        put(w, b, "points", pts);
        for (int i = 0; pts && i < bw->npoints && w->ok; i++) {
            char where[PIO_WHERE_MAX];
            snprintf(where, sizeof(where), "bandwidth.points[%d]", i);
            json_t *o = json_object();
            append(w, pts, o);
            if (!o)
                break;
            put_u64(w, o, where, "bytes", bw->points[i].bytes);
            put_real(w, o, where, "h2d_us", bw->points[i].h2d_us);
            put_real(w, o, where, "d2h_us", bw->points[i].d2h_us);
        }
    }

    const struct fs_plan *plan = &p->plan;
    if (plan->nallocs > 0 || plan->strategy[0]) {
        json_t *o = json_object();
        put(w, root, "plan", o);
        if (o) {
            put_str(w, o, "strategy", plan->strategy, sizeof(plan->strategy));
            put_u64(w, o, "plan", "budget", plan->budget);
            put_real(w, o, "plan", "predicted_us", plan->predicted_us);
            put_real(w, o, "plan", "predicted_stall_us", plan->predicted_stall_us);
            put_u64(w, o, "plan", "peak_bytes", plan->peak_bytes);
            if (plan->planner[0])
                put_str(w, o, "planner", plan->planner, sizeof(plan->planner));
            json_t *entries = json_array();
            put(w, o, "entries", entries);
            for (int i = 0; entries && i < plan->nallocs && w->ok; i++) {
                const struct fs_plan_entry *pe = &plan->entries[i];
                json_t *e = pe->resident ? json_pack("{sb}", "resident", 1)
                                         : json_pack("{sisi}", "prefetch_at", pe->prefetch_at,
                                                     "evict_after", pe->evict_after);
                append(w, entries, e);
            }
        }
    }
    return root;
}

static int write_all(int fd, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, s, n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        s += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Makes the rename durable; a failure here does not undo the save. */
static void sync_dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    char dir[PATH_MAX];
    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else if (slash == path)
        snprintf(dir, sizeof(dir), "/");
    else
        snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

int fs_profile_save(const char *path, const struct fs_profile *p, char *err, size_t errlen)
{
    if (!path || !path[0] || !p) {
        seterr(err, errlen, "cannot write profile %s: %s", path ? path : "(none)",
               strerror(EINVAL));
        return FS_ERR_IO;
    }
    struct wr w = {.ok = true};
    json_t *root = build_doc(p, &w);
    if (w.ok) {
        /* What is written must load: the same checks as fs_profile_load. */
        struct fs_profile check;
        int rc = parse_doc(root, &check, w.detail, sizeof(w.detail));
        if (rc == FS_OK)
            fs_profile_free(&check);
        else
            w.ok = false;
        if (rc == FS_ERR_NOMEM)
            w.detail[0] = '\0';
    }
    char *text = w.ok ? json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!text) {
        if (w.detail[0])
            seterr(err, errlen, "cannot write profile %s: %s", path, w.detail);
        else
            seterr(err, errlen, "cannot write profile %s: %s", path, strerror(ENOMEM));
        return FS_ERR_IO;
    }

    size_t tlen = strlen(path) + 32;
    char *tmp = malloc(tlen);
    if (!tmp) {
        free(text);
        seterr(err, errlen, "cannot write profile %s: %s", path, strerror(ENOMEM));
        return FS_ERR_IO;
    }
    snprintf(tmp, tlen, "%s.tmp.%ld", path, (long)getpid());
    int e = 0;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
        e = errno;
    } else {
        if (write_all(fd, text, strlen(text)) != 0 || write_all(fd, "\n", 1) != 0 ||
            fsync(fd) != 0)
            e = errno;
        if (close(fd) != 0 && !e)
            e = errno;
        if (!e && rename(tmp, path) != 0)
            e = errno;
        if (e)
            unlink(tmp);
    }
    free(text);
    free(tmp);
    if (e) {
        seterr(err, errlen, "cannot write profile %s: %s", path, strerror(e));
        return FS_ERR_IO;
    }
    sync_dir_of(path);
    return FS_OK;
}

/* ---- matching --------------------------------------------------------------------------- */

/* "143155 MiB", or the exact bytes when the other total differs but rounds to the same MiB. */
static void fmt_total(char *buf, size_t len, uint64_t total, uint64_t other)
{
    if (total == other || total >> 20 != other >> 20)
        snprintf(buf, len, "%" PRIu64 " MiB", total >> 20);
    else
        snprintf(buf, len, "%" PRIu64 " bytes", total);
}

int fs_profile_match_device(const struct fs_profile *p, const char *device_name, int cc_major,
                            int cc_minor, uint64_t device_total, char *err, size_t errlen)
{
    if (!p || !device_name) {
        seterr(err, errlen, "no profile or device to compare");
        return FS_ERR_INVALID;
    }
    if (strncmp(p->device_name, device_name, sizeof(p->device_name)) == 0 &&
        p->cc_major == cc_major && p->cc_minor == cc_minor && p->device_total == device_total)
        return FS_OK;
    char t1[48], t2[48];
    fmt_total(t1, sizeof(t1), p->device_total, device_total);
    fmt_total(t2, sizeof(t2), device_total, p->device_total);
    seterr(err, errlen,
           "profile was recorded on %.*s (cc %d.%d, %s); this is %s (cc %d.%d, %s): it is not used",
           (int)sizeof(p->device_name), p->device_name, p->cc_major, p->cc_minor, t1, device_name,
           cc_major, cc_minor, t2);
    return FS_ERR_NOT_FOUND;
}

int fs_profile_match_alloc(const struct fs_profile *p, uint64_t order, uint64_t size, char *err,
                           size_t errlen)
{
    if (!p) {
        seterr(err, errlen, "no profile to compare");
        return FS_ERR_INVALID;
    }
    if (order >= (uint64_t)p->nallocs || p->allocs[order].size == size)
        return FS_OK;
    seterr(err, errlen, "allocation %" PRIu64 " is %" PRIu64 " bytes here, %" PRIu64
           " in the profile", order, size, p->allocs[order].size);
    return FS_ERR_NOT_FOUND;
}
