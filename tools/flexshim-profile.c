/* flexshim-profile: the command-line companion of libflexshim.so.
 *
 *   config    show or validate the configuration
 *   record    run a command under the shim and save its profile (tools/record.c)
 *   check     validate a profile (one line)
 *   show      a readable summary of a profile and its plan
 *   simulate  plan a profile under budgets with each strategy, through the timeline model, and
 *             (--replay) run each plan on the simulated device (core/replay.c)
 *   trace     the planned iteration as a Chrome trace-event file (Perfetto, chrome://tracing)
 *
 * simulate and trace run the analytic timeline model the strategies share
 * (strategies/timeline.c): they describe the planned iteration, not a run on a GPU.
 *
 * Exit codes: 0 success, 1 the check failed (the messages say why), 2 usage error. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "flexshim.h"
#include "fs.h"
#include "profile.h"
#include "record.h"
#include "executor.h"
#include "replay.h"
#include "strategies/schedule.h"

extern char **environ;

enum { EXIT_OK = 0, EXIT_CHECK_FAILED = 1, EXIT_USAGE = 2 };

struct command {
    const char *name;
    const char *synopsis;
    const char *summary;
    int (*run)(int argc, char **argv);
    void (*help)(FILE *out);
};

/* ---- config ------------------------------------------------------------------------------ */

static void config_help(FILE *out)
{
    fputs("usage: flexshim-profile config --dump | --check | --ini\n"
          "\n"
          "  --dump   every setting, its value and where it came from (default, INI file, env)\n"
          "  --check  validate the INI file and FLEXTENSOR_* variables; exit 1 on any error\n"
          "  --ini    print the documented INI file with every key (conf/flexshim.ini)\n"
          "\n"
          "The INI file is FLEXTENSOR_CONFIG if set (empty: none), else the first of ./flexshim.ini,\n"
          "$XDG_CONFIG_HOME/flexshim/flexshim.ini (~/.config/...), /etc/flexshim/flexshim.ini.\n"
          "FLEXTENSOR_* environment variables override it.\n",
          out);
}

static int config_run(int argc, char **argv)
{
    if (argc != 2) {
        config_help(stderr);
        return EXIT_USAGE;
    }
    const char *mode = argv[1];
    if (!strcmp(mode, "--help") || !strcmp(mode, "-h")) {
        config_help(stdout);
        return EXIT_OK;
    }
    if (!strcmp(mode, "--ini")) {
        fs_config_write_ini(stdout);
        return EXIT_OK;
    }
    if (strcmp(mode, "--dump") && strcmp(mode, "--check")) {
        fprintf(stderr, "flexshim-profile config: unknown option '%s'\n", mode);
        config_help(stderr);
        return EXIT_USAGE;
    }
    struct fs_config cfg;
    struct fs_config_errors errs = {0};
    int rc = fs_config_load(&cfg, environ, &errs);
    for (int i = 0; i < errs.count; i++)
        fprintf(stderr, "flexshim: error: %s\n", errs.msg[i]);
    if (!strcmp(mode, "--dump"))
        fs_config_dump(&cfg, stdout);
    else if (rc == FS_OK)
        printf("configuration OK (%s)\n", cfg.ini_path[0] ? cfg.ini_path : "no INI file");
    return rc == FS_OK ? EXIT_OK : EXIT_CHECK_FAILED;
}

/* ---- shared by the profile commands ------------------------------------------------------ */

#define MIB_D (1024.0 * 1024.0)
#define SIZE_TEXT_MAX 32
#define LABEL_MAX 64

/* "128 MiB", "1.50 GiB", "512 B". */
static const char *size_text(uint64_t b, char *buf)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
    if (b < 1024) {
        snprintf(buf, SIZE_TEXT_MAX, "%" PRIu64 " B", b);
        return buf;
    }
    int u = 0;
    uint64_t m = 1024;
    while (u + 1 < (int)FS_ARRAY_LEN(units) && b / 1024 >= m) {
        m *= 1024;
        u++;
    }
    if (b % m == 0)
        snprintf(buf, SIZE_TEXT_MAX, "%" PRIu64 " %s", b / m, units[u]);
    else
        snprintf(buf, SIZE_TEXT_MAX, "%.2f %s", (double)b / (double)m, units[u]);
    return buf;
}

static double mib(uint64_t b)
{
    return (double)b / MIB_D;
}

static double ms(double us)
{
    return us / 1000.0;
}

/* One error line for command CMD, on stderr. */
static void error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "flexshim-profile %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* A usage error: the line, where to read more, EXIT_USAGE. */
static int usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "flexshim-profile %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(flexshim-profile %s --help describes the arguments)\n", cmd);
    return EXIT_USAGE;
}

/* The command line of a profile command: one FILE and the options the command accepts. */
enum {
    OPT_BUDGET = 1,
    OPT_STRATEGY = 2,
    OPT_OUT = 4,
    OPT_REPLAY = 8,
    OPT_OFFLOAD = 16,
    OPT_SET = 32,
};

struct args {
    const char *file;
    const char *budget;
    const char *strategy;
    const char *out;
    const char *replay;
    const char *offload;
    const char *set;
};

struct opt_def {
    unsigned bit;
    const char *lng, *shrt, *value;
};

static const struct opt_def opt_defs[] = {
    {OPT_BUDGET, "--budget", NULL, "a size such as 8GiB, 512MiB or 60%"},
    {OPT_STRATEGY, "--strategy", NULL, "a strategy name"},
    {OPT_OUT, "--output", "-o", "a file name"},
    {OPT_REPLAY, "--replay", NULL, "a number of iterations, 3 to 1000"},
    {OPT_OFFLOAD, "--offload-mode", NULL, "prefetch, host_read or redirect"},
    {OPT_SET, "--set", NULL, "KEY=VALUE[,KEY=VALUE...], flexshim settings"},
};

static void accepted_options(unsigned allowed, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < FS_ARRAY_LEN(opt_defs); i++)
        if (allowed & opt_defs[i].bit)
            o += (size_t)snprintf(buf + o, len - o, "%s, ",
                                  opt_defs[i].shrt ? opt_defs[i].shrt : opt_defs[i].lng);
    snprintf(buf + o, len - o, "--help");
}

/* Fills A from ARGV[1..]. Returns -1 to go on, else the exit code (after printing HELP for
 * --help, or a usage error). */
static int parse_args(const struct command *c, int argc, char **argv, unsigned allowed,
                      struct args *a)
{
    memset(a, 0, sizeof(*a));
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            c->help(stdout);
            return EXIT_OK;
        }
    }
    bool only_files = false;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!only_files && !strcmp(arg, "--")) {
            only_files = true;
            continue;
        }
        if (only_files || arg[0] != '-' || !arg[1]) {
            if (a->file)
                return usage_error(c->name, "unexpected argument '%s': %s takes one profile FILE",
                                   arg, c->name);
            a->file = arg;
            continue;
        }
        const struct opt_def *d = NULL;
        const char *value = NULL;
        for (size_t k = 0; k < FS_ARRAY_LEN(opt_defs) && !d; k++) {
            const struct opt_def *o = &opt_defs[k];
            size_t n = strlen(o->lng);
            if (!(allowed & o->bit))
                continue;
            if (!strcmp(arg, o->lng) || (o->shrt && !strcmp(arg, o->shrt)))
                d = o;
            else if (!strncmp(arg, o->lng, n) && arg[n] == '=')
                d = o, value = arg + n + 1;
        }
        if (!d) {
            char list[128];
            accepted_options(allowed, list, sizeof(list));
            return usage_error(c->name, "unknown option '%s'; %s accepts %s", arg, c->name, list);
        }
        if (!value) {
            if (i + 1 >= argc)
                return usage_error(c->name, "option %s needs a value (%s)", arg, d->value);
            value = argv[++i];
        }
        const char **slot = d->bit == OPT_BUDGET     ? &a->budget
                            : d->bit == OPT_STRATEGY ? &a->strategy
                            : d->bit == OPT_REPLAY   ? &a->replay
                            : d->bit == OPT_OFFLOAD  ? &a->offload
                            : d->bit == OPT_SET      ? &a->set
                                                     : &a->out;
        if (*slot)
            return usage_error(c->name, "option %s is given twice", d->lng);
        if (!value[0])
            return usage_error(c->name, "option %s needs a value (%s), not an empty string",
                               d->lng, d->value);
        *slot = value;
    }
    if (!a->file)
        return usage_error(c->name,
                           "no profile FILE given (a profile JSON file that flexshim wrote)");
    return -1;
}

/* A budget as given: bytes, or a percentage of the profile's managed bytes. */
struct budget_arg {
    uint64_t bytes;
    double pct; /* > 0: a percentage */
};

/* Parses the comma-separated list TEXT into *OUT (malloc'd, *N entries). -1, or the exit code
 * after a usage error. MULTI: several sizes are allowed. */
static int parse_budgets(const char *cmd, const char *text, bool multi, struct budget_arg **out,
                         int *n)
{
    *out = NULL;
    *n = 0;
    size_t cap = 1;
    for (const char *s = text; *s; s++)
        cap += *s == ',';
    if (cap > 1 && !multi)
        return usage_error(cmd, "--budget '%s': give one size here, not a list", text);
    struct budget_arg *b = calloc(cap, sizeof(*b));
    char *copy = strdup(text);
    if (!b || !copy) {
        free(b);
        free(copy);
        error(cmd, "out of memory");
        return EXIT_CHECK_FAILED;
    }
    int k = 0, rc = -1;
    /* strtok would skip empty items: walk the separators instead. */
    for (char *item = copy;;) {
        char *comma = strchr(item, ',');
        if (comma)
            *comma = '\0';
        if (!item[0]) {
            rc = usage_error(cmd,
                             "--budget '%s' has an empty size; separate sizes with single commas",
                             text);
            break;
        }
        if (fs_parse_size(item, &b[k].bytes, &b[k].pct) != FS_OK) {
            if (strchr(item, '%'))
                rc = usage_error(cmd,
                                 "--budget '%s': a percentage of the managed bytes must be more "
                                 "than 0%% and at most 100%%",
                                 item);
            else
                rc = usage_error(cmd,
                                 "--budget '%s' is not a size; use bytes with an optional unit "
                                 "(B, KiB, MiB, GiB, TiB, KB, MB, GB, TB) such as 8GiB, or a "
                                 "percentage of the managed bytes such as 60%%",
                                 item);
            break;
        }
        k++;
        if (!comma)
            break;
        item = comma + 1;
    }
    free(copy);
    if (rc != -1) {
        free(b);
        return rc;
    }
    *out = b;
    *n = k;
    return -1;
}

/* The bytes the profile manages: the mapped bytes of the allocations some launch uses. */
static uint64_t managed_bytes(const struct fs_profile *p)
{
    uint64_t t = 0;
    for (int a = 0; a < p->nallocs; a++)
        if (p->allocs[a].first_use >= 0)
            t += p->allocs[a].mapped;
    return t;
}

static uint64_t budget_bytes(const struct budget_arg *b, uint64_t managed)
{
    if (b->pct > 0.0)
        return (uint64_t)floor((double)managed * b->pct / 100.0);
    return b->bytes;
}

/* "60% = 126 MiB" or "128 MiB". */
static const char *budget_text(const struct budget_arg *b, uint64_t bytes, char *buf, size_t len)
{
    char s[SIZE_TEXT_MAX];
    if (b->pct > 0.0)
        snprintf(buf, len, "%g%% = %s", b->pct, size_text(bytes, s));
    else
        snprintf(buf, len, "%s", size_text(bytes, s));
    return buf;
}

static void strategy_names(char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; fs_strategies[i] && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? ", " : "", fs_strategies[i]->name);
}

static int load(const char *cmd, const char *file, struct fs_profile *p)
{
    char err[1024];
    if (fs_profile_load(file, p, err, sizeof(err)) != FS_OK) {
        error(cmd, "%s", err);
        return EXIT_CHECK_FAILED;
    }
    return EXIT_OK;
}

static double compute_us(const struct fs_profile *p)
{
    double c = 0.0;
    for (int i = 0; i < p->nlaunches; i++)
        c += p->launches[i].duration_us;
    return c;
}

/* The smallest budget any plan fits: the most bytes of allocations whose use range spans one
 * launch (every window contains its use range). *AT receives that launch (-1: none). */
static uint64_t min_budget(const struct fs_profile *p, int *at)
{
    *at = -1;
    int n = p->nlaunches;
    if (n == 0)
        return 0;
    int64_t *diff = calloc((size_t)n + 1, sizeof(*diff));
    if (!diff)
        return 0;
    for (int a = 0; a < p->nallocs; a++) {
        const struct fs_prof_alloc *al = &p->allocs[a];
        if (al->first_use < 0)
            continue;
        diff[al->first_use] += (int64_t)al->mapped;
        diff[al->last_use + 1] -= (int64_t)al->mapped;
    }
    int64_t held = 0, most = 0;
    for (int i = 0; i < n; i++) {
        held += diff[i];
        if (held > most) {
            most = held;
            *at = i;
        }
    }
    free(diff);
    return (uint64_t)most;
}

/* The limit L of a plan's iteration time in the steady state: max(C, bytes moved / W), C the
 * iteration with everything resident (kernels, and the program's host time where measured), W
 * the host-to-device bandwidth as the timeline model uses it (fitted, else its default). */
static double limit_us(const struct fs_profile *p, uint64_t moved)
{
    double link = fs_bw_h2d_us(&p->bw, moved) - fs_bw_h2d_us(&p->bw, 0);
    double c = fs_profile_resident_us(p);
    return link > c ? link : c;
}

/* Host-to-device bandwidth in GB/s as the model uses it. */
static double h2d_gbps(const struct fs_profile *p)
{
    double us = fs_bw_h2d_us(&p->bw, 1000000000ull) - fs_bw_h2d_us(&p->bw, 0);
    return us > 0.0 ? 1e6 / us : 0.0;
}

static bool has_plan(const struct fs_profile *p)
{
    return p->plan.strategy[0] || p->plan.entries;
}

static int plan_copy(struct fs_plan *dst, const struct fs_plan *src, int nallocs)
{
    *dst = *src;
    dst->entries = NULL;
    dst->nallocs = nallocs;
    if (nallocs > 0) {
        dst->entries = malloc((size_t)nallocs * sizeof(*dst->entries));
        if (!dst->entries)
            return FS_ERR_NOMEM;
        memcpy(dst->entries, src->entries, (size_t)nallocs * sizeof(*dst->entries));
    }
    return FS_OK;
}

/* Checks the saved plan against the profile and evaluates a copy of it with the timeline model
 * into EVAL (SINK as fs_plan_evaluate_trace). On failure WHY holds one line and EVAL is empty. */
static int eval_saved_plan(const struct fs_profile *p, struct fs_plan *eval, fs_tl_sink sink,
                           void *arg, char *why, size_t len)
{
    memset(eval, 0, sizeof(*eval));
    const struct fs_plan *plan = &p->plan;
    for (int a = 0; a < p->nallocs; a++) {
        const struct fs_plan_entry *e = &plan->entries[a];
        const struct fs_prof_alloc *al = &p->allocs[a];
        if (e->resident)
            continue;
        if (al->first_use < 0) {
            if (e->prefetch_at != -1 || e->evict_after != -1) {
                snprintf(why, len,
                         "plan.entries[%d]: allocation %d is used by no launch, so its prefetch_at "
                         "and evict_after must be -1",
                         a, a);
                return FS_ERR_INVALID;
            }
            continue;
        }
        int pf = e->prefetch_at, ev = e->evict_after;
        if (pf == -1 && ev == -1)
            continue; /* read in place */
        if (!fs_window_covers(pf, ev, al->first_use, al->last_use)) {
            snprintf(why, len,
                     "plan.entries[%d]: the window from launch %d (prefetch_at) to launch %d "
                     "(evict_after) does not contain the allocation's uses, launches %d to %d",
                     a, pf, ev, al->first_use, al->last_use);
            return FS_ERR_INVALID;
        }
    }
    if (plan_copy(eval, plan, p->nallocs) != FS_OK) {
        snprintf(why, len, "out of memory");
        return FS_ERR_NOMEM;
    }
    int rc = fs_plan_evaluate_trace(p, eval, sink, arg);
    if (rc != FS_OK) {
        char a[SIZE_TEXT_MAX], b[SIZE_TEXT_MAX];
        if (rc == FS_ERR_INVALID && eval->peak_bytes > eval->budget)
            snprintf(why, len, "the plan holds %s on the device at its peak, more than its budget "
                     "of %s", size_text(eval->peak_bytes, a), size_text(eval->budget, b));
        else
            snprintf(why, len, "the timeline model rejects the plan (%s)", fs_err_str(rc));
        fs_plan_free(eval);
        return rc;
    }
    return FS_OK;
}

/* The saved prediction differs from this model's (the plan came from another version)? */
static bool prediction_differs(const struct fs_plan *saved, const struct fs_plan *eval)
{
    double d = fabs(saved->predicted_us - eval->predicted_us);
    return d > 0.001 + 1e-6 * fabs(eval->predicted_us) || saved->peak_bytes != eval->peak_bytes;
}

static void note_prediction(const char *file, const struct fs_plan *saved,
                            const struct fs_plan *eval)
{
    if (prediction_differs(saved, eval))
        fprintf(stderr,
                "%s: note: the saved plan predicts %.3f ms (peak %.1f MiB); this flexshim's "
                "timeline model predicts %.3f ms (peak %.1f MiB) for it\n",
                file, ms(saved->predicted_us), mib(saved->peak_bytes), ms(eval->predicted_us),
                mib(eval->peak_bytes));
    if (strcmp(saved->planner, fs_planner_id()) != 0)
        fprintf(stderr,
                "%s: note: the saved plan was made by other planning code (%s; this flexshim's "
                "is %s): a run plans it again\n",
                file, saved->planner[0] ? saved->planner : "unnamed", fs_planner_id());
}

/* A launch's kernel as shown: its name, else its hash ("copy/memset" for hash 0). */
static const char *kernel_label(const struct fs_profile *p, int i, char *buf, size_t len)
{
    if (p->kernel_names && p->kernel_names[i])
        return p->kernel_names[i];
    if (p->launches[i].kernel == 0)
        snprintf(buf, len, "copy/memset");
    else
        snprintf(buf, len, "0x%016" PRIx64, p->launches[i].kernel);
    return buf;
}

/* Progress of long work on stderr: one rewritten line on a terminal, else a line per step. */
static void progress(const char *cmd, int done, int total, const char *what)
{
    if (isatty(STDERR_FILENO)) {
        fprintf(stderr, "\r%s: [%d/%d] %s\033[K", cmd, done, total, what);
        if (done == total)
            fputc('\n', stderr);
    } else {
        fprintf(stderr, "%s: [%d/%d] %s\n", cmd, done, total, what);
    }
    fflush(stderr);
}

/* The commands, in the order the usage lists them. */
static void check_help(FILE *out);
static int check_run(int argc, char **argv);
static int show_run(int argc, char **argv);
static int simulate_run(int argc, char **argv);
static int trace_run(int argc, char **argv);
static void show_help(FILE *out);
static void simulate_help(FILE *out);
static void trace_help(FILE *out);

static const struct command commands[] = {
    {"record", "[-o FILE] -- COMMAND...", "run a command under the shim and save its profile",
     fs_tool_record, fs_tool_record_help},
    {"check", "FILE", "validate a profile; one line", check_run, check_help},
    {"show", "FILE", "a readable summary of a profile and its plan", show_run, show_help},
    {"simulate", "FILE --budget SIZE[,SIZE...] [--strategy NAME|all]",
     "plan under budgets with each strategy (timeline model)", simulate_run, simulate_help},
    {"trace", "FILE -o OUT.json [--budget SIZE] [--strategy NAME] [--replay N ...]",
     "the planned iteration as a Chrome/Perfetto trace", trace_run, trace_help},
    {"config", "--dump | --check | --ini", "show or validate the configuration", config_run,
     config_help},
};

static const struct command *command_named(const char *name)
{
    for (size_t i = 0; i < FS_ARRAY_LEN(commands); i++)
        if (!strcmp(commands[i].name, name))
            return &commands[i];
    return NULL;
}

/* ---- check ------------------------------------------------------------------------------- */

static void check_help(FILE *out)
{
    fputs("usage: flexshim-profile check FILE\n"
          "\n"
          "Loads the profile FILE, validates every field (schema version, allocations, launches\n"
          "and their references, bandwidth, the saved plan's windows and budget) and prints one\n"
          "line:\n"
          "  FILE: profile OK: N allocations (X MiB), N launches per iteration, plan: STRATEGY at\n"
          "  budget SIZE (predicted MS ms, stall MS ms)            (or: no plan)\n"
          "On a problem it prints one line saying what is wrong and exits 1.\n"
          "A note on stderr says when the saved prediction differs from this version's model, and\n"
          "when other planning code made the plan (a run then plans it again).\n",
          out);
}

static int check_run(int argc, char **argv)
{
    const struct command *c = command_named("check");
    struct args a;
    int rc = parse_args(c, argc, argv, 0, &a);
    if (rc >= 0)
        return rc;
    struct fs_profile p;
    if ((rc = load(c->name, a.file, &p)) != EXIT_OK)
        return rc;
    char line[512], sz[SIZE_TEXT_MAX], why[512];
    snprintf(line, sizeof(line), "%d allocations (%.1f MiB), %d launches per iteration",
             p.nallocs, mib(fs_profile_total_mapped(&p)), p.nlaunches);
    if (!has_plan(&p)) {
        printf("%s: profile OK: %s, no plan\n", a.file, line);
        fs_profile_free(&p);
        return EXIT_OK;
    }
    struct fs_plan eval;
    if (eval_saved_plan(&p, &eval, NULL, NULL, why, sizeof(why)) != FS_OK) {
        error(c->name, "profile %s: %s; plan it again", a.file, why);
        fs_profile_free(&p);
        return EXIT_CHECK_FAILED;
    }
    printf("%s: profile OK: %s, plan: %s at budget %s (predicted %.3f ms, stall %.3f ms)\n",
           a.file, line, p.plan.strategy, size_text(p.plan.budget, sz), ms(p.plan.predicted_us),
           ms(p.plan.predicted_stall_us));
    note_prediction(a.file, &p.plan, &eval);
    fs_plan_free(&eval);
    fs_profile_free(&p);
    return EXIT_OK;
}

/* ---- show -------------------------------------------------------------------------------- */

static void show_help(FILE *out)
{
    fputs("usage: flexshim-profile show FILE\n"
          "\n"
          "A readable summary of the profile FILE: the device and the program; the iteration\n"
          "(launches, compute time, allocations); the allocations grouped by size (count and\n"
          "total MiB per size range); under the saved plan, the bytes kept resident and those\n"
          "offloaded, the peak and the predicted step time and stall; the 10 kernels with the\n"
          "most total time per iteration (name if the profile has it, else the hash; launches,\n"
          "total ms, share of compute). Exit 1 if the profile does not load.\n",
          out);
}

struct kernel_sum {
    uint64_t hash;
    int first;  /* first launch: its name labels the group */
    int count;
    double us;
};

static int ksum_by_hash(const void *x, const void *y)
{
    const struct kernel_sum *a = x, *b = y;
    if (a->hash != b->hash)
        return a->hash < b->hash ? -1 : 1;
    return (a->first > b->first) - (a->first < b->first);
}

static int ksum_by_time(const void *x, const void *y)
{
    const struct kernel_sum *a = x, *b = y;
    if (a->us != b->us)
        return a->us > b->us ? -1 : 1;
    if (a->count != b->count)
        return a->count > b->count ? -1 : 1;
    return (a->first > b->first) - (a->first < b->first);
}

static void show_sizes(const struct fs_profile *p)
{
    /* < 1 MiB, then ranges growing 4x from 1 MiB; the last is open. */
    enum { NB = 12 };
    int count[NB] = {0};
    uint64_t bytes[NB] = {0};
    for (int a = 0; a < p->nallocs; a++) {
        uint64_t s = p->allocs[a].size;
        int b = 0;
        for (uint64_t lo = FS_MIB; b < NB - 1 && s >= lo; lo *= 4)
            b++;
        count[b]++;
        bytes[b] += s;
    }
    printf("\nallocations by size (as requested)\n");
    printf("  %-22s %7s %12s\n", "size", "count", "total MiB");
    uint64_t lo = 0, hi = FS_MIB;
    for (int b = 0; b < NB; b++, lo = hi, hi *= 4) {
        if (!count[b])
            continue;
        char range[64], l[SIZE_TEXT_MAX], h[SIZE_TEXT_MAX];
        if (b == 0)
            snprintf(range, sizeof(range), "< %s", size_text(hi, h));
        else if (b == NB - 1)
            snprintf(range, sizeof(range), ">= %s", size_text(lo, l));
        else
            snprintf(range, sizeof(range), "%s - %s", size_text(lo, l), size_text(hi, h));
        printf("  %-22s %7d %12.1f\n", range, count[b], mib(bytes[b]));
    }
}

static int show_kernels(const struct fs_profile *p, double compute)
{
    if (p->nlaunches == 0)
        return FS_OK;
    struct kernel_sum *k = calloc((size_t)p->nlaunches, sizeof(*k));
    if (!k)
        return FS_ERR_NOMEM;
    for (int i = 0; i < p->nlaunches; i++)
        k[i] = (struct kernel_sum){p->launches[i].kernel, i, 1, p->launches[i].duration_us};
    qsort(k, (size_t)p->nlaunches, sizeof(*k), ksum_by_hash);
    int n = 0;
    for (int i = 0; i < p->nlaunches; i++) {
        if (n > 0 && k[n - 1].hash == k[i].hash) {
            k[n - 1].count++;
            k[n - 1].us += k[i].us;
        } else {
            k[n++] = k[i];
        }
    }
    qsort(k, (size_t)n, sizeof(*k), ksum_by_time);
    int top = n < 10 ? n : 10;
    printf("\ntop %d kernels by time per iteration (of %d distinct)\n", top, n);
    printf("  %-48s %8s %10s %7s\n", "kernel", "launches", "total ms", "share");
    for (int i = 0; i < top; i++) {
        char buf[LABEL_MAX];
        const char *name = kernel_label(p, k[i].first, buf, sizeof(buf));
        size_t len = strlen(name);
        printf("  %-48.*s%s %8d %10.3f %6.1f%%\n", len > 48 ? 45 : 48, name,
               len > 48 ? "..." : "", k[i].count, ms(k[i].us),
               compute > 0.0 ? 100.0 * k[i].us / compute : 0.0);
    }
    free(k);
    return FS_OK;
}

static int show_run(int argc, char **argv)
{
    const struct command *c = command_named("show");
    struct args a;
    int rc = parse_args(c, argc, argv, 0, &a);
    if (rc >= 0)
        return rc;
    struct fs_profile p;
    if ((rc = load(c->name, a.file, &p)) != EXIT_OK)
        return rc;
    char s1[SIZE_TEXT_MAX], s2[SIZE_TEXT_MAX], why[512];
    double compute = compute_us(&p);
    printf("profile   %s (schema %d)\n", a.file, p.version);
    char driver[32] = "driver version not recorded";
    if (p.driver_version > 0)
        snprintf(driver, sizeof(driver), "CUDA driver %d.%d", p.driver_version / 1000,
                 p.driver_version % 1000 / 10);
    printf("device    %s (compute capability %d.%d, %s, %s)\n", p.device_name, p.cc_major,
           p.cc_minor, size_text(p.device_total, s1), driver);
    printf("program   %s\n", p.program[0] ? p.program : "(not recorded)");
    if (p.bw.h2d_bytes_per_us > 0.0)
        printf("link      host to device %.1f GB/s + %.1f us, device to host %.1f GB/s + %.1f us "
               "per copy (%d measured points)\n",
               p.bw.h2d_bytes_per_us / 1000.0, p.bw.h2d_latency_us,
               p.bw.d2h_bytes_per_us / 1000.0, p.bw.d2h_latency_us, p.bw.npoints);
    else
        printf("link      not measured: the model assumes %.1f GB/s\n", h2d_gbps(&p));
    printf("iteration %d launches, %.3f ms of compute; %d allocations, %.1f MiB on the device "
           "(%.1f MiB used by launches)\n",
           p.nlaunches, ms(compute), p.nallocs, mib(fs_profile_total_mapped(&p)), mib(managed_bytes(&p)));
    double host = 0;
    for (int i = 0; i < p.nlaunches; i++)
        host += p.launches[i].host_us;
    if (host > 0)
        printf("host      %.3f ms per iteration in the program between its launches (its own "
               "time, flexshim's left out)\n", ms(host));
    int same = 0;
    for (int i = 0; i < p.nallocs; i++)
        same += p.allocs[i].unchanged;
    printf("unchanged %d of %d allocations known to be left as they were by the iteration "
           "(evicting them needs no write-back; none when profiling took no fingerprints)\n",
           same, p.nallocs);
    if (p.bw.read_bytes_per_us > 0.0)
        printf("reads     a kernel reads at most %.1f GB/s of its allocations (%.0f x the device's "
               "copy rate): the bound for reading in place\n",
               p.bw.read_bytes_per_us / 1000.0, FS_READ_BOUND_COPIES);
    if (p.bw.handover_us > 0.0)
        printf("hand-over %.0f us from an unchanged allocation's last launch to a copy into its "
               "room\n", p.bw.handover_us);
    show_sizes(&p);

    rc = EXIT_OK;
    if (!has_plan(&p)) {
        printf("\nplan      none saved (flexshim-profile simulate FILE --budget SIZE plans one)\n");
    } else {
        struct fs_plan eval;
        if (eval_saved_plan(&p, &eval, NULL, NULL, why, sizeof(why)) != FS_OK) {
            error(c->name, "profile %s: %s; plan it again", a.file, why);
            rc = EXIT_CHECK_FAILED;
        } else {
            int nres = 0, noff = 0, nin = 0;
            uint64_t res = 0, off = 0, in = 0;
            for (int i = 0; i < p.nallocs; i++) {
                if (p.plan.entries[i].resident) {
                    nres++;
                    res += p.allocs[i].mapped;
                } else {
                    noff++;
                    off += p.allocs[i].mapped;
                    if (fs_reads_in_place(&p, &p.plan, i)) {
                        nin++;
                        in += p.allocs[i].mapped;
                    }
                }
            }
            printf("\nplan      %s at budget %s, peak %s\n", p.plan.strategy,
                   size_text(p.plan.budget, s1), size_text(p.plan.peak_bytes, s2));
            printf("  resident   %6d allocations %12.1f MiB\n", nres, mib(res));
            printf("  offloaded  %6d allocations %12.1f MiB (%.1f MiB moved per iteration)\n",
                   noff, mib(off), mib(fs_plan_moved_bytes(&p, &p.plan)));
            if (nin > 0)
                printf("  of them    %6d allocations %12.1f MiB read in place (their launches "
                       "read them in host memory)\n", nin, mib(in));
            printf("  predicted step %.3f ms: compute %.3f ms + stall %.3f ms\n",
                   ms(p.plan.predicted_us), ms(compute), ms(p.plan.predicted_stall_us));
            note_prediction(a.file, &p.plan, &eval);
            fs_plan_free(&eval);
        }
    }
    if (show_kernels(&p, compute) != FS_OK) {
        error(c->name, "out of memory");
        rc = EXIT_CHECK_FAILED;
    }
    fs_profile_free(&p);
    return rc;
}

/* ---- simulate ---------------------------------------------------------------------------- */

static void simulate_help(FILE *out)
{
    fputs("usage: flexshim-profile simulate FILE --budget SIZE[,SIZE...] [--strategy NAME|all]\n"
          "                         [--replay N [--offload-mode prefetch|host_read|redirect]\n"
          "                         [--set KEY=VALUE[,KEY=VALUE...]]]\n"
          "\n"
          "Plans the profile FILE for each budget with each strategy and evaluates every plan with\n"
          "the timeline model the strategies share. This is an analytic model of the planned\n"
          "iteration (launches in queue order, prefetches on the host-to-device link, write-backs\n"
          "on the device-to-host link), not a run on a GPU.\n"
          "With --replay N each plan also runs N iterations on the simulated device: flexshim's own\n"
          "engine (residency, plan executor and its mover thread) against the profile's launches,\n"
          "with the profile's kernel times and link and the remap costs measured on the GPU, and a\n"
          "synchronize after each iteration.\n"
          "\n"
          "  --budget SIZE[,SIZE...]  device bytes a plan may use, several separated by commas:\n"
          "                           bytes with an optional unit (B, KiB, MiB, GiB, TiB; KB, MB,\n"
          "                           GB, TB are powers of 1000) such as 8GiB, or a percentage\n"
          "                           such as 60%: percent of the profile's managed bytes, the sum\n"
          "                           of the mapped bytes of the allocations some launch uses\n"
          "                           (the shim at GPU_MEMORY_LIMIT=X plans for X less\n"
          "                           PLAN_HEADROOM, see 'config --dump'; the replay plans for\n"
          "                           all of SIZE unless --set says otherwise)\n"
          "  --strategy NAME|all      adaptive, knapsack, greedy, global, or all (the default: all\n"
          "                           four, in that order)\n"
          "  --replay N               also replay each plan for N iterations (3 to 1000; the first\n"
          "                           two are warm-up) and add the column replay ms\n"
          "  --offload-mode MODE      the replay's FLEXTENSOR_OFFLOAD_MODE: prefetch (the default),\n"
          "                           host_read (offloaded allocations read in place by their\n"
          "                           kernels at about 36 GB/s, as measured on the H200) or\n"
          "                           redirect (device copies, no remaps); the timeline model's\n"
          "                           columns stay those of the prefetch plan\n"
          "  --set KEY=VALUE,...      other settings of the replayed engine, by name without the\n"
          "                           FLEXTENSOR_ prefix (e.g. PLAN_HEADROOM=64MiB; see\n"
          "                           'flexshim-profile config --dump'); not TRACE_OUT or\n"
          "                           TIMING_REPORT: a replay writes neither\n"
          "\n"
          "One row per budget and strategy:\n"
          "  predicted ms   the step time of one iteration under the plan\n"
          "  stall ms       of which compute waits for prefetches\n"
          "  offloaded MiB  B: bytes of the offloaded allocations launches use that the plan\n"
          "                 moves every iteration (those it reads in place are not counted:\n"
          "                 their launches read what they need in host memory)\n"
          "  peak MiB       the most device bytes the plan holds at any launch\n"
          "  limit ms       L = max(C, B/W): C the iteration with everything resident (the kernel\n"
          "                 durations, and the program's host time between launches where the\n"
          "                 profile measured it), W the host-to-device\n"
          "                 bandwidth; no iteration of that plan runs faster in the steady state\n"
          "  infeasible     the allocations in use across some launch exceed the budget (the\n"
          "                 header names the smallest feasible budget)\n"
          "  replay ms      (--replay) the median iteration time on the simulated device, or - and\n"
          "                 the reason on stderr\n"
          "Progress goes to stderr when there are more than 4 rows. Exit 1 if the profile does not\n"
          "load.\n",
          out);
}

#define FS_MAX_STRATEGIES 16 /* more than fs_strategies[] holds */

struct sim_row {
    char budget[64];
    char strategy[32];
    int rc;
    double predicted_us, stall_us, limit_us, replay_us;
    double late, unplanned, faults, ordered, hook_ms, blocks; /* per replayed iteration */
    uint64_t moved, peak;
};

/* Resolves --strategy (NULL: all) into LIST (NULL-terminated); -1 or the exit code. */
static int pick_strategies(const char *cmd, const char *name, bool allow_all,
                           const struct fs_strategy **list)
{
    int n = 0;
    if (!name || (allow_all && !strcmp(name, "all"))) {
        for (int i = 0; fs_strategies[i]; i++)
            list[n++] = fs_strategies[i];
    } else if ((list[0] = fs_strategy_find(name))) {
        n = 1;
    } else {
        char names[128];
        strategy_names(names, sizeof(names));
        return usage_error(cmd, "--strategy '%s' is not a strategy; use one of %s%s", name, names,
                           allow_all ? " or all" : "");
    }
    list[n] = NULL;
    return -1;
}

/* --set KEY=VALUE,...: each a flexshim setting with a valid value, at most FS_REPLAY_SETTINGS,
 * as much text as the replay takes; -1, or the exit code after a message. */
static int check_settings(const char *cmd, const char *text)
{
    char buf[FS_REPLAY_SETTINGS_TEXT];
    if (snprintf(buf, sizeof(buf), "%s", text) >= (int)sizeof(buf))
        return usage_error(cmd, "--set: too long (at most %zu characters)", sizeof(buf) - 1);
    int n = 0;
    char *save = NULL;
    for (char *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save), n++) {
        char *eq = strchr(kv, '=');
        if (!eq || eq == kv)
            return usage_error(cmd, "--set '%s' is not KEY=VALUE (e.g. PLAN_HEADROOM=64MiB)", kv);
        *eq = '\0';
        int id = fs_param_find(kv);
        if (id < 0)
            return usage_error(cmd, "--set: %s is not a flexshim setting; run 'flexshim-profile "
                                    "config --dump' for the list", kv);
        /* Written when a program's engine shuts down at exit; a replay's engine is torn down
         * instead, so they would be silently left out. */
        if (id == FS_P_TRACE_OUT || id == FS_P_TIMING_REPORT)
            return usage_error(cmd, "--set %s: a replay writes no run trace or timing report; "
                                    "'flexshim-profile trace FILE -o OUT.json --replay N' draws "
                                    "the replayed iteration", kv);
        struct fs_value v;
        char why[256];
        if (fs_config_parse((enum fs_param_id)id, eq + 1, &v, why, sizeof(why)) != FS_OK)
            return usage_error(cmd, "--set %s=%s: %s", kv, eq + 1, why);
    }
    if (n > FS_REPLAY_SETTINGS)
        return usage_error(cmd, "--set: at most %d settings", FS_REPLAY_SETTINGS);
    return -1;
}

/* The replay's options of A: --replay N sets *ITERS (3 to 1000; 0 without it), and
 * --offload-mode and --set, which only a replay takes (the timeline model plans prefetches only
 * and knows no settings), are checked. -1, or the exit code after a message. */
static int parse_replay_opts(const char *cmd, const struct args *a, int *iters)
{
    *iters = 0;
    if (a->replay) {
        char *end;
        errno = 0;
        long v = strtol(a->replay, &end, 10);
        if (errno || end == a->replay || *end || v < 3 || v > 1000)
            return usage_error(cmd, "--replay '%s' is not a number of iterations from 3 to 1000",
                               a->replay);
        *iters = (int)v;
    }
    struct fs_value mode;
    char why[256];
    if (a->offload &&
        fs_config_parse(FS_P_OFFLOAD_MODE, a->offload, &mode, why, sizeof(why)) != FS_OK)
        return usage_error(cmd, "--offload-mode '%s': %s", a->offload, why);
    if (a->offload && mode.u != FS_OFFLOAD_PREFETCH && !a->replay)
        return usage_error(cmd, "--offload-mode %s needs --replay N: the timeline model plans "
                                "prefetches only, the replay runs the other modes",
                           a->offload);
    if (a->set && !a->replay)
        return usage_error(cmd, "--set needs --replay N: the settings are the replayed engine's");
    return a->set ? check_settings(cmd, a->set) : -1;
}

/* The plan of STRATEGY for BYTES replayed on the simulated device: R's median iteration time
 * (0: failed, said why on stderr) and what its launches waited for. */
static void replay_row(const char *cmd, const struct fs_profile *p, uint64_t bytes,
                       const char *strategy, int iterations, const char *offload_mode,
                       const char *settings, struct sim_row *r)
{
    struct fs_replay_config rc = {.budget = bytes, .strategy = strategy, .iterations = iterations,
                                  .offload_mode = offload_mode, .settings = settings};
    struct fs_replay_result res;
    char err[512] = "";
    r->replay_us = 0;
    if (fs_replay(p, &rc, &res, err, sizeof(err)) != FS_OK) {
        error(cmd, "replay of %s at %s: %s", strategy, r->budget, err);
        return;
    }
    r->replay_us = res.step_us;
    r->late = (double)res.timed_late / res.timed;
    r->unplanned = (double)res.timed_unplanned / res.timed;
    r->faults = (double)res.timed_faults / res.timed;
    r->ordered = (double)res.timed_ordered / res.timed;
    r->hook_ms = res.timed_hook_us / 1000 / res.timed;
    r->blocks = (double)res.timed_blocks / res.timed;
}

static int simulate_run(int argc, char **argv)
{
    const struct command *c = command_named("simulate");
    struct args a;
    int rc = parse_args(c, argc, argv,
                        OPT_BUDGET | OPT_STRATEGY | OPT_REPLAY | OPT_OFFLOAD | OPT_SET, &a);
    if (rc >= 0)
        return rc;
    if (!a.budget)
        return usage_error(c->name, "--budget is required: one or more sizes such as 8GiB or 60%%, "
                                    "separated by commas");
    int replay_iters;
    if ((rc = parse_replay_opts(c->name, &a, &replay_iters)) >= 0)
        return rc;
    const struct fs_strategy *strat[FS_MAX_STRATEGIES + 1];
    if ((rc = pick_strategies(c->name, a.strategy, true, strat)) >= 0)
        return rc;
    struct budget_arg *budgets = NULL;
    int nb = 0;
    if ((rc = parse_budgets(c->name, a.budget, true, &budgets, &nb)) >= 0)
        return rc;
    struct fs_profile p;
    if ((rc = load(c->name, a.file, &p)) != EXIT_OK) {
        free(budgets);
        return rc;
    }
    int ns = 0;
    while (strat[ns])
        ns++;
    int nrows = nb * ns;
    struct sim_row *rows = calloc((size_t)nrows, sizeof(*rows));
    if (!rows) {
        error(c->name, "out of memory");
        free(budgets);
        fs_profile_free(&p);
        return EXIT_CHECK_FAILED;
    }
    uint64_t managed = managed_bytes(&p);
    double compute = compute_us(&p);
    int at = -1;
    uint64_t need = min_budget(&p, &at);
    rc = EXIT_OK;
    for (int b = 0; b < nb && rc == EXIT_OK; b++) {
        uint64_t bytes = budget_bytes(&budgets[b], managed);
        for (int s = 0; s < ns; s++) {
            struct sim_row *r = &rows[b * ns + s];
            budget_text(&budgets[b], bytes, r->budget, sizeof(r->budget));
            if (nrows > 4) {
                char what[128];
                snprintf(what, sizeof(what), "%s at %s", strat[s]->name, r->budget);
                progress(c->name, b * ns + s + 1, nrows, what);
            }
            struct fs_plan plan;
            r->rc = strat[s]->plan(&p, bytes, &plan);
            snprintf(r->strategy, sizeof(r->strategy), "%s",
                     r->rc == FS_OK ? plan.strategy : strat[s]->name);
            if (r->rc == FS_OK) {
                r->predicted_us = plan.predicted_us;
                r->stall_us = plan.predicted_stall_us;
                r->peak = plan.peak_bytes;
                r->moved = fs_plan_moved_bytes(&p, &plan);
                r->limit_us = limit_us(&p, r->moved);
                fs_plan_free(&plan);
                if (replay_iters)
                    replay_row(c->name, &p, bytes, strat[s]->name, replay_iters, a.offload,
                               a.set, r);
            } else if (r->rc != FS_ERR_NOMEM) {
                error(c->name, "profile %s: strategy %s failed at budget %s (%s)", a.file,
                      strat[s]->name, r->budget, fs_err_str(r->rc));
                rc = EXIT_CHECK_FAILED;
                break;
            }
        }
    }
    if (rc == EXIT_OK) {
        char sz[SIZE_TEXT_MAX];
        printf("simulate %s: timeline model of the planned iteration, not a GPU run\n", a.file);
        double resident = fs_profile_resident_us(&p);
        char with_host[96] = "";
        if (resident > compute)
            snprintf(with_host, sizeof(with_host), " (kernels %.3f ms, waiting for the program's "
                     "host time)", ms(compute));
        printf("  %d launches, compute C = %.3f ms%s; managed %.1f MiB (percentages are of this); "
               "host to device W = %.1f GB/s\n",
               p.nlaunches, ms(resident), with_host, mib(managed), h2d_gbps(&p));
        if (at >= 0)
            printf("  smallest feasible budget: %s (the allocations in use across launch %d)\n",
                   size_text(need, sz), at);
        printf("\n%-22s %-20s %12s %10s %14s %10s %10s%s\n", "budget", "strategy",
               "predicted ms", "stall ms", "offloaded MiB", "peak MiB", "limit ms",
               replay_iters ? "  replay ms" : "");
        for (int i = 0; i < nrows; i++) {
            const struct sim_row *r = &rows[i];
            char replay[32] = "";
            if (replay_iters && r->replay_us > 0)
                snprintf(replay, sizeof(replay), " %10.3f", ms(r->replay_us));
            else if (replay_iters)
                snprintf(replay, sizeof(replay), " %10s", "-");
            if (r->rc == FS_OK)
                printf("%-22s %-20s %12.3f %10.3f %14.1f %10.1f %10.3f%s\n", r->budget,
                       r->strategy, ms(r->predicted_us), ms(r->stall_us), mib(r->moved),
                       mib(r->peak), ms(r->limit_us), replay);
            else
                printf("%-22s %-20s %12s %10s %14s %10s %10s%s\n", r->budget, r->strategy,
                       "infeasible", "-", "-", "-", "-", replay);
        }
        if (replay_iters)
            printf("\nreplay, per timed iteration (warm-up left out): launches that waited for a "
                   "late prefetch, references to allocations the plan had on host, fault-ins, "
                   "references ordered after a prefetch's copy on the launch's stream (no wait), "
                   "time the program's thread spent in the launch hook (those waits and "
                   "fault-ins), device blocks made (on a GPU each is driver work on the mover's "
                   "path, 0.1-0.8 ms on the H200; the simulated device hardly charges it)\n");
        for (int i = 0; i < nrows && replay_iters; i++)
            if (rows[i].rc == FS_OK && rows[i].replay_us > 0)
                printf("%-22s %-20s %8.1f late %8.1f unplanned %8.1f fault-ins %8.1f ordered "
                       "%8.3f ms in the hook %8.1f device blocks made\n", rows[i].budget,
                       rows[i].strategy, rows[i].late, rows[i].unplanned, rows[i].faults,
                       rows[i].ordered, rows[i].hook_ms, rows[i].blocks);
    }
    free(rows);
    free(budgets);
    fs_profile_free(&p);
    return rc;
}

/* ---- trace ------------------------------------------------------------------------------- */

static void trace_help(FILE *out)
{
    fputs("usage: flexshim-profile trace FILE -o OUT.json [--budget SIZE] [--strategy NAME]\n"
          "                              [--replay N [--offload-mode MODE] [--set KEY=VALUE,...]]\n"
          "\n"
          "Writes the planned iteration of the profile FILE as Chrome trace-event JSON, which\n"
          "Perfetto (ui.perfetto.dev) and chrome://tracing open: process \"flexshim plan\" with\n"
          "three lanes,\n"
          "  compute         one event per launch, named by its kernel (name, else hash); args:\n"
          "                  launch index, stream, referenced allocations, wait for a prefetch\n"
          "  host to device  the prefetches, \"prefetch alloc N (X MiB)\"\n"
          "  device to host  the write-backs of evicted allocations\n"
          "The times come from the timeline model the strategies share: a model of the planned\n"
          "iteration, not a GPU run. Time 0 is the start of the iteration the model measures (the\n"
          "steady state); a transfer that runs past its end overlaps the next iteration.\n"
          "\n"
          "  -o, --output OUT.json  where to write it (a temporary file, then renamed)\n"
          "  --budget SIZE          plan again for this budget: bytes with a unit such as 8GiB, or a\n"
          "                         percentage of the managed bytes (the mapped bytes of the\n"
          "                         allocations some launch uses) such as 60%\n"
          "  --strategy NAME        plan again with adaptive, knapsack, greedy or global\n"
          "  --replay N             draw the plan as flexshim's engine runs it on the simulated\n"
          "                         device instead (as simulate --replay N: the last of N\n"
          "                         iterations, 3 to 1000): process \"flexshim plan, replayed\",\n"
          "                         its kernels, its copies in (prefetches, fault-ins) and out\n"
          "                         (write-backs), and a fourth lane, the program's thread held in\n"
          "                         the launch hook (waiting for a late prefetch, faulting in)\n"
          "  --offload-mode MODE    the replay's OFFLOAD_MODE, as for simulate\n"
          "  --set KEY=VALUE,...    other settings of the replayed engine, as for simulate\n"
          "Without either the saved plan is drawn; --budget alone keeps the saved plan's strategy\n"
          "(adaptive if there is none), --strategy alone the saved plan's budget.\n",
          out);
}

enum { TID_COMPUTE = 1, TID_H2D = 2, TID_D2H = 3, TID_WAIT = 4 };

struct trace_ctx {
    const struct fs_profile *p;
    json_t *events;
    int count[4]; /* by enum fs_tl_lane */
    bool failed;
};

static void add_event(struct trace_ctx *t, json_t *e)
{
    if (!e || json_array_append_new(t->events, e) != 0)
        t->failed = true;
}

static void trace_sink(const struct fs_tl_event *ev, void *arg)
{
    struct trace_ctx *t = arg;
    const struct fs_profile *p = t->p;
    double dur = ev->end_us - ev->start_us;
    if (t->failed)
        return;
    t->count[ev->lane]++;
    if (ev->lane == FS_TL_COMPUTE) {
        const struct fs_prof_launch *l = &p->launches[ev->launch];
        char buf[LABEL_MAX], hash[24];
        json_t *refs = json_array();
        for (int r = 0; refs && r < l->nrefs; r++)
            if (json_array_append_new(refs, json_integer(p->refs[l->ref_start + r])) != 0)
                t->failed = true;
        snprintf(hash, sizeof(hash), "0x%016" PRIx64, l->kernel);
        json_t *args = json_pack("{s:i, s:s, s:I, s:o}", "launch", ev->launch, "kernel", hash,
                                 "stream", (json_int_t)l->stream, "refs", refs);
        if (args && ev->alloc >= 0 && ev->wait_us > 0.0) {
            if (json_object_set_new(args, "waited_for_alloc", json_integer(ev->alloc)) != 0 ||
                json_object_set_new(args, "wait_us", json_real(ev->wait_us)) != 0)
                t->failed = true;
        }
        add_event(t, json_pack("{s:s, s:s, s:s, s:i, s:i, s:f, s:f, s:o}", "name",
                               kernel_label(p, ev->launch, buf, sizeof(buf)), "cat", "launch",
                               "ph", "X", "pid", 1, "tid", TID_COMPUTE, "ts", ev->start_us, "dur",
                               dur, "args", args));
        return;
    }
    if (ev->lane == FS_TL_WAIT) {
        add_event(t, json_pack("{s:s, s:s, s:s, s:i, s:i, s:f, s:f, s:{s:i}}", "name",
                               "waiting in the launch hook", "cat", "wait", "ph", "X", "pid", 1,
                               "tid", TID_WAIT, "ts", ev->start_us, "dur", dur, "args", "launch",
                               ev->launch));
        return;
    }
    bool h2d = ev->lane == FS_TL_H2D;
    char name[96];
    snprintf(name, sizeof(name), "%s alloc %d (%.1f MiB)",
             !h2d           ? "write-back"
             : ev->in_place ? "read in place:"
             : ev->fault_in ? "fault-in"
                            : "prefetch",
             ev->alloc, mib(ev->bytes));
    json_t *args = json_pack("{s:i, s:I}", "alloc", ev->alloc, "bytes", (json_int_t)ev->bytes);
    if (args && ev->launch >= 0 &&
        json_object_set_new(args, h2d ? "issued_at_launch" : "after_launch",
                            json_integer(ev->launch)) != 0)
        t->failed = true;
    if (args && h2d &&
        json_object_set_new(args, "first_use", json_integer(p->allocs[ev->alloc].first_use)) != 0)
        t->failed = true;
    add_event(t, json_pack("{s:s, s:s, s:s, s:i, s:i, s:f, s:f, s:o}", "name", name, "cat",
                           h2d ? "prefetch" : "write-back", "ph", "X", "pid", 1, "tid",
                           h2d ? TID_H2D : TID_D2H, "ts", ev->start_us, "dur", dur, "args", args));
}

/* Process and lane names; a replay has a fourth lane, the program's waits. */
static void add_metadata(struct trace_ctx *t, bool replay)
{
    static const struct {
        int tid;
        const char *name;
    } lanes[] = {
        {TID_COMPUTE, "compute"},
        {TID_H2D, "host to device"},
        {TID_D2H, "device to host"},
        {TID_WAIT, "program's thread in the launch hook"},
    };
    add_event(t, json_pack("{s:s, s:s, s:i, s:i, s:{s:s}}", "name", "process_name", "ph", "M",
                           "pid", 1, "tid", 0, "args", "name",
                           replay ? "flexshim plan, replayed" : "flexshim plan"));
    for (size_t i = 0; i < FS_ARRAY_LEN(lanes) - (replay ? 0 : 1); i++) {
        add_event(t, json_pack("{s:s, s:s, s:i, s:i, s:{s:s}}", "name", "thread_name", "ph", "M",
                               "pid", 1, "tid", lanes[i].tid, "args", "name", lanes[i].name));
        add_event(t, json_pack("{s:s, s:s, s:i, s:i, s:{s:i}}", "name", "thread_sort_index", "ph",
                               "M", "pid", 1, "tid", lanes[i].tid, "args", "sort_index",
                               lanes[i].tid));
    }
}

/* The plan to draw: the saved one, or a new one for --budget / --strategy. On success *PLAN is
 * an unevaluated copy or a new plan; -1, or the exit code after a message. */
static int trace_plan(const char *cmd, const struct args *a, const struct fs_profile *p,
                      const struct fs_strategy *strat, const struct budget_arg *budget,
                      struct fs_plan *plan)
{
    memset(plan, 0, sizeof(*plan));
    if (!budget && !strat) {
        if (!has_plan(p)) {
            error(cmd, "profile %s has no saved plan; give --budget SIZE (and --strategy NAME) to "
                       "plan one",
                  a->file);
            return EXIT_CHECK_FAILED;
        }
        return -1; /* the saved plan: eval_saved_plan checks it */
    }
    if (!budget && !has_plan(p)) {
        error(cmd, "profile %s has no saved plan to take the budget from; give --budget SIZE",
              a->file);
        return EXIT_CHECK_FAILED;
    }
    if (!strat) {
        char base[sizeof(p->plan.strategy)];
        snprintf(base, sizeof(base), "%s", p->plan.strategy);
        base[strcspn(base, "(")] = '\0';
        strat = fs_strategy_find(base);
        if (!strat)
            strat = fs_strategies[0];
    }
    uint64_t bytes = budget ? budget_bytes(budget, managed_bytes(p)) : p->plan.budget;
    char bt[64], sz[SIZE_TEXT_MAX];
    if (budget)
        budget_text(budget, bytes, bt, sizeof(bt));
    else
        size_text(bytes, bt);
    fprintf(stderr, "%s: planning with %s at budget %s\n", cmd, strat->name, bt);
    int rc = strat->plan(p, bytes, plan);
    if (rc == FS_ERR_NOMEM) {
        int at = -1;
        uint64_t need = min_budget(p, &at);
        error(cmd, "strategy %s finds no plan within %s: the allocations in use across launch %d "
                   "need %s (the smallest feasible budget)",
              strat->name, bt, at, size_text(need, sz));
        return EXIT_CHECK_FAILED;
    }
    if (rc != FS_OK) {
        error(cmd, "profile %s: strategy %s failed (%s)", a->file, strat->name, fs_err_str(rc));
        return EXIT_CHECK_FAILED;
    }
    return -1;
}

static int write_json(const char *cmd, json_t *root, const char *out)
{
    size_t len = strlen(out) + 32;
    char *tmp = malloc(len);
    if (!tmp) {
        error(cmd, "out of memory");
        return EXIT_CHECK_FAILED;
    }
    snprintf(tmp, len, "%s.tmp.%ld", out, (long)getpid());
    errno = 0;
    int rc = EXIT_OK;
    if (json_dump_file(root, tmp, JSON_COMPACT | JSON_REAL_PRECISION(12)) != 0) {
        error(cmd, "cannot write %s: %s", out, errno ? strerror(errno) : "write failed");
        unlink(tmp);
        rc = EXIT_CHECK_FAILED;
    } else if (rename(tmp, out) != 0) {
        error(cmd, "cannot write %s: %s", out, strerror(errno));
        unlink(tmp);
        rc = EXIT_CHECK_FAILED;
    }
    free(tmp);
    return rc;
}

/* The plan replayed on the simulated device for ITERATIONS, its last iteration drawn into T.
 * PLAN is the saved plan (its entries NULL: trace_plan left it to eval_saved_plan) or a new one;
 * the replay's engine plans the same again (same profile, budget and strategy). -1, or the exit
 * code after a message. */
static int trace_replay(const char *cmd, const struct fs_profile *p, struct fs_plan *plan,
                        int iterations, const struct args *a, struct trace_ctx *t,
                        struct fs_replay_result *res)
{
    char why[512] = "";
    if (!plan->entries && eval_saved_plan(p, plan, NULL, NULL, why, sizeof(why)) != FS_OK) {
        error(cmd, "the profile's plan: %s; plan it again", why);
        return EXIT_CHECK_FAILED;
    }
    char base[sizeof(plan->strategy)];
    snprintf(base, sizeof(base), "%s", plan->strategy);
    base[strcspn(base, "(")] = '\0';
    struct fs_replay_config cfg = {.budget = plan->budget,
                                   .strategy = fs_strategy_find(base) ? base : NULL,
                                   .iterations = iterations,
                                   .offload_mode = a->offload,
                                   .settings = a->set,
                                   .trace = trace_sink,
                                   .trace_arg = t};
    if (fs_replay(p, &cfg, res, why, sizeof(why)) != FS_OK) {
        error(cmd, "replay: %s", why);
        return EXIT_CHECK_FAILED;
    }
    return -1;
}

static int trace_run(int argc, char **argv)
{
    const struct command *c = command_named("trace");
    struct args a;
    int rc = parse_args(c, argc, argv,
                        OPT_BUDGET | OPT_STRATEGY | OPT_OUT | OPT_REPLAY | OPT_OFFLOAD | OPT_SET, &a);
    if (rc >= 0)
        return rc;
    if (!a.out)
        return usage_error(c->name, "-o OUT.json is required: the trace file to write");
    int replay_iters;
    if ((rc = parse_replay_opts(c->name, &a, &replay_iters)) >= 0)
        return rc;
    const struct fs_strategy *strat[FS_MAX_STRATEGIES + 1];
    if (a.strategy && (rc = pick_strategies(c->name, a.strategy, false, strat)) >= 0)
        return rc;
    struct budget_arg *budget = NULL;
    int nb = 0;
    if (a.budget && (rc = parse_budgets(c->name, a.budget, false, &budget, &nb)) >= 0)
        return rc;
    struct fs_profile p;
    if ((rc = load(c->name, a.file, &p)) != EXIT_OK) {
        free(budget);
        return rc;
    }
    struct fs_plan plan = {0};
    struct trace_ctx t = {&p, json_array(), {0, 0, 0, 0}, false};
    struct fs_replay_result res = {0};
    json_t *root = NULL;
    char why[512];
    if (!t.events) {
        t.failed = true;
        goto out;
    }
    add_metadata(&t, replay_iters > 0);
    rc = trace_plan(c->name, &a, &p, a.strategy ? strat[0] : NULL, budget, &plan);
    if (rc >= 0)
        goto out;
    if (replay_iters > 0) {
        if ((rc = trace_replay(c->name, &p, &plan, replay_iters, &a, &t, &res)) >= 0)
            goto out;
    } else if (!a.budget && !a.strategy) {
        if (eval_saved_plan(&p, &plan, trace_sink, &t, why, sizeof(why)) != FS_OK) {
            error(c->name, "profile %s: %s; plan it again", a.file, why);
            rc = EXIT_CHECK_FAILED;
            goto out;
        }
        note_prediction(a.file, &p.plan, &plan);
    } else if (fs_plan_evaluate_trace(&p, &plan, trace_sink, &t) != FS_OK) {
        error(c->name, "profile %s: the timeline model rejects the new plan", a.file);
        rc = EXIT_CHECK_FAILED;
        goto out;
    }
    root = json_pack("{s:o, s:s, s:{s:s, s:s, s:s, s:s, s:I, s:f, s:f, s:I, s:s}}", "traceEvents",
                     json_incref(t.events), "displayTimeUnit", "ms", "otherData", "profile",
                     a.file, "program", p.program, "device", p.device_name, "strategy",
                     plan.strategy, "budget_bytes", (json_int_t)plan.budget, "predicted_ms",
                     ms(plan.predicted_us), "stall_ms", ms(plan.predicted_stall_us),
                     "peak_bytes", (json_int_t)plan.peak_bytes, "model",
                     replay_iters ? "flexshim's engine running the plan on the simulated device "
                                    "(the last replayed iteration), not a GPU run"
                                  : "flexshim timeline model of the planned iteration, not a GPU "
                                    "run");
    if (root && replay_iters) {
        /* What the replay ran: its median and the settings it ran with. */
        json_t *other = json_object_get(root, "otherData");
        if (json_object_set_new(other, "replay_median_ms", json_real(ms(res.step_us))) != 0 ||
            json_object_set_new(other, "replay_offload_mode",
                                json_string(a.offload ? a.offload : "prefetch")) != 0 ||
            json_object_set_new(other, "replay_settings", json_string(a.set ? a.set : "")) != 0)
            t.failed = true;
    }
    if (!root || t.failed) {
        t.failed = true;
        goto out;
    }
    size_t nev = json_array_size(t.events);
    if (nev > 100000)
        fprintf(stderr, "%s: writing %zu events to %s\n", c->name, nev, a.out);
    rc = write_json(c->name, root, a.out);
    if (rc == EXIT_OK && replay_iters)
        printf("wrote %s: %zu events (%d launches, %d copies in: prefetches and fault-ins, %d "
               "write-backs, %d waits in the launch hook; the last of %d replayed iterations, "
               "median %.3f ms; timeline model %.3f ms)\n",
               a.out, nev, t.count[FS_TL_COMPUTE], t.count[FS_TL_H2D], t.count[FS_TL_D2H],
               t.count[FS_TL_WAIT], replay_iters, ms(res.step_us), ms(plan.predicted_us));
    else if (rc == EXIT_OK)
        printf("wrote %s: %zu events (%d launches, %d prefetches, %d write-backs; predicted %.3f "
               "ms, stall %.3f ms)\n",
               a.out, nev, t.count[FS_TL_COMPUTE], t.count[FS_TL_H2D], t.count[FS_TL_D2H],
               ms(plan.predicted_us), ms(plan.predicted_stall_us));
out:
    if (t.failed) {
        error(c->name, "out of memory building the trace");
        rc = EXIT_CHECK_FAILED;
    }
    json_decref(root);
    json_decref(t.events);
    fs_plan_free(&plan);
    free(budget);
    fs_profile_free(&p);
    return rc;
}

/* ---- main -------------------------------------------------------------------------------- */

static void usage(FILE *out)
{
    fprintf(out, "usage: flexshim-profile COMMAND [ARGS...]\n\ncommands:\n");
    for (size_t i = 0; i < FS_ARRAY_LEN(commands); i++)
        fprintf(out, "  %s %s\n      %s\n", commands[i].name, commands[i].synopsis,
                commands[i].summary);
    fprintf(out, "\n'flexshim-profile COMMAND --help' describes one command.\n"
                 "simulate and trace run the timeline model of the planned iteration, not a GPU.\n"
                 "exit codes: 0 success, 1 check failed, 2 usage error\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return EXIT_OK;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("flexshim-profile %s\n", FLEXSHIM_VERSION_STRING);
        return EXIT_OK;
    }
    const struct command *c = command_named(argv[1]);
    if (c)
        return c->run(argc - 1, argv + 1);
    fprintf(stderr, "flexshim-profile: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return EXIT_USAGE;
}
