/* tools.c - the tools runcell offers over MCP: their schemas (made from one table, so the
 * schema a client sees and the checks the server makes cannot drift apart), and what each
 * one does. */
#include "mcp/mcp-int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Entries of a list_files answer. */
#define LIST_MAX 1000

static const char *const langs[] = {"python", "bash", "javascript", NULL};
static const char *const encodings[] = {"utf-8", "base64", NULL};

#define ARG_SESSION                                                                                \
    {                                                                                              \
        "session_id", ARG_STRING, false, NULL,                                                     \
            "The session to use, as returned by create_session. Leave it out to use this "         \
            "client's default session."                                                            \
    }
/* session_id on protocol 2026-07-28, where a connection is no conversation: required. */
static const char session_arg_modern[] =
    "The session to use: the session_id create_session returned. Variables and files persist "
    "within one session.";
#define ARG_TIMEOUT                                                                                \
    {                                                                                              \
        "timeout_s", ARG_NUMBER, false, NULL,                                                      \
            "Wall-clock limit in seconds (default: the session's, 60 unless configured). A cell "  \
            "past "                                                                                \
            "it is interrupted; its variables are kept when it stops."                             \
    }

static const struct arg run_code_args[] = {
    {"code", ARG_STRING, true, NULL, "The code to run, like a notebook cell."},
    {"language", ARG_STRING, false, langs,
     "python (default), bash or javascript. A session "
     "runs JavaScript only if it was created with language javascript (create_session), and "
     "then only JavaScript."},
    ARG_SESSION,
    ARG_TIMEOUT,
};
static const struct arg run_shell_args[] = {
    {"command", ARG_STRING, true, NULL, "A bash command line, run in /workspace."},
    ARG_SESSION,
    ARG_TIMEOUT,
};
static const struct arg create_session_args[] = {
    {"language", ARG_STRING, false, langs,
     "The default language of its cells: python "
     "(default), bash, or javascript (a Node.js kernel: top-level await, require)."},
    {"timeout_s", ARG_NUMBER, false, NULL, "Default wall-clock limit of each call, in seconds."},
    {"history", ARG_COUNT, false, NULL,
     "How many of its last cells the undo tool can take back (0 to 100; default 3)."},
};
static const struct arg close_session_args[] = {
    {"session_id", ARG_STRING, true, NULL, "The session to close."},
};
static const struct arg list_files_args[] = {
    {"path", ARG_STRING, false, NULL, "A directory in /workspace to list (default: all of it)."},
    ARG_SESSION,
};
static const struct arg read_file_args[] = {
    {"path", ARG_STRING, true, NULL,
     "The file, relative to /workspace (or an absolute path "
     "in /workspace)."},
    ARG_SESSION,
};
static const struct arg write_file_args[] = {
    {"path", ARG_STRING, true, NULL,
     "The file, relative to /workspace (or an absolute path in "
     "/workspace); parent directories are created."},
    {"content", ARG_STRING, true, NULL, "The file's content."},
    {"encoding", ARG_STRING, false, encodings,
     "utf-8 (default: content is the text) or base64 "
     "(content is base64 of the bytes)."},
    ARG_SESSION,
};

static const struct arg undo_args[] = {
    {"before", ARG_COUNT, false, NULL,
     "The execution_count of the cell to undo, with every cell after it (default: the last "
     "cell)."},
    ARG_SESSION,
};

static const struct arg wait_args[] = {
    {"run_id", ARG_STRING, true, NULL,
     "The run_id that run_code or run_shell gave when the cell was still running."},
    {"timeout_s", ARG_NUMBER, false, NULL,
     "How long to wait at most, in seconds (default, and at most: about 45)."},
};

static const char record_schema[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"session_id\":{\"type\":\"string\"},"
    "\"status\":{\"type\":\"string\",\"enum\":[\"ok\",\"error\",\"timeout\",\"oom\",\"killed\","
    "\"output_limit\",\"crashed\",\"sandbox_error\",\"running\"]},"
    "\"run_id\":{\"type\":\"string\"},\"elapsed_s\":{\"type\":\"number\"},"
    "\"stdout\":{\"type\":\"string\"},\"stderr\":{\"type\":\"string\"},"
    "\"results\":{\"type\":\"array\",\"items\":{\"type\":\"object\"}},"
    "\"error\":{\"type\":[\"object\",\"null\"]},"
    "\"files\":{\"type\":\"object\"},"
    "\"state\":{\"type\":\"string\",\"enum\":[\"kept\",\"lost\"]},"
    "\"execution_count\":{\"type\":\"integer\"},"
    "\"usage\":{\"type\":\"object\"},"
    "\"message\":{\"type\":\"string\"}},"
    "\"required\":[\"session_id\",\"status\"]}";
static const char undo_schema[] =
    "{\"type\":\"object\",\"properties\":{\"session_id\":{\"type\":\"string\"},"
    "\"before\":{\"type\":\"integer\"},\"execution_count\":{\"type\":\"integer\"},"
    "\"variables\":{\"type\":\"string\"},"
    "\"files\":{\"type\":\"object\"},\"shell\":{\"type\":\"string\"},"
    "\"kept\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}},"
    "\"required\":[\"session_id\",\"before\",\"execution_count\"]}";
static const char session_schema[] =
    "{\"type\":\"object\",\"properties\":{\"session_id\":{\"type\":\"string\"},"
    "\"language\":{\"type\":\"string\"},\"python_version\":{\"type\":\"string\"},"
    "\"timeout_s\":{\"type\":\"number\"}},\"required\":[\"session_id\"]}";
static const char closed_schema[] =
    "{\"type\":\"object\",\"properties\":{\"session_id\":{\"type\":\"string\"},"
    "\"closed\":{\"type\":\"boolean\"}},\"required\":[\"session_id\",\"closed\"]}";
static const char files_schema[] =
    "{\"type\":\"object\",\"properties\":{\"session_id\":{\"type\":\"string\"},"
    "\"files\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{"
    "\"path\":{\"type\":\"string\"},\"size\":{\"type\":\"integer\"},"
    "\"mtime\":{\"type\":\"string\"},\"type\":{\"type\":\"string\"}}}},"
    "\"truncated\":{\"type\":\"boolean\"}},\"required\":[\"session_id\",\"files\"]}";
static const char file_schema[] =
    "{\"type\":\"object\",\"properties\":{\"session_id\":{\"type\":\"string\"},"
    "\"path\":{\"type\":\"string\"},\"size\":{\"type\":\"integer\"},"
    "\"mime_type\":{\"type\":\"string\"}},\"required\":[\"session_id\",\"path\",\"size\"]}";

static json_t *t_run_code(struct call *k);
static json_t *t_run_shell(struct call *k);
static json_t *t_create_session(struct call *k);
static json_t *t_close_session(struct call *k);
static json_t *t_list_files(struct call *k);
static json_t *t_read_file(struct call *k);
static json_t *t_write_file(struct call *k);
static json_t *t_wait_for_cell(struct call *k);
static json_t *t_undo(struct call *k);

#define ARGS(a) a, ARRAY_SIZE(a)

static const struct tool tools[] = {
    {"run_code", "Run code",
     "Run Python (default), bash or JavaScript (Node.js) code in a sandboxed, stateful session, "
     "like a notebook cell: variables, imports and files in /workspace persist between calls to "
     "the same session. The value of the last expression is returned, matplotlib figures come "
     "back as PNG images, and a failure returns the traceback with isError set, so the code can "
     "be fixed and run again. numpy, pandas and matplotlib are installed.",
     ARGS(run_code_args), false, false, false, record_schema, t_run_code},
    {"run_shell", "Run a shell command",
     "Run a bash command line in the session's shell (the same files as run_code): it starts "
     "in /workspace and keeps its cwd, variables, exports and functions between calls. "
     "Returns its output and exit status; a failing command sets isError.",
     ARGS(run_shell_args), false, false, false, record_schema, t_run_shell},
    {"create_session", "Create a session",
     "Start a new, separate sandboxed session (its own interpreter and /workspace) and return "
     "its session_id, for the session_id argument of the other tools.",
     ARGS(create_session_args), false, false, false, session_schema, t_create_session, true},
    {"close_session", "Close a session",
     "Close a session: its interpreter stops and its files are deleted.", ARGS(close_session_args),
     false, true, true, closed_schema, t_close_session},
    {"list_files", "List files", "List the files in the session's /workspace with their sizes.",
     ARGS(list_files_args), true, false, true, files_schema, t_list_files},
    {"read_file", "Read a file",
     "Read a file from the session's /workspace: text comes back as text, PNG, JPEG, GIF and "
     "WebP as images, anything else as base64.",
     ARGS(read_file_args), true, false, true, file_schema, t_read_file},
    {"write_file", "Write a file",
     "Write a file into the session's /workspace (replacing one that is there), for code to "
     "read. Text by default; binary as base64 with encoding base64.",
     ARGS(write_file_args), false, true, true, file_schema, t_write_file},
    {"wait_for_cell", "Wait for a running cell",
     "Wait for a cell that was still running when run_code or run_shell answered (that result "
     "says so and gives a run_id): returns the cell's result once it finishes, or, after a "
     "while, that it still runs, with its latest output; then call this again.",
     ARGS(wait_args), true, false, true, record_schema, t_wait_for_cell, true},
    {"undo", "Undo cells",
     "Take the session back to its state before a cell (default: the last one): its variables "
     "and imports as they were, and the files that cell and those after it changed. Use it "
     "when a cell broke the state (a half-done change to a DataFrame) before trying again.",
     ARGS(undo_args), false, true, false, undo_schema, t_undo},
};

bool tool_takes_session(const struct tool *t)
{
    return !t->no_session;
}

/* Whether argument a is required on a version: session_id is, on the modern era, for every
 * tool that works on a session. */
static bool arg_required(const struct tool *t, const struct arg *a, unsigned features)
{
    return a->required ||
           ((features & VF_MODERN) && !t->no_session && !strcmp(a->name, "session_id"));
}

const struct tool *tool_find(const char *name)
{
    for (size_t i = 0; name && i < ARRAY_SIZE(tools); i++)
        if (!strcmp(tools[i].name, name))
            return &tools[i];
    return NULL;
}

/* Made from tools[] once, so that the list in error messages cannot drift from it. */
static char tool_list[256];
static pthread_once_t tool_list_once = PTHREAD_ONCE_INIT;

static void tool_list_make(void)
{
    size_t used = 0;
    for (size_t i = 0; i < ARRAY_SIZE(tools) && used < sizeof(tool_list); i++)
        used += (size_t)snprintf(tool_list + used, sizeof(tool_list) - used, "%s%s", i ? ", " : "",
                                 tools[i].name);
}

const char *tool_names(void)
{
    pthread_once(&tool_list_once, tool_list_make);
    return tool_list;
}

/* ---- schemas and argument checks ---- */

static json_t *input_schema(const struct tool *t, unsigned features)
{
    json_t *props = json_object(), *required = json_array();
    for (size_t i = 0; i < t->n_args; i++) {
        const struct arg *a = &t->args[i];
        const char *type = a->type == ARG_STRING  ? "string"
                           : a->type == ARG_COUNT ? "integer"
                                                  : "number";
        bool req = arg_required(t, a, features);
        const char *description =
            req && !a->required ? session_arg_modern : a->description; /* session_id */
        /* An optional argument may be null, which stands for its default (clients that fill
         * every property send null for those they leave out). */
        json_t *p =
            req ? json_pack("{s:s,s:s}", "type", type, "description", description)
                : json_pack("{s:[s,s],s:s}", "type", type, "null", "description", description);
        if (a->choices) {
            json_t *e = json_array();
            for (const char *const *c = a->choices; *c; c++)
                json_array_append_new(e, json_string(*c));
            if (!req)
                json_array_append_new(e, json_null());
            json_object_set_new(p, "enum", e);
        }
        if (a->type == ARG_NUMBER)
            json_object_set_new(p, "exclusiveMinimum", json_integer(0));
        if (a->type == ARG_COUNT)
            json_object_set_new(p, "minimum", json_integer(0));
        json_object_set_new(props, a->name, p);
        if (req)
            json_array_append_new(required, json_string(a->name));
    }
    return json_pack("{s:s,s:o,s:o,s:b}", "type", "object", "properties", props, "required",
                     required, "additionalProperties", 0);
}

/* What create_session says about how long a session lives. */
static char *lifetime_sentence(const struct mcp_config *cfg)
{
    uint64_t idle = cfg->defaults.idle_timeout_ms;
    if (!idle)
        return xstrdup(" A session lives until close_session or until the server stops.");
    if (idle % 60000 == 0)
        return xasprintf(" A session is closed (its files deleted) after %llu minute%s without a "
                         "call, or by close_session.",
                         (unsigned long long)(idle / 60000), idle == 60000 ? "" : "s");
    return xasprintf(" A session is closed (its files deleted) after %llu s without a call, or "
                     "by close_session.",
                     (unsigned long long)(idle / 1000));
}

/* What the code can reach, as the server's --net and --secret say: " There is no network.",
 * or the hosts, and which of them get credentials added (never their values). */
static char *network_sentence(const struct mcp_config *cfg)
{
    const struct net_opts *n = &cfg->defaults.net;
    if (!n->policy)
        return xstrdup(" There is no network.");
    struct buf b;
    buf_init(&b, 0);
    json_t *p = net_policy_json(n->policy), *v;
    size_t i;
    buf_printf(&b, " The network reaches only");
    json_array_foreach(json_object_get(p, "allow"), i, v)
        buf_printf(&b, "%s %s", i ? "," : "", json_string_value(v));
    buf_printf(&b, ", through a proxy.");
    json_decref(p);
    json_t *sec = net_secrets_json(n->secrets);
    if (json_array_size(sec)) {
        buf_printf(&b, " Requests to");
        json_array_foreach(sec, i, v)
            buf_printf(&b, "%s %s", i ? "," : "", json_string_value(json_object_get(v, "host")));
        buf_printf(&b,
                   " get their credentials (%s) added by that proxy: send them without any; "
                   "the code never sees them.",
                   json_string_value(json_object_get(json_array_get(sec, 0), "header")));
    }
    json_decref(sec);
    return buf_detach(&b, NULL);
}

json_t *tools_list_json(const struct mcp_config *cfg, unsigned features)
{
    json_t *list = json_array();
    _cleanup_free_ char *network = network_sentence(cfg);
    for (size_t i = 0; i < ARRAY_SIZE(tools); i++) {
        const struct tool *t = &tools[i];
        _cleanup_free_ char *lifetime = t->run == t_create_session ? lifetime_sentence(cfg) : NULL;
        bool runs = t->run == t_run_code || t->run == t_run_shell;
        _cleanup_free_ char *description =
            xasprintf("%s%s%s", t->description, lifetime ? lifetime : "",
                      t->run == t_run_code ? network : "");
        json_t *j = json_pack("{s:s,s:s,s:o}", "name", t->name, "description", description,
                              "inputSchema", input_schema(t, features));
        if (features & VF_TITLES)
            json_object_set_new(j, "title", json_string(t->title));
        if (features & VF_ANNOTATIONS)
            json_object_set_new(j, "annotations",
                                json_pack("{s:s,s:b,s:b,s:b,s:b}", "title", t->title,
                                          "readOnlyHint", t->read_only, "destructiveHint",
                                          t->destructive, "idempotentHint", t->idempotent,
                                          "openWorldHint", runs && cfg->defaults.net.policy));
        if (features & VF_STRUCTURED)
            json_object_set_new(j, "outputSchema", json_loads(t->output_schema, 0, NULL));
        json_array_append_new(list, j);
    }
    return json_pack("{s:o}", "tools", list);
}

static const char *json_kind(json_t *v)
{
    static const char *const kinds[] = {
        [JSON_OBJECT] = "an object", [JSON_ARRAY] = "an array", [JSON_STRING] = "a string",
        [JSON_INTEGER] = "a number", [JSON_REAL] = "a number",  [JSON_TRUE] = "a boolean",
        [JSON_FALSE] = "a boolean",  [JSON_NULL] = "null",
    };
    return kinds[json_typeof(v)];
}

static int check_arg(const struct tool *t, const struct arg *a, json_t *v, char **ret_err)
{
    bool is_string = a->type == ARG_STRING;
    if (is_string ? !json_is_string(v) : !json_is_number(v)) {
        *ret_err = xasprintf("%s: argument '%s' must be %s, not %s", t->name, a->name,
                             is_string ? "a string" : "a number", json_kind(v));
        return MCP_INVALID_PARAMS;
    }
    if (a->type == ARG_NUMBER && !(json_number_value(v) > 0)) {
        *ret_err = xasprintf("%s: argument '%s' must be more than 0", t->name, a->name);
        return MCP_INVALID_PARAMS;
    }
    if (a->type == ARG_COUNT && !(json_number_value(v) >= 0 &&
                                  json_number_value(v) == (double)(long)json_number_value(v))) {
        *ret_err = xasprintf("%s: argument '%s' must be a whole number, 0 or more, not %g", t->name,
                             a->name, json_number_value(v));
        return MCP_INVALID_PARAMS;
    }
    if (a->choices) {
        const char *s = json_string_value(v);
        for (const char *const *c = a->choices; *c; c++)
            if (!strcmp(*c, s))
                return 0;
        *ret_err = xasprintf("%s: argument '%s' must be %s or %s, not '%s'", t->name, a->name,
                             a->choices[0], a->choices[1], s);
        return MCP_INVALID_PARAMS;
    }
    return 0;
}

static char *arg_names(const struct tool *t)
{
    struct buf b;
    buf_init(&b, 0);
    for (size_t i = 0; i < t->n_args; i++)
        buf_printf(&b, "%s%s", i ? ", " : "", t->args[i].name);
    return buf_detach(&b, NULL);
}

int mcp_tool_check_args(const char *name, json_t *args, char **ret_err)
{
    const struct tool *t = tool_find(name);
    *ret_err = NULL;
    if (!t) {
        *ret_err =
            xasprintf("unknown tool '%s'; the tools are: %s", name ? name : "", tool_names());
        return MCP_INVALID_PARAMS;
    }
    return tool_check_args(t, args, 0, ret_err);
}

int tool_check_args(const struct tool *t, json_t *args, unsigned features, char **ret_err)
{
    *ret_err = NULL;
    if (!json_is_object(args)) {
        *ret_err = xasprintf("%s: the arguments must be an object", t->name);
        return MCP_INVALID_PARAMS;
    }
    const char *key;
    json_t *v;
    json_object_foreach(args, key, v)
    {
        const struct arg *a = NULL;
        for (size_t i = 0; i < t->n_args && !a; i++)
            if (!strcmp(t->args[i].name, key))
                a = &t->args[i];
        if (!a) {
            _cleanup_free_ char *known = arg_names(t);
            *ret_err = xasprintf("%s: unknown argument '%s'; it takes %s", t->name, key, known);
            return MCP_INVALID_PARAMS;
        }
        if (json_is_null(v) && !arg_required(t, a, features))
            continue; /* null stands for "the default" */
        if (check_arg(t, a, v, ret_err))
            return MCP_INVALID_PARAMS;
    }
    for (size_t i = 0; i < t->n_args; i++) {
        const struct arg *a = &t->args[i];
        json_t *given = json_object_get(args, a->name);
        if (arg_required(t, a, features) && (!given || json_is_null(given))) {
            *ret_err = xasprintf("%s: argument '%s' is required: %s", t->name, a->name,
                                 a->required ? a->description
                                             : "create a session with create_session and pass "
                                               "the session_id it returns");
            return MCP_INVALID_PARAMS;
        }
    }
    return 0;
}

/* ---- results ---- */

static json_t *result_new(json_t *content, json_t *structured, bool is_error, unsigned features)
{
    json_t *r = json_pack("{s:o,s:b}", "content", content, "isError", is_error);
    if (structured && (features & VF_STRUCTURED))
        json_object_set(r, "structuredContent", structured);
    json_decref(structured);
    return r;
}

json_t *tool_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *msg;
    if (vasprintf(&msg, fmt, ap) < 0)
        msg = NULL;
    va_end(ap);
    size_t n;
    char *clean = utf8_sanitize(msg ? msg : "error", msg ? strlen(msg) : 5, &n);
    json_t *r = json_pack("{s:[{s:s,s:s%}],s:b}", "content", "type", "text", "text", clean, n,
                          "isError", 1);
    free(clean);
    free(msg);
    return r;
}

/* Puts what runcell has to say first in a result's content; note may be NULL. */
static json_t *with_note(json_t *result, const char *note)
{
    if (note) {
        _cleanup_free_ char *t = xasprintf("[runcell] note: %s", note);
        json_array_insert_new(json_object_get(result, "content"), 0, text_item(t));
    }
    return result;
}

static const char *arg_string(struct call *k, const char *name)
{
    return json_string_value(json_object_get(k->args, name));
}

/* "/workspace/a/b", "./a/b" and "a/b" all name a/b; anything outside is refused. */
static char *workspace_rel(const char *tool, const char *path, bool allow_root, char **ret_err)
{
    const char *p = path;
    if (!strcmp(p, "/workspace") || !strcmp(p, "/workspace/"))
        p = "";
    else if (str_has_prefix(p, "/workspace/"))
        p += strlen("/workspace/");
    while (str_has_prefix(p, "./"))
        p += 2;
    if (!strcmp(p, "."))
        p = "";
    _cleanup_free_ char *rel = xstrdup(p);
    size_t n = strlen(rel);
    while (n && rel[n - 1] == '/')
        rel[--n] = '\0';
    if (!*rel && allow_root)
        return TAKE_PTR(rel);
    if (!path_is_safe_relative(rel)) {
        *ret_err = xasprintf("%s: bad path '%s': name a file inside /workspace, as a relative "
                             "path without '..'",
                             tool, path);
        return NULL;
    }
    return TAKE_PTR(rel);
}

/* How long a call that may become a task (the client declared the tasks extension) runs
 * before it is answered with a task instead of its result. */
#define TASK_AFTER_MS 2000
/* How often a running call looks for new output (progress) and for its cancellation. */
#define EXEC_POLL_MS 250

static bool arg_timeout(struct call *k, uint64_t *ret_ms, json_t **ret_error)
{
    json_t *timeout = json_object_get(k->args, "timeout_s");
    *ret_ms = 0;
    if (!json_is_number(timeout))
        return true;
    double sec = json_number_value(timeout), max_ms = (double)k->c->cfg->max_timeout_ms;
    if (sec * 1000.0 > max_ms) {
        *ret_error = tool_error("%s: timeout_s %g is more than this server allows (%g s)",
                                k->tool->name, sec, max_ms / 1000.0);
        return false;
    }
    *ret_ms = MAX((uint64_t)(sec * 1000.0 + 0.5), 1);
    return true;
}

json_t *exec_tool_result(const struct mcp_config *cfg, const struct tool *t, unsigned features,
                         const char *sid, const char *note, const struct mcp_exec_poll *p)
{
    json_t *result;
    if (p->err || !p->rec) {
        result = tool_error("%s: %s", t->name, p->message ? p->message : "the execution failed");
    } else {
        json_t *j = exec_record_json(p->rec);
        result = result_new(record_content(j, features, sid), record_structured(j, sid),
                            p->rec->status != EXEC_OK, features);
        json_decref(j);
    }
    return with_note(result, note);
}

/* Feeds the output a poll saw to the call's progress notifications. */
static void forward_output(struct call *k, const struct mcp_exec_poll *p)
{
    for (size_t i = 0; i < p->n; i++)
        if (p->events[i].type == EV_STDOUT || p->events[i].type == EV_STDERR)
            call_output(k, p->events[i].data, p->events[i].len);
}

static json_t *run_exec(struct call *k, const char *code, const char *lang)
{
    struct mcp_conn *c = k->c;
    const struct mcp_exec_ops *ops = c->exec;
    uint64_t timeout_ms;
    json_t *refused;
    if (!arg_timeout(k, &timeout_ms, &refused))
        return refused;
    _cleanup_free_ char *sid = NULL, *note = NULL, *err = NULL;
    struct session *s = call_session(k, &sid, &note, &err);
    if (!s)
        return tool_error("%s: %s", k->tool->name, err);
    session_table_put(c->cfg->table, s); /* the execution finds it by its id */
    struct mcp_exec_start req = {.table = c->cfg->table,
                                 .session_id = sid,
                                 .code = code,
                                 .lang = lang,
                                 .timeout_ms = timeout_ms};
    struct mcp_exec *x;
    if (ops->start(&req, &x) < 0)
        return tool_error("%s: %s", k->tool->name, err_msg());
    double task_at = k->tasks ? now_ms_f() + TASK_AFTER_MS : 0;
    uint64_t deadline = c->cfg->reply_deadline_ms;
    double continue_at = !k->tasks && deadline ? now_ms_f() + (double)deadline : 0;
    bool cancel_sent = false;
    uint64_t seen = 0;
    struct mcp_exec_poll p;
    for (;;) {
        ops->poll(x, seen, EXEC_POLL_MS, &p);
        seen = p.next;
        forward_output(k, &p);
        if (p.done)
            break;
        mcp_exec_poll_release(&p);
        if (atomic_load(&k->cancelled) && !cancel_sent) {
            ops->cancel(x); /* interrupted, not killed: the session's state is kept */
            cancel_sent = true;
        }
        if (task_at && !cancel_sent && now_ms_f() >= task_at) {
            json_t *task = task_adopt(k, x, seen, sid, note);
            if (task)
                return task; /* the task owns x now */
            task_at = 0;     /* no room for a task: the call waits as before */
        }
        if (continue_at && !cancel_sent && now_ms_f() >= continue_at) {
            json_t *running = task_continue(k, x, seen, sid, note);
            if (running)
                return running; /* wait_for_cell takes it from here */
            continue_at = 0;
        }
    }
    json_t *result = exec_tool_result(c->cfg, k->tool, k->features, sid, note, &p);
    mcp_exec_poll_release(&p);
    ops->release(x);
    return result;
}

static json_t *t_run_code(struct call *k)
{
    return run_exec(k, arg_string(k, "code"), arg_string(k, "language"));
}

static json_t *t_wait_for_cell(struct call *k)
{
    uint64_t wait_ms;
    json_t *refused;
    if (!arg_timeout(k, &wait_ms, &refused))
        return refused;
    uint64_t most =
        k->c->cfg->reply_deadline_ms ? k->c->cfg->reply_deadline_ms : k->c->cfg->max_timeout_ms;
    if (!wait_ms || wait_ms > most)
        wait_ms = most;
    return task_wait(k, arg_string(k, "run_id"), wait_ms);
}

static json_t *t_run_shell(struct call *k)
{
    return run_exec(k, arg_string(k, "command"), "bash");
}

/* ---- sessions ---- */

static json_t *t_create_session(struct call *k)
{
    uint64_t timeout_ms;
    json_t *refused;
    if (!arg_timeout(k, &timeout_ms, &refused))
        return refused;
    _cleanup_free_ char *id = NULL;
    /* On the modern era the session is a handle of its own, not the connection's. */
    bool owned = !(k->features & VF_MODERN) && !k->c->shared;
    json_t *hv = json_object_get(k->args, "history");
    double history = json_is_number(hv) ? json_number_value(hv) : -1;
    if (history > SESSION_HISTORY_MAX) /* a whole number, 0 or more: checked */
        return tool_error("create_session: history is %g; a session can undo 0 to %d cells",
                          history, SESSION_HISTORY_MAX);
    if (conn_create_session(k->c, arg_string(k, "language"), timeout_ms, (int)history, owned, &id) <
        0)
        return tool_error("create_session: cannot create a session: %s", err_msg());
    int err;
    struct session *s = session_table_acquire(k->c->cfg->table, id, &err);
    if (!s)
        return tool_error("create_session: session %s was closed as it was created", id);
    const struct session_opts *o = session_options(s);
    json_t *st =
        json_pack("{s:s,s:s,s:s,s:f}", "session_id", id, "language", o->lang, "python_version",
                  session_python_version(s), "timeout_s", (double)o->timeout_ms / 1000.0);
    const char *pyv = session_python_version(s);
    _cleanup_free_ char *text =
        xasprintf("Created session %s (%s%s%s). Pass session_id \"%s\" to run_code and the file "
                  "tools to use it; close it with close_session when done.",
                  id, o->lang, *pyv ? "; Python " : "", pyv, id);
    session_table_put(k->c->cfg->table, s);
    return result_new(json_pack("[o]", text_item(text)), st, false, k->features);
}

static json_t *t_close_session(struct call *k)
{
    const char *id = arg_string(k, "session_id");
    if (conn_close_session(k->c, id) < 0)
        return tool_error("close_session: no session %s (it may have expired or been closed "
                          "already)",
                          id);
    _cleanup_free_ char *text = xasprintf("Closed session %s.", id);
    return result_new(json_pack("[o]", text_item(text)),
                      json_pack("{s:s,s:b}", "session_id", id, "closed", 1), false, k->features);
}

/* ---- undo ---- */

/* The undo report in a sentence: what came back and what did not. */
static char *undo_text(const char *sid, json_t *rep)
{
    struct buf b;
    buf_init(&b, 0);
    buf_printf(&b, "Session %s is back to its state before cell %lld: variables restored", sid,
               (long long)json_integer_value(json_object_get(rep, "before")));
    json_t *files = json_object_get(rep, "files");
    static const char *const lists[] = {"restored", "removed", "failed"};
    for (size_t i = 0; i < ARRAY_SIZE(lists); i++) {
        json_t *a = json_object_get(files, lists[i]);
        if (!json_array_size(a))
            continue;
        buf_printf(&b, "; files %s:", lists[i]);
        size_t j;
        json_t *v;
        json_array_foreach(a, j, v)
        {
            const char *path = json_is_string(v) ? json_string_value(v)
                                                 : json_string_value(json_object_get(v, "path"));
            buf_printf(&b, "%s %s", j ? "," : "", path ? path : "?");
        }
    }
    if (json_is_false(json_object_get(files, "kept")))
        buf_printf(&b, "; files not restored: %s",
                   json_string_value(json_object_get(files, "why")) ?: "not kept");
    if (json_object_get(rep, "shell"))
        buf_printf(&b, "; the shell was restarted");
    buf_printf(&b, ".");
    return buf_detach(&b, NULL);
}

static json_t *t_undo(struct call *k)
{
    json_t *bv = json_object_get(k->args, "before");
    double before = json_is_number(bv) ? json_number_value(bv) : 0; /* checked: a count */
    _cleanup_free_ char *err = NULL, *sid = NULL, *note = NULL;
    struct session *s = call_session(k, &sid, &note, &err);
    if (!s)
        return tool_error("undo: %s", err);
    json_t *rep = NULL;
    int r = session_undo(s, (long)before, &rep);
    session_table_put(k->c->cfg->table, s);
    if (r < 0)
        return with_note(tool_error("undo: session %s: %s", sid, err_msg()), note);
    _cleanup_free_ char *text = undo_text(sid, rep);
    json_object_set_new(rep, "session_id", json_string(sid));
    return with_note(result_new(json_pack("[o]", text_item(text)), rep, false, k->features), note);
}

/* ---- files ---- */

static bool in_dir(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    return !n || (!strncmp(path, dir, n) && path[n] == '/');
}

static json_t *list_result(struct call *k, const char *sid, const char *dir,
                           const struct session_file_list *l)
{
    json_t *files = json_array();
    struct buf text;
    size_t shown = 0, matched = 0;
    buf_init(&text, 0);
    for (size_t i = 0; i < l->n; i++) {
        const struct session_file *e = &l->v[i];
        if (e->type == SFILE_DIR || e->type == SFILE_OTHER || !in_dir(e->path, dir) ||
            matched++ >= LIST_MAX)
            continue;
        char mtime[32];
        size_t n;
        format_time_iso((uint64_t)(e->mtime_ns / 1000000), mtime);
        char *path = utf8_sanitize(e->path, strlen(e->path), &n);
        bool link = e->type == SFILE_LINK;
        json_array_append_new(files, json_pack("{s:s%,s:I,s:s,s:s}", "path", path, n, "size",
                                               (json_int_t)e->size, "mtime", mtime, "type",
                                               link ? "symlink" : "file"));
        buf_printf(&text, "%s  (%llu bytes%s)\n", path, (unsigned long long)e->size,
                   link ? ", symbolic link" : "");
        free(path);
        shown++;
    }
    bool truncated = matched > shown;
    _cleanup_free_ char *head =
        xasprintf("%zu file%s in /workspace%s%s%s\n", shown, shown == 1 ? "" : "s", *dir ? "/" : "",
                  dir, truncated ? " (more not listed)" : "");
    _cleanup_free_ char *all = xasprintf("%s%s", head, text.data ? text.data : "");
    buf_release(&text);
    json_t *st =
        json_pack("{s:s,s:o,s:b}", "session_id", sid, "files", files, "truncated", truncated);
    return result_new(json_pack("[o]", text_item(all)), st, false, k->features);
}

static json_t *t_list_files(struct call *k)
{
    const char *path = arg_string(k, "path");
    _cleanup_free_ char *err = NULL, *sid = NULL, *note = NULL;
    _cleanup_free_ char *dir = workspace_rel("list_files", path ? path : "", true, &err);
    if (!dir)
        return tool_error("%s", err);
    struct session *s = call_session(k, &sid, &note, &err);
    if (!s)
        return tool_error("list_files: %s", err);
    struct session_file_list l;
    int r = session_file_list(s, dir, SESSION_LIST_MAX_DEPTH, &l);
    session_table_put(k->c->cfg->table, s);
    if (r < 0)
        return with_note(tool_error("list_files: %s", err_msg()), note);
    json_t *result = list_result(k, sid, dir, &l);
    session_file_list_release(&l);
    return with_note(result, note);
}

/* Reads a regular workspace file of at most MCP_MAX_FILE bytes; -errno with *ret_err. */
static int read_workspace_file(struct session *s, const char *rel, struct buf *b, char **ret_err)
{
    struct stat st;
    _cleanup_close_ int fd = session_file_open(s, rel, &st);
    if (fd < 0) {
        *ret_err = xstrdup(err_msg());
        return fd;
    }
    if ((uint64_t)st.st_size > MCP_MAX_FILE) {
        *ret_err = xasprintf("'%s' has %llu bytes, more than the %u read_file returns; "
                             "process it with run_code instead",
                             rel, (unsigned long long)st.st_size, MCP_MAX_FILE);
        return -E2BIG;
    }
    buf_init(b, (size_t)st.st_size + 1);
    for (;;) {
        char chunk[65536];
        ssize_t n = read(fd, chunk, sizeof(chunk));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            *ret_err = xasprintf("cannot read '%s': %s", rel, strerror(e));
            return -e;
        }
        if (n == 0)
            return 0;
        if (b->len + (size_t)n > MCP_MAX_FILE) { /* it grew while it was read */
            *ret_err = xasprintf("'%s' grew past the %u bytes read_file returns; process it "
                                 "with run_code instead",
                                 rel, MCP_MAX_FILE);
            return -E2BIG;
        }
        buf_append(b, chunk, (size_t)n);
    }
}

/* file:///workspace/ and the path, percent-encoded where a URI needs it. */
static char *file_uri(const char *rel)
{
    struct buf b;
    buf_init(&b, 0);
    buf_printf(&b, "file:///workspace/");
    for (const unsigned char *p = (const unsigned char *)rel; *p; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            strchr("/-._~", *p))
            buf_append(&b, p, 1);
        else
            buf_printf(&b, "%%%02X", *p);
    }
    return buf_detach(&b, NULL);
}

static json_t *file_content(const char *rel, const struct buf *b, const char *mime)
{
    size_t n, b64_len;
    const char *data = b->data ? b->data : "";
    if (mime && str_has_prefix(mime, "image/")) {
        _cleanup_free_ char *b64 = base64_encode(data, b->len, &b64_len);
        return json_pack("{s:s,s:s%,s:s}", "type", "image", "data", b64, b64_len, "mimeType", mime);
    }
    _cleanup_free_ char *clean = utf8_sanitize(data, b->len, &n);
    if (n == b->len && !memcmp(clean, data, n))
        return json_pack("{s:s,s:s%}", "type", "text", "text", clean, n);
    _cleanup_free_ char *b64 = base64_encode(data, b->len, &b64_len);
    _cleanup_free_ char *uri = file_uri(rel);
    return json_pack("{s:s,s:{s:s,s:s,s:s%}}", "type", "resource", "resource", "uri", uri,
                     "mimeType", mime ? mime : "application/octet-stream", "blob", b64, b64_len);
}

static json_t *t_read_file(struct call *k)
{
    _cleanup_free_ char *err = NULL, *sid = NULL, *note = NULL;
    _cleanup_free_ char *rel = workspace_rel("read_file", arg_string(k, "path"), false, &err);
    if (!rel)
        return tool_error("%s", err);
    struct session *s = call_session(k, &sid, &note, &err);
    if (!s)
        return tool_error("read_file: %s", err);
    struct buf b = {0};
    int r = read_workspace_file(s, rel, &b, &err);
    session_table_put(k->c->cfg->table, s);
    if (r < 0) {
        buf_release(&b);
        return with_note(tool_error("read_file: %s", err), note);
    }
    const char *mime = mime_type_of(rel);
    json_t *item = file_content(rel, &b, mime);
    const char *type = json_string_value(json_object_get(item, "type"));
    if (!mime)
        mime = !strcmp(type, "text") ? "text/plain" : "application/octet-stream";
    json_t *st = json_pack("{s:s,s:s,s:I,s:s}", "session_id", sid, "path", rel, "size",
                           (json_int_t)b.len, "mime_type", mime);
    json_t *content = json_array();
    if (!strcmp(type, "image")) { /* a caption beside the picture, as for figures */
        json_t *data = json_object_get(item, "data");
        _cleanup_free_ char *caption =
            image_caption(rel, mime, json_string_value(data), json_string_length(data));
        json_array_append_new(content, text_item(caption));
    }
    json_array_append_new(content, item);
    buf_release(&b);
    return with_note(result_new(content, st, false, k->features), note);
}

static json_t *t_write_file(struct call *k)
{
    _cleanup_free_ char *err = NULL, *sid = NULL, *note = NULL;
    _cleanup_free_ char *rel = workspace_rel("write_file", arg_string(k, "path"), false, &err);
    if (!rel)
        return tool_error("%s", err);
    const char *content = arg_string(k, "content"), *enc = arg_string(k, "encoding");
    size_t n = strlen(content);
    _cleanup_free_ unsigned char *bytes = NULL;
    if (enc && !strcmp(enc, "base64")) {
        bytes = base64_decode(content, n, &n);
        if (!bytes)
            return tool_error("write_file: content is not valid base64");
    }
    if (n > MCP_MAX_FILE)
        return tool_error("write_file: %zu bytes is more than the %u a file may have here", n,
                          MCP_MAX_FILE);
    struct session *s = call_session(k, &sid, &note, &err);
    if (!s)
        return tool_error("write_file: %s", err);
    int r = session_file_write(s, rel, bytes ? (const char *)bytes : content, n);
    session_table_put(k->c->cfg->table, s);
    if (r < 0)
        return with_note(tool_error("write_file: %s", session_file_error(rel, r)), note);
    _cleanup_free_ char *text = xasprintf("Wrote %zu bytes to /workspace/%s.", n, rel);
    json_t *st = json_pack("{s:s,s:s,s:I}", "session_id", sid, "path", rel, "size", (json_int_t)n);
    return with_note(result_new(json_pack("[o]", text_item(text)), st, false, k->features), note);
}
