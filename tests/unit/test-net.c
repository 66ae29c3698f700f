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

/* ---- secrets ---- */

static struct net_secrets *secrets(const char *json, const char *allow)
{
    json_error_t jerr;
    json_t *j = json_loads(json, 0, &jerr);
    CHECK(j != NULL);
    struct net_policy *p = allow ? policy(allow) : NULL;
    struct net_secrets *s = NULL;
    int r = net_secrets_from_json(j, p, &s);
    json_decref(j);
    net_policy_free(p);
    return r == 0 ? s : NULL;
}

/* The error a secret gets, which must never quote its value. */
static const char *secret_error(const char *json, const char *allow)
{
    CHECK(secrets(json, allow) == NULL);
    CHECK(strstr(err_msg(), "TOPSECRET") == NULL);
    return err_msg();
}

TEST(exported_secrets_parse_back_to_the_same)
{
    struct net_secrets *s =
        secrets("[{\"host\": \"api.test\", \"header\": \"X-Key\", \"value\": \"TOPSECRET-1\", "
                "\"path_prefix\": \"/v1/\"}, {\"host\": \"db.test:8443\", \"basic\": {\"user\": "
                "\"me\", \"password\": \"pa:ss TOPSECRET-2\"}, \"allow_http\": true}]",
                "api.test,db.test:8443");
    CHECK(s != NULL && s->n == 2);
    json_t *out = net_secrets_export(s);
    struct net_policy *p = policy("api.test,db.test:8443");
    struct net_secrets *back = NULL;
    CHECK(net_secrets_from_json(out, p, &back) == 0 && back && back->n == 2);
    for (size_t i = 0; i < 2; i++) {
        CHECK(!strcmp(s->v[i].host.text, back->v[i].host.text));
        CHECK(s->v[i].kind == back->v[i].kind && s->v[i].allow_http == back->v[i].allow_http);
        CHECK(!strcmp(s->v[i].header, back->v[i].header));
        CHECK(!strcmp(s->v[i].value, back->v[i].value));
    }
    CHECK(!strcmp(back->v[0].path_prefix, "/v1/") && !back->v[1].path_prefix);
    CHECK(!strcmp(back->v[1].password, "pa:ss TOPSECRET-2"));
    net_secrets_json_wipe(out);
    CHECK(strstr(json_string_value(json_object_get(json_array_get(out, 0), "value")),
                 "TOPSECRET") == NULL);
    json_decref(out);
    net_policy_free(p);
    net_secrets_free(s);
    net_secrets_free(back);
}

TEST(secrets_parse_headers_and_basic_auth)
{
    struct net_secrets *s = secrets(
        "[{\"host\": \"API.example.test\", \"header\": \"Authorization\", \"value\": \"Bearer "
        "TOPSECRET-1\", \"path_prefix\": \"/v1/\"},"
        " {\"host\": \"*.files.test:8443\", \"basic\": {\"user\": \"me\", \"password\": "
        "\"TOPSECRET-2\"}, \"allow_http\": true}]",
        "api.example.test,*.files.test:8443");
    CHECK(s && s->n == 2);
    CHECK_STREQ(s->v[0].host.text, "api.example.test");
    CHECK_STREQ(s->v[0].header, "Authorization");
    CHECK_STREQ(s->v[0].value, "Bearer TOPSECRET-1");
    CHECK_STREQ(s->v[0].path_prefix, "/v1/");
    CHECK(!s->v[0].allow_http);
    CHECK(s->v[1].kind == NET_SECRET_BASIC);
    CHECK_STREQ(s->v[1].header, "Authorization");
    /* base64("me:TOPSECRET-2") */
    CHECK_STREQ(s->v[1].value, "Basic bWU6VE9QU0VDUkVULTI=");
    CHECK(s->v[1].allow_http);
    /* What may be shown holds no value, no user. */
    json_t *shown = net_secrets_json(s);
    char *text = json_dumps(shown, JSON_SORT_KEYS);
    CHECK_STREQ(text, "[{\"allow_http\": false, \"header\": \"Authorization\", \"host\": "
                      "\"api.example.test\", \"kind\": \"header\", \"path_prefix\": \"/v1/\"}, "
                      "{\"allow_http\": true, \"header\": \"Authorization\", \"host\": "
                      "\"*.files.test:8443\", \"kind\": \"basic\"}]");
    free(text);
    json_decref(shown);
    struct net_secrets *c = net_secrets_copy(s);
    net_secrets_free(s);
    CHECK_STREQ(c->v[1].value, "Basic bWU6VE9QU0VDUkVULTI=");
    net_secrets_free(c);
    net_secrets_free(NULL);
    json_t *none = json_null();
    CHECK(net_secrets_from_json(none, NULL, &s) == 0 && s == NULL);
    json_decref(none);
}

TEST(bad_secrets_are_refused_naming_the_field_never_the_value)
{
    const char *allow = "api.test";
    CHECK(strstr(secret_error("{}", allow), "secrets must be an array"));
    CHECK(strstr(secret_error("[1]", allow), "secrets[0] must be an object"));
    CHECK(strstr(secret_error("[{\"host\": \"api.test\", \"value\": \"TOPSECRET\"}]", allow),
                 "secrets[0] needs \"header\" and \"value\""));
    CHECK(strstr(secret_error("[{\"header\": \"X-Key\", \"value\": \"TOPSECRET\"}]", allow),
                 "secrets[0].host is missing"));
    CHECK(strstr(secret_error("[{\"host\": \"a..b\", \"header\": \"X\", \"value\": "
                              "\"TOPSECRET\"}]",
                              allow),
                 "secrets[0].host: "));
    CHECK(strstr(secret_error("[{\"host\": \"api.test\", \"header\": \"X-Key\", \"value\": "
                              "\"TOPSECRET\\r\\nX-Evil: 1\"}]",
                              allow),
                 "secrets[0].value holds a control character"));
    CHECK(strstr(secret_error("[{\"host\": \"api.test\", \"header\": \"Host\", \"value\": "
                              "\"TOPSECRET\"}]",
                              allow),
                 "secrets[0].header: a secret cannot set 'Host'"));
    CHECK(strstr(secret_error("[{\"host\": \"api.test\", \"header\": \"X Key\", \"value\": "
                              "\"TOPSECRET\"}]",
                              allow),
                 "secrets[0].header: 'X Key' is not a header name"));
    CHECK(strstr(secret_error("[{\"host\": \"api.test\", \"header\": \"X\", \"value\": "
                              "\" TOPSECRET\"}]",
                              allow),
                 "white space"));
    CHECK(strstr(secret_error("[{\"host\": \"api.test\", \"header\": \"X\", \"value\": "
                              "\"TOPSECRET\", \"vaule\": 1}]",
                              allow),
                 "secrets[0]: unknown field 'vaule'"));
    CHECK(strstr(secret_error("[{\"host\": \"api.test\", \"header\": \"X\", \"value\": "
                              "\"TOPSECRET\", \"path_prefix\": \"/v1/../admin\"}]",
                              allow),
                 "secrets[0].path_prefix"));
    CHECK(strstr(secret_error("[{\"host\": \"api.test\", \"basic\": {\"user\": \"a:b\", "
                              "\"password\": \"TOPSECRET\"}}]",
                              allow),
                 "secrets[0].basic.user cannot hold ':'"));
    CHECK(strstr(secret_error("[{\"host\": \"api.test\", \"header\": \"X\", \"value\": "
                              "\"TOPSECRET\", \"basic\": {\"user\": \"a\", \"password\": \"b\"}}]",
                              allow),
                 "either \"basic\""));
    CHECK(strstr(secret_error("[{\"host\": \"api.test\", \"header\": \"X\", \"value\": "
                              "\"TOPSECRET\", \"allow_http\": 1}]",
                              allow),
                 "secrets[0].allow_http must be true or false"));
    CHECK(strstr(
        secret_error("[{\"host\": \"api.test\", \"header\": \"X\", \"value\": \"TOPSECRET\"},"
                     " {\"host\": \"API.test\", \"header\": \"x\", \"value\": \"TOPSECRET\"}]",
                     allow),
        "secrets[1] sets the same header"));
    /* A secret does not allow its host: the allowlist must name it at its port. */
    CHECK(strstr(secret_error("[{\"host\": \"other.test\", \"header\": \"X\", \"value\": "
                              "\"TOPSECRET\"}]",
                              allow),
                 "other.test port 443 is not on the network allowlist; add 'other.test'"));
    CHECK(strstr(secret_error("[{\"host\": \"api.test:8443\", \"header\": \"X\", \"value\": "
                              "\"TOPSECRET\"}]",
                              allow),
                 "api.test:8443 port 8443 is not on the network allowlist"));
    CHECK(strstr(secret_error("[{\"host\": \"api.test\", \"header\": \"X\", \"value\": "
                              "\"TOPSECRET\"}]",
                              NULL),
                 "the session has no network"));
    /* A wildcard entry covers the names below it. */
    struct net_secrets *s =
        secrets("[{\"host\": \"a.b.test\", \"header\": \"X\", \"value\": \"v\"}]", "*.b.test");
    CHECK(s != NULL);
    net_secrets_free(s);
    char big[NET_SECRET_VALUE_MAX + 200];
    snprintf(big, sizeof(big), "[{\"host\": \"api.test\", \"header\": \"X\", \"value\": \"%0*d\"}]",
             NET_SECRET_VALUE_MAX + 1, 0);
    CHECK(strstr(secret_error(big, allow), "at most 8192"));
    struct buf many;
    buf_init(&many, 0);
    buf_printf(&many, "[");
    for (int i = 0; i <= NET_MAX_SECRETS; i++)
        buf_printf(&many, "%s{\"host\": \"api.test\", \"header\": \"X-%d\", \"value\": \"v\"}",
                   i ? "," : "", i);
    buf_printf(&many, "]");
    CHECK(strstr(secret_error(many.data, allow), "at most 64 secrets"));
    buf_release(&many);
}

static const char *chosen(const struct net_secrets *s, const char *host, uint16_t port, bool tls,
                          const char *path)
{
    static char out[256];
    const struct net_secret *v[8];
    size_t n = net_secrets_select(s, host, port, tls, path, strlen(path), v, 8);
    out[0] = '\0';
    for (size_t i = 0; i < n; i++)
        snprintf(out + strlen(out), sizeof(out) - strlen(out), "%s%s=%s", i ? "," : "",
                 v[i]->header, v[i]->value);
    return n ? out : "none";
}

TEST(a_request_gets_the_secrets_of_its_host_port_and_path)
{
    struct net_secrets *s = secrets(
        "[{\"host\": \"api.test\", \"header\": \"Authorization\", \"value\": \"A\"},"
        " {\"host\": \"api.test\", \"header\": \"Authorization\", \"value\": \"B\", "
        "\"path_prefix\": \"/v2/\"},"
        " {\"host\": \"api.test\", \"header\": \"X-Org\", \"value\": \"O\", \"path_prefix\": "
        "\"/v2/\"},"
        " {\"host\": \"*.cdn.test\", \"header\": \"X-Key\", \"value\": \"K\", \"allow_http\": "
        "true},"
        " {\"host\": \"alt.test:8443\", \"header\": \"X-Key\", \"value\": \"P\"}]",
        "api.test,*.cdn.test,alt.test:8443");
    CHECK(s != NULL);
    CHECK_STREQ(chosen(s, "api.test", 443, true, "/v1/x"), "Authorization=A");
    CHECK_STREQ(chosen(s, "API.test.", 443, true, "/v2/x?q=1"), "Authorization=B,X-Org=O");
    CHECK_STREQ(chosen(s, "api.test", 8443, true, "/v1/x"), "none");
    /* Plain HTTP only with allow_http. */
    CHECK_STREQ(chosen(s, "api.test", 80, false, "/v1/x"), "none");
    CHECK_STREQ(chosen(s, "a.cdn.test", 80, false, "/"), "X-Key=K");
    CHECK_STREQ(chosen(s, "a.cdn.test", 443, true, "/"), "X-Key=K");
    CHECK_STREQ(chosen(s, "cdn.test", 443, true, "/"), "none");
    CHECK_STREQ(chosen(s, "alt.test", 8443, true, "/"), "X-Key=P");
    CHECK_STREQ(chosen(s, "alt.test", 443, true, "/"), "none");
    /* A name that resolves to the same place is another name; an address is not a name. */
    CHECK_STREQ(chosen(s, "api.test.evil", 443, true, "/"), "none");
    CHECK_STREQ(chosen(s, "127.0.0.1", 443, true, "/"), "none");
    /* A path that climbs out of the prefix (as servers resolve it) gets no prefixed secret. */
    CHECK_STREQ(chosen(s, "api.test", 443, true, "/v2/../admin"), "Authorization=A");
    CHECK_STREQ(chosen(s, "api.test", 443, true, "/v2/%2e%2E/admin"), "Authorization=A");
    CHECK_STREQ(chosen(s, "api.test", 443, true, "/v2/..%2fadmin"), "Authorization=A");
    CHECK_STREQ(chosen(s, "api.test", 443, true, "/v2/.\\admin"), "Authorization=A");
    CHECK_STREQ(chosen(s, "api.test", 443, true, "/v2/a..b/c"), "Authorization=B,X-Org=O");
    CHECK_STREQ(chosen(s, "api.test", 443, true, "/v2"), "Authorization=A");
    CHECK(net_secrets_for_host(s, "api.test", 443, true));
    CHECK(!net_secrets_for_host(s, "api.test", 80, false));
    CHECK(net_secrets_for_host(s, "x.cdn.test", 80, false));
    net_secrets_free(s);
}

TEST(secret_values_are_masked_in_text_and_wiped_from_json)
{
    const char *json = "[{\"host\": \"api.test\", \"header\": \"Authorization\", \"value\": "
                       "\"Bearer tok-0123456789\"}, {\"host\": \"api.test\", \"basic\": {\"user\": "
                       "\"u\", \"password\": \"pass-0123456789\"}, \"path_prefix\": \"/b/\"}]";
    json_t *j = json_loads(json, 0, NULL);
    struct net_policy *p = policy("api.test");
    struct net_secrets *s = NULL;
    CHECK(net_secrets_from_json(j, p, &s) == 0);
    char text[] = "got Bearer tok-0123456789 and tok-0123456789 and pass-0123456789 and "
                  "dTpwYXNzLTAxMjM0NTY3ODk=, not tok-01234";
    CHECK(net_secrets_scrub(s, text, strlen(text)) == 4);
    CHECK_STREQ(text, "got ********************* and ************** and *************** and "
                      "************************, not tok-01234");
    net_secrets_json_wipe(j);
    const char *v = json_string_value(json_object_get(json_array_get(j, 0), "value"));
    CHECK(v[0] == '\0' && v[5] == '\0');
    v = json_string_value(
        json_object_get(json_object_get(json_array_get(j, 1), "basic"), "password"));
    CHECK(v[0] == '\0');
    json_decref(j);
    net_secrets_free(s);
    net_policy_free(p);
}

/* Applies change (JSON) to rules allow + secrets_json; returns the result as text, or
 * "error: MESSAGE". */
static char *changed(const char *allow, const char *secrets_json, const char *change,
                     const char *max)
{
    struct net_policy *p = policy(allow), *m = max ? policy(max) : NULL, *np = NULL;
    struct net_secrets *s = secrets_json ? secrets(secrets_json, allow) : NULL, *ns = NULL;
    json_t *c = json_loads(change, 0, NULL);
    CHECK(c != NULL);
    p->max_connections = 7;
    char *out;
    if (net_rules_change(p, s, c, m, &np, &ns) == 0) {
        json_t *j = net_policy_json(np);
        json_object_set_new(j, "secrets", net_secrets_json(ns));
        CHECK(json_integer_value(json_object_get(j, "max_connections")) == 7);
        json_object_del(j, "max_connections");
        json_object_del(j, "max_bytes");
        out = json_dumps(j, JSON_SORT_KEYS | JSON_COMPACT);
        json_decref(j);
    } else {
        out = xasprintf("error: %s", err_msg());
    }
    json_decref(c);
    net_policy_free(p);
    net_policy_free(m);
    net_policy_free(np);
    net_secrets_free(s);
    net_secrets_free(ns);
    return out;
}

#define CHECK_CHANGE(allow, secrets_json, change, max, want)                                       \
    do {                                                                                           \
        char *got_ = changed(allow, secrets_json, change, max);                                    \
        if (strncmp(got_, want, strlen(want))) {                                                   \
            fprintf(stderr, "%s:%d: got %s\n  want %s\n", __FILE__, __LINE__, got_, want);         \
            exit(1);                                                                               \
        }                                                                                          \
        free(got_);                                                                                \
    } while (0)

/* "internet" turns the public internet on and off (E2B's updateNetwork, through
 * session_network_replace); the server's cap refuses it unless it is the internet. */
TEST(a_change_turns_the_internet_on_and_off)
{
    CHECK_CHANGE("a.test", NULL, "{\"allow\": [], \"internet\": true}", NULL,
                 "{\"mode\":\"internet\",\"secrets\":[]}");
    CHECK_CHANGE("a.test", NULL, "{\"internet\": true}", "a.test",
                 "error: the public internet is wider");
    CHECK_CHANGE("a.test", NULL, "{\"internet\": \"yes\"}", NULL, "error: internet: true or false");
    CHECK_CHANGE("a.test", NULL, "{\"allow_add\": [\"b.test\"]}", NULL, "{\"allow\":[\"a.test\",");
    struct net_policy *inet = net_policy_internet(), *np = NULL;
    struct net_secrets *ns = NULL;
    json_t *c = json_pack("{s:[s],s:b}", "allow", "b.test", "internet", 0);
    CHECK(net_rules_change(inet, NULL, c, NULL, &np, &ns) == 0);
    CHECK(!np->internet && np->n == 1 && ns == NULL);
    net_policy_free(np);
    json_decref(c);
    c = json_pack("{s:[s]}", "allow_add", "b.test"); /* without "internet": kept as it was */
    CHECK(net_rules_change(inet, NULL, c, NULL, &np, &ns) == 0);
    CHECK(np->internet);
    net_policy_free(np);
    json_decref(c);
    net_policy_free(inet);
}

TEST(a_running_sessions_rules_change_as_asked)
{
    const char *one = "[{\"host\": \"a.test\", \"header\": \"X\", \"value\": \"v\"}]";
    CHECK_CHANGE("a.test", NULL, "{\"allow_add\": [\"b.test:8443\"]}", NULL,
                 "{\"allow\":[\"a.test\",\"b.test:8443\"],\"mode\":\"allowlist\",\"secrets\":[]}");
    CHECK_CHANGE("a.test,b.test", NULL, "{\"allow_remove\": [\"B.test\"]}", NULL,
                 "{\"allow\":[\"a.test\"],");
    CHECK_CHANGE("a.test", NULL, "{\"allow\": []}", NULL, "{\"allow\":[],");
    CHECK_CHANGE("a.test", NULL,
                 "{\"secrets_add\": [{\"host\": \"a.test\", \"header\": \"X\", \"value\": \"v\"}]}",
                 NULL,
                 "{\"allow\":[\"a.test\"],\"mode\":\"allowlist\",\"secrets\":[{\"allow_http\":"
                 "false,\"header\":\"X\",\"host\":\"a.test\",\"kind\":\"header\"}]}");
    CHECK_CHANGE("a.test", one, "{\"secrets_remove\": [{\"host\": \"a.test\"}]}", NULL,
                 "{\"allow\":[\"a.test\"],\"mode\":\"allowlist\",\"secrets\":[]}");
    CHECK_CHANGE("a.test", one, "{\"secrets\": []}", NULL, "{\"allow\":[\"a.test\"],");
    CHECK_CHANGE("a.test", one, "{\"secrets_remove\": [{\"host\": \"a.test\", \"header\": \"Y\"}]}",
                 NULL, "error: secrets_remove[0]: no secret for a.test with header Y matches");
    CHECK_CHANGE("a.test", NULL, "{\"allow_remove\": [\"c.test\"]}", NULL,
                 "error: allow_remove[0]: 'c.test' is not on the allowlist");
    /* Removing the host of a secret leaves the secret with nowhere to go: refused. */
    CHECK_CHANGE("a.test,b.test", one, "{\"allow_remove\": [\"a.test\"]}", NULL,
                 "error: secret for a.test: a.test port 443 is not on the network allowlist");
    CHECK_CHANGE("a.test", NULL, "{\"allow_add\": [\"c.test\"]}", "a.test,b.test",
                 "error: network allowlist entry 'c.test' is outside what this server allows");
    CHECK_CHANGE("a.test", NULL, "{\"allow\": [\"b.test\"], \"allow_add\": [\"c.test\"]}", NULL,
                 "error: give either \"allow\"");
    CHECK_CHANGE("a.test", NULL, "{\"allowed\": []}", NULL,
                 "error: network change: unknown field 'allowed'");
    CHECK_CHANGE("a.test", NULL, "[]", NULL, "error: a network change is an object");
    CHECK_CHANGE("a.test", NULL, "{\"allow_add\": [\"a..b\"]}", NULL,
                 "error: network allowlist entry 'a..b'");
}

/* ---- requests inside an intercepted connection ---- */

static int h1(const char *head, struct h1_request *rq)
{
    return h1_parse_head(head, strlen(head), "api.test", 443, true, rq);
}

TEST(intercepted_requests_parse_strictly)
{
    struct h1_request rq;
    CHECK(h1("POST /v1/x?q=1 HTTP/1.1\r\nHost: API.test\r\nContent-Length: 5\r\n"
             "Authorization: Bearer mine\r\n\r\n",
             &rq) == 0);
    CHECK_STREQ(rq.method, "POST");
    CHECK(rq.path_len == 9 && !memcmp(rq.path, "/v1/x?q=1", 9));
    CHECK(rq.has_length && rq.content_length == 5 && !rq.chunked && !rq.close);
    CHECK(rq.n_headers == 3);
    CHECK(h1("GET https://api.test:443/a HTTP/1.1\r\nHost: api.test:443\r\n\r\n", &rq) == 0);
    CHECK(rq.path_len == 2 && !memcmp(rq.path, "/a", 2));
    CHECK(h1("GET / HTTP/1.0\r\n\r\n", &rq) == 0 && rq.close);
    CHECK(h1("GET / HTTP/1.1\r\nHost: api.test\r\nConnection: Keep-Alive, close\r\n\r\n", &rq) ==
              0 &&
          rq.close);
    CHECK(h1("GET /ws HTTP/1.1\r\nHost: api.test\r\nUpgrade: websocket\r\n\r\n", &rq) == 0 &&
          rq.upgrade);
    CHECK(h1("PUT / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: Chunked\r\n\r\n", &rq) == 0 &&
          rq.chunked);
    /* Smuggling patterns and what could make the proxy and the server disagree. */
    static const struct {
        const char *head;
        int status;
        const char *why;
    } bad[] = {
        {"GET / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 5\r\nTransfer-Encoding: "
         "chunked\r\n\r\n",
         400, "both Content-Length and Transfer-Encoding"},
        {"GET / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", 400,
         "more than one Content-Length"},
        {"GET / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 5, 5\r\n\r\n", 400, "not a number"},
        {"GET / HTTP/1.1\r\nHost: api.test\r\nContent-Length: +5\r\n\r\n", 400, "not a number"},
        {"GET / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501,
         "only one"},
        {"GET / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: "
         "chunked\r\n\r\n",
         400, "more than one Transfer-Encoding"},
        {"GET / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "HTTP/1.0"},
        {"GET / HTTP/1.1\r\nHost: api.test\r\nX-A: 1\r\n  folded\r\n\r\n", 400, "obs-fold"},
        {"GET / HTTP/1.1\r\nHost: api.test\r\nContent-Length : 5\r\n\r\n", 400, "white space"},
        {"GET / HTTP/1.1\nHost: api.test\r\n\r\n", 400, "bare LF"},
        {"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n", 421, "another host"},
        {"GET / HTTP/1.1\r\nHost: api.test:8443\r\n\r\n", 421, "another host"},
        {"GET / HTTP/1.1\r\nHost: api.test\r\nHost: other.test\r\n\r\n", 400, "more than one Host"},
        {"GET / HTTP/1.1\r\n\r\n", 400, "no Host header"},
        {"GET https://other.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n", 421, "another host"},
        {"GET https://u:p@api.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n", 400, "credentials"},
        {"CONNECT other.test:443 HTTP/1.1\r\nHost: api.test\r\n\r\n", 400, "CONNECT inside"},
        {"GET / HTTP/2.0\r\nHost: api.test\r\n\r\n", 400, "HTTP/1.1"},
        {"GET /a b HTTP/1.1\r\nHost: api.test\r\n\r\n", 400, "HTTP/1.1"},
        {"GET /\x7f HTTP/1.1\r\nHost: api.test\r\n\r\n", 400, "URL cannot have"},
        {"GET / HTTP/1.1\r\nHost: api.test\r\nX: a\x01b\r\n\r\n", 400, "control character"},
        {"GET http://api.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n", 400, "neither a path"},
    };
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        int st = h1(bad[i].head, &rq);
        if (st != bad[i].status || !strstr(err_msg(), bad[i].why)) {
            fprintf(stderr, "case %zu: %d %s\n", i, st, err_msg());
            CHECK(0);
        }
    }
    struct buf many;
    buf_init(&many, 0);
    buf_printf(&many, "GET / HTTP/1.1\r\nHost: api.test\r\n");
    for (int i = 0; i < H1_MAX_HEADERS; i++)
        buf_printf(&many, "X-%d: 1\r\n", i);
    buf_printf(&many, "\r\n");
    CHECK(h1(many.data, &rq) == 431);
    buf_release(&many);
    /* Plain HTTP: the first request is in absolute form, to the host it was allowed for. */
    const char *plain = "GET http://api.test/x HTTP/1.1\r\nHost: api.test\r\n\r\n";
    CHECK(h1_parse_head(plain, strlen(plain), "api.test", 80, false, &rq) == 0);
    plain = "GET /x HTTP/1.1\r\nHost: api.test\r\n\r\n";
    CHECK(h1_parse_head(plain, strlen(plain), "api.test", 80, false, &rq) == 400);
}

TEST(the_head_sent_upstream_carries_the_secret_in_place_of_the_clients)
{
    struct net_secrets *s = secrets("[{\"host\": \"api.test\", \"header\": \"Authorization\", "
                                    "\"value\": \"Bearer real\"}]",
                                    "api.test");
    const struct net_secret *sel[] = {&s->v[0]};
    struct h1_request rq;
    CHECK(h1("GET https://api.test/v1 HTTP/1.1\r\nHost: api.test\r\nauthorization: Bearer fake\r\n"
             "Proxy-Authorization: Basic x\r\nAuthorization: Bearer fake2\r\nAccept: */*\r\n"
             "Connection: keep-alive\r\n\r\n",
             &rq) == 0);
    struct buf out;
    buf_init(&out, 0);
    h1_build_head(&rq, sel, 1, false, &out);
    CHECK_STREQ(out.data, "GET /v1 HTTP/1.1\r\nHost: api.test\r\nAccept: */*\r\nConnection: "
                          "keep-alive\r\nAuthorization: Bearer real\r\n\r\n");
    buf_reset(&out);
    h1_build_head(&rq, NULL, 0, true, &out);
    CHECK_STREQ(out.data,
                "GET /v1 HTTP/1.1\r\nHost: api.test\r\nauthorization: Bearer fake\r\n"
                "Authorization: Bearer fake2\r\nAccept: */*\r\nConnection: close\r\n\r\n");
    buf_release(&out);
    net_secrets_free(s);
}

/* Feeds body bytes one at a time (the hardest split); returns how many belonged to it, or -1. */
static ssize_t body_len(const char *head, const char *data, size_t n)
{
    struct h1_request rq;
    struct h1_body b;
    CHECK(h1(head, &rq) == 0);
    h1_body_init(&b, &rq);
    size_t used = 0;
    for (size_t i = 0; i < n && b.state != H1_BODY_DONE; i++) {
        ssize_t k = h1_body_feed(&b, data + i, 1);
        if (k < 0)
            return -1;
        used += (size_t)k;
    }
    return b.state == H1_BODY_DONE ? (ssize_t)used : -2;
}

TEST(request_bodies_end_where_their_framing_says)
{
    const char *len5 = "POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 5\r\n\r\n";
    const char *chunked = "POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n";
    const char *none = "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n";
    CHECK(body_len(len5, "helloGET /next", 14) == 5);
    CHECK(body_len(none, "GET /next", 9) == 0);
    const char *ok = "5;ext=1\r\nhello\r\nA\r\n0123456789\r\n0\r\n\r\nGET /next";
    CHECK(body_len(chunked, ok, strlen(ok)) == (ssize_t)strlen(ok) - 9);
    /* Chunks that could be read two ways are refused. */
    const char *bad[] = {"5\r\nhelloXX0\r\n\r\n",
                         "5\nhello\r\n0\r\n\r\n",
                         "g\r\n",
                         "\r\n",
                         "0\r\nX-Trailer: 1\r\n\r\n",
                         "-1\r\n",
                         "5 \r\nhello\r\n",
                         "ffffffffffffffffff\r\n"};
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++)
        CHECK(body_len(chunked, bad[i], strlen(bad[i])) == -1);
    /* Whole buffers at once, as the proxy feeds them. */
    struct h1_request rq;
    struct h1_body b;
    CHECK(h1(chunked, &rq) == 0);
    h1_body_init(&b, &rq);
    CHECK(h1_body_feed(&b, ok, strlen(ok)) == (ssize_t)strlen(ok) - 9 && b.state == H1_BODY_DONE);
}

/* ---- the TLS part ---- */

TEST(a_proxy_makes_a_ca_of_its_own_and_writes_only_its_certificate)
{
    char dir[] = "/tmp/test-net-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char *sub = xasprintf("%s/egress", dir);
    net_tls_enable();
    struct net_policy *p = policy("api.test");
    struct net_secrets *s =
        secrets("[{\"host\": \"api.test\", \"header\": \"X-Key\", \"value\": \"TOPSECRET-1\"}]",
                "api.test");
    struct egress *e1 = NULL, *e2 = NULL;
    CHECK(egress_new(sub, p, s, NULL, NULL, &e1) == 0);
    CHECK(egress_has_ca(e1));
    char *ca_path = xasprintf("%s/%s", sub, NET_CA_NAME);
    char *bundle_path = xasprintf("%s/%s", sub, NET_BUNDLE_NAME);
    char *ca = NULL, *bundle = NULL;
    size_t ca_len, bundle_len;
    CHECK(read_file(ca_path, 1 << 20, &ca, &ca_len) == 0);
    CHECK(read_file(bundle_path, 32 << 20, &bundle, &bundle_len) == 0);
    CHECK(strstr(ca, "-----BEGIN CERTIFICATE-----") == ca);
    CHECK(strstr(bundle, ca) != NULL);
    CHECK(!strstr(ca, "PRIVATE KEY") && !strstr(bundle, "PRIVATE KEY"));
    /* The directory holds the socket and the two certificates, nothing else. */
    char *cmd = xasprintf("test \"$(ls %s | tr '\\n' ' ')\" = '%s %s %s '", sub, NET_BUNDLE_NAME,
                          NET_CA_NAME, NET_SOCKET_NAME);
    CHECK(system(cmd) == 0);
    /* The rules show no value; a change applies. */
    json_t *rules = egress_rules_json(e1);
    char *text = json_dumps(rules, 0);
    CHECK(strstr(text, "X-Key") && !strstr(text, "TOPSECRET"));
    free(text);
    json_decref(rules);
    json_t *change = json_loads("{\"secrets_remove\": [{\"host\": \"api.test\"}]}", 0, NULL);
    CHECK(egress_change(e1, change, NULL) == 0);
    json_decref(change);
    rules = egress_rules_json(e1);
    CHECK(json_array_size(json_object_get(rules, "secrets")) == 0);
    json_decref(rules);
    /* A second proxy has a CA of its own. */
    char *sub2 = xasprintf("%s/egress2", dir), *ca2_path = xasprintf("%s/%s", sub2, NET_CA_NAME);
    char *ca2 = NULL;
    CHECK(egress_new(sub2, p, NULL, NULL, NULL, &e2) == 0);
    CHECK(read_file(ca2_path, 1 << 20, &ca2, &ca_len) == 0);
    CHECK(strcmp(ca, ca2) != 0);
    egress_free(e1);
    egress_free(e2);
    CHECK(access(sub, F_OK) < 0 && access(sub2, F_OK) < 0);
    rmdir(dir);
    free(ca);
    free(ca2);
    free(bundle);
    free(cmd);
    free(ca_path);
    free(ca2_path);
    free(bundle_path);
    free(sub);
    free(sub2);
    net_secrets_free(s);
    net_policy_free(p);
}

int main(int argc, char **argv)
{
    return run_tests(argc, argv);
}
