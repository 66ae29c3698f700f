/* exec.c - executions for the tools and the tasks extension (struct mcp_exec_ops), over the
 * session layer's durable executions: a cell is submitted to its session's queue, runs on a
 * thread of its own, and keeps its events there, so a poll reads them from any point. */
#include "mcp/mcp-int.h"

#include <errno.h>
#include <poll.h>
#include <string.h>

/* Events copied per poll at most; the next poll reads on. */
#define POLL_MAX_ITEMS 256
/* Between two looks at an execution when no wake-up descriptor could be had. */
#define POLL_FALLBACK_MS 20

struct mcp_exec {
    struct execution *x;
};

static int durable_start(const struct mcp_exec_start *req, struct mcp_exec **ret)
{
    int err = -ENOENT;
    struct session *s = session_table_acquire(req->table, req->session_id, &err);
    if (!s)
        return err_set(ENOENT, "session %s %s", req->session_id,
                       err == -ETIME ? "expired for being idle" : "is gone (closed or expired)");
    struct exec_request er = {
        .code = req->code, .lang = req->lang, .timeout_ms = req->timeout_ms, .cancel_fd = -1};
    struct execution *x;
    int r = session_submit(req->table, s, &er, &x);
    session_table_put(req->table, s); /* the execution holds its own reference */
    if (r < 0)
        return err_set(-r, "session %s: %s", req->session_id, err_msg());
    if (execution_spawn(x) < 0) { /* x ended as "failed"; its poll says why */
        log_warn("msg=\"mcp execution not started\" execution=%s", execution_id(x));
    }
    *ret = xcalloc(1, sizeof(**ret));
    (*ret)->x = x;
    return 0;
}

/* Waits up to wait_ms for x to have an event after `after`, or to end. */
static void wait_news(struct execution *x, uint64_t after, int wait_ms)
{
    if (execution_phase(x) == EXEC_DONE || execution_last_seq(x) > after)
        return;
    struct exec_watch *w;
    if (execution_watch(x, &w) < 0) { /* its readers are at their maximum: look again later */
        struct pollfd none = {.fd = -1};
        poll(&none, 0, MIN(wait_ms, POLL_FALLBACK_MS));
        return;
    }
    double until = now_ms_f() + wait_ms;
    while (execution_phase(x) != EXEC_DONE && execution_last_seq(x) <= after) {
        double left = until - now_ms_f();
        if (left <= 0)
            break;
        struct pollfd p = {.fd = exec_watch_fd(w), .events = POLLIN};
        if (poll(&p, 1, (int)left + 1) > 0)
            exec_watch_clear(w);
    }
    exec_watch_free(w);
}

static int durable_poll(struct mcp_exec *e, uint64_t after, int wait_ms, struct mcp_exec_poll *ret)
{
    struct execution *x = e->x;
    memset(ret, 0, sizeof(*ret));
    if (wait_ms > 0)
        wait_news(x, after, wait_ms);
    /* Read the phase first: an execution seen done has all its events kept already. */
    bool done = execution_phase(x) == EXEC_DONE;
    struct exec_item items[POLL_MAX_ITEMS];
    size_t n = execution_read(x, after, items, POLL_MAX_ITEMS);
    ret->events = n ? xcalloc(n, sizeof(*ret->events)) : NULL;
    uint64_t next = after;
    for (size_t i = 0; i < n; i++) {
        next = items[i].seq;
        if (items[i].type == EV_DONE) /* the end is told by done, err and rec */
            continue;
        struct mcp_exec_event *ev = &ret->events[ret->n++];
        *ev = (struct mcp_exec_event){.seq = items[i].seq,
                                      .type = items[i].type,
                                      .data = items[i].data,
                                      .len = items[i].len,
                                      .json = json_incref(items[i].json),
                                      .cost = items[i].len + 64};
        items[i].data = NULL; /* moved */
    }
    exec_items_release(items, n);
    ret->next = next;
    /* Done once every event was read, the last of them EV_DONE. */
    ret->done = done && next >= execution_last_seq(x);
    if (ret->done) {
        const char *msg = NULL;
        ret->err = execution_failure(x, &msg);
        if (ret->err)
            ret->message = xstrdup(msg ? msg : "the execution did not run");
        ret->rec = ret->err ? NULL : execution_record(x);
    }
    return 0;
}

static void durable_cancel(struct mcp_exec *e)
{
    execution_cancel(e->x);
}

static void durable_release(struct mcp_exec *e)
{
    if (!e)
        return;
    execution_unref(e->x); /* one still running goes on to its end, and is kept */
    free(e);
}

void mcp_exec_poll_release(struct mcp_exec_poll *p)
{
    for (size_t i = 0; i < p->n; i++) {
        free(p->events[i].data);
        json_decref(p->events[i].json);
    }
    free(p->events);
    free(p->message);
    memset(p, 0, sizeof(*p));
}

const char *mcp_exec_id(const struct mcp_exec *e)
{
    return execution_id(e->x);
}

const struct mcp_exec_ops mcp_exec_durable_ops = {
    .start = durable_start,
    .poll = durable_poll,
    .cancel = durable_cancel,
    .release = durable_release,
};
