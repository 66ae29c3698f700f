/* proxy.c - forwarding one HTTP request over a connection the caller made (to a server in a
 * sandbox) and streaming the answer back: libcurl speaks HTTP/1.1 to the server on its own
 * thread, and the response reaches the client through the one streaming reader, a bounded
 * buffer between them. What the server answers is hostile input: its head is capped in
 * size and count, its header lines are passed on only when they are well formed, and its
 * body waits in at most PROXY_BUFFER bytes for a slow client. */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "http/http.h"

#define PROXY_BUFFER       (1u << 20) /* of the body, waiting for the client */
#define PROXY_HEAD_WAIT_MS 120000     /* a dev server may build the page it is asked for */

struct proxy_job {
    atomic_int refs;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int fd; /* the connection to the server, curl's until it ends */
    /* the request */
    char *url, *method;
    struct curl_slist *req_headers;
    char *body;
    size_t body_len;
    /* the response's head */
    struct up_head head;
    bool head_bad;
    /* its body, and the end */
    struct buf out;
    bool done, left;
    CURLcode result;
    char error[CURL_ERROR_SIZE];
    int notify[2];
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

static void curl_init_once(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

static void job_unref(struct proxy_job *j)
{
    if (atomic_fetch_sub(&j->refs, 1) != 1)
        return;
    free(j->url);
    free(j->method);
    free(j->body);
    curl_slist_free_all(j->req_headers);
    up_head_release(&j->head);
    buf_release(&j->out);
    for (int i = 0; i < 2; i++)
        if (j->notify[i] >= 0)
            close(j->notify[i]);
    if (j->fd >= 0)
        close(j->fd);
    pthread_cond_destroy(&j->changed);
    pthread_mutex_destroy(&j->lock);
    free(j);
}

static void wake(struct proxy_job *j)
{
    pthread_cond_broadcast(&j->changed);
    (void)!write(j->notify[1], "x", 1);
}

/* One line of the server's head (uphead.c). */
static size_t on_header(char *data, size_t size, size_t n, void *ctx)
{
    struct proxy_job *j = ctx;
    pthread_mutex_lock(&j->lock);
    enum up_head_result r = up_head_line(&j->head, data, size * n);
    if (r == UP_HEAD_TOO_LARGE)
        j->head_bad = true;
    else if (r == UP_HEAD_DONE)
        wake(j);
    pthread_mutex_unlock(&j->lock);
    return r == UP_HEAD_TOO_LARGE ? 0 : size * n; /* 0: curl stops, the head is too large */
}

/* The body as it comes: buffered up to PROXY_BUFFER, then the server waits for the client
 * (TCP's own back-pressure), or is cut when the client has gone. */
static size_t on_body(char *data, size_t size, size_t n, void *ctx)
{
    struct proxy_job *j = ctx;
    size_t len = size * n;
    pthread_mutex_lock(&j->lock);
    while (!j->left && j->out.len >= PROXY_BUFFER)
        pthread_cond_wait(&j->changed, &j->lock);
    bool left = j->left;
    if (!left)
        buf_append(&j->out, data, len);
    wake(j);
    pthread_mutex_unlock(&j->lock);
    return left ? 0 : len;
}

static curl_socket_t open_socket(void *ctx, curlsocktype purpose, struct curl_sockaddr *addr)
{
    struct proxy_job *j = ctx;
    (void)purpose;
    (void)addr;
    int fd = j->fd;
    j->fd = -1; /* curl's now: it closes it */
    if (fd >= 0)
        fd_set_nonblock(fd, false);
    return fd >= 0 ? fd : CURL_SOCKET_BAD;
}

static int already_connected(void *ctx, curl_socket_t fd, curlsocktype purpose)
{
    (void)ctx;
    (void)fd;
    (void)purpose;
    return CURL_SOCKOPT_ALREADY_CONNECTED;
}

static void *worker(void *arg)
{
    struct proxy_job *j = arg;
    CURL *c = curl_easy_init();
    if (c) {
        curl_easy_setopt(c, CURLOPT_URL, j->url);
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, j->method);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, j->req_headers);
        curl_easy_setopt(c, CURLOPT_OPENSOCKETFUNCTION, open_socket);
        curl_easy_setopt(c, CURLOPT_OPENSOCKETDATA, j);
        curl_easy_setopt(c, CURLOPT_SOCKOPTFUNCTION, already_connected);
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(c, CURLOPT_HEADERDATA, j);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, j);
        curl_easy_setopt(c, CURLOPT_ERRORBUFFER, j->error);
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(c, CURLOPT_FORBID_REUSE, 1L);
        curl_easy_setopt(c, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
        curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http");
        if (!strcmp(j->method, "HEAD"))
            curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
        else if (j->body_len || strcmp(j->method, "GET")) {
            curl_easy_setopt(c, CURLOPT_POSTFIELDS, j->body ? j->body : "");
            curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)j->body_len);
        }
    }
    CURLcode r = c ? curl_easy_perform(c) : CURLE_OUT_OF_MEMORY;
    curl_easy_cleanup(c);
    pthread_mutex_lock(&j->lock);
    j->result = r;
    j->done = true;
    wake(j);
    pthread_mutex_unlock(&j->lock);
    job_unref(j);
    return NULL;
}

/* ---- the response's side ---- */

static int job_pull(void *src, struct buf *out)
{
    struct proxy_job *j = src;
    pthread_mutex_lock(&j->lock);
    if (j->out.len)
        buf_append(out, j->out.data, j->out.len);
    buf_reset(&j->out);
    bool over = j->done;
    pthread_cond_broadcast(&j->changed); /* room again */
    pthread_mutex_unlock(&j->lock);
    return over ? 1 : 0;
}

static int job_wait_fd(void *src)
{
    return ((struct proxy_job *)src)->notify[0];
}

static void job_clear(void *src)
{
    char drain[64];
    while (read(((struct proxy_job *)src)->notify[0], drain, sizeof(drain)) > 0)
        ;
}

static void job_left(void *src)
{
    struct proxy_job *j = src;
    pthread_mutex_lock(&j->lock);
    j->left = true;
    pthread_cond_broadcast(&j->changed);
    pthread_mutex_unlock(&j->lock);
}

static void job_free(void *src)
{
    job_left(src);
    job_unref(src);
}

static const struct http_source_ops job_ops = {
    .pull = job_pull,
    .wait_fd = job_wait_fd,
    .clear = job_clear,
    .left = job_left,
    .free = job_free,
};

/* The client's headers, less the hop-by-hop ones and those curl makes. */
static enum MHD_Result add_req_header(void *ctx, enum MHD_ValueKind kind, const char *name,
                                      const char *value)
{
    struct proxy_job *j = ctx;
    (void)kind;
    if (!name || !value || http_hop_header(name, strlen(name)) || !strcasecmp(name, "host") ||
        !strcasecmp(name, "expect") || strpbrk(value, "\r\n"))
        return MHD_YES;
    _cleanup_free_ char *line = xasprintf("%s: %s", name, value);
    j->req_headers = curl_slist_append(j->req_headers, line);
    return MHD_YES;
}

int http_proxy(struct request *rq, int fd, uint16_t port)
{
    pthread_once(&curl_once, curl_init_once);
    const char *upgrade = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Upgrade");
    if (upgrade) {
        close(fd);
        return err_set(ENOTSUP,
                       "'Upgrade: %.40s' (a WebSocket) is not forwarded by runcell; "
                       "plain HTTP requests are",
                       upgrade);
    }
    struct proxy_job *j = xcalloc(1, sizeof(*j));
    atomic_init(&j->refs, 2); /* the worker's and the response's */
    pthread_mutex_init(&j->lock, NULL);
    pthread_cond_init(&j->changed, NULL);
    j->fd = fd;
    j->notify[0] = j->notify[1] = -1;
    buf_init(&j->out, 0);
    up_head_init(&j->head, NULL);
    if (pipe2(j->notify, O_CLOEXEC | O_NONBLOCK) < 0) {
        int e = errno;
        atomic_store(&j->refs, 1);
        job_unref(j);
        return err_set(e, "pipe: %s", strerror(e));
    }
    j->method = xstrdup(rq->method);
    j->url = xasprintf("http://127.0.0.1:%u%s", port, rq->raw_uri ? rq->raw_uri : "/");
    const char *host = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Host");
    _cleanup_free_ char *host_line = xasprintf("Host: %s", host ? host : "localhost");
    j->req_headers = curl_slist_append(NULL, host_line);
    j->req_headers = curl_slist_append(j->req_headers, "Expect:"); /* no 100-continue */
    MHD_get_connection_values(rq->conn, MHD_HEADER_KIND, add_req_header, j);
    if (rq->body.len) {
        j->body = xmalloc(rq->body.len);
        memcpy(j->body, rq->body.data, rq->body.len);
        j->body_len = rq->body.len;
    }
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int e = pthread_create(&th, &attr, worker, j);
    pthread_attr_destroy(&attr);
    if (e) {
        atomic_store(&j->refs, 1);
        job_unref(j);
        return err_set(e, "cannot start a thread: %s", strerror(e));
    }
    /* This connection's thread waits for the head (libmicrohttpd runs one per connection). */
    struct timespec until;
    realtime_after_ms(&until, PROXY_HEAD_WAIT_MS);
    pthread_mutex_lock(&j->lock);
    while (!j->head.done && !j->done && pthread_cond_timedwait(&j->changed, &j->lock, &until) == 0)
        ;
    bool ready = j->head.done && !j->head_bad;
    long status = j->head.status;
    char error[CURL_ERROR_SIZE + 64];
    /* curl says "out of memory" for a header line longer than it takes (100 KiB) */
    bool too_big = j->head_bad || (j->done && j->result == CURLE_OUT_OF_MEMORY);
    snprintf(error, sizeof(error), "%s",
             too_big   ? "its response head is larger than 64 KiB, which runcell does not take"
             : j->done ? (*j->error ? j->error : curl_easy_strerror(j->result))
                       : "it did not answer within 120 s");
    char **headers = NULL;
    for (char **h = ready ? j->head.lines : NULL; h && *h; h++)
        headers = strv_push(headers ? headers : xcalloc(1, sizeof(char *)), *h);
    pthread_mutex_unlock(&j->lock);
    if (!ready) {
        job_left(j);
        job_unref(j);
        return err_set(EPROTO, "the server in the sandbox on port %u: %s", port, error);
    }
    (void)http_stream_headers(rq, (unsigned)status, headers, &job_ops, j, 0);
    strv_free(headers);
    return 0;
}
