/* exec.c - durable executions: a cell submitted to a session gets an id and a place in the
 * session's queue, and keeps its events (streams, results, its error, its end) while it runs
 * and for a while after, for any number of readers (within EXEC_WATCHERS_MAX at once) that
 * come and go. No surface runs a cell any other way. */
#include "session/session-int.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* A stream's consecutive chunks share one kept event until a reader has seen it or it holds
 * this much: a cell that prints a character at a time is not a million events. */
#define ITEM_COALESCE_MAX (64u << 10)

struct item {
    enum exec_event_type type;
    char *data;
    size_t len;
    json_t *json;
    bool sealed; /* a reader has it: nothing more is added to it */
};

struct exec_watch {
    struct execution *x;
    struct reader_watch rw;
};

struct execution {
    atomic_int refs;
    pthread_mutex_t lock;
    pthread_cond_t changed; /* an event was kept, or the execution ended */
    char id[EXEC_ID_SIZE];
    struct session *s;       /* NULL once the session is gone (the registry's lock) */
    struct session_table *t; /* holds a reference on s for x while it is not done */
    struct exec_turn turn;   /* its place in s's queue */
    struct exec_request req; /* code and lang point into code and lang below */
    char *code;
    char lang[16];
    const struct exec_sink *also;
    enum exec_phase phase;
    bool ran; /* execution_run was called */
    struct exec_record rec;
    bool has_record;
    json_t *record_json; /* exec_record_json(&rec), made once when it ends (its EV_DONE's) */
    int failure;
    char *failure_msg;
    struct item *items; /* items[i] has seq first_seq + i */
    size_t n_items, cap_items;
    uint64_t first_seq, last_seq;
    uint64_t bytes;     /* kept: the streams' bytes and the record's estimate */
    bool items_dropped; /* EXEC_ITEMS_MAX was reached: later chunks are in the record only */
    struct wakers readers;
    uint64_t submitted_ms, started_ms, ended_ms; /* realtime */
    uint64_t ended_mono_ms;
    struct execution *next; /* in the registry (its lock) */
    bool registered;
};

static void notify_locked(struct execution *x)
{
    wakers_notify(&x->readers);
    pthread_cond_broadcast(&x->changed);
}

/* ---- the registry: the executions a session keeps ---- */

/* Drops the finished executions past what a session keeps, oldest first (the registry's lock
 * held); they are chained into *ret_gone for the caller to unref outside the lock. */
static void prune_locked(struct exec_registry *r, struct execution **ret_gone)
{
    uint64_t now = now_ms(), bytes = 0;
    size_t done = 0;
    for (struct execution *x = r->head; x; x = x->next) {
        pthread_mutex_lock(&x->lock);
        if (x->phase == EXEC_DONE) {
            done++;
            bytes += x->bytes;
        }
        pthread_mutex_unlock(&x->lock);
    }
    struct execution **pp = &r->head;
    while (*pp) {
        struct execution *x = *pp;
        pthread_mutex_lock(&x->lock);
        bool is_done = x->phase == EXEC_DONE;
        uint64_t xb = x->bytes;
        bool old = is_done && ms_since(now, x->ended_mono_ms) >= EXEC_KEEP_MS;
        pthread_mutex_unlock(&x->lock);
        if (is_done && (old || done > EXEC_KEEP || bytes > EXEC_KEEP_BYTES)) {
            *pp = x->next;
            x->registered = false;
            x->next = *ret_gone;
            *ret_gone = x;
            r->n--;
            done--;
            bytes -= xb;
            continue;
        }
        pp = &x->next;
    }
    r->tail = NULL;
    for (struct execution *x = r->head; x; x = x->next)
        r->tail = x;
}

static void unref_chain(struct execution *x)
{
    while (x) {
        struct execution *next = x->next;
        x->next = NULL;
        execution_unref(x);
        x = next;
    }
}

static void registry_prune(struct exec_registry *r)
{
    struct execution *gone = NULL;
    pthread_mutex_lock(&r->lock);
    prune_locked(r, &gone);
    pthread_mutex_unlock(&r->lock);
    unref_chain(gone);
}

static void registry_release(struct exec_registry *r)
{
    pthread_mutex_lock(&r->keys_lock);
    free(r->keys);
    r->keys = NULL;
    pthread_mutex_unlock(&r->keys_lock);
    pthread_mutex_lock(&r->lock);
    struct execution *x = r->head;
    r->head = r->tail = NULL;
    r->n = 0;
    for (struct execution *y = x; y; y = y->next) {
        pthread_mutex_lock(&y->lock);
        y->s = NULL;
        y->registered = false;
        pthread_mutex_unlock(&y->lock);
    }
    pthread_mutex_unlock(&r->lock);
    unref_chain(x);
}

/* ---- one execution ---- */

struct execution *execution_ref(struct execution *x)
{
    atomic_fetch_add(&x->refs, 1);
    return x;
}

static void items_free(struct item *items, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(items[i].data);
        json_decref(items[i].json);
    }
    free(items);
}

void execution_unref(struct execution *x)
{
    if (!x || atomic_fetch_sub(&x->refs, 1) != 1)
        return;
    items_free(x->items, x->n_items);
    json_decref(x->record_json);
    exec_record_release(&x->rec);
    free(x->failure_msg);
    free(x->code);
    pthread_cond_destroy(&x->changed);
    pthread_mutex_destroy(&x->lock);
    free(x);
}

const char *execution_id(const struct execution *x)
{
    return x->id;
}

enum exec_phase execution_phase(struct execution *x)
{
    pthread_mutex_lock(&x->lock);
    enum exec_phase p = x->phase;
    pthread_mutex_unlock(&x->lock);
    return p;
}

const char *exec_phase_name(enum exec_phase p)
{
    static const char *const names[] = {
        [EXEC_QUEUED] = "queued", [EXEC_RUNNING] = "running", [EXEC_DONE] = "done"};
    return (unsigned)p <= EXEC_DONE ? names[p] : "invalid";
}

/* Keeps one event (x's lock held). */
static void keep_locked(struct execution *x, enum exec_event_type type, const char *data,
                        size_t len, json_t *json)
{
    bool stream = type == EV_STDOUT || type == EV_STDERR;
    struct item *last = x->n_items ? &x->items[x->n_items - 1] : NULL;
    if (stream && last && last->type == type && !last->sealed &&
        last->len + len <= ITEM_COALESCE_MAX) {
        last->data = xrealloc(last->data, last->len + len + 1);
        memcpy(last->data + last->len, data, len);
        last->len += len;
        last->data[last->len] = '\0';
        x->bytes += len;
        notify_locked(x);
        return;
    }
    if (x->n_items >= EXEC_ITEMS_MAX && type != EV_DONE) {
        x->items_dropped = true; /* the record still has the stream's head and tail */
        return;
    }
    if (x->n_items == x->cap_items) {
        x->cap_items = x->cap_items ? 2 * x->cap_items : 8;
        x->items = xrealloc(x->items, x->cap_items * sizeof(*x->items));
    }
    struct item *it = &x->items[x->n_items++];
    *it = (struct item){.type = type};
    if (stream) {
        it->data = xmalloc(len + 1);
        memcpy(it->data, data, len);
        it->data[len] = '\0';
        it->len = len;
        x->bytes += len;
    } else {
        it->json = json_incref(json);
        it->len = type == EV_RESULT ? len : 0; /* 1: the cell's value (session.h) */
    }
    x->last_seq++;
    notify_locked(x);
}

static void on_event(void *ctx, const struct exec_event *ev)
{
    struct execution *x = ctx;
    pthread_mutex_lock(&x->lock);
    keep_locked(x, ev->type, ev->data, ev->len, ev->json);
    pthread_mutex_unlock(&x->lock);
    if (x->also && x->also->fn)
        x->also->fn(x->also->ctx, ev);
}

static void on_start(struct exec_turn *t)
{
    struct execution *x = (struct execution *)((char *)t - offsetof(struct execution, turn));
    pthread_mutex_lock(&x->lock);
    x->phase = EXEC_RUNNING;
    x->started_ms = now_realtime_ms();
    notify_locked(x);
    pthread_mutex_unlock(&x->lock);
}

int session_submit(struct session_table *t, struct session *s, const struct exec_request *req,
                   struct execution **ret)
{
    if (!req->code)
        return err_set(EINVAL, "no code to execute");
    if (req->lang && !lang_supported(req->lang))
        return err_set(EINVAL, "unknown language '%s': use python, bash or javascript", req->lang);
    struct execution *x = xcalloc(1, sizeof(*x));
    atomic_init(&x->refs, 2); /* the caller's and the registry's */
    pthread_mutex_init(&x->lock, NULL);
    pthread_cond_init(&x->changed, NULL);
    _cleanup_free_ char *hex = random_hex(8);
    snprintf(x->id, sizeof(x->id), "%s", hex);
    x->s = s;
    x->code = xstrdup(req->code);
    if (req->lang)
        snprintf(x->lang, sizeof(x->lang), "%s", lang_name(req->lang));
    x->req = *req;
    x->req.code = x->code;
    x->req.lang = req->lang ? x->lang : NULL;
    x->turn.on_start = on_start;
    x->turn.stop_on_error = req->stop_on_error;
    x->first_seq = 1;
    x->submitted_ms = now_realtime_ms();
    x->phase = EXEC_QUEUED;
    exec_record_init(&x->rec, session_options(s)->output_cap);
    int r = session_enqueue(s, &x->turn);
    if (r < 0) {
        atomic_store(&x->refs, 1);
        execution_unref(x);
        return r;
    }
    if (t) {
        session_table_ref(t, s);
        x->t = t;
    }
    struct exec_registry *reg = session_registry(s);
    registry_prune(reg);
    pthread_mutex_lock(&reg->lock);
    reg->release = registry_release;
    x->registered = true;
    if (reg->tail)
        reg->tail->next = x;
    else
        reg->head = x;
    reg->tail = x;
    reg->n++;
    pthread_mutex_unlock(&reg->lock);
    *ret = x;
    return 0;
}

/* ---- idempotency keys ---- */

struct exec_key {
    char key[EXEC_KEY_MAX + 1];
    char id[EXEC_ID_SIZE];
    uint64_t hash; /* of the code and its language: a key stands for one request */
};

bool exec_key_valid(const char *key)
{
    size_t n = key ? strlen(key) : 0;
    if (n < 1 || n > EXEC_KEY_MAX)
        return false;
    for (const char *p = key; *p; p++)
        if (*p < 0x21 || *p > 0x7e)
            return false;
    return true;
}

static uint64_t request_hash(const struct exec_request *req)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    const char *parts[] = {req->lang ? lang_name(req->lang) : "", "\n", req->code};
    for (size_t i = 0; i < ARRAY_SIZE(parts); i++)
        for (const unsigned char *p = (const unsigned char *)parts[i]; *p; p++)
            h = (h ^ *p) * 1099511628211ull;
    return h;
}

int session_submit_keyed(struct session_table *t, struct session *s, const struct exec_request *req,
                         const char *key, struct execution **ret, bool *ret_replayed)
{
    *ret_replayed = false;
    if (!key)
        return session_submit(t, s, req, ret);
    if (!exec_key_valid(key))
        return err_set(EINVAL,
                       "an idempotency key is 1 to %d visible ASCII characters, without spaces",
                       EXEC_KEY_MAX);
    if (!req->code)
        return err_set(EINVAL, "no code to execute");
    struct exec_registry *reg = session_registry(s);
    uint64_t hash = request_hash(req);
    pthread_mutex_lock(&reg->keys_lock);
    for (size_t i = 0; reg->keys && i < EXEC_KEYS_MAX; i++) {
        struct exec_key *k = &reg->keys[i];
        if (strcmp(k->key, key))
            continue;
        int r;
        if (k->hash != hash) {
            r = err_set(EEXIST,
                        "idempotency key '%s' was given to execution %s, of other code: a key "
                        "stands for one request; use a new key for new code",
                        key, k->id);
        } else if ((*ret = session_execution_find(s, k->id))) {
            *ret_replayed = true;
            r = 0;
        } else {
            r = err_set(EEXIST,
                        "idempotency key '%s' was given to execution %s, which is no longer "
                        "kept (the last %d, for %d minutes): it is not run again",
                        key, k->id, EXEC_KEEP, EXEC_KEEP_MS / 60000);
        }
        pthread_mutex_unlock(&reg->keys_lock);
        return r;
    }
    int r = session_submit(t, s, req, ret);
    if (r == 0) {
        if (!reg->keys)
            reg->keys = xcalloc(EXEC_KEYS_MAX, sizeof(*reg->keys));
        struct exec_key *k = &reg->keys[reg->next_key++ % EXEC_KEYS_MAX];
        snprintf(k->key, sizeof(k->key), "%s", key);
        snprintf(k->id, sizeof(k->id), "%s", execution_id(*ret));
        k->hash = hash;
    }
    pthread_mutex_unlock(&reg->keys_lock);
    return r;
}

/* What EV_DONE says when x did not run. */
static const char *failure_code(int err)
{
    switch (-err) {
    case ECANCELED:
        return "cancelled";
    case ESHUTDOWN:
        return "closed";
    case EAGAIN:
        return "busy";
    case ECONNABORTED:
        return "aborted";
    default:
        return "failed";
    }
}

/* x is over: its last event, and the session's reference goes. */
static void finish(struct execution *x, int r)
{
    json_t *done;
    /* Counted before its end is seen: a client that read it finds it in the metrics. */
    if (x->t && r == 0)
        session_table_observe(x->t, &x->rec);
    json_t *record = r == 0 ? exec_record_json(&x->rec) : NULL;
    if (r == 0) {
        done = json_pack("{s:O}", "record", record);
    } else {
        x->failure = r;
        x->failure_msg = xstrdup(err_msg());
        done =
            json_pack("{s:{s:s,s:s}}", "error", "code", failure_code(r), "message", x->failure_msg);
    }
    pthread_mutex_lock(&x->lock);
    x->has_record = r == 0;
    x->record_json = record;
    /* What the record holds besides the streams' live part: a rough figure for the keep. */
    x->bytes += x->rec.out.head.len + x->rec.out.tail_len + x->rec.err.head.len +
                x->rec.err.tail_len + 1024;
    keep_locked(x, EV_DONE, NULL, 0, done);
    x->phase = EXEC_DONE;
    x->ended_ms = now_realtime_ms();
    x->ended_mono_ms = now_ms();
    notify_locked(x);
    struct session *s = x->s;
    struct session_table *t = x->t;
    x->t = NULL;
    pthread_mutex_unlock(&x->lock);
    json_decref(done);
    if (s)
        registry_prune(session_registry(s));
    if (t)
        session_table_put(t, s); /* s may be gone after this */
}

void execution_run(struct execution *x, const struct exec_sink *also)
{
    struct exec_sink sink = {.fn = on_event, .ctx = x};
    pthread_mutex_lock(&x->lock);
    bool twice = x->ran;
    x->ran = true;
    x->also = also;
    struct session *s = x->s;
    pthread_mutex_unlock(&x->lock);
    if (twice)
        return;
    int r = session_execute_turn(s, &x->turn, &x->req, &sink, &x->rec);
    x->also = NULL;
    finish(x, r);
}

static void *spawn_main(void *arg)
{
    struct execution *x = arg;
    execution_run(x, NULL);
    execution_unref(x);
    return NULL;
}

int execution_spawn(struct execution *x)
{
    pthread_attr_t attr;
    pthread_t th;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    execution_ref(x);
    int e = pthread_create(&th, &attr, spawn_main, x);
    pthread_attr_destroy(&attr);
    if (e) {
        /* It leaves the queue unrun, and says why. */
        session_turn_cancel(x->s, &x->turn);
        err_set(e, "cannot start a thread for the execution: %s", strerror(e));
        execution_unref(x);
        return -e;
    }
    return 0;
}

void execution_cancel(struct execution *x)
{
    pthread_mutex_lock(&x->lock);
    struct session *s = x->phase == EXEC_DONE ? NULL : x->s;
    pthread_mutex_unlock(&x->lock);
    /* Not done: the execution's reference keeps s (or its caller does, without a table). */
    if (s)
        session_turn_stop(s, &x->turn);
}

bool execution_wait(struct execution *x, uint64_t timeout_ms)
{
    struct timespec until;
    realtime_after_ms(&until, timeout_ms);
    pthread_mutex_lock(&x->lock);
    while (x->phase != EXEC_DONE) {
        if (!timeout_ms)
            pthread_cond_wait(&x->changed, &x->lock);
        else if (pthread_cond_timedwait(&x->changed, &x->lock, &until))
            break;
    }
    bool done = x->phase == EXEC_DONE;
    pthread_mutex_unlock(&x->lock);
    return done;
}

const struct exec_record *execution_record(struct execution *x)
{
    pthread_mutex_lock(&x->lock);
    bool has = x->has_record;
    pthread_mutex_unlock(&x->lock);
    return has ? &x->rec : NULL;
}

json_t *execution_record_json(struct execution *x)
{
    pthread_mutex_lock(&x->lock);
    json_t *j = x->has_record ? json_incref(x->record_json) : NULL;
    pthread_mutex_unlock(&x->lock);
    return j;
}

int execution_failure(struct execution *x, const char **ret_message)
{
    pthread_mutex_lock(&x->lock);
    int r = x->phase == EXEC_DONE ? x->failure : 0;
    if (ret_message)
        *ret_message = r ? x->failure_msg : NULL;
    pthread_mutex_unlock(&x->lock);
    return r;
}

size_t execution_read(struct execution *x, uint64_t after, struct exec_item *items, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&x->lock);
    uint64_t seq = after < x->first_seq ? x->first_seq : after + 1;
    for (; seq <= x->last_seq && n < max; seq++, n++) {
        struct item *it = &x->items[seq - x->first_seq];
        it->sealed = true;
        items[n] = (struct exec_item){.seq = seq, .type = it->type, .len = it->len};
        if (it->data) {
            items[n].data = xmalloc(it->len + 1);
            memcpy(items[n].data, it->data, it->len + 1);
        }
        items[n].json = json_incref(it->json);
    }
    pthread_mutex_unlock(&x->lock);
    return n;
}

void exec_items_release(struct exec_item *items, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(items[i].data);
        json_decref(items[i].json);
        items[i].data = NULL;
        items[i].json = NULL;
    }
}

uint64_t execution_last_seq(struct execution *x)
{
    pthread_mutex_lock(&x->lock);
    uint64_t v = x->last_seq;
    pthread_mutex_unlock(&x->lock);
    return v;
}

uint64_t execution_first_seq(struct execution *x)
{
    pthread_mutex_lock(&x->lock);
    uint64_t v = x->first_seq;
    pthread_mutex_unlock(&x->lock);
    return v;
}

static json_t *time_or_null(uint64_t ms)
{
    char t[32];
    if (!ms)
        return json_null();
    format_time_iso(ms, t);
    return json_string(t);
}

json_t *execution_json(struct execution *x)
{
    pthread_mutex_lock(&x->lock);
    json_t *j =
        json_pack("{s:s,s:s,s:s,s:o,s:o,s:o,s:I}", "id", x->id, "phase", exec_phase_name(x->phase),
                  "language", x->lang[0] ? x->lang : "default", "submitted_at",
                  time_or_null(x->submitted_ms), "started_at", time_or_null(x->started_ms),
                  "ended_at", time_or_null(x->ended_ms), "last_seq", (json_int_t)x->last_seq);
    if (x->has_record)
        json_object_set_new(j, "status", json_string(exec_status_name(x->rec.status)));
    else if (x->failure)
        json_object_set_new(j, "status", json_string(failure_code(x->failure)));
    if (x->items_dropped)
        json_object_set_new(j, "events_dropped", json_true());
    pthread_mutex_unlock(&x->lock);
    return j;
}

/* ---- readers ---- */

int execution_watch(struct execution *x, struct exec_watch **ret)
{
    struct exec_watch *w = xcalloc(1, sizeof(*w));
    int r = reader_watch_open(&w->rw, &x->lock, &x->readers);
    if (r < 0) {
        free(w);
        return r == -EAGAIN ? err_set(EAGAIN, "execution %s has its maximum of %d readers", x->id,
                                      EXEC_WATCHERS_MAX)
                            : err_set(-r, "cannot make an eventfd: %s", strerror(-r));
    }
    w->x = execution_ref(x);
    *ret = w;
    return 0;
}

int exec_watch_fd(const struct exec_watch *w)
{
    return w->rw.fd;
}

void exec_watch_clear(struct exec_watch *w)
{
    waker_clear(w->rw.fd);
}

void exec_watch_free(struct exec_watch *w)
{
    if (!w)
        return;
    reader_watch_close(&w->rw);
    execution_unref(w->x);
    free(w);
}

struct execution *session_execution_find(struct session *s, const char *id)
{
    struct exec_registry *reg = session_registry(s);
    registry_prune(reg);
    struct execution *found = NULL;
    pthread_mutex_lock(&reg->lock);
    for (struct execution *x = reg->head; x && !found; x = x->next)
        if (!strcmp(x->id, id))
            found = execution_ref(x);
    pthread_mutex_unlock(&reg->lock);
    return found;
}

json_t *session_executions_json(struct session *s)
{
    struct exec_registry *reg = session_registry(s);
    registry_prune(reg);
    json_t *arr = json_array();
    pthread_mutex_lock(&reg->lock);
    for (struct execution *x = reg->head; x; x = x->next)
        json_array_append_new(arr, execution_json(x));
    pthread_mutex_unlock(&reg->lock);
    return arr;
}
