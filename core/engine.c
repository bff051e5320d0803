#include "engine.h"

#include <string.h>

#include "fs.h"
#include "log.h"

static struct fs_config engine_cfg;
static bool engine_cfg_ready;
static bool engine_active;
static struct fs_engine_stats engine_stats;

#define STAT_ADD(field, n) __atomic_add_fetch(&engine_stats.field, (n), __ATOMIC_RELAXED)

static void apply_log_settings(const struct fs_config *cfg)
{
    fs_log_set_level((enum fs_log_level)fs_config_u64(cfg, FS_P_LOG_LEVEL));
    const char *file = fs_config_str(cfg, FS_P_LOG_FILE);
    if (fs_log_set_file(file) != FS_OK)
        FS_ERROR("FLEXTENSOR_LOG_FILE=%s: cannot open the file for appending; logging to stderr",
                 file);
}

int fs_engine_init(char *const *envp)
{
    struct fs_config_errors errs = {0};
    int rc = fs_config_load(&engine_cfg, envp, &errs);
    engine_cfg_ready = true;
    apply_log_settings(&engine_cfg);
    if (rc != FS_OK) {
        for (int i = 0; i < errs.count; i++)
            FS_ERROR("%s", errs.msg[i]);
        FS_ERROR("configuration error: the program runs unmanaged (no memory limit); fix the "
                 "setting above, then check with 'flexshim-profile config --check'");
        engine_active = false;
        return FS_ERR_CONFIG;
    }
    engine_active = fs_config_u64(&engine_cfg, FS_P_ENABLED) != 0;
    FS_INFO("flexshim loaded (%s)", engine_active ? "enabled" : "disabled by FLEXTENSOR_ENABLED=0");
    return FS_OK;
}

const struct fs_config *fs_engine_config(void)
{
    if (!engine_cfg_ready) {
        fs_config_defaults(&engine_cfg);
        engine_cfg_ready = true;
    }
    return &engine_cfg;
}

bool fs_engine_active(void)
{
    return engine_active;
}

int fs_engine_alloc(uint64_t size, uint64_t *ptr_out)
{
    (void)size;
    (void)ptr_out;
    return FS_ERR_UNSUPPORTED;
}

void fs_engine_note_passthrough(uint64_t size)
{
    STAT_ADD(passthrough_allocs, 1);
    STAT_ADD(passthrough_bytes, size);
}

int fs_engine_free(uint64_t ptr)
{
    (void)ptr;
    STAT_ADD(free_calls, 1);
    return FS_ERR_NOT_FOUND;
}

void fs_engine_get_stats(struct fs_engine_stats *out)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    memcpy(out, &engine_stats, sizeof(*out));
}

void fs_engine_shutdown(void)
{
    struct fs_engine_stats s;
    fs_engine_get_stats(&s);
    FS_INFO("allocations: %llu managed (%llu bytes), %llu passed through (%llu bytes); %llu frees",
            (unsigned long long)s.managed_allocs,
            (unsigned long long)s.managed_bytes, (unsigned long long)s.passthrough_allocs,
            (unsigned long long)s.passthrough_bytes, (unsigned long long)s.free_calls);
}
