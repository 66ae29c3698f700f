/* fuzz-sse.c - a fuzz target for the model client's reading of an answer (src/agent/llm.c):
 * server-sent events or plain JSON, chunks merged into content and tool calls. The model
 * endpoint is on the network and its text is written by a model: neither is trusted.
 *
 * The input is the body of a 200 answer. A reply that reads must have at most
 * AGENT_MAX_TOOL_CALLS calls, each with an id, a name and arguments; an error must never
 * carry the API key.
 *
 * Built with libFuzzer by `make fuzz` and run by tests/fuzz/run; the ordinary build links
 * it with tests/fuzz/replay.c, which replays the corpora as a unit test. */
#include <string.h>

#include "agent/agent-int.h"
#include "fuzz.h"

#define FUZZ_KEY "sk-fuzz-SECRET"

static struct llm_client *client;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    log_set_level(LOG_ERROR);
    struct llm_config cfg = {
        .base_url = "http://127.0.0.1:9/v1", .api_key = FUZZ_KEY, .model = "fuzz", .stream = true};
    if (llm_client_new(&cfg, &client) < 0)
        abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *body = xmalloc(size + 1); /* NUL-terminated, as the buffer is; NULs inside kept */
    memcpy(body, data, size);
    body[size] = '\0';
    struct llm_reply r = {0};
    int rc = llm_parse_reply(client, body, size, &r);
    if (rc < 0 && strstr(err_msg(), FUZZ_KEY))
        abort();
    if (rc == 0) {
        if (r.n_calls > AGENT_MAX_TOOL_CALLS)
            abort();
        for (size_t i = 0; i < r.n_calls; i++)
            if (!r.calls[i].id || !r.calls[i].name || !r.calls[i].arguments)
                abort();
    }
    llm_reply_release(&r);
    free(body);
    return 0;
}
