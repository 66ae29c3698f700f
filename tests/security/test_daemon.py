"""The daemon's side: what a sandbox sends or leaves behind (frames on the kernel channel,
file listings, sparse and many files, checkpoint replies) is hostile input to `runcell
serve`, which runs as root outside any cgroup. Each attack runs from inside a real session
(fresh, or cloned from the template under [template]) and must cost the daemon memory,
CPU time and store space within stated bounds, end with a clear status or error, and
leave the daemon answering.

Memory is read from /proc/PID/status: VmHWM, the peak resident size, is reset before each
attack (writing 5 to /proc/PID/clear_refs), so the growth an attack causes is its peak
minus the resident size before it."""
import json
import os
import tempfile
import time
import unittest

from rctest import FRAME_WRITER, HANG, RuncellTestCase, Server, runcell

MiB = 1 << 20

FRAME = FRAME_WRITER  # a frame of its own on the kernel channel

# ~30 MiB of tiny nodes inside one display frame: under the 32 MiB results cap and the
# 48 MiB frame cap, but ten million JSON values once parsed.
MANY_NODES = FRAME + r'''
n = (30 << 20) // 3
send_frame(b'{"type":"display","data":{"application/json":[' + b"[]," * n + b'[]]}}')
print("sent")
'''

# The same bytes as chains nested 1000 deep (within jansson's own depth limit).
DEEP = FRAME + r'''
chain = b"[" * 1000 + b"]" * 1000
n = (30 << 20) // (len(chain) + 1)
send_frame(b'{"type":"display","data":{"application/json":[' +
           b",".join([chain] * n) + b']}}')
print("sent")
'''

# Thousands of files at the end of a long path (made one directory at a time, so it may
# pass PATH_MAX): a listing of hundreds of megabytes of names.
DEEP_PATHS = r'''
import os
top = os.getcwd()
for i in range(%(depth)d):
    os.mkdir("d" * 250)
    os.chdir("d" * 250)
for i in range(%(files)d):
    os.close(os.open("f%%05d" %% i + "x" * 200, os.O_CREAT | os.O_WRONLY))
os.chdir(top)
print("made")
'''

MANY_FILES = r'''
import os
os.mkdir("many")
for i in range(%(files)d):
    with open("many/%%05d" %% i, "w") as f:
        f.write(str(i))
print("made")
'''

# The kernel's checkpoint is code running in the sandbox: hostile code replaces it with
# one that answers with a reply of its own, as large as a frame may be.
BIG_REPLY = r'''
import os
g = display.__globals__
def fake_checkpoint(ns, definitions, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(b"x")
    return {"saved": ["v%%d" %% i for i in range(%(n)d)],
            "modules": {"m%%d" %% i: "x" * 100 for i in range(%(n)d)},
            "skipped": [{"name": "s%%d" %% i, "type": "t" * 100, "reason": "r" * 100}
                        for i in range(%(n)d)]}
g["checkpoint_variables"] = fake_checkpoint
print("armed")
'''


def proc_status(pid):
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) * 1024
    return out


def reset_peak(pid):
    with open("/proc/%d/clear_refs" % pid, "w") as f:
        f.write("5")


def tree_size(root):
    """(files, bytes actually allocated) below root."""
    n = size = 0
    for d, _, files in os.walk(root):
        for f in files:
            st = os.lstat(os.path.join(d, f))
            n += 1
            size += st.st_blocks * 512
    return n, size


def server_args(*extra):
    # The security suite runs twice: sessions made fresh, and cloned from the template.
    return (() if os.environ.get("RUNCELL_TEMPLATE") else ("--no-template",)) + extra


class DaemonCase(RuncellTestCase):
    server_extra = ()

    @classmethod
    def setUpClass(cls):
        cls.srv = Server(*server_args("--pool", "0", *cls.server_extra)).start()

    @classmethod
    def tearDownClass(cls):
        cls.srv.close()

    def measure(self, fn):
        """Runs fn(); returns (its result, the daemon's memory growth in bytes, seconds)."""
        pid = self.srv.pid
        reset_peak(pid)
        before = proc_status(pid)["VmRSS"]
        t0 = time.monotonic()
        res = fn()
        took = time.monotonic() - t0
        growth = proc_status(pid)["VmHWM"] - before
        print("\n  %s: daemon peak growth %.1f MiB, %.1f s" % (self.id().split(".")[-1],
                                                             growth / MiB, took))
        return res, growth, took

    def assertAnswering(self):
        sid = self.srv.create_session()
        self.assertEqual(self.srv.execute(sid, "print(6 * 7)")["stdout"], "42\n")
        self.srv.ok("DELETE", "/v1/sessions/" + sid)


class Frames(DaemonCase):
    """Finding 3: frames a cell writes itself on the kernel channel."""

    def attack(self, code):
        sid = self.srv.create_session()
        rec, growth, _ = self.measure(lambda: self.srv.execute(sid, code))
        self.assertStatus(rec, "output_limit")
        self.assertIn("limit", rec["message"])
        # The frame itself passes through the daemon's buffer once (30 MiB); parsing it
        # must not multiply it.
        self.assertLess(growth, 120 * MiB)
        # The session goes on with a working interpreter.
        self.assertEqual(self.srv.execute(sid, "print('after')")["stdout"], "after\n")
        self.assertAnswering()

    def test_many_small_nodes_end_the_execution_with_output_limit(self):
        self.attack(MANY_NODES)

    def test_deep_nesting_ends_the_execution_with_output_limit(self):
        self.attack(DEEP)

    def test_many_small_results_are_charged_by_what_they_cost(self):
        # 300,000 tiny results of 40 bytes each on the wire: far under the 32 MiB cap in
        # bytes, but each is a JSON object in the daemon.
        sid = self.srv.create_session()
        code = FRAME + r'''
one = b'{"type":"display","data":{"text/plain":"x"}}'
frame = struct.pack(">I", len(one)) + b"M" + one
blob = frame * 300000
view = memoryview(blob)
while view:
    view = view[os.write(CHAN, view):]
print("sent")
'''
        rec, growth, _ = self.measure(lambda: self.srv.execute(sid, code))
        self.assertStatus(rec, "output_limit")
        self.assertLessEqual(len(rec["results"]), 10001)
        self.assertLess(growth, 200 * MiB)
        self.assertAnswering()


class Listings(DaemonCase):
    """Finding 3: a file listing of tens of thousands of deep paths."""

    def test_paths_longer_than_path_max_stay_within_the_listing_budget(self):
        self.attack(60, 15000)

    def test_paths_just_under_path_max_stay_within_the_listing_budget(self):
        # 15 levels of 250 bytes: each path ~3,970 bytes, 80 MB of names in all.
        self.attack(15, 20000)

    def attack(self, depth, files):
        sid = self.srv.create_session()
        rec, growth, _ = self.measure(
            lambda: self.srv.execute(sid, DEEP_PATHS % {"depth": depth, "files": files}))
        self.assertStatus(rec, "ok")
        self.assertEqual(rec["stdout"], "made\n")
        self.assertTrue(rec["files"].get("truncated"), rec["files"].keys())
        self.assertLess(growth, 150 * MiB)
        # The files API lists the workspace within the same budget.
        r = self.srv.request("GET", "/v1/sessions/%s/files" % sid)
        self.assertEqual(r.status, 200)
        self.assertAnswering()


class SparseFiles(DaemonCase):
    """Finding 4: a sparse file is checked by its size and allocated blocks before the
    daemon reads a byte of it."""

    def test_a_sparse_file_of_2_62_bytes_neither_hangs_nor_is_stored(self):
        sid = self.srv.create_session()
        rec, _, took = self.measure(lambda: self.srv.execute(
            sid, "with open('huge', 'wb') as f:\n    f.truncate(1 << 62)\nprint('ok')"))
        self.assertStatus(rec, "ok")
        self.assertIn("huge", rec["persist_error"])
        self.assertIn("sparse", rec["persist_error"])
        self.assertLess(took, HANG)
        self.assertAnswering()
        # The idle reaper and shutdown are not held up either: closing with a checkpoint
        # (the save of the files again) answers.
        t0 = time.monotonic()
        self.srv.ok("DELETE", "/v1/sessions/%s?checkpoint=true" % sid)
        self.assertLess(time.monotonic() - t0, HANG)

    def test_a_sparse_gigabyte_is_not_written_to_the_store(self):
        sid = self.srv.create_session()
        _, before = tree_size(self.srv.data_dir)
        rec = self.srv.execute(
            sid, "with open('zeros', 'wb') as f:\n    f.truncate(1 << 30)\nprint('ok')")
        self.assertStatus(rec, "ok")
        self.assertIn("zeros", rec.get("persist_error", ""))
        _, after = tree_size(self.srv.data_dir)
        self.assertLess(after - before, 16 * MiB)
        # A dense file of the same session is still saved.
        rec = self.srv.execute(sid, "open('dense', 'w').write('x' * 1000)")
        self.assertNotIn("dense", rec.get("persist_error", ""))
        self.srv.ok("DELETE", "/v1/sessions/" + sid)


class SparseOutput(RuncellTestCase):
    """Finding 4, one-shot: `runcell run --out` does not write a sparse file's holes to the
    host's disk."""

    def test_a_sparse_file_is_not_copied_out(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "out")
            p = runcell("run", "--json", "--out", out, "-c",
                        "with open('huge', 'wb') as f:\n    f.truncate(1 << 62)\n"
                        "open('small', 'w').write('x')")
            rec = json.loads(p.stdout)
            self.assertStatus(rec, "ok")
            self.assertEqual(sorted(os.listdir(out)), ["small"])
            self.assertIn("sparse", p.stderr)


class ManyFiles(DaemonCase):
    """Finding 5: the store counts files, not only bytes."""
    server_extra = ("--store-max-files", "1000")

    def test_files_past_the_count_cap_are_refused_by_name(self):
        sid = self.srv.create_session()
        rec, growth, _ = self.measure(
            lambda: self.srv.execute(sid, MANY_FILES % {"files": 3000}))
        self.assertStatus(rec, "ok")
        self.assertIn("1000 files", rec["persist_error"])
        blobs = os.path.join(self.srv.data_dir, "store", "sessions", sid, "blobs")
        n, _ = tree_size(os.path.dirname(blobs))
        self.assertLessEqual(n, 1001, "host files in the store for one session")
        self.assertAnswering()
        self.srv.ok("DELETE", "/v1/sessions/" + sid)


class CheckpointReplies(DaemonCase):
    """Finding 3: a checkpoint reply is the kernel's word, so the sandbox's: capped, and
    what is kept of it counts against the store quota."""

    def test_a_huge_checkpoint_reply_is_capped_in_memory_and_in_the_store(self):
        sid = self.srv.create_session()
        self.assertEqual(self.srv.execute(sid, BIG_REPLY % {"n": 60000})["stdout"], "armed\n")
        rep, growth, _ = self.measure(
            lambda: self.srv.ok("DELETE", "/v1/sessions/%s?checkpoint=true" % sid))
        self.assertLess(growth, 150 * MiB)
        # What the store keeps of the reply (the session record, the manifest) is small
        # however large the reply, and says what was left out.
        info = self.srv.ok("GET", "/v1/sessions?all=true")
        stored = [s for s in info["stored"] if s.get("id") == sid]
        self.assertTrue(stored, info)
        text = json.dumps(stored[0])
        self.assertLess(len(text), 256 * 1024)
        manifest = os.path.join(self.srv.data_dir, "store", "sessions", sid, "manifest.json")
        if os.path.exists(manifest):
            self.assertLess(os.path.getsize(manifest), 256 * 1024)
        self.assertAnswering()


if __name__ == "__main__":
    unittest.main()
