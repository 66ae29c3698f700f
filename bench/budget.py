#!/usr/bin/python3
"""bench/budget.py - /healthz while hostile cells run, beside the same daemon idle.

usage: bench/budget.py RUNCELL [--rounds N] [--summary FILE]

The goal (issue 13 of the tracker): while hostile cells run side by side, /healthz answers
with p99 under 50 ms. The attack is the security suite's (tests/security/test_budget.py):
six cells at once (frames of tiny JSON values and deep nesting, a listing of deep paths, a
sparse file, many files, a huge checkpoint reply), two sessions of each, against a
`runcell serve` of its own (template on, no pool). A separate process probes /healthz
(a new connection each time, 20 ms apart) for as long as they run. Beside it, in the same
run: the same daemon idle, probed the same way as many times; the ratio is attack / idle.
N rounds (3) of the attack, each after an idle round; the figures are over all probes.
Prints the table; `--summary FILE` writes JSON for bench/run. Never part of the tests.
"""
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv):
    runcell = os.path.abspath(argv[0]) if argv and not argv[0].startswith("--") \
        else os.path.join(ROOT, "build", "src", "runcell")
    rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 3
    summary = argv[argv.index("--summary") + 1] if "--summary" in argv else None
    os.environ["RUNCELL_BIN"] = runcell
    os.environ["RUNCELL_TEMPLATE"] = "1"
    sys.path[:0] = [os.path.join(ROOT, "tests", "lib"), os.path.join(ROOT, "tests", "security")]
    from test_budget import attack, percentile, probe_healthz, start_daemon  # noqa: E402
    print("runcell bench: /healthz under attack, %s; load average %s" % (
        time.strftime("%Y-%m-%d %H:%M:%S %Z"), " ".join("%.2f" % x for x in os.getloadavg())))
    idle, busy, failures = [], [], []
    srv = start_daemon()
    try:
        for _ in range(rounds):
            before = len(busy)
            failed, probes = attack(srv, lambda: time.sleep(0.1))
            failures += failed
            busy += [t * 1000 for t, st in probes if st == 200]
            failures += ["/healthz answered %d" % st for _, st in probes if st != 200]
            out, _ = probe_healthz(srv, max(len(busy) - before, 50)).communicate("")
            idle += [t * 1000 for t, _ in json.loads(out)]
    finally:
        srv.close()
    idle.sort()
    busy.sort()
    print("%-34s %6s %8s %8s %8s" % ("/healthz ms", "n", "p50", "p99", "max"))
    for name, xs in (("while the hostile cells run", busy), ("the same daemon idle", idle)):
        print("%-34s %6d %8.2f %8.2f %8.2f" % (name, len(xs), percentile(xs, 50),
                                                percentile(xs, 99), xs[-1]))
    p99 = percentile(busy, 99)
    print("goal p99 < 50 ms: %s (%.1f ms); attack / idle p99 %.1fx" % (
        "met" if p99 < 50 else "MISSED", p99, p99 / percentile(idle, 99)))
    for f in failures:
        print("FAILED: " + f)
    if summary:
        with open(summary, "w") as f:
            json.dump({"attack_p50_ms": percentile(busy, 50), "attack_p99_ms": p99,
                       "attack_max_ms": busy[-1], "idle_p50_ms": percentile(idle, 50),
                       "idle_p99_ms": percentile(idle, 99), "probes": len(busy),
                       "rounds": rounds}, f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
