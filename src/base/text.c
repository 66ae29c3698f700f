/* text.c - UTF-8 repair and strict number parsing. */
#include "base/base.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when invalid or truncated. */
static size_t utf8_seq_len(const unsigned char *s, size_t avail)
{
    unsigned char c = s[0];
    size_t need;
    uint32_t cp;
    if (c < 0x80)
        return c ? 1 : 0;
    if ((c & 0xe0) == 0xc0) {
        need = 2;
        cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
        need = 3;
        cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
        need = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (avail < need)
        return 0;
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    /* Reject overlong forms, surrogates and values past U+10FFFF. */
    if ((need == 2 && cp < 0x80) || (need == 3 && cp < 0x800) || (need == 4 && cp < 0x10000) ||
        (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
        return 0;
    return need;
}

char *utf8_sanitize(const char *s, size_t len, size_t *ret_len)
{
    struct buf out;
    buf_init(&out, 0);
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, run = 0;
    while (i < len) {
        size_t n = utf8_seq_len(p + i, len - i);
        if (n) {
            i += n;
            run += n;
            continue;
        }
        buf_append(&out, p + i - run, run);
        buf_append(&out, "\xef\xbf\xbd", 3);
        run = 0;
        i++;
    }
    buf_append(&out, p + i - run, run);
    return buf_detach(&out, ret_len);
}

int parse_u64(const char *s, uint64_t *ret)
{
    if (!s || !*s || *s < '0' || *s > '9')
        return -EINVAL;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno == ERANGE)
        return -ERANGE;
    if (*end)
        return -EINVAL;
    *ret = v;
    return 0;
}

int parse_seconds(const char *s, uint64_t *ret_ms)
{
    if (!s || !*s || ((*s < '0' || *s > '9') && *s != '.'))
        return -EINVAL;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || *end || v != v || v <= 0 || v > 1e9)
        return -EINVAL;
    uint64_t ms = (uint64_t)(v * 1000.0 + 0.5);
    if (!ms)
        ms = 1;
    *ret_ms = ms;
    return 0;
}

bool str_has_prefix(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *base64_encode(const void *data, size_t n, size_t *ret_len)
{
    const unsigned char *p = data;
    size_t out_len = 4 * ((n + 2) / 3);
    char *out = xmalloc(out_len + 1), *o = out;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16;
        if (i + 1 < n)
            v |= (uint32_t)p[i + 1] << 8;
        if (i + 2 < n)
            v |= p[i + 2];
        *o++ = b64_alphabet[(v >> 18) & 63];
        *o++ = b64_alphabet[(v >> 12) & 63];
        *o++ = i + 1 < n ? b64_alphabet[(v >> 6) & 63] : '=';
        *o++ = i + 2 < n ? b64_alphabet[v & 63] : '=';
    }
    *o = '\0';
    if (ret_len)
        *ret_len = out_len;
    return out;
}

static int b64_value(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+' || c == '-')
        return 62;
    if (c == '/' || c == '_')
        return 63;
    return -1;
}

unsigned char *base64_decode(const char *s, size_t n, size_t *ret_len)
{
    unsigned char *out = xmalloc(n / 4 * 3 + 3);
    size_t len = 0;
    uint32_t acc = 0;
    int bits = 0;
    bool pad = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == ' ' || c == '\n' || c == '\r' || c == '\t')
            continue;
        if (c == '=') {
            pad = true;
            continue;
        }
        int v = b64_value(c);
        if (v < 0 || pad) {
            free(out);
            return NULL;
        }
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[len++] = (unsigned char)(acc >> bits);
        }
    }
    if (bits >= 6) { /* a lone trailing symbol cannot encode a byte */
        free(out);
        return NULL;
    }
    *ret_len = len;
    return out;
}

const char *mime_type_of(const char *path)
{
    static const char *const types[][2] = {
        {".png", "image/png"},
        {".jpg", "image/jpeg"},
        {".jpeg", "image/jpeg"},
        {".gif", "image/gif"},
        {".webp", "image/webp"},
        {".svg", "image/svg+xml"},
        {".pdf", "application/pdf"},
        {".json", "application/json"},
        {".csv", "text/csv"},
        {".tsv", "text/tab-separated-values"},
        {".txt", "text/plain"},
        {".log", "text/plain"},
        {".md", "text/markdown"},
        {".py", "text/x-python"},
        {".sh", "text/x-shellscript"},
        {".js", "text/javascript"},
        {".mjs", "text/javascript"},
        {".html", "text/html"},
        {".htm", "text/html"},
        {".xml", "application/xml"},
        {".yaml", "application/yaml"},
        {".yml", "application/yaml"},
        {".parquet", "application/vnd.apache.parquet"},
        {".zip", "application/zip"},
        {".gz", "application/gzip"},
        {".xlsx", "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"},
    };
    const char *slash = strrchr(path, '/');
    const char *dot = strrchr(slash ? slash + 1 : path, '.');
    for (size_t i = 0; dot && i < ARRAY_SIZE(types); i++)
        if (!strcasecmp(dot, types[i][0]))
            return types[i][1];
    return NULL;
}
