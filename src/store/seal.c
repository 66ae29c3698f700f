/* seal.c - values the store keeps but must not be able to read: AES-256-GCM (OpenSSL's
 * libcrypto) under a key the operator holds outside the store, each sealed value bound to
 * the record it is written into. */
#include "store/store.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SEAL_PREFIX    "v1."
#define SEAL_NONCE     12
#define SEAL_TAG       16
#define SEAL_MAX_PLAIN (1u << 20)

/* One pass of AES-256-GCM over in (n bytes) into out; the tag is written (seal) or checked
 * (open). 0, or -EACCES when an opened tag does not match, -EIO on a library failure. */
static int gcm(bool seal, const unsigned char key[SEAL_KEY_SIZE], const unsigned char *nonce,
               const char *aad, const unsigned char *in, size_t n, unsigned char *out,
               unsigned char tag[SEAL_TAG])
{
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    int len, r = -EIO;
    if (!ctx)
        return -EIO;
    if (EVP_CipherInit_ex(ctx, EVP_aes_256_gcm(), NULL, NULL, NULL, seal) != 1 ||
        EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, SEAL_NONCE, NULL) != 1 ||
        EVP_CipherInit_ex(ctx, NULL, NULL, key, nonce, seal) != 1 ||
        EVP_CipherUpdate(ctx, NULL, &len, (const unsigned char *)aad, (int)strlen(aad)) != 1 ||
        (n && EVP_CipherUpdate(ctx, out, &len, in, (int)n) != 1))
        goto out;
    if (!seal && EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, SEAL_TAG, tag) != 1)
        goto out;
    if (EVP_CipherFinal_ex(ctx, out + n, &len) != 1) {
        r = seal ? -EIO : -EACCES;
        goto out;
    }
    if (seal && EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, SEAL_TAG, tag) != 1)
        goto out;
    r = 0;
out:
    EVP_CIPHER_CTX_free(ctx);
    return r;
}

char *store_seal(const unsigned char key[SEAL_KEY_SIZE], const char *aad, const void *data,
                 size_t n)
{
    if (n > SEAL_MAX_PLAIN) {
        err_set(E2BIG, "%zu bytes to seal; at most %u", n, SEAL_MAX_PLAIN);
        return NULL;
    }
    size_t total = SEAL_NONCE + n + SEAL_TAG;
    unsigned char *box = xmalloc(total + 1);
    if (random_bytes(box, SEAL_NONCE) < 0 ||
        gcm(true, key, box, aad, data, n, box + SEAL_NONCE, box + SEAL_NONCE + n) < 0) {
        free(box);
        err_set(EIO, "cannot seal: the crypto library failed");
        return NULL;
    }
    _cleanup_free_ char *b64 = base64_encode(box, total, NULL);
    free(box);
    return xasprintf(SEAL_PREFIX "%s", b64);
}

unsigned char *store_unseal(const unsigned char key[SEAL_KEY_SIZE], const char *aad,
                            const char *sealed, size_t *ret_len)
{
    size_t total = 0;
    unsigned char *box = NULL;
    if (sealed && !strncmp(sealed, SEAL_PREFIX, strlen(SEAL_PREFIX)))
        box = base64_decode(sealed + strlen(SEAL_PREFIX), strlen(sealed + strlen(SEAL_PREFIX)),
                            &total);
    if (!box || total < SEAL_NONCE + SEAL_TAG) {
        free(box);
        err_set(EINVAL, "not a sealed value (\"%s...\")", SEAL_PREFIX);
        return NULL;
    }
    size_t n = total - SEAL_NONCE - SEAL_TAG;
    unsigned char *plain = xmalloc(n + 1);
    int r = gcm(false, key, box, aad, box + SEAL_NONCE, n, plain, box + SEAL_NONCE + n);
    free(box);
    if (r < 0) {
        explicit_bzero(plain, n);
        free(plain);
        err_set(-r, r == -EACCES ? "the sealed value does not open with this key (sealed with "
                                   "another key, for another record, or changed)"
                                 : "cannot open the sealed value: the crypto library failed");
        return NULL;
    }
    plain[n] = '\0';
    *ret_len = n;
    return plain;
}

static int hex_digit(int c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

int store_seal_key_load(const char *path, unsigned char key[SEAL_KEY_SIZE])
{
    unsigned char buf[2 * SEAL_KEY_SIZE + 2];
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return err_set(errno, "cannot open the key file %s: %s", path, strerror(errno));
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return err_set(EINVAL, "the key file %s is not a regular file", path);
    }
    if (st.st_mode & 077) {
        close(fd);
        return err_set(EPERM, "the key file %s may be read by others (mode %03o): chmod 600 it",
                       path, (unsigned)(st.st_mode & 0777));
    }
    ssize_t n = read(fd, buf, sizeof(buf));
    close(fd);
    int r = 0;
    if (n == SEAL_KEY_SIZE) {
        memcpy(key, buf, SEAL_KEY_SIZE);
    } else if (n == 2 * SEAL_KEY_SIZE || (n == 2 * SEAL_KEY_SIZE + 1 && buf[n - 1] == '\n')) {
        for (size_t i = 0; i < SEAL_KEY_SIZE && r == 0; i++) {
            int hi = hex_digit(buf[2 * i]), lo = hex_digit(buf[2 * i + 1]);
            if (hi < 0 || lo < 0)
                r = -1;
            else
                key[i] = (unsigned char)(hi << 4 | lo);
        }
    } else {
        r = -1;
    }
    explicit_bzero(buf, sizeof(buf));
    if (r < 0) {
        explicit_bzero(key, SEAL_KEY_SIZE);
        return err_set(EINVAL,
                       "the key file %s holds neither %d bytes nor %d hexadecimal digits; make "
                       "one with: openssl rand -hex %d > FILE; chmod 600 FILE",
                       path, SEAL_KEY_SIZE, 2 * SEAL_KEY_SIZE, SEAL_KEY_SIZE);
    }
    return 0;
}
