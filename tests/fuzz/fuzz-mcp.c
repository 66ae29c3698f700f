/* fuzz-mcp.c - a fuzz target for the MCP message parser and dispatcher (src/mcp).
 *
 * The first byte picks the protocol version the connection is initialized with (or none);
 * the rest is fed line by line as messages, and each line also goes through mcp_msg_check
 * and, for a tools/call, mcp_tool_check_args. The connection has no session table, so tool
 * calls that pass the checks answer with an error instead of running code.
 *
 * Built with libFuzzer by `make fuzz` and run by tests/fuzz/run; the ordinary build links
 * it with tests/fuzz/replay.c, which replays the corpora as a unit test. */
#include <stdio.h>
#include <string.h>

#include "fuzz.h"
#include "mcp/mcp.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    log_set_level(LOG_WARN);
    return 0;
}

static void drop(void *ctx, const char *msg, size_t len, bool response)
{
    (void)ctx, (void)response;
    if (memchr(msg, '\n', len))
        abort(); /* a message must fit on one line */
}

static void closed(void *ctx)
{
    (*(int *)ctx)++;
}

static void check_line(const char *line, size_t len)
{
    json_t *v = json_loadb(line, len, 0, NULL);
    struct mcp_msg m;
    char *err = NULL;
    if (v && mcp_msg_check(v, &m, &err) == 0 && m.method && !strcmp(m.method, "tools/call")) {
        free(err);
        err = NULL;
        mcp_tool_check_args(json_string_value(json_object_get(m.params, "name")),
                            json_object_get(m.params, "arguments"), &err);
    }
    free(err);
    json_decref(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const struct mcp_config cfg = {.server_version = "fuzz", .max_timeout_ms = 1000};
    struct mcp_conn *c = mcp_conn_new(&cfg);
    int closes = 0, inputs = 0;
    struct mcp_sink sink = {.send = drop, .close = closed, .ctx = &closes};
    if (size && data[0] % 5 < 4) {
        char *init = xasprintf("{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\","
                               "\"params\":{\"protocolVersion\":\"%s\"}}",
                               mcp_versions[data[0] % 5]);
        mcp_conn_handle(c, init, strlen(init), &sink);
        inputs++;
        free(init);
    }
    const char *p = (const char *)data + (size ? 1 : 0), *end = (const char *)data + size;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        check_line(p, n);
        mcp_conn_handle(c, p, n, &sink);
        inputs++;
        p += n + 1;
    }
    mcp_conn_free(c);
    if (closes != inputs)
        abort(); /* every input closes its sink exactly once */
    return 0;
}
