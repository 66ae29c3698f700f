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
#include <stdint.h>
#include <unistd.h>

#include "base/base.h"

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
    if (cfg->template_profile && cfg->id_range) {
        /* The template's namespace maps the whole range of sandbox ids, so that sessions it
         * makes can each map a pair of them. */
        snprintf(map, sizeof(map), "0 %u %u\n", (unsigned)cfg->host_root_uid,
                 (unsigned)cfg->id_range);
        if (write_proc(child, "uid_map", map) < 0)
            return -1;
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

/* Headers older than Linux 5.7 lack CLONE_INTO_CGROUP and clone_args.cgroup. */
#define RC_CLONE_INTO_CGROUP 0x200000000ULL
struct rc_clone_args {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid,
        set_tid_size, cgroup;
};

/* CLONE_PARENT makes the sandbox init a child of the daemon, so this helper can exit as soon
 * as the id maps are written and the daemon reaps init directly. */
#define SANDBOX_CLONE_FLAGS                                                                        \
    (CLONE_PARENT | CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC |     \
     CLONE_NEWUTS)

/* On v2, clone3(CLONE_INTO_CGROUP) starts init inside its cgroup: no migration of a running
 * process (which costs a cgroup attach, and a moment where it runs under the daemon's
 * limits). -ENOSYS/-EINVAL/-E2BIG mean a kernel without it (before 5.7): the caller falls
 * back. */
static pid_t clone_into_cgroup(struct helper_config *cfg)
{
    _cleanup_close_ int dir = open(cfg->cgroup_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0)
        return -errno;
    struct rc_clone_args args = {.flags = SANDBOX_CLONE_FLAGS | RC_CLONE_INTO_CGROUP,
                                 .exit_signal = SIGCHLD,
                                 .cgroup = (uint64_t)dir};
    cfg->cgroup_ns_late = true; /* the child's copy of cfg says so */
    long r = syscall(SYS_clone3, &args, sizeof(args));
    if (r < 0) {
        cfg->cgroup_ns_late = false;
        return -errno;
    }
    return (pid_t)r;
}

#define REPORTED (-4096) /* a failure already reported on the status fd */

/* The fallback: join the cgroup (a migration), then clone. The child's pid, -errno, or
 * REPORTED. */
static pid_t clone_then_attach(struct helper_config *cfg)
{
    if (join_cgroups(cfg->cgroup_procs) < 0)
        return REPORTED;
    pid_t child = (pid_t)syscall(SYS_clone, SANDBOX_CLONE_FLAGS | CLONE_NEWCGROUP | SIGCHLD, NULL,
                                 NULL, NULL, 0);
    return child < 0 ? -errno : child;
}

/* Clones the sandbox init into its namespaces, maps its ids and lets it go. Returns the
 * helper's exit status. */
static int start_sandbox(struct helper_config *cfg)
{
    int sync_pipe[2];
    if (pipe2(sync_pipe, O_CLOEXEC) < 0)
        return fail_errno("pipe"), 1;
    /* Opened here, as the daemon's uid in its cgroup namespace: the kernel checks a cgroup
     * move against the credentials the file was opened with. */
    if (cfg->cgroup_leaf_procs &&
        (cfg->cgroup_leaf_fd = open(cfg->cgroup_leaf_procs, O_WRONLY | O_CLOEXEC)) < 0)
        return fail_errno("cannot open %s", cfg->cgroup_leaf_procs), 1;
    pid_t child = cfg->cgroup_dir ? clone_into_cgroup(cfg) : -ENOSYS;
    if (child == -ENOSYS || child == -EINVAL || child == -E2BIG) {
        if ((child = clone_then_attach(cfg)) == REPORTED)
            return 1;
    } else if (child < 0 && child != -EPERM && child != -ENOSPC && child != -EUSERS) {
        errno = -child;
        fail_errno("cannot start the sandbox init in cgroup %s (clone3 with CLONE_INTO_CGROUP)",
                   cfg->cgroup_dir);
        return 1;
    }
    if (child < 0) {
        errno = -child;
        fail_errno("cannot create the sandbox namespaces (clone); user namespaces may be "
                   "disabled: check sysctl user.max_user_namespaces and "
                   "kernel.unprivileged_userns_clone (runcell doctor says which)");
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
    int r = read_config(&cfg) < 0 ? 1 : start_sandbox(&cfg);
    /* Freed for the sake of leak checkers: a sanitizer build reports leaks at exit on fd 2,
     * which is the payload's stderr pipe, and runcell does not drain it until we are gone. */
    config_release(&cfg);
    return r;
}
