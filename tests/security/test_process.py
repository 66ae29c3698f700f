"""The sandboxed process itself: credentials, inherited fds and environment, what /proc
shows, the controlling terminal, the host name, signals across the boundary, kill(-1), and
a daemon that tries to outlive its run."""
import fcntl
import glob
import json
import os
import pty
import signal
import socket
import subprocess
import termios
import unittest
import uuid

from seclib import PRELUDE, PY, RUN_DIR, RUNCELL, LiveRun, host_pids_with, probe, runcell
from rctest import Server, TempDir, RuncellTestCase, cgroups_expected, is_root

SECBITS_LOCKED = 0xEF  # NOROOT, NO_SETUID_FIXUP, KEEP_CAPS_LOCKED, NO_CAP_AMBIENT_RAISE + locks


class Credentials(RuncellTestCase):
    def test_status_shows_no_capabilities_no_new_privs_and_seccomp(self):
        res, _ = probe(self, """
st = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
keys = ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp", "Uid",
        "Gid", "Groups"]
_libc.prctl.restype = ctypes.c_int
report({k: " ".join(st[k].split()) for k in keys} |
       {"securebits": _libc.prctl(27, 0, 0, 0, 0)})   # PR_GET_SECUREBITS
""")
        self.assertEqual(res, {
            "CapInh": "0000000000000000", "CapPrm": "0000000000000000",
            "CapEff": "0000000000000000", "CapBnd": "0000000000000000",
            "CapAmb": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2",
            "Uid": "1000 1000 1000 1000", "Gid": "1000 1000 1000 1000", "Groups": "",
            "securebits": SECBITS_LOCKED})

    def test_privileges_cannot_be_regained(self):
        res, _ = probe(self, """
class Hdr(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]
hdr = Hdr(0x20080522, 0)
data = (Data * 2)()
data[0].effective = data[0].permitted = 0xffffffff
report({"setuid0": oserr(os.setuid, 0), "setgid0": oserr(os.setgid, 0),
        "setgroups": oserr(os.setgroups, [0]),
        "capset": sc(126, ctypes.byref(hdr), data),
        "ambient_raise": sc(157, 47, 2, 21, 0, 0),        # PR_CAP_AMBIENT_RAISE CAP_SYS_ADMIN
        "securebits_clear": sc(157, 28, 0, 0, 0, 0),      # PR_SET_SECUREBITS 0
        "no_new_privs_clear": sc(157, 38, 0, 0, 0, 0)})   # PR_SET_NO_NEW_PRIVS 0
""")
        self.assertEqual(res, {"setuid0": "EPERM", "setgid0": "EPERM", "setgroups": "EPERM",
                               "capset": "EPERM", "ambient_raise": "EPERM",
                               "securebits_clear": "EPERM", "no_new_privs_clear": "EINVAL"})

    def test_sandbox_user_maps_to_a_host_uid_of_its_own(self):
        if not is_root():
            self.skipTest("per-workspace host uids are used only when runcell runs as root")
        res, _ = probe(self, """
def idmap(p):
    return [l.split() for l in open(p).read().splitlines()]
report({"uid": idmap("/proc/self/uid_map"), "gid": idmap("/proc/self/gid_map")})
""")
        for m in (res["uid"], res["gid"]):
            inside = {int(r[0]): int(r[1]) for r in m}
            self.assertEqual(sorted(inside), [0, 1000], m)  # nothing else, host root unmapped
            self.assertEqual([r[2] for r in m], ["1", "1"])
            self.assertNotEqual(inside[0], inside[1000])
        # The ids in the map are relative to the namespace above (the template's, when a
        # template made the sandbox), so the host uid is checked from the host: who owns
        # what the sandbox user writes, in two runs at once.
        owners = []
        runs = []
        for _ in range(2):
            token = uuid.uuid4().hex
            run = LiveRun("import time\nopen('/workspace/mark-%s', 'w').close()\n"
                          "print('ready', flush=True)\ntime.sleep(600)" % token)
            self.addCleanup(run.cancel)
            self.assertEqual(run.first_line(), "ready")
            runs.append((run, token))
        for run, token in runs:
            found = glob.glob(os.path.join(RUN_DIR, "*", "w*", "work", "mark-" + token))
            self.assertEqual(len(found), 1, found)
            owners.append(os.stat(found[0]).st_uid)
        for uid in owners:
            self.assertGreaterEqual(uid, 1000000000, owners)
        self.assertNotEqual(owners[0], owners[1], "two runs share a host uid")


class SandboxKind(RuncellTestCase):
    def test_the_suite_attacks_the_kind_of_sandbox_it_says(self):
        # tests/run.py runs this suite twice: sandboxes made from scratch, then sandboxes
        # cloned from the template (RUNCELL_TEMPLATE=1). A template clone has the data stack
        # imported before the first cell; one made from scratch has not.
        # A third pass runs the cells in a fork of another session (RUNCELL_FORKED=1): the
        # parent's variable is there.
        res, _ = probe(self, 'import sys\nreport({"preloaded": "pandas" in sys.modules, '
                             '"forked": "forked_from" in globals()})')
        self.assertEqual(res["preloaded"], bool(os.environ.get("RUNCELL_TEMPLATE")))
        self.assertEqual(res["forked"], bool(os.environ.get("RUNCELL_FORKED")))


class CoreDumps(RuncellTestCase):
    def test_crashes_leave_no_core_and_the_limit_cannot_be_raised(self):
        res, _ = probe(self, """
import resource, signal
try:
    resource.setrlimit(resource.RLIMIT_CORE, (1 << 30, 1 << 30))
    raised = "ok"
except (ValueError, OSError) as e:
    raised = type(e).__name__
pid = os.fork()
if pid == 0:
    os.kill(os.getpid(), signal.SIGSEGV)
    os._exit(0)
_, st = os.waitpid(pid, 0)
report({"limit": resource.getrlimit(resource.RLIMIT_CORE), "raise": raised,
        "dumped": os.WCOREDUMP(st), "signal": os.WTERMSIG(st),
        "files": sorted(os.listdir("/workspace")) + sorted(os.listdir("/tmp"))})
""")
        self.assertEqual(res, {"limit": [0, 0], "raise": "ValueError", "dumped": False,
                               "signal": 11, "files": []})


FD_PROBE = """
listed = sorted(int(n) for n in os.listdir("/proc/self/fd"))
report({"listed": listed, "three_after": oserr(os.fstat, 3),
        "targets": [os.readlink("/proc/self/fd/%d" % fd)[:5] for fd in (0, 1, 2)],
        "open_above": [fd for fd in range(3, 4096) if oserr(os.fstat, fd) != "EBADF"],
        "kinds": {fd: os.readlink("/proc/self/fd/%d" % fd)[:7] for fd in range(3, 4096)
                  if oserr(os.fstat, fd) != "EBADF"}})
"""


class Inheritance(RuncellTestCase):
    def test_only_stdio_fds_are_open_in_a_script(self):
        with TempDir() as d:
            script = os.path.join(d, "fds.py")
            with open(script, "w") as f:
                f.write(PRELUDE + FD_PROBE)
            p = runcell("run", "--json", script)
        rec = json.loads(p.stdout)
        self.assertStatus(rec, "ok")
        res = json.loads([l for l in rec["stdout"].splitlines() if l.startswith("{")][-1])
        # os.listdir itself holds fd 3 while it reads; it is closed again right after.
        self.assertEqual(res["listed"], [0, 1, 2, 3])
        self.assertEqual(res["three_after"], "EBADF")
        self.assertEqual(res["open_above"], [])
        self.assertEqual(res["targets"], ["/dev/", "pipe:", "pipe:"])

    def test_a_cell_sees_only_stdio_and_its_kernel_channel(self):
        res, _ = probe(self, FD_PROBE)
        # The kernel runs in the cell's own process: its channel to runcell (a socket, moved
        # to fd 100) is the one descriptor beyond stdio. Nothing of the host is inherited.
        self.assertEqual(res["listed"], [0, 1, 2, 3, 100])
        self.assertEqual(res["open_above"], [100])
        self.assertEqual(res["kinds"], {"100": "socket:"})
        self.assertEqual(res["targets"], ["/dev/", "pipe:", "pipe:"])

    def test_host_environment_does_not_reach_the_sandbox(self):
        secret = "rc-env-" + uuid.uuid4().hex
        res, _ = probe(self, """
blob = open("/proc/self/environ", "rb").read()
report({"env": dict(os.environ), "in_environ_file": SECRET.encode() in blob})
""".replace("SECRET", repr(secret)), env={"RC_CANARY_SECRET": secret, "AWS_SECRET_ACCESS_KEY":
                                        secret, "RUNCELL_TOKEN": secret, "HOME": "/root"})
        self.assertFalse(res["in_environ_file"])
        self.assertNotIn(secret, json.dumps(res["env"]))
        for k in ("RC_CANARY_SECRET", "AWS_SECRET_ACCESS_KEY", "RUNCELL_TOKEN"):
            self.assertNotIn(k, res["env"])
        self.assertEqual(res["env"]["HOME"], "/workspace")
        self.assertEqual(res["env"]["USER"], "sandbox")


class ProcView(RuncellTestCase):
    def test_proc_lists_only_the_sandbox_processes(self):
        res, _ = probe(self, """
import subprocess, time
child = subprocess.Popen(["sleep", "30"])
# Popen returns after fork, maybe before the exec: wait until the child is sleep.
for _ in range(1000):
    if open("/proc/%d/comm" % child.pid).read().strip() == "sleep":
        break
    time.sleep(0.01)
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
comms = {p: open("/proc/%d/comm" % p).read().strip() for p in pids}
child.kill()
child.wait()
report({"pids": pids, "comms": comms, "me": os.getpid(), "child": child.pid,
        "host_pid": oserr(os.stat, "/proc/%d" % HOSTPID)})
""".replace("HOSTPID", str(os.getpid())))
        self.assertEqual(res["pids"], [1, res["me"], res["child"]])
        self.assertEqual(res["comms"][str(res["child"])], "sleep")
        self.assertEqual(res["comms"][str(res["me"])], "python3")
        self.assertEqual(res["me"], 2)
        if os.getpid() not in (1, 2, res["child"]):
            self.assertEqual(res["host_pid"], "ENOENT")


    def test_each_sandbox_looks_new(self):
        """As a fresh machine would: a boot id of its own (a version 4 UUID, read-only, not
        the host's), a cgroup path of its own as /proc/self/cgroup shows it, and a PID 1
        whose command line names the sandbox. Nothing of the host's ids shows."""
        code = """
def read(p):
    with open(p, "rb") as f:
        return f.read().decode()
report({"boot_id": read("/proc/sys/kernel/random/boot_id"),
        "cgroup": read("/proc/self/cgroup"), "pid1": read("/proc/1/cmdline"),
        "write": oserr(lambda: open("/proc/sys/kernel/random/boot_id", "w").write("x")),
        "umount": sc(166, b"/proc/sys/kernel/random/boot_id", 2)})
"""
        a, rec = probe(self, code)
        b, _ = probe(self, code)
        with_cgroups = cgroups_expected()[0] and not rec.get("limits_degraded")
        with open("/proc/sys/kernel/random/boot_id") as f:
            host_boot_id = f.read()
        for r in (a, b):
            self.assertRegex(r["boot_id"], r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-"
                                           r"[0-9a-f]{12}\n$")
            self.assertNotEqual(r["boot_id"], host_boot_id)
            self.assertIn(r["write"], ("EROFS", "EACCES"))
            self.assertEqual(r["umount"], "EPERM")
            self.assertTrue(r["pid1"].startswith("runcell-sandbox\0"), r["pid1"])
            # the cgroup namespace is rooted at the sandbox's cgroup: one line shows its leaf
            leaves = [l.split(":", 2)[2] for l in r["cgroup"].splitlines()
                      if l.split(":", 2)[2] != "/"]
            if with_cgroups:
                self.assertEqual(len(leaves), 1, r["cgroup"])
        self.assertNotEqual(a["boot_id"], b["boot_id"])
        self.assertNotEqual(a["pid1"], b["pid1"])
        if with_cgroups:
            self.assertNotEqual(a["cgroup"], b["cgroup"])

    def test_host_wide_proc_entries_are_empty(self):
        """The kernel command line, pressure stall information and the host's memory, disk,
        interrupt and device statistics read as empty (the boot id is the sandbox's own:
        test_each_sandbox_looks_new); the entries runtimes use (cpu count, memory, load)
        still answer. The covers cannot be taken off or written through."""
        hidden = ["cmdline", "vmstat", "diskstats", "partitions",
                  "swaps", "interrupts", "softirqs", "zoneinfo", "buddyinfo", "schedstat",
                  "modules", "devices", "misc", "key-users", "locks", "consoles", "cgroups",
                  "crypto"]
        dirs = ["pressure", "irq", "bus", "fs", "tty", "driver"]
        res, _ = probe(self, """
HIDDEN, DIRS = %r, %r
def read(p):
    try:
        with open("/proc/" + p, "rb") as f:
            return len(f.read())
    except OSError as e:
        return errno.errorcode[e.errno]
def listdir(p):
    try:
        return os.listdir("/proc/" + p)
    except OSError as e:
        return errno.errorcode[e.errno]
report({"files": {p: read(p) for p in HIDDEN if os.path.exists("/proc/" + p)},
        "dirs": {p: listdir(p) for p in DIRS if os.path.exists("/proc/" + p)},
        "psi": read("pressure/memory"),
        "kept": {p: read(p) > 0 for p in ("cpuinfo", "meminfo", "stat", "loadavg", "uptime",
                                           "version", "self/status", "self/cmdline")},
        "cpus": os.cpu_count(),
        "umount": sc(166, b"/proc/cmdline", 0),
        "umount_detach": sc(166, b"/proc/pressure", 2),
        "write": oserr(lambda: open("/proc/cmdline", "w").write("x"))})
""" % (hidden, dirs))
        host = {p for p in hidden if os.path.exists("/proc/" + p)}
        self.assertEqual(set(res["files"]), host)   # every entry the host has was looked at
        self.assertEqual(res["files"], {p: 0 for p in host}, res["files"])
        self.assertEqual(res["dirs"], {p: [] for p in dirs if os.path.exists("/proc/" + p)})
        self.assertEqual(res["psi"], "ENOENT")
        self.assertEqual(res["kept"], {k: True for k in res["kept"]})
        self.assertGreaterEqual(res["cpus"], 1)
        self.assertEqual((res["umount"], res["umount_detach"]), ("EPERM", "EPERM"))
        self.assertIn(res["write"], ("EACCES", "EROFS", "EPERM"))


class Terminal(RuncellTestCase):
    STAT = """
f = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
report({"tty_nr": int(f[4]), "tpgid": int(f[5]), "sid_is_pid": os.getsid(0) == os.getpid(),
        "isatty": [os.isatty(fd) for fd in (0, 1, 2)],
        "dev_tty": oserr(os.open, "/dev/tty", os.O_RDWR)})
"""

    @staticmethod
    def _take_tty(slave):
        def setup():
            os.setsid()
            fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
        return setup

    def test_no_controlling_terminal_even_when_runcell_has_one(self):
        master, slave = pty.openpty()
        self.addCleanup(os.close, master)
        self.addCleanup(os.close, slave)
        # Control: a process started this way does have the terminal.
        ctl = subprocess.run([PY, "-c", PRELUDE + self.STAT], stdin=slave,
                             capture_output=True, text=True, timeout=60,
                             preexec_fn=self._take_tty(slave))
        control = json.loads(ctl.stdout.splitlines()[-1])
        self.assertNotEqual(control["tty_nr"], 0, "control process got no terminal")
        p = subprocess.run([RUNCELL, "run", "--json", "-c", PRELUDE + self.STAT], stdin=slave,
                           capture_output=True, text=True, timeout=120,
                           preexec_fn=self._take_tty(slave))
        rec = json.loads(p.stdout.splitlines()[-1])
        self.assertStatus(rec, "ok")
        res = json.loads(rec["stdout"].splitlines()[-1])
        self.assertEqual(res, {"tty_nr": 0, "tpgid": -1, "sid_is_pid": True,
                               "isatty": [False, False, False], "dev_tty": "ENOENT"})



class HostName(RuncellTestCase):
    def test_hostname_is_the_sandbox_own_and_cannot_be_changed(self):
        res, _ = probe(self, """
import socket
report({"name": socket.gethostname(), "proc": open("/proc/sys/kernel/hostname").read().strip(),
        "sethostname": sc(170, b"pwned", 5), "setdomainname": sc(171, b"pwned", 5),
        "after": socket.gethostname()})
""")
        self.assertNotEqual(res["name"], socket.gethostname())
        self.assertEqual(res, {"name": "runcell", "proc": "runcell", "sethostname": "EPERM",
                               "setdomainname": "EPERM", "after": "runcell"})


class Signals(RuncellTestCase):
    def test_signals_to_init_and_host_processes_fail(self):
        marker = "rc-sigtarget-" + uuid.uuid4().hex
        target = subprocess.Popen(["/bin/bash", "-c", "exec -a %s sleep 300" % marker])
        self.addCleanup(target.wait)
        self.addCleanup(target.kill)
        res, _ = probe(self, """
import signal
r = {}
for name, pid in (("host_target", TARGET), ("host_test", TEST)):
    r[name + "_kill"] = oserr(os.kill, pid, signal.SIGKILL)
    r[name + "_pidfd"] = sc(434, pid, 0)
for sig in (signal.SIGTERM, signal.SIGKILL, signal.SIGUSR1, 0):
    r["init_%d" % sig] = oserr(os.kill, 1, sig)
r["init_pgrp"] = oserr(os.killpg, 1, signal.SIGTERM)
report(r)
""".replace("TARGET", str(target.pid)).replace("TEST", str(os.getpid())))
        for name in ("host_target", "host_test"):
            self.assertEqual(res[name + "_kill"], "ESRCH")   # another PID namespace
            self.assertEqual(res[name + "_pidfd"], "ESRCH")
        for sig in (signal.SIGTERM, signal.SIGKILL, signal.SIGUSR1, 0):
            self.assertEqual(res["init_%d" % sig], "EPERM")
        self.assertEqual(res["init_pgrp"], "ESRCH")          # init leads no group we can see
        self.assertIsNone(target.poll(), "the host process was killed")
        self.assertEqual(host_pids_with(marker), [target.pid])


class KillAll(RuncellTestCase):
    def test_kill_minus_one_kills_only_the_sandbox(self):
        marker = "rc-bystander-" + uuid.uuid4().hex
        bystander = subprocess.Popen(["/bin/bash", "-c", "exec -a %s sleep 300" % marker])
        self.addCleanup(bystander.wait)
        self.addCleanup(bystander.kill)
        res, rec = probe(self, """
import signal, time
kids = []
for i in range(5):
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(60)
        os._exit(0)
    kids.append(pid)
r = {"kill": sc(62, -1, 9)}
deaths = []
for k in kids:
    _, st = os.waitpid(k, 0)
    deaths.append(os.WTERMSIG(st) if os.WIFSIGNALED(st) else -1)
r["deaths"] = deaths
r["left"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
r["me"] = os.getpid()
report(r)
""")
        self.assertEqual(res["kill"], "ok:0")
        self.assertEqual(res["deaths"], [9] * 5)
        self.assertEqual(res["left"], [1, res["me"]])   # init survives, and so does the caller
        self.assertIsNone(bystander.poll(), "a host process died")

    def test_kill_minus_one_then_self_is_reported_as_killed(self):
        p = runcell("run", "--json", "--lang", "bash", "-c",
                    "sleep 60 & sleep 60 & kill -9 -1; echo still-here; kill -9 $$")
        rec = json.loads(p.stdout.splitlines()[-1])
        self.assertStatus(rec, "killed")
        self.assertEqual(rec["signal"], 9)
        self.assertEqual(rec["stdout"], "still-here\n")
        self.assertEqual(p.returncode, 137)


class Daemons(RuncellTestCase):
    def test_double_forked_sigterm_ignoring_daemon_dies_with_the_run(self):
        marker = "rc-orphan-" + uuid.uuid4().hex
        res, rec = probe(self, """
import signal, time
r, w = os.pipe()
middle = os.fork()
if middle == 0:
    os.close(r)
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        os.set_inheritable(w, False)     # closes on exec: EOF tells the parent it began
        os.execv("/bin/sleep", [MARKER, "600"])
    os._exit(0)
os.close(w)
os.waitpid(middle, 0)   # it has exited: its child is the sandbox init's now
os.read(r, 1)
# EOF comes when the exec begins, before the new program's command line is in place: wait
# for /proc to show the marker, the state looked for, not for the exec.
def named():
    found = []
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and open("/proc/%s/cmdline" % p, "rb").read().split(bytes(1))[0] \
                    == MARKER.encode():
                found.append(p)
        except OSError:
            pass
    return found
end = time.monotonic() + 60
while not (orphan := named()) and time.monotonic() < end:
    time.sleep(0.01)
st = dict(l.split(":", 1) for l in open("/proc/%s/status" % orphan[0]).read().splitlines())
report({"orphans": len(orphan), "ppid": int(st["PPid"]),
        "ignores_term": bool(int(st["SigIgn"], 16) & (1 << (signal.SIGTERM - 1))),
        "own_session": os.getsid(int(orphan[0])) != os.getsid(0)})
""".replace("MARKER", repr(marker)), "--timeout", "60")
        # It was alive, reparented to the sandbox init, in its own session, deaf to SIGTERM
        # and holding the stdout pipe when the payload exited...
        self.assertEqual(res, {"orphans": 1, "ppid": 1, "ignores_term": True,
                               "own_session": True})
        # ...and the run still ended on its own (status ok: no timeout), with nothing of it
        # left on the host.
        self.assertEqual(host_pids_with(marker), [])


if __name__ == "__main__":
    unittest.main()


class DaemonLog(RuncellTestCase):
    def test_a_message_type_chosen_by_the_code_cannot_forge_daemon_log_lines(self):
        """Code that writes its own frame on the kernel channel, with a message type made of
        newlines, a forged log line and a terminal escape, costs it its kernel; the daemon's
        log says so on one line, with every control character escaped."""
        forged = "x\n2026-01-01T00:00:00.000Z level=error msg=\"forged\"\r\x1b[2J\x7fend"
        code = """
import json, os, socket, stat, struct, time
def is_socket(fd):
    try:
        return stat.S_ISSOCK(os.fstat(fd).st_mode)
    except OSError:
        return False
fd = [fd for fd in range(3, 1024) if is_socket(fd)][0]
body = json.dumps({"type": TYPE}).encode()
os.write(fd, struct.pack(">IB", len(body), ord("M")) + body)
time.sleep(60)
""".replace("TYPE", repr(forged))
        with Server(env={"RUNCELL_LOG": "info"}) as srv:
            sid = srv.create_session()
            rec = srv.execute(sid, code)
            self.assertEqual(rec["status"], "crashed", rec)
            self.assertIn("unexpected message", rec["message"])
            log = srv.log()
        lines = [l for l in log.splitlines() if "forged" in l]
        self.assertEqual(len(lines), 1, log)
        self.assertIn("kernel protocol violation", lines[0])
        self.assertIn("'x\\n2026-01-01T00:00:00.000Z level=error", lines[0])
        self.assertIn("\\r\\x1b[2J\\x7fend'", lines[0])
        self.assertNotIn("\x1b", log)
        self.assertFalse(any(l.startswith("2026-01-01T00:00:00.000Z") for l in log.splitlines()))
