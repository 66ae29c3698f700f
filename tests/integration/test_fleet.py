"""A fleet: three `runcell serve --fleet --node NAME` processes on 127.0.0.1 sharing the S3 test
server (tests/s3), with HAProxy in front configured by deploy/haproxy/gen. Sessions spread over
the nodes; each kind of route reaches the node named in the session's id; a node killed with
SIGKILL mid-session has its sessions taken over by another node under the same ids (files of
the last execution, variables of the last checkpoint, `resumed: true`); a request that reaches
a node that does not run its session is forwarded to the node that does. Each node holds one
lease in the store; a node that cannot renew it fences itself before it can expire (Fencing,
below, checks from inside the cells that no cell ever runs on two nodes), and one that cannot
even do that (stopped) is killed by its watchdog. The Python client and MCP work through the
router unchanged.

Waits are on events: a port that answers, a server state in HAProxy's stats socket, a line in
a node's log. Skips when haproxy or the S3 test server is missing, unless
RUNCELL_REQUIRE_TEST_SERVERS is set (then they fail)."""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

from mcpclient import HttpClient
from tcpproxy import TcpProxy
from rctest import (HANG, ROOT, RUNCELL, TOKEN, Response, RuncellTestCase, S3Server, free_port,
                    mounts_below, s3_server_missing, wait_until)

sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
from runcell_client import Session  # noqa: E402

GEN = os.path.join(ROOT, "deploy", "haproxy", "gen")
SHIPPED_CFG = os.path.join(ROOT, "deploy", "haproxy", "haproxy.cfg")
FEWEST_LUA = os.path.join(ROOT, "deploy", "haproxy", "fewest.lua")
NODES = ("n1", "n2", "n3")
LEASE_TTL_S = 3  # a dead node's sessions move after this (and a second of clock skew)


def haproxy_missing():
    if os.environ.get("RUNCELL_REQUIRE_TEST_SERVERS"):
        return None
    if not shutil.which("haproxy"):
        return "haproxy is not installed (scripts/install-deps installs Debian's haproxy)"
    return s3_server_missing()


def node_of(sid):
    return sid.rsplit("-", 1)[0]


class Node:
    """One `runcell serve --fleet` on a fixed port (kept across restarts: the router's
    configuration names it) with its own data and run directories."""

    def __init__(self, name, tmp, store_args):
        self.name, self.store_args = name, store_args
        self.port = free_port()
        self.dir = os.path.join(tmp, name)
        self.data_dir = os.path.join(self.dir, "data")
        self.run_dir = os.path.join(self.dir, "run")
        os.makedirs(self.run_dir, 0o755)
        os.chmod(self.dir, 0o755)
        self.log_path = os.path.join(self.dir, "serve.log")
        self.proc = None

    def spawn(self):
        env = dict(os.environ, RUNCELL_RUNDIR=self.run_dir, RUNCELL_LOG="info")
        env.pop("RUNCELL_TOKEN", None)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [RUNCELL, "serve", "--listen", "127.0.0.1:%d" % self.port, "--data",
                 self.data_dir, "--token", TOKEN, "--node", self.name, "--fleet", "--lease-ttl",
                 str(LEASE_TTL_S), "--e2b", "--pool", "1", *self.store_args],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)

    def wait_ready(self):
        def up():
            if self.proc.poll() is not None:
                raise AssertionError("node %s exited:\n%s" % (self.name, self.log()[-4000:]))
            try:
                return self.request("GET", "/healthz", timeout=5).status == 200
            except OSError:
                return False
        if not wait_until(up, HANG):
            raise AssertionError("node %s not ready:\n%s" % (self.name, self.log()[-4000:]))

    def request(self, method, path, body=None, headers=None, timeout=HANG):
        return http_request(self.port, method, path, body, headers, timeout)

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def kill9(self):
        self.proc.kill()
        self.proc.wait()
        for m in reversed(mounts_below(self.run_dir)):  # what a killed server left
            subprocess.run(["umount", "-l", m])

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)  # a stopped one cannot hear SIGTERM
            self.proc.terminate()
            try:
                self.proc.wait(HANG)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def http_request(port, method, path, body=None, headers=None, timeout=HANG):
    h = {"Authorization": "Bearer " + TOKEN}
    h.update(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
        h.setdefault("Content-Type", "application/json")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        return Response(r.status, r.headers, r.read())
    finally:
        conn.close()


class Router:
    """HAProxy in the foreground with a configuration from deploy/haproxy/gen."""

    def __init__(self, tmp, nodes):
        self.port = free_port()
        self.sock = os.path.join(tmp, "haproxy.sock")
        self.cfg = os.path.join(tmp, "haproxy.cfg")
        self.log_path = os.path.join(tmp, "haproxy.log")
        specs = ["%s=127.0.0.1:%d" % (n.name, n.port) for n in nodes]
        # Checks every 200 ms, down after 2 failures: the test waits for these states.
        subprocess.run([sys.executable, GEN, *specs, "--listen", "127.0.0.1:%d" % self.port,
                        "--stats-socket", self.sock, "--inter", "200ms", "--fall", "2",
                        "--rise", "1", "--lua", FEWEST_LUA, "--out", self.cfg], check=True)
        self.check = subprocess.run(["haproxy", "-c", "-f", self.cfg], capture_output=True,
                                    text=True)
        self.proc = None

    def start(self):
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(["haproxy", "-db", "-f", self.cfg],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        if not wait_until(lambda: os.path.exists(self.sock) and self.states() is not None, HANG):
            raise AssertionError("haproxy did not start:\n" + self.log())
        return self

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def states(self):
        """{server: status} of the nodes backend, from the stats socket ("UP", "DOWN", ...)."""
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(10)
            s.connect(self.sock)
            s.sendall(b"show stat\n")
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
            s.close()
        except OSError:
            return None
        lines = data.decode().splitlines()
        if not lines or not lines[0].startswith("# "):
            return None
        cols = lines[0][2:].split(",")
        out = {}
        for line in lines[1:]:
            row = dict(zip(cols, line.split(",")))
            if row.get("pxname") == "nodes" and row.get("svname") not in ("BACKEND", None):
                out[row["svname"]] = row["status"].split(" ")[0]
        return out

    def wait_state(self, node, state):
        if not wait_until(lambda: (self.states() or {}).get(node) == state, HANG):
            raise AssertionError("haproxy never saw %s %s: %r" % (node, state, self.states()))

    def request(self, method, path, body=None, headers=None, timeout=HANG):
        return http_request(self.port, method, path, body, headers, timeout)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(HANG)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@unittest.skipIf(haproxy_missing(), haproxy_missing())
class Fleet(RuncellTestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="runcell-fleet-")
        os.chmod(cls.tmp, 0o755)
        cls.s3 = S3Server(os.path.join(cls.tmp, "s3"))
        os.mkdir(cls.s3.directory)
        cls.s3.start()
        cls.nodes = {}
        try:
            for name in NODES:
                cls.nodes[name] = Node(name, cls.tmp, cls.s3.store_args("fleet"))
            for n in cls.nodes.values():  # started together, as their templates take a while
                n.spawn()
            for n in cls.nodes.values():
                n.wait_ready()
            cls.router = Router(cls.tmp, cls.nodes.values())
            if cls.router.check.returncode != 0:
                raise AssertionError("haproxy -c refused the generated configuration:\n%s%s"
                                     % (cls.router.check.stdout, cls.router.check.stderr))
            cls.router.start()
            for name in NODES:
                cls.router.wait_state(name, "UP")
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        if getattr(cls, "router", None):
            cls.router.stop()
        for n in getattr(cls, "nodes", {}).values():
            n.stop()
        cls.s3.stop()
        if not os.environ.get("RCTEST_KEEP"):
            subprocess.run(["rm", "-rf", "--one-file-system", cls.tmp])

    def setUp(self):
        # Every test starts with the whole fleet up, whatever an earlier one left.
        for n in self.nodes.values():
            if n.proc.poll() is not None:
                n.spawn()
                n.wait_ready()
        for name in NODES:
            self.router.wait_state(name, "UP")

    # ---- helpers ----

    def ok(self, r, status=200):
        if r.status != status:
            raise AssertionError("expected %d, got %r" % (status, r))
        return r.json()

    def create(self, **opts):
        r = self.router.request("POST", "/v1/sessions", opts)
        info = self.ok(r, 201)
        self.assertEqual(r.headers["X-Runcell-Node"], node_of(info["id"]))
        return info["id"]

    def execute(self, sid, code, via=None):
        r = (via or self.router).request("POST", "/v1/sessions/%s/execute" % sid, {"code": code})
        return r, self.ok(r)

    def counts(self):
        """{node: sessions}, as each node's own /healthz says."""
        return {name: self.ok(n.request("GET", "/healthz"))["sessions"]
                for name, n in self.nodes.items()}

    def router_counts(self):
        """{node: sessions}, as the router knows them (GET /router/nodes)."""
        return {name: v["sessions"] for name, v in
                self.ok(self.router.request("GET", "/router/nodes"))["nodes"].items()}

    def create_on_fewest(self):
        """A new session through the router, once the router knows what the nodes hold (it
        asks them every 500 ms): it goes to one of the nodes with the fewest sessions."""
        counts = {}

        def known():
            counts.clear()
            counts.update(self.counts())
            return self.router_counts() == counts
        if not wait_until(known, HANG):
            raise AssertionError("the router never knew the nodes' counts: %r, it has %r"
                                 % (counts, self.router_counts()))
        sid = self.create()
        least = min(counts.values())
        self.assertIn(node_of(sid), [n for n, c in counts.items() if c == least], counts)
        return sid

    def stored(self, sid, name):
        """sessions/SID/NAME in the shared store, as s3rver keeps it."""
        path = os.path.join(self.s3.directory, self.s3.bucket, "fleet", "sessions", sid,
                            name + "._S3rver_object")
        with open(path) as f:
            return json.load(f)

    def record(self, sid):
        """The session's record and lease in the shared store."""
        return self.stored(sid, "lease.json")

    def stored_list(self, sid):
        """The session's file list in the shared store."""
        return self.stored(sid, "manifest.json")

    def owner_session(self, **opts):
        """A new session, its id, and its node."""
        sid = self.create(**opts)
        return sid, self.nodes[node_of(sid)]

    # ---- configuration ----

    def test_generated_configuration_is_valid_and_the_shipped_one_is_current(self):
        self.assertEqual(self.router.check.returncode, 0, self.router.check.stderr)
        shipped = subprocess.run(
            [sys.executable, GEN, "--statefulset", "runcell", "--replicas", "3"],
            capture_output=True, text=True, check=True).stdout
        with open(SHIPPED_CFG) as f:
            self.assertEqual(f.read().split("\n", 2)[2], shipped.split("\n", 2)[2],
                             "deploy/haproxy/haproxy.cfg is not what gen makes: regenerate it")
        # Pod names do not resolve here: HAProxy starts without their addresses (init-addr
        # none) and learns them from the cluster's DNS. fewest.lua is where the router's
        # ConfigMap puts it there, and in the tree here.
        with open(SHIPPED_CFG) as f:
            text = f.read()
        self.assertIn("lua-load /usr/local/etc/haproxy/fewest.lua\n", text)
        local = os.path.join(self.tmp, "shipped.cfg")
        with open(local, "w") as f:
            f.write(text.replace("/usr/local/etc/haproxy/fewest.lua", FEWEST_LUA))
        c = subprocess.run(["haproxy", "-c", "-f", local], capture_output=True, text=True)
        self.assertEqual(c.returncode, 0, c.stdout + c.stderr)
        bad = subprocess.run([sys.executable, GEN, "Bad_Name=127.0.0.1:1"], capture_output=True,
                             text=True)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("DNS label", bad.stderr)

    def test_a_bad_node_name_is_refused(self):
        r = subprocess.run([RUNCELL, "serve", "--node", "Not_A-Label", "--listen",
                            "127.0.0.1:%d" % free_port(), "--data",
                            os.path.join(self.tmp, "bad")], capture_output=True, text=True,
                           timeout=HANG)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--node 'Not_A-Label' is not a short DNS label", r.stderr)

    def test_a_store_that_ignores_conditional_writes_is_refused(self):
        # s3rver alone (without tests/s3/server.js's conditional writes) replaces an object
        # whatever If-None-Match says, as S3-compatible servers without them do: leases on
        # it would not keep two nodes apart, so a --fleet node refuses to start on it.
        plain = S3Server(os.path.join(self.tmp, "s3-plain"))
        os.mkdir(plain.directory)
        os.environ["RUNCELL_S3_TEST_PLAIN_PUT"] = "1"
        try:
            plain.start()
        finally:
            del os.environ["RUNCELL_S3_TEST_PLAIN_PUT"]
        self.addCleanup(plain.stop)
        r = subprocess.run([RUNCELL, "serve", "--fleet", "--node", "lonely", "--listen",
                            "127.0.0.1:%d" % free_port(), "--data",
                            os.path.join(self.tmp, "plain-data"), "--token", TOKEN,
                            *plain.store_args("fleet")], capture_output=True, text=True,
                           timeout=HANG)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("ignores conditional writes", r.stderr)

    def test_a_node_that_cannot_renew_its_lease_fences_itself_then_rejoins(self):
        own = S3Server(os.path.join(self.tmp, "s3-outage"))
        os.mkdir(own.directory)
        own.start()
        self.addCleanup(own.stop)
        n = Node("lone", os.path.join(self.tmp, "outage"), own.store_args("fleet"))
        n.spawn()
        self.addCleanup(n.stop)
        n.wait_ready()
        health = self.ok(n.request("GET", "/healthz"))
        self.assertEqual((health["fleet"]["state"], health["fleet"]["epoch"]), ("live", 1))
        sid = self.ok(n.request("POST", "/v1/sessions", {}), 201)["id"]
        self.execute(sid, "x = 7\nopen('kept.txt', 'w').write('k')", via=n)
        self.ok(n.request("POST", "/v1/sessions/%s/checkpoint" % sid, {}))
        own.stop()
        # Renewals fail: /healthz says so at once; the node fences itself before its lease can
        # expire (it refuses work, with why), then drops the session it can no longer hold.
        self.assertTrue(wait_until(lambda: n.request("GET", "/healthz").status == 503, HANG))
        self.assertTrue(wait_until(lambda: "dropping every session" in n.log(), HANG), n.log())
        r = n.request("POST", "/v1/sessions/%s/execute" % sid, {"code": "x"})
        self.assertEqual(r.status, 503, r)
        self.assertEqual(r.json()["error"]["code"], "node_fenced")
        self.assertIn("could not renew its lease in the store", r.json()["error"]["message"])
        self.assertIn("Retry-After", r.headers)
        health = n.request("GET", "/healthz")
        self.assertEqual(health.status, 503)
        self.assertIn("cannot reach the store", health.json()["reason"])
        own.start()  # the same directory and port
        # It joins again at a new epoch, and takes the session back from the store as any
        # node would: files and the checkpoint's variables.
        self.assertTrue(wait_until(lambda: n.request("GET", "/healthz").status == 200, HANG))
        self.assertEqual(self.ok(n.request("GET", "/healthz"))["fleet"]["epoch"], 2)
        r, rec = self.execute(sid, "import os\nprint(x, os.listdir('.'))", via=n)
        self.assertEqual(rec["stdout"], "7 ['kept.txt']\n")
        self.assertTrue(rec["resumed"])

    def test_a_lease_ttl_under_three_seconds_is_refused(self):
        r = subprocess.run([RUNCELL, "serve", "--fleet", "--lease-ttl", "2.5", "--listen",
                            "127.0.0.1:%d" % free_port(), "--data",
                            os.path.join(self.tmp, "ttl-data"), "--token", TOKEN,
                            *self.s3.store_args("ttl")], capture_output=True, text=True,
                           timeout=HANG)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("a lease ttl under 3000 ms leaves no time to renew it and to fence the "
                      "node before it expires", r.stderr)

    def test_a_shared_directory_holds_records_and_leases(self):
        d = os.path.join(self.tmp, "local-fleet")
        n = Node("solo", d, ["--store", os.path.join(d, "store")])
        n.spawn()
        try:
            n.wait_ready()
            sid = self.ok(n.request("POST", "/v1/sessions", {"memory_mb": 300}), 201)["id"]
            self.assertTrue(sid.startswith("solo-"), sid)
            with open(os.path.join(d, "store", "nodes", "solo.json")) as f:
                lease = json.load(f)
            self.assertEqual((lease["node"], lease["state"], lease["epoch"]), ("solo", "live", 1))
            self.assertGreater(lease["expires_ms"], time.time() * 1000)
            self.assertEqual(lease["advertise"], "127.0.0.1:%d" % n.port)
            with open(os.path.join(d, "store", "sessions", sid, "lease.json")) as f:
                rec = json.load(f)
            # A session's record names its node and that node's epoch; it has no expiry of
            # its own: the node lease is what is renewed.
            self.assertEqual((rec["node"], rec["epoch"], rec["state"], rec["generation"]),
                             ("solo", 1, "live", 1))
            self.assertNotIn("expires_ms", rec)
            self.assertEqual(rec["options"]["memory_mb"], 300)
            self.ok(n.request("DELETE", "/v1/sessions/%s?checkpoint=true" % sid))
            with open(os.path.join(d, "store", "sessions", sid, "lease.json")) as f:
                rec = json.load(f)
            self.assertEqual(rec["state"], "checkpointed")
        finally:
            n.stop()
        with open(os.path.join(d, "store", "nodes", "solo.json")) as f:
            self.assertEqual(json.load(f)["state"], "released")  # a graceful stop frees it

    def test_the_file_list_is_fenced_by_the_lease_generation(self):
        """What a node stores for a session is stamped with its lease's generation and
        written by compare-and-swap: a list of a later generation (a successor took the
        session over while this node did not know yet) is never written over, and one of an
        earlier generation (a node that had lost the lease) is. The other node's writes are
        made here by hand, in a shared directory store."""
        d = os.path.join(self.tmp, "fenced-fleet")
        n = Node("solo", d, ["--store", os.path.join(d, "store")])
        n.spawn()
        try:
            n.wait_ready()
            sid = self.ok(n.request("POST", "/v1/sessions", {}), 201)["id"]
            path = os.path.join(d, "store", "sessions", sid, "manifest.json")

            def execute(code):
                return self.ok(n.request("POST", "/v1/sessions/%s/execute" % sid,
                                         {"code": code}))

            def stored():
                with open(path) as f:
                    return json.load(f)

            def write_as_another_node(generation, files):
                m = dict(stored(), lease_generation=generation, files=files)
                with open(path + ".tmp", "w") as f:
                    json.dump(m, f)
                os.rename(path + ".tmp", path)

            execute("open('a.txt', 'w').write('a')")
            self.assertEqual(stored()["lease_generation"], 1)
            # An older node's list is replaced by this node's next save.
            write_as_another_node(0, [])
            rec = execute("open('b.txt', 'w').write('b')")
            self.assertNotIn("persist_error", rec)
            self.assertEqual((stored()["lease_generation"],
                              sorted(f["path"] for f in stored()["files"])),
                             (1, ["a.txt", "b.txt"]))
            # A later generation's list stays: this node's save says why it did not write.
            write_as_another_node(7, [])
            rec = execute("open('c.txt', 'w').write('c')")
            self.assertIn("moved to another node: the file list in the store is of its lease "
                          "generation 7, this node's is 1", rec["persist_error"])
            self.assertEqual((stored()["lease_generation"], stored()["files"]), (7, []))
        finally:
            n.stop()

    # ---- routing ----

    def test_sessions_spread_over_the_nodes_and_each_route_reaches_its_node(self):
        # Each new session goes to a node with the fewest (create_on_fewest asserts it, as
        # the router knew them when it placed it): the nodes even out.
        sids = [self.create_on_fewest() for _ in range(6)]
        for sid in sids:
            node = node_of(sid)
            base = "/v1/sessions/" + sid
            calls = [("GET", base, None, 200), ("POST", base + "/execute", {"code": "v = 1"}, 200),
                     ("PUT", base + "/files/a.txt", "hello", 201),
                     ("GET", base + "/files/a.txt", None, 200), ("GET", base + "/files", None, 200),
                     ("GET", base + "/events", None, 200),
                     ("POST", base + "/interrupt", {}, 200),
                     ("POST", base + "/checkpoint", {}, 200)]
            for method, path, body, status in calls:
                r = self.router.request(method, path, body)
                self.assertIn(r.status, (status, 200), (method, path, r))
                self.assertEqual(r.headers["X-Runcell-Node"], node, (method, path))
                self.assertNotIn("X-Runcell-Resumed", r.headers)
            self.assertEqual(self.router.request("GET", base + "/files/a.txt").body, b"hello")
        for sid in sids:
            r = self.router.request("DELETE", "/v1/sessions/" + sid)
            self.ok(r)
            self.assertEqual(r.headers["X-Runcell-Node"], node_of(sid))
        # Requests that name no session go anywhere healthy.
        rec = self.ok(self.router.request("POST", "/v1/execute", {"code": "print(6 * 7)"}))
        self.assertEqual(rec["stdout"], "42\n")
        self.assertIn(self.ok(self.router.request("GET", "/healthz"))["node"], NODES)

    def test_new_sessions_go_to_the_nodes_with_the_fewest(self):
        """Sessions made on n1 directly (not through the router) count: the router places
        new ones on the other nodes until n1 is no longer ahead."""
        direct = []
        try:
            while True:
                c = self.counts()
                if c["n1"] >= min(c.values()) + 3:
                    break
                direct.append(self.ok(self.nodes["n1"].request("POST", "/v1/sessions", {}),
                                      201)["id"])
            routed = [self.create_on_fewest() for _ in range(2)]
            self.assertNotIn("n1", [node_of(s) for s in routed])
            view = self.ok(self.router.request("GET", "/router/nodes"))["nodes"]
            self.assertEqual(sorted(view), list(NODES))
            self.assertEqual({v["status"] for v in view.values()}, {"UP"})
            self.assertTrue(all(v["age_ms"] < 60000 for v in view.values()), view)
        finally:
            for sid in direct:
                self.ok(self.nodes["n1"].request("DELETE", "/v1/sessions/" + sid))
        for sid in routed:
            self.ok(self.router.request("DELETE", "/v1/sessions/" + sid))

    def test_e2b_routes_reach_the_sandbox_node(self):
        key = {"X-API-KEY": TOKEN}
        box = self.ok(self.router.request("POST", "/sandboxes", {"templateID": "code-interpreter-v1"},
                                          headers=key), 201)
        sid = box["sandboxID"]
        node = node_of(sid)
        self.assertIn(node, NODES)
        r = self.router.request("GET", "/sandboxes/" + sid, headers=key)
        self.ok(r)
        self.assertEqual(r.headers["X-Runcell-Node"], node)
        r = self.router.request("GET", "/contexts", headers={"E2b-Sandbox-Id": sid})
        self.ok(r)
        self.assertEqual(r.headers["X-Runcell-Node"], node)
        r = self.router.request("POST", "/execute", {"code": "1 + 1"},
                                headers={"E2b-Sandbox-Id": sid,
                                         "X-Access-Token": box["envdAccessToken"]})
        self.assertEqual(r.status, 200, r)  # NDJSON events
        self.assertEqual(r.headers["X-Runcell-Node"], node)
        events = [json.loads(line) for line in r.body.splitlines() if line.strip()]
        self.assertIn("2", json.dumps(events))
        # A node that does not hold the sandbox forwards to the one named in its id: E2B's
        # sandboxes (and MCP's sessions) never move, so the id is all it needs.
        other = next(n for n in self.nodes.values() if n.name != node)
        r = other.request("GET", "/sandboxes/" + sid, headers=key)
        self.assertEqual((r.status, r.headers["X-Runcell-Node"]), (200, node), r)
        self.assertEqual(r.headers["X-Runcell-Forwarded-By"], other.name)
        r = other.request("POST", "/execute", {"code": "21 * 2"},
                          headers={"E2b-Sandbox-Id": sid,
                                   "X-Access-Token": box["envdAccessToken"]})
        self.assertEqual((r.status, r.headers["X-Runcell-Node"]), (200, node), r)
        self.assertIn("42", r.body.decode())
        r = self.router.request("DELETE", "/sandboxes/" + sid, headers=key)
        self.assertEqual(r.status, 204, r)
        self.assertEqual(r.headers["X-Runcell-Node"], node)

    def test_mcp_through_the_router(self):
        c = HttpClient(self.router.port, TOKEN)
        c.initialize()
        self.assertIn(node_of(c.session), NODES)
        # Another node would not know the MCP session (404): each call reaching it proves
        # the pin.
        for i in range(3):
            resp = c.call_tool("run_code", {"code": "print(%d * 2)" % i})
            self.assertIn(str(i * 2), json.dumps(resp["result"]), resp)
        # Sent to another node, a call is forwarded to the session's.
        other = next(n for n in self.nodes.values() if n.name != node_of(c.session))
        stray = HttpClient(other.port, TOKEN)
        stray.session, stray.version = c.session, c.version
        resp = stray.call_tool("run_code", {"code": "print(21 * 2)"})
        self.assertIn("42", json.dumps(resp["result"]), resp)

    def test_python_client_through_the_router(self):
        with Session("http://127.0.0.1:%d" % self.router.port, TOKEN) as s:
            self.assertIn(node_of(s.id), NODES)
            self.assertEqual(s.run("x = 20")["status"], "ok")
            self.assertEqual(s.run("x += 22\nx")["results"], [{"text/plain": "42"}])
            s.upload("data.txt", b"payload")
            self.assertEqual(s.download("data.txt"), b"payload")

    # ---- takeover ----

    def test_a_killed_node_s_session_moves_and_is_forwarded_to_after_it_restarts(self):
        # Its network allowlist moves with it (nothing connects: the proxy is not tried).
        allow = ["127.0.0.1:%d" % free_port()]
        sid, home = self.owner_session(network={"mode": "allowlist", "allow": allow})
        self.execute(sid, "x = 41\nopen('a.txt', 'w').write('kept')")
        self.ok(self.router.request("POST", "/v1/sessions/%s/checkpoint" % sid, {}))
        self.execute(sid, "y = 2\nopen('b.txt', 'w').write('also kept')")
        home.kill9()
        self.router.wait_state(home.name, "DOWN")
        # The node the session id hashes to among those left waits for the dead node's lease
        # to expire and takes the session over.
        r, rec = self.execute(sid, "import os\nprint(x + 1, sorted(os.listdir('.')))\n"
                                   "print('y' in dir())")
        successor = r.headers["X-Runcell-Node"]
        self.assertNotEqual(successor, home.name)
        self.assertEqual(r.headers["X-Runcell-Resumed"], "true")
        self.assertEqual(rec["stdout"], "42 ['a.txt', 'b.txt']\nFalse\n")
        self.assertTrue(rec["resumed"])
        self.assertEqual((rec["previous_node"], rec["node"]), (home.name, successor))
        self.assertIn("variables since the last checkpoint", rec["lost"])
        self.assertEqual(sorted(rec["restored"]["files"]), ["a.txt", "b.txt"])
        self.assertIn("x", rec["restored"]["variables"])
        self.assertEqual(self.record(sid)["node"], successor)
        # The successor made the stored file list its own before it ran anything.
        self.assertEqual(self.stored_list(sid)["lease_generation"], 2)
        for _ in range(3):  # every request of the session goes to that same successor
            r, rec = self.execute(sid, "z = x + 100")
            self.assertEqual(r.headers["X-Runcell-Node"], successor)
            self.assertNotIn("resumed", rec)
        info = self.ok(self.router.request("GET", "/v1/sessions/" + sid))
        self.assertEqual(info["id"], sid)
        self.assertEqual((info["network"]["mode"], info["network"]["allow"]),
                         ("allowlist", allow))
        # The killed node restarts (at a new epoch). Its copy of the session died with it; the
        # router sends the session's requests to it again (the id names it), and it forwards
        # them to the node that runs the session now: nothing moves, nothing is lost.
        home.spawn()
        home.wait_ready()
        self.router.wait_state(home.name, "UP")
        t0 = time.monotonic()
        r, rec = self.execute(sid, "print(x, z)")
        self.assertEqual(rec["stdout"], "41 141\n")
        self.assertEqual((r.headers["X-Runcell-Node"], r.headers["X-Runcell-Forwarded-By"]),
                         (successor, home.name))
        self.assertNotIn("resumed", rec)
        self.assertLess(time.monotonic() - t0, 10)
        info = self.ok(home.request("GET", "/v1/sessions/" + sid))
        self.assertEqual(info["network"]["allow"], allow)
        rec_store = self.record(sid)
        self.assertEqual((rec_store["node"], rec_store["generation"]), (successor, 2))
        self.assertEqual(self.ok(home.request("GET", "/healthz"))["fleet"]["epoch"], 2)
        self.ok(self.router.request("DELETE", "/v1/sessions/" + sid))

    def test_a_request_to_another_node_is_forwarded_to_the_session_s_node(self):
        sid, home = self.owner_session()
        other = next(n for n in self.nodes.values() if n is not home)
        self.execute(sid, "x = 6", via=home)
        # Once the other node knows the owner's lease (its first lookup reads the store), an
        # answer through it costs about a round trip more than one to the owner.
        self.execute(sid, "x", via=other)
        t0 = time.monotonic()
        r, rec = self.execute(sid, "x * 7", via=other)
        forwarded_s = time.monotonic() - t0
        self.assertEqual(rec["results"], [{"text/plain": "42"}])
        self.assertEqual((r.headers["X-Runcell-Node"], r.headers["X-Runcell-Forwarded-By"]),
                         (home.name, other.name))
        self.assertLess(forwarded_s, 2, "a forwarded request took %.2f s" % forwarded_s)
        # A streamed answer streams through: NDJSON events, as the owner sends them.
        conn = http.client.HTTPConnection("127.0.0.1", other.port, timeout=HANG)
        conn.request("POST", "/v1/sessions/%s/execute" % sid,
                     body=json.dumps({"code": "import time\nfor i in range(3):\n"
                                              "    print(i, flush=True); time.sleep(0.3)"}),
                     headers={"Authorization": "Bearer " + TOKEN,
                              "Accept": "application/x-ndjson"})
        resp = conn.getresponse()
        self.assertEqual(resp.status, 200)
        arrivals = []
        for line in resp:
            if line.strip():
                arrivals.append((time.monotonic(), json.loads(line)))
        conn.close()
        stdout = [e for _, e in arrivals if e["type"] == "stdout"]
        self.assertEqual("".join(e["data"] for e in stdout), "0\n1\n2\n")
        self.assertGreater(arrivals[-1][0] - arrivals[0][0], 0.5)  # not all at the end
        # A streamed body streams through too: 8 MiB up and down again.
        blob = os.urandom(8 << 20)
        r = other.request("PUT", "/v1/sessions/%s/files/big.bin" % sid, blob)
        self.assertEqual(r.status, 201, r)
        self.assertEqual(r.headers["X-Runcell-Node"], home.name)
        r = other.request("GET", "/v1/sessions/%s/files/big.bin" % sid)
        self.assertEqual((r.status, len(r.body), r.body == blob), (200, len(blob), True))
        # The owner's own errors come back as the owner said them.
        r = other.request("POST", "/v1/sessions/%s/execute" % sid, {"code": 1})
        self.assertEqual(r.status, 400, r)
        self.assertEqual(r.headers["X-Runcell-Node"], home.name)
        self.assertIn("forwarding to the session's node", other.log())
        self.ok(other.request("DELETE", "/v1/sessions/" + sid))
        r = home.request("GET", "/v1/sessions/" + sid)
        self.assertEqual(r.status, 404, r)

    def test_concurrent_requests_during_a_takeover_are_served_by_the_winner(self):
        sid, home = self.owner_session()
        self.execute(sid, "x = 3", via=home)
        self.ok(home.request("POST", "/v1/sessions/%s/checkpoint" % sid, {}))
        home.kill9()
        self.router.wait_state(home.name, "DOWN")
        others = [n for n in self.nodes.values() if n is not home]
        results = []

        def call(node):
            results.append((node.name, node.request("GET", "/v1/sessions/" + sid)))
        # Six requests at once, three to each other node: one node wins the takeover, and it
        # serves every request, its own (which wait for its takeover) and those the loser
        # forwards to it.
        threads = [threading.Thread(target=call, args=(n,)) for n in others * 3]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        statuses = [(name, r.status, r.body) for name, r in results]
        self.assertTrue(all(r.status == 200 for _, r in results), statuses)
        served_by = {r.headers["X-Runcell-Node"] for _, r in results}
        self.assertEqual(len(served_by), 1, statuses)
        self.assertEqual(sum(1 for _, r in results if r.json().get("resumed")), 1, statuses)
        r, rec = self.execute(sid, "print(x)")
        self.assertEqual((r.headers["X-Runcell-Node"], rec["stdout"]), (served_by.pop(), "3\n"))
        self.ok(self.router.request("DELETE", "/v1/sessions/" + sid))

    def test_a_stopping_node_answers_at_once_and_its_sessions_move_checkpointed(self):
        sid, home = self.owner_session()
        self.execute(sid, "x = 5", via=home)
        other = next(n for n in self.nodes.values() if n is not home)
        kept = http.client.HTTPConnection("127.0.0.1", home.port, timeout=HANG)
        kept.request("GET", "/healthz")
        kept.getresponse().read()
        # A cell that runs a while holds the stop in its grace period.
        busy = threading.Thread(target=lambda: home.request(
            "POST", "/v1/sessions/%s/execute" % sid, {"code": "import time\ntime.sleep(2)"}))
        busy.start()
        self.assertTrue(wait_until(lambda: self.ok(home.request(
            "GET", "/v1/sessions/" + sid))["status"] == "busy", HANG))
        home.proc.send_signal(signal.SIGTERM)
        self.assertTrue(wait_until(lambda: "shutting down" in home.log(), HANG))
        # A request on a connection already open is answered at once, with when to retry.
        t0 = time.monotonic()
        kept.request("GET", "/v1/sessions/" + sid, headers={"Authorization": "Bearer " + TOKEN})
        r = kept.getresponse()
        body = json.loads(r.read())
        kept.close()
        self.assertLess(time.monotonic() - t0, 1.0)
        self.assertEqual((r.status, body["error"]["code"], r.headers["Retry-After"]),
                         (503, "shutting_down", "1"))
        # Another node serves the session once the stopping one has checkpointed it and
        # released its record: with its variables, and without waiting out a lease.
        t0 = time.monotonic()
        r, rec = self.execute(sid, "print(x)", via=other)
        self.assertEqual((rec["stdout"], rec["resumed"]), ("5\n", True))
        self.assertIn("variables since the last checkpoint", rec["lost"])
        busy.join()
        home.proc.wait(HANG)
        self.assertEqual(home.proc.returncode, 0, home.log()[-2000:])
        self.assertEqual(self.record(sid)["previous_node"], home.name)
        self.ok(other.request("DELETE", "/v1/sessions/" + sid))

    def test_closed_sessions_are_not_taken_over(self):
        sid, home = self.owner_session()
        self.execute(sid, "open('f', 'w').write('x')")
        self.ok(self.router.request("DELETE", "/v1/sessions/" + sid))
        other = next(n for n in self.nodes.values() if n is not home)
        r = other.request("POST", "/v1/sessions/%s/execute" % sid, {"code": "1"})
        self.assertEqual(r.status, 404, r)


TICKER = ("import time\n"
          "f = open('ticks', 'a', buffering=1)\n"
          "while True:\n"
          "    f.write('%d\\n' % time.time_ns())\n"
          "    time.sleep(0.005)\n")


@unittest.skipIf(haproxy_missing(), haproxy_missing())
class Fencing(RuncellTestCase):
    """Two nodes, each reaching the S3 test server through a TCP proxy of its own (tests/lib/
    tcpproxy.py), so that one node's store can be cut off or slowed while the other's works.
    A cell on node A writes the time into a file of its workspace every 5 ms; the test keeps
    that file open from the host, so it reads every tick A's cell wrote even after A dropped
    the session. After A is stopped, cut off from the store, or given a store slower than its
    renewals' deadline, node B takes the session over and its first cell prints the time: the
    last tick of A's cell must come before it. No cell runs on two nodes."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="runcell-fencing-")
        os.chmod(cls.tmp, 0o755)
        cls.s3 = S3Server(os.path.join(cls.tmp, "s3"))
        os.mkdir(cls.s3.directory)
        cls.s3.start()
        cls.proxies = {n: TcpProxy(cls.s3.port) for n in ("fa", "fb")}
        cls.nodes = {}
        try:
            for name, proxy in cls.proxies.items():
                args = cls.s3.store_args("fencing")
                args[args.index("--s3-endpoint") + 1] = proxy.endpoint
                cls.nodes[name] = Node(name, cls.tmp, args)
            for n in cls.nodes.values():
                n.spawn()
            for n in cls.nodes.values():
                n.wait_ready()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        for n in getattr(cls, "nodes", {}).values():
            n.stop()
        for m in reversed(mounts_below(cls.tmp)):  # what a node its watchdog killed left
            subprocess.run(["umount", "-l", m])
        for p in getattr(cls, "proxies", {}).values():
            p.close()
        cls.s3.stop()
        if not os.environ.get("RCTEST_KEEP"):
            subprocess.run(["rm", "-rf", "--one-file-system", cls.tmp])

    def setUp(self):
        for p in self.proxies.values():
            p.resume()
            p.set_delay(0)
        for n in self.nodes.values():
            if n.proc.poll() is not None:
                for m in reversed(mounts_below(n.run_dir)):
                    subprocess.run(["umount", "-l", m])
                n.spawn()
            n.wait_ready()
            if not wait_until(lambda: n.request("GET", "/healthz").status == 200, HANG):
                raise AssertionError("node %s never healthy:\n%s" % (n.name, n.log()[-3000:]))

    def ok(self, r, status=200):
        if r.status != status:
            raise AssertionError("expected %d, got %r" % (status, r))
        return r.json()

    def ticks_file(self, node):
        """The ticker's file, opened from the host, once it has a tick in it."""
        found = []

        def look():
            for m in mounts_below(node.run_dir):
                p = os.path.join(m, "ticks")
                if os.path.exists(p) and os.path.getsize(p) > 0:
                    found.append(open(p))
                    return True
            return False
        if not wait_until(look, HANG):
            raise AssertionError("the ticker never wrote on %s" % node.name)
        return found[0]

    def no_cell_on_two_nodes(self, fault, a_is_done):
        a, b = self.nodes["fa"], self.nodes["fb"]
        sid = self.ok(a.request("POST", "/v1/sessions", {}), 201)["id"]
        self.ok(a.request("POST", "/v1/sessions/%s/execute" % sid, {"code": "x = 1"}))
        self.ok(a.request("POST", "/v1/sessions/%s/checkpoint" % sid, {}))
        ticker = threading.Thread(target=lambda: a.request(
            "POST", "/v1/sessions/%s/execute" % sid, {"code": TICKER}, timeout=HANG),
            daemon=True)
        ticker.start()
        ticks = self.ticks_file(a)
        t_fault = time.time_ns()
        fault()
        # B serves the session once A's lease has lapsed: until then, A answers for it (503
        # while fenced, or not at all while stopped), and B forwards or waits.
        answers = []

        def b_runs_it():
            try:
                r = b.request("POST", "/v1/sessions/%s/execute" % sid,
                              {"code": "import time\nprint(time.time_ns())\nprint(x)"},
                              timeout=HANG)
            except OSError as e:
                answers.append(repr(e))
                return False
            answers.append((r.status, r.headers.get("X-Runcell-Node")))
            return r.status == 200 and r.headers["X-Runcell-Node"] == "fb" and r.json()
        rec = []
        self.assertTrue(wait_until(lambda: rec.append(b_runs_it()) or rec[-1], HANG), answers)
        first_b, x = rec[-1]["stdout"].split()
        self.assertEqual((x, rec[-1]["resumed"]), ("1", True))
        self.assertTrue(wait_until(a_is_done, HANG), a.log()[-3000:])
        lines = ticks.read().split()
        ticks.close()
        last_a = int(lines[-1])
        self.assertGreater(last_a, t_fault)  # A's cell was running when the fault began
        self.assertLess(last_a, int(first_b),
                        "A's cell ticked %.3f s after B's cell began" %
                        ((last_a - int(first_b)) / 1e9))
        return sid, (int(first_b) - last_a) / 1e9

    def fenced_then_rejoins(self, sid):
        a = self.nodes["fa"]
        self.assertTrue(wait_until(lambda: a.request("GET", "/healthz").status == 200, HANG))
        # Back at a new epoch, A forwards the session's requests to B, which runs it now.
        r = a.request("POST", "/v1/sessions/%s/execute" % sid, {"code": "print(x)"})
        self.assertEqual((r.status, r.headers["X-Runcell-Node"]), (200, "fb"), r)
        self.ok(a.request("DELETE", "/v1/sessions/" + sid))

    def test_a_stopped_node_is_killed_by_its_watchdog_before_its_lease_lapses(self):
        a = self.nodes["fa"]
        sid, gap = self.no_cell_on_two_nodes(lambda: os.kill(a.proc.pid, signal.SIGSTOP),
                                             lambda: a.proc.poll() is not None)
        self.assertEqual(a.proc.returncode, -signal.SIGKILL)
        self.assertIn("runcell watchdog: the node's fleet lease reached its hard deadline",
                      a.log())
        self.ok(self.nodes["fb"].request("DELETE", "/v1/sessions/" + sid))

    def test_a_node_cut_off_from_the_store_fences_itself(self):
        a, proxy = self.nodes["fa"], self.proxies["fa"]
        sid, gap = self.no_cell_on_two_nodes(
            proxy.pause, lambda: "dropping every session" in a.log())
        self.assertIsNone(a.proc.poll())  # it fenced itself: the watchdog had nothing to do
        self.assertIn("refusing new work and interrupting running cells", a.log())
        r = a.request("GET", "/healthz")
        self.assertEqual(r.status, 503)
        proxy.resume()
        self.fenced_then_rejoins(sid)

    def test_a_node_whose_store_is_too_slow_fences_itself(self):
        a, proxy = self.nodes["fa"], self.proxies["fa"]
        # Each store request takes longer than a renewal may (a third of the ttl).
        sid, gap = self.no_cell_on_two_nodes(
            lambda: proxy.set_delay(LEASE_TTL_S * 0.8),
            lambda: "dropping every session" in a.log())
        self.assertIsNone(a.proc.poll())
        proxy.set_delay(0)
        self.fenced_then_rejoins(sid)

    def test_a_slow_store_within_the_renewal_deadline_costs_no_session(self):
        """40 ms more per store request, as a distant S3 has: the node keeps every session,
        and requests that reach the other node are forwarded to it, never taken over."""
        a, b, proxy = self.nodes["fa"], self.nodes["fb"], self.proxies["fa"]
        sids = [self.ok(a.request("POST", "/v1/sessions", {}), 201)["id"] for _ in range(6)]
        for i, sid in enumerate(sids):
            self.ok(a.request("POST", "/v1/sessions/%s/execute" % sid, {"code": "x = %d" % i}))
        fenced_before = a.log().count("fencing")
        proxy.set_delay(0.04)
        renewals = self.ok(a.request("GET", "/healthz"))["fleet"]["renewals"]
        # Two ttls of stray requests for every session, to the other node.
        end = time.monotonic() + 2 * LEASE_TTL_S
        while time.monotonic() < end:
            for i, sid in enumerate(sids):
                r = b.request("POST", "/v1/sessions/%s/execute" % sid, {"code": "print(x)"})
                self.assertEqual((r.status, r.headers["X-Runcell-Node"]), (200, "fa"), r)
                self.assertEqual(r.json()["stdout"], "%d\n" % i)
                self.assertNotIn("resumed", r.json())
        lease = self.ok(a.request("GET", "/healthz"))["fleet"]
        self.assertGreater(lease["renewals"], renewals)
        self.assertLess(lease["worst_renewal_gap_ms"], LEASE_TTL_S * 1000 / 3 + 1000, lease)
        self.assertEqual(a.log().count("fencing"), fenced_before)
        proxy.set_delay(0)
        for sid in sids:
            self.ok(a.request("DELETE", "/v1/sessions/" + sid))


K8S_DIR = os.path.join(ROOT, "deploy", "kubernetes")


def yaml_missing():
    try:
        import yaml  # noqa: F401
    except ImportError:
        return "PyYAML is not installed (scripts/install-deps installs python3-yaml)"
    return None


def k8s_schema_missing():
    if os.environ.get("RUNCELL_REQUIRE_TEST_SERVERS"):
        return None
    try:
        import kubernetes.client  # noqa: F401
    except ImportError:
        return "the Kubernetes API models are not installed (apt-get install python3-kubernetes)"
    return None


def schema_errors(obj, type_name, path):
    """Where obj does not fit the Kubernetes API type type_name (python3-kubernetes' models:
    field names and value types), as a list of messages."""
    import kubernetes.client as kc
    if type_name.startswith("list["):
        if not isinstance(obj, list):
            return ["%s: a list expected" % path]
        return [e for i, x in enumerate(obj) for e in schema_errors(x, type_name[5:-1],
                                                                    "%s[%d]" % (path, i))]
    if type_name.startswith("dict("):
        if not isinstance(obj, dict):
            return ["%s: a map expected" % path]
        inner = type_name[type_name.index(",") + 1:-1].strip()
        return [e for k, v in obj.items() for e in schema_errors(v, inner, "%s.%s" % (path, k))]
    primitives = {"str": (str,), "int": (int,), "bool": (bool,), "float": (int, float)}
    if type_name in primitives:
        ok = isinstance(obj, primitives[type_name]) and not (
            type_name == "int" and isinstance(obj, bool))
        return [] if ok else ["%s: %s expected, not %r" % (path, type_name, obj)]
    if type_name in ("object", "datetime", "date"):
        return []
    cls = getattr(kc, type_name)
    if not isinstance(obj, dict):
        return ["%s: an object (%s) expected" % (path, type_name)]
    by_json = {v: k for k, v in cls.attribute_map.items()}
    errors = []
    for key, value in obj.items():
        if key not in by_json:
            errors.append("%s.%s: not a field of %s" % (path, key, type_name))
        else:
            errors += schema_errors(value, cls.openapi_types[by_json[key]],
                                    "%s.%s" % (path, key))
    return errors


@unittest.skipIf(yaml_missing(), yaml_missing())
class KubernetesManifests(RuncellTestCase):
    """deploy/kubernetes parsed and checked: against the API's schema (field names and types,
    from python3-kubernetes' models), and the names that tie the objects together. No cluster
    runs them here."""

    @classmethod
    def setUpClass(cls):
        import yaml
        cls.docs = []
        cls.files = sorted(f for f in os.listdir(K8S_DIR) if f.endswith(".yaml"))
        for f in cls.files:
            with open(os.path.join(K8S_DIR, f)) as fh:
                cls.docs += [(f, d) for d in yaml.safe_load_all(fh) if d]
        cls.objects = {}
        for f, d in cls.docs:
            cls.objects.setdefault(d["kind"], []).append(d)

    def one(self, kind, name):
        found = [d for d in self.objects.get(kind, []) if d["metadata"]["name"] == name]
        self.assertEqual(len(found), 1, "%s %s" % (kind, name))
        return found[0]

    @unittest.skipIf(k8s_schema_missing(), k8s_schema_missing())
    def test_every_object_fits_the_api_schema(self):
        # The check itself catches a misspelt field and a wrong type.
        self.assertEqual(schema_errors({"spec": {"clusterIp": "None", "ports": [{"port": "x"}]}},
                                       "V1Service", "t"),
                         ["t.spec.clusterIp: not a field of V1ServiceSpec",
                          "t.spec.ports[0].port: int expected, not 'x'"])
        errors = []
        for f, d in self.docs:
            if d["kind"] == "Kustomization":
                continue
            version = d["apiVersion"].split("/")[-1]
            type_name = version.capitalize() + d["kind"]
            errors += schema_errors(d, type_name, "%s:%s/%s" % (f, d["kind"],
                                                                d["metadata"]["name"]))
        self.assertEqual(errors, [])

    def test_kustomization_lists_every_file(self):
        kust = self.objects["Kustomization"][0]
        self.assertEqual(sorted(kust["resources"]),
                         sorted(f for f in self.files if f != "kustomization.yaml"))

    def test_the_names_that_tie_the_fleet_together(self):
        ns = self.objects["Namespace"][0]["metadata"]["name"]
        for f, d in self.docs:
            if d["kind"] not in ("Namespace", "Kustomization"):
                self.assertEqual(d["metadata"].get("namespace"), ns, (f, d["kind"]))
        sts = self.objects["StatefulSet"][0]
        svc = self.one("Service", sts["spec"]["serviceName"])
        self.assertEqual(svc["spec"]["clusterIP"], "None")  # headless: a DNS name per pod
        router = self.one("Deployment", "runcell-router")
        router_svc = self.one("Service", "runcell-router")
        for workload, service in ((sts, svc), (router, router_svc)):
            labels = workload["spec"]["template"]["metadata"]["labels"]
            sel = workload["spec"]["selector"]["matchLabels"]
            self.assertLessEqual(sel.items(), labels.items())
            self.assertLessEqual(service["spec"]["selector"].items(), labels.items())
            ports = {p["name"]: p["containerPort"]
                     for c in workload["spec"]["template"]["spec"]["containers"]
                     for p in c.get("ports", [])}
            for p in service["spec"]["ports"]:
                self.assertIn(p["targetPort"], ports)
        # Neither Service selects the other's pods.
        self.assertFalse(router_svc["spec"]["selector"].items()
                         <= sts["spec"]["template"]["metadata"]["labels"].items())
        node = sts["spec"]["template"]["spec"]["containers"][0]
        args = node["args"]
        port = next(p["containerPort"] for p in node["ports"] if p["name"] == "http")
        self.assertIn("--listen=0.0.0.0:%d" % port, args)
        self.assertIn("--node=$(POD_NAME)", args)
        self.assertIn("--fleet", args)
        env = {e["name"]: e for e in node["env"]}
        self.assertEqual(env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name")
        # Every $(VAR) of the arguments is defined, every reference names an object here.
        defined = set(env)
        for src in node["envFrom"]:
            kind, ref = ("ConfigMap", src["configMapRef"]) if "configMapRef" in src else \
                ("Secret", src["secretRef"])
            obj = self.one(kind, ref["name"])
            defined |= set(obj.get("data") or obj.get("stringData") or {})
        for a in args:
            for var in re.findall(r"\$\(([A-Z_]+)\)", a):
                self.assertIn(var, defined, a)
        key_ref = env["RUNCELL_TOKEN"]["valueFrom"]["secretKeyRef"]
        self.assertIn(key_ref["key"], self.one("Secret", key_ref["name"])["stringData"])
        # The router's configuration is deploy/haproxy/haproxy.cfg, naming every pod.
        volume = next(v for v in router["spec"]["template"]["spec"]["volumes"]
                      if "configMap" in v)
        data = self.one("ConfigMap", volume["configMap"]["name"])["data"]
        cfg = data["haproxy.cfg"]
        with open(SHIPPED_CFG) as f:
            self.assertEqual(cfg, f.read())
        mount = next(m["mountPath"] for m in router["spec"]["template"]["spec"]["containers"][0]
                     ["volumeMounts"] if m["name"] == volume["name"])
        self.assertIn("lua-load %s/fewest.lua\n" % mount, cfg)
        with open(FEWEST_LUA) as f:
            self.assertEqual(data["fewest.lua"], f.read())
        for i in range(sts["spec"]["replicas"]):
            pod = "%s-%d" % (sts["metadata"]["name"], i)
            self.assertIn("server %s %s.%s.%s.svc.cluster.local:%d" % (
                pod, pod, svc["metadata"]["name"], ns, port), cfg)
        self.assertNotIn("server %s-%d " % (sts["metadata"]["name"], sts["spec"]["replicas"]),
                         cfg)

    def test_image_disruption_budget_anti_affinity_and_pod_security(self):
        sts = self.objects["StatefulSet"][0]
        pod = sts["spec"]["template"]
        labels = pod["metadata"]["labels"]
        node = pod["spec"]["containers"][0]
        # The image deploy/image/build makes by default, pulled only when missing.
        with open(os.path.join(ROOT, "deploy", "image", "build")) as f:
            self.assertIn("image=${1:-%s}" % node["image"], f.read())
        self.assertEqual(node["imagePullPolicy"], "IfNotPresent")
        self.assertIn("--advertise=$(POD_NAME).%s.%s.svc.cluster.local:8080" % (
            sts["spec"]["serviceName"], sts["metadata"]["namespace"]), node["args"])
        self.assertIn("tcpSocket", node["livenessProbe"])  # a store outage is no restart
        self.assertEqual(node["readinessProbe"]["httpGet"]["path"], "/healthz")
        pdb = self.one("PodDisruptionBudget", "runcell")
        self.assertEqual(pdb["spec"]["maxUnavailable"], 1)
        self.assertLessEqual(pdb["spec"]["selector"]["matchLabels"].items(), labels.items())
        anti = pod["spec"]["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]
        self.assertEqual(anti[0]["topologyKey"], "kubernetes.io/hostname")
        self.assertLessEqual(anti[0]["labelSelector"]["matchLabels"].items(), labels.items())
        ns = self.objects["Namespace"][0]["metadata"]["labels"]
        for mode in ("enforce", "audit", "warn"):
            self.assertEqual(ns["pod-security.kubernetes.io/" + mode], "privileged")
        self.assertTrue(node["securityContext"]["privileged"])


if __name__ == "__main__":
    unittest.main()
