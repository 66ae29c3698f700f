/* mcp.h - runcell as a Model Context Protocol server: the protocol (JSON-RPC 2.0, version
 * negotiation, the tools), independent of the transport that carries it.
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

/* Protocol versions, newest first; an unknown one is answered with the first. */
extern const char *const mcp_versions[];
bool mcp_version_supported(const char *version);

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
};

struct mcp_config {
    struct session_table *table;   /* borrowed; NULL = no sessions (tools answer with an error) */
    struct session_opts defaults;  /* of the sessions this server creates */
    uint64_t max_timeout_ms;       /* the longest timeout_s a call may ask for */
    uint64_t progress_interval_ms; /* heartbeat of notifications/progress (default 1000) */
    const char *server_version;
    /* Optional: a counter of executions running in the whole process and its maximum
     * (`runcell serve` shares its own, so that its limit and shutdown see MCP cells too). */
    atomic_size_t *executions;
    size_t max_executions;
    /* Optional: told of every finished execution (metrics). */
    void (*on_execution)(void *ctx, const struct exec_record *rec);
    void *ctx;
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
    MCP_IN_INVALID, /* unparsable or not JSON-RPC: an error response with id null is sent */
};

struct mcp_conn;

/* A connection of one client. cfg is borrowed and must outlive the connection. Caller frees
 * with mcp_conn_free. */
struct mcp_conn *mcp_conn_new(const struct mcp_config *cfg);
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

/* A JSON-RPC error response with id null, for a transport's own refusals (a bad header, a
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
