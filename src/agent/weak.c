/* weak.c - weak mode: when the stateful sandbox cannot serve, each run is a one-shot
 * sandbox running plain python3 -I -S with a meta-path guard that admits only the standard
 * library. Nothing is kept between runs. */
#include "agent/agent-int.h"

#include <ctype.h>
#include <errno.h>
#include <string.h>

#define WEAK_MAX_CODE (120u * 1024) /* one argv string may hold at most 128 KiB */

/* The program python3 -c runs: the guard, then the model's code (argv[1]) compiled as
 * "<weak>" with its source in linecache so that tracebacks show the failing line. */
static const char weak_prelude[] =
    "import sys\n"
    "_STD = frozenset(sys.stdlib_module_names) | frozenset(sys.builtin_module_names)\n"
    "class _WeakModeGuard:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        top = name.partition('.')[0]\n"
    "        if top in _STD:\n"
    "            return None\n"
    "        raise ModuleNotFoundError(\n"
    "            'weak mode: %r is not part of the Python standard library, and only the '\n"
    "            'standard library is available in weak mode (use it instead)' % top, name=top)\n"
    "sys.meta_path.insert(0, _WeakModeGuard())\n"
    "_code = sys.argv.pop(1)\n"
    "sys.argv[0] = '<weak>'\n"
    "import linecache\n"
    "linecache.cache['<weak>'] = (len(_code), None, _code.splitlines(True), '<weak>')\n"
    "_globals = {'__name__': '__main__', '__builtins__': __builtins__}\n"
    "try:\n"
    "    exec(compile(_code, '<weak>', 'exec'), _globals)\n"
    "except SystemExit:\n"
    "    raise\n"
    "except BaseException as _e:\n"
    "    import traceback\n"
    "    _frames = [f for f in traceback.extract_tb(_e.__traceback__) if f.filename != "
    "'<string>']\n"
    "    if _frames:\n"
    "        sys.stderr.write('Traceback (most recent call last):\\n')\n"
    "        sys.stderr.write(''.join(traceback.format_list(_frames)))\n"
    "    sys.stderr.write(''.join(traceback.format_exception_only(type(_e), _e)))\n"
    "    sys.exit(1)\n";

/* "Name: value" on the last line of a traceback; the traceback from its start. */
static void error_from_stderr(struct exec_record *rec)
{
    size_t n;
    _cleanup_free_ char *text = outcap_render(&rec->err, &n);
    char *end = text + n;
    while (end > text && isspace((unsigned char)end[-1]))
        *--end = '\0';
    char *last = strrchr(text, '\n');
    last = last ? last + 1 : text;
    size_t name_len = strspn(last, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                   "0123456789_.");
    if (!name_len || isdigit((unsigned char)*last) ||
        (last[name_len] && strncmp(last + name_len, ": ", 2)))
        return;
    char *start = strstr(text, "Traceback (most recent call last):");
    if (!start)
        start = strstr(text, "  File \"");
    _cleanup_free_ char *name = xstrndup(last, name_len);
    const char *value = last[name_len] ? last + name_len + 2 : "";
    rec->error =
        json_pack("{s:s,s:s,s:s}", "name", name, "value", value, "traceback", start ? start : last);
}

int weak_run(struct sandbox_host *host, const struct agent_options *o, const char *code,
             uint64_t timeout_ms, struct exec_record *rec)
{
    if (strlen(code) > WEAK_MAX_CODE) {
        rec->status = EXEC_ERROR;
        rec->message = xasprintf("the code is longer than %u KiB, the most weak mode takes; "
                                 "write it in smaller pieces",
                                 WEAK_MAX_CODE / 1024);
        return 0;
    }
    struct input_file *inputs = xcalloc(o->n_files + 1, sizeof(*inputs));
    for (size_t i = 0; i < o->n_files; i++)
        inputs[i] = (struct input_file){.local = o->files[i].host_path, .dest = o->files[i].dest};
    char *args[] = {(char *)weak_prelude, (char *)code, NULL};
    struct run_request req = {
        .lang = "bash",
        .code = "exec /usr/bin/python3 -I -S -c \"$1\" \"$2\"",
        .args = args,
        .files = inputs,
        .n_files = o->n_files,
        .output_cap = DEFAULT_OUTPUT_CAP,
        .out_dir = o->out_dir,
        .cancel_fd = o->cancel.fd,
        .timeout_ms = timeout_ms ? timeout_ms : DEFAULT_TIMEOUT_MS,
    };
    if (o->session_opts)
        req.limits = o->session_opts->limits;
    sandbox_limits_fill_defaults(&req.limits);
    int r = run_oneshot(host, &req, rec);
    free(inputs);
    if (r == 0 && rec->status == EXEC_ERROR)
        error_from_stderr(rec);
    return r;
}
