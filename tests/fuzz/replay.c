/* replay.c - the main() of a fuzz target when it is not built with libFuzzer: runs each
 * file named, and each file of each directory named, through LLVMFuzzerTestOneInput once.
 *
 * This is how the ordinary build replays the committed corpora (tests/fuzz/corpus) as unit
 * tests: a crash, an abort or a sanitizer report fails the test like any other. The
 * libFuzzer build (-Dfuzz=true, tests/fuzz/run) links libFuzzer's main instead. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/base.h"

#define REPLAY_MAX_INPUT (1u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* Optional in a target, as with libFuzzer. */
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int run_file(const char *path)
{
    char *data;
    size_t n;
    if (read_file(path, REPLAY_MAX_INPUT, &data, &n) < 0) {
        fprintf(stderr, "replay: cannot read %s (missing, or larger than %u bytes)\n", path,
                REPLAY_MAX_INPUT);
        return 1;
    }
    /* A copy of exactly n bytes, so that ASan sees a read past the input as one. */
    uint8_t *exact = xmalloc(n ? n : 1);
    memcpy(exact, data, n);
    free(data);
    printf("%s ... ", path); /* before: a crash names its input */
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    printf("ok\n");
    return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

static int run_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0 || !S_ISDIR(st.st_mode))
        return run_file(path);
    struct dirent **names;
    int n = scandir(path, &names, NULL, by_name), failed = n < 0;
    if (n < 0)
        fprintf(stderr, "replay: cannot read directory %s\n", path);
    for (int i = 0; i < n; i++) {
        if (names[i]->d_name[0] != '.') {
            char *sub = xasprintf("%s/%s", path, names[i]->d_name);
            failed |= run_path(sub);
            free(sub);
        }
        free(names[i]);
    }
    if (n >= 0)
        free(names);
    return failed;
}

int main(int argc, char **argv)
{
    int failed = 0;
    setvbuf(stdout, NULL, _IONBF, 0);
    if (LLVMFuzzerInitialize)
        LLVMFuzzerInitialize(&argc, &argv);
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
        return 2;
    }
    for (int i = 1; i < argc; i++)
        failed |= run_path(argv[i]);
    return failed;
}
