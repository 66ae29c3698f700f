"""Isolation between runs and cleanup after them: a concurrent run must not see another's
/dev/shm, SysV IPC objects, files, processes or host uid, and nothing of a run (processes,
cgroups, mounts, runtime directory) may remain once runcell has exited."""
import json
import signal
import unittest
import uuid

from seclib import (LiveRun, PRELUDE, RUN_DIR, host_pids_with, own_cgroup_dirs, probe,
                    run_record, runcell_leftovers)
from rctest import RuncellTestCase, is_root

SYSV = """
_libc.shmget.restype = _libc.msgget.restype = _libc.semget.restype = ctypes.c_int
IPC_CREAT = 0o1000
def sysv(create):
    flags = (IPC_CREAT | 0o600) if create else 0
    out = {}
    for name, call in (("shm", lambda: _libc.shmget(KEY, 4096, flags)),
                       ("msg", lambda: _libc.msgget(KEY, flags)),
                       ("sem", lambda: _libc.semget(KEY, 1, flags))):
        ctypes.set_errno(0)
        r = call()
        out[name] = "ok" if r >= 0 else errno.errorcode[ctypes.get_errno()]
    return out
def listed(kind):
    return [l.split()[0] for l in open("/proc/sysvipc/" + kind).read().splitlines()[1:]]
"""


class BetweenRuns(RuncellTestCase):
    def test_concurrent_runs_share_no_shm_ipc_files_processes_or_uids(self):
        key = int(uuid.uuid4().int % 0x7FFFFFFF) or 1
        name = "rc-shared-" + uuid.uuid4().hex
        first = LiveRun(PRELUDE + SYSV.replace("KEY", str(key)) + """
import time
open("/dev/shm/NAME", "w").write("run one")
open("/tmp/NAME", "w").write("run one")
open("/workspace/NAME", "w").write("run one")
made = sysv(True)
print(json.dumps({"made": made, "shm_keys": listed("shm"),
                  "uid_map": open("/proc/self/uid_map").read().split()}), flush=True)
time.sleep(600)
""".replace("NAME", name))
        self.addCleanup(first.cancel)
        one = json.loads(first.first_line())
        self.assertEqual(one["made"], {"shm": "ok", "msg": "ok", "sem": "ok"})
        self.assertIn(str(key), one["shm_keys"])

        two, _ = probe(self, SYSV.replace("KEY", str(key)) + """
report({"found": sysv(False), "shm_keys": listed("shm"), "msg_keys": listed("msg"),
        "sem_keys": listed("sem"), "dev_shm": os.listdir("/dev/shm"),
        "files": [oserr(os.stat, d + "/NAME") for d in ("/dev/shm", "/tmp", "/workspace")],
        "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "uid_map": open("/proc/self/uid_map").read().split()})
""".replace("NAME", name))
        self.assertEqual(two["found"], {"shm": "ENOENT", "msg": "ENOENT", "sem": "ENOENT"})
        self.assertEqual((two["shm_keys"], two["msg_keys"], two["sem_keys"]), ([], [], []))
        self.assertEqual(two["dev_shm"], [])
        self.assertEqual(two["files"], ["ENOENT"] * 3)
        self.assertEqual(two["pids"], [1, 2])
        # Nor did run one's objects land in the host's IPC namespace.
        with open("/proc/sysvipc/shm") as f:
            self.assertNotIn(" %d " % key, f.read())
        if is_root():
            # Each workspace has host uids of its own: the two sandbox users differ on the host.
            self.assertNotEqual(one["uid_map"], two["uid_map"])
        self.assertEqual(first.cancel(), 128 + signal.SIGTERM)


class Cleanup(RuncellTestCase):
    def setUp(self):
        if not is_root():
            self.skipTest("runcell's cgroups, workspace mounts and %s exist only as root" %
                          RUN_DIR)

    def test_nothing_remains_after_a_cancelled_run(self):
        marker = "rc-live-" + uuid.uuid4().hex
        # bash, so that the marker is on the payload's command line
        run = LiveRun("echo ready; sleep 600; : " + marker, "--lang", "bash")
        self.addCleanup(run.cancel)
        self.assertEqual(run.first_line(), "ready")
        during = runcell_leftovers(run.p.pid)
        # While it runs: its cgroups (when there are any), its workspace mount, its runtime
        # directory and the payload are all there, so the checks below are not vacuous.
        if own_cgroup_dirs():
            self.assertTrue(any(d.startswith("cgroup ") for d in during), during)
        self.assertTrue(any(d.startswith("mount ") for d in during), during)
        self.assertTrue(any(d.startswith("run dir ") for d in during), during)
        payload = [p for p in host_pids_with(marker) if p != run.p.pid]
        self.assertTrue(payload, "the payload is not visible on the host")
        self.assertEqual(run.cancel(), 128 + signal.SIGTERM)
        self.assertEqual(runcell_leftovers(run.p.pid), [])
        self.assertEqual(host_pids_with(marker), [])

    def test_nothing_remains_after_runs_that_end_on_their_own(self):
        for code, status in (("pass", "ok"), ("raise SystemExit(3)", "error"),
                             ("import os; os.kill(os.getpid(), 9)", "killed")):
            marker = "rc-done-" + uuid.uuid4().hex
            rec, _, pid = run_record("run", "--json", "-c", "%s  # %s" % (code, marker))
            self.assertStatus(rec, status)
            self.assertEqual(runcell_leftovers(pid), [], code)
            self.assertEqual(host_pids_with(marker), [], code)

    def test_sandbox_mounts_never_appear_on_the_host(self):
        # The sandbox root, /tmp, /dev and /proc live in the sandbox's mount namespace only;
        # the host sees at most the workspace tmpfs, and only while the run lives.
        run = LiveRun("import time\nprint('ready', flush=True)\ntime.sleep(600)")
        self.addCleanup(run.cancel)
        self.assertEqual(run.first_line(), "ready")
        with open("/proc/self/mountinfo") as f:
            mine = [l.split()[4] for l in f if "/runcell/%d-" % run.p.pid in l.split()[4]]
        self.assertEqual(len(mine), 1, mine)
        self.assertTrue(mine[0].endswith("/work"), mine)
        run.cancel()


if __name__ == "__main__":
    unittest.main()
