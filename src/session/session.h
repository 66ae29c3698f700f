/* session.h - executions and their result records: one-shot runs of a program in a fresh
 * sandbox, and (see below) stateful sessions.
 *
 * Ownership: records own their buffers and JSON values; release them with
 * exec_record_release. */
#ifndef RUNCELL_SESSION_H
#define RUNCELL_SESSION_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"
#include "sandbox/sandbox.h"

#define DEFAULT_TIMEOUT_MS 60000
#define DEFAULT_OUTPUT_CAP (1u << 20)

enum exec_status {
    EXEC_OK,
    EXEC_ERROR,
    EXEC_TIMEOUT,
    EXEC_OOM,
    EXEC_KILLED,
    EXEC_OUTPUT_LIMIT,
    EXEC_CRASHED,
    EXEC_SANDBOX_ERROR,
};
const char *exec_status_name(enum exec_status s);

enum exec_state { STATE_NONE, STATE_KEPT, STATE_LOST };

/* One execution's result record (DESIGN.md "Result record"). */
struct exec_record {
    enum exec_status status;
    struct outcap out;
    struct outcap err;
    json_t *results;      /* array of MIME bundles */
    json_t *error;        /* {name, value, traceback} or NULL */
    char **created;       /* workspace paths, NULL-terminated */
    char **modified;
    char **deleted;
    char **copied_out;    /* of created and modified, those copied to out_dir */
    bool files_truncated; /* the workspace held more entries than were compared */
    enum exec_state state;
    bool has_exit_code;
    int exit_code;
    int signal;
    long execution_count; /* 0 = not a cell */
    double wall_ms;
    double cpu_ms;
    uint64_t memory_peak_kb;
    bool limits_degraded;
    char *message; /* what runcell itself says about the run (timeouts, setup errors) */
};

void exec_record_init(struct exec_record *r, size_t output_cap);
void exec_record_release(struct exec_record *r);
/* The record as DESIGN.md's JSON object; caller owns the reference. Output that is not
 * valid UTF-8 is repaired with U+FFFD. */
json_t *exec_record_json(const struct exec_record *r);
/* The `runcell run` exit status for this record: the program's own, 124 timeout, 128+N
 * signal (137 OOM), 125 sandbox setup failure. */
int exec_record_exit_status(const struct exec_record *r);

/* A file copied into the workspace before the run. */
struct input_file {
    const char *local;
    const char *dest; /* relative path in the workspace */
};

typedef void (*output_fn)(void *ctx, int stream, const char *data, size_t n);

/* One program in one fresh sandbox, nothing kept. */
struct run_request {
    const char *lang;        /* "python" or "bash" */
    const char *code;        /* source text (from -c or stdin), or NULL */
    const char *script_path; /* host script, copied into the workspace and run, or NULL */
    char *const *args;       /* further arguments for the program */
    const struct input_file *files;
    size_t n_files;
    struct sandbox_limits limits;
    uint64_t timeout_ms;
    size_t output_cap;
    const char *out_dir;  /* copy created and modified files here, or NULL */
    output_fn on_output;  /* live output (head of each stream, then the rest), or NULL */
    void *ctx;
    int cancel_fd;        /* readable (or hung up) = stop the run; -1 for none */
};

/* Runs req and fills rec (initialised by the caller with exec_record_init). Returns 0 when
 * the record describes the run (whatever its status, sandbox failures included), or -errno
 * with err_msg() when the request itself is unusable (a missing input file, a bad
 * destination), in which case nothing ran. */
int run_oneshot(struct sandbox_host *host, const struct run_request *req, struct exec_record *rec);

/* Checks a language name; returns false for anything but python and bash. */
bool lang_supported(const char *lang);

#endif
