/* status.c - the status lines runcell-sandbox (and a template-made sandbox) writes to the
 * daemon: "pid N", "ready", "error MESSAGE", "exit N", "signal N". */
#include "sandbox/helper/helper.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"

int status_fd = HELPER_FD_STATUS;

void status_write(const char *fmt, ...)
{
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof(line) - 2)
        n = (int)sizeof(line) - 2;
    for (int i = 0; i < n; i++)
        if (line[i] == '\n')
            line[i] = ' ';
    line[n++] = '\n';
    (void)write_all(status_fd, line, (size_t)n);
}

static int vfail(int err, const char *fmt, va_list ap)
{
    char msg[1536];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    if (err)
        status_write("error %s: %s", msg, strerror(err));
    else
        status_write("error %s", msg);
    return -1;
}

int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(0, fmt, ap);
    va_end(ap);
    return -1;
}

int fail_errno(const char *fmt, ...)
{
    int err = errno;
    va_list ap;
    va_start(ap, fmt);
    vfail(err, fmt, ap);
    va_end(ap);
    return -1;
}
