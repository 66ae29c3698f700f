/* retire.c - retiring many sessions at once (a shutdown): a bounded pool of threads, since
 * each checkpoint waits mostly on the store (a few requests of tens of ms each on S3). */
#include "session/session.h"

#include <pthread.h>

struct retire_pool {
    struct session **v;
    size_t n, next;
    enum session_end how;
    pthread_mutex_t lock;
};

static void *retire_worker(void *arg)
{
    struct retire_pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        size_t i = p->next < p->n ? p->next++ : p->n;
        pthread_mutex_unlock(&p->lock);
        if (i == p->n)
            return NULL;
        session_retire(p->v[i], p->how, NULL);
    }
}

void session_retire_all(struct session **v, size_t n, enum session_end how, size_t workers)
{
    struct retire_pool p = {.v = v, .n = n, .how = how};
    size_t started = 0;
    pthread_t th[64];
    workers = MIN(MIN(workers ? workers : 1, n), ARRAY_SIZE(th));
    pthread_mutex_init(&p.lock, NULL);
    for (; started < workers; started++)
        if (pthread_create(&th[started], NULL, retire_worker, &p) != 0)
            break;
    retire_worker(&p); /* this thread works too (and alone when no thread could start) */
    for (size_t i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&p.lock);
}
