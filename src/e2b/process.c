/* process.c - envd's process service over Connect RPC (JSON codec): E2B's commands are the
 * session's programs beside its cells (session_proc_*, in the sandbox's own namespaces and
 * lockdown), each with its pid: Start, Connect, List, SendSignal, SendInput, StreamInput and
 * CloseStdin. A pty (Start with pty, Update) is refused by name. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "e2b/e2b-int.h"

#define STREAM_INPUT_MAX 4096 /* messages of one StreamInput body */

/* Connect's code for a session error on a program. */
static const char *proc_code(int err)
{
    switch (-err) {
    case EBADF:
    case EPIPE:
        return "failed_precondition";
    case ESRCH:
        return "not_found";
    case EAGAIN:
        return "resource_exhausted";
    case ETIMEDOUT:
        return "deadline_exceeded";
    default:
        return e2b_errno_code(err);
    }
}

/* The Connect-Timeout-Ms the SDK sends as a command's timeout (0: none, as envd has it). */
static uint64_t connect_timeout_ms(struct request *rq)
{
    const char *t = e2b_header(rq, "Connect-Timeout-Ms");
    uint64_t ms = 0;
    if (!t || parse_u64(t, &ms) < 0)
        return 0;
    return ms;
}

/* The program a ProcessSelector names ({pid} or {tag}) among s's (only running ones when
 * running is true), a reference; NULL after a Connect not_found. */
static struct session_proc *selected(struct request *rq, struct session *s, json_t *msg,
                                     bool running)
{
    json_t *sel = json_object_get(msg, "process");
    json_t *pid = json_object_get(sel, "pid");
    const char *tag = json_string_value(json_object_get(sel, "tag"));
    struct session_proc *p = NULL;
    json_int_t want = json_integer_value(pid);
    /* A pid past what a process can have is no process's (never one truncated to another's). */
    if (json_is_integer(pid) && want > 0 && want <= INT_MAX)
        p = session_proc_find(s, (int)want);
    if (!p && tag) {
        struct session_proc *all[SESSION_PROCS_MAX];
        size_t n = session_procs_running(s, all, SESSION_PROCS_MAX);
        for (size_t i = 0; i < n; i++) {
            const char *t = json_string_value(json_object_get(session_proc_info(all[i]), "tag"));
            if (!p && t && !strcmp(t, tag))
                p = session_proc_ref(all[i]);
            session_proc_unref(all[i]);
        }
    }
    if (p && running && session_proc_ended(p, NULL)) {
        session_proc_unref(p);
        p = NULL;
    }
    if (!p) {
        if (tag)
            e2b_connect_error(rq, "not_found", "no process tagged '%.100s' is running here", tag);
        else
            e2b_connect_error(rq, "not_found", "no process %lld is running here", (long long)want);
    }
    return p;
}

/* What List shows of it: the config as Start had it, and the tag. */
static json_t *proc_info(json_t *cfg, const char *tag)
{
    json_t *j = json_pack("{s:O}", "config", json_is_object(cfg) ? cfg : json_object());
    if (tag)
        json_object_set_new(j, "tag", json_string(tag));
    return j;
}

static enum MHD_Result process_start(struct request *rq, json_t *msg, const char *box)
{
    json_t *cfg = json_object_get(msg, "process");
    const char *tag = json_string_value(json_object_get(msg, "tag"));
    if (e2b_asks_for(json_object_get(msg, "pty")))
        return e2b_connect_error(rq, "unimplemented",
                                 "a pty (pty.create) is not supported by runcell: run the "
                                 "command with commands.run, which streams its stdout and "
                                 "stderr, and stdin: true to write to it");
    json_t *box_env = NULL;
    struct e2b *e = rq->srv->e2b;
    pthread_mutex_lock(&e->lock);
    struct e2b_box *b = e2b_box_find(e, box);
    if (b)
        box_env = json_deep_copy(b->env);
    pthread_mutex_unlock(&e->lock);
    struct e2b_command c;
    char why[512];
    int r = e2b_command_parse(cfg, box_env, &c, why);
    json_decref(box_env);
    if (r < 0)
        return e2b_connect_error(rq, "invalid_argument", "%s", why);
    struct session *s = e2b_box_session(rq, box);
    if (!s) {
        e2b_command_release(&c);
        return MHD_YES;
    }
    json_t *info = proc_info(cfg, tag);
    struct session_proc_spec spec = {.argv = c.argv,
                                     .env = c.env,
                                     .cwd = c.cwd,
                                     .stdin_pipe = json_is_true(json_object_get(msg, "stdin")),
                                     .timeout_ms = connect_timeout_ms(rq),
                                     .info = info};
    struct session_proc *p = NULL;
    r = session_proc_start(s, &spec, &p);
    session_table_put(rq->srv->table, s);
    json_decref(info);
    e2b_command_release(&c);
    if (r < 0)
        return e2b_connect_error(rq, proc_code(r), "%s", err_msg());
    return e2b_process_stream(rq, p, 0);
}

/* Connect to a running program: what it writes from now on, and its end. One that ended a
 * moment ago (and is still kept) answers with its end at once. */
static enum MHD_Result process_connect(struct request *rq, json_t *msg, struct session *s)
{
    struct session_proc *p = selected(rq, s, msg, false);
    if (!p)
        return MHD_YES;
    uint64_t last = session_proc_last_seq(p);
    bool ended = session_proc_ended(p, NULL);
    return e2b_process_stream(rq, p, ended && last ? last - 1 : last);
}

static enum MHD_Result process_list(struct request *rq, struct session *s)
{
    struct session_proc *all[SESSION_PROCS_MAX];
    size_t n = session_procs_running(s, all, SESSION_PROCS_MAX);
    json_t *procs = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *j = json_deep_copy(session_proc_info(all[i]));
        json_object_set_new(j, "pid", json_integer(session_proc_pid(all[i])));
        json_array_append_new(procs, j);
        session_proc_unref(all[i]);
    }
    return reply_json(rq, 200, json_pack("{s:o}", "processes", procs));
}

static enum MHD_Result process_signal(struct request *rq, json_t *msg, struct session *s)
{
    json_t *sv = json_object_get(msg, "signal");
    const char *sname = json_string_value(sv);
    int sig = sname ? (!strcmp(sname, "SIGNAL_SIGTERM")   ? SIGTERM
                       : !strcmp(sname, "SIGNAL_SIGKILL") ? SIGKILL
                                                          : 0)
                    : (int)json_integer_value(sv);
    if (sig != SIGKILL && sig != SIGTERM)
        return e2b_connect_error(rq, "invalid_argument",
                                 "signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM");
    struct session_proc *p = selected(rq, s, msg, true);
    if (!p)
        return MHD_YES;
    int r = session_proc_signal(s, p, sig);
    int pid = session_proc_pid(p);
    session_proc_unref(p);
    if (r < 0)
        return e2b_connect_error(rq, proc_code(r), "process %d: %s", pid, err_msg());
    return reply_json(rq, 200, json_object());
}

/* One ProcessInput {stdin: bytes} (or {pty}, refused) to p. */
static enum MHD_Result send_input(struct request *rq, struct session_proc *p, json_t *input)
{
    if (json_object_get(input, "pty"))
        return e2b_connect_error(rq, "unimplemented",
                                 "a pty is not supported by runcell; write to the command's "
                                 "stdin (stdin: true) instead");
    const char *b64 = json_string_value(json_object_get(input, "stdin"));
    size_t n = 0;
    unsigned char *data = b64 ? e2b_bytes_decode(b64, &n) : NULL;
    if (!data)
        return e2b_connect_error(rq, "invalid_argument",
                                 "input.stdin must be bytes (base64, as protobuf's JSON has them)");
    int r = session_proc_input(p, data, n);
    free(data);
    if (r < 0)
        return e2b_connect_error(rq, proc_code(r), "%s", err_msg());
    return MHD_YES;
}

static enum MHD_Result process_input(struct request *rq, json_t *msg, struct session *s)
{
    struct session_proc *p = selected(rq, s, msg, true);
    if (!p)
        return MHD_YES;
    send_input(rq, p, json_object_get(msg, "input"));
    session_proc_unref(p);
    return rq->responded ? MHD_YES : reply_json(rq, 200, json_object());
}

/* StreamInput, a client stream: {start: {process}}, then {data: {input}} and keepalives, all
 * in the body (HTTP/1.1 clients send it whole). Answered as a Connect stream: one empty
 * message, then the end. */
static enum MHD_Result process_stream_input(struct request *rq, struct session *s)
{
    char why[256];
    json_t *msgs = e2b_connect_messages(rq->body.data ? rq->body.data : "", rq->body.len,
                                        STREAM_INPUT_MAX, why);
    if (!msgs)
        return e2b_connect_error(rq, "invalid_argument", "%s", why);
    json_t *start = json_object_get(json_array_get(msgs, 0), "start");
    struct session_proc *p = start ? selected(rq, s, start, true) : NULL;
    if (!start)
        e2b_connect_error(rq, "invalid_argument", "the stream's first message must be start");
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m)
    {
        json_t *data = json_object_get(m, "data");
        if (i && p && data && !rq->responded)
            send_input(rq, p, json_object_get(data, "input"));
    }
    session_proc_unref(p);
    json_decref(msgs);
    if (rq->responded)
        return MHD_YES;
    struct buf out;
    buf_init(&out, 0);
    e2b_envelope(&out, json_object(), 0);
    e2b_envelope(&out, json_object(), 0x02);
    struct MHD_Response *r =
        MHD_create_response_from_buffer(out.len, out.data, MHD_RESPMEM_MUST_COPY);
    buf_release(&out);
    MHD_add_response_header(r, "Content-Type", "application/connect+json");
    return reply_response(rq, 200, r);
}

static enum MHD_Result process_close_stdin(struct request *rq, json_t *msg, struct session *s)
{
    struct session_proc *p = selected(rq, s, msg, true);
    if (!p)
        return MHD_YES;
    int r = session_proc_close_input(p);
    session_proc_unref(p);
    if (r < 0)
        return e2b_connect_error(rq, proc_code(r), "%s", err_msg());
    return reply_json(rq, 200, json_object());
}

/* Methods that name a running program, with the session at hand. */
static const struct {
    const char *name;
    bool streaming; /* the client sends application/connect+json */
    enum MHD_Result (*call)(struct request *rq, json_t *msg, struct session *s);
} session_methods[] = {
    {"Connect", true, process_connect},
    {"SendSignal", false, process_signal},
    {"SendInput", false, process_input},
    {"CloseStdin", false, process_close_stdin},
    {"List", false, NULL},
    {"StreamInput", true, NULL},
};

enum MHD_Result h_e2b_process_rpc(struct request *rq)
{
    const char *box = e2b_box_id(rq), *method = rq->params[0];
    bool streaming = e2b_is_connect_stream(rq);
    if (!strcmp(method, "Update"))
        return e2b_connect_error(rq, "unimplemented",
                                 "a pty is not supported by runcell, so it has no size to "
                                 "update");
    if (!strcmp(method, "StreamInput")) {
        struct session *s = e2b_box_session(rq, box);
        if (!s)
            return MHD_YES;
        enum MHD_Result ret = process_stream_input(rq, s);
        session_table_put(rq->srv->table, s);
        return ret;
    }
    json_t *msg = e2b_connect_request(rq);
    if (!msg)
        return MHD_YES;
    enum MHD_Result ret = MHD_YES;
    if (!strcmp(method, "Start")) {
        ret = streaming ? process_start(rq, msg, box)
                        : e2b_connect_error(rq, "invalid_argument",
                                            "Start is a streaming method: send it as "
                                            "application/connect+json");
        json_decref(msg);
        return ret;
    }
    size_t i = 0;
    while (i < ARRAY_SIZE(session_methods) && strcmp(session_methods[i].name, method))
        i++;
    if (i == ARRAY_SIZE(session_methods)) {
        json_decref(msg);
        return e2b_connect_error(rq, "unimplemented",
                                 "process.Process/%s is not a method runcell knows", method);
    }
    if (session_methods[i].streaming != streaming) {
        json_decref(msg);
        return e2b_connect_error(rq, "invalid_argument", "%s is %sa streaming method", method,
                                 session_methods[i].streaming ? "" : "not ");
    }
    struct session *s = e2b_box_session(rq, box);
    if (s) {
        ret = session_methods[i].call ? session_methods[i].call(rq, msg, s) : process_list(rq, s);
        session_table_put(rq->srv->table, s);
    }
    json_decref(msg);
    return ret;
}
