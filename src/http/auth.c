/* auth.c - the server's bearer token: where it comes from and how it is compared. */
#include "http/http.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TOKEN_BYTES   24
#define MIN_TOKEN_LEN 16

static int check_token(const char *t, const char *where)
{
    if (strlen(t) < MIN_TOKEN_LEN)
        return err_set(EINVAL,
                       "the token from %s is shorter than %d characters; use a long "
                       "random one (e.g. openssl rand -hex 24)",
                       where, MIN_TOKEN_LEN);
    for (const char *p = t; *p; p++)
        if (*p <= ' ' || *p > '~')
            return err_set(EINVAL, "the token from %s holds a space or a non-ASCII character",
                           where);
    return 0;
}

int token_load(const char *data_dir, const char *given, char **ret, bool *ret_generated)
{
    _cleanup_free_ char *path = xasprintf("%s/token", data_dir);
    const char *env = getenv("RUNCELL_TOKEN");
    int r;
    *ret_generated = false;
    if (given || (env && *env)) {
        const char *t = given ? given : env;
        if ((r = check_token(t, given ? "--token" : "RUNCELL_TOKEN")) < 0)
            return r;
        *ret = xstrdup(t);
        return 0;
    }
    char *text;
    size_t n;
    r = read_file(path, 4096, &text, &n);
    if (r == 0) {
        text[strcspn(text, "\r\n")] = '\0';
        if ((r = check_token(text, path)) < 0) {
            free(text);
            return r;
        }
        *ret = text;
        return 0;
    }
    if (r != -ENOENT)
        return err_set(-r, "cannot read %s: %s", path, strerror(-r));
    char *t = random_hex(TOKEN_BYTES);
    _cleanup_close_ int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 || write_all(fd, t, strlen(t)) < 0 || write_all(fd, "\n", 1) < 0) {
        int e = errno;
        free(t);
        return err_set(e, "cannot write the new token to %s: %s", path, strerror(e));
    }
    *ret = t;
    *ret_generated = true;
    return 0;
}

bool token_equal(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    unsigned char diff = (unsigned char)(la != lb);
    /* Walk the expected token's length whatever the input, so the time says nothing about
     * how much of it matched. */
    for (size_t i = 0; i < lb; i++)
        diff |= (unsigned char)(b[i] ^ (i < la ? a[i] : 0));
    return diff == 0;
}
