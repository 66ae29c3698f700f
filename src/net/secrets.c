/* secrets.c - credentials bound to hosts: parsing them from JSON (the one way in for every
 * surface), choosing the ones a request gets, showing them without their values, masking
 * their values in text, and changing a running session's rules. */
#include "net/net-int.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define MAX_HEADER_NAME 128
#define MAX_PATH_PREFIX 1024
#define SCRUB_MIN       8 /* a token or password shorter than this is not masked alone */

/* Headers a secret may not set: the ones that frame the request or the connection, which
 * the proxy reads itself, and the proxy hop's own. */
static const char *const reserved_headers[] = {
    "host",       "content-length",   "transfer-encoding",   "connection", "upgrade",
    "keep-alive", "proxy-connection", "proxy-authorization", "te",         "trailer",
    "expect",
};

static void secret_release(struct net_secret *s)
{
    net_entry_release(&s->host);
    free(s->path_prefix);
    free(s->header);
    if (s->value)
        explicit_bzero(s->value, strlen(s->value));
    if (s->token)
        explicit_bzero(s->token, strlen(s->token));
    if (s->password)
        explicit_bzero(s->password, strlen(s->password));
    free(s->value);
    free(s->token);
    free(s->password);
    memset(s, 0, sizeof(*s));
}

void net_secrets_free(struct net_secrets *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++)
        secret_release(&s->v[i]);
    free(s->v);
    free(s);
}

static char *dup_or_null(const char *s)
{
    return s ? xstrdup(s) : NULL;
}

static void secret_copy(struct net_secret *dst, const struct net_secret *src)
{
    *dst = *src;
    net_entry_copy(&dst->host, &src->host);
    dst->path_prefix = dup_or_null(src->path_prefix);
    dst->header = xstrdup(src->header);
    dst->value = xstrdup(src->value);
    dst->token = dup_or_null(src->token);
    dst->password = dup_or_null(src->password);
}

struct net_secrets *net_secrets_copy(const struct net_secrets *s)
{
    if (!s)
        return NULL;
    struct net_secrets *c = xcalloc(1, sizeof(*c));
    c->v = xcalloc(s->n ? s->n : 1, sizeof(*c->v));
    for (size_t i = 0; i < s->n; i++)
        secret_copy(&c->v[i], &s->v[i]);
    c->n = s->n;
    return c;
}

/* ---- parsing ---- */

static bool is_tchar(char c)
{
    return isalnum((unsigned char)c) || (c && strchr("!#$%&'*+-.^_`|~", c));
}

static bool reserved_header(const char *name)
{
    for (size_t i = 0; i < ARRAY_SIZE(reserved_headers); i++)
        if (!strcasecmp(name, reserved_headers[i]))
            return true;
    return false;
}

/* A field value as HTTP allows it (visible ASCII, spaces and tabs inside, nothing else) of
 * 1..max bytes without leading or trailing white space. The message never quotes it. */
static int check_value(const char *field, const char *v, size_t max, bool may_be_empty)
{
    size_t n = strlen(v);
    if (!n && !may_be_empty)
        return err_set(EINVAL, "%s is empty", field);
    if (n > max)
        return err_set(EINVAL, "%s is %zu bytes long; at most %zu are allowed", field, n, max);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)v[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return err_set(EINVAL,
                           "%s holds a control character (byte %zu), which an HTTP header "
                           "cannot carry",
                           field, i);
    }
    if (n && (isspace((unsigned char)v[0]) || isspace((unsigned char)v[n - 1])))
        return err_set(EINVAL, "%s starts or ends with white space; give it without", field);
    return 0;
}

static int check_header_name(const char *field, const char *name)
{
    size_t n = strlen(name);
    if (!n || n > MAX_HEADER_NAME)
        return err_set(EINVAL, "%s must be a header name of 1 to %d characters", field,
                       MAX_HEADER_NAME);
    for (size_t i = 0; i < n; i++)
        if (!is_tchar(name[i]))
            return err_set(EINVAL,
                           "%s: '%.*s' is not a header name (letters, digits and !#$%%&'*+-.^_`|~)",
                           field, (int)MIN(n, 64), name);
    if (reserved_header(name))
        return err_set(EINVAL,
                       "%s: a secret cannot set '%s', which frames the request or the "
                       "connection",
                       field, name);
    return 0;
}

/* Whether the path holds a "." or ".." segment, literally or percent-encoded, or a
 * backslash: servers resolve those, and a prefix could then be left after the check. */
static bool path_has_dot_segment(const char *p, size_t n)
{
    char seg[8];
    size_t len = 0;
    bool in_seg = false;
    for (size_t i = 0; i <= n; i++) {
        char c = i < n ? p[i] : '/';
        if (c == '?' || c == '#')
            c = '/', n = i;
        if (c == '%' && i + 2 < n) {
            char hex[3] = {p[i + 1], p[i + 2], 0};
            long v = strtol(hex, NULL, 16);
            if (isxdigit((unsigned char)hex[0]) && isxdigit((unsigned char)hex[1])) {
                c = (char)v;
                i += 2;
            }
        }
        if (c == '\\')
            return true;
        if (c == '/') {
            if (in_seg && ((len == 1 && seg[0] == '.') || (len == 2 && !memcmp(seg, "..", 2))))
                return true;
            len = 0;
            in_seg = true;
            continue;
        }
        if (len < sizeof(seg))
            seg[len] = c;
        len++;
    }
    return false;
}

static int check_path_prefix(const char *field, const char *p)
{
    size_t n = strlen(p);
    if (!n || p[0] != '/' || n > MAX_PATH_PREFIX)
        return err_set(EINVAL, "%s must start with '/' and be at most %d characters", field,
                       MAX_PATH_PREFIX);
    for (size_t i = 0; i < n; i++)
        if (p[i] <= 0x20 || p[i] >= 0x7f || p[i] == '?' || p[i] == '#')
            return err_set(EINVAL,
                           "%s: '%.*s' is not a URL path (visible ASCII, no query or "
                           "fragment)",
                           field, (int)MIN(n, 200), p);
    if (path_has_dot_segment(p, n))
        return err_set(EINVAL, "%s: '%.*s' has a '.' or '..' segment or a backslash", field,
                       (int)MIN(n, 200), p);
    return 0;
}

static const char *const secret_fields[] = {"host",  "header",      "value",
                                            "basic", "path_prefix", "allow_http"};

static int check_keys(const char *field, json_t *o, const char *const *keys, size_t n)
{
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v)
    {
        bool known = false;
        for (size_t i = 0; i < n && !known; i++)
            known = !strcmp(k, keys[i]);
        if (!known)
            return err_set(EINVAL, "%s: unknown field '%.64s'", field, k);
    }
    return 0;
}

/* The string at o.key (required or not), or an error naming field.key. */
static int get_string(const char *field, json_t *o, const char *key, bool required,
                      const char **ret)
{
    json_t *v = json_object_get(o, key);
    *ret = NULL;
    if (!v || json_is_null(v)) {
        if (required)
            return err_set(EINVAL, "%s.%s is missing", field, key);
        return 0;
    }
    if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
        return err_set(EINVAL, "%s.%s must be a string (without NUL bytes)", field, key);
    *ret = json_string_value(v);
    return 0;
}

static void set_token(struct net_secret *s)
{
    const char *sp = strchr(s->value, ' ');
    const char *t = sp ? sp + 1 : s->value;
    while (*t == ' ')
        t++;
    s->token = strlen(t) >= SCRUB_MIN && t != s->value ? xstrdup(t) : NULL;
}

static int parse_basic(const char *field, json_t *basic, struct net_secret *s)
{
    static const char *const keys[] = {"user", "password"};
    _cleanup_free_ char *f = xasprintf("%s.basic", field);
    const char *user, *password;
    int r;
    if (!json_is_object(basic))
        return err_set(EINVAL, "%s must be an object {\"user\": ..., \"password\": ...}", f);
    if ((r = check_keys(f, basic, keys, ARRAY_SIZE(keys))) < 0 ||
        (r = get_string(f, basic, "user", true, &user)) < 0 ||
        (r = get_string(f, basic, "password", true, &password)) < 0)
        return r;
    _cleanup_free_ char *fu = xasprintf("%s.user", f), *fp = xasprintf("%s.password", f);
    if ((r = check_value(fu, user, NET_SECRET_VALUE_MAX / 2, true)) < 0 ||
        (r = check_value(fp, password, NET_SECRET_VALUE_MAX / 2, true)) < 0)
        return r;
    if (strchr(user, ':'))
        return err_set(EINVAL,
                       "%s cannot hold ':' (basic auth puts one between user and "
                       "password)",
                       fu);
    size_t n = strlen(user) + 1 + strlen(password), len;
    char *plain = xmalloc(n + 1);
    snprintf(plain, n + 1, "%s:%s", user, password);
    char *b64 = base64_encode(plain, n, &len);
    explicit_bzero(plain, n);
    free(plain);
    s->kind = NET_SECRET_BASIC;
    s->header = xstrdup("Authorization");
    s->value = xasprintf("Basic %s", b64);
    explicit_bzero(b64, len);
    free(b64);
    s->password = strlen(password) >= SCRUB_MIN ? xstrdup(password) : NULL;
    set_token(s);
    return 0;
}

static int parse_secret(const char *field, json_t *o, struct net_secret *s)
{
    const char *host, *header, *value, *prefix;
    int r;
    memset(s, 0, sizeof(*s));
    if (!json_is_object(o))
        return err_set(EINVAL,
                       "%s must be an object {\"host\", \"header\", \"value\"} or "
                       "{\"host\", \"basic\"}",
                       field);
    if ((r = check_keys(field, o, secret_fields, ARRAY_SIZE(secret_fields))) < 0 ||
        (r = get_string(field, o, "host", true, &host)) < 0 ||
        (r = get_string(field, o, "header", false, &header)) < 0 ||
        (r = get_string(field, o, "value", false, &value)) < 0 ||
        (r = get_string(field, o, "path_prefix", false, &prefix)) < 0)
        return r;
    json_t *basic = json_object_get(o, "basic"), *http = json_object_get(o, "allow_http");
    if (http && !json_is_boolean(http))
        return err_set(EINVAL, "%s.allow_http must be true or false", field);
    s->allow_http = json_is_true(http);
    if (net_entry_parse(host, &s->host) < 0)
        return err_set(EINVAL, "%s.host: %s", field, err_msg());
    if (prefix) {
        _cleanup_free_ char *f = xasprintf("%s.path_prefix", field);
        if ((r = check_path_prefix(f, prefix)) < 0)
            return r;
        s->path_prefix = xstrdup(prefix);
    }
    if (basic && !json_is_null(basic)) {
        if (header || value)
            return err_set(EINVAL,
                           "%s: give either \"basic\" or \"header\" and \"value\", "
                           "not both",
                           field);
        return parse_basic(field, basic, s);
    }
    if (!header || !value)
        return err_set(EINVAL,
                       "%s needs \"header\" and \"value\" (or \"basic\": {\"user\", "
                       "\"password\"})",
                       field);
    _cleanup_free_ char *fh = xasprintf("%s.header", field), *fv = xasprintf("%s.value", field);
    if ((r = check_header_name(fh, header)) < 0 ||
        (r = check_value(fv, value, NET_SECRET_VALUE_MAX, false)) < 0)
        return r;
    s->kind = NET_SECRET_HEADER;
    s->header = xstrdup(header);
    s->value = xstrdup(value);
    set_token(s);
    return 0;
}

static bool same_slot(const struct net_secret *a, const struct net_secret *b)
{
    return !strcmp(a->host.text, b->host.text) && !strcasecmp(a->header, b->header) &&
           !strcmp(a->path_prefix ? a->path_prefix : "", b->path_prefix ? b->path_prefix : "");
}

/* Appends the secrets of arr (field names them in errors) to *s. */
static int secrets_append(struct net_secrets *s, const json_t *arr, const char *field)
{
    size_t i;
    json_t *item;
    if (!json_is_array(arr))
        return err_set(EINVAL, "%s must be an array of secrets", field);
    if (s->n + json_array_size(arr) > NET_MAX_SECRETS)
        return err_set(EINVAL, "%s: a session holds at most %d secrets", field, NET_MAX_SECRETS);
    s->v = xrealloc(s->v, (s->n + json_array_size(arr) + 1) * sizeof(*s->v));
    json_array_foreach(arr, i, item)
    {
        char name[64];
        snprintf(name, sizeof(name), "%s[%zu]", field, i);
        struct net_secret *sec = &s->v[s->n];
        int r = parse_secret(name, item, sec);
        if (r < 0) {
            secret_release(sec);
            return r;
        }
        for (size_t j = 0; j < s->n; j++)
            if (same_slot(&s->v[j], sec)) {
                secret_release(sec);
                return err_set(EINVAL,
                               "%s sets the same header for the same host and path prefix "
                               "as another secret",
                               name);
            }
        s->n++;
    }
    return 0;
}

/* The port of a secret's TLS connections: its entry's, else 443. */
static uint16_t tls_port(const struct net_secret *s)
{
    return s->host.port ? s->host.port : 443;
}

int net_secrets_check(const struct net_secrets *s, const struct net_policy *allow)
{
    for (size_t i = 0; s && i < s->n; i++) {
        const struct net_secret *sec = &s->v[i];
        if (!allow)
            return err_set(EINVAL,
                           "secret for %s: the session has no network; give it an "
                           "allowlist that names %s (a secret does not allow its host by "
                           "itself)",
                           sec->host.text, sec->host.text);
        if (!net_policy_covering(allow, &sec->host, tls_port(sec)))
            return err_set(EINVAL,
                           "secret for %s: %s port %u is not on the network allowlist; add "
                           "'%s' to it (a secret does not allow its host by itself)",
                           sec->host.text, sec->host.text, tls_port(sec), sec->host.text);
    }
    return 0;
}

int net_secrets_from_json(const json_t *arr, const struct net_policy *allow,
                          struct net_secrets **ret)
{
    *ret = NULL;
    if (!arr || json_is_null(arr))
        return 0;
    struct net_secrets *s = xcalloc(1, sizeof(*s));
    int r = secrets_append(s, arr, "secrets");
    if (r == 0)
        r = net_secrets_check(s, allow);
    if (r < 0) {
        net_secrets_free(s);
        return r;
    }
    *ret = s;
    return 0;
}

/* ---- what may be shown ---- */

json_t *net_secrets_json(const struct net_secrets *s)
{
    json_t *a = json_array();
    for (size_t i = 0; s && i < s->n; i++) {
        const struct net_secret *sec = &s->v[i];
        json_t *o = json_pack("{s:s,s:s,s:s,s:b}", "host", sec->host.text, "header", sec->header,
                              "kind", sec->kind == NET_SECRET_BASIC ? "basic" : "header",
                              "allow_http", sec->allow_http);
        if (sec->path_prefix)
            json_object_set_new(o, "path_prefix", json_string(sec->path_prefix));
        json_array_append_new(a, o);
    }
    return a;
}

json_t *net_secrets_export(const struct net_secrets *s)
{
    json_t *a = json_array();
    for (size_t i = 0; s && i < s->n; i++) {
        const struct net_secret *sec = &s->v[i];
        json_t *o = json_pack("{s:s,s:b}", "host", sec->host.text, "allow_http", sec->allow_http);
        size_t n = 0;
        const char *b64 = sec->value + strlen("Basic ");
        unsigned char *pair =
            sec->kind == NET_SECRET_BASIC ? base64_decode(b64, strlen(b64), &n) : NULL;
        char *colon = pair ? memchr(pair, ':', n) : NULL;
        if (colon) {
            /* The user has no ':' (net_secrets_from_json): the first one ends it. */
            json_object_set_new(o, "basic",
                                json_pack("{s:s%,s:s%}", "user", (char *)pair,
                                          (size_t)((unsigned char *)colon - pair), "password",
                                          colon + 1, n - (size_t)(colon + 1 - (char *)pair)));
        } else {
            json_object_set_new(o, "header", json_string(sec->header));
            json_object_set_new(o, "value", json_string(sec->value));
        }
        if (pair) {
            explicit_bzero(pair, n);
            free(pair);
        }
        if (sec->path_prefix)
            json_object_set_new(o, "path_prefix", json_string(sec->path_prefix));
        json_array_append_new(a, o);
    }
    return a;
}

static size_t mask(char *buf, size_t len, const char *needle)
{
    size_t n = needle ? strlen(needle) : 0, count = 0;
    if (!n)
        return 0;
    for (char *p = buf; (p = memmem(p, len - (size_t)(p - buf), needle, n));) {
        memset(p, '*', n);
        p += n;
        count++;
    }
    return count;
}

size_t net_secrets_scrub(const struct net_secrets *s, char *buf, size_t len)
{
    size_t count = 0;
    for (size_t i = 0; s && buf && i < s->n; i++) {
        count += mask(buf, len, s->v[i].value);
        count += mask(buf, len, s->v[i].token);
        count += mask(buf, len, s->v[i].password);
    }
    return count;
}

static void wipe_string(json_t *v)
{
    if (json_is_string(v))
        explicit_bzero((char *)json_string_value(v), json_string_length(v));
}

void net_secrets_json_wipe(json_t *arr)
{
    size_t i;
    json_t *item;
    if (!json_is_array(arr))
        return;
    json_array_foreach(arr, i, item)
    {
        json_t *basic = json_object_get(item, "basic");
        wipe_string(json_object_get(item, "value"));
        wipe_string(json_object_get(basic, "user"));
        wipe_string(json_object_get(basic, "password"));
    }
}

/* ---- choosing the secrets of a request ---- */

static bool port_fits(const struct net_secret *s, uint16_t port, bool tls)
{
    if (!tls && !s->allow_http)
        return false;
    return s->host.port ? s->host.port == port : port == (tls ? 443 : 80);
}

bool net_secrets_for_host(const struct net_secrets *s, const char *host, uint16_t port, bool tls)
{
    for (size_t i = 0; s && i < s->n; i++)
        if (port_fits(&s->v[i], port, tls) && net_entry_names(&s->v[i].host, host))
            return true;
    return false;
}

static bool prefix_fits(const struct net_secret *s, const char *path, size_t path_len,
                        bool ambiguous)
{
    if (!s->path_prefix)
        return true;
    size_t n = strlen(s->path_prefix);
    return !ambiguous && path_len >= n && !memcmp(path, s->path_prefix, n);
}

size_t net_secrets_select(const struct net_secrets *s, const char *host, uint16_t port, bool tls,
                          const char *path, size_t path_len, const struct net_secret **ret,
                          size_t max)
{
    size_t n = 0;
    bool ambiguous = path_has_dot_segment(path, path_len);
    for (size_t i = 0; s && i < s->n; i++) {
        const struct net_secret *sec = &s->v[i];
        if (!port_fits(sec, port, tls) || !net_entry_names(&sec->host, host) ||
            !prefix_fits(sec, path, path_len, ambiguous))
            continue;
        /* One value per header: the secret with the longest prefix wins. */
        size_t j;
        for (j = 0; j < n && strcasecmp(ret[j]->header, sec->header); j++)
            ;
        if (j < n) {
            size_t mine = sec->path_prefix ? strlen(sec->path_prefix) : 0;
            size_t theirs = ret[j]->path_prefix ? strlen(ret[j]->path_prefix) : 0;
            if (mine > theirs)
                ret[j] = sec;
        } else if (n < max) {
            ret[n++] = sec;
        }
    }
    return n;
}

/* ---- changing a running session's rules ---- */

static int strings_of(const json_t *arr, const char *field, char ***ret)
{
    size_t i;
    json_t *v;
    if (!json_is_array(arr))
        return err_set(EINVAL, "%s must be an array of strings", field);
    char **out = xcalloc(1, sizeof(char *));
    json_array_foreach(arr, i, v)
    {
        if (!json_is_string(v)) {
            strv_free(out);
            return err_set(EINVAL, "%s[%zu] is not a string", field, i);
        }
        out = strv_push(out, json_string_value(v));
    }
    *ret = out;
    return 0;
}

/* The allowlist entries of p as text, or of the change's "allow" when it replaces them, then
 * edited by allow_add and allow_remove. */
static int change_allow(const struct net_policy *p, const json_t *change, char ***ret)
{
    const json_t *all = json_object_get(change, "allow"),
                 *add = json_object_get(change, "allow_add"),
                 *rm = json_object_get(change, "allow_remove");
    char **v = NULL;
    int r;
    if (all && (add || rm))
        return err_set(EINVAL, "give either \"allow\" (the whole list) or \"allow_add\" and "
                               "\"allow_remove\", not both");
    if (all) {
        if ((r = strings_of(all, "allow", &v)) < 0)
            return r;
        *ret = v;
        return 0;
    }
    v = xcalloc(1, sizeof(char *));
    for (size_t i = 0; p && i < p->n; i++)
        v = strv_push(v, p->entries[i].text);
    _cleanup_strv_ char **adds = NULL, **rms = NULL;
    if ((add && (r = strings_of(add, "allow_add", &adds)) < 0) ||
        (rm && (r = strings_of(rm, "allow_remove", &rms)) < 0)) {
        strv_free(v);
        return r;
    }
    for (char **a = adds; a && *a; a++)
        v = strv_push(v, *a);
    for (size_t k = 0; rms && rms[k]; k++) {
        struct net_entry want;
        if (net_entry_parse(rms[k], &want) < 0) {
            strv_free(v);
            return err_set(EINVAL, "allow_remove[%zu]: %s", k, err_msg());
        }
        size_t n = strv_len(v), out = 0;
        for (size_t i = 0; i < n; i++) {
            struct net_entry have;
            bool same = net_entry_parse(v[i], &have) == 0 && !strcmp(have.text, want.text);
            net_entry_release(&have);
            if (same)
                free(v[i]);
            else
                v[out++] = v[i];
        }
        v[out] = NULL;
        if (out == n) {
            r = err_set(EINVAL, "allow_remove[%zu]: '%s' is not on the allowlist", k, want.text);
            net_entry_release(&want);
            strv_free(v);
            return r;
        }
        net_entry_release(&want);
    }
    *ret = v;
    return 0;
}

/* Removes from s the secrets a removal item names. */
static int remove_secrets(struct net_secrets *s, const json_t *item, size_t k)
{
    static const char *const keys[] = {"host", "header", "path_prefix"};
    char field[48];
    const char *host, *header, *prefix;
    struct net_entry want;
    int r;
    snprintf(field, sizeof(field), "secrets_remove[%zu]", k);
    if (!json_is_object(item))
        return err_set(EINVAL, "%s must be an object {\"host\", \"header\", \"path_prefix\"}",
                       field);
    if ((r = check_keys(field, (json_t *)item, keys, ARRAY_SIZE(keys))) < 0 ||
        (r = get_string(field, (json_t *)item, "host", true, &host)) < 0 ||
        (r = get_string(field, (json_t *)item, "header", false, &header)) < 0 ||
        (r = get_string(field, (json_t *)item, "path_prefix", false, &prefix)) < 0)
        return r;
    if (net_entry_parse(host, &want) < 0)
        return err_set(EINVAL, "%s.host: %s", field, err_msg());
    size_t out = 0, before = s->n;
    for (size_t i = 0; i < s->n; i++) {
        struct net_secret *sec = &s->v[i];
        bool hit = !strcmp(sec->host.text, want.text) &&
                   (!header || !strcasecmp(header, sec->header)) &&
                   (!prefix || !strcmp(prefix, sec->path_prefix ? sec->path_prefix : ""));
        if (hit)
            secret_release(sec);
        else
            s->v[out++] = *sec;
    }
    s->n = out;
    r = out < before ? 0
                     : err_set(EINVAL, "%s: no secret for %s%s%s matches", field, want.text,
                               header ? " with header " : "", header ? header : "");
    net_entry_release(&want);
    return r;
}

static int change_secrets(const struct net_secrets *cur, const json_t *change,
                          struct net_secrets **ret)
{
    const json_t *all = json_object_get(change, "secrets"),
                 *add = json_object_get(change, "secrets_add"),
                 *rm = json_object_get(change, "secrets_remove");
    int r = 0;
    if (all && (add || rm))
        return err_set(EINVAL, "give either \"secrets\" (all of them) or \"secrets_add\" and "
                               "\"secrets_remove\", not both");
    struct net_secrets *s = all ? xcalloc(1, sizeof(*s)) : net_secrets_copy(cur);
    if (!s)
        s = xcalloc(1, sizeof(*s));
    if (all && !json_is_null(all))
        r = secrets_append(s, all, "secrets");
    if (r == 0 && rm) {
        size_t k;
        json_t *item;
        if (!json_is_array(rm))
            r = err_set(EINVAL, "secrets_remove must be an array");
        json_array_foreach(rm, k, item)
        {
            if (r == 0)
                r = remove_secrets(s, item, k);
        }
    }
    if (r == 0 && add)
        r = secrets_append(s, add, "secrets_add");
    if (r < 0) {
        net_secrets_free(s);
        return r;
    }
    *ret = s;
    return 0;
}

int net_rules_change(const struct net_policy *p, const struct net_secrets *s, const json_t *change,
                     const struct net_policy *max, struct net_policy **ret_p,
                     struct net_secrets **ret_s)
{
    static const char *const keys[] = {"allow",       "allow_add",      "allow_remove", "secrets",
                                       "secrets_add", "secrets_remove", "internet"};
    _cleanup_strv_ char **allow = NULL;
    struct net_policy *np = NULL;
    struct net_secrets *ns = NULL;
    int r;
    if (!json_is_object(change))
        return err_set(EINVAL, "a network change is an object with \"allow\", \"allow_add\", "
                               "\"allow_remove\", \"secrets\", \"secrets_add\" or "
                               "\"secrets_remove\"");
    if ((r = check_keys("network change", (json_t *)change, keys, ARRAY_SIZE(keys))) < 0)
        return r;
    json_t *internet = json_object_get(change, "internet");
    if (internet && !json_is_boolean(internet))
        return err_set(EINVAL, "internet: true or false");
    if ((r = change_allow(p, change, &allow)) < 0)
        return r;
    if ((r = net_policy_parse((const char *const *)allow, strv_len(allow), &np)) < 0)
        return r;
    if (p) {
        np->max_connections = p->max_connections;
        np->max_bytes = p->max_bytes;
    }
    np->internet = internet ? json_is_true(internet) : p && p->internet;
    if (!net_policy_within(np, max)) {
        r = -EINVAL;
        goto fail;
    }
    if ((r = change_secrets(s, change, &ns)) < 0 || (r = net_secrets_check(ns, np)) < 0)
        goto fail;
    if (!ns->n) {
        net_secrets_free(ns);
        ns = NULL;
    }
    *ret_p = np;
    *ret_s = ns;
    return 0;
fail:
    net_policy_free(np);
    net_secrets_free(ns);
    return r;
}
