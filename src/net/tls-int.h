/* tls-int.h - internals of the net module's TLS part (tls.c, intercept.c), which alone
 * include OpenSSL. */
#ifndef RUNCELL_NET_TLS_INT_H
#define RUNCELL_NET_TLS_INT_H

#include <openssl/ssl.h>

#include "net/net-int.h"

/* The reason of the last OpenSSL error of this thread (or errno's), for messages. */
void tls_reason(char *buf, size_t n);
/* A client connection over fd to host (a name: SNI and the name checked; an IP literal: the
 * address checked) that verifies the server against this host's trust store. NULL on
 * failure. The caller runs the handshake (SSL_connect) and frees it; fd stays the caller's. */
SSL *tls_upstream_new(int fd, const char *host);
/* The proxy's side of the sandbox client's TLS over fd: a certificate for host from ca
 * (minted once, then cached). NULL on failure; as tls_upstream_new otherwise (SSL_accept). */
SSL *tls_client_side_new(struct net_ca *ca, int fd, const char *host);
/* Serves one intercepted connection (net_tls_ops.serve). */
void intercept_serve(const struct ix_target *t);

#endif
