"""test_mcp_frameworks - runcell's MCP server as three agent frameworks use it, with every client
setting at its default: the OpenAI Agents SDK (@openai/agents, its MCPServerStdio and
MCPServerStreamableHttp), the Vercel AI SDK (ai + @ai-sdk/mcp) and LangChain.js
(@langchain/mcp-adapters + @langchain/langgraph's ReAct agent), from npm (pinned in
tests/agent-frameworks/package.json, installed by scripts/install-test-servers), each driven by
tests/agent-frameworks/drive.mjs against `runcell mcp` and against /mcp of `runcell serve`.

The model is tests/lib/scripted_model.py on 127.0.0.1: it answers with the tool calls of a
script (over the Responses API for the Agents SDK and the AI SDK, Chat Completions for
LangChain: each framework's default), and records what each framework showed it. A conversation goes through what a model
needs of a code interpreter: a session handle kept across calls (state), a chart it receives
as an image with a caption, a KeyError it repairs from the traceback, and (once per framework,
the three at once) a 70 s cell that must come through although the frameworks keep the MCP
SDK's 60 s request timeout (the Agents SDK and LangChain) or none (the AI SDK).

SandboxAgents: the Agents SDK's Sandbox Agents with @openai/agents-extensions' E2B client,
pointed at `runcell serve --e2b` by E2B's own environment variables (docs/MCP.md says why
that rather than a client of runcell's own).
"""
import json
import os
import subprocess
import threading
import unittest

from rctest import HANG, ROOT, RUNCELL, RuncellTestCase, ServeProcess, shutil_which
from scripted_model import ScriptedModel, message_text, tool_results

FRAMEWORKS_DIR = os.path.join(ROOT, "tests", "agent-frameworks")
FRAMEWORKS = ("openai-agents", "ai-sdk", "langchain")
PACKAGES = ("@openai/agents", "ai", "@ai-sdk/mcp", "@langchain/mcp-adapters",
            "@langchain/langgraph")
PNG_B64 = "iVBORw0KGgo"  # how every PNG starts in base64


def frameworks_missing():
    """Why the frameworks cannot run here, or None (after scripts/install-test-servers tried,
    or with RUNCELL_REQUIRE_TEST_SERVERS set, they must: their tests fail instead)."""
    if os.environ.get("RUNCELL_REQUIRE_TEST_SERVERS") or os.path.exists(
            os.path.join(FRAMEWORKS_DIR, ".install-tried")):
        return None
    if not shutil_which("node"):
        return "node is not installed (scripts/install-deps installs it)"
    for pkg in PACKAGES:
        if not os.path.isfile(os.path.join(FRAMEWORKS_DIR, "node_modules", pkg, "package.json")):
            return ("%s is not installed in tests/agent-frameworks (run "
                    "scripts/install-test-servers)" % pkg)
    return None


def session(code, **args):
    return {"tool": "run_code", "args": dict(args, code=code), "session": True}


CONVERSATION = [
    {"tool": "create_session", "args": {}},
    session("x = 6 * 7\nprint('x is', x)"),
    session("x + 1"),
    session("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('trend')"),
    session("row = {'name': 'x'}\nrow['fare']"),
    session("row.get('fare', 0)"),
    {"answer": "done"},
]
LONG_CELL = [
    {"tool": "create_session", "args": {}},
    session("import time\nfor i in range(7):\n    print('tick', i, flush=True)\n"
            "    time.sleep(10)\n'long cell done'", timeout_s=120),
    {"tool": "wait_for_cell", "while_running": True},
    {"answer": "done"},
]


def drive(framework, transport, model, target, token=None, prompt="Analyse the data.",
          env=None):
    argv = ["node", os.path.join(FRAMEWORKS_DIR, "drive.mjs"), framework, transport,
            model.base_url, target] + ([token] if token else []) + [prompt]
    p = subprocess.run(argv, cwd=FRAMEWORKS_DIR, capture_output=True, text=True,
                       timeout=HANG * 3, env=dict(os.environ, **(env or {})))
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if not lines:
        raise AssertionError("%s over %s printed nothing (exit %d): %s" % (
            framework, transport, p.returncode, p.stderr[-3000:]))
    out = json.loads(lines[-1])
    out["stderr"] = p.stderr
    return out


def tool_messages(model, i):
    """The tool results the model was shown in request i."""
    return tool_results(model.requests[i]["body"])


def conversation(request):
    """Everything a request shows the model: its messages, or its Responses input."""
    body = request["body"]
    return body.get("messages", body.get("input", []))


def images_in(request):
    """The image parts a request carries, wherever the framework put them."""
    found = []

    def walk(v):
        if isinstance(v, dict):
            if v.get("type") in ("image_url", "input_image", "image"):
                found.append(v)
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
    walk(conversation(request))
    return found


class Frameworks(RuncellTestCase):
    @classmethod
    def setUpClass(cls):
        why = frameworks_missing()
        if why:
            raise unittest.SkipTest(why)
        cls.server = ServeProcess()
        cls.server.__enter__()
        cls.url = "http://127.0.0.1:%d/mcp" % cls.server.port

    @classmethod
    def tearDownClass(cls):
        cls.server.__exit__()

    def converse(self, framework, transport, script):
        with ScriptedModel(script) as model:
            if transport == "stdio":
                out = drive(framework, "stdio", model, RUNCELL)
            else:
                out = drive(framework, "http", model, self.url, self.server.token)
        return out, model

    def check_conversation(self, framework, transport):
        out, model = self.converse(framework, transport, CONVERSATION)
        self.assertNotIn("error", out, out.get("error", "") + out["stderr"][-2000:])
        self.assertEqual(out["final"], "done")
        reqs = model.requests
        self.assertEqual(len(reqs), len(CONVERSATION), tool_messages(model, -1))
        # state: the handle create_session gave carries x from one call to the next
        self.assertIn("x is 42", message_text(tool_messages(model, 2)[-1]))
        state = message_text(tool_messages(model, 3)[-1])
        self.assertEqual(state.splitlines()[0], "43")
        self.assertRegex(state, r"\[runcell\] session \S+, cell 2$")
        # the chart: its caption as text, the picture as an image part where the framework
        # sends images to a Chat Completions model, and never base64 inside text
        chart = tool_messages(model, 4)[-1]
        self.assertRegex(message_text(chart), r"figure 1: PNG, 640x480, \d+ KB")
        for m in conversation(reqs[4]):
            self.assertNotIn(PNG_B64, message_text(m), "base64 in a text the model reads")
        images = images_in(reqs[4])
        self.assertEqual(len(images), 1, "the chart did not reach the model as an image")
        self.assertIn(PNG_B64, json.dumps(images[0]))
        # the error and its repair
        self.assertIn("KeyError: 'fare'", message_text(tool_messages(model, 5)[-1]))
        self.assertIn("0", message_text(tool_messages(model, 6)[-1]))
        # no structured record in what the model reads
        for m in tool_messages(model, 6):
            self.assertNotIn('"execution_count"', message_text(m))
            self.assertNotIn('"usage"', message_text(m))
        return model, chart

    def run_both(self, framework):
        for transport in ("stdio", "http"):
            with self.subTest(transport=transport):
                self.check_conversation(framework, transport)


class OpenAIAgents(Frameworks):
    def test_conversation(self):
        self.run_both("openai-agents")


class VercelAiSdk(Frameworks):
    def test_conversation(self):
        self.run_both("ai-sdk")


class LangChain(Frameworks):
    def test_conversation(self):
        self.run_both("langchain")


class LongCells:
    """A 70 s cell in each framework with its default client settings, the three at once,
    started when the module starts (setUpModule) so that they wait while the other cases
    run; LongCellsTest collects them."""

    PLAN = (("openai-agents", "http"), ("ai-sdk", "stdio"), ("langchain", "http"))
    server = None
    threads = []
    results = {}

    @classmethod
    def start(cls):
        if frameworks_missing():
            return
        cls.server = ServeProcess()
        cls.server.__enter__()
        url = "http://127.0.0.1:%d/mcp" % cls.server.port

        def one(framework, transport):
            try:
                with ScriptedModel(list(LONG_CELL)) as model:
                    out = drive(framework, transport, model,
                                RUNCELL if transport == "stdio" else url,
                                None if transport == "stdio" else cls.server.token)
                cls.results[framework] = (out, model)
            except Exception as e:  # reported by the test, with the others' outcome
                cls.results[framework] = e
        cls.threads = [threading.Thread(target=one, args=p) for p in cls.PLAN]
        for t in cls.threads:
            t.start()

    @classmethod
    def stop(cls):
        for t in cls.threads:
            t.join(HANG * 3)
        if cls.server:
            cls.server.__exit__()


def setUpModule():
    LongCells.start()


def tearDownModule():
    LongCells.stop()


class LongCellsTest(RuncellTestCase):
    def test_a_70_s_cell_comes_through(self):
        why = frameworks_missing()
        if why:
            self.skipTest(why)
        for t in LongCells.threads:
            t.join(HANG * 3)
        for framework, _ in LongCells.PLAN:
            with self.subTest(framework=framework):
                got = LongCells.results.get(framework)
                self.assertIsInstance(got, tuple, got)
                out, model = got
                self.assertNotIn("error", out, out.get("error", "") + out["stderr"][-2000:])
                texts = [message_text(m) for m in tool_messages(model, -1)]
                # once past the reply deadline (45 s) the model was told to wait_for_cell,
                # and then got the cell's own result
                self.assertTrue(any("Call wait_for_cell with run_id" in t for t in texts), texts)
                self.assertRegex(texts[-1], r"'long cell done'\n\[runcell\] session \S+, cell 1$",
                                 texts)
                self.assertIn("tick 6", texts[-1])


class SandboxAgents(RuncellTestCase):
    """A SandboxAgent whose sandbox is runcell, through the E2B client of
    @openai/agents-extensions and runcell's E2B-compatible endpoint."""

    SCRIPT = [
        {"tool": "exec_command", "args": {"cmd": "echo hello from $(pwd); python3 -c 'print(6*7)'"}},
        {"tool": "exec_command", "args": {"cmd": (
            "python3 -c \"import matplotlib; matplotlib.use('Agg'); "
            "import matplotlib.pyplot as plt; plt.plot([1, 3, 2]); plt.savefig('chart.png')\" "
            "&& echo saved")}},
        {"tool": "view_image", "args": {"path": "chart.png"}},
        {"tool": "exec_command", "args": {"cmd": "python3 -c 'import sys; sys.exit(3)'"}},
        {"answer": "done"},
    ]

    def test_a_sandbox_agent_runs_in_runcell(self):
        why = frameworks_missing()
        if why:
            self.skipTest(why)
        with ServeProcess("--e2b") as srv, ScriptedModel(list(self.SCRIPT)) as model:
            url = "http://127.0.0.1:%d" % srv.port
            out = drive("sandbox-e2b", "e2b", model, "-", env={
                "E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": srv.token})
            self.assertNotIn("error", out, out.get("error", "") + out["stderr"][-2000:])
            self.assertEqual(out["final"], "done")
            texts = [message_text(m) for m in tool_messages(model, -1)]
            self.assertIn("hello from /home/user\n42", texts[0])  # E2B's home, the workspace
            self.assertIn("exited with code 0", texts[0])
            self.assertIn("saved", texts[1])
            images = images_in(model.requests[3])
            self.assertEqual(len(images), 1, tool_messages(model, 3))
            self.assertIn(PNG_B64, json.dumps(images[0]))
            self.assertIn("exited with code 3", texts[3])
            # the run closed its sandbox: no session is left on the server
            self.assertEqual(srv_sessions(srv), 0)


def srv_sessions(srv):
    import urllib.request
    with urllib.request.urlopen("http://127.0.0.1:%d/healthz" % srv.port, timeout=30) as r:
        return json.load(r)["sessions"]


if __name__ == "__main__":
    unittest.main()
