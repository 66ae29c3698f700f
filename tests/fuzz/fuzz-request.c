/* fuzz-request.c - a fuzz target for the egress proxy's request reader and parser
 * (src/net/request.c): what code in a sandbox sends the proxy before it is let out.
 *
 * The first byte picks the entry point: even, proxy_read_request reads the rest from a
 * pipe (head framing, the cap, leading empty lines, then the parse); odd, the rest goes
 * straight to proxy_parse_request as a complete head. A request that parses must name a
 * host the policy can check (a name or an IP literal, nothing else) and a port, and a
 * plain-HTTP one must come with a well-formed head to forward.
 *
 * Built with libFuzzer by `make fuzz` and run by tests/fuzz/run; the ordinary build links
 * it with tests/fuzz/replay.c, which replays the corpora as a unit test. */
#include <ctype.h>
#include <string.h>

#include "fuzz.h"
#include "net/net-int.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    log_set_level(LOG_ERROR);
    return 0;
}

static void check_parsed(const struct proxy_request *rq)
{
    size_t n = strlen(rq->host);
    if (!n || n >= sizeof(rq->host) || !rq->port)
        abort();
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)rq->host[i]) && !strchr(".-_:", rq->host[i]))
            abort();
    if (rq->connect)
        return;
    const struct buf *f = &rq->forward;
    size_t ml = strlen(rq->method);
    if (f->len < ml + 4 || memcmp(f->data, rq->method, ml) || f->data[ml] != ' ' ||
        memcmp(f->data + f->len - 4, "\r\n\r\n", 4) || strlen(f->data) != f->len)
        abort();
    if (memmem(f->data, f->len, "\r\n\r\n", 4) != f->data + f->len - 4)
        abort(); /* one head only: nothing the client sent may end it early */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!size)
        return 0;
    struct proxy_request rq;
    int r;
    if (data[0] % 2 == 0) {
        int fd = fuzz_pipe(data + 1, size - 1, true, NULL);
        struct buf head;
        buf_init(&head, NET_MAX_HEAD + 1); /* as the proxy reads it */
        r = proxy_read_request(fd, &head, &rq);
        if (r == 0 && rq.rest_len > head.len)
            abort();
        buf_release(&head);
        close(fd);
    } else {
        memset(&rq, 0, sizeof(rq));
        buf_init(&rq.forward, 2 * NET_MAX_HEAD);
        r = proxy_parse_request((const char *)data + 1, size - 1, &rq);
    }
    if (r == 0)
        check_parsed(&rq);
    buf_release(&rq.forward);
    return 0;
}
