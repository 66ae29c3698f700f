/* cmd_run.c - `runcell run`: one fresh sandbox, stateless; exits with the code's status. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "session/session.h"

#define MAX_STDIN_CODE (16u << 20)

struct run_opts {
    const char *lang;
    char **codes; /* each -c */
    const char *file;
    bool from_stdin;
    char **args;
    struct input_file *files;
    size_t n_files;
    struct sandbox_limits limits;
    uint64_t timeout_ms;
    const char *out_dir;
    bool json;
};

static const char run_help[] =
    "usage: runcell run [OPTIONS] (FILE | -c CODE | -) [ARGS...]\n"
    "\n"
    "Runs code in a fresh, locked-down sandbox and exits with its status\n"
    "(124 timeout, 128+N signal, 137 out of memory, 125 sandbox failure, 2 usage).\n"
    "\n"
    "  --lang python|bash   language (default python: Debian's /usr/bin/python3)\n"
    "  -c CODE              code to run\n"
    "  --timeout SEC        wall-clock limit (default 60)\n"
    "  --memory MB          memory limit (default 1024)\n"
    "  --pids N             process limit (default 256)\n"
    "  --disk MB            size of the workspace and of /tmp, each (default 1024)\n"
    "  --cpus N             CPU cores (default 1; fractions allowed)\n"
    "  --file LOCAL[:DEST]  copy LOCAL into the workspace (repeatable)\n"
    "  --out DIR            copy files the code created or changed into DIR\n"
    "  --json               print the result record as JSON instead of the streams\n"
    "  --net none           network policy (only 'none': loopback inside the sandbox)\n";

enum { OPT_LANG = 256, OPT_TIMEOUT, OPT_MEMORY, OPT_PIDS, OPT_DISK, OPT_CPUS, OPT_FILE,
       OPT_OUT, OPT_JSON, OPT_NET };

static const struct option long_opts[] = {
    {"lang", required_argument, NULL, OPT_LANG},
    {"timeout", required_argument, NULL, OPT_TIMEOUT},
    {"memory", required_argument, NULL, OPT_MEMORY},
    {"pids", required_argument, NULL, OPT_PIDS},
    {"disk", required_argument, NULL, OPT_DISK},
    {"cpus", required_argument, NULL, OPT_CPUS},
    {"file", required_argument, NULL, OPT_FILE},
    {"out", required_argument, NULL, OPT_OUT},
    {"json", no_argument, NULL, OPT_JSON},
    {"net", required_argument, NULL, OPT_NET},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static int parse_file_opt(struct run_opts *o, char *val)
{
    _cleanup_free_ char *given = xstrdup(val); /* for messages: val is split in place */
    char *colon = strrchr(val, ':');
    const char *local = val, *dest;
    if (colon) {
        *colon = '\0';
        dest = colon + 1;
    } else {
        dest = strrchr(val, '/') ? strrchr(val, '/') + 1 : val;
    }
    if (!*local)
        return usage_error("run", "--file: empty local path in '%s'", given);
    if (!path_is_safe_relative(dest))
        return usage_error("run", "--file: bad destination '%s': use a relative path inside "
                           "the workspace, without '..'", dest);
    struct stat st;
    if (stat(local, &st) < 0)
        return usage_error("run", "--file: cannot read %s: %s", local, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return usage_error("run", "--file: %s is not a regular file", local);
    o->files = xrealloc(o->files, (o->n_files + 1) * sizeof(*o->files));
    o->files[o->n_files++] = (struct input_file){.local = local, .dest = dest};
    return 0;
}

static int parse_cpus(const char *val, uint64_t *ret_milli)
{
    uint64_t ms;
    if (parse_seconds(val, &ms) < 0 || ms > 1024 * 1000)
        return usage_error("run", "--cpus: '%s' is not a number of cores (e.g. 1 or 0.5)", val);
    *ret_milli = ms; /* the "seconds" parser yields thousandths */
    return 0;
}

static int parse_opt(struct run_opts *o, int c, char *val)
{
    switch (c) {
    case 'c':
        o->codes = strv_push(o->codes, val);
        return 0;
    case OPT_LANG:
        if (!lang_supported(val))
            return usage_error("run", "--lang: unknown language '%s': use python or bash", val);
        o->lang = val;
        return 0;
    case OPT_TIMEOUT:
        return opt_seconds("run", "--timeout", val, &o->timeout_ms);
    case OPT_MEMORY:
        return opt_megabytes("run", "--memory", val, &o->limits.memory_mb);
    case OPT_PIDS:
        return opt_count("run", "--pids", val, &o->limits.pids);
    case OPT_DISK:
        return opt_megabytes("run", "--disk", val, &o->limits.disk_mb);
    case OPT_CPUS:
        return parse_cpus(val, &o->limits.cpus_milli);
    case OPT_FILE:
        return parse_file_opt(o, val);
    case OPT_OUT:
        o->out_dir = val;
        return 0;
    case OPT_JSON:
        o->json = true;
        return 0;
    case OPT_NET:
        if (strcmp(val, "none"))
            return usage_error("run", "--net: unknown policy '%s': only 'none' is supported",
                               val);
        return 0;
    case 'h':
        fputs(run_help, stdout);
        exit(0);
    default:
        return usage_error("run", "unknown option; run 'runcell run --help'");
    }
}

static int parse_args(struct run_opts *o, int argc, char **argv)
{
    int c, r;
    opterr = 0;
    optind = 1;
    /* The leading ':' makes getopt report a missing value as ':', apart from '?'. For a
     * long option, optopt is its table value (>= 256), not a character to print. */
    while ((c = getopt_long(argc, argv, "+:c:h", long_opts, NULL)) != -1) {
        if (c == ':') {
            if (optopt == 'c')
                return usage_error("run", "-c needs CODE");
            return usage_error("run", "option '%s' needs a value", argv[optind - 1]);
        }
        if (c == '?') {
            if (optopt >= 256)
                return usage_error("run", "option '%.*s' takes no value",
                                   (int)strcspn(argv[optind - 1], "="), argv[optind - 1]);
            if (optopt)
                return usage_error("run", "unknown option -%c; run 'runcell run --help'",
                                   optopt);
            return usage_error("run", "unknown option '%s'; run 'runcell run --help'",
                               argv[optind - 1]);
        }
        if ((r = parse_opt(o, c, optarg)))
            return r;
    }
    if (!o->codes && optind >= argc)
        return usage_error("run", "nothing to run: give FILE, -c CODE or - (stdin)");
    if (!o->codes) {
        const char *what = argv[optind++];
        if (!strcmp(what, "-"))
            o->from_stdin = true;
        else
            o->file = what;
    }
    for (; optind < argc; optind++)
        o->args = strv_push(o->args, argv[optind]);
    return 0;
}

/* Scripts and stdin code must be text: a NUL byte means a binary was passed by mistake. */
static int check_text(const char *what, const char *data, size_t n)
{
    if (memchr(data, '\0', n))
        return usage_error("run", "%s is not text (it contains a NUL byte)", what);
    return 0;
}

static int check_script(const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return usage_error("run", "cannot read %s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return usage_error("run", "%s is not a regular file", path);
    char *data;
    size_t n;
    int r = read_file(path, 64u << 20, &data, &n);
    if (r < 0)
        return usage_error("run", "cannot read %s: %s", path, strerror(-r));
    r = check_text(path, data, n);
    free(data);
    return r;
}

static int read_stdin_code(char **ret)
{
    struct buf b;
    buf_init(&b, MAX_STDIN_CODE);
    int r = read_all(STDIN_FILENO, &b);
    if (r == -E2BIG) {
        buf_release(&b);
        return usage_error("run", "code on stdin is larger than %u MiB", MAX_STDIN_CODE >> 20);
    }
    if (r < 0) {
        buf_release(&b);
        return usage_error("run", "cannot read code from stdin: %s", strerror(-r));
    }
    size_t n;
    char *code = buf_detach(&b, &n);
    if ((r = check_text("the code on stdin", code, n))) {
        free(code);
        return r;
    }
    *ret = code;
    return 0;
}

static int cancel_pipe[2] = {-1, -1};
static volatile sig_atomic_t cancel_signal;

static void on_signal(int sig)
{
    cancel_signal = sig;
    (void)!write(cancel_pipe[1], "x", 1);
}

static void forward_output(void *ctx, int stream, const char *data, size_t n)
{
    (void)ctx;
    (void)write_all(stream == 1 ? STDOUT_FILENO : STDERR_FILENO, data, n);
}

static void print_outcome(const struct run_opts *o, const struct exec_record *rec)
{
    if (rec->message && rec->status != EXEC_OK && rec->status != EXEC_ERROR)
        fprintf(stderr, "runcell: %s\n", rec->message);
    if (!o->out_dir)
        return;
    size_t n = strv_len(rec->copied_out);
    fprintf(stderr, "runcell: %zu file%s written to %s%s", n, n == 1 ? "" : "s", o->out_dir,
            n ? ":" : "\n");
    for (char **f = rec->copied_out; n && *f; f++)
        fprintf(stderr, " %s", *f);
    if (n)
        fputc('\n', stderr);
}

static void print_json(const struct exec_record *rec)
{
    json_t *j = exec_record_json(rec);
    json_dumpf(j, stdout, JSON_COMPACT);
    fputc('\n', stdout);
    json_decref(j);
}

/* The host could not be set up: nothing ran. A --json caller still gets a record, as it
 * does for every other sandbox failure. */
static int host_failed(const struct run_opts *o)
{
    fprintf(stderr, "runcell: %s\n", err_msg());
    if (o->json) {
        struct exec_record rec;
        exec_record_init(&rec, DEFAULT_OUTPUT_CAP);
        rec.status = EXEC_SANDBOX_ERROR;
        rec.message = xstrdup(err_msg());
        print_json(&rec);
        exec_record_release(&rec);
    }
    return 125;
}

static int execute(struct run_opts *o, const char *code)
{
    struct sandbox_host host;
    if (sandbox_host_init(&host) < 0) {
        int status = host_failed(o);
        sandbox_host_release(&host);
        return status;
    }
    if (host.degraded_reason)
        fprintf(stderr, "runcell: warning: resource limits are degraded: %s\n",
                host.degraded_reason);
    if (pipe2(cancel_pipe, O_CLOEXEC | O_NONBLOCK) == 0) {
        struct sigaction sa = {.sa_handler = on_signal};
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGHUP, &sa, NULL);
    }
    sandbox_limits_fill_defaults(&o->limits);
    struct run_request req = {
        .lang = o->lang, .code = code, .script_path = o->file, .args = o->args,
        .files = o->files, .n_files = o->n_files, .limits = o->limits,
        .timeout_ms = o->timeout_ms, .output_cap = DEFAULT_OUTPUT_CAP, .out_dir = o->out_dir,
        .on_output = o->json ? NULL : forward_output, .cancel_fd = cancel_pipe[0],
    };
    struct exec_record rec;
    exec_record_init(&rec, req.output_cap);
    int status;
    if (run_oneshot(&host, &req, &rec) < 0) {
        fprintf(stderr, "runcell run: %s\n", err_msg());
        status = EXIT_USAGE;
    } else {
        if (o->json)
            print_json(&rec);
        else
            print_outcome(o, &rec);
        status = cancel_signal ? 128 + cancel_signal : exec_record_exit_status(&rec);
    }
    exec_record_release(&rec);
    sandbox_host_release(&host);
    return status;
}

/* --out must be a directory we can write to; it is made now, so that a run is not wasted
 * on a destination that cannot take its files. */
static int check_out_dir(const char *dir)
{
    struct stat st;
    int r = mkdir_p(dir, 0755);
    if (r < 0)
        return usage_error("run", "--out: cannot create %s: %s", dir, strerror(-r));
    if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode))
        return usage_error("run", "--out: %s is not a directory", dir);
    if (access(dir, W_OK | X_OK) < 0)
        return usage_error("run", "--out: cannot write to %s: %s", dir, strerror(errno));
    return 0;
}

int cmd_run(int argc, char **argv)
{
    struct run_opts o = {.lang = "python", .timeout_ms = DEFAULT_TIMEOUT_MS};
    _cleanup_free_ char *stdin_code = NULL;
    int r = parse_args(&o, argc, argv);
    if (!r && o.file)
        r = check_script(o.file);
    if (!r && o.from_stdin)
        r = read_stdin_code(&stdin_code);
    if (!r && strv_len(o.codes) > 1)
        r = usage_error("run", "several -c are run as cells of one session, which needs the "
                        "session kernel");
    if (!r && o.out_dir)
        r = check_out_dir(o.out_dir);
    if (!r)
        r = execute(&o, stdin_code ? stdin_code : (o.codes ? o.codes[0] : NULL));
    strv_free(o.codes);
    strv_free(o.args);
    free(o.files);
    return r;
}
