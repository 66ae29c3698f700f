"""rctest - shared helpers for runcell's integration and security tests (stdlib only).

Tests drive the real binary. RUNCELL_BIN names it; the default is build/src/runcell.
"""
import http.client
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNCELL = os.environ.get("RUNCELL_BIN", os.path.join(ROOT, "build", "src", "runcell"))
PY = "/usr/bin/python3"
HANG = 120  # seconds before something that should end counts as hung


def runcell(*args, input=None, timeout=180, env=None, cwd=None):
    """Runs `runcell ARGS...`; returns the CompletedProcess (text mode, output captured)."""
    e = dict(os.environ)
    if env:
        e.update(env)
    return subprocess.run([RUNCELL, *args], input=input, capture_output=True, text=True,
                          timeout=timeout, env=e, cwd=cwd)


def run_json(code, *opts, lang="python", timeout=180, **kw):
    """Runs code with --json; returns (record, completed process)."""
    p = runcell("run", "--json", "--lang", lang, *opts, "-c", code, timeout=timeout, **kw)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if not lines:
        raise AssertionError("no JSON record; exit %d, stderr: %s" % (p.returncode, p.stderr))
    return json.loads(lines[-1]), p


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


class RuncellTestCase(unittest.TestCase):
    maxDiff = 4000

    def assertStatus(self, rec, status, msg=None):
        self.assertEqual(rec["status"], status,
                         msg or "record: %s" % json.dumps(rec)[:2000])


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


def read_line(pipe, timeout=HANG):
    """The first line from a Popen pipe, read from its fd so that a hang ends in a failure
    rather than a stuck test. Returns (line, bytes read past it)."""
    fd, got = pipe.fileno(), b""
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


def wait_until(cond, timeout=HANG):
    end = time.monotonic() + timeout
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
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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

    def execute(self, sid, code, **fields):
        return self.ok("POST", "/v1/sessions/%s/execute" % sid, dict(fields, code=code))

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
