/* conn.c - one MCP client connection: the two eras (initialize and version negotiation for
 * 2025-11-25 and older; per-request _meta for 2026-07-28), the method table, batches,
 * cancellation. */
#include "mcp/mcp-int.h"

#include <errno.h>
#include <string.h>
#include <time.h>

#define VF_2025_11_25                                                                              \
    (VF_ANNOTATIONS | VF_PROGRESS_MESSAGE | VF_STRUCTURED | VF_TITLES | VF_ARGS_AS_RESULTS |       \
     VF_DESCRIPTION)

static const struct version versions[] = {
    {"2026-07-28", VF_2025_11_25 | VF_MODERN},
    {"2025-11-25", VF_2025_11_25},
    {"2025-06-18", VF_ANNOTATIONS | VF_PROGRESS_MESSAGE | VF_STRUCTURED | VF_TITLES},
    {"2025-03-26", VF_ANNOTATIONS | VF_PROGRESS_MESSAGE | VF_BATCH},
    {"2024-11-05", 0},
};

const char *const mcp_versions[] = {"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05", NULL};
const char *const mcp_modern_versions[] = {"2026-07-28", NULL};

static const char instructions_legacy[] =
    "runcell runs code in a locked-down Linux sandbox that keeps its state between calls. "
    "Call run_code with Python (numpy, pandas and matplotlib are installed), bash or JavaScript "
    "(Node.js): variables, imports and files in /workspace persist from one call to the next in "
    "the same session. Without session_id every call goes to this client's default session; "
    "create_session gives a separate one. The value of a cell's last expression is returned, "
    "and matplotlib figures come back as PNG images. When the code fails, the result has "
    "isError set and the traceback: fix the code and run it again. The sandbox has no network "
    "access.";
static const char instructions_modern[] =
    "runcell runs code in a locked-down Linux sandbox that keeps its state between calls. "
    "First call create_session: it returns a session_id, which every other tool takes. Then "
    "call run_code with Python (numpy, pandas and matplotlib are installed), bash or JavaScript "
    "(Node.js) and that session_id: variables, imports and files in /workspace persist from one "
    "call to the next in the same session. The value of a cell's last expression is returned, "
    "and matplotlib figures come back as PNG images. When the code fails, the result has "
    "isError set and the traceback: fix the code and run it again. The sandbox has no network "
    "access.";

static const char *instructions_for(unsigned features)
{
    return features & VF_MODERN ? instructions_modern : instructions_legacy;
}

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

bool mcp_version_modern(const char *version)
{
    const struct version *v = find_version(version);
    return v && (v->features & VF_MODERN);
}

/* The version an initialize gets when it asks for one it cannot have. */
static const struct version *newest_legacy(void)
{
    return find_version(mcp_versions[0]);
}

static struct mcp_conn *conn_new(const struct mcp_config *cfg, bool shared)
{
    struct mcp_conn *c = xcalloc(1, sizeof(*c));
    c->cfg = cfg;
    c->exec = cfg->exec ? cfg->exec : &mcp_exec_durable_ops;
    c->shared = shared;
    pthread_mutex_init(&c->tasks_lock, NULL);
    /* One client's pipelined calls, or every modern client of an HTTP server at once. */
    c->max_calls = shared ? MCP_MAX_CALLS * 16 : MCP_MAX_CALLS;
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->default_lock, NULL);
    pthread_cond_init(&c->idle, NULL);
    c->owned = xcalloc(1, sizeof(char *));
    c->last_active_ms = now_ms();
    return c;
}

struct mcp_conn *mcp_conn_new(const struct mcp_config *cfg)
{
    return conn_new(cfg, false);
}

struct mcp_conn *mcp_conn_new_shared(const struct mcp_config *cfg)
{
    return conn_new(cfg, true);
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
    tasks_free_all(c);
    for (char **id = c->owned; c->cfg->table && *id; id++)
        session_table_remove(c->cfg->table, *id);
    strv_free(c->owned);
    free(c->end_reason);
    free(c->default_id);
    free(c->default_known);
    pthread_cond_destroy(&c->idle);
    pthread_mutex_destroy(&c->tasks_lock);
    pthread_mutex_destroy(&c->default_lock);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* ---- methods ---- */

static void respond(const struct req *q, json_t *result)
{
    reply_respond(q->r, rpc_result_for(q->c->cfg, req_features(q), q->m->id, result));
}

static void respond_error(const struct req *q, int code, const char *message)
{
    reply_respond(q->r, rpc_error(q->m->id, code, message));
}

/* serverInfo of a version (initialize's; on the modern era, server/discover's _meta carries
 * only name and version like every other result). */
static json_t *server_info(const struct mcp_config *cfg, unsigned features)
{
    json_t *info = json_pack("{s:s,s:s}", "name", "runcell", "version",
                             cfg->server_version ? cfg->server_version : "0");
    if (features & VF_TITLES)
        json_object_set_new(info, "title", json_string("runcell code interpreter"));
    if (features & VF_DESCRIPTION)
        json_object_set_new(info, "description",
                            json_string("A sandboxed, stateful Python, bash and JavaScript "
                                        "interpreter"));
    return info;
}

static void m_initialize(struct req *q)
{
    struct mcp_conn *c = q->c;
    const struct mcp_msg *m = q->m;
    const char *asked = json_string_value(json_object_get(m->params, "protocolVersion"));
    if (!asked) {
        respond_error(q, MCP_INVALID_PARAMS,
                      "initialize: params.protocolVersion must be a string, e.g. \"2025-11-25\"");
        return;
    }
    const struct version *v = find_version(asked);
    if (!v || (v->features & VF_MODERN))
        v = newest_legacy(); /* the client decides whether it can speak ours */
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
        respond_error(q, MCP_INVALID_REQUEST, msg);
        return;
    }
    const char *client =
        json_string_value(json_object_get(json_object_get(m->params, "clientInfo"), "name"));
    log_info("msg=\"mcp client initialized\" client=%s protocol=%s asked=%s",
             log_quote(client ? client : "?"), v->name, log_quote(asked));
    reply_respond(q->r,
                  rpc_result(m->id, json_pack("{s:s,s:{s:{s:b}},s:o,s:s}", "protocolVersion",
                                              v->name, "capabilities", "tools", "listChanged", 0,
                                              "serverInfo", server_info(c->cfg, v->features),
                                              "instructions", instructions_for(v->features))));
}

static void m_ping(struct req *q)
{
    respond(q, json_object());
}

json_t *versions_json(void)
{
    json_t *a = json_array();
    for (const char *const *v = mcp_modern_versions; *v; v++)
        json_array_append_new(a, json_string(*v));
    for (const char *const *v = mcp_versions; *v; v++)
        json_array_append_new(a, json_string(*v));
    return a;
}

static void m_discover(struct req *q)
{
    json_t *caps =
        json_pack("{s:{s:b},s:{s:{}}}", "tools", "listChanged", 0, "extensions", EXT_TASKS);
    respond(q, json_pack("{s:o,s:o,s:s,s:I,s:s}", "supportedVersions", versions_json(),
                         "capabilities", caps, "instructions", instructions_for(VF_MODERN), "ttlMs",
                         (json_int_t)LIST_TTL_MS, "cacheScope", "public"));
}

static void m_tools_list(struct req *q)
{
    json_t *cursor = json_object_get(q->m->params, "cursor");
    if (cursor && !json_is_null(cursor)) {
        /* Every tool fits in the first page, so no cursor was ever handed out. */
        respond_error(q, MCP_INVALID_PARAMS,
                      "tools/list: unknown cursor; the list has one page, ask without a cursor");
        return;
    }
    json_t *list = tools_list_json(q->c->cfg, req_features(q));
    if (req_features(q) & VF_MODERN) {
        /* The same for every client: one token serves them all, and the list changes only
         * with the server's version. */
        json_object_set_new(list, "ttlMs", json_integer(LIST_TTL_MS));
        json_object_set_new(list, "cacheScope", json_string("public"));
    }
    respond(q, list);
}

static json_t *progress_token(json_t *params)
{
    json_t *t = json_object_get(json_object_get(params, "_meta"), "progressToken");
    return json_is_string(t) || json_is_integer(t) ? t : NULL;
}

bool req_declares_tasks(const struct req *q)
{
    return json_is_object(json_object_get(json_object_get(q->caps, "extensions"), EXT_TASKS));
}

static void m_tools_call(struct req *q)
{
    struct mcp_conn *c = q->c;
    const struct mcp_msg *m = q->m;
    unsigned features = req_features(q);
    const char *name = json_string_value(json_object_get(m->params, "name"));
    json_t *args = json_object_get(m->params, "arguments");
    if (!name) {
        respond_error(q, MCP_INVALID_PARAMS,
                      "tools/call: params.name must be a string: the tool to call");
        return;
    }
    const struct tool *t = tool_find(name);
    if (!t) {
        _cleanup_free_ char *msg =
            xasprintf("tools/call: unknown tool '%s'; the tools are: %s", name, tool_names());
        respond_error(q, MCP_INVALID_PARAMS, msg);
        return;
    }
    if (args && json_is_null(args))
        args = NULL;
    if (args && !json_is_object(args)) {
        respond_error(q, MCP_INVALID_PARAMS, "tools/call: params.arguments must be an object");
        return;
    }
    _cleanup_free_ char *err = NULL;
    json_t *empty = json_object();
    if (tool_check_args(t, args ? args : empty, features, &err)) {
        json_decref(empty);
        /* Since 2025-11-25 a model sees bad arguments as a tool error and can correct them;
         * before, they were protocol errors. */
        if (features & VF_ARGS_AS_RESULTS)
            respond(q, tool_error("%s", err));
        else
            respond_error(q, MCP_INVALID_PARAMS, err);
        return;
    }
    if (!c->cfg->table) {
        json_decref(empty);
        respond(q, tool_error("%s: this server has no sandbox to run sessions in", name));
        return;
    }
    struct call_params p = {.tool = t,
                            .id = m->id,
                            .args = args ? args : empty,
                            .progress_token = progress_token(m->params),
                            .features = features,
                            .tasks = (features & VF_MODERN) && req_declares_tasks(q)};
    int e = call_start(c, &p, q->r);
    json_decref(empty);
    if (e == -EAGAIN)
        respond_error(q, MCP_SERVER_BUSY, err_msg());
    else if (e < 0)
        respond_error(q, MCP_INTERNAL_ERROR, err_msg());
}

static void m_initialized(struct req *q)
{
    (void)q;
}

static void m_cancelled(struct req *q)
{
    json_t *id = json_object_get(q->m->params, "requestId");
    const char *reason = json_string_value(json_object_get(q->m->params, "reason"));
    if (!id)
        return;
    if (q->c->shared) {
        /* Ids of different clients may be alike here: a client cancels by closing its
         * response stream (Streamable HTTP, revision 2026-07-28). */
        log_debug("msg=\"mcp cancellation by id ignored on a shared connection\"");
        return;
    }
    bool found = call_cancel(q->c, id);
    char *text = json_dumps(id, JSON_ENCODE_ANY | JSON_COMPACT);
    log_info("msg=\"mcp request cancelled\" id=%s found=%d reason=%s", text ? text : "?", found,
             log_quote(reason ? reason : ""));
    free(text);
}

enum era { LEGACY = 1, MODERN = 2 };

static const struct method {
    const char *name;
    bool notification;
    unsigned eras;
    bool before_init; /* legacy era: allowed before initialize */
    void (*fn)(struct req *q);
} methods[] = {
    {"initialize", false, LEGACY, true, m_initialize},
    {"ping", false, LEGACY, true, m_ping},
    {"server/discover", false, MODERN, false, m_discover},
    {"tools/list", false, LEGACY | MODERN, false, m_tools_list},
    {"tools/call", false, LEGACY | MODERN, false, m_tools_call},
    {"tasks/get", false, MODERN, false, m_tasks_get},
    {"tasks/update", false, MODERN, false, m_tasks_update},
    {"tasks/cancel", false, MODERN, false, m_tasks_cancel},
    {"notifications/initialized", true, LEGACY, true, m_initialized},
    {"notifications/cancelled", true, LEGACY | MODERN, true, m_cancelled},
};

/* The requests of an era, for messages: "initialize, ping, ...". */
static char *request_names(unsigned era)
{
    struct buf b;
    buf_init(&b, 0);
    for (size_t i = 0; i < ARRAY_SIZE(methods); i++)
        if (!methods[i].notification && (methods[i].eras & era))
            buf_printf(&b, "%s%s", b.len ? ", " : "", methods[i].name);
    return buf_detach(&b, NULL);
}

static const struct method *find_method(const char *name, bool notification)
{
    for (size_t i = 0; i < ARRAY_SIZE(methods); i++)
        if (methods[i].notification == notification && !strcmp(methods[i].name, name))
            return &methods[i];
    return NULL;
}

static const char *const log_levels[] = {"debug", "info",     "notice", "warning",
                                         "error", "critical", "alert",  "emergency"};

/* The per-request fields revision 2026-07-28 requires in _meta; NULL, or why they are not
 * there (caller frees). */
static char *check_modern_meta(const char *method, json_t *meta)
{
    json_t *caps = json_object_get(meta, META_CAPABILITIES),
           *info = json_object_get(meta, META_CLIENT);
    json_t *level = json_object_get(meta, META_LOG_LEVEL);
    if (!json_is_object(caps))
        return xasprintf("%s: params._meta[\"%s\"] must be an object (an empty one when the "
                         "client has no optional capability): protocol 2026-07-28 requires it "
                         "on every request",
                         method, META_CAPABILITIES);
    if (info && !json_is_object(info))
        return xasprintf("%s: params._meta[\"%s\"] must be an object {name, version}", method,
                         META_CLIENT);
    if (level) {
        for (size_t i = 0; json_is_string(level) && i < ARRAY_SIZE(log_levels); i++)
            if (!strcmp(json_string_value(level), log_levels[i]))
                return NULL;
        return xasprintf("%s: params._meta[\"%s\"] must be one of debug, info, notice, warning, "
                         "error, critical, alert, emergency",
                         method, META_LOG_LEVEL);
    }
    return NULL;
}

/* A request with params._meta naming a protocol version: served on the modern era when the
 * version is a modern one; a legacy version on an initialized connection is served on the
 * legacy era (*ret_legacy). */
static enum mcp_input serve_modern(struct req *q, const struct method *fn, json_t *meta, json_t *pv,
                                   bool in_batch, bool *ret_legacy)
{
    const struct mcp_msg *m = q->m;
    const char *asked = json_string_value(pv);
    const struct version *v = find_version(asked);
    *ret_legacy = false;
    if (!asked) {
        _cleanup_free_ char *msg = xasprintf("%s: params._meta[\"%s\"] must be a string, e.g. "
                                             "\"2026-07-28\"",
                                             m->method, META_VERSION);
        respond_error(q, MCP_INVALID_PARAMS, msg);
        return MCP_IN_REFUSED;
    }
    if (v && !(v->features & VF_MODERN)) {
        if (mcp_conn_version(q->c) && !q->c->shared) {
            *ret_legacy = true;
            return MCP_IN_REQUEST;
        }
        _cleanup_free_ char *msg = xasprintf("%s: protocol %s begins with an initialize request "
                                             "and has no per-request version; send initialize "
                                             "first, or name 2026-07-28 in "
                                             "params._meta[\"%s\"]",
                                             m->method, asked, META_VERSION);
        respond_error(q, MCP_INVALID_REQUEST, msg);
        return MCP_IN_REFUSED;
    }
    if (!v) {
        _cleanup_free_ char *msg = xasprintf("Unsupported protocol version: %s; this server "
                                             "speaks 2026-07-28 (per-request _meta) and, after "
                                             "initialize, 2025-11-25, 2025-06-18, 2025-03-26 and "
                                             "2024-11-05",
                                             asked);
        reply_respond(q->r, rpc_error_data(m->id, MCP_UNSUPPORTED_VERSION, msg,
                                           json_pack("{s:o,s:s}", "supported", versions_json(),
                                                     "requested", asked)));
        return MCP_IN_REFUSED;
    }
    _cleanup_free_ char *bad = check_modern_meta(m->method, meta);
    if (bad) {
        respond_error(q, MCP_INVALID_PARAMS, bad);
        return MCP_IN_REFUSED;
    }
    if (in_batch) {
        respond_error(q, MCP_INVALID_REQUEST,
                      "protocol 2026-07-28 has no batches: send one message at a time");
        return MCP_IN_REFUSED;
    }
    if (!fn || !(fn->eras & MODERN)) {
        _cleanup_free_ char *names = request_names(MODERN);
        _cleanup_free_ char *msg = xasprintf("unknown method '%s' in protocol %s; this server "
                                             "answers %s",
                                             m->method, v->name, names);
        respond_error(q, MCP_METHOD_NOT_FOUND, msg);
        return MCP_IN_NO_METHOD;
    }
    q->v = v;
    q->caps = json_object_get(meta, META_CAPABILITIES);
    fn->fn(q);
    return q->refused ? MCP_IN_REFUSED : MCP_IN_REQUEST;
}

static enum mcp_input serve_legacy(struct req *q, const struct method *fn, bool in_batch)
{
    struct mcp_conn *c = q->c;
    const struct mcp_msg *m = q->m;
    if (c->shared) {
        _cleanup_free_ char *msg = xasprintf("%s: this request is served on protocol 2026-07-28, "
                                             "which has no initialize: name the version and the "
                                             "client's capabilities in params._meta[\"%s\"] and "
                                             "[\"%s\"]",
                                             m->method, META_VERSION, META_CAPABILITIES);
        respond_error(q, fn && (fn->eras & MODERN) ? MCP_INVALID_PARAMS : MCP_METHOD_NOT_FOUND,
                      msg);
        return fn && (fn->eras & MODERN) ? MCP_IN_REFUSED : MCP_IN_NO_METHOD;
    }
    if (fn && !(fn->eras & LEGACY)) {
        /* server/discover without _meta: a client of the modern era that forgot it */
        _cleanup_free_ char *msg = xasprintf("%s: params._meta must name the protocol version "
                                             "(\"%s\": \"2026-07-28\") and the client's "
                                             "capabilities (\"%s\")",
                                             m->method, META_VERSION, META_CAPABILITIES);
        respond_error(q, MCP_INVALID_PARAMS, msg);
        return MCP_IN_REQUEST;
    }
    if (!fn) {
        _cleanup_free_ char *names = request_names(LEGACY);
        _cleanup_free_ char *msg =
            xasprintf("unknown method '%s'; this server answers %s (and, with per-request "
                      "_meta of protocol 2026-07-28, server/discover)",
                      m->method, names);
        respond_error(q, MCP_METHOD_NOT_FOUND, msg);
        return MCP_IN_REQUEST;
    }
    if (in_batch && !strcmp(m->method, "initialize")) {
        respond_error(q, MCP_INVALID_REQUEST, "initialize must not be part of a batch");
        return MCP_IN_REQUEST;
    }
    pthread_mutex_lock(&c->lock);
    q->v = c->version;
    pthread_mutex_unlock(&c->lock);
    if (!fn->before_init && !q->v) {
        _cleanup_free_ char *msg = xasprintf("%s before initialize: the first request must be "
                                             "initialize (or, on protocol 2026-07-28, carry "
                                             "params._meta[\"%s\"])",
                                             m->method, META_VERSION);
        respond_error(q, MCP_INVALID_REQUEST, msg);
        return MCP_IN_REQUEST;
    }
    fn->fn(q);
    return MCP_IN_REQUEST;
}

static enum mcp_input dispatch_request(struct mcp_conn *c, const struct mcp_msg *m, struct reply *r,
                                       bool in_batch)
{
    struct req q = {.c = c, .m = m, .r = r};
    const struct method *fn = find_method(m->method, false);
    json_t *meta = json_object_get(m->params, "_meta");
    json_t *pv = json_object_get(meta, META_VERSION);
    /* initialize always selects the legacy era (a dual-era server's rule). */
    if (pv && strcmp(m->method, "initialize")) {
        bool legacy;
        enum mcp_input in = serve_modern(&q, fn, meta, pv, in_batch, &legacy);
        if (!legacy)
            return in;
    }
    return serve_legacy(&q, fn, in_batch);
}

static void dispatch_notification(struct mcp_conn *c, const struct mcp_msg *m, struct reply *r)
{
    const struct method *fn = find_method(m->method, true);
    struct req q = {.c = c, .m = m, .r = r};
    if (fn)
        fn->fn(&q);
    else
        log_debug("msg=\"mcp notification ignored\" method=%s", log_quote(m->method));
}

/* Handles one message object: MCP_IN_REQUEST (or a modern refusal) when a response was (or
 * will be) sent for it, MCP_IN_INVALID when it was answered with an error without id. */
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
        return dispatch_request(c, &m, r, in_batch);
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
