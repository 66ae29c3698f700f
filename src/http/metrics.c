/* metrics.c - counters and histograms in the Prometheus text format. */
#include "http/http.h"

#include <pthread.h>
#include <string.h>

static const double exec_buckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                      1,     2.5,  5,     10,   30,  60,   300};
static const double create_buckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
#define N_EXEC_B   ARRAY_SIZE(exec_buckets)
#define N_CREATE_B ARRAY_SIZE(create_buckets)
#define N_STATUS   (EXEC_SANDBOX_ERROR + 1)

struct histogram {
    uint64_t counts[16];
    uint64_t n;
    double sum;
};

struct metrics {
    pthread_mutex_t lock;
    uint64_t executions[N_STATUS];
    struct histogram exec;
    struct histogram create;
    uint64_t sandbox_failures;
    uint64_t requests[6]; /* by status class 1xx..5xx; [0] unused */
};

struct metrics *metrics_new(void)
{
    struct metrics *m = xcalloc(1, sizeof(*m));
    pthread_mutex_init(&m->lock, NULL);
    return m;
}

void metrics_free(struct metrics *m)
{
    if (!m)
        return;
    pthread_mutex_destroy(&m->lock);
    free(m);
}

static void observe(struct histogram *h, const double *bounds, size_t nb, double v)
{
    for (size_t i = 0; i < nb; i++)
        if (v <= bounds[i])
            h->counts[i]++;
    h->n++;
    h->sum += v;
}

void metrics_execution(struct metrics *m, enum exec_status status, double seconds)
{
    pthread_mutex_lock(&m->lock);
    if ((size_t)status < N_STATUS)
        m->executions[status]++;
    observe(&m->exec, exec_buckets, N_EXEC_B, seconds);
    if (status == EXEC_SANDBOX_ERROR)
        m->sandbox_failures++;
    pthread_mutex_unlock(&m->lock);
}

void metrics_session_created(struct metrics *m, double seconds)
{
    pthread_mutex_lock(&m->lock);
    observe(&m->create, create_buckets, N_CREATE_B, seconds);
    pthread_mutex_unlock(&m->lock);
}

void metrics_sandbox_failure(struct metrics *m)
{
    pthread_mutex_lock(&m->lock);
    m->sandbox_failures++;
    pthread_mutex_unlock(&m->lock);
}

void metrics_request(struct metrics *m, unsigned status)
{
    pthread_mutex_lock(&m->lock);
    if (status >= 100 && status < 600)
        m->requests[status / 100]++;
    pthread_mutex_unlock(&m->lock);
}

static void render_hist(struct buf *b, const char *name, const char *help,
                        const struct histogram *h, const double *bounds, size_t nb)
{
    buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (size_t i = 0; i < nb; i++)
        buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i],
                   (unsigned long long)h->counts[i]);
    buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
               (unsigned long long)h->n, name, h->sum, name, (unsigned long long)h->n);
}

/* The egress proxies' counters (net_stats_get: process-wide, kept by the net module). */
static void render_egress(struct buf *b)
{
    struct net_stats st;
    net_stats_get(&st);
    buf_printf(b,
               "# HELP runcell_egress_attempts_total Connections asked of the egress proxy, "
               "by outcome.\n# TYPE runcell_egress_attempts_total counter\n"
               "runcell_egress_attempts_total{result=\"allowed\"} %llu\n"
               "runcell_egress_attempts_total{result=\"refused\"} %llu\n",
               (unsigned long long)st.allowed, (unsigned long long)st.refused);
    buf_printf(b,
               "# HELP runcell_egress_bytes_total Bytes through the egress proxy.\n"
               "# TYPE runcell_egress_bytes_total counter\n"
               "runcell_egress_bytes_total{direction=\"out\"} %llu\n"
               "runcell_egress_bytes_total{direction=\"in\"} %llu\n",
               (unsigned long long)st.bytes_out, (unsigned long long)st.bytes_in);
    buf_printf(b,
               "# HELP runcell_egress_connections_open Connections open through the egress "
               "proxy now.\n# TYPE runcell_egress_connections_open gauge\n"
               "runcell_egress_connections_open %llu\n",
               (unsigned long long)st.active);
    buf_printf(b,
               "# HELP runcell_egress_intercepted_total TLS connections the egress proxy "
               "terminated (hosts with secrets).\n# TYPE runcell_egress_intercepted_total counter\n"
               "runcell_egress_intercepted_total %llu\n"
               "# HELP runcell_egress_secret_requests_total Requests the egress proxy added a "
               "secret to.\n# TYPE runcell_egress_secret_requests_total counter\n"
               "runcell_egress_secret_requests_total %llu\n",
               (unsigned long long)st.intercepted, (unsigned long long)st.secrets_added);
}

char *metrics_render(struct metrics *m, const struct metrics_gauges *g)
{
    struct buf b;
    buf_init(&b, 0);
    pthread_mutex_lock(&m->lock);
    buf_printf(&b,
               "# HELP runcell_sessions_live Sessions currently open.\n"
               "# TYPE runcell_sessions_live gauge\nruncell_sessions_live %zu\n",
               g->live_sessions);
    buf_printf(&b,
               "# HELP runcell_executions_running Executions running now.\n"
               "# TYPE runcell_executions_running gauge\nruncell_executions_running %zu\n",
               g->running_executions);
    buf_printf(&b,
               "# HELP runcell_executions_queued Executions waiting for their turn.\n"
               "# TYPE runcell_executions_queued gauge\nruncell_executions_queued %zu\n",
               g->queued_executions);
    buf_printf(&b,
               "# HELP runcell_pool_ready Sessions made ahead, waiting to be handed out.\n"
               "# TYPE runcell_pool_ready gauge\nruncell_pool_ready %zu\n",
               g->pool_ready);
    buf_printf(&b,
               "# HELP runcell_template_ready_seconds How long the running template took "
               "to become ready; 0 when there is none.\n"
               "# TYPE runcell_template_ready_seconds gauge\n"
               "runcell_template_ready_seconds %.3f\n",
               g->template_ready_ms / 1000.0);
    buf_printf(&b, "# HELP runcell_executions_total Executions finished, by status.\n"
                   "# TYPE runcell_executions_total counter\n");
    for (size_t i = 0; i < N_STATUS; i++)
        buf_printf(&b, "runcell_executions_total{status=\"%s\"} %llu\n",
                   exec_status_name((enum exec_status)i), (unsigned long long)m->executions[i]);
    render_hist(&b, "runcell_execution_duration_seconds", "Wall time of executions.", &m->exec,
                exec_buckets, N_EXEC_B);
    render_hist(&b, "runcell_session_create_duration_seconds",
                "Time to create a session, ready to run.", &m->create, create_buckets, N_CREATE_B);
    buf_printf(&b,
               "# HELP runcell_http_connections_evicted_total Connections without the "
               "token closed to make room for new ones (--max-unauthenticated).\n"
               "# TYPE runcell_http_connections_evicted_total counter\n"
               "runcell_http_connections_evicted_total %llu\n",
               (unsigned long long)g->connections_evicted);
    buf_printf(&b,
               "# HELP runcell_sandbox_failures_total Sandboxes that could not be set up "
               "or served.\n# TYPE runcell_sandbox_failures_total counter\n"
               "runcell_sandbox_failures_total %llu\n",
               (unsigned long long)m->sandbox_failures);
    buf_printf(&b, "# HELP runcell_http_requests_total HTTP requests, by status class.\n"
                   "# TYPE runcell_http_requests_total counter\n");
    for (int c = 1; c <= 5; c++)
        buf_printf(&b, "runcell_http_requests_total{code=\"%dxx\"} %llu\n", c,
                   (unsigned long long)m->requests[c]);
    pthread_mutex_unlock(&m->lock);
    render_egress(&b);
    return buf_detach(&b, NULL);
}
