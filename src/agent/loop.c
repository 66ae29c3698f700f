/* loop.c - the think-act-observe loop: ask the model, run its code in the session, show it
 * what happened, and stop on an answer or when a budget runs out; failures feed the failure
 * memory, and a sandbox that cannot serve switches the run to weak mode. */
#include "agent/run-int.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define CRASHES_FOR_WEAK    2 /* interpreter crashes in a row that mean the sandbox cannot serve */
#define ATTEMPT_OBSERVATION 4000
#define LIVE_OUTPUT_MAX     (64 * 1024) /* bytes of a step's output sent as it comes */

static const char *const stop_names[] = {
    [STOP_RUNNING] = "running",
    [STOP_ANSWERED] = "answered",
    [STOP_RETRIES] = "retries_exhausted",
    [STOP_NO_PROGRESS] = "no_progress",
    [STOP_UNFIXABLE] = "known_unfixable",
    [STOP_MAX_STEPS] = "max_steps",
    [STOP_MAX_TIME] = "max_time",
    [STOP_MAX_TOKENS] = "max_tokens",
    [STOP_MODEL_ERROR] = "model_error",
    [STOP_MODEL_UNREACHABLE] = "model_unreachable",
    [STOP_MODEL_MISCONFIGURED] = "model_misconfigured",
    [STOP_SANDBOX] = "sandbox_failed",
    [STOP_DOOMED] = "doomed",
    [STOP_CANCELLED] = "cancelled",
};

const char *stop_reason_name(enum stop_reason s)
{
    return stop_names[s];
}

bool agent_cancelled(const struct agent_cancel *c)
{
    if (!c)
        return false;
    if (c->flag && atomic_load(c->flag))
        return true;
    if (c->fd < 0)
        return false;
    struct pollfd p = {.fd = c->fd, .events = c->events ? c->events : POLLIN};
    return poll(&p, 1, 0) > 0 && p.revents;
}

void run_stop(struct run *r, enum stop_reason reason, const char *fmt, ...)
{
    va_list ap;
    if (r->stop != STOP_RUNNING)
        return;
    r->stop = reason;
    va_start(ap, fmt);
    free(r->stop_detail);
    if (vasprintf(&r->stop_detail, fmt, ap) < 0)
        r->stop_detail = NULL;
    va_end(ap);
    run_emit(r, json_pack("{s:s,s:s,s:s}", "type", "notice", "stop", stop_reason_name(reason),
                          "text", r->stop_detail ? r->stop_detail : ""));
}

void run_emit(struct run *r, json_t *event)
{
    if (r->ev && r->ev->fn && event)
        r->ev->fn(r->ev->ctx, event);
    json_decref(event);
}

bool run_has_fallback(const struct run *r, enum agent_fallback f)
{
    for (size_t i = 0; i < r->o.n_fallbacks; i++)
        if (r->o.fallbacks[i] == f)
            return true;
    return false;
}

void run_fallback(struct run *r, enum agent_fallback f, bool ran, const char *detail)
{
    json_t *entry =
        json_pack("{s:s,s:b,s:s}", "name", agent_fallback_name(f), "ran", ran, "detail", detail);
    json_array_append(r->fallbacks, entry);
    json_t *ev = json_pack("{s:s}", "type", "fallback");
    json_object_update(ev, entry);
    json_decref(entry);
    run_emit(r, ev);
}

static double elapsed_ms(const struct run *r)
{
    return now_ms_f() - r->t0;
}

/* ---- weak mode ---- */

/* The stateful sandbox cannot serve: switch to weak mode when allowed, else end the run.
 * Returns what the model must be told, or NULL. */
static char *sandbox_cannot_serve(struct run *r, const char *why)
{
    json_array_append_new(r->sandbox_log,
                          json_pack("{s:s,s:i}", "event", why, "step", (int)r->steps));
    if (r->weak)
        return NULL;
    if (!run_has_fallback(r, FALLBACK_WEAK)) {
        run_stop(r, STOP_SANDBOX,
                 "the sandbox cannot serve (%s), and weak mode is not among "
                 "the fallbacks",
                 why);
        return NULL;
    }
    r->weak = true;
    r->failures_in_row = 0;
    r->crashes_in_row = 0;
    r->last_sig[0] = '\0';
    json_decref(r->tools);
    r->tools = agent_tools(true);
    _cleanup_free_ char *detail = xasprintf("switched to weak mode: %s", why);
    run_fallback(r, FALLBACK_WEAK, true, detail);
    return agent_weak_notice(why);
}

/* ---- tool calls ---- */

static void add_tool_message(struct run *r, const char *id, const char *text)
{
    json_array_append_new(r->messages, json_pack("{s:s,s:s,s:s}", "role", "tool", "tool_call_id",
                                                 id, "content", text));
}

/* A failed attempt that never reached the sandbox (bad arguments, unknown tool). */
static void refuse_call(struct run *r, const struct llm_tool_call *tc, const char *why)
{
    _cleanup_free_ char *text = xasprintf("error: %s", why);
    add_tool_message(r, tc->id, text);
    r->failures_in_row++;
    _cleanup_free_ char *args = clip_text(tc->arguments, 1500, 500);
    json_array_append_new(r->attempts, json_pack("{s:i,s:s,s:s,s:s,s:s}", "step", (int)r->steps,
                                                 "tool", tc->name, "arguments", args, "status",
                                                 "bad_call", "error", why));
    run_emit(r, json_pack("{s:s,s:i,s:s,s:s,s:s}", "type", "observation", "step", (int)r->steps,
                          "tool", tc->name, "status", "bad_call", "observation", text));
    if (r->failures_in_row >= r->o.max_retries)
        run_stop(r, STOP_RETRIES, "%u failed attempts in a row (the last: %s)", r->failures_in_row,
                 why);
}

/* The code of a call, or NULL after telling the model exactly what was wrong. */
static char *call_code(struct run *r, const struct llm_tool_call *tc, const char **ret_lang)
{
    bool py = !strcmp(tc->name, "run_python"), sh = !strcmp(tc->name, "run_shell");
    const char *field = py ? "code" : "command";
    if (!py && !sh) {
        _cleanup_free_ char *why = xasprintf("there is no tool named '%.100s'; the tools are "
                                             "run_python(code)%s",
                                             tc->name, r->weak ? "" : " and run_shell(command)");
        refuse_call(r, tc, why);
        return NULL;
    }
    if (sh && r->weak) {
        refuse_call(r, tc,
                    "run_shell is not available in weak mode; use run_python with the "
                    "standard library");
        return NULL;
    }
    if (strlen(tc->arguments) > AGENT_MAX_ARGUMENTS) {
        refuse_call(r, tc, "the arguments are larger than 1 MiB; send less code at a time");
        return NULL;
    }
    json_error_t jerr;
    json_t *args = *tc->arguments ? json_loads(tc->arguments, JSON_DECODE_ANY, &jerr) : NULL;
    _cleanup_free_ char *why = NULL;
    if (!*tc->arguments)
        why = xasprintf("the arguments of %s are empty; send a JSON object such as "
                        "{\"%s\": \"...\"}",
                        tc->name, field);
    else if (!args)
        why = xasprintf("the arguments of %s are not valid JSON: %s (line %d, column %d); "
                        "send a JSON object such as {\"%s\": \"...\"} with the %s as one JSON "
                        "string (newlines as \\n, quotes as \\\")",
                        tc->name, jerr.text, jerr.line, jerr.column, field, field);
    else if (!json_is_object(args))
        why = xasprintf("the arguments of %s must be a JSON object such as {\"%s\": \"...\"}, "
                        "not a %s",
                        tc->name, field, json_is_array(args) ? "list" : "value");
    else if (!json_is_string(json_object_get(args, field)))
        why = xasprintf("the arguments of %s need the field \"%s\" as a string%s", tc->name, field,
                        json_object_get(args, field) ? " (it is not a string)" : "");
    char *code = why ? NULL : xstrdup(json_string_value(json_object_get(args, field)));
    json_decref(args);
    if (why) {
        refuse_call(r, tc, why);
        return NULL;
    }
    *ret_lang = py ? "python" : "bash";
    return code;
}

/* What the failure memory says about f, as a note for the model; updates the run's state.
 * The note is runcell's own words and numbers: the unfixable verdict and its explanation
 * come from this failure, the counts from earlier runs of this same task. */
static char *remember_failure(struct run *r, const struct exec_record *rec, const struct failure *f)
{
    struct failmem_known k;
    size_t n;
    _cleanup_free_ char *err_text = outcap_render(&rec->err, &n);
    const char *dir = r->o.no_memory ? NULL : r->o.data_dir;
    bool networked = !r->weak && r->env.hosts;
    if (failmem_note(dir, r->env.key, r->fingerprint, f, err_text, r->env.packages, networked, &k) <
        0)
        log_warn("msg=\"failure memory unavailable\" error=%s", log_quote(err_msg()));
    char *note = NULL;
    if (k.unfixable) {
        _cleanup_free_ char *seen =
            k.seen ? xasprintf(" (seen %ld time%s before)", k.seen, k.seen == 1 ? "" : "s")
                   : xstrdup("");
        note = xasprintf("runcell knows this cannot work here%s: %s Do not retry the same way.",
                         seen, k.note);
        r->retries_skipped = true;
        /* No retries for it: the next failure ends the run. */
        r->failures_in_row = MAX(r->failures_in_row, r->o.max_retries - 1);
    } else if (k.fixed && k.fixed_by) {
        note =
            xasprintf("runcell has seen this error %ld time%s before in earlier runs of this "
                      "task; a changed %s call right after it worked %ld time%s. Find the "
                      "cause in the error above and change the code that hit it.",
                      k.seen, k.seen == 1 ? "" : "s", k.fixed_by, k.fixed, k.fixed == 1 ? "" : "s");
    }
    if (k.seen || k.unfixable)
        json_array_append_new(r->known,
                              json_pack("{s:s,s:s,s:I,s:b,s:I,s:s?,s:s?}", "signature", f->sig,
                                        "type", f->type, "seen", (json_int_t)k.seen, "unfixable",
                                        k.unfixable, "fixed", (json_int_t)k.fixed, "fixed_by",
                                        k.fixed_by, "note", k.note));
    failmem_known_release(&k);
    return note;
}

static bool crashed(const struct exec_record *rec)
{
    return rec->state == STATE_LOST &&
           (rec->status == EXEC_CRASHED || rec->status == EXEC_SANDBOX_ERROR);
}

/* Updates the retry state after a failed execution; returns a note for the model. */
static char *after_failure(struct run *r, const struct exec_record *rec, const char *code,
                           const char *tool)
{
    struct failure f;
    if (!failure_from_record(rec, &f))
        return NULL;
    r->failures_in_row++;
    r->crashes_in_row = crashed(rec) ? r->crashes_in_row + 1 : 0;
    free(r->last_code);
    r->last_code = xstrdup(code);
    /* A static name: tool points into the model's reply, which is freed after the step. */
    r->last_tool = !strcmp(tool, "run_shell") ? "run_shell" : "run_python";
    free(r->last_error);
    r->last_error = xasprintf("%s: %s", f.type, f.raw);
    if (!strcmp(f.type, "ModuleNotFoundError")) {
        const char *q = strchr(f.raw, '\'');
        free(r->missing_module);
        r->missing_module = q ? xstrndup(q + 1, strcspn(q + 1, "'.")) : NULL;
    }
    char *note = remember_failure(r, rec, &f);
    char *weak_notice = NULL;
    if (!r->weak && (rec->status == EXEC_SANDBOX_ERROR || r->crashes_in_row >= CRASHES_FOR_WEAK)) {
        _cleanup_free_ char *why =
            rec->status == EXEC_SANDBOX_ERROR
                ? xasprintf("%s", rec->message ? rec->message : "sandbox error")
                : xasprintf("the interpreter crashed %u times in a row", r->crashes_in_row);
        weak_notice = sandbox_cannot_serve(r, why);
    } else if (!strcmp(f.sig, r->last_sig)) {
        run_stop(r, r->retries_skipped ? STOP_UNFIXABLE : STOP_NO_PROGRESS,
                 "the same error twice in a row (%s), so retrying stopped early", r->last_error);
    } else if (r->failures_in_row >= r->o.max_retries && r->retries_skipped) {
        run_stop(r, STOP_UNFIXABLE,
                 "an error that cannot be fixed here skipped the retries, "
                 "and the attempt after it failed too (the last: %.300s)",
                 r->last_error);
    } else if (r->failures_in_row >= r->o.max_retries) {
        run_stop(r, STOP_RETRIES, "%u failed executions in a row (the last: %.300s)",
                 r->failures_in_row, r->last_error);
    }
    snprintf(r->last_sig, sizeof(r->last_sig), "%s", r->weak && weak_notice ? "" : f.sig);
    snprintf(r->fix_sig, sizeof(r->fix_sig), "%s", f.sig);
    json_t *last = json_array_get(r->attempts, json_array_size(r->attempts) - 1);
    json_object_set_new(last, "signature", json_string(f.sig));
    failure_release(&f);
    if (weak_notice) {
        char *both = xasprintf("%s%s%s", note ? note : "", note ? "\n" : "", weak_notice);
        free(note);
        free(weak_notice);
        note = both;
    }
    return note;
}

static void after_success(struct run *r, const char *tool)
{
    r->failures_in_row = 0;
    r->crashes_in_row = 0;
    r->last_sig[0] = '\0';
    if (r->fix_sig[0] && r->o.data_dir && !r->o.no_memory &&
        failmem_fixed(r->o.data_dir, r->env.key, r->fingerprint, r->fix_sig, tool) < 0)
        log_warn("msg=\"failure memory unavailable\" error=%s", log_quote(err_msg()));
    r->fix_sig[0] = '\0';
}

static void log_sandbox(struct run *r, const struct exec_record *rec)
{
    if (!rec->message && rec->status == EXEC_OK && !rec->limits_degraded)
        return;
    size_t n;
    _cleanup_free_ char *err = outcap_render(&rec->err, &n);
    _cleanup_free_ char *tail = clip_text(err, 0, 1000);
    json_array_append_new(r->sandbox_log,
                          json_pack("{s:i,s:s,s:s?,s:s,s:b,s:b}", "step", (int)r->steps, "status",
                                    exec_status_name(rec->status), "message", rec->message,
                                    "stderr_tail", tail, "state_lost", rec->state == STATE_LOST,
                                    "limits_degraded", rec->limits_degraded));
}

/* The time limit of the next execution: the session's (in weak mode, the one the session
 * was asked for), cut to what is left of the run's wall-time budget. */
static uint64_t execution_timeout(struct run *r)
{
    uint64_t t = 0;
    if (!r->weak)
        t = session_options(r->s)->timeout_ms;
    else if (r->o.session_opts)
        t = r->o.session_opts->timeout_ms;
    if (!t)
        t = DEFAULT_TIMEOUT_MS;
    if (r->o.max_time_ms) {
        /* An execution never outlives the run's wall-time budget. */
        double left = (double)r->o.max_time_ms - elapsed_ms(r);
        t = left < 1000 ? 1000 : MIN(t, (uint64_t)left);
    }
    return t;
}

/* A step's stdout and stderr as they come, as "output" events, for a client that shows the
 * running step (the web console); past LIVE_OUTPUT_MAX bytes the rest is only in the
 * observation. */
struct live_output {
    struct run *r;
    size_t sent;
};

static void live_output(void *ctx, const struct exec_event *ev)
{
    struct live_output *lo = ctx;
    if ((ev->type != EV_STDOUT && ev->type != EV_STDERR) || lo->sent >= LIVE_OUTPUT_MAX)
        return;
    size_t len = MIN(ev->len, LIVE_OUTPUT_MAX - lo->sent), n;
    lo->sent += len;
    _cleanup_free_ char *text = utf8_sanitize(ev->data, len, &n);
    run_emit(lo->r,
             json_pack("{s:s,s:i,s:s,s:s%}", "type", "output", "step", (int)lo->r->steps, "stream",
                       ev->type == EV_STDOUT ? "stdout" : "stderr", "data", text, n));
}

static int execute(struct run *r, const char *code, const char *lang, struct exec_record *rec)
{
    uint64_t timeout_ms = execution_timeout(r);
    if (r->weak)
        return weak_run(r->host, &r->o, code, timeout_ms, rec);
    struct exec_request req = {.code = code,
                               .lang = lang,
                               .timeout_ms = timeout_ms,
                               .cancel_fd = r->o.cancel.fd,
                               .cancel_events = r->o.cancel.events};
    struct live_output lo = {.r = r};
    struct exec_sink sink = {.fn = live_output, .ctx = &lo};
    /* A durable execution, as every surface's: it waits its turn in the session's queue and
     * is listed with its events (GET /v1/sessions/{id}/executions) while the run goes on. */
    struct execution *x = NULL;
    int rc = session_submit(NULL, r->s, &req, &x);
    if (rc == 0) {
        execution_run(x, r->ev && r->ev->fn ? &sink : NULL);
        const struct exec_record *done = execution_record(x);
        const char *why = NULL;
        if (done)
            exec_record_copy(rec, done);
        else
            rc = err_set(-execution_failure(x, &why), "%s", why ? why : "the cell did not run");
        execution_unref(x);
    }
    if (rc < 0) {
        rec->status = EXEC_SANDBOX_ERROR;
        rec->state = STATE_LOST;
        rec->message = xstrdup(err_msg());
    }
    return 0;
}

/* After a failed Python cell, before the repair: the session goes back to its state before
 * that cell (session_undo), so a cell that died half-way through changing its data does not
 * poison the retry. Returns note with what happened added for the model (note taken). */
static char *take_back(struct run *r, char *note)
{
    if (!session_options(r->s)->history)
        return note; /* a session the caller made without a history */
    json_t *rep = NULL;
    const char *said;
    if (session_undo(r->s, 0, &rep) < 0) {
        log_info("msg=\"the failed cell could not be undone\" error=%s", log_quote(err_msg()));
        return note;
    }
    json_t *files = json_object_get(rep, "files");
    if (json_is_false(json_object_get(files, "kept")))
        said = "its variables and imports are as they were before the failed cell (files it "
               "wrote stay as it left them), so the fix starts from there: include whatever "
               "the failed cell did before the error that is still needed";
    else
        said = "its variables, imports and files are as they were before the failed cell, so "
               "the fix starts from there: include whatever the failed cell did before the "
               "error that is still needed";
    json_t *last = json_array_get(r->attempts, json_array_size(r->attempts) - 1);
    json_object_set_new(last, "undone", json_true());
    json_decref(rep);
    run_emit(r, json_pack("{s:s,s:i}", "type", "undone", "step", (int)r->steps));
    char *both = xasprintf("%s%s[runcell] the session was taken back: %s.", note ? note : "",
                           note ? "\n" : "", said);
    free(note);
    return both;
}

static void run_call(struct run *r, const struct llm_tool_call *tc, json_t *images)
{
    const char *lang = NULL;
    _cleanup_free_ char *code = call_code(r, tc, &lang);
    if (!code)
        return;
    run_emit(r, json_pack("{s:s,s:i,s:s,s:s,s:b}", "type", "tool_call", "step", (int)r->steps,
                          "tool", tc->name, "code", code, "weak", r->weak));
    struct exec_record rec;
    exec_record_init(&rec, DEFAULT_OUTPUT_CAP);
    bool weak_run_now = r->weak;
    if (execute(r, code, lang, &rec) < 0) {
        rec.status = EXEC_SANDBOX_ERROR;
        rec.message = xstrdup(err_msg());
    }
    _cleanup_strv_ char **saved =
        weak_run_now ? NULL : save_images(session_workspace(r->s), &rec, images);
    for (char **f = rec.copied_out; f && *f; f++)
        json_array_append_new(r->weak_files, json_string(*f));
    json_array_append_new(
        r->attempts, json_pack("{s:i,s:s,s:s,s:s,s:O,s:b,s:f,s:s?}", "step", (int)r->steps, "tool",
                               tc->name, "code", code, "status", exec_status_name(rec.status),
                               "error", rec.error ? rec.error : json_null(), "weak", weak_run_now,
                               "wall_ms", rec.wall_ms, "message", rec.message));
    log_sandbox(r, &rec);
    _cleanup_free_ char *note = NULL;
    if (rec.status == EXEC_OK)
        after_success(r, tc->name);
    else
        note = after_failure(r, &rec, code, tc->name);
    if (rec.status != EXEC_OK && !weak_run_now && r->s && r->stop == STOP_RUNNING &&
        !strcmp(tc->name, "run_python"))
        note = take_back(r, note);
    _cleanup_free_ char *text = observation_text(&rec, saved, note);
    add_tool_message(r, tc->id, text);
    json_t *last = json_array_get(r->attempts, json_array_size(r->attempts) - 1);
    json_object_set_new(last, "observation", json_string(text));
    if (strlen(text) > ATTEMPT_OBSERVATION) {
        _cleanup_free_ char *clipped =
            clip_text(text, ATTEMPT_OBSERVATION / 2, ATTEMPT_OBSERVATION / 4);
        json_object_set_new(last, "observation", json_string(clipped));
    }
    run_emit(r, json_pack("{s:s,s:i,s:s,s:s,s:s,s:b}", "type", "observation", "step", (int)r->steps,
                          "tool", tc->name, "status", exec_status_name(rec.status), "observation",
                          text, "weak", weak_run_now));
    exec_record_release(&rec);
}

/* ---- one step: a model turn and its tool calls ---- */

static json_t *assistant_message(const struct llm_reply *rep)
{
    json_t *m = json_pack("{s:s,s:s?}", "role", "assistant", "content", rep->content);
    if (!rep->content)
        json_object_set_new(m, "content", json_null());
    if (!rep->n_calls)
        return m;
    json_t *calls = json_array();
    for (size_t i = 0; i < rep->n_calls; i++)
        json_array_append_new(calls,
                              json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", rep->calls[i].id, "type",
                                        "function", "function", "name", rep->calls[i].name,
                                        "arguments", rep->calls[i].arguments));
    json_object_set_new(m, "tool_calls", calls);
    return m;
}

static bool budget_left(struct run *r)
{
    if (agent_cancelled(&r->o.cancel))
        run_stop(r, STOP_CANCELLED, "the run was cancelled");
    else if (r->steps >= r->o.max_steps)
        run_stop(r, STOP_MAX_STEPS, "the model used all %u steps without a final answer",
                 r->o.max_steps);
    else if (r->o.max_time_ms && elapsed_ms(r) >= (double)r->o.max_time_ms)
        run_stop(r, STOP_MAX_TIME, "the run used its %.3g s of wall time",
                 (double)r->o.max_time_ms / 1000.0);
    else if (r->o.max_tokens && r->usage_seen && r->total_tokens >= r->o.max_tokens)
        run_stop(r, STOP_MAX_TOKENS, "the run used %llu tokens, its budget is %llu",
                 (unsigned long long)r->total_tokens, (unsigned long long)r->o.max_tokens);
    return r->stop == STOP_RUNNING;
}

static void add_images_message(struct run *r, json_t *images)
{
    if (!json_array_size(images))
        return;
    json_t *parts = json_array();
    json_array_append_new(parts, json_pack("{s:s,s:s}", "type", "text", "text",
                                           "[runcell] the images of the last step"));
    size_t i;
    json_t *img;
    json_array_foreach(images, i, img)
    {
        _cleanup_free_ char *url =
            xasprintf("data:%s;base64,%s", json_string_value(json_object_get(img, "mime")),
                      json_string_value(json_object_get(img, "data")));
        json_array_append_new(
            parts, json_pack("{s:s,s:{s:s}}", "type", "image_url", "image_url", "url", url));
    }
    json_array_append_new(r->messages, json_pack("{s:s,s:o}", "role", "user", "content", parts));
}

static void account(struct run *r, const struct llm_reply *rep)
{
    if (!rep->has_usage)
        return;
    r->usage_seen = true;
    r->prompt_tokens += rep->prompt_tokens;
    r->completion_tokens += rep->completion_tokens;
    r->total_tokens += rep->total_tokens;
}

static void step(struct run *r)
{
    struct llm_reply rep;
    r->steps++;
    int rc = llm_chat(r->llm, r->messages, r->tools, &r->o.cancel, &rep);
    if (rc < 0) {
        _cleanup_free_ char *msg = xstrdup(err_msg());
        llm_client_redact(r->llm, msg);
        if (rc == -ECANCELED)
            run_stop(r, STOP_CANCELLED, "the run was cancelled");
        else if (rc == -ECONNREFUSED)
            run_stop(r, STOP_MODEL_UNREACHABLE, "%s", msg);
        else if (rc == -EACCES || rc == -ENOENT)
            run_stop(r, STOP_MODEL_MISCONFIGURED, "%s", msg);
        else
            run_stop(r, STOP_MODEL_ERROR, "%s", msg);
        return;
    }
    account(r, &rep);
    json_array_append_new(r->messages, assistant_message(&rep));
    run_emit(r,
             json_pack("{s:s,s:i,s:s?,s:i,s:s?,s:O?,s:i}", "type", "model", "step", (int)r->steps,
                       "content", rep.content, "tool_calls", (int)rep.n_calls, "finish_reason",
                       rep.finish_reason, "notes", rep.notes, "attempts", (int)rep.attempts));
    if (!rep.n_calls) {
        r->answer = xstrdup(rep.content ? rep.content : "");
        run_stop(r, STOP_ANSWERED, "the model answered");
        llm_reply_release(&rep);
        return;
    }
    json_t *images = r->o.vision ? json_array() : NULL;
    for (size_t i = 0; i < rep.n_calls; i++) {
        if (r->stop != STOP_RUNNING) {
            /* Every call needs its reply for the transcript to stay well-formed. */
            add_tool_message(r, rep.calls[i].id, "not run: the run ended before this call");
            continue;
        }
        run_call(r, &rep.calls[i], images);
    }
    add_images_message(r, images);
    json_decref(images);
    llm_reply_release(&rep);
}

/* ---- the run ---- */

static int fill_options(struct agent_options *o)
{
    if (!o->task || !*o->task)
        return err_set(EINVAL, "no task: say what the agent should do");
    if (!o->max_steps)
        o->max_steps = AGENT_DEFAULT_MAX_STEPS;
    if (!o->max_retries)
        o->max_retries = AGENT_DEFAULT_MAX_RETRIES;
    if (!o->fallbacks_set) {
        o->n_fallbacks = FALLBACK_COUNT;
        for (size_t i = 0; i < FALLBACK_COUNT; i++)
            o->fallbacks[i] = (enum agent_fallback)i;
    }
    for (size_t i = 0; i < o->n_files; i++)
        if (!path_is_safe_relative(o->files[i].dest))
            return err_set(EINVAL,
                           "bad file name '%s': use a relative path inside the "
                           "workspace, without '..'",
                           o->files[i].dest);
    return 0;
}

static int prepare_workspace(struct run *r)
{
    if (!r->s)
        return 0;
    struct workspace *ws = session_workspace(r->s);
    for (size_t i = 0; i < r->o.n_files; i++)
        if (workspace_copy_in(ws, r->o.files[i].host_path, r->o.files[i].dest) < 0)
            return -EINVAL;
    /* Saved as what was there before the first cell: its undo keeps them. */
    if (r->o.n_files && session_save_files(r->s) < 0)
        log_warn("msg=\"the task's files are not saved\" error=%s", log_quote(err_msg()));
    workspace_scan(ws, &r->before);
    return 0;
}

static void start_messages(struct run *r, const char *session_error)
{
    _cleanup_free_ char *sys =
        agent_system_prompt(&r->env, &r->o, r->s ? session_workspace(r->s) : NULL, r->weak);
    r->messages = json_array();
    json_array_append_new(r->messages, json_pack("{s:s,s:s}", "role", "system", "content", sys));
    if (r->weak) {
        _cleanup_free_ char *notice = agent_weak_notice(session_error);
        _cleanup_free_ char *user = xasprintf("%s\n\n%s", r->o.task, notice);
        json_array_append_new(r->messages, json_pack("{s:s,s:s}", "role", "user", "content", user));
    } else {
        json_array_append_new(r->messages,
                              json_pack("{s:s,s:s}", "role", "user", "content", r->o.task));
    }
}

/* The failure memory's word on this task before it runs. */
static void check_history(struct run *r)
{
    struct task_history h;
    if (!r->o.data_dir || r->o.no_memory)
        return;
    if (task_history_get(r->o.data_dir, r->env.key, r->fingerprint, &h) < 0) {
        log_warn("msg=\"failure memory unavailable\" error=%s", log_quote(err_msg()));
        return;
    }
    if (h.doomed && !r->o.retry_doomed) {
        r->doomed = true;
        r->last_code = h.last_code ? xstrdup(h.last_code) : NULL;
        r->last_error = h.last_error ? xstrdup(h.last_error) : NULL;
        r->last_tool = "run_python";
        run_stop(r, STOP_DOOMED,
                 "this task exhausted its retries %ld time%s before here (last "
                 "%s: %s), so it goes straight to the fallbacks (--retry-doomed runs it anyway)",
                 h.exhausted, h.exhausted == 1 ? "" : "s", h.last_seen ? h.last_seen : "?",
                 h.last_reason ? h.last_reason : "?");
    }
    task_history_release(&h);
}

/* The model endpoint is wrong, down or refuses the key or model: a problem of the set-up,
 * not of the task. No fallback can help (each needs the model, or hands back code that never
 * ran), a person reviewing the task would find nothing to review, and the failure memory
 * learns nothing about the task. */
static bool model_config_error(enum stop_reason s)
{
    return s == STOP_MODEL_UNREACHABLE || s == STOP_MODEL_MISCONFIGURED;
}

static void say_config_error(struct run *r)
{
    free(r->answer);
    r->answer = xasprintf("runcell could not complete the task: %s. Nothing was filed for "
                          "review: the model's set-up needs fixing, not the task.",
                          r->stop_detail ? r->stop_detail : stop_reason_name(r->stop));
}

/* The task ran out of retries: the next run of it goes straight to the fallbacks. A sandbox
 * that could not serve (STOP_SANDBOX) says nothing about the task, so it does not count. */
static bool exhausted(enum stop_reason s)
{
    return s == STOP_RETRIES || s == STOP_NO_PROGRESS || s == STOP_UNFIXABLE;
}

static void remember_task(struct run *r)
{
    if (!r->o.data_dir || r->o.no_memory || r->doomed || r->stop == STOP_CANCELLED ||
        model_config_error(r->stop))
        return;
    if (task_history_put(r->o.data_dir, r->env.key, r->fingerprint, stop_reason_name(r->stop),
                         exhausted(r->stop), r->last_code, r->last_error) < 0)
        log_warn("msg=\"failure memory unavailable\" error=%s", log_quote(err_msg()));
}

/* Files the run produced: created or changed in the workspace, and weak-mode outputs. */
static json_t *produced_files(struct run *r)
{
    json_t *files = json_array();
    if (r->s) {
        struct ws_listing after;
        char **created = NULL, **modified = NULL, **deleted = NULL;
        if (workspace_scan(session_workspace(r->s), &after) == 0) {
            ws_listing_diff(&r->before, &after, &created, &modified, &deleted);
            for (int pass = 0; pass < 2; pass++)
                for (char **f = pass ? modified : created; *f; f++) {
                    if (r->o.out_dir &&
                        workspace_copy_out(session_workspace(r->s), *f, r->o.out_dir) < 0)
                        log_warn("msg=\"cannot copy out\" file=%s error=%s", log_quote(*f),
                                 log_quote(err_msg()));
                    json_array_append_new(files, json_string(*f));
                }
            ws_listing_release(&after);
        }
        strv_free(created);
        strv_free(modified);
        strv_free(deleted);
    }
    size_t i;
    json_t *f;
    json_array_foreach(r->weak_files, i, f) json_array_append(files, f);
    return files;
}

static void run_release(struct run *r)
{
    agent_env_release(&r->env);
    json_decref(r->messages);
    json_decref(r->tools);
    json_decref(r->attempts);
    json_decref(r->fallbacks);
    json_decref(r->sandbox_log);
    json_decref(r->known);
    json_decref(r->weak_files);
    ws_listing_release(&r->before);
    free(r->fingerprint);
    free(r->stop_detail);
    free(r->answer);
    free(r->last_code);
    free(r->last_error);
    free(r->missing_module);
    free(r->review_id);
}

int agent_run(struct sandbox_host *host, struct llm_client *llm, struct session *s,
              const struct agent_options *opts, const struct agent_events *ev, json_t **ret_outcome)
{
    struct run r = {.host = host, .llm = llm, .s = s, .o = *opts, .ev = ev, .t0 = now_ms_f()};
    int rc = fill_options(&r.o);
    if (rc < 0)
        return rc;
    if ((rc = prepare_workspace(&r)) < 0)
        return rc;
    agent_env_init(&r.env, s);
    r.fingerprint = task_fingerprint(r.o.task, r.o.files, r.o.n_files);
    r.attempts = json_array();
    r.fallbacks = json_array();
    r.sandbox_log = json_array();
    r.known = json_array();
    r.weak_files = json_array();
    run_emit(&r, json_pack("{s:s,s:s,s:s,s:s,s:b}", "type", "run", "task", r.o.task, "fingerprint",
                           r.fingerprint, "model", llm_client_model(llm), "weak", !s));
    check_history(&r);
    const char *why = opts->session_error ? opts->session_error : "the session could not start";
    if (r.stop == STOP_RUNNING && !s) {
        _cleanup_free_ char *msg = xasprintf("the stateful sandbox could not start: %s", why);
        free(sandbox_cannot_serve(&r, msg));
    }
    if (!r.tools) /* weak mode from the start has set its own */
        r.tools = agent_tools(r.weak);
    start_messages(&r, why);
    while (r.stop == STOP_RUNNING && budget_left(&r))
        step(&r);
    if (model_config_error(r.stop))
        say_config_error(&r);
    else if (r.stop != STOP_ANSWERED && r.stop != STOP_CANCELLED)
        run_fallbacks(&r);
    remember_task(&r);
    json_t *files = produced_files(&r);
    *ret_outcome = run_outcome(&r, files);
    run_release(&r);
    return 0;
}
