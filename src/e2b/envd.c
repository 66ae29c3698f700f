/* envd.c - envd's routes: /health, /files (read and upload) and the filesystem service over
 * Connect RPC with the JSON codec (process.c has the process service). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "e2b/e2b-int.h"

enum MHD_Result h_e2b_files_get(struct request *rq)
{
    const char *box = e2b_box_id(rq);
    const char *p = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "path");
    char why[512];
    _cleanup_free_ char *rel = e2b_ws_path(p, why);
    if (!rel)
        return e2b_error(rq, 400, "query 'path': %s", why);
    if (!*rel)
        return e2b_error(rq, 400, "'%s' is a directory", p);
    struct session *s = e2b_box_session(rq, box);
    if (!s)
        return MHD_YES;
    /* Streamed from the fd: the file is never held in memory. */
    struct stat st;
    int fd = session_file_open(s, rel, &st);
    session_table_put(rq->srv->table, s);
    if (fd < 0)
        return e2b_error(rq, e2b_path_status(fd), "cannot read '%s': %s", p, err_msg());
    struct MHD_Response *resp = MHD_create_response_from_fd((uint64_t)st.st_size, fd);
    MHD_add_response_header(resp, "Content-Type", "application/octet-stream");
    return reply_response(rq, 200, resp);
}

static enum MHD_Result write_one(struct request *rq, struct session *s, const char *path,
                                 const void *data, size_t n, json_t *out)
{
    char why[512];
    _cleanup_free_ char *rel = e2b_ws_path(path, why);
    if (!rel)
        return e2b_error(rq, 400, "path: %s", why);
    if (!*rel)
        return e2b_error(rq, 400, "'%s' is a directory", path);
    int r = session_file_write(s, rel, data, n);
    if (r < 0)
        return e2b_error(rq, e2b_path_status(r), "cannot write '%s': %s", path, err_msg());
    const char *slash = strrchr(rel, '/');
    _cleanup_free_ char *abs = e2b_abs(rel);
    json_array_append_new(out, json_pack("{s:s,s:s,s:s}", "path", abs, "name",
                                         slash ? slash + 1 : rel, "type", "file"));
    return MHD_YES;
}

enum MHD_Result h_e2b_files_post(struct request *rq)
{
    const char *box = e2b_box_id(rq);
    const char *path = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "path");
    const char *ct = e2b_header(rq, "Content-Type");
    const char *enc = e2b_header(rq, "Content-Encoding");
    if (enc && strcmp(enc, "identity"))
        return e2b_error(rq, 400, "Content-Encoding '%s' is not supported; upload without gzip",
                         enc);
    struct session *s = e2b_box_session(rq, box);
    if (!s)
        return MHD_YES;
    json_t *out = json_array();
    enum MHD_Result ret = MHD_YES;
    if (ct && str_has_prefix(ct, "multipart/form-data")) {
        const char *bd = strstr(ct, "boundary=");
        char boundary[200];
        struct e2b_part *parts = xcalloc(E2B_MAX_PARTS, sizeof(*parts));
        int n = -1;
        if (bd) {
            bd += 9;
            bool quoted = *bd == '"';
            snprintf(boundary, sizeof(boundary), "%.*s", (int)strcspn(bd + quoted, "\";"),
                     bd + quoted);
            n = e2b_multipart_parts(rq->body.data ? rq->body.data : "", rq->body.len, boundary,
                                    parts, E2B_MAX_PARTS);
        }
        if (n == -2)
            ret = e2b_error(rq, 400, "a file name in the multipart body is longer than %zu bytes",
                            sizeof(parts->filename) - 1);
        else if (n < 0)
            ret = e2b_error(rq, 400,
                            "the multipart body is not well formed (or has more than "
                            "%d files)",
                            E2B_MAX_PARTS);
        for (int i = 0; i < n && !rq->responded; i++) {
            const char *dest = path && n == 1 ? path : parts[i].filename;
            ret = write_one(rq, s, dest, parts[i].data, parts[i].len, out);
        }
        free(parts);
    } else if (path) {
        ret = write_one(rq, s, path, rq->body.data ? rq->body.data : "", rq->body.len, out);
    } else {
        ret = e2b_error(rq, 400, "query 'path' is required for an octet-stream upload");
    }
    session_table_put(rq->srv->table, s);
    if (rq->responded) {
        json_decref(out);
        return ret;
    }
    return reply_json(rq, 200, out);
}

/* ---- the filesystem service ---- */

static const char *perm_string(mode_t m, char out[11])
{
    const char *t = S_ISDIR(m) ? "d" : S_ISLNK(m) ? "l" : "-";
    snprintf(out, 11, "%s%c%c%c%c%c%c%c%c%c", t, m & 0400 ? 'r' : '-', m & 0200 ? 'w' : '-',
             m & 0100 ? 'x' : '-', m & 040 ? 'r' : '-', m & 020 ? 'w' : '-', m & 010 ? 'x' : '-',
             m & 04 ? 'r' : '-', m & 02 ? 'w' : '-', m & 01 ? 'x' : '-');
    return out;
}

static json_t *entry_json(const struct session_file *f)
{
    static const char *const types[] = {[SFILE_FILE] = "FILE_TYPE_FILE",
                                        [SFILE_DIR] = "FILE_TYPE_DIRECTORY",
                                        [SFILE_LINK] = "FILE_TYPE_SYMLINK",
                                        [SFILE_OTHER] = "FILE_TYPE_UNSPECIFIED"};
    static const mode_t type_bits[] = {
        [SFILE_FILE] = S_IFREG, [SFILE_DIR] = S_IFDIR, [SFILE_LINK] = S_IFLNK, [SFILE_OTHER] = 0};
    char perm[11], mtime[32], size[24];
    format_time_iso((uint64_t)(f->mtime_ns / 1000000), mtime);
    _cleanup_free_ char *abs = e2b_abs(f->path);
    const char *slash = strrchr(abs, '/');
    snprintf(size, sizeof(size), "%llu", (unsigned long long)f->size);
    size_t n;
    char *clean_abs = utf8_sanitize(abs, strlen(abs), &n);
    char *clean_name = utf8_sanitize(slash + 1, strlen(slash + 1), NULL);
    json_t *j = json_pack("{s:s,s:s,s:s%,s:s,s:i,s:s,s:s,s:s,s:s}", "name", clean_name, "type",
                          types[f->type], "path", clean_abs, n, "size", size, "mode", (int)f->mode,
                          "permissions", perm_string(type_bits[f->type] | f->mode, perm), "owner",
                          "user", "group", "user", "modifiedTime", mtime);
    free(clean_abs);
    free(clean_name);
    return j;
}

static enum MHD_Result fs_error(struct request *rq, int r)
{
    return e2b_connect_error(rq, e2b_errno_code(r), "%s", err_msg());
}

static enum MHD_Result fs_reply_entry(struct request *rq, struct session *s, const char *rel)
{
    struct session_file f;
    int r = session_file_stat(s, rel, &f);
    if (r < 0)
        return fs_error(rq, r);
    json_t *j = json_pack("{s:o}", "entry", entry_json(&f));
    session_file_release(&f);
    return reply_json(rq, 200, j);
}

static enum MHD_Result fs_list(struct request *rq, struct session *s, const char *rel, json_t *msg)
{
    json_int_t depth = json_integer_value(json_object_get(msg, "depth"));
    struct session_file_list l;
    int r = session_file_list(s, rel, depth < 1 ? 1 : depth > 64 ? 64 : (unsigned)depth, &l);
    if (r < 0)
        return e2b_connect_error(rq, r == -E2BIG ? "resource_exhausted" : e2b_errno_code(r), "%s",
                                 err_msg());
    json_t *arr = json_array();
    for (size_t i = 0; i < l.n; i++)
        json_array_append_new(arr, entry_json(&l.v[i]));
    session_file_list_release(&l);
    return reply_json(rq, 200, json_pack("{s:o}", "entries", arr));
}

static enum MHD_Result fs_call(struct request *rq, const char *method, json_t *msg,
                               struct session *s)
{
    const char *p =
        json_string_value(json_object_get(msg, strcmp(method, "Move") ? "path" : "source"));
    char why[512];
    if (!p)
        p = ""; /* proto3's JSON leaves a default out: an empty path is the home */
    _cleanup_free_ char *rel = e2b_ws_path(p, why);
    if (!rel)
        return e2b_connect_error(rq, "invalid_argument", "%s", why);
    if (!strcmp(method, "Stat"))
        return fs_reply_entry(rq, s, rel);
    if (!strcmp(method, "ListDir"))
        return fs_list(rq, s, rel, msg);
    if (!*rel && !strcmp(method, "MakeDir")) /* as E2B answers for any existing directory */
        return e2b_connect_error(rq, "already_exists", "'%s' already exists", p);
    if (!*rel)
        return e2b_connect_error(rq, "invalid_argument", "'%s' is the workspace itself", p);
    int r;
    if (!strcmp(method, "MakeDir")) {
        if ((r = session_file_mkdir(s, rel)) < 0)
            return fs_error(rq, r);
        return fs_reply_entry(rq, s, rel);
    }
    if (!strcmp(method, "Remove")) {
        if ((r = session_file_remove(s, rel, true)) < 0)
            return fs_error(rq, r);
        return reply_json(rq, 200, json_object());
    }
    /* Move */
    const char *dst = json_string_value(json_object_get(msg, "destination"));
    _cleanup_free_ char *drel = e2b_ws_path(dst, why);
    if (!drel || !*drel)
        return e2b_connect_error(rq, "invalid_argument", "destination: %s",
                                 drel ? "the workspace itself" : why);
    if ((r = session_file_rename(s, rel, drel)) < 0)
        return fs_error(rq, r);
    return fs_reply_entry(rq, s, drel);
}

enum MHD_Result h_e2b_filesystem_rpc(struct request *rq)
{
    static const char *const methods[] = {
        "Stat",     "ListDir",       "MakeDir",          "Remove",       "Move",
        "WatchDir", "CreateWatcher", "GetWatcherEvents", "RemoveWatcher"};
    const char *box = e2b_box_id(rq), *method = rq->params[0];
    bool known = false;
    for (size_t i = 0; i < ARRAY_SIZE(methods); i++)
        known |= !strcmp(methods[i], method);
    if (!known)
        return e2b_connect_error(rq, "unimplemented",
                                 "filesystem.Filesystem/%s is not a method runcell knows", method);
    bool watch = !strcmp(method, "WatchDir");
    if (watch != e2b_is_connect_stream(rq))
        return e2b_connect_error(rq, "invalid_argument", "%s is %sa streaming method", method,
                                 watch ? "" : "not ");
    json_t *msg = e2b_connect_request(rq);
    if (!msg)
        return MHD_YES;
    struct session *s = e2b_box_session(rq, box);
    enum MHD_Result ret = MHD_YES;
    if (s && watch) {
        ret = e2b_watch_dir(rq, msg, s); /* the stream holds s from now */
    } else if (s) {
        ret = strstr(method, "Watcher") ? e2b_watcher_rpc(rq, method, msg, s)
                                        : fs_call(rq, method, msg, s);
        session_table_put(rq->srv->table, s);
    }
    json_decref(msg);
    return ret;
}

bool e2b_is_connect_stream(struct request *rq)
{
    const char *ct = e2b_header(rq, "Content-Type");
    return ct && str_has_prefix(ct, "application/connect+json");
}

json_t *e2b_connect_request(struct request *rq)
{
    char why[256];
    json_t *j = e2b_connect_message(rq->body.data ? rq->body.data : "", rq->body.len,
                                    e2b_is_connect_stream(rq), why);
    if (!j)
        e2b_connect_error(rq, "invalid_argument", "%s", why);
    return j;
}
