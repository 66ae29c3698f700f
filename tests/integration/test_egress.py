"""Network allowlists through the egress proxy: reaching what is allowed, the refusals the
code sees and the records, installing packages from a local index, the API's options, the
event log and the metrics. Every server is started here on 127.0.0.1."""
import json
import os
import socket
import tempfile
import unittest

from rctest import (FETCH, ApiServer, RuncellTestCase, TempDir, run_json, runcell,
                    serve_files, tiny_index)


class Served(RuncellTestCase):
    """A test with a file server on 127.0.0.1 serving hello.txt and a tiny package index."""

    def setUp(self):
        self.srv, self.root = serve_files(self, {"hello.txt": "hello from the host"})
        tiny_index(self.root)
        self.port = self.srv.port
        self.allow = "allow:127.0.0.1:%d" % self.port
        self.index = "http://127.0.0.1:%d/simple" % self.port


class Reach(Served):
    def test_allowed_ip_port_is_reachable_and_recorded(self):
        rec, _ = run_json(FETCH + "print(fetch('http://127.0.0.1:%d/hello.txt'))" % self.port,
                          "--net", self.allow)
        self.assertStatus(rec, "ok")
        self.assertEqual(rec["stdout"].strip(), "200 hello from the host")
        self.assertIn("/hello.txt", self.srv.requests)
        [ev] = rec["network"]
        self.assertEqual((ev["method"], ev["host"], ev["port"], ev["allowed"], ev["rule"],
                          ev["address"], ev["status"]),
                         ("GET", "127.0.0.1", self.port, True, "127.0.0.1:%d" % self.port,
                          "127.0.0.1", 200))

    def test_another_port_is_refused_with_a_403_that_says_why(self):
        rec, _ = run_json(FETCH + "print(fetch('http://127.0.0.1:%d/'))" % (self.port + 1),
                          "--net", self.allow)
        self.assertStatus(rec, "ok")
        out = rec["stdout"]
        self.assertTrue(out.startswith("403 runcell egress proxy: refused GET 127.0.0.1:%d: "
                                       "port %d is not allowed" % (self.port + 1,
                                                                   self.port + 1)), out)
        [ev] = rec["network"]
        self.assertFalse(ev["allowed"])
        self.assertEqual(ev["status"], 403)
        self.assertIn("port %d is not allowed" % (self.port + 1), ev["reason"])

    def test_a_listed_host_on_another_port_is_refused_for_its_port(self):
        # pkg.example.test is listed for 80 and 443: 8080 is refused by the policy, before
        # any lookup, and the refusal names the port rather than the host.
        rec, _ = run_json(FETCH + "print(fetch('http://pkg.example.test:8080/'))",
                          "--net", self.allow + ",pkg.example.test")
        self.assertStatus(rec, "ok")
        self.assertIn("refused GET pkg.example.test:8080: port 8080 is not allowed for "
                      "pkg.example.test on this session's network allowlist", rec["stdout"])
        [ev] = rec["network"]
        self.assertEqual((ev["allowed"], ev["status"], ev["address"]), (False, 403, None))
        self.assertIn("port 8080 is not allowed", ev["reason"])

    def test_https_tunnel_refusal_shows_in_the_clients_error(self):
        rec, p = run_json(FETCH + "print(fetch('https://pkg.example.test/'))",
                          "--net", self.allow)
        self.assertIn("Tunnel connection failed: 403", rec["stdout"])
        self.assertIn("pkg.example.test is not on this session's network allowlist",
                      rec["stdout"])
        self.assertEqual(rec["network"][0]["method"], "CONNECT")

    def test_connect_tunnel_carries_any_protocol(self):
        code = """
import socket
s = socket.create_connection(("127.0.0.1", 3128), timeout=30)
s.sendall(b"CONNECT 127.0.0.1:PORT HTTP/1.1\\r\\nHost: 127.0.0.1:PORT\\r\\n\\r\\n")
head = s.recv(4096)
s.sendall(b"GET /hello.txt HTTP/1.0\\r\\n\\r\\n")
body = b""
while True:
    b = s.recv(65536)
    if not b:
        break
    body += b
print(head.split(b"\\r\\n")[0].decode())
print(body.split(b"\\r\\n\\r\\n", 1)[1].decode())
""".replace("PORT", str(self.port))
        rec, _ = run_json(code, "--net", self.allow)
        self.assertStatus(rec, "ok")
        self.assertEqual(rec["stdout"].splitlines(),
                         ["HTTP/1.1 200 Connection established", "hello from the host"])

    def test_names_resolve_outside_the_sandbox(self):
        with tempfile.NamedTemporaryFile("w", suffix=".hosts") as hosts:
            hosts.write("127.0.0.1 files.example.test\n")
            hosts.flush()
            rec, _ = run_json(
                FETCH + "print(fetch('http://files.example.test:%d/hello.txt'))" % self.port,
                "--net", "allow:files.example.test:%d,127.0.0.1:%d" % (self.port, self.port),
                env={"RUNCELL_NET_HOSTS": hosts.name})
        self.assertEqual(rec["stdout"].strip(), "200 hello from the host")
        [ev] = rec["network"]
        self.assertEqual((ev["host"], ev["rule"], ev["address"]),
                         ("files.example.test", "files.example.test:%d" % self.port,
                          "127.0.0.1"))

    def test_no_network_by_default(self):
        # No proxy variables and no proxy socket (sandboxes made by the template have an
        # empty /.runcell-net mount point; nothing is attached to it without a network).
        rec, _ = run_json("import os; print(sorted(k for k in os.environ if 'proxy' in "
                          "k.lower())); print(os.path.exists('/.runcell-net/egress.sock'))")
        self.assertEqual(rec["stdout"].splitlines(), ["[]", "False"])
        self.assertNotIn("network", rec)


class Packages(Served):
    def test_pip_install_inside_a_session(self):
        p = runcell("run", "--json", "--net", self.allow, "-c",
                    "import subprocess, sys\n"
                    "r = subprocess.run([sys.executable, '-m', 'pip', 'install', '--index-url',"
                    " '%s', 'tinypkg'], capture_output=True, text=True)\n"
                    "print(r.returncode, r.stdout[-300:], r.stderr[-1500:])" % self.index,
                    "-c", "import tinypkg; tinypkg.VALUE", timeout=300)
        recs = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
        self.assertEqual(len(recs), 2, p.stdout + p.stderr)
        self.assertTrue(recs[0]["stdout"].startswith("0 "), recs[0]["stdout"])
        self.assertEqual(recs[1]["results"], [{"text/plain": "42"}])
        self.assertTrue(all(ev["allowed"] for ev in recs[0]["network"]))
        self.assertTrue(any("/simple/tinypkg/" in r for r in self.srv.requests))

    def test_packages_at_start_report_what_is_missing(self):
        p = runcell("run", "--json", "--net", self.allow, "--index-url", self.index,
                    "--package", "tinypkg==1.0", "--package", "nosuchpkg==2.0",
                    "-c", "import tinypkg; tinypkg.VALUE", timeout=300)
        rec = json.loads([l for l in p.stdout.splitlines() if l.startswith("{")][0])
        self.assertStatus(rec, "ok")
        self.assertEqual(rec["results"], [{"text/plain": "42"}])
        report = rec["packages"]
        self.assertEqual(report["status"], "partial")
        self.assertEqual(report["installed"], ["tinypkg==1.0"])
        [missing] = report["missing"]
        self.assertEqual((missing["requirement"], missing["name"]),
                         ("nosuchpkg==2.0", "nosuchpkg"))
        self.assertIn("No matching distribution found for nosuchpkg==2.0", missing["reason"])

    def test_requirements_txt_with_a_script(self):
        with TempDir() as d:
            req = os.path.join(d, "requirements.txt")
            with open(req, "w") as f:
                f.write("tinypkg\nnosuchpkg\n")
            script = os.path.join(d, "main.py")
            with open(script, "w") as f:
                f.write("import tinypkg\nprint('value', tinypkg.VALUE)\n")
            p2 = runcell("run", "--net", self.allow, "--index-url", self.index,
                         "--file", req, script, timeout=300)
        self.assertEqual(p2.returncode, 0, p2.stderr)
        self.assertEqual(p2.stdout, "value 42\n")
        self.assertIn("runcell: package 'nosuchpkg' could not be installed:", p2.stderr)

    def test_install_budget(self):
        # An index that takes the connection and never answers: the install cannot finish,
        # whatever the machine's speed, and the budget must end it.
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        self.addCleanup(silent.close)
        port = silent.getsockname()[1]
        rec, p = run_json("print('started')", "--net", "allow:127.0.0.1:%d" % port,
                          "--index-url", "http://127.0.0.1:%d/simple" % port,
                          "--package", "tinypkg", "--install-timeout", "2", timeout=300)
        self.assertStatus(rec, "ok")
        self.assertEqual(rec["stdout"], "started\n")
        report = rec["packages"]
        self.assertEqual(report["status"], "timeout")
        self.assertIn("budget ran out", report["missing"][0]["reason"])

    def test_bad_options_are_usage_errors(self):
        cases = [
            (["--net", "everything"], "unknown policy 'everything'"),
            (["--net", "allow:"], "empty network allowlist"),
            (["--net", "allow:a.test:70000"], "'70000' is not a port"),
            (["--package", "tinypkg"], "packages can only be installed with a network"),
            (["--net", self.allow, "--package", "--index-url=http://x.test/"],
             "is not a requirement"),
            (["--net", self.allow, "--index-url", "http://other.test/simple"],
             "other.test port 80 is not on the network allowlist"),
        ]
        for opts, msg in cases:
            p = runcell("run", *opts, "-c", "pass")
            self.assertEqual(p.returncode, 2, (opts, p.stderr))
            self.assertIn(msg, p.stderr, opts)


class Api(Served):
    def setUp(self):
        super().setUp()
        self.api = ApiServer("--net-allow-max", "127.0.0.1:%d,*.example.test" % self.port)
        self.addCleanup(self.api.stop)

    def create(self, **body):
        status, info = self.api.call("POST", "/v1/sessions", body)
        self.assertEqual(status, 201, info)
        self.addCleanup(self.api.call, "DELETE", "/v1/sessions/" + info["id"])
        return info

    def execute(self, sid, code):
        status, rec = self.api.call("POST", "/v1/sessions/%s/execute" % sid, {"code": code})
        self.assertEqual(status, 200, rec)
        return rec

    def test_session_with_an_allowlist_logs_every_attempt(self):
        info = self.create(network={"mode": "allowlist",
                                    "allow": ["127.0.0.1:%d" % self.port]})
        self.assertEqual(info["network"]["allow"], ["127.0.0.1:%d" % self.port])
        rec = self.execute(info["id"], FETCH + "print(fetch('http://127.0.0.1:%d/hello.txt'))\n"
                           "print(fetch('http://a.example.test/'))" % self.port)
        self.assertEqual(rec["stdout"].splitlines()[0], "200 hello from the host")
        status, log = self.api.call("GET", "/v1/sessions/%s/events" % info["id"])
        self.assertEqual(status, 200)
        evs = log["events"]
        self.assertEqual([(e["type"], e["host"], e["allowed"]) for e in evs],
                         [("network", "127.0.0.1", True), ("network", "a.example.test", False)])
        self.assertEqual([e["seq"] for e in evs], [1, 2])
        status, later = self.api.call("GET", "/v1/sessions/%s/events?after=1" % info["id"])
        self.assertEqual([e["seq"] for e in later["events"]], [2])
        status, text = self.api.call("GET", "/metrics")
        metrics = dict(l.rsplit(" ", 1) for l in text.splitlines() if not l.startswith("#"))
        self.assertGreaterEqual(int(metrics['runcell_egress_attempts_total{result="allowed"}']), 1)
        self.assertGreaterEqual(int(metrics['runcell_egress_attempts_total{result="refused"}']), 1)
        self.assertGreater(int(metrics['runcell_egress_bytes_total{direction="in"}']), 0)
        self.assertGreater(int(metrics['runcell_egress_bytes_total{direction="out"}']), 0)

    def test_requests_beyond_the_servers_cap_are_400s(self):
        cases = [
            ({"mode": "allowlist", "allow": ["example.test"]},
             "'example.test' is outside what this server allows"),
            ({"mode": "allowlist", "allow": ["127.0.0.1:%d" % (self.port + 1)]},
             "outside what this server allows"),
            ({"mode": "allowlist", "allow": []}, "needs at least one entry"),
            ({"mode": "allowlist", "allow": ["a b"]}, "is not a host name"),
            ({"mode": "open"}, "'open' is not a mode"),
            ({"mode": "none", "allow": ["a.example.test"]}, "needs mode 'allowlist'"),
            ({"mode": "allowlist", "allow": ["a.example.test"], "max_connections": 1000},
             "more than this server allows"),
        ]
        for net, msg in cases:
            status, err = self.api.call("POST", "/v1/sessions", {"network": net})
            self.assertEqual(status, 400, (net, err))
            self.assertIn(msg, err["error"]["message"], net)
        status, err = self.api.call("POST", "/v1/sessions", {"packages": ["tinypkg"]})
        self.assertEqual(status, 400)
        self.assertIn("network allowlist", err["error"]["message"])

    def test_packages_through_the_api(self):
        info = self.create(network={"mode": "allowlist", "allow": ["127.0.0.1:%d" % self.port]},
                           packages=["tinypkg", "nosuchpkg==9"], index_url=self.index)
        self.assertEqual(info["packages"]["installed"], ["tinypkg"])
        self.assertEqual([m["name"] for m in info["packages"]["missing"]], ["nosuchpkg"])
        rec = self.execute(info["id"], "import tinypkg; tinypkg.VALUE")
        self.assertEqual(rec["results"], [{"text/plain": "42"}])
        status, again = self.api.call("GET", "/v1/sessions/" + info["id"])
        self.assertEqual(again["packages"]["missing"][0]["name"], "nosuchpkg")

    def test_connection_cap(self):
        info = self.create(network={"mode": "allowlist", "allow": ["127.0.0.1:%d" % self.port],
                                    "max_connections": 2})
        rec = self.execute(info["id"], """
import socket
held = []
for i in range(2):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=30)
    s.sendall(b"CONNECT 127.0.0.1:PORT HTTP/1.1\\r\\n\\r\\n")
    held.append((s, s.recv(200).split(b"\\r\\n")[0]))
third = socket.create_connection(("127.0.0.1", 3128), timeout=30)
third.sendall(b"CONNECT 127.0.0.1:PORT HTTP/1.1\\r\\n\\r\\n")
print([h for _, h in held])
print(third.recv(500).split(b"\\r\\n")[0].decode())
""".replace("PORT", str(self.port)))
        out = rec["stdout"].splitlines()
        self.assertEqual(out[0], "[b'HTTP/1.1 200 Connection established', "
                                 "b'HTTP/1.1 200 Connection established']")
        self.assertTrue(out[1].startswith("HTTP/1.1 429 Too Many Requests"), out[1])
        self.assertIn("maximum of 2 connections", out[1])

    def test_byte_cap(self):
        with open(os.path.join(self.root, "big.bin"), "wb") as f:
            f.write(b"x" * 200000)
        info = self.create(network={"mode": "allowlist", "allow": ["127.0.0.1:%d" % self.port],
                                    "max_bytes": 50000})
        rec = self.execute(info["id"], FETCH + """
import urllib.request
try:
    n = len(urllib.request.urlopen('http://127.0.0.1:PORT/big.bin', timeout=30).read())
except Exception as e:
    n = type(e).__name__
print(n)
print(fetch('http://127.0.0.1:PORT/hello.txt'))
""".replace("PORT", str(self.port)))
        out = rec["stdout"].splitlines()
        self.assertNotEqual(out[0], "200000")
        self.assertTrue(out[1].startswith("403 ") and "byte budget" in out[1], out)
        reasons = [e.get("reason") or "" for e in rec["network"]]
        self.assertTrue(any("byte budget (50000 bytes) is used up" in r for r in reasons),
                        reasons)
        # Two attempts: the download (allowed, then cut; the cut is an event but not a
        # second attempt) and the fetch after it (refused).
        status, text = self.api.call("GET", "/metrics")
        metrics = dict(l.rsplit(" ", 1) for l in text.splitlines() if not l.startswith("#"))
        self.assertEqual((metrics['runcell_egress_attempts_total{result="allowed"}'],
                          metrics['runcell_egress_attempts_total{result="refused"}']),
                         ("1", "1"))


if __name__ == "__main__":
    unittest.main()
