/* fleet-int.h - the fleet's internals, shared by node.c (the node lease, fencing, the
 * watchdog) and lease.c (session records) only. */
#ifndef RUNCELL_FLEET_INT_H
#define RUNCELL_FLEET_INT_H

#include <pthread.h>

#include "session/session-int.h"

#define NODE_NAME_MAX 32

enum node_state {
    NODE_JOINING, /* no lease yet (start, or after a lapse): nothing is admitted */
    NODE_LIVE,    /* renewing; fence_step says how far a fence went meanwhile */
    NODE_LAPSED,  /* dropped everything: the next renewal joins again, at a new epoch */
};

/* Another node's lease as last read (cached by lookups). */
struct node_view {
    char name[NODE_NAME_MAX + 8];
    bool present;  /* the store has nodes/NAME.json */
    bool released; /* a graceful stop gave it up */
    long long epoch;
    uint64_t expires_ms; /* wall clock */
    char address[272];
    uint64_t read_at; /* now_ms() */
    struct node_view *next;
};

/* A session record this node holds. */
struct lease {
    char *id;
    char version[STORE_VERSION_SIZE];
    json_t *record; /* as last written */
    bool lost;      /* another node took it (or the record went) */
    struct lease *next;
};

/* A takeover in progress in this node: its other requests for id wait for it. */
struct taking {
    char *id;
    struct taking *next;
};

struct fleet {
    struct store *store;
    char *node;
    char *instance; /* this process */
    char *owner;    /* "<pid>-<starttime>" */
    char *boot_id;
    char *advertise;
    uint64_t ttl_ms;
    int watchdog_fd;
    struct fleet_hooks hooks;

    pthread_mutex_t lock; /* everything below */
    pthread_cond_t wake;  /* the renewer and the fence thread */
    pthread_cond_t taken; /* a takeover ended */
    pthread_mutex_t hook_lock;
    bool hooks_off;
    pthread_t renewer, fencer;
    bool running, stopping;

    /* the node lease */
    enum node_state state;
    long long epoch;
    char version[STORE_VERSION_SIZE];
    bool have_version;
    uint64_t sent_ms;     /* send time of the last renewal that counted (now_ms()) */
    int fence_step;       /* steps taken since: 0 none, else the last enum fleet_fence_step */
    uint64_t retry_at_ms; /* the renewer's next try after a failure */
    char *why;            /* the last failure of the renewer, or NULL */
    char *why_copy;       /* what fleet_admitting last handed out */
    uint64_t renewals, failures, worst_gap_ms;

    struct lease *held;
    struct node_view *views;
    struct taking *takings;
};

/* node.c, for lease.c: the epoch the node holds now (0: none), and a node's lease as the store
 * has it (from the cache unless fresh, or when older than a sixth of the ttl). */
long long fleet_epoch(struct fleet *f);
int fleet_node_view(struct fleet *f, const char *node, bool fresh, struct node_view *ret);
/* lease.c, for node.c: frees the held records and caches. */
void fleet_leases_free(struct fleet *f);

#endif
