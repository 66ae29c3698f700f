/* fuzz-record.c - a fuzz target for the result record built from what a kernel sends
 * (src/session/session.c's event handling, record.c's JSON, the API's NDJSON events of
 * routes_exec.c, and the text an agent's model is shown of it, agent/observe.c): MIME
 * bundles, the done message with its error object and exit code, output streams through
 * the output cap. Code in the sandbox writes all of it.
 *
 * The first byte picks the output cap (64 bytes to 1 MiB, so that truncation is reached);
 * the rest is the kernel's channel (see fuzz-kernel.c), read cell after cell until EOF or a
 * protocol violation. Each record's JSON must have all its fields: a value that cannot be
 * JSON must not make one vanish.
 *
 * Built with libFuzzer by `make fuzz` and run by tests/fuzz/run; the ordinary build links
 * it with tests/fuzz/replay.c, which replays the corpora as a unit test. */
#include <string.h>

#include "agent/agent-int.h"
#include "api/api.h"
#include "fuzz.h"
#include "kernel/kernel-int.h"
#include "session/session-int.h"

#define MAX_CELLS 64

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    log_set_level(LOG_ERROR);
    return 0;
}

static void on_event(void *ctx, const struct exec_event *ev)
{
    (void)ctx;
    json_t *j = exec_event_json(ev);
    char *text = json_dumps(j, JSON_COMPACT);
    if (!text || !json_object_get(j, "type"))
        abort();
    free(text);
    json_decref(j);
}

static void check_record(const struct exec_record *rec)
{
    static const char *const fields[] = {"status", "stdout", "stderr",    "truncated", "results",
                                         "error",  "files",  "exit_code", "usage"};
    json_t *j = exec_record_json(rec);
    for (size_t i = 0; i < ARRAY_SIZE(fields); i++)
        if (!json_object_get(j, fields[i]))
            abort();
    char *text = json_dumps(j, JSON_COMPACT);
    if (!text)
        abort();
    free(text);
    json_decref(j);
    free(observation_text(rec, NULL, NULL));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t cap = 64u << (size ? (data[0] % 8) * 2 : 0);
    struct kernel *k = xcalloc(1, sizeof(*k));
    k->chan_fd = fuzz_pipe(data + (size ? 1 : 0), size ? size - 1 : 0, true, NULL);
    k->out_fd = k->err_fd = -1;
    buf_init(&k->in, KERNEL_MAX_FRAME + 4096);
    struct exec_sink sink = {.fn = on_event};
    int r = 0;
    for (int cell = 0; cell < MAX_CELLS && r == 0; cell++) {
        struct exec_record rec;
        exec_record_init(&rec, cap);
        r = session_record_from_channel(k, &sink, &rec);
        check_record(&rec);
        exec_record_release(&rec);
    }
    kernel_free(k);
    return 0;
}
