/* workspace-int.h - the fields of a workspace, private to the sandbox module. */
#ifndef RUNCELL_WORKSPACE_INT_H
#define RUNCELL_WORKSPACE_INT_H

#include "sandbox/sandbox.h"

#include <pthread.h>

/* The workspace's directory, kept open from one scan to the next (an execution makes two):
 * a scan then starts with an lseek where it would walk the path and open it. -1 until the
 * first scan, and again once the session is idle. A scan that finds it in use by another
 * (a file listing beside an execution) opens the directory for itself. */
struct ws_scan_dir {
    pthread_mutex_t lock;
    int fd;
};

struct workspace {
    char *dir;  /* host path of the directory bound at /workspace */
    char *base; /* host directory holding dir and the sandbox roots */
    uid_t uid;  /* host uid the sandbox user (1000) maps to */
    gid_t gid;
    uid_t root_uid;  /* host uid the sandbox's root (0, used by its init only) maps to;
                      * equal to uid when unprivileged (then only 1000 is mapped) */
    int uid_lock_fd; /* flock held on the uid slot while the workspace lives */
    bool mounted;
    dev_t dev; /* its file system, where a scan stays (0: unknown, asked at each scan) */
    struct ws_scan_dir *scan;
};

/* Gives ws a kept directory for its scans (none yet open); workspace_free frees it. */
void workspace_scan_dir_init(struct workspace *ws);

/* Makes name (in dirfd, a directory of the workspace; a link itself, never followed) belong
 * to the sandbox user. 0 or -errno (never when the sandbox user is runcell's own uid). */
int workspace_chown(const struct workspace *ws, int dirfd, const char *name);

#endif
