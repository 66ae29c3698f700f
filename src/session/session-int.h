/* session-int.h - internals of the session module, shared by its files only. */
#ifndef RUNCELL_SESSION_INT_H
#define RUNCELL_SESSION_INT_H

#include <pthread.h>
#include <sys/stat.h>

#include "session/session.h"
#include "store/store.h"

/* ---- the states of a session (state.c) ----
 *
 *   begin           IDLE -> RUNNING, ARMED -> INTERRUPTING; refused while busy (-EBUSY)
 *   interrupt       RUNNING -> INTERRUPTING (an idle session has no cell to interrupt)
 *   interrupt_next  the same, and IDLE -> ARMED
 *   end             RUNNING, INTERRUPTING -> IDLE
 *   close           any -> CLOSED, which is final (begin there is -ESHUTDOWN) */
enum session_state {
    SESSION_IDLE,         /* no execution */
    SESSION_ARMED,        /* idle, and the next cell is interrupted as soon as it is sent */
    SESSION_RUNNING,      /* an execution (a cell, a restart) holds the session */
    SESSION_INTERRUPTING, /* ... and an interrupt is owed to it */
    SESSION_CLOSED,       /* being freed: nothing begins any more */
    SESSION_N_STATES,
};
enum session_event {
    SESSION_EV_BEGIN,          /* an execution starts */
    SESSION_EV_END,            /* it ended */
    SESSION_EV_INTERRUPT,      /* interrupt the running cell, if any */
    SESSION_EV_INTERRUPT_NEXT, /* interrupt the running cell, or the next one */
    SESSION_EV_CLOSE,
    SESSION_N_EVENTS,
};
/* The state ev leads to from st, or the -errno that refuses it: -EBUSY (begin while busy),
 * -ESHUTDOWN (begin once closed), -EINVAL (end with nothing begun, or no such state or
 * event). Pure: the caller holds the session's lock and stores the result. */
int session_state_next(enum session_state st, enum session_event ev);
/* Whether an execution holds a session in st (RUNNING or INTERRUPTING). */
bool session_state_busy(enum session_state st);
/* "idle", "armed", ... for messages and tests. */
const char *session_state_name(enum session_state st);

/* ---- the gate's inside (gate.c), for session.c ---- */
/* An execution starts waiting (in a session's queue): -EAGAIN when the waiting room is full.
 * g NULL: 0. */
int exec_gate_wait_begin(struct exec_gate *g);
void exec_gate_wait_end(struct exec_gate *g);
/* Takes a running place, waiting for one (until *cancelled turns true: false then). */
bool exec_gate_enter(struct exec_gate *g, const _Atomic bool *cancelled);
/* Takes a running place if one is free now. */
bool exec_gate_try_enter(struct exec_gate *g);
void exec_gate_leave(struct exec_gate *g);
/* Wakes those waiting in exec_gate_enter (one of them was cancelled). */
void exec_gate_wake(struct exec_gate *g);

/* ---- a place in a session's queue (session.c) ---- */
struct exec_turn {
    struct exec_turn *next;
    _Atomic bool cancelled; /* leave the queue without running */
    bool queued;            /* in the session's queue (its lock) */
    bool waiting;           /* counted by the gate as waiting */
    /* Called (no lock held) once the turn has come and the session is its, before the cell
     * is sent; may be NULL. */
    void (*on_start)(struct exec_turn *t);
    /* A cell that fails takes down what waits behind it (Jupyter's stop_on_error): those
     * end unrun as "aborted", before the next one could begin. */
    bool stop_on_error;
    bool aborted; /* cancelled by such a failure */
};
/* Takes t's place at the end of s's queue. 0, -EAGAIN (full), -ESHUTDOWN, with err_msg(). */
int session_enqueue(struct session *s, struct exec_turn *t);
/* Runs req as session_execute does, in t's place (enqueued by the caller, and out of the
 * queue when this returns). */
int session_execute_turn(struct session *s, struct exec_turn *t, const struct exec_request *req,
                         const struct exec_sink *sink, struct exec_record *rec);
/* Cancels t (queued, or waiting for the gate): it leaves without running. */
void session_turn_cancel(struct session *s, struct exec_turn *t);
/* Stops t: cancelled while it waits, its cell interrupted while it runs (nothing once it has
 * ended: the interrupt never reaches the execution after it). */
void session_turn_stop(struct session *s, struct exec_turn *t);

/* ---- pauses (snapshot.c), through session.c ---- */
/* The kernels go (a hibernation), or the session's own comes back (a resume). */
void session_stop_kernels(struct session *s);
int session_start_own_kernel(struct session *s);
/* The sandboxes of s's running kernels (at most two) into ret; how many. */
int session_kernel_sandboxes(struct session *s, struct sandbox *ret[2]);
/* What a paused session is resumed and let go with (snapshot.c's). */
struct session_pause_ops {
    /* Called (the session busy) before the next thing that begins in it. */
    int (*resume)(struct session *s);
    /* Called when a session still paused is freed: what its pause keeps in the store goes. */
    void (*release)(struct session *s);
};
/* Marks s paused (how) with ops; PAUSE_NONE and NULL once it is back. */
void session_set_pause(struct session *s, enum session_pause how,
                       const struct session_pause_ops *ops);

/* ---- the executions a session keeps (exec.c) ---- */
struct execution;
struct exec_key; /* exec.c */
struct exec_registry {
    pthread_mutex_t lock;
    struct execution *head, *tail; /* oldest first */
    size_t n;
    /* Idempotency keys (session_submit_keyed): a ring made at the first, under keys_lock,
     * which a keyed submit holds from its look-up to its registration. */
    pthread_mutex_t keys_lock;
    struct exec_key *keys;
    size_t next_key;
    /* Set by the first session_submit, called by session_free: the session goes, and its
     * executions are forgotten (those still referenced live on without a session). Through
     * a pointer, as persist_ops, so that a program that never submits (runcell run) links
     * none of exec.c, nor through it the session table and the store. */
    void (*release)(struct exec_registry *r);
};
struct exec_registry *session_registry(struct session *s);

/* ---- a session's programs beside its cells (procs.c), and what they need of it
 * (session.c) ---- */
struct session_procs;
/* A session's table of programs, with its thread not yet started (that comes with the first
 * program); freed by session_free (session_procs_free: every program ends as "lost"). */
struct session_procs *session_procs_new(struct session *s);
void session_procs_free(struct session_procs *p);
/* s's table (made with create, unless s is closed), or NULL. */
struct session_procs *session_procs_of(struct session *s, bool create);
/* Calls fn with the sandbox of s's kernel, s's lock held (so fn must not call back into s):
 * fn's result, -ESRCH while there is no kernel, -ESHUTDOWN once s is closed. */
int session_with_sandbox(struct session *s, int (*fn)(struct sandbox *sb, void *ctx), void *ctx);
/* The environment s's kernels start with: the defaults, the network's, HOME. Caller frees. */
char **session_env(struct session *s);

/* ---- event log (events.c): a capped, thread-safe ring of JSON events ---- */
struct event_log {
    pthread_mutex_t lock;
    json_t *ring[SESSION_EVENTS_MAX];
    size_t start, n;
    uint64_t seq;     /* of the newest event */
    uint64_t dropped; /* pushed out of the ring */
};
void event_log_init(struct event_log *l);
void event_log_release(struct event_log *l);
/* Adds ev (reference stolen) with the next seq and the time; returns its seq. */
uint64_t event_log_add(struct event_log *l, json_t *ev);
uint64_t event_log_seq(struct event_log *l);
/* Events with seq above after_seq as an array; type NULL for all. Caller owns it. */
json_t *event_log_since(struct event_log *l, uint64_t after_seq, const char *type);

/* ---- the sandbox side of a network policy (netcfg.c) ---- */
struct sandbox_net {
    struct egress *egress; /* the proxy; NULL when the policy is "none" */
    struct event_log *log; /* where its attempts go (borrowed) */
    const char *binds[5];  /* pairs for sandbox_spec: its directory at NET_SANDBOX_DIR, and
                            * the CA bundle over the system's trust store when it has a CA */
    char *bundle;          /* that bundle's host path */
    char **env_extra;      /* proxy variables and PIP_INDEX_URL */
};
/* Starts the egress proxy for n->policy (if any) on ws, logging into log. 0 or -errno. */
int sandbox_net_start(struct sandbox_net *sn, const struct net_opts *n, struct workspace *ws,
                      struct event_log *log);
void sandbox_net_stop(struct sandbox_net *sn);
/* Masks the values of the proxy's secrets in rec's text (streams, results, error, message):
 * an upstream that echoes a request's headers back must not put them in a record. */
void sandbox_net_scrub_record(struct sandbox_net *sn, struct exec_record *rec);
/* The same for a chunk of output as it streams: a masked copy (caller frees), or NULL when
 * there is nothing to mask (no secrets, or none in it; sn may be NULL). A value split
 * between two chunks is masked in the record only. */
char *sandbox_net_scrub_copy(struct sandbox_net *sn, const char *data, size_t n);
/* ... and for every string below j (a result bundle), in place. */
void sandbox_net_scrub_json(struct sandbox_net *sn, json_t *j);
/* The network of a session (session.c). */
struct sandbox_net *session_sandbox_net(struct session *s);
/* Fills spec's binds, relay and env (default env + extras, which the caller frees with
 * strv_free) for a sandbox on this network. extra_binds (may be NULL) come first. */
char **sandbox_net_apply(const struct sandbox_net *sn, struct sandbox_spec *spec,
                         const char **binds_storage, size_t storage_len,
                         const char *const *extra_binds);

/* ---- running one sandbox to its end (oneshot.c) ---- */
/* Copies files into ws, refusing destinations outside it. 0 or -errno with err_msg(). */
int copy_input_files(struct workspace *ws, const struct input_file *files, size_t n);
struct run_io {
    uint64_t timeout_ms;
    int cancel_fd;       /* -1 for none */
    output_fn on_output; /* may be NULL */
    void *ctx;
    const char *stdin_text; /* the program's whole stdin, or NULL for /dev/null */
};
/* Starts spec (its stdio fds are replaced by pipes and /dev/null, or stdin_text) on ws, pumps
 * its output
 * into rec, enforces the timeout and fills rec's status, usage and message. Always returns
 * with rec describing the outcome. */
void run_sandbox(struct sandbox_host *host, struct workspace *ws, struct sandbox_spec *spec,
                 const struct run_io *io, struct exec_record *rec);

/* ---- installing packages (deps.c) ---- */
/* Whether there is anything to install for n on ws (packages, or a requirements.txt when a
 * policy lets pip reach an index). */
bool deps_wanted(const struct net_opts *n, struct workspace *ws);
/* Installs them with pip in a sandbox of its own on ws, within n->install_timeout_ms;
 * returns the report (see session_packages), never NULL. */
json_t *deps_install(struct sandbox_host *host, struct workspace *ws,
                     const struct sandbox_limits *limits, const struct net_opts *n,
                     const struct sandbox_net *sn);

struct persist;

/* ---- manifest.c: what the store holds of one session ----
 *
 * sessions/ID/manifest.json lists the files (path, mode, mtime, size, SHA-256) and the
 * variables' checkpoint; sessions/ID/blobs/SHA256 holds contents, once per distinct content.
 * Blobs go first and the manifest last, so a manifest never names a blob that was not
 * written whole; blobs no manifest names any more are removed after. */

struct mentry {
    char *path;
    char *target; /* symlinks: where they point; NULL for files */
    uint64_t size;
    int64_t mtime_ns;
    uint64_t ino; /* as last scanned; 0 after a load */
    mode_t mode;  /* with the file type bits */
    char sha[SHA256_HEX_SIZE];
    char *json; /* its text in the stored list, once made (manifest.c); NULL before */
};

struct manifest {
    struct mentry *v; /* sorted by path */
    size_t n;
    json_t *variables; /* {sha256, size, saved, modules, skipped, at} or NULL */
    /* The store's version of this list as read or last written here (a fleet writes it by
     * compare-and-swap from that version); have_version false: none known. */
    char version[STORE_VERSION_SIZE];
    bool have_version;
};

void manifest_release(struct manifest *m);
char *manifest_key(const char *id);
/* Reads the manifest of id. -ENOENT when there is none; -EBADMSG when it is corrupted;
 * other -errno from the store; each with err_msg(). */
int manifest_load(struct store *st, const char *id, struct manifest *ret);
/* A fleet's takeover of id: writes the list just loaded into m again, stamped with this
 * node's lease generation, so that the node that held the session before can no longer
 * write its own (its compare-and-swap fails, and the later generation tells it why). 0 with
 * m's version updated, or -errno with err_msg(). */
int manifest_claim(const struct persist_config *c, const char *id, struct manifest *m);
/* Distinct blob bytes the manifest holds (files and variables): what counts for the quota. */
uint64_t manifest_bytes(const struct manifest *m);
/* Brings the store's copy of session id in line with the workspace (after: a fresh scan),
 * replacing *m on success. variables: the new checkpoint (reference stolen), or NULL to keep
 * m's. 0, or -errno with *ret_error (caller frees) naming what was not saved and why; what
 * could be saved is saved. */
int manifest_save(const struct persist_config *c, const char *id, struct manifest *m,
                  struct workspace *ws, const struct ws_listing *after, json_t *variables,
                  char **ret_error);
/* As manifest_save; with ret_old, the list that was replaced (when it differs) is handed
 * there rather than freed, and no blob is deleted: a history keeps naming them (see
 * manifest_drop_blobs). */
int manifest_save_keep(const struct persist_config *c, const char *id, struct manifest *m,
                       struct workspace *ws, const struct ws_listing *after, json_t *variables,
                       struct manifest *ret_old, char **ret_error);
/* Deletes the blobs of gone that none of keep (n_keep lists) names. Best effort, logged. */
void manifest_drop_blobs(const struct persist_config *c, const char *id,
                         const struct manifest *gone, const struct manifest *keep, size_t n_keep);
/* Writes m's files from session from_id's blobs into ws; appends restored paths to ok and
 * {path, error} to failed. */
void manifest_restore_files(struct store *st, const char *from_id, const struct manifest *m,
                            struct workspace *ws, json_t *ok, json_t *failed);
/* Copies blob sha of from_id into workspace file rel (created, owned by the sandbox user)
 * and checks it; 0 or -errno with err_msg(). */
int blob_to_workspace(struct store *st, const char *from_id, const char *sha, uint64_t size,
                      struct workspace *ws, const char *rel);
/* Whether a workspace file of this stat may be read into the store: -EFBIG for a sparse
 * file (apparent size well past its allocated blocks), -EDQUOT past quota (0 = none), with
 * err_msg(); checked before a byte is read. */
int blob_admissible(const struct stat *st, uint64_t quota);
/* Stores workspace file rel as a blob of id (refused as blob_admissible says); *ret_sha and
 * *ret_size say what was stored. */
int blob_from_workspace(struct store *st, const char *id, struct workspace *ws, const char *rel,
                        char ret_sha[SHA256_HEX_SIZE], uint64_t *ret_size);
/* Removes everything stored for id, the manifest first. 0 or -errno with err_msg(). */
int store_discard(struct store *st, const char *id);
/* Removes blobs of id that m does not name (left by a crash between a blob and its
 * manifest). Best effort. */
void store_collect_garbage(struct store *st, const char *id, const struct manifest *m);
/* The same, keeping what any of the n lists ms names. */
void store_collect_garbage_of(struct store *st, const char *id, const struct manifest *ms,
                              size_t n);
/* Restores one entry of a manifest (file from from_id's blob, or link) into ws. 0 or -errno
 * with err_msg(). */
int manifest_restore_entry(struct store *st, const char *from_id, const struct mentry *e,
                           struct workspace *ws);

/* What session.c calls of persist.c, through the pointers session_persist hands it rather
 * than by name: a program that never persists (runcell run) then links none of the store and
 * loads neither libcurl, SQLite nor libcrypto at its start (docs/PERFORMANCE.md). */
struct persist_ops {
    /* After each execution, the session busy, `after` the workspace as it left it. */
    void (*after_execute)(struct persist *p, struct workspace *ws, const struct ws_listing *after,
                          struct exec_record *rec);
    /* When the session is freed. */
    void (*free)(struct persist *p);
    /* Puts the workspace back as it was before execution `before` (the session busy): a
     * report {restored, removed, failed} or {kept: false, why}; may be NULL. */
    json_t *(*undo_files)(struct persist *p, struct workspace *ws, long before);
    /* Whether its files go to a store (session_stores_files). */
    bool (*stores_files)(struct persist *p);
    /* The session's network changed: its records take the new one (may be NULL). */
    void (*network_changed)(struct persist *p, struct session *s);
};
/* Tells the session's persistence that its network changed (netcfg.c). */
void session_network_changed(struct session *s);
/* The lists named by keys (NULL-terminated) of a kernel's reply as they may be kept: at
 * most REPLY_MAX_ITEMS items of short strings (or small objects of them), and
 * "lists_cut_at" when items were left out. Caller owns it. */
json_t *persist_capped_reply(json_t *reply, const char *const *keys);

/* A history of files for session_undo in a session that keeps nothing in a store: its own
 * store in a directory beside the workspace (out of the sandbox's reach), dropped with it.
 * Operations through a pointer, as persist_ops, so that a program that keeps no history
 * (runcell run) links none of the store; a program that does calls
 * session_enable_files_history(&persist_local_ops) once (the session table does). */
struct files_history_ops {
    /* At most quota_bytes kept (0: no cap). NULL when it cannot be made (logged). */
    struct persist *(*open)(struct workspace *ws, uint64_t quota_bytes);
    /* Saves the workspace (listing: as a scan just found it; NULL: scanned here) as the
     * state after cell `cell` (0: a change between cells), keeping the last depth cells'. */
    void (*save)(struct persist *p, struct workspace *ws, const struct ws_listing *listing,
                 long cell, unsigned depth);
    /* The workspace put back as it was before cell `before`: as persist_ops.undo_files. */
    json_t *(*undo)(struct persist *p, struct workspace *ws, long before);
    void (*free)(struct persist *p);
};
extern const struct files_history_ops persist_local_ops;
void session_enable_files_history(const struct files_history_ops *ops);
/* A change to s's files between cells, for its local history of files (if any). */
void session_files_changed(struct session *s);

/* session.c, for persist.c. */
struct persist *session_get_persist(struct session *s);
void session_set_persist(struct session *s, struct persist *p, const struct persist_ops *ops);
/* Marks s busy (waiting up to wait_ms for a running cell: 0 = not at all), runs fn, marks
 * it idle again. -EBUSY when a cell still runs, -ESHUTDOWN when closed, else fn's result. */
int session_run_exclusive(struct session *s, uint64_t wait_ms,
                          int (*fn)(struct session *s, void *ctx), void *ctx);
/* As session_run_exclusive, but a paused session is not resumed first (the pause's own
 * operations). */
int session_run_exclusive_raw(struct session *s, uint64_t wait_ms,
                              int (*fn)(struct session *s, void *ctx), void *ctx);
/* The persistence p was made with (persist.c). */
const struct persist_config *persist_config_of(struct persist *p);
/* A variables request to the kernel (see kernel_request), within the session's execution
 * timeout; the caller runs exclusively. A kernel that fails it is replaced (variables
 * lost). 0 with *ret_reply, or -errno with err_msg(). */
int session_kernel_request(struct session *s, const char *type, const char *path,
                           json_t **ret_reply);

/* session.c: one execution's record from its kernel's channel alone, without a session or
 * a sandbox around it, for tests/fuzz/fuzz-record.c. Reads k's channel until a done
 * message, EOF or a protocol violation, through the event handling of run_cell (live
 * events to sink, which may be NULL), and fills rec (initialised by the caller) from the
 * done message as run_cell does. Returns 0 after a done message, 1 at EOF, -EPROTO. */
struct kernel;
int session_record_from_channel(struct kernel *k, const struct exec_sink *sink,
                                struct exec_record *rec);

#endif
