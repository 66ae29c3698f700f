/* test-helper.c - unit tests for the sandbox helper's code (src/sandbox/helper) that need
 * no privileges: the seccomp filter the build embeds. The sandbox's filter is tested by
 * attack, from inside real sandboxes, in tests/security. */
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/personality.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runner.h"
#include "sandbox/helper/helper.h"
#include "sandbox/helper/seccomp-rules.h"

/* What the build embedded is what libseccomp compiles from the rules now, instruction for
 * instruction: a rule changed without the program following would fail here. */
TEST(embedded_filter_is_the_compiled_rules)
{
    const struct sock_fprog *embedded = seccomp_build();
    struct sock_fprog *now = seccomp_compile();
    CHECK(embedded != NULL && now != NULL);
    CHECK(embedded->len == now->len);
    CHECK(embedded->len > 50); /* the denied families are there, not an empty program */
    CHECK(memcmp(embedded->filter, now->filter, now->len * sizeof(*now->filter)) == 0);
    free(now->filter);
    free(now);
}

/* Loaded in a child, the embedded filter refuses what the rules say and allows the rest. */
TEST(embedded_filter_refuses_and_allows)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        if (seccomp_install(seccomp_build()) < 0)
            _exit(10);
        /* each refused by the filter alone: allowed to anyone without it */
        if (personality(PER_LINUX32) != -1 || errno != EPERM)
            _exit(11);
        if (syscall(SYS_clone3, NULL, 0) != -1 || errno != ENOSYS)
            _exit(16);
        if (unshare(CLONE_NEWNS) == 0 || errno != EPERM) /* as root, only the filter */
            _exit(17);
        if (socket(AF_PACKET, SOCK_RAW, 0) >= 0 || errno != EAFNOSUPPORT)
            _exit(12);
        if (socket(AF_INET, SOCK_RAW, 1) >= 0 || errno != EPROTONOSUPPORT)
            _exit(13);
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            _exit(14);
        close(fd);
        if (open("/dev/null", O_RDONLY | O_CLOEXEC) < 0)
            _exit(15);
        _exit(0);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
}

int main(int argc, char **argv)
{
    return run_tests(argc, argv);
}
