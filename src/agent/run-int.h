/* run-int.h - the state of one agent run, shared by loop.c and fallback.c only. */
#ifndef RUNCELL_AGENT_RUN_INT_H
#define RUNCELL_AGENT_RUN_INT_H

#include "agent/agent-int.h"

/* Why a run ended. */
enum stop_reason {
    STOP_RUNNING,
    STOP_ANSWERED,
    STOP_RETRIES,     /* max consecutive failed executions */
    STOP_NO_PROGRESS, /* the same error twice in a row */
    STOP_UNFIXABLE,   /* a known-unfixable error, retries skipped */
    STOP_MAX_STEPS,
    STOP_MAX_TIME,
    STOP_MAX_TOKENS,
    STOP_MODEL_ERROR,
    STOP_MODEL_UNREACHABLE,   /* configuration: the endpoint cannot be reached */
    STOP_MODEL_MISCONFIGURED, /* configuration: the endpoint refused the key, model or path */
    STOP_SANDBOX, /* the sandbox cannot serve and weak mode is not allowed (or failed) */
    STOP_DOOMED,  /* the task exhausted its retries before: straight to the fallbacks */
    STOP_CANCELLED,
};

struct run {
    struct sandbox_host *host;
    struct llm_client *llm;
    struct session *s;
    struct agent_options o; /* defaults filled */
    const struct agent_events *ev;
    struct agent_env env;
    json_t *messages; /* the transcript, as sent to the model */
    json_t *tools;
    json_t *attempts;         /* every code attempt */
    json_t *fallbacks;        /* what each fallback did */
    json_t *sandbox_log;      /* what runcell said about the sandbox */
    json_t *known;            /* failure-memory hits */
    json_t *weak_files;       /* files weak-mode runs copied out */
    struct ws_listing before; /* the workspace after the inputs were copied in */
    char *fingerprint;
    unsigned steps;
    unsigned failures_in_row;
    unsigned crashes_in_row;
    char last_sig[17];
    char fix_sig[17]; /* the failure the next success fixes */
    bool retries_skipped;
    bool weak;
    bool doomed;
    uint64_t prompt_tokens, completion_tokens, total_tokens;
    bool usage_seen;
    double t0;
    enum stop_reason stop;
    char *stop_detail; /* a sentence for the user */
    char *answer;
    char *last_code;
    const char *last_tool;
    char *last_error;
    char *missing_module; /* from the last ModuleNotFoundError, for the hand-back */
    char *review_id;
};

const char *stop_reason_name(enum stop_reason s);
/* Ends the run with reason and a sentence (printf-style) for the user. */
void run_stop(struct run *r, enum stop_reason reason, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Emits a progress event (reference stolen). */
void run_emit(struct run *r, json_t *event);
/* Records what a fallback did, and emits it. */
void run_fallback(struct run *r, enum agent_fallback f, bool ran, const char *detail);
bool run_has_fallback(const struct run *r, enum agent_fallback f);

/* fallback.c: runs hand-back and review (in the configured order) for a failed run. */
void run_fallbacks(struct run *r);
/* fallback.c: the outcome record; caller owns it. */
json_t *run_outcome(struct run *r, json_t *files);

#endif
