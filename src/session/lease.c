/* lease.c - a fleet's shared session records and leases: which node runs a session, kept in
 * the shared store as sessions/ID/lease.json and changed only by compare-and-swap, renewed
 * while held, so that two nodes never run one session and a successor can resume it. */
#include "session/session-int.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#define RECORD_MAX    (256u << 10) /* a record is options and a checkpoint summary */
#define CLOCK_SKEW_MS 1000         /* between nodes' wall clocks, at most */
#define NODE_NAME_MAX 32
#define MIN_TTL_MS    1000
/* A hand-back waits for the holder's next renewal (a third of the ttl) and its checkpoint. */
#define HANDBACK_EXTRA_MS 30000
#define HANDBACK_POLL_MS  100

struct lease {
    char *id;
    char version[STORE_VERSION_SIZE];
    json_t *record;            /* as last written */
    uint64_t valid_until_mono; /* the holder's side of the lease: shorter than the record's */
    bool lost;                 /* another node took it (or the record went) */
    struct lease *next;
};

struct fleet {
    struct store *store;
    char *node;
    char *instance; /* this process: a restarted node knows its previous life's leases */
    uint64_t ttl_ms;
    pthread_mutex_t lock;    /* held, and each lease's fields */
    pthread_mutex_t io_lock; /* one write of a record at a time, in this process */
    pthread_mutex_t cb_lock; /* on_lost, and its calls */
    pthread_cond_t wake;
    pthread_t renewer;
    bool running, stopping;
    struct lease *held;
    void (*on_lost)(void *ctx, const char *id, bool handback);
    void *on_lost_ctx;
};

bool node_name_valid(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n < 1 || n > NODE_NAME_MAX || name[0] == '-' || name[n - 1] == '-')
        return false;
    return strspn(name, "abcdefghijklmnopqrstuvwxyz0123456789-") == n;
}

char *session_id_node(const char *id)
{
    const char *dash = id ? strrchr(id, '-') : NULL;
    if (!dash)
        return NULL;
    char *node = xstrndup(id, (size_t)(dash - id));
    if (!node_name_valid(node)) {
        free(node);
        return NULL;
    }
    return node;
}

static char *lease_key(const char *id)
{
    return xasprintf("sessions/%s/lease.json", id);
}

static struct lease *find_locked(struct fleet *f, const char *id)
{
    for (struct lease *l = f->held; l; l = l->next)
        if (!strcmp(l->id, id))
            return l;
    return NULL;
}

/* The record as it is to be written now: held by this node until now + ttl. */
static void stamp(struct fleet *f, json_t *rec, const char *state)
{
    _cleanup_free_ char *nonce = random_hex(8);
    uint64_t now = now_realtime_ms();
    json_object_set_new(rec, "node", json_string(f->node));
    json_object_set_new(rec, "instance", json_string(f->instance));
    json_object_set_new(rec, "state", json_string(state));
    json_object_set_new(rec, "expires_ms",
                        json_integer(strcmp(state, "live") ? 0 : (json_int_t)(now + f->ttl_ms)));
    json_object_set_new(rec, "updated_ms", json_integer((json_int_t)now));
    json_object_set_new(rec, "nonce", json_string(nonce));
}

/* Writes rec over version (NULL: only if absent); 0 with ret_version, -ESTALE, -errno. */
static int write_record(struct fleet *f, const char *id, json_t *rec, const char *version,
                        char ret_version[STORE_VERSION_SIZE])
{
    _cleanup_free_ char *key = lease_key(id);
    _cleanup_free_ char *text = json_dumps(rec, JSON_COMPACT | JSON_SORT_KEYS);
    if (!text)
        return err_set(ENOMEM, "cannot write the record of session %s", id);
    return store_put_if(f->store, key, text, strlen(text), version, ret_version);
}

static int read_record(struct fleet *f, const char *id, json_t **ret,
                       char ret_version[STORE_VERSION_SIZE])
{
    _cleanup_free_ char *key = lease_key(id);
    char *text = NULL;
    size_t n;
    int r = store_get_versioned(f->store, key, RECORD_MAX, &text, &n, ret_version);
    if (r < 0)
        return r;
    json_error_t e;
    json_t *j = json_loadb(text, n, 0, &e);
    free(text);
    if (!json_is_object(j)) {
        json_decref(j);
        return err_set(EBADMSG, "the record of session %s in the store is not a JSON object", id);
    }
    *ret = j;
    return 0;
}

/* Registers a lease just written at version; the caller holds no lock. */
static void hold(struct fleet *f, const char *id, json_t *rec, const char *version,
                 uint64_t sent_mono)
{
    struct lease *l = xcalloc(1, sizeof(*l));
    l->id = xstrdup(id);
    l->record = rec;
    memcpy(l->version, version, STORE_VERSION_SIZE);
    /* The holder stops a third of the ttl before the record's expiry: a successor waits for
     * that expiry (and the clock skew), so their times to run never overlap. */
    l->valid_until_mono = sent_mono + f->ttl_ms - f->ttl_ms / 3;
    pthread_mutex_lock(&f->lock);
    l->next = f->held;
    f->held = l;
    pthread_mutex_unlock(&f->lock);
}

int fleet_lease_new(struct fleet *f, const char *id, const char *options_json)
{
    json_t *opts = options_json ? json_loads(options_json, 0, NULL) : NULL;
    json_t *rec = json_pack("{s:s,s:I,s:I,s:o,s:n}", "id", id, "generation", (json_int_t)1,
                            "created_ms", (json_int_t)now_realtime_ms(), "options",
                            opts ? opts : json_object(), "checkpoint");
    char version[STORE_VERSION_SIZE];
    stamp(f, rec, "live");
    uint64_t sent = now_ms();
    pthread_mutex_lock(&f->io_lock);
    int r = write_record(f, id, rec, NULL, version);
    pthread_mutex_unlock(&f->io_lock);
    if (r < 0) {
        json_decref(rec);
        return r == -ESTALE ? err_set(EEXIST, "session %s exists in the store already", id) : r;
    }
    hold(f, id, rec, version, sent);
    return 0;
}

long long fleet_lease_generation(struct fleet *f, const char *id)
{
    pthread_mutex_lock(&f->lock);
    struct lease *l = find_locked(f, id);
    long long g = l && !l->lost ? json_integer_value(json_object_get(l->record, "generation")) : 0;
    pthread_mutex_unlock(&f->lock);
    return g;
}

int fleet_lease_state(struct fleet *f, const char *id)
{
    pthread_mutex_lock(&f->lock);
    struct lease *l = find_locked(f, id);
    int r = !l || l->lost ? -EXDEV : now_ms() >= l->valid_until_mono ? -ENOLCK : 0;
    pthread_mutex_unlock(&f->lock);
    if (r == -EXDEV)
        return err_set(EXDEV, "session %s moved to another node: this node no longer holds it", id);
    if (r == -ENOLCK)
        return err_set(ENOLCK,
                       "this node could not renew its lease on session %s in the store; "
                       "try again when the store answers",
                       id);
    return 0;
}

/* Whether the stored record lets this node take the session now; else *ret_wait_ms says for
 * how long it is held (0: held by a live lease that will not end soon enough to wait). */
static bool takeable(struct fleet *f, json_t *rec, uint64_t *ret_wait_ms)
{
    const char *state = json_string_value(json_object_get(rec, "state"));
    const char *node = json_string_value(json_object_get(rec, "node"));
    const char *inst = json_string_value(json_object_get(rec, "instance"));
    uint64_t expires = (uint64_t)json_integer_value(json_object_get(rec, "expires_ms"));
    uint64_t now = now_realtime_ms();
    *ret_wait_ms = 0;
    if (!state || strcmp(state, "live"))
        return true; /* released: it ended with its state stored */
    /* This node's earlier process (before a crash or restart) cannot run it any more. */
    if (node && !strcmp(node, f->node) && inst && strcmp(inst, f->instance))
        return true;
    if (now >= expires + CLOCK_SKEW_MS)
        return true;
    *ret_wait_ms = expires + CLOCK_SKEW_MS - now;
    return false;
}

/* Asks the holder of rec (at version) to hand id back to this node, its home: the holder's
 * next renewal sees handback_to, checkpoints the session and releases the lease. */
static int ask_back(struct fleet *f, const char *id, json_t *rec, const char *version)
{
    const char *to = json_string_value(json_object_get(rec, "handback_to"));
    char nv[STORE_VERSION_SIZE];
    if (to && !strcmp(to, f->node))
        return 0; /* asked already */
    json_t *ask = json_deep_copy(rec);
    json_object_set_new(ask, "handback_to", json_string(f->node));
    pthread_mutex_lock(&f->io_lock);
    int r = write_record(f, id, ask, version, nv);
    pthread_mutex_unlock(&f->io_lock);
    json_decref(ask);
    if (r == 0)
        log_info("msg=\"asked for a session back\" session=%s holder=%s", id,
                 json_string_value(json_object_get(rec, "node")));
    return r;
}

int fleet_lease_take(struct fleet *f, const char *id, json_t **ret_record)
{
    uint64_t deadline = now_ms() + f->ttl_ms + 2 * CLOCK_SKEW_MS;
    /* A node that comes back asks for its sessions back rather than waiting on a lease that
     * the successor renews: the id names it, so the router sends them to it. */
    _cleanup_free_ char *home_node = session_id_node(id);
    bool home = home_node && !strcmp(home_node, f->node);
    uint64_t handback_deadline = now_ms() + f->ttl_ms + HANDBACK_EXTRA_MS;
    for (;;) {
        json_t *rec = NULL;
        char version[STORE_VERSION_SIZE], nv[STORE_VERSION_SIZE];
        uint64_t wait = 0;
        int r = read_record(f, id, &rec, version);
        if (r < 0)
            return r;
        const char *state = json_string_value(json_object_get(rec, "state"));
        if (state && strcmp(state, "live") && strcmp(state, "stopped")) {
            /* It ended on purpose (expired, closed with a checkpoint): not a takeover. */
            json_decref(rec);
            return err_set(ENOENT, "session %s %s", id, state);
        }
        if (!takeable(f, rec, &wait)) {
            const char *node = json_string_value(json_object_get(rec, "node"));
            _cleanup_free_ char *holder = xstrdup(node ? node : "?");
            if (home) {
                r = ask_back(f, id, rec, version);
                json_decref(rec);
                if (r < 0 && r != -ESTALE)
                    return r;
                if (now_ms() >= handback_deadline)
                    return err_set(EBUSY,
                                   "session %s runs on node %s, which did not hand it back in "
                                   "time; try again",
                                   id, holder);
                struct timespec poll_ts = {.tv_nsec = HANDBACK_POLL_MS * 1000000L};
                nanosleep(&poll_ts, NULL); /* the holder's next renewal sees the request */
                continue;
            }
            json_decref(rec);
            if (now_ms() + wait > deadline)
                return err_set(EBUSY,
                               "session %s is running on node %s, which holds its lease and "
                               "renews it; send the request to that node",
                               id, holder);
            struct timespec ts = {.tv_sec = (time_t)(wait / 1000),
                                  .tv_nsec = (long)(wait % 1000) * 1000000L};
            nanosleep(&ts, NULL); /* the lease's expiry is the event waited for */
            continue;
        }
        json_t *prev_node = json_object_get(rec, "node");
        json_object_set(rec, "previous_node", prev_node ? prev_node : json_null());
        json_object_set_new(
            rec, "generation",
            json_integer(json_integer_value(json_object_get(rec, "generation")) + 1));
        stamp(f, rec, "live");
        uint64_t sent = now_ms();
        pthread_mutex_lock(&f->io_lock);
        r = write_record(f, id, rec, version, nv);
        pthread_mutex_unlock(&f->io_lock);
        if (r == -ESTALE) { /* another node moved first: see who holds it now */
            json_decref(rec);
            continue;
        }
        if (r < 0) {
            json_decref(rec);
            return r;
        }
        hold(f, id, json_incref(rec), nv, sent);
        *ret_record = rec;
        log_info("msg=\"session taken over\" session=%s from_node=%s generation=%lld", id,
                 json_string_value(prev_node) ? json_string_value(prev_node) : "?",
                 (long long)json_integer_value(json_object_get(rec, "generation")));
        return 0;
    }
}

/* Takes l out of the held list; the caller frees it. */
static struct lease *unhold(struct fleet *f, const char *id)
{
    pthread_mutex_lock(&f->lock);
    struct lease *l = NULL;
    for (struct lease **p = &f->held; *p; p = &(*p)->next) {
        if (!strcmp((*p)->id, id)) {
            l = *p;
            *p = l->next;
            break;
        }
    }
    pthread_mutex_unlock(&f->lock);
    return l;
}

static void lease_free(struct lease *l)
{
    if (!l)
        return;
    json_decref(l->record);
    free(l->id);
    free(l);
}

/* Whether rec (just read) is still this process's own lease at generation gen: another
 * writer changed only what a holder keeps (a hand-back request). */
static bool still_mine(struct fleet *f, json_t *rec, json_int_t gen)
{
    const char *node = json_string_value(json_object_get(rec, "node"));
    const char *inst = json_string_value(json_object_get(rec, "instance"));
    const char *state = json_string_value(json_object_get(rec, "state"));
    return node && inst && state && !strcmp(node, f->node) && !strcmp(inst, f->instance) &&
           !strcmp(state, "live") && json_integer_value(json_object_get(rec, "generation")) == gen;
}

/* After a lost compare-and-swap on l: adopts the stored record when it is still ours (with
 * the hand-back request that changed it), else marks l lost. true when adopted. Holds
 * io_lock. */
static bool reread(struct fleet *f, const char *id)
{
    json_t *rec = NULL;
    char version[STORE_VERSION_SIZE];
    bool mine = false;
    int r = read_record(f, id, &rec, version);
    pthread_mutex_lock(&f->lock);
    struct lease *l = find_locked(f, id);
    if (l && r == 0 &&
        still_mine(f, rec, json_integer_value(json_object_get(l->record, "generation")))) {
        json_decref(l->record);
        l->record = json_incref(rec);
        memcpy(l->version, version, STORE_VERSION_SIZE);
        mine = true;
    } else if (l && (r == 0 || r == -ENOENT)) {
        l->lost = true; /* taken, or deleted by whoever closed it */
    }
    pthread_mutex_unlock(&f->lock);
    json_decref(rec);
    return mine;
}

/* One compare-and-swap of l's record as state says; 0, -ESTALE, -EXDEV, -errno. */
static int update_once(struct fleet *f, const char *id, const char *state, json_t *checkpoint)
{
    pthread_mutex_lock(&f->lock);
    struct lease *l = find_locked(f, id);
    json_t *rec = l && !l->lost ? json_deep_copy(l->record) : NULL;
    char version[STORE_VERSION_SIZE], nv[STORE_VERSION_SIZE];
    if (l)
        memcpy(version, l->version, STORE_VERSION_SIZE);
    pthread_mutex_unlock(&f->lock);
    if (!rec)
        return err_set(EXDEV, "session %s is not held by this node", id);
    if (checkpoint)
        json_object_set(rec, "checkpoint", checkpoint);
    if (strcmp(state, "live"))
        json_object_del(rec, "handback_to"); /* released: whoever asked may take it */
    stamp(f, rec, state);
    uint64_t sent = now_ms();
    int r = write_record(f, id, rec, version, nv);
    pthread_mutex_lock(&f->lock);
    if (r == 0 && (l = find_locked(f, id))) {
        json_decref(l->record);
        l->record = json_incref(rec);
        memcpy(l->version, nv, STORE_VERSION_SIZE);
        l->valid_until_mono = sent + f->ttl_ms - f->ttl_ms / 3;
    }
    pthread_mutex_unlock(&f->lock);
    json_decref(rec);
    return r;
}

int fleet_lease_update(struct fleet *f, const char *id, const char *state, json_t *checkpoint)
{
    pthread_mutex_lock(&f->io_lock);
    int r = update_once(f, id, state, checkpoint);
    if (r == -ESTALE)
        r = reread(f, id) ? update_once(f, id, state, checkpoint) : -EXDEV;
    if (r == -ESTALE) {
        reread(f, id);
        r = -EXDEV;
    }
    char *asker = NULL;
    pthread_mutex_lock(&f->lock);
    struct lease *l = find_locked(f, id);
    const char *to =
        l && !l->lost ? json_string_value(json_object_get(l->record, "handback_to")) : NULL;
    if (to && !strcmp(state, "live"))
        asker = xstrdup(to);
    pthread_mutex_unlock(&f->lock);
    pthread_mutex_unlock(&f->io_lock);
    if (r == -EXDEV)
        return err_set(EXDEV, "session %s moved to another node: its record changed", id);
    if (r == 0 && asker) {
        err_set(ECANCELED, "node %s asks for session %s back", asker, id);
        free(asker);
        return -ECANCELED;
    }
    free(asker);
    return r;
}

void fleet_lease_release(struct fleet *f, const char *id, const char *how, json_t *checkpoint)
{
    if (how && fleet_lease_update(f, id, how, checkpoint) < 0)
        log_warn("msg=\"cannot release the session's lease\" session=%s error=%s", id,
                 log_quote(err_msg()));
    lease_free(unhold(f, id));
}

/* One round of renewals; returns the ids found lost, and in *handbacks those their home
 * node asks back (NULL-terminated, caller frees). */
static char **renew_all(struct fleet *f, char ***handbacks)
{
    char **ids = xcalloc(1, sizeof(char *)), **lost = xcalloc(1, sizeof(char *));
    *handbacks = xcalloc(1, sizeof(char *));
    pthread_mutex_lock(&f->lock);
    for (struct lease *l = f->held; l; l = l->next)
        if (!l->lost)
            ids = strv_push(ids, l->id);
    pthread_mutex_unlock(&f->lock);
    for (char **id = ids; *id; id++) {
        int r = fleet_lease_update(f, *id, "live", NULL);
        if (r == -EXDEV)
            lost = strv_push(lost, *id);
        else if (r == -ECANCELED)
            *handbacks = strv_push(*handbacks, *id);
        else if (r < 0)
            log_warn("msg=\"cannot renew a lease\" session=%s error=%s", *id, log_quote(err_msg()));
    }
    strv_free(ids);
    return lost;
}

static void *renewer_main(void *arg)
{
    struct fleet *f = arg;
    pthread_mutex_lock(&f->lock);
    while (!f->stopping) {
        struct timespec ts;
        realtime_after_ms(&ts, f->ttl_ms / 3);
        pthread_cond_timedwait(&f->wake, &f->lock, &ts);
        if (f->stopping)
            break;
        pthread_mutex_unlock(&f->lock);
        char **handbacks, **lost = renew_all(f, &handbacks);
        pthread_mutex_lock(&f->cb_lock);
        void (*on_lost)(void *, const char *, bool) = f->on_lost;
        for (char **id = lost; *id; id++) {
            log_warn("msg=\"session moved to another node; dropping it here\" session=%s", *id);
            if (on_lost)
                on_lost(f->on_lost_ctx, *id, false);
        }
        for (char **id = handbacks; *id; id++) {
            log_info("msg=\"handing a session back to its node\" session=%s", *id);
            if (on_lost)
                on_lost(f->on_lost_ctx, *id, true);
        }
        pthread_mutex_unlock(&f->cb_lock);
        strv_free(handbacks);
        strv_free(lost);
        pthread_mutex_lock(&f->lock);
    }
    pthread_mutex_unlock(&f->lock);
    return NULL;
}

int fleet_new(struct store *st, const char *node, uint64_t ttl_ms, struct fleet **ret)
{
    if (!node_name_valid(node))
        return err_set(EINVAL,
                       "node name '%s' is not a short DNS label (1 to %d of a-z, 0-9 and '-', "
                       "not starting or ending with '-')",
                       node ? node : "", NODE_NAME_MAX);
    if (ttl_ms < MIN_TTL_MS)
        return err_set(EINVAL, "a lease ttl under %d ms leaves no time to renew it", MIN_TTL_MS);
    int r = store_check_conditional(st, node);
    if (r < 0)
        return r;
    struct fleet *f = xcalloc(1, sizeof(*f));
    f->store = st;
    f->node = xstrdup(node);
    f->instance = random_hex(8);
    f->ttl_ms = ttl_ms;
    pthread_mutex_init(&f->lock, NULL);
    pthread_mutex_init(&f->io_lock, NULL);
    pthread_mutex_init(&f->cb_lock, NULL);
    pthread_cond_init(&f->wake, NULL);
    *ret = f;
    return 0;
}

int fleet_start(struct fleet *f, void (*on_lost)(void *ctx, const char *id, bool handback),
                void *ctx)
{
    f->on_lost = on_lost;
    f->on_lost_ctx = ctx;
    int r = pthread_create(&f->renewer, NULL, renewer_main, f);
    if (r)
        return err_set(r, "cannot start the lease renewer: %s", strerror(r));
    f->running = true;
    return 0;
}

const char *fleet_node(const struct fleet *f)
{
    return f->node;
}

uint64_t fleet_ttl_ms(const struct fleet *f)
{
    return f->ttl_ms;
}

void fleet_quiesce(struct fleet *f)
{
    if (!f)
        return;
    pthread_mutex_lock(&f->cb_lock);
    f->on_lost = NULL;
    pthread_mutex_unlock(&f->cb_lock);
}

void fleet_stop(struct fleet *f)
{
    if (!f || !f->running)
        return;
    pthread_mutex_lock(&f->lock);
    f->stopping = true;
    pthread_cond_broadcast(&f->wake);
    pthread_mutex_unlock(&f->lock);
    pthread_join(f->renewer, NULL);
    f->running = false;
}

void fleet_free(struct fleet *f)
{
    if (!f)
        return;
    fleet_stop(f);
    while (f->held) {
        struct lease *l = f->held;
        f->held = l->next;
        lease_free(l);
    }
    pthread_cond_destroy(&f->wake);
    pthread_mutex_destroy(&f->io_lock);
    pthread_mutex_destroy(&f->cb_lock);
    pthread_mutex_destroy(&f->lock);
    free(f->instance);
    free(f->node);
    free(f);
}
