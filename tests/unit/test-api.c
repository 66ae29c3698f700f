/* test-api.c - unit tests for src/api without a listener: route matching (parameters, HEAD
 * on GET routes, the Allow list of a known path) and the one mapping of internal errors to
 * HTTP error codes. Requests over real HTTP are tests/integration/test_http.py's. */
#include <errno.h>
#include <string.h>

#include "api/api.h"
#include "e2b/e2b.h"
#include "runner.h"

static const struct route *match(const char *url, const char *method, char *params[2],
                                 struct buf *allow)
{
    params[0] = params[1] = NULL;
    buf_init(allow, 4096);
    static struct server srv;
    const struct surface *sf;
    if (!srv.e2b)
        srv.e2b = e2b_new(); /* E2B's routes too, as with --e2b */
    return route_match(&srv, url, method, params, &sf, allow);
}

static void release(char *params[2], struct buf *allow)
{
    free(params[0]);
    free(params[1]);
    buf_release(allow);
}

TEST(a_route_takes_its_id_and_path)
{
    char *p[2];
    struct buf allow;
    const struct route *r = match("/v1/sessions/abc123/files/out/deep/r.csv", "GET", p, &allow);
    CHECK(r && r->handle == h_file_get);
    CHECK_STREQ(p[0], "abc123");
    CHECK_STREQ(p[1], "out/deep/r.csv");
    release(p, &allow);
}

TEST(head_takes_the_get_route)
{
    char *p[2];
    struct buf allow;
    const struct route *r = match("/healthz", "HEAD", p, &allow);
    CHECK(r && r->handle == h_healthz && !strcmp(r->method, "GET"));
    release(p, &allow);
}

TEST(a_known_path_with_another_method_lists_what_it_takes)
{
    char *p[2];
    struct buf allow;
    CHECK(match("/v1/sessions/abc", "PATCH", p, &allow) == NULL);
    CHECK(!p[0] && !p[1]);
    CHECK(strstr(allow.data, "GET, HEAD") && strstr(allow.data, "DELETE"));
    release(p, &allow);
}

TEST(an_unknown_path_has_no_route_and_no_methods)
{
    const char *urls[] = {"/v1/nothing", "/v1/sessions/", "/v1/sessions/a/b", "", "/healthz/x"};
    for (size_t i = 0; i < ARRAY_SIZE(urls); i++) {
        char *p[2];
        struct buf allow;
        CHECK(match(urls[i], "GET", p, &allow) == NULL);
        CHECK(allow.len == 0);
        release(p, &allow);
    }
}

TEST(errors_map_to_one_status_and_code_each)
{
    static const struct {
        int err;
        const char *code;
    } cases[] = {
        {-EINVAL, "bad_request"}, {-ELOOP, "bad_path"},  {-EISDIR, "bad_path"},
        {-ENOENT, "not_found"},   {-ETIME, "expired"},   {-EBUSY, "busy"},
        {-ENOSPC, "too_large"},   {-E2BIG, "too_large"}, {-ESHUTDOWN, "shutting_down"},
        {-EIO, "sandbox_error"},  {-ENOMEM, "internal"},
    };
    for (size_t i = 0; i < ARRAY_SIZE(cases); i++)
        CHECK_STREQ(api_err_code(api_err_of(cases[i].err)), cases[i].code);
}

int main(int argc, char **argv)
{
    return run_tests(argc, argv);
}
