/* fallback.c - what happens when a run fails: the hand-back answer (the last code, the
 * error, how to run it at home), the review incident (SQLite and an optional webhook), and
 * the outcome record every run ends with. */
#include "agent/run-int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static const char *const fallback_names[] = {
    [FALLBACK_WEAK] = "weak", [FALLBACK_HANDBACK] = "handback", [FALLBACK_REVIEW] = "review"};

const char *agent_fallback_name(enum agent_fallback f)
{
    return (size_t)f < ARRAY_SIZE(fallback_names) ? fallback_names[f] : "?";
}

int agent_parse_fallbacks(const char *s, enum agent_fallback *ret, size_t *ret_n)
{
    size_t n = 0;
    if (!strcmp(s, "none")) {
        *ret_n = 0;
        return 0;
    }
    _cleanup_free_ char *copy = xstrdup(s);
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        size_t f = 0;
        while (f < FALLBACK_COUNT && strcmp(tok, fallback_names[f]))
            f++;
        if (f == FALLBACK_COUNT)
            return err_set(EINVAL,
                           "unknown fallback '%s': use weak, handback and review, "
                           "comma-separated, in the order wanted (or none)",
                           tok);
        for (size_t i = 0; i < n; i++)
            if (ret[i] == (enum agent_fallback)f)
                return err_set(EINVAL, "fallback '%s' is named twice", tok);
        ret[n++] = (enum agent_fallback)f;
    }
    if (!n)
        return err_set(EINVAL, "no fallbacks named; use weak, handback, review or none");
    *ret_n = n;
    return 0;
}

/* ---- hand-back ---- */

static void input_names(struct buf *b, const struct run *r)
{
    for (size_t i = 0; i < r->o.n_files; i++)
        buf_printf(b, "%s%s", i ? ", " : "", r->o.files[i].dest);
}

static char *handback_text(const struct run *r)
{
    struct buf b;
    bool shell = r->last_tool && !strcmp(r->last_tool, "run_shell");
    buf_init(&b, 0);
    buf_printf(&b, "runcell could not complete the task: %s.\n",
               r->stop_detail ? r->stop_detail : stop_reason_name(r->stop));
    if (!r->last_code) {
        buf_printf(&b, "\nNo code was run, so there is nothing to hand back. Try again later, "
                       "or with another model or more budget (--max-steps, --max-retries).\n");
        return buf_detach(&b, NULL);
    }
    buf_printf(&b, "\nThe last code %s:\n\n```%s\n%s%s```\n",
               r->doomed ? "tried (in an "
                           "earlier run)"
                         : "run",
               shell ? "sh" : "python", r->last_code,
               r->last_code[0] && r->last_code[strlen(r->last_code) - 1] == '\n' ? "" : "\n");
    if (r->last_error)
        buf_printf(&b, "\nIt failed with:\n\n    %s\n", r->last_error);
    buf_printf(&b, "\nTo run it on your own machine:\n1. Save the code as %s",
               shell ? "task.sh" : "task.py");
    if (r->o.n_files) {
        buf_printf(&b, " in a directory together with the input files (");
        input_names(&b, r);
        buf_printf(&b, "), and cd there");
    }
    buf_printf(&b, ".\n");
    if (!shell)
        buf_printf(&b, "2. Use Python %s or newer%s%s%s.\n", r->env.python_version,
                   r->missing_module ? "; install what it imports: python3 -m pip install " : "",
                   r->missing_module ? r->missing_module : "",
                   r->missing_module ? " (this sandbox has no network to do it)" : "");
    buf_printf(&b, "%s Run it: %s\n", shell ? "2." : "3.",
               shell ? "bash task.sh" : "python3 task.py");
    buf_printf(&b, "%s Fix what the error above names, and run it again.\n", shell ? "3." : "4.");
    return buf_detach(&b, NULL);
}

/* ---- review ---- */

static json_t *distinct_errors(const struct run *r)
{
    json_t *errors = json_array(), *seen = json_object();
    size_t i;
    json_t *a;
    json_array_foreach(r->attempts, i, a)
    {
        const char *sig = json_string_value(json_object_get(a, "signature"));
        json_t *err = json_object_get(a, "error");
        if (!sig && !json_is_string(err))
            continue;
        const char *key = sig ? sig : json_string_value(err);
        json_t *count = json_object_get(seen, key);
        if (count) {
            json_integer_set(json_object_get(count, "count"),
                             json_integer_value(json_object_get(count, "count")) + 1);
            continue;
        }
        json_t *e = json_pack("{s:s,s:O,s:i,s:i}", "signature", key, "error", err, "first_step",
                              (int)json_integer_value(json_object_get(a, "step")), "count", 1);
        json_object_set(seen, key, e);
        json_array_append_new(errors, e);
    }
    json_decref(seen);
    return errors;
}

static json_t *options_json(const struct run *r)
{
    json_t *fb = json_array();
    for (size_t i = 0; i < r->o.n_fallbacks; i++)
        json_array_append_new(fb, json_string(agent_fallback_name(r->o.fallbacks[i])));
    return json_pack("{s:i,s:i,s:f,s:I,s:b,s:o,s:b}", "max_steps", (int)r->o.max_steps,
                     "max_retries", (int)r->o.max_retries, "max_time_s",
                     (double)r->o.max_time_ms / 1000.0, "max_tokens", (json_int_t)r->o.max_tokens,
                     "vision", r->o.vision, "fallbacks", fb, "retry_doomed", r->o.retry_doomed);
}

static json_t *incident(const struct run *r)
{
    json_t *inputs = json_array();
    for (size_t i = 0; i < r->o.n_files; i++)
        json_array_append_new(inputs, json_string(r->o.files[i].dest));
    return json_pack("{s:s,s:s,s:s?,s:s,s:s,s:s,s:s,s:b,s:i,s:O,s:O,s:o,s:O,s:o,s:O,s:o,"
                     "s:o,s:s?,s:s?}",
                     "task", r->o.task, "reason", stop_reason_name(r->stop), "reason_text",
                     r->stop_detail, "fingerprint", r->fingerprint, "model",
                     llm_client_model(r->llm), "base_url", llm_client_base_url(r->llm), "env",
                     r->env.key, "weak_mode", r->weak, "steps", (int)r->steps, "transcript",
                     r->messages, "attempts", r->attempts, "errors", distinct_errors(r),
                     "sandbox_log", r->sandbox_log, "fallbacks", json_deep_copy(r->fallbacks),
                     "memory", r->known, "options", options_json(r), "input_files", inputs,
                     "answer", r->answer, "last_error", r->last_error);
}

static void run_review(struct run *r)
{
    if (!r->o.data_dir) {
        run_fallback(r, FALLBACK_REVIEW, false, "no data directory to keep the review queue in");
        return;
    }
    json_t *inc = incident(r);
    /* The record says which fallbacks ran, this one included. */
    json_array_append_new(
        json_object_get(inc, "fallbacks"),
        json_pack("{s:s,s:b,s:s}", "name", "review", "ran", 1, "detail", "this incident"));
    char *id = NULL;
    if (review_create(r->o.data_dir, inc, &id) < 0) {
        _cleanup_free_ char *why = xasprintf("cannot store the incident: %s", err_msg());
        run_fallback(r, FALLBACK_REVIEW, false, why);
        json_decref(inc);
        return;
    }
    r->review_id = id;
    _cleanup_free_ char *detail = xasprintf("incident %s is in the review queue ('runcell "
                                            "review show %s')",
                                            id, id);
    if (r->o.webhook_url) {
        int status = webhook_post(r->o.webhook_url, inc);
        free(detail);
        detail = status < 0 ? xasprintf("incident %s is in the review queue; the webhook "
                                        "failed: %s",
                                        id, err_msg())
                            : xasprintf("incident %s is in the review queue and was POSTed to "
                                        "the webhook (HTTP %d)",
                                        id, status);
    }
    json_decref(inc);
    run_fallback(r, FALLBACK_REVIEW, true, detail);
    json_t *last = json_array_get(r->fallbacks, json_array_size(r->fallbacks) - 1);
    json_object_set_new(last, "id", json_string(id));
}

void run_fallbacks(struct run *r)
{
    for (size_t i = 0; i < r->o.n_fallbacks; i++) {
        switch (r->o.fallbacks[i]) {
        case FALLBACK_WEAK:
            if (!r->weak)
                run_fallback(
                    r, FALLBACK_WEAK, false,
                    r->stop == STOP_DOOMED ? "not needed: the task failed before, not the sandbox"
                    : r->stop == STOP_MODEL_ERROR
                        ? "not needed: the sandbox was serving; the model failed"
                    : !r->last_code ? "not needed: the sandbox was serving; no code ran"
                                    : "not needed: the sandbox was serving; the code failed");
            break;
        case FALLBACK_HANDBACK:
            free(r->answer);
            r->answer = handback_text(r);
            run_fallback(r, FALLBACK_HANDBACK, true,
                         r->last_code
                             ? "the answer hands back the last code, its error and how to run it"
                             : "the answer says why; there was no code to hand back");
            break;
        case FALLBACK_REVIEW:
            run_review(r);
            break;
        case FALLBACK_COUNT:
            break;
        }
    }
    if (!r->answer)
        r->answer = xasprintf("runcell could not complete the task: %s.",
                              r->stop_detail ? r->stop_detail : stop_reason_name(r->stop));
}

json_t *run_outcome(struct run *r, json_t *files)
{
    const char *outcome = r->stop == STOP_ANSWERED    ? "answered"
                          : r->stop == STOP_CANCELLED ? "cancelled"
                                                      : "failed";
    json_t *usage = r->usage_seen
                        ? json_pack("{s:I,s:I,s:I}", "prompt_tokens", (json_int_t)r->prompt_tokens,
                                    "completion_tokens", (json_int_t)r->completion_tokens,
                                    "total_tokens", (json_int_t)r->total_tokens)
                        : json_null();
    return json_pack(
        "{s:s,s:s,s:s,s:s?,s:s,s:i,s:b,s:b,s:O,s:O,s:o,s:s?,s:o,s:O,s:s,s:s,"
        "s:f,s:O}",
        "type", "outcome", "outcome", outcome, "reason", stop_reason_name(r->stop), "reason_text",
        r->stop_detail, "answer", r->answer ? r->answer : "", "steps", (int)r->steps, "weak_mode",
        r->weak, "retries_skipped", r->retries_skipped || r->doomed, "attempts", r->attempts,
        "fallbacks", r->fallbacks, "files", files, "review_id", r->review_id, "usage", usage,
        "memory", r->known, "fingerprint", r->fingerprint, "model", llm_client_model(r->llm),
        "wall_ms", now_ms_f() - r->t0, "transcript", r->messages);
}
