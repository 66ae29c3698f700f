"""tlslab - a network namespace of the test's own with TLS and plain HTTP servers on their own
loopback addresses, for the tests of secrets the egress proxy adds (stdlib and Debian's
openssl command only).

    enter_own_netns()             # in setUpModule, before any thread starts
    ca = TestCA()                 # a CA of the test's own, made with openssl
    srv = RecordingServer("127.0.0.2", 443, ca.issue("api.test"))
    ...; srv.requests             # what the server received: method, path, headers, body

The servers record every request they read, so a test can tell what reached which host;
nothing leaves the namespace (it has only its loopback).
"""
import ctypes
import http.server
import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading

CLONE_NEWNET = 0x40000000


def enter_own_netns():
    """Moves this process (and what it starts from now on) into a new network namespace with
    only a loopback, which is brought up: servers can take any 127.x address and any port,
    and no test traffic can leave. Needs root; call before any thread starts."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)


def netns_missing():
    """Why enter_own_netns cannot work here, or None."""
    if os.geteuid() != 0:
        return "needs root (a network namespace of its own)"
    if not shutil.which("ip") or not shutil.which("openssl"):
        return "needs the ip and openssl commands"
    return None


class TestCA:
    """A certificate authority of the test's own, made with openssl, in a temporary directory
    removed by close(). issue(NAME, ...) makes a key and a certificate for those names."""

    def __init__(self, name="runcell test CA"):
        self.dir = tempfile.mkdtemp(prefix="tlslab-")
        self.cert = os.path.join(self.dir, "ca.pem")
        self.key = os.path.join(self.dir, "ca.key")
        self._openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                      "-nodes", "-keyout", self.key, "-out", self.cert, "-days", "2",
                      "-subj", "/CN=" + name,
                      "-addext", "basicConstraints=critical,CA:TRUE",
                      "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        self.n = 0

    def _openssl(self, *args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=self.dir)

    def issue(self, *names, self_signed=False):
        """(certificate file, key file) for names (DNS names or IP addresses), signed by this
        CA, or by itself with self_signed."""
        self.n += 1
        base = os.path.join(self.dir, "leaf%d" % self.n)
        san = ",".join(("IP:" if n.replace(".", "").isdigit() else "DNS:") + n for n in names)
        if self_signed:
            self._openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                          "-nodes", "-keyout", base + ".key", "-out", base + ".pem", "-days", "1",
                          "-subj", "/CN=" + names[0], "-addext", "subjectAltName=" + san)
            return base + ".pem", base + ".key"
        self._openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                      "-keyout", base + ".key", "-out", base + ".csr", "-subj", "/CN=" + names[0])
        with open(base + ".ext", "w") as f:
            f.write("subjectAltName=%s\nextendedKeyUsage=serverAuth\n" % san)
        self._openssl("x509", "-req", "-in", base + ".csr", "-CA", self.cert, "-CAkey", self.key,
                      "-CAcreateserial", "-out", base + ".pem", "-days", "1",
                      "-extfile", base + ".ext")
        return base + ".pem", base + ".key"

    def pem(self):
        with open(self.cert) as f:
            return f.read()

    def close(self):
        shutil.rmtree(self.dir, ignore_errors=True)


class RecordingServer:
    """An HTTP/1.1 server on addr:port (TLS with cert=(certfile, keyfile), else plain) in
    threads of the test process. Each request it reads is appended to .requests as
    {"method", "path", "headers" (name: [values]), "body"}; .connections counts the
    connections accepted, .handshake_errors the TLS handshakes that failed. A route function
    route(method, path, headers) may answer (status, headers, body); the default (and a route
    that answers None) is 200 with a short JSON body that names the server (never echoing a
    header)."""

    def __init__(self, addr, port, cert=None, name=None, route=None):
        self.requests, self.connections, self.handshake_errors = [], 0, 0
        self.name = name or addr
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)  # notified at each count or request
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def handle_one_request(self):
                try:
                    super().handle_one_request()
                except (ssl.SSLError, ConnectionError):
                    self.close_connection = True

            def _serve(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                headers = {}
                for k, v in self.headers.items():
                    headers.setdefault(k.lower(), []).append(v)
                with outer.lock:
                    outer.requests.append({"method": self.command, "path": self.path,
                                           "headers": headers, "body": body.decode("latin-1")})
                    outer.changed.notify_all()
                answer = route(self.command, self.path, headers) if route else None
                status, extra, out = answer or (
                    200, {}, json.dumps({"server": outer.name}).encode())
                self.send_response(status)
                for k, v in extra.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = do_PUT = do_DELETE = _serve

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

            def get_request(self):
                sock, peer = self.socket.accept()
                with outer.lock:
                    outer.connections += 1
                    outer.changed.notify_all()
                return sock, peer

            def finish_request(self, sock, peer):
                if not cert:
                    return super().finish_request(sock, peer)
                sock.settimeout(30)  # the handshake in the connection's own thread
                try:
                    tls = outer.ctx.wrap_socket(sock, server_side=True)
                except (ssl.SSLError, OSError):
                    with outer.lock:
                        outer.handshake_errors += 1
                        outer.changed.notify_all()
                    return
                try:
                    super().finish_request(tls, peer)
                finally:
                    tls.close()

        if cert:
            self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.ctx.load_cert_chain(*cert)
        self.httpd = Server((addr, port), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def seen(self, header):
        """The values of header in every request received, in order (None where absent)."""
        with self.lock:
            return [(r["path"], (r["headers"].get(header.lower()) or [None])[0])
                    for r in self.requests]

    def wait_for(self, predicate, timeout=120):
        """Waits until predicate(self) holds (checked at each connection, failed handshake
        or request); returns whether it did within timeout seconds."""
        with self.changed:
            return self.changed.wait_for(lambda: predicate(self), timeout)

    def raw(self):
        """Everything recorded, as text (for searching it for a value)."""
        with self.lock:
            return json.dumps(self.requests)

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def free_port_on(addr):
    s = socket.socket()
    s.bind((addr, 0))
    port = s.getsockname()[1]
    s.close()
    return port
