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
    "  --max-connections N    HTTP connections open at once (default 1024)\n"
    "  --max-connections-per-peer N   from one client address (default half of\n"
    "                         --max-connections)\n"
    "  --max-unauthenticated N   connections open that have not sent the token yet\n"
    "                         (default an eighth of --max-connections); a new one past\n"
    "                         this closes the oldest of them\n"
    "  --header-timeout SEC   a connection that has not sent the token is closed after\n"
    "                         this long idle (default 10); with it, after 300\n"
    "  --max-pids N, --max-disk MB, --max-idle-timeout SEC\n"
    "                         the most a session may ask for (defaults 4096, 8192, 604800)\n"
    "  --timeout SEC          default per-execution timeout (default 60)\n"
    "  --idle-timeout SEC     default idle timeout of sessions (default 600)\n"
    "  --memory MB, --pids N, --disk MB, --cpus N   default session limits\n"
    "  --shutdown-grace SEC   on SIGTERM, how long running cells may finish (default 10)\n"
    "  --pool N               sessions kept ready so that creating one is a hand-over\n"
    "                         (default 2; 0 to make each on demand)\n"
    "  --e2b                  serve E2B's API too (its SDKs' control plane, code\n"
    "                         interpreter and envd routes on this listener; docs/E2B.md)\n"
    "  --no-template          make every session from scratch (default as root: clone\n"
    "                         sessions from a template with the data stack imported)\n"
    "  --net allow:HOST[:PORT],...   default network of sessions that do not say (none)\n"
    "  --net-allow-max none|HOST[:PORT],...   the most a session's network allowlist may\n"
    "                         name (default: anything; none: no network at all)\n"
    "  --net-max-connections N   connections a session may hold open through the egress\n"
    "                         proxy (default 32)\n"
    "  --net-max-mb MB        bytes a session may move through the proxy (default 1024)\n"
    "  --allow-origin ORIGIN  a browser Origin allowed on /mcp besides loopback ones\n"
    "                         (repeatable; e.g. https://app.example.com)\n"
    "  --model NAME, --base-url URL   the model of POST /v1/agent/runs (default RUNCELL_MODEL,\n"
    "                         OPENAI_BASE_URL; the key comes from OPENAI_API_KEY). No endpoint\n"
    "                         is assumed: without one, agent runs answer 503\n"
    "                         agent_not_configured\n"
    "  --review-webhook URL   also POST review incidents of agent runs to URL\n"
    "\n"
    "Sessions are kept (docs/PERSISTENCE.md): their files after every execution, their\n"
    "variables when they expire or are closed with checkpoint; records in "
    "DATA/sessions.db.\n" STORE_OPTS_HELP;

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
    OPT_NO_TEMPLATE,
    OPT_POOL,
    OPT_NET_ALLOW_MAX,
    OPT_NET_MAX_CONNECTIONS,
    OPT_NET_MAX_MB,
    OPT_ALLOW_ORIGIN,
    OPT_MODEL,
    OPT_BASE_URL,
    OPT_WEBHOOK,
    OPT_MAX_BODY,
    OPT_MAX_PIDS,
    OPT_MAX_DISK,
    OPT_MAX_IDLE_TIMEOUT,
    OPT_MAX_CONNECTIONS,
    OPT_MAX_PER_PEER,
    OPT_MAX_UNAUTH,
    OPT_HEADER_TIMEOUT,
    OPT_E2B
};

static const struct option long_opts[] = {
    COMMON_LONG_OPTS,
    STORE_LONG_OPTS,
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
    {"no-template", no_argument, NULL, OPT_NO_TEMPLATE},
    {"e2b", no_argument, NULL, OPT_E2B},
    {"pool", required_argument, NULL, OPT_POOL},
    {"net-allow-max", required_argument, NULL, OPT_NET_ALLOW_MAX},
    {"net-max-connections", required_argument, NULL, OPT_NET_MAX_CONNECTIONS},
    {"net-max-mb", required_argument, NULL, OPT_NET_MAX_MB},
    {"allow-origin", required_argument, NULL, OPT_ALLOW_ORIGIN},
    {"model", required_argument, NULL, OPT_MODEL},
    {"base-url", required_argument, NULL, OPT_BASE_URL},
    {"review-webhook", required_argument, NULL, OPT_WEBHOOK},
    {"max-body", required_argument, NULL, OPT_MAX_BODY},
    {"max-pids", required_argument, NULL, OPT_MAX_PIDS},
    {"max-connections", required_argument, NULL, OPT_MAX_CONNECTIONS},
    {"max-connections-per-peer", required_argument, NULL, OPT_MAX_PER_PEER},
    {"max-unauthenticated", required_argument, NULL, OPT_MAX_UNAUTH},
    {"header-timeout", required_argument, NULL, OPT_HEADER_TIMEOUT},
    {"max-disk", required_argument, NULL, OPT_MAX_DISK},
    {"max-idle-timeout", required_argument, NULL, OPT_MAX_IDLE_TIMEOUT},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static struct net_policy *allow_max;

static int parse_allow_max(const char *val)
{
    net_policy_free(allow_max);
    allow_max = NULL;
    /* "none" is a cap with nothing in it: no session may have a network. */
    int r = !strcmp(val, "none") ? net_policy_parse(NULL, 0, &allow_max)
                                 : net_policy_parse_list(val, &allow_max);
    return r < 0 ? usage_error("serve", "--net-allow-max: %s", err_msg()) : 0;
}

/* An Origin is scheme://host[:port], exactly as a browser sends it: no path, no slash. */
static int add_origin(char ***origins, const char *val)
{
    const char *host = strstr(val, "://");
    if ((strncmp(val, "http://", 7) && strncmp(val, "https://", 8)) || !host || !host[3] ||
        strchr(host + 3, '/'))
        return usage_error("serve",
                           "--allow-origin: '%s' is not an origin such as "
                           "https://app.example.com (scheme, host, optional port, no path)",
                           val);
    *origins = strv_push(*origins ? *origins : xcalloc(1, sizeof(char *)), val);
    return 0;
}

/* A size given in MB, kept in bytes. */
static int opt_mb_as_bytes(const char *opt, const char *val, uint64_t *ret_bytes)
{
    uint64_t mb;
    int r = opt_megabytes("serve", opt, val, &mb);
    if (!r)
        *ret_bytes = mb << 20;
    return r;
}

/* Longer would keep a stranger's connection past what an authenticated one gets. */
#define CONNECTION_IDLE_OPT_SECONDS 300

static int serve_opt(struct server_config *cfg, struct common_opts *co, struct store_opts *so,
                     int c, char *val, char ***origins)
{
    uint64_t v;
    int r = store_opt("serve", so, c, val);
    if (r >= 0)
        return r;
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
    case OPT_MAX_CONNECTIONS:
        r = opt_count("serve", "--max-connections", val, &v);
        cfg->limits.max_connections = v;
        return r;
    case OPT_MAX_PER_PEER:
        r = opt_count("serve", "--max-connections-per-peer", val, &v);
        cfg->limits.max_connections_per_peer = v;
        return r;
    case OPT_MAX_UNAUTH:
        r = opt_count("serve", "--max-unauthenticated", val, &v);
        cfg->limits.max_unauthenticated = v;
        return r;
    case OPT_HEADER_TIMEOUT:
        return opt_seconds_max("serve", "--header-timeout", val, CONNECTION_IDLE_OPT_SECONDS,
                               &cfg->limits.header_timeout_ms);
    case OPT_MAX_PIDS:
        return opt_count("serve", "--max-pids", val, &cfg->limits.max_pids);
    case OPT_MAX_DISK:
        return opt_megabytes("serve", "--max-disk", val, &cfg->limits.max_disk_mb);
    case OPT_MAX_IDLE_TIMEOUT:
        return opt_seconds_max("serve", "--max-idle-timeout", val, MAX_IDLE_OPT_SECONDS,
                               &cfg->limits.max_idle_timeout_ms);
    case OPT_IDLE_TIMEOUT:
        return opt_seconds_max("serve", "--idle-timeout", val, MAX_IDLE_OPT_SECONDS,
                               &cfg->defaults.idle_timeout_ms);
    case OPT_GRACE:
        return opt_seconds("serve", "--shutdown-grace", val, &cfg->shutdown_grace_ms);
    case OPT_NO_TEMPLATE:
        cfg->no_template = true;
        return 0;
    case OPT_E2B:
        cfg->e2b = true;
        return 0;
    case OPT_POOL:
        if (parse_u64(val, &v) < 0 || v > 256)
            return usage_error("serve", "--pool: '%s' is not a number of sessions (0 to 256)", val);
        cfg->pool_size = v;
        return 0;
    case OPT_NET_ALLOW_MAX:
        return parse_allow_max(val);
    case OPT_NET_MAX_CONNECTIONS:
        return opt_count("serve", "--net-max-connections", val, &cfg->limits.max_net_connections);
    case OPT_NET_MAX_MB:
        r = opt_megabytes("serve", "--net-max-mb", val, &v);
        cfg->limits.max_net_bytes = v << 20;
        return r;
    case OPT_PACKAGE:
    case OPT_INDEX_URL:
    case OPT_INSTALL_TIMEOUT:
        return usage_error("serve", "--package, --index-url and --install-timeout are "
                                    "options of sessions: give them in POST /v1/sessions");
    case OPT_ALLOW_ORIGIN:
        return add_origin(origins, val);
    case OPT_MODEL:
        cfg->agent.model = val;
        return 0;
    case OPT_BASE_URL:
        cfg->agent.base_url = val;
        return 0;
    case OPT_WEBHOOK:
        cfg->review_webhook = val;
        return 0;
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

/* A default a session gets without asking must be one it could ask for; the connection
 * caps must fit in the connection limit. */
static int check_defaults(const struct server_config *cfg)
{
    const struct server_limits *m = &cfg->limits;
    const struct session_opts *d = &cfg->defaults;
    const struct {
        const char *opt;
        size_t val;
    } caps[] = {{"--max-connections-per-peer", m->max_connections_per_peer},
                {"--max-unauthenticated", m->max_unauthenticated}};
    for (size_t i = 0; i < ARRAY_SIZE(caps); i++)
        if (caps[i].val > m->max_connections)
            return usage_error("serve",
                               "%s (%zu) is more than --max-connections (%zu); lower "
                               "one or raise the other",
                               caps[i].opt, caps[i].val, m->max_connections);
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
    struct server_config cfg = {
        .listen = "127.0.0.1:8080", .shutdown_grace_ms = 10000, .pool_size = 2};
    struct common_opts co = {0};
    struct store_opts so = {.quota_bytes = (uint64_t)DEFAULT_STORE_QUOTA_MB << 20};
    _cleanup_free_ char *data = NULL;
    _cleanup_strv_ char **origins = NULL;
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
            r = serve_opt(&cfg, &co, &so, c, optarg, &origins);
    }
    if (!r && optind < argc)
        r = usage_error("serve", "unexpected argument '%s'", argv[optind]);
    if (!r && co.net && !net_policy_within(co.net, allow_max))
        r = usage_error("serve", "--net: %s", err_msg());
    if (r) {
        common_opts_release(&co);
        return r;
    }
    if (!cfg.data_dir)
        cfg.data_dir = data = default_data_dir();
    server_limits_fill_defaults(&cfg.limits);
    cfg.defaults.limits = co.limits;
    cfg.defaults.timeout_ms = co.timeout_ms;
    cfg.net_allow_max = allow_max;
    if (co.net) {
        co.net->max_connections = cfg.limits.max_net_connections;
        co.net->max_bytes = cfg.limits.max_net_bytes;
    }
    cfg.defaults.net.policy = co.net;
    session_opts_fill_defaults(&cfg.defaults);
    cfg.mcp_origins = origins;
    cfg.store = so.cfg;
    cfg.store_quota_bytes = so.quota_bytes;
    cfg.store_max_files = so.max_files;
    cfg.agent.http_retries = AGENT_DEFAULT_HTTP_RETRIES;
    if ((r = check_defaults(&cfg))) {
        common_opts_release(&co);
        return r;
    }
    if (!getenv("RUNCELL_LOG"))
        log_set_level(LOG_INFO);
    r = server_run(&cfg);
    common_opts_release(&co);
    net_policy_free(allow_max);
    return r;
}
