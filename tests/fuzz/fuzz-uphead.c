/* fuzz-uphead.c - a fuzz target for the reading of an upstream's answer head
 * (src/http/uphead.c): what a server in a sandbox answers the preview proxy, and a node
 * answers a fleet's forwarder. The server is hostile.
 *
 * The input is split into lines at '\n' (each keeping it), as curl hands a head over. What
 * is kept must be passable to a client: at most UP_HEADERS_MAX lines, each "NAME: VALUE"
 * with a token NAME that is not hop-by-hop nor the caller's own, no CR, LF or NUL anywhere;
 * a status from 100 to 999; nothing read past UP_HEAD_MAX bytes.
 *
 * Built with libFuzzer by `make fuzz` and run by tests/fuzz/run; the ordinary build links
 * it with tests/fuzz/replay.c, which replays the corpora as a unit test. */
#include <string.h>
#include <strings.h>

#include "fuzz.h"
#include "http/http.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    log_set_level(LOG_ERROR);
    return 0;
}

static const char *const own[] = {"x-runcell-node", NULL};

static void check(const struct up_head *h)
{
    if (h->n > UP_HEADERS_MAX || strv_len(h->lines) != h->n)
        abort();
    if (h->status && (h->status < 100 || h->status > 999))
        abort();
    for (char **l = h->lines; l && *l; l++) {
        size_t name = strcspn(*l, ":");
        if (!name || strncmp(*l + name, ": ", 2) || strpbrk(*l, "\r\n"))
            abort();
        for (size_t i = 0; i < name; i++)
            if (!strchr("!#$%&'*+-.^_`|~", (*l)[i]) &&
                !(((*l)[i] | 0x20) >= 'a' && ((*l)[i] | 0x20) <= 'z') &&
                !((*l)[i] >= '0' && (*l)[i] <= '9'))
                abort();
        if (http_hop_header(*l, name) || (name == 14 && !strncasecmp(*l, own[0], 14)))
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct up_head h;
    up_head_init(&h, own);
    size_t at = 0, seen = 0;
    while (at < size) {
        const uint8_t *nl = memchr(data + at, '\n', size - at);
        size_t len = nl ? (size_t)(nl - (data + at)) + 1 : size - at;
        seen += len;
        enum up_head_result r = up_head_line(&h, (const char *)data + at, len);
        check(&h);
        if (r == UP_HEAD_TOO_LARGE) {
            if (seen <= UP_HEAD_MAX)
                abort();
            break;
        }
        if (seen > UP_HEAD_MAX)
            abort(); /* past the cap, it must have said so */
        if (r == UP_HEAD_DONE && !h.done)
            abort();
        at += len;
    }
    up_head_release(&h);
    return 0;
}
