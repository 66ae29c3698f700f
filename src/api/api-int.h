/* api-int.h - internals of the HTTP server, shared by its files only. */
#ifndef RUNCELL_API_INT_H
#define RUNCELL_API_INT_H

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>

#include "api/api.h"

struct metrics;
struct mcp_http;
struct e2b;

struct server {
    const struct server_config *cfg;
    struct sandbox_host host;
    struct session_table *table;
    struct session_pool *pool;
    struct store *store;
    struct meta_db *meta;
    struct persist_config persist; /* store and meta, for the session table */
    char *node;                    /* this node's name (in ids, X-Runcell-Node) */
    struct fleet *fleet;           /* leases in the shared store (--fleet), or NULL */
    int watchdog_fd;               /* the fleet watchdog's pipe until the fleet takes it */
    struct metrics *metrics;
    struct mcp_http *mcp; /* MCP sessions of /mcp */
    struct e2b *e2b;      /* E2B's sandboxes (--e2b), or NULL */
    struct MHD_Daemon *mhd;
    struct conn_guard *conns;
    char *token;
    bool token_generated;     /* made at this start (and printed): the login URL may show it */
    atomic_size_t executions; /* running now */
    /* Requests that took an execution slot and whose response is not sent yet: a shutdown
     * waits for these too, or it would hang up on a reply its cell has made. */
    atomic_size_t replies_owed;
    atomic_bool shutting_down;
    /* One-shot runs in flight: no session of the table, but a shutdown interrupts them
     * too. */
    pthread_mutex_t oneshots_lock;
    struct oneshot_run *oneshots;
    bool oneshots_interrupted; /* the grace is over: a one-shot registered after is too */
};

/* Where a request is: libmicrohttpd calls the handler once for the headers, once per body
 * chunk, and once at the end. A reply can be queued only in the first and the last call. */
enum request_phase { PHASE_HEADERS, PHASE_BODY, PHASE_DONE };

/* A request in flight; lives from the URI callback to the completion callback. */
struct request {
    struct server *srv;
    struct MHD_Connection *conn;
    const struct route *route;
    char method[16];       /* for the log */
    bool url_has_nul;      /* "%00" in the raw URL: the decoded URL was cut short */
    bool http10;           /* an HTTP/1.0 request (no Host needed) */
    bool authenticated;    /* it carried the token */
    char *params[2];       /* {id}, {path} as matched */
    struct buf body;       /* JSON request body, capped */
    struct upload *upload; /* PUT of a file: streamed to disk */
    enum request_phase phase;
    /* A reply made before the body has arrived waits for it (read and dropped, up to
     * DRAIN_MAX bytes), so that a client that sends its whole body before reading still
     * hears why it was refused; queued now, libmicrohttpd would close mid-body. */
    bool hold_reply;
    struct MHD_Response *held;
    uint64_t dropped;
    int status; /* as sent, for the log */
    double t0_ms;
    char *session_id; /* for the log */
    bool responded;
    bool owes_reply;         /* counted in srv->replies_owed until completed */
    json_t *takeover;        /* this request resumed its session here: {resumed, lost, ...} */
    char *raw_uri;           /* as the client sent it, query included (for forwarding) */
    struct forward *forward; /* the request goes to the node that owns its session */
    struct net_policy *net;  /* the network policy a create body asked for */
    char **packages;         /* ... and its packages */
};
#define DRAIN_MAX (16u << 20)
/* What is read and dropped after an early reply to rq (see hold_reply): DRAIN_MAX, or for
 * an authenticated upload as much as the server takes in one, so that a client that ran a
 * workspace full hears 413 instead of a reset. */
uint64_t drain_max(const struct request *rq);
/* How long an authenticated connection may sit idle between requests. */
#define CONNECTION_IDLE_TIMEOUT_S 300u

enum route_flags {
    ROUTE_NO_AUTH = 1 << 0,
    ROUTE_STREAM_BODY = 1 << 1, /* the body goes to route->upload, not into rq->body */
    /* runs a cell: the thread keeps the lower priority of session work between such
     * requests (session_work_priority_reset); every other route gets it back first */
    ROUTE_EXECUTES = 1 << 2,
};

struct route {
    const char *method;
    const char *pattern; /* segments; "{id}" one segment, "{path}" the rest */
    enum MHD_Result (*handle)(struct request *rq);
    unsigned flags;
    /* ROUTE_STREAM_BODY only: called for each chunk, then handle() at the end. */
    int (*upload)(struct request *rq, const char *data, size_t n);
    /* ROUTE_STREAM_BODY, optional: looks at the request before its body is asked for (so
     * before "100 Continue"); declared is its Content-Length, UINT64_MAX when it has none.
     * False after replying. */
    bool (*admit)(struct request *rq, uint64_t declared);
};

/* The route for method on url (server.c), its {id} and {path} in params (caller frees); or
 * NULL, and allow lists the methods the path takes (empty for a path no route has). */
const struct route *route_match(const char *url, const char *method, char *params[2],
                                struct buf *allow);

/* ---- replies (http.c): every error goes through api_error, the one place that maps
 * internal errors to an HTTP status and a JSON error code. ---- */
enum api_err {
    AE_BAD_REQUEST,    /* 400 bad_request */
    AE_BAD_PATH,       /* 400 bad_path */
    AE_UNAUTHORIZED,   /* 401 unauthorized */
    AE_NOT_FOUND,      /* 404 not_found */
    AE_EXPIRED,        /* 404 expired */
    AE_METHOD,         /* 405 method_not_allowed */
    AE_BUSY,           /* 409 busy */
    AE_TOO_LARGE,      /* 413 too_large */
    AE_LIMIT,          /* 429 limit_exceeded */
    AE_INTERNAL,       /* 500 internal */
    AE_SANDBOX,        /* 503 sandbox_error */
    AE_SHUTTING_DOWN,  /* 503 shutting_down */
    AE_NOT_CONFIGURED, /* 503 agent_not_configured */
    AE_MOVED,          /* 409 session_moved: another node of the fleet runs it */
    AE_FENCED,         /* 503 node_fenced: this node could not renew its fleet lease */
    AE_BAD_GATEWAY,    /* 502 bad_gateway: the node a request was forwarded to failed */
};
enum MHD_Result api_error(struct request *rq, enum api_err e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* api_error with one more response header (405's Allow). */
enum MHD_Result api_error_header(struct request *rq, enum api_err e, const char *name,
                                 const char *value, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* As api_error, with extra's fields (reference stolen; may be NULL) beside "error". */
enum MHD_Result api_error_with(struct request *rq, enum api_err e, json_t *extra, const char *fmt,
                               ...) __attribute__((format(printf, 4, 5)));
/* Replies for -errno (with err_msg()) with the right api_err. */
enum MHD_Result api_errno(struct request *rq, int err);
/* The api_err for -errno, and the JSON code of an api_err (for errors that cannot be an
 * HTTP status any more, as in the middle of a stream). */
enum api_err api_err_of(int err);
const char *api_err_code(enum api_err e);
/* Sends j (reference stolen) with status. */
enum MHD_Result reply_json(struct request *rq, unsigned status, json_t *j);
/* As reply_json, with one more header (name NULL: none), as Location of a 201. */
enum MHD_Result reply_json_header(struct request *rq, unsigned status, json_t *j, const char *name,
                                  const char *value);
enum MHD_Result reply_response(struct request *rq, unsigned status, struct MHD_Response *r);
/* Content negotiation (RFC 9110 12.5.1): the q-value the request's Accept header gives to
 * the media type (the most specific range that matches decides; media types compared
 * case-insensitively; 1 without an Accept header, 0 when nothing matches). */
double accept_q(struct request *rq, const char *type);
/* Whether Accept names type itself (not through a wildcard), whatever its q-value. */
bool accept_lists(struct request *rq, const char *type);
/* The parsed JSON body, or NULL after replying 400 (bad JSON, not an object). An empty
 * body is an empty object. */
json_t *body_json(struct request *rq);

/* Field checking for request bodies: unknown fields and wrong types are 400s that name
 * the field. */
enum field_type { F_STRING, F_NUMBER, F_INT, F_BOOL, F_OBJECT, F_ARRAY };
struct field {
    const char *name;
    enum field_type type;
};
/* Returns true when every key of obj is a known field of the right type; else replies
 * 400 and returns false. */
bool check_fields(struct request *rq, json_t *obj, const struct field *fields, size_t n);
/* Seconds field into milliseconds, checked against (0, max_ms]; true when absent too. */
bool get_seconds(struct request *rq, json_t *obj, const char *name, uint64_t max_ms,
                 uint64_t *ret_ms);
bool get_count(struct request *rq, json_t *obj, const char *name, uint64_t max, uint64_t *ret);

/* ---- route handlers ---- */
enum MHD_Result h_session_create(struct request *rq);
enum MHD_Result h_session_list(struct request *rq);
enum MHD_Result h_session_get(struct request *rq);
enum MHD_Result h_session_delete(struct request *rq);
enum MHD_Result h_session_interrupt(struct request *rq);
enum MHD_Result h_session_restart(struct request *rq);
enum MHD_Result h_session_events(struct request *rq);
enum MHD_Result h_execute(struct request *rq);
enum MHD_Result h_oneshot(struct request *rq);
enum MHD_Result h_files_list(struct request *rq);
enum MHD_Result h_file_get(struct request *rq);
enum MHD_Result h_file_put(struct request *rq);
int h_file_put_chunk(struct request *rq, const char *data, size_t n);
bool h_file_put_admit(struct request *rq, uint64_t declared);
enum MHD_Result h_file_delete(struct request *rq);
/* conns.c: connections that have not authenticated are capped at max_unauth (0: no cap);
 * a new one past the cap closes the oldest of them. Pass conn_guard_notify with the guard
 * as MHD_OPTION_NOTIFY_CONNECTION. */
struct conn_guard;
struct conn_guard *conn_guard_new(size_t max_unauth);
/* NULL is a no-op; only after the daemon has stopped. */
void conn_guard_free(struct conn_guard *g);
void conn_guard_notify(void *cls, struct MHD_Connection *conn, void **ctx,
                       enum MHD_ConnectionNotificationCode toe);
/* conn sent a request with the right token: off the unauthenticated list for good, with
 * idle_timeout_s instead of the header timeout. */
void conn_guard_authenticated(struct conn_guard *g, struct MHD_Connection *conn,
                              unsigned idle_timeout_s);
/* Connections closed so far to make room. */
uint64_t conn_guard_evicted(struct conn_guard *g);

enum MHD_Result h_healthz(struct request *rq);
/* The web console (routes_ui.c): / and /ui redirect to /ui/, which serves its files. */
enum MHD_Result h_ui_root(struct request *rq);
enum MHD_Result h_ui_asset(struct request *rq);
/* Prints the console's login URL on stderr, once at start (docs/OPERATING.md). */
void ui_print_login(const struct server *srv);
enum MHD_Result h_metrics(struct request *rq);
enum MHD_Result h_agent_run(struct request *rq);
enum MHD_Result h_review_list(struct request *rq);
enum MHD_Result h_review_get(struct request *rq);
enum MHD_Result h_review_resolve(struct request *rq);
/* Frees what h_file_put_chunk left behind when the request ends early. */
void upload_abort(struct request *rq);

/* The client's socket, for noticing a hang-up (POLLRDHUP); -1 when unknown. */
int client_fd(struct request *rq);
/* Takes a reference on the {id} session, or replies 404/expired and returns NULL. */
struct session *acquire_session(struct request *rq);
/* ---- stored sessions (routes_persist.c) ---- */
/* Replies 404 for the {id} session that is not live (err from session_table_acquire),
 * saying whether it is stored and resumable. */
enum MHD_Result reply_not_live(struct request *rq, int err);

/* ---- the fleet (routes_fleet.c) ---- */
/* This node's name: --node, else the host name's first label, lower-cased. 0 or -EINVAL
 * with err_msg(); caller frees. */
int fleet_node_name(const char *given, char **ret);
/* Opens the fleet of srv (--fleet): leases in its store, renewed from now on. */
int fleet_open(struct server *srv);
/* For a session id not live here: takes it over when the shared store says it ran on a node
 * that is gone (its lease expired or was released by a shutdown), resuming it under the
 * same id; true when handled: *ret (a reference) set, or NULL after an error reply. false:
 * not a session of the fleet (the caller replies 404). */
bool fleet_takeover(struct request *rq, const char *id, struct session **ret);
/* Whether this node still holds s's lease; false with s put: after replying 503 (the node is
 * fenced), or without a reply when another node took it (s is dropped). */
bool fleet_check(struct request *rq, const char *id, struct session *s);
/* /healthz in a fleet: the node lease into j ("fleet"), and 503 with "status" and "reason"
 * when the node holds no valid lease or its last store request failed. */
void fleet_healthz(struct server *srv, json_t *j, unsigned *status);
/* Replies 503 node_fenced with why and a Retry-After. */
enum MHD_Result fleet_reply_fenced(struct request *rq, const char *why);
/* ---- forwarding (fleet_forward.c) ---- */
/* Called once a request is routed and authenticated, before its body: refuses everything but
 * health, metrics and the console's files while the node is fenced, and hands a request for a
 * session that another live node owns to that node (its body streamed there, the answer streamed
 * back). true when it took the request over (replied, or forwarding). */
bool fleet_route(struct request *rq);
/* From a handler, its JSON body read: forwards rq to the live node that owns its session (it
 * won a takeover this node lost); true after replying. */
bool fleet_forward_now(struct request *rq);
/* Frees what forwarding rq left (request_free). */
void fleet_forward_free(struct request *rq);
/* POST /v1/sessions/{id}/checkpoint */
enum MHD_Result h_session_checkpoint(struct request *rq);
/* With resume_from in *body: checks it and puts the stored session's options under the
 * body's own (*body replaced). False after replying 400/404. */
bool resume_options(struct request *rq, json_t **body);
/* A session's JSON description. */
json_t *session_info(const char *id, struct session *s);
/* Session options from a create (or one-shot) body, validated against the server's maxima;
 * false after replying 400. */
bool session_opts_from_json(struct request *rq, json_t *body, struct session_opts *o);
/* The NDJSON event for an execution event; caller decrefs. */
json_t *exec_event_json(const struct exec_event *ev);
/* True when the client asked for NDJSON events (Accept: application/x-ndjson). */
bool wants_ndjson(struct request *rq);
/* Interrupts the running one-shot executions (shutdown). */
void oneshots_interrupt(struct server *srv);
/* Kills the one-shot executions still running (shutdown, after the interrupt grace). */
void oneshots_kill(struct server *srv);

/* ---- a response body made by a worker thread as it goes (outstream.c) ---- */
struct out_stream {
    pthread_mutex_t lock;
    struct buf out; /* not sent yet */
    size_t sent;
    bool finished;
    bool ready;
    int notify[2]; /* a byte per append: wakes the reader */
    int cancel[2]; /* written when the client goes away: the worker's cancel fd is [0] */
    int client_fd;
    int keepalive_ms;
    void (*keepalive)(struct out_stream *os); /* appends something after keepalive_ms idle */
};
/* keepalive may be NULL (the reader then waits as long as the worker is quiet). 0, or
 * -errno with err_msg(). */
int out_stream_init(struct out_stream *os, int client_fd, int keepalive_ms,
                    void (*keepalive)(struct out_stream *os));
void out_stream_append(struct out_stream *os, const void *data, size_t n);
/* The worker is done: the reader ends the body once it has sent what is there. */
void out_stream_finish(struct out_stream *os);
/* A libmicrohttpd content reader's answer: bytes, the end, or an error when the client hung
 * up (the cancel pipe is written then). */
ssize_t out_stream_read(struct out_stream *os, char *out, size_t max);
void out_stream_cancel(struct out_stream *os);
/* The response is over (sent, or the client left): cancels a worker that is not done, so
 * that it does not go on unseen; whether it was done. */
bool out_stream_end(struct out_stream *os);
void out_stream_release(struct out_stream *os);
/* Takes one of the server's execution slots; false after replying 429. The slot is given
 * back as soon as the cell is over, before its last byte is sent, so a client that has read
 * its reply may run the next cell at once; the request owes its reply until completed. */
bool execution_slot_take(struct request *rq);
void execution_slot_give(struct request *rq);

/* ---- metrics (metrics.c) ---- */
struct metrics *metrics_new(void);
void metrics_free(struct metrics *m);
void metrics_execution(struct metrics *m, enum exec_status status, double seconds);
void metrics_session_created(struct metrics *m, double seconds);
void metrics_sandbox_failure(struct metrics *m);
void metrics_request(struct metrics *m, unsigned status);
/* Prometheus text exposition; caller frees. */
/* Gauges read at render time from the server's parts, not kept by struct metrics. */
struct metrics_gauges {
    size_t live_sessions, running_executions;
    size_t pool_ready;            /* sessions made ahead and waiting to be handed out */
    double template_ready_ms;     /* how long the running template took to start; 0: none */
    uint64_t connections_evicted; /* unauthenticated connections closed to make room */
};
char *metrics_render(struct metrics *m, const struct metrics_gauges *g);

/* ---- MCP over Streamable HTTP (routes_mcp.c) ---- */
struct mcp_http *mcp_http_new(struct server *srv);
/* Ends every MCP session (running calls are interrupted, open streams end) and waits for the
 * requests that still use one; call before the HTTP daemon stops. NULL is a no-op. */
void mcp_http_free(struct mcp_http *m);
enum MHD_Result h_mcp_post(struct request *rq);
enum MHD_Result h_mcp_get(struct request *rq);
enum MHD_Result h_mcp_delete(struct request *rq);

/* ---- auth (auth.c) ---- */
/* The server's token: cfg->token, RUNCELL_TOKEN, DATA/token, or a new one written to
 * DATA/token (0600); *ret_generated tells which. 0 or -errno with err_msg(). */
int token_load(const char *data_dir, const char *given, char **ret, bool *ret_generated);
/* Compares in time independent of where the strings differ. */
bool token_equal(const char *a, const char *b);

#endif
