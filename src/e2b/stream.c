/* stream.c - streams in E2B's messages, for the HTTP core's one streaming reader: an
 * execution's events as the code interpreter's NDJSON (an encoder), and a program's output
 * and end as envd's Connect envelopes (a source). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
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

void e2b_envelope(struct buf *out, json_t *j, unsigned char flags)
{
    put_msg(out, j, true, flags);
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
        {"text/plain", "text"},
        {"text/html", "html"},
        {"text/markdown", "markdown"},
        {"image/svg+xml", "svg"},
        {"image/png", "png"},
        {"image/jpeg", "jpeg"},
        {"application/pdf", "pdf"},
        {"text/latex", "latex"},
        {"application/json", "json"},
        {"application/javascript", "javascript"},
        {"application/vnd.runcell.chart+json", "chart"}, /* kernel.py's chart of a figure */
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
        /* the cell's value is E2B's main result; a display (figures, display()) is not */
        bool main = it->len == 1 && !e->main_sent;
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

enum MHD_Result e2b_execute_refused(struct request *rq, const char *name, const char *fmt, ...)
{
    size_t n;
    va_list ap;
    va_start(ap, fmt);
    char *clean = e2b_vmessage(fmt, ap, &n);
    va_end(ap);
    struct buf out;
    buf_init(&out, 0);
    put_msg(&out,
            json_pack("{s:s,s:s,s:s%,s:s%}", "type", "error", "name", name, "value", clean, n,
                      "traceback", clean, n),
            false, 0);
    put_msg(&out, json_pack("{s:s}", "type", "end_of_execution"), false, 0);
    free(clean);
    struct MHD_Response *r =
        MHD_create_response_from_buffer(out.len, out.data, MHD_RESPMEM_MUST_COPY);
    buf_release(&out);
    MHD_add_response_header(r, "Content-Type", "application/x-ndjson");
    return reply_response(rq, 200, r);
}

/* Submits code to s (its reference, owned now) and replies with the stream of its events:
 * it queues behind the cell that runs (one at a time per sandbox, in order; commands run
 * beside). A client that leaves (the SDK's timeoutMs) interrupts it, as E2B's does. */
enum MHD_Result e2b_execute_stream(struct request *rq, struct session *s, const char *code,
                                   const char *lang)
{
    struct exec_request req = {.code = code,
                               .lang = lang,
                               .timeout_ms = rq->srv->cfg->limits.max_timeout_ms,
                               .cancel_fd = -1};
    struct execution *x;
    int r = session_submit(rq->srv->table, s, &req, &x);
    if (r == 0 && (r = execution_spawn(x)) < 0)
        execution_unref(x);
    if (r < 0) {
        session_table_put(rq->srv->table, s);
        return e2b_execute_refused(rq, r == -EAGAIN ? "RateLimitError" : "SandboxError", "%s%s",
                                   err_msg(),
                                   r == -EAGAIN ? " (the server's limit on executions at once "
                                                  "was reached: try again once one has ended)"
                                                : "");
    }
    request_owes_reply(rq);
    struct exec_stream_opts o = {.interrupt_on_leave = true,
                                 .keepalive_ms = E2B_KEEPALIVE_MS,
                                 .table = rq->srv->table,
                                 .session = s};
    return http_stream_execution(rq, x, 0, &e2b_execute_encoder, e2b_execute_state(), &o);
}

/* ---- a program's events: envd's process.Process Start and Connect streams ---- */

struct proc_stream {
    struct session_proc *p;
    struct proc_watch *w;
    uint64_t after;
    bool begun;
};

/* Go's names for the signals a command is stopped with (envd's status is Go's
 * ProcessState.String()). */
static const char *signal_word(int sig)
{
    switch (sig) {
    case SIGKILL:
        return "killed";
    case SIGTERM:
        return "terminated";
    case SIGINT:
        return "interrupt";
    case SIGSEGV:
        return "segmentation fault";
    case SIGABRT:
        return "aborted";
    case SIGPIPE:
        return "broken pipe";
    default:
        return NULL;
    }
}

/* The end of the program: its EndEvent (a shell's 128+N for a signal), or past its timeout,
 * Connect's deadline_exceeded in the end of the stream (the SDKs' TimeoutException). */
static void proc_end(struct proc_stream *ps, struct buf *out)
{
    struct session_proc_end e = {0};
    session_proc_ended(ps->p, &e);
    int pid = session_proc_pid(ps->p);
    if (e.timed_out) {
        _cleanup_free_ char *msg = xasprintf("process %d ran past its timeout and was killed "
                                             "(the timeout the SDK sends as Connect-Timeout-Ms; "
                                             "0 for none)",
                                             pid);
        put_msg(out,
                json_pack("{s:{s:s,s:s}}", "error", "code", "deadline_exceeded", "message", msg),
                true, 0x02);
        return;
    }
    char status[64];
    const char *word = signal_word(e.signal);
    int code = e.exited ? e.exit_code : e.signal ? 128 + e.signal : -1;
    if (e.lost)
        snprintf(status, sizeof(status), "lost");
    else if (e.signal && word)
        snprintf(status, sizeof(status), "signal: %s", word);
    else if (e.signal)
        snprintf(status, sizeof(status), "signal: %d", e.signal);
    else
        snprintf(status, sizeof(status), "exit status %d", e.exit_code);
    json_t *end =
        json_pack("{s:i,s:b,s:s}", "exitCode", code, "exited", e.exited, "status", status);
    if (e.lost)
        json_object_set_new(end, "error",
                            json_string("the sandbox was restarted (a cell that had to be killed "
                                        "takes its processes with it) or closed"));
    put_msg(out, json_pack("{s:{s:o}}", "event", "end", end), true, 0);
    put_msg(out, json_object(), true, 0x02);
}

static int proc_pull(void *src, struct buf *out)
{
    struct proc_stream *ps = src;
    struct proc_item items[64];
    if (!ps->begun) {
        ps->begun = true;
        put_msg(out, json_pack("{s:{s:{s:i}}}", "event", "start", "pid", session_proc_pid(ps->p)),
                true, 0);
    }
    size_t n = session_proc_read(ps->p, ps->after, items, ARRAY_SIZE(items));
    bool over = false;
    for (size_t i = 0; i < n && !over; i++) {
        ps->after = items[i].seq;
        if (items[i].type == PROC_END) {
            proc_end(ps, out);
            over = true;
            continue;
        }
        size_t len;
        char *b64 = base64_encode(items[i].data, items[i].len, &len);
        /* StartResponse {event: ProcessEvent}, ProcessEvent's oneof by its member's name */
        put_msg(out,
                json_pack("{s:{s:{s:s%}}}", "event", "data",
                          items[i].type == PROC_STDOUT ? "stdout" : "stderr", b64, len),
                true, 0);
        free(b64);
    }
    proc_items_release(items, n);
    return over ? 1 : 0;
}

static int proc_wait_fd(void *src)
{
    return proc_watch_fd(((struct proc_stream *)src)->w);
}

static void proc_clear(void *src)
{
    proc_watch_clear(((struct proc_stream *)src)->w);
}

static void proc_keepalive(void *src, struct buf *out)
{
    (void)src;
    put_msg(out, json_pack("{s:{s:{}}}", "event", "keepalive"), true, 0);
}

static void proc_stream_free(void *src)
{
    struct proc_stream *ps = src;
    proc_watch_free(ps->w);
    session_proc_unref(ps->p);
    free(ps);
}

/* A client that goes (the SDK's disconnect(), its timeout) leaves the program running, as in
 * E2B: no `left`. */
static const struct http_source_ops proc_source_ops = {
    .pull = proc_pull,
    .wait_fd = proc_wait_fd,
    .clear = proc_clear,
    .keepalive = proc_keepalive,
    .free = proc_stream_free,
};

/* The keepalive interval the SDK asks for (Keepalive-Ping-Interval, in seconds), within
 * E2B_KEEPALIVE_MS. */
static int keepalive_ms(struct request *rq)
{
    const char *h = e2b_header(rq, "Keepalive-Ping-Interval");
    uint64_t s = 0;
    if (h && parse_u64(h, &s) == 0 && s > 0 && s * 1000 < E2B_KEEPALIVE_MS)
        return (int)(s * 1000);
    return E2B_KEEPALIVE_MS;
}

enum MHD_Result e2b_process_stream(struct request *rq, struct session_proc *p, uint64_t after)
{
    struct proc_stream *ps = xcalloc(1, sizeof(*ps));
    ps->p = p;
    ps->after = after;
    int r = session_proc_watch(p, &ps->w);
    if (r < 0) {
        session_proc_unref(p);
        free(ps);
        return e2b_connect_error(rq, "resource_exhausted", "%s", err_msg());
    }
    return http_stream(rq, 200, "application/connect+json", &proc_source_ops, ps, keepalive_ms(rq));
}
