/* routes_e2b.c - E2B's wire protocol over runcell's sessions (`runcell serve --e2b`).
 *
 * An E2B sandbox is a runcell session. The control plane (E2B_API_URL) creates, lists,
 * times out and kills them; the sandbox's ports (E2B_SANDBOX_URL, one URL for every
 * sandbox: the E2b-Sandbox-Id and E2b-Sandbox-Port headers say which) are the code
 * interpreter (/execute NDJSON, /contexts) and envd (/health, /files, and the process and
 * filesystem services over Connect RPC with the JSON codec). What cannot map onto runcell
 * is refused in E2B's error shape {code, message}, naming the field. docs/E2B.md has the
 * table. */
#include "api/api-int.h"
#include "api/e2b.h"

#include <dirent.h>
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* What the SDK is told envd is: 0.4.0 and later need no user name on requests; below 0.5.7
 * file uploads are multipart (never gzip), below 0.5.2 the SDK itself refuses closeStdin. */
#define E2B_ENVD_VERSION      "0.4.0"
#define E2B_DEFAULT_TIMEOUT_S 300
#define E2B_HOME              "/home/user" /* E2B's working directory: runcell's /workspace */
#define E2B_MAX_CONTEXTS      32
#define E2B_MAX_LISTDIR       20000 /* entries of one ListDir reply */
#define E2B_KEEPALIVE_MS      30000 /* a quiet stream sends a keepalive this often */

static const char *const e2b_templates[] = {"code-interpreter-v1", "code-interpreter", "base"};

struct e2b_box {
    char *id;
    char *token; /* envd access token: the sandbox routes' credential */
    char *template_id;
    json_t *metadata;     /* object of strings */
    json_t *contexts;     /* [{id, language, cwd}], the default python context first */
    uint64_t started_ms;  /* realtime */
    uint64_t deadline_ms; /* realtime; 0: only the session's idle expiry */
    unsigned next_pid;
    unsigned running_pid; /* the command running now (0: none) */
    json_t *running_cfg;  /* its ProcessConfig */
    int signalled;        /* the signal SendSignal stopped it with (0: none) */
    struct e2b_box *next;
};

struct e2b {
    pthread_mutex_t lock;
    struct e2b_box *boxes;
};

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
    json_decref(b->running_cfg);
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
static struct e2b_box *box_find(struct e2b *e, const char *id)
{
    for (struct e2b_box *b = e->boxes; b && id; b = b->next)
        if (token_equal(id, b->id))
            return b;
    return NULL;
}

static void box_forget(struct e2b *e, const char *id)
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

/* ---- replies in E2B's shapes ---- */

/* The control plane's and envd's error: {"code": STATUS, "message": ...}. */
static enum MHD_Result e2b_error(struct request *rq, unsigned status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static enum MHD_Result e2b_error(struct request *rq, unsigned status, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    size_t n;
    char *clean = utf8_sanitize(msg, strlen(msg), &n);
    json_t *j = e2b_error_body(rq, status, clean, n); /* Connect's shape on its routes */
    free(clean);
    return reply_json(rq, status, j);
}

static unsigned e2b_status_of(int err)
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

static enum MHD_Result reply_empty(struct request *rq, unsigned status)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    return reply_response(rq, status, r);
}

/* The body as an object, or NULL after a 400 in E2B's shape. */
static json_t *e2b_body(struct request *rq)
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

static const char *header(struct request *rq, const char *name)
{
    return MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, name);
}

/* ---- authentication ---- */

static bool api_key_ok(struct request *rq)
{
    const char *key = header(rq, "X-API-KEY");
    const char *auth = header(rq, "Authorization");
    if (key)
        return token_equal(key, rq->srv->token);
    return auth && !strncmp(auth, "Bearer ", 7) && token_equal(auth + 7, rq->srv->token);
}

/* A sandbox that is past the deadline setTimeout gave it is killed when next touched. */
static void expire_if_due(struct request *rq, const char *id)
{
    struct e2b *e = rq->srv->e2b;
    pthread_mutex_lock(&e->lock);
    struct e2b_box *b = box_find(e, id);
    bool due = b && b->deadline_ms && now_realtime_ms() >= b->deadline_ms;
    pthread_mutex_unlock(&e->lock);
    if (due) {
        session_table_close(rq->srv->table, id, false, NULL);
        box_forget(e, id);
    }
}

bool e2b_authorize(struct request *rq)
{
    struct e2b *e = rq->srv->e2b;
    unsigned flags = rq->route->flags;
    if (flags & ROUTE_E2B_API) {
        if (api_key_ok(rq))
            return true;
        e2b_error(rq, 401,
                  "%s; set E2B_API_KEY to runcell's API token (the file 'token' in "
                  "the server's data directory)",
                  header(rq, "X-API-KEY") ? "wrong API key" : "no API key");
        return false;
    }
    const char *id = header(rq, "E2b-Sandbox-Id");
    const char *tok = header(rq, "X-Access-Token");
    if (!id) {
        e2b_error(rq, 400,
                  "no E2b-Sandbox-Id header: set E2B_SANDBOX_URL to this server so "
                  "that E2B's SDK names the sandbox in every request");
        return false;
    }
    free(rq->session_id);
    rq->session_id = xstrdup(id);
    expire_if_due(rq, id);
    pthread_mutex_lock(&e->lock);
    struct e2b_box *b = box_find(e, id);
    bool known = b != NULL;
    bool ok = b && ((tok && token_equal(tok, b->token)) || (!tok && (flags & ROUTE_E2B_BOX_ID)));
    pthread_mutex_unlock(&e->lock);
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
    return true;
}

/* The session of the request's sandbox (a reference), or NULL after replying 502. */
static struct session *box_session(struct request *rq, const char *id)
{
    int err;
    struct session *s = session_table_acquire(rq->srv->table, id, &err);
    if (s)
        return s;
    box_forget(rq->srv->e2b, id);
    e2b_error(rq, 502, "sandbox %s is not running any more (%s)", id,
              err == -ETIME ? "it expired after its timeout without use" : "it was closed");
    return NULL;
}

/* ---- control plane ---- */

static json_t *box_json(const struct e2b_box *b, struct session *s, bool with_token)
{
    char started[32], end[32];
    const struct session_opts *o = session_options(s);
    uint64_t mono_now = now_ms(), real_now = now_realtime_ms();
    uint64_t last_used = real_now - (mono_now - session_last_used_ms(s));
    uint64_t end_ms = last_used + o->idle_timeout_ms;
    if (b->deadline_ms && b->deadline_ms < end_ms)
        end_ms = b->deadline_ms;
    format_time_iso(b->started_ms, started);
    format_time_iso(end_ms, end);
    const struct net_policy *np = session_net_policy(s);
    json_t *j = json_pack("{s:s,s:s,s:s,s:s,s:O,s:s,s:s,s:s,s:I,s:I,s:I,s:b}", "sandboxID", b->id,
                          "templateID", b->template_id, "clientID", "runcell", "envdVersion",
                          E2B_ENVD_VERSION, "metadata", b->metadata, "startedAt", started, "endAt",
                          end, "state", "running", "cpuCount",
                          (json_int_t)((o->limits.cpus_milli ? o->limits.cpus_milli : 1000) / 1000),
                          "memoryMB", (json_int_t)o->limits.memory_mb, "diskSizeMB",
                          (json_int_t)o->limits.disk_mb, "allowInternetAccess", false);
    if (np && np->n) {
        json_t *pj = net_policy_json(np), *allow = json_object_get(pj, "allow");
        json_object_set_new(j, "network",
                            allow ? json_pack("{s:O}", "allowOut", allow)
                                  : json_pack("{s:[]}", "allowOut"));
        json_decref(pj);
    }
    if (with_token)
        json_object_set_new(j, "envdAccessToken", json_string(b->token));
    return j;
}

static bool strings_object(struct request *rq, json_t *v, const char *field)
{
    const char *k;
    json_t *x;
    if (!v || json_is_null(v))
        return true;
    if (!json_is_object(v)) {
        e2b_error(rq, 400, "field '%s' must be an object of strings", field);
        return false;
    }
    json_object_foreach(v, k, x)
    {
        if (!json_is_string(x)) {
            e2b_error(rq, 400, "field '%s': the value of '%s' must be a string", field, k);
            return false;
        }
    }
    return true;
}

static bool env_name_ok(const char *k)
{
    if (!*k || (*k >= '0' && *k <= '9'))
        return false;
    for (const char *p = k; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '_'))
            return false;
    return true;
}

/* E2B's network options onto runcell's allowlist: allowOut hosts only. */
static bool e2b_network(struct request *rq, json_t *body, struct session_opts *o)
{
    json_t *inet = json_object_get(body, "allow_internet_access");
    if (json_is_true(inet)) {
        e2b_error(rq, 400,
                  "field 'allow_internet_access': runcell gives no sandbox the whole "
                  "internet; name the hosts with network.allowOut (e.g. [\"pypi.org\"]), or "
                  "leave it false");
        return false;
    }
    json_t *net = json_object_get(body, "network");
    if (!net || json_is_null(net))
        return true;
    if (!json_is_object(net)) {
        e2b_error(rq, 400, "field 'network' must be an object");
        return false;
    }
    const char *k;
    json_t *v;
    json_object_foreach(net, k, v)
    {
        if (strcmp(k, "allowOut") && !json_is_null(v)) {
            e2b_error(rq, 400,
                      "field 'network.%s' is not supported by runcell; only "
                      "network.allowOut (hosts, *.domains, host:port) maps onto its egress "
                      "allowlist",
                      k);
            return false;
        }
    }
    json_t *allow = json_object_get(net, "allowOut");
    if (!allow || json_is_null(allow) || !json_array_size(allow))
        return true;
    if (!json_is_array(allow) || json_array_size(allow) > 1000) {
        e2b_error(rq, 400, "field 'network.allowOut' must be an array of at most 1000 hosts");
        return false;
    }
    size_t n = json_array_size(allow);
    const char **entries = xcalloc(n, sizeof(*entries));
    for (size_t i = 0; i < n; i++) {
        entries[i] = json_string_value(json_array_get(allow, i));
        if (!entries[i]) {
            free(entries);
            e2b_error(rq, 400, "field 'network.allowOut': entry %zu is not a string", i);
            return false;
        }
    }
    int r = net_policy_parse(entries, n, &rq->net);
    free(entries);
    if (r < 0) {
        e2b_error(rq, 400, "field 'network.allowOut': %s", err_msg());
        return false;
    }
    const struct net_policy *max = rq->srv->cfg->net_allow_max;
    if (max && !net_policy_within(rq->net, max)) {
        e2b_error(rq, 400,
                  "field 'network.allowOut' names hosts this server does not allow "
                  "(see runcell serve --net-allow-max)");
        return false;
    }
    o->net.policy = rq->net;
    return true;
}

/* Fields of a create body that runcell takes, and those it must refuse when they ask for
 * something (null, false and empty mean "not asked"). */
static const char *const create_known[] = {
    "templateID", "timeout", "metadata", "envVars", "secure", "allow_internet_access", "network"};
static const char *const create_refused[] = {
    "mcp", "iam", "autoPause", "autoPauseMemory", "autoResume", "volumeMounts", "alias"};

static bool asks_for(json_t *v)
{
    if (!v || json_is_null(v) || json_is_false(v))
        return false;
    if (json_is_object(v))
        return json_object_size(v) > 0;
    if (json_is_array(v))
        return json_array_size(v) > 0;
    return true;
}

static bool check_create_fields(struct request *rq, json_t *body)
{
    const char *k;
    json_t *v;
    json_object_foreach(body, k, v)
    {
        bool known = false;
        for (size_t i = 0; i < ARRAY_SIZE(create_known) && !known; i++)
            known = !strcmp(k, create_known[i]);
        for (size_t i = 0; i < ARRAY_SIZE(create_refused) && !known; i++) {
            if (!strcmp(k, create_refused[i])) {
                if (asks_for(v)) {
                    e2b_error(rq, 400,
                              "field '%s' is not supported by runcell's E2B "
                              "endpoint (docs/E2B.md lists what is)",
                              k);
                    return false;
                }
                known = true;
            }
        }
        if (!known && asks_for(v)) {
            e2b_error(rq, 400, "unknown field '%s'", k);
            return false;
        }
    }
    return true;
}

/* Makes the sandbox's envVars the kernel's environment (bash cells and commands inherit
 * it): one quiet cell before anything else runs. */
static int apply_env(struct session *s, json_t *env)
{
    if (!env || !json_object_size(env))
        return 0;
    const char *k;
    json_t *v;
    json_object_foreach(env, k, v) if (!env_name_ok(k)) return err_set(
        EINVAL, "field 'envVars': '%s' is not an environment variable name", k);
    char *lit = json_dumps(env, JSON_COMPACT);
    _cleanup_free_ char *code = xasprintf("__import__('os').environ.update(%s)", lit);
    free(lit);
    struct exec_request req = {.code = code, .cancel_fd = -1};
    struct exec_record rec;
    exec_record_init(&rec, 4096);
    int r = session_execute(s, &req, NULL, &rec);
    if (r == 0 && rec.status != EXEC_OK)
        r = err_set(EIO, "could not set envVars in the sandbox");
    exec_record_release(&rec);
    return r;
}

static bool template_known(const char *t)
{
    for (size_t i = 0; i < ARRAY_SIZE(e2b_templates); i++)
        if (!strcmp(t, e2b_templates[i]))
            return true;
    return false;
}

enum MHD_Result h_e2b_create(struct request *rq)
{
    json_t *body = e2b_body(rq);
    struct session_opts o;
    char *id = NULL;
    enum MHD_Result ret = MHD_YES;
    if (!body)
        return MHD_YES;
    o = rq->srv->cfg->defaults;
    if (!check_create_fields(rq, body) || !e2b_network(rq, body, &o))
        goto out;
    json_t *tv = json_object_get(body, "templateID");
    const char *tmpl = json_is_string(tv) ? json_string_value(tv) : "code-interpreter-v1";
    if (tv && !json_is_null(tv) && !json_is_string(tv)) {
        ret = e2b_error(rq, 400, "field 'templateID' must be a string");
        goto out;
    }
    if (!template_known(tmpl)) {
        ret = e2b_error(rq, 400,
                        "field 'templateID': template '%s' is not known here; runcell "
                        "serves one template, Python with the data stack and bash, under the "
                        "names code-interpreter-v1, code-interpreter and base",
                        tmpl);
        goto out;
    }
    json_t *metadata = json_object_get(body, "metadata"), *env = json_object_get(body, "envVars");
    if (!strings_object(rq, metadata, "metadata") || !strings_object(rq, env, "envVars"))
        goto out;
    json_t *tj = json_object_get(body, "timeout");
    json_int_t timeout_s = E2B_DEFAULT_TIMEOUT_S;
    if (tj && !json_is_null(tj)) {
        timeout_s = json_is_integer(tj) ? json_integer_value(tj) : -1;
        /* compared in seconds: in milliseconds a huge one wraps to a tiny one */
        if (timeout_s <= 0 ||
            (uint64_t)timeout_s > rq->srv->cfg->limits.max_idle_timeout_ms / 1000) {
            ret = e2b_error(rq, 400,
                            "field 'timeout' must be a whole number of seconds from 1 "
                            "to %llu",
                            (unsigned long long)(rq->srv->cfg->limits.max_idle_timeout_ms / 1000));
            goto out;
        }
    }
    /* E2B's timeout is runcell's idle expiry: a sandbox left alone that long is reaped. A
     * cell may run as long as the server allows; the client's own timeout interrupts it. */
    o.idle_timeout_ms = (uint64_t)timeout_s * 1000;
    o.timeout_ms = rq->srv->cfg->limits.max_timeout_ms;
    struct session_create create = {.opts = &o, .no_persist = true};
    int r = session_table_create_ex(rq->srv->table, &create, &id, NULL);
    if (r < 0) {
        if (r != -EAGAIN)
            metrics_sandbox_failure(rq->srv->metrics);
        ret = r == -EAGAIN ? e2b_error(rq, 429, "%s", err_msg())
                           : e2b_error(rq, 503, "cannot create the sandbox: %s", err_msg());
        goto out;
    }
    rq->session_id = xstrdup(id);
    int err;
    struct session *s = session_table_acquire(rq->srv->table, id, &err);
    if (!s) {
        ret = e2b_error(rq, 503, "sandbox %s was closed as it was created", id);
        goto out;
    }
    if ((r = apply_env(s, env)) < 0) {
        session_table_put(rq->srv->table, s);
        session_table_close(rq->srv->table, id, false, NULL);
        ret = e2b_error(rq, r == -EINVAL ? 400 : 503, "%s", err_msg());
        goto out;
    }
    struct e2b_box *b = xcalloc(1, sizeof(*b));
    b->id = xstrdup(id);
    b->token = random_hex(16);
    b->template_id = xstrdup(tmpl);
    b->metadata = json_is_object(metadata) ? json_deep_copy(metadata) : json_object();
    b->contexts =
        json_pack("[{s:s,s:s,s:s}]", "id", "default", "language", "python", "cwd", E2B_HOME);
    b->started_ms = now_realtime_ms();
    b->next_pid = 1000;
    json_t *info = box_json(b, s, true);
    session_table_put(rq->srv->table, s);
    struct e2b *e = rq->srv->e2b;
    pthread_mutex_lock(&e->lock);
    b->next = e->boxes;
    e->boxes = b;
    pthread_mutex_unlock(&e->lock);
    ret = reply_json(rq, 201, info);
out:
    free(id);
    json_decref(body);
    return ret;
}

/* The {id} sandbox's description (a 404 in E2B's shape when it is gone). */
static enum MHD_Result reply_box(struct request *rq, unsigned status, bool with_token)
{
    const char *id = rq->params[0];
    expire_if_due(rq, id);
    int err;
    struct session *s = session_table_acquire(rq->srv->table, id, &err);
    struct e2b *e = rq->srv->e2b;
    pthread_mutex_lock(&e->lock);
    struct e2b_box *b = box_find(e, id);
    json_t *j = b && s ? box_json(b, s, with_token) : NULL;
    pthread_mutex_unlock(&e->lock);
    if (s)
        session_table_put(rq->srv->table, s);
    if (!j) {
        if (b)
            box_forget(e, id);
        return e2b_error(rq, 404, "sandbox %s not found", id);
    }
    return reply_json(rq, status, j);
}

enum MHD_Result h_e2b_get(struct request *rq)
{
    return reply_box(rq, 200, false);
}

enum MHD_Result h_e2b_connect(struct request *rq)
{
    json_t *body = e2b_body(rq);
    if (!body)
        return MHD_YES;
    json_decref(body);
    return reply_box(rq, 200, true);
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* Percent-decodes s in place ('+' a space too when form is true). */
static void url_decode(char *s, bool form)
{
    char *o = s;
    for (char *p = s; *p; p++) {
        if (*p == '%' && hex_digit(p[1]) >= 0 && hex_digit(p[2]) >= 0) {
            *o++ = (char)(hex_digit(p[1]) * 16 + hex_digit(p[2]));
            p += 2;
        } else {
            *o++ = form && *p == '+' ? ' ' : *p;
        }
    }
    *o = '\0';
}

/* The list's metadata filter: "k=v&k2=v2" as the SDK sends it (a form of pairs whose keys and
 * values are URI-encoded once more); NULL after replying 400. */
static json_t *metadata_filter(struct request *rq, const char *q)
{
    json_t *want = json_object();
    _cleanup_free_ char *copy = xstrdup(q);
    char *save = NULL;
    for (char *pair = strtok_r(copy, "&", &save); pair; pair = strtok_r(NULL, "&", &save)) {
        char *eq = strchr(pair, '=');
        if (!eq) {
            json_decref(want);
            e2b_error(rq, 400, "query 'metadata': '%.100s' is not key=value", pair);
            return NULL;
        }
        *eq = '\0';
        url_decode(pair, true);
        url_decode(eq + 1, true);
        url_decode(pair, false);
        url_decode(eq + 1, false);
        json_object_set_new(want, pair, json_string(eq + 1));
    }
    return want;
}

static bool box_matches(const struct e2b_box *b, json_t *want, const char *tmpl)
{
    const char *k;
    json_t *v;
    if (tmpl && strcmp(tmpl, b->template_id))
        return false;
    json_object_foreach(want, k, v)
    {
        json_t *have = json_object_get(b->metadata, k);
        if (!have || !json_equal(have, v))
            return false;
    }
    return true;
}

enum MHD_Result h_e2b_list(struct request *rq)
{
    const char *state = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "state");
    const char *meta = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "metadata");
    const char *tmpl = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "template");
    json_t *arr = json_array();
    if (state && !strstr(state, "running"))
        return reply_json(rq, 200, arr); /* runcell keeps no paused sandboxes */
    json_t *want = meta && *meta ? metadata_filter(rq, meta) : json_object();
    if (!want) {
        json_decref(arr);
        return MHD_YES;
    }
    struct e2b *e = rq->srv->e2b;
    _cleanup_strv_ char **ids = NULL;
    pthread_mutex_lock(&e->lock);
    for (struct e2b_box *b = e->boxes; b; b = b->next)
        ids = strv_push(ids, b->id);
    pthread_mutex_unlock(&e->lock);
    for (char **id = ids; id && *id; id++) {
        int err;
        struct session *s = session_table_acquire(rq->srv->table, *id, &err);
        if (!s) {
            box_forget(e, *id);
            continue;
        }
        pthread_mutex_lock(&e->lock);
        struct e2b_box *b = box_find(e, *id);
        if (b && box_matches(b, want, tmpl && *tmpl ? tmpl : NULL))
            json_array_append_new(arr, box_json(b, s, false));
        pthread_mutex_unlock(&e->lock);
        session_table_put(rq->srv->table, s);
    }
    json_decref(want);
    return reply_json(rq, 200, arr);
}

enum MHD_Result h_e2b_kill(struct request *rq)
{
    const char *id = rq->params[0];
    struct e2b *e = rq->srv->e2b;
    pthread_mutex_lock(&e->lock);
    bool known = box_find(e, id) != NULL;
    pthread_mutex_unlock(&e->lock);
    if (!known)
        return e2b_error(rq, 404, "sandbox %s not found", id);
    box_forget(e, id);
    if (session_table_close(rq->srv->table, id, false, NULL) < 0)
        return e2b_error(rq, 404, "sandbox %s not found (it had expired)", id);
    return reply_empty(rq, 204);
}

enum MHD_Result h_e2b_timeout(struct request *rq)
{
    json_t *body = e2b_body(rq);
    if (!body)
        return MHD_YES;
    json_t *t = json_object_get(body, "timeout");
    json_int_t secs = json_is_integer(t) ? json_integer_value(t) : -1;
    json_decref(body);
    if (secs <= 0)
        return e2b_error(rq, 400, "field 'timeout' must be a whole number of seconds above 0");
    const char *id = rq->params[0];
    int err;
    struct session *s = session_table_acquire(rq->srv->table, id, &err);
    struct e2b *e = rq->srv->e2b;
    pthread_mutex_lock(&e->lock);
    struct e2b_box *b = s ? box_find(e, id) : NULL;
    uint64_t idle_ms = s ? session_options(s)->idle_timeout_ms : 0;
    bool longer = (uint64_t)secs > idle_ms / 1000; /* in seconds: ms could wrap */
    if (b && !longer)
        b->deadline_ms = now_realtime_ms() + (uint64_t)secs * 1000;
    else if (b)
        b->deadline_ms = 0;
    pthread_mutex_unlock(&e->lock);
    if (s)
        session_table_put(rq->srv->table, s);
    if (!b)
        return e2b_error(rq, 404, "sandbox %s not found", id);
    if (longer)
        return e2b_error(rq, 400,
                         "field 'timeout': %lld s is longer than the timeout the "
                         "sandbox was created with (%llu s), which runcell keeps as its idle "
                         "expiry; create it with the longer timeout",
                         (long long)secs, (unsigned long long)(idle_ms / 1000));
    return reply_empty(rq, 204);
}

enum MHD_Result h_e2b_refused(struct request *rq)
{
    return e2b_error(rq, 400,
                     "%s %s is not supported by runcell's E2B endpoint (pause, resume, "
                     "snapshots, forks and logs have no runcell counterpart yet; docs/E2B.md)",
                     rq->method, rq->route->pattern);
}

enum MHD_Result h_e2b_health(struct request *rq)
{
    const char *id = header(rq, "E2b-Sandbox-Id");
    struct session *s = box_session(rq, id);
    if (!s)
        return MHD_YES;
    session_table_put(rq->srv->table, s);
    return reply_empty(rq, 204);
}

/* ---- streams: a cell runs on its own thread while the response reads what it made ---- */

enum stream_kind { STREAM_EXECUTE, STREAM_PROCESS };

struct e2b_stream {
    struct server *srv;
    struct session *s;
    enum stream_kind kind;
    struct exec_request req;
    char *code;
    char *box_id;
    unsigned pid;
    bool main_sent, error_sent;
    pthread_t thread;
    struct out_stream os;
};

static void stream_bytes(struct e2b_stream *st, const void *data, size_t n)
{
    out_stream_append(&st->os, data, n);
}

/* One message: an NDJSON line, or a Connect envelope (flags, 4-byte big-endian length). */
static void stream_msg(struct e2b_stream *st, json_t *j, unsigned char flags)
{
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    size_t n = strlen(text);
    struct buf b;
    buf_init(&b, 0);
    if (st->kind == STREAM_PROCESS) {
        unsigned char head[5] = {flags, (unsigned char)(n >> 24), (unsigned char)(n >> 16),
                                 (unsigned char)(n >> 8), (unsigned char)n};
        buf_append(&b, head, 5);
        buf_append(&b, text, n);
    } else {
        buf_append(&b, text, n);
        buf_append(&b, "\n", 1);
    }
    free(text);
    stream_bytes(st, b.data, b.len);
    buf_release(&b);
}

static json_t *timestamp_now(void)
{
    char t[32];
    format_time_iso(now_realtime_ms(), t);
    return json_string(t);
}

/* A runcell MIME bundle as E2B's result: short names for the formats E2B knows, the
 * others kept under their MIME type (the SDK puts them in `extra`). */
static json_t *e2b_result(json_t *bundle, bool main)
{
    static const char *const names[][2] = {
        {"text/plain", "text"},        {"text/html", "html"},
        {"text/markdown", "markdown"}, {"image/svg+xml", "svg"},
        {"image/png", "png"},          {"image/jpeg", "jpeg"},
        {"application/pdf", "pdf"},    {"text/latex", "latex"},
        {"application/json", "json"},  {"application/javascript", "javascript"},
    };
    json_t *j = json_pack("{s:s,s:b}", "type", "result", "is_main_result", main);
    const char *k;
    json_t *v;
    json_object_foreach(bundle, k, v)
    {
        const char *name = k;
        for (size_t i = 0; i < ARRAY_SIZE(names); i++)
            if (!strcmp(k, names[i][0]))
                name = names[i][1];
        json_object_set(j, name, v);
    }
    return j;
}

static bool is_display_only(json_t *bundle)
{
    return json_object_get(bundle, "image/png") || json_object_get(bundle, "image/jpeg") ||
           json_object_get(bundle, "image/svg+xml");
}

static void execute_event(void *ctx, const struct exec_event *ev)
{
    struct e2b_stream *st = ctx;
    switch (ev->type) {
    case EV_STDOUT:
    case EV_STDERR: {
        size_t n;
        char *text = utf8_sanitize(ev->data, ev->len, &n);
        json_t *j = json_pack("{s:s,s:s%,s:o}", "type", ev->type == EV_STDOUT ? "stdout" : "stderr",
                              "text", text, n, "timestamp", timestamp_now());
        free(text);
        stream_msg(st, j, 0);
        break;
    }
    case EV_RESULT: {
        /* runcell does not mark the cell's value: a figure is a display, the first other
         * bundle the value. */
        bool main = !st->main_sent && !is_display_only(ev->json);
        st->main_sent |= main;
        stream_msg(st, e2b_result(ev->json, main), 0);
        break;
    }
    case EV_ERROR: {
        st->error_sent = true;
        json_t *tb = json_object_get(ev->json, "traceback");
        stream_msg(st,
                   json_pack("{s:s,s:O,s:O,s:O}", "type", "error", "name",
                             json_object_get(ev->json, "name"), "value",
                             json_object_get(ev->json, "value"), "traceback",
                             tb ? tb : json_string("")),
                   0);
        break;
    }
    }
}

static void execute_main(struct e2b_stream *st)
{
    struct exec_record rec;
    struct exec_sink sink = {.fn = execute_event, .ctx = st};
    exec_record_init(&rec, session_options(st->s)->output_cap);
    int r = session_execute(st->s, &st->req, &sink, &rec);
    atomic_fetch_sub(&st->srv->executions, 1);
    if (r < 0) {
        stream_msg(st,
                   json_pack("{s:s,s:s,s:s,s:s}", "type", "error", "name", "RuncellError", "value",
                             err_msg(), "traceback", ""),
                   0);
    } else {
        metrics_execution(st->srv->metrics, rec.status, rec.wall_ms / 1000.0);
        if (rec.status != EXEC_OK && !st->error_sent) {
            /* A timeout, a kill, the output limit: runcell's word, as an error. */
            const char *name = exec_status_name(rec.status);
            const char *msg = rec.message ? rec.message : name;
            stream_msg(st,
                       json_pack("{s:s,s:s,s:s,s:s}", "type", "error", "name",
                                 rec.status == EXEC_TIMEOUT ? "TimeoutError" : name, "value", msg,
                                 "traceback", msg),
                       0);
        }
        stream_msg(st,
                   json_pack("{s:s,s:I}", "type", "number_of_executions", "execution_count",
                             (json_int_t)rec.execution_count),
                   0);
    }
    stream_msg(st, json_pack("{s:s}", "type", "end_of_execution"), 0);
    exec_record_release(&rec);
}

static void process_event(void *ctx, const struct exec_event *ev)
{
    struct e2b_stream *st = ctx;
    if (ev->type != EV_STDOUT && ev->type != EV_STDERR)
        return;
    size_t n;
    char *b64 = base64_encode(ev->data, ev->len, &n);
    /* StartResponse {event: ProcessEvent}, ProcessEvent's oneof by its member's name. */
    json_t *j = json_pack("{s:{s:{s:s%}}}", "event", "data",
                          ev->type == EV_STDOUT ? "stdout" : "stderr", b64, n);
    free(b64);
    stream_msg(st, j, 0);
}

/* Sets (or with pid 0 clears) the running command; returns the signal it was stopped with. */
static int box_set_running(struct server *srv, const char *id, unsigned pid, json_t *cfg)
{
    int sig = 0;
    pthread_mutex_lock(&srv->e2b->lock);
    struct e2b_box *b = box_find(srv->e2b, id);
    if (b) {
        sig = b->signalled;
        b->signalled = 0;
        b->running_pid = pid;
        json_decref(b->running_cfg);
        b->running_cfg = cfg ? json_incref(cfg) : NULL;
    }
    pthread_mutex_unlock(&srv->e2b->lock);
    return sig;
}

static void process_main(struct e2b_stream *st)
{
    struct exec_record rec;
    struct exec_sink sink = {.fn = process_event, .ctx = st};
    exec_record_init(&rec, session_options(st->s)->output_cap);
    stream_msg(st, json_pack("{s:{s:{s:i}}}", "event", "start", "pid", (int)st->pid), 0);
    int r = session_execute(st->s, &st->req, &sink, &rec);
    atomic_fetch_sub(&st->srv->executions, 1);
    int sig = box_set_running(st->srv, st->box_id, 0, NULL);
    if (r < 0) {
        stream_msg(st,
                   json_pack("{s:{s:s,s:s}}", "error", "code",
                             r == -EBUSY ? "failed_precondition" : "unavailable", "message",
                             err_msg()),
                   0x02);
    } else {
        metrics_execution(st->srv->metrics, rec.status, rec.wall_ms / 1000.0);
        /* A command stopped by SendSignal ends as a shell says a signalled one did. */
        int code = sig ? 128 + sig : exec_record_exit_status(&rec);
        json_t *end = json_pack("{s:i,s:b,s:s}", "exitCode", code, "exited",
                                !sig && (rec.status == EXEC_OK || rec.status == EXEC_ERROR),
                                "status", sig ? "signal" : exec_status_name(rec.status));
        if (rec.status != EXEC_OK && rec.status != EXEC_ERROR && rec.message)
            json_object_set_new(end, "error", json_string(rec.message));
        stream_msg(st, json_pack("{s:{s:o}}", "event", "end", end), 0);
        stream_msg(st, json_object(), 0x02);
    }
    exec_record_release(&rec);
}

static void *stream_thread(void *arg)
{
    struct e2b_stream *st = arg;
    if (st->kind == STREAM_EXECUTE)
        execute_main(st);
    else
        process_main(st);
    out_stream_finish(&st->os);
    return NULL;
}

static void stream_keepalive(struct out_stream *os)
{
    struct e2b_stream *st = (struct e2b_stream *)((char *)os - offsetof(struct e2b_stream, os));
    if (st->kind == STREAM_EXECUTE)
        stream_msg(st, json_pack("{s:s}", "type", "keepalive"), 0);
    else
        stream_msg(st, json_pack("{s:{s:{}}}", "event", "keepalive"), 0);
}

/* Waits for output, and notices a client that hangs up while the cell is quiet: that
 * interrupts the cell, as E2B's code interpreter does. */
static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max)
{
    (void)pos;
    return out_stream_read(&((struct e2b_stream *)cls)->os, out, max);
}

static void stream_free(void *cls)
{
    struct e2b_stream *st = cls;
    out_stream_end(&st->os);
    pthread_join(st->thread, NULL);
    session_table_put(st->srv->table, st->s);
    out_stream_release(&st->os);
    free(st->code);
    free(st->box_id);
    free(st);
}

/* Starts code (owned now) on s (its reference and the execution slot, owned now) and replies
 * with the stream. */
static enum MHD_Result start_stream(struct request *rq, struct session *s, enum stream_kind kind,
                                    char *code, const char *lang, uint64_t timeout_ms,
                                    const char *box_id, unsigned pid)
{
    struct e2b_stream *st = xcalloc(1, sizeof(*st));
    st->srv = rq->srv;
    st->s = s;
    st->kind = kind;
    st->code = code;
    st->box_id = xstrdup(box_id);
    st->pid = pid;
    st->req = (struct exec_request){.code = code, .lang = lang, .timeout_ms = timeout_ms};
    int e = out_stream_init(&st->os, client_fd(rq), E2B_KEEPALIVE_MS, stream_keepalive);
    st->req.cancel_fd = st->os.cancel[0];
    st->req.cancel_events = POLLIN;
    if (e < 0 || pthread_create(&st->thread, NULL, stream_thread, st)) {
        execution_slot_give(rq);
        session_table_put(rq->srv->table, s);
        out_stream_release(&st->os);
        free(st->code);
        free(st->box_id);
        free(st);
        return MHD_NO;
    }
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024,
                                                               stream_read, st, stream_free);
    MHD_add_response_header(r, "Content-Type",
                            kind == STREAM_EXECUTE ? "application/x-ndjson"
                                                   : "application/connect+json");
    MHD_add_response_header(r, "Cache-Control", "no-store");
    return reply_response(rq, 200, r);
}

/* ---- the code interpreter: /execute and /contexts ---- */

/* Python code that runs src in the namespace of context ctx, a dictionary of its own in
 * the session's kernel (a module, _runcell_e2b, holds them); the value of its last
 * expression is the cell's value. */
static const char ctx_helper[] = "import ast\n"
                                 "spaces = {}\n"
                                 "def run(ctx, src):\n"
                                 "    ns = spaces.setdefault(ctx, {'__name__': '__main__'})\n"
                                 "    tree = ast.parse(src, '<context>')\n"
                                 "    last = None\n"
                                 "    if tree.body and isinstance(tree.body[-1], ast.Expr):\n"
                                 "        last = ast.Expression(tree.body.pop().value)\n"
                                 "    exec(compile(tree, '<context>', 'exec'), ns)\n"
                                 "    if last is not None:\n"
                                 "        return eval(compile(last, '<context>', 'eval'), ns)\n"
                                 "def drop(ctx):\n"
                                 "    spaces.pop(ctx, None)\n";

static char *py_literal(const char *s)
{
    json_t *j = json_string(s);
    char *lit = json_dumps(j, JSON_ENCODE_ANY);
    json_decref(j);
    return lit;
}

/* A cell calling fn ("run" or "drop") of the context helper with its arguments. */
static char *ctx_cell(const char *fn, const char *ctx, const char *src)
{
    _cleanup_free_ char *helper = py_literal(ctx_helper);
    _cleanup_free_ char *c = py_literal(ctx);
    _cleanup_free_ char *code = src ? py_literal(src) : NULL;
    return xasprintf("(lambda m: (m.__dict__.get(%s) or (exec(%s, m.__dict__), "
                     "m.__dict__[%s])[1])(%s%s%s))(__import__('sys').modules.setdefault("
                     "'_runcell_e2b', __import__('types').ModuleType('_runcell_e2b')))",
                     strcmp(fn, "run") ? "'drop'" : "'run'", helper,
                     strcmp(fn, "run") ? "'drop'" : "'run'", c, code ? ", " : "", code ? code : "");
}

/* Where context ctx is in b's list (b may be NULL), or -1; e->lock held. */
static ssize_t box_context_index(struct e2b_box *b, const char *ctx)
{
    size_t i;
    json_t *c;
    json_array_foreach(b ? b->contexts : NULL, i, c)
    {
        if (!strcmp(json_string_value(json_object_get(c, "id")), ctx))
            return (ssize_t)i;
    }
    return -1;
}

/* The language of context ctx in sandbox box, into lang; false when there is no such one. */
static bool context_lang(struct e2b *e, const char *box, const char *ctx, char lang[16])
{
    pthread_mutex_lock(&e->lock);
    struct e2b_box *b = box_find(e, box);
    ssize_t i = box_context_index(b, ctx);
    if (i >= 0)
        snprintf(lang, 16, "%s",
                 json_string_value(json_object_get(json_array_get(b->contexts, i), "language")));
    pthread_mutex_unlock(&e->lock);
    return i >= 0;
}

/* E2B's names for languages that runcell calls otherwise. */
static const struct {
    const char *e2b, *runcell;
} e2b_lang_aliases[] = {{"python3", "python"}, {"sh", "bash"}};

/* E2B's languages onto runcell's (python, bash cells and javascript, the session's Node
 * kernel), as runcell names them (lang_name) or E2B does; NULL for the others. */
static const char *map_language(const char *lang)
{
    for (size_t i = 0; i < ARRAY_SIZE(e2b_lang_aliases); i++)
        if (!strcmp(lang, e2b_lang_aliases[i].e2b))
            return e2b_lang_aliases[i].runcell;
    return lang_name(lang);
}

enum MHD_Result h_e2b_execute(struct request *rq)
{
    const char *box = header(rq, "E2b-Sandbox-Id");
    json_t *body = e2b_body(rq);
    enum MHD_Result ret = MHD_YES;
    if (!body)
        return MHD_YES;
    const char *code = json_string_value(json_object_get(body, "code"));
    const char *ctx = json_string_value(json_object_get(body, "context_id"));
    const char *lang = json_string_value(json_object_get(body, "language"));
    json_t *envs = json_object_get(body, "env_vars");
    char ctx_lang[16] = "python";
    if (!code) {
        ret = e2b_error(rq, 400, "field 'code' is required: the code to run, a string");
        goto out;
    }
    if (asks_for(envs)) {
        ret = e2b_error(rq, 400,
                        "field 'env_vars' (runCode's envs) is not supported per "
                        "execution; give envs to Sandbox.create, or set os.environ in the code");
        goto out;
    }
    if (ctx && !context_lang(rq->srv->e2b, box, ctx, ctx_lang)) {
        ret = e2b_error(rq, 404, "context '%s' not found in sandbox %s", ctx, box);
        goto out;
    }
    if (lang && !ctx) {
        if (!map_language(lang)) {
            ret = e2b_error(rq, 400,
                            "field 'language': '%s' is not supported by runcell yet; "
                            "it runs python, bash and javascript",
                            lang);
            goto out;
        }
        snprintf(ctx_lang, sizeof(ctx_lang), "%s", map_language(lang));
    }
    struct session *s = box_session(rq, box);
    if (!s)
        goto out;
    if (!execution_slot_take(rq)) {
        session_table_put(rq->srv->table, s);
        goto out;
    }
    if (session_busy(s)) {
        execution_slot_give(rq);
        session_table_put(rq->srv->table, s);
        ret = e2b_error(rq, 409,
                        "sandbox %s is running another cell or command; runcell runs "
                        "one at a time per sandbox",
                        box);
        goto out;
    }
    bool own_ns = ctx && strcmp(ctx, "default") && !strcmp(ctx_lang, "python");
    char *cell = own_ns ? ctx_cell("run", ctx, code) : xstrdup(code);
    ret = start_stream(rq, s, STREAM_EXECUTE, cell,
                       map_language(ctx_lang), /* a literal: the stream outlives ctx_lang */
                       rq->srv->cfg->limits.max_timeout_ms, box, 0);
out:
    json_decref(body);
    return ret;
}

static json_t *box_contexts(struct e2b *e, const char *box)
{
    pthread_mutex_lock(&e->lock);
    struct e2b_box *b = box_find(e, box);
    json_t *j = b ? json_deep_copy(b->contexts) : json_array();
    pthread_mutex_unlock(&e->lock);
    return j;
}

enum MHD_Result h_e2b_contexts_list(struct request *rq)
{
    return reply_json(rq, 200, box_contexts(rq->srv->e2b, header(rq, "E2b-Sandbox-Id")));
}

enum MHD_Result h_e2b_context_create(struct request *rq)
{
    const char *box = header(rq, "E2b-Sandbox-Id");
    json_t *body = e2b_body(rq);
    if (!body)
        return MHD_YES;
    const char *lang = json_string_value(json_object_get(body, "language"));
    const char *cwd = json_string_value(json_object_get(body, "cwd"));
    const char *mapped = map_language(lang ? lang : "python");
    _cleanup_free_ char *hex = random_hex(8);
    enum MHD_Result ret;
    if (!mapped) {
        ret = e2b_error(rq, 400,
                        "field 'language': '%s' contexts are not supported by "
                        "runcell yet; it runs python, bash and javascript",
                        lang);
        goto out;
    }
    if (cwd && strcmp(cwd, E2B_HOME) && strcmp(cwd, "/workspace")) {
        ret = e2b_error(rq, 400,
                        "field 'cwd': contexts start in %s (runcell's /workspace); "
                        "change directory in the code instead",
                        E2B_HOME);
        goto out;
    }
    json_t *c = json_pack("{s:s,s:s,s:s}", "id", hex, "language", mapped, "cwd", E2B_HOME);
    struct e2b *e = rq->srv->e2b;
    pthread_mutex_lock(&e->lock);
    struct e2b_box *b = box_find(e, box);
    bool full = b && json_array_size(b->contexts) >= E2B_MAX_CONTEXTS;
    if (b && !full)
        json_array_append(b->contexts, c);
    pthread_mutex_unlock(&e->lock);
    if (full) {
        json_decref(c);
        ret =
            e2b_error(rq, 429, "sandbox %s has its maximum of %d contexts", box, E2B_MAX_CONTEXTS);
        goto out;
    }
    ret = reply_json(rq, 200, c);
out:
    json_decref(body);
    return ret;
}

/* Runs a quiet python cell in the sandbox (a context's namespace dropped). */
static int quiet_cell(struct session *s, const char *code)
{
    struct exec_request req = {.code = code, .cancel_fd = -1};
    struct exec_record rec;
    exec_record_init(&rec, 4096);
    int r = session_execute(s, &req, NULL, &rec);
    exec_record_release(&rec);
    return r;
}

static enum MHD_Result context_change(struct request *rq, bool remove)
{
    const char *box = header(rq, "E2b-Sandbox-Id"), *ctx = rq->params[0];
    char lang[16];
    struct e2b *e = rq->srv->e2b;
    if (!context_lang(e, box, ctx, lang))
        return e2b_error(rq, 404, "context '%s' not found in sandbox %s", ctx, box);
    bool dflt = !strcmp(ctx, "default");
    if (dflt && remove)
        return e2b_error(rq, 400, "the default context cannot be removed; kill the sandbox");
    struct session *s = box_session(rq, box);
    if (!s)
        return MHD_YES;
    int r = 0;
    if (dflt)
        r = session_restart(s); /* a fresh interpreter, same files */
    else if (!strcmp(lang, "python")) {
        _cleanup_free_ char *cell = ctx_cell("drop", ctx, NULL);
        r = quiet_cell(s, cell);
    }
    session_table_put(rq->srv->table, s);
    if (r < 0)
        return e2b_error(rq, e2b_status_of(r), "%s", err_msg());
    if (remove) {
        pthread_mutex_lock(&e->lock);
        struct e2b_box *b = box_find(e, box);
        ssize_t i = box_context_index(b, ctx);
        if (i >= 0)
            json_array_remove(b->contexts, (size_t)i);
        pthread_mutex_unlock(&e->lock);
    }
    return reply_empty(rq, 204);
}

enum MHD_Result h_e2b_context_delete(struct request *rq)
{
    return context_change(rq, true);
}

enum MHD_Result h_e2b_context_restart(struct request *rq)
{
    return context_change(rq, false);
}

/* ---- paths: E2B's /home/user is runcell's /workspace ---- */

/* The workspace-relative path for an E2B path ("" for the workspace itself), or NULL with
 * why in err. */
static char *ws_path(const char *p, char err[512])
{
    static const char *const roots[] = {E2B_HOME, "/workspace"};
    if (!p || !*p) {
        snprintf(err, 512, "no path given");
        return NULL;
    }
    const char *rel = p;
    if (*p == '/') {
        rel = NULL;
        for (size_t i = 0; i < ARRAY_SIZE(roots) && !rel; i++) {
            size_t n = strlen(roots[i]);
            if (!strncmp(p, roots[i], n) && (p[n] == '/' || !p[n]))
                rel = p + n;
        }
        if (!rel) {
            snprintf(err, 512,
                     "'%.180s' is outside %s: only the sandbox's workspace (%s, "
                     "which is /workspace) is reachable",
                     p, E2B_HOME, E2B_HOME);
            return NULL;
        }
        while (*rel == '/')
            rel++;
    }
    char *out = xstrdup(rel);
    size_t n = strlen(out);
    while (n && out[n - 1] == '/')
        out[--n] = '\0';
    if (*out && !path_is_safe_relative(out)) {
        snprintf(err, 512, "bad path '%.180s': no '..', '.' or empty parts", p);
        free(out);
        return NULL;
    }
    return out;
}

static char *e2b_abs(const char *rel)
{
    return *rel ? xasprintf("%s/%s", E2B_HOME, rel) : xstrdup(E2B_HOME);
}

static unsigned path_status(int err)
{
    switch (-err) {
    case ENOENT:
        return 404;
    case EEXIST:
        return 409;
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
        return 507;
    default:
        return 400;
    }
}

enum MHD_Result h_e2b_files_get(struct request *rq)
{
    const char *box = header(rq, "E2b-Sandbox-Id");
    const char *p = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "path");
    char why[512];
    _cleanup_free_ char *rel = ws_path(p, why);
    if (!rel)
        return e2b_error(rq, 400, "query 'path': %s", why);
    if (!*rel)
        return e2b_error(rq, 400, "'%s' is a directory", p);
    struct session *s = box_session(rq, box);
    if (!s)
        return MHD_YES;
    /* Looked at before it is opened for reading (a FIFO would block, a socket fails), then
     * streamed from the fd: the file is never held in memory. */
    struct stat st;
    int fd = workspace_openat(session_workspace(s), rel, O_PATH, 0);
    bool special = fd >= 0 && fstat(fd, &st) == 0 && !S_ISREG(st.st_mode);
    if (fd >= 0)
        close(fd);
    fd = special || fd < 0 ? fd
                           : workspace_openat(session_workspace(s), rel, O_RDONLY | O_NONBLOCK, 0);
    session_table_put(rq->srv->table, s);
    if (special)
        return e2b_error(rq, 400, "'%s' is %s, not a regular file", p,
                         S_ISDIR(st.st_mode) ? "a directory" : "a special file");
    if (fd == -ENOENT)
        return e2b_error(rq, 404, "file '%s' not found", p);
    if (fd < 0)
        return e2b_error(rq, 400, "cannot read '%s': %s", p,
                         fd == -ELOOP ? "it is or goes through a symbolic link, which is not "
                                        "followed"
                                      : strerror(-fd));
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return e2b_error(rq, 400, "'%s' is not a regular file", p); /* swapped since */
    }
    fd_set_nonblock(fd, false);
    struct MHD_Response *resp = MHD_create_response_from_fd((uint64_t)st.st_size, fd);
    MHD_add_response_header(resp, "Content-Type", "application/octet-stream");
    return reply_response(rq, 200, resp);
}

/* One part of a multipart/form-data body. */
struct part {
    const char *data;
    size_t len;
    char filename[1024];
};

/* The parts of body (at most max), split on boundary; -1 when it is not well formed, -2 when
 * a file name is longer than struct part keeps. */
static int multipart_parts(const char *body, size_t n, const char *boundary, struct part *parts,
                           int max)
{
    _cleanup_free_ char *delim = xasprintf("--%s", boundary);
    size_t dl = strlen(delim);
    const char *end = body + n;
    const char *p = memmem(body, n, delim, dl);
    int count = 0;
    while (p) {
        p += dl;
        if (end - p >= 2 && p[0] == '-' && p[1] == '-')
            return count; /* the closing delimiter */
        if (end - p < 2 || p[0] != '\r' || p[1] != '\n' || count >= max)
            return -1;
        p += 2;
        const char *hend = memmem(p, (size_t)(end - p), "\r\n\r\n", 4);
        if (!hend)
            return -1;
        struct part *pt = &parts[count];
        pt->filename[0] = '\0';
        const char *fn = memmem(p, (size_t)(hend - p), "filename=\"", 10);
        if (fn) {
            fn += 10;
            const char *q = memchr(fn, '"', (size_t)(hend - fn));
            if (!q)
                return -1;
            if ((size_t)(q - fn) >= sizeof(pt->filename))
                return -2; /* cut, it would name another file */
            snprintf(pt->filename, sizeof(pt->filename), "%.*s", (int)(q - fn), fn);
        }
        const char *data = hend + 4;
        _cleanup_free_ char *next_delim = xasprintf("\r\n%s", delim);
        const char *next = memmem(data, (size_t)(end - data), next_delim, dl + 2);
        if (!next)
            return -1;
        pt->data = data;
        pt->len = (size_t)(next - data);
        count++;
        p = next + 2;
    }
    return -1;
}

static enum MHD_Result write_one(struct request *rq, struct workspace *ws, const char *path,
                                 const void *data, size_t n, json_t *out)
{
    char why[512];
    _cleanup_free_ char *rel = ws_path(path, why);
    if (!rel)
        return e2b_error(rq, 400, "path: %s", why);
    if (!*rel)
        return e2b_error(rq, 400, "'%s' is a directory", path);
    int r = workspace_write(ws, rel, data, n);
    if (r < 0)
        return e2b_error(rq, path_status(r), "cannot write '%s': %s", path, err_msg());
    const char *slash = strrchr(rel, '/');
    _cleanup_free_ char *abs = e2b_abs(rel);
    json_array_append_new(out, json_pack("{s:s,s:s,s:s}", "path", abs, "name",
                                         slash ? slash + 1 : rel, "type", "file"));
    return MHD_YES;
}

#define E2B_MAX_PARTS 256

enum MHD_Result h_e2b_files_post(struct request *rq)
{
    const char *box = header(rq, "E2b-Sandbox-Id");
    const char *path = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "path");
    const char *ct = header(rq, "Content-Type");
    const char *enc = header(rq, "Content-Encoding");
    if (enc && strcmp(enc, "identity"))
        return e2b_error(rq, 400, "Content-Encoding '%s' is not supported; upload without gzip",
                         enc);
    struct session *s = box_session(rq, box);
    if (!s)
        return MHD_YES;
    struct workspace *ws = session_workspace(s);
    json_t *out = json_array();
    enum MHD_Result ret = MHD_YES;
    if (ct && str_has_prefix(ct, "multipart/form-data")) {
        const char *bd = strstr(ct, "boundary=");
        char boundary[200];
        struct part *parts = xcalloc(E2B_MAX_PARTS, sizeof(*parts));
        int n = -1;
        if (bd) {
            bd += 9;
            bool quoted = *bd == '"';
            snprintf(boundary, sizeof(boundary), "%.*s", (int)strcspn(bd + quoted, "\";"),
                     bd + quoted);
            n = multipart_parts(rq->body.data ? rq->body.data : "", rq->body.len, boundary, parts,
                                E2B_MAX_PARTS);
        }
        if (n == -2)
            ret = e2b_error(rq, 400, "a file name in the multipart body is longer than %zu bytes",
                            sizeof(parts->filename) - 1);
        else if (n < 0)
            ret = e2b_error(rq, 400,
                            "the multipart body is not well formed (or has more than "
                            "%d files)",
                            E2B_MAX_PARTS);
        for (int i = 0; i < n && !rq->responded; i++) {
            const char *dest = path && n == 1 ? path : parts[i].filename;
            ret = write_one(rq, ws, dest, parts[i].data, parts[i].len, out);
        }
        free(parts);
    } else if (path) {
        ret = write_one(rq, ws, path, rq->body.data ? rq->body.data : "", rq->body.len, out);
    } else {
        ret = e2b_error(rq, 400, "query 'path' is required for an octet-stream upload");
    }
    if (!rq->responded)
        session_save_files(s);
    session_table_put(rq->srv->table, s);
    if (rq->responded) {
        json_decref(out);
        return ret;
    }
    return reply_json(rq, 200, out);
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

json_t *e2b_error_body(const struct request *rq, unsigned status, const char *msg, size_t n)
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

static enum MHD_Result connect_error(struct request *rq, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static enum MHD_Result connect_error(struct request *rq, const char *code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    unsigned status = 500;
    for (size_t i = 0; i < ARRAY_SIZE(connect_codes); i++)
        if (!strcmp(connect_codes[i].code, code))
            status = connect_codes[i].status;
    size_t n;
    char *clean = utf8_sanitize(msg, strlen(msg), &n);
    json_t *j = json_pack("{s:s,s:s%}", "code", code, "message", clean, n);
    free(clean);
    return reply_json(rq, status, j);
}

static const char *errno_code(int err)
{
    switch (-err) {
    case ENOENT:
        return "not_found";
    case EEXIST:
        return "already_exists";
    case ENOSPC:
    case EDQUOT:
        return "resource_exhausted";
    default:
        return "invalid_argument";
    }
}

static bool is_connect_stream(struct request *rq)
{
    const char *ct = header(rq, "Content-Type");
    return ct && str_has_prefix(ct, "application/connect+json");
}

/* The request message: the body (unary), or the body's one envelope (streaming); NULL after
 * replying. */
static json_t *connect_request(struct request *rq)
{
    const char *data = rq->body.data ? rq->body.data : "";
    size_t n = rq->body.len;
    if (is_connect_stream(rq)) {
        const unsigned char *h = (const unsigned char *)data;
        size_t len =
            n >= 5 ? ((size_t)h[1] << 24 | (size_t)h[2] << 16 | (size_t)h[3] << 8 | h[4]) : 0;
        if (n < 5 || len != n - 5 || (h[0] & 1)) {
            connect_error(rq, "invalid_argument",
                          "the request is not one uncompressed Connect "
                          "envelope");
            return NULL;
        }
        data += 5;
        n = len;
    }
    if (!n)
        return json_object();
    json_error_t jerr;
    json_t *j = json_loadb(data, n, JSON_REJECT_DUPLICATES, &jerr);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        connect_error(rq, "invalid_argument", "the request message is not a JSON object");
        return NULL;
    }
    return j;
}

/* Single-quoted for bash. */
static void shell_quote(struct buf *b, const char *s)
{
    buf_append(b, "'", 1);
    for (const char *p = s; *p; p++) {
        if (*p == '\'')
            buf_append(b, "'\\''", 4);
        else
            buf_append(b, p, 1);
    }
    buf_append(b, "'", 1);
}

/* The bash cell that runs a ProcessConfig {cmd, args, envs, cwd}; NULL after replying. It runs
 * in a subshell, as E2B runs each command in a process of its own: the session's kept shell
 * neither takes the command's cd and variables nor is replaced by its exec. */
static char *process_cell(struct request *rq, json_t *cfg)
{
    const char *cmd = json_string_value(json_object_get(cfg, "cmd"));
    const char *cwd = json_string_value(json_object_get(cfg, "cwd"));
    json_t *args = json_object_get(cfg, "args"), *envs = json_object_get(cfg, "envs");
    if (!cmd || !*cmd) {
        connect_error(rq, "invalid_argument", "process.cmd is required");
        return NULL;
    }
    char why[512];
    const char *given = cwd && *cwd ? cwd : E2B_HOME;
    _cleanup_free_ char *rel = ws_path(given, why);
    /* Another absolute directory is one of the sandbox's own (/, /tmp): the command's cd
     * happens inside the sandbox, which says whether it is there. */
    if (!rel && given[0] != '/') {
        connect_error(rq, "invalid_argument", "process.cwd: %s", why);
        return NULL;
    }
    struct buf b;
    buf_init(&b, 0);
    _cleanup_free_ char *dir =
        rel ? xasprintf("/workspace%s%s", *rel ? "/" : "", rel) : xstrdup(given);
    buf_printf(&b, "(cd -- ");
    shell_quote(&b, dir);
    buf_printf(&b, " && exec env --");
    const char *k;
    json_t *v;
    json_object_foreach(json_is_object(envs) ? envs : NULL, k, v)
    {
        if (!env_name_ok(k) || !json_is_string(v)) {
            buf_release(&b);
            connect_error(rq, "invalid_argument",
                          "process.envs: '%s' is not a variable name "
                          "with a string value",
                          k);
            return NULL;
        }
        _cleanup_free_ char *kv = xasprintf("%s=%s", k, json_string_value(v));
        buf_append(&b, " ", 1);
        shell_quote(&b, kv);
    }
    buf_append(&b, " ", 1);
    shell_quote(&b, cmd);
    size_t i;
    json_array_foreach(json_is_array(args) ? args : NULL, i, v)
    {
        if (!json_is_string(v)) {
            buf_release(&b);
            connect_error(rq, "invalid_argument", "process.args[%zu] is not a string", i);
            return NULL;
        }
        buf_append(&b, " ", 1);
        shell_quote(&b, json_string_value(v));
    }
    buf_append(&b, ")", 2); /* with the NUL */
    return buf_detach(&b, NULL);
}

static uint64_t connect_timeout_ms(struct request *rq)
{
    const char *t = header(rq, "Connect-Timeout-Ms");
    uint64_t ms = 0, max = rq->srv->cfg->limits.max_timeout_ms;
    if (!t || parse_u64(t, &ms) < 0 || !ms || ms > max)
        return max;
    return ms;
}

static enum MHD_Result process_start(struct request *rq, json_t *msg, const char *box)
{
    json_t *cfg = json_object_get(msg, "process");
    if (json_object_get(msg, "pty") && !json_is_null(json_object_get(msg, "pty")))
        return connect_error(rq, "unimplemented", "pty is not supported by runcell");
    if (json_is_true(json_object_get(msg, "stdin")))
        return connect_error(rq, "unimplemented",
                             "stdin is not supported by runcell: commands "
                             "read /dev/null");
    char *cell = process_cell(rq, cfg);
    if (!cell)
        return MHD_YES;
    struct session *s = box_session(rq, box);
    if (!s) {
        free(cell);
        return MHD_YES;
    }
    if (!execution_slot_take(rq)) {
        free(cell);
        session_table_put(rq->srv->table, s);
        return MHD_YES;
    }
    if (session_busy(s)) {
        free(cell);
        execution_slot_give(rq);
        session_table_put(rq->srv->table, s);
        return connect_error(rq, "failed_precondition",
                             "sandbox %s is running another cell or "
                             "command; runcell runs one at a time per sandbox",
                             box);
    }
    struct e2b *e = rq->srv->e2b;
    pthread_mutex_lock(&e->lock);
    struct e2b_box *b = box_find(e, box);
    unsigned pid = b ? ++b->next_pid : 1;
    pthread_mutex_unlock(&e->lock);
    box_set_running(rq->srv, box, pid, cfg);
    return start_stream(rq, s, STREAM_PROCESS, cell, "bash", connect_timeout_ms(rq), box, pid);
}

static enum MHD_Result process_list(struct request *rq, const char *box)
{
    struct e2b *e = rq->srv->e2b;
    json_t *procs = json_array();
    pthread_mutex_lock(&e->lock);
    struct e2b_box *b = box_find(e, box);
    if (b && b->running_pid)
        json_array_append_new(
            procs, json_pack("{s:O,s:i}", "config", b->running_cfg, "pid", (int)b->running_pid));
    pthread_mutex_unlock(&e->lock);
    return reply_json(rq, 200, json_pack("{s:o}", "processes", procs));
}

static enum MHD_Result process_signal(struct request *rq, json_t *msg, const char *box)
{
    json_t *sel = json_object_get(json_object_get(msg, "process"), "pid");
    json_int_t want = json_integer_value(sel);
    /* A pid past what a command can have is no command's (not one truncated to another's). */
    unsigned pid = want > 0 && want <= UINT_MAX ? (unsigned)want : 0;
    json_t *sv = json_object_get(msg, "signal");
    const char *sname = json_string_value(sv);
    int sig = sname ? (!strcmp(sname, "SIGNAL_SIGTERM")   ? 15
                       : !strcmp(sname, "SIGNAL_SIGKILL") ? 9
                                                          : 0)
                    : (int)json_integer_value(sv);
    if (sig != 9 && sig != 15)
        return connect_error(rq, "invalid_argument",
                             "signal must be SIGNAL_SIGKILL or "
                             "SIGNAL_SIGTERM");
    struct e2b *e = rq->srv->e2b;
    pthread_mutex_lock(&e->lock);
    struct e2b_box *b = box_find(e, box);
    bool running = b && pid && b->running_pid == pid;
    if (running)
        b->signalled = sig;
    pthread_mutex_unlock(&e->lock);
    if (!running)
        return connect_error(rq, "not_found", "no process %lld is running in sandbox %s",
                             (long long)want, box);
    struct session *s = box_session(rq, box);
    if (!s)
        return MHD_YES;
    /* Whatever the signal, the command's cell is interrupted: the kernel stops bash and what
     * it started. */
    session_interrupt(s);
    session_table_put(rq->srv->table, s);
    return reply_json(rq, 200, json_object());
}

enum MHD_Result h_e2b_process_rpc(struct request *rq)
{
    const char *box = header(rq, "E2b-Sandbox-Id"), *method = rq->params[0];
    json_t *msg = connect_request(rq);
    if (!msg)
        return MHD_YES;
    enum MHD_Result ret;
    if (!strcmp(method, "Start"))
        ret = is_connect_stream(rq) ? process_start(rq, msg, box)
                                    : connect_error(rq, "invalid_argument",
                                                    "Start is a "
                                                    "streaming method: application/connect+json");
    else if (!strcmp(method, "List"))
        ret = process_list(rq, box);
    else if (!strcmp(method, "SendSignal"))
        ret = process_signal(rq, msg, box);
    else
        ret = connect_error(rq, "unimplemented",
                            "process.Process/%s is not supported by "
                            "runcell (Start, List and SendSignal are; no stdin, no pty, no "
                            "reconnecting to a command)",
                            method);
    json_decref(msg);
    return ret;
}

/* ---- the filesystem service ---- */

static const char *perm_string(mode_t m, char out[11])
{
    const char *t = S_ISDIR(m) ? "d" : S_ISLNK(m) ? "l" : "-";
    snprintf(out, 11, "%s%c%c%c%c%c%c%c%c%c", t, m & 0400 ? 'r' : '-', m & 0200 ? 'w' : '-',
             m & 0100 ? 'x' : '-', m & 040 ? 'r' : '-', m & 020 ? 'w' : '-', m & 010 ? 'x' : '-',
             m & 04 ? 'r' : '-', m & 02 ? 'w' : '-', m & 01 ? 'x' : '-');
    return out;
}

static json_t *entry_json(const char *rel, const struct stat *st)
{
    char perm[11], mtime[32];
    format_time_iso((uint64_t)st->st_mtim.tv_sec * 1000 + (uint64_t)st->st_mtim.tv_nsec / 1000000,
                    mtime);
    _cleanup_free_ char *abs = e2b_abs(rel);
    const char *slash = strrchr(abs, '/');
    const char *type = S_ISDIR(st->st_mode)   ? "FILE_TYPE_DIRECTORY"
                       : S_ISLNK(st->st_mode) ? "FILE_TYPE_SYMLINK"
                       : S_ISREG(st->st_mode) ? "FILE_TYPE_FILE"
                                              : "FILE_TYPE_UNSPECIFIED";
    char size[24];
    snprintf(size, sizeof(size), "%lld", (long long)st->st_size);
    size_t n;
    char *clean_abs = utf8_sanitize(abs, strlen(abs), &n);
    json_t *j = json_pack("{s:s,s:s,s:s%,s:s,s:i,s:s,s:s,s:s,s:s}", "name", slash + 1, "type", type,
                          "path", clean_abs, n, "size", size, "mode", (int)(st->st_mode & 07777),
                          "permissions", perm_string(st->st_mode, perm), "owner", "user", "group",
                          "user", "modifiedTime", mtime);
    free(clean_abs);
    return j;
}

/* Stats rel (never following a link) into st. 0 or -errno. */
static int ws_stat(struct workspace *ws, const char *rel, struct stat *st)
{
    if (!*rel) {
        _cleanup_close_ int fd = workspace_open(ws);
        return fd < 0 ? fd : fstat(fd, st) < 0 ? -errno : 0;
    }
    const char *leaf;
    _cleanup_close_ int dfd = workspace_open_parent(ws, rel, false, &leaf);
    if (dfd < 0)
        return dfd;
    return fstatat(dfd, leaf, st, AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
}

static int ws_opendir(struct workspace *ws, const char *rel)
{
    return *rel ? workspace_openat(ws, rel, O_RDONLY | O_DIRECTORY, 0) : workspace_open(ws);
}

/* Appends the entries of directory rel, and below it to depth levels, to arr. */
static int list_dir(struct workspace *ws, const char *rel, unsigned depth, json_t *arr)
{
    int fd = ws_opendir(ws, rel);
    if (fd < 0)
        return fd;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return -errno;
    }
    struct dirent *de;
    int r = 0;
    while ((de = readdir(d))) {
        if (json_array_size(arr) >= E2B_MAX_LISTDIR) {
            r = -E2BIG; /* said, never cut silently: ListDir has no "truncated" */
            break;
        }
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
            (!*rel && !strcmp(de->d_name, ".runcell")))
            continue;
        struct stat st;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue;
        _cleanup_free_ char *child =
            *rel ? xasprintf("%s/%s", rel, de->d_name) : xstrdup(de->d_name);
        json_array_append_new(arr, entry_json(child, &st));
        if (S_ISDIR(st.st_mode) && depth > 1 && (r = list_dir(ws, child, depth - 1, arr)) < 0)
            break;
    }
    closedir(d);
    return r;
}

static enum MHD_Result fs_reply_entry(struct request *rq, struct workspace *ws, const char *rel,
                                      const char *p)
{
    struct stat st;
    int r = ws_stat(ws, rel, &st);
    if (r < 0)
        return connect_error(rq, errno_code(r), "'%s': %s", p, strerror(-r));
    return reply_json(rq, 200, json_pack("{s:o}", "entry", entry_json(rel, &st)));
}

static enum MHD_Result fs_call(struct request *rq, const char *method, json_t *msg,
                               struct workspace *ws)
{
    const char *p =
        json_string_value(json_object_get(msg, strcmp(method, "Move") ? "path" : "source"));
    char why[512];
    _cleanup_free_ char *rel = ws_path(p, why);
    if (!rel)
        return connect_error(rq, "invalid_argument", "%s", why);
    int r;
    if (!strcmp(method, "Stat"))
        return fs_reply_entry(rq, ws, rel, p);
    if (!strcmp(method, "ListDir")) {
        json_int_t depth = json_integer_value(json_object_get(msg, "depth"));
        json_t *arr = json_array();
        r = list_dir(ws, rel, depth < 1 ? 1 : depth > 64 ? 64 : (unsigned)depth, arr);
        if (r == -E2BIG) {
            json_decref(arr);
            return connect_error(rq, "resource_exhausted",
                                 "'%s' holds more than %d entries "
                                 "(to the depth asked); list a subdirectory, or with a lower "
                                 "depth",
                                 p, E2B_MAX_LISTDIR);
        }
        if (r < 0) {
            json_decref(arr);
            return connect_error(rq, errno_code(r), "'%s': %s", p,
                                 r == -ENOTDIR ? "not a directory" : strerror(-r));
        }
        return reply_json(rq, 200, json_pack("{s:o}", "entries", arr));
    }
    if (!*rel && !strcmp(method, "MakeDir")) /* as E2B answers for any existing directory */
        return connect_error(rq, "already_exists", "'%s' already exists", p);
    if (!*rel)
        return connect_error(rq, "invalid_argument", "'%s' is the workspace itself", p);
    if (!strcmp(method, "MakeDir")) {
        if ((r = workspace_mkdir(ws, rel, 0755)) < 0)
            return connect_error(rq, errno_code(r), "'%s': %s", p, strerror(-r));
        return fs_reply_entry(rq, ws, rel, p);
    }
    const char *leaf;
    _cleanup_close_ int dfd = workspace_open_parent(ws, rel, false, &leaf);
    if (dfd < 0)
        return connect_error(rq, errno_code(dfd), "'%s': %s", p, strerror(-dfd));
    if (!strcmp(method, "Remove")) {
        struct stat st;
        if (fstatat(dfd, leaf, &st, AT_SYMLINK_NOFOLLOW) < 0)
            return connect_error(rq, "not_found", "'%s' does not exist", p);
        r = S_ISDIR(st.st_mode) ? rm_rf_at(dfd, leaf) : (unlinkat(dfd, leaf, 0) < 0 ? -errno : 0);
        if (r < 0)
            return connect_error(rq, errno_code(r), "cannot remove '%s': %s", p, strerror(-r));
        return reply_json(rq, 200, json_object());
    }
    /* Move */
    const char *dst = json_string_value(json_object_get(msg, "destination"));
    _cleanup_free_ char *drel = ws_path(dst, why);
    if (!drel || !*drel)
        return connect_error(rq, "invalid_argument", "destination: %s",
                             drel ? "the workspace itself" : why);
    const char *dleaf;
    _cleanup_close_ int ddfd = workspace_open_parent(ws, drel, true, &dleaf);
    if (ddfd < 0)
        return connect_error(rq, errno_code(ddfd), "'%s': %s", dst, strerror(-ddfd));
    if (renameat(dfd, leaf, ddfd, dleaf) < 0)
        return connect_error(rq, errno_code(-errno), "cannot move '%s' to '%s': %s", p, dst,
                             strerror(errno));
    return fs_reply_entry(rq, ws, drel, dst);
}

enum MHD_Result h_e2b_filesystem_rpc(struct request *rq)
{
    static const char *const methods[] = {"Stat", "ListDir", "MakeDir", "Remove", "Move"};
    const char *box = header(rq, "E2b-Sandbox-Id"), *method = rq->params[0];
    bool known = false;
    for (size_t i = 0; i < ARRAY_SIZE(methods); i++)
        known |= !strcmp(methods[i], method);
    if (!known)
        return connect_error(rq, "unimplemented",
                             "filesystem.Filesystem/%s is not supported by "
                             "runcell (Stat, ListDir, MakeDir, Remove and Move are)",
                             method);
    json_t *msg = connect_request(rq);
    if (!msg)
        return MHD_YES;
    struct session *s = box_session(rq, box);
    enum MHD_Result ret = MHD_YES;
    if (s) {
        ret = fs_call(rq, method, msg, session_workspace(s));
        if (strcmp(method, "ListDir") && strcmp(method, "Stat"))
            session_save_files(s);
        session_table_put(rq->srv->table, s);
    }
    json_decref(msg);
    return ret;
}
