/* outstream.c - a response body that a worker thread makes as it goes (NDJSON lines, Connect
 * envelopes) and libmicrohttpd's reader sends: the one place that hands bytes between them,
 * wakes the reader, and notices a client that hangs up while the worker is quiet.
 *
 * The body waiting for a slow client is not capped here, because it is bounded where it is
 * made: a cell's events are what session_execute emits, at most the output cap of each stream,
 * RESULTS_CAP of results and the final record (itself made of those capped parts), JSON-escaped;
 * nothing a sandbox writes reaches a stream any other way. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "http/http.h"

int out_stream_init(struct out_stream *os, int client_fd, int keepalive_ms,
                    void (*keepalive)(struct out_stream *os))
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
    os->client_fd = client_fd;
    os->keepalive_ms = keepalive_ms;
    os->keepalive = keepalive;
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

/* What is there to send, into out: its length, 0 when nothing is. *ret_finished says whether
 * the worker is done. */
static size_t take(struct out_stream *os, char *out, size_t max, bool *ret_finished)
{
    pthread_mutex_lock(&os->lock);
    size_t n = MIN(os->out.len - os->sent, max);
    if (n) /* an empty buffer may have no data at all: memcpy must not get NULL */
        memcpy(out, os->out.data + os->sent, n);
    os->sent += n;
    if (os->sent == os->out.len) {
        buf_reset(&os->out);
        os->sent = 0;
    }
    *ret_finished = os->finished;
    pthread_mutex_unlock(&os->lock);
    return n;
}

ssize_t out_stream_read(struct out_stream *os, char *out, size_t max)
{
    for (;;) {
        bool finished;
        size_t n = take(os, out, max, &finished);
        if (n)
            return (ssize_t)n;
        if (finished)
            return MHD_CONTENT_READER_END_OF_STREAM;
        struct pollfd pfd[2] = {{.fd = os->notify[0], .events = POLLIN},
                                {.fd = os->client_fd, .events = POLLRDHUP}};
        int pr = poll(pfd, 2, os->keepalive ? os->keepalive_ms : -1);
        if (pr < 0)
            continue;
        if (pfd[1].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
            out_stream_cancel(os);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (pr == 0) {
            os->keepalive(os);
            continue;
        }
        char drain[64];
        while (read(os->notify[0], drain, sizeof(drain)) > 0)
            ;
    }
}

void out_stream_cancel(struct out_stream *os)
{
    (void)!write(os->cancel[1], "x", 1);
}

bool out_stream_end(struct out_stream *os)
{
    pthread_mutex_lock(&os->lock);
    bool finished = os->finished;
    pthread_mutex_unlock(&os->lock);
    if (!finished)
        out_stream_cancel(os);
    return finished;
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
