/* store_local.c - the local-directory store: one file per key below a root directory,
 * written to a temporary name and renamed into place so an object is whole or absent. */
#include "store/store-int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define LIST_DEPTH_MAX 32

/* Objects this process wrote or read back and found to hash to their names, by the identity
 * of their file: a blob file is never rewritten in place (a new copy is renamed over it), so
 * one whose file, size and times are unchanged still holds the bytes that were hashed. */
#define VERIFIED_MAX 256

struct verified {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime, ctime;
    char sha[SHA256_HEX_SIZE];
};

struct local {
    char *root;
    pthread_mutex_t lock; /* verified */
    struct verified verified[VERIFIED_MAX];
    unsigned next; /* the slot the next one takes (round robin) */
};

static bool same_file(const struct verified *v, const struct stat *sb, const char *sha)
{
    return v->dev == sb->st_dev && v->ino == sb->st_ino && v->size == sb->st_size &&
           v->mtime.tv_sec == sb->st_mtim.tv_sec && v->mtime.tv_nsec == sb->st_mtim.tv_nsec &&
           v->ctime.tv_sec == sb->st_ctim.tv_sec && v->ctime.tv_nsec == sb->st_ctim.tv_nsec &&
           !strcmp(v->sha, sha);
}

static bool was_verified(struct store *st, const struct stat *sb, const char *sha)
{
    struct local *l = st->impl;
    bool found = false;
    pthread_mutex_lock(&l->lock);
    for (unsigned i = 0; i < VERIFIED_MAX && !found; i++)
        found = same_file(&l->verified[i], sb, sha);
    pthread_mutex_unlock(&l->lock);
    return found;
}

static void note_verified(struct store *st, int fd, const char *sha)
{
    struct local *l = st->impl;
    struct stat sb;
    if (fstat(fd, &sb) < 0 || strlen(sha) != SHA256_HEX_SIZE - 1)
        return;
    pthread_mutex_lock(&l->lock);
    struct verified *v = &l->verified[l->next++ % VERIFIED_MAX];
    *v = (struct verified){.dev = sb.st_dev,
                           .ino = sb.st_ino,
                           .size = sb.st_size,
                           .mtime = sb.st_mtim,
                           .ctime = sb.st_ctim};
    memcpy(v->sha, sha, SHA256_HEX_SIZE);
    pthread_mutex_unlock(&l->lock);
}

static const char *root_of(struct store *st)
{
    return ((struct local *)st->impl)->root;
}

/* Copies bytes 0..size of in to out, hashing them into got; -EAGAIN when in is shorter than
 * size or (expect != NULL) the bytes do not hash to expect. */
static int copy_hashed(int in, int out, uint64_t size, const char *expect,
                       char got[SHA256_HEX_SIZE])
{
    char chunk[65536];
    struct sha256_ctx *c = sha256_new();
    uint64_t off = 0;
    int r = 0;
    while (off < size && !r) {
        ssize_t n = pread(in, chunk, (size_t)MIN((uint64_t)sizeof(chunk), size - off), (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            r = n < 0 ? -errno : -EAGAIN;
            break;
        }
        sha256_update(c, chunk, (size_t)n);
        r = write_all(out, chunk, (size_t)n);
        off += (uint64_t)n;
    }
    sha256_finish(c, got);
    if (!r && expect && strcmp(expect, got))
        r = -EAGAIN;
    return r;
}

/* Opens a new temporary file beside ROOT/key (its directories made when missing): an fd,
 * *ret_tmp its name; -errno with err_msg(). */
static int open_temporary(struct store *st, const char *key, char **ret_tmp)
{
    _cleanup_free_ char *path = xasprintf("%s/%s", root_of(st), key);
    char *slash = strrchr(path, '/');
    _cleanup_free_ char *hex = random_hex(8);
    *slash = '\0';
    char *tmp = xasprintf("%s/.%s.tmp-%s", path, slash + 1, hex);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 && errno == ENOENT) { /* the first object below this directory */
        int r = mkdir_p(path, 0700);
        if (r < 0) {
            free(tmp);
            return err_set(-r, "cannot create the store directory for %s: %s", key, strerror(-r));
        }
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    }
    if (fd < 0) {
        int r = err_set(errno, "cannot write %s: %s", tmp, strerror(errno));
        free(tmp);
        return r;
    }
    *ret_tmp = tmp;
    return fd;
}

/* Puts the whole temporary file tmp in the place of ROOT/key: renamed there, or, where
 * exchange (an object written from memory, such as a session's file list at every save),
 * first exchanged with the object there (RENAME_EXCHANGE), which is then removed. ext4
 * writes back the data of a file renamed over another before the rename returns
 * (auto_da_alloc), up to ~0.6 ms here for a file list rewritten at each save; an exchange
 * does not, so that list may be lost to a power cut soon after (docs/PERSISTENCE.md).
 * Readers see the old object or the new one, never neither. */
static int into_place(const char *tmp, const char *path, bool exchange)
{
    if (exchange && renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_EXCHANGE) == 0) {
        if (unlink(tmp) == 0 || errno != EISDIR)
            return 0; /* the old object is gone (or left under a dot name, never a key) */
        /* A directory was there, where rename fails: it goes back, and so does this. */
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_EXCHANGE) == 0)
            unlink(tmp);
        return -EISDIR;
    }
    if (exchange && errno != ENOENT && errno != EINVAL && errno != ENOSYS)
        return -errno;
    return rename(tmp, path) < 0 ? -errno : 0; /* a new key, or no exchange here */
}

static int put_failed(struct store *st, const char *key, const char *tmp, int r)
{
    unlink(tmp);
    if (r == -EAGAIN)
        return err_set(EAGAIN, "the data changed while it was being stored as %s", key);
    return err_set(-r, "cannot store %s in %s: %s", key, root_of(st), strerror(-r));
}

static int local_put(struct store *st, const char *key, int fd, uint64_t size, const char *sha)
{
    _cleanup_free_ char *path = xasprintf("%s/%s", root_of(st), key);
    _cleanup_free_ char *tmp = NULL;
    _cleanup_close_ int out = open_temporary(st, key, &tmp);
    if (out < 0)
        return out;
    char got[SHA256_HEX_SIZE];
    int r = copy_hashed(fd, out, size, sha, got);
    if (!r) /* blobs (new names) and conditional writes: a rename */
        r = into_place(tmp, path, false);
    if (!r && sha)
        note_verified(st, out, sha);
    return r < 0 ? put_failed(st, key, tmp, r) : 0;
}

static int local_put_hashed(struct store *st, const char *prefix, int fd, uint64_t size,
                            char ret_sha[SHA256_HEX_SIZE])
{
    _cleanup_free_ char *probe = xasprintf("%sx", prefix); /* a key in the same directory */
    _cleanup_free_ char *tmp = NULL;
    _cleanup_close_ int out = open_temporary(st, probe, &tmp);
    if (out < 0)
        return out;
    int r = copy_hashed(fd, out, size, NULL, ret_sha);
    _cleanup_free_ char *key = xasprintf("%s%s", prefix, ret_sha);
    _cleanup_free_ char *path = xasprintf("%s/%s", root_of(st), key);
    if (!r)
        r = into_place(tmp, path, false);
    if (!r)
        note_verified(st, out, ret_sha);
    return r < 0 ? put_failed(st, key, tmp, r) : 0;
}

/* The same from memory: one write, nothing to hash (no fd that could change meanwhile). */
static int local_put_buf(struct store *st, const char *key, const void *data, size_t n)
{
    _cleanup_free_ char *path = xasprintf("%s/%s", root_of(st), key);
    _cleanup_free_ char *tmp = NULL;
    _cleanup_close_ int out = open_temporary(st, key, &tmp);
    if (out < 0)
        return out;
    int r = write_all(out, data, n);
    if (!r)
        r = into_place(tmp, path, true);
    return r < 0 ? put_failed(st, key, tmp, r) : 0;
}

/* Opens the object at path for reading, a regular file of at most max bytes (0: any);
 * its stat in *sb. An fd, or -errno with err_msg(). */
static int open_object(struct store *st, const char *key, const char *path, uint64_t max,
                       struct stat *sb)
{
    int in = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (in < 0 && errno == ENOENT)
        return err_set(ENOENT, "object %s is missing from %s", key, root_of(st));
    if (in < 0 || fstat(in, sb) < 0) {
        int r = err_set(errno, "cannot read object %s: %s", path, strerror(errno));
        if (in >= 0)
            close(in);
        return r;
    }
    int r = 0;
    if (!S_ISREG(sb->st_mode))
        r = err_set(EINVAL, "object %s is not a regular file", path);
    else if (max && (uint64_t)sb->st_size > max)
        r = err_set(EFBIG, "object %s holds %llu bytes, more than the %llu allowed", key,
                    (unsigned long long)sb->st_size, (unsigned long long)max);
    if (r < 0) {
        close(in);
        return r;
    }
    return in;
}

static int local_get(struct store *st, const char *key, int fd, uint64_t max, uint64_t *ret_size)
{
    _cleanup_free_ char *path = xasprintf("%s/%s", root_of(st), key);
    struct stat sb;
    char chunk[65536];
    _cleanup_close_ int in = open_object(st, key, path, max, &sb);
    if (in < 0)
        return in;
    for (;;) {
        ssize_t n = read(in, chunk, sizeof(chunk));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return err_set(errno, "cannot read object %s: %s", path, strerror(errno));
        if (n == 0)
            return 0;
        if (max && *ret_size + (uint64_t)n > max)
            return err_set(EFBIG, "object %s grew past the %llu bytes allowed", key,
                           (unsigned long long)max);
        int r = write_all(fd, chunk, (size_t)n);
        if (r < 0)
            return err_set(-r, "cannot write object %s out: %s", key, strerror(-r));
        *ret_size += (uint64_t)n;
    }
}

static int local_get_verified(struct store *st, const char *key, int fd, uint64_t max,
                              const char *sha, uint64_t *ret_size)
{
    _cleanup_free_ char *path = xasprintf("%s/%s", root_of(st), key);
    struct stat sb;
    _cleanup_close_ int in = open_object(st, key, path, max, &sb);
    if (in < 0)
        return in;
    uint64_t size = (uint64_t)sb.st_size;
    if (was_verified(st, &sb, sha)) {
        /* In the kernel, no hash: copy_file_range, or read and write where it cannot. */
        uint64_t off = 0;
        while (off < size) {
            ssize_t n = copy_file_range(in, NULL, fd, NULL, (size_t)MIN(size - off, 1u << 30), 0);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                break;
            off += (uint64_t)n;
        }
        if (off == size) {
            *ret_size = size;
            return 0;
        }
        if (off && lseek(fd, -(off_t)off, SEEK_CUR) < 0) /* start again, hashing */
            return err_set(errno, "cannot write object %s out: %s", key, strerror(errno));
    }
    char got[SHA256_HEX_SIZE];
    int r = copy_hashed(in, fd, size, NULL, got);
    if (r == -EAGAIN)
        return err_set(EIO, "object %s changed while it was read", key);
    if (r < 0)
        return err_set(-r, "cannot copy object %s out: %s", key, strerror(-r));
    *ret_size = size;
    if (strcmp(got, sha))
        return err_set(EBADMSG, "object %s does not hash to its name", key);
    note_verified(st, in, sha);
    return 0;
}

/* The exclusive flock of ROOT/.cas-lock that conditional writes take (local_put_if): an fd
 * that holds it until closed, or -errno. */
static int cas_lock(struct store *st)
{
    _cleanup_free_ char *lock_path = xasprintf("%s/.cas-lock", root_of(st));
    int lock = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (lock < 0)
        return err_set(errno, "cannot open %s: %s", lock_path, strerror(errno));
    while (flock(lock, LOCK_EX) < 0)
        if (errno != EINTR) {
            int r = err_set(errno, "cannot lock %s: %s", lock_path, strerror(errno));
            close(lock);
            return r;
        }
    return lock;
}

static int local_del(struct store *st, const char *key)
{
    _cleanup_free_ char *path = xasprintf("%s/%s", root_of(st), key);
    /* Under the lock of conditional writes, as S3 orders a delete and a conditional write of
     * one key: one that compared before the delete must not write the object back after. */
    _cleanup_close_ int lock = cas_lock(st);
    if (lock < 0)
        return lock;
    if (unlink(path) < 0 && errno != ENOENT)
        return err_set(errno, "cannot delete object %s: %s", path, strerror(errno));
    /* Empty directories left behind go too, up to (not including) the root. */
    size_t root_len = strlen(root_of(st));
    for (char *slash = strrchr(path, '/'); slash && (size_t)(slash - path) > root_len;
         slash = strrchr(path, '/')) {
        *slash = '\0';
        if (rmdir(path) < 0)
            break;
    }
    return 0;
}

struct walk {
    struct store_listing *l;
    size_t alloc;
    const char *prefix;
};

static int walk_dir(struct walk *w, int dfd, const char *rel, int depth)
{
    DIR *d = fdopendir(dfd);
    struct dirent *e;
    int r = 0;
    if (!d) {
        close(dfd);
        return -errno;
    }
    while (!r && (e = readdir(d))) {
        struct stat sb;
        if (e->d_name[0] == '.') /* ., .. and temporaries */
            continue;
        if (fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0)
            continue;
        _cleanup_free_ char *key = *rel ? xasprintf("%s/%s", rel, e->d_name) : xstrdup(e->d_name);
        if (S_ISDIR(sb.st_mode) && depth < LIST_DEPTH_MAX) {
            int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub >= 0)
                r = walk_dir(w, sub, key, depth + 1);
        } else if (S_ISREG(sb.st_mode) && str_has_prefix(key, w->prefix)) {
            r = store_listing_add(w->l, &w->alloc, key, (uint64_t)sb.st_size);
        }
    }
    closedir(d);
    return r;
}

static int local_list(struct store *st, const char *prefix, struct store_listing *ret)
{
    /* Walk the deepest directory the prefix names, then filter by the whole prefix. */
    _cleanup_free_ char *dir = xstrdup(prefix);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = '\0';
    else
        *dir = '\0';
    if (*dir && !store_key_valid(dir))
        return err_set(EINVAL, "bad store prefix '%s'", prefix);
    _cleanup_free_ char *path = *dir ? xasprintf("%s/%s", root_of(st), dir) : xstrdup(root_of(st));
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0 && errno == ENOENT)
        return 0;
    if (dfd < 0)
        return err_set(errno, "cannot list %s: %s", path, strerror(errno));
    struct walk w = {.l = ret, .prefix = prefix};
    int r = walk_dir(&w, dfd, dir, 0);
    if (r < 0 && r != -E2BIG)
        return err_set(-r, "cannot list %s: %s", path, strerror(-r));
    return r;
}

/* The whole object in memory; -ENOENT when absent. */
static int local_read_all(struct store *st, const char *key, size_t max, char **ret,
                          size_t *ret_len)
{
    _cleanup_close_ int fd = memfd_create("runcell-object", MFD_CLOEXEC);
    uint64_t size = 0;
    if (fd < 0)
        return err_set(errno, "cannot create a memory file: %s", strerror(errno));
    int r = local_get(st, key, fd, max, &size);
    if (r < 0)
        return r;
    char *data = xmalloc(size + 1);
    if (size && pread(fd, data, size, 0) != (ssize_t)size) {
        free(data);
        return err_set(EIO, "cannot read back object %s from memory", key);
    }
    data[size] = '\0';
    *ret = data;
    *ret_len = size;
    return 0;
}

/* A directory's version of an object is the SHA-256 of its bytes: records and leases hold a
 * generation and a nonce, so no two writes of one key have the same bytes. */
static int local_get_v(struct store *st, const char *key, size_t max, char **ret, size_t *ret_len,
                       char ret_version[STORE_VERSION_SIZE])
{
    size_t n = 0;
    int r = local_read_all(st, key, max, ret, &n);
    if (r < 0)
        return r;
    sha256_hex(*ret, n, ret_version);
    if (ret_len)
        *ret_len = n;
    return 0;
}

/* Conditional writes of every process sharing the directory go one at a time under an
 * exclusive flock of ROOT/.cas-lock (a dot name: never a key, never listed). */
static int local_put_if(struct store *st, const char *key, int fd, uint64_t size, const char *sha,
                        const char *if_version, char ret_version[STORE_VERSION_SIZE])
{
    _cleanup_close_ int lock = cas_lock(st);
    if (lock < 0)
        return lock;
    char *cur = NULL, cur_version[STORE_VERSION_SIZE];
    size_t n = 0;
    int r = local_get_v(st, key, 1u << 20, &cur, &n, cur_version);
    free(cur);
    if (r < 0 && r != -ENOENT)
        return r; /* the lock goes with its fd */
    if (r == -ENOENT ? if_version != NULL : !if_version || strcmp(if_version, cur_version))
        return err_set(ESTALE, "object %s was changed by another writer", key);
    if ((r = local_put(st, key, fd, size, sha)) < 0)
        return r;
    memcpy(ret_version, sha, SHA256_HEX_SIZE);
    return 0;
}

static void local_free(struct store *st)
{
    struct local *l = st->impl;
    pthread_mutex_destroy(&l->lock);
    free(l->root);
    free(l);
}

static const struct store_ops local_ops = {
    .put = local_put,
    .put_buf = local_put_buf,
    .get = local_get,
    .get_verified = local_get_verified,
    .put_hashed = local_put_hashed,
    .del = local_del,
    .list = local_list,
    .get_v = local_get_v,
    .put_if = local_put_if,
    .free = local_free,
};

int store_local_open(const char *dir, struct store **ret)
{
    char real[PATH_MAX];
    if (!*dir)
        return err_set(EINVAL, "empty store directory");
    int r = mkdir_p(dir, 0700);
    if (r < 0)
        return err_set(-r, "cannot create the store directory %s: %s", dir, strerror(-r));
    if (!realpath(dir, real))
        return err_set(errno, "cannot resolve the store directory %s: %s", dir, strerror(errno));
    struct local *l = xcalloc(1, sizeof(*l));
    l->root = xstrdup(real);
    pthread_mutex_init(&l->lock, NULL);
    struct store *st = xcalloc(1, sizeof(*st));
    st->ops = &local_ops;
    st->impl = l;
    st->describe = xasprintf("local directory %s", real);
    *ret = st;
    return 0;
}
