/* fuzz-mcp.c - a fuzz target for the MCP message parser and dispatcher (src/mcp).
 *
 * The first byte picks the protocol version the connection is initialized with (or none);
 * the rest is fed line by line as messages, and each line also goes through mcp_msg_check
 * and, for a tools/call, mcp_tool_check_args. The connection has no session table, so tool
 * calls that pass the checks answer with an error instead of running code.
 *
 * With libFuzzer, from the top of the tree:
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -DRUNCELL_LIBFUZZER -D_GNU_SOURCE \
 *     -Isrc -DRUNCELL_LIBEXECDIR='"/x"' tests/fuzz/fuzz-mcp.c src/mcp/\*.c src/session/\*.c \
 *     src/kernel/kernel.c src/sandbox/{host,cgroup,workspace,wsfiles,spawn}.c src/base/\*.c \
 *     $(pkg-config --cflags --libs jansson) -lpthread -o fuzz-mcp
 *   ./fuzz-mcp -max_len=4096 CORPUS_DIR tests/fuzz/corpus/mcp
 * Without it (the build's default) the program replays files and directories of inputs,
 * which is how the corpus in tests/fuzz/corpus/mcp runs as a test. */
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "mcp/mcp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

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

#ifndef RUNCELL_LIBFUZZER
static int run_file(const char *path)
{
    char *data;
    size_t n;
    if (read_file(path, 1 << 20, &data, &n) < 0) {
        fprintf(stderr, "fuzz-mcp: cannot read %s\n", path);
        return 1;
    }
    LLVMFuzzerTestOneInput((const uint8_t *)data, n);
    free(data);
    printf("ok   %s\n", path);
    return 0;
}

static int run_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0 || !S_ISDIR(st.st_mode))
        return run_file(path);
    DIR *d = opendir(path);
    struct dirent *e;
    int failed = 0;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char *sub = xasprintf("%s/%s", path, e->d_name);
        failed |= run_file(sub);
        free(sub);
    }
    if (d)
        closedir(d);
    return failed;
}

int main(int argc, char **argv)
{
    int failed = 0;
    LLVMFuzzerInitialize(&argc, &argv);
    for (int i = 1; i < argc; i++)
        failed |= run_path(argv[i]);
    return failed;
}
#endif
