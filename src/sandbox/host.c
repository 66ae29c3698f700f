/* host.c - per-process sandbox context: helper location, runtime directory, cgroups,
 * and the sweep of what dead runcell processes left behind. */
#include "sandbox/cgroup-int.h"
#include "sandbox/spawn-int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef RUNCELL_LIBEXECDIR
#define RUNCELL_LIBEXECDIR "/usr/local/libexec/runcell"
#endif

#define DEFAULT_UID_BASE 1000000000u

void sandbox_limits_fill_defaults(struct sandbox_limits *l)
{
    if (!l->memory_mb)
        l->memory_mb = SANDBOX_DEFAULT_MEMORY_MB;
    if (!l->pids)
        l->pids = SANDBOX_DEFAULT_PIDS;
    if (!l->disk_mb)
        l->disk_mb = SANDBOX_DEFAULT_DISK_MB;
    if (!l->cpus_milli)
        l->cpus_milli = SANDBOX_DEFAULT_CPUS_MILLI;
    if (!l->nofile)
        l->nofile = SANDBOX_DEFAULT_NOFILE;
}

char **sandbox_default_env(void)
{
    static const char *const env[] = {
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME=/workspace",
        "USER=sandbox",
        "LOGNAME=sandbox",
        "SHELL=/bin/bash",
        "LANG=C.UTF-8",
        "TMPDIR=/tmp",
        "TERM=dumb",
        "MPLBACKEND=Agg",
        "MPLCONFIGDIR=/tmp/.matplotlib",
        "XDG_CACHE_HOME=/tmp/.cache",
        "PYTHONUNBUFFERED=1",
        "PYTHONUSERBASE=/workspace/.local",
        "PIP_USER=1",
        "PIP_BREAK_SYSTEM_PACKAGES=1",
        "PIP_DISABLE_PIP_VERSION_CHECK=1",
        "PIP_NO_INPUT=1",
    };
    char **v = xcalloc(1, sizeof(char *));
    for (size_t i = 0; i < ARRAY_SIZE(env); i++)
        v = strv_push(v, env[i]);
    return v;
}

/* Field 22 of /proc/PID/stat: start time in clock ticks since boot. */
static int proc_starttime(pid_t pid, unsigned long long *ret)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    if (n <= 0)
        return -EIO;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* comm may hold spaces and parens */
    if (!p)
        return -EIO;
    int field = 2;
    for (p++; *p && field < 22; p++)
        if (*p == ' ')
            field++;
    *ret = strtoull(p, NULL, 10);
    return 0;
}

bool owner_alive(const char *owner_id)
{
    unsigned long long start, now;
    long pid;
    if (sscanf(owner_id, "%ld-%llu", &pid, &start) != 2 || pid <= 0)
        return false;
    if (proc_starttime((pid_t)pid, &now) < 0)
        return false;
    return now == start;
}

static char *find_libexec_dir(void)
{
    const char *env = getenv("RUNCELL_LIBEXEC");
    if (env && *env)
        return xstrdup(env);
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    char *slash = n > 0 ? memrchr(exe, '/', (size_t)n) : NULL;
    if (slash) {
        *slash = '\0'; /* the build directory, or the install's libexec when linked there */
        _cleanup_free_ char *probe = xasprintf("%s/runcell-sandbox", exe);
        /* EACCES: it is there but out of this user's reach (a 0700 directory on the way);
         * that, not a missing install, is what sandbox_host_init must report. */
        if (access(probe, X_OK) == 0 || errno == EACCES)
            return xstrdup(exe);
    }
    return xstrdup(RUNCELL_LIBEXECDIR);
}

static char *pick_run_dir(void)
{
    const char *env = getenv("RUNCELL_RUNDIR");
    if (env && *env)
        return xstrdup(env);
    if (geteuid() == 0)
        return xstrdup("/run/runcell");
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    if (xdg && *xdg && access(xdg, W_OK) == 0)
        return xasprintf("%s/runcell", xdg);
    return xasprintf("/tmp/runcell-%u", (unsigned)geteuid());
}

static int check_run_dir(const char *dir)
{
    struct stat st;
    if (mkdir_p(dir, 0711) < 0)
        return err_set(errno,
                       "cannot create the runtime directory %s: %s; set RUNCELL_RUNDIR "
                       "to a writable directory",
                       dir, strerror(errno));
    if (lstat(dir, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid())
        return err_set(EPERM,
                       "runtime directory %s is not a directory owned by uid %u; "
                       "remove it or set RUNCELL_RUNDIR",
                       dir, (unsigned)geteuid());
    if ((st.st_mode & 022) && chmod(dir, 0711) < 0)
        return err_set(errno, "cannot restrict permissions of %s", dir);
    return 0;
}

/* Unmounts every mount below prefix (deepest first), as a dead process may have left
 * workspace tmpfs mounts behind. */
static void unmount_below(const char *prefix)
{
    size_t plen = strlen(prefix);
    for (int round = 0; round < 8; round++) {
        FILE *f = fopen("/proc/self/mountinfo", "re");
        char line[4096], mnt[PATH_MAX];
        char *deepest = NULL;
        if (!f)
            return;
        while (fgets(line, sizeof(line), f)) {
            if (sscanf(line, "%*s %*s %*s %*s %4095s", mnt) != 1)
                continue;
            if (!strncmp(mnt, prefix, plen) && mnt[plen] == '/' &&
                (!deepest || strlen(mnt) > strlen(deepest))) {
                free(deepest);
                deepest = xstrdup(mnt);
            }
        }
        fclose(f);
        if (!deepest)
            return;
        if (umount2(deepest, MNT_DETACH) < 0)
            log_warn("msg=\"cannot unmount leftover\" path=%s error=%s", deepest,
                     log_quote(strerror(errno)));
        free(deepest);
    }
}

static void sweep_run_dir(const struct sandbox_host *host)
{
    DIR *d = opendir(host->run_dir);
    struct dirent *e;
    if (!d)
        return;
    while ((e = readdir(d))) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9' || owner_alive(e->d_name))
            continue;
        _cleanup_free_ char *path = xasprintf("%s/%s", host->run_dir, e->d_name);
        unmount_below(path);
        if (rm_rf(path) == 0)
            log_info("msg=\"removed leftover sandbox files\" path=%s", path);
    }
    closedir(d);
}

int sandbox_host_init(struct sandbox_host *host)
{
    return sandbox_host_init_with(host, 0);
}

int sandbox_host_init_with(struct sandbox_host *host, unsigned flags)
{
    unsigned long long start = 0;
    memset(host, 0, sizeof(*host));
    host->libexec_dir = find_libexec_dir();
    host->helper_path = xasprintf("%s/runcell-sandbox", host->libexec_dir);
    if (access(host->helper_path, X_OK) < 0 && errno == EACCES)
        return err_set(EACCES,
                       "cannot run the sandbox helper %s as uid %u: permission denied "
                       "(a directory on its path, such as a 0700 one from mktemp, is not "
                       "searchable by this user); chmod o+x that directory or build elsewhere",
                       host->helper_path, (unsigned)geteuid());
    if (access(host->helper_path, X_OK) < 0)
        return err_set(ENOENT,
                       "cannot find the sandbox helper %s; build runcell (make) or set "
                       "RUNCELL_LIBEXEC",
                       host->helper_path);
    host->privileged = geteuid() == 0;
    const char *base = getenv("RUNCELL_UID_BASE");
    uint64_t ub;
    host->uid_base = base && parse_u64(base, &ub) == 0 ? (uid_t)ub : DEFAULT_UID_BASE;
    proc_starttime(getpid(), &start);
    host->owner_id = xasprintf("%d-%llu", getpid(), start);
    _cleanup_free_ char *top = pick_run_dir();
    int r = check_run_dir(top);
    if (r < 0)
        return r;
    host->run_dir = TAKE_PTR(top);
    sandbox_kernel_probe(&host->kernel, !(flags & SANDBOX_HOST_ONE_SHOT));
    sandbox_kernel_log(&host->kernel);
    cgroup_host_detect(host);
    if (!host->privileged && !host->degraded_reason)
        host->degraded_reason = xstrdup("not running as root: workspace and /tmp sizes are "
                                        "capped per file only");
    sweep_run_dir(host);
    cgroup_sweep(host);
    _cleanup_free_ char *own = xasprintf("%s/%s", host->run_dir, host->owner_id);
    if (mkdir(own, 0711) < 0 && errno != EEXIST)
        return err_set(errno, "cannot create %s: %s", own, strerror(errno));
    _cleanup_free_ char *uids = xasprintf("%s/uids", host->run_dir);
    if (host->privileged && mkdir(uids, 0700) < 0 && errno != EEXIST)
        return err_set(errno, "cannot create %s: %s", uids, strerror(errno));
    return 0;
}

void sandbox_host_release(struct sandbox_host *host)
{
    template_stop(host);
    if (host->run_dir && host->owner_id) {
        _cleanup_free_ char *own = xasprintf("%s/%s", host->run_dir, host->owner_id);
        unmount_below(own);
        rm_rf(own);
    }
    free(host->helper_path);
    free(host->libexec_dir);
    free(host->run_dir);
    free(host->owner_id);
    cgroup_host_release(host);
    free(host->degraded_reason);
    free(host->cgroup_v2_mount);
    free(host->cgroup_own);
    free(host->cgroup_own_dir);
    memset(host, 0, sizeof(*host));
}
