/* routes.c - E2B's route table, its authentication, its replies and errors, and the registry
 * of sandboxes: the parts of the E2B surface that the others (control.c, interp.c, envd.c)
 * stand on. docs/E2B.md has what maps and what is refused. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "e2b/e2b-int.h"
#include "store/store.h"

struct e2b *e2b_new(void)
{
    struct e2b *e = xcalloc(1, sizeof(*e));
    pthread_mutex_init(&e->lock, NULL);
    return e;
}

static void box_free(struct e2b_box *b)
{
    if (!b)
        return;
    explicit_bzero(b->token, strlen(b->token));
    free(b->token);
    free(b->id);
    free(b->template_id);
    json_decref(b->metadata);
    json_decref(b->contexts);
    json_decref(b->env);
    e2b_watchers_free(b->watchers);
    free(b);
}

void e2b_free(struct e2b *e)
{
    if (!e)
        return;
    while (e->boxes) {
        struct e2b_box *b = e->boxes;
        e->boxes = b->next;
        box_free(b);
    }
    pthread_mutex_destroy(&e->lock);
    free(e);
}

/* Under e->lock. Compared in constant time: on the /contexts routes the id is the
 * credential, and this runs before anything else has authenticated the request. */
struct e2b_box *e2b_box_find(struct e2b *e, const char *id)
{
    for (struct e2b_box *b = e->boxes; b && id; b = b->next)
        if (token_equal(id, b->id))
            return b;
    return NULL;
}

void e2b_box_forget(struct e2b *e, const char *id)
{
    pthread_mutex_lock(&e->lock);
    for (struct e2b_box **p = &e->boxes; *p; p = &(*p)->next) {
        if (!strcmp((*p)->id, id)) {
            struct e2b_box *b = *p;
            *p = b->next;
            box_free(b);
            break;
        }
    }
    pthread_mutex_unlock(&e->lock);
}

void e2b_box_add(struct request *rq, struct e2b_box *b)
{
    struct e2b *e = rq->srv->e2b;
    pthread_mutex_lock(&e->lock);
    b->next = e->boxes;
    e->boxes = b;
    pthread_mutex_unlock(&e->lock);
}

void e2b_session_gone(void *ctx, const char *id)
{
    e2b_box_forget(ctx, id);
}

/* ---- replies in E2B's shapes ---- */

static json_t *e2b_error_body(const struct request *rq, unsigned status, const char *msg, size_t n);

/* The control plane's and envd's error: {"code": STATUS, "message": ...}. */
char *e2b_vmessage(const char *fmt, va_list ap, size_t *ret_n)
{
    char msg[2048];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    return utf8_sanitize(msg, strlen(msg), ret_n);
}

enum MHD_Result e2b_error(struct request *rq, unsigned status, const char *fmt, ...)
{
    size_t n;
    va_list ap;
    va_start(ap, fmt);
    char *clean = e2b_vmessage(fmt, ap, &n);
    va_end(ap);
    json_t *j = e2b_error_body(rq, status, clean, n); /* Connect's shape on its routes */
    free(clean);
    if (connect_streaming(rq)) {
        /* a streaming call's error is its end of stream, with the code it would have had */
        enum MHD_Result r =
            reply_connect_end_error(rq, json_string_value(json_object_get(j, "code")),
                                    json_string_value(json_object_get(j, "message")),
                                    json_string_length(json_object_get(j, "message")));
        json_decref(j);
        return r;
    }
    return reply_json(rq, status, j);
}

unsigned e2b_status_of(int err)
{
    static const unsigned status[] = {
        [AE_BAD_REQUEST] = 400,    [AE_BAD_PATH] = 400,  [AE_UNAUTHORIZED] = 401,
        [AE_NOT_FOUND] = 404,      [AE_EXPIRED] = 404,   [AE_METHOD] = 405,
        [AE_BUSY] = 409,           [AE_TOO_LARGE] = 413, [AE_LIMIT] = 429,
        [AE_INTERNAL] = 500,       [AE_SANDBOX] = 503,   [AE_SHUTTING_DOWN] = 503,
        [AE_NOT_CONFIGURED] = 503,
    };
    return status[api_err_of(err)];
}

enum MHD_Result e2b_reply_empty(struct request *rq, unsigned status)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    return reply_response(rq, status, r);
}

/* The body as an object, or NULL after a 400 in E2B's shape. */
json_t *e2b_body(struct request *rq)
{
    if (!rq->body.len)
        return json_object();
    json_error_t jerr;
    json_t *j = json_loadb(rq->body.data, rq->body.len, JSON_REJECT_DUPLICATES, &jerr);
    if (!j) {
        e2b_error(rq, 400, "the request body is not valid JSON: %s (line %d, column %d)", jerr.text,
                  jerr.line, jerr.column);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        e2b_error(rq, 400, "the request body must be a JSON object");
        return NULL;
    }
    return j;
}

const char *e2b_header(struct request *rq, const char *name)
{
    return MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, name);
}

/* ---- authentication ---- */

/* The API key is runcell's token, as is or as "e2b_" and the token: E2B's Python SDK
 * checks that a key is "e2b_" and hex before it sends it (runcell's generated tokens are
 * hex), so docs/E2B.md has E2B_API_KEY=e2b_$(cat DATA/token). Either form is compared whole
 * with the token; nothing shorter or longer passes. */
static bool api_key_ok(struct request *rq)
{
    const char *key = e2b_header(rq, "X-API-KEY");
    const char *auth = e2b_header(rq, "Authorization");
    if (key) {
        bool prefixed = !strncmp(key, "e2b_", 4) && token_equal(key + 4, rq->srv->token);
        return token_equal(key, rq->srv->token) || prefixed;
    }
    return auth && !strncmp(auth, "Bearer ", 7) && token_equal(auth + 7, rq->srv->token);
}

/* A sandbox that is past the deadline setTimeout gave it is killed when next touched. */
void e2b_expire_if_due(struct request *rq, const char *id)
{
    struct e2b *e = rq->srv->e2b;
    pthread_mutex_lock(&e->lock);
    struct e2b_box *b = e2b_box_find(e, id);
    bool due = b && b->deadline_ms && now_realtime_ms() >= b->deadline_ms;
    bool pause = due && b->auto_pause, keep = due && b->auto_pause_memory;
    if (pause)
        b->deadline_ms = 0; /* paused now: its timeout is spent */
    pthread_mutex_unlock(&e->lock);
    if (pause) { /* autoPause: paused at its timeout, as E2B does, not killed */
        int err;
        struct session *s = session_table_acquire(rq->srv->table, id, &err);
        json_t *report = NULL;
        /* A request never waits here for a running cell (a pause would wait for it, up to
         * its timeout): the pause is tried again when the sandbox is next touched, as it is
         * after a pause that failed. */
        bool paused = s && (session_pause_state(s) != PAUSE_NONE ||
                            (!session_active(s) && session_pause(s, keep, &report) == 0));
        if (s && !paused) {
            log_info("msg=\"sandbox not paused at its timeout yet\" sandbox=%s error=%s", id,
                     log_quote(session_active(s) ? "a cell runs" : err_msg()));
            pthread_mutex_lock(&e->lock);
            if ((b = e2b_box_find(e, id)) && !b->deadline_ms)
                b->deadline_ms = now_realtime_ms();
            pthread_mutex_unlock(&e->lock);
        }
        json_decref(report);
        if (s)
            session_table_put(rq->srv->table, s);
    } else if (due) {
        session_table_close(rq->srv->table, id, false, NULL);
        e2b_box_forget(e, id);
    }
}

/* The user a sandbox call names (E2B's `user` option: Authorization: Basic, or the files
 * route's username query): runcell's sandbox has one, E2B's "user" (uid 1000), and refuses
 * the others by name, root first, rather than running as someone else than asked. False
 * after replying. */
static bool user_ok(struct request *rq)
{
    char user[64];
    const char *query = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "username");
    int r = e2b_basic_user(e2b_header(rq, "Authorization"), user, sizeof(user));
    if (r == -ENOENT && query)
        r = snprintf(user, sizeof(user), "%s", query) < (int)sizeof(user) ? 0 : -EINVAL;
    if (r == -ENOENT || (r == 0 && (!*user || !strcmp(user, "user"))))
        return true;
    if (r < 0) {
        e2b_error(rq, 400,
                  "the Authorization header is not Basic base64(user:), as E2B's SDK "
                  "sends a user");
        return false;
    }
    if (!strcmp(user, "root")) {
        e2b_error(rq, 400,
                  "user 'root' is not available: everything in runcell's sandbox runs as its one "
                  "user, 'user' (uid 1000), without privileges; its system directories are "
                  "read-only, so install into the home instead (pip install --user, npm install "
                  "in /home/user), and leave the user option unset");
        return false;
    }
    e2b_error(rq, 400,
              "user '%.40s' does not exist in runcell's sandbox: it has one user, 'user' (uid "
              "1000); leave the user option unset",
              user);
    return false;
}

const char *e2b_box_id(struct request *rq)
{
    return rq->session_id ? rq->session_id : "";
}

/* E2B's signature of a file URL (the SDKs' getSignature): "v1_" and the unpadded base64 of
 * SHA-256("path:operation:user:token[:expiration]"), into out. */
static void file_signature(const char *path, const char *op, const char *user, const char *token,
                           const char *expiration, char out[64])
{
    _cleanup_free_ char *raw = xasprintf("%s:%s:%s:%s%s%s", path, op, user, token,
                                         expiration ? ":" : "", expiration ? expiration : "");
    char hex[SHA256_HEX_SIZE];
    unsigned char digest[32];
    sha256_hex(raw, strlen(raw), hex);
    for (int i = 0; i < 32; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        digest[i] = (unsigned char)v;
    }
    explicit_bzero(raw, strlen(raw));
    size_t n;
    _cleanup_free_ char *b64 = base64_encode(digest, sizeof(digest), &n);
    while (n && b64[n - 1] == '=')
        b64[--n] = '\0';
    snprintf(out, 64, "v1_%s", b64);
}

/* A signed URL (downloadUrl, uploadUrl): its signature names the sandbox whose access token
 * made it (the one id says, else any: each is tried, in constant time), for this path,
 * operation (GET read, POST write) and user, until its expiration. False after replying. */
static bool signed_url_ok(struct request *rq, const char *id)
{
    const char *q[4] = {"signature", "path", "username", "signature_expiration"};
    const char *v[4];
    for (int i = 0; i < 4; i++)
        v[i] = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, q[i]);
    const char *op = !strcmp(rq->method, "POST") ? "write" : "read";
    uint64_t exp = 0;
    if (v[3] && (parse_u64(v[3], &exp) < 0 || exp * 1000 < now_realtime_ms())) {
        e2b_error(rq, 401, "the signed URL expired (signature_expiration %s); make a new one",
                  v[3]);
        return false;
    }
    struct e2b *e = rq->srv->e2b;
    char *found = NULL;
    pthread_mutex_lock(&e->lock);
    for (struct e2b_box *b = e->boxes; b && !found; b = b->next) {
        char want[64];
        if (id && !token_equal(id, b->id))
            continue;
        file_signature(v[1] ? v[1] : "", op, v[2] ? v[2] : "", b->token, v[3], want);
        if (token_equal(want, v[0]))
            found = xstrdup(b->id);
    }
    pthread_mutex_unlock(&e->lock);
    if (!found) {
        e2b_error(rq, 401,
                  "the URL's signature is not one a sandbox here made for %s of '%.200s' "
                  "(the sandbox may be gone, or the URL changed)",
                  op, v[1] ? v[1] : "");
        return false;
    }
    free(rq->session_id);
    rq->session_id = found;
    e2b_expire_if_due(rq, found);
    return user_ok(rq);
}

static bool e2b_authorize(struct request *rq)
{
    struct e2b *e = rq->srv->e2b;
    unsigned flags = rq->route->flags;
    if (flags & ROUTE_E2B_PREVIEW) {
        /* Knowing a live sandbox's id is the credential here, as on E2B's hosts (a fleet
         * forwards the request to the sandbox's node before this: e2b_pinned_id). */
        const char *id = rq->params[0];
        e2b_expire_if_due(rq, id);
        pthread_mutex_lock(&e->lock);
        bool known = e2b_box_find(e, id) != NULL;
        pthread_mutex_unlock(&e->lock);
        if (!known)
            e2b_error(rq, 502,
                      "sandbox %s is not running on this server (killed, expired, or never "
                      "created)",
                      id);
        return known;
    }
    if (flags & ROUTE_E2B_API) {
        if (api_key_ok(rq))
            return true;
        e2b_error(rq, 401,
                  "%s; set E2B_API_KEY to e2b_ and runcell's API token (E2B_API_KEY=e2b_$(cat "
                  "DATA/token), DATA being the server's data directory)",
                  e2b_header(rq, "X-API-KEY") ? "wrong API key" : "no API key");
        return false;
    }
    const char *id = e2b_header(rq, "E2b-Sandbox-Id");
    const char *tok = e2b_header(rq, "X-Access-Token");
    const char *host = e2b_header(rq, "Host");
    const char *sig = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "signature");
    char host_id[128];
    unsigned port;
    /* Without the header, the host names it (49983-ID.DOMAIN, as the SDKs reach envd when
     * E2B_SANDBOX_URL is not set), or a signed URL's signature does (downloadUrl). */
    if (!id && host && rq->srv->cfg->e2b_domain &&
        e2b_host_parse(host, rq->srv->cfg->e2b_domain, &port, host_id, sizeof(host_id)))
        id = host_id;
    if (!tok && sig && !strcmp(rq->route->pattern, "/files"))
        return signed_url_ok(rq, id);
    if (!id) {
        e2b_error(rq, 400,
                  "no E2b-Sandbox-Id header: set E2B_SANDBOX_URL to this server so "
                  "that E2B's SDK names the sandbox in every request");
        return false;
    }
    free(rq->session_id);
    rq->session_id = xstrdup(id);
    bool known, ok;
    for (int pass = 0; pass < 2; pass++) {
        pthread_mutex_lock(&e->lock);
        struct e2b_box *b = e2b_box_find(e, id);
        known = b != NULL;
        ok = b && ((tok && token_equal(tok, b->token)) || (!tok && (flags & ROUTE_E2B_BOX_ID)));
        pthread_mutex_unlock(&e->lock);
        /* A deadline is applied for a request that may touch the sandbox only, then the
         * sandbox is looked for again (gone, if it was killed at its timeout). */
        if (pass || !known || !ok)
            break;
        e2b_expire_if_due(rq, id);
    }
    if (!known) {
        /* E2B's edge answers 502 for a sandbox that is not running: the SDK reads it as
         * "not running" (isRunning false, TimeoutError on a call). */
        e2b_error(rq, 502,
                  "sandbox %s is not running on this server (killed, expired, or "
                  "never created)",
                  id);
        return false;
    }
    if (!ok) {
        e2b_error(rq, 401, "%s access token for sandbox %s", tok ? "wrong" : "no", id);
        return false;
    }
    return user_ok(rq);
}

/* The session of the request's sandbox (a reference), or NULL after replying 502. */
struct session *e2b_box_session(struct request *rq, const char *id)
{
    int err;
    struct session *s = session_table_acquire(rq->srv->table, id, &err);
    if (s)
        return s;
    e2b_box_forget(rq->srv->e2b, id);
    e2b_error(rq, 502, "sandbox %s is not running any more (%s)", id,
              err == -ETIME ? "it expired after its timeout without use" : "it was closed");
    return NULL;
}

/* ---- Connect RPC (JSON codec) ---- */

static const struct {
    const char *code;
    unsigned status;
} connect_codes[] = {
    {"invalid_argument", 400},    {"not_found", 404},       {"already_exists", 409},
    {"failed_precondition", 400}, {"unimplemented", 501},   {"internal", 500},
    {"unavailable", 503},         {"unauthenticated", 401}, {"resource_exhausted", 429},
};

static json_t *e2b_error_body(const struct request *rq, unsigned status, const char *msg, size_t n)
{
    const char *p = rq->route->pattern;
    if (!str_has_prefix(p, "/process.Process/") && !str_has_prefix(p, "/filesystem.Filesystem/"))
        return json_pack("{s:i,s:s%}", "code", (int)status, "message", msg, n);
    const char *code = status == 413   ? "resource_exhausted"
                       : status == 405 ? "unimplemented"
                       : status >= 500 ? "unavailable"
                                       : "internal";
    for (size_t i = 0; i < ARRAY_SIZE(connect_codes); i++)
        if (connect_codes[i].status == status) {
            code = connect_codes[i].code;
            break;
        }
    return json_pack("{s:s,s:s%}", "code", code, "message", msg, n);
}

enum MHD_Result e2b_connect_error(struct request *rq, const char *code, const char *fmt, ...)
{
    size_t n;
    va_list ap;
    va_start(ap, fmt);
    char *clean = e2b_vmessage(fmt, ap, &n);
    va_end(ap);
    unsigned status = 500;
    for (size_t i = 0; i < ARRAY_SIZE(connect_codes); i++)
        if (!strcmp(connect_codes[i].code, code))
            status = connect_codes[i].status;
    if (connect_streaming(rq)) {
        enum MHD_Result r = reply_connect_end_error(rq, code, clean, n);
        free(clean);
        return r;
    }
    json_t *j = json_pack("{s:s,s:s%}", "code", code, "message", clean, n);
    free(clean);
    return reply_json(rq, status, j);
}

/* Connect's code for -errno err: the one table's (reply.c). */
const char *e2b_errno_code(int err)
{
    return api_err_info(api_err_of(err))->connect;
}

static const struct route e2b_routes[] = {
    /* the control plane (E2B_API_URL) */
    {"POST", "/sandboxes", h_e2b_create, ROUTE_E2B_API, NULL},
    {"POST", "/v2/sandboxes", h_e2b_create, ROUTE_E2B_API, NULL},
    {"GET", "/sandboxes", h_e2b_list, ROUTE_E2B_API, NULL},
    {"GET", "/v2/sandboxes", h_e2b_list, ROUTE_E2B_API, NULL},
    {"GET", "/sandboxes/{id}", h_e2b_get, ROUTE_E2B_API, NULL},
    {"DELETE", "/sandboxes/{id}", h_e2b_kill, ROUTE_E2B_API, NULL},
    {"POST", "/sandboxes/{id}/timeout", h_e2b_timeout, ROUTE_E2B_API, NULL},
    {"GET", "/sandboxes/{id}/metrics", h_e2b_metrics, ROUTE_E2B_API, NULL},
    {"PUT", "/sandboxes/{id}/network", h_e2b_network, ROUTE_E2B_API, NULL},
    {"POST", "/sandboxes/{id}/connect", h_e2b_connect, ROUTE_E2B_API, NULL},
    {"POST", "/v2/sandboxes/{id}/connect", h_e2b_connect, ROUTE_E2B_API, NULL},
    {"POST", "/sandboxes/{id}/pause", h_e2b_pause, ROUTE_E2B_API, NULL},
    {"POST", "/sandboxes/{id}/resume", h_e2b_resume, ROUTE_E2B_API, NULL},
    {"POST", "/sandboxes/{id}/fork", h_e2b_fork, ROUTE_E2B_API, NULL},
    {"POST", "/sandboxes/{id}/snapshots", h_e2b_snapshot_create, ROUTE_E2B_API, NULL},
    {"GET", "/snapshots", h_e2b_snapshot_list, ROUTE_E2B_API, NULL},
    {"GET", "/sandboxes/{id}/logs", h_e2b_refused, ROUTE_E2B_API, NULL},
    {"GET", "/v2/sandboxes/{id}/logs", h_e2b_refused, ROUTE_E2B_API, NULL},
/* E2B's other objects (templates, volumes, secrets): refused by name, saying what to do */
#define UNSUPPORTED(method, pattern)                                                               \
    {                                                                                              \
        method, pattern, h_e2b_unsupported, ROUTE_E2B_API, NULL                                    \
    }
    UNSUPPORTED("GET", "/templates"),
    UNSUPPORTED("POST", "/templates"),
    UNSUPPORTED("GET", "/templates/{path}"),
    UNSUPPORTED("POST", "/templates/{path}"),
    UNSUPPORTED("PATCH", "/templates/{path}"),
    {"DELETE", "/templates/{path}", h_e2b_template_delete, ROUTE_E2B_API, NULL},
    UNSUPPORTED("POST", "/v2/templates"),
    UNSUPPORTED("POST", "/v2/templates/{path}"),
    UNSUPPORTED("PATCH", "/v2/templates/{path}"),
    UNSUPPORTED("POST", "/v3/templates"),
    UNSUPPORTED("GET", "/volumes"),
    UNSUPPORTED("POST", "/volumes"),
    UNSUPPORTED("GET", "/volumes/{path}"),
    UNSUPPORTED("DELETE", "/volumes/{path}"),
    UNSUPPORTED("GET", "/volumecontent/{path}"),
    UNSUPPORTED("POST", "/volumecontent/{path}"),
    UNSUPPORTED("PUT", "/volumecontent/{path}"),
    UNSUPPORTED("PATCH", "/volumecontent/{path}"),
    UNSUPPORTED("DELETE", "/volumecontent/{path}"),
    UNSUPPORTED("GET", "/secrets"),
    UNSUPPORTED("POST", "/secrets"),
    UNSUPPORTED("GET", "/secrets/{path}"),
    UNSUPPORTED("POST", "/secrets/{path}"),
    UNSUPPORTED("DELETE", "/secrets/{path}"),
#undef UNSUPPORTED
    /* a sandbox's ports (E2B_SANDBOX_URL): envd and the code interpreter */
    {"GET", "/health", h_e2b_health, ROUTE_E2B_BOX, NULL},
    {"POST", "/execute", h_e2b_execute, ROUTE_E2B_BOX | ROUTE_EXECUTES, NULL},
    {"GET", "/contexts", h_e2b_contexts_list, ROUTE_E2B_BOX_ID, NULL},
    {"POST", "/contexts", h_e2b_context_create, ROUTE_E2B_BOX_ID, NULL},
    {"DELETE", "/contexts/{id}", h_e2b_context_delete, ROUTE_E2B_BOX_ID, NULL},
    {"POST", "/contexts/{id}/restart", h_e2b_context_restart, ROUTE_E2B_BOX_ID, NULL},
    {"GET", "/files", h_e2b_files_get, ROUTE_E2B_BOX, NULL},
    {"POST", "/files", h_e2b_files_post, ROUTE_E2B_BOX, NULL},
    {"POST", "/process.Process/{id}", h_e2b_process_rpc, ROUTE_E2B_BOX | ROUTE_CONNECT, NULL},
    {"POST", "/filesystem.Filesystem/{id}", h_e2b_filesystem_rpc, ROUTE_E2B_BOX | ROUTE_CONNECT,
     NULL},
};

static bool e2b_enabled(const struct server *srv)
{
    return srv->e2b != NULL;
}

/* A sandbox lives on the node its id names: the control plane names it in the path (runcell's
 * token, which any node checks), a sandbox's own routes in E2b-Sandbox-Id (with its access
 * token, which only its node holds). */
static const char *e2b_pinned_id(struct request *rq, bool *ret_before_auth)
{
    unsigned flags = rq->route->flags;
    if (flags & ROUTE_E2B_API)
        return rq->params[0];
    *ret_before_auth = true;
    if (flags & ROUTE_E2B_PREVIEW) /* PORT-ID.DOMAIN (e2b_host_route) */
        return rq->params[0];
    const char *id = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "E2b-Sandbox-Id");
    const char *host = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Host");
    char host_id[128];
    unsigned port;
    /* envd's and the interpreter's own hosts name it too (49983-ID.DOMAIN) */
    if (!id && host && rq->srv->cfg->e2b_domain &&
        e2b_host_parse(host, rq->srv->cfg->e2b_domain, &port, host_id, sizeof(host_id))) {
        free(rq->session_id);
        rq->session_id = xstrdup(host_id);
        id = rq->session_id;
    }
    return id; /* a signed URL's sandbox is found by its signature, on the node it reaches */
}

const struct surface e2b_surface = {.name = "e2b",
                                    .routes = e2b_routes,
                                    .n_routes = ARRAY_SIZE(e2b_routes),
                                    .shape = SHAPE_E2B,
                                    .authorize = e2b_authorize,
                                    .enabled = e2b_enabled,
                                    .host_route = e2b_host_route,
                                    .pinned_id = e2b_pinned_id};
