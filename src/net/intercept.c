/* intercept.c - one connection the egress proxy reads into because a secret is for its
 * host: TLS to the real server checked before anything is sent, TLS to the sandbox's client
 * with a certificate of the session's CA, then each HTTP/1.1 request parsed strictly,
 * checked against the rules in force, given its secrets, and forwarded with its body; the
 * answers flow back untouched. Plain HTTP to such a host (allow_http) is one request, the
 * same way. */
#include "net/tls-int.h"

#include <errno.h>
#include <stdarg.h>
#include <openssl/err.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define CHUNK           16384
#define MAX_SECRETS_REQ 16
#define EVENT_PATH_MAX  256

/* One side of the connection: a socket, with TLS or without. */
struct ep {
    int fd;
    SSL *ssl;
    bool open; /* still readable */
};

#define EP_AGAIN (-2)

/* >0 bytes, 0 at a clean end (TLS close_notify or, without TLS, EOF), -1 for an unclean one
 * or an error, EP_AGAIN when a TLS record held no data (a session ticket: the contexts read
 * one record at a time, so that such a record never blocks the other direction). */
static ssize_t ep_read(struct ep *p, char *buf, size_t n)
{
    if (!p->ssl) {
        ssize_t got;
        while ((got = read(p->fd, buf, n)) < 0 && errno == EINTR)
            ;
        return got < 0 ? -1 : got;
    }
    size_t got = 0;
    ERR_clear_error();
    if (SSL_read_ex(p->ssl, buf, n, &got))
        return (ssize_t)got;
    switch (SSL_get_error(p->ssl, 0)) {
    case SSL_ERROR_ZERO_RETURN:
        return 0;
    case SSL_ERROR_WANT_READ:
        return EP_AGAIN;
    default:
        return -1;
    }
}

static int ep_write(struct ep *p, const char *buf, size_t n)
{
    if (!p->ssl)
        return send_all(p->fd, buf, n);
    while (n) {
        size_t done = 0;
        ERR_clear_error();
        if (!SSL_write_ex(p->ssl, buf, n, &done))
            return -EIO;
        buf += done;
        n -= done;
    }
    return 0;
}

/* Ends the writing half cleanly: close_notify with TLS, a FIN without. */
static void ep_end(struct ep *p)
{
    if (p->ssl) {
        ERR_clear_error();
        SSL_shutdown(p->ssl);
    } else {
        shutdown(p->fd, SHUT_WR);
    }
}

static bool ep_pending(const struct ep *p)
{
    return p->open && p->ssl && SSL_pending(p->ssl) > 0;
}

struct ix {
    const struct ix_target *t;
    struct ep client, up;
    enum { IX_HEAD, IX_BODY, IX_RAW, IX_DONE } state;
    struct buf head;     /* the request head being read */
    struct h1_body body; /* where the body being forwarded ends */
    unsigned requests;   /* forwarded so far */
    bool last;           /* the request being forwarded is the connection's last */
    bool upgrade;        /* ... and it asks for an upgrade: opaque bytes after it */
    bool failed;         /* stop: refused, budget spent, an error */
    bool drain;          /* a request after others was refused: no more go upstream, the
                          * answers to those sent are passed on, then the connection ends */
};

/* ---- events ---- */

static void event_base(const struct ix *x, struct egress_event *ev, const char *method)
{
    memset(ev, 0, sizeof(*ev));
    ev->method = method;
    ev->host = x->t->host;
    ev->port = x->t->port;
    ev->rule = x->t->rule;
    ev->address = x->t->address;
}

/* Refuses a request: an answer when nothing was forwarded on this connection yet. Later,
 * answers to earlier requests may still be on their way, and one of ours would be taken for
 * theirs: the upstream is told the connection ends (so it finishes what it was sent), those
 * answers are passed on, and the connection ends after them. */
static void refuse(struct ix *x, const char *method, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void refuse(struct ix *x, const char *method, int status, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    net_printable(msg);
    struct egress_event ev;
    event_base(x, &ev, method && *method ? method : NULL);
    ev.rule = NULL; /* as for every refusal: no rule allowed it */
    ev.reason = msg;
    ev.status = status;
    egress_report(x->t->e, &ev);
    if (!x->requests) {
        size_t n;
        _cleanup_free_ char *text = egress_answer_text(status, msg, &n);
        (void)ep_write(&x->client, text, n);
        x->failed = true;
    } else {
        x->drain = true;
    }
}

static void tell_request(struct ix *x, const struct h1_request *rq,
                         const struct net_secret *const *sel, size_t n)
{
    char path[EVENT_PATH_MAX], names[256] = "";
    snprintf(path, sizeof(path), "%.*s", (int)MIN(rq->path_len, sizeof(path) - 1),
             rq->path_len ? rq->path : "/");
    net_printable(path);
    for (size_t i = 0; i < n; i++)
        snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%s", i ? ", " : "",
                 sel[i]->header);
    struct egress_event ev;
    event_base(x, &ev, rq->method);
    ev.allowed = true;
    ev.path = path;
    ev.secret = n ? names : NULL;
    if (x->t->tls) {
        egress_tell(x->t->e, &ev); /* the CONNECT was the attempt, counted already */
    } else {
        ev.status = 200; /* a plain-HTTP request is an attempt of its own */
        egress_report(x->t->e, &ev);
    }
}

/* ---- moving bytes ---- */

static bool send_upstream(struct ix *x, const char *data, size_t n)
{
    if (!egress_charge(x->t->e, n, true)) {
        egress_budget_spent(x->t->e, x->t->method, x->t->host, x->t->port);
        x->failed = true;
        return false;
    }
    if (ep_write(&x->up, data, n) < 0) {
        x->failed = true;
        return false;
    }
    return true;
}

/* ---- one request ---- */

/* Checks a complete head against the rules in force, adds its secrets, sends it. */
static void forward_head(struct ix *x, const char *head, size_t len)
{
    struct h1_request rq;
    const struct ix_target *t = x->t;
    int status = h1_parse_head(head, len, t->host, t->port, t->tls, &rq);
    if (status) {
        refuse(x, rq.method, status, "refused a request to %s:%u: %s", t->host, t->port, err_msg());
        return;
    }
    struct net_rules *rules = egress_rules_get(t->e);
    const struct net_secret *sel[MAX_SECRETS_REQ];
    size_t n = 0;
    /* Each request of a kept-alive connection follows the rules as they are now. */
    if (!net_policy_match(rules->policy, t->host, t->port)) {
        refuse(x, rq.method, 403,
               "refused %s %s:%u: %s is no longer on this session's network allowlist", rq.method,
               t->host, t->port, t->host);
    } else {
        n = net_secrets_select(rules->secrets, t->host, t->port, t->tls, rq.path, rq.path_len, sel,
                               MAX_SECRETS_REQ);
        struct buf out;
        buf_init(&out, 0);
        /* Plain HTTP is one request per connection upstream, as the proxy always makes it. */
        h1_build_head(&rq, sel, n, !t->tls, &out);
        /* Told before it is sent, like every attempt: a cell that ends at its answer finds
         * it in its record. */
        tell_request(x, &rq, sel, n);
        if (send_upstream(x, out.data, out.len)) {
            x->requests++;
            if (n)
                net_stats_secret_added();
        }
        explicit_bzero(out.data, out.len);
        buf_release(&out);
    }
    net_rules_put(rules);
    if (x->failed)
        return;
    h1_body_init(&x->body, &rq);
    x->last = rq.close || !t->tls;
    x->upgrade = rq.upgrade;
    x->state = IX_BODY;
}

/* What comes after a request's body: the next head, opaque bytes after an upgrade, or
 * nothing. */
static void request_done(struct ix *x)
{
    x->state = x->upgrade ? IX_RAW : x->last ? IX_DONE : IX_HEAD;
}

/* Reads the head from data (n bytes); returns how many it took. */
static size_t take_head(struct ix *x, const char *data, size_t n)
{
    size_t old = x->head.len, room = NET_MAX_HEAD - old;
    size_t take = MIN(n, room);
    buf_append(&x->head, data, take);
    size_t from = old > 3 ? old - 3 : 0;
    const char *end = memmem(x->head.data + from, x->head.len - from, "\r\n\r\n", 4);
    /* A head whose lines end with bare LFs ends at an empty line too: read that far, and
     * the parser refuses it, rather than waiting for a CRLF that never comes. */
    const char *lf = memmem(x->head.data + from, x->head.len - from, "\n\n", 2);
    size_t head_len = end ? (size_t)(end + 4 - x->head.data) : 0;
    if (lf && (!end || lf + 2 < end + 4))
        head_len = (size_t)(lf + 2 - x->head.data);
    if (!head_len) {
        if (x->head.len >= NET_MAX_HEAD)
            refuse(x, NULL, 431, "the request head is larger than %d bytes", NET_MAX_HEAD);
        return take;
    }
    forward_head(x, x->head.data, head_len);
    buf_reset(&x->head);
    return head_len - old;
}

/* Handles n bytes the client sent. */
static void from_client(struct ix *x, const char *data, size_t n)
{
    while (n && !x->failed && !x->drain) {
        size_t used = n;
        switch (x->state) {
        case IX_HEAD:
            used = take_head(x, data, n);
            break;
        case IX_BODY: {
            ssize_t k = h1_body_feed(&x->body, data, n);
            if (k < 0) {
                refuse(x, NULL, 400, "refused a request body to %s:%u: %s", x->t->host, x->t->port,
                       err_msg());
                return;
            }
            used = (size_t)k;
            if (used && !send_upstream(x, data, used))
                return;
            break;
        }
        case IX_RAW:
            if (!send_upstream(x, data, n))
                return;
            break;
        case IX_DONE:
            /* After a request that ends the connection: nothing more goes upstream. */
            break;
        }
        if (x->state == IX_BODY && x->body.state == H1_BODY_DONE)
            request_done(x);
        data += used;
        n -= used;
    }
}

/* ---- the connection ---- */

static void relay(struct ix *x)
{
    char *chunk = xmalloc(CHUNK);
    bool clean_end = true;
    while ((x->client.open || x->up.open) && !x->failed) {
        bool ready[2] = {ep_pending(&x->client), ep_pending(&x->up)};
        if (!ready[0] && !ready[1]) {
            struct pollfd p[2] = {{.fd = x->client.open ? x->client.fd : -1, .events = POLLIN},
                                  {.fd = x->up.open ? x->up.fd : -1, .events = POLLIN}};
            int r = poll(p, 2, NET_IDLE_TIMEOUT_MS);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                break;
            ready[0] = p[0].revents != 0;
            ready[1] = p[1].revents != 0;
        }
        if (ready[0]) {
            ssize_t got = ep_read(&x->client, chunk, CHUNK);
            if (got == EP_AGAIN) {
                /* nothing yet */
            } else if (got > 0) {
                from_client(x, chunk, (size_t)got);
            }
            if (got == 0 || got == -1 || x->drain) {
                x->client.open = false;
                ep_end(&x->up);
            }
        }
        if (ready[1] && !x->failed) {
            ssize_t got = ep_read(&x->up, chunk, CHUNK);
            if (got == EP_AGAIN) {
                /* nothing yet */
            } else if (got > 0) {
                if (!egress_charge(x->t->e, (size_t)got, false)) {
                    egress_budget_spent(x->t->e, x->t->method, x->t->host, x->t->port);
                    x->failed = true;
                } else if (ep_write(&x->client, chunk, (size_t)got) < 0) {
                    x->failed = true;
                }
            } else {
                /* An upstream that ends without close_notify: the client's side ends the
                 * same way, so that it sees a cut answer as cut. */
                x->up.open = false;
                clean_end = got == 0;
                if (!clean_end)
                    break;
                ep_end(&x->client);
            }
        }
    }
    if (x->client.ssl && clean_end && !x->failed)
        ep_end(&x->client);
    free(chunk);
}

/* The upstream's TLS, verified before anything is sent; refuses the CONNECT otherwise. */
static bool upstream_tls(struct ix *x)
{
    const struct ix_target *t = x->t;
    char why[256];
    struct timeval tv = {.tv_sec = NET_CONNECT_TIMEOUT_MS / 1000};
    setsockopt(t->upstream, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    x->up.ssl = tls_upstream_new(t->upstream, t->host);
    ERR_clear_error();
    if (x->up.ssl && SSL_connect(x->up.ssl) == 1) {
        tv.tv_sec = NET_IDLE_TIMEOUT_MS / 1000;
        setsockopt(t->upstream, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        return true;
    }
    long verify = x->up.ssl ? SSL_get_verify_result(x->up.ssl) : X509_V_OK;
    if (verify != X509_V_OK)
        snprintf(why, sizeof(why),
                 "its certificate does not verify against this host's trust "
                 "store: %s",
                 X509_verify_cert_error_string(verify));
    else
        tls_reason(why, sizeof(why));
    char msg[512];
    snprintf(msg, sizeof(msg),
             "refused CONNECT %s:%u: TLS with %s (%s) failed: %s; nothing was sent to it", t->host,
             t->port, t->host, t->address, why);
    net_printable(msg);
    struct egress_event ev;
    event_base(x, &ev, t->method);
    ev.reason = msg;
    ev.status = 502;
    ev.intercepted = true;
    egress_report(t->e, &ev);
    egress_answer(t->client, 502, msg);
    return false;
}

/* The client's TLS, with a certificate of the session's CA for the host it asked for. */
static bool client_tls(struct ix *x)
{
    const struct ix_target *t = x->t;
    if (t->rest_len) {
        refuse(x, t->method, 400, "the client sent data before the proxy answered CONNECT");
        return false;
    }
    if (send_all(t->client, "HTTP/1.1 200 Connection established\r\n\r\n", 39) < 0)
        return false;
    x->client.ssl = tls_client_side_new(egress_ca(t->e), t->client, t->host);
    ERR_clear_error();
    if (x->client.ssl && SSL_accept(x->client.ssl) == 1) {
        struct timeval tv = {.tv_sec = NET_IDLE_TIMEOUT_MS / 1000};
        setsockopt(t->client, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        return true;
    }
    char why[256], msg[512];
    tls_reason(why, sizeof(why));
    snprintf(msg, sizeof(msg),
             "the client's TLS with the proxy for %s failed (%s); a client must trust the "
             "session's CA (%s, which SSL_CERT_FILE names in the sandbox)",
             t->host, why, NET_SANDBOX_BUNDLE);
    net_printable(msg);
    struct egress_event ev;
    event_base(x, &ev, t->method);
    ev.reason = msg;
    egress_tell(t->e, &ev);
    return false;
}

void intercept_serve(const struct ix_target *t)
{
    struct ix x = {
        .t = t, .client = {.fd = t->client, .open = true}, .up = {.fd = t->upstream, .open = true}};
    buf_init(&x.head, NET_MAX_HEAD);
    if (t->tls) {
        if (upstream_tls(&x)) {
            struct egress_event ev;
            event_base(&x, &ev, t->method);
            ev.allowed = true;
            ev.status = 200;
            ev.intercepted = true;
            egress_report(t->e, &ev);
            net_stats_intercepted();
            if (client_tls(&x))
                relay(&x);
        }
    } else {
        from_client(&x, t->head, t->head_len);
        if (!x.failed && t->rest_len)
            from_client(&x, t->rest, t->rest_len);
        if (!x.failed)
            relay(&x);
    }
    SSL_free(x.client.ssl);
    SSL_free(x.up.ssl);
    if (x.head.data)
        explicit_bzero(x.head.data, x.head.len);
    buf_release(&x.head);
}
