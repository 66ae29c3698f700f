"""seclib - helpers shared by the security suite: running probes inside a sandbox and
looking at the host around a run.

A probe is Python code run by the sandbox's /usr/bin/python3. PRELUDE gives it `sc(nr, ...)`,
a raw x86_64 system call through ctypes that returns "ok:VALUE" or the errno name (so a test
can assert the exact way an attack failed), and `report(dict)`, which prints the dict as the
last stdout line for the host side to parse.
"""
import glob
import json
import signal
import select
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "lib"))
# PY and runcell are re-exported for the test modules.
from rctest import PY, RUNCELL, run_json, runcell, slow  # noqa: E402,F401
from rctest import fork_probe  # noqa: E402,F401

BUILD_DIR = os.path.dirname(os.path.dirname(RUNCELL))
# runcell's runtime directory when it runs as root (the suite's normal setting).
RUN_DIR = os.environ.get("RUNCELL_RUNDIR", "/run/runcell")
ATTACK_BIN = os.environ.get("RUNCELL_ATTACK_BIN", os.path.join(BUILD_DIR, "tests", "attack"))

PRELUDE = r'''
import ctypes, errno, json, os, sys
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
def _arg(a):
    return ctypes.c_long(a) if isinstance(a, int) else a
def sc(nr, *args):
    ctypes.set_errno(0)
    r = _libc.syscall(ctypes.c_long(nr), *[_arg(a) for a in args])
    if r == -1:
        e = ctypes.get_errno()
        return errno.errorcode.get(e, str(e))
    return "ok:%d" % r
def oserr(fn, *args, **kw):
    """Calls fn; returns "ok" or the errno name of the OSError it raised."""
    try:
        fn(*args, **kw)
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def report(d):
    sys.stdout.flush()
    print("\n" + json.dumps(d), flush=True)
'''


def probe(test, code, *opts, status="ok", **kw):
    """Runs PRELUDE + code in a sandbox; asserts the record's status and returns
    (the dict the probe reported, the record)."""
    rec, _ = run_json(PRELUDE + code, *opts, **kw)
    test.assertEqual(rec["status"], status, "record: %s" % json.dumps(rec)[:3000])
    lines = [l for l in rec["stdout"].splitlines() if l.startswith("{")]
    test.assertTrue(lines, "the probe reported nothing; record: %s" % json.dumps(rec)[:3000])
    return json.loads(lines[-1]), rec


def host_pids_with(marker):
    """Host pids whose command line contains marker (this process excluded)."""
    found = []
    for d in glob.glob("/proc/[0-9]*"):
        pid = int(os.path.basename(d))
        if pid == os.getpid():
            continue
        try:
            with open(d + "/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def own_cgroup_dirs():
    """For each cgroup hierarchy this process is in, the directory of its cgroup (runcell,
    started by us, creates its "runcell" base below the same cgroup)."""
    dirs = []
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            if ctrls.startswith("name="):
                continue
            if ctrls:
                for c in ctrls.split(","):
                    d = "/sys/fs/cgroup/%s%s" % (c, path.rstrip("/"))
                    if os.path.isdir(d):
                        dirs.append(d)
            elif os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
                dirs.append("/sys/fs/cgroup" + path.rstrip("/"))
    return sorted(set(dirs))


def runcell_leftovers(pid):
    """What a runcell process `pid` may leave on the host: its cgroups, mounts below its
    runtime directory, and that directory. Returns a list of descriptions (empty = clean)."""
    left = []
    for d in own_cgroup_dirs():
        left += ["cgroup " + p for p in glob.glob("%s/runcell/%d-*" % (d, pid))]
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mnt = line.split()[4]
            if "/runcell/%d-" % pid in mnt:
                left.append("mount " + mnt)
    left += ["run dir " + p for p in glob.glob("%s/%d-*" % (RUN_DIR, pid))]
    return left


def run_record(*args, timeout=180, **kw):
    """Runs `runcell ARGS...` (which should include --json); returns (record, exit status,
    runcell's pid) so a test can look for what that process left behind."""
    p = subprocess.Popen([RUNCELL, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, **kw)
    try:
        out, err = p.communicate(timeout=slow(timeout))
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise
    lines = [l for l in out.splitlines() if l.startswith("{")]
    if not lines:
        raise AssertionError("no JSON record; exit %d, stderr: %s" % (p.returncode, err))
    return json.loads(lines[-1]), p.returncode, p.pid


class LiveRun:
    """A runcell run in streaming mode whose payload prints one line when it is set up and
    then sleeps; the test looks around while it lives, then cancels it with SIGTERM."""

    def __init__(self, code, *opts):
        self.p = subprocess.Popen([RUNCELL, "run", "--timeout", "120", *opts, "-c", code],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def first_line(self, timeout=60):
        timeout = slow(timeout)
        buf = b""
        while not buf.endswith(b"\n"):
            ready, _, _ = select.select([self.p.stdout], [], [], timeout)
            if not ready:
                raise AssertionError("the run printed nothing within %d s" % timeout)
            c = os.read(self.p.stdout.fileno(), 1)
            if not c:
                raise AssertionError("the run ended early: %s" % self.p.stderr.read())
            buf += c
        return buf.decode().strip()

    def cancel(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        self.p.communicate(timeout=slow(60))
        return self.p.returncode
