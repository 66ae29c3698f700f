/* test-store.c - unit tests for src/store: keys, the local backend, SigV4 against the
 * examples AWS publishes, and the session records. The S3 backend against a real server is
 * tested in tests/integration/test_persist.py. */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runner.h"
#include "store/store-int.h"

static char *scratch_dir(void)
{
    char tmpl[] = "/tmp/runcell-unit-store-XXXXXX";
    CHECK(mkdtemp(tmpl) != NULL);
    return xstrdup(tmpl);
}

static struct store *local_store(char **ret_dir)
{
    char *dir = scratch_dir();
    struct store *st;
    struct store_config cfg = {.url = dir};
    CHECK(store_open(&cfg, &st) == 0);
    *ret_dir = dir;
    return st;
}

TEST(keys_are_checked)
{
    CHECK(store_key_valid("sessions/abc/blobs/0123"));
    CHECK(store_key_valid("a-b_c.d"));
    CHECK(!store_key_valid(""));
    CHECK(!store_key_valid("/abs"));
    CHECK(!store_key_valid("a/../b"));
    CHECK(!store_key_valid("a//b"));
    CHECK(!store_key_valid(".hidden"));
    CHECK(!store_key_valid("a/.tmp"));
    CHECK(!store_key_valid("sp ace"));
    CHECK(!store_key_valid("a/b/"));
}

TEST(urls_are_checked)
{
    struct store *st;
    struct store_config cfg = {.url = "ftp://x"};
    CHECK(store_open(&cfg, &st) == -EINVAL);
    CHECK(strstr(err_msg(), "unknown scheme"));
    cfg.url = "s3://";
    CHECK(store_open(&cfg, &st) == -EINVAL);
    CHECK(strstr(err_msg(), "no bucket"));
    cfg.url = "s3://bucket/pre fix";
    CHECK(store_open(&cfg, &st) == -EINVAL);
    cfg = (struct store_config){.url = "s3://b/p",
                                .s3_access_key = "a",
                                .s3_secret_key = "s",
                                .s3_endpoint = "localhost:9000"};
    CHECK(store_open(&cfg, &st) == -EINVAL);
    CHECK(strstr(err_msg(), "http://"));
    cfg.s3_endpoint = "http://localhost:9000/path";
    CHECK(store_open(&cfg, &st) == -EINVAL);
    cfg.s3_endpoint = "http://127.0.0.1:9/";
    CHECK(store_open(&cfg, &st) == 0);
    CHECK_STREQ(store_describe(st), "s3://b/p at http://127.0.0.1:9");
    store_free(st);
}

TEST(local_put_get_list_delete)
{
    char *dir;
    struct store *st = local_store(&dir);
    char *data;
    size_t n;
    CHECK(store_put_buf(st, "sessions/s1/blobs/x", "hello", 5) == 0);
    CHECK(store_put_buf(st, "sessions/s1/manifest.json", "{}", 2) == 0);
    CHECK(store_put_buf(st, "sessions/s2/manifest.json", "{}", 2) == 0);
    CHECK(store_get_buf(st, "sessions/s1/blobs/x", 100, &data, &n) == 0);
    CHECK(n == 5 && !strcmp(data, "hello"));
    free(data);
    CHECK(store_get_buf(st, "sessions/s1/blobs/x", 3, &data, &n) == -EFBIG);
    CHECK(store_get_buf(st, "sessions/s1/blobs/none", 100, &data, &n) == -ENOENT);
    CHECK(strstr(err_msg(), "sessions/s1/blobs/none"));

    struct store_listing l;
    CHECK(store_list(st, "sessions/s1/", &l) == 0);
    CHECK(l.n == 2);
    CHECK_STREQ(l.v[0].key, "sessions/s1/blobs/x");
    CHECK(l.v[0].size == 5);
    CHECK_STREQ(l.v[1].key, "sessions/s1/manifest.json");
    store_listing_release(&l);
    CHECK(store_list(st, "sessions/s", &l) == 0 && l.n == 3);
    store_listing_release(&l);
    CHECK(store_list(st, "nothing/here/", &l) == 0 && l.n == 0);
    store_listing_release(&l);

    CHECK(store_delete(st, "sessions/s1/blobs/x") == 0);
    CHECK(store_delete(st, "sessions/s1/blobs/x") == 0); /* absent is fine */
    struct stat sb;
    _cleanup_free_ char *blobs = xasprintf("%s/sessions/s1/blobs", dir);
    CHECK(stat(blobs, &sb) < 0 && errno == ENOENT); /* the empty directory went too */
    CHECK(store_put_buf(st, "../escape", "x", 1) == -EINVAL);
    store_free(st);
    rm_rf(dir);
    free(dir);
}

/* Compare-and-swap in a directory: of two writers at one version, one wins. */
TEST(local_conditional_writes)
{
    char *dir;
    struct store *st = local_store(&dir);
    char v1[STORE_VERSION_SIZE], v2[STORE_VERSION_SIZE], v[STORE_VERSION_SIZE], *data;
    size_t n;
    CHECK(store_get_versioned(st, "sessions/a-1/lease.json", 100, &data, &n, v) == -ENOENT);
    CHECK(store_put_if(st, "sessions/a-1/lease.json", "one", 3, NULL, v1) == 0);
    /* absent only: a second create fails, unless it is the very same bytes (a retry) */
    CHECK(store_put_if(st, "sessions/a-1/lease.json", "two", 3, NULL, v) == -ESTALE);
    CHECK(store_put_if(st, "sessions/a-1/lease.json", "one", 3, NULL, v) == 0);
    CHECK_STREQ(v, v1);
    CHECK(store_get_versioned(st, "sessions/a-1/lease.json", 100, &data, &n, v) == 0);
    CHECK(n == 3 && !strcmp(data, "one") && !strcmp(v, v1));
    free(data);
    CHECK(store_put_if(st, "sessions/a-1/lease.json", "two", 3, v1, v2) == 0);
    CHECK(strcmp(v1, v2));
    /* a writer still at the old version loses */
    CHECK(store_put_if(st, "sessions/a-1/lease.json", "three", 5, v1, v) == -ESTALE);
    CHECK(strstr(err_msg(), "another writer"));
    CHECK(store_put_if(st, "sessions/a-2/lease.json", "x", 1, v2, v) == -ESTALE); /* absent */
    CHECK(store_check_conditional(st, "node-a") == 0);
    store_free(st);
    rm_rf(dir);
    free(dir);
}

/* The names in dir (dot names too), sorted, joined by spaces. */
static char *names_in(const char *dir)
{
    struct buf b;
    buf_init(&b, 0);
    struct dirent **v;
    int n = scandir(dir, &v, NULL, alphasort);
    CHECK(n >= 0);
    for (int i = 0; i < n; i++) {
        if (strcmp(v[i]->d_name, ".") && strcmp(v[i]->d_name, ".."))
            buf_printf(&b, "%s%s", b.len ? " " : "", v[i]->d_name);
        free(v[i]);
    }
    free(v);
    return buf_detach(&b, NULL);
}

/* An object written again takes the place of the old one (exchanged, then the old one
 * removed) and leaves no temporary; a key where a directory is fails as a rename would, and
 * moves nothing. */
TEST(local_put_replaces_and_leaves_no_temporary)
{
    char *dir, *data;
    size_t n;
    struct store *st = local_store(&dir);
    _cleanup_free_ char *sdir = xasprintf("%s/sessions/s1", dir);
    CHECK(store_put_buf(st, "sessions/s1/manifest.json", "first", 5) == 0); /* dirs made */
    for (int i = 0; i < 3; i++) {
        _cleanup_free_ char *text = xasprintf("version %d", i);
        CHECK(store_put_buf(st, "sessions/s1/manifest.json", text, strlen(text)) == 0);
        CHECK(store_get_buf(st, "sessions/s1/manifest.json", 100, &data, &n) == 0);
        CHECK_STREQ(data, text);
        free(data);
    }
    int fd = memfd_create("t", MFD_CLOEXEC);
    char sha[SHA256_HEX_SIZE];
    CHECK(write_all(fd, "from an fd", 10) == 0 && sha256_fd(fd, 10, sha) == 0);
    CHECK(store_put_fd(st, "sessions/s1/manifest.json", fd, 10, sha) == 0);
    close(fd);
    CHECK(store_get_buf(st, "sessions/s1/manifest.json", 100, &data, &n) == 0);
    CHECK(n == 10 && !strcmp(data, "from an fd"));
    free(data);
    _cleanup_free_ char *names = names_in(sdir);
    CHECK_STREQ(names, "manifest.json");

    CHECK(store_put_buf(st, "sessions/s1/blobs/b", "x", 1) == 0);
    CHECK(store_put_buf(st, "sessions/s1", "over a directory", 16) == -EISDIR);
    CHECK(strstr(err_msg(), "sessions/s1"));
    _cleanup_free_ char *after = names_in(sdir);
    CHECK_STREQ(after, "blobs manifest.json");
    _cleanup_free_ char *top = names_in(dir);
    CHECK_STREQ(top, "sessions");
    _cleanup_free_ char *under = xasprintf("%s/sessions", dir);
    _cleanup_free_ char *in_sessions = names_in(under);
    CHECK_STREQ(in_sessions, "s1");
    store_free(st);
    rm_rf(dir);
    free(dir);
}

TEST(put_checks_the_hash_and_leaves_nothing_half_written)
{
    char *dir;
    struct store *st = local_store(&dir);
    int fd = memfd_create("t", MFD_CLOEXEC);
    char sha[SHA256_HEX_SIZE];
    CHECK(write_all(fd, "0123456789", 10) == 0);
    CHECK(sha256_fd(fd, 10, sha) == 0);
    CHECK(store_put_fd(st, "k", fd, 10, sha) == 0);
    sha256_hex("other", 5, sha);
    CHECK(store_put_fd(st, "k2", fd, 10, sha) == -EAGAIN);
    CHECK(strstr(err_msg(), "changed"));
    CHECK(store_put_fd(st, "k3", fd, 20, NULL) == -EAGAIN); /* shorter than announced */
    struct store_listing l;
    CHECK(store_list(st, "", &l) == 0);
    CHECK(l.n == 1 && !strcmp(l.v[0].key, "k"));
    store_listing_release(&l);
    close(fd);
    store_free(st);
    rm_rf(dir);
    free(dir);
}

TEST(blobs_are_stored_under_their_hash_and_checked_when_read)
{
    char *dir;
    struct store *st = local_store(&dir);
    int in = memfd_create("in", MFD_CLOEXEC);
    char sha[SHA256_HEX_SIZE], want[SHA256_HEX_SIZE];
    CHECK(write_all(in, "0123456789", 10) == 0);
    CHECK(store_put_fd_hashed(st, "b/", in, 10, sha) == 0);
    sha256_hex("0123456789", 10, want);
    CHECK_STREQ(sha, want);
    _cleanup_free_ char *key = xasprintf("b/%s", sha);
    /* Read back twice: once as written (copied without hashing again), once after the file
     * changed in place (its times differ: hashed, and refused). */
    for (int pass = 0; pass < 2; pass++) {
        int out = memfd_create("out", MFD_CLOEXEC);
        uint64_t n = 0;
        char back[16] = {0};
        CHECK(store_get_verified(st, key, out, 11, sha, &n) == 0);
        CHECK(n == 10 && pread(out, back, sizeof(back), 0) == 10 &&
              !memcmp(back, "0123456789", 10));
        close(out);
    }
    _cleanup_free_ char *path = xasprintf("%s/%s", dir, key);
    usleep(10000); /* a time the file system shows apart */
    int f = open(path, O_WRONLY);
    CHECK(f >= 0 && pwrite(f, "X", 1, 0) == 1);
    close(f);
    int out = memfd_create("out", MFD_CLOEXEC);
    uint64_t n = 0;
    CHECK(store_get_verified(st, key, out, 11, sha, &n) == -EBADMSG);
    CHECK(strstr(err_msg(), "does not hash"));
    close(out);
    close(in);
    store_free(st);
    rm_rf(dir);
    free(dir);
}

TEST(streams_large_objects)
{
    char *dir;
    struct store *st = local_store(&dir);
    int in = memfd_create("in", MFD_CLOEXEC), out = memfd_create("out", MFD_CLOEXEC);
    char chunk[4096], sha_in[SHA256_HEX_SIZE], sha_out[SHA256_HEX_SIZE];
    for (size_t i = 0; i < sizeof(chunk); i++)
        chunk[i] = (char)(i * 7);
    for (int i = 0; i < 1024; i++) /* 4 MiB */
        CHECK(write_all(in, chunk, sizeof(chunk)) == 0);
    CHECK(sha256_fd(in, 4u << 20, sha_in) == 0);
    CHECK(store_put_fd(st, "big", in, 4u << 20, sha_in) == 0);
    uint64_t size;
    CHECK(store_get_fd(st, "big", out, 0, &size) == 0);
    CHECK(size == 4u << 20);
    CHECK(sha256_fd(out, size, sha_out) == 0);
    CHECK_STREQ(sha_in, sha_out);
    close(in);
    close(out);
    store_free(st);
    rm_rf(dir);
    free(dir);
}

TEST(sha256_known_values)
{
    char out[SHA256_HEX_SIZE];
    sha256_hex("", 0, out);
    CHECK_STREQ(out, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    sha256_hex("abc", 3, out);
    CHECK_STREQ(out, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

/* The examples of AWS's "Signature Calculations for the Authorization Header" for S3. */
TEST(s3_list_pages_parse)
{
    const char *page =
        "<ListBucketResult><IsTruncated>true</IsTruncated><NextContinuationToken>t&amp;1"
        "</NextContinuationToken><Contents><Key>p/a&lt;&#x41;&#66;&#12</Key><Size>7</Size>"
        "</Contents><Contents><Key>q</Key></Contents><Contents><Key>p/b</Key></Contents>"
        "</ListBucketResult>";
    struct store_listing l = {0};
    size_t alloc = 0;
    char *token = NULL;
    CHECK(s3_parse_list_page("p", page, NULL, &l, &alloc, &token) == 0);
    CHECK(l.n == 2);
    CHECK_STREQ(l.v[0].key, "a<AB&#12");
    CHECK(l.v[0].size == 7);
    CHECK_STREQ(l.v[1].key, "b");
    CHECK_STREQ(token, "t&1");
    free(token);
    store_listing_release(&l);
}

/* A truncated page that names no new token would make the listing loop on it forever, or
 * end it short without a word. */
TEST(s3_list_pages_that_do_not_advance_are_errors)
{
    struct store_listing l = {0};
    size_t alloc = 0;
    char *token = NULL;
    const char *same = "<IsTruncated>true</IsTruncated><NextContinuationToken>t1"
                       "</NextContinuationToken>";
    CHECK(s3_parse_list_page("", same, "t1", &l, &alloc, &token) == -EIO);
    CHECK(strstr(err_msg(), "asked with") != NULL);
    CHECK(token == NULL);
    CHECK(s3_parse_list_page("", same, "t0", &l, &alloc, &token) == 0);
    CHECK_STREQ(token, "t1");
    free(token);
    token = NULL;
    CHECK(s3_parse_list_page("", "<IsTruncated>true</IsTruncated>", NULL, &l, &alloc, &token) ==
          -EIO);
    CHECK(strstr(err_msg(), "no continuation token") != NULL);
    CHECK(s3_parse_list_page("",
                             "<IsTruncated>true</IsTruncated><NextContinuationToken>"
                             "</NextContinuationToken>",
                             "t0", &l, &alloc, &token) == -EIO);
    CHECK(s3_parse_list_page("", "<IsTruncated>false</IsTruncated>", "t0", &l, &alloc, &token) ==
          0);
    CHECK(token == NULL && l.n == 0);
    store_listing_release(&l);
}

/* Found by tests/fuzz/fuzz-s3.c: each "&#" without its ';' searched the rest of the body,
 * so a list page of them (up to 16 MiB) kept a thread busy for hours. */
TEST(s3_character_references_cost_linear_time)
{
    size_t n = 16u << 20;
    char *body = xmalloc(n + 1);
    memcpy(body, "<Code>", 6);
    for (size_t i = 6; i + 7 < n; i += 2)
        memcpy(body + i, "&#", 2);
    memcpy(body + n - 7, "</Code>", 8);
    char *code = s3_xml_field(body, "Code", NULL);
    CHECK(code != NULL);
    CHECK(strlen(code) == n - 13);
    free(code);
    free(body);
}

static const char AK[] = "AKIAIOSFODNN7EXAMPLE";
static const char SK[] = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
static const char EMPTY[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/* Signs a GET of the examples (their date, region and keys) with an empty payload. */
static char *sign_example(const char *path, const char *query, const char *const *headers)
{
    struct sigv4_request rq = {.method = "GET",
                               .path = path,
                               .query = query,
                               .headers = headers,
                               .payload_sha256 = EMPTY,
                               .amz_date = "20130524T000000Z",
                               .region = "us-east-1",
                               .service = "s3",
                               .access_key = AK,
                               .secret_key = SK};
    return sigv4_authorization(&rq);
}

#define EXAMPLE_HOST "host:examplebucket.s3.amazonaws.com"
#define EXAMPLE_SHA                                                                                \
    "x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#define EXAMPLE_DATE "x-amz-date:20130524T000000Z"

TEST(sigv4_get_object_example)
{
    const char *headers[] = {EXAMPLE_HOST, "range:bytes=0-9", EXAMPLE_SHA, EXAMPLE_DATE, NULL};
    _cleanup_free_ char *auth = sign_example("/test.txt", "", headers);
    CHECK_STREQ(auth, "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/"
                      "aws4_request, SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
                      "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

TEST(sigv4_list_objects_example)
{
    const char *headers[] = {EXAMPLE_HOST, EXAMPLE_SHA, EXAMPLE_DATE, NULL};
    _cleanup_free_ char *auth = sign_example("/", "max-keys=2&prefix=J", headers);
    CHECK(
        strstr(auth, "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"));
}

TEST(sigv4_uri_encoding)
{
    _cleanup_free_ char *a = sigv4_uri_encode("a b/c~d-e_f.g+h", true);
    CHECK_STREQ(a, "a%20b/c~d-e_f.g%2Bh");
    _cleanup_free_ char *b = sigv4_uri_encode("x/y=z", false);
    CHECK_STREQ(b, "x%2Fy%3Dz");
    char date[17];
    sigv4_amz_date(1369353600, date);
    CHECK_STREQ(date, "20130524T000000Z");
}

static bool never_alive(const char *owner)
{
    (void)owner;
    return false;
}

static bool always_alive(const char *owner)
{
    (void)owner;
    return true;
}

struct count {
    int n;
    char first[64];
};

static void count_fn(void *ctx, const struct meta_session *s)
{
    struct count *c = ctx;
    if (!c->n++)
        snprintf(c->first, sizeof(c->first), "%s", s->id);
}

TEST(meta_records_sessions)
{
    char *dir = scratch_dir();
    _cleanup_free_ char *path = xasprintf("%s/sessions.db", dir);
    struct meta_db *m;
    CHECK(meta_open(path, &m) == 0);
    char id_a[] = "aaa", id_b[] = "bbb", owner[] = "1-1", opts[] = "{\"language\":\"python\"}";
    struct meta_session s = {.id = id_a,
                             .owner = owner,
                             .options = opts,
                             .created_ms = 1000,
                             .last_used_ms = 1000,
                             .state = META_LIVE,
                             .persist = true};
    CHECK(meta_put(m, &s) == 0);
    s.id = id_b;
    s.created_ms = 2000;
    CHECK(meta_put(m, &s) == 0);
    CHECK(meta_touch(m, "aaa", 5000, 3) == 0);
    CHECK(meta_set_state(m, "bbb", META_EXPIRED, true, "{\"saved\":[\"x\"]}") == 0);
    CHECK(meta_set_state(m, "bbb", META_EXPIRED, true, NULL) == 0); /* keeps the checkpoint */
    struct meta_session got;
    CHECK(meta_get(m, "aaa", &got) == 0);
    CHECK(got.last_used_ms == 5000 && got.execution_count == 3 && got.state == META_LIVE);
    CHECK_STREQ(got.options, "{\"language\":\"python\"}");
    meta_session_release(&got);
    CHECK(meta_get(m, "bbb", &got) == 0);
    CHECK(got.state == META_EXPIRED && got.has_variables && got.persist);
    CHECK_STREQ(got.checkpoint, "{\"saved\":[\"x\"]}");
    meta_session_release(&got);
    CHECK(meta_get(m, "zzz", &got) == -ENOENT);
    struct count c = {0};
    CHECK(meta_foreach(m, 0, count_fn, &c) == 0);
    CHECK(c.n == 2 && !strcmp(c.first, "bbb")); /* newest first */
    meta_close(m);

    /* A restart: the live session's owner is still there, then it is gone. */
    CHECK(meta_open(path, &m) == 0);
    CHECK(meta_recover(m, always_alive) == 0);
    CHECK(meta_get(m, "aaa", &got) == 0 && got.state == META_LIVE);
    meta_session_release(&got);
    CHECK(meta_recover(m, never_alive) == 0);
    CHECK(meta_get(m, "aaa", &got) == 0 && got.state == META_STOPPED);
    meta_session_release(&got);
    CHECK(meta_get(m, "bbb", &got) == 0 && got.state == META_EXPIRED);
    meta_session_release(&got);
    meta_close(m);
    rm_rf(dir);
    free(dir);
}

static long count_seen(struct meta_db *reader, const char *id)
{
    struct meta_session got;
    if (meta_get(reader, id, &got) < 0)
        return -1;
    long n = got.execution_count;
    meta_session_release(&got);
    return n;
}

/* Waits, at most 10 s (a hang), for another handle on the file to see count. */
static bool seen_within(struct meta_db *reader, const char *id, long count)
{
    for (int i = 0; i < 1000; i++) {
        if (count_seen(reader, id) == count)
            return true;
        usleep(10000);
    }
    return false;
}

TEST(meta_touches_kept_back_are_written_within_a_second_and_before_any_other_call)
{
    char *dir = scratch_dir();
    _cleanup_free_ char *path = xasprintf("%s/sessions.db", dir);
    struct meta_db *m, *other; /* other: as another process would read the file */
    CHECK(meta_open(path, &m) == 0);
    CHECK(meta_open(path, &other) == 0);
    char id[] = "aaa", opts[] = "{}";
    struct meta_session s = {
        .id = id, .options = opts, .created_ms = 1, .last_used_ms = 1, .state = META_LIVE};
    CHECK(meta_put(m, &s) == 0);
    /* A burst: the first is written at once, the rest by m's thread, with no call on m. */
    CHECK(meta_touch(m, id, 100, 1) == 0);
    CHECK(count_seen(other, id) == 1);
    for (long i = 2; i <= 50; i++)
        CHECK(meta_touch(m, id, 100 + (uint64_t)i, i) == 0);
    CHECK(seen_within(other, id, 50));
    /* Kept back touches come before a read and a write of m's own. */
    CHECK(meta_touch(m, id, 200, 51) == 0);
    CHECK(count_seen(m, id) == 51);
    CHECK(meta_touch(m, id, 201, 52) == 0);
    CHECK(meta_set_state(m, id, META_CLOSED, false, NULL) == 0);
    struct meta_session got;
    CHECK(meta_get(other, id, &got) == 0);
    CHECK(got.execution_count == 52 && got.last_used_ms == 201 && got.state == META_CLOSED);
    meta_session_release(&got);
    /* and a close writes what is owed. */
    CHECK(meta_touch(m, id, 202, 53) == 0);
    meta_close(m);
    CHECK(count_seen(other, id) == 53);
    meta_close(other);
    rm_rf(dir);
    free(dir);
}

TEST(meta_reports_an_unusable_file)
{
    char *dir = scratch_dir();
    _cleanup_free_ char *path = xasprintf("%s/sessions.db", dir);
    struct meta_db *m;
    CHECK(write_file(path, "this is not a database, not at all; sqlite will say so", 55, 0600) ==
          0);
    CHECK(meta_open(path, &m) == -EIO);
    CHECK(strstr(err_msg(), path));
    rm_rf(dir);
    free(dir);
}

/* ---- sealed values ---- */

TEST(sealed_values_open_with_their_key_and_record_only)
{
    unsigned char key[SEAL_KEY_SIZE], other[SEAL_KEY_SIZE];
    memset(key, 7, sizeof(key));
    memset(other, 8, sizeof(other));
    const char *plain = "[{\"value\": \"TOPSECRET\"}]";
    char *sealed = store_seal(key, "s-1", plain, strlen(plain));
    CHECK(sealed && !strncmp(sealed, "v1.", 3) && !strstr(sealed, "TOPSECRET"));
    char *again = store_seal(key, "s-1", plain, strlen(plain));
    CHECK(strcmp(sealed, again) != 0); /* a nonce of its own each time */
    size_t n = 0;
    unsigned char *opened = store_unseal(key, "s-1", sealed, &n);
    CHECK(opened && n == strlen(plain) && !strcmp((char *)opened, plain));
    free(opened);
    CHECK(store_unseal(key, "s-2", sealed, &n) == NULL &&
          strstr(err_msg(), "does not open with this key"));
    CHECK(store_unseal(other, "s-1", sealed, &n) == NULL &&
          strstr(err_msg(), "does not open with this key"));
    sealed[10] = sealed[10] == 'A' ? 'B' : 'A'; /* changed on the way */
    CHECK(store_unseal(key, "s-1", sealed, &n) == NULL &&
          strstr(err_msg(), "does not open with this key"));
    CHECK(store_unseal(key, "s-1", "v1.@@@", &n) == NULL &&
          strstr(err_msg(), "not a sealed value"));
    CHECK(store_unseal(key, "s-1", "plain", &n) == NULL && strstr(err_msg(), "not a sealed value"));
    CHECK(store_unseal(key, "s-1", "v1.AAAA", &n) == NULL &&
          strstr(err_msg(), "not a sealed value"));
    free(sealed);
    free(again);
}

TEST(seal_key_files)
{
    char *dir = scratch_dir();
    unsigned char key[SEAL_KEY_SIZE];
    char *path = xasprintf("%s/key", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    const char *hex = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n";
    CHECK(write(fd, hex, strlen(hex)) == (ssize_t)strlen(hex));
    close(fd);
    CHECK(store_seal_key_load(path, key) == 0 && key[0] == 0 && key[31] == 0x1f);
    chmod(path, 0640);
    CHECK(store_seal_key_load(path, key) == -EPERM && strstr(err_msg(), "chmod 600"));
    chmod(path, 0600);
    fd = open(path, O_WRONLY | O_TRUNC);
    CHECK(write(fd, "short", 5) == 5);
    close(fd);
    CHECK(store_seal_key_load(path, key) == -EINVAL && strstr(err_msg(), "openssl rand"));
    fd = open(path, O_WRONLY | O_TRUNC);
    memset(key, 0x5a, sizeof(key));
    CHECK(write(fd, key, sizeof(key)) == (ssize_t)sizeof(key)); /* 32 raw bytes */
    close(fd);
    memset(key, 0, sizeof(key));
    CHECK(store_seal_key_load(path, key) == 0 && key[0] == 0x5a && key[31] == 0x5a);
    CHECK(store_seal_key_load("/nonexistent/key", key) == -ENOENT);
    unlink(path);
    rmdir(dir);
    free(path);
    free(dir);
}

int main(int argc, char **argv)
{
    return run_tests(argc, argv);
}
