/* cmd_repl.c - `runcell repl`: an interactive, stateful Python session in the terminal. */
#include <editline/readline.h>
#include <errno.h>
#include <fcntl.h>
#include <langinfo.h>
#include <locale.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

static const char repl_usage[] =
    "usage: runcell repl [OPTIONS]\n"
    "\n"
    "An interactive Python session in a sandbox: variables, files and installed packages\n"
    "persist between inputs. Multi-line input ends with an empty line; Ctrl-C interrupts\n"
    "the running input (the session lives on); Ctrl-D ends the session.\n"
    "\n";

struct repl_opts {
    struct common_opts common;
    struct store_opts store;
    const char *resume;
    const char *data_dir;
    bool no_persist;
};

#define F(member) offsetof(struct repl_opts, member)

/* The common options as a repl takes them, and what its own are about. */
static const char repl_common_help[] =
    "  --timeout SEC        limit per input (default 60)\n"
    "  --memory MB, --pids N, --disk MB, --cpus N   as for runcell run\n"
    "  --net none|allow:HOST[:PORT],..., --package SPEC, --index-url URL,\n"
    "  --install-timeout SEC  network and packages, as for runcell run\n"
    "  --file LOCAL[:DEST]  copy LOCAL into the workspace (repeatable)\n"
    "  --out DIR            save images here (default: into the workspace)\n"
    "\n"
    "The session is kept (docs/PERSISTENCE.md): its files after every input, its variables\n"
    "when the repl ends, in the data directory that runcell serve uses too.";

static const struct opt_spec repl_specs[] = {
    {NULL, .help = repl_common_help},
    {"resume", "ID", OPTK_STRING, F(resume),
     .help = "start from what is stored of session ID (a repl's or a server's)"},
    {"no-persist", NULL, OPTK_FLAG, F(no_persist), .help = "keep nothing"},
    {"data", "DIR", OPTK_STRING, F(data_dir),
     .help = "data directory (default RUNCELL_DATA, /var/lib/runcell as root,\n"
             "else ~/.local/share/runcell)"},
};

static const struct opt_cmd repl_cmd = {
    .name = "repl",
    .usage = repl_usage,
    .own = OPT_TABLE(repl_specs),
    .groups = {{&common_opt_table, F(common)}, {&store_opt_table, F(store), .listed = true}},
    .column = 23,
};

static int sigint_pipe[2] = {-1, -1};
static volatile sig_atomic_t got_sigint;
static volatile sig_atomic_t got_term; /* SIGTERM or SIGHUP: end the session */

static void on_sigint(int sig)
{
    (void)sig;
    got_sigint = 1;
    (void)!write(sigint_pipe[1], "x", 1);
}

/* The terminal went away or we were told to stop: interrupt the running input (through the
 * same pipe as Ctrl-C) and end the session cleanly, so its workspace is removed now rather
 * than swept by a later runcell. */
static void on_term(int sig)
{
    got_term = sig;
    (void)!write(sigint_pipe[1], "x", 1);
}

static void drain_sigint(void)
{
    char b[64];
    while (read(sigint_pipe[0], b, sizeof(b)) > 0)
        ;
    got_sigint = 0;
}

/* ---- reading one input: the Python REPL's rules for when a block is complete ---- */

struct scan_state {
    int depth;       /* open (, [, { */
    char quote;      /* inside a string: its quote char */
    bool triple;     /* ... a triple-quoted one */
    bool ends_colon; /* the last code line ends with ':' */
    bool ends_backslash;
};

static void scan_line(struct scan_state *st, const char *line)
{
    char last = 0;
    for (const char *p = line; *p; p++) {
        if (st->quote) {
            if (*p == '\\' && p[1]) {
                p++;
            } else if (*p == st->quote &&
                       (!st->triple || (p[1] == st->quote && p[2] == st->quote))) {
                p += st->triple ? 2 : 0;
                st->quote = 0;
            }
            last = 'x';
            continue;
        }
        if (*p == '#')
            break;
        if (*p == '"' || *p == '\'') {
            st->triple = p[1] == *p && p[2] == *p;
            st->quote = *p;
            p += st->triple ? 2 : 0;
        } else if (strchr("([{", *p)) {
            st->depth++;
        } else if (strchr(")]}", *p) && st->depth > 0) {
            st->depth--;
        }
        if (*p != ' ' && *p != '\t')
            last = *p;
    }
    if (st->quote && !st->triple)
        st->quote = 0; /* an unterminated one-line string is a syntax error, not more input */
    st->ends_colon = last == ':';
    st->ends_backslash = last == '\\';
}

/* libedit's reader of terminal input. Its own only notices Ctrl-C that interrupts its
 * read(): one that lands just before (while it echoes the last key) leaves the prompt
 * waiting for a key. The handlers write to sigint_pipe, so waiting on the terminal and the
 * pipe together misses none; EOF makes readline() return NULL, and got_sigint says why.
 * A UTF-8 sequence is decoded here: libedit takes what this returns as one wide char. */
static int repl_getc(FILE *f)
{
    int fd = fileno(f);
    struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = sigint_pipe[0], .events = POLLIN}};
    for (;;) {
        if (got_sigint || got_term)
            return EOF;
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            return EOF;
        }
        if (p[1].revents)
            return EOF;
        unsigned char c;
        ssize_t n = read(fd, &c, 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n != 1)
            return EOF;
        int more = c >= 0xf0 && c < 0xf8 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : 0;
        if (c < 0x80 || !more || c >= 0xf8)
            return c;
        int cp = c & (0x3f >> more);
        while (more--) {
            if (read(fd, &c, 1) != 1 || (c & 0xc0) != 0x80)
                return 0xfffd;
            cp = cp << 6 | (c & 0x3f);
        }
        return cp;
    }
}

/* libedit turns what it read back into bytes in LC_CTYPE's encoding; in the C locale that
 * a program starts in (and on a fresh host without LANG) every non-ASCII character is
 * dropped. Cells are UTF-8 whatever the terminal's locale says it is. */
static void use_utf8_ctype(void)
{
    const char *set = setlocale(LC_CTYPE, "");
    if (set && !strcmp(nl_langinfo(CODESET), "UTF-8"))
        return;
    if (!setlocale(LC_CTYPE, "C.UTF-8"))
        setlocale(LC_CTYPE, "C"); /* no UTF-8 locale at all: ASCII only, as before */
}

static char *read_line(const char *prompt, bool tty)
{
    if (tty) {
        rl_getc_function = repl_getc;
        return readline(prompt);
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, stdin);
    if (n < 0) {
        free(line);
        return NULL;
    }
    if (n && line[n - 1] == '\n')
        line[n - 1] = '\0';
    return line;
}

/* Returns a complete input, "" after Ctrl-C at the prompt, or NULL at end of input. */
static char *read_input(bool tty)
{
    struct buf cell;
    struct scan_state st = {0};
    bool block = false;
    buf_init(&cell, 0);
    for (;;) {
        drain_sigint();
        char *line = got_term ? NULL : read_line(cell.len ? "...     " : "runcell> ", tty);
        if (!line && got_term) {
            buf_release(&cell);
            return NULL;
        }
        if (!line) {
            bool interrupted = got_sigint;
            if (interrupted && tty) {
                fputs("^C\n", stdout);
                buf_release(&cell);
                return xstrdup("");
            }
            if (!cell.len) {
                buf_release(&cell);
                return NULL;
            }
            break;
        }
        bool empty = strspn(line, " \t") == strlen(line);
        if (cell.len)
            buf_append(&cell, "\n", 1);
        buf_append(&cell, line, strlen(line));
        scan_line(&st, line);
        bool indented = line[0] == ' ' || line[0] == '\t';
        free(line);
        if (st.ends_colon)
            block = true;
        if (st.depth > 0 || st.quote || st.ends_backslash || st.ends_colon)
            continue;
        if (block && !empty && (indented || cell.len))
            continue; /* a block ends with an empty line */
        break;
    }
    return buf_detach(&cell, NULL);
}

/* ---- showing what a cell produced ---- */

struct repl {
    struct session *s;
    const struct common_opts *o;
    long cell;
    int images;
};

static void save_image(struct repl *r, const char *b64, const char *mime)
{
    _cleanup_free_ char *name = NULL;
    if (exec_figure_save(session_workspace(r->s), r->o->out_dir, r->cell, (size_t)++r->images, mime,
                         b64, &name) == 0)
        printf("[image saved: %s/%s]\n", r->o->out_dir ? r->o->out_dir : "/workspace", name);
}

static void on_event(void *ctx, const struct exec_event *ev)
{
    struct repl *r = ctx;
    switch (ev->type) {
    case EV_STDOUT:
    case EV_STDERR:
        fflush(stdout);
        (void)write_all(ev->type == EV_STDOUT ? 1 : 2, ev->data, ev->len);
        break;
    case EV_RESULT: {
        const char *mime, *image = exec_bundle_image(ev->json, &mime);
        if (image)
            save_image(r, image, mime);
        const char *text = json_string_value(json_object_get(ev->json, "text/plain"));
        if (text && *text && !image)
            printf("%s\n", text);
        fflush(stdout);
        break;
    }
    case EV_ERROR: {
        const char *tb = json_string_value(json_object_get(ev->json, "traceback"));
        fflush(stdout);
        if (tb)
            fputs(tb, stderr);
        break;
    }
    case EV_DONE:
        break;
    }
}

static void run_input(struct repl *r, const char *code)
{
    struct exec_record rec;
    struct exec_request req = {.code = code,
                               .lang = "python",
                               .timeout_ms = r->o->timeout_ms,
                               .cancel_fd = sigint_pipe[0]};
    struct exec_sink sink = {.fn = on_event, .ctx = r};
    exec_record_init(&rec, DEFAULT_OUTPUT_CAP);
    r->cell++;
    r->images = 0;
    drain_sigint();
    if (session_execute(r->s, &req, &sink, &rec) < 0)
        fprintf(stderr, "runcell: %s\n", err_msg());
    else if (rec.message && rec.status != EXEC_OK)
        fprintf(stderr, "runcell: %s\n", rec.message);
    exec_record_release(&rec);
}

static int repl_loop(struct session *s, const struct common_opts *o)
{
    bool tty = isatty(STDIN_FILENO);
    struct repl r = {.s = s, .o = o};
    if (tty)
        printf("runcell repl: Python %s in a sandbox (files in /workspace). Ctrl-C interrupts, "
               "Ctrl-D ends.\n",
               session_python_version(s));
    while (!got_term) {
        char *code = read_input(tty);
        if (!code)
            break;
        if (!got_term && strspn(code, " \t\n") != strlen(code)) {
            if (tty)
                add_history(code);
            run_input(&r, code);
        }
        free(code);
    }
    if (got_term)
        return 128 + got_term;
    if (tty)
        putchar('\n');
    return 0;
}

/* Opens the store, starts the session and, resuming, fills it; 0, or an exit status after
 * printing why. */
static int start(struct sandbox_host *host, struct repl_opts *ro, struct repl_keep *k,
                 struct session **ret)
{
    struct session_opts so = {.limits = ro->common.limits,
                              .timeout_ms = ro->common.timeout_ms,
                              .net = common_net_opts(&ro->common),
                              .files = ro->common.files,
                              .n_files = ro->common.n_files};
    bool keep = !ro->no_persist;
    if (keep && repl_keep_open(k, ro->data_dir, &ro->store, host->owner_id) < 0) {
        if (ro->resume) {
            fprintf(stderr, "runcell repl: cannot resume: %s\n", err_msg());
            return 1;
        }
        fprintf(stderr,
                "runcell repl: warning: this session is not kept: %s (pass --data DIR, "
                "or --no-persist to silence this)\n",
                err_msg());
        keep = false;
    }
    if (ro->resume && !keep)
        return usage_error("repl", "--resume and --no-persist exclude each other");
    if (ro->resume && repl_keep_stored_limits(k, ro->resume, &so.limits) < 0) {
        fprintf(stderr, "runcell repl: %s\n", err_msg());
        return 1;
    }
    if (session_new(host, &so, ret) < 0) {
        fprintf(stderr, "runcell: cannot start the session: %s\n", err_msg());
        return 125;
    }
    if (keep && repl_keep_attach(k, *ret, true, ro->resume) < 0) {
        fprintf(stderr, "runcell repl: %s%s\n", ro->resume ? "cannot resume: " : "", err_msg());
        session_retire(*ret, SESSION_END_CLOSE, NULL);
        return 1;
    }
    return 0;
}

int cmd_repl(int argc, char **argv)
{
    struct repl_opts ro = {.common = {.timeout_ms = DEFAULT_TIMEOUT_MS},
                           .store = {.quota_bytes = (uint64_t)DEFAULT_STORE_QUOTA_MB << 20}};
    struct repl_keep k = {0};
    int first, r = opttab_parse(&repl_cmd, argc, argv, &ro, &first);
    if (!r)
        r = check_net_opts("repl", &ro.common);
    if (r) {
        common_opts_release(&ro.common);
        return r == OPTTAB_HELP ? 0 : r;
    }
    if (isatty(STDIN_FILENO))
        use_utf8_ctype();
    struct sandbox_host host;
    struct session *s = NULL;
    if (sandbox_host_init(&host) < 0) {
        fprintf(stderr, "runcell: %s\n", err_msg());
        sandbox_host_release(&host);
        return 125;
    }
    if (host.degraded_reason)
        fprintf(stderr, "runcell: warning: resource limits are degraded: %s\n",
                host.degraded_reason);
    if (pipe2(sigint_pipe, O_CLOEXEC | O_NONBLOCK) == 0) {
        struct sigaction sa = {.sa_handler = on_sigint};
        sigaction(SIGINT, &sa, NULL);
        struct sigaction st = {.sa_handler = on_term};
        sigaction(SIGTERM, &st, NULL);
        sigaction(SIGHUP, &st, NULL);
    }
    int status = start(&host, &ro, &k, &s);
    if (!status) {
        print_packages_report(session_packages(s));
        status = repl_loop(s, &ro.common);
        if (session_id(s))
            repl_keep_end(s);
    }
    session_free(s);
    repl_keep_close(&k);
    sandbox_host_release(&host);
    common_opts_release(&ro.common);
    return status;
}
