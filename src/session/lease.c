/* lease.c - a fleet's session records: which node owns a session, kept in the shared store as
 * sessions/ID/lease.json, tied to the owner's node lease (node.c) by its epoch and changed
 * only by compare-and-swap, so that two nodes never run one session and a successor can
 * resume it; and the lookups that send a request to the node that owns its session. */
#include "session/fleet-int.h"

#include <errno.h>
#include <string.h>
#include <time.h>

#define RECORD_MAX (256u << 10) /* a record is options and a checkpoint summary */

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

static const char *str_of(json_t *rec, const char *key)
{
    return json_string_value(json_object_get(rec, key));
}

/* The record as it is to be written now: owned by this node at its epoch. */
static void stamp(struct fleet *f, json_t *rec, const char *state, long long epoch)
{
    json_object_set_new(rec, "node", json_string(f->node));
    json_object_set_new(rec, "epoch", json_integer(epoch));
    json_object_set_new(rec, "instance", json_string(f->instance));
    json_object_set_new(rec, "state", json_string(state));
    json_object_set_new(rec, "updated_ms", json_integer((json_int_t)now_realtime_ms()));
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
    json_t *j = json_loadb(text, n, 0, NULL);
    free(text);
    if (!json_is_object(j)) {
        json_decref(j);
        return err_set(EBADMSG, "the record of session %s in the store is not a JSON object", id);
    }
    *ret = j;
    return 0;
}

/* Registers a record just written at version. */
static void hold(struct fleet *f, const char *id, json_t *rec, const char *version)
{
    struct lease *l = xcalloc(1, sizeof(*l));
    l->id = xstrdup(id);
    l->record = rec;
    memcpy(l->version, version, STORE_VERSION_SIZE);
    pthread_mutex_lock(&f->lock);
    l->next = f->held;
    f->held = l;
    pthread_mutex_unlock(&f->lock);
}

/* The epoch to write under, or 0 with err_msg() when the node may not write now. */
static long long writing_epoch(struct fleet *f)
{
    const char *why;
    if (!fleet_admitting(f, &why)) {
        err_set(ENOLCK, "%s", why);
        return 0;
    }
    return fleet_epoch(f);
}

int fleet_lease_new(struct fleet *f, const char *id, const char *options_json)
{
    long long epoch = writing_epoch(f);
    if (!epoch)
        return -ENOLCK;
    json_t *opts = options_json ? json_loads(options_json, 0, NULL) : NULL;
    json_t *rec = json_pack("{s:s,s:I,s:I,s:o,s:n}", "id", id, "generation", (json_int_t)1,
                            "created_ms", (json_int_t)now_realtime_ms(), "options",
                            opts ? opts : json_object(), "checkpoint");
    char version[STORE_VERSION_SIZE];
    stamp(f, rec, "live", epoch);
    int r = write_record(f, id, rec, NULL, version);
    if (r < 0) {
        json_decref(rec);
        return r == -ESTALE ? err_set(EEXIST, "session %s exists in the store already", id) : r;
    }
    hold(f, id, rec, version);
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
    const char *why;
    pthread_mutex_lock(&f->lock);
    struct lease *l = find_locked(f, id);
    bool held = l && !l->lost;
    pthread_mutex_unlock(&f->lock);
    if (!held)
        return err_set(EXDEV, "session %s moved to another node: this node no longer holds it", id);
    if (!fleet_admitting(f, &why))
        return err_set(ENOLCK, "%s", why);
    return 0;
}

/* ---- who owns a session ---- */

static bool holds(struct fleet *f, const char *id)
{
    pthread_mutex_lock(&f->lock);
    struct lease *l = find_locked(f, id);
    bool held = l && !l->lost;
    pthread_mutex_unlock(&f->lock);
    return held;
}

/* Classifies rec for this node; the owner's lease in *v (read, cached unless fresh). For
 * OWNER_REMOTE, *ret_wait_ms says how long until its lease expires with the skew allowance. */
static int classify(struct fleet *f, const char *id, json_t *rec, bool fresh,
                    struct fleet_owner *ret, uint64_t *ret_wait_ms)
{
    const char *state = str_of(rec, "state"), *node = str_of(rec, "node");
    long long epoch = json_integer_value(json_object_get(rec, "epoch"));
    memset(ret, 0, sizeof(*ret));
    *ret_wait_ms = 0;
    snprintf(ret->node, sizeof(ret->node), "%s", node ? node : "");
    ret->epoch = epoch;
    if (!state || (strcmp(state, "live") && strcmp(state, "stopped"))) {
        ret->kind = OWNER_NONE; /* it ended on purpose (expired, checkpointed): no takeover */
        return 0;
    }
    if (!strcmp(state, "stopped") || !node) {
        ret->kind = OWNER_TAKEABLE; /* released with its state stored */
        return 0;
    }
    if (!strcmp(node, f->node)) {
        /* Held here, or this node's at an earlier epoch (or dropped): this node may take it. */
        ret->kind = holds(f, id) ? OWNER_HERE : OWNER_TAKEABLE;
        return 0;
    }
    struct node_view v;
    int r = fleet_node_view(f, node, fresh, &v);
    if (r < 0)
        return r;
    uint64_t now = now_realtime_ms();
    if (!v.present || v.released || v.epoch != epoch || now >= v.expires_ms + FLEET_CLOCK_SKEW_MS) {
        /* Gone: but a cached view may be older than the record; only a fresh one decides. */
        if (!fresh)
            return classify(f, id, rec, true, ret, ret_wait_ms);
        ret->kind = OWNER_TAKEABLE;
        return 0;
    }
    ret->kind = OWNER_REMOTE;
    snprintf(ret->address, sizeof(ret->address), "%s", v.address);
    *ret_wait_ms = v.expires_ms + FLEET_CLOCK_SKEW_MS - now;
    return 0;
}

int fleet_lookup(struct fleet *f, const char *id, bool fresh, struct fleet_owner *ret)
{
    json_t *rec = NULL;
    char version[STORE_VERSION_SIZE];
    uint64_t wait;
    int r = read_record(f, id, &rec, version);
    if (r == -ENOENT) {
        memset(ret, 0, sizeof(*ret));
        ret->kind = OWNER_NONE;
        return 0;
    }
    if (r < 0)
        return r;
    r = classify(f, id, rec, fresh, ret, &wait);
    json_decref(rec);
    return r;
}

int fleet_node_address(struct fleet *f, const char *node, char ret_address[272])
{
    struct node_view v;
    int r = fleet_node_view(f, node, false, &v);
    if (r < 0)
        return r;
    if (!v.present || v.released || now_realtime_ms() >= v.expires_ms + FLEET_CLOCK_SKEW_MS ||
        !*v.address)
        return -ENOENT;
    memcpy(ret_address, v.address, sizeof(v.address));
    return 0;
}

/* ---- taking over ---- */

/* Registers a takeover of id by this node; false after waiting for one already going. */
static bool taking_begin(struct fleet *f, const char *id)
{
    bool waited = false;
    pthread_mutex_lock(&f->lock);
    for (;;) {
        struct taking *t = f->takings;
        while (t && strcmp(t->id, id))
            t = t->next;
        if (!t)
            break;
        waited = true;
        pthread_cond_wait(&f->taken, &f->lock);
    }
    if (!waited) {
        struct taking *t = xcalloc(1, sizeof(*t));
        t->id = xstrdup(id);
        t->next = f->takings;
        f->takings = t;
    }
    pthread_mutex_unlock(&f->lock);
    return !waited;
}

void fleet_lease_taken(struct fleet *f, const char *id)
{
    pthread_mutex_lock(&f->lock);
    for (struct taking **p = &f->takings; *p; p = &(*p)->next) {
        if (!strcmp((*p)->id, id)) {
            struct taking *t = *p;
            *p = t->next;
            free(t->id);
            free(t);
            break;
        }
    }
    pthread_cond_broadcast(&f->taken);
    pthread_mutex_unlock(&f->lock);
}

/* One try: 0 taken (*ret_record), 1 to try again after *ret_wait_ms, -errno. */
static int take_once(struct fleet *f, const char *id, uint64_t deadline, json_t **ret_record,
                     uint64_t *ret_wait_ms, char waited_for[48])
{
    json_t *rec = NULL;
    char version[STORE_VERSION_SIZE], nv[STORE_VERSION_SIZE];
    struct fleet_owner o;
    int r = read_record(f, id, &rec, version);
    if (r < 0)
        return r;
    if ((r = classify(f, id, rec, true, &o, ret_wait_ms)) < 0)
        goto out;
    if (o.kind == OWNER_NONE) {
        r = err_set(ENOENT, "session %s %s", id, str_of(rec, "state"));
        goto out;
    }
    if (o.kind == OWNER_HERE) {
        r = -EALREADY;
        goto out;
    }
    if (o.kind == OWNER_REMOTE) {
        /* The owner waited for is not the one that holds it now (another node took it over
         * meanwhile, and renews it): that one serves the request. */
        char who[48];
        snprintf(who, sizeof(who), "%s/%lld", o.node, o.epoch);
        bool other = *waited_for && strcmp(waited_for, who);
        if (!*waited_for)
            snprintf(waited_for, 48, "%s", who);
        if (other || now_ms() + *ret_wait_ms > deadline)
            r = err_set(EBUSY,
                        "session %s is running on node %s (%s), which holds its lease and renews "
                        "it; send the request to that node",
                        id, o.node, o.address);
        else
            r = 1; /* its owner's lease expiry is the event waited for */
        goto out;
    }
    long long epoch = writing_epoch(f);
    if (!epoch) {
        r = -ENOLCK;
        goto out;
    }
    json_t *prev_node = json_object_get(rec, "node");
    json_object_set(rec, "previous_node", prev_node ? prev_node : json_null());
    json_object_set_new(rec, "generation",
                        json_integer(json_integer_value(json_object_get(rec, "generation")) + 1));
    stamp(f, rec, "live", epoch);
    r = write_record(f, id, rec, version, nv);
    if (r == -ESTALE) { /* another node moved first: see who holds it now */
        *ret_wait_ms = 0;
        r = 1;
        goto out;
    }
    if (r < 0)
        goto out;
    hold(f, id, json_incref(rec), nv);
    log_info("msg=\"session taken over\" session=%s from_node=%s generation=%lld epoch=%lld", id,
             json_string_value(prev_node) ? json_string_value(prev_node) : "?",
             (long long)json_integer_value(json_object_get(rec, "generation")), epoch);
    *ret_record = rec;
    return 0;
out:
    json_decref(rec);
    return r;
}

int fleet_lease_take(struct fleet *f, const char *id, bool wait_for_owner, json_t **ret_record)
{
    if (!taking_begin(f, id))
        return -EALREADY;
    uint64_t deadline = now_ms() + (wait_for_owner ? f->ttl_ms + 2 * FLEET_CLOCK_SKEW_MS : 0);
    char waited_for[48] = "";
    for (;;) {
        uint64_t wait = 0;
        int r = take_once(f, id, deadline, ret_record, &wait, waited_for);
        if (r <= 0) {
            if (r < 0)
                fleet_lease_taken(f, id);
            return r;
        }
        wait = MIN(wait, f->ttl_ms / 3);
        struct timespec ts = {.tv_sec = (time_t)(wait / 1000),
                              .tv_nsec = (long)(wait % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* ---- the records this node holds ---- */

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

/* Whether rec (just read) is still this node's record of generation gen at its epoch. */
static bool still_mine(struct fleet *f, json_t *rec, json_int_t gen, long long epoch)
{
    const char *node = str_of(rec, "node"), *state = str_of(rec, "state");
    return node && state && !strcmp(node, f->node) && !strcmp(state, "live") &&
           json_integer_value(json_object_get(rec, "epoch")) == epoch &&
           json_integer_value(json_object_get(rec, "generation")) == gen;
}

/* One compare-and-swap of id's record as state says; 0, -ESTALE, -EXDEV, -ENOLCK, -errno. */
static int update_once(struct fleet *f, const char *id, const char *state, json_t *checkpoint,
                       json_t *options)
{
    long long epoch = writing_epoch(f);
    if (!epoch)
        return -ENOLCK;
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
    if (options)
        json_object_set(rec, "options", options);
    stamp(f, rec, state, epoch);
    int r = write_record(f, id, rec, version, nv);
    pthread_mutex_lock(&f->lock);
    if (r == 0 && (l = find_locked(f, id))) {
        json_decref(l->record);
        l->record = json_incref(rec);
        memcpy(l->version, nv, STORE_VERSION_SIZE);
    }
    pthread_mutex_unlock(&f->lock);
    json_decref(rec);
    return r;
}

/* After a lost compare-and-swap: adopts the stored record when it is still ours, else marks
 * id lost. true when adopted. */
static bool reread(struct fleet *f, const char *id)
{
    json_t *rec = NULL;
    char version[STORE_VERSION_SIZE];
    bool mine = false;
    int r = read_record(f, id, &rec, version);
    long long epoch = fleet_epoch(f);
    pthread_mutex_lock(&f->lock);
    struct lease *l = find_locked(f, id);
    if (l && r == 0 &&
        still_mine(f, rec, json_integer_value(json_object_get(l->record, "generation")), epoch)) {
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

static int update(struct fleet *f, const char *id, const char *state, json_t *checkpoint,
                  json_t *options)
{
    int r = update_once(f, id, state, checkpoint, options);
    if (r == -ESTALE)
        r = reread(f, id) ? update_once(f, id, state, checkpoint, options) : -EXDEV;
    if (r == -ESTALE) {
        reread(f, id);
        r = -EXDEV;
    }
    if (r == -EXDEV)
        return err_set(EXDEV, "session %s moved to another node: its record changed", id);
    return r;
}

int fleet_lease_update(struct fleet *f, const char *id, const char *state, json_t *checkpoint)
{
    return update(f, id, state, checkpoint, NULL);
}

int fleet_lease_set_options(struct fleet *f, const char *id, const char *options_json)
{
    json_t *opts = json_loads(options_json, 0, NULL);
    if (!opts)
        return err_set(EINVAL, "the options of session %s are not JSON", id);
    int r = update(f, id, "live", NULL, opts);
    json_decref(opts);
    return r;
}

void fleet_lease_release(struct fleet *f, const char *id, const char *how, json_t *checkpoint)
{
    if (how && fleet_lease_update(f, id, how, checkpoint) < 0)
        log_warn("msg=\"cannot release the session's record\" session=%s error=%s", id,
                 log_quote(err_msg()));
    lease_free(unhold(f, id));
}

void fleet_lease_forget(struct fleet *f, const char *id)
{
    lease_free(unhold(f, id));
}

void fleet_leases_free(struct fleet *f)
{
    pthread_mutex_lock(&f->lock);
    struct lease *l = f->held;
    f->held = NULL;
    pthread_mutex_unlock(&f->lock);
    while (l) {
        struct lease *next = l->next;
        lease_free(l);
        l = next;
    }
}
