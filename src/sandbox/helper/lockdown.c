/* lockdown.c - the payload's last steps before exec: session, fds, rlimits, user, capabilities,
 * no_new_privs and Landlock (seccomp comes last, in seccomp.c). */
#include "sandbox/helper/helper.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/landlock.h>
#include <linux/securebits.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/base.h"

/* Landlock rights newer than Debian 12's kernel headers. */
#ifndef LANDLOCK_ACCESS_FS_REFER
#define LANDLOCK_ACCESS_FS_REFER (1ULL << 13)
#endif
#ifndef LANDLOCK_ACCESS_FS_TRUNCATE
#define LANDLOCK_ACCESS_FS_TRUNCATE (1ULL << 14)
#endif
#ifndef LANDLOCK_ACCESS_FS_IOCTL_DEV
#define LANDLOCK_ACCESS_FS_IOCTL_DEV (1ULL << 15)
#endif
#define RC_LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET (1ULL << 0)
#define RC_LANDLOCK_SCOPE_SIGNAL               (1ULL << 1)

/* The ruleset attribute as of Landlock ABI 6; older kernels take a prefix of it. */
struct rc_landlock_ruleset_attr {
    uint64_t handled_access_fs;
    uint64_t handled_access_net;
    uint64_t scoped;
};

static int place_fds(const struct helper_config *cfg)
{
    /* Status fd out of the way, extras down to 3.., status right after them (close-on-exec
     * so only an exec failure is ever reported on it), everything else closed. */
    int s = fcntl(status_fd, F_DUPFD_CLOEXEC, 64);
    if (s < 0)
        return fail_errno("fcntl");
    close(status_fd);
    status_fd = s;
    for (int i = 0; i < payload_extra_fds(cfg); i++)
        if (dup2(HELPER_FD_EXTRA + i, 3 + i) < 0)
            return fail_errno("dup2");
    int final_status = 3 + payload_extra_fds(cfg);
    if (dup3(s, final_status, O_CLOEXEC) < 0)
        return fail_errno("dup3");
    close(s);
    status_fd = final_status;
    if (syscall(SYS_close_range, final_status + 1, ~0U, 0) < 0)
        return fail_errno("close_range");
    return 0;
}

static int set_rlimit(int resource, uint64_t value, const char *name)
{
    struct rlimit rl = {.rlim_cur = value, .rlim_max = value};
    if (setrlimit(resource, &rl) < 0)
        return fail_errno("cannot set the %s limit", name);
    return 0;
}

static int rlimits(const struct helper_config *cfg)
{
    /* Never above the server's own hard limit, which only CAP_SYS_RESOURCE could raise. */
    struct rlimit own;
    uint64_t nofile = cfg->rl_nofile;
    if (getrlimit(RLIMIT_NOFILE, &own) == 0 && own.rlim_max != RLIM_INFINITY &&
        own.rlim_max < nofile)
        nofile = own.rlim_max;
    if (set_rlimit(RLIMIT_CORE, 0, "core size") < 0 ||
        set_rlimit(RLIMIT_NOFILE, nofile, "open files") < 0)
        return -1;
    if (cfg->rl_nproc && set_rlimit(RLIMIT_NPROC, cfg->rl_nproc, "process count") < 0)
        return -1;
    if (cfg->rl_cpu_s && set_rlimit(RLIMIT_CPU, cfg->rl_cpu_s, "CPU time") < 0)
        return -1;
    if (cfg->rl_fsize_mb && set_rlimit(RLIMIT_FSIZE, cfg->rl_fsize_mb << 20, "file size") < 0)
        return -1;
    if (cfg->rl_as_mb && set_rlimit(RLIMIT_AS, cfg->rl_as_mb << 20, "address space") < 0)
        return -1;
    return 0;
}

static int drop_privileges(const struct helper_config *cfg)
{
    /* Lock the securebits first (needs CAP_SETPCAP): no uid 0 magic, no capability
     * regain through exec or setuid, ever. */
    int bits = SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP |
               SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED |
               SECBIT_NO_CAP_AMBIENT_RAISE | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
    if (prctl(PR_SET_SECUREBITS, bits) < 0)
        return fail_errno("cannot lock the securebits");
    if (cfg->privileged && setgroups(0, NULL) < 0)
        return fail_errno("cannot drop supplementary groups");
    if (setresgid(SANDBOX_GID, SANDBOX_GID, SANDBOX_GID) < 0)
        return fail_errno("cannot switch to the sandbox group");
    /* Up to the first the kernel does not know (EINVAL: past CAP_LAST_CAP, the rest too). */
    for (int cap = 0; cap <= 63; cap++) {
        if (prctl(PR_CAPBSET_DROP, cap) == 0)
            continue;
        if (errno == EINVAL)
            break;
        return fail_errno("cannot drop capability %d from the bounding set", cap);
    }
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
        return fail_errno("cannot clear ambient capabilities");
    if (setresuid(SANDBOX_UID, SANDBOX_UID, SANDBOX_UID) < 0)
        return fail_errno("cannot switch to the sandbox user");
    struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3};
    struct __user_cap_data_struct data[2] = {{0}};
    if (syscall(SYS_capset, &hdr, data) < 0)
        return fail_errno("cannot drop capabilities");
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return fail_errno("cannot set no_new_privs");
    return 0;
}

static uint64_t fs_rights_for_abi(int abi)
{
    uint64_t r =
        LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_READ_FILE |
        LANDLOCK_ACCESS_FS_READ_DIR | LANDLOCK_ACCESS_FS_REMOVE_DIR |
        LANDLOCK_ACCESS_FS_REMOVE_FILE | LANDLOCK_ACCESS_FS_MAKE_CHAR |
        LANDLOCK_ACCESS_FS_MAKE_DIR | LANDLOCK_ACCESS_FS_MAKE_REG | LANDLOCK_ACCESS_FS_MAKE_SOCK |
        LANDLOCK_ACCESS_FS_MAKE_FIFO | LANDLOCK_ACCESS_FS_MAKE_BLOCK | LANDLOCK_ACCESS_FS_MAKE_SYM;
    if (abi >= 2)
        r |= LANDLOCK_ACCESS_FS_REFER;
    if (abi >= 3)
        r |= LANDLOCK_ACCESS_FS_TRUNCATE;
    if (abi >= 5)
        r |= LANDLOCK_ACCESS_FS_IOCTL_DEV;
    return r;
}

static int landlock_allow(int ruleset, const char *path, uint64_t access)
{
    struct landlock_path_beneath_attr pb = {.allowed_access = access};
    pb.parent_fd = open(path, O_PATH | O_CLOEXEC);
    if (pb.parent_fd < 0)
        return 0; /* nothing there to allow */
    long r = syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &pb, 0);
    int err = errno;
    close(pb.parent_fd);
    if (r < 0) {
        errno = err;
        return fail_errno("cannot add a Landlock rule for %s", path);
    }
    return 0;
}

static int landlock_apply(const struct helper_config *cfg)
{
    if (!cfg->landlock)
        return 0;
    long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
    if (abi < 1)
        return 0; /* kernel without Landlock: the mount layout alone confines the files */
    uint64_t all = fs_rights_for_abi((int)abi);
    uint64_t read = LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR;
    uint64_t rw = all & ~(LANDLOCK_ACCESS_FS_MAKE_CHAR | LANDLOCK_ACCESS_FS_MAKE_BLOCK);
    struct rc_landlock_ruleset_attr attr = {.handled_access_fs = all};
    size_t size = sizeof(uint64_t);
    if (abi >= 4)
        size = 2 * sizeof(uint64_t);
    if (abi >= 6) {
        /* No signals to, and no abstract sockets of, anything outside the sandbox's domain
         * (init included). */
        attr.scoped = RC_LANDLOCK_SCOPE_SIGNAL | RC_LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET;
        size = sizeof(attr);
    }
    int ruleset = (int)syscall(SYS_landlock_create_ruleset, &attr, size, 0);
    if (ruleset < 0)
        return fail_errno("cannot create the Landlock ruleset");
    int r = landlock_allow(ruleset, "/", read | LANDLOCK_ACCESS_FS_EXECUTE);
    if (!r)
        r = landlock_allow(ruleset, "/dev",
                           read | LANDLOCK_ACCESS_FS_WRITE_FILE |
                               (abi >= 5 ? LANDLOCK_ACCESS_FS_IOCTL_DEV : 0));
    const char *writable[] = {"/workspace", "/tmp", "/var/tmp", "/dev/shm"};
    for (size_t i = 0; !r && i < ARRAY_SIZE(writable); i++)
        r = landlock_allow(ruleset, writable[i], rw);
    for (size_t i = 0; !r && i < cfg->n_binds; i++)
        if (cfg->binds[i].rw)
            r = landlock_allow(ruleset, cfg->binds[i].dst, rw);
    if (!r && syscall(SYS_landlock_restrict_self, ruleset, 0) < 0)
        r = fail_errno("cannot enforce the Landlock ruleset");
    close(ruleset);
    return r;
}

int lockdown(const struct helper_config *cfg, void *seccomp_filter)
{
    if (rlimits(cfg) < 0)
        return -1;
    if (chdir(cfg->cwd) < 0)
        return fail_errno("cannot enter %s", cfg->cwd);
    if (drop_privileges(cfg) < 0 || landlock_apply(cfg) < 0)
        return -1;
    if (seccomp_filter && seccomp_install(seccomp_filter) < 0)
        return -1;
    return 0;
}

int payload_lockdown(const struct helper_config *cfg, void *seccomp_filter)
{
    if (setsid() < 0)
        return fail_errno("setsid");
    if (place_fds(cfg) < 0)
        return -1;
    if (!cfg->template_profile)
        return lockdown(cfg, seccomp_filter);
    /* The template keeps root in its user namespace (it clones and maps the sessions'
     * namespaces) and never runs user code; sessions made from it apply the lockdown
     * themselves. It gets no rlimits but the core size: an rlimit cannot be raised again in
     * a user namespace, and the sessions set their own. */
    if (set_rlimit(RLIMIT_CORE, 0, "core size") < 0)
        return -1;
    if (chdir(cfg->cwd) < 0)
        return fail_errno("cannot enter %s", cfg->cwd);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return fail_errno("cannot set no_new_privs");
    return 0;
}

void payload_exec(const struct helper_config *cfg, void *seccomp_filter)
{
    if (payload_lockdown(cfg, seccomp_filter) < 0)
        return;
    execve(cfg->argv[0], cfg->argv, cfg->env);
    fail_errno("cannot run %s in the sandbox", cfg->argv[0]);
}
