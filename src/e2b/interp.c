/* interp.c - the code interpreter's routes: /execute (streamed) and /contexts. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "e2b/e2b-int.h"

/* ---- the code interpreter: /execute and /contexts ---- */

/* Python code that runs src in the namespace of context ctx, a dictionary of its own in
 * the session's kernel (a module, _runcell_e2b, holds them); the value of its last
 * expression is the cell's value. */
static const char ctx_helper[] = "import ast\n"
                                 "spaces = {}\n"
                                 "def run(ctx, src):\n"
                                 "    ns = spaces.setdefault(ctx, {'__name__': '__main__'})\n"
                                 "    tree = ast.parse(src, '<context>')\n"
                                 "    last = None\n"
                                 "    if tree.body and isinstance(tree.body[-1], ast.Expr):\n"
                                 "        last = ast.Expression(tree.body.pop().value)\n"
                                 "    exec(compile(tree, '<context>', 'exec'), ns)\n"
                                 "    if last is not None:\n"
                                 "        return eval(compile(last, '<context>', 'eval'), ns)\n"
                                 "def drop(ctx):\n"
                                 "    spaces.pop(ctx, None)\n";

static char *py_literal(const char *s)
{
    json_t *j = json_string(s);
    char *lit = json_dumps(j, JSON_ENCODE_ANY);
    json_decref(j);
    return lit;
}

/* A cell calling fn ("run" or "drop") of the context helper with its arguments. */
static char *ctx_cell(const char *fn, const char *ctx, const char *src)
{
    _cleanup_free_ char *helper = py_literal(ctx_helper);
    _cleanup_free_ char *c = py_literal(ctx);
    _cleanup_free_ char *code = src ? py_literal(src) : NULL;
    return xasprintf("(lambda m: (m.__dict__.get(%s) or (exec(%s, m.__dict__), "
                     "m.__dict__[%s])[1])(%s%s%s))(__import__('sys').modules.setdefault("
                     "'_runcell_e2b', __import__('types').ModuleType('_runcell_e2b')))",
                     strcmp(fn, "run") ? "'drop'" : "'run'", helper,
                     strcmp(fn, "run") ? "'drop'" : "'run'", c, code ? ", " : "", code ? code : "");
}

/* Where context ctx is in b's list (b may be NULL), or -1; e->lock held. */
static ssize_t box_context_index(struct e2b_box *b, const char *ctx)
{
    size_t i;
    json_t *c;
    json_array_foreach(b ? b->contexts : NULL, i, c)
    {
        if (!strcmp(json_string_value(json_object_get(c, "id")), ctx))
            return (ssize_t)i;
    }
    return -1;
}

/* The language of context ctx in sandbox box, into lang; false when there is no such one. */
static bool context_lang(struct e2b *e, const char *box, const char *ctx, char lang[16])
{
    pthread_mutex_lock(&e->lock);
    struct e2b_box *b = e2b_box_find(e, box);
    ssize_t i = box_context_index(b, ctx);
    if (i >= 0)
        snprintf(lang, 16, "%s",
                 json_string_value(json_object_get(json_array_get(b->contexts, i), "language")));
    pthread_mutex_unlock(&e->lock);
    return i >= 0;
}

/* E2B's names for languages that runcell calls otherwise. */
static const struct {
    const char *e2b, *runcell;
} e2b_lang_aliases[] = {{"python3", "python"}, {"sh", "bash"}};

/* E2B's languages onto runcell's (python, bash cells and javascript, the session's Node
 * kernel), as runcell names them (lang_name) or E2B does; NULL for the others. */
static const char *map_language(const char *lang)
{
    for (size_t i = 0; i < ARRAY_SIZE(e2b_lang_aliases); i++)
        if (!strcmp(lang, e2b_lang_aliases[i].e2b))
            return e2b_lang_aliases[i].runcell;
    return lang_name(lang);
}

enum MHD_Result h_e2b_execute(struct request *rq)
{
    const char *box = e2b_header(rq, "E2b-Sandbox-Id");
    json_t *body = e2b_body(rq);
    enum MHD_Result ret = MHD_YES;
    if (!body)
        return MHD_YES;
    const char *code = json_string_value(json_object_get(body, "code"));
    const char *ctx = json_string_value(json_object_get(body, "context_id"));
    const char *lang = json_string_value(json_object_get(body, "language"));
    json_t *envs = json_object_get(body, "env_vars");
    char ctx_lang[16] = "python";
    if (!code) {
        ret = e2b_error(rq, 400, "field 'code' is required: the code to run, a string");
        goto out;
    }
    if (e2b_asks_for(envs)) {
        ret = e2b_error(rq, 400,
                        "field 'env_vars' (runCode's envs) is not supported per "
                        "execution; give envs to Sandbox.create, or set os.environ in the code");
        goto out;
    }
    if (ctx && !context_lang(rq->srv->e2b, box, ctx, ctx_lang)) {
        ret = e2b_error(rq, 404, "context '%s' not found in sandbox %s", ctx, box);
        goto out;
    }
    if (lang && !ctx) {
        if (!map_language(lang)) {
            ret = e2b_error(rq, 400,
                            "field 'language': '%s' is not supported by runcell yet; "
                            "it runs python, bash and javascript",
                            lang);
            goto out;
        }
        snprintf(ctx_lang, sizeof(ctx_lang), "%s", map_language(lang));
    }
    struct session *s = e2b_box_session(rq, box);
    if (!s)
        goto out;
    bool own_ns = ctx && strcmp(ctx, "default") && !strcmp(ctx_lang, "python");
    char *cell = own_ns ? ctx_cell("run", ctx, code) : xstrdup(code);
    ret = e2b_start_stream(rq, s, cell, map_language(ctx_lang), rq->srv->cfg->limits.max_timeout_ms,
                           &e2b_execute_encoder, e2b_execute_state());
    free(cell);
out:
    json_decref(body);
    return ret;
}

static json_t *box_contexts(struct e2b *e, const char *box)
{
    pthread_mutex_lock(&e->lock);
    struct e2b_box *b = e2b_box_find(e, box);
    json_t *j = b ? json_deep_copy(b->contexts) : json_array();
    pthread_mutex_unlock(&e->lock);
    return j;
}

enum MHD_Result h_e2b_contexts_list(struct request *rq)
{
    return reply_json(rq, 200, box_contexts(rq->srv->e2b, e2b_header(rq, "E2b-Sandbox-Id")));
}

enum MHD_Result h_e2b_context_create(struct request *rq)
{
    const char *box = e2b_header(rq, "E2b-Sandbox-Id");
    json_t *body = e2b_body(rq);
    if (!body)
        return MHD_YES;
    const char *lang = json_string_value(json_object_get(body, "language"));
    const char *cwd = json_string_value(json_object_get(body, "cwd"));
    const char *mapped = map_language(lang ? lang : "python");
    _cleanup_free_ char *hex = random_hex(8);
    enum MHD_Result ret;
    if (!mapped) {
        ret = e2b_error(rq, 400,
                        "field 'language': '%s' contexts are not supported by "
                        "runcell yet; it runs python, bash and javascript",
                        lang);
        goto out;
    }
    if (cwd && strcmp(cwd, E2B_HOME) && strcmp(cwd, "/workspace")) {
        ret = e2b_error(rq, 400,
                        "field 'cwd': contexts start in %s (runcell's /workspace); "
                        "change directory in the code instead",
                        E2B_HOME);
        goto out;
    }
    json_t *c = json_pack("{s:s,s:s,s:s}", "id", hex, "language", mapped, "cwd", E2B_HOME);
    struct e2b *e = rq->srv->e2b;
    pthread_mutex_lock(&e->lock);
    struct e2b_box *b = e2b_box_find(e, box);
    bool full = b && json_array_size(b->contexts) >= E2B_MAX_CONTEXTS;
    if (b && !full)
        json_array_append(b->contexts, c);
    pthread_mutex_unlock(&e->lock);
    if (full) {
        json_decref(c);
        ret =
            e2b_error(rq, 429, "sandbox %s has its maximum of %d contexts", box, E2B_MAX_CONTEXTS);
        goto out;
    }
    ret = reply_json(rq, 200, c);
out:
    json_decref(body);
    return ret;
}

/* Runs a quiet python cell in the sandbox (a context's namespace dropped). */
static int quiet_cell(struct session *s, const char *code)
{
    struct exec_request req = {.code = code, .cancel_fd = -1};
    struct exec_record rec;
    exec_record_init(&rec, 4096);
    int r = session_execute(s, &req, NULL, &rec);
    exec_record_release(&rec);
    return r;
}

static enum MHD_Result context_change(struct request *rq, bool remove)
{
    const char *box = e2b_header(rq, "E2b-Sandbox-Id"), *ctx = rq->params[0];
    char lang[16];
    struct e2b *e = rq->srv->e2b;
    if (!context_lang(e, box, ctx, lang))
        return e2b_error(rq, 404, "context '%s' not found in sandbox %s", ctx, box);
    bool dflt = !strcmp(ctx, "default");
    if (dflt && remove)
        return e2b_error(rq, 400, "the default context cannot be removed; kill the sandbox");
    struct session *s = e2b_box_session(rq, box);
    if (!s)
        return MHD_YES;
    int r = 0;
    if (dflt)
        r = session_restart(s); /* a fresh interpreter, same files */
    else if (!strcmp(lang, "python")) {
        _cleanup_free_ char *cell = ctx_cell("drop", ctx, NULL);
        r = quiet_cell(s, cell);
    }
    session_table_put(rq->srv->table, s);
    if (r < 0)
        return e2b_error(rq, e2b_status_of(r), "%s", err_msg());
    if (remove) {
        pthread_mutex_lock(&e->lock);
        struct e2b_box *b = e2b_box_find(e, box);
        ssize_t i = box_context_index(b, ctx);
        if (i >= 0)
            json_array_remove(b->contexts, (size_t)i);
        pthread_mutex_unlock(&e->lock);
    }
    return e2b_reply_empty(rq, 204);
}

enum MHD_Result h_e2b_context_delete(struct request *rq)
{
    return context_change(rq, true);
}

enum MHD_Result h_e2b_context_restart(struct request *rq)
{
    return context_change(rq, false);
}
