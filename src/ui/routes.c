/* routes.c - the web console: its assets under /ui/ from the binary's own memory (ui.h),
 * with the headers that keep a hostile cell's output from running in its origin. */
#include "ui/ui.h"
#include "http/http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* Every console response carries these (docs/SECURITY.md, "The web console"). Scripts come
 * only from /ui/ itself (no inline script, no eval); styles from /ui/ and data: URLs (the
 * stylesheets a cell's HTML brings, e.g. pandas Styler's, as render.js hands them to the
 * cell's sandboxed frame; no inline style). The only HTML sink the console has, a cell's
 * text/html in a sandboxed iframe, goes through the one Trusted Types policy named here, so
 * that any other innerHTML-like assignment throws. */
static const char csp[] =
    "default-src 'none'; script-src 'self'; style-src 'self' data:; img-src 'self' data: blob:; "
    "connect-src 'self'; frame-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'; object-src 'none'; require-trusted-types-for 'script'; "
    "trusted-types runcell-cell-html";

static const struct {
    const char *name, *value;
} ui_headers[] = {
    {"Content-Security-Policy", csp},
    {"X-Content-Type-Options", "nosniff"},
    {"X-Frame-Options", "DENY"},
    {"Referrer-Policy", "no-referrer"},
    {"Cross-Origin-Opener-Policy", "same-origin"},
    {"Permissions-Policy", "camera=(), microphone=(), geolocation=(), usb=(), payment=()"},
    /* Revalidated each time (the ETag makes that a 304): the names carry no version, and a
     * console older than its server would speak to routes it does not know. */
    {"Cache-Control", "no-cache"},
};

/* The stylesheet of a cell's HTML output is fetched by its sandboxed frame, whose origin is
 * opaque (not this one): that file alone may be read across origins. */
#define FRAME_CSS "frame.css"

static void add_ui_headers(struct MHD_Response *r, const char *name)
{
    for (size_t i = 0; i < ARRAY_SIZE(ui_headers); i++)
        MHD_add_response_header(r, ui_headers[i].name, ui_headers[i].value);
    MHD_add_response_header(r, "Cross-Origin-Resource-Policy",
                            name && !strcmp(name, FRAME_CSS) ? "cross-origin" : "same-origin");
}

/* Whether If-None-Match names etag (a list; W/ tags compared weakly, as RFC 9110 13.1.2
 * says for this header; "*" matches any). */
static bool etag_matches(const char *inm, const char *etag)
{
    size_t elen = strlen(etag);
    for (const char *p = inm; p && *p;) {
        p += strspn(p, " \t,");
        if (*p == '*')
            return true;
        if (!strncmp(p, "W/", 2))
            p += 2;
        size_t n = strcspn(p, ", \t");
        if (n == elen && !memcmp(p, etag, n))
            return true;
        p += n;
    }
    return false;
}

/* Whether Accept-Encoding takes gzip: named with a q-value above 0, or "*" so when gzip is not
 * named (RFC 9110 12.5.3). */
static bool accepts_gzip(const char *ae)
{
    double gzip_q = -1, star_q = -1;
    for (const char *p = ae; p && *p;) {
        p += strspn(p, " \t,");
        size_t n = strcspn(p, ";, \t");
        const char *end = p + strcspn(p, ",");
        double q = 1;
        for (const char *s = p + n; s < end; s++) {
            if (*s != ';')
                continue;
            s += 1 + strspn(s + 1, " \t");
            if ((*s == 'q' || *s == 'Q') && s[1] == '=')
                q = strtod(s + 2, NULL);
        }
        if ((n == 4 && !strncasecmp(p, "gzip", 4)) || (n == 6 && !strncasecmp(p, "x-gzip", 6)))
            gzip_q = q;
        else if (n == 1 && *p == '*')
            star_q = q;
        p = end;
    }
    return gzip_q >= 0 ? gzip_q > 0 : star_q > 0;
}

static enum MHD_Result redirect(struct request *rq, const char *to)
{
    static const char body[] = "the console is at /ui/\n";
    struct MHD_Response *r =
        MHD_create_response_from_buffer(sizeof(body) - 1, (void *)body, MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(r, "Location", to);
    MHD_add_response_header(r, "Content-Type", "text/plain; charset=utf-8");
    add_ui_headers(r, NULL);
    return reply_response(rq, 302, r);
}

static enum MHD_Result h_ui_root(struct request *rq)
{
    return redirect(rq, "/ui/");
}

static enum MHD_Result h_ui_asset(struct request *rq)
{
    /* {path} was taken for a session id by the router: not one, and not for the log. */
    free(rq->session_id);
    rq->session_id = NULL;
    const char *name = rq->params[0] ? rq->params[0] : "index.html";
    const struct ui_asset *a = ui_asset_find(name);
    if (!a)
        return api_error(rq, AE_NOT_FOUND, "the console has no file '%s'", name);
    /* The gzip form where the client takes it (built by embed.py), with an ETag of its own. */
    bool gz = a->gz_data && accepts_gzip(MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND,
                                                                     "Accept-Encoding"));
    const char *etag = gz ? a->gz_etag : a->etag;
    const char *inm = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "If-None-Match");
    bool fresh = inm && etag_matches(inm, etag);
    struct MHD_Response *r =
        fresh ? MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT)
              : MHD_create_response_from_buffer(gz ? a->gz_size : a->size,
                                                (void *)(gz ? a->gz_data : a->data),
                                                MHD_RESPMEM_PERSISTENT);
    if (!fresh)
        MHD_add_response_header(r, "Content-Type", a->mime);
    if (gz && !fresh)
        MHD_add_response_header(r, "Content-Encoding", "gzip");
    if (a->gz_data)
        MHD_add_response_header(r, "Vary", "Accept-Encoding");
    MHD_add_response_header(r, "ETag", etag);
    add_ui_headers(r, a->name);
    return reply_response(rq, fresh ? 304 : 200, r);
}

/* The token as a URL fragment may carry it: unreserved characters as they are, the rest
 * percent-encoded (the console decodes it). */
static void print_encoded(FILE *f, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
            strchr("-._~", c))
            fputc(c, f);
        else
            fprintf(f, "%%%02X", c);
    }
}

void ui_print_login(const struct server *srv)
{
    const char *listen = srv->cfg->listen;
    /* A wildcard address is not one a browser can open; loopback is where it listens too. */
    const char *port = strrchr(listen, ':');
    bool wild = !strncmp(listen, "0.0.0.0:", 8) || !strncmp(listen, "[::]:", 5);
    _cleanup_free_ char *base =
        wild ? xasprintf("http://%s%s/ui/", listen[0] == '[' ? "[::1]" : "127.0.0.1", port)
             : xasprintf("http://%s/ui/", listen);
    /* The token goes in the fragment, which a browser never sends, so it reaches no
     * server's log. It is printed only where it was printed already (just generated) or to
     * a person at a terminal: never into a log file or a journal by this line. */
    if (srv->token_generated || isatty(STDERR_FILENO)) {
        fprintf(stderr, "runcell: web console: %s#token=", base);
        print_encoded(stderr, srv->token);
        fputc('\n', stderr);
    } else {
        fprintf(stderr,
                "runcell: web console: %s (log in with the API token, or open "
                "%s#token=TOKEN)\n",
                base, base);
    }
}

/* The console's files carry no secret: no token. */
static const struct route ui_routes[] = {
    {"GET", "/", h_ui_root, ROUTE_NO_AUTH, NULL},
    {"GET", "/ui", h_ui_root, ROUTE_NO_AUTH, NULL},
    {"GET", "/ui/", h_ui_asset, ROUTE_NO_AUTH, NULL},
    {"GET", "/ui/{path}", h_ui_asset, ROUTE_NO_AUTH, NULL},
};

const struct surface ui_surface = {
    .name = "ui", .routes = ui_routes, .n_routes = ARRAY_SIZE(ui_routes)};
