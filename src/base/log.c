/* log.c - per-thread error messages and one-line logging to stderr. */
#include "base/base.h"

#include <errno.h>
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

void err_clear(void)
{
    err_buf[0] = '\0';
}

void log_set_level(enum log_level level)
{
    min_level = level;
}

bool log_enabled(enum log_level level)
{
    return level >= min_level;
}

void log_msg(enum log_level level, const char *fmt, ...)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    if (level < min_level)
        return;
    int saved = errno;
    char line[4096];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, names[level]);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof(line))
        vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    /* One write per line so concurrent threads never interleave within a line. */
    size_t len = strnlen(line, sizeof(line) - 2);
    line[len++] = '\n';
    (void)write_all(2, line, len);
    errno = saved;
}
