/* routes_files.c - the workspace over HTTP: list, download, upload (streamed to a temporary
 * file, then renamed into place), delete. Never follows a link planted in the workspace. */
#include "api/api-int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct upload {
    struct workspace *ws; /* of the session held below */
    struct session *s;
    int dirfd;
    int fd;
    char *tmp_name;
    const char *leaf;
    uint64_t size;
    int err; /* first failure, -errno */
};

/* A persisted session's files are saved before the reply, as after an execution; a store
 * that fails is reported in the reply, and the next save tries again. */
static void save_files(struct session *s, json_t *reply)
{
    if (session_save_files(s) < 0)
        json_object_set_new(reply, "persist_error", json_string(err_msg()));
}

static bool check_path(struct request *rq, const char *path)
{
    if (path_is_safe_relative(path))
        return true;
    api_error(rq, AE_BAD_PATH, "bad path '%s': use a relative path inside the workspace, with "
              "no '..', '.' or empty parts", path);
    return false;
}

/* What a file that is not a regular file is, for messages. */
static const char *file_kind(mode_t mode)
{
    static const struct {
        mode_t type;
        const char *what;
    } kinds[] = {{S_IFSOCK, "a socket"}, {S_IFIFO, "a named pipe (FIFO)"},
                 {S_IFCHR, "a character device"}, {S_IFBLK, "a block device"},
                 {S_IFLNK, "a symbolic link"}, {S_IFDIR, "a directory"}};
    for (size_t i = 0; i < ARRAY_SIZE(kinds); i++)
        if ((mode & S_IFMT) == kinds[i].type)
            return kinds[i].what;
    return "a special file";
}

/* Replies for an -errno from opening a workspace path. */
static enum MHD_Result path_error(struct request *rq, const char *path, int err)
{
    switch (-err) {
    case ENOENT:
        return api_error(rq, AE_NOT_FOUND, "no file '%s' in the workspace", path);
    case ELOOP:
        return api_error(rq, AE_BAD_PATH, "'%s' is or goes through a symbolic link; links in "
                         "the workspace are not followed", path);
    case EXDEV:
        return api_error(rq, AE_BAD_PATH, "'%s' leads out of the workspace", path);
    case ENOTDIR:
        /* openat(O_DIRECTORY | O_NOFOLLOW) on a link says ENOTDIR too. */
        return api_error(rq, AE_BAD_PATH,
                         "a part of '%s' is not a directory (or is a symbolic "
                         "link, which is not followed)",
                         path);
    case EISDIR:
        return api_error(rq, AE_BAD_PATH, "'%s' is a directory", path);
    case EINVAL:
        return api_error(rq, AE_BAD_PATH, "'%s' is not a regular file", path);
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
        return api_error(rq, AE_TOO_LARGE, "the workspace is full (its size limit was reached) "
                         "while writing '%s'", path);
    default:
        return api_error(rq, AE_INTERNAL, "'%s': %s", path, strerror(-err));
    }
}

enum MHD_Result h_files_list(struct request *rq)
{
    struct session *s = acquire_session(rq);
    struct ws_listing l;
    if (!s)
        return MHD_YES;
    int r = workspace_scan(session_workspace(s), &l);
    session_table_release(rq->srv->table, s);
    if (r < 0)
        return api_errno(rq, r);
    json_t *files = json_array();
    for (size_t i = 0; i < l.n; i++) {
        char mtime[32];
        format_time_iso((uint64_t)(l.v[i].mtime_ns / 1000000), mtime);
        size_t n;
        char *path = utf8_sanitize(l.v[i].path, strlen(l.v[i].path), &n);
        json_array_append_new(files, json_pack("{s:s%,s:I,s:s,s:s}", "path", path, n, "size",
                                               (json_int_t)l.v[i].size, "mtime", mtime, "type",
                                               S_ISLNK(l.v[i].mode) ? "symlink" : "file"));
        free(path);
    }
    json_t *j = json_pack("{s:o,s:b}", "files", files, "truncated", l.truncated);
    ws_listing_release(&l);
    return reply_json(rq, 200, j);
}

static const char *content_type(const char *path)
{
    static const char *const types[][2] = {
        {".png", "image/png"},   {".jpg", "image/jpeg"},       {".jpeg", "image/jpeg"},
        {".svg", "image/svg+xml"}, {".json", "application/json"}, {".csv", "text/csv"},
        {".txt", "text/plain; charset=utf-8"}, {".html", "text/html; charset=utf-8"},
        {".pdf", "application/pdf"},
    };
    const char *dot = strrchr(path, '.');
    for (size_t i = 0; dot && i < ARRAY_SIZE(types); i++)
        if (!strcasecmp(dot, types[i][0]))
            return types[i][1];
    return "application/octet-stream";
}

enum MHD_Result h_file_get(struct request *rq)
{
    const char *path = rq->params[1];
    if (!check_path(rq, path))
        return MHD_YES;
    struct session *s = acquire_session(rq);
    if (!s)
        return MHD_YES;
    /* Looked at before it is opened for reading: opening a socket fails (ENXIO), a device
     * may, a FIFO may block; none of them is something to download. */
    struct stat st;
    int fd = workspace_openat(session_workspace(s), path, O_PATH, 0);
    if (fd >= 0 && fstat(fd, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
        session_table_release(rq->srv->table, s);
        close(fd);
        return api_error(rq, AE_BAD_PATH, "'%s' is %s, not a regular file; only regular "
                         "files can be read", path, file_kind(st.st_mode));
    }
    if (fd >= 0)
        close(fd);
    fd = workspace_openat(session_workspace(s), path, O_RDONLY | O_NONBLOCK, 0);
    session_table_release(rq->srv->table, s);
    if (fd < 0)
        return path_error(rq, path, fd);
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return path_error(rq, path, S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL); /* swapped since */
    }
    fd_set_nonblock(fd, false);
    /* Streamed from the fd: the file is never held in memory. */
    struct MHD_Response *r = MHD_create_response_from_fd((uint64_t)st.st_size, fd);
    MHD_add_response_header(r, "Content-Type", content_type(path));
    return reply_response(rq, 200, r);
}

void upload_abort(struct request *rq)
{
    struct upload *u = rq->upload;
    if (!u)
        return;
    if (u->fd >= 0)
        close(u->fd);
    if (u->tmp_name && u->dirfd >= 0)
        unlinkat(u->dirfd, u->tmp_name, 0); /* nothing half-written is left behind */
    if (u->dirfd >= 0)
        close(u->dirfd);
    if (u->s)
        session_table_release(rq->srv->table, u->s);
    free(u->tmp_name);
    free(u);
    rq->upload = NULL;
}

static int upload_begin(struct request *rq)
{
    const char *path = rq->params[1];
    struct upload *u = xcalloc(1, sizeof(*u));
    u->fd = u->dirfd = -1;
    rq->upload = u;
    if (!path_is_safe_relative(path))
        return u->err = -EINVAL;
    int err;
    u->s = session_table_acquire(rq->srv->table, rq->params[0], &err);
    if (!u->s)
        return u->err = err;
    u->ws = session_workspace(u->s);
    u->dirfd = workspace_open_parent(u->ws, path, true, &u->leaf);
    if (u->dirfd < 0)
        return u->err = u->dirfd;
    _cleanup_free_ char *hex = random_hex(8);
    u->tmp_name = xasprintf(".runcell-upload-%s", hex);
    u->fd = openat(u->dirfd, u->tmp_name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                   0644);
    if (u->fd < 0) {
        free(u->tmp_name);
        u->tmp_name = NULL;
        return u->err = -errno;
    }
    return 0;
}

/* Replies for a failed upload: the session, the path, the size or the disk. */
static enum MHD_Result put_error(struct request *rq, int err)
{
    const char *path = rq->params[1];
    if (!check_path(rq, path))
        return MHD_YES;
    if (err == -ENOENT || err == -ETIME)
        return reply_not_live(rq, err); /* the session went while the body came in */
    enum MHD_Result r;
    if (err == -EFBIG)
        r = api_error(rq, AE_TOO_LARGE, "upload larger than the server's limit of %llu bytes",
                      (unsigned long long)rq->srv->cfg->limits.max_upload_bytes);
    else
        r = path_error(rq, path, err);
    upload_abort(rq); /* the partial file goes now, before the client hears of it */
    return r;
}

int h_file_put_chunk(struct request *rq, const char *data, size_t n)
{
    if (!rq->upload)
        upload_begin(rq);
    struct upload *u = rq->upload;
    if (!u->err && u->size + n > rq->srv->cfg->limits.max_upload_bytes)
        u->err = -EFBIG;
    if (!u->err)
        u->err = write_all(u->fd, data, n);
    if (u->err) {
        put_error(rq, u->err); /* the rest of the body is dropped */
        return 0;
    }
    u->size += n;
    return 0;
}

enum MHD_Result h_file_put(struct request *rq)
{
    const char *path = rq->params[1];
    if (!rq->upload)
        upload_begin(rq); /* an empty body */
    struct upload *u = rq->upload;
    if (u->err)
        return put_error(rq, u->err);
    if (fchown(u->fd, u->ws->uid, u->ws->gid) < 0 && u->ws->uid != geteuid())
        return path_error(rq, path, -errno);
    /* A link planted at the destination is refused like any link on the way, so that an
     * upload never seems to write through one. (rename would only replace the link itself,
     * so the race between this check and the rename is harmless.) */
    struct stat st;
    if (fstatat(u->dirfd, u->leaf, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        (S_ISLNK(st.st_mode) || S_ISDIR(st.st_mode)))
        return path_error(rq, path, S_ISLNK(st.st_mode) ? -ELOOP : -EISDIR);
    if (renameat(u->dirfd, u->tmp_name, u->dirfd, u->leaf) < 0)
        return path_error(rq, path, -errno);
    free(u->tmp_name);
    u->tmp_name = NULL;
    json_t *j = json_pack("{s:s,s:I}", "path", path, "size", (json_int_t)u->size);
    save_files(u->s, j);
    return reply_json(rq, 201, j);
}

enum MHD_Result h_file_delete(struct request *rq)
{
    const char *path = rq->params[1];
    const char *leaf;
    if (!check_path(rq, path))
        return MHD_YES;
    struct session *s = acquire_session(rq);
    if (!s)
        return MHD_YES;
    int dfd = workspace_open_parent(session_workspace(s), path, false, &leaf);
    int r = dfd < 0 ? dfd : unlinkat(dfd, leaf, 0) < 0 ? -errno : 0;
    if (dfd >= 0)
        close(dfd);
    json_t *j = r < 0 ? NULL : json_pack("{s:s,s:b}", "path", path, "deleted", 1);
    if (j)
        save_files(s, j);
    session_table_release(rq->srv->table, s);
    if (r == -EISDIR || r == -EPERM)
        return path_error(rq, path, -EISDIR);
    if (r < 0)
        return path_error(rq, path, r);
    return reply_json(rq, 200, j);
}
