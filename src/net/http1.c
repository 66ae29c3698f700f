/* http1.c - HTTP/1.1 requests inside a connection the egress proxy intercepts: a strict
 * parser of request heads, the head sent upstream (with the secrets added), and where each
 * request body ends, so that every request of a kept-alive connection is checked. */
#include "net/net-int.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define MAX_CONTENT_LENGTH (1ull << 53)
#define MAX_CHUNK_LINE     4096
#define MAX_CHUNK_SIZE     (1ull << 48)

/* Sets err_msg() and returns the HTTP status to answer with. */
static int bad(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(int status, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    err_set(EINVAL, "%s", msg);
    return status;
}

static bool is_tchar(char c)
{
    return isalnum((unsigned char)c) || (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* Every line ends with CRLF; no NUL, no bare CR or LF anywhere in the head. */
static int check_line_ends(const char *head, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (head[i] == '\0')
            return err_set(EINVAL, "the request head holds a NUL byte");
        if (head[i] == '\r' && (i + 1 == len || head[i + 1] != '\n'))
            return err_set(EINVAL, "the request head holds a CR that does not end a line");
        if (head[i] == '\n' && (i == 0 || head[i - 1] != '\r'))
            return err_set(EINVAL, "a line of the request head ends with a bare LF (the proxy "
                                   "takes CRLF only)");
    }
    return 0;
}

static bool same_host(const char *a, size_t an, const char *b)
{
    size_t bn = strlen(b);
    if (an > 1 && a[an - 1] == '.')
        an--;
    if (bn > 1 && b[bn - 1] == '.')
        bn--;
    return an == bn && !strncasecmp(a, b, an);
}

/* Whether an authority ("host", "host:port", "[v6]:port") names host on port (default_port
 * when it has none). */
static bool authority_is(const char *s, size_t n, const char *host, uint16_t port,
                         uint16_t default_port)
{
    const char *h = s, *p = NULL, *end = s + n;
    size_t hn;
    if (n && *s == '[') {
        const char *close = memchr(s, ']', n);
        if (!close || (close + 1 < end && close[1] != ':'))
            return false;
        h = s + 1;
        hn = (size_t)(close - h);
        p = close + 1 < end ? close + 2 : NULL;
    } else {
        const char *colon = memchr(s, ':', n);
        hn = colon ? (size_t)(colon - s) : n;
        p = colon ? colon + 1 : NULL;
    }
    uint64_t v = default_port;
    if (p) {
        char digits[8];
        size_t pn = (size_t)(end - p);
        if (!pn || pn >= sizeof(digits))
            return false;
        memcpy(digits, p, pn);
        digits[pn] = '\0';
        if (parse_u64(digits, &v) < 0)
            return false;
    }
    return v == port && same_host(h, hn, host);
}

static int parse_request_line(const char *line, size_t n, const char *host, uint16_t port, bool tls,
                              struct h1_request *rq)
{
    const char *sp1 = memchr(line, ' ', n);
    const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', n - (size_t)(sp1 + 1 - line)) : NULL;
    if (!sp1 || !sp2 || sp1 == line || sp2 == sp1 + 1)
        return bad(400, "the request line is not 'METHOD TARGET HTTP/1.1'");
    size_t mlen = (size_t)(sp1 - line);
    if (mlen >= sizeof(rq->method))
        return bad(400, "the request method is too long");
    for (size_t i = 0; i < mlen; i++)
        if (!isupper((unsigned char)line[i]) && line[i] != '-' && line[i] != '_')
            return bad(400, "the request method is not an HTTP method");
    memcpy(rq->method, line, mlen);
    rq->method[mlen] = '\0';
    if (!strcmp(rq->method, "CONNECT"))
        return bad(400, "CONNECT inside a connection the proxy intercepts");
    size_t vlen = n - (size_t)(sp2 + 1 - line);
    if (vlen == 8 && !memcmp(sp2 + 1, "HTTP/1.0", 8))
        rq->http10 = true;
    else if (vlen != 8 || memcmp(sp2 + 1, "HTTP/1.1", 8))
        return bad(400, "the request line is not 'METHOD TARGET HTTP/1.1'");
    rq->target = sp1 + 1;
    rq->target_len = (size_t)(sp2 - rq->target);
    for (size_t i = 0; i < rq->target_len; i++)
        if (rq->target[i] <= 0x20 || rq->target[i] >= 0x7f)
            return bad(400, "the request target holds a byte a URL cannot have");
    const char *scheme = tls ? "https://" : "http://";
    size_t slen = strlen(scheme);
    if (rq->target[0] == '/' || (rq->target_len == 1 && rq->target[0] == '*')) {
        if (!tls)
            return bad(400, "a request to the proxy needs an absolute http:// URL");
        rq->path = rq->target;
        rq->path_len = rq->target_len;
        return 0;
    }
    if (rq->target_len < slen || strncasecmp(rq->target, scheme, slen))
        return bad(400, "the request target is neither a path nor a %s URL", scheme);
    const char *auth = rq->target + slen, *tend = rq->target + rq->target_len;
    size_t alen = strcspn(auth, "/?# ");
    if (auth + alen > tend)
        alen = (size_t)(tend - auth);
    if (memchr(auth, '@', alen))
        return bad(400, "the request URL carries credentials of its own");
    if (!authority_is(auth, alen, host, port, tls ? 443 : 80))
        return bad(421, "the request URL names another host than %s:%u", host, port);
    rq->path = auth + alen;
    rq->path_len = (size_t)(tend - rq->path);
    return 0;
}

static bool name_is(const char *line, size_t name_len, const char *name)
{
    return strlen(name) == name_len && !strncasecmp(line, name, name_len);
}

/* A header's value without the white space around it. */
static void header_value(const char *line, size_t len, size_t name_len, const char **ret,
                         size_t *ret_len)
{
    const char *v = line + name_len + 1, *end = line + len;
    while (v < end && (*v == ' ' || *v == '\t'))
        v++;
    while (end > v && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    *ret = v;
    *ret_len = (size_t)(end - v);
}

/* Whether a comma-separated list (a Connection header) holds token. */
static bool list_has(const char *v, size_t n, const char *token)
{
    size_t tn = strlen(token);
    for (size_t i = 0; i < n;) {
        while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
            i++;
        size_t start = i;
        while (i < n && v[i] != ',')
            i++;
        size_t end = i;
        while (end > start && (v[end - 1] == ' ' || v[end - 1] == '\t'))
            end--;
        if (end - start == tn && !strncasecmp(v + start, token, tn))
            return true;
    }
    return false;
}

struct framing {
    int hosts, lengths, encodings;
    bool keep_alive;
};

/* One header line: its syntax, and what it says about the request's framing. */
static int parse_header(const char *line, size_t n, const char *host, uint16_t port, bool tls,
                        struct h1_request *rq, struct framing *f)
{
    if (line[0] == ' ' || line[0] == '\t')
        return bad(400, "a header line is folded (obs-fold), which the proxy refuses");
    const char *colon = memchr(line, ':', n);
    if (!colon || colon == line)
        return bad(400, "a header line has no 'name:'");
    size_t nl = (size_t)(colon - line);
    for (size_t i = 0; i < nl; i++)
        if (!is_tchar(line[i]))
            return bad(400, "a header name holds a character a name cannot have (white "
                            "space before the colon?)");
    for (size_t i = nl + 1; i < n; i++)
        if (((unsigned char)line[i] < 0x20 && line[i] != '\t') || line[i] == 0x7f)
            return bad(400, "a header value holds a control character");
    if (rq->n_headers >= H1_MAX_HEADERS)
        return bad(431, "the request has more than %d header lines", H1_MAX_HEADERS);
    rq->headers[rq->n_headers].line = line;
    rq->headers[rq->n_headers].len = n;
    rq->headers[rq->n_headers].name_len = nl;
    rq->n_headers++;
    const char *v;
    size_t vn;
    header_value(line, n, nl, &v, &vn);
    if (name_is(line, nl, "host")) {
        if (++f->hosts > 1)
            return bad(400, "the request has more than one Host header");
        if (!authority_is(v, vn, host, port, tls ? 443 : 80))
            return bad(421,
                       "the request's Host header names another host than %s:%u, the "
                       "one this connection is for",
                       host, port);
    } else if (name_is(line, nl, "content-length")) {
        char digits[24];
        if (++f->lengths > 1)
            return bad(400, "the request has more than one Content-Length header");
        if (!vn || vn >= sizeof(digits) || strspn(v, "0123456789") < vn)
            return bad(400, "the request's Content-Length is not a number");
        memcpy(digits, v, vn);
        digits[vn] = '\0';
        if (parse_u64(digits, &rq->content_length) < 0 || rq->content_length > MAX_CONTENT_LENGTH)
            return bad(400, "the request's Content-Length is too large");
        rq->has_length = true;
    } else if (name_is(line, nl, "transfer-encoding")) {
        if (++f->encodings > 1)
            return bad(400, "the request has more than one Transfer-Encoding header");
        if (vn != 7 || strncasecmp(v, "chunked", 7))
            return bad(501, "the request's Transfer-Encoding is not 'chunked', the only "
                            "one the proxy passes");
        rq->chunked = true;
    } else if (name_is(line, nl, "connection")) {
        rq->close |= list_has(v, vn, "close");
        f->keep_alive |= list_has(v, vn, "keep-alive");
    } else if (name_is(line, nl, "upgrade")) {
        rq->upgrade = true;
    }
    return 0;
}

int h1_parse_head(const char *head, size_t len, const char *host, uint16_t port, bool tls,
                  struct h1_request *rq)
{
    struct framing f = {0};
    memset(rq, 0, sizeof(*rq));
    if (check_line_ends(head, len) < 0)
        return 400;
    if (len < 4 || memcmp(head + len - 4, "\r\n\r\n", 4))
        return bad(400, "the request head does not end with an empty line");
    const char *end = head + len - 2; /* the final empty line's CRLF */
    const char *eol = memmem(head, len, "\r\n", 2);
    int status = parse_request_line(head, (size_t)(eol - head), host, port, tls, rq);
    if (status)
        return status;
    for (const char *line = eol + 2; line < end;) {
        const char *next = memmem(line, (size_t)(end - line) + 2, "\r\n", 2);
        if ((status = parse_header(line, (size_t)(next - line), host, port, tls, rq, &f)))
            return status;
        line = next + 2;
    }
    if (!f.hosts && !rq->http10)
        return bad(400, "the request has no Host header, which HTTP/1.1 requires");
    if (rq->chunked && (rq->has_length || rq->http10))
        return bad(400, rq->http10 ? "HTTP/1.0 has no Transfer-Encoding"
                                   : "the request has both Content-Length and "
                                     "Transfer-Encoding (a request smuggling pattern)");
    if (rq->http10 && !f.keep_alive)
        rq->close = true;
    return 0;
}

/* ---- the head sent upstream ---- */

static bool dropped(const char *line, size_t name_len, const struct net_secret *const *secrets,
                    size_t n, bool close_upstream)
{
    if (name_is(line, name_len, "proxy-authorization") ||
        name_is(line, name_len, "proxy-connection"))
        return true;
    if (close_upstream &&
        (name_is(line, name_len, "connection") || name_is(line, name_len, "keep-alive")))
        return true;
    for (size_t i = 0; i < n; i++)
        if (name_is(line, name_len, secrets[i]->header))
            return true;
    return false;
}

void h1_build_head(const struct h1_request *rq, const struct net_secret *const *secrets, size_t n,
                   bool close_upstream, struct buf *out)
{
    buf_printf(out, "%s %.*s%.*s HTTP/1.%c\r\n", rq->method, rq->path_len ? 0 : 1, "/",
               (int)rq->path_len, rq->path, rq->http10 ? '0' : '1');
    for (size_t i = 0; i < rq->n_headers; i++) {
        if (dropped(rq->headers[i].line, rq->headers[i].name_len, secrets, n, close_upstream))
            continue;
        buf_append(out, rq->headers[i].line, rq->headers[i].len);
        buf_append(out, "\r\n", 2);
    }
    for (size_t i = 0; i < n; i++)
        buf_printf(out, "%s: %s\r\n", secrets[i]->header, secrets[i]->value);
    if (close_upstream)
        buf_printf(out, "Connection: close\r\n");
    buf_append(out, "\r\n", 2);
}

/* ---- request bodies ---- */

void h1_body_init(struct h1_body *b, const struct h1_request *rq)
{
    memset(b, 0, sizeof(*b));
    if (rq->chunked)
        b->state = H1_CHUNK_SIZE;
    else if (rq->content_length) {
        b->state = H1_BODY_LENGTH;
        b->left = rq->content_length;
    } else {
        b->state = H1_BODY_DONE;
    }
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = (char)tolower((unsigned char)c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* One byte of a chunk-size line: hex digits, then an optional extension, then CRLF. */
static int chunk_size_byte(struct h1_body *b, char c)
{
    if (++b->line_len > MAX_CHUNK_LINE)
        return err_set(EINVAL, "a chunk-size line is longer than %d bytes", MAX_CHUNK_LINE);
    if (b->line_cr) {
        if (c != '\n')
            return err_set(EINVAL, "a chunk-size line has a CR without LF");
        b->line_len = 0;
        b->line_cr = false;
        b->ext = false;
        if (!b->digits)
            return err_set(EINVAL, "a chunk-size line has no size");
        b->digits = 0;
        b->state = b->left ? H1_CHUNK_DATA : H1_CHUNK_TRAILER;
        return 0;
    }
    if (c == '\r') {
        b->line_cr = true;
        return 0;
    }
    if (b->ext) {
        if ((unsigned char)c < 0x20 && c != '\t')
            return err_set(EINVAL, "a chunk extension holds a control character");
        return 0;
    }
    int v = hex_value(c);
    if (v >= 0 && !b->ext) {
        if (b->left > MAX_CHUNK_SIZE)
            return err_set(EINVAL, "a chunk is larger than the proxy passes");
        b->left = b->left * 16 + (uint64_t)v;
        b->digits++;
        return 0;
    }
    if (c == ';' && b->digits) {
        b->ext = true;
        return 0;
    }
    return err_set(EINVAL, "a chunk-size line is not a hexadecimal size");
}

ssize_t h1_body_feed(struct h1_body *b, const char *data, size_t n)
{
    size_t i = 0;
    while (i < n && b->state != H1_BODY_DONE) {
        switch (b->state) {
        case H1_BODY_LENGTH:
        case H1_CHUNK_DATA: {
            size_t take = (size_t)MIN((uint64_t)(n - i), b->left);
            b->left -= take;
            i += take;
            if (!b->left)
                b->state = b->state == H1_BODY_LENGTH ? H1_BODY_DONE : H1_CHUNK_CRLF;
            break;
        }
        case H1_CHUNK_SIZE:
            if (chunk_size_byte(b, data[i++]) < 0)
                return -EINVAL;
            break;
        case H1_CHUNK_CRLF:
        case H1_CHUNK_TRAILER: {
            char want = b->line_len ? '\n' : '\r';
            if (data[i++] != want)
                return b->state == H1_CHUNK_CRLF
                           ? err_set(EINVAL, "a chunk's data is not followed by CRLF")
                           : err_set(EINVAL, "the request has trailer fields, which the proxy "
                                             "does not pass");
            if (b->line_len++) {
                b->state = b->state == H1_CHUNK_CRLF ? H1_CHUNK_SIZE : H1_BODY_DONE;
                b->line_len = 0;
            }
            break;
        }
        case H1_BODY_DONE:
            break;
        }
    }
    return (ssize_t)i;
}
