/* serve.h - runcell's HTTP server (`runcell serve`): the contract for the CLI. */
#ifndef RUNCELL_SERVE_H
#define RUNCELL_SERVE_H

#include <stdbool.h>
#include <stdint.h>

#include "agent/agent.h"
#include "session/session.h"
#include "store/store.h"

/* What a request may ask for at most, and how much the server takes on. */
struct server_limits {
    size_t max_sessions;
    size_t max_executions;        /* running at once, across sessions and one-shot runs */
    size_t max_queued_executions; /* waiting to run, across sessions (more are refused) */
    size_t max_snapshots;         /* kept in the store at once */
    size_t max_connections;
    size_t max_connections_per_peer; /* from one client address; 0: no cap */
    size_t max_unauthenticated;      /* open without having shown the token; 0: no cap */
    uint64_t header_timeout_ms;      /* idle time allowed before the token is shown */
    uint64_t max_body_bytes;         /* JSON request bodies */
    uint64_t max_upload_bytes;       /* one file upload */
    uint64_t max_memory_mb;
    uint64_t max_pids;
    uint64_t max_disk_mb;
    uint64_t max_cpus_milli;
    uint64_t max_timeout_ms;
    uint64_t max_idle_timeout_ms;
    uint64_t max_net_connections; /* per session, through the egress proxy at once */
    uint64_t max_net_bytes;       /* per session, through the egress proxy in all */
    uint64_t max_install_timeout_ms;
};
void server_limits_fill_defaults(struct server_limits *l);

struct server_config {
    const char *listen;   /* "HOST:PORT", default 127.0.0.1:8080 */
    const char *data_dir; /* token and state; created 0700 */
    const char *token;    /* NULL: RUNCELL_TOKEN, then DATA/token, else generated */
    struct server_limits limits;
    struct session_opts defaults;           /* for sessions that do not say */
    uint64_t shutdown_grace_ms;             /* running cells get this long on SIGTERM */
    bool no_template;                       /* make every session from scratch */
    size_t pool_size;                       /* sessions kept ready (made with the defaults) */
    const struct net_policy *net_allow_max; /* what network allowlists may name at most;
                                             * NULL: anything */
    char *const *mcp_origins;   /* Origins allowed on /mcp besides loopback ones (NULL-ended) */
    struct store_config store;  /* url NULL: DATA/store */
    uint64_t store_max_files;   /* per session; 0 = DEFAULT_STORE_MAX_FILES */
    uint64_t store_quota_bytes; /* per session; 0 = no limit */
    const char *secrets_key;    /* a key file: sessions' secrets are kept in their records,
                                 * sealed with it (docs/NETWORK.md); NULL: never kept */
    struct llm_config agent;    /* the model endpoint of POST /v1/agent/runs */
    const char *review_webhook; /* review incidents are also POSTed here, or NULL */
    bool e2b;                   /* serve E2B's routes too (docs/E2B.md) */
    bool e2b_internet;          /* E2B sandboxes get the public internet unless they say
                                 * allow_internet_access: false (E2B's default) */
    const char *e2b_domain;     /* E2B's sandbox hosts PORT-ID.DOMAIN (getHost), or NULL */
    const char *node;           /* named in session ids; NULL: the host name */
    bool fleet;                 /* share the store with other nodes: take leases */
    uint64_t lease_ttl_ms;      /* a lease not renewed for this long may be taken over */
    const char *advertise;      /* HOST:PORT other nodes forward to; NULL: from listen */
    size_t checkpoint_workers;  /* sessions checkpointed at once at shutdown; 0: default */
};
#define DEFAULT_LEASE_TTL_MS 15000

/* Runs the server until SIGTERM or SIGINT, then shuts down gracefully. Returns the process
 * exit status (0 after a clean shutdown), printing what failed to stderr otherwise. */
int server_run(const struct server_config *cfg);

/* The default data directory: RUNCELL_DATA, else /var/lib/runcell as root, else
 * $XDG_DATA_HOME/runcell or ~/.local/share/runcell. Caller frees. */
char *default_data_dir(void);

#endif
