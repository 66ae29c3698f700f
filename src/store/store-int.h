/* store-int.h - internals of the store module: the backend interface and SigV4 signing,
 * shared by its files (and its unit tests) only. */
#ifndef RUNCELL_STORE_INT_H
#define RUNCELL_STORE_INT_H

#include "store/store.h"

struct store_ops {
    int (*put)(struct store *st, const char *key, int fd, uint64_t size, const char *sha256_hex);
    /* Optional: the same from memory, where a backend does it cheaper than from a memfd. */
    int (*put_buf)(struct store *st, const char *key, const void *data, size_t n);
    int (*get)(struct store *st, const char *key, int fd, uint64_t max, uint64_t *ret_size);
    /* Optional: get, checking the bytes hash to sha256_hex (-EBADMSG when they do not), where
     * a backend knows cheaper ways than hashing what it wrote out (store_get_verified). */
    int (*get_verified)(struct store *st, const char *key, int fd, uint64_t max,
                        const char *sha256_hex, uint64_t *ret_size);
    /* Optional: put under prefix + the hash of what was read, hashing as it copies
     * (store_put_fd_hashed). */
    int (*put_hashed)(struct store *st, const char *prefix, int fd, uint64_t size,
                      char ret_sha[SHA256_HEX_SIZE]);
    int (*del)(struct store *st, const char *key);
    int (*list)(struct store *st, const char *prefix, struct store_listing *ret);
    /* records.c's compare-and-swap: see store_get_versioned and store_put_if */
    int (*get_v)(struct store *st, const char *key, size_t max, char **ret, size_t *ret_len,
                 char ret_version[STORE_VERSION_SIZE]);
    int (*put_if)(struct store *st, const char *key, int fd, uint64_t size, const char *sha256_hex,
                  const char *if_version, char ret_version[STORE_VERSION_SIZE]);
    void (*free)(struct store *st);
};

struct store {
    const struct store_ops *ops;
    char *describe;
    void *impl;
};

int store_local_open(const char *dir, struct store **ret);
int store_s3_open(const struct store_config *cfg, const char *bucket, const char *prefix,
                  struct store **ret);

/* A memfd holding data (store.c), for the streaming calls; -errno with err_msg(). */
int store_memfd_of(const void *data, size_t n);

/* Appends an object to a listing (keys copied); -E2BIG past STORE_LIST_MAX. */
int store_listing_add(struct store_listing *l, size_t *alloc, const char *key, uint64_t size);

/* ---- what an S3 server answers (store_s3.c); the server is not trusted to be sane ---- */

/* The text between <tag> and </tag> in xml (NUL-terminated), from *pos when pos is not NULL
 * (then moved past </tag>), entities decoded; NULL when absent. Caller frees. */
char *s3_xml_field(const char *xml, const char *tag, const char **pos);
/* Adds the keys of one ListObjectsV2 page (xml, NUL-terminated), asked for with sent_token
 * (NULL for the first page), less "prefix/" (prefix "" for none), to l; *ret_token is the
 * next page's token or NULL. 0, -E2BIG (see store_listing_add), or -EIO with err_msg() for
 * a truncated page without a new token. */
int s3_parse_list_page(const char *prefix, const char *xml, const char *sent_token,
                       struct store_listing *l, size_t *alloc, char **ret_token);

/* ---- AWS Signature Version 4 (s3sign.c) ---- */

struct sigv4_request {
    const char *method;         /* "GET", "PUT", ... */
    const char *path;           /* canonical URI, already percent-encoded ("/bucket/key") */
    const char *query;          /* canonical query string (sorted, encoded), "" for none */
    const char *const *headers; /* "name:value" pairs to sign, lower-case names, sorted by
                                 * name, host and x-amz-* included; NULL-terminated */
    const char *payload_sha256; /* hex, or "UNSIGNED-PAYLOAD" */
    const char *amz_date;       /* "20130524T000000Z" */
    const char *region;
    const char *service; /* "s3" */
    const char *access_key;
    const char *secret_key;
};

/* The Authorization header value ("AWS4-HMAC-SHA256 Credential=..., SignedHeaders=...,
 * Signature=..."); caller frees. */
char *sigv4_authorization(const struct sigv4_request *rq);
/* Percent-encodes s as SigV4 wants it: unreserved characters (A-Z a-z 0-9 - . _ ~) stay,
 * '/' stays when keep_slash, everything else becomes %XX (upper-case hex). Caller frees. */
char *sigv4_uri_encode(const char *s, bool keep_slash);
/* "YYYYMMDDTHHMMSSZ" for a realtime in seconds; out holds at least 17 bytes. */
void sigv4_amz_date(uint64_t unix_seconds, char *out);

#endif
