/* routes_agent.c - agent runs over HTTP (one JSON outcome, or NDJSON progress events ending
 * with the outcome) and the review queue. */
#include "api/api.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/agent.h"

#define MAX_AGENT_FILES 1000
/* Produced files come back in the outcome (base64): each up to this, all together up to the
 * total; bigger ones are named in files_omitted (keep_session lets a client fetch them). */
#define INLINE_FILE_MAX  (8u << 20)
#define INLINE_TOTAL_MAX (16u << 20)

static const struct field run_fields[] = {
    {"task", F_STRING}, {"files", F_OBJECT}, {"options", F_OBJECT}};

static const struct field option_fields[] = {
    {"max_steps", F_INT},  {"max_retries", F_INT},   {"max_time_s", F_NUMBER},
    {"max_tokens", F_INT}, {"model", F_STRING},      {"stream", F_BOOL},
    {"vision", F_BOOL},    {"fallbacks", F_ARRAY},   {"retry_doomed", F_BOOL},
    {"no_memory", F_BOOL}, {"keep_session", F_BOOL}, {"session_id", F_STRING},
    {"session", F_OBJECT}, {"inline_files", F_BOOL}, {"model_access", F_BOOL},
};

static const struct field session_fields[] = {
    {"timeout_s", F_NUMBER}, {"idle_timeout_s", F_NUMBER}, {"memory_mb", F_INT},  {"pids", F_INT},
    {"disk_mb", F_INT},      {"cpus", F_NUMBER},           {"network", F_OBJECT},
};

/* Everything one run owns; freed by job_free once the run is over. */
struct agent_job {
    struct server *srv;
    json_t *body;
    struct agent_options ao;
    struct agent_file *files;
    char *tmpdir; /* the uploaded files, on the host */
    struct llm_client *llm;
    struct session *s;
    char *session_id;
    bool keep;
    struct session_opts so;
    struct model_access ma; /* options.model_access: the network that lets code call the model */
    char *session_error;
    bool inline_files;        /* return produced files in the outcome (default) */
    struct agent_stream *out; /* streaming: where the events go, or NULL */
};

/* A streamed run's events: written by the run's thread, read by the response; freed by
 * whichever of the two lets go last. */
struct agent_stream {
    struct out_stream os;
    atomic_int refs;
};

static void agent_stream_unref(struct agent_stream *as)
{
    if (as && atomic_fetch_sub(&as->refs, 1) == 1) {
        out_stream_release(&as->os);
        free(as);
    }
}

static void job_free(struct agent_job *j)
{
    if (!j)
        return;
    if (j->s)
        session_table_put(j->srv->table, j->s);
    if (j->session_id && !j->keep)
        session_table_remove(j->srv->table, j->session_id);
    if (j->tmpdir)
        rm_rf(j->tmpdir);
    free(j->tmpdir);
    free(j->files);
    free(j->session_id);
    free(j->session_error);
    model_access_release(&j->ma);
    llm_client_free(j->llm);
    json_decref(j->body);
    if (j->out) {
        out_stream_finish(&j->out->os); /* the response ends once it has sent what is there */
        agent_stream_unref(j->out);
    }
    free(j);
}

/* ---- the request ---- */

static bool get_budget(struct request *rq, json_t *opts, const char *name, unsigned *ret)
{
    uint64_t v = 0;
    if (!get_count(rq, opts, name, 100000, &v))
        return false;
    if (v)
        *ret = (unsigned)v;
    return true;
}

static bool parse_fallbacks(struct request *rq, json_t *list, struct agent_options *ao)
{
    if (!list || json_is_null(list))
        return true;
    struct buf b;
    size_t i;
    json_t *v;
    buf_init(&b, 4096);
    json_array_foreach(list, i, v)
    {
        if (!json_is_string(v)) {
            buf_release(&b);
            api_error(rq, AE_BAD_REQUEST,
                      "options.fallbacks must be a list of names (weak, "
                      "handback, review)");
            return false;
        }
        buf_printf(&b, "%s%s", i ? "," : "", json_string_value(v));
    }
    int r = agent_parse_fallbacks(b.data ? b.data : "none", ao->fallbacks, &ao->n_fallbacks);
    buf_release(&b);
    if (r < 0) {
        api_error(rq, AE_BAD_REQUEST, "options.fallbacks: %s", err_msg());
        return false;
    }
    ao->fallbacks_set = true;
    return true;
}

static bool parse_options(struct request *rq, json_t *opts, struct agent_job *j)
{
    struct agent_options *ao = &j->ao;
    uint64_t ms = 0;
    if (!check_fields(rq, opts, option_fields, ARRAY_SIZE(option_fields)) ||
        !get_budget(rq, opts, "max_steps", &ao->max_steps) ||
        !get_budget(rq, opts, "max_retries", &ao->max_retries) ||
        !get_count(rq, opts, "max_tokens", UINT64_MAX >> 1, &ao->max_tokens) ||
        !get_seconds(rq, opts, "max_time_s", 7u * 24 * 3600 * 1000, &ms) ||
        !parse_fallbacks(rq, json_object_get(opts, "fallbacks"), ao))
        return false;
    ao->max_time_ms = ms;
    ao->vision = json_is_true(json_object_get(opts, "vision"));
    ao->retry_doomed = json_is_true(json_object_get(opts, "retry_doomed"));
    ao->no_memory = json_is_true(json_object_get(opts, "no_memory"));
    j->keep = json_is_true(json_object_get(opts, "keep_session"));
    j->inline_files = !json_is_false(json_object_get(opts, "inline_files"));
    json_t *sess = json_object_get(opts, "session");
    if (sess && !json_is_null(sess) &&
        (!check_fields(rq, sess, session_fields, ARRAY_SIZE(session_fields)) ||
         !session_opts_from_json(rq, sess, &j->so)))
        return false;
    if (!sess || json_is_null(sess))
        j->so = rq->srv->cfg->defaults;
    if (!json_is_integer(json_object_get(sess, "history")) && !j->so.history)
        j->so.history = AGENT_DEFAULT_HISTORY;
    return true;
}

static bool make_client(struct request *rq, json_t *opts, struct agent_job *j)
{
    struct llm_config c = rq->srv->cfg->agent;
    const char *model = json_string_value(json_object_get(opts, "model"));
    json_t *stream = json_object_get(opts, "stream");
    if (model)
        c.model = model;
    if (json_is_boolean(stream))
        c.stream = json_is_true(stream);
    int r = llm_client_new(&c, &j->llm);
    if (r == -EDESTADDRREQ) {
        /* Only the operator can set it: a request cannot name an endpoint. */
        api_error(rq, AE_NOT_CONFIGURED,
                  "the agent is not configured: this server has no model endpoint; start "
                  "it with runcell serve --base-url URL or OPENAI_BASE_URL set (e.g. "
                  "http://127.0.0.1:11434/v1 for a local server)");
        return false;
    }
    if (r < 0) {
        api_error(rq, AE_BAD_REQUEST,
                  "%s (on the server: runcell serve --model, or "
                  "options.model in the request)",
                  err_msg());
        return false;
    }
    return true;
}

/* options.model_access: the new session's network lets its code call the model, whose key
 * the proxy adds (within the server's network cap). */
static bool open_model(struct request *rq, json_t *opts, struct agent_job *j)
{
    if (!json_is_true(json_object_get(opts, "model_access")))
        return true;
    if (json_object_get(opts, "session_id")) {
        api_error(rq, AE_BAD_REQUEST,
                  "options.model_access applies to a new session: a kept session keeps its "
                  "network (change it with PATCH /v1/sessions/{id}/network)");
        return false;
    }
    if (llm_model_access(j->llm, &j->so.net, rq->srv->cfg->net_allow_max, &j->ma) < 0) {
        api_error(rq, AE_BAD_REQUEST, "options.model_access: %s", err_msg());
        return false;
    }
    j->so.net.policy = j->ma.policy;
    j->so.net.secrets = j->ma.secrets;
    j->so.net.env = j->ma.env;
    j->ao.model_access = true;
    return true;
}

/* Uploaded files go to a private host directory: the session and every weak-mode run copy
 * them from there. */
static int save_files(struct server *srv, json_t *files, struct agent_job *j)
{
    size_t n = json_object_size(files), i = 0;
    const char *name;
    json_t *v;
    if (n > MAX_AGENT_FILES)
        return err_set(EINVAL, "files: more than %d files", MAX_AGENT_FILES);
    j->files = xcalloc(n + 1, sizeof(*j->files));
    if (!n)
        return 0;
    j->tmpdir = xasprintf("%s/agent-XXXXXX", srv->host.run_dir);
    if (!mkdtemp(j->tmpdir)) {
        free(j->tmpdir);
        j->tmpdir = NULL;
        return err_set(errno, "cannot create a directory for the files: %s", strerror(errno));
    }
    json_object_foreach(files, name, v)
    {
        if (!path_is_safe_relative(name))
            return err_set(EINVAL,
                           "files: bad name '%s': use a relative path inside the "
                           "workspace, without '..'",
                           name);
        const char *b64 = json_string_value(v);
        size_t len;
        _cleanup_free_ unsigned char *data = b64 ? base64_decode(b64, strlen(b64), &len) : NULL;
        if (!data)
            return err_set(EINVAL, "files: '%s' must be base64 text", name);
        char *path = xasprintf("%s/%s", j->tmpdir, name);
        _cleanup_free_ char *dir = xstrdup(path);
        *strrchr(dir, '/') = '\0';
        int r = mkdir_p(dir, 0700);
        if (r == 0)
            r = write_file(path, (const char *)data, len, 0600);
        if (r < 0) {
            free(path);
            return err_set(-r, "files: cannot store '%s': %s", name, strerror(-r));
        }
        /* The path is kept in the job: dest points into the body, which the job holds. */
        j->files[i++] = (struct agent_file){.host_path = path, .dest = name};
    }
    j->ao.n_files = i;
    return 0;
}

/* The session to run on: a kept one (options.session_id), or a new one in the table. A
 * session that cannot start leaves s NULL with the reason: the run goes to weak mode. */
static bool open_session(struct request *rq, json_t *opts, struct agent_job *j)
{
    const char *id = json_string_value(json_object_get(opts, "session_id"));
    if (id) {
        int err;
        j->s = session_table_acquire(rq->srv->table, id, &err);
        if (!j->s) {
            api_error(rq, err == -ETIME ? AE_EXPIRED : AE_NOT_FOUND, "no session %s%s", id,
                      err == -ETIME ? " (it expired)" : "");
            return false;
        }
        if (session_active(j->s)) {
            api_error(rq, AE_BUSY, "session %s is busy; wait for its run to end", id);
            return false;
        }
        j->keep = true; /* it was kept before: a follow-up run never closes it */
        j->session_id = xstrdup(id);
        return true;
    }
    int r = session_table_create(rq->srv->table, &j->so, &j->session_id);
    if (r == -EAGAIN) {
        api_errno(rq, r);
        return false;
    }
    if (r < 0) {
        metrics_sandbox_failure(rq->srv->metrics);
        j->session_error = xstrdup(err_msg());
        return true;
    }
    int err;
    j->s = session_table_acquire(rq->srv->table, j->session_id, &err);
    return true;
}

static void free_file_paths(struct agent_job *j)
{
    for (size_t i = 0; j->files && i < j->ao.n_files; i++)
        free((char *)j->files[i].host_path);
}

/* ---- running ---- */

static void add_session(struct agent_job *j, json_t *outcome)
{
    json_object_set_new(outcome, "session_id",
                        j->session_id && j->keep && j->s ? json_string(j->session_id)
                                                         : json_null());
}

static void omit_file(json_t *omitted, const char *name, uint64_t size, const char *why)
{
    json_array_append_new(
        omitted, json_pack("{s:s,s:I,s:s}", "name", name, "size", (json_int_t)size, "reason", why));
}

/* The produced files as {"name": base64} (file_data) in the outcome, within the caps; what
 * does not fit or cannot be read is in files_omitted with the reason. Without this a run
 * whose session is not kept would list files nobody can fetch. */
static void add_file_data(struct agent_job *j, json_t *outcome)
{
    json_t *files = json_object_get(outcome, "files");
    if (!j->inline_files || !j->s || !json_array_size(files))
        return;
    struct workspace *ws = session_workspace(j->s);
    json_t *data = json_object(), *omitted = json_array();
    size_t i, total = 0;
    json_t *f;
    json_array_foreach(files, i, f)
    {
        const char *name = json_string_value(f);
        struct buf b;
        uint64_t size = 0;
        size_t room = INLINE_TOTAL_MAX - total;
        int r = workspace_read(ws, name, MIN(INLINE_FILE_MAX, room), &b, &size);
        if (r == -E2BIG) {
            omit_file(omitted, name, size,
                      size > INLINE_FILE_MAX ? "larger than the 8 MiB a file may have inline"
                                             : "over the 16 MiB all files of a run may have "
                                               "inline");
            continue;
        }
        if (r < 0) {
            omit_file(omitted, name, size,
                      r == -ELOOP    ? "a symbolic link: only regular files are returned"
                      : r == -EINVAL ? "not a regular file"
                                     : strerror(-r));
            continue;
        }
        total += b.len;
        _cleanup_free_ char *b64 = base64_encode(b.data ? b.data : "", b.len, NULL);
        json_object_set_new(data, name, json_string(b64));
        buf_release(&b);
    }
    json_object_set_new(outcome, "file_data", data);
    json_object_set_new(outcome, "files_omitted", omitted);
}

static void write_event(void *ctx, json_t *ev)
{
    struct agent_job *j = ctx;
    char *line = json_dumps(ev, JSON_COMPACT);
    if (!line)
        return;
    /* A client that left does not stop these: the run notices through its cancel fd. */
    size_t n = strlen(line);
    line[n] = '\n';
    out_stream_append(&j->out->os, line, n + 1);
    free(line);
}

static json_t *run_job(struct agent_job *j, const struct agent_events *ev)
{
    json_t *outcome = NULL;
    j->ao.files = j->files;
    j->ao.data_dir = j->srv->cfg->data_dir;
    j->ao.webhook_url = j->srv->cfg->review_webhook;
    j->ao.session_opts = &j->so;
    j->ao.session_error = j->session_error;
    if (agent_run(&j->srv->host, j->llm, j->s, &j->ao, ev, &outcome) < 0)
        outcome = json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "code", "bad_request",
                            "message", err_msg());
    else {
        add_session(j, outcome);
        add_file_data(j, outcome);
    }
    return outcome;
}

static void *job_main(void *arg)
{
    struct agent_job *j = arg;
    struct agent_events ev = {.fn = write_event, .ctx = j};
    json_t *start = json_pack("{s:s,s:s?,s:b}", "type", "session", "session_id", j->session_id,
                              "kept", j->keep);
    write_event(j, start);
    json_decref(start);
    json_t *outcome = run_job(j, &ev);
    write_event(j, outcome);
    json_decref(outcome);
    free_file_paths(j);
    job_free(j); /* the stream finishes: the response ends */
    return NULL;
}

static int agent_pull(void *src, struct buf *out)
{
    return out_stream_pull(&((struct agent_stream *)src)->os, out);
}

static int agent_wait_fd(void *src)
{
    return ((struct agent_stream *)src)->os.notify[0];
}

static void agent_clear(void *src)
{
    out_stream_clear(&((struct agent_stream *)src)->os);
}

static void agent_left(void *src)
{
    out_stream_cancel(&((struct agent_stream *)src)->os); /* the run stops at its next step */
}

static void agent_free(void *src)
{
    agent_stream_unref(src);
}

static const struct http_source_ops agent_source_ops = {
    .pull = agent_pull,
    .wait_fd = agent_wait_fd,
    .clear = agent_clear,
    .left = agent_left,
    .free = agent_free,
};

static enum MHD_Result start_streaming(struct request *rq, struct agent_job *j)
{
    pthread_t t;
    struct agent_stream *as = xcalloc(1, sizeof(*as));
    if (out_stream_init(&as->os) < 0) {
        free(as);
        job_free(j);
        return api_error(rq, AE_INTERNAL, "%s", err_msg());
    }
    atomic_init(&as->refs, 2); /* the run's and the response's */
    j->out = as;
    /* The cancel pipe is written once the reader is gone: that cancels. */
    j->ao.cancel = (struct agent_cancel){
        .fd = as->os.cancel[0], .events = POLLIN, .flag = &rq->srv->shutting_down};
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int r = pthread_create(&t, &attr, job_main, j);
    pthread_attr_destroy(&attr);
    if (r) {
        free_file_paths(j);
        job_free(j);
        agent_stream_unref(as);
        return api_error(rq, AE_INTERNAL, "cannot start the run: %s", strerror(r));
    }
    return http_stream(rq, 200, "application/x-ndjson", &agent_source_ops, as, 0);
}

static enum MHD_Result run_blocking(struct request *rq, struct agent_job *j)
{
    j->ao.cancel = (struct agent_cancel){
        .fd = client_fd(rq), .events = POLLRDHUP, .flag = &rq->srv->shutting_down};
    json_t *outcome = run_job(j, NULL);
    bool bad = !strcmp(json_string_value(json_object_get(outcome, "type")), "error");
    enum MHD_Result ret = reply_json(rq, bad ? 400 : 200, outcome);
    free_file_paths(j);
    job_free(j);
    return ret;
}

enum MHD_Result h_agent_run(struct request *rq)
{
    json_t *body = body_json(rq);
    if (!body)
        return MHD_YES;
    struct agent_job *j = xcalloc(1, sizeof(*j));
    j->srv = rq->srv;
    j->body = body;
    json_t *opts = json_object_get(body, "options");
    j->ao.task = json_string_value(json_object_get(body, "task"));
    if (!check_fields(rq, body, run_fields, ARRAY_SIZE(run_fields)) ||
        !parse_options(rq, opts, j) || !make_client(rq, opts, j) || !open_model(rq, opts, j))
        goto fail;
    if (!j->ao.task || !*j->ao.task) {
        api_error(rq, AE_BAD_REQUEST, "field 'task' is required: what the agent should do");
        goto fail;
    }
    if (save_files(rq->srv, json_object_get(body, "files"), j) < 0) {
        api_errno(rq, -EINVAL);
        goto fail;
    }
    if (!open_session(rq, opts, j))
        goto fail;
    request_owes_reply(rq);
    if (j->session_id)
        rq->session_id = xstrdup(j->session_id);
    if (wants_ndjson(rq))
        return start_streaming(rq, j); /* the run's thread owns j and the slot now */
    return run_blocking(rq, j);
fail:
    free_file_paths(j);
    job_free(j);
    return MHD_YES;
}

/* ---- the review queue ---- */

enum MHD_Result h_review_list(struct request *rq)
{
    const char *status = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "status");
    const char *limit_s = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "limit");
    uint64_t limit = 100;
    json_t *arr;
    if (status && strcmp(status, "open") && strcmp(status, "resolved"))
        return api_error(rq, AE_BAD_REQUEST, "status must be open or resolved, not '%s'", status);
    if (limit_s && (parse_u64(limit_s, &limit) < 0 || !limit || limit > 10000))
        return api_error(rq, AE_BAD_REQUEST, "limit must be a whole number from 1 to 10000");
    if (review_list(rq->srv->cfg->data_dir, status, limit, &arr) < 0)
        return api_error(rq, AE_INTERNAL, "%s", err_msg());
    return reply_json(rq, 200, json_pack("{s:o}", "reviews", arr));
}

enum MHD_Result h_review_get(struct request *rq)
{
    json_t *rec;
    int r = review_get(rq->srv->cfg->data_dir, rq->params[0], &rec);
    return r < 0 ? api_errno(rq, r) : reply_json(rq, 200, rec);
}

enum MHD_Result h_review_resolve(struct request *rq)
{
    static const struct field fields[] = {{"note", F_STRING}};
    json_t *body = body_json(rq), *rec;
    enum MHD_Result ret = MHD_YES;
    if (!body)
        return MHD_YES;
    if (check_fields(rq, body, fields, ARRAY_SIZE(fields))) {
        int r = review_resolve(rq->srv->cfg->data_dir, rq->params[0],
                               json_string_value(json_object_get(body, "note")), &rec);
        ret = r < 0 ? api_errno(rq, r) : reply_json(rq, 200, rec);
    }
    json_decref(body);
    return ret;
}
