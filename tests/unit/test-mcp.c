/* test-mcp.c - unit tests for src/mcp: the JSON-RPC parser, the handshake of each protocol
 * version, tools/list, and the errors, through a connection that has no sandbox (tool calls
 * that would run code are covered by tests/integration/test_mcp.py). */
#include <string.h>

#include "mcp/mcp.h"
#include "runner.h"

struct collected {
    json_t *msgs; /* every message sent, parsed */
    int responses;
    int closes;
};

static void c_send(void *ctx, const char *msg, size_t len, bool response)
{
    struct collected *c = ctx;
    json_error_t e;
    json_t *j = json_loadb(msg, len, 0, &e);
    CHECK(j != NULL);
    CHECK(memchr(msg, '\n', len) == NULL); /* one message per line on stdio */
    json_array_append_new(c->msgs, j);
    c->responses += response;
}

static void c_close(void *ctx)
{
    ((struct collected *)ctx)->closes++;
}

struct fixture {
    struct mcp_config cfg;
    struct mcp_conn *conn;
    struct collected got;
    struct mcp_sink sink;
};

static void fx_init(struct fixture *f)
{
    memset(f, 0, sizeof(*f));
    f->cfg.server_version = "test";
    f->cfg.max_timeout_ms = 60000;
    f->conn = mcp_conn_new(&f->cfg);
    f->got.msgs = json_array();
    f->sink = (struct mcp_sink){.send = c_send, .close = c_close, .ctx = &f->got};
}

static void fx_free(struct fixture *f)
{
    mcp_conn_free(f->conn);
    json_decref(f->got.msgs);
}

/* Sends text; returns the one message it was answered with (borrowed), or NULL. */
static json_t *say(struct fixture *f, const char *text, enum mcp_input *ret_in)
{
    size_t before = json_array_size(f->got.msgs);
    int closes = f->got.closes;
    enum mcp_input in = mcp_conn_handle(f->conn, text, strlen(text), &f->sink);
    if (ret_in)
        *ret_in = in;
    CHECK(f->got.closes == closes + 1); /* every input closes its sink once */
    size_t after = json_array_size(f->got.msgs);
    CHECK(after <= before + 1);
    return after > before ? json_array_get(f->got.msgs, after - 1) : NULL;
}

static json_int_t error_code(json_t *msg)
{
    return json_integer_value(json_object_get(json_object_get(msg, "error"), "code"));
}

static const char *error_message(json_t *msg)
{
    return json_string_value(json_object_get(json_object_get(msg, "error"), "message"));
}

static json_t *result(json_t *msg)
{
    return json_object_get(msg, "result");
}

static void initialize(struct fixture *f, const char *version)
{
    char *text = xasprintf("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":"
                           "{\"protocolVersion\":\"%s\",\"capabilities\":{},\"clientInfo\":"
                           "{\"name\":\"unit\",\"version\":\"1\"}}}",
                           version);
    json_t *r = say(f, text, NULL);
    free(text);
    CHECK(r && result(r));
    CHECK(say(f, "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}", NULL) == NULL);
}

TEST(each_version_is_answered_in_kind)
{
    for (const char *const *v = mcp_versions; *v; v++) {
        struct fixture f;
        fx_init(&f);
        initialize(&f, *v);
        json_t *init = json_array_get(f.got.msgs, 0);
        CHECK_STREQ(json_string_value(json_object_get(result(init), "protocolVersion")), *v);
        CHECK(json_integer_value(json_object_get(init, "id")) == 1);
        json_t *info = json_object_get(result(init), "serverInfo");
        CHECK_STREQ(json_string_value(json_object_get(info, "name")), "runcell");
        /* serverInfo.title came with 2025-06-18 */
        bool titled = !strcmp(*v, "2025-11-25") || !strcmp(*v, "2025-06-18");
        CHECK((json_object_get(info, "title") != NULL) == titled);
        CHECK(json_object_get(json_object_get(result(init), "capabilities"), "tools"));
        CHECK_STREQ(mcp_conn_version(f.conn), *v);
        fx_free(&f);
    }
}

TEST(unknown_version_gets_the_newest)
{
    struct fixture f;
    fx_init(&f);
    json_t *r = say(&f,
                    "{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"method\":\"initialize\",\"params\":"
                    "{\"protocolVersion\":\"1999-01-01\"}}",
                    NULL);
    CHECK_STREQ(json_string_value(json_object_get(result(r), "protocolVersion")), "2025-11-25");
    CHECK_STREQ(json_string_value(json_object_get(r, "id")), "a");
    fx_free(&f);
}

TEST(initialize_needs_a_version_and_happens_once)
{
    struct fixture f;
    fx_init(&f);
    json_t *r =
        say(&f, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{}}", NULL);
    CHECK(error_code(r) == MCP_INVALID_PARAMS);
    CHECK(strstr(error_message(r), "protocolVersion"));
    CHECK(mcp_conn_version(f.conn) == NULL);
    initialize(&f, "2025-06-18");
    r = say(&f,
            "{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"initialize\",\"params\":"
            "{\"protocolVersion\":\"2025-11-25\"}}",
            NULL);
    CHECK(error_code(r) == MCP_INVALID_REQUEST);
    CHECK(strstr(error_message(r), "already initialized"));
    CHECK_STREQ(mcp_conn_version(f.conn), "2025-06-18");
    fx_free(&f);
}

TEST(requests_before_initialize_are_refused_but_ping_works)
{
    struct fixture f;
    fx_init(&f);
    json_t *r = say(&f, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}", NULL);
    CHECK(error_code(r) == MCP_INVALID_REQUEST);
    CHECK(strstr(error_message(r), "initialize"));
    r = say(&f, "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}", NULL);
    CHECK(json_is_object(result(r)) && json_object_size(result(r)) == 0);
    fx_free(&f);
}

TEST(malformed_json_is_a_parse_error_without_id)
{
    struct fixture f;
    enum mcp_input in;
    fx_init(&f);
    json_t *r = say(&f, "{\"jsonrpc\":\"2.0\",\"id\":1,", &in);
    CHECK(in == MCP_IN_INVALID);
    CHECK(error_code(r) == MCP_PARSE_ERROR);
    CHECK(json_object_get(r, "id") == NULL); /* no id: it could not be read */
    CHECK(strstr(error_message(r), "parse error"));
    r = say(&f, "\xff\xfe not utf-8", &in);
    CHECK(error_code(r) == MCP_PARSE_ERROR);
    fx_free(&f);
}

TEST(oversized_message_is_refused_unread)
{
    struct fixture f;
    fx_init(&f);
    int closes = f.got.closes;
    enum mcp_input in = mcp_conn_handle(f.conn, NULL, MCP_MAX_MESSAGE + 1, &f.sink);
    CHECK(in == MCP_IN_INVALID);
    CHECK(f.got.closes == closes + 1);
    json_t *r = json_array_get(f.got.msgs, 0);
    CHECK(error_code(r) == MCP_INVALID_REQUEST);
    CHECK(strstr(error_message(r), "limit"));
    fx_free(&f);
}

TEST(invalid_messages_name_the_problem)
{
    struct fixture f;
    fx_init(&f);
    initialize(&f, "2025-11-25");
    json_t *r = say(&f, "42", NULL);
    CHECK(error_code(r) == MCP_INVALID_REQUEST);
    r = say(&f, "{\"id\":1,\"method\":\"ping\"}", NULL);
    CHECK(error_code(r) == MCP_INVALID_REQUEST);
    CHECK(strstr(error_message(r), "jsonrpc"));
    r = say(&f, "{\"jsonrpc\":\"2.0\",\"id\":null,\"method\":\"ping\"}", NULL);
    CHECK(error_code(r) == MCP_INVALID_REQUEST);
    CHECK(json_object_get(r, "id") == NULL);
    r = say(&f, "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"ping\",\"params\":[1]}", NULL);
    CHECK(error_code(r) == MCP_INVALID_PARAMS);
    CHECK(json_integer_value(json_object_get(r, "id")) == 5);
    r = say(&f, "{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":7}", NULL);
    CHECK(error_code(r) == MCP_INVALID_REQUEST);
    r = say(&f, "{\"jsonrpc\":\"2.0\",\"id\":1,\"id\":2,\"method\":\"ping\"}", NULL);
    CHECK(error_code(r) == MCP_PARSE_ERROR); /* duplicate keys */
    fx_free(&f);
}

TEST(unknown_method_is_32601_and_named)
{
    struct fixture f;
    enum mcp_input in;
    fx_init(&f);
    initialize(&f, "2025-11-25");
    json_t *r = say(&f, "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"resources/list\"}", &in);
    CHECK(in == MCP_IN_REQUEST);
    CHECK(error_code(r) == MCP_METHOD_NOT_FOUND);
    CHECK(strstr(error_message(r), "resources/list"));
    CHECK(json_integer_value(json_object_get(r, "id")) == 3);
    fx_free(&f);
}

TEST(notifications_and_responses_get_no_answer)
{
    struct fixture f;
    enum mcp_input in;
    fx_init(&f);
    initialize(&f, "2025-11-25");
    CHECK(say(&f, "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/whatever\"}", &in) == NULL);
    CHECK(in == MCP_IN_NONE);
    CHECK(say(&f,
              "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":"
              "{\"requestId\":77}}",
              &in) == NULL);
    CHECK(say(&f, "{\"jsonrpc\":\"2.0\",\"method\":\"ping\",\"params\":[]}", &in) == NULL);
    CHECK(say(&f, "{\"jsonrpc\":\"2.0\",\"id\":4,\"result\":{}}", &in) == NULL);
    CHECK(in == MCP_IN_NONE);
    fx_free(&f);
}

static json_t *tool_named(json_t *list, const char *name)
{
    size_t i;
    json_t *t;
    json_array_foreach(
        json_object_get(result(list), "tools"), i,
        t) if (!strcmp(json_string_value(json_object_get(t, "name")), name)) return t;
    return NULL;
}

TEST(tools_list_fits_each_version)
{
    static const char *const names[] = {"run_code",      "run_shell",     "create_session",
                                        "close_session", "list_files",    "read_file",
                                        "write_file",    "wait_for_cell", "undo"};
    for (const char *const *v = mcp_versions; *v; v++) {
        struct fixture f;
        fx_init(&f);
        initialize(&f, *v);
        json_t *r = say(&f, "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/list\"}", NULL);
        CHECK(json_array_size(json_object_get(result(r), "tools")) == ARRAY_SIZE(names));
        bool structured = !strcmp(*v, "2025-11-25") || !strcmp(*v, "2025-06-18");
        bool annotated = strcmp(*v, "2024-11-05") != 0;
        for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
            json_t *t = tool_named(r, names[i]);
            CHECK(t != NULL);
            json_t *schema = json_object_get(t, "inputSchema");
            CHECK_STREQ(json_string_value(json_object_get(schema, "type")), "object");
            CHECK(json_is_false(json_object_get(schema, "additionalProperties")));
            CHECK(json_string_length(json_object_get(t, "description")) > 20);
            CHECK(json_is_object(json_object_get(t, "outputSchema")) == structured);
            CHECK((json_object_get(t, "title") != NULL) == structured);
            CHECK((json_object_get(t, "annotations") != NULL) == annotated);
        }
        json_t *code = json_object_get(
            json_object_get(json_object_get(tool_named(r, "run_code"), "inputSchema"),
                            "properties"),
            "code");
        CHECK_STREQ(json_string_value(json_object_get(code, "type")), "string");
        fx_free(&f);
    }
}

TEST(tools_list_refuses_a_cursor_it_never_gave)
{
    struct fixture f;
    fx_init(&f);
    initialize(&f, "2025-11-25");
    json_t *r = say(&f,
                    "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/list\",\"params\":"
                    "{\"cursor\":\"x\"}}",
                    NULL);
    CHECK(error_code(r) == MCP_INVALID_PARAMS);
    fx_free(&f);
}

TEST(unknown_tool_is_32602_and_named)
{
    struct fixture f;
    fx_init(&f);
    initialize(&f, "2025-11-25");
    json_t *r = say(&f,
                    "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/call\",\"params\":"
                    "{\"name\":\"rm_rf\",\"arguments\":{}}}",
                    NULL);
    CHECK(error_code(r) == MCP_INVALID_PARAMS);
    CHECK(strstr(error_message(r), "rm_rf"));
    CHECK(strstr(error_message(r), "run_code"));
    r = say(&f, "{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"tools/call\",\"params\":{}}", NULL);
    CHECK(error_code(r) == MCP_INVALID_PARAMS);
    r = say(&f,
            "{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"tools/call\",\"params\":"
            "{\"name\":\"run_code\",\"arguments\":[1]}}",
            NULL);
    CHECK(error_code(r) == MCP_INVALID_PARAMS);
    fx_free(&f);
}

static const char bad_args[] = "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"tools/call\",\"params\":"
                               "{\"name\":\"run_code\",\"arguments\":{\"code\":5}}}";

TEST(bad_arguments_are_protocol_errors_before_2025_11_25)
{
    struct fixture f;
    fx_init(&f);
    initialize(&f, "2025-06-18");
    json_t *r = say(&f, bad_args, NULL);
    CHECK(error_code(r) == MCP_INVALID_PARAMS);
    CHECK(strstr(error_message(r), "'code' must be a string"));
    fx_free(&f);
}

TEST(bad_arguments_are_tool_errors_from_2025_11_25)
{
    struct fixture f;
    fx_init(&f);
    initialize(&f, "2025-11-25");
    json_t *r = say(&f, bad_args, NULL);
    CHECK(json_is_true(json_object_get(result(r), "isError")));
    json_t *text =
        json_object_get(json_array_get(json_object_get(result(r), "content"), 0), "text");
    CHECK(strstr(json_string_value(text), "'code' must be a string"));
    fx_free(&f);
}

TEST(tool_call_without_sandbox_is_a_tool_error)
{
    struct fixture f;
    fx_init(&f);
    initialize(&f, "2025-11-25");
    json_t *r = say(&f,
                    "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"tools/call\",\"params\":"
                    "{\"name\":\"list_files\"}}",
                    NULL);
    CHECK(json_is_true(json_object_get(result(r), "isError")));
    fx_free(&f);
}

TEST(batches_only_in_2025_03_26)
{
    static const char batch[] = "[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"},"
                                "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"},"
                                "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"nope\"}]";
    struct fixture f;
    enum mcp_input in;
    fx_init(&f);
    initialize(&f, "2025-03-26");
    json_t *r = say(&f, batch, &in);
    CHECK(in == MCP_IN_REQUEST);
    CHECK(json_is_array(r) && json_array_size(r) == 2);
    CHECK(json_is_object(result(json_array_get(r, 0))));
    CHECK(error_code(json_array_get(r, 1)) == MCP_METHOD_NOT_FOUND);
    r = say(&f, "[]", &in);
    CHECK(in == MCP_IN_INVALID && error_code(r) == MCP_INVALID_REQUEST);
    r = say(&f, "[{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}]", &in);
    CHECK(r == NULL && in == MCP_IN_NONE);
    fx_free(&f);

    fx_init(&f);
    initialize(&f, "2025-11-25");
    r = say(&f, batch, &in);
    CHECK(in == MCP_IN_INVALID);
    CHECK(error_code(r) == MCP_INVALID_REQUEST);
    CHECK(strstr(error_message(r), "2025-03-26"));
    fx_free(&f);
}

TEST(check_args_names_what_is_wrong)
{
    char *err;
    json_t *a = json_loads("{\"code\":\"1\",\"language\":\"ruby\"}", 0, NULL);
    CHECK(mcp_tool_check_args("run_code", a, &err) == MCP_INVALID_PARAMS);
    CHECK(strstr(err, "language") && strstr(err, "ruby"));
    free(err);
    json_decref(a);
    a = json_loads("{\"code\":\"1\",\"cwd\":\"/\"}", 0, NULL);
    CHECK(mcp_tool_check_args("run_code", a, &err) == MCP_INVALID_PARAMS);
    CHECK(strstr(err, "unknown argument 'cwd'") && strstr(err, "timeout_s"));
    free(err);
    json_decref(a);
    a = json_loads("{\"code\":\"1\",\"timeout_s\":0}", 0, NULL);
    CHECK(mcp_tool_check_args("run_code", a, &err) == MCP_INVALID_PARAMS);
    CHECK(strstr(err, "more than 0"));
    free(err);
    json_decref(a);
    a = json_loads("{\"session_id\":null}", 0, NULL);
    CHECK(mcp_tool_check_args("run_code", a, &err) == MCP_INVALID_PARAMS);
    CHECK(strstr(err, "'code' is required"));
    free(err);
    json_decref(a);
    a = json_loads("{\"code\":\"1\",\"session_id\":null,\"timeout_s\":2.5}", 0, NULL);
    CHECK(mcp_tool_check_args("run_code", a, &err) == 0 && err == NULL);
    json_decref(a);
    a = json_object();
    CHECK(mcp_tool_check_args("list_files", a, &err) == 0);
    CHECK(mcp_tool_check_args("nope", a, &err) == MCP_INVALID_PARAMS);
    free(err);
    json_decref(a);
}

TEST(msg_check_classifies)
{
    struct mcp_msg m;
    char *err;
    json_t *v = json_loads("{\"jsonrpc\":\"2.0\",\"id\":\"x\",\"method\":\"ping\"}", 0, NULL);
    CHECK(mcp_msg_check(v, &m, &err) == 0 && m.kind == MCP_MSG_REQUEST);
    CHECK_STREQ(m.method, "ping");
    json_decref(v);
    v = json_loads("{\"jsonrpc\":\"2.0\",\"method\":\"n\"}", 0, NULL);
    CHECK(mcp_msg_check(v, &m, &err) == 0 && m.kind == MCP_MSG_NOTIFICATION);
    json_decref(v);
    v = json_loads("{\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":1,\"message\":\"m\"}}", 0,
                   NULL);
    CHECK(mcp_msg_check(v, &m, &err) == 0 && m.kind == MCP_MSG_RESPONSE);
    json_decref(v);
    v = json_loads("{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{},\"error\":{}}", 0, NULL);
    CHECK(mcp_msg_check(v, &m, &err) == MCP_INVALID_REQUEST);
    free(err);
    json_decref(v);
    v = json_loads("{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"ping\"}", 0, NULL);
    CHECK(mcp_msg_check(v, &m, &err) == MCP_INVALID_REQUEST && strstr(err, "id"));
    free(err);
    json_decref(v);
}

#define MODERN_META                                                                                \
    "\"_meta\":{\"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\","                       \
    "\"io.modelcontextprotocol/clientCapabilities\":{}}"

TEST(modern_requests_need_no_initialize)
{
    struct fixture f;
    enum mcp_input in;
    fx_init(&f);
    json_t *r = say(&f,
                    "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"server/discover\",\"params\":"
                    "{" MODERN_META "}}",
                    &in);
    CHECK(in == MCP_IN_REQUEST);
    CHECK_STREQ(json_string_value(json_object_get(result(r), "resultType")), "complete");
    CHECK(json_integer_value(json_object_get(result(r), "ttlMs")) > 0);
    CHECK(json_object_get(json_object_get(json_object_get(result(r), "capabilities"), "extensions"),
                          "io.modelcontextprotocol/tasks"));
    CHECK(mcp_conn_version(f.conn) == NULL); /* nothing negotiated: each request on its own */
    r = say(&f, "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\",\"params\":{" MODERN_META "}}",
            &in);
    CHECK(in == MCP_IN_NO_METHOD && error_code(r) == MCP_METHOD_NOT_FOUND);
    r = say(&f,
            "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/list\",\"params\":{\"_meta\":"
            "{\"io.modelcontextprotocol/protocolVersion\":\"2030-01-01\","
            "\"io.modelcontextprotocol/clientCapabilities\":{}}}}",
            &in);
    CHECK(in == MCP_IN_REFUSED && error_code(r) == MCP_UNSUPPORTED_VERSION);
    CHECK_STREQ(json_string_value(json_object_get(
                    json_object_get(json_object_get(r, "error"), "data"), "requested")),
                "2030-01-01");
    r = say(&f,
            "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"tools/list\",\"params\":{\"_meta\":"
            "{\"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\"}}}",
            &in);
    CHECK(in == MCP_IN_REFUSED && error_code(r) == MCP_INVALID_PARAMS);
    fx_free(&f);
}

static enum mcp_http_era classify(const char *version, const char *method, const char *name,
                                  const char *body, int *ret_code)
{
    struct mcp_http_headers h = {.protocol_version = version, .method = method, .name = name};
    unsigned status;
    char *text;
    enum mcp_http_era era = mcp_http_classify(&h, body, strlen(body), &status, &text);
    *ret_code = 0;
    if (era == MCP_HTTP_REJECT) {
        json_t *j = json_loads(text, 0, NULL);
        CHECK(status == 400);
        *ret_code = (int)error_code(j);
        json_decref(j);
    }
    free(text);
    return era;
}

TEST(http_classify_checks_the_headers)
{
    static const char call[] = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\","
                               "\"params\":{\"name\":\"run_code\"," MODERN_META "}}";
    static const char legacy[] = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}";
    int code;
    CHECK(classify("2026-07-28", "tools/call", "run_code", call, &code) == MCP_HTTP_MODERN);
    CHECK(classify("2026-07-28", "tools/call", "=?base64?cnVuX2NvZGU=?=", call, &code) ==
          MCP_HTTP_MODERN);
    CHECK(classify("2026-07-28", "tools/call", "run_shell", call, &code) == MCP_HTTP_REJECT &&
          code == MCP_HEADER_MISMATCH);
    CHECK(classify("2026-07-28", "tools/call", NULL, call, &code) == MCP_HTTP_REJECT &&
          code == MCP_HEADER_MISMATCH);
    CHECK(classify("2026-07-28", NULL, "run_code", call, &code) == MCP_HTTP_REJECT &&
          code == MCP_HEADER_MISMATCH);
    CHECK(classify(NULL, "tools/call", "run_code", call, &code) == MCP_HTTP_REJECT &&
          code == MCP_HEADER_MISMATCH);
    CHECK(classify("2025-11-25", "tools/call", "run_code", call, &code) == MCP_HTTP_REJECT &&
          code == MCP_HEADER_MISMATCH);
    CHECK(classify("2026-07-28", "tools/call", "run\x01code", call, &code) == MCP_HTTP_REJECT &&
          code == MCP_HEADER_MISMATCH);
    CHECK(classify("1999-01-01", NULL, NULL, legacy, &code) == MCP_HTTP_REJECT &&
          code == MCP_UNSUPPORTED_VERSION);
    CHECK(classify("2025-11-25", NULL, NULL, legacy, &code) == MCP_HTTP_LEGACY);
    CHECK(classify(NULL, NULL, NULL, legacy, &code) == MCP_HTTP_LEGACY);
    CHECK(classify("2026-07-28", NULL, NULL, "{not json", &code) == MCP_HTTP_MODERN);
    CHECK(mcp_http_status(MCP_IN_NO_METHOD) == 404 && mcp_http_status(MCP_IN_REFUSED) == 400);
}

int main(int argc, char **argv)
{
    log_set_level(LOG_WARN);
    return run_tests(argc, argv);
}
