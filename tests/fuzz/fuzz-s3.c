/* fuzz-s3.c - a fuzz target for what runcell reads from an S3 server's answers
 * (src/store/store_s3.c): a ListObjectsV2 page, and the Code and Message of an error body.
 * The server is on the network; a broken or hostile one must not crash the daemon.
 *
 * The first byte picks the store's prefix ("", "runcell" or "a/b") and whether the page was
 * asked for with a token ("tok", top bit set); the rest is the body, NUL-terminated as the
 * store's buffer is. Each listed key must be the part of a key after the prefix, the
 * listing must stay within STORE_LIST_MAX, and a next token must be a new one.
 *
 * Built with libFuzzer by `make fuzz` and run by tests/fuzz/run; the ordinary build links
 * it with tests/fuzz/replay.c, which replays the corpora as a unit test. */
#include <string.h>

#include "fuzz.h"
#include "store/store-int.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    log_set_level(LOG_ERROR);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const prefixes[] = {"", "runcell", "a/b"};
    if (!size)
        return 0;
    const char *prefix = prefixes[data[0] % ARRAY_SIZE(prefixes)];
    char *xml = xstrndup((const char *)data + 1, size - 1);
    struct store_listing l = {0};
    size_t alloc = 0;
    char *token = NULL;
    int r = s3_parse_list_page(prefix, xml, data[0] & 0x80 ? "tok" : NULL, &l, &alloc, &token);
    if ((r == 0 && l.n > STORE_LIST_MAX) || (token && (!*token || (r < 0))))
        abort();
    for (size_t i = 0; i < l.n; i++)
        if (!l.v[i].key || strlen(l.v[i].key) >= size)
            abort();
    free(token);
    store_listing_release(&l);
    free(s3_xml_field(xml, "Code", NULL));
    free(s3_xml_field(xml, "Message", NULL));
    free(xml);
    return 0;
}
