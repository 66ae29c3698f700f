"""Degraded mode: runcell without cgroups (RUNCELL_NO_CGROUPS) and without root (run here
as the unprivileged user nobody). The record must say limits_degraded, the isolation must
hold, and rlimits must still contain bombs."""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

from seclib import fork_probe, PRELUDE, RUNCELL, probe
from rctest import RuncellTestCase, is_root, reachable_runcell

NOBODY = 65534


def as_nobody(*args, env=None, timeout=180, exe=False):
    """Runs `runcell ARGS...` (with exe, ARGS[0] is the binary) as uid/gid nobody with a
    clean environment and no cgroups; returns (record or None, completed process)."""
    e = {"PATH": "/usr/bin:/bin", "RUNCELL_NO_CGROUPS": "1"}
    e.update(env or {})
    # runcell as nobody reaches it, whatever the mode of the directories above the build.
    argv = list(args) if exe else [reachable_runcell(), *args]
    p = subprocess.run(["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY,
                        "--clear-groups", *argv], env=e, cwd="/",
                       capture_output=True, text=True, timeout=timeout)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    return (json.loads(lines[-1]) if lines else None), p


def report_of(test, rec):
    lines = [l for l in rec["stdout"].splitlines() if l.startswith("{")]
    test.assertTrue(lines, "the probe reported nothing; record: %s" % json.dumps(rec)[:3000])
    return json.loads(lines[-1])


class Unprivileged(RuncellTestCase):
    @classmethod
    def setUpClass(cls):
        cls.why_not = None
        if not is_root():
            cls.why_not = "needs root to switch to the unprivileged user nobody"
        elif not shutil.which("setpriv"):
            cls.why_not = "setpriv (util-linux) is not installed"
        else:
            rec, p = as_nobody("run", "--json", "-c", "pass")
            if not rec or rec["status"] != "ok":
                cls.why_not = ("runcell cannot build a sandbox as nobody here: "
                               "%s %s" % (p.stderr.strip()[:300], rec and rec.get("message")))

    def setUp(self):
        if self.why_not:
            self.skipTest(self.why_not)

    def probe(self, code, *opts, env=None, status="ok"):
        rec, p = as_nobody("run", "--json", *opts, "-c", PRELUDE + code, env=env)
        self.assertIsNotNone(rec, p.stderr)
        self.assertStatus(rec, status)
        self.assertTrue(rec["limits_degraded"])
        self.assertIn("resource limits are degraded", p.stderr)
        return rec

    def test_isolation_holds_without_root(self):
        rec = self.probe("""
st = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
report({"caps": [st[k].strip() for k in ("CapEff", "CapPrm", "CapBnd")],
        "nnp": st["NoNewPrivs"].strip(), "seccomp": st["Seccomp"].strip(),
        "uid_map": open("/proc/self/uid_map").read().split(),
        "unshare_user": sc(272, 0x10000000), "mount": sc(165, b"none", b"/tmp", b"tmpfs", 0, 0),
        "shadow": oserr(os.stat, "/etc/shadow"), "root": oserr(os.listdir, "/proc/1/root"),
        "write_usr": oserr(os.open, "/usr/evil", os.O_WRONLY | os.O_CREAT, 0o644),
        "packet": sc(41, 17, 3, 0), "pids": sorted(p for p in os.listdir("/proc") if p.isdigit())})
""")
        res = report_of(self, rec)
        self.assertEqual(res["caps"], ["0000000000000000"] * 3)
        self.assertEqual((res["nnp"], res["seccomp"]), ("1", "2"))
        # Only the one id the kernel lets an unprivileged user map: the sandbox user is
        # nobody on the host.
        self.assertEqual(res["uid_map"], ["1000", str(NOBODY), "1"])
        self.assertEqual(res["unshare_user"], "EPERM")
        self.assertEqual(res["mount"], "EPERM")
        self.assertEqual(res["shadow"], "ENOENT")
        self.assertEqual(res["root"], "EACCES")
        self.assertIn(res["write_usr"], ("EROFS", "EACCES"))
        self.assertEqual(res["packet"], "EAFNOSUPPORT")
        self.assertEqual(res["pids"], ["1", "2"])

    def test_landlock_scopes_signals_to_init_of_the_same_uid(self):
        # Without root, init and the payload share a uid, so only Landlock's signal scope
        # (ABI 6) stops the payload from signalling init. Control: without Landlock it can.
        code = 'report({"abi": sc(444, 0, 0, 1), "kill_init": oserr(os.kill, 1, 0)})'
        control = report_of(self, self.probe(code, env={"RUNCELL_NO_LANDLOCK": "1"}))
        abi = control["abi"]
        if not abi.startswith("ok:") or int(abi[3:]) < 6:
            self.skipTest("Landlock signal scoping needs ABI 6 (Linux 6.12); here: %s" % abi)
        self.assertEqual(control["kill_init"], "ok")
        res = report_of(self, self.probe(code))
        self.assertEqual(res["kill_init"], "EPERM")

    def test_memory_bomb_is_stopped_by_the_address_space_limit(self):
        rec = self.probe("a = []\nwhile True: a.append(bytearray(1 << 20))", "--memory", "64",
                         status="error")
        self.assertEqual(rec["error"]["name"], "MemoryError")  # -c runs as a cell

    def test_fork_bomb_is_stopped_by_the_process_limit(self):
        rec = self.probe(fork_probe(5000), "--pids", "16")
        res = report_of(self, rec)
        self.assertEqual(res["error"], "EAGAIN")
        # RLIMIT_NPROC counts every process of nobody on the host, plus the sandbox's.
        self.assertLess(res["forks"], 16 + 200)

    def test_files_are_capped_by_the_file_size_limit(self):
        rec = self.probe("""
def fill(path):
    n = 0
    try:
        with open(path, "wb", buffering=0) as f:
            while n < (64 << 20):
                n += f.write(bytes(1 << 16))
    except OSError as e:
        return n, errno.errorcode[e.errno]
    return n, "no error"
report({"workspace": fill("/workspace/big"), "tmp": fill("/tmp/big")})
""", "--disk", "8")
        res = report_of(self, rec)
        self.assertEqual(res["workspace"], [8 << 20, "EFBIG"])
        self.assertIn(res["tmp"][1], ("EFBIG", "ENOSPC"))
        self.assertLessEqual(res["tmp"][0], 8 << 20)


    def test_workspace_removal_never_follows_planted_links(self):
        # Without root the workspace is a plain host directory that runcell deletes after the
        # run, as the same user that owns the victim below: a removal that followed the
        # planted links would take the victim with it.
        victim = tempfile.mkdtemp(prefix="rc-victim-")
        self.addCleanup(shutil.rmtree, victim, ignore_errors=True)
        with open(os.path.join(victim, "precious"), "w") as f:
            f.write("keep me")
        os.chown(victim, NOBODY, NOBODY)
        os.chown(os.path.join(victim, "precious"), NOBODY, NOBODY)
        self.probe("""
os.symlink(VICTIM, "/workspace/link")
os.makedirs("/workspace/deep/er")
os.symlink(VICTIM, "/workspace/deep/er/link")
os.symlink(VICTIM + "/precious", "/workspace/file_link")
report({})
""".replace("VICTIM", repr(victim)))
        self.assertTrue(os.path.isfile(os.path.join(victim, "precious")))


class HelperOutOfReach(RuncellTestCase):
    def test_a_closed_build_directory_is_named_as_the_cause(self):
        """runcell and its helper in a 0700 directory, run as nobody: the error says the
        helper there is out of reach, not that none is installed elsewhere."""
        if not is_root() or not shutil.which("setpriv"):
            self.skipTest("needs root and setpriv to run runcell as nobody")
        top = tempfile.mkdtemp(prefix="rc-closed-")  # 0700, as mktemp makes it
        self.addCleanup(shutil.rmtree, top, ignore_errors=True)
        src = os.path.dirname(os.path.realpath(RUNCELL))
        for name in ("runcell", "runcell-sandbox"):
            shutil.copy2(os.path.join(src, name), top)
        rec, p = as_nobody(os.path.join(top, "runcell"), "run", "--json", "-c", "pass",
                           exe=True)
        self.assertEqual(p.returncode, 125, p.stderr)
        self.assertIn("cannot run the sandbox helper %s/runcell-sandbox as uid %d: permission "
                      "denied" % (top, NOBODY), rec["message"])
        self.assertNotIn("libexec", rec["message"])


class RootWithoutCgroups(RuncellTestCase):
    def setUp(self):
        if not is_root():
            self.skipTest("this case runs runcell as root with cgroups switched off")

    def test_record_says_degraded_and_rlimits_hold(self):
        res, rec = probe(self, """
import resource
report({"as": resource.getrlimit(resource.RLIMIT_AS),
        "nproc": resource.getrlimit(resource.RLIMIT_NPROC)[0] != resource.RLIM_INFINITY})
""", "--memory", "64", env={"RUNCELL_NO_CGROUPS": "1"})
        self.assertTrue(rec["limits_degraded"])
        self.assertEqual(res["as"], [64 << 20, 64 << 20])
        self.assertTrue(res["nproc"])


if __name__ == "__main__":
    unittest.main()
