"""Core attacks from a bash payload: the cells of a bash session run in the session's long-lived
shell (a child of the kernel, in the same sandbox), so the host's files, /proc's view of the
sandbox init, another session and the daemon's control channel must stay as far out of its
reach as they are from Python code.

Every attack runs as a bash cell of a session (`runcell run --lang bash -c ... -c ...`, or a
session of `runcell serve`) and must fail in a named way."""
import json
import os
import unittest
import uuid

from rctest import RuncellTestCase, Server, run_cells


def bash_cells(test, *codes):
    """Runs codes as the cells of one bash session; returns the records (each must be ok)."""
    recs, p = run_cells(*codes, opts=("--lang", "bash"))
    test.assertEqual(p.returncode, 0,
                     "stderr: %s\nrecords: %s" % (p.stderr, json.dumps(recs)[:3000]))
    for rec in recs:
        test.assertEqual(rec["status"], "ok", json.dumps(rec)[:3000])
    return recs


class HostFromBash(RuncellTestCase):
    def test_host_secrets_and_a_host_tmp_canary_are_absent(self):
        name = "rc-bash-canary-" + uuid.uuid4().hex
        host_tmp = os.path.join("/tmp", name)
        with open(host_tmp, "w") as f:
            f.write("secret")
        self.addCleanup(os.unlink, host_tmp)
        # /home, /var, /run, /srv are the sandbox's own (test_filesystem): only the workspace
        # at /home/user, an empty tmpfs at /var/tmp, and empty directories
        paths = "/etc/shadow /etc/sudoers /etc/ssh /root /boot /sys /var/lib /var/log /home/$USER"
        recs = bash_cells(
            self, "cd /",  # the shell's cwd moves; the next cell starts from there
            "for p in %s; do [ -e \"$p\" ] && echo \"visible $p\"; done; "
            "find /tmp /var/tmp /workspace /dev /etc /usr /home /run /srv -name %s 2>/dev/null; "
            "echo scanned from $PWD" % (paths.replace("$USER", os.environ.get("USER", "root")),
                                        name))
        self.assertEqual(recs[1]["stdout"], "scanned from /\n")

    def test_proc_1_links_are_denied(self):
        recs = bash_cells(
            self, "true",
            "for l in root cwd fd map_files; do\n"
            "  ls /proc/1/$l >/dev/null 2>&1 && echo \"read $l\"\ndone\n"
            "for f in environ mem; do cat /proc/1/$f >/dev/null 2>&1 && echo \"read $f\"; done; "
            "ls /proc/1/root 2>&1 | head -1")
        self.assertIn("Permission denied", recs[1]["stdout"])
        self.assertNotIn("read ", recs[1]["stdout"])

    def test_the_shell_holds_no_socket_and_its_commands_only_stdio(self):
        # The daemon's channel is the kernel's (close-on-exec): bash never has it, and the
        # cell's commands get only stdin (/dev/null), stdout and stderr.
        recs = bash_cells(
            self, "true",
            "for f in /proc/$$/fd/*; do readlink \"$f\"; done | grep -c socket; "
            "ls -l /proc/self/fd | awk 'NR > 1 {print $9, $11}' | sort -n")
        lines = recs[1]["stdout"].splitlines()
        self.assertEqual(lines[0], "0", recs[1]["stdout"])
        fds = dict(line.split(" ", 1) for line in lines[1:])
        self.assertEqual(fds.pop("0"), "/dev/null")
        self.assertTrue(fds.pop("1").startswith("pipe:"))
        self.assertTrue(fds.pop("2").startswith("pipe:"))
        self.assertEqual(len(fds), 1, fds)  # the directory ls reads


class OtherSessionFromBash(RuncellTestCase):
    def test_a_session_cannot_see_or_signal_another(self):
        secret = uuid.uuid4().hex
        with Server() as srv:
            a = srv.create_session(language="bash")
            b = srv.create_session(language="bash")
            rec = srv.execute(a, "echo %s > secret-a; export SECRET=%s; sleep 600 & "
                                 "echo $! > bg.pid" % (secret, secret))
            self.assertEqual(rec["status"], "ok", rec)
            # the secret in two halves: b's own cell file must not match
            rec = srv.execute(b, "s=%s; s=$s%s; grep -rl $s /tmp /workspace /dev/shm 2>/dev/null; "
                                 "ls /proc | grep -E '^[0-9]+$' | sort -n | tr '\\n' ' '; echo; "
                                 "for p in /proc/[0-9]*; do grep -l $s $p/environ 2>/dev/null; "
                                 "done; "
                                 "echo done" % (secret[:16], secret[16:]))
            self.assertEqual(rec["status"], "ok", rec)
            lines = rec["stdout"].splitlines()
            self.assertEqual(lines[-1], "done")
            self.assertEqual(len(lines), 2, rec["stdout"])  # nothing found; the pid list
            # b sees only its own sandbox: init, the kernel, the shell and what it runs
            pids = [int(p) for p in lines[0].split()]
            self.assertEqual(pids[:2], [1, 2])
            self.assertLess(len(pids), 12, pids)
            # a's shell and its background job are unharmed and still there
            rec = srv.execute(a, "kill -0 $(cat bg.pid) && echo \"$SECRET\"")
            self.assertEqual(rec["stdout"], secret + "\n")


if __name__ == "__main__":
    unittest.main()
