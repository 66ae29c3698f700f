/* test-wsfiles.c - unit tests for the workspace file API of src/sandbox (wsfiles.c) on real
 * files in a temporary directory: what the daemon makes belongs to the sandbox user, reads
 * are capped, and no link the sandbox may plant is followed out of the workspace. The
 * ownership checks need root (another uid stands for the sandbox user); as another user
 * they skip and say so. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runner.h"
#include "sandbox/workspace-int.h"

/* A uid and gid no account uses, for the sandbox user when the tests run as root. */
#define SANDBOX_TEST_ID 61789

/* A plain directory as the workspace (no host, no tmpfs); as root its sandbox user is
 * SANDBOX_TEST_ID, otherwise runcell's own uid, as in an unprivileged runcell. */
static struct workspace *scratch_ws(void)
{
    char tmpl[] = "/tmp/runcell-unit-ws-XXXXXX";
    struct workspace *ws = xcalloc(1, sizeof(*ws));
    CHECK(mkdtemp(tmpl) != NULL);
    ws->base = xstrdup(tmpl);
    ws->dir = xasprintf("%s/work", tmpl);
    bool root = geteuid() == 0;
    ws->uid = ws->root_uid = root ? SANDBOX_TEST_ID : geteuid();
    ws->gid = root ? SANDBOX_TEST_ID : getegid();
    ws->uid_lock_fd = -1;
    CHECK(mkdir(ws->dir, 0700) == 0);
    return ws;
}

static char *host_path(const struct workspace *ws, const char *rel)
{
    return xasprintf("%s/%s", ws->dir, rel);
}

static void need_root(void)
{
    if (geteuid() != 0)
        SKIP("the owner of what the daemon makes can only be another uid's as root");
}

/* Whether path (lstat: a link itself) belongs to the workspace's sandbox user. */
static bool owned_by_sandbox_user(const struct workspace *ws, const char *rel)
{
    _cleanup_free_ char *p = host_path(ws, rel);
    struct stat st;
    CHECK(lstat(p, &st) == 0);
    return st.st_uid == ws->uid && st.st_gid == ws->gid;
}

/* The number of entries of directory rel ("" the workspace) whose names start with prefix. */
static int count_named(const struct workspace *ws, const char *rel, const char *prefix)
{
    _cleanup_free_ char *p = *rel ? host_path(ws, rel) : xstrdup(ws->dir);
    DIR *d = opendir(p);
    CHECK(d != NULL);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += str_has_prefix(e->d_name, prefix);
    closedir(d);
    return n;
}

static char *slurp(const char *path)
{
    char *data;
    size_t n;
    CHECK(read_file(path, 1 << 20, &data, &n) == 0);
    return data;
}

/* Host paths outside the workspace, for links planted by the "sandbox". */
static char *outside(const struct workspace *ws, const char *name)
{
    return xasprintf("%s/%s", ws->base, name);
}

TEST(write_gives_file_and_parents_to_the_sandbox_user)
{
    need_root();
    struct workspace *ws = scratch_ws();
    CHECK(workspace_write(ws, "a/b/c.txt", "hello", 5) == 0);
    CHECK(owned_by_sandbox_user(ws, "a"));
    CHECK(owned_by_sandbox_user(ws, "a/b"));
    CHECK(owned_by_sandbox_user(ws, "a/b/c.txt"));
    _cleanup_free_ char *p = host_path(ws, "a/b/c.txt");
    _cleanup_free_ char *text = slurp(p);
    CHECK_STREQ(text, "hello");
    struct stat st;
    CHECK(stat(p, &st) == 0 && S_ISREG(st.st_mode) && !(st.st_mode & 07133));
    /* no temporary file is left beside it */
    CHECK(count_named(ws, "a/b", ".runcell-write-") == 0);
    workspace_free(ws);
}

TEST(write_replaces_a_planted_link_and_never_writes_through_it)
{
    struct workspace *ws = scratch_ws();
    _cleanup_free_ char *victim = outside(ws, "victim");
    CHECK(write_file(victim, "precious", 8, 0600) == 0);
    _cleanup_free_ char *link = host_path(ws, "out.txt");
    CHECK(symlink(victim, link) == 0);
    CHECK(workspace_write(ws, "out.txt", "new", 3) == 0);
    struct stat st;
    CHECK(lstat(link, &st) == 0 && S_ISREG(st.st_mode));
    _cleanup_free_ char *kept = slurp(victim);
    CHECK_STREQ(kept, "precious");
    workspace_free(ws);
}

TEST(write_refuses_links_on_the_way_and_paths_out)
{
    struct workspace *ws = scratch_ws();
    _cleanup_free_ char *dir = outside(ws, "elsewhere");
    CHECK(mkdir(dir, 0700) == 0);
    _cleanup_free_ char *link = host_path(ws, "d");
    CHECK(symlink(dir, link) == 0);
    CHECK(workspace_write(ws, "d/x.txt", "x", 1) < 0);
    CHECK(strstr(err_msg(), "d/x.txt") != NULL);
    CHECK(workspace_write(ws, "d/deeper/x.txt", "x", 1) < 0);
    _cleanup_free_ char *planted = xasprintf("%s/x.txt", dir);
    _cleanup_free_ char *deeper = xasprintf("%s/deeper", dir);
    CHECK(access(planted, F_OK) < 0 && errno == ENOENT);
    CHECK(access(deeper, F_OK) < 0 && errno == ENOENT);
    static const char *const bad[] = {"../escape", "a/../../escape", "/tmp/escape", "", ".",
                                      "a//b"};
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++)
        CHECK(workspace_write(ws, bad[i], "x", 1) == -EINVAL);
    _cleanup_free_ char *escaped = outside(ws, "escape");
    CHECK(access(escaped, F_OK) < 0 && errno == ENOENT);
    workspace_free(ws);
}

TEST(newfile_commit_refuses_a_link_or_directory_when_asked)
{
    struct workspace *ws = scratch_ws();
    _cleanup_free_ char *victim = outside(ws, "victim");
    CHECK(write_file(victim, "precious", 8, 0600) == 0);
    _cleanup_free_ char *link = host_path(ws, "up.bin");
    CHECK(symlink(victim, link) == 0);
    struct ws_newfile f;
    CHECK(ws_newfile_open(ws, "up.bin", 0644, &f) == 0);
    CHECK(write_all(f.fd, "upload", 6) == 0);
    bool replaced = false;
    CHECK(ws_newfile_commit(&f, WS_REFUSE_LINK, &replaced) == -ELOOP);
    CHECK(f.fd < 0 && f.tmp_name == NULL); /* released, its file removed */
    CHECK(count_named(ws, "", ".runcell-write-") == 0);
    struct stat st;
    CHECK(lstat(link, &st) == 0 && S_ISLNK(st.st_mode));
    _cleanup_free_ char *kept = slurp(victim);
    CHECK_STREQ(kept, "precious");
    _cleanup_free_ char *sub = host_path(ws, "sub");
    CHECK(mkdir(sub, 0755) == 0);
    CHECK(ws_newfile_open(ws, "sub", 0644, &f) == 0);
    CHECK(ws_newfile_commit(&f, WS_REFUSE_LINK, NULL) == -EISDIR);
    CHECK(count_named(ws, "", ".runcell-write-") == 0);
    workspace_free(ws);
}

TEST(newfile_says_what_it_replaced_and_gives_it_away_at_commit)
{
    struct workspace *ws = scratch_ws();
    struct ws_newfile f;
    bool replaced = true;
    CHECK(ws_newfile_open(ws, "n/f.txt", 0600, &f) == 0);
    CHECK(write_all(f.fd, "one", 3) == 0);
    _cleanup_free_ char *p = host_path(ws, "n/f.txt");
    CHECK(access(p, F_OK) < 0); /* not there until committed */
    CHECK(ws_newfile_commit(&f, WS_REFUSE_LINK, &replaced) == 0 && !replaced);
    CHECK(owned_by_sandbox_user(ws, "n/f.txt"));
    CHECK(ws_newfile_open(ws, "n/f.txt", 0600, &f) == 0);
    CHECK(write_all(f.fd, "two", 3) == 0);
    CHECK(ws_newfile_commit(&f, 0, &replaced) == 0 && replaced);
    _cleanup_free_ char *text = slurp(p);
    CHECK_STREQ(text, "two");
    /* abort leaves the old file and no temporary; a second abort is a no-op */
    CHECK(ws_newfile_open(ws, "n/f.txt", 0600, &f) == 0);
    CHECK(write_all(f.fd, "three", 5) == 0);
    ws_newfile_abort(&f);
    ws_newfile_abort(&f);
    free(text);
    text = slurp(p);
    CHECK_STREQ(text, "two");
    CHECK(count_named(ws, "n", ".runcell-write-") == 0);
    workspace_free(ws);
}

TEST(newfile_owner_as_root)
{
    need_root();
    struct workspace *ws = scratch_ws();
    struct ws_newfile f;
    CHECK(ws_newfile_open(ws, "deep/er/f", 0600, &f) == 0);
    CHECK(owned_by_sandbox_user(ws, "deep"));
    CHECK(owned_by_sandbox_user(ws, "deep/er"));
    CHECK(ws_newfile_commit(&f, 0, NULL) == 0);
    CHECK(owned_by_sandbox_user(ws, "deep/er/f"));
    workspace_free(ws);
}

TEST(mkdir_and_symlink_belong_to_the_sandbox_user)
{
    need_root();
    struct workspace *ws = scratch_ws();
    CHECK(workspace_mkdir(ws, "x/y", 0755) == 0);
    CHECK(owned_by_sandbox_user(ws, "x"));
    CHECK(owned_by_sandbox_user(ws, "x/y"));
    CHECK(workspace_mkdir(ws, "x/y", 0755) == -EEXIST);
    /* the target is a string, never followed: a link to a host path is made as asked */
    CHECK(workspace_symlink(ws, "/etc/shadow", "x/l") == 0);
    CHECK(owned_by_sandbox_user(ws, "x/l"));
    _cleanup_free_ char *l = host_path(ws, "x/l");
    char target[64] = {0};
    CHECK(readlink(l, target, sizeof(target) - 1) == 11);
    CHECK_STREQ(target, "/etc/shadow");
    struct stat st;
    CHECK(stat("/etc/shadow", &st) == 0 && st.st_uid == 0); /* not given away through it */
    CHECK(workspace_symlink(ws, "t", "x/l") == -EEXIST);
    workspace_free(ws);
}

TEST(mkdir_and_symlink_refuse_links_on_the_way_and_paths_out)
{
    struct workspace *ws = scratch_ws();
    _cleanup_free_ char *dir = outside(ws, "elsewhere");
    CHECK(mkdir(dir, 0700) == 0);
    _cleanup_free_ char *link = host_path(ws, "d");
    CHECK(symlink(dir, link) == 0);
    CHECK(workspace_mkdir(ws, "d/new", 0755) < 0);
    CHECK(workspace_symlink(ws, "t", "d/new") < 0);
    _cleanup_free_ char *made = xasprintf("%s/new", dir);
    CHECK(access(made, F_OK) < 0 && errno == ENOENT);
    CHECK(workspace_mkdir(ws, "../escape", 0755) == -EINVAL);
    CHECK(workspace_symlink(ws, "t", "../escape") == -EINVAL);
    CHECK(workspace_mkdir(ws, "/tmp/escape", 0755) == -EINVAL);
    workspace_free(ws);
}

TEST(copy_in_gives_the_copy_to_the_sandbox_user)
{
    need_root();
    struct workspace *ws = scratch_ws();
    CHECK(workspace_copy_in(ws, "/etc/hostname", "in/h") == 0);
    CHECK(owned_by_sandbox_user(ws, "in"));
    CHECK(owned_by_sandbox_user(ws, "in/h"));
    CHECK(count_named(ws, "in", ".runcell-write-") == 0);
    workspace_free(ws);
}

TEST(read_is_capped_and_says_the_size)
{
    struct workspace *ws = scratch_ws();
    CHECK(workspace_write(ws, "f", "0123456789", 10) == 0);
    struct buf b;
    uint64_t size = 0;
    CHECK(workspace_read(ws, "f", 10, &b, &size) == 0);
    CHECK(b.len == 10 && size == 10 && !memcmp(b.data, "0123456789", 10));
    buf_release(&b);
    size = 0;
    memset(&b, 0xa5, sizeof(b)); /* left released on failure, whatever was there */
    CHECK(workspace_read(ws, "f", 9, &b, &size) == -E2BIG);
    CHECK(size == 10 && b.data == NULL);
    CHECK(workspace_write(ws, "empty", "", 0) == 0);
    CHECK(workspace_read(ws, "empty", 0, &b, NULL) == 0 && b.len == 0);
    buf_release(&b);
    CHECK(workspace_read(ws, "missing", 10, &b, NULL) == -ENOENT && b.data == NULL);
    workspace_free(ws);
}

TEST(read_refuses_links_special_files_and_paths_out)
{
    struct workspace *ws = scratch_ws();
    struct buf b;
    _cleanup_free_ char *link = host_path(ws, "l");
    CHECK(symlink("/etc/hostname", link) == 0);
    CHECK(workspace_read(ws, "l", 1 << 20, &b, NULL) == -ELOOP);
    _cleanup_free_ char *dlink = host_path(ws, "etc");
    CHECK(symlink("/etc", dlink) == 0);
    CHECK(workspace_read(ws, "etc/hostname", 1 << 20, &b, NULL) == -ELOOP);
    /* a FIFO nobody writes would block a plain open or read: refused at once */
    _cleanup_free_ char *fifo = host_path(ws, "fifo");
    CHECK(mkfifo(fifo, 0644) == 0);
    CHECK(workspace_read(ws, "fifo", 1 << 20, &b, NULL) == -EINVAL);
    CHECK(workspace_mkdir(ws, "dir", 0755) == 0);
    CHECK(workspace_read(ws, "dir", 1 << 20, &b, NULL) == -EINVAL);
    CHECK(workspace_read(ws, "../work/dir", 1 << 20, &b, NULL) == -EINVAL);
    CHECK(workspace_read(ws, "/etc/hostname", 1 << 20, &b, NULL) == -EINVAL);
    workspace_free(ws);
}

int main(int argc, char **argv)
{
    return run_tests(argc, argv);
}
