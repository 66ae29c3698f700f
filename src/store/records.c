/* records.c - versioned objects: reads that return a version and writes that happen only
 * at the version read, the compare-and-swap that session records and leases are built on. */
#include "store/store-int.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#define CHECK_KEY_FMT "fleet/conditional-check-%s"

static int bad_key(const char *key)
{
    return err_set(EINVAL, "bad store key '%s'", key);
}

int store_get_versioned(struct store *st, const char *key, size_t max, char **ret, size_t *ret_len,
                        char ret_version[STORE_VERSION_SIZE])
{
    if (!store_key_valid(key))
        return bad_key(key);
    return st->ops->get_v(st, key, max, ret, ret_len, ret_version);
}

/* After a failed precondition: the write may be our own, retried after a lost answer. */
static bool holds_exactly(struct store *st, const char *key, const void *data, size_t n,
                          char ret_version[STORE_VERSION_SIZE])
{
    char *cur = NULL, version[STORE_VERSION_SIZE];
    size_t len = 0;
    bool same = st->ops->get_v(st, key, n + 1, &cur, &len, version) == 0 && len == n &&
                !memcmp(cur, data, n);
    free(cur);
    if (same)
        memcpy(ret_version, version, STORE_VERSION_SIZE);
    return same;
}

int store_put_if(struct store *st, const char *key, const void *data, size_t n,
                 const char *if_version, char ret_version[STORE_VERSION_SIZE])
{
    char sha[SHA256_HEX_SIZE];
    if (!store_key_valid(key))
        return bad_key(key);
    _cleanup_close_ int fd = store_memfd_of(data, n);
    if (fd < 0)
        return fd;
    sha256_hex(data, n, sha);
    int r = st->ops->put_if(st, key, fd, n, sha, if_version, ret_version);
    if (r == -ESTALE && holds_exactly(st, key, data, n, ret_version))
        return 0;
    if (r == -ESTALE)
        err_set(ESTALE, "%s was changed by another writer", key);
    return r;
}

int store_check_conditional(struct store *st, const char *node)
{
    _cleanup_free_ char *key = xasprintf(CHECK_KEY_FMT, node);
    _cleanup_free_ char *nonce = random_hex(8);
    _cleanup_free_ char *body = xasprintf("{\"node\":\"%s\",\"nonce\":\"%s\"}", node, nonce);
    char version[STORE_VERSION_SIZE];
    /* The key exists after this plain write; an If-None-Match write over it must fail. */
    int r = store_put_buf(st, key, body, strlen(body));
    if (r < 0)
        return r;
    _cleanup_free_ char *other = xasprintf("{\"node\":\"%s\",\"nonce\":\"x%s\"}", node, nonce);
    _cleanup_close_ int fd = store_memfd_of(other, strlen(other));
    char sha[SHA256_HEX_SIZE];
    if (fd < 0)
        return fd;
    sha256_hex(other, strlen(other), sha);
    r = st->ops->put_if(st, key, fd, strlen(other), sha, NULL, version);
    if (r == -ESTALE)
        return 0;
    if (r == 0)
        return err_set(ENOTSUP,
                       "the store %s ignores conditional writes (a PUT with If-None-Match: * "
                       "replaced an object that exists): leases on it cannot keep two nodes "
                       "from running one session; use a store that honours If-None-Match and "
                       "If-Match on PUT (AWS S3 does) or a shared directory",
                       store_describe(st));
    return r;
}
