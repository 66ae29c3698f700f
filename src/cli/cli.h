/* cli.h - the subcommands of the runcell program (private to src/cli). */
#ifndef RUNCELL_CLI_H
#define RUNCELL_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "sandbox/sandbox.h"
#include "session/session.h"

/* Usage errors print one line and exit with this status. */
#define EXIT_USAGE 2

struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
};

int cmd_run(int argc, char **argv);
int cmd_repl(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_agent(int argc, char **argv);
int cmd_review(int argc, char **argv);

/* Options every code-running subcommand takes. */
enum {
    OPT_TIMEOUT = 256,
    OPT_MEMORY,
    OPT_PIDS,
    OPT_DISK,
    OPT_CPUS,
    OPT_FILE,
    OPT_OUT,
    OPT_NET,
    OPT_COMMON_END, /* subcommands number their own options from here */
};
#define COMMON_LONG_OPTS                                                                           \
    {"timeout", required_argument, NULL, OPT_TIMEOUT},                                             \
        {"memory", required_argument, NULL, OPT_MEMORY},                                           \
        {"pids", required_argument, NULL, OPT_PIDS},                                               \
        {"disk", required_argument, NULL, OPT_DISK},                                               \
        {"cpus", required_argument, NULL, OPT_CPUS},                                               \
        {"file", required_argument, NULL, OPT_FILE},                                               \
        {"out", required_argument, NULL, OPT_OUT}, {"net", required_argument, NULL, OPT_NET}

struct common_opts {
    struct sandbox_limits limits;
    uint64_t timeout_ms;
    struct input_file *files;
    size_t n_files;
    const char *out_dir;
};
/* Handles one common option: 0, EXIT_USAGE after printing the error, or -1 when c is not a
 * common option. */
int common_opt(const char *cmd, struct common_opts *o, int c, char *val);
void common_opts_release(struct common_opts *o);
/* --out must be a directory we can write to; it is made now, so that a run is not wasted
 * on a destination that cannot take its files. 0 or EXIT_USAGE. */
int check_out_dir(const char *cmd, const char *dir);
/* Copies the --file inputs into ws; -1 with err_msg() on failure. */
int copy_inputs(struct workspace *ws, const struct common_opts *o);

/* Prints "runcell CMD: message" and returns EXIT_USAGE. */
int usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Option parsers shared by subcommands; each returns 0, or prints a usage error and returns
 * EXIT_USAGE. */
int opt_megabytes(const char *cmd, const char *opt, const char *val, uint64_t *ret);
int opt_count(const char *cmd, const char *opt, const char *val, uint64_t *ret);
int opt_seconds(const char *cmd, const char *opt, const char *val, uint64_t *ret_ms);

#endif
