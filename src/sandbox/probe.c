/* probe.c - what this kernel gives the sandbox: Landlock ABI, seccomp, the system calls
 * runcell relies on, user-namespace restrictions, the file systems it mounts. One place, so
 * that the daemon's log, `runcell doctor` and the tests all see the same answers. */
#include "sandbox/sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/landlock.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SYS_clone3
#define SYS_clone3 435
#endif
#ifndef SYS_openat2
#define SYS_openat2 437
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif
#ifndef SYS_open_tree
#define SYS_open_tree 428
#endif
#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#endif

/* What each Landlock ABI adds, and what runcell does with it (see lockdown.c). */
static const struct landlock_step {
    int abi;
    const char *kernel;
    const char *right;
} landlock_steps[] = {
    {1, "5.13", "file system access (read, write, execute, make, remove)"},
    {2, "5.19", "refer (renames and links across directories)"},
    {3, "6.2", "truncate"},
    {5, "6.10", "ioctl on devices"},
    {6, "6.12", "scoped signals and abstract unix sockets"},
};

int sandbox_landlock_features(int abi, char *enforced, size_t esize, char *missing, size_t msize)
{
    if (esize)
        enforced[0] = '\0';
    if (msize)
        missing[0] = '\0';
    int n = 0;
    for (size_t i = 0; i < ARRAY_SIZE(landlock_steps); i++) {
        const struct landlock_step *s = &landlock_steps[i];
        char *out = abi >= s->abi ? enforced : missing;
        size_t size = abi >= s->abi ? esize : msize;
        size_t len = strlen(out);
        if (len < size)
            snprintf(out + len, size - len, "%s%s (ABI %d, Linux %s)", len ? "; " : "", s->right,
                     s->abi, s->kernel);
        n += abi >= s->abi;
    }
    return n;
}

/* A system call is there unless the kernel answers ENOSYS (invalid arguments are fine:
 * they are rejected after the lookup). */
static bool has_syscall(long nr, long a, long b, long c)
{
    long r = syscall(nr, a, b, c, 0, 0);
    if (r >= 0)
        close((int)r);
    return r >= 0 || errno != ENOSYS;
}

/* CLONE_INTO_CGROUP (5.7) asked with a cgroup fd that cannot be open: a kernel that knows
 * the flag looks the fd up and answers EBADF; an older one rejects the flag (EINVAL) or the
 * larger clone_args (E2BIG) before anything is made. The kernel looks the fd up only after
 * it has copied the caller for the child, so the child would share the caller's memory,
 * files and handlers: nothing to copy (0.6-0.8 ms here for a copy of the memory map, 5 us
 * shared). CLONE_VFORK keeps the impossible success safe: the child runs alone on the
 * shared stack, to its _exit. */
static bool probe_clone_into_cgroup(void)
{
    struct {
        uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid,
            set_tid_size, cgroup;
    } args = {.flags =
                  0x200000000ULL | CLONE_VM | CLONE_VFORK | CLONE_FS | CLONE_FILES | CLONE_SIGHAND,
              .exit_signal = SIGCHLD,
              .cgroup = 0x7fffffff};
    long r = syscall(SYS_clone3, &args, sizeof(args));
    if (r == 0)
        _exit(0); /* cannot happen: no fd has that number (RLIMIT_NOFILE stays below it) */
    if (r > 0)
        waitpid((pid_t)r, NULL, 0);
    return r < 0 && errno == EBADF;
}

static long read_sysctl(const char *path)
{
    char buf[64];
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    return strtol(buf, NULL, 10);
}

const char *sandbox_userns_verdict(long max_user_namespaces, long unprivileged_userns_clone,
                                   long apparmor_restrict, bool root)
{
    if (max_user_namespaces == 0)
        return "user.max_user_namespaces is 0: no user namespaces can be made; set it to "
               "e.g. 15000 (sysctl -w user.max_user_namespaces=15000, and in /etc/sysctl.d/)";
    if (root)
        return NULL; /* the other two restrict unprivileged processes only */
    if (unprivileged_userns_clone == 0)
        return "kernel.unprivileged_userns_clone is 0: unprivileged users cannot make user "
               "namespaces; run runcell as root, or sysctl -w kernel.unprivileged_userns_clone=1";
    if (apparmor_restrict == 1)
        return "kernel.apparmor_restrict_unprivileged_userns is 1: AppArmor keeps unprivileged "
               "processes from using user namespaces; run runcell as root, or give it an "
               "AppArmor profile with 'userns,' (or sysctl -w "
               "kernel.apparmor_restrict_unprivileged_userns=0)";
    return NULL;
}

/* Whether this process can make a user namespace, tried in a child (unshare would change
 * us). 0, or -errno of the unshare. */
static int try_userns_in_child(void)
{
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) < 0)
        return -errno;
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(pfd[0]);
        close(pfd[1]);
        return -e;
    }
    if (pid == 0) {
        int e = unshare(CLONE_NEWUSER) < 0 ? errno : 0;
        (void)!write(pfd[1], &e, sizeof(e));
        _exit(0);
    }
    close(pfd[1]);
    int e = EIO;
    if (read(pfd[0], &e, sizeof(e)) != sizeof(e))
        e = EIO;
    close(pfd[0]);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    return -e;
}

/* Whether /proc/filesystems (its text) lists the file system NAME. */
static bool has_filesystem(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *line = text; line && *line;
         line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        const char *tab = strchr(line, '\t');
        if (tab && !strncmp(tab + 1, name, n) && (tab[1 + n] == '\n' || tab[1 + n] == '\0'))
            return true;
    }
    return false;
}

void sandbox_kernel_probe(struct sandbox_kernel *k, bool try_userns)
{
    struct utsname u;
    memset(k, 0, sizeof(*k));
    if (uname(&u) == 0)
        snprintf(k->release, sizeof(k->release), "%s", u.release);
    long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
    k->landlock_abi = abi > 0 ? (int)abi : 0;
    k->landlock_errno = abi > 0 ? 0 : errno;
    /* PR_GET_SECCOMP answers EINVAL on a kernel built without seccomp. */
    k->seccomp = prctl(PR_GET_SECCOMP, 0, 0, 0, 0) >= 0;
    k->seccomp_filter = k->seccomp && access("/proc/sys/kernel/seccomp/actions_avail", R_OK) == 0;
    k->clone3 = has_syscall(SYS_clone3, 0, 0, 0);
    k->clone_into_cgroup = k->clone3 && probe_clone_into_cgroup();
    k->openat2 = has_syscall(SYS_openat2, -1, 0, 0);
    k->pidfd_open = has_syscall(SYS_pidfd_open, -1, 0, 0);
    k->pidfd_send_signal = has_syscall(SYS_pidfd_send_signal, -1, 0, 0);
    k->open_tree = has_syscall(SYS_open_tree, -1, 0, 0);
    k->max_user_namespaces = read_sysctl("/proc/sys/user/max_user_namespaces");
    k->unprivileged_userns_clone = read_sysctl("/proc/sys/kernel/unprivileged_userns_clone");
    k->apparmor_restrict_userns =
        read_sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns");
    k->userns_tried = try_userns;
    k->userns_errno = try_userns ? -try_userns_in_child() : 0;
    k->userns_reason = sandbox_userns_verdict(k->max_user_namespaces, k->unprivileged_userns_clone,
                                              k->apparmor_restrict_userns, geteuid() == 0);
    _cleanup_free_ char *fs = NULL;
    size_t len;
    if (read_file("/proc/filesystems", 65536, &fs, &len) == 0) {
        k->tmpfs = has_filesystem(fs, "tmpfs");
        k->overlayfs = has_filesystem(fs, "overlay");
        k->cgroup2 = has_filesystem(fs, "cgroup2");
    }
}

void sandbox_kernel_log(const struct sandbox_kernel *k)
{
    char enforced[512], missing[512];
    sandbox_landlock_features(k->landlock_abi, enforced, sizeof(enforced), missing,
                              sizeof(missing));
    if (!k->landlock_abi)
        log_warn("msg=\"Landlock is not available (%s): files are confined by the mount "
                 "layout alone\" kernel=%s",
                 k->landlock_errno == EOPNOTSUPP ? "disabled at boot: add landlock to lsm="
                                                 : "the kernel lacks it",
                 k->release);
    else if (*missing)
        log_info("msg=\"Landlock ABI %d: these rights are not enforced by this kernel\" "
                 "unavailable=%s kernel=%s",
                 k->landlock_abi, log_quote(missing), k->release);
    if (!k->userns_tried && k->userns_reason)
        log_warn("msg=\"user namespaces are restricted: sandboxes may not start\" reason=%s",
                 log_quote(k->userns_reason));
    if (k->userns_errno)
        log_warn("msg=\"cannot make user namespaces: sandboxes will not start\" error=%s "
                 "reason=%s",
                 log_quote(strerror(k->userns_errno)),
                 log_quote(k->userns_reason ? k->userns_reason : "unknown"));
    if (!k->openat2 || !k->pidfd_open || !k->open_tree)
        log_warn("msg=\"kernel %s lacks system calls runcell needs (openat2 %s, pidfd_open %s, "
                 "open_tree %s): Linux 5.6 or later is required\"",
                 k->release, k->openat2 ? "yes" : "no", k->pidfd_open ? "yes" : "no",
                 k->open_tree ? "yes" : "no");
}
