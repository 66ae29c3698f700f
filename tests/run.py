#!/usr/bin/python3
"""run.py - runs runcell's integration and security suites, each test module in its own
process with a timeout (a hang fails that module, never the whole run).

usage: tests/run.py [--quick] [PATTERN...]
  --quick   only tests/integration (used for the sanitizer build)
  PATTERN   substrings of module paths to run (default: all)
"""
import glob
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE_TIMEOUT = int(os.environ.get("RUNCELL_TEST_TIMEOUT", "900"))


def main(argv):
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
        try:
            p = subprocess.run(["/usr/bin/python3", "-m", "unittest", "-v", m], env=env,
                               cwd=os.path.dirname(m), timeout=MODULE_TIMEOUT,
                               capture_output=True, text=True)
            ok = p.returncode == 0
            out = p.stdout + p.stderr
        except subprocess.TimeoutExpired as e:
            ok = False
            out = "TIMEOUT after %d s\n%s" % (MODULE_TIMEOUT, (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or ""))
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
