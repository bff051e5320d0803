/* Profiles on disk: save and load round trips, atomic saving, every load error (the file, the
 * field, the fix), and matching a profile against this device and this run's allocations. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "fs.h"
#include "profile.h"
#include "test_util.h"

#define GiB (1ULL << 30)
#define MiB (1ULL << 20)

/* ---- a temporary directory per test ----------------------------------------------------- */

struct tdir {
    char dir[64];
    char path[128]; /* DIR/profile.json */
};

static int setup(void **state)
{
    struct tdir *t = calloc(1, sizeof(*t));
    if (!t)
        return -1;
    snprintf(t->dir, sizeof(t->dir), "/tmp/flexshim-pio-XXXXXX");
    if (!mkdtemp(t->dir)) {
        free(t);
        return -1;
    }
    snprintf(t->path, sizeof(t->path), "%s/profile.json", t->dir);
    *state = t;
    return 0;
}

static void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char p[512];
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
            chmod(p, 0755);
            remove_tree(p);
        } else {
            unlink(p);
        }
    }
    closedir(d);
    rmdir(dir);
}

static int teardown(void **state)
{
    struct tdir *t = *state;
    chmod(t->dir, 0755);
    remove_tree(t->dir);
    free(t);
    return 0;
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

static bool has_temp_file(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    bool found = false;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp."))
            found = true;
    closedir(d);
    return found;
}

/* ---- a rich profile --------------------------------------------------------------------- */

struct rich {
    struct fs_profile p;
    struct fs_prof_alloc allocs[4];
    struct fs_prof_launch launches[5];
    int refs[6];
    char *names[5];
    struct fs_bw_point points[3];
    struct fs_plan_entry entries[4];
};

/* Four allocations (one unused, two above 4 GiB), five launches (hashes above 2^53, a launch with
 * no references, a stream number above 2^31), three bandwidth points and a plan. */
static void rich_fill(struct rich *r)
{
    memset(r, 0, sizeof(*r));
    struct fs_profile *p = &r->p;
    p->version = FS_PROFILE_SCHEMA_VERSION;
    snprintf(p->device_name, sizeof(p->device_name), "NVIDIA H200");
    p->cc_major = 9;
    p->cc_minor = 0;
    p->device_total = 150110011392ULL;
    p->driver_version = 13000;
    snprintf(p->program, sizeof(p->program), "python train.py --steps 10 --name \"x y\"");

    r->allocs[0] = (struct fs_prof_alloc){3, 5 * GiB + 7, 5 * GiB + 2 * MiB, 0, 4, false};
    r->allocs[1] = (struct fs_prof_alloc){7, 1000, 2 * MiB, 0, 1, true};
    r->allocs[2] = (struct fs_prof_alloc){8, 4096, 2 * MiB, -1, -1, false};
    r->allocs[3] = (struct fs_prof_alloc){12, 1ULL << 40, 1ULL << 40, 2, 4, true};
    p->nallocs = 4;
    p->allocs = r->allocs;

    static const int refs[] = {0, 1, 1, 3, 0, 3};
    memcpy(r->refs, refs, sizeof(refs));
    r->launches[0] = (struct fs_prof_launch){0xfedcba9876543210ULL, 0, 12.5, 2, 0, 0};
    r->launches[1] = (struct fs_prof_launch){(1ULL << 53) + 1, 1, 0.1, 1, 2, 0};
    r->launches[2] = (struct fs_prof_launch){0, 4000000000U, 1e-9, 1, 3, 0};
    r->launches[3] = (struct fs_prof_launch){1, 0, 7, 0, 4, 0.5};
    r->launches[4] = (struct fs_prof_launch){~0ULL, 2, 123456.789, 2, 4, 17.25};
    p->nlaunches = 5;
    p->launches = r->launches;
    p->nrefs = 6;
    p->refs = r->refs;
    r->names[0] = "void gemm_kernel<float, 128>(float const*, float*)";
    r->names[2] = "memcpy HtoD";
    r->names[4] = "last";
    p->kernel_names = r->names;

    p->bw.h2d_latency_us = 8.25;
    p->bw.h2d_bytes_per_us = 25000.5;
    p->bw.d2h_latency_us = 9.0;
    p->bw.d2h_bytes_per_us = 1.0 / 3.0;
    p->bw.read_bytes_per_us = 6.25e6;
    p->bw.handover_us = 600.0;
    r->points[0] = (struct fs_bw_point){4096, 8.5, 9.1};
    r->points[1] = (struct fs_bw_point){GiB, 42000.0, 44000.0};
    r->points[2] = (struct fs_bw_point){6 * GiB, 251000.25, 262000.75};
    p->bw.npoints = 3;
    p->bw.points = r->points;

    snprintf(p->plan.strategy, sizeof(p->plan.strategy), "knapsack");
    p->plan.budget = 80 * GiB;
    p->plan.predicted_us = 1234.5;
    p->plan.predicted_stall_us = 12.25;
    p->plan.peak_bytes = 70 * GiB + 3;
    snprintf(p->plan.planner, sizeof(p->plan.planner), "0123456789ab");
    r->entries[0] = (struct fs_plan_entry){false, 3, 4};
    r->entries[1] = (struct fs_plan_entry){true, -1, -1};
    r->entries[2] = (struct fs_plan_entry){false, -1, -1};
    r->entries[3] = (struct fs_plan_entry){false, 1, 4};
    p->plan.nallocs = 4;
    p->plan.entries = r->entries;
}

static void assert_profiles_equal(const struct fs_profile *a, const struct fs_profile *b)
{
    assert_int_equal(b->version, FS_PROFILE_SCHEMA_VERSION);
    assert_string_equal(a->device_name, b->device_name);
    assert_int_equal(a->cc_major, b->cc_major);
    assert_int_equal(a->cc_minor, b->cc_minor);
    assert_true(a->device_total == b->device_total);
    assert_int_equal(a->driver_version, b->driver_version);
    assert_string_equal(a->program, b->program);
    assert_int_equal(a->nallocs, b->nallocs);
    for (int i = 0; i < a->nallocs; i++) {
        assert_true(a->allocs[i].order == b->allocs[i].order);
        assert_true(a->allocs[i].size == b->allocs[i].size);
        assert_true(a->allocs[i].mapped == b->allocs[i].mapped);
        assert_int_equal(a->allocs[i].first_use, b->allocs[i].first_use);
        assert_int_equal(a->allocs[i].unchanged, b->allocs[i].unchanged);
        assert_int_equal(a->allocs[i].last_use, b->allocs[i].last_use);
    }
    assert_int_equal(a->nlaunches, b->nlaunches);
    assert_int_equal(a->nrefs, b->nrefs);
    for (int i = 0; i < a->nlaunches; i++) {
        const struct fs_prof_launch *x = &a->launches[i], *y = &b->launches[i];
        assert_true(x->kernel == y->kernel);
        assert_true(x->stream == y->stream);
        assert_true(x->duration_us == y->duration_us); /* exact: %.17g round trips */
        assert_true(x->host_us == y->host_us);
        assert_int_equal(x->nrefs, y->nrefs);
        for (int k = 0; k < x->nrefs; k++)
            assert_int_equal(a->refs[x->ref_start + k], b->refs[y->ref_start + k]);
        const char *na = a->kernel_names ? a->kernel_names[i] : NULL;
        const char *nb = b->kernel_names ? b->kernel_names[i] : NULL;
        if (na)
            assert_string_equal(na, nb);
        else
            assert_null(nb);
    }
    assert_true(a->bw.h2d_latency_us == b->bw.h2d_latency_us);
    assert_true(a->bw.h2d_bytes_per_us == b->bw.h2d_bytes_per_us);
    assert_true(a->bw.d2h_latency_us == b->bw.d2h_latency_us);
    assert_true(a->bw.d2h_bytes_per_us == b->bw.d2h_bytes_per_us);
    assert_true(a->bw.read_bytes_per_us == b->bw.read_bytes_per_us);
    assert_true(a->bw.handover_us == b->bw.handover_us);
    assert_int_equal(a->bw.npoints, b->bw.npoints);
    for (int i = 0; i < a->bw.npoints; i++) {
        assert_true(a->bw.points[i].bytes == b->bw.points[i].bytes);
        assert_true(a->bw.points[i].h2d_us == b->bw.points[i].h2d_us);
        assert_true(a->bw.points[i].d2h_us == b->bw.points[i].d2h_us);
    }
    assert_string_equal(a->plan.strategy, b->plan.strategy);
    assert_true(a->plan.budget == b->plan.budget);
    assert_true(a->plan.predicted_us == b->plan.predicted_us);
    assert_true(a->plan.predicted_stall_us == b->plan.predicted_stall_us);
    assert_true(a->plan.peak_bytes == b->plan.peak_bytes);
    assert_string_equal(a->plan.planner, b->plan.planner);
    assert_int_equal(a->plan.nallocs, b->plan.nallocs);
    for (int i = 0; i < a->plan.nallocs; i++) {
        assert_int_equal(a->plan.entries[i].resident, b->plan.entries[i].resident);
        assert_int_equal(a->plan.entries[i].prefetch_at, b->plan.entries[i].prefetch_at);
        assert_int_equal(a->plan.entries[i].evict_after, b->plan.entries[i].evict_after);
    }
}

static void assert_empty(const struct fs_profile *p)
{
    static const struct fs_profile zero;
    assert_memory_equal(p, &zero, sizeof(zero));
}

/* ERR must contain every NULL-terminated needle. */
static void assert_has(const char *err, ...)
{
    va_list ap;
    va_start(ap, err);
    const char *needle;
    while ((needle = va_arg(ap, const char *))) {
        if (!strstr(err, needle))
            fail_msg("\"%s\" is not in \"%s\"", needle, err);
    }
    va_end(ap);
    assert_null(strchr(err, '\n')); /* one line */
}

/* The rich profile saved at T's path and read back as JSON (to look at or edit). */
static json_t *saved_rich_json(struct tdir *t)
{
    struct rich r;
    rich_fill(&r);
    char err[512] = "";
    assert_int_equal(fs_profile_save(t->path, &r.p, err, sizeof(err)), FS_OK);
    json_error_t je;
    json_t *root = json_load_file(t->path, 0, &je);
    assert_non_null(root);
    return root;
}

/* ---- round trips ------------------------------------------------------------------------ */

static void test_round_trip_rich(void **state)
{
    struct tdir *t = *state;
    struct rich r;
    rich_fill(&r);
    char err[512] = "";
    assert_int_equal(fs_profile_save(t->path, &r.p, err, sizeof(err)), FS_OK);
    struct fs_profile q;
    assert_int_equal(fs_profile_load(t->path, &q, err, sizeof(err)), FS_OK);
    assert_profiles_equal(&r.p, &q);
    assert_non_null(q.kernel_names);
    assert_true(q.launches[0].kernel == 0xfedcba9876543210ULL);
    assert_true(q.launches[1].kernel == (1ULL << 53) + 1);
    assert_true(q.allocs[3].size == 1ULL << 40);
    fs_profile_free(&q);
}

static void test_round_trip_minimal(void **state)
{
    struct tdir *t = *state;
    struct fs_profile p;
    memset(&p, 0, sizeof(p));
    snprintf(p.device_name, sizeof(p.device_name), "sim");
    char err[512] = "";
    assert_int_equal(fs_profile_save(t->path, &p, err, sizeof(err)), FS_OK);
    struct fs_profile q;
    assert_int_equal(fs_profile_load(t->path, &q, err, sizeof(err)), FS_OK);
    assert_profiles_equal(&p, &q);
    assert_null(q.allocs);
    assert_null(q.launches);
    assert_null(q.refs);
    assert_null(q.kernel_names);
    assert_null(q.bw.points);
    assert_null(q.plan.entries);
    fs_profile_free(&q);
}

static void test_round_trip_without_plan_or_names(void **state)
{
    struct tdir *t = *state;
    struct rich r;
    rich_fill(&r);
    memset(&r.p.plan, 0, sizeof(r.p.plan));
    r.p.kernel_names = NULL;
    char err[512] = "";
    assert_int_equal(fs_profile_save(t->path, &r.p, err, sizeof(err)), FS_OK);
    json_error_t je;
    json_t *root = json_load_file(t->path, 0, &je);
    assert_non_null(root);
    assert_null(json_object_get(root, "plan"));
    assert_null(json_object_get(json_array_get(json_object_get(root, "launches"), 0), "name"));
    json_decref(root);
    struct fs_profile q;
    assert_int_equal(fs_profile_load(t->path, &q, err, sizeof(err)), FS_OK);
    assert_profiles_equal(&r.p, &q);
    assert_null(q.kernel_names);
    assert_int_equal(q.plan.nallocs, 0);
    assert_null(q.plan.entries);
    fs_profile_free(&q);
}

/* The file itself: version first, the hash as a hex string, big byte counts as integers. */
static void test_saved_document_layout(void **state)
{
    struct tdir *t = *state;
    json_t *root = saved_rich_json(t);
    assert_string_equal(json_object_iter_key(json_object_iter(root)), "flexshim_profile");
    assert_int_equal(json_integer_value(json_object_get(root, "flexshim_profile")),
                     FS_PROFILE_SCHEMA_VERSION);
    json_t *l0 = json_array_get(json_object_get(root, "launches"), 0);
    assert_string_equal(json_string_value(json_object_get(l0, "kernel")), "0xfedcba9876543210");
    json_t *a0 = json_array_get(json_object_get(root, "allocations"), 0);
    assert_true(json_is_integer(json_object_get(a0, "size")));
    assert_true(json_integer_value(json_object_get(a0, "size")) == (json_int_t)(5 * GiB + 7));
    json_t *e1 = json_array_get(json_object_get(json_object_get(root, "plan"), "entries"), 1);
    assert_true(json_is_true(json_object_get(e1, "resident")));
    json_decref(root);

    FILE *f = fopen(t->path, "r");
    assert_non_null(f);
    fseek(f, -1, SEEK_END);
    assert_int_equal(fgetc(f), '\n');
    fclose(f);
}

/* A command line that is not UTF-8 is saved with '?' for the bad bytes, not refused. */
static void test_program_not_utf8(void **state)
{
    struct tdir *t = *state;
    struct rich r;
    rich_fill(&r);
    snprintf(r.p.program, sizeof(r.p.program), "prog \xff\xfe arg");
    char err[512] = "";
    assert_int_equal(fs_profile_save(t->path, &r.p, err, sizeof(err)), FS_OK);
    struct fs_profile q;
    assert_int_equal(fs_profile_load(t->path, &q, err, sizeof(err)), FS_OK);
    assert_string_equal(q.program, "prog ?? arg");
    fs_profile_free(&q);
}

/* ---- saving is atomic ------------------------------------------------------------------- */

static void test_save_replaces_and_leaves_no_temp(void **state)
{
    struct tdir *t = *state;
    struct rich r;
    rich_fill(&r);
    char err[512] = "";
    assert_int_equal(fs_profile_save(t->path, &r.p, err, sizeof(err)), FS_OK);
    r.p.plan.budget = 7;
    assert_int_equal(fs_profile_save(t->path, &r.p, err, sizeof(err)), FS_OK);
    assert_int_equal(count_entries(t->dir), 1);
    assert_false(has_temp_file(t->dir));
    struct fs_profile q;
    assert_int_equal(fs_profile_load(t->path, &q, err, sizeof(err)), FS_OK);
    assert_true(q.plan.budget == 7);
    fs_profile_free(&q);
}

static void test_save_missing_directory(void **state)
{
    struct tdir *t = *state;
    struct rich r;
    rich_fill(&r);
    char path[256], err[512] = "";
    snprintf(path, sizeof(path), "%s/no/such/dir/p.json", t->dir);
    assert_int_equal(fs_profile_save(path, &r.p, err, sizeof(err)), FS_ERR_IO);
    char expect[400];
    snprintf(expect, sizeof(expect), "cannot write profile %s: No such file or directory", path);
    assert_string_equal(err, expect);
}

/* The temporary file cannot be created (its name is taken by a directory): the existing profile
 * stays as it was. */
static void test_save_failure_keeps_existing_file(void **state)
{
    struct tdir *t = *state;
    struct rich r;
    rich_fill(&r);
    char err[512] = "";
    assert_int_equal(fs_profile_save(t->path, &r.p, err, sizeof(err)), FS_OK);
    char tmp[256];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", t->path, (long)getpid());
    assert_int_equal(mkdir(tmp, 0755), 0);
    struct rich r2;
    rich_fill(&r2);
    r2.p.plan.budget = 1;
    assert_int_equal(fs_profile_save(t->path, &r2.p, err, sizeof(err)), FS_ERR_IO);
    assert_has(err, "cannot write profile ", t->path, ": Is a directory", NULL);
    assert_int_equal(rmdir(tmp), 0);
    struct fs_profile q;
    assert_int_equal(fs_profile_load(t->path, &q, err, sizeof(err)), FS_OK);
    assert_profiles_equal(&r.p, &q);
    fs_profile_free(&q);
}

/* The rename fails (the target is a directory): the temporary file is removed. */
static void test_save_rename_failure_removes_temp(void **state)
{
    struct tdir *t = *state;
    struct rich r;
    rich_fill(&r);
    assert_int_equal(mkdir(t->path, 0755), 0);
    char err[512] = "";
    assert_int_equal(fs_profile_save(t->path, &r.p, err, sizeof(err)), FS_ERR_IO);
    assert_has(err, "cannot write profile ", t->path, ": Is a directory", NULL);
    assert_false(has_temp_file(t->dir));
    assert_int_equal(count_entries(t->dir), 1);
}

/* The directory is not writable: FS_ERR_IO, "Permission denied", the old file intact. As root
 * the save runs in a child that has become nobody. */
static void test_save_unwritable_directory(void **state)
{
    struct tdir *t = *state;
    struct rich r;
    rich_fill(&r);
    char err[512] = "";
    assert_int_equal(fs_profile_save(t->path, &r.p, err, sizeof(err)), FS_OK);
    assert_int_equal(chmod(t->dir, 0555), 0);
    r.p.plan.budget = 1;
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(pipefd[0]);
        if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0))
            _exit(77);
        int rc = fs_profile_save(t->path, &r.p, err, sizeof(err));
        if (write(pipefd[1], err, strlen(err) + 1) < 0)
            _exit(2);
        _exit(rc == FS_ERR_IO ? 0 : 1);
    }
    close(pipefd[1]);
    char msg[512] = "";
    ssize_t n = read(pipefd[0], msg, sizeof(msg) - 1);
    close(pipefd[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) == 77)
        skip(); /* cannot drop root here */
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_true(n > 0);
    assert_has(msg, "cannot write profile ", t->path, ": Permission denied", NULL);
    chmod(t->dir, 0755);
    assert_false(has_temp_file(t->dir));
    struct fs_profile q;
    assert_int_equal(fs_profile_load(t->path, &q, err, sizeof(err)), FS_OK);
    assert_true(q.plan.budget == 80 * GiB);
    fs_profile_free(&q);
}

/* A profile that could not be loaded again is not written. */
static void test_save_refuses_inconsistent_profile(void **state)
{
    struct tdir *t = *state;
    struct rich r;
    rich_fill(&r);
    r.refs[2] = 9;
    char err[512] = "";
    assert_int_equal(fs_profile_save(t->path, &r.p, err, sizeof(err)), FS_ERR_IO);
    assert_has(err, "cannot write profile ", t->path,
        "launches[1].refs[0] refers to allocation 9 of 4",
               NULL);
    assert_int_equal(count_entries(t->dir), 0);

    rich_fill(&r);
    r.launches[1].duration_us = NAN;
    assert_int_equal(fs_profile_save(t->path, &r.p, err, sizeof(err)), FS_ERR_IO);
    assert_has(err, t->path, "launches[1].duration_us is not a finite number", NULL);

    rich_fill(&r);
    r.allocs[2].size = 1ULL << 63;
    assert_int_equal(fs_profile_save(t->path, &r.p, err, sizeof(err)), FS_ERR_IO);
    assert_has(err, t->path, "allocations[2].size (9223372036854775808) is larger", NULL);

    rich_fill(&r);
    r.p.plan.nallocs = 3;
    assert_int_equal(fs_profile_save(t->path, &r.p, err, sizeof(err)), FS_ERR_IO);
    assert_has(err, t->path, "plan.entries has 3 entries for 4 allocations", NULL);
    assert_int_equal(count_entries(t->dir), 0);
}

/* ---- load errors: the file -------------------------------------------------------------- */

/* Loads PATH expecting RC, an empty profile, and the needles in the message. */
#define EXPECT_LOAD_FAIL(path, rc, ...)                                                            \
    do {                                                                                           \
        struct fs_profile q_;                                                                      \
        memset(&q_, 0xab, sizeof(q_));                                                             \
        char e_[1024] = "";                                                                        \
        assert_int_equal(fs_profile_load((path), &q_, e_, sizeof(e_)), (rc));                      \
        assert_empty(&q_);                                                                         \
        assert_has(e_, (path), __VA_ARGS__, NULL);                                                 \
    } while (0)

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_load_missing_file(void **state)
{
    struct tdir *t = *state;
    EXPECT_LOAD_FAIL(t->path, FS_ERR_IO, "cannot read profile ",
                     "profile.json: No such file or directory");
}

static void test_load_directory(void **state)
{
    struct tdir *t = *state;
    EXPECT_LOAD_FAIL(t->dir, FS_ERR_IO, "cannot read profile ", ": Is a directory");
}

static void test_load_not_json(void **state)
{
    struct tdir *t = *state;
    write_text(t->path, "{\n \"flexshim_profile\": 1,\n \"device\": nope\n}\n");
    EXPECT_LOAD_FAIL(t->path, FS_ERR_CONFIG, "is not valid JSON (line 3, column ",
                     "); record it again");
}

static void test_load_empty_file(void **state)
{
    struct tdir *t = *state;
    write_text(t->path, "");
    EXPECT_LOAD_FAIL(t->path, FS_ERR_CONFIG, "is not valid JSON (line ", "record it again");
}

static void test_load_truncated_file(void **state)
{
    struct tdir *t = *state;
    struct rich r;
    rich_fill(&r);
    char err[512] = "";
    assert_int_equal(fs_profile_save(t->path, &r.p, err, sizeof(err)), FS_OK);
    struct stat st;
    assert_int_equal(stat(t->path, &st), 0);
    assert_int_equal(truncate(t->path, st.st_size / 2), 0);
    EXPECT_LOAD_FAIL(t->path, FS_ERR_CONFIG, "is not valid JSON", "end of",
                     "record it again");
}

static void test_load_duplicate_key(void **state)
{
    struct tdir *t = *state;
    write_text(t->path, "{\"flexshim_profile\": 1, \"flexshim_profile\": 1}");
    EXPECT_LOAD_FAIL(t->path, FS_ERR_CONFIG, "is not valid JSON", "duplicate", "record it again");
}

static void test_load_wrong_version(void **state)
{
    struct tdir *t = *state;
    write_text(t->path, "{\"flexshim_profile\": 2, \"device\": {}}");
    EXPECT_LOAD_FAIL(t->path, FS_ERR_CONFIG,
                     "has schema version 2; this flexshim reads version 1: record it again");
    write_text(t->path, "{\"flexshim_profile\": \"1\"}");
    EXPECT_LOAD_FAIL(t->path, FS_ERR_CONFIG, "flexshim_profile must be an integer",
                     "record it again");
}

static void test_load_not_a_profile(void **state)
{
    struct tdir *t = *state;
    write_text(t->path, "{\"version\": 3, \"loader_type\": \"strategy\"}");
    EXPECT_LOAD_FAIL(t->path, FS_ERR_CONFIG,
                     "is not a flexshim profile (no \"flexshim_profile\" version field)");
    write_text(t->path, "[1, 2, 3]");
    EXPECT_LOAD_FAIL(t->path, FS_ERR_CONFIG, "is not a flexshim profile (it is not a JSON object)");
}

/* ---- load errors: fields, by editing a saved rich profile ------------------------------- */

/* The JSON value at PATH ("launches[1].refs"; "" is the root). */
static json_t *jpath(json_t *root, const char *path)
{
    json_t *cur = root;
    const char *s = path;
    while (*s && cur) {
        if (*s == '.')
            s++;
        if (*s == '[') {
            char *end;
            long i = strtol(s + 1, &end, 10);
            cur = json_array_get(cur, (size_t)i);
            s = end + 1;
        } else {
            char key[64];
            size_t n = strcspn(s, ".[");
            assert_true(n < sizeof(key));
            memcpy(key, s, n);
            key[n] = '\0';
            cur = json_object_get(cur, key);
            s += n;
        }
    }
    assert_non_null(cur);
    return cur;
}

/* One change to a saved rich profile: at PARENT, set KEY (or array INDEX when KEY is NULL) to the
 * JSON text VALUE, or remove it when VALUE is NULL; loading must then fail with EXPECT. */
struct edit {
    const char *parent;
    const char *key;
    int index;
    const char *value;
    const char *expect;
};

static void save_edited(const char *path, const struct edit *e)
{
    struct rich r;
    rich_fill(&r);
    char err[512] = "";
    assert_int_equal(fs_profile_save(path, &r.p, err, sizeof(err)), FS_OK);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    assert_non_null(root);
    json_t *parent = jpath(root, e->parent);
    if (e->value) {
        json_t *v = json_loads(e->value, JSON_DECODE_ANY, &je);
        assert_non_null(v);
        if (e->key)
            assert_int_equal(json_object_set_new(parent, e->key, v), 0);
        else
            assert_int_equal(json_array_set_new(parent, (size_t)e->index, v), 0);
    } else if (e->key) {
        assert_int_equal(json_object_del(parent, e->key), 0);
    } else {
        assert_int_equal(json_array_remove(parent, (size_t)e->index), 0);
    }
    assert_int_equal(json_dump_file(root, path, JSON_INDENT(1) | JSON_PRESERVE_ORDER), 0);
    json_decref(root);
}

static void run_edits(const char *path, const struct edit *edits, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        save_edited(path, &edits[i]);
        struct fs_profile q;
        memset(&q, 0xab, sizeof(q));
        char err[1024] = "";
        int rc = fs_profile_load(path, &q, err, sizeof(err));
        if (rc != FS_ERR_CONFIG || !strstr(err, edits[i].expect))
            fail_msg("edit %zu (%s %s): rc %d, \"%s\"; expected \"%s\"", i, edits[i].parent,
                     edits[i].key ? edits[i].key : "[]", rc, err, edits[i].expect);
        assert_empty(&q);
        char head[300];
        snprintf(head, sizeof(head), "profile %s: ", path);
        assert_has(err, head, "; record it again", NULL);
    }
}

static void test_load_missing_fields(void **state)
{
    struct tdir *t = *state;
    static const struct edit edits[] = {
        {"", "device", 0, NULL, "device is missing"},
        {"device", "name", 0, NULL, "device.name is missing"},
        {"", "program", 0, NULL, "program is missing"},
        {"", "allocations", 0, NULL, "allocations is missing"},
        {"allocations[1]", "size", 0, NULL, "allocations[1].size is missing"},
        {"allocations[3]", "last_use", 0, NULL, "allocations[3].last_use is missing"},
        {"launches[2]", "kernel", 0, NULL, "launches[2].kernel is missing"},
        {"launches[4]", "refs", 0, NULL, "launches[4].refs is missing"},
        {"", "bandwidth", 0, NULL, "bandwidth is missing"},
        {"bandwidth.points[2]", "d2h_us", 0, NULL, "bandwidth.points[2].d2h_us is missing"},
        {"plan", "budget", 0, NULL, "plan.budget is missing"},
        {"plan.entries[3]", "evict_after", 0, NULL, "plan.entries[3].evict_after is missing"},
    };
    run_edits(t->path, edits, FS_ARRAY_LEN(edits));
}

static void test_load_wrong_types(void **state)
{
    struct tdir *t = *state;
    static const struct edit edits[] = {
        {"launches[1].refs", NULL, 0, "\"x\"",
         "launches[1].refs[0] must be a non-negative integer"},
        {"launches[4].refs", NULL, 1, "-3", "launches[4].refs[1] must be a non-negative integer"},
        {"allocations[0]", "size", 0, "-5", "allocations[0].size must be a non-negative integer"},
        {"allocations[0]", "order", 0, "1.5",
         "allocations[0].order must be a non-negative integer"},
        {"device", "name", 0, "5", "device.name must be a string"},
        {"device", "cc", 0, "[9]", "device.cc must be [major, minor]"},
        {"device", "cc", 0, "[9, \"0\"]", "device.cc[1] must be an integer"},
        {"device", "total_bytes", 0, "1e11", "device.total_bytes must be a non-negative integer"},
        {"launches[0]", "kernel", 0, "12", "launches[0].kernel must be a string"},
        {"launches[0]", "kernel", 0, "\"0xfedcba98765432101\"",
         "launches[0].kernel must be a hexadecimal string of up to 16 digits"},
        {"launches[0]", "kernel", 0, "\"xyz\"", "launches[0].kernel must be a hexadecimal"},
        {"launches[3]", "name", 0, "null", "launches[3].name must be a string"},
        {"launches[2]", "stream", 0, "-1",
         "launches[2].stream is -1; it must be from 0 to 4294967295"},
        {"launches[0]", "duration_us", 0, "\"fast\"",
         "launches[0].duration_us must be a non-negative number"},
        {"launches[0]", "duration_us", 0, "-1.5",
         "launches[0].duration_us must be a non-negative number"},
        {"", "launches", 0, "{}", "launches must be an array"},
        {"launches", NULL, 3, "[]", "launches[3] must be an object"},
        {"bandwidth.points", NULL, 1, "3", "bandwidth.points[1] must be an object"},
        {"bandwidth", "h2d_bytes_per_us", 0, "true",
         "bandwidth.h2d_bytes_per_us must be a non-negative number"},
        {"", "plan", 0, "[]", "plan must be an object"},
        {"plan.entries[0]", "resident", 0, "1", "plan.entries[0].resident must be true or false"},
        {"plan", "strategy", 0, "\"a strategy name that is far too long for the field\"",
         "plan.strategy is longer than 31 bytes"},
        {"plan", "planner", 0, "7", "plan.planner must be a string"},
        {"plan", "planner", 0, "\"0123456789abcdef\"", "plan.planner is longer than 15 bytes"},
    };
    run_edits(t->path, edits, FS_ARRAY_LEN(edits));
}

static void test_load_ref_out_of_range(void **state)
{
    struct tdir *t = *state;
    static const struct edit edits[] = {
        {"launches[1].refs", NULL, 0, "99", "launches[1].refs[0] refers to allocation 99 of 4"},
        {"launches[4].refs", NULL, 1, "4", "launches[4].refs[1] refers to allocation 4 of 4"},
    };
    run_edits(t->path, edits, FS_ARRAY_LEN(edits));
}

static void test_load_inconsistent_uses(void **state)
{
    struct tdir *t = *state;
    static const struct edit edits[] = {
        {"allocations[0]", "first_use", 0, "5",
         "allocations[0].first_use is 5; it must be from -1 to 4"},
        {"allocations[0]", "last_use", 0, "-2",
         "allocations[0].last_use is -2; it must be from -1 to 4"},
        {"allocations[3]", "last_use", 0, "1",
         "allocations[3].first_use (2) is after its last_use (1)"},
        {"allocations[2]", "first_use", 0, "0",
         "allocations[2].first_use and last_use must both be -1 (unused) or both launch indices"},
        {"allocations[0]", "first_use", 0, "1",
         "launches[0].refs[0] refers to allocation 0, whose first_use..last_use is 1..4 and "
         "does not include launch 0"},
        {"allocations[1]", "last_use", 0, "3",
         "allocations[1].last_use is 3 but the last launch referring to it is 1"},
        {"allocations[3]", "first_use", 0, "1",
         "allocations[3].first_use is 1 but the first launch referring to it is 2"},
        {"allocations[0]", "mapped", 0, "1",
         "allocations[0].mapped (1) is smaller than its size (5368709127)"},
        {"allocations[1]", "unchanged", 0, "1", "allocations[1].unchanged must be true or false"},
        {"bandwidth", "handover_us", 0, "-1", "bandwidth.handover_us must be a non-negative number"},
        {"bandwidth", "read_bytes_per_us", 0, "\"x\"",
         "bandwidth.read_bytes_per_us must be a non-negative number"},
        {"bandwidth", "read_bytes_per_us", 0, "2e9",
         "bandwidth.read_bytes_per_us (2e+09) is more than 1e9"},
        {"bandwidth", "handover_us", 0, "1.7e308",
         "bandwidth.handover_us (1.7e+308) is more than 1e6 (a second)"},
    };
    run_edits(t->path, edits, FS_ARRAY_LEN(edits));
}

/* An allocation no launch refers to must say so (-1), or the planner would keep it needlessly. */
static void test_load_unused_allocation_claims_use(void **state)
{
    struct tdir *t = *state;
    json_t *root = saved_rich_json(t);
    json_t *a2 = jpath(root, "allocations[2]");
    json_object_set_new(a2, "first_use", json_integer(3));
    json_object_set_new(a2, "last_use", json_integer(3));
    json_object_set_new(jpath(root, "plan.entries[2]"), "prefetch_at", json_integer(0));
    json_object_set_new(jpath(root, "plan.entries[2]"), "evict_after", json_integer(0));
    assert_int_equal(json_dump_file(root, t->path, JSON_INDENT(1)), 0);
    json_decref(root);
    EXPECT_LOAD_FAIL(t->path, FS_ERR_CONFIG,
                     "allocations[2].first_use is 3 but no launch refers to it (it must be -1)",
                     "record it again");
}

static void test_load_plan_errors(void **state)
{
    struct tdir *t = *state;
    static const struct edit edits[] = {
        {"plan.entries", NULL, 3, NULL, "plan.entries has 3 entries for 4 allocations"},
        {"plan.entries", NULL, 0, "{\"prefetch_at\": 99, \"evict_after\": 4}",
         "plan.entries[0].prefetch_at is 99; it must be from -1 to 4"},
        {"plan.entries", NULL, 3, "{\"prefetch_at\": -1, \"evict_after\": 4}",
         "plan.entries[3]: prefetch_at and evict_after must both be -1 (read in place) or both "
         "launch indices, not -1 and 4"},
        {"plan.entries", NULL, 2, "{\"prefetch_at\": 0, \"evict_after\": 1}",
         "plan.entries[2]: allocation 2 is used by no launch, so its prefetch_at and evict_after "
         "must be -1"},
        {"plan.entries", NULL, 2, "{\"prefetch_at\": 0, \"evict_after\": 5}",
         "plan.entries[2].evict_after is 5; it must be from -1 to 4"},
        {"plan.entries", NULL, 1, "{\"resident\": false}",
         "plan.entries[1].prefetch_at is missing"},
        {"plan", "budget", 0, "-1", "plan.budget must be a non-negative integer"},
    };
    run_edits(t->path, edits, FS_ARRAY_LEN(edits));
}

static void test_load_too_large(void **state)
{
    struct tdir *t = *state;
    json_t *root = saved_rich_json(t);
    json_t *pts = jpath(root, "bandwidth.points");
    for (int i = 0; i < 4097 - 3; i++)
        json_array_append(pts, json_array_get(pts, 0));
    assert_int_equal(json_dump_file(root, t->path, 0), 0);
    json_decref(root);
    EXPECT_LOAD_FAIL(t->path, FS_ERR_CONFIG,
                     "bandwidth.points is too large (4097 entries, at most 4096 are read)",
                     "record it again");
}

/* A plan saved before plans named their planning code loads with an empty planner (a run plans
 * it again), and an empty planner is not written. */
static void test_plan_without_planner(void **state)
{
    struct tdir *t = *state;
    json_t *root = saved_rich_json(t);
    assert_string_equal(json_string_value(jpath(root, "plan.planner")), "0123456789ab");
    json_object_del(json_object_get(root, "plan"), "planner");
    assert_int_equal(json_dump_file(root, t->path, 0), 0);
    json_decref(root);
    char err[512] = "";
    struct fs_profile q;
    assert_int_equal(fs_profile_load(t->path, &q, err, sizeof(err)), FS_OK);
    assert_string_equal(q.plan.planner, "");
    assert_int_equal(q.plan.nallocs, 4);
    assert_int_equal(fs_profile_save(t->path, &q, err, sizeof(err)), FS_OK);
    fs_profile_free(&q);
    json_error_t je;
    root = json_load_file(t->path, 0, &je);
    assert_non_null(root);
    assert_non_null(json_object_get(root, "plan"));
    assert_null(json_object_get(json_object_get(root, "plan"), "planner"));
    json_decref(root);
}

/* Fields this version does not know are ignored; a plan may be absent. */
static void test_load_tolerates_extra_fields_and_no_plan(void **state)
{
    struct tdir *t = *state;
    json_t *root = saved_rich_json(t);
    json_object_set_new(root, "comment", json_string("recorded by hand"));
    json_object_set_new(jpath(root, "launches[0]"), "grid", json_pack("[iii]", 1, 2, 3));
    json_object_del(root, "plan");
    assert_int_equal(json_dump_file(root, t->path, 0), 0);
    json_decref(root);
    char err[512] = "";
    struct fs_profile q;
    assert_int_equal(fs_profile_load(t->path, &q, err, sizeof(err)), FS_OK);
    assert_int_equal(q.nlaunches, 5);
    assert_int_equal(q.plan.nallocs, 0);
    assert_null(q.plan.entries);
    assert_string_equal(q.plan.strategy, "");
    fs_profile_free(&q);
}

/* A failure late in the file (the plan), after names and arrays were allocated: nothing leaks
 * (ASan and valgrind check) and the output is empty. */
static void test_load_failure_late_frees_everything(void **state)
{
    struct tdir *t = *state;
    static const struct edit e = {"plan", "peak_bytes", 0, "\"many\"",
                                  "plan.peak_bytes must be a non-negative integer"};
    run_edits(t->path, &e, 1);
    /* and loading a good profile into the same struct afterwards works */
    struct rich r;
    rich_fill(&r);
    char err[512] = "";
    assert_int_equal(fs_profile_save(t->path, &r.p, err, sizeof(err)), FS_OK);
    struct fs_profile q;
    assert_int_equal(fs_profile_load(t->path, &q, err, sizeof(err)), FS_OK);
    assert_profiles_equal(&r.p, &q);
    fs_profile_free(&q);
}

/* ---- matching --------------------------------------------------------------------------- */

static void test_match_device(void **state)
{
    (void)state;
    struct rich r;
    rich_fill(&r);
    char err[512] = "";
    assert_int_equal(fs_profile_match_device(&r.p, "NVIDIA H200", 9, 0, 150110011392ULL, err,
                                             sizeof(err)),
                     FS_OK);

    assert_int_equal(fs_profile_match_device(&r.p, "NVIDIA H100 80GB HBM3", 9, 0, 85045231616ULL,
                                             err, sizeof(err)),
                     FS_ERR_NOT_FOUND);
    assert_string_equal(err, "profile was recorded on NVIDIA H200 (cc 9.0, 143156 MiB); this is "
                             "NVIDIA H100 80GB HBM3 (cc 9.0, 81105 MiB): it is not used");

    assert_int_equal(fs_profile_match_device(&r.p, "NVIDIA H200", 10, 0, 150110011392ULL, err,
                                             sizeof(err)),
                     FS_ERR_NOT_FOUND);
    assert_has(err, "(cc 9.0, 143156 MiB); this is NVIDIA H200 (cc 10.0, 143156 MiB)", NULL);

    /* totals within the same MiB are told apart in bytes */
    assert_int_equal(fs_profile_match_device(&r.p, "NVIDIA H200", 9, 0, 150110011392ULL - 4096,
                                             err, sizeof(err)),
                     FS_ERR_NOT_FOUND);
    assert_has(err, "150110011392 bytes", "150110007296 bytes", "it is not used", NULL);
}

static void test_match_alloc_by_order_and_size(void **state)
{
    (void)state;
    struct rich r;
    rich_fill(&r);
    const uint64_t sizes[] = {5 * GiB + 7, 1000, 4096, 1ULL << 40};
    char err[512] = "";
    for (int i = 0; i < 4; i++)
        assert_int_equal(fs_profile_match_alloc(&r.p, (uint64_t)i, sizes[i], err, sizeof(err)),
                         FS_OK);
    /* Allocations past the profile's are not in the plan: they match. */
    assert_int_equal(fs_profile_match_alloc(&r.p, 4, 64, err, sizeof(err)), FS_OK);
    assert_string_equal(err, "");
    assert_int_equal(fs_profile_match_alloc(NULL, 0, 64, err, sizeof(err)), FS_ERR_INVALID);
}

static void test_match_alloc_size_differs(void **state)
{
    (void)state;
    struct rich r;
    rich_fill(&r);
    char err[512] = "";
    assert_int_equal(fs_profile_match_alloc(&r.p, 1, 2000, err, sizeof(err)), FS_ERR_NOT_FOUND);
    assert_string_equal(err, "allocation 1 is 2000 bytes here, 1000 in the profile");
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_round_trip_rich),
        T(test_round_trip_minimal),
        T(test_round_trip_without_plan_or_names),
        T(test_saved_document_layout),
        T(test_program_not_utf8),
        T(test_save_replaces_and_leaves_no_temp),
        T(test_save_missing_directory),
        T(test_save_failure_keeps_existing_file),
        T(test_save_rename_failure_removes_temp),
        T(test_save_unwritable_directory),
        T(test_save_refuses_inconsistent_profile),
        T(test_load_missing_file),
        T(test_load_directory),
        T(test_load_not_json),
        T(test_load_empty_file),
        T(test_load_truncated_file),
        T(test_load_duplicate_key),
        T(test_load_wrong_version),
        T(test_load_not_a_profile),
        T(test_load_missing_fields),
        T(test_load_wrong_types),
        T(test_load_ref_out_of_range),
        T(test_load_inconsistent_uses),
        T(test_load_unused_allocation_claims_use),
        T(test_load_plan_errors),
        T(test_load_too_large),
        T(test_plan_without_planner),
        T(test_load_tolerates_extra_fields_and_no_plan),
        T(test_load_failure_late_frees_everything),
        T(test_match_device),
        T(test_match_alloc_by_order_and_size),
        T(test_match_alloc_size_differs),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
