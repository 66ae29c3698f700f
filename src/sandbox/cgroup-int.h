/* cgroup-int.h - cgroup v1/v2 handling, private to the sandbox module. */
#ifndef RUNCELL_CGROUP_INT_H
#define RUNCELL_CGROUP_INT_H

#include "sandbox/sandbox.h"

enum { CG_MEMORY, CG_PIDS, CG_CPU, CG_CPUACCT, CG_N };

struct cgroup {
    enum cgroup_mode mode;
    char *dirs[CG_N];     /* v1: one per controller (NULL when absent); v2: dirs[0] */
    char *leaf_dir;       /* the sandbox's processes' own cgroup below dirs[] in one hierarchy
                           * (v1 pids, v2 the unified one), named after the sandbox: what its
                           * cgroup namespace, rooted at dirs[], shows inside; NULL: none */
    int peak_fd;          /* v2: memory.peak, open for the cgroup's life (-1: none) */
    int usage_fd[3];      /* what cgroup_read_usage reads, open for the cgroup's life (-1:
                           * none, read by path): v2 cpu.stat, memory.events; v1
                           * cpuacct.usage, memory.max_usage_in_bytes (read-write: the
                           * reset), memory.oom_control */
    bool peak_resettable; /* v2: writing peak_fd resets what it reads (Linux 6.12+) */
    bool usage_closed;    /* peak_fd and usage_fd[] closed while the sandbox is idle */
    bool has_applied;     /* applied holds the limits last written in full */
    struct sandbox_limits applied;
};

/* Sets host->cgroup_mode and host->cgroup_base[], creating the "runcell" base cgroups.
 * Leaves CGROUP_NONE and host->degraded_reason set when nothing can be written. */
void cgroup_host_detect(struct sandbox_host *host);
/* Undoes what cgroup_host_detect made: the base (when empty), and on v2 the daemon's leaf
 * (moving us back into our cgroup and disabling the controllers we enabled there). */
void cgroup_host_release(struct sandbox_host *host);
/* Creates the cgroup named name with limits applied, and in it the leaf named leaf (which
 * carries no limits of its own: its parent's hold); caller frees with cgroup_free. */
int cgroup_create(const struct sandbox_host *host, const char *name, const char *leaf,
                  const struct sandbox_limits *limits, struct cgroup **ret);
/* Writes the limits again (a running sandbox's new limits); nothing when they are those
 * last written (a pooled session handed over with the limits it was made with). */
int cgroup_apply_limits(struct cgroup *cg, const struct sandbox_limits *limits);
/* The cgroup.procs files a process writes its pid to, to join; caller frees (strv). The
 * sandbox's init joins them, makes its cgroup namespace (rooted there), then moves into the
 * leaf through cgroup_leaf_procs_file (NULL when there is none; caller frees). */
char **cgroup_procs_files(const struct cgroup *cg);
char *cgroup_leaf_procs_file(const struct cgroup *cg);
/* The CPU time of cg alone (cgroup_read_usage's first figure, one read). 0 or -ENODATA. */
int cgroup_read_cpu(const struct cgroup *cg, double *ret_cpu_ms);
/* The memory charged to cg now, in bytes, and of it the page cache. 0 or -errno. */
int cgroup_read_memory(const struct cgroup *cg, uint64_t *ret_used, uint64_t *ret_cache);
/* CPU time, peak memory and (unless ret_oom_kills is NULL) the OOM kills so far. */
int cgroup_read_usage(const struct cgroup *cg, double *ret_cpu_ms, uint64_t *ret_peak_kb,
                      uint64_t *ret_oom_kills);
void cgroup_kill_all(const struct cgroup *cg);
/* Freezes (or thaws) every task of the cgroup with the v2 freezer and waits until it is
 * settled: 0, -EOPNOTSUPP on v1 (the caller stops the tasks itself), -ETIMEDOUT when a freeze
 * did not settle within 2 s (it is undone), or -errno. */
int cgroup_freeze(const struct cgroup *cg, bool freeze);
/* Starts a new peak measurement: v1 resets memory.max_usage_in_bytes; v2 writes memory.peak
 * through the cgroup's own descriptor, where the kernel lets it (the reset counts only for
 * reads through that descriptor). */
void cgroup_reset_peak(const struct cgroup *cg);
/* Closes the usage files (an idle sandbox's descriptors back), and opens them again. */
void cgroup_usage_close(struct cgroup *cg);
void cgroup_usage_reopen(struct cgroup *cg);
/* Whether the peak cgroup_read_usage reports is since the last reset ("cell") or since the
 * cgroup was made ("session": v2 before Linux 6.12). */
bool cgroup_peak_per_cell(const struct cgroup *cg);
/* Kills what is left, removes the directories; NULL is a no-op. */
void cgroup_free(struct cgroup *cg);
/* Removes cgroups whose owning runcell process is gone. */
void cgroup_sweep(const struct sandbox_host *host);

/* True when the runcell process named by owner_id ("<pid>-<starttime>") still runs. */
bool owner_alive(const char *owner_id);

#endif
