/* mem.c - allocation helpers that abort on exhaustion, and string vectors. */
#include "base/base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void oom(void)
{
    static const char msg[] = "runcell: out of memory\n";
    (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
    abort();
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        oom();
    return p;
}

void *xcalloc(size_t nmemb, size_t size)
{
    void *p = calloc(nmemb ? nmemb : 1, size ? size : 1);
    if (!p)
        oom();
    return p;
}

void *xrealloc(void *p, size_t n)
{
    p = realloc(p, n ? n : 1);
    if (!p)
        oom();
    return p;
}

char *xstrdup(const char *s)
{
    char *p = strdup(s);
    if (!p)
        oom();
    return p;
}

char *xstrndup(const char *s, size_t n)
{
    char *p = strndup(s, n);
    if (!p)
        oom();
    return p;
}

char *xasprintf(const char *fmt, ...)
{
    va_list ap;
    char *p;
    va_start(ap, fmt);
    int r = vasprintf(&p, fmt, ap);
    va_end(ap);
    if (r < 0)
        oom();
    return p;
}

void strv_free(char **v)
{
    if (!v)
        return;
    for (char **p = v; *p; p++)
        free(*p);
    free(v);
}

void strv_freep(char ***v)
{
    strv_free(*v);
}

size_t strv_len(char *const *v)
{
    size_t n = 0;
    while (v && v[n])
        n++;
    return n;
}

char **strv_push(char **v, const char *s)
{
    size_t n = strv_len(v);
    v = xrealloc(v, (n + 2) * sizeof(*v));
    v[n] = xstrdup(s);
    v[n + 1] = NULL;
    return v;
}

void closep(int *fd)
{
    if (*fd >= 0)
        close(*fd);
}
