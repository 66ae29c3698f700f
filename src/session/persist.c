/* persist.c - a session's life in the store and in the session records: its files saved
 * after each execution, its variables at checkpoints, what is kept when it ends, and
 * bringing a stored session back. */
#include "session/session-int.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define RETIRE_WAIT_EXTRA_MS 5000

/* What is kept of a kernel's checkpoint or restore reply (names of saved variables,
 * modules, skipped ones with their reasons): it is stored in the manifest and the session
 * record, and read again on every GET, so it is capped whatever the kernel sends. */
#define REPLY_MAX_ITEMS  500
#define REPLY_MAX_STRING 256

struct persist {
    const struct persist_config *c;
    /* A local history of files only (persist_local_new): its own store, beside the
     * workspace; never named, recorded or resumed. */
    bool local;
    struct persist_config own;
    char *dir;
    char *id;
    bool files;           /* files and variables go to the store */
    bool discarded;       /* closed: nothing more is saved */
    bool fenced;          /* another node took its lease: nothing more is written at all */
    pthread_mutex_t lock; /* m, and one save at a time */
    struct manifest m;    /* what the store holds */
    /* For undo: the lists each cell's save replaced, oldest first, hist_before[i] the cell
     * whose save it was (so hist[i] is the files just before it); at most max_hist. Their
     * blobs stay in the store until they leave the history. */
    struct manifest *hist;
    long *hist_before;
    size_t n_hist, max_hist;
};

bool session_id_valid(const char *id)
{
    const char *dash = id ? strrchr(id, '-') : NULL;
    if (dash) {
        _cleanup_free_ char *node = session_id_node(id);
        if (!node)
            return false;
        id = dash + 1;
    }
    size_t n = id ? strlen(id) : 0;
    return n >= 1 && n <= 64 && strspn(id, "0123456789abcdef") == n;
}

const char *session_id(struct session *s)
{
    struct persist *p = session_get_persist(s);
    return p ? p->id : NULL;
}

bool session_stores_files(struct session *s)
{
    struct persist *p = session_get_persist(s);
    return p && p->files;
}

const struct persist_config *persist_config_of(struct persist *p)
{
    return p->c;
}

static void persist_free(struct persist *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->n_hist; i++)
        manifest_release(&p->hist[i]);
    free(p->hist);
    free(p->hist_before);
    manifest_release(&p->m);
    pthread_mutex_destroy(&p->lock);
    free(p->id);
    if (p->local) {
        store_free(p->own.store);
        if (p->dir)
            rm_rf(p->dir);
        free(p->dir);
    }
    free(p);
}

/* The options as the create request spells them, its network allowlist among them: a resume
 * or a takeover starts from these (the allowlist checked again against the caps of the
 * server that resumes it); sealed: the secrets, sealed (secrets_sealed), or NULL. */
static char *options_text(const struct session_opts *o, const struct net_policy *net, bool persist,
                          const char *sealed)
{
    json_t *j =
        json_pack("{s:s,s:f,s:f,s:I,s:I,s:I,s:f,s:b}", "language", o->lang ? o->lang : "python",
                  "timeout_s", (double)o->timeout_ms / 1000.0, "idle_timeout_s",
                  (double)o->idle_timeout_ms / 1000.0, "memory_mb", (json_int_t)o->limits.memory_mb,
                  "pids", (json_int_t)o->limits.pids, "disk_mb", (json_int_t)o->limits.disk_mb,
                  "cpus", (double)o->limits.cpus_milli / 1000.0, "persist", persist);
    if (net)
        json_object_set_new(j, "network", net_policy_json(net));
    if (sealed)
        json_object_set_new(j, "secrets_sealed", json_string(sealed));
    char *text = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    return text;
}

/* The secrets sealed for record id with c's key, or NULL (none, no key, or a failure: logged,
 * and the record keeps none). */
static char *seal_secrets(const struct persist_config *c, const char *id,
                          const struct net_secrets *sec)
{
    if (!sec || !c->seal_key)
        return NULL;
    json_t *plain = net_secrets_export(sec);
    char *text = json_dumps(plain, JSON_COMPACT);
    net_secrets_json_wipe(plain);
    json_decref(plain);
    char *sealed = text ? store_seal(c->seal_key, id, text, strlen(text)) : NULL;
    if (text) {
        explicit_bzero(text, strlen(text));
        free(text);
    }
    if (!sealed)
        log_warn("msg=\"the session's secrets are not kept\" session=%s error=%s", id,
                 log_quote(err_msg()));
    return sealed;
}

/* The record's options: the network in force, with its secrets sealed when the operator
 * keeps them. */
static char *record_options(struct persist *p, struct session *s)
{
    struct net_policy *net;
    struct net_secrets *sec;
    session_network_copy(s, &net, &sec);
    _cleanup_free_ char *sealed = seal_secrets(p->c, p->id, sec);
    char *text = options_text(session_options(s), net, p->files, sealed);
    net_policy_free(net);
    net_secrets_free(sec);
    return text;
}

/* The session's network changed: its records take the network in force, and its secrets
 * sealed when the operator keeps them. */
static void persist_network_changed(struct persist *p, struct session *s)
{
    if (p->local || !p->c->meta)
        return;
    _cleanup_free_ char *opts = record_options(p, s);
    struct meta_session m;
    if (meta_get(p->c->meta, p->id, &m) == 0) {
        free(m.options);
        m.options = xstrdup(opts);
        if (meta_put(p->c->meta, &m) < 0)
            log_warn("msg=\"cannot record the session's network\" session=%s error=%s", p->id,
                     log_quote(err_msg()));
        meta_session_release(&m);
    }
    if (p->c->fleet && p->files && fleet_lease_set_options(p->c->fleet, p->id, opts) < 0)
        log_warn("msg=\"cannot record the session's network in its lease\" session=%s error=%s",
                 p->id, log_quote(err_msg()));
}

int session_unseal_secrets(const struct persist_config *c, const char *id, json_t *options,
                           json_t **ret_secrets)
{
    *ret_secrets = NULL;
    json_t *sealed = json_incref(json_object_get(options, "secrets_sealed"));
    if (!sealed)
        return 0;
    json_object_del(options, "secrets_sealed");
    size_t n = 0;
    unsigned char *plain =
        c->seal_key ? store_unseal(c->seal_key, id, json_string_value(sealed), &n) : NULL;
    json_decref(sealed);
    if (!c->seal_key)
        return err_set(EACCES,
                       "session %s keeps its secrets sealed in its record, and this server has "
                       "no key to open them: start it with --secrets-key FILE (the key they were "
                       "sealed with), or give \"secrets\" in the request (they replace the kept "
                       "ones)",
                       id);
    if (!plain)
        return err_set(EACCES,
                       "session %s's secrets cannot be opened: %s; start this server with the "
                       "--secrets-key they were sealed with, or give \"secrets\" in the request",
                       id, err_msg());
    json_t *arr = json_loads((const char *)plain, 0, NULL);
    explicit_bzero(plain, n);
    free(plain);
    if (!json_is_array(arr)) {
        json_decref(arr);
        return err_set(EINVAL, "session %s's sealed secrets are not a list of secrets", id);
    }
    *ret_secrets = arr;
    return 0;
}

static void persist_after_execute(struct persist *p, struct workspace *ws,
                                  const struct ws_listing *after, struct exec_record *rec);
static json_t *persist_undo_files(struct persist *p, struct workspace *ws, long before);

static bool persist_stores_files(struct persist *p)
{
    return p->files;
}

static const struct persist_ops persist_ops = {
    .after_execute = persist_after_execute,
    .free = persist_free,
    .undo_files = persist_undo_files,
    .stores_files = persist_stores_files,
    .network_changed = persist_network_changed,
};

int session_persist(struct session *s, const struct persist_config *c, const char *id,
                    bool store_files, const char *resumed_from)
{
    if (!session_id_valid(id))
        return err_set(EINVAL, "bad session id '%s'", id);
    if (session_get_persist(s))
        return err_set(EEXIST, "the session is persisted already");
    struct persist *p = xcalloc(1, sizeof(*p));
    p->c = c;
    p->id = xstrdup(id);
    p->files = store_files && c->store;
    p->max_hist = p->files ? session_options(s)->history : 0;
    if (p->max_hist) {
        p->hist = xcalloc(p->max_hist + 1, sizeof(*p->hist));
        p->hist_before = xcalloc(p->max_hist + 1, sizeof(*p->hist_before));
    }
    pthread_mutex_init(&p->lock, NULL);
    session_set_persist(s, p, &persist_ops);
    if (!c->meta)
        return 0;
    _cleanup_free_ char *opts = record_options(p, s);
    _cleanup_free_ char *owner = c->owner ? xstrdup(c->owner) : NULL;
    _cleanup_free_ char *from = resumed_from ? xstrdup(resumed_from) : NULL;
    struct meta_session m = {
        .id = p->id,
        .owner = owner,
        .options = opts,
        .resumed_from = from,
        .created_ms = session_created_ms(s),
        .last_used_ms = now_realtime_ms(),
        .state = META_LIVE,
        .persist = p->files,
    };
    /* The session works without its record; the log says why it has none. */
    if (meta_put(c->meta, &m) < 0)
        log_warn("msg=\"cannot record the session\" session=%s error=%s", id, log_quote(err_msg()));
    /* In a fleet, what is stored is run by one node at a time (a takeover holds its lease). */
    if (c->fleet && p->files && !(resumed_from && !strcmp(resumed_from, id)))
        return fleet_lease_new(c->fleet, id, opts);
    return 0;
}

void session_persist_fence(struct session *s)
{
    struct persist *p = session_get_persist(s);
    if (!p)
        return;
    pthread_mutex_lock(&p->lock); /* after a save in progress; none after this */
    p->discarded = p->fenced = true;
    pthread_mutex_unlock(&p->lock);
}

/* ---- saving files ---- */

/* The current list and the history, for manifest_drop_blobs: hist[from..] with m after
 * them. Caller frees the array (not what it points into). */
static struct manifest *kept_lists(struct persist *p, size_t from, size_t to, size_t *ret_n)
{
    struct manifest *v = xcalloc(to - from + 1, sizeof(*v));
    size_t n = 0;
    for (size_t i = from; i < to; i++)
        v[n++] = p->hist[i];
    v[n++] = p->m;
    *ret_n = n;
    return v;
}

/* An old list leaves (old: replaced by a save that is not a cell's, or out of the history):
 * its blobs go unless the current list or the history names them. */
static void drop_list(struct persist *p, struct manifest *old)
{
    size_t n;
    _cleanup_free_ struct manifest *keep = kept_lists(p, 0, p->n_hist, &n);
    manifest_drop_blobs(p->c, p->id, old, keep, n);
    manifest_release(old);
}

/* The list a save replaced: the files before cell `cell` (0: not a cell's save). */
static void keep_replaced(struct persist *p, struct manifest *old, long cell)
{
    if (!cell) {
        drop_list(p, old);
        return;
    }
    p->hist[p->n_hist] = *old;
    p->hist_before[p->n_hist++] = cell;
    /* The kernel's count went back (it restarted: a restart, a lost kernel, a failed undo, a
     * resume): the lists kept before are of cells no undo can name again, and go (the
     * newest, this one, stays). */
    bool restarted = p->n_hist > 1 && p->hist_before[p->n_hist - 2] > cell;
    while (p->n_hist > p->max_hist || (restarted && p->n_hist > 1)) {
        struct manifest first = p->hist[0];
        memmove(p->hist, p->hist + 1, --p->n_hist * sizeof(*p->hist));
        memmove(p->hist_before, p->hist_before + 1, p->n_hist * sizeof(*p->hist_before));
        drop_list(p, &first);
    }
}

static int save_locked_cell(struct persist *p, struct workspace *ws, const struct ws_listing *after,
                            json_t *variables, long cell, char **ret_error);

static int save_locked(struct persist *p, struct workspace *ws, const struct ws_listing *after,
                       json_t *variables, char **ret_error)
{
    return save_locked_cell(p, ws, after, variables, 0, ret_error);
}

static int save_locked_cell(struct persist *p, struct workspace *ws, const struct ws_listing *after,
                            json_t *variables, long cell, char **ret_error)
{
    if (p->discarded) {
        json_decref(variables);
        *ret_error = NULL;
        return 0;
    }
    if (p->c->fleet && p->files && fleet_lease_state(p->c->fleet, p->id) < 0) {
        json_decref(variables);
        *ret_error = xasprintf("files not saved: %s", err_msg());
        return -ENOLCK;
    }
    struct manifest old = {0};
    bool was_empty = !p->m.n && !p->m.variables && !p->m.have_version;
    int r = manifest_save_keep(p->c, p->id, &p->m, ws, after, variables, p->max_hist ? &old : NULL,
                               ret_error);
    /* An empty list replaced (the first files a cell made) is a state to go back to too. */
    bool replaced = old.n || old.variables || old.have_version || (was_empty && p->m.n);
    if (p->max_hist && replaced)
        keep_replaced(p, &old, cell);
    if (r < 0 && p->local) /* its undo says what it could not bring back */
        log_debug("msg=\"files not kept for undo\" error=%s",
                  log_quote(*ret_error ? *ret_error : err_msg()));
    else if (r < 0)
        log_warn("msg=\"files not saved\" session=%s error=%s", p->id,
                 log_quote(*ret_error ? *ret_error : err_msg()));
    return r;
}

static void persist_after_execute(struct persist *p, struct workspace *ws,
                                  const struct ws_listing *after, struct exec_record *rec)
{
    /* A write that fails is logged by the records, and kept to be tried again. */
    if (p->c->meta)
        (void)meta_touch(p->c->meta, p->id, now_realtime_ms(), rec->execution_count);
    if (!p->files)
        return;
    pthread_mutex_lock(&p->lock);
    save_locked_cell(p, ws, after, NULL, rec->execution_count, &rec->persist_error);
    pthread_mutex_unlock(&p->lock);
}

/* ---- a local history of files, for the undo of a session that keeps none in a store ---- */

static struct persist *persist_local_new(struct workspace *ws, uint64_t quota_bytes)
{
    struct persist *p = xcalloc(1, sizeof(*p));
    p->local = p->files = true;
    p->id = xstrdup("local");
    p->dir = workspace_aside_path(ws, "history");
    pthread_mutex_init(&p->lock, NULL);
    struct store_config sc = {.url = p->dir};
    if (mkdir(p->dir, 0700) < 0)
        err_set(errno, "cannot create %s: %s", p->dir, strerror(errno));
    else
        (void)store_open(&sc, &p->own.store);
    if (!p->own.store) {
        log_warn("msg=\"no history of files for undo\" error=%s", log_quote(err_msg()));
        persist_free(p);
        return NULL;
    }
    p->own.quota_bytes = quota_bytes;
    p->c = &p->own;
    p->hist = xcalloc(SESSION_HISTORY_MAX + 1, sizeof(*p->hist));
    p->hist_before = xcalloc(SESSION_HISTORY_MAX + 1, sizeof(*p->hist_before));
    return p;
}

static void persist_local_save(struct persist *p, struct workspace *ws,
                               const struct ws_listing *listing, long cell, unsigned depth)
{
    struct ws_listing own = {0};
    if (!listing) {
        if (workspace_scan(ws, &own) < 0) {
            log_warn("msg=\"files not kept for undo\" error=%s", log_quote(err_msg()));
            return;
        }
        listing = &own;
    }
    pthread_mutex_lock(&p->lock);
    p->max_hist = MIN(depth, SESSION_HISTORY_MAX);
    char *error = NULL;
    save_locked_cell(p, ws, listing, NULL, cell, &error);
    free(error); /* logged; an undo says which files it could not bring back */
    pthread_mutex_unlock(&p->lock);
    ws_listing_release(&own);
}

const struct files_history_ops persist_local_ops = {
    .open = persist_local_new,
    .save = persist_local_save,
    .undo = persist_undo_files,
    .free = persist_free,
};

void session_files_history_enable(void)
{
    session_enable_files_history(&persist_local_ops);
}

/* ---- undo: the files before a cell, from the history ---- */

static const struct mentry *entry_of(const struct manifest *m, const char *path)
{
    for (size_t i = 0; i < m->n; i++)
        if (!strcmp(m->v[i].path, path))
            return &m->v[i];
    return NULL;
}

static bool same_entry(const struct mentry *a, const struct mentry *b)
{
    return a && b && a->mode == b->mode && !strcmp(a->sha, b->sha) &&
           !strcmp(a->target ? a->target : "", b->target ? b->target : "");
}

/* The workspace made like target: what is not in it removed, what differs from the last
 * save restored from its blob. */
static void apply_list(struct persist *p, struct workspace *ws, const struct manifest *target,
                       json_t *restored, json_t *removed, json_t *failed)
{
    struct ws_listing now;
    if (workspace_scan(ws, &now) == 0) {
        for (size_t i = 0; i < now.n; i++) {
            /* Only what the last save holds is known to have come since: a file no save could
             * keep (a sparse one, one past the quota) stays as it is. */
            if (entry_of(target, now.v[i].path) || !entry_of(&p->m, now.v[i].path))
                continue;
            const char *leaf;
            _cleanup_close_ int dfd = workspace_open_parent(ws, now.v[i].path, false, &leaf);
            if (dfd >= 0 && unlinkat(dfd, leaf, 0) == 0)
                json_array_append_new(removed, json_string(now.v[i].path));
        }
        ws_listing_release(&now);
    }
    for (size_t i = 0; i < target->n; i++) {
        const struct mentry *e = &target->v[i];
        if (same_entry(entry_of(&p->m, e->path), e))
            continue; /* as the last save left it */
        if (manifest_restore_entry(p->c->store, p->id, e, ws) < 0)
            json_array_append_new(failed,
                                  json_pack("{s:s,s:s}", "path", e->path, "error", err_msg()));
        else
            json_array_append_new(restored, json_string(e->path));
    }
}

static json_t *persist_undo_files(struct persist *p, struct workspace *ws, long before)
{
    json_t *restored = json_array(), *removed = json_array(), *failed = json_array();
    pthread_mutex_lock(&p->lock);
    if (!p->files || !p->max_hist || p->discarded) {
        pthread_mutex_unlock(&p->lock);
        json_decref(restored);
        json_decref(removed);
        json_decref(failed);
        return json_pack("{s:b,s:s}", "kept", 0, "why",
                         "the session keeps no history of its files in a store");
    }
    /* The first save at or after that cell replaced the list of the files before it; none:
     * no cell since changed a file. */
    size_t i = 0;
    while (i < p->n_hist && p->hist_before[i] < before)
        i++;
    if (i < p->n_hist) {
        apply_list(p, ws, &p->hist[i], restored, removed, failed);
        /* What came after is the future now: its lists leave the history. */
        for (size_t j = p->n_hist; j-- > i;) {
            struct manifest gone = p->hist[j];
            p->n_hist = j;
            if (j != i)
                drop_list(p, &gone);
            else
                p->hist[j] = gone; /* kept until the save below names its blobs */
        }
        struct manifest target = p->hist[i];
        memset(&p->hist[i], 0, sizeof(p->hist[i]));
        char *error = NULL;
        struct ws_listing after;
        if (workspace_scan(ws, &after) == 0) {
            struct manifest old = {0};
            manifest_save_keep(p->c, p->id, &p->m, ws, &after, NULL, &old, &error);
            ws_listing_release(&after);
            if (old.n || old.variables)
                drop_list(p, &old);
            else
                manifest_release(&old);
        }
        drop_list(p, &target);
        if (error)
            json_array_append_new(failed, json_pack("{s:s,s:s}", "path", "", "error", error));
        free(error);
    }
    pthread_mutex_unlock(&p->lock);
    return json_pack("{s:o,s:o,s:o}", "restored", restored, "removed", removed, "failed", failed);
}

/* Scans the workspace and saves it; variables as for manifest_save. */
static int save_now(struct persist *p, struct workspace *ws, json_t *variables, char **ret_error)
{
    struct ws_listing after;
    int r = workspace_scan(ws, &after);
    if (r < 0) {
        json_decref(variables);
        *ret_error = xasprintf("files not saved: %s", err_msg());
        return r;
    }
    pthread_mutex_lock(&p->lock);
    r = save_locked(p, ws, &after, variables, ret_error);
    pthread_mutex_unlock(&p->lock);
    ws_listing_release(&after);
    return r;
}

int session_save_files(struct session *s)
{
    struct persist *p = session_get_persist(s);
    char *error = NULL;
    session_files_changed(s); /* the state the next cell starts from */
    if (!p || !p->files)
        return 0;
    int r = save_now(p, session_workspace(s), NULL, &error);
    if (r < 0)
        err_set(-r, "%s", error ? error : err_msg());
    free(error);
    return r;
}

/* ---- variables ---- */

/* Closures, promises, timers and handles have no faithful serialised form: a JavaScript
 * session keeps its files, and says so where a Python one reports its variables. */
#define JS_VARIABLES_NOTE                                                                          \
    "variables of a JavaScript session are not kept: its files are "                               \
    "restored, its variables start empty"

/* Removes .runcell/NAME, and .runcell itself once empty: the user's files are all there is
 * to see in the workspace. */
static void remove_ws_file(struct workspace *ws, const char *rel)
{
    const char *leaf;
    int dfd = workspace_open_parent(ws, rel, false, &leaf);
    if (dfd >= 0) {
        unlinkat(dfd, leaf, 0);
        close(dfd);
    }
    int top = workspace_open(ws);
    if (top >= 0) {
        unlinkat(top, ".runcell", AT_REMOVEDIR);
        close(top);
    }
}

static uint64_t ws_file_size(struct workspace *ws, const char *rel)
{
    struct stat sb;
    _cleanup_close_ int fd = workspace_openat(ws, rel, O_RDONLY | O_NONBLOCK, 0);
    return fd >= 0 && fstat(fd, &sb) == 0 ? (uint64_t)sb.st_size : 0;
}

/* A string of a reply as kept: cut to REPLY_MAX_STRING bytes (on a UTF-8 boundary, as
 * jansson checked it whole), anything else as null. */
static json_t *capped_string(json_t *v)
{
    const char *s = json_string_value(v);
    if (!s)
        return json_null();
    size_t n = json_string_length(v);
    if (n <= REPLY_MAX_STRING)
        return json_incref(v);
    n = REPLY_MAX_STRING;
    while (n && ((unsigned char)s[n] & 0xc0) == 0x80)
        n--;
    return json_stringn(s, n);
}

/* An array (of strings, or of objects of strings) or an object (of strings) of a reply, at
 * most REPLY_MAX_ITEMS long; *ret_cut is set when items were left out. */
static json_t *capped_item(json_t *v)
{
    if (!json_is_object(v))
        return capped_string(v);
    json_t *o = json_object(), *x;
    const char *k;
    size_t n = 0;
    json_object_foreach(v, k, x)
    {
        if (n++ == 4 || strlen(k) > 64)
            break;
        json_object_set_new(o, k, capped_string(x));
    }
    return o;
}

static json_t *capped_list(json_t *v, bool *ret_cut)
{
    size_t i = 0, n = 0;
    json_t *x;
    const char *k;
    if (json_is_object(v)) {
        json_t *o = json_object();
        json_object_foreach(v, k, x)
        {
            if (n++ == REPLY_MAX_ITEMS || strlen(k) > REPLY_MAX_STRING) {
                *ret_cut = true;
                break;
            }
            json_object_set_new(o, k, capped_string(x));
        }
        return o;
    }
    json_t *a = json_array();
    json_array_foreach(v, i, x)
    {
        if (i == REPLY_MAX_ITEMS) {
            *ret_cut = true;
            break;
        }
        json_array_append_new(a, capped_item(x));
    }
    return a;
}

json_t *persist_capped_reply(json_t *reply, const char *const *keys)
{
    json_t *out = json_object();
    bool cut = false;
    for (; *keys; keys++) {
        json_t *v = json_object_get(reply, *keys);
        if (json_is_array(v) || json_is_object(v))
            json_object_set_new(out, *keys, capped_list(v, &cut));
    }
    if (cut)
        json_object_set_new(out, "lists_cut_at", json_integer(REPLY_MAX_ITEMS));
    return out;
}

/* Stores the checkpoint file rel; returns the manifest's variables entry, or NULL with
 * err_msg(). Takes p->lock. */
static json_t *store_checkpoint(struct persist *p, struct workspace *ws, const char *rel,
                                json_t *reply)
{
    char sha[SHA256_HEX_SIZE], at[32];
    static const char *const keys[] = {"saved", "modules", "skipped", "bash", NULL};
    uint64_t size = ws_file_size(ws, rel), quota = p->c->quota_bytes;
    json_t *vars = NULL, *kept = persist_capped_reply(reply, keys);
    /* What is kept of the reply is stored too (the manifest, the record): it counts. */
    _cleanup_free_ char *kept_text = json_dumps(kept, JSON_COMPACT);
    size += kept_text ? strlen(kept_text) : 0;
    pthread_mutex_lock(&p->lock);
    struct manifest files_only = p->m;
    files_only.variables = NULL;
    uint64_t used = manifest_bytes(&files_only);
    if (quota && used + size > quota) {
        err_set(EDQUOT,
                "the variables take %.1f MB, and with the files (%.1f MB) that is past "
                "the session's store quota of %.1f MB",
                (double)size / 1048576.0, (double)used / 1048576.0, (double)quota / 1048576.0);
    } else if (blob_from_workspace(p->c->store, p->id, ws, rel, sha, &size) == 0) {
        format_time_iso(now_realtime_ms(), at);
        vars = json_pack("{s:s,s:I,s:s}", "sha256", sha, "size", (json_int_t)size, "at", at);
        json_object_update_missing(vars, kept);
    }
    pthread_mutex_unlock(&p->lock);
    json_decref(kept);
    return vars;
}

/* Asks the kernel for a checkpoint and stores it; fills report; returns the manifest's
 * variables entry or NULL. */
static json_t *checkpoint_variables(struct session *s, struct persist *p, json_t *report)
{
    struct workspace *ws = session_workspace(s);
    _cleanup_free_ char *hex = random_hex(8);
    _cleanup_free_ char *rel = xasprintf(".runcell/variables-%s", hex);
    _cleanup_free_ char *inside = xasprintf("/workspace/%s", rel);
    json_t *reply = NULL, *vars = NULL;
    if (lang_is_javascript(session_options(s)->lang)) {
        json_object_set_new(report, "variables_note", json_string(JS_VARIABLES_NOTE));
        return NULL;
    }
    if (session_kernel_request(s, "checkpoint", inside, &reply) < 0) {
        json_object_set_new(report, "variables_error", json_string(err_msg()));
    } else if (!json_is_true(json_object_get(reply, "ok"))) {
        const char *e = json_string_value(json_object_get(reply, "error"));
        _cleanup_free_ char *msg =
            xasprintf("the kernel could not write the checkpoint: %s", e ? e : "no reason given");
        json_object_set_new(report, "variables_error", json_string(msg));
    } else if (!(vars = store_checkpoint(p, ws, rel, reply))) {
        json_object_set_new(report, "variables_error", json_string(err_msg()));
    }
    if (vars)
        json_object_set_new(report, "variables",
                            json_pack("{s:O,s:O,s:O,s:O}", "saved", json_object_get(vars, "saved"),
                                      "modules", json_object_get(vars, "modules"), "skipped",
                                      json_object_get(vars, "skipped"), "bytes",
                                      json_object_get(vars, "size")));
    if (vars && json_object_get(vars, "bash"))
        json_object_set(json_object_get(report, "variables"), "bash",
                        json_object_get(vars, "bash"));
    else if (json_is_array(json_object_get(reply, "skipped"))) {
        static const char *const keys[] = {"skipped", NULL};
        json_t *kept = persist_capped_reply(reply, keys);
        json_object_update(report, kept);
        json_decref(kept);
    }
    remove_ws_file(ws, rel);
    json_decref(reply);
    return vars;
}

struct retire_ctx {
    struct persist *p;
    json_t *report;
};

static int do_checkpoint(struct session *s, void *arg)
{
    struct retire_ctx *x = arg;
    json_t *vars = checkpoint_variables(s, x->p, x->report);
    char *error = NULL;
    bool saved = save_now(x->p, session_workspace(s), vars, &error) == 0;
    if (!saved)
        json_object_set_new(x->report, "persist_error",
                            json_string(error ? error : "files not saved"));
    free(error);
    pthread_mutex_lock(&x->p->lock);
    /* Blobs a crash left behind go once the store holds the final list. */
    if (saved) {
        size_t n;
        _cleanup_free_ struct manifest *keep = kept_lists(x->p, 0, x->p->n_hist, &n);
        store_collect_garbage_of(x->p->c->store, x->p->id, keep, n);
    }
    json_object_set_new(x->report, "files", json_integer((json_int_t)x->p->m.n));
    json_object_set_new(x->report, "stored_bytes",
                        json_integer((json_int_t)manifest_bytes(&x->p->m)));
    pthread_mutex_unlock(&x->p->lock);
    return 0;
}

static void discard(struct persist *p, json_t *report)
{
    pthread_mutex_lock(&p->lock); /* after a save in progress; none after this */
    p->discarded = true;
    pthread_mutex_unlock(&p->lock);
    if (store_discard(p->c->store, p->id) < 0) {
        log_warn("msg=\"cannot discard the stored files\" session=%s error=%s", p->id,
                 log_quote(err_msg()));
        json_object_set_new(report, "error", json_string(err_msg()));
    }
}

static enum meta_state end_state(enum session_end how)
{
    switch (how) {
    case SESSION_END_CLOSE:
        return META_CLOSED;
    case SESSION_END_CHECKPOINT:
        return META_CHECKPOINTED;
    case SESSION_END_IDLE:
        return META_EXPIRED;
    case SESSION_END_SHUTDOWN:
        break;
    }
    return META_STOPPED;
}

static char *notebook_key(const char *id);

void session_retire(struct session *s, enum session_end how, json_t **ret_report)
{
    struct persist *p = session_get_persist(s);
    json_t *report = json_object();
    /* Said at once: the session is out of the table, and a checkpoint takes a while. */
    if (p && p->c->meta)
        meta_set_state(p->c->meta, p->id, end_state(how), false, NULL);
    if (p && !p->files && how == SESSION_END_CLOSE && p->c->store) {
        /* Nothing else of it is stored, but the console's notebook may be. */
        _cleanup_free_ char *key = notebook_key(p->id);
        (void)store_delete(p->c->store, key);
    }
    if (!p || !p->files) {
        if (how == SESSION_END_CHECKPOINT)
            json_object_set_new(report, "error",
                                json_string("this session keeps nothing in a store (it was "
                                            "created with persist: false)"));
    } else if (how == SESSION_END_CLOSE) {
        discard(p, report);
    } else {
        struct retire_ctx x = {.p = p, .report = report};
        uint64_t wait = session_options(s)->interrupt_grace_ms + RETIRE_WAIT_EXTRA_MS;
        if (session_run_exclusive(s, wait, do_checkpoint, &x) < 0)
            json_object_set_new(report, "error", json_string(err_msg()));
        log_info("msg=\"session checkpointed\" session=%s variables=%s files=%lld", p->id,
                 json_object_get(report, "variables") ? "saved" : "not saved",
                 (long long)json_integer_value(json_object_get(report, "files")));
    }
    if (p && p->c->meta) {
        _cleanup_free_ char *text = json_dumps(report, JSON_COMPACT);
        bool has_vars = p->files && !p->discarded && p->m.variables;
        if (meta_set_state(p->c->meta, p->id, end_state(how), has_vars,
                           how == SESSION_END_CLOSE ? NULL : text) < 0)
            log_warn("msg=\"cannot update the session's record\" session=%s error=%s", p->id,
                     log_quote(err_msg()));
    }
    if (p && p->c->fleet && p->files && !p->fenced)
        fleet_lease_release(p->c->fleet, p->id,
                            how == SESSION_END_CLOSE ? NULL : meta_state_name(end_state(how)),
                            json_object_get(report, "variables"));
    if (ret_report)
        *ret_report = report;
    else
        json_decref(report);
}

int session_checkpoint(struct session *s, json_t **ret_report)
{
    struct persist *p = session_get_persist(s);
    if (!p || !p->files)
        return err_set(EINVAL, "this session keeps nothing in a store (it was created with "
                               "persist: false): there is nothing to checkpoint to");
    struct retire_ctx x = {.p = p, .report = json_object()};
    int r = session_run_exclusive(s, 0, do_checkpoint, &x);
    if (r < 0) {
        json_decref(x.report);
        return r;
    }
    if (p->c->fleet &&
        fleet_lease_update(p->c->fleet, p->id, "live", json_object_get(x.report, "variables")) < 0)
        json_object_set_new(x.report, "record_error", json_string(err_msg()));
    *ret_report = x.report;
    return 0;
}

/* ---- resuming ---- */

struct restore_ctx {
    struct persist *p;
    const char *from;
    json_t *report;
};

static void report_restored_variables(json_t *report, json_t *reply)
{
    static const char *const keys[] = {"restored", "modules", "failed", "bash", NULL};
    json_t *kept = persist_capped_reply(reply, keys);
    json_t *failed = json_array(), *f;
    size_t i;
    json_array_foreach(json_object_get(kept, "failed"), i, f)
        json_array_append_new(failed, json_pack("{s:O*,s:O*}", "name", json_object_get(f, "name"),
                                                "error", json_object_get(f, "reason")));
    json_object_set(report, "variables", json_object_get(kept, "restored"));
    json_object_set(report, "modules", json_object_get(kept, "modules"));
    json_object_set_new(report, "variables_failed", failed);
    /* What the bash shell held (cwd, variables, functions, aliases): loaded into the
     * session's shell when its first bash cell starts it. */
    if (json_object_get(kept, "bash"))
        json_object_set(report, "bash", json_object_get(kept, "bash"));
    if (json_object_get(kept, "lists_cut_at"))
        json_object_set(report, "lists_cut_at", json_object_get(kept, "lists_cut_at"));
    json_decref(kept);
}

static void restore_variables(struct session *s, struct restore_ctx *x, const struct manifest *m)
{
    json_t *vars = m->variables, *reply = NULL;
    if (lang_is_javascript(session_options(s)->lang)) {
        json_object_set_new(x->report, "variables_note", json_string(JS_VARIABLES_NOTE));
        return;
    }
    if (!vars) {
        json_object_set_new(x->report, "variables_note",
                            json_string("no variables were stored for this session: they are "
                                        "kept when a session expires, is closed with checkpoint "
                                        "or the server stops"));
        return;
    }
    json_object_set(x->report, "not_saved", json_object_get(vars, "skipped"));
    struct workspace *ws = session_workspace(s);
    _cleanup_free_ char *hex = random_hex(8);
    _cleanup_free_ char *rel = xasprintf(".runcell/restore-%s", hex);
    _cleanup_free_ char *inside = xasprintf("/workspace/%s", rel);
    const char *sha = json_string_value(json_object_get(vars, "sha256"));
    uint64_t size = (uint64_t)json_integer_value(json_object_get(vars, "size"));
    _cleanup_free_ char *error = NULL;
    if (blob_to_workspace(x->p->c->store, x->from, sha, size, ws, rel) < 0)
        error = xasprintf("the variables could not be restored: %s", err_msg());
    else if (session_kernel_request(s, "restore", inside, &reply) < 0)
        error = xasprintf("the variables could not be restored: %s", err_msg());
    else if (!json_is_true(json_object_get(reply, "ok")))
        error = xasprintf("the variables could not be restored: %s",
                          json_string_value(json_object_get(reply, "error")));
    else
        report_restored_variables(x->report, reply);
    if (error)
        json_object_set_new(x->report, "variables_error", json_string(error));
    remove_ws_file(ws, rel);
    json_decref(reply);
}

static int do_restore(struct session *s, void *arg)
{
    struct restore_ctx *x = arg;
    struct manifest m;
    int r = manifest_load(x->p->c->store, x->from, &m);
    if (r == -EBADMSG) {
        /* Nothing can be named, so nothing is restored; the session is still made. */
        json_object_set_new(x->report, "error", json_string(err_msg()));
        return 0;
    }
    if (r == -ENOENT && !strcmp(x->from, x->p->id)) {
        /* Taken over before its first save: it had no files, and no checkpoint. */
        json_object_set_new(x->report, "files", json_array());
        json_object_set_new(x->report, "files_failed", json_array());
        restore_variables(s, x, &m);
        return 0;
    }
    if (r < 0)
        return r;
    bool same_id = !strcmp(x->from, x->p->id);
    /* A fleet's takeover first makes the stored list its own (stamped with its lease's
     * generation): the node that ran the session before cannot write over it any more. */
    if (same_id && x->p->c->fleet && x->p->files &&
        (r = manifest_claim(x->p->c, x->from, &m)) < 0) {
        manifest_release(&m);
        return r;
    }
    json_t *ok = json_array(), *failed = json_array();
    /* A takeover resumes under the same id: the stored checkpoint stays its own, and the
     * next save writes over the version it claimed. */
    if (same_id) {
        pthread_mutex_lock(&x->p->lock);
        if (m.variables) {
            json_decref(x->p->m.variables);
            x->p->m.variables = json_incref(m.variables);
        }
        memcpy(x->p->m.version, m.version, STORE_VERSION_SIZE);
        x->p->m.have_version = m.have_version;
        pthread_mutex_unlock(&x->p->lock);
    }
    manifest_restore_files(x->p->c->store, x->from, &m, session_workspace(s), ok, failed);
    json_object_set_new(x->report, "files", ok);
    json_object_set_new(x->report, "files_failed", failed);
    restore_variables(s, x, &m);
    manifest_release(&m);
    return 0;
}

static void copy_notebook(const struct persist_config *c, const char *from, const char *to);
static char *notebook_key(const char *id);

int session_restore(struct session *s, const char *from_id, json_t **ret_report)
{
    struct persist *p = session_get_persist(s);
    if (!p || !p->c->store)
        return err_set(EINVAL, "this session has no store to resume from");
    if (!session_id_valid(from_id))
        return err_set(ENOENT, "no session '%s' to resume: session ids are hexadecimal", from_id);
    struct restore_ctx x = {.p = p, .from = from_id, .report = json_object()};
    json_object_set_new(x.report, "from", json_string(from_id));
    int r = session_run_exclusive(s, 0, do_restore, &x);
    if (r < 0) {
        json_decref(x.report);
        return r;
    }
    copy_notebook(p->c, from_id, p->id);
    if (p->files && session_save_files(s) < 0)
        json_object_set_new(x.report, "persist_error", json_string(err_msg()));
    *ret_report = x.report;
    return 0;
}

/* ---- stored records ---- */

static json_t *parse_or_null(const char *text)
{
    json_t *j = text ? json_loads(text, 0, NULL) : NULL;
    return j ? j : json_null();
}

static json_t *stored_json(const struct meta_session *m)
{
    char created[32], used[32];
    format_time_iso(m->created_ms, created);
    format_time_iso(m->last_used_ms, used);
    return json_pack("{s:s,s:s,s:b,s:b,s:s,s:s,s:I,s:o,s:s?,s:b,s:o}", "id", m->id, "state",
                     meta_state_name(m->state), "persist", m->persist, "resumable",
                     m->persist && m->state != META_CLOSED, "created_at", created, "last_used_at",
                     used, "execution_count", (json_int_t)m->execution_count, "options",
                     parse_or_null(m->options), "resumed_from", m->resumed_from, "variables_stored",
                     m->has_variables, "checkpoint", parse_or_null(m->checkpoint));
}

int session_stored_info(const struct persist_config *c, const char *id, json_t **ret)
{
    struct meta_session m;
    if (!c->meta || !session_id_valid(id))
        return err_set(ENOENT, "no record of session %s", id);
    int r = meta_get(c->meta, id, &m);
    if (r < 0)
        return r;
    *ret = stored_json(&m);
    meta_session_release(&m);
    return 0;
}

static void add_stored(void *ctx, const struct meta_session *m)
{
    json_array_append_new(ctx, stored_json(m));
}

json_t *session_stored_list(const struct persist_config *c, size_t limit)
{
    json_t *a = json_array();
    if (c->meta && meta_foreach(c->meta, limit, add_stored, a) < 0)
        log_warn("msg=\"cannot list the session records\" error=%s", log_quote(err_msg()));
    return a;
}

int session_stored_delete(const struct persist_config *c, const char *id)
{
    struct meta_session m = {0};
    if (!session_id_valid(id))
        return err_set(ENOENT, "no session %s", id);
    int r = c->meta ? meta_get(c->meta, id, &m) : -ENOENT;
    if (r < 0 && r != -ENOENT)
        return r;
    /* A session closed without a checkpoint keeps its record but nothing else: gone. */
    bool known = r == 0 && m.state != META_CLOSED;
    bool live = known && m.state == META_LIVE && m.owner && owner_alive(m.owner);
    meta_session_release(&m);
    if (live)
        return err_set(EBUSY, "session %s is live in another runcell process; close it there", id);
    if (c->store) {
        struct manifest man;
        int l = manifest_load(c->store, id, &man);
        if (l == 0 || l == -EBADMSG)
            known = true;
        manifest_release(&man);
        if (known && (r = store_discard(c->store, id)) < 0)
            return r;
    }
    if (!known)
        return err_set(ENOENT, "no session %s", id);
    if (c->meta && meta_set_state(c->meta, id, META_CLOSED, false, NULL) < 0)
        return -EIO;
    return 0;
}

/* ---- the console's notebook ---- */

static char *notebook_key(const char *id)
{
    return xasprintf("sessions/%s/notebook.json", id);
}

int session_notebook_get(const struct persist_config *c, const char *id, char **ret, size_t *ret_n)
{
    if (!c || !c->store || !session_id_valid(id))
        return err_set(ENOENT, "no notebook");
    _cleanup_free_ char *key = notebook_key(id);
    int r = store_get_buf(c->store, key, SESSION_NOTEBOOK_MAX, ret, ret_n);
    return r == -EFBIG
               ? err_set(EFBIG, "the notebook kept is past %u MiB", SESSION_NOTEBOOK_MAX >> 20)
               : r;
}

int session_notebook_put(const struct persist_config *c, const char *id, const char *text, size_t n)
{
    if (!c || !c->store)
        return err_set(EINVAL, "this server keeps no store for notebooks");
    if (n > SESSION_NOTEBOOK_MAX)
        return err_set(EFBIG, "a notebook is kept up to %u MiB; this one is %.1f MiB",
                       SESSION_NOTEBOOK_MAX >> 20, (double)n / 1048576.0);
    _cleanup_free_ char *key = notebook_key(id);
    return store_put_buf(c->store, key, text, n);
}

/* A resume takes the notebook along (best effort: the session is made without it). */
static void copy_notebook(const struct persist_config *c, const char *from, const char *to)
{
    char *text = NULL;
    size_t n;
    if (strcmp(from, to) && session_notebook_get(c, from, &text, &n) == 0)
        (void)session_notebook_put(c, to, text, n);
    free(text);
}
