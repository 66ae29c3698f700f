/* net-int.h - internals of the net module, shared by its files only. */
#ifndef RUNCELL_NET_INT_H
#define RUNCELL_NET_INT_H

#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "net/net.h"

#define NET_MAX_HEAD           16384  /* request line and headers of one proxy request */
#define NET_MAX_ADDRS          16     /* addresses of one name tried */
#define NET_HEAD_TIMEOUT_MS    30000  /* to send the request head */
#define NET_CONNECT_TIMEOUT_MS 10000  /* per address */
#define NET_IDLE_TIMEOUT_MS    600000 /* nothing moving either way */

/* One request to the proxy, parsed. */
struct proxy_request {
    char method[24];
    char host[256]; /* as the client named it: a name or an IP literal (no brackets) */
    uint16_t port;
    bool connect;       /* CONNECT: a tunnel; otherwise plain HTTP to forward */
    struct buf forward; /* plain HTTP: the head to send upstream (origin-form, hop-by-hop
                         * headers dropped, Connection: close) */
    size_t rest_len;    /* bytes after the head already read (the start of a body or of TLS) */
    size_t head_off;    /* where the head starts in what was read (past leading empty lines) */
};

/* Reads one request head from fd into head (capped at NET_MAX_HEAD: -E2BIG) and parses it
 * into rq (whose forward buffer the caller releases, whatever the result). -ECONNRESET when
 * the client went away without a request, -EINVAL with err_msg() for a bad one. */
int proxy_read_request(int fd, struct buf *head, struct proxy_request *rq);
/* Parses a complete head (len bytes, ending with an empty line) into rq. */
int proxy_parse_request(const char *head, size_t len, struct proxy_request *rq);

/* Addresses of host (a name or an IP literal) with port set: the file named by
 * RUNCELL_NET_HOSTS first (hosts(5) format; lets tests and operators pin names), then the
 * system resolver. At most NET_MAX_ADDRS. 0 or -errno with err_msg(). */
int net_resolve(const char *host, uint16_t port, struct sockaddr_storage *ret, size_t *ret_n);

/* ---- allowlist entries, one at a time (policy.c) ---- */

/* Parses one allowlist entry (see net_policy_parse) into e; -EINVAL with err_msg(). e is
 * zeroed first, so net_entry_release may be called whatever the result. */
int net_entry_parse(const char *given, struct net_entry *e);
void net_entry_release(struct net_entry *e);
void net_entry_copy(struct net_entry *dst, const struct net_entry *src);
/* Whether e names host (any port), compared as net_policy_match does. */
bool net_entry_names(const struct net_entry *e, const char *host);

/* ---- the secrets of a request (secrets.c) ---- */

/* Whether some secret is for host:port, over TLS or (tls false) plain HTTP. */
bool net_secrets_for_host(const struct net_secrets *s, const char *host, uint16_t port, bool tls);
/* The secrets a request to host:port for path (path_len bytes, its query included or not)
 * gets: at most one per header name (the longest matching path prefix wins), at most max,
 * into ret. A path with a '.' or '..' segment (also percent-encoded) or a backslash gets no
 * secret that has a path prefix. Returns how many. */
size_t net_secrets_select(const struct net_secrets *s, const char *host, uint16_t port, bool tls,
                          const char *path, size_t path_len, const struct net_secret **ret,
                          size_t max);

/* ---- the rules in force, shared by a proxy's threads (proxy.c) ---- */

struct net_rules {
    _Atomic unsigned refs;
    struct net_policy *policy;
    struct net_secrets *secrets; /* NULL: none */
};
/* The rules e follows now, with a reference the caller drops with net_rules_put. */
struct net_rules *egress_rules_get(struct egress *e);
void net_rules_put(struct net_rules *r);

/* ---- what the TLS part uses of the proxy (proxy.c) ---- */

/* Counts the attempt (allowed or refused) and tells of it. */
void egress_report(struct egress *e, const struct egress_event *ev);
/* Tells of it without counting it (an attempt counted already). */
void egress_tell(struct egress *e, const struct egress_event *ev);
/* Charges n bytes against the session's budget (false: it is used up; the caller stops and
 * calls egress_budget_spent) and counts them out (to the upstream) or in. */
bool egress_charge(struct egress *e, size_t n, bool out);
void egress_budget_spent(struct egress *e, const char *method, const char *host, uint16_t port);
/* An error answer (status line, headers, body) saying msg (made printable here); the caller
 * frees it. */
char *egress_answer_text(int status, const char *msg, size_t *ret_len);
/* Sends it on fd. */
void egress_answer(int fd, int status, const char *msg);
/* Makes text safe for a status line, a log line and an event (in place). */
void net_printable(char *s);
/* The per-session CA (tls.c) of e, or NULL. */
struct net_ca *egress_ca(struct egress *e);
/* Counters of the TLS part. */
void net_stats_intercepted(void);
void net_stats_secret_added(void);

/* ---- HTTP/1.1 requests inside an intercepted connection (http1.c) ----
 *
 * Stricter than servers are, so that the proxy and the server never see different requests:
 * CRLF line ends only, no obs-fold, token header names, one Host that names the host the
 * connection is for, Content-Length and Transfer-Encoding never together, chunked the only
 * transfer coding, no CONNECT, no request trailers. */

#define H1_MAX_HEADERS 100

struct h1_request {
    char method[24];
    const char *target; /* as sent (origin-form, or absolute-form naming the same host) */
    size_t target_len;
    const char *path; /* the target's path and query */
    size_t path_len;
    bool http10;
    bool chunked;
    bool has_length;
    uint64_t content_length;
    bool upgrade;     /* an Upgrade header: the connection turns opaque after this request */
    bool close;       /* Connection: close (or HTTP/1.0 without keep-alive) */
    size_t n_headers; /* header lines (each "name: value", without its CRLF) */
    struct {
        const char *line;
        size_t len, name_len;
    } headers[H1_MAX_HEADERS];
};

/* Parses a complete head (len bytes up to and including its empty line) of a request to host
 * (as the client named it in CONNECT or the URL) on port. 0, or the HTTP status to answer
 * (400, 421, 431, 501) with err_msg(). rq points into head. */
int h1_parse_head(const char *head, size_t len, const char *host, uint16_t port, bool tls,
                  struct h1_request *rq);
/* The head to send upstream into out: rq's request line and headers, less every header named
 * like one of the n secrets and the proxy hop's own (Proxy-Authorization, Proxy-Connection),
 * plus each secret's header; with close_upstream, "Connection: close" instead of the
 * client's Connection header. */
void h1_build_head(const struct h1_request *rq, const struct net_secret *const *secrets, size_t n,
                   bool close_upstream, struct buf *out);

/* Where a request body ends: Content-Length bytes, or chunks up to the last one. */
struct h1_body {
    enum {
        H1_BODY_DONE,
        H1_BODY_LENGTH,
        H1_CHUNK_SIZE,
        H1_CHUNK_DATA,
        H1_CHUNK_CRLF,
        H1_CHUNK_TRAILER
    } state;
    uint64_t left;
    size_t line_len; /* bytes of the chunk-size or trailer line so far */
    bool line_cr;    /* that line's CR has been seen */
    bool ext;        /* in the chunk-size line's extension */
    unsigned digits; /* hex digits of the chunk size so far */
};
void h1_body_init(struct h1_body *b, const struct h1_request *rq);
/* Consumes body bytes from data (n of them): returns how many belong to the body (the caller
 * forwards them; the body is over when b->state is H1_BODY_DONE), or -EINVAL with err_msg()
 * for bad chunked framing. */
ssize_t h1_body_feed(struct h1_body *b, const char *data, size_t n);

/* ---- TLS (tls.c), linked only into programs that call net_tls_enable ---- */

struct net_ca;
/* One intercepted connection, as the proxy hands it over: host and port as the client named
 * them, the allowlist entry and address, and the connected upstream socket. */
struct ix_target {
    struct egress *e;
    int client, upstream;
    const char *method;
    const char *host;
    uint16_t port;
    const char *rule;
    const char *address;
    bool tls;         /* CONNECT: TLS on both sides; else one plain-HTTP request, already read */
    const char *head; /* plain: the request head (with its empty line) */
    size_t head_len;
    const char *rest; /* plain: bytes read after it */
    size_t rest_len;
};
struct net_tls_ops {
    /* A CA of its own for one proxy: 0 or -errno with err_msg(). */
    int (*ca_new)(struct net_ca **ret);
    void (*ca_free)(struct net_ca *ca);
    /* Its certificate, PEM. */
    const char *(*ca_pem)(const struct net_ca *ca);
    /* Serves one connection to the end, reporting what happens. */
    void (*serve)(const struct ix_target *t);
};
/* NULL until net_tls_enable. */
extern const struct net_tls_ops *net_tls;

#endif
