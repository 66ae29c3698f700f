"""Secrets the egress proxy adds, under attack from inside sessions (fresh, and cloned from the
template when RUNCELL_TEMPLATE is set): the secret reaches its host and no other (not a name
that resolves to the same address, not the address, not plain HTTP unless allowed, not the
host a redirect leads to); smuggled requests are refused; the secret is in no file, variable,
process or memory of the sandbox, nor in the server's log, /metrics, the event log or a
record; the CA key never enters the sandbox and one session's CA is not another's; an
upstream whose certificate does not verify gets nothing.

The module runs in a network namespace of its own. Servers (certificates from a CA the test
makes with openssl, which runcell trusts and the sandbox does not):
  api.test, alias.test  127.0.0.2  TLS on 443 (also for the address itself), HTTP on 80
  other.test            127.0.0.3  TLS on 443
  api2.test             127.0.0.4  HTTP on 80
  bad.test              127.0.0.5  TLS with a self-signed certificate
  wrongname.test        127.0.0.6  TLS with other.test's certificate
"""
import json
import os
import unittest

from memscan import SANDBOX_SCAN, descendants, holds
from rctest import RuncellTestCase, Server
from tlslab import RecordingServer, TestCA, enter_own_netns, netns_missing

# The secret, in two halves: the whole value exists in this process only inside the
# session's create request, never in the code sent to the sandbox.
HEAD, TAIL = "sk-live-7c1d9e", "20b84f36a5"
VALUE = HEAD + TAIL
VALUE2 = "sk-http-allowed-5e6f7a8b9c"  # the one secret sent over plain HTTP (to api2.test)
ALLOW = ["api.test", "alias.test", "127.0.0.2", "other.test", "127.0.0.3", "api2.test",
         "127.0.0.4", "bad.test", "127.0.0.5", "wrongname.test", "127.0.0.6"]


def setUpModule():
    why = netns_missing()
    if why:
        raise unittest.SkipTest(why)
    enter_own_netns()


def server_args():
    # The security suite runs twice: sessions made fresh, and cloned from the template.
    return () if os.environ.get("RUNCELL_TEMPLATE") else ("--no-template",)


def route(method, path, headers):
    if path.startswith("/redirect"):
        return 302, {"Location": "https://other.test/landing"}, b""
    if path.startswith("/echo"):  # an upstream that shows the client its own request
        return 200, {}, json.dumps(headers).encode()
    return None


class Secrets(RuncellTestCase):
    @classmethod
    def setUpClass(cls):
        cls.ca = TestCA()
        ca = cls.ca
        cls.api = RecordingServer("127.0.0.2", 443,
                                  ca.issue("api.test", "alias.test", "127.0.0.2"), "api", route)
        cls.api_http = RecordingServer("127.0.0.2", 80, None, "api-http")
        cls.other = RecordingServer("127.0.0.3", 443, ca.issue("other.test"), "other")
        cls.api2 = RecordingServer("127.0.0.4", 80, None, "api2")
        cls.bad = RecordingServer("127.0.0.5", 443, ca.issue("bad.test", self_signed=True),
                                  "bad")
        cls.wrong = RecordingServer("127.0.0.6", 443, ca.issue("other.test"), "wrong")
        cls.servers = [cls.api, cls.api_http, cls.other, cls.api2, cls.bad, cls.wrong]
        hosts = os.path.join(ca.dir, "hosts")
        with open(hosts, "w") as f:
            f.write("127.0.0.2 api.test alias.test\n127.0.0.3 other.test\n127.0.0.4 api2.test\n"
                    "127.0.0.5 bad.test\n127.0.0.6 wrongname.test\n")
        cls.srv = Server(*server_args(), "--pool", "0",
                         env={"RUNCELL_NET_HOSTS": hosts, "SSL_CERT_FILE": ca.cert}).start()

    @classmethod
    def tearDownClass(cls):
        cls.srv.close()
        for s in cls.servers:
            s.close()
        cls.ca.close()

    def session(self, secrets):
        sid = self.srv.ok("POST", "/v1/sessions",
                          {"network": {"mode": "allowlist", "allow": ALLOW}, "secrets": secrets},
                          status=201)["id"]
        self.addCleanup(self.srv.request, "DELETE", "/v1/sessions/" + sid)
        # The test's CA, for the tunnels to hosts without secrets (end to end, as ever).
        self.srv.ok("PUT", "/v1/sessions/%s/files/testca.pem" % sid, self.ca.pem().encode(),
                    status=201)
        return sid

    def run_code(self, sid, code):
        rec = self.srv.execute(sid, "import json\nout = {}\n" + code + "\nprint(json.dumps(out))")
        self.assertStatus(rec, "ok")
        return json.loads(rec["stdout"].strip().splitlines()[-1]), rec

    def bearer(self, **extra):
        return dict({"host": "api.test", "header": "Authorization", "value": "Bearer " + VALUE},
                    **extra)

    def test_the_secret_goes_to_its_host_and_nowhere_else(self):
        sid = self.session([self.bearer()])
        out, rec = self.run_code(sid, """
import os, requests
both = "/tmp/both.pem"  # the session's bundle and the test's CA: every server verifies
with open(both, "w") as f:
    f.write(open(os.environ["SSL_CERT_FILE"]).read() + open("/workspace/testca.pem").read())
def get(url):
    try:
        r = requests.get(url, verify=both, timeout=30)
        return [r.status_code, [h.url for h in r.history]]
    except Exception as e:
        return [type(e).__name__]
for name, url in [("own", "https://api.test/own"), ("other", "https://other.test/x"),
                  ("alias", "https://alias.test/alias"), ("address", "https://127.0.0.2/addr"),
                  ("plain", "http://api.test/plain"), ("redirect", "https://api.test/redirect")]:
    out[name] = get(url)
""")
        self.assertEqual(out["own"], [200, []])
        for k in ("other", "alias", "address", "plain"):
            self.assertEqual(out[k][0], 200, (k, out))
        self.assertEqual(out["redirect"], [200, ["https://api.test/redirect"]])
        seen = dict(self.api.seen("authorization"))
        # Its host gets it; a name for the same address, and the address, are other hosts.
        self.assertEqual(seen["/own"], "Bearer " + VALUE)
        self.assertEqual(seen["/redirect"], "Bearer " + VALUE)
        self.assertIsNone(seen["/alias"])
        self.assertIsNone(seen["/addr"])
        # Plain HTTP to its host, the host a redirect led to, another host: nothing.
        self.assertIsNone(dict(self.api_http.seen("authorization"))["/plain"])
        self.assertIn(("/landing", None), self.other.seen("authorization"))
        for s in (self.api_http, self.other, self.api2):
            self.assertNotIn(VALUE, s.raw())
        self.assertNotIn(VALUE, json.dumps(rec))

    def test_plain_http_gets_a_secret_only_when_it_says_so(self):
        sid = self.session([self.bearer(path_prefix="/v1/"),
                            {"host": "api2.test", "header": "X-Key", "value": VALUE2,
                             "allow_http": True}])
        out, _ = self.run_code(sid, """
import urllib.request
for name, url in [("not_allowed", "http://api.test/v1/p"), ("allowed", "http://api2.test/q"),
                  ("outside_prefix", "https://api.test/v2/r"),
                  ("climbing_out", "https://api.test/v1/%2e%2e/s")]:
    out[name] = urllib.request.urlopen(url, timeout=30).status
""")
        self.assertEqual(set(out.values()), {200})
        self.assertEqual(dict(self.api_http.seen("authorization"))["/v1/p"], None)
        self.assertEqual(dict(self.api2.seen("x-key"))["/q"], VALUE2)
        seen = dict(self.api.seen("authorization"))
        self.assertIsNone(seen["/v2/r"])
        self.assertIsNone(seen["/v1/%2e%2e/s"])

    def test_smuggled_requests_are_refused(self):
        sid = self.session([self.bearer()])
        out, rec = self.run_code(sid, r"""
import socket, ssl
def exchange(payload):
    raw = socket.create_connection(("127.0.0.1", 3128), timeout=30)
    raw.sendall(b"CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        head += raw.recv(1)
    t = ssl.create_default_context().wrap_socket(raw, server_hostname="api.test")
    t.sendall(payload)
    data = b""
    try:
        while True:
            b = t.recv(65536)
            if not b:
                break
            data += b
    except (OSError, ssl.SSLError) as e:
        data += b" <" + type(e).__name__.encode() + b">"
    t.close()
    # The status lines (one answer's body runs into the next answer's status line).
    return [m.decode() for m in re.findall(rb"HTTP/1\.1 [0-9]{3}[^\r\n]*", data)]
H = b"Host: api.test\r\n"
cases = {
    "cl_te": b"POST /cl-te HTTP/1.1\r\n" + H + b"Content-Length: 5\r\n"
             b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "te_gzip": b"POST /te HTTP/1.1\r\n" + H + b"Transfer-Encoding: gzip, chunked\r\n\r\n",
    "two_lengths": b"POST /two HTTP/1.1\r\n" + H + b"Content-Length: 1\r\n"
                   b"Content-Length: 40\r\n\r\nx",
    "obs_fold": b"GET /fold HTTP/1.1\r\n" + H + b"X-A: 1\r\n Authorization: Bearer mine\r\n\r\n",
    "bare_lf": b"GET /lf HTTP/1.1\n" + H.replace(b"\r\n", b"\n") + b"\n",
    "connect_inside": b"CONNECT other.test:443 HTTP/1.1\r\n" + H + b"\r\n",
    "other_host": b"GET /other-host HTTP/1.1\r\nHost: other.test\r\n\r\n",
    "absolute_other": b"GET https://other.test/abs HTTP/1.1\r\n" + H + b"\r\n",
    "pipelined_other": b"GET /first HTTP/1.1\r\n" + H + b"\r\n"
                       b"GET /second HTTP/1.1\r\nHost: other.test\r\n\r\n",
    "in_body": b"POST /body HTTP/1.1\r\n" + H + b"Content-Length: 4\r\n\r\nabcd"
               b"GET /smuggled HTTP/1.1\r\n" + H + b"Host: other.test\r\n\r\n",
    "kept_alive": b"GET /ka1 HTTP/1.1\r\n" + H + b"\r\nGET /ka2 HTTP/1.1\r\n" + H +
                  b"Connection: close\r\n\r\n",
}
import re
out = {k: exchange(v) for k, v in cases.items()}
""")
        first_line = {k: v[0] if v else None for k, v in out.items()}
        for k in ("cl_te", "two_lengths", "obs_fold", "bare_lf", "connect_inside"):
            self.assertTrue(first_line[k].startswith("HTTP/1.1 400 "), (k, out[k]))
        self.assertTrue(first_line["te_gzip"].startswith("HTTP/1.1 501 "), out["te_gzip"])
        for k in ("other_host", "absolute_other"):
            self.assertTrue(first_line[k].startswith("HTTP/1.1 421 "), (k, out[k]))
        # After a request that went, a refused one ends the connection: the server answers
        # what it was sent, the refused request never reaches it.
        self.assertEqual(out["pipelined_other"], ["HTTP/1.1 200 OK"])
        self.assertEqual(out["in_body"], ["HTTP/1.1 200 OK"])
        self.assertEqual(out["kept_alive"], ["HTTP/1.1 200 OK", "HTTP/1.1 200 OK"])
        paths = [p for p, _ in self.api.seen("authorization")]
        for p in ("/cl-te", "/te", "/two", "/fold", "/lf", "/other-host", "/abs", "/second",
                  "/smuggled", "https://other.test/abs"):
            self.assertNotIn(p, paths)
        seen = dict(self.api.seen("authorization"))
        for p in ("/first", "/body", "/ka1", "/ka2"):
            self.assertEqual(seen[p], "Bearer " + VALUE, p)
        self.assertNotIn("/second", json.dumps(self.other.requests))
        events = self.srv.ok("GET", "/v1/sessions/%s/events" % sid)["events"]
        refused = [e for e in events if not e["allowed"]]
        self.assertGreaterEqual(len(refused), 10)
        self.assertTrue(any("request smuggling" in e["reason"] for e in refused))

    def test_nothing_of_the_secret_or_the_ca_key_is_in_the_sandbox(self):
        sid = self.session([self.bearer()])
        # The proxy has used it, and its connection is still open while the scans run.
        out, _ = self.run_code(sid, """
import requests
keep = requests.Session()
out["status"] = keep.get("https://api.test/used", timeout=30).status_code
""")
        self.assertEqual(out["status"], 200)
        self.assertEqual(dict(self.api.seen("authorization"))["/used"], "Bearer " + VALUE)
        head, tail = HEAD.encode(), TAIL.encode()
        # From the host: no process of the sandboxes holds it; the daemon does (the scan sees
        # a value where it is).
        self.assertTrue(holds(self.srv.pid, head, tail))
        held = [p for p in descendants(self.srv.pid) if holds(p, head, tail)]
        self.assertEqual(held, [])
        out, rec = self.run_code(sid, SANDBOX_SCAN + """
h, t = %r, %r
out["memory"] = scan_memory(h, t)
skip = {"/proc", "/sys", "/usr", "/dev"}
out["files"] = scan_files(h, t, ["/"], skip)
out["processes"] = scan_processes(h, t)
out["keys"] = scan_files(b"PRIVATE", b" KEY", ["/"], skip)
out["netdir"] = sorted(os.listdir("/.runcell-net"))
import sys
out["from_template"] = "numpy" in sys.modules  # a clone of the template has it imported
""" % (head, tail))
        self.assertEqual(out["from_template"], bool(os.environ.get("RUNCELL_TEMPLATE")))
        self.assertEqual(out["memory"]["hits"], [])
        self.assertGreater(out["memory"]["scanned_mb"], 5)
        self.assertEqual(out["files"]["hits"], [])
        self.assertGreater(out["files"]["files"], 3)
        self.assertEqual(out["processes"]["hits"], [])
        self.assertEqual(out["keys"]["hits"], [])
        self.assertEqual(out["netdir"], ["ca-certificates.crt", "ca.pem", "egress.sock"])
        # Nor anything runcell shows about the session.
        shown = [self.srv.log(), self.srv.request("GET", "/metrics").body.decode(),
                 json.dumps(self.srv.ok("GET", "/v1/sessions/%s/events" % sid)),
                 json.dumps(self.srv.ok("GET", "/v1/sessions/" + sid)),
                 json.dumps(self.srv.ok("GET", "/v1/sessions")), json.dumps(rec)]
        for text in shown:
            self.assertNotIn(VALUE, text)

    def test_an_echoed_secret_is_masked_in_the_record(self):
        """A server that sends the request back shows the secret to the code (which can use
        it anyway while the session runs): the record, streamed or not, masks it."""
        sid = self.session([self.bearer()])
        code = ("import urllib.request\n"
                "print(urllib.request.urlopen('https://api.test/echo', timeout=30).read()"
                ".decode())\nurllib.request.urlopen('https://api.test/echo', timeout=30).read()")
        rec = self.srv.execute(sid, code)
        self.assertStatus(rec, "ok")
        masked = "*" * len("Bearer " + VALUE)
        self.assertIn('"authorization": ["%s"]' % masked, rec["stdout"])
        events = self.srv.stream(sid, code).rest()
        self.assertIn(masked, json.dumps(events))
        self.assertNotIn(VALUE, json.dumps(rec) + json.dumps(events))

    def test_one_sessions_ca_is_not_trusted_by_another(self):
        a, b = self.session([self.bearer()]), self.session([self.bearer()])
        leaf = """
import socket, ssl
raw = socket.create_connection(("127.0.0.1", 3128), timeout=30)
raw.sendall(b"CONNECT api.test:443 HTTP/1.1\\r\\n\\r\\n")
while not raw.recv(4096).endswith(b"\\r\\n\\r\\n"):
    pass
t = ssl.create_default_context().wrap_socket(raw, server_hostname="api.test")
open("/tmp/%s-leaf.pem", "w").write(ssl.DER_cert_to_PEM_cert(t.getpeercert(True)))
t.close()
out["ca"] = open("/.runcell-net/ca.pem").read()
out["bundle_has"] = open("/.runcell-net/ca.pem").read() in open(
    "/etc/ssl/certs/ca-certificates.crt").read()
out["leaf"] = open("/tmp/%s-leaf.pem").read()
"""
        out_a, _ = self.run_code(a, leaf % ("a", "a"))
        out_b, _ = self.run_code(b, leaf % ("b", "b"))
        self.assertNotEqual(out_a["ca"], out_b["ca"])
        self.assertTrue(out_a["bundle_has"] and out_b["bundle_has"])
        out, _ = self.run_code(b, """
import subprocess
open("/tmp/a-leaf.pem", "w").write(%r)
open("/tmp/a-ca.pem", "w").write(%r)
def verify(path):
    p = subprocess.run(["openssl", "verify", "-CAfile", os.environ["SSL_CERT_FILE"], path],
                       capture_output=True, text=True)
    return [p.returncode, p.stdout + p.stderr]
import os
out["own"] = verify("/tmp/b-leaf.pem")
out["other"] = verify("/tmp/a-leaf.pem")
out["a_ca_in_b"] = open("/tmp/a-ca.pem").read() in open(os.environ["SSL_CERT_FILE"]).read()
out["a_ca_in_store"] = open("/tmp/a-ca.pem").read() in open(
    "/etc/ssl/certs/ca-certificates.crt").read()
""" % (out_a["leaf"], out_a["ca"]))
        self.assertEqual(out["own"][0], 0, out["own"])
        self.assertNotEqual(out["other"][0], 0, out["other"])
        self.assertIn("unable to get local issuer certificate", out["other"][1])
        self.assertFalse(out["a_ca_in_b"] or out["a_ca_in_store"])

    def test_an_upstream_that_does_not_verify_gets_nothing(self):
        sid = self.session([
            {"host": "bad.test", "header": "X-Key", "value": VALUE},
            {"host": "wrongname.test", "header": "X-Key", "value": VALUE}])
        out, _ = self.run_code(sid, """
import urllib.request, urllib.error
for name in ("bad.test", "wrongname.test"):
    try:
        urllib.request.urlopen("https://%s/x" % name, timeout=30)
        out[name] = "reached"
    except urllib.error.URLError as e:
        out[name] = str(e.reason)
""")
        self.assertIn("Tunnel connection failed: 502", out["bad.test"])
        self.assertIn("self-signed certificate", out["bad.test"])
        self.assertIn("Tunnel connection failed: 502", out["wrongname.test"])
        self.assertIn("hostname mismatch", out["wrongname.test"])
        # The proxy gave up in the handshake: no request, no byte of one. (The server's side
        # of the failed handshake may end a moment after the client heard of it.)
        for s in (self.bad, self.wrong):
            self.assertTrue(s.wait_for(lambda x: x.handshake_errors >= 1))
            self.assertEqual(s.requests, [])
        events = self.srv.ok("GET", "/v1/sessions/%s/events" % sid)["events"]
        reasons = [e["reason"] for e in events if not e["allowed"]]
        self.assertEqual(len(reasons), 2, events)
        self.assertTrue(all("nothing was sent to it" in r for r in reasons), reasons)


if __name__ == "__main__":
    unittest.main()
