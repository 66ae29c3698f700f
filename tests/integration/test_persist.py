"""Persistence and resume: a session's files are written to the store after every execution,
its variables when it is reaped, closed with checkpoint or the server stops; a new session
resumes from what is stored, also after a restart or a kill -9 of the server. Runs `runcell
serve` (and `runcell repl`) against a local-directory store and against a real S3-compatible
server started on 127.0.0.1."""
import glob
import hashlib
import json
import os
import stat
import subprocess
import threading
import time
import unittest

from rctest import RestartableServer as Server
from rctest import RuncellTestCase, S3Server, TempDir, runcell, s3_server_missing, wait_until
from rctest import free_port as rctest_free_port
from scripted_model import ScriptedModel

MAKE_STATE = r'''
import os, math
import numpy as np
from dataclasses import dataclass
x = 41
data = {"a": [1, 2, 3], "b": "text"}
arr = np.arange(10)
def add(v):
    return v + x
class Box:
    def __init__(self, v):
        self.v = v
    def get(self):
        return self.v
class Big(Box):
    def get(self):
        return super().get() * 100
@dataclass
class Point:
    px: int
    py: int = 0
box = Big(3)
pt = Point(1, 2)
double = lambda v: v * 2
fh = open("notes/readme.txt")
gen = (i for i in range(3))
'''

CHECK_STATE = r'''
print(x, data["a"], arr.sum(), add(1), box.get(), isinstance(box, Box), pt, double(21),
      math.floor(2.5), np.pi > 3)
'''
CHECK_OUTPUT = "41 [1, 2, 3] 45 42 300 True Point(px=1, py=2) 42 2 True\n"


def write_files_code():
    return r'''
import os
os.makedirs("notes/deep", exist_ok=True)
open("notes/readme.txt", "w").write("hello")
open("notes/deep/data.bin", "wb").write(bytes(range(256)) * 100)
open("top.csv", "w").write("a,b\n1,2\n")
os.symlink("top.csv", "link.csv")
'''


class PersistCase(RuncellTestCase):
    """A runcell server per test, with a data directory of its own."""

    server_args = ()

    def setUp(self):
        self.tmp = TempDir().__enter__()
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", self.tmp]))
        self.data = os.path.join(self.tmp, "data")
        self.servers = []

    def tearDown(self):
        for s in self.servers:
            s.stop()

    def start_server(self, *args, data=None, env=None):
        srv = Server(data or self.data, *(tuple(self.server_args) + args), env=env).start()
        self.servers.append(srv)
        return srv

    def create(self, srv, status=201, **body):
        st, s = srv.request("POST", "/v1/sessions", body)
        self.assertEqual(st, status, s)
        return s

    def execute(self, srv, sid, code, ok=True):
        st, rec = srv.request("POST", "/v1/sessions/%s/execute" % sid, {"code": code})
        self.assertEqual(st, 200, rec)
        if ok:
            self.assertStatus(rec, "ok")
        return rec

    def wait_for_file(self, srv, sid, path):
        """Waits until the running cell of sid has written path (the event a test needs
        before it acts on a running execution)."""
        def there():
            st, body = srv.request("GET", "/v1/sessions/%s/files" % sid)
            return st == 200 and path in [f["path"] for f in body["files"]]
        self.assertTrue(wait_until(there), "the cell did not write %s" % path)

    def close_checkpoint(self, srv, sid):
        """Closes sid with a checkpoint; returns the response."""
        st, closed = srv.request("DELETE", "/v1/sessions/%s?checkpoint=true" % sid)
        self.assertEqual(st, 200, closed)
        return closed

    def wait_expired(self, srv, sid, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            st, body = srv.request("GET", "/v1/sessions/%s" % sid)
            if st == 404:
                return body
            time.sleep(0.2)
        self.fail("session %s did not expire within %d s" % (sid, timeout))

    def check_files(self, srv, sid):
        rec = self.execute(srv, sid, r'''
import hashlib, os
print(open("notes/readme.txt").read(), hashlib.sha256(open("notes/deep/data.bin","rb").read()).hexdigest(),
      open("top.csv").read().splitlines(), os.readlink("link.csv"), oct(os.stat("top.csv").st_mode & 0o777))
''')
        want = hashlib.sha256(bytes(range(256)) * 100).hexdigest()
        self.assertEqual(rec["stdout"], "hello %s ['a,b', '1,2'] top.csv 0o644\n" % want)


class TestLocalStore(PersistCase):

    def test_files_and_variables_round_trip_through_an_idle_reap(self):
        srv = self.start_server()
        s = self.create(srv, idle_timeout_s=1.5)
        self.assertTrue(s["persist"])
        self.execute(srv, s["id"], write_files_code())
        self.execute(srv, s["id"], MAKE_STATE)
        body = self.wait_expired(srv, s["id"])
        self.assertEqual(body["error"]["code"], "expired")
        self.assertTrue(body["resumable"])
        self.assertIn("resume_from", body["error"]["message"])
        self.assertTrue(body["session"]["variables_stored"])
        ck = body["session"]["checkpoint"]["variables"]
        skipped = {v["name"]: v for v in ck["skipped"]}
        self.assertEqual(set(skipped), {"fh", "gen"})  # listed, not silently dropped
        self.assertIn("TextIOWrapper", skipped["fh"]["reason"])
        self.assertEqual(ck["modules"], {"os": "os", "math": "math", "np": "numpy"})

        r = self.create(srv, resume_from=s["id"])
        self.assertNotEqual(r["id"], s["id"])
        rest = r["restored"]
        self.assertEqual(rest["from"], s["id"])
        self.assertEqual(sorted(rest["files"]),
                         ["link.csv", "notes/deep/data.bin", "notes/readme.txt", "top.csv"])
        self.assertEqual(rest["files_failed"], [])
        self.assertEqual(rest["variables_failed"], [])
        for name in ("x", "data", "arr", "add", "Box", "Big", "Point", "box", "pt", "double"):
            self.assertIn(name, rest["variables"])
        self.assertEqual(sorted(rest["modules"]), ["math", "np", "os"])
        self.assertEqual({v["name"] for v in rest["not_saved"]}, {"fh", "gen"})
        self.assertEqual(self.execute(srv, r["id"], CHECK_STATE)["stdout"], CHECK_OUTPUT)
        self.check_files(srv, r["id"])
        # The options came along.
        self.assertEqual(r["idle_timeout_s"], 1.5)

    def test_kill_9_mid_session_then_restart_and_resume(self):
        srv = self.start_server()
        s = self.create(srv)
        sid = s["id"]
        self.execute(srv, sid, write_files_code())
        self.execute(srv, sid, "open('second.txt', 'w').write('2')\nimport os\nos.remove('top.csv')")
        self.execute(srv, sid, "open('second.txt', 'a').write('2')\nopen('third.txt', 'w').write('3')")
        # Uploads are saved as well, without an execution after them.
        st, up = srv.request("PUT", "/v1/sessions/%s/files/uploaded.txt" % sid, raw=b"up")
        self.assertEqual(st, 201, up)
        self.assertNotIn("persist_error", up)
        # One more execution is running when the server dies; its files may or may not be
        # saved, the completed ones must be.
        def run_until_killed():
            try:
                srv.request("POST", "/v1/sessions/%s/execute" % sid,
                            {"code": "open('partial.txt','w').write('p')\n"
                                     "import time\ntime.sleep(60)"}, timeout=90)
            except OSError:
                pass  # the server died under it, as meant
        running = threading.Thread(target=run_until_killed, daemon=True)
        running.start()
        self.wait_for_file(srv, sid, "partial.txt")  # the kill lands on a running execution
        srv.kill9()
        running.join(30)

        srv2 = self.start_server()
        st, body = srv2.request("GET", "/v1/sessions/%s" % sid)
        self.assertEqual(st, 404, body)
        self.assertEqual(body["session"]["state"], "stopped")
        self.assertTrue(body["resumable"])
        self.assertFalse(body["session"]["variables_stored"])
        st, listing = srv2.request("GET", "/v1/sessions?all=true")
        self.assertIn(sid, [x["id"] for x in listing["stored"]])

        r = self.create(srv2, resume_from=sid)
        files = set(r["restored"]["files"])
        self.assertLessEqual({"notes/readme.txt", "notes/deep/data.bin", "link.csv",
                              "second.txt", "third.txt", "uploaded.txt"}, files)
        self.assertNotIn("top.csv", files)  # deleted by a completed execution
        self.assertIn("no variables were stored", r["restored"]["variables_note"])
        rec = self.execute(srv2, r["id"], "print(open('second.txt').read(), open('third.txt').read(), open('uploaded.txt').read())")
        self.assertEqual(rec["stdout"], "22 3 up\n")

    def test_graceful_restart_keeps_variables(self):
        srv = self.start_server()
        s = self.create(srv)
        self.execute(srv, s["id"], "kept = [1, 2, 3]")
        srv.stop()
        srv2 = self.start_server()
        r = self.create(srv2, resume_from=s["id"])
        self.assertIn("kept", r["restored"]["variables"])
        self.assertEqual(self.execute(srv2, r["id"], "print(sum(kept))")["stdout"], "6\n")

    def test_close_with_checkpoint_and_without(self):
        srv = self.start_server()
        a = self.create(srv)
        self.execute(srv, a["id"], "v = 'kept'\nopen('f.txt', 'w').write('f')")
        closed = self.close_checkpoint(srv, a["id"])
        self.assertIn("v", closed["checkpoint"]["variables"]["saved"])
        self.assertEqual(closed["checkpoint"]["files"], 1)
        st, body = srv.request("GET", "/v1/sessions/%s" % a["id"])
        self.assertEqual((st, body["session"]["state"], body["resumable"]),
                         (404, "checkpointed", True))

        b = self.create(srv)
        self.execute(srv, b["id"], "w = 1\nopen('g.txt', 'w').write('g')")
        st, closed = srv.request("DELETE", "/v1/sessions/%s" % b["id"], {"checkpoint": False})
        self.assertEqual((st, closed["discarded"]), (200, True), closed)
        st, body = srv.request("GET", "/v1/sessions/%s" % b["id"])
        self.assertEqual((st, body["session"]["state"], body["resumable"]), (404, "closed", False))
        self.assertEqual(glob.glob(os.path.join(self.data, "store", "sessions", b["id"], "*")), [])
        st, body = srv.request("POST", "/v1/sessions", {"resume_from": b["id"]})
        self.assertEqual(st, 404, body)
        self.assertIn("nothing of it was kept", body["error"]["message"])

        # A body that is not what DELETE takes is refused, and so is a bad query.
        c = self.create(srv)
        st, body = srv.request("DELETE", "/v1/sessions/%s?checkpoint=maybe" % c["id"])
        self.assertEqual(st, 400, body)
        st, body = srv.request("DELETE", "/v1/sessions/%s" % c["id"], {"checkpoint": "yes"})
        self.assertEqual(st, 400, body)

    def test_checkpoint_of_a_running_cell_interrupts_it_first(self):
        srv = self.start_server()
        s = self.create(srv)
        self.execute(srv, s["id"], "n = 0")
        running = threading.Thread(target=lambda: srv.request(
            "POST", "/v1/sessions/%s/execute" % s["id"],
            {"code": "import time\nwhile True:\n    n += 1\n"
                     "    if n == 1: open('counting', 'w').close()\n    time.sleep(0.01)"}),
            daemon=True)
        running.start()
        self.wait_for_file(srv, s["id"], "counting")  # not a guessed pause: n > 0 now
        closed = self.close_checkpoint(srv, s["id"])
        self.assertIn("n", closed["checkpoint"]["variables"]["saved"])
        running.join(30)
        r = self.create(srv, resume_from=s["id"])
        self.assertGreater(int(self.execute(srv, r["id"], "print(n)")["stdout"]), 0)

    def test_a_resumed_session_keeps_its_network_allowlist(self):
        srv = self.start_server()
        allow = ["127.0.0.1:%d" % rctest_free_port()]
        s = self.create(srv, network={"mode": "allowlist", "allow": allow})
        self.execute(srv, s["id"], "x = 1")
        self.close_checkpoint(srv, s["id"])
        r = self.create(srv, resume_from=s["id"])
        self.assertEqual((r["network"]["mode"], r["network"]["allow"]), ("allowlist", allow))
        self.assertIn("x", r["restored"]["variables"])
        # What the request asks for replaces what was stored.
        self.close_checkpoint(srv, r["id"])
        r2 = self.create(srv, resume_from=r["id"], network={"mode": "none"})
        self.assertEqual(r2["network"], {"mode": "none"})

    def test_delete_of_a_stored_session_removes_it(self):
        srv = self.start_server()
        s = self.create(srv, idle_timeout_s=1)
        self.execute(srv, s["id"], "open('f.txt', 'w').write('f')")
        self.wait_expired(srv, s["id"])
        st, body = srv.request("DELETE", "/v1/sessions/%s" % s["id"])
        self.assertEqual((st, body.get("deleted")), (200, True), body)
        self.assertEqual(glob.glob(os.path.join(self.data, "store", "sessions", s["id"], "*")), [])
        st, body = srv.request("POST", "/v1/sessions", {"resume_from": s["id"]})
        self.assertEqual(st, 404, body)

    def test_persist_false_keeps_nothing(self):
        srv = self.start_server()
        s = self.create(srv, persist=False, idle_timeout_s=1)
        self.assertFalse(s["persist"])
        rec = self.execute(srv, s["id"], "open('f.txt', 'w').write('f')\nv = 1")
        self.assertNotIn("persist_error", rec)
        self.assertEqual(glob.glob(os.path.join(self.data, "store", "sessions", s["id"], "*")), [])
        body = self.wait_expired(srv, s["id"])
        self.assertFalse(body["resumable"])
        self.assertIn("persist: false", body["error"]["message"])
        st, body = srv.request("POST", "/v1/sessions", {"resume_from": s["id"]})
        self.assertEqual(st, 404, body)

    def test_bad_store_options_are_refused_at_start(self):
        env = {k: "" for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")}
        cases = [
            (["--store-quota", "lots"], "--store-quota", 2),
            (["--store", "ftp://host/x"], "unknown scheme", 1),
            (["--store", "s3://"], "no bucket", 1),
            (["--store", "s3://bucket/p"], "no credentials", 1),
            (["--store", "s3://bucket/p", "--s3-access-key", "a", "--s3-secret-key", "b",
              "--s3-endpoint", "localhost:9000"], "http://", 1),
            (["--store", "s3://bucket/p", "--s3-access-key", "a", "--s3-secret-key", "b",
              "--s3-endpoint", "http://127.0.0.1:%d" % rctest_free_port()], "cannot reach", 1),
        ]
        for args, said, status in cases:
            p = runcell("serve", "--listen", "127.0.0.1:1", "--data", os.path.join(self.tmp, "d"),
                        "--token", Server.TOKEN, *args, timeout=60, env=env)
            self.assertEqual(p.returncode, status, (args, p.stderr))
            self.assertIn(said, p.stderr, args)

    def test_resuming_an_unknown_or_bad_id_is_404(self):
        srv = self.start_server()
        for sid in ("0123456789abcdef01234567", "not-an-id", "../../etc"):
            st, body = srv.request("POST", "/v1/sessions", {"resume_from": sid})
            self.assertEqual(st, 404, body)
            self.assertEqual(body["error"]["code"], "not_found")
        st, body = srv.request("POST", "/v1/sessions", {"resume_from": 7})
        self.assertEqual(st, 400, body)
        self.assertEqual(srv.request("GET", "/v1/sessions/0123456789abcdef01234567")[0], 404)

    def test_two_resumes_of_one_session_do_not_corrupt_each_other(self):
        srv = self.start_server()
        s = self.create(srv)
        self.execute(srv, s["id"], "v = 'base'\nopen('f.txt', 'w').write('base')")
        self.close_checkpoint(srv, s["id"])
        results = [None, None]

        def resume(i):
            results[i] = srv.request("POST", "/v1/sessions", {"resume_from": s["id"]})
        threads = [threading.Thread(target=resume, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        ids = []
        for i, (st, r) in enumerate(results):
            self.assertEqual(st, 201, r)
            self.assertEqual(r["restored"]["files"], ["f.txt"])
            self.assertIn("v", r["restored"]["variables"])
            self.execute(srv, r["id"], "v = 'fork%d'\nopen('f.txt', 'w').write(v)" % i)
            ids.append(r["id"])
        for sid in ids:
            self.close_checkpoint(srv, sid)
        for i, sid in enumerate(ids + [s["id"]]):
            r = self.create(srv, resume_from=sid)
            want = "fork%d" % i if i < 2 else "base"
            rec = self.execute(srv, r["id"], "print(v, open('f.txt').read())")
            self.assertEqual(rec["stdout"], "%s %s\n" % (want, want))

    def test_store_quota(self):
        srv = self.start_server("--store-quota", "1")
        s = self.create(srv)
        rec = self.execute(srv, s["id"], "open('small.txt', 'w').write('s')\n"
                                         "open('big.bin', 'wb').write(b'x' * 2_000_000)")
        self.assertIn("big.bin", rec["persist_error"])
        self.assertIn("quota of 1.0 MB", rec["persist_error"])
        self.assertNotIn("small.txt", rec["persist_error"])
        # Still over: still said; once the file is gone, nothing to say.
        rec = self.execute(srv, s["id"], "pass")
        self.assertIn("big.bin", rec["persist_error"])
        rec = self.execute(srv, s["id"], "import os\nos.remove('big.bin')")
        self.assertNotIn("persist_error", rec)
        # Variables past the quota: the checkpoint says so; the files are kept.
        self.execute(srv, s["id"], "import os\nblob = os.urandom(2_000_000)")
        closed = self.close_checkpoint(srv, s["id"])
        self.assertIn("quota", closed["checkpoint"]["variables_error"])
        r = self.create(srv, resume_from=s["id"])
        self.assertEqual(r["restored"]["files"], ["small.txt"])

    def test_corrupted_and_missing_objects_are_named_and_the_rest_restores(self):
        srv = self.start_server()
        s = self.create(srv)
        self.execute(srv, s["id"], "v = 7\nfor n in ('good', 'bad', 'gone'):\n"
                                   "    open(n + '.txt', 'w').write(n * 3)")
        self.close_checkpoint(srv, s["id"])
        sdir = os.path.join(self.data, "store", "sessions", s["id"])
        with open(os.path.join(sdir, "manifest.json")) as f:
            manifest = json.load(f)
        sha = {f["path"]: f["sha256"] for f in manifest["files"]}
        with open(os.path.join(sdir, "blobs", sha["bad.txt"]), "r+b") as f:
            f.write(b"X")
        os.remove(os.path.join(sdir, "blobs", sha["gone.txt"]))

        r = self.create(srv, resume_from=s["id"])
        rest = r["restored"]
        self.assertEqual(rest["files"], ["good.txt"])
        failed = {f["path"]: f["error"] for f in rest["files_failed"]}
        self.assertIn("corrupted", failed["bad.txt"])
        self.assertIn("missing", failed["gone.txt"])
        self.assertIn("v", rest["variables"])
        rec = self.execute(srv, r["id"], "import os\nprint(sorted(os.listdir('.')), v)")
        self.assertEqual(rec["stdout"], "['good.txt'] 7\n")

        # A corrupted variables checkpoint: named, and the files still come back.
        vsha = manifest["variables"]["sha256"]
        with open(os.path.join(sdir, "blobs", vsha), "r+b") as f:
            f.seek(30)
            f.write(b"garbage")
        r = self.create(srv, resume_from=s["id"])
        self.assertIn("corrupted", r["restored"]["variables_error"])
        self.assertEqual(r["restored"]["files"], ["good.txt"])

        # A corrupted file list: the session is still made, and says so.
        with open(os.path.join(sdir, "manifest.json"), "w") as f:
            f.write("{not json")
        r = self.create(srv, resume_from=s["id"])
        self.assertIn("corrupted", r["restored"]["error"])
        self.assertIn("manifest.json", r["restored"]["error"])

    def test_a_variable_that_cannot_be_restored_is_named(self):
        srv = self.start_server()
        s = self.create(srv)
        # A class that pickles but cannot be rebuilt: its __setstate__ refuses.
        self.execute(srv, s["id"], "ok = 1\nclass Fragile:\n    def __setstate__(self, st):\n"
                                   "        raise RuntimeError('no way back')\nf = Fragile()\nf.state = 1")
        self.close_checkpoint(srv, s["id"])
        r = self.create(srv, resume_from=s["id"])
        failed = {v["name"]: v["error"] for v in r["restored"]["variables_failed"]}
        self.assertIn("no way back", failed["f"])
        self.assertIn("ok", r["restored"]["variables"])
        self.assertIn("Fragile", r["restored"]["variables"])



class TestDataModes(PersistCase):
    """DATA holds the token, session records, stored files and agent transcripts: every file
    in it is 0600 and every directory 0700, SQLite's -wal/-shm/-journal files included."""

    def modes(self):
        """{path relative to DATA: mode} of everything below DATA, DATA itself as '.'."""
        found = {".": os.stat(self.data).st_mode}
        for root, dirs, files in os.walk(self.data):
            for name in dirs + files:
                path = os.path.join(root, name)
                found[os.path.relpath(path, self.data)] = os.lstat(path).st_mode
        return found

    def check_modes(self, when):
        found = self.modes()
        wrong = {p: oct(m) for p, m in found.items()
                 if (stat.S_ISDIR(m) and stat.S_IMODE(m) != 0o700)
                 or (not stat.S_ISDIR(m) and (not stat.S_ISREG(m) or stat.S_IMODE(m) != 0o600))}
        self.assertEqual(wrong, {}, "%s: %s" % (when, sorted(found)))
        return found

    def test_every_file_is_0600_and_every_directory_0700(self):
        os.makedirs(self.data, mode=0o755)  # made by hand beforehand: tightened at start
        os.chmod(self.data, 0o755)
        old = os.umask(0o022)
        self.addCleanup(os.umask, old)
        script = [{"tool": "run_python", "code": "open('report.txt', 'w').write('r')"},
                  {"answer": "done"},
                  {"tool": "run_python", "code": "1/0"}, {"tool": "run_python", "code": "[][1]"},
                  {"tool": "run_python", "code": "{}[1]"}]
        with ScriptedModel(script) as m:
            srv = self.start_server("--model", "scripted", "--base-url", m.base_url,
                                    env={"OPENAI_API_KEY": "sk-test"})
            a = self.create(srv)
            self.execute(srv, a["id"], "v = 1\nos = __import__('os')\n"
                                       "os.makedirs('d/e')\nopen('d/e/f.txt', 'w').write('f')")
            self.close_checkpoint(srv, a["id"])
            b = self.create(srv, resume_from=a["id"])
            self.execute(srv, b["id"], "print(v)")
            st, out = srv.request("POST", "/v1/agent/runs", {"task": "write a report"})
            self.assertEqual((st, out["answer"]), (200, "done"), out)
            st, out = srv.request("POST", "/v1/agent/runs", {"task": "fail thrice"})
            self.assertEqual((st, out["reason"]), (200, "retries_exhausted"), out)
            found = self.check_modes("while the server runs")
            for name in ("sessions.db", "agent.db"):
                self.assertIn(name, found)
            self.assertTrue(any(p.startswith("sessions.db-") for p in found), sorted(found))
            self.assertTrue(any(p.startswith("store/") for p in found), sorted(found))
            srv.stop()
        self.check_modes("after the server stopped")


@unittest.skipIf(s3_server_missing(), s3_server_missing())
class TestS3Store(PersistCase):

    def setUp(self):
        super().setUp()
        self.s3dir = os.path.join(self.tmp, "s3")
        os.mkdir(self.s3dir)
        self.s3 = S3Server(self.s3dir).start()
        self.addCleanup(self.s3.stop)

    def test_round_trip_through_a_real_s3_server(self):
        srv = self.start_server(*self.s3.store_args("team/a"))
        s = self.create(srv)
        self.execute(srv, s["id"], write_files_code())
        self.execute(srv, s["id"], "import os\nopen('large.bin', 'wb').write(os.urandom(8 << 20))\n"
                                   "import hashlib\nlarge_sum = hashlib.sha256(open('large.bin','rb').read()).hexdigest()")
        self.execute(srv, s["id"], MAKE_STATE)
        closed = self.close_checkpoint(srv, s["id"])
        self.assertNotIn("persist_error", closed["checkpoint"])
        # The objects are in the bucket, under the prefix.
        keys = [os.path.relpath(p, self.s3dir) for p in
                glob.glob(os.path.join(self.s3dir, "runcell", "team", "a", "sessions", s["id"], "**"),
                          recursive=True)]
        self.assertTrue(any(k.endswith("manifest.json._S3rver_object") for k in keys), keys)

        r = self.create(srv, resume_from=s["id"])
        self.assertEqual(r["restored"]["files_failed"], [])
        self.assertIn("large.bin", r["restored"]["files"])
        self.assertEqual(self.execute(srv, r["id"], CHECK_STATE)["stdout"], CHECK_OUTPUT)
        self.check_files(srv, r["id"])
        rec = self.execute(srv, r["id"], "import hashlib\nprint(hashlib.sha256(open('large.bin','rb').read()).hexdigest() == large_sum)")
        self.assertEqual(rec["stdout"], "True\n")

    def test_credentials_from_the_environment_and_bad_ones(self):
        env = {"AWS_ACCESS_KEY_ID": S3Server.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": S3Server.SECRET_KEY,
               "AWS_REGION": "eu-west-1"}
        srv = self.start_server("--store", "s3://runcell/env", "--s3-endpoint", self.s3.endpoint,
                                env=env)
        s = self.create(srv)
        rec = self.execute(srv, s["id"], "open('a.txt', 'w').write('a')")
        self.assertNotIn("persist_error", rec)
        srv.stop()
        # A wrong secret: the server refuses to start, and says why.
        p = runcell("serve", "--listen", "127.0.0.1:1", "--data", os.path.join(self.tmp, "d2"),
                    "--token", Server.TOKEN, "--store", "s3://runcell/x", "--s3-endpoint",
                    self.s3.endpoint, "--s3-access-key", "S3RVER", "--s3-secret-key", "wrong",
                    timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("SignatureDoesNotMatch", p.stderr)
        p = runcell("serve", "--listen", "127.0.0.1:1", "--data", os.path.join(self.tmp, "d3"),
                    "--token", Server.TOKEN, "--store", "s3://nobucket/x", "--s3-endpoint",
                    self.s3.endpoint, timeout=60, env=env)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("NoSuchBucket", p.stderr)

    def test_store_outage_during_an_execution_is_reported_and_recovered(self):
        srv = self.start_server(*self.s3.store_args())
        s = self.create(srv)
        self.assertNotIn("persist_error", self.execute(srv, s["id"], "open('a.txt','w').write('a')"))
        self.s3.stop()
        rec = self.execute(srv, s["id"], "open('b.txt','w').write('b')\nv = 2")
        self.assertIn("b.txt", rec["persist_error"])
        self.assertIn("cannot reach the store", rec["persist_error"])
        self.assertIn("next execution tries again", rec["persist_error"])
        # The sandbox's files are as they were.
        rec = self.execute(srv, s["id"], "print(open('b.txt').read())")
        self.assertEqual(rec["stdout"], "b\n")
        self.assertIn("persist_error", rec)
        self.s3.start()  # same directory, same port
        rec = self.execute(srv, s["id"], "pass")
        self.assertNotIn("persist_error", rec)
        self.close_checkpoint(srv, s["id"])
        r = self.create(srv, resume_from=s["id"])
        self.assertEqual(sorted(r["restored"]["files"]), ["a.txt", "b.txt"])
        self.assertIn("v", r["restored"]["variables"])


class TestRepl(PersistCase):

    def repl(self, stdin, *args):
        return runcell("repl", "--data", self.data, *args, input=stdin, timeout=180)

    def test_repl_keeps_and_resumes(self):
        p = self.repl("x = 5\nopen('r.txt', 'w').write('rr')\ndef sq(v):\n    return v * v\n\n")
        self.assertEqual(p.returncode, 0, p.stderr)
        sid = p.stderr.split("resume with: runcell repl --resume ")[1].split()[0]
        self.assertIn("kept: 1 file; variables: x, _, sq", p.stderr)
        p = self.repl("print(x, sq(3), open('r.txt').read())\n", "--resume", sid)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, "5 9 rr\n")
        self.assertIn("resumed session %s" % sid, p.stderr)

    def test_repl_resumes_a_server_session(self):
        srv = self.start_server()
        s = self.create(srv)
        self.execute(srv, s["id"], "from_server = 'yes'\nopen('s.txt', 'w').write('s')")
        srv.stop()
        p = self.repl("print(from_server, open('s.txt').read())\n", "--resume", s["id"])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, "yes s\n")

    def test_repl_resume_errors(self):
        p = self.repl("", "--resume", "0123abcd")
        self.assertEqual(p.returncode, 1)
        self.assertIn("nothing is stored for session 0123abcd", p.stderr)
        p = self.repl("", "--resume", "x", "--no-persist")
        self.assertEqual(p.returncode, 2)
        p = self.repl("print(1)\n", "--no-persist")
        self.assertEqual((p.returncode, p.stdout), (0, "1\n"))
        self.assertNotIn("resume with", p.stderr)


if __name__ == "__main__":
    unittest.main()
