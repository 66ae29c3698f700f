"""rctest - shared helpers for runcell's integration and security tests (stdlib only).

Tests drive the real binary. RUNCELL_BIN names it; the default is build/src/runcell.
"""
import json
import os
import subprocess
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNCELL = os.environ.get("RUNCELL_BIN", os.path.join(ROOT, "build", "src", "runcell"))
PY = "/usr/bin/python3"


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


def free_port():
    """A TCP port free on 127.0.0.1 right now."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServeProcess:
    """`runcell serve ARGS` on a free loopback port with its own data directory and token;
    a context manager that waits for /healthz and stops the server with SIGTERM."""

    def __init__(self, *args, token="runcell-test-token-0123456789", timeout=60):
        self.args = args
        self.token = token
        self.timeout = timeout
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
