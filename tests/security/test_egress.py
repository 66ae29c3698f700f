"""Egress allowlists under attack: names and wildcards that must not match, addresses the
proxy must not connect to (loopback, link-local metadata services, IPv4 in IPv6 clothes),
ways around the proxy (direct connections, DNS, the proxy's socket itself), and the relay
that the code must not be able to take over. Every server is started here on 127.0.0.1;
refused addresses are never connected to."""
import ctypes
import json
import tempfile
import unittest

from seclib import probe
from rctest import FETCH, RuncellTestCase, run_cells, serve_files

CONNECT = """
import socket
def tunnel(target, via=("127.0.0.1", 3128), family=socket.AF_INET):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(via)
    s.sendall(("CONNECT %s HTTP/1.1\\r\\n\\r\\n" % target).encode())
    data = b""
    while b"\\r\\n\\r\\n" not in data:
        b = s.recv(4096)
        if not b:
            break
        data += b
    s.close()
    return data.split(b"\\r\\n")[0].decode()
"""


def landlock_abi():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc.syscall(ctypes.c_long(444), None, ctypes.c_long(0), ctypes.c_long(1))


class Egress(RuncellTestCase):
    def setUp(self):
        self.srv, _ = serve_files(self, {"ok.txt": "reached"})
        self.port = self.srv.port
        self.hosts = tempfile.NamedTemporaryFile("w", suffix=".hosts")
        self.addCleanup(self.hosts.close)

    def hosts_file(self, lines):
        self.hosts.write("\n".join(lines) + "\n")
        self.hosts.flush()
        return {"RUNCELL_NET_HOSTS": self.hosts.name}

    def probe(self, code, allow, env=None):
        return probe(self, FETCH + CONNECT + code, "--net", "allow:" + allow, env=env)

    def test_wildcard_matches_subdomains_only(self):
        names = ["a.example.test", "b.a.example.test", "example.test", "example.test.evil",
                 "badexample.test"]
        env = self.hosts_file(["127.0.0.1 " + " ".join(names)])
        res, rec = self.probe("report({n: fetch('http://%%s:%d/ok.txt' %% n) for n in NAMES})"
                              .replace("NAMES", repr(names)) % self.port,
                              "*.example.test:%d,127.0.0.1:%d" % (self.port, self.port), env)
        self.assertEqual(res["a.example.test"], "200 reached")
        self.assertEqual(res["b.a.example.test"], "200 reached")
        for n in names[2:]:
            self.assertTrue(res[n].startswith("403 ") and
                            "%s is not on this session's network allowlist" % n in res[n],
                            res[n])
        # Names off the list are refused before any lookup: no address in their events.
        refused = [e for e in rec["network"] if not e["allowed"]]
        self.assertEqual(sorted(e["host"] for e in refused), sorted(names[2:]))
        self.assertTrue(all(e["address"] is None for e in refused))

    def test_loopback_is_refused_unless_named_exactly(self):
        env = self.hosts_file(["::ffff:127.0.0.1 mapped.example.test"])
        res, rec = self.probe("""
report({"localhost": fetch("http://localhost:%(p)d/ok.txt"),
        "mapped": fetch("http://mapped.example.test:%(p)d/ok.txt"),
        "other_loopback": fetch("http://127.0.0.2:%(p)d/ok.txt")})
""" % {"p": self.port}, "localhost:%d,mapped.example.test:%d,127.0.0.2:%d" %
            (self.port, self.port, self.port + 1), env)
        self.assertIn("403 runcell egress proxy: refused GET localhost:%d: 127.0.0.1 is a "
                      "loopback address" % self.port, res["localhost"])
        self.assertIn("::ffff:127.0.0.1 is a loopback address", res["mapped"])
        self.assertIn("port %d is not allowed" % self.port, res["other_loopback"])
        self.assertEqual(self.srv.requests, [])

    def test_metadata_address_is_refused(self):
        env = self.hosts_file(["169.254.169.254 metadata.example.test",
                               "fd00::1 ula.example.test"])
        res, rec = self.probe("""
report({"direct": fetch("http://169.254.169.254/latest/meta-data/"),
        "tunnel": tunnel("169.254.169.254:80"),
        "by_name": fetch("http://metadata.example.test/latest/meta-data/"),
        "ula": tunnel("ula.example.test:443")})
""", "metadata.example.test,ula.example.test", env)
        self.assertIn("169.254.169.254 is not on this session's network allowlist",
                      res["direct"])
        self.assertTrue(res["tunnel"].startswith("HTTP/1.1 403 "), res["tunnel"])
        self.assertIn("169.254.169.254 is a link-local address", res["by_name"])
        self.assertIn("fd00::1 is a private (unique local) address", res["ula"])
        by_name = [e for e in rec["network"] if e["host"] == "metadata.example.test"]
        self.assertEqual([(e["allowed"], e["address"], e["status"]) for e in by_name],
                         [(False, "169.254.169.254", 403)])

    def test_tunnel_and_translation_prefixes_are_refused(self):
        """Addresses that lead to an IPv4 address behind a relay or a translator (local-use
        NAT64, Teredo, 6to4 and its relay) and the other special-purpose classes are refused
        like private ones, before any connection."""
        addrs = {"nat64": "64:ff9b:1::a00:1", "teredo": "2001:0:4136:e378:8000:63bf:3fff:fdd2",
                 "sixtofour": "2002:a00:1::1", "relay": "192.88.99.1", "as112": "192.31.196.1",
                 "orchid": "2001:20::1", "srv6": "5f00::1", "doc": "3fff::1"}
        env = self.hosts_file(["%s %s.example.test" % (a, n) for n, a in addrs.items()])
        res, rec = self.probe("report({n: tunnel('%s.example.test:443' % n) for n in NAMES})"
                              .replace("NAMES", repr(sorted(addrs))),
                              ",".join("%s.example.test" % n for n in addrs), env)
        for n in addrs:
            self.assertTrue(res[n].startswith("HTTP/1.1 403 "), (n, res[n]))
        why = {e["host"]: e for e in rec["network"]}
        for n, a in addrs.items():
            ev = why["%s.example.test" % n]
            self.assertEqual((ev["allowed"], ev["status"]), (False, 403), ev)
            self.assertIn("only an entry naming that address exactly", ev["reason"])
        self.assertIn("local-use NAT64", why["nat64.example.test"]["reason"])
        self.assertIn("Teredo", why["teredo.example.test"]["reason"])
        self.assertIn("6to4 address", why["sixtofour.example.test"]["reason"])
        self.assertIn("6to4 relay", why["relay.example.test"]["reason"])

    def test_a_trailing_dot_reaches_the_pinned_address_under_the_same_rule(self):
        """"name." is the same name as "name" for the allowlist and for the operator's
        pinned hosts file: it cannot go past the pin to the system resolver."""
        env = self.hosts_file(["127.0.0.1 pinned.example.test"])
        res, rec = self.probe("""
report({"dot": fetch("http://pinned.example.test.:%(p)d/ok.txt"),
        "tunnel": tunnel("PINNED.example.test.:%(p)d"),
        "two_dots": tunnel("pinned.example.test..:%(p)d")})
""" % {"p": self.port}, "pinned.example.test:%d,127.0.0.1:%d" % (self.port, self.port), env)
        self.assertEqual(res["dot"], "200 reached")
        self.assertEqual(res["tunnel"], "HTTP/1.1 200 Connection established")
        self.assertTrue(res["two_dots"].startswith("HTTP/1.1 400 "), res["two_dots"])
        allowed = [e for e in rec["network"] if e["allowed"]]
        self.assertEqual(sorted((e["host"].lower(), e["address"]) for e in allowed),
                         [("pinned.example.test", "127.0.0.1")] * 2)

    def test_direct_connections_ignore_nothing(self):
        """The code can skip the proxy variables, but not the proxy: its own network
        namespace has only loopback, and no resolver."""
        res, _ = self.probe("""
import errno
def direct(addr):
    s = socket.socket(); s.settimeout(10)
    try:
        s.connect(addr); return "connected"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e))
try:
    socket.getaddrinfo("example.com", 443); dns = "resolved"
except socket.gaierror:
    dns = "gaierror"
report({"host_loopback": direct(("127.0.0.1", %d)), "public": direct(("192.0.2.1", 443)),
        "dns": dns, "resolv_conf": os.path.exists("/etc/resolv.conf"),
        "ifaces": sorted(l.split(":")[0].strip()
                         for l in open("/proc/net/dev").read().splitlines()[2:])})
""" % self.port, "127.0.0.1:%d" % self.port)
        self.assertEqual(res, {"host_loopback": "ECONNREFUSED", "public": "ENETUNREACH",
                               "dns": "gaierror", "resolv_conf": False, "ifaces": ["lo"]})
        self.assertEqual(self.srv.requests, [])

    def test_the_proxy_socket_enforces_the_policy_too(self):
        res, _ = self.probe("""
s = socket.socket(socket.AF_UNIX)
s.connect("/.runcell-net/egress.sock")
s.sendall(b"CONNECT 127.0.0.1:%(other)d HTTP/1.1\\r\\n\\r\\n")
refused = s.recv(4096).split(b"\\r\\n")[0].decode()
s.close()
s = socket.socket(socket.AF_UNIX)
s.connect("/.runcell-net/egress.sock")
s.sendall(b"GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
as_server = s.recv(4096).split(b"\\r\\n")[0].decode()
report({"refused": refused, "as_server": as_server,
        "unlink": oserr(os.unlink, "/.runcell-net/egress.sock"),
        "plant": oserr(open, "/.runcell-net/other.sock", "w")})
""" % {"other": self.port + 1}, "127.0.0.1:%d" % self.port)
        self.assertTrue(res["refused"].startswith("HTTP/1.1 403 Forbidden"), res)
        self.assertTrue(res["as_server"].startswith("HTTP/1.1 400 Bad Request"), res)
        self.assertIn(res["unlink"], ("EROFS", "EACCES", "EPERM"))
        self.assertIn(res["plant"], ("EROFS", "EACCES", "EPERM"))

    def test_a_client_that_hangs_up_cannot_end_runcell(self):
        """A client that sends a request and closes before the answer leaves the proxy
        writing to a socket with no reader: runcell gets EPIPE on that connection, and the
        run goes on (a SIGPIPE once ended `runcell run` with no record). 24 hang-ups stay
        under the cap of 32 connections at once, which counts those not yet closed."""
        res, rec = self.probe("""
def hang_up(family, addr, head):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.connect(addr)
    s.sendall(head)
    s.close()
for _ in range(12):
    hang_up(socket.AF_UNIX, "/.runcell-net/egress.sock",
            b"CONNECT 127.0.0.1:%(other)d HTTP/1.1\\r\\n\\r\\n")
    hang_up(socket.AF_INET, ("127.0.0.1", 3128), b"GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
report({"after": fetch("http://127.0.0.1:%(p)d/ok.txt")})
""" % {"other": self.port + 1, "p": self.port}, "127.0.0.1:%d" % self.port)
        self.assertEqual(res["after"], "200 reached")
        self.assertEqual(len(self.srv.requests), 1)

    def test_oversized_and_malformed_requests(self):
        res, _ = self.probe("""
def raw(data):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=30)
    s.sendall(data)
    out = s.recv(4096).split(b"\\r\\n")[0].decode()
    s.close()
    return out
report({"huge": raw(b"GET http://x/ HTTP/1.1\\r\\n" + b"X-Pad: " + b"a" * 20000 + b"\\r\\n\\r\\n"),
        "garbage": raw(b"\\x16\\x03\\x01\\x02\\x00\\r\\n\\r\\n"),
        "ctl": raw(b"CONNECT a\\x01b:443 HTTP/1.1\\r\\n\\r\\n")})
""", "127.0.0.1:%d" % self.port)
        self.assertTrue(res["huge"].startswith("HTTP/1.1 431 "), res)
        self.assertTrue(res["garbage"].startswith("HTTP/1.1 400 "), res)
        self.assertTrue(res["ctl"].startswith("HTTP/1.1 400 "), res)

    def test_request_bytes_cannot_forge_log_lines_or_events(self):
        """A request target the proxy cannot parse is quoted in the refusal's reason; what
        the code put there (quotes, tabs, an escape sequence, a non-UTF-8 byte) must not
        reach the daemon's log line, the event or the answer raw."""
        code = r"""
import json, socket
s = socket.create_connection(("127.0.0.1", 3128), timeout=30)
s.sendall(b'CONNECT a"\tlevel=error\tmsg="forged\x1b[2J\\\xff:443 HTTP/1.1\r\n\r\n')
print(json.dumps(s.recv(4096).split(b"\r\n")[0].decode("latin-1")))
"""
        [rec], p = run_cells(code, opts=("--net", "allow:127.0.0.1:%d" % self.port),
                             env={"RUNCELL_LOG": "info"})
        self.assertStatus(rec, "ok")
        answer = json.loads(rec["stdout"].splitlines()[-1])
        [ev] = rec["network"]
        self.assertEqual((ev["allowed"], ev["status"]), (False, 400))
        self.assertIn("cannot have", ev["reason"])
        lines = [l for l in p.stderr.splitlines() if 'msg="egress refused"' in l]
        self.assertEqual(len(lines), 1, p.stderr)
        for text in (answer, ev["reason"], lines[0]):
            self.assertIn("forged", text)
            for raw in ('msg="forged', "\t", "\x1b", "\\", "\xff", "\ufffd"):
                self.assertNotIn(raw, text, repr(text))
        self.assertNotIn("level=error", lines[0].split(" reason=", 1)[0])
        self.assertTrue(lines[0].endswith('"'), repr(lines[0]))
        self.assertEqual(lines[0].count('"') % 2, 0, repr(lines[0]))

    def test_code_cannot_signal_or_replace_the_relay(self):
        if landlock_abi() < 6:
            self.skipTest("the kernel's Landlock has no signal scoping (ABI < 6)")
        res, _ = self.probe("""
import signal
relay = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != 1 and
         open("/proc/" + p + "/comm").read().strip() == "runcell-relay"]
s = socket.socket()
report({"relays": len(relay), "kill": oserr(os.kill, relay[0], signal.SIGKILL),
        "bind": oserr(s.bind, ("127.0.0.1", 3128)),
        "after": fetch("http://127.0.0.1:%d/ok.txt")})
""" % self.port, "127.0.0.1:%d" % self.port)
        self.assertEqual(res, {"relays": 1, "kill": "EPERM", "bind": "EADDRINUSE",
                               "after": "200 reached"})


if __name__ == "__main__":
    unittest.main()
