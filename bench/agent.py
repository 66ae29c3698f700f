#!/usr/bin/python3
"""bench/agent.py - what the agent loop costs per step, the model's own time taken out.

usage: bench/agent.py RUNCELL [--rounds N] [--steps S] [--summary FILE]

Runs `runcell agent` N times (10) against tests/lib/scripted_model.py (an OpenAI-compatible
server on 127.0.0.1 that answers from a script at once), each run S steps (20) that call
run_python with a one-line cell, then the answer. The model side timestamps each request's
arrival and the moment its answer is written (by wrapping the server's handler), so the
model's own time is never in the figure: a step's loop overhead is the gap from one answer
written to the next request's arrival, which is everything runcell does between two model
turns (parse the answer, run the cell in the session's sandbox, build the observation and
the next request with the conversation so far, send it). Beside it, the cell's own wall
time from its record: the part of a step the sandbox costs anyway. Prints p50/p90/p99 over
N x S steps and the whole runs' figures; `--summary FILE` writes JSON for bench/run. Never
part of the tests.
"""
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scripted_model import ScriptedModel  # noqa: E402
from sessions import pct  # noqa: E402


class TimedModel(ScriptedModel):
    """The scripted model, with the time spent answering each chat request added up."""

    def __init__(self, script):
        super().__init__(script)
        self.busy_s = 0.0
        self.spans = []  # (arrival, answered) of each chat request, perf_counter seconds
        self.busy_lock = threading.Lock()
        model, base = self, self.httpd.RequestHandlerClass

        class Timed(base):
            def do_POST(self):
                t0 = time.perf_counter()
                try:
                    super().do_POST()
                finally:
                    t1 = time.perf_counter()
                    with model.busy_lock:
                        model.busy_s += t1 - t0
                        model.spans.append((t0, t1))
        self.httpd.RequestHandlerClass = Timed


def one_run(runcell, data, steps):
    """One agent run of `steps` tool steps; returns (wall ms, model ms, gaps ms, outcome)."""
    script = [{"tool": "run_python", "code": "x = %d" % i} for i in range(steps)]
    script.append({"answer": "done"})
    with TimedModel(script) as m:
        t0 = time.perf_counter()
        p = subprocess.run([runcell, "agent", "--base-url", m.base_url, "--model", "scripted",
                            "--data", data, "--no-memory", "--max-steps", str(steps + 5),
                            "--json", "set x"], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, OPENAI_API_KEY="sk-bench"))
        wall = (time.perf_counter() - t0) * 1000
        model_ms = m.busy_s * 1000
        served = m.served
        spans = sorted(m.spans)
    gaps = [(spans[i + 1][0] - spans[i][1]) * 1000 for i in range(len(spans) - 1)]
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode or not lines:
        raise SystemExit("bench: runcell agent failed (exit %d): %s" % (p.returncode,
                                                                         p.stderr[-2000:]))
    out = json.loads(lines[-1])
    if out.get("outcome") != "answered" or served != steps + 1:
        raise SystemExit("bench: unexpected outcome %s" % out)
    return wall, model_ms, gaps, out


def main(argv):
    runcell = os.path.abspath(argv[0]) if argv and not argv[0].startswith("--") \
        else "build/src/runcell"
    rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 10
    steps = int(argv[argv.index("--steps") + 1]) if "--steps" in argv else 20
    summary = argv[argv.index("--summary") + 1] if "--summary" in argv else None
    print("runcell bench: agent loop per step, %s; load average %s" % (
        time.strftime("%Y-%m-%d %H:%M:%S %Z"), " ".join("%.2f" % x for x in os.getloadavg())))
    gaps, cell_ms, walls, model = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="runcell-bench-") as data:
        one_run(runcell, data, 2)  # warm-up
        for _ in range(rounds):
            wall, model_ms, g, out = one_run(runcell, data, steps)
            gaps += g
            walls.append(wall)
            model.append(model_ms)
            cell_ms += [a["wall_ms"] for a in out["attempts"] if "wall_ms" in a]
    print("%-50s %6s %8s %8s %8s" % ("ms", "n", "p50", "p90", "p99"))
    for name, xs in (("loop overhead per step, model time excluded", gaps),
                     ("  of which the cell's wall time (its record)", cell_ms)):
        if xs:
            print("%-50s %6d %8.2f %8.2f %8.2f" % (name, len(xs), pct(xs, 50), pct(xs, 90),
                                                   pct(xs, 99)))
    print("whole run of %d steps: p50 %.0f ms, of which the model %.1f ms (a fresh session "
          "and the process's start and end are in it too)" % (steps, pct(walls, 50),
                                                             pct(model, 50)))
    if summary:
        with open(summary, "w") as f:
            json.dump({"step_overhead_ms": pct(gaps, 50), "step_overhead_p90_ms": pct(gaps, 90),
                       "step_overhead_p99_ms": pct(gaps, 99),
                       "cell_wall_ms": pct(cell_ms, 50) if cell_ms else None,
                       "steps": steps, "rounds": rounds}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
