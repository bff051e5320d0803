/* flexshim-profile record: run a command under the shim and save its profile.
 *
 *   flexshim-profile record [-o FILE] [--lib PATH] -- COMMAND [ARGS...]
 *
 * The command runs with LD_PRELOAD naming libflexshim.so (beside the tool: ../lib in an installed
 * or dist tree, or the same folder in a build tree) and FLEXTENSOR_PROFILE_OUT=FILE; the shim
 * discovers the iteration, profiles it, plans it and writes FILE (its progress appears in the
 * command's stderr at log level info, which record sets unless FLEXTENSOR_LOG_LEVEL is). The exit
 * code is the command's; when it succeeded but no profile was written, record says why it may
 * be and exits 1. */
#include "record.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fs.h"
#include "profile.h"

enum { EXIT_OK = 0, EXIT_FAILED = 1, EXIT_USAGE = 2 };

void fs_tool_record_help(FILE *out)
{
    fputs("usage: flexshim-profile record [-o FILE] [--lib PATH] -- COMMAND [ARGS...]\n"
          "\n"
          "Runs COMMAND under libflexshim.so with FLEXTENSOR_PROFILE_OUT=FILE (default\n"
          "flexshim-profile.json): the shim finds the program's iteration (DISCOVERY_ITERS),\n"
          "times it (PROFILING_ITERS), plans it for GPU_MEMORY_LIMIT with STRATEGY and saves\n"
          "the profile. Other FLEXTENSOR_* settings pass to the command as they are.\n"
          "  -o FILE     where the profile goes\n"
          "  --lib PATH  the libflexshim.so to preload (default: the one beside this tool)\n"
          "Exit code: the command's; 1 when it succeeded but wrote no profile; 2 usage error.\n",
          out);
}

/* libflexshim.so beside the running tool. */
static int find_lib(char *buf, size_t len)
{
    char exe[PATH_MAX - 32]; /* room for the suffixes below */
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        return -1;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash)
        return -1;
    *slash = '\0';
    static const char *const rel[] = {"/../lib/libflexshim.so", "/libflexshim.so"};
    for (size_t i = 0; i < sizeof(rel) / sizeof(rel[0]); i++) {
        snprintf(buf, len, "%s%s", exe, rel[i]);
        if (access(buf, R_OK) == 0)
            return 0;
    }
    return -1;
}

int fs_tool_record(int argc, char **argv)
{
    const char *out = "flexshim-profile.json", *lib = NULL;
    int i = 1;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fs_tool_record_help(stdout);
            return EXIT_OK;
        }
        if ((!strcmp(argv[i], "-o") || !strcmp(argv[i], "--lib")) && i + 1 < argc) {
            *(argv[i][1] == 'o' ? &out : &lib) = argv[i + 1];
            i++;
            continue;
        }
        fprintf(stderr, "flexshim-profile record: unexpected '%s'; the command to run goes "
                        "after '--' (see --help)\n", argv[i]);
        return EXIT_USAGE;
    }
    if (i + 1 >= argc) {
        fprintf(stderr, "flexshim-profile record: no command given after '--' (see --help)\n");
        return EXIT_USAGE;
    }
    char found[PATH_MAX];
    if (!lib) {
        if (find_lib(found, sizeof(found)) != 0) {
            fprintf(stderr, "flexshim-profile record: libflexshim.so is not beside this tool; "
                            "name it with --lib PATH\n");
            return EXIT_USAGE;
        }
        lib = found;
    } else if (access(lib, R_OK) != 0) {
        fprintf(stderr, "flexshim-profile record: --lib %s: %s\n", lib, strerror(errno));
        return EXIT_USAGE;
    }
    char abs_out[PATH_MAX];
    if (out[0] != '/' && getcwd(abs_out, sizeof(abs_out) - strlen(out) - 2))
        snprintf(abs_out + strlen(abs_out), sizeof(abs_out) - strlen(abs_out), "/%s", out);
    else
        snprintf(abs_out, sizeof(abs_out), "%s", out);
    struct stat before;
    bool existed = stat(abs_out, &before) == 0;

    fprintf(stderr, "flexshim-profile record: running %s with %s; profile: %s\n", argv[i + 1],
            lib, abs_out);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "flexshim-profile record: fork: %s\n", strerror(errno));
        return EXIT_FAILED;
    }
    if (pid == 0) {
        /* What the user already preloads stays first (a sanitizer runtime must be). */
        const char *old = getenv("LD_PRELOAD");
        char preload[2 * PATH_MAX];
        snprintf(preload, sizeof(preload), "%s%s%s", old ? old : "", old && *old ? ":" : "",
                 lib);
        setenv("LD_PRELOAD", preload, 1);
        setenv("FLEXTENSOR_PROFILE_OUT", abs_out, 1);
        setenv("FLEXTENSOR_LOG_LEVEL", "info", 0);
        execvp(argv[i + 1], &argv[i + 1]);
        fprintf(stderr, "flexshim-profile record: cannot run %s: %s\n", argv[i + 1],
                strerror(errno));
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    struct stat after;
    bool written = stat(abs_out, &after) == 0 &&
                   (!existed || after.st_mtim.tv_sec != before.st_mtim.tv_sec ||
                    after.st_mtim.tv_nsec != before.st_mtim.tv_nsec);
    if (!written) {
        fprintf(stderr, "flexshim-profile record: no profile was written (the command exited "
                        "%d): the iteration was not found or not timed to the end; run more "
                        "iterations, lower FLEXTENSOR_PROFILING_ITERS, or read the shim's log\n",
                code);
        return code ? code : EXIT_FAILED;
    }
    struct fs_profile p;
    char err[512];
    if (fs_profile_load(abs_out, &p, err, sizeof(err)) != FS_OK) {
        fprintf(stderr, "flexshim-profile record: %s\n", err);
        return code ? code : EXIT_FAILED;
    }
    printf("%s: %d launches per iteration, %d allocations, plan: %s\n", abs_out, p.nlaunches,
           p.nallocs, p.plan.entries ? p.plan.strategy : "none");
    fs_profile_free(&p);
    return code;
}
