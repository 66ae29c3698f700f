/* fuzz-routes.c - a fuzz target for what the HTTP API makes of a request before any handler
 * runs (src/api): route matching on the decoded URL, and the JSON body of a session create
 * (or one-shot run) checked into session options. Anyone who can reach the port sends
 * these, with or without a token.
 *
 * The first line of the input is "METHOD URL"; the rest is the body. A route found must be
 * the method's (a GET route for HEAD), with a non-empty {id} of one segment and a non-empty {path};
 * none found leaves no parameters behind. Replies made while checking the body are held, as in the
 * body phase of a real request, and dropped.
 *
 * Built with libFuzzer by `make fuzz` and run by tests/fuzz/run; the ordinary build links
 * it with tests/fuzz/replay.c, which replays the corpora as a unit test. */
#include <string.h>

#include "api/api.h"
#include "e2b/e2b.h"
#include "fuzz.h"

static struct server_config cfg;
static struct server srv = {.cfg = &cfg};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    log_set_level(LOG_ERROR);
    server_limits_fill_defaults(&cfg.limits);
    return 0;
}

static void check_route(const struct route *r, const char *method, char *params[2])
{
    if (!r) {
        if (params[0] || params[1])
            abort();
        return;
    }
    /* HEAD takes the GET routes */
    if (strcmp(r->method, method) && !(!strcmp(method, "HEAD") && !strcmp(r->method, "GET")))
        abort();
    bool has_id = strstr(r->pattern, "{id}"), has_path = strstr(r->pattern, "{path}");
    if (has_id != (params[0] != NULL) || (has_id && (!*params[0] || strchr(params[0], '/'))))
        abort();
    if (has_path != (params[1] != NULL) || (has_path && !*params[1]))
        abort();
}

static void check_body(const char *body, size_t n)
{
    struct request *rq = xcalloc(1, sizeof(*rq));
    rq->srv = &srv;
    rq->phase = PHASE_BODY;
    buf_init(&rq->body, cfg.limits.max_body_bytes);
    buf_append(&rq->body, body, n);
    json_t *j = body_json(rq);
    struct session_opts o;
    if (j && !session_opts_from_json(rq, j, &o) && !rq->held)
        abort(); /* a refusal always replies */
    json_decref(j);
    if (rq->held)
        MHD_destroy_response(rq->held);
    buf_release(&rq->body);
    net_policy_free(rq->net);
    strv_free(rq->packages);
    free(rq);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p = (const char *)data, *end = p + size;
    const char *nl = memchr(p, '\n', size);
    const char *line_end = nl ? nl : end;
    const char *sp = memchr(p, ' ', (size_t)(line_end - p));
    if (!sp)
        return 0;
    /* libmicrohttpd hands over NUL-terminated strings: a NUL ends them. */
    char *method = xstrndup(p, (size_t)(sp - p));
    char *url = xstrndup(sp + 1, (size_t)(line_end - sp - 1));
    char *params[2] = {NULL, NULL};
    struct buf allow;
    buf_init(&allow, 0);
    const struct surface *sf;
    if (!srv.e2b)
        srv.e2b = e2b_new(); /* E2B's routes too, as with --e2b */
    const struct route *r = route_match(&srv, url, method, params, &sf, &allow);
    check_route(r, method, params);
    if (r && (r->handle == h_session_create || r->handle == h_oneshot) && nl)
        check_body(nl + 1, (size_t)(end - nl - 1));
    free(params[0]);
    free(params[1]);
    buf_release(&allow);
    free(method);
    free(url);
    return 0;
}
