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


# ---- servers the tests start on 127.0.0.1: runcell serve, and an S3-compatible store ----

import signal
import socket
import time
import urllib.error
import urllib.request

S3_DIR = os.path.join(ROOT, "tests", "s3")


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
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
            with urllib.request.urlopen(rq, timeout=timeout) as resp:
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
                self.proc.wait(timeout)
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


def s3_server_missing():
    """Why the S3-compatible test server cannot run here, or None."""
    if not shutil_which("node"):
        return "node is not installed (scripts/install-deps installs it)"
    if not os.path.isdir(os.path.join(S3_DIR, "node_modules", "s3rver")):
        return "s3rver is not installed in tests/s3 (run scripts/install-test-servers)"
    return None


def shutil_which(name):
    import shutil
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
