/* cmd_serve.c - `runcell serve`: the HTTP/JSON API. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "api/api.h"
#include "cli/cli.h"

static const char serve_help[] =
    "usage: runcell serve [--listen HOST:PORT] [--data DIR] [--token TOKEN] [OPTIONS]\n"
    "\n"
    "Serves the HTTP/JSON API (docs/API.md). Every route but /healthz needs\n"
    "'Authorization: Bearer TOKEN'; the token comes from --token, RUNCELL_TOKEN, DATA/token,\n"
    "or is generated on first start and saved to DATA/token.\n"
    "\n"
    "  --listen HOST:PORT     address (default 127.0.0.1:8080)\n"
    "  --data DIR             state directory (default RUNCELL_DATA or /var/lib/runcell)\n"
    "  --token TOKEN          API token\n"
    "  --max-sessions N       live sessions at most (default 1000)\n"
    "  --max-executions N     executions running at once (default 64)\n"
    "  --max-memory MB        the most memory a session may ask for (default 8192)\n"
    "  --max-timeout SEC      the longest per-execution timeout allowed (default 3600)\n"
    "  --max-upload MB        the largest file upload (default 1024)\n"
    "  --max-body MB          the largest JSON request body (default 64)\n"
    "  --max-pids N, --max-disk MB, --max-idle-timeout SEC\n"
    "                         the most a session may ask for (defaults 4096, 8192, 604800)\n"
    "  --timeout SEC          default per-execution timeout (default 60)\n"
    "  --idle-timeout SEC     default idle timeout of sessions (default 600)\n"
    "  --memory MB, --pids N, --disk MB, --cpus N   default session limits\n"
    "  --shutdown-grace SEC   on SIGTERM, how long running cells may finish (default 10)\n";

enum {
    OPT_LISTEN = OPT_COMMON_END,
    OPT_DATA,
    OPT_TOKEN,
    OPT_MAX_SESSIONS,
    OPT_MAX_EXECUTIONS,
    OPT_MAX_MEMORY,
    OPT_MAX_TIMEOUT,
    OPT_MAX_UPLOAD,
    OPT_IDLE_TIMEOUT,
    OPT_GRACE,
    OPT_MAX_BODY,
    OPT_MAX_PIDS,
    OPT_MAX_DISK,
    OPT_MAX_IDLE_TIMEOUT
};

static const struct option long_opts[] = {
    COMMON_LONG_OPTS,
    {"listen", required_argument, NULL, OPT_LISTEN},
    {"data", required_argument, NULL, OPT_DATA},
    {"token", required_argument, NULL, OPT_TOKEN},
    {"max-sessions", required_argument, NULL, OPT_MAX_SESSIONS},
    {"max-executions", required_argument, NULL, OPT_MAX_EXECUTIONS},
    {"max-memory", required_argument, NULL, OPT_MAX_MEMORY},
    {"max-timeout", required_argument, NULL, OPT_MAX_TIMEOUT},
    {"max-upload", required_argument, NULL, OPT_MAX_UPLOAD},
    {"idle-timeout", required_argument, NULL, OPT_IDLE_TIMEOUT},
    {"shutdown-grace", required_argument, NULL, OPT_GRACE},
    {"max-body", required_argument, NULL, OPT_MAX_BODY},
    {"max-pids", required_argument, NULL, OPT_MAX_PIDS},
    {"max-disk", required_argument, NULL, OPT_MAX_DISK},
    {"max-idle-timeout", required_argument, NULL, OPT_MAX_IDLE_TIMEOUT},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* A size given in MB, kept in bytes. */
static int opt_mb_as_bytes(const char *opt, const char *val, uint64_t *ret_bytes)
{
    uint64_t mb;
    int r = opt_megabytes("serve", opt, val, &mb);
    if (!r)
        *ret_bytes = mb << 20;
    return r;
}

static int serve_opt(struct server_config *cfg, struct common_opts *co, int c, char *val)
{
    uint64_t v;
    int r;
    switch (c) {
    case OPT_LISTEN:
        cfg->listen = val;
        return 0;
    case OPT_DATA:
        cfg->data_dir = val;
        return 0;
    case OPT_TOKEN:
        cfg->token = val;
        return 0;
    case OPT_MAX_SESSIONS:
        r = opt_count("serve", "--max-sessions", val, &v);
        cfg->limits.max_sessions = v;
        return r;
    case OPT_MAX_EXECUTIONS:
        r = opt_count("serve", "--max-executions", val, &v);
        cfg->limits.max_executions = v;
        return r;
    case OPT_MAX_MEMORY:
        return opt_megabytes("serve", "--max-memory", val, &cfg->limits.max_memory_mb);
    case OPT_MAX_TIMEOUT:
        return opt_seconds("serve", "--max-timeout", val, &cfg->limits.max_timeout_ms);
    case OPT_MAX_UPLOAD:
        return opt_mb_as_bytes("--max-upload", val, &cfg->limits.max_upload_bytes);
    case OPT_MAX_BODY:
        return opt_mb_as_bytes("--max-body", val, &cfg->limits.max_body_bytes);
    case OPT_MAX_PIDS:
        return opt_count("serve", "--max-pids", val, &cfg->limits.max_pids);
    case OPT_MAX_DISK:
        return opt_megabytes("serve", "--max-disk", val, &cfg->limits.max_disk_mb);
    case OPT_MAX_IDLE_TIMEOUT:
        return opt_seconds("serve", "--max-idle-timeout", val, &cfg->limits.max_idle_timeout_ms);
    case OPT_IDLE_TIMEOUT:
        return opt_seconds("serve", "--idle-timeout", val, &cfg->defaults.idle_timeout_ms);
    case OPT_GRACE:
        return opt_seconds("serve", "--shutdown-grace", val, &cfg->shutdown_grace_ms);
    case OPT_FILE:
    case OPT_OUT:
        return usage_error("serve", "--file and --out do not apply to serve");
    default:
        r = common_opt("serve", co, c, val);
        return r < 0 ? usage_error("serve", "unknown option; run 'runcell serve --help'") : r;
    }
}

static bool over_max(const char *opt, uint64_t val, const char *max_opt, uint64_t max, double scale)
{
    if (val <= max)
        return false;
    usage_error("serve",
                "the default %s (%g) is more than %s (%g); lower one or raise the "
                "other",
                opt, (double)val / scale, max_opt, (double)max / scale);
    return true;
}

/* A default a session gets without asking must be one it could ask for. */
static int check_defaults(const struct server_config *cfg)
{
    const struct server_limits *m = &cfg->limits;
    const struct session_opts *d = &cfg->defaults;
    if (over_max("--memory", d->limits.memory_mb, "--max-memory", m->max_memory_mb, 1) ||
        over_max("--pids", d->limits.pids, "--max-pids", m->max_pids, 1) ||
        over_max("--disk", d->limits.disk_mb, "--max-disk", m->max_disk_mb, 1) ||
        over_max("--cpus", d->limits.cpus_milli, "the machine's cores", m->max_cpus_milli, 1000) ||
        over_max("--timeout", d->timeout_ms, "--max-timeout", m->max_timeout_ms, 1000) ||
        over_max("--idle-timeout", d->idle_timeout_ms, "--max-idle-timeout", m->max_idle_timeout_ms,
                 1000))
        return EXIT_USAGE;
    return 0;
}

int cmd_serve(int argc, char **argv)
{
    struct server_config cfg = {.listen = "127.0.0.1:8080", .shutdown_grace_ms = 10000};
    struct common_opts co = {0};
    _cleanup_free_ char *data = NULL;
    int c, r = 0;
    opterr = 0;
    optind = 1;
    while (!r && (c = getopt_long(argc, argv, "+:h", long_opts, NULL)) != -1) {
        if (c == 'h') {
            fputs(serve_help, stdout);
            return 0;
        }
        if (c == ':')
            r = usage_error("serve", "option '%s' needs a value", argv[optind - 1]);
        else if (c == '?')
            r = usage_error("serve", "unknown option '%s'; run 'runcell serve --help'",
                            argv[optind - 1]);
        else
            r = serve_opt(&cfg, &co, c, optarg);
    }
    if (!r && optind < argc)
        r = usage_error("serve", "unexpected argument '%s'", argv[optind]);
    if (r)
        return r;
    if (!cfg.data_dir)
        cfg.data_dir = data = default_data_dir();
    server_limits_fill_defaults(&cfg.limits);
    cfg.defaults.limits = co.limits;
    cfg.defaults.timeout_ms = co.timeout_ms;
    session_opts_fill_defaults(&cfg.defaults);
    if ((r = check_defaults(&cfg)))
        return r;
    if (!getenv("RUNCELL_LOG"))
        log_set_level(LOG_INFO);
    return server_run(&cfg);
}
