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

struct handover {
    struct server *srv;
    char *id;
};

static void *handover_main(void *arg)
{
    struct handover *h = arg;
    if (session_table_handover(h->srv->table, h->id) == 0)
        log_info("msg=\"session handed back to its node\" session=%s", h->id);
    atomic_fetch_sub(&h->srv->handovers, 1);
    free(h->id);
    free(h);
    return NULL;
}

static void on_lost(void *ctx, const char *id, bool handback)
{
    struct server *srv = ctx;
    pthread_t th;
    pthread_attr_t attr;
    if (!handback) {
        session_table_drop(srv->table, id);
        return;
    }
    /* The checkpoint takes a while: not on the renewer's thread. */
    struct handover *h = xcalloc(1, sizeof(*h));
    h->srv = srv;
    h->id = xstrdup(id);
    atomic_fetch_add(&srv->handovers, 1);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &attr, handover_main, h) != 0) {
        atomic_fetch_sub(&srv->handovers, 1);
        free(h->id);
        free(h);
        log_warn("msg=\"cannot hand a session back: no thread\" session=%s", id);
    }
    pthread_attr_destroy(&attr);
}

void fleet_wait_handovers(struct server *srv)
{
    while (atomic_load(&srv->handovers) > 0) {
        struct timespec ts = {.tv_nsec = 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

int fleet_open(struct server *srv)
{
    uint64_t ttl = srv->cfg->lease_ttl_ms ? srv->cfg->lease_ttl_ms : DEFAULT_LEASE_TTL_MS;
    int r = fleet_new(srv->store, srv->node, ttl, &srv->fleet);
    if (r < 0)
        return err_set(-r, "--fleet: %s", err_msg());
    srv->persist.fleet = srv->fleet;
    log_info("msg=\"fleet node\" node=%s lease_ttl_ms=%llu store=%s", srv->node,
             (unsigned long long)ttl, log_quote(store_describe(srv->store)));
    return fleet_start(srv->fleet, on_lost, srv);
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
    json_t *opts = json_object_get(rec, "options");
    json_t *body = json_is_object(opts) ? json_deep_copy(opts) : json_object();
    json_object_del(body, "persist");
    bool ok = session_opts_from_json(rq, body, o);
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
    int r = fleet_lease_take(srv->fleet, id, &rec);
    if (r == -ENOENT)
        return false;
    if (r < 0) {
        api_error(rq, r == -EBUSY ? AE_MOVED : AE_SANDBOX, "%s", err_msg());
        return true;
    }
    if (!takeover_options(rq, rec, &o)) {
        fleet_lease_release(srv->fleet, id, "stopped", NULL);
        json_decref(rec);
        return true;
    }
    struct session_create create = {.opts = &o, .resume_from = id, .id = id};
    r = session_table_create_ex(srv->table, &create, &new_id, &restored);
    if (r < 0) {
        api_error(rq, r == -EAGAIN ? AE_LIMIT : AE_SANDBOX,
                  "cannot take over session %s on node %s: %s", id, srv->node, err_msg());
        json_decref(rec);
        return true;
    }
    free(new_id);
    int err;
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

bool fleet_check(struct request *rq, const char *id, struct session *s)
{
    struct server *srv = rq->srv;
    if (!srv->fleet || !session_stores_files(s))
        return true;
    int r = fleet_lease_state(srv->fleet, id);
    /* Lapsed (this node was stopped, or the store away): renewing now tells which. */
    if (r == -ENOLCK && (r = fleet_lease_update(srv->fleet, id, "live", NULL)) == -ECANCELED)
        r = 0;
    if (r == 0)
        return true;
    session_table_put(srv->table, s);
    if (r == -EXDEV) {
        /* Another node runs it now: what this one holds is stale and goes, unsaved; the
         * caller takes it over from the store, or says where it is. */
        log_warn("msg=\"session moved to another node; dropping it here\" session=%s", id);
        session_table_drop(srv->table, id);
        return false;
    }
    /* The session is kept: it runs again once the store answers and the lease is renewed
     * (unless another node took it meanwhile, which this node then learns). */
    api_error(rq, AE_SANDBOX,
              "session %s cannot run now: this node could not renew its lease on it in the "
              "store (%s); its state is kept here, try again when the store answers",
              id, err_msg());
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
