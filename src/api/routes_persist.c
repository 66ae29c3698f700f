/* routes_persist.c - sessions that are stored but not live: 404s that say whether a session
 * can be resumed, resuming with the stored options, and closing with or without a
 * checkpoint. */
#include "api/api.h"

#include <errno.h>
#include <string.h>

/* What became of a stored session, for messages. */
static const char *fate(const char *state)
{
    static const char *const fates[][2] = {
        {"expired", "expired after being idle longer than its idle timeout"},
        {"checkpointed", "was closed with a checkpoint"},
        {"closed", "was closed"},
        {"stopped", "stopped with the server that ran it"},
        {"live", "is live in another runcell process"},
    };
    for (size_t i = 0; state && i < ARRAY_SIZE(fates); i++)
        if (!strcmp(state, fates[i][0]))
            return fates[i][1];
    return "is not live";
}

/* Replies 404 for a stored session (info stolen) that cannot be used as asked. */
static enum MHD_Result reply_stored(struct request *rq, const char *id, json_t *info, bool expired)
{
    const char *state = json_string_value(json_object_get(info, "state"));
    bool resumable = json_is_true(json_object_get(info, "resumable"));
    bool persist = json_is_true(json_object_get(info, "persist"));
    bool vars = json_is_true(json_object_get(info, "variables_stored"));
    enum api_err code = expired || (state && !strcmp(state, "expired")) ? AE_EXPIRED : AE_NOT_FOUND;
    json_t *extra = json_pack("{s:b,s:o}", "resumable", resumable, "session", info);
    if (resumable)
        return api_error_with(rq, code, extra,
                              "session %s %s; its files%s are stored: resume "
                              "it with POST /v1/sessions {\"resume_from\": \"%s\"}",
                              id, fate(state), vars ? " and variables" : "", id);
    return api_error_with(rq, code, extra, "session %s %s; nothing of it was kept%s", id,
                          fate(state), persist ? "" : " (it was created with persist: false)");
}

enum MHD_Result reply_not_live(struct request *rq, int err)
{
    const char *id = rq->params[0];
    json_t *info;
    if (session_stored_info(&rq->srv->persist, id, &info) == 0)
        return reply_stored(rq, id, info, err == -ETIME);
    if (err == -ETIME)
        return api_error(rq, AE_EXPIRED,
                         "session %s expired after being idle longer than its "
                         "idle timeout; create a new session",
                         id);
    return api_error(rq, AE_NOT_FOUND, "no session %s", id);
}

bool resume_options(struct request *rq, json_t **body)
{
    json_t *from = json_object_get(*body, "resume_from"), *info;
    if (!from || json_is_null(from))
        return true;
    const char *id = json_string_value(from);
    if (!session_id_valid(id)) {
        api_error(rq, AE_NOT_FOUND,
                  "no session '%s' to resume: session ids are hexadecimal, "
                  "as POST /v1/sessions returns them",
                  id);
        return false;
    }
    /* A session being reaped is resumed from its finished checkpoint. */
    session_table_wait_retired(rq->srv->table, id);
    /* Unknown to the records, the store may still hold it (a store shared between servers):
     * the restore tells. */
    if (session_stored_info(&rq->srv->persist, id, &info) < 0)
        return true;
    if (!json_is_true(json_object_get(info, "resumable"))) {
        reply_stored(rq, id, info, false);
        return false;
    }
    /* The stored session's options, with what the request says on top. */
    json_t *merged = json_deep_copy(json_object_get(info, "options"));
    json_decref(info);
    if (!json_is_object(merged)) {
        json_decref(merged);
        merged = json_object();
    }
    /* Secrets the record keeps sealed, unless the request gives its own. */
    json_t *secrets = NULL;
    if (json_object_get(*body, "secrets"))
        json_object_del(merged, "secrets_sealed");
    else if (session_unseal_secrets(&rq->srv->persist, id, merged, &secrets) < 0) {
        api_error(rq, AE_BAD_REQUEST, "%s", err_msg());
        json_decref(merged);
        return false;
    }
    json_object_update(merged, *body);
    if (secrets)
        json_object_set_new(merged, "secrets", secrets);
    json_decref(*body);
    *body = merged;
    return true;
}

/* checkpoint from the query (?checkpoint=true) or the body ({"checkpoint": true}); false
 * after replying 400. */
static bool want_checkpoint(struct request *rq, bool *ret)
{
    static const struct field fields[] = {{"checkpoint", F_BOOL}};
    const char *q = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "checkpoint");
    json_t *body = body_json(rq);
    bool ok = body && check_fields(rq, body, fields, ARRAY_SIZE(fields));
    *ret = json_is_true(json_object_get(body, "checkpoint"));
    json_decref(body);
    if (!ok || !q)
        return ok;
    if (!strcmp(q, "true") || !strcmp(q, "1")) {
        *ret = true;
    } else if (strcmp(q, "false") && strcmp(q, "0")) {
        api_error(rq, AE_BAD_REQUEST, "query 'checkpoint' must be true or false, not '%s'", q);
        return false;
    }
    return true;
}

enum MHD_Result h_session_delete(struct request *rq)
{
    const char *id = rq->params[0];
    json_t *report = NULL, *info;
    bool checkpoint;
    if (!want_checkpoint(rq, &checkpoint))
        return MHD_YES;
    if (session_table_close(rq->srv->table, id, checkpoint, &report) == 0) {
        json_t *j = json_pack("{s:s,s:b}", "id", id, "closed", 1);
        if (checkpoint) {
            json_object_set_new(j, "checkpoint", report);
        } else {
            json_t *error = json_object_get(report, "error");
            json_object_set_new(j, "discarded", json_boolean(!error));
            if (error)
                json_object_set(j, "discard_error", error);
            json_decref(report);
        }
        return reply_json(rq, 200, j);
    }
    if (checkpoint) {
        if (session_stored_info(&rq->srv->persist, id, &info) == 0)
            return api_error_with(rq, AE_NOT_FOUND, json_pack("{s:o}", "session", info),
                                  "session %s is not live: there is nothing to checkpoint "
                                  "(what it stored is kept)",
                                  id);
        return reply_not_live(rq, -ENOENT);
    }
    /* Not live: what is stored of it goes. */
    int r = session_stored_delete(&rq->srv->persist, id);
    if (r == -ENOENT)
        return reply_not_live(rq, -ENOENT);
    if (r == -EBUSY)
        return api_errno(rq, r);
    if (r < 0)
        return api_error(rq, AE_INTERNAL, "cannot delete what is stored of session %s: %s", id,
                         err_msg());
    return reply_json(rq, 200, json_pack("{s:s,s:b}", "id", id, "deleted", 1));
}
