#!/usr/bin/python3
"""bench/compare.py - two builds of runcell side by side in one run: create -> first result
(a new session, then its first cell `1`) and warm `x += 1` over HTTP, in interleaved blocks
so that what the machine does meanwhile falls on both alike.

usage: bench/compare.py OLD_RUNCELL NEW_RUNCELL [--blocks N] [--rounds N] [--json FILE]

Each block runs, for each build in turn (the order alternating), `--rounds` warm round trips
on one kept connection and `--rounds // 10` creations each followed by its first cell; the
figures are the p50 and p99 over all blocks, and new/old as a ratio (below 1: the new build
is faster)."""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from api import Runcell, pct, runcell_round_trips  # noqa: E402


def first_results(rc, n):
    """Create, then the session's first cell, n times: the time to its result."""
    conn = rc.conn()
    times, ids = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        sid = rc.create(conn)
        rec = rc.call(conn, "POST", "/v1/sessions/%s/execute" % sid, {"code": "1"})
        times.append((time.perf_counter() - t0) * 1000)
        assert rec["status"] == "ok", rec
        ids.append(sid)
    for sid in ids:
        rc.call(conn, "DELETE", "/v1/sessions/" + sid)
    conn.close()
    return times


def main(argv):
    args = list(argv)
    blocks, rounds, out = 6, 500, None
    builds = []
    while args:
        a = args.pop(0)
        if a == "--blocks":
            blocks = int(args.pop(0))
        elif a == "--rounds":
            rounds = int(args.pop(0))
        elif a == "--json":
            out = args.pop(0)
        elif a in ("-h", "--help"):
            print(__doc__)
            return 0
        else:
            builds.append(a)
    if len(builds) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    servers = [Runcell(b) for b in builds]
    warm = [[], []]
    first = [[], []]
    try:
        for blk in range(blocks):
            order = (0, 1) if blk % 2 == 0 else (1, 0)
            for i in order:
                warm[i] += runcell_round_trips(servers[i], rounds)
                first[i] += first_results(servers[i], max(rounds // 10, 5))
    finally:
        for s in servers:
            s.close()
    figures = {}
    print("%-28s %12s %12s %8s" % ("", "old", "new", "new/old"))
    for name, data in (("warm x += 1, ms", warm), ("create -> first result, ms", first)):
        for q in (50, 99):
            o, n = pct(data[0], q / 100), pct(data[1], q / 100)
            figures["%s p%d" % (name, q)] = {"old": o, "new": n, "ratio": n / o}
            print("%-28s %12.3f %12.3f %8.2f" % ("%s p%d" % (name, q), o, n, n / o))
    print("load average at the end: %s" % open("/proc/loadavg").read().split()[:3])
    if out:
        with open(out, "w") as f:
            json.dump({"builds": builds, "blocks": blocks, "rounds": rounds,
                       "figures": figures}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
