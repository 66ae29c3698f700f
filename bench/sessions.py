#!/usr/bin/python3
"""sessions.py - how fast a session is ready and how many fit, beside the peers.

Measured in one run, on this machine:
  create -> first result   POST /v1/sessions + execute "1+1" against `runcell serve`
                           (template + ready pool), beside a Jupyter kernel start + first
                           execute, and a cold `python3 -c "import pandas, matplotlib"`;
                           the data stack is imported in all three
  memory per idle session  PSS of a session's processes (50 sessions, each ran a cell),
                           beside a fresh python3 that imported the data stack
  idle sessions held       2500 sessions at once (--hold N); /healthz latency while they live

With --template-tradeoff it measures only create -> first result of the data stack import
and 1+1, with and without the template (serve --no-template: every session a fresh
interpreter, with its own hash secret, address layout and stack canary; docs/SECURITY.md).

usage: bench/sessions.py RUNCELL [--quick] [--hold N] [--summary FILE] [--template-tradeoff]
(standard library + Debian's jupyter_client)
Prints a table; returns rows for bench/run to merge.
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests", "lib"))
from rctest import descendants  # noqa: E402

PY = "/usr/bin/python3"
STACK = "import numpy, pandas, matplotlib.pyplot, openpyxl"
UID_BASE = 1000000000


class Server:
    """A `runcell serve` on a free loopback port with its own data directory."""

    def __init__(self, runcell, *args):
        self.dir = tempfile.mkdtemp(prefix="runcell-bench-")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [runcell, "serve", "--listen", "127.0.0.1:%d" % self.port, "--data", self.dir,
             "--max-sessions", "3000", "--max-executions", "256", *args],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.dir, "log"), "w"))
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                self.get("/healthz")
                break
            except OSError:
                time.sleep(0.1)
        self.token = open(os.path.join(self.dir, "token")).read().strip()
        self.conn = None

    def call(self, method, path, body=None, timeout=120):
        import http.client
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = json.dumps(body).encode() if body is not None else None
        self.conn.request(method, path, body=data,
                          headers={"Authorization": "Bearer " + self.token,
                                   "Content-Type": "application/json"})
        r = self.conn.getresponse()
        payload = r.read()
        if r.status >= 400:
            raise RuntimeError("%s %s: %d %s" % (method, path, r.status, payload[:300]))
        return json.loads(payload) if payload else None

    def get(self, path):
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.port, path), timeout=10) as r:
            return r.read()

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def pct(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100.0 * (len(v) - 1))))]


# ---- create -> first result ----

def runcell_create(runcell, n):
    srv = Server(runcell, "--pool", "4")
    try:
        time.sleep(1.0)  # let the pool fill
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            s = srv.call("POST", "/v1/sessions", {})
            rec = srv.call("POST", "/v1/sessions/%s/execute" % s["id"], {"code": "1+1"})
            times.append((time.perf_counter() - t0) * 1000)
            assert rec["results"][0]["text/plain"] == "2", rec
            preloaded = srv.call("POST", "/v1/sessions/%s/execute" % s["id"],
                                 {"code": "import sys; 'pandas' in sys.modules"})
            assert preloaded["results"][0]["text/plain"] == "True", "no template: %s" % preloaded
            srv.call("DELETE", "/v1/sessions/" + s["id"])
            time.sleep(0.15)  # the pool refills between creations, as between real users
        return times
    finally:
        srv.stop()


def create_first_stack_result(runcell, n, *args):
    """create -> first result of the data stack import and 1+1, n times, against
    `runcell serve ARGS`; the pool (if any) refills between creations."""
    srv = Server(runcell, *args)
    try:
        time.sleep(1.0)  # let a pool fill
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            s = srv.call("POST", "/v1/sessions", {})
            rec = srv.call("POST", "/v1/sessions/%s/execute" % s["id"],
                           {"code": STACK + "\n1+1"})
            times.append((time.perf_counter() - t0) * 1000)
            assert rec["results"][0]["text/plain"] == "2", rec
            srv.call("DELETE", "/v1/sessions/" + s["id"])
            time.sleep(1.0 if "--no-template" in args else 0.15)
        return times
    finally:
        srv.stop()


def template_tradeoff(runcell, n):
    print("create -> first result of the data stack import and 1+1 (ms, %d each)" % n)
    print("%-36s %8s %8s %8s" % ("serve options", "p50", "p90", "max"))
    for args in (("--pool", "0"), ("--pool", "4"), ("--pool", "0", "--no-template"),
                 ("--pool", "4", "--no-template")):
        t = create_first_stack_result(runcell, n, *args)
        print("%-36s %8.1f %8.1f %8.1f" % (" ".join(args), pct(t, 50), pct(t, 90), max(t)))


def jupyter_kernel_spec_dir():
    """A kernel spec that runs Debian's python3 (the python3 on PATH may be another)."""
    d = tempfile.mkdtemp(prefix="runcell-bench-jupyter-")
    k = os.path.join(d, "kernels", "debian-python3")
    os.makedirs(k)
    with open(os.path.join(k, "kernel.json"), "w") as f:
        json.dump({"argv": [PY, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                   "display_name": "Debian python3", "language": "python",
                   "env": {"PYDEVD_DISABLE_FILE_VALIDATION": "1"}}, f)
    return d


def jupyter_start(spec_dir):
    os.environ["JUPYTER_PATH"] = spec_dir
    from jupyter_client.manager import KernelManager
    km = KernelManager(kernel_name="debian-python3")
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=120)
    return km, kc


def jupyter_execute(kc, code):
    msg_id = kc.execute(code)
    while True:
        reply = kc.get_shell_msg(timeout=120)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"]


def jupyter_create(spec_dir, n):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        km, kc = jupyter_start(spec_dir)
        content = jupyter_execute(kc, STACK + "\n1+1")
        times.append((time.perf_counter() - t0) * 1000)
        assert content["status"] == "ok", content
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return times


def cold_python(n):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([PY, "-c", STACK], check=True)
        times.append((time.perf_counter() - t0) * 1000)
    return times


# ---- memory ----

def pss_kb(pid):
    try:
        for line in open("/proc/%s/smaps_rollup" % pid):
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        return 0
    return 0


def session_processes(root):
    """Host pids of the session processes below root (a runcell serve): uids of workspace
    slots, not the template's. Only root's own: a test suite or another daemon beside the
    bench has sessions of its own."""
    parent, uid = {}, {}
    for d in glob.glob("/proc/[0-9]*"):
        try:
            with open(d + "/stat") as f:
                parent[d] = "/proc/" + f.read().rsplit(")", 1)[1].split()[1]
            uid[d] = os.stat(d).st_uid
        except (OSError, IndexError):
            continue
    top = "/proc/%d" % root

    def below(d):
        seen = 0
        while d in parent and seen < 64:
            d, seen = parent[d], seen + 1
            if d == top:
                return True
        return False
    return [d.rsplit("/", 1)[1] for d in parent if uid[d] >= UID_BASE + 2 and below(d)]


def runcell_pss(runcell, n):
    srv = Server(runcell, "--pool", "0")
    try:
        for _ in range(n):
            s = srv.call("POST", "/v1/sessions", {})
            srv.call("POST", "/v1/sessions/%s/execute" % s["id"], {"code": "x = 1\nx += 1"})
        time.sleep(1)
        pids = session_processes(srv.proc.pid)
        return sum(pss_kb(p) for p in pids) / float(n) / 1024.0, len(pids)
    finally:
        srv.stop()


def python_pss():
    p = subprocess.Popen([PY, "-c", STACK + "\nimport sys; print('up', flush=True); "
                          "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    p.stdout.readline()
    mb = pss_kb(p.pid) / 1024.0
    p.stdin.close()
    p.wait()
    return mb


# ---- many idle sessions ----

# Below this much available memory the bench stops making sessions (and says so), so that
# asking for more than the machine holds ends the bench, not the machine.
HOLD_RESERVE_MB = 1536


# With --hibernate: the sessions not yet hibernated are at most this many; a creator waits for
# the server to hibernate the idle ones before it makes more.
AWAKE_MAX = 400


def awake_sessions(srv):
    h = json.loads(srv.get("/healthz"))
    return h["sessions"] - h.get("hibernated", 0)


def hold_sessions(runcell, n, creators=4, hibernate=False):
    """n idle sessions at once; with hibernate, the server hibernates each one second after
    its cell (--hibernate-after 1)."""
    extra = ("--hibernate-after", "1", "--max-sessions", str(n + 100)) if hibernate else ()
    srv = Server(runcell, "--pool", "4", *extra)
    errors = []
    made = []
    lock = threading.Lock()
    stopped = []

    def worker(count):
        local = Server.__new__(Server)
        local.__dict__.update(port=srv.port, token=srv.token, conn=None)
        for _ in range(count):
            waited = 0
            while hibernate and awake_sessions(local) > AWAKE_MAX and waited < 600:
                time.sleep(0.2)
                waited += 0.2
            avail = meminfo_mb("MemAvailable")
            if avail < HOLD_RESERVE_MB:
                with lock:
                    stopped.append("stopped at %d sessions: %.0f MB available (reserve %d MB)"
                                   % (len(made), avail, HOLD_RESERVE_MB))
                return
            try:
                s = local.call("POST", "/v1/sessions", {"memory_mb": 256})
                local.call("POST", "/v1/sessions/%s/execute" % s["id"], {"code": "x = 1"})
                with lock:
                    made.append(s["id"])
            except Exception as e:  # reported, not hidden
                errors.append(str(e))
                return
    try:
        mem0 = meminfo_used_mb()
        t0 = time.time()
        threads = [threading.Thread(target=worker, args=(n // creators,)) for _ in range(creators)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        created_s = time.time() - t0
        deadline = time.time() + 600
        while hibernate and awake_sessions(srv) > 0 and time.time() < deadline:
            time.sleep(0.5)
        hibernated = json.loads(srv.get("/healthz")).get("hibernated", 0)
        lat = []
        for _ in range(200):
            t = time.perf_counter()
            srv.get("/healthz")
            lat.append((time.perf_counter() - t) * 1000)
        used = meminfo_used_mb() - mem0
        tree = tree_pss_mb(srv.proc.pid)
        t0 = time.time()
        return {"held": len(made), "hibernated": hibernated,
                "errors": (stopped[:1] + errors)[:3], "create_s": created_s,
                "healthz_p50": pct(lat, 50), "healthz_p99": pct(lat, 99),
                "healthz_max": max(lat),
                "memory_mb": used, "tree_pss_mb": tree}
    finally:
        t0 = time.time()
        srv.stop()
        stop_s = time.time() - t0
        if made:
            print("  (closing %d sessions at shutdown took %.1f s)" % (len(made), stop_s))


def meminfo_mb(*keys):
    info = {}
    for line in open("/proc/meminfo"):
        k, v = line.split(":")
        info[k] = int(v.split()[0])
    return sum(info[k] for k in keys) / 1024.0


def tree_pss_mb(pid):
    """PSS of the server and every process below it, in MB: unlike the machine's used memory,
    other work on the machine does not move it (tmpfs and the kernel's own memory are not in
    it)."""
    kb = 0
    for p in [pid] + sorted(descendants(pid)):
        try:
            with open("/proc/%d/smaps_rollup" % p) as f:
                kb += sum(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except OSError:
            pass
    return kb / 1024


def meminfo_used_mb():
    return meminfo_mb("MemTotal") - meminfo_mb("MemAvailable")


def main(argv):
    runcell = os.path.abspath(argv[0]) if argv and not argv[0].startswith("--") \
        else "build/src/runcell"
    quick = "--quick" in argv
    summary = argv[argv.index("--summary") + 1] if "--summary" in argv else None
    if "--template-tradeoff" in argv:
        return template_tradeoff(runcell, 5 if quick else 15)
    rows = []
    spec_dir = jupyter_kernel_spec_dir()
    print("create -> first result of 1+1, data stack imported")
    rc = runcell_create(runcell, 30 if quick else 200)
    jp = jupyter_create(spec_dir, 2 if quick else 5)
    cold = cold_python(3 if quick else 10)
    rows.append(("create -> first result (p50 ms)", "<= 15", pct(rc, 50),
                 [("Jupyter kernel start + execute", pct(jp, 50)),
                  ("cold python3 + import", pct(cold, 50))]))
    print("memory per idle session")
    pss, nproc = runcell_pss(runcell, 20 if quick else 50)
    ref = python_pss()
    rows.append(("PSS per idle session (MB)", "<= 10", pss, [("fresh python3 + data stack", ref)]))
    print("idle sessions held")
    hold = int(argv[argv.index("--hold") + 1]) if "--hold" in argv else (200 if quick else 2500)
    held = hold_sessions(runcell, hold)
    rows.append(("idle sessions held", ">= 2500", held["held"], []))
    rows.append(("/healthz while held (p50 / max ms)", "< 50", held["healthz_max"],
                 [("p50", held["healthz_p50"])]))
    hib = None
    if "--hibernate" in argv or not quick:
        print("idle sessions held, hibernating")
        n_hib = int(argv[argv.index("--hibernate") + 1]) if "--hibernate" in argv else 10000
        hib = hold_sessions(runcell, n_hib, hibernate=True)
        rows.append(("idle sessions held, hibernated", ">= 10000", hib["hibernated"],
                     [("held awake", held["held"])]))
    shutil.rmtree(spec_dir, ignore_errors=True)
    print_table(rows)
    if hib:
        print("  %d sessions made in %.1f s, %d hibernated, about %.0f MB of memory (the "
              "server's processes' PSS %.0f MB); /healthz p50 %.1f ms, max %.1f ms%s" % (
                  hib["held"], hib["create_s"], hib["hibernated"], hib["memory_mb"],
                  hib["tree_pss_mb"],
                  hib["healthz_p50"], hib["healthz_max"],
                  "; errors: %s" % hib["errors"] if hib["errors"] else ""))
    print("  %d sessions made in %.1f s (4 clients), about %.0f MB of memory%s" % (
        held["held"], held["create_s"], held["memory_mb"],
        "; errors: %s" % held["errors"] if held["errors"] else ""))
    print("  create->first result: runcell p90 %.1f ms, p99 %.1f ms, max %.1f ms over %d; "
          "Jupyter p50 %.0f ms over %d" % (pct(rc, 90), pct(rc, 99), max(rc), len(rc),
                                          pct(jp, 50), len(jp)))
    print("  /healthz while held: p50 %.1f ms, p99 %.1f ms, max %.1f ms over 200" % (
        held["healthz_p50"], held["healthz_p99"], held["healthz_max"]))
    if summary:  # for bench/run's table
        with open(summary, "w") as f:
            json.dump({"create_ms": pct(rc, 50), "create_p99_ms": pct(rc, 99),
                       "create_n": len(rc), "jupyter_create_ms": pct(jp, 50),
                       "cold_python_ms": pct(cold, 50), "pss_mb": pss, "python_pss_mb": ref,
                       "held": held["held"], "healthz_p50_ms": held["healthz_p50"],
                       "healthz_p99_ms": held["healthz_p99"],
                       "healthz_max_ms": held["healthz_max"], "held_memory_mb": held["memory_mb"],
                       "held_asked": hold,
                       "hibernated": hib["hibernated"] if hib else None,
                       "hibernated_memory_mb": hib["memory_mb"] if hib else None,
                       "hibernated_pss_mb": hib["tree_pss_mb"] if hib else None,
                       "hibernated_create_s": hib["create_s"] if hib else None}, f)
    return rows


def print_table(rows):
    print("\n%-38s %9s %10s   %s" % ("what", "target", "runcell", "peers (same run) and ratio"))
    print("-" * 100)
    for what, target, value, peers in rows:
        peer_text = "; ".join("%s %.1f (%.2fx)" % (name, v, v / value if value else 0)
                              for name, v in peers)
        print("%-38s %9s %10.1f   %s" % (what, target, value, peer_text))


if __name__ == "__main__":
    main(sys.argv[1:])
