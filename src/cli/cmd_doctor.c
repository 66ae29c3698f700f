/* cmd_doctor.c - `runcell doctor`: what this host gives runcell (cgroups and where they are
 * delegated, Landlock, seccomp, user namespaces, system calls, file systems, a real sandbox,
 * the template, the Python stack), and for each shortfall what to change. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <linux/magic.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"

static const char doctor_help[] =
    "usage: runcell doctor [--json] [--no-template]\n"
    "\n"
    "Prints what this host gives runcell: the cgroup version, its mount, runcell's own cgroup,\n"
    "which controllers are available and delegated where, the placement runcell chose; the\n"
    "Landlock ABI and what it enforces; seccomp; user namespaces; the system calls and file\n"
    "systems the sandbox uses; whether a sandbox and the template start; the Python stack;\n"
    "and for each shortfall what to change. It starts one real sandbox (and the template,\n"
    "as root with cgroups), and leaves nothing behind.\n"
    "\n";

static const char doctor_exit_help[] =
    "\n"
    "Exit status: 0 when everything full limits need is there, 1 when runcell would run\n"
    "degraded (or cannot start sandboxes), 2 for a usage error.";

struct doctor_opts {
    bool json;
    bool no_template;
};

static const struct opt_spec doctor_specs[] = {
    {"json", NULL, OPTK_FLAG, offsetof(struct doctor_opts, json),
     .help = "one JSON object instead of text"},
    {"no-template", NULL, OPTK_FLAG, offsetof(struct doctor_opts, no_template),
     .help = "do not try to start the template"},
    {NULL, .help = doctor_exit_help},
};

static const struct opt_cmd doctor_cmd = {
    .name = "doctor",
    .usage = doctor_help,
    .own = OPT_TABLE(doctor_specs),
    .column = 18,
};

#define PY_CHECK_MS   120000
#define PY_OUTPUT_CAP 65536

/* Imports the stack the template preloads, reporting each version or the error. */
static const char py_check[] = "import importlib, json\n"
                               "v = {}\n"
                               "for m in ('numpy', 'pandas', 'matplotlib'):\n"
                               "    try:\n"
                               "        v[m] = importlib.import_module(m).__version__\n"
                               "    except Exception as e:\n"
                               "        v[m] = None\n"
                               "        v[m + '_error'] = '%s: %s' % (type(e).__name__, e)\n"
                               "print(json.dumps(v))\n";

struct doctor {
    struct sandbox_host host;
    bool host_ok;
    json_t *out;   /* the report */
    json_t *fixes; /* what the user should change, one string each */
    bool full;     /* full limits */
};

static void fix(struct doctor *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fix(struct doctor *d, const char *fmt, ...)
{
    va_list ap;
    char *s = NULL;
    va_start(ap, fmt);
    if (vasprintf(&s, fmt, ap) < 0)
        s = NULL;
    va_end(ap);
    if (s)
        json_array_append_new(d->fixes, json_string(s));
    free(s);
}

static json_t *str_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

/* A sysctl's value, or null when the kernel has no such sysctl. */
static json_t *sysctl_json(long v)
{
    return v < 0 ? json_null() : json_integer(v);
}

/* The first line of dir/file, or NULL. */
static char *read_line(const char *dir, const char *file)
{
    _cleanup_free_ char *path = xasprintf("%s/%s", dir, file);
    char *text = NULL;
    size_t len;
    if (read_file(path, 65536, &text, &len) < 0)
        return NULL;
    text[strcspn(text, "\n")] = '\0';
    return text;
}

static void add_dir_files(json_t *o, const char *key, const char *dir, const char *file)
{
    _cleanup_free_ char *v = dir ? read_line(dir, file) : NULL;
    json_object_set_new(o, key, str_or_null(v));
}

static void report_cgroups(struct doctor *d)
{
    const struct sandbox_host *h = &d->host;
    json_t *cg = json_object();
    _cleanup_free_ char *v2 = cgroup_mount_point(NULL);
    _cleanup_free_ char *v1mem = cgroup_mount_point("memory");
    const char *version = h->cgroup_v2_mount ? "v2"
                          : v1mem && v2      ? "hybrid"
                          : v1mem            ? "v1"
                                             : "none";
    json_object_set_new(cg, "version", json_string(version));
    json_object_set_new(cg, "placement", json_string(cgroup_placement_name(h->cgroup_placement)));
    json_object_set_new(cg, "limits", json_boolean(h->cgroup_mode != CGROUP_NONE));
    if (h->cgroup_v2_mount || !v1mem) {
        json_object_set_new(cg, "mount", str_or_null(v2));
        json_object_set_new(cg, "own", str_or_null(h->cgroup_own));
        add_dir_files(cg, "own_controllers", h->cgroup_own_dir, "cgroup.controllers");
        add_dir_files(cg, "own_subtree_control", h->cgroup_own_dir, "cgroup.subtree_control");
        json_object_set_new(cg, "daemon_leaf", str_or_null(h->cgroup_leaf_dir));
        json_object_set_new(cg, "base", str_or_null(h->cgroup_base[0]));
        add_dir_files(cg, "base_subtree_control", h->cgroup_base[0], "cgroup.subtree_control");
        json_object_set_new(cg, "cpu", json_boolean(h->cgroup_cpu));
        if (h->cgroup_mode == CGROUP_V2 && !h->cgroup_cpu)
            fix(d,
                "the cpu controller is not delegated to %s: sandboxes get no CPU cap; add "
                "it to the parent's cgroup.subtree_control (or Delegate=yes)",
                h->cgroup_own);
    } else {
        /* v1: each controller has a hierarchy of its own. */
        static const char *const names[] = {"memory", "pids", "cpu", "cpuacct"};
        json_t *ctl = json_object();
        for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
            json_t *c = json_object();
            _cleanup_free_ char *mnt = cgroup_mount_point(names[i]);
            json_object_set_new(c, "mount", str_or_null(mnt));
            json_object_set_new(c, "base", str_or_null(h->cgroup_base[i]));
            json_object_set_new(ctl, names[i], c);
        }
        json_object_set_new(cg, "v1_controllers", ctl);
        json_object_set_new(cg, "v2_mount", str_or_null(v2));
    }
    json_object_set_new(cg, "degraded_reason", str_or_null(h->degraded_reason));
    /* doctor itself never re-runs; run, repl, serve, mcp and agent would. */
    bool scope = sandbox_scope_wanted();
    json_object_set_new(cg, "scope_reexec", json_boolean(scope));
    if (scope)
        fix(d, "runcell run, repl, serve, mcp and agent re-run themselves in a systemd scope "
               "with Delegate=yes here (if systemd grants one), and get limits there");
    if (h->cgroup_mode == CGROUP_NONE && h->degraded_reason)
        fix(d, "%s", h->degraded_reason);
    json_object_set_new(d->out, "cgroup", cg);
}

static void report_kernel(struct doctor *d)
{
    const struct sandbox_kernel *k = &d->host.kernel;
    char enforced[1024], missing[1024];
    json_object_set_new(d->out, "kernel", json_string(k->release));
    sandbox_landlock_features(k->landlock_abi, enforced, sizeof(enforced), missing,
                              sizeof(missing));
    json_t *ll = json_object();
    json_object_set_new(ll, "abi", json_integer(k->landlock_abi));
    json_object_set_new(ll, "enforced", json_string(enforced));
    json_object_set_new(ll, "unavailable", json_string(missing));
    json_object_set_new(d->out, "landlock", ll);
    if (!k->landlock_abi)
        fix(d,
            "Landlock is %s: boot with lsm=landlock,... (the sandbox's files are then "
            "confined by Landlock as well as the mount layout)",
            k->landlock_errno == EOPNOTSUPP ? "built but not enabled" : "not in this kernel");
    json_object_set_new(
        d->out, "seccomp",
        json_pack("{s:b,s:b}", "available", k->seccomp, "filter", k->seccomp_filter));
    if (!k->seccomp_filter)
        fix(d, "seccomp filters are not available: use a kernel built with CONFIG_SECCOMP_FILTER");
    json_t *un = json_object();
    json_object_set_new(un, "available", json_boolean(k->userns_errno == 0));
    json_object_set_new(un, "error",
                        k->userns_errno ? json_string(strerror(k->userns_errno)) : json_null());
    json_object_set_new(un, "max_user_namespaces", sysctl_json(k->max_user_namespaces));
    json_object_set_new(un, "unprivileged_userns_clone", sysctl_json(k->unprivileged_userns_clone));
    json_object_set_new(un, "apparmor_restrict_unprivileged_userns",
                        sysctl_json(k->apparmor_restrict_userns));
    json_object_set_new(un, "reason", str_or_null(k->userns_reason));
    json_object_set_new(d->out, "user_namespaces", un);
    if (k->userns_errno)
        fix(d, "%s",
            k->userns_reason ? k->userns_reason
                             : "this process cannot make a user namespace (in a "
                               "container? run runcell on the host or allow nesting)");
    json_object_set_new(d->out, "syscalls",
                        json_pack("{s:b,s:b,s:b,s:b,s:b,s:b}", "clone3", k->clone3,
                                  "clone_into_cgroup", k->clone_into_cgroup, "openat2", k->openat2,
                                  "pidfd_open", k->pidfd_open, "pidfd_send_signal",
                                  k->pidfd_send_signal, "open_tree", k->open_tree));
    if (!k->openat2 || !k->pidfd_open || !k->open_tree)
        fix(d,
            "kernel %s lacks openat2, pidfd_open or open_tree: runcell needs Linux 5.6 or "
            "later",
            k->release);
    json_object_set_new(d->out, "filesystems",
                        json_pack("{s:b,s:b,s:b}", "tmpfs", k->tmpfs, "overlayfs", k->overlayfs,
                                  "cgroup2", k->cgroup2));
}

/* The file system of the run directory: each sandbox makes and removes a few directories
 * there (its workspace's mount point, its root's), cheap on a tmpfs (what /run is on most
 * hosts), 0.7-0.9 ms a sandbox on a disk that discards freed blocks (docs/PERFORMANCE.md). A
 * note for speed, not a fix: limits do not depend on it. */
static void report_run_dir(struct doctor *d)
{
    static const struct {
        unsigned long magic;
        const char *name;
    } known[] = {{TMPFS_MAGIC, "tmpfs"},
                 {EXT4_SUPER_MAGIC, "ext2/3/4"},
                 {XFS_SUPER_MAGIC, "xfs"},
                 {BTRFS_SUPER_MAGIC, "btrfs"},
                 {OVERLAYFS_SUPER_MAGIC, "overlayfs"},
                 {0x2fc12fc1, "zfs"}}; /* not in linux/magic.h */
    struct statfs st;
    json_t *rd = json_object();
    json_object_set_new(rd, "path", json_string(d->host.run_dir));
    if (statfs(d->host.run_dir, &st) == 0) {
        char hex[32];
        snprintf(hex, sizeof(hex), "0x%lx", (unsigned long)st.f_type);
        const char *name = hex;
        for (size_t i = 0; i < ARRAY_SIZE(known); i++)
            if ((unsigned long)st.f_type == known[i].magic)
                name = known[i].name;
        json_object_set_new(rd, "filesystem", json_string(name));
        json_object_set_new(rd, "tmpfs", json_boolean(st.f_type == TMPFS_MAGIC));
    } else {
        json_object_set_new(rd, "filesystem", json_null());
        json_object_set_new(rd, "tmpfs", json_null());
    }
    json_object_set_new(d->out, "run_dir", rd);
}

/* Runs /usr/bin/python3 -c py_check on the host, capped in time and output. */
static void report_python(struct doctor *d)
{
    json_t *py = json_object();
    int p[2];
    pid_t pid;
    char *argv[] = {(char *)"/usr/bin/python3", (char *)"-c", (char *)py_check, NULL};
    char *envp[] = {(char *)"PATH=/usr/bin:/bin", (char *)"MPLBACKEND=Agg", NULL};
    struct buf b;
    buf_init(&b, PY_OUTPUT_CAP);
    posix_spawn_file_actions_t fa;
    if (pipe2(p, O_CLOEXEC) < 0) {
        json_object_set_new(py, "error", json_string(strerror(errno)));
        goto out;
    }
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    /* Its warnings (matplotlib's cache) are not the report's; import errors come in the
     * JSON. */
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    int r = posix_spawn(&pid, argv[0], &fa, NULL, argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    close(p[1]);
    if (r) {
        close(p[0]);
        json_object_set_new(py, "error",
                            json_sprintf("cannot run /usr/bin/python3: %s", strerror(r)));
        goto out;
    }
    double deadline = now_ms_f() + PY_CHECK_MS;
    bool timed_out = false;
    for (;;) {
        struct pollfd pfd = {.fd = p[0], .events = POLLIN};
        int left = (int)(deadline - now_ms_f());
        if (left <= 0 || poll(&pfd, 1, left) == 0) {
            timed_out = true;
            kill(pid, SIGKILL);
            break;
        }
        char chunk[4096];
        ssize_t n = read(p[0], chunk, sizeof(chunk));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0 || buf_append(&b, chunk, (size_t)n) < 0)
            break;
    }
    close(p[0]);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    json_t *v = b.data ? json_loads(b.data, 0, NULL) : NULL;
    if (json_is_object(v))
        json_object_update(py, v);
    else
        json_object_set_new(py, "error", json_string(timed_out ? "timed out" : "no answer"));
    json_decref(v);
out:
    buf_release(&b);
    bool ok = json_is_string(json_object_get(py, "numpy")) &&
              json_is_string(json_object_get(py, "pandas")) &&
              json_is_string(json_object_get(py, "matplotlib"));
    json_object_set_new(py, "ok", json_boolean(ok));
    if (!ok)
        fix(d, "/usr/bin/python3 cannot import numpy, pandas and matplotlib: apt-get install "
               "python3-numpy python3-pandas python3-matplotlib (scripts/install-deps)");
    json_object_set_new(d->out, "python", py);
}

/* A real sandbox: the path every run takes (namespaces, mounts, Landlock, seccomp, cgroup). */
static void report_sandbox(struct doctor *d)
{
    json_t *o = json_object();
    struct run_request req = {.lang = "python",
                              .code = "print('ok')",
                              .timeout_ms = 60000,
                              .output_cap = 4096,
                              .cancel_fd = -1};
    sandbox_limits_fill_defaults(&req.limits);
    struct exec_record rec;
    exec_record_init(&rec, req.output_cap);
    double t0 = now_ms_f();
    int r = run_oneshot(&d->host, &req, &rec);
    json_t *j = r == 0 ? exec_record_json(&rec) : NULL;
    const char *out = json_string_value(json_object_get(j, "stdout"));
    bool ok = rec.status == EXEC_OK && out && !strcmp(out, "ok\n");
    json_object_set_new(o, "ok", json_boolean(ok));
    json_object_set_new(o, "wall_ms", json_real(now_ms_f() - t0));
    json_object_set_new(o, "limits_degraded", json_boolean(rec.limits_degraded));
    if (!ok) {
        const char *msg = json_string_value(json_object_get(j, "message"));
        json_object_set_new(o, "error",
                            json_string(r < 0 ? err_msg()
                                        : msg ? msg
                                              : exec_status_name(rec.status)));
        fix(d, "a sandbox does not start: %s", json_string_value(json_object_get(o, "error")));
    }
    json_decref(j);
    exec_record_release(&rec);
    json_object_set_new(d->out, "sandbox", o);
    d->full &= ok;
}

static void report_template(struct doctor *d, bool skip)
{
    json_t *o = json_object();
    const struct sandbox_host *h = &d->host;
    if (skip || !h->privileged || h->cgroup_mode == CGROUP_NONE) {
        json_object_set_new(o, "ok", json_null());
        json_object_set_new(o, "skipped",
                            json_string(skip             ? "--no-template"
                                        : !h->privileged ? "the template needs root"
                                                         : "the template needs cgroups"));
    } else if (sandbox_host_start_template(&d->host) < 0) {
        json_object_set_new(o, "ok", json_false());
        json_object_set_new(o, "error", json_string(err_msg()));
        fix(d, "the template does not start (sessions start from scratch, slower): %s", err_msg());
    } else {
        json_object_set_new(o, "ok", json_true());
        json_object_set_new(o, "ready_ms", json_real(sandbox_host_template_ready_ms(&d->host)));
    }
    json_object_set_new(d->out, "template", o);
}

static void print_text(json_t *o)
{
    json_t *cg = json_object_get(o, "cgroup");
    const char *sep = "";
    printf("runcell doctor: what this host gives runcell\n\n");
    printf("%-17s %s\n", "kernel", json_string_value(json_object_get(o, "kernel")));
    printf("%-17s %s\n", "running as",
           json_is_true(json_object_get(o, "root")) ? "root" : "an unprivileged user");
    printf("%-17s %s, placement %s, limits %s\n", "cgroups",
           json_string_value(json_object_get(cg, "version")),
           json_string_value(json_object_get(cg, "placement")),
           json_is_true(json_object_get(cg, "limits")) ? "enforced" : "NOT enforced");
    const char *key;
    json_t *val;
    json_object_foreach(cg, key, val)
    {
        if (json_is_string(val) && strcmp(key, "version") && strcmp(key, "placement"))
            printf("  %-15s %s\n", key, json_string_value(val));
    }
    json_t *v1 = json_object_get(cg, "v1_controllers");
    json_object_foreach(v1, key, val)
    {
        const char *base = json_string_value(json_object_get(val, "base"));
        const char *mnt = json_string_value(json_object_get(val, "mount"));
        printf("  %-15s %s\n", key, base ? base : mnt ? "not writable" : "not mounted");
    }
    json_t *ll = json_object_get(o, "landlock");
    json_int_t abi = json_integer_value(json_object_get(ll, "abi"));
    if (abi)
        printf("%-17s ABI %lld\n  %-15s %s\n  %-15s %s\n", "Landlock", (long long)abi, "enforced",
               json_string_value(json_object_get(ll, "enforced")), "unavailable",
               *json_string_value(json_object_get(ll, "unavailable"))
                   ? json_string_value(json_object_get(ll, "unavailable"))
                   : "nothing");
    else
        printf("%-17s not available\n", "Landlock");
    json_t *sc = json_object_get(o, "seccomp");
    printf("%-17s %s\n", "seccomp",
           json_is_true(json_object_get(sc, "filter")) ? "filters available" : "NOT available");
    json_t *un = json_object_get(o, "user_namespaces");
    printf("%-17s %s\n", "user namespaces",
           json_is_true(json_object_get(un, "available"))
               ? "available"
               : json_string_value(json_object_get(un, "error")));
    printf("%-17s ", "system calls");
    json_object_foreach(json_object_get(o, "syscalls"), key, val)
    {
        printf("%s%s %s", sep, key, json_is_true(val) ? "yes" : "no");
        sep = ", ";
    }
    json_t *fs = json_object_get(o, "filesystems");
    printf("\n%-17s tmpfs %s, overlayfs %s (not used by runcell), cgroup2 %s\n", "file systems",
           json_is_true(json_object_get(fs, "tmpfs")) ? "yes" : "no",
           json_is_true(json_object_get(fs, "overlayfs")) ? "yes" : "no",
           json_is_true(json_object_get(fs, "cgroup2")) ? "yes" : "no");
    json_t *rd = json_object_get(o, "run_dir");
    if (rd) {
        const char *fsname = json_string_value(json_object_get(rd, "filesystem"));
        printf("%-17s %s on %s%s\n", "run directory",
               json_string_value(json_object_get(rd, "path")),
               fsname ? fsname : "an unknown file system",
               json_is_false(json_object_get(rd, "tmpfs"))
                   ? " (not a tmpfs: the directories each sandbox makes and removes there cost "
                     "more; a tmpfs, as /run is on most hosts, is faster: RUNCELL_RUNDIR)"
                   : "");
    }
    json_t *sb = json_object_get(o, "sandbox");
    if (json_is_true(json_object_get(sb, "ok")))
        printf("%-17s starts (%.0f ms for print('ok'))\n", "sandbox",
               json_real_value(json_object_get(sb, "wall_ms")));
    else
        printf("%-17s DOES NOT START: %s\n", "sandbox",
               json_string_value(json_object_get(sb, "error")));
    json_t *t = json_object_get(o, "template");
    if (json_is_true(json_object_get(t, "ok")))
        printf("%-17s starts (ready in %.0f ms)\n", "template",
               json_real_value(json_object_get(t, "ready_ms")));
    else if (json_is_null(json_object_get(t, "ok")))
        printf("%-17s not tried: %s\n", "template",
               json_string_value(json_object_get(t, "skipped")));
    else
        printf("%-17s DOES NOT START: %s\n", "template",
               json_string_value(json_object_get(t, "error")));
    json_t *py = json_object_get(o, "python");
    printf("%-17s ", "Python stack");
    sep = "";
    for (const char *const *m = (const char *const[]){"numpy", "pandas", "matplotlib", NULL}; *m;
         m++) {
        const char *ver = json_string_value(json_object_get(py, *m));
        printf("%s%s %s", sep, *m, ver ? ver : "MISSING");
        sep = ", ";
    }
    printf(" (/usr/bin/python3)\n\n");
    printf("full limits: %s\n", json_is_true(json_object_get(o, "full_limits")) ? "yes" : "no");
    json_t *fixes = json_object_get(o, "fixes");
    if (json_array_size(fixes)) {
        printf("what to change:\n");
        size_t i;
        json_array_foreach(fixes, i, val) printf("  - %s\n", json_string_value(val));
    }
}

int cmd_doctor(int argc, char **argv)
{
    struct doctor_opts o = {0};
    int first, r = opttab_parse(&doctor_cmd, argc, argv, &o, &first);
    if (r)
        return r == OPTTAB_HELP ? 0 : r;
    struct doctor d = {.out = json_object(), .fixes = json_array(), .full = true};
    json_object_set_new(d.out, "root", json_boolean(geteuid() == 0));
    if (sandbox_host_init(&d.host) < 0) {
        json_object_set_new(d.out, "error", json_string(err_msg()));
        fix(&d, "%s", err_msg());
        d.full = false;
    } else {
        report_kernel(&d);
        report_run_dir(&d);
        report_cgroups(&d);
        report_sandbox(&d);
        report_template(&d, o.no_template);
    }
    report_python(&d);
    d.full &= d.host.degraded_reason == NULL;
    if (!d.host.privileged && d.host.cgroup_mode != CGROUP_NONE)
        fix(&d, "not running as root: the workspace and /tmp are capped per file only "
                "(RLIMIT_FSIZE), not in total; run as root for size-capped tmpfs workspaces");
    json_object_set_new(d.out, "full_limits", json_boolean(d.full));
    json_object_set_new(d.out, "fixes", d.fixes);
    sandbox_host_release(&d.host);
    if (o.json) {
        json_dumpf(d.out, stdout, JSON_COMPACT);
        fputc('\n', stdout);
    } else {
        print_text(d.out);
    }
    json_decref(d.out);
    return d.full ? 0 : 1;
}
