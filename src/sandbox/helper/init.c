/* init.c - PID 1 of a sandbox: builds the root, starts the payload, forwards signals,
 * reaps orphans, reports the payload's status and takes every process down with it. */
#include "sandbox/helper/helper.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/signalfd.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"

/* Signals the daemon may send to init for the payload. */
static const int forwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

static void noop_handler(int sig)
{
    (void)sig;
}

/* PID 1 only receives signals from outside its namespace when it has a handler, so install
 * a no-op one for each, then block them all and take them from a signalfd. */
static void signals_setup(sigset_t *ret_set)
{
    struct sigaction sa = {.sa_handler = noop_handler};
    sigemptyset(ret_set);
    sigaddset(ret_set, SIGCHLD);
    sigaction(SIGCHLD, &sa, NULL);
    for (size_t i = 0; i < ARRAY_SIZE(forwarded); i++) {
        sigaction(forwarded[i], &sa, NULL);
        sigaddset(ret_set, forwarded[i]);
    }
    sigprocmask(SIG_BLOCK, ret_set, NULL);
}

static void report_and_exit(int wstatus)
{
    if (WIFEXITED(wstatus))
        status_write("exit %d", WEXITSTATUS(wstatus));
    else if (WIFSIGNALED(wstatus))
        status_write("signal %d", WTERMSIG(wstatus));
    /* Whatever the payload left behind (daemonised, double-forked, SIGTERM-ignoring
     * children) goes with it: kill(-1) from PID 1 reaches every process in the namespace. */
    kill(-1, SIGKILL);
    while (waitpid(-1, NULL, 0) > 0 || errno == EINTR)
        ;
    _exit(0);
}

/* The exec channel (execd.c) as init holds it: read by the spawner, which init starts when
 * a request waits and no spawner runs, and starts again if it dies. */
struct exec_state {
    int fd; /* -1: none, or the daemon closed it */
    pid_t spawner;
    const struct helper_config *cfg;
    void *filter;
};

/* A request waits and no spawner runs: start one; the daemon gone: let the channel go. */
static void exec_channel_ready(struct exec_state *x, short revents)
{
    if (revents & POLLIN) {
        x->spawner = execd_start(x->cfg, x->filter, x->fd);
        if (x->spawner > 0)
            return;
        x->spawner = 0; /* no fork: the request waits for the next try (a child's end) */
        return;
    }
    if (revents & (POLLHUP | POLLERR)) {
        close(x->fd);
        x->fd = -1;
    }
}

/* Forwards signals, reaps, and watches the status pipe: when the daemon is gone (its read
 * end closed, whichever thread of it started us), the whole sandbox goes too. A
 * parent-death signal would not do: it fires when the spawning *thread* exits. */
static __attribute__((noreturn)) void supervise(pid_t payload, const sigset_t *set, bool linger,
                                                struct exec_state *x)
{
    int sfd = signalfd(-1, set, SFD_CLOEXEC);
    prctl(PR_SET_PDEATHSIG, 0);
    for (;;) {
        bool want_exec = x->fd >= 0 && x->spawner == 0;
        struct pollfd pfd[3] = {{.fd = sfd, .events = POLLIN},
                                {.fd = status_fd, .events = 0},
                                {.fd = want_exec ? x->fd : -1, .events = POLLIN}};
        if (poll(pfd, 3, -1) < 0)
            continue;
        if (pfd[1].revents & (POLLERR | POLLHUP)) {
            kill(-1, SIGKILL);
            _exit(0);
        }
        if (pfd[2].revents)
            exec_channel_ready(x, pfd[2].revents);
        struct signalfd_siginfo si;
        if (!(pfd[0].revents & POLLIN) || read(sfd, &si, sizeof(si)) != sizeof(si))
            continue;
        if (si.ssi_signo != SIGCHLD) {
            if (payload > 0) /* after a lingering template's exit, -1 would mean everyone */
                kill(payload, (int)si.ssi_signo);
            continue;
        }
        int wstatus;
        pid_t p;
        while ((p = waitpid(-1, &wstatus, WNOHANG)) > 0) {
            if (p == x->spawner)
                x->spawner = 0; /* the next request starts another */
            if (p != payload)
                continue;
            if (!linger)
                report_and_exit(wstatus);
            /* The template is gone, but the sessions it made live in our PID namespace:
             * say so, and stay as their reaper until the last one ends. */
            status_write(WIFEXITED(wstatus) ? "exit %d" : "signal %d",
                         WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : WTERMSIG(wstatus));
            payload = -1;
        }
        if (p < 0 && errno == ECHILD && payload < 0)
            _exit(0);
    }
}

static void stdio_to_null(int extra_fds)
{
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    for (int fd = 0; fd < 3; fd++)
        if (null >= 0)
            dup2(null, fd);
    if (null > 2)
        close(null);
    for (int i = 0; i < extra_fds; i++)
        close(HELPER_FD_EXTRA + i);
}

void init_main(struct helper_config *cfg, int sync_fd)
{
    char go;
    if (read(sync_fd, &go, 1) != 1)
        _exit(1); /* the outer helper failed and has reported why */
    close(sync_fd);
    /* clone3 makes the cgroup namespace before it places the child in its cgroup, so the
     * namespace would be rooted at the daemon's: make it now, from inside the sandbox's. */
    if (cfg->cgroup_ns_late && unshare(CLONE_NEWCGROUP) < 0) {
        fail_errno("cannot create the cgroup namespace");
        _exit(1);
    }
    if (cfg->cgroup_leaf_fd >= 0 && cgroup_leaf_join(cfg->cgroup_leaf_fd) < 0)
        _exit(1);
    /* Until supervise() watches the status pipe, the parent-death signal covers a daemon
     * that dies during setup. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    /* Out of the daemon's session: no controlling terminal, and a Ctrl-C typed at the
     * daemon's terminal is not delivered here. */
    setsid();
    if (become_sandbox_root(cfg) < 0)
        _exit(1);
    /* A credential change clears it; set it after. Nothing in the sandbox may ptrace, read
     * /proc/1/mem of, or signal init. */
    prctl(PR_SET_DUMPABLE, 0);
    fd_set_cloexec(status_fd, false);

    if (sethostname(cfg->hostname, strlen(cfg->hostname)) < 0) {
        fail_errno("cannot set the sandbox host name");
        _exit(1);
    }
    if (net_loopback_up() < 0 || rootfs_setup(cfg) < 0)
        _exit(1);
    void *filter = NULL;
    if (cfg->seccomp && !(filter = seccomp_build()))
        _exit(1);
    if (cfg->relay_socket && relay_start(cfg, filter) < 0)
        _exit(1);
    if (init_fork_payload(cfg, filter) == 0) {
        payload_exec(cfg, filter);
        _exit(127);
    }
    _exit(1);
}

int cgroup_leaf_join(int fd)
{
    int r = write(fd, "0", 1) == 1 ? 0 : fail_errno("cannot move into the sandbox's cgroup leaf");
    close(fd);
    return r;
}

/* Fields 48 and 49 of /proc/self/stat: where the kernel reads the command line from. */
static int cmdline_area(unsigned long *ret_start, unsigned long *ret_end)
{
    char buf[1024];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof(buf) - 1);
    if (fd >= 0)
        close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* comm may hold spaces and parens */
    for (int field = 2; p && field < 48; field++)
        p = strchr(p + 1, ' ');
    if (!p || sscanf(p + 1, "%lu %lu", ret_start, ret_end) != 2 || *ret_end <= *ret_start)
        return -1;
    return 0;
}

void init_retitle(const char *instance)
{
    unsigned long start, end;
    char title[64];
    if (cmdline_area(&start, &end) < 0)
        return;
    /* The area ends with a NUL the kernel looks for: keep one there, and the rest NULs. */
    size_t room = end - start, n;
    n = (size_t)snprintf(title, sizeof(title), "runcell-sandbox%c%.*s", 0, SANDBOX_INSTANCE_SHORT,
                         instance) +
        1;
    if (n > room)
        n = room;
    memset((char *)start, 0, room);
    memcpy((char *)start, title, n);
    ((char *)start)[room - 1] = '\0';
}

int init_fork_payload(const struct helper_config *cfg, void *seccomp_filter)
{
    sigset_t set;
    static struct exec_state x = {.fd = -1};
    if (cfg->exec_channel) {
        /* Up and away from the fds the payload takes, and never inherited by it: its
         * lockdown closes every fd past its own. */
        int orig = HELPER_FD_EXTRA + payload_extra_fds(cfg);
        x = (struct exec_state){
            .fd = fcntl(orig, F_DUPFD_CLOEXEC, 64), .cfg = cfg, .filter = seccomp_filter};
        close(orig);
    }
    signals_setup(&set);
    status_write("ready");
    pid_t payload = fork();
    if (payload < 0) {
        fail_errno("cannot start the sandboxed program (fork)");
        return -1;
    }
    if (payload == 0) {
        sigprocmask(SIG_UNBLOCK, &set, NULL);
        struct sigaction dfl = {.sa_handler = SIG_DFL};
        for (size_t i = 0; i < ARRAY_SIZE(forwarded); i++)
            sigaction(forwarded[i], &dfl, NULL);
        sigaction(SIGCHLD, &dfl, NULL);
        signal(SIGPIPE, SIG_DFL);
        return 0;
    }
    stdio_to_null(cfg->extra_fds);
    if (cfg->retitle)
        init_retitle(cfg->instance);
    supervise(payload, &set, cfg->template_profile, &x);
}
