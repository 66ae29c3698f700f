/* deps.c - packages a session or run asks for, installed with pip before its code runs: in a
 * sandbox of their own on the same workspace (pip --user puts them in /workspace/.local),
 * through the session's egress proxy, within a time budget. */
#include "session/session-int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define REQUIREMENTS    "requirements.txt"
#define REPORT_GRACE_MS 10000 /* past the budget, for install.py to say what it did */

bool deps_wanted(const struct net_opts *n, struct workspace *ws)
{
    if (strv_len(n->packages))
        return true;
    if (!n->policy)
        return false;
    int fd = workspace_openat(ws, REQUIREMENTS, O_RDONLY, 0);
    if (fd < 0)
        return false;
    close(fd);
    return true;
}

/* The report when install.py could not give one (it was killed, or never ran). */
static json_t *fallback_report(const struct net_opts *n, const struct exec_record *rec,
                               uint64_t budget_ms)
{
    bool timeout = rec->status == EXEC_TIMEOUT;
    size_t len;
    char *err = outcap_render(&rec->err, &len);
    const char *tail = len > 400 ? err + len - 400 : err;
    _cleanup_free_ char *reason =
        timeout ? xasprintf("the install time budget (%.3g s) ran out", (double)budget_ms / 1000)
                : xasprintf("the installer failed (%s): %s", exec_status_name(rec->status),
                            rec->message ? rec->message : tail);
    free(err);
    json_t *requested = json_array(), *missing = json_array();
    for (char *const *p = n->packages; p && *p; p++) {
        json_array_append_new(requested, json_string(*p));
        json_array_append_new(
            missing, json_pack("{s:s,s:s,s:s}", "requirement", *p, "name", *p, "reason", reason));
    }
    return json_pack("{s:s,s:o,s:[],s:o,s:s}", "source",
                     strv_len(n->packages) ? "packages" : REQUIREMENTS, "requested", requested,
                     "installed", "missing", missing, "status", timeout ? "timeout" : "failed");
}

static json_t *parse_report(const struct exec_record *rec)
{
    size_t len;
    char *out = outcap_render(&rec->out, &len);
    json_t *report = NULL;
    char *line = out + len;
    while (line > out && (line[-1] == '\n' || line[-1] == '\r'))
        *--line = '\0';
    while (line > out && line[-1] != '\n')
        line--;
    if (*line == '{')
        report = json_loads(line, 0, NULL);
    free(out);
    if (report && !json_is_object(report)) {
        json_decref(report);
        report = NULL;
    }
    return report;
}

json_t *deps_install(struct sandbox_host *host, struct workspace *ws,
                     const struct sandbox_limits *limits, const struct net_opts *n,
                     const struct sandbox_net *sn)
{
    uint64_t budget_ms = n->install_timeout_ms ? n->install_timeout_ms : DEFAULT_INSTALL_TIMEOUT_MS;
    _cleanup_free_ char *kernel_dir = xasprintf("%s/kernel", host->libexec_dir);
    _cleanup_free_ char *budget = xasprintf("%.3f", (double)budget_ms / 1000.0);
    _cleanup_strv_ char **argv = xcalloc(1, sizeof(char *)), **env = NULL;
    argv = strv_push(argv, "/usr/bin/python3");
    argv = strv_push(argv, "/.runcell/install.py");
    argv = strv_push(argv, "--budget");
    argv = strv_push(argv, budget);
    if (!strv_len(n->packages))
        argv = strv_push(argv, "--requirements=/workspace/" REQUIREMENTS);
    argv = strv_push(argv, "--");
    for (char *const *p = n->packages; p && *p; p++)
        argv = strv_push(argv, *p);
    const char *extra[] = {kernel_dir, "/.runcell", NULL};
    const char *binds[8];
    struct sandbox_spec spec = {.argv = argv, .limits = *limits};
    spec.limits.cpu_time_s = (budget_ms + REPORT_GRACE_MS) / 1000 + 5;
    env = sandbox_net_apply(sn, &spec, binds, ARRAY_SIZE(binds), extra);
    struct run_io io = {.timeout_ms = budget_ms + REPORT_GRACE_MS, .cancel_fd = -1};
    struct exec_record rec;
    exec_record_init(&rec, 1u << 20);
    double t0 = now_ms_f();
    run_sandbox(host, ws, &spec, &io, &rec);
    json_t *report = parse_report(&rec);
    if (!report)
        report = fallback_report(n, &rec, budget_ms);
    json_object_set_new(report, "seconds", json_real((now_ms_f() - t0) / 1000.0));
    size_t missing = json_array_size(json_object_get(report, "missing"));
    if (missing)
        log_info("msg=\"packages missing\" count=%zu status=%s", missing,
                 json_string_value(json_object_get(report, "status")));
    exec_record_release(&rec);
    return report;
}
