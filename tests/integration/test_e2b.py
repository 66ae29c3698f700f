"""test_e2b - E2B's own SDK (@e2b/code-interpreter and e2b from npm, pinned in
tests/e2b/package.json) drives `runcell serve --e2b` from Node, unmodified: only E2B_API_URL,
E2B_SANDBOX_URL and E2B_API_KEY point at runcell (docs/E2B.md). Each scenario of
tests/e2b/scenarios.mjs creates a sandbox, does what a user of E2B does, and prints what the
SDK returned; the assertions are on that. A few raw requests check the wire where the SDK
hides it (error shapes, authentication, the routes' absence without --e2b).

The server listens on 127.0.0.1 (a free port); nothing leaves loopback. Waits are on events
(a file a callback writes, the SDK's own calls); timeouts only stop hangs.
"""
import base64
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import unittest

from rctest import (FETCH, HANG, ROOT, RuncellTestCase, Server, ServerCase, runcell,
                    wait_until)

E2B_DIR = os.path.join(ROOT, "tests", "e2b")
SCENARIOS = os.path.join(E2B_DIR, "scenarios.mjs")
NODE = shutil.which("node") or "/usr/bin/node"


def sdk_missing():
    """Why E2B's SDK cannot run here, or None (with RUNCELL_REQUIRE_TEST_SERVERS, as in CI:
    None, and the tests fail when it is missing)."""
    if os.environ.get("RUNCELL_REQUIRE_TEST_SERVERS"):
        return None
    if not os.path.exists(NODE):
        return "node is not installed (scripts/install-deps installs it)"
    if not os.path.isdir(os.path.join(E2B_DIR, "node_modules", "@e2b", "code-interpreter")):
        return "E2B's SDK is not installed in tests/e2b (run scripts/install-test-servers)"
    return None


@unittest.skipIf(sdk_missing(), sdk_missing())
class E2BSdk(ServerCase):

    server_args = ("--e2b", "--e2b-domain", "sandbox.runcell.test")

    def scenario(self, name, key=None):
        env = dict(os.environ, E2B_API_URL=self.srv.base_url, E2B_SANDBOX_URL=self.srv.base_url,
                   E2B_API_KEY=key or self.srv.token)
        env.pop("E2B_DEBUG", None)
        p = subprocess.run([NODE, SCENARIOS, name], cwd=E2B_DIR, env=env, capture_output=True,
                           text=True, timeout=HANG)
        lines = p.stdout.strip().splitlines()
        if p.returncode or not lines:
            self.fail("scenario %s failed (%d):\n%s\n%s\nserver log:\n%s" % (
                name, p.returncode, p.stdout, p.stderr, self.srv.log()[-3000:]))
        return json.loads(lines[-1])

    def test_create_and_state_across_calls(self):
        out = self.scenario("state")
        self.assertIsNone(out["a"]["error"])
        self.assertEqual(out["a"]["results"], [])
        self.assertEqual(out["b"]["text"], "42")
        self.assertTrue(out["b"]["results"][0]["isMainResult"])
        self.assertEqual(out["b"]["executionCount"], out["a"]["executionCount"] + 1)
        info = out["info"]
        self.assertEqual(info["templateId"], "code-interpreter-v1")
        self.assertEqual(info["state"], "running")
        self.assertEqual(info["envdVersion"], "0.5.2")
        self.assertTrue(out["running"])

    def test_dataframe_is_an_html_result(self):
        out = self.scenario("dataframe")
        self.assertIsNone(out["error"])
        r = out["results"][0]
        self.assertIn("html", r["formats"])
        self.assertIn("<table", r["html"])
        self.assertIn("<td>x</td>", r["html"])
        self.assertIn("a  b", r["text"])
        self.assertTrue(r["isMainResult"])

    def test_matplotlib_chart_is_a_png_result(self):
        out = self.scenario("chart")
        self.assertIsNone(out["error"])
        pngs = [r for r in out["results"] if "png" in r["formats"]]
        self.assertEqual(len(pngs), 1, out["results"])
        data = base64.b64decode(pngs[0]["png"])
        self.assertEqual(data[:8], b"\x89PNG\r\n\x1a\n")
        self.assertFalse(pngs[0]["isMainResult"])  # a display, as in E2B
        self.assertIsNone(out.get("text"))

    def test_error_with_traceback_keeps_the_sandbox(self):
        out = self.scenario("error")
        err = out["x"]["error"]
        self.assertEqual(err["name"], "KeyError")
        self.assertEqual(err["value"], "'fare'")
        self.assertIn("Traceback", err["traceback"])
        self.assertIn('return {}["fare"]', err["traceback"])
        self.assertEqual(out["after"]["text"], "2")

    def test_client_timeout_interrupts_the_cell_and_keeps_state(self):
        out = self.scenario("timeout")
        self.assertTrue(out["thrown"]["timeout"], out["thrown"])
        self.assertEqual(out["thrown"]["name"], "TimeoutError")
        # The hang-up interrupted the endless cell: the next one runs, variables kept.
        self.assertEqual(out["after"].get("text"), "7", out["after"])

    def test_on_stdout_streams_while_the_cell_runs(self):
        out = self.scenario("streaming")
        self.assertEqual(out["seen"], [["out", "ready\n"], ["err", "oops\n"],
                                       ["result", "'end'"]])
        self.assertEqual(out["x"]["stdout"], ["ready\n"])
        self.assertEqual(out["x"]["stderr"], ["oops\n"])
        self.assertEqual(out["x"]["text"], "'end'")

    def test_files_write_read_list_and_the_rest(self):
        out = self.scenario("files")
        self.assertEqual(out["w"], {"path": "/home/user/data/hello.txt", "name": "hello.txt",
                                    "type": "file"})
        self.assertEqual(out["read"], "hello from e2b\n")
        self.assertEqual(out["bytes"]["path"], "/home/user/bin.dat")  # a relative path
        self.assertEqual(out["readBytes"], [0, 1, 2, 255])
        self.assertEqual(out["list"], [{"name": "hello.txt", "type": "file",
                                        "path": "/home/user/data/hello.txt", "size": 15}])
        self.assertTrue(out["made"])
        self.assertFalse(out["madeAgain"])  # AlreadyExists
        self.assertFalse(out["madeRoot"])  # the workspace itself is there already
        self.assertTrue(out["exists"])
        self.assertEqual(out["renamed"], "/home/user/sub/hi.txt")
        self.assertEqual(out["fromCode"], "'hello from e2b\\n'")  # the code sees the same files
        self.assertFalse(out["stillThere"])  # removed with its directory
        self.assertTrue(out["missing"]["notFound"], out["missing"])
        self.assertEqual(out["outside"]["name"], "InvalidArgumentError")
        self.assertIn("outside /home/user", out["outside"]["message"])

    def test_commands_exit_codes_streaming_and_kill(self):
        out = self.scenario("commands")
        # The command could only end once its first line had reached onStdout.
        self.assertEqual(out["live"]["stdout"], "ready\ndone\n")
        self.assertEqual(out["live"]["streamed"][0], "ready\n")
        # E2B's home is the working directory of commands (the workspace, by its E2B path)
        self.assertEqual(out["ok"], {"exitCode": 0, "stdout": "one\nhi there\n/home/user\n",
                                     "stderr": "two\n"})
        self.assertEqual("".join(d for k, d in out["out"] if k == "out"),
                         "one\nhi there\n/home/user\n")
        self.assertEqual("".join(d for k, d in out["out"] if k == "err"), "two\n")
        self.assertEqual(out["failed"], {"isExit": True, "exitCode": 3, "stdout": "before\n"})
        self.assertEqual(out["cwd"], "/home/user/sub\n")
        self.assertEqual(out["cwdWs"], "/home/user/sub\n")  # the workspace by E2B's name
        self.assertEqual(out["cwdTmp"], "/tmp\n")  # a directory of the sandbox's own
        self.assertEqual(out["env"], "wide\n")  # the sandbox's envs reach commands
        self.assertIn("made-by-files.txt", out["ls"].split())
        self.assertEqual(out["procs"], [])
        bg = out["bg"]
        self.assertEqual(bg["running"], [{"pid": bg["pid"], "cmd": "/bin/bash",
                                          "args": ["-l", "-c", "echo started; sleep 600"]}])
        self.assertTrue(bg["killed"])
        self.assertEqual(bg["bgEnd"], {"exitCode": 137, "isExit": True})
        self.assertFalse(bg["killedAgain"])  # NotFound: it is gone
        self.assertEqual(out["afterKill"], "42")

    def test_processes_beside_cells(self):
        out = self.scenario("processes")
        self.assertEqual(out["fromCell"], ["200\n"])  # the dev server, from a cell
        server, sleeper, cat, waiter = out["pids"]
        self.assertEqual(len(set(out["pids"])), 4)  # each its own pid
        self.assertEqual(out["beside"].split("\n")[0], "beside")
        self.assertLessEqual({server, sleeper}, set(out["listed"]))
        self.assertEqual(out["cat"], "hello stdin\n")
        self.assertEqual(out["waited"], "last\n")  # what came after connect
        self.assertTrue(out["killed"])
        self.assertTrue(out["serverKilled"])
        self.assertEqual(out["serverEnd"]["exitCode"], 137)
        self.assertEqual(out["after"], [])
        self.assertEqual(out["root"]["name"], "InvalidArgumentError")
        self.assertIn("user 'root' is not available", out["root"]["message"])
        self.assertTrue(out["timedOut"]["timeout"], out["timedOut"])
        self.assertEqual(out["retry"], "retried\n")
        self.assertEqual(out["cellAfter"], "42")

    def test_refusals_and_stream_errors_reach_the_user(self):
        out = self.scenario("errors")
        self.assertEqual(out["lang"]["name"], "InvalidArgumentError")
        self.assertIn("language 'r' is not supported", out["lang"]["value"])
        self.assertEqual(out["envs"]["name"], "InvalidArgumentError")
        self.assertIn("Sandbox.create", out["envs"]["value"])
        # a python context's cwd is its own, and keeps where its code went
        self.assertEqual((out["inCtx"], out["moved"], out["dflt"]),
                         ("'/tmp'", "'/var/tmp'", "'/home/user'"))
        self.assertEqual(out["inBash"]["name"], "InvalidArgumentError")
        self.assertIn("change directory in the code", out["inBash"]["value"])
        self.assertEqual(out["noCwd"]["name"], "InvalidArgumentError")
        self.assertIn("cannot enter its working directory (/no/such/dir)",
                      out["noCwd"]["message"])
        self.assertEqual(out["noPid"]["name"], "NotFoundError")
        self.assertIn("no process 99999", out["noPid"]["message"])

    def test_charts_ipython_restart_metrics_listing_and_watching(self):
        out = self.scenario("extras")
        [chart] = [c for c in out["chart"] if c]
        self.assertEqual((chart["type"], chart["title"], chart["x_label"], chart["y_label"],
                          chart["y_unit"]), ("bar", "Sales", "Product", "Units (k)", "k"))
        self.assertEqual(chart["elements"], [{"label": l, "group": "sales", "value": v}
                                             for l, v in (("a", 3), ("b", 5), ("c", 2))])
        ipy = out["ipy"]
        self.assertIsNone(ipy["error"])
        self.assertEqual(ipy["results"][0]["html"], "<b>bold</b>")
        self.assertEqual(ipy["stdout"][0], "from the shell\n")
        self.assertIn("per loop (mean", "".join(ipy["stdout"]))
        self.assertEqual(ipy["text"], "True")
        self.assertEqual(out["gone"], "NameError")  # the default context was emptied
        self.assertEqual(out["stays"], "2")  # another context was not
        self.assertTrue(out["stillRunning"])  # nor were the commands
        [m] = out["metrics"]
        self.assertGreater(m["memTotal"], 0)
        self.assertGreater(m["memUsed"], 0)
        self.assertIn("listed.txt", out["dot"])
        self.assertEqual(out["dot"], out["empty"])
        seen = {(e["name"], e["type"]) for e in out["events"]}
        self.assertIn(("a.txt", "create"), seen)  # written whole: moved into place
        self.assertFalse([n for n, _ in seen if n.startswith(".runcell")], seen)
        self.assertIn(("sub", "create"), seen)
        self.assertIn(("sub/c.txt", "create"), seen)  # recursive: a directory made later too
        self.assertIn(("b.txt", "create"), seen)
        self.assertEqual(out["git"]["untracked"], [["README", "untracked"]])
        self.assertTrue(out["git"]["clean"])  # after git.add and git.commit
        self.assertIn(out["git"]["branch"], ("master", "main"))  # git's default, by version

    def test_update_network(self):
        out = self.scenario("network")
        self.assertEqual(out["after"]["allowOut"], ["files.example.test", "pypi.org:8443"])
        self.assertEqual(out["closed"]["allowOut"], [])
        self.assertEqual(out["refused"]["name"], "SandboxError")
        self.assertIn("without a network", out["refused"]["message"])

    def test_the_cookbook(self):
        """E2B's common patterns, as its cookbook writes them."""
        out = self.scenario("cookbook")
        self.assertEqual(out["csv"], "16.666666666666668")  # pandas read /home/user/data.csv
        self.assertEqual(out["lines"], "4\n")
        self.assertEqual(out["chart"]["type"], "line")
        self.assertEqual(out["chart"]["title"], "Temps")
        self.assertEqual(out["chart"]["elements"][0]["points"],
                         [["Oslo", 4.0], ["Lima", 19.0], ["Cairo", 27.0]])
        self.assertRegex(out["host"], r"^3000-[0-9a-z-]+\.sandbox\.runcell\.test$")
        self.assertEqual(out["page"], {"status": 200, "body": "<h1>hello from the sandbox</h1>",
                                       "type": "text/html"})
        self.assertEqual(out["closed"]["status"], 502)
        self.assertIn("nothing answers on its port 3001", out["closed"]["body"])
        self.assertEqual(out["streamed"], ["step 1\n", "step 2\n", "step 3\n"])
        self.assertEqual(out["long"], "step 1\nstep 2\nstep 3\n")
        self.assertEqual(out["cellTimeout"]["name"], "TimeoutError")
        self.assertEqual(out["cellRetry"], "'again'")
        self.assertEqual(out["cmdTimeout"]["name"], "TimeoutError")
        self.assertEqual(out["cmdRetry"], "again\n")
        self.assertIn("signature=v1_", out["down"]["url"])
        self.assertIn("signature_expiration=", out["down"]["url"])
        self.assertEqual((out["down"]["status"], out["down"]["body"]),
                         (200, "city,temp\nOslo,4\nLima,19\nCairo,27\n"))
        self.assertEqual(out["badSig"], 401)
        self.assertEqual(out["uploaded"], 200)
        self.assertEqual(out["upRead"], "uploaded")

    def test_a_second_python_context_bash_and_javascript(self):
        out = self.scenario("contexts")
        self.assertEqual(out["ctx"]["language"], "python")
        self.assertEqual(out["a"], "'second'")
        self.assertEqual(out["b"], "'default'")  # the default context kept its own
        self.assertEqual(out["c"], "'second'")
        self.assertEqual(out["bash"]["stdout"], ["from bash\n"])
        js = out["js"]
        self.assertEqual(js["context"]["language"], "javascript")
        self.assertEqual(js["value"], "42")  # state kept across cells of the context
        self.assertEqual(js["byLanguage"], "[ 40, 80 ]")  # language: the same Node kernel
        self.assertEqual(js["error"], "TypeError")
        self.assertEqual([c["id"] for c in out["list"]],
                         ["default", out["ctx"]["id"], js["context"]["id"]])
        self.assertEqual(out["r"]["name"], "SandboxError")  # refused: 400
        self.assertIn("400", out["r"]["message"])
        self.assertEqual([c["id"] for c in out["after"]], ["default"])

    def test_kill_then_sandbox_not_found(self):
        out = self.scenario("kill")
        self.assertTrue(out["listed"])
        self.assertTrue(out["byMeta"])  # Sandbox.list's metadata filter
        self.assertEqual(out["byWrongMeta"], 0)
        self.assertTrue(out["killed"])
        self.assertFalse(out["again"])
        self.assertEqual(out["info"]["name"], "SandboxNotFoundError")
        self.assertTrue(out["connect"]["notFound"])
        self.assertFalse(out["running"])
        self.assertTrue(out["code"]["timeout"])  # E2B's word for a sandbox that is gone
        self.assertIn("not running", out["code"]["message"])

    def test_pause_snapshots_and_forks(self):
        out = self.scenario("pauseSnapshotFork")
        self.assertTrue(out["paused"])
        self.assertFalse(out["again"])  # already paused: the SDK's false (a 409)
        self.assertEqual(out["infoPaused"], "paused")
        self.assertEqual(len(out["listedPaused"]), 1)
        self.assertEqual(out["afterResume"]["text"], "42")
        self.assertEqual(out["afterHibernate"]["text"], "43")
        self.assertEqual(out["snap"]["names"], ["kept-state"])
        self.assertEqual([s["snapshotId"] for s in out["listed"]], [out["snap"]["snapshotId"]])
        self.assertEqual(out["restored"]["text"], "(41, 'from the snapshot')")
        self.assertTrue(out["deleted"])
        self.assertFalse(out["deletedAgain"])
        self.assertIn("not found", out["gone"]["message"])
        self.assertEqual(len(set(out["forkIds"])), 2)
        self.assertEqual([f["text"] for f in out["forked"]], ["4100", "4100"])
        self.assertEqual(out["parent"]["text"], "41")

    def test_auto_pause_at_the_timeout(self):
        # autoPause: at its timeout the sandbox is paused (here, hibernated), not killed,
        # and its next cell brings it back with its state
        r = self.e2b("POST", "/v2/sandboxes", {"timeout": 1, "autoPause": True,
                                               "autoPauseMemory": False,
                                               "allow_internet_access": False})
        self.assertEqual(r.status, 201, r)
        sid = r.json()["sandboxID"]
        h = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49999",
             "X-Access-Token": r.json()["envdAccessToken"]}

        def run(code):
            r = self.srv.request("POST", "/execute", {"code": code}, headers=h, token=False)
            self.assertEqual(r.status, 200, r)
            return [json.loads(line) for line in r.body.splitlines()]
        run("kept = 7")
        self.assertTrue(wait_until(
            lambda: self.e2b("GET", "/sandboxes/" + sid).json().get("state") == "paused"))
        results = [m for m in run("kept") if m["type"] == "result"]
        self.assertEqual(results[0]["text"], "7")
        self.assertEqual(self.e2b("GET", "/sandboxes/" + sid).json()["state"], "running")
        self.e2b("DELETE", "/sandboxes/" + sid)

    def test_refusals_name_what_cannot_map(self):
        out = self.scenario("refused")
        self.assertIn("template 'no-such-template' is not known", out["template"]["message"])
        self.assertIn("allow_internet_access", out["internet"]["message"])
        self.assertIn("network.denyOut", out["denyOut"]["message"])
        self.assertEqual(out["badKey"]["name"], "AuthenticationError")
        # docs/E2B.md's table quotes these
        calls = out["calls"]
        self.assertIn("[unimplemented] a pty (pty.create) is not supported", calls["pty"]["message"])
        for k, name, word in (("volume", "VolumeError", "volumes"),
                              ("volumes", "VolumeError", "volumes"),
                              ("secrets", "SecretError", "secrets"),
                              ("template", "TemplateError", "templates")):
            self.assertEqual(calls[k]["name"], name, k)
            self.assertIn("400: %s" % word, calls[k]["message"], k)

    # ---- the wire, where the SDK hides it ----

    def e2b(self, method, path, body=None, headers=None):
        h = {"X-API-KEY": self.srv.token}
        h.update(headers or {})
        return self.srv.request(method, path, body, headers=h, token=False)

    def test_wire_errors_have_e2b_shape(self):
        r = self.e2b("POST", "/sandboxes", {"templateID": "base", "volumeMounts": [{"name": "v"}]})
        self.assertEqual(r.status, 400)
        self.assertEqual(r.json()["code"], 400)
        self.assertIn("'volumeMounts'", r.json()["message"])
        r = self.e2b("POST", "/sandboxes", {"timeout": 0})
        self.assertEqual((r.status, r.json()["code"]), (400, 400))
        self.assertIn("'timeout'", r.json()["message"])
        r = self.e2b("GET", "/sandboxes/nosuch")
        self.assertEqual(r.json(), {"code": 404, "message": "sandbox nosuch not found"})
        for path in ("/sandboxes/x/logs", "/v2/sandboxes/x/logs"):  # refused like pause
            r = self.e2b("GET", path)
            self.assertEqual((r.status, r.json()["code"]), (400, 400), path)
            self.assertIn("logs have no runcell counterpart", r.json()["message"])
        r = self.srv.request("GET", "/sandboxes", token=False)
        self.assertEqual((r.status, r.json()["code"]), (401, 401))
        # runcell's bearer token is accepted too (the SDK's accessToken mode)
        self.assertEqual(self.srv.request("GET", "/v2/sandboxes").status, 200)

    def test_network_allow_out_is_the_egress_allowlist(self):
        allow = ["pypi.org", "*.example.com:8443"]
        r = self.e2b("POST", "/v2/sandboxes", {"network": {"allowOut": allow},
                                               "metadata": {"who": "test"}})
        self.assertEqual(r.status, 201, r)
        sid = r.json()["sandboxID"]
        try:
            info = self.e2b("GET", "/sandboxes/" + sid).json()
            self.assertEqual(info["network"]["allowOut"], allow)
            self.assertEqual(info["metadata"], {"who": "test"})
            self.assertNotIn("envdAccessToken", info)  # only create and connect give it
        finally:
            self.e2b("DELETE", "/sandboxes/" + sid)
        r = self.e2b("POST", "/v2/sandboxes", {"network": {"allowOut": ["bad host"]}})
        self.assertEqual(r.status, 400)
        self.assertIn("network.allowOut", r.json()["message"])
        r = self.e2b("POST", "/v2/sandboxes", {"envVars": {"1BAD": "x"}})
        self.assertEqual(r.status, 400)
        self.assertIn("envVars", r.json()["message"])
        r = self.e2b("POST", "/v2/sandboxes", {"metadata": {"k": 1}})
        self.assertEqual(r.status, 400)
        self.assertIn("metadata", r.json()["message"])

    def test_sandbox_routes_need_the_access_token(self):
        created = self.e2b("POST", "/v2/sandboxes", {"templateID": "code-interpreter-v1"})
        self.assertEqual(created.status, 201, created)
        box = created.json()
        sid, tok = box["sandboxID"], box["envdAccessToken"]
        self.assertEqual(len(tok), 32)
        try:
            base = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983"}
            for token, status in ((None, 401), ("wrong", 401), (tok, 204)):
                h = dict(base, **({"X-Access-Token": token} if token else {}))
                self.assertEqual(self.srv.request("GET", "/health", headers=h,
                                                  token=False).status, status)
            self.assertEqual(self.srv.request("GET", "/health", token=False).status, 400)
            # Connect unary errors: {code: "not_found", message} with the mapped status
            h = dict(base, **{"X-Access-Token": tok, "Content-Type": "application/json"})
            r = self.srv.request("POST", "/filesystem.Filesystem/Stat",
                                 {"path": "/home/user/none"}, headers=h, token=False)
            self.assertEqual(r.status, 404)
            self.assertEqual(r.json()["code"], "not_found")
            r = self.srv.request("POST", "/filesystem.Filesystem/WatchDir", {}, headers=h,
                                 token=False)
            self.assertEqual((r.status, r.json()["code"]), (400, "invalid_argument"))
            self.assertIn("is a streaming method", r.json()["message"])
            r = self.srv.request("POST", "/filesystem.Filesystem/Chmod", {}, headers=h,
                                 token=False)
            self.assertEqual((r.status, r.json()["code"]), (501, "unimplemented"))
            r = self.srv.request("POST", "/filesystem.Filesystem/ListDir",
                                 {"path": "/home/user/../.."}, headers=h, token=False)
            self.assertEqual((r.status, r.json()["code"]), (400, "invalid_argument"))
            # A command's stream: 5-byte envelopes, the last one flagged 0x02
            msg = json.dumps({"process": {"cmd": "/bin/bash", "args": ["-c", "echo hi; exit 5"]}})
            env = bytes([0]) + len(msg).to_bytes(4, "big") + msg.encode()
            h2 = dict(h, **{"Content-Type": "application/connect+json"})
            r = self.srv.request("POST", "/process.Process/Start", env, headers=h2, token=False)
            self.assertEqual(r.status, 200)
            frames, data = [], r.body
            while data:
                flags, n = data[0], int.from_bytes(data[1:5], "big")
                frames.append((flags, json.loads(data[5:5 + n])))
                data = data[5 + n:]
            self.assertIn("start", frames[0][1]["event"])
            out = b"".join(base64.b64decode(f["event"]["data"]["stdout"])
                           for _, f in frames if "data" in f.get("event", {}))
            self.assertEqual(out, b"hi\n")
            self.assertEqual(frames[-2][1]["event"]["end"]["exitCode"], 5)
            self.assertEqual(frames[-1], (2, {}))
            self.check_signal_pid_range(h, h2)
        finally:
            self.assertEqual(self.e2b("DELETE", "/sandboxes/" + sid).status, 204)

    def check_signal_pid_range(self, h, h2):
        """SendSignal names its process by pid: a pid past 32 bits is no process's, not the
        running one's after a truncation."""
        msg = json.dumps({"process": {"cmd": "/bin/bash", "args": ["-c", "sleep 600"]}})
        env = bytes([0]) + len(msg).to_bytes(4, "big") + msg.encode()
        done = []
        t = threading.Thread(target=lambda: done.append(self.srv.request(
            "POST", "/process.Process/Start", env, headers=h2, token=False)))
        t.start()
        try:
            def running():
                r = self.srv.request("POST", "/process.Process/List", {}, headers=h, token=False)
                procs = r.json().get("processes", [])
                return procs[0]["pid"] if procs else None
            self.assertTrue(wait_until(running), "the command never showed in List")
            pid = running()
            for bad in (pid + (1 << 32), -pid, 0):
                r = self.srv.request("POST", "/process.Process/SendSignal",
                                     {"process": {"pid": bad}, "signal": "SIGNAL_SIGKILL"},
                                     headers=h, token=False)
                self.assertEqual((r.status, r.json()["code"]), (404, "not_found"), bad)
                self.assertIn(str(bad), r.json()["message"])
            self.assertEqual(running(), pid, "a wrong pid stopped the command")
            r = self.srv.request("POST", "/process.Process/SendSignal",
                                 {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"},
                                 headers=h, token=False)
            self.assertEqual(r.status, 200, r.body)
        finally:
            t.join(HANG)
        self.assertFalse(t.is_alive(), "the signalled command's stream did not end")
        self.assertEqual(done[0].status, 200)


    def test_a_sandbox_that_expired_untouched_leaves_nothing_in_the_server(self):
        # Expired for idleness with no request to find it gone: its box (metadata, envVars,
        # watchers) goes with its session all the same, and the watcher's inotify with it.
        def inotify_fds():
            n = 0
            for fd in os.listdir("/proc/%d/fd" % self.srv.pid):
                try:
                    n += os.readlink("/proc/%d/fd/%s" % (self.srv.pid, fd)) == \
                        "anon_inode:inotify"
                except OSError:
                    pass
            return n
        before = inotify_fds()
        box = self.e2b("POST", "/v2/sandboxes", {"timeout": 1, "allow_internet_access": False,
                                                 "metadata": {"k": "v" * 1000}}).json()
        h = {"E2b-Sandbox-Id": box["sandboxID"], "E2b-Sandbox-Port": "49999",
             "X-Access-Token": box["envdAccessToken"], "Content-Type": "application/json"}
        r = self.srv.request("POST", "/filesystem.Filesystem/CreateWatcher",
                             {"path": "/home/user"}, headers=h, token=False)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(inotify_fds(), before + 1)
        # Gone from the native API, which never touches E2B's boxes.
        self.assertTrue(wait_until(lambda: self.srv.request(
            "GET", "/v1/sessions/" + box["sandboxID"]).status == 404))
        self.assertTrue(wait_until(lambda: inotify_fds() == before), inotify_fds())
        # And metadata or envVars past 64 KiB are refused, not kept.
        r = self.e2b("POST", "/v2/sandboxes", {"metadata": {"k": "v" * (65 << 10)}})
        self.assertEqual(r.status, 400, r)
        self.assertIn("past 65536", r.json()["message"])

    def test_pause_and_fork_fields_of_the_wrong_type_are_refused(self):
        box = self.e2b("POST", "/v2/sandboxes", {"timeout": 60,
                                                 "allow_internet_access": False}).json()
        self.addCleanup(self.e2b, "DELETE", "/sandboxes/" + box["sandboxID"])
        r = self.e2b("POST", "/sandboxes/%s/pause" % box["sandboxID"], {"memory": "false"})
        self.assertEqual((r.status, r.json()["code"]), (400, 400), r)
        self.assertIn("'memory' must be true or false", r.json()["message"])
        for body in ({"count": "2"}, {"count": 2.0}, {"timeout": 1.5}):
            r = self.e2b("POST", "/sandboxes/%s/fork" % box["sandboxID"], body)
            self.assertEqual((r.status, r.json()["code"]), (400, 400), (body, r))
            self.assertIn("whole numbers", r.json()["message"])
        self.assertEqual(self.e2b("GET", "/sandboxes/" + box["sandboxID"]).json()["state"],
                         "running")

    def test_limits_and_timeouts(self):
        box = self.e2b("POST", "/v2/sandboxes", {"timeout": 60}).json()
        sid, tok = box["sandboxID"], box["envdAccessToken"]
        h = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49999", "X-Access-Token": tok}
        try:
            # setTimeout past the create's timeout lengthens it: endAt moves on, and the
            # idle expiry with it
            end = self.e2b("GET", "/sandboxes/" + sid).json()["endAt"]
            r = self.e2b("POST", "/sandboxes/%s/timeout" % sid, {"timeout": 3600})
            self.assertEqual(r.status, 204)
            later = self.e2b("GET", "/sandboxes/" + sid).json()["endAt"]
            self.assertGreater(later, end)  # ISO 8601 UTC strings order as times
            # past the server's longest (--max-idle-timeout, a week by default): refused
            r = self.e2b("POST", "/sandboxes/%s/timeout" % sid, {"timeout": 8 * 86400})
            self.assertEqual(r.status, 400)
            self.assertIn("--max-idle-timeout", r.json()["message"])
            # contexts: at most 32 (the default one counts)
            ids = []
            for _ in range(31):
                r = self.srv.request("POST", "/contexts", {"language": "python"}, headers=h,
                                     token=False)
                self.assertEqual(r.status, 200, r)
                ids.append(r.json()["id"])
            r = self.srv.request("POST", "/contexts", {"language": "python"}, headers=h,
                                 token=False)
            self.assertEqual((r.status, r.json()["code"]), (429, 429))
            r = self.srv.request("POST", "/contexts", {"language": "r"}, headers=h, token=False)
            self.assertEqual(r.status, 400)
            self.assertIn("'r' contexts are not supported", r.json()["message"])
            # a directory past ListDir's cap is an error, never a cut list
            cell = "import os\nos.mkdir('many')\nfor i in range(20001):\n" \
                   "    open('many/%d' % i, 'w').close()\n"
            r = self.srv.request("POST", "/execute", {"code": cell}, headers=h, token=False)
            self.assertEqual(r.status, 200)
            self.assertIn(b"end_of_execution", r.body)
            self.assertNotIn(b'"type":"error"', r.body)
            hc = dict(h, **{"Content-Type": "application/json"})
            r = self.srv.request("POST", "/filesystem.Filesystem/ListDir",
                                 {"path": "/home/user/many", "depth": 1}, headers=hc, token=False)
            self.assertEqual((r.status, r.json()["code"]), (429, "resource_exhausted"))
            self.assertIn("more than 20000 entries", r.json()["message"])
            self.assertIn("list a subdirectory", r.json()["message"])
            # one thing at a time: a cell sent while one runs waits its turn, then runs
            wait = "import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.02)\n"
            conn = self.srv.connection()
            conn.request("POST", "/execute", body=json.dumps({"code": "print('in', flush=True)\n"
                                                                      + wait}), headers=h)
            resp = conn.getresponse()
            self.assertIn(b'"stdout"', resp.readline())
            second = self.srv.connection()
            second.request("POST", "/execute", body=json.dumps({"code": "'second'"}), headers=h)
            queued = second.getresponse()
            self.assertEqual(queued.status, 200)
            r = self.srv.request("POST", "/files?path=go", b"", token=False,
                                 headers=dict(h, **{"Content-Type": "application/octet-stream"}))
            self.assertEqual(r.status, 200, r)
            rest = resp.read()
            self.assertIn(b"end_of_execution", rest)
            conn.close()
            self.assertIn(b"'second'", queued.read())
            second.close()
            # setTimeout shorter than the create's: the sandbox is gone once it is past
            r = self.e2b("POST", "/sandboxes/%s/timeout" % sid, {"timeout": 1})
            self.assertEqual(r.status, 204)
            wait_until(lambda: self.e2b("GET", "/sandboxes/" + sid).status == 404)
            r = self.srv.request("GET", "/health", headers=h, token=False)
            self.assertEqual(r.status, 502)
        finally:
            self.e2b("DELETE", "/sandboxes/" + sid)


class E2BWire(ServerCase):
    """Raw requests only (no SDK): what a hostile or broken client sends."""
    server_args = ("--e2b",)

    def box(self):
        return self.srv.e2b_box(self, "/v2/sandboxes")

    def test_only_an_authorized_request_applies_a_sandbox_s_timeout(self):
        """A sandbox past its setTimeout goes when next touched by a request that may touch
        it: one with a wrong access token gets its 401 and leaves the sandbox as it is. (A
        cell runs meanwhile, so that the idle sweep, which leaves a busy session alone, does
        not end it first.)"""
        h = self.box()
        sid = h["E2b-Sandbox-Id"]
        cell = self.srv.connection()
        cell.request("POST", "/execute", body=json.dumps(
            {"code": "print('started', flush=True)\nimport time\ntime.sleep(600)"}),
            headers=dict(h, **{"Content-Type": "application/json"}))
        resp = cell.getresponse()
        self.assertEqual(resp.status, 200)
        while b"started" not in resp.readline():
            pass
        key = {"X-API-KEY": self.srv.token}
        r = self.srv.request("POST", "/sandboxes/%s/timeout" % sid, {"timeout": 1}, headers=key,
                             token=False)
        self.assertEqual(r.status, 204, r)
        # The deadline is a wall-clock time: wait until it has passed, touching nothing.
        deadline = time.time() + 1.5
        while time.time() < deadline:
            time.sleep(0.1)
        wrong = dict(h, **{"X-Access-Token": "0" * len(h["X-Access-Token"])})
        r = self.srv.request("GET", "/health", headers=wrong, token=False)
        self.assertEqual(r.status, 401, r)
        self.assertEqual(self.srv.ok("GET", "/v1/sessions/" + sid)["status"], "busy")
        r = self.srv.request("GET", "/health", headers=h, token=False)
        self.assertEqual(r.status, 502, r)
        self.assertEqual(self.srv.request("GET", "/v1/sessions/" + sid).status, 404)
        resp.read()  # the cell's stream ends with its sandbox
        cell.close()

    def test_a_multipart_file_name_too_long_to_keep_is_refused_not_cut(self):
        h = self.box()
        name = "a/" * 511 + "bcdef"  # 1027 bytes: cut at 1023 it would be a/.../a/b
        body = ("--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"%s\"\r\n"
                "Content-Type: application/octet-stream\r\n\r\ndata\r\n--XyZ--\r\n" % name)
        r = self.srv.request("POST", "/files", body.encode(), token=False, headers=dict(
            h, **{"Content-Type": "multipart/form-data; boundary=XyZ"}))
        self.assertEqual((r.status, r.json()["code"]), (400, 400), r)
        self.assertIn("file name", r.json()["message"])
        cut = "/home/user/" + "a/" * 511 + "b"
        r = self.srv.request("POST", "/filesystem.Filesystem/Stat", {"path": cut}, token=False,
                             headers=dict(h, **{"Content-Type": "application/json"}))
        self.assertEqual(r.status, 404, r)


    def test_a_timeout_whose_milliseconds_overflow_is_refused(self):
        # 18446744073709552 s is 2^64 + 384 ms: wrapped, it would be a sandbox gone at once
        huge = 18446744073709552
        key = {"X-API-KEY": self.srv.token}
        r = self.srv.request("POST", "/v2/sandboxes", {"timeout": huge}, headers=key, token=False)
        self.assertEqual((r.status, r.json()["code"]), (400, 400), r)
        self.assertIn("'timeout'", r.json()["message"])
        sid = self.box()["E2b-Sandbox-Id"]
        r = self.srv.request("POST", "/sandboxes/%s/timeout" % sid, {"timeout": huge},
                             headers=key, token=False)
        self.assertEqual((r.status, r.json()["code"]), (400, 400), r)
        r = self.srv.request("GET", "/sandboxes/" + sid, headers=key, token=False)
        self.assertEqual(r.status, 200, r)

    def test_errors_the_server_makes_before_the_route_have_e2b_shape(self):
        # the body limit is the listener's (413 before the handler runs): E2B's shape still,
        # {code: 413} on envd's REST routes, Connect's {code: "resource_exhausted"} on its RPC
        with Server("--e2b", "--max-body", "1") as srv:
            r = srv.request("POST", "/v2/sandboxes", {}, headers={"X-API-KEY": srv.token},
                            token=False)
            self.assertEqual(r.status, 201, r)
            b = r.json()
            h = {"E2b-Sandbox-Id": b["sandboxID"], "X-Access-Token": b["envdAccessToken"]}
            big = b"x" * (2 << 20)
            r = srv.request("POST", "/files?path=big", big, token=False,
                            headers=dict(h, **{"Content-Type": "application/octet-stream"}))
            self.assertEqual(r.status, 413)
            self.assertEqual(r.json()["code"], 413, r)
            self.assertIn("limit", r.json()["message"])
            r = srv.request("POST", "/filesystem.Filesystem/Stat", big, token=False,
                            headers=dict(h, **{"Content-Type": "application/json"}))
            self.assertEqual(r.status, 413)
            self.assertEqual(r.json()["code"], "resource_exhausted", r)
            r = srv.request("POST", "/v2/sandboxes", big, token=False,
                            headers={"X-API-KEY": srv.token})
            self.assertEqual((r.status, r.json().get("code")), (413, 413), r)
            # authentication's errors too: Connect's code on its routes, E2B's elsewhere
            bad = dict(h, **{"X-Access-Token": "wrong", "Content-Type": "application/json"})
            r = srv.request("POST", "/filesystem.Filesystem/Stat", {"path": "x"}, token=False,
                            headers=bad)
            self.assertEqual((r.status, r.json()["code"]), (401, "unauthenticated"), r)
            r = srv.request("GET", "/health", token=False, headers=bad)
            self.assertEqual((r.status, r.json()["code"]), (401, 401), r)

HEX_TOKEN = "0123456789abcdef" * 2  # a key E2B's Python SDK accepts as "e2b_" + hex


def connect_frames(data):
    """The (flags, message) envelopes of a Connect stream's body."""
    frames = []
    while data:
        flags, n = data[0], int.from_bytes(data[1:5], "big")
        frames.append((flags, json.loads(data[5:5 + n])))
        data = data[5 + n:]
    return frames


def connect_envelope(msg):
    body = json.dumps(msg).encode()
    return bytes([0]) + len(body).to_bytes(4, "big") + body


class PythonSdkWire(RuncellTestCase):
    """What E2B's Python SDK (e2b 2.34, e2b-code-interpreter; its source read, since it cannot
    be installed here) sends and expects, reproduced request by request. Each test names the
    SDK's code path it stands for."""

    # Sandbox.create() in e2b/sandbox_sync/sandbox_api.py (_create_sandbox): NewSandbox.to_dict()
    CREATE = {"templateID": "code-interpreter-v1", "allow_internet_access": True,
              "autoPause": False, "autoResume": {"enabled": False}, "envVars": {},
              "metadata": {}, "secure": True, "timeout": 300}
    # Fields e2b.api.client.models.Sandbox.from_dict pops without a default (a KeyError
    # otherwise), and those of SandboxDetail (get_info)
    SANDBOX_KEYS = {"clientID", "envdVersion", "sandboxID", "templateID"}
    DETAIL_KEYS = SANDBOX_KEYS | {"cpuCount", "diskSizeMB", "endAt", "memoryMB", "startedAt",
                                  "state"}
    METRIC_KEYS = {"cpuCount", "cpuUsedPct", "diskTotal", "diskUsed", "memCache", "memTotal",
                   "memUsed", "timestamp", "timestampUnix"}

    @classmethod
    def setUpClass(cls):
        cls.srv = Server("--e2b", token=HEX_TOKEN).start()

    @classmethod
    def tearDownClass(cls):
        cls.srv.close()

    def api(self, method, path, body=None, key="e2b_" + HEX_TOKEN):
        # ApiClient (e2b/api/__init__.py) sends the key as X-API-KEY once validate_api_key
        # has matched it against \Ae2b_[0-9a-f]+\Z
        return self.srv.request(method, path, body, headers={"X-API-KEY": key}, token=False)

    def create(self, **fields):
        r = self.api("POST", "/sandboxes", dict(self.CREATE, **fields))
        if r.status == 201:
            self.addCleanup(self.api, "DELETE", "/sandboxes/" + r.json()["sandboxID"])
        return r

    def test_the_api_key_is_e2b_and_the_token(self):
        self.assertRegex("e2b_" + HEX_TOKEN, r"\Ae2b_[0-9a-f]+\Z")
        self.assertEqual(self.api("GET", "/v2/sandboxes").status, 200)
        self.assertEqual(self.api("GET", "/v2/sandboxes", key=HEX_TOKEN).status, 200)
        for bad in ("e2b_" + HEX_TOKEN[:-1], "e2b_" + HEX_TOKEN + "0", "e2b_e2b_" + HEX_TOKEN,
                    "e2b_", "E2B_" + HEX_TOKEN):
            r = self.api("GET", "/v2/sandboxes", key=bad)
            # handle_api_exception: 401 is AuthenticationException with the body's message
            self.assertEqual((r.status, r.json()["code"]), (401, 401), bad)
            self.assertIn("e2b_", r.json()["message"])

    def test_a_default_create_asks_for_the_internet_and_is_told_how(self):
        # allow_internet_access defaults to True in the SDK: refused by name, saying how
        r = self.create()
        self.assertEqual((r.status, r.json()["code"]), (400, 400), r)
        msg = r.json()["message"]
        self.assertIn("allow_internet_access", msg)
        self.assertIn("--e2b-internet", msg)
        self.assertIn("allow_internet_access=False", msg)
        # autoResume {"enabled": false} and autoPause false ask for nothing
        r = self.create(allow_internet_access=False)
        self.assertEqual(r.status, 201, r)
        self.assertLessEqual(self.SANDBOX_KEYS, set(r.json()), r.json())
        self.assertFalse(r.json()["allowInternetAccess"])
        # autoResume {"enabled": true}: taken (a paused sandbox's next cell or command
        # resumes it, whatever it says); an autoPause that is not a boolean is refused
        self.assertEqual(self.create(allow_internet_access=False,
                                     autoResume={"enabled": True}).status, 201)
        r = self.create(allow_internet_access=False, autoPause="yes")
        self.assertEqual(r.status, 400, r)
        self.assertIn("'autoPause'", r.json()["message"])
        # network={"deny_out": [ALL_TRAFFIC], "allow_out": [...]}: the allowlist
        r = self.create(network={"denyOut": ["0.0.0.0/0"], "allowOut": ["pypi.org"]})
        self.assertEqual(r.status, 201, r)
        info = self.api("GET", "/sandboxes/" + r.json()["sandboxID"]).json()
        self.assertLessEqual(self.DETAIL_KEYS, set(info))
        self.assertEqual(info["network"]["allowOut"], ["pypi.org"])
        self.assertFalse(info["allowInternetAccess"])
        r = self.create(network={"denyOut": ["10.0.0.0/8"]})
        self.assertEqual(r.status, 400)
        self.assertIn("network.denyOut", r.json()["message"])

    def test_list_filters_by_repeated_state(self):
        # Sandbox.list() (sandbox_sync/paginator.py): the state filter is a repeated query
        # parameter, state=running&state=paused, where the JavaScript SDK joins with commas
        sid = self.create(allow_internet_access=False).json()["sandboxID"]
        for query, listed in (("state=running&state=paused", True),
                              ("state=paused&state=running", True),
                              ("state=running,paused", True), ("state=paused", False),
                              ("", True)):
            r = self.api("GET", "/v2/sandboxes?" + query)
            self.assertEqual(r.status, 200, query)
            self.assertEqual(sid in [b["sandboxID"] for b in r.json()], listed, query)

    def test_get_metrics(self):
        # get_metrics() -> GET /sandboxes/{id}/metrics, each item SandboxMetric.from_dict
        sid = self.create(allow_internet_access=False).json()["sandboxID"]
        r = self.api("GET", "/sandboxes/%s/metrics" % sid)
        self.assertEqual(r.status, 200, r)
        (m,) = r.json()
        self.assertEqual(set(m), self.METRIC_KEYS)
        self.assertGreater(m["memTotal"], 0)
        self.assertGreater(m["diskTotal"], 0)
        self.assertLessEqual(m["memUsed"], m["memTotal"])
        self.assertTrue(0 <= m["cpuUsedPct"] <= 100, m)
        r = self.api("GET", "/sandboxes/%s/metrics?start=1&end=2" % sid)
        self.assertEqual(r.json(), [])  # a window without now
        r = self.api("GET", "/sandboxes/nosuch/metrics")
        # 404 is SandboxNotFoundException; the body is Error.from_dict's {code, message}
        self.assertEqual((r.status, r.json()["code"]), (404, 404))

    def test_a_command_past_its_timeout_is_deadline_exceeded(self):
        # commands.run("sleep 30", timeout=1): e2b_connect's call_server_stream sends the
        # timeout as connect-timeout-ms; the stream ends with an end-of-stream error that
        # make_error turns into Code.deadline_exceeded, which handle_rpc_exception makes a
        # TimeoutException
        box = self.create(allow_internet_access=False).json()
        h = {"E2b-Sandbox-Id": box["sandboxID"], "X-Access-Token": box["envdAccessToken"],
             "Content-Type": "application/connect+json", "connect-protocol-version": "1",
             "connect-timeout-ms": "1000", "Keepalive-Ping-Interval": "50"}
        start = {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "sleep 30"], "envs": {}},
                 "stdin": False}
        r = self.srv.request("POST", "/process.Process/Start", connect_envelope(start),
                             headers=h, token=False, timeout=20)
        self.assertEqual(r.status, 200)
        frames = connect_frames(r.body)
        self.assertIn("start", frames[0][1]["event"])
        flags, last = frames[-1]
        self.assertEqual(flags, 2)
        self.assertEqual(last["error"]["code"], "deadline_exceeded", last)


    def box_headers(self):
        box = self.create(allow_internet_access=False).json()
        return {"E2b-Sandbox-Id": box["sandboxID"], "X-Access-Token": box["envdAccessToken"]}

    def unary(self, h, path, msg):
        # e2b_connect's call_unary: JSON codec, connect-protocol-version 1
        return self.srv.request("POST", path, msg, token=False, headers=dict(
            h, **{"Content-Type": "application/json", "connect-protocol-version": "1"}))

    def test_watch_dir_is_polled_by_watcher_id(self):
        # files.watch_dir() (sandbox_sync/filesystem/filesystem.py): CreateWatcher, then
        # WatchHandle.get_new_events() polls GetWatcherEvents, and stop() RemoveWatcher
        h = self.box_headers()
        r = self.unary(h, "/filesystem.Filesystem/CreateWatcher",
                       {"path": "/home/user", "recursive": False})
        self.assertEqual(r.status, 200, r)
        wid = r.json()["watcherId"]
        r = self.srv.request("POST", "/files?path=/home/user/new.txt", b"x", token=False,
                             headers=dict(h, **{"Content-Type": "application/octet-stream"}))
        self.assertEqual(r.status, 200, r)
        events = []
        self.assertTrue(wait_until(lambda: events.extend(self.unary(
            h, "/filesystem.Filesystem/GetWatcherEvents", {"watcherId": wid}).json()["events"])
            or any(e["name"] == "new.txt" for e in events)))
        self.assertEqual({e["type"] for e in events if e["name"] == "new.txt"},
                         {"EVENT_TYPE_CREATE"})
        r = self.unary(h, "/filesystem.Filesystem/RemoveWatcher", {"watcherId": wid})
        self.assertEqual(r.status, 200, r)
        r = self.unary(h, "/filesystem.Filesystem/GetWatcherEvents", {"watcherId": wid})
        self.assertEqual((r.status, r.json()["code"]), (404, "not_found"))
        r = self.unary(h, "/filesystem.Filesystem/CreateWatcher", {"path": "/home/user/no"})
        self.assertEqual((r.status, r.json()["code"]), (404, "not_found"))

    def test_stdin_and_chart_as_the_python_sdk_reads_them(self):
        # commands.run(cmd, background=True, stdin=True), then send_stdin (SendInput with
        # bytes as base64, as json_format writes them) and close_stdin (envd 0.5.2 and up)
        h = self.box_headers()
        stream = dict(h, **{"Content-Type": "application/connect+json",
                            "connect-protocol-version": "1"})
        conn = self.srv.connection()
        conn.request("POST", "/process.Process/Start", body=connect_envelope(
            {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "cat"]}, "stdin": True}),
            headers=stream)
        resp = conn.getresponse()
        head = resp.read(5)
        pid = json.loads(resp.read(int.from_bytes(head[1:], "big")))["event"]["start"]["pid"]
        r = self.unary(h, "/process.Process/SendInput", {
            "process": {"pid": pid}, "input": {"stdin": base64.b64encode(b"py\n").decode()}})
        self.assertEqual(r.status, 200, r)
        r = self.unary(h, "/process.Process/CloseStdin", {"process": {"pid": pid}})
        self.assertEqual(r.status, 200, r)
        frames = connect_frames(resp.read())
        conn.close()
        out = b"".join(base64.b64decode(f["event"]["data"]["stdout"]) for _, f in frames
                       if "data" in f.get("event", {}))
        self.assertEqual(out, b"py\n")
        self.assertEqual(frames[-2][1]["event"]["end"]["exitCode"], 0)
        # run_code with a figure: Result(**data) and its chart, which
        # e2b_code_interpreter/charts.py deserializes by the keys it pops
        code = ("import matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 4])\n"
                "plt.scatter([1], [2])\nplt.show()\nplt.pie([1, 3])\nplt.show()")
        r = self.srv.request("POST", "/execute", {"code": code, "context_id": None,
                                                  "language": None, "env_vars": None},
                             headers=h, token=False)
        charts = [json.loads(line).get("chart") for line in r.body.splitlines()
                  if json.loads(line)["type"] == "result"]
        self.assertEqual([c["type"] for c in charts], ["unknown", "pie"])  # a line and points
        self.assertEqual(set(charts[1]), {"type", "title", "elements"})
        self.assertEqual(set(charts[1]["elements"][0]), {"label", "angle", "radius"})


class InternetMode(RuncellTestCase):
    """--e2b-internet: what E2B's Python SDK asks for by default is the public internet through
    the egress proxy, which still refuses loopback, private and link-local (metadata)
    addresses. No connection leaves the machine: every name here resolves (through
    RUNCELL_NET_HOSTS, the proxy's test hosts file) to an address the proxy refuses."""

    def test_the_internet_through_the_proxy_refuses_special_addresses(self):
        with tempfile.NamedTemporaryFile("w", suffix=".hosts") as hosts:
            hosts.write("127.0.0.1 files.example.test\n10.1.2.3 intranet.example.test\n")
            hosts.flush()
            with Server("--e2b", "--e2b-internet", token=HEX_TOKEN,
                        env={"RUNCELL_NET_HOSTS": hosts.name}) as srv:
                key = {"X-API-KEY": "e2b_" + HEX_TOKEN}
                r = srv.request("POST", "/sandboxes", PythonSdkWire.CREATE, headers=key,
                                token=False)
                self.assertEqual(r.status, 201, r)
                box = r.json()
                self.assertTrue(box["allowInternetAccess"])
                h = {"E2b-Sandbox-Id": box["sandboxID"], "X-Access-Token": box["envdAccessToken"]}
                code = FETCH + "\n".join("print(fetch(%r))" % u for u in (
                    "http://files.example.test:%d/" % srv.port,
                    "http://169.254.169.254/latest/meta-data/",
                    "http://intranet.example.test/"))
                r = srv.request("POST", "/execute", {"code": code}, headers=h, token=False)
                out = "".join(json.loads(line).get("text", "") for line in r.body.splitlines()
                              if json.loads(line)["type"] == "stdout").split("\n")
                out = [line for line in out if line]
                self.assertEqual(len(out), 3, r.body)
                self.assertTrue(out[0].startswith("403 "), out)
                self.assertIn("loopback", out[0])
                self.assertIn("link-local", out[1])
                self.assertIn("private", out[2])
                # allow_internet_access false: no network at all (no proxy variables)
                r = srv.request("POST", "/sandboxes", dict(PythonSdkWire.CREATE,
                                                           allow_internet_access=False),
                                headers=key, token=False)
                self.assertFalse(r.json()["allowInternetAccess"])
        # --e2b-internet is wider than any --net-allow-max: refused at start
        p = runcell("serve", "--e2b", "--e2b-internet", "--net-allow-max", "pypi.org")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--net-allow-max", p.stderr)


class StreamErrors(RuncellTestCase):
    """Connect's streaming shape for errors on streaming RPCs (HTTP 200, an end-of-stream
    envelope {"error": {code, message}}), whoever makes them, and the execution cap's refusal
    in /execute's own stream."""

    def test_streaming_rpc_errors_are_end_of_stream_messages(self):
        with Server("--e2b", "--max-executions", "1", "--max-queued-executions", "1") as srv:
            key = {"X-API-KEY": srv.token}
            boxes = [srv.request("POST", "/sandboxes", {}, headers=key, token=False).json()
                     for _ in range(3)]
            hs = [{"E2b-Sandbox-Id": b["sandboxID"], "X-Access-Token": b["envdAccessToken"]}
                  for b in boxes]
            stream = dict(hs[0], **{"Content-Type": "application/connect+json"})
            # the handler's own refusal, an unknown pid, a route the server has not
            cases = [("Start", {"process": {}}, "invalid_argument", "process.cmd"),
                     ("Connect", {"process": {"pid": 4242}}, "not_found", "no process 4242"),
                     ("Start", {"process": {"cmd": "/bin/true"}, "pty": {"size": {"cols": 80}}},
                      "unimplemented", "pty")]
            for method, msg, code, words in cases:
                r = srv.request("POST", "/process.Process/" + method, connect_envelope(msg),
                                headers=stream, token=False)
                self.assertEqual(r.status, 200, (method, r))
                self.assertEqual(r.headers["Content-Type"], "application/connect+json")
                [(flags, end)] = connect_frames(r.body)
                self.assertEqual(flags, 2)
                self.assertEqual(end["error"]["code"], code, end)
                self.assertIn(words, end["error"]["message"])
            # authentication's, made before the route runs: unauthenticated, unavailable
            r = srv.request("POST", "/process.Process/Start", connect_envelope({}),
                            headers=dict(stream, **{"X-Access-Token": "wrong"}), token=False)
            self.assertEqual(connect_frames(r.body)[0][1]["error"]["code"], "unauthenticated")
            srv.request("DELETE", "/sandboxes/" + boxes[2]["sandboxID"], headers=key,
                        token=False)
            r = srv.request("POST", "/process.Process/Start", connect_envelope({}), token=False,
                            headers=dict(hs[2], **{"Content-Type": "application/connect+json"}))
            self.assertEqual((r.status, connect_frames(r.body)[0][1]["error"]["code"]),
                             (200, "unavailable"))
            # The execution cap: one runs, one waits, the third is told in its own stream
            hold = "import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.02)\n"
            first = srv.connection()
            first.request("POST", "/execute", body=json.dumps(
                {"code": "print('in', flush=True)\n" + hold}), headers=hs[0])
            resp = first.getresponse()
            self.assertIn(b'"stdout"', resp.readline())
            second = srv.connection()
            second.request("POST", "/execute", body=json.dumps({"code": "1"}), headers=hs[1])
            self.assertTrue(wait_until(lambda: b"runcell_executions_queued 1" in srv.request(
                "GET", "/metrics").body))
            r = srv.request("POST", "/execute", {"code": "2"}, headers=hs[1], token=False)
            self.assertEqual(r.status, 200, r)
            msgs = [json.loads(line) for line in r.body.splitlines()]
            self.assertEqual(msgs[0]["type"], "error", msgs)
            self.assertEqual(msgs[0]["name"], "RateLimitError")
            self.assertIn("limit on executions", msgs[0]["value"])
            self.assertEqual(msgs[-1], {"type": "end_of_execution"})
            r = srv.request("POST", "/files?path=go", b"", token=False,
                            headers=dict(hs[0], **{"Content-Type": "application/octet-stream"}))
            self.assertEqual(r.status, 200, r)
            resp.read()
            second.getresponse().read()
            first.close()
            second.close()


class WithoutE2B(RuncellTestCase):
    def test_routes_exist_only_with_the_flag(self):
        with Server() as srv:
            r = srv.request("POST", "/v2/sandboxes", {}, headers={"X-API-KEY": srv.token},
                            token=False)
            self.assertEqual(r.status, 401)  # no E2B route: runcell's own auth, then 404
            r = srv.request("POST", "/v2/sandboxes", {})
            self.assertEqual(r.status, 404)
            self.assertEqual(r.json()["error"]["code"], "not_found")


if __name__ == "__main__":
    unittest.main()
