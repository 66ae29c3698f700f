/* era.c - Streamable HTTP's share of the protocol: which era a POST belongs to, and the
 * header checks revision 2026-07-28 asks of a modern one (its request metadata headers). */
#include "mcp/mcp-int.h"

#include <string.h>

#define SENTINEL_HEAD "=?base64?"
#define SENTINEL_TAIL "?="

/* Header values are visible ASCII, space and tab (RFC 9110); anything else is refused. */
static bool header_value_ok(const char *v)
{
    for (const unsigned char *p = (const unsigned char *)v; *p; p++)
        if ((*p < 0x20 && *p != '\t') || *p > 0x7e)
            return false;
    return true;
}

/* Whether header value h (maybe the base64 sentinel form) stands for the string want. */
static bool header_matches(const char *h, const char *want)
{
    size_t n = strlen(h), head = strlen(SENTINEL_HEAD), tail = strlen(SENTINEL_TAIL);
    if (n >= head + tail && !strncmp(h, SENTINEL_HEAD, head) &&
        !strcmp(h + n - tail, SENTINEL_TAIL)) {
        size_t len;
        _cleanup_free_ unsigned char *raw = base64_decode(h + head, n - head - tail, &len);
        return raw && len == strlen(want) && !memcmp(raw, want, len);
    }
    return !strcmp(h, want);
}

/* The body field Mcp-Name mirrors for a method, or NULL when it mirrors none. */
static const char *name_field(const char *method)
{
    static const struct {
        const char *method, *field;
    } fields[] = {
        {"tools/call", "name"},  {"prompts/get", "name"},    {"resources/read", "uri"},
        {"tasks/get", "taskId"}, {"tasks/update", "taskId"}, {"tasks/cancel", "taskId"},
    };
    for (size_t i = 0; i < ARRAY_SIZE(fields); i++)
        if (!strcmp(fields[i].method, method))
            return fields[i].field;
    return NULL;
}

static enum mcp_http_era reject(json_t *id, int code, const char *msg, json_t *data,
                                unsigned *ret_status, char **ret_body)
{
    json_t *j = rpc_error_data(id, code, msg, data);
    *ret_body = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    *ret_status = 400;
    return MCP_HTTP_REJECT;
}

/* The checks of a modern-era message's headers; MCP_HTTP_MODERN when they hold. */
static enum mcp_http_era check_modern(const struct mcp_http_headers *h, json_t *msg,
                                      unsigned *ret_status, char **ret_body)
{
    json_t *id = json_object_get(msg, "id");
    const char *method = json_string_value(json_object_get(msg, "method"));
    json_t *params = json_object_get(msg, "params");
    const char *body_version =
        json_string_value(json_object_get(json_object_get(params, "_meta"), META_VERSION));
    bool request = id && method;
    if (!json_is_string(id) && !json_is_integer(id))
        id = NULL;
    const char *values[] = {h->protocol_version, h->method, h->name};
    for (size_t i = 0; i < ARRAY_SIZE(values); i++)
        if (values[i] && !header_value_ok(values[i]))
            return reject(id, MCP_HEADER_MISMATCH,
                          "Header mismatch: an MCP header value holds characters a header may "
                          "not carry; send non-ASCII values in the =?base64?...?= form",
                          NULL, ret_status, ret_body);
    if (!h->protocol_version)
        return reject(id, MCP_HEADER_MISMATCH,
                      "Header mismatch: the MCP-Protocol-Version header is missing; protocol "
                      "2026-07-28 requires it on every POST, equal to params._meta's version",
                      NULL, ret_status, ret_body);
    if (body_version && strcmp(body_version, h->protocol_version)) {
        _cleanup_free_ char *m = xasprintf("Header mismatch: MCP-Protocol-Version header value "
                                           "'%s' does not match body value '%s'",
                                           h->protocol_version, body_version);
        return reject(id, MCP_HEADER_MISMATCH, m, NULL, ret_status, ret_body);
    }
    if (!request || !method)
        return MCP_HTTP_MODERN; /* the header rules of notifications are not defined */
    if (!h->method || strcmp(h->method, method)) {
        _cleanup_free_ char *m =
            h->method ? xasprintf("Header mismatch: Mcp-Method header value '%s' does not match "
                                  "body value '%s'",
                                  h->method, method)
                      : xasprintf("Header mismatch: the Mcp-Method header is missing; send "
                                  "Mcp-Method: %s",
                                  method);
        return reject(id, MCP_HEADER_MISMATCH, m, NULL, ret_status, ret_body);
    }
    const char *field = name_field(method);
    const char *want = field ? json_string_value(json_object_get(params, field)) : NULL;
    if (want && (!h->name || !header_matches(h->name, want))) {
        _cleanup_free_ char *m =
            h->name ? xasprintf("Header mismatch: Mcp-Name header value '%s' does not match body "
                                "value '%s' (params.%s)",
                                h->name, want, field)
                    : xasprintf("Header mismatch: the Mcp-Name header is missing; %s requires it, "
                                "equal to params.%s",
                                method, field);
        return reject(id, MCP_HEADER_MISMATCH, m, NULL, ret_status, ret_body);
    }
    return MCP_HTTP_MODERN;
}

enum mcp_http_era mcp_http_classify(const struct mcp_http_headers *h, const char *body, size_t len,
                                    unsigned *ret_status, char **ret_body)
{
    *ret_status = 0;
    *ret_body = NULL;
    json_t *msg = len <= MCP_MAX_MESSAGE ? json_loadb(body, len, JSON_DECODE_ANY, NULL) : NULL;
    json_t *id = json_object_get(msg, "id");
    if (!json_is_string(id) && !json_is_integer(id))
        id = NULL;
    const char *hv = h->protocol_version;
    enum mcp_http_era era;
    if (hv && !mcp_version_supported(hv)) {
        _cleanup_free_ char *m =
            xasprintf("Unsupported protocol version: MCP-Protocol-Version '%s'; "
                      "this server speaks 2026-07-28 (per-request _meta) and, "
                      "after initialize, 2025-11-25, 2025-06-18, 2025-03-26 "
                      "and 2024-11-05",
                      hv);
        era = reject(id, MCP_UNSUPPORTED_VERSION, m,
                     json_pack("{s:o,s:s}", "supported", versions_json(), "requested", hv),
                     ret_status, ret_body);
        json_decref(msg);
        return era;
    }
    /* Modern: the header names a modern version, or the body carries a per-request version
     * that is not a legacy one (a legacy client's _meta is its own business). */
    json_t *pv =
        json_object_get(json_object_get(json_object_get(msg, "params"), "_meta"), META_VERSION);
    const char *pvs = json_string_value(pv);
    bool modern = (hv && mcp_version_modern(hv)) ||
                  (pv && !(pvs && mcp_version_supported(pvs) && !mcp_version_modern(pvs)));
    if (!modern)
        era = MCP_HTTP_LEGACY;
    else if (!json_is_object(msg))
        era = MCP_HTTP_MODERN; /* the connection answers the parse error */
    else
        era = check_modern(h, msg, ret_status, ret_body);
    json_decref(msg);
    return era;
}

unsigned mcp_http_status(enum mcp_input in)
{
    switch (in) {
    case MCP_IN_NONE:
        return 202;
    case MCP_IN_INVALID:
    case MCP_IN_REFUSED:
        return 400;
    case MCP_IN_NO_METHOD:
        return 404;
    case MCP_IN_REQUEST:
        break;
    }
    return 200;
}
