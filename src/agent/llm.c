/* llm.c - the model client: OpenAI-compatible Chat Completions over libcurl, plain or
 * server-sent events, with bounded retries and the known server quirks worked around. */
#include "agent/agent-int.h"

#include <curl/curl.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define MAX_BACKOFF_MS     30000
#define CONNECT_TIMEOUT_MS 10000

struct llm_client {
    char *base_url;
    char *url; /* base_url + "/chat/completions" */
    char *api_key;
    char *model;
    bool stream;
    uint64_t timeout_ms;
    unsigned retries;
    uint64_t backoff_ms;
    bool no_tool_choice;    /* the server rejected tool_choice once */
    bool no_stream_options; /* ... or stream_options */
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

static void curl_init_once(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

void agent_curl_init(void)
{
    pthread_once(&curl_once, curl_init_once);
}

static const char *env_or(const char *given, const char *name, const char *fallback)
{
    if (given)
        return given;
    const char *v = getenv(name);
    return v && *v ? v : fallback;
}

int llm_client_new(const struct llm_config *cfg, struct llm_client **ret)
{
    const char *base = env_or(cfg->base_url, "OPENAI_BASE_URL", NULL);
    const char *key = env_or(cfg->api_key, "OPENAI_API_KEY", "");
    const char *model = env_or(cfg->model, "RUNCELL_MODEL", NULL);
    /* No public API by default: naming only a model must not send tasks to the internet. */
    if (!base || !*base)
        return err_set(EDESTADDRREQ,
                       "no model endpoint: pass --base-url URL or set OPENAI_BASE_URL, e.g. "
                       "http://127.0.0.1:11434/v1 for a local server (Ollama; llama.cpp's "
                       "llama-server: http://127.0.0.1:8080/v1), or https://api.openai.com/v1 "
                       "to send tasks to OpenAI");
    if (!model || !*model)
        return err_set(EINVAL, "no model named: pass --model or set RUNCELL_MODEL (e.g. "
                               "gpt-4o-mini, or the name your local server serves)");
    if (!str_has_prefix(base, "http://") && !str_has_prefix(base, "https://"))
        return err_set(EINVAL,
                       "base URL '%s' is not an http:// or https:// URL; pass "
                       "--base-url or set OPENAI_BASE_URL (e.g. http://127.0.0.1:11434/v1)",
                       base);
    agent_curl_init();
    struct llm_client *c = xcalloc(1, sizeof(*c));
    size_t n = strlen(base);
    while (n > 0 && base[n - 1] == '/')
        n--;
    c->base_url = xstrndup(base, n);
    c->url = xasprintf("%s/chat/completions", c->base_url);
    c->api_key = xstrdup(key);
    c->model = xstrdup(model);
    c->stream = cfg->stream;
    c->timeout_ms =
        cfg->request_timeout_ms ? cfg->request_timeout_ms : AGENT_DEFAULT_REQUEST_TIMEOUT_MS;
    c->retries = cfg->http_retries;
    c->backoff_ms = cfg->backoff_ms ? cfg->backoff_ms : AGENT_DEFAULT_BACKOFF_MS;
    *ret = c;
    return 0;
}

void llm_client_free(struct llm_client *c)
{
    if (!c)
        return;
    explicit_bzero(c->api_key, strlen(c->api_key));
    free(c->api_key);
    free(c->base_url);
    free(c->url);
    free(c->model);
    free(c);
}

const char *llm_client_model(const struct llm_client *c)
{
    return c->model;
}

const char *llm_client_base_url(const struct llm_client *c)
{
    return c->base_url;
}

void llm_client_redact(const struct llm_client *c, char *s)
{
    size_t n = strlen(c->api_key);
    if (!s || n < 4)
        return; /* a key of 1-3 characters would blank out ordinary text */
    for (char *p = strstr(s, c->api_key); p; p = strstr(p + n, c->api_key))
        memset(p, '*', n);
}

/* ---- the model, called by the code of a run ---- */

/* The parts of the base URL; NULL members when it cannot be parsed. */
struct url_parts {
    CURLU *u;
    char *scheme, *host, *port, *path, *user;
};

static void url_parts_release(struct url_parts *p)
{
    curl_free(p->scheme);
    curl_free(p->host);
    curl_free(p->port);
    curl_free(p->path);
    curl_free(p->user);
    curl_url_cleanup(p->u);
}

static int url_parts(const char *url, struct url_parts *p)
{
    memset(p, 0, sizeof(*p));
    p->u = curl_url();
    if (!p->u || curl_url_set(p->u, CURLUPART_URL, url, 0) != CURLUE_OK ||
        curl_url_get(p->u, CURLUPART_SCHEME, &p->scheme, 0) != CURLUE_OK ||
        curl_url_get(p->u, CURLUPART_HOST, &p->host, 0) != CURLUE_OK ||
        curl_url_get(p->u, CURLUPART_PORT, &p->port, CURLU_DEFAULT_PORT) != CURLUE_OK ||
        curl_url_get(p->u, CURLUPART_PATH, &p->path, 0) != CURLUE_OK)
        return -EINVAL;
    (void)curl_url_get(p->u, CURLUPART_USER, &p->user, 0);
    return 0;
}

static json_t *key_secret(const struct llm_client *c, const char *entry, const char *path,
                          bool http)
{
    size_t n = strlen(path);
    while (n && path[n - 1] == '/')
        n--;
    _cleanup_free_ char *bearer = xasprintf("Bearer %s", c->api_key);
    json_t *s = json_pack("{s:s,s:s,s:s,s:b}", "host", entry, "header", "Authorization", "value",
                          bearer, "allow_http", http);
    explicit_bzero(bearer, strlen(bearer));
    if (s && n) {
        _cleanup_free_ char *prefix = xasprintf("%.*s/", (int)n, path);
        json_object_set_new(s, "path_prefix", json_string(prefix));
    }
    return s;
}

int llm_model_access(const struct llm_client *c, const struct net_opts *net,
                     const struct net_policy *max, struct model_access *ret)
{
    struct url_parts u;
    int r = 0;
    memset(ret, 0, sizeof(*ret));
    if (url_parts(c->base_url, &u) < 0) {
        url_parts_release(&u);
        return err_set(EINVAL, "the model's base URL cannot be parsed, so the code cannot be "
                               "let reach it");
    }
    if (u.user) {
        url_parts_release(&u);
        return err_set(EINVAL, "the model's base URL carries a user name or password, which "
                               "would reach the sandbox: give the key as OPENAI_API_KEY or "
                               "--api-key instead");
    }
    if (!strcasecmp(u.host, "localhost")) {
        /* A name the proxy would resolve to loopback and refuse: the address itself is an
         * entry that names loopback, which the proxy then reaches. */
        curl_free(u.host);
        u.host = NULL;
        if (curl_url_set(u.u, CURLUPART_HOST, "127.0.0.1", 0) != CURLUE_OK ||
            curl_url_get(u.u, CURLUPART_HOST, &u.host, 0) != CURLUE_OK) {
            url_parts_release(&u);
            return err_set(EINVAL, "the model's base URL cannot be parsed");
        }
    }
    char *url = NULL;
    if (curl_url_get(u.u, CURLUPART_URL, &url, 0) != CURLUE_OK) {
        url_parts_release(&u);
        return err_set(EINVAL, "the model's base URL cannot be parsed");
    }
    ret->entry = xasprintf("%s:%s", u.host, u.port);
    bool http = !strcasecmp(u.scheme, "http");
    json_t *change = json_pack("{s:[s]}", "allow_add", ret->entry);
    if (*c->api_key) {
        json_t *sec = key_secret(c, ret->entry, u.path, http);
        if (!sec) {
            r = err_set(EINVAL, "the model's key is not valid UTF-8");
            goto out;
        }
        json_object_set_new(change, "secrets_add", json_pack("[o]", sec));
    }
    r = net_rules_change(net->policy, net->secrets, change, max, &ret->policy, &ret->secrets);
    if (r < 0) {
        r = err_set(EINVAL, "the model's endpoint (%s) cannot be added to the network: %s",
                    ret->entry, err_msg());
        goto out;
    }
    size_t n = strlen(url);
    while (n && url[n - 1] == '/')
        n--;
    ret->env = xcalloc(1, sizeof(char *));
    char *line = xasprintf("OPENAI_BASE_URL=%.*s", (int)n, url);
    ret->env = strv_push(ret->env, line);
    free(line);
    line = xasprintf("RUNCELL_MODEL=%s", c->model);
    ret->env = strv_push(ret->env, line);
    free(line);
    ret->env = strv_push(ret->env, "OPENAI_API_KEY=" MODEL_KEY_PLACEHOLDER);
out:
    net_secrets_json_wipe(json_object_get(change, "secrets_add"));
    json_decref(change);
    curl_free(url);
    url_parts_release(&u);
    if (r < 0)
        model_access_release(ret);
    return r;
}

void model_access_release(struct model_access *a)
{
    net_policy_free(a->policy);
    net_secrets_free(a->secrets);
    strv_free(a->env);
    free(a->entry);
    memset(a, 0, sizeof(*a));
}

void llm_reply_release(struct llm_reply *r)
{
    free(r->content);
    for (size_t i = 0; i < r->n_calls; i++) {
        free(r->calls[i].id);
        free(r->calls[i].name);
        free(r->calls[i].arguments);
    }
    free(r->calls);
    free(r->finish_reason);
    json_decref(r->notes);
    memset(r, 0, sizeof(*r));
}

/* ---- one HTTP exchange ---- */

struct http {
    struct buf body;
    long status;
    long retry_after_s; /* -1 when absent */
    bool too_big;
    long os_errno; /* of a failed connection, 0 when none */
    const struct agent_cancel *cancel;
};

static size_t on_body(char *data, size_t size, size_t nmemb, void *ctx)
{
    struct http *h = ctx;
    size_t n = size * nmemb;
    if (buf_append(&h->body, data, n) < 0) {
        h->too_big = true;
        return 0; /* CURLE_WRITE_ERROR */
    }
    return n;
}

static size_t on_header(char *data, size_t size, size_t nmemb, void *ctx)
{
    struct http *h = ctx;
    size_t n = size * nmemb;
    if (n > 12 && !strncasecmp(data, "Retry-After:", 12)) {
        char v[32];
        snprintf(v, sizeof(v), "%.*s", (int)MIN(n - 12, sizeof(v) - 1), data + 12);
        long s = strtol(v, NULL, 10);
        h->retry_after_s = s > 0 ? s : -1;
    }
    return n;
}

static int on_progress(void *ctx, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    struct http *h = ctx;
    (void)dt, (void)dn, (void)ut, (void)un;
    return agent_cancelled(h->cancel) ? 1 : 0;
}

static void wipe_headers(struct curl_slist *l)
{
    for (struct curl_slist *p = l; p; p = p->next)
        explicit_bzero(p->data, strlen(p->data));
    curl_slist_free_all(l);
}

/* POSTs body to c->url; fills h. Returns the curl code; errbuf says what went wrong. */
static CURLcode http_post(struct llm_client *c, const char *body, struct http *h, char *errbuf)
{
    CURL *curl = curl_easy_init();
    struct curl_slist *headers = NULL;
    if (!curl)
        return CURLE_FAILED_INIT;
    headers = curl_slist_append(headers, "Content-Type: application/json");
    headers = curl_slist_append(headers, c->stream ? "Accept: text/event-stream"
                                                   : "Accept: application/json");
    if (*c->api_key) {
        char *auth = xasprintf("Authorization: Bearer %s", c->api_key);
        headers = curl_slist_append(headers, auth);
        explicit_bzero(auth, strlen(auth));
        free(auth);
    }
    errbuf[0] = '\0';
    curl_easy_setopt(curl, CURLOPT_URL, c->url);
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long)c->timeout_ms);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, (long)MIN(c->timeout_ms, CONNECT_TIMEOUT_MS));
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, h);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, h);
    curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(curl, CURLOPT_XFERINFODATA, h);
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(curl, CURLOPT_USERAGENT, "runcell-agent");
    CURLcode cc = curl_easy_perform(curl);
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &h->status);
    curl_easy_getinfo(curl, CURLINFO_OS_ERRNO, &h->os_errno);
    curl_easy_cleanup(curl);
    wipe_headers(headers);
    return cc;
}

/* ---- reading replies ---- */

static void note(struct llm_reply *r, const char *text)
{
    if (!r->notes)
        r->notes = json_array();
    for (size_t i = 0; i < json_array_size(r->notes); i++)
        if (!strcmp(json_string_value(json_array_get(r->notes, i)), text))
            return;
    json_array_append_new(r->notes, json_string(text));
}

/* A tool call slot by index, growing the array (at most AGENT_MAX_TOOL_CALLS). */
static struct llm_tool_call *call_slot(struct llm_reply *r, size_t index)
{
    if (index >= AGENT_MAX_TOOL_CALLS)
        return NULL;
    if (index >= r->n_calls) {
        r->calls = xrealloc(r->calls, (index + 1) * sizeof(*r->calls));
        memset(r->calls + r->n_calls, 0, (index + 1 - r->n_calls) * sizeof(*r->calls));
        r->n_calls = index + 1;
    }
    return &r->calls[index];
}

static void str_append(char **dst, const char *s, size_t n)
{
    size_t old = *dst ? strlen(*dst) : 0;
    *dst = xrealloc(*dst, old + n + 1);
    memcpy(*dst + old, s, n);
    (*dst)[old + n] = '\0';
}

/* Arguments are a JSON string by the spec; some servers send the object itself. */
static void append_arguments(struct llm_tool_call *tc, json_t *args)
{
    if (json_is_string(args)) {
        str_append(&tc->arguments, json_string_value(args), json_string_length(args));
    } else if (args && !json_is_null(args)) {
        char *text = json_dumps(args, JSON_COMPACT);
        if (text)
            str_append(&tc->arguments, text, strlen(text));
        free(text);
    }
}

static void merge_name(struct llm_tool_call *tc, json_t *name)
{
    const char *s = json_string_value(name);
    if (!s || !*s)
        return;
    /* Most servers send the name once; a few repeat it whole in later chunks. */
    if (!tc->name)
        tc->name = xstrdup(s);
    else if (strcmp(tc->name, s))
        str_append(&tc->name, s, strlen(s));
}

/* Merges one tool call (whole, or a streamed fragment) into the reply. */
static void merge_call(struct llm_reply *r, json_t *call, size_t position)
{
    json_t *idx = json_object_get(call, "index");
    size_t index = json_is_integer(idx) && json_integer_value(idx) >= 0
                       ? (size_t)json_integer_value(idx)
                       : position;
    struct llm_tool_call *tc = call_slot(r, index);
    if (!tc)
        return;
    const char *id = json_string_value(json_object_get(call, "id"));
    if (id && *id && !tc->id)
        tc->id = xstrdup(id);
    json_t *fn = json_object_get(call, "function");
    merge_name(tc, json_object_get(fn, "name"));
    append_arguments(tc, json_object_get(fn, "arguments"));
}

static void merge_content(struct llm_reply *r, json_t *content)
{
    if (json_is_string(content)) {
        str_append(&r->content, json_string_value(content), json_string_length(content));
        return;
    }
    /* Content as a list of parts: keep the text ones. */
    size_t i;
    json_t *part;
    json_array_foreach(content, i, part)
    {
        const char *text = json_string_value(json_object_get(part, "text"));
        if (text)
            str_append(&r->content, text, strlen(text));
    }
}

static void merge_usage(struct llm_reply *r, json_t *usage)
{
    if (!json_is_object(usage))
        return;
    r->has_usage = true;
    r->prompt_tokens = (uint64_t)json_integer_value(json_object_get(usage, "prompt_tokens"));
    r->completion_tokens =
        (uint64_t)json_integer_value(json_object_get(usage, "completion_tokens"));
    r->total_tokens = (uint64_t)json_integer_value(json_object_get(usage, "total_tokens"));
    if (!r->total_tokens)
        r->total_tokens = r->prompt_tokens + r->completion_tokens;
}

/* Merges a message (plain reply) or a delta (stream chunk) into r. */
static void merge_message(struct llm_reply *r, json_t *m)
{
    merge_content(r, json_object_get(m, "content"));
    size_t i;
    json_t *call;
    json_array_foreach(json_object_get(m, "tool_calls"), i, call) merge_call(r, call, i);
    json_t *legacy = json_object_get(m, "function_call");
    if (json_is_object(legacy)) {
        json_t *wrapped = json_pack("{s:i,s:O}", "index", 0, "function", legacy);
        merge_call(r, wrapped, 0);
        json_decref(wrapped);
    }
}

static void merge_choice(struct llm_reply *r, json_t *chunk, const char *key)
{
    json_t *choice = json_array_get(json_object_get(chunk, "choices"), 0);
    merge_message(r, json_object_get(choice, key));
    const char *fr = json_string_value(json_object_get(choice, "finish_reason"));
    if (fr && *fr) {
        free(r->finish_reason);
        r->finish_reason = xstrdup(fr);
    }
    merge_usage(r, json_object_get(chunk, "usage"));
}

/* An {"error": {...}} object inside a 200 reply (some servers stream errors). */
static int reply_error(struct llm_client *c, json_t *j)
{
    json_t *e = json_object_get(j, "error");
    if (!e)
        return 0;
    const char *msg = json_string_value(json_object_get(e, "message"));
    _cleanup_free_ char *text = xstrdup(msg                 ? msg
                                        : json_is_string(e) ? json_string_value(e)
                                                            : "no message");
    llm_client_redact(c, text);
    return err_set(EPROTO, "the model endpoint %s reported an error: %.500s", c->url, text);
}

static int parse_plain(struct llm_client *c, const char *body, size_t n, struct llm_reply *r)
{
    json_error_t jerr;
    json_t *j = json_loadb(body, n, 0, &jerr);
    if (!j)
        return err_set(EPROTO,
                       "the model endpoint %s answered with something that is not "
                       "JSON (%s); is --base-url an OpenAI-compatible /v1 URL?",
                       c->url, jerr.text);
    int rc = reply_error(c, j);
    if (!rc && !json_is_object(json_array_get(json_object_get(j, "choices"), 0)))
        rc = err_set(EPROTO,
                     "the model endpoint %s answered without 'choices': not a Chat "
                     "Completions reply; is --base-url an OpenAI-compatible /v1 URL?",
                     c->url);
    if (!rc)
        merge_choice(r, j, "message");
    json_decref(j);
    return rc;
}

/* One SSE event's data. Returns 1 at [DONE], 0 to go on, -errno on an error event. */
static int sse_event(struct llm_client *c, struct buf *data, struct llm_reply *r, int *chunks)
{
    if (!data->len)
        return 0;
    if (!strcmp(data->data, "[DONE]"))
        return 1;
    json_t *j = json_loadb(data->data, data->len, 0, NULL);
    buf_reset(data);
    if (!j)
        return 0; /* a keep-alive or a line we cannot read: skipped, like browsers do */
    int rc = reply_error(c, j);
    if (!rc) {
        merge_choice(r, j, "delta");
        /* A server that ignores "stream" may still frame one whole message as an event. */
        json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
        if (json_object_get(choice, "message"))
            merge_choice(r, j, "message");
        (*chunks)++;
    }
    json_decref(j);
    return rc;
}

static int parse_sse(struct llm_client *c, const char *body, size_t n, struct llm_reply *r)
{
    struct buf data;
    int chunks = 0, rc = 0;
    buf_init(&data, 0);
    const char *p = body, *end = body + n;
    while (p < end && rc == 0) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *eol = nl ? nl : end;
        size_t len = (size_t)(eol - p);
        if (len && p[len - 1] == '\r')
            len--;
        if (!len) {
            rc = sse_event(c, &data, r, &chunks);
        } else if (len >= 5 && !strncmp(p, "data:", 5)) {
            const char *v = p + 5;
            size_t vn = len - 5;
            if (vn && *v == ' ')
                v++, vn--;
            if (data.len)
                buf_append(&data, "\n", 1);
            buf_append(&data, v, vn);
        }
        p = nl ? nl + 1 : end;
    }
    if (rc == 0)
        rc = sse_event(c, &data, r, &chunks);
    buf_release(&data);
    if (rc < 0)
        return rc;
    if (!chunks)
        return err_set(EPROTO,
                       "the model endpoint %s sent an event stream without a single "
                       "completion chunk",
                       c->url);
    return 0;
}

static int parse_reply(struct llm_client *c, const char *s, size_t n, struct llm_reply *r)
{
    size_t skip = strspn(s, " \t\r\n");
    /* A server may answer a streaming request with plain JSON, and the other way round. */
    if (s[skip] == '{')
        return parse_plain(c, s, n, r);
    return parse_sse(c, s, n, r);
}

/* Fills the gaps servers leave: tool calls without an id or a name, "tool" for
 * "tool_calls". */
static int normalise_reply(struct llm_client *c, struct llm_reply *r)
{
    for (size_t i = 0; i < r->n_calls; i++) {
        struct llm_tool_call *tc = &r->calls[i];
        if (!tc->id) {
            _cleanup_free_ char *hex = random_hex(12);
            tc->id = xasprintf("call_%s", hex);
            note(r, "a tool call came without an id; runcell made one up");
        }
        if (!tc->name)
            tc->name = xstrdup("");
        if (!tc->arguments)
            tc->arguments = xstrdup("");
    }
    if (r->finish_reason && !strcmp(r->finish_reason, "tool")) {
        free(r->finish_reason);
        r->finish_reason = xstrdup("tool_calls");
        note(r, "finish_reason \"tool\" read as \"tool_calls\"");
    }
    if (!r->content && !r->n_calls && r->finish_reason && !strcmp(r->finish_reason, "length"))
        return err_set(EPROTO,
                       "the model %s stopped at its length limit before saying "
                       "anything",
                       c->model);
    return 0;
}

int llm_parse_reply(struct llm_client *c, const char *body, size_t n, struct llm_reply *r)
{
    int rc = parse_reply(c, body, n, r);
    if (rc == 0)
        rc = normalise_reply(c, r);
    if (rc < 0) {
        /* The messages quote the answer (jansson's error text shows the bytes near a syntax
         * error), and an answer may echo the key it was sent. */
        _cleanup_free_ char *msg = xstrdup(err_msg());
        llm_client_redact(c, msg);
        err_set(-rc, "%s", msg);
    }
    return rc;
}

/* ---- requests, retries ---- */

static char *request_body(struct llm_client *c, json_t *messages, json_t *tools)
{
    json_t *req =
        json_pack("{s:s,s:O,s:b}", "model", c->model, "messages", messages, "stream", c->stream);
    if (tools && json_array_size(tools)) {
        json_object_set(req, "tools", tools);
        if (!c->no_tool_choice)
            json_object_set_new(req, "tool_choice", json_string("auto"));
    }
    if (c->stream && !c->no_stream_options)
        json_object_set_new(req, "stream_options", json_pack("{s:b}", "include_usage", 1));
    char *text = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    return text;
}

/* A 400 that names an optional field we sent: drop the field and ask again. */
static bool drop_rejected_field(struct llm_client *c, const struct http *h, struct llm_reply *r)
{
    const char *body = h->body.data ? h->body.data : "";
    if (h->status != 400 && h->status != 422)
        return false;
    if (!c->no_tool_choice && strstr(body, "tool_choice")) {
        c->no_tool_choice = true;
        note(r, "the server rejected tool_choice; asked again without it");
        return true;
    }
    if (c->stream && !c->no_stream_options && strstr(body, "stream_options")) {
        c->no_stream_options = true;
        note(r, "the server rejected stream_options; asked again without it");
        return true;
    }
    return false;
}

static bool retryable_curl(CURLcode cc)
{
    switch (cc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
        return true;
    default:
        return false;
    }
}

/* Sleeps ms, waking early when cancelled; false when cancelled. */
static bool pause_ms(uint64_t ms, const struct agent_cancel *cancel)
{
    double until = now_ms_f() + (double)ms;
    while (now_ms_f() < until) {
        if (agent_cancelled(cancel))
            return false;
        double left = until - now_ms_f();
        struct pollfd p = {.fd = cancel && cancel->fd >= 0 ? cancel->fd : -1,
                           .events = cancel && cancel->events ? cancel->events : POLLIN};
        poll(&p, 1, (int)MIN(left + 1, 100.0));
    }
    return !agent_cancelled(cancel);
}

static uint64_t backoff_for(struct llm_client *c, unsigned attempt, long retry_after_s)
{
    uint64_t d = c->backoff_ms;
    for (unsigned i = 1; i < attempt && d < MAX_BACKOFF_MS; i++)
        d *= 2;
    d = MIN(d, MAX_BACKOFF_MS);
    uint32_t rnd = 0;
    random_bytes(&rnd, sizeof(rnd));
    d = d / 2 + (d / 2 ? rnd % (d / 2 + 1) : 0); /* "equal jitter" */
    if (retry_after_s > 0)
        d = MAX(d, MIN((uint64_t)retry_after_s * 1000, MAX_BACKOFF_MS));
    return d;
}

/* The server's own words from an error body, redacted and short. */
static char *server_says(struct llm_client *c, const struct http *h)
{
    json_t *j = h->body.data ? json_loadb(h->body.data, h->body.len, 0, NULL) : NULL;
    json_t *e = json_object_get(j, "error");
    const char *msg = json_string_value(json_object_get(e, "message"));
    if (!msg)
        msg = json_string_value(e);
    if (!msg)
        msg = json_string_value(json_object_get(j, "detail"));
    char *text = xasprintf("%.400s", msg ? msg : h->body.data ? h->body.data : "");
    json_decref(j);
    text[strcspn(text, "\r\n")] = '\0';
    llm_client_redact(c, text);
    return text;
}

/* Failures before a byte of the request reached a server: the endpoint is wrong or down. */
static bool unreachable_curl(CURLcode cc)
{
    return cc == CURLE_COULDNT_CONNECT || cc == CURLE_COULDNT_RESOLVE_HOST ||
           cc == CURLE_COULDNT_RESOLVE_PROXY || cc == CURLE_SSL_CONNECT_ERROR ||
           cc == CURLE_PEER_FAILED_VERIFICATION || cc == CURLE_UNSUPPORTED_PROTOCOL;
}

/* The error for a final failure; the message names the URL, never the key. */
static int fail_http(struct llm_client *c, CURLcode cc, const char *errbuf, struct http *h,
                     unsigned attempts)
{
    if (cc == CURLE_ABORTED_BY_CALLBACK)
        return err_set(ECANCELED, "the request to the model was cancelled");
    if (h->too_big)
        return err_set(E2BIG,
                       "the model's response from %s is larger than %u MiB; runcell "
                       "stopped reading it",
                       c->url, AGENT_MAX_RESPONSE >> 20);
    if (cc == CURLE_OPERATION_TIMEDOUT)
        return err_set(ETIMEDOUT,
                       "the model endpoint %s did not answer within %.3g s (%u "
                       "attempt%s); raise --request-timeout or check the server",
                       c->url, (double)c->timeout_ms / 1000.0, attempts, attempts == 1 ? "" : "s");
    _cleanup_free_ char *os_error =
        h->os_errno ? xasprintf(" (errno %ld: %s)", h->os_errno, strerror((int)h->os_errno))
                    : xstrdup("");
    if (cc != CURLE_OK && unreachable_curl(cc))
        return err_set(ECONNREFUSED,
                       "cannot reach the model endpoint %s: %s%s (%u attempt%s); check that "
                       "the model server is running and that --base-url / OPENAI_BASE_URL "
                       "names it",
                       c->url, *errbuf ? errbuf : curl_easy_strerror(cc), os_error, attempts,
                       attempts == 1 ? "" : "s");
    if (cc != CURLE_OK)
        return err_set(ECONNRESET,
                       "the connection to the model endpoint %s failed: %s%s (%u attempt%s); "
                       "check the model server",
                       c->url, *errbuf ? errbuf : curl_easy_strerror(cc), os_error, attempts,
                       attempts == 1 ? "" : "s");
    _cleanup_free_ char *says = server_says(c, h);
    const char *hint = h->status == 401 || h->status == 403 ? "; check --api-key / OPENAI_API_KEY"
                       : h->status == 404 ? "; check --base-url (it ends in /v1) and --model"
                                          : "";
    /* A refused key or an unknown model or path will not change by asking again. */
    int e = h->status == 401 || h->status == 403 ? EACCES : h->status == 404 ? ENOENT : EIO;
    return err_set(e, "the model endpoint %s answered HTTP %ld (%u attempt%s): %s%s", c->url,
                   h->status, attempts, attempts == 1 ? "" : "s", says, hint);
}

int llm_chat(struct llm_client *c, json_t *messages, json_t *tools,
             const struct agent_cancel *cancel, struct llm_reply *ret)
{
    struct llm_reply r = {0};
    char errbuf[CURL_ERROR_SIZE];
    unsigned failures = 0;
    int rc;
    for (;;) {
        struct http h = {.retry_after_s = -1, .cancel = cancel};
        buf_init(&h.body, AGENT_MAX_RESPONSE);
        _cleanup_free_ char *body = request_body(c, messages, tools);
        CURLcode cc = http_post(c, body, &h, errbuf);
        r.attempts++;
        if (cc == CURLE_OK && h.status == 200) {
            rc = llm_parse_reply(c, h.body.data ? h.body.data : "", h.body.len, &r);
            buf_release(&h.body);
            break;
        }
        if (cc == CURLE_OK && drop_rejected_field(c, &h, &r)) {
            buf_release(&h.body);
            continue;
        }
        bool retry = (cc == CURLE_OK && (h.status == 429 || h.status >= 500)) ||
                     (cc != CURLE_OK && !h.too_big && retryable_curl(cc));
        if (!retry || failures >= c->retries) {
            rc = fail_http(c, cc, errbuf, &h, r.attempts);
            buf_release(&h.body);
            break;
        }
        failures++;
        uint64_t wait = backoff_for(c, failures, h.retry_after_s);
        char what[160];
        if (cc == CURLE_OK)
            snprintf(what, sizeof(what),
                     "the server answered HTTP %ld; asked again after a "
                     "pause",
                     h.status);
        else
            snprintf(what, sizeof(what), "%s; asked again after a pause", curl_easy_strerror(cc));
        note(&r, what);
        log_info("msg=\"model request failed; retrying\" url=%s status=%ld curl=%d wait_ms=%llu",
                 c->url, h.status, (int)cc, (unsigned long long)wait);
        buf_release(&h.body);
        if (!pause_ms(wait, cancel)) {
            rc = err_set(ECANCELED, "the request to the model was cancelled");
            break;
        }
    }
    if (rc < 0) {
        llm_reply_release(&r);
        return rc;
    }
    *ret = r;
    return 0;
}
