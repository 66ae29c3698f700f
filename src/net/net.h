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
 * Thread safety: a policy is read-only once parsed and may be shared between threads. An
 * egress proxy runs its own threads; its event callback is called from them. */
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
    int status;          /* the HTTP status the proxy answered with */
};
typedef void (*egress_event_fn)(void *ctx, const struct egress_event *ev);

struct egress;

/* Creates dir (0755) and a listening socket dir/NET_SOCKET_NAME that anyone who can reach it
 * may connect to (the sandbox user), and starts serving it with policy p (copied). fn is
 * called for every attempt, from the proxy's threads, until egress_free returns.
 * 0 or -errno with err_msg(); *ret owned by the caller. */
int egress_new(const char *dir, const struct net_policy *p, egress_event_fn fn, void *ctx,
               struct egress **ret);
/* Replaces the policy (p copied): connections from now on are judged by it; those open
 * already keep what they were allowed. */
void egress_set_policy(struct egress *e, const struct net_policy *p);
/* The host directory holding the socket (to bind at NET_SANDBOX_DIR). */
const char *egress_dir(const struct egress *e);
/* Stops accepting, cuts every open connection, waits for the proxy's threads, removes the
 * socket and its directory; NULL is a no-op. */
void egress_free(struct egress *e);

/* Process-wide counters of every proxy, for metrics. */
struct net_stats {
    uint64_t allowed;   /* attempts let through */
    uint64_t refused;   /* attempts refused (policy, address, caps, bad requests) */
    uint64_t bytes_out; /* sandbox to the outside */
    uint64_t bytes_in;
    uint64_t active; /* connections open now */
};
void net_stats_get(struct net_stats *ret);

#endif
