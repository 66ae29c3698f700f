/* fleet_forward.c - routing that follows ownership: a request for a session that another live
 * node of the fleet owns is reverse-proxied to that node (its body streamed there as it
 * arrives, the answer streamed back as it comes), and a fenced node refuses work at once. */
#include "api/api.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define FORWARD_HOPS_MAX   2          /* a stale view may send a request on once more */
#define BODY_QUEUE_MAX     (1u << 20) /* request bytes waiting for the owner */
#define ANSWER_QUEUE_MAX   (1u << 20) /* answer bytes waiting for the client */
#define PROBE_TIMEOUT_MS   1000
#define CONNECT_TIMEOUT_MS 2000

struct forward {
    struct server *srv;
    char owner[40];
    char address[272];
    char *url;
    char method[16];
    long long body_len; /* -1: chunked; 0: none */
    struct curl_slist *headers;
    pthread_t worker;
    bool started;
    int refs; /* the request's and the response's */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct buf body; /* request bytes not yet sent */
    size_t body_off;
    bool body_end;       /* the client's body is all here */
    bool upstream_done;  /* the transfer ended: body bytes are dropped */
    bool sent_any;       /* a byte of the request went out */
    struct up_head head; /* the owner's answer's (head.done: all of it is in) */
    bool failed;
    char error[CURL_ERROR_SIZE + 128];
    struct out_stream os;
};

enum MHD_Result fleet_reply_fenced(struct request *rq, const char *why)
{
    char secs[24];
    snprintf(secs, sizeof(secs), "%llu",
             (unsigned long long)MAX(1, fleet_ttl_ms(rq->srv->fleet) / 3000));
    return api_error_header(rq, AE_FENCED, "Retry-After", secs, "%s", why);
}

/* ---- the worker: one libcurl transfer to the owner ---- */

static size_t on_read(char *out, size_t size, size_t nmemb, void *arg)
{
    struct forward *fw = arg;
    size_t max = size * nmemb, n;
    pthread_mutex_lock(&fw->lock);
    while (fw->body.len == fw->body_off && !fw->body_end)
        pthread_cond_wait(&fw->cond, &fw->lock);
    n = MIN(max, fw->body.len - fw->body_off);
    if (n) {
        memcpy(out, fw->body.data + fw->body_off, n);
        fw->body_off += n;
        if (fw->body_off == fw->body.len) {
            buf_reset(&fw->body);
            fw->body_off = 0;
        }
        fw->sent_any = true;
    }
    pthread_cond_broadcast(&fw->cond);
    pthread_mutex_unlock(&fw->lock);
    return n;
}

/* Besides the hop-by-hop headers: the one this node sets itself. */
static const char *const own_headers[] = {"x-runcell-node", NULL};

static size_t on_header(char *line, size_t size, size_t nmemb, void *arg)
{
    struct forward *fw = arg;
    pthread_mutex_lock(&fw->lock);
    enum up_head_result r = up_head_line(&fw->head, line, size * nmemb);
    if (r == UP_HEAD_DONE)
        pthread_cond_broadcast(&fw->cond);
    pthread_mutex_unlock(&fw->lock);
    return r == UP_HEAD_TOO_LARGE ? 0 : size * nmemb; /* 0: not an answer passed on */
}

static size_t pending(struct out_stream *os)
{
    pthread_mutex_lock(&os->lock);
    size_t n = os->out.len;
    pthread_mutex_unlock(&os->lock);
    return n;
}

static size_t on_write(char *data, size_t size, size_t nmemb, void *arg)
{
    struct forward *fw = arg;
    size_t n = size * nmemb;
    /* The client reads at its pace: past the queue's cap the owner waits (TCP does the rest),
     * unless the client went away. */
    while (pending(&fw->os) > ANSWER_QUEUE_MAX) {
        struct pollfd pfd = {.fd = fw->os.cancel[0], .events = POLLIN};
        if (poll(&pfd, 1, 10) > 0)
            return 0;
    }
    struct pollfd pfd = {.fd = fw->os.cancel[0], .events = POLLIN};
    if (poll(&pfd, 1, 0) > 0)
        return 0;
    out_stream_append(&fw->os, data, n);
    return n;
}

/* The client went away: the transfer stops, whatever the owner is doing. */
static int on_progress(void *arg, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
    struct forward *fw = arg;
    struct pollfd pfd = {.fd = fw->os.cancel[0], .events = POLLIN};
    (void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
    return poll(&pfd, 1, 0) > 0;
}

static void forward_unref(struct forward *fw)
{
    pthread_mutex_lock(&fw->lock);
    bool last = --fw->refs == 0;
    pthread_mutex_unlock(&fw->lock);
    if (!last)
        return;
    if (fw->started)
        pthread_join(fw->worker, NULL);
    out_stream_release(&fw->os);
    curl_slist_free_all(fw->headers);
    up_head_release(&fw->head);
    buf_release(&fw->body);
    free(fw->url);
    pthread_cond_destroy(&fw->cond);
    pthread_mutex_destroy(&fw->lock);
    free(fw);
}

static void *worker_main(void *arg)
{
    struct forward *fw = arg;
    char errbuf[CURL_ERROR_SIZE] = "";
    CURL *h = curl_easy_init();
    CURLcode c = CURLE_FAILED_INIT;
    if (h) {
        curl_easy_setopt(h, CURLOPT_URL, fw->url);
        curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http");
        curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
        curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
        curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)CONNECT_TIMEOUT_MS);
        /* A cell may run for an hour before its answer: no overall timeout, but a host that
         * vanished is noticed by TCP keepalive. */
        curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
        curl_easy_setopt(h, CURLOPT_TCP_KEEPIDLE, 10L);
        curl_easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 5L);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, fw->headers);
        curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(h, CURLOPT_HEADERDATA, fw);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, fw);
        curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(h, CURLOPT_XFERINFODATA, fw);
        curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
        if (!strcmp(fw->method, "HEAD"))
            curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
        else
            curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, fw->method);
        if (fw->body_len) {
            /* a body sent as it comes from the client, its length as the client gave it */
            curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
            curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)fw->body_len);
            curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
            curl_easy_setopt(h, CURLOPT_READDATA, fw);
        }
        c = curl_easy_perform(h);
        curl_easy_cleanup(h);
    }
    pthread_mutex_lock(&fw->lock);
    fw->upstream_done = true;
    if (!fw->head.done) {
        fw->failed = true;
        snprintf(fw->error, sizeof(fw->error), "%s", *errbuf ? errbuf : curl_easy_strerror(c));
    }
    pthread_cond_broadcast(&fw->cond);
    pthread_mutex_unlock(&fw->lock);
    out_stream_finish(&fw->os);
    forward_unref(fw);
    return NULL;
}

/* ---- the request side ---- */

struct header_ctx {
    struct curl_slist *list;
    bool bad;
};

static enum MHD_Result add_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                  const char *value)
{
    struct header_ctx *x = cls;
    (void)kind;
    if (!value || http_hop_header(key, strlen(key)) || !strcasecmp(key, "X-Runcell-Node") ||
        !strcasecmp(key, "Host") || !strcasecmp(key, "Expect") ||
        !strcasecmp(key, "X-Runcell-Forwarded"))
        return MHD_YES;
    if (strpbrk(key, "\r\n") || strpbrk(value, "\r\n")) {
        x->bad = true;
        return MHD_NO;
    }
    _cleanup_free_ char *line = xasprintf("%s: %s", key, value);
    x->list = curl_slist_append(x->list, line);
    return MHD_YES;
}

static int hops_of(struct request *rq)
{
    const char *h = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "X-Runcell-Forwarded");
    uint64_t n = 0;
    return h && parse_u64(h, &n) == 0 ? (int)MIN(n, 100) : 0;
}

/* Whether something accepts connections at address (HOST:PORT) within the probe timeout: a
 * node that died refuses them, and its sessions are then taken over rather than forwarded. */
static bool reachable(const char *address)
{
    _cleanup_free_ char *copy = xstrdup(address);
    char *port = strrchr(copy, ':'), *host = copy;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *ai;
    if (!port)
        return false;
    *port++ = '\0';
    if (*host == '[' && host[strlen(host) - 1] == ']') {
        host++;
        host[strlen(host) - 1] = '\0';
    }
    if (getaddrinfo(host, port, &hints, &ai))
        return false;
    bool ok = false;
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd >= 0) {
        int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (r == 0) {
            ok = true;
        } else if (errno == EINPROGRESS) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            int err = 0;
            socklen_t len = sizeof(err);
            ok = poll(&pfd, 1, PROBE_TIMEOUT_MS) == 1 &&
                 getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
        }
        close(fd);
    }
    freeaddrinfo(ai);
    return ok;
}

static int forward_chunk(struct request *rq, const char *data, size_t n)
{
    struct forward *fw = rq->forward;
    pthread_mutex_lock(&fw->lock);
    while (fw->body.len - fw->body_off + n > BODY_QUEUE_MAX && !fw->upstream_done)
        pthread_cond_wait(&fw->cond, &fw->lock);
    if (!fw->upstream_done) /* else the owner answered already: the rest is not wanted */
        buf_append(&fw->body, data, n);
    pthread_cond_broadcast(&fw->cond);
    pthread_mutex_unlock(&fw->lock);
    return 0;
}

/* The answer's bytes, as the owner sends them (http_stream's source). */
static int answer_pull(void *src, struct buf *out)
{
    struct forward *fw = src;
    return out_stream_pull(&fw->os, out);
}

static int answer_wait_fd(void *src)
{
    struct forward *fw = src;
    return fw->os.notify[0];
}

static void answer_clear(void *src)
{
    struct forward *fw = src;
    out_stream_clear(&fw->os);
}

static void answer_left(void *src) /* the client went away: the transfer stops */
{
    struct forward *fw = src;
    out_stream_cancel(&fw->os);
}

static void answer_free(void *src)
{
    forward_unref(src);
}

static const struct http_source_ops answer_ops = {
    .pull = answer_pull,
    .wait_fd = answer_wait_fd,
    .clear = answer_clear,
    .left = answer_left,
    .free = answer_free,
};

static enum MHD_Result forward_finish(struct request *rq)
{
    struct forward *fw = rq->forward;
    pthread_mutex_lock(&fw->lock);
    fw->body_end = true;
    pthread_cond_broadcast(&fw->cond);
    while (!fw->head.done && !fw->failed)
        pthread_cond_wait(&fw->cond, &fw->lock);
    bool failed = fw->failed;
    pthread_mutex_unlock(&fw->lock);
    if (failed)
        return api_error(rq, AE_BAD_GATEWAY,
                         "session %s is run by node %s (%s), and forwarding this request there "
                         "failed: %s; it %s, send it again",
                         rq->params[0], fw->owner, fw->address, fw->error,
                         fw->sent_any ? "may have reached that node" : "did not reach that node");
    char **headers = NULL;
    for (char **h = fw->head.lines; h && *h; h++)
        headers = strv_push(headers, *h);
    _cleanup_free_ char *node = xasprintf("X-Runcell-Node: %s", fw->owner);
    _cleanup_free_ char *by = xasprintf("X-Runcell-Forwarded-By: %s", rq->srv->node);
    headers = strv_push(headers, node);
    headers = strv_push(headers, by);
    pthread_mutex_lock(&fw->lock);
    fw->refs++; /* the response's, until answer_free */
    pthread_mutex_unlock(&fw->lock);
    enum MHD_Result ret =
        http_stream_headers(rq, (unsigned)fw->head.status, headers, &answer_ops, fw, 0);
    strv_free(headers);
    return ret;
}

static const struct route forward_route = {
    .method = "*",
    .pattern = "(forwarded to the session's node)",
    .handle = forward_finish,
    .flags = ROUTE_STREAM_BODY,
    .upload = forward_chunk,
};

static bool start_forward(struct request *rq, const struct fleet_owner *o)
{
    struct forward *fw = xcalloc(1, sizeof(*fw));
    struct header_ctx hx = {0};
    fw->srv = rq->srv;
    fw->refs = 1;
    up_head_init(&fw->head, own_headers);
    snprintf(fw->owner, sizeof(fw->owner), "%s", o->node);
    snprintf(fw->address, sizeof(fw->address), "%s", o->address);
    pthread_mutex_init(&fw->lock, NULL);
    pthread_cond_init(&fw->cond, NULL);
    buf_init(&fw->body, 0);
    if (out_stream_init(&fw->os) < 0) {
        forward_unref(fw);
        return false;
    }
    MHD_get_connection_values(rq->conn, MHD_HEADER_KIND, add_header, &hx);
    if (hx.bad) {
        curl_slist_free_all(hx.list);
        forward_unref(fw);
        return false;
    }
    _cleanup_free_ char *hops = xasprintf("X-Runcell-Forwarded: %d", hops_of(rq) + 1);
    hx.list = curl_slist_append(hx.list, hops);
    hx.list = curl_slist_append(hx.list, "Expect:");
    const char *cl = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Content-Length");
    uint64_t len = 0;
    if (cl && parse_u64(cl, &len) == 0)
        fw->body_len = (long long)len;
    else if (MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Transfer-Encoding"))
        fw->body_len = -1;
    snprintf(fw->method, sizeof(fw->method), "%s", rq->method);
    fw->headers = hx.list;
    fw->url = xasprintf("http://%s%s", o->address, rq->raw_uri);
    rq->forward = fw;
    fw->refs++; /* the worker's */
    fw->started = true;
    if (pthread_create(&fw->worker, NULL, worker_main, fw) != 0) {
        fw->started = false;
        fw->refs--;
        rq->forward = NULL;
        forward_unref(fw);
        return false;
    }
    return true;
}

static bool is_session_route(const struct route *r)
{
    return !strncmp(r->pattern, "/v1/sessions/{id}", 17);
}

static bool owned_here(struct server *srv, const char *id)
{
    int err;
    struct session *s = session_table_acquire(srv->table, id, &err);
    if (s)
        session_table_put(srv->table, s);
    return s != NULL;
}

/* The id of a session that never moves (an E2B sandbox, an MCP session: nothing of them is
 * stored), where its surface names it (struct surface's pinned_id); NULL for other requests.
 * It lives on the node its id names. */
static const char *pinned_id(struct request *rq, bool *ret_before_auth)
{
    *ret_before_auth = false;
    return rq->surface && rq->surface->pinned_id ? rq->surface->pinned_id(rq, ret_before_auth)
                                                 : NULL;
}

/* Forwards a request for a pinned session whose id names another live node. */
static bool route_pinned(struct request *rq, const char *id)
{
    struct fleet_owner o = {.kind = OWNER_REMOTE};
    _cleanup_free_ char *node = session_id_node(id);
    if (!node || !strcmp(node, rq->srv->node) || strlen(node) >= sizeof(o.node) ||
        hops_of(rq) >= FORWARD_HOPS_MAX ||
        fleet_node_address(rq->srv->fleet, node, o.address) < 0 || !reachable(o.address))
        return false; /* served here: it is this node's, or its node is gone (404) */
    snprintf(o.node, sizeof(o.node), "%s", node);
    if (!start_forward(rq, &o))
        return false;
    rq->route = &forward_route;
    log_info("msg=\"forwarding to the node named in the id\" session=%s owner=%s", id, node);
    return true;
}

bool fleet_route(struct request *rq)
{
    struct server *srv = rq->srv;
    const char *why, *id = rq->params[0];
    struct fleet_owner o;
    /* Health, metrics and the console's static files are no work: served whatever the fence. */
    if (!srv->fleet || (rq->route->flags & ROUTE_NO_AUTH) || rq->route->handle == h_metrics)
        return false;
    /* A request whose credentials only its session's node can check (an E2B sandbox's access
     * token) comes here before them: it is forwarded when its id names another node, and
     * otherwise left to that check, whatever the state of this node. */
    bool before_auth;
    const char *pinned = pinned_id(rq, &before_auth);
    if (!rq->authenticated)
        return before_auth && pinned && route_pinned(rq, pinned);
    if (!fleet_admitting(srv->fleet, &why)) {
        fleet_reply_fenced(rq, why);
        return true;
    }
    if (pinned)
        return route_pinned(rq, pinned);
    if (!is_session_route(rq->route) || !id || !session_id_valid(id) || owned_here(srv, id) ||
        hops_of(rq) >= FORWARD_HOPS_MAX)
        return false;
    double t0 = now_ms_f();
    if (fleet_lookup(srv->fleet, id, hops_of(rq) > 0, &o) < 0 || o.kind != OWNER_REMOTE)
        return false; /* the handler takes it over, or says why not */
    if (!reachable(o.address)) {
        log_warn("msg=\"the session's node does not answer; taking over once its lease ends\" "
                 "session=%s owner=%s address=%s",
                 id, o.node, o.address);
        return false;
    }
    if (!start_forward(rq, &o))
        return false;
    rq->route = &forward_route;
    log_info("msg=\"forwarding to the session's node\" session=%s owner=%s address=%s "
             "lookup_ms=%.1f",
             id, o.node, o.address, now_ms_f() - t0);
    return true;
}

bool fleet_forward_now(struct request *rq)
{
    struct fleet_owner o;
    const char *id = rq->params[0];
    if (!id || !rq->route || (rq->route->flags & ROUTE_STREAM_BODY) ||
        hops_of(rq) >= FORWARD_HOPS_MAX || fleet_lookup(rq->srv->fleet, id, true, &o) < 0 ||
        o.kind != OWNER_REMOTE || !reachable(o.address) || !start_forward(rq, &o))
        return false;
    /* The body is all here already (a JSON body): it goes as it is. */
    pthread_mutex_lock(&rq->forward->lock);
    if (rq->body.len)
        buf_append(&rq->forward->body, rq->body.data, rq->body.len);
    pthread_mutex_unlock(&rq->forward->lock);
    log_info("msg=\"forwarding to the node that won the takeover\" session=%s owner=%s", id,
             o.node);
    forward_finish(rq);
    return true;
}

void fleet_forward_free(struct request *rq)
{
    struct forward *fw = rq->forward;
    if (!fw)
        return;
    rq->forward = NULL;
    /* A request that ends before its answer (the client left): the worker stops. */
    pthread_mutex_lock(&fw->lock);
    fw->body_end = true;
    pthread_cond_broadcast(&fw->cond);
    pthread_mutex_unlock(&fw->lock);
    out_stream_cancel(&fw->os);
    forward_unref(fw);
}
