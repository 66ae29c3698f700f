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

/* ---- option tables (opttab.c): each option of a subcommand described once ---- */
enum opt_kind {
    OPTK_TEXT,      /* not an option: help is a line (or lines) of --help as it stands */
    OPTK_FLAG,      /* bool at off, set */
    OPTK_STRING,    /* const char * at off: the argument as given */
    OPTK_STRV,      /* char ** at off: each value added to the list (repeatable; caller frees) */
    OPTK_SECONDS,   /* uint64_t at off: positive seconds, kept in ms; at most max s (0: a day) */
    OPTK_NUMBER,    /* uint64_t at off: a whole number from min to max */
    OPTK_COUNT,     /* unsigned at off: a positive whole number (opt_count), at most max */
    OPTK_COUNT64,   /* uint64_t at off: a positive whole number (opt_count) */
    OPTK_SIZE,      /* size_t at off: a positive whole number (opt_count) */
    OPTK_SIZE_OR_0, /* size_t at off: a whole number from 0 to max */
    OPTK_MB,        /* uint64_t at off: megabytes (opt_megabytes) */
    OPTK_MB_BYTES,  /* uint64_t at off: megabytes given, kept in bytes */
    OPTK_FN,        /* fn(opts, ...) does it: 0, or EXIT_USAGE after saying why */
    OPTK_REFUSED,   /* given, a usage error whose message is help; never listed in --help */
};
struct opt_spec {
    const char *name; /* without "--"; NULL for a short-only option or a text line */
    const char *arg;  /* what the value is called in --help ("N"); NULL: takes none */
    enum opt_kind kind;
    size_t off; /* of the field in the options the table describes */
    uint64_t min, max;
    int (*fn)(void *opts, const char *cmd, char *val);
    const char *help; /* its lines in --help, "\n" between them; NULL: not listed */
    char letter;      /* its short form (-c), if it has one */
};
struct opt_table {
    const struct opt_spec *specs;
    size_t n;
};
#define OPT_TABLE(specs)                                                                           \
    {                                                                                              \
        specs, ARRAY_SIZE(specs)                                                                   \
    }

/* Tables of options several subcommands share: a subcommand's own option of the same name
 * comes first (serve refuses --file, for one). */
struct opt_group {
    const struct opt_table *table;
    size_t base; /* where the struct the table's offsets are in lies in the subcommand's */
    bool listed; /* its options are listed in --help after the subcommand's own */
};
enum opt_args {
    OPTA_NONE,     /* arguments that are not options are usage errors */
    OPTA_AFTER,    /* options end at the first argument that is not one (run FILE ARGS) */
    OPTA_ANYWHERE, /* options and other arguments mix (review list --json) */
};
struct opt_cmd {
    const char *name;  /* the subcommand, for messages */
    const char *usage; /* --help's text before the options */
    struct opt_table own;
    struct opt_group groups[2];
    enum opt_args args;
    int column; /* where --help's descriptions start */
};
/* What opttab_parse returns when it printed --help (the subcommand then exits 0). */
#define OPTTAB_HELP (-1)
/* Parses argv's options (argv[0] the subcommand) into opts: 0 with *ret_first the index of
 * the first other argument (argc when none); OPTTAB_HELP after printing --help; EXIT_USAGE
 * after printing what was wrong. */
int opttab_parse(const struct opt_cmd *c, int argc, char **argv, void *opts, int *ret_first);
/* --help's options part: "  --name ARG" then the help from column on. */
void opttab_help(FILE *f, const struct opt_table *t, int column);

/* Options every code-running subcommand takes (common.c). */
struct common_opts {
    struct sandbox_limits limits;
    uint64_t timeout_ms;
    struct input_file *files;
    size_t n_files;
    const char *out_dir;
    struct net_policy *net;      /* --net allow:...; NULL for none */
    json_t *secrets_json;        /* --secret HOST=ENVNAME[:HEADER], read from the environment */
    struct net_secrets *secrets; /* those, parsed by check_net_opts */
    char **packages;             /* --package, repeatable */
    const char *index_url;
    uint64_t install_timeout_ms;
};
/* The network options as the session module takes them (borrowing from o). */
struct net_opts common_net_opts(const struct common_opts *o);
/* Says on stderr which packages could not be installed, and why. */
void print_packages_report(json_t *report);
/* Says on stderr which network attempts the egress proxy refused, and why. */
void print_network_refusals(json_t *events);
/* The common options, for a subcommand's opt_cmd.groups. */
extern const struct opt_table common_opt_table;
void common_opts_release(struct common_opts *o);
/* --out must be a directory we can write to; it is made now, so that a run is not wasted
 * on a destination that cannot take its files. 0 or EXIT_USAGE. */
int check_out_dir(const char *cmd, const char *dir);
/* Checks the network, secret and package options together (secrets without --net allow their
 * hosts): 0 or EXIT_USAGE after saying why. */
int check_net_opts(const char *cmd, struct common_opts *o);
/* For the subcommands whose sandboxes install no packages (agent): EXIT_USAGE after saying
 * so when a package option was given, else 0. */
int refuse_package_opts(const char *cmd, const struct common_opts *o);

/* Options of the subcommands that keep sessions (serve, repl): where they are kept. */
#define DEFAULT_STORE_QUOTA_MB 1024

struct store_opts {
    struct store_config cfg; /* url NULL: DATA/store */
    uint64_t quota_bytes;
    uint64_t max_files; /* 0: DEFAULT_STORE_MAX_FILES */
};
/* The store options, for a subcommand's opt_cmd.groups. */
extern const struct opt_table store_opt_table;

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
