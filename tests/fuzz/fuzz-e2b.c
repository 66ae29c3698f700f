/* fuzz-e2b.c - E2B's wire formats as the E2B surface parses them (src/e2b/wire.c): the first
 * byte picks the parser, the rest is its input. 0: a multipart upload (its boundary on the
 * first line); 1 and 2: a Connect request message, streamed (one envelope) and unary, then
 * the path a ListDir or Stat takes from it; 3: a path; 4: a sandbox list's metadata filter;
 * 5: a process.Start's ProcessConfig, made into a command; 6: a create's body; 7: a Connect
 * client stream's messages; 8: protobuf's JSON form of bytes. Whatever the input, each parser
 * answers or refuses with a reason, within its caps, and leaks nothing. */
#include <string.h>

#include "e2b/e2b-int.h"
#include "fuzz.h"

static void multipart(const char *p, size_t n)
{
    const char *nl = memchr(p, '\n', n);
    if (!nl)
        return;
    char *boundary = xstrndup(p, (size_t)(nl - p));
    struct e2b_part *parts = xcalloc(E2B_MAX_PARTS, sizeof(*parts));
    int r = e2b_multipart_parts(nl + 1, n - (size_t)(nl + 1 - p), boundary, parts, E2B_MAX_PARTS);
    for (int i = 0; i < r; i++) {
        /* Each part lies inside the body, and its name was not cut. */
        if (parts[i].data < nl + 1 || parts[i].data + parts[i].len > p + n ||
            strlen(parts[i].filename) >= sizeof(parts[i].filename))
            abort();
    }
    free(parts);
    free(boundary);
}

static void path_of(const char *path)
{
    char why[512];
    char *rel = e2b_ws_path(path, why);
    if (!rel)
        return;
    if (*rel && !path_is_safe_relative(rel))
        abort(); /* a path the workspace functions would refuse must not get through */
    free(e2b_abs(rel));
    free(rel);
}

static void connect_message(const char *p, size_t n, bool stream)
{
    char why[256];
    json_t *m = e2b_connect_message(p, n, stream, why);
    if (!m)
        return;
    if (!json_is_object(m))
        abort();
    const char *path = json_string_value(json_object_get(m, "path"));
    if (path)
        path_of(path);
    json_decref(m);
}

static void metadata(const char *p, size_t n)
{
    char *q = xstrndup(p, n), why[256];
    json_decref(e2b_metadata_parse(q, why));
    free(q);
}

static void process(const char *p, size_t n)
{
    json_t *cfg = json_loadb(p, n, 0, NULL);
    json_t *box_env = json_pack("{s:s,s:s}", "A", "1", "PATH", "/x");
    char why[512];
    struct e2b_command c;
    if (e2b_command_parse(cfg, box_env, &c, why) == 0) {
        /* a program, and a working directory the sandbox can enter: absolute */
        if (!c.argv[0] || !*c.argv[0] || (c.cwd && c.cwd[0] != '/'))
            abort();
        for (char **e = c.env; *e; e++)
            if (!strchr(*e, '='))
                abort();
        e2b_command_release(&c);
    }
    json_decref(box_env);
    json_decref(cfg);
}

static void stream_messages(const char *p, size_t n)
{
    char why[256];
    json_t *arr = e2b_connect_messages(p, n, 64, why);
    if (arr && json_array_size(arr) > 64)
        abort();
    json_decref(arr);
}

static void bytes(const char *p, size_t n)
{
    char *s = xstrndup(p, n);
    size_t len;
    unsigned char *b = e2b_bytes_decode(s, &len);
    if (b && len > n)
        abort();
    free(b);
    free(s);
}

static void create(const char *p, size_t n)
{
    json_t *body = json_loadb(p, n, JSON_REJECT_DUPLICATES, NULL);
    struct e2b_create cr;
    char why[512];
    if (body && e2b_create_parse(body, 3600, &cr, why) == 0) {
        if (cr.timeout_s < 1 || cr.timeout_s > 3600)
            abort();
        strv_free(cr.allow_out);
    }
    json_decref(body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!size)
        return 0;
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    switch (data[0] % 9) {
    case 0:
        multipart(p, n);
        break;
    case 1:
    case 2:
        connect_message(p, n, data[0] % 9 == 1);
        break;
    case 3: {
        char *path = xstrndup(p, n);
        path_of(path);
        free(path);
        break;
    }
    case 4:
        metadata(p, n);
        break;
    case 5:
        process(p, n);
        break;
    case 6:
        create(p, n);
        break;
    case 7:
        stream_messages(p, n);
        break;
    case 8:
        bytes(p, n);
        break;
    }
    return 0;
}
