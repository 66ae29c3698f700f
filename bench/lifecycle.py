#!/usr/bin/python3
"""bench/lifecycle.py - a whole session's life: create -> print -> close, over HTTP.

usage: bench/lifecycle.py RUNCELL [--rounds N] [--clients K] [--creates M] [--summary FILE]

The recipe the hosted sandboxes publish their start figures with: make a sandbox, run
`print("hello")` in it, close it; timed from the create request to the close's answer.
Measured against one `runcell serve` (template and its default ready pool of 2):
  sequential   N rounds (100) back to back from one client: nothing waits between a close
               and the next create, so the pool refills only while a round runs;
  concurrent   K clients (20) at once, each doing rounds back to back for as many rounds in
               all, so creations outrun the pool and most sessions are cloned on demand;
  creates      sessions created per second, sustained: 4 clients create M (300) sessions,
               three times over, the sessions left open (so the third batch is made beside
               2M live ones); closed at the end.
The peer, in the same run and interleaved with the sequential rounds: a cold, unsandboxed
`python3 -c 'print("hello")'` (what the one-shot form of the same work costs). Prints
p50/p95/p99 and the ratio; `--summary FILE` writes the figures as JSON for bench/run.
Standard library only; never part of the tests.
"""
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sessions import PY, Server, pct  # noqa: E402

CODE = 'print("hello")'


def lifecycle(srv):
    """One create -> print -> close; returns its wall time in ms."""
    t0 = time.perf_counter()
    s = srv.call("POST", "/v1/sessions", {})
    rec = srv.call("POST", "/v1/sessions/%s/execute" % s["id"], {"code": CODE})
    srv.call("DELETE", "/v1/sessions/" + s["id"])
    ms = (time.perf_counter() - t0) * 1000
    if rec.get("stdout") != "hello\n":
        raise SystemExit("bench: unexpected record %s" % rec)
    return ms


def cold_print():
    t0 = time.perf_counter()
    subprocess.run([PY, "-c", CODE], check=True, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - t0) * 1000


def sequential(srv, n):
    rc, py = [], []
    for _ in range(5):  # warm-up
        lifecycle(srv)
        cold_print()
    for _ in range(n):
        rc.append(lifecycle(srv))
        py.append(cold_print())
    return rc, py


def concurrent(srv, k, total):
    times, errors = [], []
    lock = threading.Lock()
    go = threading.Barrier(k + 1)

    def client(count):
        local = Server.__new__(Server)
        local.__dict__.update(port=srv.port, token=srv.token, conn=None)
        go.wait()
        for _ in range(count):
            try:
                ms = lifecycle(local)
            except Exception as e:  # reported, not hidden
                errors.append(str(e))
                return
            with lock:
                times.append(ms)
    threads = [threading.Thread(target=client, args=(max(1, total // k),)) for _ in range(k)]
    for t in threads:
        t.start()
    go.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return times, time.perf_counter() - t0, errors


def creates(srv, m, batches=3, clients=4):
    """Sessions created per second in each of `batches` batches of m, sessions kept open
    between batches; returns ([rate, ...], [ids])."""
    ids, rates, lock = [], [], threading.Lock()

    def client(count):
        local = Server.__new__(Server)
        local.__dict__.update(port=srv.port, token=srv.token, conn=None)
        for _ in range(count):
            s = local.call("POST", "/v1/sessions", {})
            with lock:
                ids.append(s["id"])
    for _ in range(batches):
        before = len(ids)
        threads = [threading.Thread(target=client, args=(m // clients,)) for _ in range(clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rates.append((len(ids) - before) / (time.perf_counter() - t0))
    return rates, ids


def row(name, xs):
    return "%-44s %5d %9.1f %9.1f %9.1f" % (name, len(xs), pct(xs, 50), pct(xs, 95), pct(xs, 99))


def main(argv):
    runcell = os.path.abspath(argv[0]) if argv and not argv[0].startswith("--") \
        else "build/src/runcell"
    n = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 100
    k = int(argv[argv.index("--clients") + 1]) if "--clients" in argv else 20
    m = int(argv[argv.index("--creates") + 1]) if "--creates" in argv else 300
    summary = argv[argv.index("--summary") + 1] if "--summary" in argv else None
    print("runcell bench: create -> print -> close, %s; load average %s" % (
        time.strftime("%Y-%m-%d %H:%M:%S %Z"), " ".join("%.2f" % x for x in os.getloadavg())))
    srv = Server(runcell)
    try:
        time.sleep(1.0)  # the ready pool fills
        rc, py = sequential(srv, n)
        time.sleep(1.0)
        conc, wall_s, errors = concurrent(srv, k, n)
        time.sleep(1.0)
        rates, ids = creates(srv, m)
        for sid in ids:
            srv.call("DELETE", "/v1/sessions/" + sid)
    finally:
        srv.stop()
    print("%-44s %5s %9s %9s %9s" % ("ms", "n", "p50", "p95", "p99"))
    print(row("runcell, sequential", rc))
    print(row("cold python3 -c print (same rounds)", py))
    print(row("runcell, %d concurrent clients" % k, conc))
    print("sequential runcell / cold python3 (p50): %.2fx" % (pct(rc, 50) / pct(py, 50)))
    print("concurrent: %d lifecycles in %.2f s, %.0f/s%s" % (
        len(conc), wall_s, len(conc) / wall_s, "; errors: %s" % errors[:3] if errors else ""))
    print("creates per second, 4 clients, batches of %d beside 0, %d, %d live: %s" % (
        m, m, 2 * m, ", ".join("%.0f" % r for r in rates)))
    if summary:
        with open(summary, "w") as f:
            json.dump({"seq_p50_ms": pct(rc, 50), "seq_p95_ms": pct(rc, 95),
                       "seq_p99_ms": pct(rc, 99), "seq_n": len(rc),
                       "cold_print_p50_ms": pct(py, 50), "conc_clients": k,
                       "conc_p50_ms": pct(conc, 50), "conc_p95_ms": pct(conc, 95),
                       "conc_p99_ms": pct(conc, 99), "conc_n": len(conc),
                       "conc_per_s": len(conc) / wall_s, "creates_per_s": min(rates),
                       "creates_per_s_batches": rates, "creates_batch": m,
                       "errors": errors[:3]}, f)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
