/* spawn.c - starting, watching, signalling and tearing down one sandbox instance. */
#include "sandbox/cgroup-int.h"
#include "sandbox/sandbox-int.h"
#include "sandbox/spawn-int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static json_t *strv_json(char *const *v)
{
    json_t *a = json_array();
    for (; v && *v; v++)
        json_array_append_new(a, json_string(*v));
    return a;
}

/* Processes of our uid already running: RLIMIT_NPROC counts them too, so the cap for the
 * sandbox (only used without cgroups) goes on top of them. */
static uint64_t own_process_count(void)
{
    uint64_t n = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;
    if (!d)
        return 0;
    while ((e = readdir(d))) {
        struct stat st;
        if (e->d_name[0] >= '1' && e->d_name[0] <= '9' &&
            fstatat(dirfd(d), e->d_name, &st, 0) == 0 && st.st_uid == getuid())
            n++;
    }
    closedir(d);
    return n;
}

json_t *sandbox_config(const struct sandbox *sb, const struct workspace *ws,
                       const struct sandbox_spec *spec)
{
    const struct sandbox_limits *l = &spec->limits;
    json_t *o = json_object();
    json_object_set_new(o, "root_dir", json_string(sb->root_dir ? sb->root_dir : ""));
    json_object_set_new(o, "workspace", json_string(ws->dir));
    json_object_set_new(o, "uid", json_integer(ws->uid));
    json_object_set_new(o, "gid", json_integer(ws->gid));
    json_object_set_new(o, "root_uid", json_integer(ws->root_uid));
    json_object_set_new(o, "privileged", json_boolean(sb->host->privileged));
    char **procs = sb->cgroup ? cgroup_procs_files(sb->cgroup) : NULL;
    json_object_set_new(o, "cgroup_procs", strv_json(procs));
    strv_free(procs);
    char *leaf = sb->cgroup ? cgroup_leaf_procs_file(sb->cgroup) : NULL;
    if (leaf)
        json_object_set_new(o, "cgroup_leaf_procs", json_string(leaf));
    free(leaf);
    json_object_set_new(o, "instance", json_string(sb->instance));
    /* v2: the helper clones init straight into it (RUNCELL_NO_CLONE_INTO_CGROUP forces the
     * attach, to test and measure the fallback). */
    if (sb->cgroup && sb->cgroup->mode == CGROUP_V2 && !getenv("RUNCELL_NO_CLONE_INTO_CGROUP"))
        json_object_set_new(o, "cgroup_dir", json_string(sb->cgroup->dirs[0]));
    json_object_set_new(o, "argv", strv_json(spec->argv));
    if (spec->work_dir)
        json_object_set_new(o, "cwd", json_string(spec->work_dir));
    json_object_set_new(o, "env", strv_json(spec->env));
    json_object_set_new(o, "tmp_mb", json_integer((json_int_t)l->disk_mb));
    json_object_set_new(o, "tmp_inodes", json_integer((json_int_t)MAX(4096, l->disk_mb * 64)));
    json_object_set_new(o, "rlimit_nofile", json_integer((json_int_t)l->nofile));
    if (l->cpu_time_s)
        json_object_set_new(o, "rlimit_cpu_s", json_integer((json_int_t)l->cpu_time_s));
    if (!sb->cgroup) {
        /* No cgroups: rlimits are all there is. The address-space cap is coarse (it counts
         * reservations, not use) but stops a memory bomb; the file size cap stands in for
         * the workspace size when it is a plain directory. */
        json_object_set_new(o, "rlimit_as_mb", json_integer((json_int_t)l->memory_mb));
        json_object_set_new(o, "rlimit_nproc",
                            json_integer((json_int_t)(l->pids + own_process_count())));
    }
    if (!sb->host->privileged)
        json_object_set_new(o, "rlimit_fsize_mb", json_integer((json_int_t)l->disk_mb));
    json_object_set_new(o, "extra_fds", json_integer(spec->n_extra_fds));
    json_t *binds = json_array();
    for (const char *const *b = spec->ro_binds; b && b[0] && b[1]; b += 2) {
        json_t *e = json_object();
        json_object_set_new(e, "src", json_string(b[0]));
        json_object_set_new(e, "dst", json_string(b[1]));
        json_array_append_new(binds, e);
    }
    json_object_set_new(o, "binds", binds);
    if (spec->relay_socket) {
        json_object_set_new(o, "relay_socket", json_string(spec->relay_socket));
        json_object_set_new(o, "relay_port", json_integer(spec->relay_port));
    }
    if (spec->exec_channel)
        json_object_set_new(o, "exec_channel", json_true()); /* the last extra fd */
    if (getenv("RUNCELL_NO_LANDLOCK"))
        json_object_set_new(o, "landlock", json_false());
    if (spec->template_profile) {
        /* The template's namespace maps every sandbox id: its 0 is the host's uid_base, and
         * workspace slot N's pair is 2N, 2N+1 (slot 0 is the template's own). */
        json_object_set_new(o, "template", json_true());
        json_object_set_new(o, "root_uid", json_integer(sb->host->uid_base));
        json_object_set_new(o, "id_range", json_integer(2 * 65536));
    }
    return o;
}

/* Starts the helper with the payload's stdio on 0-2, the config on 3, the status pipe on 4
 * and the extra fds from 5. Every source is first moved above all targets and all sources
 * (a busy daemon holds fds past 100), so that no dup2 clobbers a source still needed. */
static int spawn_helper(const struct sandbox *sb, const struct sandbox_spec *spec, int config_fd,
                        int status_fd, pid_t *ret_pid)
{
    posix_spawn_file_actions_t fa;
    int src[5 + 16];
    int n = 0;
    src[n++] = spec->stdin_fd;
    src[n++] = spec->stdout_fd;
    src[n++] = spec->stderr_fd;
    src[n++] = config_fd;
    src[n++] = status_fd;
    for (int i = 0; i < spec->n_extra_fds && i < 16; i++)
        src[n++] = spec->extra_fds[i];
    int base = 100;
    for (int i = 0; i < n; i++)
        base = MAX(base, src[i] + 1);
    posix_spawn_file_actions_init(&fa);
    for (int i = 0; i < n; i++)
        posix_spawn_file_actions_adddup2(&fa, src[i], base + i);
    for (int i = 0; i < n; i++)
        posix_spawn_file_actions_adddup2(&fa, base + i, i);
    posix_spawn_file_actions_addclosefrom_np(&fa, n);
    /* PID 1 of the sandbox is a fork of the helper: its command line names the sandbox. */
    char title[SANDBOX_INSTANCE_SHORT + 1];
    memcpy(title, sb->instance, SANDBOX_INSTANCE_SHORT);
    title[SANDBOX_INSTANCE_SHORT] = '\0';
    char *argv[] = {(char *)"runcell-sandbox", title, NULL};
    char *envp[] = {NULL};
    int r = posix_spawn(ret_pid, sb->host->helper_path, &fa, NULL, argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    if (r)
        return err_set(r, "cannot start the sandbox helper %s: %s", sb->host->helper_path,
                       strerror(r));
    return 0;
}

static void handle_line(struct sandbox *sb, char *line)
{
    if (!strncmp(line, "pid ", 4)) {
        sb->init_pid = (pid_t)atoi(line + 4);
    } else if (!strncmp(line, "error ", 6)) {
        if (!sb->error)
            sb->error = xstrdup(line + 6);
    } else if (!strncmp(line, "exit ", 5)) {
        sb->exited = true;
        sb->exit_code = atoi(line + 5);
    } else if (!strncmp(line, "signal ", 7)) {
        sb->exited = true;
        sb->term_signal = atoi(line + 7);
    }
}

int sandbox_status_fd(const struct sandbox *sb)
{
    return sb->status_fd;
}

void sandbox_outcome(const struct sandbox *sb, struct sandbox_outcome *ret)
{
    *ret = (struct sandbox_outcome){.exited = sb->exited,
                                    .exit_code = sb->exit_code,
                                    .signal = sb->term_signal,
                                    .error = sb->error};
}

bool sandbox_limits_degraded(const struct sandbox *sb)
{
    return sb->limits_degraded;
}

double sandbox_started_ms(const struct sandbox *sb)
{
    return sb->started_ms;
}

int sandbox_poll_status(struct sandbox *sb)
{
    char chunk[4096];
    if (sb->status_fd < 0)
        return 1;
    for (;;) {
        ssize_t n = read(sb->status_fd, chunk, sizeof(chunk));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN)
                return 0;
            return -errno;
        }
        if (n == 0) {
            close(sb->status_fd);
            sb->status_fd = -1;
            return 1;
        }
        /* Lines are bounded by the helper; anything past 64 KiB is not from it. */
        if (buf_append(&sb->status_buf, chunk, (size_t)n) < 0)
            buf_reset(&sb->status_buf);
        char *start = sb->status_buf.data, *nl;
        while ((
            nl = memchr(start, '\n', sb->status_buf.len - (size_t)(start - sb->status_buf.data)))) {
            *nl = '\0';
            handle_line(sb, start);
            start = nl + 1;
        }
        size_t rest = sb->status_buf.len - (size_t)(start - sb->status_buf.data);
        memmove(sb->status_buf.data, start, rest);
        sb->status_buf.len = rest;
        sb->status_buf.data[rest] = '\0';
    }
}

static int wait_for_pid(struct sandbox *sb, pid_t helper)
{
    int wstatus;
    while (waitpid(helper, &wstatus, 0) < 0 && errno == EINTR)
        ;
    /* The helper wrote "pid N" (or an error) before exiting; pick it up. */
    sandbox_poll_status(sb);
    if (sb->init_pid > 0) {
        sb->pidfd = (int)syscall(SYS_pidfd_open, sb->init_pid, 0);
        sb->state = SANDBOX_RUNNING;
        return 0;
    }
    if (sb->error)
        return err_set(EIO, "sandbox setup failed: %s", sb->error);
    return err_set(EIO, "sandbox helper failed (wait status %d) without saying why", wstatus);
}

int sandbox_prepare(struct sandbox_host *host, const struct sandbox_spec *spec,
                    struct sandbox **ret)
{
    uint64_t seq = atomic_fetch_add(&host->seq, 1);
    struct sandbox *sb = xcalloc(1, sizeof(*sb));
    int r;
    sb->host = host;
    sb->pidfd = -1;
    sb->status_fd = -1;
    sb->exec_fd = -1;
    pthread_mutex_init(&sb->exec_lock, NULL);
    sb->started_ms = now_ms_f();
    buf_init(&sb->status_buf, 65536);
    sb->name = xasprintf("%s-%llu", host->owner_id, (unsigned long long)seq);
    _cleanup_free_ char *instance = random_hex(16);
    snprintf(sb->instance, sizeof(sb->instance), "%s", instance);
    char leaf[SANDBOX_INSTANCE_SHORT + 1];
    memcpy(leaf, sb->instance, SANDBOX_INSTANCE_SHORT);
    leaf[SANDBOX_INSTANCE_SHORT] = '\0';
    sb->limits_degraded = host->cgroup_mode == CGROUP_NONE || !host->privileged;
    if (host->cgroup_mode != CGROUP_NONE &&
        (r = cgroup_create(host, sb->name, leaf, &spec->limits, &sb->cgroup)) < 0) {
        sandbox_free(sb);
        return r;
    }
    if (sb->cgroup) {
        double cpu;
        uint64_t peak;
        cgroup_read_usage(sb->cgroup, &cpu, &peak, &sb->oom_kills_at_start);
    }
    *ret = sb;
    return 0;
}

/* From scratch: the runcell-sandbox helper builds the namespaces and the root. */
/* A helper that died early closes the pipe: EPIPE here, the reason on the status fd. The
 * SIGPIPE that comes with it is held off on this thread and taken, so that no process-wide
 * disposition is changed from library code. */
static int write_config(int fd, const char *config)
{
    sigset_t pipe_set, old;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    int r = write_all(fd, config, strlen(config));
    if (r == -EPIPE && !sigismember(&old, SIGPIPE)) {
        struct timespec now = {0};
        sigtimedwait(&pipe_set, NULL, &now);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return r;
}

static int start_with_helper(struct sandbox *sb, struct workspace *ws,
                             const struct sandbox_spec *spec)
{
    int cfg_pipe[2] = {-1, -1}, st_pipe[2] = {-1, -1};
    _cleanup_free_ char *config = NULL;
    pid_t helper;
    int r;
    sb->root_dir = xasprintf("%s/root-%s", ws->base, sb->name);
    /* The root directory goes to the sandbox's own root id, which builds the file system in
     * it: set-up beside the workspace, not a workspace file (those the file API gives to the
     * sandbox user). */
    if (mkdir(sb->root_dir, 0700) < 0 ||
        (sb->host->privileged && chown(sb->root_dir, ws->root_uid, ws->root_uid) < 0)) {
        r = err_set(errno, "cannot create %s: %s", sb->root_dir, strerror(errno));
        goto out;
    }
    if (pipe2(cfg_pipe, O_CLOEXEC) < 0 || pipe2(st_pipe, O_CLOEXEC) < 0) {
        r = err_set(errno, "pipe: %s", strerror(errno));
        goto out;
    }
    if ((r = spawn_helper(sb, spec, cfg_pipe[0], st_pipe[1], &helper)) < 0)
        goto out;
    close(TAKE_FD(cfg_pipe[0]));
    close(TAKE_FD(st_pipe[1]));
    sb->status_fd = TAKE_FD(st_pipe[0]);
    fd_set_nonblock(sb->status_fd, true);
    json_t *cfg = sandbox_config(sb, ws, spec);
    config = json_dumps(cfg, JSON_COMPACT);
    json_decref(cfg);
    (void)write_config(cfg_pipe[1], config);
    close(TAKE_FD(cfg_pipe[1]));
    r = wait_for_pid(sb, helper);
out:
    for (int i = 0; i < 2; i++) {
        if (cfg_pipe[i] >= 0)
            close(cfg_pipe[i]);
        if (st_pipe[i] >= 0)
            close(st_pipe[i]);
    }
    return r;
}

static int start_sandbox(struct sandbox_host *host, struct workspace *ws,
                         const struct sandbox_spec *spec, struct sandbox **ret)
{
    struct sandbox *sb;
    int r = sandbox_prepare(host, spec, &sb);
    if (r < 0)
        return r;
    /* Without cgroups the memory cap is RLIMIT_AS, which a clone of the template (its
     * address space already holds the data stack) would exceed at once: from scratch. */
    if (spec->from_template && host->template && host->cgroup_mode != CGROUP_NONE) {
        r = template_spawn(host, sb, ws, spec);
        if (r == 0) {
            *ret = sb;
            return 0;
        }
        /* Out of descriptors, a start from scratch would fail the same way, only later. */
        if (r == -EMFILE || r == -ENFILE) {
            sandbox_free(sb);
            return r;
        }
        /* The template could not serve: make this one from scratch. */
        log_warn("msg=\"template could not make the sandbox; starting from scratch\" "
                 "error=%s",
                 log_quote(err_msg()));
        sandbox_free(sb);
        if ((r = sandbox_prepare(host, spec, &sb)) < 0)
            return r;
    }
    if ((r = start_with_helper(sb, ws, spec)) < 0) {
        sandbox_free(sb);
        return r;
    }
    *ret = sb;
    return 0;
}

int sandbox_start(struct sandbox_host *host, struct workspace *ws, const struct sandbox_spec *spec,
                  struct sandbox **ret)
{
    if (!spec->exec_channel)
        return start_sandbox(host, ws, spec, ret);
    /* The exec channel travels as one more extra fd, the last (sandbox_config says so). */
    int sp[2], extra[17];
    if (spec->n_extra_fds > 15)
        return err_set(EINVAL, "too many fds for a sandbox with an exec channel");
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) < 0)
        return err_set(errno, "cannot make the sandbox's exec channel: %s", strerror(errno));
    struct sandbox_spec with = *spec;
    for (int i = 0; i < spec->n_extra_fds; i++)
        extra[i] = spec->extra_fds[i];
    extra[spec->n_extra_fds] = sp[1];
    with.extra_fds = extra;
    with.n_extra_fds = spec->n_extra_fds + 1;
    int r = start_sandbox(host, ws, &with, ret);
    close(sp[1]);
    if (r < 0) {
        close(sp[0]);
        return r;
    }
    (*ret)->exec_fd = sp[0];
    return 0;
}

/* ---- a connection into the sandbox's network namespace ---- */

struct netns_socket {
    int pidfd;
    pid_t pid;
    int fd; /* the socket, or -errno */
};

/* On a thread of its own: the sandbox's network namespace is entered, a socket made in it,
 * and the thread ends (its namespace goes with it: the daemon's threads never change). */
static void *socket_in_netns(void *arg)
{
    struct netns_socket *q = arg;
    int ns = -1;
    if (q->pidfd >= 0 && setns(q->pidfd, CLONE_NEWNET) == 0) {
        ns = -2; /* entered through the pidfd */
    } else {
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/ns/net", (int)q->pid);
        ns = open(path, O_RDONLY | O_CLOEXEC);
        if (ns < 0 || setns(ns, CLONE_NEWNET) < 0) {
            q->fd = -errno;
            if (ns >= 0)
                close(ns);
            return NULL;
        }
    }
    q->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (q->fd < 0)
        q->fd = -errno;
    if (ns >= 0)
        close(ns);
    return NULL;
}

int sandbox_connect(struct sandbox *sb, uint16_t port, int timeout_ms, int *ret_fd)
{
    if (sb->state != SANDBOX_RUNNING || sb->init_pid <= 0)
        return err_set(ESRCH, "the sandbox is not running");
    struct netns_socket q = {.pidfd = sb->pidfd, .pid = sb->init_pid, .fd = -EIO};
    pthread_t th;
    int e = pthread_create(&th, NULL, socket_in_netns, &q);
    if (e)
        return err_set(e, "cannot start a thread: %s", strerror(e));
    pthread_join(th, NULL);
    if (q.fd < 0)
        return err_set(-q.fd,
                       "cannot enter the sandbox's network namespace: %s (runcell needs root "
                       "for this)",
                       strerror(-q.fd));
    struct sockaddr_in sin = {
        .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int r = connect(q.fd, (struct sockaddr *)&sin, sizeof(sin)) == 0 ? 0 : -errno;
    if (r == -EINPROGRESS) {
        struct pollfd p = {.fd = q.fd, .events = POLLOUT};
        socklen_t len = sizeof(r);
        if (poll(&p, 1, timeout_ms) <= 0)
            r = -ETIMEDOUT;
        else if (getsockopt(q.fd, SOL_SOCKET, SO_ERROR, &r, &len) < 0)
            r = -errno;
        else
            r = -r;
    }
    if (r < 0) {
        close(q.fd);
        return err_set(-r, "nothing answers on port %u in the sandbox: %s", port, strerror(-r));
    }
    *ret_fd = q.fd;
    return 0;
}

/* ---- programs beside the payload ---- */

#define EXEC_REPLY_MS   10000 /* the spawner answers at once; its first start is a fork */
#define EXEC_REPLY_SIZE 4096

/* Sends req (reference stolen; its id set here) with fds, and waits for the reply of the same
 * id (an earlier request's late reply is dropped). 0 and *ret_reply (caller decrefs), or
 * -errno with err_msg(). */
static int exec_request(struct sandbox *sb, json_t *req, const int *fds, int n_fds,
                        json_t **ret_reply)
{
    if (sb->exec_fd < 0) {
        json_decref(req);
        return err_set(ENOTSUP, "this sandbox was started without a way to run more programs");
    }
    pthread_mutex_lock(&sb->exec_lock);
    int64_t id = ++sb->exec_seq;
    json_object_set_new(req, "id", json_integer(id));
    char *text = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    int r = text ? send_with_fds(sb->exec_fd, text, fds, n_fds) : -ENOMEM;
    free(text);
    if (r == -EPIPE || r == -ECONNRESET || r == -ECONNREFUSED)
        r = err_set(ESRCH, "the sandbox is gone");
    else if (r < 0)
        r = err_set(-r, "cannot reach the sandbox's process spawner: %s", strerror(-r));
    double deadline = now_ms_f() + EXEC_REPLY_MS;
    while (r == 0) {
        char buf[EXEC_REPLY_SIZE];
        struct pollfd p = {.fd = sb->exec_fd, .events = POLLIN};
        double left = deadline - now_ms_f();
        if (left <= 0 || poll(&p, 1, (int)left + 1) == 0) {
            r = err_set(ETIMEDOUT, "the sandbox's process spawner did not answer within %d s",
                        EXEC_REPLY_MS / 1000);
            break;
        }
        ssize_t n = recv(sb->exec_fd, buf, sizeof(buf) - 1, MSG_DONTWAIT);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n <= 0) {
            r = err_set(ESRCH, "the sandbox is gone");
            break;
        }
        json_t *reply = json_loadb(buf, (size_t)n, 0, NULL);
        if (json_is_object(reply) && json_integer_value(json_object_get(reply, "id")) == id) {
            *ret_reply = reply;
            break;
        }
        json_decref(reply); /* another request's, come too late */
    }
    pthread_mutex_unlock(&sb->exec_lock);
    return r;
}

/* The spawner's error in a reply, as a message (cut, and only printable ASCII kept: the
 * spawner runs as the sandbox user). */
static int exec_refused(json_t *reply, int err)
{
    const char *why = json_string_value(json_object_get(reply, "error"));
    char clean[320];
    size_t n = 0;
    for (const char *p = why ? why : "no answer"; *p && n < sizeof(clean) - 1; p++)
        clean[n++] = *p >= 0x20 && *p < 0x7f ? *p : '?';
    clean[n] = '\0';
    json_decref(reply);
    return err_set(err, "%s", clean);
}

int sandbox_exec(struct sandbox *sb, const struct sandbox_exec *x, int *ret_pid)
{
    size_t bytes = 0;
    for (char *const *a = x->argv; a && *a; a++)
        bytes += strlen(*a) + 1;
    for (char *const *e = x->env; e && *e; e++)
        bytes += strlen(*e) + 1;
    if (bytes > SANDBOX_EXEC_MAX_ARGS)
        return err_set(E2BIG,
                       "the program's arguments and environment are %zu bytes; at most "
                       "%u are taken",
                       bytes, SANDBOX_EXEC_MAX_ARGS);
    if (!x->argv || !x->argv[0] || !x->cwd || x->cwd[0] != '/')
        return err_set(EINVAL, "a program needs arguments and an absolute working directory");
    json_t *req = json_pack("{s:s,s:o,s:o,s:s}", "op", "exec", "argv", strv_json(x->argv), "env",
                            strv_json(x->env), "cwd", x->cwd);
    int fds[4] = {x->stdin_fd, x->stdout_fd, x->stderr_fd, x->status_fd};
    json_t *reply = NULL;
    int r = exec_request(sb, req, fds, 4, &reply);
    if (r < 0)
        return r;
    json_t *pid = json_object_get(reply, "pid");
    if (!json_is_integer(pid) || json_integer_value(pid) <= 0 ||
        json_integer_value(pid) > INT32_MAX)
        return exec_refused(reply, json_is_true(json_object_get(reply, "asked"))  ? EINVAL
                                   : json_is_true(json_object_get(reply, "busy")) ? EAGAIN
                                                                                  : EIO);
    *ret_pid = (int)json_integer_value(pid);
    json_decref(reply);
    return 0;
}

int sandbox_exec_signal(struct sandbox *sb, int pid, int sig)
{
    json_t *reply = NULL;
    int r = exec_request(sb, json_pack("{s:s,s:i,s:i}", "op", "signal", "pid", pid, "signal", sig),
                         NULL, 0, &reply);
    if (r < 0)
        return r;
    if (!json_is_true(json_object_get(reply, "ok")))
        return exec_refused(reply, ESRCH);
    json_decref(reply);
    return 0;
}

/* The pidfd stays open until sandbox_free: other threads may be signalling through it, and a
 * closed number could be reused by another sandbox's pidfd. Signals to a process that has
 * exited fail with ESRCH. */
static void reap(struct sandbox *sb, int options)
{
    if (sb->state == SANDBOX_EXITED || sb->init_pid <= 0)
        return;
    if (sb->foreign) {
        /* The template reaps its clones; once the status pipe is closed, init is gone (or
         * going), and its pid may already name some other process. */
        sb->state = SANDBOX_EXITED;
        return;
    }
    int wstatus;
    struct rusage ru;
    pid_t p;
    while ((p = wait4(sb->init_pid, &wstatus, options, &ru)) < 0 && errno == EINTR)
        ;
    if (p == sb->init_pid || (p < 0 && errno == ECHILD)) {
        sb->state = SANDBOX_EXITED;
        if (p == sb->init_pid) {
            sb->ru_cpu_ms = (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000.0 +
                            (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000.0;
            sb->ru_maxrss_kb = (uint64_t)ru.ru_maxrss;
        }
    }
}

bool sandbox_wait_for(struct sandbox *sb, int timeout_ms)
{
    double deadline = now_ms_f() + timeout_ms;
    while (sb->status_fd >= 0) {
        double left = timeout_ms < 0 ? -1 : deadline - now_ms_f();
        if (timeout_ms >= 0 && left <= 0)
            return false;
        struct pollfd pfd = {.fd = sb->status_fd, .events = POLLIN};
        if (poll(&pfd, 1, timeout_ms < 0 ? -1 : (int)left + 1) < 0 && errno != EINTR)
            break;
        if (sandbox_poll_status(sb) != 0)
            break;
    }
    reap(sb, 0);
    return true;
}

void sandbox_wait(struct sandbox *sb)
{
    sandbox_wait_for(sb, -1);
}

int sandbox_signal(struct sandbox *sb, int sig)
{
    if (sb->pidfd >= 0 && syscall(SYS_pidfd_send_signal, sb->pidfd, sig, NULL, 0) == 0)
        return 0;
    if (sb->pidfd < 0 && sb->init_pid > 0 && sb->state == SANDBOX_RUNNING)
        return kill(sb->init_pid, sig) < 0 ? -errno : 0;
    return -ESRCH;
}

/* Each process of sb's cgroups but its init, by pid, to fn; how many fn counted. */
static size_t for_each_payload(struct sandbox *sb, char **files,
                               size_t (*fn)(long pid, const char *line, void *ctx), void *ctx)
{
    size_t n = 0;
    for (char **f = files; *f; f++) {
        _cleanup_free_ char *text = NULL;
        if (read_file(*f, 1 << 20, &text, NULL) < 0)
            continue;
        for (char *line = text, *nl; line && *line; line = nl ? nl + 1 : NULL) {
            nl = strchr(line, '\n');
            if (nl)
                *nl = '\0';
            char *end;
            long pid = strtol(line, &end, 10);
            if (pid > 1 && !*end && pid != sb->init_pid)
                n += fn(pid, line, ctx);
        }
    }
    return n;
}

/* SIGCONT to a process not signalled yet (ctx: the pids done): 1 when sent. */
static size_t continue_once(long pid, const char *line, void *ctx)
{
    json_t *done = ctx;
    if (json_object_get(done, line))
        return 0;
    json_object_set_new(done, line, json_true());
    (void)kill((pid_t)pid, SIGCONT);
    return 1;
}

/* SIGSTOP to a process that is not stopped (nor gone): 1 when sent. */
static size_t stop_running(long pid, const char *line, void *ctx)
{
    char path[40], buf[256];
    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
    if (n <= 0)
        return 0; /* gone */
    buf[n] = '\0';
    const char *paren = strrchr(buf, ')');
    char state = paren && paren[1] == ' ' ? paren[2] : '?';
    if (state == 'T' || state == 't' || state == 'Z' || state == 'X')
        return 0;
    (void)kill((pid_t)pid, SIGSTOP);
    return 1;
}

/* Without a freezer: SIGCONT to each process once, again while new ones appear; or SIGSTOP
 * until every one is seen stopped (a process stopped cannot fork, nor continue another; one
 * that forked, or continued one, as it was read is found the next pass). -EAGAIN when some
 * still ran after PAUSE_PASSES passes (in a disk wait, or continued again and again). */
#define PAUSE_PASSES 200
static int signal_payloads(struct sandbox *sb, int sig)
{
    if (!sb->cgroup)
        return -ENODATA;
    _cleanup_strv_ char **files = cgroup_procs_files(sb->cgroup);
    char *leaf = cgroup_leaf_procs_file(sb->cgroup);
    if (leaf) {
        files = strv_push(files, leaf);
        free(leaf);
    }
    if (sig == SIGSTOP) {
        for (int pass = 0; pass < PAUSE_PASSES; pass++) {
            if (!for_each_payload(sb, files, stop_running, NULL))
                return 0;
            usleep(500); /* the signals are delivered as the processes next run */
        }
        return -EAGAIN;
    }
    json_t *done = json_object();
    for (int pass = 0; pass < 16; pass++)
        if (!for_each_payload(sb, files, continue_once, done))
            break;
    json_decref(done);
    return 0;
}

int sandbox_pause(struct sandbox *sb, bool pause)
{
    /* The v2 freezer stops every task where it stands, which no task can see or undo; on v1
     * each of the payload's processes gets SIGSTOP (init, which only reaps, runs on). */
    int r = sb->cgroup ? cgroup_freeze(sb->cgroup, pause) : -ENODATA;
    if (r != -EOPNOTSUPP)
        return r;
    r = signal_payloads(sb, pause ? SIGSTOP : SIGCONT);
    if (r == -EAGAIN)
        (void)signal_payloads(sb, SIGCONT); /* none stays stopped by a pause that failed */
    return r;
}

void sandbox_kill(struct sandbox *sb)
{
    /* Killing PID 1 of the namespace makes the kernel kill every other process in it;
     * the cgroup sweep catches anything mid-fork. */
    sandbox_signal(sb, SIGKILL);
    if (sb->cgroup)
        cgroup_kill_all(sb->cgroup);
}

static int usage(struct sandbox *sb, struct sandbox_usage *ret, bool oom)
{
    memset(ret, 0, sizeof(*ret));
    if (!sb->cgroup) {
        /* Without a cgroup, the rusage of init after it is reaped: it covers every process
         * of the sandbox, since init waited for them all. */
        ret->cpu_ms = sb->ru_cpu_ms;
        ret->memory_peak_kb = sb->ru_maxrss_kb;
        ret->memory_peak_scope = "session";
        return sb->state == SANDBOX_EXITED ? 0 : -ENODATA;
    }
    uint64_t ooms = 0;
    cgroup_usage_reopen(sb->cgroup);
    cgroup_read_usage(sb->cgroup, &ret->cpu_ms, &ret->memory_peak_kb, oom ? &ooms : NULL);
    ret->oom_killed = ooms > sb->oom_kills_at_start;
    ret->memory_peak_scope = cgroup_peak_per_cell(sb->cgroup) ? "cell" : "session";
    return 0;
}

int sandbox_usage(struct sandbox *sb, struct sandbox_usage *ret)
{
    return usage(sb, ret, true);
}

int sandbox_usage_alive(struct sandbox *sb, struct sandbox_usage *ret)
{
    return usage(sb, ret, false);
}

double sandbox_cpu_ms(struct sandbox *sb)
{
    double ms = sb->ru_cpu_ms;
    if (sb->cgroup) {
        cgroup_usage_reopen(sb->cgroup);
        (void)cgroup_read_cpu(sb->cgroup, &ms);
    }
    return ms;
}

int sandbox_memory_now(struct sandbox *sb, uint64_t *ret_used, uint64_t *ret_cache)
{
    return sb->cgroup ? cgroup_read_memory(sb->cgroup, ret_used, ret_cache) : -ENODATA;
}

int sandbox_set_limits(struct sandbox *sb, const struct sandbox_limits *limits)
{
    return sb->cgroup ? cgroup_apply_limits(sb->cgroup, limits) : -ENODATA;
}

void sandbox_reset_peak(struct sandbox *sb)
{
    if (sb->cgroup) {
        cgroup_usage_reopen(sb->cgroup);
        cgroup_reset_peak(sb->cgroup);
    }
}

void sandbox_usage_idle(struct sandbox *sb)
{
    if (sb->cgroup && !sb->cgroup->usage_closed)
        cgroup_usage_close(sb->cgroup);
}

void sandbox_free(struct sandbox *sb)
{
    if (!sb)
        return;
    if (sb->state == SANDBOX_RUNNING) {
        sandbox_kill(sb);
        reap(sb, 0);
    }
    if (sb->status_fd >= 0)
        close(sb->status_fd);
    if (sb->pidfd >= 0)
        close(sb->pidfd);
    if (sb->exec_fd >= 0)
        close(sb->exec_fd);
    pthread_mutex_destroy(&sb->exec_lock);
    cgroup_free(sb->cgroup);
    if (sb->root_dir)
        rmdir(sb->root_dir);
    buf_release(&sb->status_buf);
    free(sb->name);
    free(sb->root_dir);
    free(sb->error);
    free(sb);
}
