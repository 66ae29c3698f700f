/* test-kernel.c - unit tests for the daemon's side of the kernel channel (src/kernel): the
 * frame codec on a buffer, and requests sent to a kernel that reads slowly or not at all
 * (the interrupt frame needs a sandbox to signal: tests/integration). The kernel itself (kernel.py)
 * is covered by tests/integration. */
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kernel/kernel-int.h"
#include "runner.h"

struct seen {
    int types[16];
    int n;
    char text[64];
};

static void on_event(void *ctx, const struct kernel_event *ev)
{
    struct seen *s = ctx;
    if (s->n < 16)
        s->types[s->n++] = ev->type;
    if (ev->type == KEV_STDOUT)
        snprintf(s->text, sizeof(s->text), "%.*s", (int)ev->len, ev->data);
}

static void frame(struct buf *b, char kind, const char *payload)
{
    uint32_t len = htonl((uint32_t)strlen(payload));
    CHECK(buf_append(b, &len, 4) == 0);
    CHECK(buf_append(b, &kind, 1) == 0);
    CHECK(buf_append(b, payload, strlen(payload)) == 0);
}

TEST(frames_are_parsed_and_a_partial_one_is_kept)
{
    struct buf b;
    buf_init(&b, 1 << 20);
    frame(&b, 'O', "hello");
    frame(&b, 'M', "{\"type\":\"done\",\"status\":\"ok\",\"execution_count\":1}");
    frame(&b, 'E', "partial");
    b.len -= 3; /* the last frame is not all there yet */
    struct seen s = {0};
    CHECK(kernel_frames_parse(&b, on_event, &s) == 0);
    CHECK(s.n == 2 && s.types[0] == KEV_STDOUT && s.types[1] == KEV_DONE);
    CHECK_STREQ(s.text, "hello");
    CHECK(b.len == 5 + 4); /* the header and "part" wait for the rest */
    buf_release(&b);
}

TEST(a_frame_over_the_cap_breaks_the_protocol)
{
    struct buf b;
    buf_init(&b, 1 << 20);
    uint32_t len = htonl(KERNEL_MAX_FRAME + 1);
    CHECK(buf_append(&b, &len, 4) == 0);
    CHECK(buf_append(&b, "M", 1) == 0);
    struct seen s = {0};
    CHECK(kernel_frames_parse(&b, on_event, &s) == -EPROTO);
    CHECK(strstr(err_msg(), "frame") != NULL);
    CHECK(s.n == 0);
    buf_release(&b);
}

TEST(an_unknown_kind_and_a_message_that_is_not_json_break_it)
{
    const char *bad[][2] = {{"Z", "x"}, {"M", "not json"}, {"M", "[1,2]"}};
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        struct buf b;
        buf_init(&b, 1 << 20);
        frame(&b, bad[i][0][0], bad[i][1]);
        struct seen s = {0};
        CHECK(kernel_frames_parse(&b, on_event, &s) == -EPROTO);
        CHECK(*err_msg());
        buf_release(&b);
    }
}

TEST(a_message_over_the_value_cap_is_a_limit_event_and_reading_goes_on)
{
    struct buf b, msg;
    buf_init(&b, KERNEL_MAX_FRAME + 4096);
    buf_init(&msg, 0);
    CHECK(buf_append(&msg, "{\"type\":\"display\",\"data\":[", 26) == 0);
    for (int i = 0; i < KERNEL_MSG_MAX_VALUES + 10; i++)
        CHECK(buf_append(&msg, i ? ",0" : "0", i ? 2 : 1) == 0);
    CHECK(buf_append(&msg, "]}", 3) == 0); /* with its NUL, for frame() */
    frame(&b, 'M', msg.data);
    frame(&b, 'O', "after");
    struct seen s = {0};
    CHECK(kernel_frames_parse(&b, on_event, &s) == 0);
    CHECK(s.n == 2 && s.types[0] == KEV_LIMIT && s.types[1] == KEV_STDOUT);
    CHECK_STREQ(s.text, "after");
    buf_release(&msg);
    buf_release(&b);
}

/* A kernel struct on one end of a socket pair, as kernel_start makes it (no sandbox). */
static struct kernel *channel_kernel(int *ret_peer)
{
    int sp[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) == 0);
    struct kernel *k = xcalloc(1, sizeof(*k));
    pthread_mutex_init(&k->write_lock, NULL);
    pthread_mutex_init(&k->owed_lock, NULL);
    k->chan_fd = sp[0];
    k->out_fd = k->err_fd = -1;
    buf_init(&k->in, KERNEL_MAX_FRAME + 4096);
    CHECK(fd_set_nonblock(k->chan_fd, true) == 0);
    *ret_peer = sp[1];
    return k;
}

/* A cell of size bytes of code (freed by the caller). */
static char *cell_of(size_t size)
{
    char *code = xmalloc(size + 1);
    memset(code, 'x', size);
    code[size] = '\0';
    return code;
}

struct reader {
    int fd;
    size_t got;
};

static void *read_all_of(void *arg)
{
    struct reader *r = arg;
    char chunk[65536];
    ssize_t n;
    while ((n = read(r->fd, chunk, sizeof(chunk))) > 0)
        r->got += (size_t)n;
    return NULL;
}

TEST(a_cell_larger_than_the_socket_goes_in_pieces)
{
    int peer;
    struct kernel *k = channel_kernel(&peer);
    size_t size = 8u << 20; /* far more than a socket buffer holds */
    char *code = cell_of(size);
    struct reader r = {.fd = peer};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, read_all_of, &r) == 0);
    CHECK(kernel_send_execute(k, code, "python", 1, 60000) == 0);
    shutdown(k->chan_fd, SHUT_WR);
    pthread_join(t, NULL);
    CHECK(r.got > size && r.got < size + 200); /* the header and the JSON around the code */
    free(code);
    close(peer);
    kernel_free(k);
}

struct sender {
    struct kernel *k;
    const char *code;
    int r;
};

static void *send_cell(void *arg)
{
    struct sender *w = arg;
    w->r = kernel_send_execute(w->k, w->code, "python", 1, 60000);
    return NULL;
}

struct collector {
    int fd;
    struct buf got;
};

static void *collect_all(void *arg)
{
    struct collector *c = arg;
    char chunk[65536];
    ssize_t n;
    while ((n = read(c->fd, chunk, sizeof(chunk))) > 0)
        CHECK(buf_append(&c->got, chunk, (size_t)n) == 0);
    return NULL;
}

/* b holds whole frames of the kinds want, in order ("MIM"); b is released. */
static void check_frames(struct buf *b, const char *want)
{
    char kinds[16];
    size_t at = 0, n = 0;
    while (at + 5 <= b->len && n + 1 < sizeof(kinds)) {
        uint32_t len;
        memcpy(&len, b->data + at, 4);
        kinds[n++] = (char)b->data[at + 4];
        at += 5 + ntohl(len);
    }
    CHECK(at == b->len); /* whole frames only */
    kinds[n] = '\0';
    CHECK_STREQ(kinds, want);
    buf_release(b);
}

TEST(an_interrupt_during_a_request_is_one_frame_right_after_it_and_never_after_the_next)
{
    /* A kernel's code may already run while the daemon still writes (its last bytes are
     * out, the writer not yet done): the frame owed then goes after this request, once,
     * and the next request carries none (it would stop a cell nobody interrupted). */
    int peer;
    struct kernel *k = channel_kernel(&peer);
    char *code = cell_of(8u << 20);
    struct sender w = {.k = k, .code = code};
    pthread_t writer, reader;
    CHECK(pthread_create(&writer, NULL, send_cell, &w) == 0);
    struct collector c = {.fd = peer};
    buf_init(&c.got, 64u << 20);
    char first[65536];
    size_t have = 0;
    while (have < sizeof(first)) { /* the writer is past its start, far from its end */
        ssize_t n = read(peer, first + have, sizeof(first) - have);
        CHECK(n > 0);
        have += (size_t)n;
    }
    CHECK(buf_append(&c.got, first, have) == 0);
    kernel_interrupt(k); /* returns at once: the request's writer owes it */
    CHECK(pthread_create(&reader, NULL, collect_all, &c) == 0);
    pthread_join(writer, NULL);
    CHECK(w.r == 0);
    CHECK(kernel_send_execute(k, "1", "python", 2, 60000) == 0);
    kernel_interrupt(k); /* nothing being written: at once, after the second request */
    shutdown(k->chan_fd, SHUT_WR);
    pthread_join(reader, NULL);
    check_frames(&c.got, "MIMI");
    free(code);
    close(peer);
    kernel_free(k);
}

struct interrupter {
    struct kernel *k;
    atomic_int tid;
    atomic_bool done;
};

static void *interrupt_it(void *arg)
{
    struct interrupter *t = arg;
    atomic_store(&t->tid, (int)gettid());
    kernel_interrupt(t->k);
    atomic_store(&t->done, true);
    return NULL;
}

/* The scheduler state of thread tid of this process ('S': sleeping), or 0. */
static char thread_state(int tid)
{
    char path[64], line[512];
    snprintf(path, sizeof(path), "/proc/self/task/%d/stat", tid);
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    char *got = fgets(line, sizeof(line), f);
    fclose(f);
    char *end = got ? strrchr(line, ')') : NULL;
    return end && end[1] == ' ' ? end[2] : 0;
}

TEST(an_interrupt_that_finds_a_short_write_waits_for_it_rather_than_ride_the_next_request)
{
    /* The channel held for a frame of a few bytes (here by the test, as a sync answer
     * holds it): the interrupt's frame goes as soon as it is free. Left owed, it went
     * out after the next cell's request and stopped that cell instead. */
    int peer;
    struct kernel *k = channel_kernel(&peer);
    pthread_mutex_lock(&k->write_lock);
    struct interrupter t = {.k = k};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, interrupt_it, &t) == 0);
    /* Until the interrupt waits (asleep between looks) or has returned. */
    while (!atomic_load(&t.done) && (!atomic_load(&t.tid) || thread_state(t.tid) != 'S'))
        sched_yield();
    pthread_mutex_unlock(&k->write_lock);
    pthread_join(th, NULL);
    CHECK(kernel_send_execute(k, "1", "python", 1, 60000) == 0);
    shutdown(k->chan_fd, SHUT_WR);
    struct collector c = {.fd = peer};
    buf_init(&c.got, 1u << 20);
    collect_all(&c);
    check_frames(&c.got, "IM");
    close(peer);
    kernel_free(k);
}

TEST(a_kernel_that_reads_nothing_fails_the_send_at_the_timeout)
{
    int peer;
    struct kernel *k = channel_kernel(&peer);
    char *code = cell_of(8u << 20);
    CHECK(kernel_send_execute(k, code, "python", 1, 200) == -ETIMEDOUT);
    CHECK(strstr(err_msg(), "took no more of the cell") != NULL);
    free(code);
    close(peer);
    kernel_free(k);
}

TEST(a_cell_over_the_frame_cap_is_refused_before_anything_is_sent)
{
    int peer;
    struct kernel *k = channel_kernel(&peer);
    char *code = cell_of(KERNEL_MAX_FRAME + 1);
    CHECK(kernel_send_execute(k, code, "python", 1, 1000) == -E2BIG);
    CHECK(strstr(err_msg(), "48 MiB") != NULL);
    char c;
    CHECK(recv(peer, &c, 1, MSG_DONTWAIT) < 0 && errno == EAGAIN);
    free(code);
    close(peer);
    kernel_free(k);
}

int main(int argc, char **argv)
{
    return run_tests(argc, argv);
}

TEST(a_sync_message_is_an_event_and_its_answer_an_empty_a_frame)
{
    struct buf b;
    buf_init(&b, 1 << 20);
    frame(&b, 'M', "{\"type\":\"sync\"}");
    struct seen s = {0};
    CHECK(kernel_frames_parse(&b, on_event, &s) == 0);
    CHECK(s.n == 1 && s.types[0] == KEV_SYNC);
    buf_release(&b);

    int peer;
    struct kernel *k = channel_kernel(&peer);
    kernel_answer_sync(k);
    unsigned char got[8];
    CHECK(read(peer, got, sizeof(got)) == 5);
    CHECK(!memcmp(got, "\0\0\0\0A", 5));
    close(peer);
    kernel_free(k);
}

TEST(answers_to_a_kernel_that_reads_none_never_block)
{
    /* A kernel that sends syncs without reading their answers fills its socket: the
     * answers past that are dropped, and the daemon's thread goes on. */
    int peer;
    struct kernel *k = channel_kernel(&peer);
    for (int i = 0; i < 200000; i++)
        kernel_answer_sync(k);
    CHECK(write(k->chan_fd, "x", 1) < 0 && errno == EAGAIN); /* it was full: all returned */
    close(peer);
    kernel_free(k);
}

TEST(the_wait_for_a_start_grows_below_one_core_up_to_its_cap)
{
    CHECK(kernel_start_wait_ms(30000, 0) == 30000);    /* no limit */
    CHECK(kernel_start_wait_ms(30000, 1000) == 30000); /* one core */
    CHECK(kernel_start_wait_ms(30000, 4000) == 30000); /* more: never shorter */
    CHECK(kernel_start_wait_ms(30000, 500) == 60000);
    CHECK(kernel_start_wait_ms(30000, 250) == 120000);
    CHECK(kernel_start_wait_ms(30000, 300) == 99990); /* 3.333x */
    CHECK(kernel_start_wait_ms(30000, 1) == 30000 * KERNEL_START_SCALE_MAX);
}
