/* server.c - `runcell serve`: libmicrohttpd with a thread per connection, the route table,
 * authentication, request bodies, one log line per request, and a graceful shutdown. */
#include "http/http.h"
#include "api/api.h"
#include "e2b/e2b.h"
#include "kernel/kernel.h"
#include "mcp/mcp.h"
#include "ui/ui.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* The server's own routes: health and metrics. */
static const struct route core_routes[] = {
    {"GET", "/healthz", h_healthz, ROUTE_NO_AUTH, NULL},
    {"GET", "/metrics", h_metrics, 0, NULL},
};
static const struct surface core_surface = {
    .name = "core", .routes = core_routes, .n_routes = ARRAY_SIZE(core_routes)};

/* Every protocol the listener speaks, in the order their routes are matched. */
static const struct surface *const surfaces[] = {
    &core_surface, &ui_surface, &api_surface, &mcp_surface, &e2b_surface,
};

void server_limits_fill_defaults(struct server_limits *l)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (!l->max_sessions)
        l->max_sessions = 1000;
    if (!l->max_executions)
        l->max_executions = 64;
    if (!l->max_snapshots)
        l->max_snapshots = SNAPSHOT_MAX_DEFAULT;
    if (!l->max_queued_executions)
        l->max_queued_executions = EXEC_GATE_DEFAULT_WAITING;
    if (!l->max_connections)
        l->max_connections = 1024;
    if (!l->max_connections_per_peer)
        l->max_connections_per_peer = l->max_connections / 2;
    if (!l->max_unauthenticated)
        l->max_unauthenticated = l->max_connections / 8 ? l->max_connections / 8 : 1;
    if (!l->header_timeout_ms)
        l->header_timeout_ms = 10000;
    if (!l->max_body_bytes)
        l->max_body_bytes = 64u << 20;
    if (!l->max_upload_bytes)
        l->max_upload_bytes = 1024u << 20;
    if (!l->max_memory_mb)
        l->max_memory_mb = 8192;
    if (!l->max_pids)
        l->max_pids = 4096;
    if (!l->max_disk_mb)
        l->max_disk_mb = 8192;
    if (!l->max_cpus_milli)
        l->max_cpus_milli = (uint64_t)(cpus > 0 ? cpus : 1) * 1000;
    if (!l->max_timeout_ms)
        l->max_timeout_ms = 3600u * 1000;
    if (!l->max_idle_timeout_ms)
        l->max_idle_timeout_ms = 7u * 24 * 3600 * 1000;
    if (!l->max_net_connections)
        l->max_net_connections = NET_DEFAULT_MAX_CONNECTIONS;
    if (!l->max_net_bytes)
        l->max_net_bytes = NET_DEFAULT_MAX_BYTES;
    if (!l->max_install_timeout_ms)
        l->max_install_timeout_ms = 3600u * 1000;
}

/* Matches url against pattern; fills params ({id}, then {path}) on success only. */
static bool match(const char *pattern, const char *url, char **params)
{
    int np = 0;
    const char *p = pattern, *u = url;
    while (*p && *u) {
        if (*p != '{') {
            if (*p++ != *u++)
                goto fail;
            continue;
        }
        bool rest = !strncmp(p, "{path}", 6);
        const char *close = strchr(p, '}');
        size_t n = rest ? strlen(u) : strcspn(u, "/");
        if (!n || np >= 2)
            goto fail;
        params[np++] = xstrndup(u, n);
        u += n;
        p = close + 1;
    }
    if (!*p && !*u)
        return true;
fail:
    for (int i = 0; i < np; i++) {
        free(params[i]);
        params[i] = NULL;
    }
    return false;
}

static void request_free(struct request *rq)
{
    if (rq->on_free)
        rq->on_free(rq);
    fleet_forward_free(rq);
    free(rq->raw_uri);
    if (rq->held)
        MHD_destroy_response(rq->held);
    buf_release(&rq->body);
    free(rq->params[0]);
    free(rq->params[1]);
    free(rq->session_id);
    json_decref(rq->takeover);
    net_policy_free(rq->net);
    net_secrets_free(rq->secrets);
    strv_free(rq->packages);
    free(rq);
}

/* Called with the raw URL before it is decoded: the request starts here. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn)
{
    struct request *rq = xcalloc(1, sizeof(*rq));
    rq->srv = cls;
    rq->conn = conn;
    rq->t0_ms = now_ms_f();
    /* libmicrohttpd decodes %00 into a NUL that ends the URL: "a%00b" would name "a". */
    rq->url_has_nul = strcasestr(uri, "%00") != NULL;
    rq->raw_uri = xstrdup(uri);
    return rq;
}

uint64_t drain_max(const struct request *rq)
{
    /* Only for a client with the token: no one else gets a gigabyte read on their behalf. */
    if (rq->authenticated && rq->route && (rq->route->flags & ROUTE_STREAM_BODY))
        return MAX((uint64_t)DRAIN_MAX, rq->srv->cfg->limits.max_upload_bytes);
    return DRAIN_MAX;
}

/* Whether an early reply should wait for the body (see struct request). */
static bool hold_early_replies(struct request *rq)
{
    const char *cl = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Content-Length");
    const char *te = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Transfer-Encoding");
    const char *expect = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Expect");
    uint64_t len = 0;
    if (expect && !strcasecmp(expect, "100-continue"))
        return false; /* the client waits for our word before it sends the body */
    /* A request without a body is held too: its end comes at once, and a reply queued
     * only then keeps the connection open (libmicrohttpd closes after an early one). */
    if (cl && parse_u64(cl, &len) == 0)
        return len <= drain_max(rq);
    return te != NULL || !cl;
}

const struct route *route_match(const struct server *srv, const char *url, const char *method,
                                char *params[2], const struct surface **ret_surface,
                                struct buf *allow)
{
    for (size_t k = 0; k < ARRAY_SIZE(surfaces); k++) {
        const struct surface *sf = surfaces[k];
        if (sf->enabled && !sf->enabled(srv))
            continue;
        for (size_t i = 0; i < sf->n_routes; i++) {
            const struct route *rt = &sf->routes[i];
            char *p[2] = {NULL, NULL};
            if (!match(rt->pattern, url, p))
                continue;
            /* HEAD is GET without the body (RFC 9110 9.3.2): libmicrohttpd leaves it out. */
            if (!strcmp(rt->method, method) ||
                (!strcmp(method, "HEAD") && !strcmp(rt->method, "GET"))) {
                params[0] = p[0];
                params[1] = p[1];
                *ret_surface = sf;
                return rt;
            }
            buf_printf(allow, "%s%s", allow->len ? ", " : "", rt->method);
            if (!strcmp(rt->method, "GET"))
                buf_printf(allow, ", HEAD");
            free(p[0]);
            free(p[1]);
        }
    }
    return NULL;
}

/* The token of an "Authorization: Bearer TOKEN" header, or NULL. The scheme's name is
 * case-insensitive and may be followed by more than one space (RFC 9110 11.1, 11.4). */
static const char *bearer_token(const char *h)
{
    if (!h || strncasecmp(h, "Bearer", 6) || (h[6] != ' ' && h[6] != '\t'))
        return NULL;
    h += 6;
    while (*h == ' ' || *h == '\t')
        h++;
    return h;
}

/* HTTP/1.1 requires Host (RFC 9112 3.2: a server answers 400 without it); 1.0 has none. */
static bool host_ok(struct request *rq)
{
    return rq->http10 || MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Host") != NULL;
}

/* OPTIONS: the methods a path takes, without a token (they are the same for everyone and
 * documented). No CORS headers: a page of another origin gets no permission from here
 * (docs/API.md, "Browsers"). "*" asks about the server as a whole. */
static enum MHD_Result reply_options(struct request *rq, const char *url, const char *allow)
{
    if (strcmp(url, "*") && !allow)
        return api_error(rq, AE_NOT_FOUND, "no such route: OPTIONS %s", url);
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    _cleanup_free_ char *methods =
        xasprintf("%s, OPTIONS", allow ? allow : "GET, HEAD, POST, PUT, DELETE");
    MHD_add_response_header(r, "Allow", methods);
    return reply_response(rq, 204, r);
}

/* Paths of the HTTP+SSE transport of MCP 2024-11-05, which clients of it try. */
static bool legacy_mcp_path(const char *url)
{
    return !strcmp(url, "/sse") || !strcmp(url, "/messages"); /* the query is not in url */
}

/* Routes a new request: 401, 404, 405, 503 and 413 are decided here, before the body. */
/* The route a surface gives every request to this host (see struct surface), or NULL. */
static const struct route *host_route(struct request *rq)
{
    const char *host = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Host");
    for (size_t k = 0; host && k < ARRAY_SIZE(surfaces); k++) {
        const struct surface *sf = surfaces[k];
        const struct route *rt = NULL;
        if ((!sf->enabled || sf->enabled(rq->srv)) && sf->host_route &&
            (rt = sf->host_route(rq, host))) {
            rq->surface = sf;
            return rt;
        }
    }
    return NULL;
}

static enum MHD_Result route_request(struct request *rq, const char *url, const char *method)
{
    struct server *srv = rq->srv;
    struct buf allow;
    buf_init(&allow, 0);
    rq->route = host_route(rq);
    bool by_host = rq->route != NULL;
    if (!by_host)
        rq->route = route_match(srv, url, method, rq->params, &rq->surface, &allow);
    bool path_known = rq->route || allow.len;
    if (rq->route && rq->params[0])
        rq->session_id = xstrdup(rq->params[0]);
    rq->hold_reply = hold_early_replies(rq);
    if (!host_ok(rq)) {
        buf_release(&allow);
        return api_error(rq, AE_BAD_REQUEST,
                         "an HTTP/1.1 request must carry a Host header "
                         "(RFC 9112 3.2); send Host: %s",
                         srv->cfg->listen);
    }
    if (!strcmp(method, "OPTIONS") && !by_host) {
        enum MHD_Result r = reply_options(rq, url, path_known ? allow.data : NULL);
        buf_release(&allow);
        return r;
    }
    bool needs_auth = !rq->route || !(rq->route->flags & ROUTE_NO_AUTH);
    if (needs_auth && rq->route && rq->surface->authorize) {
        /* A surface that authenticates its own way (E2B's SDK); past that, as any request.
         * Credentials only a session's own node can check send the request there first
         * (fleet_forward.c). */
        needs_auth = false;
        if (fleet_route(rq)) {
            buf_release(&allow);
            return MHD_YES;
        }
        if (!rq->surface->authorize(rq)) {
            buf_release(&allow);
            return MHD_YES;
        }
        conn_guard_authenticated(srv->conns, rq->conn, CONNECTION_IDLE_TIMEOUT_S);
        rq->authenticated = true;
        rq->hold_reply = hold_early_replies(rq);
    }
    if (needs_auth) {
        const char *h = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Authorization");
        const char *given = bearer_token(h);
        if (!given || !token_equal(given, srv->token)) {
            buf_release(&allow);
            return api_error(rq, AE_UNAUTHORIZED,
                             "%s; send 'Authorization: Bearer TOKEN' "
                             "(the token is in the server's data directory, file 'token')",
                             !h      ? "no token"
                             : given ? "wrong token"
                                     : "the Authorization header is not "
                                       "of the Bearer scheme");
        }
        conn_guard_authenticated(srv->conns, rq->conn, CONNECTION_IDLE_TIMEOUT_S);
        rq->authenticated = true;
        rq->hold_reply = hold_early_replies(rq); /* an upload's drain is longer now */
    }
    if (!rq->route) {
        enum MHD_Result r;
        if (path_known) {
            r = api_error_header(rq, AE_METHOD, "Allow", allow.data,
                                 "%s does not take %s; it takes %s", url, method, allow.data);
        } else {
            r = legacy_mcp_path(url)
                    ? api_error(rq, AE_NOT_FOUND,
                                "no such route: %s %s; this server offers "
                                "MCP over Streamable HTTP only, at /mcp (POST initialize "
                                "there), not the HTTP+SSE transport of MCP 2024-11-05",
                                method, url)
                    : api_error(rq, AE_NOT_FOUND, "no such route: %s %s", method, url);
        }
        buf_release(&allow);
        return r;
    }
    buf_release(&allow);
    if (rq->url_has_nul)
        return api_error(rq, AE_BAD_PATH,
                         "the URL holds an encoded NUL byte (%%00), which no "
                         "session id or file name may contain");
    if (atomic_load(&srv->shutting_down) && rq->route->handle != h_healthz)
        return srv->fleet ? api_error_header(rq, AE_SHUTTING_DOWN, "Retry-After", "1",
                                             "the node is shutting down: its sessions move to "
                                             "other nodes of the fleet as they are checkpointed; "
                                             "send the request again")
                          : api_error(rq, AE_SHUTTING_DOWN, "the server is shutting down");
    if (fleet_route(rq))
        return MHD_YES;
    const char *cl = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Content-Length");
    uint64_t len, max = rq->route->flags & ROUTE_STREAM_BODY ? srv->cfg->limits.max_upload_bytes
                                                             : srv->cfg->limits.max_body_bytes;
    if (cl && parse_u64(cl, &len) == 0 && len > max)
        return api_error(rq, AE_TOO_LARGE,
                         "request body of %llu bytes is larger than the "
                         "server's limit of %llu bytes",
                         (unsigned long long)len, (unsigned long long)max);
    if (rq->route->admit &&
        !rq->route->admit(rq, cl && parse_u64(cl, &len) == 0 ? len : UINT64_MAX))
        return MHD_YES;
    buf_init(&rq->body, max);
    return MHD_YES;
}

/* A chunk of the body: into the JSON buffer or the route's upload, or dropped after a
 * reply was made. */
static enum MHD_Result on_body(struct request *rq, const char *data, size_t n)
{
    if (rq->responded) {
        rq->dropped += n;
        /* Past drain_max the client is not worth reading further: hang up, unanswered. */
        return rq->dropped > drain_max(rq) ? MHD_NO : MHD_YES;
    }
    if (rq->route->flags & ROUTE_STREAM_BODY) {
        int r = rq->route->upload(rq, data, n);
        return r < 0 ? api_errno(rq, r) : MHD_YES;
    }
    if (buf_append(&rq->body, data, n) < 0) {
        buf_release(&rq->body);
        return api_error(rq, AE_TOO_LARGE,
                         "request body larger than the server's limit of "
                         "%llu bytes",
                         (unsigned long long)rq->srv->cfg->limits.max_body_bytes);
    }
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **req_cls)
{
    struct request *rq = *req_cls;
    (void)cls;
    if (rq->phase == PHASE_HEADERS && !rq->method[0]) {
        snprintf(rq->method, sizeof(rq->method), "%s", method);
        rq->http10 = !strcmp(version, MHD_HTTP_VERSION_1_0);
        enum MHD_Result r = route_request(rq, url, method);
        if (!rq->route || !(rq->route->flags & ROUTE_EXECUTES))
            session_work_priority_reset();
        rq->phase = PHASE_BODY;
        return r;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        return on_body(rq, upload_data, n);
    }
    rq->phase = PHASE_DONE;
    if (rq->held) {
        enum MHD_Result r = MHD_queue_response(conn, (unsigned)rq->status, rq->held);
        MHD_destroy_response(rq->held);
        rq->held = NULL;
        return r;
    }
    if (rq->responded)
        return MHD_YES;
    return rq->route->handle(rq);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct server *srv = cls;
    struct request *rq = *req_cls;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    char addr[INET6_ADDRSTRLEN] = "?";
    (void)toe;
    if (!rq)
        return;
    if (ci && ci->client_addr) {
        const struct sockaddr *sa = ci->client_addr;
        const void *a = sa->sa_family == AF_INET6
                            ? (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr
                            : (const void *)&((const struct sockaddr_in *)sa)->sin_addr;
        inet_ntop(sa->sa_family, a, addr, sizeof(addr));
    }
    if (rq->owes_reply)
        atomic_fetch_sub(&srv->replies_owed, 1);
    metrics_request(srv->metrics, (unsigned)rq->status);
    log_info("method=%s route=%s status=%d duration_ms=%.1f session=%s client=%s%s",
             log_quote(rq->method[0] ? rq->method : "-"), rq->route ? rq->route->pattern : "-",
             rq->status, now_ms_f() - rq->t0_ms, log_quote(rq->session_id), addr,
             toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " aborted=1");
    request_free(rq);
    *req_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[1024];
    (void)cls;
    vsnprintf(msg, sizeof(msg), fmt, ap);
    msg[strcspn(msg, "\n")] = '\0';
    log_warn("msg=\"http: %s\"", msg);
}

static int parse_listen(const char *listen, struct sockaddr_storage *ret, socklen_t *ret_len)
{
    _cleanup_free_ char *copy = xstrdup(listen);
    char *host = copy, *port = strrchr(copy, ':');
    if (!port || port == copy || !port[1])
        return err_set(EINVAL, "--listen '%s' is not HOST:PORT (e.g. 127.0.0.1:8080)", listen);
    *port++ = '\0';
    if (*host == '[' && host[strlen(host) - 1] == ']') {
        host++;
        host[strlen(host) - 1] = '\0';
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV},
                    *ai;
    int r = getaddrinfo(host, port, &hints, &ai);
    if (r)
        return err_set(EINVAL, "--listen '%s': %s", listen, gai_strerror(r));
    memcpy(ret, ai->ai_addr, ai->ai_addrlen);
    *ret_len = ai->ai_addrlen;
    freeaddrinfo(ai);
    return 0;
}

static bool is_loopback(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
    if (ss->ss_family == AF_INET6)
        return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)ss)->sin6_addr);
    return false;
}

static int start_http(struct server *srv, const struct sockaddr_storage *addr)
{
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ERROR_LOG | MHD_USE_ITC;
    if (addr->ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    /* Connections start with the header timeout and the unauthenticated cap; a request
     * with the token lifts both for its connection (conns.c). libmicrohttpd's timeout is
     * in whole seconds. */
    const struct server_limits *l = &srv->cfg->limits;
    unsigned header_timeout_s = (unsigned)((l->header_timeout_ms + 999) / 1000);
    srv->conns = conn_guard_new(l->max_unauthenticated);
    /* The logger comes first: libmicrohttpd logs the options that follow it through it. */
    srv->mhd =
        MHD_start_daemon(flags, 0, NULL, NULL, on_request, srv, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
                         srv, MHD_OPTION_URI_LOG_CALLBACK, on_uri, srv, MHD_OPTION_SOCK_ADDR, addr,
                         MHD_OPTION_CONNECTION_LIMIT, (unsigned)l->max_connections,
                         MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)l->max_connections_per_peer,
                         MHD_OPTION_CONNECTION_TIMEOUT, header_timeout_s,
                         MHD_OPTION_NOTIFY_CONNECTION, conn_guard_notify, srv->conns,
                         MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv, MHD_OPTION_END);
    if (!srv->mhd)
        return err_set(EADDRINUSE, "cannot listen on %s: the address is in use or not local",
                       srv->cfg->listen);
    return 0;
}

char *default_data_dir(void)
{
    const char *env = getenv("RUNCELL_DATA");
    if (env && *env)
        return xstrdup(env);
    if (geteuid() == 0)
        return xstrdup("/var/lib/runcell");
    const char *xdg = getenv("XDG_DATA_HOME");
    if (xdg && *xdg)
        return xasprintf("%s/runcell", xdg);
    const char *home = getenv("HOME");
    return xasprintf("%s/.local/share/runcell", home && *home ? home : "/tmp");
}

/* Waits until nothing runs and every execution's reply is sent, or until deadline_ms;
 * true when so. A cell gives its slot back before its reply goes out (and a one-shot run
 * before its sandbox is torn down): stopping the daemon then would hang up on that reply. */
static size_t running_executions(struct server *srv)
{
    struct exec_gate *g = srv->table ? session_table_gate(srv->table) : NULL;
    return g ? exec_gate_running(g) + exec_gate_waiting(g) : 0;
}

void request_owes_reply(struct request *rq)
{
    if (rq->owes_reply)
        return;
    rq->owes_reply = true;
    atomic_fetch_add(&rq->srv->replies_owed, 1);
}

static bool wait_idle(struct server *srv, double deadline_ms)
{
    while (running_executions(srv) > 0 || atomic_load(&srv->replies_owed) > 0) {
        if (now_ms_f() >= deadline_ms)
            return false;
        usleep(20000);
    }
    return true;
}

static void shutdown_gracefully(struct server *srv)
{
    atomic_store(&srv->shutting_down, true);
    int lfd = (int)MHD_quiesce_daemon(srv->mhd);
    if (lfd >= 0)
        close(lfd);
    size_t running = running_executions(srv);
    log_info("msg=\"shutting down\" running_executions=%zu grace_ms=%llu", running,
             (unsigned long long)srv->cfg->shutdown_grace_ms);
    const struct session_opts *d = &srv->cfg->defaults;
    if (!wait_idle(srv, now_ms_f() + (double)srv->cfg->shutdown_grace_ms)) {
        log_info("msg=\"grace period over; interrupting running cells\"");
        session_table_interrupt_all(srv->table);
        oneshots_interrupt(srv);
        if (!wait_idle(srv, now_ms_f() + (double)d->interrupt_grace_ms)) {
            /* Interrupt first, kill after, as for a timeout: each client still gets its
             * record. A one-shot still starting its kernel has nothing to kill yet; its cell
             * is interrupted as it starts, so the wait is bounded by the start timeout (as
             * long as it is for the lowest CPU limit). */
            log_info("msg=\"interrupt grace over; killing the cells that did not stop\"");
            session_table_kill_all(srv->table);
            oneshots_kill(srv);
            wait_idle(srv,
                      now_ms_f() + (double)d->start_timeout_ms * KERNEL_START_SCALE_MAX + 3000);
        }
    }
    mcp_http_free(srv->mcp);
    srv->mcp = NULL;
    MHD_stop_daemon(srv->mhd);
    srv->mhd = NULL;
    /* The renewer drops sessions from the table: not while it goes. It goes on renewing, so
     * that the sessions' last saves happen under their leases however long they take. */
    fleet_quiesce(srv->fleet);
    session_table_free(srv->table);
    srv->table = NULL;
    session_pool_free(srv->pool);
    srv->pool = NULL;
}

/* Each session holds a few descriptors here (its kernel's channel and pipes, its sandbox's
 * status pipe, pidfd and exec channel, its uid slot lock, its cgroup usage files and its
 * workspace's directory, the last two closed when it is idle, and once it has started a
 * program beside its cells their poller's eventfd: 11 a Python session that has run a cell,
 * 12 one that has also run an E2B command, measured with --pool 0; a running command holds
 * 3 or 4 more while it runs, which this does not count), each connection one: the soft
 * limit is raised to the hard one, and the hard one to what max_sessions needs where the
 * server may (CAP_SYS_RESOURCE, up to fs.nr_open); a limit still short of that is logged. */
#define FDS_PER_SESSION     13
#define FDS_BESIDE_SESSIONS 64

static void raise_fd_limit(const struct server_limits *l)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return;
    size_t max_sessions = l->max_sessions;
    rlim_t want = (rlim_t)max_sessions * FDS_PER_SESSION + l->max_connections + FDS_BESIDE_SESSIONS;
    unsigned long nr_open = 0;
    _cleanup_free_ char *text = NULL;
    if (read_file("/proc/sys/fs/nr_open", 64, &text, NULL) == 0)
        nr_open = strtoul(text, NULL, 10);
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want && nr_open) {
        struct rlimit more = {.rlim_cur = MIN(want, (rlim_t)nr_open),
                              .rlim_max = MIN(want, (rlim_t)nr_open)};
        if (more.rlim_max > rl.rlim_max && setrlimit(RLIMIT_NOFILE, &more) == 0)
            rl = more;
    }
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
            getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur < want)
        log_warn(
            "msg=\"the open files limit allows fewer sessions than --max-sessions\" "
            "open_files_max=%llu sessions_max=%zu sessions_about=%llu "
            "fix=\"raise the limit (ulimit -n, LimitNOFILE= under systemd) to %llu\"",
            (unsigned long long)rl.rlim_cur, max_sessions,
            rl.rlim_cur > l->max_connections + FDS_BESIDE_SESSIONS
                ? (unsigned long long)((rl.rlim_cur - l->max_connections - FDS_BESIDE_SESSIONS) /
                                       FDS_PER_SESSION)
                : 0ULL,
            (unsigned long long)want);
}

/* Every execution that ran, whichever surface submitted it, in the metrics. */
static void observe_execution(void *ctx, const struct exec_record *rec)
{
    metrics_execution(ctx, rec->status, rec->wall_ms / 1000.0);
}

/* The session records (DATA/sessions.db) and the store (DATA/store unless told). */
static int open_persistence(struct server *srv)
{
    const struct server_config *cfg = srv->cfg;
    _cleanup_free_ char *db = xasprintf("%s/sessions.db", cfg->data_dir);
    _cleanup_free_ char *local = xasprintf("%s/store", cfg->data_dir);
    struct store_config sc = cfg->store;
    if (!sc.url)
        sc.url = local;
    int r = meta_open(db, &srv->meta);
    if (r < 0 || (r = meta_recover(srv->meta, owner_alive)) < 0)
        return r;
    if ((r = store_open(&sc, &srv->store)) < 0)
        return r;
    if ((r = store_check(srv->store)) < 0)
        return err_set(-r, "the store %s does not answer: %s", store_describe(srv->store),
                       err_msg());
    srv->persist = (struct persist_config){.store = srv->store,
                                           .meta = srv->meta,
                                           .quota_bytes = cfg->store_quota_bytes,
                                           .max_files = cfg->store_max_files,
                                           .owner = srv->host.owner_id};
    if (cfg->secrets_key) {
        if ((r = store_seal_key_load(cfg->secrets_key, srv->seal_key)) < 0)
            return err_set(-r, "--secrets-key: %s", err_msg());
        srv->persist.seal_key = srv->seal_key;
        log_info("msg=\"secrets are kept in the records, sealed\" key_file=%s",
                 log_quote(cfg->secrets_key));
    }
    log_info("msg=\"sessions are kept\" store=%s records=%s quota_mb=%.1f",
             log_quote(store_describe(srv->store)), db, (double)cfg->store_quota_bytes / 1048576.0);
    return 0;
}

static int prepare(struct server *srv, struct sockaddr_storage *addr)
{
    raise_fd_limit(&srv->cfg->limits);
    socklen_t alen;
    bool generated;
    int r = parse_listen(srv->cfg->listen, addr, &alen);
    if (r < 0)
        return r;
    /* DATA holds the token, transcripts and users' files: the server's user's alone, also
     * when it was made by hand or by an older runcell. */
    if (mkdir_p(srv->cfg->data_dir, 0700) < 0 || chmod(srv->cfg->data_dir, 0700) < 0)
        return err_set(errno, "cannot create the data directory %s with mode 0700: %s",
                       srv->cfg->data_dir, strerror(errno));
    _cleanup_free_ char *token_path = xasprintf("%s/token", srv->cfg->data_dir);
    bool token_given = srv->cfg->token || (getenv("RUNCELL_TOKEN") && *getenv("RUNCELL_TOKEN")) ||
                       access(token_path, F_OK) == 0;
    if (!is_loopback(addr) && !token_given)
        return err_set(EPERM,
                       "refusing to listen on %s, which is not a loopback address, "
                       "without a token chosen for it: pass --token, set RUNCELL_TOKEN, or "
                       "write one to %s",
                       srv->cfg->listen, token_path);
    if ((r = token_load(srv->cfg->data_dir, srv->cfg->token, &srv->token, &generated)) < 0)
        return r;
    srv->token_generated = generated;
    if (generated)
        fprintf(stderr, "runcell: generated an API token, saved to %s (mode 0600):\n%s\n",
                token_path, srv->token);
    else if (!srv->cfg->token && !(getenv("RUNCELL_TOKEN") && *getenv("RUNCELL_TOKEN")))
        fprintf(stderr, "runcell: the API token is in %s\n", token_path); /* said each start */
    if ((r = fleet_node_name(srv->cfg->node, &srv->node)) < 0)
        return r;
    if ((r = sandbox_host_init(&srv->host)) < 0)
        return r;
    if (srv->host.degraded_reason)
        log_warn("msg=\"resource limits are degraded\" reason=%s",
                 log_quote(srv->host.degraded_reason));
    if ((r = open_persistence(srv)) < 0)
        return r;
    if (!srv->cfg->no_template && srv->host.privileged && srv->host.cgroup_mode != CGROUP_NONE &&
        sandbox_host_start_template(&srv->host) < 0)
        log_warn("msg=\"no template; sessions start from scratch\" error=%s", log_quote(err_msg()));
    srv->pool = session_pool_new(&srv->host, &srv->cfg->defaults, srv->cfg->pool_size);
    srv->table = session_table_new(&srv->host, srv->cfg->limits.max_sessions, srv->pool);
    session_table_set_exec_limits(srv->table, srv->cfg->limits.max_executions,
                                  srv->cfg->limits.max_queued_executions);
    session_table_set_node(srv->table, srv->node);
    if (srv->cfg->checkpoint_workers)
        session_table_set_retire_workers(srv->table, srv->cfg->checkpoint_workers);
    if (srv->cfg->fleet && (r = fleet_open(srv)) < 0)
        return r;
    session_table_set_persistence(srv->table, &srv->persist);
    srv->metrics = metrics_new();
    session_table_set_observer(srv->table, observe_execution, srv->metrics);
    srv->mcp = mcp_http_new(srv);
    if (srv->cfg->e2b) {
        srv->e2b = e2b_new();
        /* A sandbox's box (its metadata, watchers, contexts) goes with its session, however
         * the session ends. */
        session_table_set_gone(srv->table, e2b_session_gone, srv->e2b);
    }
    return session_table_start_reaper(srv->table, 1000);
}

int server_run(const struct server_config *cfg)
{
    struct server srv = {.cfg = cfg, .oneshots_lock = PTHREAD_MUTEX_INITIALIZER, .watchdog_fd = -1};
    struct sockaddr_storage addr;
    sigset_t stop;
    int sig = 0, status = 0;

    /* Blocked before any thread starts, so every thread inherits the mask and the signals
     * arrive here, in sigwait. */
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* Before any thread: the watchdog is a fork of this process as it is now. */
    if ((cfg->fleet && fleet_watchdog_spawn(&srv.watchdog_fd) < 0) || prepare(&srv, &addr) < 0 ||
        start_http(&srv, &addr) < 0) {
        fprintf(stderr, "runcell serve: %s\n", err_msg());
        status = 1;
        goto out;
    }
    log_info("msg=\"listening\" address=http://%s data=%s sessions_max=%zu", cfg->listen,
             cfg->data_dir, cfg->limits.max_sessions);
    fprintf(stderr, "runcell: listening on http://%s\n", cfg->listen);
    ui_print_login(&srv);
    sigwait(&stop, &sig);
    log_info("msg=\"received %s\"", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    shutdown_gracefully(&srv);
    log_info("msg=\"stopped\"");
out:
    mcp_http_free(srv.mcp);
    if (srv.mhd)
        MHD_stop_daemon(srv.mhd);
    conn_guard_free(srv.conns); /* the daemon, which used it, is stopped */
    fleet_quiesce(srv.fleet);
    session_table_free(srv.table); /* releases the leases of the sessions it retires */
    fleet_free(srv.fleet);
    if (srv.watchdog_fd >= 0)
        close(srv.watchdog_fd);
    free(srv.node);
    session_pool_free(srv.pool);
    store_free(srv.store);
    meta_close(srv.meta);
    metrics_free(srv.metrics);
    e2b_free(srv.e2b);
    if (srv.token)
        explicit_bzero(srv.token, strlen(srv.token));
    free(srv.token);
    sandbox_host_release(&srv.host);
    return status;
}
