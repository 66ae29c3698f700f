"""test_placements - every cgroup v2 placement a real deployment gives runcell, built on a
pure v2 host (the VM stage's guest; tests/vm/run) and checked for real enforcement:

  (a) root in the root cgroup (a container's or a plain init's view);
  (b) root in a systemd service with Delegate=yes: the layout systemd makes
      (system.slice/runcell.service, controllers enabled in the parent's subtree_control),
      reproduced by hand since the guest runs no systemd; the daemon (`runcell serve`) must
      move itself into a leaf and enable +memory +pids +cpu below;
  (c) a non-root user with a subtree delegated the way systemd's user@UID.service delegates
      one (the directory and its cgroup.procs, cgroup.subtree_control and cgroup.threads
      chowned to the user): real limits without root, as rootless podman gets them;
  (d) a daemon sharing its cgroup with other processes (a login shell's session scope):
      runcell may not take that cgroup over; it asks systemd for a scope of its own where
      systemd runs, else it refuses or degrades with the command to run; either way it
      leaves nothing in that cgroup;
  (e) nothing delegated (a user's process in a root-owned cgroup): degraded, with a
      message that says what to change.

Enforcement means: memory.max, pids.max and cpu.max set on the sandbox's cgroup, a memory
bomb ending as `oom`, a fork bomb stopped at the pids cap. Afterwards nothing may be left:
no process, no sandbox cgroup, and in (d) no cgroup at all in the shared one. Needs root on
a pure cgroup v2 host; anywhere else the whole module skips and says why (as root on such a
host, a placement that cannot get its limits fails).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from rctest import (RUNCELL, RuncellTestCase, free_port, reachable_runcell,  # noqa: E402
                    read_line, slow, wait_until)
from rctest import fork_probe  # noqa: E402

CG = "/sys/fs/cgroup"
MiB = 1 << 20
NOBODY = 65534
USER_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}

# A fork bomb the pids cap must stop: reports its fork count and errno (rctest.fork_probe).
FORK_BOMB = fork_probe(2000, hold=120)
MEMORY_BOMB = "a = []\nwhile True: a.append(bytearray(1 << 20))"
HOLD = "print('ready', flush=True)\nimport time\ntime.sleep(600)"


def pure_v2():
    try:
        with open("/proc/self/mountinfo") as f:
            v2 = any(l.split(" - ")[1].split()[0] == "cgroup2" and l.split()[4] == CG
                     for l in f if " - " in l)
        with open("/proc/self/cgroup") as f:
            return v2 and f.read().startswith("0::")
    except (OSError, IndexError):
        return False


def read(path):
    with open(path) as f:
        return f.read().strip()


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def tree(root):
    """Every cgroup directory below root (root excluded), as paths relative to it."""
    found = []
    for d, subdirs, _ in os.walk(root):
        found += [os.path.relpath(os.path.join(d, s), root) for s in subdirs]
    return set(found)


def procs(cgdir):
    try:
        return [int(p) for p in read(os.path.join(cgdir, "cgroup.procs")).split()]
    except FileNotFoundError:
        return []


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read()
    except OSError:
        return b""


def own_cgroup(pid):
    with open("/proc/%d/cgroup" % pid) as f:
        return CG + f.read().strip().split("::", 1)[1].rstrip("/")


def sandbox_cgroups(root, memory_bytes):
    """Cgroups below root whose memory.max is memory_bytes: the sandboxes with that limit."""
    found = []
    for rel in sorted(tree(root)):
        try:
            if read(os.path.join(root, rel, "memory.max")) == str(memory_bytes):
                found.append(os.path.join(root, rel))
        except OSError:
            pass
    return found


def remove_tree(cgdir):
    """Kills what is in cgdir and below, then removes the cgroups, deepest first."""
    if not os.path.isdir(cgdir):
        return
    if os.path.exists(os.path.join(cgdir, "cgroup.kill")):
        write(os.path.join(cgdir, "cgroup.kill"), "1")
    for rel in sorted(tree(cgdir) | {"."}, key=lambda r: -r.count("/") - (r != ".")):
        path = os.path.normpath(os.path.join(cgdir, rel))
        wait_until(lambda: not procs(path), timeout=30)
        os.rmdir(path)


def enable(cgdir, controllers="+memory +pids +cpu"):
    write(os.path.join(cgdir, "cgroup.subtree_control"), controllers)


def in_cgroup(cgdir, argv, uid=None):
    """argv as a process that starts in cgdir (put there by root, as systemd puts a unit's
    process), as uid if given (then with a clean environment, like a login)."""
    wrap = ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgdir]
    if uid is not None:
        wrap += ["setpriv", "--reuid=%d" % uid, "--regid=%d" % uid, "--clear-groups"]
    return wrap + list(argv)


def runcell_for(uid):
    """runcell as uid reaches it: the build's own for root; for another uid a copy
    (rctest.reachable_runcell), whatever the mode of the directories above the tree under
    test (a clone in a 0700 `mktemp -d` directory, shared as it is)."""
    return RUNCELL if uid is None else reachable_runcell()


def doctor(test, cgdir, uid=None):
    """`runcell doctor --json --no-template` run in the placement: its report (a dict).
    Skips, saying so, in a build that has no doctor command yet."""
    env = USER_ENV if uid is not None else None
    argv = [runcell_for(uid), "doctor", "--json", "--no-template"]
    p = subprocess.run(in_cgroup(cgdir, argv, uid),
                       capture_output=True, text=True, timeout=slow(120), env=env, cwd="/")
    if not p.stdout.lstrip().startswith("{"):
        if "unknown command" in p.stderr.lower() or "usage" in p.stderr.lower():
            test.skipTest("`runcell doctor` does not exist in this build yet: %s"
                          % p.stderr.strip()[:200])
        test.fail("runcell doctor printed no JSON (exit %d): %s" % (p.returncode, p.stderr))
    report = json.loads(p.stdout)
    # Exit 1 says "degraded" (as a user, always: the disk is capped per file only).
    test.assertIn(p.returncode, (0, 1), p.stderr)
    if not report["cgroup"]["limits"] or not report["root"]:
        test.assertEqual(p.returncode, 1, p.stdout[:2000])
    test.assertEqual(report["cgroup"]["version"], "v2", p.stdout[:2000])
    return report


@unittest.skipUnless(os.geteuid() == 0, "needs root to build cgroup placements")
@unittest.skipUnless(pure_v2(), "needs a pure cgroup v2 host (cgroup2 at /sys/fs/cgroup); "
                     "tests/vm/run boots one")
class Placement(RuncellTestCase):
    """One placement: setUp builds it under SCENARIO (a cgroup of the root), the tests run
    runcell there; then a cleanup checks that nothing is left and removes the placement."""
    uid = None

    def setUp(self):
        self.scenario = os.path.join(CG, "rcvm-" + self.id().rsplit(".", 1)[-1][:40])
        remove_tree(self.scenario)
        enable(CG)
        os.mkdir(self.scenario)
        self.addCleanup(remove_tree, self.scenario)
        # Cleanups run last-in first-out: this check runs once the test's own runcell
        # processes are stopped, and before the placement goes.
        self.addCleanup(self.check_nothing_left)
        self.where = self.build(self.scenario)  # the cgroup runcell starts in
        self.before = tree(CG)
        self.root_procs_before = set(procs(CG))

    def build(self, scenario):
        raise NotImplementedError

    # ---- running runcell in the placement ----

    def env(self):
        return dict(USER_ENV) if self.uid is not None else None

    def run_json(self, code, *opts):
        argv = [runcell_for(self.uid), "run", "--json", *opts, "-c", code]
        p = subprocess.run(in_cgroup(self.where, argv, self.uid), capture_output=True, text=True,
                           timeout=slow(180), env=self.env(), cwd="/")
        lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
        self.assertTrue(lines, "no JSON record; exit %d, stderr: %s" % (p.returncode, p.stderr))
        return json.loads(lines[-1]), p

    def held_run(self, *opts):
        """A run whose cell prints 'ready' then sleeps; returns the Popen once it is ready."""
        argv = [runcell_for(self.uid), "run", "--timeout", "900", *opts, "-c", HOLD]
        p = subprocess.Popen(in_cgroup(self.where, argv, self.uid),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env(),
                             cwd="/")
        self.addCleanup(self.stop, p)
        line, _ = read_line(p.stdout)
        self.assertEqual(line.strip(), b"ready", p.stderr.read1(4096) if not line else line)
        return p

    def stop(self, p):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(slow(60))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in (p.stdout, p.stderr):
            if f:
                f.close()

    # ---- the checks every delegating placement passes ----

    def check_limits_set(self):
        p = self.held_run("--memory", "96", "--pids", "24", "--cpus", "0.5")
        found = sandbox_cgroups(self.scenario if self.scenario != CG else CG, 96 * MiB)
        self.assertEqual(len(found), 1, "sandbox cgroups with memory.max 96 MiB below %s: %s"
                         % (self.scenario, found))
        sb = found[0]
        self.assertEqual(read(os.path.join(sb, "pids.max")), "24")
        self.assertEqual(read(os.path.join(sb, "cpu.max")), "50000 100000")
        # The processes are in the sandbox's leaf below it (the cgroup that names the sandbox).
        held = [pid for d in [sb] + [os.path.join(sb, rel) for rel in tree(sb)]
                for pid in procs(d)]
        self.assertTrue(held, "the sandbox's cgroup %s and its leaf hold no process" % sb)
        self.stop(p)
        self.assertFalse(os.path.exists(sb), "the sandbox's cgroup %s outlived the run" % sb)

    def assert_cgroup_limits(self, rec, p):
        """The record's limits come from cgroups. As a user, limits_degraded still says
        that the disk is capped per file only (no tmpfs mounts without root), and only that."""
        if self.uid is None:
            self.assertFalse(rec["limits_degraded"],
                             "limits degraded in this placement: %s" % p.stderr.strip())
            self.assertNotIn("degraded", p.stderr)
        else:
            self.assertIn("not running as root: workspace and /tmp sizes are capped per file",
                          p.stderr)
            self.assertNotIn("cgroup", p.stderr)

    def check_bombs(self):
        """A fork bomb, then a memory bomb, as two cells of one sandbox (one start each
        placement: under TCG a start costs seconds): the first stops at the pids cap, the
        second ends as oom, and the run with it."""
        p = subprocess.run(in_cgroup(self.where, [
            runcell_for(self.uid), "run", "--json", "--memory", "64", "--pids", "16",
            "--timeout", str(int(slow(30))), "-c", FORK_BOMB, "-c", MEMORY_BOMB], self.uid),
            capture_output=True, text=True, timeout=slow(240), env=self.env(), cwd="/")
        recs = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
        self.assertEqual(len(recs), 2, "exit %d, stdout %s, stderr %s"
                         % (p.returncode, p.stdout[-2000:], p.stderr[-2000:]))
        fork, mem = recs
        self.assert_cgroup_limits(fork, p)
        self.assertStatus(fork, "ok")
        res = json.loads([l for l in fork["stdout"].splitlines() if l.startswith("{")][-1])
        self.assertEqual(res["error"], "EAGAIN", res)
        self.assertLess(res["forks"], 16)
        self.assertStatus(mem, "oom")
        self.assertEqual(p.returncode, 137)
        self.assertLessEqual(mem["usage"]["memory_peak_kb"], 64 * 1024)

    def check_nothing_left(self):
        """No cgroup is left that was not there before (runcell removes its base and its
        leaf at exit, moves back and disables what it enabled), nor any runcell process."""
        new = sorted(tree(CG) - self.before)
        busy = [n for n in new if procs(os.path.join(CG, n))]
        sandboxes = [n for n in new if os.path.basename(n)[:1].isdigit()]
        self.assertEqual(busy, [], "cgroups left with processes in them")
        self.assertEqual(sandboxes, [], "sandbox cgroups left behind")
        self.assertEqual(new, [], "cgroups left behind")
        strays = [p for p in set(procs(CG)) - self.root_procs_before - {os.getpid()}
                  if b"runcell" in cmdline(p)]
        self.assertEqual(strays, [], "runcell processes left in the root cgroup")


class RootInRootCgroup(Placement):
    """(a) root, in the root cgroup itself."""

    def build(self, scenario):
        return CG

    def test_limits_are_set_on_the_sandbox_cgroup(self):
        self.scenario = CG
        self.check_limits_set()

    def test_bombs_are_contained(self):
        self.check_bombs()

    def test_doctor_reports_the_root_placement(self):
        report = doctor(self, CG)
        self.assertEqual(report["cgroup"]["placement"], "v2-root", report["cgroup"])
        self.assertTrue(report["cgroup"]["limits"], report["cgroup"])


class DelegatedService(Placement):
    """(b) root in system.slice/runcell.service with Delegate=yes, the daemon running."""

    def build(self, scenario):
        slice_ = os.path.join(scenario, "system.slice")
        os.mkdir(slice_)
        enable(scenario)
        enable(slice_)  # systemd enables what a Delegate=yes unit below asks for
        self.service = os.path.join(slice_, "runcell.service")
        os.mkdir(self.service)
        return self.service

    def serve(self):
        self.port = free_port()
        self.token = "rcvm-token-0123456789abcdef0123"
        data = tempfile.mkdtemp(prefix="rcvm-serve-")
        self.addCleanup(shutil.rmtree, data, True)
        log = open(os.path.join(data, "log"), "w+")
        self.addCleanup(log.close)
        p = subprocess.Popen(in_cgroup(self.service, [
            RUNCELL, "serve", "--listen", "127.0.0.1:%d" % self.port, "--data", data,
            "--token", self.token]), stdout=log, stderr=subprocess.STDOUT)
        self.addCleanup(self.stop, p)

        def up():
            if p.poll() is not None:
                log.seek(0)
                raise AssertionError("runcell serve exited %d: %s" % (p.returncode, log.read()))
            try:
                return self.call("GET", "/healthz")[0] == 200
            except OSError:
                return False
        self.assertTrue(wait_until(up, timeout=120), "runcell serve did not answer")
        return p

    def call(self, method, path, body=None):
        import urllib.error
        import urllib.request
        rq = urllib.request.Request(
            "http://127.0.0.1:%d%s" % (self.port, path), method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": "Bearer " + self.token,
                     "Content-Type": "application/json"})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(rq, timeout=slow(180)) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def test_daemon_moves_into_a_leaf_and_delegates_controllers(self):
        p = self.serve()
        # v2's no-internal-processes rule: the service's cgroup hands controllers down only
        # once no process is left in it, the daemon included.
        self.assertEqual(procs(self.service), [], "processes left in runcell.service itself")
        leaf = own_cgroup(p.pid)
        self.assertTrue(leaf.startswith(self.service + "/"),
                        "the daemon is in %s, not in a leaf below the service" % leaf)
        enabled = read(os.path.join(self.service, "cgroup.subtree_control")).split()
        for c in ("memory", "pids", "cpu"):
            self.assertIn(c, enabled, "runcell.service's subtree_control: %s" % enabled)
        st, sess = self.call("POST", "/v1/sessions", {"memory_mb": 80, "pids": 20,
                                                       "cpus": 0.25})
        self.assertEqual(st, 201, sess)
        self.assertFalse(sess["limits_degraded"], sess)
        st, rec = self.call("POST", "/v1/sessions/%s/execute" % sess["id"], {"code": "6*7"})
        self.assertEqual(st, 200, rec)
        self.assertStatus(rec, "ok")
        found = sandbox_cgroups(self.service, 80 * MiB)
        self.assertEqual(len(found), 1, "session cgroups with memory.max 80 MiB: %s" % found)
        self.assertEqual(read(os.path.join(found[0], "pids.max")), "20")
        self.assertEqual(read(os.path.join(found[0], "cpu.max")), "25000 100000")
        st, rec = self.call("POST", "/v1/sessions/%s/execute" % sess["id"],
                            {"code": MEMORY_BOMB})
        self.assertEqual(st, 200, rec)
        self.assertStatus(rec, "oom")
        st, _ = self.call("DELETE", "/v1/sessions/%s" % sess["id"])
        self.assertIn(st, (200, 204))
        self.assertTrue(wait_until(lambda: not sandbox_cgroups(self.service, 80 * MiB),
                                   timeout=60), "the session's cgroup outlived its deletion")
        self.stop(p)
        self.assertEqual(p.returncode, 0, "runcell serve's exit status after SIGTERM")

    def test_oneshot_run_in_the_service_gets_limits(self):
        self.check_bombs()

    def test_doctor_reports_a_delegated_placement(self):
        report = doctor(self, self.service)
        self.assertEqual(report["cgroup"]["placement"], "v2-delegated", report["cgroup"])
        self.assertTrue(report["cgroup"]["limits"], report["cgroup"])


class DelegatedUserSubtree(Placement):
    """(c) uid nobody in user@UID.service/app.slice/runcell.scope, delegated as systemd's
    user@ delegates: the user owns the subtree and its control files."""
    uid = NOBODY

    def build(self, scenario):
        u = os.path.join(scenario, "user.slice", "user-%d.slice" % self.uid)
        os.makedirs(u)
        enable(scenario)
        enable(os.path.dirname(u))
        enable(u)
        self.user_service = os.path.join(u, "user@%d.service" % self.uid)
        os.mkdir(self.user_service)
        for f in ("", "cgroup.procs", "cgroup.subtree_control", "cgroup.threads"):
            os.chown(os.path.join(self.user_service, f), self.uid, self.uid)
        # What systemd --user makes inside: itself in init.scope, units in app.slice, with
        # the controllers handed down (it enables them for units that ask for Delegate=).
        init = os.path.join(self.user_service, "init.scope")
        app = os.path.join(self.user_service, "app.slice")
        scope = os.path.join(app, "runcell.scope")
        for d in (init, app, scope):
            os.mkdir(d)
        enable(self.user_service)
        enable(app)
        for d in (init, app, scope):
            for f in ("", "cgroup.procs", "cgroup.subtree_control", "cgroup.threads"):
                os.chown(os.path.join(d, f), self.uid, self.uid)
        stand_in = subprocess.Popen(in_cgroup(init, ["sleep", "3600"], self.uid))
        self.addCleanup(stand_in.wait)
        self.addCleanup(stand_in.kill)
        return scope

    def test_limits_without_root(self):
        self.check_limits_set()

    def test_bombs_are_contained(self):
        self.check_bombs()

    def test_doctor_reports_a_delegated_placement(self):
        report = doctor(self, self.where, self.uid)
        self.assertFalse(report["root"])
        self.assertEqual(report["cgroup"]["placement"], "v2-delegated", report["cgroup"])
        self.assertTrue(report["cgroup"]["limits"], report["cgroup"])


class SharedCgroup(Placement):
    """(d) root in a login-shell-like session scope that holds other processes (the shell):
    runcell must not take it over, nor leave anything in it."""

    def build(self, scenario):
        s = os.path.join(scenario, "user.slice", "user-0.slice")
        os.makedirs(s)
        enable(scenario)
        enable(os.path.dirname(s))
        enable(s)
        self.session = os.path.join(s, "session-1.scope")
        os.mkdir(self.session)
        shell = subprocess.Popen(in_cgroup(self.session, ["sleep", "3600"]))
        self.addCleanup(shell.wait)
        self.addCleanup(shell.kill)
        self.shell = shell
        wait_until(lambda: shell.pid in procs(self.session), timeout=30)
        return self.session

    def test_shared_cgroup_is_left_alone(self):
        subtree = read(os.path.join(self.session, "cgroup.subtree_control"))
        rec, p = self.run_json("print(1)")
        self.assertStatus(rec, "ok")
        if rec["limits_degraded"]:
            # Refused: the message must give the way out.
            self.assertIn("systemd-run", p.stderr, "the degraded message: %s" % p.stderr)
        else:
            # A scope of its own from systemd: the sandbox must not be below the session.
            self.assertTrue(os.path.exists("/run/systemd/system"),
                            "limits without systemd in a shared cgroup: %s" % p.stderr)
        self.assertEqual(tree(self.session), set(), "cgroups made in the shared cgroup")
        self.assertEqual(read(os.path.join(self.session, "cgroup.subtree_control")), subtree)
        # The shell's cgroup still takes new processes (no controllers enabled: no EBUSY).
        q = subprocess.run(in_cgroup(self.session, ["true"]), timeout=slow(30))
        self.assertEqual(q.returncode, 0, "a new process cannot join the session's cgroup")
        self.assertEqual(sorted(procs(self.session)), [self.shell.pid])

    def test_doctor_reports_the_shared_cgroup(self):
        report = doctor(self, self.session)
        self.assertEqual(report["cgroup"]["placement"], "v2-shared", report["cgroup"])
        self.assertIn("systemd-run", report["cgroup"]["degraded_reason"])
        self.assertEqual(tree(self.session), set(), "cgroups made in the shared cgroup")



class NothingDelegated(Placement):
    """(e) uid nobody in a cgroup it does not own: degraded, saying what to change."""
    uid = NOBODY

    def build(self, scenario):
        enable(scenario)
        d = os.path.join(scenario, "app.scope")
        os.mkdir(d)
        return d

    def test_degraded_with_a_message_saying_what_to_change(self):
        rec, p = self.run_json("print(1)")
        self.assertStatus(rec, "ok")
        self.assertTrue(rec["limits_degraded"])
        msg = p.stderr
        self.assertIn("resource limits are degraded", msg)
        self.assertNotIn("run as root", msg.lower(),
                         "the message for a user with no delegated cgroup: %s" % msg)
        self.assertIn(self.where[len(CG):], msg, "the message does not name the cgroup")
        self.assertIn("elegate", msg, "the message does not say to delegate it")

    def test_doctor_says_what_to_change(self):
        report = doctor(self, self.where, self.uid)
        self.assertEqual(report["cgroup"]["placement"], "v2-undelegated", report["cgroup"])
        self.assertFalse(report["cgroup"]["limits"])
        self.assertIn("Delegate=yes", report["cgroup"]["degraded_reason"])



if __name__ == "__main__":
    unittest.main()
