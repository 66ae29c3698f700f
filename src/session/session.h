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
/* The record as DESIGN.md's JSON object; caller owns the reference. Output that is not
 * valid UTF-8 is repaired with U+FFFD. */
json_t *exec_record_json(const struct exec_record *r);
/* The `runcell run` exit status for this record: the program's own, 124 timeout, 128+N
 * signal (137 OOM), 125 sandbox setup failure. */
int exec_record_exit_status(const struct exec_record *r);
/* ---- figures: the images a cell displayed, as files (figure.c) ---- */

/* The image of a MIME bundle a cell displayed: its base64 text, image/png's if it has one,
 * else image/jpeg's, with *ret_mime; NULL when it has neither. */
const char *exec_bundle_image(json_t *bundle, const char **ret_mime);
/* Saves the Nth image (from 1) that cell CELL displayed, base64 b64 of type image/png or
 * image/jpeg, as "figure-CELL-N.png" (.jpg): one name everywhere images are saved (run --out,
 * the REPL, the agent), so a person can tell which cell made which. Into host directory
 * out_dir (made when missing) when it is not NULL, else into ws (owned by the sandbox user,
 * see workspace_write). 0 and *ret_name, the file name (caller frees), or -errno with
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
    const struct net_policy *policy; /* NULL: loopback only; else an allowlist enforced by an
                                      * egress proxy (borrowed; sessions copy it) */
    char *const *packages;       /* pip requirements installed before the code runs; NULL: those of
                                  * /workspace/requirements.txt when there is a policy */
    const char *index_url;       /* PIP_INDEX_URL in the sandbox, or NULL for pip's default */
    uint64_t install_timeout_ms; /* budget for installing packages (default 120 s) */
};
#define DEFAULT_INSTALL_TIMEOUT_MS 120000
#define MAX_PACKAGES               200
/* Checks net opts: packages need a policy, are plain requirements (never pip options), and
 * the index URL's host and port are on the allowlist. 0 or -EINVAL with err_msg(). */
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
    const char *lang;    /* "python" (default), "bash" or "javascript": one of the
                          * session's kernel (javascript sessions run javascript only) */
    uint64_t timeout_ms; /* 0 = the session's default */
    int cancel_fd;       /* interrupts the cell when it polls ready; -1 (or 0 when
                          * cancel_events is 0 too) for none */
    short cancel_events; /* poll events for cancel_fd: 0 = POLLIN (a pipe); POLLRDHUP for
                          * a client socket that hangs up */
};

struct session;

/* Creates a session: a workspace and a kernel running in a sandbox on it. 0 or -errno with
 * err_msg(); *ret owned by the caller (session_free). */
int session_new(struct sandbox_host *host, const struct session_opts *opts, struct session **ret);
/* Runs one cell and fills rec (initialised by the caller). Returns 0 when rec describes the
 * execution (whatever its status), -EBUSY when another execution is running (never queued),
 * -ESHUTDOWN when the session is closed, -EINVAL for a bad request (err_msg() says why).
 * sink may be NULL; req->cancel_fd interrupts the cell. A kernel that dies (timeout past the
 * grace, out of memory, crash) is replaced by a fresh one on the same workspace, and the
 * record says state "lost". */
int session_execute(struct session *s, const struct exec_request *req, const struct exec_sink *sink,
                    struct exec_record *rec);
/* session_execute runs its work at a lower priority (nice +5) and leaves the calling thread
 * so; this gives it back, for a thread that goes on to other work (the HTTP server calls it
 * before each request that is not an execution). Nothing when the thread is not lowered. */
void session_work_priority_reset(void);
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
/* What installing the session's packages did: {"source": "packages"|"requirements.txt",
 * "requested": [...], "installed": [...], "missing": [{"requirement", "name", "reason"}],
 * "status": "ok"|"partial"|"failed"|"timeout", "seconds": S}; NULL when nothing was to
 * install. Borrowed; valid while the session lives. */
json_t *session_packages(struct session *s);
/* The session's network policy (NULL: loopback only); valid while the session lives. */
const struct net_policy *session_net_policy(struct session *s);
/* The session's event log (egress attempts, ...), oldest first: {"events": [{"seq", "time",
 * "type", ...}], "dropped": N, "last_seq": N} with the events whose seq is above after_seq;
 * at most SESSION_EVENTS_MAX are kept. Caller owns the reference. */
json_t *session_events(struct session *s, uint64_t after_seq);
#define SESSION_EVENTS_MAX 1000

/* Whether the current kernel runs without cgroup limits. */
bool session_limits_degraded(struct session *s);
/* Kills the kernel's sandbox without waiting for it (so that many can die at once before
 * session_free reaps them). Safe from any thread. */
void session_kill(struct session *s);
/* Kills the kernel and removes the workspace; NULL is a no-op. */
void session_free(struct session *s);

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
    struct store *store;  /* where files and variables go (borrowed) */
    struct meta_db *meta; /* session records (borrowed); NULL for none */
    uint64_t quota_bytes; /* bytes stored per session at most; 0 = no limit */
    uint64_t max_files;   /* files and links stored per session at most; 0 = the default */
    const char *owner;    /* this process's owner id, recorded with its live sessions */
    struct fleet *fleet;  /* leases in the shared store (lease.c), or NULL for none */
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
