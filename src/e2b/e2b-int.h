/* e2b-int.h - what the files of the E2B surface share (routes.c, control.c, interp.c, envd.c,
 * stream.c, wire.c); nothing outside src/e2b includes it but the fuzz targets, for wire.c's
 * parsers.
 *
 * An E2B sandbox is a runcell session. The control plane (E2B_API_URL) creates, lists,
 * times out and kills them; the sandbox's ports (E2B_SANDBOX_URL, one URL for every
 * sandbox: the E2b-Sandbox-Id and E2b-Sandbox-Port headers say which) are the code
 * interpreter (/execute NDJSON, /contexts) and envd (/health, /files, and the process and
 * filesystem services over Connect RPC with the JSON codec). What cannot map onto runcell
 * is refused in E2B's error shape {code, message}, naming the field. docs/E2B.md has the
 * table. */
#ifndef RUNCELL_E2B_INT_H
#define RUNCELL_E2B_INT_H

#include <stdarg.h>
#include <jansson.h>
#include <pthread.h>

#include "e2b/e2b.h"
#include "http/http.h"

/* Route flags (beside http.h's): these routes authenticate as E2B's SDK does, not by
 * runcell's bearer token, and exist only with --e2b. */
#define ROUTE_E2B_API (1u << 8) /* control plane: X-API-KEY (or Bearer) is runcell's token */
#define ROUTE_E2B_BOX (1u << 9) /* a sandbox's ports: E2b-Sandbox-Id + X-Access-Token */
/* A sandbox route that E2B's SDK calls without its access token (the code interpreter's
 * /contexts): the sandbox id, 96 random bits, is the credential. */
#define ROUTE_E2B_BOX_ID (1u << 10)
/* a preview host, PORT-ID.DOMAIN: knowing a live sandbox's id is the credential */
#define ROUTE_E2B_PREVIEW (1u << 11)
#define ROUTE_E2B_ANY     (ROUTE_E2B_API | ROUTE_E2B_BOX | ROUTE_E2B_BOX_ID)

/* What the SDK is told envd is: 0.4.0 and later need no user name on requests; from 0.5.2 the
 * SDKs call closeStdin; below 0.5.7 file uploads are multipart (never gzip); below 0.6.3 a
 * watch's events carry no entry (the SDKs refuse includeEntry themselves). */
#define E2B_ENVD_VERSION      "0.5.2"
#define E2B_DEFAULT_TIMEOUT_S 300
#define E2B_HOME              "/home/user" /* E2B's working directory: runcell's /workspace */
#define E2B_MAX_CONTEXTS      32
#define E2B_ENVD_PORT         49983 /* a sandbox's ports that are runcell's own routes */
#define E2B_JUPYTER_PORT      49999
#define E2B_MAX_CWD           4096  /* a context's working directory, with its NUL */
#define E2B_MAX_LISTDIR       20000 /* entries of one ListDir reply */
#define E2B_KEEPALIVE_MS      30000 /* a quiet stream sends a keepalive this often */

#define E2B_MAX_PARTS    256 /* files of one multipart upload */
#define E2B_MAX_WATCHERS 16  /* polled watchers per sandbox (CreateWatcher) */

/* A watch the Python SDK polls by its id (CreateWatcher, GetWatcherEvents). */
struct e2b_watcher {
    char id[33];
    struct session_watch *w;
    struct e2b_watcher *next;
};

struct e2b_box {
    char *id;
    char *token; /* envd access token: the sandbox routes' credential */
    char *template_id;
    json_t *metadata;     /* object of strings */
    json_t *contexts;     /* [{id, language, cwd}], the default python context first */
    uint64_t started_ms;  /* realtime */
    uint64_t deadline_ms; /* realtime; 0: only the session's idle expiry */
    json_t *env;          /* envVars: every command's environment starts with them */
    struct e2b_watcher *watchers;
    bool auto_pause;        /* at its timeout it is paused, not killed (autoPause) */
    bool auto_pause_memory; /* ... keeping its memory (autoPauseMemory, the default) */
    double metrics_cpu_ms;  /* the CPU time getMetrics last saw, and when (monotonic ms; */
    uint64_t metrics_at_ms; /* 0: never), for the CPU use between two calls */
    struct e2b_box *next;
};

struct e2b {
    pthread_mutex_t lock;
    struct e2b_box *boxes;
};

/* ---- routes.c: the registry, replies, authentication ---- */
/* Under e->lock: the sandbox of that id (compared in constant time), or NULL. */
struct e2b_box *e2b_box_find(struct e2b *e, const char *id);
void e2b_box_forget(struct e2b *e, const char *id);
/* Lists b (takes it). It is forgotten when its session leaves the table, however it ends
 * (e2b_session_gone), or when a request finds it gone. */
void e2b_box_add(struct request *rq, struct e2b_box *b);
/* An error's message from fmt and ap, cut at 2 KiB and made valid UTF-8 (it may quote what a
 * client or a sandbox sent); *ret_n its length. Caller frees. */
char *e2b_vmessage(const char *fmt, va_list ap, size_t *ret_n);
/* The control plane's and envd's error: {"code": STATUS, "message": ...} (Connect's shape on
 * its routes). */
enum MHD_Result e2b_error(struct request *rq, unsigned status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A Connect error {code, message} with the status Connect gives code. */
enum MHD_Result e2b_connect_error(struct request *rq, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The E2B status and Connect code for -errno err, from the one table (reply.c). */
unsigned e2b_status_of(int err);
const char *e2b_errno_code(int err);
enum MHD_Result e2b_reply_empty(struct request *rq, unsigned status);
/* The body as an object, or NULL after a 400 in E2B's shape. */
json_t *e2b_body(struct request *rq);
const char *e2b_header(struct request *rq, const char *name);
/* The sandbox a request to a sandbox's route is for, as its authentication found it (its
 * E2b-Sandbox-Id, its host, or its signature): valid while rq is. */
const char *e2b_box_id(struct request *rq);
/* A sandbox past the deadline setTimeout gave it is killed when next touched. */
void e2b_expire_if_due(struct request *rq, const char *id);
/* The session of the request's sandbox (a reference), or NULL after replying 502. */
struct session *e2b_box_session(struct request *rq, const char *id);

/* ---- preview.c: the sandbox hosts PORT-ID.DOMAIN ---- */
/* The port and sandbox id (of id_size) of host PORT-ID.DOMAIN[:port]; false when it is not one
 * of domain's. */
bool e2b_host_parse(const char *host, const char *domain, unsigned *port, char *id, size_t id_size);
/* The surface's host_route: every request to PORT-ID.DOMAIN (but the envd and code
 * interpreter ports) goes to the sandbox's port. */
const struct route *e2b_host_route(struct request *rq, const char *host);

/* ---- control.c ---- */
bool e2b_env_name_ok(const char *k);
/* Whether a field asks for something: null, false, empty and an object none of whose
 * members asks ({"enabled": false}) do not. */
bool e2b_asks_for(json_t *v);
enum MHD_Result h_e2b_create(struct request *rq);
enum MHD_Result h_e2b_list(struct request *rq);
enum MHD_Result h_e2b_get(struct request *rq);
enum MHD_Result h_e2b_kill(struct request *rq);
enum MHD_Result h_e2b_timeout(struct request *rq);
enum MHD_Result h_e2b_connect(struct request *rq);
enum MHD_Result h_e2b_refused(struct request *rq);
enum MHD_Result h_e2b_pause(struct request *rq);
enum MHD_Result h_e2b_resume(struct request *rq);
enum MHD_Result h_e2b_fork(struct request *rq);
enum MHD_Result h_e2b_snapshot_create(struct request *rq);
enum MHD_Result h_e2b_snapshot_list(struct request *rq);
enum MHD_Result h_e2b_template_delete(struct request *rq);
enum MHD_Result h_e2b_unsupported(struct request *rq);
enum MHD_Result h_e2b_health(struct request *rq);
enum MHD_Result h_e2b_metrics(struct request *rq);
enum MHD_Result h_e2b_network(struct request *rq);

/* ---- wire.c: parsers without a request around them ---- */
/* Percent-decodes s in place ('+' a space too when form is true). */
void e2b_url_decode(char *s, bool form);
/* The list's metadata filter, "k=v&k2=v2" as the SDK sends it (keys and values URI-encoded
 * once more), as an object; NULL with why. */
json_t *e2b_metadata_parse(const char *q, char why[256]);
/* The workspace-relative path for an E2B path ("" for the workspace itself), or NULL with
 * why. E2B's /home/user and runcell's /workspace are the same directory. */
char *e2b_ws_path(const char *p, char why[512]);
/* The E2B path of a workspace-relative one; caller frees. */
char *e2b_abs(const char *rel);
/* E2B's status for a failed path operation. */
unsigned e2b_path_status(int err);
/* One part of a multipart/form-data body. */
struct e2b_part {
    const char *data;
    size_t len;
    char filename[1024];
};
/* The parts of body (at most max), split on boundary; -1 when it is not well formed, -2 when
 * a file name is longer than struct e2b_part keeps. */
int e2b_multipart_parts(const char *body, size_t n, const char *boundary, struct e2b_part *parts,
                        int max);
/* A Connect request's message: the body (unary), or the body's one envelope (stream): a JSON
 * object (an empty body is {}); NULL with why. */
json_t *e2b_connect_message(const char *data, size_t n, bool stream, char why[256]);
/* A process.Start's ProcessConfig {cmd, args, envs, cwd} as a program to run in the
 * sandbox. */
struct e2b_command {
    char **argv; /* cmd, then args */
    char **env;  /* KEY=VALUE: the sandbox's envVars, then the config's envs over them */
    char *cwd;   /* absolute (a relative one is below /home/user); NULL: the home */
};
/* 0, or -EINVAL with why; *ret released with e2b_command_release. */
int e2b_command_parse(json_t *cfg, json_t *box_env, struct e2b_command *ret, char why[512]);
void e2b_command_release(struct e2b_command *c);
/* The user an "Authorization: Basic base64(user:)" header names (E2B's SDKs send it when a
 * call names a user), into ret_user (size bytes). 0, -ENOENT without such a header, -EINVAL
 * when it is not one. */
int e2b_basic_user(const char *authorization, char *ret_user, size_t size);
/* Protobuf's JSON form of bytes: base64, standard or URL-safe, with or without padding. The
 * bytes (caller frees; *ret_len), or NULL when s is not that. */
unsigned char *e2b_bytes_decode(const char *s, size_t *ret_len);
/* The messages of a Connect client stream (a body of envelopes; the end-of-stream one, if
 * any, last), at most max, as an array of objects; NULL with why. */
json_t *e2b_connect_messages(const char *data, size_t n, size_t max, char why[256]);

/* A create's body, checked: the fields runcell takes and none it refuses. */
struct e2b_create {
    const char *template_id; /* borrowed from the body */
    json_t *metadata;        /* borrowed: an object of strings, or NULL */
    json_t *env;             /* borrowed: an object of strings with variable names, or NULL */
    uint64_t timeout_s;
    int internet;           /* allow_internet_access: 1 true, 0 false, -1 not said */
    bool deny_all;          /* network.denyOut is E2B's ALL_TRAFFIC: only allowOut is reachable */
    char **allow_out;       /* network.allowOut (owned; strv_free), or NULL */
    bool auto_pause;        /* autoPause: at its timeout, paused rather than killed */
    bool auto_pause_memory; /* autoPauseMemory (default true): paused keeping its memory */
    char snapshot[40];      /* templateID named one of runcell's snapshots: its id, else "" */
};
/* 0, or -EINVAL with why (naming the field). */
int e2b_create_parse(json_t *body, uint64_t max_timeout_s, struct e2b_create *ret, char why[512]);

/* ---- envd.c, process.c and interp.c ---- */
bool e2b_is_connect_stream(struct request *rq);
/* The request message, or NULL after replying. */
json_t *e2b_connect_request(struct request *rq);
enum MHD_Result h_e2b_execute(struct request *rq);
enum MHD_Result h_e2b_contexts_list(struct request *rq);
enum MHD_Result h_e2b_context_create(struct request *rq);
enum MHD_Result h_e2b_context_delete(struct request *rq);
enum MHD_Result h_e2b_context_restart(struct request *rq);
enum MHD_Result h_e2b_files_get(struct request *rq);
enum MHD_Result h_e2b_files_post(struct request *rq);
enum MHD_Result h_e2b_process_rpc(struct request *rq);
enum MHD_Result h_e2b_filesystem_rpc(struct request *rq);
/* ---- watch.c ---- */
/* WatchDir's stream (s's reference is the response's from now). */
enum MHD_Result e2b_watch_dir(struct request *rq, json_t *msg, struct session *s);
/* CreateWatcher, GetWatcherEvents, RemoveWatcher. */
enum MHD_Result e2b_watcher_rpc(struct request *rq, const char *method, json_t *msg,
                                struct session *s);
void e2b_watchers_free(struct e2b_watcher *w);

/* ---- stream.c ---- */
extern const struct exec_encoder e2b_execute_encoder;
/* A fresh state for e2b_execute_encoder (freed by the encoder). */
void *e2b_execute_state(void);
/* envd's process.Process Start and Connect streams: p's events (after seq `after`) as
 * Connect envelopes, a start event first; p's reference is the response's from now. */
enum MHD_Result e2b_process_stream(struct request *rq, struct session_proc *p, uint64_t after);
/* One Connect envelope (flags 0, or 0x02 for the end of a stream) of j (reference stolen). */
void e2b_envelope(struct buf *out, json_t *j, unsigned char flags);
/* Submits code to s (its reference, owned now) and replies with the code interpreter's
 * stream of its events; one that cannot be submitted (the execution cap) is told in the
 * stream. */
enum MHD_Result e2b_execute_stream(struct request *rq, struct session *s, const char *code,
                                   const char *lang);
/* /execute's answer for what it refuses: 200, an error message {name, value, traceback} and
 * end_of_execution, which the SDKs show as execution.error. */
enum MHD_Result e2b_execute_refused(struct request *rq, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
