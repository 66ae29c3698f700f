/* fuzz.h - what every fuzz target in tests/fuzz shares: libFuzzer's entry points, and a
 * pipe that hands the input to code that reads a file descriptor. */
#ifndef RUNCELL_FUZZ_H
#define RUNCELL_FUZZ_H

#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/base.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* The most a pipe from fuzz_pipe holds (the kernel's default pipe-max-size): inputs are
 * cut there, which no target needs more than. */
#define FUZZ_PIPE_MAX (1u << 20)

/* A pipe whose read end (returned) holds the first n bytes of data (at most FUZZ_PIPE_MAX)
 * and then reads EOF when close_write, or EAGAIN when not (*ret_write keeps the write end
 * open for more; -1 when closed). Aborts when the machine gives no pipe: the target cannot
 * run at all then. */
static inline int fuzz_pipe(const void *data, size_t n, bool close_write, int *ret_write)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC | O_NONBLOCK) < 0)
        abort();
    if (n > FUZZ_PIPE_MAX)
        n = FUZZ_PIPE_MAX;
    if (n > 65536)
        fcntl(p[1], F_SETPIPE_SZ, FUZZ_PIPE_MAX);
    if (n && write(p[1], data, n) != (ssize_t)n)
        abort();
    if (close_write) {
        close(p[1]);
        p[1] = -1;
    }
    if (ret_write)
        *ret_write = p[1];
    else if (p[1] >= 0)
        close(p[1]);
    return p[0];
}

#endif
