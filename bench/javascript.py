#!/usr/bin/python3
"""bench/javascript.py - JavaScript sessions of runcell serve beside a cold `node -e`, in one
run on this machine.

usage: bench/javascript.py [RUNCELL] [--rounds N] [--starts K]

Measures:
  create -> first result  POST /v1/sessions {"language": "javascript"} + execute "1+1" (a
                          fresh sandbox and a fresh node: JavaScript sessions have no
                          template), beside `node -e "console.log(1+1)"` cold, unsandboxed,
                          and beside the same for a Python session (template + ready pool)
  warm round trip         `x += 1` in one warm JavaScript session over a kept-alive HTTP
                          connection, beside the same in a Python session

Prints one table with the ratios. Standard library only; never part of the tests.
"""
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from api import Runcell, pct, runcell_round_trips  # noqa: E402

NODE = "/usr/bin/node"


def create_first(rc, language, n):
    conn = rc.conn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        sid = rc.call(conn, "POST", "/v1/sessions", {"language": language})["id"]
        rec = rc.call(conn, "POST", "/v1/sessions/%s/execute" % sid, {"code": "1+1"})
        times.append((time.perf_counter() - t0) * 1000)
        assert rec["results"][0]["text/plain"] == "2", rec
        rc.call(conn, "DELETE", "/v1/sessions/" + sid)
    conn.close()
    return times


def node_cold(n):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        out = subprocess.run([NODE, "-e", "console.log(1+1)"], capture_output=True, check=True)
        times.append((time.perf_counter() - t0) * 1000)
        assert out.stdout == b"2\n"
    return times


def main(argv):
    binary = argv[1] if len(argv) > 1 and not argv[1].startswith("-") else "build/src/runcell"
    rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 500
    starts = int(argv[argv.index("--starts") + 1]) if "--starts" in argv else 20
    if not os.access(NODE, os.X_OK):
        sys.exit("bench: %s is missing (scripts/install-deps installs nodejs)" % NODE)
    rc = Runcell(binary)
    try:
        node_cold(3)
        create_first(rc, "javascript", 2)
        rows = [("node -e cold (no sandbox)", node_cold(starts)),
                ("js create -> first result", create_first(rc, "javascript", starts)),
                ("py create -> first result", create_first(rc, "python", starts)),
                ("js warm x += 1 round trip", runcell_round_trips(rc, rounds, "javascript")),
                ("py warm x += 1 round trip", runcell_round_trips(rc, rounds, "python"))]
    finally:
        rc.close()
    print("%-28s %9s %9s %9s" % ("what (ms)", "p50", "p90", "mean"))
    for name, xs in rows:
        print("%-28s %9.2f %9.2f %9.2f" % (name, pct(xs, 0.5), pct(xs, 0.9), statistics.mean(xs)))
    p50 = {name: pct(xs, 0.5) for name, xs in rows}
    print("js create -> first result / node -e cold: %.2fx"
          % (p50["js create -> first result"] / p50["node -e cold (no sandbox)"]))
    print("js create -> first result / py (template): %.2fx"
          % (p50["js create -> first result"] / p50["py create -> first result"]))
    print("js warm round trip / node -e cold: %.3fx"
          % (p50["js warm x += 1 round trip"] / p50["node -e cold (no sandbox)"]))
    print("js warm round trip / py warm round trip: %.2fx"
          % (p50["js warm x += 1 round trip"] / p50["py warm x += 1 round trip"]))


if __name__ == "__main__":
    main(sys.argv)
