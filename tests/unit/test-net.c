/* test-net.c - unit tests for src/net: allowlist parsing and matching, address classes, the
 * server cap, and parsing what clients send the proxy. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "net/net-int.h"
#include "runner.h"

static struct net_policy *policy(const char *list)
{
    struct net_policy *p = NULL;
    CHECK(net_policy_parse_list(list, &p) == 0);
    return p;
}

static const char *rule(const struct net_policy *p, const char *host, uint16_t port)
{
    const struct net_entry *e = net_policy_match(p, host, port);
    return e ? e->text : "none";
}

TEST(entries_parse_to_canonical_form)
{
    struct net_policy *p = policy("Example.COM., *.pkg.test:8443, 10.0.0.1:80, [::1]:8080, ::2");
    CHECK(p->n == 5);
    CHECK_STREQ(p->entries[0].text, "example.com");
    CHECK(p->entries[0].port == 0);
    CHECK_STREQ(p->entries[1].text, "*.pkg.test:8443");
    CHECK(p->entries[1].kind == NET_ENTRY_WILDCARD);
    CHECK_STREQ(p->entries[2].text, "10.0.0.1:80");
    CHECK(p->entries[2].kind == NET_ENTRY_IP);
    CHECK_STREQ(p->entries[3].text, "[::1]:8080");
    CHECK_STREQ(p->entries[4].text, "::2");
    net_policy_free(p);
}

TEST(bad_entries_are_refused_with_the_entry_named)
{
    const char *bad[] = {
        "",         "*",     "*.",  "a..b", "-a.test",      "a.test:0", "a.test:65536",
        "a.test:x", "1.2.3", "a b", "[::1", "ex*ample.com", "a.test:"};
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        struct net_policy *p = NULL;
        CHECK(net_policy_parse(&bad[i], 1, &p) == -EINVAL);
        CHECK(p == NULL);
    }
    struct net_policy *p = NULL;
    CHECK(net_policy_parse_list("a.test,,b.test", &p) == -EINVAL);
    CHECK(strstr(err_msg(), "empty entry") != NULL);
    const char *one = "a.test:99999";
    CHECK(net_policy_parse(&one, 1, &p) == -EINVAL);
    CHECK(strstr(err_msg(), "a.test:99999") != NULL);
}

TEST(default_ports_are_80_and_443)
{
    struct net_policy *p = policy("a.test");
    CHECK_STREQ(rule(p, "a.test", 80), "a.test");
    CHECK_STREQ(rule(p, "a.test", 443), "a.test");
    CHECK_STREQ(rule(p, "a.test", 8080), "none");
    CHECK_STREQ(rule(p, "A.Test.", 443), "a.test");
    net_policy_free(p);
}

TEST(wildcards_match_subdomains_only)
{
    struct net_policy *p = policy("*.example.test");
    CHECK_STREQ(rule(p, "a.example.test", 443), "*.example.test");
    CHECK_STREQ(rule(p, "b.a.example.test", 443), "*.example.test");
    CHECK_STREQ(rule(p, "example.test", 443), "none");
    CHECK_STREQ(rule(p, "example.test.evil", 443), "none");
    CHECK_STREQ(rule(p, "badexample.test", 443), "none");
    CHECK_STREQ(rule(p, ".example.test", 443), "none");
    net_policy_free(p);
}

TEST(ip_entries_match_the_literal_only)
{
    struct net_policy *p = policy("127.0.0.1:8000,[::1]:8000");
    CHECK_STREQ(rule(p, "127.0.0.1", 8000), "127.0.0.1:8000");
    CHECK_STREQ(rule(p, "127.0.0.1", 8001), "none");
    CHECK_STREQ(rule(p, "[::1]", 8000), "[::1]:8000");
    CHECK_STREQ(rule(p, "::1", 8000), "[::1]:8000");
    CHECK_STREQ(rule(p, "localhost", 8000), "none");
    CHECK_STREQ(rule(p, "127.1", 8000), "none");
    net_policy_free(p);
}

TEST(a_host_is_listed_whatever_its_port)
{
    struct net_policy *p = policy("a.test,*.w.test:8443,127.0.0.1:8000,[::1]:9000");
    CHECK(net_policy_lists_host(p, "a.test"));
    CHECK(net_policy_lists_host(p, "A.Test."));
    CHECK(net_policy_match(p, "a.test", 8080) == NULL);
    CHECK(net_policy_lists_host(p, "x.w.test"));
    CHECK(net_policy_lists_host(p, "127.0.0.1"));
    CHECK(net_policy_lists_host(p, "::1"));
    CHECK(net_policy_lists_host(p, "[::1]"));
    CHECK(!net_policy_lists_host(p, "b.test"));
    CHECK(!net_policy_lists_host(p, "w.test"));
    CHECK(!net_policy_lists_host(p, "127.0.0.2"));
    CHECK(!net_policy_lists_host(p, ""));
    CHECK(!net_policy_lists_host(NULL, "a.test"));
    net_policy_free(p);
}

static bool allowed(const struct net_policy *p, const char *ip, uint16_t port)
{
    struct sockaddr_storage ss = {0};
    const char *why;
    if (strchr(ip, ':')) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
        s6->sin6_family = AF_INET6;
        CHECK(inet_pton(AF_INET6, ip, &s6->sin6_addr) == 1);
    } else {
        struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
        s4->sin_family = AF_INET;
        CHECK(inet_pton(AF_INET, ip, &s4->sin_addr) == 1);
    }
    return net_addr_allowed(p, (struct sockaddr *)&ss, port, &why);
}

static const char *why_refused(const struct net_policy *p, const char *ip, uint16_t port)
{
    struct sockaddr_storage ss = {0};
    const char *why = NULL;
    if (strchr(ip, ':')) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
        s6->sin6_family = AF_INET6;
        CHECK(inet_pton(AF_INET6, ip, &s6->sin6_addr) == 1);
    } else {
        struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
        s4->sin_family = AF_INET;
        CHECK(inet_pton(AF_INET, ip, &s4->sin_addr) == 1);
    }
    return net_addr_allowed(p, (struct sockaddr *)&ss, port, &why) ? NULL : why;
}

TEST(special_addresses_are_refused_unless_named_exactly)
{
    struct net_policy *p = policy("a.test,127.0.0.1:8000");
    const char *special[] = {"127.0.0.2",
                             "10.1.2.3",
                             "172.16.0.1",
                             "192.168.1.1",
                             "169.254.169.254",
                             "100.64.0.1",
                             "0.0.0.0",
                             "224.0.0.1",
                             "255.255.255.255",
                             "::1",
                             "::",
                             "fe80::1",
                             "fd00::1",
                             "::ffff:169.254.169.254",
                             "::ffff:10.0.0.1",
                             "64:ff9b::a9fe:a9fe"};
    for (size_t i = 0; i < ARRAY_SIZE(special); i++)
        CHECK(!allowed(p, special[i], 443));
    CHECK(allowed(p, "93.184.215.14", 443));
    CHECK(allowed(p, "2606:2800:21f:cb07:6820:80da:af6b:8b2c", 443));
    CHECK(allowed(p, "127.0.0.1", 8000));
    CHECK(!allowed(p, "127.0.0.1", 8001));
    CHECK(allowed(p, "::ffff:127.0.0.1", 8000));
    CHECK(net_policy_names_loopback(p));
    net_policy_free(p);
}

/* Every class of the special-purpose registries: its first and last address, and the
 * reason the proxy gives. A class is refused whatever the port, unless named exactly. */
TEST(every_special_purpose_class_is_refused)
{
    static const struct {
        const char *first, *last, *why;
    } classes[] = {
        {"0.0.0.0", "0.255.255.255", "unspecified"},
        {"10.0.0.0", "10.255.255.255", "private"},
        {"100.64.0.0", "100.127.255.255", "shared"},
        {"127.0.0.0", "127.255.255.255", "loopback"},
        {"169.254.0.0", "169.254.255.255", "link-local"},
        {"172.16.0.0", "172.31.255.255", "private"},
        {"192.0.0.0", "192.0.0.7", "DS-Lite"},
        {"192.0.0.170", "192.0.0.171", "NAT64 discovery"},
        {"192.0.0.8", "192.0.0.255", "IETF protocol"},
        {"192.0.2.0", "192.0.2.255", "documentation"},
        {"192.31.196.0", "192.31.196.255", "AS112"},
        {"192.52.193.0", "192.52.193.255", "AMT"},
        {"192.88.99.0", "192.88.99.255", "6to4 relay"},
        {"192.168.0.0", "192.168.255.255", "private"},
        {"192.175.48.0", "192.175.48.255", "AS112"},
        {"198.18.0.0", "198.19.255.255", "benchmarking"},
        {"198.51.100.0", "198.51.100.255", "documentation"},
        {"203.0.113.0", "203.0.113.255", "documentation"},
        {"224.0.0.0", "239.255.255.255", "multicast"},
        {"240.0.0.0", "255.255.255.254", "reserved"},
        {"255.255.255.255", "255.255.255.255", "broadcast"},
        {"::", "::", "unspecified"},
        {"::1", "::1", "loopback"},
        {"::ffff:10.0.0.0", "::ffff:10.255.255.255", "private"},
        {"64:ff9b::a9fe:0", "64:ff9b::a9fe:ffff", "link-local"},
        {"64:ff9b:1::", "64:ff9b:1:ffff:ffff:ffff:ffff:ffff", "local-use NAT64"},
        {"::2", "ff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "reserved"},
        {"100::", "100::ffff:ffff:ffff:ffff", "discard-only"},
        {"100:0:0:1::", "100::1:ffff:ffff:ffff:ffff", "dummy"},
        {"2001::", "2001:0:ffff:ffff:ffff:ffff:ffff:ffff", "Teredo"},
        {"2001:2::", "2001:2:0:ffff:ffff:ffff:ffff:ffff", "benchmarking"},
        {"2001:db8::", "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", "documentation"},
        {"2001:1::1", "2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff", "IETF protocol"},
        {"2002::", "2002:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "6to4"},
        {"2620:4f:8000::", "2620:4f:8000:ffff:ffff:ffff:ffff:ffff", "AS112"},
        {"3fff::", "3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff", "documentation"},
        {"5f00::", "5f00:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "segment routing"},
        {"fc00::", "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "unique local"},
        {"fe80::", "febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "link-local"},
        {"fec0::", "feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "site-local"},
        {"ff00::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "multicast"},
        {"100:0:0:2::", "1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "reserved"},
        {"4000::", "7fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "reserved"},
        {"8000::", "fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "reserved"},
    };
    struct net_policy *p = policy("a.test,192.88.99.1,[2001::1]:8443,64:ff9b:1::7");
    for (size_t i = 0; i < ARRAY_SIZE(classes); i++) {
        const char *ends[] = {classes[i].first, classes[i].last};
        for (size_t j = 0; j < 2; j++) {
            const char *why = why_refused(p, ends[j], 443);
            if (!why || !strstr(why, classes[i].why))
                fprintf(stderr, "%s: %s\n", ends[j], why ? why : "allowed");
            CHECK(why && strstr(why, classes[i].why));
        }
    }
    /* The neighbours just outside are public. */
    const char *public[] = {
        "11.0.0.0",         "100.63.255.255", "100.128.0.0", "172.32.0.0",      "192.0.1.0",
        "192.88.98.255",    "192.88.100.0",   "198.20.0.0",  "223.255.255.255", "2001:200::1",
        "2003::1",          "2001:db9::1",    "3ffe::1",     "2620:4f:8001::1", "2606:4700::1111",
        "64:ff9b::808:808", "::ffff:8.8.8.8"};
    for (size_t i = 0; i < ARRAY_SIZE(public); i++) {
        if (why_refused(p, public[i], 443))
            fprintf(stderr, "%s: %s\n", public[i], why_refused(p, public[i], 443));
        CHECK(!why_refused(p, public[i], 443));
    }
    /* Named exactly, with the port the entry allows: allowed; any other address of the
     * class or another port: not. */
    CHECK(allowed(p, "192.88.99.1", 443));
    CHECK(!allowed(p, "192.88.99.2", 443));
    CHECK(allowed(p, "2001::1", 8443));
    CHECK(!allowed(p, "2001::1", 443));
    CHECK(allowed(p, "64:ff9b:1::7", 80));
    CHECK(!allowed(p, "64:ff9b:1::8", 80));
    net_policy_free(p);
}

TEST(a_trailing_dot_is_dropped_before_policy_and_lookup)
{
    struct proxy_request rq;
    memset(&rq, 0, sizeof(rq));
    buf_init(&rq.forward, 2 * NET_MAX_HEAD);
    const char *head = "CONNECT Pinned.Example.:443 HTTP/1.1\r\n\r\n";
    CHECK(proxy_parse_request(head, strlen(head), &rq) == 0);
    CHECK_STREQ(rq.host, "Pinned.Example");
    buf_release(&rq.forward);
    const char *bad[] = {
        "CONNECT a..test:443 HTTP/1.1\r\n\r\n", "CONNECT .a.test:443 HTTP/1.1\r\n\r\n",
        "CONNECT a.test..:443 HTTP/1.1\r\n\r\n", "GET http://a.test../ HTTP/1.1\r\n\r\n"};
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        memset(&rq, 0, sizeof(rq));
        buf_init(&rq.forward, 2 * NET_MAX_HEAD);
        CHECK(proxy_parse_request(bad[i], strlen(bad[i]), &rq) == -EINVAL);
        CHECK(strstr(err_msg(), "empty label") != NULL);
        buf_release(&rq.forward);
    }
    /* The pinned hosts file answers for the name without its dot, whichever side has it. */
    char path[] = "/tmp/runcell-test-hosts-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    const char *hosts = "192.0.2.7 pinned.example.\n198.51.100.9 other.example\n";
    CHECK(write(fd, hosts, strlen(hosts)) == (ssize_t)strlen(hosts));
    close(fd);
    setenv("RUNCELL_NET_HOSTS", path, 1);
    struct sockaddr_storage addrs[NET_MAX_ADDRS];
    size_t n = 0;
    char text[INET6_ADDRSTRLEN];
    CHECK(net_resolve("Pinned.Example", 443, addrs, &n) == 0 && n == 1);
    inet_ntop(AF_INET, &((struct sockaddr_in *)&addrs[0])->sin_addr, text, sizeof(text));
    CHECK_STREQ(text, "192.0.2.7");
    CHECK(net_resolve("other.example", 443, addrs, &n) == 0 && n == 1);
    inet_ntop(AF_INET, &((struct sockaddr_in *)&addrs[0])->sin_addr, text, sizeof(text));
    CHECK_STREQ(text, "198.51.100.9");
    unlink(path);
    /* And the policy matches the name either way. */
    struct net_policy *p = policy("pinned.example");
    CHECK(net_policy_match(p, "Pinned.Example", 443) != NULL);
    CHECK(net_policy_match(p, "pinned.example.", 443) != NULL);
    net_policy_free(p);
}

TEST(server_cap_covers_hosts_and_ports)
{
    struct net_policy *max = policy("*.corp.test,api.test:8443,10.0.0.5:80");
    const char *inside[] = {"a.corp.test",     "*.b.corp.test", "*.corp.test",
                            "a.corp.test:443", "api.test:8443", "10.0.0.5:80"};
    const char *outside[] = {"corp.test",   "api.test",         "api.test:443", "10.0.0.5",
                             "10.0.0.6:80", "a.corp.test:8080", "*.test"};
    for (size_t i = 0; i < ARRAY_SIZE(inside); i++) {
        struct net_policy *p = policy(inside[i]);
        CHECK(net_policy_within(p, max));
        net_policy_free(p);
    }
    for (size_t i = 0; i < ARRAY_SIZE(outside); i++) {
        struct net_policy *p = policy(outside[i]);
        CHECK(!net_policy_within(p, max));
        CHECK(strstr(err_msg(), "outside what this server allows") != NULL);
        net_policy_free(p);
    }
    struct net_policy *none = NULL, *p = policy("a.test");
    CHECK(net_policy_parse(NULL, 0, &none) == 0);
    CHECK(!net_policy_within(p, none));
    CHECK(net_policy_within(p, NULL));
    net_policy_free(none);
    net_policy_free(p);
    net_policy_free(max);
}

/* The internet: any name or address literal on any port passes the policy; the addresses
 * are judged as for an allowlist (only public ones); it is within no cap but the internet. */
TEST(the_internet_is_every_name_and_only_public_addresses)
{
    struct net_policy *p = net_policy_internet();
    CHECK_STREQ(rule(p, "pypi.org", 443), "internet");
    CHECK_STREQ(rule(p, "a.b.example.com.", 8080), "internet");
    CHECK_STREQ(rule(p, "93.184.215.14", 22), "internet");
    CHECK_STREQ(rule(p, "[2606:2800:21f:cb07:6820:80da:af6b:8b2c]", 443), "internet");
    CHECK_STREQ(rule(p, "bad name", 80), "none");
    CHECK(net_policy_lists_host(p, "pypi.org"));
    CHECK(allowed(p, "93.184.215.14", 443));
    const char *special[] = {
        "127.0.0.1", "169.254.169.254",        "10.0.0.1",  "192.168.0.1", "::1",
        "fd00::1",   "::ffff:169.254.169.254", "100.64.0.1"};
    for (size_t i = 0; i < ARRAY_SIZE(special); i++)
        CHECK(!allowed(p, special[i], 80));
    CHECK(!net_policy_names_loopback(p));
    struct net_policy *max = policy("*.corp.test"), *copy = net_policy_copy(p);
    CHECK(copy->internet);
    CHECK(!net_policy_within(p, max));
    CHECK(strstr(err_msg(), "public internet") != NULL);
    CHECK(net_policy_within(p, copy));
    CHECK(net_policy_within(p, NULL));
    json_t *j = net_policy_json(p);
    CHECK_STREQ(json_string_value(json_object_get(j, "mode")), "internet");
    json_decref(j);
    net_policy_free(copy);
    net_policy_free(max);
    net_policy_free(p);
}

static int parse(const char *head, struct proxy_request *rq)
{
    memset(rq, 0, sizeof(*rq));
    buf_init(&rq->forward, 2 * NET_MAX_HEAD);
    return proxy_parse_request(head, strlen(head), rq);
}

TEST(connect_requests_parse)
{
    struct proxy_request rq;
    CHECK(parse("CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\n\r\n", &rq) == 0);
    CHECK(rq.connect);
    CHECK_STREQ(rq.host, "a.test");
    CHECK(rq.port == 443);
    buf_release(&rq.forward);
    CHECK(parse("CONNECT [::1]:8443 HTTP/1.1\r\n\r\n", &rq) == 0);
    CHECK_STREQ(rq.host, "::1");
    CHECK(rq.port == 8443);
    buf_release(&rq.forward);
    CHECK(parse("CONNECT a.test HTTP/1.1\r\n\r\n", &rq) == -EINVAL);
    buf_release(&rq.forward);
    CHECK(parse("CONNECT a.test:99999 HTTP/1.1\r\n\r\n", &rq) == -EINVAL);
    buf_release(&rq.forward);
    CHECK(parse("CONNECT a\x01.test:443 HTTP/1.1\r\n\r\n", &rq) == -EINVAL);
    buf_release(&rq.forward);
}

TEST(plain_requests_are_rewritten_for_the_origin)
{
    struct proxy_request rq;
    CHECK(parse("GET http://user:pw@A.test:8080/x?y=1#frag HTTP/1.1\r\nHost: A.test:8080\r\n"
                "Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic abc\r\n"
                "Accept: */*\r\nConnection: keep-alive\r\n\r\n",
                &rq) == 0);
    CHECK(!rq.connect);
    CHECK_STREQ(rq.host, "A.test");
    CHECK(rq.port == 8080);
    CHECK_STREQ(rq.forward.data, "GET /x?y=1 HTTP/1.1\r\nHost: A.test:8080\r\nAccept: */*\r\n"
                                 "Connection: close\r\n\r\n");
    buf_release(&rq.forward);
    CHECK(parse("GET http://b.test HTTP/1.0\r\n\r\n", &rq) == 0);
    CHECK(rq.port == 80);
    CHECK_STREQ(rq.forward.data, "GET / HTTP/1.0\r\nHost: b.test\r\nConnection: close\r\n\r\n");
    buf_release(&rq.forward);
    CHECK(parse("GET https://b.test/ HTTP/1.1\r\n\r\n", &rq) == -EINVAL);
    CHECK(strstr(err_msg(), "CONNECT") != NULL);
    buf_release(&rq.forward);
    CHECK(parse("GET / HTTP/1.1\r\nHost: x\r\n\r\n", &rq) == -EINVAL);
    CHECK(strstr(err_msg(), "egress proxy") != NULL);
    buf_release(&rq.forward);
    CHECK(parse("get http://b.test/ HTTP/1.1\r\n\r\n", &rq) == -EINVAL);
    buf_release(&rq.forward);
    CHECK(parse("GET http://b.test/ SPDY/3\r\n\r\n", &rq) == -EINVAL);
    buf_release(&rq.forward);
}

/* Found by tests/fuzz/fuzz-request.c: a header line starting with a NUL was forwarded as
 * an empty line, ending the head early, so the origin read the client's further lines as a
 * second request the proxy never parsed. */
TEST(heads_with_nul_or_bare_cr_are_refused)
{
    static const char nul[] = "GET http://b.test/ HTTP/1.1\r\n\0X: 1\r\n"
                              "GET http://b.test/smuggled HTTP/1.1\r\n\r\n";
    struct proxy_request rq;
    memset(&rq, 0, sizeof(rq));
    buf_init(&rq.forward, 2 * NET_MAX_HEAD);
    CHECK(proxy_parse_request(nul, sizeof(nul) - 1, &rq) == -EINVAL);
    CHECK(strstr(err_msg(), "NUL") != NULL);
    CHECK(rq.forward.len == 0);
    buf_release(&rq.forward);
    CHECK(parse("GET http://b.test/ HTTP/1.1\r\nX: 1\rHost: c.test\r\n\r\n", &rq) == -EINVAL);
    CHECK(strstr(err_msg(), "CR") != NULL);
    buf_release(&rq.forward);
    CHECK(parse("CONNECT b.test:443\r HTTP/1.1\r\n\r\n", &rq) == -EINVAL);
    buf_release(&rq.forward);
}

int main(int argc, char **argv)
{
    return run_tests(argc, argv);
}
