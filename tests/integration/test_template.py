"""test_template - the template and the pool of ready sessions behind `runcell serve`
(docs/ARCHITECTURE.md "The template"): the template holds none of the server's secrets,
nothing one session did is seen by the next one cloned from the same template, a killed
template is replaced and its sessions live on, a changed kernel or helper retires the
template for a new one, and the pool refills after it hands a session out.

The template is used only as root (it maps every sandbox's ids) with cgroups; elsewhere
these tests skip. Timeouts below only stop hangs.
"""
import os
import re
import shutil
import signal
import tempfile
import time
import unittest

from rctest import HANG, RUNCELL, RuncellTestCase, Server, is_root, wait_until

SECRET_KEY = "sk-rctest-%s" % os.urandom(12).hex()
SECRET_TOKEN = "rctest-secret-token-%s" % os.urandom(12).hex()
PRELOADED = "import sys\nsorted(m for m in ('numpy', 'pandas', 'matplotlib') if m in sys.modules)"


def children_of():
    """{ppid: [pid, ...]} over every live process."""
    tree = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            tree.setdefault(int(fields[1]), []).append(int(d))
    return tree


def descendants(pid):
    tree, out, todo = children_of(), [], [pid]
    while todo:
        for c in tree.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


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
        if not wait_until(lambda: templates_of(srv), timeout=HANG):
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
            kernels = kernels_of(srv)
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


if __name__ == "__main__":
    unittest.main()
