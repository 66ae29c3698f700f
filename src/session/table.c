/* table.c - a server's sessions by id: references so a close never frees a session under
 * a running request, an idle reaper, tombstones so an expired id says "expired", and a wait
 * so that whoever asks for a session being retired hears its final record. */
#include "session/session-int.h"

#include <errno.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TOMBSTONES 4096

struct entry {
    char *id;
    struct session *s;
    int refs;
    bool removed;
    bool retiring;                /* removed, its checkpoint and final record not yet written */
    uint64_t hibernate_failed_at; /* its last use when hibernate_idle last tried it */
    struct entry *next;
};

struct session_table {
    struct sandbox_host *host;
    struct session_pool *pool;            /* borrowed; may be NULL */
    const struct persist_config *persist; /* NULL: sessions keep nothing */
    char *node;                           /* named in new ids, or NULL */
    size_t max_sessions;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_cond_t retired; /* an entry stopped retiring */
    struct entry *head;
    size_t count;
    char *tombstones[TOMBSTONES]; /* ids expired for idleness, most recent last (a ring) */
    size_t tomb_next;
    struct exec_gate *gate; /* NULL until set_exec_limits */
    void (*observer)(void *ctx, const struct exec_record *rec);
    void *observer_ctx;
    void (*gone)(void *ctx, const char *id); /* a session left the table for good */
    void *gone_ctx;
    pthread_t reaper;
    bool reaper_running;
    bool stopping;
    uint64_t reap_interval_ms;
    size_t retire_workers; /* checkpoints at once at shutdown */
};

struct session_table *session_table_new(struct sandbox_host *host, size_t max_sessions,
                                        struct session_pool *pool)
{
    struct session_table *t = xcalloc(1, sizeof(*t));
    session_files_history_enable();
    t->host = host;
    t->pool = pool;
    t->max_sessions = max_sessions;
    t->retire_workers = RETIRE_WORKERS_DEFAULT;
    pthread_mutex_init(&t->lock, NULL);
    pthread_cond_init(&t->wake, NULL);
    pthread_cond_init(&t->retired, NULL);
    return t;
}

static struct entry *find(struct session_table *t, const char *id)
{
    for (struct entry *e = t->head; e; e = e->next)
        if (!e->removed && !strcmp(e->id, id))
            return e;
    return NULL;
}

/* While a session is retired its record says it ended but not yet what was kept (the
 * checkpoint takes a while): who asks for it meanwhile waits for the final record, or they
 * would be told that no variables are stored, or resume from a store still being written. */
static void wait_retired_locked(struct session_table *t, const char *id)
{
    for (;;) {
        struct entry *e = t->head;
        while (e && !(e->retiring && !strcmp(e->id, id)))
            e = e->next;
        if (!e)
            return;
        pthread_cond_wait(&t->retired, &t->lock);
    }
}

void session_table_wait_retired(struct session_table *t, const char *id)
{
    pthread_mutex_lock(&t->lock);
    wait_retired_locked(t, id);
    pthread_mutex_unlock(&t->lock);
}

static struct entry *find_session(struct session_table *t, struct session *s)
{
    for (struct entry *e = t->head; e; e = e->next)
        if (e->s == s)
            return e;
    return NULL;
}

/* Unlinks and frees e; the caller holds the lock and e has no references. The session is
 * freed outside the lock, as killing a kernel takes a while. */
static struct session *unlink_entry(struct session_table *t, struct entry *e)
{
    for (struct entry **p = &t->head; *p; p = &(*p)->next) {
        if (*p == e) {
            *p = e->next;
            break;
        }
    }
    struct session *s = e->s;
    free(e->id);
    free(e);
    return s;
}

void session_table_set_exec_limits(struct session_table *t, size_t max_running, size_t max_waiting)
{
    exec_gate_free(t->gate);
    t->gate = exec_gate_new(max_running, max_waiting);
}

void session_table_set_observer(struct session_table *t,
                                void (*fn)(void *ctx, const struct exec_record *rec), void *ctx)
{
    t->observer = fn;
    t->observer_ctx = ctx;
}

void session_table_observe(struct session_table *t, const struct exec_record *rec)
{
    if (t->observer)
        t->observer(t->observer_ctx, rec);
}

struct exec_gate *session_table_gate(struct session_table *t)
{
    return t->gate;
}

void session_table_ref(struct session_table *t, struct session *s)
{
    pthread_mutex_lock(&t->lock);
    struct entry *e = find_session(t, s);
    if (e)
        e->refs++;
    pthread_mutex_unlock(&t->lock);
}

void session_table_set_persistence(struct session_table *t, const struct persist_config *c)
{
    t->persist = c;
}

/* Gives s its id and, when resuming, what was stored; on failure s is retired (closed). */
static int persist_new(struct session_table *t, struct session *s, const char *id,
                       const struct session_create *rq, json_t **ret_restored)
{
    if (!t->persist) {
        if (rq->resume_from)
            return err_set(EINVAL, "this server keeps no store: nothing can be resumed");
        return 0;
    }
    int r = session_persist(s, t->persist, id, !rq->no_persist, rq->resume_from);
    if (!r && rq->resume_from)
        r = session_restore(s, rq->resume_from, ret_restored);
    if (r < 0) {
        char *msg = xstrdup(err_msg());
        /* A takeover that failed leaves what is stored as it was, for another try. */
        if (rq->id) {
            session_persist_fence(s);
            if (t->persist->fleet)
                fleet_lease_release(t->persist->fleet, rq->id, "stopped", NULL);
        } else {
            session_retire(s, SESSION_END_CLOSE, NULL);
        }
        err_set(-r, "%s", msg);
        free(msg);
    }
    return r;
}

int session_table_create(struct session_table *t, const struct session_opts *opts, char **ret_id)
{
    struct session_create rq = {.opts = opts};
    return session_table_create_ex(t, &rq, ret_id, NULL);
}

/* A session that could not be made for want of descriptors says whose limit it met and
 * what to do. */
static int out_of_files(int r, size_t live)
{
    _cleanup_free_ char *why = xstrdup(err_msg());
    struct rlimit rl = {0};
    getrlimit(RLIMIT_NOFILE, &rl);
    if (r == -ENFILE)
        return err_set(ENFILE,
                       "%s: the system is out of open files (fs.file-max) with %zu live "
                       "sessions here; raise fs.file-max or lower --max-sessions",
                       why, live);
    return err_set(EMFILE,
                   "%s: the server is out of open files at %zu live sessions (its limit is "
                   "%llu); raise it (ulimit -n, LimitNOFILE= under systemd) or lower "
                   "--max-sessions",
                   why, live, (unsigned long long)rl.rlim_cur);
}

/* Descriptors a new session may take while it starts (its own, the spawn request's, the
 * template's reply) with some left for connections: fewer free than this, and it is not
 * begun, rather than fail part-way. */
#define FDS_TO_START 48

/* Whether fewer than FDS_TO_START descriptors are free. fds are taken lowest first, so the
 * lowest free one is close to the count in use unless sessions ended below it; only near
 * the limit are the free ones counted, by taking them (a dup each) and giving them back. A
 * hole lower down can still make this say "enough" for a start that then fails. */
static bool fds_short(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY)
        return false;
    int lowest = -1;
    for (int fd = 0; fd <= 2 && lowest < 0; fd++)
        lowest = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (lowest < 0)
        return errno == EMFILE;
    if ((rlim_t)lowest + 2 * FDS_TO_START <= rl.rlim_cur) {
        close(lowest);
        return false;
    }
    int taken[FDS_TO_START], n = 0;
    taken[n++] = lowest;
    while (n < FDS_TO_START && (taken[n] = fcntl(lowest, F_DUPFD_CLOEXEC, 0)) >= 0)
        n++;
    for (int i = 0; i < n; i++)
        close(taken[i]);
    return n < FDS_TO_START;
}

/* Gives back the place a create reserved; returns how many sessions are left. */
static size_t give_back_place(struct session_table *t)
{
    pthread_mutex_lock(&t->lock);
    size_t live = --t->count;
    pthread_mutex_unlock(&t->lock);
    return live;
}

int session_table_create_ex(struct session_table *t, const struct session_create *rq, char **ret_id,
                            json_t **ret_restored)
{
    json_t *restored = NULL;
    pthread_mutex_lock(&t->lock);
    bool full = t->max_sessions && t->count >= t->max_sessions;
    if (!full)
        t->count++; /* reserve the place while the kernel starts */
    pthread_mutex_unlock(&t->lock);
    if (full)
        return err_set(EAGAIN,
                       "the server holds its maximum of %zu live sessions; close one "
                       "or wait for idle ones to expire",
                       t->max_sessions);
    if (fds_short()) {
        err_set(EMFILE, "too few descriptors left to start a session");
        return out_of_files(-EMFILE, give_back_place(t));
    }
    _cleanup_free_ char *hex = random_hex(12);
    _cleanup_free_ char *id = rq->id    ? xstrdup(rq->id)
                              : t->node ? xasprintf("%s-%s", t->node, hex)
                                        : xstrdup(hex);
    struct session *s = session_pool_take(t->pool, rq->opts);
    int r = s ? 0 : session_new(t->host, rq->opts, &s);
    if (r == 0 && (r = persist_new(t, s, id, rq, &restored)) < 0) {
        session_free(s);
        s = NULL;
    }
    if (r < 0) {
        size_t live = give_back_place(t);
        return r == -EMFILE || r == -ENFILE ? out_of_files(r, live) : r;
    }
    session_set_gate(s, t->gate);
    struct entry *e = xcalloc(1, sizeof(*e));
    e->id = xstrdup(id);
    e->s = s;
    pthread_mutex_lock(&t->lock);
    e->next = t->head;
    t->head = e;
    pthread_mutex_unlock(&t->lock);
    *ret_id = xstrdup(e->id);
    if (ret_restored)
        *ret_restored = restored;
    else
        json_decref(restored);
    return 0;
}

void session_table_set_retire_workers(struct session_table *t, size_t workers)
{
    t->retire_workers = workers ? workers : 1;
}

void session_table_set_node(struct session_table *t, const char *node)
{
    free(t->node);
    t->node = node ? xstrdup(node) : NULL;
}

static bool is_tombstone(struct session_table *t, const char *id)
{
    for (size_t i = 0; i < TOMBSTONES; i++)
        if (t->tombstones[i] && !strcmp(t->tombstones[i], id))
            return true;
    return false;
}

struct session *session_table_acquire(struct session_table *t, const char *id, int *ret_err)
{
    pthread_mutex_lock(&t->lock);
    wait_retired_locked(t, id);
    struct entry *e = find(t, id);
    struct session *s = NULL;
    if (e) {
        e->refs++;
        s = e->s;
    } else {
        *ret_err = is_tombstone(t, id) ? -ETIME : -ENOENT;
    }
    pthread_mutex_unlock(&t->lock);
    return s;
}

void session_table_put(struct session_table *t, struct session *s)
{
    struct session *to_free = NULL;
    _cleanup_free_ char *id = NULL;
    pthread_mutex_lock(&t->lock);
    struct entry *e = find_session(t, s);
    if (e && --e->refs == 0 && e->removed) {
        id = t->gone ? xstrdup(e->id) : NULL;
        to_free = unlink_entry(t, e);
    }
    void (*gone)(void *, const char *) = t->gone;
    void *gone_ctx = t->gone_ctx;
    pthread_mutex_unlock(&t->lock);
    if (id)
        gone(gone_ctx, id);
    session_free(to_free);
}

void session_table_set_gone(struct session_table *t, void (*fn)(void *ctx, const char *id),
                            void *ctx)
{
    pthread_mutex_lock(&t->lock);
    t->gone = fn;
    t->gone_ctx = ctx;
    pthread_mutex_unlock(&t->lock);
}

static struct session *remove_locked(struct session_table *t, struct entry *e)
{
    e->removed = true;
    t->count--;
    return e->refs == 0 ? unlink_entry(t, e) : NULL;
}

/* Takes e (held by the lock) out of the table and marks it retiring; retire_end ends that. */
static void retire_begin_locked(struct session_table *t, struct entry *e)
{
    e->refs++; /* the entry stays, for those who wait on it */
    e->retiring = true;
    remove_locked(t, e);
}

/* s is retired: wakes those who wait for its record, and drops retire_begin's reference. */
static void retire_end(struct session_table *t, struct session *s)
{
    pthread_mutex_lock(&t->lock);
    find_session(t, s)->retiring = false;
    pthread_cond_broadcast(&t->retired);
    pthread_mutex_unlock(&t->lock);
    session_table_put(t, s);
}

int session_table_remove(struct session_table *t, const char *id)
{
    return session_table_close(t, id, false, NULL);
}

static int close_as(struct session_table *t, const char *id, enum session_end how,
                    json_t **ret_report);

int session_table_close(struct session_table *t, const char *id, bool checkpoint,
                        json_t **ret_report)
{
    return close_as(t, id, checkpoint ? SESSION_END_CHECKPOINT : SESSION_END_CLOSE, ret_report);
}

int session_table_handover(struct session_table *t, const char *id)
{
    return close_as(t, id, SESSION_END_SHUTDOWN, NULL);
}

static int close_as(struct session_table *t, const char *id, enum session_end how,
                    json_t **ret_report)
{
    pthread_mutex_lock(&t->lock);
    wait_retired_locked(t, id); /* one being reaped: what is stored is final, then */
    struct entry *e = find(t, id);
    struct session *s = e ? e->s : NULL;
    if (e) {
        /* A running cell stops now, and nothing queued starts; we hold a reference while
         * the session is retired, and whoever drops the last one frees it. */
        session_cancel_queued(e->s);
        session_interrupt(e->s);
        retire_begin_locked(t, e);
    }
    pthread_mutex_unlock(&t->lock);
    if (!s)
        return -ENOENT;
    session_retire(s, how, ret_report);
    retire_end(t, s);
    return 0;
}

int session_table_drop(struct session_table *t, const char *id)
{
    pthread_mutex_lock(&t->lock);
    struct entry *e = find(t, id);
    struct session *s = e ? e->s : NULL;
    if (e) {
        session_cancel_queued(s);
        session_interrupt(s);
        retire_begin_locked(t, e);
    }
    pthread_mutex_unlock(&t->lock);
    if (!s)
        return -ENOENT;
    /* Outside the table's lock: the fence waits for a save in progress (which its lease
     * check stops before the file list), and nothing is saved after it. */
    session_persist_fence(s);
    session_kill(s);
    retire_end(t, s);
    return 0;
}

void session_table_foreach(struct session_table *t,
                           void (*fn)(void *ctx, const char *id, struct session *s), void *ctx)
{
    pthread_mutex_lock(&t->lock);
    for (struct entry *e = t->head; e; e = e->next)
        if (!e->removed)
            fn(ctx, e->id, e->s);
    pthread_mutex_unlock(&t->lock);
}

size_t session_table_count(struct session_table *t)
{
    pthread_mutex_lock(&t->lock);
    size_t n = t->count;
    pthread_mutex_unlock(&t->lock);
    return n;
}

void session_table_interrupt_all(struct session_table *t)
{
    pthread_mutex_lock(&t->lock);
    for (struct entry *e = t->head; e; e = e->next)
        session_interrupt(e->s);
    pthread_mutex_unlock(&t->lock);
}

void session_table_kill_all(struct session_table *t)
{
    pthread_mutex_lock(&t->lock);
    for (struct entry *e = t->head; e; e = e->next)
        session_kill(e->s);
    pthread_mutex_unlock(&t->lock);
}

/* Removes the sessions idle past their idle timeout; returns how many. */
static int reap_idle(struct session_table *t)
{
    int n = 0;
    for (;;) {
        struct session *victim = NULL;
        struct entry *found = NULL;
        pthread_mutex_lock(&t->lock);
        /* The clock is read for each pass, as retiring the last victim took a while; a
         * session used since it was read is not idle (ms_since). */
        uint64_t now = now_ms();
        for (struct entry *e = t->head; e && !found; e = e->next) {
            if (e->removed || e->refs || session_active(e->s))
                continue;
            uint64_t idle_ms =
                __atomic_load_n(&session_options(e->s)->idle_timeout_ms, __ATOMIC_RELAXED);
            if (ms_since(now, session_last_used_ms(e->s)) >= idle_ms)
                found = e;
        }
        if (found) {
            free(t->tombstones[t->tomb_next]);
            t->tombstones[t->tomb_next] = xstrdup(found->id);
            t->tomb_next = (t->tomb_next + 1) % TOMBSTONES;
            log_info("msg=\"session expired\" session=%s idle_timeout_ms=%llu", found->id,
                     (unsigned long long)session_options(found->s)->idle_timeout_ms);
            victim = found->s;
            retire_begin_locked(t, found);
        }
        pthread_mutex_unlock(&t->lock);
        if (!victim)
            return n;
        /* Nobody else can reach it now: its variables are checkpointed before it goes. */
        session_retire(victim, SESSION_END_IDLE, NULL);
        retire_end(t, victim);
        n++;
    }
}

/* Hibernates the sessions idle past their hibernate_after_ms (one at a time, each held by a
 * reference while its variables go to the store); returns how many. A session that cannot
 * hibernate (no store, a JavaScript one whose variables are not kept) is left as it is and
 * not tried again until it is used. */
static int hibernate_idle(struct session_table *t)
{
    int n = 0;
    for (;;) {
        struct session *s = NULL;
        pthread_mutex_lock(&t->lock);
        uint64_t now = now_ms();
        for (struct entry *e = t->head; e && !s; e = e->next) {
            uint64_t after =
                __atomic_load_n(&session_options(e->s)->hibernate_after_ms, __ATOMIC_RELAXED);
            uint64_t used = session_last_used_ms(e->s);
            if (!after || e->removed || e->refs || session_active(e->s) ||
                session_pause_state(e->s) != PAUSE_NONE || e->hibernate_failed_at == used ||
                ms_since(now, used) < after)
                continue;
            e->refs++;
            e->hibernate_failed_at = used;
            s = e->s;
        }
        pthread_mutex_unlock(&t->lock);
        if (!s)
            return n;
        json_t *report = NULL;
        if (session_pause_idle(s, session_options(s)->pause_keeps_memory, &report) == 0)
            n++;
        else
            log_debug("msg=\"idle session not hibernated\" error=%s", log_quote(err_msg()));
        json_decref(report);
        session_table_put(t, s);
    }
}

/* How long a session is idle before it gives back the descriptors it keeps open only to
 * measure its next execution: a thousand idle sessions hold three thousand fewer. */
#define IDLE_RELEASE_MS 10000

static void release_idle(struct session_table *t)
{
    pthread_mutex_lock(&t->lock);
    for (struct entry *e = t->head; e; e = e->next)
        if (!e->removed)
            session_idle_release(e->s, IDLE_RELEASE_MS);
    pthread_mutex_unlock(&t->lock);
}

static void *reaper_main(void *arg)
{
    struct session_table *t = arg;
    pthread_mutex_lock(&t->lock);
    while (!t->stopping) {
        struct timespec ts;
        realtime_after_ms(&ts, t->reap_interval_ms);
        pthread_cond_timedwait(&t->wake, &t->lock, &ts);
        if (t->stopping)
            break;
        pthread_mutex_unlock(&t->lock);
        reap_idle(t);
        hibernate_idle(t);
        release_idle(t);
        pthread_mutex_lock(&t->lock);
    }
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

int session_table_start_reaper(struct session_table *t, uint64_t interval_ms)
{
    t->reap_interval_ms = interval_ms ? interval_ms : 1000;
    int r = pthread_create(&t->reaper, NULL, reaper_main, t);
    if (r)
        return err_set(r, "cannot start the idle reaper: %s", strerror(r));
    t->reaper_running = true;
    return 0;
}

void session_table_free(struct session_table *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->lock);
    t->stopping = true;
    pthread_cond_broadcast(&t->wake);
    pthread_mutex_unlock(&t->lock);
    if (t->reaper_running)
        pthread_join(t->reaper, NULL);
    /* Kept sessions checkpoint first (their kernels must still run); then every kernel is
     * killed at once, so the namespaces are torn down in parallel, and each is reaped. */
    size_t n = 0;
    struct session **live = xcalloc(t->count + 1, sizeof(*live));
    for (struct entry *e = t->head; e; e = e->next)
        session_cancel_queued(e->s);
    for (struct entry *e = t->head; e; e = e->next)
        if (!e->removed && n < t->count)
            live[n++] = e->s;
    session_retire_all(live, n, SESSION_END_SHUTDOWN, t->retire_workers);
    free(live);
    for (struct entry *e = t->head; e; e = e->next)
        session_kill(e->s);
    while (t->head) {
        struct entry *e = t->head;
        t->head = e->next;
        session_free(e->s);
        free(e->id);
        free(e);
    }
    for (size_t i = 0; i < TOMBSTONES; i++)
        free(t->tombstones[i]);
    free(t->node);
    exec_gate_free(t->gate);
    pthread_cond_destroy(&t->wake);
    pthread_cond_destroy(&t->retired);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

const struct persist_config *session_table_persistence(struct session_table *t)
{
    return t->persist;
}

/* ---- forks ---- */

struct fork_job {
    struct session_table *t;
    const struct session_opts *opts;
    const char *from;
    bool no_persist; /* as the source: a fork of a session that keeps nothing keeps nothing */
    unsigned count;
    atomic_uint next;
    pthread_mutex_t lock;
    json_t *made; /* [{id, restored}] */
    char *error;  /* the first failure */
    int err;
};

static void *fork_worker(void *arg)
{
    struct fork_job *j = arg;
    for (;;) {
        unsigned i = atomic_fetch_add(&j->next, 1);
        pthread_mutex_lock(&j->lock);
        bool stop = i >= j->count || j->err;
        pthread_mutex_unlock(&j->lock);
        if (stop)
            return NULL;
        struct session_create rq = {
            .opts = j->opts, .resume_from = j->from, .no_persist = j->no_persist};
        char *id = NULL;
        json_t *restored = NULL;
        int r = session_table_create_ex(j->t, &rq, &id, &restored);
        pthread_mutex_lock(&j->lock);
        if (r < 0 && !j->err) {
            j->err = r;
            j->error = xstrdup(err_msg());
        } else if (r == 0) {
            json_object_del(restored, "from"); /* the export's id, gone once they are made */
            json_array_append_new(j->made, json_pack("{s:s,s:o}", "id", id, "restored", restored));
        }
        pthread_mutex_unlock(&j->lock);
        free(id);
    }
}

int session_table_fork(struct session_table *t, const char *src_id, unsigned count,
                       json_t **ret_forks)
{
    if (count < 1 || count > SESSION_FORK_MAX)
        return err_set(EINVAL, "a fork makes 1 to %d sessions, not %u", SESSION_FORK_MAX, count);
    if (!t->persist || !t->persist->store)
        return err_set(EINVAL, "this server keeps no store: a fork goes through one");
    pthread_mutex_lock(&t->lock);
    bool room = !t->max_sessions || t->count + count <= t->max_sessions;
    size_t live = t->count;
    pthread_mutex_unlock(&t->lock);
    if (!room)
        return err_set(EAGAIN,
                       "a fork into %u would pass the server's maximum of %zu live sessions "
                       "(%zu live); close some, or fork into fewer",
                       count, t->max_sessions, live);
    int err;
    struct session *src = session_table_acquire(t, src_id, &err);
    if (!src)
        return err_set(-err, "no live session %s to fork", src_id);
    _cleanup_free_ char *tmp = random_hex(16);
    json_t *report = NULL;
    int r = session_export(src, t->persist, tmp, &report);
    if (r < 0) {
        session_table_put(t, src);
        return r;
    }
    json_decref(report);
    /* The forks' options are the source's own (borrowed while it is held), their network the
     * one it has now: run-time changes and secrets included. */
    struct session_opts opts = *session_options(src);
    opts.files = NULL;
    opts.n_files = 0;
    struct net_policy *net;
    struct net_secrets *secrets;
    session_network_copy(src, &net, &secrets);
    opts.net.policy = net;
    opts.net.secrets = secrets;
    struct fork_job j = {.t = t,
                         .opts = &opts,
                         .from = tmp,
                         .no_persist = !session_stores_files(src),
                         .count = count,
                         .made = json_array()};
    pthread_mutex_init(&j.lock, NULL);
    pthread_t th[4];
    unsigned n = count < 4 ? count : 4, started = 0;
    for (unsigned i = 0; i < n; i++)
        if (pthread_create(&th[started], NULL, fork_worker, &j) == 0)
            started++;
    if (!started)
        fork_worker(&j);
    for (unsigned i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    session_table_put(t, src);
    net_policy_free(net);
    net_secrets_free(secrets);
    store_discard(t->persist->store, tmp);
    pthread_mutex_destroy(&j.lock);
    if (j.err) {
        /* All or none: the forks made go again. */
        size_t i;
        json_t *f;
        json_array_foreach(j.made, i, f)
            session_table_remove(t, json_string_value(json_object_get(f, "id")));
        json_decref(j.made);
        err_set(-j.err, "the fork failed after %zu of %u: %s", i, count, j.error);
        free(j.error);
        return -j.err;
    }
    *ret_forks = j.made;
    return 0;
}
