/* resolve.c - names to addresses for the egress proxy, outside the sandbox: IP literals, an
 * optional hosts file of runcell's own (RUNCELL_NET_HOSTS), then the system resolver. */
#include "net/net-int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define HOSTS_FILE_MAX (1u << 20)

static bool add_addr(const char *text, uint16_t port, struct sockaddr_storage *ret, size_t *n)
{
    struct sockaddr_storage ss = {0};
    struct sockaddr_in *v4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&ss;
    if (*n >= NET_MAX_ADDRS)
        return false;
    if (inet_pton(AF_INET, text, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons(port);
    } else if (inet_pton(AF_INET6, text, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons(port);
    } else {
        return false;
    }
    ret[(*n)++] = ss;
    return true;
}

/* Names compared case-insensitively, a trailing dot in the file's name ignored (host
 * never has one: the request parser drops it). */
static bool same_name(const char *name, const char *host)
{
    size_t n = strlen(name);
    if (n > 1 && name[n - 1] == '.')
        n--;
    return n == strlen(host) && !strncasecmp(name, host, n);
}

/* Looks host up in a hosts(5) file: "ADDRESS NAME [ALIAS...]", '#' comments. */
static void hosts_file_lookup(const char *path, const char *host, uint16_t port,
                              struct sockaddr_storage *ret, size_t *n)
{
    char *data;
    size_t len;
    if (read_file(path, HOSTS_FILE_MAX, &data, &len) < 0) {
        log_warn("msg=\"cannot read RUNCELL_NET_HOSTS\" path=%s", log_quote(path));
        return;
    }
    char *save = NULL;
    for (char *line = strtok_r(data, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        line[strcspn(line, "#")] = '\0';
        char *fsave = NULL, *addr = strtok_r(line, " \t\r", &fsave), *name;
        while (addr && (name = strtok_r(NULL, " \t\r", &fsave)))
            if (same_name(name, host))
                add_addr(addr, port, ret, n);
    }
    free(data);
}

int net_resolve(const char *host, uint16_t port, struct sockaddr_storage *ret, size_t *ret_n)
{
    *ret_n = 0;
    if (add_addr(host, port, ret, ret_n))
        return 0;
    const char *hosts = getenv("RUNCELL_NET_HOSTS");
    if (hosts && *hosts) {
        hosts_file_lookup(hosts, host, port, ret, ret_n);
        if (*ret_n)
            return 0;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai, *it;
    int r = getaddrinfo(host, NULL, &hints, &ai);
    if (r)
        return err_set(ENOENT, "%s", r == EAI_SYSTEM ? strerror(errno) : gai_strerror(r));
    for (it = ai; it && *ret_n < NET_MAX_ADDRS; it = it->ai_next) {
        if (it->ai_family != AF_INET && it->ai_family != AF_INET6)
            continue;
        struct sockaddr_storage ss = {0};
        memcpy(&ss, it->ai_addr, it->ai_addrlen);
        if (ss.ss_family == AF_INET)
            ((struct sockaddr_in *)&ss)->sin_port = htons(port);
        else
            ((struct sockaddr_in6 *)&ss)->sin6_port = htons(port);
        ret[(*ret_n)++] = ss;
    }
    freeaddrinfo(ai);
    if (!*ret_n)
        return err_set(ENOENT, "no IPv4 or IPv6 address");
    return 0;
}
