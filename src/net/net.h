/* net.h - the net module's contract: egress policies (allowlists of hosts and ports) and the
 * egress proxy that enforces them for one session.
 *
 * A sandbox has its own network namespace with loopback only. When its policy is an
 * allowlist, a relay inside it listens on 127.0.0.1:NET_RELAY_PORT and forwards each
 * connection to this proxy through a Unix socket bound into the sandbox at
 * NET_SANDBOX_SOCKET. The proxy speaks HTTP CONNECT and plain-HTTP forwarding, resolves names
 * itself, checks host and port against the policy, refuses private, loopback and link-local
 * addresses unless an entry names them exactly, and reports every attempt.
 *
 * Secrets (see below) are credentials bound to hosts: the proxy adds them to the requests for
 * their host, so that the sandbox never holds them. For HTTPS it terminates TLS with a
 * certificate of a per-session CA that only that session's sandbox trusts, after checking the
 * real server's certificate against this host's trust store.
 *
 * Thread safety: a policy and a set of secrets are read-only once parsed and may be shared
 * between threads. An egress proxy runs its own threads; its event callback is called from
 * them. Its rules may be changed while it runs (egress_change). */
#ifndef RUNCELL_NET_H
#define RUNCELL_NET_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "sandbox/sandbox.h"
#include <sys/socket.h>

#include "base/base.h"

#define NET_MAX_ENTRIES             256
#define NET_DEFAULT_MAX_CONNECTIONS 32           /* open through the proxy at once, per session */
#define NET_DEFAULT_MAX_BYTES       (1ull << 30) /* both directions, over a session's life */
#define NET_RELAY_PORT              3128         /* the relay's port on the sandbox's loopback */
#define NET_SANDBOX_DIR             SANDBOX_NET_DIR /* where the proxy's socket directory is bound */
#define NET_SANDBOX_SOCKET          NET_SANDBOX_DIR "/egress.sock"
#define NET_SOCKET_NAME             "egress.sock"

/* ---- policies ---- */

enum net_entry_kind {
    NET_ENTRY_HOST,     /* exactly this name */
    NET_ENTRY_WILDCARD, /* "*.domain": names below domain, not domain itself */
    NET_ENTRY_IP,       /* exactly this address */
};

struct net_entry {
    enum net_entry_kind kind;
    char *host; /* lower-case name, the domain of a wildcard (without "*."), or the IP */
    int family; /* NET_ENTRY_IP: AF_INET or AF_INET6 */
    unsigned char addr[16];
    uint16_t port; /* 0: ports 80 and 443 */
    char *text;    /* the entry in canonical form, as shown in messages */
};

struct net_policy {
    struct net_entry *entries;
    size_t n;
    /* The public internet: every host name and port, through the proxy as for an allowlist
     * (names resolved by the proxy; private, loopback, link-local, metadata and other
     * special-purpose addresses refused, as net_addr_allowed says). No entries. */
    bool internet;
    uint64_t max_connections; /* 0 = NET_DEFAULT_MAX_CONNECTIONS */
    uint64_t max_bytes;       /* 0 = NET_DEFAULT_MAX_BYTES */
};

/* Parses allowlist entries: "host", "*.domain", "host:port", "IP", "IP:port" ("[v6]:port").
 * 0 or -EINVAL with err_msg() naming the entry and what is wrong; *ret owned by the caller. */
int net_policy_parse(const char *const *entries, size_t n, struct net_policy **ret);
/* The same from a comma-separated list ("a.example,b.example:8443"). */
int net_policy_parse_list(const char *list, struct net_policy **ret);
/* The public internet (see struct net_policy's internet); owned by the caller. */
struct net_policy *net_policy_internet(void);
struct net_policy *net_policy_copy(const struct net_policy *p);
/* NULL is a no-op. */
void net_policy_free(struct net_policy *p);
/* True when every entry of req is covered by an entry of max (same or wider host set, same
 * or wider ports), and req is the internet only where max is. Otherwise false with err_msg()
 * naming the first entry that is not. */
bool net_policy_within(const struct net_policy *req, const struct net_policy *max);
/* The entry that allows host (a name or an IP literal, as a client sent it) on port, or
 * NULL. host is compared case-insensitively, without a trailing dot. */
const struct net_entry *net_policy_match(const struct net_policy *p, const char *host,
                                         uint16_t port);
/* Whether some entry names host (compared as net_policy_match does) at any port: when
 * host:port is not allowed, whether the port is what is wrong rather than the host. */
bool net_policy_lists_host(const struct net_policy *p, const char *host);
/* Whether the proxy may connect to sa (AF_INET/AF_INET6) on port: public addresses always;
 * private, loopback, link-local and other special ones only when an IP entry names that
 * address with that port. On false, *ret_why (static text) says which kind of address. */
bool net_addr_allowed(const struct net_policy *p, const struct sockaddr *sa, uint16_t port,
                      const char **ret_why);
/* Whether some entry names a loopback address (then loopback is not exempt from the proxy). */
bool net_policy_names_loopback(const struct net_policy *p);
/* {"mode": "allowlist", "allow": [...], "max_connections": N, "max_bytes": N}, or for the
 * internet {"mode": "internet", "max_connections": N, "max_bytes": N}; NULL p gives
 * {"mode": "none"}. Caller owns the reference. */
json_t *net_policy_json(const struct net_policy *p);
/* Appends to env the variables that point clients in the sandbox at the relay (HTTP_PROXY,
 * HTTPS_PROXY, ALL_PROXY, NO_PROXY and their lower-case twins); returns the vector. */
char **net_proxy_env(const struct net_policy *p, char **env);
/* Appends the variables that make clients trust the session's CA: SSL_CERT_FILE,
 * REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE, GIT_SSL_CAINFO, PIP_CERT (the bundle) and
 * NODE_EXTRA_CA_CERTS (the CA alone); returns the vector. */
char **net_ca_env(char **env);

/* The entry of p that covers every host e names at port (see net_policy_within), or NULL. */
const struct net_entry *net_policy_covering(const struct net_policy *p, const struct net_entry *e,
                                            uint16_t port);

/* ---- secrets: credentials the proxy adds to a host's requests (secrets.c) ----
 *
 * A secret names its host as an allowlist entry does ("api.example.com", "*.example.com",
 * "host:8443", an IP), optionally a path prefix, and what is sent: a header (name and value,
 * such as Authorization: Bearer ...) or basic auth. The proxy adds it to every request for a
 * matching host (port: the entry's, else 443; plain HTTP on the entry's port, else 80, only
 * with allow_http) whose path starts with the prefix, in place of any header of that name
 * the client sent. A secret does not allow its host: the allowlist must name it. Values are
 * wiped when freed and never appear in what this module prints (net_secrets_json, errors,
 * events, log lines). */

#define NET_MAX_SECRETS      64
#define NET_SECRET_VALUE_MAX 8192 /* bytes of a header value (basic: of user and password) */

enum net_secret_kind { NET_SECRET_HEADER, NET_SECRET_BASIC };

struct net_secret {
    struct net_entry host;
    char *path_prefix; /* requests whose path starts with it; NULL: every path */
    enum net_secret_kind kind;
    char *header;    /* the header's name as given (basic: "Authorization") */
    char *value;     /* the header's value as sent (basic: "Basic BASE64(user:password)") */
    char *token;     /* the value past its scheme ("Bearer X": X), for net_secrets_scrub; or NULL */
    char *password;  /* basic: the password alone, for net_secrets_scrub; or NULL */
    bool allow_http; /* also over plain HTTP (sent in clear text on the way) */
};

struct net_secrets {
    struct net_secret *v;
    size_t n;
};

/* Parses a JSON array of secrets, every surface's one way in:
 *   [{"host": H, "header": NAME, "value": V} | {"host": H, "basic": {"user": U, "password": P}},
 *    optional "path_prefix": "/v1/", "allow_http": false]
 * and checks that allow (the session's allowlist; NULL for none) names each secret's host at
 * its port. arr NULL or JSON null: *ret = NULL. 0 or -EINVAL with err_msg() naming the field
 * ("secrets[1].header: ...") and never quoting a value; *ret owned by the caller. */
int net_secrets_from_json(const json_t *arr, const struct net_policy *allow,
                          struct net_secrets **ret);
/* Whether allow names each secret's host at its port; -EINVAL with err_msg() otherwise. */
int net_secrets_check(const struct net_secrets *s, const struct net_policy *allow);
struct net_secrets *net_secrets_copy(const struct net_secrets *s);
/* Wipes every value (explicit_bzero) and frees; NULL is a no-op. */
void net_secrets_free(struct net_secrets *s);
/* What may be shown of secrets: [{"host", "header", "kind": "header"|"basic", "path_prefix",
 * "allow_http"}], never a value or a user name; an empty array for NULL. Caller owns it. */
json_t *net_secrets_json(const struct net_secrets *s);
/* The secrets with their values, as net_secrets_from_json takes them back: only for sealing
 * (store_seal) before a record keeps them. The caller wipes it (net_secrets_json_wipe). */
json_t *net_secrets_export(const struct net_secrets *s);
/* Overwrites with '*' every occurrence of a secret's value (and of its token or password
 * alone, when 8 bytes or longer) in buf; returns how many it masked. */
size_t net_secrets_scrub(const struct net_secrets *s, char *buf, size_t len);
/* Zeroes the values, user names and passwords in a JSON array of secrets (as parsed from a
 * request) once they have been copied out of it. */
void net_secrets_json_wipe(json_t *arr);

/* A change of a running session's rules, from JSON (every surface's one way in):
 *   {"allow": [...]} replaces the allowlist; {"allow_add": [...], "allow_remove": [...]}
 *   edit it; {"secrets": [...]} replaces the secrets; {"secrets_add": [...],
 *   "secrets_remove": [{"host": H, "header": NAME, "path_prefix": P}]} edit them (header and
 *   path_prefix narrow what is removed; a removal that matches nothing is an error);
 *   {"internet": true|false} turns the public internet (net_policy's internet) on or off,
 *   kept as it was when absent.
 * The result is checked as a new session's would be: entries within max (NULL: no cap), each
 * secret's host on the allowlist. Caps (max_connections, max_bytes) stay p's. 0 with *ret_p
 * and *ret_s (NULL when none are left; both owned by the caller), or -EINVAL with err_msg()
 * naming the field; p and s are not changed. */
int net_rules_change(const struct net_policy *p, const struct net_secrets *s, const json_t *change,
                     const struct net_policy *max, struct net_policy **ret_p,
                     struct net_secrets **ret_s);

/* ---- TLS interception (tls.c, intercept.c: OpenSSL, linked into runcell-full only) ---- */

/* Lets egress proxies made from now on intercept TLS for hosts with secrets (each gets a
 * per-session CA). A program that never calls it (`runcell run` without --secret) links no
 * TLS library, and its proxies refuse secrets. Call once, before the first egress_new. */
void net_tls_enable(void);
/* Whether net_tls_enable was called. */
bool net_tls_enabled(void);

/* Where the sandbox finds the session CA's certificate, and the bundle of this host's roots
 * plus it (both in the proxy's directory, bound at NET_SANDBOX_DIR). */
#define NET_CA_NAME        "ca.pem"
#define NET_BUNDLE_NAME    "ca-certificates.crt"
#define NET_SANDBOX_CA     NET_SANDBOX_DIR "/" NET_CA_NAME
#define NET_SANDBOX_BUNDLE NET_SANDBOX_DIR "/" NET_BUNDLE_NAME
/* The system trust store the bundle is made from, and which it is bound over in the sandbox. */
#define NET_SYSTEM_BUNDLE "/etc/ssl/certs/ca-certificates.crt"

/* ---- the egress proxy of one session ---- */

/* One attempt through the proxy, allowed or refused. Strings are borrowed for the callback. */
struct egress_event {
    const char *method; /* "CONNECT", "GET", ... */
    const char *host;   /* as requested; NULL when the request could not be parsed */
    uint16_t port;
    bool allowed;
    const char *rule;    /* the entry that allowed the host, or NULL */
    const char *address; /* the address connected to (or refused), or NULL */
    const char *reason;  /* why it was refused, or NULL */
    int status;          /* the HTTP status the proxy answered with (0: none) */
    const char *path;    /* a request the proxy read inside a TLS connection it intercepted,
                          * or one it added a secret to: its path (sanitized), else NULL */
    const char *secret;  /* the header a secret was added as, or NULL */
    bool intercepted;    /* a CONNECT whose TLS the proxy terminates (a host with secrets) */
};
typedef void (*egress_event_fn)(void *ctx, const struct egress_event *ev);

struct egress;

/* Creates dir (0755) and a listening socket dir/NET_SOCKET_NAME that anyone who can reach it
 * may connect to (the sandbox user), and starts serving it with policy p and secrets s (may
 * be NULL; both copied). When net_tls_enable was called, it makes a CA of its own (its key
 * only in this process's memory) and writes its certificate (NET_CA_NAME) and this host's
 * roots plus it (NET_BUNDLE_NAME) into dir; otherwise secrets are refused (-ENOTSUP).
 * fn is called for every attempt, from the proxy's threads, until egress_free returns.
 * 0 or -errno with err_msg(); *ret owned by the caller. */
int egress_new(const char *dir, const struct net_policy *p, const struct net_secrets *s,
               egress_event_fn fn, void *ctx, struct egress **ret);
/* The host directory holding the socket (to bind at NET_SANDBOX_DIR). */
const char *egress_dir(const struct egress *e);
/* Whether the proxy has a CA of its own (and dir holds NET_CA_NAME and NET_BUNDLE_NAME). */
bool egress_has_ca(const struct egress *e);
/* Applies a change (see net_rules_change) to the running proxy: connections opened from now
 * on, and each further request of an intercepted one, follow the new rules; tunnels already
 * open stay. Changes are applied one at a time. 0 or -errno with err_msg(): -EINVAL for a
 * bad change, -ENOTSUP for secrets without a CA. */
int egress_change(struct egress *e, const json_t *change, const struct net_policy *max);
/* The rules in force: net_policy_json's object plus "secrets" (net_secrets_json). */
json_t *egress_rules_json(struct egress *e);
/* net_secrets_scrub with the secrets in force. */
size_t egress_scrub(struct egress *e, char *buf, size_t len);
/* Whether any secret is in force. */
bool egress_has_secrets(struct egress *e);
/* Copies of the rules e follows now: *ret_p its allowlist, *ret_s its secrets (NULL when
 * none), both the caller's (net_policy_free, net_secrets_free): what a session made like this
 * one (a fork) is given. */
void egress_rules_copy(struct egress *e, struct net_policy **ret_p, struct net_secrets **ret_s);
/* Stops accepting, cuts every open connection, waits for the proxy's threads, removes the
 * socket and its directory; NULL is a no-op. */
void egress_free(struct egress *e);

/* Process-wide counters of every proxy, for metrics. */
struct net_stats {
    uint64_t allowed;   /* attempts let through */
    uint64_t refused;   /* attempts refused (policy, address, caps, bad requests) */
    uint64_t bytes_out; /* sandbox to the outside */
    uint64_t bytes_in;
    uint64_t active;        /* connections open now */
    uint64_t intercepted;   /* TLS connections the proxy terminated (hosts with secrets) */
    uint64_t secrets_added; /* requests a secret was added to */
};
void net_stats_get(struct net_stats *ret);

#endif
