/* prompt.c - what the model is told: the truth about its sandbox (Python, packages, files,
 * limits, network), the tools it has, and weak mode when the run switches to it. */
#include "agent/agent-int.h"

#include <dirent.h>
#include <glob.h>
#include <sys/stat.h>
#include <stdio.h>
#include <string.h>

#define MAX_PACKAGES_TEXT 2500
#define MAX_PROMPT_FILES  50

/* The data stack comes first in the list the model reads. */
static const char *const featured[] = {"numpy", "pandas", "matplotlib", "openpyxl",
                                       "scipy", "pillow", "Pillow"};

/* Compares the names of "name version" entries. */
static int name_cmp(const char *a, const char *b)
{
    size_t na = strcspn(a, " "), nb = strcspn(b, " ");
    int c = strncasecmp(a, b, MIN(na, nb));
    return c ? c : (int)na - (int)nb;
}

static int featured_rank(const char *entry)
{
    for (size_t i = 0; i < ARRAY_SIZE(featured); i++)
        if (!name_cmp(entry, featured[i]))
            return (int)i;
    return (int)ARRAY_SIZE(featured);
}

static int cmp_pkg(const void *a, const void *b)
{
    const char *x = *(const char *const *)a, *y = *(const char *const *)b;
    int rx = featured_rank(x), ry = featured_rank(y);
    int c = rx != ry ? rx - ry : name_cmp(x, y);
    /* The same name twice (a .dist-info beside an .egg-info): the one with a version first. */
    return c ? c : (int)strlen(y) - (int)strlen(x);
}

/* "name version" from "name-version.dist-info" or "name-version-py3.11.egg-info". */
static char *package_of(const char *entry)
{
    const char *suffix = strstr(entry, ".dist-info");
    if (!suffix)
        suffix = strstr(entry, ".egg-info");
    if (!suffix)
        return NULL;
    _cleanup_free_ char *stem = xstrndup(entry, (size_t)(suffix - entry));
    char *dash = strchr(stem, '-');
    if (!dash)
        return xstrdup(stem);
    *dash = '\0';
    char *version = dash + 1;
    version[strcspn(version, "-")] = '\0';
    return xasprintf("%s %s", stem, version);
}

/* The Python distributions the sandbox sees: /usr is bound read-only from this host. */
static char **list_packages(void)
{
    static const char *const dirs[] = {"/usr/lib/python3/dist-packages",
                                       "/usr/local/lib/python3*/dist-packages"};
    char **names = xcalloc(1, sizeof(char *));
    for (size_t i = 0; i < ARRAY_SIZE(dirs); i++) {
        glob_t g;
        if (glob(dirs[i], 0, NULL, &g) != 0)
            continue;
        for (size_t j = 0; j < g.gl_pathc; j++) {
            DIR *d = opendir(g.gl_pathv[j]);
            struct dirent *e;
            while (d && (e = readdir(d))) {
                char *p = package_of(e->d_name);
                if (p)
                    names = strv_push(names, p);
                free(p);
            }
            if (d)
                closedir(d);
        }
        globfree(&g);
    }
    size_t n = strv_len(names), kept = 0;
    qsort(names, n, sizeof(char *), cmp_pkg);
    for (size_t i = 0; i < n; i++) {
        if (kept && !name_cmp(names[kept - 1], names[i]))
            free(names[i]);
        else
            names[kept++] = names[i];
    }
    names[kept] = NULL;
    return names;
}

static char *host_python_version(void)
{
    glob_t g;
    char *v = NULL;
    /* The stdlib directory names the version when no session told us. */
    if (glob("/usr/lib/python3.*/os.py", 0, NULL, &g) == 0 && g.gl_pathc) {
        const char *p = g.gl_pathv[g.gl_pathc - 1] + strlen("/usr/lib/python");
        v = xstrndup(p, strcspn(p, "/"));
    }
    globfree(&g);
    return v ? v : xstrdup("3");
}

/* The session's network as the model is told it (NULL members for none) and its part of the
 * memory's key: what fails under one network may work under another. */
static void describe_network(struct agent_env *e, struct session *s, struct buf *key)
{
    json_t *net = s ? session_network_json(s) : NULL;
    const char *mode = json_string_value(json_object_get(net, "mode"));
    struct buf b, k;
    buf_init(&b, 0);
    buf_init(&k, 0);
    size_t i;
    json_t *item;
    uint64_t h = FNV_OFFSET;
    json_array_foreach(json_object_get(net, "allow"), i, item)
    {
        const char *entry = json_string_value(item);
        buf_printf(&b, "%s%s", i ? ", " : "", entry);
        h = fnv1a(entry, strlen(entry) + 1, h);
    }
    json_array_foreach(json_object_get(net, "secrets"), i, item)
    {
        buf_printf(&k, "%s%s", k.len ? ", " : "", json_string_value(json_object_get(item, "host")));
    }
    if (mode && !strcmp(mode, "internet")) {
        buf_release(&b);
        e->hosts = xstrdup("the public internet");
        buf_printf(key, " net=internet");
    } else if (mode && !strcmp(mode, "allowlist")) {
        e->hosts = buf_detach(&b, NULL);
        buf_printf(key, " net=allow-%016llx", (unsigned long long)h);
    } else {
        buf_release(&b);
        buf_printf(key, " net=none");
    }
    e->keyed = k.len ? buf_detach(&k, NULL) : NULL;
    if (!e->keyed)
        buf_release(&k);
    json_decref(net);
}

void agent_env_init(struct agent_env *e, struct session *s)
{
    memset(e, 0, sizeof(*e));
    const char *pv = s ? session_python_version(s) : "";
    e->python_version = *pv ? xstrdup(pv) : host_python_version();
    _cleanup_strv_ char **pkgs = list_packages();
    struct buf b, key;
    buf_init(&b, 0);
    size_t n = strv_len(pkgs), shown = 0;
    for (; shown < n && b.len < MAX_PACKAGES_TEXT; shown++)
        buf_printf(&b, "%s%s", shown ? ", " : "", pkgs[shown]);
    if (shown < n)
        buf_printf(&b, " and %zu more (pip list shows them)", n - shown);
    e->packages = buf_detach(&b, NULL);
    uint64_t h = FNV_OFFSET;
    for (size_t i = 0; i < n; i++)
        h = fnv1a(pkgs[i], strlen(pkgs[i]) + 1, h);
    buf_init(&key, 0);
    buf_printf(&key, "python=%s", e->python_version);
    describe_network(e, s, &key);
    buf_printf(&key, " packages=%016llx", (unsigned long long)h);
    e->key = buf_detach(&key, NULL);
}

void agent_env_release(struct agent_env *e)
{
    free(e->python_version);
    free(e->packages);
    free(e->key);
    free(e->hosts);
    free(e->keyed);
    memset(e, 0, sizeof(*e));
}

static void describe_files(struct buf *b, struct workspace *ws, const struct agent_options *o)
{
    struct ws_listing l = {0};
    size_t shown = 0;
    if (ws && workspace_scan(ws, &l) == 0) {
        for (size_t i = 0; i < l.n && shown < MAX_PROMPT_FILES; i++) {
            if (S_ISDIR(l.v[i].mode))
                continue;
            buf_printf(b, "%s%s (%llu bytes)", shown ? ", " : "", l.v[i].path,
                       (unsigned long long)l.v[i].size);
            shown++;
        }
        if (l.n > shown && shown == MAX_PROMPT_FILES)
            buf_printf(b, " and more (list them with run_shell)");
        ws_listing_release(&l);
    } else {
        for (size_t i = 0; i < o->n_files && shown < MAX_PROMPT_FILES; i++, shown++)
            buf_printf(b, "%s%s", shown ? ", " : "", o->files[i].dest);
    }
    if (!shown)
        buf_printf(b, "none");
}

static void describe_limits(struct buf *b, const struct agent_options *o)
{
    struct session_opts so = o->session_opts ? *o->session_opts : (struct session_opts){0};
    session_opts_fill_defaults(&so);
    buf_printf(b,
               "- Limits: %.3g s per execution, %llu MB of memory, %llu MB of disk in the "
               "workspace, %.3g CPU core(s), %llu processes.\n",
               (double)so.timeout_ms / 1000.0, (unsigned long long)so.limits.memory_mb,
               (unsigned long long)so.limits.disk_mb, (double)so.limits.cpus_milli / 1000.0,
               (unsigned long long)so.limits.pids);
    buf_printf(b,
               "- Budget: at most %u steps (replies of yours); the attempt ends after %u "
               "failed executions in a row, or when the same error comes twice in a row.",
               o->max_steps, o->max_retries);
    if (o->max_time_ms)
        buf_printf(b, " The whole task has %.3g s.", (double)o->max_time_ms / 1000.0);
    buf_printf(b, "\n");
}

static void describe_network_prompt(struct buf *b, const struct agent_env *e,
                                    const struct agent_options *o, bool weak)
{
    if (weak || !e->hosts) {
        buf_printf(b, "- Network: none. No internet access (loopback only): downloads, web "
                      "APIs and pip install cannot work.\n");
        return;
    }
    buf_printf(b,
               "- Network: only %s%s can be reached, over HTTP(S) through runcell's proxy "
               "(HTTP_PROXY and HTTPS_PROXY are set; Python's urllib, requests and pip use "
               "them by themselves). Any other host is refused.\n",
               strcmp(e->hosts, "the public internet") ? "these hosts: " : "", e->hosts);
    if (e->keyed)
        buf_printf(b,
                   "- Credentials for %s are added to your requests by the proxy, outside the "
                   "sandbox: send those requests without any key or token. There is no key "
                   "in the sandbox (its files and environment hold none): do not look for "
                   "one, and never print or ask for one.\n",
                   e->keyed);
    if (o->model_access)
        buf_printf(b, "- Your code can call the model you are talking to: POST "
                      "$OPENAI_BASE_URL/chat/completions with \"model\": $RUNCELL_MODEL (both are "
                      "environment variables) and an OpenAI-style messages list, using urllib; "
                      "the key is added by the proxy (OPENAI_API_KEY holds only a placeholder). "
                      "Use it only where the task needs the model's answers from code.\n");
}

char *agent_system_prompt(const struct agent_env *e, const struct agent_options *o,
                          struct workspace *ws, bool weak)
{
    struct buf b;
    buf_init(&b, 0);
    buf_printf(&b, "You solve the user's task by writing and running code in a sandbox, then "
                   "answering. Everything below about the sandbox is true; assume nothing more.\n\n"
                   "Environment:\n");
    if (weak) {
        buf_printf(&b,
                   "- WEAK MODE: Python %s standard library only. Every run_python call "
                   "runs in a fresh process: nothing is kept between calls (re-create "
                   "variables, re-read files). Imports outside the standard library are "
                   "refused. There is no run_shell. Print what you need to see.\n",
                   e->python_version);
    } else {
        buf_printf(&b,
                   "- Python %s (/usr/bin/python3) in a stateful session: variables, "
                   "imports and files persist between run_python calls.\n"
                   "- Installed Python packages: %s.\n",
                   e->python_version, e->packages);
    }
    buf_printf(&b, "- Working directory: /workspace. Files there now: ");
    describe_files(&b, weak ? NULL : ws, o);
    buf_printf(&b, ".\n");
    describe_network_prompt(&b, e, o, weak);
    describe_limits(&b, o);
    buf_printf(&b,
               "\nTools:\n- run_python(code): runs Python code%s; the value of the last "
               "expression is shown%s.\n",
               weak ? " in a fresh process" : " in the session",
               weak ? " only when printed"
                    : "; figures (plt.show() or left open) are saved as "
                      "PNG files in the workspace");
    if (!weak)
        buf_printf(&b, "- run_shell(command): runs a bash command in /workspace.\n");
    buf_printf(&b,
               "Each call returns the output (long output is cut to its head and tail), "
               "the result, and the error with a trimmed traceback.\n\n"
               "When the task is done, answer in plain text without calling a tool: say what "
               "you found and name the files you produced. If it cannot be done here, say why.");
    return buf_detach(&b, NULL);
}

char *agent_weak_notice(const char *why)
{
    return xasprintf("[runcell] The stateful sandbox cannot serve (%s). Switched to WEAK MODE: "
                     "each run_python call now runs in a fresh process with only the Python "
                     "standard library (third-party imports such as numpy, pandas or "
                     "matplotlib are refused); nothing is kept between calls, so re-create "
                     "variables and re-read files each time; input files are there at the "
                     "start of every run; run_shell is not available. Print what you need.",
                     why);
}

static json_t *tool_def(const char *name, const char *desc, const char *arg, const char *arg_desc)
{
    return json_pack("{s:s,s:{s:s,s:s,s:{s:s,s:{s:{s:s,s:s}},s:[s]}}}", "type", "function",
                     "function", "name", name, "description", desc, "parameters", "type", "object",
                     "properties", arg, "type", "string", "description", arg_desc, "required", arg);
}

json_t *agent_tools(bool weak)
{
    json_t *tools = json_array();
    json_array_append_new(
        tools, tool_def("run_python",
                        weak ? "Run Python code (standard library only) in a fresh process; "
                               "print what you need to see."
                             : "Run Python code in the stateful session; returns output, the "
                               "last expression's value and any error.",
                        "code", "Python source code"));
    if (!weak)
        json_array_append_new(tools, tool_def("run_shell",
                                              "Run a bash command in the workspace (/workspace).",
                                              "command", "bash command line"));
    return tools;
}
