/* watch.c - envd's directory watches: WatchDir (a stream: what the JavaScript SDK's
 * files.watchDir reads) and CreateWatcher / GetWatcherEvents / RemoveWatcher (polled: what
 * the Python SDK's watch_dir uses), over the session's watches (session_watch_*). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "e2b/e2b-int.h"

#define WATCH_BATCH 256

static const char *const event_types[] = {
    [SWATCH_CREATE] = "EVENT_TYPE_CREATE", [SWATCH_WRITE] = "EVENT_TYPE_WRITE",
    [SWATCH_REMOVE] = "EVENT_TYPE_REMOVE", [SWATCH_RENAME] = "EVENT_TYPE_RENAME",
    [SWATCH_CHMOD] = "EVENT_TYPE_CHMOD",
};

/* A FilesystemEvent {name, type} (its name freed: it is the sandbox's, made valid text). */
static json_t *event_json(struct session_watch_event *ev)
{
    size_t n;
    char *name = utf8_sanitize(ev->name, strlen(ev->name), &n);
    json_t *j = json_pack("{s:s%,s:s}", "name", name, n, "type", event_types[ev->type]);
    free(name);
    free(ev->name);
    ev->name = NULL;
    return j;
}

/* The watch a request's {path, recursive} asks for, or NULL after replying. */
static struct session_watch *watch_for(struct request *rq, struct session *s, json_t *msg)
{
    const char *p = json_string_value(json_object_get(msg, "path"));
    char why[512];
    _cleanup_free_ char *rel = e2b_ws_path(p ? p : "", why);
    if (!rel) {
        e2b_connect_error(rq, "invalid_argument", "%s", why);
        return NULL;
    }
    struct session_watch *w;
    int r = session_watch_new(s, rel, json_is_true(json_object_get(msg, "recursive")), &w);
    if (r < 0) {
        e2b_connect_error(rq, r == -E2BIG ? "resource_exhausted" : e2b_errno_code(r), "%s",
                          err_msg());
        return NULL;
    }
    return w;
}

/* ---- WatchDir: a stream of the events, until its Connect-Timeout-Ms or the sandbox ends ---- */

struct watch_stream {
    struct server *srv;
    struct session *s; /* a reference: the workspace stays while the stream reads it */
    char *box;
    struct session_watch *w;
    uint64_t deadline_ms; /* monotonic; 0: none */
    bool begun;
};

static int watch_pull(void *src, struct buf *out)
{
    struct watch_stream *ws = src;
    struct session_watch_event evs[WATCH_BATCH];
    if (!ws->begun) {
        ws->begun = true;
        e2b_envelope(out, json_pack("{s:{}}", "start"), 0);
    }
    size_t n = session_watch_read(ws->s, ws->w, evs, ARRAY_SIZE(evs));
    for (size_t i = 0; i < n; i++)
        e2b_envelope(out, json_pack("{s:o}", "filesystem", event_json(&evs[i])), 0);
    int err;
    struct session *live = session_table_acquire(ws->srv->table, ws->box, &err);
    if (live)
        session_table_put(ws->srv->table, live);
    if (!live) {
        e2b_envelope(out,
                     json_pack("{s:{s:s,s:s}}", "error", "code", "unavailable", "message",
                               "the sandbox is not running any more"),
                     0x02);
        return 1;
    }
    if (ws->deadline_ms && now_ms() >= ws->deadline_ms) {
        e2b_envelope(out,
                     json_pack("{s:{s:s,s:s}}", "error", "code", "deadline_exceeded", "message",
                               "the watch ran for its timeout (timeoutMs; 0 for none)"),
                     0x02);
        return 1;
    }
    return 0;
}

static int watch_wait_fd(void *src)
{
    return session_watch_fd(((struct watch_stream *)src)->w);
}

static void watch_keepalive(void *src, struct buf *out)
{
    (void)src;
    e2b_envelope(out, json_pack("{s:{}}", "keepalive"), 0);
}

static void watch_stream_free(void *src)
{
    struct watch_stream *ws = src;
    session_watch_free(ws->w);
    session_table_put(ws->srv->table, ws->s);
    free(ws->box);
    free(ws);
}

static const struct http_source_ops watch_source_ops = {
    .pull = watch_pull,
    .wait_fd = watch_wait_fd,
    .keepalive = watch_keepalive,
    .free = watch_stream_free,
};

/* s's reference is the stream's from now. */
enum MHD_Result e2b_watch_dir(struct request *rq, json_t *msg, struct session *s)
{
    struct session_watch *w = watch_for(rq, s, msg);
    if (!w) {
        session_table_put(rq->srv->table, s);
        return MHD_YES;
    }
    struct watch_stream *ws = xcalloc(1, sizeof(*ws));
    ws->srv = rq->srv;
    ws->s = s;
    ws->box = xstrdup(e2b_box_id(rq));
    ws->w = w;
    uint64_t timeout = 0;
    const char *t = e2b_header(rq, "Connect-Timeout-Ms");
    int keepalive = E2B_KEEPALIVE_MS;
    if (t && parse_u64(t, &timeout) == 0 && timeout) {
        ws->deadline_ms = now_ms() + timeout;
        if (timeout < (uint64_t)keepalive)
            keepalive = (int)timeout; /* a quiet stream still ends at its deadline */
    }
    return http_stream(rq, 200, "application/connect+json", &watch_source_ops, ws, keepalive);
}

/* ---- watchers polled by id ---- */

void e2b_watchers_free(struct e2b_watcher *w)
{
    while (w) {
        struct e2b_watcher *next = w->next;
        session_watch_free(w->w);
        free(w);
        w = next;
    }
}

static struct e2b_watcher **watcher_slot(struct e2b_box *b, const char *id)
{
    for (struct e2b_watcher **p = &b->watchers; *p; p = &(*p)->next)
        if (id && token_equal((*p)->id, id))
            return p;
    return NULL;
}

enum MHD_Result e2b_watcher_rpc(struct request *rq, const char *method, json_t *msg,
                                struct session *s)
{
    struct e2b *e = rq->srv->e2b;
    const char *box = e2b_box_id(rq);
    const char *id = json_string_value(json_object_get(msg, "watcherId"));
    struct session_watch *fresh = NULL;
    if (!strcmp(method, "CreateWatcher") && !(fresh = watch_for(rq, s, msg)))
        return MHD_YES;
    enum MHD_Result ret = MHD_YES;
    json_t *reply = NULL;
    pthread_mutex_lock(&e->lock);
    struct e2b_box *b = e2b_box_find(e, box);
    struct e2b_watcher **slot = b ? watcher_slot(b, id) : NULL;
    size_t count = 0;
    for (struct e2b_watcher *w = b ? b->watchers : NULL; w; w = w->next)
        count++;
    if (fresh && b && count < E2B_MAX_WATCHERS) {
        struct e2b_watcher *w = xcalloc(1, sizeof(*w));
        _cleanup_free_ char *hex = random_hex(16);
        snprintf(w->id, sizeof(w->id), "%s", hex);
        w->w = TAKE_PTR(fresh);
        w->next = b->watchers;
        b->watchers = w;
        reply = json_pack("{s:s}", "watcherId", w->id);
    } else if (!fresh && slot && !strcmp(method, "GetWatcherEvents")) {
        struct session_watch_event evs[WATCH_BATCH];
        json_t *arr = json_array();
        size_t n;
        do {
            n = session_watch_read(s, (*slot)->w, evs, ARRAY_SIZE(evs));
            for (size_t i = 0; i < n; i++)
                json_array_append_new(arr, event_json(&evs[i]));
        } while (n == ARRAY_SIZE(evs) && json_array_size(arr) < SESSION_WATCH_MAX_PENDING);
        reply = json_pack("{s:o}", "events", arr);
    } else if (!fresh && slot) { /* RemoveWatcher */
        struct e2b_watcher *w = *slot;
        *slot = w->next;
        w->next = NULL;
        e2b_watchers_free(w);
        reply = json_object();
    }
    pthread_mutex_unlock(&e->lock);
    if (reply)
        return reply_json(rq, 200, reply);
    if (fresh) {
        session_watch_free(fresh);
        ret = e2b_connect_error(rq, "resource_exhausted",
                                "sandbox %s has its maximum of %d watchers; remove one", box,
                                E2B_MAX_WATCHERS);
    } else {
        ret = e2b_connect_error(rq, "not_found", "no watcher '%.64s' in sandbox %s", id ? id : "",
                                box);
    }
    return ret;
}
