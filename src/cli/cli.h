/* cli.h - the subcommands of the runcell program (private to src/cli). */
#ifndef RUNCELL_CLI_H
#define RUNCELL_CLI_H

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "sandbox/sandbox.h"
#include "session/session.h"
#include "store/store.h"

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
int cmd_mcp(int argc, char **argv);
int cmd_agent(int argc, char **argv);
int cmd_review(int argc, char **argv);
int cmd_doctor(int argc, char **argv);

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
    OPT_PACKAGE,
    OPT_INDEX_URL,
    OPT_INSTALL_TIMEOUT,
    OPT_COMMON_END, /* subcommands number their own options from here */
};
#define COMMON_LONG_OPTS                                                                           \
    {"timeout", required_argument, NULL, OPT_TIMEOUT},                                             \
        {"memory", required_argument, NULL, OPT_MEMORY},                                           \
        {"pids", required_argument, NULL, OPT_PIDS}, {"disk", required_argument, NULL, OPT_DISK},  \
        {"cpus", required_argument, NULL, OPT_CPUS}, {"file", required_argument, NULL, OPT_FILE},  \
        {"out", required_argument, NULL, OPT_OUT}, {"net", required_argument, NULL, OPT_NET},      \
        {"package", required_argument, NULL, OPT_PACKAGE},                                         \
        {"index-url", required_argument, NULL, OPT_INDEX_URL},                                     \
    {                                                                                              \
        "install-timeout", required_argument, NULL, OPT_INSTALL_TIMEOUT                            \
    }

struct common_opts {
    struct sandbox_limits limits;
    uint64_t timeout_ms;
    struct input_file *files;
    size_t n_files;
    const char *out_dir;
    struct net_policy *net; /* --net allow:...; NULL for none */
    char **packages;        /* --package, repeatable */
    const char *index_url;
    uint64_t install_timeout_ms;
};
/* The network options as the session module takes them (borrowing from o). */
struct net_opts common_net_opts(const struct common_opts *o);
/* Says on stderr which packages could not be installed, and why. */
void print_packages_report(json_t *report);
/* Says on stderr which network attempts the egress proxy refused, and why. */
void print_network_refusals(json_t *events);
/* Handles one common option: 0, EXIT_USAGE after printing the error, or -1 when c is not a
 * common option. */
int common_opt(const char *cmd, struct common_opts *o, int c, char *val);
void common_opts_release(struct common_opts *o);
/* --out must be a directory we can write to; it is made now, so that a run is not wasted
 * on a destination that cannot take its files. 0 or EXIT_USAGE. */
int check_out_dir(const char *cmd, const char *dir);
/* Checks the network and package options together: 0 or EXIT_USAGE after saying why. */
int check_net_opts(const char *cmd, const struct common_opts *o);
/* For the subcommands whose sandboxes are always without network (agent, mcp): EXIT_USAGE
 * after saying so when a network or package option was given, else 0. */
int refuse_net_opts(const char *cmd, const struct common_opts *o);

/* ---- option tables (opttab.c): each option of a subcommand described once ---- */
enum opt_kind {
    OPTK_FLAG,      /* bool at off, set */
    OPTK_STRING,    /* const char * at off: the argument as given */
    OPTK_SECONDS,   /* uint64_t at off: positive seconds, kept in ms; at most max s (0: a day) */
    OPTK_NUMBER,    /* uint64_t at off: a whole number from min to max */
    OPTK_COUNT,     /* unsigned at off: a positive whole number (opt_count), at most max */
    OPTK_SIZE,      /* size_t at off: a positive whole number (opt_count) */
    OPTK_SIZE_OR_0, /* size_t at off: a whole number from 0 to max */
    OPTK_MB,        /* uint64_t at off: megabytes (opt_megabytes) */
    OPTK_MB_BYTES,  /* uint64_t at off: megabytes given, kept in bytes */
    OPTK_FN,        /* fn does it: 0, or EXIT_USAGE after saying why */
};
struct opt_spec {
    const char *name; /* without "--"; NULL: a heading line of --help, in help */
    const char *arg;  /* what the value is called in --help ("N"); NULL: takes none */
    enum opt_kind kind;
    size_t off; /* of the field in the subcommand's options */
    uint64_t min, max;
    int (*fn)(void *opts, const char *cmd, char *val);
    const char *help; /* its lines in --help, "\n" between them */
};
/* getopt_long's list: fixed (the shared options), then the table's, numbered
 * OPT_COMMON_END + index in it; caller frees. */
struct option *opttab_getopt_list(const struct option *fixed, size_t n_fixed,
                                  const struct opt_spec *t, size_t n);
/* Takes option c (from that list) with its value into opts: 0, or EXIT_USAGE after
 * printing what was wrong. */
int opttab_take(const char *cmd, const struct opt_spec *t, size_t n, int c, void *opts, char *val);
/* The options' part of --help: "  --name ARG" then the help from column on. */
void opttab_help(FILE *f, const struct opt_spec *t, size_t n, int column);

/* Options of the subcommands that keep sessions (serve, repl): where they are kept. */
enum {
    OPT_STORE = 512,
    OPT_S3_ENDPOINT,
    OPT_S3_REGION,
    OPT_S3_ACCESS_KEY,
    OPT_S3_SECRET_KEY,
    OPT_S3_VIRTUAL_HOSTED,
    OPT_STORE_QUOTA,
    OPT_STORE_MAX_FILES,
};
#define STORE_LONG_OPTS                                                                            \
    {"store", required_argument, NULL, OPT_STORE},                                                 \
        {"s3-endpoint", required_argument, NULL, OPT_S3_ENDPOINT},                                 \
        {"s3-region", required_argument, NULL, OPT_S3_REGION},                                     \
        {"s3-access-key", required_argument, NULL, OPT_S3_ACCESS_KEY},                             \
        {"s3-secret-key", required_argument, NULL, OPT_S3_SECRET_KEY},                             \
        {"s3-virtual-hosted", no_argument, NULL, OPT_S3_VIRTUAL_HOSTED},                           \
        {"store-quota", required_argument, NULL, OPT_STORE_QUOTA},                                 \
    {                                                                                              \
        "store-max-files", required_argument, NULL, OPT_STORE_MAX_FILES                            \
    }
#define STORE_OPTS_HELP                                                                            \
    "  --store DIR|s3://BUCKET[/PREFIX]  where sessions are kept (default DATA/store)\n"           \
    "  --s3-endpoint URL      S3-compatible endpoint, http[s]://HOST[:PORT] (default AWS)\n"       \
    "  --s3-region REGION     (default AWS_REGION, AWS_DEFAULT_REGION, else us-east-1)\n"          \
    "  --s3-access-key KEY, --s3-secret-key KEY   (default AWS_ACCESS_KEY_ID and\n"                \
    "                         AWS_SECRET_ACCESS_KEY, which keep the secret off command lines)\n"   \
    "  --s3-virtual-hosted    BUCKET.HOST addressing instead of HOST/BUCKET\n"                     \
    "  --store-quota MB       bytes stored per session at most (default 1024; 0: no limit)\n"      \
    "  --store-max-files N    files and links stored per session at most (default 10000)\n"
#define DEFAULT_STORE_QUOTA_MB 1024

struct store_opts {
    struct store_config cfg; /* url NULL: DATA/store */
    uint64_t quota_bytes;
    uint64_t max_files; /* 0: DEFAULT_STORE_MAX_FILES */
};
/* Handles one store option: 0, EXIT_USAGE after printing the error, or -1 when c is not a
 * store option. */
int store_opt(const char *cmd, struct store_opts *o, int c, char *val);

/* Keeping repl sessions (repl_keep.c). */
struct repl_keep {
    struct store *store;
    struct meta_db *meta;
    struct persist_config pc;
};
/* Opens the records (DATA/sessions.db) and the store of data_dir (NULL: the default data
 * directory). 0 or -errno with err_msg(). */
int repl_keep_open(struct repl_keep *k, const char *data_dir, const struct store_opts *so,
                   const char *owner);
void repl_keep_close(struct repl_keep *k);
/* Fills the limits l leaves at 0 from stored session `from`; -ENOENT (err_msg) when its
 * record says it cannot be resumed. */
int repl_keep_stored_limits(struct repl_keep *k, const char *from, struct sandbox_limits *l);
/* Gives s an id and keeps it (files: in the store); with resume_from, restores what is stored
 * and prints what came back. 0 or -errno with err_msg(). */
int repl_keep_attach(struct repl_keep *k, struct session *s, bool files, const char *resume_from);
/* The end of a kept session: a checkpoint, and a line saying what was kept. */
void repl_keep_end(struct session *s);

/* Prints "runcell CMD: message" and returns EXIT_USAGE. */
int usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Option parsers shared by subcommands; each returns 0, or prints a usage error and returns
 * EXIT_USAGE. */
int opt_megabytes(const char *cmd, const char *opt, const char *val, uint64_t *ret);
int opt_count(const char *cmd, const char *opt, const char *val, uint64_t *ret);
/* Seconds, more than 0 and at most MAX_OPT_SECONDS (one day); the idle timeouts, which may
 * be longer, go up to MAX_IDLE_OPT_SECONDS (seven days) with opt_seconds_max. */
#define MAX_OPT_SECONDS      (24ull * 3600)
#define MAX_IDLE_OPT_SECONDS (7ull * 24 * 3600)
int opt_seconds(const char *cmd, const char *opt, const char *val, uint64_t *ret_ms);
int opt_seconds_max(const char *cmd, const char *opt, const char *val, uint64_t max_s,
                    uint64_t *ret_ms);

#endif
