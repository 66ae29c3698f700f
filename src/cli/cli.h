/* cli.h - the subcommands of the runcell program (private to src/cli). */
#ifndef RUNCELL_CLI_H
#define RUNCELL_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "sandbox/sandbox.h"

/* Usage errors print one line and exit with this status. */
#define EXIT_USAGE 2

struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
};

int cmd_run(int argc, char **argv);

/* Prints "runcell CMD: message" and returns EXIT_USAGE. */
int usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Option parsers shared by subcommands; each returns 0, or prints a usage error and returns
 * EXIT_USAGE. */
int opt_megabytes(const char *cmd, const char *opt, const char *val, uint64_t *ret);
int opt_count(const char *cmd, const char *opt, const char *val, uint64_t *ret);
int opt_seconds(const char *cmd, const char *opt, const char *val, uint64_t *ret_ms);

#endif
