/* libfs_sampler.so: a benchmark-only sampling profiler of ONE thread, in the spans the program
 * marks. Preloaded into the benchmark (no perf or py-spy on the GPU machine), it samples the
 * stack of the thread that called fs_sampler_start, every interval of CLOCK_MONOTONIC while a span
 * is open, and writes the samples as folded stacks for bench/sample_report.py.
 *
 *     LD_PRELOAD=build/libfs_sampler.so python3 prog.py
 *
 *     import ctypes
 *     s = ctypes.CDLL(None)                 # the preloaded library's symbols
 *     s.fs_sampler_start(200)               # on the thread to sample; 200 us; 0 or -1
 *     for step in steps:
 *         s.fs_sampler_resume(); run(step); s.fs_sampler_pause()
 *     s.fs_sampler_write(b"out/shim-1.samples")
 *
 * From C: dlsym(RTLD_DEFAULT, "fs_sampler_start") and so on (the program need not link it).
 *
 * The samples are of wall time, not CPU time: a thread blocked in a span is sampled too, its leaf
 * frame the system call's wrapper (libc, vdso, the driver's library). A thread runnable but
 * waiting for a CPU is sampled once when it runs again; the expiries missed meanwhile are counted
 * ('# overruns'). Timers of the thread's CPU clock would count CPU time only, but fire on
 * scheduler ticks (1-4 ms), too coarse for a step.
 * The signal interrupts blocking system calls: SA_RESTART restarts most; those never restarted
 * (nanosleep, poll, epoll_wait, ...) return EINTR, which Python and the usual libraries retry.
 *
 * The handler calls backtrace() (libgcc's unwinder: it follows the unwind tables, through the
 * signal frame); it allocates nothing and takes no lock on glibc >= 2.35 with GCC >= 12
 * (_dl_find_object); older ones take the loader's lock. Unwinding stops at code without unwind
 * tables (JIT code, some hand-written assembly): such a sample keeps the frames up to there.
 * The leaf is the interrupted PC from the signal's context (x86_64), exact even where unwinding
 * skips it.
 *
 * Output (fs_sampler_write): '#' header lines, then "root;...;leaf COUNT" per distinct stack,
 * most samples first. Frames: LIB!SYMBOL where dladdr finds a dynamic symbol around the address,
 * or else the library file's own symbol table (.symtab: the functions a library built with
 * -fvisibility=hidden, like libflexshim.so, does not export; gone from stripped files); else
 * LIB+0xOFFSET (from the library's base: addr2line -e LIB 0xOFFSET), else ?+0xADDRESS. Symbols
 * are not demangled (c++filt does it). Return addresses (every frame but the leaf) are resolved
 * less 1, inside the call.
 *
 * FS_SAMPLER_BUFFER_MB (default 64): the sample buffer, allocated and touched by
 * fs_sampler_start; a sample takes 8 bytes a frame plus 8 (64 frames at most, the leaf's side
 * kept). A full buffer drops further samples and counts them ('# dropped'). fs_sampler_write writes
 * every sample since fs_sampler_start (it may be called again; sampling goes on after it). The
 * functions are for the sampled thread; a write from another thread is safe too. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <inttypes.h>
#include <link.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#ifndef sigev_notify_thread_id
#define sigev_notify_thread_id _sigev_un._tid
#endif

#define FS_SAMPLER_EXPORT __attribute__((visibility("default")))

FS_SAMPLER_EXPORT int fs_sampler_start(unsigned interval_us);
FS_SAMPLER_EXPORT void fs_sampler_resume(void);
FS_SAMPLER_EXPORT void fs_sampler_pause(void);
FS_SAMPLER_EXPORT int fs_sampler_write(const char *path);

enum {
    MAX_FRAMES = 64,          /* frames kept a sample, the leaf's side */
    UNWIND_FRAMES = MAX_FRAMES + 4, /* backtrace's: the handler, the trampoline, one to spare */
    PRIME_FRAMES = 8,
    DEFAULT_BUFFER_MB = 64,
};
#define TRUNCATED_BIT ((uintptr_t)1 << 16) /* in a sample's first word, beside its frame count */
#define FRAME_COUNT(word) ((uint32_t)((word) & (TRUNCATED_BIT - 1)))

static struct {
    int started;
    timer_t timer;
    unsigned interval_us;
    uintptr_t *buf; /* samples: [count | TRUNCATED_BIT] [leaf pc] [return address] ... */
    size_t cap;     /* words */
    atomic_size_t used;
    atomic_ulong samples, dropped, truncated, overruns;
    atomic_ullong handler_ns;
    atomic_int in_span;
    atomic_int priming;
    void *tramp; /* the signal trampoline's address, as backtrace reports it from the handler */
    void *prime_frames[PRIME_FRAMES];
    int prime_n;
    unsigned long spans;
    unsigned long long span_ns;
    struct timespec span_start;
} g;

static unsigned long long ns_between(const struct timespec *a, const struct timespec *b)
{
    return (unsigned long long)((b->tv_sec - a->tv_sec) * 1000000000LL + (b->tv_nsec - a->tv_nsec));
}

static void on_sigprof(int sig, siginfo_t *si, void *ucv)
{
    int saved_errno = errno;
    (void)sig;
    if (atomic_load_explicit(&g.priming, memory_order_acquire)) {
        g.prime_n = backtrace(g.prime_frames, PRIME_FRAMES);
        atomic_store_explicit(&g.priming, 0, memory_order_release);
        errno = saved_errno;
        return;
    }
    if (!atomic_load_explicit(&g.in_span, memory_order_acquire)) { /* pending from before pause */
        errno = saved_errno;
        return;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    void *raw[UNWIND_FRAMES];
    int n = backtrace(raw, UNWIND_FRAMES);
    /* raw[0] is this handler, then the trampoline, then the interrupted function. Without the
     * trampoline, unwinding did not get through the signal frame: nothing after is trusted. */
    int first = n;
    for (int k = 0; k < n && k < 4; k++)
        if (raw[k] == g.tramp) {
            first = k + 1;
            break;
        }
    uintptr_t pcs[MAX_FRAMES];
    int m = 0;
#if defined(__x86_64__)
    uintptr_t leaf = (uintptr_t)((ucontext_t *)ucv)->uc_mcontext.gregs[REG_RIP];
    pcs[m++] = leaf;
    if (first < n && (uintptr_t)raw[first] == leaf)
        first++;
#else
    (void)ucv;
#endif
    int truncated = n == UNWIND_FRAMES;
    for (int k = first; k < n; k++) {
        if (m == MAX_FRAMES) {
            truncated = 1;
            break;
        }
        pcs[m++] = (uintptr_t)raw[k];
    }
    size_t at = atomic_load_explicit(&g.used, memory_order_relaxed);
    if (at + 1 + (size_t)m > g.cap) {
        atomic_fetch_add_explicit(&g.dropped, 1, memory_order_relaxed);
    } else {
        g.buf[at] = (uintptr_t)m | (truncated ? TRUNCATED_BIT : 0);
        for (int k = 0; k < m; k++)
            g.buf[at + 1 + k] = pcs[k];
        atomic_store_explicit(&g.used, at + 1 + (size_t)m, memory_order_release);
        atomic_fetch_add_explicit(&g.samples, 1, memory_order_relaxed);
        if (truncated)
            atomic_fetch_add_explicit(&g.truncated, 1, memory_order_relaxed);
    }
    if (si && si->si_code == SI_TIMER && si->si_overrun > 0)
        atomic_fetch_add_explicit(&g.overruns, (unsigned long)si->si_overrun, memory_order_relaxed);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    atomic_fetch_add_explicit(&g.handler_ns, ns_between(&t0, &t1), memory_order_relaxed);
    errno = saved_errno;
}

/* Delivers SIGPROF once to this thread with g.priming set: backtrace runs once in a signal
 * handler, and the trampoline's address is learnt (the frame after the handler's). */
static int prime_in_handler(void)
{
    atomic_store(&g.priming, 1);
    g.prime_n = 0;
    if (raise(SIGPROF) != 0) {
        fprintf(stderr, "fs_sampler_start: raise(SIGPROF): %s\n", strerror(errno));
        return -1;
    }
    if (atomic_load(&g.priming)) {
        atomic_store(&g.priming, 0);
        fprintf(stderr, "fs_sampler_start: SIGPROF raised on this thread did not reach the "
                        "handler\n");
        return -1;
    }
    Dl_info self, f0;
    if (g.prime_n < 3 || !dladdr((void *)&g, &self) || !dladdr(g.prime_frames[0], &f0) ||
        f0.dli_fbase != self.dli_fbase) {
        fprintf(stderr, "fs_sampler_start: backtrace() in the signal handler gave %d frames, not "
                        "the handler, the trampoline and the interrupted code\n", g.prime_n);
        return -1;
    }
    g.tramp = g.prime_frames[1];
    return 0;
}

int fs_sampler_start(unsigned interval_us)
{
    if (g.started) {
        fprintf(stderr, "fs_sampler_start: already started\n");
        return -1;
    }
    if (interval_us < 10 || interval_us > 1000000) {
        fprintf(stderr, "fs_sampler_start: interval %u us is outside 10..1000000\n", interval_us);
        return -1;
    }
    size_t mb = DEFAULT_BUFFER_MB;
    const char *env = getenv("FS_SAMPLER_BUFFER_MB");
    if (env && *env) {
        char *end;
        unsigned long v = strtoul(env, &end, 10);
        if (*end || v < 1 || v > 65536) {
            fprintf(stderr, "fs_sampler_start: FS_SAMPLER_BUFFER_MB=%s is not a number of MiB "
                            "in 1..65536\n", env);
            return -1;
        }
        mb = v;
    }
    sigset_t cur;
    if (pthread_sigmask(SIG_BLOCK, NULL, &cur) == 0 && sigismember(&cur, SIGPROF)) {
        fprintf(stderr, "fs_sampler_start: SIGPROF is blocked on this thread\n");
        return -1;
    }
    struct sigaction old;
    if (sigaction(SIGPROF, NULL, &old) != 0) {
        fprintf(stderr, "fs_sampler_start: sigaction(SIGPROF): %s\n", strerror(errno));
        return -1;
    }
    if ((old.sa_flags & SA_SIGINFO) || (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN)) {
        fprintf(stderr, "fs_sampler_start: SIGPROF already has a handler (another profiler?)\n");
        return -1;
    }
    g.cap = mb * 1024 * 1024 / sizeof(uintptr_t);
    g.buf = malloc(g.cap * sizeof(uintptr_t));
    if (!g.buf) {
        fprintf(stderr, "fs_sampler_start: cannot allocate the %zu MiB sample buffer\n", mb);
        return -1;
    }
    for (size_t i = 0; i < g.cap * sizeof(uintptr_t); i += 4096) /* no page faults in the handler */
        ((volatile char *)g.buf)[i] = 0;
    void *probe[4];
    backtrace(probe, 4); /* its first call loads libgcc_s (malloc, dlopen): not in the handler */

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigprof;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGPROF, &sa, NULL) != 0) {
        fprintf(stderr, "fs_sampler_start: sigaction(SIGPROF): %s\n", strerror(errno));
        goto fail;
    }
    if (prime_in_handler() != 0)
        goto fail_handler;

    struct sigevent sev;
    memset(&sev, 0, sizeof sev);
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev.sigev_signo = SIGPROF;
    sev.sigev_notify_thread_id = (pid_t)syscall(SYS_gettid);
    if (timer_create(CLOCK_MONOTONIC, &sev, &g.timer) != 0) {
        fprintf(stderr, "fs_sampler_start: timer_create(CLOCK_MONOTONIC, SIGEV_THREAD_ID): %s\n",
                strerror(errno));
        goto fail_handler;
    }
    g.interval_us = interval_us;
    g.started = 1;
    return 0;

fail_handler:
    sigaction(SIGPROF, &old, NULL);
fail:
    free(g.buf);
    g.buf = NULL;
    g.cap = 0;
    return -1;
}

static void set_timer(unsigned interval_us)
{
    struct itimerspec its;
    memset(&its, 0, sizeof its);
    its.it_interval.tv_sec = interval_us / 1000000;
    its.it_interval.tv_nsec = (long)(interval_us % 1000000) * 1000;
    its.it_value = its.it_interval; /* the first sample one interval into the span */
    static int reported;
    if (timer_settime(g.timer, 0, &its, NULL) != 0 && !reported) {
        reported = 1;
        fprintf(stderr, "fs_sampler: timer_settime: %s\n", strerror(errno));
    }
}

/* A span opens; a resume inside an open span changes nothing. */
void fs_sampler_resume(void)
{
    if (!g.started || atomic_load(&g.in_span))
        return;
    g.spans++;
    clock_gettime(CLOCK_MONOTONIC, &g.span_start);
    atomic_store_explicit(&g.in_span, 1, memory_order_release);
    set_timer(g.interval_us);
}

/* The open span closes; the handler ignores a signal still pending. */
void fs_sampler_pause(void)
{
    if (!g.started || !atomic_load(&g.in_span))
        return;
    atomic_store_explicit(&g.in_span, 0, memory_order_release);
    set_timer(0);
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    g.span_ns += ns_between(&g.span_start, &now);
}

/* Stops the timer at exit (no file is written unless the program asks). */
__attribute__((destructor)) static void sampler_fini(void)
{
    if (g.started)
        fs_sampler_pause();
}

/* ---- writing: resolve each distinct address once, fold identical stacks ------------------- */

static const uint32_t *cmp_seq;     /* every sample's frame name ids, root first */
static const size_t *cmp_off;       /* sample i's ids start at cmp_seq[cmp_off[i]] */
static const uint32_t *cmp_len;
static char *const *cmp_names;

static int cmp_addr(const void *a, const void *b)
{
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_name_index(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    int c = strcmp(cmp_names[x], cmp_names[y]);
    return c ? c : (x < y ? -1 : x > y);
}

static int cmp_stack(uint32_t a, uint32_t b)
{
    const uint32_t *x = cmp_seq + cmp_off[a], *y = cmp_seq + cmp_off[b];
    uint32_t n = cmp_len[a] < cmp_len[b] ? cmp_len[a] : cmp_len[b];
    for (uint32_t k = 0; k < n; k++)
        if (x[k] != y[k])
            return x[k] < y[k] ? -1 : 1;
    return cmp_len[a] < cmp_len[b] ? -1 : cmp_len[a] > cmp_len[b];
}

static int cmp_sample(const void *a, const void *b)
{
    return cmp_stack(*(const uint32_t *)a, *(const uint32_t *)b);
}

struct group {
    uint32_t sample; /* a sample with the stack */
    unsigned long count;
};

static int cmp_group(const void *a, const void *b)
{
    const struct group *x = a, *y = b;
    if (x->count != y->count)
        return x->count > y->count ? -1 : 1;
    return cmp_stack(x->sample, y->sample);
}

/* ' ', ';' and control characters would break the folded format. */
static void sanitize(char *s)
{
    for (; *s; s++)
        if (*s == ' ' || *s == ';' || (unsigned char)*s < 0x20)
            *s = '_';
}

/* A loaded file's .symtab functions, by address, read from the file when an address in it has no
 * dynamic symbol. */
struct fsym {
    uintptr_t lo, hi;
    const char *name; /* in the file's mapping */
};
struct symtab {
    const void *fbase; /* the file's dli_fbase: the key */
    void *map;
    size_t map_len;
    struct fsym *v;
    size_t n;
};
static struct symtab *tabs;
static size_t ntabs;

static int cmp_fsym(const void *a, const void *b)
{
    const struct fsym *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Reads PATH's section headers and .symtab: every function with a size, at l_addr + st_value.
 * Leaves t empty where the file cannot be read, is not this machine's ELF or has no .symtab. */
static void read_symtab(struct symtab *t, const char *path, uintptr_t l_addr)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    struct stat st;
    void *m = MAP_FAILED;
    if (fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(ElfW(Ehdr)))
        m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return;
    t->map = m;
    t->map_len = (size_t)st.st_size;
    const char *base = m;
    size_t size = t->map_len;
    const ElfW(Ehdr) *eh = m;
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 ||
        eh->e_ident[EI_CLASS] != (sizeof(void *) == 8 ? ELFCLASS64 : ELFCLASS32) ||
        eh->e_shentsize != sizeof(ElfW(Shdr)) || eh->e_shoff == 0 || eh->e_shoff > size ||
        (size - eh->e_shoff) / sizeof(ElfW(Shdr)) < eh->e_shnum)
        return;
    const ElfW(Shdr) *sh = (const ElfW(Shdr) *)(base + eh->e_shoff);
    for (unsigned i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum)
            continue;
        const ElfW(Shdr) *ss = &sh[sh[i].sh_link];
        if (sh[i].sh_offset > size || sh[i].sh_size > size - sh[i].sh_offset ||
            ss->sh_offset > size || ss->sh_size == 0 || ss->sh_size > size - ss->sh_offset ||
            base[ss->sh_offset + ss->sh_size - 1] != 0)
            return;
        const ElfW(Sym) *sym = (const ElfW(Sym) *)(base + sh[i].sh_offset);
        const char *str = base + ss->sh_offset;
        size_t nsym = sh[i].sh_size / sizeof(ElfW(Sym)), n = 0;
        for (size_t k = 0; k < nsym; k++)
            n += ELF64_ST_TYPE(sym[k].st_info) == STT_FUNC && sym[k].st_size > 0 &&
                 sym[k].st_shndx != SHN_UNDEF && sym[k].st_name < ss->sh_size;
        if (n == 0 || !(t->v = malloc(n * sizeof *t->v)))
            return;
        for (size_t k = 0; k < nsym; k++)
            if (ELF64_ST_TYPE(sym[k].st_info) == STT_FUNC && sym[k].st_size > 0 &&
                sym[k].st_shndx != SHN_UNDEF && sym[k].st_name < ss->sh_size) {
                struct fsym *f = &t->v[t->n++];
                f->lo = l_addr + (uintptr_t)sym[k].st_value;
                f->hi = f->lo + (uintptr_t)sym[k].st_size;
                f->name = str + sym[k].st_name;
            }
        qsort(t->v, t->n, sizeof *t->v, cmp_fsym);
        return;
    }
}

/* The .symtab function around addr in the file of info (read once a file), or NULL. */
static const struct fsym *symtab_find(uintptr_t addr, const Dl_info *info)
{
    struct symtab *t = NULL;
    for (size_t i = 0; i < ntabs && !t; i++)
        if (tabs[i].fbase == info->dli_fbase)
            t = &tabs[i];
    if (!t) {
        struct symtab *more = realloc(tabs, (ntabs + 1) * sizeof *tabs);
        if (!more)
            return NULL;
        tabs = more;
        t = &tabs[ntabs++];
        memset(t, 0, sizeof *t);
        t->fbase = info->dli_fbase;
        struct link_map *lm = NULL;
        Dl_info again;
        if (dladdr1((void *)addr, &again, (void **)&lm, RTLD_DL_LINKMAP) && lm) /* main: "" */
            read_symtab(t, *lm->l_name ? lm->l_name : "/proc/self/exe", (uintptr_t)lm->l_addr);
    }
    size_t lo = 0, hi = t->n; /* the last symbol starting at or below addr */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->v[mid].lo <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    /* Nested or aliased symbols: the nearest below that still covers addr. */
    for (size_t i = lo; i > 0 && lo - i < 8; i--)
        if (addr < t->v[i - 1].hi)
            return &t->v[i - 1];
    return NULL;
}

static void symtabs_free(void)
{
    for (size_t i = 0; i < ntabs; i++) {
        free(tabs[i].v);
        if (tabs[i].map)
            munmap(tabs[i].map, tabs[i].map_len);
    }
    free(tabs);
    tabs = NULL;
    ntabs = 0;
}

static char *name_of(uintptr_t addr, const char *exe, uintptr_t *lo, uintptr_t *hi)
{
    Dl_info info;
    const ElfW(Sym) *sym = NULL;
    const struct fsym *fs;
    char *s = NULL;
    int r;
    *lo = *hi = 0;
    if (dladdr1((void *)addr, &info, (void **)&sym, RTLD_DL_SYMENT) && info.dli_fname) {
        const char *path = *info.dli_fname ? info.dli_fname : exe;
        const char *slash = strrchr(path, '/');
        const char *lib = slash ? slash + 1 : path;
        if (info.dli_sname && info.dli_saddr) {
            r = asprintf(&s, "%s!%s", lib, info.dli_sname);
            if (sym && sym->st_size) {
                *lo = (uintptr_t)info.dli_saddr;
                *hi = *lo + sym->st_size;
            }
        } else if ((fs = symtab_find(addr, &info))) {
            r = asprintf(&s, "%s!%s", lib, fs->name);
            *lo = fs->lo;
            *hi = fs->hi;
        } else {
            r = asprintf(&s, "%s+0x%" PRIxPTR, lib, addr - (uintptr_t)info.dli_fbase);
        }
    } else {
        r = asprintf(&s, "?+0x%" PRIxPTR, addr);
    }
    if (r < 0)
        return NULL;
    sanitize(s);
    return s;
}

int fs_sampler_write(const char *path)
{
    if (!g.started) {
        fprintf(stderr, "fs_sampler_write: the sampler was not started (fs_sampler_start)\n");
        return -1;
    }
    fs_sampler_pause();
    size_t used = atomic_load_explicit(&g.used, memory_order_acquire);
    unsigned long dropped = atomic_load(&g.dropped);

    size_t nsamples = 0, nframes = 0;
    for (size_t at = 0; at < used; at += 1 + FRAME_COUNT(g.buf[at])) {
        nsamples++;
        nframes += FRAME_COUNT(g.buf[at]);
    }
    if (nsamples > UINT32_MAX) {
        fprintf(stderr, "fs_sampler_write: %zu samples: too many\n", nsamples);
        return -1;
    }
    int rc = -1;
    FILE *f = NULL;
    char exe[PATH_MAX] = "?";
    ssize_t el = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (el > 0)
        exe[el] = 0;
    uintptr_t *adj = malloc((nframes + 1) * sizeof *adj);
    uintptr_t *uniq = malloc((nframes + 1) * sizeof *uniq);
    uint32_t *seq = malloc((nframes + 1) * sizeof *seq);
    size_t *off = malloc((nsamples + 1) * sizeof *off);
    uint32_t *len = malloc((nsamples + 1) * sizeof *len);
    uint32_t *order = malloc((nsamples + 1) * sizeof *order);
    struct group *groups = malloc((nsamples + 1) * sizeof *groups);
    char **names = NULL;
    uint32_t *name_id = NULL, *by_name = NULL;
    size_t nuniq = 0, ngroups = 0;
    if (!adj || !uniq || !seq || !off || !len || !order || !groups)
        goto oom;

    /* Every frame's address: the leaf's as interrupted, the others' (return addresses) less 1. */
    size_t s = 0, k = 0;
    for (size_t at = 0; at < used; at += 1 + FRAME_COUNT(g.buf[at]), s++) {
        uint32_t n = FRAME_COUNT(g.buf[at]);
        off[s] = k;
        len[s] = n;
        for (uint32_t j = 0; j < n; j++)
            adj[k++] = g.buf[at + 1 + j] - (j > 0);
    }
    memcpy(uniq, adj, nframes * sizeof *uniq);
    qsort(uniq, nframes, sizeof *uniq, cmp_addr);
    for (size_t i = 0; i < nframes; i++)
        if (nuniq == 0 || uniq[nuniq - 1] != uniq[i])
            uniq[nuniq++] = uniq[i];

    /* Names: dladdr once per address, once per symbol where the next addresses fall inside it. */
    names = calloc(nuniq + 1, sizeof *names);
    name_id = malloc((nuniq + 1) * sizeof *name_id);
    by_name = malloc((nuniq + 1) * sizeof *by_name);
    if (!names || !name_id || !by_name)
        goto oom;
    uintptr_t lo = 0, hi = 0;
    for (size_t u = 0; u < nuniq; u++) {
        if (u > 0 && uniq[u] >= lo && uniq[u] < hi) {
            names[u] = names[u - 1];
            continue;
        }
        if (!(names[u] = name_of(uniq[u], exe, &lo, &hi)))
            goto oom;
    }
    /* Equal names (addresses in one function) get one id; ids in the names' order. */
    for (size_t u = 0; u < nuniq; u++)
        by_name[u] = (uint32_t)u;
    cmp_names = names;
    qsort(by_name, nuniq, sizeof *by_name, cmp_name_index);
    uint32_t next_id = 0;
    for (size_t i = 0; i < nuniq; i++) {
        if (i > 0 && strcmp(names[by_name[i]], names[by_name[i - 1]]) != 0)
            next_id++;
        name_id[by_name[i]] = next_id;
    }
    /* by_name[id] = an address index with that name */
    for (size_t u = 0; u < nuniq; u++)
        by_name[name_id[u]] = (uint32_t)u;

    /* Each sample's stack as name ids, root first. */
    for (s = 0; s < nsamples; s++)
        for (uint32_t j = 0; j < len[s]; j++) {
            uintptr_t *p = bsearch(&adj[off[s] + j], uniq, nuniq, sizeof *uniq, cmp_addr);
            seq[off[s] + len[s] - 1 - j] = name_id[p - uniq];
        }
    cmp_seq = seq;
    cmp_off = off;
    cmp_len = len;
    for (s = 0; s < nsamples; s++)
        order[s] = (uint32_t)s;
    qsort(order, nsamples, sizeof *order, cmp_sample);
    for (s = 0; s < nsamples; s++) {
        if (ngroups > 0 && cmp_stack(groups[ngroups - 1].sample, order[s]) == 0) {
            groups[ngroups - 1].count++;
        } else {
            groups[ngroups].sample = order[s];
            groups[ngroups].count = 1;
            ngroups++;
        }
    }
    qsort(groups, ngroups, sizeof *groups, cmp_group);

    f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "fs_sampler_write: cannot open %s: %s\n", path, strerror(errno));
        goto out;
    }
    fprintf(f, "# fs_sampler 1\n# interval_us %u\n# spans %lu\n# span_ns %llu\n# samples %zu\n"
               "# dropped %lu\n# truncated %lu\n# overruns %lu\n# handler_ns %llu\n",
            g.interval_us, g.spans, g.span_ns, nsamples, dropped, atomic_load(&g.truncated),
            atomic_load(&g.overruns), atomic_load(&g.handler_ns));
    for (size_t i = 0; i < ngroups; i++) {
        uint32_t smp = groups[i].sample;
        if (len[smp] == 0)
            fputs("[no_frames]", f);
        for (uint32_t j = 0; j < len[smp]; j++) {
            if (j)
                fputc(';', f);
            fputs(names[by_name[seq[off[smp] + j]]], f);
        }
        fprintf(f, " %lu\n", groups[i].count);
    }
    if (ferror(f) | (fclose(f) != 0)) {
        f = NULL;
        fprintf(stderr, "fs_sampler_write: writing %s: %s\n", path, strerror(errno));
        goto out;
    }
    f = NULL;
    rc = 0;
    goto out;

oom:
    fprintf(stderr, "fs_sampler_write: out of memory resolving %zu samples (%zu frames)\n",
            nsamples, nframes);
out:
    if (f)
        fclose(f);
    if (names)
        for (size_t u = 0; u < nuniq; u++)
            if (names[u] && (u == 0 || names[u] != names[u - 1]))
                free(names[u]);
    free(names);
    symtabs_free();
    free(name_id);
    free(by_name);
    free(adj);
    free(uniq);
    free(seq);
    free(off);
    free(len);
    free(order);
    free(groups);
    return rc;
}
