/* request.c - reading and parsing what a client sends the egress proxy: a CONNECT request,
 * or a plain-HTTP request in absolute form, rewritten for the origin server. */
#include "net/net-int.h"

#include <ctype.h>
#include <errno.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* Headers for the proxy hop only: never passed on. */
static const char *const hop_headers[] = {"proxy-connection", "proxy-authorization", "connection",
                                          "keep-alive"};

static bool host_char(char c)
{
    return isalnum((unsigned char)c) || c == '.' || c == '-' || c == '_' || c == ':';
}

/* "host", "host:port", "[v6]" or "[v6]:port" (n bytes at s) into rq->host and rq->port. */
static int parse_authority(const char *s, size_t n, int default_port, struct proxy_request *rq)
{
    const char *host = s, *port = NULL, *end = s + n;
    size_t host_len;
    if (n && *s == '[') {
        const char *close = memchr(s, ']', n);
        if (!close || (close + 1 < end && close[1] != ':'))
            return err_set(EINVAL, "bad IPv6 address in '%.*s'", (int)MIN(n, 200), s);
        host = s + 1;
        host_len = (size_t)(close - host);
        if (close + 1 < end)
            port = close + 2;
    } else {
        const char *colon = memrchr(s, ':', n);
        host_len = colon ? (size_t)(colon - s) : n;
        if (colon)
            port = colon + 1;
    }
    if (!host_len || host_len >= sizeof(rq->host))
        return err_set(EINVAL, "no usable host name in '%.*s'", (int)MIN(n, 200), s);
    for (size_t i = 0; i < host_len; i++)
        if (!host_char(host[i]))
            return err_set(EINVAL,
                           "the host name in '%.*s' has characters a host name "
                           "cannot have",
                           (int)MIN(n, 200), s);
    /* "example.com." is "example.com": one name for the policy, the pinned hosts file and
     * the resolver alike, so a trailing dot cannot step around a pin. */
    if (host_len > 1 && host[host_len - 1] == '.')
        host_len--;
    if (host[0] == '.' || host[host_len - 1] == '.' || memmem(host, host_len, "..", 2))
        return err_set(EINVAL, "the host name in '%.*s' has an empty label", (int)MIN(n, 200), s);
    memcpy(rq->host, host, host_len);
    rq->host[host_len] = '\0';
    if (!port) {
        if (default_port < 0)
            return err_set(EINVAL, "CONNECT needs HOST:PORT, not '%.*s'", (int)MIN(n, 200), s);
        rq->port = (uint16_t)default_port;
        return 0;
    }
    char digits[8];
    uint64_t v;
    size_t plen = (size_t)(end - port);
    if (!plen || plen >= sizeof(digits))
        return err_set(EINVAL, "bad port in '%.*s'", (int)MIN(n, 200), s);
    memcpy(digits, port, plen);
    digits[plen] = '\0';
    if (parse_u64(digits, &v) < 0 || v < 1 || v > 65535)
        return err_set(EINVAL, "bad port in '%.*s'", (int)MIN(n, 200), s);
    rq->port = (uint16_t)v;
    return 0;
}

static bool is_hop_header(const char *line, size_t n)
{
    const char *colon = memchr(line, ':', n);
    if (!colon)
        return false;
    size_t name_len = (size_t)(colon - line);
    for (size_t i = 0; i < ARRAY_SIZE(hop_headers); i++)
        if (strlen(hop_headers[i]) == name_len && !strncasecmp(line, hop_headers[i], name_len))
            return true;
    return false;
}

/* The head to send to the origin: origin-form request line, the client's headers less the
 * hop-by-hop ones, and Connection: close (one request per upstream connection). */
static void build_forward(struct proxy_request *rq, const char *path, size_t path_len,
                          const char *version, const char *headers, const char *end,
                          const char *authority, size_t authority_len)
{
    bool has_host = false;
    buf_printf(&rq->forward, "%s %s%.*s %s\r\n", rq->method, path_len && *path == '/' ? "" : "/",
               (int)path_len, path, version);
    for (const char *line = headers; line < end;) {
        const char *nl = memchr(line, '\n', (size_t)(end - line));
        size_t n = nl ? (size_t)(nl - line) : (size_t)(end - line);
        size_t content = n && line[n - 1] == '\r' ? n - 1 : n;
        if (content && !is_hop_header(line, content)) {
            has_host |= content > 5 && !strncasecmp(line, "host:", 5);
            buf_printf(&rq->forward, "%.*s\r\n", (int)content, line);
        }
        line += n + 1;
    }
    if (!has_host)
        buf_printf(&rq->forward, "Host: %.*s\r\n", (int)authority_len, authority);
    buf_printf(&rq->forward, "Connection: close\r\n\r\n");
}

static int parse_plain(struct proxy_request *rq, const char *target, size_t tlen,
                       const char *version, const char *headers, const char *end)
{
    if (tlen >= 8 && !strncasecmp(target, "https://", 8))
        return err_set(EINVAL,
                       "https URLs go through a CONNECT tunnel; this client sent "
                       "'%s https://...' to the proxy instead",
                       rq->method);
    if (tlen < 7 || strncasecmp(target, "http://", 7))
        return err_set(EINVAL, "this is runcell's egress proxy: send CONNECT HOST:PORT or a "
                               "request with an absolute http:// URL (configure the proxy with "
                               "HTTP_PROXY rather than connecting to it as a server)");
    const char *auth = target + 7, *tend = target + tlen;
    size_t alen = strcspn(auth, "/?#");
    if (auth + alen > tend)
        alen = (size_t)(tend - auth);
    const char *path = auth + alen;
    /* Credentials in the URL are the origin's business, not part of the host. */
    const char *at = memrchr(auth, '@', alen);
    const char *host = at ? at + 1 : auth;
    size_t hlen = alen - (size_t)(host - auth);
    int r = parse_authority(host, hlen, 80, rq);
    if (r < 0)
        return r;
    size_t plen = (size_t)(tend - path);
    const char *hash = memchr(path, '#', plen);
    if (hash)
        plen = (size_t)(hash - path);
    build_forward(rq, path, plen, version, headers, end, host, hlen);
    return 0;
}

/* Bytes HTTP does not allow in a head (RFC 9112 section 2.2). A NUL would cut the forwarded
 * copy short: a header line that starts with one becomes the empty line that ends the
 * head, and the origin reads the rest as a body or a second request. A bare CR ends a
 * line for some servers and not for others. */
static int check_head_bytes(const char *head, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (head[i] == '\0')
            return err_set(EINVAL, "the request head holds a NUL byte, which HTTP does not allow");
        if (head[i] == '\r' && (i + 1 == len || head[i + 1] != '\n'))
            return err_set(EINVAL, "the request head holds a CR that does not end a line, which "
                                   "HTTP does not allow");
    }
    return 0;
}

int proxy_parse_request(const char *head, size_t len, struct proxy_request *rq)
{
    const char *end = head + len;
    int r = check_head_bytes(head, len);
    if (r < 0)
        return r;
    const char *nl = memchr(head, '\n', len);
    if (!nl)
        return err_set(EINVAL, "no request line");
    size_t line_len = (size_t)(nl - head);
    if (line_len && head[line_len - 1] == '\r')
        line_len--;
    const char *sp1 = memchr(head, ' ', line_len);
    const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', line_len - (size_t)(sp1 + 1 - head)) : NULL;
    if (!sp1 || !sp2 || sp1 == head || sp2 == sp1 + 1)
        return err_set(EINVAL, "the request line is not 'METHOD TARGET HTTP/1.x'");
    size_t mlen = (size_t)(sp1 - head);
    if (mlen >= sizeof(rq->method))
        return err_set(EINVAL, "the request method is too long");
    for (size_t i = 0; i < mlen; i++)
        if (!isupper((unsigned char)head[i]))
            return err_set(EINVAL, "the request method is not an HTTP method");
    memcpy(rq->method, head, mlen);
    rq->method[mlen] = '\0';
    char version[16];
    size_t vlen = line_len - (size_t)(sp2 + 1 - head);
    if (vlen >= sizeof(version) || vlen < 8 || strncmp(sp2 + 1, "HTTP/1.", 7))
        return err_set(EINVAL, "the request line is not 'METHOD TARGET HTTP/1.x'");
    memcpy(version, sp2 + 1, vlen);
    version[vlen] = '\0';
    const char *target = sp1 + 1;
    size_t tlen = (size_t)(sp2 - target);
    rq->connect = !strcmp(rq->method, "CONNECT");
    if (rq->connect)
        return parse_authority(target, tlen, -1, rq);
    return parse_plain(rq, target, tlen, version, nl + 1, end);
}

/* Where the head ends in b (just past its empty line), searching from `from`; 0 if not yet. */
static size_t head_end(const struct buf *b, size_t from)
{
    for (size_t i = from; i < b->len; i++) {
        if (b->data[i] != '\n')
            continue;
        if (i + 1 < b->len && b->data[i + 1] == '\n')
            return i + 2;
        if (i + 2 < b->len && b->data[i + 1] == '\r' && b->data[i + 2] == '\n')
            return i + 3;
    }
    return 0;
}

int proxy_read_request(int fd, struct buf *head, struct proxy_request *rq)
{
    char chunk[4096];
    size_t end = 0;
    memset(rq, 0, sizeof(*rq));
    buf_init(&rq->forward, 2 * NET_MAX_HEAD);
    while (!end) {
        ssize_t n = read(fd, chunk, sizeof(chunk));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return err_set(ETIMEDOUT, "no complete request head within %d s",
                           NET_HEAD_TIMEOUT_MS / 1000);
        if (n <= 0) {
            if (!head->len)
                return -ECONNRESET;
            return err_set(EINVAL, "the client closed the connection in the middle of the "
                                   "request head");
        }
        size_t from = head->len > 2 ? head->len - 2 : 0;
        if (buf_append(head, chunk, (size_t)n) < 0)
            return -E2BIG;
        end = head_end(head, from);
        if (!end && head->len > NET_MAX_HEAD)
            return -E2BIG;
    }
    /* A head ending with CRLFs alone is a client's leading empty line: tolerated by
     * HTTP, so skip to the real request line. */
    size_t skip = strspn(head->data, "\r\n");
    if (skip >= end)
        return err_set(EINVAL, "empty request");
    rq->rest_len = head->len - end;
    rq->head_off = skip;
    return proxy_parse_request(head->data + skip, end - skip, rq);
}
