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
tests/console/artifacts); RUNCELL_UPDATE_SCREENSHOTS=1 also refreshes the ones in docs/img.

The console is written against durable executions (docs/API.md, "The web console": an
execution id in a first "start" line, numbered events, re-attach with
GET .../executions/{id}/events?after=N, "on_disconnect": "continue", a FIFO queue) and a
notebook kept by the server (GET/PUT /v1/sessions/{id}/notebook), and does without them.
SERVER_KEEPS_EXECUTIONS says which the server under test has; the assertions that need the
server's side are under it, and a server that has it while the flag says no fails the test,
so that the flag is turned on when the server side lands.
"""
import gzip
import json
import os
import re
import shutil
import subprocess
import unittest
from concurrent.futures import ThreadPoolExecutor

from rctest import HANG, ROOT, RuncellTestCase, Server, slow
from scripted_model import ScriptedModel

CONSOLE_DIR = os.path.join(ROOT, "tests", "console")
SCENARIOS = os.path.join(CONSOLE_DIR, "scenarios.mjs")
NODE = shutil.which("node") or "/usr/bin/node"
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = os.path.join(os.environ.get("RUNCELL_TEST_ARTIFACTS") or
                         os.path.join(CONSOLE_DIR, "artifacts"), "console")
SHOTS = os.path.join(ROOT, "docs", "img") if os.environ.get("RUNCELL_UPDATE_SCREENSHOTS") else ""
# Set to True when the server keeps executions and notebooks (the lead's side of the
# contract above): the reload test then asserts the cell goes on, whole, across the reload.
SERVER_KEEPS_EXECUTIONS = True


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
    {"answer": "Revenue rose from **120** in January to **171** in May (738 in all); "
               "the chart is `chart.png`."},
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

    def scenario(self, name, **extra_env):
        env = dict(os.environ, RUNCELL_URL=self.srv.base_url, RUNCELL_LOGIN_URL=self.login_url,
                   RUNCELL_TOKEN=self.srv.token, ARTIFACTS=ARTIFACTS, SHOTS=SHOTS,
                   HANG_MS=str(int(slow(60) * 1000)), CHROMIUM=CHROMIUM, **extra_env)
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
        if name != "reload":
            self.assertEqual(out["beforeunload"], [], out)
        for shot in out.get("shots", []):
            self.assertGreater(os.path.getsize(shot), 1000, shot)
        return out

    # ---- the wire ----

    def test_console_files_carry_the_security_headers(self):
        for path in ("/ui/", "/ui/app.js", "/ui/console.css", "/ui/vendor/codemirror/lib/codemirror.js"):
            r = self.srv.request("GET", path, token=False)
            self.assertEqual(r.status, 200, (path, r))
            csp = r.headers["Content-Security-Policy"]
            for directive in ("default-src 'none'", "script-src 'self'", "style-src 'self' data:;",
                              "frame-ancestors 'none'",
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

    def test_assets_are_gzipped_for_clients_that_take_it(self):
        total = {"identity": 0, "gzip": 0}
        for path in ("/ui/", "/ui/app.js", "/ui/notebook.js", "/ui/console.css",
                     "/ui/vendor/codemirror/lib/codemirror.js"):
            plain = self.srv.request("GET", path, token=False)
            zipped = self.srv.request("GET", path, headers={"Accept-Encoding": "gzip, deflate, br"},
                                      token=False)
            self.assertEqual(zipped.status, 200)
            self.assertEqual(zipped.headers["Content-Encoding"], "gzip", path)
            self.assertEqual(zipped.headers["Vary"], "Accept-Encoding")
            self.assertEqual(gzip.decompress(zipped.body), plain.body, path)
            self.assertLess(len(zipped.body), len(plain.body) * 0.5, path)
            self.assertNotEqual(zipped.headers["ETag"], plain.headers["ETag"])
            self.assertIsNone(plain.headers["Content-Encoding"])
            self.assertIn("Content-Security-Policy", zipped.headers)
            total["identity"] += len(plain.body)
            total["gzip"] += len(zipped.body)
            # Its own ETag revalidates the gzip form; the other form's does not.
            again = self.srv.request("GET", path, token=False, headers={
                "Accept-Encoding": "gzip", "If-None-Match": zipped.headers["ETag"]})
            self.assertEqual((again.status, again.body), (304, b""))
            other = self.srv.request("GET", path, token=False, headers={
                "Accept-Encoding": "gzip", "If-None-Match": plain.headers["ETag"]})
            self.assertEqual(other.status, 200)
        print("\nconsole assets: %d bytes, %d gzipped (%.0f%%)" % (
            total["identity"], total["gzip"], 100.0 * total["gzip"] / total["identity"]))
        for ae in ("gzip;q=0", "identity", "br", "deflate, gzip;q=0.0"):
            r = self.srv.request("GET", "/ui/app.js", headers={"Accept-Encoding": ae}, token=False)
            self.assertIsNone(r.headers["Content-Encoding"], ae)
        for ae in ("*", "GZIP", "br;q=1, *;q=0.5", "x-gzip"):
            r = self.srv.request("GET", "/ui/app.js", headers={"Accept-Encoding": ae}, token=False)
            self.assertEqual(r.headers["Content-Encoding"], "gzip", ae)
        head = self.srv.request("HEAD", "/ui/app.js", headers={"Accept-Encoding": "gzip"}, token=False)
        zipped = self.srv.request("GET", "/ui/app.js", headers={"Accept-Encoding": "gzip"}, token=False)
        self.assertEqual(head.headers["Content-Length"], str(len(zipped.body)))
        # An image is not worth compressing: served as it is.
        svg = self.srv.request("GET", "/ui/favicon.svg", headers={"Accept-Encoding": "gzip"}, token=False)
        self.assertEqual(svg.status, 200)

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

    def test_a_secret_from_the_form_goes_to_the_server_once_and_is_shown_nowhere(self):
        value = "Bearer rctest-console-%s" % os.urandom(8).hex()
        out = self.scenario("secret_form", SECRET_VALUE=value)
        self.assertEqual(out["posted"][0]["secrets"],
                         [{"host": "api.example.com", "header": "X-Api-Key", "value": value}])
        self.assertEqual(out["posted"][0]["network"],
                         {"mode": "allowlist", "allow": ["api.example.com"]})
        self.assertIn("secrets: api.example.com (X-Api-Key)", out["meta"])
        self.assertEqual((out["cell"]["status"], out["cell"]["stream"]), ("ok", "False\n"),
                         out["cell"])
        self.assertFalse(out["valueInPage"])
        self.assertFalse(out["valueInForm"])
        described = self.srv.ok("GET", "/v1/sessions/" + out["sid"])
        self.assertNotIn(value, json.dumps(described))
        self.assertNotIn(value, self.srv.log())
        self.assertIn("give it an allowlist that names other.example.com", out["refused"])

    def test_a_second_tab_is_logged_in_and_sees_the_same_sessions_and_notebook(self):
        out = self.scenario("tabs")
        self.assertEqual(out["secondTabLoginForm"], 0)  # the first tab gave it the token
        self.assertTrue(out["secondTabToken"])
        self.assertEqual([c["source"] for c in out["secondTabCells"]][:1], ['x = 41\nprint("x is", x)'])
        self.assertEqual(out["secondTabCells"][0]["stream"], "x is 41\n")
        self.assertEqual(out["secondTabCells"][0]["prompt"], "[1]")
        self.assertTrue(out["storedInSecond"])  # closed with a checkpoint in the first tab
        self.assertIn("files and variables", out["kept"])
        self.assertNotEqual(out["resumed"], out["sid"])
        self.assertEqual(out["resumedSources"][0], 'x = 41\nprint("x is", x)')  # its notebook
        self.assertEqual(out["again"]["texts"], ["42"])  # and its variables
        self.assertIsNone(out["firstLoggedOut"])
        live = self.srv.ok("GET", "/v1/sessions")["sessions"]
        self.assertIn(out["resumed"], [s["id"] for s in live])

    def test_agent_run_as_a_conversation_then_its_review_resolved(self):
        out = self.scenario("agent")
        types = [s["type"] for s in out["steps"]]
        self.assertEqual(types, ["observation failed", "observation ok"], out["steps"])
        self.assertIn("KeyError", out["steps"][0]["observation"])
        self.assertIn("df['revenu'].sum()", out["steps"][0]["code"])
        self.assertTrue(out["steps"][0]["open"])      # a failed step stays open
        self.assertFalse(out["steps"][1]["open"])     # a good one folds away
        # The chart step printed while it ran: that output came live, before its observation.
        self.assertGreater(out["steps"][1]["live"], 0)
        self.assertIn("total 738", out["steps"][1]["observation"])
        # The answer once, first, as markdown; the steps folded under it.
        self.assertTrue(out["answerFirst"])
        self.assertEqual(out["answerCount"], 1)
        self.assertIn("Revenue rose from 120 in January to 171 in May", out["answer"])
        self.assertEqual(out["answerStrong"], ["120", "171"])
        self.assertFalse(out["stepsOpen"])
        self.assertEqual([c["alt"] for c in out["charts"]], ["chart.png"])
        self.assertGreater(out["charts"][0]["w"], 100)
        self.assertEqual(out["downloadName"], "chart.png")
        self.assertEqual(out["downloadHead"], [0x89, 0x50, 0x4E, 0x47])  # a PNG
        for scan in out["axe"]:
            self.assertEqual((scan["critical"], scan["serious"]), (0, 0), scan)
        failed = out["failed"]
        self.assertEqual(failed["heading"], "Could not finish")
        self.assertIn("It stopped because", failed["text"])
        self.assertNotIn("repairs it next", failed["text"])
        self.assertTrue(failed["stepsOpen"])
        self.assertIn("fallback", failed["notes"])
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

    def test_keyboard_only_from_login_to_a_chart(self):
        out = self.scenario("keyboard")
        self.assertEqual(out["loginFocus"], "token-input")
        self.assertGreater(out["tabsToCreate"], 0)
        self.assertTrue(out["startFocus"]["inEditor"])
        self.assertEqual(out["startFocus"]["label"], "Code of cell 1")  # a labelled editor
        self.assertTrue(out["startFocus"]["ring"])  # and its focus shows
        self.assertGreater(out["chart"], 100)
        self.assertRegex(out["announced"], r"^Cell 1 finished: ok in \d+ ms$")
        self.assertEqual((out["afterRun"]["cell"], out["afterRun"]["inEditor"]), (2, True))
        esc = out["afterEsc"]
        self.assertEqual((esc["isCell"], esc["cell"], esc["mode"], esc["ring"]), (True, 2, "command", True))
        # Tab leaves the cell (no trap), for the cell's own controls; Shift+Tab comes back.
        tab = out["afterTab"]
        self.assertFalse(tab["inEditor"])
        self.assertFalse(tab["isCell"])
        self.assertEqual((out["afterShiftTab"]["isCell"], out["afterShiftTab"]["cell"]), (True, 2))
        self.assertEqual((out["afterUp"]["cell"], out["afterK"]["cell"]), (1, 1))
        self.assertEqual((out["afterEnter"]["cell"], out["afterEnter"]["inEditor"]), (1, True))
        self.assertEqual((out["afterJ"]["cell"], out["afterJ"]["isCell"]), (2, True))
        self.assertEqual((out["afterB"]["cell"], out["afterB"]["cells"]), (2, 3))
        self.assertIn("<h2>Notes, <em>typed</em></h2>", out["markdown"])
        self.assertEqual(out["afterMarkdown"]["cell"], 3)
        self.assertEqual(out["countAfterA"], 4)
        self.assertEqual((out["typeAfterM"], out["typeAfterY"]), ("markdown", "code"))
        self.assertEqual((out["countAfterDD"], out["countAfterZ"]), (3, 4))
        self.assertEqual(out["runningButton"], "Stop")
        self.assertEqual(out["header"], "running")
        i = out["interrupted"]
        self.assertEqual((i["status"], i["state"], i["error"]), ("error", "kept", "KeyboardInterrupt: "))
        self.assertTrue(out["help"])
        self.assertTrue(out["editorFocus"]["inEditor"])
        self.assertTrue(out["editorFocus"]["ring"])

    def test_axe_finds_nothing_critical_or_serious_in_any_view_light_or_dark(self):
        out = self.scenario("a11y")
        views = sorted({(s["view"], s["scheme"]) for s in out["scans"]})
        self.assertEqual(len(views), 14, views)  # 7 views, 2 schemes
        for scan in out["scans"]:
            self.assertEqual((scan["critical"], scan["serious"]), (0, 0), scan)
        # The dark theme is dark.
        rgb = [int(x) for x in re.findall(r"\d+", out["darkBackground"])[:3]]
        self.assertLess(sum(rgb), 3 * 60, out["darkBackground"])

    def test_a_phone_reaches_every_control_in_every_view(self):
        out = self.scenario("mobile")
        for view, v in out["views"].items():
            self.assertLessEqual(v["overflow"], 0, (view, v))  # nothing wider than the screen
            self.assertEqual(v["reach"]["bad"], [], view)
            self.assertGreater(v["reach"]["count"], 3, view)
        lay = out["layout"]
        self.assertEqual(lay["viewport"], 390)
        self.assertGreater(lay["editor"], 300)  # the editor is the cell's width, not 2 px
        self.assertGreaterEqual(lay["filesTop"], lay["cellsBottom"])  # files below the cells
        self.assertEqual(out["c1"]["status"], "ok")
        self.assertEqual(out["c1"]["stream"], "tapped\n")
        self.assertEqual(len(out["c1"]["images"]), 1)

    def test_running_cells_queue_stop_and_a_failure_empties_the_queue(self):
        out = self.scenario("running")
        self.assertEqual(out["header1"], "running")
        self.assertEqual(out["button1"], "Stop")
        self.assertEqual(out["button1Label"], "Stop cell 1")
        self.assertEqual(out["header2"], "running, 1 queued")
        self.assertEqual(out["button2"], "Stop")
        self.assertEqual(out["queuedAnnounced"], "Cell 2 queued")
        self.assertEqual(out["c1"]["stream"], "".join("step %d\n" % i for i in range(8)))
        self.assertEqual((out["c2"]["status"], out["c2"]["stream"]), ("ok", "second, after 7\n"))
        self.assertEqual((out["c1"]["count"], out["c2"]["count"]), ("1", "2"))
        self.assertEqual(out["header3"], "idle")
        c3 = out["c3"]
        self.assertEqual((c3["status"], c3["state"], c3["error"]), ("error", "kept", "KeyboardInterrupt: "))
        self.assertEqual(c3["button"], "Run")
        self.assertEqual(out["c4"]["error"], "ValueError: stop here")
        self.assertEqual(out["c5"]["status"], "cancelled")
        self.assertIn("an earlier cell failed", out["c5"]["statusLine"])
        self.assertEqual((out["c6"]["status"], out["c6"]["stream"]), ("ok", "six\n"))
        self.assertEqual(out["c7"]["status"], "cancelled")
        self.assertIn("taken out of the queue", out["c7"]["statusLine"])
        self.assertEqual(out["count"], "executions: 5")  # 5 and 7 never ran

    def test_a_reload_mid_run_keeps_the_notebook_and_the_cell(self):
        out = self.scenario("reload")
        before = out["afterReload"]
        # The notebook comes back: both cells, the finished one's output, the running one's
        # output up to the reload.
        self.assertEqual(before[0]["source"], "x = 1")
        self.assertTrue(before[1]["source"].startswith("import time\nfor i in range(20):"))
        self.assertIn("tick 3\n", before[1]["stream"])
        c2 = out["c2"]
        durable = out["durable"] == "true"
        if not SERVER_KEEPS_EXECUTIONS:
            self.assertFalse(durable, "the server now keeps executions: set SERVER_KEEPS_EXECUTIONS")
            # Without the server's side: the page warned before the reload (the stream closing
            # interrupts the cell), and says what became of the cell.
            self.assertEqual(out["durable"], "false")
            self.assertEqual(len(out["beforeunload"]), 1, out["beforeunload"])
            self.assertEqual(c2["status"], "lost")
            self.assertIn("this server interrupts a cell whose page goes away", c2["statusLine"])
            self.assertIn("kept in this browser", out["saved"])
            self.assertIn("tick 3\n", out["otherTab"]["stream"])
            return
        # NEEDS THE SERVER'S SIDE (durable executions and the notebook route): no warning, the
        # cell went on while the page reloaded, re-attached from its last event, its output
        # whole and once; the notebook is the server's, and another tab follows it too.
        self.assertEqual(out["beforeunload"], [])
        self.assertEqual((c2["status"], c2["state"]), ("ok", "kept"), c2)
        self.assertEqual(c2["stream"], "".join("tick %d\n" % i for i in range(20)))
        self.assertEqual(out["saved"], "kept with the session")
        self.assertEqual(out["otherTab"]["stream"], c2["stream"])
        nb = self.srv.ok("GET", "/v1/sessions/%s/notebook" % out["sid"])
        self.assertEqual(len(nb["cells"]), 3)

    def test_output_long_coloured_progress_scripts_and_styler(self):
        out = self.scenario("output")
        long = out["long"]
        self.assertTrue(long["hasFirst"] and long["hasLast"])  # all of it is there...
        self.assertLess(long["height"], 800)  # ...in a scroll box
        self.assertEqual(long["showAll"], "Show all (10000 lines)")
        self.assertGreater(out["longExpanded"], 10000 * 10)
        self.assertLess(out["longCollapsed"], 800)
        self.assertEqual(out["c2"]["stream"], "red bold green on blue bright plain\nprogress 100%\ndone\n")
        self.assertEqual(out["spans"], [["stdout ansi-fg-1", "red"],
                                        ["stdout ansi-fg-2 ansi-bold", "bold green"],
                                        ["stdout ansi-bg-4", "on blue"],
                                        ["stdout ansi-fg-11", "bright"]])
        self.assertNotIn("\x1b", out["c2"]["streamHtml"])
        self.assertEqual(out["c3"]["stderr"], "5/5 [#####]\n")  # a progress bar, one line
        self.assertIn("needs Plotly's scripts, which the console does not run", out["note"])
        self.assertEqual(out["saveHtml"], 1)
        # pandas Styler's colours are kept in the frame; its <script> still does not run, nor
        # does a style attribute apply (the CSP holds).
        colours = dict(out["styler"])
        self.assertEqual(colours["5"], "rgb(200, 30, 30)")
        self.assertEqual(colours["9"], "rgb(200, 30, 30)")
        self.assertNotEqual(colours["1"], "rgb(200, 30, 30)")
        self.assertEqual(out["frameSandbox"], "")
        self.assertIsNone(out["flag"])
        # The caps: a notebook past its size loses its largest output, said in its place;
        # one output is kept head and tail; a cell shows its stream up to a cap, and counts
        # the rest.
        caps = out["caps"]
        self.assertLessEqual(caps["fittedLength"], 2 << 20)
        self.assertIn("was not kept: the notebook is kept up to 2097152", caps["fittedNote"])
        self.assertEqual(caps["fittedSmall"], "small")
        self.assertTrue(caps["cutHead"] and caps["cutTail"] and caps["cutNote"])
        self.assertLess(caps["cutLength"], 270000)
        self.assertEqual((caps["termShown"], caps["termDropped"]), (100, 150))

    def test_markdown_cells_ipynb_export_and_import_and_run_all(self):
        try:
            import nbformat
        except ImportError:
            self.skipTest("python3-nbformat is not installed (scripts/install-deps installs it)")
        from nbformat import v4
        src = os.path.join(ARTIFACTS, "made-by-nbformat.ipynb")
        nb = v4.new_notebook(cells=[
            v4.new_markdown_cell("## Imported"),
            v4.new_code_cell("y = 6 * 7\nprint('y is', y)", execution_count=1,
                             outputs=[v4.new_output("stream", name="stdout", text="y is 42\n")]),
            v4.new_code_cell("%%bash\necho imported bash")])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, src)
        out = self.scenario("ipynb", IPYNB_IN=src)
        md = out["md"]
        self.assertEqual((md["h1"], md["strong"], md["code"]), ("Sales", "bold", "code"))
        self.assertEqual(md["items"], ["one", "two"])
        self.assertEqual(md["cells"], ["1", "2"])
        # Only the safe link is a link, opened apart; markup stays text.
        self.assertEqual(md["links"], [["safe link", "https://example.com/x", "noopener noreferrer", "_blank"]])
        self.assertEqual((md["imgs"], md["scripts"]), (0, 0))
        self.assertIn('<img src=x onerror="top.__pwned=2">', md["text"])
        self.assertIsNone(out["flag"])
        self.assertEqual(out["c2"]["texts"], ["42"])
        self.assertEqual(out["c3"]["stream"], "from bash\n")
        # The export is a valid nbformat 4 notebook with what the page showed.
        self.assertTrue(out["exportName"].endswith(".ipynb"))
        exported = nbformat.read(out["exportPath"], as_version=4)
        nbformat.validate(exported)
        cells = exported.cells
        self.assertEqual([c.cell_type for c in cells[:3]], ["markdown", "code", "code"])
        self.assertTrue(cells[0].source.startswith("# Sales"))
        self.assertEqual(cells[1].execution_count, 1)
        self.assertEqual([o.output_type for o in cells[1].outputs], ["stream", "display_data"])
        self.assertEqual(cells[1].outputs[1].data["text/plain"], "42")
        self.assertEqual(cells[2].source, '%%bash\necho "from bash"')
        self.assertEqual(cells[2].outputs[0].text, "from bash\n")
        # The import: after the page's cells, markdown, code with its outputs, bash.
        imp = out["imported"][-3:]
        self.assertEqual([(c["type"], c["lang"]) for c in imp],
                         [("markdown", "markdown"), ("code", "python"), ("code", "bash")])
        self.assertEqual(imp[1]["stream"], "y is 42\n")
        self.assertEqual(imp[2]["source"], "echo imported bash")
        self.assertIn("nbformat 3", out["importError"])
        runs = [c for c in out["afterRunAll"] if c["status"] != "new"]
        self.assertTrue(all(c["status"] == "ok" for c in runs), runs)
        self.assertIn("y is 42\n", [c["stream"] for c in runs])
        self.assertIn("imported bash\n", [c["stream"] for c in runs])
        counts = [int(c["count"]) for c in runs if c["count"]]
        self.assertEqual(counts, sorted(counts))  # top to bottom

    def test_stored_sessions_true_paged_and_polled_only_when_it_may_change(self):
        def made(checkpoint):
            sid = self.srv.create_session()
            self.srv.ok("DELETE", "/v1/sessions/%s%s" % (sid, "?checkpoint=true" if checkpoint else ""))
            return sid
        with ThreadPoolExecutor(4) as pool:
            kept = list(pool.map(made, [True] * 21))
            closed = list(pool.map(made, [False] * 3))
        out = self.scenario("sessions_list", SESSIONS_MADE=json.dumps({"kept": kept, "closed": closed}))
        rows = dict(out["rows"])
        self.assertEqual(len(rows), 20)
        self.assertEqual(out["closedShown"], 0)  # closed without a checkpoint: not resumable
        for sid in kept:
            if sid in rows:
                self.assertEqual(rows[sid], "0 files and variables")
        self.assertRegex(out["page"], r"^page 1 of 2 \(\d+ sessions\)$")
        self.assertRegex(out["hidden"], r"^\d+ more ended without keeping anything")
        self.assertGreaterEqual(len(out["rows2"]), 1)
        self.assertFalse(set(out["rows2"]) & set(rows))
        self.assertEqual(out["delays"], [3000, 6000, 12000, 24000, 48000, 60000, 60000])
        self.assertEqual(out["pollsWhileHidden"], 0)
        self.assertEqual(out["pollsWhenShown"], 1)
        self.assertEqual(out["delayWhenShown"], 3000)

    def test_an_ended_session_says_so_plainly_and_resumes_with_its_notebook(self):
        out = self.scenario("expiry")
        self.assertEqual(out["c1"]["stream"], "still here\n")
        banner = out["banner"]
        self.assertIn("This session has ended. It was idle longer than its idle timeout (2 s), "
                      "so it was stopped.", banner)
        self.assertIn("Its files and variables were kept", banner)
        self.assertNotIn("resume_from", banner)  # no API syntax
        self.assertNotIn("POST", banner)
        self.assertNotEqual(out["resumed"], out["sid"])
        self.assertEqual(out["resumedCells"][0]["source"], 'kept = "still here"\nprint(kept)')
        self.assertEqual(out["resumedCells"][0]["stream"], "still here\n")
        self.assertEqual(out["again"]["texts"], ["'still here'"])

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
