/* attack.c - system calls Python's ctypes cannot make: the foreign x86 ABIs (x32 numbers,
 * i386 through int 0x80). Copied into a sandbox by tests/security/test_syscalls.py.
 *
 * usage: attack native|x32|int80
 * Prints what the call returned; a sandbox must kill the process (SIGSYS) for x32 and int80
 * before anything is printed. Exit status 0 when the call returned, 2 on a usage error. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define X32_SYSCALL_BIT 0x40000000L
#define I386_NR_GETPID  20

static long raw_syscall0(long nr)
{
    long ret;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(nr) : "rcx", "r11", "memory");
    return ret;
}

static long int80_syscall0(long nr)
{
    long ret;
    __asm__ volatile("int $0x80" : "=a"(ret) : "a"(nr) : "memory");
    return ret;
}

int main(int argc, char **argv)
{
    long ret;
    if (argc != 2)
        goto usage;
    if (!strcmp(argv[1], "native"))
        ret = raw_syscall0(SYS_getpid);
    else if (!strcmp(argv[1], "x32"))
        ret = raw_syscall0(X32_SYSCALL_BIT | SYS_getpid);
    else if (!strcmp(argv[1], "int80"))
        ret = int80_syscall0(I386_NR_GETPID);
    else
        goto usage;
    /* The raw calls return -errno rather than setting errno. */
    if (ret < 0 && ret > -4096)
        printf("%s returned error %s\n", argv[1], strerror((int)-ret));
    else
        printf("%s returned %ld\n", argv[1], ret);
    return 0;
usage:
    fprintf(stderr, "usage: attack native|x32|int80\n");
    return 2;
}
