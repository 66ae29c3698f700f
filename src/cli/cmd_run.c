/* cmd_run.c - `runcell run`: one fresh sandbox, stateless; exits with the code's status. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "session/session.h"
#ifndef RUNCELL_FRONT
#include "store/store.h"
#endif

#define MAX_STDIN_CODE (16u << 20)

struct run_opts {
    struct common_opts c;
    const char *lang;
    char **codes; /* each -c */
    const char *file;
    bool from_stdin;
    char **args;
    bool json;
    bool keep_going;
};

static const char run_usage[] =
    "usage: runcell run [OPTIONS] (FILE | -c CODE [-c CODE...] | -) [ARGS...]\n"
    "\n"
    "Runs code in a fresh, locked-down sandbox and exits with its status\n"
    "(FILE and - run as a script; each -c runs as a cell of one Python session,\n"
    "and the value of a cell's last expression is printed; sys.argv is as python3\n"
    "gives it: [FILE's name | '-' | '-c', ARGS...])\n"
    "(124 timeout, 128+N signal, 137 out of memory, 125 sandbox failure, 2 usage).\n"
    "\n";

static int set_lang(void *opts, const char *cmd, char *val)
{
    if (!lang_supported(val))
        return usage_error(cmd, "--lang: unknown language '%s': use python, bash or javascript",
                           val);
    ((struct run_opts *)opts)->lang = lang_name(val);
    return 0;
}

#define F(member) offsetof(struct run_opts, member)

static const struct opt_spec run_specs[] = {
    {"lang", "python|bash|javascript", OPTK_FN, .fn = set_lang,
     .help = "language (default python: Debian's /usr/bin/python3;\n"
             "javascript: /usr/bin/node, js and node are aliases)"},
    {NULL, "CODE", OPTK_STRV, F(codes), .help = "code to run (repeatable)", .letter = 'c'},
    {"json", NULL, OPTK_FLAG, F(json),
     .help = "print the result record as JSON instead of the streams"},
    {"keep-going", NULL, OPTK_FLAG, F(keep_going),
     .help = "with several -c, run the cells after a failed one too"},
};

static const struct opt_cmd run_cmd = {
    .name = "run",
    .usage = run_usage,
    .own = OPT_TABLE(run_specs),
    .groups = {{&common_opt_table, F(c), .listed = true}},
    .args = OPTA_AFTER, /* FILE's or -'s ARGS are the code's, options or not */
    .column = 23,
};

static int parse_args(struct run_opts *o, int argc, char **argv)
{
    int first, r = opttab_parse(&run_cmd, argc, argv, o, &first);
    if (r)
        return r;
    if (!o->codes && first >= argc)
        return usage_error("run", "nothing to run: give FILE, -c CODE or - (stdin)");
    if (!o->codes) {
        const char *what = argv[first++];
        if (!strcmp(what, "-"))
            o->from_stdin = true;
        else
            o->file = what;
    }
    for (; first < argc; first++)
        o->args = strv_push(o->args, argv[first]);
    return 0;
}

/* Scripts and stdin code must be text: a NUL byte means a binary was passed by mistake. */
static int check_text(const char *what, const char *data, size_t n)
{
    if (memchr(data, '\0', n))
        return usage_error("run", "%s is not text (it contains a NUL byte)", what);
    return 0;
}

static int check_script(const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return usage_error("run", "cannot read %s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return usage_error("run", "%s is not a regular file", path);
    char *data;
    size_t n;
    int r = read_file(path, 64u << 20, &data, &n);
    if (r < 0)
        return usage_error("run", "cannot read %s: %s", path, strerror(-r));
    r = check_text(path, data, n);
    free(data);
    return r;
}

static int read_stdin_code(char **ret)
{
    struct buf b;
    buf_init(&b, MAX_STDIN_CODE);
    int r = read_all(STDIN_FILENO, &b);
    if (r == -E2BIG) {
        buf_release(&b);
        return usage_error("run", "code on stdin is larger than %u MiB", MAX_STDIN_CODE >> 20);
    }
    if (r < 0) {
        buf_release(&b);
        return usage_error("run", "cannot read code from stdin: %s", strerror(-r));
    }
    size_t n;
    char *code = buf_detach(&b, &n);
    if ((r = check_text("the code on stdin", code, n))) {
        free(code);
        return r;
    }
    *ret = code;
    return 0;
}

static int cancel_pipe[2] = {-1, -1};
static volatile sig_atomic_t cancel_signal;

static void on_signal(int sig)
{
    cancel_signal = sig;
    (void)!write(cancel_pipe[1], "x", 1);
}

static void forward_output(void *ctx, int stream, const char *data, size_t n)
{
    (void)ctx;
    (void)write_all(stream == 1 ? STDOUT_FILENO : STDERR_FILENO, data, n);
}

static void print_outcome(const struct run_opts *o, const struct exec_record *rec)
{
    if (rec->message && rec->status != EXEC_OK && rec->status != EXEC_ERROR)
        fprintf(stderr, "runcell: %s\n", rec->message);
    if (!o->c.out_dir)
        return;
    size_t n = strv_len(rec->copied_out);
    fprintf(stderr, "runcell: %zu file%s written to %s%s", n, n == 1 ? "" : "s", o->c.out_dir,
            n ? ":" : "\n");
    for (char **f = rec->copied_out; n && *f; f++)
        fprintf(stderr, " %s", *f);
    if (n)
        fputc('\n', stderr);
}

static void print_json_record(const struct exec_record *rec)
{
    json_t *j = exec_record_json(rec);
    json_dumpf(j, stdout, JSON_COMPACT);
    fputc('\n', stdout);
    fflush(stdout);
    json_decref(j);
}

/* Sets up the sandbox host. When that fails nothing runs, but a --json caller still gets a
 * record, as it does for every other sandbox failure. */
static int host_setup(struct sandbox_host *host, bool json)
{
    /* Before the host is set up, which may start processes: a signal from then on ends the
     * run with its record (128 + N), never the default death. */
    if (pipe2(cancel_pipe, O_CLOEXEC | O_NONBLOCK) == 0) {
        struct sigaction sa = {.sa_handler = on_signal};
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGHUP, &sa, NULL);
    }
    /* One sandbox, then the end: no trial of user namespaces in a child (the helper names
     * the cause if the sandbox's clone fails). */
    if (sandbox_host_init_with(host, SANDBOX_HOST_ONE_SHOT) < 0) {
        fprintf(stderr, "runcell: %s\n", err_msg());
        if (json) {
            struct exec_record rec;
            exec_record_init(&rec, DEFAULT_OUTPUT_CAP);
            rec.status = EXEC_SANDBOX_ERROR;
            rec.message = xstrdup(err_msg());
            print_json_record(&rec);
            exec_record_release(&rec);
        }
        sandbox_host_release(host);
        return -1;
    }
    if (host->degraded_reason)
        fprintf(stderr, "runcell: warning: resource limits are degraded: %s\n",
                host->degraded_reason);
    return 0;
}

static int execute_script(struct run_opts *o, const char *code)
{
    struct sandbox_host host;
    if (host_setup(&host, o->json) < 0)
        return 125;
    sandbox_limits_fill_defaults(&o->c.limits);
    struct run_request req = {
        .lang = o->lang,
        .code = code,
        .code_on_stdin = o->from_stdin,
        .script_path = o->file,
        .args = o->args,
        .files = o->c.files,
        .n_files = o->c.n_files,
        .limits = o->c.limits,
        .timeout_ms = o->c.timeout_ms,
        .output_cap = DEFAULT_OUTPUT_CAP,
        .out_dir = o->c.out_dir,
        .on_output = o->json ? NULL : forward_output,
        .cancel_fd = cancel_pipe[0],
        .net = common_net_opts(&o->c),
    };
    struct exec_record rec;
    exec_record_init(&rec, req.output_cap);
    int status;
    if (run_oneshot(&host, &req, &rec) < 0) {
        fprintf(stderr, "runcell run: %s\n", err_msg());
        status = EXIT_USAGE;
    } else {
        if (o->json) {
            print_json_record(&rec);
        } else {
            print_packages_report(rec.packages);
            print_network_refusals(rec.network);
            print_outcome(o, &rec);
        }
        status = cancel_signal ? 128 + cancel_signal : exec_record_exit_status(&rec);
    }
    exec_record_release(&rec);
    sandbox_host_release(&host);
    return status;
}

/* ---- cells: each -c a cell of one fresh session ---- */

struct cell_printer {
    const struct run_opts *o;
    long cell;
    size_t n_images; /* of this cell */
    char **saved;    /* names of the images written to --out, counted with the files */
};

static void save_image(struct cell_printer *p, const char *mime, const char *b64)
{
    char *name;
    if (exec_figure_save(NULL, p->o->c.out_dir, p->cell, ++p->n_images, mime, b64, &name) < 0) {
        fprintf(stderr, "runcell: %s\n", err_msg());
        return;
    }
    fprintf(stderr, "runcell: saved %s/%s\n", p->o->c.out_dir, name);
    p->saved = strv_push(p->saved, name);
    free(name);
}

/* Live output of a cell; with --json only the images for --out (the record has the rest). */
static void print_cell_event(void *ctx, const struct exec_event *ev)
{
    struct cell_printer *p = ctx;
    if (p->o->json && ev->type != EV_RESULT)
        return;
    switch (ev->type) {
    case EV_STDOUT:
    case EV_STDERR:
        forward_output(NULL, ev->type == EV_STDOUT ? 1 : 2, ev->data, ev->len);
        break;
    case EV_RESULT: {
        const char *mime, *b64 = exec_bundle_image(ev->json, &mime);
        if (b64 && p->o->c.out_dir)
            save_image(p, mime, b64);
        if (p->o->json)
            break;
        const char *text = json_string_value(json_object_get(ev->json, "text/plain"));
        if (text && *text)
            printf("%s\n", text);
        fflush(stdout);
        break;
    }
    case EV_ERROR: {
        const char *tb = json_string_value(json_object_get(ev->json, "traceback"));
        if (tb)
            fputs(tb, stderr);
        break;
    }
    case EV_DONE:
        break;
    }
}

/* Copies what the cells created or changed to DIR and says what DIR got: those files and
 * the images already saved there (SAVED). */
static void copy_outputs(struct workspace *ws, const struct ws_listing *before, const char *dir,
                         char *const *saved)
{
    struct ws_listing after;
    char **created, **modified, **deleted;
    if (workspace_scan(ws, &after) < 0)
        return;
    ws_listing_diff(before, &after, &created, &modified, &deleted);
    struct buf names;
    size_t n = 0;
    buf_init(&names, 0);
    for (char *const *f = saved; f && *f; f++, n++)
        buf_printf(&names, " %s", *f);
    for (int pass = 0; pass < 2; pass++)
        for (char **f = pass ? modified : created; *f; f++)
            if (workspace_copy_out(ws, *f, dir) == 0) {
                buf_printf(&names, " %s", *f);
                n++;
            } else {
                log_warn("msg=\"cannot copy out\" file=%s error=%s", log_quote(*f),
                         log_quote(err_msg()));
            }
    fprintf(stderr, "runcell: %zu file%s written to %s%s%s\n", n, n == 1 ? "" : "s", dir,
            n ? ":" : "", names.data ? names.data : "");
    buf_release(&names);
    strv_free(created);
    strv_free(modified);
    strv_free(deleted);
    ws_listing_release(&after);
}

static int run_cells(struct run_opts *o, struct session *s, struct cell_printer *p)
{
    struct exec_sink sink = {.fn = print_cell_event, .ctx = p};
    int status = 0;
    for (char **code = o->codes; *code && !cancel_signal; code++) {
        struct exec_record rec;
        struct exec_request req = {.code = *code,
                                   .lang = o->lang,
                                   .timeout_ms = o->c.timeout_ms,
                                   .cancel_fd = cancel_pipe[0]};
        exec_record_init(&rec, DEFAULT_OUTPUT_CAP);
        if (p->cell == 0 && session_packages(s))
            rec.packages = json_incref(session_packages(s)); /* said once, with cell 1 */
        p->cell++;
        p->n_images = 0;
        if (session_execute(s, &req, &sink, &rec) < 0) {
            fprintf(stderr, "runcell run: %s\n", err_msg());
            exec_record_release(&rec);
            return EXIT_USAGE;
        }
        if (o->json) {
            print_json_record(&rec);
        } else {
            print_network_refusals(rec.network);
            if (rec.message && rec.status != EXEC_OK)
                fprintf(stderr, "runcell: cell %ld: %s\n", p->cell, rec.message);
        }
        bool failed = rec.status != EXEC_OK;
        bool exited =
            rec.error &&
            !strcmp(json_string_value(json_object_get(rec.error, "name")) ?: "", "SystemExit");
        /* sys.exit(N) ends the run with status N, as it would end a script: 0 included. */
        if (failed && !status)
            status = exited && rec.has_exit_code ? rec.exit_code : exec_record_exit_status(&rec);
        exec_record_release(&rec);
        if (exited || (failed && !o->keep_going))
            break;
    }
    return cancel_signal ? 128 + cancel_signal : status;
}

#ifndef RUNCELL_FRONT
/* RUNCELL_FORKED (the security suite's pass over forked sessions; runcell execs
 * runcell-full for it): the cells run in a fork of a session that ran a cell of its own, made
 * as `serve` makes forks (the parent exported to a store, the fork resumed from it), in a
 * scratch store that goes with the run. */
#define FORK_SEED "forked_from = 'a parent session'"

struct forked {
    char dir[64];
    struct persist_config pc;
    struct session_table *t;
    struct session *s;
};

static int forked_session(struct sandbox_host *host, const struct session_opts *so,
                          struct forked *f)
{
    snprintf(f->dir, sizeof(f->dir), "/tmp/runcell-forked-XXXXXX");
    if (!mkdtemp(f->dir))
        return err_set(errno, "cannot create a scratch store: %s", strerror(errno));
    struct store_config sc = {.url = f->dir};
    int r = store_open(&sc, &f->pc.store);
    if (r < 0)
        return r;
    f->t = session_table_new(host, SESSION_FORK_MAX, NULL);
    session_table_set_persistence(f->t, &f->pc);
    _cleanup_free_ char *parent = NULL;
    if ((r = session_table_create(f->t, so, &parent)) < 0)
        return r;
    int err;
    struct session *p = session_table_acquire(f->t, parent, &err);
    if (!p)
        return err_set(-err, "the parent session is gone");
    struct exec_request req = {.code = FORK_SEED, .cancel_fd = -1};
    struct exec_record rec;
    exec_record_init(&rec, DEFAULT_OUTPUT_CAP);
    r = session_execute(p, &req, NULL, &rec);
    if (r == 0 && rec.status != EXEC_OK)
        r = err_set(EIO, "the parent's cell failed: %s", rec.message ? rec.message : "?");
    exec_record_release(&rec);
    session_table_put(f->t, p);
    json_t *forks = NULL;
    if (r == 0 && (r = session_table_fork(f->t, parent, 1, &forks)) == 0) {
        const char *id = json_string_value(json_object_get(json_array_get(forks, 0), "id"));
        f->s = id ? session_table_acquire(f->t, id, &err) : NULL;
        if (!f->s)
            r = err_set(EIO, "the fork is gone");
    }
    json_decref(forks);
    session_table_close(f->t, parent, false, NULL); /* the fork runs alone */
    return r;
}

static void forked_release(struct forked *f)
{
    if (f->s)
        session_table_put(f->t, f->s);
    session_table_free(f->t);
    store_free(f->pc.store);
    if (f->dir[0])
        rm_rf(f->dir);
}
#endif

static int execute_cells(struct run_opts *o)
{
    struct sandbox_host host;
    struct session *s = NULL;
    struct ws_listing before = {0};
    struct cell_printer printer = {.o = o};
    if (host_setup(&host, o->json) < 0)
        return 125;
    /* Sessions made by the template (what `serve` does) rather than from scratch; the
     * first start pays for the template's imports. */
    if (getenv("RUNCELL_TEMPLATE") && sandbox_host_start_template(&host) < 0)
        fprintf(stderr, "runcell: warning: no template: %s\n", err_msg());
    struct session_opts so = {.limits = o->c.limits,
                              .timeout_ms = o->c.timeout_ms,
                              .argv = o->args,
                              .net = common_net_opts(&o->c),
                              .files = o->c.files,
                              .n_files = o->c.n_files,
                              .lang = lang_is_javascript(o->lang) ? "javascript" : NULL};
    int status, r;
#ifndef RUNCELL_FRONT
    struct forked forked = {0};
    bool in_fork = getenv("RUNCELL_FORKED");
    if (in_fork && (r = forked_session(&host, &so, &forked)) == 0)
        s = forked.s;
    else if (!in_fork)
        r = session_new(&host, &so, &s);
#else
    r = session_new(&host, &so, &s);
#endif
    if (r < 0) {
        fprintf(stderr, "runcell: cannot start the session: %s\n", err_msg());
        status = 125;
    } else {
        if (!o->json)
            print_packages_report(session_packages(s));
        workspace_scan(session_workspace(s), &before);
        status = run_cells(o, s, &printer);
        if (o->c.out_dir)
            copy_outputs(session_workspace(s), &before, o->c.out_dir, printer.saved);
    }
    strv_free(printer.saved);
    ws_listing_release(&before);
#ifndef RUNCELL_FRONT
    if (in_fork)
        forked_release(&forked);
    else
#endif
        session_free(s);
    sandbox_host_release(&host);
    return status;
}

int cmd_run(int argc, char **argv)
{
    struct run_opts o = {.lang = "python", .c.timeout_ms = DEFAULT_TIMEOUT_MS};
    _cleanup_free_ char *stdin_code = NULL;
    int r = parse_args(&o, argc, argv);
    if (!r && o.file)
        r = check_script(o.file);
    if (!r && o.from_stdin)
        r = read_stdin_code(&stdin_code);
    if (!r && o.c.out_dir)
        r = check_out_dir("run", o.c.out_dir);
    if (!r)
        r = check_net_opts("run", &o.c);
    /* Python and JavaScript -c code runs as cells; a single bash -c as a plain script. */
    bool cells = o.codes && (strcmp(o.lang, "bash") || strv_len(o.codes) > 1);
    if (!r && cells)
        r = execute_cells(&o);
    else if (!r)
        r = execute_script(&o, stdin_code ? stdin_code : (o.codes ? o.codes[0] : NULL));
    strv_free(o.codes);
    strv_free(o.args);
    common_opts_release(&o.c);
    return r == OPTTAB_HELP ? 0 : r;
}
