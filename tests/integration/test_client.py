"""test_client - clients/python/runcell_client.py against a real `runcell serve`: sessions as
context managers, records, streaming callbacks (while the cell runs), files up and down,
errors as RuncellError, interrupts from another thread, one-shot runs, and that the client
needs nothing but the standard library.
"""
import ast
import io
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import unittest

from rctest import HANG, PY, ROOT, RuncellTestCase, Server, wait_until

sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
import runcell_client  # noqa: E402
from runcell_client import Client, RuncellError, Session, decode_outputs  # noqa: E402

WAIT_FOR_GO = ("import os, time\n"
               "while not os.path.exists('go'):\n"
               "    time.sleep(0.01)\n")


class ClientCase(RuncellTestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = Server().start()
        cls.client = Client(cls.srv.base_url, cls.srv.token, timeout=HANG)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.srv.close()

    def session(self, **opts):
        s = Session(self.srv.base_url, self.srv.token, **opts)
        self.addCleanup(s.close)
        return s

    def live_ids(self):
        return [s["id"] for s in self.client.sessions()]


class Basics(ClientCase):
    def test_context_manager_runs_and_closes(self):
        with Session(self.srv.base_url, self.srv.token, memory_mb=512, timeout=30) as s:
            self.assertIn(s.id, self.live_ids())
            self.assertEqual(s.run("x = 20")["status"], "ok")
            rec = s.run("x += 22\nx")
            self.assertStatus(rec, "ok")
            self.assertEqual(rec["results"], [{"text/plain": "42"}])
            info = s.info()
            self.assertEqual((info["execution_count"], info["limits"]["memory_mb"],
                              info["timeout_s"]), (2, 512, 30))
        self.assertNotIn(s.id, self.live_ids())
        s.close()  # closing twice is fine

    def test_token_and_url_from_the_environment(self):
        env = {"RUNCELL_URL": self.srv.base_url, "RUNCELL_TOKEN": self.srv.token}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            with Session() as s:
                self.assertEqual(s.run("print('env')")["stdout"], "env\n")
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k)
                else:
                    os.environ[k] = v

    def test_failed_cell_is_a_record_not_an_exception(self):
        s = self.session()
        rec = s.run("{}['fare']")
        self.assertStatus(rec, "error")
        self.assertEqual(rec["error"]["name"], "KeyError")
        rec = s.run("import time\ntime.sleep(30)", timeout=0.5)
        self.assertStatus(rec, "timeout")

    def test_a_run_retried_with_its_key_runs_once(self):
        s = self.session()
        code = "n = globals().get('n', 0) + 1\nn"
        first = s.run(code, idempotency_key="retry-1")
        again = s.run(code, idempotency_key="retry-1")
        self.assertEqual(first["results"], again["results"])
        self.assertTrue(again["replayed"])
        streamed = s.run(code, idempotency_key="retry-1", on_stdout=lambda t: None)
        self.assertEqual(streamed["results"], [{"text/plain": "1"}])
        self.assertEqual(s.run("n")["results"], [{"text/plain": "1"}])

    def test_bash_session(self):
        s = self.session(language="bash")
        self.assertEqual(s.run("echo $((1 + 1))")["stdout"], "2\n")
        self.assertEqual(s.run("print(3)", language="python")["stdout"], "3\n")

    def test_attach_by_id(self):
        s = self.session()
        s.run("shared = 'yes'")
        other = Session(client=self.client, id=s.id)
        self.assertEqual(other.run("shared")["results"], [{"text/plain": "'yes'"}])
        with self.assertRaises(RuncellError) as cm:
            Session(client=self.client, id="0" * 24)
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))

    def test_restart(self):
        s = self.session()
        s.run("v = 1\nopen('kept.txt', 'w').write('k')")
        self.assertEqual(s.restart()["execution_count"], 0)
        rec = s.run("print(open('kept.txt').read())\nv")
        self.assertEqual((rec["stdout"], rec["error"]["name"]), ("k\n", "NameError"))

    def test_many_runs_over_kept_alive_connections(self):
        s = self.session()
        for i in range(50):
            self.assertEqual(s.run("%d" % i)["results"], [{"text/plain": str(i)}])

    def test_shared_between_threads(self):
        sessions = [self.session() for _ in range(4)]
        out, errors = {}, []

        def work(s, i):
            try:
                for j in range(10):
                    out[(i, j)] = s.run("print(%d * %d)" % (i, j))["stdout"]
            except Exception as e:  # reported in the test's thread
                errors.append(e)
        threads = [threading.Thread(target=work, args=(s, i)) for i, s in enumerate(sessions)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(HANG)
        self.assertEqual(errors, [])
        self.assertEqual(out, {(i, j): "%d\n" % (i * j) for i in range(4) for j in range(10)})


class Streaming(ClientCase):
    def test_callbacks_in_order(self):
        s = self.session()
        seen = []
        rec = s.run("import sys\nprint('a', flush=True)\nprint('b', file=sys.stderr, flush=True)\n"
                    "print('c', flush=True)\n7 * 6\n",
                    on_stdout=lambda t: seen.append(("out", t)),
                    on_stderr=lambda t: seen.append(("err", t)),
                    on_result=lambda b: seen.append(("result", b)))
        self.assertEqual(seen, [("out", "a\n"), ("err", "b\n"), ("out", "c\n"),
                                ("result", {"text/plain": "42"})])
        self.assertStatus(rec, "ok")
        self.assertEqual(rec["stdout"], "a\nc\n")

    def test_output_arrives_while_the_cell_runs(self):
        # The cell ends only once the callback has seen its first line and let it go on.
        s = self.session()
        seen = []

        def on_stdout(text):
            seen.append(text)
            if text == "first\n":
                s.upload("go", b"")
        rec = s.run("print('first', flush=True)\n" + WAIT_FOR_GO + "print('second')",
                    on_stdout=on_stdout)
        self.assertEqual(seen, ["first\n", "second\n"])
        self.assertStatus(rec, "ok")

    def test_on_error(self):
        s = self.session()
        errors = []
        rec = s.run("1/0", on_error=errors.append)
        self.assertEqual(errors, [rec["error"]])
        self.assertEqual(errors[0]["name"], "ZeroDivisionError")

    def test_a_run_while_one_streams_waits_its_turn(self):
        s = self.session()
        started = threading.Event()
        result = {}

        def run():
            result["rec"] = s.run("print('up', flush=True)\n" + WAIT_FOR_GO,
                                  on_stdout=lambda t: started.set())
        t = threading.Thread(target=run)
        t.start()
        self.assertTrue(started.wait(HANG))
        queued = {}
        waiters = [threading.Thread(target=lambda kw=kw, i=i: queued.update(
            {i: s.run("%d" % i, **kw)})) for i, kw in enumerate(({}, {"on_stdout": print}))]
        for w in waiters:
            w.start()
        self.assertTrue(wait_until(lambda: s.info()["queued"] == 2))
        s.upload("go", b"")
        t.join(HANG)
        for w in waiters:
            w.join(HANG)
        self.assertStatus(result["rec"], "ok")
        self.assertEqual([queued[i]["results"] for i in (0, 1)],
                         [[{"text/plain": "0"}], [{"text/plain": "1"}]])

    def test_a_cell_left_running_is_read_again(self):
        """on_disconnect="continue": the stream is left, the cell runs on, and the client
        reads its events again from the start with attach()."""
        s = self.session()
        ex = s.start("import time\nfor i in range(3):\n    print(i, flush=True)\n"
                     "    time.sleep(0.2)\n'end'")
        self.assertIn(ex["phase"], ("queued", "running"))
        out = []
        rec = s.attach(ex["execution_id"], on_stdout=out.append)
        self.assertEqual("".join(out), "0\n1\n2\n")
        self.assertEqual(rec["results"], [{"text/plain": "'end'"}])
        listed = s.executions()
        self.assertEqual(listed[-1]["id"], ex["execution_id"])
        self.assertEqual(listed[-1]["status"], "ok")

    def test_interrupt_from_another_thread(self):
        s = self.session()
        s.run("kept = 'still'")
        result = {}
        t = threading.Thread(target=lambda: result.update(
            rec=s.run("import time\nopen('started', 'w').close()\ntime.sleep(300)")))
        t.start()
        self.assertTrue(wait_until(lambda: "started" in [f["path"] for f in s.files()]))
        self.assertTrue(s.interrupt())
        t.join(HANG)
        self.assertEqual(result["rec"]["error"]["name"], "KeyboardInterrupt")
        self.assertEqual(s.run("kept")["results"], [{"text/plain": "'still'"}])
        self.assertFalse(s.interrupt())

    def test_a_callback_that_raises_abandons_the_cell(self):
        s = self.session()

        def boom(text):
            raise KeyError("from the callback")
        # The print is inside the try: the interrupt can come as soon as 'up' is out, before
        # the next line of the cell has run.
        with self.assertRaises(KeyError):
            s.run("import time\ntry:\n    print('up', flush=True)\n    time.sleep(300)\n"
                  "except KeyboardInterrupt:\n    open('stopped', 'w').close()\n",
                  on_stdout=boom)
        # The stream was dropped, which interrupts the cell on the server.
        self.assertTrue(wait_until(lambda: "stopped" in [f["path"] for f in s.files()]))
        self.assertTrue(wait_until(lambda: s.info()["status"] == "idle"))


class Files(ClientCase):
    def test_upload_download_list_delete(self):
        s = self.session()
        self.assertEqual(s.upload("in/data.csv", "a,b\n1,2\n"), {"path": "in/data.csv",
                                                                  "size": 8})
        s.upload("raw.bin", bytes(range(256)))
        s.upload("report.json", b'{"not": "decoded"}')
        rec = s.run("import csv, os\nrows = list(csv.DictReader(open('in/data.csv')))\n"
                    "os.makedirs('out')\nopen('out/total.txt', 'w').write(rows[0]['b'])")
        self.assertStatus(rec, "ok")
        self.assertEqual(s.download("out/total.txt"), b"2")
        self.assertEqual(s.download("raw.bin"), bytes(range(256)))
        self.assertEqual(s.download("report.json"), b'{"not": "decoded"}')
        listing = {f["path"]: f for f in s.files()}
        self.assertEqual(sorted(listing), ["in/data.csv", "out/total.txt", "raw.bin",
                                           "report.json"])
        self.assertEqual(listing["raw.bin"]["size"], 256)
        self.assertIn("mtime", listing["raw.bin"])
        s.delete_file("raw.bin")
        with self.assertRaises(RuncellError) as cm:
            s.download("raw.bin")
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))

    def test_streamed_both_ways_with_files(self):
        s = self.session()
        data = os.urandom(3 << 20)
        with tempfile.TemporaryFile() as f:
            f.write(data)
            f.seek(0)
            self.assertEqual(s.upload("big.bin", f)["size"], len(data))
        self.assertEqual(s.upload("chunked.bin", io.BytesIO(data))["size"], len(data))
        with tempfile.TemporaryDirectory() as d:
            dest = os.path.join(d, "copy.bin")
            self.assertEqual(s.download("big.bin", dest), len(data))
            with open(dest, "rb") as f:
                self.assertEqual(f.read(), data)
        buf = io.BytesIO()
        self.assertEqual(s.download("chunked.bin", buf), len(data))
        self.assertEqual(buf.getvalue(), data)

    def test_odd_names(self):
        s = self.session()
        for name in ("with space.txt", "ünï/cödé.txt", "q?x#y.txt", "100%.txt"):
            s.upload(name, name)
            self.assertEqual(s.download(name), name.encode())
        self.assertEqual(sorted(f["path"] for f in s.files()),
                         sorted(["with space.txt", "ünï/cödé.txt", "q?x#y.txt", "100%.txt"]))

    def test_bad_paths_raise(self):
        s = self.session()
        s.run("import os\nos.symlink('/etc/passwd', 'link')")
        for name in ("../x", "/etc/passwd", "a/../../x", "link"):
            with self.assertRaises(RuncellError) as cm:
                s.download(name)
            self.assertEqual((cm.exception.status, cm.exception.code), (400, "bad_path"), name)
            with self.assertRaises(RuncellError):
                s.upload(name, b"x")


class Errors(ClientCase):
    def test_upload_over_the_cap(self):
        with Server("--max-upload", "1") as srv, Session(srv.base_url, srv.token) as s:
            # Drained and answered, and refused while still being sent: 413 either way.
            for size in (2 << 20, 40 << 20):
                with self.assertRaises(RuncellError) as cm:
                    s.upload("big", b"x" * size)
                self.assertEqual((cm.exception.status, cm.exception.code), (413, "too_large"))
            self.assertEqual(s.files(), [])
            self.assertEqual(s.run("print('still fine')")["stdout"], "still fine\n")

    def test_wrong_token(self):
        with self.assertRaises(RuncellError) as cm:
            Session(self.srv.base_url, "wrong-token-wrong-token")
        self.assertEqual((cm.exception.status, cm.exception.code), (401, "unauthorized"))
        self.assertIn("token", cm.exception.message)

    def test_bad_options_name_the_field(self):
        with self.assertRaises(RuncellError) as cm:
            self.session(memory_mb="lots")
        self.assertEqual(cm.exception.code, "bad_request")
        self.assertIn("'memory_mb'", str(cm.exception))
        with self.assertRaises(RuncellError) as cm:
            self.session(colour="blue")
        self.assertIn("'colour'", cm.exception.message)

    def test_expired_session(self):
        s = Session(self.srv.base_url, self.srv.token, idle_timeout=1)
        self.assertTrue(wait_until(lambda: s.id not in self.live_ids()))
        for call in (lambda: s.run("1"), lambda: s.run("1", on_stdout=print), s.files,
                     lambda: s.upload("x", b"x")):
            with self.assertRaises(RuncellError) as cm:
                call()
            self.assertEqual((cm.exception.status, cm.exception.code), (404, "expired"))
        s.close()  # gone already: not an error

    def test_no_server(self):
        with self.assertRaises(RuncellError) as cm:
            Client("http://127.0.0.1:1", "t").health()
        self.assertEqual(cm.exception.status, 0)
        with self.assertRaises(ValueError):
            Client("ftp://example")


class OneShot(ClientCase):
    def test_execute_with_files(self):
        rec = self.client.execute("print(open('in.txt').read().upper())\n"
                                  "open('out.bin', 'wb').write(bytes([1, 2, 3]))",
                                  files={"in.txt": "hello", "raw": b"\x00\xff"},
                                  timeout=30, memory_mb=256)
        self.assertStatus(rec, "ok")
        self.assertEqual(rec["stdout"], "HELLO\n")
        self.assertEqual(decode_outputs(rec), {"out.bin": b"\x01\x02\x03"})
        self.assertEqual(self.client.execute("echo hi", language="bash")["stdout"], "hi\n")

    def test_health_and_metrics(self):
        self.assertEqual(self.client.health()["status"], "ok")
        self.assertIn("runcell_sessions_live", self.client.metrics())


CLIENT_DIR = os.path.join(ROOT, "clients", "python")


def readme_examples(path):
    """The ```python blocks of a Markdown file, each with the ```text block right under it
    (what it prints), or None when there is none."""
    with open(path) as f:
        lines = f.read().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        fence = lines[i].strip()
        if not fence.startswith("```") or fence == "```":
            i += 1
            continue
        end = lines.index("```", i + 1)
        blocks.append((fence[3:], "\n".join(lines[i + 1:end]) + "\n"))
        i = end + 1
        while i < len(lines) and not lines[i].strip():
            i += 1
        if i < len(lines) and lines[i].strip() != "```text":
            blocks.append(("prose", ""))
    examples = []
    for n, (lang, text) in enumerate(blocks):
        if lang == "python":
            follows = blocks[n + 1] if n + 1 < len(blocks) else ("", "")
            examples.append((text, follows[1] if follows[0] == "text" else None))
    return examples


class Documentation(ClientCase):
    """What a newcomer copies runs: README.md's examples and the module's docstring, each
    as a file beside a copy of runcell_client.py (and nothing else of the tree), with only
    RUNCELL_URL and RUNCELL_TOKEN to find the server."""

    def run_example(self, code):
        with tempfile.TemporaryDirectory() as d:
            shutil.copy(os.path.join(CLIENT_DIR, "runcell_client.py"), d)
            with open(os.path.join(d, "example.py"), "w") as f:
                f.write(code)
            env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
            env.update(RUNCELL_URL=self.srv.base_url, RUNCELL_TOKEN=self.srv.token)
            p = subprocess.run([PY, "example.py"], cwd=d, env=env, capture_output=True,
                               text=True, timeout=HANG)
        self.assertEqual(p.returncode, 0, "%s\n--- stderr:\n%s" % (code, p.stderr))
        return p.stdout

    def test_readme_examples_run_and_print_what_it_shows(self):
        examples = readme_examples(os.path.join(CLIENT_DIR, "README.md"))
        self.assertGreaterEqual(len(examples), 4)
        for code, shown in examples:
            with self.subTest(code=code.split("\n")[2]):
                self.assertIsNotNone(shown, "no output shown under:\n" + code)
                self.assertEqual(self.run_example(code), shown)
        self.assertEqual(self.live_ids(), [])  # each closed what it opened

    def test_the_docstring_example_runs(self):
        doc = runcell_client.__doc__
        start = doc.index("    from runcell_client")
        code = textwrap.dedent(doc[start:doc.index("\n\n", doc.index("with Session", start))])
        self.assertEqual(self.run_example(code), "ok 42\n0\n1\n2\nb'a,b\\n1,2\\n'\n")
        with open(runcell_client.__file__) as f:
            self.assertIn(code.split("\n")[3].strip(), f.read())  # the source says the same


class StandardLibraryOnly(unittest.TestCase):
    def test_imports(self):
        with open(runcell_client.__file__) as f:
            tree = ast.parse(f.read())
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                names.add(node.module.split(".")[0])
        self.assertTrue(names)
        self.assertEqual(sorted(n for n in names if n not in sys.stdlib_module_names), [])


if __name__ == "__main__":
    unittest.main()
