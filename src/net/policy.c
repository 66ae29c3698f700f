/* policy.c - egress allowlists: parsing entries, matching hosts and ports, telling public
 * addresses from private ones, and checking one policy against a server's cap. */
#include "net/net-int.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define MAX_NAME  253
#define MAX_LABEL 63

static bool is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* A DNS name of 1..253 characters in labels of 1..63 [a-z0-9-_] (already lower-case), not
 * starting or ending a label with '-', and not all digits and dots (a malformed IP). */
static bool valid_name(const char *s)
{
    size_t len = strlen(s), label = 0;
    bool alpha = false;
    if (!len || len > MAX_NAME)
        return false;
    for (size_t i = 0; i <= len; i++) {
        char c = s[i];
        if (c == '.' || !c) {
            if (!label || s[i - 1] == '-')
                return false;
            label = 0;
            continue;
        }
        if (!is_name_char(c) || (!label && c == '-') || ++label > MAX_LABEL)
            return false;
        if (!(c >= '0' && c <= '9'))
            alpha = true;
    }
    return alpha;
}

/* Lower-cases s in place and drops one trailing dot ("example.com." is "example.com"). */
static void normalize_name(char *s)
{
    for (char *p = s; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    size_t n = strlen(s);
    if (n > 1 && s[n - 1] == '.')
        s[n - 1] = '\0';
}

static int parse_port(const char *s, uint16_t *ret)
{
    uint64_t v;
    if (parse_u64(s, &v) < 0 || v < 1 || v > 65535)
        return -EINVAL;
    *ret = (uint16_t)v;
    return 0;
}

static bool parse_ip(const char *s, int *ret_family, unsigned char *ret_addr)
{
    if (inet_pton(AF_INET, s, ret_addr) == 1) {
        *ret_family = AF_INET;
        return true;
    }
    if (inet_pton(AF_INET6, s, ret_addr) == 1) {
        *ret_family = AF_INET6;
        return true;
    }
    return false;
}

static char *entry_text(const struct net_entry *e)
{
    const char *prefix = e->kind == NET_ENTRY_WILDCARD ? "*." : "";
    bool brackets = e->kind == NET_ENTRY_IP && e->family == AF_INET6 && e->port;
    if (!e->port)
        return xasprintf("%s%s", prefix, e->host);
    return xasprintf("%s%s%s%s:%u", prefix, brackets ? "[" : "", e->host, brackets ? "]" : "",
                     e->port);
}

/* Splits "host", "host:port", "[v6]:port" and bare "v6" into host and port. */
static int split_host_port(char *s, char **ret_host, const char **ret_port)
{
    char *colon;
    *ret_port = NULL;
    if (*s == '[') {
        char *close = strchr(s, ']');
        if (!close || (close[1] && close[1] != ':'))
            return -EINVAL;
        *close = '\0';
        *ret_host = s + 1;
        if (close[1] == ':')
            *ret_port = close + 2;
        return 0;
    }
    colon = strrchr(s, ':');
    if (colon && strchr(s, ':') == colon) {
        *colon = '\0';
        *ret_port = colon + 1;
    }
    *ret_host = s;
    return 0;
}

int net_entry_parse(const char *given, struct net_entry *e)
{
    _cleanup_free_ char *copy = xstrdup(given);
    char *s = copy, *host;
    const char *port;
    while (isspace((unsigned char)*s))
        s++;
    for (size_t n = strlen(s); n && isspace((unsigned char)s[n - 1]); n--)
        s[n - 1] = '\0';
    memset(e, 0, sizeof(*e));
    if (!*s)
        return err_set(EINVAL, "empty network allowlist entry");
    if (split_host_port(s, &host, &port) < 0)
        return err_set(EINVAL,
                       "network allowlist entry '%s': a bracketed IPv6 address is "
                       "'[ADDRESS]' or '[ADDRESS]:PORT'",
                       given);
    if (port && parse_port(port, &e->port) < 0)
        return err_set(EINVAL, "network allowlist entry '%s': '%s' is not a port (1 to 65535)",
                       given, port);
    normalize_name(host);
    if (parse_ip(host, &e->family, e->addr)) {
        e->kind = NET_ENTRY_IP;
    } else if (!strncmp(host, "*.", 2) && valid_name(host + 2)) {
        e->kind = NET_ENTRY_WILDCARD;
        host += 2;
    } else if (valid_name(host)) {
        e->kind = NET_ENTRY_HOST;
    } else {
        return err_set(EINVAL,
                       "network allowlist entry '%s': '%s' is not a host name, "
                       "'*.domain' or an IP address",
                       given, host);
    }
    e->host = xstrdup(host);
    e->text = entry_text(e);
    return 0;
}

void net_entry_release(struct net_entry *e)
{
    free(e->host);
    free(e->text);
}

void net_entry_copy(struct net_entry *dst, const struct net_entry *src)
{
    *dst = *src;
    dst->host = xstrdup(src->host);
    dst->text = xstrdup(src->text);
}

int net_policy_parse(const char *const *entries, size_t n, struct net_policy **ret)
{
    if (n > NET_MAX_ENTRIES)
        return err_set(EINVAL, "network allowlist has %zu entries; at most %d are allowed", n,
                       NET_MAX_ENTRIES);
    struct net_policy *p = xcalloc(1, sizeof(*p));
    p->entries = xcalloc(n ? n : 1, sizeof(*p->entries));
    for (size_t i = 0; i < n; i++) {
        int r = net_entry_parse(entries[i] ? entries[i] : "", &p->entries[i]);
        if (r < 0) {
            net_policy_free(p);
            return r;
        }
        p->n++;
    }
    *ret = p;
    return 0;
}

int net_policy_parse_list(const char *list, struct net_policy **ret)
{
    _cleanup_free_ char *copy = xstrdup(list);
    _cleanup_strv_ char **v = xcalloc(1, sizeof(char *));
    char *save = NULL;
    if (!*list)
        return err_set(EINVAL, "empty network allowlist: name at least one host");
    if (list[strlen(list) - 1] == ',' || *list == ',' || strstr(list, ",,"))
        return err_set(EINVAL, "network allowlist '%s' has an empty entry", list);
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        v = strv_push(v, tok);
    return net_policy_parse((const char *const *)v, strv_len(v), ret);
}

struct net_policy *net_policy_internet(void)
{
    struct net_policy *p = xcalloc(1, sizeof(*p));
    p->entries = xcalloc(1, sizeof(*p->entries));
    p->internet = true;
    return p;
}

struct net_policy *net_policy_copy(const struct net_policy *p)
{
    if (!p)
        return NULL;
    struct net_policy *c = xcalloc(1, sizeof(*c));
    *c = *p;
    c->entries = xcalloc(p->n ? p->n : 1, sizeof(*c->entries));
    for (size_t i = 0; i < p->n; i++)
        net_entry_copy(&c->entries[i], &p->entries[i]);
    return c;
}

void net_policy_free(struct net_policy *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->n; i++)
        net_entry_release(&p->entries[i]);
    free(p->entries);
    free(p);
}

static bool port_ok(const struct net_entry *e, uint16_t port)
{
    return e->port ? e->port == port : port == 80 || port == 443;
}

/* name is strictly below domain: "a.example.com" for "example.com", never "example.com"
 * itself nor "badexample.com". */
static bool is_subdomain(const char *name, const char *domain)
{
    size_t n = strlen(name), d = strlen(domain);
    return n > d + 1 && name[n - d - 1] == '.' && !strcmp(name + n - d, domain);
}

/* host as the policy compares it: without brackets, lower-case, without a trailing dot,
 * with its address when it is an IP literal. False when it cannot be a host at all. */
struct host_key {
    char name[MAX_NAME + 2];
    unsigned char addr[16];
    int family; /* 0: a name */
};

static bool host_key(const char *host, struct host_key *k)
{
    size_t len = strlen(host);
    if (!len || len > MAX_NAME + 1)
        return false;
    if (host[0] == '[' && host[len - 1] == ']')
        snprintf(k->name, sizeof(k->name), "%.*s", (int)(len - 2), host + 1);
    else
        snprintf(k->name, sizeof(k->name), "%s", host);
    normalize_name(k->name);
    k->family = 0;
    if (!parse_ip(k->name, &k->family, k->addr))
        k->family = 0;
    return true;
}

static bool entry_names(const struct net_entry *e, const struct host_key *k)
{
    if (k->family)
        return e->kind == NET_ENTRY_IP && e->family == k->family &&
               !memcmp(e->addr, k->addr, k->family == AF_INET ? 4 : 16);
    return (e->kind == NET_ENTRY_HOST && !strcmp(e->host, k->name)) ||
           (e->kind == NET_ENTRY_WILDCARD && is_subdomain(k->name, e->host));
}

bool net_entry_names(const struct net_entry *e, const char *host)
{
    struct host_key k;
    return host_key(host, &k) && entry_names(e, &k);
}

/* The first entry naming host (see net_policy_match) that allows port, or with any_port
 * the first naming host at all. */
static const struct net_entry *find_entry(const struct net_policy *p, const char *host,
                                          uint16_t port, bool any_port)
{
    struct host_key k;
    if (!p || !host_key(host, &k))
        return NULL;
    if (p->internet) {
        /* Any name a request can carry, on any port: the address it resolves to is what the
         * proxy judges (net_addr_allowed). */
        static const struct net_entry internet = {
            .kind = NET_ENTRY_WILDCARD, .host = (char *)"", .text = (char *)"internet"};
        return k.family || valid_name(k.name) ? &internet : NULL;
    }
    for (size_t i = 0; i < p->n; i++) {
        const struct net_entry *e = &p->entries[i];
        if ((any_port || port_ok(e, port)) && entry_names(e, &k))
            return e;
    }
    return NULL;
}

const struct net_entry *net_policy_match(const struct net_policy *p, const char *host,
                                         uint16_t port)
{
    return find_entry(p, host, port, false);
}

bool net_policy_lists_host(const struct net_policy *p, const char *host)
{
    return find_entry(p, host, 0, true) != NULL;
}

/* ---- addresses ---- */

/* One class of address that is not the public internet. The prefix is written as text so
 * the table reads like the registries it copies; it is parsed once. */
struct addr_class {
    int family;
    const char *prefix;
    int bits;
    const char *what;
    bool embeds_v4; /* the last 32 bits are an IPv4 address, judged as such */
};

/* The IANA IPv4 and IPv6 Special-Purpose Address Registries (RFC 6890 and the RFCs
 * registered since), with multicast, IPv4 class E and IPv6 site-local besides. Every entry
 * is refused unless named exactly, even those the registry marks globally reachable
 * (anycast relays, AS112): code in a sandbox has no business with them. First match wins,
 * so a narrower entry comes before the wider one that holds it. */
static const struct addr_class classes[] = {
    {AF_INET, "0.0.0.0", 8, "an unspecified ('this network') address"},
    {AF_INET, "10.0.0.0", 8, "a private address"},
    {AF_INET, "100.64.0.0", 10, "a shared (carrier-grade NAT) address"},
    {AF_INET, "127.0.0.0", 8, "a loopback address"},
    {AF_INET, "169.254.0.0", 16, "a link-local address (cloud metadata services live here)"},
    {AF_INET, "172.16.0.0", 12, "a private address"},
    {AF_INET, "192.0.0.0", 29, "an IPv4 service continuity (DS-Lite) address"},
    {AF_INET, "192.0.0.170", 31, "a NAT64 discovery address"},
    {AF_INET, "192.0.0.0", 24, "an IETF protocol address"},
    {AF_INET, "192.0.2.0", 24, "a documentation address"},
    {AF_INET, "192.31.196.0", 24, "an AS112 (DNS sink) address"},
    {AF_INET, "192.52.193.0", 24, "an AMT relay address"},
    {AF_INET, "192.88.99.0", 24, "a 6to4 relay anycast address"},
    {AF_INET, "192.168.0.0", 16, "a private address"},
    {AF_INET, "192.175.48.0", 24, "an AS112 (DNS sink) address"},
    {AF_INET, "198.18.0.0", 15, "a benchmarking address"},
    {AF_INET, "198.51.100.0", 24, "a documentation address"},
    {AF_INET, "203.0.113.0", 24, "a documentation address"},
    {AF_INET, "224.0.0.0", 4, "a multicast address"},
    {AF_INET, "255.255.255.255", 32, "a broadcast address"},
    {AF_INET, "240.0.0.0", 4, "a reserved address"},

    {AF_INET6, "::", 128, "an unspecified address"},
    {AF_INET6, "::1", 128, "a loopback address"},
    {AF_INET6, "::ffff:0:0", 96, NULL, true}, /* IPv4-mapped */
    {AF_INET6, "64:ff9b::", 96, NULL, true},  /* well-known NAT64 prefix */
    {AF_INET6, "64:ff9b:1::", 48, "a local-use NAT64 address (any IPv4 address behind it)"},
    {AF_INET6, "::", 8, "a reserved address (IPv4-compatible and other forms)"},
    {AF_INET6, "100::", 64, "a discard-only address"},
    {AF_INET6, "100:0:0:1::", 64, "a dummy prefix address"},
    {AF_INET6, "2001::", 32, "a Teredo address (an IPv4 address behind a tunnel)"},
    {AF_INET6, "2001:2::", 48, "a benchmarking address"},
    {AF_INET6, "2001:db8::", 32, "a documentation address"},
    {AF_INET6, "2001::", 23, "an IETF protocol address (ORCHID, AMT, AS112, anycast)"},
    {AF_INET6, "2002::", 16, "a 6to4 address (an IPv4 address behind a tunnel)"},
    {AF_INET6, "2620:4f:8000::", 48, "an AS112 (DNS sink) address"},
    {AF_INET6, "3fff::", 20, "a documentation address"},
    {AF_INET6, "5f00::", 16, "a segment routing (SRv6) address"},
    {AF_INET6, "fc00::", 7, "a private (unique local) address"},
    {AF_INET6, "fe80::", 10, "a link-local address"},
    {AF_INET6, "fec0::", 10, "a site-local address"},
    {AF_INET6, "ff00::", 8, "a multicast address"},
    /* The rest outside 2000::/3 (global unicast) is unassigned: nothing public lives there. */
    {AF_INET6, "::", 3, "a reserved address"},
    {AF_INET6, "4000::", 2, "a reserved address"},
    {AF_INET6, "8000::", 1, "a reserved address"},
};

static unsigned char class_addr[ARRAY_SIZE(classes)][16];
static pthread_once_t classes_once = PTHREAD_ONCE_INIT;

static void classes_parse(void)
{
    for (size_t i = 0; i < ARRAY_SIZE(classes); i++)
        if (inet_pton(classes[i].family, classes[i].prefix, class_addr[i]) != 1)
            memset(class_addr[i], 0xff, sizeof(class_addr[i])); /* a typo: the unit tests see it */
}

static bool prefix_match(const unsigned char *a, const unsigned char *net, int bits)
{
    int bytes = bits / 8, rest = bits % 8;
    if (memcmp(a, net, (size_t)bytes))
        return false;
    if (!rest)
        return true;
    unsigned char mask = (unsigned char)(0xff << (8 - rest));
    return (a[bytes] & mask) == (net[bytes] & mask);
}

/* What kind of special address a (4 or 16 bytes of family) is, or NULL when public. */
static const char *addr_class(int family, const unsigned char *a)
{
    pthread_once(&classes_once, classes_parse);
    for (size_t i = 0; i < ARRAY_SIZE(classes); i++) {
        const struct addr_class *c = &classes[i];
        if (c->family != family || !prefix_match(a, class_addr[i], c->bits))
            continue;
        return c->embeds_v4 ? addr_class(AF_INET, a + 12) : c->what;
    }
    return NULL;
}

static const char *v4_class(const unsigned char *a)
{
    return addr_class(AF_INET, a);
}

static const char *v6_class(const unsigned char *a)
{
    return addr_class(AF_INET6, a);
}

/* Whether an IP entry names exactly this address (an IPv4-mapped IPv6 address counts as
 * its IPv4 address) with this port. */
static bool named_exactly(const struct net_policy *p, int family, const unsigned char *a,
                          uint16_t port)
{
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (family == AF_INET6 && !memcmp(a, mapped, 12)) {
        family = AF_INET;
        a += 12;
    }
    for (size_t i = 0; i < p->n; i++) {
        const struct net_entry *e = &p->entries[i];
        if (e->kind == NET_ENTRY_IP && e->family == family && port_ok(e, port) &&
            !memcmp(e->addr, a, family == AF_INET ? 4 : 16))
            return true;
    }
    return false;
}

bool net_addr_allowed(const struct net_policy *p, const struct sockaddr *sa, uint16_t port,
                      const char **ret_why)
{
    const unsigned char *a;
    const char *what;
    if (sa->sa_family == AF_INET) {
        a = (const unsigned char *)&((const struct sockaddr_in *)sa)->sin_addr;
        what = v4_class(a);
    } else if (sa->sa_family == AF_INET6) {
        a = (const unsigned char *)&((const struct sockaddr_in6 *)sa)->sin6_addr;
        what = v6_class(a);
    } else {
        *ret_why = "not an internet address";
        return false;
    }
    if (!what || named_exactly(p, sa->sa_family, a, port))
        return true;
    *ret_why = what;
    return false;
}

bool net_policy_names_loopback(const struct net_policy *p)
{
    for (size_t i = 0; p && i < p->n; i++) {
        const struct net_entry *e = &p->entries[i];
        if (e->kind != NET_ENTRY_IP)
            continue;
        const char *what = e->family == AF_INET ? v4_class(e->addr) : v6_class(e->addr);
        if (what && strstr(what, "loopback"))
            return true;
    }
    return false;
}

/* ---- a server's cap ---- */

static bool ports_cover(const struct net_entry *max, const struct net_entry *e)
{
    if (!max->port)
        return !e->port || e->port == 80 || e->port == 443;
    return e->port == max->port;
}

static bool hosts_cover(const struct net_entry *max, const struct net_entry *e)
{
    switch (max->kind) {
    case NET_ENTRY_HOST:
        return e->kind == NET_ENTRY_HOST && !strcmp(e->host, max->host);
    case NET_ENTRY_WILDCARD:
        return (e->kind == NET_ENTRY_HOST && is_subdomain(e->host, max->host)) ||
               (e->kind == NET_ENTRY_WILDCARD &&
                (!strcmp(e->host, max->host) || is_subdomain(e->host, max->host)));
    case NET_ENTRY_IP:
        return e->kind == NET_ENTRY_IP && e->family == max->family &&
               !memcmp(e->addr, max->addr, e->family == AF_INET ? 4 : 16);
    }
    return false;
}

const struct net_entry *net_policy_covering(const struct net_policy *p, const struct net_entry *e,
                                            uint16_t port)
{
    for (size_t i = 0; p && i < p->n; i++)
        if (hosts_cover(&p->entries[i], e) && port_ok(&p->entries[i], port))
            return &p->entries[i];
    return NULL;
}

bool net_policy_within(const struct net_policy *req, const struct net_policy *max)
{
    if (!req || !max)
        return true;
    if (req->internet && !max->internet) {
        err_set(EPERM, "the public internet is wider than what this server allows");
        return false;
    }
    for (size_t i = 0; i < req->n; i++) {
        bool covered = false;
        for (size_t j = 0; j < max->n && !covered; j++)
            covered = hosts_cover(&max->entries[j], &req->entries[i]) &&
                      ports_cover(&max->entries[j], &req->entries[i]);
        if (!covered) {
            _cleanup_free_ char *allowed = NULL;
            struct buf b;
            buf_init(&b, 0);
            for (size_t j = 0; j < max->n; j++)
                buf_printf(&b, "%s%s", j ? ", " : "", max->entries[j].text);
            allowed = buf_detach(&b, NULL);
            err_set(EPERM,
                    "network allowlist entry '%s' is outside what this server allows "
                    "(%s)",
                    req->entries[i].text, max->n ? allowed : "no network at all");
            return false;
        }
    }
    return true;
}

/* ---- presentation ---- */

json_t *net_policy_json(const struct net_policy *p)
{
    if (!p)
        return json_pack("{s:s}", "mode", "none");
    if (p->internet)
        return json_pack(
            "{s:s,s:I,s:I}", "mode", "internet", "max_connections",
            (json_int_t)(p->max_connections ? p->max_connections : NET_DEFAULT_MAX_CONNECTIONS),
            "max_bytes", (json_int_t)(p->max_bytes ? p->max_bytes : NET_DEFAULT_MAX_BYTES));
    json_t *allow = json_array();
    for (size_t i = 0; i < p->n; i++)
        json_array_append_new(allow, json_string(p->entries[i].text));
    return json_pack(
        "{s:s,s:o,s:I,s:I}", "mode", "allowlist", "allow", allow, "max_connections",
        (json_int_t)(p->max_connections ? p->max_connections : NET_DEFAULT_MAX_CONNECTIONS),
        "max_bytes", (json_int_t)(p->max_bytes ? p->max_bytes : NET_DEFAULT_MAX_BYTES));
}

char **net_proxy_env(const struct net_policy *p, char **env)
{
    static const char *const names[] = {"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
                                        "http_proxy", "https_proxy", "all_proxy"};
    char line[128];
    for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
        snprintf(line, sizeof(line), "%s=http://127.0.0.1:%d", names[i], NET_RELAY_PORT);
        env = strv_push(env, line);
    }
    /* Servers the code runs itself on the sandbox's loopback are reached directly, unless
     * the policy names a loopback address: then such names must go through the proxy,
     * which is the only way out of the sandbox's own loopback. */
    if (!net_policy_names_loopback(p)) {
        env = strv_push(env, "NO_PROXY=localhost,127.0.0.1,::1");
        env = strv_push(env, "no_proxy=localhost,127.0.0.1,::1");
    }
    return env;
}

char **net_ca_env(char **env)
{
    /* The bundle (this host's roots plus the session CA) for the clients that take one file
     * in place of the system's; Node adds NODE_EXTRA_CA_CERTS to its own roots. */
    static const char *const bundle_vars[] = {"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE",
                                              "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "PIP_CERT"};
    char line[128];
    for (size_t i = 0; i < ARRAY_SIZE(bundle_vars); i++) {
        snprintf(line, sizeof(line), "%s=%s", bundle_vars[i], NET_SANDBOX_BUNDLE);
        env = strv_push(env, line);
    }
    return strv_push(env, "NODE_EXTRA_CA_CERTS=" NET_SANDBOX_CA);
}
