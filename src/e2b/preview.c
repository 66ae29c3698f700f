/* preview.c - E2B's sandbox hosts (runcell serve --e2b-domain DOMAIN): a request to
 * PORT-ID.DOMAIN, whatever its method and path, is forwarded to port PORT on the loopback of
 * sandbox ID's own network namespace (getHost(port) in the SDKs; the create response carries
 * the domain), so a dev server started in a sandbox is reached from outside while the
 * sandbox still reaches nothing. The envd and code interpreter ports (49983, 49999) are
 * runcell's own routes on those hosts, as in E2B. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "e2b/e2b-int.h"

/* The port and sandbox id of a host PORT-ID.DOMAIN[:listener port], into port and id (of
 * id_size); false when host is not one of domain's. */
bool e2b_host_parse(const char *host, const char *domain, unsigned *port, char *id, size_t id_size)
{
    size_t n = strcspn(host, ":"), d = strlen(domain);
    if (!d || n <= d + 1 || host[n - d - 1] != '.' || strncasecmp(host + n - d, domain, d))
        return false;
    size_t label = n - d - 1; /* PORT-ID */
    const char *dash = memchr(host, '-', label);
    if (!dash || dash == host || dash - host > 5 || (size_t)(dash + 1 - host) >= label)
        return false;
    unsigned p = 0;
    for (const char *c = host; c < dash; c++) {
        if (!isdigit((unsigned char)*c))
            return false;
        p = p * 10 + (unsigned)(*c - '0');
    }
    size_t id_len = label - (size_t)(dash + 1 - host);
    if (!p || p > 65535 || id_len >= id_size)
        return false;
    for (size_t i = 0; i < id_len; i++) {
        char c = (char)tolower((unsigned char)dash[1 + i]);
        if (!isalnum((unsigned char)c) && c != '-')
            return false;
        id[i] = c;
    }
    id[id_len] = '\0';
    *port = p;
    return true;
}

static enum MHD_Result h_e2b_preview(struct request *rq);

static const struct route preview_route = {"*", "PORT-ID.DOMAIN", h_e2b_preview, ROUTE_E2B_PREVIEW,
                                           NULL};

const struct route *e2b_host_route(struct request *rq, const char *host)
{
    const char *domain = rq->srv->cfg->e2b_domain;
    char id[128];
    unsigned port;
    if (!domain || !e2b_host_parse(host, domain, &port, id, sizeof(id)) || port == E2B_ENVD_PORT ||
        port == E2B_JUPYTER_PORT)
        return NULL;
    rq->params[0] = xstrdup(id);
    rq->params[1] = xasprintf("%u", port);
    return &preview_route;
}

static enum MHD_Result h_e2b_preview(struct request *rq)
{
    const char *id = rq->params[0];
    unsigned port = (unsigned)atoi(rq->params[1]);
    struct session *s = e2b_box_session(rq, id);
    if (!s)
        return MHD_YES;
    int fd = -1;
    int r = session_connect_port(s, (uint16_t)port, &fd);
    session_table_put(rq->srv->table, s);
    if (r < 0)
        return e2b_error(rq, 502,
                         "sandbox %s is running but nothing answers on its port %u: %s; start "
                         "a server listening on it (0.0.0.0 or 127.0.0.1)",
                         id, port, err_msg());
    if ((r = http_proxy(rq, fd, (uint16_t)port)) < 0)
        return e2b_error(rq, r == -ENOTSUP ? 501 : 502, "%s", err_msg());
    return MHD_YES;
}
