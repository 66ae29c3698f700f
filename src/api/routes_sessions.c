/* routes_sessions.c - create, list, describe, close, interrupt and restart sessions; the
 * health and metrics endpoints. */
#include "api/api.h"

#include <errno.h>
#include <string.h>

static const struct field create_fields[] = {
    {"language", F_STRING},
    {"timeout_s", F_NUMBER},
    {"idle_timeout_s", F_NUMBER},
    {"memory_mb", F_INT},
    {"pids", F_INT},
    {"disk_mb", F_INT},
    {"cpus", F_NUMBER},
    {"network", F_OBJECT},
    {"secrets", F_ARRAY},
    {"packages", F_ARRAY},
    {"index_url", F_STRING},
    {"install_timeout_s", F_NUMBER},
    {"persist", F_BOOL},
    {"resume_from", F_STRING},
    {"history", F_INT},
    {"snapshot", F_STRING},
    {"hibernate_after_s", F_NUMBER},
};

/* Strings of a JSON array into a fresh vector; false after replying 400. */
static bool string_array(struct request *rq, json_t *arr, const char *field, char ***ret)
{
    size_t i;
    json_t *v;
    char **out = xcalloc(1, sizeof(char *));
    json_array_foreach(arr, i, v)
    {
        if (!json_is_string(v)) {
            strv_free(out);
            api_error(rq, AE_BAD_REQUEST, "field '%s': item %zu is not a string", field, i);
            return false;
        }
        out = strv_push(out, json_string_value(v));
    }
    *ret = out;
    return true;
}

static bool network_caps(struct request *rq, json_t *net, struct net_policy *p)
{
    const struct server_limits *max = &rq->srv->cfg->limits;
    p->max_connections = max->max_net_connections;
    p->max_bytes = max->max_net_bytes;
    return get_count(rq, net, "max_connections", max->max_net_connections, &p->max_connections) &&
           get_count(rq, net, "max_bytes", max->max_net_bytes, &p->max_bytes);
}

/* network: {mode: none|allowlist, allow: [...], max_connections, max_bytes} into rq->net
 * (NULL for none), checked against the server's cap (--net-allow-max); false after a 400. */
static bool parse_network(struct request *rq, json_t *net)
{
    static const struct field fields[] = {
        {"mode", F_STRING}, {"allow", F_ARRAY}, {"max_connections", F_INT}, {"max_bytes", F_INT}};
    _cleanup_strv_ char **allow = NULL;
    if (!net || json_is_null(net))
        return true;
    if (!check_fields(rq, net, fields, ARRAY_SIZE(fields)))
        return false;
    const char *mode = json_string_value(json_object_get(net, "mode"));
    json_t *list = json_object_get(net, "allow");
    if (!mode || !strcmp(mode, "none")) {
        if (json_array_size(list)) {
            api_error(rq, AE_BAD_REQUEST, "field 'network.allow' needs mode 'allowlist'");
            return false;
        }
        return true;
    }
    if (strcmp(mode, "allowlist")) {
        api_error(rq, AE_BAD_REQUEST,
                  "field 'network.mode': '%s' is not a mode; use 'none' "
                  "or 'allowlist'",
                  mode);
        return false;
    }
    if (!json_array_size(list)) {
        api_error(rq, AE_BAD_REQUEST,
                  "field 'network.allow': mode 'allowlist' needs at least "
                  "one entry (host, *.domain, host:port or IP:port)");
        return false;
    }
    if (!string_array(rq, list, "network.allow", &allow))
        return false;
    if (net_policy_parse((const char *const *)allow, strv_len(allow), &rq->net) < 0) {
        api_error(rq, AE_BAD_REQUEST, "field 'network.allow': %s", err_msg());
        return false;
    }
    if (!net_policy_within(rq->net, rq->srv->cfg->net_allow_max)) {
        api_error(rq, AE_BAD_REQUEST, "field 'network.allow': %s", err_msg());
        return false;
    }
    return network_caps(rq, net, rq->net);
}

static bool parse_packages(struct request *rq, json_t *body, struct net_opts *n)
{
    json_t *pk = json_object_get(body, "packages");
    if (pk && !json_is_null(pk)) {
        if (!string_array(rq, pk, "packages", &rq->packages))
            return false;
        n->packages = rq->packages;
    }
    n->index_url = json_string_value(json_object_get(body, "index_url"));
    if (!get_seconds(rq, body, "install_timeout_s", rq->srv->cfg->limits.max_install_timeout_ms,
                     &n->install_timeout_ms))
        return false;
    if (net_opts_check(n) < 0) {
        api_error(rq, AE_BAD_REQUEST, "%s", err_msg());
        return false;
    }
    return true;
}

bool session_opts_from_json(struct request *rq, json_t *body, struct session_opts *o)
{
    const struct server_limits *max = &rq->srv->cfg->limits;
    *o = rq->srv->cfg->defaults;
    const char *lang = json_string_value(json_object_get(body, "language"));
    if (lang && !lang_supported(lang)) {
        api_error(rq, AE_BAD_REQUEST,
                  "field 'language': '%s' is not supported; use python, "
                  "bash or javascript",
                  lang);
        return false;
    }
    o->lang = lang_name(lang);
    if (!get_seconds(rq, body, "timeout_s", max->max_timeout_ms, &o->timeout_ms) ||
        !get_seconds(rq, body, "idle_timeout_s", max->max_idle_timeout_ms, &o->idle_timeout_ms) ||
        !get_count(rq, body, "memory_mb", max->max_memory_mb, &o->limits.memory_mb) ||
        !get_count(rq, body, "pids", max->max_pids, &o->limits.pids) ||
        !get_count(rq, body, "disk_mb", max->max_disk_mb, &o->limits.disk_mb))
        return false;
    json_t *hib = json_object_get(body, "hibernate_after_s");
    if (json_is_number(hib) && json_number_value(hib) == 0)
        o->hibernate_after_ms = 0; /* never */
    else if (!get_seconds(rq, body, "hibernate_after_s", max->max_idle_timeout_ms,
                          &o->hibernate_after_ms))
        return false;
    json_t *hist = json_object_get(body, "history");
    if (json_is_integer(hist)) {
        json_int_t h = json_integer_value(hist);
        if (h < 0 || h > SESSION_HISTORY_MAX) {
            api_error(rq, AE_BAD_REQUEST,
                      "field 'history' is %lld: the cells a session can undo are 0 to %d",
                      (long long)h, SESSION_HISTORY_MAX);
            return false;
        }
        o->history = (unsigned)h;
    }
    json_t *cpus = json_object_get(body, "cpus");
    if (cpus && !json_is_null(cpus)) {
        double c = json_number_value(cpus);
        if (!(c > 0) || c * 1000 > (double)max->max_cpus_milli) {
            api_error(rq, AE_BAD_REQUEST, "field 'cpus' must be more than 0 and at most %g",
                      (double)max->max_cpus_milli / 1000.0);
            return false;
        }
        /* Shares are set in thousandths of a core: less would round to 0, which means
         * "the default" (a whole core) further down. */
        if (c < 0.001) {
            api_error(rq, AE_BAD_REQUEST,
                      "field 'cpus' is %g; the smallest CPU share is "
                      "0.001 of a core",
                      c);
            return false;
        }
        o->limits.cpus_milli = (uint64_t)(c * 1000 + 0.5);
    }
    json_t *net = json_object_get(body, "network");
    if (!parse_network(rq, net))
        return false;
    if (net && !json_is_null(net))
        o->net.policy = rq->net; /* else the server's default */
    /* Secrets (docs/NETWORK.md): parsed and checked against the allowlist in one call. */
    if (net_secrets_from_json(json_object_get(body, "secrets"), o->net.policy, &rq->secrets) < 0) {
        api_error(rq, AE_BAD_REQUEST, "%s", err_msg());
        return false;
    }
    o->net.secrets = rq->secrets;
    return parse_packages(rq, body, &o->net);
}

static json_t *session_info_base(const char *id, struct session *s);

json_t *session_info(const char *id, struct session *s)
{
    json_t *info = session_info_base(id, s);
    json_object_set_new(info, "network", session_network_json(s));
    json_object_set_new(info, "history", json_integer(session_options(s)->history));
    json_object_set_new(info, "state", json_string(session_pause_name(session_pause_state(s))));
    json_object_set_new(info, "undo", json_boolean(session_options(s)->history > 0));
    json_object_set_new(info, "hibernate_after_s",
                        json_real((double)session_options(s)->hibernate_after_ms / 1000.0));
    if (session_packages(s))
        json_object_set(info, "packages", session_packages(s));
    return info;
}

static json_t *session_info_base(const char *id, struct session *s)
{
    uint64_t created_ms = session_created_ms(s);
    const struct session_opts *o = session_options(s);
    char created[32], used[32], expires[32];
    /* last_used is monotonic; place it on the wall clock through "now". */
    uint64_t mono_now = now_ms(), real_now = now_realtime_ms();
    uint64_t last_used = real_now - (mono_now - session_last_used_ms(s));
    format_time_iso(created_ms, created);
    format_time_iso(last_used, used);
    format_time_iso(last_used + o->idle_timeout_ms, expires);
    return json_pack(
        "{s:s,s:s,s:s,s:I,s:s,s:s,s:s,s:I,s:s,s:f,s:f,s:{s:I,s:I,s:I,s:f},s:b,s:b}", "id", id,
        "language", o->lang ? o->lang : "python", "status", session_active(s) ? "busy" : "idle",
        "queued", (json_int_t)session_queued(s), "created_at", created, "last_used_at", used,
        "expires_at", expires, "execution_count", (json_int_t)session_execution_count(s),
        "python_version", session_python_version(s), "timeout_s", (double)o->timeout_ms / 1000.0,
        "idle_timeout_s", (double)o->idle_timeout_ms / 1000.0, "limits", "memory_mb",
        (json_int_t)o->limits.memory_mb, "pids", (json_int_t)o->limits.pids, "disk_mb",
        (json_int_t)o->limits.disk_mb, "cpus", (double)o->limits.cpus_milli / 1000.0,
        "limits_degraded", session_limits_degraded(s), "persist", session_stores_files(s));
}

struct session *acquire_session(struct request *rq)
{
    int err = -ENOENT;
    struct session *s = session_table_acquire(rq->srv->table, rq->params[0], &err);
    if (s && fleet_check(rq, rq->params[0], s))
        return s;
    if (rq->responded)
        return NULL;
    if (fleet_takeover(rq, rq->params[0], &s))
        return s;
    reply_not_live(rq, err);
    return NULL;
}

enum MHD_Result h_session_create(struct request *rq)
{
    json_t *body = body_json(rq), *restored = NULL;
    struct session_opts o;
    struct session_create create = {.opts = &o};
    char *id = NULL;
    enum MHD_Result ret = MHD_YES;
    if (!body)
        return MHD_YES;
    if (!check_fields(rq, body, create_fields, ARRAY_SIZE(create_fields)) ||
        !resume_options(rq, &body) || !session_opts_from_json(rq, body, &o))
        goto out;
    create.resume_from = json_string_value(json_object_get(body, "resume_from"));
    create.no_persist = json_is_false(json_object_get(body, "persist"));
    const char *snap = json_string_value(json_object_get(body, "snapshot"));
    if (snap) {
        json_t *rec = NULL;
        if (create.resume_from) {
            ret = api_error(rq, AE_BAD_REQUEST,
                            "fields 'snapshot' and 'resume_from' both name where the session "
                            "starts from: give one");
            goto out;
        }
        int sr = snapshot_get(&rq->srv->persist, snap, &rec);
        if (sr < 0) {
            ret = api_errno(rq, sr);
            goto out;
        }
        json_decref(rec);
        create.resume_from = snap; /* its state is stored as a session's is */
    }
    double t0 = now_ms_f();
    int r = session_table_create_ex(rq->srv->table, &create, &id, &restored);
    if (r < 0) {
        if (r != -EAGAIN && r != -ENOENT)
            metrics_sandbox_failure(rq->srv->metrics);
        ret = r == -EAGAIN ? api_errno(rq, r)
              : r == -ENOENT
                  ? api_error(rq, AE_NOT_FOUND, "%s", err_msg())
                  : api_error(rq, AE_SANDBOX, "cannot create the session: %s", err_msg());
        goto out;
    }
    metrics_session_created(rq->srv->metrics, (now_ms_f() - t0) / 1000.0);
    rq->session_id = xstrdup(id);
    int err;
    struct session *s = session_table_acquire(rq->srv->table, id, &err);
    if (!s) {
        json_decref(restored);
        ret = api_error(rq, AE_NOT_FOUND, "session %s was closed as it was created", id);
        goto out;
    }
    json_t *info = session_info(id, s);
    if (restored)
        json_object_set_new(info, "restored", restored);
    char *location = xasprintf("/v1/sessions/%s", id);
    ret = reply_json_header(rq, 201, info, "Location", location);
    free(location);
    session_table_put(rq->srv->table, s);
out:
    free(id);
    /* The secrets' values live on in the session's proxy only. */
    net_secrets_json_wipe(json_object_get(body, "secrets"));
    if (rq->body.data)
        explicit_bzero(rq->body.data, rq->body.len);
    json_decref(body);
    return ret;
}

struct list_ctx {
    json_t *arr;
};

static void add_info(void *ctx, const char *id, struct session *s)
{
    struct list_ctx *l = ctx;
    json_array_append_new(l->arr, session_info(id, s));
}

enum MHD_Result h_session_list(struct request *rq)
{
    struct list_ctx l = {.arr = json_array()};
    const char *all = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "all");
    session_table_foreach(rq->srv->table, add_info, &l);
    json_t *j = json_pack("{s:o}", "sessions", l.arr);
    if (all && (!strcmp(all, "true") || !strcmp(all, "1")))
        json_object_set_new(j, "stored", session_stored_list(&rq->srv->persist, 1000));
    return reply_json(rq, 200, j);
}

enum MHD_Result h_session_get(struct request *rq)
{
    struct session *s = acquire_session(rq);
    if (!s)
        return MHD_YES;
    enum MHD_Result r = reply_json(rq, 200, session_info(rq->params[0], s));
    session_table_put(rq->srv->table, s);
    return r;
}

enum MHD_Result h_session_interrupt(struct request *rq)
{
    struct session *s = acquire_session(rq);
    if (!s)
        return MHD_YES;
    bool busy = session_busy(s);
    session_interrupt(s);
    session_table_put(rq->srv->table, s);
    return reply_json(rq, 200, json_pack("{s:s,s:b}", "id", rq->params[0], "interrupted", busy));
}

enum MHD_Result h_session_restart(struct request *rq)
{
    struct session *s = acquire_session(rq);
    if (!s)
        return MHD_YES;
    int r = session_restart(s);
    enum MHD_Result ret;
    if (r == -EBUSY)
        ret = api_errno(rq, r);
    else if (r < 0)
        ret = api_error(rq, AE_SANDBOX, "cannot restart the interpreter: %s", err_msg());
    else
        ret = reply_json(rq, 200, session_info(rq->params[0], s));
    session_table_put(rq->srv->table, s);
    return ret;
}

/* PATCH /v1/sessions/{id}/network: {allow | allow_add, allow_remove, secrets | secrets_add,
 * secrets_remove}, effective for new connections (docs/NETWORK.md). */
enum MHD_Result h_session_network(struct request *rq)
{
    json_t *body = body_json(rq);
    if (!body)
        return MHD_YES;
    struct session *s = acquire_session(rq);
    enum MHD_Result ret = MHD_YES;
    if (s) {
        int r = session_network_change(s, body, rq->srv->cfg->net_allow_max);
        /* A session without a proxy (mode none) is a bad request too: its message says to
         * create the session with an allowlist. */
        ret = r < 0 ? api_error(rq, AE_BAD_REQUEST, "%s", err_msg())
                    : reply_json(rq, 200, session_network_json(s));
        session_table_put(rq->srv->table, s);
    }
    net_secrets_json_wipe(json_object_get(body, "secrets"));
    net_secrets_json_wipe(json_object_get(body, "secrets_add"));
    if (rq->body.data)
        explicit_bzero(rq->body.data, rq->body.len);
    json_decref(body);
    return ret;
}

enum MHD_Result h_session_events(struct request *rq)
{
    const char *after = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "after");
    uint64_t after_seq = 0;
    if (after && parse_u64(after, &after_seq) < 0)
        return api_error(rq, AE_BAD_REQUEST,
                         "query 'after' must be an event seq (a whole "
                         "number), not '%s'",
                         after);
    struct session *s = acquire_session(rq);
    if (!s)
        return MHD_YES;
    json_t *j = session_events(s, after_seq);
    json_object_set_new(j, "id", json_string(rq->params[0]));
    session_table_put(rq->srv->table, s);
    return reply_json(rq, 200, j);
}

enum MHD_Result h_healthz(struct request *rq)
{
    bool down = atomic_load(&rq->srv->shutting_down);
    unsigned status = down ? 503 : 200;
    json_t *j = json_pack("{s:s,s:I,s:I,s:s}", "status", down ? "shutting_down" : "ok", "sessions",
                          (json_int_t)session_table_count(rq->srv->table), "hibernated",
                          (json_int_t)session_hibernated_count(), "node", rq->srv->node);
    if (rq->srv->fleet)
        fleet_healthz(rq->srv, j, &status);
    return reply_json(rq, status, j);
}

enum MHD_Result h_metrics(struct request *rq)
{
    struct server *srv = rq->srv;
    struct metrics_gauges g = {
        .live_sessions = session_table_count(srv->table),
        .running_executions = exec_gate_running(session_table_gate(srv->table)),
        .queued_executions = exec_gate_waiting(session_table_gate(srv->table)),
        .pool_ready = session_pool_ready(srv->pool),
        .template_ready_ms = sandbox_host_template_ready_ms(&srv->host),
        .connections_evicted = conn_guard_evicted(srv->conns),
    };
    char *text = metrics_render(srv->metrics, &g);
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4");
    return reply_response(rq, 200, r);
}

enum MHD_Result h_session_undo(struct request *rq)
{
    static const struct field fields[] = {{"before", F_INT}};
    json_t *body = body_json(rq), *report = NULL;
    if (!body)
        return MHD_YES;
    if (!check_fields(rq, body, fields, ARRAY_SIZE(fields))) {
        json_decref(body);
        return MHD_YES;
    }
    json_int_t before = json_integer_value(json_object_get(body, "before"));
    json_decref(body);
    if (before < 0)
        return api_error(rq, AE_BAD_REQUEST, "field 'before' must be an execution count");
    struct session *s = acquire_session(rq);
    if (!s)
        return MHD_YES;
    int r = session_undo(s, (long)before, &report);
    session_table_put(rq->srv->table, s);
    if (r == -ENOENT)
        return api_error(rq, AE_NOT_FOUND, "%s", err_msg());
    if (r < 0)
        return api_errno(rq, r);
    return reply_json(rq, 200, report);
}
