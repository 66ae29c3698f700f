/* repl_keep.c - keeping `runcell repl` sessions: the records and the store under the data
 * directory (shared with `runcell serve`), resuming a stored session, and the checkpoint
 * when the repl ends. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "http/serve.h"
#include "cli/cli.h"

int repl_keep_open(struct repl_keep *k, const char *data_dir, const struct store_opts *so,
                   const char *owner)
{
    _cleanup_free_ char *data = data_dir ? xstrdup(data_dir) : default_data_dir();
    _cleanup_free_ char *db = xasprintf("%s/sessions.db", data);
    _cleanup_free_ char *local = xasprintf("%s/store", data);
    struct store_config sc = so->cfg;
    if (!sc.url)
        sc.url = local;
    int r = mkdir_p(data, 0700);
    if (r < 0)
        return err_set(-r, "cannot create the data directory %s: %s", data, strerror(-r));
    /* Sessions of processes that died (a repl or a server killed) are stopped, not live. */
    if ((r = meta_open(db, &k->meta)) < 0 || (r = meta_recover(k->meta, owner_alive)) < 0 ||
        (r = store_open(&sc, &k->store)) < 0)
        return r;
    k->pc = (struct persist_config){.store = k->store,
                                    .meta = k->meta,
                                    .quota_bytes = so->quota_bytes,
                                    .max_files = so->max_files,
                                    .owner = owner};
    return 0;
}

void repl_keep_close(struct repl_keep *k)
{
    store_free(k->store);
    meta_close(k->meta);
    memset(k, 0, sizeof(*k));
}

int repl_keep_stored_limits(struct repl_keep *k, const char *from, struct sandbox_limits *l)
{
    json_t *info;
    if (session_stored_info(&k->pc, from, &info) < 0)
        return 0; /* the store alone may hold it: the restore tells */
    const char *state = json_string_value(json_object_get(info, "state"));
    if (!json_is_true(json_object_get(info, "resumable"))) {
        bool persisted = json_is_true(json_object_get(info, "persist"));
        err_set(ENOENT, "session %s cannot be resumed: %s", from,
                persisted ? "it was closed, and what it stored was discarded"
                          : "it was created with persist: false, so nothing of it was kept");
        json_decref(info);
        return -ENOENT;
    }
    /* The stored session's limits, unless the command line gives its own: a workspace
     * that held the files needs as much room again. */
    json_t *o = json_object_get(info, "options");
    if (!l->memory_mb)
        l->memory_mb = (uint64_t)json_integer_value(json_object_get(o, "memory_mb"));
    if (!l->pids)
        l->pids = (uint64_t)json_integer_value(json_object_get(o, "pids"));
    if (!l->disk_mb)
        l->disk_mb = (uint64_t)json_integer_value(json_object_get(o, "disk_mb"));
    if (!l->cpus_milli)
        l->cpus_milli = (uint64_t)(json_number_value(json_object_get(o, "cpus")) * 1000 + 0.5);
    log_debug("msg=\"resuming\" session=%s state=%s", from, state ? state : "?");
    json_decref(info);
    return 0;
}

/* "a, b, c" of the strings of an array (or of an object's keys); caller frees. */
static char *join(json_t *v, const char *key)
{
    struct buf b;
    size_t i;
    json_t *x;
    const char *name;
    buf_init(&b, 0);
    buf_append(&b, "", 0);
    if (json_is_object(v)) {
        json_object_foreach(v, name, x) buf_printf(&b, "%s%s", b.len ? ", " : "", name);
    }
    json_array_foreach(v, i, x)
    {
        const char *s = key ? json_string_value(json_object_get(x, key)) : json_string_value(x);
        buf_printf(&b, "%s%s", b.len ? ", " : "", s ? s : "?");
    }
    return buf_detach(&b, NULL);
}

/* "name (why); name (why)" of [{name_key, why_key}]; caller frees. */
static char *join_reasons(json_t *v, const char *name_key, const char *why_key)
{
    struct buf b;
    size_t i;
    json_t *x;
    buf_init(&b, 0);
    buf_append(&b, "", 0);
    json_array_foreach(v, i, x) buf_printf(&b, "%s%s (%s)", b.len ? "; " : "",
                                           json_string_value(json_object_get(x, name_key)),
                                           json_string_value(json_object_get(x, why_key)));
    return buf_detach(&b, NULL);
}

static void print_restored(json_t *rep, const char *from, const char *id)
{
    _cleanup_free_ char *vars = join(json_object_get(rep, "variables"), NULL);
    _cleanup_free_ char *mods = join(json_object_get(rep, "modules"), NULL);
    fprintf(stderr, "runcell repl: resumed session %s as %s: %zu file%s; variables: %s%s%s\n", from,
            id, json_array_size(json_object_get(rep, "files")),
            json_array_size(json_object_get(rep, "files")) == 1 ? "" : "s", *vars ? vars : "none",
            *mods ? "; modules: " : "", mods);
    const char *keys[][3] = {{"files_failed", "path", "error"},
                             {"variables_failed", "name", "error"},
                             {"not_saved", "name", "reason"}};
    const char *what[] = {"files not restored", "variables not restored",
                          "not saved at the checkpoint"};
    for (size_t i = 0; i < ARRAY_SIZE(keys); i++) {
        _cleanup_free_ char *list =
            join_reasons(json_object_get(rep, keys[i][0]), keys[i][1], keys[i][2]);
        if (*list)
            fprintf(stderr, "runcell repl: %s: %s\n", what[i], list);
    }
    const char *errs[] = {"error", "variables_error", "persist_error", "variables_note"};
    for (size_t i = 0; i < ARRAY_SIZE(errs); i++) {
        const char *e = json_string_value(json_object_get(rep, errs[i]));
        if (e)
            fprintf(stderr, "runcell repl: %s\n", e);
    }
}

int repl_keep_attach(struct repl_keep *k, struct session *s, bool files, const char *resume_from)
{
    _cleanup_free_ char *id = random_hex(12);
    json_t *rep = NULL;
    int r = session_persist(s, &k->pc, id, files, resume_from);
    if (!r && resume_from && (r = session_restore(s, resume_from, &rep)) == 0) {
        print_restored(rep, resume_from, id);
        json_decref(rep);
    }
    if (r < 0)
        return r;
    if (files)
        fprintf(stderr,
                "runcell repl: session %s: files are saved after every input, "
                "variables when the repl ends; resume with: runcell repl --resume %s\n",
                id, id);
    return 0;
}

void repl_keep_end(struct session *s)
{
    json_t *rep;
    bool files = session_stores_files(s);
    session_retire(s, files ? SESSION_END_CHECKPOINT : SESSION_END_CLOSE, &rep);
    json_t *vars = json_object_get(rep, "variables");
    if (files) {
        _cleanup_free_ char *saved = join(json_object_get(vars, "saved"), NULL);
        _cleanup_free_ char *mods = join(json_object_get(vars, "modules"), NULL);
        _cleanup_free_ char *skipped =
            join_reasons(json_object_get(vars, "skipped"), "name", "reason");
        fprintf(stderr, "runcell repl: session %s kept: %lld file%s; variables: %s%s%s%s%s\n",
                session_id(s), (long long)json_integer_value(json_object_get(rep, "files")),
                json_integer_value(json_object_get(rep, "files")) == 1 ? "" : "s",
                vars ? (*saved ? saved : "none") : "not saved", *mods ? "; modules: " : "", mods,
                *skipped ? "; not saved: " : "", skipped);
    }
    const char *errs[] = {"error", "variables_error", "persist_error"};
    for (size_t i = 0; i < ARRAY_SIZE(errs); i++) {
        const char *e = json_string_value(json_object_get(rep, errs[i]));
        if (e)
            fprintf(stderr, "runcell repl: %s\n", e);
    }
    json_decref(rep);
}
