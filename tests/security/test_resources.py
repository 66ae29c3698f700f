"""Resource exhaustion: fork bombs, memory bombs, CPU spinning in many threads, filling the
disk and its inodes, a 10 GB print, and code that will not stop. Each must be contained by
a limit and the run must end with a sane record."""
import json
import os
import subprocess
import unittest
import uuid

from seclib import fork_probe, RUNCELL, host_pids_with, probe, run_json, run_record, runcell_leftovers
from rctest import SLOW, RuncellTestCase, cgroups_expected, slow

MiB = 1 << 20


class Limited(RuncellTestCase):
    """Needs cgroup limits. Where the host should give them (rctest.cgroups_expected: root
    with usable cgroups, or a delegated cgroup) a degraded run fails every test: a skip
    would hide exactly the bug these tests are for. Only where nothing can be had (not root
    and nothing delegated) do they skip, saying why."""

    @classmethod
    def setUpClass(cls):
        rec, p = run_json("pass")
        cls.degraded = rec.get("limits_degraded", True)
        cls.expected, cls.why = cgroups_expected()
        cls.stderr = p.stderr.strip()

    def setUp(self):
        if not self.degraded:
            return
        if self.expected:
            self.fail("runcell ran with degraded limits where the host gives cgroups (%s): %s"
                      % (self.why, self.stderr[:600]))
        self.skipTest("no cgroups to be had here: %s; see test_degraded" % self.why)


class ForkBomb(Limited):
    def test_forks_stop_at_the_pids_limit(self):
        res, _ = probe(self, fork_probe(10000), "--pids", "16")
        self.assertEqual(res["error"], "EAGAIN")
        self.assertLess(res["forks"], 16)  # init and the payload count too

    def test_classic_bash_fork_bomb_is_contained_and_the_run_ends(self):
        # The bomb keeps forking for the whole run; the payload itself sleeps, so only the
        # wall clock ends it. Everything must then be gone, on the host too.
        marker = "rcbomb" + uuid.uuid4().hex
        rec, status, pid = run_record("run", "--json", "--lang", "bash", "--pids", "32",
                                      "--timeout", "5", "-c",
                                      "%s(){ %s|%s& }; %s; sleep 600" % ((marker,) * 4))
        self.assertStatus(rec, "timeout")
        self.assertEqual(status, 124)
        self.assertEqual(host_pids_with(marker), [])
        self.assertEqual(runcell_leftovers(pid), [])


class MemoryBomb(Limited):
    def test_memory_bomb_is_killed_as_oom(self):
        rec, status, pid = run_record("run", "--json", "--memory", "64", "-c",
                                      "a = []\nwhile True: a.append(bytearray(1 << 20))")
        self.assertStatus(rec, "oom")
        self.assertEqual(rec["signal"], 9)
        self.assertEqual(status, 137)
        self.assertEqual(runcell_leftovers(pid), [])
        self.assertLessEqual(rec["usage"]["memory_peak_kb"], 64 * 1024)

    def test_memory_spread_over_processes_is_still_capped(self):
        # Eight children hold 24 MiB each at once, three times the limit: the kernel must
        # kill inside the sandbox. The parent waits for the first death (there is no other
        # way out; the timeout would fail the test) and reports.
        res, _ = probe(self, """
r, w = os.pipe()
kids = []
for i in range(8):
    pid = os.fork()
    if pid == 0:
        os.close(w)
        a = bytearray(24 << 20)
        for j in range(0, len(a), 4096):
            a[j] = 1
        os.read(r, 1)
        os._exit(0)
    kids.append(pid)
os.close(r)
pid, st = os.waitpid(-1, 0)
first = os.WTERMSIG(st) if os.WIFSIGNALED(st) else -os.WEXITSTATUS(st)
os.close(w)
for k in kids:
    if k != pid:
        os.waitpid(k, 0)
report({"first_death": first})
""", "--memory", "64", "--timeout", "60")
        self.assertEqual(res["first_death"], 9)


class CpuSpin(Limited):
    def test_spinning_threads_are_held_to_the_cpu_quota_and_timed_out(self):
        if not any(os.path.exists(p) for p in ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us",
                                                "/sys/fs/cgroup/cpu.max",
                                                "/sys/fs/cgroup/cgroup.controllers")):
            self.skipTest("no cgroup CPU controller on this host")
        # hashlib releases the GIL on large inputs, so these threads really run in parallel.
        rec, status, _ = run_record("run", "--json", "--cpus", "0.25", "--timeout", "3", "-c",
                                    "import hashlib, threading\n"
                                    "data = bytes(1 << 20)\n"
                                    "def spin():\n"
                                    "    while True: hashlib.sha256(data).digest()\n"
                                    "ts = [threading.Thread(target=spin) for _ in range(8)]\n"
                                    "for t in ts: t.start()\n"
                                    "for t in ts: t.join()\n")
        self.assertStatus(rec, "timeout")
        self.assertEqual(status, 124)
        usage = rec["usage"]
        # Eight busy threads would use min(8, cores) cores unthrottled (>= 1.0 x wall); the
        # quota holds them to a quarter of one. Half a core leaves room for accounting slop.
        self.assertLess(usage["cpu_ms"], 0.5 * usage["wall_ms"], usage)
        self.assertGreater(usage["cpu_ms"], 0, usage)


class Disk(Limited):
    def test_disk_and_inodes_run_out_inside_the_caps(self):
        res, _ = probe(self, """
def fill(path):
    n = 0
    try:
        with open(path, "wb") as f:
            while n < (1 << 30):
                f.write(bytes(1 << 16))
                f.flush()
                n += 1 << 16
    except OSError as e:
        return n, errno.errorcode[e.errno]
    return n, "no error"
def inodes(d):
    os.mkdir(d)
    n = 0
    try:
        while n < 1000000:
            open(os.path.join(d, str(n)), "w").close()
            n += 1
    except OSError as e:
        return n, errno.errorcode[e.errno]
    return n, "no error"
r = {}
for top in ("/workspace", "/tmp"):
    st = os.statvfs(top)
    r[top] = {"size": st.f_blocks * st.f_frsize, "inodes": st.f_files,
              "own_fs": os.stat(top).st_dev not in (os.stat("/").st_dev, os.stat("/usr").st_dev),
              "fill": fill(top + "/big"), "inode_fill": inodes(top + "/many")}
    os.unlink(top + "/big")
r["shm"] = fill("/dev/shm/big")
report(r)
""", "--disk", "8")
        for top in ("/workspace", "/tmp"):
            r = res[top]
            self.assertEqual(r["size"], 8 * MiB, top)
            self.assertTrue(r["own_fs"], top)
            written, err = r["fill"]
            self.assertEqual(err, "ENOSPC", top)
            self.assertLessEqual(written, 8 * MiB, top)
            created, err = r["inode_fill"]
            self.assertEqual(err, "ENOSPC", top)
            self.assertLessEqual(created, r["inodes"], top)
        written, err = res["shm"]
        self.assertEqual(err, "ENOSPC")
        self.assertLessEqual(written, 64 * MiB)


class Output(RuncellTestCase):
    def test_ten_gigabyte_print_is_capped_and_runcell_stays_small(self):
        # On a slow host (RUNCELL_TEST_SLOW, QEMU's TCG moves some 20 MB/s through the pipes)
        # one gigabyte: still a thousand times the cap, and every byte still counted.
        gib = 10 if SLOW == 1 else 1
        p = subprocess.Popen([RUNCELL, "run", "--json", "--lang", "bash", "--timeout",
                              str(int(slow(300))),
                              "-c", "yes 0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdef"
                              "ghijklmnopqrstuvwxyz | head -c %dG" % gib],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        out = p.stdout.read()
        p.stdout.close()
        # wait4() on runcell reports the largest peak RSS among runcell and every process it
        # reaped (the sandbox init, which reaped the rest): an upper bound on runcell's own.
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        rec = json.loads(out.decode().splitlines()[-1])
        self.assertStatus(rec, "ok")
        self.assertEqual(p.returncode, 0)
        self.assertTrue(rec["truncated"]["stdout"])
        self.assertFalse(rec["truncated"]["stderr"])
        self.assertLess(len(rec["stdout"]), 1 * MiB + 4096)
        self.assertGreater(len(rec["stdout"]), 1 * MiB - 4096)
        # Every byte was read and counted: 10 GiB less the 512 KiB head and 512 KiB tail kept.
        self.assertIn("[... runcell: %d bytes of output dropped ...]" % ((gib << 30) - MiB),
                      rec["stdout"])
        self.assertLess(ru.ru_maxrss, 64 * 1024, "peak RSS %d KiB" % ru.ru_maxrss)


class WallClock(RuncellTestCase):
    def test_code_that_ignores_signals_and_sleeps_is_killed_at_the_timeout(self):
        marker = "rcsleeper" + uuid.uuid4().hex
        rec, status, pid = run_record("run", "--json", "--timeout", "2", "-c",
                                      "# %s\nimport signal, time\n"
                                      "for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
                                      "    signal.signal(s, signal.SIG_IGN)\n"
                                      "time.sleep(600)" % marker)
        self.assertStatus(rec, "timeout")
        self.assertEqual(status, 124)
        self.assertEqual(host_pids_with(marker), [])
        self.assertEqual(runcell_leftovers(pid), [])


if __name__ == "__main__":
    unittest.main()
