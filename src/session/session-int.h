/* session-int.h - internals of the session module, shared by its files only. */
#ifndef RUNCELL_SESSION_INT_H
#define RUNCELL_SESSION_INT_H

#include <pthread.h>

#include "session/session.h"

/* ---- event log (events.c): a capped, thread-safe ring of JSON events ---- */
struct event_log {
    pthread_mutex_t lock;
    json_t *ring[SESSION_EVENTS_MAX];
    size_t start, n;
    uint64_t seq;     /* of the newest event */
    uint64_t dropped; /* pushed out of the ring */
};
void event_log_init(struct event_log *l);
void event_log_release(struct event_log *l);
/* Adds ev (reference stolen) with the next seq and the time; returns its seq. */
uint64_t event_log_add(struct event_log *l, json_t *ev);
uint64_t event_log_seq(struct event_log *l);
/* Events with seq above after_seq as an array; type NULL for all. Caller owns it. */
json_t *event_log_since(struct event_log *l, uint64_t after_seq, const char *type);

/* ---- the sandbox side of a network policy (netcfg.c) ---- */
struct sandbox_net {
    struct egress *egress;   /* the proxy; NULL when the policy is "none" */
    struct event_log *log;   /* where its attempts go (borrowed) */
    const char *binds[3];    /* its socket directory at NET_SANDBOX_DIR, for sandbox_spec */
    char **env_extra;        /* proxy variables and PIP_INDEX_URL */
};
/* Starts the egress proxy for n->policy (if any) on ws, logging into log. 0 or -errno. */
int sandbox_net_start(struct sandbox_net *sn, const struct net_opts *n, struct workspace *ws,
                      struct event_log *log);
void sandbox_net_stop(struct sandbox_net *sn);
/* Fills spec's binds, relay and env (default env + extras, which the caller frees with
 * strv_free) for a sandbox on this network. extra_binds (may be NULL) come first. */
char **sandbox_net_apply(const struct sandbox_net *sn, struct sandbox_spec *spec,
                         const char **binds_storage, size_t storage_len,
                         const char *const *extra_binds);

/* ---- running one sandbox to its end (oneshot.c) ---- */
/* Copies files into ws, refusing destinations outside it. 0 or -errno with err_msg(). */
int copy_input_files(struct workspace *ws, const struct input_file *files, size_t n);
struct run_io {
    uint64_t timeout_ms;
    int cancel_fd;       /* -1 for none */
    output_fn on_output; /* may be NULL */
    void *ctx;
};
/* Starts spec (its stdio fds are replaced by pipes and /dev/null) on ws, pumps its output
 * into rec, enforces the timeout and fills rec's status, usage and message. Always returns
 * with rec describing the outcome. */
void run_sandbox(struct sandbox_host *host, struct workspace *ws, struct sandbox_spec *spec,
                 const struct run_io *io, struct exec_record *rec);

/* ---- installing packages (deps.c) ---- */
/* Whether there is anything to install for n on ws (packages, or a requirements.txt when a
 * policy lets pip reach an index). */
bool deps_wanted(const struct net_opts *n, struct workspace *ws);
/* Installs them with pip in a sandbox of its own on ws, within n->install_timeout_ms;
 * returns the report (see session_packages), never NULL. */
json_t *deps_install(struct sandbox_host *host, struct workspace *ws,
                     const struct sandbox_limits *limits, const struct net_opts *n,
                     const struct sandbox_net *sn);

#endif
