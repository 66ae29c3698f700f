"""test_doctor - `runcell doctor` against the host's real state: the cgroup version and
placement it reports are those of /proc/self/mountinfo and /proc/self/cgroup, the Landlock
ABI is the kernel's answer, the sysctls are /proc/sys's, the Python versions those
/usr/bin/python3 imports; its exit status says whether limits are full; it leaves nothing
behind; bad options are usage errors. Timeouts only stop hangs."""
import ctypes
import json
import os
import shutil
import subprocess
import tempfile
import unittest

from rctest import (HANG, RUNCELL, RuncellTestCase, TempDir, _cgroup_mount, _own_cgroup,
                    cgroups_expected, cgroups_of, is_root, procs_with, run_dir_entries)

SYS_landlock_create_ruleset = 444


def sanitizer_build():
    """Why a sandbox or template check cannot hold for this binary, or None: in an
    ASan build the template's Python module is instrumented too and cannot load into
    Debian's uninstrumented python3, and the instrumented helper cannot start under the
    address-space rlimit that stands in for cgroups."""
    out = subprocess.run(["ldd", RUNCELL], capture_output=True, text=True).stdout
    return "an ASan build of runcell (%s)" % RUNCELL if "libasan" in out else None


def doctor(*args, env=None):
    """Runs `runcell doctor ARGS`; the completed process, with its pid as .pid."""
    q = subprocess.Popen([RUNCELL, "doctor", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    out, err = q.communicate(timeout=HANG * 2)
    p = subprocess.CompletedProcess(q.args, q.returncode, out, err)
    p.pid = q.pid
    return p


def doctor_json(*args, env=None):
    p = doctor("--json", *args, env=env)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if len(lines) != 1:
        raise AssertionError("no JSON report; exit %d, stderr: %s" % (p.returncode, p.stderr))
    return json.loads(lines[0]), p


def expected_version():
    v2 = _cgroup_mount(None)
    ctrls = []
    if v2:
        with open(os.path.join(v2, "cgroup.controllers")) as f:
            ctrls = f.read().split()
    if v2 and "memory" in ctrls:
        return "v2"
    if _cgroup_mount("memory"):
        return "hybrid" if v2 else "v1"
    return "none"


def sysctl(path):
    try:
        with open("/proc/sys/" + path) as f:
            return int(f.read())
    except OSError:
        return None


def landlock_abi():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    r = libc.syscall(ctypes.c_long(SYS_landlock_create_ruleset), None, ctypes.c_size_t(0),
                     ctypes.c_uint32(1))
    return r if r > 0 else 0


class Report(RuncellTestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = TempDir().__enter__()
        cls.env = dict(os.environ, RUNCELL_RUNDIR=cls.dir)
        cls.rep, cls.p = doctor_json(env=cls.env)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_kernel_landlock_and_sysctls_are_the_hosts(self):
        self.assertEqual(self.rep["kernel"], os.uname().release)
        self.assertEqual(self.rep["landlock"]["abi"], landlock_abi())
        un = self.rep["user_namespaces"]
        self.assertEqual(un["max_user_namespaces"], sysctl("user/max_user_namespaces"))
        self.assertEqual(un["unprivileged_userns_clone"],
                         sysctl("kernel/unprivileged_userns_clone"))
        self.assertEqual(un["apparmor_restrict_unprivileged_userns"],
                         sysctl("kernel/apparmor_restrict_unprivileged_userns"))
        # runcell itself needs Linux 5.7+, which has all of these
        self.assertEqual(set(self.rep["syscalls"].values()), {True}, self.rep["syscalls"])
        self.assertTrue(self.rep["seccomp"]["filter"])
        with open("/proc/filesystems") as f:
            fss = {l.split()[-1] for l in f}
        self.assertEqual(self.rep["filesystems"]["overlayfs"], "overlay" in fss)
        self.assertEqual(self.rep["filesystems"]["cgroup2"], "cgroup2" in fss)

    def test_cgroups_are_the_hosts(self):
        cg = self.rep["cgroup"]
        self.assertEqual(cg["version"], expected_version())
        expected, why = cgroups_expected()
        self.assertEqual(cg["limits"], expected, "%s; %s" % (why, cg))
        if cg["version"] == "v2":
            self.assertEqual(cg["mount"], _cgroup_mount(None))
            own = _own_cgroup("")
            self.assertEqual(cg["own"], own)
            if is_root() and own == "/":
                self.assertEqual(cg["placement"], "v2-root")
        elif cg["version"] in ("v1", "hybrid"):
            self.assertEqual(cg["placement"], "v1" if expected else "none")
            mem = cg["v1_controllers"]["memory"]
            self.assertEqual(mem["mount"], _cgroup_mount("memory"))
            if expected:
                own = _own_cgroup("memory")
                self.assertEqual(mem["base"], mem["mount"] + (own if own != "/" else "") + "/runcell")

    def test_python_stack_is_what_python3_imports(self):
        code = ("import json, importlib\nprint(json.dumps({m: importlib.import_module(m)."
                "__version__ for m in ('numpy', 'pandas', 'matplotlib')}))")
        p = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True,
                           timeout=HANG, env={"MPLBACKEND": "Agg", "PATH": "/usr/bin:/bin"})
        self.assertEqual(p.returncode, 0, p.stderr)
        py = self.rep["python"]
        for m, v in json.loads(p.stdout).items():
            self.assertEqual(py[m], v)
        self.assertTrue(py["ok"])

    def test_sandbox_and_template_start_and_the_exit_status_says_full(self):
        self.assertTrue(self.rep["sandbox"]["ok"], self.rep["sandbox"])
        expected, why = cgroups_expected()
        if is_root() and expected and not sanitizer_build():
            self.assertTrue(self.rep["template"]["ok"], self.rep["template"])
            self.assertFalse(self.rep["sandbox"]["limits_degraded"])
            self.assertTrue(self.rep["full_limits"], self.rep["fixes"])
            self.assertEqual(self.rep["fixes"], [])
        self.assertEqual(self.p.returncode, 0 if self.rep["full_limits"] else 1, self.p.stderr)
        # A template that cannot start costs speed, not limits: its fix stands beside full
        # limits (in an ASan build it cannot start, see sanitizer_build).
        limit_fixes = [f for f in self.rep["fixes"] if not f.startswith("the template ")]
        self.assertEqual(self.rep["full_limits"], limit_fixes == [], self.rep["fixes"])

    def test_run_dir_is_named_with_its_file_system(self):
        rd = self.rep["run_dir"]
        self.assertEqual(rd["path"], self.dir)
        magic = subprocess.run(["stat", "-f", "-c", "%t", self.dir], capture_output=True,
                               text=True, check=True).stdout.strip()
        self.assertEqual(rd["tmpfs"], magic == "1021994", (magic, rd))
        # on a tmpfs (where /dev/shm is one), it is named so, and the text has no advice
        magic = subprocess.run(["stat", "-f", "-c", "%t", "/dev/shm"], capture_output=True,
                               text=True).stdout.strip()
        if magic != "1021994":
            return
        with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
            os.chmod(d, 0o711)
            rep, _ = doctor_json("--no-template", env=dict(os.environ, RUNCELL_RUNDIR=d))
            p = doctor("--no-template", env=dict(os.environ, RUNCELL_RUNDIR=d))
        self.assertEqual((rep["run_dir"]["path"], rep["run_dir"]["filesystem"],
                          rep["run_dir"]["tmpfs"]), (d, "tmpfs", True))
        self.assertIn("run directory     %s on tmpfs\n" % d, p.stdout)

    def test_leaves_nothing_behind(self):
        self.assertEqual(run_dir_entries(self.dir), [])
        self.assertEqual(cgroups_of(self.p.pid), [])
        self.assertEqual(procs_with(self.dir), [])

    def test_text_report_names_every_part(self):
        p = doctor("--no-template", env=self.env)
        self.assertIn(p.returncode, (0, 1), p.stderr)
        for part in ("kernel", "cgroups", "placement", "Landlock", "seccomp",
                     "user namespaces", "system calls", "file systems", "run directory",
                     "sandbox", "template",
                     "Python stack", "full limits: "):
            self.assertIn(part, p.stdout)
        self.assertIn("not tried: --no-template", p.stdout)
        self.assertEqual(p.returncode == 0, "full limits: yes" in p.stdout)


class Degraded(RuncellTestCase):
    def test_without_cgroups_it_says_so_and_exits_1(self):
        with TempDir() as d:
            rep, p = doctor_json("--no-template",
                                 env=dict(os.environ, RUNCELL_RUNDIR=d, RUNCELL_NO_CGROUPS="1"))
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertFalse(rep["full_limits"])
            self.assertEqual(rep["cgroup"]["placement"], "disabled")
            self.assertFalse(rep["cgroup"]["limits"])
            self.assertTrue(any("RUNCELL_NO_CGROUPS" in f for f in rep["fixes"]), rep["fixes"])
            if not sanitizer_build():
                self.assertTrue(rep["sandbox"]["ok"], rep["sandbox"])
            self.assertTrue(rep["sandbox"]["limits_degraded"])
            if is_root():
                # root is never told to become root
                for f in rep["fixes"]:
                    self.assertNotIn("as root", f)
            self.assertEqual(run_dir_entries(d), [])

    def test_bad_options_are_usage_errors(self):
        for args in (["--bogus"], ["extra"]):
            p = doctor(*args)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn("runcell doctor:", p.stderr)
            self.assertEqual(p.stdout, "")
        p = doctor("--help")
        self.assertEqual(p.returncode, 0)
        self.assertIn("--json", p.stdout)


if __name__ == "__main__":
    unittest.main()
