"""Attacks on the file system: reading host secrets, writing the read-only root, `..` and
chroot escapes, Landlock, /dev and /sys, setuid binaries, and links planted for --out.

Every attack runs inside the sandbox and must fail in a named way."""
import json
import os
import stat
import unittest
import uuid

from seclib import probe, runcell
from rctest import RuncellTestCase, TempDir


class HostSecrets(RuncellTestCase):
    def test_shadow_root_home_and_other_host_trees_are_absent(self):
        paths = ["/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/etc/ssh", "/root", "/boot",
                 "/sys", "/var/lib", "/var/log", "/home/" + os.environ.get("USER", "root")]
        res, _ = probe(self, "report({p: oserr(os.stat, p) for p in %r})" % paths)
        for p in paths:
            self.assertEqual(res[p], "ENOENT", "%s is visible in the sandbox" % p)

    def test_usual_root_directories_are_the_sandboxs_own(self):
        # /var/tmp is a fresh capped tmpfs, /home/user the workspace again; the rest are empty
        # and read-only: nothing of the host's trees of the same names
        name = "rc-canary-" + uuid.uuid4().hex
        host_var_tmp = os.path.join("/var/tmp", name)
        with open(host_var_tmp, "w") as f:
            f.write("secret")
        self.addCleanup(os.unlink, host_var_tmp)
        code = """
import subprocess
ws, home = os.stat("/workspace"), os.stat("/home/user")
open("/var/tmp/x", "w").write("1")
df = subprocess.run(["df", "-k", "--output=fstype,size", "/var/tmp"], capture_output=True,
                    text=True).stdout.split()
report({"lists": {d: sorted(os.listdir(d)) for d in ("/var", "/home", "/run", "/srv", "/opt",
                                                    "/mnt", "/media")},
        "var_tmp": os.listdir("/var/tmp"), "var_tmp_fs": df[2:],
        "home_is_workspace": (ws.st_dev, ws.st_ino) == (home.st_dev, home.st_ino),
        "write_run": oserr(open, "/run/x", "w"), "write_opt": oserr(open, "/opt/x", "w"),
        "write_var": oserr(open, "/var/x", "w")})
"""
        res, _ = probe(self, code)
        self.assertEqual(res["lists"], {"/var": ["tmp"], "/home": ["user"], "/run": [],
                                        "/srv": [], "/opt": [], "/mnt": [], "/media": []})
        self.assertEqual(res["var_tmp"], ["x"])
        self.assertEqual(res["var_tmp_fs"][0], "tmpfs")
        self.assertTrue(res["home_is_workspace"])
        for k in ("write_run", "write_opt", "write_var"):
            self.assertIn(res[k], ("EROFS", "EACCES"), k)

    def test_canaries_in_host_tmp_and_start_dir_are_invisible(self):
        name = "rc-canary-" + uuid.uuid4().hex
        secret = uuid.uuid4().hex
        host_tmp = os.path.join("/tmp", name)
        with open(host_tmp, "w") as f:
            f.write(secret)
        self.addCleanup(os.unlink, host_tmp)
        with TempDir() as start_dir:
            with open(os.path.join(start_dir, name), "w") as f:
                f.write(secret)
            code = """
found = []
for top in ("/tmp", "/workspace", "/dev", "/etc", "/usr"):
    for d, dirs, files in os.walk(top):
        found += [os.path.join(d, n) for n in dirs + files if n == NAME]
report({"tmp": oserr(os.stat, "/tmp/" + NAME), "cwd": oserr(os.stat, NAME),
        "cwd_is": os.getcwd(), "tmp_list": os.listdir("/tmp"), "found": found})
""".replace("NAME", repr(name))
            res, _ = probe(self, code, cwd=start_dir)
        self.assertEqual(res["tmp"], "ENOENT")
        self.assertEqual(res["cwd"], "ENOENT")
        self.assertEqual(res["cwd_is"], "/workspace")
        self.assertEqual(res["found"], [])
        self.assertNotIn(name, res["tmp_list"])

    def test_proc_1_root_environ_fds_and_mem_are_denied(self):
        # PID 1 is the sandbox init, which kept host paths open while it built the root; it is
        # non-dumpable and runs as another uid, so none of its /proc links may be followed.
        res, _ = probe(self, """
report({"root": oserr(os.listdir, "/proc/1/root"), "root_etc": oserr(os.stat, "/proc/1/root/etc"),
        "cwd": oserr(os.listdir, "/proc/1/cwd"), "fd": oserr(os.listdir, "/proc/1/fd"),
        "environ": oserr(open, "/proc/1/environ", "rb"), "mem": oserr(open, "/proc/1/mem", "rb"),
        "map_files": oserr(os.listdir, "/proc/1/map_files")})
""")
        self.assertEqual(res, {k: "EACCES" for k in res}, res)

    def test_etc_ssl_private_is_unreadable(self):
        if not os.path.isdir("/etc/ssl/private"):
            self.skipTest("the host has no /etc/ssl/private")
        res, _ = probe(self, 'report({"list": oserr(os.listdir, "/etc/ssl/private")})')
        self.assertEqual(res["list"], "EACCES")


class ProcKnobs(RuncellTestCase):
    def test_kernel_knobs_in_proc_are_not_writable(self):
        # /proc/sys belongs to the host's root, which is not mapped in the sandbox: a
        # core_pattern pipe, for one, would run a program of the sandbox's choice as root.
        knobs = ["/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches",
                 "/proc/sys/kernel/hostname", "/proc/sys/kernel/randomize_va_space",
                 "/proc/sys/net/ipv4/ip_forward"]
        res, _ = probe(self, """
report({"write": {p: oserr(open, p, "w") for p in %r},
        "kmsg": oserr(open, "/proc/kmsg", "rb")})
""" % knobs)
        self.assertEqual(res["write"], {p: "EACCES" for p in knobs})
        self.assertEqual(res["kmsg"], "EACCES")


class ReadOnlyRoot(RuncellTestCase):
    CODE = """
def create(p):
    return oserr(lambda: os.close(os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)))
def overwrite(p):
    return oserr(lambda: os.close(os.open(p, os.O_WRONLY)))
report({"create /": create("/evil"), "create /usr": create("/usr/evil"),
        "create /usr/bin": create("/usr/bin/evil"), "create /etc": create("/etc/evil"),
        "mkdir /": oserr(os.mkdir, "/evil"), "symlink /": oserr(os.symlink, "/tmp", "/evil"),
        "overwrite /etc/passwd": overwrite("/etc/passwd"),
        "overwrite /etc/hosts": overwrite("/etc/hosts"),
        "overwrite python3": overwrite("/usr/bin/python3"),
        "unlink /etc/hosts": oserr(os.unlink, "/etc/hosts"),
        "rename /usr/bin/env": oserr(os.rename, "/usr/bin/env", "/usr/bin/env2"),
        "chmod /etc/passwd": oserr(os.chmod, "/etc/passwd", 0o666),
        "remount / rw": sc(165, 0, b"/", 0, 0x20 | 0x1000, 0)})  # MS_REMOUNT|MS_BIND
"""

    def test_root_usr_and_etc_cannot_be_written(self):
        res, _ = probe(self, self.CODE)
        for what, err in res.items():
            if what == "remount / rw":
                self.assertEqual(err, "EPERM", what)
            else:
                self.assertIn(err, ("EROFS", "EACCES", "EPERM"), "%s: %s" % (what, err))
        # The read-only mounts themselves refuse every new name (Landlock may answer first).
        for what in ("create /", "create /usr", "create /usr/bin", "create /etc", "mkdir /"):
            self.assertIn(res[what], ("EROFS", "EACCES"), what)

    def test_mounts_alone_are_read_only(self):
        # Without Landlock, the read-only mounts are what refuses: EROFS everywhere.
        res, _ = probe(self, self.CODE, env={"RUNCELL_NO_LANDLOCK": "1"})
        for what in ("create /", "create /usr", "create /usr/bin", "create /etc", "mkdir /",
                     "symlink /", "rename /usr/bin/env"):
            self.assertEqual(res[what], "EROFS", what)


class Escapes(RuncellTestCase):
    def test_dotdot_and_proc_root_stay_inside(self):
        res, _ = probe(self, """
root = os.stat("/")
def same(p):
    st = os.stat(p)
    return (st.st_dev, st.st_ino) == (root.st_dev, root.st_ino)
wd = os.open("/workspace", os.O_RDONLY | os.O_DIRECTORY)
up = os.open("../../../../../..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=wd)
st = os.fstat(up)
report({"dotdot": same("/.."), "deep": same("/" + "../" * 40),
        "proc_root": same("/proc/self/root/../../.."), "cwd_up": same("/proc/self/cwd/../../.."),
        "openat_up": (st.st_dev, st.st_ino) == (root.st_dev, root.st_ino),
        "realpath": os.path.realpath("/../../etc/../.."),
        "listing": sorted(os.listdir("/../../..")) == sorted(os.listdir("/"))})
""")
        self.assertEqual(res, {"dotdot": True, "deep": True, "proc_root": True, "cwd_up": True,
                               "openat_up": True, "realpath": "/", "listing": True})

    def test_chroot_escape_is_refused(self):
        # The classic escape: chroot into a subdirectory while keeping a descriptor above it,
        # then fchdir and walk up. It needs chroot, which the filter refuses.
        res, _ = probe(self, """
os.mkdir("/tmp/jail")
keep = os.open("/", os.O_RDONLY)
r = {"chroot": oserr(os.chroot, "/tmp/jail"), "chroot_raw": sc(161, b"/tmp/jail")}
os.fchdir(keep)
for _ in range(20):
    os.chdir("..")
r["after_walk"] = sorted(os.listdir(".")) == sorted(os.listdir("/"))
r["root_unchanged"] = os.stat(".").st_ino == os.stat("/").st_ino
report(r)
""")
        self.assertEqual(res, {"chroot": "EPERM", "chroot_raw": "EPERM", "after_walk": True,
                               "root_unchanged": True})


class Landlock(RuncellTestCase):
    CODE = """
def write(p, data=b"1"):
    def go():
        fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    return oserr(go)
abi = sc(444, 0, 0, 1)  # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
report({"abi": abi, "comm": write("/proc/self/comm", b"renamed"),
        "oom_score_adj": write("/proc/self/oom_score_adj", b"500"),
        "task_comm": write("/proc/self/task/%d/comm" % os.getpid(), b"renamed"),
        "workspace": write("/workspace/ok"), "tmp": write("/tmp/ok"),
        "shm": write("/dev/shm/ok"), "null": write("/dev/null")})
"""

    def test_writes_outside_the_writable_trees_fail_even_where_the_mount_allows(self):
        # /proc is mounted read-write and the sandbox user owns its own /proc/self files:
        # only Landlock stands between the code and those writes.
        control, _ = probe(self, self.CODE, env={"RUNCELL_NO_LANDLOCK": "1"})
        if not control["abi"].startswith("ok:"):
            self.skipTest("the kernel has no Landlock (%s)" % control["abi"])
        self.assertEqual(control["comm"], "ok", "control: the mount itself should allow this")
        res, _ = probe(self, self.CODE)
        self.assertEqual(res["comm"], "EACCES")
        self.assertEqual(res["oom_score_adj"], "EACCES")
        self.assertEqual(res["task_comm"], "EACCES")
        for where in ("workspace", "tmp", "shm", "null"):
            self.assertEqual(res[where], "ok", "%s must stay writable" % where)


class DevAndSys(RuncellTestCase):
    def test_dev_holds_only_the_harmless_nodes(self):
        res, _ = probe(self, "import stat\n" + """
names = sorted(os.listdir("/dev"))
kinds = {}
for n in names:
    st = os.lstat("/dev/" + n)
    if stat.S_ISLNK(st.st_mode):
        kinds[n] = "link:" + os.readlink("/dev/" + n)
    elif stat.S_ISCHR(st.st_mode):
        kinds[n] = "chr:%d,%d" % (os.major(st.st_rdev), os.minor(st.st_rdev))
    else:
        kinds[n] = "dir" if stat.S_ISDIR(st.st_mode) else "other"
absent = {p: oserr(os.stat, p) for p in ["/dev/tty", "/dev/ptmx", "/dev/pts", "/dev/mem",
          "/dev/kmsg", "/dev/console", "/dev/vda", "/dev/userfaultfd", "/dev/net",
          "/dev/fuse", "/dev/kvm", "/dev/mqueue"]}
report({"kinds": kinds, "absent": absent,
        "mknod": oserr(os.mknod, "/dev/shm/mem", 0o600 | stat.S_IFCHR, os.makedev(1, 1)),
        "mknod_tmp": oserr(os.mknod, "/tmp/mem", 0o600 | stat.S_IFCHR, os.makedev(1, 1)),
        "mknod_ws": oserr(os.mknod, "/workspace/mem", 0o600 | stat.S_IFCHR, os.makedev(1, 1))})
""")
        self.assertEqual(res["kinds"], {
            "fd": "link:/proc/self/fd", "stdin": "link:/proc/self/fd/0",
            "stdout": "link:/proc/self/fd/1", "stderr": "link:/proc/self/fd/2",
            "null": "chr:1,3", "zero": "chr:1,5", "full": "chr:1,7", "random": "chr:1,8",
            "urandom": "chr:1,9", "shm": "dir"})
        self.assertEqual(res["absent"], {p: "ENOENT" for p in res["absent"]})
        # Landlock refuses device nodes even in the writable trees (EACCES); without it, the
        # missing CAP_MKNOD does (EPERM).
        for where in ("mknod", "mknod_tmp", "mknod_ws"):
            self.assertIn(res[where], ("EACCES", "EPERM"), where)

    def test_no_sys_and_it_cannot_be_mounted(self):
        res, _ = probe(self, """
os.makedirs("/tmp/sys")
report({"sys": oserr(os.stat, "/sys"),
        "mount_sysfs": sc(165, b"sysfs", b"/tmp/sys", b"sysfs", 0, 0),
        "mount_proc": sc(165, b"proc", b"/tmp/sys", b"proc", 0, 0)})
""")
        self.assertEqual(res, {"sys": "ENOENT", "mount_sysfs": "EPERM", "mount_proc": "EPERM"})


class SetuidBinaries(RuncellTestCase):
    def test_setuid_root_binary_does_not_elevate(self):
        target = None
        for p in ("/usr/bin/su", "/usr/bin/passwd", "/usr/bin/chfn", "/usr/bin/mount"):
            try:
                st = os.stat(p)
            except OSError:
                continue
            if st.st_mode & stat.S_ISUID and st.st_uid == 0:
                target = p
                break
        if not target:
            self.skipTest("no setuid-root binary under /usr/bin on this host")
        # LD_SHOW_AUXV is ignored in secure (setuid) mode; that it prints at all, with
        # AT_EUID 1000, shows the exec did not raise privileges (nosuid + no_new_privs).
        res, _ = probe(self, """
import subprocess
p = subprocess.run([%r, "--help"], env=dict(os.environ, LD_SHOW_AUXV="1"),
                   capture_output=True, text=True)
aux = dict(l.split(":", 1) for l in p.stdout.splitlines() if l.startswith("AT_") and ":" in l)
report({k: aux.get(k, "").strip() for k in ("AT_UID", "AT_EUID", "AT_SECURE")})
""" % target)
        self.assertEqual(res, {"AT_UID": "1000", "AT_EUID": "1000", "AT_SECURE": "0"})


class PlantedLinks(RuncellTestCase):
    def test_out_dir_never_follows_links_or_blocks_on_fifos(self):
        # The daemon copies created files out after the run; the code may plant links to host
        # paths and FIFOs hoping the copy follows or blocks on them.
        secret_name = "rc-secret-" + uuid.uuid4().hex
        secret_path = os.path.join("/tmp", secret_name)
        with open(secret_path, "w") as f:
            f.write("host secret " + secret_name)
        self.addCleanup(os.unlink, secret_path)
        code = """
import os
os.symlink("/etc/shadow", "shadow")
os.symlink(%r, "secret")
os.symlink("/", "rootlink")
os.mkdir("d")
os.symlink("/etc", "d/etc")
os.mkfifo("fifo")
open("ok.txt", "w").write("fine")
""" % secret_path
        with TempDir() as out:
            p = runcell("run", "--json", "--timeout", "30", "--out", out, "-c", code,
                        timeout=120)
            rec = json.loads(p.stdout.splitlines()[-1])
            self.assertStatus(rec, "ok")
            copied = sorted(os.path.relpath(os.path.join(d, n), out)
                            for d, dirs, files in os.walk(out) for n in files)
            self.assertEqual(copied, ["ok.txt"])
            for d, dirs, files in os.walk(out):
                for n in dirs + files:
                    self.assertFalse(os.path.islink(os.path.join(d, n)), n)
                    if os.path.isfile(os.path.join(d, n)):
                        with open(os.path.join(d, n)) as f:
                            self.assertNotIn(secret_name, f.read())


if __name__ == "__main__":
    unittest.main()
