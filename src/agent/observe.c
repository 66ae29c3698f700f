/* observe.c - what the model sees of an execution: a compact, capped text view of its
 * record, and its images saved as workspace files. */
#include "agent/agent-int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define STDOUT_HEAD      2500
#define STDOUT_TAIL      1500
#define STDERR_HEAD      1200
#define STDERR_TAIL      1200
#define RESULT_TEXT      1500
#define RESULTS_TOTAL    4000
#define TRACEBACK_TAIL   2500
#define MAX_IMAGES       8
#define MAX_VISION_IMAGE (4u << 20) /* base64 bytes of one image sent as image input */

char *clip_text(const char *s, size_t head, size_t tail)
{
    size_t n = strlen(s);
    if (n <= head + tail + 64)
        return xstrdup(s);
    /* Cut at line ends near the edges when there are some, so lines stay whole. */
    size_t h = head, t = n - tail;
    const char *nl = memchr(s + head / 2, '\n', head - head / 2);
    if (nl)
        h = (size_t)(nl - s) + 1;
    nl = memchr(s + t, '\n', tail / 2);
    if (nl)
        t = (size_t)(nl - s) + 1;
    return xasprintf("%.*s[... %zu bytes not shown ...]\n%s", (int)h, s, t - h, s + t);
}

static void add_stream(struct buf *b, const char *name, const struct outcap *c, size_t head,
                       size_t tail)
{
    size_t n;
    _cleanup_free_ char *raw = outcap_render(c, &n);
    if (!n)
        return;
    _cleanup_free_ char *clean = utf8_sanitize(raw, n, NULL);
    _cleanup_free_ char *clipped = clip_text(clean, head, tail);
    size_t len = strlen(clipped);
    buf_printf(b, "%s:\n%s%s", name, clipped, len && clipped[len - 1] == '\n' ? "" : "\n");
}

static void add_results(struct buf *b, const struct exec_record *rec, char *const *images)
{
    size_t i, total = 0, shown_images = 0;
    json_t *bundle;
    json_array_foreach(rec->results, i, bundle)
    {
        if (exec_bundle_image(bundle, NULL)) {
            if (images && images[shown_images])
                buf_printf(b, "image: saved as %s\n", images[shown_images++]);
            continue;
        }
        const char *text = json_string_value(json_object_get(bundle, "text/plain"));
        if (!text || !*text || total >= RESULTS_TOTAL)
            continue;
        _cleanup_free_ char *clipped = clip_text(text, RESULT_TEXT, RESULT_TEXT / 3);
        total += strlen(clipped);
        buf_printf(b, "result%s:\n%s\n", json_object_get(bundle, "text/html") ? " (also HTML)" : "",
                   clipped);
    }
    for (; images && images[shown_images]; shown_images++)
        buf_printf(b, "image: saved as %s\n", images[shown_images]);
}

static void add_files(struct buf *b, const char *what, char **files)
{
    size_t n = strv_len(files);
    if (!n)
        return;
    buf_printf(b, "files %s:", what);
    for (size_t i = 0; i < n && i < 30; i++)
        buf_printf(b, " %s", files[i]);
    if (n > 30)
        buf_printf(b, " and %zu more", n - 30);
    buf_printf(b, "\n");
}

static void add_error(struct buf *b, json_t *error, const char *shown_stderr)
{
    const char *name = json_string_value(json_object_get(error, "name"));
    const char *value = json_string_value(json_object_get(error, "value"));
    const char *tb = json_string_value(json_object_get(error, "traceback"));
    buf_printf(b, "error: %s%s%s\n", name ? name : "Error", value && *value ? ": " : "",
               value ? value : "");
    /* A traceback already shown in stderr (weak mode reads it from there) is not repeated. */
    if (!tb || !*tb || str_has_prefix(tb, "bash: ") || (shown_stderr && strstr(shown_stderr, tb)))
        return;
    size_t n = strlen(tb);
    const char *start = n > TRACEBACK_TAIL ? tb + n - TRACEBACK_TAIL : tb;
    if (start != tb) {
        const char *nl = strchr(start, '\n');
        start = nl ? nl + 1 : start;
    }
    buf_printf(b, "traceback%s:\n%s%s", start != tb ? " (last lines)" : "", start,
               tb[n - 1] == '\n' ? "" : "\n");
}

char *observation_text(const struct exec_record *rec, char *const *images, const char *note)
{
    struct buf b;
    buf_init(&b, 0);
    buf_printf(&b, "status: %s", exec_status_name(rec->status));
    if (rec->has_exit_code && rec->exit_code)
        buf_printf(&b, " (exit status %d)", rec->exit_code);
    if (rec->state == STATE_LOST)
        buf_printf(&b, "; the interpreter was restarted: variables are lost, files are kept");
    buf_printf(&b, "\n");
    if (rec->message && rec->status != EXEC_OK)
        buf_printf(&b, "runcell: %s\n", rec->message);
    add_stream(&b, "stdout", &rec->out, STDOUT_HEAD, STDOUT_TAIL);
    add_stream(&b, "stderr", &rec->err, STDERR_HEAD, STDERR_TAIL);
    add_results(&b, rec, images);
    if (rec->error) {
        size_t n;
        _cleanup_free_ char *err = outcap_render(&rec->err, &n);
        add_error(&b, rec->error, outcap_truncated(&rec->err) ? NULL : err);
    }
    add_files(&b, "created", rec->created);
    add_files(&b, "modified", rec->modified);
    add_files(&b, "deleted", rec->deleted);
    if (note)
        buf_printf(&b, "note: %s\n", note);
    return buf_detach(&b, NULL);
}

char **save_images(struct workspace *ws, const struct exec_record *rec, json_t *images_b64)
{
    char **names = xcalloc(1, sizeof(char *));
    size_t i, k = 0;
    json_t *bundle;
    json_array_foreach(rec->results, i, bundle)
    {
        const char *mime, *b64 = exec_bundle_image(bundle, &mime);
        if (!b64 || k >= MAX_IMAGES)
            continue;
        _cleanup_free_ char *name = NULL;
        if (ws && exec_figure_save(ws, NULL, rec->execution_count, ++k, mime, b64, &name) == 0)
            names = strv_push(names, name);
        if (images_b64 && strlen(b64) <= MAX_VISION_IMAGE)
            json_array_append_new(images_b64, json_pack("{s:s,s:s}", "mime", mime, "data", b64));
    }
    return names;
}
