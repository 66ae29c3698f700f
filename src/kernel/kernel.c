/* kernel.c - starting the Python kernel in a sandbox and speaking its framed protocol. */
#include "kernel/kernel-int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define FRAME_HEADER 5

static void frame_header(unsigned char hdr[FRAME_HEADER], char kind, size_t n)
{
    uint32_t len = htonl((uint32_t)n);
    memcpy(hdr, &len, 4);
    hdr[4] = (unsigned char)kind;
}

/* The interrupt frame (I, no payload), written without waiting: five bytes on a stream
 * socket go whole or not at all. Called with write_lock held. */
static void send_interrupt_frame(struct kernel *k)
{
    unsigned char hdr[FRAME_HEADER];
    frame_header(hdr, 'I', 0);
    (void)!send(k->chan_fd, hdr, sizeof(hdr), MSG_NOSIGNAL);
}

/* One request frame, waiting for room until deadline_ms: a large cell is more than the
 * socket holds, and the kernel reads it as it comes. */
static int send_frame(struct kernel *k, char kind, const char *payload, size_t n,
                      double deadline_ms)
{
    unsigned char hdr[FRAME_HEADER];
    frame_header(hdr, kind, n);
    struct iovec iov[2] = {{.iov_base = hdr, .iov_len = sizeof(hdr)},
                           {.iov_base = (void *)payload, .iov_len = n}};
    pthread_mutex_lock(&k->write_lock);
    pthread_mutex_lock(&k->owed_lock);
    k->writing_request = true;
    pthread_mutex_unlock(&k->owed_lock);
    int r = sendv_all_by(k->chan_fd, iov, 2, deadline_ms);
    /* Decided under owed_lock: an interrupt either finds the request still being written
     * and leaves its frame and signal to this writer, or finds it done and sends them. */
    pthread_mutex_lock(&k->owed_lock);
    k->writing_request = false;
    bool owed = k->interrupt_owed && r == 0;
    k->interrupt_owed = false;
    pthread_mutex_unlock(&k->owed_lock);
    if (owed)
        send_interrupt_frame(k);
    pthread_mutex_unlock(&k->write_lock);
    if (owed && k->sb)
        sandbox_signal(k->sb, SIGINT);
    return r;
}

int kernel_send_execute(struct kernel *k, const char *code, const char *lang, long execution_count,
                        uint64_t timeout_ms)
{
    /* sync: this daemon answers the kernel's sync messages (KEV_SYNC) while the cell runs. */
    json_t *req = json_pack("{s:s,s:s,s:s,s:I,s:b}", "type", "execute", "code", code, "lang", lang,
                            "execution_count", (json_int_t)execution_count, "sync", 1);
    if (!req)
        return err_set(EINVAL, "the code is not valid UTF-8 text");
    char *text = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    size_t n = strlen(text);
    if (n > KERNEL_MAX_FRAME) {
        free(text);
        return err_set(E2BIG,
                       "the cell is %zu bytes as a request; the kernel takes at most "
                       "%u MiB",
                       n, KERNEL_MAX_FRAME >> 20);
    }
    int r = send_frame(k, 'M', text, n, now_ms_f() + (double)timeout_ms);
    free(text);
    if (r == -ETIMEDOUT)
        return err_set(ETIMEDOUT, "the kernel took no more of the cell (%zu bytes) for %llu ms", n,
                       (unsigned long long)timeout_ms);
    if (r < 0)
        return err_set(-r, "cannot send the cell to the kernel: %s", strerror(-r));
    return 0;
}

static const struct json_bounds msg_bounds = {
    .max_depth = KERNEL_MSG_MAX_DEPTH,
    .max_values = KERNEL_MSG_MAX_VALUES,
    .max_string = KERNEL_MSG_MAX_STRING,
};

int kernel_message_parse(const char *p, size_t n, json_t **ret, size_t *ret_values)
{
    struct json_shape shape;
    if (json_measure(p, n, &msg_bounds, &shape) < 0) {
        if (shape.depth > KERNEL_MSG_MAX_DEPTH)
            return err_set(E2BIG, "a message of %zu bytes nests deeper than %d levels", n,
                           KERNEL_MSG_MAX_DEPTH);
        if (shape.values > KERNEL_MSG_MAX_VALUES)
            return err_set(E2BIG, "a message of %zu bytes holds more than %d JSON values", n,
                           KERNEL_MSG_MAX_VALUES);
        return err_set(E2BIG, "a message holds a string longer than %u MiB",
                       KERNEL_MSG_MAX_STRING >> 20);
    }
    json_error_t jerr;
    json_t *msg = json_loadb(p, n, 0, &jerr);
    if (!msg || !json_is_object(msg)) {
        json_decref(msg);
        return err_set(EPROTO, "kernel sent a malformed message: %s",
                       msg ? "not an object" : jerr.text);
    }
    *ret = msg;
    *ret_values = shape.values;
    return 0;
}

/* A message type to its event; display needs its data object too. */
static const struct {
    const char *type;
    enum kernel_event_type ev;
} msg_types[] = {
    {"display", KEV_DISPLAY},     {"done", KEV_DONE},
    {"hello", KEV_HELLO},         {"checkpoint_done", KEV_REPLY},
    {"restore_done", KEV_REPLY},  {"sync", KEV_SYNC},
    {"set_home_done", KEV_REPLY}, {"start_shell_done", KEV_REPLY},
    {"history_done", KEV_REPLY},  {"undo_done", KEV_REPLY},
};

static int handle_message(const char *p, size_t n, kernel_event_fn cb, void *ctx)
{
    struct kernel_event ev = {.data = p, .len = n};
    json_t *msg;
    int r = kernel_message_parse(p, n, &msg, &ev.values);
    if (r == -E2BIG) {
        const char *why = err_msg();
        struct kernel_event lim = {.type = KEV_LIMIT, .data = why, .len = strlen(why)};
        cb(ctx, &lim);
        return 0;
    }
    if (r < 0)
        return r;
    const char *type = json_string_value(json_object_get(msg, "type"));
    size_t i = 0;
    while (type && i < ARRAY_SIZE(msg_types) && strcmp(type, msg_types[i].type))
        i++;
    if (!type)
        r = err_set(EPROTO, "kernel sent a malformed message: no type");
    else if (i == ARRAY_SIZE(msg_types) ||
             (msg_types[i].ev == KEV_DISPLAY && !json_is_object(json_object_get(msg, "data"))))
        r = err_set(EPROTO, "kernel sent an unexpected message '%.80s'", type);
    if (!r) {
        ev.type = msg_types[i].ev;
        ev.msg = msg;
        cb(ctx, &ev);
    }
    json_decref(msg);
    return r;
}

static int handle_frame(char kind, const char *p, size_t n, kernel_event_fn cb, void *ctx)
{
    if (kind == 'O' || kind == 'E') {
        struct kernel_event ev = {
            .type = kind == 'O' ? KEV_STDOUT : KEV_STDERR, .data = p, .len = n};
        cb(ctx, &ev);
        return 0;
    }
    if (kind != 'M')
        return err_set(EPROTO, "kernel sent an unknown frame kind 0x%02x", (unsigned char)kind);
    return handle_message(p, n, cb, ctx);
}

int kernel_frames_parse(struct buf *in, kernel_event_fn cb, void *ctx)
{
    size_t off = 0;
    int r = 0;
    while (in->len - off >= FRAME_HEADER) {
        uint32_t len;
        memcpy(&len, in->data + off, 4);
        len = ntohl(len);
        if (len > KERNEL_MAX_FRAME) {
            r = err_set(EPROTO, "kernel frame of %u bytes exceeds the %u MiB limit", len,
                        KERNEL_MAX_FRAME >> 20);
            break;
        }
        if (in->len - off - FRAME_HEADER < len)
            break;
        r = handle_frame(in->data[off + 4], in->data + off + FRAME_HEADER, len, cb, ctx);
        if (r < 0)
            break;
        off += FRAME_HEADER + len;
    }
    memmove(in->data, in->data + off, in->len - off);
    in->len -= off;
    /* One large frame must not keep its buffer for the kernel's whole life. */
    if (!in->len && in->alloc > (1u << 20))
        buf_release(in);
    return r;
}

int kernel_pump_channel(struct kernel *k, kernel_event_fn cb, void *ctx)
{
    char chunk[65536];
    ssize_t n = read(k->chan_fd, chunk, sizeof(chunk));
    if (n < 0)
        return errno == EAGAIN || errno == EINTR ? 0 : 1;
    if (n == 0)
        return 1;
    if (buf_append(&k->in, chunk, (size_t)n) < 0)
        return err_set(EPROTO, "kernel frame larger than %u MiB", KERNEL_MAX_FRAME >> 20);
    return kernel_frames_parse(&k->in, cb, ctx);
}

int kernel_pump_pipe(struct kernel *k, int stream, kernel_event_fn cb, void *ctx)
{
    char chunk[65536];
    int fd = stream == 1 ? k->out_fd : k->err_fd;
    ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n < 0)
        return errno == EINTR ? 0 : errno == EAGAIN ? 2 : 1;
    if (n == 0)
        return 1;
    struct kernel_event ev = {
        .type = stream == 1 ? KEV_STDOUT : KEV_STDERR, .data = chunk, .len = (size_t)n};
    cb(ctx, &ev);
    return 0;
}

struct hello_wait {
    struct kernel *k;
    bool got;
};

static void on_hello(void *ctx, const struct kernel_event *ev)
{
    struct hello_wait *w = ctx;
    if (ev->type != KEV_HELLO)
        return;
    w->got = true;
    const char *v = json_string_value(json_object_get(ev->msg, "python"));
    free(w->k->python_version);
    w->k->python_version = xstrdup(v ? v : "");
}

uint64_t kernel_start_wait_ms(uint64_t start_timeout_ms, uint64_t cpus_milli)
{
    if (!cpus_milli || cpus_milli >= 1000)
        return start_timeout_ms;
    uint64_t scale_milli = 1000 * 1000 / cpus_milli;
    if (scale_milli > KERNEL_START_SCALE_MAX * 1000)
        scale_milli = KERNEL_START_SCALE_MAX * 1000;
    return start_timeout_ms * scale_milli / 1000;
}

/* Waits for the hello; kernel output before it (import warnings) goes to the log. */
static int wait_hello(struct kernel *k, uint64_t timeout_ms)
{
    struct hello_wait w = {.k = k};
    double deadline = now_ms_f() + (double)timeout_ms;
    while (!w.got) {
        double left = deadline - now_ms_f();
        if (left <= 0)
            return err_set(ETIMEDOUT, "the kernel did not start within %llu ms",
                           (unsigned long long)timeout_ms);
        struct pollfd pfd[2] = {{.fd = k->chan_fd, .events = POLLIN},
                                {.fd = sandbox_status_fd(k->sb), .events = POLLIN}};
        if (poll(pfd, 2, (int)left + 1) < 0 && errno != EINTR)
            return -errno;
        if (pfd[1].revents)
            sandbox_poll_status(k->sb);
        if (pfd[0].revents) {
            int r = kernel_pump_channel(k, on_hello, &w);
            if (r < 0)
                return r;
            if (r == 1 && !w.got) {
                sandbox_wait(k->sb);
                struct sandbox_outcome end;
                sandbox_outcome(k->sb, &end);
                if (end.error)
                    return err_set(EIO, "sandbox setup failed: %s", end.error);
                return err_set(EIO, "the kernel exited while starting (%s %d)",
                               end.signal ? "signal" : "status",
                               end.signal ? end.signal : end.exit_code);
            }
        }
    }
    return 0;
}

static void close_fds(int *fds, int n)
{
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

/* env with its HOME= entry made home's (a fresh vector: caller frees). */
static char **env_with_home(char *const *env, const char *home)
{
    _cleanup_free_ char *entry = xasprintf("HOME=%s", home);
    char **v = xcalloc(1, sizeof(char *));
    for (char *const *e = env; e && *e; e++)
        v = strv_push(v, strncmp(*e, "HOME=", 5) ? *e : entry);
    return v;
}

int kernel_start(struct sandbox_host *host, struct workspace *ws,
                 const struct sandbox_limits *limits, char *const *args, uint64_t start_timeout_ms,
                 const struct kernel_env *extra, struct kernel **ret)
{
    struct kernel *k = xcalloc(1, sizeof(*k));
    int sp[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
    _cleanup_close_ int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    _cleanup_strv_ char **env = sandbox_default_env();
    _cleanup_free_ char *kernel_dir = xasprintf("%s/kernel", host->libexec_dir);
    /* Declared before the first goto: a jump past the initialisation of a cleanup variable
     * would free an indeterminate pointer on the way out. */
    _cleanup_strv_ char **argv = NULL;
    int r;

    k->chan_fd = k->out_fd = k->err_fd = -1;
    pthread_mutex_init(&k->write_lock, NULL);
    pthread_mutex_init(&k->owed_lock, NULL);
    buf_init(&k->in, KERNEL_MAX_FRAME + 4096);
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0 || pipe2(out, O_CLOEXEC) < 0 ||
        pipe2(err, O_CLOEXEC) < 0) {
        r = err_set(errno, "cannot create the kernel's channels: %s", strerror(errno));
        goto fail;
    }
    bool js = extra && extra->javascript;
    argv = xcalloc(1, sizeof(char *));
    if (js) {
        /* --expose-internals: Node's REPL rewriter of top-level await (see kernel.js). */
        argv = strv_push(argv, "/usr/bin/node");
        argv = strv_push(argv, "--expose-internals");
        argv = strv_push(argv, "/.runcell/kernel.js");
    } else {
        argv = strv_push(argv, "/usr/bin/python3");
        /* kernel.py from its precompiled code when that fits (start_kernel.py). */
        argv = strv_push(argv, "/.runcell/start_kernel.py");
    }
    for (char *const *a = args; a && *a; a++)
        argv = strv_push(argv, *a);
    const char *binds[16] = {kernel_dir, "/.runcell"};
    size_t nb = 2;
    for (const char *const *b = extra ? extra->ro_binds : NULL; b && b[0] && nb + 3 < 16; b += 2) {
        binds[nb++] = b[0];
        binds[nb++] = b[1];
    }
    binds[nb] = NULL;
    const char *home = extra && extra->home_dir ? extra->home_dir : NULL;
    if (home) {
        char **with_home = env_with_home(extra && extra->env ? extra->env : env, home);
        strv_free(env);
        env = with_home;
    }
    int extra_fds[] = {sp[1]};
    struct sandbox_spec spec = {
        .argv = argv,
        .env = extra && extra->env && !home ? extra->env : env,
        .limits = *limits,
        .stdin_fd = devnull,
        .stdout_fd = out[1],
        .stderr_fd = err[1],
        .extra_fds = extra_fds,
        .n_extra_fds = 1,
        .ro_binds = binds,
        .relay_socket = extra ? extra->relay_socket : NULL,
        .relay_port = extra ? extra->relay_port : 0,
        .from_template = !js, /* the template is a Python process */
        .work_dir = home,
        .exec_channel = extra && extra->exec_channel,
    };
    if ((r = sandbox_start(host, ws, &spec, &k->sb)) < 0)
        goto fail;
    k->chan_fd = TAKE_FD(sp[0]);
    k->out_fd = TAKE_FD(out[0]);
    k->err_fd = TAKE_FD(err[0]);
    /* Our copies of the kernel's ends go now, so that its death reads as EOF. */
    close(TAKE_FD(sp[1]));
    close(TAKE_FD(out[1]));
    close(TAKE_FD(err[1]));
    fd_set_nonblock(k->chan_fd, true);
    fd_set_nonblock(k->out_fd, true);
    fd_set_nonblock(k->err_fd, true);
    if ((r = wait_hello(k, kernel_start_wait_ms(start_timeout_ms, limits->cpus_milli))) < 0)
        goto fail;
    *ret = k;
    return 0;
fail:
    close_fds(sp, 2);
    close_fds(out, 2);
    close_fds(err, 2);
    kernel_free(k);
    return r;
}

struct reply_wait {
    const char *want; /* "checkpoint_done" */
    json_t *reply;
    char *limit; /* a message over the caps came instead: why */
};

static void on_reply(void *ctx, const struct kernel_event *ev)
{
    struct reply_wait *w = ctx;
    if (ev->type == KEV_LIMIT && !w->limit)
        w->limit = xstrndup(ev->data, ev->len);
    const char *type = ev->msg ? json_string_value(json_object_get(ev->msg, "type")) : NULL;
    if (ev->type == KEV_REPLY && type && !strcmp(type, w->want) && !w->reply)
        w->reply = json_incref(ev->msg);
}

int kernel_request(struct kernel *k, const char *type, const char *path, uint64_t timeout_ms,
                   uint64_t grace_ms, json_t **ret_reply)
{
    _cleanup_free_ char *want = xasprintf("%s_done", type);
    struct reply_wait w = {.want = want};
    json_t *req = json_pack("{s:s,s:s}", "type", type, "path", path);
    char *text = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    double deadline = now_ms_f() + (double)timeout_ms;
    int r = send_frame(k, 'M', text, strlen(text), deadline);
    free(text);
    if (r < 0)
        return err_set(EPIPE, "cannot send the %s request to the kernel: %s", type, strerror(-r));
    bool interrupted = false, open_pipe[3] = {true, true, true};
    while (!w.reply) {
        double now = now_ms_f();
        if (now >= deadline) {
            if (interrupted)
                return err_set(ETIMEDOUT, "the kernel did not finish the %s within %llu ms", type,
                               (unsigned long long)timeout_ms);
            kernel_interrupt(k);
            interrupted = true;
            deadline = now + (double)grace_ms;
        }
        struct pollfd pfd[3] = {{.fd = k->chan_fd, .events = POLLIN},
                                {.fd = open_pipe[1] ? k->out_fd : -1, .events = POLLIN},
                                {.fd = open_pipe[2] ? k->err_fd : -1, .events = POLLIN}};
        if (poll(pfd, 3, (int)(deadline - now) + 1) < 0 && errno != EINTR)
            return err_set(errno, "poll: %s", strerror(errno));
        /* What the code prints meanwhile (a __reduce__ that talks) is not anyone's output. */
        for (int i = 1; i <= 2; i++)
            if (pfd[i].revents)
                open_pipe[i] = kernel_pump_pipe(k, i, on_reply, &w) != 1;
        if (pfd[0].revents) {
            r = kernel_pump_channel(k, on_reply, &w);
            if (w.limit) {
                /* The reply is the kernel's word, which is the sandbox's: too large to read
                 * is a broken protocol, and the caller replaces the kernel. */
                r = err_set(EPROTO, "the kernel's answer to the %s broke a limit: %s", type,
                            w.limit);
                free(w.limit);
                json_decref(w.reply);
                return r;
            }
            if (r < 0)
                return r;
            if (r == 1 && !w.reply)
                return err_set(EPIPE, "the kernel died during the %s", type);
        }
    }
    *ret_reply = w.reply;
    return 0;
}

int kernel_set_home(struct kernel *k, const char *home, uint64_t timeout_ms)
{
    json_t *reply = NULL;
    int r = kernel_request(k, "set_home", home, timeout_ms, timeout_ms, &reply);
    if (r < 0)
        return r;
    const char *error = json_string_value(json_object_get(reply, "error"));
    if (!json_is_true(json_object_get(reply, "ok")))
        r = err_set(EIO, "the kernel could not make %s its home: %s", home,
                    error ? error : "it did not say why");
    json_decref(reply);
    return r;
}

int kernel_start_shell(struct kernel *k, uint64_t timeout_ms)
{
    json_t *reply = NULL;
    int r = kernel_request(k, "start_shell", "", timeout_ms, timeout_ms, &reply);
    if (r < 0)
        return r;
    const char *error = json_string_value(json_object_get(reply, "error"));
    if (!json_is_true(json_object_get(reply, "ok")))
        r = err_set(EIO, "the kernel could not start its shell: %s",
                    error ? error : "it did not say why");
    json_decref(reply);
    return r;
}

int kernel_history(struct kernel *k, unsigned depth, uint64_t timeout_ms)
{
    char text[16];
    json_t *reply = NULL;
    snprintf(text, sizeof(text), "%u", depth);
    int r = kernel_request(k, "history", text, timeout_ms, timeout_ms, &reply);
    if (r < 0)
        return r;
    const char *error = json_string_value(json_object_get(reply, "error"));
    if (!json_is_true(json_object_get(reply, "ok")))
        r = err_set(EIO, "the kernel could not keep its history: %s",
                    error ? error : "it did not say why");
    json_decref(reply);
    return r;
}

int kernel_undo(struct kernel *k, long before, uint64_t timeout_ms, long *ret_count,
                json_t **ret_kept)
{
    char text[24];
    json_t *reply = NULL;
    snprintf(text, sizeof(text), "%ld", before);
    int r = kernel_request(k, "undo", text, timeout_ms, timeout_ms, &reply);
    if (r < 0)
        return r;
    json_t *kept = json_object_get(reply, "kept"), *clean = json_array();
    size_t i;
    json_t *v;
    /* The kernel's word: numbers only, as many as a history may hold. */
    json_array_foreach(kept, i, v) if (json_is_integer(v) && i < 1000) json_array_append(clean, v);
    const char *error = json_string_value(json_object_get(reply, "error"));
    json_int_t count = json_integer_value(json_object_get(reply, "execution_count"));
    if (!json_is_true(json_object_get(reply, "ok")))
        r = err_set(ENOENT, "%.300s", error ? error : "the kernel did not say why");
    else if (count < 0 || count >= before)
        r = err_set(EPROTO, "the kernel's undo answered an execution count of %lld",
                    (long long)count);
    json_decref(reply);
    if (r < 0) {
        json_decref(clean);
        return r;
    }
    *ret_count = (long)count;
    *ret_kept = clean;
    return 0;
}

void kernel_answer_sync(struct kernel *k)
{
    unsigned char hdr[FRAME_HEADER];
    frame_header(hdr, 'A', 0);
    pthread_mutex_lock(&k->write_lock);
    (void)!send(k->chan_fd, hdr, sizeof(hdr), MSG_NOSIGNAL);
    pthread_mutex_unlock(&k->write_lock);
}

/* One interrupt is one I frame, then one SIGINT, both after the request of the cell it
 * stops: the kernels match each frame to its signal, and a signal more would break the
 * next cell (test-kernel.c). */
void kernel_interrupt(struct kernel *k)
{
    if (!k)
        return;
    for (;;) {
        pthread_mutex_lock(&k->owed_lock);
        if (k->writing_request) {
            k->interrupt_owed = true; /* the writer sends both once the request is out */
            pthread_mutex_unlock(&k->owed_lock);
            return;
        }
        pthread_mutex_unlock(&k->owed_lock);
        if (pthread_mutex_trylock(&k->write_lock) == 0)
            break;
        /* Held for a frame of a few bytes (a sync answer), or by a request's writer about
         * to begin or just done: look again in a moment. */
        struct timespec pause = {.tv_nsec = 100 * 1000};
        nanosleep(&pause, NULL);
    }
    send_interrupt_frame(k);
    pthread_mutex_unlock(&k->write_lock);
    if (k->sb)
        sandbox_signal(k->sb, SIGINT);
}

void kernel_free(struct kernel *k)
{
    if (!k)
        return;
    sandbox_free(k->sb);
    if (k->chan_fd >= 0)
        close(k->chan_fd);
    if (k->out_fd >= 0)
        close(k->out_fd);
    if (k->err_fd >= 0)
        close(k->err_fd);
    buf_release(&k->in);
    free(k->python_version);
    pthread_mutex_destroy(&k->write_lock);
    free(k);
}

int kernel_fd(const struct kernel *k, enum kernel_fd_kind which)
{
    switch (which) {
    case KERNEL_FD_CHANNEL:
        return k->chan_fd;
    case KERNEL_FD_STDOUT:
        return k->out_fd;
    case KERNEL_FD_STDERR:
        return k->err_fd;
    case KERNEL_FD_STATUS:
        return k->sb ? sandbox_status_fd(k->sb) : -1;
    }
    return -1;
}

struct sandbox *kernel_sandbox(const struct kernel *k)
{
    return k->sb;
}

const char *kernel_python_version(const struct kernel *k)
{
    return k->python_version ? k->python_version : "";
}
