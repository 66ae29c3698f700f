/* call.c - tool calls on threads of their own: progress notifications while they run,
 * cancellation, and the sessions of a connection (its default one, those it created). */
#include "mcp/mcp-int.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* How often a running call looks at its output for a progress notification. */
#define PROGRESS_TICK_MS     250
#define PROGRESS_MESSAGE_MAX 200

/* The lane of calls without session_id; no session id looks like it. */
#define DEFAULT_LANE "(default)"

static void call_free(struct call *k)
{
    free(k->lane);
    json_decref(k->id);
    json_decref(k->progress_token);
    json_decref(k->args);
    close(k->cancel[0]);
    close(k->cancel[1]);
    free(k->last_output);
    pthread_cond_destroy(&k->pwake);
    pthread_mutex_destroy(&k->plock);
    free(k);
}

/* ---- progress ---- */

static void send_progress(struct call *k, const char *message)
{
    double now = now_ms_f();
    /* The progress value is the elapsed time in seconds; it must grow with every
     * notification, even two within the same millisecond. */
    double progress = (double)(long long)(now - k->t0_ms) / 1000.0;
    if (progress <= k->last_progress && k->last_sent_ms > 0)
        progress = k->last_progress + 0.001;
    k->last_progress = progress;
    k->last_sent_ms = now;
    json_t *params =
        json_pack("{s:O,s:f}", "progressToken", k->progress_token, "progress", progress);
    if (message && (k->features & VF_PROGRESS_MESSAGE))
        json_object_set_new(params, "message", json_string(message));
    reply_notify(k->reply, rpc_notification("notifications/progress", params));
}

/* Sends a notification when there is new output, and a heartbeat each interval otherwise. */
static void progress_tick(struct call *k, uint64_t interval_ms)
{
    double now = now_ms_f();
    if (k->new_output) {
        k->new_output = false;
        send_progress(k, k->last_output);
    } else if (now - k->last_sent_ms >= (double)interval_ms) {
        _cleanup_free_ char *msg =
            xasprintf("%s: running for %.0f s", k->tool->name, (now - k->t0_ms) / 1000.0);
        send_progress(k, msg);
    }
}

static void *progress_main(void *arg)
{
    struct call *k = arg;
    uint64_t interval = k->c->cfg->progress_interval_ms ? k->c->cfg->progress_interval_ms : 1000;
    pthread_mutex_lock(&k->plock);
    _cleanup_free_ char *msg = xasprintf("%s: started", k->tool->name);
    send_progress(k, msg);
    while (!k->finished) {
        struct timespec ts;
        realtime_after_ms(&ts, PROGRESS_TICK_MS);
        pthread_cond_timedwait(&k->pwake, &k->plock, &ts);
        if (!k->finished)
            progress_tick(k, interval);
    }
    /* Output since the last tick still gets its notification, before the response. */
    if (k->new_output)
        send_progress(k, k->last_output);
    pthread_mutex_unlock(&k->plock);
    return NULL;
}

void call_output(struct call *k, const char *data, size_t len)
{
    if (!k->progress_token)
        return;
    /* The last non-empty line of the chunk says best what the cell is doing now. */
    while (len && (data[len - 1] == '\n' || data[len - 1] == '\r'))
        len--;
    const char *start = data + len;
    while (start > data && start[-1] != '\n')
        start--;
    size_t n = MIN((size_t)(data + len - start), (size_t)PROGRESS_MESSAGE_MAX);
    if (!n)
        return;
    size_t clean_len;
    char *clean = utf8_sanitize(start, n, &clean_len);
    pthread_mutex_lock(&k->plock);
    free(k->last_output);
    k->last_output = clean;
    k->new_output = true;
    pthread_mutex_unlock(&k->plock);
}

/* ---- the call's thread ---- */

/* True when a call that came before k on k's session has not finished. */
static bool earlier_in_lane(const struct mcp_conn *c, const struct call *k)
{
    for (const struct call *o = c->calls; o; o = o->next)
        if (o != k && o->lane && o->seq < k->seq && !strcmp(o->lane, k->lane))
            return true;
    return false;
}

/* Waits until the calls that came before on the same session have ended, so that a session
 * runs its calls in the order the client sent them, one at a time (a pipelining client
 * means them in that order, and a record lists only its own cell's files). False when the
 * call was cancelled while it waited. */
static bool wait_turn(struct call *k)
{
    struct mcp_conn *c = k->c;
    pthread_mutex_lock(&c->lock);
    while (k->lane && !atomic_load(&k->cancelled) && earlier_in_lane(c, k))
        pthread_cond_wait(&c->idle, &c->lock); /* broadcast when a call ends or is cancelled */
    pthread_mutex_unlock(&c->lock);
    return !atomic_load(&k->cancelled);
}

static void finish(struct call *k)
{
    struct mcp_conn *c = k->c;
    reply_unref(k->reply);
    pthread_mutex_lock(&c->lock);
    for (struct call **p = &c->calls; *p; p = &(*p)->next) {
        if (*p == k) {
            *p = k->next;
            break;
        }
    }
    call_free(k);
    c->n_calls--;
    c->last_active_ms = now_ms();
    pthread_cond_broadcast(&c->idle);
    pthread_mutex_unlock(&c->lock);
}

static void *call_main(void *arg)
{
    struct call *k = arg;
    pthread_t ticker;
    bool ticking = k->progress_token && !pthread_create(&ticker, NULL, progress_main, k);
    json_t *result = wait_turn(k) ? k->tool->run(k) : NULL;
    if (ticking) {
        pthread_mutex_lock(&k->plock);
        k->finished = true;
        pthread_cond_signal(&k->pwake);
        pthread_mutex_unlock(&k->plock);
        pthread_join(ticker, NULL); /* no progress may follow the response */
    }
    pthread_mutex_lock(&k->c->lock);
    char *ended = k->c->end_reason ? xstrdup(k->c->end_reason) : NULL;
    pthread_mutex_unlock(&k->c->lock);
    if (atomic_load(&k->cancelled) && ended) {
        json_decref(result); /* the session ended under the call: say so, or the client waits */
        _cleanup_free_ char *msg = xasprintf("%s: %s; the call was interrupted, start a new "
                                             "session to go on",
                                             k->tool->name, ended);
        reply_respond(k->reply, rpc_error(k->id, MCP_SESSION_ENDED, msg));
    } else if (atomic_load(&k->cancelled)) {
        json_decref(result); /* a cancelled request gets no response */
    } else {
        reply_respond(k->reply, rpc_result_for(k->c->cfg, k->features, k->id, result));
    }
    free(ended);
    finish(k);
    return NULL;
}

int call_start(struct mcp_conn *c, const struct call_params *p, struct reply *reply)
{
    const struct tool *tool = p->tool;
    struct call *k = xcalloc(1, sizeof(*k));
    k->c = c;
    k->tool = tool;
    k->id = json_deep_copy(p->id);
    k->args = json_deep_copy(p->args);
    k->progress_token = p->progress_token ? json_deep_copy(p->progress_token) : NULL;
    k->features = p->features;
    k->tasks = p->tasks;
    k->t0_ms = now_ms_f();
    pthread_mutex_init(&k->plock, NULL);
    pthread_cond_init(&k->pwake, NULL);
    if (pipe2(k->cancel, O_CLOEXEC | O_NONBLOCK) < 0) {
        k->cancel[0] = k->cancel[1] = -1;
        call_free(k);
        return err_set(errno, "cannot create a pipe for the call: %s", strerror(errno));
    }
    const char *sid = json_string_value(json_object_get(p->args, "session_id"));
    pthread_mutex_lock(&c->lock);
    /* The default session named by its id shares the default's lane. */
    if (!tool->no_session)
        k->lane = xstrdup(
            !sid || (c->default_known && !strcmp(sid, c->default_known)) ? DEFAULT_LANE : sid);
    k->seq = c->next_seq++;
    int r = 0;
    if (c->closing)
        r = err_set(ESHUTDOWN, "the connection is closing");
    else if (c->n_calls >= c->max_calls)
        r = err_set(EAGAIN,
                    "%zu tool calls are already running on this connection, the "
                    "most it takes; wait for one to finish",
                    c->n_calls);
    if (r < 0) {
        pthread_mutex_unlock(&c->lock);
        call_free(k);
        return r;
    }
    k->reply = reply;
    reply_ref(reply);
    /* The thread inherits the caller's signal mask, and the sandboxes it starts inherit
     * the thread's: blocking more here would reach user code. */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    int e = pthread_create(&t, &attr, call_main, k);
    pthread_attr_destroy(&attr);
    if (e) {
        pthread_mutex_unlock(&c->lock);
        reply_unref(reply);
        call_free(k);
        return err_set(e, "cannot start a thread for the call: %s", strerror(e));
    }
    k->next = c->calls;
    c->calls = k;
    c->n_calls++;
    pthread_mutex_unlock(&c->lock);
    return 0;
}

static void cancel_locked(struct call *k)
{
    if (!atomic_exchange(&k->cancelled, true))
        (void)!write(k->cancel[1], "x", 1);
    pthread_cond_broadcast(&k->c->idle); /* a call waiting for its turn stops waiting */
}

bool call_cancel(struct mcp_conn *c, json_t *id)
{
    bool found = false;
    pthread_mutex_lock(&c->lock);
    for (struct call *k = c->calls; k; k = k->next) {
        if (json_equal(k->id, id)) {
            cancel_locked(k);
            found = true;
        }
    }
    pthread_mutex_unlock(&c->lock);
    return found;
}

void mcp_conn_end(struct mcp_conn *c, const char *reason)
{
    pthread_mutex_lock(&c->lock);
    if (!c->end_reason)
        c->end_reason = xstrdup(reason);
    c->closing = true;
    pthread_mutex_unlock(&c->lock);
    mcp_conn_cancel_all(c);
}

void mcp_conn_cancel_sink(struct mcp_conn *c, void *sink_ctx)
{
    pthread_mutex_lock(&c->lock);
    for (struct call *k = c->calls; k; k = k->next)
        if (k->reply->sink.ctx == sink_ctx && !k->handed_over)
            cancel_locked(k);
    pthread_mutex_unlock(&c->lock);
}

void mcp_conn_cancel_all(struct mcp_conn *c)
{
    pthread_mutex_lock(&c->lock);
    for (struct call *k = c->calls; k; k = k->next)
        cancel_locked(k);
    pthread_mutex_unlock(&c->lock);
}

/* ---- sessions of a connection ---- */

int conn_create_session(struct mcp_conn *c, const char *lang, uint64_t timeout_ms, int history,
                        bool owned, char **ret_id)
{
    struct session_opts o = c->cfg->defaults;
    if (history >= 0)
        o.history = (unsigned)history;
    if (!o.output_cap)
        o.output_cap = MCP_DEFAULT_OUTPUT_CAP;
    if (lang)
        o.lang = lang;
    if (timeout_ms)
        o.timeout_ms = timeout_ms;
    char *id;
    int r = session_table_create(c->cfg->table, &o, &id);
    if (r < 0)
        return r;
    if (owned) {
        pthread_mutex_lock(&c->lock);
        c->owned = strv_push(c->owned, id);
        pthread_mutex_unlock(&c->lock);
    }
    *ret_id = id;
    return 0;
}

static void forget_owned(struct mcp_conn *c, const char *id)
{
    size_t n = strv_len(c->owned);
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(c->owned[i], id)) {
            free(c->owned[i]);
            memmove(&c->owned[i], &c->owned[i + 1], (n - i) * sizeof(char *));
            return;
        }
    }
}

static void set_default_known(struct mcp_conn *c, const char *id)
{
    pthread_mutex_lock(&c->lock);
    free(c->default_known);
    c->default_known = id ? xstrdup(id) : NULL;
    pthread_mutex_unlock(&c->lock);
}

int conn_close_session(struct mcp_conn *c, const char *id)
{
    int r = session_table_remove(c->cfg->table, id);
    pthread_mutex_lock(&c->default_lock);
    if (c->default_id && !strcmp(c->default_id, id)) {
        free(c->default_id); /* the next call without session_id makes a new one */
        c->default_id = NULL;
        set_default_known(c, NULL);
    }
    pthread_mutex_unlock(&c->default_lock);
    pthread_mutex_lock(&c->lock);
    forget_owned(c, id);
    pthread_mutex_unlock(&c->lock);
    return r;
}

static char *missing_message(const char *id, int err, unsigned features)
{
    const char *what = err == -ETIME ? "expired after being idle longer than its idle timeout"
                                     : "is not there (closed, expired, or never made)";
    if (features & VF_MODERN)
        return xasprintf("session %s %s: its variables and files are gone; create a new one "
                         "with create_session and pass the session_id it returns",
                         id, what);
    if (err == -ETIME)
        return xasprintf("session %s expired after being idle longer than its idle timeout; "
                         "create a new one with create_session, or leave session_id out to "
                         "use the default session",
                         id);
    return xasprintf("no session %s; create one with create_session, or leave session_id out "
                     "to use the default session",
                     id);
}

/* The default session, created on first use or when the last one went away. */
static struct session *default_session(struct call *k, char **ret_id, char **ret_note,
                                       char **ret_err)
{
    struct mcp_conn *c = k->c;
    struct session *s = NULL;
    int err = 0;
    pthread_mutex_lock(&c->default_lock);
    if (c->default_id) {
        s = session_table_acquire(c->cfg->table, c->default_id, &err);
        if (!s)
            *ret_note =
                xasprintf("the default session %s %s, so this call runs in a new one: "
                          "variables and files from before are gone",
                          c->default_id, err == -ETIME ? "expired for being idle" : "was closed");
    }
    if (!s) {
        char *id;
        int r = conn_create_session(c, NULL, 0, -1, true, &id);
        if (r < 0) {
            *ret_err = xasprintf("cannot create a session: %s", err_msg());
        } else {
            free(c->default_id);
            c->default_id = id;
            set_default_known(c, id);
            s = session_table_acquire(c->cfg->table, id, &err);
            if (!s)
                *ret_err = xasprintf("the new session %s was closed as it was created", id);
        }
    }
    if (s)
        *ret_id = xstrdup(c->default_id);
    pthread_mutex_unlock(&c->default_lock);
    return s;
}

struct session *call_session(struct call *k, char **ret_id, char **ret_note, char **ret_err)
{
    const char *id = json_string_value(json_object_get(k->args, "session_id"));
    *ret_note = *ret_err = *ret_id = NULL;
    if (!id && (k->features & VF_MODERN)) {
        /* checked with the arguments; a connection is no conversation on this era */
        *ret_err = xstrdup("session_id is required: create a session with create_session and "
                           "pass the session_id it returns");
        return NULL;
    }
    if (!id)
        return default_session(k, ret_id, ret_note, ret_err);
    int err = -ENOENT;
    struct session *s = session_table_acquire(k->c->cfg->table, id, &err);
    if (!s) {
        *ret_err = missing_message(id, err, k->features);
        return NULL;
    }
    *ret_id = xstrdup(id);
    return s;
}
