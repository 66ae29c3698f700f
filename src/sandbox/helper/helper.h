/* helper.h - internals of runcell-sandbox, the exec'd program that builds one sandbox. */
#ifndef RUNCELL_SANDBOX_HELPER_H
#define RUNCELL_SANDBOX_HELPER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "sandbox/sandbox-int.h"
#include "sandbox/sandbox.h"

/* One read-only or writable bind from the host into the sandbox root. */
struct bind {
    char *src;
    char *dst;
    bool rw;
};

/* The helper's whole input, parsed from the JSON the daemon writes on HELPER_FD_CONFIG. */
struct helper_config {
    char *root_dir;  /* empty host directory that becomes the sandbox root */
    char *workspace; /* host directory bound at /workspace */
    uid_t host_uid;  /* host uid and gid the sandbox user 1000 maps to */
    gid_t host_gid;
    uid_t host_root_uid;     /* host uid and gid the sandbox's root maps to (privileged only) */
    bool privileged;         /* the daemon is root: full id maps, setgroups allowed */
    char **cgroup_procs;     /* cgroup.procs files to join before cloning */
    char *cgroup_dir;        /* v2: the sandbox's cgroup, to clone straight into (clone3) */
    bool cgroup_ns_late;     /* init was cloned into its cgroup: it makes its cgroup namespace */
    char *cgroup_leaf_procs; /* the leaf init moves into once its cgroup namespace is made */
    int cgroup_leaf_fd;      /* ... opened on it before the clone (-1: none) */
    char *instance;          /* the sandbox's 128 random bits in hex (see spawn-int.h) */
    bool retitle;            /* init is a clone of the template: write its command line */
    char **argv;
    char **env;
    char *cwd;
    char *hostname;
    uint64_t tmp_mb, tmp_inodes, shm_mb;
    uint64_t rl_nofile, rl_nproc, rl_cpu_s, rl_fsize_mb, rl_as_mb;
    struct bind *binds;
    size_t n_binds;
    int extra_fds;     /* fds HELPER_FD_EXTRA.. handed to the payload as 3.. */
    bool exec_channel; /* the last of the extra fds is the exec channel (execd.c): init's, never
                        * the payload's */
    bool seccomp;
    bool landlock;
    bool template_profile; /* the template: keeps root in its namespace, maps a uid range */
    uid_t id_range;        /* template: ids 0..id_range-1 map to host_root_uid.. */
    uid_t ns_root_uid;     /* template-made session: ids in the template's namespace */
    uid_t ns_uid;
    char **template_binds; /* template-made session: where the bind fds after the cgroup
                            * fds are attached */
    char *relay_socket;    /* sandbox path of the egress proxy's socket: start the relay */
    uint16_t relay_port;   /* ... listening on 127.0.0.1:relay_port */
};

int config_parse(const char *json, struct helper_config *ret);
/* Frees what config_parse allocated; a zeroed config is a no-op. */
void config_release(struct helper_config *cfg);

/* Every step reports failure with a message to the daemon through the status fd and
 * returns -1; the caller exits. */
void status_write(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int fail_errno(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* rootfs.c: inside the new mount namespace, build the root at cfg->root_dir and pivot.
 * become_sandbox_root() comes first: it pins the host paths and switches to the sandbox's
 * root id when privileged. */
int become_sandbox_root(struct helper_config *cfg);
int mount_tmpfs(const char *dst, unsigned long flags, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int rootfs_setup(struct helper_config *cfg);
/* The sandbox's own /tmp and /var/tmp below root ("" for the cwd, or "/"): a tmpfs each,
 * of cfg->tmp_mb and cfg->tmp_inodes. 0, or -1 after reporting. */
int scratch_mounts(const struct helper_config *cfg, const char *root);
/* Binds root's workspace at its SANDBOX_HOME_DIR. 0, or -1 after reporting. */
int home_bind(const char *root);
/* Covers the host-wide entries of the procfs mounted at proc that the sandbox has no use
 * for with empty read-only ones (0, or -1 after reporting). */
int proc_hide(const char *proc, const char *instance);
/* Moves the calling process into the leaf cgroup through fd (then closed), after its cgroup
 * namespace was made: 0, or -1 after reporting. */
int cgroup_leaf_join(int fd);
/* Overwrites the calling process's command line (as /proc/PID/cmdline shows it) in place with
 * "runcell-sandbox" and the first SANDBOX_INSTANCE_SHORT digits of instance, as much as fits;
 * best effort. */
void init_retitle(const char *instance);
int net_loopback_up(void);

/* lockdown.c: in the payload, every step from setsid to seccomp (0, or -1 after reporting);
 * payload_exec then execs the program and returns only on failure. */
int payload_lockdown(const struct helper_config *cfg, void *seccomp_filter);
void payload_exec(const struct helper_config *cfg, void *seccomp_filter);
/* The payload's lockdown from rlimits to seccomp, for another process of the sandbox (the
 * relay). 0, or -1 after reporting the failure. */
int lockdown(const struct helper_config *cfg, void *seccomp_filter);

/* relay.c: in init, before the payload starts: listens on 127.0.0.1:cfg->relay_port and
 * forks the relay. 0, or -1 after reporting the failure. */
int relay_start(const struct helper_config *cfg, void *seccomp_filter);

/* seccomp.c: the sandbox's filter, compiled when runcell was built (never NULL), and
 * installed with no_new_privs (0, or -1 after reporting). */
void *seccomp_build(void);
int seccomp_install(void *filter);

/* The extra fds the payload gets (the exec channel is not one of them). */
static inline int payload_extra_fds(const struct helper_config *cfg)
{
    return cfg->extra_fds - (cfg->exec_channel ? 1 : 0);
}

/* init.c: PID 1 of the sandbox. Never returns. */
__attribute__((noreturn)) void init_main(struct helper_config *cfg, int sync_fd);
/* Reports "ready" and forks the payload: returns 0 in the payload (signal handling back to
 * the defaults), -1 on failure; in init itself it supervises (and, with an exec channel,
 * starts the process spawner with seccomp_filter when the daemon first asks) and never
 * returns. */
int init_fork_payload(const struct helper_config *cfg, void *seccomp_filter);

/* execd.c: forks the process spawner on channel chan (see execd.c); its pid in init, or -1.
 * Never returns in the child. */
pid_t execd_start(const struct helper_config *cfg, void *seccomp_filter, int chan);

extern int status_fd;

#endif
