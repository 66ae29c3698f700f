#!/usr/bin/python3
"""run.py - runs runcell's integration and security suites, each test module in its own
process with a timeout (a hang fails that module, never the whole run).

usage: tests/run.py [--quick] [PATTERN...]
  --quick   only tests/integration (used for the sanitizer build)
  PATTERN   substrings of module paths to run (default: all)
"""
import glob
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE_TIMEOUT = int(os.environ.get("RUNCELL_TEST_TIMEOUT", "900"))


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


def run_module(m, env):
    # Output goes to a file, not a pipe: a server a test leaked may hold the
    # descriptor, and reading a pipe to its end would then wait for that server.
    with tempfile.TemporaryFile(mode="w+") as log:
        p = subprocess.Popen(["/usr/bin/python3", "-m", "unittest", "-v", m], env=env,
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
    patterns = [a for a in argv if not a.startswith("--")]
    dirs = ["integration"] if quick else ["integration", "security"]
    runs = []  # (module, extra environment, label)
    for d in dirs:
        for m in sorted(glob.glob(os.path.join(HERE, d, "test_*.py"))):
            runs.append((m, {}, ""))
    if not quick and os.geteuid() == 0:
        # The security suite again, against sessions cloned from the template.
        for m in sorted(glob.glob(os.path.join(HERE, "security", "test_*.py"))):
            runs.append((m, {"RUNCELL_TEMPLATE": "1"}, " [template]"))
    if patterns:
        runs = [r for r in runs if any(p in r[0] + r[2] for p in patterns)]
    failed = []
    for m, extra, label in runs:
        env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "lib"),
                   PYTHONDONTWRITEBYTECODE="1", **extra)
        name = os.path.relpath(m, HERE) + label
        t0 = time.time()
        ok, out = run_module(m, env)
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
        return 1
    print("\nall %d test module runs passed" % len(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
