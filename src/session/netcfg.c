/* netcfg.c - the sandbox side of a network policy: the session's egress proxy, the bind of
 * its socket, the relay and the variables that point clients at it; and the checks of a
 * request's network options. */
#include "session/session-int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static void on_egress(void *ctx, const struct egress_event *ev)
{
    struct event_log *log = ctx;
    json_t *j = json_pack("{s:s,s:s?,s:s?,s:i,s:b,s:s?,s:s?,s:s?,s:i,s:s*,s:s*}", "type", "network",
                          "method", ev->method, "host", ev->host, "port", (int)ev->port, "allowed",
                          ev->allowed, "rule", ev->rule, "address", ev->address, "reason",
                          ev->reason, "status", ev->status, "path", ev->path, "secret", ev->secret);
    if (j && ev->intercepted)
        json_object_set_new(j, "intercepted", json_true());
    if (j)
        event_log_add(log, j);
}

int sandbox_net_start(struct sandbox_net *sn, const struct net_opts *n, struct workspace *ws,
                      struct event_log *log)
{
    memset(sn, 0, sizeof(*sn));
    sn->log = log;
    sn->env_extra = xcalloc(1, sizeof(char *));
    for (char *const *e = n->env; e && *e; e++)
        sn->env_extra = strv_push(sn->env_extra, *e);
    if (!n->policy)
        return 0;
    _cleanup_free_ char *dir = workspace_aside_path(ws, "egress");
    int r = egress_new(dir, n->policy, n->secrets, on_egress, log, &sn->egress);
    if (r < 0)
        return r;
    sn->binds[0] = egress_dir(sn->egress);
    sn->binds[1] = NET_SANDBOX_DIR;
    sn->env_extra = net_proxy_env(n->policy, sn->env_extra);
    if (egress_has_ca(sn->egress)) {
        /* The session's CA, trusted in the sandbox alone: its bundle (this host's roots plus
         * the CA) over the system's, and the variables clients read. */
        sn->env_extra = net_ca_env(sn->env_extra);
        if (access(NET_SYSTEM_BUNDLE, F_OK) == 0) {
            sn->bundle = xasprintf("%s/%s", egress_dir(sn->egress), NET_BUNDLE_NAME);
            sn->binds[2] = sn->bundle;
            sn->binds[3] = NET_SYSTEM_BUNDLE;
        }
    }
    if (n->index_url) {
        _cleanup_free_ char *line = xasprintf("PIP_INDEX_URL=%s", n->index_url);
        sn->env_extra = strv_push(sn->env_extra, line);
    }
    return 0;
}

void sandbox_net_stop(struct sandbox_net *sn)
{
    egress_free(sn->egress);
    strv_free(sn->env_extra);
    free(sn->bundle);
    memset(sn, 0, sizeof(*sn));
}

char **sandbox_net_apply(const struct sandbox_net *sn, struct sandbox_spec *spec,
                         const char **binds_storage, size_t storage_len,
                         const char *const *extra_binds)
{
    char **env = sandbox_default_env();
    size_t n = 0;
    for (const char *const *b = extra_binds; b && b[0] && n + 3 < storage_len; b += 2) {
        binds_storage[n++] = b[0];
        binds_storage[n++] = b[1];
    }
    for (size_t i = 0;
         sn && sn->egress && i + 1 < ARRAY_SIZE(sn->binds) && sn->binds[i] && n + 3 < storage_len;
         i += 2) {
        binds_storage[n++] = sn->binds[i];
        binds_storage[n++] = sn->binds[i + 1];
    }
    if (sn && sn->egress) {
        spec->relay_socket = NET_SANDBOX_SOCKET;
        spec->relay_port = NET_RELAY_PORT;
    }
    binds_storage[n] = NULL;
    spec->ro_binds = binds_storage;
    for (char **e = sn ? sn->env_extra : NULL; e && *e; e++)
        env = strv_push(env, *e);
    spec->env = env;
    return env;
}

/* Host and port of an http(s) URL, for checking it against the policy. */
static int url_host_port(const char *url, char *host, size_t host_len, uint16_t *ret_port)
{
    bool https = !strncasecmp(url, "https://", 8);
    if (!https && strncasecmp(url, "http://", 7))
        return -EINVAL;
    const char *auth = url + (https ? 8 : 7);
    size_t alen = strcspn(auth, "/?#");
    const char *at = memchr(auth, '@', alen);
    if (at) {
        alen -= (size_t)(at + 1 - auth);
        auth = at + 1;
    }
    const char *colon = auth[0] == '[' ? memchr(auth, ']', alen) : auth;
    colon = colon ? memchr(colon, ':', alen - (size_t)(colon - auth)) : NULL;
    size_t hlen = colon ? (size_t)(colon - auth) : alen;
    uint64_t port = https ? 443 : 80;
    if (colon) {
        char digits[8];
        size_t plen = alen - hlen - 1;
        if (!plen || plen >= sizeof(digits))
            return -EINVAL;
        memcpy(digits, colon + 1, plen);
        digits[plen] = '\0';
        if (parse_u64(digits, &port) < 0 || !port || port > 65535)
            return -EINVAL;
    }
    if (!hlen || hlen >= host_len)
        return -EINVAL;
    snprintf(host, host_len, "%.*s", (int)hlen, auth);
    *ret_port = (uint16_t)port;
    return 0;
}

static int check_index_url(const struct net_opts *n)
{
    char host[256];
    uint16_t port;
    if (strpbrk(n->index_url, " \t\r\n") ||
        url_host_port(n->index_url, host, sizeof(host), &port) < 0)
        return err_set(EINVAL, "index URL '%s' is not an http:// or https:// URL", n->index_url);
    if (!n->policy)
        return err_set(EINVAL,
                       "index URL '%s' needs a network allowlist that includes "
                       "its host",
                       n->index_url);
    if (!net_policy_match(n->policy, host, port))
        return err_set(EINVAL,
                       "index URL '%s': %s port %u is not on the network allowlist; "
                       "add '%s:%u'",
                       n->index_url, host, port, host, port);
    return 0;
}

int net_opts_check(const struct net_opts *n)
{
    size_t count = strv_len(n->packages);
    if (count && !n->policy)
        return err_set(EINVAL,
                       "packages can only be installed with a network allowlist that "
                       "reaches a package index (network mode 'allowlist'; --net allow:...)");
    if (count > MAX_PACKAGES)
        return err_set(EINVAL, "%zu packages requested; at most %d", count, MAX_PACKAGES);
    for (char *const *e = n->env; e && *e; e++) {
        size_t name = strcspn(*e, "=");
        if (!name || !(*e)[name] ||
            strspn(*e, "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                       "abcdefghijklmnopqrstuvwxyz0123456789_") != name ||
            ((*e)[0] >= '0' && (*e)[0] <= '9'))
            return err_set(EINVAL, "'%.*s' is not a NAME=VALUE variable", (int)MIN(name, 64), *e);
    }
    for (char *const *p = n->packages; p && *p; p++) {
        size_t len = strlen(*p);
        if (!len || len > 256 || (*p)[0] == '-' || strpbrk(*p, "\r\n\t"))
            return err_set(EINVAL,
                           "package '%s' is not a requirement such as 'name' or "
                           "'name==1.2' (no pip options, no line breaks, at most 256 "
                           "characters)",
                           *p);
    }
    return n->index_url ? check_index_url(n) : 0;
}

/* ---- a live session's network: what it is, changing it, and keeping secrets out of records ----
 */

json_t *session_network_json(struct session *s)
{
    struct sandbox_net *sn = session_sandbox_net(s);
    if (!sn->egress)
        return net_policy_json(NULL);
    return egress_rules_json(sn->egress);
}

void session_network_copy(struct session *s, struct net_policy **ret_p, struct net_secrets **ret_s)
{
    struct sandbox_net *sn = session_sandbox_net(s);
    *ret_p = NULL;
    *ret_s = NULL;
    if (sn->egress)
        egress_rules_copy(sn->egress, ret_p, ret_s);
}

int session_network_change(struct session *s, const json_t *change, const struct net_policy *max)
{
    struct sandbox_net *sn = session_sandbox_net(s);
    if (!sn->egress)
        return err_set(ENOTSUP,
                       "this session has no network (mode none): only a session created with "
                       "an allowlist has an egress proxy whose rules can change; create it with "
                       "network {\"mode\": \"allowlist\", \"allow\": [...]}");
    if (json_object_get(change, "internet"))
        return err_set(EINVAL, "internet: not a field of a network change; list the hosts in "
                               "allow");
    int r = egress_change(sn->egress, change, max);
    if (r == 0)
        session_network_changed(s);
    return r;
}

int session_network_replace(struct session *s, const struct net_policy *p,
                            const struct net_policy *max)
{
    struct sandbox_net *sn = session_sandbox_net(s);
    if (!sn->egress)
        return err_set(ENOTSUP, "the sandbox was made without a network, so there is no egress "
                                "proxy to change: make it with one (an allowlist or the "
                                "internet) to change it later");
    json_t *allow = json_array();
    for (size_t i = 0; p && !p->internet && i < p->n; i++)
        json_array_append_new(allow, json_string(p->entries[i].text));
    json_t *change = json_pack("{s:o,s:b}", "allow", allow, "internet", p && p->internet);
    int r = egress_change(sn->egress, change, max);
    json_decref(change);
    if (r == 0)
        session_network_changed(s);
    return r;
}

/* n bytes of data (NULs and all) and a NUL after them; caller frees. */
static char *memdup(const char *data, size_t n)
{
    char *copy = xmalloc(n + 1);
    memcpy(copy, data, n);
    copy[n] = '\0';
    return copy;
}

static void scrub_outcap(struct egress *e, struct outcap *c)
{
    egress_scrub(e, c->head.data, c->head.len);
    if (c->tail)
        egress_scrub(e, c->tail, c->tail_size);
}

/* Masks the secrets in every string below j (a result bundle, the error). */
static void scrub_json(struct egress *e, json_t *j)
{
    const char *key;
    size_t i;
    json_t *v;
    if (json_is_string(j)) {
        size_t n = json_string_length(j);
        char *copy = memdup(json_string_value(j), n);
        if (egress_scrub(e, copy, n))
            json_string_setn(j, copy, n);
        free(copy);
    } else if (json_is_object(j)) {
        json_object_foreach(j, key, v)
        {
            scrub_json(e, v);
        }
    } else if (json_is_array(j)) {
        json_array_foreach(j, i, v)
        {
            scrub_json(e, v);
        }
    }
}

char *sandbox_net_scrub_copy(struct sandbox_net *sn, const char *data, size_t n)
{
    if (!sn || !sn->egress || !egress_has_secrets(sn->egress))
        return NULL;
    char *copy = memdup(data, n);
    if (egress_scrub(sn->egress, copy, n))
        return copy;
    free(copy);
    return NULL;
}

void sandbox_net_scrub_json(struct sandbox_net *sn, json_t *j)
{
    if (sn && sn->egress && egress_has_secrets(sn->egress))
        scrub_json(sn->egress, j);
}

void sandbox_net_scrub_record(struct sandbox_net *sn, struct exec_record *rec)
{
    if (!sn || !sn->egress || !egress_has_secrets(sn->egress))
        return;
    scrub_outcap(sn->egress, &rec->out);
    scrub_outcap(sn->egress, &rec->err);
    scrub_json(sn->egress, rec->results);
    scrub_json(sn->egress, rec->error);
    if (rec->message)
        egress_scrub(sn->egress, rec->message, strlen(rec->message));
}
