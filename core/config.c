/* Configuration: the parameter table, value parsing, the INI reader, the environment reader,
 * --dump and the generated INI file. Everything here iterates over FS_PARAM_TABLE.
 *
 * Thread-compatible: the only global mutable state is the lower-case INI keys, filled once
 * (pthread_once, and from a constructor so the table is complete before main). */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "fs.h"

/* ---- the table -------------------------------------------------------------------------- */

#define FS_INI_KEY_MAX 48

#define FS_KEYLEN_CHECK_(name, ...)                                                                \
    _Static_assert(sizeof(#name) <= FS_INI_KEY_MAX, "parameter name too long: " #name);
FS_PARAM_TABLE(FS_KEYLEN_CHECK_)
#undef FS_KEYLEN_CHECK_

/* The INI keys are the names in lower case; the preprocessor cannot lower-case, so they are
 * filled once from the names (ini_keys_init). */
static char ini_keys[FS_P_COUNT][FS_INI_KEY_MAX];

const struct fs_param_def fs_param_defs[FS_P_COUNT] = {
#define FS_PARAM_DEF_(name_, type_, default_, min_, max_, choices_, doc_)                          \
    [FS_P_##name_] = {                                                                             \
        .name = #name_,                                                                            \
        .env_name = FS_ENV_PREFIX #name_,                                                          \
        .ini_key = ini_keys[FS_P_##name_],                                                         \
        .type = (type_),                                                                           \
        .default_text = (default_),                                                                \
        .min = (uint64_t)(min_),                                                                   \
        .max = (uint64_t)(max_),                                                                   \
        .choices = (choices_),                                                                     \
        .doc = (doc_),                                                                             \
    },
    FS_PARAM_TABLE(FS_PARAM_DEF_)
#undef FS_PARAM_DEF_
};

static pthread_once_t ini_keys_once = PTHREAD_ONCE_INIT;

static void ini_keys_fill(void)
{
    for (int i = 0; i < FS_P_COUNT; i++) {
        const char *n = fs_param_defs[i].name;
        size_t j = 0;
        for (; n[j] && j + 1 < FS_INI_KEY_MAX; j++)
            ini_keys[i][j] = (char)tolower((unsigned char)n[j]);
        ini_keys[i][j] = '\0';
    }
}

static void ini_keys_init(void)
{
    pthread_once(&ini_keys_once, ini_keys_fill);
}

__attribute__((constructor)) static void config_ctor(void)
{
    ini_keys_init();
}

/* ---- errors ----------------------------------------------------------------------------- */

static void errors_vadd(struct fs_config_errors *errs, const char *fmt, va_list ap)
{
    if (!errs || errs->count < 0 || errs->count >= FS_CONFIG_MAX_ERRORS)
        return;
    vsnprintf(errs->msg[errs->count], FS_CONFIG_ERROR_MAX, fmt, ap);
    errs->count++;
}

void fs_config_errors_add(struct fs_config_errors *errs, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    errors_vadd(errs, fmt, ap);
    va_end(ap);
}

/* Counts every error, including those past the cap of ERRS (which may be NULL). */
struct errsink {
    struct fs_config_errors *errs;
    int n;
};

__attribute__((format(printf, 2, 3))) static void sink_add(struct errsink *s, const char *fmt,
                                                           ...)
{
    va_list ap;
    va_start(ap, fmt);
    errors_vadd(s->errs, fmt, ap);
    va_end(ap);
    s->n++;
}

__attribute__((format(printf, 3, 4))) static void why_set(char *why, size_t len, const char *fmt,
                                                          ...)
{
    if (!why || !len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
}

/* A value or name quoted in a message: long ones are cut so the "what is accepted" part fits. */
#define CLIP_MAX 96
static const char *clip(const char *s, char *buf)
{
    size_t n = strlen(s);
    if (n < CLIP_MAX)
        return s;
    memcpy(buf, s, CLIP_MAX - 4);
    memcpy(buf + CLIP_MAX - 4, "...", 4);
    return buf;
}

static void strerror_text(int err, char *buf, size_t len)
{
    /* GNU strerror_r (we build with _GNU_SOURCE) returns the text, maybe not in BUF. */
    const char *t = strerror_r(err, buf, len);
    if (t != buf)
        snprintf(buf, len, "%s", t);
}

/* ---- lookup and suggestions ------------------------------------------------------------- */

int fs_param_find(const char *name)
{
    ini_keys_init();
    if (!name)
        return -1;
    for (int i = 0; i < FS_P_COUNT; i++) {
        const struct fs_param_def *d = &fs_param_defs[i];
        if (!strcasecmp(name, d->name) || !strcasecmp(name, d->env_name) ||
            !strcasecmp(name, d->ini_key))
            return i;
    }
    return -1;
}

#define LEV_MAX 128

/* Case-insensitive Levenshtein distance; strings of LEV_MAX characters or more are "far". */
static size_t levenshtein(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la >= LEV_MAX || lb >= LEV_MAX)
        return (size_t)-1;
    size_t prev[LEV_MAX + 1], cur[LEV_MAX + 1];
    for (size_t j = 0; j <= lb; j++)
        prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t cost = tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]);
            size_t best = prev[j - 1] + cost;
            if (prev[j] + 1 < best)
                best = prev[j] + 1;
            if (cur[j - 1] + 1 < best)
                best = cur[j - 1] + 1;
            cur[j] = best;
        }
        memcpy(prev, cur, (lb + 1) * sizeof(prev[0]));
    }
    return prev[lb];
}

/* Names are compared without the FLEXTENSOR_ prefix (env form), so the allowed distance,
 * max(2, strlen / 4), is measured on the part that can be misspelt. */
const char *fs_param_suggest(const char *name, bool env_form)
{
    ini_keys_init();
    if (!name)
        return NULL;
    const char *s = name;
    size_t plen = strlen(FS_ENV_PREFIX);
    if (env_form && !strncasecmp(name, FS_ENV_PREFIX, plen))
        s = name + plen;
    size_t limit = strlen(s) / 4;
    if (limit < 2)
        limit = 2;

    const char *best = NULL;
    size_t best_d = (size_t)-1;
    for (int i = 0; i < FS_P_COUNT; i++) {
        const struct fs_param_def *d = &fs_param_defs[i];
        size_t dist = levenshtein(s, env_form ? d->name : d->ini_key);
        if (dist < best_d) {
            best_d = dist;
            best = env_form ? d->env_name : d->ini_key;
        }
    }
    if (env_form) {
        size_t dist = levenshtein(s, FS_CONFIG_ENV + sizeof(FS_ENV_PREFIX) - 1);
        if (dist < best_d) {
            best_d = dist;
            best = FS_CONFIG_ENV;
        }
    }
    return best_d <= limit ? best : NULL;
}

/* ---- value parsing ---------------------------------------------------------------------- */

/* A decimal number: IP + FRAC / DEN, with at most 18 fraction digits kept (DEN <= 10^18). */
struct decnum {
    uint64_t ip, frac, den;
    bool overflow;
};

static const char *parse_dec(const char *p, struct decnum *n)
{
    memset(n, 0, sizeof(*n));
    n->den = 1;
    if (!isdigit((unsigned char)*p))
        return NULL;
    for (; isdigit((unsigned char)*p); p++) {
        unsigned dgt = (unsigned)(*p - '0');
        if (n->ip > (UINT64_MAX - dgt) / 10)
            n->overflow = true;
        else
            n->ip = n->ip * 10 + dgt;
    }
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p))
            return NULL;
        for (int kept = 0; isdigit((unsigned char)*p); p++) {
            if (kept < 18) {
                n->frac = n->frac * 10 + (uint64_t)(*p - '0');
                n->den *= 10;
                kept++;
            }
        }
    }
    return p;
}

enum { SZ_OK, SZ_BAD, SZ_RANGE };

static const struct {
    const char *unit;
    uint64_t mult;
} size_units[] = {
    {"", 1},
    {"b", 1},
    {"k", FS_KIB},
    {"kib", FS_KIB},
    {"kb", 1000ull},
    {"m", FS_MIB},
    {"mib", FS_MIB},
    {"mb", 1000ull * 1000},
    {"g", FS_GIB},
    {"gib", FS_GIB},
    {"gb", 1000ull * 1000 * 1000},
    {"t", FS_TIB},
    {"tib", FS_TIB},
    {"tb", 1000ull * 1000 * 1000 * 1000},
};

/* SZ_OK with *BYTES (and *PCT = 0), or with *PCT (and *BYTES = 0) for a percentage; SZ_BAD when
 * TEXT is not a size; SZ_RANGE when it overflows or a percentage is not in (0, 100]. NUM gets
 * the number as written (for exact percentages). */
static int parse_size_impl(const char *text, uint64_t *bytes, double *pct, bool allow_pct,
                           struct decnum *num)
{
    struct decnum n;
    const char *p = text;
    while (isspace((unsigned char)*p))
        p++;
    p = parse_dec(p, &n);
    if (!p)
        return SZ_BAD;
    while (*p == ' ' || *p == '\t')
        p++;
    const char *u = p;
    while (isalpha((unsigned char)*p) || *p == '%')
        p++;
    size_t ulen = (size_t)(p - u);
    while (isspace((unsigned char)*p))
        p++;
    if (*p)
        return SZ_BAD;
    if (num)
        *num = n;

    if (ulen == 1 && *u == '%') {
        if (!allow_pct)
            return SZ_BAD;
        if (n.overflow || n.ip > 100 || (n.ip == 100 && n.frac) || (n.ip == 0 && n.frac == 0))
            return SZ_RANGE;
        *pct = (double)n.ip + (double)n.frac / (double)n.den;
        *bytes = 0;
        return SZ_OK;
    }
    for (size_t i = 0; i < FS_ARRAY_LEN(size_units); i++) {
        if (strlen(size_units[i].unit) != ulen || strncasecmp(u, size_units[i].unit, ulen))
            continue;
        if (n.overflow)
            return SZ_RANGE;
        uint64_t m = size_units[i].mult;
        unsigned __int128 total =
            (unsigned __int128)n.ip * m + (unsigned __int128)n.frac * m / n.den;
        if (total > UINT64_MAX)
            return SZ_RANGE;
        *bytes = (uint64_t)total;
        if (pct)
            *pct = 0;
        return SZ_OK;
    }
    return SZ_BAD;
}

int fs_parse_size(const char *text, uint64_t *bytes, double *pct)
{
    if (!text || !bytes)
        return FS_ERR_INVALID;
    uint64_t b = 0;
    double p = 0;
    if (parse_size_impl(text, &b, &p, pct != NULL, NULL) != SZ_OK)
        return FS_ERR_INVALID;
    *bytes = b;
    if (pct)
        *pct = p;
    return FS_OK;
}

/* "64MiB", "0B", "1500B": the largest binary unit that divides the value exactly. */
static const char *size_text(uint64_t b, char *buf, size_t len)
{
    static const struct {
        const char *unit;
        uint64_t mult;
    } units[] = {{"TiB", FS_TIB}, {"GiB", FS_GIB}, {"MiB", FS_MIB}, {"KiB", FS_KIB}};
    if (b) {
        for (size_t i = 0; i < FS_ARRAY_LEN(units); i++) {
            if (b % units[i].mult == 0) {
                snprintf(buf, len, "%llu%s", (unsigned long long)(b / units[i].mult),
                         units[i].unit);
                return buf;
            }
        }
    }
    snprintf(buf, len, "%lluB", (unsigned long long)b);
    return buf;
}

static void choices_list(const char *choices, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (const char *c = choices; c && *c && o + 1 < len; c++) {
        if (*c == '|') {
            if (o + 2 >= len)
                break;
            buf[o++] = ',';
            buf[o++] = ' ';
        } else {
            buf[o++] = *c;
        }
    }
    buf[o < len ? o : len - 1] = '\0';
}

#define SIZE_UNITS_TEXT "(B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
#define PCT_RANGE_TEXT "a percentage from 0%% (exclusive) to 100%%"

/* What a malformed value of D should look like ("use ..."). */
static void accepted_form(const struct fs_param_def *d, char *buf, size_t len)
{
    char list[FS_VALUE_TEXT_MAX];
    switch (d->type) {
    case FS_PT_BOOL: snprintf(buf, len, "use 1/0, true/false, yes/no or on/off"); break;
    case FS_PT_INT:
        snprintf(buf, len, "use a value from %llu to %llu", (unsigned long long)d->min,
                 (unsigned long long)d->max);
        break;
    case FS_PT_SIZE:
        snprintf(buf, len, "use a byte count with an optional unit " SIZE_UNITS_TEXT);
        break;
    case FS_PT_SIZE_PCT:
        snprintf(buf, len,
                 "use a byte count with an optional unit " SIZE_UNITS_TEXT
                 " or a percentage of the device such as 60%%");
        break;
    case FS_PT_ENUM:
        choices_list(d->choices, list, sizeof(list));
        snprintf(buf, len, "use one of %s", list);
        break;
    case FS_PT_STRING:
    case FS_PT_PATH:
        snprintf(buf, len, "use at most %d characters", FS_VALUE_TEXT_MAX - 1);
        break;
    }
}

/* The bounds of D ("use a value from ... to ..."). */
static void accepted_range(const struct fs_param_def *d, char *buf, size_t len)
{
    char lo[32], hi[32];
    switch (d->type) {
    case FS_PT_SIZE:
        snprintf(buf, len, "use a value from %s to %s", size_text(d->min, lo, sizeof(lo)),
                 size_text(d->max, hi, sizeof(hi)));
        break;
    case FS_PT_SIZE_PCT:
        snprintf(buf, len, "use a value from %s to %s or " PCT_RANGE_TEXT,
                 size_text(d->min, lo, sizeof(lo)), size_text(d->max, hi, sizeof(hi)));
        break;
    default: accepted_form(d, buf, len); break;
    }
}

static const char *malformed_what(enum fs_param_type t)
{
    switch (t) {
    case FS_PT_BOOL: return "not a boolean";
    case FS_PT_INT: return "not a whole number";
    case FS_PT_SIZE:
    case FS_PT_SIZE_PCT: return "not a size";
    case FS_PT_ENUM: return "unknown choice";
    case FS_PT_STRING:
    case FS_PT_PATH: return "too long";
    }
    return "invalid";
}

static int fail_malformed(const struct fs_param_def *d, char *why, size_t why_len)
{
    char acc[FS_VALUE_TEXT_MAX + 64];
    accepted_form(d, acc, sizeof(acc));
    why_set(why, why_len, "%s; %s", malformed_what(d->type), acc);
    return FS_ERR_CONFIG;
}

static int fail_range(const struct fs_param_def *d, char *why, size_t why_len)
{
    char acc[FS_VALUE_TEXT_MAX + 64];
    accepted_range(d, acc, sizeof(acc));
    why_set(why, why_len, "out of range; %s", acc);
    return FS_ERR_CONFIG;
}

static bool parse_uint(const char *s, uint64_t *out, bool *overflow)
{
    uint64_t v = 0;
    *overflow = false;
    if (!isdigit((unsigned char)*s))
        return false;
    for (; *s; s++) {
        if (!isdigit((unsigned char)*s))
            return false;
        unsigned dgt = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - dgt) / 10)
            *overflow = true;
        else
            v = v * 10 + dgt;
    }
    *out = v;
    return true;
}

/* Index of TEXT in CHOICES ("a|b|c"), case-insensitive; -1 if absent. */
static int choice_index(const char *choices, const char *text)
{
    size_t tl = strlen(text);
    int idx = 0;
    for (const char *c = choices; c;) {
        const char *bar = strchr(c, '|');
        size_t cl = bar ? (size_t)(bar - c) : strlen(c);
        if (cl == tl && !strncasecmp(c, text, tl))
            return idx;
        idx++;
        c = bar ? bar + 1 : NULL;
    }
    return -1;
}

int fs_config_parse(enum fs_param_id id, const char *text, struct fs_value *out, char *why,
                    size_t why_len)
{
    if ((int)id < 0 || id >= FS_P_COUNT || !text || !out) {
        why_set(why, why_len, "invalid setting");
        return FS_ERR_CONFIG;
    }
    const struct fs_param_def *d = &fs_param_defs[id];
    struct fs_value v;
    memset(&v, 0, sizeof(v));
    v.src = FS_SRC_DEFAULT;

    while (isspace((unsigned char)*text))
        text++;
    size_t len = strlen(text);
    while (len && isspace((unsigned char)text[len - 1]))
        len--;
    if (len >= FS_VALUE_TEXT_MAX) {
        why_set(why, why_len, "too long; use at most %d characters", FS_VALUE_TEXT_MAX - 1);
        return FS_ERR_CONFIG;
    }
    memcpy(v.text, text, len);
    v.text[len] = '\0';
    if (!len && d->type != FS_PT_STRING && d->type != FS_PT_PATH)
        return fail_malformed(d, why, why_len);

    switch (d->type) {
    case FS_PT_BOOL: {
        static const char *const yes[] = {"1", "true", "yes", "on"};
        static const char *const no[] = {"0", "false", "no", "off"};
        bool found = false;
        for (size_t i = 0; i < FS_ARRAY_LEN(yes) && !found; i++) {
            if (!strcasecmp(v.text, yes[i])) {
                v.u = 1;
                found = true;
            } else if (!strcasecmp(v.text, no[i])) {
                v.u = 0;
                found = true;
            }
        }
        if (!found)
            return fail_malformed(d, why, why_len);
        break;
    }
    case FS_PT_INT: {
        bool overflow;
        if (!parse_uint(v.text, &v.u, &overflow))
            return fail_malformed(d, why, why_len);
        if (overflow || v.u < d->min || v.u > d->max)
            return fail_range(d, why, why_len);
        break;
    }
    case FS_PT_SIZE:
    case FS_PT_SIZE_PCT: {
        int r = parse_size_impl(v.text, &v.u, &v.pct, d->type == FS_PT_SIZE_PCT, NULL);
        if (r == SZ_BAD)
            return fail_malformed(d, why, why_len);
        if (r == SZ_RANGE || (v.pct == 0 && (v.u < d->min || v.u > d->max)))
            return fail_range(d, why, why_len);
        break;
    }
    case FS_PT_ENUM: {
        int idx = choice_index(d->choices, v.text);
        if (idx < 0)
            return fail_malformed(d, why, why_len);
        v.u = (uint64_t)idx;
        break;
    }
    case FS_PT_STRING:
    case FS_PT_PATH: break;
    }
    *out = v;
    return FS_OK;
}

/* ---- defaults and accessors ------------------------------------------------------------- */

void fs_config_defaults(struct fs_config *cfg)
{
    ini_keys_init();
    memset(cfg, 0, sizeof(*cfg));
    for (int i = 0; i < FS_P_COUNT; i++) {
        /* The table's defaults are checked by tests/unit/test_config.c. */
        (void)fs_config_parse((enum fs_param_id)i, fs_param_defs[i].default_text, &cfg->v[i],
                              NULL, 0);
        cfg->v[i].src = FS_SRC_DEFAULT;
    }
}

uint64_t fs_config_bytes(const struct fs_config *cfg, enum fs_param_id id, uint64_t device_total)
{
    if ((int)id < 0 || id >= FS_P_COUNT)
        return 0;
    const struct fs_value *v = &cfg->v[id];
    if (fs_param_defs[id].type != FS_PT_SIZE_PCT || !(v->pct > 0))
        return v->u;
    /* Exact from the text when it is the percentage stored; else from the double. */
    struct decnum n;
    uint64_t b;
    double p;
    if (parse_size_impl(v->text, &b, &p, true, &n) == SZ_OK && p == v->pct) {
        while (n.den > 1000000000000ull) { /* keeps the product below 2^128 */
            n.frac /= 10;
            n.den /= 10;
        }
        unsigned __int128 num = (unsigned __int128)n.ip * n.den + n.frac;
        return (uint64_t)((unsigned __int128)device_total * num / ((unsigned __int128)n.den * 100));
    }
    long double r = (long double)device_total * (long double)v->pct / 100.0L;
    if (r >= (long double)UINT64_MAX)
        return UINT64_MAX;
    return (uint64_t)r;
}

const char *fs_config_choice(const struct fs_config *cfg, enum fs_param_id id, char *buf,
                             size_t len)
{
    if (!buf || !len)
        return buf;
    buf[0] = '\0';
    if ((int)id < 0 || id >= FS_P_COUNT || fs_param_defs[id].type != FS_PT_ENUM)
        return buf;
    uint64_t want = cfg->v[id].u, idx = 0;
    for (const char *c = fs_param_defs[id].choices; c; idx++) {
        const char *bar = strchr(c, '|');
        size_t cl = bar ? (size_t)(bar - c) : strlen(c);
        if (idx == want) {
            snprintf(buf, len, "%.*s", (int)cl, c);
            break;
        }
        c = bar ? bar + 1 : NULL;
    }
    return buf;
}

/* ---- the INI file ----------------------------------------------------------------------- */

enum ini_section { SEC_NONE, SEC_OURS, SEC_OTHER };

struct ini_ctx {
    struct fs_config *cfg;
    const char *path;
    FILE *f;
    struct errsink *sink;
    char *line; /* getline buffer */
    size_t cap;
    int lineno;
    int read_errno;            /* set when reading failed */
    bool line_done;            /* the reader fully handled the current line: the handler skips it */
    enum ini_section sec;
    int first_line[FS_P_COUNT];                /* where each key was set, 0 = not yet */
    int bad_lines[FS_CONFIG_MAX_ERRORS];       /* lines already reported as malformed */
    int n_bad;
};

/* inih's rule: the first of CHARS, or an inline ';' comment preceded by whitespace. */
static char *find_chars_or_comment(char *s, const char *chars)
{
    bool was_space = false;
    while (*s && (!chars || !strchr(chars, *s)) && !(was_space && *s == ';')) {
        was_space = isspace((unsigned char)*s);
        s++;
    }
    return s;
}

static char *rstrip(char *s)
{
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

static char *lskip(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    return s;
}

static void ini_malformed(struct ini_ctx *c, int line)
{
    sink_add(c->sink, "%s:%d: not a 'key = value' line", c->path, line);
    if (c->n_bad < (int)FS_ARRAY_LEN(c->bad_lines))
        c->bad_lines[c->n_bad++] = line;
}

static bool ini_reported(const struct ini_ctx *c, int line)
{
    if (c->n_bad == (int)FS_ARRAY_LEN(c->bad_lines))
        return true; /* too many to track: the error list is full anyway */
    for (int i = 0; i < c->n_bad; i++)
        if (c->bad_lines[i] == line)
            return true;
    return false;
}

static void ini_apply(struct ini_ctx *c, const char *key, const char *value)
{
    char cbuf[CLIP_MAX], vbuf[CLIP_MAX];
    if (!*key) {
        ini_malformed(c, c->lineno);
        return;
    }
    if (c->sec == SEC_OTHER)
        return; /* the section was reported once */
    if (c->sec == SEC_NONE) {
        sink_add(c->sink, "%s:%d: key '%s' outside the [" FS_INI_SECTION "] section", c->path,
                 c->lineno, clip(key, cbuf));
        return;
    }
    int id = -1;
    for (int i = 0; i < FS_P_COUNT && id < 0; i++)
        if (!strcasecmp(key, fs_param_defs[i].ini_key))
            id = i;
    if (id < 0) {
        const char *sug = fs_param_suggest(key, false);
        if (sug)
            sink_add(c->sink,
                     "%s:%d: unknown key '%s' in [" FS_INI_SECTION "]; did you mean '%s'?",
                     c->path, c->lineno, clip(key, cbuf), sug);
        else
            sink_add(c->sink,
                     "%s:%d: unknown key '%s' in [" FS_INI_SECTION
                     "]; see 'flexshim-profile config --dump'",
                     c->path, c->lineno, clip(key, cbuf));
        return;
    }
    const struct fs_param_def *d = &fs_param_defs[id];
    if (c->first_line[id]) {
        sink_add(c->sink, "%s:%d: %s is set twice (first on line %d)", c->path, c->lineno,
                 d->ini_key, c->first_line[id]);
        return;
    }
    c->first_line[id] = c->lineno;
    struct fs_value v;
    char why[FS_CONFIG_ERROR_MAX];
    if (fs_config_parse((enum fs_param_id)id, value, &v, why, sizeof(why)) != FS_OK) {
        sink_add(c->sink, "%s:%d: %s = %s: %s", c->path, c->lineno, d->ini_key,
                 clip(value, vbuf), why);
        return;
    }
    v.src = FS_SRC_INI;
    v.ini_line = c->lineno;
    c->cfg->v[id] = v;
}

/* inih's reader: one line per call, so c->lineno is the line the handler is called for. Lines
 * are passed on without leading whitespace (which also keeps inih's multi-line continuation
 * from merging lines). Sections and malformed lines are checked here, because inih does not
 * call the handler for a section without keys; lines too long for inih's buffer are handled
 * here too, and inih gets an empty line in their place. */
static char *ini_read_line(char *str, int num, void *stream)
{
    struct ini_ctx *c = stream;
    errno = 0;
    ssize_t n = getline(&c->line, &c->cap, c->f);
    if (n < 0) {
        if (ferror(c->f))
            c->read_errno = errno ? errno : EIO;
        return NULL;
    }
    c->lineno++;
    c->line_done = false;
    char *s = c->line;
    if (c->lineno == 1 && !strncmp(s, "\xEF\xBB\xBF", 3))
        s += 3;
    s = lskip(rstrip(s));
    bool fits = strlen(s) + 1 <= (size_t)num;

    if (*s == '\0' || *s == ';' || *s == '#') {
        /* blank or comment */
    } else if (*s == '[') {
        char *end = find_chars_or_comment(s + 1, "]");
        if (*end != ']') {
            ini_malformed(c, c->lineno);
            c->line_done = true;
        } else {
            char name[FS_VALUE_TEXT_MAX], cbuf[CLIP_MAX];
            size_t nl = (size_t)(end - (s + 1));
            if (nl >= sizeof(name))
                nl = sizeof(name) - 1;
            memcpy(name, s + 1, nl);
            name[nl] = '\0';
            char *nm = lskip(rstrip(name));
            if (!strcasecmp(nm, FS_INI_SECTION)) {
                c->sec = SEC_OURS;
            } else {
                c->sec = SEC_OTHER;
                sink_add(c->sink,
                         "%s:%d: unknown section [%s]; flexshim reads only [" FS_INI_SECTION "]",
                         c->path, c->lineno, clip(nm, cbuf));
            }
        }
    } else {
        char *sep = find_chars_or_comment(s, "=:");
        if (*sep != '=' && *sep != ':') {
            ini_malformed(c, c->lineno);
            c->line_done = true;
        } else if (!fits) {
            /* Split as inih would: key, then the value without an inline comment. */
            char *value = lskip(sep + 1);
            *find_chars_or_comment(value, NULL) = '\0';
            rstrip(value);
            *sep = '\0';
            ini_apply(c, rstrip(s), value);
            c->line_done = true;
        }
    }
    if (!fits) {
        c->line_done = true;
        str[0] = '\0';
        return str;
    }
    memcpy(str, s, strlen(s) + 1);
    return str;
}

static int ini_handler_cb(void *user, const char *section, const char *name, const char *value)
{
    struct ini_ctx *c = user;
    (void)section; /* the reader tracks sections (names are compared case-insensitively) */
    if (!c->line_done)
        ini_apply(c, name, value ? value : "");
    return 1; /* errors are reported here; inih's error return means a syntax error only */
}

static void read_ini_stream(struct fs_config *cfg, const char *path, FILE *f, struct errsink *s)
{
    ini_keys_init();
    struct ini_ctx c;
    memset(&c, 0, sizeof(c));
    c.cfg = cfg;
    c.path = path;
    c.f = f;
    c.sink = s;
    c.sec = SEC_NONE;
    snprintf(cfg->ini_path, sizeof(cfg->ini_path), "%s", path);

    int r = ini_parse_stream(ini_read_line, &c, ini_handler_cb, &c);
    if (r > 0 && !ini_reported(&c, r))
        ini_malformed(&c, r);
    else if (r < 0 && !c.read_errno)
        c.read_errno = ENOMEM;
    if (c.read_errno) {
        char eb[128];
        strerror_text(c.read_errno, eb, sizeof(eb));
        sink_add(s, "%s: cannot read the file (%s)", path, eb);
    }
    free(c.line);
}

static void read_ini_path(struct fs_config *cfg, const char *path, struct errsink *s,
                          bool from_env)
{
    FILE *f = fopen(path, "re");
    if (!f) {
        char eb[128];
        strerror_text(errno, eb, sizeof(eb));
        if (from_env)
            sink_add(s,
                     FS_CONFIG_ENV "=%s: cannot read the file (%s); fix the path or unset "
                                   FS_CONFIG_ENV,
                     path, eb);
        else
            sink_add(s, "%s: cannot read the file (%s)", path, eb);
        return;
    }
    read_ini_stream(cfg, path, f, s);
    fclose(f);
}

int fs_config_read_ini(struct fs_config *cfg, const char *path, struct fs_config_errors *errs)
{
    struct errsink s = {errs, 0};
    if (!cfg || !path)
        return FS_ERR_INVALID;
    read_ini_path(cfg, path, &s, false);
    return s.n ? FS_ERR_CONFIG : FS_OK;
}

/* ---- the environment -------------------------------------------------------------------- */

static const char *env_lookup(char *const *envp, const char *name)
{
    size_t nl = strlen(name);
    for (char *const *e = envp; e && *e; e++)
        if (!strncmp(*e, name, nl) && (*e)[nl] == '=')
            return *e + nl + 1;
    return NULL;
}

static void read_env_impl(struct fs_config *cfg, char *const *envp, struct errsink *s)
{
    size_t plen = strlen(FS_ENV_PREFIX);
    for (char *const *e = envp; e && *e; e++) {
        const char *entry = *e;
        if (strncmp(entry, FS_ENV_PREFIX, plen))
            continue;
        const char *eq = strchr(entry, '=');
        if (!eq)
            continue;
        size_t nl = (size_t)(eq - entry);
        if (nl == strlen(FS_CONFIG_ENV) && !strncmp(entry, FS_CONFIG_ENV, nl))
            continue; /* read by fs_config_load */
        int id = -1;
        for (int i = 0; i < FS_P_COUNT && id < 0; i++) {
            const char *en = fs_param_defs[i].env_name;
            if (strlen(en) == nl && !strncmp(entry, en, nl))
                id = i;
        }
        char name[CLIP_MAX], vbuf[CLIP_MAX];
        snprintf(name, sizeof(name), "%.*s", (int)(nl < CLIP_MAX - 1 ? nl : CLIP_MAX - 1),
                 entry);
        if (nl >= CLIP_MAX - 1)
            memcpy(name + CLIP_MAX - 4, "...", 4);
        if (id < 0) {
            const char *sug = fs_param_suggest(name, true);
            if (sug)
                sink_add(s, "%s is not a flexshim setting; did you mean %s?", name, sug);
            else
                sink_add(s,
                         "%s is not a flexshim setting; run 'flexshim-profile config --dump' "
                         "for the list",
                         name);
            continue;
        }
        struct fs_value v;
        char why[FS_CONFIG_ERROR_MAX];
        if (fs_config_parse((enum fs_param_id)id, eq + 1, &v, why, sizeof(why)) != FS_OK) {
            sink_add(s, "%s=%s: %s", name, clip(eq + 1, vbuf), why);
            continue;
        }
        v.src = FS_SRC_ENV;
        v.ini_line = 0;
        cfg->v[id] = v;
    }
}

int fs_config_read_env(struct fs_config *cfg, char *const *envp, struct fs_config_errors *errs)
{
    struct errsink s = {errs, 0};
    if (!cfg)
        return FS_ERR_INVALID;
    ini_keys_init();
    read_env_impl(cfg, envp, &s);
    return s.n ? FS_ERR_CONFIG : FS_OK;
}

/* ---- loading ---------------------------------------------------------------------------- */

/* {rank} and {pid} in FS_PT_PATH values, so each process of a distributed job gets its own
 * files. */
static void expand_paths(struct fs_config *cfg, char *const *envp, struct errsink *s)
{
    const char *rank = env_lookup(envp, "RANK");
    if (!rank || !*rank)
        rank = env_lookup(envp, "LOCAL_RANK");
    if (!rank || !*rank)
        rank = "0";
    char pid[24];
    snprintf(pid, sizeof(pid), "%ld", (long)getpid());
    for (int id = 0; id < FS_P_COUNT; id++) {
        if (fs_param_defs[id].type != FS_PT_PATH || !strchr(cfg->v[id].text, '{'))
            continue;
        char out[FS_VALUE_TEXT_MAX];
        size_t o = 0;
        bool fits = true;
        for (const char *p = cfg->v[id].text; *p && fits;) {
            const char *with = NULL;
            if (!strncmp(p, "{rank}", 6))
                with = rank, p += 6;
            else if (!strncmp(p, "{pid}", 5))
                with = pid, p += 5;
            size_t n = with ? strlen(with) : 1;
            fits = o + n < sizeof(out);
            if (fits)
                memcpy(out + o, with ? with : p++, n);
            o += n;
        }
        if (!fits) {
            sink_add(s, "%s=%s: too long once {rank} and {pid} are replaced; use at most %d "
                     "characters", fs_param_defs[id].env_name, cfg->v[id].text,
                     FS_VALUE_TEXT_MAX - 1);
            continue;
        }
        out[o] = '\0';
        memcpy(cfg->v[id].text, out, o + 1);
    }
}

int fs_config_load(struct fs_config *cfg, char *const *envp, struct fs_config_errors *errs)
{
    struct errsink s = {errs, 0};
    if (!cfg)
        return FS_ERR_INVALID;
    fs_config_defaults(cfg);

    const char *named = env_lookup(envp, FS_CONFIG_ENV);
    if (named) {
        if (*named)
            read_ini_path(cfg, named, &s, true);
    } else {
        char paths[3][sizeof(cfg->ini_path)];
        int np = 0;
        snprintf(paths[np++], sizeof(paths[0]), "./flexshim.ini");
        const char *xdg = env_lookup(envp, "XDG_CONFIG_HOME");
        const char *home = env_lookup(envp, "HOME");
        int w = -1;
        if (xdg && *xdg)
            w = snprintf(paths[np], sizeof(paths[0]), "%s/flexshim/flexshim.ini", xdg);
        else if (home && *home)
            w = snprintf(paths[np], sizeof(paths[0]), "%s/.config/flexshim/flexshim.ini", home);
        if (w > 0 && (size_t)w < sizeof(paths[0]))
            np++;
        snprintf(paths[np++], sizeof(paths[0]), "/etc/flexshim/flexshim.ini");
        for (int i = 0; i < np; i++) {
            FILE *f = fopen(paths[i], "re");
            if (!f) {
                if (errno == ENOENT || errno == ENOTDIR)
                    continue;
                char eb[128];
                strerror_text(errno, eb, sizeof(eb));
                sink_add(&s, "%s: cannot read the file (%s)", paths[i], eb);
                break;
            }
            read_ini_stream(cfg, paths[i], f, &s);
            fclose(f);
            break;
        }
    }
    read_env_impl(cfg, envp, &s);
    expand_paths(cfg, envp, &s);
    return s.n ? FS_ERR_CONFIG : FS_OK;
}

/* ---- output ----------------------------------------------------------------------------- */

void fs_config_dump(const struct fs_config *cfg, FILE *out)
{
    ini_keys_init();
    fprintf(out, "# configuration file: %s\n", cfg->ini_path[0] ? cfg->ini_path : "none");
    int name_w = 0, value_w = 15;
    for (int i = 0; i < FS_P_COUNT; i++) {
        int nl = (int)strlen(fs_param_defs[i].env_name);
        int vl = cfg->v[i].text[0] ? (int)strnlen(cfg->v[i].text, FS_VALUE_TEXT_MAX) : 2;
        if (nl > name_w)
            name_w = nl;
        if (vl > value_w && vl <= 40)
            value_w = vl;
    }
    for (int i = 0; i < FS_P_COUNT; i++) {
        const struct fs_value *v = &cfg->v[i];
        fprintf(out, "%-*s  %-*.*s  ", name_w, fs_param_defs[i].env_name, value_w,
                FS_VALUE_TEXT_MAX, v->text[0] ? v->text : "\"\"");
        switch (v->src) {
        case FS_SRC_ENV: fputs("env\n", out); break;
        case FS_SRC_INI:
            fprintf(out, "ini %s:%d\n", cfg->ini_path[0] ? cfg->ini_path : "?", v->ini_line);
            break;
        default: fputs("default\n", out); break;
        }
    }
}

/* "a whole number from 1 to 1000" and so on, for the generated INI file. */
static void describe_values(const struct fs_param_def *d, char *buf, size_t len)
{
    char lo[32], hi[32], list[FS_VALUE_TEXT_MAX];
    switch (d->type) {
    case FS_PT_BOOL: snprintf(buf, len, "1/0, true/false, yes/no or on/off"); break;
    case FS_PT_INT:
        snprintf(buf, len, "a whole number from %llu to %llu", (unsigned long long)d->min,
                 (unsigned long long)d->max);
        break;
    case FS_PT_SIZE:
        snprintf(buf, len, "a size from %s to %s, unit B, KiB, MiB, GiB, TiB, KB, MB, GB or TB",
                 size_text(d->min, lo, sizeof(lo)), size_text(d->max, hi, sizeof(hi)));
        break;
    case FS_PT_SIZE_PCT:
        snprintf(buf, len,
                 "a size from %s to %s, unit B, KiB, MiB, GiB, TiB, KB, MB, GB or TB, or a "
                 "percentage of the device's memory above 0%% and up to 100%%",
                 size_text(d->min, lo, sizeof(lo)), size_text(d->max, hi, sizeof(hi)));
        break;
    case FS_PT_ENUM:
        choices_list(d->choices, list, sizeof(list));
        snprintf(buf, len, "one of %s", list);
        break;
    case FS_PT_STRING:
        snprintf(buf, len, "text of up to %d characters", FS_VALUE_TEXT_MAX - 1);
        break;
    case FS_PT_PATH:
        snprintf(buf, len, "a file name of up to %d characters; {rank} becomes the process's RANK "
                 "(else LOCAL_RANK, else 0), {pid} its process id", FS_VALUE_TEXT_MAX - 1);
        break;
    }
}

void fs_config_write_ini(FILE *out)
{
    ini_keys_init();
    fputs("# flexshim configuration file (generated by 'flexshim-profile config --ini').\n"
          "#\n"
          "# flexshim, the LD_PRELOAD library that manages CUDA memory, reads one INI file at\n"
          "# startup: the file named by the " FS_CONFIG_ENV " environment variable (set it\n"
          "# empty to read no file at all), else the first of these that exists:\n"
          "#   ./flexshim.ini\n"
          "#   $XDG_CONFIG_HOME/flexshim/flexshim.ini (default ~/.config/flexshim/flexshim.ini)\n"
          "#   /etc/flexshim/flexshim.ini\n"
          "#\n"
          "# Every " FS_ENV_PREFIX "<KEY> environment variable overrides the key in this file,\n"
          "# e.g. " FS_ENV_PREFIX "GPU_MEMORY_LIMIT=8GiB overrides gpu_memory_limit.\n"
          "# Keys are case-insensitive. An unknown key or section, a key set twice or a\n"
          "# malformed value is an error: flexshim reports it and the program runs unmanaged.\n"
          "# 'flexshim-profile config --check' validates this file, '--dump' shows the values\n"
          "# in effect and where each came from.\n"
          "#\n"
          "# Every key below is commented out at its built-in default, so this file as\n"
          "# generated changes nothing.\n"
          "\n"
          "[" FS_INI_SECTION "]\n",
          out);
    for (int i = 0; i < FS_P_COUNT; i++) {
        const struct fs_param_def *d = &fs_param_defs[i];
        char vals[FS_VALUE_TEXT_MAX + 64];
        describe_values(d, vals, sizeof(vals));
        fprintf(out, "\n# %s\n# %s; environment: %s\n", d->doc, vals, d->env_name);
        if (d->default_text[0])
            fprintf(out, "# %s = %s\n", d->ini_key, d->default_text);
        else
            fprintf(out, "# %s =\n", d->ini_key);
    }
}
