#!/usr/bin/python3
"""run.py - runs runcell's integration and security suites, each test module in its own
process with a timeout (a hang fails that module, never the whole run).

usage: tests/run.py [--quick] [--shuffle [--seed N]] [PATTERN...]
  --quick     only tests/integration (used for the sanitizer build)
  --shuffle   the modules, and the tests inside each module, in a random order; the seed
              is printed so that a failing order can be replayed with --seed N
  --seed N    the seed of --shuffle (implies it)
  PATTERN     substrings of module paths to run (default: all)
The last line counts the test module runs: "N passed, N failed".
"""
import glob
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE_TIMEOUT = int(os.environ.get("RUNCELL_TEST_TIMEOUT", "900"))
# The security modules whose probes run as cells of a session: run a third time in forks.
FORKED = ["test_isolation", "test_process", "test_syscalls", "test_filesystem", "test_network"]


def stop_group(pgid):
    """Ends whatever a module left behind in its process group (servers a killed or
    hung test could not stop): TERM, a moment to shut down cleanly, then KILL."""
    for sig, pause in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.time() + pause
        while time.time() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


# Runs one module's tests with unittest, in an order shuffled by the seed in the
# environment: its classes in a random order, and the tests of each class in a random order
# (a class stays together, so that its setUpClass runs once).
SHUFFLED_MAIN = """
import os, random, sys, unittest
rng = random.Random("%s:%s" % (os.environ["RUNCELL_TEST_SEED"], sys.argv[1]))
suite = unittest.defaultTestLoader.loadTestsFromName(sys.argv[1])
def flat(s):
    for t in s:
        yield from (flat(t) if isinstance(t, unittest.TestSuite) else [t])
classes = {}
for t in flat(suite):
    classes.setdefault(type(t), []).append(t)
groups = list(classes.values())
rng.shuffle(groups)
for g in groups:
    rng.shuffle(g)
result = unittest.TextTestRunner(verbosity=2).run(unittest.TestSuite(t for g in groups for t in g))
sys.exit(not result.wasSuccessful())
"""


def unittest_argv(m, seed):
    if seed is None:
        return ["/usr/bin/python3", "-m", "unittest", "-v", m]
    name = os.path.splitext(os.path.basename(m))[0]
    return ["/usr/bin/python3", "-c", SHUFFLED_MAIN, name]


def run_module(m, env, seed=None):
    # Output goes to a file, not a pipe: a server a test leaked may hold the
    # descriptor, and reading a pipe to its end would then wait for that server.
    with tempfile.TemporaryFile(mode="w+") as log:
        if seed is not None:
            env = dict(env, RUNCELL_TEST_SEED=str(seed))
        p = subprocess.Popen(unittest_argv(m, seed), env=env,
                             cwd=os.path.dirname(m), stdout=log, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
        try:
            p.wait(timeout=MODULE_TIMEOUT)
            ok, head = p.returncode == 0, ""
        except subprocess.TimeoutExpired:
            ok, head = False, "TIMEOUT after %d s\n" % MODULE_TIMEOUT
        finally:
            stop_group(p.pid)
            p.wait()
        log.seek(0)
        return ok, head + log.read()


def main(argv):
    # A TERM to this runner (CI cancelling, a developer's kill) ends the running
    # module's group too, by way of the finally in run_module.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    quick = "--quick" in argv
    seed, rest = None, []
    args = iter(argv)
    for a in args:
        if a == "--seed":
            seed = int(next(args, "x"))
        elif a.startswith("--seed="):
            seed = int(a.split("=", 1)[1])
        else:
            rest.append(a)
    if "--shuffle" in rest and seed is None:
        seed = random.SystemRandom().randrange(1 << 32)
    patterns = [a for a in rest if not a.startswith("--")]
    dirs = ["integration"] if quick else ["integration", "security"]
    runs = []  # (module, extra environment, label)
    for d in dirs:
        for m in sorted(glob.glob(os.path.join(HERE, d, "test_*.py"))):
            runs.append((m, {}, ""))
    if not quick and os.geteuid() == 0:
        # The security suite again, against sessions cloned from the template.
        for m in sorted(glob.glob(os.path.join(HERE, "security", "test_*.py"))):
            runs.append((m, {"RUNCELL_TEMPLATE": "1"}, " [template]"))
        # And the probes that run as cells, in a fork of another session (RUNCELL_FORKED:
        # the parent exported to a store and the fork resumed from it, as forks, snapshots
        # and resumes are made).
        for name in FORKED:
            runs.append((os.path.join(HERE, "security", name + ".py"),
                         {"RUNCELL_TEMPLATE": "1", "RUNCELL_FORKED": "1"}, " [forked]"))
    if patterns:
        runs = [r for r in runs if any(p in r[0] + r[2] for p in patterns)]
    if seed is not None:
        random.Random(seed).shuffle(runs)
        print("shuffled with seed %d (replay: tests/run.py --seed %d%s)"
              % (seed, seed, "".join(" " + a for a in rest if a != "--shuffle")), flush=True)
    failed = []
    for m, extra, label in runs:
        env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "lib"),
                   PYTHONDONTWRITEBYTECODE="1", **extra)
        name = os.path.relpath(m, HERE) + label
        t0 = time.time()
        ok, out = run_module(m, env, seed)
        status = "ok" if ok else "FAIL"
        skips = out.count("skipped ")
        print("%-48s %s (%.1f s%s)" % (name, status, time.time() - t0,
                                        ", %d skipped" % skips if skips else ""), flush=True)
        if not ok:
            failed.append(name)
            print(out, flush=True)
        elif skips:
            for line in out.splitlines():
                if "skipped " in line:
                    print("    " + line.strip())
    if failed:
        print("\nFAILED: " + ", ".join(failed))
        if seed is not None:
            print("shuffled with seed %d" % seed)
    else:
        print("\nall %d test module runs passed" % len(runs))
    print("%d passed, %d failed" % (len(runs) - len(failed), len(failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
