/* files.c - a session's files as every surface sees them: stat, list, open for reading,
 * write, make a directory, remove, rename; never following a link the sandbox planted,
 * never leaving the workspace, and every listing within one set of caps. */
#include "session/session-int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void entry_fill(struct session_file *f, char *path, const struct stat *st)
{
    f->path = path;
    f->type = S_ISREG(st->st_mode)   ? SFILE_FILE
              : S_ISDIR(st->st_mode) ? SFILE_DIR
              : S_ISLNK(st->st_mode) ? SFILE_LINK
                                     : SFILE_OTHER;
    f->size = (uint64_t)st->st_size;
    f->mode = st->st_mode & 07777;
    f->mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

void session_file_release(struct session_file *f)
{
    free(f->path);
    f->path = NULL;
}

void session_file_list_release(struct session_file_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        session_file_release(&l->v[i]);
    free(l->v);
    memset(l, 0, sizeof(*l));
}

/* fstatat of rel (never following a link); "" is the workspace itself. */
static int stat_rel(struct workspace *ws, const char *rel, struct stat *st)
{
    if (!*rel) {
        _cleanup_close_ int fd = workspace_open(ws);
        return fd < 0 ? fd : fstat(fd, st) < 0 ? -errno : 0;
    }
    const char *leaf;
    _cleanup_close_ int dfd = workspace_open_parent(ws, rel, false, &leaf);
    if (dfd < 0)
        return dfd;
    return fstatat(dfd, leaf, st, AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
}

static int check_rel(const char *rel, bool root_ok)
{
    if (!*rel ? root_ok : path_is_safe_relative(rel))
        return 0;
    return err_set(EINVAL,
                   "bad path '%.200s': use a path inside the workspace, with no '..', '.' or "
                   "empty parts",
                   rel);
}

int session_file_stat(struct session *s, const char *rel, struct session_file *ret)
{
    struct stat st;
    int r = check_rel(rel, true);
    if (r < 0)
        return r;
    if ((r = stat_rel(session_workspace(s), rel, &st)) < 0)
        return err_set(-r, "'%.200s': %s", rel, strerror(-r));
    entry_fill(ret, xstrdup(rel), &st);
    return 0;
}

/* ---- listing ---- */

struct lister {
    struct workspace *ws;
    struct session_file_list *out;
    size_t cap;
    uint64_t deadline_ms;
};

static int push(struct lister *L, char *path, const struct stat *st)
{
    struct session_file_list *l = L->out;
    size_t cost = strlen(path) + SESSION_LIST_ENTRY_COST;
    if (l->n >= SESSION_LIST_MAX_ENTRIES || l->bytes + cost > SESSION_LIST_MAX_BYTES) {
        free(path);
        return -E2BIG;
    }
    if (l->n == L->cap) {
        L->cap = L->cap ? 2 * L->cap : 64;
        l->v = xrealloc(l->v, L->cap * sizeof(*l->v));
    }
    entry_fill(&l->v[l->n++], path, st);
    l->bytes += cost;
    return 0;
}

/* The entries of directory rel (fd, taken), and below it to depth levels. */
static int list_dir(struct lister *L, int fd, const char *rel, unsigned depth)
{
    DIR *d = fdopendir(fd);
    if (!d) {
        int e = -errno;
        close(fd);
        return e;
    }
    struct dirent *de;
    int r = 0;
    while (r == 0 && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
            (!*rel && !strcmp(de->d_name, ".runcell")))
            continue;
        if (now_ms() > L->deadline_ms) {
            r = -ETIMEDOUT;
            break;
        }
        struct stat st;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue; /* gone since it was read */
        /* The path is made only once it is known to fit (a name is at most 255 bytes). */
        if (strlen(rel) + strlen(de->d_name) + 2 > PATH_MAX) {
            r = -ENAMETOOLONG;
            break;
        }
        char *child = *rel ? xasprintf("%s/%s", rel, de->d_name) : xstrdup(de->d_name);
        bool dir = S_ISDIR(st.st_mode);
        if ((r = push(L, child, &st)) < 0)
            break;
        if (dir && depth > 1) {
            int cfd = openat(dirfd(d), de->d_name,
                             O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
            if (cfd >= 0)
                r = list_dir(L, cfd, L->out->v[L->out->n - 1].path, depth - 1);
        }
    }
    closedir(d);
    return r;
}

int session_file_list(struct session *s, const char *rel, unsigned depth,
                      struct session_file_list *ret)
{
    int r = check_rel(rel, true);
    if (r < 0)
        return r;
    struct workspace *ws = session_workspace(s);
    int fd = *rel ? workspace_openat(ws, rel, O_RDONLY | O_DIRECTORY | O_NONBLOCK, 0)
                  : workspace_open(ws);
    if (fd < 0)
        return err_set(-fd, "'%.200s': %s", rel,
                       fd == -ENOTDIR ? "not a directory" : strerror(-fd));
    memset(ret, 0, sizeof(*ret));
    struct lister L = {.ws = ws, .out = ret, .deadline_ms = now_ms() + WS_SCAN_MAX_MS};
    depth = depth < 1 ? 1 : depth > SESSION_LIST_MAX_DEPTH ? SESSION_LIST_MAX_DEPTH : depth;
    r = list_dir(&L, fd, rel, depth);
    if (r < 0) {
        session_file_list_release(ret);
        if (r == -E2BIG)
            return err_set(E2BIG,
                           "'%.200s' holds more than %d entries or %u MiB of paths to the "
                           "depth asked, more than a listing carries; list a subdirectory, or "
                           "with a lower depth",
                           rel, SESSION_LIST_MAX_ENTRIES, SESSION_LIST_MAX_BYTES >> 20);
        if (r == -ETIMEDOUT)
            return err_set(ETIMEDOUT,
                           "listing '%.200s' took longer than %d s; list a "
                           "subdirectory",
                           rel, WS_SCAN_MAX_MS / 1000);
        return err_set(-r, "listing '%.200s': %s", rel, strerror(-r));
    }
    return 0;
}

/* ---- reading and writing ---- */

/* What a file that is not a regular file is, for messages. */
const char *session_file_kind(mode_t mode)
{
    static const struct {
        mode_t type;
        const char *what;
    } kinds[] = {{S_IFSOCK, "a socket"},          {S_IFIFO, "a named pipe (FIFO)"},
                 {S_IFCHR, "a character device"}, {S_IFBLK, "a block device"},
                 {S_IFLNK, "a symbolic link"},    {S_IFDIR, "a directory"}};
    for (size_t i = 0; i < ARRAY_SIZE(kinds); i++)
        if ((mode & S_IFMT) == kinds[i].type)
            return kinds[i].what;
    return "a special file";
}

int session_file_open(struct session *s, const char *rel, struct stat *ret_st)
{
    struct workspace *ws = session_workspace(s);
    int r = check_rel(rel, false);
    if (r < 0)
        return r;
    /* Looked at before it is opened for reading: opening a socket fails (ENXIO), a device
     * may, a FIFO may block; none of them is something to read. */
    struct stat st;
    int fd = workspace_openat(ws, rel, O_PATH, 0);
    if (fd >= 0 && fstat(fd, &st) == 0 && !S_ISREG(st.st_mode)) {
        close(fd);
        return err_set(S_ISDIR(st.st_mode) ? EISDIR : EINVAL,
                       "'%.200s' is %s, not a regular file; only regular files can be read", rel,
                       session_file_kind(st.st_mode));
    }
    if (fd >= 0)
        close(fd);
    fd = workspace_openat(ws, rel, O_RDONLY | O_NONBLOCK, 0);
    if (fd < 0)
        return err_set(-fd, "%s", session_file_error(rel, fd));
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        /* swapped for something else since it was looked at */
        close(fd);
        return err_set(EINVAL, "'%.200s' is not a regular file", rel);
    }
    fd_set_nonblock(fd, false);
    *ret_st = st;
    return fd;
}

const char *session_file_error(const char *rel, int err)
{
    static __thread char msg[512];
    switch (-err) {
    case ENOENT:
        snprintf(msg, sizeof(msg), "no file '%.200s' in the workspace", rel);
        break;
    case ELOOP:
        snprintf(msg, sizeof(msg),
                 "'%.200s' is or goes through a symbolic link; links in the workspace are not "
                 "followed",
                 rel);
        break;
    case EXDEV:
        snprintf(msg, sizeof(msg), "'%.200s' leads out of the workspace", rel);
        break;
    case ENOTDIR:
        /* openat(O_DIRECTORY | O_NOFOLLOW) on a link says ENOTDIR too. */
        snprintf(msg, sizeof(msg),
                 "a part of '%.200s' is not a directory (or is a symbolic link, which is not "
                 "followed)",
                 rel);
        break;
    case EISDIR:
        snprintf(msg, sizeof(msg), "'%.200s' is a directory", rel);
        break;
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
        snprintf(msg, sizeof(msg),
                 "the workspace is full (its size limit was reached) while writing '%.200s'", rel);
        break;
    default:
        snprintf(msg, sizeof(msg), "'%.200s': %s", rel, strerror(-err));
    }
    return msg;
}

int session_file_write(struct session *s, const char *rel, const void *data, size_t n)
{
    int r = check_rel(rel, false);
    if (r < 0)
        return r;
    if ((r = workspace_write(session_workspace(s), rel, data, n)) < 0)
        return r;
    session_save_files(s); /* a store that fails is retried by the next save */
    return 0;
}

int session_file_mkdir(struct session *s, const char *rel)
{
    int r = check_rel(rel, false);
    if (r < 0)
        return r;
    if ((r = workspace_mkdir(session_workspace(s), rel, 0755)) < 0)
        return err_set(-r, "%s", session_file_error(rel, r));
    return 0;
}

int session_file_remove(struct session *s, const char *rel, bool recursive)
{
    int r = check_rel(rel, false);
    if (r < 0)
        return r;
    const char *leaf;
    _cleanup_close_ int dfd = workspace_open_parent(session_workspace(s), rel, false, &leaf);
    if (dfd < 0)
        return err_set(-dfd, "%s", session_file_error(rel, dfd));
    struct stat st;
    if (fstatat(dfd, leaf, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return err_set(errno, "%s", session_file_error(rel, -errno));
    if (S_ISDIR(st.st_mode) && !recursive)
        return err_set(EISDIR, "%s", session_file_error(rel, -EISDIR));
    r = S_ISDIR(st.st_mode) ? rm_rf_at(dfd, leaf) : unlinkat(dfd, leaf, 0) < 0 ? -errno : 0;
    if (r < 0)
        return err_set(-r, "cannot remove '%.200s': %s", rel, strerror(-r));
    session_save_files(s);
    return 0;
}

int session_file_rename(struct session *s, const char *from, const char *to)
{
    int r = check_rel(from, false);
    if (r < 0 || (r = check_rel(to, false)) < 0)
        return r;
    struct workspace *ws = session_workspace(s);
    const char *leaf, *dleaf;
    _cleanup_close_ int dfd = workspace_open_parent(ws, from, false, &leaf);
    if (dfd < 0)
        return err_set(-dfd, "%s", session_file_error(from, dfd));
    _cleanup_close_ int ddfd = workspace_open_parent(ws, to, true, &dleaf);
    if (ddfd < 0)
        return err_set(-ddfd, "%s", session_file_error(to, ddfd));
    if (renameat(dfd, leaf, ddfd, dleaf) < 0)
        return err_set(errno, "cannot move '%.200s' to '%.200s': %s", from, to, strerror(errno));
    session_save_files(s);
    return 0;
}
