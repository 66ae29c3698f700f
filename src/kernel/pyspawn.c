/* pyspawn.c - the _runcell_template Python module: how the template (a Python with the data
 * stack imported) makes a session sandbox by cloning itself.
 *
 * serve(ctl_fd) clones the template into new user, mount, PID, network, IPC and UTS namespaces
 * when a request waits on the daemon's channel; the clone, not the template, reads it (the
 * session's configuration and fds), so no byte of any session's request enters the memory the
 * template passes on to later clones. The clone becomes PID 1 of the session (the same init
 * code as runcell-sandbox's):
 * it joins its cgroup through fds the daemon opened, takes a fresh /tmp, /dev/shm and /proc,
 * attaches the workspace (a detached mount the daemon made), and forks the kernel, which
 * drops every privilege, applies Landlock and seccomp, and returns into Python. The template
 * itself writes the clone's id maps (it holds CAP_SETUID in its own namespace; the clone tells
 * it which ids, the only thing of a request the template learns) and gets the clone's pid
 * back. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <jansson.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/mount.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/base.h"
#include "sandbox/helper/helper.h"

/* The fds of a spawn request, in this order. */
enum { FD_STATUS, FD_STDIN, FD_STDOUT, FD_STDERR, FD_WORKSPACE, FD_FIXED };
#define MAX_FDS 32
#define HIGH_FD 300
/* The largest request; the daemon's are a few kB (a configuration with its environment). */
#define MAX_REQUEST (1 << 20)

/* What the clone tells the template about the request it took: the ids to map, or why it
 * could not take it (a message of ours, never a part of the request). One write, atomic on
 * a pipe. */
struct clone_report {
    int32_t err; /* 0, or an errno */
    uint32_t ns_root_uid, ns_uid;
    char msg[200];
};

static int write_map(pid_t pid, const char *file, unsigned ns_root, unsigned ns_user)
{
    char path[64], map[96];
    snprintf(path, sizeof(path), "/proc/%d/%s", pid, file);
    snprintf(map, sizeof(map), "0 %u 1\n%d %u 1\n", ns_root, SANDBOX_UID, ns_user);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    ssize_t n = (ssize_t)strlen(map);
    int ok = fd >= 0 && write(fd, map, (size_t)n) == n;
    int err = errno;
    if (fd >= 0)
        close(fd);
    errno = err;
    return ok ? 0 : -1;
}

/* Puts the request's fds where the init and payload code expect them (stdio on 0-2, status
 * on HELPER_FD_STATUS, extras from HELPER_FD_EXTRA), keeps the workspace and cgroup fds high,
 * and closes everything else the template had open. */
static int arrange_fds(const int *fds, int n, int n_extra, int *ret_ws, int *ret_kept, int n_kept)
{
    int high[MAX_FDS];
    bool keep[MAX_FDS] = {false};
    for (int i = 0; i < n; i++)
        if ((high[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, HIGH_FD + i)) < 0)
            return fail_errno("fcntl");
    int targets[] = {
        [FD_STATUS] = HELPER_FD_STATUS, [FD_STDIN] = 0, [FD_STDOUT] = 1, [FD_STDERR] = 2};
    for (int i = FD_STATUS; i <= FD_STDERR; i++)
        if (dup2(high[i], targets[i]) < 0)
            return fail_errno("dup2");
    for (int i = 0; i < n_extra; i++)
        if (dup2(high[FD_FIXED + i], HELPER_FD_EXTRA + i) < 0)
            return fail_errno("dup2");
    *ret_ws = high[FD_WORKSPACE];
    keep[FD_WORKSPACE] = true;
    for (int i = 0; i < n_kept; i++) {
        ret_kept[i] = high[FD_FIXED + n_extra + i];
        keep[FD_FIXED + n_extra + i] = true;
    }
    for (int i = 0; i < n; i++)
        if (!keep[i])
            close(high[i]);
    /* What is left of the template's own fds goes: 3, and everything up to our copies. */
    close(3);
    syscall(SYS_close_range, HELPER_FD_EXTRA + n_extra, HIGH_FD - 1, 0);
    syscall(SYS_close_range, HIGH_FD + n, ~0U, 0);
    status_fd = HELPER_FD_STATUS;
    return 0;
}

/* cg: n cgroup.procs fds of the session's cgroup, then (when leaf) its leaf's. */
static int join_cgroup(const int *cg, int n, bool leaf)
{
    for (int i = 0; i < n; i++) {
        if (write(cg[i], "0", 1) != 1)
            return fail_errno("cannot join the session's cgroup");
        close(cg[i]);
    }
    /* Only now, so that the namespace's root is the session's own cgroup; the leaf below
     * it, named after the sandbox, is what /proc/self/cgroup then shows. */
    if (n && unshare(CLONE_NEWCGROUP) < 0)
        return fail_errno("cannot create the cgroup namespace");
    return leaf ? cgroup_leaf_join(cg[n]) : 0;
}

static int attach(int fd, const char *dst)
{
    if (syscall(SYS_move_mount, fd, "", AT_FDCWD, dst, MOVE_MOUNT_F_EMPTY_PATH) < 0)
        return fail_errno("cannot attach %s", dst);
    close(fd);
    return 0;
}

static int session_mounts(const struct helper_config *cfg, int ws_fd, const int *bind_fds)
{
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        return fail_errno("cannot make the session's mounts private");
    if (scratch_mounts(cfg, "/") < 0 ||
        mount_tmpfs("/dev/shm", MS_NOSUID | MS_NODEV, "mode=1777,size=%llum,nr_inodes=4096",
                    (unsigned long long)cfg->shm_mb) < 0)
        return -1;
    if (attach(ws_fd, "/workspace") < 0 || home_bind("/") < 0)
        return -1;
    for (int i = 0; cfg->template_binds[i]; i++)
        if (attach(bind_fds[i], cfg->template_binds[i]) < 0)
            return -1;
    /* PID 1 of the new PID namespace mounts the /proc that shows only the session. */
    if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
        return fail_errno("cannot mount /proc in the session");
    return proc_hide("/proc", cfg->instance);
}

/* The seccomp filter, compiled once by the template before its first clone and shared by
 * every clone (NULL when that failed: each clone then builds its own, and reports why it
 * cannot). Compiling in each clone allocated all over the heap the template shares. */
static void *template_filter;

/* Runs in the clone: becomes the session's init. Returns only in the kernel (0), after its
 * lockdown; init itself supervises and exits. */
static int session_init(struct helper_config *cfg, const int *fds, int n, int sync_fd)
{
    char go, comm[16] = "";
    int ws_fd = -1, kept[16], n_cg = (int)strv_len(cfg->cgroup_procs);
    int n_leaf = cfg->cgroup_leaf_procs ? 1 : 0, n_binds = (int)strv_len(cfg->template_binds);
    if (read(sync_fd, &go, 1) != 1)
        _exit(1);
    close(sync_fd);
    if (arrange_fds(fds, n, cfg->extra_fds, &ws_fd, kept, n_cg + n_leaf + n_binds) < 0)
        _exit(1);
    setsid();
    /* Named like the init runcell-sandbox makes, not like the template it was cloned from;
     * the kernel takes the interpreter's name back. */
    prctl(PR_GET_NAME, comm);
    prctl(PR_SET_NAME, "runcell-sandbox");
    if (setgroups(0, NULL) < 0 || setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0) {
        fail_errno("cannot switch to the session's root id");
        _exit(1);
    }
    prctl(PR_SET_DUMPABLE, 0);
    if (join_cgroup(kept, n_cg, n_leaf) < 0)
        _exit(1);
    if (sethostname(cfg->hostname, strlen(cfg->hostname)) < 0) {
        fail_errno("cannot set the session's host name");
        _exit(1);
    }
    if (net_loopback_up() < 0 || session_mounts(cfg, ws_fd, kept + n_cg + n_leaf) < 0 ||
        chdir("/") < 0)
        _exit(1);
    void *filter = !cfg->seccomp ? NULL : template_filter ? template_filter : seccomp_build();
    if (cfg->seccomp && !filter)
        _exit(1);
    if (cfg->relay_socket && relay_start(cfg, filter) < 0)
        _exit(1);
    cfg->retitle = true; /* init's command line is the template's until it writes its own */
    if (init_fork_payload(cfg, filter) != 0)
        _exit(1);
    /* The kernel. */
    PyOS_AfterFork_Child();
    prctl(PR_SET_NAME, comm);
    if (payload_lockdown(cfg, filter) < 0)
        _exit(127);
    /* What an exec would have done: close the status pipe (only init reports on it; a
     * kernel must not be able to forge its lines), and make /proc/self the process's own
     * again (init is not dumpable, and without an exec that would stick). */
    close(status_fd);
    prctl(PR_SET_DUMPABLE, 1);
    return 0;
}

/* The clone reads and parses its request in memory of its own, mapped for it and unmapped
 * once the request is parsed, not in the heap it shares with the template: jansson's values
 * went to the template's free chunks, scattered over its heap, and each session kept its
 * own copies of ~50 of those pages (/proc/PID/pagemap of a clone against the
 * template's). Pages of the mapping cost memory only as they are touched; a request that
 * needs more than it holds takes the rest from malloc. */
#define PARSE_ARENA_SIZE ((size_t)4 << 20)
static char *arena_base, *arena_next;

static void *arena_alloc(size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if ((size_t)(arena_base + PARSE_ARENA_SIZE - arena_next) < n)
        return malloc(n);
    void *p = arena_next;
    arena_next += n;
    return p;
}

static void arena_free(void *p)
{
    /* As addresses: p may be malloc's, which a pointer comparison may not be made with. */
    if ((uintptr_t)p - (uintptr_t)arena_base >= PARSE_ARENA_SIZE)
        free(p);
}

/* Reads the waiting request off the channel into cfg and fds (in the clone). 0, or -errno
 * with what went wrong in rep->msg. The text and jansson's values of it are unmapped once
 * parsed: nothing of them outlives the parse, even in the session's own memory. */
static int take_request(int ctl, struct helper_config *cfg, int *fds, int *ret_n,
                        struct clone_report *rep)
{
    char *area = mmap(NULL, MAX_REQUEST + PARSE_ARENA_SIZE, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (area == MAP_FAILED) {
        snprintf(rep->msg, sizeof(rep->msg), "no memory for the request: %s", strerror(errno));
        return -ENOMEM;
    }
    char *text = area;
    arena_base = arena_next = area + MAX_REQUEST;
    int n = 0, r = 0;
    ssize_t len = recv_with_fds(ctl, text, MAX_REQUEST, MSG_DONTWAIT, fds, MAX_FDS, &n);
    if (len == -EMSGSIZE || len == -EMFILE) {
        r = -EMSGSIZE;
        snprintf(rep->msg, sizeof(rep->msg), "the request is larger than %d bytes or %d fds%s",
                 MAX_REQUEST - 1, MAX_FDS, len == -EMFILE ? " (or out of open files)" : "");
    } else if (len <= 0) {
        r = len < 0 ? (int)len : -ENOMSG;
        snprintf(rep->msg, sizeof(rep->msg), "no request to take: %s",
                 len < 0 ? strerror((int)-len) : "the channel is closed");
    } else if (n < FD_FIXED) {
        r = -EINVAL;
        snprintf(rep->msg, sizeof(rep->msg), "spawn needs %d to %d fds, got %d", FD_FIXED, MAX_FDS,
                 n);
    } else {
        /* Errors from here on also go to the request's status pipe, like the helper's. */
        status_fd = fds[FD_STATUS];
        json_set_alloc_funcs(arena_alloc, arena_free);
        int parsed = config_parse(text, cfg);
        json_set_alloc_funcs(malloc, free);
        if (parsed < 0) {
            r = -EINVAL;
            snprintf(rep->msg, sizeof(rep->msg), "bad session configuration");
        }
    }
    munmap(area, MAX_REQUEST + PARSE_ARENA_SIZE);
    int n_leaf = r == 0 && cfg->cgroup_leaf_procs ? 1 : 0;
    if (r == 0 && strv_len(cfg->cgroup_procs) + n_leaf + strv_len(cfg->template_binds) > 16) {
        r = -EINVAL;
        snprintf(rep->msg, sizeof(rep->msg), "too many cgroups and binds");
    } else if (r == 0 && n != FD_FIXED + cfg->extra_fds + (int)strv_len(cfg->cgroup_procs) +
                                  n_leaf + (int)strv_len(cfg->template_binds)) {
        r = -EINVAL;
        snprintf(rep->msg, sizeof(rep->msg), "%d fds do not fit the configuration", n);
    }
    rep->err = -r;
    rep->ns_root_uid = cfg->ns_root_uid;
    rep->ns_uid = cfg->ns_uid;
    *ret_n = n;
    return r;
}

static PyObject *strv_to_list(char **v)
{
    PyObject *l = PyList_New(0);
    for (char **p = v; l && p && *p; p++) {
        PyObject *s = PyUnicode_DecodeFSDefault(*p);
        if (!s || PyList_Append(l, s) < 0) {
            Py_XDECREF(s);
            Py_DECREF(l);
            return NULL;
        }
        Py_DECREF(s);
    }
    return l;
}

/* Runs in the clone: takes the request, tells the template which ids to map, and becomes the
 * session's init. Returns only in the kernel, with (0, -1, (env, argv)); exits otherwise. */
static PyObject *clone_main(int ctl, int sync_fd, int report_fd)
{
    struct helper_config cfg = {0};
    struct clone_report rep = {0};
    int fds[MAX_FDS], n = 0;
    int r = take_request(ctl, &cfg, fds, &n, &rep);
    bool told = write(report_fd, &rep, sizeof(rep)) == (ssize_t)sizeof(rep);
    close(report_fd);
    if (r < 0 || !told || session_init(&cfg, fds, n, sync_fd) != 0)
        _exit(1);
    PyObject *env = strv_to_list(cfg.env), *argv = strv_to_list(cfg.argv);
    config_release(&cfg);
    if (!env || !argv) {
        Py_XDECREF(env);
        Py_XDECREF(argv);
        return NULL;
    }
    return Py_BuildValue("(NN)", env, argv);
}

/* The clone's report: 0, or -1 with why in err. */
static int read_report(int fd, struct clone_report *rep, char *err, size_t n_err)
{
    ssize_t got;
    do
        got = read(fd, rep, sizeof(*rep));
    while (got < 0 && errno == EINTR);
    if (got != (ssize_t)sizeof(*rep)) {
        snprintf(err, n_err, "the clone ended before it took the request");
        return -1;
    }
    if (rep->err) {
        rep->msg[sizeof(rep->msg) - 1] = '\0';
        snprintf(err, n_err, "%s", rep->msg);
        return -1;
    }
    return 0;
}

/* Clones the template into a session's namespaces for the request waiting on ctl, which the
 * clone reads. 0 in the template, with the clone's pid and pidfd; -1 in the template, with
 * why in err (a request still on the channel is the caller's to drop); 1 in the new kernel,
 * with its request (env, argv), or NULL and a Python error. The pidfd is
 * opened before the clone may go on (it waits for its id maps), so the clone cannot be gone
 * unnoticed by then. */
static int spawn_one(int ctl, pid_t *ret_pid, int *ret_pidfd, PyObject **ret_request, char *err,
                     size_t n_err)
{
    int sync[2], report[2];
    if (pipe2(sync, O_CLOEXEC) < 0) {
        snprintf(err, n_err, "cannot make a pipe: %s", strerror(errno));
        return -1;
    }
    if (pipe2(report, O_CLOEXEC) < 0) {
        snprintf(err, n_err, "cannot make a pipe: %s", strerror(errno));
        close(sync[0]);
        close(sync[1]);
        return -1;
    }
    if (!template_filter)
        template_filter = seccomp_build();
    PyOS_BeforeFork();
    unsigned long flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC |
                          CLONE_NEWUTS | SIGCHLD;
    pid_t pid = (pid_t)syscall(SYS_clone, flags, NULL, NULL, NULL, 0);
    if (pid == 0) {
        signal(SIGCHLD, SIG_DFL); /* the template's children are reaped by the kernel */
        close(sync[1]);
        close(report[0]);
        *ret_request = clone_main(ctl, sync[0], report[1]);
        return 1;
    }
    int e = errno;
    PyOS_AfterFork_Parent();
    close(sync[0]);
    close(report[1]);
    if (pid < 0) {
        snprintf(err, n_err, "cannot clone the template: %s", strerror(e));
        close(sync[1]);
        close(report[0]);
        return -1;
    }
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    e = errno;
    struct clone_report rep;
    int r = read_report(report[0], &rep, err, n_err);
    close(report[0]);
    /* We hold CAP_SETUID in the template's namespace: map the session's root and user to its
     * pair of ids there (and so to its pair of host ids). */
    if (r == 0 && pidfd < 0) {
        snprintf(err, n_err, "cannot open the clone's pidfd: %s", strerror(e));
        r = -1;
    } else if (r == 0 && (write_map(pid, "uid_map", rep.ns_root_uid, rep.ns_uid) < 0 ||
                          write_map(pid, "gid_map", rep.ns_root_uid, rep.ns_uid) < 0 ||
                          write(sync[1], "g", 1) != 1)) {
        snprintf(err, n_err, "cannot map the clone's ids: %s", strerror(errno));
        r = -1;
    }
    close(sync[1]);
    if (r < 0) {
        kill(pid, SIGKILL);
        if (pidfd >= 0)
            close(pidfd);
        return -1;
    }
    *ret_pid = pid;
    *ret_pidfd = pidfd;
    return 0;
}

/* serve(ctl_fd): the template's loop, in C so that the template runs no Python between two
 * clones. Every page it writes after a clone stops being shared with that clone: the loop
 * in Python (a recv, a call, json.dumps, socket.send_fds) wrote ~330 KB of them each time,
 * and each clone kept its copies. When a request waits on ctl_fd (or the channel closes:
 * None is returned), the template clones itself; the clone takes the request and its kernel
 * returns from here with (env, argv). The template answers the daemon with the clone's pidfd
 * (and its pid), or with {"error": ...} after dropping a request no clone took. The
 * template's children (the sessions' inits) are reaped by the kernel (SIGCHLD ignored). */
static PyObject *serve(PyObject *self, PyObject *args)
{
    int ctl;
    (void)self;
    if (!PyArg_ParseTuple(args, "i", &ctl))
        return NULL;
    struct sigaction ign = {.sa_handler = SIG_IGN, .sa_flags = SA_NOCLDWAIT};
    if (sigaction(SIGCHLD, &ign, NULL) < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    for (;;) {
        char byte, err[256], text[64];
        if (PyErr_CheckSignals() < 0)
            return NULL;
        ssize_t got = recv(ctl, &byte, 1, MSG_PEEK);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return PyErr_SetFromErrno(PyExc_OSError);
        if (got == 0)
            Py_RETURN_NONE;
        pid_t pid = -1;
        int pidfd = -1, r;
        PyObject *request = NULL;
        r = spawn_one(ctl, &pid, &pidfd, &request, err, sizeof(err));
        if (r == 1)
            return request;
        if (r == 0) {
            snprintf(text, sizeof(text), "{\"pid\": %d}", (int)pid);
            int sent = send_with_fds(ctl, text, &pidfd, 1);
            close(pidfd);
            if (sent < 0) {
                errno = -sent;
                return PyErr_SetFromErrno(PyExc_OSError);
            }
            continue;
        }
        /* Refused or failed: the request goes (its fds are closed with it) if no clone took
         * it, and the daemon is told why. */
        (void)recv(ctl, &byte, 1, MSG_DONTWAIT);
        json_t *reply = json_pack("{s:s}", "error", err);
        char *json = reply ? json_dumps(reply, 0) : NULL;
        json_decref(reply);
        int sent = send_with_fds(ctl, json ? json : "{\"error\": \"spawn failed\"}", NULL, 0);
        free(json);
        if (sent < 0) {
            errno = -sent;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
    }
}

static PyMethodDef methods[] = {
    {"serve", serve, METH_VARARGS,
     "serve(ctl_fd: int) -> None in the template when the channel closes, (env, argv) in "
     "each new kernel"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT,
                                    "_runcell_template",
                                    "How the runcell template makes session sandboxes.",
                                    -1,
                                    methods,
                                    NULL,
                                    NULL,
                                    NULL,
                                    NULL};

PyMODINIT_FUNC PyInit__runcell_template(void);

PyMODINIT_FUNC PyInit__runcell_template(void)
{
    return PyModule_Create(&module);
}
