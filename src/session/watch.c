/* watch.c - watching a directory of a session's workspace for changes (inotify, from the
 * daemon): each directory is watched through an fd opened without following a link, so a
 * link the sandbox planted can never make the daemon watch the host; new subdirectories of a
 * recursive watch are added as they come; what the sandbox does (names, a storm of events)
 * is read within caps. */
#include "session/session-int.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#define WATCH_MASK                                                                                 \
    (IN_CREATE | IN_DELETE | IN_MODIFY | IN_MOVED_FROM | IN_MOVED_TO | IN_ATTRIB |                 \
     IN_DELETE_SELF | IN_MOVE_SELF)

struct watched_dir {
    int wd;
    char *rel; /* below the watched directory ("" for it) */
};

struct session_watch {
    int fd;     /* inotify */
    char *root; /* the watched directory, workspace-relative */
    bool recursive;
    struct watched_dir *dirs;
    size_t n_dirs;
    /* read from the inotify fd and not yet handed out */
    struct session_watch_event *pending;
    size_t n_pending;
    uint64_t dropped;
};

void session_watch_free(struct session_watch *w)
{
    if (!w)
        return;
    if (w->fd >= 0)
        close(w->fd);
    for (size_t i = 0; i < w->n_dirs; i++)
        free(w->dirs[i].rel);
    for (size_t i = 0; i < w->n_pending; i++)
        free(w->pending[i].name);
    free(w->dirs);
    free(w->pending);
    free(w->root);
    free(w);
}

int session_watch_fd(const struct session_watch *w)
{
    return w->fd;
}

uint64_t session_watch_dropped(const struct session_watch *w)
{
    return w->dropped;
}

/* Watches workspace directory root/sub ("" for root itself) through an fd opened beneath the
 * workspace without following links: the watch is on that inode, wherever the path led. */
static int add_dir(struct session *s, struct session_watch *w, const char *sub)
{
    if (w->n_dirs >= SESSION_WATCH_MAX_DIRS)
        return err_set(E2BIG,
                       "'%.200s' holds more than %d directories to watch; watch a "
                       "subdirectory, or not recursively",
                       w->root, SESSION_WATCH_MAX_DIRS);
    _cleanup_free_ char *rel =
        *w->root ? xasprintf("%s%s%s", w->root, *sub ? "/" : "", sub) : xstrdup(sub);
    struct workspace *ws = session_workspace(s);
    int fd = *rel ? workspace_openat(ws, rel, O_RDONLY | O_DIRECTORY, 0) : workspace_open(ws);
    if (fd < 0)
        return err_set(-fd, "cannot watch '%.200s': %s", *rel ? rel : ".", strerror(-fd));
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    int wd = inotify_add_watch(w->fd, path, WATCH_MASK | IN_ONLYDIR);
    int e = errno;
    close(fd);
    if (wd < 0)
        return err_set(e, "cannot watch '%.200s': %s", *rel ? rel : ".", strerror(e));
    for (size_t i = 0; i < w->n_dirs; i++)
        if (w->dirs[i].wd == wd)
            return 0; /* the same directory by another name */
    w->dirs = xrealloc(w->dirs, (w->n_dirs + 1) * sizeof(*w->dirs));
    w->dirs[w->n_dirs++] = (struct watched_dir){.wd = wd, .rel = xstrdup(sub)};
    return 0;
}

int session_watch_new(struct session *s, const char *rel, bool recursive,
                      struct session_watch **ret)
{
    struct session_file f;
    int r = session_file_stat(s, rel, &f);
    if (r < 0)
        return r;
    bool dir = f.type == SFILE_DIR;
    session_file_release(&f);
    if (!dir)
        return err_set(ENOTDIR, "'%.200s' is not a directory to watch", *rel ? rel : ".");
    struct session_watch *w = xcalloc(1, sizeof(*w));
    w->root = xstrdup(rel);
    w->recursive = recursive;
    w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (w->fd < 0) {
        r = err_set(errno, "cannot watch '%.200s': %s", rel, strerror(errno));
        goto fail;
    }
    if ((r = add_dir(s, w, "")) < 0)
        goto fail;
    if (recursive) {
        struct session_file_list l;
        if ((r = session_file_list(s, rel, SESSION_LIST_MAX_DEPTH, &l)) < 0)
            goto fail;
        size_t skip = *rel ? strlen(rel) + 1 : 0;
        for (size_t i = 0; i < l.n && r == 0; i++)
            if (l.v[i].type == SFILE_DIR)
                r = add_dir(s, w, l.v[i].path + skip);
        session_file_list_release(&l);
        if (r < 0)
            goto fail;
    }
    *ret = w;
    return 0;
fail:
    session_watch_free(w);
    return r;
}

static const char *dir_of(const struct session_watch *w, int wd)
{
    for (size_t i = 0; i < w->n_dirs; i++)
        if (w->dirs[i].wd == wd)
            return w->dirs[i].rel;
    return NULL;
}

static void forget_dir(struct session_watch *w, int wd)
{
    for (size_t i = 0; i < w->n_dirs; i++)
        if (w->dirs[i].wd == wd) {
            free(w->dirs[i].rel);
            w->dirs[i] = w->dirs[--w->n_dirs];
            return;
        }
}

static void pend(struct session_watch *w, enum session_watch_type type, char *name)
{
    struct session_watch_event *last = w->n_pending ? &w->pending[w->n_pending - 1] : NULL;
    /* a file written in many chunks is one event until something else happens */
    if (last && last->type == type && type == SWATCH_WRITE && !strcmp(last->name, name)) {
        free(name);
        return;
    }
    if (w->n_pending >= SESSION_WATCH_MAX_PENDING) {
        w->dropped++;
        free(name);
        return;
    }
    w->pending = xrealloc(w->pending, (w->n_pending + 1) * sizeof(*w->pending));
    w->pending[w->n_pending++] = (struct session_watch_event){.type = type, .name = name};
}

/* What a directory new to a recursive watch already holds once its watch is on (made with
 * it, as `mkdir -p a/b && echo > a/b/c` does, before the watch could see them): each is
 * said made, and its directories are watched too. Something made between the watch and the
 * listing may be said twice, never not at all. */
static void scan_new_dir(struct session *s, struct session_watch *w, const char *sub)
{
    _cleanup_free_ char *rel = *w->root ? xasprintf("%s/%s", w->root, sub) : xstrdup(sub);
    struct session_file_list l;
    if (session_file_list(s, rel, SESSION_LIST_MAX_DEPTH, &l) < 0)
        return; /* gone again, or past the listing's cap */
    size_t skip = *w->root ? strlen(w->root) + 1 : 0;
    for (size_t i = 0; i < l.n; i++) {
        const char *name = l.v[i].path + skip;
        const char *base = strrchr(name, '/');
        if (!strncmp(base ? base + 1 : name, WS_TMP_PREFIX, strlen(WS_TMP_PREFIX)))
            continue;
        if (l.v[i].type == SFILE_DIR)
            (void)add_dir(s, w, name);
        pend(w, SWATCH_CREATE, xstrdup(name));
    }
    session_file_list_release(&l);
}

/* One inotify event: its kind, its name below the watched directory, and (recursive) a watch
 * on a directory it made. */
static void take(struct session *s, struct session_watch *w, const struct inotify_event *ev)
{
    if (ev->mask & IN_Q_OVERFLOW) {
        w->dropped++;
        return;
    }
    if (ev->mask & IN_IGNORED) {
        forget_dir(w, ev->wd);
        return;
    }
    const char *dir = dir_of(w, ev->wd);
    if (!dir || (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF)) || !ev->len)
        return; /* its parent says it went */
    /* the daemon's own temporary files (a file written whole is made beside its name, then
     * renamed over it: its name is what comes in) */
    if (!strncmp(ev->name, WS_TMP_PREFIX, strlen(WS_TMP_PREFIX)))
        return;
    char *name = *dir ? xasprintf("%s/%s", dir, ev->name) : xstrdup(ev->name);
    /* as Go's fsnotify (E2B's envd) says them: a name moved in is made, one moved out is
     * renamed */
    enum session_watch_type type = ev->mask & (IN_CREATE | IN_MOVED_TO) ? SWATCH_CREATE
                                   : ev->mask & IN_MODIFY               ? SWATCH_WRITE
                                   : ev->mask & IN_DELETE               ? SWATCH_REMOVE
                                   : ev->mask & IN_MOVED_FROM           ? SWATCH_RENAME
                                                                        : SWATCH_CHMOD;
    bool new_dir = w->recursive && (ev->mask & (IN_CREATE | IN_MOVED_TO)) && (ev->mask & IN_ISDIR);
    _cleanup_free_ char *sub = new_dir ? xstrdup(name) : NULL;
    pend(w, type, name);
    if (new_dir && add_dir(s, w, sub) == 0)
        scan_new_dir(s, w, sub); /* past the cap: its events are not seen, nothing else */
}

size_t session_watch_read(struct session *s, struct session_watch *w,
                          struct session_watch_event *ret, size_t max)
{
    char buf[64 * 1024] __attribute__((aligned(__alignof__(struct inotify_event))));
    for (int round = 0; round < 16 && w->n_pending < SESSION_WATCH_MAX_PENDING; round++) {
        ssize_t n = read(w->fd, buf, sizeof(buf));
        if (n <= 0)
            break;
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *ev = (const struct inotify_event *)p;
            take(s, w, ev);
            p += sizeof(*ev) + ev->len;
        }
    }
    size_t k = MIN(max, w->n_pending);
    memcpy(ret, w->pending, k * sizeof(*ret));
    memmove(w->pending, w->pending + k, (w->n_pending - k) * sizeof(*w->pending));
    w->n_pending -= k;
    return k;
}
