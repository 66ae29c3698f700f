/* snapshot.c - a session's state written to the store apart from what it keeps of its own
 * (an export: its files, and its variables pickled as a checkpoint pickles them), and what
 * stands on that: named snapshots that new sessions start from on any node, forks, and
 * pauses (a stop of every process, or a hibernation: variables exported, kernels gone). */
#include "session/session-int.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#define SNAPSHOT_PREFIX     "snapshots/"
#define SNAPSHOT_RECORD_MAX (64u << 10)
#define SNAPSHOT_NAME_MAX   128
#define FORK_THREADS        4
#define SNAPSHOT_LIST_KEPT  20 /* items of each list of a record cut to fit */
#define SNAPSHOT_ERROR_KEPT 1024

static int snapshot_make(const struct persist_config *c, struct session *s, const char *name,
                         json_t **ret_record);

const char *session_pause_name(enum session_pause p)
{
    static const char *const names[] = {
        [PAUSE_NONE] = "running", [PAUSE_FROZEN] = "paused", [PAUSE_HIBERNATED] = "hibernated"};
    return (unsigned)p <= PAUSE_HIBERNATED ? names[p] : "invalid";
}

/* ---- export ---- */

struct export_ctx {
    const struct persist_config *c;
    const char *to;
    json_t *report;
};

/* The kernel's checkpoint of its variables, stored as a blob of x->to: the manifest's
 * variables entry, or NULL with why in the report. */
static json_t *export_variables(struct session *s, struct export_ctx *x)
{
    static const char *const keys[] = {"saved", "modules", "skipped", "bash", NULL};
    struct workspace *ws = session_workspace(s);
    _cleanup_free_ char *hex = random_hex(8);
    _cleanup_free_ char *rel = xasprintf(".runcell/export-%s", hex);
    _cleanup_free_ char *inside = xasprintf("/workspace/%s", rel);
    json_t *reply = NULL, *vars = NULL;
    char sha[SHA256_HEX_SIZE], at[32];
    uint64_t size = 0;
    if (lang_is_javascript(session_options(s)->lang)) {
        json_object_set_new(x->report, "variables_note",
                            json_string("variables of a JavaScript session are not kept: its "
                                        "files are, its variables start empty"));
        return NULL;
    }
    if (session_kernel_request(s, "checkpoint", inside, &reply) < 0) {
        json_object_set_new(x->report, "variables_error", json_string(err_msg()));
    } else if (!json_is_true(json_object_get(reply, "ok"))) {
        const char *e = json_string_value(json_object_get(reply, "error"));
        _cleanup_free_ char *msg =
            xasprintf("the kernel could not write its variables: %s", e ? e : "no reason given");
        json_object_set_new(x->report, "variables_error", json_string(msg));
    } else if (blob_from_workspace(x->c->store, x->to, ws, rel, sha, &size) < 0) {
        json_object_set_new(x->report, "variables_error", json_string(err_msg()));
    } else if (x->c->quota_bytes && size > x->c->quota_bytes) {
        json_object_set_new(x->report, "variables_error",
                            json_string("the variables are past the store quota"));
    } else {
        format_time_iso(now_realtime_ms(), at);
        vars = json_pack("{s:s,s:I,s:s}", "sha256", sha, "size", (json_int_t)size, "at", at);
        json_t *kept = persist_capped_reply(reply, keys);
        json_object_update_missing(vars, kept);
        json_object_set_new(x->report, "variables",
                            json_pack("{s:O,s:O,s:O}", "saved", json_object_get(kept, "saved"),
                                      "modules", json_object_get(kept, "modules"), "skipped",
                                      json_object_get(kept, "skipped")));
        json_decref(kept);
    }
    /* the file goes, whatever happened */
    const char *leaf;
    _cleanup_close_ int dfd = workspace_open_parent(ws, rel, false, &leaf);
    if (dfd >= 0)
        unlinkat(dfd, leaf, 0);
    json_decref(reply);
    return vars;
}

static int do_export(struct session *s, void *arg)
{
    struct export_ctx *x = arg;
    struct workspace *ws = session_workspace(s);
    json_t *vars = export_variables(s, x);
    struct ws_listing after;
    int r = workspace_scan(ws, &after);
    if (r < 0) {
        json_decref(vars);
        return err_set(-r, "cannot list the workspace: %s", err_msg());
    }
    /* The export is no session of a fleet's: no lease fences its list. */
    struct persist_config c = *x->c;
    c.fleet = NULL;
    struct manifest m = {0};
    char *error = NULL;
    r = manifest_save(&c, x->to, &m, ws, &after, vars, &error);
    ws_listing_release(&after);
    json_object_set_new(x->report, "files", json_integer((json_int_t)m.n));
    json_object_set_new(x->report, "bytes", json_integer((json_int_t)manifest_bytes(&m)));
    manifest_release(&m);
    if (r < 0) {
        err_set(-r, "%s", error ? error : err_msg());
        free(error);
        return r;
    }
    free(error);
    return 0;
}

int session_export(struct session *s, const struct persist_config *c, const char *to_id,
                   json_t **ret_report)
{
    if (!c || !c->store)
        return err_set(EINVAL, "this server keeps no store to write the session to");
    struct export_ctx x = {.c = c, .to = to_id, .report = json_object()};
    int r = session_run_exclusive(s, session_options(s)->timeout_ms, do_export, &x);
    if (r < 0) {
        char *msg = xstrdup(err_msg());
        json_decref(x.report);
        store_discard(c->store, to_id); /* never half an export */
        err_set(-r, "%s", msg);
        free(msg);
        return r;
    }
    *ret_report = x.report;
    return 0;
}

/* Brings the variables stored as session from_id back into s's kernel (s busy): the report
 * gains variables {restored, modules, failed} or variables_error. 0, or -EAGAIN when the
 * store could not give them now (it may later), or -EIO when they are not to be had. */
static int import_variables(struct session *s, const struct persist_config *c, const char *from_id,
                            json_t *report)
{
    struct manifest m;
    int r = manifest_load(c->store, from_id, &m);
    if (r < 0) {
        json_object_set_new(report, "variables_error", json_string(err_msg()));
        return r == -ENOENT || r == -EBADMSG ? -EIO : -EAGAIN;
    }
    bool store_failed = false;
    json_t *vars = m.variables, *reply = NULL;
    struct workspace *ws = session_workspace(s);
    _cleanup_free_ char *hex = random_hex(8);
    _cleanup_free_ char *rel = xasprintf(".runcell/import-%s", hex);
    _cleanup_free_ char *inside = xasprintf("/workspace/%s", rel);
    const char *sha = json_string_value(json_object_get(vars, "sha256"));
    uint64_t size = (uint64_t)json_integer_value(json_object_get(vars, "size"));
    if (!sha)
        json_object_set_new(report, "variables_error", json_string("no variables were kept"));
    else if ((r = blob_to_workspace(c->store, from_id, sha, size, ws, rel)) < 0) {
        json_object_set_new(report, "variables_error", json_string(err_msg()));
        store_failed = r != -ENOENT;
    } else if (session_kernel_request(s, "restore", inside, &reply) < 0)
        json_object_set_new(report, "variables_error", json_string(err_msg()));
    else if (!json_is_true(json_object_get(reply, "ok")))
        json_object_set_new(report, "variables_error",
                            json_string(json_string_value(json_object_get(reply, "error"))
                                            ?: "the kernel could not restore them"));
    else {
        static const char *const keys[] = {"restored", "modules", "failed", NULL};
        json_object_set_new(report, "variables", persist_capped_reply(reply, keys));
    }
    json_decref(reply);
    manifest_release(&m);
    if (store_failed)
        return -EAGAIN;
    return json_object_get(report, "variables_error") ? -EIO : 0;
}

/* ---- pause ---- */

struct pause_ctx {
    const struct persist_config *c;
    bool keep_memory;
    bool idle; /* the server's own, for idleness */
    json_t *report;
};

/* The export a hibernated session's variables wait in: one per session, named after it. */
static char *hibernation_id(struct session *s)
{
    const char *id = session_id(s);
    _cleanup_free_ char *node = id ? session_id_node(id) : NULL;
    const char *hex = id && node ? strrchr(id, '-') + 1 : id;
    /* the session's own id with its first digit changed: stored apart, and found again */
    char *h = xstrdup(hex ? hex : "0");
    h[0] = h[0] == 'f' ? 'e' : 'f';
    return h;
}

static const struct persist_config *pause_config(struct session *s)
{
    struct persist *p = session_get_persist(s);
    return p ? persist_config_of(p) : NULL;
}

static int resume_now(struct session *s, json_t *report);

/* resume: what comes to a paused session resumes it first. */
static int resume_hook(struct session *s)
{
    json_t *report = json_object();
    int r = resume_now(s, report);
    json_decref(report);
    return r;
}

/* release: a session freed while hibernated leaves nothing of its variables in the store. */
static void release_hook(struct session *s)
{
    const struct persist_config *c = pause_config(s);
    if (session_pause_state(s) != PAUSE_HIBERNATED || !c || !c->store)
        return;
    _cleanup_free_ char *hib = hibernation_id(s);
    store_discard(c->store, hib);
}

static const struct session_pause_ops pause_ops = {.resume = resume_hook, .release = release_hook};

static int resume_now(struct session *s, json_t *report)
{
    enum session_pause how = session_pause_state(s);
    struct sandbox *sbs[2];
    int n = session_kernel_sandboxes(s, sbs), r = 0;
    if (how == PAUSE_FROZEN) {
        for (int i = 0; i < n; i++)
            sandbox_pause(sbs[i], false);
        session_set_pause(s, PAUSE_NONE, NULL);
        return 0;
    }
    /* Hibernated: a fresh kernel, and the variables it had. Until the kernel runs and the
     * store has given them back, the session stays hibernated and the next request tries
     * again; variables not to be had at all (gone from the store, or that the kernel cannot
     * load) are said, and the session runs on without them. */
    const struct persist_config *c = pause_config(s);
    _cleanup_free_ char *hib = hibernation_id(s);
    if ((r = session_start_own_kernel(s)) < 0)
        return err_set(-r,
                       "the session could not be resumed: %s; try again (its files and "
                       "variables are kept)",
                       err_msg());
    if ((r = import_variables(s, c, hib, report)) == -EAGAIN) {
        session_stop_kernels(s);
        return err_set(ETIMEDOUT,
                       "the session could not be resumed: the store did not give back its "
                       "variables (%s); try again",
                       json_string_value(json_object_get(report, "variables_error")));
    }
    session_set_pause(s, PAUSE_NONE, NULL);
    store_discard(c->store, hib);
    if (r < 0)
        return err_set(EIO, "resumed without its variables: %s",
                       json_string_value(json_object_get(report, "variables_error")));
    return 0;
}

static int do_pause(struct session *s, void *arg)
{
    struct pause_ctx *x = arg;
    if (session_pause_state(s) != PAUSE_NONE)
        return err_set(EALREADY, "the session is paused already");
    if (x->keep_memory) {
        struct sandbox *sbs[2];
        int n = session_kernel_sandboxes(s, sbs);
        for (int i = 0; i < n; i++) {
            int r = sandbox_pause(sbs[i], true);
            if (r < 0) {
                for (int j = 0; j < i; j++)
                    sandbox_pause(sbs[j], false);
                if (r == -EAGAIN)
                    return err_set(ETIMEDOUT, "the session's processes did not all stop (one "
                                              "kept running, or was continued by another): "
                                              "try again, or pause it without keep_memory");
                return err_set(-r, "the session's processes cannot all be found (it runs "
                                   "without cgroups): pause it without keep_memory");
            }
        }
        session_set_pause(s, PAUSE_FROZEN, &pause_ops);
        json_object_set_new(x->report, "state", json_string("paused"));
        return 0;
    }
    if (lang_is_javascript(session_options(s)->lang))
        return err_set(EINVAL, "a JavaScript session's variables cannot be kept while it is "
                               "hibernated: pause it with keep_memory");
    struct sandbox *sbs[2];
    if (session_kernel_sandboxes(s, sbs) > 1) {
        if (x->idle)
            return err_set(EBUSY, "its JavaScript kernel's variables would be lost");
        json_object_set_new(x->report, "javascript_note",
                            json_string("the JavaScript kernel's variables are not kept: it "
                                        "starts empty when the session resumes"));
    }
    _cleanup_free_ char *hib = hibernation_id(s);
    struct export_ctx e = {.c = x->c, .to = hib, .report = x->report};
    json_t *vars = export_variables(s, &e);
    if (!vars) {
        store_discard(x->c->store, hib); /* what an upload left before a refusal */
        return err_set(EIO, "its variables could not be kept (%s): the session runs on",
                       json_string_value(json_object_get(x->report, "variables_error")));
    }
    /* Only the variables: the files stay where they are, in the session's workspace. */
    struct persist_config c = *x->c;
    c.fleet = NULL;
    struct manifest m = {0};
    struct ws_listing none = {0};
    char *error = NULL;
    int r = manifest_save(&c, hib, &m, session_workspace(s), &none, vars, &error);
    manifest_release(&m);
    if (r < 0) {
        err_set(-r, "its variables could not be kept (%s): the session runs on",
                error ? error : err_msg());
        free(error);
        store_discard(c.store, hib);
        return r;
    }
    free(error);
    session_stop_kernels(s);
    /* What it keeps open only to measure its next cell goes now: a hibernated session holds
     * one descriptor (its uid's lock), so that ten thousand of them fit a server. */
    workspace_scan_idle(session_workspace(s));
    session_set_pause(s, PAUSE_HIBERNATED, &pause_ops);
    json_object_set_new(x->report, "state", json_string("hibernated"));
    return 0;
}

static int pause_session(struct session *s, bool keep_memory, bool idle, json_t **ret_report);

int session_pause(struct session *s, bool keep_memory, json_t **ret_report)
{
    return pause_session(s, keep_memory, false, ret_report);
}

int session_pause_idle(struct session *s, bool keep_memory, json_t **ret_report)
{
    return pause_session(s, keep_memory, true, ret_report);
}

static int pause_session(struct session *s, bool keep_memory, bool idle, json_t **ret_report)
{
    const struct persist_config *c = pause_config(s);
    if (!keep_memory && (!c || !c->store))
        return err_set(EINVAL, "this session has no store to keep its variables in while it is "
                               "hibernated: pause it with keep_memory");
    if (session_pause_state(s) != PAUSE_NONE)
        return err_set(EALREADY, "the session is %s already",
                       session_pause_name(session_pause_state(s)));
    struct pause_ctx x = {
        .c = c, .keep_memory = keep_memory, .idle = idle, .report = json_object()};
    /* Waits for a running cell (up to its timeout): a pause never cuts a cell. The pause
     * itself must not resume what it finds paused: run_exclusive resumes first, so the state
     * is checked again inside. */
    int r = session_run_exclusive_raw(s, session_options(s)->timeout_ms, do_pause, &x);
    if (r < 0) {
        json_decref(x.report);
        return r;
    }
    *ret_report = x.report;
    return 0;
}

static int do_resume(struct session *s, void *arg)
{
    if (session_pause_state(s) == PAUSE_NONE)
        return err_set(EALREADY, "the session is not paused");
    return resume_now(s, arg);
}

int session_resume(struct session *s, json_t **ret_report)
{
    enum session_pause how = session_pause_state(s);
    if (how == PAUSE_NONE)
        return err_set(EALREADY, "the session is not paused");
    json_t *report = json_pack("{s:s}", "was", session_pause_name(how));
    int r = session_run_exclusive_raw(s, session_options(s)->timeout_ms, do_resume, report);
    if (r < 0 && r != -EIO) {
        json_decref(report);
        return r;
    }
    if (r == -EIO)
        json_object_set_new(report, "error", json_string(err_msg()));
    json_object_set_new(report, "state", json_string("running"));
    *ret_report = report;
    return 0;
}

/* ---- snapshots ---- */

bool snapshot_id_valid(const char *id)
{
    size_t n = id ? strlen(id) : 0;
    return n == 32 && strspn(id, "0123456789abcdef") == n;
}

static char *record_key(const char *id)
{
    return xasprintf(SNAPSHOT_PREFIX "%s.json", id);
}

static size_t snapshot_count(const struct persist_config *c)
{
    struct store_listing l;
    if (store_list(c->store, SNAPSHOT_PREFIX, &l) < 0)
        return 0;
    size_t n = l.n;
    store_listing_release(&l);
    return n;
}

/* Snapshots being made in this process: counted against the maximum with the stored ones, so
 * that creations at once cannot pass it together. */
static pthread_mutex_t making_lock = PTHREAD_MUTEX_INITIALIZER;
static size_t making;

/* The record as it is stored, within SNAPSHOT_RECORD_MAX: the variables' lists cut to their
 * first items, and an error cut, where the whole would not fit. NULL when even that does not
 * fit. Caller frees. */
static char *record_text(json_t *rec)
{
    char *text = json_dumps(rec, JSON_COMPACT);
    if (text && strlen(text) <= SNAPSHOT_RECORD_MAX)
        return text;
    free(text);
    static const char *const lists[] = {"saved", "modules", "skipped", "restored", "failed"};
    json_t *vars = json_object_get(rec, "variables");
    for (size_t i = 0; json_is_object(vars) && i < ARRAY_SIZE(lists); i++) {
        json_t *l = json_object_get(vars, lists[i]);
        while (json_is_array(l) && json_array_size(l) > SNAPSHOT_LIST_KEPT)
            json_array_remove(l, json_array_size(l) - 1);
    }
    if (json_is_object(vars))
        json_object_set_new(vars, "lists_cut_at", json_integer(SNAPSHOT_LIST_KEPT));
    const char *e = json_string_value(json_object_get(rec, "variables_error"));
    if (e && strlen(e) > SNAPSHOT_ERROR_KEPT) {
        char *cut = xstrndup(e, SNAPSHOT_ERROR_KEPT);
        json_object_set_new(rec, "variables_error", json_string(cut));
        free(cut);
    }
    text = json_dumps(rec, JSON_COMPACT);
    if (text && strlen(text) <= SNAPSHOT_RECORD_MAX)
        return text;
    free(text);
    return NULL;
}

int snapshot_create(const struct persist_config *c, struct session *s, const char *name, size_t max,
                    json_t **ret_record)
{
    if (!c || !c->store)
        return err_set(EINVAL, "this server keeps no store for snapshots");
    if (name && (!*name || strlen(name) > SNAPSHOT_NAME_MAX))
        return err_set(EINVAL, "a snapshot's name is text of 1 to %d bytes", SNAPSHOT_NAME_MAX);
    pthread_mutex_lock(&making_lock);
    size_t have = snapshot_count(c) + making;
    if (max && have >= max) {
        pthread_mutex_unlock(&making_lock);
        return err_set(EAGAIN,
                       "the store holds its maximum of %zu snapshots; delete one (DELETE "
                       "/v1/snapshots/ID) first",
                       max);
    }
    making++;
    pthread_mutex_unlock(&making_lock);
    int r = snapshot_make(c, s, name, ret_record);
    pthread_mutex_lock(&making_lock);
    making--;
    pthread_mutex_unlock(&making_lock);
    return r;
}

static int snapshot_make(const struct persist_config *c, struct session *s, const char *name,
                         json_t **ret_record)
{
    _cleanup_free_ char *id = random_hex(16);
    json_t *report = NULL;
    int r = session_export(s, c, id, &report);
    if (r < 0)
        return r;
    char at[32];
    format_time_iso(now_realtime_ms(), at);
    const struct session_opts *o = session_options(s);
    json_t *rec = json_pack(
        "{s:s,s:s?,s:s?,s:s,s:O,s:O,s:s,s:o}", "id", id, "name", name, "from", session_id(s),
        "created_at", at, "bytes", json_object_get(report, "bytes"), "files",
        json_object_get(report, "files"), "language", o->lang ? o->lang : "python", "options",
        json_pack("{s:I,s:I,s:I,s:f}", "memory_mb", (json_int_t)o->limits.memory_mb, "pids",
                  (json_int_t)o->limits.pids, "disk_mb", (json_int_t)o->limits.disk_mb, "cpus",
                  (double)o->limits.cpus_milli / 1000.0));
    json_object_update_missing(rec, report);
    json_object_del(rec, "variables_note");
    json_decref(report);
    _cleanup_free_ char *text = record_text(rec);
    _cleanup_free_ char *key = record_key(id);
    if (!text) {
        store_discard(c->store, id);
        json_decref(rec);
        return err_set(EFBIG, "the snapshot's record is past %u bytes", SNAPSHOT_RECORD_MAX);
    }
    if ((r = store_put_buf(c->store, key, text, strlen(text))) < 0) {
        char *msg = xstrdup(err_msg());
        store_discard(c->store, id);
        json_decref(rec);
        err_set(-r, "cannot record the snapshot: %s", msg);
        free(msg);
        return r;
    }
    *ret_record = rec;
    return 0;
}

int snapshot_get(const struct persist_config *c, const char *id, json_t **ret_record)
{
    if (!snapshot_id_valid(id))
        return err_set(ENOENT, "no snapshot '%.80s': snapshot ids are 32 hexadecimal digits", id);
    _cleanup_free_ char *key = record_key(id);
    char *text = NULL;
    size_t n;
    int r = store_get_buf(c->store, key, SNAPSHOT_RECORD_MAX, &text, &n);
    if (r == -ENOENT)
        return err_set(ENOENT, "no snapshot %s (deleted, or never made)", id);
    if (r < 0)
        return r;
    json_t *rec = json_loadb(text, n, 0, NULL);
    free(text);
    if (!json_is_object(rec)) {
        json_decref(rec);
        return err_set(EBADMSG, "the record of snapshot %s is corrupted", id);
    }
    *ret_record = rec;
    return 0;
}

static int newest_first(const void *a, const void *b)
{
    json_t *x = *(json_t *const *)a, *y = *(json_t *const *)b;
    const char *tx = json_string_value(json_object_get(x, "created_at"));
    const char *ty = json_string_value(json_object_get(y, "created_at"));
    return strcmp(ty ? ty : "", tx ? tx : "");
}

json_t *snapshot_list(const struct persist_config *c, size_t limit)
{
    json_t *out = json_array();
    struct store_listing l;
    if (!c || !c->store || store_list(c->store, SNAPSHOT_PREFIX, &l) < 0)
        return out;
    json_t **v = xcalloc(l.n + 1, sizeof(*v));
    size_t n = 0;
    for (size_t i = 0; i < l.n; i++) {
        const char *key = l.v[i].key + strlen(SNAPSHOT_PREFIX);
        char id[40];
        snprintf(id, sizeof(id), "%.32s", key);
        int r = snapshot_get(c, id, &v[n]);
        if (r == 0)
            n++;
        else if (r != -ENOENT) /* listed, so that it can be deleted */
            v[n++] = json_pack("{s:s,s:s}", "id", id, "error", err_msg());
    }
    store_listing_release(&l);
    if (n)
        qsort(v, n, sizeof(*v), newest_first);
    for (size_t i = 0; i < n; i++) {
        if (!limit || i < limit)
            json_array_append(out, v[i]);
        json_decref(v[i]);
    }
    free(v);
    return out;
}

int snapshot_delete(const struct persist_config *c, const char *id)
{
    json_t *rec = NULL;
    int r = snapshot_get(c, id, &rec);
    /* A record that cannot be read (past its size, corrupted) is deleted all the same. */
    if (r < 0 && r != -EFBIG && r != -EBADMSG)
        return r;
    json_decref(rec);
    _cleanup_free_ char *key = record_key(id);
    if ((r = store_delete(c->store, key)) < 0)
        return err_set(-r, "cannot delete snapshot %s: %s", id, err_msg());
    store_discard(c->store, id);
    return 0;
}
