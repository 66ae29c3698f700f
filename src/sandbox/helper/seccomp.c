/* seccomp.c - the sandbox's system call filter, loaded last, right before exec.
 * Default allow; dangerous families denied (DESIGN.md "Security model"); foreign ABIs
 * (i386, x32) kill the process. */
#include "sandbox/helper/helper.h"

#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sched.h>
#include <seccomp.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
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

/* ---- socket types and protocols ----
 *
 * libseccomp compares an argument with one value or one mask at a time, so "the type,
 * flags masked off, is SOCK_STREAM or SOCK_DGRAM" is not a rule it can write. This second
 * filter, in plain BPF, says it for socket(2); it is stacked on the first, and the kernel
 * takes the strictest answer of the two (foreign ABIs stay killed by the first). Allowed:
 * AF_UNIX of any type; AF_INET and AF_INET6 with SOCK_STREAM or SOCK_DGRAM (SOCK_NONBLOCK
 * and SOCK_CLOEXEC allowed) and protocol 0, IPPROTO_TCP or IPPROTO_UDP. Anything else of
 * those families (raw, SCTP, ICMP "ping", MPTCP, UDP-Lite, ...) gets EPROTONOSUPPORT; other
 * families are refused by the first filter. The kernel reads the three arguments as int:
 * only their low 32 bits are compared, as the kernel will use them. */

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define ARG_LO(i) (offsetof(struct seccomp_data, args) + 8 * (i))
#else
#define ARG_LO(i) (offsetof(struct seccomp_data, args) + 8 * (i) + 4)
#endif

#if defined(__x86_64__)
#define NATIVE_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define NATIVE_AUDIT_ARCH AUDIT_ARCH_AARCH64
#endif

#ifdef NATIVE_AUDIT_ARCH
static const struct sock_filter socket_filter[] = {
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NATIVE_AUDIT_ARCH, 1, 0),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW), /* the first filter kills it */
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_socket, 1, 0),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    /* family */
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(0)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_INET, 2, 0),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_INET6, 1, 0),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW), /* AF_UNIX, or refused by the first */
    /* type, without its flags */
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(1)),
    BPF_STMT(BPF_ALU | BPF_AND | BPF_K, ~(uint32_t)(SOCK_NONBLOCK | SOCK_CLOEXEC)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SOCK_STREAM, 1, 0),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SOCK_DGRAM, 0, 5),
    /* protocol */
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(2)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 2, 0),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, IPPROTO_TCP, 1, 0),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, IPPROTO_UDP, 0, 1),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPROTONOSUPPORT & SECCOMP_RET_DATA)),
};
#endif

/* Stacks socket_filter on the filter just loaded (no_new_privs is set by then). socketpair
 * needs no such check: the kernel makes no internet socket pairs. */
static int install_socket_filter(void)
{
#ifdef NATIVE_AUDIT_ARCH
    struct sock_fprog prog = {.len = (unsigned short)ARRAY_SIZE(socket_filter),
                              .filter = (struct sock_filter *)socket_filter};
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) < 0)
        return fail_errno("cannot load the socket type filter");
#endif
    return 0;
}

/* The filter built with libseccomp and exported as the BPF program the kernel loads:
 * installing it is then one system call, with no allocation (a clone of the template
 * installs the one the template compiled once). */
struct seccomp_prog {
    struct sock_fprog prog;
};

void *seccomp_compile(void)
{
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    if (!ctx) {
        errno = ENOMEM;
        return NULL;
    }
    struct seccomp_prog *p = NULL;
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
        p->prog.len = (unsigned short)(len / (off_t)sizeof(struct sock_filter));
        p->prog.filter = xmalloc((size_t)len);
        if (pread(fd, p->prog.filter, (size_t)len, 0) != len)
            r = -EIO;
    }
    if (fd >= 0)
        close(fd);
    if (r) {
        if (p)
            free(p->prog.filter);
        free(p);
        errno = -r;
        return NULL;
    }
    return p;
}

void *seccomp_build(void)
{
    void *p = seccomp_compile();
    if (!p)
        fail_errno("cannot build the seccomp filter");
    return p;
}

int seccomp_install(void *filter)
{
    const struct seccomp_prog *p = filter;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return fail_errno("cannot set no_new_privs");
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &p->prog) < 0)
        return fail_errno("cannot load the seccomp filter");
    return install_socket_filter();
}
