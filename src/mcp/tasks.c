/* tasks.c - the io.modelcontextprotocol/tasks extension for run_code and run_shell: a call
 * that outlives its request is answered with a task handle (CreateTaskResult), and the client
 * polls it with tasks/get (status, the latest output, the result once it ends) and may stop it
 * with tasks/cancel, which interrupts the cell and keeps the session's state. Executions go
 * through the connection's mcp_exec_ops. */
#include "mcp/mcp-int.h"

#include <errno.h>
#include <poll.h>
#include <string.h>

/* Tasks a connection keeps (finished ones are forgotten ttl after they were created). */
#define MAX_TASKS        256
#define TASK_TTL_MS      (3600u * 1000)
#define POLL_INTERVAL_MS 1000
/* The latest output a tasks/get shows, per stream. */
#define TAIL_BYTES 2048

enum task_status { TS_WORKING, TS_COMPLETED, TS_FAILED, TS_CANCELLED };
static const char *const status_names[] = {"working", "completed", "failed", "cancelled"};

struct task {
    char id[33];
    struct mcp_exec *x; /* NULL once it ended */
    const struct tool *tool;
    unsigned features;
    char *sid, *note;
    uint64_t created_ms, updated_ms, ttl_ms;
    enum task_status status;
    bool cancel_asked;
    uint64_t seen; /* events read */
    char out_tail[TAIL_BYTES + 1], err_tail[TAIL_BYTES + 1];
    json_t *result; /* TS_COMPLETED: the CallToolResult */
    struct task *next;
};

static void task_free(const struct mcp_exec_ops *ops, struct task *t)
{
    if (t->x) {
        ops->cancel(t->x);
        ops->release(t->x);
    }
    free(t->sid);
    free(t->note);
    json_decref(t->result);
    free(t);
}

/* Keeps the last TAIL_BYTES of a stream. */
static void tail_append(char *tail, const char *data, size_t len)
{
    size_t have = strlen(tail);
    if (len >= TAIL_BYTES) {
        memcpy(tail, data + len - TAIL_BYTES, TAIL_BYTES);
        tail[TAIL_BYTES] = '\0';
        return;
    }
    size_t keep = MIN(have, TAIL_BYTES - len);
    memmove(tail, tail + have - keep, keep);
    memcpy(tail + keep, data, len);
    tail[keep + len] = '\0';
}

static void note_events(struct task *t, const struct mcp_exec_poll *p)
{
    for (size_t i = 0; i < p->n; i++) {
        const struct mcp_exec_event *e = &p->events[i];
        if (e->type == EV_STDOUT || e->type == EV_STDERR)
            tail_append(e->type == EV_STDOUT ? t->out_tail : t->err_tail, e->data, e->len);
    }
    if (p->n)
        t->updated_ms = now_realtime_ms();
}

/* Brings t up to date with its execution; the lock is held. */
static void refresh(struct mcp_conn *c, struct task *t)
{
    if (!t->x)
        return;
    struct mcp_exec_poll p;
    c->exec->poll(t->x, t->seen, 0, &p);
    t->seen = p.next;
    note_events(t, &p);
    if (p.done) {
        /* Interrupted on request: the cell ended in a KeyboardInterrupt (or never ran). One
         * that finished before the interrupt reached it completed. */
        if (p.err == -ECANCELED || (t->cancel_asked && p.rec && p.rec->status != EXEC_OK)) {
            t->status = TS_CANCELLED;
        } else {
            t->status = TS_COMPLETED;
            t->result = exec_tool_result(c->cfg, t->tool, t->features, t->sid, t->note, &p);
        }
        t->updated_ms = now_realtime_ms();
        mcp_exec_poll_release(&p);
        c->exec->release(t->x);
        t->x = NULL;
        return;
    }
    mcp_exec_poll_release(&p);
}

/* Forgets finished tasks past their ttl; the lock is held. */
static void sweep(struct mcp_conn *c)
{
    uint64_t now = now_realtime_ms();
    for (struct task **p = &c->tasks; *p;) {
        struct task *t = *p;
        refresh(c, t);
        if (!t->x && now - t->created_ms > t->ttl_ms) {
            *p = t->next;
            c->n_tasks--;
            task_free(c->exec, t);
        } else {
            p = &t->next;
        }
    }
}

static char *iso(uint64_t ms)
{
    char buf[32];
    format_time_iso(ms, buf);
    return xstrdup(buf);
}

/* The last line of a tail, for statusMessage. */
static char *last_line(const char *tail)
{
    size_t n = strlen(tail);
    while (n && (tail[n - 1] == '\n' || tail[n - 1] == '\r'))
        n--;
    const char *start = tail + n;
    while (start > tail && start[-1] != '\n')
        start--;
    size_t len = MIN((size_t)(tail + n - start), (size_t)200);
    size_t clean_len;
    return utf8_sanitize(start, len, &clean_len);
}

/* The Task object (with the result once it completed); the lock is held. */
static json_t *task_json(const struct task *t)
{
    _cleanup_free_ char *created = iso(t->created_ms), *updated = iso(t->updated_ms);
    json_t *j = json_pack("{s:s,s:s,s:s,s:s,s:I,s:i}", "taskId", t->id, "status",
                          status_names[t->status], "createdAt", created, "lastUpdatedAt", updated,
                          "ttlMs", (json_int_t)t->ttl_ms, "pollIntervalMs", POLL_INTERVAL_MS);
    _cleanup_free_ char *line = last_line(*t->out_tail ? t->out_tail : t->err_tail);
    char *message = NULL;
    switch (t->status) {
    case TS_WORKING:
        message =
            xasprintf("%s running for %.0f s%s%s%s", t->tool->name,
                      (double)(now_realtime_ms() - t->created_ms) / 1000.0,
                      t->cancel_asked ? " (cancelling)" : "", *line ? "; last output: " : "", line);
        break;
    case TS_COMPLETED: {
        /* the result as the call would have answered it on this era */
        json_t *result = json_deep_copy(t->result);
        json_object_set_new(result, "resultType", json_string("complete"));
        json_object_set_new(j, "result", result);
        message = xasprintf("%s finished", t->tool->name);
        break;
    }
    case TS_CANCELLED:
        message = xasprintf("%s was cancelled: the cell was interrupted, the session's variables "
                            "and files are kept",
                            t->tool->name);
        break;
    case TS_FAILED:
        break;
    }
    if (message)
        json_object_set_new(j, "statusMessage", json_string(message));
    free(message);
    if (t->status == TS_WORKING) {
        /* the output so far, for a client that shows it (the extension has no field for it) */
        size_t on, en;
        _cleanup_free_ char *out = utf8_sanitize(t->out_tail, strlen(t->out_tail), &on);
        _cleanup_free_ char *err = utf8_sanitize(t->err_tail, strlen(t->err_tail), &en);
        json_object_set_new(
            j, "_meta",
            json_pack("{s:{s:s%,s:s%}}", "runcell/output", "stdout", out, on, "stderr", err, en));
    }
    return j;
}

/* Puts x (of call k) in the table as a task; NULL when it is full. */
static struct task *adopt(struct call *k, struct mcp_exec *x, uint64_t seen, const char *sid,
                          const char *note)
{
    struct mcp_conn *c = k->c;
    pthread_mutex_lock(&c->tasks_lock);
    sweep(c);
    if (c->n_tasks >= MAX_TASKS) {
        pthread_mutex_unlock(&c->tasks_lock);
        log_warn("msg=\"mcp task table full; the call goes on without a task\" tasks=%zu",
                 c->n_tasks);
        return NULL;
    }
    struct task *t = xcalloc(1, sizeof(*t));
    _cleanup_free_ char *hex = random_hex(16); /* 128 bits: the id is the only key to it */
    snprintf(t->id, sizeof(t->id), "%s", hex);
    t->x = x;
    t->tool = k->tool;
    t->features = k->features;
    t->sid = xstrdup(sid);
    t->note = note ? xstrdup(note) : NULL;
    /* The output so far, for tasks/get: read again from the first event. */
    struct mcp_exec_poll p;
    c->exec->poll(x, 0, 0, &p);
    note_events(t, &p);
    t->seen = MAX(seen, p.next);
    mcp_exec_poll_release(&p);
    t->created_ms = t->updated_ms = now_realtime_ms() - (uint64_t)(now_ms_f() - k->t0_ms);
    json_t *timeout_s = json_object_get(k->args, "timeout_s");
    uint64_t timeout =
        json_is_number(timeout_s) ? (uint64_t)(json_number_value(timeout_s) * 1000.0) : 0;
    t->ttl_ms = TASK_TTL_MS + timeout;
    t->status = TS_WORKING;
    /* In the table before the answer goes out: a tasks/get right after it finds it. */
    t->next = c->tasks;
    c->tasks = t;
    c->n_tasks++;
    pthread_mutex_lock(&c->lock);
    k->handed_over = true; /* its stream's end no longer cancels it */
    pthread_mutex_unlock(&c->lock);
    return t; /* with tasks_lock held */
}

json_t *task_adopt(struct call *k, struct mcp_exec *x, uint64_t seen, const char *sid,
                   const char *note)
{
    struct task *t = adopt(k, x, seen, sid, note);
    if (!t)
        return NULL;
    json_t *result = task_json(t);
    json_object_set_new(result, "resultType", json_string("task"));
    pthread_mutex_unlock(&k->c->tasks_lock);
    log_info("msg=\"mcp call became a task\" tool=%s task=%s session=%s", k->tool->name, t->id,
             sid);
    return result;
}

/* The CallToolResult of a run that still runs; the lock is held. */
static json_t *running_result(const struct task *t)
{
    double elapsed = (double)(now_realtime_ms() - t->created_ms) / 1000.0;
    size_t on, en;
    _cleanup_free_ char *out = utf8_sanitize(t->out_tail, strlen(t->out_tail), &on);
    _cleanup_free_ char *err = utf8_sanitize(t->err_tail, strlen(t->err_tail), &en);
    struct buf b;
    buf_init(&b, 0);
    buf_printf(&b,
               "The cell is still running (%.0f s so far) in session %s: it goes on, and its "
               "variables and files stay as usual. Call wait_for_cell with run_id \"%s\" to "
               "wait for its result.",
               elapsed, t->sid, t->id);
    if (on)
        buf_printf(&b, "\nLatest output:\n%s", out);
    if (en)
        buf_printf(&b, "\n[stderr]\n%s", err);
    json_t *content = json_pack("[o]", text_item(b.data));
    buf_release(&b);
    if (t->features & VF_STRUCTURED) { /* as for a finished run (record_content) */
        _cleanup_free_ char *trailer =
            xasprintf("[runcell] session %s, run %s still running", t->sid, t->id);
        json_array_append_new(content, text_item(trailer));
    }
    json_t *r = json_pack("{s:o,s:b}", "content", content, "isError", 0);
    if (t->features & VF_STRUCTURED)
        json_object_set_new(r, "structuredContent",
                            json_pack("{s:s,s:s,s:s,s:f,s:s%,s:s%}", "session_id", t->sid, "status",
                                      "running", "run_id", t->id, "elapsed_s", elapsed, "stdout",
                                      out, on, "stderr", err, en));
    return r;
}

json_t *task_continue(struct call *k, struct mcp_exec *x, uint64_t seen, const char *sid,
                      const char *note)
{
    struct task *t = adopt(k, x, seen, sid, note);
    if (!t)
        return NULL;
    json_t *result = running_result(t);
    pthread_mutex_unlock(&k->c->tasks_lock);
    log_info("msg=\"mcp call answered while its cell runs\" tool=%s run=%s session=%s",
             k->tool->name, t->id, sid);
    return result;
}

static struct task *find_locked(struct mcp_conn *c, const char *id)
{
    for (struct task *t = c->tasks; t; t = t->next)
        if (!strcmp(t->id, id))
            return t;
    return NULL;
}

/* What a run that ended answers; the lock is held. */
static json_t *ended_result(const struct task *t)
{
    if (t->status == TS_COMPLETED)
        return json_deep_copy(t->result);
    return tool_error("%s: the cell was cancelled; the session's variables and files are kept",
                      t->tool->name);
}

json_t *task_wait(struct call *k, const char *id, uint64_t wait_ms)
{
    struct mcp_conn *c = k->c;
    double end = now_ms_f() + (double)wait_ms;
    uint64_t shown = 0;
    for (;;) {
        pthread_mutex_lock(&c->tasks_lock);
        sweep(c);
        struct task *t = find_locked(c, id);
        if (!t) {
            pthread_mutex_unlock(&c->tasks_lock);
            return tool_error("wait_for_cell: no run %s here (a run is kept an hour after it "
                              "starts; it may also have been started on another server)",
                              id);
        }
        if (t->seen != shown) { /* new output: a progress notification */
            shown = t->seen;
            const char *tail = *t->out_tail ? t->out_tail : t->err_tail;
            call_output(k, tail, strlen(tail));
        }
        json_t *r = t->status != TS_WORKING ? ended_result(t)
                    : now_ms_f() >= end     ? running_result(t)
                                            : NULL;
        pthread_mutex_unlock(&c->tasks_lock);
        if (r)
            return r;
        struct pollfd p = {.fd = k->cancel[0], .events = POLLIN};
        if (poll(&p, 1, 250) > 0)
            return tool_error("wait_for_cell: cancelled");
    }
}

/* The task a tasks/get, update or cancel names, with the lock held; NULL after answering. */
static struct task *find_task(struct req *q)
{
    struct mcp_conn *c = q->c;
    if (!req_declares_tasks(q)) {
        _cleanup_free_ char *msg = xasprintf("%s: the client must declare the %s extension in "
                                             "params._meta[\"%s\"].extensions",
                                             q->m->method, EXT_TASKS, META_CAPABILITIES);
        reply_respond(q->r, rpc_error_data(q->m->id, MCP_MISSING_CAPABILITY, msg,
                                           json_pack("{s:{s:{s:{}}}}", "requiredCapabilities",
                                                     "extensions", EXT_TASKS)));
        q->refused = true;
        return NULL;
    }
    const char *id = json_string_value(json_object_get(q->m->params, "taskId"));
    if (!id) {
        _cleanup_free_ char *msg = xasprintf("%s: params.taskId must be a string", q->m->method);
        reply_respond(q->r, rpc_error(q->m->id, MCP_INVALID_PARAMS, msg));
        return NULL;
    }
    pthread_mutex_lock(&c->tasks_lock);
    sweep(c);
    struct task *t = find_locked(c, id);
    if (t)
        return t;
    pthread_mutex_unlock(&c->tasks_lock);
    _cleanup_free_ char *msg = xasprintf("%s: no task %s (tasks are kept an hour after they "
                                         "start, then forgotten)",
                                         q->m->method, id);
    reply_respond(q->r, rpc_error(q->m->id, MCP_INVALID_PARAMS, msg));
    return NULL;
}

static void respond_ack(struct req *q)
{
    reply_respond(q->r, rpc_result_for(q->c->cfg, req_features(q), q->m->id, json_object()));
}

void m_tasks_get(struct req *q)
{
    struct task *t = find_task(q);
    if (!t)
        return;
    json_t *j = task_json(t);
    pthread_mutex_unlock(&q->c->tasks_lock);
    reply_respond(q->r, rpc_result_for(q->c->cfg, req_features(q), q->m->id, j));
}

void m_tasks_update(struct req *q)
{
    /* runcell's tasks never ask for input: every inputResponses key is one it did not issue,
     * which the extension says to ignore. */
    if (!find_task(q))
        return;
    pthread_mutex_unlock(&q->c->tasks_lock);
    respond_ack(q);
}

void m_tasks_cancel(struct req *q)
{
    struct task *t = find_task(q);
    if (!t)
        return;
    if (t->x && !t->cancel_asked) {
        t->cancel_asked = true;
        q->c->exec->cancel(t->x);
        log_info("msg=\"mcp task cancelled\" task=%s", t->id);
    }
    pthread_mutex_unlock(&q->c->tasks_lock);
    respond_ack(q);
}

void tasks_free_all(struct mcp_conn *c)
{
    pthread_mutex_lock(&c->tasks_lock);
    while (c->tasks) {
        struct task *t = c->tasks;
        c->tasks = t->next;
        task_free(c->exec, t);
    }
    c->n_tasks = 0;
    pthread_mutex_unlock(&c->tasks_lock);
}
