/* main.c - the entry point of runcell and of runcell-full: dispatches to the subcommands.
 *
 * Built twice. runcell-full has every command. runcell (RUNCELL_FRONT) has only `run`, so
 * that a one-shot run loads none of the libraries the others link (libcurl with its TLS,
 * Kerberos and LDAP chain, libmicrohttpd, SQLite, libedit: ~17 ms of CPU at each start,
 * docs/PERFORMANCE.md); for any other command it execs runcell-full with the same
 * arguments, in the same process. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "cli/cli.h"
#include "net/net.h"

#ifdef RUNCELL_FRONT
#define IN_FULL(fn) NULL /* in runcell-full */
#else
#define IN_FULL(fn) fn
#endif

static const struct command commands[] = {
    {"run", cmd_run, "run code in a fresh sandbox, stateless"},
    {"repl", IN_FULL(cmd_repl), "interactive stateful Python session in a terminal"},
    {"serve", IN_FULL(cmd_serve), "the HTTP/JSON API server"},
    {"mcp", IN_FULL(cmd_mcp), "the MCP server on stdin/stdout"},
    {"agent", IN_FULL(cmd_agent), "a language model solves a task by running code in a sandbox"},
    {"review", IN_FULL(cmd_review), "the human review queue of failed agent runs"},
    {"doctor", IN_FULL(cmd_doctor),
     "what this host gives runcell (cgroups, Landlock, ...) and what to change"},
};

#ifdef RUNCELL_FRONT
/* Replaces this process with runcell-full: the one beside this program (the build
 * directory), else the installed one in libexecdir. Returns only on failure, after saying
 * what to do. */
static int exec_full(char **argv)
{
    char path[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - sizeof("/runcell-full"));
    char *slash = n > 0 ? memrchr(path, '/', (size_t)n) : NULL;
    if (slash) {
        strcpy(slash, "/runcell-full");
        if (access(path, X_OK) == 0)
            execv(path, argv);
    }
    snprintf(path, sizeof(path), "%s/runcell-full", RUNCELL_LIBEXECDIR);
    execv(path, argv);
    fprintf(stderr,
            "runcell %s: cannot start %s, the program with this command: %s; "
            "reinstall runcell (`meson install` puts it there)\n",
            argv[1], path, strerror(errno));
    return 127;
}
#endif

#ifdef RUNCELL_FRONT
/* Whether the command line gives secrets, which only runcell-full's proxy (with TLS) can
 * send. */
static bool needs_tls(int argc, char **argv)
{
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--secret") || !strncmp(argv[i], "--secret=", 9))
            return true;
    return false;
}
#endif

static void print_usage(FILE *f)
{
    fprintf(f, "usage: runcell COMMAND [OPTIONS]\n\ncommands:\n");
    for (size_t i = 0; i < ARRAY_SIZE(commands); i++)
        fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nrun 'runcell COMMAND --help' for a command's options\n");
}

int usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "runcell %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return EXIT_USAGE;
}

int opt_megabytes(const char *cmd, const char *opt, const char *val, uint64_t *ret)
{
    uint64_t v;
    if (parse_u64(val, &v) < 0 || v == 0 || v > (1u << 22))
        return usage_error(cmd, "%s: '%s' is not a size in megabytes (1 to 4194304)", opt, val);
    *ret = v;
    return 0;
}

int opt_count(const char *cmd, const char *opt, const char *val, uint64_t *ret)
{
    uint64_t v;
    if (parse_u64(val, &v) < 0 || v == 0 || v > 1000000)
        return usage_error(cmd, "%s: '%s' is not a positive whole number", opt, val);
    *ret = v;
    return 0;
}

int opt_seconds_max(const char *cmd, const char *opt, const char *val, uint64_t max_s,
                    uint64_t *ret_ms)
{
    if (parse_seconds(val, ret_ms) < 0 || *ret_ms > max_s * 1000)
        return usage_error(cmd,
                           "%s: '%s' is not a number of seconds (more than 0, at most "
                           "%llu)",
                           opt, val, (unsigned long long)max_s);
    return 0;
}

int opt_seconds(const char *cmd, const char *opt, const char *val, uint64_t *ret_ms)
{
    return opt_seconds_max(cmd, opt, val, MAX_OPT_SECONDS, ret_ms);
}

/* Whether the command line runs sandboxes (not --help): then runcell needs a cgroup of its
 * own on v2, and may ask systemd for one before anything else starts. */
static bool makes_sandboxes(int argc, char **argv)
{
    static const char *const cmds[] = {"run", "repl", "serve", "mcp", "agent"};
    bool found = false;
    for (size_t i = 0; i < ARRAY_SIZE(cmds); i++)
        found |= !strcmp(argv[1], cmds[i]);
    for (int i = 2; found && i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return false;
    return found;
}

int main(int argc, char **argv)
{
    const char *level = getenv("RUNCELL_LOG");
    log_set_level(LOG_WARN);
    if (level && !strcmp(level, "debug"))
        log_set_level(LOG_DEBUG);
    else if (level && !strcmp(level, "info"))
        log_set_level(LOG_INFO);
    if (argc < 2) {
        print_usage(stderr);
        return EXIT_USAGE;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        print_usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("runcell %s\n", RUNCELL_VERSION);
        return 0;
    }
    for (size_t i = 0; i < ARRAY_SIZE(commands); i++) {
        if (strcmp(argv[1], commands[i].name))
            continue;
#ifdef RUNCELL_FRONT
        /* RUNCELL_FORKED: cells in a fork (cmd_run.c), which needs the store. */
        if (!commands[i].fn || needs_tls(argc, argv) || getenv("RUNCELL_FORKED"))
            return exec_full(argv);
#else
        net_tls_enable();
#endif
        if (makes_sandboxes(argc, argv))
            (void)sandbox_scope_reexec(argc, argv);
        return commands[i].fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "runcell: unknown command '%s'; run 'runcell --help' for the list\n", argv[1]);
    return EXIT_USAGE;
}
