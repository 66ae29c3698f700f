/* stream.c - an execution's events in E2B's messages: the code interpreter's NDJSON and
 * envd's Connect envelopes, as encoders for the HTTP core's one streaming reader. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "e2b/e2b-int.h"

/* ---- streams: an execution's events in E2B's messages ---- */

/* One message: an NDJSON line (connect false), or a Connect envelope (flags, 4-byte
 * big-endian length). */
static void put_msg(struct buf *out, json_t *j, bool connect, unsigned char flags)
{
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!text)
        return;
    size_t n = strlen(text);
    if (connect) {
        unsigned char head[5] = {flags, (unsigned char)(n >> 24), (unsigned char)(n >> 16),
                                 (unsigned char)(n >> 8), (unsigned char)n};
        buf_append(out, head, 5);
        buf_append(out, text, n);
    } else {
        buf_append(out, text, n);
        buf_append(out, "\n", 1);
    }
    free(text);
}

static json_t *timestamp_now(void)
{
    char t[32];
    format_time_iso(now_realtime_ms(), t);
    return json_string(t);
}

/* A runcell MIME bundle as E2B's result: short names for the formats E2B knows, the
 * others kept under their MIME type (the SDK puts them in `extra`). The bundle's keys are
 * MIME types (the session layer keeps no other), so none can be E2B's "type" or another
 * member of the message. */
static json_t *e2b_result(json_t *bundle, bool main)
{
    static const char *const names[][2] = {
        {"text/plain", "text"},        {"text/html", "html"},
        {"text/markdown", "markdown"}, {"image/svg+xml", "svg"},
        {"image/png", "png"},          {"image/jpeg", "jpeg"},
        {"application/pdf", "pdf"},    {"text/latex", "latex"},
        {"application/json", "json"},  {"application/javascript", "javascript"},
    };
    json_t *j = json_pack("{s:s,s:b}", "type", "result", "is_main_result", main);
    const char *k;
    json_t *v;
    json_object_foreach(bundle, k, v)
    {
        const char *name = k;
        for (size_t i = 0; i < ARRAY_SIZE(names); i++)
            if (!strcmp(k, names[i][0]))
                name = names[i][1];
        json_object_set(j, name, v);
    }
    return j;
}

static bool is_display_only(json_t *bundle)
{
    return json_object_get(bundle, "image/png") || json_object_get(bundle, "image/jpeg") ||
           json_object_get(bundle, "image/svg+xml");
}

/* The code interpreter's /execute stream. */
struct exec_enc {
    bool main_sent, error_sent;
};

static void error_msg(struct buf *out, const char *name, const char *value, json_t *traceback)
{
    put_msg(out,
            json_pack("{s:s,s:s,s:s,s:o}", "type", "error", "name", name, "value", value,
                      "traceback", traceback ? traceback : json_string("")),
            false, 0);
}

static void execute_done(struct exec_enc *e, struct execution *x, struct buf *out)
{
    const struct exec_record *rec = execution_record(x);
    const char *why;
    if (!rec) {
        execution_failure(x, &why);
        error_msg(out, "RuncellError", why ? why : "the execution did not run", NULL);
    } else {
        if (rec->status != EXEC_OK && !e->error_sent) {
            /* A timeout, a kill, the output limit: runcell's word, as an error. */
            const char *name = exec_status_name(rec->status);
            const char *msg = rec->message ? rec->message : name;
            error_msg(out, rec->status == EXEC_TIMEOUT ? "TimeoutError" : name, msg,
                      json_string(msg));
        }
        put_msg(out,
                json_pack("{s:s,s:I}", "type", "number_of_executions", "execution_count",
                          (json_int_t)rec->execution_count),
                false, 0);
    }
    put_msg(out, json_pack("{s:s}", "type", "end_of_execution"), false, 0);
}

static void execute_encode(void *ctx, struct execution *x, const struct exec_item *it,
                           struct buf *out)
{
    struct exec_enc *e = ctx;
    switch (it->type) {
    case EV_STDOUT:
    case EV_STDERR: {
        size_t n;
        char *text = utf8_sanitize(it->data, it->len, &n);
        put_msg(out,
                json_pack("{s:s,s:s%,s:o}", "type", it->type == EV_STDOUT ? "stdout" : "stderr",
                          "text", text, n, "timestamp", timestamp_now()),
                false, 0);
        free(text);
        break;
    }
    case EV_RESULT: {
        /* runcell does not mark the cell's value: a figure is a display, the first other
         * bundle the value. */
        bool main = !e->main_sent && !is_display_only(it->json);
        e->main_sent |= main;
        put_msg(out, e2b_result(it->json, main), false, 0);
        break;
    }
    case EV_ERROR: {
        /* The session layer's error always has string name and value and a traceback. */
        e->error_sent = true;
        json_t *tb = json_object_get(it->json, "traceback");
        error_msg(out, json_string_value(json_object_get(it->json, "name")),
                  json_string_value(json_object_get(it->json, "value")),
                  tb ? json_incref(tb) : NULL);
        break;
    }
    case EV_DONE:
        execute_done(e, x, out);
        break;
    }
}

static void execute_keepalive(void *ctx, struct buf *out)
{
    (void)ctx;
    put_msg(out, json_pack("{s:s}", "type", "keepalive"), false, 0);
}

void *e2b_execute_state(void)
{
    return xcalloc(1, sizeof(struct exec_enc));
}

const struct exec_encoder e2b_execute_encoder = {
    .content_type = "application/x-ndjson",
    .event = execute_encode,
    .keepalive = execute_keepalive,
    .free = free,
};

/* Sets (or with pid 0 clears, when it is still pid `only`) the running command; returns the
 * signal it was stopped with. */
int e2b_box_set_running(struct server *srv, const char *id, unsigned pid, json_t *cfg,
                        unsigned only)
{
    int sig = 0;
    pthread_mutex_lock(&srv->e2b->lock);
    struct e2b_box *b = e2b_box_find(srv->e2b, id);
    if (b && (pid || !only || b->running_pid == only)) {
        sig = b->signalled;
        b->signalled = 0;
        b->running_pid = pid;
        json_decref(b->running_cfg);
        b->running_cfg = cfg ? json_incref(cfg) : NULL;
    }
    pthread_mutex_unlock(&srv->e2b->lock);
    return sig;
}

static void process_begin(void *ctx, struct execution *x, struct buf *out)
{
    struct process_enc *p = ctx;
    (void)x;
    put_msg(out, json_pack("{s:{s:{s:i}}}", "event", "start", "pid", (int)p->pid), true, 0);
}

static void process_done(struct process_enc *p, struct execution *x, struct buf *out)
{
    const struct exec_record *rec = execution_record(x);
    int sig = e2b_box_set_running(p->srv, p->box, 0, NULL, p->pid);
    p->ended = true;
    if (!rec) {
        const char *why;
        int r = execution_failure(x, &why);
        enum api_err e = api_err_of(r ? r : -EIO);
        /* A stream's error is in its end-of-stream message (the status stays 200). */
        put_msg(out,
                json_pack("{s:{s:s,s:s}}", "error", "code", api_err_info(e)->connect, "message",
                          why ? why : "the command did not run"),
                true, 0x02);
        return;
    }
    if (rec->status == EXEC_TIMEOUT && !sig) {
        /* Connect's deadline (the Connect-Timeout-Ms the SDK sent as its timeout) passed:
         * the SDKs' TimeoutException, in the stream's end as Connect has it. */
        put_msg(out,
                json_pack("{s:{s:s,s:s}}", "error", "code", "deadline_exceeded", "message",
                          "the command ran past its timeout and was stopped"),
                true, 0x02);
        return;
    }
    /* A command stopped by SendSignal ends as a shell says a signalled one did. */
    int code = sig ? 128 + sig : exec_record_exit_status(rec);
    json_t *end = json_pack("{s:i,s:b,s:s}", "exitCode", code, "exited",
                            !sig && (rec->status == EXEC_OK || rec->status == EXEC_ERROR), "status",
                            sig ? "signal" : exec_status_name(rec->status));
    if (rec->status != EXEC_OK && rec->status != EXEC_ERROR && rec->message)
        json_object_set_new(end, "error", json_string(rec->message));
    put_msg(out, json_pack("{s:{s:o}}", "event", "end", end), true, 0);
    put_msg(out, json_object(), true, 0x02);
}

static void process_encode(void *ctx, struct execution *x, const struct exec_item *it,
                           struct buf *out)
{
    struct process_enc *p = ctx;
    if (it->type == EV_DONE) {
        process_done(p, x, out);
        return;
    }
    if (it->type != EV_STDOUT && it->type != EV_STDERR)
        return;
    size_t n;
    char *b64 = base64_encode(it->data, it->len, &n);
    /* StartResponse {event: ProcessEvent}, ProcessEvent's oneof by its member's name. */
    put_msg(out,
            json_pack("{s:{s:{s:s%}}}", "event", "data",
                      it->type == EV_STDOUT ? "stdout" : "stderr", b64, n),
            true, 0);
    free(b64);
}

static void process_keepalive(void *ctx, struct buf *out)
{
    (void)ctx;
    put_msg(out, json_pack("{s:{s:{}}}", "event", "keepalive"), true, 0);
}

static void process_enc_free(void *ctx)
{
    struct process_enc *p = ctx;
    if (!p->ended)
        e2b_box_set_running(p->srv, p->box, 0, NULL, p->pid);
    free(p->box);
    free(p);
}

const struct exec_encoder e2b_process_encoder = {
    .content_type = "application/connect+json",
    .begin = process_begin,
    .event = process_encode,
    .keepalive = process_keepalive,
    .free = process_enc_free,
};

/* Submits code to s (its reference, owned now) and replies with the stream of its events:
 * it queues behind what runs (E2B runs each call; runcell one at a time per sandbox, in
 * order). A client that leaves (the SDK's timeoutMs) interrupts it, as E2B's does. */
enum MHD_Result e2b_start_stream(struct request *rq, struct session *s, const char *code,
                                 const char *lang, uint64_t timeout_ms,
                                 const struct exec_encoder *enc, void *enc_ctx)
{
    struct exec_request req = {
        .code = code, .lang = lang, .timeout_ms = timeout_ms, .cancel_fd = -1};
    struct execution *x;
    int r = session_submit(rq->srv->table, s, &req, &x);
    if (r == 0 && (r = execution_spawn(x)) < 0)
        execution_unref(x);
    if (r < 0) {
        if (enc->free)
            enc->free(enc_ctx);
        session_table_put(rq->srv->table, s);
        return e2b_error(rq, e2b_status_of(r), "%s", err_msg());
    }
    request_owes_reply(rq);
    struct exec_stream_opts o = {.interrupt_on_leave = true,
                                 .keepalive_ms = E2B_KEEPALIVE_MS,
                                 .table = rq->srv->table,
                                 .session = s};
    return http_stream_execution(rq, x, 0, enc, enc_ctx, &o);
}
