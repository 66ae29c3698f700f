/* jsonrpc.c - JSON-RPC 2.0 messages as MCP uses them: checking what arrives, building what
 * leaves, and the way back to the transport for one input. */
#include "mcp/mcp-int.h"

#include <errno.h>
#include <string.h>

static char *dup_err(const char *msg)
{
    return xstrdup(msg);
}

/* A request id: MCP allows strings and numbers, never null. */
static bool id_valid(json_t *id)
{
    return json_is_string(id) || json_is_integer(id) || json_is_real(id);
}

static int check_response(json_t *v, struct mcp_msg *m, char **ret_err)
{
    json_t *result = json_object_get(v, "result"), *error = json_object_get(v, "error");
    m->kind = MCP_MSG_RESPONSE;
    m->id = json_object_get(v, "id");
    if (!m->id || (!id_valid(m->id) && !(error && json_is_null(m->id)))) {
        *ret_err = dup_err("a response needs an 'id' (a string or a number)");
        m->id = NULL;
        return MCP_INVALID_REQUEST;
    }
    if ((result != NULL) == (error != NULL)) {
        *ret_err = dup_err("a response has exactly one of 'result' and 'error'");
        return MCP_INVALID_REQUEST;
    }
    return 0;
}

int mcp_msg_check(json_t *v, struct mcp_msg *m, char **ret_err)
{
    memset(m, 0, sizeof(*m));
    *ret_err = NULL;
    if (!json_is_object(v)) {
        *ret_err = dup_err("a JSON-RPC message must be a JSON object");
        return MCP_INVALID_REQUEST;
    }
    json_t *method = json_object_get(v, "method"), *id = json_object_get(v, "id");
    json_t *params = json_object_get(v, "params");
    const char *version = json_string_value(json_object_get(v, "jsonrpc"));
    if (!method) {
        if (!version || strcmp(version, "2.0")) {
            *ret_err = dup_err("the member 'jsonrpc' must be \"2.0\"");
            return MCP_INVALID_REQUEST;
        }
        if (json_object_get(v, "result") || json_object_get(v, "error"))
            return check_response(v, m, ret_err);
        *ret_err = dup_err("not a request, notification or response: there is no 'method', "
                           "'result' or 'error'");
        return MCP_INVALID_REQUEST;
    }
    m->kind = id ? MCP_MSG_REQUEST : MCP_MSG_NOTIFICATION;
    if (id && !id_valid(id)) {
        *ret_err = dup_err("the request 'id' must be a string or a number (MCP does not allow "
                           "null)");
        return MCP_INVALID_REQUEST;
    }
    m->id = id;
    if (!version || strcmp(version, "2.0")) {
        *ret_err = dup_err("the member 'jsonrpc' must be \"2.0\"");
        return MCP_INVALID_REQUEST;
    }
    if (!json_is_string(method) || !*json_string_value(method)) {
        *ret_err = dup_err("'method' must be a non-empty string");
        return MCP_INVALID_REQUEST;
    }
    m->method = json_string_value(method);
    if (params && !json_is_object(params)) {
        *ret_err = xasprintf("'params' of %s must be an object", m->method);
        return MCP_INVALID_PARAMS;
    }
    m->params = params;
    return 0;
}

json_t *rpc_result(json_t *id, json_t *result)
{
    return json_pack("{s:s,s:O,s:o}", "jsonrpc", "2.0", "id", id, "result", result);
}

json_t *rpc_result_for(const struct mcp_config *cfg, unsigned features, json_t *id, json_t *result)
{
    if (features & VF_MODERN) {
        if (!json_object_get(result, "resultType"))
            json_object_set_new(result, "resultType", json_string("complete"));
        json_t *meta = json_object_get(result, "_meta");
        if (!meta) {
            meta = json_object();
            json_object_set_new(result, "_meta", meta);
        }
        json_object_set_new(meta, META_SERVER,
                            json_pack("{s:s,s:s}", "name", "runcell", "version",
                                      cfg->server_version ? cfg->server_version : "0"));
    }
    return rpc_result(id, result);
}

json_t *rpc_error_data(json_t *id, int code, const char *message, json_t *data)
{
    size_t n;
    char *clean = utf8_sanitize(message, strlen(message), &n);
    json_t *j = json_pack("{s:s,s:{s:i,s:s%}}", "jsonrpc", "2.0", "error", "code", code, "message",
                          clean, n);
    free(clean);
    /* An id that could not be read is left out, as the schemas of 2025-11-25 and 2026-07-28
     * have it (RequestId is never null there; JSON-RPC 2.0 wrote null). */
    if (id && !json_is_null(id))
        json_object_set(j, "id", id);
    if (data)
        json_object_set_new(json_object_get(j, "error"), "data", data);
    return j;
}

json_t *rpc_error(json_t *id, int code, const char *message)
{
    return rpc_error_data(id, code, message, NULL);
}

char *mcp_error_json(int code, const char *message)
{
    json_t *j = rpc_error(NULL, code, message);
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return text;
}

json_t *rpc_notification(const char *method, json_t *params)
{
    return json_pack("{s:s,s:s,s:o}", "jsonrpc", "2.0", "method", method, "params", params);
}

/* ---- the way back ---- */

static void sink_send(struct reply *r, json_t *msg, bool response)
{
    /* 15 digits: 0.003 stays 0.003 rather than 0.0030000000000000001 */
    char *text = json_dumps(msg, JSON_COMPACT | JSON_REAL_PRECISION(15));
    json_decref(msg);
    if (text)
        r->sink.send(r->sink.ctx, text, strlen(text), response);
    free(text);
}

void reply_ref(struct reply *r)
{
    pthread_mutex_lock(&r->lock);
    r->refs++;
    pthread_mutex_unlock(&r->lock);
}

void reply_unref(struct reply *r)
{
    pthread_mutex_lock(&r->lock);
    bool last = --r->refs == 0;
    if (last && json_array_size(r->batch))
        sink_send(r, json_incref(r->batch), true);
    pthread_mutex_unlock(&r->lock);
    if (!last)
        return;
    r->sink.close(r->sink.ctx);
    json_decref(r->batch);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

void reply_respond(struct reply *r, json_t *msg)
{
    pthread_mutex_lock(&r->lock);
    if (r->batch)
        json_array_append_new(r->batch, msg);
    else
        sink_send(r, msg, true);
    pthread_mutex_unlock(&r->lock);
}

void reply_notify(struct reply *r, json_t *msg)
{
    pthread_mutex_lock(&r->lock);
    sink_send(r, msg, false);
    pthread_mutex_unlock(&r->lock);
}
