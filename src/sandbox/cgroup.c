/* cgroup.c - per-sandbox cgroups on v2, or on the v1 controllers of a hybrid host. */
#include "sandbox/cgroup-int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
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

/* Value of "key N" in a flat keyed file such as memory.events or cpu.stat. */
static int read_keyed(const char *dir, const char *file, const char *key, uint64_t *ret)
{
    char text[4096];
    int r = read_small(dir, file, text, sizeof(text));
    if (r < 0)
        return r;
    size_t klen = strlen(key);
    for (char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (!strncmp(line, key, klen) && line[klen] == ' ') {
            *ret = strtoull(line + klen + 1, NULL, 10);
            return 0;
        }
    }
    return -ENOENT;
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

/* Our own cgroup path in the hierarchy that lists `controller` ("" for the v2 line). */
static char *own_cgroup_path(const char *controller)
{
    _cleanup_free_ char *text = NULL;
    char *path = NULL;
    size_t len;
    if (read_file("/proc/self/cgroup", 65536, &text, &len) < 0 ||
        cgroup_parse_own(text, controller, &path) < 0)
        return NULL;
    return path;
}

/* Mount point of the cgroup file system carrying `controller` (v1), or of cgroup2 when
 * controller is NULL. */
static char *cgroup_mount(const char *controller)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
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

static bool detect_v2(struct sandbox_host *host)
{
    _cleanup_free_ char *mnt = cgroup_mount(NULL);
    _cleanup_free_ char *own = own_cgroup_path("");
    char ctrls[512];
    if (!mnt || !own || strcmp(mnt, "/sys/fs/cgroup"))
        return false; /* hybrid hosts keep an empty v2 tree elsewhere */
    _cleanup_free_ char *own_dir = xasprintf("%s%s", mnt, strcmp(own, "/") ? own : "");
    if (read_small(own_dir, "cgroup.controllers", ctrls, sizeof(ctrls)) < 0 ||
        !has_controller(ctrls, "memory") || !has_controller(ctrls, "pids"))
        return false;
    /* The "no internal processes" rule: controllers can only be handed down from a cgroup
     * without processes of its own. When ours has some (us), move us into a leaf first. */
    const char *enable = has_controller(ctrls, "cpu") ? "+memory +pids +cpu" : "+memory +pids";
    if (write_str(own_dir, "cgroup.subtree_control", enable) < 0 && strcmp(own, "/")) {
        _cleanup_free_ char *leaf = xasprintf("%s/runcell-daemon", own_dir);
        char pid[32];
        snprintf(pid, sizeof(pid), "%d", getpid());
        if ((mkdir(leaf, 0755) < 0 && errno != EEXIST) ||
            write_str(leaf, "cgroup.procs", pid) < 0 ||
            write_str(own_dir, "cgroup.subtree_control", enable) < 0)
            return false;
    }
    char *base = join_base(mnt, own);
    if ((mkdir(base, 0755) < 0 && errno != EEXIST) ||
        write_str(base, "cgroup.subtree_control", enable) < 0) {
        free(base);
        return false;
    }
    host->cgroup_base[0] = base;
    host->cgroup_mode = CGROUP_V2;
    return true;
}

static bool detect_v1(struct sandbox_host *host)
{
    for (int i = 0; i < CG_N; i++) {
        _cleanup_free_ char *mnt = cgroup_mount(v1_names[i]);
        _cleanup_free_ char *own = own_cgroup_path(v1_names[i]);
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
    if (getenv("RUNCELL_NO_CGROUPS")) {
        host->degraded_reason = xstrdup("cgroups disabled by RUNCELL_NO_CGROUPS");
        return;
    }
    if (detect_v2(host) || detect_v1(host))
        return;
    host->degraded_reason =
        xstrdup("cannot create cgroups under /sys/fs/cgroup (memory and pids controllers); "
                "run as root or delegate a cgroup to this user");
}

static int v1_limits(struct cgroup *cg, const struct sandbox_limits *l)
{
    char v[64];
    snprintf(v, sizeof(v), "%llu", (unsigned long long)l->memory_mb << 20);
    int r = write_str(cg->dirs[CG_MEMORY], "memory.limit_in_bytes", v);
    if (r < 0)
        return err_set(-r, "cannot set memory.limit_in_bytes in %s: %s", cg->dirs[CG_MEMORY],
                       strerror(-r));
    /* Swap accounting may be off; where it is on, swap counts against the same limit. */
    (void)write_str(cg->dirs[CG_MEMORY], "memory.memsw.limit_in_bytes", v);
    snprintf(v, sizeof(v), "%llu", (unsigned long long)l->pids);
    if ((r = write_str(cg->dirs[CG_PIDS], "pids.max", v)) < 0)
        return err_set(-r, "cannot set pids.max in %s: %s", cg->dirs[CG_PIDS], strerror(-r));
    if (cg->dirs[CG_CPU]) {
        (void)write_str(cg->dirs[CG_CPU], "cpu.cfs_period_us", "100000");
        snprintf(v, sizeof(v), "%llu", (unsigned long long)l->cpus_milli * 100);
        if ((r = write_str(cg->dirs[CG_CPU], "cpu.cfs_quota_us", v)) < 0)
            return err_set(-r, "cannot set cpu.cfs_quota_us in %s: %s", cg->dirs[CG_CPU],
                           strerror(-r));
    }
    return 0;
}

static int v2_limits(struct cgroup *cg, const struct sandbox_limits *l)
{
    char v[64];
    const char *dir = cg->dirs[0];
    snprintf(v, sizeof(v), "%llu", (unsigned long long)l->memory_mb << 20);
    int r = write_str(dir, "memory.max", v);
    if (r < 0)
        return err_set(-r, "cannot set memory.max in %s: %s", dir, strerror(-r));
    (void)write_str(dir, "memory.swap.max", "0");
    snprintf(v, sizeof(v), "%llu", (unsigned long long)l->pids);
    if ((r = write_str(dir, "pids.max", v)) < 0)
        return err_set(-r, "cannot set pids.max in %s: %s", dir, strerror(-r));
    snprintf(v, sizeof(v), "%llu 100000", (unsigned long long)l->cpus_milli * 100);
    (void)write_str(dir, "cpu.max", v); /* cpu may not be delegated */
    return 0;
}

int cgroup_apply_limits(struct cgroup *cg, const struct sandbox_limits *limits)
{
    return cg->mode == CGROUP_V2 ? v2_limits(cg, limits) : v1_limits(cg, limits);
}

int cgroup_create(const struct sandbox_host *host, const char *name,
                  const struct sandbox_limits *limits, struct cgroup **ret)
{
    struct cgroup *cg = xcalloc(1, sizeof(*cg));
    cg->mode = host->cgroup_mode;
    int n = cg->mode == CGROUP_V2 ? 1 : CG_N;
    for (int i = 0; i < n; i++) {
        if (!host->cgroup_base[i])
            continue;
        cg->dirs[i] = xasprintf("%s/%s", host->cgroup_base[i], name);
        if (mkdir(cg->dirs[i], 0755) < 0) {
            int e = errno;
            err_set(e, "cannot create cgroup %s: %s; run as root or delegate a cgroup",
                    cg->dirs[i], strerror(e));
            cgroup_free(cg);
            return -e;
        }
    }
    int r = cgroup_apply_limits(cg, limits);
    if (r < 0) {
        cgroup_free(cg);
        return r;
    }
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

int cgroup_read_usage(const struct cgroup *cg, double *ret_cpu_ms, uint64_t *ret_peak_kb,
                      uint64_t *ret_oom_kills)
{
    char text[128];
    uint64_t v = 0;
    *ret_cpu_ms = 0;
    *ret_peak_kb = 0;
    *ret_oom_kills = 0;
    if (cg->mode == CGROUP_V2) {
        const char *dir = cg->dirs[0];
        if (read_keyed(dir, "cpu.stat", "usage_usec", &v) == 0)
            *ret_cpu_ms = (double)v / 1000.0;
        if (read_small(dir, "memory.peak", text, sizeof(text)) == 0 ||
            read_small(dir, "memory.current", text, sizeof(text)) == 0)
            *ret_peak_kb = strtoull(text, NULL, 10) / 1024;
        if (read_keyed(dir, "memory.events", "oom_kill", &v) == 0)
            *ret_oom_kills = v;
        return 0;
    }
    if (cg->dirs[CG_CPUACCT] &&
        read_small(cg->dirs[CG_CPUACCT], "cpuacct.usage", text, sizeof(text)) == 0)
        *ret_cpu_ms = (double)strtoull(text, NULL, 10) / 1e6;
    if (read_small(cg->dirs[CG_MEMORY], "memory.max_usage_in_bytes", text, sizeof(text)) == 0)
        *ret_peak_kb = strtoull(text, NULL, 10) / 1024;
    if (read_keyed(cg->dirs[CG_MEMORY], "memory.oom_control", "oom_kill", &v) == 0)
        *ret_oom_kills = v;
    return 0;
}

void cgroup_reset_peak(const struct cgroup *cg)
{
    if (cg->mode == CGROUP_V2)
        (void)write_str(cg->dirs[0], "memory.peak", "reset");
    else if (cg->dirs[CG_MEMORY])
        (void)write_str(cg->dirs[CG_MEMORY], "memory.max_usage_in_bytes", "0");
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
    log_warn("msg=\"cannot remove cgroup\" path=%s error=\"%s\"", dir, strerror(errno));
}

void cgroup_free(struct cgroup *cg)
{
    if (!cg)
        return;
    cgroup_kill_all(cg);
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
            remove_dir(dir);
            log_info("msg=\"removed leftover cgroup\" path=%s", dir);
        }
        closedir(d);
    }
}
