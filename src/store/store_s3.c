/* store_s3.c - the S3-compatible store over libcurl: objects under BUCKET/PREFIX/, every
 * request signed with SigV4 (s3sign.c), bodies streamed between files and the network. */
#include "store/store-int.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define ERROR_BODY_CAP     (64u << 10)
#define CHAR_REF_MAX       16 /* bytes of an XML character reference, leading zeros and all */
#define LIST_PAGE_CAP      (16u << 20)
#define DEFAULT_TIMEOUT_MS 15000
#define ATTEMPTS           3
static const char EMPTY_SHA256[] =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

struct s3 {
    char *base_url;    /* "scheme://host[:port]" requests go to (with the bucket when virtual) */
    char *host_header; /* what the Host header says, and what is signed */
    char *bucket;
    char *prefix; /* "" or "a/b" */
    char *region;
    char *access_key;
    char *secret_key;
    char *token;
    bool virtual_hosted;
    uint64_t timeout_ms;
    CURLSH *share; /* connections and DNS answers shared between requests */
    pthread_mutex_t share_lock[CURL_LOCK_DATA_LAST];
};

/* One request: what to send, where the answer goes. */
struct s3_req {
    const char *method;
    const char *key;   /* store key (the prefix is added), or NULL for the bucket */
    const char *query; /* canonical query string, "" for none */
    /* upload (PUT): bytes 0..in_size of in_fd, hashing to payload_sha256 */
    int in_fd;
    uint64_t in_size, in_off;
    struct sha256_ctx *in_hash;
    const char *payload_sha256;
    bool in_changed;
    /* download: the body of a 2xx answer goes to out_fd, or into body */
    int out_fd;
    uint64_t out_max, out_size;
    bool out_too_big;
    int out_err;
    struct buf *body;
    /* conditional writes (records.c): "If-None-Match: *" or "If-Match: ETAG", or NULL */
    const char *condition;
    /* the answer */
    long status;
    struct buf err_body;
    char etag[STORE_VERSION_SIZE]; /* its ETag header, "" when none (or too long) */
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

static void curl_init_once(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

static void share_lock(CURL *h, curl_lock_data data, curl_lock_access access, void *ctx)
{
    struct s3 *s = ctx;
    (void)h;
    (void)access;
    pthread_mutex_lock(&s->share_lock[data]);
}

static void share_unlock(CURL *h, curl_lock_data data, void *ctx)
{
    struct s3 *s = ctx;
    (void)h;
    pthread_mutex_unlock(&s->share_lock[data]);
}

/* "prefix/key", or key alone when there is no prefix. */
static char *full_key(const struct s3 *s, const char *key)
{
    return *s->prefix ? xasprintf("%s/%s", s->prefix, key) : xstrdup(key);
}

static char *describe_key(const struct s3 *s, const char *key)
{
    _cleanup_free_ char *fk = key ? full_key(s, key) : xstrdup("");
    return xasprintf("s3://%s/%s", s->bucket, fk);
}

static size_t on_write(char *data, size_t size, size_t nmemb, void *ctx)
{
    struct s3_req *rq = ctx;
    size_t n = size * nmemb;
    if (rq->status < 200 || rq->status > 299) {
        buf_append(&rq->err_body, data, MIN(n, ERROR_BODY_CAP - rq->err_body.len));
        return n;
    }
    if (rq->body) {
        if (buf_append(rq->body, data, n) < 0) {
            rq->out_too_big = true;
            return 0; /* aborts the transfer */
        }
        return n;
    }
    if (rq->out_fd < 0)
        return n;
    if (rq->out_max && rq->out_size + n > rq->out_max) {
        rq->out_too_big = true;
        return 0;
    }
    int r = write_all(rq->out_fd, data, n);
    if (r < 0) {
        rq->out_err = r;
        return 0;
    }
    rq->out_size += n;
    return n;
}

/* The status is known once the headers are in; the body callback needs it. */
static size_t on_header(char *data, size_t size, size_t nmemb, void *ctx)
{
    struct s3_req *rq = ctx;
    size_t n = size * nmemb;
    if (n > 5 && !strncmp(data, "HTTP/", 5)) {
        const char *sp = memchr(data, ' ', n);
        char code[8]; /* curl's line is not NUL-terminated: the code is read from a copy */
        if (sp) {
            snprintf(code, sizeof(code), "%.*s", (int)MIN(n - (size_t)(sp + 1 - data), 7), sp + 1);
            rq->status = strtol(code, NULL, 10);
        }
        rq->etag[0] = '\0'; /* a new answer (after a redirect or a 100) */
    } else if (n > 5 && !strncasecmp(data, "etag:", 5)) {
        const char *v = data + 5, *end = data + n;
        while (v < end && (*v == ' ' || *v == '\t'))
            v++;
        while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' '))
            end--;
        /* An ETag is quoted hex; one longer than a version holds is not used (the write
         * that needs it fails its precondition, which is safe). */
        size_t len = (size_t)(end - v);
        if (len < STORE_VERSION_SIZE) {
            memcpy(rq->etag, v, len);
            rq->etag[len] = '\0';
        }
    }
    return n;
}

static size_t on_read(char *out, size_t size, size_t nmemb, void *ctx)
{
    struct s3_req *rq = ctx;
    size_t want = (size_t)MIN((uint64_t)(size * nmemb), rq->in_size - rq->in_off);
    if (!want)
        return 0;
    ssize_t n;
    do
        n = pread(rq->in_fd, out, want, (off_t)rq->in_off);
    while (n < 0 && errno == EINTR);
    if (n <= 0) {
        rq->in_changed = true; /* shorter than it was: abort rather than send less */
        return CURL_READFUNC_ABORT;
    }
    sha256_update(rq->in_hash, out, (size_t)n);
    rq->in_off += (uint64_t)n;
    if (rq->in_off == rq->in_size) {
        /* The last bytes are not handed over unless everything hashed as announced: an
         * object is never stored with contents other than the ones signed for. */
        char got[SHA256_HEX_SIZE];
        sha256_finish(rq->in_hash, got);
        rq->in_hash = NULL;
        if (strcmp(got, rq->payload_sha256)) {
            rq->in_changed = true;
            return CURL_READFUNC_ABORT;
        }
    }
    return (size_t)n;
}

static int on_seek(void *ctx, curl_off_t offset, int origin)
{
    struct s3_req *rq = ctx;
    if (origin != SEEK_SET || offset != 0)
        return CURL_SEEKFUNC_CANTSEEK;
    rq->in_off = 0;
    if (rq->in_hash)
        sha256_finish(rq->in_hash, (char[SHA256_HEX_SIZE]){0});
    rq->in_hash = sha256_new();
    return CURL_SEEKFUNC_OK;
}

char *s3_xml_field(const char *xml, const char *tag, const char **pos)
{
    _cleanup_free_ char *open = xasprintf("<%s>", tag);
    _cleanup_free_ char *close = xasprintf("</%s>", tag);
    const char *a = strstr(pos ? *pos : xml, open);
    if (!a)
        return NULL;
    a += strlen(open);
    const char *b = strstr(a, close);
    if (!b)
        return NULL;
    if (pos)
        *pos = b + strlen(close);
    static const char *const ents[][2] = {
        {"&amp;", "&"}, {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&apos;", "'"}};
    struct buf out;
    buf_init(&out, 0);
    buf_append(&out, "", 0);
    for (const char *p = a, *semi; p < b;) {
        size_t i;
        for (i = 0; i < ARRAY_SIZE(ents); i++)
            if (!strncmp(p, ents[i][0], strlen(ents[i][0])))
                break;
        if (i < ARRAY_SIZE(ents)) {
            buf_append(&out, ents[i][1], 1);
            p += strlen(ents[i][0]);
        } else if (!strncmp(p, "&#", 2) &&
                   (semi = memchr(p, ';', (size_t)MIN(CHAR_REF_MAX, b - p)))) {
            /* The ';' is looked for where a reference can end ("&#x10FFFF;"): searching the
             * rest of the body from each "&#" made a page of them cost its length squared. */
            unsigned long c = p[2] == 'x' ? strtoul(p + 3, NULL, 16) : strtoul(p + 2, NULL, 10);
            char ch = c > 0 && c < 128 ? (char)c : '?';
            buf_append(&out, &ch, 1);
            p = semi + 1;
        } else {
            buf_append(&out, p++, 1);
        }
    }
    return buf_detach(&out, NULL);
}

static int http_error(struct s3 *s, struct s3_req *rq)
{
    _cleanup_free_ char *what = describe_key(s, rq->key);
    const char *body = rq->err_body.data ? rq->err_body.data : "";
    _cleanup_free_ char *code = s3_xml_field(body, "Code", NULL);
    _cleanup_free_ char *msg = s3_xml_field(body, "Message", NULL);
    int e = rq->status == 404 ? ENOENT : rq->status == 403 ? EACCES : EIO;
    /* A conditional write that lost: 412, or 409 when another one was in flight (AWS). */
    if (rq->condition && (rq->status == 412 || rq->status == 409))
        return err_set(ESTALE, "%s was changed by another writer (HTTP %ld)", what, rq->status);
    if (rq->status == 404 && code && !strcmp(code, "NoSuchBucket"))
        e = EIO; /* the whole store is missing, not one object */
    if (e == ENOENT)
        return err_set(ENOENT, "object %s is missing from the store", what);
    return err_set(e, "S3 %s %s: HTTP %ld%s%s%s%s", rq->method, what, rq->status, code ? " " : "",
                   code ? code : "", msg ? ": " : "", msg ? msg : "");
}

static int curl_error(struct s3 *s, struct s3_req *rq, CURLcode c, const char *errbuf)
{
    _cleanup_free_ char *what = describe_key(s, rq->key);
    const char *detail = *errbuf ? errbuf : curl_easy_strerror(c);
    if (rq->in_changed)
        return err_set(EAGAIN, "the data changed while it was being stored as %s", what);
    if (rq->out_too_big)
        return err_set(EFBIG, "object %s is larger than the %llu bytes allowed", what,
                       (unsigned long long)(rq->body ? rq->body->max : rq->out_max));
    if (rq->out_err)
        return err_set(-rq->out_err, "cannot write object %s out: %s", what,
                       strerror(-rq->out_err));
    switch (c) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
        return err_set(ECONNREFUSED, "cannot reach the store at %s for %s: %s", s->base_url, what,
                       detail);
    case CURLE_OPERATION_TIMEDOUT:
        return err_set(ETIMEDOUT, "the store at %s did not answer in time for %s: %s", s->base_url,
                       what, detail);
    default:
        return err_set(EIO, "S3 %s %s failed: %s", rq->method, what, detail);
    }
}

static struct curl_slist *sign_headers(struct s3 *s, struct s3_req *rq, const char *canon_path)
{
    char amz_date[17];
    sigv4_amz_date(now_realtime_ms() / 1000, amz_date);
    _cleanup_free_ char *h_host = xasprintf("host:%s", s->host_header);
    _cleanup_free_ char *h_sha = xasprintf("x-amz-content-sha256:%s", rq->payload_sha256);
    _cleanup_free_ char *h_date = xasprintf("x-amz-date:%s", amz_date);
    _cleanup_free_ char *h_tok = s->token ? xasprintf("x-amz-security-token:%s", s->token) : NULL;
    const char *signed_headers[] = {h_host, h_sha, h_date, h_tok, NULL};
    struct sigv4_request sr = {
        .method = rq->method,
        .path = canon_path,
        .query = rq->query,
        .headers = signed_headers,
        .payload_sha256 = rq->payload_sha256,
        .amz_date = amz_date,
        .region = s->region,
        .service = "s3",
        .access_key = s->access_key,
        .secret_key = s->secret_key,
    };
    _cleanup_free_ char *auth = sigv4_authorization(&sr);
    _cleanup_free_ char *a_host = xasprintf("Host: %s", s->host_header);
    _cleanup_free_ char *a_sha = xasprintf("x-amz-content-sha256: %s", rq->payload_sha256);
    _cleanup_free_ char *a_date = xasprintf("x-amz-date: %s", amz_date);
    _cleanup_free_ char *a_auth = xasprintf("Authorization: %s", auth);
    struct curl_slist *l = NULL;
    l = curl_slist_append(l, a_host);
    l = curl_slist_append(l, a_sha);
    l = curl_slist_append(l, a_date);
    l = curl_slist_append(l, a_auth);
    l = curl_slist_append(l, "Expect:"); /* no 100-continue round trip */
    if (rq->condition)
        l = curl_slist_append(l, rq->condition);
    if (s->token) {
        _cleanup_free_ char *a_tok = xasprintf("x-amz-security-token: %s", s->token);
        l = curl_slist_append(l, a_tok);
    }
    explicit_bzero(a_auth, strlen(a_auth));
    return l;
}

static _Thread_local uint64_t thread_deadline_ms;

void store_thread_deadline(uint64_t deadline_ms)
{
    thread_deadline_ms = deadline_ms;
}

static void setup_transfer(struct s3 *s, CURL *h, struct s3_req *rq, char *errbuf)
{
    long secs = (long)MAX(1, s->timeout_ms / 1000);
    if (thread_deadline_ms) {
        uint64_t now = now_ms();
        long left = thread_deadline_ms > now ? (long)(thread_deadline_ms - now) : 1;
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, left);
    }
    curl_easy_setopt(h, CURLOPT_SHARE, s->share);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)s->timeout_ms);
    /* A transfer that stalls (less than 1 byte/s for the timeout) fails; a large one that
     * moves does not. */
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, secs);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, rq);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, rq);
    if (!strcmp(rq->method, "PUT")) {
        curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)rq->in_size);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
        curl_easy_setopt(h, CURLOPT_READDATA, rq);
        curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, on_seek);
        curl_easy_setopt(h, CURLOPT_SEEKDATA, rq);
    } else if (!strcmp(rq->method, "DELETE")) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "DELETE");
    } else if (!strcmp(rq->method, "HEAD")) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    }
}

/* One attempt; 0 with rq->status set, or -errno from curl. */
static int attempt(struct s3 *s, struct s3_req *rq)
{
    _cleanup_free_ char *fk = rq->key ? full_key(s, rq->key) : NULL;
    _cleanup_free_ char *ekey = fk ? sigv4_uri_encode(fk, true) : xstrdup("");
    _cleanup_free_ char *canon =
        s->virtual_hosted ? xasprintf("/%s", ekey) : xasprintf("/%s/%s", s->bucket, ekey);
    _cleanup_free_ char *url =
        xasprintf("%s%s%s%s", s->base_url, canon, *rq->query ? "?" : "", rq->query);
    char errbuf[CURL_ERROR_SIZE] = "";
    CURL *h = curl_easy_init();
    if (!h)
        return err_set(ENOMEM, "cannot start a transfer");
    rq->status = 0;
    rq->in_off = 0;
    rq->in_changed = false;
    if (rq->in_fd >= 0)
        on_seek(rq, 0, SEEK_SET);
    struct curl_slist *headers = sign_headers(s, rq, canon);
    setup_transfer(s, h, rq, errbuf);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    CURLcode c = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    if (status)
        rq->status = status;
    curl_easy_cleanup(h);
    curl_slist_free_all(headers);
    if (rq->in_hash) {
        sha256_finish(rq->in_hash, (char[SHA256_HEX_SIZE]){0});
        rq->in_hash = NULL;
    }
    if (c != CURLE_OK)
        return curl_error(s, rq, c, errbuf);
    return 0;
}

static bool transient(const struct s3_req *rq, int r)
{
    if (rq->out_size || (rq->body && rq->body->len))
        return false; /* part of the answer is out already */
    if (r == -EIO && !rq->in_changed && !rq->out_too_big && !rq->out_err)
        return true; /* a dropped connection */
    return !r && (rq->status == 500 || rq->status == 503);
}

static int perform(struct s3 *s, struct s3_req *rq)
{
    int r = 0;
    for (int i = 0; i < ATTEMPTS; i++) {
        if (thread_deadline_ms && now_ms() >= thread_deadline_ms) {
            r = err_set(ETIMEDOUT, "the store at %s did not answer %s %s before the deadline",
                        s->base_url, rq->method, rq->key ? rq->key : "");
            break;
        }
        buf_release(&rq->err_body);
        buf_init(&rq->err_body, ERROR_BODY_CAP);
        r = attempt(s, rq);
        if (!transient(rq, r))
            break;
        usleep(100000u << i);
    }
    if (!r && (rq->status < 200 || rq->status > 299))
        r = http_error(s, rq);
    buf_release(&rq->err_body);
    return r;
}

static struct s3_req req_init(const char *method, const char *key)
{
    return (struct s3_req){.method = method,
                           .key = key,
                           .query = "",
                           .in_fd = -1,
                           .out_fd = -1,
                           .payload_sha256 = EMPTY_SHA256};
}

static int s3_put(struct store *st, const char *key, int fd, uint64_t size, const char *sha)
{
    char computed[SHA256_HEX_SIZE];
    if (!sha) {
        int r = sha256_fd(fd, size, computed);
        if (r < 0)
            return err_set(-r, "cannot read the data to store as %s: %s", key, strerror(-r));
        sha = computed;
    }
    struct s3_req rq = req_init("PUT", key);
    rq.in_fd = fd;
    rq.in_size = size;
    rq.payload_sha256 = sha;
    return perform(st->impl, &rq);
}

static int s3_get(struct store *st, const char *key, int fd, uint64_t max, uint64_t *ret_size)
{
    struct s3_req rq = req_init("GET", key);
    rq.out_fd = fd;
    rq.out_max = max;
    int r = perform(st->impl, &rq);
    *ret_size = rq.out_size;
    return r;
}

static int s3_del(struct store *st, const char *key)
{
    struct s3_req rq = req_init("DELETE", key);
    int r = perform(st->impl, &rq);
    return r == -ENOENT ? 0 : r;
}

int s3_parse_list_page(const char *prefix, const char *xml, const char *sent_token,
                       struct store_listing *l, size_t *alloc, char **ret_token)
{
    size_t skip = *prefix ? strlen(prefix) + 1 : 0;
    const char *pos = xml;
    _cleanup_free_ char *truncated = s3_xml_field(xml, "IsTruncated", NULL);
    for (;;) {
        _cleanup_free_ char *contents = s3_xml_field(xml, "Contents", &pos);
        if (!contents)
            break;
        _cleanup_free_ char *key = s3_xml_field(contents, "Key", NULL);
        _cleanup_free_ char *size = s3_xml_field(contents, "Size", NULL);
        if (!key || strlen(key) < skip)
            continue;
        int r = store_listing_add(l, alloc, key + skip, size ? strtoull(size, NULL, 10) : 0);
        if (r < 0)
            return r;
    }
    *ret_token = NULL;
    if (!truncated || strcmp(truncated, "true"))
        return 0;
    /* Asked again with the same token, a server would answer the same page forever; without
     * one, the listing would end short without a word. */
    char *next = s3_xml_field(xml, "NextContinuationToken", NULL);
    bool none = !next || !*next;
    if (none || (sent_token && !strcmp(next, sent_token))) {
        free(next);
        return err_set(EIO, "the S3 server's listing does not advance: a truncated page %s",
                       none ? "named no continuation token" : "named the token it was asked with");
    }
    *ret_token = next;
    return 0;
}

static int s3_list(struct store *st, const char *prefix, struct store_listing *ret)
{
    struct s3 *s = st->impl;
    _cleanup_free_ char *fp = full_key(s, prefix);
    _cleanup_free_ char *efp = sigv4_uri_encode(fp, false);
    char *token = NULL;
    size_t alloc = 0;
    int r = 0;
    do {
        _cleanup_free_ char *etok = token ? sigv4_uri_encode(token, false) : NULL;
        /* Parameters in byte order of their names: that is the canonical query. */
        _cleanup_free_ char *query =
            etok ? xasprintf("continuation-token=%s&list-type=2&prefix=%s", etok, efp)
                 : xasprintf("list-type=2&prefix=%s", efp);
        struct buf body;
        buf_init(&body, LIST_PAGE_CAP);
        struct s3_req rq = req_init("GET", NULL);
        rq.query = query;
        rq.body = &body;
        _cleanup_free_ char *sent = TAKE_PTR(token);
        r = perform(s, &rq);
        if (!r)
            r = s3_parse_list_page(s->prefix, body.data ? body.data : "", sent, ret, &alloc,
                                   &token);
        buf_release(&body);
    } while (!r && token);
    free(token);
    return r;
}

/* The object in memory with its ETag (its version for a conditional write). */
static int s3_get_v(struct store *st, const char *key, size_t max, char **ret, size_t *ret_len,
                    char ret_version[STORE_VERSION_SIZE])
{
    struct buf body;
    struct s3_req rq;
    int r = -EIO;
    /* A record is small and read whole: a transfer cut short is read again (perform does
     * not retry once part of an answer is in). */
    for (int i = 0; i < ATTEMPTS && r == -EIO; i++) {
        buf_init(&body, max);
        rq = req_init("GET", key);
        rq.body = &body;
        r = perform(st->impl, &rq);
        if (r == -EIO && i + 1 < ATTEMPTS)
            buf_release(&body);
    }
    if (!r && !rq.etag[0])
        r = err_set(EIO, "the S3 server sent %s without an ETag: it cannot hold leases", key);
    if (r < 0) {
        buf_release(&body);
        return r;
    }
    buf_append(&body, "", 1);
    *ret = buf_detach(&body, ret_len);
    if (ret_len)
        (*ret_len)--;
    memcpy(ret_version, rq.etag, STORE_VERSION_SIZE);
    return 0;
}

/* PUT with If-None-Match: * (if_version NULL) or If-Match: ETAG: S3's conditional writes. */
static int s3_put_if(struct store *st, const char *key, int fd, uint64_t size, const char *sha,
                     const char *if_version, char ret_version[STORE_VERSION_SIZE])
{
    _cleanup_free_ char *cond =
        if_version ? xasprintf("If-Match: %s", if_version) : xstrdup("If-None-Match: *");
    struct s3_req rq = req_init("PUT", key);
    rq.in_fd = fd;
    rq.in_size = size;
    rq.payload_sha256 = sha;
    rq.condition = cond;
    int r = perform(st->impl, &rq);
    if (!r && !rq.etag[0])
        r = err_set(EIO, "the S3 server answered a write of %s without an ETag", key);
    if (!r)
        memcpy(ret_version, rq.etag, STORE_VERSION_SIZE);
    return r;
}

static void wipe_free(char *s)
{
    if (s)
        explicit_bzero(s, strlen(s));
    free(s);
}

static void s3_free(struct store *st)
{
    struct s3 *s = st->impl;
    if (s->share)
        curl_share_cleanup(s->share);
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_destroy(&s->share_lock[i]);
    free(s->base_url);
    free(s->host_header);
    free(s->bucket);
    free(s->prefix);
    free(s->region);
    wipe_free(s->access_key);
    wipe_free(s->secret_key);
    wipe_free(s->token);
    free(s);
}

static const struct store_ops s3_ops = {
    .put = s3_put,
    .get = s3_get,
    .del = s3_del,
    .list = s3_list,
    .get_v = s3_get_v,
    .put_if = s3_put_if,
    .free = s3_free,
};

static const char *first_env(const char *a, const char *b)
{
    const char *v = a ? getenv(a) : NULL;
    if (v && *v)
        return v;
    v = b ? getenv(b) : NULL;
    return v && *v ? v : NULL;
}

/* Fills base_url and host_header from the endpoint (or AWS's for the region). */
static int parse_endpoint(struct s3 *s, const char *endpoint)
{
    _cleanup_free_ char *ep =
        endpoint ? xstrdup(endpoint) : xasprintf("https://s3.%s.amazonaws.com", s->region);
    size_t n = strlen(ep);
    while (n && ep[n - 1] == '/')
        ep[--n] = '\0';
    const char *scheme_end = strstr(ep, "://");
    if (!scheme_end || (strncmp(ep, "http://", 7) && strncmp(ep, "https://", 8)))
        return err_set(EINVAL, "S3 endpoint '%s' must start with http:// or https://", ep);
    const char *host = scheme_end + 3;
    if (!*host || strchr(host, '/') || strchr(host, '?') || strchr(host, '@'))
        return err_set(EINVAL, "S3 endpoint '%s' must be scheme://HOST[:PORT], without a path", ep);
    _cleanup_free_ char *scheme = xstrndup(ep, (size_t)(scheme_end - ep));
    s->host_header = s->virtual_hosted ? xasprintf("%s.%s", s->bucket, host) : xstrdup(host);
    s->base_url = xasprintf("%s://%s", scheme, s->host_header);
    return 0;
}

int store_s3_open(const struct store_config *cfg, const char *bucket, const char *prefix,
                  struct store **ret)
{
    const char *region =
        cfg->s3_region ? cfg->s3_region : first_env("AWS_REGION", "AWS_DEFAULT_REGION");
    const char *ak = cfg->s3_access_key ? cfg->s3_access_key : first_env("AWS_ACCESS_KEY_ID", NULL);
    const char *sk =
        cfg->s3_secret_key ? cfg->s3_secret_key : first_env("AWS_SECRET_ACCESS_KEY", NULL);
    const char *tok =
        cfg->s3_session_token ? cfg->s3_session_token : first_env("AWS_SESSION_TOKEN", NULL);
    if (!ak || !sk)
        return err_set(EINVAL,
                       "s3://%s: no credentials: pass --s3-access-key and "
                       "--s3-secret-key or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
                       bucket);
    pthread_once(&curl_once, curl_init_once);
    struct s3 *s = xcalloc(1, sizeof(*s));
    s->bucket = xstrdup(bucket);
    s->prefix = xstrdup(prefix);
    s->region = xstrdup(region ? region : "us-east-1");
    s->access_key = xstrdup(ak);
    s->secret_key = xstrdup(sk);
    s->token = tok ? xstrdup(tok) : NULL;
    s->virtual_hosted = cfg->s3_virtual_hosted;
    s->timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : DEFAULT_TIMEOUT_MS;
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_init(&s->share_lock[i], NULL);
    struct store *st = xcalloc(1, sizeof(*st));
    st->ops = &s3_ops;
    st->impl = s;
    int r = parse_endpoint(s, cfg->s3_endpoint);
    if (r < 0) {
        store_free(st);
        return r;
    }
    s->share = curl_share_init();
    curl_share_setopt(s->share, CURLSHOPT_LOCKFUNC, share_lock);
    curl_share_setopt(s->share, CURLSHOPT_UNLOCKFUNC, share_unlock);
    curl_share_setopt(s->share, CURLSHOPT_USERDATA, s);
    curl_share_setopt(s->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT);
    curl_share_setopt(s->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    st->describe = xasprintf("s3://%s%s%s at %s", bucket, *prefix ? "/" : "", prefix, s->base_url);
    *ret = st;
    return 0;
}
