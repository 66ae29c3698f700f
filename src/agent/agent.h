/* agent.h - the agent workflow: a language model writes code, runcell runs it in a session,
 * errors go back for repair with bounded retries, then fallbacks (weak mode, hand-back, human
 * review), with a failure memory. The contract for the CLI and the HTTP server.
 *
 * The model is any OpenAI-compatible Chat Completions endpoint, reached over libcurl. The
 * failure memory and the review queue live in one SQLite file under the data directory
 * (DATA/agent.db); each call opens its own connection, so any thread may call them.
 *
 * Ownership: every json_t returned through a ret_* pointer belongs to the caller. */
#ifndef RUNCELL_AGENT_H
#define RUNCELL_AGENT_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "session/session.h"

#define AGENT_DEFAULT_MAX_STEPS          20
#define AGENT_DEFAULT_MAX_RETRIES        3
#define AGENT_DEFAULT_REQUEST_TIMEOUT_MS (300u * 1000)
#define AGENT_DEFAULT_HTTP_RETRIES       4
#define AGENT_DEFAULT_BACKOFF_MS         1000
/* Cells the agent's own session can undo: a failed Python cell is taken back before the repair,
 * so that the retry starts from the state before it (docs/AGENT.md). */
#define AGENT_DEFAULT_HISTORY 1
#define AGENT_MAX_RESPONSE    (8u << 20) /* bytes of one model response, plain or streamed */

/* Stops a run from outside: a readable (or hung-up, per events) fd, or a flag set by
 * another thread. Either may be absent (fd -1, flag NULL). */
struct agent_cancel {
    int fd;
    short events; /* poll events for fd; 0 = POLLIN */
    const atomic_bool *flag;
};
/* True when the run should stop now (polls without waiting). */
bool agent_cancelled(const struct agent_cancel *c);

/* ---- the model client ---- */

struct llm_config {
    const char *base_url;        /* ".../v1" (NULL: OPENAI_BASE_URL); required, no default:
                                  * tasks go to no endpoint nobody chose */
    const char *api_key;         /* NULL: OPENAI_API_KEY; may be empty for local servers */
    const char *model;           /* NULL: RUNCELL_MODEL; required one way or the other */
    bool stream;                 /* ask for server-sent events */
    uint64_t request_timeout_ms; /* one HTTP request, start to end */
    unsigned http_retries;       /* of 429, 5xx and connection errors */
    uint64_t backoff_ms;         /* first pause; doubles, with jitter, capped at 30 s */
};

struct llm_client;

/* Copies cfg (filling defaults from the environment); the key is kept only in the client
 * and wiped by llm_client_free. 0, -EINVAL with err_msg() (no model, bad URL), or
 * -EDESTADDRREQ when no endpoint was named (neither base_url nor OPENAI_BASE_URL). */
int llm_client_new(const struct llm_config *cfg, struct llm_client **ret);
void llm_client_free(struct llm_client *c);
const char *llm_client_model(const struct llm_client *c);
const char *llm_client_base_url(const struct llm_client *c);
/* Replaces every occurrence of the client's API key in s (in place) with '*'. */
void llm_client_redact(const struct llm_client *c, char *s);

/* What lets the code of a run call the model itself with the key never in its sandbox: net's
 * allowlist (a new one when it has none) with the endpoint's host and port added, net's
 * secrets with one more that gives the key to that host, under the base URL's path, as
 * "Authorization: Bearer KEY" (none when the key is empty; over plain HTTP only when the base
 * URL is plain HTTP, where the key travels so anyway), and the variables a client reads:
 * OPENAI_BASE_URL (localhost as 127.0.0.1), RUNCELL_MODEL and OPENAI_API_KEY, a placeholder
 * (clients refuse to start without one; the proxy puts the key in its place). The new
 * allowlist must be within max (NULL: no cap). 0, or -EINVAL with err_msg() (never the key,
 * nor a URL that carries a user name). */
struct model_access {
    struct net_policy *policy;
    struct net_secrets *secrets;
    char **env;
    char *entry; /* the allowlist's entry for the endpoint, "HOST:PORT" */
};
#define MODEL_KEY_PLACEHOLDER "runcell-egress-proxy-adds-the-key"
int llm_model_access(const struct llm_client *c, const struct net_opts *net,
                     const struct net_policy *max, struct model_access *ret);
void model_access_release(struct model_access *a);

struct llm_tool_call {
    char *id; /* made up when the server sent none */
    char *name;
    char *arguments; /* raw text, as the model wrote it */
};

struct llm_reply {
    char *content; /* NULL when the model said nothing */
    struct llm_tool_call *calls;
    size_t n_calls;
    char *finish_reason; /* normalised: "tool" is reported as "tool_calls" */
    bool has_usage;
    uint64_t prompt_tokens, completion_tokens, total_tokens;
    unsigned attempts; /* HTTP requests made, retries included */
    json_t *notes;     /* array of strings: quirks met and worked around */
};
void llm_reply_release(struct llm_reply *r);

/* One chat completion with tools. messages and tools are borrowed. Retries 429, 5xx and
 * connection errors with backoff; retries without tool_choice (or stream_options) when the
 * server rejects it. Returns 0 and fills *ret, or -errno with err_msg() (the API key never
 * appears in it): -ETIMEDOUT, -ECONNREFUSED (the endpoint cannot be reached: connect, DNS,
 * TLS), -ECONNRESET (the connection failed later), -EPROTO (not a Chat Completions reply),
 * -E2BIG (larger than AGENT_MAX_RESPONSE), -ECANCELED, -EACCES (HTTP 401/403: the key),
 * -ENOENT (HTTP 404: the model or the path), -EIO (another HTTP error status). */
int llm_chat(struct llm_client *c, json_t *messages, json_t *tools,
             const struct agent_cancel *cancel, struct llm_reply *ret);

/* ---- a run ---- */

enum agent_fallback { FALLBACK_WEAK, FALLBACK_HANDBACK, FALLBACK_REVIEW, FALLBACK_COUNT };
/* Parses "weak,handback,review" (any order, any subset; "none" for none). 0 or -EINVAL. */
int agent_parse_fallbacks(const char *s, enum agent_fallback *ret, size_t *ret_n);
const char *agent_fallback_name(enum agent_fallback f);

/* An input file: copied into the workspace (and into every weak-mode run). */
struct agent_file {
    const char *host_path;
    const char *dest; /* relative path in the workspace */
};

struct agent_options {
    const char *task;
    const struct agent_file *files;
    size_t n_files;
    unsigned max_steps;   /* model turns; 0 = AGENT_DEFAULT_MAX_STEPS */
    unsigned max_retries; /* consecutive failed executions; 0 = AGENT_DEFAULT_MAX_RETRIES */
    uint64_t max_time_ms; /* wall time of the run; 0 = none */
    uint64_t max_tokens;  /* total tokens, when the endpoint reports usage; 0 = none */
    bool vision;          /* send images to the model as image input */
    enum agent_fallback fallbacks[FALLBACK_COUNT];
    size_t n_fallbacks; /* with fallbacks_set false: all three, in order */
    bool fallbacks_set;
    bool retry_doomed;       /* run a task that exhausted its retries before anyway */
    bool no_memory;          /* neither read nor write the failure memory */
    const char *data_dir;    /* failure memory and review queue; NULL: neither */
    const char *webhook_url; /* review incidents are also POSTed here */
    const char *out_dir;     /* produced files are copied here */
    bool model_access;       /* the code may call the model too (llm_model_access made the
                              * session's network): the model is told how */
    const struct session_opts *session_opts; /* the limits the session was made with */
    const char *session_error;               /* why the stateful session could not start (s NULL) */
    struct agent_cancel cancel;
};

/* Progress: each event is a JSON object with a "type" (run, model, tool_call, observation,
 * notice, fallback, outcome), borrowed for the duration of the call. */
struct agent_events {
    void (*fn)(void *ctx, json_t *event);
    void *ctx;
};

/* Runs the loop for o->task on session s (NULL when it could not be started: the run goes
 * to weak mode or the other fallbacks). s stays open; the caller frees it. Returns 0 with
 * *ret_outcome (the outcome record, transcript included), or -errno with err_msg() for a
 * request that cannot run at all (bad options). */
int agent_run(struct sandbox_host *host, struct llm_client *llm, struct session *s,
              const struct agent_options *o, const struct agent_events *ev, json_t **ret_outcome);

/* ---- the review queue (DATA/agent.db) ---- */

/* Incidents, newest first: summaries without the transcript. status: "open", "resolved" or
 * NULL for both. 0 or -errno with err_msg(). */
int review_list(const char *data_dir, const char *status, size_t limit, json_t **ret);
/* The whole incident record. -ENOENT when there is no such id. */
int review_get(const char *data_dir, const char *id, json_t **ret);
/* Marks an incident resolved with a note; returns the updated record. -ENOENT, -EINVAL. */
int review_resolve(const char *data_dir, const char *id, const char *note, json_t **ret);

/* ---- the failure memory ---- */

/* The most frequent failure signatures: [{signature, type, message, line, example, count,
 * env, scope, unfixable, fixed, fixed_by, first_seen, last_seen}]. */
int failmem_top(const char *data_dir, size_t limit, json_t **ret);
/* The normalised form of an error message or a source line: numbers, paths and quoted names
 * abstracted (<n>, <path>, '<name>'), white space folded. Caller frees. */
char *failmem_normalise(const char *text);

#endif
