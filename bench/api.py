#!/usr/bin/python3
"""bench/api.py - runcell serve beside jupyter_client, in one run on this machine.

usage: bench/api.py [RUNCELL] [--rounds N] [--sessions K] [--seconds S] [--summary FILE]

Measures:
  round trip   a warm `x += 1` in one stateful session, one call after the other:
               runcell over HTTP/1.1 with a kept-alive connection (raw http.client, and
               through clients/python/runcell_client.py), jupyter_client over ZeroMQ
               (execute with reply=True, and execute_interactive, which also waits for the
               kernel's idle status as a client collecting outputs must);
  throughput   K sessions (K kernels) in parallel, one client thread each, `x += 1` as fast
               as they answer for S seconds: executions per second in total, and the CPU
               each execution took, of this client and of the server (runcell serve and
               its sandboxes; the Jupyter kernels), from /proc over the same window;
  start        a new session ready to run: POST /v1/sessions, beside a kernel start
               (KernelManager.start_kernel + wait_for_ready).

Prints one table with jupyter/runcell ratios. runcell runs every cell in a sandbox
(namespaces, seccomp, cgroup); the Jupyter kernel runs unsandboxed, as it does by default.
The whole bench stays under three minutes. Standard library plus Debian's
python3-jupyter-client and python3-ipykernel; never part of the tests.
"""
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

PY = "/usr/bin/python3"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKEN = "bench-token-0123456789abcdef0123"
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))


def pct(xs, q):
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


# Rounds run first and not counted: the connection, caches, the kernel's first compile.
WARMUP = 50


def timed_rounds(fn, rounds, warmup=WARMUP):
    """Calls fn warmup + rounds times; returns the last rounds calls' durations in ms."""
    times = []
    for i in range(warmup + rounds):
        t0 = time.perf_counter()
        fn()
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1000)
    return times


# ---- runcell ----

class Runcell:
    def __init__(self, binary):
        self.tmp = tempfile.mkdtemp(prefix="runcell-bench-")
        os.chmod(self.tmp, 0o755)  # the sandboxes' own uids walk through it
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = open(os.path.join(self.tmp, "serve.log"), "wb")
        env = dict(os.environ, RUNCELL_RUNDIR=os.path.join(self.tmp, "run"))
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", "127.0.0.1:%d" % self.port, "--data",
             os.path.join(self.tmp, "data"), "--token", TOKEN, "--max-sessions", "200"],
            env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)
        end = time.monotonic() + 30
        while True:
            try:
                c = self.conn()
                c.request("GET", "/healthz")
                if c.getresponse().status == 200:
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > end:
                    sys.exit("bench: runcell serve did not start; see %s" % self.log.name)
                time.sleep(0.05)

    def conn(self):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)

    def call(self, conn, method, path, body=None):
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers={"Authorization": "Bearer " + TOKEN})
        r = conn.getresponse()
        data = json.loads(r.read())
        if r.status >= 300:
            sys.exit("bench: %s %s: %d %s" % (method, path, r.status, data))
        return data

    def create(self, conn):
        return self.call(conn, "POST", "/v1/sessions", {})["id"]

    def close(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def runcell_round_trips(rc, rounds, language=None):
    """Warm `x += 1` round trips in one session (of language; None: the default, Python)
    over one kept-alive connection."""
    conn = rc.conn()
    sid = rc.call(conn, "POST", "/v1/sessions", {"language": language} if language else {})["id"]
    path = "/v1/sessions/%s/execute" % sid
    rc.call(conn, "POST", path, {"code": "var x = 0" if language == "javascript" else "x = 0"})

    def one():
        rec = rc.call(conn, "POST", path, {"code": "x += 1"})
        assert rec["status"] == "ok", rec
    times = timed_rounds(one, rounds)
    assert rc.call(conn, "POST", path, {"code": "x"})["results"][0]["text/plain"] == \
        str(rounds + WARMUP)
    rc.call(conn, "DELETE", "/v1/sessions/" + sid)
    conn.close()
    return times


def client_round_trips(rc, rounds):
    import runcell_client
    with runcell_client.Session("http://127.0.0.1:%d" % rc.port, TOKEN) as s:
        s.run("x = 0")

        def one():
            rec = s.run("x += 1")
            assert rec["status"] == "ok", rec
        return timed_rounds(one, rounds)


def runcell_starts(rc, n):
    conn = rc.conn()
    times, ids = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        ids.append(rc.create(conn))
        times.append((time.perf_counter() - t0) * 1000)
    for sid in ids:
        rc.call(conn, "DELETE", "/v1/sessions/" + sid)
    conn.close()
    return times


CLK_TCK = os.sysconf("SC_CLK_TCK")


def tree_cpu_s(root_pid, with_root=True):
    """CPU seconds (user + system) of a process (unless not with_root) and all its live
    descendants, from /proc."""
    parent, cpu = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parent[int(d)] = int(rest[1])
        cpu[int(d)] = (int(rest[11]) + int(rest[12])) / CLK_TCK
    children = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root_pid]
    if not with_root:
        todo = list(children.get(root_pid, ()))
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo.extend(children.get(pid, ()))
    return total


def throughput(workers, seconds, cpu_of=None):
    """Runs each worker (a callable doing one execution) in a thread of its own for
    `seconds`; returns executions per second in total, and, with cpu_of (a callable giving
    CPU seconds of the server's processes), the CPU per execution in ms of this client
    process and of the server over the same window."""
    counts = [0] * len(workers)
    stop = threading.Event()
    go = threading.Barrier(len(workers) + 1)

    def loop(i, fn):
        go.wait()
        while not stop.is_set():
            fn()
            counts[i] += 1
    threads = [threading.Thread(target=loop, args=(i, fn)) for i, fn in enumerate(workers)]
    for t in threads:
        t.start()
    go.wait()
    t0 = time.perf_counter()
    c0, s0, n0 = time.process_time(), cpu_of() if cpu_of else 0.0, sum(counts)
    time.sleep(seconds)
    c1, s1, n1 = time.process_time(), cpu_of() if cpu_of else 0.0, sum(counts)
    stop.set()
    for t in threads:
        t.join(120)
    rate = sum(counts) / (time.perf_counter() - t0)
    n = max(1, n1 - n0)
    return rate, {"client_cpu_ms": (c1 - c0) * 1000 / n, "server_cpu_ms": (s1 - s0) * 1000 / n}


def runcell_throughput(rc, k, seconds):
    workers, cleanup = [], []
    for _ in range(k):
        conn = rc.conn()
        sid = rc.create(conn)
        path = "/v1/sessions/%s/execute" % sid
        rc.call(conn, "POST", path, {"code": "x = 0"})
        workers.append(lambda c=conn, p=path: rc.call(c, "POST", p, {"code": "x += 1"}))
        cleanup.append((conn, sid))
    rate, cpu = throughput(workers, seconds, lambda: tree_cpu_s(rc.proc.pid))
    for conn, sid in cleanup:
        rc.call(conn, "DELETE", "/v1/sessions/" + sid)
        conn.close()
    return rate, cpu


# ---- jupyter_client ----

class Jupyter:
    def __init__(self, k):
        import jupyter_client
        os.environ["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
        self.kms, self.kcs, self.start_ms = [], [], []
        # Started one after the other, so each start is timed alone.
        for _ in range(k):
            t0 = time.perf_counter()
            km = jupyter_client.KernelManager(kernel_name="python3")
            km.start_kernel(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            kc = km.client()
            kc.start_channels()
            kc.wait_for_ready(timeout=120)
            self.start_ms.append((time.perf_counter() - t0) * 1000)
            kc.execute_interactive("x = 0", timeout=60)
            self.kms.append(km)
            self.kcs.append(kc)

    def round_trips(self, rounds, interactive):
        kc = self.kcs[0]
        kc.execute_interactive("x = 0", timeout=60)

        def one():
            if interactive:
                reply = kc.execute_interactive("x += 1", timeout=60, output_hook=lambda m: None)
            else:
                reply = kc.execute("x += 1", reply=True, timeout=60)
            assert reply["content"]["status"] == "ok", reply
        return timed_rounds(one, rounds)

    def throughput(self, seconds):
        # The kernels are this process's children.
        return throughput([lambda c=kc: c.execute("x += 1", reply=True, timeout=60)
                           for kc in self.kcs], seconds,
                          lambda: tree_cpu_s(os.getpid(), with_root=False))

    def close(self):
        for km in self.kms:
            km.shutdown_kernel(now=True)
        for kc in self.kcs:
            kc.stop_channels()
        self.kcs, self.kms = [], []


def main(argv):
    runcell = os.path.join(ROOT, "build", "src", "runcell")
    rounds, k, seconds = 1000, 8, 5.0
    summary = None
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--rounds" and args:
            rounds = int(args.pop(0))
        elif a == "--sessions" and args:
            k = int(args.pop(0))
        elif a == "--seconds" and args:
            seconds = float(args.pop(0))
        elif a == "--summary" and args:
            summary = args.pop(0)
        elif a in ("-h", "--help"):
            print(__doc__.strip())
            return 0
        else:
            runcell = a
    runcell = os.path.abspath(runcell)
    if not os.access(runcell, os.X_OK):
        sys.exit("bench: no runcell at %s; build it first (make build)" % runcell)
    t_start = time.monotonic()
    print("runcell bench: HTTP API beside jupyter_client, %s" %
          time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    try:
        import jupyter_client
        import ipykernel
        peer = "jupyter_client %s, ipykernel %s" % (jupyter_client.__version__,
                                                    ipykernel.__version__)
    except ImportError as e:
        jupyter_client = None
        peer = "jupyter_client: not installed (%s); its rows are left out" % e
    print("peer: %s; %d rounds after 50 warm-up; %d sessions x %.0f s for throughput"
          % (peer, rounds, k, seconds))

    rc = Runcell(runcell)
    jp = None
    try:
        rows = []
        rt = runcell_round_trips(rc, rounds)
        rt_client = client_round_trips(rc, rounds)
        starts = runcell_starts(rc, 30)
        rc_rate, rc_cpu = runcell_throughput(rc, k, seconds)
        if jupyter_client:
            jp = Jupyter(k)
            jrt = jp.round_trips(rounds, interactive=False)
            jrti = jp.round_trips(rounds, interactive=True)
            jp_rate, jp_cpu = jp.throughput(seconds)
        rows.append(("x += 1 round trip", "runcell HTTP (http.client)", rt))
        rows.append(("x += 1 round trip", "runcell HTTP (runcell_client)", rt_client))
        if jp:
            rows.append(("x += 1 round trip", "jupyter execute(reply=True)", jrt))
            rows.append(("x += 1 round trip", "jupyter execute_interactive", jrti))
        rows.append(("new session, ready", "runcell POST /v1/sessions", starts))
        if jp:
            rows.append(("new session, ready", "jupyter kernel start", jp.start_ms))
    finally:
        if jp:
            jp.close()
        rc.close()

    print()
    hdr = "%-20s %-30s %5s %9s %9s %9s %12s" % ("measure", "tool", "n", "p50 ms", "p90 ms",
                                                 "mean ms", "vs runcell")
    print(hdr)
    print("-" * len(hdr))
    base = {}
    for measure, tool, xs in rows:
        p50 = statistics.median(xs)
        base.setdefault(measure, p50)
        ratio = "" if tool.startswith("runcell") else "%.1fx slower" % (p50 / base[measure])
        print("%-20s %-30s %5d %9.3f %9.3f %9.3f %12s" % (measure, tool, len(xs), p50,
                                                          pct(xs, 0.9), statistics.fmean(xs),
                                                          ratio))
    print()
    # CPU per execution over the window, this client's and the server's (runcell: serve and
    # every sandbox below it; Jupyter: the kernels): where two cores' worth of time went.
    print("%-20s %-30s %12s %18s %18s" % ("throughput", "tool", "exec/s", "client CPU ms/exec",
                                          "server CPU ms/exec"))
    print("%-20s %-30s %12.0f %18.3f %18.3f" % ("%d sessions" % k, "runcell HTTP", rc_rate,
                                                rc_cpu["client_cpu_ms"],
                                                rc_cpu["server_cpu_ms"]))
    if jp:
        print("%-20s %-30s %12.0f %18.3f %18.3f   runcell/jupyter %.1fx" % (
            "%d kernels" % k, "jupyter execute(reply=True)", jp_rate, jp_cpu["client_cpu_ms"],
            jp_cpu["server_cpu_ms"], rc_rate / jp_rate))
    p50 = statistics.median(rt)
    print("\ntarget: x += 1 over HTTP p50 <= 1 ms: %.3f ms, %s" %
          (p50, "met" if p50 <= 1.0 else "NOT met"))
    print("total bench time %.1f s" % (time.monotonic() - t_start))
    if summary:  # for bench/run's table
        with open(summary, "w") as f:
            json.dump({"round_trip_ms": p50, "sessions": k,
                       "jupyter_round_trip_ms": statistics.median(jrt) if jp else None,
                       "exec_per_s": rc_rate, "jupyter_exec_per_s": jp_rate if jp else None,
                       "exec_client_cpu_ms": rc_cpu["client_cpu_ms"],
                       "exec_server_cpu_ms": rc_cpu["server_cpu_ms"],
                       "jupyter_kernels": len(jp.start_ms) if jp else 0}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
