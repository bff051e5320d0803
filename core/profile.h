/* A profile: what discovery and profiling learned about one iteration of the program, the link's
 * bandwidth, and the plan a strategy made from them. Strategies read it (read-only snapshot);
 * core/profile_io.c saves and loads it as JSON; flexshim-profile shows, checks, simulates and
 * traces it.
 *
 * Indices: allocations are numbered in allocation order (their identity across runs of a
 * deterministic program, together with their size); launches in the order they were queued within
 * one iteration, 0 .. nlaunches-1. */
#ifndef FS_PROFILE_H
#define FS_PROFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FS_PROFILE_SCHEMA_VERSION 1

struct fs_prof_alloc {
    uint64_t order;     /* allocation order in the process (identity across runs) */
    uint64_t size;      /* bytes as requested */
    uint64_t mapped;    /* bytes the allocation occupies on the device (granularity-rounded) */
    int first_use;      /* first launch of the iteration that references it, -1 if none */
    int last_use;       /* last such launch, -1 if none */
    bool unchanged;     /* measured while profiling: the iteration left its bytes as they were,
                         * so evicting it needs no write-back (false: not known, or changed) */
};

struct fs_prof_launch {
    uint64_t kernel;    /* stable hash of the kernel's name (0 for copies and memsets) */
    uint32_t stream;    /* small stream number, in order of first appearance */
    double duration_us; /* median kernel time over the profiling iterations */
    int nrefs;          /* allocations it references: refs[ref_start .. ref_start + nrefs) */
    int ref_start;
    double host_us;     /* median time the program spent on the host before queueing it, since
                         * the previous launch was queued (flexshim's own time left out); 0 when
                         * not measured */
};

/* Host-to-device transfer time by size on this machine's link: t(bytes) = latency + bytes / bw,
 * fitted to measurements, plus the measured points themselves. */
struct fs_bw_point {
    uint64_t bytes;
    double h2d_us, d2h_us;
};

struct fs_bw_model {
    double h2d_latency_us, h2d_bytes_per_us;
    double d2h_latency_us, d2h_bytes_per_us;
    /* the most bytes a kernel can read per microsecond of its duration: FS_READ_BOUND_COPIES x
     * the device-to-device copy rate measured with the link (a copy reads and writes each byte;
     * the factor leaves room for kernels that read faster); 0: not measured, then a kernel may
     * read all it references */
    double read_bytes_per_us;
    /* from the end of an unchanged allocation's last launch to the next copy into its room: the
     * engine's finisher gives the device block back and its mover begins the copy, making a
     * block first when the size differs (FS_ROOM_HANDOVER_US when recorded; 0 in profiles from
     * before it) */
    double handover_us;
    int npoints;
    struct fs_bw_point *points;
};

#define FS_READ_BOUND_COPIES 3.0
/* The hand-over measured in the 7b decode's run traces on the H200 (2026-12-04): 0.1 ms when a
 * cached block of the size is there, 0.8 ms when one is made; the plans take the middle. */
#define FS_ROOM_HANDOVER_US 600.0

/* One allocation's place in the plan. An offloaded allocation the iteration uses, with
 * prefetch_at = evict_after = -1, is read in place: it stays in host memory and its launches
 * read it there, over the link (worth it when they read a small part of it). */
struct fs_plan_entry {
    bool resident;    /* stays on the device for the whole iteration */
    int prefetch_at;  /* offloaded: its prefetch is issued when this launch is about to be queued
                       * (may be in the previous iteration: then prefetch_at > last_use, cyclic) */
    int evict_after;  /* offloaded: it may leave the device once this launch has completed */
};

struct fs_plan {
    char strategy[32];
    uint64_t budget;          /* device bytes the plan may use at any point */
    int nallocs;              /* == the profile's nallocs */
    struct fs_plan_entry *entries;
    double predicted_us;      /* step time the timeline model predicts */
    double predicted_stall_us;/* of which compute waits for transfers */
    uint64_t peak_bytes;      /* the most device bytes the plan holds at any launch */
    char planner[16];         /* the planning code whose model evaluated it (fs_planner_id);
                               * empty when unknown */
};

struct fs_profile {
    int version;
    char device_name[96];
    int cc_major, cc_minor;
    uint64_t device_total;
    int driver_version;       /* cuDriverGetVersion */
    char program[256];        /* the command that was profiled, for show */
    int nallocs;
    struct fs_prof_alloc *allocs;
    int nlaunches;
    struct fs_prof_launch *launches;
    int nrefs;
    int *refs;                /* allocation indices */
    char **kernel_names;      /* per launch, or NULL: names for show and trace */
    struct fs_bw_model bw;
    struct fs_plan plan;
};

void fs_profile_free(struct fs_profile *p);
void fs_plan_free(struct fs_plan *plan);

/* USES[a] (nallocs entries, zeroed by the caller): how many launches of the iteration reference
 * allocation a. */
void fs_profile_count_uses(const struct fs_profile *p, uint64_t *uses);

/* The mapped bytes of all of P's allocations together. */
uint64_t fs_profile_total_mapped(const struct fs_profile *p);

/* Save P as JSON (jansson) to PATH atomically (a temporary file in the same directory, then
 * rename). On failure writes one line to ERR saying what went wrong and returns FS_ERR_IO. */
int fs_profile_save(const char *path, const struct fs_profile *p, char *err, size_t errlen);

/* Load and validate PATH into OUT. On failure OUT is empty, ERR holds one line naming the file,
 * what is wrong and what to do ("... was written by schema version 2; this flexshim reads 1:
 * record it again"), and the result is FS_ERR_IO (unreadable), FS_ERR_CONFIG (not a valid
 * profile: corrupt JSON, wrong version, missing or inconsistent fields). */
int fs_profile_load(const char *path, struct fs_profile *out, char *err, size_t errlen);

/* Does the profile describe this program on this device? The device: name, compute capability
 * and total memory must be the profile's. The program: allocation ORDER of this run (counted
 * from 0 in allocation order) must have the size of the profile's allocation ORDER (identity =
 * order + size); allocations past the profile's are not in the plan and match. FS_OK on a match,
 * else FS_ERR_NOT_FOUND with ERR saying what differed ("allocation 17 is 20971520 bytes here,
 * 31457280 in the profile"). */
int fs_profile_match_device(const struct fs_profile *p, const char *device_name, int cc_major,
                            int cc_minor, uint64_t device_total, char *err, size_t errlen);
int fs_profile_match_alloc(const struct fs_profile *p, uint64_t order, uint64_t size, char *err,
                           size_t errlen);

#endif
