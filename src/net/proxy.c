/* proxy.c - the egress proxy of one session: a Unix socket the sandbox's relay connects to,
 * HTTP CONNECT and plain-HTTP forwarding, resolution outside the sandbox, policy and address
 * checks, caps on connections and bytes, and a report of every attempt.
 *
 * It runs in the daemon as threads: one accepting, one per connection (blocking I/O, small
 * stacks). The number of connection threads is capped per session, so a sandbox cannot make
 * the daemon start threads without bound. */
#include "net/net-int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define THREAD_STACK (256u << 10)
#define CHUNK        16384

struct conn {
    struct egress *e;
    int client;
    int upstream;
    struct conn *prev, *next;
};

struct egress {
    char *dir;
    char *sock_path;
    pthread_mutex_t rules_lock;  /* guards the rules pointer (readers take a reference) */
    pthread_mutex_t change_lock; /* one change at a time */
    struct net_rules *rules;
    uint64_t max_connections, max_bytes; /* the caps, which a change keeps */
    struct net_ca *ca;                   /* NULL without TLS (net_tls_enable) */
    egress_event_fn fn;
    void *ctx;
    int listen_fd;
    int wake[2];
    pthread_t acceptor;
    bool acceptor_running;
    pthread_mutex_t lock; /* guards conns, threads, closing and each conn's fds */
    pthread_cond_t idle;
    struct conn *conns;
    size_t threads;
    bool closing;
    _Atomic uint64_t bytes;
    _Atomic bool budget_reported;
};

static _Atomic uint64_t stat_allowed, stat_refused, stat_bytes_out, stat_bytes_in, stat_active,
    stat_intercepted, stat_secrets_added;

const struct net_tls_ops *net_tls;

bool net_tls_enabled(void)
{
    return net_tls != NULL;
}

void net_stats_intercepted(void)
{
    atomic_fetch_add(&stat_intercepted, 1);
}

void net_stats_secret_added(void)
{
    atomic_fetch_add(&stat_secrets_added, 1);
}

void net_stats_get(struct net_stats *ret)
{
    ret->allowed = atomic_load(&stat_allowed);
    ret->refused = atomic_load(&stat_refused);
    ret->bytes_out = atomic_load(&stat_bytes_out);
    ret->bytes_in = atomic_load(&stat_bytes_in);
    ret->active = atomic_load(&stat_active);
    ret->intercepted = atomic_load(&stat_intercepted);
    ret->secrets_added = atomic_load(&stat_secrets_added);
}

static uint64_t max_connections(const struct egress *e)
{
    return e->max_connections;
}

static uint64_t max_bytes(const struct egress *e)
{
    return e->max_bytes;
}

/* ---- the rules in force ---- */

static struct net_rules *rules_new(struct net_policy *p, struct net_secrets *s)
{
    struct net_rules *r = xcalloc(1, sizeof(*r));
    atomic_init(&r->refs, 1);
    r->policy = p;
    r->secrets = s;
    return r;
}

void net_rules_put(struct net_rules *r)
{
    if (!r || atomic_fetch_sub(&r->refs, 1) != 1)
        return;
    net_policy_free(r->policy);
    net_secrets_free(r->secrets);
    free(r);
}

struct net_rules *egress_rules_get(struct egress *e)
{
    pthread_mutex_lock(&e->rules_lock);
    struct net_rules *r = e->rules;
    atomic_fetch_add(&r->refs, 1);
    pthread_mutex_unlock(&e->rules_lock);
    return r;
}

struct net_ca *egress_ca(struct egress *e)
{
    return e->ca;
}

/* ---- reporting ---- */

/* Logs an event and passes it to the session, without counting it. */
void egress_tell(struct egress *e, const struct egress_event *ev)
{
    log_info("msg=\"egress %s\" method=%s host=%s port=%u address=%s status=%d%s%s%s%s%s%s",
             ev->allowed ? "allowed" : "refused", log_quote(ev->method ? ev->method : "-"),
             log_quote(ev->host ? ev->host : "-"), ev->port, ev->address ? ev->address : "-",
             ev->status, ev->path ? " path=" : "", ev->path ? log_quote(ev->path) : "",
             ev->secret ? " secret_header=" : "", ev->secret ? log_quote(ev->secret) : "",
             ev->reason ? " reason=" : "", ev->reason ? log_quote(ev->reason) : "");
    if (e->fn)
        e->fn(e->ctx, ev);
}

void egress_report(struct egress *e, const struct egress_event *ev)
{
    atomic_fetch_add(ev->allowed ? &stat_allowed : &stat_refused, 1);
    egress_tell(e, ev);
}

/* Control characters, non-ASCII bytes, quotes and backslashes of what a client sent never
 * reach a status line, the daemon's log (a quoted logfmt value) or an event. */
void net_printable(char *s)
{
    for (; *s; s++)
        if (*s < 0x20 || *s > 0x7e || *s == '"' || *s == '\\')
            *s = '?';
}

static const char *status_title(int status)
{
    switch (status) {
    case 400:
        return "Bad Request";
    case 403:
        return "Forbidden";
    case 429:
        return "Too Many Requests";
    case 421:
        return "Misdirected Request";
    case 431:
        return "Request Header Fields Too Large";
    case 501:
        return "Not Implemented";
    case 502:
        return "Bad Gateway";
    case 504:
        return "Gateway Timeout";
    default:
        return "Error";
    }
}

/* An error answer. The reason phrase carries the message too: many clients show only the
 * status line of a failed CONNECT ("Tunnel connection failed: 403 ..."). */
char *egress_answer_text(int status, const char *msg, size_t *ret_len)
{
    char phrase[256];
    if (snprintf(phrase, sizeof(phrase), "%s (runcell egress: %s)", status_title(status), msg) >=
        (int)sizeof(phrase))
        memcpy(phrase + sizeof(phrase) - 5, "...)", 5);
    net_printable(phrase);
    _cleanup_free_ char *body = xasprintf("runcell egress proxy: %s\n", msg);
    char *text =
        xasprintf("HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\n"
                  "X-Runcell-Egress: refused\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n%s",
                  status, phrase, strlen(body), body);
    *ret_len = strlen(text);
    return text;
}

void egress_answer(int fd, int status, const char *msg)
{
    size_t n;
    _cleanup_free_ char *text = egress_answer_text(status, msg, &n);
    (void)send_all(fd, text, n);
}

/* Reports the refusal, then answers status with the message. */
static void refuse(struct conn *c, const struct proxy_request *rq, int status, const char *address,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void refuse(struct conn *c, const struct proxy_request *rq, int status, const char *address,
                   const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    /* The message may quote what the client sent (a request target it could not parse):
     * made safe once, for the answer, the log line and the event alike. */
    net_printable(msg);
    struct egress_event ev = {.method = rq && rq->method[0] ? rq->method : NULL,
                              .host = rq && rq->host[0] ? rq->host : NULL,
                              .port = rq ? rq->port : 0,
                              .address = address,
                              .reason = msg,
                              .status = status};
    /* Recorded before the client hears of it: a cell that ends as soon as it has its answer
     * must find the refusal in its record (and the daemon's log) already. */
    egress_report(c->e, &ev);
    egress_answer(c->client, status, msg);
}

/* ---- connecting ---- */

static int connect_timeout(const struct sockaddr *sa, socklen_t len, int timeout_ms)
{
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -errno;
    if (connect(fd, sa, len) < 0 && errno != EINPROGRESS) {
        int err = errno;
        close(fd);
        return -err;
    }
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int n;
    while ((n = poll(&p, 1, timeout_ms)) < 0 && errno == EINTR)
        ;
    int err = 0;
    socklen_t elen = sizeof(err);
    if (n == 0)
        err = ETIMEDOUT;
    else if (n < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) < 0)
        err = errno;
    if (err) {
        close(fd);
        return -err;
    }
    fd_set_nonblock(fd, false);
    /* Like the client's socket: an upstream that stops reading cannot keep a write (and
     * with it one of the session's connection slots) blocked for ever. */
    struct timeval tv = {.tv_sec = NET_IDLE_TIMEOUT_MS / 1000};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    return fd;
}

static void addr_text(const struct sockaddr_storage *ss, char *out, size_t n)
{
    const void *a = ss->ss_family == AF_INET
                        ? (const void *)&((const struct sockaddr_in *)ss)->sin_addr
                        : (const void *)&((const struct sockaddr_in6 *)ss)->sin6_addr;
    if (!inet_ntop(ss->ss_family, a, out, (socklen_t)n))
        snprintf(out, n, "?");
}

/* Why host:port is refused by the policy: its port, or the host itself. */
static void refuse_by_policy(struct conn *c, const struct net_policy *p,
                             const struct proxy_request *rq)
{
    struct buf allowed;
    buf_init(&allowed, 0);
    for (size_t i = 0; i < p->n && i < 16; i++)
        buf_printf(&allowed, "%s%s", i ? ", " : "", p->entries[i].text);
    if (p->n > 16)
        buf_printf(&allowed, ", and %zu more", p->n - 16);
    if (net_policy_lists_host(p, rq->host))
        refuse(c, rq, 403, NULL,
               "refused %s %s:%u: port %u is not allowed for %s on this "
               "session's network allowlist (%s)",
               rq->method, rq->host, rq->port, rq->port, rq->host, allowed.data);
    else
        refuse(c, rq, 403, NULL,
               "refused %s %s:%u: %s is not on this session's network "
               "allowlist (%s)",
               rq->method, rq->host, rq->port, rq->host, allowed.data);
    buf_release(&allowed);
}

/* Resolves, filters the addresses through the policy, connects to the first allowed one
 * that answers. Returns the socket, or -1 after refusing. */
static int open_upstream(struct conn *c, const struct net_policy *p, const struct proxy_request *rq,
                         const char *rule, char *ret_addr, size_t addr_len)
{
    struct sockaddr_storage addrs[NET_MAX_ADDRS];
    size_t n = 0;
    char text[INET6_ADDRSTRLEN];
    int r = net_resolve(rq->host, rq->port, addrs, &n);
    if (r < 0) {
        refuse(c, rq, 502, NULL, "cannot resolve %s: %s", rq->host, err_msg());
        return -1;
    }
    int last_err = 0;
    const char *why = NULL, *why_addr = NULL;
    char refused_addr[INET6_ADDRSTRLEN] = "";
    for (size_t i = 0; i < n; i++) {
        const char *w;
        addr_text(&addrs[i], text, sizeof(text));
        if (!net_addr_allowed(p, (struct sockaddr *)&addrs[i], rq->port, &w)) {
            if (!why) {
                why = w;
                snprintf(refused_addr, sizeof(refused_addr), "%s", text);
                why_addr = refused_addr;
            }
            continue;
        }
        socklen_t len = addrs[i].ss_family == AF_INET ? sizeof(struct sockaddr_in)
                                                      : sizeof(struct sockaddr_in6);
        int fd = connect_timeout((struct sockaddr *)&addrs[i], len, NET_CONNECT_TIMEOUT_MS);
        if (fd >= 0) {
            snprintf(ret_addr, addr_len, "%s", text);
            return fd;
        }
        last_err = -fd;
        snprintf(ret_addr, addr_len, "%s", text);
    }
    if (last_err)
        refuse(c, rq, last_err == ETIMEDOUT ? 504 : 502, ret_addr,
               "cannot connect to %s (%s) port %u: %s", rq->host, ret_addr, rq->port,
               strerror(last_err));
    else
        refuse(c, rq, 403, why_addr,
               "refused %s %s:%u: %s is %s; only an entry naming that "
               "address exactly (%s%s%s:%u) allows it, and '%s' does not",
               rq->method, rq->host, rq->port, why_addr ? why_addr : "?", why ? why : "not allowed",
               strchr(why_addr ? why_addr : "", ':') ? "[" : "", why_addr ? why_addr : "?",
               strchr(why_addr ? why_addr : "", ':') ? "]" : "", rq->port, rule);
    return -1;
}

/* ---- moving bytes ---- */

static bool over_budget(struct egress *e, size_t n)
{
    return atomic_fetch_add(&e->bytes, n) + n > max_bytes(e);
}

/* Copies both ways until both sides are done (a side that ends gets its peer's write half
 * shut, so half-closed HTTP/1.0 exchanges finish), the session's byte budget runs out, or
 * nothing moves for NET_IDLE_TIMEOUT_MS. Returns true when the budget ran out. */
static bool pump(struct conn *c)
{
    int fds[2] = {c->client, c->upstream};
    bool open[2] = {true, true};
    char *chunk = xmalloc(CHUNK);
    bool budget = false;
    while ((open[0] || open[1]) && !budget) {
        struct pollfd p[2] = {{.fd = open[0] ? fds[0] : -1, .events = POLLIN},
                              {.fd = open[1] ? fds[1] : -1, .events = POLLIN}};
        int n = poll(p, 2, NET_IDLE_TIMEOUT_MS);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        for (int i = 0; i < 2 && !budget; i++) {
            if (!p[i].revents)
                continue;
            ssize_t got = read(fds[i], chunk, CHUNK);
            if (got < 0 && errno == EINTR)
                continue;
            if (got <= 0) {
                open[i] = false;
                shutdown(fds[1 - i], SHUT_WR);
                continue;
            }
            if (over_budget(c->e, (size_t)got)) {
                budget = true;
                break;
            }
            atomic_fetch_add(i == 0 ? &stat_bytes_out : &stat_bytes_in, (uint64_t)got);
            if (send_all(fds[1 - i], chunk, (size_t)got) < 0) {
                open[0] = open[1] = false;
                break;
            }
        }
    }
    free(chunk);
    return budget;
}

/* Sends what the proxy itself passes upstream (a rewritten head, bytes read with it),
 * counted like the rest. */
static int send_up(struct egress *e, int fd, const char *data, size_t n)
{
    if (over_budget(e, n))
        return -EDQUOT;
    atomic_fetch_add(&stat_bytes_out, (uint64_t)n);
    return send_all(fd, data, n);
}

bool egress_charge(struct egress *e, size_t n, bool out)
{
    if (over_budget(e, n))
        return false;
    atomic_fetch_add(out ? &stat_bytes_out : &stat_bytes_in, (uint64_t)n);
    return true;
}

void egress_budget_spent(struct egress *e, const char *method, const char *host, uint16_t port)
{
    if (atomic_exchange(&e->budget_reported, true))
        return;
    char msg[256];
    snprintf(msg, sizeof(msg),
             "the session's network byte budget (%llu bytes) is used up; "
             "the connection was cut and new ones are refused",
             (unsigned long long)max_bytes(e));
    struct egress_event ev = {.method = method, .host = host, .port = port, .reason = msg};
    /* This attempt was counted as allowed when it connected: its cut is an event of its
     * own, not a second attempt for the refused counter. */
    egress_tell(e, &ev);
}

static void report_budget(struct conn *c, const struct proxy_request *rq)
{
    egress_budget_spent(c->e, rq->method, rq->host, rq->port);
}

/* ---- one connection ---- */

static bool set_upstream(struct conn *c, int fd)
{
    pthread_mutex_lock(&c->e->lock);
    bool closing = c->e->closing;
    if (!closing)
        c->upstream = fd;
    pthread_mutex_unlock(&c->e->lock);
    if (closing)
        close(fd);
    return !closing;
}

/* Hands a connection to the TLS part: a CONNECT to a host with secrets (TLS on both sides),
 * or a plain-HTTP request that a secret is for. */
static void intercept(struct conn *c, const struct proxy_request *rq, const struct buf *head,
                      const char *rule, const char *addr)
{
    size_t head_len = head->len - rq->head_off - rq->rest_len;
    struct ix_target t = {.e = c->e,
                          .client = c->client,
                          .upstream = c->upstream,
                          .method = rq->method,
                          .host = rq->host,
                          .port = rq->port,
                          .rule = rule,
                          .address = addr,
                          .tls = rq->connect,
                          .head = head->data + rq->head_off,
                          .head_len = head_len,
                          .rest = head->data + head->len - rq->rest_len,
                          .rest_len = rq->rest_len};
    net_tls->serve(&t);
}

/* Whether the TLS part takes this connection (net_tls is set whenever secrets exist). */
static bool wants_interception(const struct net_rules *rules, const struct proxy_request *rq)
{
    return net_tls && net_secrets_for_host(rules->secrets, rq->host, rq->port, rq->connect);
}

/* Passes the connection on as it is: a tunnel, or one plain-HTTP request forwarded. */
static void relay(struct conn *c, struct proxy_request *rq, struct buf *head, const char *rule,
                  const char *addr)
{
    struct egress *e = c->e;
    struct egress_event ev = {.method = rq->method,
                              .host = rq->host,
                              .port = rq->port,
                              .allowed = true,
                              .rule = rule,
                              .address = addr,
                              .status = 200};
    egress_report(e, &ev);
    int r = rq->connect ? send_all(c->client, "HTTP/1.1 200 Connection established\r\n\r\n", 39)
                        : send_up(e, c->upstream, rq->forward.data, rq->forward.len);
    if (r == 0 && rq->rest_len)
        r = send_up(e, c->upstream, head->data + head->len - rq->rest_len, rq->rest_len);
    if (r == -EDQUOT || (r == 0 && pump(c)))
        report_budget(c, rq);
}

static void serve(struct conn *c)
{
    struct egress *e = c->e;
    struct proxy_request rq;
    struct buf head;
    buf_init(&head, NET_MAX_HEAD + 1);
    int r = proxy_read_request(c->client, &head, &rq);
    /* The rules as they are once the request is in: a change made meanwhile counts. */
    struct net_rules *rules = egress_rules_get(e);
    if (r == -E2BIG) {
        refuse(c, NULL, 431, NULL, "the request head is larger than %d bytes", NET_MAX_HEAD);
    } else if (r < 0) {
        if (r != -ECONNRESET)
            refuse(c, NULL, 400, NULL, "%s", err_msg());
    } else if (atomic_load(&e->bytes) >= max_bytes(e)) {
        refuse(c, &rq, 403, NULL,
               "refused %s %s:%u: the session's network byte budget (%llu "
               "bytes) is used up",
               rq.method, rq.host, rq.port, (unsigned long long)max_bytes(e));
    } else {
        const struct net_entry *rule = net_policy_match(rules->policy, rq.host, rq.port);
        char addr[INET6_ADDRSTRLEN] = "";
        int fd;
        if (!rule) {
            refuse_by_policy(c, rules->policy, &rq);
        } else if ((fd = open_upstream(c, rules->policy, &rq, rule->text, addr, sizeof(addr))) >=
                       0 &&
                   set_upstream(c, fd)) {
            if (wants_interception(rules, &rq))
                intercept(c, &rq, &head, rule->text, addr);
            else
                relay(c, &rq, &head, rule->text, addr);
        }
    }
    net_rules_put(rules);
    buf_release(&rq.forward);
    buf_release(&head);
}

static void conn_end(struct conn *c)
{
    struct egress *e = c->e;
    pthread_mutex_lock(&e->lock);
    if (c->prev)
        c->prev->next = c->next;
    else
        e->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    if (c->upstream >= 0)
        close(c->upstream);
    close(c->client);
    e->threads--;
    atomic_fetch_sub(&stat_active, 1);
    pthread_cond_broadcast(&e->idle);
    pthread_mutex_unlock(&e->lock);
    free(c);
}

static void *conn_thread(void *arg)
{
    struct conn *c = arg;
    struct timeval tv = {.tv_sec = NET_HEAD_TIMEOUT_MS / 1000};
    setsockopt(c->client, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    tv.tv_sec = NET_IDLE_TIMEOUT_MS / 1000;
    setsockopt(c->client, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    serve(c);
    conn_end(c);
    return NULL;
}

/* Takes a new connection: a thread of its own, or a 429 when the session has its maximum
 * open already. */
static void admit(struct egress *e, int fd)
{
    struct conn *c = xcalloc(1, sizeof(*c));
    c->e = e;
    c->client = fd;
    c->upstream = -1;
    pthread_mutex_lock(&e->lock);
    bool full = e->threads >= max_connections(e);
    if (!full && !e->closing) {
        c->next = e->conns;
        if (e->conns)
            e->conns->prev = c;
        e->conns = c;
        e->threads++;
        atomic_fetch_add(&stat_active, 1);
    }
    pthread_mutex_unlock(&e->lock);
    if (full || e->closing) {
        /* Answered without reading the request: the cap must hold even against a client
         * that never sends one. */
        if (full)
            refuse(c, NULL, 429, NULL,
                   "the session has its maximum of %llu connections open "
                   "through the proxy; close one first",
                   (unsigned long long)max_connections(e));
        close(fd);
        free(c);
        return;
    }
    pthread_attr_t attr;
    pthread_t t;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, THREAD_STACK);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int r = pthread_create(&t, &attr, conn_thread, c);
    pthread_attr_destroy(&attr);
    if (r) {
        log_warn("msg=\"egress: cannot start a connection thread\" error=%s",
                 log_quote(strerror(r)));
        c->upstream = -1;
        conn_end(c);
    }
}

static void *acceptor(void *arg)
{
    struct egress *e = arg;
    for (;;) {
        struct pollfd p[2] = {{.fd = e->listen_fd, .events = POLLIN},
                              {.fd = e->wake[0], .events = POLLIN}};
        if (poll(p, 2, -1) < 0 && errno != EINTR)
            break;
        if (p[1].revents)
            break;
        if (!(p[0].revents & POLLIN))
            continue;
        int fd = accept4(e->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0)
            admit(e, fd);
        else if (errno == EMFILE || errno == ENFILE)
            usleep(100000); /* out of fds: let connections finish rather than spin */
    }
    return NULL;
}

/* ---- lifecycle ---- */

static int listen_unix(const char *path, int *ret_fd)
{
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sun.sun_path))
        return err_set(ENAMETOOLONG, "egress socket path %s is too long", path);
    strcpy(sun.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return err_set(errno, "cannot create the egress socket: %s", strerror(errno));
    unlink(path);
    if (bind(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0 || chmod(path, 0666) < 0 ||
        listen(fd, 64) < 0) {
        int err = errno;
        close(fd);
        return err_set(err, "cannot listen on the egress socket %s: %s", path, strerror(err));
    }
    *ret_fd = fd;
    return 0;
}

/* Writes the CA's certificate and the bundle of this host's roots plus it into e->dir. */
static int write_ca_files(struct egress *e)
{
    const char *pem = net_tls->ca_pem(e->ca);
    _cleanup_free_ char *ca_path = xasprintf("%s/%s", e->dir, NET_CA_NAME);
    _cleanup_free_ char *bundle_path = xasprintf("%s/%s", e->dir, NET_BUNDLE_NAME);
    char *roots = NULL;
    size_t roots_len = 0;
    if (read_file(NET_SYSTEM_BUNDLE, 16u << 20, &roots, &roots_len) < 0)
        log_warn("msg=\"egress: no system trust store; the sandbox trusts the session CA only\" "
                 "path=%s",
                 NET_SYSTEM_BUNDLE);
    struct buf b;
    buf_init(&b, 0);
    if (roots_len) {
        buf_append(&b, roots, roots_len);
        if (roots[roots_len - 1] != '\n')
            buf_append(&b, "\n", 1);
    }
    free(roots);
    buf_printf(&b, "# runcell: this session's egress proxy CA\n%s", pem);
    int r = write_file(ca_path, pem, strlen(pem), 0644);
    if (r == 0)
        r = write_file(bundle_path, b.data, b.len, 0644);
    buf_release(&b);
    if (r < 0)
        return err_set(-r, "cannot write the session CA's certificate into %s: %s", e->dir,
                       strerror(-r));
    return 0;
}

int egress_new(const char *dir, const struct net_policy *p, const struct net_secrets *s,
               egress_event_fn fn, void *ctx, struct egress **ret)
{
    struct egress *e = xcalloc(1, sizeof(*e));
    int r;
    e->listen_fd = e->wake[0] = e->wake[1] = -1;
    e->dir = xstrdup(dir);
    e->sock_path = xasprintf("%s/%s", dir, NET_SOCKET_NAME);
    e->rules = rules_new(net_policy_copy(p), s && s->n ? net_secrets_copy(s) : NULL);
    e->max_connections = p->max_connections ? p->max_connections : NET_DEFAULT_MAX_CONNECTIONS;
    e->max_bytes = p->max_bytes ? p->max_bytes : NET_DEFAULT_MAX_BYTES;
    e->fn = fn;
    e->ctx = ctx;
    pthread_mutex_init(&e->lock, NULL);
    pthread_mutex_init(&e->rules_lock, NULL);
    pthread_mutex_init(&e->change_lock, NULL);
    pthread_cond_init(&e->idle, NULL);
    if (e->rules->secrets && !net_tls) {
        r = err_set(ENOTSUP, "this program cannot intercept TLS, so it cannot send secrets; "
                             "run runcell-full");
        goto fail;
    }
    if (mkdir(dir, 0755) < 0 || chmod(dir, 0755) < 0) {
        r = err_set(errno, "cannot create the egress directory %s: %s", dir, strerror(errno));
        goto fail;
    }
    if (net_tls && ((r = net_tls->ca_new(&e->ca)) < 0 || (r = write_ca_files(e)) < 0))
        goto fail;
    if ((r = listen_unix(e->sock_path, &e->listen_fd)) < 0)
        goto fail;
    if (pipe2(e->wake, O_CLOEXEC) < 0) {
        r = err_set(errno, "pipe: %s", strerror(errno));
        goto fail;
    }
    if ((r = pthread_create(&e->acceptor, NULL, acceptor, e))) {
        r = err_set(r, "cannot start the egress proxy thread: %s", strerror(r));
        goto fail;
    }
    e->acceptor_running = true;
    *ret = e;
    return 0;
fail:
    egress_free(e);
    return r;
}

bool egress_has_ca(const struct egress *e)
{
    return e->ca != NULL;
}

int egress_change(struct egress *e, const json_t *change, const struct net_policy *max)
{
    pthread_mutex_lock(&e->change_lock);
    struct net_rules *cur = egress_rules_get(e);
    struct net_policy *np;
    struct net_secrets *ns;
    int r = net_rules_change(cur->policy, cur->secrets, change, max, &np, &ns);
    net_rules_put(cur);
    if (r == 0 && ns && !e->ca) {
        net_policy_free(np);
        net_secrets_free(ns);
        r = err_set(ENOTSUP, "this session's proxy has no CA of its own, so it cannot send "
                             "secrets");
    }
    if (r == 0) {
        struct net_rules *next = rules_new(np, ns);
        pthread_mutex_lock(&e->rules_lock);
        struct net_rules *old = e->rules;
        e->rules = next;
        pthread_mutex_unlock(&e->rules_lock);
        net_rules_put(old);
    }
    pthread_mutex_unlock(&e->change_lock);
    return r;
}

json_t *egress_rules_json(struct egress *e)
{
    struct net_rules *r = egress_rules_get(e);
    json_t *j = net_policy_json(r->policy);
    json_object_set_new(j, "secrets", net_secrets_json(r->secrets));
    net_rules_put(r);
    return j;
}

void egress_rules_copy(struct egress *e, struct net_policy **ret_p, struct net_secrets **ret_s)
{
    struct net_rules *r = egress_rules_get(e);
    *ret_p = net_policy_copy(r->policy);
    *ret_s = r->secrets && r->secrets->n ? net_secrets_copy(r->secrets) : NULL;
    net_rules_put(r);
}

bool egress_has_secrets(struct egress *e)
{
    struct net_rules *r = egress_rules_get(e);
    bool has = r->secrets && r->secrets->n;
    net_rules_put(r);
    return has;
}

size_t egress_scrub(struct egress *e, char *buf, size_t len)
{
    struct net_rules *r = egress_rules_get(e);
    size_t n = net_secrets_scrub(r->secrets, buf, len);
    net_rules_put(r);
    return n;
}

const char *egress_dir(const struct egress *e)
{
    return e->dir;
}

void egress_free(struct egress *e)
{
    if (!e)
        return;
    if (e->acceptor_running) {
        (void)!write(e->wake[1], "x", 1);
        pthread_join(e->acceptor, NULL);
    }
    pthread_mutex_lock(&e->lock);
    e->closing = true;
    /* Shutting the sockets down wakes every thread blocked in poll, read or write on them;
     * one still resolving a name finishes that first. */
    for (struct conn *c = e->conns; c; c = c->next) {
        shutdown(c->client, SHUT_RDWR);
        if (c->upstream >= 0)
            shutdown(c->upstream, SHUT_RDWR);
    }
    while (e->threads)
        pthread_cond_wait(&e->idle, &e->lock);
    pthread_mutex_unlock(&e->lock);
    if (e->listen_fd >= 0) {
        close(e->listen_fd);
        unlink(e->sock_path);
    }
    if (e->ca) {
        _cleanup_free_ char *ca_path = xasprintf("%s/%s", e->dir, NET_CA_NAME);
        _cleanup_free_ char *bundle_path = xasprintf("%s/%s", e->dir, NET_BUNDLE_NAME);
        unlink(ca_path);
        unlink(bundle_path);
        net_tls->ca_free(e->ca);
    }
    rmdir(e->dir);
    for (int i = 0; i < 2; i++)
        if (e->wake[i] >= 0)
            close(e->wake[i]);
    pthread_mutex_destroy(&e->lock);
    pthread_mutex_destroy(&e->rules_lock);
    pthread_mutex_destroy(&e->change_lock);
    pthread_cond_destroy(&e->idle);
    net_rules_put(e->rules);
    free(e->dir);
    free(e->sock_path);
    free(e);
}
