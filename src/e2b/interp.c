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
 * the session's kernel (a module, _runcell_e2b, holds them), in the context's own working
 * directory (its cwd at first; where its code left it after); the value of its last
 * expression is the cell's value. */
static const char ctx_helper[] = "import ast, os\n"
                                 "spaces = {}\n"
                                 "cwds = {}\n"
                                 "def run(ctx, src, cwd):\n"
                                 "    ns = spaces.setdefault(ctx, {'__name__': '__main__'})\n"
                                 "    here = os.getcwd()\n"
                                 "    os.chdir(cwds.setdefault(ctx, cwd))\n"
                                 "    try:\n"
                                 "        tree = ast.parse(src, '<context>')\n"
                                 "        last = None\n"
                                 "        if tree.body and isinstance(tree.body[-1], ast.Expr):\n"
                                 "            last = ast.Expression(tree.body.pop().value)\n"
                                 "        exec(compile(tree, '<context>', 'exec'), ns)\n"
                                 "        if last is not None:\n"
                                 "            return eval(compile(last, '<context>', 'eval'), ns)\n"
                                 "    finally:\n"
                                 "        try:\n"
                                 "            cwds[ctx] = os.getcwd()\n"
                                 "            os.chdir(here)\n"
                                 "        except OSError:\n"
                                 "            pass\n"
                                 "def drop(ctx):\n"
                                 "    spaces.pop(ctx, None)\n"
                                 "    cwds.pop(ctx, None)\n";

static char *py_literal(const char *s)
{
    json_t *j = json_string(s);
    char *lit = json_dumps(j, JSON_ENCODE_ANY);
    json_decref(j);
    return lit;
}

/* A cell calling fn ("run" or "drop") of the context helper with its arguments. */
static char *ctx_cell(const char *fn, const char *ctx, const char *src, const char *cwd)
{
    _cleanup_free_ char *helper = py_literal(ctx_helper);
    _cleanup_free_ char *c = py_literal(ctx);
    _cleanup_free_ char *code = src ? py_literal(src) : NULL;
    _cleanup_free_ char *dir = src ? py_literal(cwd ? cwd : E2B_HOME) : NULL;
    const char *name = strcmp(fn, "run") ? "'drop'" : "'run'";
    return xasprintf("(lambda m: (m.__dict__.get(%s) or (exec(%s, m.__dict__), "
                     "m.__dict__[%s])[1])(%s%s%s%s%s))(__import__('sys').modules.setdefault("
                     "'_runcell_e2b', __import__('types').ModuleType('_runcell_e2b')))",
                     name, helper, name, c, code ? ", " : "", code ? code : "", dir ? ", " : "",
                     dir ? dir : "");
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

/* The language and working directory of context ctx in sandbox box, into lang and cwd (may
 * be NULL); false when there is no such one. */
static bool context_of(struct e2b *e, const char *box, const char *ctx, char lang[16],
                       char cwd[E2B_MAX_CWD])
{
    pthread_mutex_lock(&e->lock);
    struct e2b_box *b = e2b_box_find(e, box);
    ssize_t i = box_context_index(b, ctx);
    json_t *c = i >= 0 ? json_array_get(b->contexts, (size_t)i) : NULL;
    if (c)
        snprintf(lang, 16, "%s", json_string_value(json_object_get(c, "language")));
    if (c && cwd)
        snprintf(cwd, E2B_MAX_CWD, "%s", json_string_value(json_object_get(c, "cwd")));
    pthread_mutex_unlock(&e->lock);
    return c != NULL;
}

static bool context_lang(struct e2b *e, const char *box, const char *ctx, char lang[16])
{
    return context_of(e, box, ctx, lang, NULL);
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

/* /execute's refusals are told in the stream, as an error the SDKs show (execution.error):
 * @e2b/code-interpreter reads the body of a failed /execute only for 404 and 502. */
enum MHD_Result h_e2b_execute(struct request *rq)
{
    const char *box = e2b_box_id(rq);
    json_t *body = e2b_body(rq);
    enum MHD_Result ret = MHD_YES;
    if (!body)
        return MHD_YES;
    const char *code = json_string_value(json_object_get(body, "code"));
    const char *ctx = json_string_value(json_object_get(body, "context_id"));
    const char *lang = json_string_value(json_object_get(body, "language"));
    json_t *envs = json_object_get(body, "env_vars");
    char ctx_lang[16] = "python", cwd[E2B_MAX_CWD] = E2B_HOME;
    if (!code) {
        ret = e2b_execute_refused(rq, "InvalidArgumentError",
                                  "field 'code' is required: the code to run, a string");
        goto out;
    }
    if (e2b_asks_for(envs)) {
        ret = e2b_execute_refused(rq, "InvalidArgumentError",
                                  "runCode's envs (env_vars) are not supported per execution by "
                                  "runcell; give envs to Sandbox.create, or set os.environ in "
                                  "the code");
        goto out;
    }
    if (ctx && !context_of(rq->srv->e2b, box, ctx, ctx_lang, cwd)) {
        ret = e2b_error(rq, 404, "context '%s' not found in sandbox %s", ctx, box);
        goto out;
    }
    if (lang && !ctx) {
        if (!map_language(lang)) {
            ret = e2b_execute_refused(rq, "InvalidArgumentError",
                                      "language '%s' is not supported by runcell; it runs "
                                      "python, bash (or sh) and javascript (or js)",
                                      lang);
            goto out;
        }
        snprintf(ctx_lang, sizeof(ctx_lang), "%s", map_language(lang));
    }
    bool python_ctx = ctx && strcmp(ctx, "default") && !strcmp(ctx_lang, "python");
    if (ctx && !python_ctx && strcmp(cwd, E2B_HOME)) {
        ret = e2b_execute_refused(rq, "InvalidArgumentError",
                                  "a %s context runs in %s (the sandbox's one %s kernel); its "
                                  "cwd %s is not taken: change directory in the code instead",
                                  ctx_lang, E2B_HOME, ctx_lang, cwd);
        goto out;
    }
    struct session *s = e2b_box_session(rq, box);
    if (!s)
        goto out;
    char *cell = python_ctx ? ctx_cell("run", ctx, code, cwd) : xstrdup(code);
    ret = e2b_execute_stream(rq, s, cell, map_language(ctx_lang));
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
    return reply_json(rq, 200, box_contexts(rq->srv->e2b, e2b_box_id(rq)));
}

enum MHD_Result h_e2b_context_create(struct request *rq)
{
    const char *box = e2b_box_id(rq);
    json_t *body = e2b_body(rq);
    if (!body)
        return MHD_YES;
    const char *lang = json_string_value(json_object_get(body, "language"));
    const char *cwd = json_string_value(json_object_get(body, "cwd"));
    const char *mapped = map_language(lang ? lang : "python");
    _cleanup_free_ char *hex = random_hex(8);
    char *dir = NULL;
    enum MHD_Result ret;
    if (!mapped) {
        ret = e2b_error(rq, 400,
                        "field 'language': '%s' contexts are not supported by "
                        "runcell yet; it runs python, bash and javascript",
                        lang);
        goto out;
    }
    /* Any directory of the sandbox (a relative one below the home): a python context runs in
     * its own; /execute says so for the others, which share one kernel's. */
    if (cwd && (strlen(cwd) >= E2B_MAX_CWD - sizeof(E2B_HOME) - 1 || !*cwd)) {
        ret = e2b_error(rq, 400, "field 'cwd' must be a path of fewer than %d bytes",
                        (int)(E2B_MAX_CWD - sizeof(E2B_HOME) - 1));
        goto out;
    }
    dir = !cwd ? xstrdup(E2B_HOME) : *cwd == '/' ? xstrdup(cwd) : xasprintf("%s/%s", E2B_HOME, cwd);
    json_t *c = json_pack("{s:s,s:s,s:s}", "id", hex, "language", mapped, "cwd", dir);
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
    free(dir);
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
    const char *box = e2b_box_id(rq), *ctx = rq->params[0];
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
    if (dflt) /* its names go, the kernel stays: the other contexts and the commands too */
        r = quiet_cell(s, "__runcell_ipy__.reset()");
    else if (!strcmp(lang, "python")) {
        _cleanup_free_ char *cell = ctx_cell("drop", ctx, NULL, NULL);
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
