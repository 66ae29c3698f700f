/* http.c - /mcp: the MCP server (src/mcp) over Streamable HTTP. POST carries one
 * message (answered with JSON, or with an SSE stream when a tool call runs and the client
 * takes text/event-stream); GET opens a stream for messages outside any request; DELETE ends
 * the session. Sessions are named by the Mcp-Session-Id header given out by initialize.
 * A POST of protocol 2026-07-28 (mcp_http_classify) has no session: one shared connection
 * serves them all, and a client that hangs up on its response cancels its request.
 * Auth is the API's bearer token (the route table checks it); the Origin header is checked
 * here against DNS rebinding. */
#include "mcp/mcp.h"
#include "http/http.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* A GET stream sends a comment this often, so that proxies keep a quiet stream open. */
#define SSE_KEEPALIVE_MS 15000
/* Notifications queued for a slow reader beyond this are dropped (never a response). */
#define STREAM_QUEUE_MAX (2 * MCP_MAX_MESSAGE)

/* ---- a response carrying messages: one JSON body, or an SSE stream ---- */

struct mstream {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int refs;
    struct buf out; /* SSE events not yet read by the response */
    size_t sent;
    char *response; /* the response (or batch), once sent */
    bool closed;    /* no more messages will come */
    bool gone;      /* the client hung up (a GET stream can then be opened again) */
    int notify[2];  /* a byte per change: wakes the reader */
    int client_fd;
    bool keepalive;        /* a GET stream: comments while quiet */
    struct mcp_conn *conn; /* modern era: its client's hang-up cancels its calls there */
};

static struct mstream *mstream_new(int client_fd, bool keepalive)
{
    struct mstream *st = xcalloc(1, sizeof(*st));
    pthread_mutex_init(&st->lock, NULL);
    pthread_cond_init(&st->changed, NULL);
    st->refs = 1;
    buf_init(&st->out, STREAM_QUEUE_MAX);
    st->client_fd = client_fd;
    st->keepalive = keepalive;
    if (pipe2(st->notify, O_CLOEXEC | O_NONBLOCK) < 0) {
        err_set(errno, "cannot create a pipe for the response: %s", strerror(errno));
        buf_release(&st->out);
        pthread_cond_destroy(&st->changed);
        pthread_mutex_destroy(&st->lock);
        free(st);
        return NULL;
    }
    return st;
}

static void mstream_unref(struct mstream *st)
{
    pthread_mutex_lock(&st->lock);
    bool last = --st->refs == 0;
    pthread_mutex_unlock(&st->lock);
    if (!last)
        return;
    close(st->notify[0]);
    close(st->notify[1]);
    buf_release(&st->out);
    free(st->response);
    pthread_cond_destroy(&st->changed);
    pthread_mutex_destroy(&st->lock);
    free(st);
}

static void mstream_wake(struct mstream *st)
{
    pthread_cond_broadcast(&st->changed);
    (void)!write(st->notify[1], "x", 1);
}

static void mstream_send(void *ctx, const char *msg, size_t len, bool response)
{
    struct mstream *st = ctx;
    static const char head[] = "event: message\ndata: ";
    pthread_mutex_lock(&st->lock);
    /* Messages are one line of JSON, so one data: line each. */
    if (st->out.len + sizeof(head) + len + 2 <= STREAM_QUEUE_MAX) {
        buf_append(&st->out, head, sizeof(head) - 1);
        buf_append(&st->out, msg, len);
        buf_append(&st->out, "\n\n", 2);
    } else {
        log_warn("msg=\"mcp stream reader too slow; message dropped\" response=%d", response);
    }
    if (response)
        st->response = xstrndup(msg, len);
    mstream_wake(st);
    pthread_mutex_unlock(&st->lock);
}

static void mstream_close(void *ctx)
{
    struct mstream *st = ctx;
    pthread_mutex_lock(&st->lock);
    st->closed = true;
    mstream_wake(st);
    pthread_mutex_unlock(&st->lock);
    mstream_unref(st);
}

/* Whether the stream still has a reader and a writer. */
static bool mstream_open(struct mstream *st)
{
    pthread_mutex_lock(&st->lock);
    bool open = !st->closed && !st->gone;
    pthread_mutex_unlock(&st->lock);
    return open;
}

static ssize_t copy_out(struct mstream *st, char *out, size_t max)
{
    size_t n = MIN(st->out.len - st->sent, max);
    if (n) /* an empty buffer may have no data at all: memcpy must not get NULL */
        memcpy(out, st->out.data + st->sent, n);
    st->sent += n;
    if (st->sent == st->out.len) {
        buf_reset(&st->out);
        st->sent = 0;
    }
    return (ssize_t)n;
}

static ssize_t mstream_read(void *cls, uint64_t pos, char *out, size_t max)
{
    struct mstream *st = cls;
    (void)pos;
    for (;;) {
        pthread_mutex_lock(&st->lock);
        bool closed = st->closed;
        ssize_t n = st->out.len > st->sent ? copy_out(st, out, max) : 0;
        pthread_mutex_unlock(&st->lock);
        if (n)
            return n;
        if (closed)
            return MHD_CONTENT_READER_END_OF_STREAM;
        /* A hang-up ends the stream, not the call: MCP cancels only by notification. */
        struct pollfd pfd[2] = {{.fd = st->notify[0], .events = POLLIN},
                                {.fd = st->client_fd, .events = POLLRDHUP}};
        int r = poll(pfd, 2, st->keepalive ? SSE_KEEPALIVE_MS : -1);
        if (r < 0)
            continue;
        if (pfd[1].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
            pthread_mutex_lock(&st->lock);
            st->gone = true;
            pthread_mutex_unlock(&st->lock);
            if (st->conn)
                mcp_conn_cancel_sink(st->conn, st);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (r == 0) {
            static const char ka[] = ": keepalive\n\n";
            size_t k = MIN(sizeof(ka) - 1, max);
            memcpy(out, ka, k);
            return (ssize_t)k;
        }
        char drain[64];
        while (read(st->notify[0], drain, sizeof(drain)) > 0)
            ;
    }
}

static void mstream_release_cb(void *cls)
{
    struct mstream *st = cls;
    pthread_mutex_lock(&st->lock);
    st->gone = true;
    bool cancel = !st->closed && st->conn;
    pthread_mutex_unlock(&st->lock);
    if (cancel) /* the response ended before its last message: the client is gone */
        mcp_conn_cancel_sink(st->conn, st);
    mstream_unref(st);
}

/* Hands the caller's reference to an SSE response. */
static enum MHD_Result reply_sse(struct request *rq, struct mstream *st, const char *session_id)
{
    struct MHD_Response *r = MHD_create_response_from_callback(
        MHD_SIZE_UNKNOWN, 16 * 1024, mstream_read, st, mstream_release_cb);
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-store");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    if (session_id)
        MHD_add_response_header(r, "Mcp-Session-Id", session_id);
    return reply_response(rq, 200, r);
}

/* ---- MCP sessions of the server ---- */

struct msession {
    char *id;
    struct mcp_conn *conn;
    int refs;
    bool ended;
    uint64_t last_used_ms;
    struct mstream *get_stream; /* the open GET stream, or NULL */
    struct msession *next;
};

struct mcp_http {
    pthread_mutex_t lock;
    pthread_cond_t freed;
    struct msession *head;
    size_t live;  /* sessions not yet freed, ended ones still in use included */
    size_t count; /* sessions in the list */
    struct mcp_config cfg;
    uint64_t idle_ms;
    size_t max;
    char *const *origins;
    const char *node;        /* named in session ids (the server's; borrowed) */
    struct mcp_conn *shared; /* serves the modern era's requests */
};

struct mcp_http *mcp_http_new(struct server *srv)
{
    struct mcp_http *m = xcalloc(1, sizeof(*m));
    pthread_mutex_init(&m->lock, NULL);
    pthread_cond_init(&m->freed, NULL);
    m->cfg = (struct mcp_config){
        .table = srv->table,
        .defaults = srv->cfg->defaults,
        .max_timeout_ms = srv->cfg->limits.max_timeout_ms,
        .reply_deadline_ms = MCP_REPLY_DEADLINE_MS,
        .server_version = RUNCELL_VERSION,
    };
    m->cfg.defaults.output_cap = MCP_DEFAULT_OUTPUT_CAP;
    m->cfg.defaults.history = MCP_DEFAULT_HISTORY;
    m->idle_ms = srv->cfg->defaults.idle_timeout_ms;
    m->max = srv->cfg->limits.max_sessions;
    m->origins = srv->cfg->mcp_origins;
    m->node = srv->node;
    m->shared = mcp_conn_new_shared(&m->cfg);
    return m;
}

static void msession_free(struct mcp_http *m, struct msession *ms)
{
    mcp_conn_free(ms->conn); /* interrupts its calls, closes its sessions */
    free(ms->id);
    free(ms);
    pthread_mutex_lock(&m->lock);
    m->live--;
    pthread_cond_broadcast(&m->freed);
    pthread_mutex_unlock(&m->lock);
}

/* Takes ms out of the list; the caller holds the lock. Its running calls answer with an
 * error giving reason. Returns it when nobody uses it, to be freed outside the lock. */
static struct msession *end_locked(struct mcp_http *m, struct msession *ms, const char *reason)
{
    for (struct msession **p = &m->head; *p; p = &(*p)->next) {
        if (*p == ms) {
            *p = ms->next;
            break;
        }
    }
    m->count--;
    ms->ended = true;
    if (ms->get_stream) {
        mstream_close(ms->get_stream);
        ms->get_stream = NULL;
    }
    mcp_conn_end(ms->conn, reason);
    return ms->refs ? NULL : ms;
}

/* Idle: no request holds it, no call runs, no GET stream is open, and neither the last
 * request nor the last call's end is more recent than the idle timeout. now was read
 * before the lock, so another request or a call's end may have stamped a later time:
 * that is no idle at all (ms_since), never one that wrapped to forever. */
static bool idle_expired(struct mcp_http *m, struct msession *ms, uint64_t now)
{
    uint64_t last = MAX(ms->last_used_ms, mcp_conn_last_active_ms(ms->conn));
    return !ms->refs && ms_since(now, last) > m->idle_ms && !mcp_conn_busy(ms->conn) &&
           !(ms->get_stream && mstream_open(ms->get_stream));
}

/* Ends the sessions idle longer than the idle timeout. */
static void sweep(struct mcp_http *m)
{
    for (;;) {
        struct msession *victim = NULL;
        uint64_t now = now_ms();
        pthread_mutex_lock(&m->lock);
        for (struct msession *ms = m->head; ms && !victim; ms = ms->next)
            if (idle_expired(m, ms, now))
                victim = end_locked(m, ms, "the MCP session expired");
        pthread_mutex_unlock(&m->lock);
        if (!victim)
            return;
        log_info("msg=\"mcp session expired\" mcp_session=%s", victim->id);
        msession_free(m, victim);
    }
}

static struct msession *msession_acquire(struct mcp_http *m, const char *id)
{
    struct msession *found = NULL, *expired = NULL;
    uint64_t now = now_ms();
    pthread_mutex_lock(&m->lock);
    for (struct msession *ms = m->head; ms && !found; ms = ms->next)
        if (!strcmp(ms->id, id))
            found = ms;
    if (found && idle_expired(m, found, now)) {
        expired = end_locked(m, found, "the MCP session expired");
        found = NULL;
    } else if (found) {
        found->refs++;
        found->last_used_ms = now;
    }
    pthread_mutex_unlock(&m->lock);
    if (expired)
        msession_free(m, expired);
    return found;
}

static void msession_release(struct mcp_http *m, struct msession *ms)
{
    pthread_mutex_lock(&m->lock);
    bool last = --ms->refs == 0 && ms->ended;
    ms->last_used_ms = now_ms();
    pthread_mutex_unlock(&m->lock);
    if (last)
        msession_free(m, ms);
}

/* Registers an initialized connection; NULL (and the connection freed) when full. */
static struct msession *msession_add(struct mcp_http *m, struct mcp_conn *conn)
{
    sweep(m);
    pthread_mutex_lock(&m->lock);
    if (m->max && m->count >= m->max) {
        pthread_mutex_unlock(&m->lock);
        mcp_conn_free(conn);
        return NULL;
    }
    struct msession *ms = xcalloc(1, sizeof(*ms));
    _cleanup_free_ char *hex = random_hex(16);
    /* Named by the node as session ids are, so a router pins the connection to it. */
    ms->id = m->node ? xasprintf("%s-%s", m->node, hex) : xstrdup(hex);
    ms->conn = conn;
    ms->refs = 1;
    ms->last_used_ms = now_ms();
    ms->next = m->head;
    m->head = ms;
    m->count++;
    m->live++;
    pthread_mutex_unlock(&m->lock);
    return ms;
}

void mcp_http_free(struct mcp_http *m)
{
    if (!m)
        return;
    for (;;) {
        pthread_mutex_lock(&m->lock);
        struct msession *victim =
            m->head ? end_locked(m, m->head, "the server is shutting down") : NULL;
        bool more = m->head != NULL;
        pthread_mutex_unlock(&m->lock);
        if (victim)
            msession_free(m, victim);
        if (!victim && !more)
            break;
    }
    /* Requests still holding an ended session drop it once their cancelled calls return. */
    pthread_mutex_lock(&m->lock);
    while (m->live)
        pthread_cond_wait(&m->freed, &m->lock);
    pthread_mutex_unlock(&m->lock);
    mcp_conn_end(m->shared, "the server is shutting down");
    mcp_conn_free(m->shared);
    pthread_cond_destroy(&m->freed);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

/* ---- checks every /mcp request goes through ---- */

static const char *header(struct request *rq, const char *name)
{
    return MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, name);
}

/* A JSON-RPC error with no id, for failures outside any request. */
static enum MHD_Result mcp_http_error(struct request *rq, unsigned status, int code,
                                      const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static enum MHD_Result mcp_http_error(struct request *rq, unsigned status, int code,
                                      const char *fmt, ...)
{
    va_list ap;
    char *msg;
    va_start(ap, fmt);
    int n = vasprintf(&msg, fmt, ap);
    va_end(ap);
    char *text = mcp_error_json(code, n < 0 ? "error" : msg);
    if (n >= 0)
        free(msg);
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "application/json");
    return reply_response(rq, status, r);
}

/* Whether an origin "scheme://host[:port]" names this machine's loopback interface. */
static bool origin_is_loopback(const char *origin)
{
    const char *host = strstr(origin, "://");
    if (!host || (strncasecmp(origin, "http://", 7) && strncasecmp(origin, "https://", 8)))
        return false;
    host += 3;
    if (host[0] == '[' && !strchr(host, ']'))
        return false;
    size_t n = host[0] == '[' ? strcspn(host, "]") + 1 : strcspn(host, ":/");
    const char *rest = host + n;
    if (*rest && *rest != ':' && *rest != '/')
        return false;
    if (n == 9 && !strncasecmp(host, "localhost", 9))
        return true;
    if (n == 5 && !strncmp(host, "[::1]", 5))
        return true;
    /* 127.0.0.0/8: four numeric parts, the first 127 */
    if (n < 9 || n > 15 || strncmp(host, "127.", 4))
        return false;
    int dots = 0;
    for (size_t i = 0; i < n; i++) {
        if (host[i] == '.')
            dots++;
        else if (host[i] < '0' || host[i] > '9')
            return false;
    }
    return dots == 3;
}

/* Browsers send Origin; a page of another site (DNS rebinding included) must not drive the
 * server. Clients that are not browsers send none. */
static bool origin_allowed(struct request *rq, const char *origin)
{
    if (!origin)
        return true;
    if (origin_is_loopback(origin))
        return true;
    for (char *const *o = rq->srv->mcp->origins; o && *o; o++)
        if (!strcasecmp(*o, origin))
            return true;
    return false;
}

static bool accepts(struct request *rq, const char *type)
{
    return header(rq, "Accept") && accept_q(rq, type) > 0;
}

/* The era of a request (mcp_http_classify); after replying when it is refused. */
static enum mcp_http_era classify(struct request *rq, const char *body, size_t len)
{
    struct mcp_http_headers h = {.protocol_version = header(rq, "MCP-Protocol-Version"),
                                 .method = header(rq, "Mcp-Method"),
                                 .name = header(rq, "Mcp-Name")};
    unsigned status;
    char *text;
    enum mcp_http_era era = mcp_http_classify(&h, body, len, &status, &text);
    if (era == MCP_HTTP_REJECT) {
        struct MHD_Response *r =
            MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
        MHD_add_response_header(r, "Content-Type", "application/json");
        reply_response(rq, status, r);
    }
    return era;
}

/* Protocol 2026-07-28 has no GET stream and no session to DELETE; false after replying. */
static bool refuse_modern(struct request *rq)
{
    const char *version = header(rq, "MCP-Protocol-Version");
    if (!version || !mcp_version_modern(version))
        return true;
    mcp_http_error(rq, 405, MCP_INVALID_REQUEST,
                   "Method Not Allowed: protocol %s has no GET stream and no session to DELETE; "
                   "POST each request (subscriptions/listen is not offered)",
                   version);
    return false;
}

/* The checks shared by POST, GET and DELETE (a POST's version is classify's); false after
 * replying. */
static bool check_request(struct request *rq, bool post)
{
    const char *origin = header(rq, "Origin");
    if (!origin_allowed(rq, origin)) {
        mcp_http_error(rq, 403, -32000,
                       "Forbidden: requests from origin '%s' are not allowed; "
                       "start the server with --allow-origin %s to allow them",
                       origin, origin);
        return false;
    }
    const char *version = header(rq, "MCP-Protocol-Version");
    if (!post && version && !mcp_version_supported(version))
        return classify(rq, "", 0) != MCP_HTTP_REJECT; /* replies -32022 */
    return true;
}

/* The session named by Mcp-Session-Id (a reference), or NULL after replying 400 or 404. */
static struct msession *find_session(struct request *rq)
{
    const char *id = header(rq, "Mcp-Session-Id");
    if (!id) {
        mcp_http_error(rq, 400, MCP_INVALID_REQUEST,
                       "Bad Request: no Mcp-Session-Id header; "
                       "send initialize first and use the session id it returns");
        return NULL;
    }
    struct msession *ms = msession_acquire(rq->srv->mcp, id);
    if (!ms) {
        mcp_http_error(rq, 404, MCP_INVALID_REQUEST,
                       "Not Found: no MCP session %s (it ended "
                       "or expired); send initialize to start a new one",
                       id);
        return NULL;
    }
    /* The session is served as the version its initialize negotiated. The header SHOULD name
     * that version (2025-11-25); another version this server speaks is no reason to refuse
     * (the official conformance suite sends 2025-03-26 on a 2025-11-25 session), and one it
     * does not speak was refused before. */
    return ms;
}

/* ---- POST ---- */

static struct mcp_sink sink_for(struct mstream *st)
{
    pthread_mutex_lock(&st->lock);
    st->refs++; /* the sink's own, dropped by close */
    pthread_mutex_unlock(&st->lock);
    return (struct mcp_sink){.send = mstream_send, .close = mstream_close, .ctx = st};
}

/* Waits until the input's last message was sent; on the modern era a client that hangs up
 * meanwhile cancels its calls. Called with st->lock held. */
static void wait_closed(struct mstream *st)
{
    while (!st->closed) {
        if (!st->conn || st->client_fd < 0) {
            pthread_cond_wait(&st->changed, &st->lock);
            continue;
        }
        pthread_mutex_unlock(&st->lock);
        struct pollfd p[2] = {{.fd = st->notify[0], .events = POLLIN},
                              {.fd = st->client_fd, .events = POLLRDHUP}};
        bool hung_up = poll(p, 2, -1) > 0 && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR));
        char drain[64];
        while (read(st->notify[0], drain, sizeof(drain)) > 0)
            ;
        if (hung_up) {
            mcp_conn_cancel_sink(st->conn, st);
            st->conn = NULL; /* once; its calls end without a response and close st */
        }
        pthread_mutex_lock(&st->lock);
    }
}

/* Waits for the input's last message, then replies with the response as JSON. */
static enum MHD_Result reply_when_done(struct request *rq, struct mstream *st, unsigned status,
                                       const char *session_id)
{
    pthread_mutex_lock(&st->lock);
    wait_closed(st);
    char *text = st->response ? xstrdup(st->response) : NULL;
    pthread_mutex_unlock(&st->lock);
    struct MHD_Response *r;
    if (!text) /* the request was cancelled: it gets no response */
        r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    else
        r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (text)
        MHD_add_response_header(r, "Content-Type", "application/json");
    if (session_id)
        MHD_add_response_header(r, "Mcp-Session-Id", session_id);
    return reply_response(rq, text ? status : 204, r);
}

/* Handles the body on a connection and replies; takes the caller's reference on st. */
static enum MHD_Result answer(struct request *rq, struct mcp_conn *conn, struct mstream *st,
                              const char *session_id)
{
    struct mcp_sink sink = sink_for(st);
    enum mcp_input in =
        mcp_conn_handle(conn, rq->body.data ? rq->body.data : "", rq->body.len, &sink);
    enum MHD_Result ret;
    pthread_mutex_lock(&st->lock);
    bool done = st->closed;
    pthread_mutex_unlock(&st->lock);
    if (in == MCP_IN_NONE) {
        struct MHD_Response *r =
            MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        ret = reply_response(rq, 202, r);
    } else if (in != MCP_IN_REQUEST) {
        ret = reply_when_done(rq, st, mcp_http_status(in), session_id);
    } else if ((!done || !accepts(rq, "application/json")) && accepts(rq, "text/event-stream")) {
        return reply_sse(rq, st, session_id); /* the response owns st now */
    } else {
        ret = reply_when_done(rq, st, 200, session_id);
    }
    mstream_unref(st);
    return ret;
}

static bool check_post(struct request *rq)
{
    const char *type = header(rq, "Content-Type");
    if (type && strncasecmp(type, "application/json", 16)) {
        mcp_http_error(rq, 415, MCP_INVALID_REQUEST,
                       "Unsupported Media Type: send the "
                       "message as application/json, not %s",
                       type);
        return false;
    }
    if (header(rq, "Accept") && !accepts(rq, "application/json") &&
        !accepts(rq, "text/event-stream")) {
        mcp_http_error(rq, 406, MCP_INVALID_REQUEST,
                       "Not Acceptable: the answer is "
                       "application/json or text/event-stream; list both in Accept");
        return false;
    }
    return true;
}

/* A POST without a session must be initialize; the session starts if it succeeds. */
static enum MHD_Result post_initialize(struct request *rq)
{
    struct mcp_http *m = rq->srv->mcp;
    struct mstream *st = mstream_new(-1, false);
    if (!st)
        return mcp_http_error(rq, 503, MCP_INTERNAL_ERROR, "%s", err_msg());
    struct mcp_conn *conn = mcp_conn_new(&m->cfg);
    struct mcp_sink sink = sink_for(st);
    mcp_conn_handle(conn, rq->body.data ? rq->body.data : "", rq->body.len, &sink);
    enum MHD_Result ret;
    if (!mcp_conn_version(conn)) {
        mcp_conn_free(conn);
        pthread_mutex_lock(&st->lock);
        char *text = st->closed && st->response ? xstrdup(st->response) : NULL;
        pthread_mutex_unlock(&st->lock);
        /* A failed initialize (or a parse error) says what went wrong; anything else
         * (a ping, say) was answered, but without a session it cannot go on. */
        json_t *j = text ? json_loads(text, 0, NULL) : NULL;
        if (!json_object_get(j, "error")) {
            free(text);
            text = NULL;
        }
        json_decref(j);
        if (text) {
            struct MHD_Response *r =
                MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
            MHD_add_response_header(r, "Content-Type", "application/json");
            ret = reply_response(rq, 400, r);
        } else {
            ret = mcp_http_error(rq, 400, MCP_INVALID_REQUEST,
                                 "Bad Request: no "
                                 "Mcp-Session-Id header; send initialize first and use the "
                                 "session id it returns");
        }
    } else {
        struct msession *ms = msession_add(m, conn);
        if (!ms) {
            ret = mcp_http_error(rq, 429, MCP_SERVER_BUSY,
                                 "the server holds its maximum of "
                                 "%zu MCP sessions; end one (DELETE /mcp) or wait for idle "
                                 "ones to expire",
                                 m->max);
        } else {
            log_info("msg=\"mcp session started\" mcp_session=%s protocol=%s", ms->id,
                     mcp_conn_version(conn));
            ret = reply_when_done(rq, st, 200, ms->id);
            msession_release(m, ms);
        }
    }
    mstream_unref(st);
    return ret;
}

/* A POST of protocol 2026-07-28: no session, the shared connection. */
static enum MHD_Result post_modern(struct request *rq)
{
    struct mstream *st = mstream_new(client_fd(rq), false);
    if (!st)
        return mcp_http_error(rq, 503, MCP_INTERNAL_ERROR, "%s", err_msg());
    st->conn = rq->srv->mcp->shared;
    return answer(rq, st->conn, st, NULL);
}

static enum MHD_Result h_mcp_post(struct request *rq)
{
    if (!check_request(rq, true) || !check_post(rq))
        return MHD_YES;
    switch (classify(rq, rq->body.data ? rq->body.data : "", rq->body.len)) {
    case MCP_HTTP_REJECT:
        return MHD_YES;
    case MCP_HTTP_MODERN:
        return post_modern(rq);
    case MCP_HTTP_LEGACY:
        break;
    }
    if (!header(rq, "Mcp-Session-Id"))
        return post_initialize(rq);
    struct msession *ms = find_session(rq);
    if (!ms)
        return MHD_YES;
    struct mstream *st = mstream_new(client_fd(rq), false);
    enum MHD_Result ret = st ? answer(rq, ms->conn, st, NULL)
                             : mcp_http_error(rq, 503, MCP_INTERNAL_ERROR, "%s", err_msg());
    msession_release(rq->srv->mcp, ms);
    return ret;
}

/* ---- GET: a stream for messages outside any request ---- */

static enum MHD_Result h_mcp_get(struct request *rq)
{
    if (!check_request(rq, false) || !refuse_modern(rq))
        return MHD_YES;
    if (!accepts(rq, "text/event-stream"))
        return mcp_http_error(rq, 406, MCP_INVALID_REQUEST,
                              "Not Acceptable: GET /mcp opens "
                              "an event stream; send Accept: text/event-stream");
    /* A GET for an event stream before any session is how a client of the HTTP+SSE
     * transport (2024-11-05) starts; that transport is not offered. */
    if (!header(rq, "Mcp-Session-Id"))
        return mcp_http_error(rq, 400, MCP_INVALID_REQUEST,
                              "Bad Request: no Mcp-Session-Id "
                              "header. This server speaks the Streamable HTTP transport (MCP "
                              "2025-03-26 and later): POST initialize to /mcp, then GET /mcp "
                              "with the Mcp-Session-Id it returns; the HTTP+SSE transport of "
                              "2024-11-05 (GET an endpoint event, POST to /messages) is not "
                              "offered");
    struct msession *ms = find_session(rq);
    if (!ms)
        return MHD_YES;
    struct mcp_http *m = rq->srv->mcp;
    struct mstream *st = NULL;
    pthread_mutex_lock(&m->lock);
    bool busy = ms->get_stream && mstream_open(ms->get_stream);
    if (!busy) {
        if (ms->get_stream)
            mstream_close(ms->get_stream); /* its client left: drop our reference */
        ms->get_stream = st = mstream_new(client_fd(rq), true);
        if (st)
            st->refs++; /* the session's, dropped when the session ends */
    }
    pthread_mutex_unlock(&m->lock);
    msession_release(m, ms);
    if (busy)
        return mcp_http_error(rq, 409, MCP_INVALID_REQUEST,
                              "Conflict: this session already "
                              "has an open GET stream");
    if (!st)
        return mcp_http_error(rq, 503, MCP_INTERNAL_ERROR, "%s", err_msg());
    return reply_sse(rq, st, NULL);
}

/* ---- DELETE: the client ends its session ---- */

static enum MHD_Result h_mcp_delete(struct request *rq)
{
    if (!check_request(rq, false) || !refuse_modern(rq))
        return MHD_YES;
    struct msession *ms = find_session(rq);
    if (!ms)
        return MHD_YES;
    struct mcp_http *m = rq->srv->mcp;
    pthread_mutex_lock(&m->lock);
    if (!ms->ended)
        /* we hold a reference: the release below frees it */
        end_locked(m, ms, "the MCP session was ended by its client (DELETE /mcp)");
    pthread_mutex_unlock(&m->lock);
    log_info("msg=\"mcp session ended\" mcp_session=%s", ms->id);
    msession_release(m, ms);
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    return reply_response(rq, 204, r);
}

static const struct route mcp_routes[] = {
    {"POST", "/mcp", h_mcp_post, 0, NULL},
    {"GET", "/mcp", h_mcp_get, 0, NULL},
    {"DELETE", "/mcp", h_mcp_delete, 0, NULL},
};

/* An MCP session lives on the node its id names. */
static const char *mcp_pinned_id(struct request *rq, bool *ret_before_auth)
{
    (void)ret_before_auth;
    return header(rq, "Mcp-Session-Id");
}

const struct surface mcp_surface = {.name = "mcp",
                                    .routes = mcp_routes,
                                    .n_routes = ARRAY_SIZE(mcp_routes),
                                    .pinned_id = mcp_pinned_id};
