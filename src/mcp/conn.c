/* conn.c - one MCP client connection: the lifecycle (initialize, version negotiation), the
 * method table, batches, cancellation. */
#include "mcp/mcp-int.h"

#include <errno.h>
#include <string.h>
#include <time.h>

static const struct version versions[] = {
    {"2025-11-25", VF_ANNOTATIONS | VF_PROGRESS_MESSAGE | VF_STRUCTURED | VF_TITLES |
                       VF_ARGS_AS_RESULTS | VF_DESCRIPTION},
    {"2025-06-18", VF_ANNOTATIONS | VF_PROGRESS_MESSAGE | VF_STRUCTURED | VF_TITLES},
    {"2025-03-26", VF_ANNOTATIONS | VF_PROGRESS_MESSAGE | VF_BATCH},
    {"2024-11-05", 0},
};

const char *const mcp_versions[] = {"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05", NULL};

static const char instructions[] =
    "runcell runs code in a locked-down Linux sandbox that keeps its state between calls. "
    "Call run_code with Python (numpy, pandas and matplotlib are installed) or bash: variables, "
    "imports and files in /workspace persist from one call to the next in the same session. "
    "Without session_id every call goes to this client's default session; create_session gives "
    "a separate one. The value of a cell's last expression is returned, and matplotlib figures "
    "come back as PNG images. When the code fails, the result has isError set and the "
    "traceback: fix the code and run it again. The sandbox has no network access.";

static const struct version *find_version(const char *name)
{
    for (size_t i = 0; name && i < ARRAY_SIZE(versions); i++)
        if (!strcmp(versions[i].name, name))
            return &versions[i];
    return NULL;
}

bool mcp_version_supported(const char *version)
{
    return find_version(version) != NULL;
}

struct mcp_conn *mcp_conn_new(const struct mcp_config *cfg)
{
    struct mcp_conn *c = xcalloc(1, sizeof(*c));
    c->cfg = cfg;
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->default_lock, NULL);
    pthread_cond_init(&c->idle, NULL);
    c->owned = xcalloc(1, sizeof(char *));
    c->last_active_ms = now_ms();
    return c;
}

const char *mcp_conn_version(struct mcp_conn *c)
{
    pthread_mutex_lock(&c->lock);
    const char *v = c->version ? c->version->name : NULL;
    pthread_mutex_unlock(&c->lock);
    return v;
}

static unsigned conn_features(struct mcp_conn *c)
{
    pthread_mutex_lock(&c->lock);
    unsigned f = c->version ? c->version->features : 0;
    pthread_mutex_unlock(&c->lock);
    return f;
}

bool mcp_conn_busy(struct mcp_conn *c)
{
    pthread_mutex_lock(&c->lock);
    bool busy = c->n_calls > 0;
    pthread_mutex_unlock(&c->lock);
    return busy;
}

uint64_t mcp_conn_last_active_ms(struct mcp_conn *c)
{
    pthread_mutex_lock(&c->lock);
    uint64_t t = c->last_active_ms;
    pthread_mutex_unlock(&c->lock);
    return t;
}

bool mcp_conn_wait_idle(struct mcp_conn *c, int timeout_ms)
{
    struct timespec ts;
    realtime_after_ms(&ts, (uint64_t)timeout_ms);
    pthread_mutex_lock(&c->lock);
    while (c->n_calls && pthread_cond_timedwait(&c->idle, &c->lock, &ts) == 0)
        ;
    bool idle = c->n_calls == 0;
    pthread_mutex_unlock(&c->lock);
    return idle;
}

void mcp_conn_free(struct mcp_conn *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    c->closing = true;
    pthread_mutex_unlock(&c->lock);
    mcp_conn_cancel_all(c);
    pthread_mutex_lock(&c->lock);
    while (c->n_calls)
        pthread_cond_wait(&c->idle, &c->lock);
    pthread_mutex_unlock(&c->lock);
    for (char **id = c->owned; c->cfg->table && *id; id++)
        session_table_remove(c->cfg->table, *id);
    strv_free(c->owned);
    free(c->end_reason);
    free(c->default_id);
    free(c->default_known);
    pthread_cond_destroy(&c->idle);
    pthread_mutex_destroy(&c->default_lock);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* ---- methods ---- */

static void m_initialize(struct mcp_conn *c, const struct mcp_msg *m, struct reply *r)
{
    const char *asked = json_string_value(json_object_get(m->params, "protocolVersion"));
    if (!asked) {
        reply_respond(r, rpc_error(m->id, MCP_INVALID_PARAMS,
                                   "initialize: params.protocolVersion must be a string, e.g. "
                                   "\"2025-11-25\""));
        return;
    }
    const struct version *v = find_version(asked);
    if (!v)
        v = &versions[0]; /* the client decides whether it can speak ours */
    pthread_mutex_lock(&c->lock);
    const struct version *had = c->version;
    if (!had)
        c->version = v;
    pthread_mutex_unlock(&c->lock);
    if (had) {
        _cleanup_free_ char *msg = xasprintf("initialize: this connection is already "
                                             "initialized (protocol %s); open a new one to "
                                             "start over",
                                             had->name);
        reply_respond(r, rpc_error(m->id, MCP_INVALID_REQUEST, msg));
        return;
    }
    json_t *info = json_pack("{s:s,s:s}", "name", "runcell", "version",
                             c->cfg->server_version ? c->cfg->server_version : "0");
    if (v->features & VF_TITLES)
        json_object_set_new(info, "title", json_string("runcell code interpreter"));
    if (v->features & VF_DESCRIPTION)
        json_object_set_new(info, "description",
                            json_string("A sandboxed, stateful Python and bash interpreter"));
    const char *client =
        json_string_value(json_object_get(json_object_get(m->params, "clientInfo"), "name"));
    log_info("msg=\"mcp client initialized\" client=%s protocol=%s asked=%s",
             log_quote(client ? client : "?"), v->name, log_quote(asked));
    reply_respond(r,
                  rpc_result(m->id, json_pack("{s:s,s:{s:{s:b}},s:o,s:s}", "protocolVersion",
                                              v->name, "capabilities", "tools", "listChanged", 0,
                                              "serverInfo", info, "instructions", instructions)));
}

static void m_ping(struct mcp_conn *c, const struct mcp_msg *m, struct reply *r)
{
    (void)c;
    reply_respond(r, rpc_result(m->id, json_object()));
}

static void m_tools_list(struct mcp_conn *c, const struct mcp_msg *m, struct reply *r)
{
    json_t *cursor = json_object_get(m->params, "cursor");
    if (cursor && !json_is_null(cursor)) {
        /* Every tool fits in the first page, so no cursor was ever handed out. */
        reply_respond(r, rpc_error(m->id, MCP_INVALID_PARAMS,
                                   "tools/list: unknown cursor; the list has one page, ask "
                                   "without a cursor"));
        return;
    }
    reply_respond(r, rpc_result(m->id, tools_list_json(conn_features(c))));
}

static json_t *progress_token(json_t *params)
{
    json_t *t = json_object_get(json_object_get(params, "_meta"), "progressToken");
    return json_is_string(t) || json_is_integer(t) ? t : NULL;
}

static void m_tools_call(struct mcp_conn *c, const struct mcp_msg *m, struct reply *r)
{
    const char *name = json_string_value(json_object_get(m->params, "name"));
    json_t *args = json_object_get(m->params, "arguments");
    if (!name) {
        reply_respond(r, rpc_error(m->id, MCP_INVALID_PARAMS,
                                   "tools/call: params.name must be a string: the tool to call"));
        return;
    }
    const struct tool *t = tool_find(name);
    if (!t) {
        _cleanup_free_ char *msg =
            xasprintf("tools/call: unknown tool '%s'; the tools are: %s", name, tool_names());
        reply_respond(r, rpc_error(m->id, MCP_INVALID_PARAMS, msg));
        return;
    }
    if (args && json_is_null(args))
        args = NULL;
    if (args && !json_is_object(args)) {
        reply_respond(r, rpc_error(m->id, MCP_INVALID_PARAMS,
                                   "tools/call: params.arguments must be an object"));
        return;
    }
    _cleanup_free_ char *err = NULL;
    json_t *empty = json_object();
    if (mcp_tool_check_args(name, args ? args : empty, &err)) {
        json_decref(empty);
        /* Since 2025-11-25 a model sees bad arguments as a tool error and can correct them;
         * before, they were protocol errors. */
        if (conn_features(c) & VF_ARGS_AS_RESULTS)
            reply_respond(r, rpc_result(m->id, tool_error("%s", err)));
        else
            reply_respond(r, rpc_error(m->id, MCP_INVALID_PARAMS, err));
        return;
    }
    if (!c->cfg->table) {
        json_decref(empty);
        reply_respond(r, rpc_result(m->id, tool_error("%s: this server has no sandbox to run "
                                                      "sessions in",
                                                      name)));
        return;
    }
    int e = call_start(c, t, m->id, args ? args : empty, progress_token(m->params), r);
    json_decref(empty);
    if (e == -EAGAIN)
        reply_respond(r, rpc_error(m->id, MCP_SERVER_BUSY, err_msg()));
    else if (e < 0)
        reply_respond(r, rpc_error(m->id, MCP_INTERNAL_ERROR, err_msg()));
}

static void m_initialized(struct mcp_conn *c, const struct mcp_msg *m, struct reply *r)
{
    (void)c, (void)m, (void)r;
}

static void m_cancelled(struct mcp_conn *c, const struct mcp_msg *m, struct reply *r)
{
    json_t *id = json_object_get(m->params, "requestId");
    const char *reason = json_string_value(json_object_get(m->params, "reason"));
    (void)r;
    if (!id)
        return;
    bool found = call_cancel(c, id);
    char *text = json_dumps(id, JSON_ENCODE_ANY | JSON_COMPACT);
    log_info("msg=\"mcp request cancelled\" id=%s found=%d reason=%s", text ? text : "?", found,
             log_quote(reason ? reason : ""));
    free(text);
}

static const struct method {
    const char *name;
    bool notification;
    bool before_init; /* allowed before initialize */
    void (*fn)(struct mcp_conn *c, const struct mcp_msg *m, struct reply *r);
} methods[] = {
    {"initialize", false, true, m_initialize},
    {"ping", false, true, m_ping},
    {"tools/list", false, false, m_tools_list},
    {"tools/call", false, false, m_tools_call},
    {"notifications/initialized", true, true, m_initialized},
    {"notifications/cancelled", true, true, m_cancelled},
};

static const char *request_names(void)
{
    return "initialize, ping, tools/list, tools/call";
}

static void dispatch_request(struct mcp_conn *c, const struct mcp_msg *m, struct reply *r,
                             bool in_batch)
{
    const struct method *fn = NULL;
    for (size_t i = 0; i < ARRAY_SIZE(methods) && !fn; i++)
        if (!methods[i].notification && !strcmp(methods[i].name, m->method))
            fn = &methods[i];
    if (!fn) {
        _cleanup_free_ char *msg =
            xasprintf("unknown method '%s'; this server answers %s", m->method, request_names());
        reply_respond(r, rpc_error(m->id, MCP_METHOD_NOT_FOUND, msg));
        return;
    }
    if (in_batch && !strcmp(m->method, "initialize")) {
        reply_respond(
            r, rpc_error(m->id, MCP_INVALID_REQUEST, "initialize must not be part of a batch"));
        return;
    }
    if (!fn->before_init && !mcp_conn_version(c)) {
        _cleanup_free_ char *msg = xasprintf("%s before initialize: the first request must be "
                                             "initialize",
                                             m->method);
        reply_respond(r, rpc_error(m->id, MCP_INVALID_REQUEST, msg));
        return;
    }
    fn->fn(c, m, r);
}

static void dispatch_notification(struct mcp_conn *c, const struct mcp_msg *m, struct reply *r)
{
    for (size_t i = 0; i < ARRAY_SIZE(methods); i++) {
        if (methods[i].notification && !strcmp(methods[i].name, m->method)) {
            methods[i].fn(c, m, r);
            return;
        }
    }
    log_debug("msg=\"mcp notification ignored\" method=%s", log_quote(m->method));
}

/* Handles one message object: MCP_IN_REQUEST when a response was (or will be) sent for
 * it, MCP_IN_INVALID when it was answered with an error of id null. */
static enum mcp_input handle_one(struct mcp_conn *c, json_t *v, struct reply *r, bool in_batch)
{
    struct mcp_msg m;
    _cleanup_free_ char *err = NULL;
    int code = mcp_msg_check(v, &m, &err);
    if (code && m.kind == MCP_MSG_NOTIFICATION) {
        log_info("msg=\"mcp notification dropped\" error=%s", log_quote(err));
        return MCP_IN_NONE; /* notifications are never answered, not even with an error */
    }
    if (code) {
        json_t *id = m.kind == MCP_MSG_REQUEST ? m.id : NULL;
        reply_respond(r, rpc_error(id, code, err));
        return id ? MCP_IN_REQUEST : MCP_IN_INVALID;
    }
    switch (m.kind) {
    case MCP_MSG_REQUEST:
        dispatch_request(c, &m, r, in_batch);
        return MCP_IN_REQUEST;
    case MCP_MSG_NOTIFICATION:
        dispatch_notification(c, &m, r);
        break;
    case MCP_MSG_RESPONSE:
        break; /* this server sends no requests, so nothing waits for a response */
    }
    return MCP_IN_NONE;
}

static enum mcp_input handle_batch(struct mcp_conn *c, json_t *arr, struct reply *r)
{
    const char *v = mcp_conn_version(c);
    if (!json_array_size(arr)) {
        reply_respond(r, rpc_error(NULL, MCP_INVALID_REQUEST, "an empty batch"));
        return MCP_IN_INVALID;
    }
    if (!(conn_features(c) & VF_BATCH)) {
        _cleanup_free_ char *msg = xasprintf(
            "JSON-RPC batches are part of protocol version 2025-03-26 only; %s%s: send one "
            "message at a time",
            v ? "this connection speaks "
              : "the connection is not "
                "initialized",
            v ? v : "");
        reply_respond(r, rpc_error(NULL, MCP_INVALID_REQUEST, msg));
        return MCP_IN_INVALID;
    }
    r->batch = json_array();
    bool any = false;
    size_t i;
    json_t *el;
    json_array_foreach(arr, i, el) any |= handle_one(c, el, r, true) != MCP_IN_NONE;
    return any ? MCP_IN_REQUEST : MCP_IN_NONE;
}

static enum mcp_input handle_text(struct mcp_conn *c, const char *data, size_t len, struct reply *r)
{
    if (len > MCP_MAX_MESSAGE) {
        _cleanup_free_ char *msg = xasprintf("message of %zu bytes refused: the limit is %u "
                                             "bytes; send large files in smaller pieces",
                                             len, MCP_MAX_MESSAGE);
        reply_respond(r, rpc_error(NULL, MCP_INVALID_REQUEST, msg));
        return MCP_IN_INVALID;
    }
    json_error_t jerr;
    json_t *v = json_loadb(data, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!v) {
        _cleanup_free_ char *msg =
            xasprintf("parse error: %s (line %d, column %d)", jerr.text, jerr.line, jerr.column);
        reply_respond(r, rpc_error(NULL, MCP_PARSE_ERROR, msg));
        return MCP_IN_INVALID;
    }
    enum mcp_input in;
    if (json_is_array(v)) {
        in = handle_batch(c, v, r);
    } else {
        in = handle_one(c, v, r, false);
    }
    json_decref(v);
    return in;
}

enum mcp_input mcp_conn_handle(struct mcp_conn *c, const char *data, size_t len,
                               const struct mcp_sink *sink)
{
    struct reply *r = xcalloc(1, sizeof(*r));
    pthread_mutex_init(&r->lock, NULL);
    r->refs = 1;
    r->sink = *sink;
    enum mcp_input in = handle_text(c, data, len, r);
    reply_unref(r);
    return in;
}
