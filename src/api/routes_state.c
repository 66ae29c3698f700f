/* routes_state.c - a session's state beyond its next cell: undo's counterparts on the native
 * API (fork, pause, resume) and snapshots (made from a session, listed, deleted; a create
 * with "snapshot" starts from one). The work is the session layer's (snapshot.c). */
#include "api/api.h"

#include <errno.h>
#include <string.h>

/* The body's fields, checked; NULL after replying 400. */
static json_t *checked_body(struct request *rq, const struct field *fields, size_t n)
{
    json_t *body = body_json(rq);
    if (body && !check_fields(rq, body, fields, n)) {
        json_decref(body);
        return NULL;
    }
    return body;
}

enum MHD_Result h_session_fork(struct request *rq)
{
    static const struct field fields[] = {{"count", F_INT}};
    json_t *body = checked_body(rq, fields, ARRAY_SIZE(fields)), *forks = NULL;
    if (!body)
        return MHD_YES;
    json_t *c = json_object_get(body, "count");
    json_int_t count = c ? json_integer_value(c) : 1;
    json_decref(body);
    if (count < 1 || count > SESSION_FORK_MAX)
        return api_error(rq, AE_BAD_REQUEST, "field 'count' must be 1 to %d", SESSION_FORK_MAX);
    struct session *s = acquire_session(rq);
    if (!s)
        return MHD_YES;
    session_table_put(rq->srv->table, s); /* the fork takes its own reference */
    int r = session_table_fork(rq->srv->table, rq->params[0], (unsigned)count, &forks);
    if (r < 0)
        return api_errno(rq, r);
    return reply_json(rq, 201, json_pack("{s:s,s:o}", "from", rq->params[0], "sessions", forks));
}

enum MHD_Result h_session_pause(struct request *rq)
{
    static const struct field fields[] = {{"keep_memory", F_BOOL}};
    json_t *body = checked_body(rq, fields, ARRAY_SIZE(fields)), *report = NULL;
    if (!body)
        return MHD_YES;
    bool keep = json_is_true(json_object_get(body, "keep_memory"));
    json_decref(body);
    struct session *s = acquire_session(rq);
    if (!s)
        return MHD_YES;
    int r = session_pause(s, keep, &report);
    session_table_put(rq->srv->table, s);
    if (r == -EALREADY)
        return api_error(rq, AE_BUSY, "%s", err_msg());
    if (r < 0)
        return api_errno(rq, r);
    return reply_json(rq, 200, report);
}

enum MHD_Result h_session_resume(struct request *rq)
{
    json_t *report = NULL;
    struct session *s = acquire_session(rq);
    if (!s)
        return MHD_YES;
    int r = session_resume(s, &report);
    session_table_put(rq->srv->table, s);
    if (r == -EALREADY)
        return api_error(rq, AE_BUSY, "%s", err_msg());
    if (r < 0)
        return api_errno(rq, r);
    return reply_json(rq, 200, report);
}

enum MHD_Result h_snapshot_create(struct request *rq)
{
    static const struct field fields[] = {{"name", F_STRING}};
    json_t *body = checked_body(rq, fields, ARRAY_SIZE(fields)), *rec = NULL;
    if (!body)
        return MHD_YES;
    struct session *s = acquire_session(rq);
    if (!s) {
        json_decref(body);
        return MHD_YES;
    }
    int r = snapshot_create(&rq->srv->persist, s, json_string_value(json_object_get(body, "name")),
                            rq->srv->cfg->limits.max_snapshots, &rec);
    session_table_put(rq->srv->table, s);
    json_decref(body);
    if (r < 0)
        return api_errno(rq, r);
    _cleanup_free_ char *location =
        xasprintf("/v1/snapshots/%s", json_string_value(json_object_get(rec, "id")));
    return reply_json_header(rq, 201, rec, "Location", location);
}

enum MHD_Result h_snapshot_list(struct request *rq)
{
    return reply_json(rq, 200,
                      json_pack("{s:o}", "snapshots", snapshot_list(&rq->srv->persist, 0)));
}

enum MHD_Result h_snapshot_get(struct request *rq)
{
    json_t *rec;
    int r = snapshot_get(&rq->srv->persist, rq->params[0], &rec);
    return r < 0 ? api_errno(rq, r) : reply_json(rq, 200, rec);
}

enum MHD_Result h_snapshot_delete(struct request *rq)
{
    int r = snapshot_delete(&rq->srv->persist, rq->params[0]);
    if (r < 0)
        return api_errno(rq, r);
    return reply_json(rq, 200, json_pack("{s:s,s:b}", "id", rq->params[0], "deleted", 1));
}

/* ---- the console's notebook: a document kept with the session ---- */

enum MHD_Result h_notebook_get(struct request *rq)
{
    char *text = NULL;
    size_t n;
    /* A stored session's too: the console opens what a resumed one had. */
    int r = session_notebook_get(&rq->srv->persist, rq->params[0], &text, &n);
    if (r == -ENOENT)
        return api_error(rq, AE_NOT_FOUND, "session %s has no notebook kept yet", rq->params[0]);
    if (r < 0)
        return api_errno(rq, r);
    struct MHD_Response *resp = MHD_create_response_from_buffer(n, text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(resp, "Content-Type", "application/json");
    MHD_add_response_header(resp, "Cache-Control", "no-store");
    return reply_response(rq, 200, resp);
}

enum MHD_Result h_notebook_put(struct request *rq)
{
    json_t *body = body_json(rq);
    if (!body)
        return MHD_YES;
    json_decref(body); /* checked to be one JSON object; kept as the client sent it */
    struct session *s = acquire_session(rq);
    if (!s)
        return MHD_YES;
    session_table_put(rq->srv->table, s);
    int r = session_notebook_put(&rq->srv->persist, rq->params[0], rq->body.data, rq->body.len);
    if (r < 0)
        return api_errno(rq, r);
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    return reply_response(rq, 204, resp);
}
