/* routes_files.c - the workspace over HTTP: list, download, upload (streamed to a temporary
 * file, then renamed into place), delete. Never follows a link planted in the workspace. */
#include "api/api.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

struct upload {
    struct session *s;
    struct ws_newfile file; /* in the session's workspace */
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
    api_error(rq, AE_BAD_PATH,
              "bad path '%s': use a relative path inside the workspace, with "
              "no '..', '.' or empty parts",
              path);
    return false;
}

/* Replies for an -errno from opening a workspace path. */
static enum MHD_Result path_error(struct request *rq, const char *path, int err)
{
    switch (-err) {
    case ENOENT:
        return api_error(rq, AE_NOT_FOUND, "no file '%s' in the workspace", path);
    case ELOOP:
        return api_error(rq, AE_BAD_PATH,
                         "'%s' is or goes through a symbolic link; links in "
                         "the workspace are not followed",
                         path);
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
        return api_error(rq, AE_TOO_LARGE,
                         "the workspace is full (its size limit was reached) "
                         "while writing '%s'",
                         path);
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
    session_table_put(rq->srv->table, s);
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

/* Text goes out as UTF-8, which is what the sandbox writes (and what a browser should
 * assume rather than guess). */
static const char *content_type(const char *path, char *buf, size_t n)
{
    const char *type = mime_type_of(path);
    if (!type)
        return "application/octet-stream";
    if (!str_has_prefix(type, "text/"))
        return type;
    snprintf(buf, n, "%s; charset=utf-8", type);
    return buf;
}

/* ---- validators and ranges of downloads (RFC 9110 8.8, 13, 14) ---- */

/* The ETag is strong and made of the file's inode, size and modification time (ns): an
 * upload renames a new inode into place, and a write by the sandbox changes the time. Two
 * writes of the same size within one tick of the kernel's coarse clock (a few ms) would keep
 * it; hashing the content instead would read a gigabyte to answer a HEAD. */
static void file_etag(const struct stat *st, char out[80])
{
    uint64_t mtime_ns = (uint64_t)st->st_mtim.tv_sec * 1000000000u + (uint64_t)st->st_mtim.tv_nsec;
    snprintf(out, 80, "\"%llx-%llx-%llx\"", (unsigned long long)st->st_ino,
             (unsigned long long)st->st_size, (unsigned long long)mtime_ns);
}

static void http_date(time_t t, char out[40])
{
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, 40, "%a, %d %b %Y %H:%M:%S GMT", &tm);
}

/* An IMF-fixdate (the only form senders may use); -1 when it is not one. */
static time_t parse_http_date(const char *s)
{
    struct tm tm = {0};
    const char *end = strptime(s, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    return end && !*end ? timegm(&tm) : (time_t)-1;
}

/* Whether a list of entity tags ("*", or "a", W/"b", ...) holds etag; weak comparison
 * (the W/ prefix ignored) as If-None-Match uses. */
static bool etag_listed(const char *list, const char *etag)
{
    size_t n = strlen(etag);
    for (const char *p = list; *p;) {
        p += strspn(p, " \t,");
        if (*p == '*')
            return true;
        if (!strncmp(p, "W/", 2))
            p += 2;
        if (!strncmp(p, etag, n) && (!p[n] || strchr(" \t,", p[n])))
            return true;
        p += strcspn(p, ",");
    }
    return false;
}

/* Not modified since the client's copy (If-None-Match, else If-Modified-Since)? */
static bool not_modified(struct request *rq, const struct stat *st, const char *etag)
{
    const char *inm = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "If-None-Match");
    if (inm)
        return etag_listed(inm, etag);
    const char *ims = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "If-Modified-Since");
    time_t t = ims ? parse_http_date(ims) : (time_t)-1;
    return t != (time_t)-1 && st->st_mtime <= t;
}

/* Whether a Range header applies: If-Range, when sent, must name the file as it is now
 * (its strong ETag, or exactly its Last-Modified). */
static bool range_applies(struct request *rq, const char *etag, const char *modified)
{
    const char *ir = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "If-Range");
    return !ir || !strcmp(ir, etag) || !strcmp(ir, modified);
}

enum range_verdict { RANGE_NONE, RANGE_OK, RANGE_UNSATISFIABLE };

/* One byte range "bytes=A-B", "bytes=A-" or "bytes=-N" of a file of size bytes, as
 * [*off, *off + *len). Several ranges, or a unit other than bytes, are ignored (RFC 9110
 * 14.2 lets a server send the whole file); so is a range that does not parse. */
static enum range_verdict parse_range(const char *h, uint64_t size, uint64_t *off, uint64_t *len)
{
    if (strncasecmp(h, "bytes=", 6) || strchr(h, ','))
        return RANGE_NONE;
    const char *p = h + 6;
    char *end;
    uint64_t a = 0, b = UINT64_MAX;
    bool suffix = *p == '-';
    if (!suffix) {
        if (*p < '0' || *p > '9')
            return RANGE_NONE;
        a = strtoull(p, &end, 10);
        if (*end != '-')
            return RANGE_NONE;
        p = end;
    }
    p++;
    if (*p) {
        if (*p < '0' || *p > '9')
            return RANGE_NONE;
        b = strtoull(p, &end, 10);
        if (*end || (!suffix && b < a))
            return RANGE_NONE;
    } else if (suffix) {
        return RANGE_NONE;
    }
    if (suffix) { /* the last b bytes */
        if (b == 0 || size == 0)
            return RANGE_UNSATISFIABLE;
        *off = b >= size ? 0 : size - b;
        *len = size - *off;
        return RANGE_OK;
    }
    if (a >= size)
        return RANGE_UNSATISFIABLE;
    *off = a;
    *len = MIN(b, size - 1) - a + 1;
    return RANGE_OK;
}

static void validators(struct MHD_Response *r, const char *etag, const char *modified)
{
    MHD_add_response_header(r, "ETag", etag);
    MHD_add_response_header(r, "Last-Modified", modified);
    MHD_add_response_header(r, "Accept-Ranges", "bytes");
}

/* 416 with the JSON error and Content-Range: bytes *\/SIZE (RFC 9110 15.5.17). */
static enum MHD_Result reply_unsatisfiable(struct request *rq, const char *range, uint64_t size)
{
    _cleanup_free_ char *msg = xasprintf("Range '%s' is outside the file, which has %llu "
                                         "bytes",
                                         range, (unsigned long long)size);
    json_t *j =
        json_pack("{s:{s:s,s:s}}", "error", "code", "range_not_satisfiable", "message", msg);
    _cleanup_free_ char *cr = xasprintf("bytes */%llu", (unsigned long long)size);
    return reply_json_header(rq, 416, j, "Content-Range", cr);
}

/* Sends the open regular file fd (taken): 304, 206 or 416 as the request's conditions and
 * Range say, else 200. Streamed from the fd: the file is never held in memory. */
static enum MHD_Result reply_file(struct request *rq, const char *path, int fd,
                                  const struct stat *st)
{
    char etag[80], modified[40];
    file_etag(st, etag);
    http_date(st->st_mtime, modified);
    uint64_t size = (uint64_t)st->st_size, off = 0, len = size;
    struct MHD_Response *r;
    if (not_modified(rq, st, etag)) {
        close(fd);
        r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        validators(r, etag, modified);
        return reply_response(rq, 304, r);
    }
    const char *range = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Range");
    enum range_verdict v = range && range_applies(rq, etag, modified)
                               ? parse_range(range, size, &off, &len)
                               : RANGE_NONE;
    if (v == RANGE_UNSATISFIABLE) {
        close(fd);
        return reply_unsatisfiable(rq, range, size);
    }
    r = MHD_create_response_from_fd_at_offset64(len, fd, off);
    if (!r) {
        close(fd);
        return api_error(rq, AE_INTERNAL, "cannot send '%s'", path);
    }
    char type[96];
    MHD_add_response_header(r, "Content-Type", content_type(path, type, sizeof(type)));
    validators(r, etag, modified);
    if (v == RANGE_OK) {
        _cleanup_free_ char *cr =
            xasprintf("bytes %llu-%llu/%llu", (unsigned long long)off,
                      (unsigned long long)(off + len - 1), (unsigned long long)size);
        MHD_add_response_header(r, "Content-Range", cr);
    }
    return reply_response(rq, v == RANGE_OK ? 206 : 200, r);
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
        session_table_put(rq->srv->table, s);
        close(fd);
        return api_error(rq, AE_BAD_PATH,
                         "'%s' is %s, not a regular file; only regular "
                         "files can be read",
                         path, session_file_kind(st.st_mode));
    }
    if (fd >= 0)
        close(fd);
    fd = workspace_openat(session_workspace(s), path, O_RDONLY | O_NONBLOCK, 0);
    session_table_put(rq->srv->table, s);
    if (fd < 0)
        return path_error(rq, path, fd);
    if (fstat(fd, &st) < 0) {
        int e = -errno;
        close(fd);
        return path_error(rq, path, e);
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return path_error(rq, path, S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL); /* swapped since */
    }
    fd_set_nonblock(fd, false);
    return reply_file(rq, path, fd, &st);
}

void upload_abort(struct request *rq)
{
    struct upload *u = rq->upload;
    if (!u)
        return;
    ws_newfile_abort(&u->file); /* nothing half-written is left behind */
    if (u->s)
        session_table_put(rq->srv->table, u->s);
    free(u);
    rq->upload = NULL;
}

static int upload_begin(struct request *rq)
{
    const char *path = rq->params[1];
    struct upload *u = xcalloc(1, sizeof(*u));
    u->file = (struct ws_newfile){.fd = -1, .dirfd = -1};
    rq->upload = u;
    rq->on_free = upload_abort;
    if (!path_is_safe_relative(path))
        return u->err = -EINVAL;
    int err;
    u->s = session_table_acquire(rq->srv->table, rq->params[0], &err);
    if (!u->s)
        return u->err = err;
    return u->err = ws_newfile_open(session_workspace(u->s), path, 0644, &u->file);
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

/* Before the body: the session must be live and the declared length must fit in what its
 * workspace has left (its tmpfs's size cap, less what is used), so that a client waiting
 * with "Expect: 100-continue" hears 404 or 413 instead of sending the body for nothing. A
 * body of unknown length is refused only when no byte is left. The temporary file is written
 * beside the one it replaces, so the old file's space does not count as free. */
bool h_file_put_admit(struct request *rq, uint64_t declared)
{
    if (!check_path(rq, rq->params[1]))
        return false;
    int err;
    struct session *s = session_table_acquire(rq->srv->table, rq->params[0], &err);
    if (!s) {
        reply_not_live(rq, err);
        return false;
    }
    struct statvfs sv;
    _cleanup_close_ int dfd = workspace_open(session_workspace(s));
    int r = dfd < 0 ? dfd : fstatvfs(dfd, &sv) < 0 ? -errno : 0;
    session_table_put(rq->srv->table, s);
    if (r < 0)
        return true; /* the upload itself will say what is wrong */
    uint64_t left = (uint64_t)sv.f_bavail * sv.f_frsize;
    uint64_t total = (uint64_t)sv.f_blocks * sv.f_frsize;
    if (declared == UINT64_MAX ? left > 0 : declared <= left)
        return true;
    if (declared == UINT64_MAX)
        api_error(rq, AE_TOO_LARGE,
                  "the workspace is full (0 bytes left of its %llu-byte "
                  "size limit); delete files or create the session with a larger disk_mb",
                  (unsigned long long)total);
    else
        api_error(rq, AE_TOO_LARGE,
                  "the workspace is too full for an upload of %llu bytes: "
                  "it has %llu bytes left of its %llu-byte size limit; delete files or create "
                  "the session with a larger disk_mb",
                  (unsigned long long)declared, (unsigned long long)left,
                  (unsigned long long)total);
    return false;
}

int h_file_put_chunk(struct request *rq, const char *data, size_t n)
{
    if (!rq->upload)
        upload_begin(rq);
    struct upload *u = rq->upload;
    if (!u->err && u->size + n > rq->srv->cfg->limits.max_upload_bytes)
        u->err = -EFBIG;
    if (!u->err)
        u->err = write_all(u->file.fd, data, n);
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
    /* A link planted at the destination is refused like any link on the way, so that an
     * upload never seems to write through one. */
    bool replaced;
    int r = ws_newfile_commit(&u->file, WS_REFUSE_LINK, &replaced);
    if (r < 0)
        return path_error(rq, path, r);
    json_t *j = json_pack("{s:s,s:I}", "path", path, "size", (json_int_t)u->size);
    save_files(u->s, j);
    /* 201 for a new file, 200 for one replaced (RFC 9110 9.3.4). */
    return reply_json(rq, replaced ? 200 : 201, j);
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
    session_table_put(rq->srv->table, s);
    if (r == -EISDIR || r == -EPERM)
        return path_error(rq, path, -EISDIR);
    if (r < 0)
        return path_error(rq, path, r);
    return reply_json(rq, 200, j);
}
