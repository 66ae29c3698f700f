/* procs.c - a session's programs beside its cells: started in its kernel's sandbox through
 * the exec channel (sandbox_exec), their output read by one thread per session as it comes
 * and kept in a bounded ring for readers that come and go, their stdin fed on request, their
 * timeouts enforced, their end said. What a program writes is hostile input: every read is
 * bounded, and so is what is kept of it. */
#include "session/session-int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#define PROC_CHUNK        (64u << 10) /* one read of a program's pipe */
#define PROC_READS_A_TURN 16          /* reads of one pipe before the others get a turn */
#define ITEM_COALESCE_MAX (64u << 10)
#define PROCS_NICE        5 /* as a session's other work in the daemon (session.c) */

struct item {
    enum proc_item_type type;
    char *data;
    size_t len;
    bool sealed; /* a reader has it: nothing more is added to it */
};

struct proc_watch {
    struct session_proc *p;
    struct reader_watch rw;
};

struct session_proc {
    atomic_int refs;
    int pid;
    json_t *info;
    /* The pump thread's alone (and session_proc_start's before it is listed). */
    int out_fd, err_fd, status_fd;
    char status_line[64];
    size_t status_len;
    bool got_status;
    int wstatus_exit, wstatus_signal; /* as the status line said */
    uint64_t read_bytes;              /* of both streams, in all */
    bool over_output;                 /* SESSION_PROC_OUTPUT_MAX was read: no more is */
    uint64_t deadline_ms;             /* monotonic; 0: none */
    bool kill_sent;
    /* Its stdin: one writer at a time, apart from lock (a write may wait). */
    pthread_mutex_t in_lock;
    int in_fd;
    /* The kept items, readers' wake-ups and its end. */
    pthread_mutex_t lock;
    struct item *items; /* items[head .. head + count) */
    size_t head, count, cap;
    uint64_t first_seq, last_seq; /* of the first item kept, and of the last */
    size_t kept_bytes;
    uint64_t dropped_bytes;
    bool ended;
    struct session_proc_end end;
    struct wakers readers;
};

struct session_procs {
    struct session *s;
    pthread_mutex_t lock;
    struct session_proc *running[SESSION_PROCS_MAX]; /* oldest first */
    size_t n_running;
    size_t n_starting; /* places taken by programs being started */
    struct session_proc *ended[SESSION_PROCS_KEEP_ENDED]; /* oldest first */
    size_t n_ended;
    int wake_fd; /* eventfd: a program was added, or the table goes */
    pthread_t thread;
    bool thread_started;
    bool stopping;
};

/* ---- one program's items ---- */

static void notify_locked(struct session_proc *p)
{
    wakers_notify(&p->readers);
}

static void evict_locked(struct session_proc *p)
{
    /* the last item stays: a reader always finds where the program is */
    while ((p->kept_bytes > SESSION_PROC_KEEP_BYTES || p->count > SESSION_PROC_KEEP_ITEMS) &&
           p->count > 1) {
        struct item *it = &p->items[p->head];
        p->kept_bytes -= it->len;
        p->dropped_bytes += it->len;
        free(it->data);
        p->head++;
        p->count--;
        p->first_seq++;
    }
}

static void keep_locked(struct session_proc *p, enum proc_item_type type, const char *data,
                        size_t len)
{
    struct item *last = p->count ? &p->items[p->head + p->count - 1] : NULL;
    bool stream = type == PROC_STDOUT || type == PROC_STDERR;
    if (stream && last && last->type == type && !last->sealed &&
        last->len + len <= ITEM_COALESCE_MAX) {
        last->data = xrealloc(last->data, last->len + len + 1);
        memcpy(last->data + last->len, data, len);
        last->len += len;
        last->data[last->len] = '\0';
    } else {
        if (p->head + p->count == p->cap) {
            if (p->head) {
                memmove(p->items, p->items + p->head, p->count * sizeof(*p->items));
                p->head = 0;
            } else {
                p->cap = p->cap ? 2 * p->cap : 16;
                p->items = xrealloc(p->items, p->cap * sizeof(*p->items));
            }
        }
        struct item *it = &p->items[p->head + p->count++];
        *it = (struct item){.type = type, .len = len, .data = xmalloc(len + 1)};
        if (len)
            memcpy(it->data, data, len);
        it->data[len] = '\0';
        p->last_seq++;
    }
    p->kept_bytes += len;
    evict_locked(p);
    notify_locked(p);
}

static void keep(struct session_proc *p, enum proc_item_type type, const char *data, size_t len)
{
    pthread_mutex_lock(&p->lock);
    keep_locked(p, type, data, len);
    pthread_mutex_unlock(&p->lock);
}

size_t session_proc_read(struct session_proc *p, uint64_t after, struct proc_item *items,
                         size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&p->lock);
    if (max && after + 1 < p->first_seq) {
        /* what this reader had not read yet was dropped to keep the ring's bound */
        char *msg = xasprintf("\n[runcell: output was dropped before it was read: only the "
                              "last %u KiB of a program's output is kept (%llu bytes "
                              "dropped so far)]\n",
                              SESSION_PROC_KEEP_BYTES >> 10, (unsigned long long)p->dropped_bytes);
        items[n++] = (struct proc_item){
            .seq = p->first_seq - 1, .type = PROC_DROPPED, .data = msg, .len = strlen(msg)};
        after = p->first_seq - 1;
    }
    for (uint64_t seq = after + 1; seq <= p->last_seq && n < max; seq++) {
        struct item *it = &p->items[p->head + (seq - p->first_seq)];
        it->sealed = true;
        items[n] = (struct proc_item){.seq = seq, .type = it->type, .len = it->len};
        items[n].data = xmalloc(it->len + 1);
        memcpy(items[n].data, it->data, it->len + 1);
        n++;
    }
    pthread_mutex_unlock(&p->lock);
    return n;
}

void proc_items_release(struct proc_item *items, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(items[i].data);
        items[i].data = NULL;
    }
}

uint64_t session_proc_last_seq(struct session_proc *p)
{
    pthread_mutex_lock(&p->lock);
    uint64_t v = p->last_seq;
    /* a reader starting after it gets what comes next in later items, not added to it */
    if (p->count)
        p->items[p->head + p->count - 1].sealed = true;
    pthread_mutex_unlock(&p->lock);
    return v;
}

bool session_proc_ended(struct session_proc *p, struct session_proc_end *ret)
{
    pthread_mutex_lock(&p->lock);
    bool ended = p->ended;
    if (ended && ret)
        *ret = p->end;
    pthread_mutex_unlock(&p->lock);
    return ended;
}

/* ---- references, readers ---- */

struct session_proc *session_proc_ref(struct session_proc *p)
{
    atomic_fetch_add(&p->refs, 1);
    return p;
}

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

void session_proc_unref(struct session_proc *p)
{
    if (!p || atomic_fetch_sub(&p->refs, 1) != 1)
        return;
    for (size_t i = 0; i < p->count; i++)
        free(p->items[p->head + i].data);
    free(p->items);
    close_fd(&p->out_fd);
    close_fd(&p->err_fd);
    close_fd(&p->status_fd);
    close_fd(&p->in_fd);
    json_decref(p->info);
    pthread_mutex_destroy(&p->lock);
    pthread_mutex_destroy(&p->in_lock);
    free(p);
}

int session_proc_pid(const struct session_proc *p)
{
    return p->pid;
}

json_t *session_proc_info(const struct session_proc *p)
{
    return p->info;
}

int session_proc_watch(struct session_proc *p, struct proc_watch **ret)
{
    struct proc_watch *w = xcalloc(1, sizeof(*w));
    int r = reader_watch_open(&w->rw, &p->lock, &p->readers);
    if (r < 0) {
        free(w);
        return r == -EAGAIN ? err_set(EAGAIN, "process %d has its maximum of %d readers", p->pid,
                                      SESSION_PROC_WATCHERS_MAX)
                            : err_set(-r, "cannot make an eventfd: %s", strerror(-r));
    }
    w->p = session_proc_ref(p);
    *ret = w;
    return 0;
}

int proc_watch_fd(const struct proc_watch *w)
{
    return w->rw.fd;
}

void proc_watch_clear(struct proc_watch *w)
{
    waker_clear(w->rw.fd);
}

void proc_watch_free(struct proc_watch *w)
{
    if (!w)
        return;
    reader_watch_close(&w->rw);
    session_proc_unref(w->p);
    free(w);
}

/* ---- stdin ---- */

int session_proc_input(struct session_proc *p, const void *data, size_t n)
{
    pthread_mutex_lock(&p->in_lock);
    int r = 0;
    double deadline = now_ms_f() + SESSION_PROC_INPUT_WAIT_MS;
    const char *d = data;
    if (p->in_fd < 0)
        r = err_set(EBADF,
                    "process %d has no stdin to write to (start it with stdin, and "
                    "before closing it)",
                    p->pid);
    while (r == 0 && n) {
        ssize_t w = write(p->in_fd, d, n);
        if (w > 0) {
            d += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EPIPE) {
            r = err_set(EPIPE, "process %d no longer reads its stdin", p->pid);
            break;
        }
        if (w < 0 && errno != EAGAIN && errno != EINTR) {
            r = err_set(errno, "cannot write to the stdin of process %d: %s", p->pid,
                        strerror(errno));
            break;
        }
        struct pollfd pfd = {.fd = p->in_fd, .events = POLLOUT};
        double left = deadline - now_ms_f();
        if (left <= 0 || poll(&pfd, 1, (int)left + 1) == 0)
            r = err_set(EAGAIN,
                        "process %d took none of its stdin for %d s; what was written "
                        "before stays written",
                        p->pid, SESSION_PROC_INPUT_WAIT_MS / 1000);
    }
    pthread_mutex_unlock(&p->in_lock);
    return r;
}

int session_proc_close_input(struct session_proc *p)
{
    pthread_mutex_lock(&p->in_lock);
    int r = p->in_fd >= 0 ? 0 : err_set(EBADF, "process %d has no stdin open", p->pid);
    close_fd(&p->in_fd);
    pthread_mutex_unlock(&p->in_lock);
    return r;
}

/* ---- the table and its thread ---- */

struct session_procs *session_procs_new(struct session *s)
{
    struct session_procs *ps = xcalloc(1, sizeof(*ps));
    ps->s = s;
    pthread_mutex_init(&ps->lock, NULL);
    ps->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    return ps;
}

static void wake(struct session_procs *ps)
{
    uint64_t one = 1;
    (void)!write(ps->wake_fd, &one, sizeof(one));
}

/* p is over: what its pipes still hold (it is gone: nothing more comes from it, and what a
 * child left holding them is not waited for), then its end. The pump thread's. */
static void finish(struct session_proc *p, bool lost)
{
    char buf[PROC_CHUNK];
    int fds[2] = {p->out_fd, p->err_fd};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 1024 && fds[k] >= 0 && !p->over_output; i++) {
            ssize_t n = read(fds[k], buf, sizeof(buf));
            if (n <= 0)
                break;
            keep(p, k ? PROC_STDERR : PROC_STDOUT, buf, (size_t)n);
        }
    close_fd(&p->out_fd);
    close_fd(&p->err_fd);
    close_fd(&p->status_fd);
    pthread_mutex_lock(&p->lock);
    p->ended = true;
    p->end = (struct session_proc_end){.exited = !lost && !p->wstatus_signal,
                                       .exit_code = p->wstatus_exit,
                                       .signal = p->wstatus_signal,
                                       .timed_out = p->kill_sent,
                                       .lost = lost};
    keep_locked(p, PROC_END, "", 0);
    pthread_mutex_unlock(&p->lock);
    /* nobody writes its stdin any more */
    pthread_mutex_lock(&p->in_lock);
    close_fd(&p->in_fd);
    pthread_mutex_unlock(&p->in_lock);
}

/* Moves ended program i from running to ended (ps->lock held). */
static void retire_locked(struct session_procs *ps, size_t i)
{
    struct session_proc *p = ps->running[i];
    memmove(&ps->running[i], &ps->running[i + 1], (ps->n_running - i - 1) * sizeof(p));
    ps->n_running--;
    if (ps->n_ended == SESSION_PROCS_KEEP_ENDED) {
        session_proc_unref(ps->ended[0]);
        memmove(&ps->ended[0], &ps->ended[1], (ps->n_ended - 1) * sizeof(p));
        ps->n_ended--;
    }
    ps->ended[ps->n_ended++] = p;
}

/* Reads what one pipe holds (PROC_READS_A_TURN chunks at most); false at EOF. */
static bool pump_pipe(struct session_proc *p, int *fd, enum proc_item_type type)
{
    char buf[PROC_CHUNK];
    for (int i = 0; i < PROC_READS_A_TURN; i++) {
        ssize_t n = read(*fd, buf, sizeof(buf));
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return true;
        if (n <= 0) {
            close_fd(fd);
            return false;
        }
        keep(p, type, buf, (size_t)n);
        p->read_bytes += (uint64_t)n;
        if (p->read_bytes >= SESSION_PROC_OUTPUT_MAX) {
            p->over_output = true;
            char *msg = xasprintf("\n[runcell: process %d wrote more than %llu MiB; the rest of "
                                  "its output is not read]\n",
                                  p->pid, (unsigned long long)(SESSION_PROC_OUTPUT_MAX >> 20));
            keep(p, PROC_STDERR, msg, strlen(msg));
            free(msg);
            return true;
        }
    }
    return true;
}

/* The status line ("exit N", "signal N"): true once it is known or the pipe ended without
 * one (then p->got_status says which). */
static bool pump_status(struct session_proc *p)
{
    size_t room = sizeof(p->status_line) - 1 - p->status_len;
    ssize_t n = room ? read(p->status_fd, p->status_line + p->status_len, room) : 0;
    if (n < 0)
        return errno != EAGAIN && errno != EINTR;
    p->status_len += (size_t)n;
    p->status_line[p->status_len] = '\0';
    int v;
    if (!strchr(p->status_line, '\n') && n > 0)
        return false; /* a line is coming */
    /* the spawner is the sandbox user's: its line is taken only as a number in range */
    if (sscanf(p->status_line, "exit %d", &v) == 1 && v >= 0 && v <= 255) {
        p->got_status = true;
        p->wstatus_exit = v;
    } else if (sscanf(p->status_line, "signal %d", &v) == 1 && v > 0 && v < 65) {
        p->got_status = true;
        p->wstatus_signal = v;
    }
    return true;
}

struct signal_req {
    int pid, sig;
};

static int send_signal(struct sandbox *sb, void *ctx)
{
    struct signal_req *q = ctx;
    return sandbox_exec_signal(sb, q->pid, q->sig);
}

/* Kills the programs past their deadline; the next deadline (UINT64_MAX: none). */
static uint64_t enforce_deadlines(struct session_procs *ps)
{
    uint64_t now = now_ms(), next = UINT64_MAX;
    int due[SESSION_PROCS_MAX];
    size_t n_due = 0;
    pthread_mutex_lock(&ps->lock);
    for (size_t i = 0; i < ps->n_running; i++) {
        struct session_proc *p = ps->running[i];
        if (!p->deadline_ms || p->kill_sent)
            continue;
        if (p->deadline_ms <= now) {
            p->kill_sent = true;
            due[n_due++] = p->pid;
        } else if (p->deadline_ms < next) {
            next = p->deadline_ms;
        }
    }
    pthread_mutex_unlock(&ps->lock);
    for (size_t i = 0; i < n_due; i++) {
        struct signal_req q = {.pid = due[i], .sig = SIGKILL};
        (void)session_with_sandbox(ps->s, send_signal, &q);
    }
    return next;
}

struct watched {
    struct session_proc *p;
    int which; /* 0 stdout, 1 stderr, 2 status */
};

static void lower_priority(void)
{
    errno = 0;
    int base = getpriority(PRIO_PROCESS, (id_t)gettid());
    if (!errno)
        (void)setpriority(PRIO_PROCESS, (id_t)gettid(),
                          base + PROCS_NICE > 19 ? 19 : base + PROCS_NICE);
}

static void *pump_main(void *arg)
{
    struct session_procs *ps = arg;
    struct pollfd pfd[1 + 3 * SESSION_PROCS_MAX];
    struct watched what[1 + 3 * SESSION_PROCS_MAX];
    lower_priority();
    for (;;) {
        uint64_t next = enforce_deadlines(ps);
        size_t n = 0;
        pthread_mutex_lock(&ps->lock);
        if (ps->stopping) {
            pthread_mutex_unlock(&ps->lock);
            break;
        }
        pfd[n++] = (struct pollfd){.fd = ps->wake_fd, .events = POLLIN};
        for (size_t i = 0; i < ps->n_running; i++) {
            struct session_proc *p = ps->running[i];
            int fds[3] = {p->over_output ? -1 : p->out_fd, p->over_output ? -1 : p->err_fd,
                          p->status_fd};
            for (int k = 0; k < 3; k++)
                if (fds[k] >= 0) {
                    what[n] = (struct watched){p, k};
                    pfd[n++] = (struct pollfd){.fd = fds[k], .events = POLLIN};
                }
        }
        pthread_mutex_unlock(&ps->lock);
        uint64_t now = now_ms();
        int timeout = next == UINT64_MAX ? -1 : next <= now ? 0 : (int)MIN(next - now, 60000);
        if (poll(pfd, n, timeout) < 0 && errno != EINTR)
            continue;
        uint64_t v;
        (void)!read(ps->wake_fd, &v, sizeof(v));
        /* the pipes before the status: what a program wrote before it ended is read first */
        for (size_t i = 1; i < n; i++) {
            struct session_proc *p = what[i].p;
            if (!pfd[i].revents || what[i].which == 2)
                continue;
            if (what[i].which == 0)
                pump_pipe(p, &p->out_fd, PROC_STDOUT);
            else
                pump_pipe(p, &p->err_fd, PROC_STDERR);
        }
        for (size_t i = 1; i < n; i++) {
            struct session_proc *p = what[i].p;
            if (pfd[i].revents && what[i].which == 2 && pump_status(p))
                close_fd(&p->status_fd);
        }
        pthread_mutex_lock(&ps->lock);
        for (size_t i = ps->n_running; i-- > 0;) {
            struct session_proc *p = ps->running[i];
            /* Its status said how it ended: what its pipes hold now is the rest (a child it
             * left may hold them open: not waited for). Its status pipe closed without a word
             * (the spawner was killed): it may still run, so its output is read to the end. */
            bool pipes_open = (p->out_fd >= 0 || p->err_fd >= 0) && !p->over_output;
            if (p->status_fd >= 0 || (!p->got_status && pipes_open))
                continue;
            finish(p, !p->got_status);
            retire_locked(ps, i);
        }
        pthread_mutex_unlock(&ps->lock);
    }
    return NULL;
}

void session_procs_free(struct session_procs *ps)
{
    if (!ps)
        return;
    pthread_mutex_lock(&ps->lock);
    ps->stopping = true;
    pthread_mutex_unlock(&ps->lock);
    wake(ps);
    if (ps->thread_started)
        pthread_join(ps->thread, NULL);
    for (size_t i = 0; i < ps->n_running; i++) {
        finish(ps->running[i], !ps->running[i]->got_status);
        session_proc_unref(ps->running[i]);
    }
    for (size_t i = 0; i < ps->n_ended; i++)
        session_proc_unref(ps->ended[i]);
    if (ps->wake_fd >= 0)
        close(ps->wake_fd);
    pthread_mutex_destroy(&ps->lock);
    free(ps);
}

/* ---- starting one ---- */

/* env with each of over's KEY=VALUE in place of (or after) env's own; a fresh vector. */
static char **env_over(char *const *env, char *const *over)
{
    char **v = xcalloc(1, sizeof(char *));
    for (char *const *e = env; e && *e; e++) {
        size_t klen = strcspn(*e, "=");
        bool replaced = false;
        for (char *const *o = over; o && *o && !replaced; o++)
            replaced = !strncmp(*o, *e, klen) && (*o)[klen] == '=';
        if (!replaced)
            v = strv_push(v, *e);
    }
    for (char *const *o = over; o && *o; o++)
        v = strv_push(v, *o);
    return v;
}

struct exec_req {
    struct sandbox_exec x;
    int pid;
};

static int do_exec(struct sandbox *sb, void *ctx)
{
    struct exec_req *q = ctx;
    return sandbox_exec(sb, &q->x, &q->pid);
}

static int check_spec(const struct session_proc_spec *spec)
{
    if (!spec->argv || !spec->argv[0] || !*spec->argv[0])
        return err_set(EINVAL, "no program to run");
    if (spec->cwd && spec->cwd[0] != '/')
        return err_set(EINVAL, "the working directory '%.200s' is not an absolute path", spec->cwd);
    for (char *const *o = spec->env; o && *o; o++)
        if (!strchr(*o, '=') || **o == '=')
            return err_set(EINVAL, "'%.100s' is not an environment entry KEY=VALUE", *o);
    return 0;
}

/* Takes a place for a program being started: -EAGAIN when the table is full. */
static int reserve(struct session_procs *ps)
{
    pthread_mutex_lock(&ps->lock);
    int r = ps->stopping ? err_set(ESHUTDOWN, "the session is closed")
            : ps->n_running + ps->n_starting >= SESSION_PROCS_MAX
                ? err_set(EAGAIN,
                          "the sandbox runs its maximum of %d processes started this way; kill "
                          "one (commands.kill) or wait for one to end",
                          SESSION_PROCS_MAX)
                : 0;
    if (r == 0)
        ps->n_starting++;
    pthread_mutex_unlock(&ps->lock);
    return r;
}

/* Gives back the place reserve took, filled with p (NULL: not), and starts the thread. */
static int settle(struct session_procs *ps, struct session_proc *p)
{
    int r = 0;
    pthread_mutex_lock(&ps->lock);
    ps->n_starting--;
    if (p)
        ps->running[ps->n_running++] = p;
    if (p && !ps->thread_started) {
        int e = pthread_create(&ps->thread, NULL, pump_main, ps);
        ps->thread_started = e == 0;
        if (e)
            r = err_set(e, "cannot start the thread that reads processes: %s", strerror(e));
    }
    pthread_mutex_unlock(&ps->lock);
    wake(ps);
    return r;
}

static struct session_proc *proc_new(int pid, const struct session_proc_spec *spec)
{
    struct session_proc *p = xcalloc(1, sizeof(*p));
    atomic_init(&p->refs, 1);
    pthread_mutex_init(&p->lock, NULL);
    pthread_mutex_init(&p->in_lock, NULL);
    p->pid = pid;
    p->info = spec->info ? json_incref(spec->info) : json_object();
    p->first_seq = 1;
    p->out_fd = p->err_fd = p->status_fd = p->in_fd = -1;
    if (spec->timeout_ms)
        p->deadline_ms = now_ms() + spec->timeout_ms;
    return p;
}

int session_proc_start(struct session *s, const struct session_proc_spec *spec,
                       struct session_proc **ret)
{
    int out[2] = {-1, -1}, err[2] = {-1, -1}, st[2] = {-1, -1}, in[2] = {-1, -1};
    char **base = NULL, **env = NULL;
    struct session_proc *p = NULL;
    int r = check_spec(spec);
    struct session_procs *ps = r < 0 ? NULL : session_procs_of(s, true);
    if (r < 0)
        return r;
    if (!ps)
        return err_set(ESHUTDOWN, "the session is closed");
    if ((r = session_wake(s)) < 0) /* a paused session's processes come back first */
        return r;
    if ((r = reserve(ps)) < 0)
        return r;
    if (pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0 || pipe2(st, O_CLOEXEC) < 0 ||
        (spec->stdin_pipe ? pipe2(in, O_CLOEXEC)
                          : (in[0] = open("/dev/null", O_RDONLY | O_CLOEXEC))) < 0) {
        r = err_set(errno, "cannot make a process's pipes: %s", strerror(errno));
        goto out;
    }
    base = session_env(s);
    env = env_over(base, spec->env);
    struct exec_req q = {.x = {.argv = spec->argv,
                               .env = env,
                               .cwd = spec->cwd ? spec->cwd : session_options(s)->home_dir,
                               .stdin_fd = in[0],
                               .stdout_fd = out[1],
                               .stderr_fd = err[1],
                               .status_fd = st[1]}};
    if ((r = session_with_sandbox(s, do_exec, &q)) < 0)
        goto out;
    p = proc_new(q.pid, spec);
    p->out_fd = TAKE_FD(out[0]);
    p->err_fd = TAKE_FD(err[0]);
    p->status_fd = TAKE_FD(st[0]);
    p->in_fd = TAKE_FD(in[1]);
    fd_set_nonblock(p->out_fd, true);
    fd_set_nonblock(p->err_fd, true);
    fd_set_nonblock(p->status_fd, true);
    if (p->in_fd >= 0)
        fd_set_nonblock(p->in_fd, true);
out:;
    /* the table's reference is p's first; the caller's is taken on success */
    int settled = settle(ps, p);
    if (r == 0 && settled < 0)
        r = settled; /* listed, but no thread reads it: it ends with the session */
    else if (r == 0)
        *ret = session_proc_ref(p);
    int *all[] = {out, err, st, in};
    for (size_t i = 0; i < ARRAY_SIZE(all); i++) {
        close_fd(&all[i][0]);
        close_fd(&all[i][1]);
    }
    strv_free(base);
    strv_free(env);
    return r;
}

/* ---- finding them ---- */

struct session_proc *session_proc_find(struct session *s, int pid)
{
    struct session_procs *ps = session_procs_of(s, false);
    struct session_proc *found = NULL;
    if (!ps)
        return NULL;
    pthread_mutex_lock(&ps->lock);
    for (size_t i = 0; i < ps->n_running && !found; i++)
        if (ps->running[i] && ps->running[i]->pid == pid)
            found = session_proc_ref(ps->running[i]);
    /* the newest ended one first: a pid the sandbox gave again is the later program's */
    for (size_t i = ps->n_ended; i-- > 0 && !found;)
        if (ps->ended[i]->pid == pid)
            found = session_proc_ref(ps->ended[i]);
    pthread_mutex_unlock(&ps->lock);
    return found;
}

size_t session_procs_running(struct session *s, struct session_proc **ret, size_t max)
{
    struct session_procs *ps = session_procs_of(s, false);
    size_t n = 0;
    if (!ps)
        return 0;
    pthread_mutex_lock(&ps->lock);
    for (size_t i = 0; i < ps->n_running && n < max; i++)
        if (ps->running[i])
            ret[n++] = session_proc_ref(ps->running[i]);
    pthread_mutex_unlock(&ps->lock);
    return n;
}

int session_proc_signal(struct session *s, struct session_proc *p, int sig)
{
    if (session_proc_ended(p, NULL))
        return err_set(ESRCH, "process %d has ended", p->pid);
    struct signal_req q = {.pid = p->pid, .sig = sig};
    return session_with_sandbox(s, send_signal, &q);
}
