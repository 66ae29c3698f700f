/* wire.c - E2B's wire formats parsed without a request or a session around them (the fuzz
 * targets call these): paths, list filters, multipart uploads, Connect envelopes, commands. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "e2b/e2b-int.h"

static int hex_digit(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* Percent-decodes s in place ('+' a space too when form is true). */
void e2b_url_decode(char *s, bool form)
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

json_t *e2b_metadata_parse(const char *q, char why[256])
{
    json_t *want = json_object();
    _cleanup_free_ char *copy = xstrdup(q);
    char *save = NULL;
    for (char *pair = strtok_r(copy, "&", &save); pair; pair = strtok_r(NULL, "&", &save)) {
        char *eq = strchr(pair, '=');
        if (!eq) {
            json_decref(want);
            snprintf(why, 256, "'%.100s' is not key=value", pair);
            return NULL;
        }
        *eq = '\0';
        e2b_url_decode(pair, true);
        e2b_url_decode(eq + 1, true);
        e2b_url_decode(pair, false);
        e2b_url_decode(eq + 1, false);
        /* Decoding may have made a NUL: the key ends there, as the SDK's would. */
        json_t *v = json_string(eq + 1);
        if (!v || json_object_set_new(want, pair, v) < 0) {
            json_decref(want);
            snprintf(why, 256, "a key or value is not UTF-8 text");
            return NULL;
        }
    }
    return want;
}

/* rel with its "." and empty components dropped ("./a//b/." is "a/b"; "." is ""). */
static char *drop_dots(const char *rel)
{
    struct buf b;
    buf_init(&b, 0);
    for (const char *p = rel; *p;) {
        size_t n = strcspn(p, "/");
        if (n && !(n == 1 && p[0] == '.')) {
            if (b.len)
                buf_append(&b, "/", 1);
            buf_append(&b, p, n);
        }
        p += n + (p[n] == '/');
    }
    buf_append(&b, "", 1);
    return buf_detach(&b, NULL);
}

/* The workspace-relative path for an E2B path ("" for the workspace itself: "", ".",
 * /home/user), or NULL with why in err. */
char *e2b_ws_path(const char *p, char err[512])
{
    static const char *const roots[] = {E2B_HOME, "/workspace"};
    if (!p) {
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
    }
    char *out = drop_dots(rel);
    if (*out && !path_is_safe_relative(out)) {
        snprintf(err, 512, "bad path '%.180s': no '..' parts", p);
        free(out);
        return NULL;
    }
    return out;
}

char *e2b_abs(const char *rel)
{
    return *rel ? xasprintf("%s/%s", E2B_HOME, rel) : xstrdup(E2B_HOME);
}

unsigned e2b_path_status(int err)
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

/* The parts of body (at most max), split on boundary; -1 when it is not well formed, -2 when
 * a file name is longer than struct e2b_part keeps. */
int e2b_multipart_parts(const char *body, size_t n, const char *boundary, struct e2b_part *parts,
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
        struct e2b_part *pt = &parts[count];
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

json_t *e2b_connect_message(const char *data, size_t n, bool stream, char why[256])
{
    if (stream) {
        const unsigned char *h = (const unsigned char *)data;
        size_t len =
            n >= 5 ? ((size_t)h[1] << 24 | (size_t)h[2] << 16 | (size_t)h[3] << 8 | h[4]) : 0;
        if (n < 5 || len != n - 5 || (h[0] & 1)) {
            snprintf(why, 256, "the request is not one uncompressed Connect envelope");
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
        snprintf(why, 256, "the request message is not a JSON object");
        return NULL;
    }
    return j;
}

/* A name the environment takes: [A-Za-z_][A-Za-z0-9_]*. */
bool e2b_env_name_ok(const char *k)
{
    if (!*k || (*k >= '0' && *k <= '9'))
        return false;
    for (const char *p = k; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '_'))
            return false;
    return true;
}

/* The longest working directory and the most arguments and variables a command takes (the
 * sandbox's own cap on their bytes is SANDBOX_EXEC_MAX_ARGS). */
#define COMMAND_MAX_CWD  4096
#define COMMAND_MAX_ARGS 4096

void e2b_command_release(struct e2b_command *c)
{
    strv_free(c->argv);
    strv_free(c->env);
    free(c->cwd);
    memset(c, 0, sizeof(*c));
}

/* envVars then envs, each a variable name with a string value; envs' replace envVars'. */
static bool command_env(json_t *box_env, json_t *envs, struct e2b_command *c, char why[512])
{
    const char *k;
    json_t *v;
    if (envs && !json_is_null(envs) && !json_is_object(envs)) {
        snprintf(why, 512, "process.envs must be an object of strings");
        return false;
    }
    json_object_foreach(json_is_object(envs) ? envs : NULL, k, v)
    {
        if (!e2b_env_name_ok(k) || !json_is_string(v)) {
            snprintf(why, 512, "process.envs: '%.100s' is not a variable name with a string value",
                     k);
            return false;
        }
    }
    json_object_foreach(json_is_object(box_env) ? box_env : NULL, k, v)
    {
        if (json_is_string(v) && !json_object_get(envs, k)) {
            _cleanup_free_ char *kv = xasprintf("%s=%s", k, json_string_value(v));
            c->env = strv_push(c->env, kv);
        }
    }
    json_object_foreach(json_is_object(envs) ? envs : NULL, k, v)
    {
        _cleanup_free_ char *kv = xasprintf("%s=%s", k, json_string_value(v));
        c->env = strv_push(c->env, kv);
    }
    return true;
}

int e2b_command_parse(json_t *cfg, json_t *box_env, struct e2b_command *ret, char why[512])
{
    struct e2b_command c = {.argv = xcalloc(1, sizeof(char *)), .env = xcalloc(1, sizeof(char *))};
    const char *cmd = json_string_value(json_object_get(cfg, "cmd"));
    json_t *cwd = json_object_get(cfg, "cwd"), *args = json_object_get(cfg, "args"), *v;
    size_t i;
    if (!cmd || !*cmd || strlen(cmd) != json_string_length(json_object_get(cfg, "cmd"))) {
        snprintf(why, 512, "process.cmd is required: the program to run, a string");
        goto fail;
    }
    c.argv = strv_push(c.argv, cmd);
    if (args && !json_is_null(args) &&
        (!json_is_array(args) || json_array_size(args) > COMMAND_MAX_ARGS)) {
        snprintf(why, 512, "process.args must be an array of at most %d strings", COMMAND_MAX_ARGS);
        goto fail;
    }
    json_array_foreach(json_is_array(args) ? args : NULL, i, v)
    {
        /* a NUL would end the argument where the program reads it: refused, not cut */
        if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v)) {
            snprintf(why, 512, "process.args[%zu] is not a string without NUL characters", i);
            goto fail;
        }
        c.argv = strv_push(c.argv, json_string_value(v));
    }
    if (!command_env(box_env, json_object_get(cfg, "envs"), &c, why))
        goto fail;
    const char *dir = json_string_value(cwd);
    if (cwd && !json_is_null(cwd) &&
        (!dir || strlen(dir) != json_string_length(cwd) || strlen(dir) > COMMAND_MAX_CWD)) {
        snprintf(why, 512,
                 "process.cwd must be a path (a string without NUL characters, at most "
                 "%d bytes)",
                 COMMAND_MAX_CWD);
        goto fail;
    }
    /* Any directory of the sandbox: the program enters it there, not the daemon. The
     * workspace is named as E2B names it (/workspace/x is /home/user/x, what pwd says). */
    if (dir && *dir) {
        char pwhy[512];
        _cleanup_free_ char *rel = e2b_ws_path(dir, pwhy);
        c.cwd = rel           ? xasprintf("%s%s%s", E2B_HOME, *rel ? "/" : "", rel)
                : *dir == '/' ? xstrdup(dir)
                              : xasprintf("%s/%s", E2B_HOME, dir);
    }
    *ret = c;
    return 0;
fail:
    e2b_command_release(&c);
    return -EINVAL;
}

unsigned char *e2b_bytes_decode(const char *s, size_t *ret_len)
{
    size_t n = strlen(s);
    if (n > ((size_t)1 << 30))
        return NULL;
    char *std = xmalloc(n + 4);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        std[m++] = s[i] == '-' ? '+' : s[i] == '_' ? '/' : s[i];
    while (m % 4)
        std[m++] = '=';
    std[m] = '\0';
    unsigned char *out = base64_decode(std, m, ret_len);
    free(std);
    return out;
}

json_t *e2b_connect_messages(const char *data, size_t n, size_t max, char why[256])
{
    json_t *arr = json_array();
    const unsigned char *p = (const unsigned char *)data;
    while (n) {
        size_t len = n >= 5 ? ((size_t)p[1] << 24 | (size_t)p[2] << 16 | (size_t)p[3] << 8 | p[4])
                            : SIZE_MAX;
        if (n < 5 || len > n - 5 || (p[0] & 1)) {
            snprintf(why, 256, "the request is not a sequence of uncompressed Connect envelopes");
            goto fail;
        }
        bool end = p[0] & 2;
        json_t *m = len ? json_loadb((const char *)p + 5, len, JSON_REJECT_DUPLICATES, NULL)
                        : json_object();
        if (!json_is_object(m)) {
            json_decref(m);
            snprintf(why, 256, "message %zu of the stream is not a JSON object",
                     json_array_size(arr));
            goto fail;
        }
        if (end) {
            json_decref(m);
            break;
        }
        if (json_array_size(arr) >= max) {
            json_decref(m);
            snprintf(why, 256, "the stream holds more than %zu messages", max);
            goto fail;
        }
        json_array_append_new(arr, m);
        p += 5 + len;
        n -= 5 + len;
    }
    return arr;
fail:
    json_decref(arr);
    return NULL;
}

int e2b_basic_user(const char *authorization, char *ret_user, size_t size)
{
    if (!authorization || strncasecmp(authorization, "Basic ", 6))
        return -ENOENT;
    const char *b64 = authorization + 6;
    while (*b64 == ' ')
        b64++;
    size_t n;
    unsigned char *raw = e2b_bytes_decode(b64, &n);
    if (!raw)
        return -EINVAL;
    /* "user:" (E2B's envd takes no password); the name ends at the first ':' */
    size_t len = 0;
    while (len < n && raw[len] != ':')
        len++;
    bool ok = len < size && !memchr(raw, '\0', len);
    if (ok) {
        memcpy(ret_user, raw, len);
        ret_user[len] = '\0';
    }
    free(raw);
    return ok ? 0 : -EINVAL;
}

/* ---- a create's body ---- */

static const char *const e2b_templates[] = {"code-interpreter-v1", "code-interpreter", "base"};

/* Fields of a create body that runcell takes, and those it must refuse when they ask for
 * something (null, false and empty mean "not asked"). */
static const char *const create_known[] = {
    "templateID", "timeout",   "metadata",        "envVars",   "secure", "allow_internet_access",
    "network",    "autoPause", "autoPauseMemory", "autoResume"};
static const char *const create_refused[] = {"mcp", "iam", "volumeMounts", "alias"};

/* Nested at most this deep: deeper is taken as asking (a create body is the client's, and
 * the SDKs' "off" values are one level deep). */
#define ASKS_MAX_DEPTH 8

static bool asks_for(json_t *v, int depth)
{
    if (!v || json_is_null(v) || json_is_false(v))
        return false;
    if (json_is_array(v))
        return json_array_size(v) > 0;
    if (!json_is_object(v))
        return true;
    if (depth >= ASKS_MAX_DEPTH)
        return json_object_size(v) > 0;
    const char *k;
    json_t *m;
    json_object_foreach(v, k, m)
    {
        if (asks_for(m, depth + 1))
            return true;
    }
    return false;
}

bool e2b_asks_for(json_t *v)
{
    return asks_for(v, 0);
}

static bool create_fields_ok(json_t *body, char why[512])
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
                if (e2b_asks_for(v)) {
                    snprintf(why, 512,
                             "field '%s' is not supported by runcell's E2B endpoint (docs/E2B.md "
                             "lists what is)",
                             k);
                    return false;
                }
                known = true;
            }
        }
        if (!known && e2b_asks_for(v)) {
            snprintf(why, 512, "unknown field '%.200s'", k);
            return false;
        }
    }
    return true;
}

/* What metadata or envVars may hold in all: they are kept with the sandbox. */
#define E2B_STRINGS_MAX (64u << 10)

static bool strings_object(json_t *v, const char *field, char why[512])
{
    const char *k;
    json_t *x;
    if (!v || json_is_null(v))
        return true;
    if (!json_is_object(v)) {
        snprintf(why, 512, "field '%s' must be an object of strings", field);
        return false;
    }
    size_t bytes = 0;
    json_object_foreach(v, k, x)
    {
        if (!json_is_string(x)) {
            snprintf(why, 512, "field '%s': the value of '%.200s' must be a string", field, k);
            return false;
        }
        bytes += strlen(k) + json_string_length(x);
    }
    if (bytes > E2B_STRINGS_MAX) {
        snprintf(why, 512,
                 "field '%s' holds %zu bytes of names and values, past %u: keep it small, and "
                 "put larger data in a file (files.write)",
                 field, bytes, E2B_STRINGS_MAX);
        return false;
    }
    return true;
}

/* E2B's ALL_TRAFFIC, the one denyOut entry runcell takes: "everything not in allowOut". */
#define E2B_ALL_TRAFFIC "0.0.0.0/0"

/* network.denyOut: only [ALL_TRAFFIC] (the SDKs' way to say "nothing but allowOut"), into
 * ret->deny_all. */
static bool deny_out_parse(json_t *deny, struct e2b_create *ret, char why[512])
{
    size_t i;
    json_t *v;
    if (!deny || json_is_null(deny))
        return true;
    bool all = json_is_array(deny) && json_array_size(deny) > 0;
    json_array_foreach(json_is_array(deny) ? deny : NULL, i, v) all &=
        json_is_string(v) && !strcmp(json_string_value(v), E2B_ALL_TRAFFIC);
    if (!all && !(json_is_array(deny) && !json_array_size(deny))) {
        snprintf(why, 512,
                 "field 'network.denyOut': runcell takes only [\"%s\"] (E2B's ALL_TRAFFIC: "
                 "nothing but network.allowOut is reachable); its egress is an allowlist, so "
                 "name what the sandbox may reach in network.allowOut instead",
                 E2B_ALL_TRAFFIC);
        return false;
    }
    ret->deny_all = all;
    return true;
}

/* network: {allowOut: [hosts], denyOut: [ALL_TRAFFIC]}, the members runcell maps; into
 * ret->allow_out and ret->deny_all. */
static bool create_network_parse(json_t *body, struct e2b_create *ret, char why[512])
{
    json_t *net = json_object_get(body, "network");
    if (!net || json_is_null(net))
        return true;
    if (!json_is_object(net)) {
        snprintf(why, 512, "field 'network' must be an object");
        return false;
    }
    const char *k;
    json_t *v;
    json_object_foreach(net, k, v)
    {
        if (strcmp(k, "allowOut") && strcmp(k, "denyOut") && e2b_asks_for(v)) {
            snprintf(why, 512,
                     "field 'network.%.100s' is not supported by runcell; only network.allowOut "
                     "(hosts, *.domains, host:port) maps onto its egress allowlist, with "
                     "denyOut [\"%s\"] at most",
                     k, E2B_ALL_TRAFFIC);
            return false;
        }
    }
    if (!deny_out_parse(json_object_get(net, "denyOut"), ret, why))
        return false;
    json_t *allow = json_object_get(net, "allowOut");
    if (!allow || json_is_null(allow))
        return true;
    if (!json_is_array(allow) || json_array_size(allow) > 1000) {
        snprintf(why, 512, "field 'network.allowOut' must be an array of at most 1000 hosts");
        return false;
    }
    ret->allow_out = xcalloc(1, sizeof(char *));
    size_t i;
    json_array_foreach(allow, i, v)
    {
        if (!json_is_string(v)) {
            snprintf(why, 512, "field 'network.allowOut': entry %zu is not a string", i);
            return false;
        }
        ret->allow_out = strv_push(ret->allow_out, json_string_value(v));
    }
    return true;
}

int e2b_create_parse(json_t *body, uint64_t max_timeout_s, struct e2b_create *ret, char why[512])
{
    memset(ret, 0, sizeof(*ret));
    ret->template_id = "code-interpreter-v1";
    ret->timeout_s = E2B_DEFAULT_TIMEOUT_S;
    if (!json_is_object(body)) {
        snprintf(why, 512, "the request body must be a JSON object");
        return -EINVAL;
    }
    if (!create_fields_ok(body, why))
        return -EINVAL;
    json_t *tv = json_object_get(body, "templateID");
    if (tv && !json_is_null(tv) && !json_is_string(tv)) {
        snprintf(why, 512, "field 'templateID' must be a string");
        return -EINVAL;
    }
    if (json_is_string(tv))
        ret->template_id = json_string_value(tv);
    /* A snapshot (createSnapshot's snapshotID, maybe with E2B's ":tag"): its id. */
    size_t id_len = strcspn(ret->template_id, ":");
    if (id_len == 32 && strspn(ret->template_id, "0123456789abcdef") == 32)
        snprintf(ret->snapshot, sizeof(ret->snapshot), "%.32s", ret->template_id);
    bool known = ret->snapshot[0] != '\0';
    for (size_t i = 0; i < ARRAY_SIZE(e2b_templates) && !known; i++)
        known = !strcmp(ret->template_id, e2b_templates[i]);
    if (!known) {
        snprintf(why, 512,
                 "field 'templateID': template '%.100s' is not known here; runcell serves one "
                 "template, Python with the data stack and bash, under the names "
                 "code-interpreter-v1, code-interpreter and base",
                 ret->template_id);
        return -EINVAL;
    }
    ret->metadata = json_object_get(body, "metadata");
    ret->env = json_object_get(body, "envVars");
    if (!strings_object(ret->metadata, "metadata", why) ||
        !strings_object(ret->env, "envVars", why))
        return -EINVAL;
    if (!json_is_object(ret->metadata))
        ret->metadata = NULL;
    if (!json_is_object(ret->env))
        ret->env = NULL;
    const char *k;
    json_t *v;
    json_object_foreach(ret->env, k, v)
    {
        if (!e2b_env_name_ok(k)) {
            snprintf(why, 512, "field 'envVars': '%.200s' is not an environment variable name", k);
            return -EINVAL;
        }
    }
    json_t *tj = json_object_get(body, "timeout");
    if (tj && !json_is_null(tj)) {
        json_int_t t = json_is_integer(tj) ? json_integer_value(tj) : -1;
        /* compared in seconds: in milliseconds a huge one wraps to a tiny one */
        if (t <= 0 || (uint64_t)t > max_timeout_s) {
            snprintf(why, 512, "field 'timeout' must be a whole number of seconds from 1 to %llu",
                     (unsigned long long)max_timeout_s);
            return -EINVAL;
        }
        ret->timeout_s = (uint64_t)t;
    }
    json_t *inet = json_object_get(body, "allow_internet_access");
    if (inet && !json_is_null(inet) && !json_is_boolean(inet)) {
        snprintf(why, 512, "field 'allow_internet_access' must be true or false");
        return -EINVAL;
    }
    ret->internet = json_is_boolean(inet) ? json_is_true(inet) : -1;
    json_t *ap = json_object_get(body, "autoPause"),
           *apm = json_object_get(body, "autoPauseMemory");
    if ((ap && !json_is_null(ap) && !json_is_boolean(ap)) ||
        (apm && !json_is_null(apm) && !json_is_boolean(apm))) {
        snprintf(why, 512, "fields 'autoPause' and 'autoPauseMemory' must be true or false");
        return -EINVAL;
    }
    ret->auto_pause = json_is_true(ap);
    ret->auto_pause_memory = !json_is_false(apm);
    if (!create_network_parse(body, ret, why)) {
        strv_free(ret->allow_out);
        ret->allow_out = NULL;
        return -EINVAL;
    }
    return 0;
}
