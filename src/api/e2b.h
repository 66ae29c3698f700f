/* e2b.h - E2B-compatible routes (`runcell serve --e2b`): E2B's control plane, its code
 * interpreter and its envd, served on runcell's own listener over runcell's sessions. The
 * contract between routes_e2b.c and the server (server.c) only; docs/E2B.md says what a
 * user of E2B's SDKs sees. */
#ifndef RUNCELL_API_E2B_H
#define RUNCELL_API_E2B_H

#include <jansson.h>
#include <microhttpd.h>
#include <stdbool.h>

struct request;
struct server;
struct e2b;

/* Route flags (beside api-int.h's): these routes authenticate as E2B's SDK does, not by
 * runcell's bearer token, and exist only with --e2b. */
#define ROUTE_E2B_API (1u << 8) /* control plane: X-API-KEY (or Bearer) is runcell's token */
#define ROUTE_E2B_BOX (1u << 9) /* a sandbox's ports: E2b-Sandbox-Id + X-Access-Token */
/* A sandbox route that E2B's SDK calls without its access token (the code interpreter's
 * /contexts): the sandbox id, 96 random bits, is the credential. */
#define ROUTE_E2B_BOX_ID (1u << 10)
#define ROUTE_E2B_ANY    (ROUTE_E2B_API | ROUTE_E2B_BOX | ROUTE_E2B_BOX_ID)

/* The registry of E2B sandboxes (access tokens, templates, metadata, contexts). */
struct e2b *e2b_new(void);
/* NULL is a no-op; after the HTTP daemon has stopped. */
void e2b_free(struct e2b *e);

/* Authenticates rq for its E2B route; false after replying (401 in E2B's shape, or 404 for a
 * sandbox that is not there). */
bool e2b_authorize(struct request *rq);

/* The body of an error that the server itself makes on an E2B route (401, 413, 429, 503...):
 * E2B's {code: STATUS, message}, or Connect's {code: "name", message} on its RPC routes. */
json_t *e2b_error_body(const struct request *rq, unsigned status, const char *msg, size_t n);

enum MHD_Result h_e2b_create(struct request *rq);
enum MHD_Result h_e2b_list(struct request *rq);
enum MHD_Result h_e2b_get(struct request *rq);
enum MHD_Result h_e2b_kill(struct request *rq);
enum MHD_Result h_e2b_timeout(struct request *rq);
enum MHD_Result h_e2b_connect(struct request *rq);
enum MHD_Result h_e2b_refused(struct request *rq);
enum MHD_Result h_e2b_health(struct request *rq);
enum MHD_Result h_e2b_execute(struct request *rq);
enum MHD_Result h_e2b_contexts_list(struct request *rq);
enum MHD_Result h_e2b_context_create(struct request *rq);
enum MHD_Result h_e2b_context_delete(struct request *rq);
enum MHD_Result h_e2b_context_restart(struct request *rq);
enum MHD_Result h_e2b_files_get(struct request *rq);
enum MHD_Result h_e2b_files_post(struct request *rq);
enum MHD_Result h_e2b_process_rpc(struct request *rq);
enum MHD_Result h_e2b_filesystem_rpc(struct request *rq);

#endif
