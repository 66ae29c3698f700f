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
