/* seccomp.c - the sandbox's system call filter, loaded last, right before exec: the
 * program seccomp-rules.c compiles with libseccomp, compiled when runcell is built
 * (seccomp-gen.c writes it into seccomp-filter.h), so that no sandbox's start pays for
 * libseccomp (~1.3 ms of CPU here, its first use in a process), then a second, plain-BPF
 * filter for socket types. */
#include "sandbox/helper/helper.h"

#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/base.h"
#include "seccomp-filter.h" /* generated: seccomp_compiled[] */

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

/* Installing it is one system call, with no allocation. */
static const struct sock_fprog compiled = {
    .len = (unsigned short)ARRAY_SIZE(seccomp_compiled),
    .filter = (struct sock_filter *)seccomp_compiled,
};

void *seccomp_build(void)
{
    return (void *)&compiled;
}

int seccomp_install(void *filter)
{
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return fail_errno("cannot set no_new_privs");
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, (const struct sock_fprog *)filter) < 0)
        return fail_errno("cannot load the seccomp filter");
    return install_socket_filter();
}
