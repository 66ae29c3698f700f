/* fleet-sim.c - one simulated fleet node for bench/fleet_scale.py: runcell's own node lease
 * and session-record code (src/session/node.c, lease.c) on a real store, without sandboxes.
 *
 * usage: fleet-sim NODE S3_ENDPOINT BUCKET/PREFIX TTL_S SESSIONS SECONDS [PROBE_FILE]
 *
 * Joins the fleet as NODE (a node lease in the store, renewed every ttl/3 by the renewer
 * thread), creates SESSIONS session records owned by it (2 at a time), then holds them for
 * SECONDS (0: until its standard input ends). With PROBE_FILE (session ids, one a line), it is a
 * stray node instead: it tries to take each of those sessions over, spread over SECONDS, as a
 * request routed to the wrong node would (fleet_lease_take without waiting); a take that succeeds
 * is a false takeover. Prints one JSON line at the end: the node lease's counters (renewals,
 * failures, worst gap), how long the records took, and the probes' outcomes. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "session/session.h"
#include "store/store.h"

/* Records created at once: the S3 test server is one process, and a queue of thousands of
 * creates in front of it would hold up every node's renewals past their deadline. */
#define CREATORS 2

struct sim {
    struct fleet *f;
    const char *node;
    long sessions;
    long next;
    long created, failed;
    pthread_mutex_t lock;
};

static void *creator(void *arg)
{
    struct sim *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        long i = s->next < s->sessions ? s->next++ : -1;
        pthread_mutex_unlock(&s->lock);
        if (i < 0)
            return NULL;
        char id[96];
        snprintf(id, sizeof(id), "%s-%024lx", s->node, (unsigned long)i + 1);
        int r = fleet_lease_new(s->f, id, "{\"language\":\"python\"}");
        pthread_mutex_lock(&s->lock);
        if (r == 0)
            s->created++;
        else
            s->failed++;
        pthread_mutex_unlock(&s->lock);
    }
}

static void sleep_ms(uint64_t ms)
{
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Tries each id of file, spread over seconds: counts the outcomes. */
static json_t *probe(struct fleet *f, const char *file, long seconds)
{
    FILE *in = fopen(file, "re");
    char line[256];
    char **ids = xcalloc(1, sizeof(char *));
    long busy = 0, taken = 0, other = 0, n = 0;
    double worst_ms = 0, total_ms = 0;
    if (!in)
        return json_pack("{s:s}", "error", "cannot open the probe file");
    while (fgets(line, sizeof(line), in)) {
        line[strcspn(line, "\n")] = '\0';
        if (*line)
            ids = strv_push(ids, line);
    }
    fclose(in);
    size_t count = strv_len(ids);
    uint64_t start = now_ms(), span = (uint64_t)seconds * 1000;
    for (size_t i = 0; i < count; i++) {
        uint64_t at = start + span * i / (count ? count : 1);
        if (now_ms() < at)
            sleep_ms(at - now_ms());
        json_t *rec = NULL;
        double t0 = now_ms_f();
        int r = fleet_lease_take(f, ids[i], false, &rec);
        double ms = now_ms_f() - t0;
        total_ms += ms;
        worst_ms = ms > worst_ms ? ms : worst_ms;
        n++;
        if (r == 0) {
            taken++; /* a false takeover: its owner is alive and renews */
            fprintf(stderr, "fleet-sim: FALSE TAKEOVER of %s\n", ids[i]);
            fleet_lease_taken(f, ids[i]);
            json_decref(rec);
        } else if (r == -EBUSY) {
            busy++;
        } else {
            other++;
            fprintf(stderr, "fleet-sim: probe of %s: %s\n", ids[i], err_msg());
        }
    }
    strv_free(ids);
    return json_pack("{s:I,s:I,s:I,s:I,s:f,s:f}", "probes", (json_int_t)n, "refused_owner_alive",
                     (json_int_t)busy, "false_takeovers", (json_int_t)taken, "errors",
                     (json_int_t)other, "probe_ms_mean", n ? total_ms / (double)n : 0.0,
                     "probe_ms_worst", worst_ms);
}

int main(int argc, char **argv)
{
    if (argc < 7) {
        fprintf(stderr, "usage: fleet-sim NODE S3_ENDPOINT BUCKET/PREFIX TTL_S SESSIONS SECONDS "
                        "[PROBE_FILE]\n");
        return 2;
    }
    struct sim s = {.node = argv[1], .sessions = atol(argv[5])};
    long seconds = atol(argv[6]);
    _cleanup_free_ char *url = xasprintf("s3://%s", argv[3]);
    struct store_config sc = {.url = url, .s3_endpoint = argv[2], .s3_region = "us-east-1"};
    struct store *st;
    pthread_mutex_init(&s.lock, NULL);
    if (store_open(&sc, &st) < 0 ||
        fleet_new(st, s.node, "127.0.0.1:1", (uint64_t)(atof(argv[4]) * 1000), -1, &s.f) < 0 ||
        fleet_start(s.f, NULL) < 0) {
        fprintf(stderr, "fleet-sim %s: %s\n", s.node, err_msg());
        return 1;
    }
    while (!fleet_admitting(s.f, NULL))
        sleep_ms(50);
    double t0 = now_ms_f();
    pthread_t th[CREATORS];
    for (int i = 0; i < CREATORS; i++)
        pthread_create(&th[i], NULL, creator, &s);
    for (int i = 0; i < CREATORS; i++)
        pthread_join(th[i], NULL);
    double create_s = (now_ms_f() - t0) / 1000.0;
    printf("{\"node\":\"%s\",\"ready\":true}\n", s.node);
    fflush(stdout);
    json_t *probes = argc > 7 ? probe(s.f, argv[7], seconds) : NULL;
    if (!probes && seconds) {
        sleep_ms((uint64_t)seconds * 1000);
    } else if (!probes) {
        char buf[256];
        while (read(0, buf, sizeof(buf)) > 0)
            ;
    }
    json_t *out =
        json_pack("{s:s,s:o,s:I,s:I,s:f,s:o*}", "node", s.node, "lease", fleet_health(s.f),
                  "records_created", (json_int_t)s.created, "records_failed", (json_int_t)s.failed,
                  "records_seconds", create_s, "probes", probes);
    char *text = json_dumps(out, JSON_COMPACT);
    printf("%s\n", text);
    free(text);
    json_decref(out);
    fleet_free(s.f);
    store_free(st);
    return 0;
}
