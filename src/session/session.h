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
#include <sys/stat.h>

#include "base/base.h"
#include "net/net.h"
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
    json_t *results; /* array of MIME bundles */
    json_t *error;   /* {name, value, traceback} or NULL */
    char **created;  /* workspace paths, NULL-terminated */
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
    const char *memory_peak_scope; /* "cell" or "session" (static string; NULL: "cell") */
    bool limits_degraded;
    char *message;       /* what runcell itself says about the run (timeouts, setup errors) */
    json_t *network;     /* egress attempts during the run (events as in the session's log), or
                          * NULL when there were none */
    json_t *packages;    /* one-shot runs: what installing their packages did (see
                          * session_packages), or NULL */
    char *persist_error; /* why the files could not all be written to the store, or NULL */
};

void exec_record_init(struct exec_record *r, size_t output_cap);
void exec_record_release(struct exec_record *r);
/* dst (initialised; what it held is released) made a copy of src. */
void exec_record_copy(struct exec_record *dst, const struct exec_record *src);
/* The record as DESIGN.md's JSON object; caller owns the reference. Output that is not
 * valid UTF-8 is repaired with U+FFFD. */
json_t *exec_record_json(const struct exec_record *r);
/* The `runcell run` exit status for this record: the program's own, 124 timeout, 128+N
 * signal (137 OOM), 125 sandbox setup failure. */
int exec_record_exit_status(const struct exec_record *r);
/* ---- figures: the images a cell displayed, as files (figure.c) ---- */

/* The raster image of a MIME bundle a cell displayed: its base64 text, of the first of
 * image/png, image/jpeg, image/gif and image/webp it has, with *ret_mime (may be NULL); NULL
 * when it has none. The one answer every surface gives to "is this result an image". */
const char *exec_bundle_image(json_t *bundle, const char **ret_mime);
/* Saves the Nth image (from 1) that cell CELL displayed, base64 b64 of type mime (as
 * exec_bundle_image named it), as "figure-CELL-N.png" (.jpg, .gif, .webp): one name everywhere
 * images are saved (run --out, the REPL, the agent), so a person can tell which cell made which.
 * Into host directory out_dir (made when missing) when it is not NULL, else into ws (owned by the
 * sandbox user, see workspace_write). 0 and *ret_name, the file name (caller frees), or -errno with
 * err_msg() naming the file. */
int exec_figure_save(struct workspace *ws, const char *out_dir, long cell, size_t n,
                     const char *mime, const char *b64, char **ret_name);

/* A file copied into the workspace before the run. */
struct input_file {
    const char *local;
    const char *dest; /* relative path in the workspace */
};

typedef void (*output_fn)(void *ctx, int stream, const char *data, size_t n);

/* Network and packages of a sandbox (runs and sessions alike). */
struct net_opts {
    const struct net_policy *policy;   /* NULL: loopback only; else an allowlist enforced by an
                                        * egress proxy (borrowed; sessions copy it) */
    const struct net_secrets *secrets; /* credentials the proxy adds to their hosts' requests
                                        * (each host on the allowlist), or NULL (borrowed;
                                        * sessions copy them, never into the sandbox) */
    char *const *packages;       /* pip requirements installed before the code runs; NULL: those of
                                  * /workspace/requirements.txt when there is a policy */
    const char *index_url;       /* PIP_INDEX_URL in the sandbox, or NULL for pip's default */
    char *const *env;            /* "NAME=VALUE" variables of the sandbox's programs that say
                                  * where a service is (an endpoint's URL), or NULL; never a
                                  * secret: those go to the proxy (borrowed; sessions copy) */
    uint64_t install_timeout_ms; /* budget for installing packages (default 120 s) */
};
#define DEFAULT_INSTALL_TIMEOUT_MS 120000
#define MAX_PACKAGES               200
/* Checks net opts: packages need a policy, are plain requirements (never pip options), the
 * index URL's host and port are on the allowlist, and env holds NAME=VALUE lines. 0 or
 * -EINVAL with err_msg(). */
int net_opts_check(const struct net_opts *n);

/* One program in one fresh sandbox, nothing kept. */
struct run_request {
    const char *lang;        /* "python", "bash" or "javascript" (node -e) */
    const char *code;        /* source text (from -c or stdin), or NULL */
    bool code_on_stdin;      /* python: code is given on the program's stdin, sys.argv[0] "-" */
    const char *script_path; /* host script, copied into the workspace and run, or NULL */
    char *const *args;       /* further arguments for the program */
    const struct input_file *files;
    size_t n_files;
    struct sandbox_limits limits;
    uint64_t timeout_ms;
    size_t output_cap;
    const char *out_dir; /* copy created and modified files here, or NULL */
    output_fn on_output; /* live output (head of each stream, then the rest), or NULL */
    void *ctx;
    int cancel_fd; /* readable (or hung up) = stop the run; -1 for none */
    struct net_opts net;
};

/* Runs req and fills rec (initialised by the caller with exec_record_init). Returns 0 when
 * the record describes the run (whatever its status, sandbox failures included), or -errno
 * with err_msg() when the request itself is unusable (a missing input file, a bad
 * destination), in which case nothing ran. */
int run_oneshot(struct sandbox_host *host, const struct run_request *req, struct exec_record *rec);

/* Checks a language name: python, bash, javascript (or its aliases js and node). */
bool lang_supported(const char *lang);
/* The canonical name of a supported language ("js" and "node" are "javascript"), or NULL. */
const char *lang_name(const char *lang);
/* Whether lang runs in a Node kernel (javascript) rather than the Python kernel, which runs
 * python and bash cells. */
bool lang_is_javascript(const char *lang);

/* ---- stateful sessions: a kernel in a sandbox, a workspace that outlives kernels ---- */

#define DEFAULT_IDLE_TIMEOUT_MS    (600u * 1000)
#define DEFAULT_INTERRUPT_GRACE_MS 2000
#define DEFAULT_KERNEL_START_MS    30000
#define RESULTS_CAP                (32u << 20) /* bytes of results (MIME bundles) kept per execution */

struct session_opts {
    struct sandbox_limits limits;
    uint64_t timeout_ms; /* per-execution default */
    uint64_t idle_timeout_ms;
    uint64_t interrupt_grace_ms; /* after SIGINT, before the kernel is killed */
    uint64_t start_timeout_ms;
    size_t output_cap;
    char *const *argv; /* sys.argv[1:] of the kernel (sys.argv[0] is "-c"); borrowed */
    const char *lang;  /* default language of executions: "python" (default) or "bash" */
    struct net_opts net;
    const struct input_file *files; /* copied into the workspace first (before packages are
                                     * installed: a requirements.txt among them counts) */
    size_t n_files;
    const char *home_dir;        /* HOME and the working directory of the kernels, their shell and
                                  * the programs they start: "/workspace" (NULL, runcell's own) or
                                  * SANDBOX_HOME_DIR ("/home/user", E2B's), the same files */
    unsigned history;            /* cells whose state before them is kept for session_undo (a Python
                                  * session's; 0: none), at most SESSION_HISTORY_MAX */
    uint64_t hibernate_after_ms; /* idle this long, a session of a table with a store
                                  * hibernates (session_pause without keep_memory); 0: never */
    bool pause_keeps_memory;     /* ... or, with this, is paused with keep_memory (E2B's
                                  * autoPause keeping memory) */
};
#define SESSION_HISTORY_MAX 100
void session_opts_fill_defaults(struct session_opts *o);
/* The home a session_opts.home_dir names: "/workspace" or SANDBOX_HOME_DIR (static strings),
 * or NULL for any other value. */
const char *session_home_dir(const char *home_dir);

/* What an execution streams while it runs (for live output). data/len are the bytes of a
 * stream chunk (for EV_RESULT, len is 1 when the bundle is the cell's value, its last
 * expression's, and 0 for a display); json is a MIME bundle (EV_RESULT) or the error object
 * (EV_ERROR), borrowed
 * for the duration of the callback. Each stream goes out live up to half the output cap;
 * what came after (a marker when bytes were dropped, then the tail) follows at the end of
 * the execution, before EV_ERROR. */
enum exec_event_type {
    EV_STDOUT,
    EV_STDERR,
    EV_RESULT,
    EV_ERROR,
    /* Only in an execution's kept events (exec.c), never to a sink: the execution ended;
     * json is {"record": RECORD} or, when it could not run, {"error": {"code", "message"}}
     * with code "cancelled", "closed", "busy" or "failed". */
    EV_DONE,
};
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
    const char *lang;    /* "python" (default), "bash" or "javascript": one of the
                          * session's kernel (javascript sessions run javascript only) */
    uint64_t timeout_ms; /* 0 = the session's default */
    int cancel_fd;       /* interrupts the cell when it polls ready; -1 (or 0 when
                          * cancel_events is 0 too) for none */
    short cancel_events; /* poll events for cancel_fd: 0 = POLLIN (a pipe); POLLRDHUP for
                          * a client socket that hangs up */
    bool stop_on_error;  /* a failure ends what waits behind it unrun (session_submit only) */
};

struct session;

/* Creates a session: a workspace and a kernel running in a sandbox on it. 0 or -errno with
 * err_msg(); *ret owned by the caller (session_free). */
int session_new(struct sandbox_host *host, const struct session_opts *opts, struct session **ret);
/* Runs one cell and fills rec (initialised by the caller), after the executions already
 * waiting in the session's queue (FIFO; one runs at a time) and once the session's gate has
 * room. Returns 0 when rec describes the execution (whatever its status), -EAGAIN when the
 * queue or the gate's waiting room is full, -ECANCELED when req->cancel_fd was ready before
 * its turn came, -ESHUTDOWN when the session is closed, -EINVAL for a bad request (err_msg()
 * says why).
 * sink may be NULL; req->cancel_fd interrupts the cell. A kernel that dies (timeout past the
 * grace, out of memory, crash) is replaced by a fresh one on the same workspace, and the
 * record says state "lost". */
int session_execute(struct session *s, const struct exec_request *req, const struct exec_sink *sink,
                    struct exec_record *rec);
/* Whether an execution runs or waits in s's queue. */
bool session_active(struct session *s);
/* Executions waiting in s's queue now. */
size_t session_queued(struct session *s);
/* Every execution waiting in s's queue gives up (-ECANCELED): the session is being closed. */
void session_cancel_queued(struct session *s);
/* session_execute runs its work at a lower priority (nice +5) and leaves the calling thread
 * so; this gives it back, for a thread that goes on to other work (the HTTP server calls it
 * before each request that is not an execution). Nothing when the thread is not lowered. */
void session_work_priority_reset(void);
/* Takes s back to its state before execution `before` (0: before the last one): the Python
 * kernel's whole memory as it was then (a copy of the process kept since, see
 * docs/ARCHITECTURE.md "Undo"), and, when s keeps its files in a store, the files that cell
 * and those after it created, changed and deleted. Waits for a running cell up to its
 * timeout (-EBUSY past it). 0 with *ret_report: {before (the cell undone, with those after
 * it), execution_count (the session's count now), variables: "restored",
 * files: {restored: [...], removed: [...], failed: [{path, error}]} or {kept: false, why},
 * shell: "restarted" or absent, kept: [cells still undoable]} (caller decrefs); -ENOENT when
 * the state before that cell is not kept (with what is, in err_msg()); -EINVAL for a
 * session that keeps no history (or a JavaScript one). */
int session_undo(struct session *s, long before, json_t **ret_report);
/* Lets sessions whose files go to no store keep a history of them for session_undo (beside
 * the workspace; docs/ARCHITECTURE.md "Undo"): a program with such sessions calls it once
 * before making them (session_table_new does). Without it their undo keeps files as they are. */
void session_files_history_enable(void);
/* Interrupts the running cell, if any (KeyboardInterrupt), also one whose interpreter is
 * still starting. Safe from any thread. */
int session_interrupt(struct session *s);
/* For a session made for one cell (a one-shot run): interrupts that cell, running or yet
 * to run. Safe from any thread. */
void session_interrupt_first_cell(struct session *s);
/* A fresh interpreter on the same files. -EBUSY while a cell runs. */
int session_restart(struct session *s);
/* The workspace (files) of the session; valid while the session lives. */
struct workspace *session_workspace(struct session *s);
/* Wall-clock milliseconds of creation. */
uint64_t session_created_ms(struct session *s);
/* Milliseconds (monotonic) of the last execution's end, or of creation. */
uint64_t session_last_used_ms(struct session *s);
bool session_busy(struct session *s);
/* Gives back what a session idle for idle_ms keeps open only to measure its next execution
 * (its sandboxes' cgroup usage files: three descriptors each); they are opened again when
 * it runs. */
void session_idle_release(struct session *s, uint64_t idle_ms);
long session_execution_count(struct session *s);
const char *session_python_version(struct session *s);
const struct session_opts *session_options(struct session *s);
/* Changes how long the session may stay idle before the table reaps it (the reaper reads it
 * atomically; the rest of its options never change). */
void session_set_idle_timeout(struct session *s, uint64_t idle_ms);
/* Changes how long s is idle before it pauses by itself (hibernate_after_ms; 0: never). */
void session_set_hibernate_after(struct session *s, uint64_t after_ms);
/* What installing the session's packages did: {"source": "packages"|"requirements.txt",
 * "requested": [...], "installed": [...], "missing": [{"requirement", "name", "reason"}],
 * "status": "ok"|"partial"|"failed"|"timeout", "seconds": S}; NULL when nothing was to
 * install. Borrowed; valid while the session lives. */
json_t *session_packages(struct session *s);
/* The network policy the session was created with (NULL: loopback only); valid while the
 * session lives. See session_network_json for the one in force. */
const struct net_policy *session_net_policy(struct session *s);
/* The session's network as it is now: {"mode": "none"}, or {"mode": "allowlist", "allow",
 * "max_connections", "max_bytes", "secrets": [{"host", "header", "kind", "path_prefix",
 * "allow_http"}]} (never a secret's value), or {"mode": "internet", ...}. Caller owns it. */
json_t *session_network_json(struct session *s);
/* Copies of the session's network as it is now, its secrets among them (NULL members for
 * loopback only), for a session made like it (a fork); the caller frees both. */
void session_network_copy(struct session *s, struct net_policy **ret_p, struct net_secrets **ret_s);
/* Changes a live session's network (see net_rules_change for change's JSON, but for its
 * "internet", which session_network_replace gives), checked against the server's cap max
 * (NULL: none); effective for connections opened from now on and for each further request
 * of an intercepted one. 0, -EINVAL (a bad change), -ENOTSUP (the session has no network
 * proxy: created with mode none), with err_msg(). */
int session_network_change(struct session *s, const json_t *change, const struct net_policy *max);
/* Replaces a live session's allowlist whole with p's entries, or with the public internet
 * when p is (NULL: nothing may be reached), keeping its secrets and caps, checked against
 * max as session_network_change. For a surface whose own rules allow the internet (E2B's
 * updateNetwork, runcell serve --e2b-internet). Same returns. */
int session_network_replace(struct session *s, const struct net_policy *p,
                            const struct net_policy *max);
/* A TCP connection to port on the loopback of s's sandbox (see sandbox_connect): what a
 * server a program of s runs answers, reached from the daemon. 0 and *ret_fd, or -errno
 * with err_msg(). */
int session_connect_port(struct session *s, uint16_t port, int *ret_fd);
/* The session's event log (egress attempts, ...), oldest first: {"events": [{"seq", "time",
 * "type", ...}], "dropped": N, "last_seq": N} with the events whose seq is above after_seq;
 * at most SESSION_EVENTS_MAX are kept. Caller owns the reference. */
json_t *session_events(struct session *s, uint64_t after_seq);
#define SESSION_EVENTS_MAX 1000

/* What a session uses now: its kernels' sandboxes (cgroups) and its workspace. */
struct session_metrics {
    double cpu_ms;            /* CPU time of its kernels' sandboxes so far (a kernel that was
                               * replaced took its own with it) */
    uint64_t mem_used_bytes;  /* memory charged to them now, the page cache included */
    uint64_t mem_cache_bytes; /* ... of which the page cache */
    uint64_t mem_total_bytes; /* the session's memory limit */
    uint64_t disk_used_bytes; /* the workspace's file system */
    uint64_t disk_total_bytes;
    uint64_t cpus_milli; /* the session's CPU limit */
};
/* Fills ret; figures that cannot be read (no cgroup) are 0. Never fails. */
void session_metrics(struct session *s, struct session_metrics *ret);
/* Whether the current kernel runs without cgroup limits. */
bool session_limits_degraded(struct session *s);
/* Kills the kernel's sandbox without waiting for it (so that many can die at once before
 * session_free reaps them). Safe from any thread. */
void session_kill(struct session *s);
/* Kills the kernel and removes the workspace; NULL is a no-op. */
void session_free(struct session *s);

/* ---- the gate (gate.c): executions running at once across a server, and waiting ----
 *
 * Each execution of a session with a gate passes it when its turn in the session's queue
 * comes: at most max_running run at once (the others wait, in no particular order between
 * sessions), and at most max_waiting wait in all the queues together (more are refused with
 * -EAGAIN). One gate per server, shared by every surface. */
struct exec_gate;
/* max_running 0: no limit on running; max_waiting 0: EXEC_GATE_DEFAULT_WAITING. */
struct exec_gate *exec_gate_new(size_t max_running, size_t max_waiting);
void exec_gate_free(struct exec_gate *g);
size_t exec_gate_running(struct exec_gate *g);
size_t exec_gate_waiting(struct exec_gate *g);
size_t exec_gate_max_running(struct exec_gate *g);
#define EXEC_GATE_DEFAULT_WAITING 1024
/* Executions waiting in one session's queue at most (more are refused with -EAGAIN). */
#define SESSION_QUEUE_MAX 64
/* The gate s's executions pass (g borrowed, outliving s; NULL: none). */
void session_set_gate(struct session *s, struct exec_gate *g);

/* ---- durable executions (exec.c) ----
 *
 * An execution is one cell submitted to a session: it has an id, takes its place in the
 * session's FIFO queue when submitted, runs on whatever thread execution_run is called on,
 * and keeps its events (each stream's chunks, results, its error, then EV_DONE with the
 * record) while it runs and for a while after, so that a client that went away re-attaches
 * and reads them again from any point. Its events are what session_execute emits, so they
 * are bounded as the record is (the head of each stream live, its marker and tail at the
 * end, RESULTS_CAP of results). A session keeps the running and queued ones and, of the
 * finished ones, the last EXEC_KEEP within EXEC_KEEP_BYTES and EXEC_KEEP_MS.
 *
 * Executions are reference-counted; every function may be called from any thread. */
#define EXEC_KEEP       16
#define EXEC_KEEP_BYTES (64u << 20)
#define EXEC_KEEP_MS    (15u * 60 * 1000)
#define EXEC_ID_SIZE    17 /* 16 hex digits and the NUL */
/* Readers of one execution at once (watchers). */
#define EXEC_WATCHERS_MAX WAKERS_MAX

struct execution;
struct session_table;
enum exec_phase { EXEC_QUEUED, EXEC_RUNNING, EXEC_DONE };

/* One kept event, as execution_read copies it (the caller releases it with
 * exec_items_release). seq counts from 1. */
struct exec_item {
    uint64_t seq;
    enum exec_event_type type;
    char *data; /* EV_STDOUT, EV_STDERR: the bytes */
    size_t len;
    json_t *json; /* EV_RESULT, EV_ERROR, EV_DONE (a reference) */
};
void exec_items_release(struct exec_item *items, size_t n);

/* Submits req (copied; a cancel_fd in it is polled only by the thread that runs it, so pass
 * -1 for one that execution_spawn runs: see execution_cancel) to s: the execution takes its
 * place in s's queue now. With t, it holds a reference on s (s must be t's and the
 * caller must hold one) until it ends. 0 and *ret (a reference, the caller's), -EAGAIN when
 * s's queue is full, -ESHUTDOWN when s is closed, -EINVAL for a bad request; each with
 * err_msg(). */
int session_submit(struct session_table *t, struct session *s, const struct exec_request *req,
                   struct execution **ret);
/* session_submit with an idempotency key (NULL: none): a key s has seen before, for the same
 * code and language, gives that execution back (a reference, *ret_replayed set) instead of a
 * new one, so a retried request never runs twice; one given to other code, or whose
 * execution is no longer kept, is -EEXIST. s keeps its last EXEC_KEYS_MAX keys, in memory:
 * a session taken over by another node after its node died forgets them. -EINVAL for a key
 * that is not 1 to EXEC_KEY_MAX visible ASCII characters. */
#define EXEC_KEY_MAX  64
#define EXEC_KEYS_MAX 1024
bool exec_key_valid(const char *key);
int session_submit_keyed(struct session_table *t, struct session *s, const struct exec_request *req,
                         const char *key, struct execution **ret, bool *ret_replayed);
/* Waits for x's turn and runs it on this thread; also (may be NULL) gets each event as it
 * happens. Returns when x is done (its record, or why it did not run, in its EV_DONE). Call
 * once. */
void execution_run(struct execution *x, const struct exec_sink *also);
/* execution_run on a thread of its own. 0, or -errno (x then ends as "failed"). */
int execution_spawn(struct execution *x);
/* Stops x: one still queued will not run (it ends as "cancelled"), a running one is
 * interrupted as a client's interrupt would (variables kept when the cell stops). */
void execution_cancel(struct execution *x);
struct execution *execution_ref(struct execution *x);
/* NULL is a no-op. */
void execution_unref(struct execution *x);
const char *execution_id(const struct execution *x);
enum exec_phase execution_phase(struct execution *x);
const char *exec_phase_name(enum exec_phase p);
/* Waits until x is done (or timeout_ms passes; 0 = forever). True when done. */
bool execution_wait(struct execution *x, uint64_t timeout_ms);
/* x's record once done and run (NULL before, or when it did not run): borrowed, valid while
 * the caller holds its reference. */
const struct exec_record *execution_record(struct execution *x);
/* x's record as exec_record_json gives it, made once when x ended (a reference to the one
 * its EV_DONE holds: shared, so never changed; json_copy it to add to it), or NULL. */
json_t *execution_record_json(struct execution *x);
/* Why x did not run, once done without a record (-ECANCELED, -ESHUTDOWN, -EAGAIN, ...), with
 * its message; 0 when it ran or is not done. */
int execution_failure(struct execution *x, const char **ret_message);
/* Copies up to max of x's events after seq `after` into items; returns how many. */
size_t execution_read(struct execution *x, uint64_t after, struct exec_item *items, size_t max);
/* The seq of x's last event so far. */
uint64_t execution_last_seq(struct execution *x);
/* The seq of the first event x still holds (events before it were dropped: a stream of one
 * execution past EXEC_ITEMS_MAX chunks); 1 when none was. */
uint64_t execution_first_seq(struct execution *x);
#define EXEC_ITEMS_MAX 200000
/* {id, phase, language, submitted_at, started_at, ended_at, status, last_seq}: caller owns. */
json_t *execution_json(struct execution *x);

/* A reader's wake-up: its descriptor (eventfd) becomes readable when x has something new
 * (events, its end) after the reader last called exec_watch_clear. At most
 * EXEC_WATCHERS_MAX at once per execution (-EAGAIN). */
struct exec_watch;
int execution_watch(struct execution *x, struct exec_watch **ret);
int exec_watch_fd(const struct exec_watch *w);
void exec_watch_clear(struct exec_watch *w);
/* NULL is a no-op. */
void exec_watch_free(struct exec_watch *w);

/* One of s's kept executions by id (a reference), or NULL. */
struct execution *session_execution_find(struct session *s, const char *id);
/* s's kept executions, oldest first, as execution_json. Caller owns. */
json_t *session_executions_json(struct session *s);

/* ---- a session's files (files.c): what every surface reads and writes of a workspace ----
 *
 * Paths are relative to the workspace ("" is the workspace itself where a directory is
 * asked for), safe (path_is_safe_relative); nothing follows a link the sandbox planted or
 * leaves the workspace. A change is saved to the store (when the session keeps its files)
 * before the call returns; a store that fails is retried by the next save. Each returns 0 (or
 * an fd) or -errno with err_msg() saying what failed on which path. */
enum session_file_type { SFILE_FILE, SFILE_DIR, SFILE_LINK, SFILE_OTHER };
struct session_file {
    char *path; /* relative to the workspace */
    enum session_file_type type;
    uint64_t size;
    mode_t mode; /* permission bits */
    int64_t mtime_ns;
};
struct session_file_list {
    struct session_file *v;
    size_t n;
    size_t bytes; /* charged: each path's length and SESSION_LIST_ENTRY_COST */
};
/* A listing's caps, whoever asks: more entries or bytes is -E2BIG (never a listing cut
 * short without saying so), deeper is cut to the maximum depth, a walk longer than
 * WS_SCAN_MAX_MS is -ETIMEDOUT. */
#define SESSION_LIST_MAX_ENTRIES 20000
#define SESSION_LIST_MAX_BYTES   (8u << 20)
#define SESSION_LIST_MAX_DEPTH   64
#define SESSION_LIST_ENTRY_COST  64
int session_file_stat(struct session *s, const char *rel, struct session_file *ret);
/* The entries below directory rel, to depth levels (1: its own), parents before children;
 * the top's .runcell is never listed. */
int session_file_list(struct session *s, const char *rel, unsigned depth,
                      struct session_file_list *ret);
void session_file_release(struct session_file *f);
void session_file_list_release(struct session_file_list *l);
/* Opens regular file rel for reading (blocking reads; never a FIFO, socket or device: -EINVAL,
 * a directory: -EISDIR); its stat in *ret_st. The fd (caller closes), or -errno. */
int session_file_open(struct session *s, const char *rel, struct stat *ret_st);
/* Writes n bytes to rel (parents made), replacing it whole (see workspace_write). */
int session_file_write(struct session *s, const char *rel, const void *data, size_t n);
int session_file_mkdir(struct session *s, const char *rel);
/* Removes rel; a directory only with recursive (-EISDIR otherwise), with what it holds. */
int session_file_remove(struct session *s, const char *rel, bool recursive);
/* Moves from to to (to's parents made), replacing what is at to. */
int session_file_rename(struct session *s, const char *from, const char *to);
/* A sentence for -errno err on rel, as these functions put it (this thread's buffer). */
const char *session_file_error(const char *rel, int err);
/* What a file of this mode is, for messages ("a named pipe (FIFO)", ...). */
const char *session_file_kind(mode_t mode);

/* ---- programs beside the cells (procs.c): E2B's commands, a background dev server ----
 *
 * A session runs programs in its kernel's sandbox beside its cells and one another
 * (sandbox_exec: the same namespaces, network, limits and lockdown), at most
 * SESSION_PROCS_MAX at once, each with its own pid, its stdin (a pipe when asked for,
 * otherwise /dev/null), and its stdout and stderr read as they come by the session's one
 * thread for its programs. What a program wrote is kept for readers that come and go: the
 * last SESSION_PROC_KEEP_BYTES of it (a reader that fell further behind is told how much it
 * missed), and at most SESSION_PROC_OUTPUT_MAX is read in all, past which its output is no
 * longer read (its writes block). A program past its timeout is killed with its process
 * group. A program ends when it exits, or is lost when the sandbox goes (a kernel replaced
 * after a cell that had to be killed, the session closed). The last SESSION_PROCS_KEEP_ENDED
 * programs that ended are kept for late readers. Programs are reference-counted; every
 * function may be called from any thread. */
#define SESSION_PROCS_MAX        64
#define SESSION_PROC_KEEP_BYTES  (1u << 20)
#define SESSION_PROC_KEEP_ITEMS  4096
#define SESSION_PROC_OUTPUT_MAX  (256ull << 20)
#define SESSION_PROCS_KEEP_ENDED 16
#define SESSION_PROC_INPUT_WAIT_MS                                                                 \
    5000 /* a program that takes no more of its stdin for this                                     \
          * long fails the write */
#define SESSION_PROC_WATCHERS_MAX WAKERS_MAX

struct session_proc;
struct session_proc_spec {
    char *const *argv;   /* argv[0] a path, or a name looked up on PATH */
    char *const *env;    /* KEY=VALUE over the session's environment (see session_env); NULL */
    const char *cwd;     /* absolute, in the sandbox; NULL: the session's home */
    bool stdin_pipe;     /* stdin is a pipe fed by session_proc_input; else /dev/null */
    uint64_t timeout_ms; /* killed with its process group once it has run this long; 0: never */
    json_t *info;        /* the caller's description, kept with it (a reference is taken) */
};
/* Starts spec in s. 0 and *ret (a reference, the caller's), or -errno with err_msg():
 * -EAGAIN at SESSION_PROCS_MAX, -EINVAL for a bad spec, -ESHUTDOWN once s is closed, and
 * sandbox_exec's (-EIO with why the program cannot run). */
int session_proc_start(struct session *s, const struct session_proc_spec *spec,
                       struct session_proc **ret);
/* The running or kept program of s with that pid (a reference), or NULL. */
struct session_proc *session_proc_find(struct session *s, int pid);
/* s's running programs, oldest first, at most max (references; the caller unrefs each).
 * Returns how many. */
size_t session_procs_running(struct session *s, struct session_proc **ret, size_t max);
struct session_proc *session_proc_ref(struct session_proc *p);
/* NULL is a no-op. */
void session_proc_unref(struct session_proc *p);
int session_proc_pid(const struct session_proc *p);
/* The description the caller gave (borrowed, valid while the reference is). */
json_t *session_proc_info(const struct session_proc *p);
/* Sends sig to p's process group (then to p). 0, -ESRCH once it has ended, or as
 * sandbox_exec_signal. */
int session_proc_signal(struct session *s, struct session_proc *p, int sig);
/* Writes n bytes to p's stdin, waiting up to SESSION_PROC_INPUT_WAIT_MS for the program to
 * take them. 0, -EBADF (no stdin pipe, or closed), -EPIPE (it is gone or closed its stdin),
 * -EAGAIN (it did not read), with err_msg(). */
int session_proc_input(struct session_proc *p, const void *data, size_t n);
/* Closes p's stdin (the program reads EOF). 0 or -EBADF. */
int session_proc_close_input(struct session_proc *p);

enum proc_item_type {
    PROC_STDOUT,
    PROC_STDERR,
    PROC_DROPPED, /* data: a sentence on how much output this reader missed */
    PROC_END,     /* the last item */
};
/* One kept item, as session_proc_read copies it (release with proc_items_release). */
struct proc_item {
    uint64_t seq;
    enum proc_item_type type;
    char *data;
    size_t len;
};
void proc_items_release(struct proc_item *items, size_t n);
/* Copies up to max items after seq `after` into items; how many. A reader whose next item was
 * dropped gets a PROC_DROPPED first. */
size_t session_proc_read(struct session_proc *p, uint64_t after, struct proc_item *items,
                         size_t max);
/* The seq of p's last item so far; what p writes after this call comes in later items (a
 * reader that starts after it misses nothing). */
uint64_t session_proc_last_seq(struct session_proc *p);
struct session_proc_end {
    bool exited;    /* it exited with exit_code */
    int exit_code;  /* 0 to 255 when exited */
    int signal;     /* the signal that killed it, or 0 */
    bool timed_out; /* killed because it ran past its timeout */
    bool lost;      /* it was not seen to end: its sandbox went */
};
/* Whether p has ended; how, in *ret. */
bool session_proc_ended(struct session_proc *p, struct session_proc_end *ret);
/* A reader's wake-up (an eventfd readable when p has something new), as exec_watch. At most
 * SESSION_PROC_WATCHERS_MAX at once per program (-EAGAIN). */
struct proc_watch;
int session_proc_watch(struct session_proc *p, struct proc_watch **ret);
int proc_watch_fd(const struct proc_watch *w);
void proc_watch_clear(struct proc_watch *w);
void proc_watch_free(struct proc_watch *w);

/* ---- watching a directory of the workspace (watch.c): E2B's watchDir ----
 *
 * inotify in the daemon, on each directory opened beneath the workspace without following a
 * link (never a host directory a planted link names). A recursive watch covers the
 * subdirectories there are and those made later, up to SESSION_WATCH_MAX_DIRS; at most
 * SESSION_WATCH_MAX_PENDING events wait to be read, more are counted as dropped. One thread
 * at a time per watch, with a reference on its session held during each call. */
#define SESSION_WATCH_MAX_DIRS    1024
#define SESSION_WATCH_MAX_PENDING 4096
enum session_watch_type { SWATCH_CREATE, SWATCH_WRITE, SWATCH_REMOVE, SWATCH_RENAME, SWATCH_CHMOD };
struct session_watch_event {
    enum session_watch_type type;
    char *name; /* below the watched directory; the reader frees it */
};
struct session_watch;
/* Watches workspace directory rel ("" the workspace). 0 and *ret (session_watch_free), or
 * -errno with err_msg(): -ENOTDIR, -ENOENT, -E2BIG (too many directories), -ELOOP. */
int session_watch_new(struct session *s, const char *rel, bool recursive,
                      struct session_watch **ret);
/* Readable when events wait (an inotify fd). */
int session_watch_fd(const struct session_watch *w);
/* The events that wait (without waiting), at most max, into ret; how many. s is w's. */
size_t session_watch_read(struct session *s, struct session_watch *w,
                          struct session_watch_event *ret, size_t max);
/* Events dropped so far (past SESSION_WATCH_MAX_PENDING, or the kernel's queue). */
uint64_t session_watch_dropped(const struct session_watch *w);
/* NULL is a no-op. */
void session_watch_free(struct session_watch *w);

/* ---- a pool of ready sessions: creation becomes a hand-over ---- */

struct session_pool;

/* Keeps `size` sessions made with opts ready, refilled by a background thread. *ret owned by
 * the caller (session_pool_free). */
struct session_pool *session_pool_new(struct sandbox_host *host, const struct session_opts *opts,
                                      size_t size);
/* A ready session set to opts (limits, timeouts, language), or NULL when none is ready or
 * opts need what a pooled one cannot be changed to (another disk size, arguments). The
 * caller owns it. */
struct session *session_pool_take(struct session_pool *p, const struct session_opts *opts);
size_t session_pool_ready(struct session_pool *p);
/* Stops the refill thread and frees the ready sessions; NULL is a no-op. */
void session_pool_free(struct session_pool *p);

/* Starts the bash shell of a session's Python kernel before its first bash cell (the pool
 * does, for the sessions it makes ahead). 0 or -errno with err_msg(). Not while a cell runs. */
int session_start_shell(struct session *s);
/* Makes a session built with other options follow opts (the pool's hand-over). 0 or
 * -errno. */
int session_adopt(struct session *s, const struct session_opts *opts);

/* ---- persistence (persist.c): a session's files and variables kept in a store ----
 *
 * Files: after each execution (before session_execute returns) the files created, modified
 * or deleted since the last save are written to the store; when that fails, the record says
 * so (persist_error) and the next execution tries again. Variables: a checkpoint pickles the
 * kernel's globals into the store. The store holds, per session, a manifest (the file list,
 * the variables' checkpoint) and content-addressed blobs under sessions/ID/. */

struct store;
struct meta_db;
struct fleet;

/* Each stored file is a host file (a blob) and an entry in the manifest: their number is
 * capped as well as their bytes. */
#define DEFAULT_STORE_MAX_FILES 10000
#define STORE_MAX_FILES_LIMIT   1000000
/* A save of a session's files stops reading after this long (what is left is saved by the
 * next one), so that no workspace holds a thread, the reaper or a shutdown for longer. */
#define PERSIST_SAVE_MAX_MS 60000

struct persist_config {
    struct store *store;           /* where files and variables go (borrowed) */
    struct meta_db *meta;          /* session records (borrowed); NULL for none */
    uint64_t quota_bytes;          /* bytes stored per session at most; 0 = no limit */
    uint64_t max_files;            /* files and links stored per session at most; 0 = the default */
    const char *owner;             /* this process's owner id, recorded with its live sessions */
    struct fleet *fleet;           /* leases in the shared store (lease.c), or NULL for none */
    const unsigned char *seal_key; /* SEAL_KEY_SIZE bytes: sessions' secrets are kept in their
                                    * records, sealed with it (serve --secrets-key); NULL:
                                    * secrets are never kept */
};

/* How a session ends, and so what is kept of it. */
enum session_end {
    SESSION_END_CLOSE,      /* closed: what was stored is discarded */
    SESSION_END_CHECKPOINT, /* closed with checkpoint: files and variables kept */
    SESSION_END_IDLE,       /* reaped for idleness: files and variables kept */
    SESSION_END_SHUTDOWN,   /* the server stops: files and variables kept */
};

/* Names s `id` and records it in c->meta (c is borrowed and must outlive s); with
 * store_files, its files go to c->store after every execution and its variables at
 * checkpoints. Call once, before the first execution. 0 or -errno with err_msg(). */
int session_persist(struct session *s, const struct persist_config *c, const char *id,
                    bool store_files, const char *resumed_from);
/* The secrets a stored session's options keep sealed ("secrets_sealed", made for record id),
 * taken out of options: 0 with *ret_secrets the JSON array net_secrets_from_json takes (the
 * caller wipes it, net_secrets_json_wipe) or NULL when there are none; -EACCES or -EINVAL
 * with err_msg() saying what to do when c cannot open them. */
int session_unseal_secrets(const struct persist_config *c, const char *id, json_t *options,
                           json_t **ret_secrets);
/* The id given by session_persist, or NULL. */
const char *session_id(struct session *s);
bool session_stores_files(struct session *s);
/* Brings what is stored for session from_id (files, then variables) into s, a new session
 * that has run nothing yet, then saves s's own copy. 0 with *ret_report: {from, files,
 * files_failed: [{path, error}], variables, modules, variables_failed: [{name, error}],
 * not_saved: [...], and errors that concern everything}, caller decrefs; -ENOENT when
 * nothing is stored for from_id; other -errno with err_msg(). */
int session_restore(struct session *s, const char *from_id, json_t **ret_report);
/* Writes the files changed since the last save now (after an upload, say). 0, or -errno
 * with err_msg() saying what was not saved. -EBUSY never: it waits for a running save. */
int session_save_files(struct session *s);
/* Ends s's life in the records and the store as `how` says: a checkpoint of the variables
 * and a last save of the files (CHECKPOINT, IDLE, SHUTDOWN), or the discarding of what was
 * stored (CLOSE). Waits up to the interrupt grace for a running cell to stop. *ret_report
 * (may be NULL; caller decrefs): {variables: {saved, modules, skipped, bytes}, files,
 * stored_bytes} or {error}. The session itself is not freed. */
void session_retire(struct session *s, enum session_end how, json_t **ret_report);
/* Retires n sessions as session_retire does (no reports), workers at a time (at least 1):
 * a shutdown's checkpoints wait on the store, so they go in parallel. Returns when all are
 * retired. (retire.c) */
#define RETIRE_WORKERS_DEFAULT 32
void session_retire_all(struct session **v, size_t n, enum session_end how, size_t workers);
/* Checkpoints a live session's variables and files now (it goes on running): what a
 * successor node resumes after this node dies. -EBUSY while a cell runs; *ret_report as
 * session_retire's. */
int session_checkpoint(struct session *s, json_t **ret_report);
/* Stops s from writing anything more to the store (its lease went to another node). */
void session_persist_fence(struct session *s);
/* The record of session id as the store keeps it: {id, state, persist, resumable,
 * created_at, last_used_at, execution_count, options, resumed_from, checkpoint}; -ENOENT
 * when there is no record. Caller decrefs. */
int session_stored_info(const struct persist_config *c, const char *id, json_t **ret);
/* Stored records, newest first (at most limit), as session_stored_info; caller decrefs. */
json_t *session_stored_list(const struct persist_config *c, size_t limit);
/* Removes what is stored for id (not live) and records it as closed. 0, -ENOENT. */
int session_stored_delete(const struct persist_config *c, const char *id);
/* A session id as the store takes it: 1 to 64 lower-case hex digits, after "NODE-" (a node
 * name, see node_name_valid) in the ids of servers that name their node. */
bool session_id_valid(const char *id);

/* ---- snapshots, forks and pauses (snapshot.c) ----
 *
 * What a session is can be written to the store apart from what it keeps of its own
 * (session_export): its files and its variables (pickled, each kept or named as lost, as a
 * checkpoint is). A snapshot is such an export under a name, listed and deleted, that new
 * sessions start from, on any node of the store; a fork is an export that new sessions start
 * from at once. A pause stops every process of the session's sandboxes (no CPU; memory kept)
 * or, without keep_memory, hibernates it: its variables exported, its kernels gone; the next
 * thing that comes to it (an execution, an undo, a checkpoint) resumes it first. */
enum session_pause { PAUSE_NONE, PAUSE_FROZEN, PAUSE_HIBERNATED };
const char *session_pause_name(enum session_pause p);
enum session_pause session_pause_state(struct session *s);
/* Resumes s when it is paused (waiting for a running cell up to its timeout), for work that
 * needs its processes (a command); 0 at once otherwise. */
int session_wake(struct session *s);
/* How many sessions of this process are hibernated now. */
size_t session_hibernated_count(void);

/* Writes s's files and variables to c's store as session to_id (waiting for a running cell up
 * to its timeout). 0 with *ret_report {files, bytes, variables: {saved, modules, skipped} |
 * variables_error} (caller decrefs), or -errno with err_msg(). */
int session_export(struct session *s, const struct persist_config *c, const char *to_id,
                   json_t **ret_report);
/* Pauses s: keep_memory stops its processes, else hibernates it (its variables exported under
 * its own id, its kernels gone). 0 with *ret_report, -EALREADY when it is paused, -EINVAL for
 * a session that keeps nothing in a store or a JavaScript session (hibernation needs the
 * one, and cannot keep the other's variables), others with err_msg(). A Python session's
 * JavaScript kernel, if it has one, starts empty after a hibernation (the report says so). */
int session_pause(struct session *s, bool keep_memory, json_t **ret_report);
/* session_pause by the server itself, for idleness: a hibernation that would lose a second
 * (JavaScript) kernel's variables is not made (-EBUSY). A JavaScript session is never
 * hibernated (-EINVAL: its variables cannot be kept). */
int session_pause_idle(struct session *s, bool keep_memory, json_t **ret_report);
/* Resumes a paused s now: 0 with *ret_report (what a hibernated one brought back), -EALREADY
 * when it is not paused. */
int session_resume(struct session *s, json_t **ret_report);

/* Snapshots in c's store: snapshots/ID.json records {id, name, from, created_at, bytes, files,
 * language, variables}; the state itself stored as session ID. At most max in all. */
#define SNAPSHOT_MAX_DEFAULT 100
int snapshot_create(const struct persist_config *c, struct session *s, const char *name, size_t max,
                    json_t **ret_record);
/* The records, newest first (at most limit); caller decrefs. */
json_t *snapshot_list(const struct persist_config *c, size_t limit);
int snapshot_get(const struct persist_config *c, const char *id, json_t **ret_record);
int snapshot_delete(const struct persist_config *c, const char *id);
/* Whether id names a snapshot's stored state (an id of session_id_valid's form). */
bool snapshot_id_valid(const char *id);

/* The console's notebook of session id, kept in c's store beside what the session keeps
 * (sessions/ID/notebook.json; gone with it), taken along by a resume (session_restore). At
 * most SESSION_NOTEBOOK_MAX bytes (-EFBIG past it). get: 0 with the text (caller frees) or
 * -ENOENT. */
#define SESSION_NOTEBOOK_MAX (8u << 20)
int session_notebook_get(const struct persist_config *c, const char *id, char **ret, size_t *ret_n);
int session_notebook_put(const struct persist_config *c, const char *id, const char *text,
                         size_t n);

/* ---- a fleet (node.c, lease.c): nodes sharing one store ----
 *
 * Membership: each node holds one lease in the store, nodes/NODE.json (its epoch, its expiry,
 * the address other nodes forward to), renewed every third of the ttl by a thread of its
 * own, each renewal with a deadline: store traffic grows with the nodes, not the sessions.
 * The epoch is new each time the node (re)gains its lease. A node that cannot renew fences
 * itself before its lease can expire (fleet_hooks), and a watchdog process kills it when it
 * cannot even do that (stopped, hung).
 *
 * Sessions: each session a node stores has a record, sessions/ID/lease.json: its options,
 * its owner node and that node's epoch, a generation and its last checkpoint. Records (and
 * node leases) are only ever changed by a conditional write at the version read
 * (store_put_if): of two nodes that race for one, one wins. A session may be taken from its
 * owner only when the owner's node lease has expired (plus a clock skew allowance) or was
 * released, or its epoch is not the record's. */

/* A node name: 1 to 32 of a-z, 0-9 and '-', not starting or ending with '-' (a DNS label). */
bool node_name_valid(const char *name);
/* The node an id names ("NODE-HEX"), or NULL for an id without one; caller frees. */
char *session_id_node(const char *id);

#define FLEET_MIN_TTL_MS    3000
#define FLEET_CLOCK_SKEW_MS 1000 /* between nodes' wall clocks, at most */

/* What a node does as it fences itself, in this order, each at its time before the hard
 * deadline (the last renewal's send time + ttl - skew allowance); called from the fence
 * thread, no lock held. */
enum fleet_fence_step {
    FENCE_BEGIN = 1, /* new work is refused (fleet_admitting is false): interrupt running cells */
    FENCE_KILL,      /* kill the cells still running */
    FENCE_DROP,      /* drop every session (kill its sandbox, save nothing): the lease lapses */
    FENCE_LIFTED,    /* a renewal came through before the drop: work again */
};
struct fleet_hooks {
    void (*fence)(void *ctx, enum fleet_fence_step step);
    void *ctx;
};

/* Checks node, advertise ("HOST:PORT", where other nodes reach this one) and ttl, and that
 * the store honours conditional writes (-ENOTSUP otherwise). watchdog_fd: the pipe of
 * fleet_watchdog_spawn, or -1. *ret owned by the caller (fleet_free). */
int fleet_new(struct store *st, const char *node, const char *advertise, uint64_t ttl_ms,
              int watchdog_fd, struct fleet **ret);
/* Starts the renewer (which first joins: takes the node lease, at once when it is free or
 * was this host's earlier process, else once it expires) and the fence thread. */
int fleet_start(struct fleet *f, const struct fleet_hooks *hooks);
/* Forks the watchdog: a process of its own that SIGKILLs this one when the node's lease
 * reaches its hard deadline before the node has fenced itself (it was stopped or hangs), so
 * that its sandboxes (which end with it) never outlive its lease. Call before any thread
 * starts. 0 with *ret_fd (the pipe to it, O_CLOEXEC) or -errno with err_msg(). */
int fleet_watchdog_spawn(int *ret_fd);
const char *fleet_node(const struct fleet *f);
uint64_t fleet_ttl_ms(const struct fleet *f);
/* Whether this node holds its lease and may start work and write to the store now; when
 * not, *ret_why (may be NULL; static or valid until the next call from this thread) says
 * why, for a 503. */
bool fleet_admitting(struct fleet *f, const char **ret_why);
/* The node lease as /healthz shows it: {node, epoch, state, lease_ms_left, store, ...};
 * caller decrefs. */
json_t *fleet_health(struct fleet *f);
/* Takes the record of a new session (it must not exist), owned by this node at its epoch.
 * options_json: its options as session records keep them. 0 or -errno with err_msg(). */
int fleet_lease_new(struct fleet *f, const char *id, const char *options_json);
/* Whether this node may run and save id now: 0; -EXDEV when another node took it (or this
 * node never held it); -ENOLCK when the node is fenced (it could not renew its lease). */
int fleet_lease_state(struct fleet *f, const char *id);

/* Who runs a session, as the store says. */
enum fleet_owner_kind {
    OWNER_HERE,     /* this node holds it */
    OWNER_REMOTE,   /* another live node owns it: forward to ret->address */
    OWNER_TAKEABLE, /* its owner is gone (or it was released): a takeover may have it */
    OWNER_NONE,     /* no record: not a session of the fleet, or ended */
};
struct fleet_owner {
    enum fleet_owner_kind kind;
    char node[40];
    char address[272]; /* HOST:PORT (OWNER_REMOTE) */
    long long epoch;
};
/* Looks id up: its record (one store read) and its owner's node lease (cached for a fraction
 * of the ttl; fresh when fresh is true). 0 with *ret, or -errno with err_msg(). */
int fleet_lookup(struct fleet *f, const char *id, bool fresh, struct fleet_owner *ret);
/* The advertised address of node while its lease is live (read as fleet_lookup reads it):
 * 0, or -ENOENT when it holds none, or -errno from the store. */
int fleet_node_address(struct fleet *f, const char *node, char ret_address[272]);
/* Takes over id from the node that owned it: at once when it was released, when its owner's
 * lease expired or its epoch changed, or when this node owned it at an earlier epoch; with
 * wait_for_owner (the owner does not answer), a live owner's lease is waited for (at most ttl
 * and twice the skew allowance), else it is -EBUSY at once. A takeover of id
 * already going on in this node is waited for instead (-EALREADY: the session is then in this
 * node's table, or the takeover failed). 0 with *ret_record (the record as now written:
 * options, checkpoint, previous_node; caller decrefs), after which the caller must call
 * fleet_lease_taken; -ENOENT when the store has no record or it ended; -EBUSY when a live
 * node holds it; other -errno with err_msg(). */
int fleet_lease_take(struct fleet *f, const char *id, bool wait_for_owner, json_t **ret_record);
/* The takeover fleet_lease_take began is over (the session is in the table, or it failed):
 * requests of this node waiting on it go on. */
void fleet_lease_taken(struct fleet *f, const char *id);
/* Rewrites the held record with state ("live", or how it ended) and, when not NULL, its
 * last checkpoint summary. -EXDEV when another node took it meanwhile; -ENOLCK when fenced. */
int fleet_lease_update(struct fleet *f, const char *id, const char *state, json_t *checkpoint);
/* Rewrites the held record's options (JSON text: the network changed), state live. Same
 * returns. */
int fleet_lease_set_options(struct fleet *f, const char *id, const char *options_json);
/* The generation of the record this node holds for id (+1 at each takeover), or 0 when it
 * holds none: the fencing token written into what it stores for id. */
long long fleet_lease_generation(struct fleet *f, const char *id);
/* Ends holding id: with how (e.g. "expired"), the record says the session ended so that a
 * successor may take it at once; how NULL only forgets it (the record was deleted). */
void fleet_lease_release(struct fleet *f, const char *id, const char *how, json_t *checkpoint);
/* Forgets id without writing anything (a dropped session: its record stays as it is). */
void fleet_lease_forget(struct fleet *f, const char *id);
/* Calls the hooks no more, and returns once a call in progress is over (a shutdown: the
 * table goes, while the node lease is still renewed until its sessions are released). NULL
 * is a no-op. */
void fleet_quiesce(struct fleet *f);
/* Stops the threads and releases the node lease (its sessions move at once); NULL is a
 * no-op. */
void fleet_stop(struct fleet *f);
void fleet_free(struct fleet *f);

/* ---- the session table of a server: ids, reference counts, idle expiry ---- */

struct session_table;

/* max_sessions: live sessions at most (0 = unlimited); pool (may be NULL, borrowed) serves
 * creations first. *ret owned by the caller. */
struct session_table *session_table_new(struct sandbox_host *host, size_t max_sessions,
                                        struct session_pool *pool);
/* The table's gate (executions running and waiting at once across its sessions, see
 * exec_gate): sessions it creates pass it. Call before the first session is created. */
void session_table_set_exec_limits(struct session_table *t, size_t max_running, size_t max_waiting);
/* The table's gate (NULL until set), for sessions made outside it (one-shot runs). */
struct exec_gate *session_table_gate(struct session_table *t);
/* Tells fn (from the thread that ran it) of each execution submitted with t that ran:
 * metrics. */
void session_table_set_observer(struct session_table *t,
                                void (*fn)(void *ctx, const struct exec_record *rec), void *ctx);
void session_table_observe(struct session_table *t, const struct exec_record *rec);
/* fn(ctx, id) whenever a session leaves t for good (closed, expired, moved away), before it
 * is freed; called without t's lock. */
void session_table_set_gone(struct session_table *t, void (*fn)(void *ctx, const char *id),
                            void *ctx);
/* Takes one more reference on s, which is t's and of which the caller holds one (drop it
 * with session_table_put). */
void session_table_ref(struct session_table *t, struct session *s);
/* Starts the idle reaper thread (checks every interval_ms). */
int session_table_start_reaper(struct session_table *t, uint64_t interval_ms);
/* Creates and registers a session. Returns 0 and its id (caller frees), -EAGAIN when the
 * table is full, or the session's creation error. */
int session_table_create(struct session_table *t, const struct session_opts *opts, char **ret_id);
/* Persistence for the sessions created from now on (c borrowed, outliving the table):
 * their records, and their files and variables unless they ask not to. */
void session_table_set_persistence(struct session_table *t, const struct persist_config *c);
struct session_create {
    const struct session_opts *opts;
    bool no_persist;         /* keep nothing in the store (the record is still kept) */
    const char *resume_from; /* bring back what is stored for this session id */
    const char *id;          /* a takeover: the session keeps this id (resume_from), and its
                              * lease is already taken (fleet_lease_take); NULL: a new id */
};
/* As session_table_create; with resume_from, *ret_restored says what was restored (see
 * session_restore; caller decrefs), and -ENOENT means nothing is stored for that id. */
int session_table_create_ex(struct session_table *t, const struct session_create *rq, char **ret_id,
                            json_t **ret_restored);
/* Forks session src_id into count new sessions (count at most SESSION_FORK_MAX, all or
 * none: -EAGAIN past --max-sessions) that start from its files and variables, each a sandbox
 * of its own with src's options. 0 with *ret_forks [{id, restored}] (caller decrefs), or
 * -errno with err_msg(). */
#define SESSION_FORK_MAX 100
int session_table_fork(struct session_table *t, const char *src_id, unsigned count,
                       json_t **ret_forks);
/* The persistence the table gives its sessions (NULL: none). */
const struct persist_config *session_table_persistence(struct session_table *t);
/* Closes a session as session_table_remove does; with checkpoint, its variables and files
 * are kept in the store (*ret_report as session_retire's), otherwise what was stored is
 * discarded. 0 or -ENOENT. */
int session_table_close(struct session_table *t, const char *id, bool checkpoint,
                        json_t **ret_report);
/* Looks up a live session and takes a reference (drop it with session_table_put).
 * NULL with *ret_err = -ENOENT (never existed or closed) or -ETIME (expired for idleness).
 * A session being retired (reaped, or closed with a checkpoint) is waited for: once NULL is
 * returned, its stored record is final. */
struct session *session_table_acquire(struct session_table *t, const char *id, int *ret_err);
/* Drops the reference session_table_acquire took (not a release of caller-owned storage,
 * which _release means elsewhere). */
void session_table_put(struct session_table *t, struct session *s);
/* Returns once id is not being retired (at once if it is not): its stored record is final. */
void session_table_wait_retired(struct session_table *t, const char *id);
/* How many sessions a shutdown checkpoints at once (RETIRE_WORKERS_DEFAULT; at least 1). */
void session_table_set_retire_workers(struct session_table *t, size_t workers);
/* Names the node in the ids of sessions created from now on ("NODE-HEX"; NULL: hex only). */
void session_table_set_node(struct session_table *t, const char *node);
/* Retires a session as a shutdown does (variables checkpointed, files saved, its lease
 * released as "stopped"), so that its home node can resume it. 0 or -ENOENT. */
int session_table_handover(struct session_table *t, const char *id);
/* Drops a session whose lease another node took: out of the table, its kernel killed,
 * nothing written to the store (the successor's state is not touched). 0 or -ENOENT. */
int session_table_drop(struct session_table *t, const char *id);
/* Closes a session: gone from the table at once, freed when the last reference goes.
 * 0 or -ENOENT. */
int session_table_remove(struct session_table *t, const char *id);
/* Calls fn for each live session under the table lock (fn must not call back into t). */
void session_table_foreach(struct session_table *t,
                           void (*fn)(void *ctx, const char *id, struct session *s), void *ctx);
size_t session_table_count(struct session_table *t);
/* Interrupts every running cell (shutdown). */
void session_table_interrupt_all(struct session_table *t);
/* Kills every session's kernel without waiting (session_kill): the end of a shutdown. */
void session_table_kill_all(struct session_table *t);
/* Stops the reaper, closes every session, frees the table; NULL is a no-op. */
void session_table_free(struct session_table *t);

#endif
