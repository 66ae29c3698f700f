/* base.h - small shared helpers: memory, errors, logging, capped buffers, fds, paths. */
#ifndef RUNCELL_BASE_H
#define RUNCELL_BASE_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define MIN(a, b)     ((a) < (b) ? (a) : (b))
#define MAX(a, b)     ((a) > (b) ? (a) : (b))

/* ---- memory: the x* helpers abort on allocation failure; everything else never exits. ---- */
void *xmalloc(size_t n);
void *xcalloc(size_t nmemb, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);
char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Frees every string of a NULL-terminated vector and the vector itself; NULL is a no-op. */
void strv_free(char **v);
/* Appends a copy of s to a NULL-terminated vector; returns the (maybe moved) vector. */
char **strv_push(char **v, const char *s);
size_t strv_len(char *const *v);

static inline void freep(void *p)
{
    free(*(void **)p);
}
void closep(int *fd);
void strv_freep(char ***v);
#define _cleanup_free_  __attribute__((cleanup(freep)))
#define _cleanup_close_ __attribute__((cleanup(closep)))
#define _cleanup_strv_  __attribute__((cleanup(strv_freep)))
/* Hands a pointer out of a cleanup variable: the caller now owns it. */
#define TAKE_PTR(p)                                                                                \
    ({                                                                                             \
        __typeof__(p) _t = (p);                                                                    \
        (p) = NULL;                                                                                \
        _t;                                                                                        \
    })
#define TAKE_FD(fd)                                                                                \
    ({                                                                                             \
        int _t = (fd);                                                                             \
        (fd) = -1;                                                                                 \
        _t;                                                                                        \
    })

/* ---- errors: library code returns 0 or -errno and leaves a sentence here for the user. ---- */
/* Sets this thread's last error message (what failed, on what, and what to do); returns -err
 * when err > 0 so that `return err_set(EINVAL, "...")` reads naturally. */
int err_set(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The last message set on this thread, or a generic one; valid until the next err_set. */
const char *err_msg(void);

/* ---- logging to stderr; one line per call. ---- */
enum log_level { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR };
void log_set_level(enum log_level level);
void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_INFO, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)
/* A value for a log field (key=%s): in double quotes, with '"' and '\\' escaped, so that no
 * value can end its field and forge another (log_msg escapes control characters after);
 * NULL is "-", and a value longer than LOG_QUOTE_MAX bytes is cut, marked "...". The text
 * lives in a ring of LOG_QUOTE_SLOTS buffers of this thread: valid until that many later
 * calls. */
const char *log_quote(const char *s);
#define LOG_QUOTE_MAX   512
#define LOG_QUOTE_SLOTS 4

/* ---- growable byte buffer with a hard cap (curl's dynbuf idea). ---- */
struct buf {
    char *data; /* always NUL-terminated when non-NULL */
    size_t len;
    size_t alloc;
    size_t max; /* 0 = no cap */
};
void buf_init(struct buf *b, size_t max);
void buf_release(struct buf *b);
/* Appends n bytes; -E2BIG (nothing appended) when the cap would be passed. */
int buf_append(struct buf *b, const void *data, size_t n);
int buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Hands the storage to the caller (never NULL); the buffer is empty afterwards. */
char *buf_detach(struct buf *b, size_t *ret_len);
void buf_reset(struct buf *b);

/* ---- output capture: keeps the head and tail of a stream within a fixed budget. ---- */
struct outcap {
    struct buf head;   /* first cap/2 bytes */
    char *tail;        /* ring of the last cap/2 bytes once head is full */
    size_t tail_size;  /* capacity of the ring */
    size_t tail_start; /* index of the oldest byte in the ring */
    size_t tail_len;
    uint64_t total; /* bytes seen */
    size_t cap;
};
void outcap_init(struct outcap *c, size_t cap);
void outcap_release(struct outcap *c);
/* dst (uninitialised) made a copy of src. */
void outcap_copy(struct outcap *dst, const struct outcap *src);
/* Records n bytes; returns how many of them went into the head (the caller may forward those
 * live; the rest is kept only as tail). Memory use never exceeds cap. */
size_t outcap_append(struct outcap *c, const void *data, size_t n);
bool outcap_truncated(const struct outcap *c);
/* Head, a marker naming the dropped byte count, and tail; caller frees. */
char *outcap_render(const struct outcap *c, size_t *ret_len);
/* Only the part after the head (marker + tail) for a caller that already forwarded the head;
 * empty string when nothing was dropped. Caller frees. */
char *outcap_render_rest(const struct outcap *c, size_t *ret_len);

/* ---- JSON text measured before it is parsed (jsonscan.c) ----
 * Parsed JSON costs far more memory than its text (a 3-byte "[]," is a 64-byte value), so
 * text from an untrusted source is measured first, in one pass without allocating. */
struct json_bounds {
    size_t max_depth;  /* nesting of arrays and objects; 0 = no cap */
    size_t max_values; /* values, object keys counted; 0 = no cap */
    size_t max_string; /* raw bytes of the longest string (escapes counted as written) */
};
struct json_shape {
    size_t depth;
    size_t values;
    size_t longest_string;
};
/* Measures the n bytes at p. 0, or -E2BIG as soon as a bound of b (may be NULL) is passed
 * (*ret then holds the counts so far). Text that is not JSON is measured as far as it goes;
 * the parser refuses it later. Cost linear in n. */
int json_measure(const char *p, size_t n, const struct json_bounds *b, struct json_shape *ret);

/* ---- text ---- */
/* Copy of s with invalid UTF-8 sequences and NUL bytes replaced by U+FFFD; caller frees. */
char *utf8_sanitize(const char *s, size_t len, size_t *ret_len);
/* Strict decimal parsers: whole string, no sign for unsigned, range-checked. */
int parse_u64(const char *s, uint64_t *ret);
/* Seconds as a positive decimal ("1.5"); returns milliseconds. */
int parse_seconds(const char *s, uint64_t *ret_ms);
bool str_has_prefix(const char *s, const char *prefix);
/* Standard base64 (RFC 4648, with padding); caller frees. decode returns NULL on bad input
 * (whitespace is skipped). */
char *base64_encode(const void *data, size_t n, size_t *ret_len);
unsigned char *base64_decode(const char *s, size_t n, size_t *ret_len);
/* The media type of a file named path, from its extension (case-insensitive): the one
 * table every interface uses. NULL when the extension is not known. */
const char *mime_type_of(const char *path);

/* ---- fds ---- */
int fd_set_nonblock(int fd, bool on);
int fd_set_cloexec(int fd, bool on);
/* Writes all n bytes, retrying on EINTR/short writes; 0 or -errno. */
int write_all(int fd, const void *data, size_t n);
/* write_all for a non-blocking fd whose reader may be slow or hostile: waits for room until
 * deadline_ms (now_ms_f() time), then -ETIMEDOUT. */
int write_all_by(int fd, const void *data, size_t n, double deadline_ms);
/* write_all and write_all_by for a socket: a peer that has gone is -EPIPE, not SIGPIPE. */
int send_all(int fd, const void *data, size_t n);
int send_all_by(int fd, const void *data, size_t n, double deadline_ms);
/* send_all_by of cnt parts, in one sendmsg where the socket has room (iov is consumed). */
struct iovec;
int sendv_all_by(int fd, struct iovec *iov, int cnt, double deadline_ms);
/* Sends text as one message on a socket (a SOCK_SEQPACKET channel), with the n fds (at most
 * 32; none when n is 0) as SCM_RIGHTS; retries on EINTR. 0 or -errno (-EPIPE for a peer
 * that has gone). */
int send_with_fds(int fd, const char *text, const int *fds, int n);
/* Receives one message sent so: its text into buf (at most cap - 1 bytes, NUL-terminated)
 * (also on failure: "" when nothing came) and its fds (close-on-exec) into fds, *ret_n_fds
 * of them. flags are recvmsg's
 * (MSG_DONTWAIT). Returns the text's length, 0 at EOF, or -errno; nothing received is kept
 * open on failure: -EMSGSIZE when the text or its fds were more than buf or max_fds take,
 * -EMFILE when the kernel dropped fds it could not install (this process at its limit of
 * open files, or more than 32 sent). */
ssize_t recv_with_fds(int fd, char *buf, size_t cap, int flags, int *fds, int max_fds,
                      int *ret_n_fds);
/* Readers' wake-ups: each reader of something that changes (an execution's events, a
 * program's output) has an eventfd, written whenever it changed; a reader polls its fd,
 * clears it and looks. The set is guarded by its owner's lock. */
#define WAKERS_MAX 16
struct wakers {
    int fd[WAKERS_MAX];
    size_t n;
};
/* A reader's eventfd (non-blocking, close-on-exec), already written once: its first look is
 * its own. -errno on failure. */
int waker_open(void);
/* Clears a reader's eventfd after a wake-up. */
void waker_clear(int fd);
/* Adds fd to the set; false when it already has WAKERS_MAX. */
bool wakers_add(struct wakers *ws, int fd);
void wakers_remove(struct wakers *ws, int fd);
/* Wakes every reader of the set. */
void wakers_notify(const struct wakers *ws);
/* One reader's watch on what keeps a set of wakers under its lock (an execution, a
 * process): its eventfd, in the set while the watch lasts. */
struct reader_watch {
    pthread_mutex_t *lock;
    struct wakers *set;
    int fd;
};
/* 0, -errno when no eventfd can be made, or -EAGAIN when the set has WAKERS_MAX already. */
int reader_watch_open(struct reader_watch *w, pthread_mutex_t *lock, struct wakers *set);
/* Leaves the set and closes the eventfd. */
void reader_watch_close(struct reader_watch *w);
/* Reads until EOF into a capped buffer; -E2BIG past the cap. */
int read_all(int fd, struct buf *out);
/* Reads the regular file open on fd, at most cap bytes, into ret (set up here; the caller
 * releases it with buf_release; it is left released on failure). fd may be O_NONBLOCK, so
 * that its open could not block on a FIFO; it is made blocking once it is known to be a
 * regular file. The file may be changing (a sandbox may write it): the read is capped
 * whatever fstat said. *ret_size (may be NULL) gets the size fstat saw, also on -E2BIG.
 * 0, or -errno: -E2BIG past cap, -EINVAL not a regular file. The one capped read of a file
 * into memory: read_file and workspace_read are it on a path. */
int read_regular_fd(int fd, size_t cap, struct buf *ret, uint64_t *ret_size);
/* read_regular_fd on path (opened O_NONBLOCK: a FIFO there is refused, never waited on),
 * at most max bytes; *ret_data (NUL-terminated, caller frees) and *ret_len on success. */
int read_file(const char *path, size_t max, char **ret_data, size_t *ret_len);
int write_file(const char *path, const char *data, size_t n, mode_t mode);

/* ---- paths ---- */
/* True when p is a non-empty relative path of plain components: no "..", no ".", no empty
 * components, no leading "/", no NUL, shorter than PATH_MAX. */
bool path_is_safe_relative(const char *p);
/* mkdir -p with the given mode for every created component; 0 or -errno. */
int mkdir_p(const char *path, mode_t mode);
/* Makes an SQLite database file private before SQLite opens it: creates PATH 0600 when it
 * is missing and sets 0600 on it and on its -wal, -shm and -journal files when they exist
 * (SQLite gives the files it creates beside a database the database's mode). Returns 0 or
 * -errno with err_msg(). */
int db_file_make_private(const char *path);
/* rm -rf below dirfd-relative path without following symlinks and without crossing
 * mount points; 0 or -errno (first error). */
int rm_rf_at(int dirfd, const char *name);
int rm_rf(const char *path);

/* ---- time ---- */
uint64_t now_ms(void);
/* Milliseconds from then to now, 0 when then is later: a time read before another thread
 * stamped its own is earlier, and the unsigned difference would wrap to about 584 million
 * years (an idle check would take a thing just used for one idle that long). */
uint64_t ms_since(uint64_t now, uint64_t then);
double now_ms_f(void);
uint64_t now_realtime_ms(void);
/* The CLOCK_REALTIME instant ms milliseconds from now, for pthread_cond_timedwait. */
struct timespec;
void realtime_after_ms(struct timespec *ret, uint64_t ms);
/* "2026-11-29T18:33:06.123Z" for a realtime in ms; out holds at least 32 bytes. */
void format_time_iso(uint64_t realtime_ms, char *out);

/* Random bytes from the kernel; 0 or -errno. */
int random_bytes(void *buf, size_t n);
/* Lower-case hex of n random bytes into a fresh string. */
char *random_hex(size_t n);

#endif
