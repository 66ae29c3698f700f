/* store.h - the store module's contract: objects kept under keys in a local directory or in
 * S3-compatible object storage (a session's files and variables go there), and the SQLite
 * record of every session a server has had.
 *
 * Objects stream from and to file descriptors: a large file is never held in memory.
 *
 * Thread safety: a store and a meta_db may be used from any number of threads at once. */
#ifndef RUNCELL_STORE_H
#define RUNCELL_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#define SHA256_HEX_SIZE 65 /* 64 hex digits and a NUL */

/* ---- object stores ---- */

struct store_config {
    const char *url;              /* "DIR", "file:DIR" or "s3://BUCKET[/PREFIX]" */
    const char *s3_endpoint;      /* "http[s]://HOST[:PORT]"; default: AWS for the region */
    const char *s3_region;        /* default AWS_REGION, AWS_DEFAULT_REGION, else us-east-1 */
    const char *s3_access_key;    /* default AWS_ACCESS_KEY_ID */
    const char *s3_secret_key;    /* default AWS_SECRET_ACCESS_KEY */
    const char *s3_session_token; /* default AWS_SESSION_TOKEN (temporary credentials) */
    bool s3_virtual_hosted;       /* BUCKET.HOST instead of HOST/BUCKET (AWS's default) */
    uint64_t timeout_ms;          /* connecting, and a stalled transfer (default 15 s) */
};

struct store;

/* Opens the store cfg->url names (a local directory is created 0700). Credentials are
 * copied. 0 or -errno with err_msg(); *ret owned by the caller (store_free). */
int store_open(const struct store_config *cfg, struct store **ret);
/* NULL is a no-op; secrets are wiped. */
void store_free(struct store *st);
/* "local directory /var/lib/runcell/store" or "s3://bucket/prefix at http://host:port" */
const char *store_describe(const struct store *st);
/* Asks the store for one key under "sessions/": 0 when it answers (credentials, bucket and
 * endpoint work), else -errno with err_msg() saying what failed. */
int store_check(struct store *st);

/* A deadline (now_ms() time) for every store request the calling thread makes from now on,
 * retries included: an S3 request still going then is cut off and fails with -ETIMEDOUT, one
 * made after it fails at once. 0 clears it. A fleet's lease renewer sets it, so that a store
 * that hangs cannot keep it past the point where the node must stop work. A local directory
 * store is not bounded by it (a hung file system blocks the call). */
void store_thread_deadline(uint64_t deadline_ms);

/* Keys are relative paths of plain components made of [A-Za-z0-9._-], not starting with a
 * dot; store_key_valid says whether one is. */
bool store_key_valid(const char *key);

/* Stores size bytes read from fd at offsets 0..size (pread: the fd's position is not used)
 * under key, replacing what was there; the object appears whole or not at all. When
 * sha256_hex is not NULL the bytes read must hash to it (-EAGAIN otherwise: the file changed
 * while being read). 0 or -errno with err_msg(). */
int store_put_fd(struct store *st, const char *key, int fd, uint64_t size, const char *sha256_hex);
int store_put_buf(struct store *st, const char *key, const void *data, size_t n);
/* Writes the object's bytes to fd (at its position). -ENOENT when there is no such key,
 * -EFBIG past max_bytes (0 = no cap; what was written stays written). 0 or -errno with
 * err_msg(); *ret_size (may be NULL) is the byte count written. */
int store_get_fd(struct store *st, const char *key, int fd, uint64_t max_bytes, uint64_t *ret_size);
/* store_get_fd of an object stored under its SHA-256 (a blob): the bytes written to fd must
 * hash to sha256_hex, -EBADMSG otherwise (what was written stays written). A local store
 * hashes an object once per process: a copy it wrote or checked since, unchanged (same file,
 * size and time), is copied without hashing again. */
int store_get_verified(struct store *st, const char *key, int fd, uint64_t max_bytes,
                       const char *sha256_hex, uint64_t *ret_size);
/* Stores size bytes of fd under prefix followed by their SHA-256 in hex, hashing as it
 * copies (a local store reads fd once); *ret_sha is the hash. 0 or -errno with err_msg(). */
int store_put_fd_hashed(struct store *st, const char *prefix, int fd, uint64_t size,
                        char ret_sha[SHA256_HEX_SIZE]);
/* The object in memory, NUL-terminated, at most max bytes (-EFBIG past it); caller frees. */
int store_get_buf(struct store *st, const char *key, size_t max, char **ret, size_t *ret_len);
/* Removes key; a key that is not there is not an error. 0 or -errno with err_msg(). */
int store_delete(struct store *st, const char *key);

struct store_object {
    char *key;
    uint64_t size;
};
struct store_listing {
    struct store_object *v;
    size_t n;
};
#define STORE_LIST_MAX 100000
/* Every key starting with prefix (a string prefix), sorted, at most STORE_LIST_MAX (-E2BIG past
 * it). 0 or -errno with err_msg(). */
int store_list(struct store *st, const char *prefix, struct store_listing *ret);
void store_listing_release(struct store_listing *l);

/* ---- versioned objects (records.c): compare-and-swap, for session records and leases ----
 *
 * A version names one write of an object (S3: its ETag; a directory: the SHA-256 of its
 * bytes). A conditional write happens only when the object is still at the version the
 * writer read (or absent): of two nodes racing for one lease, exactly one wins. */
#define STORE_VERSION_SIZE 80
/* The object in memory (NUL-terminated, at most max bytes) and its version. -ENOENT when
 * absent; 0 or -errno with err_msg(); caller frees *ret. */
int store_get_versioned(struct store *st, const char *key, size_t max, char **ret, size_t *ret_len,
                        char ret_version[STORE_VERSION_SIZE]);
/* Writes data under key when it is at if_version (NULL: when there is no such key). 0 with
 * ret_version the new version; -ESTALE when another write came first (read it again);
 * other -errno with err_msg(). A retried request that had succeeded is recognised (the
 * store holds exactly these bytes) and counts as a success. */
int store_put_if(struct store *st, const char *key, const void *data, size_t n,
                 const char *if_version, char ret_version[STORE_VERSION_SIZE]);
/* At start: whether the store refuses a conditional write it must refuse (an If-None-Match
 * write over an object that exists). 0 when it does; -ENOTSUP with err_msg() when it
 * ignores the condition (as s3rver and older S3-compatible servers do): leases on it would
 * not keep two nodes apart. Leaves a key under "fleet/". */
int store_check_conditional(struct store *st, const char *node);

/* ---- sealed values (seal.c): what the store keeps but must not read ---- */

#define SEAL_KEY_SIZE 32
/* Encrypts n bytes (at most 1 MiB) with AES-256-GCM under key, bound to aad (the id of the
 * record it goes into: a sealed value moved to another record does not open). Returns
 * "v1." + base64(nonce | ciphertext | tag), the caller's; NULL with err_msg(). */
char *store_seal(const unsigned char key[SEAL_KEY_SIZE], const char *aad, const void *data,
                 size_t n);
/* Opens what store_seal made with the same key and aad: the plaintext, NUL-terminated after
 * its *ret_len bytes (the caller wipes and frees it). NULL with err_msg(): EINVAL (not a
 * sealed value), EACCES (another key, another record, or changed). */
unsigned char *store_unseal(const unsigned char key[SEAL_KEY_SIZE], const char *aad,
                            const char *sealed, size_t *ret_len);
/* Reads a key file: 32 bytes, or 64 hexadecimal digits and an optional newline; refused when
 * its mode lets others read it. 0 or -errno with err_msg() naming the file. */
int store_seal_key_load(const char *path, unsigned char key[SEAL_KEY_SIZE]);

/* ---- SHA-256 ---- */
void sha256_hex(const void *data, size_t n, char out[SHA256_HEX_SIZE]);
/* Hashes bytes 0..size of fd (pread). -EAGAIN when the file is shorter than size. */
int sha256_fd(int fd, uint64_t size, char out[SHA256_HEX_SIZE]);
/* Incremental hashing for data that streams through. */
struct sha256_ctx;
struct sha256_ctx *sha256_new(void);
void sha256_update(struct sha256_ctx *c, const void *data, size_t n);
/* Writes the digest and frees c. */
void sha256_finish(struct sha256_ctx *c, char out[SHA256_HEX_SIZE]);

/* ---- the session records of a server (SQLite, DATA/sessions.db) ---- */

/* A session's life as the records tell it. */
enum meta_state {
    META_LIVE,         /* running in a server now (or the server died: see meta_open) */
    META_EXPIRED,      /* reaped for idleness */
    META_CHECKPOINTED, /* closed with checkpoint */
    META_CLOSED,       /* closed; its stored files were discarded */
    META_STOPPED,      /* the server stopped (or died) while it was live */
};
const char *meta_state_name(enum meta_state s);

struct meta_session {
    char *id;
    char *owner;           /* "<pid>-<starttime>" of the process running it while live */
    char *options;         /* JSON object: language, limits, timeouts, persist */
    char *resumed_from;    /* or NULL */
    char *checkpoint;      /* JSON object: what the last checkpoint saved and skipped, or NULL */
    uint64_t created_ms;   /* wall clock */
    uint64_t last_used_ms; /* wall clock */
    long execution_count;
    enum meta_state state;
    bool persist;       /* files (and variables at checkpoints) go to the store */
    bool has_variables; /* a checkpoint of its variables is stored */
};
void meta_session_release(struct meta_session *m);

struct meta_db;

/* Opens (creating) the database at path; several processes (a server, repls) may share it.
 * 0 or -errno with err_msg(); *ret owned by the caller (meta_close). */
int meta_open(const char *path, struct meta_db **ret);
void meta_close(struct meta_db *m);
/* Sessions left "live" by owners that no longer run (alive() says) become "stopped". */
int meta_recover(struct meta_db *m, bool (*alive)(const char *owner));
/* Inserts or replaces the whole record. */
int meta_put(struct meta_db *m, const struct meta_session *s);
/* -ENOENT when there is no such id. *ret released with meta_session_release. */
int meta_get(struct meta_db *m, const char *id, struct meta_session *ret);
/* An execution's update of its record. Written at once when none was written in the last
 * second; else kept and written within a second of the last write (by a thread of m's), or
 * before any other call on m reads or writes: a process that crashes loses at most that
 * second of these updates; another process reading the file sees them that much later. */
int meta_touch(struct meta_db *m, const char *id, uint64_t last_used_ms, long execution_count);
/* checkpoint: JSON text, or NULL to keep the current one. */
int meta_set_state(struct meta_db *m, const char *id, enum meta_state state, bool has_variables,
                   const char *checkpoint);
/* Calls fn for each record, newest first, at most limit (0 = all). */
int meta_foreach(struct meta_db *m, size_t limit,
                 void (*fn)(void *ctx, const struct meta_session *s), void *ctx);

#endif
