/* test-persist.c - unit tests for the manifest of src/session (manifest.c): saving a
 * workspace into a local store and restoring it, without sandboxes. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runner.h"
#include "sandbox/workspace-int.h" /* a workspace of a plain directory, made here */
#include "session/session-int.h"

struct fixture {
    char *dir;
    struct store *store;
    struct persist_config c;
    struct workspace *ws;
};

static struct workspace *scratch_ws(const char *base, const char *name)
{
    struct workspace *ws = xcalloc(1, sizeof(*ws));
    ws->base = xasprintf("%s/%s", base, name);
    ws->dir = xasprintf("%s/work", ws->base);
    ws->uid = ws->root_uid = geteuid();
    ws->gid = getegid();
    ws->uid_lock_fd = -1;
    CHECK(mkdir_p(ws->dir, 0700) == 0);
    return ws;
}

static void setup(struct fixture *f, uint64_t quota)
{
    char tmpl[] = "/tmp/runcell-unit-persist-XXXXXX";
    CHECK(mkdtemp(tmpl) != NULL);
    f->dir = xstrdup(tmpl);
    _cleanup_free_ char *root = xasprintf("%s/store", f->dir);
    struct store_config sc = {.url = root};
    CHECK(store_open(&sc, &f->store) == 0);
    f->c = (struct persist_config){.store = f->store, .quota_bytes = quota};
    f->ws = scratch_ws(f->dir, "a");
}

static void put(struct workspace *ws, const char *rel, const char *text)
{
    CHECK(workspace_mkparents(ws, rel) == 0);
    int fd = workspace_openat(ws, rel, O_WRONLY | O_CREAT | O_TRUNC, 0640);
    CHECK(fd >= 0);
    CHECK(write_all(fd, text, strlen(text)) == 0);
    close(fd);
}

/* Scans and saves; returns the save's result, *ret_error kept for the caller to check. */
static int save(struct fixture *f, struct manifest *m, char **ret_error)
{
    struct ws_listing l;
    CHECK(workspace_scan(f->ws, &l) == 0);
    int r = manifest_save(&f->c, "abc", m, f->ws, &l, NULL, ret_error);
    ws_listing_release(&l);
    return r;
}

static size_t count_objects(struct fixture *f, const char *prefix)
{
    struct store_listing l;
    CHECK(store_list(f->store, prefix, &l) == 0);
    size_t n = l.n;
    store_listing_release(&l);
    return n;
}

static void free_ws(struct workspace *ws)
{
    free(ws->dir);
    free(ws->base);
    free(ws);
}

static void teardown(struct fixture *f)
{
    store_free(f->store);
    rm_rf(f->dir);
    free(f->dir);
    free_ws(f->ws);
}

TEST(saves_changes_and_shares_equal_contents)
{
    struct fixture f;
    struct manifest m = {0};
    char *error;
    setup(&f, 0);
    put(f.ws, "a.txt", "same");
    put(f.ws, "dir/b.txt", "same");
    put(f.ws, "c.txt", "other");
    int dfd = workspace_open(f.ws);
    CHECK(dfd >= 0 && symlinkat("a.txt", dfd, "link") == 0);
    close(dfd);
    CHECK(save(&f, &m, &error) == 0 && !error);
    CHECK(m.n == 4);
    CHECK(count_objects(&f, "sessions/abc/blobs/") == 2); /* "same" once, "other" */

    struct stat before, after;
    _cleanup_free_ char *mpath = xasprintf("%s/store/sessions/abc/manifest.json", f.dir);
    CHECK(stat(mpath, &before) == 0);
    CHECK(save(&f, &m, &error) == 0 && !error);
    CHECK(stat(mpath, &after) == 0);
    CHECK(before.st_ino == after.st_ino); /* nothing changed: nothing written */

    put(f.ws, "c.txt", "changed");
    _cleanup_free_ char *gone = xasprintf("%s/a.txt", f.ws->dir);
    CHECK(unlink(gone) == 0);
    CHECK(save(&f, &m, &error) == 0 && !error);
    CHECK(m.n == 3);                                      /* dir/b.txt, c.txt, link */
    CHECK(count_objects(&f, "sessions/abc/blobs/") == 2); /* "other" went, "changed" came */

    struct manifest loaded;
    CHECK(manifest_load(f.store, "abc", &loaded) == 0);
    CHECK(loaded.n == 3);
    CHECK_STREQ(loaded.v[0].path, "c.txt");
    CHECK_STREQ(loaded.v[2].path, "link");
    CHECK_STREQ(loaded.v[2].target, "a.txt");
    CHECK((loaded.v[0].mode & 0777) == 0640);
    /* The list as written names what each file holds now: the changed one's new content,
     * and the kept one's, whose text the last save reused from the one before. */
    char sha[SHA256_HEX_SIZE];
    sha256_hex("changed", 7, sha);
    CHECK_STREQ(loaded.v[0].sha, sha);
    CHECK(loaded.v[0].size == 7);
    CHECK_STREQ(loaded.v[1].path, "dir/b.txt");
    sha256_hex("same", 4, sha);
    CHECK_STREQ(loaded.v[1].sha, sha);
    CHECK(loaded.v[1].mtime_ns == m.v[1].mtime_ns && loaded.v[1].size == 4);
    manifest_release(&loaded);

    /* From a list just loaded (no entry's text made yet), a change is saved as well. */
    CHECK(manifest_load(f.store, "abc", &loaded) == 0);
    put(f.ws, "dir/b.txt", "again");
    CHECK(save(&f, &loaded, &error) == 0 && !error);
    manifest_release(&loaded);
    CHECK(manifest_load(f.store, "abc", &loaded) == 0);
    sha256_hex("again", 5, sha);
    CHECK(loaded.n == 3 && !strcmp(loaded.v[1].path, "dir/b.txt"));
    CHECK_STREQ(loaded.v[1].sha, sha);
    manifest_release(&loaded);
    manifest_release(&m);
    teardown(&f);
}

TEST(quota_keeps_what_fits_and_names_what_does_not)
{
    struct fixture f;
    struct manifest m = {0};
    char *error = NULL;
    setup(&f, 10);
    put(f.ws, "small", "12345");
    put(f.ws, "large", "0123456789abcdef");
    CHECK(save(&f, &m, &error) == -EDQUOT);
    CHECK(error && strstr(error, "large") && strstr(error, "quota"));
    CHECK(!strstr(error, "small:"));
    CHECK(m.n == 1 && !strcmp(m.v[0].path, "small"));
    free(error);
    manifest_release(&m);
    teardown(&f);
}

TEST(quota_counts_kept_files_whatever_their_names)
{
    /* A new file whose name sorts before the stored ones must not slip in under the quota
     * before they are counted. */
    struct fixture f;
    struct manifest m = {0};
    char *error = NULL;
    setup(&f, 10);
    put(f.ws, "z", "123456789");
    CHECK(save(&f, &m, &error) == 0 && !error);
    put(f.ws, "a", "abcdefghi");
    CHECK(save(&f, &m, &error) == -EDQUOT);
    CHECK(error && strstr(error, "a:") && strstr(error, "quota"));
    CHECK(m.n == 1 && !strcmp(m.v[0].path, "z"));
    CHECK(count_objects(&f, "sessions/abc/blobs/") == 1);
    free(error);
    manifest_release(&m);
    teardown(&f);
}

TEST(restores_files_and_names_corrupted_and_missing_ones)
{
    struct fixture f;
    struct manifest m = {0}, loaded;
    char *error;
    setup(&f, 0);
    put(f.ws, "good", "good contents");
    put(f.ws, "sub/bad", "bad contents");
    put(f.ws, "gone", "gone contents");
    CHECK(save(&f, &m, &error) == 0);
    CHECK(manifest_load(f.store, "abc", &loaded) == 0);
    for (size_t i = 0; i < loaded.n; i++) {
        _cleanup_free_ char *blob =
            xasprintf("%s/store/sessions/abc/blobs/%s", f.dir, loaded.v[i].sha);
        if (!strcmp(loaded.v[i].path, "sub/bad"))
            CHECK(write_file(blob, "bad contentz", 12, 0600) == 0);
        if (!strcmp(loaded.v[i].path, "gone"))
            CHECK(unlink(blob) == 0);
    }
    struct workspace *ws2 = scratch_ws(f.dir, "b");
    json_t *ok = json_array(), *failed = json_array();
    manifest_restore_files(f.store, "abc", &loaded, ws2, ok, failed);
    CHECK(json_array_size(ok) == 1);
    CHECK_STREQ(json_string_value(json_array_get(ok, 0)), "good");
    CHECK(json_array_size(failed) == 2);
    char *text = json_dumps(failed, 0);
    CHECK(strstr(text, "\"gone\"") && strstr(text, "missing"));
    CHECK(strstr(text, "\"sub/bad\"") && strstr(text, "corrupted"));
    free(text);
    char *data;
    size_t n;
    _cleanup_free_ char *good = xasprintf("%s/good", ws2->dir);
    CHECK(read_file(good, 100, &data, &n) == 0 && !strcmp(data, "good contents"));
    free(data);
    _cleanup_free_ char *bad = xasprintf("%s/sub/bad", ws2->dir);
    CHECK(access(bad, F_OK) < 0); /* nothing half-restored is left */
    struct stat a, b;
    _cleanup_free_ char *orig = xasprintf("%s/good", f.ws->dir);
    CHECK(stat(orig, &a) == 0 && stat(good, &b) == 0);
    CHECK(a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec);
    CHECK((b.st_mode & 0777) == 0640);
    json_decref(ok);
    json_decref(failed);
    free_ws(ws2);
    manifest_release(&loaded);
    manifest_release(&m);
    teardown(&f);
}

TEST(a_corrupted_manifest_is_reported)
{
    struct fixture f;
    struct manifest m;
    setup(&f, 0);
    CHECK(manifest_load(f.store, "abc", &m) == -ENOENT);
    CHECK(store_put_buf(f.store, "sessions/abc/manifest.json", "{\"files\": 3", 11) == 0);
    CHECK(manifest_load(f.store, "abc", &m) == -EBADMSG);
    CHECK(strstr(err_msg(), "corrupted") && strstr(err_msg(), "manifest.json"));
    /* what a power cut can leave of a list the file system had not written yet */
    CHECK(store_put_buf(f.store, "sessions/abc/manifest.json", "", 0) == 0);
    CHECK(manifest_load(f.store, "abc", &m) == -EBADMSG);
    CHECK(strstr(err_msg(), "corrupted") && strstr(err_msg(), "manifest.json"));
    teardown(&f);
}

TEST(session_ids)
{
    CHECK(session_id_valid("0123456789abcdef"));
    CHECK(!session_id_valid(""));
    CHECK(!session_id_valid("ABC"));
    CHECK(!session_id_valid("../x"));
    /* ids of a node: "NODE-HEX", NODE a DNS label */
    CHECK(session_id_valid("node-1-0123456789abcdef01234567"));
    CHECK(session_id_valid("a-0f"));
    CHECK(!session_id_valid("-0f"));
    CHECK(!session_id_valid("A-0f"));
    CHECK(!session_id_valid("a--0f"));
    CHECK(!session_id_valid("a.b-0f"));
    CHECK(!session_id_valid("a-"));
    CHECK(!session_id_valid("a-xyz"));
    _cleanup_free_ char *node = session_id_node("node-1-0123");
    CHECK_STREQ(node, "node-1");
    CHECK(session_id_node("0123") == NULL);
    CHECK(node_name_valid("runcell-0") && !node_name_valid("") && !node_name_valid("x_y"));
    CHECK(!node_name_valid("abcdefghijabcdefghijabcdefghijabc")); /* 33 */
    CHECK(!session_id_valid("00000000000000000000000000000000000000000000000000000000000000000"));
}

int main(int argc, char **argv)
{
    return run_tests(argc, argv);
}
