/* failmem.c - failure memory: signatures of failed executions (type, normalised message and
 * failing line) with counts per task, which tool fixed them, which cannot be fixed here, and
 * task history. Facts only: no earlier run's text goes back to a model. */
#include "agent/agent-int.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define MAX_QUOTED  200 /* longer "quoted" spans are left alone: they are prose, not names */
#define MAX_EXAMPLE 500

uint64_t fnv1a(const void *data, size_t n, uint64_t h)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static bool word_char(int c)
{
    return isalnum(c) || c == '_';
}

static bool path_start(const char *p)
{
    return *p == '/' || !strncmp(p, "./", 2) || !strncmp(p, "../", 3) || !strncmp(p, "~/", 2);
}

static size_t token_len(const char *p)
{
    return strcspn(p, " \t\r\n'\",;:()[]{}<>");
}

char *failmem_normalise(const char *text)
{
    struct buf b;
    buf_init(&b, 0);
    const char *p = text ? text : "";
    bool space = false;
    while (*p) {
        unsigned char c = (unsigned char)*p;
        bool at_word_start = p == text || !word_char((unsigned char)p[-1]);
        if (isspace(c)) {
            space = b.len > 0;
            p++;
            continue;
        }
        if (space)
            buf_append(&b, " ", 1);
        space = false;
        const char *close = (c == '\'' || c == '"') ? strchr(p + 1, c) : NULL;
        if (close && close - p <= MAX_QUOTED && !memchr(p + 1, '\n', (size_t)(close - p - 1))) {
            buf_printf(&b, "%c<name>%c", c, c);
            p = close + 1;
        } else if (at_word_start && path_start(p)) {
            buf_append(&b, "<path>", 6);
            p += token_len(p);
        } else if (isdigit(c) &&
                   (p == text || (!word_char((unsigned char)p[-1]) && p[-1] != '.'))) {
            buf_append(&b, "<n>", 3);
            while (word_char((unsigned char)*p) || (*p == '.' && isdigit((unsigned char)p[1])))
                p++;
        } else {
            buf_append(&b, p, 1);
            p++;
        }
    }
    return buf_detach(&b, NULL);
}

/* ---- failures from records ---- */

/* The source line of the failing frame: the last frame of the user's code (a cell, or the
 * weak-mode program) when there is one, else the last frame. */
static char *failing_line(const char *tb)
{
    const char *best = NULL, *last = NULL;
    for (const char *p = tb; p && *p;) {
        const char *nl = strchr(p, '\n');
        if (!strncmp(p, "  File \"", 8)) {
            const char *code = nl ? nl + 1 : NULL;
            if (code && !strncmp(code, "    ", 4)) {
                last = code;
                if (!strncmp(p + 8, "<cell", 5) || !strncmp(p + 8, "<weak", 5) ||
                    !strncmp(p + 8, "<string>", 8))
                    best = code;
            }
        }
        p = nl ? nl + 1 : NULL;
    }
    const char *line = best ? best : last;
    if (!line)
        return xstrdup("");
    size_t n = strcspn(line, "\n");
    _cleanup_free_ char *raw = xstrndup(line, n);
    return failmem_normalise(raw);
}

static char *last_line(const struct outcap *c)
{
    size_t n;
    _cleanup_free_ char *text = outcap_render(c, &n);
    char *end = text + n;
    while (end > text && isspace((unsigned char)end[-1]))
        end--;
    *end = '\0';
    char *start = strrchr(text, '\n');
    return xstrdup(start ? start + 1 : text);
}

bool failure_from_record(const struct exec_record *rec, struct failure *ret)
{
    struct failure f = {0};
    if (rec->status == EXEC_OK)
        return false;
    const char *name = json_string_value(json_object_get(rec->error, "name"));
    const char *value = json_string_value(json_object_get(rec->error, "value"));
    const char *tb = json_string_value(json_object_get(rec->error, "traceback"));
    if (name && !strcmp(name, "ShellError")) {
        /* A command's own last words say more than its exit status. */
        f.raw = last_line(&rec->err);
        if (!*f.raw) {
            free(f.raw);
            f.raw = xstrdup(value ? value : "");
        }
    } else if (name) {
        f.raw = xstrdup(value ? value : "");
    } else {
        name = exec_status_name(rec->status);
        f.raw = xstrdup(rec->message ? rec->message : "");
    }
    f.type = xstrdup(name);
    f.message = failmem_normalise(f.raw);
    f.line = failing_line(tb);
    uint64_t h = fnv1a(f.type, strlen(f.type) + 1, FNV_OFFSET);
    h = fnv1a(f.message, strlen(f.message) + 1, h);
    h = fnv1a(f.line, strlen(f.line), h);
    snprintf(f.sig, sizeof(f.sig), "%016llx", (unsigned long long)h);
    *ret = f;
    return true;
}

void failure_release(struct failure *f)
{
    free(f->type);
    free(f->message);
    free(f->line);
    free(f->raw);
    memset(f, 0, sizeof(*f));
}

void failmem_known_release(struct failmem_known *k)
{
    free(k->note);
    memset(k, 0, sizeof(*k));
}

/* ---- what cannot be fixed here (in a sandbox whose network policy is none) ---- */

static const struct {
    const char *module;
    const char *instead;
} alternatives[] = {
    {"requests", "there is no network anyway; read the data from files in the workspace"},
    {"httpx", "there is no network anyway; read the data from files in the workspace"},
    {"scipy", "numpy covers much of it (numpy.linalg, numpy.fft, numpy.polyfit)"},
    {"sklearn", "fit simple models with numpy (numpy.linalg.lstsq, numpy.polyfit)"},
    {"seaborn", "matplotlib draws the same charts"},
    {"plotly", "matplotlib draws the chart; save it with plt.savefig"},
    {"polars", "pandas"},
    {"pyarrow", "pandas with CSV or Excel (openpyxl) files"},
    {"bs4", "html.parser from the standard library"},
    {"lxml", "xml.etree.ElementTree or html.parser from the standard library"},
    {"yaml", "json or configparser from the standard library"},
    {"tabulate", "pandas' DataFrame.to_string() or to_markdown-free formatting by hand"},
    {"xlrd", "openpyxl reads .xlsx files (pandas.read_excel(..., engine='openpyxl'))"},
    {"dateutil", "datetime from the standard library, or pandas.to_datetime"},
};

/* The module named in "No module named 'a.b'" (top level), or NULL. */
static char *missing_module(const char *raw)
{
    const char *p = strstr(raw, "No module named");
    if (p)
        p += strlen("No module named");
    else if (str_has_prefix(raw, "weak mode: "))
        p = raw + strlen("weak mode: ");
    else
        return NULL;
    p += strspn(p, " '\"");
    size_t n = strcspn(p, ".'\" \n");
    return n ? xstrndup(p, n) : NULL;
}

static char *module_note(const char *module, const char *packages)
{
    if (!packages)
        return xasprintf("weak mode admits only the Python standard library, so '%s' cannot "
                         "be imported. Use the standard library instead (csv, json, statistics, "
                         "math, re, datetime, collections, sqlite3, ...).",
                         module);
    const char *instead = NULL;
    for (size_t i = 0; i < ARRAY_SIZE(alternatives) && !instead; i++)
        if (!strcmp(alternatives[i].module, module))
            instead = alternatives[i].instead;
    return xasprintf("'%s' is not installed in this sandbox and cannot be installed: the "
                     "network policy is none, so pip cannot download anything. %s%s%sUse the "
                     "standard library or the installed packages: %s.",
                     module, instead ? "Instead: " : "", instead ? instead : "",
                     instead ? ". " : "", packages && *packages ? packages : "(none found)");
}

static const char *const network_words[] = {
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "No address associated with hostname",
    "nodename nor servname provided",
    "Failed to establish a new connection",
};

static bool network_failure(const struct failure *f, const char *stderr_text)
{
    static const char *const types[] = {"gaierror",           "URLError",      "ConnectionError",
                                        "NewConnectionError", "MaxRetryError", "ConnectTimeout"};
    for (size_t i = 0; i < ARRAY_SIZE(types); i++)
        if (!strcmp(f->type, types[i]))
            return true;
    for (size_t i = 0; i < ARRAY_SIZE(network_words); i++)
        if (strstr(f->raw, network_words[i]) ||
            (stderr_text && strstr(stderr_text, network_words[i])))
            return true;
    return false;
}

/* A note saying why f cannot be fixed here and what works instead, or NULL. */
static char *unfixable_note(const struct failure *f, const char *stderr_text, const char *packages,
                            bool networked)
{
    bool weak = str_has_prefix(f->raw, "weak mode: ");
    if (networked && !weak)
        return NULL;
    if (!strcmp(f->type, "ModuleNotFoundError") || !strcmp(f->type, "ImportError")) {
        _cleanup_free_ char *module = missing_module(f->raw);
        if (module)
            return module_note(module, weak ? NULL : packages);
    }
    if (network_failure(f, stderr_text))
        return xstrdup("the sandbox has no network (policy none): only loopback works, so "
                       "downloads, web APIs and pip install fail, however the call is made. "
                       "Work with the files in the workspace, or tell the user which data to "
                       "pass in with --file.");
    return NULL;
}

/* ---- the database side ---- */

/* The tools a fix is told by: a name from this table, never the model's own text. */
static const char *const fix_tools[] = {"run_python", "run_shell"};

static const char *fix_tool(const char *name)
{
    for (size_t i = 0; name && i < ARRAY_SIZE(fix_tools); i++)
        if (!strcmp(name, fix_tools[i]))
            return fix_tools[i];
    return NULL;
}

static int lookup(sqlite3 *db, const char *env, const char *scope, const struct failure *f,
                  struct failmem_known *k)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db,
                           "SELECT count, fixed, fixed_by FROM failure_facts "
                           "WHERE sig = ? AND env = ? AND scope = ?",
                           -1, &st, NULL) != SQLITE_OK)
        return db_fail(db, "cannot read the failure memory");
    sqlite3_bind_text(st, 1, f->sig, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, env, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, scope, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW) {
        k->seen = sqlite3_column_int64(st, 0);
        k->fixed = sqlite3_column_int64(st, 1);
        k->fixed_by = fix_tool((const char *)sqlite3_column_text(st, 2));
    }
    sqlite3_finalize(st);
    return 0;
}

static int upsert(sqlite3 *db, const char *env, const char *scope, const struct failure *f,
                  const struct failmem_known *k)
{
    char now[32];
    sqlite3_stmt *st;
    db_now(now);
    if (sqlite3_prepare_v2(
            db,
            "INSERT INTO failure_facts (sig, env, scope, type, message, line, example, count, "
            "unfixable, first_seen, last_seen) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 1, ?8, ?9, "
            "?9) ON CONFLICT (sig, env, scope) DO UPDATE SET count = count + 1, "
            "last_seen = ?9, unfixable = MAX(unfixable, ?8)",
            -1, &st, NULL) != SQLITE_OK)
        return db_fail(db, "cannot write the failure memory");
    /* The example is for the operator's `runcell review failures`, never for a model. */
    _cleanup_free_ char *example = xstrndup(f->raw, MAX_EXAMPLE);
    sqlite3_bind_text(st, 1, f->sig, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, env, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, scope, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, f->type, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, f->message, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 6, f->line, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 7, example, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 8, k->unfixable);
    sqlite3_bind_text(st, 9, now, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_fail(db, "cannot write the failure memory");
    sqlite3_finalize(st);
    return rc;
}

int failmem_note(const char *data_dir, const char *env, const char *scope, const struct failure *f,
                 const char *stderr_text, const char *packages, bool networked,
                 struct failmem_known *ret)
{
    struct failmem_known k = {0};
    /* Whether it can be fixed is decided from this failure alone: an earlier run's verdict
     * (which its own output could sway) does not skip this run's retries. */
    k.note = unfixable_note(f, stderr_text, packages, networked);
    k.unfixable = k.note != NULL;
    int rc = 0;
    if (data_dir) {
        sqlite3 *db;
        rc = agent_db_open(data_dir, &db);
        if (rc == 0) {
            rc = lookup(db, env, scope, f, &k);
            if (rc == 0)
                rc = upsert(db, env, scope, f, &k);
            agent_db_close(db);
        }
    }
    *ret = k;
    return rc;
}

int failmem_fixed(const char *data_dir, const char *env, const char *scope, const char *sig,
                  const char *tool)
{
    static const char what[] = "cannot write the failure memory";
    sqlite3 *db;
    sqlite3_stmt *st;
    int rc = db_prepare(data_dir,
                        "UPDATE failure_facts SET fixed = fixed + 1, fixed_by = ? "
                        "WHERE sig = ? AND env = ? AND scope = ?",
                        what, &db, &st);
    if (rc < 0)
        return rc;
    db_bind_texts(st, 4, fix_tool(tool), sig, env, scope);
    return db_write(db, st, what);
}

int failmem_top(const char *data_dir, size_t limit, json_t **ret)
{
    sqlite3 *db;
    sqlite3_stmt *st;
    int rc = db_prepare(data_dir,
                        "SELECT sig, type, message, line, example, env, scope, count, "
                        "unfixable, fixed, fixed_by, first_seen, last_seen FROM failure_facts "
                        "ORDER BY count DESC, last_seen DESC LIMIT ?",
                        "cannot read the failure memory", &db, &st);
    if (rc < 0)
        return rc;
    sqlite3_bind_int64(st, 1, (sqlite3_int64)(limit ? limit : 20));
    json_t *arr = json_array();
    static const char *const cols[] = {"signature", "type", "message", "line",
                                       "example",   "env",  "scope"};
    while (sqlite3_step(st) == SQLITE_ROW) {
        json_t *o = json_object();
        for (int i = 0; i < (int)ARRAY_SIZE(cols); i++)
            json_object_set_new(o, cols[i],
                                json_string((const char *)sqlite3_column_text(st, i) ?: ""));
        json_object_set_new(o, "count", json_integer(sqlite3_column_int64(st, 7)));
        json_object_set_new(o, "unfixable", json_boolean(sqlite3_column_int(st, 8)));
        json_object_set_new(o, "fixed", json_integer(sqlite3_column_int64(st, 9)));
        const char *by = fix_tool((const char *)sqlite3_column_text(st, 10));
        json_object_set_new(o, "fixed_by", by ? json_string(by) : json_null());
        json_object_set_new(o, "first_seen",
                            json_string((const char *)sqlite3_column_text(st, 11)));
        json_object_set_new(o, "last_seen", json_string((const char *)sqlite3_column_text(st, 12)));
        json_array_append_new(arr, o);
    }
    db_done(db, st);
    *ret = arr;
    return 0;
}

/* ---- tasks ---- */

static uint64_t hash_file(const char *path, uint64_t h)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
    char chunk[65536];
    ssize_t n;
    if (fd < 0)
        return fnv1a("?", 1, h);
    while ((n = read(fd, chunk, sizeof(chunk))) > 0)
        h = fnv1a(chunk, (size_t)n, h);
    return h;
}

char *task_fingerprint(const char *task, const struct agent_file *files, size_t n_files)
{
    /* Case and spacing do not make another task. */
    struct buf folded;
    buf_init(&folded, 0);
    for (const char *p = task; *p;) {
        size_t w = strspn(p, " \t\r\n");
        if (w) {
            if (folded.len && p[w])
                buf_append(&folded, " ", 1);
            p += w;
            continue;
        }
        char c = (char)tolower((unsigned char)*p++);
        buf_append(&folded, &c, 1);
    }
    uint64_t h = fnv1a(folded.data ? folded.data : "", folded.len, FNV_OFFSET);
    buf_release(&folded);
    for (size_t i = 0; i < n_files; i++) {
        h = fnv1a(files[i].dest, strlen(files[i].dest) + 1, h);
        h = hash_file(files[i].host_path, h);
    }
    return xasprintf("%016llx", (unsigned long long)h);
}

void task_history_release(struct task_history *h)
{
    free(h->last_reason);
    free(h->last_code);
    free(h->last_error);
    free(h->last_seen);
    memset(h, 0, sizeof(*h));
}

int task_history_get(const char *data_dir, const char *env, const char *fp,
                     struct task_history *ret)
{
    sqlite3 *db;
    sqlite3_stmt *st;
    struct task_history h = {0};
    int rc = db_prepare(data_dir,
                        "SELECT runs, exhausted, last_exhausted, last_reason, "
                        "last_code, last_error, last_seen FROM tasks WHERE fp = ? AND env = ?",
                        "cannot read the task history", &db, &st);
    if (rc < 0)
        return rc;
    db_bind_texts(st, 2, fp, env);
    if (sqlite3_step(st) == SQLITE_ROW) {
        h.runs = sqlite3_column_int64(st, 0);
        h.exhausted = sqlite3_column_int64(st, 1);
        h.doomed = sqlite3_column_int(st, 2) != 0;
        h.last_reason = db_text(st, 3);
        h.last_code = db_text(st, 4);
        h.last_error = db_text(st, 5);
        h.last_seen = db_text(st, 6);
    }
    db_done(db, st);
    *ret = h;
    return 0;
}

int task_history_put(const char *data_dir, const char *env, const char *fp, const char *reason,
                     bool exhausted, const char *last_code, const char *last_error)
{
    static const char what[] = "cannot write the task history";
    sqlite3 *db;
    sqlite3_stmt *st;
    char now[32];
    int rc = db_prepare(
        data_dir,
        "INSERT INTO tasks (fp, env, runs, exhausted, last_reason, last_exhausted, last_code, "
        "last_error, last_seen) VALUES (?1, ?2, 1, ?7, ?3, ?7, ?4, ?5, ?6) "
        "ON CONFLICT (fp, env) DO UPDATE SET runs = runs + 1, exhausted = exhausted + ?7, "
        "last_reason = ?3, last_exhausted = ?7, last_code = COALESCE(?4, last_code), "
        "last_error = COALESCE(?5, last_error), last_seen = ?6",
        what, &db, &st);
    if (rc < 0)
        return rc;
    db_now(now);
    db_bind_texts(st, 6, fp, env, reason, last_code, last_error, now);
    sqlite3_bind_int(st, 7, exhausted);
    return db_write(db, st, what);
}
