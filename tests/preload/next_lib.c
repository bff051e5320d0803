/* Two interposers for the preload test of dlsym(RTLD_NEXT) under the shim's exported dlsym
 * (tests/preload/run.sh): built twice, with NEXT_VALUE 2 (preloaded first, after the shim) and 3.
 * next_value() of the first asks dlsym(RTLD_NEXT) for the next one, which must be the second's:
 * the lookup is relative to its caller, not to the shim that forwards it. */
#include <dlfcn.h>

__attribute__((visibility("default"))) int next_value(void);
__attribute__((visibility("default"))) int next_chain(void);

int next_value(void)
{
    return NEXT_VALUE;
}

/* This library's value, then the next library's (0 where none has one). */
int next_chain(void)
{
    int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "next_value");
    return NEXT_VALUE * 10 + (next ? next() : 0);
}
