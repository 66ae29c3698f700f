/* mcp.h - runcell as a Model Context Protocol server: the protocol (JSON-RPC 2.0, version
 * negotiation, the tools), independent of the transport that carries it.
 *
 * Two eras share every endpoint. A client of revision 2025-11-25 or older (the legacy era)
 * opens with initialize, and the connection (stdio) or its Mcp-Session-Id (HTTP) keeps the
 * version it negotiated. A client of revision 2026-07-28 (the modern era) sends no initialize:
 * each request names its version and capabilities in params._meta and is served on its own,
 * whatever came before on the connection.
 *
 * A transport (stdio in `runcell mcp`, Streamable HTTP at /mcp in `runcell serve`) keeps one
 * mcp_conn per client and feeds it each message it receives; everything the server says
 * about that message (the response, progress notifications) comes back through the sink
 * given with it. Tool calls run on threads of their own, so a transport that handed a call
 * over is free to read the next message at once (a ping, or a notifications/cancelled that
 * interrupts the running cell).
 *
 * Tools run code in sessions of a session table (session.h) that the transport owns: the
 * mcp process's own table for stdio, the server's for HTTP. A connection creates one
 * default session on first use, so a client that never names a session keeps its state
 * between calls; the sessions a connection created are closed with it.
 *
 * Thread safety: every mcp_conn_* function may be called from any thread, concurrently. */
#ifndef RUNCELL_MCP_H
#define RUNCELL_MCP_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "session/session.h"

/* The largest message (one stdio line, one HTTP body) accepted; a larger one is refused with
 * a JSON-RPC error and never parsed. */
#define MCP_MAX_MESSAGE (32u << 20)
/* Tool calls running at once on one connection. */
#define MCP_MAX_CALLS 16
/* The largest file read_file returns and write_file writes. */
#define MCP_MAX_FILE (10u << 20)
/* Output kept per stream of one execution (head and tail): what a model can read. */
#define MCP_DEFAULT_OUTPUT_CAP (64u << 10)
/* Cells a session made over MCP can undo (the undo tool), unless create_session asks for
 * another depth: each level is a copy-on-write copy of the Python interpreter (its memory
 * costs what the cells after it change; docs/PERFORMANCE.md). */
#define MCP_DEFAULT_HISTORY 3
/* A cell still running this long after its call is answered with a run_id to wait on
 * (wait_for_cell), below the 60 s request timeout most MCP clients keep by default. */
#define MCP_REPLY_DEADLINE_MS 45000

/* Protocol versions an initialize may choose (the legacy era), newest first; initialize with
 * any other is answered with the first. */
extern const char *const mcp_versions[];
/* Protocol versions of the modern era (per-request _meta, no initialize), newest first. */
extern const char *const mcp_modern_versions[];
/* Whether this server speaks version, of either era. */
bool mcp_version_supported(const char *version);
/* Whether version is one of mcp_modern_versions. */
bool mcp_version_modern(const char *version);

/* JSON-RPC and MCP error codes. */
enum {
    MCP_PARSE_ERROR = -32700,
    MCP_INVALID_REQUEST = -32600,
    MCP_METHOD_NOT_FOUND = -32601,
    MCP_INVALID_PARAMS = -32602,
    MCP_INTERNAL_ERROR = -32603,
    MCP_SERVER_BUSY = -32000, /* too many calls in flight on the connection */
    /* The session ended while the request ran (the TypeScript SDK's ConnectionClosed). */
    MCP_SESSION_ENDED = -32000,
    /* Defined by revision 2026-07-28. */
    MCP_HEADER_MISMATCH = -32020,     /* HTTP headers missing or not matching the body */
    MCP_MISSING_CAPABILITY = -32021,  /* the request needs a capability the client lacks */
    MCP_UNSUPPORTED_VERSION = -32022, /* data: {supported, requested} */
};

struct mcp_exec_ops;

struct mcp_config {
    struct session_table *table; /* borrowed; NULL = no sessions (tools answer with an error) */
    /* How cells run (mcp-int.h); NULL: the session layer's durable executions. */
    const struct mcp_exec_ops *exec;
    struct session_opts defaults;  /* of the sessions this server creates */
    uint64_t max_timeout_ms;       /* the longest timeout_s a call may ask for */
    uint64_t progress_interval_ms; /* heartbeat of notifications/progress (default 1000) */
    /* Calls that cannot become a task (the client did not declare the tasks extension) are
     * answered after this long with a run_id for wait_for_cell, the cell going on; 0: they
     * wait for the cell however long it runs. */
    uint64_t reply_deadline_ms;
    const char *server_version;
};

/* Where the messages about one input go. send() gets each outgoing message as one line of
 * JSON without the newline (response: true for the response or batch of responses, false
 * for a notification), from any thread, never concurrently for one input; close() comes
 * exactly once, after the last send for that input (a cancelled request closes without a
 * response). The sink's ctx must stay valid until close(). */
struct mcp_sink {
    void (*send)(void *ctx, const char *msg, size_t len, bool response);
    void (*close)(void *ctx);
    void *ctx;
};

/* What an input turned out to be. */
enum mcp_input {
    MCP_IN_NONE,    /* notifications or responses only: nothing will be sent back */
    MCP_IN_REQUEST, /* one or more requests: a response (or batch) will be sent */
    MCP_IN_INVALID, /* unparsable or not JSON-RPC: an error response without id is sent */
    /* A modern-era request refused before it was served (a version this server lacks, _meta
     * without its required fields): its error response is sent; HTTP says 400. */
    MCP_IN_REFUSED,
    /* A modern-era request for a method this server lacks: -32601 is sent; HTTP says 404. */
    MCP_IN_NO_METHOD,
};

struct mcp_conn;

/* A connection of one client. cfg is borrowed and must outlive the connection. Caller frees
 * with mcp_conn_free. */
struct mcp_conn *mcp_conn_new(const struct mcp_config *cfg);
/* A connection that serves the modern-era requests of many clients at once (Streamable HTTP
 * of revision 2026-07-28, where nothing ties one request to another): it refuses initialize
 * and the legacy era, records no session as its own, and, since request ids of different
 * clients may be alike, cancels a call only through mcp_conn_cancel_sink, never by a
 * notifications/cancelled. */
struct mcp_conn *mcp_conn_new_shared(const struct mcp_config *cfg);
/* Handles one message (or a batch, in protocol 2025-03-26). Replies go to sink; quick
 * requests are answered before this returns, tool calls later from their own thread. A
 * transport that did not keep a message larger than MCP_MAX_MESSAGE passes data NULL and
 * its length, and the client is told. */
enum mcp_input mcp_conn_handle(struct mcp_conn *c, const char *data, size_t len,
                               const struct mcp_sink *sink);
/* The negotiated protocol version, or NULL before a successful initialize. The string is
 * static. */
const char *mcp_conn_version(struct mcp_conn *c);
/* Whether tool calls are running. */
bool mcp_conn_busy(struct mcp_conn *c);
/* When (now_ms) the last tool call ended, or the connection was made. */
uint64_t mcp_conn_last_active_ms(struct mcp_conn *c);
/* Interrupts every running tool call; their responses are not sent. */
void mcp_conn_cancel_all(struct mcp_conn *c);
/* Interrupts the tool calls whose replies go to the sink with this ctx (its client hung up:
 * on Streamable HTTP of revision 2026-07-28 that is how a request is cancelled); their
 * responses are not sent. A call already handed over to a task (tasks/get) is not one of
 * them: the task goes on. */
void mcp_conn_cancel_sink(struct mcp_conn *c, void *sink_ctx);
/* The client's session ended under its calls (DELETE, a shutdown): interrupts every running
 * tool call, and each answers its request with an MCP_SESSION_ENDED error saying why
 * (reason, copied), so that no client waits for its own timeout. Calls started later are
 * refused. */
void mcp_conn_end(struct mcp_conn *c, const char *reason);
/* Waits up to timeout_ms for the running calls to finish; true when none runs. */
bool mcp_conn_wait_idle(struct mcp_conn *c, int timeout_ms);
/* Cancels what runs, waits for it, closes the sessions the connection created, frees it;
 * NULL is a no-op. */
void mcp_conn_free(struct mcp_conn *c);

/* A JSON-RPC error response without id, for a transport's own refusals (a bad header, a
 * missing session): one line of JSON, the message repaired to UTF-8. Caller frees. */
char *mcp_error_json(int code, const char *message);

/* ---- the Streamable HTTP transport (http.c), a surface of `runcell serve` ---- */
struct server;
struct mcp_http;
/* /mcp's routes, for the server's table of surfaces. */
extern const struct surface mcp_surface;
/* The MCP sessions of srv's /mcp. */
struct mcp_http *mcp_http_new(struct server *srv);
/* Ends every MCP session (running calls are interrupted, open streams end) and waits for the
 * requests that still use one; call before the HTTP daemon stops. NULL is a no-op. */
void mcp_http_free(struct mcp_http *m);

/* ---- Streamable HTTP: which era a POST belongs to (http.c) ---- */

/* The MCP headers of one POST, NULL when absent. */
struct mcp_http_headers {
    const char *protocol_version; /* MCP-Protocol-Version */
    const char *method;           /* Mcp-Method */
    const char *name;             /* Mcp-Name */
};

enum mcp_http_era {
    MCP_HTTP_LEGACY, /* served by the client's MCP session (or starts one with initialize) */
    MCP_HTTP_MODERN, /* served statelessly (mcp_conn_new_shared) */
    MCP_HTTP_REJECT, /* answer *ret_status with the JSON-RPC error *ret_body */
};

/* Decides the era of a POST from its headers and body, checking what revision 2026-07-28 asks
 * of a modern one: MCP-Protocol-Version equal to the body's _meta version, Mcp-Method equal to
 * the method, Mcp-Name equal to params.name (tools/call), params.uri (resources/read) or
 * params.taskId (tasks/get, tasks/update, tasks/cancel), base64-sentinel values decoded, no
 * control characters; a header version this server lacks gets -32022. MCP_HTTP_REJECT comes
 * with *ret_status (400) and *ret_body, one line of JSON the caller frees. */
enum mcp_http_era mcp_http_classify(const struct mcp_http_headers *h, const char *body, size_t len,
                                    unsigned *ret_status, char **ret_body);
/* The HTTP status of an answered input on the modern era: 202 for MCP_IN_NONE, 400 for
 * MCP_IN_INVALID and MCP_IN_REFUSED, 404 for MCP_IN_NO_METHOD, else 200. */
unsigned mcp_http_status(enum mcp_input in);

/* ---- the parser, exposed for unit tests and fuzzing ---- */

enum mcp_msg_kind { MCP_MSG_REQUEST, MCP_MSG_NOTIFICATION, MCP_MSG_RESPONSE };

/* One JSON-RPC message, checked. Pointers borrow from root, which the caller owns. */
struct mcp_msg {
    enum mcp_msg_kind kind;
    json_t *id;         /* requests and responses: a string or an integer */
    const char *method; /* requests and notifications */
    json_t *params;     /* an object, or NULL when absent */
};

/* Checks that v is a JSON-RPC 2.0 message as MCP uses them. Returns 0, or an error code
 * (MCP_INVALID_REQUEST, MCP_INVALID_PARAMS) with *ret_err a sentence naming the problem
 * (caller frees) and m->id set when the request's id could be read. */
int mcp_msg_check(json_t *v, struct mcp_msg *m, char **ret_err);
/* Checks the arguments of a tools/call against the tool's schema. Returns 0, or
 * MCP_INVALID_PARAMS with *ret_err naming the tool or argument at fault (caller frees). */
int mcp_tool_check_args(const char *tool, json_t *args, char **ret_err);

#endif
