"""Attacks through system calls the seccomp filter must refuse: new namespaces, the mount
API, kernel attack surface (bpf, perf, userfaultfd, io_uring, keyctl), other processes'
memory, terminal injection, personality, file handles, socket families, and the foreign
x86 ABIs (x32, i386 int 0x80).

x86_64 system call numbers throughout. `sc()` (seclib.PRELUDE) returns "ok:N" or the errno
name, so each assertion names the exact way the attack failed."""
import json
import os
import subprocess
import unittest

from seclib import ATTACK_BIN, PRELUDE, PY, probe, run_json
from rctest import RuncellTestCase

CLONE_NEWTIME = 0x80
CLONE_NEWNS = 0x20000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NS_FLAGS = {"user": CLONE_NEWUSER, "mnt": CLONE_NEWNS, "pid": CLONE_NEWPID,
            "net": CLONE_NEWNET, "ipc": CLONE_NEWIPC, "uts": CLONE_NEWUTS,
            "cgroup": CLONE_NEWCGROUP, "time": CLONE_NEWTIME}
SIGCHLD = 17

# Each denied call with arguments the kernel itself rejects early and without side effects
# (bad flags, fds or addresses): outside the sandbox these fail with EINVAL, EBADF, EFAULT,
# ESRCH...; inside, the filter answers EPERM before the kernel looks at them. That difference
# shows the filter, not a missing capability, is what refuses.
BAD = 1  # an unmapped address
INVALID_ARG_CALLS = {
    "unshare": (272, 0xFFFFFFFF),
    "setns": (308, -1, 0),
    "clone_newuser": (56, CLONE_NEWUSER | 0x200 | SIGCHLD, 0, 0, 0, 0),  # with CLONE_FS: EINVAL
    "mount": (165, BAD, BAD, BAD, 0, 0),
    "umount2": (166, BAD, 0),
    "pivot_root": (155, BAD, BAD),
    "chroot": (161, BAD),
    "open_tree": (428, -1, BAD, 0xFFFFFFFF),
    "move_mount": (429, -1, BAD, -1, BAD, 0xFFFFFFFF),
    "fsopen": (430, BAD, 0xFFFFFFFF),
    "fsconfig": (431, -1, 0xFFFF, 0, 0, 0),
    "fsmount": (432, -1, 0xFFFFFFFF, 0),
    "fspick": (433, -1, BAD, 0xFFFFFFFF),
    "mount_setattr": (442, -1, BAD, 0xFFFFFFFF, 0, 0),
    "open_tree_attr": (467, -1, BAD, 0xFFFFFFFF, 0, 0),
    "bpf": (321, -1, 0, 0),
    "perf_event_open": (298, BAD, 0, -1, -1, 0),
    "userfaultfd": (323, 0xFFFFFFFF),
    "io_uring_setup": (425, 0, BAD),
    "io_uring_enter": (426, -1, 0, 0, 0, 0, 0),
    "io_uring_register": (427, -1, 0, 0, 0),
    "keyctl": (250, -1, 0, 0, 0, 0),
    "add_key": (248, BAD, BAD, 0, 0, 0),
    "request_key": (249, BAD, BAD, 0, 0),
    "ptrace": (101, 16, 0x3FFFFFFF, 0, 0),  # PTRACE_ATTACH to a pid that does not exist
    "process_vm_readv": (310, 0, 0, 0, 0, 0, 1),  # flags must be 0
    "process_vm_writev": (311, 0, 0, 0, 0, 0, 1),
    "kcmp": (312, 0x3FFFFFFF, 0x3FFFFFFF, 0, 0, 0),
    "pidfd_getfd": (438, -1, 0, 0),
    "open_by_handle_at": (304, -1, BAD, 0),
    "name_to_handle_at": (303, -1, BAD, BAD, BAD, 0xFFFFFFFF),
}

INVALID_ARG_CODE = """
calls = CALLS
report({name: sc(*args) for name, args in calls.items()})
"""


class FilterNotCapabilities(RuncellTestCase):
    def test_denied_calls_fail_with_eperm_before_the_kernel_checks_arguments(self):
        code = INVALID_ARG_CODE.replace("CALLS", repr(INVALID_ARG_CALLS))
        inside, _ = probe(self, code)
        host = subprocess.run([PY, "-c", PRELUDE + code], capture_output=True, text=True,
                              timeout=60)
        outside = json.loads(host.stdout.splitlines()[-1])
        for name in INVALID_ARG_CALLS:
            if outside[name] == "ENOSYS":
                continue  # a call this kernel does not have: nothing to refuse
            self.assertEqual(inside[name], "EPERM", name)
        # Outside the sandbox the same calls get past the entry and fail on their arguments.
        informative = [n for n in INVALID_ARG_CALLS if outside[n] not in ("EPERM", "ENOSYS")]
        self.assertGreater(len(informative), len(INVALID_ARG_CALLS) // 2,
                           "host control: %s" % outside)
        for n in informative:
            self.assertNotEqual(inside[n], outside[n], n)


class Namespaces(RuncellTestCase):
    def test_unshare_of_every_namespace_is_refused(self):
        code = "report({n: sc(272, f) for n, f in %r.items()})" % NS_FLAGS
        res, _ = probe(self, code)
        self.assertEqual(res, {n: "EPERM" for n in NS_FLAGS})

    def test_unshare_user_namespace_from_bash(self):
        rec, _ = run_json("unshare --user --map-root-user id -u; echo rc=$?", lang="bash")
        self.assertStatus(rec, "ok")
        self.assertIn("Operation not permitted", rec["stderr"])
        self.assertIn("rc=1", rec["stdout"])

    def test_clone_with_namespace_flags_is_refused(self):
        # A successful clone here would return twice into Python and report twice; the
        # flags' high bits are ignored by the kernel and must not blind the filter.
        code = ("report({n: sc(56, f | %d, 0, 0, 0, 0) for n, f in %r.items()} | "
                "{'user_high_bits': sc(56, (1 << 40) | %d | %d, 0, 0, 0, 0), "
                "'setns': sc(308, os.open('/proc/self/ns/user', os.O_RDONLY), 0)})"
                % (SIGCHLD, NS_FLAGS, CLONE_NEWUSER, SIGCHLD))
        res, _ = probe(self, code)
        self.assertEqual(res, {n: "EPERM" for n in list(NS_FLAGS) + ["user_high_bits", "setns"]})

    def test_clone3_is_hidden_and_fork_still_works(self):
        # clone3 takes its flags in memory a filter cannot read: it is reported missing so
        # libc falls back to clone, whose flags the filter sees.
        res, _ = probe(self, """
import struct
args = ctypes.create_string_buffer(struct.pack("QQQQQQQQ", CLONE_NEWUSER, 0, 0, 0, 17, 0, 0, 0))
pid = os.fork()
if pid == 0:
    os._exit(7)
_, status = os.waitpid(pid, 0)
report({"clone3": sc(435, args, 64), "fork_status": os.waitstatus_to_exitcode(status)})
""".replace("CLONE_NEWUSER", str(CLONE_NEWUSER)))
        self.assertEqual(res, {"clone3": "ENOSYS", "fork_status": 7})


class MountApi(RuncellTestCase):
    def test_mount_family_is_refused(self):
        res, _ = probe(self, """
os.mkdir("/tmp/m")
os.mkdir("/tmp/m/old")
AT_FDCWD = -100
r = {"mount_tmpfs": sc(165, b"none", b"/tmp/m", b"tmpfs", 0, 0),
     "bind_root": sc(165, b"/", b"/tmp/m", 0, 0x1000, 0),
     "umount_proc": sc(166, b"/proc", 2),
     "pivot_root": sc(155, b"/tmp/m", b"/tmp/m/old"),
     "open_tree_clone": sc(428, AT_FDCWD, b"/", 1),            # OPEN_TREE_CLONE
     "open_tree_attr_clone": sc(467, AT_FDCWD, b"/", 1, 0, 0),
     "move_mount": sc(429, AT_FDCWD, b"/proc", AT_FDCWD, b"/tmp/m", 0),
     "fsopen": sc(430, b"tmpfs", 0),
     "fspick": sc(433, AT_FDCWD, b"/", 0),
     "fsmount": sc(432, 0, 0, 0),
     "fsconfig": sc(431, 0, 6, 0, 0, 0),                        # FSCONFIG_CMD_CREATE
     "mount_setattr": sc(442, AT_FDCWD, b"/", 0, 0, 0)}
report(r)
""")
        self.assertEqual(res, {k: "EPERM" for k in res}, res)


class KernelSurface(RuncellTestCase):
    def test_bpf_perf_userfaultfd_io_uring_keyctl_are_refused(self):
        res, _ = probe(self, """
attr = ctypes.create_string_buffer(128)     # perf_event_attr: software cpu-clock on self
ctypes.memmove(attr, (ctypes.c_uint32 * 2)(1, 128), 8)
params = ctypes.create_string_buffer(120)   # io_uring_params
bpf_attr = ctypes.create_string_buffer(128)
report({"bpf_map_create": sc(321, 0, bpf_attr, 128),
        "bpf_prog_load": sc(321, 5, bpf_attr, 128),
        "perf_event_open": sc(298, attr, 0, -1, -1, 0),
        "userfaultfd": sc(323, 0),
        "userfaultfd_user": sc(323, 1),             # UFFD_USER_MODE_ONLY
        "io_uring_setup": sc(425, 8, params),
        "keyctl_session": sc(250, 0, -3, 0, 0, 0),  # KEYCTL_GET_KEYRING_ID, session keyring
        "keyctl_join": sc(250, 1, 0, 0, 0, 0),      # KEYCTL_JOIN_SESSION_KEYRING
        "add_key": sc(248, b"user", b"rc", b"secret", 6, -2),
        "request_key": sc(249, b"user", b"rc", 0, 0),
        "dev_userfaultfd": oserr(os.open, "/dev/userfaultfd", os.O_RDWR)})
""")
        expected = {k: "EPERM" for k in res}
        expected["dev_userfaultfd"] = "ENOENT"
        self.assertEqual(res, expected)


class OtherProcesses(RuncellTestCase):
    def test_ptrace_and_process_vm_access_are_refused(self):
        res, _ = probe(self, """
import signal, time
secret = ctypes.create_string_buffer(b"sandbox-secret")
pid = os.fork()
if pid == 0:
    time.sleep(60)
    os._exit(0)
local = ctypes.create_string_buffer(64)
liov = (ctypes.c_void_p * 2)(ctypes.addressof(local), 64)
riov = (ctypes.c_void_p * 2)(ctypes.addressof(secret), 14)
r = {"traceme": sc(101, 0, 0, 0, 0),
     "attach_child": sc(101, 16, pid, 0, 0),
     "seize_child": sc(101, 0x4206, pid, 0, 0),
     "attach_init": sc(101, 16, 1, 0, 0),
     "vm_readv_child": sc(310, pid, liov, 1, riov, 1, 0),
     "vm_writev_child": sc(311, pid, liov, 1, riov, 1, 0),
     "vm_readv_init": sc(310, 1, liov, 1, riov, 1, 0),
     "kcmp": sc(312, os.getpid(), pid, 0, 0, 0)}
pidfd = sc(434, pid, 0)                 # pidfd_open works; taking the child's fds must not
r["pidfd_getfd"] = sc(438, int(pidfd[3:]), 1, 0) if pidfd.startswith("ok:") else pidfd
os.kill(pid, signal.SIGKILL)
os.waitpid(pid, 0)
report(r)
""")
        self.assertEqual(res, {k: "EPERM" for k in res}, res)


class Terminal(RuncellTestCase):
    def test_tiocsti_and_tioclinux_are_refused_even_with_high_bits(self):
        # On fd 0 (/dev/null) the kernel would answer ENOTTY; EPERM is the filter, and a
        # command with bits set above the 32 the kernel reads must not slip past it.
        res, _ = probe(self, """
c = ctypes.create_string_buffer(b"x")
r = {}
for fd in (0, 1, 2):
    r["tiocsti_%d" % fd] = sc(16, fd, 0x5412, c)
r["tiocsti_high"] = sc(16, 0, 0xffffffff00005412, c)
r["tiocsti_high2"] = sc(16, 0, 0x0000000100005412, c)
r["tioclinux"] = sc(16, 0, 0x541C, c)
r["tioclinux_high"] = sc(16, 0, 0xdeadbeef0000541C, c)
r["tiocgwinsz_control"] = sc(16, 0, 0x5413, ctypes.create_string_buffer(8))
report(r)
""")
        self.assertEqual(res.pop("tiocgwinsz_control"), "ENOTTY")
        self.assertEqual(res, {k: "EPERM" for k in res}, res)


class Personality(RuncellTestCase):
    def test_new_personas_are_refused_and_the_query_works(self):
        res, _ = probe(self, """
report({"read_implies_exec": sc(135, 0x0400000),
        "addr_no_randomize": sc(135, 0x0040000),
        "linux32": sc(135, 0x0008),
        "mmap_page_zero": sc(135, 0x0100000),
        "high_bits_query_lookalike": sc(135, 0xffffffff00400000),
        "query": sc(135, 0xffffffff),
        "query_after": sc(135, 0xffffffff)})
""")
        self.assertEqual(res.pop("query"), "ok:0")
        self.assertEqual(res.pop("query_after"), "ok:0")
        self.assertEqual(res, {k: "EPERM" for k in res}, res)

    def test_setarch_cannot_disable_randomization(self):
        rec, _ = run_json("setarch x86_64 -R true; echo rc=$?", lang="bash")
        self.assertStatus(rec, "ok")
        self.assertIn("rc=1", rec["stdout"])
        self.assertIn("Operation not permitted", rec["stderr"])


class FileHandles(RuncellTestCase):
    def test_open_by_handle_at_shocker_is_refused(self):
        # "Shocker": open_by_handle_at with a guessed handle reaches files outside the
        # mount namespace's view.
        res, _ = probe(self, """
handle = ctypes.create_string_buffer(8 + 128)
ctypes.memmove(handle, (ctypes.c_uint32 * 2)(8, 1), 8)   # handle_bytes=8, type=FILEID_INO32_GEN
ctypes.memmove(ctypes.addressof(handle) + 8, (ctypes.c_uint32 * 2)(2, 0), 8)  # inode 2: a root
mount_id = ctypes.c_int()
root = os.open("/", os.O_RDONLY)
report({"open_by_handle_at": sc(304, root, handle, 0),
        "name_to_handle_at": sc(303, -100, b"/etc/passwd", handle, ctypes.byref(mount_id), 0)})
""")
        self.assertEqual(res, {"open_by_handle_at": "EPERM", "name_to_handle_at": "EPERM"})


class Sockets(RuncellTestCase):
    def test_only_unix_and_ip_sockets_can_be_made(self):
        res, _ = probe(self, """
import socket
fams = {"packet": (17, 3), "netlink": (16, 3), "vsock": (40, 1), "key": (15, 3),
        "bluetooth": (31, 3), "alg": (38, 5), "xdp": (44, 3), "can": (29, 3),
        "appletalk": (5, 2), "ax25": (3, 5), "x25": (9, 5), "ipx": (4, 2), "rds": (21, 5),
        "tipc": (30, 2), "smc": (43, 1), "qipcrtr": (42, 2), "mctp": (45, 2)}
r = {n: sc(41, f, t, 0) for n, (f, t) in fams.items()}
r["netlink_high_bits"] = sc(41, (1 << 32) | 16, 3, 0)
r["packet_negative_lookalike"] = sc(41, -0x100000000 + 17, 3, 0)
r["socketpair_netlink"] = sc(53, 16, 3, 0, ctypes.create_string_buffer(8))
ok = {}
for n, f, t in (("unix", 1, 1), ("inet", 2, 1), ("inet6", 10, 2)):
    s = sc(41, f, t, 0)
    ok[n] = s.startswith("ok:")
report({"refused": r, "allowed": ok})
""")
        self.assertEqual(res["refused"], {k: "EAFNOSUPPORT" for k in res["refused"]},
                         res["refused"])
        self.assertEqual(res["allowed"], {"unix": True, "inet": True, "inet6": True})


    def test_internet_sockets_are_only_tcp_and_udp(self):
        """Raw, packet-like and other protocols of the internet families are refused whatever
        the flags or the high bits of the arguments; TCP and UDP, with or without
        SOCK_NONBLOCK and SOCK_CLOEXEC, and AF_UNIX of every type are made."""
        res, _ = probe(self, """
import socket
NB, CX = socket.SOCK_NONBLOCK, socket.SOCK_CLOEXEC
bad = {"raw_icmp": (2, 3, 1), "raw_any": (2, 3, 255), "raw6": (10, 3, 58),
       "raw_tcp": (2, 3, 6), "raw_flags": (2, 3 | NB | CX, 1), "ping": (2, 2, 1),
       "ping6": (10, 2, 58), "sctp_stream": (2, 1, 132), "sctp_seq": (2, 5, 132),
       "seqpacket": (10, 5, 0), "rdm": (2, 4, 0), "packet_type": (2, 10, 0),
       "mptcp": (2, 1, 262), "udplite": (2, 2, 136), "dccp": (2, 6, 33),
       "tcp_on_dgram_high": (2, 2, (1 << 32) | 132), "type_high_bits": (2, (1 << 32) | 3, 0),
       "unknown_flag": (2, 1 | 0x100, 0), "family_high_bits": ((1 << 32) | 2, 3, 1)}
good = {"tcp": (2, 1, 0), "tcp6": (10, 1, 6), "udp": (2, 2, 17), "udp6": (10, 2, 0),
        "tcp_flags": (2, 1 | NB | CX, 6), "udp_flags": (10, 2 | CX, 17),
        "unix_stream": (1, 1, 0), "unix_dgram": (1, 2, 0), "unix_seq": (1, 5 | CX, 0)}
report({"refused": {n: sc(41, *a) for n, a in bad.items()},
        "made": {n: sc(41, *a).startswith("ok:") for n, a in good.items()}})
""")
        self.assertEqual(res["refused"], {k: "EPROTONOSUPPORT" for k in res["refused"]},
                         res["refused"])
        self.assertEqual(res["made"], {k: True for k in res["made"]})

class ForeignAbis(RuncellTestCase):
    def attack(self, mode):
        return run_json("chmod +x attack && exec ./attack " + mode, "--file",
                        ATTACK_BIN + ":attack", lang="bash")[0]

    def setUp(self):
        if not os.access(ATTACK_BIN, os.X_OK):
            self.skipTest("%s is not built (meson -Dtests=true)" % ATTACK_BIN)

    def test_native_call_works(self):
        rec = self.attack("native")
        self.assertStatus(rec, "ok")
        self.assertEqual(rec["stdout"].strip(), "native returned 2")  # its pid in the sandbox

    def test_x32_system_call_kills_the_process(self):
        rec = self.attack("x32")
        self.assertStatus(rec, "crashed")
        self.assertEqual(rec["signal"], 31)  # SIGSYS
        self.assertEqual(rec["stdout"], "")

    def test_i386_int80_kills_the_process(self):
        host = subprocess.run([ATTACK_BIN, "int80"], capture_output=True, text=True,
                              timeout=30)
        if host.returncode != 0:
            self.skipTest("this kernel cannot run i386 system calls at all (int 0x80 on the "
                          "host: status %d)" % host.returncode)
        rec = self.attack("int80")
        self.assertStatus(rec, "crashed")
        self.assertEqual(rec["signal"], 31)
        self.assertEqual(rec["stdout"], "")


if __name__ == "__main__":
    unittest.main()
