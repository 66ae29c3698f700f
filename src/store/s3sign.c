/* s3sign.c - AWS Signature Version 4: the canonical request, the string to sign and the
 * derived signing key, as the SigV4 documentation spells them out. */
#include "store/store-int.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static void hmac_sha256(const void *key, size_t key_len, const char *data, unsigned char out[32])
{
    unsigned int n = 32;
    HMAC(EVP_sha256(), key, (int)key_len, (const unsigned char *)data, strlen(data), out, &n);
}

static void hex32(const unsigned char d[32], char out[SHA256_HEX_SIZE])
{
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

char *sigv4_uri_encode(const char *s, bool keep_slash)
{
    struct buf b;
    buf_init(&b, 0);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        bool plain = (*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
                     (*p >= '0' && *p <= '9') || strchr("-._~", *p) || (keep_slash && *p == '/');
        if (plain)
            buf_append(&b, p, 1);
        else
            buf_printf(&b, "%%%02X", *p);
    }
    return buf_detach(&b, NULL);
}

void sigv4_amz_date(uint64_t unix_seconds, char *out)
{
    time_t t = (time_t)unix_seconds;
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, 17, "%Y%m%dT%H%M%SZ", &tm);
}

/* The canonical headers block ("name:value\n" each) and the signed header list. */
static void canonical_headers(const char *const *headers, struct buf *block, struct buf *names)
{
    for (const char *const *h = headers; *h; h++) {
        const char *colon = strchr(*h, ':');
        size_t n = colon ? (size_t)(colon - *h) : strlen(*h);
        buf_printf(block, "%s\n", *h);
        if (names->len)
            buf_append(names, ";", 1);
        buf_append(names, *h, n);
    }
}

char *sigv4_authorization(const struct sigv4_request *rq)
{
    struct buf creq, block, names;
    char date[9], creq_hash[SHA256_HEX_SIZE], sig[SHA256_HEX_SIZE];
    unsigned char k[32], k2[32];
    buf_init(&creq, 0);
    buf_init(&block, 0);
    buf_init(&names, 0);
    canonical_headers(rq->headers, &block, &names);
    buf_printf(&creq, "%s\n%s\n%s\n%s\n%s\n%s", rq->method, rq->path, rq->query, block.data,
               names.data, rq->payload_sha256);
    sha256_hex(creq.data, creq.len, creq_hash);
    snprintf(date, sizeof(date), "%.8s", rq->amz_date);
    _cleanup_free_ char *scope = xasprintf("%s/%s/%s/aws4_request", date, rq->region, rq->service);
    _cleanup_free_ char *to_sign =
        xasprintf("AWS4-HMAC-SHA256\n%s\n%s\n%s", rq->amz_date, scope, creq_hash);
    _cleanup_free_ char *first = xasprintf("AWS4%s", rq->secret_key);
    hmac_sha256(first, strlen(first), date, k);
    hmac_sha256(k, 32, rq->region, k2);
    hmac_sha256(k2, 32, rq->service, k);
    hmac_sha256(k, 32, "aws4_request", k2);
    hmac_sha256(k2, 32, to_sign, k);
    hex32(k, sig);
    char *auth = xasprintf("AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s",
                           rq->access_key, scope, names.data, sig);
    explicit_bzero(first, strlen(first));
    explicit_bzero(k, sizeof(k));
    explicit_bzero(k2, sizeof(k2));
    buf_release(&creq);
    buf_release(&block);
    buf_release(&names);
    return auth;
}
