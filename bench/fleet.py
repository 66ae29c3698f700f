#!/usr/bin/python3
"""bench/fleet.py - a fleet of three runcell nodes behind HAProxy, beside one node reached
directly: what the router costs, and how long a dead node's sessions take to move.

usage: bench/fleet.py [RUNCELL] [--rounds N] [--creates N] [--takeovers N] [--summary FILE]

Starts the S3 test server (tests/s3), three `runcell serve --fleet --node nK --lease-ttl 2`
nodes on it and HAProxy configured by deploy/haproxy/gen (the same helpers as
tests/integration/test_fleet.py), then measures:
  create      sessions created per second, 4 client threads, through the router (spread
              over the 3 nodes) and straight to one node;
  round trip  a warm `x += 1` in one session on a kept-alive connection, through the router
              and straight to the session's node;
  takeover    from a SIGKILL of a session's node to the first answer for that session
              (another node resumes it once the 2 s lease and 1 s of clock skew have passed;
              the router's health checks see the node down within 0.4 s), and from a SIGTERM
              (the node checkpoints and releases its sessions as it stops) to that answer.
Prints one table with router/direct ratios. Never part of the tests; on this 2-core machine
the three nodes share the same two cores, so the fleet adds routing, not capacity.
"""
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
if len(sys.argv) > 1 and not sys.argv[1].startswith("--"):
    os.environ["RUNCELL_BIN"] = os.path.abspath(sys.argv[1])
import rctest  # noqa: E402
import test_fleet  # noqa: E402
from test_fleet import NODES, Node, Router, node_of  # noqa: E402

TOKEN = rctest.TOKEN


def arg(name, default):
    return type(default)(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def pct(xs, q):
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class Conn:
    """One kept-alive connection."""

    def __init__(self, port):
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def call(self, method, path, body=None):
        self.c.request(method, path, body=json.dumps(body) if body is not None else None,
                       headers={"Authorization": "Bearer " + TOKEN,
                                "Content-Type": "application/json"})
        r = self.c.getresponse()
        data = r.read()
        return r.status, r.headers, json.loads(data) if data else None

    def close(self):
        self.c.close()


def create_rate(port, n, threads=4):
    """Sessions created per second by `threads` clients, n in all; closes them after."""
    ids, lock = [], threading.Lock()
    per = n // threads

    def worker():
        c = Conn(port)
        for _ in range(per):
            st, _, j = c.call("POST", "/v1/sessions", {})
            if st != 201:
                raise SystemExit("bench: create answered %d: %r" % (st, j))
            with lock:
                ids.append(j["id"])
        c.close()
    ts = [threading.Thread(target=worker) for _ in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    rate = len(ids) / (time.perf_counter() - t0)
    c = Conn(port)
    for sid in ids:
        c.call("DELETE", "/v1/sessions/" + sid)
    c.close()
    return rate, ids


def round_trips(port, sid, rounds):
    c = Conn(port)
    path = "/v1/sessions/%s/execute" % sid
    c.call("POST", path, {"code": "x = 0"})
    for _ in range(50):
        c.call("POST", path, {"code": "x += 1"})
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        st, _, _ = c.call("POST", path, {"code": "x += 1"})
        out.append((time.perf_counter() - t0) * 1000)
        if st != 200:
            raise SystemExit("bench: execute answered %d" % st)
    c.close()
    return out


def first_answer(router, sid):
    """Seconds until a request for sid through the router answers 200 (each try on a fresh
    connection; a try that fails is sent again)."""
    t0 = time.perf_counter()
    while True:
        try:
            r = router.request("POST", "/v1/sessions/%s/execute" % sid, {"code": "x"},
                               timeout=60)
            if r.status == 200:
                return time.perf_counter() - t0, r
        except OSError:
            pass
        time.sleep(0.01)


def takeover(fleet, nodes, sig):
    """One takeover after sig to the node of a fresh session; the node is restarted after."""
    sid = fleet.ok("POST", "/v1/sessions", {}, 201)["id"]
    home = nodes[node_of(sid)]
    fleet.ok("POST", "/v1/sessions/%s/execute" % sid, {"code": "x = 1"})
    t0 = time.perf_counter()
    if sig == signal.SIGKILL:
        home.kill9()
    else:
        home.proc.send_signal(sig)
        home.proc.wait()
    _, r = first_answer(fleet.router, sid)
    seconds = time.perf_counter() - t0  # from the signal
    resumed = r.headers.get("X-Runcell-Resumed") == "true"
    home.spawn()
    home.wait_ready()
    fleet.router.wait_state(home.name, "UP")
    fleet.router.request("DELETE", "/v1/sessions/" + sid)
    return seconds, resumed


class Fleet:
    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="runcell-bench-fleet-")
        os.chmod(self.tmp, 0o755)
        self.s3 = rctest.S3Server(os.path.join(self.tmp, "s3"))
        os.mkdir(self.s3.directory)
        self.s3.start()
        self.nodes = {n: Node(n, self.tmp, self.s3.store_args("fleet")) for n in NODES}
        for n in self.nodes.values():
            n.spawn()
        for n in self.nodes.values():
            n.wait_ready()
        self.router = Router(self.tmp, self.nodes.values())
        if self.router.check.returncode:
            raise SystemExit("bench: haproxy -c: " + self.router.check.stderr)
        self.router.start()
        for n in NODES:
            self.router.wait_state(n, "UP")

    def ok(self, method, path, body=None, status=200):
        r = self.router.request(method, path, body)
        if r.status != status:
            raise SystemExit("bench: %s %s answered %r" % (method, path, r))
        return r.json()

    def close(self):
        self.router.stop()
        for n in self.nodes.values():
            n.stop()
        self.s3.stop()
        subprocess.run(["rm", "-rf", "--one-file-system", self.tmp])


def main():
    rounds, creates, takeovers = arg("--rounds", 500), arg("--creates", 60), arg("--takeovers", 3)
    summary = arg("--summary", "")
    why = test_fleet.haproxy_missing()
    if why:
        print("bench/fleet.py: skipped: %s" % why)
        return 0
    t_start = time.monotonic()
    print("runcell bench: a fleet of 3 nodes behind HAProxy, %s" %
          time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    fleet = Fleet()
    try:
        direct = fleet.nodes["n1"]
        rate_router, ids = create_rate(fleet.router.port, creates)
        spread = {n: sum(1 for i in ids if node_of(i) == n) for n in NODES}
        rate_direct, _ = create_rate(direct.port, creates)
        sid = fleet.ok("POST", "/v1/sessions", {}, 201)["id"]
        home = fleet.nodes[node_of(sid)]
        rt_router, rt_direct = [], []
        for _ in range(5):  # interleaved, so that load drift hits both alike
            rt_router += round_trips(fleet.router.port, sid, rounds // 5)
            rt_direct += round_trips(home.port, sid, rounds // 5)
        fleet.router.request("DELETE", "/v1/sessions/" + sid)
        kills = [takeover(fleet, fleet.nodes, signal.SIGKILL) for _ in range(takeovers)]
        terms = [takeover(fleet, fleet.nodes, signal.SIGTERM) for _ in range(takeovers)]
    finally:
        fleet.close()

    print("\n%-26s %-22s %10s %10s %14s" % ("measure", "path", "p50", "p90", "router/direct"))
    print("-" * 86)
    print("%-26s %-22s %10s %10s %14.2f" % ("sessions created /s", "router (%s)" % ",".join(
        "%s:%d" % kv for kv in spread.items()), "%.1f" % rate_router, "", rate_router / rate_direct))
    print("%-26s %-22s %10s" % ("", "direct (one node)", "%.1f" % rate_direct))
    p50r, p50d = statistics.median(rt_router), statistics.median(rt_direct)
    print("%-26s %-22s %9.3fms %9.3fms %14.2f" % ("x += 1 round trip", "router", p50r,
                                                  pct(rt_router, 0.9), p50r / p50d))
    print("%-26s %-22s %9.3fms %9.3fms" % ("", "direct", p50d, pct(rt_direct, 0.9)))
    ks, ts = [k for k, _ in kills], [t for t, _ in terms]
    print("%-26s %-22s %9.2fs %9.2fs   lease ttl %ds + 1 s skew" % (
        "takeover after SIGKILL", "router", statistics.median(ks), max(ks),
        test_fleet.LEASE_TTL_S))
    print("%-26s %-22s %9.2fs %9.2fs   (stop, checkpoint, release)" % (
        "takeover after SIGTERM", "router", statistics.median(ts), max(ts)))
    if not all(r for _, r in kills + terms):
        print("note: a takeover answered without resumed: true")
    print("total bench time %.1f s" % (time.monotonic() - t_start))
    if summary:
        with open(summary, "w") as f:
            json.dump({"create_per_s_router": rate_router, "create_per_s_direct": rate_direct,
                       "spread": spread, "round_trip_ms_router": p50r,
                       "round_trip_ms_direct": p50d, "takeover_kill_s": ks,
                       "takeover_term_s": ts, "lease_ttl_s": test_fleet.LEASE_TTL_S}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
