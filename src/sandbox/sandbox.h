/* sandbox.h - the sandbox module's contract: host setup, workspaces, and sandbox instances.
 *
 * A sandbox runs one program (the payload) in fresh user, mount, PID, network, IPC, UTS
 * and cgroup namespaces, on a tmpfs root with read-only system binds, as an unprivileged
 * uid with no capabilities, no_new_privs, Landlock and seccomp, inside its own cgroup.
 * The code here runs in the daemon (or CLI) process; the namespace work happens in the
 * exec'd runcell-sandbox helper, so no memory of this process reaches a sandbox.
 *
 * Thread safety: a sandbox_host is shared read-only after sandbox_host_init; workspaces
 * and sandboxes are owned by one caller at a time, except sandbox_signal(), which any
 * thread may call. */
#ifndef RUNCELL_SANDBOX_H
#define RUNCELL_SANDBOX_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/base.h"

/* Resource limits of one sandbox. Zero means "the default" when passed to
 * sandbox_limits_fill_defaults(). */
struct sandbox_limits {
    uint64_t memory_mb;  /* cgroup memory (and swap) limit */
    uint64_t pids;       /* cgroup pids.max */
    uint64_t disk_mb;    /* size cap of /workspace and of /tmp, each */
    uint64_t cpus_milli; /* CPU bandwidth in thousandths of a core */
    uint64_t cpu_time_s; /* RLIMIT_CPU backstop */
    uint64_t nofile;
};

#define SANDBOX_DEFAULT_MEMORY_MB  1024
#define SANDBOX_DEFAULT_PIDS       256
#define SANDBOX_DEFAULT_DISK_MB    1024
#define SANDBOX_DEFAULT_CPUS_MILLI 1000
#define SANDBOX_DEFAULT_NOFILE     1024

void sandbox_limits_fill_defaults(struct sandbox_limits *l);

enum cgroup_mode { CGROUP_NONE, CGROUP_V1, CGROUP_V2 };

/* Where runcell put itself to give sandboxes cgroups (docs/OPERATING.md has the table). */
enum cgroup_placement {
    CGROUP_PLACEMENT_NONE,           /* no usable cgroup hierarchy: degraded */
    CGROUP_PLACEMENT_DISABLED,       /* RUNCELL_NO_CGROUPS */
    CGROUP_PLACEMENT_V1,             /* the cgroup v1 controllers (hybrid or v1 host) */
    CGROUP_PLACEMENT_V2_ROOT,        /* v2, runcell in the root cgroup */
    CGROUP_PLACEMENT_V2_DELEGATED,   /* v2, a cgroup of its own: runcell moved into a leaf */
    CGROUP_PLACEMENT_V2_SHARED,      /* v2, its cgroup holds other processes: degraded */
    CGROUP_PLACEMENT_V2_UNDELEGATED, /* v2, its cgroup is not writable or lacks controllers */
};
/* "none", "disabled", "v1", "v2-root", "v2-delegated", "v2-shared", "v2-undelegated". */
const char *cgroup_placement_name(enum cgroup_placement p);

/* What the running kernel gives the sandbox, detected once (see sandbox_kernel_probe). */
struct sandbox_kernel {
    char release[65];                   /* uname -r */
    int landlock_abi;                   /* 0: no Landlock */
    int landlock_errno;                 /* why not: ENOSYS (not built), EOPNOTSUPP (not in lsm=) */
    bool seccomp;                       /* prctl(PR_GET_SECCOMP) works */
    bool seccomp_filter;                /* and the filter mode's actions are listed */
    bool clone3;                        /* Linux 5.3 */
    bool clone_into_cgroup;             /* clone3's CLONE_INTO_CGROUP, Linux 5.7 */
    bool openat2;                       /* Linux 5.6: the daemon's workspace file access */
    bool pidfd_open, pidfd_send_signal; /* 5.3, 5.1: signals that cannot hit a reused pid */
    bool open_tree;                     /* 5.2: template-made sandboxes get their workspace by it */
    long max_user_namespaces;           /* user.max_user_namespaces; -1 when absent */
    long unprivileged_userns_clone;     /* Debian's kernel.unprivileged_userns_clone; -1 absent */
    long apparmor_restrict_userns;      /* Ubuntu's kernel.apparmor_restrict_unprivileged_userns */
    bool userns_tried;                  /* a child made one (not in a one-shot run) */
    int userns_errno;                   /* 0 when it could, or when not tried */
    const char *userns_reason;      /* which sysctl stops it, and the fix; NULL when none does */
    bool tmpfs, overlayfs, cgroup2; /* in /proc/filesystems (runcell mounts tmpfs only) */
};

/* Probes this kernel: system calls by calling them with arguments they reject, Landlock by
 * its version query, sysctls by reading them, and with TRY_USERNS user namespaces by making
 * one in a child (a fork: ~3 ms, which a one-shot run leaves out; its helper names the cause
 * when the sandbox's clone fails). */
void sandbox_kernel_probe(struct sandbox_kernel *ret, bool try_userns);
/* Logs, once, what the kernel lacks: Landlock rights it cannot enforce (info), no Landlock,
 * no user namespaces, missing system calls (warnings). */
void sandbox_kernel_log(const struct sandbox_kernel *k);
/* The Landlock rights runcell asks for that ABI abi enforces, and those it lacks, each a
 * "; "-separated list naming the ABI and kernel that brought them. Returns how many steps
 * abi has. */
int sandbox_landlock_features(int abi, char *enforced, size_t esize, char *missing, size_t msize);
/* Why the user-namespace sysctls stop a sandbox (a static message with the fix), or NULL.
 * -1 for a sysctl the kernel does not have. */
const char *sandbox_userns_verdict(long max_user_namespaces, long unprivileged_userns_clone,
                                   long apparmor_restrict, bool root);

/* Everything about this machine a sandbox needs; one per process. */
struct sandbox_host {
    char *helper_path; /* the runcell-sandbox program */
    char *libexec_dir; /* directory of runcell's own support files (kernel, ...) */
    char *run_dir;     /* per-process runtime directory: workspaces, roots */
    char *owner_id;    /* "<pid>-<starttime>": names this process's cgroups and dirs */
    bool privileged;   /* running as root: per-workspace host uids, tmpfs workspaces */
    enum cgroup_mode cgroup_mode;
    char *cgroup_base[4];  /* v1: memory, pids, cpu, cpuacct bases; v2: [0] only */
    char *degraded_reason; /* non-NULL when limits fall back to rlimits only */
    enum cgroup_placement cgroup_placement;
    char *cgroup_v2_mount;     /* the unified hierarchy's mount on a pure v2 host, else NULL */
    char *cgroup_own;          /* v2: our cgroup's path when we started ("/system.slice/x") */
    char *cgroup_own_dir;      /* v2: its directory */
    char *cgroup_leaf_dir;     /* v2 delegated: the leaf we moved into, removed at release */
    char cgroup_enabled[64];   /* v2: controllers we enabled in cgroup_own_dir ("memory pids") */
    bool cgroup_base_made;     /* we created cgroup_base[0] */
    bool cgroup_cpu;           /* v2: the cpu controller is there (cpu.max is enforced) */
    uid_t uid_base;            /* first host uid handed to workspaces when privileged */
    _Atomic uint64_t seq;      /* counter for sandbox names */
    struct template *template; /* see sandbox_host_start_template; NULL when off */
    struct sandbox_kernel kernel;
};

/* Finds the helper next to argv0's executable, picks the runtime directory (RUNCELL_RUNDIR,
 * else /run/runcell as root, else $XDG_RUNTIME_DIR/runcell or /tmp/runcell-UID), detects
 * cgroup v2 or v1 and whether they can be written, and sweeps what dead runcell processes
 * left behind (cgroups, mounts, directories). 0 or -errno with err_msg(). */
int sandbox_host_init(struct sandbox_host *host);
/* What a process that starts one sandbox and ends may leave out of sandbox_host_init. */
enum {
    SANDBOX_HOST_ONE_SHOT = 1, /* no trial of user namespaces in a child (sandbox_kernel_probe) */
};
int sandbox_host_init_with(struct sandbox_host *host, unsigned flags);
/* Removes this process's runtime directory; call at exit after freeing all sandboxes. */
void sandbox_host_release(struct sandbox_host *host);
/* Whether the process an owner id names ("<pid>-<starttime>", as host->owner_id) still runs. */
bool owner_alive(const char *owner_id);

/* ---- host detection ---- */

/* The path of a process's cgroup in the hierarchy carrying controller ("memory", "pids",
 * ...: a v1 line naming it), or in the unified hierarchy when controller is "" (the
 * "0::PATH" line), parsed from the text of /proc/PID/cgroup. Only the first two colons
 * separate the fields (a path may hold colons). -ENOENT when no line matches, or when the
 * kernel marks the cgroup " (deleted)"; *ret_path (caller frees) is the path only. */
int cgroup_parse_own(const char *text, const char *controller, char **ret_path);
/* Mount point of the cgroup v1 hierarchy carrying controller, or of cgroup2 when controller
 * is NULL (from /proc/self/mountinfo); NULL when none. Caller frees. */
char *cgroup_mount_point(const char *controller);

/* On a cgroup v2 host under systemd, when runcell's cgroup is not its own (a login
 * session's scope, a CI job: other processes share it; or, for a user, it is not delegated),
 * re-executes argv inside `systemd-run [--user] --scope -p Delegate=yes`, which keeps the
 * pid, stdio and environment (plus RUNCELL_SCOPED=1, so it happens once), and logs that it
 * did. Checks first that systemd grants such a scope. Returns 0 when nothing was done (not
 * needed, not possible, RUNCELL_NO_CGROUPS set), -errno when the exec failed; never returns
 * after a successful exec. Call before starting threads. */
int sandbox_scope_reexec(int argc, char **argv);
/* Whether sandbox_scope_reexec would try (systemd runs, the cgroup is not runcell's own,
 * not disabled): for reports. */
bool sandbox_scope_wanted(void);

/* The template: one sandbox running a Python that has imported numpy, pandas, matplotlib and
 * openpyxl and frozen its heap. Afterwards, sandbox_start() with spec->from_template makes
 * the sandbox by asking the template to clone itself into the new namespaces (same
 * workspace, uid pair, cgroup, mounts, Landlock and seccomp as a sandbox made from
 * scratch), and the payload is that clone's Python, already past its imports. Only when
 * running as root (the template maps every sandbox's ids) with cgroups (without them the
 * memory cap is an address-space rlimit, which a clone of the template would exceed). A template
 * that dies, or whose files changed, is replaced at the next start; sessions it made live on.
 * Thread-safe. 0 or -errno with err_msg(). */
int sandbox_host_start_template(struct sandbox_host *host);
/* How long the running template took to become ready, in ms; 0 when there is none. */
double sandbox_host_template_ready_ms(struct sandbox_host *host);

/* A workspace is the host side of /workspace: a size-capped tmpfs owned by a host uid of
 * its own when privileged, else a plain directory. It outlives the sandboxes run on it.
 * Opaque: the module's own files see its fields (workspace-int.h). */
struct workspace;

/* Creates an empty workspace of disk_mb; caller frees with workspace_free. disk_mb 0 makes
 * a plain directory owned by runcell's own uid (for runcell's own sandboxes). */
int workspace_new(struct sandbox_host *host, uint64_t disk_mb, struct workspace **ret);
/* Unmounts and removes the workspace and everything in it; NULL is a no-op. */
void workspace_free(struct workspace *ws);
/* Opens the workspace directory (O_PATH-free, O_DIRECTORY) for *at() access that never
 * follows links; caller closes. */
int workspace_open(const struct workspace *ws);
/* The bytes the workspace's file system holds and can hold (its size cap when it is a tmpfs
 * of its own; the host file system's when it is a plain directory). 0 or -errno. */
int workspace_usage(const struct workspace *ws, uint64_t *ret_used, uint64_t *ret_total);

/* ---- workspace files, as the daemon sees them: never following a link the sandboxed code
 * may have planted, never leaving the workspace. ---- */

/* Opens rel (a safe relative path, see path_is_safe_relative) below the workspace with
 * openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV).
 * flags/mode as open(2); O_NOFOLLOW and O_CLOEXEC are added. fd or -errno (-ELOOP for a
 * symlink on the way, -EXDEV for an escape). */
int workspace_openat(const struct workspace *ws, const char *rel, int flags, mode_t mode);
/* Opens the directory that holds rel (creating the directories on the way, owned by the
 * sandbox user, when create is true) and returns its fd; *ret_leaf points into rel at the
 * last component. -errno as workspace_openat. */
int workspace_open_parent(const struct workspace *ws, const char *rel, bool create,
                          const char **ret_leaf);
/* Creates the parent directories of rel, owned by the sandbox user. 0 or -errno. */
int workspace_mkparents(const struct workspace *ws, const char *rel);

struct ws_entry {
    char *path; /* relative to the workspace */
    uint64_t size;
    int64_t mtime_ns;
    uint64_t ino;
    mode_t mode;
};
struct ws_listing {
    struct ws_entry *v;
    size_t n;
    size_t bytes;   /* of the paths kept */
    bool truncated; /* the scan stopped at one of the WS_SCAN_* budgets */
};
/* A scan's budgets: what the sandbox left in the workspace decides how much the daemon
 * holds and how long it walks, so both are capped. Entries count files, links and the
 * directories walked; paths are kept up to WS_SCAN_MAX_BYTES in all, none longer than
 * PATH_MAX (the daemon could not open them); WS_SCAN_MAX_MS bounds the walk's time. */
#define WS_SCAN_MAX       20000
#define WS_SCAN_MAX_BYTES (8u << 20)
#define WS_SCAN_MAX_DEPTH 64
#define WS_SCAN_MAX_MS    10000
/* Lists every regular file and symlink below the workspace (directories are recursed
 * into, not listed), sorted by path, within the budgets above (truncated says one was hit).
 * Tool state directories at the top (.local, .cache, .config) are skipped, and so is
 * runcell's own (.runcell: variables' checkpoints on their way to and from the store). */
int workspace_scan(const struct workspace *ws, struct ws_listing *ret);
/* Closes what a scan keeps open for the next one (the workspace's directory), as an idle
 * session's cgroup files are; the next scan opens it again. Never waits: while a scan runs,
 * nothing is closed. */
void workspace_scan_idle(struct workspace *ws);
void ws_listing_release(struct ws_listing *l);
/* Paths created, modified (size, mtime or inode changed) and deleted between two scans;
 * each a fresh NULL-terminated vector. Nothing is taken for deleted when after was cut
 * short. Cost linear in the listings. */
void ws_listing_diff(const struct ws_listing *before, const struct ws_listing *after,
                     char ***ret_created, char ***ret_modified, char ***ret_deleted);
/* Copies a host file into the workspace at rel (parents created), owned by the sandbox
 * user; refuses to write through links. */
int workspace_copy_in(const struct workspace *ws, const char *host_path, const char *rel);
/* Copies workspace file rel to out_dir/rel (parents created). Only regular files, and no
 * sparse ones (-EFBIG: apparent size past the allocated blocks by more than 1 MiB). */
int workspace_copy_out(const struct workspace *ws, const char *rel, const char *out_dir);
/* The host path of name in the workspace's own host directory, beside the workspace and out
 * of the sandbox's reach: for what the daemon keeps about it (an egress socket directory).
 * Caller frees. */
char *workspace_aside_path(const struct workspace *ws, const char *name);
/* Reads regular workspace file rel, at most cap bytes, into ret (which the caller releases
 * with buf_release; it is left released on failure): read_regular_fd on rel opened by
 * workspace_openat, non-blocking (a FIFO is refused, never waited on). The sandbox may still
 * be changing the file: the read is capped whatever fstat said. *ret_size (may be NULL) gets
 * the size fstat saw, also on -E2BIG. 0, or -errno: -E2BIG past cap, -EINVAL not a regular
 * file, -ELOOP a symbolic link, as workspace_openat. */
int workspace_read(const struct workspace *ws, const char *rel, size_t cap, struct buf *ret,
                   uint64_t *ret_size);
/* Writes n bytes to rel (parents created, owned by the sandbox user) through a temporary file
 * renamed into place: a reader never sees half a file, and a link planted at rel is replaced,
 * never written through. 0 or -errno with err_msg(). */
int workspace_write(const struct workspace *ws, const char *rel, const void *data, size_t n);

/* ---- making workspace files: whatever the daemon makes there belongs to the sandbox user
 * (these functions are the only ones that change an owner), and is made below directories
 * opened without following links. ---- */

/* A file on its way to rel: made under a temporary name beside it, written through fd,
 * then given to the sandbox user and renamed into place by ws_newfile_commit (a reader never
 * sees half a file), or removed by ws_newfile_abort. Caller-owned storage; the fields other
 * than fd belong to the module. */
struct ws_newfile {
    int fd; /* open read-write on the temporary file */
    const struct workspace *ws;
    int dirfd;
    char *tmp_name;
    char *leaf;
};
/* The name of such a temporary file starts with this. */
#define WS_TMP_PREFIX ".runcell-write-"
/* Creates rel's parent directories (owned by the sandbox user) and the temporary file, of
 * mode, in the last of them. 0, or -errno with err_msg() (-EINVAL for an unsafe rel, -ELOOP
 * for a link on the way); *ret is then released. */
int ws_newfile_open(const struct workspace *ws, const char *rel, mode_t mode,
                    struct ws_newfile *ret);
/* With WS_REFUSE_LINK, a link or a directory at rel is refused (-ELOOP, -EISDIR) rather than
 * replaced, so that a write never seems to go through one. */
#define WS_REFUSE_LINK 1u
/* Gives the file to the sandbox user and renames it to rel, replacing what is there (a link
 * is replaced, never followed; see WS_REFUSE_LINK). *ret_replaced (may be NULL) says whether
 * something was. f is released either way (on failure with its file removed). 0 or -errno. */
int ws_newfile_commit(struct ws_newfile *f, unsigned flags, bool *ret_replaced);
/* Removes the temporary file and releases f; a no-op on a released f. */
void ws_newfile_abort(struct ws_newfile *f);
/* Makes directory rel (parents created) of mode, owned by the sandbox user. 0 or -errno
 * (-EEXIST when something is there). */
int workspace_mkdir(const struct workspace *ws, const char *rel, mode_t mode);
/* Makes rel (parents created) a symbolic link to target, owned by the sandbox user; target
 * is only a string here, nothing follows it. 0 or -errno. */
int workspace_symlink(const struct workspace *ws, const char *target, const char *rel);

/* E2B's home and working directory: in every sandbox, the workspace again (a bind of the
 * same mount), beside /workspace. */
#define SANDBOX_HOME_DIR "/home/user"

/* Where a session's egress proxy socket directory is bound (see net/net.h). Sandboxes made
 * by the template can only take binds at mount points its root has: this one, /.runcell,
 * and the system trust store (a session CA's bundle goes over it). */
#define SANDBOX_NET_DIR     "/.runcell-net"
#define SANDBOX_TRUST_STORE "/etc/ssl/certs/ca-certificates.crt"

/* What to run in a sandbox. */
struct sandbox_spec {
    char *const *argv; /* absolute program path first */
    char *const *env;  /* full environment of the payload (see sandbox_default_env) */
    struct sandbox_limits limits;
    int stdin_fd; /* payload's fd 0, 1, 2 (required) */
    int stdout_fd;
    int stderr_fd;
    const int *extra_fds; /* handed to the payload as 3, 4, ... */
    int n_extra_fds;
    const char *const *ro_binds; /* pairs "host path", "/sandbox path", NULL-terminated */
    bool template_profile;       /* this sandbox runs the template itself (internal) */
    bool from_template;          /* a kernel: made by the template when there is one (argv and env
                                  * are then handed to the kernel instead of exec'd) */
    const char *relay_socket;    /* sandbox path of an egress proxy socket (bound in through
                                  * ro_binds): a relay inside listens on 127.0.0.1:relay_port
                                  * and forwards to it; NULL for none */
    uint16_t relay_port;
    const char *work_dir; /* the payload's working directory: "/workspace" (NULL) or
                           * SANDBOX_HOME_DIR, the same files by another path */
    bool exec_channel;    /* other programs may be started beside the payload (sandbox_exec) */
};

/* The clean environment of a sandboxed program; caller frees with strv_free. */
char **sandbox_default_env(void);

enum sandbox_state { SANDBOX_STARTING, SANDBOX_RUNNING, SANDBOX_EXITED };

/* One running (or finished) sandbox; opaque (spawn-int.h has its fields). */
struct sandbox;

/* Starts a sandbox running spec->argv on ws. Returns once the helper has reported the
 * sandbox init's pid (the payload may still be starting); setup failures after that point
 * arrive as status lines. 0 or -errno with err_msg(); *ret owned by the caller. */
int sandbox_start(struct sandbox_host *host, struct workspace *ws, const struct sandbox_spec *spec,
                  struct sandbox **ret);
/* The fd to poll (POLLIN) for the helper's status lines, to be read by sandbox_poll_status;
 * -1 once they reached EOF. Owned by sb. */
int sandbox_status_fd(const struct sandbox *sb);
/* Reads whatever status lines are available on the status fd (non-blocking). Returns 1 when
 * the status fd reached EOF (init is gone), 0 otherwise, -errno on error. */
int sandbox_poll_status(struct sandbox *sb);
/* How the payload ended, as far as the status lines have told. */
struct sandbox_outcome {
    bool exited;       /* the payload's status is known */
    int exit_code;     /* valid when exited and !signal */
    int signal;        /* nonzero when the payload died of a signal */
    const char *error; /* a setup failure the helper reported, or NULL; valid while sb is */
};
void sandbox_outcome(const struct sandbox *sb, struct sandbox_outcome *ret);
/* Whether sb's limits fall back to rlimits (no cgroup, or not root): for the record. */
bool sandbox_limits_degraded(const struct sandbox *sb);
/* When sandbox_start began making sb (now_ms_f() time): its wall clock counts from there. */
double sandbox_started_ms(const struct sandbox *sb);
/* Blocks until init is gone, reaping it. */
void sandbox_wait(struct sandbox *sb);
/* Waits up to timeout_ms for init to finish on its own (after the payload died); returns
 * true when it did and was reaped. */
bool sandbox_wait_for(struct sandbox *sb, int timeout_ms);
/* Forwards sig to the payload (through init). Safe from any thread. */
int sandbox_signal(struct sandbox *sb, int sig);
/* Kills every process of the sandbox at once. Safe from any thread. */
void sandbox_kill(struct sandbox *sb);
/* Stops (pause) or continues every process of the sandbox: the cgroup v2 freezer (waiting
 * until every task is frozen), or on v1 SIGSTOP and SIGCONT to each but its init. A paused
 * sandbox takes no CPU; its memory stays. 0, -ETIMEDOUT when the freeze did not settle (it is
 * undone), or -ENODATA for a sandbox without cgroups (its processes cannot all be found). */
int sandbox_pause(struct sandbox *sb, bool pause);

struct sandbox_usage {
    double cpu_ms;
    uint64_t memory_peak_kb;
    /* "cell": since the last sandbox_reset_peak; "session": since the sandbox started (v2
     * before Linux 6.12, where memory.peak cannot be reset; without cgroups, init's rusage) */
    const char *memory_peak_scope;
    bool oom_killed;
};
int sandbox_usage(struct sandbox *sb, struct sandbox_usage *ret);
/* sandbox_usage for a payload that lives on (a kernel that answered): without the count of
 * OOM kills, one read fewer (oom_killed is false). */
int sandbox_usage_alive(struct sandbox *sb, struct sandbox_usage *ret);
/* sandbox_usage's cpu_ms alone, with one read: what a cell's start needs. */
double sandbox_cpu_ms(struct sandbox *sb);
/* The memory sb's cgroup holds now, in bytes, and of it the page cache. 0 or -errno;
 * -ENODATA without a cgroup. */
int sandbox_memory_now(struct sandbox *sb, uint64_t *ret_used, uint64_t *ret_cache);
/* Applies new memory, pids and CPU limits to a running sandbox's cgroup. 0 or -errno;
 * -ENODATA without a cgroup. */
int sandbox_set_limits(struct sandbox *sb, const struct sandbox_limits *limits);
/* Starts a new peak-memory measurement (cgroup v1 max_usage, v2 memory.peak where the
 * kernel lets it be reset: Linux 6.12+); best effort. sandbox_usage says which it got. */
void sandbox_reset_peak(struct sandbox *sb);
/* Gives back the descriptors kept for sandbox_usage while the sandbox is idle; the next
 * sandbox_usage or sandbox_reset_peak opens them again. Not while either runs. */
void sandbox_usage_idle(struct sandbox *sb);

/* ---- programs beside the payload (spec->exec_channel) ----
 *
 * A sandbox started with an exec channel runs other programs on request: in its namespaces
 * (its network too: a server one starts is reached on the sandbox's loopback by the payload
 * and the others), its cgroup and limits, as the sandbox user under the payload's whole
 * lockdown, each a session and process group of its own. They are started by a spawner that
 * the sandbox's init starts at the first request (helper/execd.c); everything the spawner
 * says is read as untrusted. */
struct sandbox_exec {
    char *const *argv; /* argv[0] a path, or a name looked up on env's PATH */
    char *const *env;  /* the whole environment */
    const char *cwd;   /* an absolute path in the sandbox */
    int stdin_fd;      /* the program's fds 0, 1 and 2 (borrowed: sent, not closed) */
    int stdout_fd;
    int stderr_fd;
    int status_fd; /* the write end of a pipe: "exit N\n" or "signal N\n" when the program
                    * ends, then EOF; EOF alone if the spawner or the sandbox is gone
                    * (borrowed) */
};
#define SANDBOX_EXEC_MAX_ARGS (128u << 10) /* bytes of argv and env together */
/* Starts x in sb. 0 and *ret_pid (its pid in the sandbox), or -errno with err_msg(): -ENOTSUP
 * without an exec channel, -ESRCH when the sandbox is gone, -E2BIG past
 * SANDBOX_EXEC_MAX_ARGS, -EINVAL when the program cannot run as asked (no such program or
 * directory: the spawner's reason in err_msg()), -EAGAIN at the sandbox's pids limit, -EIO
 * for another failure. Thread-safe. */
int sandbox_exec(struct sandbox *sb, const struct sandbox_exec *x, int *ret_pid);
/* Sends sig to the process group of pid, a program sandbox_exec started that has not ended
 * (then to pid itself). 0, or -ESRCH for no such program, -errno as sandbox_exec. */
int sandbox_exec_signal(struct sandbox *sb, int pid, int sig);

/* A TCP connection to 127.0.0.1:port in sb's own network namespace (a server a program in
 * it listens with), made from the daemon (which needs root: CAP_SYS_ADMIN to enter it); the
 * sandbox still reaches nothing outside. 0 and *ret_fd (non-blocking, connected; caller
 * closes), or -errno with err_msg(): -ECONNREFUSED when nothing listens, -ETIMEDOUT, -ESRCH. */
int sandbox_connect(struct sandbox *sb, uint16_t port, int timeout_ms, int *ret_fd);

/* Kills what is left, reaps, removes the cgroup and the root directory; NULL is a no-op. */
void sandbox_free(struct sandbox *sb);

#endif
