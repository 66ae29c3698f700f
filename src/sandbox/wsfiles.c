/* wsfiles.c - reading and writing workspace files from the daemon without trusting
 * anything the sandboxed code may have placed there. */
#include "sandbox/workspace-int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static const char *const skipped_top[] = {".local", ".cache", ".config", ".runcell"};

int workspace_openat(const struct workspace *ws, const char *rel, int flags, mode_t mode)
{
    if (!path_is_safe_relative(rel))
        return -EINVAL;
    _cleanup_close_ int dfd = open(ws->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (dfd < 0)
        return -errno;
    struct open_how how = {
        .flags = (uint64_t)(flags | O_NOFOLLOW | O_CLOEXEC),
        .mode = (flags & O_CREAT) ? mode : 0,
        .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV,
    };
    int fd = (int)syscall(SYS_openat2, dfd, rel, &how, sizeof(how));
    return fd < 0 ? -errno : fd;
}

int workspace_mkparents(const struct workspace *ws, const char *rel)
{
    if (!path_is_safe_relative(rel))
        return -EINVAL;
    _cleanup_free_ char *p = xstrdup(rel);
    int cur = open(ws->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (cur < 0)
        return -errno;
    /* One component at a time from a verified directory fd, O_NOFOLLOW on each: no link
     * is ever followed on the way down. */
    char *comp = p;
    int r = 0;
    for (char *slash = strchr(comp, '/'); slash; comp = slash + 1, slash = strchr(comp, '/')) {
        *slash = '\0';
        int next = openat(cur, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (next < 0 && errno == ENOENT) {
            if (mkdirat(cur, comp, 0755) < 0 && errno != EEXIST) {
                r = -errno;
                break;
            }
            workspace_chown(ws, cur, comp);
            next = openat(cur, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        }
        if (next < 0) {
            r = -errno;
            break;
        }
        close(cur);
        cur = next;
    }
    close(cur);
    return r;
}

int workspace_open_parent(const struct workspace *ws, const char *rel, bool create,
                          const char **ret_leaf)
{
    if (!path_is_safe_relative(rel))
        return -EINVAL;
    if (create) {
        int r = workspace_mkparents(ws, rel);
        if (r < 0)
            return r;
    }
    const char *slash = strrchr(rel, '/');
    *ret_leaf = slash ? slash + 1 : rel;
    if (!slash) {
        int fd = open(ws->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        return fd < 0 ? -errno : fd;
    }
    _cleanup_free_ char *dir = xstrndup(rel, (size_t)(slash - rel));
    return workspace_openat(ws, dir, O_RDONLY | O_DIRECTORY, 0);
}

static int copy_fd(int in, int out)
{
    char chunk[65536];
    for (;;) {
        ssize_t n = read(in, chunk, sizeof(chunk));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (n == 0)
            return 0;
        int r = write_all(out, chunk, (size_t)n);
        if (r < 0)
            return r;
    }
}

/* Hands fd's file to the sandbox user. Unprivileged, the sandbox user is runcell's own uid
 * and the files are already its own, so a failure to change the owner is no failure. */
static int give(const struct workspace *ws, int fd)
{
    if (fchown(fd, ws->uid, ws->gid) < 0 && ws->uid != geteuid())
        return -errno;
    return 0;
}

int workspace_mkdir(const struct workspace *ws, const char *rel, mode_t mode)
{
    const char *leaf;
    _cleanup_close_ int dfd = workspace_open_parent(ws, rel, true, &leaf);
    if (dfd < 0)
        return dfd;
    if (mkdirat(dfd, leaf, mode) < 0)
        return -errno;
    return workspace_chown(ws, dfd, leaf);
}

int workspace_symlink(const struct workspace *ws, const char *target, const char *rel)
{
    const char *leaf;
    _cleanup_close_ int dfd = workspace_open_parent(ws, rel, true, &leaf);
    if (dfd < 0)
        return dfd;
    if (symlinkat(target, dfd, leaf) < 0)
        return -errno;
    return workspace_chown(ws, dfd, leaf);
}

int ws_newfile_open(const struct workspace *ws, const char *rel, mode_t mode,
                    struct ws_newfile *ret)
{
    const char *leaf;
    *ret = (struct ws_newfile){.fd = -1, .dirfd = -1};
    int dfd = workspace_open_parent(ws, rel, true, &leaf);
    if (dfd < 0)
        return err_set(-dfd, "cannot create the directories of %s in the workspace: %s", rel,
                       strerror(-dfd));
    _cleanup_free_ char *hex = random_hex(8);
    char *tmp = xasprintf(WS_TMP_PREFIX "%s", hex);
    /* A fresh name, O_EXCL and O_NOFOLLOW: nothing the sandbox placed is opened. */
    int fd = openat(dfd, tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0) {
        int e = errno;
        close(dfd);
        free(tmp);
        return err_set(e, "cannot create %s in the workspace: %s", rel, strerror(e));
    }
    *ret = (struct ws_newfile){
        .fd = fd, .ws = ws, .dirfd = dfd, .tmp_name = tmp, .leaf = xstrdup(leaf)};
    return 0;
}

int ws_newfile_commit(struct ws_newfile *f, unsigned flags, bool *ret_replaced)
{
    struct stat st;
    bool replaced = fstatat(f->dirfd, f->leaf, &st, AT_SYMLINK_NOFOLLOW) == 0;
    int r = give(f->ws, f->fd);
    /* (rename would only replace a link itself, so the race between this look and the
     * rename is harmless: the check is there to say no, not to keep anything safe.) */
    if (!r && replaced && (flags & WS_REFUSE_LINK) && (S_ISLNK(st.st_mode) || S_ISDIR(st.st_mode)))
        r = S_ISLNK(st.st_mode) ? -ELOOP : -EISDIR;
    if (!r && renameat(f->dirfd, f->tmp_name, f->dirfd, f->leaf) < 0)
        r = -errno;
    if (r < 0) {
        ws_newfile_abort(f);
        return r;
    }
    free(f->tmp_name);
    f->tmp_name = NULL;
    ws_newfile_abort(f); /* now only closes */
    if (ret_replaced)
        *ret_replaced = replaced;
    return 0;
}

void ws_newfile_abort(struct ws_newfile *f)
{
    if (f->tmp_name && f->dirfd >= 0)
        unlinkat(f->dirfd, f->tmp_name, 0);
    if (f->fd >= 0)
        close(f->fd);
    if (f->dirfd >= 0)
        close(f->dirfd);
    free(f->tmp_name);
    free(f->leaf);
    *f = (struct ws_newfile){.fd = -1, .dirfd = -1};
}

int workspace_copy_in(const struct workspace *ws, const char *host_path, const char *rel)
{
    _cleanup_close_ int in = open(host_path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (in < 0)
        return err_set(errno, "cannot read %s: %s", host_path, strerror(errno));
    if (fstat(in, &st) < 0 || !S_ISREG(st.st_mode))
        return err_set(EINVAL, "%s is not a regular file", host_path);
    struct ws_newfile f;
    int r = ws_newfile_open(ws, rel, 0644, &f);
    if (r < 0)
        return r;
    if ((r = copy_fd(in, f.fd)) < 0) {
        ws_newfile_abort(&f);
        return err_set(-r, "cannot copy %s into the workspace: %s", host_path, strerror(-r));
    }
    if ((r = ws_newfile_commit(&f, 0, NULL)) < 0)
        return err_set(-r, "cannot copy %s into the workspace: %s", host_path, strerror(-r));
    return 0;
}

int workspace_copy_out(const struct workspace *ws, const char *rel, const char *out_dir)
{
    _cleanup_close_ int in = workspace_openat(ws, rel, O_RDONLY | O_NONBLOCK, 0);
    struct stat st;
    if (in == -ELOOP)
        return err_set(ELOOP, "%s is a symbolic link: only regular files are copied out", rel);
    if (in < 0)
        return err_set(-in, "cannot open %s in the workspace: %s", rel, strerror(-in));
    if (fstat(in, &st) < 0 || !S_ISREG(st.st_mode))
        return err_set(EINVAL, "%s is not a regular file", rel);
    /* The sandbox paid nothing for a sparse file's holes; written out, they would be real
     * bytes on the host's disk (2^62 of them, if it likes). */
    if ((uint64_t)st.st_size > (uint64_t)st.st_blocks * 512 + (1u << 20))
        return err_set(EFBIG,
                       "%s is a sparse file (%.1f MB apparent, %.1f MB allocated): not "
                       "copied out",
                       rel, (double)st.st_size / 1048576.0, (double)st.st_blocks * 512 / 1048576.0);
    _cleanup_free_ char *dst = xasprintf("%s/%s", out_dir, rel);
    char *slash = strrchr(dst, '/');
    *slash = '\0';
    int r = mkdir_p(dst, 0755);
    *slash = '/';
    if (r < 0)
        return err_set(-r, "cannot create %s: %s", dst, strerror(-r));
    _cleanup_close_ int out =
        open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (out < 0)
        return err_set(errno, "cannot write %s: %s", dst, strerror(errno));
    fd_set_nonblock(in, false);
    if ((r = copy_fd(in, out)) < 0)
        return err_set(-r, "cannot copy %s to %s: %s", rel, dst, strerror(-r));
    return 0;
}

int workspace_read(const struct workspace *ws, const char *rel, size_t cap, struct buf *ret,
                   uint64_t *ret_size)
{
    _cleanup_close_ int fd = workspace_openat(ws, rel, O_RDONLY | O_NONBLOCK, 0);
    if (fd < 0) {
        buf_init(ret, 0);
        return fd;
    }
    return read_regular_fd(fd, cap, ret, ret_size);
}

int workspace_write(const struct workspace *ws, const char *rel, const void *data, size_t n)
{
    struct ws_newfile f;
    int r = ws_newfile_open(ws, rel, 0644, &f);
    if (r < 0)
        return r;
    if ((r = write_all(f.fd, data, n)) < 0)
        ws_newfile_abort(&f);
    else
        r = ws_newfile_commit(&f, 0, NULL);
    if (r < 0)
        return err_set(-r, "cannot write %s in the workspace: %s", rel, strerror(-r));
    return 0;
}

struct scan {
    struct ws_listing *l;
    size_t alloc;
    size_t entries; /* files, links and directories seen */
    int depth;
    double deadline_ms;
};

/* Whether the scan may go on with one more entry of path_len bytes; past a budget it
 * stops, and the listing says so. */
static bool scan_budget(struct scan *s, size_t path_len)
{
    if (s->l->truncated)
        return false;
    if (++s->entries > WS_SCAN_MAX || path_len >= PATH_MAX ||
        s->l->bytes + path_len + 1 > WS_SCAN_MAX_BYTES ||
        ((s->entries & 255) == 0 && now_ms_f() > s->deadline_ms)) {
        s->l->truncated = true;
        return false;
    }
    return true;
}

static void scan_add(struct scan *s, char *path, size_t path_len, const struct stat *st)
{
    if (s->l->n == s->alloc) {
        s->alloc = s->alloc ? 2 * s->alloc : 64;
        s->l->v = xrealloc(s->l->v, s->alloc * sizeof(*s->l->v));
    }
    s->l->bytes += path_len + 1;
    s->l->v[s->l->n++] = (struct ws_entry){
        .path = path,
        .size = (uint64_t)st->st_size,
        .mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec,
        .ino = st->st_ino,
        .mode = st->st_mode,
    };
}

static bool skipped_at_top(const char *name)
{
    for (size_t i = 0; i < ARRAY_SIZE(skipped_top); i++)
        if (!strcmp(name, skipped_top[i]))
            return true;
    return false;
}

/* A directory's entries straight from getdents64 on an fd the caller opened: readdir's
 * fdopendir costs an fstat and two fcntls per directory, on every scan of every cell. */
struct dir_reader {
    int fd;
    char *buf;
    size_t len, pos;
};

struct kdirent64 {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

#define DIR_READER_BUF 32768

/* The next entry's name, or NULL at the end or on an error. */
static const char *dir_next(struct dir_reader *r)
{
    if (r->pos >= r->len) {
        ssize_t n = getdents64(r->fd, r->buf, DIR_READER_BUF);
        if (n <= 0)
            return NULL;
        r->len = (size_t)n;
        r->pos = 0;
    }
    const struct kdirent64 *e = (const struct kdirent64 *)(r->buf + r->pos);
    r->pos += e->d_reclen;
    return e->d_name;
}

/* Scans dfd, which it closes unless it is the workspace's kept one (own false). */
static void scan_dir(struct scan *s, int dfd, const char *prefix, dev_t dev, bool own)
{
    struct dir_reader d = {.fd = dfd, .buf = xmalloc(DIR_READER_BUF)};
    const char *name;
    size_t plen = strlen(prefix);
    while ((name = dir_next(&d)) && !s->l->truncated) {
        struct stat st;
        if (!strcmp(name, ".") || !strcmp(name, ".."))
            continue;
        if (!*prefix && skipped_at_top(name))
            continue;
        if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 || st.st_dev != dev)
            continue;
        if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode))
            continue;
        size_t len = (plen ? plen + 1 : 0) + strlen(name);
        if (!scan_budget(s, len))
            break;
        char *path = plen ? xasprintf("%s/%s", prefix, name) : xstrdup(name);
        if (!S_ISDIR(st.st_mode)) {
            scan_add(s, path, len, &st);
            continue;
        }
        int sub = s->depth >= WS_SCAN_MAX_DEPTH
                      ? -1
                      : openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub >= 0) {
            s->depth++;
            scan_dir(s, sub, path, dev, true);
            s->depth--;
        }
        free(path);
    }
    free(d.buf);
    if (own)
        close(dfd);
}

static int entry_cmp(const void *a, const void *b)
{
    return strcmp(((const struct ws_entry *)a)->path, ((const struct ws_entry *)b)->path);
}

/* The workspace's directory for a scan, read from its start: the kept fd (*ret_kept set, its
 * lock held), or one opened for this scan alone (a workspace made without workspace_new
 * keeps none). -1 with errno on failure. */
static int scan_open(const struct workspace *ws, bool *ret_kept)
{
    *ret_kept = false;
    if (ws->scan && pthread_mutex_trylock(&ws->scan->lock) == 0) {
        if (ws->scan->fd < 0)
            ws->scan->fd = open(ws->dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (ws->scan->fd >= 0 && lseek(ws->scan->fd, 0, SEEK_SET) == 0) {
            *ret_kept = true;
            return ws->scan->fd;
        }
        pthread_mutex_unlock(&ws->scan->lock);
    }
    return open(ws->dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

int workspace_scan(const struct workspace *ws, struct ws_listing *ret)
{
    struct stat st = {.st_dev = ws->dev};
    bool kept;
    memset(ret, 0, sizeof(*ret));
    int dfd = scan_open(ws, &kept);
    if (dfd < 0 || (!ws->dev && fstat(dfd, &st) < 0)) {
        int e = errno;
        if (kept)
            pthread_mutex_unlock(&ws->scan->lock);
        else if (dfd >= 0)
            close(dfd);
        return err_set(e, "cannot read workspace %s: %s", ws->dir, strerror(e));
    }
    struct scan s = {.l = ret, .deadline_ms = now_ms_f() + WS_SCAN_MAX_MS};
    scan_dir(&s, dfd, "", st.st_dev, !kept);
    if (kept)
        pthread_mutex_unlock(&ws->scan->lock);
    if (ret->n)
        qsort(ret->v, ret->n, sizeof(*ret->v), entry_cmp);
    return 0;
}

void ws_listing_release(struct ws_listing *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i].path);
    free(l->v);
    memset(l, 0, sizeof(*l));
}

/* A vector that grows by doubling (strv_push counts its length on every call). */
struct pathv {
    char **v;
    size_t n, alloc;
};

static void pathv_push(struct pathv *p, const char *s)
{
    if (p->n + 1 >= p->alloc) {
        p->alloc = p->alloc ? 2 * p->alloc : 16;
        p->v = xrealloc(p->v, p->alloc * sizeof(char *));
    }
    p->v[p->n++] = xstrdup(s);
    p->v[p->n] = NULL;
}

static char **pathv_take(struct pathv *p)
{
    return p->v ? p->v : xcalloc(1, sizeof(char *));
}

void ws_listing_diff(const struct ws_listing *before, const struct ws_listing *after,
                     char ***ret_created, char ***ret_modified, char ***ret_deleted)
{
    struct pathv created = {0}, modified = {0}, deleted = {0};
    size_t i = 0, j = 0;
    /* Both listings are sorted by path: one merge pass. */
    while (i < before->n || j < after->n) {
        int c = i >= before->n  ? 1
                : j >= after->n ? -1
                                : strcmp(before->v[i].path, after->v[j].path);
        if (c < 0) {
            /* A scan cut short saw only part of the workspace: what it missed is not gone. */
            if (!after->truncated)
                pathv_push(&deleted, before->v[i].path);
            i++;
        } else if (c > 0) {
            pathv_push(&created, after->v[j++].path);
        } else {
            const struct ws_entry *a = &before->v[i++], *b = &after->v[j++];
            if (a->size != b->size || a->mtime_ns != b->mtime_ns || a->ino != b->ino ||
                a->mode != b->mode)
                pathv_push(&modified, b->path);
        }
    }
    *ret_created = pathv_take(&created);
    *ret_modified = pathv_take(&modified);
    *ret_deleted = pathv_take(&deleted);
}
