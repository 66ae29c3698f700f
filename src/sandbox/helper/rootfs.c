/* rootfs.c - the sandbox's file system: a tmpfs root with read-only binds of only what the
 * runtimes need, a capped /tmp, the workspace, fresh /proc and a minimal /dev. */
#include "sandbox/helper/helper.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdlib.h>
#include <net/if.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <linux/mount.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/base.h"

/* Host /etc entries the interpreters need (dynamic loader, time zone, TLS roots, fonts,
 * Debian's Python and matplotlib configuration, BLAS alternatives). Missing ones are
 * skipped; nothing else of the host's /etc is visible. */
static const char *const etc_binds[] = {
    "ld.so.cache",  "ld.so.conf",   "ld.so.conf.d",    "localtime",
    "timezone",     "ssl",          "ca-certificates", "ca-certificates.conf",
    "fonts",        "matplotlibrc", "python3",         "python3.11",
    "alternatives", "mime.types",   "protocols",       "services",
    "gai.conf",     "host.conf",    "inputrc",         "bash.bashrc",
};

static const char *const top_links[] = {"bin", "sbin", "lib", "lib32", "lib64", "libx32"};

static const char *const dev_nodes[] = {"null", "zero", "full", "random", "urandom"};

/* The directories of a usual Linux root that programs (and probes that tell a fresh machine
 * from a reused one) expect to find: empty and read-only here, nothing of the host's. /var/tmp
 * (a capped tmpfs of its own) and /home/user (the workspace again) are mounted on two of them,
 * in a sandbox made from scratch and in each made by the template alike. */
static const char *const root_dirs[] = {"var", "var/tmp", "home", "home/user", "run",
                                        "srv", "opt",     "mnt",  "media"};

/* Flags of an existing mount that a remount must carry over: in a user namespace the kernel
 * locks them, and a remount that would clear one fails with EPERM. */
static unsigned long locked_flags(const char *path)
{
    struct statvfs sv;
    unsigned long f = 0;
    if (statvfs(path, &sv) < 0)
        return 0;
    if (sv.f_flag & ST_NOSUID)
        f |= MS_NOSUID;
    if (sv.f_flag & ST_NODEV)
        f |= MS_NODEV;
    if (sv.f_flag & ST_NOEXEC)
        f |= MS_NOEXEC;
    if (sv.f_flag & ST_NOATIME)
        f |= MS_NOATIME;
    if (sv.f_flag & ST_NODIRATIME)
        f |= MS_NODIRATIME;
    if (sv.f_flag & ST_RELATIME)
        f |= MS_RELATIME;
    return f;
}

static int make_mountpoint(const char *dst, bool dir)
{
    if (dir) {
        if (mkdir_p(dst, 0755) < 0 && errno != EEXIST)
            return fail_errno("cannot create mount point %s", dst);
        return 0;
    }
    _cleanup_free_ char *parent = xstrdup(dst);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = '\0';
        mkdir_p(parent, 0755);
    }
    /* A file that is there already is its own mount point (one of a read-only bind, such as
     * the trust store a session's CA bundle goes over). */
    struct stat st;
    if (stat(dst, &st) == 0 && S_ISREG(st.st_mode))
        return 0;
    int fd = open(dst, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0 && errno != EEXIST)
        return fail_errno("cannot create mount point %s", dst);
    if (fd >= 0)
        close(fd);
    return 0;
}

/* Binds host path src at dst (relative to the new root, which is the cwd). */
static int bind_path(const char *src, const char *dst, bool rw)
{
    struct stat st;
    if (stat(src, &st) < 0)
        return fail_errno("cannot bind %s into the sandbox", src);
    if (make_mountpoint(dst, S_ISDIR(st.st_mode)) < 0)
        return -1;
    if (mount(src, dst, NULL, MS_BIND, NULL) < 0)
        return fail_errno("cannot bind %s into the sandbox", src);
    unsigned long flags = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | locked_flags(dst);
    if (!rw)
        flags |= MS_RDONLY;
    if (mount(NULL, dst, NULL, flags, NULL) < 0)
        return fail_errno("cannot remount %s in the sandbox", dst);
    return 0;
}

int mount_tmpfs(const char *dst, unsigned long flags, const char *fmt, ...)
{
    char opts[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(opts, sizeof(opts), fmt, ap);
    va_end(ap);
    if (mkdir_p(dst, 0755) < 0 && errno != EEXIST)
        return fail_errno("cannot create %s", dst);
    if (mount("tmpfs", dst, "tmpfs", flags, opts) < 0)
        return fail_errno("cannot mount a tmpfs on %s", dst);
    return 0;
}

static int top_level_links(void)
{
    for (size_t i = 0; i < ARRAY_SIZE(top_links); i++) {
        char host[64], target[256];
        struct stat st;
        snprintf(host, sizeof(host), "/%s", top_links[i]);
        if (lstat(host, &st) < 0)
            continue;
        if (S_ISLNK(st.st_mode)) {
            ssize_t n = readlink(host, target, sizeof(target) - 1);
            if (n <= 0)
                continue;
            target[n] = '\0';
            if (symlink(target, top_links[i]) < 0)
                return fail_errno("cannot create /%s in the sandbox", top_links[i]);
        } else if (S_ISDIR(st.st_mode) && bind_path(host, top_links[i], false) < 0) {
            return -1;
        }
    }
    return 0;
}

static int etc_files(const struct helper_config *cfg)
{
    static const char passwd[] = "root:x:0:0:root:/root:/usr/sbin/nologin\n"
                                 "sandbox:x:1000:1000:runcell sandbox:/workspace:/bin/bash\n"
                                 "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
    static const char group[] = "root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n";
    static const char hosts[] = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n";
    static const char nss[] = "passwd: files\ngroup: files\nhosts: files\n";
    char hostname[128];
    snprintf(hostname, sizeof(hostname), "%s\n", cfg->hostname);
    const struct {
        const char *name, *data;
    } files[] = {{"etc/passwd", passwd},
                 {"etc/group", group},
                 {"etc/hosts", hosts},
                 {"etc/nsswitch.conf", nss},
                 {"etc/hostname", hostname}};

    if (mkdir("etc", 0755) < 0)
        return fail_errno("cannot create /etc in the sandbox");
    for (size_t i = 0; i < ARRAY_SIZE(files); i++)
        if (write_file(files[i].name, files[i].data, strlen(files[i].data), 0644) < 0)
            return fail_errno("cannot write /%s in the sandbox", files[i].name);
    for (size_t i = 0; i < ARRAY_SIZE(etc_binds); i++) {
        char host[128], dst[128];
        snprintf(host, sizeof(host), "/etc/%s", etc_binds[i]);
        snprintf(dst, sizeof(dst), "etc/%s", etc_binds[i]);
        if (access(host, F_OK) == 0 && bind_path(host, dst, false) < 0)
            return -1;
    }
    return 0;
}

static int dev_setup(const struct helper_config *cfg)
{
    static const char *const links[][2] = {{"/proc/self/fd", "dev/fd"},
                                           {"/proc/self/fd/0", "dev/stdin"},
                                           {"/proc/self/fd/1", "dev/stdout"},
                                           {"/proc/self/fd/2", "dev/stderr"}};
    if (mount_tmpfs("dev", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k,nr_inodes=64") < 0)
        return -1;
    for (size_t i = 0; i < ARRAY_SIZE(dev_nodes); i++) {
        char host[32], dst[32];
        snprintf(host, sizeof(host), "/dev/%s", dev_nodes[i]);
        snprintf(dst, sizeof(dst), "dev/%s", dev_nodes[i]);
        if (make_mountpoint(dst, false) < 0 || mount(host, dst, NULL, MS_BIND, NULL) < 0)
            return fail_errno("cannot bind %s into the sandbox", host);
    }
    for (size_t i = 0; i < ARRAY_SIZE(links); i++)
        if (symlink(links[i][0], links[i][1]) < 0)
            return fail_errno("cannot create /%s", links[i][1]);
    if (mount_tmpfs("dev/shm", MS_NOSUID | MS_NODEV, "mode=1777,size=%llum,nr_inodes=4096",
                    (unsigned long long)cfg->shm_mb) < 0)
        return -1;
    return 0;
}

static int pivot(void)
{
    /* pivot_root(".", ".") stacks the old root on top of the new one; detaching it leaves
     * only the new root, with nothing of the host reachable by "..". */
    if (syscall(SYS_pivot_root, ".", ".") < 0)
        return fail_errno("pivot_root");
    if (umount2(".", MNT_DETACH) < 0)
        return fail_errno("cannot detach the old root");
    if (chdir("/") < 0)
        return fail_errno("chdir /");
    return 0;
}

static int remount_ro(const char *path)
{
    unsigned long flags = MS_BIND | MS_REMOUNT | MS_RDONLY | locked_flags(path);
    if (mount(NULL, path, NULL, flags, NULL) < 0)
        return fail_errno("cannot make %s read-only", path);
    return 0;
}

/* Replaces a host path by /proc/self/fd/N of an O_PATH fd opened now, while we still
 * have the host access the daemon gave us. */
static int pin_path(char **path)
{
    int fd = open(*path, O_PATH | O_CLOEXEC);
    if (fd < 0)
        return fail_errno("cannot open %s", *path);
    free(*path);
    *path = xasprintf("/proc/self/fd/%d", fd);
    return 0;
}

int become_sandbox_root(struct helper_config *cfg)
{
    if (!cfg->privileged)
        return 0; /* our own uid is already the sandbox's 1000 */
    /* Files can only be created in the sandbox's tmpfs under an id mapped in its user
     * namespace, and host root is not. Pin the private host directories we bind, then
     * become the sandbox's root (a host uid of its own). */
    if (pin_path(&cfg->workspace) < 0)
        return -1;
    for (size_t i = 0; i < cfg->n_binds; i++)
        if (pin_path(&cfg->binds[i].src) < 0)
            return -1;
    if (setgroups(0, NULL) < 0 || setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0)
        return fail_errno("cannot switch to the sandbox's root id");
    return 0;
}

/* Host-wide /proc entries the interpreters have no use for and that say things about the
 * host or its other tenants: the kernel command line, the boot id (one per host boot, the
 * same in every sandbox: each sandbox reads one of its own instead, see proc_hide), pressure
 * stall and memory, disk, interrupt and scheduler
 * statistics, devices, modules, locks and keys. Each is covered by an empty read-only file
 * or directory; the few runtimes read (cpuinfo, meminfo, stat, loadavg, uptime, version)
 * stay, as SECURITY.md says. Entries this kernel lacks are skipped. */
static const char *const proc_hidden_files[] = {
    "cmdline",       "sys/kernel/random/boot_id",
    "vmstat",        "diskstats",
    "partitions",    "swaps",
    "interrupts",    "softirqs",
    "zoneinfo",      "buddyinfo",
    "pagetypeinfo",  "schedstat",
    "sched_debug",   "timer_list",
    "modules",       "devices",
    "misc",          "keys",
    "key-users",     "locks",
    "latency_stats", "kallsyms",
    "slabinfo",      "vmallocinfo",
    "iomem",         "ioports",
    "dma",           "mdstat",
    "consoles",      "cgroups",
    "crypto",        "execdomains",
    "mtrr",          "fb",
    "kcore",         "sysrq-trigger",
    "kpagecount",    "kpageflags",
    "kpagecgroup",   "config.gz",
    "bootconfig",
};
static const char *const proc_hidden_dirs[] = {
    "pressure", "irq", "bus", "fs", "acpi", "scsi", "asound", "driver", "tty", "dynamic_debug",
};

/* A copy of the entry name of the detached mount mnt_fd, read-only, moved over dst; 0, or
 * -1 with errno set (nothing reported yet). */
static int cover_with(int mnt_fd, const char *name, const char *dst)
{
    _cleanup_close_ int t =
        (int)syscall(SYS_open_tree, mnt_fd, name, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    struct mount_attr attr = {.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV |
                                          MOUNT_ATTR_NOEXEC};
    if (t < 0 || syscall(SYS_mount_setattr, t, "", AT_EMPTY_PATH, &attr, sizeof(attr)) < 0 ||
        syscall(SYS_move_mount, t, "", AT_FDCWD, dst, MOVE_MOUNT_F_EMPTY_PATH) < 0)
        return -1; /* errno says why; the caller may still cover it the older way */
    return 0;
}

/* dst covered by the sandbox's /dev/null (a file) or an empty read-only tmpfs (a
 * directory); proc is the sandbox's /proc, whose sibling dev/ holds null. */
static int cover_legacy(const char *proc, const char *dst, bool dir)
{
    int r;
    if (dir) {
        r = mount("tmpfs", dst, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                  "size=4k,nr_inodes=1,mode=0555");
    } else {
        char null_path[256];
        size_t n = strlen(proc);
        snprintf(null_path, sizeof(null_path), "%.*sdev/null", (int)(n >= 4 ? n - 4 : 0), proc);
        r = mount(null_path, dst, NULL, MS_BIND, NULL);
        if (r == 0)
            r = mount(NULL, dst, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC,
                      NULL); /* not nodev: that would make /dev/null unopenable there */
    }
    return r; /* -1 with errno set */
}

#define BOOT_ID "sys/kernel/random/boot_id"

/* The boot id a sandbox reads, from its instance (32 hex digits): a version 4 UUID, as the
 * kernel makes one per boot. out holds 38 bytes. */
static void boot_id_text(const char *instance, char *out)
{
    char hex[33];
    snprintf(hex, sizeof(hex), "%s%.*s", instance, (int)(32 - strnlen(instance, 32)),
             "00000000000000000000000000000000");
    hex[12] = '4';
    hex[16] = "89ab"[(hex[16] >= 'a' ? hex[16] - 'a' + 10 : hex[16] - '0') & 3];
    snprintf(out, 38, "%.8s-%.4s-%.4s-%.4s-%.12s\n", hex, hex + 8, hex + 12, hex + 16, hex + 20);
}

/* Legacy kernels: the boot id file is bound from the private tmpfs, attached for the moment
 * at the hidden directory fs/ (covered right after, like the rest). 0, or -1 with errno. */
static int boot_id_legacy(int mnt, const char *proc, const char *dst)
{
    char src[256];
    snprintf(src, sizeof(src), "%s/fs", proc);
    if (syscall(SYS_move_mount, mnt, "", AT_FDCWD, src, MOVE_MOUNT_F_EMPTY_PATH) < 0)
        return -1;
    snprintf(src, sizeof(src), "%s/fs/boot_id", proc);
    if (mount(src, dst, NULL, MS_BIND, NULL) < 0)
        return -1;
    return mount(NULL, dst, NULL,
                 MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
}

int proc_hide(const char *proc, const char *instance)
{
    /* The empty file and directory live on a tmpfs that is never attached anywhere: no
     * path in the sandbox leads to it but the covers themselves. */
    _cleanup_close_ int fs = (int)syscall(SYS_fsopen, "tmpfs", FSOPEN_CLOEXEC);
    if (fs < 0 || syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "size", "4k", 0) < 0 ||
        syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "nr_inodes", "8", 0) < 0 ||
        syscall(SYS_fsconfig, fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
        return fail_errno("cannot make the empty file system that hides host /proc entries");
    _cleanup_close_ int mnt = (int)syscall(SYS_fsmount, fs, FSMOUNT_CLOEXEC, 0);
    if (mnt < 0)
        return fail_errno("cannot mount the empty file system that hides host /proc entries");
    _cleanup_close_ int f = openat(mnt, "empty", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444);
    if (f < 0 || mkdirat(mnt, "emptydir", 0555) < 0)
        return fail_errno("cannot create the empty file that hides host /proc entries");
    char boot_id[38];
    boot_id_text(instance, boot_id);
    _cleanup_close_ int b = openat(mnt, "boot_id", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444);
    if (b < 0 || write(b, boot_id, 37) != 37)
        return fail_errno("cannot write the sandbox's boot id");
    char dst[256];
    bool legacy = false;
    for (size_t i = 0; i < ARRAY_SIZE(proc_hidden_files) + ARRAY_SIZE(proc_hidden_dirs); i++) {
        bool dir = i >= ARRAY_SIZE(proc_hidden_files);
        const char *name =
            dir ? proc_hidden_dirs[i - ARRAY_SIZE(proc_hidden_files)] : proc_hidden_files[i];
        struct stat st;
        snprintf(dst, sizeof(dst), "%s/%s", proc, name);
        if (lstat(dst, &st) < 0 || !!S_ISDIR(st.st_mode) != dir)
            continue; /* not in this kernel */
        bool own = !strcmp(name, BOOT_ID);
        if (!legacy && cover_with(mnt, dir ? "emptydir" : own ? "boot_id" : "empty", dst) == 0)
            continue;
        /* Older kernels (Debian 12's 6.1) refuse to clone a detached mount (EINVAL): cover
         * the way container runtimes do, /dev/null over files, an empty read-only tmpfs
         * over directories. */
        if (legacy || errno == EINVAL) {
            legacy = true;
            if (own ? boot_id_legacy(mnt, proc, dst) == 0 : cover_legacy(proc, dst, dir) == 0)
                continue;
        }
        return fail_errno("cannot hide %s in the sandbox", dst);
    }
    return 0;
}

int scratch_mounts(const struct helper_config *cfg, const char *root)
{
    const char *const dirs[] = {"tmp", "var/tmp"};
    char dst[64];
    for (size_t i = 0; i < ARRAY_SIZE(dirs); i++) {
        snprintf(dst, sizeof(dst), "%s%s", root, dirs[i]);
        if (mount_tmpfs(dst, MS_NOSUID | MS_NODEV, "mode=1777,size=%llum,nr_inodes=%llu",
                        (unsigned long long)cfg->tmp_mb, (unsigned long long)cfg->tmp_inodes) < 0)
            return -1;
    }
    return 0;
}

int home_bind(const char *root)
{
    char src[64], dst[64];
    /* The same mount again (its flags come with it), not a second copy of the files. */
    snprintf(src, sizeof(src), "%sworkspace", root);
    snprintf(dst, sizeof(dst), "%s%s", root, &SANDBOX_HOME_DIR[1]);
    if (mount(src, dst, NULL, MS_BIND, NULL) < 0)
        return fail_errno("cannot bind the workspace at %s", SANDBOX_HOME_DIR);
    return 0;
}

int rootfs_setup(struct helper_config *cfg)
{
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        return fail_errno("cannot make the sandbox mounts private");
    if (mount("tmpfs", cfg->root_dir, "tmpfs", MS_NOSUID | MS_NODEV,
              "mode=0755,size=1m,nr_inodes=4096") < 0)
        return fail_errno("cannot mount the sandbox root on %s", cfg->root_dir);
    if (chdir(cfg->root_dir) < 0)
        return fail_errno("chdir %s", cfg->root_dir);
    if (bind_path("/usr", "usr", false) < 0 || top_level_links() < 0 || etc_files(cfg) < 0)
        return -1;
    for (size_t i = 0; i < ARRAY_SIZE(root_dirs); i++)
        if (mkdir(root_dirs[i], 0755) < 0)
            return fail_errno("cannot create /%s in the sandbox", root_dirs[i]);
    if (bind_path(cfg->workspace, "workspace", true) < 0 || home_bind("") < 0)
        return -1;
    if (scratch_mounts(cfg, "") < 0)
        return -1;
    if (dev_setup(cfg) < 0)
        return -1;
    if (mkdir("proc", 0555) < 0 ||
        mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
        return fail_errno("cannot mount /proc in the sandbox");
    /* Not in the template: its sessions mount a /proc of their own (and hide its entries
     * there), which the kernel allows only while this one has no covers over files. */
    if (!cfg->template_profile && proc_hide("proc", cfg->instance) < 0)
        return -1;
    for (size_t i = 0; i < cfg->n_binds; i++)
        if (bind_path(cfg->binds[i].src, cfg->binds[i].dst + 1, cfg->binds[i].rw) < 0)
            return -1;
    if (pivot() < 0 || remount_ro("/dev") < 0 || remount_ro("/") < 0)
        return -1;
    return 0;
}

int net_loopback_up(void)
{
    _cleanup_close_ int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq ifr = {0};
    if (s < 0)
        return fail_errno("cannot open a socket to configure loopback");
    strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
    if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0)
        return fail_errno("cannot read loopback flags");
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
        return fail_errno("cannot bring loopback up");
    return 0;
}
