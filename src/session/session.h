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

/* ---- stateful sessions: a kernel in a sandbox, a workspace that outlives kernels ---- */

#define DEFAULT_IDLE_TIMEOUT_MS (600u * 1000)
#define DEFAULT_INTERRUPT_GRACE_MS 2000
#define DEFAULT_KERNEL_START_MS 30000
#define RESULTS_CAP (32u << 20) /* bytes of results (MIME bundles) kept per execution */

struct session_opts {
    struct sandbox_limits limits;
    uint64_t timeout_ms;         /* per-execution default */
    uint64_t idle_timeout_ms;
    uint64_t interrupt_grace_ms; /* after SIGINT, before the kernel is killed */
    uint64_t start_timeout_ms;
    size_t output_cap;
};
void session_opts_fill_defaults(struct session_opts *o);

/* What an execution streams while it runs (for live output). data/len are the bytes of a
 * stream chunk; json is a MIME bundle (EV_RESULT) or the error object (EV_ERROR), borrowed
 * for the duration of the callback. Each stream goes out live up to half the output cap;
 * what came after (a marker when bytes were dropped, then the tail) follows at the end of
 * the execution, before EV_ERROR. */
enum exec_event_type { EV_STDOUT, EV_STDERR, EV_RESULT, EV_ERROR };
struct exec_event {
    enum exec_event_type type;
    const char *data;
    size_t len;
    json_t *json;
};
struct exec_sink {
    void (*fn)(void *ctx, const struct exec_event *ev);
    void *ctx;
};

struct exec_request {
    const char *code;
    const char *lang;    /* "python" (default) or "bash" */
    uint64_t timeout_ms; /* 0 = the session's default */
};

struct session;

/* Creates a session: a workspace and a kernel running in a sandbox on it. 0 or -errno with
 * err_msg(); *ret owned by the caller (session_free). */
int session_new(struct sandbox_host *host, const struct session_opts *opts, struct session **ret);
/* Runs one cell and fills rec (initialised by the caller). Returns 0 when rec describes the
 * execution (whatever its status), -EBUSY when another execution is running (never queued),
 * -ESHUTDOWN when the session is closed, -EINVAL for a bad request (err_msg() says why).
 * sink may be NULL; cancel_fd (or -1) readable or hung up interrupts the cell. A kernel that
 * dies (timeout past the grace, out of memory, crash) is replaced by a fresh one on the same
 * workspace, and the record says state "lost". */
int session_execute(struct session *s, const struct exec_request *req,
                    const struct exec_sink *sink, int cancel_fd, struct exec_record *rec);
/* Interrupts the running cell, if any (KeyboardInterrupt). Safe from any thread. */
int session_interrupt(struct session *s);
/* A fresh interpreter on the same files. -EBUSY while a cell runs. */
int session_restart(struct session *s);
/* The workspace (files) of the session; valid while the session lives. */
struct workspace *session_workspace(struct session *s);
/* Milliseconds (monotonic) of the last execution's end, or of creation. */
uint64_t session_last_used_ms(struct session *s);
bool session_busy(struct session *s);
long session_execution_count(struct session *s);
const char *session_python_version(struct session *s);
const struct session_opts *session_options(struct session *s);
/* Kills the kernel and removes the workspace; NULL is a no-op. */
void session_free(struct session *s);

#endif
