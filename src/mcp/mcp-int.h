/* mcp-int.h - internals of the MCP server, shared by src/mcp/ only. */
#ifndef RUNCELL_MCP_INT_H
#define RUNCELL_MCP_INT_H

#include <pthread.h>

#include "mcp/mcp.h"

/* What a protocol version has, beyond 2024-11-05. */
enum version_feature {
    VF_ANNOTATIONS = 1 << 0,      /* tool annotations (2025-03-26) */
    VF_PROGRESS_MESSAGE = 1 << 1, /* notifications/progress carries a message (2025-03-26) */
    VF_BATCH = 1 << 2,            /* JSON-RPC batches (2025-03-26 only) */
    VF_STRUCTURED = 1 << 3,       /* structuredContent and outputSchema (2025-06-18) */
    VF_TITLES = 1 << 4,           /* title on tools and serverInfo (2025-06-18) */
    VF_ARGS_AS_RESULTS = 1 << 5,  /* bad tool arguments are tool errors, not -32602 (2025-11-25) */
    VF_DESCRIPTION = 1 << 6,      /* serverInfo.description (2025-11-25) */
    /* 2026-07-28: no initialize, per-request _meta, resultType and serverInfo on every result,
     * cacheable lists, sessions only through explicit session_id handles */
    VF_MODERN = 1 << 7,
};

/* _meta keys of revision 2026-07-28 */
#define META_VERSION      "io.modelcontextprotocol/protocolVersion"
#define META_CAPABILITIES "io.modelcontextprotocol/clientCapabilities"
#define META_CLIENT       "io.modelcontextprotocol/clientInfo"
#define META_LOG_LEVEL    "io.modelcontextprotocol/logLevel"
#define META_SERVER       "io.modelcontextprotocol/serverInfo"
#define EXT_TASKS         "io.modelcontextprotocol/tasks"
/* How long a client may keep server/discover and tools/list answers (they change only with
 * the server's version). */
#define LIST_TTL_MS 3600000

struct version {
    const char *name;
    unsigned features;
};

/* The way back for one input: responses (collected into an array for a batch) and
 * notifications go to the transport's sink; the sink is closed when the last reference
 * goes. */
struct reply {
    pthread_mutex_t lock;
    int refs;
    struct mcp_sink sink;
    json_t *batch; /* responses of a batch, or NULL for a single message */
};
void reply_ref(struct reply *r);
void reply_unref(struct reply *r);
/* Sends a response (stolen) for the input, or adds it to the batch. */
void reply_respond(struct reply *r, json_t *msg);
/* Sends a notification (stolen) at once. */
void reply_notify(struct reply *r, json_t *msg);

/* ---- JSON-RPC messages (jsonrpc.c) ---- */
json_t *rpc_result(json_t *id, json_t *result); /* result stolen */
/* A result response as version features ask: on the modern era, resultType "complete" (unless
 * result has one) and _meta with serverInfo. result stolen. */
json_t *rpc_result_for(const struct mcp_config *cfg, unsigned features, json_t *id, json_t *result);
/* An error response with data (stolen, may be NULL). */
json_t *rpc_error_data(json_t *id, int code, const char *message, json_t *data);
json_t *rpc_error(json_t *id, int code, const char *message);
json_t *rpc_notification(const char *method, json_t *params); /* params stolen */

/* ---- executions (exec.c): how tools and tasks run a cell ----
 *
 * The tools and the tasks extension run cells only through these operations; the one
 * implementation is the session layer's durable executions (an id, a kept event log, a FIFO
 * queue per session, re-attach), so a cell started over MCP is the same execution the native
 * API lists. */

struct mcp_exec; /* one execution; opaque */

struct mcp_exec_start {
    struct session_table *table;
    const char *session_id;
    const char *code, *lang;
    uint64_t timeout_ms; /* 0: the session's default */
};

/* One event of an execution, numbered from 1 in the order it came. */
struct mcp_exec_event {
    uint64_t seq;
    enum exec_event_type type;
    char *data; /* EV_STDOUT, EV_STDERR: the chunk */
    size_t len;
    json_t *json; /* EV_RESULT, EV_ERROR */
    size_t cost;  /* about the bytes it holds */
};

/* What a poll saw; release with mcp_exec_poll_release. */
struct mcp_exec_poll {
    struct mcp_exec_event *events; /* those after the cursor, in order */
    size_t n;
    uint64_t next; /* the cursor for the next poll */
    bool done;
    /* When done: 0 when rec describes the run; else -errno: -ENOENT no such session,
     * -EAGAIN no execution slot, -EBUSY the session stayed busy past the timeout,
     * -ECANCELED cancelled (before or while it ran), with message saying what happened. */
    int err;
    char *message;
    const struct exec_record *rec; /* when done and err is 0; borrowed until release() */
};
void mcp_exec_poll_release(struct mcp_exec_poll *p);

struct mcp_exec_ops {
    /* Starts the execution (it waits its turn while the session runs another cell, for as
     * long as its own timeout). 0 and *ret, or -errno with err_msg(). */
    int (*start)(const struct mcp_exec_start *req, struct mcp_exec **ret);
    /* The events after cursor after (0: from the first) and whether it has ended; waits up to
     * wait_ms for something new when there is nothing yet. 0, or -errno. */
    int (*poll)(struct mcp_exec *x, uint64_t after, int wait_ms, struct mcp_exec_poll *ret);
    /* Interrupts the cell (KeyboardInterrupt: the session's state is kept); one that has not
     * started never runs. Safe from any thread, more than once. */
    void (*cancel)(struct mcp_exec *x);
    /* The caller is done with x (an execution still running goes on to its end). */
    void (*release)(struct mcp_exec *x);
};

/* The session layer's durable executions (session_submit): each waits its turn in its
 * session's queue and passes the server's gate, as every surface's do. */
extern const struct mcp_exec_ops mcp_exec_durable_ops;
/* The execution's id, as the native API names it (GET /v1/sessions/{id}/executions/{eid}). */
const char *mcp_exec_id(const struct mcp_exec *e);

/* ---- one connection (conn.c) ---- */

/* Every version this server speaks, modern first (server/discover, -32022's data). */
json_t *versions_json(void);
struct call;

struct task;

struct mcp_conn {
    const struct mcp_config *cfg;
    const struct mcp_exec_ops *exec;
    bool shared; /* mcp_conn_new_shared */
    pthread_mutex_t tasks_lock;
    struct task *tasks; /* of the tasks extension (tasks.c) */
    size_t n_tasks;
    size_t max_calls;
    pthread_mutex_t lock;
    pthread_cond_t idle;           /* broadcast when a call ends */
    const struct version *version; /* NULL until initialize */
    struct call *calls;            /* running tool calls */
    size_t n_calls;
    uint64_t last_active_ms; /* when the last call ended (now_ms) */
    bool closing;
    char *end_reason;             /* set by mcp_conn_end: cancelled calls answer with it */
    char **owned;                 /* ids of the sessions this connection created (strv) */
    char *default_id;             /* its default session, or NULL before the first use */
    pthread_mutex_t default_lock; /* held while the default session is looked up or made */
    char *default_known;          /* a copy of default_id under lock, for call_start (which must not
                                   * wait for default_lock while a session is being made) */
    uint64_t next_seq;            /* of the next call, in arrival order */
};

/* One request being served: the version it is served under, and on the modern era the
 * capabilities the client declared with it. */
struct req {
    struct mcp_conn *c;
    const struct mcp_msg *m;
    struct reply *r;
    const struct version *v; /* NULL: a legacy request before initialize */
    json_t *caps;            /* modern era: the request's clientCapabilities (borrowed) */
    bool refused;            /* set by a method that refused it (HTTP: 400) */
};

static inline unsigned req_features(const struct req *q)
{
    return q->v ? q->v->features : 0;
}

/* ---- tool calls (call.c) ---- */
struct tool;

struct call {
    struct mcp_conn *c;
    struct reply *reply;
    json_t *id;
    json_t *progress_token; /* NULL when the client asked for no progress */
    const struct tool *tool;
    json_t *args;
    /* Calls on one session run one at a time in arrival order: lane names the session
     * (DEFAULT_LANE for the default one, NULL for calls on none) and seq the arrival. */
    char *lane;
    uint64_t seq;
    unsigned features; /* of the version the request is served under */
    bool tasks;        /* the client declared the tasks extension: the call may become a task */
    bool handed_over;  /* answered with a task: its stream's end no longer cancels it */
    int cancel[2];     /* a byte in cancel[1] interrupts the running cell */
    atomic_bool cancelled;
    struct call *next;
    /* progress notifications */
    pthread_mutex_t plock;
    pthread_cond_t pwake;
    bool finished;
    double t0_ms, last_sent_ms, last_progress;
    char *last_output; /* the latest line of output, for the progress message */
    bool new_output;
};

/* What a tools/call asks for. */
struct call_params {
    const struct tool *tool;
    json_t *id, *args;
    json_t *progress_token; /* NULL when the client asked for no progress */
    unsigned features;
    bool tasks; /* the client declared the tasks extension with the request */
};

/* Starts a tool call on its own thread; the call owns a reference to reply and copies of
 * id, token and args. -errno (-EAGAIN: too many calls) with nothing started. */
int call_start(struct mcp_conn *c, const struct call_params *p, struct reply *reply);
/* Interrupts the call with this request id, if it runs; true when one was found. */
bool call_cancel(struct mcp_conn *c, json_t *id);
/* Notes output of the running cell for the next progress notification. */
void call_output(struct call *k, const char *data, size_t len);

/* Takes a reference on the session a call names (session_id) or on the connection's default
 * session (created on first use; a note in *ret_note, caller frees, when an expired default
 * was replaced). NULL with *ret_err (caller frees) when there is none. *ret_id: the id,
 * caller frees. Release with session_table_put. */
struct session *call_session(struct call *k, char **ret_id, char **ret_note, char **ret_err);
/* Creates a session; on the legacy era the connection owns it (closed with it), on the modern
 * era it lives by its idle timeout or until close_session. 0 and *ret_id, or -errno with
 * err_msg(). */
int conn_create_session(struct mcp_conn *c, const char *lang, uint64_t timeout_ms, int history,
                        bool owned, char **ret_id);
/* Closes a session; forgets it as the default or as owned. 0 or -ENOENT. */
int conn_close_session(struct mcp_conn *c, const char *id);

/* ---- the tasks extension (tasks.c) ---- */

/* Whether the client declared io.modelcontextprotocol/tasks with this request. */
bool req_declares_tasks(const struct req *q);
/* Turns a running execution of call k into a task: the task takes x (and sid, note), and
 * the result to answer k with is returned (a CreateTaskResult). NULL when the connection
 * holds its most tasks (x stays the caller's). */
json_t *task_adopt(struct call *k, struct mcp_exec *x, uint64_t seen, const char *sid,
                   const char *note);
/* The same for a call past the reply deadline, on any era: the result to answer k with is a
 * CallToolResult saying the cell still runs, with the run_id (the task's id) that
 * wait_for_cell takes. NULL when the table is full. */
json_t *task_continue(struct call *k, struct mcp_exec *x, uint64_t seen, const char *sid,
                      const char *note);
/* wait_for_cell: waits up to wait_ms for run id to end; its CallToolResult, or one saying it
 * still runs. */
json_t *task_wait(struct call *k, const char *id, uint64_t wait_ms);
void m_tasks_get(struct req *q);
void m_tasks_update(struct req *q);
void m_tasks_cancel(struct req *q);
/* Cancels and forgets every task (the connection is freed). */
void tasks_free_all(struct mcp_conn *c);

/* ---- the tools (tools.c) ---- */
enum arg_type { ARG_STRING, ARG_NUMBER /* more than 0 */, ARG_COUNT /* a whole number, >= 0 */ };

struct arg {
    const char *name;
    enum arg_type type;
    bool required;
    const char *const *choices; /* NULL-terminated; NULL for any value */
    const char *description;
};

struct tool {
    const char *name;
    const char *title;
    const char *description;
    const struct arg *args;
    size_t n_args;
    bool read_only, destructive, idempotent;
    const char *output_schema; /* JSON text */
    /* Runs the call; returns a CallToolResult object. */
    json_t *(*run)(struct call *k);
    bool no_session; /* works on no existing session (create_session): no lane */
};

const struct tool *tool_find(const char *name);
/* The CallToolResult of a finished execution of tool t in session sid: from the poll that
 * saw it end (p->err, p->message or p->rec), with note (may be NULL) first. */
json_t *exec_tool_result(const struct mcp_config *cfg, const struct tool *t, unsigned features,
                         const char *sid, const char *note, const struct mcp_exec_poll *p);
/* The tools/list result for a protocol version; caller decrefs. */
json_t *tools_list_json(const struct mcp_config *cfg, unsigned features);
/* mcp_tool_check_args for a protocol version (the modern era requires session_id). */
int tool_check_args(const struct tool *t, json_t *args, unsigned features, char **ret_err);
/* Whether a tool needs an existing session (all but create_session). */
bool tool_takes_session(const struct tool *t);
/* {"content":[{"type":"text","text":...}],"isError":true}; caller decrefs. */
json_t *tool_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The names of all tools, comma-separated, for messages; static storage. */
const char *tool_names(void);

/* ---- what a model reads of a result (content.c) ---- */

/* {"type":"text","text":text}; caller decrefs. */
json_t *text_item(const char *text);
/* The content of an execution's result for a model, from its record (exec_record_json): one
 * text part first that sums the run up (output, values, traceback, what runcell says, the
 * files it changed; each trimmed to what a model can use), then each image with a short text
 * part before it ("figure 1: PNG, 640x480, 29 KB"). features: VF_STRUCTURED says the full
 * record goes along as structuredContent, which the trimming points to, and a last part
 * names the session and the cell. Caller decrefs. */
json_t *record_content(json_t *rec, unsigned features, const char *session_id);
/* The record for structuredContent: session_id added, images named instead of repeated as
 * base64. Caller decrefs. */
json_t *record_structured(json_t *rec, const char *session_id);
/* "LABEL: PNG, 640x480, 29 KB" for an image of type mime given as base64 (dimensions left
 * out when they cannot be read). Caller frees. */
char *image_caption(const char *label, const char *mime, const char *b64, size_t b64_len);

#endif
