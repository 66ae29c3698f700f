/* relay.c - the egress relay inside a sandbox: listens on 127.0.0.1:PORT of the sandbox's own
 * loopback and splices each connection to runcell's egress proxy through the Unix socket
 * bound into the sandbox. It enforces nothing (the proxy does); it only lets programs that
 * know HTTP proxies only as host:port reach it.
 *
 * init forks it before the payload, from the listening socket it made, so the port is open
 * before any sandboxed code runs. It runs as the sandbox user under the payload's lockdown
 * (no capabilities, Landlock, seccomp), in a Landlock domain of its own, so the payload can
 * neither signal nor trace it. */
#include "sandbox/helper/helper.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/base.h"

#define RELAY_MAX_PAIRS 256
#define RELAY_BUF       16384

/* Bytes read from fd, waiting to be written to the other side of the pair. */
struct side {
    int fd;
    char *buf;
    size_t len, off;
    bool eof;
    bool hup;
};

struct pair {
    struct side s[2]; /* 0: the client in the sandbox, 1: the proxy */
};

static struct pair *pairs[RELAY_MAX_PAIRS];
static size_t n_pairs;

static void pair_close(size_t i)
{
    struct pair *p = pairs[i];
    for (int k = 0; k < 2; k++) {
        close(p->s[k].fd);
        free(p->s[k].buf);
    }
    free(p);
    pairs[i] = pairs[--n_pairs];
}

static int proxy_connect(const char *path)
{
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", path);
    struct timeval tv = {.tv_sec = 5};
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    /* A proxy whose backlog is full would block connect() forever. */
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void accept_one(int listen_fd, const char *path)
{
    static const char gone[] = "HTTP/1.1 502 Bad Gateway (runcell egress proxy unreachable)\r\n"
                               "Connection: close\r\nContent-Length: 0\r\n\r\n";
    int client = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (client < 0)
        return;
    int up = proxy_connect(path);
    if (up < 0) {
        (void)!send(client, gone, sizeof(gone) - 1, MSG_NOSIGNAL);
        close(client);
        return;
    }
    fd_set_nonblock(up, true);
    struct pair *p = xcalloc(1, sizeof(*p));
    p->s[0] = (struct side){.fd = client, .buf = xmalloc(RELAY_BUF)};
    p->s[1] = (struct side){.fd = up, .buf = xmalloc(RELAY_BUF)};
    pairs[n_pairs++] = p;
}

static short side_events(const struct pair *p, int k)
{
    const struct side *s = &p->s[k], *other = &p->s[1 - k];
    short ev = 0;
    if (!s->eof && !s->len)
        ev |= POLLIN;
    if (other->len)
        ev |= POLLOUT;
    return ev;
}

/* Moves what poll said is possible; returns false when the pair is finished. A side that
 * fails is taken as ended, not as a reason to drop the pair: what its peer said last (the
 * proxy's refusal of a request it did not wait to read) must still reach the other side. */
static bool pair_step(struct pair *p, const struct pollfd *pfd)
{
    for (int k = 0; k < 2; k++) {
        struct side *s = &p->s[k], *other = &p->s[1 - k];
        short rev = pfd[k].revents;
        if (rev & (POLLHUP | POLLERR))
            s->hup = true;
        if ((rev & (POLLIN | POLLHUP | POLLERR)) && !s->eof && !s->len) {
            ssize_t n = recv(s->fd, s->buf, RELAY_BUF, 0);
            if (n < 0 && (errno == EAGAIN || errno == EINTR))
                continue;
            if (n <= 0) {
                s->eof = true;
                shutdown(other->fd, SHUT_WR);
            } else {
                s->len = (size_t)n;
                s->off = 0;
            }
        }
        if ((rev & (POLLOUT | POLLERR | POLLHUP)) && other->len) {
            ssize_t n = send(s->fd, other->buf + other->off, other->len, MSG_NOSIGNAL);
            if (n < 0 && errno != EAGAIN && errno != EINTR) {
                /* Nowhere to send the other side's bytes: stop taking them. */
                other->len = 0;
                other->eof = true;
                shutdown(other->fd, SHUT_RD);
                continue;
            }
            if (n > 0) {
                other->off += (size_t)n;
                other->len -= (size_t)n;
            }
            if (!other->len && other->eof)
                shutdown(s->fd, SHUT_WR);
        }
    }
    return !(p->s[0].eof && p->s[1].eof && !p->s[0].len && !p->s[1].len);
}

static __attribute__((noreturn)) void relay_loop(int listen_fd, const char *path)
{
    static struct pollfd pfd[1 + 2 * RELAY_MAX_PAIRS];
    for (;;) {
        pfd[0] =
            (struct pollfd){.fd = n_pairs < RELAY_MAX_PAIRS ? listen_fd : -1, .events = POLLIN};
        for (size_t i = 0; i < n_pairs; i++)
            for (int k = 0; k < 2; k++) {
                short ev = side_events(pairs[i], k);
                /* A hung-up side with nothing to do would wake poll forever. */
                bool idle = pairs[i]->s[k].hup && !(ev & POLLIN) && !(ev & POLLOUT);
                pfd[1 + 2 * i + k] =
                    (struct pollfd){.fd = idle ? -1 : pairs[i]->s[k].fd, .events = ev};
            }
        size_t n = n_pairs;
        if (poll(pfd, 1 + 2 * n, -1) < 0) {
            if (errno == EINTR)
                continue;
            _exit(1);
        }
        /* Backwards, as pair_close moves the last pair into the freed place. */
        for (size_t i = n; i-- > 0;)
            if (!pair_step(pairs[i], &pfd[1 + 2 * i]))
                pair_close(i);
        if (pfd[0].revents & POLLIN)
            accept_one(listen_fd, path);
    }
}

/* In the forked child: fds, then the payload's lockdown, then the loop. */
static __attribute__((noreturn)) void relay_child(const struct helper_config *cfg, int listen_fd,
                                                  void *filter)
{
    setsid();
    /* Its name, whether it was exec'd (runcell-sandbox) or cloned from the template. */
    prctl(PR_SET_NAME, "runcell-relay");
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    for (int fd = 0; fd < 3 && null >= 0; fd++)
        dup2(null, fd);
    if (dup2(listen_fd, 3) < 0 || dup2(status_fd, 4) < 0)
        _exit(1);
    status_fd = 4;
    syscall(SYS_close_range, 5, ~0U, 0);
    signal(SIGPIPE, SIG_IGN);
    if (lockdown(cfg, filter) < 0)
        _exit(1);
    /* From here on nothing is reported: the status pipe belongs to init. */
    close(status_fd);
    status_fd = -1;
    relay_loop(3, cfg->relay_socket);
}

int relay_start(const struct helper_config *cfg, void *filter)
{
    struct sockaddr_in sin = {.sin_family = AF_INET,
                              .sin_port = htons(cfg->relay_port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int one = 1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return fail_errno("cannot create the egress relay's socket");
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0 || listen(fd, 128) < 0) {
        close(fd);
        return fail_errno("cannot listen on 127.0.0.1:%u for the egress relay", cfg->relay_port);
    }
    pid_t pid = fork();
    if (pid < 0) {
        close(fd);
        return fail_errno("cannot start the egress relay (fork)");
    }
    if (pid == 0)
        relay_child(cfg, fd, filter);
    close(fd);
    return 0;
}
