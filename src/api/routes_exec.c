/* routes_exec.c - executing code: in a session (one JSON record, or NDJSON events as they
 * happen) and one-shot (a throwaway session with files in and out). */
#include "api/api.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ONESHOT_OUTPUTS_CAP (16u << 20)

static const struct field execute_fields[] = {
    {"code", F_STRING},          {"timeout_s", F_NUMBER},   {"language", F_STRING},
    {"on_disconnect", F_STRING}, {"stop_on_error", F_BOOL},
};

json_t *exec_event_json(const struct exec_event *ev)
{
    switch (ev->type) {
    case EV_STDOUT:
    case EV_STDERR: {
        size_t n;
        char *text = utf8_sanitize(ev->data, ev->len, &n);
        json_t *j = json_pack("{s:s,s:s%}", "type", ev->type == EV_STDOUT ? "stdout" : "stderr",
                              "data", text, n);
        free(text);
        return j;
    }
    case EV_RESULT:
        return json_pack("{s:s,s:O}", "type", "result", "data", ev->json);
    case EV_ERROR:
        return json_pack("{s:s,s:O}", "type", "error", "error", ev->json);
    case EV_DONE:
        break;
    }
    return NULL;
}

int client_fd(struct request *rq)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(rq->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* Parses an execute body into req (code borrowed from body) and whether the client leaving
 * interrupts the cell (*ret_interrupt); false after replying 400. */
static bool parse_execute(struct request *rq, json_t *body, struct exec_request *req,
                          bool *ret_interrupt)
{
    if (!check_fields(rq, body, execute_fields, ARRAY_SIZE(execute_fields)))
        return false;
    req->code = json_string_value(json_object_get(body, "code"));
    req->lang = json_string_value(json_object_get(body, "language"));
    const char *leave = json_string_value(json_object_get(body, "on_disconnect"));
    if (!req->code) {
        api_error(rq, AE_BAD_REQUEST, "field 'code' is required: the code to run, a string");
        return false;
    }
    if (req->lang && !lang_supported(req->lang)) {
        api_error(rq, AE_BAD_REQUEST,
                  "field 'language': '%s' is not supported; use python, "
                  "bash or javascript",
                  req->lang);
        return false;
    }
    if (leave && strcmp(leave, "interrupt") && strcmp(leave, "continue")) {
        api_error(rq, AE_BAD_REQUEST,
                  "field 'on_disconnect': '%s' is not 'interrupt' (the default: the cell is "
                  "interrupted when the client goes away) or 'continue' (it runs on; re-attach "
                  "with GET .../executions/ID/events)",
                  leave);
        return false;
    }
    *ret_interrupt = !leave || !strcmp(leave, "interrupt");
    req->stop_on_error = json_is_true(json_object_get(body, "stop_on_error"));
    return get_seconds(rq, body, "timeout_s", rq->srv->cfg->limits.max_timeout_ms,
                       &req->timeout_ms);
}

/* ---- the native NDJSON encoder: {"type", ..., "seq"} a line ---- */

static void put_line(struct buf *out, json_t *j)
{
    char *line = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!line)
        return;
    buf_append(out, line, strlen(line));
    buf_append(out, "\n", 1);
    free(line);
}

/* The encoder's ctx of a replayed execution (an idempotency key seen before). */
static char replayed_marker;

static void ndjson_begin(void *ctx, struct execution *x, struct buf *out)
{
    json_t *start = json_pack("{s:s,s:s,s:s,s:i}", "type", "start", "execution_id", execution_id(x),
                              "phase", exec_phase_name(execution_phase(x)), "seq", 0);
    if (ctx == &replayed_marker)
        json_object_set_new(start, "replayed", json_true());
    put_line(out, start);
}

static void ndjson_event(void *ctx, struct execution *x, const struct exec_item *it,
                         struct buf *out)
{
    (void)ctx;
    (void)x;
    json_t *j;
    if (it->type == EV_DONE) {
        j = json_deep_copy(it->json);
        json_object_set_new(j, "type", json_string("done"));
    } else {
        struct exec_event ev = {
            .type = it->type, .data = it->data, .len = it->len, .json = it->json};
        j = exec_event_json(&ev);
    }
    if (!j)
        return;
    json_object_set_new(j, "seq", json_integer((json_int_t)it->seq));
    put_line(out, j);
}

static const struct exec_encoder ndjson_encoder = {
    .content_type = "application/x-ndjson",
    .begin = ndjson_begin,
    .event = ndjson_event,
};

bool wants_ndjson(struct request *rq)
{
    /* Named, not reached by a wildcard: JSON is the default; and preferred at least as
     * much as JSON ("application/json, application/x-ndjson;q=0.5" gets JSON). */
    double q = accept_q(rq, "application/x-ndjson");
    return accept_lists(rq, "application/x-ndjson") && q > 0 &&
           q >= accept_q(rq, "application/json");
}

/* The reply for an execution that did not run (cancelled, its session closed, the queue
 * full). */
static enum MHD_Result reply_not_run(struct request *rq, struct execution *x)
{
    const char *msg;
    int r = execution_failure(x, &msg);
    return api_error(rq, api_err_of(r ? r : -EIO), "execution %s did not run: %s", execution_id(x),
                     msg ? msg : "unknown");
}

/* The execution an idempotency key named before: its events again, or its record once it
 * ends. It is the first request's to run (or to have stopped); this one leaving stops
 * nothing. */
static enum MHD_Result reply_replayed(struct request *rq, struct session *s, struct execution *x,
                                      bool stream)
{
    log_info("msg=\"execution replayed for its idempotency key\" execution=%s", execution_id(x));
    if (stream) {
        struct exec_stream_opts o = {.table = rq->srv->table, .session = s};
        return http_stream_execution(rq, x, 0, &ndjson_encoder, &replayed_marker, &o);
    }
    execution_wait(x, 0);
    json_t *shared = execution_record_json(x);
    enum MHD_Result ret;
    if (shared) {
        json_t *j = json_copy(shared); /* the top level only: "replayed" is added there */
        json_decref(shared);
        json_object_set_new(j, "replayed", json_true());
        ret = reply_json_header(rq, 200, j, "X-Runcell-Execution", execution_id(x));
    } else {
        ret = reply_not_run(rq, x);
    }
    execution_unref(x);
    session_table_put(rq->srv->table, s);
    return ret;
}

enum MHD_Result h_execute(struct request *rq)
{
    json_t *body = body_json(rq);
    struct exec_request req = {0};
    struct execution *x = NULL;
    bool interrupt_on_leave = true;
    enum MHD_Result ret = MHD_YES;
    if (!body)
        return MHD_YES;
    if (!parse_execute(rq, body, &req, &interrupt_on_leave)) {
        json_decref(body);
        return MHD_YES;
    }
    struct session *s = acquire_session(rq);
    if (!s) {
        json_decref(body);
        return MHD_YES;
    }
    bool stream = wants_ndjson(rq);
    if (!stream && interrupt_on_leave) {
        /* Run here: a client that hangs up is noticed as the cell runs (or before it). */
        req.cancel_fd = client_fd(rq);
        req.cancel_events = POLLRDHUP;
    } else {
        req.cancel_fd = -1;
    }
    /* A client that retries sends the key it sent the first time: the same execution, never
     * a second run. */
    const char *key = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Idempotency-Key");
    bool replayed = false;
    int r = session_submit_keyed(rq->srv->table, s, &req, key, &x, &replayed);
    json_decref(body);
    if (r < 0) {
        ret = api_errno(rq, r);
        session_table_put(rq->srv->table, s);
        return ret;
    }
    request_owes_reply(rq);
    if (replayed)
        return reply_replayed(rq, s, x, stream);
    if (stream) {
        if (execution_spawn(x) < 0) {
            session_table_put(rq->srv->table, s);
            ret = api_errno(rq, -EIO);
            execution_unref(x);
            return ret;
        }
        struct exec_stream_opts o = {
            .interrupt_on_leave = interrupt_on_leave, .table = rq->srv->table, .session = s};
        return http_stream_execution(rq, x, 0, &ndjson_encoder, NULL, &o);
    }
    /* A client that chose "continue" and leaves: this thread still runs the cell to its end
     * (the connection's thread stays until its handler returns), and keeps its events. */
    execution_run(x, NULL);
    json_t *rec = execution_record_json(x); /* made once, for its done event too */
    if (rec)
        ret = reply_json_header(rq, 200, rec, "X-Runcell-Execution", execution_id(x));
    else
        ret = reply_not_run(rq, x);
    execution_unref(x);
    session_table_put(rq->srv->table, s);
    return ret;
}

/* ---- executions: list, describe, re-attach, cancel ---- */

/* The {id} session's execution named by the second parameter (a reference), or NULL after
 * replying 404; the session's reference in *ret_s (put it after). */
static struct execution *acquire_execution(struct request *rq, struct session **ret_s)
{
    struct session *s = acquire_session(rq);
    if (!s)
        return NULL;
    struct execution *x = session_execution_find(s, rq->params[1]);
    if (!x) {
        session_table_put(rq->srv->table, s);
        api_error(rq, AE_NOT_FOUND,
                  "session %s keeps no execution %s (finished ones are kept for %u minutes, "
                  "the last %d of them)",
                  rq->params[0], rq->params[1], EXEC_KEEP_MS / 60000, EXEC_KEEP);
        return NULL;
    }
    *ret_s = s;
    return x;
}

enum MHD_Result h_executions_list(struct request *rq)
{
    struct session *s = acquire_session(rq);
    if (!s)
        return MHD_YES;
    json_t *j = json_pack("{s:o}", "executions", session_executions_json(s));
    session_table_put(rq->srv->table, s);
    return reply_json(rq, 200, j);
}

enum MHD_Result h_execution_get(struct request *rq)
{
    struct session *s;
    struct execution *x = acquire_execution(rq, &s);
    if (!x)
        return MHD_YES;
    json_t *j = execution_json(x), *rec = execution_record_json(x);
    if (rec)
        json_object_set_new(j, "record", rec);
    execution_unref(x);
    session_table_put(rq->srv->table, s);
    return reply_json(rq, 200, j);
}

enum MHD_Result h_execution_events(struct request *rq)
{
    const char *a = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "after");
    uint64_t after = 0;
    if (a && parse_u64(a, &after) < 0)
        return api_error(rq, AE_BAD_REQUEST,
                         "query 'after' must be a sequence number (0 for every event)");
    struct session *s;
    struct execution *x = acquire_execution(rq, &s);
    if (!x)
        return MHD_YES;
    /* A reader that leaves stops nothing: whoever started the execution decides that. */
    struct exec_stream_opts o = {.table = rq->srv->table, .session = s};
    return http_stream_execution(rq, x, after, &ndjson_encoder, NULL, &o);
}

enum MHD_Result h_execution_delete(struct request *rq)
{
    struct session *s;
    struct execution *x = acquire_execution(rq, &s);
    if (!x)
        return MHD_YES;
    enum exec_phase phase = execution_phase(x);
    enum MHD_Result ret;
    if (phase == EXEC_QUEUED) {
        execution_cancel(x);
        execution_wait(x, 0);
        ret = reply_json(rq, 200, execution_json(x));
    } else {
        ret = api_error(rq, AE_BUSY,
                        "execution %s %s; only one that waits is taken back (interrupt a running "
                        "one: POST .../executions/%s/cancel)",
                        execution_id(x), phase == EXEC_RUNNING ? "is running" : "is done",
                        execution_id(x));
    }
    execution_unref(x);
    session_table_put(rq->srv->table, s);
    return ret;
}

enum MHD_Result h_execution_cancel(struct request *rq)
{
    struct session *s;
    struct execution *x = acquire_execution(rq, &s);
    if (!x)
        return MHD_YES;
    execution_cancel(x);
    json_t *j = execution_json(x);
    execution_unref(x);
    session_table_put(rq->srv->table, s);
    return reply_json(rq, 202, j);
}

/* ---- one-shot ---- */

static const struct field oneshot_fields[] = {
    {"code", F_STRING},      {"language", F_STRING},  {"files", F_OBJECT},
    {"timeout_s", F_NUMBER}, {"memory_mb", F_INT},    {"pids", F_INT},
    {"disk_mb", F_INT},      {"cpus", F_NUMBER},      {"network", F_OBJECT},
    {"packages", F_ARRAY},   {"index_url", F_STRING}, {"install_timeout_s", F_NUMBER},
};

static int write_input(struct workspace *ws, const char *name, json_t *value)
{
    if (!path_is_safe_relative(name))
        return err_set(EINVAL,
                       "files: bad name '%s': use a relative path inside the workspace, "
                       "without '..'",
                       name);
    const char *b64 = json_string_value(value);
    size_t n;
    unsigned char *data = b64 ? base64_decode(b64, strlen(b64), &n) : NULL;
    if (!data)
        return err_set(EINVAL, "files: '%s' must be base64 text", name);
    int r = workspace_write(ws, name, data, n);
    free(data);
    return r < 0 ? err_set(-r, "files: %s", err_msg()) : 0;
}

/* Created and modified files, base64, within a total cap; the rest are named as omitted. */
static void attach_outputs(json_t *rec_json, struct workspace *ws, const struct exec_record *rec)
{
    json_t *outputs = json_object(), *omitted = json_array();
    size_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (char **f = pass ? rec->modified : rec->created; f && *f; f++) {
            struct buf b = {0};
            if (workspace_read(ws, *f, ONESHOT_OUTPUTS_CAP - total, &b, NULL) < 0) {
                json_array_append_new(omitted, json_string(*f));
            } else {
                size_t n;
                char *b64 = base64_encode(b.data ? b.data : "", b.len, &n);
                json_object_set_new(outputs, *f, json_stringn(b64, n));
                total += b.len;
                free(b64);
            }
            buf_release(&b);
        }
    }
    json_object_set_new(rec_json, "outputs", outputs);
    json_object_set_new(rec_json, "outputs_omitted", omitted);
}

struct oneshot_run {
    struct session *s;
    struct oneshot_run *next;
};

static void oneshot_register(struct server *srv, struct oneshot_run *run)
{
    pthread_mutex_lock(&srv->oneshots_lock);
    run->next = srv->oneshots;
    srv->oneshots = run;
    if (srv->oneshots_interrupted)
        session_interrupt_first_cell(run->s);
    pthread_mutex_unlock(&srv->oneshots_lock);
}

static void oneshot_unregister(struct server *srv, struct oneshot_run *run)
{
    pthread_mutex_lock(&srv->oneshots_lock);
    for (struct oneshot_run **p = &srv->oneshots; *p; p = &(*p)->next) {
        if (*p == run) {
            *p = run->next;
            break;
        }
    }
    pthread_mutex_unlock(&srv->oneshots_lock);
}

void oneshots_interrupt(struct server *srv)
{
    pthread_mutex_lock(&srv->oneshots_lock);
    srv->oneshots_interrupted = true;
    for (struct oneshot_run *run = srv->oneshots; run; run = run->next)
        session_interrupt_first_cell(run->s); /* it may still be starting its sandbox */
    pthread_mutex_unlock(&srv->oneshots_lock);
}

void oneshots_kill(struct server *srv)
{
    pthread_mutex_lock(&srv->oneshots_lock);
    for (struct oneshot_run *run = srv->oneshots; run; run = run->next)
        session_kill(run->s);
    pthread_mutex_unlock(&srv->oneshots_lock);
}

enum MHD_Result h_oneshot(struct request *rq)
{
    json_t *body = body_json(rq);
    struct session_opts o;
    struct exec_request req = {0};
    struct session *s = NULL;
    enum MHD_Result ret = MHD_YES;
    if (!body)
        return MHD_YES;
    if (!check_fields(rq, body, oneshot_fields, ARRAY_SIZE(oneshot_fields)) ||
        !session_opts_from_json(rq, body, &o))
        goto out;
    req.code = json_string_value(json_object_get(body, "code"));
    req.lang = json_string_value(json_object_get(body, "language"));
    if (!req.code) {
        ret = api_error(rq, AE_BAD_REQUEST, "field 'code' is required: the code to run");
        goto out;
    }
    request_owes_reply(rq);
    int r = session_new(&rq->srv->host, &o, &s);
    if (r < 0) {
        metrics_sandbox_failure(rq->srv->metrics);
        ret = api_error(rq, AE_SANDBOX, "cannot start a sandbox: %s", err_msg());
        goto out;
    }
    /* Its cell passes the server's gate as every other: it counts among the running. */
    session_set_gate(s, session_table_gate(rq->srv->table));
    const char *name;
    json_t *v;
    json_object_foreach(json_object_get(body, "files"), name, v)
    {
        if ((r = write_input(session_workspace(s), name, v)) < 0) {
            ret = api_errno(rq, r);
            goto out;
        }
    }
    req.cancel_fd = client_fd(rq);
    req.cancel_events = POLLRDHUP;
    struct exec_record rec;
    struct oneshot_run run = {.s = s};
    exec_record_init(&rec, o.output_cap ? o.output_cap : DEFAULT_OUTPUT_CAP);
    oneshot_register(rq->srv, &run);
    r = session_execute(s, &req, NULL, &rec);
    oneshot_unregister(rq->srv, &run);
    if (r < 0) {
        ret = api_errno(rq, r);
    } else {
        metrics_execution(rq->srv->metrics, rec.status, rec.wall_ms / 1000.0);
        json_t *j = exec_record_json(&rec);
        attach_outputs(j, session_workspace(s), &rec);
        ret = reply_json(rq, 200, j);
    }
    exec_record_release(&rec);
out:
    session_free(s);
    json_decref(body);
    return ret;
}
