/* stream.c - streamed responses: the one reader that hands a response's bytes to
 * libmicrohttpd as they are made, waits for more, sends keepalives on a quiet stream and
 * notices a client that hangs up; over two kinds of source: an execution's kept events,
 * written by a surface's encoder (NDJSON, E2B's NDJSON, Connect envelopes), and a queue of
 * bytes that a worker thread appends to (the agent's progress).
 *
 * What waits for a slow client is bounded where it is made: an execution's events are what
 * session_execute emits (the output cap of each stream, RESULTS_CAP of results and the final
 * record, itself made of those capped parts), encoded a batch at a time; a queue's appender
 * is bounded by its own producer. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "http/http.h"

/* ---- the one reader ---- */

struct hstream {
    const struct http_source_ops *ops;
    void *src;
    int client_fd;
    int keepalive_ms;
    struct buf out; /* pulled, not sent yet */
    size_t sent;
    bool over; /* the source said it has nothing more */
    bool left; /* the client went away first */
};

/* Copies what is pulled and not yet sent into out; its length. */
static size_t copy_pending(struct hstream *h, char *out, size_t max)
{
    size_t n = MIN(h->out.len - h->sent, max);
    if (n)
        memcpy(out, h->out.data + h->sent, n);
    h->sent += n;
    if (h->sent == h->out.len) {
        buf_reset(&h->out);
        h->sent = 0;
    }
    return n;
}

static ssize_t hstream_read(void *cls, uint64_t pos, char *out, size_t max)
{
    struct hstream *h = cls;
    (void)pos;
    for (;;) {
        size_t n = copy_pending(h, out, max);
        if (n)
            return (ssize_t)n;
        if (h->over)
            return MHD_CONTENT_READER_END_OF_STREAM;
        /* Cleared before the pull: what comes after it wakes the poll below. */
        if (h->ops->clear)
            h->ops->clear(h->src);
        h->over = h->ops->pull(h->src, &h->out) == 1;
        if (h->out.len || h->over)
            continue;
        struct pollfd pfd[2] = {{.fd = h->ops->wait_fd(h->src), .events = POLLIN},
                                {.fd = h->client_fd, .events = POLLRDHUP}};
        int pr = poll(pfd, 2, h->keepalive_ms > 0 ? h->keepalive_ms : -1);
        if (pr < 0)
            continue;
        if (pfd[1].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
            h->left = true;
            if (h->ops->left)
                h->ops->left(h->src);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (pr == 0 && h->ops->keepalive)
            h->ops->keepalive(h->src, &h->out);
    }
}

static void hstream_free(void *cls)
{
    struct hstream *h = cls;
    /* Ended before the source was over: the client left (or the server stops). */
    if (!h->over && !h->left && h->ops->left)
        h->ops->left(h->src);
    h->ops->free(h->src);
    buf_release(&h->out);
    free(h);
}

enum MHD_Result http_stream(struct request *rq, unsigned status, const char *content_type,
                            const struct http_source_ops *ops, void *src, int keepalive_ms)
{
    _cleanup_free_ char *ct = xasprintf("Content-Type: %s", content_type);
    _cleanup_free_ char *cc = xstrdup("Cache-Control: no-store");
    char *headers[3] = {ct, cc, NULL};
    return http_stream_headers(rq, status, headers, ops, src, keepalive_ms);
}

enum MHD_Result http_stream_headers(struct request *rq, unsigned status, char *const *headers,
                                    const struct http_source_ops *ops, void *src, int keepalive_ms)
{
    struct hstream *h = xcalloc(1, sizeof(*h));
    h->ops = ops;
    h->src = src;
    h->client_fd = client_fd(rq);
    h->keepalive_ms = keepalive_ms;
    buf_init(&h->out, 0);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024,
                                                               hstream_read, h, hstream_free);
    if (!r) {
        hstream_free(h);
        return MHD_NO;
    }
    for (char *const *hd = headers; hd && *hd; hd++) {
        const char *colon = strchr(*hd, ':');
        if (!colon)
            continue;
        _cleanup_free_ char *name = xstrndup(*hd, (size_t)(colon - *hd));
        MHD_add_response_header(r, name, colon + 1 + strspn(colon + 1, " \t"));
    }
    return reply_response(rq, status, r);
}

/* ---- an execution's events, through a surface's encoder ---- */

#define EXEC_PULL_BATCH 64

struct exec_source {
    struct execution *x;
    struct exec_watch *w;
    uint64_t after;
    const struct exec_encoder *enc;
    void *enc_ctx; /* the encoder's, freed with enc->free */
    bool begun;
    bool interrupt_on_leave;
    struct session_table *t; /* a reference on s to drop at the end, or NULL */
    struct session *s;
};

static int exec_pull(void *src, struct buf *out)
{
    struct exec_source *es = src;
    struct exec_item items[EXEC_PULL_BATCH];
    if (!es->begun) {
        es->begun = true;
        if (es->enc->begin)
            es->enc->begin(es->enc_ctx, es->x, out);
    }
    size_t n = execution_read(es->x, es->after, items, EXEC_PULL_BATCH);
    bool over = false;
    for (size_t i = 0; i < n; i++) {
        es->enc->event(es->enc_ctx, es->x, &items[i], out);
        es->after = items[i].seq;
        over |= items[i].type == EV_DONE;
    }
    exec_items_release(items, n);
    return over ? 1 : 0;
}

static int exec_wait_fd(void *src)
{
    return exec_watch_fd(((struct exec_source *)src)->w);
}

static void exec_clear(void *src)
{
    exec_watch_clear(((struct exec_source *)src)->w);
}

static void exec_keepalive(void *src, struct buf *out)
{
    struct exec_source *es = src;
    if (es->enc->keepalive)
        es->enc->keepalive(es->enc_ctx, out);
}

static void exec_left(void *src)
{
    struct exec_source *es = src;
    if (es->interrupt_on_leave)
        execution_cancel(es->x);
}

static void exec_source_free(void *src)
{
    struct exec_source *es = src;
    if (es->enc->free)
        es->enc->free(es->enc_ctx);
    exec_watch_free(es->w);
    execution_unref(es->x);
    if (es->t)
        session_table_put(es->t, es->s);
    free(es);
}

static const struct http_source_ops exec_source_ops = {
    .pull = exec_pull,
    .wait_fd = exec_wait_fd,
    .clear = exec_clear,
    .keepalive = exec_keepalive,
    .left = exec_left,
    .free = exec_source_free,
};

enum MHD_Result http_stream_execution(struct request *rq, struct execution *x, uint64_t after,
                                      const struct exec_encoder *enc, void *enc_ctx,
                                      const struct exec_stream_opts *o)
{
    struct exec_source *es = xcalloc(1, sizeof(*es));
    es->x = x;
    es->after = after;
    es->enc = enc;
    es->enc_ctx = enc_ctx;
    es->interrupt_on_leave = o && o->interrupt_on_leave;
    if (o && o->table) {
        es->t = o->table;
        es->s = o->session;
    }
    int r = execution_watch(x, &es->w);
    if (r < 0) {
        if (enc->free)
            enc->free(enc_ctx);
        execution_unref(x);
        if (es->t)
            session_table_put(es->t, es->s);
        free(es);
        return api_errno(rq, r);
    }
    return http_stream(rq, 200, enc->content_type, &exec_source_ops, es, o ? o->keepalive_ms : 0);
}

/* ---- a queue of bytes that a worker appends to ---- */

int out_stream_init(struct out_stream *os)
{
    memset(os, 0, sizeof(*os));
    os->notify[0] = os->notify[1] = os->cancel[0] = os->cancel[1] = -1;
    if (pipe2(os->notify, O_CLOEXEC | O_NONBLOCK) < 0 || pipe2(os->cancel, O_CLOEXEC) < 0) {
        int e = -errno;
        out_stream_release(os);
        return err_set(-e, "cannot make a stream's pipes: %s", strerror(-e));
    }
    pthread_mutex_init(&os->lock, NULL);
    buf_init(&os->out, 0);
    os->ready = true;
    return 0;
}

void out_stream_append(struct out_stream *os, const void *data, size_t n)
{
    pthread_mutex_lock(&os->lock);
    buf_append(&os->out, data, n);
    pthread_mutex_unlock(&os->lock);
    (void)!write(os->notify[1], "x", 1);
}

void out_stream_finish(struct out_stream *os)
{
    pthread_mutex_lock(&os->lock);
    os->finished = true;
    pthread_mutex_unlock(&os->lock);
    (void)!write(os->notify[1], "x", 1);
}

int out_stream_pull(struct out_stream *os, struct buf *out)
{
    pthread_mutex_lock(&os->lock);
    if (os->out.len)
        buf_append(out, os->out.data, os->out.len);
    buf_reset(&os->out);
    bool finished = os->finished;
    pthread_mutex_unlock(&os->lock);
    return finished ? 1 : 0;
}

void out_stream_clear(struct out_stream *os)
{
    char drain[64];
    while (read(os->notify[0], drain, sizeof(drain)) > 0)
        ;
}

void out_stream_cancel(struct out_stream *os)
{
    (void)!write(os->cancel[1], "x", 1);
}

void out_stream_release(struct out_stream *os)
{
    for (int i = 0; i < 2; i++) {
        if (os->notify[i] >= 0)
            close(os->notify[i]);
        if (os->cancel[i] >= 0)
            close(os->cancel[i]);
        os->notify[i] = os->cancel[i] = -1;
    }
    if (os->ready) {
        buf_release(&os->out);
        pthread_mutex_destroy(&os->lock);
        os->ready = false;
    }
}
