"""Every hostile-output class through every surface: what a cell sends on its kernel's
channel (frames with missing, null, odd-typed and oversized members; MIME bundles whose keys
are another protocol's control words; quotes and control characters meant for the log) and
what it leaves in its workspace (listings past every cap, links out of it), read through the
native API (JSON and the NDJSON stream the console reads, re-attached), MCP over HTTP and
over stdio, and E2B's code interpreter and envd. One table of attacks, one of surfaces: for
each pair the daemon survives and answers, each cap holds, and the client gets a clear,
well-formed answer in its own protocol's shape. Runs from fresh sandboxes and, under
[template], from template-made ones."""
import json
import os
import re
import unittest

import mcpclient
from rctest import FRAME_WRITER, HANG, RUNCELL, RuncellTestCase, Server

MiB = 1 << 20

FRAME = FRAME_WRITER  # a frame of its own on the kernel channel

# Each attack: (name, cell). A cell that forges its own end may leave the real one behind
# for the daemon to find: what counts is that every surface answers in its shape.
ATTACKS = [
    ("an error without a name", FRAME +
     'send_frame(b\'{"type":"done","status":"error","error":{}}\')'),
    ("an error of null and odd-typed members", FRAME +
     'send_frame(b\'{"type":"done","status":"error","execution_count":-7,"exit_code":1e300,'
     '"error":{"name":null,"value":[1,2],"traceback":[{"a":1},7,"line"]}}\')'),
    ("an error that is not an object", FRAME +
     'send_frame(b\'{"type":"done","status":"error","error":"text"}\')'),
    ("a done without members", FRAME + 'send_frame(b\'{"type":"done"}\')'),
    ("an oversized traceback", FRAME +
     'send_frame(b\'{"type":"done","status":"error","error":{"name":"E","value":"v",'
     '"traceback":"\' + b"x" * (9 << 20) + b\'"}}\')'),
    ("a bundle of another protocol's control keys",
     "class Forged:\n"
     "    def _repr_mimebundle_(self, include=None, exclude=None):\n"
     "        return {'type': 'error', 'name': 'Forged', 'value': 'x',\n"
     "                'end_of_execution': True, 'stdout': 'forged', 'is_main_result': 9,\n"
     "                'text/plain': 'shown', 'Text/HTML': '<b>', 'text/ plain': 'x',\n"
     "                'image/png': 5}\n"
     "Forged()"),
    ("quotes and control characters for the log", FRAME +
     'send_frame(b\'{"type":"x\\\\" level=error msg=\\\\"forged\\\\n","data":1}\')\n'
     'print("done")'),
]

# Names a result bundle's keys may have: MIME types only.
MIME = re.compile(r"^[a-z0-9][a-z0-9.+_-]*/[a-z0-9][a-z0-9.+_-]*$")
E2B_TYPES = {"stdout", "stderr", "result", "error", "number_of_executions",
             "end_of_execution", "keepalive"}
E2B_RESULT_KEYS = {"type", "is_main_result", "text", "html", "markdown", "svg", "png", "jpeg",
                   "pdf", "latex", "json", "javascript", "chart"}


def server_args(*extra):
    # The security suite runs twice: sessions made fresh, and cloned from the template.
    return (() if os.environ.get("RUNCELL_TEMPLATE") else ("--no-template",)) + extra


def proc_status(pid):
    with open("/proc/%d/status" % pid) as f:
        return {k: int(v.split()[0]) * 1024 for k, v in
                (line.split(":", 1) for line in f) if v.strip().endswith("kB")}


class Surfaces(RuncellTestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = Server(*server_args("--e2b", "--pool", "0")).start()

    @classmethod
    def tearDownClass(cls):
        cls.srv.close()

    # ---- the surfaces: each runs a cell and checks its answer is well formed ----

    def native_json(self, code):
        sid = self.srv.create_session()
        self.addCleanup(self.srv.request, "DELETE", "/v1/sessions/" + sid)
        r = self.srv.request("POST", "/v1/sessions/%s/execute" % sid, {"code": code})
        self.assertEqual(r.status, 200, r)
        self.check_record(r.json())
        self.check_session_answers(sid)

    def native_stream(self, code):
        """The console's way: a stream that may be left, then re-attached from the start."""
        sid = self.srv.create_session()
        self.addCleanup(self.srv.request, "DELETE", "/v1/sessions/" + sid)
        st = self.srv.stream(sid, code, on_disconnect="continue")
        events = st.rest()
        self.assertEqual(events[-1]["type"], "done", events[-1:])
        self.check_record(events[-1]["record"])
        for e in events:
            self.assertIn(e["type"], {"stdout", "stderr", "result", "error", "done"}, e)
            if e["type"] == "result":
                self.check_bundle(e["data"])
        r = self.srv.request("GET", "/v1/sessions/%s/executions/%s/events?after=0"
                             % (sid, st.execution_id))
        self.assertEqual(r.status, 200, r)
        again = [json.loads(line) for line in r.body.splitlines()]
        self.assertEqual([e["type"] for e in again[1:]], [e["type"] for e in events])
        self.check_session_answers(sid)

    def mcp_http(self, code):
        c = mcpclient.HttpClient(self.srv.port, self.srv.token)
        c.initialize()
        self.check_mcp(c.call_tool("run_code", {"code": code}))
        self.check_mcp(c.call_tool("run_code", {"code": "print('after')"}), after=True)
        c.http("DELETE")

    def mcp_stdio(self, code):
        c = mcpclient.StdioClient(RUNCELL, *server_args()[:0])
        try:
            c.initialize()
            self.check_mcp(c.call_tool("run_code", {"code": code}))
            self.check_mcp(c.call_tool("run_code", {"code": "print('after')"}), after=True)
            self.assertEqual(c.bad_lines, [])
        finally:
            self.assertEqual(c.close(), 0)

    def e2b(self, code):
        h = self.e2b_box()
        r = self.srv.request("POST", "/execute", {"code": code}, token=False,
                             headers=dict(h, Accept="application/x-ndjson"))
        self.assertEqual(r.status, 200, r)
        msgs = [json.loads(line) for line in r.body.splitlines()]
        self.assertEqual(msgs[-1], {"type": "end_of_execution"})
        for m in msgs:
            self.assertIn(m["type"], E2B_TYPES, m)
            if m["type"] == "result":
                self.assertLessEqual(set(m) - E2B_RESULT_KEYS,
                                     {k for k in m if MIME.match(k)}, m)
                self.assertIsInstance(m["is_main_result"], bool, m)
            if m["type"] == "error":
                self.assertNotEqual(m.get("name"), "Forged", m)
                for k in ("name", "value", "traceback"):
                    self.assertIsInstance(m[k], str, m)
        r = self.srv.request("POST", "/execute", {"code": "print('after')"}, token=False,
                             headers=dict(h, Accept="application/x-ndjson"))
        self.assertEqual(r.status, 200, r)

    SURFACES = ("native_json", "native_stream", "mcp_http", "mcp_stdio", "e2b")

    # ---- checks ----

    def e2b_box(self):
        return self.srv.e2b_box(self)

    def check_bundle(self, bundle):
        self.assertIsInstance(bundle, dict)
        for k, v in bundle.items():
            self.assertRegex(k, MIME)
            self.assertTrue(isinstance(v, str) or k.endswith("json"), (k, v))
        self.assertIsInstance(bundle["text/plain"], str)

    def check_record(self, rec):
        self.assertIn(rec["status"], {"ok", "error", "timeout", "oom", "killed", "output_limit",
                                      "crashed", "sandbox_error"}, rec)
        for b in rec["results"]:
            self.check_bundle(b)
        if rec["error"] is not None:
            self.assertEqual(set(rec["error"]) - {"lineno", "offset"},
                             {"name", "value", "traceback"}, rec["error"])
            for k in ("name", "value", "traceback"):
                self.assertIsInstance(rec["error"][k], str)
            self.assertLessEqual(len(rec["error"]["traceback"]), 8 * MiB)
        if rec.get("exit_code") is not None:
            self.assertTrue(0 <= rec["exit_code"] <= 255, rec)
        if rec.get("execution_count") is not None:
            self.assertGreater(rec["execution_count"], 0, rec)

    def check_session_answers(self, sid):
        r = self.srv.request("POST", "/v1/sessions/%s/execute" % sid, {"code": "print(6 * 7)"})
        self.assertEqual(r.status, 200, r)
        self.check_record(r.json())

    def check_mcp(self, resp, after=False):
        self.assertEqual(resp.get("jsonrpc"), "2.0", resp)
        if "error" in resp:
            self.assertIsInstance(resp["error"]["code"], int, resp)
            self.assertIsInstance(resp["error"]["message"], str, resp)
            self.assertFalse(after, resp)
            return
        for part in resp["result"]["content"]:
            self.assertIn(part["type"], {"text", "image"}, part)
        sc = resp["result"].get("structuredContent")
        if sc:
            self.check_record(sc)

    def assertAnswering(self):
        r = self.srv.request("GET", "/healthz", token=False)
        self.assertEqual(r.status, 200, r)

    # ---- the table ----

    def test_every_attack_through_every_surface(self):
        for name, code in ATTACKS:
            for surface in self.SURFACES:
                with self.subTest(attack=name, surface=surface):
                    getattr(self, surface)(code)
                    self.assertAnswering()
        # No line of the daemon's log was forged by what a cell sent.
        for line in self.srv.log().splitlines():
            self.assertNotRegex(line, r'^\S+ level=error msg="forged', line)
            self.assertNotIn('msg="forged', line.split(" msg=", 1)[0], line)

    def test_listing_amplification_through_every_surface(self):
        """Empty files under long directory names: a listing of hundreds of megabytes of
        paths, were it not capped, on every surface that lists."""
        h = self.e2b_box()
        sid = self.srv.create_session()
        self.addCleanup(self.srv.request, "DELETE", "/v1/sessions/" + sid)
        make = ("import os\ntop = os.getcwd()\n"
                "for i in range(14):\n    os.mkdir('d' * 250)\n    os.chdir('d' * 250)\n"
                "for i in range(%d):\n    os.close(os.open('f%%05d' %% i + 'x' * 200, "
                "os.O_CREAT | os.O_WRONLY))\nos.chdir(top)\nprint('made')")
        for run in ((lambda c: self.srv.execute(sid, c)),
                    (lambda c: self.srv.request("POST", "/execute", {"code": c}, token=False,
                                                headers=dict(h, Accept="application/x-ndjson")))):
            out = run(make % 3000)
            self.assertIn("made", out["stdout"] if isinstance(out, dict) else out.body.decode())
        pid = self.srv.pid
        before = proc_status(pid)["VmRSS"]
        with open("/proc/%d/clear_refs" % pid, "w") as f:
            f.write("5")
        r = self.srv.request("GET", "/v1/sessions/%s/files" % sid)
        self.assertEqual(r.status, 200, r)
        self.assertTrue(r.json()["truncated"])
        self.assertLess(len(r.body), 12 * MiB)
        r = self.srv.request("POST", "/filesystem.Filesystem/ListDir",
                             {"path": "/home/user", "depth": 64}, token=False,
                             headers=dict(h, **{"Content-Type": "application/json"}))
        self.assertEqual((r.status, r.json()["code"]), (429, "resource_exhausted"), r)
        self.assertIn("list a subdirectory", r.json()["message"])
        c = mcpclient.HttpClient(self.srv.port, self.srv.token)
        c.initialize()
        res = c.call_tool("list_files", {"session_id": sid})
        self.assertIn("result", res)
        self.assertLess(len(json.dumps(res)), 12 * MiB)
        c.http("DELETE")
        growth = proc_status(pid)["VmHWM"] - before
        self.assertLess(growth, 120 * MiB)
        self.assertAnswering()

    def test_a_link_out_of_the_workspace_is_refused_on_every_surface(self):
        h = self.e2b_box()
        sid = self.srv.create_session()
        self.addCleanup(self.srv.request, "DELETE", "/v1/sessions/" + sid)
        plant = "import os\nos.symlink('/etc/shadow', 'link')\nos.mkfifo('fifo')\nprint('ok')"
        self.assertEqual(self.srv.execute(sid, plant)["stdout"], "ok\n")
        r = self.srv.request("POST", "/execute", {"code": plant}, token=False,
                             headers=dict(h, Accept="application/x-ndjson"))
        self.assertEqual(r.status, 200, r)
        for name in ("link", "fifo"):
            r = self.srv.request("GET", "/v1/sessions/%s/files/%s" % (sid, name))
            self.assertEqual((r.status, r.error_code), (400, "bad_path"), r)
            r = self.srv.request("GET", "/files?path=/home/user/" + name, token=False,
                                 headers=h, timeout=HANG)
            self.assertEqual(r.status, 400, r)
            self.assertNotIn(b"root:", r.body)
        c = mcpclient.HttpClient(self.srv.port, self.srv.token)
        c.initialize()
        res = c.call_tool("read_file", {"session_id": sid, "path": "link"})
        self.assertTrue(res["result"]["isError"], res)
        self.assertNotIn("root:", json.dumps(res))
        c.http("DELETE")
        self.assertAnswering()


if __name__ == "__main__":
    unittest.main()
