/* pool.c - sessions made ahead of time, so that creating one is a hand-over; a background
 * thread keeps the pool full. */
#include "session/session.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

struct session_pool {
    struct sandbox_host *host;
    struct session_opts opts;
    size_t size;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    struct session **ready;
    size_t n_ready;
    bool stopping;
    pthread_t thread;
    bool thread_running;
    unsigned failures; /* in a row: backs off so a broken host is not hammered */
    uint64_t taken_ms; /* now_ms() of the last hand-over */
};

/* While the pool still holds a session, a refill waits this long after a hand-over: the
 * new owner's first cell then does not share the CPU with the template's clone of the next
 * one (under load, create -> first result p50 16.1 -> 11.3 ms with 100 ms, measured). An
 * empty pool is refilled at once. */
#define REFILL_AFTER_MS 50

static void *refill_main(void *arg)
{
    struct session_pool *p = arg;
    pthread_mutex_lock(&p->lock);
    while (!p->stopping) {
        if (p->n_ready >= p->size) {
            pthread_cond_wait(&p->wake, &p->lock);
            continue;
        }
        uint64_t since = ms_since(now_ms(), p->taken_ms);
        if (p->n_ready && since < REFILL_AFTER_MS) {
            struct timespec ts;
            realtime_after_ms(&ts, REFILL_AFTER_MS - since);
            pthread_cond_timedwait(&p->wake, &p->lock, &ts);
            continue;
        }
        pthread_mutex_unlock(&p->lock);
        struct session *s = NULL;
        int r = session_new(p->host, &p->opts, &s);
        pthread_mutex_lock(&p->lock);
        if (r < 0) {
            log_warn("msg=\"cannot fill the session pool\" error=\"%s\"", err_msg());
            p->failures++;
            struct timespec ts;
            realtime_after_ms(&ts, 1000u * MIN(60, 1u << MIN(p->failures, 6u)));
            pthread_cond_timedwait(&p->wake, &p->lock, &ts);
            continue;
        }
        p->failures = 0;
        if (p->stopping || p->n_ready >= p->size) {
            pthread_mutex_unlock(&p->lock);
            session_free(s);
            pthread_mutex_lock(&p->lock);
            continue;
        }
        p->ready[p->n_ready++] = s;
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

struct session_pool *session_pool_new(struct sandbox_host *host, const struct session_opts *opts,
                                      size_t size)
{
    struct session_pool *p = xcalloc(1, sizeof(*p));
    p->host = host;
    p->opts = *opts;
    p->opts.argv = NULL; /* pooled kernels take no arguments */
    session_opts_fill_defaults(&p->opts);
    p->size = size;
    p->ready = xcalloc(size ? size : 1, sizeof(*p->ready));
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    if (size && pthread_create(&p->thread, NULL, refill_main, p) == 0)
        p->thread_running = true;
    return p;
}

struct session *session_pool_take(struct session_pool *p, const struct session_opts *opts)
{
    struct session_opts want = *opts;
    session_opts_fill_defaults(&want);
    /* /tmp and the workspace were sized when the session was made; a network, packages
     * and input files are set up before its kernel starts; the ready sessions run the
     * Python kernel. */
    if (!p || want.limits.disk_mb != p->opts.limits.disk_mb || (opts->argv && opts->argv[0]) ||
        lang_is_javascript(opts->lang) || opts->net.policy || opts->net.secrets ||
        (opts->net.packages && opts->net.packages[0]) || opts->n_files)
        return NULL;
    pthread_mutex_lock(&p->lock);
    struct session *s = p->n_ready ? p->ready[--p->n_ready] : NULL;
    p->taken_ms = now_ms();
    pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->lock);
    if (s && session_adopt(s, opts) < 0) {
        log_warn("msg=\"pooled session unusable\" error=\"%s\"", err_msg());
        session_free(s);
        return NULL;
    }
    return s;
}

size_t session_pool_ready(struct session_pool *p)
{
    if (!p)
        return 0;
    pthread_mutex_lock(&p->lock);
    size_t n = p->n_ready;
    pthread_mutex_unlock(&p->lock);
    return n;
}

void session_pool_free(struct session_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    p->stopping = true;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    if (p->thread_running)
        pthread_join(p->thread, NULL);
    for (size_t i = 0; i < p->n_ready; i++)
        session_kill(p->ready[i]);
    for (size_t i = 0; i < p->n_ready; i++)
        session_free(p->ready[i]);
    free(p->ready);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
    free(p);
}
