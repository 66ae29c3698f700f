#!/usr/bin/python3
"""bench/bash.py - bash cells in a session's long-lived shell, beside a cold `bash -c`.

usage: bench/bash.py [RUNCELL] [--rounds N]

Measures, over HTTP/1.1 with a kept-alive connection to `runcell serve`:
  warm         `echo hi` as a bash cell of a bash session whose shell already runs (what
               every cell after the first costs);
  cold inside  `bash -c 'echo hi'` as such a cell: the warm round trip plus a fresh bash,
               which is what each bash cell cost before the shell was kept;
  first cell   a new bash session to the record of its first cell (session start, kernel,
               the shell's start), beside a new Python session to its first `1+1`;
and on the host, without runcell:
  bash -c      subprocess.run(["/bin/bash", "-c", "echo hi"]): a cold bash, the floor of a
               shell started per cell.

Prints p50/p90 per row and the ratios cold/warm. Standard library only; never part of
the tests.
"""
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from api import Runcell, pct  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(fn, rounds, warmup=20):
    times = []
    for i in range(rounds + warmup):
        t0 = time.perf_counter()
        fn()
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1000)
    return times


def main(argv):
    binary = os.path.join(ROOT, "build", "src", "runcell")
    rounds = 300
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--rounds":
            rounds = int(args.pop(0))
        else:
            binary = a
    rc = Runcell(binary)
    try:
        conn = rc.conn()
        sid = rc.call(conn, "POST", "/v1/sessions", {"language": "bash"})["id"]
        path = "/v1/sessions/%s/execute" % sid

        def cell(code):
            rec = rc.call(conn, "POST", path, {"code": code})
            assert rec["status"] == "ok" and rec["stdout"] == "hi\n", rec

        rows = [("warm: echo hi", timed(lambda: cell("echo hi"), rounds)),
                ("cold inside: bash -c", timed(lambda: cell("bash -c 'echo hi'"), rounds))]
        rc.call(conn, "DELETE", "/v1/sessions/" + sid)

        def first_result(language, code, want):
            # create -> first record, timed; the close is not
            times = []
            for i in range(max(rounds // 10, 5) + 3):
                t0 = time.perf_counter()
                s = rc.call(conn, "POST", "/v1/sessions", {"language": language})["id"]
                rec = rc.call(conn, "POST", "/v1/sessions/%s/execute" % s, {"code": code})
                if i >= 3:
                    times.append((time.perf_counter() - t0) * 1000)
                assert rec["stdout"] == want or rec["results"][0]["text/plain"] == want, rec
                rc.call(conn, "DELETE", "/v1/sessions/" + s)
            return times
        rows.append(("create -> first: echo hi", first_result("bash", "echo hi", "hi\n")))
        rows.append(("create -> first: python 1+1", first_result("python", "1+1", "2")))
        conn.close()
    finally:
        rc.close()
    rows.append(("host: bash -c (no runcell)",
                 timed(lambda: subprocess.run(["/bin/bash", "-c", "echo hi"],
                                              stdout=subprocess.DEVNULL, check=True), rounds)))
    print("%-30s %9s %9s %7s" % ("bash cell", "p50 ms", "p90 ms", "n"))
    for name, t in rows:
        print("%-30s %9.3f %9.3f %7d" % (name, statistics.median(t), pct(t, 0.9), len(t)))
    warm, cold = statistics.median(rows[0][1]), statistics.median(rows[1][1])
    host = statistics.median(rows[4][1])
    print("\ncold bash -c cell / warm cell: %.2fx (the shell kept saves %.3f ms a cell)"
          % (cold / warm, cold - warm))
    print("host bash -c / warm cell over HTTP: %.2fx" % (host / warm))
    print("first bash cell over first python cell: %+.1f ms (the shell's start)"
          % (statistics.median(rows[2][1]) - statistics.median(rows[3][1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
