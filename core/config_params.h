/* THE parameter table: the only place a setting is declared.
 *
 * Each row: FS_PARAM(NAME, TYPE, DEFAULT, MIN, MAX, CHOICES, DOC)
 *   NAME     the setting; environment variable FLEXTENSOR_<NAME>, INI key <name> (lower case) in
 *            the [flexshim] section, enum constant FS_P_<NAME>.
 *   TYPE     FS_PT_BOOL, FS_PT_INT, FS_PT_SIZE (bytes with units), FS_PT_SIZE_PCT (bytes or a
 *            percentage of the device's memory), FS_PT_ENUM, FS_PT_STRING, FS_PT_PATH (a file
 *            name in which {rank} and {pid} are replaced).
 *   DEFAULT  the built-in value, written as a user would write it.
 *   MIN/MAX  bounds for INT and SIZE types (bytes); ignored otherwise.
 *   CHOICES  "a|b|c" for FS_PT_ENUM; the value is the index into this list.
 *   DOC      one line for --dump and conf/flexshim.ini.
 *
 * Validation, the environment and INI readers, `flexshim-profile config --dump` and the generated
 * conf/flexshim.ini all iterate over this table. Add a row here and nowhere else. */

#define FS_KIB (1024ull)
#define FS_MIB (1024ull * FS_KIB)
#define FS_GIB (1024ull * FS_MIB)
#define FS_TIB (1024ull * FS_GIB)

/* clang-format off */
#define FS_PARAM_TABLE(FS_PARAM)                                                                   \
FS_PARAM(ENABLED, FS_PT_BOOL, "1", 0, 1, NULL,                                                     \
    "Master switch; 0 passes every CUDA call straight through, unmanaged.")                        \
FS_PARAM(GPU_MEMORY_LIMIT, FS_PT_SIZE_PCT, "100%", 64 * FS_MIB, 64 * FS_TIB, NULL,                 \
    "Device memory that managed allocations may hold: bytes (8GiB, 512MB) or percent of the device (60%).") \
FS_PARAM(STRATEGY, FS_PT_ENUM, "adaptive", 0, 0, "adaptive|knapsack|greedy|global",                \
    "Planner that decides which allocations stay resident.")                                       \
FS_PARAM(OFFLOAD_MODE, FS_PT_ENUM, "prefetch", 0, 0, "prefetch|host_read|redirect",            \
    "prefetch: offloaded allocations are copied to the device ahead of their kernels and remapped there; host_read: they stay in pinned host memory and their kernels read them over the link (no copies, no remaps); redirect: they are copied into device blocks ahead of their kernels, whose pointers are rewritten to the copies (no remaps; a kernel reaching one through a pointer kept in device memory reads the host copy).") \
FS_PARAM(LATE_PREFETCH, FS_PT_ENUM, "wait", 0, 0, "wait|read_in_place",                          \
    "OFFLOAD_MODE=redirect: a launch that needs an allocation whose copy has not begun yet waits for it (wait), or reads the allocation from host memory and the copy is dropped (read_in_place: the link is used while the copies wait for room).") \
FS_PARAM(PLAN_HEADROOM, FS_PT_SIZE, "64MiB", 0, 64 * FS_TIB, NULL,                               \
    "Part of GPU_MEMORY_LIMIT the plan leaves unused: slack for the device blocks that copies move into, so fewer are made anew for another size (the default is at most 1/32 of the limit).") \
FS_PARAM(PROFILE, FS_PT_PATH,   "", 0, 0, NULL,                                                    \
    "Profile to start from (skips discovery and profiling when it matches the program).")          \
FS_PARAM(PROFILE_OUT, FS_PT_PATH,   "", 0, 0, NULL,                                                \
    "Where to save the profile once planning is done (empty: do not save).")                       \
FS_PARAM(ITERATION_KERNEL, FS_PT_STRING, "", 0, 0, NULL,                                           \
    "Part of the name of the kernel that starts each iteration, where finding it from the launches fails (empty: automatic).") \
FS_PARAM(DISCOVERY_ITERS, FS_PT_INT, "1", 1, 1000, NULL,                                           \
    "Iterations recorded to learn allocations and launches before profiling.")                     \
FS_PARAM(PROFILING_ITERS, FS_PT_INT, "5", 0, 10000, NULL,                                          \
    "Iterations timed (kernels, transfers) before the plan is made; medians are kept.")            \
FS_PARAM(LOG_LEVEL, FS_PT_ENUM, "warn", 0, 0, "error|warn|info|debug|trace",                       \
    "Least severe message that is written.")                                                       \
FS_PARAM(LOG_FILE, FS_PT_PATH,   "", 0, 0, NULL,                                                   \
    "File the log is appended to (empty: stderr).")                                                \
FS_PARAM(DEVICE, FS_PT_INT, "0", 0, 63, NULL,                                                      \
    "CUDA device whose allocations are managed (others pass through); unset: the device of the program's first allocation, so each process of a torchrun job manages its own.")                     \
FS_PARAM(PAUSE_TRACKING, FS_PT_BOOL, "1", 0, 1, NULL,                                              \
    "Stop watching kernel launches while the plan moves nothing and every allocation fits (the watch costs about 0.5 us a launch); if the program then outgrows the budget, watching resumes and the allocations made before stay on the device. 0: always watch.") \
FS_PARAM(LAUNCH_HOOK, FS_PT_ENUM, "cupti", 0, 0, "cupti|entry",                                   \
    "How kernel launches are watched: cupti (CUPTI's driver callbacks) or entry (wrappers of the driver's launch functions, handed out through dlsym and cuGetProcAddress: 0.21 instead of 0.32 us a watched launch on an H100; CUPTI keeps the copies and checks for two iterations of the plan that every launch came through a wrapper, else watches them itself).") \
FS_PARAM(PIN_MODE, FS_PT_ENUM, "background", 0, 0, "background|on_demand",                        \
    "Pinned host pool: grown ahead of need on a background thread (with a PROFILE of this program whose allocations do not all fit the budget, from the library's load on, while the program starts), or only when an eviction needs it.") \
FS_PARAM(MIN_OFFLOAD_BYTES, FS_PT_SIZE, "8MiB", 0, 64 * FS_TIB, NULL,                              \
    "Allocations smaller than this pass through and always stay on the device.")                   \
FS_PARAM(REMAP_SAFETY, FS_PT_ENUM, "strict", 0, 0, "strict|tracked",                           \
    "strict: a remap first waits for all queued GPU work (safe for pointers kept in device memory); tracked: only for launches that referenced the allocation.") \
FS_PARAM(COPY_WAIT, FS_PT_ENUM, "predict", 0, 0, "context|block|predict",                               \
    "How the engine waits on the events of its asynchronous moves (REMAP_SAFETY=tracked) and of the launches a move waits for: predict (sleep until a fifth of each copy's time on the profile's link model, at least 0.15 ms, is left, then wait as the context does; without a usable link model, as context; on an H100 the same step times as context with about a quarter less of the process's CPU) or context (as the CUDA context schedules, normally a spin: the soonest wake-up, a CPU core busy while copies run) or block (sleep until done: the core is free, each wait ends a little later; on an H100 the process used 5-8x less CPU at half the weights, steps from 2.5% faster to 0.65% slower). Stream and device synchronizes always follow the context.") \
FS_PARAM(WRITEBACK, FS_PT_ENUM, "fingerprint", 0, 0, "fingerprint|always",                       \
    "fingerprint: an eviction skips copying data back to host when a 128-bit fingerprint shows it unchanged since the host copy was made; always: copy every time.") \
FS_PARAM(MEMINFO_VIEW, FS_PT_ENUM, "budget", 0, 0, "budget|device",                            \
    "What cudaMemGetInfo reports: the budget (total = limit, free = what is left of it) or the device.") \
FS_PARAM(TIMING_REPORT, FS_PT_PATH,   "", 0, 0, NULL,                                              \
    "Write the timing report at exit to this file: remaps by kind with their driver time, moves and waits ('-': the log, at level info; empty: off).")                                  \
FS_PARAM(TRACE_OUT, FS_PT_PATH,   "", 0, 0, NULL,                                                  \
    "Write a Chrome/Perfetto trace of the engine's moves, remaps and waits (host clock, first 262144 spans) to this file at exit (empty: off).")
/* clang-format on */
