/* template.c - the daemon's side of the template: starting it, asking it for sandboxes,
 * replacing it when it dies or its files change, and keeping retired ones until their
 * sessions end. */
#include "sandbox/cgroup-int.h"
#include "sandbox/sandbox-int.h"
#include "sandbox/spawn-int.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <linux/mount.h>
#include <poll.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define TEMPLATE_READY_MS 120000
#define SPAWN_REPLY_MS    20000
#define MAX_RETIRED       16

struct template
{
    struct workspace *ws; /* its own (small, empty) workspace */
    struct sandbox *sb;   /* the sandbox the template runs in */
    int ctl_fd;           /* SOCK_SEQPACKET: requests out, replies (+ pidfds) in */
    char *profile;
    double ready_ms;
};

struct template_state {
    pthread_mutex_t lock;
    struct template *current;
    struct template *retired[MAX_RETIRED]; /* their init lingers while their sessions live */
};

static struct template_state state = {.lock = PTHREAD_MUTEX_INITIALIZER};
/* The current template's start-up time in µs (0: none), readable without state.lock, which
 * a spawn holds while a new template starts. */
static _Atomic uint64_t current_ready_us;

static void set_current(struct template *t)
{
    state.current = t;
    atomic_store(&current_ready_us, t ? (uint64_t)(t->ready_ms * 1000.0) : 0);
}

/* What the template was built from: when any of it changes, a new template is made. */
static char *profile_of(const struct sandbox_host *host)
{
    /* The kernel, the helper, and the module whose clone code locks sessions down. */
    const char *files[] = {"kernel/kernel.py", "kernel/_runcell_template*.so", "runcell-sandbox",
                           NULL};
    struct buf b;
    buf_init(&b, 0);
    for (const char **f = files; *f; f++) {
        _cleanup_free_ char *pattern = xasprintf("%s/%s", host->libexec_dir, *f);
        glob_t g;
        int r = glob(pattern, 0, NULL, &g);
        if (r == GLOB_ABORTED || r == GLOB_NOSPACE) { /* not looked at (out of fds): unknown */
            buf_release(&b);
            return NULL;
        }
        if (r != 0)
            continue;
        for (size_t i = 0; i < g.gl_pathc; i++) {
            struct stat st;
            if (stat(g.gl_pathv[i], &st) == 0)
                buf_printf(&b, "%s:%lld.%09ld:%lld;", g.gl_pathv[i], (long long)st.st_mtim.tv_sec,
                           st.st_mtim.tv_nsec, (long long)st.st_size);
        }
        globfree(&g);
    }
    struct stat st;
    if (stat("/usr/lib/python3/dist-packages", &st) == 0)
        buf_printf(&b, "dist-packages:%lld", (long long)st.st_mtim.tv_sec);
    return buf_detach(&b, NULL);
}

static void template_free(struct template *t)
{
    if (!t)
        return;
    if (t->ctl_fd >= 0)
        close(t->ctl_fd);
    sandbox_free(t->sb);
    workspace_free(t->ws);
    free(t->profile);
    free(t);
}

/* Reads one message (and an fd, if one came) within timeout_ms. Returns its length, 0 at
 * EOF, -errno on error or timeout (-EMFILE: the fd could not be installed here). */
static ssize_t recv_msg(int fd, char *buf, size_t size, int *ret_fd, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, timeout_ms);
    if (r <= 0)
        return r == 0 ? -ETIMEDOUT : -errno;
    int fds[1], n_fds;
    ssize_t n = recv_with_fds(fd, buf, size, 0, fds, 1, &n_fds);
    if (ret_fd)
        *ret_fd = n > 0 && n_fds ? fds[0] : -1;
    else if (n > 0 && n_fds)
        close(fds[0]);
    return n;
}

static int template_new(struct sandbox_host *host, struct template **ret)
{
    struct template *t = xcalloc(1, sizeof(*t));
    int sp[2] = {-1, -1}, devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    _cleanup_strv_ char **env = sandbox_default_env();
    _cleanup_free_ char *kernel_dir = xasprintf("%s/kernel", host->libexec_dir);
    char msg[4096];
    int r;
    t->ctl_fd = -1;
    t->profile = profile_of(host);
    double t0 = now_ms_f();
    if ((r = workspace_new(host, 0, &t->ws)) < 0)
        goto fail;
    /* An empty directory (not a tmpfs) the template's root owns: its working directory (the
     * template's set-up; no sandbox user is involved). */
    if (chown(t->ws->dir, host->uid_base, host->uid_base) < 0) {
        r = err_set(errno, "cannot give %s to the template: %s", t->ws->dir, strerror(errno));
        goto fail;
    }
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) < 0) {
        r = err_set(errno, "socketpair: %s", strerror(errno));
        goto fail;
    }
    /* Forked processes cannot use a BLAS thread pool started before the fork. */
    env = strv_push(env, "OPENBLAS_NUM_THREADS=1");
    env = strv_push(env, "OMP_NUM_THREADS=1");
    char *argv[] = {(char *)"/usr/bin/python3", (char *)"/.runcell/kernel.py", (char *)"--template",
                    NULL};
    /* The empty workspace directory doubles as the mount point its clones bind a session's
     * network directory on. */
    const char *binds[] = {kernel_dir, "/.runcell", t->ws->dir, SANDBOX_NET_DIR, NULL};
    int extra[] = {sp[1]};
    struct sandbox_spec spec = {
        .argv = argv,
        .env = env,
        .stdin_fd = devnull,
        .stdout_fd = devnull,
        .stderr_fd = STDERR_FILENO,
        .extra_fds = extra,
        .n_extra_fds = 1,
        .ro_binds = binds,
        .limits = {.memory_mb = 2048, .pids = 64, .disk_mb = 64},
        .template_profile = true,
    };
    sandbox_limits_fill_defaults(&spec.limits);
    if ((r = sandbox_start(host, t->ws, &spec, &t->sb)) < 0)
        goto fail;
    close(TAKE_FD(sp[1]));
    t->ctl_fd = TAKE_FD(sp[0]);
    ssize_t n = recv_msg(t->ctl_fd, msg, sizeof(msg), NULL, TEMPLATE_READY_MS);
    if (n <= 0) {
        sandbox_poll_status(t->sb);
        r = err_set(EIO, "the template did not become ready: %s",
                    t->sb->error ? t->sb->error
                    : n == 0     ? "it exited"
                                 : strerror((int)-n));
        goto fail;
    }
    t->ready_ms = now_ms_f() - t0;
    log_info("msg=\"template ready\" ready_ms=%.0f report=%s", t->ready_ms, msg);
    close(devnull);
    *ret = t;
    return 0;
fail:
    if (sp[0] >= 0)
        close(sp[0]);
    if (sp[1] >= 0)
        close(sp[1]);
    close(devnull);
    template_free(t);
    return r;
}

/* Frees retired templates whose sessions have all ended (their init has exited). */
static void sweep_retired(void)
{
    for (int i = 0; i < MAX_RETIRED; i++) {
        struct template *t = state.retired[i];
        if (t && sandbox_poll_status(t->sb) == 1) {
            template_free(t);
            state.retired[i] = NULL;
        }
    }
}

static void retire(struct template *t)
{
    if (!t)
        return;
    /* Closing the channel ends the template; its init stays while sessions live. */
    close(t->ctl_fd);
    t->ctl_fd = -1;
    for (int i = 0; i < MAX_RETIRED; i++) {
        if (!state.retired[i]) {
            state.retired[i] = t;
            return;
        }
    }
    template_free(t); /* no room: its sessions end with it */
}

/* A live template with the current profile, started if needed; caller holds state.lock. */
static int current_template(struct sandbox_host *host, struct template **ret)
{
    struct template *t = state.current;
    sweep_retired();
    if (t) {
        _cleanup_free_ char *profile = profile_of(host);
        bool alive = sandbox_poll_status(t->sb) == 0 && !t->sb->exited;
        if (alive && (!profile || !t->profile || !strcmp(profile, t->profile))) {
            *ret = t;
            return 0;
        }
        log_info("msg=\"replacing the template\" reason=%s",
                 alive ? "profile changed" : "it exited");
        retire(t);
        set_current(NULL);
    }
    struct template *fresh = NULL;
    int r = template_new(host, &fresh);
    if (r == 0) {
        set_current(fresh);
        *ret = fresh;
    }
    return r;
}

int sandbox_host_start_template(struct sandbox_host *host)
{
    if (!host->privileged)
        return err_set(EPERM, "the template needs root: it maps the ids of every sandbox");
    pthread_mutex_lock(&state.lock);
    struct template *t;
    int r = current_template(host, &t);
    pthread_mutex_unlock(&state.lock);
    if (r == 0)
        host->template = t;
    return r;
}

double sandbox_host_template_ready_ms(struct sandbox_host *host)
{
    (void)host;
    return (double)atomic_load(&current_ready_us) / 1000.0;
}

void template_stop(struct sandbox_host *host)
{
    pthread_mutex_lock(&state.lock);
    template_free(state.current);
    set_current(NULL);
    for (int i = 0; i < MAX_RETIRED; i++) {
        template_free(state.retired[i]);
        state.retired[i] = NULL;
    }
    host->template = NULL;
    pthread_mutex_unlock(&state.lock);
}

/* The pid a pidfd refers to, in our PID namespace. */
static pid_t pidfd_pid(int pidfd)
{
    char path[64], text[1024];
    snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", pidfd);
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd < 0 ? -1 : read(fd, text, sizeof(text) - 1);
    if (n <= 0)
        return -1;
    text[n] = '\0';
    char *p = strstr(text, "\nPid:");
    return p ? (pid_t)atoi(p + 5) : -1;
}

/* Sends the request with its fds and turns the reply into a running sandbox. -EPIPE: the
 * template is gone (its channel closed), and nothing was made. */
static int ask(struct template *t, struct sandbox *sb, const char *json, const int *fds, int n)
{
    char reply[4096];
    int pidfd = -1;
    int r = send_with_fds(t->ctl_fd, json, fds, n);
    if (r == -EPIPE || r == -ECONNRESET)
        return err_set(EPIPE, "cannot reach the template: it exited");
    if (r < 0)
        return err_set(-r, "cannot reach the template: %s", strerror(-r));
    ssize_t len = recv_msg(t->ctl_fd, reply, sizeof(reply), &pidfd, SPAWN_REPLY_MS);
    /* A clone the template made before dying waits for its id maps, which never come:
     * it exits on its own. */
    if (len == 0 || len == -ECONNRESET)
        return err_set(EPIPE, "the template did not answer: it exited");
    if (len == -EMFILE) /* the clone, never given its id maps, exits on its own */
        return err_set(EMFILE, "the template's reply lost its descriptors: this process is "
                               "out of open files");
    if (len < 0)
        return err_set(EIO, "the template did not answer: %s", strerror((int)-len));
    json_t *j = json_loads(reply, 0, NULL);
    const char *error = json_string_value(json_object_get(j, "error"));
    pid_t pid = pidfd >= 0 ? pidfd_pid(pidfd) : -1;
    if (error || pid <= 0) {
        r = err_set(EIO, "the template could not make the sandbox: %s",
                    error ? error : "no pid in its reply");
        json_decref(j);
        if (pidfd >= 0)
            close(pidfd);
        return r;
    }
    json_decref(j);
    sb->init_pid = pid;
    sb->pidfd = pidfd;
    sb->foreign = true;
    sb->state = SANDBOX_RUNNING;
    return 0;
}

/* The fds a spawn request opens for itself, after the ones it borrows: the clone joins its
 * cgroup through cgroup.procs files we opened (the kernel checks the opener's credentials),
 * and binds other than the kernel directory (which the template's root has) go in like
 * the workspace, detached mounts whose mount points the template's root must have. Appends
 * to fds (*n grows; the caller closes what was appended, whatever this returns) and sets
 * *ret_binds to the binds' sandbox paths. */
static int open_request_fds(struct sandbox *sb, const struct sandbox_spec *spec, int *fds, int *n,
                            json_t **ret_binds)
{
    _cleanup_strv_ char **procs = sb->cgroup ? cgroup_procs_files(sb->cgroup) : NULL;
    /* the leaf's after the cgroup's: the clone joins it once its cgroup namespace is made */
    char *leaf = sb->cgroup ? cgroup_leaf_procs_file(sb->cgroup) : NULL;
    if (leaf)
        procs = strv_push(procs, leaf);
    free(leaf);
    *ret_binds = json_array();
    for (char **p = procs; p && *p; p++) {
        int fd = open(*p, O_WRONLY | O_CLOEXEC);
        if (fd < 0)
            return err_set(errno, "cannot open %s: %s", *p, strerror(errno));
        fds[(*n)++] = fd;
    }
    for (const char *const *b = spec->ro_binds; b && b[0] && b[1] && *n < 30; b += 2) {
        if (!strcmp(b[1], "/.runcell"))
            continue;
        if (strcmp(b[1], SANDBOX_NET_DIR) && strcmp(b[1], SANDBOX_TRUST_STORE))
            return err_set(EINVAL, "the template has no mount point for %s", b[1]);
        int fd = (int)syscall(SYS_open_tree, AT_FDCWD, b[0], OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
        if (fd < 0)
            return err_set(errno, "cannot take %s: %s", b[0], strerror(errno));
        fds[(*n)++] = fd;
        json_array_append_new(*ret_binds, json_string(b[1]));
    }
    return 0;
}

/* The clone's configuration (a sandbox's, plus what only a clone needs); caller frees. */
static char *request_config(struct sandbox_host *host, struct sandbox *sb, struct workspace *ws,
                            const struct sandbox_spec *spec, json_t *binds)
{
    json_t *cfg = sandbox_config(sb, ws, spec);
    json_object_set_new(cfg, "template_binds", json_incref(binds));
    json_object_set_new(cfg, "ns_root_uid", json_integer(ws->root_uid - host->uid_base));
    json_object_set_new(cfg, "ns_uid", json_integer(ws->uid - host->uid_base));
    char *json = json_dumps(cfg, JSON_COMPACT);
    json_decref(cfg);
    return json;
}

/* Sends the request to the current template; one that died after it was found alive (its
 * init had not said so yet) is replaced, and the request goes to its successor rather than
 * falling back to a cold start. */
static int ask_current(struct sandbox_host *host, struct sandbox *sb, const char *json,
                       const int *fds, int n)
{
    pthread_mutex_lock(&state.lock);
    struct template *t;
    int r = current_template(host, &t);
    if (r == 0)
        r = ask(t, sb, json, fds, n);
    if (r == -EPIPE) {
        log_info("msg=\"replacing the template\" reason=\"it exited during a request\"");
        retire(state.current);
        set_current(NULL);
        r = current_template(host, &t);
        if (r == 0)
            r = ask(t, sb, json, fds, n);
    }
    pthread_mutex_unlock(&state.lock);
    return r;
}

int template_spawn(struct sandbox_host *host, struct sandbox *sb, struct workspace *ws,
                   const struct sandbox_spec *spec)
{
    int st_pipe[2] = {-1, -1}, fds[32], n = 0, r;
    _cleanup_close_ int tree = -1;
    json_t *binds = NULL;
    if (spec->n_extra_fds > 8)
        return err_set(EINVAL, "too many fds for a template-made sandbox");
    if (pipe2(st_pipe, O_CLOEXEC) < 0)
        return err_set(errno, "pipe: %s", strerror(errno));
    /* The workspace goes in as a detached copy of its mount, attached by the clone. */
    tree = (int)syscall(SYS_open_tree, AT_FDCWD, ws->dir, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    if (tree < 0) {
        r = err_set(errno, "cannot take the workspace %s: %s", ws->dir, strerror(errno));
        goto out;
    }
    fds[n++] = st_pipe[1];
    fds[n++] = spec->stdin_fd;
    fds[n++] = spec->stdout_fd;
    fds[n++] = spec->stderr_fd;
    fds[n++] = tree;
    for (int i = 0; i < spec->n_extra_fds; i++)
        fds[n++] = spec->extra_fds[i];
    int first_opened = n;
    r = open_request_fds(sb, spec, fds, &n, &binds);
    if (r == 0) {
        _cleanup_free_ char *json = request_config(host, sb, ws, spec, binds);
        r = ask_current(host, sb, json, fds, n);
    }
    if (r == 0) {
        sb->status_fd = TAKE_FD(st_pipe[0]);
        fd_set_nonblock(sb->status_fd, true);
    }
    for (int i = first_opened; i < n; i++)
        close(fds[i]);
    json_decref(binds);
out:
    if (st_pipe[0] >= 0)
        close(st_pipe[0]);
    close(st_pipe[1]);
    return r;
}
