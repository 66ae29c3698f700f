/* agent-int.h - internals of the agent module, shared by its files only. */
#ifndef RUNCELL_AGENT_INT_H
#define RUNCELL_AGENT_INT_H

#include <sqlite3.h>

#include "agent/agent.h"

#define AGENT_MAX_TOOL_CALLS 16         /* per model reply; more are dropped */
#define AGENT_MAX_ARGUMENTS  (1u << 20) /* bytes of one tool call's arguments */
#define AGENT_DB_NAME        "agent.db"

/* libcurl's global set-up, once per process (llm.c). */
void agent_curl_init(void);
/* Reads the body of a 200 answer (n bytes, NUL-terminated), plain JSON or server-sent
 * events, into r and fills the gaps servers leave, as llm_chat does (llm.c). 0, or -EPROTO
 * with err_msg() (the API key never appears in it). r is the caller's to release. */
int llm_parse_reply(struct llm_client *c, const char *body, size_t n, struct llm_reply *r);

/* ---- the SQLite file (db.c) ---- */

/* Opens DATA/agent.db (created 0600 with its schema, DATA 0700), with a busy timeout so
 * that threads and processes can share it. 0 or -errno with err_msg(). */
int agent_db_open(const char *data_dir, sqlite3 **ret);
void agent_db_close(sqlite3 *db);
/* Opens the database and prepares sql. 0 with both set, or -errno with err_msg() naming
 * what (nothing is left open). */
int db_prepare(const char *data_dir, const char *sql, const char *what, sqlite3 **ret_db,
               sqlite3_stmt **ret_st);
/* Runs a prepared write to its end; finalises st and closes db either way. 0 or -EIO. */
int db_write(sqlite3 *db, sqlite3_stmt *st, const char *what);
/* Finalises st and closes db. */
void db_done(sqlite3 *db, sqlite3_stmt *st);
/* Binds texts to parameters 1..n (NULL binds NULL); the strings must outlive the step. */
void db_bind_texts(sqlite3_stmt *st, int n, ...);
/* A column as a fresh string, or NULL. */
char *db_text(sqlite3_stmt *st, int col);
/* err_set() from the database's last error; returns -EIO. */
int db_fail(sqlite3 *db, const char *what);
/* The current time as an ISO 8601 string (UTC). */
void db_now(char out[32]);

/* ---- failures (failmem.c) ---- */

/* What an execution's failure looks like, abstracted (see failmem_normalise). */
struct failure {
    char *type;    /* exception name, or the status ("timeout", "crashed", ...) */
    char *message; /* normalised */
    char *line;    /* normalised failing source line, or "" */
    char *raw;     /* the concrete message, for notes */
    char sig[17];  /* hex FNV-1a of type, message and line */
};
/* Derives the failure of a record that is not ok; false when there is none. */
bool failure_from_record(const struct exec_record *rec, struct failure *ret);
void failure_release(struct failure *f);

/* What the memory knew about a signature, within one scope, before this occurrence. Only
 * facts: counts and which tool fixed it. No text from an earlier run is kept for the
 * model (an earlier run's code or output is not to be read as instructions by a later one);
 * the note is made now, from this run's own failure. */
struct failmem_known {
    long seen;            /* earlier occurrences in this environment and scope */
    bool unfixable;       /* this failure is classified as unfixable here */
    char *note;           /* why it cannot work and what does instead, or NULL */
    long fixed;           /* times a later execution succeeded right after it */
    const char *fixed_by; /* "run_python" or "run_shell" (static), or NULL */
};
void failmem_known_release(struct failmem_known *k);
/* Classifies f (unfixable here: a module that is not installed and cannot be, a network call
 * under policy none; networked: the sandbox f came from had a network, where both may be
 * fixed by a reachable index or host), records one more occurrence under (env, scope) and fills
 * *ret with what was known there. scope is the task's fingerprint: what one task learns is seen by
 * runs of that task only. data_dir NULL: classification only. 0 or -errno. */
int failmem_note(const char *data_dir, const char *env, const char *scope, const struct failure *f,
                 const char *stderr_text, const char *packages, bool networked,
                 struct failmem_known *ret);
/* Records that a tool call ("run_python" or "run_shell") succeeded right after a failure
 * with signature sig; nothing of its code is kept. */
int failmem_fixed(const char *data_dir, const char *env, const char *scope, const char *sig,
                  const char *tool);

/* A task's history: how often it ran and how often it exhausted its retries here. */
struct task_history {
    long runs;
    long exhausted;
    bool doomed; /* the last run exhausted its retries */
    char *last_reason;
    char *last_code;
    char *last_error;
    char *last_seen;
};
void task_history_release(struct task_history *h);
/* Fingerprint of a task: its normalised text and its input files' names and contents.
 * Caller frees. */
char *task_fingerprint(const char *task, const struct agent_file *files, size_t n_files);
int task_history_get(const char *data_dir, const char *env, const char *fp,
                     struct task_history *ret);
int task_history_put(const char *data_dir, const char *env, const char *fp, const char *reason,
                     bool exhausted, const char *last_code, const char *last_error);
/* FNV-1a, 64 bits, continued from h (start with FNV_OFFSET). */
#define FNV_OFFSET 0xcbf29ce484222325ull
uint64_t fnv1a(const void *data, size_t n, uint64_t h);

/* ---- the environment the model is told about (prompt.c) ---- */

struct agent_env {
    char *python_version;
    char *packages; /* "numpy 1.24.2, pandas 1.5.3, ..." (capped) */
    char *key;      /* identifies this environment in the failure memory */
    char *hosts;    /* the session's allowlist, "a.example:443, ...", "the public internet",
                     * or NULL for none (loopback only) */
    char *keyed;    /* the hosts the proxy adds credentials for, or NULL */
};
/* What the model is told of s (NULL: no session, weak mode), and the memory's key for it. */
void agent_env_init(struct agent_env *e, struct session *s);
void agent_env_release(struct agent_env *e);
/* The system prompt: the truth about the sandbox, the tools and the budgets. */
char *agent_system_prompt(const struct agent_env *e, const struct agent_options *o,
                          struct workspace *ws, bool weak);
/* What the model is told when the run switches to weak mode. */
char *agent_weak_notice(const char *why);
/* The tool definitions offered (run_shell only outside weak mode). */
json_t *agent_tools(bool weak);

/* ---- observations (observe.c) ---- */

/* The text the model sees for one execution: status, head and tail of the streams, results,
 * the error with a trimmed traceback, files, images, and a note. Caller frees. */
char *observation_text(const struct exec_record *rec, char *const *images, const char *note);
/* Saves the record's images into the workspace, named after its cell (figure-CELL-N.png, see
 * exec_figure_save); returns their names and, when images_b64 is not NULL, appends their
 * base64 to it. */
char **save_images(struct workspace *ws, const struct exec_record *rec, json_t *images_b64);
/* s cut to head and tail bytes with a marker naming what was dropped; caller frees. */
char *clip_text(const char *s, size_t head, size_t tail);

/* ---- weak mode (weak.c) ---- */

/* Runs code in a fresh, stateless sandbox: plain python3 -I -S with imports outside the
 * standard library refused, stopped after timeout_ms (0: the default), which the caller has
 * cut to the run's wall-time budget. Fills rec (initialised by the caller), including an
 * error object parsed from the traceback. 0, or -errno when the request is unusable. */
int weak_run(struct sandbox_host *host, const struct agent_options *o, const char *code,
             uint64_t timeout_ms, struct exec_record *rec);

/* ---- review queue and webhook (review.c) ---- */

/* Stores an incident (reference borrowed; "id", "status" and "created_at" are added to
 * it). 0 and *ret_id (caller frees), or -errno. */
int review_create(const char *data_dir, json_t *incident, char **ret_id);
/* POSTs body as JSON to url (10 s timeout). Returns the HTTP status, or -errno with
 * err_msg(). */
int webhook_post(const char *url, json_t *body);

#endif
