/* uphead.c - an upstream server's answer head, as libcurl hands it over line by line: what
 * the preview proxy (http/proxy.c) and a fleet's forwarder (api/fleet_forward.c) pass on to
 * their client. The upstream may be hostile (a server in a sandbox): the head is capped in
 * size, and only well-formed lines that are not hop-by-hop go through. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "http/http.h"

void up_head_init(struct up_head *h, const char *const *also_dropped)
{
    memset(h, 0, sizeof(*h));
    h->lines = xcalloc(1, sizeof(char *));
    h->also_dropped = also_dropped;
}

void up_head_release(struct up_head *h)
{
    strv_free(h->lines);
    h->lines = NULL;
}

static bool named(const char *name, size_t n, const char *const *names)
{
    for (const char *const *p = names; p && *p; p++)
        if (strlen(*p) == n && !strncasecmp(name, *p, n))
            return true;
    return false;
}

/* Hop-by-hop headers and those the server in front makes itself: never passed on (RFC 9110
 * 7.6.1). */
static const char *const hop_by_hop[] = {
    "connection", "keep-alive", "proxy-connection", "transfer-encoding",
    "te",         "trailer",    "upgrade",          "content-length",
    NULL};

bool http_hop_header(const char *name, size_t n)
{
    return named(name, n, hop_by_hop);
}

static bool token_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

enum up_head_result up_head_line(struct up_head *h, const char *data, size_t len)
{
    h->bytes += len;
    if (h->bytes > UP_HEAD_MAX)
        return UP_HEAD_TOO_LARGE;
    while (len && (data[len - 1] == '\n' || data[len - 1] == '\r'))
        len--;
    if (len >= 5 && !strncmp(data, "HTTP/", 5)) {
        strv_free(h->lines); /* a new head: an interim one's lines go */
        h->lines = xcalloc(1, sizeof(char *));
        h->n = 0;
        /* curl's line is not NUL-terminated: the code's three digits are read within it,
         * followed by a space or the line's end */
        const char *sp = memchr(data, ' ', len);
        size_t at = sp ? (size_t)(sp - data) + 1 : len, digits = 0;
        long code = 0;
        for (; digits < 3 && at < len && data[at] >= '0' && data[at] <= '9'; digits++, at++)
            code = code * 10 + (data[at] - '0');
        bool ok = digits == 3 && code >= 100 && (at == len || data[at] == ' ');
        h->status = ok ? code : 502;
        return UP_HEAD_MORE;
    }
    if (!len) {
        h->done = h->status >= 200; /* a 1xx head is followed by the real one */
        return h->done ? UP_HEAD_DONE : UP_HEAD_MORE;
    }
    size_t name_len = 0;
    while (name_len < len && token_char(data[name_len]))
        name_len++;
    bool ok = name_len && name_len < len && data[name_len] == ':' && !memchr(data, '\0', len) &&
              h->n < UP_HEADERS_MAX && !http_hop_header(data, name_len) &&
              !named(data, name_len, h->also_dropped);
    if (!ok)
        return UP_HEAD_MORE;
    const char *v = data + name_len + 1;
    while (v < data + len && (*v == ' ' || *v == '\t'))
        v++;
    /* a CR inside a line would end the header where the client reads it */
    if (memchr(v, '\r', (size_t)(data + len - v)))
        return UP_HEAD_MORE;
    _cleanup_free_ char *line =
        xasprintf("%.*s: %.*s", (int)name_len, data, (int)(data + len - v), v);
    h->lines = strv_push(h->lines, line);
    h->n++;
    return UP_HEAD_MORE;
}
