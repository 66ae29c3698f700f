/* common.c - options shared by subcommands: those that run code (run, repl, serve, mcp, agent)
 * and those that keep sessions (serve, repl). */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"

static int parse_file_opt(void *opts, const char *cmd, char *val)
{
    struct common_opts *o = opts;
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
        return usage_error(cmd, "--file: empty local path in '%s'", given);
    if (!path_is_safe_relative(dest))
        return usage_error(cmd,
                           "--file: bad destination '%s': use a relative path inside the "
                           "workspace, without '..'",
                           dest);
    struct stat st;
    if (stat(local, &st) < 0)
        return usage_error(cmd, "--file: cannot read %s: %s", local, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return usage_error(cmd, "--file: %s is not a regular file", local);
    o->files = xrealloc(o->files, (o->n_files + 1) * sizeof(*o->files));
    o->files[o->n_files++] = (struct input_file){.local = local, .dest = dest};
    return 0;
}

static int parse_cpus(void *opts, const char *cmd, char *val)
{
    struct common_opts *o = opts;
    uint64_t ms;
    if (parse_seconds(val, &ms) < 0 || ms > 1024 * 1000)
        return usage_error(cmd, "--cpus: '%s' is not a number of cores (e.g. 1 or 0.5)", val);
    /* Shares are thousandths of a core; the parser would round a smaller value up. */
    if (strtod(val, NULL) < 0.001)
        return usage_error(cmd,
                           "--cpus: '%s' is less than the smallest CPU share, 0.001 of "
                           "a core",
                           val);
    o->limits.cpus_milli = ms; /* the "seconds" parser yields thousandths */
    return 0;
}

static int parse_net(void *opts, const char *cmd, char *val)
{
    struct common_opts *o = opts;
    net_policy_free(o->net);
    o->net = NULL;
    if (!strcmp(val, "none"))
        return 0;
    if (strncmp(val, "allow:", 6))
        return usage_error(cmd,
                           "--net: unknown policy '%s': use 'none' or "
                           "'allow:HOST[:PORT],...'",
                           val);
    if (net_policy_parse_list(val + 6, &o->net) < 0)
        return usage_error(cmd, "--net: %s", err_msg());
    return 0;
}

/* --secret HOST=ENVNAME[:HEADER]: the value comes from the caller's environment, never the
 * command line (which any user of the machine can read); it goes as HEADER: VALUE, or as
 * Authorization: Bearer VALUE without a HEADER. Messages never quote what follows '='. */
static int parse_secret(void *opts, const char *cmd, char *val)
{
    struct common_opts *o = opts;
    char *eq = strchr(val, '=');
    if (!eq || eq == val)
        return usage_error(cmd, "--secret: give HOST=ENVNAME[:HEADER] (the value is read from "
                                "the environment variable ENVNAME)");
    *eq = '\0';
    char *name = eq + 1, *header = strchr(name, ':');
    if (header)
        *header++ = '\0';
    size_t n = strlen(name);
    bool ok = n && !(name[0] >= '0' && name[0] <= '9') &&
              strspn(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                           "abcdefghijklmnopqrstuvwxyz"
                           "0123456789_") == n;
    if (!ok)
        return usage_error(cmd,
                           "--secret %s=...: after '=' comes the name of an environment "
                           "variable that holds the value (letters, digits and _), never the "
                           "value itself",
                           val);
    const char *value = getenv(name);
    if (!value || !*value)
        return usage_error(cmd, "--secret %s=%s: the environment variable %s is not set", val, name,
                           name);
    if (header && !*header)
        return usage_error(cmd, "--secret %s=%s: empty header name after ':'", val, name);
    _cleanup_free_ char *bearer = header ? NULL : xasprintf("Bearer %s", value);
    json_t *item = json_pack("{s:s,s:s,s:s}", "host", val, "header",
                             header ? header : "Authorization", "value", header ? value : bearer);
    if (bearer)
        explicit_bzero(bearer, strlen(bearer));
    if (!item)
        return usage_error(cmd, "--secret %s=%s: the value is not valid UTF-8", val, name);
    if (!o->secrets_json)
        o->secrets_json = json_array();
    json_array_append_new(o->secrets_json, item);
    return 0;
}

struct net_opts common_net_opts(const struct common_opts *o)
{
    return (struct net_opts){.policy = o->net,
                             .secrets = o->secrets,
                             .packages = o->packages,
                             .index_url = o->index_url,
                             .install_timeout_ms = o->install_timeout_ms};
}

void print_packages_report(json_t *report)
{
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(report, "missing"), i, m)
    {
        fprintf(stderr, "runcell: package '%s' could not be installed: %s\n",
                json_string_value(json_object_get(m, "requirement")),
                json_string_value(json_object_get(m, "reason")));
    }
}

void print_network_refusals(json_t *events)
{
    size_t i;
    json_t *ev;
    json_array_foreach(events, i, ev)
    {
        const char *reason = json_string_value(json_object_get(ev, "reason"));
        if (reason && !json_is_true(json_object_get(ev, "allowed")))
            fprintf(stderr, "runcell: network: %s\n", reason);
    }
}

#define C(member) offsetof(struct common_opts, member)

/* Their help as runcell run gives it; the other subcommands say what differs. */
static const struct opt_spec common_specs[] = {
    {"timeout", "SEC", OPTK_SECONDS, C(timeout_ms), .help = "wall-clock limit (default 60)"},
    {"memory", "MB", OPTK_MB, C(limits.memory_mb), .help = "memory limit (default 1024)"},
    {"pids", "N", OPTK_COUNT64, C(limits.pids), .help = "process limit (default 256)"},
    {"disk", "MB", OPTK_MB, C(limits.disk_mb),
     .help = "size of the workspace and of /tmp, each (default 1024)"},
    {"cpus", "N", OPTK_FN, .fn = parse_cpus, .help = "CPU cores (default 1; fractions allowed)"},
    {"file", "LOCAL[:DEST]", OPTK_FN, .fn = parse_file_opt,
     .help = "copy LOCAL into the workspace (repeatable)"},
    {"out", "DIR", OPTK_STRING, C(out_dir),
     .help = "copy files the code created or changed into DIR; a cell's\n"
             "figures are saved there as figure-CELL-N.png"},
    {"net", "none|allow:HOST[:PORT],...", OPTK_FN, .fn = parse_net,
     .help = "network policy (default none: loopback only; allow: the named\n"
             "hosts, through an egress proxy; docs/NETWORK.md)"},
    {"secret", "HOST=ENVNAME[:HEADER]", OPTK_FN, .fn = parse_secret,
     .help = "the egress proxy adds HEADER: $ENVNAME (default\n"
             "Authorization: Bearer $ENVNAME) to requests for HOST; the\n"
             "sandbox never sees it (repeatable; without --net, the\n"
             "network allows these hosts; docs/NETWORK.md)"},
    {"package", "SPEC", OPTK_STRV, C(packages),
     .help = "pip requirement installed before the code runs (repeatable;\n"
             "needs --net allow:... naming the index and the host it serves\n"
             "files from, e.g. pypi.org,files.pythonhosted.org)"},
    {"index-url", "URL", OPTK_STRING, C(index_url),
     .help = "package index (PIP_INDEX_URL; its host must be allowed)"},
    {"install-timeout", "SEC", OPTK_SECONDS, C(install_timeout_ms),
     .help = "time for installing the packages (default 120)"},
};

const struct opt_table common_opt_table = OPT_TABLE(common_specs);

void common_opts_release(struct common_opts *o)
{
    free(o->files);
    o->files = NULL;
    o->n_files = 0;
    net_policy_free(o->net);
    o->net = NULL;
    net_secrets_json_wipe(o->secrets_json);
    json_decref(o->secrets_json);
    o->secrets_json = NULL;
    net_secrets_free(o->secrets);
    o->secrets = NULL;
    strv_free(o->packages);
    o->packages = NULL;
}

int check_out_dir(const char *cmd, const char *dir)
{
    struct stat st;
    int r = mkdir_p(dir, 0755);
    if (r < 0)
        return usage_error(cmd, "--out: cannot create %s: %s", dir, strerror(-r));
    if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode))
        return usage_error(cmd, "--out: %s is not a directory", dir);
    if (access(dir, W_OK | X_OK) < 0)
        return usage_error(cmd, "--out: cannot write to %s: %s", dir, strerror(errno));
    return 0;
}

/* Parses the secrets; without --net, the network is an allowlist of their hosts. */
static int take_secrets(const char *cmd, struct common_opts *o)
{
    if (!o->secrets_json)
        return 0;
    if (!o->net) {
        size_t i;
        json_t *item;
        _cleanup_strv_ char **hosts = xcalloc(1, sizeof(char *));
        json_array_foreach(o->secrets_json, i, item)
        {
            hosts = strv_push(hosts, json_string_value(json_object_get(item, "host")));
        }
        if (net_policy_parse((const char *const *)hosts, strv_len(hosts), &o->net) < 0)
            return usage_error(cmd, "--secret: %s", err_msg());
    }
    int r = net_secrets_from_json(o->secrets_json, o->net, &o->secrets);
    net_secrets_json_wipe(o->secrets_json);
    json_decref(o->secrets_json);
    o->secrets_json = NULL;
    if (r < 0)
        return usage_error(cmd, "--secret: %s", err_msg());
    return 0;
}

int check_net_opts(const char *cmd, struct common_opts *o)
{
    if (take_secrets(cmd, o))
        return EXIT_USAGE;
    struct net_opts n = common_net_opts(o);
    if (net_opts_check(&n) < 0)
        return usage_error(cmd, "%s", err_msg());
    return 0;
}

int refuse_package_opts(const char *cmd, const struct common_opts *o)
{
    const char *opt = o->packages             ? "--package"
                      : o->index_url          ? "--index-url"
                      : o->install_timeout_ms ? "--install-timeout"
                                              : NULL;
    if (!opt)
        return 0;
    return usage_error(cmd,
                       "%s is not supported by runcell %s: its sandboxes have the packages "
                       "installed on this machine and no others",
                       opt, cmd);
}

static int parse_store_quota(void *opts, const char *cmd, char *val)
{
    uint64_t mb;
    if (parse_u64(val, &mb) < 0 || mb > (1u << 30))
        return usage_error(cmd, "--store-quota: '%s' is not a size in megabytes (0 for no limit)",
                           val);
    ((struct store_opts *)opts)->quota_bytes = mb << 20;
    return 0;
}

static int parse_store_max_files(void *opts, const char *cmd, char *val)
{
    uint64_t n;
    if (parse_u64(val, &n) < 0 || n < 1 || n > STORE_MAX_FILES_LIMIT)
        return usage_error(cmd, "--store-max-files: '%s' is not a number of files (1 to %u)", val,
                           STORE_MAX_FILES_LIMIT);
    ((struct store_opts *)opts)->max_files = n;
    return 0;
}

#define S(member) offsetof(struct store_opts, member)

static const struct opt_spec store_specs[] = {
    {"store", "DIR|s3://BUCKET[/PREFIX]", OPTK_STRING, S(cfg.url),
     .help = "where sessions are kept (default DATA/store)"},
    {"s3-endpoint", "URL", OPTK_STRING, S(cfg.s3_endpoint),
     .help = "S3-compatible endpoint, http[s]://HOST[:PORT] (default AWS)"},
    {"s3-region", "REGION", OPTK_STRING, S(cfg.s3_region),
     .help = "(default AWS_REGION, AWS_DEFAULT_REGION, else us-east-1)"},
    {"s3-access-key", "KEY", OPTK_STRING, S(cfg.s3_access_key),
     .help = "(default AWS_ACCESS_KEY_ID)"},
    {"s3-secret-key", "KEY", OPTK_STRING, S(cfg.s3_secret_key),
     .help = "(default AWS_SECRET_ACCESS_KEY; the variables keep the\nsecret off command lines)"},
    {"s3-virtual-hosted", NULL, OPTK_FLAG, S(cfg.s3_virtual_hosted),
     .help = "BUCKET.HOST addressing instead of HOST/BUCKET"},
    {"store-quota", "MB", OPTK_FN, .fn = parse_store_quota,
     .help = "bytes stored per session at most (default 1024; 0: no limit)"},
    {"store-max-files", "N", OPTK_FN, .fn = parse_store_max_files,
     .help = "files and links stored per session at most (default 10000)"},
};

const struct opt_table store_opt_table = OPT_TABLE(store_specs);
