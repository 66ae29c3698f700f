#!/usr/bin/python3
"""bench/fleet_scale.py - a fleet at scale on a store 40 ms away: what the node leases cost the
store, how regular their renewals are, whether a stray request ever takes a live node's session
(a false takeover), how long a dead node's sessions take to move, and how long a stopping node
takes to checkpoint its sessions.

usage: bench/fleet_scale.py [RUNCELL] [--nodes N] [--sessions N] [--ttl S] [--latency S]
                            [--hold S] [--probes N] [--takeovers N] [--checkpoint N]
                            [--checkpoint-workers N,N...]
                            [--parts sim,real,checkpoint] [--summary FILE]

Every store request goes through tests/lib/tcpproxy.py to the S3 test server (tests/s3), each
answer delayed by --latency (40 ms: a store in another region, or a busy one).

  sim         --nodes (100) simulated nodes, each a build/fleet-sim process running runcell's
              own node lease and record code (src/session/node.c, lease.c) with --sessions
              (2,500) session records owned by it: real leases, real records, real conditional
              writes on a real S3 server; no sandboxes, no HTTP, no kernels. After all are
              ready, --hold seconds of steady state: the store's requests per second (counted
              at the proxy); then --hold seconds in which a stray node tries to take over
              --probes random sessions of the live nodes (false takeovers: goal 0); each node's
              worst gap between two renewals over both.
  real        three real `runcell serve --fleet` nodes (sandboxes, HTTP), the same store: the
              same three figures for them (stray requests sent to a node that does not own the
              session: forwarded, or taken over = false), then --takeovers times a kill -9 of a
              session's node and the time until that session answers again through any node.
  checkpoint  one real node with --checkpoint idle sessions (each with a variable and a file),
              stopped with SIGTERM: the time until it has checkpointed them all and exited,
              for each --checkpoint-workers (32 at once, and 1).
Prints one table; --summary writes the figures as JSON. Never part of the tests.
"""
import json
import os
import random
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
from tcpproxy import TcpProxy  # noqa: E402

SIM = os.path.join(os.path.dirname(rctest.RUNCELL), "..", "fleet-sim")


def arg(name, default):
    return type(default)(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def pct(xs, q):
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class Store:
    def __init__(self, tmp, latency):
        self.s3 = rctest.S3Server(os.path.join(tmp, "s3"))
        os.mkdir(self.s3.directory)
        self.s3.start()
        self.proxy = TcpProxy(self.s3.port)
        self.proxy.set_delay(latency)

    def args(self, prefix):
        a = self.s3.store_args(prefix)
        a[a.index("--s3-endpoint") + 1] = self.proxy.endpoint
        return a

    def close(self):
        self.proxy.close()
        self.s3.stop()


def part_sim(store, nodes, sessions, ttl, hold, probes):
    env = dict(os.environ, AWS_ACCESS_KEY_ID=rctest.S3Server.ACCESS_KEY,
               AWS_SECRET_ACCESS_KEY=rctest.S3Server.SECRET_KEY)
    bucket = "%s/sim" % store.s3.bucket
    names = ["sim%d" % i for i in range(nodes)]
    # The records are made with the store near (a setup, not what is measured: with every
    # answer 40 ms late the proxy's queue held up renewals past their deadline, and nodes
    # fenced themselves, as they should on a store that slow); then the latency goes on.
    latency = store.proxy.delay
    store.proxy.set_delay(0)
    t0 = time.monotonic()
    procs = {n: subprocess.Popen([SIM, n, store.proxy.endpoint, bucket, str(ttl), str(sessions),
                                  "0"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True) for n in names}
    for n, p in procs.items():
        line = p.stdout.readline()
        if '"ready":true' not in line:
            raise SystemExit("bench: %s did not start: %r" % (n, line))
    ready_s = time.monotonic() - t0
    store.proxy.set_delay(latency)
    time.sleep(ttl)  # a ttl of renewals at the new latency before the window
    ids = ["%s-%024x" % (random.choice(names), random.randint(1, sessions))
           for _ in range(probes)]
    probe_file = os.path.join(os.path.dirname(store.s3.directory), "probes")
    with open(probe_file, "w") as f:
        f.write("\n".join(ids) + "\n")
    # The steady state first, nothing but the leases; then the stray node's takeover tries.
    before, t1 = store.proxy.requests, time.monotonic()
    time.sleep(hold)
    lease_rps = (store.proxy.requests - before) / (time.monotonic() - t1)
    before, t1 = store.proxy.requests, time.monotonic()
    stray = subprocess.Popen([SIM, "stray", store.proxy.endpoint, bucket, str(ttl), "0",
                              str(hold), probe_file], env=env, stdout=subprocess.PIPE, text=True)
    stray.stdout.readline()
    stray_out = json.loads(stray.stdout.readline())
    stray.wait()
    probing_rps = (store.proxy.requests - before) / (time.monotonic() - t1)
    results = []
    for p in procs.values():
        p.stdin.close()
    for p in procs.values():
        results.append(json.loads(p.stdout.readline()))
        p.wait()
    gaps = [r["lease"]["worst_renewal_gap_ms"] for r in results]
    return {"nodes": nodes, "sessions_per_node": sessions, "records": sum(
        r["records_created"] for r in results), "records_failed": sum(
        r["records_failed"] for r in results), "setup_s": ready_s,
        "store_requests_per_s": lease_rps, "store_requests_per_s_probing": probing_rps,
        "worst_renewal_gap_ms": max(gaps), "renewal_gap_p50_ms": statistics.median(gaps),
        "renewal_failures": sum(r["lease"]["renewal_failures"] for r in results),
        "probes": stray_out["probes"]}


def spawn_fleet(tmp, store, ttl):
    test_fleet.LEASE_TTL_S = ttl
    nodes = {n: test_fleet.Node(n, tmp, store.args("real")) for n in test_fleet.NODES}
    for n in nodes.values():
        n.spawn()
    for n in nodes.values():
        n.wait_ready()
    return nodes


def part_real(tmp, store, ttl, hold, takeovers):
    nodes = spawn_fleet(tmp, store, ttl)
    try:
        names = list(nodes)
        sids = []
        for i in range(30):
            node = nodes[names[i % 3]]
            r = node.request("POST", "/v1/sessions", {})
            sids.append(r.json()["id"])
            node.request("POST", "/v1/sessions/%s/execute" % sids[-1], {"code": "x = %d" % i})
        before, t0 = store.proxy.requests, time.monotonic()
        stray, false_takeovers, forwarded = 0, 0, 0
        while time.monotonic() - t0 < hold:
            sid = random.choice(sids)
            owner = test_fleet.node_of(sid)
            other = nodes[random.choice([n for n in names if n != owner])]
            r = other.request("POST", "/v1/sessions/%s/execute" % sid, {"code": "x"})
            stray += 1
            forwarded += r.headers.get("X-Runcell-Forwarded-By") == other.name
            false_takeovers += r.headers.get("X-Runcell-Resumed") == "true"
            time.sleep(0.05)
        rps = (store.proxy.requests - before) / (time.monotonic() - t0)
        gaps = [n.request("GET", "/healthz").json()["fleet"]["worst_renewal_gap_ms"]
                for n in nodes.values()]
        times = []
        for i in range(takeovers):
            home = nodes[names[i % 3]]
            sid = home.request("POST", "/v1/sessions", {}).json()["id"]
            home.request("POST", "/v1/sessions/%s/execute" % sid, {"code": "x = 1"})
            others = [nodes[n] for n in names if n != home.name]
            t = time.monotonic()
            home.kill9()
            while True:
                try:
                    r = random.choice(others).request(
                        "POST", "/v1/sessions/%s/execute" % sid, {"code": "1"}, timeout=120)
                    if r.status == 200:
                        break
                except OSError:
                    pass
                time.sleep(0.05)
            times.append(time.monotonic() - t)
            home.spawn()
            home.wait_ready()
        return {"store_requests_per_s": rps, "worst_renewal_gap_ms": max(gaps),
                "stray_requests": stray, "forwarded": forwarded,
                "false_takeovers": false_takeovers, "takeover_s": times,
                "takeover_p50_s": statistics.median(times) if times else None,
                "takeover_p99_s": pct(times, 0.99) if times else None}
    finally:
        for n in nodes.values():
            n.stop()


def stop_time(tmp, store, sessions, workers, ttl):
    node = test_fleet.Node("ck%d" % workers, tmp, store.args("ck") + [
        "--checkpoint-workers", str(workers), "--max-sessions", str(sessions + 10)])
    test_fleet.LEASE_TTL_S = ttl
    node.spawn()
    node.wait_ready()
    lock = threading.Lock()
    made = []

    def make(k):
        for _ in range(k):
            sid = node.request("POST", "/v1/sessions", {"memory_mb": 256}).json()["id"]
            node.request("POST", "/v1/sessions/%s/execute" % sid,
                         {"code": "import numpy as np\nv = np.arange(1000)\n"
                                  "open('f.txt', 'w').write('x' * 100)"})
            with lock:
                made.append(sid)
    threads = [threading.Thread(target=make, args=(sessions // 4,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    t0 = time.monotonic()
    node.proc.send_signal(signal.SIGTERM)
    node.proc.wait()
    took = time.monotonic() - t0
    checkpointed = node.log().count('msg="session checkpointed"')
    return took, checkpointed, len(made)


def main():
    nodes, sessions = arg("--nodes", 100), arg("--sessions", 2500)
    ttl, latency, hold = arg("--ttl", 15.0), arg("--latency", 0.04), arg("--hold", 60.0)
    probes, takeovers, ck = arg("--probes", 2000), arg("--takeovers", 10), arg("--checkpoint", 200)
    parts = arg("--parts", "sim,real,checkpoint").split(",")
    workers = [int(w) for w in arg("--checkpoint-workers", "32,1").split(",")]
    summary = arg("--summary", "")
    why = test_fleet.haproxy_missing()
    if why:
        print("bench/fleet_scale.py: skipped: %s" % why)
        return 0
    print("runcell bench: a fleet on a store %d ms away, %s" % (latency * 1000,
                                                               time.strftime("%Y-%m-%d %H:%M")))
    tmp = tempfile.mkdtemp(prefix="runcell-bench-scale-")
    os.chmod(tmp, 0o755)
    store = Store(tmp, latency)
    out = {"latency_s": latency, "ttl_s": ttl}
    try:
        if "sim" in parts:
            out["sim"] = part_sim(store, nodes, sessions, ttl, hold, probes)
            print(json.dumps(out["sim"]))
        if "real" in parts:
            out["real"] = part_real(tmp, store, ttl, hold / 2, takeovers)
            print(json.dumps(out["real"]))
        if "checkpoint" in parts:
            out["checkpoint"] = {"sessions": ck, "runs": []}
            for w in workers:
                took, done, made = stop_time(tmp, store, ck, w, ttl)
                out["checkpoint"]["runs"].append({
                    "workers": w, "stop_s": took, "checkpointed": done, "sessions": made,
                    "per_session_ms": 1000 * took / max(done, 1)})
                print(json.dumps(out["checkpoint"]["runs"][-1]))
    finally:
        store.close()
        for m in reversed(rctest.mounts_below(tmp)):
            subprocess.run(["umount", "-l", m])
        subprocess.run(["rm", "-rf", "--one-file-system", tmp])
    if summary:
        with open(summary, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
