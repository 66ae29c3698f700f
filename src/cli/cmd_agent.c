/* cmd_agent.c - `runcell agent`: a language model solves a task by running code in a
 * sandboxed session, with progress shown live, then the answer and the files produced. */
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent.h"
#include "http/serve.h"
#include "cli/cli.h"

#define CODE_LINES_SHOWN   25
#define OUTPUT_LINES_SHOWN 12

struct agent_cli {
    struct common_opts c;
    struct llm_config llm;
    struct agent_options a;
    bool json;
    bool http_retries_set;
    char *api_key; /* our copy; the argv string is wiped */
};

static const char agent_usage[] =
    "usage: runcell agent [OPTIONS] TASK\n"
    "\n"
    "A language model solves TASK by writing code that runs in a sandboxed Python session;\n"
    "errors go back to it for repair, with bounded retries, then fallbacks (docs/AGENT.md).\n"
    "Progress goes to stderr, the final answer to stdout. Exit status: 0 answered, 1 not\n"
    "completed (fallbacks ran), 2 usage, 130 interrupted.\n"
    "\n";

static int set_api_key(void *opts, const char *cmd, char *val)
{
    struct agent_cli *o = opts;
    free(o->api_key);
    o->api_key = xstrdup(val);
    explicit_bzero(val, strlen(val)); /* out of /proc/PID/cmdline (ps) from now on */
    o->llm.api_key = o->api_key;
    return 0;
}

static int set_http_retries(void *opts, const char *cmd, char *val)
{
    struct agent_cli *o = opts;
    uint64_t v;
    if (parse_u64(val, &v) < 0 || v > 20)
        return usage_error(cmd, "--http-retries: '%s' is not a number from 0 to 20", val);
    o->llm.http_retries = (unsigned)v;
    o->http_retries_set = true;
    return 0;
}

static int set_fallbacks(void *opts, const char *cmd, char *val)
{
    struct agent_cli *o = opts;
    if (agent_parse_fallbacks(val, o->a.fallbacks, &o->a.n_fallbacks) < 0)
        return usage_error(cmd, "--fallbacks: %s", err_msg());
    o->a.fallbacks_set = true;
    return 0;
}

#define F(member) offsetof(struct agent_cli, member)

/* The common options, which runcell run describes in full. */
static const char agent_sandbox_help[] =
    "Sandbox (as for runcell run):\n"
    "  --file LOCAL[:DEST]   copy LOCAL into the workspace (repeatable)\n"
    "  --out DIR             copy the files produced into DIR\n"
    "  --timeout SEC, --memory MB, --pids N, --disk MB, --cpus N\n"
    "  --net none|allow:HOST[:PORT],...  hosts the code can reach (default none: loopback only)\n"
    "  --secret HOST=ENVNAME[:HEADER]    a credential the egress proxy adds to HOST's\n"
    "                        requests, never in the sandbox (docs/NETWORK.md); the model is\n"
    "                        told the hosts and which get credentials, never a value\n"
    "                        (--package, --index-url and --install-timeout are refused)";

static const struct opt_spec agent_opts[] = {
    {NULL, .help = "Model (any OpenAI-compatible Chat Completions endpoint):"},
    {"base-url", "URL", OPTK_STRING, F(llm.base_url),
     .help = "the endpoint, required: this or OPENAI_BASE_URL (no default),\n"
             "e.g. http://127.0.0.1:11434/v1 (a local server) or\n"
             "https://api.openai.com/v1"},
    {"api-key", "KEY", OPTK_FN, .fn = set_api_key,
     .help = "default OPENAI_API_KEY (prefer the variable: it stays out of ps)"},
    {"model", "NAME", OPTK_STRING, F(llm.model), .help = "default RUNCELL_MODEL"},
    {"stream", NULL, OPTK_FLAG, F(llm.stream),
     .help = "ask for streamed (server-sent events) responses"},
    {"vision", NULL, OPTK_FLAG, F(a.vision),
     .help = "also send images to the model as image input"},
    {"model-access", NULL, OPTK_FLAG, F(a.model_access),
     .help = "the code may call the model too: its endpoint is allowed and\n"
             "the egress proxy adds the key, which never enters the sandbox\n"
             "(OPENAI_BASE_URL and RUNCELL_MODEL are set there, and\n"
             "OPENAI_API_KEY to a placeholder)"},
    {"request-timeout", "SEC", OPTK_SECONDS, F(llm.request_timeout_ms),
     .help = "one model request (default 300)"},
    {"http-retries", "N", OPTK_FN, .fn = set_http_retries,
     .help = "retries of HTTP 429/5xx and connection errors (default 4)"},
    {"retry-backoff", "SEC", OPTK_SECONDS, F(llm.backoff_ms),
     .help = "first pause before such a retry (default 1; doubles, jittered)"},
    {NULL, .help = "Budgets:"},
    {"max-steps", "N", OPTK_COUNT, F(a.max_steps), 1, 100000, .help = "model turns (default 20)"},
    {"max-retries", "N", OPTK_COUNT, F(a.max_retries), 1, 100000,
     .help = "failed executions in a row before giving up (default 3)"},
    {"max-time", "SEC", OPTK_SECONDS, F(a.max_time_ms),
     .help = "wall time of the whole run (default: none)"},
    {"max-tokens", "N", OPTK_NUMBER, F(a.max_tokens), 1, 1000000000000ull,
     .help = "tokens, when the endpoint reports usage (default: none)"},
    {NULL, .help = "Fallbacks and memory:"},
    {"fallbacks", "LIST", OPTK_FN, .fn = set_fallbacks,
     .help = "weak,handback,review in the order wanted, or none (default all)"},
    {"review-webhook", "URL", OPTK_STRING, F(a.webhook_url),
     .help = "also POST review incidents to URL"},
    {"data", "DIR", OPTK_STRING, F(a.data_dir),
     .help = "failure memory and review queue (default RUNCELL_DATA, else\n"
             "/var/lib/runcell as root, else ~/.local/share/runcell)"},
    {"no-memory", NULL, OPTK_FLAG, F(a.no_memory),
     .help = "neither use nor update the failure memory"},
    {"retry-doomed", NULL, OPTK_FLAG, F(a.retry_doomed),
     .help = "run a task that exhausted its retries before anyway"},
    {NULL, .help = "Output:"},
    {"json", NULL, OPTK_FLAG, F(json),
     .help = "print the outcome with the full transcript as JSON"},
    {NULL, .help = agent_sandbox_help},
};

static const struct opt_cmd agent_cmd = {
    .name = "agent",
    .usage = agent_usage,
    .own = OPT_TABLE(agent_opts),
    .groups = {{&common_opt_table, F(c)}},
    .args = OPTA_AFTER, /* the words of the task */
    .column = 24,
};

static int parse_args(struct agent_cli *o, int argc, char **argv, char **ret_task)
{
    int first, r = opttab_parse(&agent_cmd, argc, argv, o, &first);
    if (r)
        return r;
    if (first >= argc)
        return usage_error("agent", "no task: say what to do, e.g. runcell agent 'plot "
                                    "sin(x) and save it as sin.png'");
    struct buf task;
    buf_init(&task, 0);
    for (; first < argc; first++)
        buf_printf(&task, "%s%s", task.len ? " " : "", argv[first]);
    *ret_task = buf_detach(&task, NULL);
    if (!**ret_task)
        return usage_error("agent", "the task is empty");
    if (!o->http_retries_set)
        o->llm.http_retries = AGENT_DEFAULT_HTTP_RETRIES;
    return 0;
}

/* ---- live progress ---- */

static void print_lines(const char *text, size_t max_lines, const char *indent)
{
    size_t shown = 0, total = 0;
    for (const char *p = text; p && *p; total++) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        if (shown < max_lines) {
            fprintf(stderr, "%s%.*s\n", indent, (int)MIN(n, 300), p);
            shown++;
        }
        p = nl ? nl + 1 : NULL;
    }
    if (total > shown)
        fprintf(stderr, "%s... (%zu more lines)\n", indent, total - shown);
}

static void on_event(void *ctx, json_t *ev)
{
    const char *type = json_string_value(json_object_get(ev, "type"));
    int step = (int)json_integer_value(json_object_get(ev, "step"));
    (void)ctx;
    if (!strcmp(type, "run")) {
        fprintf(stderr, "runcell agent: model %s%s\n",
                json_string_value(json_object_get(ev, "model")),
                json_is_true(json_object_get(ev, "weak")) ? " (weak mode)" : "");
    } else if (!strcmp(type, "model")) {
        const char *content = json_string_value(json_object_get(ev, "content"));
        if (content && *content && json_integer_value(json_object_get(ev, "tool_calls")))
            print_lines(content, 4, "   ");
    } else if (!strcmp(type, "tool_call")) {
        fprintf(stderr, "── step %d · %s%s\n", step, json_string_value(json_object_get(ev, "tool")),
                json_is_true(json_object_get(ev, "weak")) ? " (weak mode)" : "");
        print_lines(json_string_value(json_object_get(ev, "code")), CODE_LINES_SHOWN, "   │ ");
    } else if (!strcmp(type, "observation")) {
        const char *text = json_string_value(json_object_get(ev, "observation"));
        const char *nl = text ? strchr(text, '\n') : NULL;
        fprintf(stderr, "   → %s\n", json_string_value(json_object_get(ev, "status")));
        if (nl)
            print_lines(nl + 1, OUTPUT_LINES_SHOWN, "     ");
    } else if (!strcmp(type, "undone")) {
        fprintf(stderr, "   ↶ the session was taken back to its state before this cell\n");
    } else if (!strcmp(type, "notice")) {
        fprintf(stderr, "runcell: %s\n", json_string_value(json_object_get(ev, "text")));
    } else if (!strcmp(type, "fallback")) {
        fprintf(stderr, "runcell: fallback %s: %s\n",
                json_string_value(json_object_get(ev, "name")),
                json_string_value(json_object_get(ev, "detail")));
    }
    fflush(stderr);
}

static void print_outcome(const struct agent_cli *o, json_t *out)
{
    if (o->json) {
        json_dumpf(out, stdout, JSON_COMPACT);
        fputc('\n', stdout);
        return;
    }
    const char *answer = json_string_value(json_object_get(out, "answer"));
    printf("%s%s", answer ? answer : "",
           answer && *answer && answer[strlen(answer) - 1] != '\n' ? "\n" : "");
    json_t *files = json_object_get(out, "files");
    if (json_array_size(files)) {
        fprintf(stderr, "runcell: files produced%s%s:", o->c.out_dir ? ", copied to " : "",
                o->c.out_dir ? o->c.out_dir : "");
        size_t i;
        json_t *f;
        json_array_foreach(files, i, f) fprintf(stderr, " %s", json_string_value(f));
        fputc('\n', stderr);
    }
}

/* ---- running ---- */

static int cancel_pipe[2] = {-1, -1};
static volatile sig_atomic_t cancel_signal;

static void on_signal(int sig)
{
    cancel_signal = sig;
    (void)!write(cancel_pipe[1], "x", 1);
}

static void catch_signals(void)
{
    if (pipe2(cancel_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
        return;
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

static int run_agent(struct agent_cli *o, struct llm_client *llm, const struct net_opts *net)
{
    struct sandbox_host host;
    struct session *s = NULL;
    _cleanup_free_ char *session_error = NULL;
    if (sandbox_host_init(&host) < 0) {
        fprintf(stderr, "runcell agent: %s\n", err_msg());
        return 125;
    }
    if (host.degraded_reason)
        fprintf(stderr, "runcell: warning: resource limits are degraded: %s\n",
                host.degraded_reason);
    catch_signals();
    struct session_opts so = {.limits = o->c.limits,
                              .timeout_ms = o->c.timeout_ms,
                              .history = AGENT_DEFAULT_HISTORY,
                              .net = *net};
    session_opts_fill_defaults(&so);
    session_files_history_enable();
    if (session_new(&host, &so, &s) < 0) {
        session_error = xstrdup(err_msg());
        fprintf(stderr, "runcell: the session could not start: %s\n", session_error);
    }
    struct agent_file *files = xcalloc(o->c.n_files + 1, sizeof(*files));
    for (size_t i = 0; i < o->c.n_files; i++)
        files[i] =
            (struct agent_file){.host_path = o->c.files[i].local, .dest = o->c.files[i].dest};
    o->a.files = files;
    o->a.n_files = o->c.n_files;
    o->a.out_dir = o->c.out_dir;
    o->a.session_opts = &so;
    o->a.session_error = session_error;
    o->a.cancel = (struct agent_cancel){.fd = cancel_pipe[0], .events = POLLIN};
    struct agent_events ev = {.fn = o->json ? NULL : on_event};
    json_t *out = NULL;
    int status;
    if (agent_run(&host, llm, s, &o->a, &ev, &out) < 0) {
        fprintf(stderr, "runcell agent: %s\n", err_msg());
        status = EXIT_USAGE;
    } else {
        print_outcome(o, out);
        const char *outcome = json_string_value(json_object_get(out, "outcome"));
        status = cancel_signal ? 128 + cancel_signal : !strcmp(outcome, "answered") ? 0 : 1;
    }
    json_decref(out);
    free(files);
    session_free(s);
    sandbox_host_release(&host);
    return status;
}

int cmd_agent(int argc, char **argv)
{
    struct agent_cli o = {.c.timeout_ms = DEFAULT_TIMEOUT_MS};
    _cleanup_free_ char *task = NULL, *data = NULL;
    struct llm_client *llm = NULL;
    struct model_access ma = {0};
    int r = parse_args(&o, argc, argv, &task);
    if (!r)
        r = refuse_package_opts("agent", &o.c);
    if (!r)
        r = check_net_opts("agent", &o.c);
    if (!r && o.c.out_dir)
        r = check_out_dir("agent", o.c.out_dir);
    if (!r && llm_client_new(&o.llm, &llm) < 0)
        r = usage_error("agent", "%s", err_msg());
    struct net_opts net = common_net_opts(&o.c);
    if (!r && o.a.model_access) {
        if (llm_model_access(llm, &net, NULL, &ma) < 0)
            r = usage_error("agent", "--model-access: %s", err_msg());
        net.policy = ma.policy;
        net.secrets = ma.secrets;
        net.env = ma.env;
    }
    if (!r) {
        o.a.task = task;
        if (!o.a.data_dir)
            o.a.data_dir = data = default_data_dir();
        r = run_agent(&o, llm, &net);
    }
    model_access_release(&ma);
    llm_client_free(llm);
    if (o.api_key)
        explicit_bzero(o.api_key, strlen(o.api_key));
    free(o.api_key);
    common_opts_release(&o.c);
    return r == OPTTAB_HELP ? 0 : r;
}
