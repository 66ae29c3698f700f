/* test-sandbox.c - unit tests for src/sandbox that need no privileges. */
#include <errno.h>
#include <sched.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runner.h"
#include "sandbox/workspace-int.h" /* a workspace of a plain directory, made here */

/* A workspace as the file helpers see it: a plain directory of ours (no host, no mount). */
static struct workspace *scratch_ws(void)
{
    static char tmpl[] = "/tmp/runcell-unit-XXXXXX";
    struct workspace *ws = xcalloc(1, sizeof(*ws));
    CHECK(mkdtemp(tmpl) != NULL);
    ws->base = xstrdup(tmpl);
    ws->dir = xasprintf("%s/work", tmpl);
    ws->uid = ws->root_uid = geteuid();
    ws->gid = getegid();
    ws->uid_lock_fd = -1;
    workspace_scan_dir_init(ws); /* as workspace_new: scans keep the directory open */
    CHECK(mkdir(ws->dir, 0700) == 0);
    return ws;
}

static char *ws_path(const struct workspace *ws, const char *rel)
{
    return xasprintf("%s/%s", ws->dir, rel);
}

static struct ws_entry ent(const char *path, uint64_t size, int64_t mtime)
{
    return (struct ws_entry){
        .path = (char *)path, .size = size, .mtime_ns = mtime, .ino = 1, .mode = 0100644};
}

TEST(listing_diff_finds_created_modified_deleted)
{
    struct ws_entry b[] = {ent("a", 1, 1), ent("b", 1, 1), ent("c", 1, 1)};
    struct ws_entry a[] = {ent("a", 1, 1), ent("b", 2, 5), ent("d", 1, 1)};
    struct ws_listing before = {.v = b, .n = 3}, after = {.v = a, .n = 3};
    char **created, **modified, **deleted;
    ws_listing_diff(&before, &after, &created, &modified, &deleted);
    CHECK(strv_len(created) == 1 && !strcmp(created[0], "d"));
    CHECK(strv_len(modified) == 1 && !strcmp(modified[0], "b"));
    CHECK(strv_len(deleted) == 1 && !strcmp(deleted[0], "c"));
    strv_free(created);
    strv_free(modified);
    strv_free(deleted);
}

TEST(default_limits_are_filled)
{
    struct sandbox_limits l = {.memory_mb = 64};
    sandbox_limits_fill_defaults(&l);
    CHECK(l.memory_mb == 64);
    CHECK(l.pids == SANDBOX_DEFAULT_PIDS);
    CHECK(l.disk_mb == SANDBOX_DEFAULT_DISK_MB);
}

TEST(default_env_is_clean)
{
    char **env = sandbox_default_env();
    bool home = false;
    for (char **e = env; *e; e++) {
        CHECK(strncmp(*e, "RUNCELL_", 8) != 0);
        home |= !strcmp(*e, "HOME=/workspace");
    }
    CHECK(home);
    strv_free(env);
}

TEST(openat_never_follows_links_out)
{
    struct workspace *ws = scratch_ws();
    char *link = ws_path(ws, "escape");
    CHECK(symlink("/etc", link) == 0);
    CHECK(workspace_openat(ws, "escape/passwd", O_RDONLY, 0) == -ELOOP);
    CHECK(workspace_openat(ws, "escape", O_RDONLY, 0) == -ELOOP);
    CHECK(workspace_openat(ws, "../work/x", O_RDONLY, 0) == -EINVAL);
    CHECK(workspace_openat(ws, "/etc/passwd", O_RDONLY, 0) == -EINVAL);
    free(link);
    workspace_free(ws);
}

TEST(copy_in_makes_parents_and_refuses_links)
{
    struct workspace *ws = scratch_ws();
    CHECK(workspace_copy_in(ws, "/etc/hostname", "a/b/c.txt") == 0);
    char *p = ws_path(ws, "a/b/c.txt");
    struct stat st;
    CHECK(stat(p, &st) == 0 && S_ISREG(st.st_mode));
    free(p);
    /* A link planted where a parent directory should be is not followed. */
    char *outside = xasprintf("%s/outside", ws->base);
    char *planted = xasprintf("%s/x.txt", outside);
    char *link = ws_path(ws, "d");
    CHECK(mkdir(outside, 0700) == 0);
    CHECK(symlink(outside, link) == 0);
    CHECK(workspace_copy_in(ws, "/etc/hostname", "d/x.txt") < 0);
    CHECK(access(planted, F_OK) < 0 && errno == ENOENT);
    free(link);
    free(planted);
    free(outside);
    CHECK(workspace_copy_in(ws, "/nonexistent/file", "y") == -ENOENT);
    CHECK(strstr(err_msg(), "/nonexistent/file") != NULL);
    workspace_free(ws);
}

TEST(copy_out_copies_files_and_names_links)
{
    struct workspace *ws = scratch_ws();
    CHECK(workspace_copy_in(ws, "/etc/hostname", "sub/h.txt") == 0);
    char *link = ws_path(ws, "link");
    CHECK(symlink("/etc/passwd", link) == 0);
    char *out = xasprintf("%s/out", ws->base);
    CHECK(workspace_copy_out(ws, "sub/h.txt", out) == 0);
    char *copied = xasprintf("%s/sub/h.txt", out);
    struct stat st;
    CHECK(stat(copied, &st) == 0 && S_ISREG(st.st_mode));
    CHECK(workspace_copy_out(ws, "link", out) == -ELOOP);
    CHECK(strstr(err_msg(), "symbolic link") != NULL);
    free(copied);
    free(out);
    free(link);
    workspace_free(ws);
}

TEST(scan_lists_files_and_links_and_skips_tool_state)
{
    struct workspace *ws = scratch_ws();
    CHECK(workspace_copy_in(ws, "/etc/hostname", "b/f") == 0);
    CHECK(workspace_copy_in(ws, "/etc/hostname", "a") == 0);
    CHECK(workspace_copy_in(ws, "/etc/hostname", ".cache/pip/x") == 0);
    CHECK(workspace_copy_in(ws, "/etc/hostname", ".local/lib/y") == 0);
    char *link = ws_path(ws, "l");
    CHECK(symlink("a", link) == 0);
    free(link);
    char *empty = ws_path(ws, "emptydir");
    CHECK(mkdir(empty, 0755) == 0);
    free(empty);
    struct ws_listing l;
    CHECK(workspace_scan(ws, &l) == 0);
    CHECK(l.n == 3 && !l.truncated);
    CHECK_STREQ(l.v[0].path, "a");
    CHECK_STREQ(l.v[1].path, "b/f");
    CHECK_STREQ(l.v[2].path, "l");
    CHECK(S_ISLNK(l.v[2].mode));
    ws_listing_release(&l);
    workspace_free(ws);
}

static bool listing_is(const struct ws_listing *l, const char *const *paths, size_t n)
{
    if (l->n != n || l->truncated)
        return false;
    for (size_t i = 0; i < n; i++)
        if (strcmp(l->v[i].path, paths[i]))
            return false;
    return true;
}

/* An execution scans twice; the workspace's directory stays open between scans, each read
 * from its start again. Each scan sees the changes made since the one before; one that
 * finds the kept directory in use (a file listing beside an execution) opens its own; an
 * idle session's is closed and opened again by the next scan. */
TEST(scan_keeps_the_directory_open_and_sees_each_change)
{
    struct workspace *ws = scratch_ws();
    struct ws_listing l;
    CHECK(workspace_scan(ws, &l) == 0 && listing_is(&l, NULL, 0));
    ws_listing_release(&l);
    int kept = ws->scan->fd;
    CHECK(kept >= 0);

    CHECK(workspace_copy_in(ws, "/etc/hostname", "a") == 0);
    CHECK(workspace_scan(ws, &l) == 0 && listing_is(&l, (const char *[]){"a"}, 1));
    ws_listing_release(&l);
    CHECK(ws->scan->fd == kept);

    char *a = ws_path(ws, "a");
    CHECK(unlink(a) == 0);
    free(a);
    CHECK(workspace_copy_in(ws, "/etc/hostname", "b/c") == 0);
    CHECK(workspace_copy_in(ws, "/etc/hostname", "d") == 0);
    CHECK(workspace_scan(ws, &l) == 0 && listing_is(&l, (const char *[]){"b/c", "d"}, 2));
    ws_listing_release(&l);

    /* in use by another scan: this one opens the directory itself, and leaves the kept one
     * where it was; going idle then waits for nothing and closes nothing */
    CHECK(pthread_mutex_lock(&ws->scan->lock) == 0);
    off_t at = lseek(kept, 0, SEEK_CUR);
    CHECK(workspace_scan(ws, &l) == 0 && listing_is(&l, (const char *[]){"b/c", "d"}, 2));
    ws_listing_release(&l);
    CHECK(lseek(kept, 0, SEEK_CUR) == at);
    workspace_scan_idle(ws);
    CHECK(ws->scan->fd == kept);
    CHECK(pthread_mutex_unlock(&ws->scan->lock) == 0);

    workspace_scan_idle(ws);
    CHECK(ws->scan->fd == -1 && fcntl(kept, F_GETFD) == -1 && errno == EBADF);
    char *d = ws_path(ws, "d");
    CHECK(unlink(d) == 0);
    free(d);
    CHECK(workspace_scan(ws, &l) == 0 && listing_is(&l, (const char *[]){"b/c"}, 1));
    ws_listing_release(&l);
    CHECK(ws->scan->fd >= 0);
    workspace_free(ws);
}

/* A workspace whose file system was noted at its creation (workspace.dev) is scanned
 * without asking it again, and lists the same: here a directory that takes several reads,
 * one below it, and an empty one. */
TEST(scan_with_the_noted_file_system_lists_the_same)
{
    struct workspace *ws = scratch_ws();
    /* 3000 names of ~60 bytes: ~240 KB of entries, eight reads of 32 KB */
    for (int i = 0; i < 3000; i++) {
        char *p = xasprintf("%s/file-with-a-long-name-to-fill-the-buffer-sooner-%05d", ws->dir, i);
        int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0600);
        CHECK(fd >= 0);
        close(fd);
        free(p);
    }
    char *sub = ws_path(ws, "sub"), *empty = ws_path(ws, "sub/empty");
    CHECK(mkdir(sub, 0700) == 0 && mkdir(empty, 0700) == 0);
    CHECK(workspace_copy_in(ws, "/etc/hostname", "sub/f") == 0);
    free(sub);
    free(empty);

    struct ws_listing every, noted;
    CHECK(workspace_scan(ws, &every) == 0); /* dev unknown: asked by the scan */
    struct stat st;
    CHECK(stat(ws->dir, &st) == 0);
    ws->dev = st.st_dev;
    CHECK(workspace_scan(ws, &noted) == 0);
    CHECK(every.n == 3001 && noted.n == 3001 && !every.truncated && !noted.truncated);
    for (size_t i = 0; i < every.n; i++)
        CHECK(!strcmp(every.v[i].path, noted.v[i].path));
    CHECK_STREQ(noted.v[3000].path, "sub/f");
    ws_listing_release(&every);
    ws_listing_release(&noted);
    workspace_free(ws);
}

TEST(listing_diff_sees_replacement_and_mode_change)
{
    struct ws_entry b[] = {ent("a", 1, 1), ent("b", 1, 1)};
    struct ws_entry a[] = {ent("a", 1, 1), ent("b", 1, 1)};
    a[0].ino = 2;        /* same size and time, another file (rename over it) */
    a[1].mode = 0100755; /* chmod +x */
    struct ws_listing before = {.v = b, .n = 2}, after = {.v = a, .n = 2};
    char **created, **modified, **deleted;
    ws_listing_diff(&before, &after, &created, &modified, &deleted);
    CHECK(strv_len(created) == 0 && strv_len(deleted) == 0);
    CHECK(strv_len(modified) == 2);
    strv_free(created);
    strv_free(modified);
    strv_free(deleted);
}

/* Parses text for controller; returns the path or "(none)", valid until the next call (the
 * one kept is still reachable at exit, so no leak is reported). */
static char *own(const char *text, const char *controller)
{
    static char *last;
    char *path = NULL;
    free(last);
    last = cgroup_parse_own(text, controller, &path) == 0 ? path : xstrdup("(none)");
    return last;
}

TEST(cgroup_parse_pure_v2)
{
    CHECK_STREQ(own("0::/system.slice/runcell.service\n", ""), "/system.slice/runcell.service");
    CHECK_STREQ(own("0::/\n", ""), "/");
    /* no newline at the end */
    CHECK_STREQ(own("0::/user.slice/user-1000.slice/session-3.scope", ""),
                "/user.slice/user-1000.slice/session-3.scope");
    CHECK_STREQ(own("0::/a\n", "memory"), "(none)");
}

TEST(cgroup_parse_v1)
{
    const char *t = "12:pids:/user.slice/user-0.slice\n"
                    "11:cpu,cpuacct:/user.slice\n"
                    "6:memory:/user.slice/user-0.slice/session-1.scope\n"
                    "1:name=systemd:/user.slice/user-0.slice/session-1.scope\n";
    CHECK_STREQ(own(t, "memory"), "/user.slice/user-0.slice/session-1.scope");
    CHECK_STREQ(own(t, "pids"), "/user.slice/user-0.slice");
    CHECK_STREQ(own(t, "cpu"), "/user.slice");
    CHECK_STREQ(own(t, "cpuacct"), "/user.slice");
    CHECK_STREQ(own(t, "cpuset"), "(none)"); /* "cpu" must not match a prefix */
    CHECK_STREQ(own(t, "systemd"), "(none)");
    CHECK_STREQ(own(t, ""), "(none)");
}

TEST(cgroup_parse_hybrid)
{
    const char *t = "13:misc:/\n"
                    "5:memory:/docker/abc\n"
                    "1:name=systemd:/docker/abc\n"
                    "0::/docker/abc/unified\n";
    CHECK_STREQ(own(t, "memory"), "/docker/abc");
    CHECK_STREQ(own(t, ""), "/docker/abc/unified");
}

TEST(cgroup_parse_odd_lines)
{
    /* colons in the path belong to it */
    CHECK_STREQ(own("0::/machine.slice/libpod-a:b:c.scope\n", ""),
                "/machine.slice/libpod-a:b:c.scope");
    CHECK_STREQ(own("4:memory:/x:y\n", "memory"), "/x:y");
    /* a removed cgroup we still sit in cannot hold new ones */
    CHECK_STREQ(own("0::/gone.scope (deleted)\n", ""), "(none)");
    /* garbage, empty and partial lines are skipped, the good line still found */
    CHECK_STREQ(own("\n:::\nx::/bad\n0:/nocolon\n0::\n0::relative\n00::/id00\n0::/good\n", ""),
                "/good");
    CHECK_STREQ(own("", ""), "(none)");
    CHECK_STREQ(own("0:memory:/v1-style-zero\n", ""), "(none)");
    /* a very long line is not cut */
    char *longp = xcalloc(1, 6000);
    strcpy(longp, "0::/");
    memset(longp + 4, 'a', 5000);
    char *got = own(longp, "");
    free(longp);
    CHECK(strlen(got) == 5001);
}

/* 0 when a child of ours can make a user namespace, else its errno. */
static int unshare_userns_in_child(void)
{
    pid_t pid = fork();
    if (pid == 0)
        _exit(unshare(CLONE_NEWUSER) < 0 ? errno : 0);
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st));
    return WEXITSTATUS(st);
}

TEST(landlock_features_by_abi)
{
    char on[1024], off[1024];
    CHECK(sandbox_landlock_features(0, on, sizeof(on), off, sizeof(off)) == 0);
    CHECK_STREQ(on, "");
    CHECK(strstr(off, "file system access") && strstr(off, "scoped signals"));
    /* Debian 12's 6.1 has ABI 2: refer is enforced, truncate and later are not. */
    CHECK(sandbox_landlock_features(2, on, sizeof(on), off, sizeof(off)) == 2);
    CHECK(strstr(on, "refer") && !strstr(on, "truncate"));
    CHECK(strstr(off, "truncate (ABI 3, Linux 6.2)") && strstr(off, "ioctl on devices") &&
          strstr(off, "scoped signals") && !strstr(off, "refer"));
    /* ABI 4 (network rules) adds nothing runcell uses: the sandbox has no network. */
    CHECK(sandbox_landlock_features(4, on, sizeof(on), off, sizeof(off)) == 3);
    CHECK(sandbox_landlock_features(7, on, sizeof(on), off, sizeof(off)) == 5);
    CHECK_STREQ(off, "");
    /* a small buffer is cut, never overrun */
    char tiny[8];
    sandbox_landlock_features(7, tiny, sizeof(tiny), off, sizeof(off));
    CHECK(strlen(tiny) == 7);
}

TEST(userns_verdict_names_the_sysctl)
{
    CHECK(sandbox_userns_verdict(15000, -1, -1, false) == NULL);
    CHECK(sandbox_userns_verdict(15000, 1, 0, false) == NULL);
    CHECK(strstr(sandbox_userns_verdict(0, 1, -1, true), "user.max_user_namespaces"));
    CHECK(strstr(sandbox_userns_verdict(15000, 0, -1, false), "kernel.unprivileged_userns_clone"));
    CHECK(strstr(sandbox_userns_verdict(15000, 1, 1, false),
                 "kernel.apparmor_restrict_unprivileged_userns"));
    /* both restrict unprivileged processes only: root is not told to run as root */
    CHECK(sandbox_userns_verdict(15000, 0, 1, true) == NULL);
}

TEST(kernel_probe_agrees_with_the_kernel)
{
    struct sandbox_kernel k, quick;
    sandbox_kernel_probe(&k, true);
    sandbox_kernel_probe(&quick, false); /* a one-shot run's: no child */
    struct utsname u;
    CHECK(uname(&u) == 0);
    CHECK_STREQ(k.release, u.release);
    long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, 1 /* VERSION */);
    CHECK(k.landlock_abi == (abi > 0 ? (int)abi : 0));
    /* what runcell itself needs to have got this far (Linux 5.7+) */
    CHECK(k.clone3 && k.openat2 && k.pidfd_open && k.pidfd_send_signal && k.open_tree);
    CHECK(k.clone_into_cgroup);
    CHECK(k.tmpfs && k.seccomp);
    long max = -1;
    FILE *f = fopen("/proc/sys/user/max_user_namespaces", "re");
    if (f) {
        CHECK(fscanf(f, "%ld", &max) == 1);
        fclose(f);
    }
    CHECK(k.max_user_namespaces == max);
    CHECK(k.userns_tried && (k.userns_errno == 0) == (unshare_userns_in_child() == 0));
    CHECK(!quick.userns_tried && quick.userns_errno == 0);
    CHECK(quick.max_user_namespaces == max && quick.landlock_abi == k.landlock_abi);
}

int main(int argc, char **argv)
{
    return run_tests(argc, argv);
}
