/* The program tests/tools/sampler.sh samples, run with LD_PRELOAD=libfs_sampler.so and built with
 * -rdynamic -O1 (its functions in the dynamic symbol table, named by dladdr), once also with -s
 * (no .symtab: burn_s, a static function, has no name then).
 *
 *     sampler_prog OUT [nowrite]
 *
 * 10 spans, each burn_a for 12 ms of this thread's CPU time, burn_b for 4 ms and burn_s for 4 ms;
 * burn_c runs 4 ms outside each span, between them; the 10th span's burn_a is reached through 90
 * nested calls of deep() (stacks deeper than the sampler keeps). An 11th span of 8 ms in
 * last_span (below). Writes OUT, then checks the API's refusals: a second fs_sampler_start and a
 * write to a path that cannot be opened must fail. With nowrite: only the 11th span, no file.
 * Exit 0, or 1 with the reason on stderr. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void burn_a(void);
void burn_b(void);
void burn_c(void);
int deep(int n);
void last_span(void) __attribute__((noreturn));
void at_end(void) __attribute__((noreturn));

static volatile unsigned long sink;
static int (*fs_start)(unsigned);
static void (*fs_resume)(void);
static void (*fs_pause)(void);
static int (*fs_write)(const char *);
static const char *out;
static int nowrite;

static long long cpu_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Spins for ms of this thread's CPU time, reading the clock every 200000 additions (so nearly
 * every sample's leaf is the caller's loop, not the clock's code). */
static inline __attribute__((always_inline)) void spin(long ms, unsigned long step)
{
    long long end = cpu_ns() + ms * 1000000LL;
    do {
        for (int i = 0; i < 200000; i++)
            sink += step;
    } while (cpu_ns() < end);
}

/* Each its own code (a different step), so that no two are folded into one. */
__attribute__((noinline)) void burn_a(void) { spin(12, 1); }
__attribute__((noinline)) void burn_b(void) { spin(4, 2); }
__attribute__((noinline)) void burn_c(void) { spin(4, 3); }
__attribute__((noinline)) static void burn_s(void) { spin(4, 4); }

__attribute__((noinline)) int deep(int n)
{
    if (n > 0)
        return deep(n - 1) + 1; /* not a tail call: every level keeps its frame */
    burn_a();
    return 0;
}

/* The 11th span: 8 ms here, called from at_end, called from main; neither returns, so each call is
 * its function's last instruction and the return address lies past its end (resolved less 1, the
 * call is inside). After the span: a 20 ms sleep, which a timer still running would interrupt;
 * the file; the refusals. */
__attribute__((noinline)) void last_span(void)
{
    spin(8, 5);
    fs_pause();
    struct timespec ts = {0, 20000000};
    if (nanosleep(&ts, NULL) != 0) {
        perror("sampler_prog: nanosleep after the last span (the timer still runs?)");
        exit(1);
    }
    if (nowrite)
        exit(0);
    if (fs_write(out) != 0)
        exit(1);
    if (fs_start(200) != -1) {
        fprintf(stderr, "sampler_prog: a second fs_sampler_start did not fail\n");
        exit(1);
    }
    if (fs_write("/nonexistent-dir/x.samples") != -1) {
        fprintf(stderr, "sampler_prog: a write to a path that cannot be opened did not fail\n");
        exit(1);
    }
    exit(0);
}

__attribute__((noinline)) void at_end(void)
{
    last_span();
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: sampler_prog OUT [nowrite]\n");
        return 2;
    }
    out = argv[1];
    nowrite = argc > 2 && strcmp(argv[2], "nowrite") == 0;
    fs_start = (int (*)(unsigned))dlsym(RTLD_DEFAULT, "fs_sampler_start");
    fs_resume = (void (*)(void))dlsym(RTLD_DEFAULT, "fs_sampler_resume");
    fs_pause = (void (*)(void))dlsym(RTLD_DEFAULT, "fs_sampler_pause");
    fs_write = (int (*)(const char *))dlsym(RTLD_DEFAULT, "fs_sampler_write");
    if (!fs_start || !fs_resume || !fs_pause || !fs_write) {
        fprintf(stderr, "sampler_prog: the fs_sampler_* functions are not loaded (LD_PRELOAD)\n");
        return 1;
    }
    if (fs_start(200) != 0)
        return 1;
    for (int span = 0; span < 10 && !nowrite; span++) {
        burn_c();
        fs_resume();
        if (span == 9)
            sink += (unsigned long)deep(90);
        else
            burn_a();
        burn_b();
        burn_s();
        fs_pause();
    }
    burn_c();
    fs_resume();
    at_end();
}
