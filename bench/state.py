#!/usr/bin/python3
"""bench/state.py - undo, fork, pause and snapshots of a session with the data stack imported
and 50 MB of DataFrames, over HTTP.

usage: bench/state.py RUNCELL [--rounds N] [--summary FILE]

Two `runcell serve` nodes on one store directory (node B only starts sessions from node A's
snapshots). The session: pandas, numpy and matplotlib imported, then two DataFrames of
25 MB each. Measured, N rounds each (default 20; 3 for the forks of 100):
  undo          a cell `x += 1`, then an undo of it (the undo's request alone is timed)
  fork 10/100   POST .../fork {"count": N} until its answer (every fork ready to run)
  pause->resume keep_memory pause, then a resume; and hibernate, then a resume
  snapshot      the snapshot's request on A; then a session from it on B, to its answer
Memory (PSS, from /proc/PID/smaps_rollup of the sandboxes' processes): what one undo level,
one fork and one paused session cost. Beside each figure: the issue's goal and the
anchors' published figures (not measured here: quoted, with their source), as ratios.
Standard library only; never part of the tests.
"""
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests", "lib"))
from sessions import Server, pct  # noqa: E402
from rctest import descendants  # noqa: E402

ROUNDS = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 20
SUMMARY = sys.argv[sys.argv.index("--summary") + 1] if "--summary" in sys.argv else None
SETUP = ("import numpy as np, pandas as pd, matplotlib\n"
         "a = pd.DataFrame(np.random.rand(3276800 // 8, 8))\n"      # 25 MB
         "b = pd.DataFrame(np.random.rand(3276800 // 8, 8))\n"      # 25 MB
         "x = 0")
# The goals (issue "Undo, fork, pause") and the anchors' published figures, in ms.
GOALS = {"undo": 5, "fork10": 100, "fork100": 1000, "pause_resume": 50, "snapshot_other_node": 500}
ANCHORS = {
    "fork100": ("forkd: 100 forks", 193),
    "pause_resume": ("E2B: pause ~4 s per GiB, resume ~1 s", 1000),
    "snapshot_other_node": ("CubeSandbox: snapshot 46 ms + 40 ms per 100 MB, restore 60-85 ms",
                            46 + 40 * 0.5 + 85),
    "undo": ("Firecracker snapshot restore 4-28 ms", 4),
}


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1000, out


def pss_kb(pids, fields=("Pss:",)):
    """The sum of fields of smaps_rollup over pids, in kB (PSS: a page shared by k processes
    counts 1/k in each, so a clone's share of the template's pages depends on how many
    clones there are)."""
    total = 0
    for pid in pids:
        try:
            with open("/proc/%d/smaps_rollup" % pid) as f:
                for line in f:
                    if line.startswith(fields):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def new_session(srv, history=0):
    s = srv.call("POST", "/v1/sessions", {"history": history, "memory_mb": 2048})
    rec = srv.call("POST", "/v1/sessions/%s/execute" % s["id"], {"code": SETUP})
    if rec["status"] != "ok":
        raise SystemExit("bench: setup failed: %s" % rec)
    return s["id"]


def run(srv, sid, code):
    rec = srv.call("POST", "/v1/sessions/%s/execute" % sid, {"code": code})
    if rec["status"] != "ok":
        raise SystemExit("bench: %r failed: %s" % (code, rec))
    return rec


def bench_undo(srv, out):
    sid = new_session(srv, history=3)
    times = []
    for _ in range(ROUNDS):
        run(srv, sid, "x += 1")
        ms, rep = timed(lambda: srv.call("POST", "/v1/sessions/%s/undo" % sid, {}))
        times.append(ms)
    out["undo"] = times
    srv.call("DELETE", "/v1/sessions/" + sid)


def bench_forks(srv, out):
    sid = new_session(srv)
    for n, rounds in ((10, ROUNDS // 2 or 1), (100, 3)):
        times = []
        for _ in range(rounds):
            ms, r = timed(lambda: srv.call("POST", "/v1/sessions/%s/fork" % sid, {"count": n},
                                           timeout=600))
            times.append(ms)
            for f in r["sessions"]:
                srv.call("DELETE", "/v1/sessions/" + f["id"])
        out["fork%d" % n] = times
    srv.call("DELETE", "/v1/sessions/" + sid)


def bench_pause(srv, out):
    sid = new_session(srv)
    frozen, hib, hib_resume = [], [], []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        srv.call("POST", "/v1/sessions/%s/pause" % sid, {"keep_memory": True})
        srv.call("POST", "/v1/sessions/%s/resume" % sid)
        frozen.append((time.perf_counter() - t0) * 1000)
    for _ in range(max(3, ROUNDS // 4)):
        ms, _ = timed(lambda: srv.call("POST", "/v1/sessions/%s/pause" % sid, {}))
        hib.append(ms)
        ms, _ = timed(lambda: srv.call("POST", "/v1/sessions/%s/resume" % sid))
        hib_resume.append(ms)
    run(srv, sid, "assert len(a) == 409600 and len(b) == 409600")
    out["pause_resume"] = frozen
    out["hibernate"] = hib
    out["hibernate_resume"] = hib_resume
    srv.call("DELETE", "/v1/sessions/" + sid)


def bench_snapshots(a, b, out):
    sid = new_session(a)
    snap, start = [], []
    for _ in range(max(3, ROUNDS // 4)):
        ms, rec = timed(lambda: a.call("POST", "/v1/sessions/%s/snapshots" % sid, {}))
        snap.append(ms)
        ms, s = timed(lambda: b.call("POST", "/v1/sessions", {"snapshot": rec["id"],
                                                                "memory_mb": 2048}))
        start.append(ms)
        run(b, s["id"], "assert len(a) == 409600")
        b.call("DELETE", "/v1/sessions/" + s["id"])
        a.call("DELETE", "/v1/snapshots/" + rec["id"])
    out["snapshot"] = snap
    out["snapshot_start_other_node"] = start
    out["snapshot_other_node"] = [x + y for x, y in zip(snap, start)]
    a.call("DELETE", "/v1/sessions/" + sid)


def bench_memory(srv, out):
    """PSS of the sandboxes' processes: one session, then with 3 undo levels taken after cells
    that each change 10 MB, then one fork, then paused (hibernated)."""
    def sandboxes():
        return set(descendants(srv.proc.pid))
    base_pids = sandboxes()
    sid = new_session(srv, history=3)
    one = pss_kb(sandboxes() - base_pids)
    for i in range(3):
        run(srv, sid, "a.iloc[:%d, 0] += 1" % (160000 * (i + 1) // 3))
    with_hist = pss_kb(sandboxes() - base_pids)
    before_fork = sandboxes()
    r = srv.call("POST", "/v1/sessions/%s/fork" % sid, {"count": 1})
    fork_pids = sandboxes() - before_fork
    out["pss_session_mb"] = one / 1024
    out["pss_per_undo_level_mb"] = max(0, with_hist - one) / 1024 / 3
    out["pss_fork_mb"] = pss_kb(fork_pids) / 1024
    srv.call("DELETE", "/v1/sessions/" + r["sessions"][0]["id"])
    srv.call("POST", "/v1/sessions/%s/pause" % sid, {})
    out["pss_hibernated_mb"] = pss_kb(sandboxes() - base_pids) / 1024
    srv.call("DELETE", "/v1/sessions/" + sid)


def main():
    runcell = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else "build/src/runcell"
    store = tempfile.mkdtemp(prefix="runcell-bench-store-")
    a = Server(runcell, "--store", store, "--node", "bench-a", "--max-timeout", "600")
    b = Server(runcell, "--store", store, "--node", "bench-b")
    out = {}
    try:
        bench_undo(a, out)
        bench_pause(a, out)
        bench_forks(a, out)
        bench_snapshots(a, b, out)
    finally:
        a.stop()
        b.stop()
    # Memory on a server of its own without a pool: no session made ahead (nor the pool grown
    # by the forks above) among the processes counted.
    m = Server(runcell, "--pool", "0")
    try:
        bench_memory(m, out)
    finally:
        m.stop()
        shutil.rmtree(store, ignore_errors=True)
    print("undo, fork, pause and snapshots; a session with pandas imported and 50 MB of "
          "DataFrames (ms)")
    print("%-28s %9s %9s %9s %8s %8s  %s" % ("operation", "p50", "p95", "n", "goal",
                                             "p50/goal", "anchor (published), p50/anchor"))
    summary = {}
    for key in ("undo", "fork10", "fork100", "pause_resume", "hibernate", "hibernate_resume",
                "snapshot", "snapshot_start_other_node", "snapshot_other_node"):
        v = out[key]
        p50, p95 = pct(v, 50), pct(v, 95)
        goal = GOALS.get(key)
        anchor = ANCHORS.get(key)
        summary[key] = {"p50_ms": p50, "p95_ms": p95, "n": len(v), "goal_ms": goal}
        print("%-28s %9.1f %9.1f %9d %8s %8s  %s" % (
            key, p50, p95, len(v), goal or "-", "%.2f" % (p50 / goal) if goal else "-",
            "%s: %.2f" % (anchor[0], p50 / anchor[1]) if anchor else ""))
    print()
    print("memory (PSS, no pool: the template's pages split among it and these sessions only): "
          "a session %.0f MB; each undo level %.1f MB (cells changing ~10 MB each); a fork "
          "%.0f MB; a hibernated session %.1f MB" % (
              out["pss_session_mb"], out["pss_per_undo_level_mb"], out["pss_fork_mb"],
              out["pss_hibernated_mb"]))
    summary["memory"] = {k: out[k] for k in out if k.startswith("pss_")}
    if SUMMARY:
        with open(SUMMARY, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
