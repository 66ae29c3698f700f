"""test_console - the web console (`runcell serve` at /ui/) in a real headless Chromium:
Debian's /usr/bin/chromium driven by playwright-core (pinned in tests/console/package.json,
installed by scripts/install-test-servers; it downloads no browser). Each scenario of
tests/console/scenarios.mjs does what a person does in the console and prints what the page
showed; the assertions are on that. A few raw requests check the wire where the browser hides
it (the headers every console response carries, ETags, HEAD, redirects, the login URL).

The server listens on 127.0.0.1 (a free port) with a generated token, so the login URL it
prints is the one a user gets; the agent runs against tests/lib/scripted_model.py on
127.0.0.1. Nothing leaves loopback. Waits are on elements and events; timeouts only stop
hangs. Screenshots of each step go to $RUNCELL_TEST_ARTIFACTS/console (default
tests/console/artifacts); RUNCELL_UPDATE_SCREENSHOTS=1 also refreshes README's two, in
docs/img.
"""
import json
import os
import re
import shutil
import subprocess
import unittest

from rctest import HANG, ROOT, RuncellTestCase, Server, slow
from scripted_model import ScriptedModel

CONSOLE_DIR = os.path.join(ROOT, "tests", "console")
SCENARIOS = os.path.join(CONSOLE_DIR, "scenarios.mjs")
NODE = shutil.which("node") or "/usr/bin/node"
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = os.path.join(os.environ.get("RUNCELL_TEST_ARTIFACTS") or
                         os.path.join(CONSOLE_DIR, "artifacts"), "console")
SHOTS = os.path.join(ROOT, "docs", "img") if os.environ.get("RUNCELL_UPDATE_SCREENSHOTS") else ""


def browser_missing():
    """Why the browser tests cannot run here, or None (with RUNCELL_REQUIRE_TEST_SERVERS, as
    in CI: None, and the tests fail when a piece is missing)."""
    if os.environ.get("RUNCELL_REQUIRE_TEST_SERVERS"):
        return None
    if not os.path.exists(CHROMIUM):
        return "chromium is not installed (scripts/install-deps installs it)"
    if not os.path.exists(NODE):
        return "node is not installed (scripts/install-deps installs it)"
    if not os.path.isdir(os.path.join(CONSOLE_DIR, "node_modules", "playwright-core")):
        return "playwright-core is not installed in tests/console (run scripts/install-test-servers)"
    return None


SALES = "month,revenue\nJan,120\nFeb,135\nMar,160\nApr,152\nMay,171\n"
CHART = ("import pandas as pd\nimport matplotlib.pyplot as plt\n"
         "df = pd.read_csv('sales.csv')\n"
         "ax = df.plot(x='month', y='revenue', marker='o', title='Monthly revenue', legend=False)\n"
         "ax.set_ylabel('revenue')\nplt.savefig('chart.png')\nplt.close()\nprint('total', df['revenue'].sum())")
# The agent's model, in the order the scenarios ask: a run that hits a KeyError, repairs it and
# charts; then a run that fails three times and is filed for review.
SCRIPT = [
    {"tool": "run_python", "code": "import pandas as pd\ndf = pd.read_csv('sales.csv')\n"
                                   "df['revenu'].sum()"},
    {"tool": "run_python", "code": CHART},
    {"answer": "Revenue rose from 120 in January to 171 in May (738 in all); "
               "the chart is chart.png."},
    {"tool": "run_python", "code": "1/0"},
    {"tool": "run_python", "code": "[][1]"},
    {"tool": "run_python", "code": "{}[1]"},
]


@unittest.skipIf(browser_missing(), browser_missing())
class Console(RuncellTestCase):
    @classmethod
    def setUpClass(cls):
        os.makedirs(ARTIFACTS, exist_ok=True)
        cls.model = ScriptedModel(SCRIPT).__enter__()
        cls.srv = Server("--model", "scripted", "--base-url", cls.model.base_url, token=None)
        try:
            cls.srv.start()
        except BaseException:
            cls.model.__exit__(None, None, None)
            raise
        m = re.search(r"web console: (http://\S+/ui/#token=(\S+))", cls.srv.log())
        if not m:
            cls.srv.close()
            cls.model.__exit__(None, None, None)
            raise AssertionError("no login URL in the log:\n" + cls.srv.log())
        cls.login_url = m.group(1)
        cls.login_token = m.group(2)

    @classmethod
    def tearDownClass(cls):
        cls.srv.close()
        cls.model.__exit__(None, None, None)

    def scenario(self, name):
        env = dict(os.environ, RUNCELL_URL=self.srv.base_url, RUNCELL_LOGIN_URL=self.login_url,
                   RUNCELL_TOKEN=self.srv.token, ARTIFACTS=ARTIFACTS, SHOTS=SHOTS,
                   HANG_MS=str(int(slow(60) * 1000)), CHROMIUM=CHROMIUM)
        p = subprocess.run([NODE, SCENARIOS, name], cwd=CONSOLE_DIR, env=env, capture_output=True,
                           text=True, timeout=HANG)
        lines = p.stdout.strip().splitlines()
        out = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
        if p.returncode or not lines:
            self.fail("scenario %s failed (%d):\n%s\n%s\nserver log:\n%s" % (
                name, p.returncode, out.get("failure") or p.stdout[-4000:], p.stderr[-3000:],
                self.srv.log()[-3000:]))
        # Nothing the page did may have been refused or thrown, and no dialog opened.
        self.assertEqual(out["dialogs"], [], out)
        self.assertEqual(out["pageErrors"], [], out)
        for shot in out.get("shots", []):
            self.assertGreater(os.path.getsize(shot), 1000, shot)
        return out

    # ---- the wire ----

    def test_console_files_carry_the_security_headers(self):
        for path in ("/ui/", "/ui/app.js", "/ui/console.css", "/ui/vendor/codemirror/lib/codemirror.js"):
            r = self.srv.request("GET", path, token=False)
            self.assertEqual(r.status, 200, (path, r))
            csp = r.headers["Content-Security-Policy"]
            for directive in ("default-src 'none'", "script-src 'self'", "frame-ancestors 'none'",
                              "object-src 'none'", "base-uri 'none'",
                              "require-trusted-types-for 'script'"):
                self.assertIn(directive, csp, path)
            self.assertNotIn("unsafe-inline", csp)
            self.assertNotIn("unsafe-eval", csp)
            self.assertEqual(r.headers["X-Content-Type-Options"], "nosniff")
            self.assertEqual(r.headers["Referrer-Policy"], "no-referrer")
            self.assertEqual(r.headers["Cross-Origin-Resource-Policy"], "same-origin")
        r = self.srv.request("GET", "/ui/", token=False)
        self.assertEqual(r.headers["Content-Type"], "text/html; charset=utf-8")
        self.assertNotIn(b"<script>", r.body)  # no inline script: every script is a file
        self.assertNotIn(self.srv.token.encode(), r.body)
        self.assertEqual(self.srv.request("GET", "/ui/app.js", token=False).headers["Content-Type"],
                         "text/javascript; charset=utf-8")

    def test_etag_head_and_redirects(self):
        r = self.srv.request("GET", "/ui/app.js", token=False)
        etag = r.headers["ETag"]
        self.assertRegex(etag, r'^"[0-9a-f]{32}"$')
        again = self.srv.request("GET", "/ui/app.js", headers={"If-None-Match": etag}, token=False)
        self.assertEqual((again.status, again.body), (304, b""))
        self.assertEqual(again.headers["ETag"], etag)
        other = self.srv.request("GET", "/ui/app.js", headers={"If-None-Match": '"0"'}, token=False)
        self.assertEqual(other.status, 200)
        head = self.srv.request("HEAD", "/ui/app.js", token=False)
        self.assertEqual((head.status, head.body), (200, b""))
        self.assertEqual(head.headers["Content-Length"], str(len(r.body)))
        for path in ("/", "/ui"):
            red = self.srv.request("GET", path, token=False)
            self.assertEqual((red.status, red.headers["Location"]), (302, "/ui/"), path)
            self.assertIn("Content-Security-Policy", red.headers)
        missing = self.srv.request("GET", "/ui/nope.js", token=False)
        self.assertEqual((missing.status, missing.error_code), (404, "not_found"))
        self.assertIn("nope.js", missing.json()["error"]["message"])
        # The API around it is as before: a token is still needed everywhere else.
        self.assertEqual(self.srv.request("GET", "/v1/sessions", token=False).status, 401)

    def test_login_url_and_where_the_token_is_printed(self):
        self.assertEqual(self.login_token, self.srv.token)
        self.assertTrue(self.login_url.startswith(self.srv.base_url + "/ui/#token="))
        # The token is printed where it was already (just generated) and nowhere else:
        # the request log lines never carry it.
        lines = [l for l in self.srv.log().splitlines() if self.srv.token in l]
        self.assertEqual(len(lines), 2, lines)
        self.assertTrue(lines[1].startswith("runcell: web console: "), lines)
        # A server given its token (not generated) with stderr into a file: the URL comes
        # without it.
        with Server() as other:
            line = [l for l in other.log().splitlines() if "web console" in l]
            self.assertEqual(len(line), 1, other.log())
            self.assertNotIn(other.token, other.log())
            self.assertIn("/ui/ (log in with the API token", line[0])

    # ---- in the browser ----

    def test_login_moves_the_token_out_of_the_url(self):
        out = self.scenario("login")
        self.assertEqual(out["url"], self.srv.base_url + "/ui/#/sessions")
        self.assertNotIn(self.srv.token, out["url"])
        self.assertEqual(out["stored"], self.srv.token)  # in sessionStorage
        self.assertEqual((out["cookies"], out["documentCookie"]), ([], ""))
        self.assertNotIn(self.srv.token, out["html"])
        self.assertEqual(out["nav"], ["Sessions", "Agent", "Reviews", "Health"])
        self.assertEqual(out["urlAfterReload"], self.srv.base_url + "/ui/#/sessions")
        self.assertIsNone(out["storedAfterLogout"])

    def test_a_wrong_token_is_refused_with_a_clear_message(self):
        out = self.scenario("wrong_token")
        self.assertIn("The server refused this token (wrong token)", out["message"])
        self.assertIn("DATA/token", out["message"])
        self.assertIsNone(out["stored"])  # not kept
        self.assertTrue(out["navHidden"])
        self.assertNotIn("not-the-token", out["url"])
        self.assertTrue(out["loggedIn"])  # then the right one, through the form
        self.assertIn("Cannot create the session: field 'memory_mb' is 99999999, more than this "
                      "server allows (8192)", out["createError"])

    def test_notebook_state_tables_charts_errors_and_history(self):
        out = self.scenario("notebook")
        self.assertIn("memory 512 MB", out["meta"])
        self.assertIn("timeout 30 s", out["meta"])
        c1, c2, c3, c4 = out["c1"], out["c2"], out["c3"], out["c4"]
        self.assertEqual((c1["status"], c1["state"], c1["prompt"]), ("ok", "kept", "[1]"))
        self.assertEqual(c1["stream"], "x is 20\nto stderr\n")
        self.assertEqual(c1["stderr"], "to stderr\n")
        self.assertEqual((c2["texts"], c2["prompt"]), (["42"], "[2]"))  # x from cell 1
        self.assertEqual(len(c3["images"]), 1, c3)
        self.assertEqual(c3["images"][0]["src"], "data:image/png;base64,")
        self.assertGreater(c3["images"][0]["w"], 100)
        self.assertEqual(c3["frames"], [{"sandbox": "", "hasSrcdoc": True}])
        self.assertEqual(out["frameCells"], ["Jan", "120", "Feb", "135", "Mar", "160", "Apr",
                                             "152", "May", "171"])
        self.assertEqual((c4["status"], c4["error"]), ("error", "KeyError: 'fare'"))
        self.assertIn('return {}["fare"]', c4["traceback"])
        self.assertIn("state: kept", c4["statusLine"])
        self.assertEqual(out["countBadge"], "executions: 4")
        self.assertEqual(out["recalled"], 'def f():\n    return {}["fare"]\nf()')
        self.assertGreater(out["keywords"], 3)

    def test_files_upload_drop_read_preview_download_delete(self):
        out = self.scenario("files")
        self.assertEqual(out["c1"]["stream"], "3 rows\n")
        self.assertEqual(out["c1"]["texts"], ["415"])
        self.assertEqual(out["c2"]["texts"], ["'a,b\\n1,2\\n'"])  # the dropped file
        self.assertEqual(out["preview"], "month,revenue\nJan,120\nFeb,135\nMar,160\n")
        self.assertEqual(out["previewImageWidth"], 640)
        self.assertEqual(out["downloadName"], "sales.csv")
        self.assertEqual(out["downloaded"], "month,revenue\nJan,120\nFeb,135\nMar,160\n")
        self.assertEqual(out["left"], ["chart.png", "sales.csv"])
        self.assertEqual(out["stillListed"], 0)
        status = self.srv.request("GET", "/v1/sessions/" + out["sid"]).status
        self.assertEqual(status, 404)

    def test_interrupt_timeout_and_restart(self):
        out = self.scenario("interrupt")
        long = out["long"]
        self.assertEqual((long["status"], long["state"]), ("error", "kept"), long)
        self.assertEqual(long["error"], "KeyboardInterrupt: ")
        self.assertIn("tick 2\n", long["stream"])
        self.assertEqual(out["after"]["texts"], ["True"])  # n survived the interrupt
        t = out["timeout"]
        self.assertEqual((t["status"], t["state"]), ("timeout", "kept"), t)
        self.assertIn("state: kept", t["statusLine"])
        self.assertIn("timed out", t["statusLine"])
        r = out["restarted"]
        self.assertEqual((r["status"], r["prompt"]), ("error", "[1]"), r)  # a fresh interpreter
        self.assertEqual(r["error"], "NameError: name 'n' is not defined")

    def test_hostile_output_never_runs_in_the_console(self):
        out = self.scenario("xss")
        self.assertIsNone(out["flag"])  # no payload set it
        self.assertEqual(out["dialogs"], [])
        # Printed markup is text, in order, on both streams.
        self.assertIn('<img src=x onerror="window.__pwned=1;alert(1)">\n', out["c1"]["stream"])
        self.assertIn("<script>window.__pwned=2;alert(2)</script>\n", out["c1"]["stream"])
        self.assertEqual(out["c1"]["stderr"], '<svg onload="window.__pwned=3">\n')
        self.assertNotIn("<img", out["streamHtml"])
        self.assertIn("&lt;img", out["streamHtml"])
        # HTML results: only in frames sandboxed without scripts or same-origin.
        self.assertEqual(out["frameSandboxes"], ["", ""])
        self.assertEqual(out["c2"]["frames"], [{"sandbox": "", "hasSrcdoc": True}])
        self.assertEqual(out["c3"]["frames"], [{"sandbox": "", "hasSrcdoc": True}])
        self.assertEqual(out["boldInFrame"], [0, 1])  # the HTML did render, in its frame
        self.assertEqual(out["c4"]["error"], 'ValueError: <img src=x onerror="window.__pwned=9">')
        self.assertEqual(out["fileNames"], ["<img src=x onerror=alert(10)>.csv"])
        self.assertEqual(out["fileNameHtml"], "&lt;img src=x onerror=alert(10)&gt;.csv")
        self.assertFalse(out["tokenInHtml"])

    def test_a_second_tab_sees_the_same_sessions(self):
        out = self.scenario("tabs")
        self.assertTrue(out["secondTabSees"])
        self.assertTrue(out["storedInSecond"])  # closed with a checkpoint in the first tab
        self.assertNotEqual(out["resumed"], out["sid"])
        live = self.srv.ok("GET", "/v1/sessions")["sessions"]
        self.assertIn(out["resumed"], [s["id"] for s in live])

    def test_agent_run_step_by_step_then_its_review_resolved(self):
        out = self.scenario("agent")
        types = [s["type"] for s in out["steps"]]
        self.assertEqual(types[0], "session")
        self.assertIn("code", types)
        self.assertIn("observation failed", types)  # the KeyError...
        self.assertIn("observation ok", types)      # ...repaired
        self.assertEqual(types[-1], "outcome answered")
        self.assertIn("Revenue rose from 120", out["answer"])
        self.assertEqual([c["alt"] for c in out["charts"]], ["chart.png"])
        self.assertGreater(out["charts"][0]["w"], 100)
        failed = out["failed"]
        ftypes = [s["type"] for s in failed["steps"]]
        self.assertIn("fallback", ftypes)
        self.assertEqual(ftypes[-1], "outcome failed")
        self.assertEqual(len(out["history"]), 2)
        rid = failed["reviewId"]
        self.assertRegex(rid, r"^rv_")
        rv = self.scenario("review")
        self.assertIn(rid, rv["rows"])
        self.assertIn("Task: Find the average of the empty column", rv["incident"])
        self.assertIn("1/0", rv["incident"])
        self.assertIn("resolved", rv["afterText"])
        rec = self.srv.ok("GET", "/v1/reviews/" + rid)
        self.assertEqual(rec["status"], "resolved")
        self.assertEqual(rec["note"], "the input was wrong; <b>fixed</b> by hand")

    def test_health_view_shows_the_metrics(self):
        out = self.scenario("health")
        m = self.srv.request("GET", "/metrics").body.decode()
        pool = re.search(r"^runcell_pool_ready (\d+)", m, re.M).group(1)
        self.assertEqual(out["figures"]["fig-status"], "ok")
        self.assertEqual(out["figures"]["fig-pool"], pool)
        self.assertTrue(out["figures"]["fig-template"].startswith(("ready in", "none")))
        self.assertIn("ok", out["statuses"])


if __name__ == "__main__":
    unittest.main()
