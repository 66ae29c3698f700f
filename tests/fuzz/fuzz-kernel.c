/* fuzz-kernel.c - a fuzz target for the kernel's framed protocol as the daemon reads it
 * (kernel_pump_channel in src/kernel/kernel.c): 4-byte big-endian length, a kind byte
 * ('M' JSON message, 'O'/'E' output), the payload. Code in the sandbox can write any bytes
 * on this channel.
 *
 * The first byte of the input picks how the rest reaches the daemon: 0, all at once;
 * N > 0, N bytes per read, so frames and headers are split across reads anywhere. The rest
 * is the channel's byte stream, which ends with EOF. Each event handed up must be one the
 * contract in kernel.h allows.
 *
 * Built with libFuzzer by `make fuzz` and run by tests/fuzz/run; the ordinary build links
 * it with tests/fuzz/replay.c, which replays the corpora as a unit test. */
#include <string.h>

#include "fuzz.h"
#include "kernel/kernel-int.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    log_set_level(LOG_ERROR);
    return 0;
}

/* What kernel.h promises of every event: output is bytes, never parsed; a message is a
 * JSON object with a string type; a display carries its data object. */
static void check_event(void *ctx, const struct kernel_event *ev)
{
    (*(size_t *)ctx)++;
    if (ev->len && !ev->data)
        abort();
    if ((ev->type == KEV_STDOUT || ev->type == KEV_STDERR) && ev->msg)
        abort();
    if (ev->type == KEV_DISPLAY && !json_is_object(json_object_get(ev->msg, "data")))
        abort();
    if ((ev->type == KEV_DISPLAY || ev->type == KEV_DONE || ev->type == KEV_HELLO ||
         ev->type == KEV_REPLY) &&
        !json_string_value(json_object_get(ev->msg, "type")))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t step = size ? data[0] : 0, events = 0;
    const char *p = (const char *)data + (size ? 1 : 0), *end = (const char *)data + size;
    int wfd;
    struct kernel *k = xcalloc(1, sizeof(*k));
    k->chan_fd = fuzz_pipe(NULL, 0, false, &wfd);
    k->out_fd = k->err_fd = -1;
    buf_init(&k->in, KERNEL_MAX_FRAME + 4096);
    int r = 0;
    while (r == 0) {
        size_t n = MIN(step ? step : 65536, (size_t)(end - p));
        if (n && write(wfd, p, n) != (ssize_t)n)
            abort();
        p += n;
        if (p == end && wfd >= 0) {
            close(wfd);
            wfd = -1;
        }
        r = kernel_pump_channel(k, check_event, &events);
        if (r < 0 && !*err_msg())
            abort(); /* a violation says what it was */
    }
    if (wfd >= 0)
        close(wfd);
    kernel_free(k);
    return 0;
}
