/* log.c - per-thread error messages and one-line logging to stderr. */
#include "base/base.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static __thread char err_buf[1024];
static enum log_level min_level = LOG_INFO;

int err_set(int err, const char *fmt, ...)
{
    /* Formatted aside first: the arguments may include err_msg() itself (a message that
     * wraps the previous one), which must not be overwritten while it is read. */
    char msg[sizeof(err_buf)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    memcpy(err_buf, msg, sizeof(err_buf));
    return err > 0 ? -err : err;
}

const char *err_msg(void)
{
    return err_buf[0] ? err_buf : "unknown error";
}

void log_set_level(enum log_level level)
{
    min_level = level;
}

/* Length of the UTF-8 sequence at s (at most n bytes) that is printable text: 0 for a
 * control character (C0, DEL, C1) or a byte that does not start a valid sequence. */
static size_t printable_len(const unsigned char *s, size_t n)
{
    if (s[0] >= 0x20 && s[0] < 0x7f)
        return 1;
    size_t len = s[0] >= 0xc2 && s[0] <= 0xdf   ? 2
                 : s[0] >= 0xe0 && s[0] <= 0xef ? 3
                 : s[0] >= 0xf0 && s[0] <= 0xf4 ? 4
                                                : 0;
    if (!len || len > n)
        return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    uint32_t cp = s[0] & (0x7f >> len);
    for (size_t i = 1; i < len; i++)
        cp = (cp << 6) | (s[i] & 0x3f);
    static const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) ||
        (cp >= 0x80 && cp <= 0x9f))
        return 0; /* overlong, out of range, a surrogate, or a C1 control */
    return len;
}

/* Copies text to out (cap bytes, which holds at least 16) with every control character and
 * byte that is not valid UTF-8 escaped: \n, \r, \t or \xHH, as OpenSSH's log does with
 * strnvis. What any argument brought (a name chosen by sandboxed code, a peer's bytes) can
 * neither start a line of its own nor drive a terminal. A line too long for out ends in
 * "...[truncated]", as does one that was cut already (cut). Returns the length written. */
static size_t escape_line(const char *text, bool cut, char *out, size_t cap)
{
    static const char tail[] = "...[truncated]";
    const unsigned char *s = (const unsigned char *)text;
    size_t n = strlen(text), o = 0, room = cap - sizeof(tail);
    for (size_t i = 0; i < n;) {
        size_t len = printable_len(s + i, n - i);
        char esc[5];
        size_t elen = len;
        if (!len) {
            const char *named = s[i] == '\n'   ? "\\n"
                                : s[i] == '\r' ? "\\r"
                                : s[i] == '\t' ? "\\t"
                                               : NULL;
            if (named)
                memcpy(esc, named, elen = 2);
            else
                elen = (size_t)snprintf(esc, sizeof(esc), "\\x%02x", s[i]);
        }
        if (o + elen > room) {
            memcpy(out + o, tail, sizeof(tail) - 1);
            return o + sizeof(tail) - 1;
        }
        memcpy(out + o, len ? (const char *)s + i : esc, elen);
        o += elen;
        i += len ? len : 1;
    }
    if (cut) {
        memcpy(out + o, tail, sizeof(tail) - 1);
        o += sizeof(tail) - 1;
    }
    return o;
}

void log_msg(enum log_level level, const char *fmt, ...)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    if (level < min_level)
        return;
    int saved = errno;
    char msg[4096], line[4096 + 64];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    va_list ap;
    va_start(ap, fmt);
    int want = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    int n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, names[level]);
    size_t len = (size_t)n +
                 escape_line(msg, want >= (int)sizeof(msg), line + n, sizeof(line) - (size_t)n - 1);
    /* One write per line so concurrent threads never interleave within a line. */
    line[len++] = '\n';
    (void)write_all(2, line, len);
    errno = saved;
}

const char *log_quote(const char *s)
{
    static __thread char ring[LOG_QUOTE_SLOTS][2 * LOG_QUOTE_MAX + 8];
    static __thread unsigned next;
    char *out = ring[next++ % LOG_QUOTE_SLOTS];
    size_t o = 0;
    if (!s)
        return "-";
    out[o++] = '"';
    for (size_t i = 0; s[i]; i++) {
        if (i >= LOG_QUOTE_MAX) {
            memcpy(out + o, "...", 3);
            o += 3;
            break;
        }
        if (s[i] == '"' || s[i] == '\\')
            out[o++] = '\\';
        out[o++] = s[i];
    }
    out[o++] = '"';
    out[o] = '\0';
    return out;
}
