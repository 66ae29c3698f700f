/* test-fleet.c - unit tests for a fleet node's lease (src/session/node.c, lease.c) on a local
 * directory store: joining, the fence's steps at their times while the store hangs (its
 * compare-and-swap lock held here), joining again at a new epoch, and who may take a session. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "runner.h"
#include "session/session.h"
#include "store/store.h"

#define TTL_MS 3000

struct steps {
    pthread_mutex_t lock;
    uint64_t at[FENCE_LIFTED + 1];
    int n;
};

static void on_fence(void *ctx, enum fleet_fence_step step)
{
    struct steps *s = ctx;
    pthread_mutex_lock(&s->lock);
    s->at[step] = now_ms();
    s->n++;
    pthread_mutex_unlock(&s->lock);
}

static struct store *open_store(char **ret_dir)
{
    char tmpl[] = "/tmp/runcell-unit-fleet-XXXXXX";
    CHECK(mkdtemp(tmpl) != NULL);
    *ret_dir = xstrdup(tmpl);
    struct store *st;
    struct store_config sc = {.url = tmpl};
    CHECK(store_open(&sc, &st) == 0);
    return st;
}

static void wait_for(struct fleet *f, bool admitting)
{
    uint64_t end = now_ms() + 20000;
    while (fleet_admitting(f, NULL) != admitting && now_ms() < end)
        usleep(10000);
    CHECK(fleet_admitting(f, NULL) == admitting);
}

static long long epoch_of(struct fleet *f)
{
    json_t *h = fleet_health(f);
    long long e = json_integer_value(json_object_get(h, "epoch"));
    json_decref(h);
    return e;
}

TEST(a_hung_store_fences_the_node_in_steps_before_its_lease_ends_then_it_rejoins)
{
    char *dir;
    struct store *st = open_store(&dir);
    struct fleet *f;
    struct steps s = {.lock = PTHREAD_MUTEX_INITIALIZER};
    CHECK(fleet_new(st, "unit-a", "127.0.0.1:1", TTL_MS, -1, &f) == 0);
    struct fleet_hooks hooks = {.fence = on_fence, .ctx = &s};
    CHECK(fleet_start(f, &hooks) == 0);
    wait_for(f, true);
    CHECK(epoch_of(f) == 1);
    CHECK(fleet_lease_new(f, "unit-a-01", "{}") == 0);
    CHECK(fleet_lease_state(f, "unit-a-01") == 0);
    /* The store hangs: its compare-and-swap lock is held, so a renewal never returns (a
     * directory store has no deadline). The fence thread acts all the same. */
    _cleanup_free_ char *lock_path = xasprintf("%s/.cas-lock", dir);
    int lock = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    CHECK(lock >= 0 && flock(lock, LOCK_EX) == 0);
    uint64_t held = now_ms();
    wait_for(f, false);
    const char *why = NULL;
    CHECK(!fleet_admitting(f, &why) && strstr(why, "this node is fenced"));
    CHECK(fleet_lease_state(f, "unit-a-01") == -ENOLCK);
    uint64_t end = now_ms() + 20000;
    while (now_ms() < end) {
        pthread_mutex_lock(&s.lock);
        bool dropped = s.at[FENCE_DROP] != 0;
        pthread_mutex_unlock(&s.lock);
        if (dropped)
            break;
        usleep(10000);
    }
    /* In order, each before the hard deadline (at most ttl - 1 s after the last renewal,
     * which came before the lock was taken). */
    CHECK(s.at[FENCE_BEGIN] && s.at[FENCE_KILL] && s.at[FENCE_DROP]);
    CHECK(s.at[FENCE_BEGIN] < s.at[FENCE_KILL] && s.at[FENCE_KILL] < s.at[FENCE_DROP]);
    CHECK(s.at[FENCE_DROP] < held + TTL_MS - FLEET_CLOCK_SKEW_MS);
    CHECK(fleet_lease_state(f, "unit-a-01") == -EXDEV); /* dropped: held no more */
    /* The store answers again: the late renewal does not count; the node joins again. */
    flock(lock, LOCK_UN);
    close(lock);
    wait_for(f, true);
    CHECK(epoch_of(f) == 2);
    /* Its session, recorded at epoch 1, is this node's to take back. */
    struct fleet_owner o;
    CHECK(fleet_lookup(f, "unit-a-01", true, &o) == 0);
    CHECK(o.kind == OWNER_TAKEABLE);
    json_t *rec = NULL;
    CHECK(fleet_lease_take(f, "unit-a-01", false, &rec) == 0);
    CHECK(json_integer_value(json_object_get(rec, "generation")) == 2);
    CHECK(json_integer_value(json_object_get(rec, "epoch")) == 2);
    json_decref(rec);
    fleet_lease_taken(f, "unit-a-01");
    fleet_free(f);
    store_free(st);
    _cleanup_free_ char *cmd = xasprintf("rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    free(dir);
}

TEST(a_live_owner_keeps_its_sessions_and_a_released_one_gives_them_up)
{
    char *dir;
    struct store *st = open_store(&dir);
    struct fleet *a, *b;
    CHECK(fleet_new(st, "unit-a", "127.0.0.1:1", TTL_MS, -1, &a) == 0);
    CHECK(fleet_new(st, "unit-b", "127.0.0.1:2", TTL_MS, -1, &b) == 0);
    CHECK(fleet_start(a, NULL) == 0 && fleet_start(b, NULL) == 0);
    wait_for(a, true);
    wait_for(b, true);
    CHECK(fleet_lease_new(a, "unit-a-02", "{}") == 0);
    struct fleet_owner o;
    CHECK(fleet_lookup(b, "unit-a-02", false, &o) == 0);
    CHECK(o.kind == OWNER_REMOTE && !strcmp(o.node, "unit-a") && !strcmp(o.address, "127.0.0.1:1"));
    json_t *rec = NULL;
    CHECK(fleet_lease_take(b, "unit-a-02", false, &rec) == -EBUSY); /* no false takeover */
    CHECK(fleet_lookup(a, "unit-a-02", false, &o) == 0 && o.kind == OWNER_HERE);
    /* A graceful stop releases the session and the node lease: taken at once. */
    fleet_lease_release(a, "unit-a-02", "stopped", NULL);
    fleet_free(a);
    CHECK(fleet_lease_take(b, "unit-a-02", false, &rec) == 0);
    CHECK(!strcmp(json_string_value(json_object_get(rec, "previous_node")), "unit-a"));
    json_decref(rec);
    fleet_lease_taken(b, "unit-a-02");
    CHECK(fleet_lookup(b, "unit-a-02", false, &o) == 0 && o.kind == OWNER_HERE);
    fleet_free(b);
    store_free(st);
    _cleanup_free_ char *cmd = xasprintf("rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    free(dir);
}

int main(int argc, char **argv)
{
    return run_tests(argc, argv);
}
