/* record.c - the result record of one execution and its JSON form. */
#include "session/session.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

static const char *const status_names[] = {
    [EXEC_OK] = "ok",           [EXEC_ERROR] = "error",
    [EXEC_TIMEOUT] = "timeout", [EXEC_OOM] = "oom",
    [EXEC_KILLED] = "killed",   [EXEC_OUTPUT_LIMIT] = "output_limit",
    [EXEC_CRASHED] = "crashed", [EXEC_SANDBOX_ERROR] = "sandbox_error",
};

const char *exec_status_name(enum exec_status s)
{
    return (size_t)s < ARRAY_SIZE(status_names) ? status_names[s] : "error";
}

void exec_record_init(struct exec_record *r, size_t output_cap)
{
    memset(r, 0, sizeof(*r));
    outcap_init(&r->out, output_cap);
    outcap_init(&r->err, output_cap);
    r->results = json_array();
}

void exec_record_release(struct exec_record *r)
{
    outcap_release(&r->out);
    outcap_release(&r->err);
    json_decref(r->results);
    json_decref(r->error);
    strv_free(r->created);
    strv_free(r->modified);
    strv_free(r->deleted);
    strv_free(r->copied_out);
    json_decref(r->network);
    json_decref(r->packages);
    free(r->message);
    free(r->persist_error);
    memset(r, 0, sizeof(*r));
}

static char **strv_copy(char *const *v)
{
    char **out = NULL;
    for (; v && *v; v++)
        out = strv_push(out, *v);
    return out;
}

void exec_record_copy(struct exec_record *dst, const struct exec_record *src)
{
    exec_record_release(dst);
    *dst = *src;
    outcap_copy(&dst->out, &src->out);
    outcap_copy(&dst->err, &src->err);
    dst->results = json_deep_copy(src->results);
    dst->error = src->error ? json_deep_copy(src->error) : NULL;
    dst->created = strv_copy(src->created);
    dst->modified = strv_copy(src->modified);
    dst->deleted = strv_copy(src->deleted);
    dst->copied_out = strv_copy(src->copied_out);
    dst->network = src->network ? json_deep_copy(src->network) : NULL;
    dst->packages = src->packages ? json_deep_copy(src->packages) : NULL;
    dst->message = src->message ? xstrdup(src->message) : NULL;
    dst->persist_error = src->persist_error ? xstrdup(src->persist_error) : NULL;
}

static json_t *stream_json(const struct outcap *c)
{
    size_t len, clean_len;
    char *raw = outcap_render(c, &len);
    char *clean = utf8_sanitize(raw, len, &clean_len);
    json_t *s = json_stringn(clean, clean_len);
    free(raw);
    free(clean);
    return s;
}

static json_t *strv_json(char **v)
{
    json_t *a = json_array();
    for (; v && *v; v++) {
        size_t n;
        char *clean = utf8_sanitize(*v, strlen(*v), &n);
        json_array_append_new(a, json_stringn(clean, n));
        free(clean);
    }
    return a;
}

json_t *exec_record_json(const struct exec_record *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "status", json_string(exec_status_name(r->status)));
    json_object_set_new(o, "stdout", stream_json(&r->out));
    json_object_set_new(o, "stderr", stream_json(&r->err));
    json_object_set_new(o, "truncated",
                        json_pack("{s:b,s:b}", "stdout", outcap_truncated(&r->out), "stderr",
                                  outcap_truncated(&r->err)));
    json_object_set(o, "results", r->results ? r->results : json_array());
    json_object_set(o, "error", r->error ? r->error : json_null());
    json_t *files = json_object();
    json_object_set_new(files, "created", strv_json(r->created));
    json_object_set_new(files, "modified", strv_json(r->modified));
    json_object_set_new(files, "deleted", strv_json(r->deleted));
    if (r->files_truncated)
        json_object_set_new(files, "truncated", json_true());
    json_object_set_new(o, "files", files);
    if (r->state != STATE_NONE)
        json_object_set_new(o, "state", json_string(r->state == STATE_KEPT ? "kept" : "lost"));
    json_object_set_new(o, "exit_code",
                        r->has_exit_code ? json_integer(r->exit_code) : json_null());
    json_object_set_new(o, "signal", r->signal ? json_integer(r->signal) : json_null());
    if (r->execution_count)
        json_object_set_new(o, "execution_count", json_integer(r->execution_count));
    json_object_set_new(o, "usage",
                        json_pack("{s:f,s:f,s:I,s:s}", "wall_ms", r->wall_ms, "cpu_ms", r->cpu_ms,
                                  "memory_peak_kb", (json_int_t)r->memory_peak_kb,
                                  "memory_peak_scope",
                                  r->memory_peak_scope ? r->memory_peak_scope : "cell"));
    json_object_set_new(o, "limits_degraded", json_boolean(r->limits_degraded));
    if (r->message)
        json_object_set_new(o, "message", json_string(r->message));
    if (r->network)
        json_object_set(o, "network", r->network);
    if (r->packages)
        json_object_set(o, "packages", r->packages);
    if (r->persist_error)
        json_object_set_new(o, "persist_error", json_string(r->persist_error));
    return o;
}

int exec_record_exit_status(const struct exec_record *r)
{
    switch (r->status) {
    case EXEC_OK:
        return r->has_exit_code ? r->exit_code : 0;
    case EXEC_ERROR:
        return r->has_exit_code && r->exit_code ? r->exit_code : 1;
    case EXEC_TIMEOUT:
        return 124;
    case EXEC_OOM:
        return 128 + SIGKILL;
    case EXEC_KILLED:
    case EXEC_CRASHED:
        /* An interpreter that exited by itself (os._exit(N) in a cell) has a status, not a
         * signal; 0 would read as success, and it was not one. */
        if (!r->signal && r->has_exit_code)
            return r->exit_code ? r->exit_code : 1;
        return 128 + (r->signal ? r->signal : SIGKILL);
    case EXEC_OUTPUT_LIMIT:
        return r->has_exit_code ? r->exit_code : 1;
    case EXEC_SANDBOX_ERROR:
        return 125;
    }
    return 1;
}
