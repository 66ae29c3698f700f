/* http.h - the HTTP core every surface stands on: the server's state, requests, route tables
 * per surface, replies, the one error table, request-body checks and streamed responses. */
#ifndef RUNCELL_HTTP_H
#define RUNCELL_HTTP_H

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>

#include "http/serve.h"

struct metrics;
struct mcp_http;
struct e2b;
struct surface;

struct server {
    const struct server_config *cfg;
    struct sandbox_host host;
    struct session_table *table;
    struct session_pool *pool;
    struct store *store;
    struct meta_db *meta;
    struct persist_config persist;         /* store and meta, for the session table */
    unsigned char seal_key[SEAL_KEY_SIZE]; /* --secrets-key: persist.seal_key points here */
    char *node;                            /* this node's name (in ids, X-Runcell-Node) */
    struct fleet *fleet;                   /* leases in the shared store (--fleet), or NULL */
    int watchdog_fd;                       /* the fleet watchdog's pipe until the fleet takes it */
    struct metrics *metrics;
    struct mcp_http *mcp; /* MCP sessions of /mcp */
    struct e2b *e2b;      /* E2B's sandboxes (--e2b), or NULL */
    struct MHD_Daemon *mhd;
    struct conn_guard *conns;
    char *token;
    bool token_generated; /* made at this start (and printed): the login URL may show it */
    /* Requests that run an execution and whose response is not sent yet: a shutdown waits
     * for these too, or it would hang up on a reply its cell has made. */
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
    char method[16];               /* for the log */
    bool url_has_nul;              /* "%00" in the raw URL: the decoded URL was cut short */
    bool http10;                   /* an HTTP/1.0 request (no Host needed) */
    bool authenticated;            /* it carried the token */
    const struct surface *surface; /* whose route it is (NULL when no route matched) */
    char *params[2];               /* {id}, {path} as matched */
    struct buf body;               /* JSON request body, capped */
    struct upload *upload;         /* a route's streamed body (see on_free) */
    /* Set by a route that keeps something in rq (an upload's partial file): called when the
     * request ends, whether or not the route's handler ran. */
    void (*on_free)(struct request *rq);
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
    bool owes_reply;             /* counted in srv->replies_owed until completed */
    json_t *takeover;            /* this request resumed its session here: {resumed, lost, ...} */
    char *raw_uri;               /* as the client sent it, query included (for forwarding) */
    struct forward *forward;     /* the request goes to the node that owns its session */
    struct net_policy *net;      /* the network policy a create body asked for */
    struct net_secrets *secrets; /* ... and its secrets */
    char **packages;             /* ... and its packages */
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
    /* a Connect RPC (E2B's envd): errors in Connect's shape, {"code": "name", "message"} */
    ROUTE_CONNECT = 1 << 3,
};
/* Bits from 1 << 8 up are the surface's own (e2b.h's authentication kinds). */

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

/* How a surface's errors look on the wire: reply.c's one table maps each api_err onto each. */
enum err_shape {
    SHAPE_NATIVE, /* {"error": {"code": "not_found", "message"}} */
    SHAPE_E2B,    /* E2B's {"code": 404, "message"} (ROUTE_CONNECT routes: Connect's) */
    SHAPE_MCP,    /* a JSON-RPC error response with id null */
};

/* A protocol served on the listener: a table of routes, how their requests authenticate,
 * and the shape of their errors. Adding a protocol is adding one of these (server.c's
 * surfaces[]). */
struct surface {
    const char *name; /* "api", "e2b", "mcp", "ui", "core": for the log */
    const struct route *routes;
    size_t n_routes;
    enum err_shape shape;
    /* Authenticates a request for one of the routes (those without ROUTE_NO_AUTH); NULL:
     * the server's bearer token. False after replying. */
    bool (*authorize)(struct request *rq);
    /* Whether the server offers the surface at all (E2B's only with --e2b); NULL: always. */
    bool (*enabled)(const struct server *srv);
    /* A route for every request to a host the surface serves (E2B's PORT-ID.DOMAIN preview
     * hosts), whatever its method and path, or NULL; may set rq->params. NULL: none. */
    const struct route *(*host_route)(struct request *rq, const char *host);
    /* Optional, for a fleet (fleet_forward.c): the id of a session of this surface that lives
     * on the node its id names and never moves (nothing of it is stored: an E2B sandbox, an
     * MCP session), where the request names it; NULL for a request of no such session. Sets
     * *ret_before_auth when only that node can check the request's credentials (they are the
     * session's own), so the request goes there before authorize. */
    const char *(*pinned_id)(struct request *rq, bool *ret_before_auth);
};

/* The route for method on url among srv's surfaces (server.c), its {id} and {path} in params
 * (caller frees), its surface in *ret_surface; or NULL, and allow lists the methods the path
 * takes (empty for a path no route has). */
const struct route *route_match(const struct server *srv, const char *url, const char *method,
                                char *params[2], const struct surface **ret_surface,
                                struct buf *allow);

/* ---- replies (reply.c): every error goes through api_error, and reply.c's one table maps
 * each internal error onto the shape of the request's surface (enum err_shape): an HTTP
 * status and a code for each. ---- */
enum api_err {
    AE_BAD_REQUEST,    /* 400 bad_request */
    AE_BAD_PATH,       /* 400 bad_path */
    AE_UNAUTHORIZED,   /* 401 unauthorized */
    AE_NOT_FOUND,      /* 404 not_found */
    AE_EXPIRED,        /* 404 expired */
    AE_METHOD,         /* 405 method_not_allowed */
    AE_BUSY,           /* 409 busy */
    AE_EXISTS,         /* 409 exists */
    AE_TOO_LARGE,      /* 413 too_large */
    AE_NO_SPACE,       /* 413 too_large (E2B: 507) */
    AE_LIMIT,          /* 429 limit_exceeded */
    AE_INTERNAL,       /* 500 internal */
    AE_UNIMPLEMENTED,  /* 501 not_implemented */
    AE_NOT_RUNNING,    /* 404 not_found (E2B: 502, its "sandbox not running") */
    AE_SANDBOX,        /* 503 sandbox_error */
    AE_SHUTTING_DOWN,  /* 503 shutting_down */
    AE_NOT_CONFIGURED, /* 503 agent_not_configured */
    AE_MOVED,          /* 409 session_moved: another node of the fleet runs it */
    AE_DEADLINE,       /* 504 timeout: a deadline the client set passed */
    AE_CANCELLED,      /* 499 cancelled: the client or an interrupt stopped it */
    AE_FENCED,         /* 503 node_fenced: this node could not renew its fleet lease */
    AE_BAD_GATEWAY,    /* 502 bad_gateway: the node a request was forwarded to failed */
    AE_N_ERRORS,
};
/* The status and codes of e: for the native shape, E2B's, Connect's (its name and the HTTP
 * status of a unary reply) and JSON-RPC's. */
struct api_err_info {
    unsigned status;     /* native, and MCP's HTTP status */
    const char *code;    /* native */
    unsigned e2b_status; /* E2B's REST routes */
    const char *connect; /* Connect's code */
    unsigned connect_status;
    int jsonrpc;
};
const struct api_err_info *api_err_info(enum api_err e);
/* The HTTP status rq's surface answers e with. */
unsigned api_err_status(const struct request *rq, enum api_err e);
enum MHD_Result api_error(struct request *rq, enum api_err e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* api_error with one more response header (405's Allow). */
enum MHD_Result api_error_header(struct request *rq, enum api_err e, const char *name,
                                 const char *value, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* As api_error, with extra's fields (reference stolen; may be NULL) beside "error". */
enum MHD_Result api_error_with(struct request *rq, enum api_err e, json_t *extra, const char *fmt,
                               ...) __attribute__((format(printf, 4, 5)));
/* Whether rq is a Connect streaming call (a ROUTE_CONNECT route, Content-Type
 * application/connect+...): its errors are a 200 whose body is the end-of-stream message. */
bool connect_streaming(struct request *rq);
/* That reply: 200, one envelope flagged end-of-stream (0x02) holding
 * {"error": {"code": code, "message": msg}} (msg n bytes of UTF-8). */
enum MHD_Result reply_connect_end_error(struct request *rq, const char *code, const char *msg,
                                        size_t n);
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
enum MHD_Result h_metrics(struct request *rq);
/* The client's socket, for noticing a hang-up (POLLRDHUP); -1 when unknown. */
int client_fd(struct request *rq);

/* ---- streamed responses (stream.c): one reader over pluggable sources ---- */

/* A source of a streamed response's bytes. The reader calls clear, then pull; when pull gave
 * nothing, it waits for wait_fd to be readable (sending keepalive's bytes every keepalive_ms
 * of quiet) or for the client to hang up (left). free comes once, when the response is over
 * (left too, first, when it ended before the source was over). */
struct http_source_ops {
    /* Appends what is ready to out: 1 when that was the last of it, else 0. */
    int (*pull)(void *src, struct buf *out);
    int (*wait_fd)(void *src);
    void (*clear)(void *src);                      /* may be NULL */
    void (*keepalive)(void *src, struct buf *out); /* may be NULL */
    void (*left)(void *src);                       /* may be NULL */
    void (*free)(void *src);
};
/* Replies to rq with status and the source's bytes as they come (src owned by the response
 * from now: ops->free frees it, also when this fails). keepalive_ms 0: none. */
enum MHD_Result http_stream(struct request *rq, unsigned status, const char *content_type,
                            const struct http_source_ops *ops, void *src, int keepalive_ms);
/* The same with the response's headers given whole ("Name: value" each, NULL-terminated; none
 * added), for a reply that passes another server's on (fleet_forward.c, proxy.c). */
enum MHD_Result http_stream_headers(struct request *rq, unsigned status, char *const *headers,
                                    const struct http_source_ops *ops, void *src, int keepalive_ms);

/* ---- an upstream's answer head (uphead.c), for proxy.c and a fleet's forwarder ---- */

#define UP_HEAD_MAX    (64u << 10) /* bytes of all of an answer's heads, 1xx ones included */
#define UP_HEADERS_MAX 100         /* header lines passed on; more are dropped */
struct up_head {
    long status;  /* of the last head; 502 for a status line without a number 100-999 */
    char **lines; /* "Name: value" each, NULL-terminated (http_stream_headers') */
    size_t n, bytes;
    bool done;                       /* the final (not 1xx) head has ended */
    const char *const *also_dropped; /* names never passed on beside the hop-by-hop ones */
};
enum up_head_result { UP_HEAD_MORE, UP_HEAD_DONE, UP_HEAD_TOO_LARGE };
/* also_dropped: a NULL-terminated list of header names the caller makes itself, or NULL. */
void up_head_init(struct up_head *h, const char *const *also_dropped);
/* One line of the head as curl gives it (the status line, a header line, or the blank line
 * that ends a head). A malformed line, one with a CR or NUL inside, a hop-by-hop one and
 * those past UP_HEADERS_MAX are dropped. UP_HEAD_TOO_LARGE: past UP_HEAD_MAX, stop. */
enum up_head_result up_head_line(struct up_head *h, const char *data, size_t len);
void up_head_release(struct up_head *h);
/* Whether a header (its name, n bytes) is hop-by-hop or framing (Connection, Keep-Alive,
 * Proxy-Connection, Transfer-Encoding, TE, Trailer, Upgrade, Content-Length): never passed on
 * by a server in front (RFC 9110 7.6.1). */
bool http_hop_header(const char *name, size_t n);

/* ---- forwarding a request (proxy.c) ---- */
/* Forwards rq (method, raw URI, headers less the hop-by-hop ones, its whole body) over fd, a
 * connection to an HTTP server (owned now), as a request to 127.0.0.1:port with rq's Host,
 * and replies with the server's answer as it comes. 0 once it has replied; -errno with
 * err_msg() when it has not (the server did not answer, a WebSocket upgrade: -ENOTSUP), for
 * the caller's error in its surface's shape. */
int http_proxy(struct request *rq, int fd, uint16_t port);

/* How a surface writes an execution's events (exec_item) on the wire: NDJSON lines, E2B's
 * messages, Connect envelopes. ctx is the encoder's state for one response. */
struct exec_encoder {
    const char *content_type;
    /* The stream's first bytes, before any event (may be NULL). */
    void (*begin)(void *ctx, struct execution *x, struct buf *out);
    /* The wire form of one event (EV_DONE last), appended to out; may append nothing. */
    void (*event)(void *ctx, struct execution *x, const struct exec_item *it, struct buf *out);
    /* What a quiet stream sends (may be NULL). */
    void (*keepalive)(void *ctx, struct buf *out);
    void (*free)(void *ctx); /* may be NULL */
};
struct exec_stream_opts {
    /* The client leaving before the end stops the execution (execution_cancel): the
     * surface's default, or what the request asked (docs/API.md, on_disconnect). */
    bool interrupt_on_leave;
    int keepalive_ms;
    /* A reference on session, dropped when the response is over (table NULL: none). */
    struct session_table *table;
    struct session *session;
};
/* Replies with x's events after seq `after`, following x to its end, as enc writes them. x's
 * reference, enc_ctx and o's session reference are the response's from now (also when this
 * fails). */
enum MHD_Result http_stream_execution(struct request *rq, struct execution *x, uint64_t after,
                                      const struct exec_encoder *enc, void *enc_ctx,
                                      const struct exec_stream_opts *o);

/* A queue of bytes a worker thread appends to, for http_stream (out_stream_pull is its
 * pull, notify[0] its wait_fd, out_stream_clear its clear); the worker watches cancel[0],
 * written by out_stream_cancel when the client goes. */
struct out_stream {
    pthread_mutex_t lock;
    struct buf out; /* not pulled yet */
    bool finished;
    bool ready;
    int notify[2]; /* a byte per append: wakes the reader */
    int cancel[2];
};
/* 0, or -errno with err_msg(). */
int out_stream_init(struct out_stream *os);
void out_stream_append(struct out_stream *os, const void *data, size_t n);
/* The worker is done: the reader ends the body once it has sent what is there. */
void out_stream_finish(struct out_stream *os);
int out_stream_pull(struct out_stream *os, struct buf *out);
void out_stream_clear(struct out_stream *os);
void out_stream_cancel(struct out_stream *os);
void out_stream_release(struct out_stream *os);

/* The request owes its client a reply that a shutdown must wait for (an execution's): counted
 * in srv->replies_owed until the request completes. */
void request_owes_reply(struct request *rq);

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
    size_t live_sessions, running_executions, queued_executions;
    size_t pool_ready;            /* sessions made ahead and waiting to be handed out */
    double template_ready_ms;     /* how long the running template took to start; 0: none */
    uint64_t connections_evicted; /* unauthenticated connections closed to make room */
};
char *metrics_render(struct metrics *m, const struct metrics_gauges *g);

/* ---- auth (auth.c) ---- */
/* The server's token: cfg->token, RUNCELL_TOKEN, DATA/token, or a new one written to
 * DATA/token (0600); *ret_generated tells which. 0 or -errno with err_msg(). */
int token_load(const char *data_dir, const char *given, char **ret, bool *ret_generated);
/* Compares in time independent of where the strings differ. */
bool token_equal(const char *a, const char *b);

#endif
