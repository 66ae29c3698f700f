/* config.c - parses the JSON configuration the daemon hands to runcell-sandbox. */
#include "sandbox/helper/helper.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

static char **strv_from_json(json_t *arr)
{
    char **v = xcalloc(1, sizeof(char *));
    size_t i;
    json_t *it;
    json_array_foreach(arr, i, it)
    {
        if (json_is_string(it))
            v = strv_push(v, json_string_value(it));
    }
    return v;
}

static char *str_or(json_t *o, const char *key, const char *dflt)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? xstrdup(s) : (dflt ? xstrdup(dflt) : NULL);
}

static uint64_t u64_or(json_t *o, const char *key, uint64_t dflt)
{
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) && json_integer_value(v) >= 0 ? (uint64_t)json_integer_value(v)
                                                            : dflt;
}

void config_release(struct helper_config *cfg)
{
    free(cfg->root_dir);
    free(cfg->workspace);
    free(cfg->cwd);
    free(cfg->hostname);
    free(cfg->relay_socket);
    free(cfg->cgroup_leaf_procs);
    free(cfg->instance);
    strv_free(cfg->template_binds);
    strv_free(cfg->cgroup_procs);
    free(cfg->cgroup_dir);
    strv_free(cfg->argv);
    strv_free(cfg->env);
    for (size_t i = 0; i < cfg->n_binds; i++) {
        free(cfg->binds[i].src);
        free(cfg->binds[i].dst);
    }
    free(cfg->binds);
    memset(cfg, 0, sizeof(*cfg));
}

/* Fills cfg from the JSON object o; -1 (reported) when it lacks what a sandbox needs. */
static int config_fill(json_t *o, struct helper_config *cfg)
{
    cfg->root_dir = str_or(o, "root_dir", NULL);
    cfg->workspace = str_or(o, "workspace", NULL);
    cfg->cwd = str_or(o, "cwd", "/workspace");
    cfg->hostname = str_or(o, "hostname", "runcell");
    cfg->host_uid = (uid_t)u64_or(o, "uid", 0);
    cfg->host_gid = (gid_t)u64_or(o, "gid", 0);
    cfg->host_root_uid = (uid_t)u64_or(o, "root_uid", cfg->host_uid);
    cfg->privileged = json_is_true(json_object_get(o, "privileged"));
    cfg->cgroup_procs = strv_from_json(json_object_get(o, "cgroup_procs"));
    cfg->cgroup_dir = str_or(o, "cgroup_dir", NULL);
    cfg->cgroup_leaf_procs = str_or(o, "cgroup_leaf_procs", NULL);
    cfg->cgroup_leaf_fd = -1;
    cfg->instance = str_or(o, "instance", "");
    cfg->argv = strv_from_json(json_object_get(o, "argv"));
    cfg->env = strv_from_json(json_object_get(o, "env"));
    cfg->tmp_mb = u64_or(o, "tmp_mb", 512);
    cfg->tmp_inodes = u64_or(o, "tmp_inodes", 65536);
    cfg->shm_mb = u64_or(o, "shm_mb", 64);
    cfg->rl_nofile = u64_or(o, "rlimit_nofile", 1024);
    cfg->rl_nproc = u64_or(o, "rlimit_nproc", 0);
    cfg->rl_cpu_s = u64_or(o, "rlimit_cpu_s", 0);
    cfg->rl_fsize_mb = u64_or(o, "rlimit_fsize_mb", 0);
    cfg->rl_as_mb = u64_or(o, "rlimit_as_mb", 0);
    cfg->extra_fds = (int)u64_or(o, "extra_fds", 0);
    cfg->exec_channel = json_is_true(json_object_get(o, "exec_channel"));
    cfg->seccomp = !json_is_false(json_object_get(o, "seccomp"));
    cfg->landlock = !json_is_false(json_object_get(o, "landlock"));
    cfg->template_profile = json_is_true(json_object_get(o, "template"));
    cfg->id_range = (uid_t)u64_or(o, "id_range", 0);
    cfg->ns_root_uid = (uid_t)u64_or(o, "ns_root_uid", 0);
    cfg->ns_uid = (uid_t)u64_or(o, "ns_uid", 0);
    cfg->template_binds = strv_from_json(json_object_get(o, "template_binds"));
    cfg->relay_socket = str_or(o, "relay_socket", NULL);
    cfg->relay_port = (uint16_t)u64_or(o, "relay_port", 0);

    json_t *binds = json_object_get(o, "binds");
    size_t i;
    json_t *it;
    cfg->binds = xcalloc(json_array_size(binds) + 1, sizeof(struct bind));
    json_array_foreach(binds, i, it)
    {
        const char *src = json_string_value(json_object_get(it, "src"));
        const char *dst = json_string_value(json_object_get(it, "dst"));
        if (!src || !dst || dst[0] != '/')
            continue;
        cfg->binds[cfg->n_binds++] = (struct bind){.src = xstrdup(src),
                                                   .dst = xstrdup(dst),
                                                   .rw = json_is_true(json_object_get(it, "rw"))};
    }
    if (!cfg->root_dir || !cfg->workspace || !cfg->argv[0])
        return fail("bad sandbox configuration: root_dir, workspace and argv are required");
    if (cfg->relay_socket && (cfg->relay_socket[0] != '/' || !cfg->relay_port))
        return fail("bad sandbox configuration: relay_socket needs an absolute path and "
                    "relay_port");
    for (const char *c = cfg->instance; *c; c++)
        if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f')) || c - cfg->instance >= 32)
            return fail("bad sandbox configuration: instance is up to 32 lower-case hex digits");
    if (cfg->extra_fds < 0 || cfg->extra_fds > 16 || cfg->extra_fds < (cfg->exec_channel ? 1 : 0))
        return fail("bad sandbox configuration: extra_fds out of range");
    return 0;
}

/* ret is written only on success: a caller's config is never left half filled. */
int config_parse(const char *text, struct helper_config *ret)
{
    json_error_t jerr;
    json_t *o = json_loads(text, 0, &jerr);
    if (!o || !json_is_object(o)) {
        json_decref(o);
        return fail("bad sandbox configuration: %s", jerr.text);
    }
    struct helper_config cfg = {0};
    int r = config_fill(o, &cfg);
    json_decref(o);
    if (r < 0) {
        config_release(&cfg);
        return r;
    }
    *ret = cfg;
    return 0;
}
