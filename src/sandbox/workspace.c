/* workspace.c - the host side of /workspace: a capped tmpfs with its own host uid when
 * running as root, a plain directory otherwise. */
#include "sandbox/workspace-int.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define UID_SLOTS 65536

/* Takes a free host uid slot: an flock on RUNDIR/uids/N held as long as the workspace
 * lives, so concurrent runcell processes never share a uid and a dead one frees its slot. */
static int uid_slot_take(struct sandbox_host *host, unsigned *ret_slot, int *ret_fd)
{
    unsigned start;
    random_bytes(&start, sizeof(start));
    for (unsigned i = 0; i < UID_SLOTS; i++) {
        unsigned slot = (start + i) % UID_SLOTS;
        if (slot == 0)
            continue; /* the template's own ids */
        char path[PATH_MAX];
        snprintf(path, sizeof(path), "%s/uids/%u", host->run_dir, slot);
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0)
            return err_set(errno, "cannot open uid slot %s: %s", path, strerror(errno));
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
            *ret_slot = slot;
            *ret_fd = fd;
            return 0;
        }
        close(fd);
    }
    return err_set(EAGAIN, "all %d sandbox uids are in use", UID_SLOTS);
}

/* The file system the workspace is on, from now on: a scan (every execution's two) need not
 * ask it again. Its own mount, or runcell's directory, neither of which a sandbox can
 * replace. */
static void note_dev(struct workspace *ws)
{
    struct stat st;
    if (stat(ws->dir, &st) == 0)
        ws->dev = st.st_dev;
}

int workspace_new(struct sandbox_host *host, uint64_t disk_mb, struct workspace **ret)
{
    uint64_t seq = atomic_fetch_add(&host->seq, 1);
    struct workspace *ws = xcalloc(1, sizeof(*ws));
    int r;
    ws->uid_lock_fd = -1;
    workspace_scan_dir_init(ws);
    ws->base = xasprintf("%s/%s/w%llu", host->run_dir, host->owner_id, (unsigned long long)seq);
    ws->dir = xasprintf("%s/work", ws->base);
    /* base is traversable (not listable) so that the sandbox's root id can reach the
     * directories below it; the workspace itself is private to the sandbox user. */
    if (mkdir(ws->base, 0711) < 0 || mkdir(ws->dir, 0700) < 0) {
        r = err_set(errno, "cannot create workspace %s: %s", ws->dir, strerror(errno));
        goto fail;
    }
    if (!host->privileged || !disk_mb) {
        ws->uid = ws->root_uid = geteuid();
        ws->gid = getegid();
        note_dev(ws);
        *ret = ws;
        return 0;
    }
    unsigned slot;
    if ((r = uid_slot_take(host, &slot, &ws->uid_lock_fd)) < 0)
        goto fail;
    /* Two host ids per workspace: one for the sandbox user, one for the sandbox's own
     * root, which builds its file system and never runs user code. */
    ws->root_uid = host->uid_base + 2 * slot;
    ws->uid = ws->gid = ws->root_uid + 1;
    char opts[128];
    /* nr_inodes scales with the size: 64 per MB, at least 4096. */
    snprintf(opts, sizeof(opts), "size=%llum,nr_inodes=%llu,mode=0700,uid=%u,gid=%u",
             (unsigned long long)disk_mb, (unsigned long long)MAX(4096, disk_mb * 64),
             (unsigned)ws->uid, (unsigned)ws->gid);
    if (mount("runcell-workspace", ws->dir, "tmpfs", MS_NOSUID | MS_NODEV, opts) < 0) {
        r = err_set(errno, "cannot mount the workspace tmpfs on %s: %s", ws->dir, strerror(errno));
        goto fail;
    }
    ws->mounted = true;
    note_dev(ws);
    *ret = ws;
    return 0;
fail:
    workspace_free(ws);
    return r;
}

void workspace_scan_dir_init(struct workspace *ws)
{
    ws->scan = xcalloc(1, sizeof(*ws->scan));
    pthread_mutex_init(&ws->scan->lock, NULL);
    ws->scan->fd = -1;
}

void workspace_scan_idle(struct workspace *ws)
{
    /* A scan in progress (a listing of a large workspace can take seconds) keeps it: the
     * caller holds its session's lock, which must not wait on that; the next idle pass
     * closes it. */
    if (!ws->scan || pthread_mutex_trylock(&ws->scan->lock) != 0)
        return;
    if (ws->scan->fd >= 0)
        close(ws->scan->fd);
    ws->scan->fd = -1;
    pthread_mutex_unlock(&ws->scan->lock);
}

void workspace_free(struct workspace *ws)
{
    if (!ws)
        return;
    if (ws->scan) { /* first: the tmpfs is freed at its unmount only once nothing holds it */
        if (ws->scan->fd >= 0)
            close(ws->scan->fd);
        pthread_mutex_destroy(&ws->scan->lock);
        free(ws->scan);
    }
    if (ws->mounted && umount2(ws->dir, MNT_DETACH) < 0)
        log_warn("msg=\"cannot unmount workspace\" path=%s error=%s", ws->dir,
                 log_quote(strerror(errno)));
    if (ws->base)
        rm_rf(ws->base);
    if (ws->uid_lock_fd >= 0)
        close(ws->uid_lock_fd);
    free(ws->dir);
    free(ws->base);
    free(ws);
}

int workspace_open(const struct workspace *ws)
{
    int fd = open(ws->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return err_set(errno, "cannot open workspace %s: %s", ws->dir, strerror(errno));
    return fd;
}

int workspace_usage(const struct workspace *ws, uint64_t *ret_used, uint64_t *ret_total)
{
    struct statvfs sv;
    if (statvfs(ws->dir, &sv) < 0)
        return err_set(errno, "cannot measure workspace %s: %s", ws->dir, strerror(errno));
    *ret_total = (uint64_t)sv.f_blocks * sv.f_frsize;
    *ret_used = (uint64_t)(sv.f_blocks - sv.f_bfree) * sv.f_frsize;
    return 0;
}

char *workspace_aside_path(const struct workspace *ws, const char *name)
{
    return xasprintf("%s/%s", ws->base, name);
}

int workspace_chown(const struct workspace *ws, int dirfd, const char *name)
{
    /* Unprivileged, the sandbox user is our own uid: what we make is already its. */
    if (fchownat(dirfd, name, ws->uid, ws->gid, AT_SYMLINK_NOFOLLOW) < 0 && ws->uid != geteuid())
        return -errno;
    return 0;
}
