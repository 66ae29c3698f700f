/* fdutil.c - fd, file and path helpers that never follow a link they were not asked to. */
#include "base/base.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

int fd_set_nonblock(int fd, bool on)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0)
        return -errno;
    fl = on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
    return fcntl(fd, F_SETFL, fl) < 0 ? -errno : 0;
}

int fd_set_cloexec(int fd, bool on)
{
    int fl = fcntl(fd, F_GETFD);
    if (fl < 0)
        return -errno;
    fl = on ? (fl | FD_CLOEXEC) : (fl & ~FD_CLOEXEC);
    return fcntl(fd, F_SETFD, fl) < 0 ? -errno : 0;
}

/* The one loop behind write_all and send_all: short writes and EINTR are retried; with a
 * deadline (>= 0), EAGAIN waits for room until then. On a socket, sendmsg with MSG_NOSIGNAL:
 * a peer that has gone (a sandbox's kernel that ended, a client of the egress proxy that
 * closed) gives EPIPE, never a SIGPIPE that would end the whole process. iov (cnt parts,
 * consumed as they go) is written in one call where it fits, so that a reader of a frame
 * wakes once for its header and payload. */
static int put_all(int fd, struct iovec *iov, int cnt, double deadline_ms, bool sock)
{
    while (cnt && !iov->iov_len) {
        iov++;
        cnt--;
    }
    while (cnt) {
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
        ssize_t w = sock ? sendmsg(fd, &mh, MSG_NOSIGNAL) : writev(fd, iov, cnt);
        if (w >= 0) {
            size_t left = (size_t)w;
            while (cnt && left >= iov->iov_len) {
                left -= iov->iov_len;
                iov++;
                cnt--;
            }
            if (cnt) {
                iov->iov_base = (char *)iov->iov_base + left;
                iov->iov_len -= left;
            }
            continue;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN || deadline_ms < 0)
            return -errno;
        double wait = deadline_ms - now_ms_f();
        if (wait <= 0)
            return -ETIMEDOUT;
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        if (poll(&pfd, 1, (int)wait + 1) < 0 && errno != EINTR)
            return -errno;
    }
    return 0;
}

static int put_one(int fd, const void *data, size_t n, double deadline_ms, bool sock)
{
    struct iovec iov = {.iov_base = (void *)data, .iov_len = n};
    return put_all(fd, &iov, 1, deadline_ms, sock);
}

int write_all(int fd, const void *data, size_t n)
{
    return put_one(fd, data, n, -1, false);
}

int write_all_by(int fd, const void *data, size_t n, double deadline_ms)
{
    return put_one(fd, data, n, deadline_ms < 0 ? 0 : deadline_ms, false);
}

int send_all(int fd, const void *data, size_t n)
{
    return put_one(fd, data, n, -1, true);
}

int send_all_by(int fd, const void *data, size_t n, double deadline_ms)
{
    return put_one(fd, data, n, deadline_ms < 0 ? 0 : deadline_ms, true);
}

int sendv_all_by(int fd, struct iovec *iov, int cnt, double deadline_ms)
{
    return put_all(fd, iov, cnt, deadline_ms < 0 ? 0 : deadline_ms, true);
}

int send_with_fds(int fd, const char *text, const int *fds, int n)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * 32)];
        struct cmsghdr align;
    } cbuf;
    if (n < 0 || n > 32)
        return -EINVAL;
    struct iovec iov = {.iov_base = (void *)text, .iov_len = strlen(text)};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (n > 0) {
        memset(&cbuf, 0, sizeof(cbuf));
        mh.msg_control = cbuf.buf;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)n);
    }
    ssize_t r;
    do
        r = sendmsg(fd, &mh, MSG_NOSIGNAL);
    while (r < 0 && errno == EINTR);
    return r < 0 ? -errno : 0;
}

ssize_t recv_with_fds(int fd, char *buf, size_t cap, int flags, int *fds, int max_fds,
                      int *ret_n_fds)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * 32)];
        struct cmsghdr align;
    } cbuf;
    struct iovec iov = {.iov_base = buf, .iov_len = cap - 1};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf.buf, .msg_controllen = sizeof(cbuf)};
    *ret_n_fds = 0;
    buf[0] = '\0';
    ssize_t n;
    do
        n = recvmsg(fd, &mh, flags | MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return -errno;
    buf[n] = '\0';
    int got = 0;
    bool over = false;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int one;
            memcpy(&one, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (got < max_fds)
                fds[got++] = one;
            else {
                close(one); /* more than the caller takes */
                over = true;
            }
        }
    }
    int r = mh.msg_flags & MSG_CTRUNC            ? -EMFILE
            : over || (mh.msg_flags & MSG_TRUNC) ? -EMSGSIZE
                                                 : 0;
    if (r < 0) {
        for (int i = 0; i < got; i++)
            close(fds[i]);
        return r;
    }
    *ret_n_fds = got;
    return n;
}

int waker_open(void)
{
    int fd = eventfd(1, EFD_CLOEXEC | EFD_NONBLOCK);
    return fd < 0 ? -errno : fd;
}

void waker_clear(int fd)
{
    uint64_t v;
    (void)!read(fd, &v, sizeof(v));
}

bool wakers_add(struct wakers *ws, int fd)
{
    if (ws->n == WAKERS_MAX)
        return false;
    ws->fd[ws->n++] = fd;
    return true;
}

void wakers_remove(struct wakers *ws, int fd)
{
    for (size_t i = 0; i < ws->n; i++)
        if (ws->fd[i] == fd) {
            ws->fd[i] = ws->fd[--ws->n];
            return;
        }
}

int reader_watch_open(struct reader_watch *w, pthread_mutex_t *lock, struct wakers *set)
{
    int fd = waker_open();
    if (fd < 0)
        return fd;
    pthread_mutex_lock(lock);
    bool added = wakers_add(set, fd);
    pthread_mutex_unlock(lock);
    if (!added) {
        close(fd);
        return -EAGAIN;
    }
    *w = (struct reader_watch){.lock = lock, .set = set, .fd = fd};
    return 0;
}

void reader_watch_close(struct reader_watch *w)
{
    pthread_mutex_lock(w->lock);
    wakers_remove(w->set, w->fd);
    pthread_mutex_unlock(w->lock);
    close(w->fd);
}

void wakers_notify(const struct wakers *ws)
{
    uint64_t one = 1;
    for (size_t i = 0; i < ws->n; i++)
        (void)!write(ws->fd[i], &one, sizeof(one));
}

int read_all(int fd, struct buf *out)
{
    char chunk[65536];
    for (;;) {
        ssize_t r = read(fd, chunk, sizeof(chunk));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0)
            return 0;
        int e = buf_append(out, chunk, (size_t)r);
        if (e < 0)
            return e;
    }
}

int read_regular_fd(int fd, size_t cap, struct buf *ret, uint64_t *ret_size)
{
    struct stat st;
    buf_init(ret, cap ? cap : 1); /* 0 would mean no cap; 1 is taken back below */
    if (fstat(fd, &st) < 0)
        return -errno;
    if (!S_ISREG(st.st_mode))
        return -EINVAL;
    if (ret_size)
        *ret_size = (uint64_t)st.st_size;
    if ((uint64_t)st.st_size > cap)
        return -E2BIG;
    int r = fd_set_nonblock(fd, false);
    if (!r)
        r = read_all(fd, ret);
    if (!r && ret->len > cap)
        r = -E2BIG;
    if (r < 0)
        buf_release(ret);
    return r;
}

int read_file(const char *path, size_t max, char **ret_data, size_t *ret_len)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -errno;
    struct buf b;
    int r = read_regular_fd(fd, max, &b, NULL);
    if (r < 0)
        return r;
    *ret_data = buf_detach(&b, ret_len);
    return 0;
}

int write_file(const char *path, const char *data, size_t n, mode_t mode)
{
    _cleanup_close_ int fd =
        open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd < 0)
        return -errno;
    return write_all(fd, data, n);
}

bool path_is_safe_relative(const char *p)
{
    if (!p || !*p || *p == '/' || strlen(p) >= PATH_MAX)
        return false;
    const char *s = p;
    while (*s) {
        const char *slash = strchr(s, '/');
        size_t n = slash ? (size_t)(slash - s) : strlen(s);
        if (n == 0 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
            return false;
        if (!slash)
            break;
        s = slash + 1;
        if (!*s)
            return false;
    }
    return true;
}

int mkdir_p(const char *path, mode_t mode)
{
    _cleanup_free_ char *p = xstrdup(path);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(p, mode) < 0 && errno != EEXIST)
            return -errno;
        *s = '/';
    }
    if (mkdir(p, mode) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

/* Deleting a tree costs an open directory (and its read buffer) per level it is deep in, and
 * a tree a sandbox made can be as deep as its inodes allow: past RM_MAX_DEPTH levels, a
 * subdirectory is moved up into the directory being deleted instead, and taken from there
 * by a later pass. Memory, fds and stack stay bounded whatever the depth. */
#define RM_MAX_DEPTH 32

struct rm_walk {
    int top;        /* the directory being deleted */
    dev_t dev;      /* its file system: nothing on another is deleted */
    unsigned moved; /* subdirectories moved up so far (and the names they took) */
};

static int rm_at(struct rm_walk *w, int dirfd, const char *name, int depth);

/* Moves the subdirectory name (in dfd) up into w->top under a name of its own. */
static int rm_move_up(struct rm_walk *w, int dfd, const char *name)
{
    for (;;) {
        char to[32];
        snprintf(to, sizeof(to), ".rm-%u", w->moved++);
        if (renameat2(dfd, name, w->top, to, RENAME_NOREPLACE) == 0)
            return 0;
        if (errno != EEXIST)
            return -errno;
    }
}

static bool is_subdir(int dfd, const struct dirent *e)
{
    struct stat st;
    if (e->d_type != DT_UNKNOWN)
        return e->d_type == DT_DIR;
    return fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
}

/* Deletes what the directory dfd (taken) holds, depth levels below w->top. */
static int rm_children(struct rm_walk *w, int dfd, int depth)
{
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return -errno;
    }
    int ret = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        int r;
        if (depth >= RM_MAX_DEPTH && is_subdir(dirfd(d), e))
            r = rm_move_up(w, dirfd(d), e->d_name);
        else
            r = rm_at(w, dirfd(d), e->d_name, depth + 1);
        if (r < 0 && !ret)
            ret = r;
    }
    closedir(d);
    return ret;
}

static int rm_at(struct rm_walk *w, int dirfd, const char *name, int depth)
{
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return errno == ENOENT ? 0 : -errno;
    if (depth && st.st_dev != w->dev)
        return -EXDEV; /* a mount point: never delete into another file system */
    if (!S_ISDIR(st.st_mode))
        return unlinkat(dirfd, name, 0) < 0 && errno != ENOENT ? -errno : 0;
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st2;
    if (fstat(fd, &st2) < 0 || st2.st_dev != st.st_dev || st2.st_ino != st.st_ino) {
        close(fd);
        return -EXDEV;
    }
    int ret = 0;
    if (depth == 0) {
        /* The top: passes until no pass moved anything up (each takes RM_MAX_DEPTH levels
         * off every subtree moved here). */
        w->top = fd;
        w->dev = st.st_dev;
        unsigned before;
        do {
            before = w->moved;
            int again = dup(fd);
            ret = again < 0 ? -errno : rm_children(w, again, 0);
            if (again >= 0)
                lseek(fd, 0, SEEK_SET);
        } while (!ret && w->moved != before);
        close(fd);
    } else {
        ret = rm_children(w, fd, depth);
    }
    if (unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT && !ret)
        ret = -errno;
    return ret;
}

int rm_rf_at(int dirfd, const char *name)
{
    struct rm_walk w = {.top = -1};
    return rm_at(&w, dirfd, name, 0);
}

int rm_rf(const char *path)
{
    return rm_rf_at(AT_FDCWD, path);
}

uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

uint64_t ms_since(uint64_t now, uint64_t then)
{
    return now > then ? now - then : 0;
}

double now_ms_f(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

uint64_t now_realtime_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void realtime_after_ms(struct timespec *ret, uint64_t ms)
{
    clock_gettime(CLOCK_REALTIME, ret);
    uint64_t ns = (uint64_t)ret->tv_nsec + ms * 1000000;
    ret->tv_sec += (time_t)(ns / 1000000000);
    ret->tv_nsec = (long)(ns % 1000000000);
}

void format_time_iso(uint64_t realtime_ms, char *out)
{
    time_t secs = (time_t)(realtime_ms / 1000);
    struct tm tm;
    gmtime_r(&secs, &tm);
    char date[24];
    strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, 32, "%.20s.%03uZ", date, (unsigned)(realtime_ms % 1000));
}

int random_bytes(void *buf, size_t n)
{
    char *p = buf;
    while (n) {
        ssize_t r = getrandom(p, n, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

char *random_hex(size_t n)
{
    unsigned char *raw = xmalloc(n);
    char *hex = xmalloc(2 * n + 1);
    if (random_bytes(raw, n) < 0)
        abort();
    for (size_t i = 0; i < n; i++)
        sprintf(hex + 2 * i, "%02x", raw[i]);
    free(raw);
    return hex;
}

int db_file_make_private(const char *path)
{
    static const char *const siblings[] = {"-wal", "-shm", "-journal"};
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    /* An older runcell made it with the default mode: tighten it. */
    if (fd < 0 || fchmod(fd, 0600) < 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return err_set(e, "cannot create %s with mode 0600: %s", path, strerror(e));
    }
    close(fd);
    for (size_t i = 0; i < ARRAY_SIZE(siblings); i++) {
        _cleanup_free_ char *p = xasprintf("%s%s", path, siblings[i]);
        _cleanup_close_ int sfd = open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (sfd >= 0 && fchmod(sfd, 0600) < 0)
            return err_set(errno, "cannot set mode 0600 on %s: %s", p, strerror(errno));
    }
    return 0;
}
