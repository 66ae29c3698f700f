/* seccomp-rules.c - the sandbox's system call filter as libseccomp rules, compiled to the
 * BPF program the kernel loads. Only the build runs this (seccomp-gen.c writes the program
 * into seccomp-filter.h, which the helper embeds) and the unit test that checks the
 * embedded program is this one: a sandbox's start compiles nothing. Default allow;
 * dangerous families denied (DESIGN.md "Security model"); foreign ABIs (i386, x32) kill
 * the process. */
#include "sandbox/helper/seccomp-rules.h"

#include <errno.h>
#include <linux/filter.h>
#include <linux/sched.h>
#include <sched.h>
#include <seccomp.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/base.h"

#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif

/* Denied outright with EPERM. */
static const char *const denied[] = {
    /* namespaces and the mount API */
    "unshare",
    "setns",
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    /* kernel attack surface the interpreters never need */
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "keyctl",
    "add_key",
    "request_key",
    /* other processes' memory */
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_getfd",
    /* the machine itself */
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "syslog",
    "quotactl",
    "quotactl_fd",
    "lookup_dcookie",
    "nfsservctl",
    "uselib",
    "iopl",
    "ioperm",
    "vhangup",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "open_by_handle_at",
    "name_to_handle_at",
    "fanotify_init",
    "sethostname",
    "setdomainname",
    "_sysctl",
    "create_module",
    "get_kernel_syms",
    "query_module",
    "afs_syscall",
    "vserver",
    "modify_ldt",
};

/* Denied calls newer than the libseccomp that may be linked (Debian 12's 2.5.4 cannot resolve
 * these names, and a name it cannot resolve would silently get no rule). Calls added since 5.1
 * have one number on every architecture (alpha and mips add a fixed offset), so the number
 * stands in for the name. */
static const struct {
    const char *name;
    int nr;
} denied_by_number[] = {
    {"open_tree_attr", 467}, /* 6.15: open_tree() that can also set mount attributes */
};

static const unsigned long ns_flags[] = {CLONE_NEWNS,     CLONE_NEWUSER, CLONE_NEWPID,
                                         CLONE_NEWNET,    CLONE_NEWIPC,  CLONE_NEWUTS,
                                         CLONE_NEWCGROUP, CLONE_NEWTIME};

/* Socket families other than these three are refused. */
static int deny_families(scmp_filter_ctx ctx, const char *call)
{
    int nr = seccomp_syscall_resolve_name(call);
    int r =
        seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), nr, 1, SCMP_A0(SCMP_CMP_GT, AF_INET6));
    for (int fam = 0; !r && fam < AF_INET6; fam++)
        if (fam != AF_UNIX && fam != AF_INET)
            r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), nr, 1,
                                 SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)fam));
    return r;
}

static int add_rules(scmp_filter_ctx ctx)
{
    int r = 0;
    for (size_t i = 0; !r && i < ARRAY_SIZE(denied); i++) {
        int nr = seccomp_syscall_resolve_name(denied[i]);
        if (nr != __NR_SCMP_ERROR)
            r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0);
    }
    for (size_t i = 0; !r && i < ARRAY_SIZE(denied_by_number); i++) {
        int nr = seccomp_syscall_resolve_name(denied_by_number[i].name);
        r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM),
                             nr != __NR_SCMP_ERROR ? nr : denied_by_number[i].nr, 0);
    }
    /* clone3 passes its flags in memory a filter cannot read: make libc fall back to clone,
     * whose flags it can. */
    if (!r)
        r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
    for (size_t i = 0; !r && i < ARRAY_SIZE(ns_flags); i++)
        r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                             SCMP_A0(SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i]));
    /* Terminal injection; the kernel reads cmd as 32 bits, so compare only those (a value
     * with high bits set must not slip past). */
    if (!r)
        r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                             SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, TIOCSTI));
    if (!r)
        r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                             SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, TIOCLINUX));
    /* personality: only the query form; new personas (READ_IMPLIES_EXEC,
     * ADDR_NO_RANDOMIZE, ...) weaken the process. */
    if (!r)
        r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(personality), 1,
                             SCMP_A0(SCMP_CMP_NE, 0xffffffffu));
    if (!r)
        r = deny_families(ctx, "socket");
    if (!r)
        r = deny_families(ctx, "socketpair");
    return r;
}

struct sock_fprog *seccomp_compile(void)
{
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    if (!ctx) {
        errno = ENOMEM;
        return NULL;
    }
    struct sock_fprog *p = NULL;
    int fd = -1, r = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
    if (!r)
        r = add_rules(ctx);
    if (!r && (fd = memfd_create("runcell-seccomp", MFD_CLOEXEC)) < 0)
        r = -errno;
    if (!r)
        r = seccomp_export_bpf(ctx, fd);
    seccomp_release(ctx);
    off_t len = r ? 0 : lseek(fd, 0, SEEK_END);
    if (!r && (len <= 0 || len % (off_t)sizeof(struct sock_filter) ||
               len / (off_t)sizeof(struct sock_filter) > BPF_MAXINSNS))
        r = -EPROTO;
    if (!r) {
        p = xcalloc(1, sizeof(*p));
        p->len = (unsigned short)(len / (off_t)sizeof(struct sock_filter));
        p->filter = xmalloc((size_t)len);
        if (pread(fd, p->filter, (size_t)len, 0) != len)
            r = -EIO;
    }
    if (fd >= 0)
        close(fd);
    if (r) {
        if (p)
            free(p->filter);
        free(p);
        errno = -r;
        return NULL;
    }
    return p;
}
