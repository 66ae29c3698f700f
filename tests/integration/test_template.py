"""test_template - the template and the pool of ready sessions behind `runcell serve`
(docs/ARCHITECTURE.md "The template"): the template holds none of the server's secrets,
no byte of one session's request (an index URL's password) reaches the template or a later
session's memory, each session's random generators are its own, nothing one session did is
seen by the next one cloned from the same template, a killed
template is replaced and its sessions live on, a changed kernel or helper retires the
template for a new one, and the pool refills after it hands a session out.

The template is used only as root (it maps every sandbox's ids) with cgroups; elsewhere
these tests skip. Timeouts below only stop hangs.
"""
import json
import os
import re
import select
import socket
import subprocess
import shutil
import signal
import tempfile
import unittest

from memscan import SANDBOX_SCAN, children_of, descendants
from rctest import HANG, PY, RUNCELL, RuncellTestCase, Server, is_root, wait_until

SECRET_KEY = "sk-rctest-%s" % os.urandom(12).hex()
SECRET_TOKEN = "rctest-secret-token-%s" % os.urandom(12).hex()
PRELOADED = "import sys\nsorted(m for m in ('numpy', 'pandas', 'matplotlib') if m in sys.modules)"


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def proc_state(pid):
    """The state letter of pid ('Z' for a zombie), or None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def comm(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return ""


def templates_of(srv):
    """The server's live template: the interpreter its own sandbox's init runs (sessions'
    inits and kernels are the template's clones and keep its command line)."""
    tree = children_of()
    return [g for c in tree.get(srv.pid, []) if comm(c) == "runcell-sandbox"
            for g in tree.get(c, []) if "kernel.py --template" in cmdline(g)
            and comm(g) != "runcell-sandbox"]


def kernels_of(srv):
    """Every session's kernel (an interpreter below some init, not the template)."""
    tpl = set(templates_of(srv))
    return [p for p in descendants(srv.pid)
            if "kernel.py" in cmdline(p) and comm(p) != "runcell-sandbox" and p not in tpl]


def memory_holds(pid, needles):
    """Which of needles (bytes) appear anywhere in pid's readable memory or environment."""
    found = set()
    with open("/proc/%d/environ" % pid, "rb") as f:
        env = f.read()
    found.update(n for n in needles if n in env)
    with open("/proc/%d/maps" % pid) as maps, open("/proc/%d/mem" % pid, "rb", 0) as mem:
        for line in maps:
            addr, perms = line.split()[:2]
            if not perms.startswith("r") or line.rstrip().endswith("[vvar]"):
                continue
            lo, hi = (int(x, 16) for x in addr.split("-"))
            try:
                mem.seek(lo)
                chunk = mem.read(hi - lo)
            except (OSError, OverflowError, ValueError):
                continue
            found.update(n for n in needles if n in chunk)
    return found


# Run inside a session: the regions of its own memory where HEAD is directly followed by TAIL
# (memscan's scan_memory). The two halves of the needle are kept apart, so the whole needle is
# in this process's memory only where something else put it.
def scan_code(head, tail):
    return SANDBOX_SCAN + "\nimport json\nprint(json.dumps(scan_memory(%r, %r)))" % (
        head.encode(), tail.encode())


# Run inside a session: what each generator a user can reach gives first. Two sessions must
# differ in every one (collisions are below 1 in 10^12 for each).
DRAWS = r"""
import json, os, random, secrets, ssl, tempfile, uuid
import numpy, pandas
with tempfile.NamedTemporaryFile() as f:
    name = os.path.basename(f.name)
print(json.dumps({
    "random": random.random(),
    "numpy.random.rand": numpy.random.rand(),
    "numpy.random.randint": int(numpy.random.randint(1 << 62)),
    "default_rng": numpy.random.default_rng().random(),
    "DataFrame.sample": pandas.DataFrame({"x": range(1000)}).sample(6).x.tolist(),
    "Series.sample": pandas.Series(range(1000)).sample(frac=0.01).tolist(),
    "uuid4": str(uuid.uuid4()),
    "tempfile": name,
    "mkdtemp": os.path.basename(tempfile.mkdtemp()),
    "secrets": secrets.token_hex(16),
    "ssl.RAND_bytes": ssl.RAND_bytes(16).hex(),
}))
"""

# Run inside a session: what a fork server cannot change without an exec: the str hash
# secret, where libc is mapped, and the stack canary (read from the thread block, %fs:0x28).
LAYOUT = r"""
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
fs = ctypes.c_ulong()
ARCH_GET_FS = 0x1003
assert libc.syscall(158, ARCH_GET_FS, ctypes.byref(fs)) == 0, ctypes.get_errno()
print(json.dumps({
    "hash": hash("x"),
    "libc": ctypes.cast(libc.printf, ctypes.c_void_p).value,
    "canary": ctypes.c_ulong.from_address(fs.value + 0x28).value,
}))
"""


def draws(srv, sid, code):
    rec = srv.execute(sid, code)
    if rec["status"] != "ok":
        raise AssertionError("record: %s" % json.dumps(rec)[:3000])
    return json.loads(rec["stdout"])


def metric(srv, name):
    text = srv.request("GET", "/metrics").body.decode()
    m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
    if not m:
        raise AssertionError("%s is not in /metrics:\n%s" % (name, text))
    return float(m.group(1))


def template_unavailable():
    if not is_root():
        return "the template needs root"
    with Server("--pool", "0") as srv:
        if not wait_until(lambda: templates_of(srv)):
            return "runcell serve started no template here:\n" + srv.log()[-2000:]
    return None


SKIP = template_unavailable()


@unittest.skipIf(SKIP, SKIP)
class TemplateTest(RuncellTestCase):
    def value(self, rec):
        self.assertStatus(rec, "ok")
        return rec["results"][-1]["text/plain"] if rec["results"] else None

    def test_template_and_sessions_hold_no_server_secrets(self):
        # The token and an LLM key live in the server; neither may reach a process whose
        # memory sandboxed code could share (the template's heap is every session's heap).
        with Server("--pool", "1", token=SECRET_TOKEN,
                    env={"OPENAI_API_KEY": SECRET_KEY}) as srv:
            sid = srv.create_session()
            self.assertEqual(self.value(srv.execute(sid, "21 * 2")), "42")
            [tpl] = templates_of(srv)
            # The pool makes its next session in the background after handing one out:
            # wait for it rather than assume it is there already.
            self.assertTrue(wait_until(lambda: len(kernels_of(srv)) >= 2),
                            "a session and a pooled one: %s" % kernels_of(srv))
            needles = {SECRET_TOKEN.encode(), SECRET_KEY.encode()}
            # The check can see: the server itself holds both.
            self.assertEqual(memory_holds(srv.pid, needles), needles)
            # Every process below the server: the template, its init, the sessions' inits
            # and kernels.
            below = descendants(srv.pid)
            self.assertIn(tpl, below)
            for pid in below:
                self.assertEqual(memory_holds(pid, needles), set(),
                                 "process %d (%s)" % (pid, cmdline(pid)))
            # And from inside: nothing in the environment.
            rec = srv.execute(sid, "import os\nsorted(k for k in os.environ if 'KEY' in k "
                                   "or 'TOKEN' in k)")
            self.assertEqual(self.value(rec), "[]")

    def scan(self, srv, sid, head, tail):
        rec = srv.execute(sid, scan_code(head, tail))
        self.assertStatus(rec, "ok")
        return json.loads(rec["stdout"])

    def test_a_session_request_never_reaches_the_template_or_a_later_session(self):
        # Session A's request carries a password (in its index URL, which becomes A's
        # PIP_INDEX_URL). The template took the request in; a later session B is a clone of
        # the template and may read every byte of its own memory.
        head, tail = "rcpw%s" % os.urandom(6).hex(), "%sx" % os.urandom(6).hex()
        secret = head + tail
        with Server("--pool", "0") as srv:
            a = srv.ok("POST", "/v1/sessions", {
                "network": {"mode": "allowlist", "allow": ["127.0.0.1:9"]},
                "index_url": "http://rcuser:%s@127.0.0.1:9/simple" % secret}, status=201)["id"]
            rec = srv.execute(a, "import os\n'%s' in os.environ['PIP_INDEX_URL']" % head)
            self.assertEqual(self.value(rec), "True")
            # A's processes: its init (the template's only child yet), the kernel, the relay.
            [tpl] = templates_of(srv)
            [a_init] = children_of()[tpl]
            a_procs = {a_init, *descendants(a_init)}
            [a_kernel] = [p for p in a_procs if comm(p) == "python3"]
            # The scan sees what is there: A finds its own password.
            self.assertTrue(self.scan(srv, a, head, tail)["hits"])
            b = srv.create_session()
            mine = self.scan(srv, b, head, tail)
            self.assertEqual(mine["hits"], [], "session B holds session A's password")
            self.assertGreater(mine["scanned_mb"], 20, "the scan read B's whole memory")
            # From the host: the template, its init, B and the server's other processes hold
            # no byte of it; A's own init and kernel do (the host's scan sees it there).
            self.assertEqual(memory_holds(tpl, {secret.encode()}), set(), "the template")
            for pid in descendants(srv.pid):
                if pid not in a_procs:
                    self.assertEqual(memory_holds(pid, {secret.encode()}), set(),
                                     "process %d (%s)" % (pid, cmdline(pid)))
            self.assertEqual(memory_holds(a_kernel, {secret.encode()}), {secret.encode()})
            # Still true after B's own request and a third session.
            c = srv.create_session()
            self.assertEqual(self.scan(srv, c, head, tail)["hits"], [])
            self.assertEqual(memory_holds(tpl, {secret.encode()}), set(), "the template")

    def test_forks_undos_and_snapshots_hold_no_other_sessions_secret(self):
        # Session A holds a secret in a variable. Session B (another tenant) is forked, kept
        # as a snapshot that a new session starts from, and undone: each of those, reading
        # every byte of its own memory, finds none of A's secret, nor does the host in any
        # process but A's.
        head, tail = "rcfk%s" % os.urandom(6).hex(), "%sx" % os.urandom(6).hex()
        secret = (head + tail).encode()
        with Server("--pool", "0") as srv:
            a = srv.create_session()
            self.assertStatus(srv.execute(a, "secret = %r + %r" % (head, tail)), "ok")
            [tpl] = templates_of(srv)
            [a_init] = children_of()[tpl]
            a_procs = {a_init, *descendants(a_init)}
            self.assertTrue(self.scan(srv, a, head, tail)["hits"])
            b = srv.ok("POST", "/v1/sessions", {"history": 2}, status=201)["id"]
            self.assertStatus(srv.execute(b, "mine = list(range(1000))"), "ok")
            forks = srv.ok("POST", "/v1/sessions/%s/fork" % b, {"count": 2},
                           status=201)["sessions"]
            snap = srv.ok("POST", "/v1/sessions/%s/snapshots" % b, {}, status=201)["id"]
            c = srv.ok("POST", "/v1/sessions", {"snapshot": snap}, status=201)["id"]
            self.assertStatus(srv.execute(b, "mine = None"), "ok")
            srv.ok("POST", "/v1/sessions/%s/undo" % b, {})  # B's kernel is the copy now
            for sid in [f["id"] for f in forks] + [c, b]:
                self.assertEqual(self.value(srv.execute(sid, "len(mine)")), "1000")
                mine = self.scan(srv, sid, head, tail)
                self.assertEqual(mine["hits"], [], "session %s holds A's secret" % sid)
                self.assertGreater(mine["scanned_mb"], 20, "the scan read the whole memory")
            for pid in descendants(srv.pid):
                if pid in a_procs:
                    continue
                try:
                    held = memory_holds(pid, {secret})
                except FileNotFoundError:  # it ended since it was listed (a copy dropped)
                    continue
                self.assertEqual(held, set(), "process %d (%s)" % (pid, cmdline(pid)))

    def test_each_session_draws_its_own_random_numbers(self):
        with Server("--pool", "1") as srv:
            firsts = [draws(srv, srv.create_session(), DRAWS) for _ in range(3)]
            shared = {name: [f[name] for f in firsts] for name in firsts[0]
                      if len({json.dumps(f[name]) for f in firsts}) < 3}
            self.assertEqual(shared, {}, "generators whose draws sessions share")
            # Both were cloned: this is the template's state being reseeded, not a cold start.
            self.assertEqual(self.value(srv.execute(srv.create_session(), PRELOADED)),
                             "['matplotlib', 'numpy', 'pandas']")

    def test_clones_share_the_hash_secret_layout_and_canary(self):
        # The stated trade-off (docs/SECURITY.md "Sandboxes made from the template"): what
        # an exec would renew stays the template's. --no-template avoids it (below).
        with Server("--pool", "0") as srv:
            a, b = (draws(srv, srv.create_session(), LAYOUT) for _ in range(2))
            self.assertEqual(a, b)

    def test_nothing_one_session_does_is_seen_by_the_next(self):
        with Server("--pool", "0") as srv:
            a = srv.create_session()
            rec = srv.execute(a, "import os, json, numpy, pandas\n"
                                 "json.rctest_mark = 1\n"
                                 "numpy.rctest_mark = 1\n"
                                 "pandas.set_option('display.max_rows', 3)\n"
                                 "os.environ['RCTEST_MARK'] = '1'\n"
                                 "open('/tmp/rctest-mark', 'w').write('x')\n"
                                 "open('mark.txt', 'w').write('x')\n"
                                 "import builtins; builtins.rctest_mark = 1\n"
                                 "secret = 'left-by-a'\n")
            self.assertStatus(rec, "ok")
            b = srv.create_session()
            rec = srv.execute(b, "import os, json, numpy, pandas, builtins\n"
                                 "[hasattr(json, 'rctest_mark'), hasattr(numpy, 'rctest_mark'),"
                                 " pandas.get_option('display.max_rows'),"
                                 " 'RCTEST_MARK' in os.environ,"
                                 " os.path.exists('/tmp/rctest-mark'),"
                                 " os.path.exists('mark.txt'),"
                                 " hasattr(builtins, 'rctest_mark'), 'secret' in globals()]")
            self.assertEqual(self.value(rec), "[False, False, 60, False, False, False, False, False]")
            # Both were cloned from the template: the imports were already there.
            self.assertEqual(self.value(srv.execute(b, PRELOADED)),
                             "['matplotlib', 'numpy', 'pandas']")

    def test_the_templates_own_warm_up_cells_leave_nothing_in_a_session(self):
        # The template runs a kernel on throwaway cells before its first clone (to have
        # CPython rewrite its bytecode there once), and each clone runs one before its
        # main loop (to write the pages of that path while it waits in the pool): a
        # session starts as if none had run, with one kernel alive, its own.
        with Server("--pool", "1") as srv:
            rec = srv.execute(srv.create_session(),
                              "import gc, signal, sys\n"
                              "[sorted(k for k in globals() if not k.startswith('__')),"
                              " signal.getsignal(signal.SIGINT).__qualname__,"
                              " sys.modules['linecache'].cache['<cell 1>'][2][0].strip(),"
                              " len([o for o in gc.get_objects()"
                              "      if type(o).__name__ in ('Kernel', 'Channel')]),"
                              " hasattr(__builtins__, '_')]")
            self.assertEqual(rec["execution_count"], 1)
            self.assertEqual(self.value(rec), "[['gc', 'signal', 'sys'], '_Interrupts.handler', "
                                              "'import gc, signal, sys', 2, False]")
            # A first cell's error shows that cell's own line.
            rec = srv.execute(srv.create_session(), "x = 1\ny = x / 0  # rctest-line\n")
            self.assertStatus(rec, "error")
            self.assertIn("y = x / 0  # rctest-line", rec["error"]["traceback"])
            self.assertEqual(self.value(srv.execute(srv.create_session(), PRELOADED)),
                             "['matplotlib', 'numpy', 'pandas']")

    def test_killed_template_is_replaced_and_its_sessions_live_on(self):
        with Server("--pool", "0") as srv:
            old = srv.create_session()
            srv.execute(old, "x = 41")
            [tpl] = templates_of(srv)
            os.kill(tpl, signal.SIGKILL)
            wait_until(lambda: tpl not in templates_of(srv))
            # The session it made keeps its state.
            self.assertEqual(self.value(srv.execute(old, "x + 1")), "42")
            # The next session comes from a new template, imports and all.
            new = srv.create_session()
            self.assertEqual(self.value(srv.execute(new, PRELOADED)),
                             "['matplotlib', 'numpy', 'pandas']")
            self.assertIn('msg="replacing the template" reason=', srv.log())
            now = templates_of(srv)
            self.assertEqual(len(now), 1)
            self.assertNotEqual(now[0], tpl)
            # Killed just before a request, before anything noticed: the request still
            # gets a session from a template, not a cold start.
            os.kill(now[0], signal.SIGKILL)
            third = srv.create_session()
            self.assertEqual(self.value(srv.execute(third, PRELOADED)),
                             "['matplotlib', 'numpy', 'pandas']")
            self.assertEqual(self.value(srv.execute(old, "x")), "41")

    def test_ended_sessions_leave_no_zombies_under_the_template(self):
        # The template's loop runs no Python, so no handler reaps its children (the
        # sessions' inits): it ignores SIGCHLD and the kernel reaps them as they end.
        with Server("--pool", "0") as srv:
            sids = [srv.create_session() for _ in range(3)]
            [tpl] = templates_of(srv)
            inits = children_of().get(tpl, [])
            self.assertEqual(len(inits), 3, inits)
            for sid in sids:
                srv.ok("DELETE", "/v1/sessions/" + sid)

            def left():
                return {p: proc_state(p) for p in inits if proc_state(p) is not None}
            self.assertTrue(wait_until(lambda: not left()),
                            "the ended sessions' inits are still there: %s" % left())
            # The template serves on.
            sid = srv.create_session()
            self.assertEqual(self.value(srv.execute(sid, PRELOADED)),
                             "['matplotlib', 'numpy', 'pandas']")
            self.assertEqual(templates_of(srv), [tpl])

    def test_changed_kernel_retires_the_template(self):
        libexec = tempfile.mkdtemp(prefix="runcell-libexec-")
        self.addCleanup(shutil.rmtree, libexec)
        os.chmod(libexec, 0o755)
        build = os.path.dirname(os.path.realpath(RUNCELL))
        shutil.copy2(os.path.join(build, "runcell-sandbox"), libexec)
        shutil.copytree(os.path.join(build, "kernel"), os.path.join(libexec, "kernel"),
                        ignore=shutil.ignore_patterns("*.p"))
        with Server("--pool", "0", env={"RUNCELL_LIBEXEC": libexec}) as srv:
            old = srv.create_session()
            srv.execute(old, "x = 1")
            [tpl] = templates_of(srv)
            # An upgrade replaces the kernel: the next session must not run the old one.
            kernel = os.path.join(libexec, "kernel", "kernel.py")
            with open(kernel) as f:
                text = f.read()
            self.assertIn("\nimport sys\n", text)
            with open(kernel, "w") as f:
                f.write(text.replace("\nimport sys\n", "\nimport sys\nsys.rctest_upgraded = True\n", 1))
            new = srv.create_session()
            self.assertIn('msg="replacing the template" reason=profile changed', srv.log())
            upgraded = "import sys\ngetattr(sys, 'rctest_upgraded', False)"
            self.assertEqual(self.value(srv.execute(new, upgraded)), "True")
            self.assertEqual(self.value(srv.execute(old, upgraded)), "False")
            now = templates_of(srv)
            self.assertEqual(len(now), 1)
            self.assertNotEqual(now[0], tpl)
            # The retired template's session is untouched.
            self.assertEqual(self.value(srv.execute(old, "x")), "1")
            srv.ok("DELETE", "/v1/sessions/" + old)

    def test_pool_refills_after_handing_out(self):
        with Server("--pool", "2") as srv:
            self.assertTrue(wait_until(lambda: metric(srv, "runcell_pool_ready") == 2),
                            srv.log())
            self.assertGreater(metric(srv, "runcell_template_ready_seconds"), 0)
            sids = [srv.create_session() for _ in range(3)]
            for s in sids:
                self.assertEqual(self.value(srv.execute(s, "1 + 1")), "2")
            self.assertTrue(wait_until(lambda: metric(srv, "runcell_pool_ready") == 2),
                            srv.log())
            self.assertEqual(metric(srv, "runcell_sessions_live"), 3)
            # Pooled sessions take the limits asked for at creation, not the pool's.
            s = srv.ok("POST", "/v1/sessions", {"memory_mb": 128}, status=201)["id"]
            rec = srv.execute(s, "blocks = []\nfor i in range(400):\n"
                                 "    blocks.append(bytearray(1 << 20))\n")
            self.assertStatus(rec, "oom")

    def test_pooled_sessions_take_a_raised_memory_limit(self):
        """A limit above the pool's is written in the order cgroup v1 takes (memsw, then
        memory): the pooled session is used, not thrown away, and holds what it was given."""
        with Server("--pool", "1") as srv:
            self.assertTrue(wait_until(lambda: metric(srv, "runcell_pool_ready") == 1),
                            srv.log())
            s = srv.ok("POST", "/v1/sessions", {"memory_mb": 1536}, status=201)["id"]
            rec = srv.execute(s, "b = bytearray(1200 << 20)\nlen(b) >> 20")
            self.assertEqual(self.value(rec), "1200")
            self.assertNotIn("pooled session unusable", srv.log())



@unittest.skipIf(SKIP, SKIP)
class TemplateRequestsTest(RuncellTestCase):
    """The template's own loop, driven directly over its channel: requests its clone cannot
    take are answered with an error, and the template serves on."""

    def setUp(self):
        kernel = os.path.join(os.path.dirname(os.path.realpath(RUNCELL)), "kernel", "kernel.py")
        self.ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.addCleanup(self.ctl.close)
        env = {"PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
               "MPLBACKEND": "Agg"}
        with tempfile.TemporaryDirectory() as d:
            self.proc = subprocess.Popen(
                ["sh", "-c", 'exec 3<&%d %d<&-; exec "$0" "$@"' % (theirs.fileno(), theirs.fileno()), PY, kernel,
                 "--template"], pass_fds=[theirs.fileno()], env=dict(env, HOME=d),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        theirs.close()
        self.addCleanup(self.stop)
        self.assertEqual(self.reply()["type"], "ready")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=HANG)

    def reply(self):
        ready, _, _ = select.select([self.ctl], [], [], HANG)
        self.assertTrue(ready, "the template did not answer")
        msg = self.ctl.recv(4096)
        if not msg:
            self.proc.kill()
            self.fail("the template closed its channel: %s" % self.proc.communicate()[1])
        return json.loads(msg)

    def ask(self, text, n_fds):
        r, w = os.pipe()
        fds = [w] + [os.open("/dev/null", os.O_RDWR) for _ in range(n_fds - 1)]
        socket.send_fds(self.ctl, [text], fds if n_fds else [])
        for fd in fds:
            os.close(fd)
        got = self.reply()
        # The clone's copy of the write end is gone with it.
        with os.fdopen(r) as status:
            self.assertTrue(select.select([status], [], [], HANG)[0], "the clone lives on")
            return got, status.read()

    def test_requests_the_clone_cannot_take_get_an_error(self):
        fds_before = len(os.listdir("/proc/%d/fd" % self.proc.pid))
        got, status = self.ask(b"not json", 5)
        self.assertEqual(got, {"error": "bad session configuration"})
        self.assertIn("bad sandbox configuration", status)
        got, _ = self.ask(b"{}", 2)
        self.assertEqual(got, {"error": "spawn needs 5 to 32 fds, got 2"})
        got, _ = self.ask(b"{}", 0)
        self.assertEqual(got, {"error": "spawn needs 5 to 32 fds, got 0"})
        cfg = {"root_dir": "/", "workspace": "/", "argv": ["python3"], "extra_fds": 2}
        got, _ = self.ask(json.dumps(cfg).encode(), 5)
        self.assertEqual(got, {"error": "5 fds do not fit the configuration"})
        # A request whose parse takes more than the clone's mapping for it (jansson's values
        # of 200000 strings, ~13 MB) goes on in malloc, and is answered the same way.
        big = json.dumps(dict(cfg, unused=["a"] * 200000), separators=(",", ":")).encode()
        self.ctl.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        got, _ = self.ask(big, 5)
        self.assertEqual(got, {"error": "5 fds do not fit the configuration"})
        # The template holds none of the fds that came with them, made no session, and
        # stops when the channel closes.
        self.assertEqual(len(os.listdir("/proc/%d/fd" % self.proc.pid)), fds_before)
        self.ctl.shutdown(socket.SHUT_RDWR)
        self.assertEqual(self.proc.wait(HANG), 0)


class FreshSessionsTest(RuncellTestCase):
    """serve --no-template: each session starts its own interpreter, with its own hash secret,
    address layout and stack canary."""

    def test_no_template_sessions_differ_in_hash_secret_layout_and_canary(self):
        with Server("--pool", "0", "--no-template") as srv:
            a, b = (draws(srv, srv.create_session(), LAYOUT) for _ in range(2))
            for name in a:
                self.assertNotEqual(a[name], b[name], name)
            first = draws(srv, srv.create_session(), DRAWS)
            self.assertNotEqual(first, draws(srv, srv.create_session(), DRAWS))
            self.assertNotIn("template ready", srv.log())


if __name__ == "__main__":
    unittest.main()
