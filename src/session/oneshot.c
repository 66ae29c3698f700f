/* oneshot.c - `runcell run`: one program in one fresh sandbox, streamed, capped, timed. */
#include "session/session-int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Longest code accepted on a command line (the kernel's per-argument limit is 128 KiB). */
#define MAX_ARG_CODE (120 * 1024)

/* Language names as clients give them, to the one the rest of runcell uses. */
static const struct {
    const char *name, *canonical;
} lang_names[] = {
    {"python", "python"}, {"bash", "bash"},       {"javascript", "javascript"},
    {"js", "javascript"}, {"node", "javascript"},
};

const char *lang_name(const char *lang)
{
    for (size_t i = 0; lang && i < ARRAY_SIZE(lang_names); i++)
        if (!strcmp(lang, lang_names[i].name))
            return lang_names[i].canonical;
    return NULL;
}

bool lang_supported(const char *lang)
{
    return lang_name(lang) != NULL;
}

bool lang_is_javascript(const char *lang)
{
    const char *c = lang_name(lang);
    return c && !strcmp(c, "javascript");
}

/* The interpreter of a one-shot run: node -e is JavaScript's stateless form. */
static const char *program_path(const char *lang)
{
    if (lang_is_javascript(lang))
        return "/usr/bin/node";
    return !strcmp(lang, "python") ? "/usr/bin/python3" : "/bin/bash";
}

static char **program_argv(const struct run_request *req, const char *script_name)
{
    bool py = !strcmp(req->lang, "python");
    bool js = lang_is_javascript(req->lang);
    char **argv = xcalloc(1, sizeof(char *));
    argv = strv_push(argv, program_path(req->lang));
    if (script_name) {
        argv = strv_push(argv, script_name);
    } else if (py && req->code_on_stdin) {
        argv = strv_push(argv, "-"); /* the code comes on stdin, as with python3 - */
    } else {
        argv = strv_push(argv, js ? "-e" : "-c");
        argv = strv_push(argv, req->code);
        if (!py && !js)
            argv = strv_push(argv, "bash"); /* $0 for bash -c */
        if (js && req->args && req->args[0])
            argv = strv_push(argv, "--"); /* the arguments are process.argv[1:], not node's */
    }
    for (char *const *a = req->args; a && *a; a++)
        argv = strv_push(argv, *a);
    return argv;
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

int copy_input_files(struct workspace *ws, const struct input_file *files, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const struct input_file *f = &files[i];
        if (!path_is_safe_relative(f->dest))
            return err_set(EINVAL,
                           "bad destination '%s' for %s: use a relative path inside "
                           "the workspace, without '..'",
                           f->dest, f->local);
        int r = workspace_copy_in(ws, f->local, f->dest);
        if (r < 0)
            return r;
    }
    return 0;
}

static int copy_inputs(struct workspace *ws, const struct run_request *req)
{
    int r = copy_input_files(ws, req->files, req->n_files);
    if (r < 0)
        return r;
    if (req->script_path) {
        const char *name = base_name(req->script_path);
        if (!path_is_safe_relative(name))
            return err_set(EINVAL, "bad script name %s", req->script_path);
        return workspace_copy_in(ws, req->script_path, name);
    }
    return 0;
}

struct pump {
    struct exec_record *rec;
    const struct run_io *io;
};

/* Reads what is there on fd into the stream's capture; returns false at EOF. */
static bool pump_stream(struct pump *p, int fd, int stream)
{
    char chunk[65536];
    ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n < 0)
        return errno == EINTR || errno == EAGAIN;
    if (n == 0)
        return false;
    struct outcap *c = stream == 1 ? &p->rec->out : &p->rec->err;
    size_t head = outcap_append(c, chunk, (size_t)n);
    if (head && p->io->on_output)
        p->io->on_output(p->io->ctx, stream, chunk, head);
    return true;
}

/* Forwards what did not fit in the head. Output past the head but within the cap is kept
 * whole in the tail without being truncated, so it must go out too. */
static void flush_rest(struct pump *p)
{
    for (int stream = 1; stream <= 2 && p->io->on_output; stream++) {
        struct outcap *c = stream == 1 ? &p->rec->out : &p->rec->err;
        size_t n;
        char *rest = outcap_render_rest(c, &n);
        if (n)
            p->io->on_output(p->io->ctx, stream, rest, n);
        free(rest);
    }
}

enum stop_reason { STOP_NONE, STOP_TIMEOUT, STOP_CANCEL };

/* Moves output until the sandbox is gone and both streams are closed, enforcing the wall
 * clock. After a kill, the streams close as the kernel tears the namespace down. */
static enum stop_reason supervise(struct sandbox *sb, struct pump *p, int out_fd, int err_fd)
{
    enum stop_reason stop = STOP_NONE;
    double deadline = sandbox_started_ms(sb) + (double)p->io->timeout_ms;
    bool out_open = true, err_open = true;
    while (out_open || err_open || sandbox_status_fd(sb) >= 0) {
        struct pollfd pfd[4] = {{.fd = out_open ? out_fd : -1, .events = POLLIN},
                                {.fd = err_open ? err_fd : -1, .events = POLLIN},
                                {.fd = sandbox_status_fd(sb), .events = POLLIN},
                                {.fd = stop ? -1 : p->io->cancel_fd, .events = POLLIN}};
        int wait_ms = -1;
        if (!stop) {
            double left = deadline - now_ms_f();
            wait_ms = left <= 0 ? 0 : (int)(left + 1);
        }
        int n = poll(pfd, 4, wait_ms);
        if (n < 0 && errno != EINTR)
            break;
        if (!stop && now_ms_f() >= deadline) {
            stop = STOP_TIMEOUT;
            sandbox_kill(sb);
        }
        if (n <= 0)
            continue;
        if (pfd[0].revents)
            out_open = pump_stream(p, out_fd, 1);
        if (pfd[1].revents)
            err_open = pump_stream(p, err_fd, 2);
        if (pfd[2].revents)
            sandbox_poll_status(sb);
        if (pfd[3].revents && !stop) {
            stop = STOP_CANCEL;
            sandbox_kill(sb);
        }
    }
    return stop;
}

static bool crash_signal(int sig)
{
    return sig == SIGSEGV || sig == SIGBUS || sig == SIGILL || sig == SIGFPE || sig == SIGABRT ||
           sig == SIGSYS;
}

static void classify(struct exec_record *rec, struct sandbox *sb, enum stop_reason stop,
                     const struct sandbox_usage *u, uint64_t timeout_ms)
{
    struct sandbox_outcome end;
    sandbox_outcome(sb, &end);
    if (stop == STOP_TIMEOUT) {
        rec->status = EXEC_TIMEOUT;
        rec->message = xasprintf("timed out after %.3g s; every process of the sandbox was "
                                 "killed",
                                 (double)timeout_ms / 1000.0);
    } else if (stop == STOP_CANCEL) {
        rec->status = EXEC_KILLED;
        rec->signal = SIGKILL;
        rec->message = xstrdup("cancelled; every process of the sandbox was killed");
    } else if (!end.exited) {
        rec->status = u->oom_killed ? EXEC_OOM : EXEC_SANDBOX_ERROR;
        rec->message = xstrdup(end.error ? end.error : "the sandbox ended unexpectedly");
    } else if (end.signal) {
        rec->signal = end.signal;
        if (end.signal == SIGKILL && u->oom_killed) {
            rec->status = EXEC_OOM;
            rec->message = xstrdup("out of memory: the program was killed at the memory limit");
        } else {
            rec->status = crash_signal(end.signal) ? EXEC_CRASHED : EXEC_KILLED;
            rec->message = xasprintf("killed by signal %d (%s)", end.signal, strsignal(end.signal));
        }
    } else {
        rec->has_exit_code = true;
        rec->exit_code = end.exit_code;
        rec->status = end.exit_code ? EXEC_ERROR : EXEC_OK;
        if (end.exit_code == 127 && end.error) {
            rec->status = EXEC_SANDBOX_ERROR;
            rec->message = xstrdup(end.error);
        }
    }
}

static void collect_files(struct exec_record *rec, struct workspace *ws,
                          const struct ws_listing *before, const char *out_dir)
{
    struct ws_listing after;
    if (workspace_scan(ws, &after) < 0)
        return;
    ws_listing_diff(before, &after, &rec->created, &rec->modified, &rec->deleted);
    rec->files_truncated = before->truncated || after.truncated;
    ws_listing_release(&after);
    if (!out_dir)
        return;
    rec->copied_out = xcalloc(1, sizeof(char *));
    for (int pass = 0; pass < 2; pass++)
        for (char **f = pass ? rec->modified : rec->created; *f; f++) {
            if (workspace_copy_out(ws, *f, out_dir) == 0)
                rec->copied_out = strv_push(rec->copied_out, *f);
            else
                log_warn("msg=\"cannot copy out\" file=%s error=%s", log_quote(*f),
                         log_quote(err_msg()));
        }
}

static void sandbox_failed(struct exec_record *rec, const char *what)
{
    rec->status = EXEC_SANDBOX_ERROR;
    rec->message = xstrdup(what);
}

/* A sealed memory file holding text, read from its start: a program's stdin that needs no
 * writer beside it, whatever its size. Returns the fd or -1 with errno. */
static int stdin_memfd(const char *text)
{
    int fd = memfd_create("runcell-stdin", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -1;
    if (write_all(fd, text, strlen(text)) < 0 || lseek(fd, 0, SEEK_SET) < 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

void run_sandbox(struct sandbox_host *host, struct workspace *ws, struct sandbox_spec *spec,
                 const struct run_io *io, struct exec_record *rec)
{
    struct sandbox *sb = NULL;
    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    _cleanup_close_ int in_fd =
        io->stdin_text ? stdin_memfd(io->stdin_text) : open("/dev/null", O_RDONLY | O_CLOEXEC);
    double t0 = now_ms_f();
    if (in_fd < 0 || pipe2(out_pipe, O_CLOEXEC) < 0 || pipe2(err_pipe, O_CLOEXEC) < 0) {
        sandbox_failed(rec, strerror(errno));
        goto out;
    }
    spec->stdin_fd = in_fd;
    spec->stdout_fd = out_pipe[1];
    spec->stderr_fd = err_pipe[1];
    if (sandbox_start(host, ws, spec, &sb) < 0) {
        sandbox_failed(rec, err_msg());
        goto out;
    }
    close(TAKE_FD(out_pipe[1]));
    close(TAKE_FD(err_pipe[1]));
    fd_set_nonblock(out_pipe[0], true);
    fd_set_nonblock(err_pipe[0], true);
    struct pump p = {.rec = rec, .io = io};
    enum stop_reason stop = supervise(sb, &p, out_pipe[0], err_pipe[0]);
    sandbox_wait(sb);
    rec->wall_ms = now_ms_f() - t0;
    struct sandbox_usage u;
    sandbox_usage(sb, &u);
    rec->cpu_ms = u.cpu_ms;
    rec->memory_peak_kb = u.memory_peak_kb;
    rec->memory_peak_scope = "cell"; /* a fresh sandbox for the one run */
    classify(rec, sb, stop, &u, io->timeout_ms);
    flush_rest(&p);
out:
    for (int i = 0; i < 2; i++) {
        if (out_pipe[i] >= 0)
            close(out_pipe[i]);
        if (err_pipe[i] >= 0)
            close(err_pipe[i]);
    }
    sandbox_free(sb);
}

/* Network attempts of the run into the record, when there were any. */
static void record_network(struct exec_record *rec, struct event_log *log)
{
    json_t *events = event_log_since(log, 0, "network");
    if (json_array_size(events))
        rec->network = events;
    else
        json_decref(events);
}

int run_oneshot(struct sandbox_host *host, const struct run_request *req, struct exec_record *rec)
{
    struct workspace *ws = NULL;
    struct ws_listing before = {0};
    struct sandbox_net net = {0};
    struct event_log log;
    _cleanup_strv_ char **argv = NULL, **env = NULL;
    const char *binds[8];
    int r = 0;

    if (!lang_supported(req->lang))
        return err_set(EINVAL, "unknown language '%s': use python, bash or javascript", req->lang);
    bool stdin_code = req->code_on_stdin && !strcmp(req->lang, "python");
    if (req->code && !stdin_code && strlen(req->code) > MAX_ARG_CODE)
        return err_set(E2BIG, "code is longer than %d KiB; put it in a file and run the file",
                       MAX_ARG_CODE / 1024);
    if ((r = net_opts_check(&req->net)) < 0)
        return r;
    event_log_init(&log);
    rec->limits_degraded = host->degraded_reason != NULL;
    if (workspace_new(host, req->limits.disk_mb, &ws) < 0) {
        sandbox_failed(rec, err_msg());
        goto out;
    }
    if ((r = copy_inputs(ws, req)) < 0)
        goto out;
    if (sandbox_net_start(&net, &req->net, ws, &log) < 0) {
        sandbox_failed(rec, err_msg());
        goto out;
    }
    if (deps_wanted(&req->net, ws))
        rec->packages = deps_install(host, ws, &req->limits, &req->net, &net);
    workspace_scan(ws, &before);
    argv = program_argv(req, req->script_path ? base_name(req->script_path) : NULL);
    struct sandbox_spec spec = {.argv = argv, .limits = req->limits};
    env = sandbox_net_apply(&net, &spec, binds, ARRAY_SIZE(binds), NULL);
    spec.limits.cpu_time_s = req->timeout_ms / 1000 + 5;
    struct run_io io = {.timeout_ms = req->timeout_ms,
                        .cancel_fd = req->cancel_fd,
                        .on_output = req->on_output,
                        .ctx = req->ctx,
                        .stdin_text = stdin_code ? req->code : NULL};
    run_sandbox(host, ws, &spec, &io, rec);
    collect_files(rec, ws, &before, req->out_dir);
out:
    sandbox_net_scrub_record(&net, rec);
    sandbox_net_stop(&net);
    record_network(rec, &log);
    event_log_release(&log);
    ws_listing_release(&before);
    workspace_free(ws);
    return r;
}
