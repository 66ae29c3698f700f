/* runner.h - a tiny unit test runner: each test runs in its own forked process with a
 * timeout (libuv's habit), so a crash or hang fails one test and the rest still run.
 *
 *   TEST(name) { CHECK(1 + 1 == 2); CHECK_STREQ(a, b); }
 *   int main(int argc, char **argv) { return run_tests(argc, argv); }
 *
 * A test registers itself through a constructor; `prog NAME...` runs only those. */
#ifndef RUNCELL_TEST_RUNNER_H
#define RUNCELL_TEST_RUNNER_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define TEST_TIMEOUT_S 60
#define MAX_TESTS      256

struct test_case {
    const char *name;
    void (*fn)(void);
};
static struct test_case tests_[MAX_TESTS];
static int n_tests_;
static int skipped_;

#define TEST(name)                                                                                 \
    static void test_##name(void);                                                                 \
    __attribute__((constructor)) static void register_##name(void)                                 \
    {                                                                                              \
        if (n_tests_ < MAX_TESTS)                                                                  \
            tests_[n_tests_++] = (struct test_case){#name, test_##name};                           \
    }                                                                                              \
    static void test_##name(void)

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define CHECK_STREQ(a, b)                                                                          \
    do {                                                                                           \
        const char *a_ = (a), *b_ = (b);                                                           \
        if (!a_ || !b_ || strcmp(a_, b_)) {                                                        \
            fprintf(stderr, "%s:%d: \"%s\" != \"%s\"\n", __FILE__, __LINE__, a_ ? a_ : "(null)",   \
                    b_ ? b_ : "(null)");                                                           \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* Skips the running test with a reason; counted and printed, never a silent pass. */
#define SKIP(reason)                                                                               \
    do {                                                                                           \
        fprintf(stderr, "skip: %s\n", reason);                                                     \
        exit(77);                                                                                  \
    } while (0)

static int run_one_(const struct test_case *t)
{
    pid_t pid = fork();
    if (pid == 0) {
        alarm(TEST_TIMEOUT_S);
        t->fn();
        exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        printf("ok   %s\n", t->name);
        return 0;
    }
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77) {
        printf("skip %s\n", t->name);
        skipped_++;
        return 0;
    }
    if (WIFSIGNALED(st))
        printf("FAIL %s (signal %d%s)\n", t->name, WTERMSIG(st),
               WTERMSIG(st) == SIGALRM ? ": timeout" : "");
    else
        printf("FAIL %s\n", t->name);
    return 1;
}

static int run_tests(int argc, char **argv)
{
    int failed = 0, ran = 0;
    setvbuf(stdout, NULL, _IONBF, 0);
    for (int i = 0; i < n_tests_; i++) {
        int selected = argc < 2;
        for (int a = 1; a < argc; a++)
            selected |= !strcmp(argv[a], tests_[i].name);
        if (!selected)
            continue;
        ran++;
        failed += run_one_(&tests_[i]);
    }
    printf("%d tests, %d failed, %d skipped\n", ran, failed, skipped_);
    return failed ? 1 : 0;
}

#endif
