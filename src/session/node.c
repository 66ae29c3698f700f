/* node.c - a fleet node's membership: one lease in the store (nodes/NODE.json) renewed by a
 * thread of its own, the fence a node puts up when it cannot renew (before its lease can
 * expire), and the watchdog process that kills a node that could not fence itself. */
#include "session/fleet-int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define NODE_RECORD_MAX (16u << 10)
#define RETRY_MAX_MS    500
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif

/* ---- the timeline of one lease ----
 *
 * A renewal sent at S (now_ms()) writes an expiry of the wall clock at S + ttl. Other nodes
 * take the node's sessions once their own wall clock passes that expiry plus the skew
 * allowance. The node itself keeps to S + ttl - skew, its hard deadline, and fences before:
 * at hard - G it stops admitting work and interrupts running cells, at hard - G/2 it kills
 * those still running, at hard - G/3 it drops every session. The watchdog kills it at hard
 * when it has not dropped them by then. A renewal counts only when its answer arrives
 * before hard: a later one may have landed after another node read the lease as expired. */

static uint64_t hard_ms(const struct fleet *f)
{
    return f->sent_ms + f->ttl_ms - FLEET_CLOCK_SKEW_MS;
}

static uint64_t grace_ms(const struct fleet *f)
{
    return MIN(3000, (f->ttl_ms - FLEET_CLOCK_SKEW_MS) / 3);
}

static uint64_t step_at(const struct fleet *f, int step)
{
    uint64_t g = grace_ms(f);
    switch (step) {
    case FENCE_BEGIN:
        return hard_ms(f) - g;
    case FENCE_KILL:
        return hard_ms(f) - g / 2;
    default:
        return hard_ms(f) - g / 3;
    }
}

static char *node_key(const char *node)
{
    return xasprintf("nodes/%s.json", node);
}

/* ---- the watchdog ---- */

/* "arm DEADLINE" (now_ms() time), or "disarm" for a deadline of 0. */
static void watchdog_say(struct fleet *f, unsigned long long deadline)
{
    char line[64];
    if (f->watchdog_fd < 0)
        return;
    int n = deadline ? snprintf(line, sizeof(line), "arm %llu\n", deadline)
                     : snprintf(line, sizeof(line), "disarm\n");
    /* One short line: a pipe takes it whole or not at all (O_NONBLOCK); the watchdog reads
     * what is there before it decides anything. */
    if (write(f->watchdog_fd, line, (size_t)n) != n)
        log_warn("msg=\"cannot tell the watchdog\" error=%s", log_quote(strerror(errno)));
}

/* The watchdog's loop: "arm MS" sets the deadline (now_ms() time), "disarm" clears it; at the
 * deadline the parent is killed; at EOF (the parent is gone) it ends. */
static __attribute__((noreturn)) void watchdog_main(int fd, int parent_pidfd, pid_t parent)
{
    uint64_t deadline = 0;
    char buf[512];
    size_t have = 0;
    for (;;) {
        uint64_t now = now_ms();
        int timeout = deadline ? (deadline > now ? (int)MIN(deadline - now, 60000) : 0) : -1;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int pr = poll(&pfd, 1, timeout);
        if (pr < 0 && errno != EINTR)
            _exit(1);
        if (pr > 0) {
            ssize_t n = read(fd, buf + have, sizeof(buf) - 1 - have);
            if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
                _exit(0); /* the node is gone, and its sandboxes with it */
            have += n > 0 ? (size_t)n : 0;
            buf[have] = '\0';
            char *line = buf, *nl;
            while ((nl = strchr(line, '\n'))) {
                *nl = '\0';
                if (!strncmp(line, "arm ", 4))
                    deadline = strtoull(line + 4, NULL, 10);
                else if (!strcmp(line, "disarm"))
                    deadline = 0;
                line = nl + 1;
            }
            have = strlen(line);
            memmove(buf, line, have + 1);
            if (have == sizeof(buf) - 1)
                have = 0; /* not from the node */
            continue;     /* what else is there is read before the deadline is looked at */
        }
        if (deadline && now_ms() >= deadline) {
            fprintf(stderr,
                    "runcell watchdog: the node's fleet lease reached its hard deadline before "
                    "the node fenced itself (stopped or hung): killing it (pid %d), and its "
                    "sandboxes with it, before another node may take its sessions\n",
                    (int)parent);
            if (parent_pidfd < 0 || syscall(SYS_pidfd_send_signal, parent_pidfd, SIGKILL, NULL, 0))
                kill(parent, SIGKILL);
            _exit(0);
        }
    }
}

int fleet_watchdog_spawn(int *ret_fd)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0)
        return err_set(errno, "cannot make the watchdog's pipe: %s", strerror(errno));
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(p[0]);
        close(p[1]);
        return err_set(e, "cannot start the fleet watchdog: %s", strerror(e));
    }
    if (pid == 0) {
        /* Nothing of the node's is needed here but the pipe: the node is single-threaded
         * still, so the fork is safe. It ignores the signals a terminal or a stop sends the
         * node's group, and ends when the node's end of the pipe closes. */
        int pidfd = (int)syscall(SYS_pidfd_open, parent, 0);
        close(p[1]);
        signal(SIGINT, SIG_IGN);
        signal(SIGTERM, SIG_IGN);
        signal(SIGHUP, SIG_IGN);
        sigset_t all;
        sigemptyset(&all);
        sigprocmask(SIG_SETMASK, &all, NULL);
        prctl(PR_SET_NAME, "runcell-watchdog");
        if (getppid() != parent)
            _exit(0);
        watchdog_main(p[0], pidfd, parent);
    }
    close(p[0]);
    fcntl(p[1], F_SETFL, O_NONBLOCK);
    *ret_fd = p[1];
    return 0;
}

/* ---- the hooks ---- */

static void call_hook(struct fleet *f, enum fleet_fence_step step)
{
    pthread_mutex_lock(&f->hook_lock);
    if (!f->hooks_off && f->hooks.fence)
        f->hooks.fence(f->hooks.ctx, step);
    pthread_mutex_unlock(&f->hook_lock);
}

static void set_why(struct fleet *f, const char *msg)
{
    free(f->why);
    f->why = msg ? xstrdup(msg) : NULL;
}

/* ---- the renewer: joining, renewing ---- */

/* The node's record as written at wall clock now (the renewal's send time). */
static char *node_record(struct fleet *f, long long epoch, const char *state, uint64_t wall)
{
    json_t *j = json_pack(
        "{s:s,s:s,s:s,s:s,s:I,s:s,s:s,s:I,s:I,s:I}", "node", f->node, "instance", f->instance,
        "owner", f->owner, "boot_id", f->boot_id, "epoch", (json_int_t)epoch, "state", state,
        "advertise", f->advertise, "ttl_ms", (json_int_t)f->ttl_ms, "expires_ms",
        (json_int_t)(strcmp(state, "live") ? 0 : wall + f->ttl_ms), "renewed_ms", (json_int_t)wall);
    char *text = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    return text;
}

/* After the answer to a write sent at sent: the lease counts from sent. Holds f->lock. */
static void counted_locked(struct fleet *f, uint64_t sent, const char *nv, long long epoch,
                           bool renewal)
{
    /* Between renewals of one holding: a join after a lapse starts afresh. */
    if (renewal && sent - f->sent_ms > f->worst_gap_ms)
        f->worst_gap_ms = sent - f->sent_ms;
    f->renewals++;
    f->sent_ms = sent;
    f->epoch = epoch;
    memcpy(f->version, nv, STORE_VERSION_SIZE);
    f->have_version = true;
    f->retry_at_ms = 0;
    set_why(f, NULL);
    watchdog_say(f, hard_ms(f));
    pthread_cond_broadcast(&f->wake);
}

static void failed_locked(struct fleet *f, const char *msg)
{
    f->failures++;
    /* Said once per distinct failure: a store away for minutes is not a line per retry. */
    if (f->state != NODE_LIVE && (!f->why || strcmp(f->why, msg)))
        log_warn("msg=\"cannot join the fleet yet\" node=%s error=%s", f->node, log_quote(msg));
    set_why(f, msg);
    f->retry_at_ms = now_ms() + MIN(RETRY_MAX_MS, f->ttl_ms / 10);
}

/* Whether a record read for this node's name lets this process take it now; else how long
 * to wait (*ret_wait_ms). */
static bool free_to_join(struct fleet *f, json_t *rec, uint64_t *ret_wait_ms)
{
    const char *state = json_string_value(json_object_get(rec, "state"));
    const char *inst = json_string_value(json_object_get(rec, "instance"));
    const char *owner = json_string_value(json_object_get(rec, "owner"));
    const char *boot = json_string_value(json_object_get(rec, "boot_id"));
    uint64_t expires = (uint64_t)json_integer_value(json_object_get(rec, "expires_ms"));
    uint64_t now = now_realtime_ms();
    *ret_wait_ms = 0;
    if (!state || strcmp(state, "live") || (inst && !strcmp(inst, f->instance)))
        return true;
    /* This node's earlier process, on this boot of this host, and gone: nothing of it runs. */
    if (boot && owner && !strcmp(boot, f->boot_id) && !owner_alive(owner))
        return true;
    if (now >= expires + FLEET_CLOCK_SKEW_MS)
        return true;
    *ret_wait_ms = expires + FLEET_CLOCK_SKEW_MS - now;
    return false;
}

static void join_once(struct fleet *f)
{
    _cleanup_free_ char *key = node_key(f->node);
    char *text = NULL, version[STORE_VERSION_SIZE], nv[STORE_VERSION_SIZE];
    size_t n;
    json_t *rec = NULL;
    long long epoch = 1;
    uint64_t wait = 0;
    store_thread_deadline(now_ms() + f->ttl_ms / 3);
    int r = store_get_versioned(f->store, key, NODE_RECORD_MAX, &text, &n, version);
    if (r == 0 && !(rec = json_loadb(text, n, 0, NULL)))
        r = err_set(EBADMSG, "%s in the store is not JSON", key);
    free(text);
    if (r == 0) {
        epoch = json_integer_value(json_object_get(rec, "epoch")) + 1;
        if (!free_to_join(f, rec, &wait)) {
            const char *owner = json_string_value(json_object_get(rec, "owner"));
            _cleanup_free_ char *msg =
                xasprintf("joining the fleet: node %s's lease is held by another process (%s), "
                          "which renews it or has not let it expire yet (%.1f s left)",
                          f->node, owner ? owner : "?", (double)wait / 1000.0);
            json_decref(rec);
            store_thread_deadline(0);
            pthread_mutex_lock(&f->lock);
            failed_locked(f, msg);
            f->retry_at_ms = now_ms() + MIN(wait + 1, f->ttl_ms / 3);
            pthread_mutex_unlock(&f->lock);
            return;
        }
        json_decref(rec);
    } else if (r != -ENOENT) {
        store_thread_deadline(0);
        pthread_mutex_lock(&f->lock);
        failed_locked(f, err_msg());
        pthread_mutex_unlock(&f->lock);
        return;
    }
    uint64_t sent = now_ms();
    _cleanup_free_ char *body = node_record(f, epoch, "live", now_realtime_ms());
    store_thread_deadline(sent + f->ttl_ms / 3);
    r = store_put_if(f->store, key, body, strlen(body), r == 0 ? version : NULL, nv);
    store_thread_deadline(0);
    pthread_mutex_lock(&f->lock);
    if (r == 0 && !f->stopping) {
        f->state = NODE_LIVE;
        f->fence_step = 0;
        counted_locked(f, sent, nv, epoch, false);
        log_info("msg=\"node joined the fleet\" node=%s epoch=%lld advertise=%s lease_ttl_ms=%llu",
                 f->node, epoch, f->advertise, (unsigned long long)f->ttl_ms);
    } else if (r < 0) {
        failed_locked(f, err_msg());
    }
    pthread_mutex_unlock(&f->lock);
}

/* The lease was lost (another process holds the name now, or an answer came too late):
 * fences all the way at once, then joins again. */
static void lapse(struct fleet *f, const char *why)
{
    pthread_mutex_lock(&f->lock);
    bool dropped = f->state != NODE_LIVE || f->fence_step >= FENCE_DROP;
    f->state = NODE_LAPSED;
    f->fence_step = FENCE_DROP;
    set_why(f, why);
    pthread_mutex_unlock(&f->lock);
    if (!dropped) {
        log_warn("msg=\"node lease lost; dropping every session\" node=%s reason=%s", f->node,
                 log_quote(why));
        call_hook(f, FENCE_BEGIN);
        call_hook(f, FENCE_KILL);
        call_hook(f, FENCE_DROP);
        fleet_leases_free(f);
    }
    watchdog_say(f, 0);
}

static void renew_once(struct fleet *f)
{
    _cleanup_free_ char *key = node_key(f->node);
    char version[STORE_VERSION_SIZE], nv[STORE_VERSION_SIZE];
    pthread_mutex_lock(&f->lock);
    long long epoch = f->epoch;
    uint64_t hard = hard_ms(f);
    memcpy(version, f->version, STORE_VERSION_SIZE);
    pthread_mutex_unlock(&f->lock);
    uint64_t sent = now_ms();
    _cleanup_free_ char *body = node_record(f, epoch, "live", now_realtime_ms());
    store_thread_deadline(MIN(sent + f->ttl_ms / 3, hard));
    int r = store_put_if(f->store, key, body, strlen(body), version, nv);
    store_thread_deadline(0);
    uint64_t answered = now_ms();
    if (r == -ESTALE) {
        lapse(f, "another process took this node's name in the store (is --node unique?)");
        return;
    }
    pthread_mutex_lock(&f->lock);
    if (r == 0 && (answered >= hard || f->state != NODE_LIVE)) {
        /* Too late to count: keep the version, and join again at a new epoch. */
        memcpy(f->version, nv, STORE_VERSION_SIZE);
        pthread_mutex_unlock(&f->lock);
        lapse(f, "the store answered a renewal after the lease's hard deadline");
        return;
    }
    if (r < 0) {
        _cleanup_free_ char *msg = xasprintf("cannot renew the node lease: %s", err_msg());
        failed_locked(f, msg);
        log_warn("msg=\"cannot renew the node lease\" node=%s lease_ms_left=%lld error=%s", f->node,
                 (long long)hard - (long long)answered, log_quote(err_msg()));
        pthread_mutex_unlock(&f->lock);
        return;
    }
    int step = f->fence_step;
    f->fence_step = 0;
    counted_locked(f, sent, nv, epoch, true);
    pthread_mutex_unlock(&f->lock);
    if (step) {
        log_info("msg=\"node lease renewed in time; fence lifted\" node=%s epoch=%lld", f->node,
                 epoch);
        call_hook(f, FENCE_LIFTED);
    }
}

static void *renewer_main(void *arg)
{
    struct fleet *f = arg;
    pthread_mutex_lock(&f->lock);
    while (!f->stopping) {
        uint64_t now = now_ms(), at;
        if (f->state != NODE_LIVE)
            at = f->retry_at_ms;
        else if (f->retry_at_ms)
            at = f->retry_at_ms;
        else
            at = f->sent_ms + f->ttl_ms / 3;
        if (at > now) {
            struct timespec ts;
            realtime_after_ms(&ts, at - now);
            pthread_cond_timedwait(&f->wake, &f->lock, &ts);
            continue;
        }
        bool joining = f->state != NODE_LIVE;
        pthread_mutex_unlock(&f->lock);
        if (joining)
            join_once(f);
        else
            renew_once(f);
        pthread_mutex_lock(&f->lock);
    }
    pthread_mutex_unlock(&f->lock);
    return NULL;
}

/* ---- the fence thread ---- */

static void *fencer_main(void *arg)
{
    struct fleet *f = arg;
    pthread_mutex_lock(&f->lock);
    while (!f->stopping) {
        if (f->state != NODE_LIVE || f->fence_step >= FENCE_DROP) {
            pthread_cond_wait(&f->wake, &f->lock);
            continue;
        }
        int next = f->fence_step + 1;
        uint64_t at = step_at(f, next), now = now_ms();
        if (now < at) {
            struct timespec ts;
            realtime_after_ms(&ts, at - now);
            pthread_cond_timedwait(&f->wake, &f->lock, &ts);
            continue;
        }
        f->fence_step = next;
        if (next == FENCE_DROP)
            f->state = NODE_LAPSED; /* before the drop: a renewal answered now does not count */
        long long left = (long long)hard_ms(f) - (long long)now;
        pthread_mutex_unlock(&f->lock);
        static const char *const what[] = {
            [FENCE_BEGIN] = "refusing new work and interrupting running cells",
            [FENCE_KILL] = "killing the cells still running",
            [FENCE_DROP] = "dropping every session",
        };
        log_warn("msg=\"node lease not renewed: fencing\" node=%s step=\"%s\" lease_ms_left=%lld",
                 f->node, what[next], left);
        call_hook(f, (enum fleet_fence_step)next);
        if (next == FENCE_DROP) {
            fleet_leases_free(f);
            watchdog_say(f, 0);
        }
        pthread_mutex_lock(&f->lock);
    }
    pthread_mutex_unlock(&f->lock);
    return NULL;
}

/* ---- what others ask ---- */

bool fleet_admitting(struct fleet *f, const char **ret_why)
{
    static _Thread_local char why[512];
    pthread_mutex_lock(&f->lock);
    uint64_t now = now_ms();
    bool ok = f->state == NODE_LIVE && f->fence_step == 0 && now < step_at(f, FENCE_BEGIN);
    if (!ok && ret_why) {
        if (f->state == NODE_JOINING)
            snprintf(why, sizeof(why), "this node has not joined the fleet yet: %s",
                     f->why ? f->why : "taking its lease in the store");
        else
            snprintf(why, sizeof(why),
                     "this node is fenced: it could not renew its lease in the store in time "
                     "(%s), so it runs nothing and writes nothing until it can",
                     f->why ? f->why : "no answer");
        *ret_why = why;
    }
    pthread_mutex_unlock(&f->lock);
    return ok;
}

json_t *fleet_health(struct fleet *f)
{
    pthread_mutex_lock(&f->lock);
    static const char *const names[] = {"joining", "live", "lapsed"};
    const char *state = f->state == NODE_LIVE && f->fence_step ? "fencing" : names[f->state];
    long long left = f->state == NODE_LIVE ? (long long)hard_ms(f) - (long long)now_ms() : 0;
    json_t *j = json_pack("{s:s,s:I,s:s,s:I,s:s?,s:I,s:I,s:I,s:I}", "node", f->node, "epoch",
                          (json_int_t)(f->state == NODE_LIVE ? f->epoch : 0), "state", state,
                          "lease_ms_left", (json_int_t)(left > 0 ? left : 0), "store_error", f->why,
                          "lease_ttl_ms", (json_int_t)f->ttl_ms, "renewals",
                          (json_int_t)f->renewals, "renewal_failures", (json_int_t)f->failures,
                          "worst_renewal_gap_ms", (json_int_t)f->worst_gap_ms);
    pthread_mutex_unlock(&f->lock);
    return j;
}

long long fleet_epoch(struct fleet *f)
{
    pthread_mutex_lock(&f->lock);
    long long e = f->state == NODE_LIVE ? f->epoch : 0;
    pthread_mutex_unlock(&f->lock);
    return e;
}

static void view_parse(struct node_view *v, json_t *rec)
{
    const char *state = json_string_value(json_object_get(rec, "state"));
    const char *addr = json_string_value(json_object_get(rec, "advertise"));
    v->present = true;
    v->released = !state || strcmp(state, "live");
    v->epoch = json_integer_value(json_object_get(rec, "epoch"));
    v->expires_ms = (uint64_t)json_integer_value(json_object_get(rec, "expires_ms"));
    snprintf(v->address, sizeof(v->address), "%s", addr ? addr : "");
}

int fleet_node_view(struct fleet *f, const char *node, bool fresh, struct node_view *ret)
{
    uint64_t now = now_ms();
    pthread_mutex_lock(&f->lock);
    struct node_view *v = f->views;
    while (v && strcmp(v->name, node))
        v = v->next;
    if (v && !fresh && now - v->read_at < f->ttl_ms / 6) {
        *ret = *v;
        pthread_mutex_unlock(&f->lock);
        return 0;
    }
    pthread_mutex_unlock(&f->lock);
    _cleanup_free_ char *key = node_key(node);
    char *text = NULL;
    size_t n;
    struct node_view nv = {.read_at = now};
    snprintf(nv.name, sizeof(nv.name), "%s", node);
    int r = store_get_buf(f->store, key, NODE_RECORD_MAX, &text, &n);
    if (r < 0 && r != -ENOENT)
        return r;
    if (r == 0) {
        json_t *rec = json_loadb(text, n, 0, NULL);
        free(text);
        if (!json_is_object(rec)) {
            json_decref(rec);
            return err_set(EBADMSG, "%s in the store is not a JSON object", key);
        }
        view_parse(&nv, rec);
        json_decref(rec);
    }
    pthread_mutex_lock(&f->lock);
    for (v = f->views; v && strcmp(v->name, node); v = v->next)
        ;
    if (!v) {
        v = xcalloc(1, sizeof(*v));
        v->next = f->views;
        f->views = v;
    }
    struct node_view *next = v->next;
    *v = nv;
    v->next = next;
    pthread_mutex_unlock(&f->lock);
    *ret = nv;
    return 0;
}

/* ---- life ---- */

static char *own_owner_id(void)
{
    _cleanup_free_ char *stat = NULL;
    unsigned long long start = 0;
    if (read_file("/proc/self/stat", 4096, &stat, NULL) == 0) {
        const char *p = strrchr(stat, ')');
        /* field 22, starttime; p is at the end of field 2 */
        for (int field = 2; p && field < 22; field++)
            p = strchr(p + 1, ' ');
        if (p)
            start = strtoull(p + 1, NULL, 10);
    }
    return xasprintf("%d-%llu", getpid(), start);
}

static char *own_boot_id(void)
{
    char *text = NULL;
    if (read_file("/proc/sys/kernel/random/boot_id", 64, &text, NULL) < 0)
        return xstrdup("unknown");
    text[strcspn(text, "\n")] = '\0';
    return text;
}

int fleet_new(struct store *st, const char *node, const char *advertise, uint64_t ttl_ms,
              int watchdog_fd, struct fleet **ret)
{
    if (!node_name_valid(node))
        return err_set(EINVAL,
                       "node name '%s' is not a short DNS label (1 to %d of a-z, 0-9 and '-', "
                       "not starting or ending with '-')",
                       node ? node : "", NODE_NAME_MAX);
    if (ttl_ms < FLEET_MIN_TTL_MS)
        return err_set(EINVAL,
                       "a lease ttl under %d ms leaves no time to renew it and to fence the node "
                       "before it expires (a %d ms clock skew allowance comes off it)",
                       FLEET_MIN_TTL_MS, FLEET_CLOCK_SKEW_MS);
    if (!advertise || !*advertise || strlen(advertise) >= sizeof(((struct node_view *)0)->address))
        return err_set(EINVAL, "--advertise '%s' is not HOST:PORT", advertise ? advertise : "");
    int r = store_check_conditional(st, node);
    if (r < 0)
        return r;
    struct fleet *f = xcalloc(1, sizeof(*f));
    f->store = st;
    f->node = xstrdup(node);
    f->instance = random_hex(8);
    f->owner = own_owner_id();
    f->boot_id = own_boot_id();
    f->advertise = xstrdup(advertise);
    f->ttl_ms = ttl_ms;
    f->watchdog_fd = watchdog_fd;
    f->state = NODE_JOINING;
    pthread_mutex_init(&f->lock, NULL);
    pthread_mutex_init(&f->hook_lock, NULL);
    pthread_cond_init(&f->wake, NULL);
    pthread_cond_init(&f->taken, NULL);
    *ret = f;
    return 0;
}

int fleet_start(struct fleet *f, const struct fleet_hooks *hooks)
{
    if (hooks)
        f->hooks = *hooks;
    join_once(f); /* most nodes join at once; the renewer tries again otherwise */
    int r = pthread_create(&f->renewer, NULL, renewer_main, f);
    if (r)
        return err_set(r, "cannot start the lease renewer: %s", strerror(r));
    if ((r = pthread_create(&f->fencer, NULL, fencer_main, f))) {
        pthread_mutex_lock(&f->lock);
        f->stopping = true;
        pthread_cond_broadcast(&f->wake);
        pthread_mutex_unlock(&f->lock);
        pthread_join(f->renewer, NULL);
        return err_set(r, "cannot start the fence thread: %s", strerror(r));
    }
    f->running = true;
    return 0;
}

const char *fleet_node(const struct fleet *f)
{
    return f->node;
}

uint64_t fleet_ttl_ms(const struct fleet *f)
{
    return f->ttl_ms;
}

void fleet_quiesce(struct fleet *f)
{
    if (!f)
        return;
    pthread_mutex_lock(&f->hook_lock);
    f->hooks_off = true;
    pthread_mutex_unlock(&f->hook_lock);
}

void fleet_stop(struct fleet *f)
{
    if (!f || !f->running)
        return;
    pthread_mutex_lock(&f->lock);
    f->stopping = true;
    pthread_cond_broadcast(&f->wake);
    pthread_mutex_unlock(&f->lock);
    pthread_join(f->renewer, NULL);
    pthread_join(f->fencer, NULL);
    f->running = false;
    /* Released, its sessions (released each as "stopped" already) and its name are free. */
    if (f->state == NODE_LIVE && f->fence_step == 0) {
        _cleanup_free_ char *key = node_key(f->node);
        _cleanup_free_ char *body = node_record(f, f->epoch, "released", now_realtime_ms());
        char nv[STORE_VERSION_SIZE];
        store_thread_deadline(now_ms() + f->ttl_ms / 3);
        if (store_put_if(f->store, key, body, strlen(body), f->version, nv) < 0)
            log_warn("msg=\"cannot release the node lease\" node=%s error=%s", f->node,
                     log_quote(err_msg()));
        store_thread_deadline(0);
    }
    watchdog_say(f, 0);
}

void fleet_free(struct fleet *f)
{
    if (!f)
        return;
    fleet_stop(f);
    fleet_leases_free(f);
    while (f->views) {
        struct node_view *v = f->views;
        f->views = v->next;
        free(v);
    }
    if (f->watchdog_fd >= 0)
        close(f->watchdog_fd);
    pthread_cond_destroy(&f->wake);
    pthread_cond_destroy(&f->taken);
    pthread_mutex_destroy(&f->hook_lock);
    pthread_mutex_destroy(&f->lock);
    free(f->why);
    free(f->why_copy);
    free(f->instance);
    free(f->owner);
    free(f->boot_id);
    free(f->advertise);
    free(f->node);
    free(f);
}
