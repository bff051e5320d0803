/* flexshim-profile: the command-line companion of libflexshim.so.
 *
 * Exit codes: 0 success, 1 the check failed (the messages say why), 2 usage error. */
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "flexshim.h"
#include "fs.h"

extern char **environ;

enum { EXIT_OK = 0, EXIT_CHECK_FAILED = 1, EXIT_USAGE = 2 };

struct command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
    void (*help)(FILE *out);
};

static void config_help(FILE *out)
{
    fputs("usage: flexshim-profile config --dump | --check | --ini\n"
          "\n"
          "  --dump   every setting, its value and where it came from (default, INI file, env)\n"
          "  --check  validate the INI file and FLEXTENSOR_* variables; exit 1 on any error\n"
          "  --ini    print the documented INI file with every key (conf/flexshim.ini)\n"
          "\n"
          "The INI file is FLEXTENSOR_CONFIG if set (empty: none), else the first of ./flexshim.ini,\n"
          "$XDG_CONFIG_HOME/flexshim/flexshim.ini (~/.config/...), /etc/flexshim/flexshim.ini.\n"
          "FLEXTENSOR_* environment variables override it.\n",
          out);
}

static int config_run(int argc, char **argv)
{
    if (argc != 2) {
        config_help(stderr);
        return EXIT_USAGE;
    }
    const char *mode = argv[1];
    if (!strcmp(mode, "--help") || !strcmp(mode, "-h")) {
        config_help(stdout);
        return EXIT_OK;
    }
    if (!strcmp(mode, "--ini")) {
        fs_config_write_ini(stdout);
        return EXIT_OK;
    }
    if (strcmp(mode, "--dump") && strcmp(mode, "--check")) {
        fprintf(stderr, "flexshim-profile config: unknown option '%s'\n", mode);
        config_help(stderr);
        return EXIT_USAGE;
    }
    struct fs_config cfg;
    struct fs_config_errors errs = {0};
    int rc = fs_config_load(&cfg, environ, &errs);
    for (int i = 0; i < errs.count; i++)
        fprintf(stderr, "flexshim: error: %s\n", errs.msg[i]);
    if (!strcmp(mode, "--dump"))
        fs_config_dump(&cfg, stdout);
    else if (rc == FS_OK)
        printf("configuration OK (%s)\n", cfg.ini_path[0] ? cfg.ini_path : "no INI file");
    return rc == FS_OK ? EXIT_OK : EXIT_CHECK_FAILED;
}

static const struct command commands[] = {
    {"config", "show or validate the configuration", config_run, config_help},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: flexshim-profile COMMAND [ARGS...]\n\ncommands:\n");
    for (size_t i = 0; i < FS_ARRAY_LEN(commands); i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n'flexshim-profile COMMAND --help' describes one command.\n"
                 "exit codes: 0 success, 1 check failed, 2 usage error\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return EXIT_OK;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("flexshim-profile %s\n", FLEXSHIM_VERSION_STRING);
        return EXIT_OK;
    }
    for (size_t i = 0; i < FS_ARRAY_LEN(commands); i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "flexshim-profile: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return EXIT_USAGE;
}
