/* pool.c - sessions made ahead of time, so that creating one is a hand-over; background
 * threads keep the pool full, and the pool grows while creations find it empty. */
#include "session/session.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

/* Refill threads: two clones' set-up (mounts, the kernel's start, its shell) overlap, while
 * the template itself makes one clone at a time. */
#define POOL_THREADS 2
/* The most a pool grows to on demand (each ready session holds ~5 MB), and how long after
 * the last creation that found it empty it goes back to its size. */
#define POOL_GROWN_MAX 64
#define POOL_SHRINK_MS 30000

struct session_pool {
    struct sandbox_host *host;
    struct session_opts opts;
    size_t size;   /* as configured */
    size_t target; /* what the refill keeps: size, grown while takes find the pool empty */
    pthread_mutex_t lock;
    pthread_cond_t wake;
    struct session **ready;
    size_t n_ready;
    size_t n_making; /* sessions the refill threads are making */
    bool stopping;
    pthread_t threads[POOL_THREADS];
    int n_threads;
    unsigned failures;  /* in a row: backs off so a broken host is not hammered */
    uint64_t taken_ms;  /* now_ms() of the last hand-over */
    uint64_t missed_ms; /* now_ms() of the last take that found the pool empty */
};

/* Back to the configured size once nothing found the pool empty for POOL_SHRINK_MS; the
 * surplus sessions go (the caller frees them, outside the lock). Called with the lock held. */
static size_t shrink_locked(struct session_pool *p, struct session **ret_surplus, size_t max)
{
    size_t n = 0;
    if (p->target > p->size && ms_since(now_ms(), p->missed_ms) >= POOL_SHRINK_MS) {
        p->target = p->size;
        while (p->n_ready > p->target && n < max)
            ret_surplus[n++] = p->ready[--p->n_ready];
    }
    return n;
}

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
        struct session *surplus[POOL_GROWN_MAX];
        size_t n_surplus = shrink_locked(p, surplus, POOL_GROWN_MAX);
        if (n_surplus) {
            pthread_mutex_unlock(&p->lock);
            for (size_t i = 0; i < n_surplus; i++)
                session_free(surplus[i]);
            pthread_mutex_lock(&p->lock);
            continue;
        }
        if (p->n_ready + p->n_making >= p->target) {
            if (p->target > p->size) { /* look again when the shrink may be due */
                struct timespec ts;
                realtime_after_ms(&ts, POOL_SHRINK_MS);
                pthread_cond_timedwait(&p->wake, &p->lock, &ts);
            } else {
                pthread_cond_wait(&p->wake, &p->lock);
            }
            continue;
        }
        uint64_t since = ms_since(now_ms(), p->taken_ms);
        if (p->n_ready && since < REFILL_AFTER_MS) {
            struct timespec ts;
            realtime_after_ms(&ts, REFILL_AFTER_MS - since);
            pthread_cond_timedwait(&p->wake, &p->lock, &ts);
            continue;
        }
        p->n_making++;
        pthread_mutex_unlock(&p->lock);
        struct session *s = NULL;
        int r = session_new(p->host, &p->opts, &s);
        /* The shell too, outside the lock: a first shell command (an E2B command, a bash
         * cell) is then as quick as a later one. Best effort. */
        if (r == 0 && session_start_shell(s) < 0)
            log_warn("msg=\"cannot start a pooled session's shell\" error=\"%s\"", err_msg());
        pthread_mutex_lock(&p->lock);
        p->n_making--;
        if (r < 0) {
            log_warn("msg=\"cannot fill the session pool\" error=%s", log_quote(err_msg()));
            p->failures++;
            struct timespec ts;
            realtime_after_ms(&ts, 1000u * MIN(60, 1u << MIN(p->failures, 6u)));
            pthread_cond_timedwait(&p->wake, &p->lock, &ts);
            continue;
        }
        p->failures = 0;
        if (p->stopping || p->n_ready >= p->target) {
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
    p->size = p->target = size;
    p->ready = xcalloc(MAX(size, POOL_GROWN_MAX), sizeof(*p->ready));
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    for (int i = 0; size && i < POOL_THREADS; i++)
        if (pthread_create(&p->threads[p->n_threads], NULL, refill_main, p) == 0)
            p->n_threads++;
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
    if (!s && p->size) {
        /* Demand outran the pool: it grows (doubling, up to POOL_GROWN_MAX), so that the
         * creations that follow find sessions made ahead. */
        p->missed_ms = p->taken_ms;
        p->target = MIN(MAX(p->target * 2, p->size), MAX(p->size, (size_t)POOL_GROWN_MAX));
    }
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    if (s && session_adopt(s, opts) < 0) {
        log_warn("msg=\"pooled session unusable\" error=%s", log_quote(err_msg()));
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
    for (int i = 0; i < p->n_threads; i++)
        pthread_join(p->threads[i], NULL);
    for (size_t i = 0; i < p->n_ready; i++)
        session_kill(p->ready[i]);
    for (size_t i = 0; i < p->n_ready; i++)
        session_free(p->ready[i]);
    free(p->ready);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
    free(p);
}
