/* cmd_mcp.c - `runcell mcp`: the MCP server on stdin and stdout (newline-delimited JSON-RPC).
 * The main thread only reads; tool calls run on threads of their own, so a ping or a
 * notifications/cancelled is read and acted on while a cell runs. stdout carries protocol
 * messages and nothing else; logs go to stderr. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "cli/cli.h"
#include "mcp/mcp.h"

static const char mcp_usage[] =
    "usage: runcell mcp [OPTIONS]\n"
    "\n"
    "Serves the Model Context Protocol on stdin and stdout, for an MCP client that starts\n"
    "runcell as a subprocess (docs/MCP.md). Tools: run_code, run_shell, create_session,\n"
    "close_session, list_files, read_file, write_file, wait_for_cell. Sessions live as long as "
    "this process\n"
    "(or, with --idle-timeout, until idle that long). The process ends when stdin closes,\n"
    "after the running calls finish, or at once (interrupting them) on SIGTERM or SIGINT.\n"
    "\n";

struct mcp_opts {
    struct common_opts common;
    uint64_t max_timeout_ms;
    uint64_t idle_timeout_ms; /* 0: sessions never expire */
    uint64_t max_sessions;
    uint64_t reply_deadline_ms; /* 0: none */
};

#define F(member) offsetof(struct mcp_opts, member)

/* --reply-deadline SEC, or 0 for none. */
static int opt_reply_deadline(void *opts, const char *cmd, char *val)
{
    struct mcp_opts *o = opts;
    if (!strcmp(val, "0")) {
        o->reply_deadline_ms = 0;
        return 0;
    }
    return opt_seconds(cmd, "--reply-deadline", val, &o->reply_deadline_ms);
}

/* The common options an MCP server takes, as its sessions' defaults. */
static const char mcp_limits_help[] =
    "  --memory MB, --pids N, --disk MB, --cpus N   limits of each session\n"
    "  --net, --secret      every session's network and credentials (default none;\n"
    "                       the run_code tool says what the code can reach)\n"
    "                       --package, --index-url and --install-timeout are refused";

static const char no_files[] =
    "--file and --out do not apply to mcp; use the write_file and read_file tools";

static const struct opt_spec mcp_specs[] = {
    {NULL, .help = "  --timeout SEC        default limit per call (default 60)"},
    {"max-timeout", "SEC", OPTK_SECONDS, F(max_timeout_ms),
     .help = "the longest timeout_s a call may ask for (default 3600)"},
    {"idle-timeout", "SEC", OPTK_SECONDS, F(idle_timeout_ms), 0, MAX_IDLE_OPT_SECONDS,
     .help = "close sessions idle this long (default: never)"},
    {"max-sessions", "N", OPTK_COUNT64, F(max_sessions),
     .help = "live sessions at most (default 64)"},
    {"reply-deadline", "SEC", OPTK_FN, .fn = opt_reply_deadline,
     .help = "a cell still running this long is answered with a run_id for\n"
             "wait_for_cell, the cell going on (default 45; 0: never, for\n"
             "clients whose request timeout is longer than the cells)"},
    {NULL, .help = mcp_limits_help},
    {"file", "LOCAL[:DEST]", OPTK_REFUSED, .help = no_files},
    {"out", "DIR", OPTK_REFUSED, .help = no_files},
};

static const struct opt_cmd mcp_cmd = {
    .name = "mcp",
    .usage = mcp_usage,
    .own = OPT_TABLE(mcp_specs),
    .groups = {{&common_opt_table, F(common)}},
    .column = 23,
};

static int parse_args(int argc, char **argv, struct mcp_opts *o)
{
    int first, r = opttab_parse(&mcp_cmd, argc, argv, o, &first);
    /* --net and --secret hold for every session (the tools tell the client what the code
     * can reach); nothing would report what pip installed. */
    const char *refused = o->common.packages             ? "--package"
                          : o->common.index_url          ? "--index-url"
                          : o->common.install_timeout_ms ? "--install-timeout"
                                                         : NULL;
    if (!r && refused)
        r = usage_error("mcp",
                        "%s is not supported by runcell mcp: its sessions get no packages "
                        "beyond those installed",
                        refused);
    if (!r)
        r = check_net_opts("mcp", &o->common);
    if (!r && o->max_timeout_ms && o->common.timeout_ms > o->max_timeout_ms)
        r = usage_error("mcp", "--timeout is longer than --max-timeout");
    return r;
}

/* ---- stdout: one message per line, never two interleaved ---- */

struct out {
    pthread_mutex_t lock;
    bool broken; /* the client closed its end */
};

static void out_send(void *ctx, const char *msg, size_t len, bool response)
{
    struct out *o = ctx;
    (void)response;
    char *line = xmalloc(len + 1);
    memcpy(line, msg, len);
    line[len] = '\n';
    pthread_mutex_lock(&o->lock);
    if (!o->broken && write_all(STDOUT_FILENO, line, len + 1) < 0)
        o->broken = true;
    pthread_mutex_unlock(&o->lock);
    free(line);
}

static void out_close(void *ctx)
{
    (void)ctx;
}

/* ---- stdin: lines, each capped at MCP_MAX_MESSAGE ---- */

struct reader {
    struct buf line;
    size_t dropped; /* bytes of an oversized line thrown away so far */
    struct mcp_conn *conn;
    const struct mcp_sink *sink;
};

static void deliver(struct reader *rd)
{
    if (rd->dropped) {
        mcp_conn_handle(rd->conn, NULL, rd->dropped + rd->line.len, rd->sink);
    } else {
        size_t n = rd->line.len;
        while (n && (rd->line.data[n - 1] == '\r' || rd->line.data[n - 1] == ' ' ||
                     rd->line.data[n - 1] == '\t'))
            n--;
        if (n) /* blank lines between messages are tolerated */
            mcp_conn_handle(rd->conn, rd->line.data, n, rd->sink);
    }
    buf_reset(&rd->line);
    rd->dropped = 0;
}

static void feed(struct reader *rd, const char *data, size_t n)
{
    while (n) {
        const char *nl = memchr(data, '\n', n);
        size_t part = nl ? (size_t)(nl - data) : n;
        if (buf_append(&rd->line, data, part) < 0) {
            /* Too long to keep: count it, tell the client at its end. */
            rd->dropped += rd->line.len + part;
            buf_reset(&rd->line);
        }
        if (!nl)
            return;
        deliver(rd);
        data += part + 1;
        n -= part + 1;
    }
}

/* Reads stdin until EOF or a signal; returns true when a signal ended it. */
static bool read_loop(struct reader *rd, int sigfd, struct out *out)
{
    static char chunk[1 << 16];
    for (;;) {
        /* stdout with no events: poll still reports POLLERR once the client closed its
         * end of a pipe or socket, and nobody would read the answers. */
        struct pollfd p[3] = {{.fd = STDIN_FILENO, .events = POLLIN},
                              {.fd = sigfd, .events = POLLIN},
                              {.fd = STDOUT_FILENO, .events = 0}};
        if (poll(p, 3, -1) < 0) {
            if (errno == EINTR)
                continue;
            return false;
        }
        if (p[1].revents || (p[2].revents & POLLERR))
            return true;
        if (!p[0].revents)
            continue;
        ssize_t n = read(STDIN_FILENO, chunk, sizeof(chunk));
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n <= 0) {
            if (rd->line.len || rd->dropped)
                deliver(rd); /* a last message without its newline */
            return false;
        }
        feed(rd, chunk, (size_t)n);
        pthread_mutex_lock(&out->lock);
        bool broken = out->broken;
        pthread_mutex_unlock(&out->lock);
        if (broken)
            return true; /* nobody reads the answers: stop as on a signal */
    }
}

/* After stdin closed: running calls finish and answer; a signal interrupts them. */
static void drain(struct mcp_conn *conn, int sigfd)
{
    bool cancelled = false;
    while (!mcp_conn_wait_idle(conn, 200)) {
        struct pollfd p = {.fd = sigfd, .events = POLLIN};
        if (!cancelled && poll(&p, 1, 0) > 0) {
            log_info("msg=\"signal while calls run; interrupting them\"");
            mcp_conn_cancel_all(conn);
            cancelled = true;
        }
    }
}

static int serve_stdio(const struct mcp_config *cfg, int sigfd)
{
    struct out out = {.broken = false};
    pthread_mutex_init(&out.lock, NULL);
    struct mcp_sink sink = {.send = out_send, .close = out_close, .ctx = &out};
    struct reader rd = {.conn = mcp_conn_new(cfg), .sink = &sink};
    buf_init(&rd.line, MCP_MAX_MESSAGE);
    bool stopped = read_loop(&rd, sigfd, &out);
    if (stopped)
        mcp_conn_cancel_all(rd.conn);
    drain(rd.conn, sigfd);
    mcp_conn_free(rd.conn);
    buf_release(&rd.line);
    pthread_mutex_destroy(&out.lock);
    return 0;
}

/* SIGINT, SIGTERM and SIGHUP are read from a signalfd by the main loop; every thread started
 * later inherits the blocked mask, so none of them is interrupted by one. */
static int block_signals(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    return signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
}

int cmd_mcp(int argc, char **argv)
{
    struct mcp_opts o = {.max_sessions = 64, .reply_deadline_ms = MCP_REPLY_DEADLINE_MS};
    int r = parse_args(argc, argv, &o);
    if (r) {
        common_opts_release(&o.common);
        return r == OPTTAB_HELP ? 0 : r;
    }
    int sigfd = block_signals();
    struct sandbox_host host;
    if (sigfd < 0 || sandbox_host_init(&host) < 0) {
        fprintf(stderr, "runcell mcp: %s\n", sigfd < 0 ? "cannot create a signalfd" : err_msg());
        if (sigfd >= 0)
            sandbox_host_release(&host);
        return 125;
    }
    if (host.degraded_reason)
        log_warn("msg=\"resource limits are degraded\" reason=%s", log_quote(host.degraded_reason));
    struct mcp_config cfg = {
        .defaults = {.limits = o.common.limits,
                     .timeout_ms = o.common.timeout_ms,
                     .idle_timeout_ms = o.idle_timeout_ms,
                     .output_cap = MCP_DEFAULT_OUTPUT_CAP,
                     .history = MCP_DEFAULT_HISTORY,
                     .net = common_net_opts(&o.common)},
        .max_timeout_ms = o.max_timeout_ms ? o.max_timeout_ms : 3600u * 1000,
        .reply_deadline_ms = o.reply_deadline_ms,
        .server_version = RUNCELL_VERSION,
    };
    session_opts_fill_defaults(&cfg.defaults);
    cfg.table = session_table_new(&host, o.max_sessions, NULL);
    int status = 0;
    if (o.idle_timeout_ms && session_table_start_reaper(cfg.table, 1000) < 0) {
        fprintf(stderr, "runcell mcp: %s\n", err_msg());
        status = 125;
    } else {
        status = serve_stdio(&cfg, sigfd);
    }
    session_table_free(cfg.table);
    sandbox_host_release(&host);
    close(sigfd);
    common_opts_release(&o.common);
    return status;
}
