/* content.c - what a model reads of an execution's result: one text part that sums the run up,
 * trimmed to what a model can use, and a short text part beside every image (some clients drop
 * a result that has no text, and a model reads a caption where it cannot see the picture). */
#include "mcp/mcp-int.h"

#include <string.h>

/* File names in a run's summary line. */
#define SUMMARY_NAMES 20

/* What of each part of the summary a model gets: the head and the tail, in bytes. The full
 * text is in structuredContent (the record), where the client has it. */
struct trim {
    const char *what;
    size_t head, tail;
};
static const struct trim trim_stdout = {"stdout", 6000, 6000};
static const struct trim trim_stderr = {"stderr", 2000, 4000};
static const struct trim trim_value = {"the value", 4000, 2000};
static const struct trim trim_traceback = {"the traceback", 1000, 6000};

json_t *text_item(const char *text)
{
    return json_pack("{s:s,s:s}", "type", "text", "text", text);
}

/* The start of the UTF-8 character at or before p (never before s). */
static const char *char_start(const char *s, const char *p)
{
    while (p > s && ((unsigned char)*p & 0xc0) == 0x80)
        p--;
    return p;
}

/* Appends text, its middle left out when it is longer than the head and tail of t: cut at
 * line ends where one is near, never inside a UTF-8 character. */
static void append_trimmed(struct buf *b, const char *text, const struct trim *t, bool structured)
{
    size_t n = strlen(text);
    if (n <= t->head + t->tail + 200) {
        buf_append(b, text, n);
        return;
    }
    const char *head_end = char_start(text, text + t->head);
    const char *nl = memrchr(text, '\n', (size_t)(head_end - text));
    if (nl && (size_t)(nl - text) > t->head / 2)
        head_end = nl + 1;
    const char *tail = char_start(text, text + n - t->tail);
    const char *nl2 = memchr(tail, '\n', (size_t)(text + n - tail));
    if (nl2 && (size_t)(nl2 - tail) < t->tail / 2)
        tail = nl2 + 1;
    buf_append(b, text, (size_t)(head_end - text));
    if (b->len && b->data[b->len - 1] != '\n')
        buf_append(b, "\n", 1);
    buf_printf(b, "[... %zu bytes of %s not shown here%s ...]\n", (size_t)(tail - head_end),
               t->what, structured ? "; the whole of it is in the structured result" : "");
    buf_append(b, tail, (size_t)(text + n - tail));
}

/* Starts a new part of the summary on a line of its own. */
static void new_line(struct buf *b)
{
    if (b->len && b->data[b->len - 1] != '\n')
        buf_append(b, "\n", 1);
}

static void append_names(struct buf *b, const char *what, json_t *names, bool *first)
{
    size_t n = json_array_size(names);
    if (!n)
        return;
    buf_printf(b, "%s%s: ", *first ? "[files in /workspace] " : "; ", what);
    *first = false;
    for (size_t i = 0; i < n && i < SUMMARY_NAMES; i++)
        buf_printf(b, "%s%s", i ? ", " : "", json_string_value(json_array_get(names, i)));
    if (n > SUMMARY_NAMES)
        buf_printf(b, " and %zu more", n - SUMMARY_NAMES);
}

static const char *image_mime(json_t *bundle)
{
    const char *mime = NULL;
    return exec_bundle_image(bundle, &mime) ? mime : NULL;
}

static unsigned be16(const unsigned char *p)
{
    return (unsigned)p[0] << 8 | p[1];
}

static unsigned le16(const unsigned char *p)
{
    return (unsigned)p[1] << 8 | p[0];
}

static unsigned le24(const unsigned char *p)
{
    return (unsigned)p[2] << 16 | (unsigned)p[1] << 8 | p[0];
}

/* A JPEG's size from its first start-of-frame segment. */
static bool jpeg_size(const unsigned char *d, size_t n, unsigned *w, unsigned *h)
{
    size_t i = 2;
    while (i + 9 <= n && d[i] == 0xff) {
        unsigned marker = d[i + 1], len = be16(d + i + 2);
        bool sof =
            marker >= 0xc0 && marker <= 0xcf && marker != 0xc4 && marker != 0xc8 && marker != 0xcc;
        if (sof) {
            *h = be16(d + i + 5);
            *w = be16(d + i + 7);
            return true;
        }
        if (len < 2)
            return false;
        i += 2 + len;
    }
    return false;
}

/* An image's width and height from its header; false when it cannot be read. */
static bool image_size(const unsigned char *d, size_t n, unsigned *w, unsigned *h)
{
    if (n >= 24 && !memcmp(d, "\x89PNG\r\n\x1a\n", 8) && !memcmp(d + 12, "IHDR", 4)) {
        *w = (unsigned)d[16] << 24 | (unsigned)d[17] << 16 | (unsigned)d[18] << 8 | d[19];
        *h = (unsigned)d[20] << 24 | (unsigned)d[21] << 16 | (unsigned)d[22] << 8 | d[23];
        return true;
    }
    if (n >= 10 && !memcmp(d, "GIF8", 4)) {
        *w = le16(d + 6);
        *h = le16(d + 8);
        return true;
    }
    if (n >= 4 && d[0] == 0xff && d[1] == 0xd8)
        return jpeg_size(d, n, w, h);
    if (n >= 30 && !memcmp(d, "RIFF", 4) && !memcmp(d + 8, "WEBP", 4)) {
        if (!memcmp(d + 12, "VP8X", 4)) {
            *w = le24(d + 24) + 1;
            *h = le24(d + 27) + 1;
            return true;
        }
        if (!memcmp(d + 12, "VP8 ", 4)) {
            *w = le16(d + 26) & 0x3fff;
            *h = le16(d + 28) & 0x3fff;
            return true;
        }
        if (!memcmp(d + 12, "VP8L", 4) && n >= 25) {
            uint32_t bits = (uint32_t)d[21] | (uint32_t)d[22] << 8 | (uint32_t)d[23] << 16 |
                            (uint32_t)d[24] << 24;
            *w = (bits & 0x3fff) + 1;
            *h = ((bits >> 14) & 0x3fff) + 1;
            return true;
        }
    }
    return false;
}

char *image_caption(const char *label, const char *mime, const char *b64, size_t b64_len)
{
    size_t n = 0;
    _cleanup_free_ unsigned char *data = base64_decode(b64, b64_len, &n);
    const char *format = strchr(mime, '/') ? strchr(mime, '/') + 1 : mime;
    char kind[16];
    size_t i;
    for (i = 0; format[i] && i < sizeof(kind) - 1; i++)
        kind[i] = (char)(format[i] >= 'a' && format[i] <= 'z' ? format[i] - 32 : format[i]);
    kind[i] = '\0';
    char size[32];
    if (n < 1024)
        snprintf(size, sizeof(size), "%zu bytes", n);
    else
        snprintf(size, sizeof(size), "%zu KB", (n + 512) / 1024);
    unsigned w, h;
    if (data && image_size(data, n, &w, &h))
        return xasprintf("%s: %s, %ux%u, %s", label, kind, w, h, size);
    return xasprintf("%s: %s, %s", label, kind, size);
}

/* A figure's title, when its text/plain says more than the object's default repr. */
static const char *figure_title(json_t *bundle)
{
    const char *text = json_string_value(json_object_get(bundle, "text/plain"));
    return text && *text && *text != '<' && strlen(text) <= 200 ? text : NULL;
}

static json_t *image_parts(json_t *bundle, const char *mime, size_t figure)
{
    json_t *data = json_object_get(bundle, mime);
    const char *title = figure_title(bundle);
    _cleanup_free_ char *label =
        title ? xasprintf("figure %zu (%s)", figure, title) : xasprintf("figure %zu", figure);
    _cleanup_free_ char *caption =
        image_caption(label, mime, json_string_value(data), json_string_length(data));
    return json_pack("[o,{s:s,s:O,s:s}]", text_item(caption), "type", "image", "data", data,
                     "mimeType", mime);
}

/* The summary: output, values, traceback, what runcell says, the files. */
static char *summary_text(json_t *rec, bool structured)
{
    const char *out = json_string_value(json_object_get(rec, "stdout"));
    const char *err = json_string_value(json_object_get(rec, "stderr"));
    const char *status = json_string_value(json_object_get(rec, "status"));
    const char *message = json_string_value(json_object_get(rec, "message"));
    json_t *error = json_object_get(rec, "error"), *bundle;
    struct buf b;
    size_t i;
    buf_init(&b, 0);
    if (out && *out)
        append_trimmed(&b, out, &trim_stdout, structured);
    if (err && *err) {
        new_line(&b);
        buf_printf(&b, "[stderr]\n");
        append_trimmed(&b, err, &trim_stderr, structured);
    }
    json_array_foreach(json_object_get(rec, "results"), i, bundle)
    {
        const char *text = json_string_value(json_object_get(bundle, "text/plain"));
        if (!image_mime(bundle) && text && *text) {
            new_line(&b);
            append_trimmed(&b, text, &trim_value, structured);
        }
    }
    if (json_is_object(error)) {
        const char *tb = json_string_value(json_object_get(error, "traceback"));
        _cleanup_free_ char *t =
            tb && *tb ? xstrdup(tb)
                      : xasprintf("%s: %s", json_string_value(json_object_get(error, "name")),
                                  json_string_value(json_object_get(error, "value")));
        new_line(&b);
        append_trimmed(&b, t, &trim_traceback, structured);
    }
    if (message) {
        new_line(&b);
        buf_printf(&b, "[runcell] %s: %s", status, message);
    } else if (status && strcmp(status, "ok") && strcmp(status, "error")) {
        new_line(&b);
        buf_printf(&b, "[runcell] status: %s", status);
    }
    json_t *files = json_object_get(rec, "files");
    bool first = true;
    size_t before = b.len;
    new_line(&b);
    append_names(&b, "created", json_object_get(files, "created"), &first);
    append_names(&b, "modified", json_object_get(files, "modified"), &first);
    append_names(&b, "deleted", json_object_get(files, "deleted"), &first);
    if (first) /* no file line after all */
        b.len = before;
    while (b.len && b.data[b.len - 1] == '\n')
        b.len--;
    if (b.data)
        b.data[b.len] = '\0'; /* after the cuts above */
    if (!b.len)
        buf_printf(&b, "(no output)");
    return buf_detach(&b, NULL);
}

json_t *record_content(json_t *rec, unsigned features, const char *session_id)
{
    json_t *bundle;
    size_t i, figure = 0;
    _cleanup_free_ char *summary = summary_text(rec, features & VF_STRUCTURED);
    size_t n;
    _cleanup_free_ char *clean = utf8_sanitize(summary, strlen(summary), &n);
    json_t *content = json_pack("[o]", text_item(clean));
    json_array_foreach(json_object_get(rec, "results"), i, bundle)
    {
        const char *mime = image_mime(bundle);
        if (mime) {
            json_t *parts = image_parts(bundle, mime, ++figure);
            json_array_extend(content, parts);
            json_decref(parts);
        }
    }
    if (features & VF_STRUCTURED) {
        /* The handle on every result, in a part of its own: some clients (LangChain.js's
         * adapters) put the whole structuredContent beside a result's text when it has one
         * text part and nothing else, in every message the model reads. */
        long cell = (long)json_integer_value(json_object_get(rec, "execution_count"));
        _cleanup_free_ char *t = cell
                                     ? xasprintf("[runcell] session %s, cell %ld", session_id, cell)
                                     : xasprintf("[runcell] session %s", session_id);
        json_array_append_new(content, text_item(t));
    }
    return content;
}

json_t *record_structured(json_t *rec, const char *session_id)
{
    json_t *s = json_deep_copy(rec), *bundle;
    size_t i;
    json_object_set_new(s, "session_id", json_string(session_id));
    json_array_foreach(json_object_get(s, "results"), i, bundle)
    {
        const char *mime = image_mime(bundle);
        if (!mime)
            continue;
        size_t b64 = json_string_length(json_object_get(bundle, mime));
        _cleanup_free_ char *t =
            xasprintf("[%s, %zu bytes, sent as image content]", mime, b64 / 4 * 3);
        json_object_set_new(bundle, mime, json_string(t));
    }
    return s;
}
