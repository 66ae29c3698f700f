/* cgroup-attach.c - what starting a process inside a fresh cgroup costs: fork then attach
 * (write the pid to cgroup.procs, what runcell did before clone3 and still does on cgroup
 * v1), against clone3(CLONE_INTO_CGROUP) on cgroup v2. Each round makes a cgroup, starts a
 * child in it that exits at once, reaps it and removes the cgroup; the times are of the
 * start only (fork + attach, or clone3), medians and 90th percentiles over the rounds.
 *
 * Writing cgroup.procs takes the cgroup threadgroup lock for writing, which waits for an RCU
 * grace period unless another write came shortly before: back-to-back rounds hide that
 * cost, so rounds are GAP_MS apart (default 50), as sandbox starts are.
 *
 * usage: cgroup-attach DIR [ROUNDS [GAP_MS]]
 *   DIR  a cgroup directory this process may create children in, on v2 for the clone3 half
 *        (as root on a pure v2 host: /sys/fs/cgroup; on v1: /sys/fs/cgroup/memory). */

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CLONE_INTO_CGROUP_FLAG 0x200000000ULL

struct clone_args_v2 {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid,
        set_tid_size, cgroup;
};

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One round: the child waits on a pipe until the start is timed, so that its exit is not. */
static double round_attach(const char *cg)
{
    int p[2];
    char path[4096], pid[32];
    if (pipe(p) < 0)
        return -1;
    double t0 = now_us();
    pid_t c = fork();
    if (c == 0) {
        char x;
        close(p[1]);
        (void)!read(p[0], &x, 1);
        _exit(0);
    }
    snprintf(path, sizeof(path), "%s/cgroup.procs", cg);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    int n = snprintf(pid, sizeof(pid), "%d", c);
    bool ok = fd >= 0 && write(fd, pid, (size_t)n) == n;
    double t = now_us() - t0;
    if (fd >= 0)
        close(fd);
    close(p[0]);
    close(p[1]);
    waitpid(c, NULL, 0);
    return ok ? t : -1;
}

static double round_clone3(const char *cg)
{
    int dir = open(cg, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0)
        return -1;
    struct clone_args_v2 a = {
        .flags = CLONE_INTO_CGROUP_FLAG, .exit_signal = SIGCHLD, .cgroup = (uint64_t)dir};
    double t0 = now_us();
    long c = syscall(SYS_clone3, &a, sizeof(a));
    if (c == 0)
        _exit(0);
    double t = now_us() - t0;
    close(dir);
    if (c < 0)
        return -1;
    waitpid((pid_t)c, NULL, 0);
    return t;
}

static int gap_ms = 50;

static int run(const char *name, const char *base, int rounds, double (*fn)(const char *))
{
    double *v = calloc((size_t)rounds, sizeof(double));
    char cg[4096];
    for (int i = 0; i < rounds; i++) {
        snprintf(cg, sizeof(cg), "%s/bench-attach-%d-%d", base, getpid(), i);
        if (mkdir(cg, 0755) < 0) {
            fprintf(stderr, "cgroup-attach: cannot create %s: %s\n", cg, strerror(errno));
            free(v);
            return -1;
        }
        usleep((useconds_t)gap_ms * 1000);
        v[i] = fn(cg);
        while (rmdir(cg) < 0 && errno == EBUSY)
            usleep(1000);
        if (v[i] < 0) {
            fprintf(stderr, "cgroup-attach: %s failed in %s: %s\n", name, cg, strerror(errno));
            free(v);
            return -1;
        }
    }
    qsort(v, (size_t)rounds, sizeof(double), cmp);
    printf("%-34s median %8.1f us   p90 %8.1f us   (%d rounds)\n", name, v[rounds / 2],
           v[rounds * 9 / 10], rounds);
    free(v);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: cgroup-attach DIR [ROUNDS [GAP_MS]]\n");
        return 2;
    }
    int rounds = argc > 2 ? atoi(argv[2]) : 200;
    if (rounds < 1)
        rounds = 1;
    if (argc > 3)
        gap_ms = atoi(argv[3]);
    int r = run("fork + attach (cgroup.procs)", argv[1], rounds, round_attach);
    if (r == 0 && run("clone3(CLONE_INTO_CGROUP)", argv[1], rounds, round_clone3) < 0)
        printf("clone3(CLONE_INTO_CGROUP) not available here (a cgroup v1 directory, or a "
               "kernel before 5.7)\n");
    return r < 0 ? 1 : 0;
}
