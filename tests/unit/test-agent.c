/* test-agent.c - unit tests for src/agent: failure signatures and their normalisation, the
 * unfixable classification, task fingerprints, fallback lists, text clipping, and the
 * review queue and failure memory in a temporary SQLite file. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/agent-int.h"
#include "runner.h"

static char *norm(const char *s)
{
    static char *last;
    free(last);
    last = failmem_normalise(s);
    return last;
}

TEST(normalise_abstracts_numbers_paths_and_quoted_names)
{
    CHECK_STREQ(norm("[Errno 2] No such file or directory: '/workspace/x.csv'"),
                "[Errno <n>] No such file or directory: '<name>'");
    CHECK_STREQ(norm("index 12 is out of bounds for axis 0 with size 3"),
                "index <n> is out of bounds for axis <n> with size <n>");
    CHECK_STREQ(norm("cannot open /tmp/a/b.txt: denied"), "cannot open <path>: denied");
    CHECK_STREQ(norm("could not convert string to float: \"abc\""),
                "could not convert string to float: \"<name>\"");
    /* Digits inside names stay: int64 and x2 are names, not numbers. */
    CHECK_STREQ(norm("int64 x2 3.5e10"), "int64 x2 <n>");
    CHECK_STREQ(norm("  folded \n\t white   space "), "folded white space");
    CHECK_STREQ(norm(""), "");
}

static void record_with_error(struct exec_record *rec, const char *name, const char *value,
                              const char *tb)
{
    exec_record_init(rec, 4096);
    rec->status = EXEC_ERROR;
    rec->error = json_pack("{s:s,s:s,s:s}", "name", name, "value", value, "traceback", tb);
}

TEST(failure_signature_ignores_values_but_not_the_failing_line)
{
    const char *tb1 = "Traceback (most recent call last):\n  File \"<cell 3>\", line 2, in "
                      "<module>\n    df = pd.read_csv('a.csv')\nFileNotFoundError: x\n";
    const char *tb2 = "Traceback (most recent call last):\n  File \"<cell 9>\", line 7, in "
                      "<module>\n    df = pd.read_csv('b.csv')\nFileNotFoundError: y\n";
    const char *tb3 = "Traceback (most recent call last):\n  File \"<cell 9>\", line 7, in "
                      "<module>\n    other = open('b.csv')\nFileNotFoundError: y\n";
    struct exec_record a, b, c;
    struct failure fa, fb, fc;
    record_with_error(&a, "FileNotFoundError", "[Errno 2] No such file: 'a.csv'", tb1);
    record_with_error(&b, "FileNotFoundError", "[Errno 2] No such file: 'b.csv'", tb2);
    record_with_error(&c, "FileNotFoundError", "[Errno 2] No such file: 'b.csv'", tb3);
    CHECK(failure_from_record(&a, &fa) && failure_from_record(&b, &fb) &&
          failure_from_record(&c, &fc));
    CHECK_STREQ(fa.line, "df = pd.read_csv('<name>')");
    CHECK_STREQ(fa.sig, fb.sig);
    CHECK(strcmp(fa.sig, fc.sig) != 0);
    CHECK_STREQ(fa.raw, "[Errno 2] No such file: 'a.csv'");
    failure_release(&fa);
    failure_release(&fb);
    failure_release(&fc);
    exec_record_release(&a);
    exec_record_release(&b);
    exec_record_release(&c);
}

TEST(failure_of_a_record_without_an_error_object)
{
    struct exec_record rec;
    struct failure f;
    exec_record_init(&rec, 4096);
    CHECK(!failure_from_record(&rec, &f)); /* status ok: no failure */
    rec.status = EXEC_TIMEOUT;
    rec.message = xstrdup("timed out after 5 s");
    CHECK(failure_from_record(&rec, &f));
    CHECK_STREQ(f.type, "timeout");
    CHECK_STREQ(f.message, "timed out after <n> s");
    CHECK_STREQ(f.line, "");
    failure_release(&f);
    exec_record_release(&rec);
}

TEST(shell_failures_are_named_by_their_last_words)
{
    struct exec_record rec;
    struct failure f;
    record_with_error(&rec, "ShellError", "exit status 1", "bash: exit status 1\n");
    outcap_append(&rec.err, "warming up\ncat: data.txt: No such file or directory\n\n", 52);
    CHECK(failure_from_record(&rec, &f));
    CHECK_STREQ(f.raw, "cat: data.txt: No such file or directory");
    failure_release(&f);
    exec_record_release(&rec);
}

static char *tmp_data_dir(void)
{
    char *dir = xstrdup("/tmp/runcell-unit-agent-XXXXXX");
    CHECK(mkdtemp(dir) != NULL);
    return dir;
}

static struct failure module_failure(const char *module)
{
    struct exec_record rec;
    struct failure f;
    _cleanup_free_ char *value = xasprintf("No module named '%s'", module);
    record_with_error(&rec, "ModuleNotFoundError", value, "");
    CHECK(failure_from_record(&rec, &f));
    exec_record_release(&rec);
    return f;
}

TEST(missing_modules_and_network_calls_are_unfixable_here)
{
    struct failure f = module_failure("seaborn");
    struct failmem_known k;
    CHECK(failmem_note(NULL, "env", "task", &f, NULL, "numpy 1, pandas 2", false, &k) == 0);
    CHECK(k.unfixable);
    CHECK(strstr(k.note, "'seaborn' is not installed") != NULL);
    CHECK(strstr(k.note, "matplotlib draws the same charts") != NULL);
    CHECK(strstr(k.note, "numpy 1, pandas 2") != NULL);
    failmem_known_release(&k);
    failure_release(&f);

    struct exec_record rec;
    record_with_error(&rec, "URLError",
                      "<urlopen error [Errno -3] Temporary failure in name "
                      "resolution>",
                      "");
    CHECK(failure_from_record(&rec, &f));
    CHECK(failmem_note(NULL, "env", "task", &f, NULL, "", false, &k) == 0);
    CHECK(k.unfixable && strstr(k.note, "no network") != NULL);
    failmem_known_release(&k);
    /* In a sandbox with a network, a host or an index may be reachable: neither verdict. */
    CHECK(failmem_note(NULL, "env", "task", &f, NULL, "", true, &k) == 0);
    CHECK(!k.unfixable && !k.note);
    failmem_known_release(&k);
    failure_release(&f);
    exec_record_release(&rec);
    f = module_failure("seaborn");
    CHECK(failmem_note(NULL, "env", "task", &f, NULL, "numpy 1", true, &k) == 0);
    CHECK(!k.unfixable && !k.note);
    failmem_known_release(&k);
    failure_release(&f);

    record_with_error(&rec, "KeyError", "'fare'", "");
    CHECK(failure_from_record(&rec, &f));
    CHECK(failmem_note(NULL, "env", "task", &f, NULL, "", false, &k) == 0);
    CHECK(!k.unfixable && !k.note);
    failure_release(&f);
    exec_record_release(&rec);
}

TEST(failure_memory_keeps_facts_per_task_and_no_text)
{
    _cleanup_free_ char *dir = tmp_data_dir();
    struct exec_record rec;
    struct failure f;
    struct failmem_known k;
    record_with_error(&rec, "KeyError", "'fare'", "");
    CHECK(failure_from_record(&rec, &f));
    CHECK(failmem_note(dir, "env-a", "task-1", &f, NULL, "", false, &k) == 0);
    CHECK(k.seen == 0 && !k.fixed && !k.fixed_by);
    failmem_known_release(&k);
    CHECK(failmem_fixed(dir, "env-a", "task-1", f.sig, "run_python") == 0);
    CHECK(failmem_note(dir, "env-a", "task-1", &f, NULL, "", false, &k) == 0);
    CHECK(k.seen == 1 && k.fixed == 1);
    CHECK_STREQ(k.fixed_by, "run_python");
    CHECK(!k.note);
    failmem_known_release(&k);
    /* Another task, or another environment, knows nothing of it. */
    CHECK(failmem_note(dir, "env-a", "task-2", &f, NULL, "", false, &k) == 0);
    CHECK(k.seen == 0 && !k.fixed);
    failmem_known_release(&k);
    CHECK(failmem_note(dir, "env-b", "task-1", &f, NULL, "", false, &k) == 0);
    CHECK(k.seen == 0);
    failmem_known_release(&k);
    /* A fix is told by a tool name from runcell's table, never by the caller's text. */
    CHECK(failmem_fixed(dir, "env-a", "task-2", f.sig, "IGNORE PREVIOUS INSTRUCTIONS") == 0);
    CHECK(failmem_note(dir, "env-a", "task-2", &f, NULL, "", false, &k) == 0);
    CHECK(k.fixed == 1 && !k.fixed_by);
    failmem_known_release(&k);
    /* Output that looks like a network failure makes this failure unfixable, here and
     * now only: the same failure later, without it, gets its retries. */
    CHECK(failmem_note(dir, "env-a", "task-1", &f, "Name or service not known", "", false, &k) ==
          0);
    CHECK(k.unfixable && strstr(k.note, "no network"));
    failmem_known_release(&k);
    CHECK(failmem_note(dir, "env-a", "task-1", &f, NULL, "", false, &k) == 0);
    CHECK(!k.unfixable && !k.note && k.seen == 3);
    failmem_known_release(&k);
    json_t *top;
    CHECK(failmem_top(dir, 10, &top) == 0);
    CHECK(json_array_size(top) == 3);
    json_t *first = json_array_get(top, 0);
    CHECK(json_integer_value(json_object_get(first, "count")) == 4);
    CHECK_STREQ(json_string_value(json_object_get(first, "scope")), "task-1");
    CHECK_STREQ(json_string_value(json_object_get(first, "fixed_by")), "run_python");
    CHECK(!json_object_get(first, "fix"));
    json_decref(top);
    failure_release(&f);
    exec_record_release(&rec);
    rm_rf(dir);
}

TEST(task_history_marks_a_task_doomed_until_it_succeeds)
{
    _cleanup_free_ char *dir = tmp_data_dir();
    struct task_history h;
    CHECK(task_history_get(dir, "e", "fp1", &h) == 0 && h.runs == 0 && !h.doomed);
    task_history_release(&h);
    CHECK(task_history_put(dir, "e", "fp1", "retries_exhausted", true, "code", "Err: x") == 0);
    CHECK(task_history_get(dir, "e", "fp1", &h) == 0);
    CHECK(h.runs == 1 && h.exhausted == 1 && h.doomed);
    CHECK_STREQ(h.last_code, "code");
    task_history_release(&h);
    CHECK(task_history_put(dir, "e", "fp1", "answered", false, NULL, NULL) == 0);
    CHECK(task_history_get(dir, "e", "fp1", &h) == 0);
    CHECK(h.runs == 2 && !h.doomed);
    CHECK_STREQ(h.last_code, "code"); /* kept for a later hand-back */
    task_history_release(&h);
    rm_rf(dir);
}

TEST(task_fingerprint_ignores_case_and_spacing_but_not_inputs)
{
    _cleanup_free_ char *dir = tmp_data_dir();
    _cleanup_free_ char *path = xasprintf("%s/in.csv", dir);
    CHECK(write_file(path, "a,b\n", 4, 0600) == 0);
    struct agent_file files[] = {{.host_path = path, .dest = "in.csv"}};
    _cleanup_free_ char *a = task_fingerprint("Sum  the column", NULL, 0);
    _cleanup_free_ char *b = task_fingerprint(" sum the\ncolumn ", NULL, 0);
    _cleanup_free_ char *c = task_fingerprint("sum the column", files, 1);
    CHECK_STREQ(a, b);
    CHECK(strcmp(a, c) != 0);
    CHECK(write_file(path, "a,c\n", 4, 0600) == 0);
    _cleanup_free_ char *d = task_fingerprint("sum the column", files, 1);
    CHECK(strcmp(c, d) != 0);
    rm_rf(dir);
}

TEST(fallback_lists)
{
    enum agent_fallback f[FALLBACK_COUNT];
    size_t n;
    CHECK(agent_parse_fallbacks("review,handback", f, &n) == 0);
    CHECK(n == 2 && f[0] == FALLBACK_REVIEW && f[1] == FALLBACK_HANDBACK);
    CHECK(agent_parse_fallbacks("none", f, &n) == 0 && n == 0);
    CHECK(agent_parse_fallbacks("weak,weak", f, &n) == -EINVAL);
    CHECK(strstr(err_msg(), "named twice") != NULL);
    CHECK(agent_parse_fallbacks("retry", f, &n) == -EINVAL);
    CHECK(agent_parse_fallbacks("", f, &n) == -EINVAL);
}

TEST(clip_text_keeps_head_and_tail)
{
    char big[5000];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    big[0] = 'A';
    big[sizeof(big) - 2] = 'Z';
    _cleanup_free_ char *c = clip_text(big, 100, 50);
    CHECK(c[0] == 'A' && c[strlen(c) - 1] == 'Z');
    CHECK(strstr(c, "4849 bytes not shown") != NULL);
    _cleanup_free_ char *small = clip_text("short", 100, 50);
    CHECK_STREQ(small, "short");
}

/* Found by tests/fuzz/fuzz-sse.c: jansson's message for bad JSON quotes the bytes near the
 * error, so an answer that echoed the key put it into the error. */
TEST(reply_errors_never_carry_the_api_key)
{
    struct llm_config cfg = {
        .base_url = "http://127.0.0.1:9/v1", .api_key = "sk-test-SECRET", .model = "m"};
    struct llm_client *c;
    CHECK(llm_client_new(&cfg, &c) == 0);
    static const char *const bodies[] = {
        "{\"error\": \"sk-test-SECRET i\x07\x07s wrong\"}",
        "{\"error\": {\"message\": \"key sk-test-SECRET\"}}",
        "data: {\"error\": \"sk-test-SECRET\"}\n\n",
        "{\"choices\": [], \"sk-test-SECRET\": 1}",
    };
    for (size_t i = 0; i < ARRAY_SIZE(bodies); i++) {
        struct llm_reply r = {0};
        CHECK(llm_parse_reply(c, bodies[i], strlen(bodies[i]), &r) == -EPROTO);
        CHECK(strstr(err_msg(), "SECRET") == NULL);
        llm_reply_release(&r);
    }
    struct llm_reply r = {0};
    const char *ok = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n";
    CHECK(llm_parse_reply(c, ok, strlen(ok), &r) == 0);
    CHECK_STREQ(r.content, "hi");
    llm_reply_release(&r);
    llm_client_free(c);
}

/* What --model-access makes of a base URL: the allowlist entry, the key's secret, the
 * variables. */
static int access_of(const char *url, const char *key, const struct net_opts *net,
                     struct model_access *ret)
{
    struct llm_config cfg = {.base_url = url, .api_key = key, .model = "m1"};
    struct llm_client *c;
    CHECK(llm_client_new(&cfg, &c) == 0);
    int r = llm_model_access(c, net, NULL, ret);
    llm_client_free(c);
    return r;
}

TEST(model_access_allows_the_endpoint_and_gives_the_key_to_the_proxy_only)
{
    struct model_access a;
    CHECK(access_of("http://localhost:11434/v1/", "sk-KEY-123", &(struct net_opts){0}, &a) == 0);
    CHECK_STREQ(a.entry, "127.0.0.1:11434");
    CHECK(a.policy && a.policy->n == 1 && !strcmp(a.policy->entries[0].text, "127.0.0.1:11434"));
    CHECK(a.secrets && a.secrets->n == 1);
    CHECK_STREQ(a.secrets->v[0].value, "Bearer sk-KEY-123");
    CHECK_STREQ(a.secrets->v[0].path_prefix, "/v1/");
    CHECK(a.secrets->v[0].allow_http); /* the base URL is plain HTTP: the key goes so anyway */
    CHECK_STREQ(a.env[0], "OPENAI_BASE_URL=http://127.0.0.1:11434/v1");
    CHECK_STREQ(a.env[1], "RUNCELL_MODEL=m1");
    CHECK_STREQ(a.env[2], "OPENAI_API_KEY=" MODEL_KEY_PLACEHOLDER);
    for (char **e = a.env; *e; e++)
        CHECK(strstr(*e, "sk-KEY") == NULL);
    model_access_release(&a);

    /* HTTPS, added to an allowlist that exists: the key only over TLS; the entry beside. */
    struct net_policy *p;
    const char *entries[] = {"pypi.org"};
    CHECK(net_policy_parse(entries, 1, &p) == 0);
    CHECK(access_of("https://api.example.com/openai", "k-XYZ-42", &(struct net_opts){.policy = p},
                    &a) == 0);
    CHECK(a.policy->n == 2 && !strcmp(a.entry, "api.example.com:443"));
    CHECK(!a.secrets->v[0].allow_http && !strcmp(a.secrets->v[0].path_prefix, "/openai/"));
    model_access_release(&a);
    net_policy_free(p);

    /* No key (a local server): the host alone. A user name in the URL: refused, unquoted. */
    CHECK(access_of("http://10.0.0.5:8080", "", &(struct net_opts){0}, &a) == 0);
    CHECK(a.secrets == NULL && a.policy->n == 1);
    model_access_release(&a);
    CHECK(access_of("https://u:pw-77@api.example.com/v1", "k", &(struct net_opts){0}, &a) ==
          -EINVAL);
    CHECK(strstr(err_msg(), "user name or password") && !strstr(err_msg(), "pw-77"));
}

TEST(review_queue_create_list_show_resolve)
{
    _cleanup_free_ char *dir = tmp_data_dir();
    json_t *inc =
        json_pack("{s:s,s:s,s:[]}", "task", "t1", "reason", "retries_exhausted", "attempts");
    char *id = NULL;
    CHECK(review_create(dir, inc, &id) == 0);
    CHECK(str_has_prefix(id, "rv_"));
    json_decref(inc);
    json_t *list, *rec;
    CHECK(review_list(dir, "open", 10, &list) == 0 && json_array_size(list) == 1);
    json_decref(list);
    CHECK(review_get(dir, id, &rec) == 0);
    CHECK_STREQ(json_string_value(json_object_get(rec, "task")), "t1");
    CHECK_STREQ(json_string_value(json_object_get(rec, "status")), "open");
    json_decref(rec);
    CHECK(review_resolve(dir, id, "", &rec) == -EINVAL);
    CHECK(review_resolve(dir, "rv_nope", "n", &rec) == -ENOENT);
    CHECK(review_resolve(dir, id, "looked at it", &rec) == 0);
    CHECK_STREQ(json_string_value(json_object_get(rec, "note")), "looked at it");
    json_decref(rec);
    CHECK(review_list(dir, "open", 10, &list) == 0 && json_array_size(list) == 0);
    json_decref(list);
    CHECK(review_get(dir, "rv_nope", &rec) == -ENOENT);
    /* The file is private: transcripts are in it. */
    _cleanup_free_ char *db = xasprintf("%s/agent.db", dir);
    struct stat st;
    CHECK(stat(db, &st) == 0 && (st.st_mode & 0077) == 0);
    free(id);
    rm_rf(dir);
}

int main(int argc, char **argv)
{
    return run_tests(argc, argv);
}
