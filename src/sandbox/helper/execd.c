/* execd.c - the sandbox's process spawner: a child of init that starts programs beside the
 * payload (E2B's commands, a background dev server) in the same namespaces and cgroup, under
 * the payload's whole lockdown, and reports how each ended.
 *
 * init forks it when the daemon first writes to the exec channel (a SOCK_SEQPACKET socket the
 * daemon made when it started the sandbox; init holds the other end, the payload never sees
 * it), and again if it dies. It applies the lockdown the payload gets (rlimits, the sandbox
 * user, no capabilities, no_new_privs, Landlock, seccomp) before it reads a request, so that
 * everything it forks inherits it; it then makes itself undumpable, so that the processes it
 * starts (same user, same Landlock domain) cannot read or write its memory or its
 * descriptors through /proc. Its processes share one Landlock domain: a command may signal
 * another command's processes (pkill), not the payload's.
 *
 * Requests, one message each, JSON (from the daemon, which is trusted here):
 *   {"id": N, "op": "exec", "argv": [...], "env": [...], "cwd": "/..."} with four fds: the
 *       program's stdin, stdout, stderr, and the write end of its status pipe
 *   {"id": N, "op": "signal", "pid": P, "signal": S}: to P's process group (each program is
 *       a session and group leader of its own), then to P
 * Replies: {"id": N, "pid": P} | {"id": N, "ok": true} | {"id": N, "error": "..."}, with
 * "asked": true when the program cannot run as asked (no such program or directory) and
 * "busy": true when the sandbox has no process left for it (its pids limit).
 * When a program ends, "exit N" or "signal N" and a newline go to its status pipe, which is
 * then closed; a status pipe closed without a line means the spawner itself is gone. */
#include "sandbox/helper/helper.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"

#define EXECD_MAX_CHILDREN 256
#define EXECD_MAX_REQUEST  (256u << 10)
#define EXECD_CHAN         3

struct child {
    pid_t pid;
    int status_fd;
};

static struct child children[EXECD_MAX_CHILDREN];
static size_t n_children;

static void reply(int chan, json_int_t id, json_t *body)
{
    json_object_set_new(body, "id", json_integer(id));
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (text)
        (void)send(chan, text, strlen(text), MSG_NOSIGNAL);
    free(text);
}

static void reply_error(int chan, json_int_t id, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void reply_error(int chan, json_int_t id, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    reply(chan, id, json_pack("{s:s}", "error", msg));
}

/* The program a request names: itself when it holds a '/', else the first match on the
 * environment's PATH (as execvpe would search it), in buf. */
static const char *find_program(const char *name, char *const *env, char *buf, size_t size)
{
    if (strchr(name, '/'))
        return name;
    const char *path = "/usr/local/bin:/usr/bin:/bin";
    for (char *const *e = env; e && *e; e++)
        if (!strncmp(*e, "PATH=", 5))
            path = *e + 5;
    for (const char *p = path; *p;) {
        size_t n = strcspn(p, ":");
        snprintf(buf, size, "%.*s%s%s", (int)n, p, n ? "/" : "", name);
        if (access(buf, X_OK) == 0)
            return buf;
        p += n + (p[n] == ':');
    }
    return name;
}

/* In the forked child: fds into place, a session of its own, the directory, the program.
 * Failures go to report (an errno and what failed) and end the child. */
static __attribute__((noreturn)) void run_child(char **argv, char **env, const char *cwd,
                                                const int *fds, int report)
{
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (int sig = 1; sig < NSIG; sig++)
        signal(sig, SIG_DFL);
    setsid();
    struct {
        int err;
        char what[64];
    } rep = {0};
    /* the report pipe above the three targets, then everything else closed */
    if ((report = fcntl(report, F_DUPFD_CLOEXEC, 3)) < 0 || dup2(fds[0], 0) < 0 ||
        dup2(fds[1], 1) < 0 || dup2(fds[2], 2) < 0 || dup3(report, 3, O_CLOEXEC) < 0) {
        rep.err = errno;
        snprintf(rep.what, sizeof(rep.what), "cannot set up its standard streams");
        goto fail;
    }
    syscall(SYS_close_range, 4, ~0U, 0);
    if (chdir(cwd) < 0) {
        rep.err = errno;
        snprintf(rep.what, sizeof(rep.what), "cannot enter its working directory");
        goto fail;
    }
    char found[4096];
    execve(find_program(argv[0], env, found, sizeof(found)), argv, env);
    rep.err = errno;
    snprintf(rep.what, sizeof(rep.what), "cannot be run");
fail:
    (void)!write(3, &rep, sizeof(rep));
    _exit(127);
}

static char **strings(json_t *arr)
{
    char **v = xcalloc(1, sizeof(char *));
    size_t i;
    json_t *s;
    json_array_foreach(arr, i, s) if (json_is_string(s)) v = strv_push(v, json_string_value(s));
    return v;
}

static void do_exec(int chan, json_int_t id, json_t *req, const int *fds, int n_fds)
{
    if (n_fds != 4)
        return reply_error(chan, id, "exec takes 4 descriptors, got %d", n_fds);
    if (n_children >= EXECD_MAX_CHILDREN)
        return reply_error(chan, id, "the sandbox runs its maximum of %d processes",
                           EXECD_MAX_CHILDREN);
    _cleanup_strv_ char **argv = strings(json_object_get(req, "argv"));
    _cleanup_strv_ char **env = strings(json_object_get(req, "env"));
    const char *cwd = json_string_value(json_object_get(req, "cwd"));
    if (!argv[0] || !cwd)
        return reply_error(chan, id, "exec needs argv and cwd");
    int report[2];
    if (pipe2(report, O_CLOEXEC) < 0)
        return reply_error(chan, id, "cannot make a pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid == 0) {
        close(report[0]);
        run_child(argv, env, cwd, fds, report[1]);
    }
    close(report[1]);
    if (pid < 0) {
        int e = errno;
        close(report[0]);
        char msg[512];
        snprintf(msg, sizeof(msg), "cannot start %.200s: %s", argv[0], strerror(e));
        /* EAGAIN: the sandbox's pids limit */
        return reply(chan, id, json_pack("{s:s,s:b}", "error", msg, "busy", e == EAGAIN));
    }
    struct {
        int err;
        char what[64];
    } rep;
    ssize_t got;
    do
        got = read(report[0], &rep, sizeof(rep));
    while (got < 0 && errno == EINTR);
    close(report[0]);
    if (got == (ssize_t)sizeof(rep)) {
        /* the child is gone without running anything: reaped here, never reported */
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        rep.what[sizeof(rep.what) - 1] = '\0';
        char msg[512];
        snprintf(msg, sizeof(msg), "%.200s: %s (%.200s): %s", argv[0], rep.what, cwd,
                 strerror(rep.err));
        /* the program cannot run as asked: the request's fault, not the sandbox's */
        return reply(chan, id, json_pack("{s:s,s:b}", "error", msg, "asked", 1));
    }
    children[n_children++] =
        (struct child){.pid = pid, .status_fd = fcntl(fds[3], F_DUPFD_CLOEXEC, 4)};
    reply(chan, id, json_pack("{s:i}", "pid", (int)pid));
}

static struct child *child_of(pid_t pid)
{
    for (size_t i = 0; i < n_children; i++)
        if (children[i].pid == pid)
            return &children[i];
    return NULL;
}

static void do_signal(int chan, json_int_t id, json_t *req)
{
    json_int_t pid = json_integer_value(json_object_get(req, "pid"));
    json_int_t sig = json_integer_value(json_object_get(req, "signal"));
    if (sig < 1 || sig >= NSIG)
        return reply_error(chan, id, "no signal %lld", (long long)sig);
    if (pid <= 0 || pid > INT32_MAX || !child_of((pid_t)pid))
        return reply_error(chan, id, "no process %lld was started here", (long long)pid);
    /* The group first: a shell's children go with it (what it started in the background in
     * a group of its own, or in a session of its own, does not). */
    (void)kill(-(pid_t)pid, (int)sig);
    (void)kill((pid_t)pid, (int)sig);
    reply(chan, id, json_pack("{s:b}", "ok", 1));
}

/* Reads and answers one request. False when the channel is closed. */
static bool serve_one(int chan)
{
    static char buf[EXECD_MAX_REQUEST];
    int fds[8], n_fds = 0;
    ssize_t n = recv_with_fds(chan, buf, sizeof(buf), MSG_DONTWAIT, fds, 8, &n_fds);
    if (n == -EAGAIN)
        return true;
    if (n == -EMSGSIZE || n == -EMFILE) {
        json_t *req = json_loads(buf, 0, NULL);
        reply_error(chan, json_integer_value(json_object_get(req, "id")),
                    "the request's descriptors could not be taken: %s",
                    n == -EMFILE ? "out of open files" : "too many, or the request too large");
        json_decref(req);
        return true;
    }
    if (n <= 0)
        return false;
    json_t *req = json_loads(buf, 0, NULL);
    json_int_t id = json_integer_value(json_object_get(req, "id"));
    const char *op = json_string_value(json_object_get(req, "op"));
    if (!op)
        reply_error(chan, id, "not a request");
    else if (!strcmp(op, "exec"))
        do_exec(chan, id, req, fds, n_fds);
    else if (!strcmp(op, "signal"))
        do_signal(chan, id, req);
    else
        reply_error(chan, id, "unknown request '%.40s'", op);
    json_decref(req);
    for (int i = 0; i < n_fds; i++)
        close(fds[i]);
    return true;
}

/* Says how each ended child ended on its status pipe, and forgets it. */
static void reap(void)
{
    int wstatus;
    pid_t p;
    while ((p = waitpid(-1, &wstatus, WNOHANG)) > 0) {
        struct child *c = child_of(p);
        if (!c)
            continue;
        char line[32];
        int len = WIFSIGNALED(wstatus)
                      ? snprintf(line, sizeof(line), "signal %d\n", WTERMSIG(wstatus))
                      : snprintf(line, sizeof(line), "exit %d\n", WEXITSTATUS(wstatus));
        (void)!write(c->status_fd, line, (size_t)len);
        close(c->status_fd);
        *c = children[--n_children];
    }
}

static __attribute__((noreturn)) void serve(int chan)
{
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    for (;;) {
        struct pollfd pfd[2] = {{.fd = chan, .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
        if (poll(pfd, 2, -1) < 0 && errno != EINTR)
            _exit(1);
        if (pfd[1].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
                ;
            reap();
        }
        if ((pfd[0].revents & (POLLIN | POLLHUP | POLLERR)) && !serve_one(chan))
            _exit(0); /* the daemon is gone: init takes the rest down */
    }
}

/* A lockdown that failed: its message (from status_fd, a pipe of ours for the while) goes
 * to the request waiting on the channel, and the spawner ends; init starts another at the
 * next request. */
static __attribute__((noreturn)) void refuse_one(int chan, int msg_fd)
{
    char msg[1024];
    ssize_t n = read(msg_fd, msg, sizeof(msg) - 1);
    msg[n > 0 ? n : 0] = '\0';
    msg[strcspn(msg, "\n")] = '\0';
    char buf[4096];
    int fds[8], n_fds;
    if (recv_with_fds(chan, buf, sizeof(buf), MSG_DONTWAIT, fds, 8, &n_fds) > 0)
        for (int i = 0; i < n_fds; i++)
            close(fds[i]);
    json_t *req = json_loads(buf, 0, NULL);
    reply_error(chan, json_integer_value(json_object_get(req, "id")),
                "the sandbox cannot start processes: %s", *msg ? msg : "its lockdown failed");
    _exit(1);
}

pid_t execd_start(const struct helper_config *cfg, void *filter, int chan)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    /* init blocks every signal it forwards and handles them with no-ops: back to the
     * defaults, SIGCHLD blocked for the signalfd */
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    for (int sig = 1; sig < NSIG; sig++)
        signal(sig, SIG_DFL);
    sigprocmask(SIG_SETMASK, &chld, NULL);
    setsid();
    prctl(PR_SET_NAME, "runcell-exec");
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    for (int fd = 0; fd < 3 && null >= 0; fd++)
        dup2(null, fd);
    if (dup2(chan, EXECD_CHAN) < 0)
        _exit(1);
    syscall(SYS_close_range, EXECD_CHAN + 1, ~0U, 0);
    fd_set_cloexec(EXECD_CHAN, true);
    /* The lockdown reports on status_fd: here a pipe of ours, not init's status lines. */
    int msg[2];
    if (pipe2(msg, O_CLOEXEC | O_NONBLOCK) < 0)
        _exit(1);
    status_fd = msg[1];
    if (lockdown(cfg, filter) < 0)
        refuse_one(EXECD_CHAN, msg[0]);
    close(msg[0]);
    close(msg[1]);
    status_fd = -1;
    prctl(PR_SET_DUMPABLE, 0);
    signal(SIGPIPE, SIG_IGN);
    serve(EXECD_CHAN);
}
