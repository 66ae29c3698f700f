/* gate.c - how many executions run at once across a server, and how many wait: one counter
 * that every surface's executions pass (session.c takes a place when an execution's turn in
 * its session's queue comes, and gives it back when the execution ends). */
#include "session/session-int.h"

#include <errno.h>
#include <pthread.h>

struct exec_gate {
    pthread_mutex_t lock;
    pthread_cond_t freed; /* a place was given back, or a waiter was cancelled */
    size_t running, max_running;
    size_t waiting, max_waiting;
};

struct exec_gate *exec_gate_new(size_t max_running, size_t max_waiting)
{
    struct exec_gate *g = xcalloc(1, sizeof(*g));
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->freed, NULL);
    g->max_running = max_running;
    g->max_waiting = max_waiting ? max_waiting : EXEC_GATE_DEFAULT_WAITING;
    return g;
}

void exec_gate_free(struct exec_gate *g)
{
    if (!g)
        return;
    pthread_cond_destroy(&g->freed);
    pthread_mutex_destroy(&g->lock);
    free(g);
}

size_t exec_gate_running(struct exec_gate *g)
{
    pthread_mutex_lock(&g->lock);
    size_t n = g->running;
    pthread_mutex_unlock(&g->lock);
    return n;
}

size_t exec_gate_waiting(struct exec_gate *g)
{
    pthread_mutex_lock(&g->lock);
    size_t n = g->waiting;
    pthread_mutex_unlock(&g->lock);
    return n;
}

size_t exec_gate_max_running(struct exec_gate *g)
{
    return g->max_running;
}

int exec_gate_wait_begin(struct exec_gate *g)
{
    if (!g)
        return 0;
    pthread_mutex_lock(&g->lock);
    bool full = g->waiting >= g->max_waiting;
    if (!full)
        g->waiting++;
    pthread_mutex_unlock(&g->lock);
    if (full)
        return err_set(EAGAIN,
                       "the server has its maximum of %zu executions waiting to run; retry "
                       "shortly",
                       g->max_waiting);
    return 0;
}

void exec_gate_wait_end(struct exec_gate *g)
{
    if (!g)
        return;
    pthread_mutex_lock(&g->lock);
    g->waiting--;
    pthread_mutex_unlock(&g->lock);
}

bool exec_gate_enter(struct exec_gate *g, const _Atomic bool *cancelled)
{
    if (!g)
        return true;
    pthread_mutex_lock(&g->lock);
    while (g->max_running && g->running >= g->max_running && !(cancelled && *cancelled))
        pthread_cond_wait(&g->freed, &g->lock);
    bool entered = !(cancelled && *cancelled);
    if (entered)
        g->running++;
    pthread_mutex_unlock(&g->lock);
    return entered;
}

bool exec_gate_try_enter(struct exec_gate *g)
{
    if (!g)
        return true;
    pthread_mutex_lock(&g->lock);
    bool entered = !g->max_running || g->running < g->max_running;
    if (entered)
        g->running++;
    pthread_mutex_unlock(&g->lock);
    return entered;
}

void exec_gate_leave(struct exec_gate *g)
{
    if (!g)
        return;
    pthread_mutex_lock(&g->lock);
    g->running--;
    pthread_cond_broadcast(&g->freed);
    pthread_mutex_unlock(&g->lock);
}

void exec_gate_wake(struct exec_gate *g)
{
    if (!g)
        return;
    pthread_mutex_lock(&g->lock);
    pthread_cond_broadcast(&g->freed);
    pthread_mutex_unlock(&g->lock);
}
