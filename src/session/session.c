/* session.c - stateful sessions: one kernel at a time on a workspace that outlives it,
 * one cell at a time, timeouts that interrupt first and kill only when they must. */
#include "session/session-int.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "kernel/kernel.h"

struct session {
    struct sandbox_host *host;
    struct session_opts opts;
    struct workspace *ws;
    pthread_mutex_t lock; /* guards k and other (pointer swaps) and state */
    pthread_cond_t idle;  /* signalled when an execution ends */
    struct kernel *k;     /* the kernel of the session's language; NULL after a failed
                           * restart (the next execute retries) */
    /* A second kernel on the same workspace, of the other kind (a JavaScript kernel in a
     * Python session, a Python one, for python and bash cells, in a JavaScript session):
     * started by the first cell in its language, gone with the session or a restart. */
    struct kernel *other;
    /* Changed only by transition_locked (state.c's table). An interrupt that came before the cell
     * reached the kernel (while it started, or before the request was written) is owed to it
     * (ARMED, INTERRUPTING), and sent once the request is out. */
    enum session_state state;
    /* The running cell's request is out (from send_owed_interrupt to end): only then does
     * an interrupt go to the kernel at once. Before, it is left to send_owed_interrupt, so
     * that a cell gets one interrupt's frame and signal, not one now and one owed. */
    bool cell_sent;
    _Atomic bool killed; /* session_kill: what dies now was stopped by runcell, not itself */
    long execution_count;
    uint64_t last_used_ms;
    uint64_t created_ms; /* wall clock */
    char *python_version;
    char **argv; /* our copy of opts.argv */
    char lang[16];
    struct net_policy *policy; /* our copies of opts.net's parts */
    char **packages;
    char **net_env;
    char *index_url;
    struct sandbox_net net; /* the egress proxy, while the session lives */
    struct event_log events;
    json_t *packages_report;
    struct persist *persist;               /* NULL unless session_persist was called */
    const struct persist_ops *persist_ops; /* set with persist */
    /* The history of files for undo when they go to no store (persist_local_new); made at the
     * first cell of a session with a history. */
    struct persist *files_history;
    struct exec_gate *gate; /* borrowed; NULL: none */
    /* The executions waiting for their turn, oldest first (lock); the head runs next. */
    struct exec_turn *queue_head, *queue_tail;
    size_t queued;
    struct exec_turn *running_turn; /* whose cell runs now (lock), or NULL */
    bool closing;                   /* being closed: nothing more is queued or begun */
    /* Paused (snapshot.c): what comes next to the session resumes it first, through
     * pause_ops (pointers, as persist_ops: runcell run links no snapshot.c). */
    enum session_pause paused;
    const struct session_pause_ops *pause_ops;
    char *resume_error;          /* why the last automatic resume lost state, for the next record */
    struct exec_registry execs;  /* durable executions kept (exec.c) */
    struct session_procs *procs; /* programs beside the cells (procs.c), or NULL */
};

const char *session_home_dir(const char *home_dir)
{
    if (!home_dir || !strcmp(home_dir, "/workspace"))
        return "/workspace";
    return strcmp(home_dir, SANDBOX_HOME_DIR) ? NULL : SANDBOX_HOME_DIR;
}

void session_opts_fill_defaults(struct session_opts *o)
{
    sandbox_limits_fill_defaults(&o->limits);
    if (!o->timeout_ms)
        o->timeout_ms = DEFAULT_TIMEOUT_MS;
    if (!o->idle_timeout_ms)
        o->idle_timeout_ms = DEFAULT_IDLE_TIMEOUT_MS;
    if (!o->interrupt_grace_ms)
        o->interrupt_grace_ms = DEFAULT_INTERRUPT_GRACE_MS;
    if (!o->start_timeout_ms)
        o->start_timeout_ms = DEFAULT_KERNEL_START_MS;
    if (!o->output_cap)
        o->output_cap = DEFAULT_OUTPUT_CAP;
}

/* Where the kernel that runs lang lives: the session's own, or the other kind's. */
static struct kernel **kernel_slot(struct session *s, const char *lang)
{
    return lang_is_javascript(lang) == lang_is_javascript(s->lang) ? &s->k : &s->other;
}

static int start_kernel_for(struct session *s, const char *lang)
{
    struct sandbox_limits l = s->opts.limits;
    struct kernel *k;
    struct sandbox_spec spec = {0};
    const char *binds[8];
    _cleanup_strv_ char **env = sandbox_net_apply(&s->net, &spec, binds, ARRAY_SIZE(binds), NULL);
    struct kernel_env extra = {.env = env,
                               .ro_binds = binds,
                               .relay_socket = spec.relay_socket,
                               .relay_port = spec.relay_port,
                               .javascript = lang_is_javascript(lang),
                               .home_dir = s->opts.home_dir,
                               .exec_channel = true};
    /* The CPU-time rlimit is a backstop for a whole kernel's life, not one cell. */
    l.cpu_time_s = 0;
    int r = kernel_start(s->host, s->ws, &l, s->argv, s->opts.start_timeout_ms, &extra, &k);
    if (r < 0)
        return r;
    /* A kernel that cannot keep its history still runs: an undo says what is missing. */
    if (s->opts.history && !extra.javascript &&
        kernel_history(k, s->opts.history, s->opts.start_timeout_ms) < 0)
        log_warn("msg=\"the kernel keeps no history\" error=%s", log_quote(err_msg()));
    pthread_mutex_lock(&s->lock);
    *kernel_slot(s, lang) = k;
    pthread_mutex_unlock(&s->lock);
    if (*kernel_python_version(k) && !s->python_version)
        s->python_version = xstrdup(kernel_python_version(k));
    return 0;
}

static int start_kernel(struct session *s)
{
    return start_kernel_for(s, s->lang);
}

static void stop_kernel_for(struct session *s, const char *lang)
{
    pthread_mutex_lock(&s->lock);
    struct kernel **slot = kernel_slot(s, lang);
    struct kernel *k = *slot;
    *slot = NULL;
    pthread_mutex_unlock(&s->lock);
    kernel_free(k);
}

/* Both kernels go. */
static void stop_kernel(struct session *s)
{
    stop_kernel_for(s, s->lang);
    pthread_mutex_lock(&s->lock);
    struct kernel *other = s->other;
    s->other = NULL;
    pthread_mutex_unlock(&s->lock);
    kernel_free(other);
}

/* Keeps copies of what opts.net borrows; the session's opts point at them. */
static void own_net_opts(struct session *s, const struct net_opts *n)
{
    s->opts.net = *n;
    s->policy = net_policy_copy(n->policy);
    s->packages = xcalloc(1, sizeof(char *));
    for (char *const *p = n->packages; p && *p; p++)
        s->packages = strv_push(s->packages, *p);
    s->index_url = n->index_url ? xstrdup(n->index_url) : NULL;
    s->net_env = xcalloc(1, sizeof(char *));
    for (char *const *e = n->env; e && *e; e++)
        s->net_env = strv_push(s->net_env, *e);
    s->opts.net.env = n->env ? s->net_env : NULL;
    s->opts.net.policy = s->policy;
    s->opts.net.packages = n->packages ? s->packages : NULL;
    s->opts.net.index_url = s->index_url;
    if (!s->opts.net.install_timeout_ms)
        s->opts.net.install_timeout_ms = DEFAULT_INSTALL_TIMEOUT_MS;
}

/* Files, the network, packages: what comes before the first kernel. */
static int prepare_workspace(struct session *s, const struct session_opts *opts)
{
    int r = copy_input_files(s->ws, opts->files, opts->n_files);
    if (r < 0)
        return r;
    r = sandbox_net_start(&s->net, &s->opts.net, s->ws, &s->events);
    s->opts.net.secrets = NULL; /* the proxy holds its own copy; the session keeps none */
    if (r < 0)
        return r;
    if (deps_wanted(&s->opts.net, s->ws))
        s->packages_report = deps_install(s->host, s->ws, &s->opts.limits, &s->opts.net, &s->net);
    return 0;
}

/* Everything of opts but the network (kept as the session has it: see own_net_opts) and
 * the input files (used once, at creation). */
static void set_opts(struct session *s, const struct session_opts *opts)
{
    struct net_opts net = s->opts.net;
    s->opts = *opts;
    s->opts.net = net;
    s->opts.files = NULL;
    s->opts.n_files = 0;
    session_opts_fill_defaults(&s->opts);
    strv_free(s->argv);
    s->argv = xcalloc(1, sizeof(char *));
    for (char *const *a = opts->argv; a && *a; a++)
        s->argv = strv_push(s->argv, *a);
    s->opts.argv = s->argv;
    snprintf(s->lang, sizeof(s->lang), "%s",
             lang_supported(opts->lang) ? lang_name(opts->lang) : "python");
    s->opts.lang = s->lang;
    /* a static string: nothing borrowed outlives the caller's */
    s->opts.home_dir = session_home_dir(opts->home_dir);
    if (!s->opts.home_dir)
        s->opts.home_dir = "/workspace";
}

int session_start_shell(struct session *s)
{
    if (lang_is_javascript(s->lang) || !s->k)
        return err_set(EINVAL, "only a Python kernel runs a shell");
    return kernel_start_shell(s->k, s->opts.start_timeout_ms);
}

int session_adopt(struct session *s, const struct session_opts *opts)
{
    struct session_opts o = *opts;
    session_opts_fill_defaults(&o);
    const char *home = session_home_dir(o.home_dir);
    if (!home)
        return err_set(EINVAL, "no home directory %s: it is /workspace or %s", o.home_dir,
                       SANDBOX_HOME_DIR);
    pthread_mutex_lock(&s->lock);
    int r = s->k ? sandbox_set_limits(kernel_sandbox(s->k), &o.limits) : -ESRCH;
    pthread_mutex_unlock(&s->lock);
    if (r < 0 && r != -ENODATA)
        return err_set(-r, "cannot apply the session's limits: %s", strerror(-r));
    /* Made ahead with the pool's home; the kernel is told the new one (~0.1 ms). The pool
     * hands over Python sessions, whose only kernel is s->k. */
    if (strcmp(home, s->opts.home_dir) && (r = kernel_set_home(s->k, home, o.start_timeout_ms)) < 0)
        return r;
    if (o.history != s->opts.history && !lang_is_javascript(s->lang) &&
        (r = kernel_history(s->k, MIN(o.history, SESSION_HISTORY_MAX), o.start_timeout_ms)) < 0)
        return r;
    set_opts(s, opts);
    s->created_ms = now_realtime_ms();
    s->last_used_ms = now_ms();
    return 0;
}

int session_new(struct sandbox_host *host, const struct session_opts *opts, struct session **ret)
{
    int r = net_opts_check(&opts->net);
    if (r < 0)
        return r;
    if (!session_home_dir(opts->home_dir))
        return err_set(EINVAL, "no home directory %s: it is /workspace or %s", opts->home_dir,
                       SANDBOX_HOME_DIR);
    struct session *s = xcalloc(1, sizeof(*s));
    s->host = host;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->idle, NULL);
    set_opts(s, opts);
    own_net_opts(s, &opts->net);
    event_log_init(&s->events);
    pthread_mutex_init(&s->execs.lock, NULL);
    pthread_mutex_init(&s->execs.keys_lock, NULL);
    s->last_used_ms = now_ms();
    s->created_ms = now_realtime_ms();
    r = workspace_new(host, s->opts.limits.disk_mb, &s->ws);
    if (r < 0 || (r = prepare_workspace(s, opts)) < 0 || (r = start_kernel(s)) < 0) {
        session_free(s);
        return r;
    }
    *ret = s;
    return 0;
}

/* ---- one execution ---- */

/* Why a cell was stopped: its time ran out, the caller cancelled it, or the kernel broke
 * the protocol (it cannot be trusted to finish the cell, so it goes at once). */
enum stop { STOP_NONE, STOP_TIMEOUT, STOP_CANCEL, STOP_PROTOCOL, STOP_LIMIT };

/* What one execution may make the daemon hold of what the kernel sent (results are also
 * capped at RESULTS_CAP bytes, each result charged its text and KERNEL_VALUE_COST per
 * JSON value): a cell that passes one ends with output_limit. */
#define RESULTS_MAX_COUNT 10000
#define DONE_MAX_COST     (8u << 20) /* the done message: the error and its traceback */

struct exec_ctx {
    struct kernel *k; /* the kernel the cell runs in, which a sync is answered on */
    struct exec_record *rec;
    const struct exec_sink *sink;
    json_t *done;
    size_t results_bytes; /* charged as above */
    size_t n_results;
    char *limit;             /* the first cap the kernel's output broke (STOP_LIMIT), or NULL */
    char *violation;         /* what the kernel did wrong (STOP_PROTOCOL) */
    struct sandbox_net *net; /* whose secrets are masked in what the cell shows */
};

static void over_limit(struct exec_ctx *x, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void over_limit(struct exec_ctx *x, const char *fmt, ...)
{
    if (x->limit)
        return;
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&x->limit, fmt, ap) < 0)
        x->limit = xstrdup("a limit on the cell's output");
    va_end(ap);
}

static size_t message_cost(const struct kernel_event *ev)
{
    return ev->len + ev->values * KERNEL_VALUE_COST;
}

static void emit(struct exec_ctx *x, enum exec_event_type type, const char *data, size_t len,
                 json_t *json)
{
    if (!x->sink || !x->sink->fn)
        return;
    struct exec_event ev = {.type = type, .data = data, .len = len, .json = json};
    x->sink->fn(x->sink->ctx, &ev);
}

/* ---- what the kernel sends, made into typed records (once, here: no surface reads the
 * kernel's JSON) ---- */

/* A MIME type as a bundle's key: "type/subtype", each of [a-z0-9] then [a-z0-9.+_-]
 * (RFC 6838's restricted names, lower-case), at most 127 bytes. A key that is not one
 * (E2B's "type", a control character, a quote) never reaches a surface. */
static bool mime_key_ok(const char *k)
{
    size_t n = strlen(k);
    const char *slash = strchr(k, '/');
    if (!slash || n > 127 || slash == k || !slash[1] || strchr(slash + 1, '/'))
        return false;
    for (const char *p = k; *p; p++) {
        bool first = p == k || p == slash + 1;
        bool alnum = (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9');
        if (p != slash && !alnum && (first || !strchr(".+_-", *p)))
            return false;
    }
    return true;
}

/* Whether a MIME type's value may be any JSON (application/json and the +json types), not
 * only text. */
static bool mime_is_json(const char *k)
{
    size_t n = strlen(k);
    return !strcmp(k, "application/json") || (n > 5 && !strcmp(k + n - 5, "+json"));
}

/* A MIME bundle from the kernel: MIME-type keys only; each value a string, or for a JSON
 * type any JSON; text/plain always there. */
static json_t *clean_bundle(json_t *data)
{
    json_t *out = json_object();
    const char *mime;
    json_t *v;
    json_object_foreach(data, mime, v)
    {
        if (mime_key_ok(mime) && (json_is_string(v) || mime_is_json(mime)))
            json_object_set(out, mime, v);
    }
    if (!json_is_string(json_object_get(out, "text/plain")))
        json_object_set_new(out, "text/plain", json_string(""));
    return out;
}

/* The string member `key` of o, or dflt. */
static const char *member_string(json_t *o, const char *key, const char *dflt)
{
    const char *v = json_string_value(json_object_get(o, key));
    return v ? v : dflt;
}

/* A cell's error as the record keeps it: {name, value, traceback}, each a string (a
 * traceback sent as a list of lines is joined), and a syntax error's lineno and offset; a
 * member missing or of another type is "Error", "" and "" (name, value, traceback), and no
 * other member is kept. NULL when err is not an object. */
static json_t *clean_error(json_t *err)
{
    if (!json_is_object(err))
        return NULL;
    json_t *tb = json_object_get(err, "traceback");
    json_t *text;
    if (json_is_array(tb)) {
        struct buf b;
        size_t i;
        json_t *line;
        buf_init(&b, 0);
        json_array_foreach(tb, i, line) if (json_is_string(line)) buf_printf(
            &b, "%s%s", json_string_value(line), i + 1 < json_array_size(tb) ? "\n" : "");
        text = json_string(b.data ? b.data : "");
        buf_release(&b);
    } else {
        text = json_string(member_string(err, "traceback", ""));
    }
    const char *name = member_string(err, "name", "Error");
    json_t *out =
        json_pack("{s:s,s:s,s:o}", "name", *name ? name : "Error", "value",
                  member_string(err, "value", ""), "traceback", text ? text : json_string(""));
    /* A syntax error's place, when the kernel said it as numbers a line can have. */
    static const char *const places[] = {"lineno", "offset"};
    for (size_t i = 0; i < ARRAY_SIZE(places); i++) {
        json_t *v = json_object_get(err, places[i]);
        if (json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= INT_MAX)
            json_object_set(out, places[i], v);
    }
    return out;
}

static void drain_pipes(struct kernel *k, struct exec_ctx *x);

static void on_kernel_event(void *ctx, const struct kernel_event *ev)
{
    struct exec_ctx *x = ctx;
    switch (ev->type) {
    case KEV_STDOUT:
    case KEV_STDERR: {
        bool out = ev->type == KEV_STDOUT;
        _cleanup_free_ char *masked = sandbox_net_scrub_copy(x->net, ev->data, ev->len);
        const char *data = masked ? masked : ev->data;
        size_t head = outcap_append(out ? &x->rec->out : &x->rec->err, data, ev->len);
        if (head)
            emit(x, out ? EV_STDOUT : EV_STDERR, data, head, NULL);
        break;
    }
    case KEV_DISPLAY: {
        /* Charged by what the message costs to hold, not by its length alone: the frame's
         * text bounds what the bundle keeps of it. */
        size_t cost = message_cost(ev);
        if (x->results_bytes + cost > RESULTS_CAP) {
            over_limit(x, "its results passed the per-execution limit of %u MiB",
                       RESULTS_CAP >> 20);
            break;
        }
        if (x->n_results >= RESULTS_MAX_COUNT) {
            over_limit(x, "it displayed more than %d results", RESULTS_MAX_COUNT);
            break;
        }
        json_t *bundle = clean_bundle(json_object_get(ev->msg, "data"));
        sandbox_net_scrub_json(x->net, bundle);
        x->results_bytes += cost;
        x->n_results++;
        json_array_append(x->rec->results, bundle);
        /* len says whether it is the cell's value (the kernel's "result"), not a display */
        emit(x, EV_RESULT, NULL, json_is_true(json_object_get(ev->msg, "result")) ? 1 : 0, bundle);
        json_decref(bundle);
        break;
    }
    case KEV_DONE:
        json_decref(x->done);
        x->done = json_incref(ev->msg);
        if (message_cost(ev) > DONE_MAX_COST) {
            /* The error is the kernel's word too: a traceback of megabytes is not kept. */
            over_limit(x, "its error and traceback passed %u MiB", DONE_MAX_COST >> 20);
            json_object_del(x->done, "error");
        }
        break;
    case KEV_LIMIT:
        over_limit(x, "%.*s", (int)ev->len, ev->data);
        break;
    case KEV_SYNC:
        if (x->k) {
            drain_pipes(x->k, x);
            kernel_answer_sync(x->k);
        }
        break;
    case KEV_HELLO:
    case KEV_REPLY:
        break;
    }
}

/* The part of each stream that was not streamed live: marker and tail, once at the end. */
static void emit_rest(struct exec_ctx *x)
{
    for (int stream = 1; stream <= 2; stream++) {
        size_t n;
        char *rest = outcap_render_rest(stream == 1 ? &x->rec->out : &x->rec->err, &n);
        if (n)
            emit(x, stream == 1 ? EV_STDOUT : EV_STDERR, rest, n, NULL);
        free(rest);
    }
}

/* Reads each pipe that holds something until it is empty (at most 1024 chunks: a child that
 * keeps writing cannot hold the cell's end). One poll asks both first: most cells leave
 * nothing there, and a read of each would be two system calls that find nothing. */
static void drain_pipes(struct kernel *k, struct exec_ctx *x)
{
    struct pollfd pfd[2] = {{.fd = kernel_fd(k, KERNEL_FD_STDOUT), .events = POLLIN},
                            {.fd = kernel_fd(k, KERNEL_FD_STDERR), .events = POLLIN}};
    int n = poll(pfd, 2, 0);
    for (int stream = 1; n != 0 && stream <= 2; stream++)
        if (n < 0 || pfd[stream - 1].revents)
            for (int i = 0; i < 1024 && kernel_pump_pipe(k, stream, on_kernel_event, x) == 0; i++)
                ;
}

/* Runs the poll loop until the kernel says done, dies, or must be killed. Returns true when
 * the kernel is still alive and consistent. */
static bool pump_until_done(struct session *s, struct kernel *k, struct exec_ctx *x,
                            const struct exec_request *req, enum stop *ret_stop)
{
    double start = now_ms_f();
    uint64_t timeout_ms = req->timeout_ms ? req->timeout_ms : s->opts.timeout_ms;
    double deadline = start + (double)timeout_ms, kill_at = 0;
    bool has_cancel = req->cancel_fd > 0 || (req->cancel_fd == 0 && req->cancel_events);
    short cancel_events = req->cancel_events ? req->cancel_events : POLLIN;
    bool out_open = true, err_open = true;
    enum stop stop = STOP_NONE;
    while (!x->done) {
        double now = now_ms_f();
        if (!stop && now >= deadline) {
            stop = STOP_TIMEOUT;
            kernel_interrupt(k);
            kill_at = now + (double)s->opts.interrupt_grace_ms;
        }
        if (stop && now >= kill_at)
            break; /* it did not stop: the kernel goes */
        double until = stop ? kill_at : deadline;
        struct pollfd pfd[5] = {
            {.fd = kernel_fd(k, KERNEL_FD_CHANNEL), .events = POLLIN},
            {.fd = out_open ? kernel_fd(k, KERNEL_FD_STDOUT) : -1, .events = POLLIN},
            {.fd = err_open ? kernel_fd(k, KERNEL_FD_STDERR) : -1, .events = POLLIN},
            {.fd = kernel_fd(k, KERNEL_FD_STATUS), .events = POLLIN},
            {.fd = stop || !has_cancel ? -1 : req->cancel_fd, .events = cancel_events}};
        int n = poll(pfd, 5, (int)(until - now) + 1);
        if (n < 0 && errno != EINTR)
            break;
        if (n <= 0)
            continue;
        /* Pipes first: what a child process wrote before the kernel's next frame is
         * already in the pipe when that frame arrives. */
        if (pfd[1].revents)
            out_open = kernel_pump_pipe(k, 1, on_kernel_event, x) != 1;
        if (pfd[2].revents)
            err_open = kernel_pump_pipe(k, 2, on_kernel_event, x) != 1;
        if (pfd[0].revents) {
            int r = kernel_pump_channel(k, on_kernel_event, x);
            if (r < 0) {
                x->violation = xstrdup(err_msg());
                log_warn("msg=\"kernel protocol violation; killing it\" error=%s",
                         log_quote(x->violation));
                stop = STOP_PROTOCOL;
            }
            if (r != 0)
                break;
            if (x->limit && !stop) {
                /* Past a cap, nothing more of this cell is worth reading: it stops as
                 * after a timeout (interrupt first, then the kill). */
                stop = STOP_LIMIT;
                kernel_interrupt(k);
                kill_at = now_ms_f() + (double)s->opts.interrupt_grace_ms;
            }
        }
        if (pfd[3].revents && sandbox_poll_status(kernel_sandbox(k)) == 1)
            break;
        if (pfd[4].revents && !stop) {
            stop = STOP_CANCEL;
            kernel_interrupt(k);
            kill_at = now_ms_f() + (double)s->opts.interrupt_grace_ms;
        }
    }
    *ret_stop = stop;
    if (stop == STOP_PROTOCOL)
        return false; /* even after its done: what follows it in the channel is garbage */
    if (x->done)
        drain_pipes(k, x);
    return x->done != NULL;
}

/* Sends what is left of an execution's events (its error last) and frees what reading the
 * channel left in x. */
static void finish_ctx(struct exec_ctx *x)
{
    emit_rest(x);
    if (x->rec->error)
        emit(x, EV_ERROR, NULL, 0, x->rec->error);
    json_decref(x->done);
    free(x->violation);
    free(x->limit);
}

static void record_done(struct exec_record *rec, json_t *done, enum stop stop, const char *limit)
{
    const char *status = json_string_value(json_object_get(done, "status"));
    json_t *error = clean_error(json_object_get(done, "error"));
    json_t *code = json_object_get(done, "exit_code");
    json_int_t count = json_integer_value(json_object_get(done, "execution_count"));
    /* A count the kernel made up (0 when absent) leaves the session's own: run_cell. */
    rec->execution_count = count > 0 && count < LONG_MAX ? (long)count : 0;
    rec->state = STATE_KEPT;
    if (error) {
        rec->error = error;
        rec->status = EXEC_ERROR;
    } else {
        rec->status = status && !strcmp(status, "ok") ? EXEC_OK : EXEC_ERROR;
    }
    /* An exit status is what a process can have: 0 to 255 (a signal is not one). */
    if (json_is_integer(code) && json_integer_value(code) >= 0 && json_integer_value(code) <= 255) {
        rec->has_exit_code = true;
        rec->exit_code = (int)json_integer_value(code);
    }
    if (stop == STOP_TIMEOUT && rec->status == EXEC_ERROR) {
        rec->status = EXEC_TIMEOUT;
        rec->message = xstrdup("timed out: the cell was interrupted (KeyboardInterrupt); "
                               "variables are kept");
    } else if (stop == STOP_CANCEL && rec->status == EXEC_ERROR) {
        rec->message = xstrdup("interrupted");
    }
    if (limit) {
        /* Also when the cell ended on its own before the interrupt landed. */
        rec->status = EXEC_OUTPUT_LIMIT;
        free(rec->message);
        rec->message = xasprintf("output limit: the cell was stopped because %s; what "
                                 "came before is kept, and so are the variables",
                                 limit);
    }
}

static bool crash_signal(int sig)
{
    return sig == SIGSEGV || sig == SIGBUS || sig == SIGILL || sig == SIGFPE || sig == SIGABRT ||
           sig == SIGSYS;
}

/* The kernel is gone or must go: say why, then bring a fresh one up on the same files. */
static void record_lost(struct session *s, struct kernel *k, struct exec_record *rec,
                        enum stop stop, const struct exec_ctx *x, const struct sandbox_usage *u)
{
    struct sandbox_outcome end;
    sandbox_outcome(kernel_sandbox(k), &end);
    const char *violation = x->violation;
    rec->state = STATE_LOST;
    if (x->limit) {
        /* The cap came first; what the kernel did after it (no stop within the grace, a
         * frame cut by the interrupt) is the consequence. */
        _cleanup_free_ char *then =
            stop == STOP_PROTOCOL
                ? xasprintf("then broke runcell's protocol (%s)", violation ? violation : "?")
                : xasprintf("did not stop within %.3g s of the interrupt",
                            (double)s->opts.interrupt_grace_ms / 1000.0);
        rec->status = EXEC_OUTPUT_LIMIT;
        rec->signal = SIGKILL;
        rec->message = xasprintf("output limit: the cell was stopped because %s, and it %s; "
                                 "the interpreter was restarted and its variables are lost "
                                 "(files are kept)",
                                 x->limit, then);
    } else if (stop == STOP_TIMEOUT) {
        rec->status = EXEC_TIMEOUT;
        rec->message = xasprintf("timed out, and the code did not stop within %.3g s of the "
                                 "interrupt; the interpreter was restarted and its variables "
                                 "are lost (files are kept)",
                                 (double)s->opts.interrupt_grace_ms / 1000.0);
    } else if (stop == STOP_PROTOCOL) {
        rec->status = EXEC_CRASHED;
        rec->signal = SIGKILL;
        rec->message = xasprintf("the interpreter broke runcell's protocol (%s), so it was "
                                 "killed and restarted; variables are lost (files are kept)",
                                 violation ? violation : "unknown");
    } else if (stop == STOP_CANCEL) {
        rec->status = EXEC_KILLED;
        rec->signal = SIGKILL;
        rec->message = xstrdup("interrupted, and the code did not stop; the interpreter was "
                               "restarted and its variables are lost (files are kept)");
    } else if (s->killed) {
        rec->status = EXEC_KILLED;
        rec->signal = SIGKILL;
        rec->message = xasprintf("killed: runcell is stopping, and the code did not stop within "
                                 "%.3g s of the interrupt; variables are lost (files are kept)",
                                 (double)s->opts.interrupt_grace_ms / 1000.0);
    } else if (u->oom_killed) {
        rec->status = EXEC_OOM;
        rec->signal = SIGKILL;
        rec->message = xasprintf("out of memory (limit %llu MB): the interpreter was killed and "
                                 "restarted; variables are lost (files are kept)",
                                 (unsigned long long)s->opts.limits.memory_mb);
    } else if (end.exited && end.signal) {
        rec->status = crash_signal(end.signal) ? EXEC_CRASHED : EXEC_KILLED;
        rec->signal = end.signal;
        rec->message = xasprintf("the interpreter died of signal %d (%s) and was restarted; "
                                 "variables are lost (files are kept)",
                                 end.signal, strsignal(end.signal));
    } else {
        rec->status = EXEC_CRASHED;
        if (end.exited) {
            rec->has_exit_code = true;
            rec->exit_code = end.exit_code;
        }
        rec->message = xasprintf("the interpreter exited (status %d) and was restarted; "
                                 "variables are lost (files are kept)",
                                 end.exited ? end.exit_code : -1);
    }
}

/* Fills the record's file lists; *after is the workspace now (released by the caller). */
static int collect_files(struct session *s, struct exec_record *rec,
                         const struct ws_listing *before, struct ws_listing *after)
{
    int r = workspace_scan(s->ws, after);
    if (r < 0)
        return r;
    ws_listing_diff(before, after, &rec->created, &rec->modified, &rec->deleted);
    rec->files_truncated = before->truncated || after->truncated;
    return 0;
}

/* A session's own work in the daemon (reading its kernel's frames, scanning and saving its
 * workspace) runs at a lower priority than the rest of the daemon (nice is per thread on
 * Linux), so that on a busy machine the sessions that cost it most cannot starve
 * /healthz, the other sessions' requests or the reaper of the CPU. Giving the priority
 * back needs CAP_SYS_NICE: without it, a thread once lowered stays lower. */
#define SESSION_WORK_NICE 5

/* The daemon's priority, read once by the first lowering (before it: a thread started by a
 * lowered thread is born lowered, so no thread's own nice will do); the thread's id, and
 * whether it is lowered now. */
static pthread_once_t work_base_once = PTHREAD_ONCE_INIT;
static int work_base = INT_MIN;
static __thread pid_t work_tid;
static __thread bool work_lowered;

static void read_work_base(void)
{
    errno = 0;
    int base = getpriority(PRIO_PROCESS, (id_t)getpid());
    if (!errno)
        work_base = base;
}

static void work_priority_lower(void)
{
    pthread_once(&work_base_once, read_work_base);
    if (work_lowered || work_base == INT_MIN)
        return;
    if (!work_tid)
        work_tid = gettid();
    if (setpriority(PRIO_PROCESS, (id_t)work_tid,
                    work_base + SESSION_WORK_NICE > 19 ? 19 : work_base + SESSION_WORK_NICE) == 0)
        work_lowered = true;
}

void session_work_priority_reset(void)
{
    if (work_lowered && setpriority(PRIO_PROCESS, (id_t)work_tid, work_base) == 0)
        work_lowered = false;
}

/* Takes s's event ev (its lock held): 0, or the -errno that refuses it. */
static int transition_locked(struct session *s, enum session_event ev)
{
    int next = session_state_next(s->state, ev);
    if (next < 0)
        return next;
    s->state = (enum session_state)next;
    return 0;
}

/* Marks s busy, waiting up to wait_ms for a running execution to end (0: not at all). */
static int begin_within(struct session *s, uint64_t wait_ms)
{
    struct timespec until;
    realtime_after_ms(&until, wait_ms);
    pthread_mutex_lock(&s->lock);
    while (wait_ms && session_state_next(s->state, SESSION_EV_BEGIN) == -EBUSY &&
           pthread_cond_timedwait(&s->idle, &s->lock, &until) == 0)
        ;
    int r = transition_locked(s, SESSION_EV_BEGIN);
    if (r == 0)
        s->cell_sent = false;
    pthread_mutex_unlock(&s->lock);
    if (r == -EBUSY)
        err_set(EBUSY, "the session is busy running another execution; wait for it or "
                       "interrupt it");
    else if (r)
        err_set(ESHUTDOWN, "the session is closed");
    return r;
}

static int begin(struct session *s)
{
    return begin_within(s, 0);
}

/* A paused session comes back before what begins in it (the session is busy, its lock not
 * held). What a resume could not bring back is said by the next record; a session that
 * could not come back at all stays paused, and this is -errno with err_msg(): what was to
 * begin does not (the next request tries again). */
static int resume_if_paused(struct session *s)
{
    if (s->paused == PAUSE_NONE || !s->pause_ops)
        return 0;
    int r = s->pause_ops->resume(s);
    if (r < 0 && s->paused != PAUSE_NONE)
        return r;
    if (r < 0) {
        free(s->resume_error);
        s->resume_error = xstrdup(err_msg());
    }
    return 0;
}

enum session_pause session_pause_state(struct session *s)
{
    return s->paused;
}

/* Sessions hibernated in this process, for /healthz without a walk of the table. */
static atomic_size_t hibernated_count;

size_t session_hibernated_count(void)
{
    return atomic_load(&hibernated_count);
}

void session_set_pause(struct session *s, enum session_pause how,
                       const struct session_pause_ops *ops)
{
    if (s->paused == PAUSE_HIBERNATED && how != PAUSE_HIBERNATED)
        atomic_fetch_sub(&hibernated_count, 1);
    else if (s->paused != PAUSE_HIBERNATED && how == PAUSE_HIBERNATED)
        atomic_fetch_add(&hibernated_count, 1);
    s->paused = how;
    s->pause_ops = ops;
}

void session_stop_kernels(struct session *s)
{
    stop_kernel(s);
}

int session_start_own_kernel(struct session *s)
{
    return s->k ? 0 : start_kernel(s);
}

int session_kernel_sandboxes(struct session *s, struct sandbox *ret[2])
{
    int n = 0;
    pthread_mutex_lock(&s->lock);
    if (s->k)
        ret[n++] = kernel_sandbox(s->k);
    if (s->other)
        ret[n++] = kernel_sandbox(s->other);
    pthread_mutex_unlock(&s->lock);
    return n;
}

static void end(struct session *s)
{
    pthread_mutex_lock(&s->lock);
    (void)transition_locked(s, SESSION_EV_END);
    s->cell_sent = false;
    s->running_turn = NULL;
    s->last_used_ms = now_ms();
    pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->lock);
}

/* k: the kernel the cell went to (the session's, or the other one). */
static void send_owed_interrupt(struct session *s, struct kernel *k)
{
    pthread_mutex_lock(&s->lock);
    s->cell_sent = true;
    if (s->state == SESSION_INTERRUPTING)
        kernel_interrupt(k);
    pthread_mutex_unlock(&s->lock);
}

static void run_cell(struct session *s, struct kernel *k, const struct exec_request *req,
                     const struct exec_sink *sink, struct exec_record *rec,
                     struct ws_listing *after, int *ret_scan_err)
{
    struct exec_ctx x = {.k = k, .rec = rec, .sink = sink, .net = &s->net};
    struct ws_listing before;
    struct sandbox_usage u1 = {0};
    enum stop stop = STOP_NONE;
    double t0 = now_ms_f();
    uint64_t seq0 = event_log_seq(&s->events);

    workspace_scan(s->ws, &before);
    double cpu0 = sandbox_cpu_ms(kernel_sandbox(k));
    sandbox_reset_peak(kernel_sandbox(k));
    int sent = kernel_send_execute(k, req->code, req->lang ? lang_name(req->lang) : s->lang,
                                   s->execution_count + 1,
                                   req->timeout_ms ? req->timeout_ms : s->opts.timeout_ms);
    if (sent == 0)
        send_owed_interrupt(s, k);
    if (sent < 0) {
        rec->status = EXEC_CRASHED;
        rec->message = xstrdup(err_msg());
    } else if (pump_until_done(s, k, &x, req, &stop)) {
        record_done(rec, x.done, stop, x.limit);
    } else {
        /* A kernel that died by itself leaves init to report how; one that must go is
         * killed at once. */
        if (stop != STOP_NONE || !sandbox_wait_for(kernel_sandbox(k), 2000)) {
            sandbox_kill(kernel_sandbox(k));
            sandbox_wait(kernel_sandbox(k));
        }
        sandbox_usage(kernel_sandbox(k), &u1);
        record_lost(s, k, rec, stop, &x, &u1);
    }
    if (rec->state != STATE_LOST)
        sandbox_usage_alive(kernel_sandbox(k), &u1);
    rec->wall_ms = now_ms_f() - t0;
    rec->cpu_ms = u1.cpu_ms - cpu0;
    rec->memory_peak_kb = u1.memory_peak_kb;
    rec->memory_peak_scope = u1.memory_peak_scope;
    rec->limits_degraded = sandbox_limits_degraded(kernel_sandbox(k));
    finish_ctx(&x);
    *ret_scan_err = collect_files(s, rec, &before, after);
    ws_listing_release(&before);
    if (!rec->execution_count)
        rec->execution_count = s->execution_count + 1;
    s->execution_count = rec->execution_count;
    json_t *net = event_log_since(&s->events, seq0, "network");
    if (json_array_size(net))
        rec->network = net;
    else
        json_decref(net);
}

int session_record_from_channel(struct kernel *k, const struct exec_sink *sink,
                                struct exec_record *rec)
{
    struct exec_ctx x = {.rec = rec, .sink = sink};
    int r = 0;
    while (!x.done && (r = kernel_pump_channel(k, on_kernel_event, &x)) == 0)
        ;
    if (x.done && r >= 0)
        record_done(rec, x.done, STOP_NONE, x.limit);
    finish_ctx(&x);
    return r;
}

/* ---- the queue: one execution at a time, in the order they came ---- */

void session_set_gate(struct session *s, struct exec_gate *g)
{
    s->gate = g;
}

struct exec_registry *session_registry(struct session *s)
{
    return &s->execs;
}

int session_enqueue(struct session *s, struct exec_turn *t)
{
    int r = 0;
    t->next = NULL;
    t->queued = t->waiting = false;
    pthread_mutex_lock(&s->lock);
    if (s->state == SESSION_CLOSED || s->closing)
        r = err_set(ESHUTDOWN, "the session is closed");
    else if (s->queued >= SESSION_QUEUE_MAX)
        r = err_set(EAGAIN,
                    "the session has its maximum of %d executions waiting; wait for them, "
                    "or interrupt the running one",
                    SESSION_QUEUE_MAX);
    else if ((r = exec_gate_wait_begin(s->gate)) == 0) {
        t->waiting = s->gate != NULL;
        t->queued = true;
        if (s->queue_tail)
            s->queue_tail->next = t;
        else
            s->queue_head = t;
        s->queue_tail = t;
        s->queued++;
    }
    pthread_mutex_unlock(&s->lock);
    return r;
}

/* Takes t out of s's queue (its lock held) and lets the next one look. */
static void dequeue_locked(struct session *s, struct exec_turn *t)
{
    if (!t->queued)
        return;
    struct exec_turn *prev = NULL;
    for (struct exec_turn *q = s->queue_head; q; prev = q, q = q->next) {
        if (q != t)
            continue;
        if (prev)
            prev->next = t->next;
        else
            s->queue_head = t->next;
        if (s->queue_tail == t)
            s->queue_tail = prev;
        break;
    }
    t->queued = false;
    s->queued--;
    if (t->waiting) {
        exec_gate_wait_end(s->gate);
        t->waiting = false;
    }
    pthread_cond_broadcast(&s->idle);
}

/* Whether fd is ready for events (poll, not waiting): a client gone before its turn. */
static bool cancel_ready(const struct exec_request *req)
{
    bool has = req->cancel_fd > 0 || (req->cancel_fd == 0 && req->cancel_events);
    if (!has)
        return false;
    struct pollfd p = {.fd = req->cancel_fd,
                       .events = req->cancel_events ? req->cancel_events : POLLIN};
    return poll(&p, 1, 0) > 0 && p.revents;
}

/* Waits until t heads the queue, the session is free and the gate has room, then marks the
 * session busy (t leaves the queue). 0 with *ret_gated (a gate place to give back), or
 * -ECANCELED, -ESHUTDOWN. */
static int wait_turn(struct session *s, struct exec_turn *t, const struct exec_request *req,
                     bool *ret_gated)
{
    int r;
    *ret_gated = false;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        if (t->cancelled) {
            r = t->aborted ? -ECONNABORTED : -ECANCELED;
            break;
        }
        if (s->state == SESSION_CLOSED || s->closing) {
            r = -ESHUTDOWN;
            break;
        }
        bool free_now = session_state_next(s->state, SESSION_EV_BEGIN) >= 0;
        if (s->queue_head == t && free_now) {
            if (cancel_ready(req)) {
                r = -ECANCELED;
                break;
            }
            if (!*ret_gated && !exec_gate_try_enter(s->gate)) {
                /* Every running place is taken: wait for one without holding the session
                 * (its interrupt, restart and others must go on), then look again. */
                pthread_mutex_unlock(&s->lock);
                *ret_gated = exec_gate_enter(s->gate, &t->cancelled);
                pthread_mutex_lock(&s->lock);
                continue;
            }
            *ret_gated = true;
            (void)transition_locked(s, SESSION_EV_BEGIN);
            s->cell_sent = false;
            s->running_turn = t;
            r = 0;
            break;
        }
        pthread_cond_wait(&s->idle, &s->lock);
    }
    dequeue_locked(s, t);
    pthread_mutex_unlock(&s->lock);
    if (r < 0 && *ret_gated) {
        exec_gate_leave(s->gate);
        *ret_gated = false;
    }
    if (r == 0 && t->on_start)
        t->on_start(t);
    if (r == -ECANCELED)
        err_set(ECANCELED, "cancelled before it ran");
    else if (r == -ECONNABORTED)
        err_set(ECONNABORTED, "not run: a cell before it failed (stop_on_error)");
    else if (r == -ESHUTDOWN)
        err_set(ESHUTDOWN, "the session is closed");
    return r;
}

void session_turn_cancel(struct session *s, struct exec_turn *t)
{
    t->cancelled = true;
    pthread_mutex_lock(&s->lock);
    pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->lock);
    exec_gate_wake(s->gate);
}

/* What waits in s's queue now ends unrun, as aborted (the session still busy: nothing could
 * begin between the failure and this). */
static void abort_queued(struct session *s)
{
    pthread_mutex_lock(&s->lock);
    for (struct exec_turn *t = s->queue_head; t; t = t->next) {
        t->aborted = true;
        t->cancelled = true;
    }
    pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->lock);
    exec_gate_wake(s->gate);
}

void session_cancel_queued(struct session *s)
{
    pthread_mutex_lock(&s->lock);
    s->closing = true;
    pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->lock);
    exec_gate_wake(s->gate);
}

/* The interrupt of session_interrupt (its lock held). */
static void interrupt_locked(struct session *s)
{
    bool busy = session_state_busy(s->state);
    (void)transition_locked(s, SESSION_EV_INTERRUPT);
    /* The idle one of two kernels drops the interrupt (it runs no cell). Before the cell's
     * request is out, the state owes it (send_owed_interrupt). */
    if (busy && s->cell_sent) {
        if (s->k)
            kernel_interrupt(s->k);
        if (s->other)
            kernel_interrupt(s->other);
    }
}

void session_turn_stop(struct session *s, struct exec_turn *t)
{
    pthread_mutex_lock(&s->lock);
    if (t->queued)
        t->cancelled = true;
    else if (s->running_turn == t)
        interrupt_locked(s);
    pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->lock);
    exec_gate_wake(s->gate);
}

size_t session_queued(struct session *s)
{
    pthread_mutex_lock(&s->lock);
    size_t n = s->queued;
    pthread_mutex_unlock(&s->lock);
    return n;
}

bool session_active(struct session *s)
{
    pthread_mutex_lock(&s->lock);
    bool v = s->queued || session_state_busy(s->state);
    pthread_mutex_unlock(&s->lock);
    return v;
}

static int check_request(const struct exec_request *req)
{
    if (!req->code)
        return err_set(EINVAL, "no code to execute");
    if (req->lang && !lang_supported(req->lang))
        return err_set(EINVAL, "unknown language '%s': use python, bash or javascript", req->lang);
    return 0;
}

/* The history of files a session with no store keeps for its undo, when the workspace has no
 * size cap: as if it had 1 GiB (twice that kept at most). */
#define FILES_HISTORY_NO_DISK_MB 1024

static const struct files_history_ops *files_history_ops; /* session_enable_files_history */

/* Whether s keeps a local history of its files for undo: a Python session with a history
 * whose files go to no store (a store's history serves the others). */
static bool wants_files_history(struct session *s)
{
    return files_history_ops && s->opts.history && !lang_is_javascript(s->lang) &&
           !(s->persist && s->persist_ops->stores_files(s->persist));
}

void session_enable_files_history(const struct files_history_ops *ops)
{
    files_history_ops = ops;
}

void session_files_changed(struct session *s)
{
    if (s->files_history && wants_files_history(s))
        files_history_ops->save(s->files_history, s->ws, NULL, 0, s->opts.history);
}

int session_execute(struct session *s, const struct exec_request *req, const struct exec_sink *sink,
                    struct exec_record *rec)
{
    struct exec_turn t = {0};
    int r = check_request(req);
    if (r < 0 || (r = session_enqueue(s, &t)) < 0)
        return r;
    return session_execute_turn(s, &t, req, sink, rec);
}

int session_execute_turn(struct session *s, struct exec_turn *t, const struct exec_request *req,
                         const struct exec_sink *sink, struct exec_record *rec)
{
    bool gated;
    int r = check_request(req);
    if (r < 0) {
        session_turn_cancel(s, t);
        (void)wait_turn(s, t, req, &gated);
        return err_set(-r, "%s", err_msg());
    }
    /* The Python kernel runs python and bash cells, the Node kernel JavaScript ones; a cell
     * in the language of neither the session's kernel nor its other one starts that. */
    const char *lang = req->lang ? lang_name(req->lang) : s->lang;
    if ((r = wait_turn(s, t, req, &gated)) < 0)
        return r;
    if (resume_if_paused(s) < 0) {
        rec->status = EXEC_SANDBOX_ERROR;
        rec->state = STATE_KEPT;
        rec->message = xstrdup(err_msg());
        end(s);
        if (gated)
            exec_gate_leave(s->gate);
        return 0;
    }
    if (s->resume_error) {
        rec->message = s->resume_error; /* said once, by the first record after the resume */
        s->resume_error = NULL;
    }
    if (!*kernel_slot(s, lang) && start_kernel_for(s, lang) < 0) {
        rec->status = EXEC_SANDBOX_ERROR;
        rec->state = STATE_LOST;
        rec->message = xasprintf("cannot start the interpreter: %s", err_msg());
        end(s);
        if (gated)
            exec_gate_leave(s->gate);
        return 0;
    }
    if (wants_files_history(s) && !s->files_history) {
        /* The state before the first cell, for its undo: what was put there before it. */
        uint64_t disk = s->opts.limits.disk_mb ? s->opts.limits.disk_mb : FILES_HISTORY_NO_DISK_MB;
        if ((s->files_history = files_history_ops->open(s->ws, 2 * (disk << 20))))
            files_history_ops->save(s->files_history, s->ws, NULL, 0, s->opts.history);
    }
    struct ws_listing after = {0};
    int scan_err = 0;
    /* The thread stays lowered after the execution: on an HTTP connection the next request
     * is most often another one, and the server gives the priority back before any other
     * (session_work_priority_reset), which saves two system calls per execution. */
    work_priority_lower();
    run_cell(s, *kernel_slot(s, lang), req, sink, rec, &after, &scan_err);
    sandbox_net_scrub_record(&s->net, rec);
    if (rec->state == STATE_LOST) {
        /* Only the kernel that was lost is replaced; the other keeps its variables. */
        stop_kernel_for(s, lang);
        if (start_kernel_for(s, lang) < 0)
            log_warn("msg=\"cannot restart the kernel\" error=%s", log_quote(err_msg()));
    }
    if (s->persist && scan_err < 0)
        rec->persist_error = xasprintf("files not saved: %s", err_msg());
    else if (s->persist)
        s->persist_ops->after_execute(s->persist, s->ws, &after, rec);
    if (s->files_history && wants_files_history(s) && scan_err == 0)
        files_history_ops->save(s->files_history, s->ws, &after, rec->execution_count,
                                s->opts.history);
    ws_listing_release(&after);
    if (t->stop_on_error && rec->status != EXEC_OK)
        abort_queued(s);
    end(s);
    if (gated)
        exec_gate_leave(s->gate);
    return 0;
}

int session_interrupt(struct session *s)
{
    pthread_mutex_lock(&s->lock);
    interrupt_locked(s);
    pthread_mutex_unlock(&s->lock);
    return 0;
}

void session_interrupt_first_cell(struct session *s)
{
    pthread_mutex_lock(&s->lock);
    bool busy = session_state_busy(s->state);
    (void)transition_locked(s, SESSION_EV_INTERRUPT_NEXT);
    if (busy && s->cell_sent && s->k)
        kernel_interrupt(s->k);
    pthread_mutex_unlock(&s->lock);
}

/* ---- undo ---- */

struct undo_ctx {
    long before;
    json_t *report;
};

static int do_undo(struct session *s, void *arg)
{
    struct undo_ctx *u = arg;
    long count = 0;
    json_t *kept = NULL;
    if (!s->k)
        return err_set(ENOENT, "the interpreter was lost with its history; nothing to undo");
    if (u->before <= 0)
        u->before = s->execution_count;
    if (u->before <= 0)
        return err_set(ENOENT, "no cell has run yet: nothing to undo");
    int r = kernel_undo(s->k, u->before, s->opts.timeout_ms, &count, &kept);
    if (r == -ENOENT)
        return r;
    if (r < 0) {
        /* The kernel broke off or lied: as after a kernel lost, a fresh one, files kept. */
        char *msg = xstrdup(err_msg());
        stop_kernel_for(s, s->lang);
        if (start_kernel_for(s, s->lang) < 0)
            log_warn("msg=\"cannot restart the kernel\" error=%s", log_quote(err_msg()));
        s->execution_count = 0;
        err_set(EIO,
                "the undo failed (%s); the interpreter was restarted and its variables are "
                "lost (files are kept)",
                msg);
        free(msg);
        return -EIO;
    }
    s->execution_count = count;
    u->report =
        json_pack("{s:I,s:I,s:s,s:s,s:o}", "before", (json_int_t)u->before, "execution_count",
                  (json_int_t)count, "variables", "restored", "shell", "restarted", "kept", kept);
    if (s->persist && s->persist_ops->undo_files && s->persist_ops->stores_files(s->persist))
        json_object_set_new(u->report, "files",
                            s->persist_ops->undo_files(s->persist, s->ws, u->before));
    else if (s->files_history)
        json_object_set_new(u->report, "files",
                            files_history_ops->undo(s->files_history, s->ws, u->before));
    else
        json_object_set_new(u->report, "files",
                            json_pack("{s:b,s:s}", "kept", 0, "why",
                                      "the session keeps no files in a store: its files are as "
                                      "the cells left them"));
    return 0;
}

int session_undo(struct session *s, long before, json_t **ret_report)
{
    if (lang_is_javascript(s->lang))
        return err_set(EINVAL, "a JavaScript session keeps no history: undo is for Python "
                               "sessions");
    if (!s->opts.history)
        return err_set(EINVAL,
                       "this session keeps no history: create it with history (the "
                       "number of cells it can undo, up to %d)",
                       SESSION_HISTORY_MAX);
    struct undo_ctx u = {.before = before};
    int r = session_run_exclusive(s, s->opts.timeout_ms, do_undo, &u);
    if (r < 0) {
        json_decref(u.report);
        return r;
    }
    *ret_report = u.report;
    return 0;
}

int session_restart(struct session *s)
{
    int r = begin(s);
    if (r < 0)
        return r;
    stop_kernel(s);
    s->execution_count = 0;
    r = start_kernel(s);
    end(s);
    return r;
}

struct workspace *session_workspace(struct session *s)
{
    return s->ws;
}

uint64_t session_created_ms(struct session *s)
{
    return s->created_ms;
}

uint64_t session_last_used_ms(struct session *s)
{
    pthread_mutex_lock(&s->lock);
    uint64_t v = s->last_used_ms;
    pthread_mutex_unlock(&s->lock);
    return v;
}

void session_idle_release(struct session *s, uint64_t idle_ms)
{
    pthread_mutex_lock(&s->lock);
    /* Idle, and so no execution reads the usage files: none can begin while this is held. */
    if ((s->state == SESSION_IDLE || s->state == SESSION_ARMED) &&
        ms_since(now_ms(), s->last_used_ms) >= idle_ms) {
        for (struct kernel *k = s->k, *next = s->other; k; k = next, next = NULL)
            sandbox_usage_idle(kernel_sandbox(k));
        if (s->ws)
            workspace_scan_idle(s->ws);
    }
    pthread_mutex_unlock(&s->lock);
}

bool session_busy(struct session *s)
{
    pthread_mutex_lock(&s->lock);
    bool v = session_state_busy(s->state);
    pthread_mutex_unlock(&s->lock);
    return v;
}

long session_execution_count(struct session *s)
{
    return s->execution_count;
}

const char *session_python_version(struct session *s)
{
    return s->python_version ? s->python_version : "";
}

const struct session_opts *session_options(struct session *s)
{
    return &s->opts;
}

void session_set_idle_timeout(struct session *s, uint64_t idle_ms)
{
    __atomic_store_n(&s->opts.idle_timeout_ms, idle_ms, __ATOMIC_RELAXED);
}

void session_set_hibernate_after(struct session *s, uint64_t after_ms)
{
    __atomic_store_n(&s->opts.hibernate_after_ms, after_ms, __ATOMIC_RELAXED);
}

json_t *session_packages(struct session *s)
{
    return s->packages_report;
}

struct sandbox_net *session_sandbox_net(struct session *s)
{
    return &s->net;
}

const struct net_policy *session_net_policy(struct session *s)
{
    return s->policy;
}

json_t *session_events(struct session *s, uint64_t after_seq)
{
    json_t *events = event_log_since(&s->events, after_seq, NULL);
    pthread_mutex_lock(&s->events.lock);
    json_t *j = json_pack("{s:o,s:I,s:I}", "events", events, "dropped",
                          (json_int_t)s->events.dropped, "last_seq", (json_int_t)s->events.seq);
    pthread_mutex_unlock(&s->events.lock);
    return j;
}

bool session_limits_degraded(struct session *s)
{
    pthread_mutex_lock(&s->lock);
    bool v =
        s->k ? sandbox_limits_degraded(kernel_sandbox(s->k)) : s->host->degraded_reason != NULL;
    pthread_mutex_unlock(&s->lock);
    return v;
}

void session_metrics(struct session *s, struct session_metrics *ret)
{
    memset(ret, 0, sizeof(*ret));
    ret->mem_total_bytes = s->opts.limits.memory_mb << 20;
    ret->cpus_milli = s->opts.limits.cpus_milli;
    pthread_mutex_lock(&s->lock); /* the kernels stay while it is held */
    struct kernel *ks[2] = {s->k, s->other};
    for (size_t i = 0; i < ARRAY_SIZE(ks); i++) {
        uint64_t used = 0, cache = 0;
        if (!ks[i])
            continue;
        ret->cpu_ms += sandbox_cpu_ms(kernel_sandbox(ks[i]));
        if (sandbox_memory_now(kernel_sandbox(ks[i]), &used, &cache) == 0) {
            ret->mem_used_bytes += used;
            ret->mem_cache_bytes += cache;
        }
    }
    pthread_mutex_unlock(&s->lock);
    (void)workspace_usage(s->ws, &ret->disk_used_bytes, &ret->disk_total_bytes);
}

void session_kill(struct session *s)
{
    pthread_mutex_lock(&s->lock);
    s->killed = true;
    if (s->k)
        sandbox_kill(kernel_sandbox(s->k));
    if (s->other)
        sandbox_kill(kernel_sandbox(s->other));
    pthread_mutex_unlock(&s->lock);
}

void session_network_changed(struct session *s)
{
    if (s->persist && s->persist_ops->network_changed)
        s->persist_ops->network_changed(s->persist, s);
}

struct persist *session_get_persist(struct session *s)
{
    return s->persist;
}

void session_set_persist(struct session *s, struct persist *p, const struct persist_ops *ops)
{
    s->persist = p;
    s->persist_ops = ops;
}

static int run_exclusive(struct session *s, uint64_t wait_ms,
                         int (*fn)(struct session *s, void *ctx), void *ctx, bool resume)
{
    int r = begin_within(s, wait_ms);
    if (r < 0)
        return r;
    bool lowered = work_lowered; /* by an execution before: then it stays so */
    work_priority_lower();
    if (!resume || (r = resume_if_paused(s)) == 0)
        r = fn(s, ctx);
    if (!lowered)
        session_work_priority_reset();
    end(s);
    return r;
}

int session_run_exclusive(struct session *s, uint64_t wait_ms,
                          int (*fn)(struct session *s, void *ctx), void *ctx)
{
    return run_exclusive(s, wait_ms, fn, ctx, true);
}

static int woken(struct session *s, void *ctx)
{
    (void)s, (void)ctx;
    return 0;
}

int session_wake(struct session *s)
{
    pthread_mutex_lock(&s->lock);
    bool paused = s->paused != PAUSE_NONE;
    pthread_mutex_unlock(&s->lock);
    return paused ? run_exclusive(s, s->opts.timeout_ms, woken, NULL, true) : 0;
}

int session_run_exclusive_raw(struct session *s, uint64_t wait_ms,
                              int (*fn)(struct session *s, void *ctx), void *ctx)
{
    return run_exclusive(s, wait_ms, fn, ctx, false);
}

int session_kernel_request(struct session *s, const char *type, const char *path,
                           json_t **ret_reply)
{
    if (!s->k && start_kernel(s) < 0)
        return -EIO;
    int r =
        kernel_request(s->k, type, path, s->opts.timeout_ms, s->opts.interrupt_grace_ms, ret_reply);
    if (r < 0) {
        /* A kernel that did not answer, or broke the protocol, is not trusted further. */
        char *msg = xstrdup(err_msg());
        stop_kernel(s);
        if (start_kernel(s) < 0)
            log_warn("msg=\"cannot restart the kernel\" error=%s", log_quote(err_msg()));
        err_set(-r, "%s", msg);
        free(msg);
    }
    return r;
}

struct connect_req {
    uint16_t port;
    int fd;
};

static int connect_in(struct sandbox *sb, void *ctx)
{
    struct connect_req *q = ctx;
    return sandbox_connect(sb, q->port, 5000, &q->fd);
}

int session_connect_port(struct session *s, uint16_t port, int *ret_fd)
{
    struct connect_req q = {.port = port, .fd = -1};
    int r = session_with_sandbox(s, connect_in, &q);
    if (r == 0)
        *ret_fd = q.fd;
    return r;
}

/* ---- what procs.c needs of a session ---- */

struct session_procs *session_procs_of(struct session *s, bool create)
{
    pthread_mutex_lock(&s->lock);
    if (!s->procs && create && s->state != SESSION_CLOSED)
        s->procs = session_procs_new(s);
    struct session_procs *p = s->procs;
    pthread_mutex_unlock(&s->lock);
    return p;
}

int session_with_sandbox(struct session *s, int (*fn)(struct sandbox *sb, void *ctx), void *ctx)
{
    pthread_mutex_lock(&s->lock);
    int r = s->state == SESSION_CLOSED ? err_set(ESHUTDOWN, "the session is closed")
            : !s->k ? err_set(ESRCH, "the session's sandbox is being restarted; try again")
                    : fn(kernel_sandbox(s->k), ctx);
    pthread_mutex_unlock(&s->lock);
    return r;
}

char **session_env(struct session *s)
{
    struct sandbox_spec spec = {0};
    const char *binds[8];
    char **env = sandbox_net_apply(&s->net, &spec, binds, ARRAY_SIZE(binds), NULL);
    _cleanup_free_ char *home = xasprintf("HOME=%s", s->opts.home_dir);
    for (char **e = env; *e; e++)
        if (!strncmp(*e, "HOME=", 5)) {
            free(*e);
            *e = xstrdup(home);
        }
    return env;
}

void session_free(struct session *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    (void)transition_locked(s, SESSION_EV_CLOSE);
    pthread_cond_broadcast(&s->idle);
    struct session_procs *procs = s->procs;
    s->procs = NULL;
    pthread_mutex_unlock(&s->lock);
    session_procs_free(procs); /* its thread reads the kernel's sandbox: it goes first */
    if (s->execs.release)
        s->execs.release(&s->execs);
    pthread_mutex_destroy(&s->execs.lock);
    pthread_mutex_destroy(&s->execs.keys_lock);
    if (s->paused != PAUSE_NONE && s->pause_ops && s->pause_ops->release)
        s->pause_ops->release(s); /* before its persist, whose store it uses */
    if (s->paused == PAUSE_HIBERNATED)
        atomic_fetch_sub(&hibernated_count, 1);
    if (s->persist)
        s->persist_ops->free(s->persist);
    if (s->files_history) /* before the workspace it lives beside */
        files_history_ops->free(s->files_history);
    stop_kernel(s);
    /* The proxy goes before the workspace its socket lives in. */
    sandbox_net_stop(&s->net);
    workspace_free(s->ws);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->idle);
    event_log_release(&s->events);
    json_decref(s->packages_report);
    net_policy_free(s->policy);
    strv_free(s->packages);
    strv_free(s->net_env);
    free(s->index_url);
    free(s->resume_error);
    free(s->python_version);
    strv_free(s->argv);
    free(s);
}
