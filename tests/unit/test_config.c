/* Configuration: the parameter table, value parsing, INI and environment readers, --dump and the
 * generated INI file. */
#include <unistd.h>

#include "test_util.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <sys/stat.h>

#include "config.h"
#include "fs.h"

/* ---- helpers ---------------------------------------------------------------------------- */

/* True when some message of ERRS contains every one of the NULL-terminated strings. */
static bool errs_have(const struct fs_config_errors *errs, ...)
{
    for (int i = 0; i < errs->count; i++) {
        va_list ap;
        va_start(ap, errs);
        bool all = true;
        for (const char *s = va_arg(ap, const char *); s; s = va_arg(ap, const char *))
            if (!strstr(errs->msg[i], s))
                all = false;
        va_end(ap);
        if (all)
            return true;
    }
    return false;
}

/* Asserts that ERRS holds N messages, listing them when it does not. */
static void expect_count(const struct fs_config_errors *errs, int n)
{
    if (errs->count != n) {
        for (int i = 0; i < errs->count; i++)
            print_message("  error: %s\n", errs->msg[i]);
        fail_msg("%d errors, expected %d", errs->count, n);
    }
}

/* Parses TEXT as ID and returns the result; the message, if any, goes to WHY. */
static int parse(enum fs_param_id id, const char *text, struct fs_value *v, char *why)
{
    memset(v, 0, sizeof(*v));
    why[0] = '\0';
    return fs_config_parse(id, text, v, why, FS_CONFIG_ERROR_MAX);
}

static int read_ini_text(struct fs_config *cfg, const char *text, struct fs_config_errors *errs,
                         char *path, size_t path_len)
{
    fs_test_write_file(path, path_len, text);
    memset(errs, 0, sizeof(*errs));
    int rc = fs_config_read_ini(cfg, path, errs);
    unlink(path);
    return rc;
}

/* The line of TEXT that starts with PREFIX followed by a space, copied into LINE. */
static bool find_line(const char *text, const char *prefix, char *line, size_t len)
{
    size_t pl = strlen(prefix);
    for (const char *p = text; p && *p;) {
        const char *nl = strchr(p, '\n');
        size_t ll = nl ? (size_t)(nl - p) : strlen(p);
        if (ll > pl && !strncmp(p, prefix, pl) && p[pl] == ' ') {
            snprintf(line, len, "%.*s", (int)ll, p);
            return true;
        }
        p = nl ? nl + 1 : NULL;
    }
    return false;
}

static void read_stream(FILE *f, char *buf, size_t len)
{
    fflush(f);
    rewind(f);
    size_t n = fread(buf, 1, len - 1, f);
    buf[n] = '\0';
}

/* A temporary directory, entered; returns to OLD and removes it with leave_tmpdir. */
static void enter_tmpdir(char *dir, size_t dlen, char *old, size_t olen)
{
    assert_non_null(getcwd(old, olen));
    snprintf(dir, dlen, "/tmp/flexshim-cfgdir-XXXXXX");
    assert_non_null(mkdtemp(dir));
    assert_int_equal(chdir(dir), 0);
}

static void leave_tmpdir(const char *dir, const char *old)
{
    assert_int_equal(chdir(old), 0);
    assert_int_equal(rmdir(dir), 0);
}

static void write_named(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* ---- the table -------------------------------------------------------------------------- */

static void test_table_defaults_parse(void **state)
{
    (void)state;
    struct fs_config cfg;
    fs_config_defaults(&cfg);
    assert_string_equal(cfg.ini_path, "");
    for (int i = 0; i < FS_P_COUNT; i++) {
        struct fs_value v;
        char why[FS_CONFIG_ERROR_MAX];
        int rc = parse((enum fs_param_id)i, fs_param_defs[i].default_text, &v, why);
        if (rc != FS_OK)
            fail_msg("default of %s (%s) does not parse: %s", fs_param_defs[i].name,
                     fs_param_defs[i].default_text, why);
        assert_int_equal(cfg.v[i].src, FS_SRC_DEFAULT);
        assert_true(cfg.v[i].u == v.u);
        assert_string_equal(cfg.v[i].text, fs_param_defs[i].default_text);
    }
    /* A few defaults the rest of flexshim relies on. */
    assert_int_equal(fs_config_u64(&cfg, FS_P_ENABLED), 1);
    assert_true(cfg.v[FS_P_GPU_MEMORY_LIMIT].pct == 100.0);
    assert_int_equal(fs_config_u64(&cfg, FS_P_MIN_OFFLOAD_BYTES), 8 * FS_MIB);
    assert_string_equal(fs_config_str(&cfg, FS_P_PROFILE), "");
}

static void test_table_names_unique_and_derived(void **state)
{
    (void)state;
    for (int i = 0; i < FS_P_COUNT; i++) {
        const struct fs_param_def *d = &fs_param_defs[i];
        char env[128], key[128];
        snprintf(env, sizeof(env), "FLEXTENSOR_%s", d->name);
        assert_string_equal(d->env_name, env);
        size_t j = 0;
        for (; d->name[j]; j++)
            key[j] = (char)tolower((unsigned char)d->name[j]);
        key[j] = '\0';
        assert_string_equal(d->ini_key, key);
        for (int k = 0; k < i; k++) {
            assert_true(strcmp(d->name, fs_param_defs[k].name) != 0);
            assert_true(strcasecmp(d->ini_key, fs_param_defs[k].ini_key) != 0);
        }
        assert_true(strcmp(d->env_name, FS_CONFIG_ENV) != 0);
        assert_int_equal(fs_param_find(d->name), i);
        assert_int_equal(fs_param_find(d->env_name), i);
        assert_int_equal(fs_param_find(d->ini_key), i);
    }
    assert_int_equal(fs_param_find("gpu_memory_limit"), FS_P_GPU_MEMORY_LIMIT);
    assert_int_equal(fs_param_find("no_such_setting"), -1);
    assert_int_equal(fs_param_find(NULL), -1);
}

static void test_table_docs_and_bounds(void **state)
{
    (void)state;
    for (int i = 0; i < FS_P_COUNT; i++) {
        const struct fs_param_def *d = &fs_param_defs[i];
        assert_non_null(d->doc);
        assert_true(strlen(d->doc) > 10);
        assert_null(strchr(d->doc, '\n'));
        assert_non_null(d->default_text);
        assert_true(d->min <= d->max);
        if (d->type == FS_PT_ENUM) {
            assert_non_null(d->choices);
            assert_true(strlen(d->choices) > 0);
        } else {
            assert_null(d->choices);
        }
    }
}

/* ---- sizes ------------------------------------------------------------------------------ */

static void test_parse_size_units(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        uint64_t bytes;
    } cases[] = {
        {"0", 0},
        {"123", 123},
        {"123B", 123},
        {"1K", 1024},
        {"1KiB", 1024},
        {"1kib", 1024},
        {"1KB", 1000},
        {"1kb", 1000},
        {"2M", 2 * FS_MIB},
        {"2MiB", 2 * FS_MIB},
        {"2MB", 2000000},
        {"8G", 8 * FS_GIB},
        {"8GiB", 8 * FS_GIB},
        {"8gib", 8 * FS_GIB},
        {"8GB", 8000000000ull},
        {"3T", 3 * FS_TIB},
        {"3TiB", 3 * FS_TIB},
        {"3TB", 3000000000000ull},
        {"16777215TiB", 16777215ull * FS_TIB},
    };
    for (size_t i = 0; i < FS_ARRAY_LEN(cases); i++) {
        uint64_t b = 42;
        double pct = -1;
        if (fs_parse_size(cases[i].text, &b, &pct) != FS_OK)
            fail_msg("'%s' rejected", cases[i].text);
        if (b != cases[i].bytes)
            fail_msg("'%s' = %llu, want %llu", cases[i].text, (unsigned long long)b,
                     (unsigned long long)cases[i].bytes);
        assert_true(pct == 0.0);
        assert_int_equal(fs_parse_size(cases[i].text, &b, NULL), FS_OK);
    }
}

static void test_parse_size_decimals_and_whitespace(void **state)
{
    (void)state;
    uint64_t b;
    assert_int_equal(fs_parse_size("1.5GiB", &b, NULL), FS_OK);
    assert_true(b == 3 * FS_GIB / 2);
    assert_int_equal(fs_parse_size("0.5K", &b, NULL), FS_OK);
    assert_true(b == 512);
    assert_int_equal(fs_parse_size("2.25 MB", &b, NULL), FS_OK);
    assert_true(b == 2250000);
    assert_int_equal(fs_parse_size("  4 GiB  ", &b, NULL), FS_OK);
    assert_true(b == 4 * FS_GIB);
    assert_int_equal(fs_parse_size("7\tM", &b, NULL), FS_OK);
    assert_true(b == 7 * FS_MIB);
    assert_int_equal(fs_parse_size("1.0009765625KiB", &b, NULL), FS_OK); /* rounded down */
    assert_true(b == 1025);
    assert_int_equal(fs_parse_size("1.7", &b, NULL), FS_OK);
    assert_true(b == 1);
}

static void test_parse_size_rejects(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "", "   ", "abc", "-1", "-1GiB", "+1", "1.", ".5", "8XB", "1 2", "1GiBB", "GiB",
        "1e9", "1,5GiB", "0x10", "1 %", "1.5.5", "99999999TiB", "18446744073709551616",
        "20000000000000000000", "16777216TiB",
    };
    for (size_t i = 0; i < FS_ARRAY_LEN(bad); i++) {
        uint64_t b = 77;
        if (fs_parse_size(bad[i], &b, NULL) == FS_OK)
            fail_msg("'%s' accepted as %llu bytes", bad[i], (unsigned long long)b);
        assert_true(b == 77); /* untouched */
    }
    uint64_t b;
    assert_int_equal(fs_parse_size("18446744073709551615", &b, NULL), FS_OK);
    assert_true(b == UINT64_MAX);
    assert_int_equal(fs_parse_size("60%", &b, NULL), FS_ERR_INVALID); /* no percentages */
    assert_int_equal(fs_parse_size(NULL, &b, NULL), FS_ERR_INVALID);
}

static void test_parse_size_percent(void **state)
{
    (void)state;
    uint64_t b = 5;
    double pct = 0;
    assert_int_equal(fs_parse_size("60%", &b, &pct), FS_OK);
    assert_true(pct == 60.0);
    assert_true(b == 0);
    assert_int_equal(fs_parse_size("12.5%", &b, &pct), FS_OK);
    assert_true(pct == 12.5);
    assert_int_equal(fs_parse_size(" 100 % ", &b, &pct), FS_OK);
    assert_true(pct == 100.0);
    assert_int_equal(fs_parse_size("0.1%", &b, &pct), FS_OK);
    assert_true(pct > 0.0999 && pct < 0.1001);
    static const char *const bad[] = {"0%", "0.0%", "100.5%", "150%", "-5%", "%", "60%%",
                                      "60%GiB", "1e2%"};
    for (size_t i = 0; i < FS_ARRAY_LEN(bad); i++)
        if (fs_parse_size(bad[i], &b, &pct) == FS_OK)
            fail_msg("'%s' accepted as a percentage", bad[i]);
}

static void test_config_bytes(void **state)
{
    (void)state;
    struct fs_config cfg;
    fs_config_defaults(&cfg);
    char why[FS_CONFIG_ERROR_MAX];
    /* Default 100%: the whole device. */
    assert_true(fs_config_bytes(&cfg, FS_P_GPU_MEMORY_LIMIT, 80 * FS_GIB) == 80 * FS_GIB);
    assert_int_equal(
        fs_config_parse(FS_P_GPU_MEMORY_LIMIT, "60%", &cfg.v[FS_P_GPU_MEMORY_LIMIT], why, 256),
        FS_OK);
    assert_true(cfg.v[FS_P_GPU_MEMORY_LIMIT].u == 0);
    assert_true(fs_config_bytes(&cfg, FS_P_GPU_MEMORY_LIMIT, 80 * FS_GIB) == 48 * FS_GIB);
    assert_true(fs_config_bytes(&cfg, FS_P_GPU_MEMORY_LIMIT, 1001) == 600); /* rounded down */
    assert_int_equal(
        fs_config_parse(FS_P_GPU_MEMORY_LIMIT, "33.3%", &cfg.v[FS_P_GPU_MEMORY_LIMIT], why, 256),
        FS_OK);
    assert_true(fs_config_bytes(&cfg, FS_P_GPU_MEMORY_LIMIT, 1000) == 333);
    assert_true(fs_config_bytes(&cfg, FS_P_GPU_MEMORY_LIMIT, 2999) == 998);
    assert_int_equal(
        fs_config_parse(FS_P_GPU_MEMORY_LIMIT, "12GiB", &cfg.v[FS_P_GPU_MEMORY_LIMIT], why, 256),
        FS_OK);
    assert_true(cfg.v[FS_P_GPU_MEMORY_LIMIT].pct == 0.0);
    assert_true(fs_config_bytes(&cfg, FS_P_GPU_MEMORY_LIMIT, 80 * FS_GIB) == 12 * FS_GIB);
    assert_true(fs_config_bytes(&cfg, FS_P_MIN_OFFLOAD_BYTES, 80 * FS_GIB) == 8 * FS_MIB);
}

/* ---- other types and messages ------------------------------------------------------------ */

static void test_parse_bool(void **state)
{
    (void)state;
    static const char *const yes[] = {"1", "true", "TRUE", "Yes", "on", " ON "};
    static const char *const no[] = {"0", "false", "False", "no", "NO", "off"};
    struct fs_value v;
    char why[FS_CONFIG_ERROR_MAX];
    for (size_t i = 0; i < FS_ARRAY_LEN(yes); i++) {
        assert_int_equal(parse(FS_P_ENABLED, yes[i], &v, why), FS_OK);
        assert_true(v.u == 1);
    }
    for (size_t i = 0; i < FS_ARRAY_LEN(no); i++) {
        assert_int_equal(parse(FS_P_ENABLED, no[i], &v, why), FS_OK);
        assert_true(v.u == 0);
    }
    static const char *const bad[] = {"2", "maybe", "y", "", "tru"};
    for (size_t i = 0; i < FS_ARRAY_LEN(bad); i++) {
        assert_int_equal(parse(FS_P_ENABLED, bad[i], &v, why), FS_ERR_CONFIG);
        assert_string_equal(why, "not a boolean; use 1/0, true/false, yes/no or on/off");
    }
}

static void test_parse_int(void **state)
{
    (void)state;
    struct fs_value v;
    char why[FS_CONFIG_ERROR_MAX];
    assert_int_equal(parse(FS_P_DISCOVERY_ITERS, "1", &v, why), FS_OK);
    assert_true(v.u == 1);
    assert_int_equal(parse(FS_P_DISCOVERY_ITERS, " 1000 ", &v, why), FS_OK);
    assert_true(v.u == 1000);
    assert_string_equal(v.text, "1000");
    assert_int_equal(parse(FS_P_DISCOVERY_ITERS, "0", &v, why), FS_ERR_CONFIG);
    assert_string_equal(why, "out of range; use a value from 1 to 1000");
    assert_int_equal(parse(FS_P_DISCOVERY_ITERS, "1001", &v, why), FS_ERR_CONFIG);
    assert_string_equal(why, "out of range; use a value from 1 to 1000");
    assert_int_equal(parse(FS_P_DISCOVERY_ITERS, "99999999999999999999999", &v, why),
                     FS_ERR_CONFIG);
    assert_non_null(strstr(why, "out of range"));
    static const char *const bad[] = {"ten", "-1", "+1", "1.5", "1e3", "", "5 iters"};
    for (size_t i = 0; i < FS_ARRAY_LEN(bad); i++) {
        assert_int_equal(parse(FS_P_DISCOVERY_ITERS, bad[i], &v, why), FS_ERR_CONFIG);
        assert_string_equal(why, "not a whole number; use a value from 1 to 1000");
    }
    assert_int_equal(parse(FS_P_DEVICE, "64", &v, why), FS_ERR_CONFIG);
    assert_string_equal(why, "out of range; use a value from 0 to 63");
}

static void test_parse_enum(void **state)
{
    (void)state;
    struct fs_value v;
    char why[FS_CONFIG_ERROR_MAX];
    assert_int_equal(parse(FS_P_STRATEGY, "adaptive", &v, why), FS_OK);
    assert_true(v.u == 0);
    assert_int_equal(parse(FS_P_STRATEGY, "GREEDY", &v, why), FS_OK);
    assert_true(v.u == 2);
    assert_string_equal(v.text, "GREEDY");
    assert_int_equal(parse(FS_P_STRATEGY, "global", &v, why), FS_OK);
    assert_true(v.u == 3);
    assert_int_equal(parse(FS_P_LOG_LEVEL, "trace", &v, why), FS_OK);
    assert_true(v.u == 4);
    static const char *const bad[] = {"fast", "greed", "adaptive|knapsack", "", "|"};
    for (size_t i = 0; i < FS_ARRAY_LEN(bad); i++) {
        assert_int_equal(parse(FS_P_STRATEGY, bad[i], &v, why), FS_ERR_CONFIG);
        assert_string_equal(why, "unknown choice; use one of adaptive, knapsack, greedy, global");
    }
    struct fs_config cfg;
    fs_config_defaults(&cfg);
    char buf[32];
    assert_string_equal(fs_config_choice(&cfg, FS_P_STRATEGY, buf, sizeof(buf)), "adaptive");
    assert_string_equal(fs_config_choice(&cfg, FS_P_PIN_MODE, buf, sizeof(buf)), "background");
    assert_int_equal(parse(FS_P_STRATEGY, "Global", &cfg.v[FS_P_STRATEGY], why), FS_OK);
    assert_string_equal(fs_config_choice(&cfg, FS_P_STRATEGY, buf, sizeof(buf)), "global");
    assert_int_equal(parse(FS_P_PIN_MODE, "ON_DEMAND", &cfg.v[FS_P_PIN_MODE], why), FS_OK);
    assert_string_equal(fs_config_choice(&cfg, FS_P_PIN_MODE, buf, sizeof(buf)), "on_demand");
    char small[4];
    assert_string_equal(fs_config_choice(&cfg, FS_P_STRATEGY, small, sizeof(small)), "glo");
    assert_string_equal(fs_config_choice(&cfg, FS_P_DEVICE, buf, sizeof(buf)), "");
}

static void test_parse_size_messages(void **state)
{
    (void)state;
    struct fs_value v;
    char why[FS_CONFIG_ERROR_MAX];
    assert_int_equal(parse(FS_P_GPU_MEMORY_LIMIT, "8XB", &v, why), FS_ERR_CONFIG);
    assert_string_equal(why, "not a size; use a byte count with an optional unit (B, KiB, MiB, "
                             "GiB, TiB, KB, MB, GB, TB) or a percentage of the device such as "
                             "60%");
    assert_int_equal(parse(FS_P_MIN_OFFLOAD_BYTES, "8XB", &v, why), FS_ERR_CONFIG);
    assert_string_equal(why, "not a size; use a byte count with an optional unit (B, KiB, MiB, "
                             "GiB, TiB, KB, MB, GB, TB)");
    assert_int_equal(parse(FS_P_MIN_OFFLOAD_BYTES, "50%", &v, why), FS_ERR_CONFIG);
    assert_non_null(strstr(why, "not a size"));
    assert_int_equal(parse(FS_P_GPU_MEMORY_LIMIT, "1MiB", &v, why), FS_ERR_CONFIG);
    assert_non_null(strstr(why, "out of range; use a value from 64MiB to 64TiB"));
    assert_non_null(strstr(why, "from 0% (exclusive) to 100%"));
    assert_int_equal(parse(FS_P_GPU_MEMORY_LIMIT, "65TiB", &v, why), FS_ERR_CONFIG);
    assert_non_null(strstr(why, "out of range"));
    assert_int_equal(parse(FS_P_GPU_MEMORY_LIMIT, "150%", &v, why), FS_ERR_CONFIG);
    assert_non_null(strstr(why, "out of range"));
    assert_non_null(strstr(why, "from 0% (exclusive) to 100%"));
    assert_int_equal(parse(FS_P_GPU_MEMORY_LIMIT, "0%", &v, why), FS_ERR_CONFIG);
    assert_non_null(strstr(why, "out of range"));
    assert_int_equal(parse(FS_P_MIN_OFFLOAD_BYTES, "99999999TiB", &v, why), FS_ERR_CONFIG);
    assert_string_equal(why, "out of range; use a value from 0B to 64TiB");
    assert_int_equal(parse(FS_P_GPU_MEMORY_LIMIT, "64MiB", &v, why), FS_OK);
    assert_true(v.u == 64 * FS_MIB && v.pct == 0.0);
    assert_int_equal(parse(FS_P_GPU_MEMORY_LIMIT, "64TiB", &v, why), FS_OK);
    assert_int_equal(parse(FS_P_GPU_MEMORY_LIMIT, " 12.5 % ", &v, why), FS_OK);
    assert_true(v.pct == 12.5 && v.u == 0);
    assert_string_equal(v.text, "12.5 %");
}

static void test_parse_string_trim_and_failure(void **state)
{
    (void)state;
    struct fs_value v;
    char why[FS_CONFIG_ERROR_MAX];
    assert_int_equal(parse(FS_P_PROFILE, "  /data/my profile.json \t", &v, why), FS_OK);
    assert_string_equal(v.text, "/data/my profile.json");
    assert_int_equal(parse(FS_P_PROFILE, "", &v, why), FS_OK);
    assert_string_equal(v.text, "");
    char long_text[FS_VALUE_TEXT_MAX + 10];
    memset(long_text, 'a', sizeof(long_text) - 1);
    long_text[sizeof(long_text) - 1] = '\0';
    assert_int_equal(parse(FS_P_LOG_FILE, long_text, &v, why), FS_ERR_CONFIG);
    assert_non_null(strstr(why, "too long"));
    long_text[FS_VALUE_TEXT_MAX - 1] = '\0';
    assert_int_equal(parse(FS_P_LOG_FILE, long_text, &v, why), FS_OK);
    assert_int_equal(strlen(v.text), FS_VALUE_TEXT_MAX - 1);

    /* A failed parse leaves the destination alone. */
    struct fs_value keep;
    assert_int_equal(parse(FS_P_DEVICE, "7", &keep, why), FS_OK);
    struct fs_value before = keep;
    assert_int_equal(fs_config_parse(FS_P_DEVICE, "seven", &keep, why, sizeof(why)),
                     FS_ERR_CONFIG);
    assert_memory_equal(&before, &keep, sizeof(keep));
    assert_int_equal(fs_config_parse(FS_P_DEVICE, "", &keep, why, sizeof(why)), FS_ERR_CONFIG);
    assert_non_null(strstr(why, "not a whole number"));
    /* A short WHY buffer is cut, not overrun. */
    char tiny[8];
    assert_int_equal(fs_config_parse(FS_P_DEVICE, "x", &keep, tiny, sizeof(tiny)), FS_ERR_CONFIG);
    assert_string_equal(tiny, "not a w");
}

static void test_errors_cap(void **state)
{
    (void)state;
    struct fs_config_errors errs = {0};
    for (int i = 0; i < FS_CONFIG_MAX_ERRORS + 10; i++)
        fs_config_errors_add(&errs, "error %d", i);
    assert_int_equal(errs.count, FS_CONFIG_MAX_ERRORS);
    assert_string_equal(errs.msg[0], "error 0");
    assert_string_equal(errs.msg[FS_CONFIG_MAX_ERRORS - 1], "error 31");
    char big[2000];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    struct fs_config_errors e2 = {0};
    fs_config_errors_add(&e2, "%s", big);
    assert_int_equal(strlen(e2.msg[0]), FS_CONFIG_ERROR_MAX - 1);

    /* More errors than fit still make the load fail. */
    char env_store[FS_CONFIG_MAX_ERRORS + 5][64];
    char *envp[FS_CONFIG_MAX_ERRORS + 7];
    int n = 0;
    envp[n++] = "FLEXTENSOR_CONFIG=";
    for (int i = 0; i < FS_CONFIG_MAX_ERRORS + 5; i++) {
        snprintf(env_store[i], sizeof(env_store[i]), "FLEXTENSOR_NOPE_%d=1", i);
        envp[n++] = env_store[i];
    }
    envp[n] = NULL;
    struct fs_config cfg;
    struct fs_config_errors e3 = {0};
    assert_int_equal(fs_config_load(&cfg, envp, &e3), FS_ERR_CONFIG);
    assert_int_equal(e3.count, FS_CONFIG_MAX_ERRORS);
}

/* ---- the environment -------------------------------------------------------------------- */

/* File names with {rank} and {pid}: one file per process of a torchrun job. */
static void test_paths_per_rank(void **state)
{
    (void)state;
    struct fs_config cfg;
    struct fs_config_errors errs = {0};
    char *ranked[] = {"FLEXTENSOR_CONFIG=", "RANK=3", "LOCAL_RANK=1",
                      "FLEXTENSOR_PROFILE_OUT=/tmp/p-{rank}.json",
                      "FLEXTENSOR_LOG_FILE=/tmp/{rank}/{pid}.log",
                      "FLEXTENSOR_ITERATION_KERNEL=k{rank}", NULL};
    assert_int_equal(fs_config_load(&cfg, ranked, &errs), FS_OK);
    assert_string_equal(fs_config_str(&cfg, FS_P_PROFILE_OUT), "/tmp/p-3.json");
    char want[64];
    snprintf(want, sizeof(want), "/tmp/3/%ld.log", (long)getpid());
    assert_string_equal(fs_config_str(&cfg, FS_P_LOG_FILE), want);
    /* Only file names are expanded. */
    assert_string_equal(fs_config_str(&cfg, FS_P_ITERATION_KERNEL), "k{rank}");
    char *local[] = {"FLEXTENSOR_CONFIG=", "LOCAL_RANK=1", "FLEXTENSOR_PROFILE=/p{rank}{x}", NULL};
    assert_int_equal(fs_config_load(&cfg, local, &errs), FS_OK);
    assert_string_equal(fs_config_str(&cfg, FS_P_PROFILE), "/p1{x}");
    char *none[] = {"FLEXTENSOR_CONFIG=", "FLEXTENSOR_PROFILE={rank}", NULL};
    assert_int_equal(fs_config_load(&cfg, none, &errs), FS_OK);
    assert_string_equal(fs_config_str(&cfg, FS_P_PROFILE), "0");
    /* Too long once expanded: an error naming the setting. */
    char long_rank[120] = "RANK=";
    memset(long_rank + 5, '7', 100);
    long_rank[105] = '\0';
    char *toolong[] = {"FLEXTENSOR_CONFIG=", long_rank,
                       "FLEXTENSOR_PROFILE_OUT={rank}{rank}{rank}{rank}{rank}{rank}", NULL};
    struct fs_config_errors e2 = {0};
    assert_int_equal(fs_config_load(&cfg, toolong, &e2), FS_ERR_CONFIG);
    assert_int_equal(e2.count, 1);
    assert_non_null(strstr(e2.msg[0], "FLEXTENSOR_PROFILE_OUT="));
    assert_non_null(strstr(e2.msg[0], "too long once {rank} and {pid} are replaced"));
}

static void test_env_value_errors(void **state)
{
    (void)state;
    char *envp[] = {
        "FLEXTENSOR_CONFIG=",
        "FLEXTENSOR_GPU_MEMORY_LIMIT=8XB",
        "FLEXTENSOR_DISCOVERY_ITERS=0",
        "FLEXTENSOR_STRATEGY=fast",
        "FLEXTENSOR_ENABLED=maybe",
        "FLEXTENSOR_PROFILING_ITERS=lots",
        "FLEXTENSOR_MIN_OFFLOAD_BYTES=99999999TiB",
        NULL,
    };
    struct fs_config cfg;
    struct fs_config_errors errs = {0};
    assert_int_equal(fs_config_load(&cfg, envp, &errs), FS_ERR_CONFIG);
    expect_count(&errs, 6);
    assert_true(errs_have(&errs,
                          "FLEXTENSOR_GPU_MEMORY_LIMIT=8XB: not a size; use a byte count with an "
                          "optional unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB) or a percentage "
                          "of the device such as 60%",
                          NULL));
    assert_true(errs_have(&errs,
                          "FLEXTENSOR_DISCOVERY_ITERS=0: out of range; use a value from 1 to 1000",
                          NULL));
    assert_true(errs_have(&errs,
                          "FLEXTENSOR_STRATEGY=fast: unknown choice; use one of adaptive, "
                          "knapsack, greedy, global",
                          NULL));
    assert_true(errs_have(&errs,
                          "FLEXTENSOR_ENABLED=maybe: not a boolean; use 1/0, true/false, yes/no "
                          "or on/off",
                          NULL));
    assert_true(errs_have(&errs, "FLEXTENSOR_PROFILING_ITERS=lots: not a whole number",
                          "from 0 to 10000", NULL));
    assert_true(errs_have(&errs, "FLEXTENSOR_MIN_OFFLOAD_BYTES=99999999TiB: out of range",
                          "from 0B to 64TiB", NULL));
    /* The invalid values changed nothing. */
    struct fs_config def;
    fs_config_defaults(&def);
    for (int i = 0; i < FS_P_COUNT; i++) {
        assert_int_equal(cfg.v[i].src, FS_SRC_DEFAULT);
        assert_string_equal(cfg.v[i].text, def.v[i].text);
    }
}

static void test_env_unknown_with_suggestion(void **state)
{
    (void)state;
    char *envp[] = {"FLEXTENSOR_CONFIG=", "FLEXTENSOR_GPU_MEMORY_LIMT=8GiB",
                    "FLEXTENSOR_STRATEGI=greedy", "FLEXTENSOR_CONFG=/x.ini", NULL};
    struct fs_config cfg;
    struct fs_config_errors errs = {0};
    assert_int_equal(fs_config_load(&cfg, envp, &errs), FS_ERR_CONFIG);
    expect_count(&errs, 3);
    assert_string_equal(errs.msg[0], "FLEXTENSOR_GPU_MEMORY_LIMT is not a flexshim setting; did "
                                     "you mean FLEXTENSOR_GPU_MEMORY_LIMIT?");
    assert_true(errs_have(&errs, "FLEXTENSOR_STRATEGI is not a flexshim setting",
                          "did you mean FLEXTENSOR_STRATEGY?", NULL));
    assert_true(errs_have(&errs, "FLEXTENSOR_CONFG is not a flexshim setting",
                          "did you mean FLEXTENSOR_CONFIG?", NULL));
    /* The misspelt setting is not applied. */
    assert_true(cfg.v[FS_P_GPU_MEMORY_LIMIT].pct == 100.0);

    assert_string_equal(fs_param_suggest("FLEXTENSOR_LOG_LEVL", true), "FLEXTENSOR_LOG_LEVEL");
    assert_string_equal(fs_param_suggest("FLEXTENSOR_log_level", true), "FLEXTENSOR_LOG_LEVEL");
    assert_string_equal(fs_param_suggest("pin_mod", false), "pin_mode");
    assert_string_equal(fs_param_suggest("gpu_memry_limit", false), "gpu_memory_limit");
    assert_null(fs_param_suggest("config", false)); /* FLEXTENSOR_CONFIG has no INI key */
    assert_null(fs_param_suggest("FLEXTENSOR_FOO", true));
    assert_null(fs_param_suggest("completely_unrelated", false));
}

static void test_env_unknown_without_suggestion(void **state)
{
    (void)state;
    char *envp[] = {"FLEXTENSOR_CONFIG=", "FLEXTENSOR_FOO=1", "PATH=/usr/bin",
                    "flextensor_enabled=0", "FLEXTENSOR_NOEQUALS", "MY_FLEXTENSOR_X=1", NULL};
    struct fs_config cfg;
    struct fs_config_errors errs = {0};
    assert_int_equal(fs_config_load(&cfg, envp, &errs), FS_ERR_CONFIG);
    expect_count(&errs, 1);
    assert_string_equal(errs.msg[0], "FLEXTENSOR_FOO is not a flexshim setting; run "
                                     "'flexshim-profile config --dump' for the list");
    assert_int_equal(fs_config_u64(&cfg, FS_P_ENABLED), 1);
}

static void test_env_applies_values(void **state)
{
    (void)state;
    char *envp[] = {"FLEXTENSOR_CONFIG=", "FLEXTENSOR_GPU_MEMORY_LIMIT= 8GiB ",
                    "FLEXTENSOR_LOG_LEVEL=Debug", "FLEXTENSOR_PROFILE=/tmp/p.json",
                    "FLEXTENSOR_ENABLED=off", NULL};
    struct fs_config cfg;
    struct fs_config_errors errs = {0};
    assert_int_equal(fs_config_load(&cfg, envp, &errs), FS_OK);
    expect_count(&errs, 0);
    assert_true(fs_config_bytes(&cfg, FS_P_GPU_MEMORY_LIMIT, 80 * FS_GIB) == 8 * FS_GIB);
    assert_string_equal(cfg.v[FS_P_GPU_MEMORY_LIMIT].text, "8GiB");
    assert_int_equal(fs_config_u64(&cfg, FS_P_LOG_LEVEL), 3);
    assert_string_equal(fs_config_str(&cfg, FS_P_PROFILE), "/tmp/p.json");
    assert_int_equal(fs_config_u64(&cfg, FS_P_ENABLED), 0);
    assert_int_equal(cfg.v[FS_P_ENABLED].src, FS_SRC_ENV);
    assert_int_equal(cfg.v[FS_P_STRATEGY].src, FS_SRC_DEFAULT);
    assert_string_equal(cfg.ini_path, "");

    /* fs_config_read_env on its own, and with no environment at all. */
    fs_config_defaults(&cfg);
    memset(&errs, 0, sizeof(errs));
    assert_int_equal(fs_config_read_env(&cfg, envp, &errs), FS_OK);
    assert_int_equal(cfg.v[FS_P_LOG_LEVEL].src, FS_SRC_ENV);
    assert_int_equal(fs_config_read_env(&cfg, NULL, &errs), FS_OK);
    assert_int_equal(fs_config_load(&cfg, (char *[]){"FLEXTENSOR_CONFIG=", NULL}, NULL), FS_OK);
}

/* ---- the INI file ----------------------------------------------------------------------- */

static void test_precedence_env_ini_default(void **state)
{
    (void)state;
    char path[64];
    fs_test_write_file(path, sizeof(path),
                       "# test\n"
                       "[flexshim]\n"
                       "gpu_memory_limit = 4GiB\n"
                       "strategy = greedy\n"
                       "log_level = info\n");
    char env_cfg[128];
    snprintf(env_cfg, sizeof(env_cfg), "FLEXTENSOR_CONFIG=%s", path);
    char *envp[] = {env_cfg, "FLEXTENSOR_GPU_MEMORY_LIMIT=60%", NULL};
    struct fs_config cfg;
    struct fs_config_errors errs = {0};
    int rc = fs_config_load(&cfg, envp, &errs);
    unlink(path);
    expect_count(&errs, 0);
    assert_int_equal(rc, FS_OK);
    assert_string_equal(cfg.ini_path, path);
    /* env over INI */
    assert_int_equal(cfg.v[FS_P_GPU_MEMORY_LIMIT].src, FS_SRC_ENV);
    assert_true(cfg.v[FS_P_GPU_MEMORY_LIMIT].pct == 60.0);
    /* INI over default, with the line */
    assert_int_equal(cfg.v[FS_P_STRATEGY].src, FS_SRC_INI);
    assert_int_equal(cfg.v[FS_P_STRATEGY].ini_line, 4);
    assert_int_equal(fs_config_u64(&cfg, FS_P_STRATEGY), 2);
    assert_int_equal(cfg.v[FS_P_LOG_LEVEL].src, FS_SRC_INI);
    assert_int_equal(cfg.v[FS_P_LOG_LEVEL].ini_line, 5);
    /* default */
    assert_int_equal(cfg.v[FS_P_DEVICE].src, FS_SRC_DEFAULT);
    assert_int_equal(fs_config_u64(&cfg, FS_P_DEVICE), 0);
}

static void test_ini_unknown_key(void **state)
{
    (void)state;
    char path[64];
    struct fs_config cfg;
    struct fs_config_errors errs;
    fs_config_defaults(&cfg);
    int rc = read_ini_text(&cfg,
                           "[flexshim]\n"
                           "strategy = greedy\n"
                           "gpu_memry_limit = 4GiB\n"
                           "frobnication = 3\n",
                           &errs, path, sizeof(path));
    assert_int_equal(rc, FS_ERR_CONFIG);
    expect_count(&errs, 2);
    char want[256];
    snprintf(want, sizeof(want),
             "%s:3: unknown key 'gpu_memry_limit' in [flexshim]; did you mean "
             "'gpu_memory_limit'?",
             path);
    assert_string_equal(errs.msg[0], want);
    snprintf(want, sizeof(want),
             "%s:4: unknown key 'frobnication' in [flexshim]; see 'flexshim-profile config "
             "--dump'",
             path);
    assert_string_equal(errs.msg[1], want);
    /* The valid line still counts. */
    assert_int_equal(fs_config_u64(&cfg, FS_P_STRATEGY), 2);
    assert_int_equal(cfg.v[FS_P_STRATEGY].ini_line, 2);
}

static void test_ini_unknown_section(void **state)
{
    (void)state;
    char path[64];
    struct fs_config cfg;
    struct fs_config_errors errs;
    fs_config_defaults(&cfg);
    int rc = read_ini_text(&cfg,
                           "[flexshim]\n"
                           "strategy = greedy\n"
                           "[other]\n"
                           "strategy = global\n"
                           "[flexshim]\n"
                           "device = 2\n"
                           "[empty]\n",
                           &errs, path, sizeof(path));
    assert_int_equal(rc, FS_ERR_CONFIG);
    expect_count(&errs, 2); /* one per section; its keys are not reported again */
    char want[256];
    snprintf(want, sizeof(want), "%s:3: unknown section [other]; flexshim reads only [flexshim]",
             path);
    assert_string_equal(errs.msg[0], want);
    snprintf(want, sizeof(want), "%s:7: unknown section [empty]", path);
    assert_non_null(strstr(errs.msg[1], want));
    /* Keys of the unknown section are not applied; a second [flexshim] is fine. */
    assert_int_equal(fs_config_u64(&cfg, FS_P_STRATEGY), 2);
    assert_int_equal(fs_config_u64(&cfg, FS_P_DEVICE), 2);
}

static void test_ini_key_outside_section(void **state)
{
    (void)state;
    char path[64];
    struct fs_config cfg;
    struct fs_config_errors errs;
    fs_config_defaults(&cfg);
    int rc = read_ini_text(&cfg,
                           "; comment\n"
                           "log_level = info\n"
                           "[flexshim]\n"
                           "device = 3\n",
                           &errs, path, sizeof(path));
    assert_int_equal(rc, FS_ERR_CONFIG);
    expect_count(&errs, 1);
    char want[256];
    snprintf(want, sizeof(want), "%s:2: key 'log_level' outside the [flexshim] section", path);
    assert_string_equal(errs.msg[0], want);
    assert_int_equal(cfg.v[FS_P_LOG_LEVEL].src, FS_SRC_DEFAULT);
    assert_int_equal(fs_config_u64(&cfg, FS_P_DEVICE), 3);
}

static void test_ini_malformed_lines(void **state)
{
    (void)state;
    char path[64];
    struct fs_config cfg;
    struct fs_config_errors errs;
    fs_config_defaults(&cfg);
    int rc = read_ini_text(&cfg,
                           "[flexshim]\n"
                           "device = 1\n"
                           "this is not a setting\n"
                           "[flexshim\n"
                           "= 5\n"
                           "log_level ; = debug\n"
                           "strategy = knapsack\n",
                           &errs, path, sizeof(path));
    assert_int_equal(rc, FS_ERR_CONFIG);
    expect_count(&errs, 4);
    for (int line = 3; line <= 6; line++) {
        char want[256];
        snprintf(want, sizeof(want), "%s:%d: not a 'key = value' line", path, line);
        assert_string_equal(errs.msg[line - 3], want);
    }
    /* Lines around the bad ones are read. */
    assert_int_equal(fs_config_u64(&cfg, FS_P_DEVICE), 1);
    assert_int_equal(fs_config_u64(&cfg, FS_P_STRATEGY), 1);
    assert_int_equal(cfg.v[FS_P_STRATEGY].ini_line, 7);
    assert_int_equal(cfg.v[FS_P_LOG_LEVEL].src, FS_SRC_DEFAULT);
}

static void test_ini_duplicate_key(void **state)
{
    (void)state;
    char path[64];
    struct fs_config cfg;
    struct fs_config_errors errs;
    fs_config_defaults(&cfg);
    int rc = read_ini_text(&cfg,
                           "[flexshim]\n"
                           "gpu_memory_limit = 8GiB\n"
                           "\n"
                           "GPU_Memory_Limit = 4GiB\n",
                           &errs, path, sizeof(path));
    assert_int_equal(rc, FS_ERR_CONFIG);
    expect_count(&errs, 1);
    char want[256];
    snprintf(want, sizeof(want), "%s:4: gpu_memory_limit is set twice (first on line 2)", path);
    assert_string_equal(errs.msg[0], want);
    assert_true(fs_config_u64(&cfg, FS_P_GPU_MEMORY_LIMIT) == 8 * FS_GIB);
    assert_int_equal(cfg.v[FS_P_GPU_MEMORY_LIMIT].ini_line, 2);
}

static void test_ini_bad_value(void **state)
{
    (void)state;
    char path[64];
    struct fs_config cfg;
    struct fs_config_errors errs;
    fs_config_defaults(&cfg);
    int rc = read_ini_text(&cfg,
                           "[flexshim]\n"
                           "gpu_memory_limit = 8XB\n"
                           "discovery_iters = 5000\n"
                           "enabled =\n",
                           &errs, path, sizeof(path));
    assert_int_equal(rc, FS_ERR_CONFIG);
    expect_count(&errs, 3);
    char want[512];
    snprintf(want, sizeof(want),
             "%s:2: gpu_memory_limit = 8XB: not a size; use a byte count with an optional unit "
             "(B, KiB, MiB, GiB, TiB, KB, MB, GB, TB) or a percentage of the device such as 60%%",
             path);
    assert_string_equal(errs.msg[0], want);
    snprintf(want, sizeof(want),
             "%s:3: discovery_iters = 5000: out of range; use a value from 1 to 1000", path);
    assert_string_equal(errs.msg[1], want);
    assert_true(errs_have(&errs, ":4: enabled = : not a boolean", NULL));
    assert_true(cfg.v[FS_P_GPU_MEMORY_LIMIT].pct == 100.0);
    assert_int_equal(cfg.v[FS_P_DISCOVERY_ITERS].src, FS_SRC_DEFAULT);
}

static void test_ini_syntax_variants(void **state)
{
    (void)state;
    char path[64];
    struct fs_config cfg;
    struct fs_config_errors errs;
    fs_config_defaults(&cfg);
    int rc = read_ini_text(&cfg,
                           "\xEF\xBB\xBF# BOM, comments, CRLF and case\r\n"
                           "  [ FlexShim ]  \r\n"
                           "; a comment\r\n"
                           "   STRATEGY=Global   \r\n"
                           "log_level : debug\r\n"
                           "device = 5 ; inline comment\r\n"
                           "profile = /a b/c;d.json\r\n"
                           "\r\n"
                           "  pin_mode = on_demand\r\n"
                           "    min_offload_bytes = 1MiB\n",
                           &errs, path, sizeof(path));
    expect_count(&errs, 0);
    assert_int_equal(rc, FS_OK);
    assert_int_equal(fs_config_u64(&cfg, FS_P_STRATEGY), 3);
    assert_string_equal(cfg.v[FS_P_STRATEGY].text, "Global");
    assert_int_equal(cfg.v[FS_P_STRATEGY].ini_line, 4);
    assert_int_equal(fs_config_u64(&cfg, FS_P_LOG_LEVEL), 3);
    assert_int_equal(fs_config_u64(&cfg, FS_P_DEVICE), 5);
    assert_int_equal(cfg.v[FS_P_DEVICE].ini_line, 6);
    assert_string_equal(fs_config_str(&cfg, FS_P_PROFILE), "/a b/c;d.json");
    /* Indented lines are settings of their own, not continuations. */
    assert_int_equal(fs_config_u64(&cfg, FS_P_PIN_MODE), 1);
    assert_int_equal(cfg.v[FS_P_PIN_MODE].ini_line, 9);
    assert_true(fs_config_u64(&cfg, FS_P_MIN_OFFLOAD_BYTES) == FS_MIB);
    assert_int_equal(cfg.v[FS_P_MIN_OFFLOAD_BYTES].ini_line, 10);
}

static void test_ini_long_lines(void **state)
{
    (void)state;
    char value[400], text[2048], path[64];
    memset(value, 'p', sizeof(value) - 1);
    value[0] = '/';
    value[sizeof(value) - 1] = '\0';
    char comment[600];
    memset(comment, 'c', sizeof(comment) - 1);
    comment[0] = '#';
    comment[sizeof(comment) - 1] = '\0';
    snprintf(text, sizeof(text),
             "[flexshim]\n%s\nprofile_out = %s\n%s long junk without equals sign\n"
             "device = 9\n",
             comment, value, value);
    struct fs_config cfg;
    struct fs_config_errors errs;
    fs_config_defaults(&cfg);
    int rc = read_ini_text(&cfg, text, &errs, path, sizeof(path));
    assert_int_equal(rc, FS_ERR_CONFIG);
    expect_count(&errs, 1);
    char want[128];
    snprintf(want, sizeof(want), "%s:4: not a 'key = value' line", path);
    assert_string_equal(errs.msg[0], want);
    assert_string_equal(fs_config_str(&cfg, FS_P_PROFILE_OUT), value);
    assert_int_equal(cfg.v[FS_P_PROFILE_OUT].ini_line, 3);
    assert_int_equal(fs_config_u64(&cfg, FS_P_DEVICE), 9);
    assert_int_equal(cfg.v[FS_P_DEVICE].ini_line, 5);
}

static void test_read_ini_missing_file(void **state)
{
    (void)state;
    struct fs_config cfg;
    struct fs_config_errors errs = {0};
    fs_config_defaults(&cfg);
    assert_int_equal(fs_config_read_ini(&cfg, "/nonexistent/dir/f.ini", &errs), FS_ERR_CONFIG);
    expect_count(&errs, 1);
    assert_string_equal(errs.msg[0],
                        "/nonexistent/dir/f.ini: cannot read the file (No such file or directory)");
    assert_string_equal(cfg.ini_path, "");
}

/* ---- loading ---------------------------------------------------------------------------- */

static void test_load_missing_config_file(void **state)
{
    (void)state;
    char *envp[] = {"FLEXTENSOR_CONFIG=/x/y.ini", "FLEXTENSOR_DEVICE=4", NULL};
    struct fs_config cfg;
    struct fs_config_errors errs = {0};
    assert_int_equal(fs_config_load(&cfg, envp, &errs), FS_ERR_CONFIG);
    expect_count(&errs, 1);
    assert_string_equal(errs.msg[0], "FLEXTENSOR_CONFIG=/x/y.ini: cannot read the file (No such "
                                     "file or directory); fix the path or unset "
                                     "FLEXTENSOR_CONFIG");
    assert_string_equal(cfg.ini_path, "");
    /* The environment is still applied. */
    assert_int_equal(fs_config_u64(&cfg, FS_P_DEVICE), 4);
}

static void test_load_empty_config_reads_nothing(void **state)
{
    (void)state;
    char dir[64], old[PATH_MAX];
    enter_tmpdir(dir, sizeof(dir), old, sizeof(old));
    write_named("flexshim.ini", "this file is broken\n[flexshim]\ndevice = 7\n");
    char *envp[] = {"FLEXTENSOR_CONFIG=", NULL};
    struct fs_config cfg;
    struct fs_config_errors errs = {0};
    int rc = fs_config_load(&cfg, envp, &errs);
    unlink("flexshim.ini");
    leave_tmpdir(dir, old);
    assert_int_equal(rc, FS_OK);
    expect_count(&errs, 0);
    assert_string_equal(cfg.ini_path, "");
    assert_int_equal(fs_config_u64(&cfg, FS_P_DEVICE), 0);
}

static void test_load_finds_cwd_file(void **state)
{
    (void)state;
    char dir[64], old[PATH_MAX];
    enter_tmpdir(dir, sizeof(dir), old, sizeof(old));
    write_named("flexshim.ini", "[flexshim]\ndevice = 7\n");
    /* Set even an XDG file up: ./flexshim.ini comes first. */
    assert_int_equal(mkdir("xdg", 0700), 0);
    assert_int_equal(mkdir("xdg/flexshim", 0700), 0);
    write_named("xdg/flexshim/flexshim.ini", "[flexshim]\ndevice = 8\n");
    char xdg[PATH_MAX + 32];
    snprintf(xdg, sizeof(xdg), "XDG_CONFIG_HOME=%s/xdg", dir);
    char *envp[] = {xdg, "HOME=/nonexistent", NULL};
    struct fs_config cfg;
    struct fs_config_errors errs = {0};
    int rc = fs_config_load(&cfg, envp, &errs);
    unlink("flexshim.ini");

    /* Without ./flexshim.ini, $XDG_CONFIG_HOME/flexshim/flexshim.ini. */
    struct fs_config cfg2;
    struct fs_config_errors errs2 = {0};
    int rc2 = fs_config_load(&cfg2, envp, &errs2);
    unlink("xdg/flexshim/flexshim.ini");
    rmdir("xdg/flexshim");
    rmdir("xdg");
    leave_tmpdir(dir, old);

    expect_count(&errs, 0);
    assert_int_equal(rc, FS_OK);
    assert_string_equal(cfg.ini_path, "./flexshim.ini");
    assert_int_equal(fs_config_u64(&cfg, FS_P_DEVICE), 7);
    assert_int_equal(cfg.v[FS_P_DEVICE].src, FS_SRC_INI);
    assert_int_equal(cfg.v[FS_P_DEVICE].ini_line, 2);

    expect_count(&errs2, 0);
    assert_int_equal(rc2, FS_OK);
    assert_non_null(strstr(cfg2.ini_path, "/xdg/flexshim/flexshim.ini"));
    assert_int_equal(fs_config_u64(&cfg2, FS_P_DEVICE), 8);
}

static void test_load_home_fallback_and_errors_in_default_file(void **state)
{
    (void)state;
    char dir[64], old[PATH_MAX];
    enter_tmpdir(dir, sizeof(dir), old, sizeof(old));
    assert_int_equal(mkdir("home", 0700), 0);
    assert_int_equal(mkdir("home/.config", 0700), 0);
    assert_int_equal(mkdir("home/.config/flexshim", 0700), 0);
    write_named("home/.config/flexshim/flexshim.ini", "log_level = info\n");
    char home[PATH_MAX + 32];
    snprintf(home, sizeof(home), "HOME=%s/home", dir);
    char *envp[] = {home, "XDG_CONFIG_HOME=", NULL};
    struct fs_config cfg;
    struct fs_config_errors errs = {0};
    int rc = fs_config_load(&cfg, envp, &errs);
    unlink("home/.config/flexshim/flexshim.ini");
    rmdir("home/.config/flexshim");
    rmdir("home/.config");
    rmdir("home");
    leave_tmpdir(dir, old);
    assert_int_equal(rc, FS_ERR_CONFIG);
    expect_count(&errs, 1);
    assert_true(errs_have(&errs, "/home/.config/flexshim/flexshim.ini:1: key 'log_level' outside "
                                 "the [flexshim] section",
                          NULL));
    assert_non_null(strstr(cfg.ini_path, "/home/.config/flexshim/flexshim.ini"));
}

static void test_load_keeps_valid_values(void **state)
{
    (void)state;
    char path[64];
    fs_test_write_file(path, sizeof(path),
                       "[flexshim]\n"
                       "device = 3\n"
                       "strategy = knapsack\n"
                       "bogus = 1\n");
    char env_cfg[128];
    snprintf(env_cfg, sizeof(env_cfg), "FLEXTENSOR_CONFIG=%s", path);
    /* An invalid env value leaves the INI value in place. */
    char *envp[] = {env_cfg, "FLEXTENSOR_DEVICE=99", "FLEXTENSOR_LOG_LEVEL=info", NULL};
    struct fs_config cfg;
    struct fs_config_errors errs = {0};
    int rc = fs_config_load(&cfg, envp, &errs);
    unlink(path);
    assert_int_equal(rc, FS_ERR_CONFIG);
    expect_count(&errs, 2);
    assert_true(errs_have(&errs, "FLEXTENSOR_DEVICE=99: out of range; use a value from 0 to 63",
                          NULL));
    assert_true(errs_have(&errs, ":4: unknown key 'bogus'", NULL));
    assert_int_equal(fs_config_u64(&cfg, FS_P_DEVICE), 3);
    assert_int_equal(cfg.v[FS_P_DEVICE].src, FS_SRC_INI);
    assert_int_equal(fs_config_u64(&cfg, FS_P_STRATEGY), 1);
    assert_int_equal(fs_config_u64(&cfg, FS_P_LOG_LEVEL), 2);
    assert_int_equal(cfg.v[FS_P_LOG_LEVEL].src, FS_SRC_ENV);
}

/* ---- output ----------------------------------------------------------------------------- */

static void test_dump_values_and_sources(void **state)
{
    (void)state;
    char path[64];
    fs_test_write_file(path, sizeof(path), "[flexshim]\n\nlog_level = info\n");
    char env_cfg[128];
    snprintf(env_cfg, sizeof(env_cfg), "FLEXTENSOR_CONFIG=%s", path);
    char *envp[] = {env_cfg, "FLEXTENSOR_GPU_MEMORY_LIMIT=8GiB", NULL};
    struct fs_config cfg;
    struct fs_config_errors errs = {0};
    assert_int_equal(fs_config_load(&cfg, envp, &errs), FS_OK);
    unlink(path);

    FILE *f = tmpfile();
    assert_non_null(f);
    fs_config_dump(&cfg, f);
    char out[8192], line[512], want[256];
    read_stream(f, out, sizeof(out));
    fclose(f);

    snprintf(want, sizeof(want), "# configuration file: %s\n", path);
    assert_true(!strncmp(out, want, strlen(want)));
    assert_true(find_line(out, "FLEXTENSOR_GPU_MEMORY_LIMIT", line, sizeof(line)));
    assert_non_null(strstr(line, " 8GiB "));
    assert_true(strlen(line) > 4 && !strcmp(line + strlen(line) - 4, " env"));
    assert_true(find_line(out, "FLEXTENSOR_LOG_LEVEL", line, sizeof(line)));
    snprintf(want, sizeof(want), " ini %s:3", path);
    assert_non_null(strstr(line, " info "));
    assert_non_null(strstr(line, want));
    assert_true(find_line(out, "FLEXTENSOR_STRATEGY", line, sizeof(line)));
    assert_non_null(strstr(line, " adaptive "));
    assert_non_null(strstr(line, " default"));

    /* One line per parameter, values in one column. */
    int lines = 0;
    long value_col = -1;
    for (char *p = strchr(out, '\n') + 1; *p; lines++) {
        char *nl = strchr(p, '\n');
        assert_non_null(nl);
        char *sp = strchr(p, ' ');
        while (*sp == ' ')
            sp++;
        if (value_col < 0)
            value_col = sp - p;
        assert_int_equal(sp - p, value_col);
        p = nl + 1;
    }
    assert_int_equal(lines, FS_P_COUNT);

    /* No file. */
    fs_config_defaults(&cfg);
    f = tmpfile();
    fs_config_dump(&cfg, f);
    read_stream(f, out, sizeof(out));
    fclose(f);
    assert_true(!strncmp(out, "# configuration file: none\n", 27));
}

static void test_write_ini_round_trip(void **state)
{
    (void)state;
    FILE *f = tmpfile();
    assert_non_null(f);
    fs_config_write_ini(f);
    static char text[32768];
    read_stream(f, text, sizeof(text));
    fclose(f);
    assert_true(strlen(text) < sizeof(text) - 1);
    assert_non_null(strstr(text, "\n[flexshim]\n"));
    assert_non_null(strstr(text, "FLEXTENSOR_CONFIG"));
    assert_non_null(strstr(text, "./flexshim.ini"));
    assert_non_null(strstr(text, "/etc/flexshim/flexshim.ini"));
    assert_non_null(strstr(text, "XDG_CONFIG_HOME"));
    assert_non_null(strstr(text, "override"));
    assert_non_null(strstr(text, "unknown key"));
    for (int i = 0; i < FS_P_COUNT; i++) {
        const struct fs_param_def *d = &fs_param_defs[i];
        char want[256];
        snprintf(want, sizeof(want), "\n# %s\n", d->doc);
        assert_non_null(strstr(text, want));
        snprintf(want, sizeof(want), "; environment: %s\n# %s =", d->env_name, d->ini_key);
        if (!strstr(text, want))
            fail_msg("no '%s' in the generated file", want);
    }

    /* As generated: changes nothing, no errors. */
    char path[64];
    struct fs_config cfg, def;
    struct fs_config_errors errs;
    fs_config_defaults(&cfg);
    fs_config_defaults(&def);
    assert_int_equal(read_ini_text(&cfg, text, &errs, path, sizeof(path)), FS_OK);
    expect_count(&errs, 0);
    for (int i = 0; i < FS_P_COUNT; i++)
        assert_int_equal(cfg.v[i].src, FS_SRC_DEFAULT);

    /* Every "# key = default" uncommented: still no errors, every key read, values = defaults. */
    static char active[32768];
    size_t o = 0;
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        size_t ll = nl ? (size_t)(nl - p + 1) : strlen(p);
        bool setting = false;
        for (int i = 0; i < FS_P_COUNT && !setting; i++) {
            size_t kl = strlen(fs_param_defs[i].ini_key);
            setting = !strncmp(p, "# ", 2) && !strncmp(p + 2, fs_param_defs[i].ini_key, kl) &&
                      p[2 + kl] == ' ' && p[3 + kl] == '=';
        }
        if (setting) {
            p += 2;
            ll -= 2;
        }
        memcpy(active + o, p, ll);
        o += ll;
        p += ll;
    }
    active[o] = '\0';
    fs_config_defaults(&cfg);
    int rc = read_ini_text(&cfg, active, &errs, path, sizeof(path));
    expect_count(&errs, 0);
    assert_int_equal(rc, FS_OK);
    for (int i = 0; i < FS_P_COUNT; i++) {
        assert_int_equal(cfg.v[i].src, FS_SRC_INI);
        assert_true(cfg.v[i].u == def.v[i].u);
        assert_true(cfg.v[i].pct == def.v[i].pct);
        assert_string_equal(cfg.v[i].text, def.v[i].text);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_defaults_parse),
        cmocka_unit_test(test_table_names_unique_and_derived),
        cmocka_unit_test(test_table_docs_and_bounds),
        cmocka_unit_test(test_parse_size_units),
        cmocka_unit_test(test_parse_size_decimals_and_whitespace),
        cmocka_unit_test(test_parse_size_rejects),
        cmocka_unit_test(test_parse_size_percent),
        cmocka_unit_test(test_config_bytes),
        cmocka_unit_test(test_parse_bool),
        cmocka_unit_test(test_parse_int),
        cmocka_unit_test(test_parse_enum),
        cmocka_unit_test(test_parse_size_messages),
        cmocka_unit_test(test_parse_string_trim_and_failure),
        cmocka_unit_test(test_errors_cap),
        cmocka_unit_test(test_paths_per_rank),
        cmocka_unit_test(test_env_value_errors),
        cmocka_unit_test(test_env_unknown_with_suggestion),
        cmocka_unit_test(test_env_unknown_without_suggestion),
        cmocka_unit_test(test_env_applies_values),
        cmocka_unit_test(test_precedence_env_ini_default),
        cmocka_unit_test(test_ini_unknown_key),
        cmocka_unit_test(test_ini_unknown_section),
        cmocka_unit_test(test_ini_key_outside_section),
        cmocka_unit_test(test_ini_malformed_lines),
        cmocka_unit_test(test_ini_duplicate_key),
        cmocka_unit_test(test_ini_bad_value),
        cmocka_unit_test(test_ini_syntax_variants),
        cmocka_unit_test(test_ini_long_lines),
        cmocka_unit_test(test_read_ini_missing_file),
        cmocka_unit_test(test_load_missing_config_file),
        cmocka_unit_test(test_load_empty_config_reads_nothing),
        cmocka_unit_test(test_load_finds_cwd_file),
        cmocka_unit_test(test_load_home_fallback_and_errors_in_default_file),
        cmocka_unit_test(test_load_keeps_valid_values),
        cmocka_unit_test(test_dump_values_and_sources),
        cmocka_unit_test(test_write_ini_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
