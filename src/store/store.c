/* store.c - the store interface: picking a backend from a URL, keys, in-memory objects on
 * top of the streaming calls, listings and SHA-256. */
#include "store/store-int.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int store_open(const struct store_config *cfg, struct store **ret)
{
    const char *url = cfg->url;
    if (!url || !*url)
        return err_set(EINVAL, "no store given: pass a directory or s3://BUCKET/PREFIX");
    if (str_has_prefix(url, "s3://")) {
        const char *b = url + 5;
        size_t n = strcspn(b, "/");
        if (!n)
            return err_set(EINVAL, "store '%s': no bucket; use s3://BUCKET or s3://BUCKET/PREFIX",
                           url);
        _cleanup_free_ char *bucket = xstrndup(b, n);
        _cleanup_free_ char *prefix = xstrdup(b[n] ? b + n + 1 : "");
        size_t pl = strlen(prefix);
        while (pl && prefix[pl - 1] == '/')
            prefix[--pl] = '\0';
        if (*prefix && !store_key_valid(prefix))
            return err_set(EINVAL,
                           "store '%s': the prefix must be plain path components of "
                           "letters, digits, '.', '_' and '-'",
                           url);
        return store_s3_open(cfg, bucket, prefix, ret);
    }
    if (strstr(url, "://"))
        return err_set(EINVAL, "store '%s': unknown scheme; use a directory or s3://BUCKET/PREFIX",
                       url);
    return store_local_open(str_has_prefix(url, "file:") ? url + 5 : url, ret);
}

void store_free(struct store *st)
{
    if (!st)
        return;
    st->ops->free(st);
    free(st->describe);
    free(st);
}

const char *store_describe(const struct store *st)
{
    return st->describe;
}

int store_check(struct store *st)
{
    struct store_listing l;
    /* A prefix no key has: the answer is empty, but it proves the store answers. */
    int r = store_list(st, "sessions/.check", &l);
    if (r < 0)
        return r;
    store_listing_release(&l);
    return 0;
}

bool store_key_valid(const char *key)
{
    if (!path_is_safe_relative(key) || strlen(key) > 900)
        return false;
    for (const char *p = key; *p; p++) {
        bool start = p == key || p[-1] == '/';
        if (start && *p == '.')
            return false;
        if (!(*p >= 'a' && *p <= 'z') && !(*p >= 'A' && *p <= 'Z') && !(*p >= '0' && *p <= '9') &&
            !strchr("._-/", *p))
            return false;
    }
    return true;
}

static int bad_key(const char *key)
{
    return err_set(EINVAL, "bad store key '%s'", key);
}

int store_put_fd(struct store *st, const char *key, int fd, uint64_t size, const char *sha256_hex)
{
    if (!store_key_valid(key))
        return bad_key(key);
    return st->ops->put(st, key, fd, size, sha256_hex);
}

/* A memfd holding data, for the streaming calls. */
int store_memfd_of(const void *data, size_t n)
{
    int fd = memfd_create("runcell-object", MFD_CLOEXEC);
    if (fd < 0)
        return err_set(errno, "cannot create a memory file: %s", strerror(errno));
    int r = write_all(fd, data, n);
    if (r < 0) {
        close(fd);
        return err_set(-r, "cannot fill a memory file: %s", strerror(-r));
    }
    return fd;
}

int store_put_buf(struct store *st, const char *key, const void *data, size_t n)
{
    char sha[SHA256_HEX_SIZE];
    if (st->ops->put_buf)
        return store_key_valid(key) ? st->ops->put_buf(st, key, data, n) : bad_key(key);
    _cleanup_close_ int fd = store_memfd_of(data, n);
    if (fd < 0)
        return fd;
    sha256_hex(data, n, sha);
    return store_put_fd(st, key, fd, n, sha);
}

int store_get_fd(struct store *st, const char *key, int fd, uint64_t max_bytes, uint64_t *ret_size)
{
    uint64_t size = 0;
    if (!store_key_valid(key))
        return bad_key(key);
    int r = st->ops->get(st, key, fd, max_bytes, &size);
    if (ret_size)
        *ret_size = size;
    return r;
}

int store_get_verified(struct store *st, const char *key, int fd, uint64_t max_bytes,
                       const char *sha256_hex, uint64_t *ret_size)
{
    uint64_t size = 0;
    if (!store_key_valid(key))
        return bad_key(key);
    int r;
    if (st->ops->get_verified) {
        r = st->ops->get_verified(st, key, fd, max_bytes, sha256_hex, &size);
    } else {
        char got[SHA256_HEX_SIZE];
        r = st->ops->get(st, key, fd, max_bytes, &size);
        if (!r && (r = sha256_fd(fd, size, got)) < 0)
            r = err_set(-r, "cannot read object %s back: %s", key, strerror(-r));
        else if (!r && strcmp(got, sha256_hex))
            r = err_set(EBADMSG, "object %s does not hash to its name", key);
    }
    if (ret_size)
        *ret_size = size;
    return r;
}

int store_put_fd_hashed(struct store *st, const char *prefix, int fd, uint64_t size,
                        char ret_sha[SHA256_HEX_SIZE])
{
    if (st->ops->put_hashed)
        return st->ops->put_hashed(st, prefix, fd, size, ret_sha);
    int r = sha256_fd(fd, size, ret_sha);
    if (r < 0)
        return err_set(-r, "cannot read what is to be stored: %s", strerror(-r));
    _cleanup_free_ char *key = xasprintf("%s%s", prefix, ret_sha);
    return store_put_fd(st, key, fd, size, ret_sha);
}

int store_get_buf(struct store *st, const char *key, size_t max, char **ret, size_t *ret_len)
{
    _cleanup_close_ int fd = memfd_create("runcell-object", MFD_CLOEXEC);
    uint64_t size;
    if (fd < 0)
        return err_set(errno, "cannot create a memory file: %s", strerror(errno));
    int r = store_get_fd(st, key, fd, max, &size);
    if (r < 0)
        return r;
    char *data = xmalloc(size + 1);
    ssize_t n = size ? pread(fd, data, size, 0) : 0;
    if (n < 0 || (uint64_t)n != size) {
        free(data);
        return err_set(EIO, "cannot read back object %s from memory", key);
    }
    data[size] = '\0';
    *ret = data;
    if (ret_len)
        *ret_len = size;
    return 0;
}

int store_delete(struct store *st, const char *key)
{
    if (!store_key_valid(key))
        return bad_key(key);
    return st->ops->del(st, key);
}

static int object_cmp(const void *a, const void *b)
{
    return strcmp(((const struct store_object *)a)->key, ((const struct store_object *)b)->key);
}

int store_list(struct store *st, const char *prefix, struct store_listing *ret)
{
    memset(ret, 0, sizeof(*ret));
    int r = st->ops->list(st, prefix, ret);
    if (r < 0)
        store_listing_release(ret);
    else if (ret->n)
        qsort(ret->v, ret->n, sizeof(*ret->v), object_cmp);
    return r;
}

int store_listing_add(struct store_listing *l, size_t *alloc, const char *key, uint64_t size)
{
    if (l->n >= STORE_LIST_MAX)
        return err_set(E2BIG, "more than %d objects under one prefix", STORE_LIST_MAX);
    if (l->n == *alloc) {
        *alloc = *alloc ? 2 * *alloc : 64;
        l->v = xrealloc(l->v, *alloc * sizeof(*l->v));
    }
    l->v[l->n++] = (struct store_object){.key = xstrdup(key), .size = size};
    return 0;
}

void store_listing_release(struct store_listing *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i].key);
    free(l->v);
    memset(l, 0, sizeof(*l));
}

/* ---- SHA-256 through OpenSSL's EVP interface ---- */

struct sha256_ctx {
    EVP_MD_CTX *md;
};

struct sha256_ctx *sha256_new(void)
{
    struct sha256_ctx *c = xcalloc(1, sizeof(*c));
    c->md = EVP_MD_CTX_new();
    if (!c->md || EVP_DigestInit_ex(c->md, EVP_sha256(), NULL) != 1)
        abort(); /* out of memory: as the x* helpers do */
    return c;
}

void sha256_update(struct sha256_ctx *c, const void *data, size_t n)
{
    EVP_DigestUpdate(c->md, data, n);
}

void sha256_finish(struct sha256_ctx *c, char out[SHA256_HEX_SIZE])
{
    unsigned char d[32];
    unsigned int n = 0;
    EVP_DigestFinal_ex(c->md, d, &n);
    for (unsigned i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
    EVP_MD_CTX_free(c->md);
    free(c);
}

void sha256_hex(const void *data, size_t n, char out[SHA256_HEX_SIZE])
{
    struct sha256_ctx *c = sha256_new();
    sha256_update(c, data, n);
    sha256_finish(c, out);
}

int sha256_fd(int fd, uint64_t size, char out[SHA256_HEX_SIZE])
{
    char chunk[65536];
    struct sha256_ctx *c = sha256_new();
    uint64_t off = 0;
    while (off < size) {
        ssize_t n = pread(fd, chunk, (size_t)MIN((uint64_t)sizeof(chunk), size - off), (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = n < 0 ? errno : EAGAIN;
            sha256_finish(c, out);
            return -e;
        }
        sha256_update(c, chunk, (size_t)n);
        off += (uint64_t)n;
    }
    sha256_finish(c, out);
    return 0;
}
