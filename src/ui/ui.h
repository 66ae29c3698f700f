/* ui.h - the web console's assets (src/ui/assets and the editor), built into the binary by
 * src/ui/embed.py: the contract routes.c serves them through. */
#ifndef RUNCELL_UI_H
#define RUNCELL_UI_H

#include <stddef.h>

struct ui_asset {
    const char *name; /* below /ui/, e.g. "app.js", "vendor/codemirror/codemirror.js" */
    const char *mime; /* Content-Type */
    const char *etag; /* strong, quoted: a hash of the bytes */
    const char *data; /* static, never freed */
    size_t size;
    const char *gz_etag; /* the gzip form (Content-Encoding: gzip), or all three NULL/0 */
    const char *gz_data;
    size_t gz_size;
};

/* The asset of that name, or NULL. */
const struct ui_asset *ui_asset_find(const char *name);

struct request;
struct server;
/* The console's routes (routes.c): / and /ui redirect to /ui/, which serves its files. */
extern const struct surface ui_surface;
/* Prints the console's login URL on stderr, once at start (docs/OPERATING.md). */
void ui_print_login(const struct server *srv);

#endif
