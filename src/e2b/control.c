/* control.c - E2B's control plane (E2B_API_URL): create, list, describe, connect, time out
 * and kill sandboxes, each an E2B sandbox over one runcell session. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "e2b/e2b-int.h"

/* ---- control plane ---- */

static json_t *box_json(const struct e2b_box *b, struct session *s, bool with_token,
                        const char *domain)
{
    char started[32], end[32];
    const struct session_opts *o = session_options(s);
    uint64_t mono_now = now_ms(), real_now = now_realtime_ms();
    uint64_t last_used = real_now - (mono_now - session_last_used_ms(s));
    uint64_t end_ms = last_used + o->idle_timeout_ms;
    if (b->deadline_ms && b->deadline_ms < end_ms)
        end_ms = b->deadline_ms;
    format_time_iso(b->started_ms, started);
    format_time_iso(end_ms, end);
    json_t *net = session_network_json(s); /* as updateNetwork left it */
    const char *mode = json_string_value(json_object_get(net, "mode"));
    bool internet = mode && !strcmp(mode, "internet"),
         allowlist = mode && !strcmp(mode, "allowlist");
    json_t *j =
        json_pack("{s:s,s:s,s:s,s:s,s:O,s:s,s:s,s:s,s:I,s:I,s:I,s:b}", "sandboxID", b->id,
                  "templateID", b->template_id, "clientID", "runcell", "envdVersion",
                  E2B_ENVD_VERSION, "metadata", b->metadata, "startedAt", started, "endAt", end,
                  "state", session_pause_state(s) == PAUSE_NONE ? "running" : "paused", "cpuCount",
                  (json_int_t)((o->limits.cpus_milli ? o->limits.cpus_milli : 1000) / 1000),
                  "memoryMB", (json_int_t)o->limits.memory_mb, "diskSizeMB",
                  (json_int_t)o->limits.disk_mb, "allowInternetAccess", internet);
    if (allowlist) {
        json_t *allow = json_object_get(net, "allow");
        json_object_set_new(j, "network",
                            allow ? json_pack("{s:O}", "allowOut", allow)
                                  : json_pack("{s:[]}", "allowOut"));
    }
    json_decref(net);
    if (with_token)
        json_object_set_new(j, "envdAccessToken", json_string(b->token));
    if (domain) /* the SDKs' getHost(port): PORT-ID.DOMAIN */
        json_object_set_new(j, "domain", json_string(domain));
    return j;
}

/* The parsed create's (or network update's) network onto runcell's, into rq->net (NULL:
 * loopback only): allowOut is the egress allowlist (within the server's cap); denyOut
 * ALL_TRAFFIC without it, loopback only; otherwise the public internet when
 * allow_internet_access asks for it or the operator made it E2B's default (--e2b-internet),
 * which E2B's Python SDK sends unless told otherwise. False after a 400. */
static bool network_policy(struct request *rq, const struct e2b_create *cr)
{
    const struct server_config *cfg = rq->srv->cfg;
    bool allowlist = cr->allow_out && cr->allow_out[0];
    if (!allowlist && !cr->deny_all && cr->internet == 1 && !cfg->e2b_internet) {
        e2b_error(rq, 400,
                  "field 'allow_internet_access': this server gives E2B sandboxes no internet "
                  "access unless its operator allows it (runcell serve --e2b-internet); create "
                  "the sandbox with allow_internet_access=False (Python: Sandbox.create("
                  "allow_internet_access=False); JavaScript: allowInternetAccess: false), or "
                  "name the hosts it may reach in network.allowOut (e.g. [\"pypi.org\"])");
        return false;
    }
    if (allowlist) {
        int r = net_policy_parse((const char **)cr->allow_out, strv_len(cr->allow_out), &rq->net);
        if (r < 0) {
            e2b_error(rq, 400, "field 'network.allowOut': %s", err_msg());
            return false;
        }
        if (cfg->net_allow_max && !net_policy_within(rq->net, cfg->net_allow_max)) {
            e2b_error(rq, 400,
                      "field 'network.allowOut' names hosts this server does not allow "
                      "(see runcell serve --net-allow-max)");
            return false;
        }
    } else if (!cr->deny_all && cr->internet != 0 && cfg->e2b_internet) {
        rq->net = net_policy_internet();
    }
    if (rq->net) {
        rq->net->max_connections = cfg->limits.max_net_connections;
        rq->net->max_bytes = cfg->limits.max_net_bytes;
    }
    return true;
}

static bool create_network(struct request *rq, const struct e2b_create *cr, struct session_opts *o)
{
    if (!network_policy(rq, cr))
        return false;
    o->net.policy = rq->net;
    return true;
}

/* Makes the sandbox's envVars the kernel's environment (bash cells and commands inherit
 * it): one quiet cell before anything else runs. */
static int apply_env(struct session *s, json_t *env)
{
    if (!env || !json_object_size(env))
        return 0;
    const char *k;
    json_t *v;
    json_object_foreach(env, k, v) if (!e2b_env_name_ok(k)) return err_set(
        EINVAL, "field 'envVars': '%s' is not an environment variable name", k);
    char *lit = json_dumps(env, JSON_COMPACT);
    _cleanup_free_ char *code = xasprintf("__import__('os').environ.update(%s)", lit);
    free(lit);
    struct exec_request req = {.code = code, .cancel_fd = -1};
    struct exec_record rec;
    exec_record_init(&rec, 4096);
    int r = session_execute(s, &req, NULL, &rec);
    if (r == 0 && rec.status != EXEC_OK)
        r = err_set(EIO, "could not set envVars in the sandbox");
    exec_record_release(&rec);
    return r;
}

enum MHD_Result h_e2b_create(struct request *rq)
{
    json_t *body = e2b_body(rq);
    struct session_opts o;
    char *id = NULL;
    enum MHD_Result ret = MHD_YES;
    if (!body)
        return MHD_YES;
    o = rq->srv->cfg->defaults;
    struct e2b_create cr;
    char why[512];
    if (e2b_create_parse(body, rq->srv->cfg->limits.max_idle_timeout_ms / 1000, &cr, why) < 0) {
        ret = e2b_error(rq, 400, "%s", why);
        goto out;
    }
    bool net_ok = create_network(rq, &cr, &o);
    strv_free(cr.allow_out);
    if (!net_ok)
        goto out;
    const char *tmpl = cr.template_id;
    json_t *metadata = cr.metadata, *env = cr.env;
    uint64_t timeout_s = cr.timeout_s;
    /* E2B's timeout is runcell's idle expiry: a sandbox left alone that long is reaped. A
     * cell may run as long as the server allows; the client's own timeout interrupts it. */
    o.idle_timeout_ms = (uint64_t)timeout_s * 1000;
    o.timeout_ms = rq->srv->cfg->limits.max_timeout_ms;
    o.home_dir = E2B_HOME; /* HOME and every start directory, as in E2B */
    if (cr.auto_pause) {
        /* autoPause: idle that long, it is paused (keeping its memory, or hibernated), and
         * lives on paused until killed or the server's longest idle time passes. */
        o.hibernate_after_ms = o.idle_timeout_ms;
        o.pause_keeps_memory = cr.auto_pause_memory;
        o.idle_timeout_ms = rq->srv->cfg->limits.max_idle_timeout_ms;
    }
    struct session_create create = {.opts = &o, .no_persist = true};
    if (cr.snapshot[0]) { /* Sandbox.create(snapshotId): a sandbox that starts from it */
        json_t *rec = NULL;
        if (snapshot_get(&rq->srv->persist, cr.snapshot, &rec) < 0) {
            ret = e2b_error(rq, 404, "template '%s' not found: no snapshot %s on this server", tmpl,
                            cr.snapshot);
            goto out;
        }
        json_decref(rec);
        create.resume_from = cr.snapshot;
    }
    int r = session_table_create_ex(rq->srv->table, &create, &id, NULL);
    if (r < 0) {
        if (r != -EAGAIN)
            metrics_sandbox_failure(rq->srv->metrics);
        ret = r == -EAGAIN ? e2b_error(rq, 429, "%s", err_msg())
                           : e2b_error(rq, 503, "cannot create the sandbox: %s", err_msg());
        goto out;
    }
    rq->session_id = xstrdup(id);
    int err;
    struct session *s = session_table_acquire(rq->srv->table, id, &err);
    if (!s) {
        ret = e2b_error(rq, 503, "sandbox %s was closed as it was created", id);
        goto out;
    }
    if ((r = apply_env(s, env)) < 0) {
        session_table_put(rq->srv->table, s);
        session_table_close(rq->srv->table, id, false, NULL);
        ret = e2b_error(rq, r == -EINVAL ? 400 : 503, "%s", err_msg());
        goto out;
    }
    struct e2b_box *b = xcalloc(1, sizeof(*b));
    b->id = xstrdup(id);
    b->token = random_hex(16);
    b->template_id = xstrdup(tmpl);
    b->metadata = json_is_object(metadata) ? json_deep_copy(metadata) : json_object();
    b->contexts =
        json_pack("[{s:s,s:s,s:s}]", "id", "default", "language", "python", "cwd", E2B_HOME);
    b->started_ms = now_realtime_ms();
    b->env = env ? json_deep_copy(env) : json_object();
    b->auto_pause = cr.auto_pause;
    b->auto_pause_memory = cr.auto_pause_memory;
    json_t *info = box_json(b, s, true, rq->srv->cfg->e2b_domain);
    e2b_box_add(rq, b); /* before the put: a session that ends from now on takes its box */
    session_table_put(rq->srv->table, s);
    ret = reply_json(rq, 201, info);
out:
    free(id);
    json_decref(body);
    return ret;
}

/* The {id} sandbox's description (a 404 in E2B's shape when it is gone). */
static enum MHD_Result reply_box(struct request *rq, unsigned status, bool with_token)
{
    const char *id = rq->params[0];
    e2b_expire_if_due(rq, id);
    int err;
    struct session *s = session_table_acquire(rq->srv->table, id, &err);
    struct e2b *e = rq->srv->e2b;
    pthread_mutex_lock(&e->lock);
    struct e2b_box *b = e2b_box_find(e, id);
    json_t *j = b && s ? box_json(b, s, with_token, rq->srv->cfg->e2b_domain) : NULL;
    pthread_mutex_unlock(&e->lock);
    if (s)
        session_table_put(rq->srv->table, s);
    if (!j) {
        if (b)
            e2b_box_forget(e, id);
        return e2b_error(rq, 404, "sandbox %s not found", id);
    }
    return reply_json(rq, status, j);
}

enum MHD_Result h_e2b_get(struct request *rq)
{
    return reply_box(rq, 200, false);
}

/* The {id} sandbox, resumed when paused: 0 and *ret_resumed, or after an E2B error reply. */
static int resume_box(struct request *rq, bool *ret_resumed)
{
    const char *id = rq->params[0];
    int err;
    *ret_resumed = false;
    e2b_expire_if_due(rq, id);
    struct session *s = session_table_acquire(rq->srv->table, id, &err);
    if (!s) {
        e2b_error(rq, 404, "sandbox %s not found", id);
        return -ENOENT;
    }
    json_t *report = NULL;
    int r = session_pause_state(s) == PAUSE_NONE ? 0 : session_resume(s, &report);
    *ret_resumed = r == 0 && report;
    json_decref(report);
    session_table_put(rq->srv->table, s);
    if (r < 0 && r != -EALREADY) {
        e2b_error(rq, 503, "sandbox %s could not be resumed: %s", id, err_msg());
        return r;
    }
    return 0;
}

enum MHD_Result h_e2b_connect(struct request *rq)
{
    json_t *body = e2b_body(rq);
    if (!body)
        return MHD_YES;
    json_decref(body);
    bool resumed;
    if (resume_box(rq, &resumed) < 0)
        return MHD_YES;
    return reply_box(rq, resumed ? 201 : 200, true); /* 201: a paused sandbox came back */
}

enum MHD_Result h_e2b_resume(struct request *rq)
{
    json_t *body = e2b_body(rq);
    if (!body)
        return MHD_YES;
    json_decref(body);
    int err;
    struct session *s = session_table_acquire(rq->srv->table, rq->params[0], &err);
    bool running = s && session_pause_state(s) == PAUSE_NONE;
    if (s)
        session_table_put(rq->srv->table, s);
    if (running)
        return e2b_error(rq, 409, "sandbox %s is already running", rq->params[0]);
    bool resumed;
    if (resume_box(rq, &resumed) < 0)
        return MHD_YES;
    return reply_box(rq, 201, true);
}

enum MHD_Result h_e2b_pause(struct request *rq)
{
    json_t *body = e2b_body(rq);
    if (!body)
        return MHD_YES;
    /* memory: what the SDKs' keepMemory says; left out, E2B keeps it */
    json_t *mem = json_object_get(body, "memory");
    bool keep = !json_is_false(mem);
    bool typed = !mem || json_is_null(mem) || json_is_boolean(mem);
    json_decref(body);
    if (!typed)
        return e2b_error(rq, 400, "field 'memory' must be true or false");
    const char *id = rq->params[0];
    e2b_expire_if_due(rq, id);
    int err;
    struct session *s = session_table_acquire(rq->srv->table, id, &err);
    if (!s)
        return e2b_error(rq, 404, "sandbox %s not found", id);
    json_t *report = NULL;
    int r = session_pause(s, keep, &report);
    session_table_put(rq->srv->table, s);
    json_decref(report);
    if (r == -EALREADY)
        return e2b_error(rq, 409, "sandbox %s is already paused", id);
    if (r < 0)
        return e2b_error(rq, r == -EINVAL ? 400 : 503, "sandbox %s could not be paused: %s", id,
                         err_msg());
    return e2b_reply_empty(rq, 204);
}

/* ---- snapshots and forks: runcell's (snapshot.c) ---- */

/* E2B's SnapshotInfo of one of runcell's snapshot records. */
static json_t *snapshot_info(json_t *rec)
{
    const char *name = json_string_value(json_object_get(rec, "name"));
    return json_pack("{s:O,s:[s]}", "snapshotID", json_object_get(rec, "id"), "names",
                     name ? name : json_string_value(json_object_get(rec, "id")));
}

enum MHD_Result h_e2b_snapshot_create(struct request *rq)
{
    json_t *body = e2b_body(rq);
    if (!body)
        return MHD_YES;
    json_t *nv = json_object_get(body, "name");
    _cleanup_free_ char *name = json_is_string(nv) ? xstrdup(json_string_value(nv)) : NULL;
    json_decref(body);
    const char *id = rq->params[0];
    int err;
    struct session *s = session_table_acquire(rq->srv->table, id, &err);
    if (!s)
        return e2b_error(rq, 404, "sandbox %s not found", id);
    json_t *rec = NULL;
    int r = snapshot_create(&rq->srv->persist, s, name, rq->srv->cfg->limits.max_snapshots, &rec);
    session_table_put(rq->srv->table, s);
    if (r < 0)
        return e2b_error(rq, r == -EAGAIN ? 429 : r == -EINVAL ? 400 : 503, "%s", err_msg());
    json_t *info = snapshot_info(rec);
    json_decref(rec);
    return reply_json(rq, 201, info);
}

enum MHD_Result h_e2b_snapshot_list(struct request *rq)
{
    const char *box = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "sandboxID");
    const char *name = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "name");
    json_t *all = snapshot_list(&rq->srv->persist, 0), *out = json_array(), *rec;
    size_t i;
    json_array_foreach(all, i, rec)
    {
        const char *from = json_string_value(json_object_get(rec, "from"));
        const char *n = json_string_value(json_object_get(rec, "name"));
        const char *sid = json_string_value(json_object_get(rec, "id"));
        if (box && *box && (!from || strcmp(from, box)))
            continue;
        if (name && *name && strcmp(name, n ? n : "") && strcmp(name, sid ? sid : ""))
            continue;
        json_array_append_new(out, snapshot_info(rec));
    }
    json_decref(all);
    return reply_json(rq, 200, out);
}

enum MHD_Result h_e2b_template_delete(struct request *rq)
{
    /* deleteSnapshot names a snapshot as a template; other templates are not runcell's */
    const char *id = rq->params[1] ? rq->params[1] : rq->params[0];
    char snap[40];
    size_t n = id ? strcspn(id, ":") : 0;
    if (n != 32 || strspn(id, "0123456789abcdef") < 32)
        return h_e2b_unsupported(rq);
    snprintf(snap, sizeof(snap), "%.32s", id);
    int r = snapshot_delete(&rq->srv->persist, snap);
    if (r == -ENOENT)
        return e2b_error(rq, 404, "template %s not found: no snapshot of that id", id);
    if (r < 0)
        return e2b_error(rq, 503, "%s", err_msg());
    return e2b_reply_empty(rq, 204);
}

enum MHD_Result h_e2b_fork(struct request *rq)
{
    json_t *body = e2b_body(rq);
    if (!body)
        return MHD_YES;
    json_t *cv = json_object_get(body, "count"), *tv = json_object_get(body, "timeout");
    bool typed = (!cv || json_is_null(cv) || json_is_integer(cv)) &&
                 (!tv || json_is_null(tv) || json_is_integer(tv));
    json_int_t count = json_is_integer(cv) ? json_integer_value(cv) : 1;
    json_int_t timeout_s = json_is_integer(tv) ? json_integer_value(tv) : 0;
    json_decref(body);
    if (!typed)
        return e2b_error(rq, 400, "fields 'count' and 'timeout' must be whole numbers");
    uint64_t max_s = rq->srv->cfg->limits.max_idle_timeout_ms / 1000;
    if (count < 1 || count > SESSION_FORK_MAX)
        return e2b_error(rq, 400, "field 'count' must be 1 to %d", SESSION_FORK_MAX);
    if (timeout_s < 0 || (uint64_t)timeout_s > max_s)
        return e2b_error(rq, 400,
                         "field 'timeout' must be a whole number of seconds from 1 to %llu",
                         (unsigned long long)max_s);
    const char *id = rq->params[0];
    struct e2b *e = rq->srv->e2b;
    pthread_mutex_lock(&e->lock);
    struct e2b_box *parent = e2b_box_find(e, id);
    _cleanup_free_ char *tmpl = parent ? xstrdup(parent->template_id) : NULL;
    json_t *metadata = parent ? json_deep_copy(parent->metadata) : NULL;
    json_t *env = parent ? json_deep_copy(parent->env) : NULL;
    pthread_mutex_unlock(&e->lock);
    json_t *forks = NULL, *out = json_array(), *f;
    int r = parent ? session_table_fork(rq->srv->table, id, (unsigned)count, &forks) : -ENOENT;
    if (r < 0) {
        json_decref(metadata);
        json_decref(env);
        json_decref(out);
        if (r == -ENOENT)
            return e2b_error(rq, 404, "sandbox %s not found", id);
        return e2b_error(rq, r == -EAGAIN ? 429 : 503, "%s", err_msg());
    }
    size_t i;
    json_array_foreach(forks, i, f)
    {
        const char *fid = json_string_value(json_object_get(f, "id"));
        int err;
        struct session *s = session_table_acquire(rq->srv->table, fid, &err);
        if (!s) {
            json_array_append_new(out, json_pack("{s:{s:i,s:s}}", "error", "code", 503, "message",
                                                 "the fork was closed as it was made"));
            continue;
        }
        if (timeout_s)
            session_set_idle_timeout(s, (uint64_t)timeout_s * 1000);
        struct e2b_box *b = xcalloc(1, sizeof(*b));
        b->id = xstrdup(fid);
        b->token = random_hex(16);
        b->template_id = xstrdup(tmpl);
        b->metadata = json_deep_copy(metadata);
        b->contexts =
            json_pack("[{s:s,s:s,s:s}]", "id", "default", "language", "python", "cwd", E2B_HOME);
        b->started_ms = now_realtime_ms();
        b->env = json_deep_copy(env);
        json_array_append_new(
            out, json_pack("{s:o}", "sandbox", box_json(b, s, true, rq->srv->cfg->e2b_domain)));
        e2b_box_add(rq, b);
        session_table_put(rq->srv->table, s);
    }
    json_decref(forks);
    json_decref(metadata);
    json_decref(env);
    return reply_json(rq, 201, out);
}

static bool box_matches(const struct e2b_box *b, json_t *want, const char *tmpl)
{
    const char *k;
    json_t *v;
    if (tmpl && strcmp(tmpl, b->template_id))
        return false;
    json_object_foreach(want, k, v)
    {
        json_t *have = json_object_get(b->metadata, k);
        if (!have || !json_equal(have, v))
            return false;
    }
    return true;
}

/* The list's state filter: "running,paused" (the JavaScript SDK) or state=running&state=paused
 * (the Python SDK's repeated parameter). */
struct states {
    bool given, running, paused;
};

static enum MHD_Result state_arg(void *ctx, enum MHD_ValueKind kind, const char *key,
                                 const char *value)
{
    struct states *st = ctx;
    (void)kind;
    if (key && !strcmp(key, "state")) {
        st->given = true;
        st->running |= value && strstr(value, "running");
        st->paused |= value && strstr(value, "paused");
    }
    return MHD_YES;
}

enum MHD_Result h_e2b_list(struct request *rq)
{
    struct states st = {0};
    MHD_get_connection_values(rq->conn, MHD_GET_ARGUMENT_KIND, state_arg, &st);
    const char *meta = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "metadata");
    const char *tmpl = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "template");
    json_t *arr = json_array();
    char why[256];
    json_t *want = meta && *meta ? e2b_metadata_parse(meta, why) : json_object();
    if (!want) {
        json_decref(arr);
        return e2b_error(rq, 400, "query 'metadata': %s", why);
    }
    struct e2b *e = rq->srv->e2b;
    _cleanup_strv_ char **ids = NULL;
    pthread_mutex_lock(&e->lock);
    for (struct e2b_box *b = e->boxes; b; b = b->next)
        ids = strv_push(ids, b->id);
    pthread_mutex_unlock(&e->lock);
    for (char **id = ids; id && *id; id++) {
        e2b_expire_if_due(rq, *id); /* past its setTimeout: gone, or paused, before it is listed */
        int err;
        struct session *s = session_table_acquire(rq->srv->table, *id, &err);
        if (!s) {
            e2b_box_forget(e, *id);
            continue;
        }
        pthread_mutex_lock(&e->lock);
        struct e2b_box *b = e2b_box_find(e, *id);
        bool paused = session_pause_state(s) != PAUSE_NONE;
        bool state_ok = !st.given || (paused ? st.paused : st.running);
        if (b && state_ok && box_matches(b, want, tmpl && *tmpl ? tmpl : NULL))
            json_array_append_new(arr, box_json(b, s, false, rq->srv->cfg->e2b_domain));
        pthread_mutex_unlock(&e->lock);
        session_table_put(rq->srv->table, s);
    }
    json_decref(want);
    return reply_json(rq, 200, arr);
}

enum MHD_Result h_e2b_kill(struct request *rq)
{
    const char *id = rq->params[0];
    struct e2b *e = rq->srv->e2b;
    pthread_mutex_lock(&e->lock);
    bool known = e2b_box_find(e, id) != NULL;
    pthread_mutex_unlock(&e->lock);
    if (!known)
        return e2b_error(rq, 404, "sandbox %s not found", id);
    e2b_box_forget(e, id);
    if (session_table_close(rq->srv->table, id, false, NULL) < 0)
        return e2b_error(rq, 404, "sandbox %s not found (it had expired)", id);
    return e2b_reply_empty(rq, 204);
}

enum MHD_Result h_e2b_timeout(struct request *rq)
{
    json_t *body = e2b_body(rq);
    if (!body)
        return MHD_YES;
    json_t *t = json_object_get(body, "timeout");
    json_int_t secs = json_is_integer(t) ? json_integer_value(t) : -1;
    json_decref(body);
    if (secs <= 0)
        return e2b_error(rq, 400, "field 'timeout' must be a whole number of seconds above 0");
    uint64_t max_s = rq->srv->cfg->limits.max_idle_timeout_ms / 1000;
    if ((uint64_t)secs > max_s)
        return e2b_error(rq, 400,
                         "field 'timeout': %lld s is past this server's longest, %llu s "
                         "(runcell serve --max-idle-timeout)",
                         (long long)secs, (unsigned long long)max_s);
    const char *id = rq->params[0];
    int err;
    struct session *s = session_table_acquire(rq->srv->table, id, &err);
    struct e2b *e = rq->srv->e2b;
    pthread_mutex_lock(&e->lock);
    struct e2b_box *b = s ? e2b_box_find(e, id) : NULL;
    if (b) {
        /* As E2B: the sandbox goes timeout seconds from now, used or not (unlike create's
         * timeout, runcell's idle expiry, which is raised to it so as not to come first). */
        b->deadline_ms = now_realtime_ms() + (uint64_t)secs * 1000;
        /* Left alone, it goes by itself that long after its last use: killed (runcell's idle
         * expiry, shortened or lengthened to it), or with autoPause paused (and then kept
         * until the server's longest idle time); touched after the deadline, at once. */
        if (b->auto_pause)
            session_set_hibernate_after(s, (uint64_t)secs * 1000);
        else
            session_set_idle_timeout(s, (uint64_t)secs * 1000);
    }
    pthread_mutex_unlock(&e->lock);
    if (s)
        session_table_put(rq->srv->table, s);
    if (!b)
        return e2b_error(rq, 404, "sandbox %s not found", id);
    return e2b_reply_empty(rq, 204);
}

enum MHD_Result h_e2b_refused(struct request *rq)
{
    return e2b_error(rq, 400,
                     "%s %s is not supported by runcell's E2B endpoint (a sandbox's logs have "
                     "no runcell counterpart yet; docs/E2B.md)",
                     rq->method, rq->route->pattern);
}

/* E2B's objects beside sandboxes: what each is, and what to do instead on runcell. */
enum MHD_Result h_e2b_unsupported(struct request *rq)
{
    const char *p = rq->route->pattern;
    const char *what, *instead;
    if (strstr(p, "/volume")) {
        what = "volumes";
        instead = "keep files in the sandbox's /home/user (files.write, files.read)";
    } else if (strstr(p, "/secrets")) {
        what = "secrets";
        instead = "pass values as envs to Sandbox.create (the sandbox's environment)";
    } else {
        what = "templates (building, listing, tags, aliases)";
        instead = "create sandboxes from the one template, code-interpreter-v1 (or base): "
                  "Python with numpy, pandas, matplotlib, bash, Node and git; install what "
                  "else you need in the sandbox (pip install --user, npm install in "
                  "/home/user)";
    }
    return e2b_error(rq, 400, "%s are not supported by runcell's E2B endpoint: %s", what, instead);
}

enum MHD_Result h_e2b_health(struct request *rq)
{
    const char *id = e2b_box_id(rq);
    struct session *s = e2b_box_session(rq, id);
    if (!s)
        return MHD_YES;
    session_table_put(rq->srv->table, s);
    return e2b_reply_empty(rq, 204);
}

/* The CPU use (percent of the sandbox's cores) since the last call for b, or since its start;
 * e->lock held. */
static double cpu_used_pct(struct e2b_box *b, const struct session_metrics *m, uint64_t cpus)
{
    uint64_t now = now_ms();
    double since_ms = b->metrics_at_ms ? (double)(now - b->metrics_at_ms)
                                       : (double)(now_realtime_ms() - b->started_ms);
    double cpu = m->cpu_ms - (b->metrics_at_ms ? b->metrics_cpu_ms : 0);
    if (cpu < 0) /* the kernel was replaced: its successor counts from 0 */
        cpu = m->cpu_ms;
    b->metrics_cpu_ms = m->cpu_ms;
    b->metrics_at_ms = now;
    if (since_ms < 1)
        return 0;
    double pct = cpu / since_ms / (double)cpus * 100.0;
    return pct < 0 ? 0 : pct > 100 ? 100 : pct;
}

/* One sample, now: what the session's cgroups and workspace hold (E2B samples every few
 * seconds and keeps them; runcell measures when asked). A start or end that leaves now out
 * of the window gives none. */
enum MHD_Result h_e2b_metrics(struct request *rq)
{
    const char *id = rq->params[0];
    const char *start = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "start");
    const char *end = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "end");
    uint64_t from = 0, to = UINT64_MAX;
    if ((start && parse_u64(start, &from) < 0) || (end && parse_u64(end, &to) < 0))
        return e2b_error(rq, 400, "query 'start' and 'end' are Unix times in seconds");
    e2b_expire_if_due(rq, id);
    int err;
    struct session *s = session_table_acquire(rq->srv->table, id, &err);
    if (!s)
        return e2b_error(rq, 404, "sandbox %s not found", id);
    struct session_metrics m;
    session_metrics(s, &m);
    session_table_put(rq->srv->table, s);
    uint64_t cpus = m.cpus_milli >= 1000 ? m.cpus_milli / 1000 : 1;
    uint64_t now = now_realtime_ms();
    char stamp[32];
    format_time_iso(now, stamp);
    struct e2b *e = rq->srv->e2b;
    pthread_mutex_lock(&e->lock);
    struct e2b_box *b = e2b_box_find(e, id);
    double pct = b ? cpu_used_pct(b, &m, cpus) : 0;
    pthread_mutex_unlock(&e->lock);
    if (!b)
        return e2b_error(rq, 404, "sandbox %s not found", id);
    json_t *arr = json_array();
    if (now / 1000 + 1 >= from && now / 1000 <= to)
        json_array_append_new(
            arr, json_pack("{s:I,s:f,s:I,s:I,s:I,s:I,s:I,s:s,s:I}", "cpuCount", (json_int_t)cpus,
                           "cpuUsedPct", pct, "memUsed", (json_int_t)m.mem_used_bytes, "memTotal",
                           (json_int_t)m.mem_total_bytes, "memCache", (json_int_t)m.mem_cache_bytes,
                           "diskUsed", (json_int_t)m.disk_used_bytes, "diskTotal",
                           (json_int_t)m.disk_total_bytes, "timestamp", stamp, "timestampUnix",
                           (json_int_t)(now / 1000)));
    return reply_json(rq, 200, arr);
}

/* updateNetwork: PUT /sandboxes/{id}/network {allowOut, denyOut, allow_internet_access},
 * which replaces the whole egress configuration (what it leaves out is cleared), by the
 * create's rules. Only a sandbox made with a network has an egress proxy to change. */
enum MHD_Result h_e2b_network(struct request *rq)
{
    static const char *const known[] = {"allowOut", "denyOut", "allow_internet_access"};
    const char *id = rq->params[0];
    json_t *body = e2b_body(rq);
    if (!body)
        return MHD_YES;
    enum MHD_Result ret = MHD_YES;
    json_t *net = json_object(), *create = NULL;
    const char *k;
    json_t *v;
    json_object_foreach(body, k, v)
    {
        bool ours = false;
        for (size_t i = 0; i < ARRAY_SIZE(known) && !ours; i++)
            ours = !strcmp(k, known[i]);
        if (!ours && e2b_asks_for(v)) {
            ret = e2b_error(rq, 400,
                            "field '%.100s' is not supported by runcell's updateNetwork; "
                            "allowOut, denyOut [\"0.0.0.0/0\"] and allow_internet_access are",
                            k);
            goto out;
        }
        if (ours && strcmp(k, "allow_internet_access"))
            json_object_set(net, k, v);
    }
    create = json_pack("{s:O,s:O?}", "network", net, "allow_internet_access",
                       json_object_get(body, "allow_internet_access"));
    struct e2b_create cr;
    char why[512];
    if (e2b_create_parse(create, UINT64_MAX / 1000, &cr, why) < 0) {
        ret = e2b_error(rq, 400, "%s", why);
        goto out;
    }
    bool ok = network_policy(rq, &cr);
    strv_free(cr.allow_out);
    if (!ok)
        goto out;
    e2b_expire_if_due(rq, id);
    int err;
    struct session *s = session_table_acquire(rq->srv->table, id, &err);
    if (!s) {
        ret = e2b_error(rq, 404, "sandbox %s not found", id);
        goto out;
    }
    int r = session_network_replace(s, rq->net, rq->srv->cfg->net_allow_max);
    session_table_put(rq->srv->table, s);
    ret = r < 0 ? e2b_error(rq, r == -ENOTSUP || r == -EINVAL ? 400 : e2b_status_of(r),
                            "%s; or give the sandbox a network when you create it", err_msg())
                : e2b_reply_empty(rq, 204);
out:
    json_decref(create);
    json_decref(net);
    json_decref(body);
    return ret;
}
