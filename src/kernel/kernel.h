/* kernel.h - the daemon's side of the in-sandbox Python kernel: starting it in a sandbox,
 * the framed wire protocol (see kernel.py), and the events it produces.
 *
 * Everything read from a kernel is untrusted (user code runs in the kernel process):
 * frames are length-checked against KERNEL_MAX_FRAME, JSON is validated, and a protocol
 * violation is reported as an error so the caller can kill the kernel. */
#ifndef RUNCELL_KERNEL_H
#define RUNCELL_KERNEL_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/base.h"
#include "sandbox/sandbox.h"

#define KERNEL_MAX_FRAME (48u << 20)
/* Caps on one JSON message, checked on its raw bytes before it is parsed (json_measure):
 * parsed JSON costs up to ~50 times its text in small values. The kernel itself nests at
 * most ~105 deep (_wire_safe); 200,000 values parse to ~16 MiB at most. */
#define KERNEL_MSG_MAX_DEPTH  128
#define KERNEL_MSG_MAX_VALUES 200000
#define KERNEL_MSG_MAX_STRING KERNEL_MAX_FRAME
/* What one parsed value is charged in budgets counted in bytes (a jansson value and its
 * allocation), on top of the text. */
#define KERNEL_VALUE_COST 64

enum kernel_event_type {
    KEV_STDOUT, /* data/len: bytes */
    KEV_STDERR,
    KEV_DISPLAY, /* msg: {"type":"display","result":bool,"data":{mime: value}} */
    KEV_DONE,    /* msg: {"type":"done","status","error","execution_count",["exit_code"]} */
    KEV_HELLO,   /* msg: {"type":"hello","python","pid","cwd"} */
    KEV_REPLY,   /* msg: {"type":"checkpoint_done"|"restore_done","ok",...} */
    KEV_LIMIT,   /* data/len: why a message broke a cap (KERNEL_MSG_*); it was dropped
                  * unparsed, and the frames after it are read as usual */
    KEV_SYNC,    /* msg: {"type":"sync"}: the cell starts a program; answer kernel_answer_sync
                  * once what came before it is taken (see kernel_answer_sync) */
};

struct kernel_event {
    enum kernel_event_type type;
    const char *data;
    size_t len;
    json_t *msg;   /* borrowed for the duration of the callback */
    size_t values; /* M frames: JSON values in msg (as json_measure counts them) */
};

typedef void (*kernel_event_fn)(void *ctx, const struct kernel_event *ev);

/* A kernel running in its sandbox; opaque (kernel-int.h has its fields). */
struct kernel;

/* What a caller of kernel_pump_channel, kernel_pump_pipe and sandbox_poll_status waits on. */
enum kernel_fd_kind {
    KERNEL_FD_CHANNEL, /* the control socket: frames */
    KERNEL_FD_STDOUT,  /* the kernel's stdout pipe */
    KERNEL_FD_STDERR,
    KERNEL_FD_STATUS, /* its sandbox's status lines (sandbox_status_fd) */
};
/* The fd to poll (POLLIN) for which; -1 when there is none (any more). Owned by k. */
int kernel_fd(const struct kernel *k, enum kernel_fd_kind which);
/* The sandbox k runs in, for its usage, limits and signals; owned by k. */
struct sandbox *kernel_sandbox(const struct kernel *k);
/* The interpreter's version, as its hello said ("3.11.2"); "" when it said none. */
const char *kernel_python_version(const struct kernel *k);

/* Sends one execute request; the cell is numbered execution_count (in its filename, "<cell
 * N>", and its done message), so numbering goes on across kernels of one session. A kernel
 * that takes no more of a large cell for timeout_ms fails it (-ETIMEDOUT). 0 or -errno
 * with err_msg(). */
int kernel_send_execute(struct kernel *k, const char *code, const char *lang, long execution_count,
                        uint64_t timeout_ms);
/* What a kernel's sandbox gets besides the defaults (a session's network). */
struct kernel_env {
    char *const *env;            /* the full environment; NULL: sandbox_default_env() */
    const char *const *ro_binds; /* further binds, pairs as in sandbox_spec; may be NULL */
    const char *relay_socket;    /* as in sandbox_spec */
    uint16_t relay_port;
    bool javascript;      /* kernel.js on /usr/bin/node, not kernel.py (no template) */
    const char *home_dir; /* HOME and the kernel's working directory: "/workspace" (NULL) or
                           * SANDBOX_HOME_DIR (see kernel_set_home) */
    bool exec_channel;    /* other programs may be started in its sandbox (sandbox_exec) */
};
/* A kernel's start is CPU work done under its sandbox's CPU limit: below one core it takes
 * longer in proportion, so the wait for its hello grows by 1000 / cpus_milli, at most
 * KERNEL_START_SCALE_MAX times (none at one core or more, or without a limit). */
#define KERNEL_START_SCALE_MAX 8
uint64_t kernel_start_wait_ms(uint64_t start_timeout_ms, uint64_t cpus_milli);
/* Starts a kernel in a new sandbox on ws, with extra (may be NULL) applied to the sandbox,
 * and waits (up to kernel_start_wait_ms(start_timeout_ms, its CPU limit)) for its hello. args (may
 * be NULL) become the cells' sys.argv[1:] (process.argv.slice(2) for JavaScript). 0 or -errno with
 * err_msg(); *ret owned by the caller (kernel_free). */
int kernel_start(struct sandbox_host *host, struct workspace *ws,
                 const struct sandbox_limits *limits, char *const *args, uint64_t start_timeout_ms,
                 const struct kernel_env *extra, struct kernel **ret);
/* Reads what is available on the control channel and calls cb for each complete frame.
 * Returns 0, 1 at EOF, or -EPROTO (err_msg says why) when the kernel broke the protocol. */
int kernel_pump_channel(struct kernel *k, kernel_event_fn cb, void *ctx);
/* The frame parser on a buffer (for kernel_pump_channel and fuzzing): calls cb for each
 * complete frame at the start of in and removes them, leaving a partial frame. 0, or
 * -EPROTO with err_msg() (a frame over KERNEL_MAX_FRAME, an unknown kind, a message that
 * is not JSON or has no known type). A message over the KERNEL_MSG_* caps is a KEV_LIMIT
 * event, not an error. */
int kernel_frames_parse(struct buf *in, kernel_event_fn cb, void *ctx);
/* Parses one M payload under the KERNEL_MSG_* caps. 0 with *ret (caller decrefs) and
 * *ret_values; -E2BIG with err_msg() naming the cap; -EPROTO when it is not a JSON object. */
int kernel_message_parse(const char *p, size_t n, json_t **ret, size_t *ret_values);
/* Reads what is available on the stdout (stream 1) or stderr (2) pipe: 0 after a chunk (or
 * EINTR), 1 at EOF, 2 when the pipe is empty. */
int kernel_pump_pipe(struct kernel *k, int stream, kernel_event_fn cb, void *ctx);
/* Variables: asks the kernel to pickle its globals into path ("checkpoint") or to load them
 * from path ("restore"; the kernel removes the file), path being as the sandbox sees it, and
 * waits up to timeout_ms for the answer (output meanwhile is dropped). Past the timeout the
 * kernel is interrupted and has grace_ms more to answer. 0 and *ret_reply, the kernel's
 * {"type":"..._done","ok":bool,...} (caller decrefs), or -errno with err_msg(): -ETIMEDOUT,
 * -EPIPE (the kernel died), -EPROTO (it broke the protocol; kill it). */
int kernel_request(struct kernel *k, const char *type, const char *path, uint64_t timeout_ms,
                   uint64_t grace_ms, json_t **ret_reply);
/* Makes a running Python kernel's HOME and working directory (and its shell's, when it has
 * one) home, one of the paths kernel_env.home_dir takes: what a kernel started with another
 * gets when a session made ahead is handed over. Waits up to timeout_ms for the kernel's
 * answer. 0, or -errno with err_msg() as kernel_request (and -EIO when the kernel could not). */
int kernel_set_home(struct kernel *k, const char *home, uint64_t timeout_ms);
/* Starts a Python kernel's bash shell ahead of its first bash cell (what a session made
 * ahead gets, so that its first shell command costs what a later one does); waits up to
 * timeout_ms. 0, or -errno with err_msg() as kernel_set_home. */
int kernel_start_shell(struct kernel *k, uint64_t timeout_ms);
/* Makes a Python kernel keep its state before each of its next depth cells (a copy of itself
 * per cell, see kernel.py's _History), for kernel_undo; 0 drops what it keeps. Waits up to
 * timeout_ms. 0, or -errno with err_msg() as kernel_set_home. */
int kernel_history(struct kernel *k, unsigned depth, uint64_t timeout_ms);
/* Takes the kernel back to its state before cell `before` (the copy taken then goes on as
 * the kernel). 0 with *ret_count (the cells the kernel has now run) and *ret_kept (the cells
 * whose state before them is still kept, an array; caller decrefs), -ENOENT with err_msg()
 * when no such state is kept, or -errno as kernel_request. */
int kernel_undo(struct kernel *k, long before, uint64_t timeout_ms, long *ret_count,
                json_t **ret_kept);
/* Asks the kernel to stop the running cell (KeyboardInterrupt): an interrupt frame on the
 * channel, then SIGINT. The frame reaches a cell whose code has not started yet (the
 * kernel ignores SIGINT between cells and looks for the frame as the code starts); the
 * signal reaches code that runs. Never blocks; safe from any thread. */
void kernel_interrupt(struct kernel *k);
/* Answers a KEV_SYNC: an 'A' frame, after which the cell starts its program. The caller
 * first takes every frame before the sync and what the pipes hold, so that the program's
 * output (through a pipe) comes after what the cell printed (through the channel). Never
 * blocks: an honest kernel waits for each answer, so its socket has room for one; for one
 * that sends syncs without reading, the answer is dropped. */
void kernel_answer_sync(struct kernel *k);
/* Kills the kernel's sandbox, reaps it, frees everything; NULL is a no-op. */
void kernel_free(struct kernel *k);

#endif
