/* tls.c - the egress proxy's TLS, with OpenSSL: a CA per proxy (its key in this process's
 * memory only), leaf certificates minted for the hosts it intercepts (cached, capped), and
 * the client context that checks upstream servers against this host's trust store. */
#include "net/tls-int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define LEAF_CACHE      64 /* hosts whose certificates a proxy keeps */
#define CA_VALID_S      (365L * 24 * 3600)
#define CLOCK_SKEW_S    3600L /* certificates are valid from an hour back */
#define ALPN_HTTP11     "\x08http/1.1"
#define ALPN_HTTP11_LEN 9

struct leaf {
    char host[256];
    X509 *cert;
};

struct net_ca {
    EVP_PKEY *key;      /* the CA's */
    X509 *cert;         /* self-signed */
    EVP_PKEY *leaf_key; /* one key for every leaf of this CA */
    char *pem;
    SSL_CTX *server;      /* the side the sandbox's clients talk to */
    pthread_mutex_t lock; /* guards the cache */
    struct leaf cache[LEAF_CACHE];
    size_t n, next;
};

void tls_reason(char *buf, size_t n)
{
    unsigned long e = ERR_peek_last_error();
    if (!e) {
        snprintf(buf, n, "%s", errno ? strerror(errno) : "the connection ended");
        return;
    }
    const char *reason = ERR_reason_error_string(e);
    snprintf(buf, n, "%s", reason ? reason : "TLS error");
}

/* ---- certificates ---- */

static int set_serial(X509 *x)
{
    unsigned char raw[16];
    if (RAND_bytes(raw, sizeof(raw)) != 1)
        return -1;
    raw[0] &= 0x7f; /* positive */
    raw[0] |= 0x01; /* and of full length */
    BIGNUM *bn = BN_bin2bn(raw, sizeof(raw), NULL);
    int ok = bn && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x)) != NULL;
    BN_free(bn);
    return ok ? 0 : -1;
}

static int add_ext(X509 *x, X509 *issuer, int nid, const char *value)
{
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer, x, NULL, NULL, 0);
    X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
    if (!ext)
        return -1;
    int ok = X509_add_ext(x, ext, -1);
    X509_EXTENSION_free(ext);
    return ok ? 0 : -1;
}

/* A certificate for key with subject name (CN), valid until not_after, not yet signed. */
static X509 *cert_new(EVP_PKEY *key, const char *cn, time_t not_after)
{
    X509 *x = X509_new();
    if (!x || !X509_set_version(x, 2) || set_serial(x) < 0 ||
        !X509_gmtime_adj(X509_getm_notBefore(x), -CLOCK_SKEW_S) ||
        !X509_time_adj_ex(X509_getm_notAfter(x), 0, 0, &not_after) || !X509_set_pubkey(x, key))
        goto fail;
    X509_NAME *name = X509_get_subject_name(x);
    if (!X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, (const unsigned char *)"runcell", -1,
                                    -1, 0))
        goto fail;
    /* A CN is at most 64 characters; longer names live in the subjectAltName alone. */
    if (strlen(cn) <= 64 &&
        !X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0))
        goto fail;
    return x;
fail:
    X509_free(x);
    return NULL;
}

/* subjectAltName of one DNS name or IP address, built as a structure (never parsed from a
 * string the client's host name would be part of). */
static int add_san(X509 *x, const char *host)
{
    GENERAL_NAMES *names = sk_GENERAL_NAME_new_null();
    GENERAL_NAME *gn = GENERAL_NAME_new();
    ASN1_OCTET_STRING *ip = a2i_IPADDRESS(host);
    int ok = 0;
    if (!names || !gn)
        goto out;
    if (ip) {
        GENERAL_NAME_set0_value(gn, GEN_IPADD, ip);
        ip = NULL;
    } else {
        ASN1_IA5STRING *dns = ASN1_IA5STRING_new();
        if (!dns || !ASN1_STRING_set(dns, host, (int)strlen(host))) {
            ASN1_IA5STRING_free(dns);
            goto out;
        }
        GENERAL_NAME_set0_value(gn, GEN_DNS, dns);
    }
    if (!sk_GENERAL_NAME_push(names, gn))
        goto out;
    gn = NULL;
    ok = X509_add1_ext_i2d(x, NID_subject_alt_name, names, 0, 0);
out:
    ASN1_OCTET_STRING_free(ip);
    GENERAL_NAME_free(gn);
    GENERAL_NAMES_free(names);
    return ok == 1 ? 0 : -1;
}

static char *cert_pem(X509 *x)
{
    BIO *b = BIO_new(BIO_s_mem());
    char *out = NULL, *data;
    if (b && PEM_write_bio_X509(b, x)) {
        long n = BIO_get_mem_data(b, &data);
        out = xstrndup(data, (size_t)n);
    }
    BIO_free(b);
    return out;
}

static int ca_cert(struct net_ca *ca)
{
    char cn[64], id[9];
    unsigned char raw[4];
    if (RAND_bytes(raw, sizeof(raw)) != 1)
        return -1;
    snprintf(id, sizeof(id), "%02x%02x%02x%02x", raw[0], raw[1], raw[2], raw[3]);
    snprintf(cn, sizeof(cn), "runcell session CA %s", id);
    ca->cert = cert_new(ca->key, cn, time(NULL) + CA_VALID_S);
    if (!ca->cert || !X509_set_issuer_name(ca->cert, X509_get_subject_name(ca->cert)) ||
        add_ext(ca->cert, ca->cert, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") < 0 ||
        add_ext(ca->cert, ca->cert, NID_key_usage, "critical,keyCertSign,cRLSign") < 0 ||
        add_ext(ca->cert, ca->cert, NID_subject_key_identifier, "hash") < 0 ||
        !X509_sign(ca->cert, ca->key, EVP_sha256()))
        return -1;
    ca->pem = cert_pem(ca->cert);
    return ca->pem ? 0 : -1;
}

static X509 *leaf_mint(struct net_ca *ca, const char *host)
{
    time_t until = 0;
    struct tm tm;
    if (ASN1_TIME_to_tm(X509_get0_notAfter(ca->cert), &tm))
        until = timegm(&tm);
    X509 *x = cert_new(ca->leaf_key, host, until);
    if (!x || !X509_set_issuer_name(x, X509_get_subject_name(ca->cert)) ||
        add_ext(x, ca->cert, NID_basic_constraints, "critical,CA:FALSE") < 0 ||
        add_ext(x, ca->cert, NID_key_usage, "critical,digitalSignature") < 0 ||
        add_ext(x, ca->cert, NID_ext_key_usage, "serverAuth") < 0 ||
        add_ext(x, ca->cert, NID_subject_key_identifier, "hash") < 0 ||
        add_ext(x, ca->cert, NID_authority_key_identifier, "keyid:always") < 0 ||
        add_san(x, host) < 0 || !X509_sign(x, ca->key, EVP_sha256())) {
        X509_free(x);
        return NULL;
    }
    return x;
}

/* ---- contexts ---- */

static int select_http11(SSL *ssl, const unsigned char **out, unsigned char *out_len,
                         const unsigned char *in, unsigned in_len, void *arg)
{
    (void)ssl;
    (void)arg;
    /* HTTP/1.1 only: the proxy reads each request, which it does not for HTTP/2. A client
     * that offers no http/1.1 gets no ALPN answer, and speaks HTTP/1.1 all the same. */
    for (unsigned i = 0; i < in_len; i += 1u + in[i])
        if (in[i] == 8 && i + 9 <= in_len && !memcmp(in + i + 1, "http/1.1", 8)) {
            *out = in + i + 1;
            *out_len = 8;
            return SSL_TLSEXT_ERR_OK;
        }
    return SSL_TLSEXT_ERR_NOACK;
}

static SSL_CTX *server_ctx(void)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx)
        return NULL;
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
    /* A record without data (a key update) returns to the proxy's loop instead of waiting
     * for data that may never come while the other direction has some. */
    SSL_CTX_clear_mode(ctx, SSL_MODE_AUTO_RETRY);
    SSL_CTX_set_alpn_select_cb(ctx, select_http11, NULL);
    return ctx;
}

static SSL_CTX *client;
static pthread_once_t client_once = PTHREAD_ONCE_INIT;

/* The upstream side: this host's trust store (OpenSSL's default paths, or SSL_CERT_FILE and
 * SSL_CERT_DIR in runcell's environment), the peer's certificate required. */
static void client_init(void)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx)
        return;
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    /* A session ticket after the handshake returns to the proxy's loop (see server_ctx). */
    SSL_CTX_clear_mode(ctx, SSL_MODE_AUTO_RETRY);
    if (!SSL_CTX_set_default_verify_paths(ctx) ||
        SSL_CTX_set_alpn_protos(ctx, (const unsigned char *)ALPN_HTTP11, ALPN_HTTP11_LEN)) {
        SSL_CTX_free(ctx);
        return;
    }
    client = ctx;
}

SSL *tls_upstream_new(int fd, const char *host)
{
    pthread_once(&client_once, client_init);
    if (!client)
        return NULL;
    SSL *ssl = SSL_new(client);
    if (!ssl)
        return NULL;
    unsigned char addr[16];
    bool is_ip = inet_pton(AF_INET, host, addr) == 1 || inet_pton(AF_INET6, host, addr) == 1;
    X509_VERIFY_PARAM *vp = SSL_get0_param(ssl);
    X509_VERIFY_PARAM_set_hostflags(vp, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    bool ok = SSL_set_fd(ssl, fd) &&
              (is_ip ? X509_VERIFY_PARAM_set1_ip_asc(vp, host)
                     : SSL_set_tlsext_host_name(ssl, host) && SSL_set1_host(ssl, host));
    if (!ok) {
        SSL_free(ssl);
        return NULL;
    }
    SSL_set_connect_state(ssl);
    return ssl;
}

SSL *tls_client_side_new(struct net_ca *ca, int fd, const char *host)
{
    X509 *cert = NULL;
    pthread_mutex_lock(&ca->lock);
    for (size_t i = 0; i < ca->n && !cert; i++)
        if (!strcasecmp(ca->cache[i].host, host))
            cert = ca->cache[i].cert;
    if (!cert && (cert = leaf_mint(ca, host))) {
        struct leaf *slot;
        if (ca->n < LEAF_CACHE) {
            slot = &ca->cache[ca->n++];
        } else {
            /* The oldest goes; a connection using it holds a reference of its own. */
            slot = &ca->cache[ca->next];
            ca->next = (ca->next + 1) % LEAF_CACHE;
            X509_free(slot->cert);
        }
        snprintf(slot->host, sizeof(slot->host), "%s", host);
        slot->cert = cert;
    }
    SSL *ssl = cert ? SSL_new(ca->server) : NULL;
    bool ok = ssl && SSL_use_certificate(ssl, cert) && SSL_use_PrivateKey(ssl, ca->leaf_key) &&
              SSL_set_fd(ssl, fd);
    pthread_mutex_unlock(&ca->lock);
    if (!ok) {
        SSL_free(ssl);
        return NULL;
    }
    SSL_set_accept_state(ssl);
    return ssl;
}

/* ---- a CA per proxy ---- */

static void ca_free(struct net_ca *ca)
{
    if (!ca)
        return;
    for (size_t i = 0; i < ca->n; i++)
        X509_free(ca->cache[i].cert);
    SSL_CTX_free(ca->server);
    X509_free(ca->cert);
    EVP_PKEY_free(ca->key);
    EVP_PKEY_free(ca->leaf_key);
    free(ca->pem);
    pthread_mutex_destroy(&ca->lock);
    free(ca);
}

static int ca_new(struct net_ca **ret)
{
    struct net_ca *ca = xcalloc(1, sizeof(*ca));
    pthread_mutex_init(&ca->lock, NULL);
    ERR_clear_error();
    ca->key = EVP_EC_gen("P-256");
    ca->leaf_key = EVP_EC_gen("P-256");
    if (!ca->key || !ca->leaf_key || ca_cert(ca) < 0 || !(ca->server = server_ctx())) {
        char why[128];
        tls_reason(why, sizeof(why));
        ca_free(ca);
        return err_set(EIO, "cannot make the session's CA for its egress proxy: %s", why);
    }
    *ret = ca;
    return 0;
}

static const char *ca_pem(const struct net_ca *ca)
{
    return ca->pem;
}

static const struct net_tls_ops ops = {
    .ca_new = ca_new,
    .ca_free = ca_free,
    .ca_pem = ca_pem,
    .serve = intercept_serve,
};

void net_tls_enable(void)
{
    net_tls = &ops;
}
