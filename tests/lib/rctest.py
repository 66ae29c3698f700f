"""rctest - shared helpers for runcell's integration and security tests (stdlib only).

Tests drive the real binary. RUNCELL_BIN names it; the default is build/src/runcell.
"""
import base64
import hashlib
import json
import os
import struct
import subprocess
import tempfile
import unittest
import zipfile

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


def run_cells(*codes, opts=(), timeout=180, env=None):
    """Runs the codes as the cells of one session (`runcell run --json OPTS -c C1 -c C2 ...`).
    Returns (records, completed process): one record per cell that ran, parsed from stdout,
    which must be valid UTF-8. The process's stdout and stderr are kept as str."""
    args = [RUNCELL, "run", "--json", *opts]
    for code in codes:
        args += ["-c", code]
    e = dict(os.environ)
    if env:
        e.update(env)
    p = subprocess.run(args, capture_output=True, timeout=timeout, env=e)
    out = p.stdout.decode("utf-8")  # strict: the records must be valid UTF-8
    p.stdout, p.stderr = out, p.stderr.decode("utf-8", "replace")
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return records, p


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


class RuncellTestCase(unittest.TestCase):
    maxDiff = 4000

    def assertStatus(self, rec, status, msg=None):
        self.assertEqual(rec["status"], status,
                         msg or "record: %s" % json.dumps(rec)[:2000])


# ---- servers a test starts on 127.0.0.1 (egress tests) ----

class HttpServer:
    """A static file server on 127.0.0.1 (a free port) serving directory `root`, in a thread
    of the test process. `requests` lists the paths asked for. Use as a context manager."""

    def __init__(self, root):
        import functools
        import http.server
        import threading
        seen = self.requests = []

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args):
                seen.append(self.path)

        self.httpd = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(Handler, directory=root))
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


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
        import socket
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
        deadline = time.time() + 30
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
            with opener.open(req, timeout=timeout) as r:
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
                self.proc.wait(timeout=30)
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

import signal
import socket
import time
import urllib.error
import urllib.request

S3_DIR = os.path.join(ROOT, "tests", "s3")


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
