/* reply.c - JSON replies, the one table that maps internal errors onto every surface's
 * shape, and request-body field checks. */
#include "http/http.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Connect's HTTP statuses for a unary error are the protocol's own mapping; a streamed one
 * is always 200 with the error in its end-of-stream message. */
static const struct api_err_info api_errs[AE_N_ERRORS] = {
    [AE_BAD_REQUEST] = {400, "bad_request", 400, "invalid_argument", 400, -32602},
    [AE_BAD_PATH] = {400, "bad_path", 400, "invalid_argument", 400, -32602},
    [AE_UNAUTHORIZED] = {401, "unauthorized", 401, "unauthenticated", 401, -32001},
    [AE_NOT_FOUND] = {404, "not_found", 404, "not_found", 404, -32002},
    [AE_EXPIRED] = {404, "expired", 404, "not_found", 404, -32002},
    [AE_METHOD] = {405, "method_not_allowed", 405, "unimplemented", 501, -32601},
    [AE_BUSY] = {409, "busy", 409, "failed_precondition", 400, -32000},
    [AE_EXISTS] = {409, "exists", 409, "already_exists", 409, -32000},
    [AE_TOO_LARGE] = {413, "too_large", 413, "resource_exhausted", 413, -32600},
    [AE_NO_SPACE] = {413, "too_large", 507, "resource_exhausted", 429, -32000},
    [AE_LIMIT] = {429, "limit_exceeded", 429, "resource_exhausted", 429, -32000},
    [AE_INTERNAL] = {500, "internal", 500, "internal", 500, -32603},
    [AE_UNIMPLEMENTED] = {501, "not_implemented", 501, "unimplemented", 501, -32601},
    [AE_NOT_RUNNING] = {404, "not_found", 502, "unavailable", 503, -32002},
    [AE_SANDBOX] = {503, "sandbox_error", 503, "unavailable", 503, -32603},
    [AE_SHUTTING_DOWN] = {503, "shutting_down", 503, "unavailable", 503, -32000},
    [AE_NOT_CONFIGURED] = {503, "agent_not_configured", 503, "unavailable", 503, -32603},
    [AE_MOVED] = {409, "session_moved", 409, "unavailable", 503, -32000},
    [AE_DEADLINE] = {504, "timeout", 504, "deadline_exceeded", 504, -32000},
    [AE_CANCELLED] = {499, "cancelled", 499, "canceled", 499, -32800},
    [AE_FENCED] = {503, "node_fenced", 503, "unavailable", 503, -32000},
    [AE_BAD_GATEWAY] = {502, "bad_gateway", 502, "unavailable", 503, -32603},
};

const struct api_err_info *api_err_info(enum api_err e)
{
    return &api_errs[e < AE_N_ERRORS ? e : AE_INTERNAL];
}

static bool connect_route(const struct request *rq)
{
    return rq->route && (rq->route->flags & ROUTE_CONNECT);
}

unsigned api_err_status(const struct request *rq, enum api_err e)
{
    const struct api_err_info *i = api_err_info(e);
    if (connect_route(rq))
        return i->connect_status;
    if (rq->surface && rq->surface->shape == SHAPE_E2B)
        return i->e2b_status;
    return i->status;
}

/* The error body of rq's surface for e and msg (UTF-8, n bytes). */
static json_t *error_body(const struct request *rq, enum api_err e, const char *msg, size_t n)
{
    const struct api_err_info *i = api_err_info(e);
    if (connect_route(rq))
        return json_pack("{s:s,s:s%}", "code", i->connect, "message", msg, n);
    switch (rq->surface ? rq->surface->shape : SHAPE_NATIVE) {
    case SHAPE_E2B:
        return json_pack("{s:i,s:s%}", "code", (int)i->e2b_status, "message", msg, n);
    case SHAPE_MCP:
        return json_pack("{s:s,s:n,s:{s:i,s:s%}}", "jsonrpc", "2.0", "id", "error", "code",
                         i->jsonrpc, "message", msg, n);
    case SHAPE_NATIVE:
        break;
    }
    return json_pack("{s:{s:s,s:s%}}", "error", "code", i->code, "message", msg, n);
}

enum MHD_Result reply_response(struct request *rq, unsigned status, struct MHD_Response *r)
{
    if (!r)
        return MHD_NO;
    rq->status = (int)status;
    rq->responded = true;
    /* Which node answered: for routers, logs and tests of a fleet. */
    if (rq->srv->node)
        MHD_add_response_header(r, "X-Runcell-Node", rq->srv->node);
    if (rq->takeover)
        MHD_add_response_header(r, "X-Runcell-Resumed", "true");
    if (rq->phase == PHASE_BODY || (rq->phase == PHASE_HEADERS && rq->hold_reply)) {
        rq->held = r; /* queued when the body has ended (server.c) */
        return MHD_YES;
    }
    enum MHD_Result ret = MHD_queue_response(rq->conn, status, r);
    MHD_destroy_response(r);
    return ret;
}

enum MHD_Result reply_json(struct request *rq, unsigned status, json_t *j)
{
    return reply_json_header(rq, status, j, NULL, NULL);
}

enum MHD_Result reply_json_header(struct request *rq, unsigned status, json_t *j, const char *name,
                                  const char *value)
{
    /* The first reply about a session taken over says so, whatever the route. */
    if (rq->takeover && json_is_object(j)) {
        if (j->refcount > 1) { /* shared (an execution's record): not changed, copied */
            json_t *own = json_copy(j);
            json_decref(j);
            j = own;
        }
        json_object_update_missing(j, rq->takeover);
    }
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!text)
        return MHD_NO;
    size_t n = strlen(text);
    text = xrealloc(text, n + 2);
    text[n++] = '\n';
    struct MHD_Response *r = MHD_create_response_from_buffer(n, text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (name)
        MHD_add_response_header(r, name, value);
    return reply_response(rq, status, r);
}

bool connect_streaming(struct request *rq)
{
    const char *ct = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Content-Type");
    return connect_route(rq) && ct && !strncasecmp(ct, "application/connect+", 20);
}

enum MHD_Result reply_connect_end_error(struct request *rq, const char *code, const char *msg,
                                        size_t n)
{
    json_t *j = json_pack("{s:{s:s,s:s%}}", "error", "code", code, "message", msg, n);
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!text)
        return MHD_NO;
    size_t len = strlen(text);
    unsigned char *body = xmalloc(len + 5);
    body[0] = 0x02; /* end of stream */
    body[1] = (unsigned char)(len >> 24);
    body[2] = (unsigned char)(len >> 16);
    body[3] = (unsigned char)(len >> 8);
    body[4] = (unsigned char)len;
    memcpy(body + 5, text, len);
    free(text);
    struct MHD_Response *r = MHD_create_response_from_buffer(len + 5, body, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "application/connect+json");
    return reply_response(rq, 200, r);
}

/* The one error reply: {"error":{"code","message"}} plus extra's fields, with a header
 * when name is set. A Connect streaming call gets it as its end of stream. */
static enum MHD_Result api_verror(struct request *rq, enum api_err e, json_t *extra,
                                  const char *name, const char *value, const char *fmt, va_list ap)
{
    char msg[2048];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    size_t n;
    char *clean = utf8_sanitize(msg, strlen(msg), &n);
    if (connect_streaming(rq)) {
        enum MHD_Result r = reply_connect_end_error(rq, api_err_info(e)->connect, clean, n);
        free(clean);
        json_decref(extra);
        return r;
    }
    json_t *j = error_body(rq, e, clean, n);
    free(clean);
    if (extra)
        json_object_update_missing(j, extra);
    json_decref(extra);
    return reply_json_header(rq, api_err_status(rq, e), j, name, value);
}

enum MHD_Result api_error(struct request *rq, enum api_err e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    enum MHD_Result r = api_verror(rq, e, NULL, NULL, NULL, fmt, ap);
    va_end(ap);
    return r;
}

enum MHD_Result api_error_header(struct request *rq, enum api_err e, const char *name,
                                 const char *value, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    enum MHD_Result r = api_verror(rq, e, NULL, name, value, fmt, ap);
    va_end(ap);
    return r;
}

enum MHD_Result api_error_with(struct request *rq, enum api_err e, json_t *extra, const char *fmt,
                               ...)
{
    va_list ap;
    va_start(ap, fmt);
    enum MHD_Result r = api_verror(rq, e, extra, NULL, NULL, fmt, ap);
    va_end(ap);
    return r;
}

/* -errno onto api_err: what a session operation's error means to a client. */
static const struct {
    int err;
    enum api_err e;
} errno_errs[] = {
    {EINVAL, AE_BAD_REQUEST},  {ELOOP, AE_BAD_PATH},          {EXDEV, AE_BAD_PATH},
    {ENOTDIR, AE_BAD_PATH},    {EISDIR, AE_BAD_PATH},         {ENAMETOOLONG, AE_BAD_PATH},
    {ENOENT, AE_NOT_FOUND},    {ETIME, AE_EXPIRED},           {EBUSY, AE_BUSY},
    {EEXIST, AE_EXISTS},       {ENOTEMPTY, AE_EXISTS},        {E2BIG, AE_TOO_LARGE},
    {EFBIG, AE_TOO_LARGE},     {ENOSPC, AE_NO_SPACE},         {EDQUOT, AE_NO_SPACE},
    {EAGAIN, AE_LIMIT},        {ESHUTDOWN, AE_SHUTTING_DOWN}, {EIO, AE_SANDBOX},
    {ETIMEDOUT, AE_SANDBOX},   {ENOSYS, AE_UNIMPLEMENTED},    {EOPNOTSUPP, AE_UNIMPLEMENTED},
    {ECANCELED, AE_CANCELLED},
};

enum api_err api_err_of(int err)
{
    for (size_t i = 0; i < ARRAY_SIZE(errno_errs); i++)
        if (errno_errs[i].err == -err)
            return errno_errs[i].e;
    return AE_INTERNAL;
}

const char *api_err_code(enum api_err e)
{
    return api_err_info(e)->code;
}

/* How well one media range of an Accept header ("type/sub", "type/ *" or "* / *", with
 * parameters) matches type: 3, 2, 1 as it is more specific, 0 when it does not. */
static int range_match(const char *range, size_t n, const char *type)
{
    const char *slash = memchr(range, '/', n);
    size_t tn = strlen(type);
    if (!slash)
        return 0;
    if (n == 3 && !strncmp(range, "*/*", 3))
        return 1;
    size_t major = (size_t)(slash - range);
    if (n == major + 2 && slash[1] == '*')
        return major < tn && type[major] == '/' && !strncasecmp(range, type, major) ? 2 : 0;
    return n == tn && !strncasecmp(range, type, n) ? 3 : 0;
}

double accept_q(struct request *rq, const char *type)
{
    const char *a = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Accept");
    if (!a)
        return 1.0;
    int best = 0;
    double q_best = 0.0;
    for (const char *p = a; *p;) {
        p += strspn(p, " \t,");
        size_t len = strcspn(p, ",");
        size_t tlen = strcspn(p, ";, \t");
        int m = range_match(p, MIN(tlen, len), type);
        double q = 1.0;
        /* the q parameter, among the range's parameters */
        for (const char *par = memchr(p, ';', len); par && par < p + len;
             par = memchr(par + 1, ';', (size_t)(p + len - par - 1))) {
            const char *v = par + 1 + strspn(par + 1, " \t");
            if ((v[0] == 'q' || v[0] == 'Q') && v[1] == '=')
                q = strtod(v + 2, NULL);
        }
        if (m > best) {
            best = m;
            q_best = q < 0 ? 0 : q > 1 ? 1 : q;
        }
        p += len;
    }
    return q_best;
}

bool accept_lists(struct request *rq, const char *type)
{
    const char *a = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Accept");
    for (const char *p = a; p && *p;) {
        p += strspn(p, " \t,");
        size_t len = strcspn(p, ",");
        if (range_match(p, MIN(strcspn(p, ";, \t"), len), type) == 3)
            return true;
        p += len;
    }
    return false;
}

enum MHD_Result api_errno(struct request *rq, int err)
{
    return api_error(rq, api_err_of(err), "%s", err_msg());
}

json_t *body_json(struct request *rq)
{
    if (!rq->body.len)
        return json_object();
    json_error_t jerr;
    json_t *j = json_loadb(rq->body.data, rq->body.len, JSON_REJECT_DUPLICATES, &jerr);
    if (!j) {
        api_error(rq, AE_BAD_REQUEST, "request body is not valid JSON: %s (line %d, column %d)",
                  jerr.text, jerr.line, jerr.column);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        api_error(rq, AE_BAD_REQUEST, "request body must be a JSON object");
        return NULL;
    }
    return j;
}

static const char *type_name(json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

static bool type_ok(json_t *v, enum field_type t)
{
    switch (t) {
    case F_STRING:
        return json_is_string(v);
    case F_NUMBER:
        return json_is_number(v);
    case F_INT:
        return json_is_integer(v);
    case F_BOOL:
        return json_is_boolean(v);
    case F_OBJECT:
        return json_is_object(v);
    case F_ARRAY:
        return json_is_array(v);
    }
    return false;
}

static const char *const type_words[] = {
    [F_STRING] = "a string", [F_NUMBER] = "a number",  [F_INT] = "an integer",
    [F_BOOL] = "a boolean",  [F_OBJECT] = "an object", [F_ARRAY] = "an array",
};

bool check_fields(struct request *rq, json_t *obj, const struct field *fields, size_t n)
{
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v)
    {
        const struct field *f = NULL;
        for (size_t i = 0; i < n && !f; i++)
            if (!strcmp(fields[i].name, key))
                f = &fields[i];
        if (!f) {
            struct buf known;
            buf_init(&known, 0);
            for (size_t i = 0; i < n; i++)
                buf_printf(&known, "%s%s", i ? ", " : "", fields[i].name);
            api_error(rq, AE_BAD_REQUEST, "unknown field '%s'; known fields: %s", key,
                      known.data ? known.data : "none");
            buf_release(&known);
            return false;
        }
        if (json_is_null(v))
            continue; /* null means "the default" */
        if (!type_ok(v, f->type)) {
            api_error(rq, AE_BAD_REQUEST, "field '%s' must be %s, not %s", key, type_words[f->type],
                      type_name(v));
            return false;
        }
    }
    return true;
}

bool get_seconds(struct request *rq, json_t *obj, const char *name, uint64_t max_ms,
                 uint64_t *ret_ms)
{
    json_t *v = json_object_get(obj, name);
    if (!v || json_is_null(v))
        return true;
    double s = json_number_value(v);
    if (!(s > 0)) {
        api_error(rq, AE_BAD_REQUEST, "field '%s' must be more than 0 seconds", name);
        return false;
    }
    if (s * 1000.0 > (double)max_ms) {
        api_error(rq, AE_BAD_REQUEST, "field '%s' is %g s, more than this server allows (%g s)",
                  name, s, (double)max_ms / 1000.0);
        return false;
    }
    *ret_ms = (uint64_t)(s * 1000.0 + 0.5);
    if (!*ret_ms)
        *ret_ms = 1;
    return true;
}

bool get_count(struct request *rq, json_t *obj, const char *name, uint64_t max, uint64_t *ret)
{
    json_t *v = json_object_get(obj, name);
    if (!v || json_is_null(v))
        return true;
    json_int_t i = json_integer_value(v);
    if (i <= 0) {
        api_error(rq, AE_BAD_REQUEST, "field '%s' must be a positive integer", name);
        return false;
    }
    if ((uint64_t)i > max) {
        api_error(rq, AE_BAD_REQUEST, "field '%s' is %lld, more than this server allows (%llu)",
                  name, (long long)i, (unsigned long long)max);
        return false;
    }
    *ret = (uint64_t)i;
    return true;
}
