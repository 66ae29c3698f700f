"""rctest - shared helpers for runcell's integration and security tests (stdlib only).

Tests drive the real binary. RUNCELL_BIN names it; the default is build/src/runcell.
"""
import atexit
import base64
import hashlib
import http.client
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNCELL = os.environ.get("RUNCELL_BIN", os.path.join(ROOT, "build", "src", "runcell"))
PY = "/usr/bin/python3"
# RUNCELL_TEST_SLOW: how many times slower than a normal host this one is (the VM stage
# sets 20 under QEMU's TCG). It multiplies every timeout the helpers apply, which only ever
# catch hangs; it never turns an event wait into a sleep.
SLOW = max(1.0, float(os.environ.get("RUNCELL_TEST_SLOW", "1") or 1))
HANG = 120 * SLOW  # seconds before something that should end counts as hung


def slow(seconds):
    """A hang timeout of `seconds` on a normal host, scaled by RUNCELL_TEST_SLOW."""
    return seconds * SLOW


def slow_args(args):
    """runcell's arguments with, on a slow host, the default cell timeout of `runcell run`
    (60 s, there to stop runaway code) scaled too; a test that sets --timeout keeps it."""
    args = list(args)
    if SLOW > 1 and args[:1] == ["run"] and "--timeout" not in args:
        args[1:1] = ["--timeout", str(int(60 * SLOW))]
    return args


def runcell(*args, input=None, timeout=180, env=None, cwd=None):
    """Runs `runcell ARGS...`; returns the CompletedProcess (text mode, output captured)."""
    e = dict(os.environ)
    if env:
        e.update(env)
    return subprocess.run([RUNCELL, *slow_args(args)], input=input, capture_output=True, text=True,
                          timeout=slow(timeout), env=e, cwd=cwd)


def run_json(code, *opts, lang="python", timeout=180, **kw):
    """Runs code with --json; returns (record, completed process)."""
    p = runcell("run", "--json", "--lang", lang, *opts, "-c", code, timeout=timeout, **kw)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if not lines:
        raise AssertionError("no JSON record; exit %d, stderr: %s" % (p.returncode, p.stderr))
    return json.loads(lines[-1]), p


def run_cells(*codes, opts=(), timeout=180, env=None):
    """Runs the codes as the cells of one session (`runcell run --json OPTS -c C1 -c C2 ...`).
    Returns (records, completed process): one record per cell that ran, parsed from stdout,
    which must be valid UTF-8. The process's stdout and stderr are kept as str."""
    args = [RUNCELL, *slow_args(["run", "--json", *opts])]
    for code in codes:
        args += ["-c", code]
    e = dict(os.environ)
    if env:
        e.update(env)
    p = subprocess.run(args, capture_output=True, timeout=slow(timeout), env=e)
    out = p.stdout.decode("utf-8")  # strict: the records must be valid UTF-8
    p.stdout, p.stderr = out, p.stderr.decode("utf-8", "replace")
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return records, p


# A fork bomb for a cell (see fork_probe).
_FORK_PROBE = """
import errno, json, os, sys, time
n, err = 0, None
while n < %(limit)d:
    try:
        pid = os.fork()
    except OSError as e:
        err = errno.errorcode[e.errno]
        break
    if pid == 0:
        time.sleep(%(hold)d)
        os._exit(0)
    n += 1
sys.stdout.flush()
print("\\n" + json.dumps({"forks": n, "error": err}), flush=True)
"""


def fork_probe(limit, hold=60):
    """Code for a cell that forks children sleeping `hold` seconds until a fork fails (or
    `limit` forks succeed), then prints, as its last stdout line, a JSON object: how many it
    made ("forks") and the errno name of the failure ("error"). Self-contained, so the
    security suite and the VM stage run the same bomb."""
    return _FORK_PROBE % {"limit": limit, "hold": hold}


def png_size(data):
    """(width, height) of PNG bytes, from the IHDR chunk; raises ValueError if not a PNG."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG: starts with %r" % data[:8])
    length, kind, width, height = struct.unpack(">I4sII", data[8:24])
    if kind != b"IHDR" or length != 13:
        raise ValueError("PNG without a leading IHDR chunk")
    return width, height


def make_wheel(directory, name, version, modules):
    """Writes a minimal pure-Python wheel (METADATA, WHEEL, RECORD) holding modules
    {relative path: source} into directory; returns its path."""
    dist = "%s-%s.dist-info" % (name, version)
    files = dict(modules)
    files[dist + "/METADATA"] = "Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (name, version)
    files[dist + "/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: rctest\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n")

    def digest(text):
        raw = hashlib.sha256(text.encode()).digest()
        return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    record = "".join("%s,%s,%d\n" % (path, digest(text), len(text.encode()))
                     for path, text in files.items())
    files[dist + "/RECORD"] = record + dist + "/RECORD,,\n"
    path = os.path.join(directory, "%s-%s-py3-none-any.whl" % (name, version))
    with zipfile.ZipFile(path, "w") as z:
        for member, text in files.items():
            z.writestr(member, text)
    return path


def is_root():
    return os.geteuid() == 0


class TempDir:
    """A temporary directory usable by an unprivileged uid too (mode 0755)."""

    def __enter__(self):
        self.path = tempfile.mkdtemp(prefix="runcell-test-")
        os.chmod(self.path, 0o755)
        return self.path

    def __exit__(self, *exc):
        subprocess.run(["rm", "-rf", self.path])


def reachable_build(runcell=RUNCELL):
    """A copy of runcell with what it runs beside it (runcell-full, the sandbox helper, the
    kernel's directory) in a new directory every user can search and read, for tests that
    run it as another uid: a clone or a build in a 0700 directory (one `mktemp -d` made) is
    out of that uid's reach. Returns (the directory, the copy's runcell); the caller removes
    the directory."""
    src = os.path.dirname(os.path.realpath(runcell))
    top = tempfile.mkdtemp(prefix="runcell-reachable-")
    for name in ("runcell", "runcell-full", "runcell-sandbox"):
        shutil.copy2(os.path.join(src, name), top)
    shutil.copytree(os.path.join(src, "kernel"), os.path.join(top, "kernel"))
    subprocess.run(["chmod", "-R", "a+rX", top], check=True)
    return top, os.path.join(top, "runcell")


_reachable = {}


def reachable_runcell():
    """reachable_build's copy of RUNCELL, made once per test process and removed as it
    exits: for a module whose every run as another uid can share it."""
    if not _reachable:
        _reachable["dir"], _reachable["runcell"] = reachable_build(RUNCELL)
        atexit.register(shutil.rmtree, _reachable["dir"], True)
    return _reachable["runcell"]


class RuncellTestCase(unittest.TestCase):
    maxDiff = 4000

    def assertStatus(self, rec, status, msg=None):
        self.assertEqual(rec["status"], status,
                         msg or "record: %s" % json.dumps(rec)[:2000])


class CellsCase(RuncellTestCase):
    """Cells of one `runcell run --json` session; lang_opts go before each test's options
    (("--lang", "bash") for a bash module)."""
    lang_opts = ()

    def cells(self, *codes, opts=(), expect_exit=0, n=None, timeout=180):
        """Runs the cells and checks the exit status and the number of records (default:
        one per cell); returns the records."""
        recs, p = run_cells(*codes, opts=tuple(self.lang_opts) + tuple(opts), timeout=timeout)
        self.assertEqual(p.returncode, expect_exit,
                         "exit %d, stderr: %s\nrecords: %s"
                         % (p.returncode, p.stderr, json.dumps(recs)[:3000]))
        self.assertEqual(len(recs), len(codes) if n is None else n,
                         "records: %s" % json.dumps(recs)[:3000])
        return recs

    def assertOk(self, rec, stdout=None):
        """rec ran to its end without an error, its session kept (and printed stdout)."""
        self.assertStatus(rec, "ok")
        self.assertIsNone(rec["error"])
        self.assertEqual(rec["state"], "kept")
        if stdout is not None:
            self.assertEqual(rec["stdout"], stdout)

    def plain(self, rec):
        """The text/plain of each result of rec."""
        return [r["text/plain"] for r in rec["results"]]


# ---- servers a test starts on 127.0.0.1 (egress tests) ----

class LocalHttpServer:
    """An http.server on 127.0.0.1 (a free port) in a thread of the test process, for the
    handler class given; a context manager that shuts it down on exit."""

    def __init__(self, handler):
        import http.server
        import threading
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


class HttpServer(LocalHttpServer):
    """A static file server serving directory `root`. `requests` lists the paths asked for."""

    def __init__(self, root):
        import functools
        import http.server
        seen = self.requests = []

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args):
                seen.append(self.path)

        super().__init__(functools.partial(Handler, directory=root))


def tiny_index(root, name="tinypkg", version="1.0", value=42):
    """Writes a PEP 503 "simple" index under root/simple with one pure-Python wheel of
    `name` whose module has VALUE = value. Returns the wheel's file name."""
    import base64
    import hashlib
    import zipfile
    wheel = "%s-%s-py3-none-any.whl" % (name, version)
    info = "%s-%s.dist-info" % (name, version)
    files = {
        "%s/__init__.py" % name: "VALUE = %d\n" % value,
        info + "/METADATA": "Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (name, version),
        info + "/WHEEL": "Wheel-Version: 1.0\nGenerator: rctest\nRoot-Is-Purelib: true\n"
                         "Tag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append("%s,sha256=%s,%d" % (path, digest.decode(), len(text.encode())))
    record.append(info + "/RECORD,,")
    files[info + "/RECORD"] = "\n".join(record) + "\n"
    pkg_dir = os.path.join(root, "simple", name)
    os.makedirs(pkg_dir, exist_ok=True)
    with zipfile.ZipFile(os.path.join(pkg_dir, wheel), "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    with open(os.path.join(root, "simple", "index.html"), "w") as f:
        f.write('<html><body><a href="%s/">%s</a></body></html>\n' % (name, name))
    with open(os.path.join(pkg_dir, "index.html"), "w") as f:
        f.write('<html><body><a href="%s">%s</a></body></html>\n' % (wheel, wheel))
    return wheel


class ApiServer:
    """`runcell serve` on a free 127.0.0.1 port with a fresh data directory; call(method,
    path, body) returns (status, parsed JSON or text). Extra serve options via args."""

    TOKEN = "rctest-token-0123456789abcdef"

    def __init__(self, *args, env=None):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.data = tempfile.mkdtemp(prefix="runcell-serve-")
        e = dict(os.environ, **(env or {}))
        self.log = open(os.path.join(self.data, "log"), "w+")
        self.proc = subprocess.Popen(
            [RUNCELL, "serve", "--listen", "127.0.0.1:%d" % self.port, "--data", self.data,
             "--token", self.TOKEN, *args], stdout=self.log, stderr=subprocess.STDOUT, env=e)
        import time
        deadline = time.time() + slow(30)
        while time.time() < deadline:
            try:
                if self.call("GET", "/healthz")[0] == 200:
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise AssertionError("runcell serve did not come up: " + self.output())

    def call(self, method, path, body=None, timeout=180):
        import urllib.error
        import urllib.request
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path), data=data,
                                     method=method,
                                     headers={"Authorization": "Bearer " + self.TOKEN})
        # The test's own requests never go through a proxy a developer may have set.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(req, timeout=slow(timeout)) as r:
                status, text = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def output(self):
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=slow(30))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        subprocess.run(["rm", "-rf", self.data])


# Code for probes: fetch(url) through the sandbox's proxy variables, as "STATUS BODY" or
# "error REASON".
FETCH = """
import urllib.request, urllib.error
def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return "%d %s" % (r.status, r.read().decode())
    except urllib.error.HTTPError as e:
        return "%d %s" % (e.code, e.read().decode())
    except urllib.error.URLError as e:
        return "error %s" % e.reason
"""


def serve_files(test, files):
    """Writes files ({name: text}) to a fresh directory and serves it on 127.0.0.1 for the
    rest of the test; returns (HttpServer, directory)."""
    tmp = TempDir()
    root = tmp.__enter__()
    test.addCleanup(tmp.__exit__)
    for name, text in files.items():
        with open(os.path.join(root, name), "w") as f:
            f.write(text)
    srv = HttpServer(root).__enter__()
    test.addCleanup(srv.__exit__)
    return srv, root


# ---- servers the tests start on 127.0.0.1: runcell serve, and an S3-compatible store ----


S3_DIR = os.path.join(ROOT, "tests", "s3")


# ---- what a sandbox leaves on the host: cgroups, mounts, processes ----

def _own_cgroup(controller):
    """Our path in the hierarchy listing controller ("" = the v2 line), as cgroup.c reads it."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            num, ctrls, path = line.rstrip("\n").split(":", 2)
            if controller == "" and num == "0" and ctrls == "":
                return path
            if controller and controller in ctrls.split(","):
                return path
    return None


def _cgroup_mount(controller):
    """Mount point of the v1 hierarchy carrying controller, or of cgroup2 when None."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype, _source, opts = right.split()[:3]
            mnt = left.split()[4]
            if controller is None and fstype == "cgroup2":
                return mnt
            if controller and fstype == "cgroup" and controller in opts.split(","):
                return mnt
    return None


def cgroup_bases():
    """The "runcell" base cgroups a runcell started from this process uses (existing ones)."""
    bases = []
    v2 = _cgroup_mount(None)
    own = _own_cgroup("")
    if v2 == "/sys/fs/cgroup" and own is not None:
        bases.append(v2 + (own if own != "/" else "") + "/runcell")
    for ctrl in ("memory", "pids", "cpu", "cpuacct"):
        mnt, own = _cgroup_mount(ctrl), _own_cgroup(ctrl)
        if mnt and own is not None:
            bases.append(mnt + (own if own != "/" else "") + "/runcell")
    return [b for b in bases if os.path.isdir(b)]


def cgroups_expected():
    """(True, why) when this host should give runcell cgroups (then a degraded run is a bug
    a test must fail on, never skip): as root, a pure cgroup v2 hierarchy whose root lists
    the memory and pids controllers, or writable v1 memory and pids hierarchies; as another
    user, a v2 cgroup of ours that is delegated to us (writable cgroup.procs and
    cgroup.subtree_control). (False, why) otherwise, for the skip message."""
    v2 = _cgroup_mount(None)
    ctrls = ""
    if v2:
        try:
            with open(os.path.join(v2, "cgroup.controllers")) as f:
                ctrls = f.read().split()
        except OSError:
            pass
    if v2 and "memory" in ctrls and "pids" in ctrls:
        if os.geteuid() == 0:
            return True, "root on a cgroup v2 host with memory and pids at %s" % v2
        own = _own_cgroup("")
        d = v2 + (own if own and own != "/" else "")
        if all(os.access(os.path.join(d, f), os.W_OK)
               for f in ("cgroup.procs", "cgroup.subtree_control")):
            return True, "cgroup %s is delegated to uid %d" % (own, os.geteuid())
        return False, ("not root, and cgroup %s is not delegated to uid %d (nothing to "
                       "create sandbox cgroups in)" % (own, os.geteuid()))
    if os.geteuid() != 0:
        return False, "not root on a host whose controllers are on cgroup v1 (not delegable)"
    for ctrl in ("memory", "pids"):
        mnt = _cgroup_mount(ctrl)
        if not mnt or not os.access(mnt, os.W_OK):
            return False, "root, but the cgroup v1 %s hierarchy is missing or read-only" % ctrl
    return True, "root with writable cgroup v1 memory and pids hierarchies"


def cgroups_of(pid):
    """Sandbox cgroups named after the runcell process pid ("<pid>-<start>-<seq>")."""
    found = []
    for base in cgroup_bases():
        found += [os.path.join(base, n) for n in os.listdir(base) if n.startswith("%d-" % pid)]
    return found


def mounts_below(prefix):
    prefix = prefix.rstrip("/") + "/"
    with open("/proc/self/mountinfo") as f:
        return [l.split()[4] for l in f if l.split()[4].startswith(prefix)]


def descendants(pid):
    """The live processes below pid (children, their children, ...)."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                pass
    below, grew = set(), True
    while grew:
        more = {p for p, pp in parent.items() if (pp == pid or pp in below) and p not in below}
        below |= more
        grew = bool(more)
    return below


def procs_with(token, but=()):
    """Live (non-zombie) processes whose command line holds token, except the pids in but
    (runcell's own command line holds the code too)."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) in but:
            continue
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                cmd = f.read()
            with open("/proc/%s/stat" % d) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if token.encode() in cmd and state != "Z":
            pids.append(int(d))
    return pids


def read_line(pipe, timeout=120):
    """The first line from a Popen pipe, read from its fd so that a hang ends in a failure
    rather than a stuck test. Returns (line, bytes read past it)."""
    fd, got = pipe.fileno(), b""
    timeout = slow(timeout)
    end = time.monotonic() + timeout
    while b"\n" not in got:
        left = end - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise AssertionError("no line within %d s; got %r" % (timeout, got))
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        got += chunk
    line, nl, rest = got.partition(b"\n")
    return line + nl, rest


def wait_until(cond, timeout=120):
    end = time.monotonic() + slow(timeout)
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def run_dir_entries(run_dir):
    """What a runcell leaves in its run dir besides the uid slot locks."""
    return sorted(n for n in os.listdir(run_dir) if n != "uids")


# ---- `runcell serve` on loopback, for the HTTP suites ----

TOKEN = "rctest-token-0123456789abcdef0123"


def free_port():
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServeProcess:
    """`runcell serve ARGS` on a free loopback port with its own data directory and token;
    a context manager that waits for /healthz and stops the server with SIGTERM."""

    def __init__(self, *args, token="runcell-test-token-0123456789", timeout=60):
        self.args = args
        self.token = token
        self.timeout = slow(timeout)
        self.port = free_port()

    def __enter__(self):
        import time
        import urllib.request
        self.data = tempfile.mkdtemp(prefix="runcell-serve-")
        self.log = open(os.path.join(self.data, "log"), "w+")
        self.proc = subprocess.Popen(
            [RUNCELL, "serve", "--listen", "127.0.0.1:%d" % self.port, "--data", self.data,
             "--token", self.token, *self.args], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + self.timeout
        while True:
            try:
                urllib.request.urlopen("http://127.0.0.1:%d/healthz" % self.port, timeout=5)
                return self
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    out = self.output()
                    self.__exit__()
                    raise AssertionError("runcell serve did not start: %s" % out)
                time.sleep(0.05)

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def __exit__(self, *exc):
        """Stops the server; self.status is its exit status (0 after a clean shutdown)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(self.timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.status = self.proc.returncode
        self.last_output = self.output()
        self.log.close()
        subprocess.run(["rm", "-rf", self.data])


class RestartableServer:
    """`runcell serve` on 127.0.0.1 and a free port, with the given data directory.

    request() returns (status, parsed JSON body); the server's log is kept in DATA/../serve.log
    (see log())."""

    TOKEN = "test-token-0123456789abcdef0123456789"

    def __init__(self, data_dir, *args, env=None):
        self.data_dir = data_dir
        self.args = list(args)
        self.env = dict(os.environ, RUNCELL_LOG="info", **(env or {}))
        self.port = None
        self.proc = None
        self.log_path = data_dir.rstrip("/") + ".serve.log"

    def start(self, timeout=60):
        timeout = slow(timeout)
        self.port = self.port or free_port()
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [RUNCELL, "serve", "--listen", "127.0.0.1:%d" % self.port, "--data", self.data_dir,
             "--token", self.TOKEN, *self.args],
            stdout=self._log, stderr=self._log, env=self.env)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("runcell serve exited with %d:\n%s"
                                     % (self.proc.returncode, self.log()))
            try:
                if self.request("GET", "/healthz", timeout=5)[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError("runcell serve did not answer within %d s:\n%s"
                             % (timeout, self.log()))

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def request(self, method, path, body=None, timeout=180, raw=None, headers=None):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None
                                            else None)
        h = {"Authorization": "Bearer " + self.TOKEN}
        h.update(headers or {})
        rq = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path), data=data,
                                    method=method, headers=h)
        try:
            with urllib.request.urlopen(rq, timeout=slow(timeout)) as resp:
                status, text = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read()
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def stop(self, timeout=60):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(slow(timeout))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._close_log()

    def kill9(self):
        self.proc.kill()
        self.proc.wait()
        self._close_log()

    def _close_log(self):
        if getattr(self, "_log", None):
            self._log.close()
            self._log = None


class Response:
    """An HTTP response read whole: status, headers (an http.client.HTTPMessage), body."""

    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        return json.loads(self.body)

    @property
    def error_code(self):
        """The JSON error's code ("not_found", ...), or None."""
        try:
            return self.json()["error"]["code"]
        except (ValueError, KeyError, TypeError):
            return None

    def __repr__(self):
        return "<HTTP %d %r>" % (self.status, self.body[:500])


class Server:
    """`runcell serve` on a free 127.0.0.1 port, with its own data and run directories (the
    run directory holds its sandboxes' workspaces), stopped and removed on exit.

        with Server("--max-sessions", "2") as srv:
            sid = srv.create_session()
            rec = srv.execute(sid, "print(1)")
    """

    def __init__(self, *args, token=TOKEN, env=None):
        self.args, self.token, self.env = list(args), token, env or {}
        self.proc = self.tmp = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()

    def start(self):
        try:
            return self._start()
        except BaseException:
            self.close()  # a server started before the failure is stopped, not leaked
            raise

    def _start(self):
        self.tmp = tempfile.mkdtemp(prefix="runcell-serve-")
        os.chmod(self.tmp, 0o755)
        self.data_dir = os.path.join(self.tmp, "data")
        self.run_dir = os.path.join(self.tmp, "run")
        os.mkdir(self.run_dir, 0o755)
        self.log_path = os.path.join(self.tmp, "serve.log")
        env = dict(os.environ, RUNCELL_RUNDIR=self.run_dir)
        env.pop("RUNCELL_TOKEN", None)
        env.update(self.env)
        for _ in range(5):  # another process may take the free port before we bind it
            self.port = free_port()
            argv = [RUNCELL, "serve", "--listen", "127.0.0.1:%d" % self.port,
                    "--data", self.data_dir] + (["--token", self.token] if self.token else [])
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(argv + self.args, env=env, stdin=subprocess.DEVNULL,
                                             stdout=log, stderr=log)
            if self._wait_ready():
                break
            if "cannot listen" not in self.log():
                raise AssertionError("runcell serve did not start:\n" + self.log())
        else:
            raise AssertionError("runcell serve found no free port:\n" + self.log())
        if not self.token and env.get("RUNCELL_TOKEN"):
            self.token = env["RUNCELL_TOKEN"]
        elif not self.token:
            with open(os.path.join(self.data_dir, "token")) as f:
                self.token = f.read().strip()
        return self

    def _wait_ready(self):
        end = time.monotonic() + HANG
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                return False
            try:
                if self.request("GET", "/healthz", timeout=5).status == 200:
                    return True
            except OSError:
                time.sleep(0.02)
        raise AssertionError("runcell serve not ready within %d s:\n%s" % (HANG, self.log()))

    @property
    def pid(self):
        return self.proc.pid

    @property
    def base_url(self):
        return "http://127.0.0.1:%d" % self.port

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def connection(self, timeout=HANG):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def headers(self, extra=None, token=None):
        """Request headers with the bearer token (token=False: none; a string: that one)."""
        h = {}
        t = self.token if token is None else token
        if t:
            h["Authorization"] = "Bearer " + t
        h.update(extra or {})
        return h

    def request(self, method, path, body=None, headers=None, token=None, timeout=HANG):
        """One request on a fresh connection; body: a dict/list (sent as JSON), bytes, str or
        a file object. Returns a Response."""
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        conn = self.connection(timeout)
        try:
            conn.request(method, path, body=body, headers=self.headers(headers, token))
            r = conn.getresponse()
            return Response(r.status, r.headers, r.read())
        finally:
            conn.close()

    def ok(self, method, path, body=None, status=200, **kw):
        """A request that must answer status; returns its JSON."""
        r = self.request(method, path, body, **kw)
        if r.status != status:
            raise AssertionError("%s %s: expected %d, got %r" % (method, path, status, r))
        return r.json()

    def create_session(self, **opts):
        return self.ok("POST", "/v1/sessions", opts, status=201)["id"]

    def e2b_box(self, test, path="/sandboxes"):
        """An E2B sandbox made on the E2B routes (path: /sandboxes or /v2/sandboxes), killed
        when test ends: the headers its envd routes take."""
        key = {"X-API-KEY": self.token}
        r = self.request("POST", path, {}, headers=key, token=False)
        test.assertEqual(r.status, 201, r)
        b = r.json()
        test.addCleanup(self.request, "DELETE", "/sandboxes/" + b["sandboxID"], headers=key,
                        token=False)
        return {"E2b-Sandbox-Id": b["sandboxID"], "X-Access-Token": b["envdAccessToken"]}

    def execute(self, sid, code, **fields):
        return self.ok("POST", "/v1/sessions/%s/execute" % sid, dict(fields, code=code))

    def stream(self, sid, code, **fields):
        """POST .../execute asking for NDJSON: an EventStream of its events as they come."""
        conn = self.connection()
        conn.request("POST", "/v1/sessions/%s/execute" % sid,
                     body=json.dumps(dict(fields, code=code)),
                     headers=self.headers({"Accept": "application/x-ndjson"}))
        return EventStream(conn, conn.getresponse())

    def stop(self, sig=None, timeout=HANG):
        """Signals the server (SIGTERM by default) and waits; returns its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig or signal.SIGTERM)
        return self.proc.wait(timeout)

    def close(self):
        if self.proc and self.proc.poll() is None:
            try:
                self.stop(timeout=HANG)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(HANG)
        if self.proc and self.proc.returncode:
            # What a failing server said is the first thing to read about the failure.
            sys.stderr.write("runcell serve exited with %d; its log ends:\n%s\n"
                             % (self.proc.returncode, self.log()[-6000:]))
        if not self.tmp:
            return
        for m in reversed(mounts_below(self.run_dir)):  # what a killed server left
            subprocess.run(["umount", "-l", m])
        if not os.environ.get("RCTEST_KEEP"):
            subprocess.run(["rm", "-rf", "--one-file-system", self.tmp])


# Writes one frame of its own on the kernel channel (the fd behind sys.stdout's frames), as
# hostile code can: the daemon must treat it as it treats the kernel's. Cells start with it.
FRAME_WRITER = r'''
import os, struct, sys
CHAN = sys.stdout._channel.fd
def send_frame(payload, kind=b"M"):
    data = struct.pack(">I", len(payload)) + kind + payload
    view = memoryview(data)
    while view:
        view = view[os.write(CHAN, view):]
'''


class EventStream:
    """The events of a streamed execution (one JSON object a line), read as they come. The
    first line (type "start", with the execution's id) is read at once, into self.start;
    each event after it carries a "seq" one above the last, which next() and rest() check
    and take off."""

    def __init__(self, conn, resp):
        self.conn, self.resp = conn, resp
        self.start, self.seq = None, 0
        if resp.status == 200:
            self.start = json.loads(resp.readline())
            if self.start.get("type") != "start" or self.start.get("seq") != 0:
                raise AssertionError("the stream did not begin with its start: %r"
                                     % (self.start,))
            self.execution_id = self.start["execution_id"]

    def _event(self, line):
        event = json.loads(line)
        if event.pop("seq", None) != self.seq + 1:
            raise AssertionError("event out of sequence after %d: %r" % (self.seq, line))
        self.seq += 1
        return event

    def next(self):
        """The next event (waits for it)."""
        return self._event(self.resp.readline())

    def rest(self):
        """Every event to the end of the stream (the last is "done"); closes the connection."""
        try:
            return [self._event(line) for line in self.resp.read().splitlines()]
        finally:
            self.conn.close()


class ServerCase(RuncellTestCase):
    """Tests that share one `runcell serve server_args...` (self.srv), started once for
    their class."""
    server_args = ()

    @classmethod
    def setUpClass(cls):
        cls.srv = Server(*cls.server_args).start()

    @classmethod
    def tearDownClass(cls):
        cls.srv.close()


def s3_server_missing():
    """Why the S3-compatible test server cannot run here, or None. With
    RUNCELL_REQUIRE_TEST_SERVERS set (CI), None: its tests run, and fail if it is missing."""
    if os.environ.get("RUNCELL_REQUIRE_TEST_SERVERS"):
        return None
    if not shutil_which("node"):
        return "node is not installed (scripts/install-deps installs it)"
    if not os.path.isdir(os.path.join(S3_DIR, "node_modules", "s3rver")):
        return "s3rver is not installed in tests/s3 (run scripts/install-test-servers)"
    return None


MCP_CLIENTS_DIR = os.path.join(ROOT, "tests", "mcp-clients")
MCP_CLIENT_PACKAGES = ("@modelcontextprotocol/sdk", "@modelcontextprotocol/inspector-cli",
                       "@modelcontextprotocol/client", "@modelcontextprotocol/conformance")


def mcp_clients_missing():
    """Why the MCP clients from npm (tests/mcp-clients) cannot be driven here, or None.
    A reason to skip only when they are absent and scripts/install-test-servers never tried
    to install them; after it tried (or with RUNCELL_REQUIRE_TEST_SERVERS set, as in CI),
    None: their tests run, and fail if the packages are missing."""
    tried = os.path.exists(os.path.join(MCP_CLIENTS_DIR, ".install-tried"))
    if os.environ.get("RUNCELL_REQUIRE_TEST_SERVERS") or tried:
        return None
    if not shutil_which("node"):
        return "node is not installed (scripts/install-deps installs it)"
    for pkg in MCP_CLIENT_PACKAGES:
        if not os.path.isfile(os.path.join(MCP_CLIENTS_DIR, "node_modules", pkg,
                                           "package.json")):
            return ("%s is not installed in tests/mcp-clients (run scripts/install-test-servers,"
                    " which make test runs)" % pkg)
    return None


def shutil_which(name):
    return shutil.which(name)


class S3Server:
    """tests/s3/server.js (s3rver with SigV4 checked) on 127.0.0.1, storing in directory."""

    ACCESS_KEY = "S3RVER"
    SECRET_KEY = "S3RVER"

    def __init__(self, directory, bucket="runcell"):
        self.directory = directory
        self.bucket = bucket
        self.port = free_port()
        self.proc = None

    @property
    def endpoint(self):
        return "http://127.0.0.1:%d" % self.port

    def start(self, timeout=30):
        self.proc = subprocess.Popen(
            ["node", os.path.join(S3_DIR, "server.js"), self.directory, str(self.port),
             self.bucket, self.ACCESS_KEY, self.SECRET_KEY],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        import select
        deadline = time.time() + timeout
        while time.time() < deadline:
            r, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if r:
                line = self.proc.stdout.readline()
                if line.startswith("listening"):
                    return self
                if not line:
                    break
        self.stop()
        raise AssertionError("the S3 test server did not start")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc:
            self.proc.stdout.close()
        self.proc = None

    def store_args(self, prefix="runcell-test"):
        return ["--store", "s3://%s/%s" % (self.bucket, prefix), "--s3-endpoint", self.endpoint,
                "--s3-access-key", self.ACCESS_KEY, "--s3-secret-key", self.SECRET_KEY]
