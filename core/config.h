/* Configuration: built-in defaults, then the INI file, then FLEXTENSOR_* environment variables.
 * Every parameter is declared once, in core/config_params.h. */
#ifndef FS_CONFIG_H
#define FS_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "config_params.h"

/* FS_PT_PATH: text in which {rank} and {pid} are replaced once everything is read (per-process
 * files under torchrun). */
enum fs_param_type {
    FS_PT_BOOL,
    FS_PT_INT,
    FS_PT_SIZE,
    FS_PT_SIZE_PCT,
    FS_PT_ENUM,
    FS_PT_STRING,
    FS_PT_PATH
};

enum fs_param_id {
#define FS_PARAM_ENUM_(name, ...) FS_P_##name,
    FS_PARAM_TABLE(FS_PARAM_ENUM_)
#undef FS_PARAM_ENUM_
        FS_P_COUNT
};

struct fs_param_def {
    const char *name;     /* GPU_MEMORY_LIMIT */
    const char *env_name; /* FLEXTENSOR_GPU_MEMORY_LIMIT */
    const char *ini_key;  /* gpu_memory_limit */
    enum fs_param_type type;
    const char *default_text;
    uint64_t min, max;
    const char *choices; /* "a|b|c" for enums, else NULL */
    const char *doc;
};

extern const struct fs_param_def fs_param_defs[FS_P_COUNT];

/* The environment variable naming the INI file, and the section the file must use. */
#define FS_CONFIG_ENV "FLEXTENSOR_CONFIG"
#define FS_ENV_PREFIX "FLEXTENSOR_"
#define FS_INI_SECTION "flexshim"

enum fs_source { FS_SRC_DEFAULT, FS_SRC_INI, FS_SRC_ENV };

#define FS_VALUE_TEXT_MAX 512

struct fs_value {
    uint64_t u;                    /* bool (0/1), int, size in bytes, enum index */
    double pct;                    /* FS_PT_SIZE_PCT given as a percentage: 0 < pct <= 100 */
    char text[FS_VALUE_TEXT_MAX];  /* the value as written (strings are used from here) */
    enum fs_source src;
    int ini_line;                  /* when src == FS_SRC_INI */
};

struct fs_config {
    struct fs_value v[FS_P_COUNT];
    char ini_path[4096]; /* the INI file that was read, "" if none */
};

#define FS_CONFIG_MAX_ERRORS 32
#define FS_CONFIG_ERROR_MAX 512

/* Errors found while loading: one line each, naming the setting, the value and what is accepted. */
struct fs_config_errors {
    int count;
    char msg[FS_CONFIG_MAX_ERRORS][FS_CONFIG_ERROR_MAX];
};

/* Fill CFG with the built-in defaults (cannot fail: the table's defaults are tested). */
void fs_config_defaults(struct fs_config *cfg);

/* Defaults, then the INI file (FLEXTENSOR_CONFIG, else the first default location that exists),
 * then the FLEXTENSOR_* variables of ENVP. Every problem is appended to ERRS; returns FS_OK or
 * FS_ERR_CONFIG when ERRS holds at least one error. CFG holds the valid part either way. */
int fs_config_load(struct fs_config *cfg, char *const *envp, struct fs_config_errors *errs);

/* Read one INI file into CFG (used by fs_config_load; exposed for tests). */
int fs_config_read_ini(struct fs_config *cfg, const char *path, struct fs_config_errors *errs);

/* Apply the FLEXTENSOR_* entries of ENVP, reporting unknown names with the closest valid one. */
int fs_config_read_env(struct fs_config *cfg, char *const *envp, struct fs_config_errors *errs);

/* Parse TEXT as a value of parameter ID. On failure writes "what is wrong; what is accepted" to
 * WHY (without the setting's name, which the caller adds) and returns FS_ERR_CONFIG. */
int fs_config_parse(enum fs_param_id id, const char *text, struct fs_value *out, char *why,
                    size_t why_len);

/* A byte count with an optional unit (B, K/KB/KiB ... T/TB/TiB; decimal units are powers of
 * 1000, binary ones of 1024), optionally a percentage ("60%") when PCT is non-NULL. */
int fs_parse_size(const char *text, uint64_t *bytes, double *pct);

/* Look a parameter up by its NAME, env name or INI key; returns -1 if unknown. */
int fs_param_find(const char *name);

/* The closest known parameter to a misspelt NAME in the same form (env or INI key), or NULL when
 * nothing is close. */
const char *fs_param_suggest(const char *name, bool env_form);

static inline uint64_t fs_config_u64(const struct fs_config *cfg, enum fs_param_id id)
{
    return cfg->v[id].u;
}

static inline const char *fs_config_str(const struct fs_config *cfg, enum fs_param_id id)
{
    return cfg->v[id].text;
}

/* A FS_PT_SIZE or FS_PT_SIZE_PCT value in bytes; percentages are taken of DEVICE_TOTAL. */
uint64_t fs_config_bytes(const struct fs_config *cfg, enum fs_param_id id, uint64_t device_total);

/* Text of the enum choice currently selected for ID. Writes into BUF. */
const char *fs_config_choice(const struct fs_config *cfg, enum fs_param_id id, char *buf,
                             size_t len);

/* `flexshim-profile config --dump`: every parameter, its value and where it came from. */
void fs_config_dump(const struct fs_config *cfg, FILE *out);

/* The documented INI file (conf/flexshim.ini is this output, checked by a test). */
void fs_config_write_ini(FILE *out);

void fs_config_errors_add(struct fs_config_errors *errs, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
