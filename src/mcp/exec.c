/* exec.c - executions for the tools and the tasks extension (struct mcp_exec_ops), made of
 * what the session layer offers today: a thread that runs session_execute, waiting its turn
 * while the session is busy, and a buffer of the events it streams. */
#include "mcp/mcp-int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Events kept per execution; past this the oldest go (output is capped by the session
 * already, so this bounds the images). */
#define EVENTS_MAX_BYTES (32u << 20)
#define BUSY_RETRY_MS    50

struct mcp_exec {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int refs; /* the thread's and the caller's */
    int cancel[2];
    /* the request, copied */
    struct session_table *table;
    char *session_id, *code, *lang;
    uint64_t timeout_ms;
    atomic_size_t *slots;
    size_t max_slots;
    /* events */
    struct mcp_exec_event *ev;
    size_t n, alloc, bytes;
    uint64_t last_seq;
    /* the end */
    bool done;
    int err;
    char *message;
    struct exec_record rec;
};

static void event_release(struct mcp_exec_event *e)
{
    free(e->data);
    json_decref(e->json);
}

static void exec_unref(struct mcp_exec *x)
{
    pthread_mutex_lock(&x->lock);
    bool last = --x->refs == 0;
    pthread_mutex_unlock(&x->lock);
    if (!last)
        return;
    for (size_t i = 0; i < x->n; i++)
        event_release(&x->ev[i]);
    free(x->ev);
    close(x->cancel[0]);
    close(x->cancel[1]);
    free(x->session_id);
    free(x->code);
    free(x->lang);
    free(x->message);
    exec_record_release(&x->rec);
    pthread_cond_destroy(&x->changed);
    pthread_mutex_destroy(&x->lock);
    free(x);
}

static void on_event(void *ctx, const struct exec_event *ev)
{
    struct mcp_exec *x = ctx;
    size_t size = ev->len + 64;
    char *text = ev->json ? json_dumps(ev->json, JSON_COMPACT) : NULL;
    size += text ? strlen(text) : 0;
    free(text);
    pthread_mutex_lock(&x->lock);
    while (x->n && x->bytes + size > EVENTS_MAX_BYTES) { /* the oldest go */
        x->bytes -= x->ev[0].cost;
        event_release(&x->ev[0]);
        memmove(&x->ev[0], &x->ev[1], --x->n * sizeof(x->ev[0]));
    }
    if (x->n == x->alloc) {
        x->alloc = x->alloc ? 2 * x->alloc : 16;
        x->ev = xrealloc(x->ev, x->alloc * sizeof(x->ev[0]));
    }
    struct mcp_exec_event *e = &x->ev[x->n++];
    *e = (struct mcp_exec_event){
        .seq = ++x->last_seq, .type = ev->type, .len = ev->len, .cost = size};
    if (ev->data && ev->len) {
        e->data = xmalloc(ev->len);
        memcpy(e->data, ev->data, ev->len);
    }
    e->json = ev->json ? json_deep_copy(ev->json) : NULL;
    x->bytes += size;
    pthread_cond_broadcast(&x->changed);
    pthread_mutex_unlock(&x->lock);
}

static bool slot_take(struct mcp_exec *x)
{
    if (!x->slots)
        return true;
    if (atomic_fetch_add(x->slots, 1) < x->max_slots)
        return true;
    atomic_fetch_sub(x->slots, 1);
    return false;
}

static bool cancelled(struct mcp_exec *x, int wait_ms)
{
    struct pollfd p = {.fd = x->cancel[0], .events = POLLIN};
    return poll(&p, 1, wait_ms) > 0;
}

/* Runs the cell, waiting while another runs in the session (models make calls in parallel)
 * for as long as the cell's own timeout; a waiting execution holds no slot. */
static int run(struct mcp_exec *x, struct session *s)
{
    uint64_t wait_ms = x->timeout_ms ? x->timeout_ms : session_options(s)->timeout_ms;
    double give_up = now_ms_f() + (double)wait_ms;
    struct exec_request req = {.code = x->code,
                               .lang = x->lang,
                               .timeout_ms = x->timeout_ms,
                               .cancel_fd = x->cancel[0],
                               .cancel_events = POLLIN};
    struct exec_sink sink = {.fn = on_event, .ctx = x};
    for (;;) {
        if (cancelled(x, 0))
            return err_set(ECANCELED, "cancelled");
        if (!slot_take(x))
            return err_set(EAGAIN,
                           "the server is running its maximum of %zu executions; retry "
                           "shortly",
                           x->max_slots);
        int r = session_execute(s, &req, &sink, &x->rec);
        if (x->slots)
            atomic_fetch_sub(x->slots, 1);
        if (r == -EBUSY && now_ms_f() < give_up) {
            cancelled(x, BUSY_RETRY_MS);
            continue;
        }
        if (r == -EBUSY)
            return err_set(EBUSY,
                           "session %s: %s; wait for the running call to finish, or use "
                           "another session (create_session)",
                           x->session_id, err_msg());
        if (r < 0 && r != -ECANCELED)
            return err_set(-r, "session %s: %s", x->session_id, err_msg());
        return r == -ECANCELED ? err_set(ECANCELED, "cancelled") : r;
    }
}

static void *exec_main(void *arg)
{
    struct mcp_exec *x = arg;
    int err = -ENOENT;
    struct session *s = session_table_acquire(x->table, x->session_id, &err);
    int r;
    if (!s) {
        r = err_set(ENOENT, "session %s %s", x->session_id,
                    err == -ETIME ? "expired for being idle" : "is gone (closed or expired)");
    } else {
        exec_record_release(&x->rec);
        exec_record_init(&x->rec, session_options(s)->output_cap);
        r = run(x, s);
        session_table_put(x->table, s);
    }
    pthread_mutex_lock(&x->lock);
    x->done = true;
    x->err = r < 0 ? r : 0;
    if (r < 0)
        x->message = xstrdup(err_msg());
    pthread_cond_broadcast(&x->changed);
    pthread_mutex_unlock(&x->lock);
    exec_unref(x);
    return NULL;
}

static int thread_start(const struct mcp_exec_start *req, struct mcp_exec **ret)
{
    struct mcp_exec *x = xcalloc(1, sizeof(*x));
    pthread_mutex_init(&x->lock, NULL);
    pthread_cond_init(&x->changed, NULL);
    x->refs = 2;
    x->table = req->table;
    x->session_id = xstrdup(req->session_id);
    x->code = xstrdup(req->code);
    x->lang = req->lang ? xstrdup(req->lang) : NULL;
    x->timeout_ms = req->timeout_ms;
    x->slots = req->slots;
    x->max_slots = req->max_slots;
    exec_record_init(&x->rec, MCP_DEFAULT_OUTPUT_CAP); /* the session's cap, once found */
    if (pipe2(x->cancel, O_CLOEXEC | O_NONBLOCK) < 0) {
        int e = errno;
        x->cancel[0] = x->cancel[1] = -1;
        x->refs = 1;
        exec_unref(x);
        return err_set(e, "cannot create a pipe for the execution: %s", strerror(e));
    }
    /* The thread inherits the caller's signal mask, and the sandboxes it starts inherit the
     * thread's: blocking more here would reach user code. */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    int e = pthread_create(&t, &attr, exec_main, x);
    pthread_attr_destroy(&attr);
    if (e) {
        x->refs = 1;
        exec_unref(x);
        return err_set(e, "cannot start a thread for the execution: %s", strerror(e));
    }
    *ret = x;
    return 0;
}

static int thread_poll(struct mcp_exec *x, uint64_t after, int wait_ms, struct mcp_exec_poll *ret)
{
    memset(ret, 0, sizeof(*ret));
    pthread_mutex_lock(&x->lock);
    if (wait_ms > 0 && !x->done && x->last_seq <= after) {
        struct timespec ts;
        realtime_after_ms(&ts, (uint64_t)wait_ms);
        while (!x->done && x->last_seq <= after &&
               pthread_cond_timedwait(&x->changed, &x->lock, &ts) == 0)
            ;
    }
    size_t from = 0;
    while (from < x->n && x->ev[from].seq <= after)
        from++;
    ret->n = x->n - from;
    ret->events = ret->n ? xcalloc(ret->n, sizeof(*ret->events)) : NULL;
    for (size_t i = 0; i < ret->n; i++) {
        const struct mcp_exec_event *e = &x->ev[from + i];
        ret->events[i] = *e;
        ret->events[i].data = e->data ? xmalloc(e->len) : NULL;
        if (e->data)
            memcpy(ret->events[i].data, e->data, e->len);
        ret->events[i].json = json_incref(e->json);
    }
    ret->next = MAX(after, x->last_seq);
    ret->done = x->done;
    ret->err = x->err;
    ret->message = x->message ? xstrdup(x->message) : NULL;
    ret->rec = x->done && !x->err ? &x->rec : NULL;
    pthread_mutex_unlock(&x->lock);
    return 0;
}

static void thread_cancel(struct mcp_exec *x)
{
    (void)!write(x->cancel[1], "x", 1);
}

static void thread_release(struct mcp_exec *x)
{
    if (x)
        exec_unref(x);
}

void mcp_exec_poll_release(struct mcp_exec_poll *p)
{
    for (size_t i = 0; i < p->n; i++)
        event_release(&p->events[i]);
    free(p->events);
    free(p->message);
    memset(p, 0, sizeof(*p));
}

const struct mcp_exec_ops mcp_exec_thread_ops = {
    .start = thread_start,
    .poll = thread_poll,
    .cancel = thread_cancel,
    .release = thread_release,
};
