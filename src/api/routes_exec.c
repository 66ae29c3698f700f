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
    {"code", F_STRING}, {"timeout_s", F_NUMBER}, {"language", F_STRING}};

bool execution_slot_take(struct request *rq)
{
    size_t max = rq->srv->cfg->limits.max_executions;
    size_t n = atomic_fetch_add(&rq->srv->executions, 1);
    if (n < max) {
        rq->owes_reply = true;
        atomic_fetch_add(&rq->srv->replies_owed, 1);
        return true;
    }
    atomic_fetch_sub(&rq->srv->executions, 1);
    api_error(rq, AE_LIMIT,
              "the server is running its maximum of %zu executions; retry "
              "shortly",
              max);
    return false;
}

void execution_slot_give(struct request *rq)
{
    atomic_fetch_sub(&rq->srv->executions, 1);
}

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
    }
    return NULL;
}

int client_fd(struct request *rq)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(rq->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* Parses an execute body into req (code borrowed from body); false after replying 400. */
static bool parse_execute(struct request *rq, json_t *body, struct exec_request *req)
{
    if (!check_fields(rq, body, execute_fields, ARRAY_SIZE(execute_fields)))
        return false;
    req->code = json_string_value(json_object_get(body, "code"));
    req->lang = json_string_value(json_object_get(body, "language"));
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
    return get_seconds(rq, body, "timeout_s", rq->srv->cfg->limits.max_timeout_ms,
                       &req->timeout_ms);
}

/* ---- streaming: the cell runs on its own thread; the response reads its events ---- */

struct stream {
    struct server *srv;
    struct session *s;
    json_t *body; /* keeps req.code alive */
    struct exec_request req;
    pthread_t thread;
    struct out_stream os;
};

static void stream_push(struct stream *st, json_t *j)
{
    char *line = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    size_t n = strlen(line);
    line = xrealloc(line, n + 1);
    line[n] = '\n';
    out_stream_append(&st->os, line, n + 1);
    free(line);
}

static void stream_event(void *ctx, const struct exec_event *ev)
{
    json_t *j = exec_event_json(ev);
    if (j)
        stream_push(ctx, j);
}

static void *stream_main(void *arg)
{
    struct stream *st = arg;
    struct exec_record rec;
    struct exec_sink sink = {.fn = stream_event, .ctx = st};
    exec_record_init(&rec, session_options(st->s)->output_cap);
    int r = session_execute(st->s, &st->req, &sink, &rec);
    /* Not running any more, from now: not when the response is freed, which comes after the
     * session is idle again (and, for a client that hung up, whenever the server notices). */
    atomic_fetch_sub(&st->srv->executions, 1);
    json_t *done;
    if (r < 0) {
        done = json_pack("{s:s,s:{s:s,s:s}}", "type", "done", "error", "code",
                         api_err_code(api_err_of(r)), "message", err_msg());
    } else {
        metrics_execution(st->srv->metrics, rec.status, rec.wall_ms / 1000.0);
        done = json_pack("{s:s,s:o}", "type", "done", "record", exec_record_json(&rec));
    }
    exec_record_release(&rec);
    stream_push(st, done);
    out_stream_finish(&st->os);
    return NULL;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max)
{
    (void)pos;
    return out_stream_read(&((struct stream *)cls)->os, out, max);
}

static void stream_free(void *cls)
{
    struct stream *st = cls;
    out_stream_end(&st->os); /* the cell must not run on unseen */
    pthread_join(st->thread, NULL);
    session_table_put(st->srv->table, st->s);
    out_stream_release(&st->os);
    json_decref(st->body);
    free(st);
}

static enum MHD_Result execute_streaming(struct request *rq, struct session *s, json_t *body,
                                         const struct exec_request *req)
{
    struct stream *st = xcalloc(1, sizeof(*st));
    st->srv = rq->srv;
    st->s = s;
    st->body = body;
    st->req = *req;
    int e = out_stream_init(&st->os, client_fd(rq), 0, NULL);
    st->req.cancel_fd = st->os.cancel[0];
    st->req.cancel_events = POLLIN;
    if (e < 0 || pthread_create(&st->thread, NULL, stream_main, st)) {
        out_stream_release(&st->os);
        free(st);
        execution_slot_give(rq);
        session_table_put(rq->srv->table, s);
        json_decref(body);
        return MHD_NO;
    }
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024,
                                                               stream_read, st, stream_free);
    MHD_add_response_header(r, "Content-Type", "application/x-ndjson");
    MHD_add_response_header(r, "Cache-Control", "no-store");
    return reply_response(rq, 200, r);
}

bool wants_ndjson(struct request *rq)
{
    /* Named, not reached by a wildcard: JSON is the default; and preferred at least as
     * much as JSON ("application/json, application/x-ndjson;q=0.5" gets JSON). */
    double q = accept_q(rq, "application/x-ndjson");
    return accept_lists(rq, "application/x-ndjson") && q > 0 &&
           q >= accept_q(rq, "application/json");
}

enum MHD_Result h_execute(struct request *rq)
{
    json_t *body = body_json(rq);
    struct exec_request req = {0};
    if (!body)
        return MHD_YES;
    if (!parse_execute(rq, body, &req)) {
        json_decref(body);
        return MHD_YES;
    }
    struct session *s = acquire_session(rq);
    if (!s) {
        json_decref(body);
        return MHD_YES;
    }
    if (!execution_slot_take(rq)) {
        session_table_put(rq->srv->table, s);
        json_decref(body);
        return MHD_YES;
    }
    /* A stream's status is sent before the cell starts: say "busy" now while it can still
     * be a 409 (a race lost after this check ends the stream with a busy error instead). */
    if (wants_ndjson(rq) && !session_busy(s))
        return execute_streaming(rq, s, body, &req); /* owns s, body and the slot now */

    /* A client that hangs up interrupts the cell. */
    req.cancel_fd = client_fd(rq);
    req.cancel_events = POLLRDHUP;
    struct exec_record rec;
    exec_record_init(&rec, session_options(s)->output_cap);
    int r = session_execute(s, &req, NULL, &rec);
    enum MHD_Result ret;
    if (r < 0) {
        ret = api_errno(rq, r);
    } else {
        metrics_execution(rq->srv->metrics, rec.status, rec.wall_ms / 1000.0);
        ret = reply_json(rq, 200, exec_record_json(&rec));
    }
    exec_record_release(&rec);
    execution_slot_give(rq);
    session_table_put(rq->srv->table, s);
    json_decref(body);
    return ret;
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
    if (!execution_slot_take(rq))
        goto out;
    int r = session_new(&rq->srv->host, &o, &s);
    if (r < 0) {
        metrics_sandbox_failure(rq->srv->metrics);
        ret = api_error(rq, AE_SANDBOX, "cannot start a sandbox: %s", err_msg());
        goto slot;
    }
    const char *name;
    json_t *v;
    json_object_foreach(json_object_get(body, "files"), name, v)
    {
        if ((r = write_input(session_workspace(s), name, v)) < 0) {
            ret = api_errno(rq, r);
            goto slot;
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
slot:
    execution_slot_give(rq);
out:
    session_free(s);
    json_decref(body);
    return ret;
}
