/* conns.c - who holds the server's connections: a cap on those that have not shown the
 * token yet, with the oldest of them closed to make room for a new one. */
#include "http/http.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>

/* One open connection; its socket context. Listed while it has not authenticated. */
struct conn_slot {
    int fd;
    bool listed;
    struct conn_slot *prev, *next; /* oldest first */
};

struct conn_guard {
    pthread_mutex_t lock;
    size_t max_unauth;
    size_t n_unauth;
    struct conn_slot *head, *tail;
    uint64_t evicted;
};

struct conn_guard *conn_guard_new(size_t max_unauth)
{
    struct conn_guard *g = xcalloc(1, sizeof(*g));
    pthread_mutex_init(&g->lock, NULL);
    g->max_unauth = max_unauth;
    return g;
}

void conn_guard_free(struct conn_guard *g)
{
    if (!g)
        return;
    pthread_mutex_destroy(&g->lock);
    free(g);
}

/* Under g->lock. */
static void unlist(struct conn_guard *g, struct conn_slot *s)
{
    if (!s->listed)
        return;
    if (s->prev)
        s->prev->next = s->next;
    else
        g->head = s->next;
    if (s->next)
        s->next->prev = s->prev;
    else
        g->tail = s->prev;
    s->prev = s->next = NULL;
    s->listed = false;
    g->n_unauth--;
}

/* A new connection joins the unauthenticated; past the cap, the oldest of them is cut. Its
 * socket is still open here: libmicrohttpd tells of a closed connection (and we unlist it,
 * under the lock) before it closes the socket, so a listed fd is never one reused by
 * something else. Shutting it down wakes its thread, which closes it. */
static void started(struct conn_guard *g, struct MHD_Connection *conn, void **ctx)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    struct conn_slot *s = xcalloc(1, sizeof(*s));
    s->fd = ci ? ci->connect_fd : -1;
    *ctx = s;
    pthread_mutex_lock(&g->lock);
    s->listed = true;
    s->prev = g->tail;
    if (g->tail)
        g->tail->next = s;
    else
        g->head = s;
    g->tail = s;
    g->n_unauth++;
    while (g->max_unauth && g->n_unauth > g->max_unauth && g->head != s) {
        struct conn_slot *old = g->head;
        if (old->fd >= 0)
            shutdown(old->fd, SHUT_RDWR);
        unlist(g, old);
        g->evicted++;
    }
    pthread_mutex_unlock(&g->lock);
}

void conn_guard_notify(void *cls, struct MHD_Connection *conn, void **ctx,
                       enum MHD_ConnectionNotificationCode toe)
{
    struct conn_guard *g = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        started(g, conn, ctx);
        return;
    }
    struct conn_slot *s = *ctx;
    if (!s)
        return;
    pthread_mutex_lock(&g->lock);
    unlist(g, s);
    pthread_mutex_unlock(&g->lock);
    free(s);
    *ctx = NULL;
}

void conn_guard_authenticated(struct conn_guard *g, struct MHD_Connection *conn,
                              unsigned idle_timeout_s)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    struct conn_slot *s = ci ? ci->socket_context : NULL;
    if (!s)
        return;
    pthread_mutex_lock(&g->lock);
    bool was_listed = s->listed;
    unlist(g, s);
    pthread_mutex_unlock(&g->lock);
    /* The short header timeout was for strangers; a client with the token may keep an
     * idle connection as long as before. */
    if (was_listed)
        MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, idle_timeout_s);
}

uint64_t conn_guard_evicted(struct conn_guard *g)
{
    pthread_mutex_lock(&g->lock);
    uint64_t n = g->evicted;
    pthread_mutex_unlock(&g->lock);
    return n;
}
