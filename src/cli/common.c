/* common.c - options shared by the subcommands that run code (run, repl, agent). */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"

static int parse_file_opt(const char *cmd, struct common_opts *o, char *val)
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

static int parse_cpus(const char *cmd, const char *val, uint64_t *ret_milli)
{
    uint64_t ms;
    if (parse_seconds(val, &ms) < 0 || ms > 1024 * 1000)
        return usage_error(cmd, "--cpus: '%s' is not a number of cores (e.g. 1 or 0.5)", val);
    /* Shares are thousandths of a core; the parser would round a smaller value up. */
    if (strtod(val, NULL) < 0.001)
        return usage_error(cmd,
                           "--cpus: '%s' is less than the smallest CPU share, 0.001 of "
                           "a core",
                           val);
    *ret_milli = ms; /* the "seconds" parser yields thousandths */
    return 0;
}

static int parse_net(const char *cmd, struct common_opts *o, const char *val)
{
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

struct net_opts common_net_opts(const struct common_opts *o)
{
    return (struct net_opts){.policy = o->net,
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

int common_opt(const char *cmd, struct common_opts *o, int c, char *val)
{
    switch (c) {
    case OPT_TIMEOUT:
        return opt_seconds(cmd, "--timeout", val, &o->timeout_ms);
    case OPT_MEMORY:
        return opt_megabytes(cmd, "--memory", val, &o->limits.memory_mb);
    case OPT_PIDS:
        return opt_count(cmd, "--pids", val, &o->limits.pids);
    case OPT_DISK:
        return opt_megabytes(cmd, "--disk", val, &o->limits.disk_mb);
    case OPT_CPUS:
        return parse_cpus(cmd, val, &o->limits.cpus_milli);
    case OPT_FILE:
        return parse_file_opt(cmd, o, val);
    case OPT_OUT:
        o->out_dir = val;
        return 0;
    case OPT_NET:
        return parse_net(cmd, o, val);
    case OPT_PACKAGE:
        o->packages = strv_push(o->packages ? o->packages : xcalloc(1, sizeof(char *)), val);
        return 0;
    case OPT_INDEX_URL:
        o->index_url = val;
        return 0;
    case OPT_INSTALL_TIMEOUT:
        return opt_seconds(cmd, "--install-timeout", val, &o->install_timeout_ms);
    default:
        return -1; /* not a common option */
    }
}

void common_opts_release(struct common_opts *o)
{
    free(o->files);
    o->files = NULL;
    o->n_files = 0;
    net_policy_free(o->net);
    o->net = NULL;
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

int check_net_opts(const char *cmd, const struct common_opts *o)
{
    struct net_opts n = common_net_opts(o);
    if (net_opts_check(&n) < 0)
        return usage_error(cmd, "%s", err_msg());
    return 0;
}

int refuse_net_opts(const char *cmd, const struct common_opts *o)
{
    const char *opt = o->net                  ? "--net allow:..."
                      : o->packages           ? "--package"
                      : o->index_url          ? "--index-url"
                      : o->install_timeout_ms ? "--install-timeout"
                                              : NULL;
    if (!opt)
        return 0;
    return usage_error(cmd,
                       "%s is not supported by runcell %s: its sandboxes have no network "
                       "(only --net none) and no packages beyond those installed",
                       opt, cmd);
}

/* The store options that only name a string of the store's configuration. */
static const struct {
    int opt;
    size_t offset;
} store_strings[] = {
    {OPT_STORE, offsetof(struct store_config, url)},
    {OPT_S3_ENDPOINT, offsetof(struct store_config, s3_endpoint)},
    {OPT_S3_REGION, offsetof(struct store_config, s3_region)},
    {OPT_S3_ACCESS_KEY, offsetof(struct store_config, s3_access_key)},
    {OPT_S3_SECRET_KEY, offsetof(struct store_config, s3_secret_key)},
};

int store_opt(const char *cmd, struct store_opts *o, int c, char *val)
{
    uint64_t mb;
    for (size_t i = 0; i < ARRAY_SIZE(store_strings); i++) {
        if (store_strings[i].opt == c) {
            *(const char **)((char *)&o->cfg + store_strings[i].offset) = val;
            return 0;
        }
    }
    if (c == OPT_S3_VIRTUAL_HOSTED) {
        o->cfg.s3_virtual_hosted = true;
        return 0;
    }
    if (c == OPT_STORE_MAX_FILES) {
        if (parse_u64(val, &mb) < 0 || mb < 1 || mb > STORE_MAX_FILES_LIMIT)
            return usage_error(cmd, "--store-max-files: '%s' is not a number of files (1 to %u)",
                               val, STORE_MAX_FILES_LIMIT);
        o->max_files = mb;
        return 0;
    }
    if (c != OPT_STORE_QUOTA)
        return -1;
    if (parse_u64(val, &mb) < 0 || mb > (1u << 30))
        return usage_error(cmd, "--store-quota: '%s' is not a size in megabytes (0 for no limit)",
                           val);
    o->quota_bytes = mb << 20;
    return 0;
}
