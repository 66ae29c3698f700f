/* net-int.h - internals of the net module, shared by its files only. */
#ifndef RUNCELL_NET_INT_H
#define RUNCELL_NET_INT_H

#include <sys/socket.h>

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

#endif
