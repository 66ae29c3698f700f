/* main.c - runcell-sandbox: joins the cgroup, clones the namespaces, writes the id maps. */
#include "sandbox/helper/helper.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/base.h"

int status_fd = HELPER_FD_STATUS;

void status_write(const char *fmt, ...)
{
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof(line) - 2)
        n = (int)sizeof(line) - 2;
    for (int i = 0; i < n; i++)
        if (line[i] == '\n')
            line[i] = ' ';
    line[n++] = '\n';
    (void)write_all(status_fd, line, (size_t)n);
}

static int vfail(int err, const char *fmt, va_list ap)
{
    char msg[1536];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    if (err)
        status_write("error %s: %s", msg, strerror(err));
    else
        status_write("error %s", msg);
    return -1;
}

int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(0, fmt, ap);
    va_end(ap);
    return -1;
}

int fail_errno(const char *fmt, ...)
{
    int err = errno;
    va_list ap;
    va_start(ap, fmt);
    vfail(err, fmt, ap);
    va_end(ap);
    return -1;
}

static int join_cgroups(char **procs)
{
    char pid[32];
    int n = snprintf(pid, sizeof(pid), "%d\n", getpid());
    for (char **p = procs; p && *p; p++) {
        _cleanup_close_ int fd = open(*p, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, pid, (size_t)n) != n)
            return fail_errno("cannot join cgroup %s", *p);
    }
    return 0;
}

static int write_proc(pid_t pid, const char *file, const char *data)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/%s", pid, file);
    _cleanup_close_ int fd = open(path, O_WRONLY | O_CLOEXEC);
    ssize_t len = (ssize_t)strlen(data);
    if (fd < 0 || write(fd, data, (size_t)len) != len)
        return fail_errno("cannot write %s", path);
    return 0;
}

static int write_id_maps(const struct helper_config *cfg, pid_t child)
{
    char map[128];
    if (!cfg->privileged) {
        /* Unprivileged, the kernel only lets us map our own ids, and gid_map only after
         * setgroups is denied. */
        if (write_proc(child, "setgroups", "deny") < 0)
            return -1;
        snprintf(map, sizeof(map), "%d %u 1\n", SANDBOX_UID, (unsigned)cfg->host_uid);
        if (write_proc(child, "uid_map", map) < 0)
            return -1;
        snprintf(map, sizeof(map), "%d %u 1\n", SANDBOX_GID, (unsigned)cfg->host_gid);
        return write_proc(child, "gid_map", map);
    }
    snprintf(map, sizeof(map), "0 %u 1\n%d %u 1\n", (unsigned)cfg->host_root_uid, SANDBOX_UID,
             (unsigned)cfg->host_uid);
    if (write_proc(child, "uid_map", map) < 0)
        return -1;
    snprintf(map, sizeof(map), "0 %u 1\n%d %u 1\n", (unsigned)cfg->host_root_uid, SANDBOX_GID,
             (unsigned)cfg->host_gid);
    return write_proc(child, "gid_map", map);
}

static int read_config(struct helper_config *cfg)
{
    struct buf b;
    buf_init(&b, 1 << 20);
    int r = read_all(HELPER_FD_CONFIG, &b);
    close(HELPER_FD_CONFIG);
    if (r < 0) {
        buf_release(&b);
        return fail("cannot read the sandbox configuration: %s", strerror(-r));
    }
    r = config_parse(b.data ? b.data : "", cfg);
    buf_release(&b);
    return r;
}

/* Clones the sandbox's init and starts it once its id maps are written; the exit status of
 * this helper process. */
static int start_sandbox(struct helper_config *cfg)
{
    int sync_pipe[2];

    if (join_cgroups(cfg->cgroup_procs) < 0)
        return 1;
    if (pipe2(sync_pipe, O_CLOEXEC) < 0)
        return fail_errno("pipe"), 1;

    /* CLONE_PARENT makes the sandbox init a child of the daemon, so this helper can exit
     * as soon as the id maps are written and the daemon reaps init directly. */
    unsigned long flags = CLONE_PARENT | CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID |
                          CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP | SIGCHLD;
    pid_t child = (pid_t)syscall(SYS_clone, flags, NULL, NULL, NULL, 0);
    if (child < 0) {
        fail_errno("cannot create the sandbox namespaces (clone); user namespaces may be "
                   "disabled: check sysctl user.max_user_namespaces and "
                   "kernel.unprivileged_userns_clone");
        return 1;
    }
    if (child == 0) {
        close(sync_pipe[1]);
        init_main(cfg, sync_pipe[0]);
    }
    close(sync_pipe[0]);
    if (write_id_maps(cfg, child) < 0) {
        kill(child, SIGKILL);
        return 1;
    }
    status_write("pid %d", child);
    if (write(sync_pipe[1], "g", 1) != 1) {
        kill(child, SIGKILL);
        return fail_errno("cannot start the sandbox init"), 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct helper_config cfg = {0};

    (void)argc;
    (void)argv;
    signal(SIGPIPE, SIG_IGN);
    if (fcntl(status_fd, F_GETFD) < 0) {
        fprintf(stderr, "runcell-sandbox: is started by runcell, not by hand\n");
        return 2;
    }
    /* Freed on the way out, so that a sanitizer build reports no leak into the sandbox's
     * stderr, which is this process's too. */
    int status = read_config(&cfg) < 0 ? 1 : start_sandbox(&cfg);
    config_release(&cfg);
    return status;
}
