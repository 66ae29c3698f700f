/* cmd_serve.c - `runcell serve`: the HTTP/JSON API. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "http/serve.h"
#include "cli/cli.h"

struct serve_cli {
    struct server_config cfg;
    struct common_opts co;
    struct store_opts so;
    char **origins; /* --allow-origin */
};

static const char serve_usage[] =
    "usage: runcell serve [--listen HOST:PORT] [--data DIR] [--token TOKEN] [OPTIONS]\n"
    "\n"
    "Serves the HTTP/JSON API (docs/API.md). Every route but /healthz needs\n"
    "'Authorization: Bearer TOKEN'; the token comes from --token, RUNCELL_TOKEN, DATA/token,\n"
    "or is generated on first start and saved to DATA/token.\n"
    "\n";

static struct net_policy *allow_max;

static int parse_allow_max(void *opts, const char *cmd, char *val)
{
    net_policy_free(allow_max);
    allow_max = NULL;
    /* "none" is a cap with nothing in it: no session may have a network. */
    int r = !strcmp(val, "none") ? net_policy_parse(NULL, 0, &allow_max)
                                 : net_policy_parse_list(val, &allow_max);
    return r < 0 ? usage_error(cmd, "--net-allow-max: %s", err_msg()) : 0;
}

/* An Origin is scheme://host[:port], exactly as a browser sends it: no path, no slash. */
static int add_origin(void *opts, const char *cmd, char *val)
{
    char ***origins = &((struct serve_cli *)opts)->origins;
    const char *host = strstr(val, "://");
    if ((strncmp(val, "http://", 7) && strncmp(val, "https://", 8)) || !host || !host[3] ||
        strchr(host + 3, '/'))
        return usage_error(cmd,
                           "--allow-origin: '%s' is not an origin such as "
                           "https://app.example.com (scheme, host, optional port, no path)",
                           val);
    *origins = strv_push(*origins ? *origins : xcalloc(1, sizeof(char *)), val);
    return 0;
}

/* A DNS name of labels of [a-z0-9-] (the SDKs put PORT-ID. before it). */
static bool domain_ok(const char *d)
{
    size_t label = 0;
    if (!*d || strlen(d) > 200)
        return false;
    for (const char *c = d;; c++) {
        if (*c == '.' || !*c) {
            if (!label || c[-1] == '-')
                return false;
            if (!*c)
                return true;
            label = 0;
        } else if (((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || (*c == '-' && label)) &&
                   ++label <= 63) {
        } else {
            return false;
        }
    }
}

/* Longer would keep a stranger's connection past what an authenticated one gets. */
#define CONNECTION_IDLE_OPT_SECONDS 300

#define F(member) offsetof(struct serve_cli, cfg.member)

static const char per_session[] = "--package, --index-url and --install-timeout are "
                                  "options of sessions: give them in POST /v1/sessions";
static const char no_files[] = "--file and --out do not apply to serve";

/* The common options a server takes, as its sessions' defaults; then where they are kept. */
static const char serve_defaults_help[] =
    "  --timeout SEC          default per-execution timeout (default 60)\n"
    "  --memory MB, --pids N, --disk MB, --cpus N   default session limits\n"
    "  --net allow:HOST[:PORT],...   default network of sessions that do not say (none)\n"
    "\n"
    "Sessions are kept (docs/PERSISTENCE.md): their files after every execution, their\n"
    "variables when they expire or are closed with checkpoint; records in DATA/sessions.db.";

static const struct opt_spec serve_opts[] = {
    {"listen", "HOST:PORT", OPTK_STRING, F(listen), .help = "address (default 127.0.0.1:8080)"},
    {"data", "DIR", OPTK_STRING, F(data_dir),
     .help = "state directory (default RUNCELL_DATA or /var/lib/runcell)"},
    {"token", "TOKEN", OPTK_STRING, F(token), .help = "API token"},
    {"max-sessions", "N", OPTK_SIZE, F(limits.max_sessions),
     .help = "live sessions at most (default 1000)"},
    {"max-executions", "N", OPTK_SIZE, F(limits.max_executions),
     .help = "executions running at once (default 64); more wait\ntheir turn"},
    {"max-snapshots", "N", OPTK_SIZE, F(limits.max_snapshots),
     .help = "snapshots kept in the store at once (default 100)"},
    {"max-queued-executions", "N", OPTK_SIZE, F(limits.max_queued_executions),
     .help = "executions waiting to run, across sessions (default\n1024); more are refused (429)"},
    {"max-memory", "MB", OPTK_MB, F(limits.max_memory_mb),
     .help = "the most memory a session may ask for (default 8192)"},
    {"max-pids", "N", OPTK_NUMBER, F(limits.max_pids), 1, 1000000,
     .help = "the most processes a session may ask for (default 4096)"},
    {"max-disk", "MB", OPTK_MB, F(limits.max_disk_mb),
     .help = "the largest workspace a session may ask for (default 8192)"},
    {"max-timeout", "SEC", OPTK_SECONDS, F(limits.max_timeout_ms),
     .help = "the longest per-execution timeout allowed (default 3600)"},
    {"max-idle-timeout", "SEC", OPTK_SECONDS, F(limits.max_idle_timeout_ms), 0,
     MAX_IDLE_OPT_SECONDS, .help = "the longest idle timeout allowed (default 604800)"},
    {"max-upload", "MB", OPTK_MB_BYTES, F(limits.max_upload_bytes),
     .help = "the largest file upload (default 1024)"},
    {"max-body", "MB", OPTK_MB_BYTES, F(limits.max_body_bytes),
     .help = "the largest JSON request body (default 64)"},
    {"max-connections", "N", OPTK_SIZE, F(limits.max_connections),
     .help = "HTTP connections open at once (default 1024)"},
    {"max-connections-per-peer", "N", OPTK_SIZE, F(limits.max_connections_per_peer),
     .help = "from one client address (default half of\n--max-connections)"},
    {"max-unauthenticated", "N", OPTK_SIZE, F(limits.max_unauthenticated),
     .help = "connections open that have not sent the token yet\n"
             "(default an eighth of --max-connections); a new one past\n"
             "this closes the oldest of them"},
    {"header-timeout", "SEC", OPTK_SECONDS, F(limits.header_timeout_ms), 0,
     CONNECTION_IDLE_OPT_SECONDS,
     .help = "a connection that has not sent the token is closed after\n"
             "this long idle (default 10); with it, after 300"},
    {"idle-timeout", "SEC", OPTK_SECONDS, F(defaults.idle_timeout_ms), 0, MAX_IDLE_OPT_SECONDS,
     .help = "default idle timeout of sessions (default 600)"},
    {"hibernate-after", "SEC", OPTK_SECONDS, F(defaults.hibernate_after_ms), 0,
     MAX_IDLE_OPT_SECONDS,
     .help = "a session idle this long hibernates: its variables go to\n"
             "the store and its interpreter stops, until it is used again\n"
             "(default: never)"},
    {"checkpoint-workers", "N", OPTK_SIZE, F(checkpoint_workers), 1, 64,
     .help = "sessions checkpointed at once when the server stops (default\n"
             "32: each checkpoint waits mostly on the store)"},
    {"shutdown-grace", "SEC", OPTK_SECONDS, F(shutdown_grace_ms),
     .help = "on SIGTERM, how long running cells may finish (default 10)"},
    {"pool", "N", OPTK_SIZE_OR_0, F(pool_size), 0, 256,
     .help = "sessions kept ready so that creating one is a hand-over\n"
             "(default 2; 0 to make each on demand)"},
    {"no-template", NULL, OPTK_FLAG, F(no_template),
     .help = "make every session from scratch (default as root: clone\n"
             "sessions from a template with the data stack imported)"},
    {"e2b", NULL, OPTK_FLAG, F(e2b),
     .help = "also serve E2B's API and sandbox routes, so that E2B's SDKs\n"
             "work unmodified (docs/E2B.md)"},
    {"e2b-internet", NULL, OPTK_FLAG, F(e2b_internet),
     .help = "E2B sandboxes get the public internet through the egress\n"
             "proxy (private, link-local and metadata addresses refused)\n"
             "unless they ask for none, as in E2B; without it,\n"
             "allow_internet_access: true is refused"},
    {"e2b-domain", "DOMAIN", OPTK_STRING, F(e2b_domain),
     .help = "E2B's sandbox hosts are PORT-ID.DOMAIN: the create response\n"
             "says DOMAIN (the SDKs' getHost), and a request to such a\n"
             "host reaches the sandbox's PORT (point *.DOMAIN here)"},
    {"secrets-key", "FILE", OPTK_STRING, F(secrets_key),
     .help = "keep sessions' secrets in their records, sealed (AES-256-GCM)\n"
             "with the key in FILE (32 bytes or 64 hex digits, mode 600,\n"
             "outside the store), so that a resume or a takeover has them;\n"
             "without it secrets are never kept (docs/NETWORK.md)"},
    {"net-allow-max", "none|HOST[:PORT],...", OPTK_FN, .fn = parse_allow_max,
     .help = "the most a session's network allowlist may name\n"
             "(default: anything; none: no network at all)"},
    {"net-max-connections", "N", OPTK_NUMBER, F(limits.max_net_connections), 1, 1000000,
     .help = "connections a session may hold open through the egress\nproxy (default 32)"},
    {"net-max-mb", "MB", OPTK_MB_BYTES, F(limits.max_net_bytes),
     .help = "bytes a session may move through the proxy (default 1024)"},
    {"allow-origin", "ORIGIN", OPTK_FN, .fn = add_origin,
     .help = "a browser Origin allowed on /mcp besides loopback ones\n"
             "(repeatable; e.g. https://app.example.com)"},
    {"model", "NAME", OPTK_STRING, F(agent.model),
     .help = "the model of POST /v1/agent/runs (default RUNCELL_MODEL)"},
    {"base-url", "URL", OPTK_STRING, F(agent.base_url),
     .help = "its endpoint (default OPENAI_BASE_URL; the key comes from\n"
             "OPENAI_API_KEY). No endpoint is assumed: without one, agent\n"
             "runs answer 503 agent_not_configured"},
    {"review-webhook", "URL", OPTK_STRING, F(review_webhook),
     .help = "also POST review incidents of agent runs to URL"},
    {"node", "NAME", OPTK_STRING, F(node),
     .help = "this node's name, in every session id it makes (NAME-...),\n"
             "so a router can send a session's requests to its node: a\n"
             "short DNS label (default: the host name)"},
    {"fleet", NULL, OPTK_FLAG, F(fleet),
     .help = "the store is shared with other nodes: hold a node lease in\n"
             "it, forward requests for sessions other nodes run, and take\n"
             "over the sessions of nodes that are gone\n"
             "(docs/PERSISTENCE.md#fleet)"},
    {"lease-ttl", "SEC", OPTK_SECONDS, F(lease_ttl_ms), 0, 3600,
     .help = "how long the node lease lasts unrenewed, so how soon a dead\n"
             "node's sessions move (default 15; at least 3)"},
    {"advertise", "HOST:PORT", OPTK_STRING, F(advertise),
     .help = "where other nodes of the fleet reach this one to forward\n"
             "requests (default: --listen; for a wildcard address, the host\n"
             "name with its port)"},
    {"package", "SPEC", OPTK_REFUSED, .help = per_session},
    {"secret", "HOST=ENVNAME[:HEADER]", OPTK_REFUSED,
     .help = "--secret is an option of sessions: give \"secrets\" in POST /v1/sessions"},
    {"index-url", "URL", OPTK_REFUSED, .help = per_session},
    {"install-timeout", "SEC", OPTK_REFUSED, .help = per_session},
    {"file", "LOCAL[:DEST]", OPTK_REFUSED, .help = no_files},
    {"out", "DIR", OPTK_REFUSED, .help = no_files},
    {NULL, .help = serve_defaults_help},
};

static const struct opt_cmd serve_cmd = {
    .name = "serve",
    .usage = serve_usage,
    .own = OPT_TABLE(serve_opts),
    .groups = {{&common_opt_table, offsetof(struct serve_cli, co)},
               {&store_opt_table, offsetof(struct serve_cli, so), .listed = true}},
    .column = 25,
};

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
    struct serve_cli o = {
        .cfg = {.listen = "127.0.0.1:8080", .shutdown_grace_ms = 10000, .pool_size = 2},
        .so = {.quota_bytes = (uint64_t)DEFAULT_STORE_QUOTA_MB << 20}};
    struct server_config *cfg = &o.cfg;
    _cleanup_free_ char *data = NULL;
    int first, r = opttab_parse(&serve_cmd, argc, argv, &o, &first);
    if (!r && o.co.net && !net_policy_within(o.co.net, allow_max))
        r = usage_error("serve", "--net: %s", err_msg());
    if (!r && (cfg->e2b_internet || cfg->e2b_domain) && !cfg->e2b)
        r = usage_error("serve", "--e2b-internet and --e2b-domain are options of the E2B routes: "
                                 "add --e2b");
    if (!r && cfg->e2b_domain && !domain_ok(cfg->e2b_domain))
        r = usage_error("serve",
                        "--e2b-domain: '%s' is not a domain name such as sandbox.example.com",
                        cfg->e2b_domain);
    if (!r && cfg->e2b_internet && allow_max)
        r = usage_error("serve",
                        "--e2b-internet gives E2B sandboxes the public internet, more than "
                        "--net-allow-max allows; drop one of them");
    if (r) {
        common_opts_release(&o.co);
        net_policy_free(allow_max);
        strv_free(o.origins);
        return r == OPTTAB_HELP ? 0 : r;
    }
    if (!cfg->data_dir)
        cfg->data_dir = data = default_data_dir();
    server_limits_fill_defaults(&cfg->limits);
    cfg->defaults.limits = o.co.limits;
    cfg->defaults.timeout_ms = o.co.timeout_ms;
    cfg->net_allow_max = allow_max;
    if (o.co.net) {
        o.co.net->max_connections = cfg->limits.max_net_connections;
        o.co.net->max_bytes = cfg->limits.max_net_bytes;
    }
    cfg->defaults.net.policy = o.co.net;
    session_opts_fill_defaults(&cfg->defaults);
    cfg->mcp_origins = o.origins;
    cfg->store = o.so.cfg;
    cfg->store_quota_bytes = o.so.quota_bytes;
    cfg->store_max_files = o.so.max_files;
    cfg->agent.http_retries = AGENT_DEFAULT_HTTP_RETRIES;
    if ((r = check_defaults(cfg))) {
        common_opts_release(&o.co);
        strv_free(o.origins);
        return r;
    }
    if (!getenv("RUNCELL_LOG"))
        log_set_level(LOG_INFO);
    r = server_run(cfg);
    common_opts_release(&o.co);
    net_policy_free(allow_max);
    strv_free(o.origins);
    return r;
}
