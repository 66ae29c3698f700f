/* routes_fleet.c - a node of a fleet: its name, its leases, taking over the sessions of a
 * node that is gone (under the same id, saying what was lost), and checkpoints on demand. */
#include "api/api.h"

#include <ctype.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>

int fleet_node_name(const char *given, char **ret)
{
    char host[256] = "";
    if (given) {
        if (!node_name_valid(given))
            return err_set(EINVAL,
                           "--node '%s' is not a short DNS label: 1 to 32 of a-z, 0-9 and '-', "
                           "not starting or ending with '-'",
                           given);
        *ret = xstrdup(given);
        return 0;
    }
    if (gethostname(host, sizeof(host) - 1) < 0)
        return err_set(errno, "cannot read the host name: %s; pass --node NAME", strerror(errno));
    /* A fully qualified name gives its first label; what a label cannot hold becomes '-',
     * so that any host name makes a node name (--node is checked, not mended). */
    host[strcspn(host, ".")] = '\0';
    size_t n = 0;
    for (char *p = host; *p && n < 32; p++) {
        char c = (char)tolower((unsigned char)*p);
        host[n++] = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ? c : '-';
    }
    while (n && host[n - 1] == '-')
        n--;
    host[n] = '\0';
    const char *start = host + strspn(host, "-");
    if (!*start)
        start = "node";
    memmove(host, start, strlen(start) + 1);
    *ret = xstrdup(host);
    return 0;
}

/* The listen address, or for a wildcard one the host name with its port: where other
 * nodes forward requests (--advertise says it when neither is right). */
static char *default_advertise(const char *listen)
{
    const char *port = strrchr(listen, ':');
    size_t hl = port ? (size_t)(port - listen) : 0;
    char host[256] = "";
    if (!port)
        return xstrdup(listen);
    bool wildcard = (hl == 7 && !strncmp(listen, "0.0.0.0", 7)) ||
                    (hl == 4 && !strncmp(listen, "[::]", 4)) || (hl == 1 && listen[0] == '*') ||
                    hl == 0;
    if (!wildcard || gethostname(host, sizeof(host) - 1) < 0 || !*host)
        return xstrdup(listen);
    return xasprintf("%s%s", host, port);
}

struct fence_ctx {
    struct server *srv;
    enum fleet_fence_step step;
    char **ids;
};

/* Only sessions with a record in the store can move to another node: those are fenced. */
static void fence_one(void *arg, const char *id, struct session *s)
{
    struct fence_ctx *x = arg;
    if (!session_stores_files(s))
        return;
    if (x->step == FENCE_BEGIN)
        session_interrupt(s);
    else if (x->step == FENCE_KILL && session_busy(s))
        session_kill(s);
    else if (x->step == FENCE_DROP)
        x->ids = strv_push(x->ids, id);
}

static void on_fence(void *ctx, enum fleet_fence_step step)
{
    struct server *srv = ctx;
    struct fence_ctx x = {.srv = srv, .step = step, .ids = xcalloc(1, sizeof(char *))};
    if (step == FENCE_LIFTED) {
        strv_free(x.ids);
        return;
    }
    session_table_foreach(srv->table, fence_one, &x);
    /* The sessions' records stay as they are: another node takes them once this node's
     * lease has expired; nothing of this node's copy is written. */
    for (char **id = x.ids; *id; id++)
        if (session_table_drop(srv->table, *id) == 0)
            log_warn("msg=\"session dropped: the node's lease lapsed\" session=%s", *id);
    if (x.ids[0])
        log_warn("msg=\"fenced node dropped its sessions\" count=%zu", strv_len(x.ids));
    strv_free(x.ids);
}

int fleet_open(struct server *srv)
{
    uint64_t ttl = srv->cfg->lease_ttl_ms ? srv->cfg->lease_ttl_ms : DEFAULT_LEASE_TTL_MS;
    _cleanup_free_ char *advertise =
        srv->cfg->advertise ? xstrdup(srv->cfg->advertise) : default_advertise(srv->cfg->listen);
    int r = fleet_new(srv->store, srv->node, advertise, ttl, srv->watchdog_fd, &srv->fleet);
    if (r < 0)
        return err_set(-r, "--fleet: %s", err_msg());
    srv->watchdog_fd = -1; /* the fleet's now */
    srv->persist.fleet = srv->fleet;
    log_info("msg=\"fleet node\" node=%s advertise=%s lease_ttl_ms=%llu store=%s", srv->node,
             advertise, (unsigned long long)ttl, log_quote(store_describe(srv->store)));
    struct fleet_hooks hooks = {.fence = on_fence, .ctx = srv};
    return fleet_start(srv->fleet, &hooks);
}

/* What a takeover cannot bring back, for the response. */
static json_t *lost_list(json_t *restored)
{
    json_t *lost = json_array();
    bool vars = json_object_get(restored, "variables") != NULL;
    json_array_append_new(lost, json_string(vars ? "variables since the last checkpoint"
                                                 : "variables: no checkpoint was stored"));
    json_array_append_new(lost, json_string("files changed after the last completed execution"));
    json_array_append_new(lost, json_string("running processes and a cell that was running"));
    if (json_array_size(json_object_get(restored, "files_failed")))
        json_array_append_new(lost, json_string("files that could not be restored (see "
                                                "restored.files_failed)"));
    return lost;
}

/* The stored options into session options (the server's caps apply); false after a reply. */
static bool takeover_options(struct request *rq, json_t *rec, struct session_opts *o)
{
    json_t *opts = json_object_get(rec, "options"), *secrets = NULL;
    json_t *body = json_is_object(opts) ? json_deep_copy(opts) : json_object();
    json_object_del(body, "persist");
    const char *id = json_string_value(json_object_get(rec, "id"));
    if (session_unseal_secrets(&rq->srv->persist, id ? id : "", body, &secrets) < 0) {
        api_error(rq, AE_SANDBOX, "cannot take over: %s", err_msg());
        json_decref(body);
        return false;
    }
    bool ok = session_opts_from_json(rq, body, o);
    if (ok && secrets && net_secrets_from_json(secrets, o->net.policy, &rq->secrets) < 0) {
        api_error(rq, AE_SANDBOX, "cannot take over: its kept secrets: %s", err_msg());
        ok = false;
    }
    o->net.secrets = rq->secrets;
    net_secrets_json_wipe(secrets);
    json_decref(secrets);
    json_decref(body);
    return ok;
}

bool fleet_takeover(struct request *rq, const char *id, struct session **ret)
{
    struct server *srv = rq->srv;
    json_t *rec = NULL, *restored = NULL;
    struct session_opts o;
    char *new_id = NULL;
    *ret = NULL;
    if (!srv->fleet || !session_id_valid(id))
        return false;
    int r, err = -ENOENT;
    bool wait_for_owner = false;
    for (int tries = 0;; tries++) {
        r = fleet_lease_take(srv->fleet, id, wait_for_owner, &rec);
        /* Another node owns it and renews its lease: that node serves this request (it won
         * a race for it, or the router's pick is not its node); when it does not answer, it
         * is waited for, as a node that died before its lease ends. */
        if (r == -EBUSY) {
            if (fleet_forward_now(rq))
                return true;
            if (!wait_for_owner && tries < 3) {
                wait_for_owner = true;
                continue;
            }
        }
        if (r != -EALREADY)
            break;
        /* Another request of this node took it over meanwhile: it is served here; or that
         * takeover failed, and this one tries again. */
        if ((*ret = session_table_acquire(srv->table, id, &err)))
            return true;
        if (tries >= 3) {
            reply_not_live(rq, err);
            return true;
        }
    }
    if (r == -ENOENT)
        return false;
    if (r < 0) {
        api_error(rq,
                  r == -EBUSY    ? AE_MOVED
                  : r == -ENOLCK ? AE_FENCED
                                 : AE_SANDBOX,
                  "%s", err_msg());
        return true;
    }
    if (!takeover_options(rq, rec, &o)) {
        fleet_lease_release(srv->fleet, id, "stopped", NULL);
        fleet_lease_taken(srv->fleet, id);
        json_decref(rec);
        return true;
    }
    struct session_create create = {.opts = &o, .resume_from = id, .id = id};
    r = session_table_create_ex(srv->table, &create, &new_id, &restored);
    fleet_lease_taken(srv->fleet, id);
    if (r < 0) {
        api_error(rq, r == -EAGAIN ? AE_LIMIT : AE_SANDBOX,
                  "cannot take over session %s on node %s: %s", id, srv->node, err_msg());
        json_decref(rec);
        return true;
    }
    free(new_id);
    struct session *s = session_table_acquire(srv->table, id, &err);
    if (!s) {
        json_decref(restored);
        json_decref(rec);
        reply_not_live(rq, err);
        return true;
    }
    json_t *prev = json_object_get(rec, "previous_node");
    rq->takeover =
        json_pack("{s:b,s:O,s:s,s:o,s:o}", "resumed", 1, "previous_node", prev ? prev : json_null(),
                  "node", srv->node, "lost", lost_list(restored), "restored", restored);
    log_info("msg=\"session resumed after its node was lost\" session=%s node=%s previous=%s", id,
             srv->node, json_string_value(prev) ? json_string_value(prev) : "?");
    json_decref(rec);
    *ret = s;
    return true;
}

void fleet_healthz(struct server *srv, json_t *j, unsigned *status)
{
    const char *why;
    json_t *lease = fleet_health(srv->fleet);
    const char *store_error = json_string_value(json_object_get(lease, "store_error"));
    bool admitting = fleet_admitting(srv->fleet, &why);
    if (*status == 200 && (!admitting || store_error)) {
        /* Unhealthy: the router sends new sessions elsewhere; requests for this node's
         * sessions that reach other nodes are forwarded here while it still holds them. */
        *status = 503;
        json_object_set_new(j, "status", json_string(!admitting ? "fenced" : "store_unreachable"));
        _cleanup_free_ char *reason =
            !admitting
                ? xstrdup(why)
                : xasprintf("this node cannot reach the store: %s; it holds its lease "
                            "for %lld ms more",
                            store_error,
                            (long long)json_integer_value(json_object_get(lease, "lease_ms_left")));
        json_object_set_new(j, "reason", json_string(reason));
    }
    json_object_set_new(j, "fleet", lease);
}

bool fleet_check(struct request *rq, const char *id, struct session *s)
{
    struct server *srv = rq->srv;
    if (!srv->fleet || !session_stores_files(s))
        return true;
    int r = fleet_lease_state(srv->fleet, id);
    if (r == 0)
        return true;
    session_table_put(srv->table, s);
    if (r == -EXDEV) {
        /* Another node runs it now: what this one holds is stale and goes, unsaved; the
         * caller takes it over from the store, or says where it is. */
        log_warn("msg=\"session moved to another node; dropping it here\" session=%s", id);
        session_table_drop(srv->table, id);
        fleet_lease_forget(srv->fleet, id);
        return false;
    }
    /* Fenced: the session is kept while the lease may still be renewed in time. */
    fleet_reply_fenced(rq, err_msg());
    return false;
}

enum MHD_Result h_session_checkpoint(struct request *rq)
{
    struct session *s = acquire_session(rq);
    json_t *report = NULL;
    if (!s)
        return MHD_YES;
    int r = session_checkpoint(s, &report);
    session_table_put(rq->srv->table, s);
    if (r == -EBUSY)
        return api_errno(rq, r);
    if (r < 0)
        return api_error(rq, AE_BAD_REQUEST, "cannot checkpoint session %s: %s", rq->params[0],
                         err_msg());
    return reply_json(rq, 200, json_pack("{s:s,s:o}", "id", rq->params[0], "checkpoint", report));
}
