/* manifest.c - what the store holds of one session: the manifest (files and variables) and
 * its content-addressed blobs; saving a workspace into it and restoring one from it. */
#include "session/session-int.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MANIFEST_MAX    (64u << 20)
#define ERROR_TEXT_MAX  2000
#define MANIFEST_FORMAT "runcell-session"

char *manifest_key(const char *id)
{
    return xasprintf("sessions/%s/manifest.json", id);
}

static char *blob_key(const char *id, const char *sha)
{
    return xasprintf("sessions/%s/blobs/%s", id, sha);
}

static void mentry_release(struct mentry *e)
{
    free(e->path);
    free(e->target);
    free(e->json);
}

void manifest_release(struct manifest *m)
{
    for (size_t i = 0; i < m->n; i++)
        mentry_release(&m->v[i]);
    free(m->v);
    json_decref(m->variables);
    memset(m, 0, sizeof(*m));
}

static void push(struct manifest *m, size_t *alloc, const struct mentry *e)
{
    if (m->n == *alloc) {
        *alloc = *alloc ? 2 * *alloc : 64;
        m->v = xrealloc(m->v, *alloc * sizeof(*m->v));
    }
    struct mentry *d = &m->v[m->n++];
    *d = *e;
    d->path = xstrdup(e->path);
    d->target = e->target ? xstrdup(e->target) : NULL;
    d->json = e->json ? xstrdup(e->json) : NULL;
}

static const struct mentry *find(const struct manifest *m, const char *path)
{
    size_t lo = 0, hi = m->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(m->v[mid].path, path);
        if (!c)
            return &m->v[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

uint64_t manifest_bytes(const struct manifest *m)
{
    json_t *seen = json_object();
    uint64_t total = 0;
    for (size_t i = 0; i < m->n; i++) {
        if (m->v[i].target || json_object_get(seen, m->v[i].sha))
            continue;
        json_object_set_new(seen, m->v[i].sha, json_true());
        total += m->v[i].size;
    }
    json_decref(seen);
    json_t *vsize = json_object_get(m->variables, "size");
    return total + (json_is_integer(vsize) ? (uint64_t)json_integer_value(vsize) : 0);
}

/* ---- JSON form ---- */

/* Paths are bytes; JSON strings are UTF-8. A path that is not UTF-8 goes as base64. */
static void set_path(json_t *o, const char *key, const char *path)
{
    json_t *s = json_string(path);
    if (s) {
        json_object_set_new(o, key, s);
        return;
    }
    size_t n;
    char *b64 = base64_encode(path, strlen(path), &n);
    _cleanup_free_ char *k = xasprintf("%s_b64", key);
    json_object_set_new(o, k, json_stringn(b64, n));
    free(b64);
}

static char *get_path(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    if (s)
        return xstrdup(s);
    _cleanup_free_ char *k = xasprintf("%s_b64", key);
    const char *b64 = json_string_value(json_object_get(o, k));
    size_t n;
    unsigned char *raw = b64 ? base64_decode(b64, strlen(b64), &n) : NULL;
    if (!raw)
        return NULL;
    if (memchr(raw, 0, n)) {
        free(raw);
        return NULL;
    }
    char *p = xstrndup((char *)raw, n);
    free(raw);
    return p;
}

/* An entry's JSON object, compact; what the list holds of it. */
static char *entry_text(const struct mentry *e)
{
    json_t *f = json_object();
    set_path(f, "path", e->path);
    json_object_set_new(f, "mtime_ns", json_integer(e->mtime_ns));
    if (e->target) {
        json_object_set_new(f, "type", json_string("symlink"));
        set_path(f, "target", e->target);
    } else {
        json_object_set_new(f, "type", json_string("file"));
        json_object_set_new(f, "mode", json_integer(e->mode & 07777));
        json_object_set_new(f, "size", json_integer((json_int_t)e->size));
        json_object_set_new(f, "sha256", json_string(e->sha));
    }
    char *text = json_dumps(f, JSON_COMPACT);
    json_decref(f);
    return text;
}

static void append_json(struct buf *b, json_t *v)
{
    char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    buf_append(b, text, strlen(text));
    free(text);
    json_decref(v);
}

/* The list as the store keeps it (generation: the lease's, in a fleet; 0: none, not
 * written). An entry's text is made once and kept with it (e->json): a save rewrites the
 * whole list, and most of it is what the last save wrote, so only changed entries are
 * serialised again. */
static char *manifest_text(const char *id, struct manifest *m, long long generation)
{
    char at[32];
    struct buf b;
    buf_init(&b, 0);
    format_time_iso(now_realtime_ms(), at);
    buf_printf(&b, "{\"format\":");
    append_json(&b, json_string(MANIFEST_FORMAT));
    buf_printf(&b, ",\"version\":1,\"session\":");
    append_json(&b, json_string(id));
    buf_printf(&b, ",\"updated_at\":");
    append_json(&b, json_string(at));
    buf_printf(&b, ",\"files\":[");
    for (size_t i = 0; i < m->n; i++) {
        struct mentry *e = &m->v[i];
        if (!e->json)
            e->json = entry_text(e);
        if (i)
            buf_append(&b, ",", 1);
        buf_append(&b, e->json, strlen(e->json));
    }
    buf_printf(&b, "],\"variables\":");
    append_json(&b, m->variables ? json_incref(m->variables) : json_null());
    if (generation > 0)
        buf_printf(&b, ",\"lease_generation\":%lld", generation);
    buf_append(&b, "}", 1);
    return buf_detach(&b, NULL);
}

static bool sha_valid(const char *s)
{
    return s && strlen(s) == 64 && strspn(s, "0123456789abcdef") == 64;
}

/* One file entry; false when it is malformed. */
static bool entry_from_json(json_t *f, struct mentry *e)
{
    const char *type = json_string_value(json_object_get(f, "type"));
    memset(e, 0, sizeof(*e));
    e->path = get_path(f, "path");
    e->mtime_ns = (int64_t)json_integer_value(json_object_get(f, "mtime_ns"));
    if (!e->path || !path_is_safe_relative(e->path) || !type)
        return false;
    if (!strcmp(type, "symlink")) {
        e->target = get_path(f, "target");
        e->mode = S_IFLNK | 0777;
        return e->target != NULL;
    }
    const char *sha = json_string_value(json_object_get(f, "sha256"));
    json_t *size = json_object_get(f, "size");
    if (strcmp(type, "file") || !sha_valid(sha) || !json_is_integer(size) ||
        json_integer_value(size) < 0)
        return false;
    snprintf(e->sha, sizeof(e->sha), "%s", sha);
    e->size = (uint64_t)json_integer_value(size);
    e->mode = S_IFREG | ((mode_t)json_integer_value(json_object_get(f, "mode")) & 0777);
    return true;
}

static int path_cmp(const void *a, const void *b)
{
    return strcmp(((const struct mentry *)a)->path, ((const struct mentry *)b)->path);
}

int manifest_load(struct store *st, const char *id, struct manifest *ret)
{
    _cleanup_free_ char *key = manifest_key(id);
    char *text;
    size_t n, alloc = 0;
    json_error_t jerr;
    memset(ret, 0, sizeof(*ret));
    int r = store_get_versioned(st, key, MANIFEST_MAX, &text, &n, ret->version);
    if (r == -ENOENT)
        return err_set(ENOENT, "nothing is stored for session %s", id);
    if (r < 0)
        return r;
    json_t *j = json_loadb(text, n, 0, &jerr);
    free(text);
    json_t *files = json_object_get(j, "files");
    const char *format = json_string_value(json_object_get(j, "format"));
    if (!j || !json_is_array(files) || !format || strcmp(format, MANIFEST_FORMAT)) {
        json_decref(j);
        return err_set(EBADMSG, "the stored file list of session %s (%s) is corrupted%s%s", id, key,
                       j ? "" : ": ", j ? "" : jerr.text);
    }
    size_t i;
    json_t *f;
    json_array_foreach(files, i, f)
    {
        struct mentry e;
        if (entry_from_json(f, &e) && !find(ret, e.path))
            push(ret, &alloc, &e);
        else
            log_warn("msg=\"skipping a malformed entry of a stored file list\" session=%s "
                     "index=%zu",
                     id, i);
        mentry_release(&e);
        if (ret->n > 1 && path_cmp(&ret->v[ret->n - 2], &ret->v[ret->n - 1]) > 0)
            qsort(ret->v, ret->n, sizeof(*ret->v), path_cmp);
    }
    json_t *vars = json_object_get(j, "variables");
    if (json_is_object(vars) && sha_valid(json_string_value(json_object_get(vars, "sha256"))))
        ret->variables = json_incref(vars);
    json_decref(j);
    ret->have_version = true;
    return 0;
}

/* ---- saving ---- */

/* A file whose apparent size passes its allocated blocks by more than this is sparse: the
 * sandbox paid nothing for its holes, and the store would pay for every byte. */
#define SPARSE_SLACK (1u << 20)

int blob_admissible(const struct stat *st, uint64_t quota)
{
    uint64_t size = (uint64_t)st->st_size, allocated = (uint64_t)st->st_blocks * 512;
    if (size > allocated + SPARSE_SLACK)
        return err_set(EFBIG,
                       "a sparse file (%.1f MB apparent, %.1f MB allocated) is not saved: the "
                       "store would hold every byte of its holes; write it out in full or keep "
                       "it out of /workspace",
                       (double)size / 1048576.0, (double)allocated / 1048576.0);
    if (quota && size > quota)
        return err_set(EDQUOT, "%.1f MB is more than the session's store quota of %.1f MB",
                       (double)size / 1048576.0, (double)quota / 1048576.0);
    return 0;
}

struct save {
    const struct persist_config *c;
    const char *id;
    struct workspace *ws;
    const struct manifest *old;
    struct manifest next;
    size_t alloc;
    json_t *blobs;     /* sha -> size of what next names */
    json_t *old_blobs; /* sha -> true: what the store holds already */
    uint64_t bytes;
    struct buf errors;
    size_t n_errors, n_unsaved;
    bool quota_hit;   /* a file was left out for the quota: the save's error says EDQUOT */
    size_t n_changed; /* entries of next that differ from old: unsaved if the list is not */
    bool store_down;  /* the store failed as a whole: no more tries this time */
    uint64_t max_files;
    uint64_t read_bytes, read_budget; /* hashed so far; 0 budget = none */
    double deadline_ms;
};

static void add_blob(struct save *sv, const char *sha, uint64_t size)
{
    if (json_object_get(sv->blobs, sha))
        return;
    json_object_set_new(sv->blobs, sha, json_integer((json_int_t)size));
    sv->bytes += size;
}

static void note(struct save *sv, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void note(struct save *sv, const char *path, const char *fmt, ...)
{
    va_list ap;
    sv->n_unsaved++;
    if (sv->errors.len > ERROR_TEXT_MAX)
        return;
    size_t n;
    _cleanup_free_ char *clean = utf8_sanitize(path, strlen(path), &n);
    _cleanup_free_ char *what = NULL;
    va_start(ap, fmt);
    if (vasprintf(&what, fmt, ap) < 0)
        what = NULL;
    va_end(ap);
    buf_printf(&sv->errors, "%s%s: %s", sv->n_errors++ ? "; " : "", clean, what ? what : "?");
}

/* Whether one more entry (of size bytes to read) may go into this save; notes why not. */
static bool admit(struct save *sv, const char *path, uint64_t size)
{
    if (sv->next.n >= sv->max_files) {
        note(sv, path,
             "not saved: a session stores at most %llu files (serve "
             "--store-max-files)",
             (unsigned long long)sv->max_files);
        return false;
    }
    if (now_ms_f() > sv->deadline_ms) {
        note(sv, path, "not saved: this save ran out of its %d s", PERSIST_SAVE_MAX_MS / 1000);
        return false;
    }
    if (sv->read_budget && sv->read_bytes + size > sv->read_budget) {
        note(sv, path, "not saved: this save read %.1f MB already, twice the store quota",
             (double)sv->read_bytes / 1048576.0);
        return false;
    }
    sv->read_bytes += size;
    return true;
}

/* The stored copy stays what it was (if there was one). */
static void keep_old(struct save *sv, const struct mentry *old)
{
    if (!old)
        return;
    push(&sv->next, &sv->alloc, old);
    if (!old->target)
        add_blob(sv, old->sha, old->size);
}

static bool unchanged(const struct mentry *old, const struct ws_entry *e)
{
    return old && old->size == e->size && old->mtime_ns == e->mtime_ns && old->ino == e->ino &&
           old->mode == e->mode;
}

static void save_link(struct save *sv, const struct ws_entry *e, const struct mentry *old)
{
    const char *leaf;
    char target[PATH_MAX];
    if (!admit(sv, e->path, 0)) {
        keep_old(sv, old);
        return;
    }
    _cleanup_close_ int dfd = workspace_open_parent(sv->ws, e->path, false, &leaf);
    ssize_t n = dfd < 0 ? -1 : readlinkat(dfd, leaf, target, sizeof(target) - 1);
    if (n < 0) {
        keep_old(sv, old); /* gone or replaced since the scan: the next save sees it */
        return;
    }
    target[n] = '\0';
    struct mentry m = {
        .path = e->path, .target = target, .mtime_ns = e->mtime_ns, .ino = e->ino, .mode = e->mode};
    push(&sv->next, &sv->alloc, &m);
    sv->n_changed++;
}

static void save_file(struct save *sv, const struct ws_entry *e, const struct mentry *old)
{
    struct stat st;
    struct mentry m = {.path = e->path};
    _cleanup_close_ int fd = workspace_openat(sv->ws, e->path, O_RDONLY | O_NONBLOCK, 0);
    if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        keep_old(sv, old);
        return;
    }
    /* Sizes, blocks and counts first: nothing is read of a file that cannot be kept. */
    int r = blob_admissible(&st, sv->c->quota_bytes);
    if (r < 0) {
        sv->quota_hit |= r == -EDQUOT;
        note(sv, e->path, "%s", err_msg());
        keep_old(sv, old);
        return;
    }
    if (!admit(sv, e->path, (uint64_t)st.st_size)) {
        keep_old(sv, old);
        return;
    }
    r = sha256_fd(fd, (uint64_t)st.st_size, m.sha);
    if (r < 0) {
        note(sv, e->path, "%s", r == -EAGAIN ? "it changed while being saved" : strerror(-r));
        keep_old(sv, old);
        return;
    }
    m.size = (uint64_t)st.st_size;
    m.mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    m.ino = st.st_ino;
    m.mode = st.st_mode;
    if (!json_object_get(sv->blobs, m.sha) && !json_object_get(sv->old_blobs, m.sha)) {
        uint64_t quota = sv->c->quota_bytes;
        if (quota && sv->bytes + m.size > quota) {
            sv->quota_hit = true;
            note(sv, e->path, "%.1f MB would take the session past its store quota of %.1f MB",
                 (double)m.size / 1048576.0, (double)quota / 1048576.0);
            keep_old(sv, old);
            return;
        }
        if (sv->store_down) {
            sv->n_unsaved++;
            keep_old(sv, old);
            return;
        }
        _cleanup_free_ char *key = blob_key(sv->id, m.sha);
        r = store_put_fd(sv->c->store, key, fd, m.size, m.sha);
        if (r < 0) {
            note(sv, e->path, "%s", err_msg());
            sv->store_down = r != -EAGAIN;
            keep_old(sv, old);
            return;
        }
    }
    push(&sv->next, &sv->alloc, &m);
    add_blob(sv, m.sha, m.size);
    sv->n_changed++;
}

/* Whether anything the stored manifest says differs (inode numbers are not stored). */
static bool stored_differs(const struct manifest *a, const struct manifest *b)
{
    if (a->n != b->n || !json_equal(a->variables ? a->variables : json_null(),
                                    b->variables ? b->variables : json_null()))
        return true;
    for (size_t i = 0; i < a->n; i++) {
        const struct mentry *x = &a->v[i], *y = &b->v[i];
        if (strcmp(x->path, y->path) || strcmp(x->sha, y->sha) || x->size != y->size ||
            x->mtime_ns != y->mtime_ns || x->mode != y->mode || !x->target != !y->target ||
            (x->target && strcmp(x->target, y->target)))
            return true;
    }
    return false;
}

/* Deletes the blobs old names and next does not. */
static void drop_unused(struct save *sv)
{
    for (size_t i = 0; i < sv->old->n; i++) {
        const struct mentry *e = &sv->old->v[i];
        if (e->target || json_object_get(sv->blobs, e->sha))
            continue;
        _cleanup_free_ char *key = blob_key(sv->id, e->sha);
        if (store_delete(sv->c->store, key) < 0)
            log_warn("msg=\"cannot delete an unused blob\" key=%s error=%s", key,
                     log_quote(err_msg()));
        json_object_set_new(sv->blobs, e->sha, json_integer(0)); /* once is enough */
    }
    const char *vsha = json_string_value(json_object_get(sv->old->variables, "sha256"));
    const char *nsha = json_string_value(json_object_get(sv->next.variables, "sha256"));
    if (vsha && (!nsha || strcmp(vsha, nsha)) && !json_object_get(sv->blobs, vsha)) {
        _cleanup_free_ char *key = blob_key(sv->id, vsha);
        store_delete(sv->c->store, key);
    }
}

/* The lease generation the stored list of id was written under (0: none, before fleets
 * stamped it), and its version; -ENOENT when there is none. */
static int stored_generation(struct store *st, const char *key, long long *ret_gen,
                             char ret_version[STORE_VERSION_SIZE])
{
    char *text;
    size_t n;
    int r = store_get_versioned(st, key, MANIFEST_MAX, &text, &n, ret_version);
    if (r < 0)
        return r;
    json_t *j = json_loadb(text, n, 0, NULL);
    free(text);
    *ret_gen = json_integer_value(json_object_get(j, "lease_generation"));
    json_decref(j);
    return 0;
}

/* Writes a fleet's file list of id by compare-and-swap from if_version (NULL: only if there
 * is none), stamped with this node's lease generation, a fencing token. When the store holds
 * another version: a list of a later generation means another node took the session over,
 * and nothing is written (-EXDEV); one of an earlier generation was written by a node that
 * had lost the lease and did not know yet, and this node, which holds it, writes over it;
 * the same generation is this node's own write whose answer was lost. */
static int put_fenced(const struct persist_config *c, const char *id, const char *key,
                      const char *text, long long mine, const char *if_version,
                      char ret_version[STORE_VERSION_SIZE])
{
    char cur[STORE_VERSION_SIZE];
    if (if_version)
        snprintf(cur, sizeof(cur), "%s", if_version);
    bool have = if_version != NULL;
    for (int tries = 0; tries < 4; tries++) {
        int r = store_put_if(c->store, key, text, strlen(text), have ? cur : NULL, ret_version);
        if (r != -ESTALE)
            return r;
        long long theirs = 0;
        r = stored_generation(c->store, key, &theirs, cur);
        if (r == -ENOENT) {
            have = false;
            continue;
        }
        if (r < 0)
            return r;
        if (theirs > mine || mine == 0)
            return err_set(EXDEV,
                           "session %s moved to another node: the file list in the store is "
                           "of its lease generation %lld, this node's is %lld",
                           id, theirs, mine);
        have = true;
    }
    return err_set(EAGAIN, "the file list of session %s kept changing in the store", id);
}

int manifest_claim(const struct persist_config *c, const char *id, struct manifest *m)
{
    long long gen = fleet_lease_generation(c->fleet, id);
    _cleanup_free_ char *key = manifest_key(id);
    char *text = manifest_text(id, m, gen);
    char nv[STORE_VERSION_SIZE];
    int r = put_fenced(c, id, key, text, gen, m->have_version ? m->version : NULL, nv);
    free(text);
    if (r == 0) {
        memcpy(m->version, nv, STORE_VERSION_SIZE);
        m->have_version = true;
    }
    return r;
}

static int write_manifest(struct save *sv)
{
    /* In a fleet the file list is written only while this node holds the session's lease,
     * checked last, just before: a save that took long never lands over a successor's. */
    if (sv->c->fleet && fleet_lease_state(sv->c->fleet, sv->id) < 0) {
        note(sv, "the file list", "%s", err_msg());
        sv->n_unsaved += sv->n_changed ? sv->n_changed - 1 : 0;
        return -ENOLCK;
    }
    _cleanup_free_ char *key = manifest_key(sv->id);
    long long gen = sv->c->fleet ? fleet_lease_generation(sv->c->fleet, sv->id) : 0;
    char *text = manifest_text(sv->id, &sv->next, gen);
    int r;
    if (sv->c->fleet) {
        r = put_fenced(sv->c, sv->id, key, text, gen,
                       sv->old->have_version ? sv->old->version : NULL, sv->next.version);
        sv->next.have_version = r == 0;
    } else {
        r = store_put_buf(sv->c->store, key, text, strlen(text));
    }
    free(text);
    if (r < 0) {
        /* Without the list, none of this save's changes count as stored. */
        note(sv, "the file list", "%s", err_msg());
        sv->n_unsaved += sv->n_changed ? sv->n_changed - 1 : 0;
    }
    return r;
}

static char *save_error(struct save *sv)
{
    return xasprintf("%zu change%s not saved to the store (%s): %s%s; the files stay in the "
                     "sandbox, and the next execution tries again",
                     sv->n_unsaved, sv->n_unsaved == 1 ? "" : "s", store_describe(sv->c->store),
                     sv->errors.data ? sv->errors.data : "the store is unavailable",
                     sv->n_unsaved > sv->n_errors ? " (and more)" : "");
}

int manifest_save(const struct persist_config *c, const char *id, struct manifest *m,
                  struct workspace *ws, const struct ws_listing *after, json_t *variables,
                  char **ret_error)
{
    return manifest_save_keep(c, id, m, ws, after, variables, NULL, ret_error);
}

int manifest_save_keep(const struct persist_config *c, const char *id, struct manifest *m,
                       struct workspace *ws, const struct ws_listing *after, json_t *variables,
                       struct manifest *ret_old, char **ret_error)
{
    struct save sv = {.c = c,
                      .id = id,
                      .ws = ws,
                      .old = m,
                      .blobs = json_object(),
                      .old_blobs = json_object(),
                      .max_files = c->max_files ? c->max_files : DEFAULT_STORE_MAX_FILES,
                      .read_budget = 2 * c->quota_bytes,
                      .deadline_ms = now_ms_f() + PERSIST_SAVE_MAX_MS};
    buf_init(&sv.errors, 0);
    for (size_t i = 0; i < m->n; i++)
        if (!m->v[i].target)
            json_object_set_new(sv.old_blobs, m->v[i].sha, json_true());
    *ret_error = NULL;
    memcpy(sv.next.version, m->version, STORE_VERSION_SIZE);
    sv.next.have_version = m->have_version;
    sv.next.variables = variables ? variables : json_incref(m->variables);
    json_t *vsize = json_object_get(sv.next.variables, "size");
    sv.bytes = json_is_integer(vsize) ? (uint64_t)json_integer_value(vsize) : 0;
    /* Unchanged files first: what they keep stored counts against the quota before any
     * new file is let in, whatever the order of their names. */
    for (size_t i = 0; i < after->n; i++) {
        const struct mentry *old = find(m, after->v[i].path);
        if (unchanged(old, &after->v[i]))
            keep_old(&sv, old);
    }
    for (size_t i = 0; i < after->n; i++) {
        const struct ws_entry *e = &after->v[i];
        const struct mentry *old = find(m, e->path);
        if (unchanged(old, e))
            continue;
        if (S_ISLNK(e->mode))
            save_link(&sv, e, old);
        else
            save_file(&sv, e, old);
    }
    if (sv.next.n) /* an empty workspace has no array at all: qsort must not get NULL */
        qsort(sv.next.v, sv.next.n, sizeof(*sv.next.v), path_cmp);
    /* Files gone since the last save are changes too. A scan that stopped early saw only
     * part of the workspace: nothing is taken for deleted. */
    size_t n_seen = sv.next.n; /* the sorted part: what keep_old appends below is not */
    for (size_t i = 0; i < m->n; i++) {
        struct manifest seen = {.v = sv.next.v, .n = n_seen};
        if (find(&seen, m->v[i].path))
            continue;
        if (after->truncated)
            keep_old(&sv, &m->v[i]);
        else
            sv.n_changed++;
    }
    if (sv.next.n > n_seen)
        qsort(sv.next.v, sv.next.n, sizeof(*sv.next.v), path_cmp);
    int r = 0;
    bool differs = stored_differs(&sv.next, m);
    if (differs && (r = write_manifest(&sv)) == 0 && !ret_old)
        drop_unused(&sv);
    if (!r) {
        /* Also when only inode numbers moved (after a load): the next save compares to them.
         * A caller that keeps the old list (a history) gets it, blobs and all. */
        if (ret_old && differs)
            *ret_old = *m;
        else
            manifest_release(m);
        *m = sv.next;
        memset(&sv.next, 0, sizeof(sv.next));
    }
    if (sv.n_unsaved) {
        *ret_error = save_error(&sv);
        r = r ? r : sv.quota_hit ? -EDQUOT : -EIO;
    }
    manifest_release(&sv.next);
    json_decref(sv.blobs);
    json_decref(sv.old_blobs);
    buf_release(&sv.errors);
    return r;
}

/* ---- blobs in and out of a workspace ---- */

/* Removes the file being restored and returns r. */
static int fail_abort(struct ws_newfile *f, int r)
{
    ws_newfile_abort(f);
    return r;
}

int blob_to_workspace(struct store *st, const char *from_id, const char *sha, uint64_t size,
                      struct workspace *ws, const char *rel)
{
    _cleanup_free_ char *key = blob_key(from_id, sha);
    uint64_t n = 0;
    struct ws_newfile f;
    int r = ws_newfile_open(ws, rel, 0600, &f);
    if (r < 0)
        return err_set(-r, "cannot create it in the workspace: %s", strerror(-r));
    /* +1: a stored copy larger than the list says is caught as corrupted, not cut short. */
    r = store_get_verified(st, key, f.fd, size + 1, sha, &n);
    if (r == -ENOENT)
        return fail_abort(&f, err_set(ENOENT, "its stored copy is missing (%s)", key));
    if (r == -EFBIG || (!r && n != size))
        return fail_abort(&f, err_set(EBADMSG,
                                      "its stored copy is corrupted: %s bytes "
                                      "where %llu were stored (%s)",
                                      r ? "more" : "a different number of",
                                      (unsigned long long)size, key));
    if (r == -ENOSPC || r == -EDQUOT)
        return fail_abort(&f, err_set(ENOSPC, "the workspace is full (its disk limit)"));
    if (r == -EBADMSG)
        return fail_abort(&f, err_set(EBADMSG,
                                      "its stored copy is corrupted: the "
                                      "contents do not match their checksum (%s)",
                                      key));
    if (r < 0)
        return fail_abort(&f, r);
    if ((r = ws_newfile_commit(&f, 0, NULL)) < 0)
        return err_set(-r, "cannot give it to the sandbox user: %s", strerror(-r));
    return 0;
}

int blob_from_workspace(struct store *st, const char *id, struct workspace *ws, const char *rel,
                        char ret_sha[SHA256_HEX_SIZE], uint64_t *ret_size)
{
    struct stat sb;
    _cleanup_close_ int fd = workspace_openat(ws, rel, O_RDONLY | O_NONBLOCK, 0);
    if (fd < 0 || fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode))
        return err_set(fd < 0 ? -fd : EINVAL, "cannot read %s in the workspace", rel);
    int r = blob_admissible(&sb, 0);
    if (r < 0)
        return r;
    _cleanup_free_ char *prefix = blob_key(id, "");
    if ((r = store_put_fd_hashed(st, prefix, fd, (uint64_t)sb.st_size, ret_sha)) < 0)
        return r;
    *ret_size = (uint64_t)sb.st_size;
    return 0;
}

/* ---- restoring files ---- */

static int restore_link(const struct mentry *e, struct workspace *ws)
{
    int r = workspace_symlink(ws, e->target, e->path);
    if (r < 0)
        return err_set(-r, "cannot create the link: %s", strerror(-r));
    return 0;
}

static int restore_file(struct store *st, const char *from_id, const struct mentry *e,
                        struct workspace *ws)
{
    int r = blob_to_workspace(st, from_id, e->sha, e->size, ws, e->path);
    if (r < 0)
        return r;
    _cleanup_close_ int fd = workspace_openat(ws, e->path, O_RDONLY | O_NONBLOCK, 0);
    if (fd < 0)
        return err_set(-fd, "cannot reopen it: %s", strerror(-fd));
    struct timespec times[2] = {
        {.tv_nsec = UTIME_OMIT},
        {.tv_sec = e->mtime_ns / 1000000000, .tv_nsec = e->mtime_ns % 1000000000}};
    fchmod(fd, e->mode & 0777); /* never set-id bits from a store */
    futimens(fd, times);
    return 0;
}

int manifest_restore_entry(struct store *st, const char *from_id, const struct mentry *e,
                           struct workspace *ws)
{
    return str_has_prefix(e->path, ".runcell/")
               ? err_set(EINVAL, "the name is reserved for runcell")
           : e->target ? restore_link(e, ws)
                       : restore_file(st, from_id, e, ws);
}

void manifest_restore_files(struct store *st, const char *from_id, const struct manifest *m,
                            struct workspace *ws, json_t *ok, json_t *failed)
{
    for (size_t i = 0; i < m->n; i++) {
        const struct mentry *e = &m->v[i];
        size_t n;
        _cleanup_free_ char *clean = utf8_sanitize(e->path, strlen(e->path), &n);
        int r = str_has_prefix(e->path, ".runcell/")
                    ? err_set(EINVAL, "the name is reserved for runcell")
                : e->target ? restore_link(e, ws)
                            : restore_file(st, from_id, e, ws);
        if (r < 0)
            json_array_append_new(failed,
                                  json_pack("{s:s%,s:s}", "path", clean, n, "error", err_msg()));
        else
            json_array_append_new(ok, json_stringn(clean, n));
    }
}

/* ---- whole sessions ---- */

int store_discard(struct store *st, const char *id)
{
    _cleanup_free_ char *key = manifest_key(id);
    _cleanup_free_ char *prefix = xasprintf("sessions/%s/", id);
    struct store_listing l;
    int r = store_delete(st, key);
    if (r < 0 || (r = store_list(st, prefix, &l)) < 0)
        return r;
    for (size_t i = 0; i < l.n && !r; i++)
        r = store_delete(st, l.v[i].key);
    store_listing_release(&l);
    return r;
}

/* Adds the blobs m names to named (sha -> true). */
static void name_blobs(const struct manifest *m, json_t *named)
{
    for (size_t i = 0; i < m->n; i++)
        if (!m->v[i].target)
            json_object_set_new(named, m->v[i].sha, json_true());
    const char *vsha = json_string_value(json_object_get(m->variables, "sha256"));
    if (vsha)
        json_object_set_new(named, vsha, json_true());
}

void manifest_drop_blobs(const struct persist_config *c, const char *id,
                         const struct manifest *gone, const struct manifest *keep, size_t n_keep)
{
    json_t *named = json_object();
    for (size_t i = 0; i < n_keep; i++)
        name_blobs(&keep[i], named);
    json_t *dropped = json_object();
    for (size_t i = 0; i < gone->n; i++) {
        const struct mentry *e = &gone->v[i];
        if (e->target || json_object_get(named, e->sha) || json_object_get(dropped, e->sha))
            continue;
        json_object_set_new(dropped, e->sha, json_true());
        _cleanup_free_ char *key = blob_key(id, e->sha);
        if (store_delete(c->store, key) < 0)
            log_warn("msg=\"cannot delete an unused blob\" key=%s error=%s", key,
                     log_quote(err_msg()));
    }
    json_decref(named);
    json_decref(dropped);
}

void store_collect_garbage(struct store *st, const char *id, const struct manifest *m)
{
    store_collect_garbage_of(st, id, m, 1);
}

void store_collect_garbage_of(struct store *st, const char *id, const struct manifest *ms, size_t n)
{
    _cleanup_free_ char *prefix = xasprintf("sessions/%s/blobs/", id);
    struct store_listing l;
    json_t *named = json_object();
    for (size_t i = 0; i < n; i++)
        name_blobs(&ms[i], named);
    if (store_list(st, prefix, &l) == 0) {
        for (size_t i = 0; i < l.n; i++)
            if (!json_object_get(named, l.v[i].key + strlen(prefix)))
                store_delete(st, l.v[i].key);
        store_listing_release(&l);
    }
    json_decref(named);
}
