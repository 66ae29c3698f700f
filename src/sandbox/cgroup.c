/* cgroup.c - per-sandbox cgroups on v2, or on the v1 controllers of a hybrid host. */
#include "sandbox/cgroup-int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const v1_names[CG_N] = {"memory", "pids", "cpu", "cpuacct"};

static int write_str(const char *dir, const char *file, const char *val)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    _cleanup_close_ int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = (ssize_t)strlen(val);
    return write(fd, val, (size_t)n) == n ? 0 : -errno;
}

static int read_small(const char *dir, const char *file, char *out, size_t size)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = read(fd, out, size - 1);
    if (n < 0)
        return -errno;
    out[n] = '\0';
    return 0;
}

/* read_small through fd, open on dir/file for the cgroup's life (pread from 0: cgroup files
 * are made anew at each read from the start), or by path when fd is -1 or the read fails. */
static int pread_small(int fd, const char *dir, const char *file, char *out, size_t size)
{
    ssize_t n = fd >= 0 ? pread(fd, out, size - 1, 0) : -1;
    if (n < 0)
        return read_small(dir, file, out, size);
    out[n] = '\0';
    return 0;
}

/* The value of "key N" in a flat keyed text such as memory.events or cpu.stat. */
static int keyed_value(const char *text, const char *key, uint64_t *ret)
{
    size_t klen = strlen(key);
    for (const char *line = text; line && *line;
         line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (!strncmp(line, key, klen) && line[klen] == ' ') {
            *ret = strtoull(line + klen + 1, NULL, 10);
            return 0;
        }
    }
    return -ENOENT;
}

static int pread_keyed(int fd, const char *dir, const char *file, const char *key, uint64_t *ret)
{
    char text[4096];
    int r = pread_small(fd, dir, file, text, sizeof(text));
    return r < 0 ? r : keyed_value(text, key, ret);
}

/* Whether a comma-separated /proc/PID/cgroup controller list names ctrl. */
static bool list_has(const char *list, size_t len, const char *ctrl)
{
    size_t n = strlen(ctrl);
    for (const char *p = list, *end = list + len; p < end;) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        size_t tok = comma ? (size_t)(comma - p) : (size_t)(end - p);
        if (tok == n && !memcmp(p, ctrl, n))
            return true;
        p += tok + 1;
    }
    return false;
}

int cgroup_parse_own(const char *text, const char *controller, char **ret_path)
{
    static const char deleted[] = " (deleted)";
    const size_t dlen = sizeof(deleted) - 1;
    for (const char *line = text; line && *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        const char *next = nl ? nl + 1 : NULL;
        /* "ID:CONTROLLERS:PATH"; only the first two colons separate: a path may hold more. */
        const char *c1 = memchr(line, ':', len);
        const char *c2 = c1 ? memchr(c1 + 1, ':', len - (size_t)(c1 + 1 - line)) : NULL;
        if (!c2 || c1 == line || strspn(line, "0123456789") != (size_t)(c1 - line)) {
            line = next;
            continue;
        }
        const char *ctrls = c1 + 1, *path = c2 + 1;
        size_t clen = (size_t)(c2 - ctrls), plen = len - (size_t)(path - line);
        bool match = *controller ? list_has(ctrls, clen, controller)
                                 : clen == 0 && c1 - line == 1 && line[0] == '0';
        if (!match || plen == 0 || path[0] != '/') {
            line = next;
            continue;
        }
        /* The kernel marks a cgroup removed while we are still in it; nothing can be
         * created below it. */
        if (plen >= dlen && !memcmp(path + plen - dlen, deleted, dlen))
            return -ENOENT;
        *ret_path = xstrndup(path, plen);
        return 0;
    }
    return -ENOENT;
}

/* Our own cgroup path in the hierarchy that lists `controller` ("" for the v2 line), from
 * text, /proc/self/cgroup as read by the caller (NULL: read here). */
static char *own_cgroup_path_in(const char *text, const char *controller)
{
    _cleanup_free_ char *own = NULL;
    char *path = NULL;
    if (!text && read_file("/proc/self/cgroup", 65536, &own, NULL) < 0)
        return NULL;
    if (cgroup_parse_own(text ? text : own, controller, &path) < 0)
        return NULL;
    return path;
}

static char *own_cgroup_path(const char *controller)
{
    return own_cgroup_path_in(NULL, controller);
}

/* Mount point of the cgroup file system carrying `controller` (v1), or of cgroup2 when
 * controller is NULL; from mountinfo, /proc/self/mountinfo as read by the caller (NULL:
 * read here). */
static char *cgroup_mount_in(const char *mountinfo, const char *controller)
{
    FILE *f = mountinfo ? fmemopen((void *)mountinfo, strlen(mountinfo), "r")
                        : fopen("/proc/self/mountinfo", "re");
    char line[4096];
    char *found = NULL;
    if (!f)
        return NULL;
    while (!found && fgets(line, sizeof(line), f)) {
        char *sep = strstr(line, " - ");
        if (!sep)
            continue;
        char mnt[PATH_MAX], fstype[64], source[256], opts[1024];
        if (sscanf(line, "%*s %*s %*s %*s %4095s", mnt) != 1 ||
            sscanf(sep + 3, "%63s %255s %1023s", fstype, source, opts) != 3)
            continue;
        if (!controller) {
            if (!strcmp(fstype, "cgroup2"))
                found = xstrdup(mnt);
            continue;
        }
        if (strcmp(fstype, "cgroup"))
            continue;
        char *save = NULL;
        for (char *tok = strtok_r(opts, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
            if (!strcmp(tok, controller))
                found = xstrdup(mnt);
    }
    fclose(f);
    return found;
}

static char *cgroup_mount(const char *controller)
{
    return cgroup_mount_in(NULL, controller);
}

char *cgroup_mount_point(const char *controller)
{
    return cgroup_mount(controller);
}

static char *join_base(const char *mnt, const char *own)
{
    if (!own || !strcmp(own, "/"))
        return xasprintf("%s/runcell", mnt);
    return xasprintf("%s%s/runcell", mnt, own);
}

/* Whether a space-separated cgroup.controllers list names ctrl ("cpu" is not "cpuset"). */
static bool has_controller(const char *list, const char *ctrl)
{
    size_t n = strlen(ctrl);
    for (const char *p = list; (p = strstr(p, ctrl)); p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == '\0' || p[n] == ' ' || p[n] == '\n'))
            return true;
    return false;
}

/* ---- cgroup v2 placement ----
 *
 * v2 hands controllers down only from a cgroup without processes of its own (the root
 * cgroup excepted), and a process may move only between cgroups whose common ancestor's
 * cgroup.procs it can write. So runcell needs a cgroup that is its alone: the root cgroup,
 * or one delegated to it (a Delegate=yes unit). There it moves itself into a leaf
 * (runcell-daemon), enables the controllers in its cgroup and puts the sandboxes under a
 * sibling base (runcell). Whatever it made is removed again on failure and at exit. */

static const char *const placement_names[] = {
    [CGROUP_PLACEMENT_NONE] = "none",
    [CGROUP_PLACEMENT_DISABLED] = "disabled",
    [CGROUP_PLACEMENT_V1] = "v1",
    [CGROUP_PLACEMENT_V2_ROOT] = "v2-root",
    [CGROUP_PLACEMENT_V2_DELEGATED] = "v2-delegated",
    [CGROUP_PLACEMENT_V2_SHARED] = "v2-shared",
    [CGROUP_PLACEMENT_V2_UNDELEGATED] = "v2-undelegated",
};

const char *cgroup_placement_name(enum cgroup_placement p)
{
    return (size_t)p < ARRAY_SIZE(placement_names) ? placement_names[p] : "unknown";
}

static const char *const v2_wanted[] = {"memory", "pids", "cpu"}; /* the last is optional */

static bool systemd_running(void)
{
    return access("/run/systemd/system", F_OK) == 0;
}

/* The command that gives runcell a delegated cgroup of its own, for messages. */
static const char *scope_command(void)
{
    return geteuid() == 0 ? "systemd-run --scope -p Delegate=yes runcell ..."
                          : "systemd-run --user --scope -p Delegate=yes runcell ...";
}

/* "as root: " before a command only root can run, for a reader who is not root. */
static const char *as_root(void)
{
    return geteuid() == 0 ? "" : "as root: ";
}

static char *parent_dir(const char *dir)
{
    char *p = xstrdup(dir), *slash = strrchr(p, '/');
    if (slash && slash != p)
        *slash = '\0';
    return p;
}

/* How many processes other than us cgroup.procs of dir lists; -errno when unreadable. */
static int other_procs(const char *dir)
{
    _cleanup_free_ char *path = xasprintf("%s/cgroup.procs", dir), *text = NULL;
    size_t len;
    int r = read_file(path, 1 << 20, &text, &len);
    if (r < 0)
        return r;
    int n = 0;
    for (char *p = text, *end; *p; p = end) {
        long pid = strtol(p, &end, 10);
        if (end == p)
            break;
        if (pid > 0 && pid != getpid())
            n++;
    }
    return n;
}

/* The first file a delegation needs that we cannot write (a message names it), or NULL. */
static char *unwritable_file(const char *own_dir)
{
    static const char *const files[] = {NULL, "cgroup.procs", "cgroup.subtree_control"};
    for (size_t i = 0; i < ARRAY_SIZE(files); i++) {
        char *path = files[i] ? xasprintf("%s/%s", own_dir, files[i]) : xstrdup(own_dir);
        int mode = files[i] ? W_OK : W_OK | X_OK;
        if (faccessat(AT_FDCWD, path, mode, AT_EACCESS) < 0)
            return path;
        free(path);
    }
    return NULL;
}

static void v2_degrade(struct sandbox_host *host, enum cgroup_placement placement, char *reason)
{
    host->cgroup_placement = placement;
    free(host->degraded_reason);
    host->degraded_reason = reason;
}

/* The controllers of v2_wanted that dir's cgroup.controllers lists; a message for the first
 * required one it lacks. */
static int v2_controllers(struct sandbox_host *host, const char *mnt, const char *dir)
{
    char ctrls[512] = "";
    int r = read_small(dir, "cgroup.controllers", ctrls, sizeof(ctrls));
    if (r < 0) {
        v2_degrade(host, CGROUP_PLACEMENT_V2_UNDELEGATED,
                   xasprintf("cannot read %s/cgroup.controllers: %s", dir, strerror(-r)));
        return r;
    }
    for (size_t i = 0; i < ARRAY_SIZE(v2_wanted) - 1; i++) {
        if (has_controller(ctrls, v2_wanted[i]))
            continue;
        _cleanup_free_ char *parent = parent_dir(dir);
        v2_degrade(host, CGROUP_PLACEMENT_V2_UNDELEGATED,
                   strcmp(dir, mnt)
                       ? xasprintf("the %s controller is not in %s/cgroup.controllers: enable it "
                                   "in %s/cgroup.subtree_control (%secho +%s > "
                                   "%s/cgroup.subtree_control), or start runcell as a systemd "
                                   "unit with Delegate=yes (%s)",
                                   v2_wanted[i], dir, parent, as_root(), v2_wanted[i], parent,
                                   scope_command())
                       : xasprintf("the %s controller is not in %s/cgroup.controllers: the "
                                   "kernel has it off or bound to a cgroup v1 hierarchy; boot "
                                   "with systemd.unified_cgroup_hierarchy=1 and without "
                                   "cgroup_disable=%s",
                                   v2_wanted[i], dir, v2_wanted[i]));
        return -ENOENT;
    }
    host->cgroup_cpu = has_controller(ctrls, "cpu");
    return 0;
}

/* Enables the wanted controllers in dir's subtree_control; those it turned on (that were
 * off) are appended to ret_enabled ("+memory +pids") when not NULL. */
static int v2_enable(struct sandbox_host *host, const char *dir, char *ret_enabled, size_t size)
{
    char before[256] = "";
    (void)read_small(dir, "cgroup.subtree_control", before, sizeof(before));
    size_t n = host->cgroup_cpu ? ARRAY_SIZE(v2_wanted) : ARRAY_SIZE(v2_wanted) - 1;
    for (size_t i = 0; i < n; i++) {
        char op[32];
        /* Already on (the root cgroup under systemd): nothing to write, which an
         * unprivileged user could not. */
        if (has_controller(before, v2_wanted[i]))
            continue;
        snprintf(op, sizeof(op), "+%s", v2_wanted[i]);
        int r = write_str(dir, "cgroup.subtree_control", op);
        if (r < 0)
            return err_set(-r, "cannot enable the %s controller in %s/cgroup.subtree_control: %s%s",
                           v2_wanted[i], dir, strerror(-r),
                           r == -EBUSY ? " (the cgroup holds processes: cgroup v2 enables "
                                         "controllers only in a cgroup without any)"
                                       : "");
        if (ret_enabled)
            snprintf(ret_enabled + strlen(ret_enabled), size - strlen(ret_enabled), "%s%s",
                     *ret_enabled ? " " : "", v2_wanted[i]);
    }
    return 0;
}

static int move_self(const char *dir)
{
    char pid[32];
    snprintf(pid, sizeof(pid), "%d", getpid());
    return write_str(dir, "cgroup.procs", pid);
}

/* Leaves the leaf: back into our cgroup (after disabling what we enabled there), and rmdir
 * the leaf. Best effort: a cgroup left behind is logged. */
static void v2_unplace(struct sandbox_host *host)
{
    if (!host->cgroup_leaf_dir)
        return;
    if (*host->cgroup_enabled) {
        char ops[128] = "";
        _cleanup_free_ char *copy = xstrdup(host->cgroup_enabled);
        char *save = NULL;
        for (char *tok = strtok_r(copy, " ", &save); tok; tok = strtok_r(NULL, " ", &save))
            snprintf(ops + strlen(ops), sizeof(ops) - strlen(ops), "%s-%s", *ops ? " " : "", tok);
        (void)write_str(host->cgroup_own_dir, "cgroup.subtree_control", ops);
        host->cgroup_enabled[0] = '\0';
    }
    if (move_self(host->cgroup_own_dir) < 0 || rmdir(host->cgroup_leaf_dir) < 0)
        log_warn("msg=\"cannot remove the daemon's cgroup\" path=%s error=%s",
                 host->cgroup_leaf_dir, log_quote(strerror(errno)));
    free(host->cgroup_leaf_dir);
    host->cgroup_leaf_dir = NULL;
}

/* Our cgroup is ours alone: move into a leaf below it and enable the controllers in it. */
static int v2_place_delegated(struct sandbox_host *host, const char *own_dir)
{
    _cleanup_free_ char *leaf = xasprintf("%s/runcell-daemon", own_dir);
    bool made = mkdir(leaf, 0755) == 0;
    int r;
    if (!made && errno != EEXIST)
        return err_set(errno, "cannot create cgroup %s: %s", leaf, strerror(errno));
    if ((r = move_self(leaf)) < 0) {
        if (made)
            rmdir(leaf);
        return err_set(-r, "cannot move runcell into cgroup %s: %s", leaf, strerror(-r));
    }
    host->cgroup_leaf_dir = TAKE_PTR(leaf);
    return v2_enable(host, own_dir, host->cgroup_enabled, sizeof(host->cgroup_enabled));
}

static int v2_make_base(struct sandbox_host *host, const char *parent)
{
    char *base = xasprintf("%s/runcell", parent);
    if (mkdir(base, 0755) == 0)
        host->cgroup_base_made = true;
    else if (errno != EEXIST) {
        int e = errno;
        free(base);
        return err_set(e, "cannot create cgroup %s/runcell: %s", parent, strerror(e));
    }
    host->cgroup_base[0] = base;
    return v2_enable(host, base, NULL, 0);
}

/* Where our own cgroup is and whether it can be ours: the placement, or a degraded reason
 * that says what to change. */
static void v2_place(struct sandbox_host *host, const char *mnt, const char *own)
{
    bool root_cg = !strcmp(own, "/");
    _cleanup_free_ char *own_dir = xasprintf("%s%s", mnt, root_cg ? "" : own);
    host->cgroup_own_dir = xstrdup(own_dir);
    if (v2_controllers(host, mnt, own_dir) < 0)
        return;
    /* In the root cgroup only the directory itself must be writable (for the base). */
    _cleanup_free_ char *bad =
        root_cg
            ? (faccessat(AT_FDCWD, own_dir, W_OK | X_OK, AT_EACCESS) < 0 ? xstrdup(own_dir) : NULL)
            : unwritable_file(own_dir);
    if (bad) {
        v2_degrade(host, CGROUP_PLACEMENT_V2_UNDELEGATED,
                   xasprintf("cgroup %s is not delegated to runcell: %s is not writable by uid %u "
                             "(%s); start runcell as a systemd service with Delegate=yes "
                             "(deploy/systemd/runcell.service) or in a delegated scope: %s",
                             own, bad, (unsigned)geteuid(), strerror(errno), scope_command()));
        return;
    }
    int others = root_cg ? 0 : other_procs(own_dir);
    if (others != 0) {
        v2_degrade(host, CGROUP_PLACEMENT_V2_SHARED,
                   others < 0
                       ? xasprintf("cannot read %s/cgroup.procs: %s", own_dir, strerror(-others))
                   : systemd_running()
                       ? xasprintf("runcell shares cgroup %s with %d other process%s (a login "
                                   "session or a CI job), and cgroup v2 delegates controllers only "
                                   "from a cgroup without processes; start it in a cgroup of its "
                                   "own: %s",
                                   own, others, others == 1 ? "" : "es", scope_command())
                       : xasprintf("runcell shares cgroup %s with %d other process%s, and cgroup "
                                   "v2 delegates controllers only from a cgroup without processes; "
                                   "start it in a cgroup of its own: without systemd, %smkdir "
                                   "%s/runcell.scope && echo $$ > %s/runcell.scope/cgroup.procs "
                                   "and start runcell from that shell; under systemd, %s",
                                   own, others, others == 1 ? "" : "es", as_root(), mnt, mnt,
                                   scope_command()));
        return;
    }
    int r = root_cg ? v2_enable(host, own_dir, NULL, 0) : v2_place_delegated(host, own_dir);
    if (r == 0)
        r = v2_make_base(host, own_dir);
    if (r < 0) {
        cgroup_host_release(host);
        v2_degrade(host, CGROUP_PLACEMENT_V2_UNDELEGATED, xstrdup(err_msg()));
        return;
    }
    host->cgroup_placement = root_cg ? CGROUP_PLACEMENT_V2_ROOT : CGROUP_PLACEMENT_V2_DELEGATED;
    host->cgroup_mode = CGROUP_V2;
    if (!host->cgroup_cpu)
        log_warn("msg=\"the cpu controller is not in %s/cgroup.controllers: sandboxes get no "
                 "CPU bandwidth cap\"",
                 own_dir);
}

/* True when the controllers live on the unified hierarchy (a pure v2 host), whatever the
 * outcome; false on hybrid and v1 hosts, whose cgroup2 tree (if any) has no controllers. */
static bool detect_v2(struct sandbox_host *host)
{
    _cleanup_free_ char *mnt = cgroup_mount(NULL);
    char ctrls[512] = "";
    if (!mnt || read_small(mnt, "cgroup.controllers", ctrls, sizeof(ctrls)) < 0 ||
        !has_controller(ctrls, "memory"))
        return false;
    host->cgroup_v2_mount = xstrdup(mnt);
    _cleanup_free_ char *own = own_cgroup_path("");
    if (!own) {
        v2_degrade(host, CGROUP_PLACEMENT_V2_UNDELEGATED,
                   xstrdup("cannot find runcell's own cgroup: /proc/self/cgroup has no \"0::\" "
                           "line, or names a deleted cgroup"));
        return true;
    }
    host->cgroup_own = xstrdup(own);
    v2_place(host, mnt, own);
    return true;
}

/* ---- a scope of its own ---- */

extern char **environ;

static const char *find_systemd_run(void)
{
    static const char *const paths[] = {"/usr/bin/systemd-run", "/bin/systemd-run"};
    for (size_t i = 0; i < ARRAY_SIZE(paths); i++)
        if (access(paths[i], X_OK) == 0)
            return paths[i];
    return NULL;
}

/* Runs argv with stdio on /dev/null; its exit status, or -errno. */
static int run_quiet(const char *path, char *const *argv)
{
    posix_spawn_file_actions_t fa;
    pid_t pid;
    int wstatus;
    posix_spawn_file_actions_init(&fa);
    for (int fd = 0; fd < 3; fd++)
        posix_spawn_file_actions_addopen(&fa, fd, "/dev/null", O_RDWR, 0);
    int r = posix_spawn(&pid, path, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (r)
        return -r;
    while (waitpid(pid, &wstatus, 0) < 0)
        if (errno != EINTR)
            return -errno;
    return WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
}

/* Whether our v2 cgroup cannot be ours: shared with other processes, or (not root) not
 * delegated. Writes its path to ret_own. */
static bool v2_needs_scope(char **ret_own)
{
    _cleanup_free_ char *mnt = cgroup_mount(NULL);
    char ctrls[512] = "";
    if (!mnt || read_small(mnt, "cgroup.controllers", ctrls, sizeof(ctrls)) < 0 ||
        !has_controller(ctrls, "memory"))
        return false;
    _cleanup_free_ char *own = own_cgroup_path("");
    if (!own || !strcmp(own, "/"))
        return false;
    _cleanup_free_ char *dir = xasprintf("%s%s", mnt, own);
    _cleanup_free_ char *bad = unwritable_file(dir);
    /* Root that cannot write its cgroup has a read-only cgroup file system: no scope
     * helps. */
    if ((bad && geteuid() != 0) || (!bad && other_procs(dir) > 0)) {
        *ret_own = TAKE_PTR(own);
        return true;
    }
    return false;
}

/* "systemd-run [--user] --scope --quiet --collect -p Delegate=yes -- PROG ARGV[1..]";
 * the strings are borrowed, the vector is the caller's to free. */
static char **scope_argv(bool user, const char *prog, int argc, char **argv)
{
    static const char *const head[] = {"--scope", "--quiet",      "--collect",
                                       "-p",      "Delegate=yes", "--"};
    char **v = xcalloc((size_t)argc + ARRAY_SIZE(head) + 3, sizeof(char *));
    int k = 0;
    v[k++] = (char *)"systemd-run";
    if (user)
        v[k++] = (char *)"--user";
    for (size_t i = 0; i < ARRAY_SIZE(head); i++)
        v[k++] = (char *)head[i];
    v[k++] = (char *)prog;
    for (int i = 1; i < argc; i++)
        v[k++] = argv[i];
    return v;
}

/* The systemd-run to re-run in, when runcell should and may (see sandbox_scope_reexec);
 * NULL otherwise. */
static const char *scope_wanted(char **ret_own)
{
    if (getenv("RUNCELL_NO_CGROUPS") || getenv("RUNCELL_SCOPED") || !systemd_running())
        return NULL;
    const char *systemd_run = find_systemd_run();
    return systemd_run && v2_needs_scope(ret_own) ? systemd_run : NULL;
}

bool sandbox_scope_wanted(void)
{
    _cleanup_free_ char *own = NULL;
    return scope_wanted(&own) != NULL;
}

int sandbox_scope_reexec(int argc, char **argv)
{
    _cleanup_free_ char *own = NULL;
    const char *systemd_run = scope_wanted(&own);
    if (!systemd_run)
        return 0;
    bool user = geteuid() != 0;
    /* Asked first with a program that does nothing: once exec'd, a systemd-run that fails
     * would take the command with it. */
    _cleanup_free_ char **probe = scope_argv(user, "/bin/true", 0, NULL);
    int r = run_quiet(systemd_run, probe);
    if (r != 0) {
        log_warn("msg=\"runcell's cgroup %s is not its own, and systemd gives it no delegated "
                 "scope (%s%s --scope -p Delegate=yes failed: %s); sandboxes run without cgroup "
                 "limits\"",
                 own, systemd_run, user ? " --user" : "", r < 0 ? strerror(-r) : "non-zero exit");
        return 0;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        return -errno;
    exe[n] = '\0';
    _cleanup_free_ char **args = scope_argv(user, exe, argc, argv);
    /* Marks the re-run, so that it never loops. */
    setenv("RUNCELL_SCOPED", "1", 1);
    log_warn("msg=\"runcell shares cgroup %s with other processes (or it is not delegated); "
             "re-running itself in a systemd scope of its own with Delegate=yes, to give "
             "sandboxes cgroup limits\" command=\"%s%s --scope -p Delegate=yes\"",
             own, systemd_run, user ? " --user" : "");
    execv(systemd_run, args);
    r = -errno;
    log_warn("msg=\"cannot run %s\" error=%s", systemd_run, log_quote(strerror(errno)));
    unsetenv("RUNCELL_SCOPED");
    return r;
}

void cgroup_host_release(struct sandbox_host *host)
{
    if (host->cgroup_v2_mount) {
        /* Other runcell processes may share a base in the root cgroup: only an empty one
         * goes (cgroup_create makes it again for them). */
        if (host->cgroup_base[0] && rmdir(host->cgroup_base[0]) < 0 && errno != ENOENT &&
            errno != EBUSY && errno != ENOTEMPTY)
            log_warn("msg=\"cannot remove cgroup\" path=%s error=%s", host->cgroup_base[0],
                     log_quote(strerror(errno)));
        v2_unplace(host);
    }
    for (int i = 0; i < CG_N; i++) {
        free(host->cgroup_base[i]);
        host->cgroup_base[i] = NULL;
    }
    host->cgroup_mode = CGROUP_NONE;
}

static bool detect_v1(struct sandbox_host *host)
{
    /* Each read once for every controller (~20 us a read here; a start made ten). */
    _cleanup_free_ char *mountinfo = NULL, *own_text = NULL;
    if (read_file("/proc/self/mountinfo", 1 << 20, &mountinfo, NULL) < 0 ||
        read_file("/proc/self/cgroup", 65536, &own_text, NULL) < 0)
        return false;
    for (int i = 0; i < CG_N; i++) {
        _cleanup_free_ char *mnt = cgroup_mount_in(mountinfo, v1_names[i]);
        _cleanup_free_ char *own = own_cgroup_path_in(own_text, v1_names[i]);
        if (!mnt || !own)
            continue;
        char *base = join_base(mnt, own);
        /* The base may exist already, made by root for an earlier run: an unprivileged
         * process that finds it must still be able to create sandbox cgroups inside. */
        if ((mkdir(base, 0755) < 0 && errno != EEXIST) ||
            faccessat(AT_FDCWD, base, W_OK | X_OK, AT_EACCESS) < 0) {
            free(base);
            continue;
        }
        host->cgroup_base[i] = base;
    }
    if (!host->cgroup_base[CG_MEMORY] || !host->cgroup_base[CG_PIDS]) {
        for (int i = 0; i < CG_N; i++) {
            free(host->cgroup_base[i]);
            host->cgroup_base[i] = NULL;
        }
        return false;
    }
    host->cgroup_mode = CGROUP_V1;
    return true;
}

void cgroup_host_detect(struct sandbox_host *host)
{
    host->cgroup_mode = CGROUP_NONE;
    host->cgroup_placement = CGROUP_PLACEMENT_NONE;
    if (getenv("RUNCELL_NO_CGROUPS")) {
        host->cgroup_placement = CGROUP_PLACEMENT_DISABLED;
        host->degraded_reason = xstrdup("cgroups disabled by RUNCELL_NO_CGROUPS");
        return;
    }
    if (detect_v2(host))
        return;
    if (detect_v1(host)) {
        host->cgroup_placement = CGROUP_PLACEMENT_V1;
        return;
    }
    host->degraded_reason =
        geteuid() == 0
            ? xstrdup("cannot create cgroups: no cgroup v2 hierarchy with the memory controller "
                      "and no writable cgroup v1 memory and pids hierarchies (is /sys/fs/cgroup "
                      "mounted read-only, as in a container without a delegated cgroup?)")
            : xasprintf("cannot create cgroups under the cgroup v1 memory and pids hierarchies "
                        "as uid %u: this host keeps its controllers on cgroup v1, which delegates "
                        "nothing to users; run runcell as root, or boot with "
                        "systemd.unified_cgroup_hierarchy=1 and delegate a cgroup (%s)",
                        (unsigned)geteuid(), scope_command());
}

/* Each limit is written when it differs from old (NULL: all of them). */
static int v1_limits(struct cgroup *cg, const struct sandbox_limits *l,
                     const struct sandbox_limits *old)
{
    char v[64];
    if (!old || old->memory_mb != l->memory_mb) {
        /* Where swap is accounted, memory.limit_in_bytes may not exceed
         * memory.memsw.limit_in_bytes (EINVAL): a raise writes memsw first, a cut after. */
        bool raise = old && l->memory_mb > old->memory_mb;
        snprintf(v, sizeof(v), "%llu", (unsigned long long)l->memory_mb << 20);
        if (raise)
            (void)write_str(cg->dirs[CG_MEMORY], "memory.memsw.limit_in_bytes", v);
        int r = write_str(cg->dirs[CG_MEMORY], "memory.limit_in_bytes", v);
        if (r < 0)
            return err_set(-r, "cannot set memory.limit_in_bytes in %s: %s", cg->dirs[CG_MEMORY],
                           strerror(-r));
        /* Swap accounting may be off; where it is on, swap counts against the same limit. */
        if (!raise)
            (void)write_str(cg->dirs[CG_MEMORY], "memory.memsw.limit_in_bytes", v);
    }
    if (!old || old->pids != l->pids) {
        snprintf(v, sizeof(v), "%llu", (unsigned long long)l->pids);
        int r = write_str(cg->dirs[CG_PIDS], "pids.max", v);
        if (r < 0)
            return err_set(-r, "cannot set pids.max in %s: %s", cg->dirs[CG_PIDS], strerror(-r));
    }
    if (!cg->dirs[CG_CPU])
        return 0;
    if (!old || old->cpus_milli != l->cpus_milli) {
        if (!old)
            (void)write_str(cg->dirs[CG_CPU], "cpu.cfs_period_us", "100000");
        snprintf(v, sizeof(v), "%llu", (unsigned long long)l->cpus_milli * 100);
        int r = write_str(cg->dirs[CG_CPU], "cpu.cfs_quota_us", v);
        if (r < 0)
            return err_set(-r, "cannot set cpu.cfs_quota_us in %s: %s", cg->dirs[CG_CPU],
                           strerror(-r));
    }
    return 0;
}

static int v2_limits(struct cgroup *cg, const struct sandbox_limits *l,
                     const struct sandbox_limits *old)
{
    char v[64];
    const char *dir = cg->dirs[0];
    if (!old || old->memory_mb != l->memory_mb) {
        snprintf(v, sizeof(v), "%llu", (unsigned long long)l->memory_mb << 20);
        int r = write_str(dir, "memory.max", v);
        if (r < 0)
            return err_set(-r, "cannot set memory.max in %s: %s", dir, strerror(-r));
    }
    if (!old)
        (void)write_str(dir, "memory.swap.max", "0");
    if (!old || old->pids != l->pids) {
        snprintf(v, sizeof(v), "%llu", (unsigned long long)l->pids);
        int r = write_str(dir, "pids.max", v);
        if (r < 0)
            return err_set(-r, "cannot set pids.max in %s: %s", dir, strerror(-r));
    }
    /* cpu may not be delegated: then neither file is there. */
    if (!old || old->cpus_milli != l->cpus_milli) {
        snprintf(v, sizeof(v), "%llu 100000", (unsigned long long)l->cpus_milli * 100);
        (void)write_str(dir, "cpu.max", v);
    }
    return 0;
}

int cgroup_apply_limits(struct cgroup *cg, const struct sandbox_limits *limits)
{
    /* Only what differs from the limits last written is written again: the sandbox cannot
     * write its cgroup's files, so what was written is what holds. */
    const struct sandbox_limits *old = cg->has_applied ? &cg->applied : NULL;
    cg->has_applied = false;
    int r = cg->mode == CGROUP_V2 ? v2_limits(cg, limits, old) : v1_limits(cg, limits, old);
    if (r == 0) {
        cg->applied = *limits;
        cg->has_applied = true;
    }
    return r;
}

/* Opens memory.peak once for the cgroup's life. Since Linux 6.12 the file is writable and
 * a write resets the peak seen by reads through the same descriptor; before, it is read-only
 * (open for writing fails with EACCES, even as root) and counts from the cgroup's birth. */
static void open_peak(struct cgroup *cg)
{
    _cleanup_free_ char *path = xasprintf("%s/memory.peak", cg->dirs[0]);
    cg->peak_fd = open(path, O_RDWR | O_CLOEXEC);
    if (cg->peak_fd >= 0 && write(cg->peak_fd, "reset\n", 6) == 6) {
        cg->peak_resettable = true;
        return;
    }
    if (cg->peak_fd >= 0)
        close(cg->peak_fd);
    cg->peak_fd = open(path, O_RDONLY | O_CLOEXEC);
}

/* What cgroup_read_usage reads, per mode, in usage_fd[] order. */
static const char *const usage_files_v2[3] = {"cpu.stat", "memory.events", NULL};
static const char *const usage_files_v1[3] = {"cpuacct.usage", "memory.max_usage_in_bytes",
                                              "memory.oom_control"};
static const int usage_dirs_v1[3] = {CG_CPUACCT, CG_MEMORY, CG_MEMORY};

/* Opens the usage files once, so that each execution's two readings cost a read each. */
static void open_usage(struct cgroup *cg)
{
    for (size_t i = 0; i < ARRAY_SIZE(cg->usage_fd); i++) {
        const char *file = cg->mode == CGROUP_V2 ? usage_files_v2[i] : usage_files_v1[i];
        const char *dir = cg->mode == CGROUP_V2 ? cg->dirs[0] : cg->dirs[usage_dirs_v1[i]];
        if (!file || !dir)
            continue;
        _cleanup_free_ char *path = xasprintf("%s/%s", dir, file);
        /* v1's peak is reset by a write; where that is refused it is written by path. */
        if (cg->mode == CGROUP_V1 && i == 1)
            cg->usage_fd[i] = open(path, O_RDWR | O_CLOEXEC);
        if (cg->usage_fd[i] < 0)
            cg->usage_fd[i] = open(path, O_RDONLY | O_CLOEXEC);
    }
}

/* mkdir of a sandbox cgroup. On v2 another runcell process sharing the base (in the root
 * cgroup) may have removed it at its exit while empty: make it again, with its controllers. */
static int make_sandbox_dir(const struct sandbox_host *host, const char *base, const char *dir)
{
    for (int tries = 0; tries < 3; tries++) {
        if (mkdir(dir, 0755) == 0)
            return 0;
        if (errno != ENOENT || host->cgroup_mode != CGROUP_V2)
            break;
        if (mkdir(base, 0755) < 0 && errno != EEXIST)
            break;
        for (size_t i = 0; i < ARRAY_SIZE(v2_wanted); i++) {
            char op[32];
            snprintf(op, sizeof(op), "+%s", v2_wanted[i]);
            if (i < ARRAY_SIZE(v2_wanted) - 1 || host->cgroup_cpu)
                (void)write_str(base, "cgroup.subtree_control", op);
        }
    }
    return -errno;
}

/* The hierarchy the leaf is made in: one is enough to tell sandboxes apart, and the pids
 * controller's cgroups cost the least to make (a cpu one would also lengthen the walk of
 * every task group that each CPU quota written makes). */
static int leaf_index(const struct cgroup *cg)
{
    return cg->mode == CGROUP_V2 ? 0 : CG_PIDS;
}

int cgroup_create(const struct sandbox_host *host, const char *name, const char *leaf,
                  const struct sandbox_limits *limits, struct cgroup **ret)
{
    struct cgroup *cg = xcalloc(1, sizeof(*cg));
    cg->mode = host->cgroup_mode;
    cg->peak_fd = -1;
    for (size_t i = 0; i < ARRAY_SIZE(cg->usage_fd); i++)
        cg->usage_fd[i] = -1;
    int n = cg->mode == CGROUP_V2 ? 1 : CG_N;
    for (int i = 0; i < n; i++) {
        if (!host->cgroup_base[i])
            continue;
        cg->dirs[i] = xasprintf("%s/%s", host->cgroup_base[i], name);
        int e = -make_sandbox_dir(host, host->cgroup_base[i], cg->dirs[i]);
        if (e) {
            err_set(e, "cannot create cgroup %s: %s", cg->dirs[i], strerror(e));
            free(cg->dirs[i]);
            cg->dirs[i] = NULL;
            cgroup_free(cg);
            return -e;
        }
    }
    int r = cgroup_apply_limits(cg, limits);
    if (r < 0) {
        cgroup_free(cg);
        return r;
    }
    if (leaf && cg->dirs[leaf_index(cg)]) {
        char *dir = xasprintf("%s/%s", cg->dirs[leaf_index(cg)], leaf);
        if (mkdir(dir, 0755) < 0) {
            r = err_set(errno, "cannot create cgroup %s: %s", dir, strerror(errno));
            free(dir);
            cgroup_free(cg);
            return r;
        }
        cg->leaf_dir = dir;
    }
    if (cg->mode == CGROUP_V2)
        open_peak(cg);
    open_usage(cg);
    *ret = cg;
    return 0;
}

char **cgroup_procs_files(const struct cgroup *cg)
{
    char **v = xcalloc(1, sizeof(char *));
    for (int i = 0; i < CG_N; i++) {
        if (!cg->dirs[i])
            continue;
        _cleanup_free_ char *p = xasprintf("%s/cgroup.procs", cg->dirs[i]);
        v = strv_push(v, p);
    }
    return v;
}

char *cgroup_leaf_procs_file(const struct cgroup *cg)
{
    return cg->leaf_dir ? xasprintf("%s/cgroup.procs", cg->leaf_dir) : NULL;
}

int cgroup_read_cpu(const struct cgroup *cg, double *ret_cpu_ms)
{
    char text[128];
    uint64_t v = 0;
    *ret_cpu_ms = 0;
    if (cg->mode == CGROUP_V2) {
        if (pread_keyed(cg->usage_fd[0], cg->dirs[0], "cpu.stat", "usage_usec", &v) < 0)
            return -ENODATA;
        *ret_cpu_ms = (double)v / 1000.0;
        return 0;
    }
    if (!cg->dirs[CG_CPUACCT] ||
        pread_small(cg->usage_fd[0], cg->dirs[CG_CPUACCT], "cpuacct.usage", text, sizeof(text)) < 0)
        return -ENODATA;
    *ret_cpu_ms = (double)strtoull(text, NULL, 10) / 1e6;
    return 0;
}

int cgroup_read_usage(const struct cgroup *cg, double *ret_cpu_ms, uint64_t *ret_peak_kb,
                      uint64_t *ret_oom_kills)
{
    char text[128];
    uint64_t v = 0;
    (void)cgroup_read_cpu(cg, ret_cpu_ms);
    *ret_peak_kb = 0;
    if (ret_oom_kills)
        *ret_oom_kills = 0;
    if (cg->mode == CGROUP_V2) {
        const char *dir = cg->dirs[0];
        ssize_t n = cg->peak_fd >= 0 ? pread(cg->peak_fd, text, sizeof(text) - 1, 0) : -1;
        if (n > 0)
            text[n] = '\0';
        if (n > 0 || read_small(dir, "memory.current", text, sizeof(text)) == 0)
            *ret_peak_kb = strtoull(text, NULL, 10) / 1024;
        if (ret_oom_kills &&
            pread_keyed(cg->usage_fd[1], dir, "memory.events", "oom_kill", &v) == 0)
            *ret_oom_kills = v;
        return 0;
    }
    if (pread_small(cg->usage_fd[1], cg->dirs[CG_MEMORY], "memory.max_usage_in_bytes", text,
                    sizeof(text)) == 0)
        *ret_peak_kb = strtoull(text, NULL, 10) / 1024;
    if (ret_oom_kills && pread_keyed(cg->usage_fd[2], cg->dirs[CG_MEMORY], "memory.oom_control",
                                     "oom_kill", &v) == 0)
        *ret_oom_kills = v;
    return 0;
}

int cgroup_read_memory(const struct cgroup *cg, uint64_t *ret_used, uint64_t *ret_cache)
{
    char text[16384]; /* memory.stat: a few dozen lines on either version */
    bool v2 = cg->mode == CGROUP_V2;
    const char *dir = v2 ? cg->dirs[0] : cg->dirs[CG_MEMORY];
    if (!dir)
        return -ENODATA;
    int r = read_small(dir, v2 ? "memory.current" : "memory.usage_in_bytes", text, sizeof(text));
    if (r < 0)
        return r;
    *ret_used = strtoull(text, NULL, 10);
    *ret_cache = 0;
    /* v1 counts the cgroup's own pages as "cache" and with its children's as "total_cache" */
    if (read_small(dir, "memory.stat", text, sizeof(text)) == 0 &&
        keyed_value(text, v2 ? "file" : "total_cache", ret_cache) < 0)
        (void)keyed_value(text, "cache", ret_cache);
    return 0;
}

void cgroup_reset_peak(const struct cgroup *cg)
{
    if (cg->mode == CGROUP_V2) {
        if (cg->peak_resettable && write(cg->peak_fd, "reset\n", 6) != 6)
            log_warn("msg=\"cannot reset memory.peak\" path=%s error=%s", cg->dirs[0],
                     log_quote(strerror(errno)));
    } else if (cg->dirs[CG_MEMORY] &&
               (cg->usage_fd[1] < 0 || pwrite(cg->usage_fd[1], "0", 1, 0) != 1)) {
        (void)write_str(cg->dirs[CG_MEMORY], "memory.max_usage_in_bytes", "0");
    }
}

bool cgroup_peak_per_cell(const struct cgroup *cg)
{
    return cg->mode != CGROUP_V2 || cg->peak_resettable;
}

/* SIGKILL every process listed in dir/cgroup.procs; returns how many were found. */
static int kill_procs(const char *dir)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
    FILE *f = fopen(path, "re");
    int n = 0;
    long pid;
    if (!f)
        return 0;
    while (fscanf(f, "%ld", &pid) == 1) {
        if (pid > 0)
            kill((pid_t)pid, SIGKILL);
        n++;
    }
    fclose(f);
    return n;
}

void cgroup_kill_all(const struct cgroup *cg)
{
    if (cg->mode == CGROUP_V2 && write_str(cg->dirs[0], "cgroup.kill", "1") == 0)
        return;
    for (int i = 0; i < CG_N; i++)
        if (cg->dirs[i])
            kill_procs(cg->dirs[i]);
    if (cg->leaf_dir)
        kill_procs(cg->leaf_dir);
}

/* How long a freeze may take to settle (every task stopped in the kernel) before it is
 * given up: a task in an uninterruptible sleep delays it. */
#define FREEZE_WAIT_MS 2000

int cgroup_freeze(const struct cgroup *cg, bool freeze)
{
    if (cg->mode != CGROUP_V2)
        return -EOPNOTSUPP;
    int r = write_str(cg->dirs[0], "cgroup.freeze", freeze ? "1" : "0");
    if (r < 0)
        return r;
    /* cgroup.events says "frozen 1" once every task of the subtree is stopped, and notifies
     * a poller (POLLPRI) of each change. */
    _cleanup_free_ char *events = xasprintf("%s/cgroup.events", cg->dirs[0]);
    _cleanup_close_ int fd = open(events, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    double until = now_ms_f() + FREEZE_WAIT_MS;
    for (;;) {
        char buf[256];
        ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
        if (n < 0)
            return -errno;
        buf[n] = '\0';
        const char *f = strstr(buf, "frozen ");
        if (f && (f[7] == '1') == freeze)
            return 0;
        double left = until - now_ms_f();
        if (left <= 0)
            break;
        struct pollfd p = {.fd = fd, .events = POLLPRI};
        poll(&p, 1, (int)left + 1);
    }
    if (freeze)
        (void)write_str(cg->dirs[0], "cgroup.freeze", "0");
    return -ETIMEDOUT;
}

static void remove_dir(const char *dir)
{
    /* rmdir fails with EBUSY until the last killed task has left; give it up to ~2 s. */
    for (int tries = 0; tries < 200; tries++) {
        if (rmdir(dir) == 0 || errno == ENOENT)
            return;
        if (errno != EBUSY)
            break;
        kill_procs(dir);
        usleep(10000);
    }
    log_warn("msg=\"cannot remove cgroup\" path=%s error=%s", dir, log_quote(strerror(errno)));
}

/* Removes dir's child cgroups (a sandbox's leaf), then dir. */
static void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_type != DT_DIR || e->d_name[0] == '.')
            continue;
        _cleanup_free_ char *child = xasprintf("%s/%s", dir, e->d_name);
        remove_dir(child);
    }
    if (d)
        closedir(d);
    remove_dir(dir);
}

void cgroup_usage_close(struct cgroup *cg)
{
    if (cg->peak_fd >= 0)
        close(cg->peak_fd);
    cg->peak_fd = -1;
    for (size_t i = 0; i < ARRAY_SIZE(cg->usage_fd); i++) {
        if (cg->usage_fd[i] >= 0)
            close(cg->usage_fd[i]);
        cg->usage_fd[i] = -1;
    }
    cg->usage_closed = true;
}

void cgroup_usage_reopen(struct cgroup *cg)
{
    if (!cg->usage_closed)
        return;
    cg->usage_closed = false;
    if (cg->mode == CGROUP_V2)
        open_peak(cg);
    open_usage(cg);
}

void cgroup_free(struct cgroup *cg)
{
    if (!cg)
        return;
    /* No sweep first: a sandbox's cgroup is freed once its init has ended or been killed
     * (reaped here; a template's clone, which the template reaps, may still be going), and
     * init is its PID namespace's first process: its end takes every other with it. One
     * still there (exiting, or an error path's) makes rmdir fail with EBUSY, and remove_dir
     * kills it and tries again. */
    cgroup_usage_close(cg);
    if (cg->leaf_dir)
        remove_dir(cg->leaf_dir);
    free(cg->leaf_dir);
    for (int i = 0; i < CG_N; i++) {
        if (!cg->dirs[i])
            continue;
        remove_dir(cg->dirs[i]);
        free(cg->dirs[i]);
    }
    free(cg);
}

void cgroup_sweep(const struct sandbox_host *host)
{
    for (int i = 0; i < CG_N; i++) {
        const char *base = host->cgroup_base[i];
        DIR *d = base ? opendir(base) : NULL;
        struct dirent *e;
        if (!d)
            continue;
        while ((e = readdir(d))) {
            char owner[64];
            const char *dash2;
            if (e->d_type != DT_DIR || e->d_name[0] < '0' || e->d_name[0] > '9')
                continue;
            /* names are "<pid>-<starttime>-<seq>" */
            dash2 = strchr(e->d_name, '-');
            dash2 = dash2 ? strchr(dash2 + 1, '-') : NULL;
            if (!dash2 || (size_t)(dash2 - e->d_name) >= sizeof(owner))
                continue;
            memcpy(owner, e->d_name, (size_t)(dash2 - e->d_name));
            owner[dash2 - e->d_name] = '\0';
            if (owner_alive(owner))
                continue;
            _cleanup_free_ char *dir = xasprintf("%s/%s", base, e->d_name);
            if (host->cgroup_mode == CGROUP_V2)
                (void)write_str(dir, "cgroup.kill", "1");
            kill_procs(dir);
            remove_tree(dir);
            log_info("msg=\"removed leftover cgroup\" path=%s", dir);
        }
        closedir(d);
    }
}
