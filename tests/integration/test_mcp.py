"""runcell as an MCP server: a scripted client over stdio (`runcell mcp`) and over Streamable
HTTP (/mcp of `runcell serve`). The same protocol cases run on both transports; each
transport has its own cases too. McpCases speak the legacy era (initialize, 2025-11-25 and
older), ModernCases revision 2026-07-28 (per-request _meta, session handles), on the same
endpoints. Every message the clients get is validated against its revision's official JSON
schema (tests/lib/mcpschema.py)."""
import base64
import http.client
import json
import signal
import threading
import time
import unittest
import urllib.error
import urllib.request

from mcpclient import MODERN, HttpClient, StdioClient, texts
from rctest import RUNCELL, RuncellTestCase, ServeProcess, wait_until

VERSIONS = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"]
TOOLS = {"run_code", "run_shell", "create_session", "close_session", "list_files",
         "read_file", "write_file", "wait_for_cell", "undo"}


def first_image(result):
    return next((c for c in result["content"] if c["type"] == "image"), None)


class McpCases:
    """Protocol cases for both transports. A subclass provides new_client() (not yet
    initialized) and self.c, one initialized 2025-11-25 client shared by the cases."""

    def fresh(self, version="2025-11-25"):
        c = self.new_client()
        c.initialize(version)
        return c

    # ---- handshake and discovery ----

    def test_handshake_for_each_version(self):
        for v in VERSIONS + ["1999-01-01"]:
            with self.subTest(version=v):
                c = self.new_client()
                result = c.initialize(v)
                want = v if v in VERSIONS else VERSIONS[0]
                self.assertEqual(result["protocolVersion"], want)
                self.assertEqual(result["serverInfo"]["name"], "runcell")
                self.assertIn("tools", result["capabilities"])
                self.assertIn("run_code", result["instructions"])
                tools = c.request("tools/list")["result"]["tools"]
                self.assertEqual({t["name"] for t in tools}, TOOLS)
                run = next(t for t in tools if t["name"] == "run_code")
                # answered in kind: what each version knows, and nothing newer
                self.assertEqual("annotations" in run, want != "2024-11-05")
                self.assertEqual("outputSchema" in run, want in ("2025-11-25", "2025-06-18"))
                self.assertEqual("title" in result["serverInfo"],
                                 want in ("2025-11-25", "2025-06-18"))
                self.assertEqual(c.request("ping")["result"], {})
                self.close_client(c)

    def test_tools_have_schemas(self):
        tools = {t["name"]: t for t in self.c.request("tools/list")["result"]["tools"]}
        self.assertEqual(set(tools), TOOLS)
        schema = tools["run_code"]["inputSchema"]
        self.assertEqual(schema["type"], "object")
        self.assertEqual(schema["required"], ["code"])
        self.assertEqual(set(schema["properties"]),
                         {"code", "language", "session_id", "timeout_s"})
        # Optional arguments may be null (their default); the required one may not.
        self.assertEqual(schema["properties"]["language"]["enum"],
                         ["python", "bash", "javascript", None])
        self.assertEqual(schema["properties"]["language"]["type"], ["string", "null"])
        self.assertEqual(schema["properties"]["code"]["type"], "string")
        self.assertFalse(schema["additionalProperties"])
        self.assertTrue(tools["read_file"]["annotations"]["readOnlyHint"])
        self.assertEqual(tools["run_code"]["outputSchema"]["required"],
                         ["session_id", "status"])

    # ---- running code ----

    def test_state_carries_between_calls(self):
        r1 = self.c.tool_result("run_code", {"code": "carried = 41"})
        self.assertFalse(r1["isError"], texts(r1))
        r2 = self.c.tool_result("run_code", {"code": "carried + 1"})
        self.assertFalse(r2["isError"], texts(r2))
        self.assertEqual(texts(r2), "42")
        s1, s2 = r1["structuredContent"], r2["structuredContent"]
        self.assertEqual(s1["session_id"], s2["session_id"])
        self.assertEqual(s2["execution_count"], s1["execution_count"] + 1)
        self.assertEqual(s2["results"], [{"text/plain": "42"}])

    def test_undo_takes_back_a_cell_that_broke_the_state(self):
        # the session's default history (3 cells) holds the state before each cell
        self.c.tool_result("run_code", {"code": "rows = [1, 2]\nopen('log.txt', 'w').write('a')"})
        bad = self.c.tool_result("run_code", {
            "code": "rows.append(3)\nopen('log.txt', 'a').write('b')\nopen('new.txt', 'w')\n1/0"})
        self.assertTrue(bad["isError"])
        count = bad["structuredContent"]["execution_count"]
        u = self.c.tool_result("undo")
        self.assertFalse(u["isError"], texts(u))
        st = u["structuredContent"]
        self.assertEqual(st["before"], count)
        self.assertEqual(st["execution_count"], count - 1)
        self.assertIn("back to its state before cell %d" % count, texts(u))
        self.assertEqual(sorted(st["files"]["restored"]), ["log.txt"])
        self.assertEqual(st["files"]["removed"], ["new.txt"])
        r = self.c.tool_result("run_code", {
            "code": "import os\n(rows, open('log.txt').read(), os.path.exists('new.txt'))"})
        self.assertEqual(texts(r), "([1, 2], 'a', False)")
        # back past what is kept (the last 3 cells): a tool error that says what is
        for i in range(4):
            self.c.tool_result("run_code", {"code": "step = %d" % i})
        far = self.c.tool_result("undo", {"before": count})
        self.assertTrue(far["isError"])
        self.assertIn("undo:", texts(far))
        for bad_arg in ({"before": -1}, {"before": 1.5}):
            e = self.c.tool_result("undo", bad_arg)
            self.assertTrue(e["isError"])
            self.assertIn("whole number", texts(e))

    def test_undo_needs_a_history(self):
        made = self.c.tool_result("create_session", {"history": 0})
        self.assertFalse(made["isError"], texts(made))
        sid = made["structuredContent"]["session_id"]
        self.c.tool_result("run_code", {"code": "x = 1", "session_id": sid})
        r = self.c.tool_result("undo", {"session_id": sid})
        self.assertTrue(r["isError"])
        self.assertIn("keeps no history", texts(r))
        e = self.c.tool_result("create_session", {"history": 101})
        self.assertTrue(e["isError"])
        self.assertIn("0 to 100", texts(e))
        self.c.tool_result("close_session", {"session_id": sid})

    def test_image_result(self):
        r = self.c.tool_result("run_code", {"code": (
            "import matplotlib.pyplot as plt\n"
            "plt.plot([1, 3, 2]); plt.title('trend')\n"
            "print('plotted')")})
        self.assertFalse(r["isError"], texts(r))
        img = first_image(r)
        self.assertIsNotNone(img, r["content"])
        self.assertEqual(img["mimeType"], "image/png")
        self.assertEqual(base64.b64decode(img["data"])[:8], b"\x89PNG\r\n\x1a\n")
        self.assertIn("plotted", texts(r))
        # the summary comes first, and a caption right before the image; the session and
        # the cell last
        self.assertEqual(r["content"][0], {"type": "text", "text": "plotted"})
        self.assertEqual(r["content"][-1]["text"], "[runcell] session %s, cell %d" % (
            r["structuredContent"]["session_id"], r["structuredContent"]["execution_count"]))
        caption = r["content"][r["content"].index(img) - 1]
        self.assertRegex(caption["text"], r"^figure 1: PNG, 640x480, \d+ KB$")
        # the record names the image instead of repeating its bytes
        bundle = r["structuredContent"]["results"][0]
        self.assertIn("sent as image content", bundle["image/png"])
        self.assertNotIn(img["data"][:100], json.dumps(r["structuredContent"]))

    def test_summary_is_one_text_part_trimmed_to_size(self):
        r = self.c.tool_result("run_code", {"code": (
            "print('\\n'.join('line %d' % i for i in range(20000)))\n"
            "import sys; print('warned', file=sys.stderr)\n"
            "{'a': 1}['b']")})
        self.assertTrue(r["isError"])
        self.assertEqual([c["type"] for c in r["content"]], ["text", "text"])
        text = r["content"][0]["text"]
        self.assertLess(len(text), 16000)  # of 64 KiB of output kept in the record
        self.assertTrue(text.startswith("line 0\nline 1\n"))
        self.assertIn("bytes of stdout not shown here", text)
        self.assertIn("line 19999\n", text)  # the tail is there
        self.assertIn("[stderr]\nwarned", text)
        self.assertTrue(text.rstrip().endswith("KeyError: 'b'"), text[-300:])
        self.assertIn("in the structured result", text)
        self.assertGreater(len(r["structuredContent"]["stdout"]), 60000)

    def test_error_result_sets_is_error(self):
        r = self.c.tool_result("run_code", {"code": "row = {'name': 'x'}\nrow['fare']"})
        self.assertTrue(r["isError"])
        self.assertIn("KeyError: 'fare'", texts(r))
        self.assertIn("<cell", texts(r))  # the traceback shows the cell's lines
        s = r["structuredContent"]
        self.assertEqual(s["status"], "error")
        self.assertEqual(s["error"]["name"], "KeyError")
        self.assertEqual(s["state"], "kept")
        # the model fixes the code: the session is fine
        r = self.c.tool_result("run_code", {"code": "row.get('fare', 0)"})
        self.assertFalse(r["isError"])
        self.assertEqual(texts(r), "0")

    def test_run_shell(self):
        r = self.c.tool_result("run_shell", {"command": "echo from-bash; pwd; exit 3"})
        self.assertTrue(r["isError"])
        self.assertIn("from-bash", texts(r))
        self.assertIn("/workspace", texts(r))
        self.assertEqual(r["structuredContent"]["exit_code"], 3)
        r = self.c.tool_result("run_code", {"code": "echo $((6 * 7))", "language": "bash"})
        self.assertFalse(r["isError"], texts(r))
        self.assertEqual(texts(r).strip(), "42")

    def test_timeout_interrupts_and_keeps_state(self):
        r = self.c.tool_result("run_code", {
            "code": "before_timeout = 'kept'\nimport time\ntime.sleep(60)", "timeout_s": 1})
        self.assertTrue(r["isError"])
        self.assertEqual(r["structuredContent"]["status"], "timeout")
        self.assertIn("timed out", texts(r))
        r = self.c.tool_result("run_code", {"code": "before_timeout"})
        self.assertEqual(texts(r), "'kept'")
        for tool, args in (("run_code", {"code": "1"}), ("create_session", {})):
            r = self.c.tool_result(tool, dict(args, timeout_s=10 ** 7))
            self.assertTrue(r["isError"])
            self.assertIn(tool + ": timeout_s 1e+07 is more than this server allows",
                          texts(r))

    def test_output_is_capped(self):
        r = self.c.tool_result("run_code", {"code": "print('y' * 300000)"})
        self.assertFalse(r["isError"])
        self.assertTrue(r["structuredContent"]["truncated"]["stdout"])
        self.assertIn("bytes of stdout not shown here", texts(r))
        self.assertIn("bytes of output dropped", r["structuredContent"]["stdout"])
        self.assertLess(len(texts(r)), 16000)

    # ---- progress and cancellation ----

    def test_progress_notifications(self):
        token = "progress-%d" % self.c.new_id()
        self.c.notifications.clear()
        code = ("import time\nfor i in range(3):\n"
                "    print('step', i, flush=True)\n    time.sleep(0.4)\n'finished'")
        resp = self.c.call_tool("run_code", {"code": code}, progress_token=token)
        self.assertEqual(texts(resp["result"]).splitlines()[-1], "'finished'")
        progress = [n["params"] for n in self.c.notifications
                    if n["method"] == "notifications/progress"]
        self.assertTrue(progress, "no progress notification")
        self.assertTrue(all(p["progressToken"] == token for p in progress))
        values = [p["progress"] for p in progress]
        self.assertEqual(values, sorted(set(values)), "progress must increase")
        self.assertIn("started", progress[0]["message"])
        self.assertTrue(any("step" in p.get("message", "") for p in progress))
        # no progress after the response: a later exchange brings none for this token
        seen = len(self.c.notifications)
        self.c.request("ping")
        self.assertEqual(len(self.c.notifications), seen)

    def test_cancel_interrupts_a_sleep(self):
        self.c.tool_result("run_code", {"code": "cancel_marker = 'before'"})
        rid = self.c.new_id()
        token = "cancel-%d" % rid
        t0 = time.time()
        outcome = self.start_cancellable(rid, token, (
            "import time\ncancel_marker = 'in cell'\nprint('sleeping', flush=True)\n"
            "time.sleep(120)\ncancel_marker = 'finished'"))
        self.c.notify("notifications/cancelled", {"requestId": rid, "reason": "test"})
        got_response = outcome()
        self.assertFalse(got_response, "a cancelled request must get no response")
        r = self.c.tool_result("run_code", {"code": "cancel_marker"})
        # interrupted in the sleep, not killed: the variable set before it is still there
        self.assertEqual(texts(r), "'in cell'")
        self.assertLess(time.time() - t0, 100)

    # ---- errors ----

    def test_unknown_method(self):
        resp = self.c.request("resources/templates/list")
        self.assertEqual(resp["error"]["code"], -32601)
        self.assertIn("resources/templates/list", resp["error"]["message"])

    def test_unknown_tool(self):
        resp = self.c.call_tool("delete_everything", {})
        self.assertEqual(resp["error"]["code"], -32602)
        self.assertIn("delete_everything", resp["error"]["message"])
        # The list in the message is the tools/list one.
        listed = [t["name"] for t in self.c.request("tools/list", {})["result"]["tools"]]
        self.assertIn("the tools are: " + ", ".join(listed), resp["error"]["message"])

    def test_bad_arguments_by_version(self):
        old = self.fresh("2025-06-18")
        resp = old.call_tool("run_code", {"code": 7})
        self.assertEqual(resp["error"]["code"], -32602)
        self.assertIn("'code' must be a string", resp["error"]["message"])
        resp = old.call_tool("run_code", {})
        self.assertIn("'code' is required", resp["error"]["message"])
        self.close_client(old)
        r = self.c.tool_result("run_code", {"code": "1", "language": "cobol"})
        self.assertTrue(r["isError"])  # since 2025-11-25: the model sees it and can fix it
        self.assertIn("language", texts(r))
        resp = self.c.request("tools/call", {"arguments": {}})
        self.assertEqual(resp["error"]["code"], -32602)

    # ---- files and sessions ----

    def test_files_round_trip(self):
        r = self.c.tool_result("write_file", {"path": "notes/in.txt", "content": "héllo\n"})
        self.assertFalse(r["isError"], texts(r))
        self.assertEqual(r["structuredContent"]["size"], len("héllo\n".encode()))
        r = self.c.tool_result("run_code", {"code": "open('notes/in.txt').read().upper()"})
        self.assertEqual(texts(r), "'HÉLLO\\n'")
        blob = bytes(range(256))
        self.c.tool_result("write_file", {"path": "/workspace/b.bin", "encoding": "base64",
                                          "content": base64.b64encode(blob).decode()})
        r = self.c.tool_result("read_file", {"path": "b.bin"})
        res = r["content"][0]
        self.assertEqual(res["type"], "resource")
        self.assertEqual(base64.b64decode(res["resource"]["blob"]), blob)
        self.assertEqual(res["resource"]["uri"], "file:///workspace/b.bin")
        r = self.c.tool_result("read_file", {"path": "./notes/in.txt"})
        self.assertEqual(r["content"], [{"type": "text", "text": "héllo\n"}])
        # The media types are the HTTP API's (one table): .py and .md are text, not blobs.
        for name, mime in (("s.py", "text/x-python"), ("r.md", "text/markdown")):
            self.c.tool_result("write_file", {"path": name, "content": "x = 1\n"})
            r = self.c.tool_result("read_file", {"path": name})
            self.assertEqual(r["structuredContent"]["mime_type"], mime, r)
        r = self.c.tool_result("list_files", {"path": "notes"})
        paths = [f["path"] for f in r["structuredContent"]["files"]]
        self.assertEqual(paths, ["notes/in.txt"])
        self.assertIn("notes/in.txt", texts(r))
        self.c.tool_result("run_code", {"code": (
            "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
            "plt.figure(); plt.plot([1, 2]); plt.savefig('chart.png'); plt.close('all')")})
        r = self.c.tool_result("read_file", {"path": "chart.png"})
        self.assertRegex(r["content"][0]["text"], r"^chart.png: PNG, 640x480, \d+ KB$")
        self.assertEqual(r["content"][1]["type"], "image")
        self.assertEqual(base64.b64decode(r["content"][1]["data"])[:4], b"\x89PNG")

    def test_file_errors(self):
        for path, words in (("missing.txt", "no file"), ("../../etc/passwd", "bad path"),
                            ("/etc/passwd", "bad path")):
            r = self.c.tool_result("read_file", {"path": path})
            self.assertTrue(r["isError"], path)
            self.assertIn(words, texts(r))
        self.c.tool_result("run_code", {"code": "import os\nos.symlink('/etc/passwd', 'link')"})
        r = self.c.tool_result("read_file", {"path": "link"})
        self.assertTrue(r["isError"])
        self.assertIn("symbolic link", texts(r))
        r = self.c.tool_result("write_file", {"path": "x.bin", "content": "%%%",
                                              "encoding": "base64"})
        self.assertTrue(r["isError"])
        self.assertIn("base64", texts(r))
        self.c.tool_result("run_code", {"code": "open('big.bin', 'wb').truncate(11 << 20)"})
        r = self.c.tool_result("read_file", {"path": "big.bin"})
        self.assertTrue(r["isError"])
        self.assertIn("more than the 10485760 read_file returns", texts(r))
        r = self.c.tool_result("write_file", {"path": "big2.txt", "content": "z" * (11 << 20)})
        self.assertTrue(r["isError"])
        self.assertIn("more than the 10485760", texts(r))

    def test_sessions_are_separate(self):
        r = self.c.tool_result("create_session", {"language": "python"})
        self.assertFalse(r["isError"], texts(r))
        sid = r["structuredContent"]["session_id"]
        self.assertIn(sid, texts(r))
        r = self.c.tool_result("run_code", {"code": "only_here = 1", "session_id": sid})
        self.assertEqual(r["structuredContent"]["session_id"], sid)
        r = self.c.tool_result("run_code", {"code": "only_here"})
        self.assertTrue(r["isError"])
        self.assertIn("NameError", texts(r))
        r = self.c.tool_result("close_session", {"session_id": sid})
        self.assertFalse(r["isError"])
        r = self.c.tool_result("run_code", {"code": "1", "session_id": sid})
        self.assertTrue(r["isError"])
        self.assertIn("no session", texts(r))
        r = self.c.tool_result("close_session", {"session_id": sid})
        self.assertTrue(r["isError"])

    def test_closing_the_default_session_starts_a_new_one(self):
        c = self.fresh()
        r = c.tool_result("run_code", {"code": "gone = 1"})
        sid = r["structuredContent"]["session_id"]
        c.tool_result("close_session", {"session_id": sid})
        r = c.tool_result("run_code", {"code": "'gone' in dir()"})
        self.assertEqual(texts(r), "False")
        self.assertNotEqual(r["structuredContent"]["session_id"], sid)
        self.close_client(c)


class StdioTest(McpCases, RuncellTestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = StdioClient(RUNCELL)
        cls.c.initialize("2025-11-25")

    @classmethod
    def tearDownClass(cls):
        status = cls.c.close()
        cls.c.kill()
        assert status == 0, "runcell mcp exited %s: %s" % (status, cls.c.stderr[-2000:])
        assert not cls.c.bad_lines, "stdout carried more than protocol: %r" % cls.c.bad_lines

    def new_client(self):
        c = StdioClient(RUNCELL)
        self.addCleanup(c.kill)
        return c

    def close_client(self, c):
        self.assertEqual(c.close(), 0, c.stderr)

    def test_pipelined_calls_on_a_session_run_in_arrival_order(self):
        # Written at once, as a client that pipelines sends them: each waits for the one
        # before on its session, and a record lists only the files its own cell changed
        # (not the write_file that came next).
        c = self.new_client()
        c.initialize("2025-11-25")
        sid = c.tool_result("create_session")["structuredContent"]["session_id"]
        for args in ({}, {"session_id": sid}):
            first = ("import time\nlog = []\ntime.sleep(0.5)\n"
                     "open('mine.txt', 'w').write('1')\nlog.append(1)")
            calls = [("run_code", dict(args, code=first)),
                     ("write_file", dict(args, path="theirs.txt", content="from write_file")),
                     ("run_code", dict(args, code="log.append(2)\nopen('theirs.txt').read()")),
                     ("run_shell", dict(args, command="echo 3 > shell.txt")),
                     ("list_files", dict(args)),
                     ("run_code", dict(args, code="log.append(4)\nlog"))]
            resp, order = c.pipeline(calls)
            self.assertEqual(order, list(range(len(calls))))
            for r in resp:
                self.assertFalse(r["result"].get("isError"), r)
            rec = [r["result"].get("structuredContent") for r in resp]
            self.assertEqual(rec[0]["files"], {"created": ["mine.txt"], "modified": [],
                                               "deleted": []})
            self.assertEqual(rec[2]["results"][0]["text/plain"], "'from write_file'")
            self.assertEqual(rec[2]["files"]["created"], [])
            self.assertEqual(rec[3]["files"]["created"], ["shell.txt"])
            self.assertIn("shell.txt", [f["path"] for f in rec[4]["files"]])
            self.assertEqual(rec[5]["results"][0]["text/plain"], "[1, 2, 4]")
            for name in ("mine.txt", "theirs.txt", "shell.txt"):
                c.tool_result("run_shell", dict(args, command="rm " + name))
        # Calls on two sessions do not wait for each other: the default's quick call is
        # answered while the other session's cell still sleeps (it is cancelled after).
        slow, quick = c.new_id(), c.new_id()
        c.send_raw("".join(json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                                       "params": {"name": "run_code", "arguments": args}}) + "\n"
                           for rid, args in ((slow, {"session_id": sid, "code":
                                                     "import time; time.sleep(600)"}),
                                             (quick, {"code": "'quick'"}))))
        seen = []
        c.wait_for(lambda m: seen.append(m.get("id")) or m.get("id") == quick)
        self.assertNotIn(slow, seen)
        c.notify("notifications/cancelled", {"requestId": slow})
        self.close_client(c)

    def test_a_queued_call_that_is_cancelled_never_runs(self):
        c = self.new_client()
        c.initialize("2025-11-25")
        c.tool_result("run_code", {"code": "ran = []"})
        busy, queued, after = c.new_id(), c.new_id(), c.new_id()
        c.send_raw("".join(json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                                       "params": {"name": "run_code", "arguments": {"code": code}}})
                           + "\n" for rid, code in (
                               (busy, "import time\nprint('busy', flush=True)\ntime.sleep(600)"),
                               (queued, "ran.append('queued')"))))
        # The queued call waits behind the sleeping one; cancel it, then the sleeper.
        c.notify("notifications/cancelled", {"requestId": queued})
        c.notify("notifications/cancelled", {"requestId": busy})
        c.send({"jsonrpc": "2.0", "id": after, "method": "tools/call",
                "params": {"name": "run_code", "arguments": {"code": "ran"}}})
        seen = []
        r = c.wait_for(lambda m: seen.append(m.get("id")) or m.get("id") == after)
        self.assertEqual(r["result"]["structuredContent"]["results"][0]["text/plain"], "[]")
        self.assertNotIn(queued, seen)
        self.assertNotIn(busy, seen)
        self.close_client(c)

    def start_cancellable(self, rid, token, code):
        self.c.notifications.clear()
        self.c.send({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                     "params": {"name": "run_code", "arguments": {"code": code},
                                "_meta": {"progressToken": token}}})
        # the cell is in its sleep once it said so
        self.c.wait_for(lambda m: m.get("method") == "notifications/progress" and
                        "sleeping" in m["params"].get("message", ""))

        def outcome():
            ping = self.c.request("ping")  # answered while the reader is free...
            self.assertEqual(ping["result"], {})
            # ...and the cancelled call never answers: the next response is the next call's
            seen = []
            probe = self.c.new_id()
            self.c.send({"jsonrpc": "2.0", "id": probe, "method": "tools/call",
                         "params": {"name": "run_code", "arguments": {"code": "'probe'"}}})
            self.c.wait_for(lambda m: seen.append(m) or m.get("id") == probe)
            return any(m.get("id") == rid for m in seen)
        return outcome

    def test_stdout_carries_only_protocol(self):
        r = self.c.tool_result("run_code", {"code": (
            "import os, subprocess, sys\nos.write(1, b'low-level\\n')\n"
            "subprocess.run(['echo', 'child'])\nprint('to stderr', file=sys.stderr)")})
        self.assertIn("low-level", texts(r))
        self.assertIn("child", texts(r))
        self.assertIn("to stderr", texts(r))
        self.assertEqual(self.c.bad_lines, [])

    def test_malformed_json(self):
        self.c.send_raw("{this is not json\n")
        resp = self.c.wait_for(lambda m: "error" in m and m.get("id") is None)
        self.assertEqual(resp["error"]["code"], -32700)
        self.assertIn("parse error", resp["error"]["message"])
        self.c.send_raw('"a string"\n')
        resp = self.c.wait_for(lambda m: "error" in m and m.get("id") is None)
        self.assertEqual(resp["error"]["code"], -32600)
        self.assertEqual(self.c.request("ping")["result"], {})  # still serving

    def test_oversized_line_is_refused(self):
        self.c.send_raw(b'{"jsonrpc":"2.0","id":1,"method":"' + b"x" * (33 << 20) + b'"}\n')
        resp = self.c.wait_for(lambda m: "error" in m and m.get("id") is None)
        self.assertEqual(resp["error"]["code"], -32600)
        self.assertIn("limit", resp["error"]["message"])
        self.assertEqual(self.c.request("ping")["result"], {})

    def test_request_before_initialize(self):
        c = self.new_client()
        resp = c.request("tools/list")
        self.assertEqual(resp["error"]["code"], -32600)
        self.assertIn("initialize", resp["error"]["message"])
        c.initialize("2025-11-25")
        resp = c.request("initialize", {"protocolVersion": "2025-11-25"})
        self.assertIn("already initialized", resp["error"]["message"])
        self.close_client(c)

    def test_batch_in_2025_03_26(self):
        c = self.fresh("2025-03-26")
        c.send([{"jsonrpc": "2.0", "id": 50, "method": "ping"},
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                {"jsonrpc": "2.0", "id": 51, "method": "tools/call",
                 "params": {"name": "run_code", "arguments": {"code": "6 * 7"}}}])
        batch = c.wait_for(lambda m: isinstance(m, list))
        self.assertEqual(sorted(m["id"] for m in batch), [50, 51])
        call = next(m for m in batch if m["id"] == 51)
        self.assertEqual(texts(call["result"]), "42")
        self.assertNotIn("structuredContent", call["result"])  # not in 2025-03-26
        self.close_client(c)

    def test_exits_cleanly_when_stdin_closes(self):
        c = self.fresh()
        c.tool_result("run_code", {"code": "1"})
        t0 = time.time()
        self.assertEqual(c.close(), 0)
        self.assertLess(time.time() - t0, 60)
        self.assertNotIn(b"error", c.stderr.lower())

    def test_running_call_finishes_after_stdin_closes(self):
        c = self.fresh()
        c.send({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
            "name": "run_code",
            "arguments": {"code": "import time\ntime.sleep(1)\n'answered after eof'"}}})
        c.proc.stdin.close()
        resp = c.response_to(9)
        self.assertEqual(texts(resp["result"]), "'answered after eof'")
        self.assertEqual(c.proc.wait(60), 0)

    def test_sigterm_interrupts_running_calls(self):
        c = self.fresh()
        c.send({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
            "name": "run_code", "arguments": {"code": "print('in', flush=True)\n"
                                              "import time\ntime.sleep(300)"},
            "_meta": {"progressToken": 1}}})
        c.wait_for(lambda m: m.get("method") == "notifications/progress" and
                   m["params"].get("message") == "in")
        c.proc.send_signal(signal.SIGTERM)
        self.assertEqual(c.proc.wait(60), 0)

    def test_a_cell_past_the_reply_deadline_answers_with_a_run_id(self):
        c = StdioClient(RUNCELL, "--reply-deadline", "1")
        self.addCleanup(c.kill)
        c.initialize()
        r = c.tool_result("run_code", {"timeout_s": 60, "code": (
            "import time\nlong_mark = 'started'\nprint('working', flush=True)\n"
            "time.sleep(4)\nlong_mark = 'done'\n'the end'")})
        self.assertFalse(r["isError"])
        s = r["structuredContent"]
        self.assertEqual(s["status"], "running")
        self.assertIn("wait_for_cell", texts(r))
        self.assertIn(s["run_id"], texts(r))
        self.assertIn("working", texts(r))
        # the session is busy with it: a call on it waits for the cell, in order
        waits = []
        while True:
            w = c.tool_result("wait_for_cell", {"run_id": s["run_id"]})
            waits.append(w)
            if w["structuredContent"]["status"] != "running":
                break
            self.assertLess(len(waits), 100)
        self.assertGreater(len(waits), 1)  # each wait ends after the deadline
        self.assertEqual(texts(w).splitlines()[-1], "'the end'")
        self.assertIn("working", texts(w))
        self.assertEqual(texts(c.tool_result("run_code", {"code": "long_mark"})), "'done'")
        # asking again gives the same result; an unknown run is a tool error
        again = c.tool_result("wait_for_cell", {"run_id": s["run_id"]})
        self.assertEqual(texts(again), texts(w))
        bad = c.tool_result("wait_for_cell", {"run_id": "nope"})
        self.assertTrue(bad["isError"])
        self.assertIn("no run nope", texts(bad))
        self.close_client(c)

    def test_idle_sessions_expire_when_asked(self):
        c = StdioClient(RUNCELL, "--idle-timeout", "1")
        self.addCleanup(c.kill)
        c.initialize()
        c.tool_result("run_code", {"code": "idle_var = 1"})
        deadline = time.time() + 60
        while True:
            time.sleep(1.5)
            r = c.tool_result("run_code", {"code": "'idle_var' in dir()"})
            if "note" in texts(r) or time.time() > deadline:
                break
        self.assertIn("expired", texts(r))
        self.assertIn("False", texts(r))
        self.close_client(c)

    def test_calls_in_flight_are_capped(self):
        c = self.fresh()
        ids = [c.new_id() for _ in range(16)]
        for rid in ids:  # the first sleeps; the others wait for the session
            c.send({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {
                "name": "run_code", "arguments": {"code": "import time\ntime.sleep(120)"}}})
        resp = c.call_tool("run_code", {"code": "1"})
        self.assertEqual(resp["error"]["code"], -32000)
        self.assertIn("16 tool calls", resp["error"]["message"])
        for rid in ids:
            c.notify("notifications/cancelled", {"requestId": rid})
        deadline = time.time() + 60
        while True:  # the slots free up once the cancelled calls are gone
            r = c.call_tool("run_code", {"code": "'free again'"})
            if "result" in r or time.time() > deadline:
                break
            time.sleep(0.2)
        self.assertEqual(texts(r["result"]), "'free again'")
        self.close_client(c)

    def test_usage_errors(self):
        from rctest import runcell
        p = runcell("mcp", "--file", "x")
        self.assertEqual(p.returncode, 2)
        self.assertIn("do not apply", p.stderr)
        p = runcell("mcp", "--help")
        self.assertEqual(p.returncode, 0)
        self.assertIn("stdin", p.stdout)
        # No packages (nothing would report what pip did); --net and --secret are taken
        # (tests/integration/test_secrets.py).
        for args, opt in ((["--package", "tinypkg"], "--package"),
                          (["--index-url", "http://127.0.0.1:9/simple"], "--index-url"),
                          (["--install-timeout", "5"], "--install-timeout")):
            p = runcell("mcp", *args, input="")
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertEqual(p.stdout, "")
            self.assertIn("runcell mcp: " + opt, p.stderr)
            self.assertIn("not supported by runcell mcp", p.stderr)


class HttpTest(McpCases, RuncellTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = ServeProcess("--allow-origin", "https://app.example.com")
        cls.server.__enter__()
        cls.c = HttpClient(cls.server.port, cls.server.token)
        cls.c.initialize("2025-11-25")

    @classmethod
    def tearDownClass(cls):
        cls.c.delete()
        cls.server.__exit__()
        assert cls.server.status == 0, "runcell serve exited %s: %s" % (
            cls.server.status, cls.server.last_output[-3000:])

    def new_client(self, **kw):
        return HttpClient(self.server.port, self.server.token, **kw)

    def close_client(self, c):
        self.assertEqual(c.delete().status, 204)

    def start_cancellable(self, rid, token, code):
        sleeping = threading.Event()
        box = {}

        def on_event(msg):
            if "sleeping" in msg.get("params", {}).get("message", ""):
                sleeping.set()

        def post():
            box["r"] = self.c.http("POST", {
                "jsonrpc": "2.0", "id": rid, "method": "tools/call",
                "params": {"name": "run_code", "arguments": {"code": code},
                           "_meta": {"progressToken": token}}}, on_event=on_event)
        t = threading.Thread(target=post)
        t.start()
        self.assertTrue(sleeping.wait(120), "the cell never started")

        def outcome():
            t.join(120)
            self.assertFalse(t.is_alive())
            r = box["r"]
            self.assertEqual(r.status, 200)
            self.assertTrue(r.header("Content-Type").startswith("text/event-stream"))
            return any(m.get("id") == rid and "method" not in m for m in r.messages)
        return outcome

    def raw(self, method, body=None, headers=None, session=True, token=True):
        c = self.new_client()
        if session:
            c.session, c.version = self.c.session, self.c.version
        if not token:
            c.token = None
        return c.http(method, body, headers)

    def test_malformed_json(self):
        r = self.raw("POST", "{this is not json")
        self.assertEqual(r.status, 400)
        self.assertEqual(r.messages[0]["error"]["code"], -32700)

    def test_notification_is_accepted_without_body(self):
        r = self.raw("POST", {"jsonrpc": "2.0", "method": "notifications/initialized"})
        self.assertEqual(r.status, 202)
        self.assertEqual(r.body, "")

    def test_json_only_client_gets_json(self):
        c = self.new_client(accept="application/json")
        c.initialize()
        resp = c.call_tool("run_code", {"code": "'json'"}, progress_token="t")
        self.assertEqual(texts(resp["result"]), "'json'")
        self.assertTrue(c.last_http.header("Content-Type").startswith("application/json"))
        self.close_client(c)

    def test_session_rules(self):
        ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        r = self.raw("POST", ping, session=False)
        self.assertEqual(r.status, 400)
        self.assertIn("Mcp-Session-Id", r.messages[0]["error"]["message"])
        r = self.raw("POST", ping, {"Mcp-Session-Id": "0123456789abcdef"})
        self.assertEqual(r.status, 404)
        r = self.raw("POST", ping, {"MCP-Protocol-Version": "2023-01-01"})
        self.assertEqual(r.status, 400)
        self.assertIn("MCP-Protocol-Version", r.messages[0]["error"]["message"])
        r = self.raw("POST", ping, {"Content-Type": "text/plain"})
        self.assertEqual(r.status, 415)
        r = self.raw("PUT", ping)
        self.assertEqual(r.status, 405)
        r = self.raw("POST", {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                              "params": {}}, session=False)
        self.assertEqual(r.status, 400)
        self.assertEqual(r.messages[0]["error"]["code"], -32602)
        self.assertIsNone(r.header("Mcp-Session-Id"))

    def test_token_required(self):
        r = self.raw("POST", {"jsonrpc": "2.0", "id": 1, "method": "ping"}, token=False)
        self.assertEqual(r.status, 401)
        r = self.raw("POST", {"jsonrpc": "2.0", "id": 1, "method": "ping"},
                     {"Authorization": "Bearer wrong-token-0123456789"})
        self.assertEqual(r.status, 401)

    def test_origin_checked(self):
        ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        r = self.raw("POST", ping, {"Origin": "http://evil.example"})
        self.assertEqual(r.status, 403)
        self.assertIn("evil.example", r.messages[0]["error"]["message"])
        for bad in ("http://127.0.0.1.evil.example", "http://localhost.evil.example", "null",
                    "http://[::1", "file://localhost", "https://app.example.com.evil"):
            r = self.raw("POST", ping, {"Origin": bad})
            self.assertEqual(r.status, 403, bad)
        for ok in ("http://localhost:6274", "http://127.0.0.1", "https://app.example.com",
                   "http://[::1]:8080", "HTTP://LOCALHOST"):
            r = self.raw("POST", ping, {"Origin": ok})
            self.assertEqual(r.status, 200, ok)

    def test_get_stream_and_delete(self):
        c = self.fresh()
        r = c.tool_result("run_code", {"code": "1"})
        runcell_session = r["structuredContent"]["session_id"]
        opened, box = threading.Event(), {}

        def listen():
            conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=120)
            h = c.headers({"Accept": "text/event-stream", "Content-Type": None})
            conn.request("GET", "/mcp", headers=h)
            resp = conn.getresponse()
            box["status"], box["type"] = resp.status, resp.getheader("Content-Type")
            opened.set()
            box["body"] = resp.read().decode()
            conn.close()
        t = threading.Thread(target=listen)
        t.start()
        self.assertTrue(opened.wait(60))
        self.assertEqual(box["status"], 200)
        self.assertTrue(box["type"].startswith("text/event-stream"))
        second = c.http("GET", headers={"Accept": "text/event-stream"})
        self.assertEqual(second.status, 409)
        self.assertEqual(c.delete().status, 204)
        t.join(60)
        self.assertFalse(t.is_alive(), "the GET stream did not end with its session")
        r = c.http("POST", {"jsonrpc": "2.0", "id": 3, "method": "ping"})
        self.assertEqual(r.status, 404)
        # the runcell session the MCP session made is closed with it
        req = urllib.request.Request(
            "http://127.0.0.1:%d/v1/sessions/%s" % (self.server.port, runcell_session),
            headers={"Authorization": "Bearer " + self.server.token})
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        self.assertEqual(e.exception.code, 404)

    def test_a_session_used_back_to_back_is_kept(self):
        # Each request's handler stamps the session's last use as it lets go of it, after
        # its client has the answer; the next request may read the clock before that stamp
        # and check idleness after it. That once read as idle for ever: 404 mid-conversation.
        c = self.fresh()
        failures = []

        def converse(n):
            peer = self.new_client()
            peer.session, peer.version = c.session, c.version
            for i in range(n):
                msg = ({"jsonrpc": "2.0", "id": i + 2, "method": "ping"} if i % 2 else
                       {"jsonrpc": "2.0", "id": i + 2, "method": "tools/call", "params": {
                           "name": "close_session", "arguments": {"session_id": "none"}}})
                r = peer.http("POST", msg)
                if r.status != 200:
                    failures.append((i, r.status, r.body[:300]))
                    return
        threads = [threading.Thread(target=converse, args=(150,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
            self.assertFalse(t.is_alive())
        self.assertEqual(failures, [])
        self.close_client(c)

    def test_sessions_are_shared_with_the_api(self):
        r = self.c.tool_result("create_session", {})
        sid = r["structuredContent"]["session_id"]
        req = urllib.request.Request(
            "http://127.0.0.1:%d/v1/sessions/%s" % (self.server.port, sid),
            headers={"Authorization": "Bearer " + self.server.token})
        with urllib.request.urlopen(req, timeout=30) as resp:
            self.assertEqual(json.load(resp)["id"], sid)
        self.c.tool_result("close_session", {"session_id": sid})


class ModernCases:
    """Revision 2026-07-28 on both transports. A subclass provides new_client(modern=...) and
    self.m, one modern client shared by the cases."""

    def test_discover(self):
        r = self.m.request("server/discover")["result"]
        self.assertEqual(r["resultType"], "complete")
        self.assertEqual(r["supportedVersions"][0], MODERN)
        self.assertIn("2025-11-25", r["supportedVersions"])
        self.assertEqual(r["capabilities"]["extensions"], {"io.modelcontextprotocol/tasks": {}})
        self.assertIn("tools", r["capabilities"])
        self.assertEqual((r["ttlMs"], r["cacheScope"]), (3600000, "public"))
        self.assertEqual(r["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "runcell")
        self.assertIn("create_session", r["instructions"])
        self.assertIn("JavaScript", r["instructions"])

    def test_tools_list_is_cacheable_and_takes_handles(self):
        r = self.m.request("tools/list")["result"]
        self.assertEqual((r["resultType"], r["ttlMs"], r["cacheScope"]),
                         ("complete", 3600000, "public"))
        tools = {t["name"]: t for t in r["tools"]}
        self.assertEqual(set(tools), TOOLS)
        for name, t in tools.items():
            required = t["inputSchema"]["required"]
            self.assertEqual("session_id" in required,
                             name not in ("create_session", "wait_for_cell"), name)
        # deterministic order: the same list twice
        self.assertEqual(self.m.request("tools/list")["result"]["tools"], r["tools"])
        self.assertIn("without a call", tools["create_session"]["description"])

    def test_state_lives_in_a_session_handle(self):
        sid = self.m.new_session()
        r1 = self.m.tool_result("run_code", {"code": "handled = 41", "session_id": sid})
        self.assertEqual(r1["resultType"], "complete")
        r2 = self.m.tool_result("run_code", {"code": "handled + 1", "session_id": sid})
        self.assertEqual(texts(r2), "42")
        # A second client of the same server reaches the same state through the handle alone.
        other = self.new_client(modern=True)
        r3 = other.tool_result("run_code", {"code": "handled", "session_id": sid})
        self.assertEqual(texts(r3), "41")
        self.close_client(other)
        # without a handle the model is told what to do
        r = self.m.tool_result("run_code", {"code": "1"})
        self.assertTrue(r["isError"])
        self.assertIn("session_id' is required", texts(r))
        self.assertIn("create_session", texts(r))
        self.m.tool_result("close_session", {"session_id": sid})
        r = self.m.tool_result("run_code", {"code": "1", "session_id": sid})
        self.assertTrue(r["isError"])
        self.assertIn("create_session", texts(r))
        self.assertNotIn("default session", texts(r))

    def test_removed_methods_and_bad_versions(self):
        for method in ("ping", "logging/setLevel", "resources/list"):
            resp = self.m.request(method, {"level": "info"} if "Level" in method else None)
            self.assertEqual(resp["error"]["code"], -32601, method)
            self.assert_status(404)
        params = {"_meta": self.m.meta({"io.modelcontextprotocol/protocolVersion": "2099-01-01"})}
        resp = self.m.request("tools/list", params, headers={"MCP-Protocol-Version": "2099-01-01"})
        self.assertEqual(resp["error"]["code"], -32022)
        self.assertEqual(resp["error"]["data"]["requested"], "2099-01-01")
        self.assertEqual(resp["error"]["data"]["supported"][0], MODERN)
        self.assert_status(400)
        # clientCapabilities is required on every request
        meta = self.m.meta()
        del meta["io.modelcontextprotocol/clientCapabilities"]
        resp = self.m.request("tools/list", {"_meta": meta}, meta=False)
        self.assertEqual(resp["error"]["code"], -32602)
        self.assertIn("clientCapabilities", resp["error"]["message"])
        self.assert_status(400)
        meta = self.m.meta({"io.modelcontextprotocol/logLevel": "loud"})
        resp = self.m.request("tools/list", {"_meta": meta})
        self.assertEqual(resp["error"]["code"], -32602)
        # server/discover of a client that forgot _meta
        resp = self.m.request("server/discover", meta=False,
                              headers={"MCP-Protocol-Version": None})
        self.assertEqual(resp["error"]["code"], -32602)

    def test_both_eras_on_one_endpoint(self):
        sid = self.legacy_default_session("both_eras = 'set by a 2025-11-25 client'")
        # the legacy client's default session is a handle like any other
        r = self.m.tool_result("run_code", {"code": "both_eras", "session_id": sid})
        self.assertEqual(texts(r), "'set by a 2025-11-25 client'")

    def test_progress_on_the_modern_era(self):
        sid = self.m.new_session()
        self.m.notifications.clear()
        resp = self.m.call_tool("run_code", {"session_id": sid, "code": (
            "import time\nprint('one', flush=True)\ntime.sleep(1.5)\n'done'")},
            progress_token="modern-progress")
        self.assertEqual(texts(resp["result"]).splitlines()[-1], "'done'")
        progress = [n["params"] for n in self.m.notifications
                    if n["method"] == "notifications/progress"]
        self.assertTrue(progress)
        self.assertTrue(all(p["progressToken"] == "modern-progress" for p in progress))

    # ---- the tasks extension ----

    def tasks_client(self):
        c = self.new_client(modern=True)
        if c is self.m:  # stdio: one process; declare the extension for these cases only
            self.addCleanup(setattr, c, "capabilities", dict(c.capabilities))
        c.capabilities = {"extensions": {"io.modelcontextprotocol/tasks": {}}}
        return c

    def poll(self, c, task_id, until=("completed", "failed", "cancelled")):
        deadline = time.time() + 120
        while True:
            r = c.request("tasks/get", {"taskId": task_id})["result"]
            if r["status"] in until or time.time() > deadline:
                return r
            time.sleep(r.get("pollIntervalMs", 1000) / 1000.0)

    def test_a_long_call_becomes_a_task(self):
        c = self.tasks_client()
        sid = c.new_session()
        quick = c.tool_result("run_code", {"session_id": sid, "code": "'quick'"})
        self.assertEqual(quick["resultType"], "complete")  # short calls answer as before
        r = c.tool_result("run_code", {"session_id": sid, "code": (
            "import time\nfor i in range(4):\n    print('step', i, flush=True)\n"
            "    time.sleep(1)\n'all done'")})
        self.assertEqual(r["resultType"], "task", r)
        self.assertEqual(r["status"], "working")
        self.assertGreaterEqual(r["ttlMs"], 3600000)
        task = r["taskId"]
        self.assertRegex(task, "^[0-9a-f]{32}$")
        # while it runs: its latest output is readable
        got = self.poll(c, task, until=("working",))
        for _ in range(60):
            if "step" in got["statusMessage"] or got["status"] != "working":
                break
            time.sleep(0.5)
            got = c.request("tasks/get", {"taskId": task})["result"]
        if got["status"] == "working":
            self.assertIn("last output: step", got["statusMessage"])
            self.assertIn("step 0", got["_meta"]["runcell/output"]["stdout"])
        done = self.poll(c, task)
        self.assertEqual(done["status"], "completed")
        self.assertEqual(done["resultType"], "complete")
        self.assertFalse(done["result"]["isError"])
        self.assertTrue(texts(done["result"]).endswith("'all done'"))
        self.assertIn("step 3", texts(done["result"]))
        # the task is still there for the next poll (idempotent reads)
        again = c.request("tasks/get", {"taskId": task})["result"]
        self.assertEqual(again["result"], done["result"])
        r = c.request("tasks/update", {"taskId": task, "inputResponses": {"x": {}}})
        self.assertEqual(r["result"]["resultType"], "complete")

    def test_cancelling_a_task_interrupts_the_cell_and_keeps_state(self):
        c = self.tasks_client()
        sid = c.new_session()
        r = c.tool_result("run_code", {"session_id": sid, "code": (
            "import time\nmark = 'in cell'\nprint('sleeping', flush=True)\n"
            "time.sleep(300)\nmark = 'finished'")})
        self.assertEqual(r["resultType"], "task", r)
        ack = c.request("tasks/cancel", {"taskId": r["taskId"]})
        self.assertEqual(ack["result"]["resultType"], "complete")
        done = self.poll(c, r["taskId"])
        self.assertEqual(done["status"], "cancelled")
        self.assertIn("kept", done["statusMessage"])
        after = c.tool_result("run_code", {"session_id": sid, "code": "mark"})
        self.assertEqual(texts(after), "'in cell'")

    def test_task_errors(self):
        c = self.tasks_client()
        resp = c.request("tasks/get", {"taskId": "0" * 32})
        self.assertEqual(resp["error"]["code"], -32602)
        self.assertIn("no task", resp["error"]["message"])
        # a client that did not declare the extension gets none of it
        plain = self.m.meta({"io.modelcontextprotocol/clientCapabilities": {}})
        resp = c.request("tasks/get", {"taskId": "0" * 32, "_meta": plain}, meta=False)
        self.assertEqual(resp["error"]["code"], -32021)
        self.assertEqual(resp["error"]["data"]["requiredCapabilities"],
                         {"extensions": {"io.modelcontextprotocol/tasks": {}}})
        self.assert_status(400, c)
        sid = c.new_session()
        r = c.request("tools/call", {"name": "run_code", "_meta": plain, "arguments": {
            "session_id": sid, "code": "import time\ntime.sleep(3)\n'no task for me'"}},
            meta=False)["result"]
        self.assertEqual(r["resultType"], "complete")
        self.assertEqual(texts(r), "'no task for me'")


class StdioModernTest(ModernCases, RuncellTestCase):
    @classmethod
    def setUpClass(cls):
        cls.m = StdioClient(RUNCELL, modern=True)

    @classmethod
    def tearDownClass(cls):
        status = cls.m.close()
        cls.m.kill()
        assert status == 0, "runcell mcp exited %s: %s" % (status, cls.m.stderr[-2000:])
        assert not cls.m.bad_lines, cls.m.bad_lines

    def new_client(self, modern=False):
        if modern:
            return self.m  # one process: the stdio server is one client's
        c = StdioClient(RUNCELL)
        self.addCleanup(c.kill)
        return c

    def close_client(self, c):
        if c is not self.m:
            self.assertEqual(c.close(), 0, c.stderr)

    def legacy_default_session(self, code):
        # One process, both eras: initialize makes it a legacy connection too, and requests
        # with the modern _meta are still served on the modern era.
        c = StdioClient(RUNCELL, modern=True)
        self.addCleanup(c.kill)
        legacy = {"meta": False, "revision": "2025-11-25"}
        c.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {}}, **legacy)
        r = c.request("tools/call", {"name": "run_code", "arguments": {"code": code}}, **legacy)
        self.assertNotIn("resultType", r["result"])
        sid = r["result"]["structuredContent"]["session_id"]
        r = c.request("tools/list")["result"]
        self.assertEqual(r["resultType"], "complete")  # modern still
        self.m = c  # the session lives in this process
        self.addCleanup(setattr, self, "m", type(self).m)
        return sid

    def assert_status(self, status, client=None):
        pass  # stdio has no status beside the error

    def test_cancel_by_notification(self):
        sid = self.m.new_session()
        self.m.tool_result("run_code", {"session_id": sid, "code": "mark = 'before'"})
        rid = self.m.new_id()
        self.m.pending[rid] = ("tools/call", MODERN)
        self.m.send({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": self.m.with_meta(
            "tools/call", {"name": "run_code", "arguments": {"session_id": sid, "code": (
                "import time\nmark = 'in cell'\nprint('sleeping', flush=True)\n"
                "time.sleep(120)")}, "_meta": {"progressToken": "c"}})})
        self.m.wait_for(lambda m: m.get("method") == "notifications/progress" and
                        "sleeping" in m["params"].get("message", ""))
        self.m.notify("notifications/cancelled", {"requestId": rid})
        seen = []
        probe = self.m.new_id()
        self.m.pending[probe] = ("tools/call", MODERN)
        self.m.send({"jsonrpc": "2.0", "id": probe, "method": "tools/call", "params":
                     self.m.with_meta("tools/call", {"name": "run_code", "arguments": {
                         "session_id": sid, "code": "mark"}})})
        r = self.m.wait_for(lambda m: seen.append(m.get("id")) or m.get("id") == probe)
        self.assertNotIn(rid, seen)
        self.assertEqual(texts(r["result"]), "'in cell'")


class HttpModernTest(ModernCases, RuncellTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = ServeProcess()
        cls.server.__enter__()
        cls.m = HttpClient(cls.server.port, cls.server.token, modern=True)

    @classmethod
    def tearDownClass(cls):
        cls.server.__exit__()
        assert cls.server.status == 0, cls.server.last_output[-3000:]

    def new_client(self, modern=False, **kw):
        return HttpClient(self.server.port, self.server.token, modern=modern, **kw)

    def close_client(self, c):
        if c.session:
            self.assertEqual(c.delete().status, 204)

    def assert_status(self, status, client=None):
        last = (client or self.m).last_http
        self.assertEqual(last.status, status, last.body)

    def legacy_default_session(self, code):
        legacy = self.new_client()
        legacy.initialize("2025-11-25")
        r = legacy.tool_result("run_code", {"code": code})
        self.assertNotIn("resultType", r)
        self.addCleanup(self.close_client, legacy)
        return r["structuredContent"]["session_id"]

    def post(self, body, headers):
        c = self.new_client()
        return c.http("POST", body, headers=headers)

    def discover(self, **params):
        return {"jsonrpc": "2.0", "id": 7, "method": "server/discover",
                "params": dict({"_meta": self.m.meta()}, **params)}

    def call(self, name, args):
        return {"jsonrpc": "2.0", "id": 8, "method": "tools/call",
                "params": {"name": name, "arguments": args, "_meta": self.m.meta()}}

    def assert_mismatch(self, r, words):
        self.assertEqual(r.status, 400, r.body)
        err = r.messages[0]["error"]
        self.assertEqual(err["code"], -32020, r.body)
        self.assertIn(words, err["message"])
        self.assertEqual(r.messages[0]["id"], json.loads(json.dumps(r.messages[0]["id"])))

    def test_request_headers_are_checked(self):
        v = {"MCP-Protocol-Version": MODERN}
        r = self.post(self.discover(), v)
        self.assert_mismatch(r, "Mcp-Method header is missing")
        r = self.post(self.discover(), dict(v, **{"Mcp-Method": "tools/list"}))
        self.assert_mismatch(r, "does not match body value 'server/discover'")
        r = self.post(self.discover(), {"Mcp-Method": "server/discover"})
        self.assert_mismatch(r, "MCP-Protocol-Version header is missing")
        r = self.post(self.discover(), {"Mcp-Method": "server/discover",
                                        "MCP-Protocol-Version": "2025-11-25"})
        self.assert_mismatch(r, "does not match body value '2026-07-28'")
        call = self.call("create_session", {})
        h = dict(v, **{"Mcp-Method": "tools/call"})
        self.assert_mismatch(self.post(call, h), "Mcp-Name header is missing")
        self.assert_mismatch(self.post(call, dict(h, **{"Mcp-Name": "run_code"})),
                             "does not match body value 'create_session'")
        self.assert_mismatch(self.post(call, dict(h, **{"Mcp-Name": "=?base64?%%%?="})),
                             "Mcp-Name")
        # the base64 sentinel form is decoded before it is compared
        ok = self.post(call, dict(h, **{"Mcp-Name": "=?base64?%s?=" % base64.b64encode(
            b"create_session").decode()}))
        self.assertEqual(ok.status, 200, ok.body)
        self.assertFalse(ok.messages[-1]["result"]["isError"])
        # no Mcp-Session-Id is minted, and one sent is ignored
        self.assertIsNone(ok.header("Mcp-Session-Id"))
        r = self.post(self.discover(), dict(v, **{"Mcp-Method": "server/discover",
                                                  "Mcp-Session-Id": "no-such-session"}))
        self.assertEqual(r.status, 200, r.body)
        self.assertIsNone(r.header("Mcp-Session-Id"))

    def test_no_get_stream_and_no_delete(self):
        c = self.new_client(modern=True)
        for method in ("GET", "DELETE"):
            r = c.http(method, headers={"Accept": "text/event-stream"})
            self.assertEqual(r.status, 405, method)
            self.assertIn("2026-07-28", r.body)

    def test_closing_the_stream_cancels_the_call(self):
        sid = self.m.new_session()
        self.m.tool_result("run_code", {"session_id": sid, "code": "mark = 'before'"})
        body = {"jsonrpc": "2.0", "id": 90, "method": "tools/call", "params": {
            "name": "run_code", "_meta": self.m.meta({"progressToken": "p"}),
            "arguments": {"session_id": sid, "code": (
                "import time\nmark = 'in cell'\nprint('sleeping', flush=True)\n"
                "time.sleep(120)\nmark = 'finished'")}}}
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=120)
        h = self.m.headers(self.m.modern_headers("tools/call", body["params"]))
        conn.request("POST", "/mcp", body=json.dumps(body), headers=h)
        resp = conn.getresponse()
        self.assertTrue(resp.getheader("Content-Type").startswith("text/event-stream"))
        buf = b""
        while b"sleeping" not in buf:
            chunk = resp.read1(65536)
            self.assertTrue(chunk, "the stream ended before the cell slept")
            buf += chunk
        t0 = time.time()
        conn.close()  # the cancellation signal of Streamable HTTP 2026-07-28
        # The next call on the session runs as soon as the interrupted cell let go of it, and
        # finds the variables of before the sleep.
        r = self.m.tool_result("run_code", {"session_id": sid, "code": "mark"})
        self.assertEqual(texts(r), "'in cell'")
        self.assertLess(time.time() - t0, 60)


class HttpLimitsTest(RuncellTestCase):
    """The limits of /mcp, each on a server of its own."""

    def test_mcp_sessions_and_executions_are_capped(self):
        with ServeProcess("--max-sessions", "2", "--max-executions", "1") as srv:
            c1, c2, c3 = (HttpClient(srv.port, srv.token) for _ in range(3))
            c1.initialize()
            c2.initialize()
            r = c3.http("POST", {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                 "params": {"protocolVersion": "2025-11-25"}})
            self.assertEqual(r.status, 429)
            self.assertIn("maximum of 2 MCP sessions", r.messages[0]["error"]["message"])
            sleeping, box = threading.Event(), {}

            def on_event(msg):
                if msg.get("params", {}).get("message") == "sleeping":
                    sleeping.set()
            t = threading.Thread(target=lambda: box.update(r=c1.http("POST", {
                "jsonrpc": "2.0", "id": 77, "method": "tools/call", "params": {
                    "name": "run_code", "_meta": {"progressToken": 1},
                    "arguments": {"code": "print('sleeping', flush=True)\nimport time\n"
                                  "time.sleep(120)"}}}, on_event=on_event)))
            t.start()
            self.assertTrue(sleeping.wait(120))
            # Another session's call finds no place to run: it waits for one (the server's
            # gate, as every surface's executions do), and runs once the first is cancelled.
            waiting = {}
            w = threading.Thread(target=lambda: waiting.update(
                r=c2.tool_result("run_code", {"code": "1"})))
            w.start()
            def metrics():
                req = urllib.request.Request("http://127.0.0.1:%d/metrics" % srv.port,
                                             headers={"Authorization": "Bearer " + srv.token})
                with urllib.request.urlopen(req, timeout=30) as resp:
                    return resp.read().decode()
            self.assertTrue(wait_until(lambda: "runcell_executions_queued 1\n" in metrics()))
            self.assertTrue(w.is_alive())
            c1.notify("notifications/cancelled", {"requestId": 77})
            t.join(120)
            w.join(120)
            self.assertFalse(t.is_alive())
            self.assertFalse(any(m.get("id") == 77 for m in box["r"].messages))
            self.assertFalse(waiting["r"]["isError"], waiting["r"])
            self.assertEqual(waiting["r"]["content"][0]["text"], "1")
            self.assertEqual(c2.tool_result("run_code", {"code": "2"})["content"][0]["text"],
                             "2")

    def test_idle_mcp_sessions_expire(self):
        with ServeProcess("--idle-timeout", "1") as srv:
            c = HttpClient(srv.port, srv.token)
            c.initialize()
            deadline = time.time() + 60
            while True:
                time.sleep(1.2)
                r = c.http("POST", {"jsonrpc": "2.0", "id": 2, "method": "ping"})
                if r.status != 200 or time.time() > deadline:
                    break
            self.assertEqual(r.status, 404)
            self.assertIn("ended or expired", r.messages[0]["error"]["message"])
            c.session = None
            c.initialize()  # a new one starts at once
            self.assertEqual(c.request("ping")["result"], {})


if __name__ == "__main__":
    unittest.main()
