/* spawn-int.h - what spawn.c and template.c share inside the sandbox module. */
#ifndef RUNCELL_SPAWN_INT_H
#define RUNCELL_SPAWN_INT_H

#include <jansson.h>
#include <pthread.h>

#include "sandbox/sandbox-int.h"
#include "sandbox/sandbox.h"
#include "sandbox/workspace-int.h"

struct sandbox {
    struct sandbox_host *host;
    char *name;
    /* 128 random bits in hex, one sandbox's own: its boot id, and (the first 64) the name of
     * its cgroup leaf and the argument of its PID 1, so that each sandbox looks new inside,
     * as a fresh machine does (docs/SECURITY.md) */
    char instance[33];
    char *root_dir;
    pid_t init_pid; /* in our PID namespace; 0 until known */
    int pidfd;
    int status_fd; /* read side of the helper's status lines; -1 after EOF */
    struct buf status_buf;
    struct cgroup *cgroup;
    bool limits_degraded;
    enum sandbox_state state;
    bool exited;     /* the payload's status is known */
    int exit_code;   /* valid when exited and !signal */
    int term_signal; /* nonzero when the payload died of a signal */
    char *error;     /* setup failure reported by the helper */
    uint64_t oom_kills_at_start;
    bool foreign;     /* init is the template's child, not ours: never wait4 it */
    double ru_cpu_ms; /* rusage of init and everything it reaped, once reaped */
    uint64_t ru_maxrss_kb;
    double started_ms;
    int exec_fd;               /* the daemon's end of the exec channel, or -1 */
    pthread_mutex_t exec_lock; /* one request and its reply at a time */
    int64_t exec_seq;          /* the id of the last request */
};

/* A sandbox struct with its name, cgroup and limits set up, not yet started. */
int sandbox_prepare(struct sandbox_host *host, const struct sandbox_spec *spec,
                    struct sandbox **ret);
/* The JSON configuration of sb for the helper (or the template); caller decrefs. */
json_t *sandbox_config(const struct sandbox *sb, const struct workspace *ws,
                       const struct sandbox_spec *spec);
/* Asks the template to make sb; on success sb runs. 0 or -errno with err_msg(). */
int template_spawn(struct sandbox_host *host, struct sandbox *sb, struct workspace *ws,
                   const struct sandbox_spec *spec);
void template_stop(struct sandbox_host *host);

#endif
