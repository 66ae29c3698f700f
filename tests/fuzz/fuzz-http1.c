/* fuzz-http1.c - a fuzz target for the HTTP/1.1 parser of connections the egress proxy
 * intercepts (src/net/http1.c): requests code in a sandbox sends to a host that a secret is
 * for, which the proxy reads, gives the secret and forwards.
 *
 * The first byte picks TLS (even) or plain HTTP (odd). The rest is a head, up to its empty
 * line, then a body. A head that parses is rebuilt with a secret for the host: the result
 * must be one head (a single empty line, at its end), carry the secret's header exactly once
 * and no header of that name from the client. The body is fed in pieces of sizes taken from
 * the input; what is consumed never exceeds what was given.
 *
 * Built with libFuzzer by `make fuzz` and run by tests/fuzz/run; the ordinary build links
 * it with tests/fuzz/replay.c, which replays the corpora as a unit test. */
#include <string.h>
#include <strings.h>

#include "fuzz.h"
#include "net/net-int.h"

static struct net_secret secret = {.header = (char *)"X-Key", .value = (char *)"SECRETVALUE"};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    log_set_level(LOG_ERROR);
    return 0;
}

static void check_built(const struct h1_request *rq)
{
    const struct net_secret *sel[] = {&secret};
    struct buf out;
    buf_init(&out, 0);
    h1_build_head(rq, sel, 1, false, &out);
    if (out.len < 4 || memcmp(out.data + out.len - 4, "\r\n\r\n", 4) ||
        memmem(out.data, out.len, "\r\n\r\n", 4) != out.data + out.len - 4 ||
        strlen(out.data) != out.len)
        abort(); /* one head only */
    /* Every line named X-Key (any case) is the secret's, and there is one. */
    size_t named = 0;
    for (const char *line = out.data; line < out.data + out.len;) {
        const char *eol = memmem(line, out.len - (size_t)(line - out.data), "\r\n", 2);
        if (!eol)
            abort();
        if ((size_t)(eol - line) >= 6 && !strncasecmp(line, "x-key:", 6)) {
            if ((size_t)(eol - line) != 18 || memcmp(line, "X-Key: SECRETVALUE", 18))
                abort();
            named++;
        }
        line = eol + 2;
    }
    if (named != 1)
        abort();
    buf_release(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    bool tls = data[0] % 2 == 0;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    const char *end = memmem(text, n, "\r\n\r\n", 4);
    if (!end)
        return 0;
    size_t head_len = (size_t)(end + 4 - text);
    struct h1_request rq;
    if (h1_parse_head(text, head_len, "api.test", tls ? 443 : 80, tls, &rq))
        return 0;
    if (!rq.path || rq.path < text || rq.path + rq.path_len > text + head_len)
        abort();
    check_built(&rq);
    struct h1_body b;
    h1_body_init(&b, &rq);
    const char *body = text + head_len;
    size_t left = n - head_len;
    for (size_t step = 1; left && b.state != H1_BODY_DONE; step = step % 7 + 1) {
        size_t piece = MIN(step, left);
        ssize_t k = h1_body_feed(&b, body, piece);
        if (k < 0)
            break;
        if ((size_t)k > piece || ((size_t)k < piece && b.state != H1_BODY_DONE))
            abort(); /* it takes all it is given until the body ends */
        body += k;
        left -= (size_t)k;
    }
    return 0;
}
