#!/usr/bin/python3
"""unit.py - runs the unit tests in the VM guest, as `meson test` would, from the list the
host saved (`meson introspect --tests`, unit-tests.json in the results share): the build
directory is read-only in the guest, where meson cannot write its logs. Each test runs in a
scratch directory with its timeout scaled by RUNCELL_TEST_SLOW. Exits 1 if any failed."""
import json
import os
import subprocess
import sys
import tempfile
import time

SLOW = float(os.environ.get("RUNCELL_TEST_SLOW", "1") or 1)


def main():
    with open(os.path.join(sys.argv[1] if len(sys.argv) > 1 else "/run/vm-results",
                           "unit-tests.json")) as f:
        tests = json.load(f)
    failed = []
    for t in tests:
        env = dict(os.environ, **t.get("env", {}))
        limit = (t.get("timeout") or 30) * SLOW
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="runcell-unit-") as cwd:
            try:
                p = subprocess.run(t["cmd"], env=env, cwd=t.get("workdir") or cwd,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   timeout=limit)
                ok, out, rc = p.returncode == 0, p.stdout, p.returncode
            except subprocess.TimeoutExpired as e:
                ok, out, rc = False, e.stdout or b"", "timeout after %d s" % limit
        print("%-20s %s (%.1f s)" % (t["name"], "ok" if ok else "FAIL (%s)" % rc,
                                     time.monotonic() - t0), flush=True)
        if not ok:
            failed.append(t["name"])
            sys.stdout.write(out.decode("utf-8", "replace"))
    if failed:
        print("\nFAILED: " + ", ".join(failed))
        return 1
    print("\nall %d unit tests passed" % len(tests))
    return 0


if __name__ == "__main__":
    sys.exit(main())
