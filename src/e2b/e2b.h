/* e2b.h - E2B-compatible routes (`runcell serve --e2b`): E2B's control plane, its code
 * interpreter and its envd, served on runcell's own listener over runcell's sessions. The
 * contract between this surface and the server (server.c) only; docs/E2B.md says what a
 * user of E2B's SDKs sees. */
#ifndef RUNCELL_E2B_H
#define RUNCELL_E2B_H

struct server;
struct e2b;

/* E2B's routes, for the server's table of surfaces (only with --e2b). */
extern const struct surface e2b_surface;

/* The registry of E2B sandboxes (access tokens, templates, metadata, contexts). */
struct e2b *e2b_new(void);
/* NULL is a no-op; after the HTTP daemon has stopped. */
void e2b_free(struct e2b *e);
/* A session left the table: its sandbox's box, if it is one, goes (ctx: the struct e2b). */
void e2b_session_gone(void *ctx, const char *id);

#endif
