"""Secrets the egress proxy adds for a session (docs/NETWORK.md, "Secrets"): given on the
native API, to `runcell run --secret` and to `runcell agent` (--secret, and --model-access: the
model's own key for code that calls the model), used by real clients in the sandbox (Python's
urllib and requests, curl, git, pip, Node), changed while the session runs, given to forks,
and kept sealed in the session's record when the operator asks (serve --secrets-key).

The module runs in a network namespace of its own: api.test is 127.0.0.2 (TLS on 443, plain
HTTP on 80), other.test 127.0.0.3, both with certificates of a CA the test makes, which
runcell's proxy trusts (SSL_CERT_FILE in its environment) and the sandbox does not."""
import base64
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "lib"))
from memscan import SANDBOX_SCAN  # noqa: E402
from rctest import RUNCELL, RestartableServer, RuncellTestCase, Server, TempDir  # noqa: E402
from scripted_model import ScriptedModel  # noqa: E402
from tlslab import RecordingServer, TestCA, enter_own_netns, netns_missing  # noqa: E402

VALUE = "sk-test-0f1e2d3c4b5a69788796a5b4c3d2e1f0"
ALLOW = ["api.test", "127.0.0.2", "other.test", "127.0.0.3"]


def setUpModule():
    why = netns_missing()
    if why:
        raise unittest.SkipTest(why)
    enter_own_netns()


class Lab:
    """The CA, the servers and the hosts file a class shares."""

    def __init__(self):
        self.ca = TestCA()
        self.api = RecordingServer("127.0.0.2", 443, self.ca.issue("api.test"), "api")
        self.api_http = RecordingServer("127.0.0.2", 80, None, "api-http")
        self.other = RecordingServer("127.0.0.3", 443, self.ca.issue("other.test"), "other")
        self.hosts = os.path.join(self.ca.dir, "hosts")
        with open(self.hosts, "w") as f:
            f.write("127.0.0.2 api.test\n127.0.0.3 other.test\n")
        self.env = {"RUNCELL_NET_HOSTS": self.hosts, "SSL_CERT_FILE": self.ca.cert}

    def close(self):
        for s in (self.api, self.api_http, self.other):
            s.close()
        self.ca.close()


def py(code):
    """A cell that prints, as its last line, the JSON of what code leaves in `out`."""
    return "import json\nout = {}\n" + code + "\nprint(json.dumps(out))"


def last_json(rec):
    return json.loads(rec["stdout"].strip().splitlines()[-1])


class LabCase(RuncellTestCase):
    """The lab for the class, a temporary directory (self.tmp) for each test."""

    @classmethod
    def setUpClass(cls):
        cls.lab = Lab()

    @classmethod
    def tearDownClass(cls):
        cls.lab.close()

    def setUp(self):
        self._tmp = TempDir()
        self.tmp = self._tmp.__enter__()
        self.addCleanup(self._tmp.__exit__, None, None, None)


class Api(RuncellTestCase):
    @classmethod
    def setUpClass(cls):
        cls.lab = Lab()
        cls.srv = Server("--pool", "0", env=cls.lab.env).start()

    @classmethod
    def tearDownClass(cls):
        cls.srv.close()
        cls.lab.close()

    def create(self, secrets, allow=ALLOW, status=201):
        body = {"network": {"mode": "allowlist", "allow": allow}, "secrets": secrets}
        r = self.srv.request("POST", "/v1/sessions", body)
        self.assertEqual(r.status, status, r)
        self.assertNotIn(VALUE.encode(), r.body)
        if status == 201:
            self.addCleanup(self.srv.request, "DELETE", "/v1/sessions/" + r.json()["id"])
        return r.json()

    def test_a_session_sends_its_secret_to_its_host_and_shows_no_value(self):
        info = self.create([{"host": "api.test", "header": "Authorization",
                             "value": "Bearer " + VALUE, "path_prefix": "/v1/"}])
        self.assertEqual(info["network"]["secrets"],
                         [{"host": "api.test", "header": "Authorization", "kind": "header",
                           "path_prefix": "/v1/", "allow_http": False}])
        rec = self.srv.execute(info["id"], py("""
import os, urllib.request, requests
out["urllib"] = urllib.request.urlopen("https://api.test/v1/a", timeout=30).status
out["requests"] = requests.get("https://api.test/v1/b", headers={"Authorization": "x"},
                               timeout=30).status_code
out["outside_prefix"] = requests.get("https://api.test/v2/c", timeout=30).status_code
out["env"] = {k: os.environ.get(k) for k in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE",
              "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "PIP_CERT", "NODE_EXTRA_CA_CERTS")}
"""))
        self.assertStatus(rec, "ok")
        out = last_json(rec)
        self.assertEqual((out["urllib"], out["requests"], out["outside_prefix"]), (200, 200, 200))
        bundle = "/.runcell-net/ca-certificates.crt"
        self.assertEqual(out["env"], {
            "SSL_CERT_FILE": bundle, "REQUESTS_CA_BUNDLE": bundle, "CURL_CA_BUNDLE": bundle,
            "GIT_SSL_CAINFO": bundle, "PIP_CERT": bundle,
            "NODE_EXTRA_CA_CERTS": "/.runcell-net/ca.pem"})
        seen = dict(self.lab.api.seen("authorization"))
        self.assertEqual(seen["/v1/a"], "Bearer " + VALUE)
        self.assertEqual(seen["/v1/b"], "Bearer " + VALUE)  # the client's own was replaced
        self.assertIsNone(seen["/v2/c"])
        events = self.srv.ok("GET", "/v1/sessions/%s/events" % info["id"])["events"]
        got = [(e["method"], e.get("path"), e.get("secret")) for e in events
               if e.get("path")]
        self.assertEqual(got, [("GET", "/v1/a", "Authorization"),
                               ("GET", "/v1/b", "Authorization"), ("GET", "/v2/c", None)])
        self.assertTrue(any(e.get("intercepted") for e in events))
        self.assertNotIn(VALUE, json.dumps(events))

    def test_bad_secrets_are_refused_naming_the_field(self):
        cases = [
            ({"host": "api.test", "header": "Host", "value": VALUE},
             "secrets[0].header: a secret cannot set 'Host'"),
            ({"host": "api.test", "header": "X-Key", "value": VALUE + "\r\nX-Evil: 1"},
             "secrets[0].value holds a control character"),
            ({"host": "nowhere.test", "header": "X-Key", "value": VALUE},
             "nowhere.test port 443 is not on the network allowlist; add 'nowhere.test'"),
            ({"host": "api.test", "basic": {"user": "a:b", "password": VALUE}},
             "secrets[0].basic.user cannot hold ':'"),
            ({"host": "api.test", "header": "X-Key", "value": VALUE, "extra": 1},
             "secrets[0]: unknown field 'extra'"),
        ]
        for secret, message in cases:
            err = self.create([secret], status=400)["error"]
            self.assertEqual(err["code"], "bad_request")
            self.assertIn(message, err["message"])
        r = self.srv.request("POST", "/v1/sessions", {"secrets": [
            {"host": "api.test", "header": "X-Key", "value": VALUE}]})
        self.assertEqual(r.status, 400)
        self.assertIn("the session has no network", r.json()["error"]["message"])
        self.assertNotIn(VALUE, self.srv.log())

    def test_the_network_changes_while_the_session_runs(self):
        info = self.create(None, allow=["api.test", "127.0.0.2"])
        sid = info["id"]
        path = "/v1/sessions/%s/network" % sid
        # Requests on one kept-alive connection: each follows the rules as they are then.
        self.srv.execute(sid, py("""
import requests
s = requests.Session()
def get(p):
    try:
        return s.get("https://api.test" + p, timeout=30).status_code
    except Exception as e:
        return type(e).__name__
"""))
        changed = self.srv.ok("PATCH", path, {"secrets_add": [
            {"host": "api.test", "header": "X-Key", "value": VALUE}]})
        self.assertEqual([x["header"] for x in changed["secrets"]], ["X-Key"])
        connections = self.lab.api.connections
        rec = self.srv.execute(sid, py('out["a"] = get("/keep/1"); out["b"] = get("/keep/2")'))
        self.assertEqual(last_json(rec), {"a": 200, "b": 200}, rec)
        self.srv.ok("PATCH", path, {"secrets_remove": [{"host": "api.test"}]})
        rec = self.srv.execute(sid, py('out["c"] = get("/keep/3")'))
        seen = dict(self.lab.api.seen("x-key"))
        self.assertEqual((seen["/keep/1"], seen["/keep/2"]), (VALUE, VALUE))
        # Removed: the next request, on the same connection, goes without it.
        self.assertEqual(last_json(rec), {"c": 200}, rec)
        self.assertIsNone(dict(self.lab.api.seen("x-key"))["/keep/3"])
        self.assertEqual(self.lab.api.connections - connections, 1)  # one connection for all
        self.srv.ok("PATCH", path, {"allow_add": ["other.test", "127.0.0.3"],
                                    "allow_remove": ["api.test"]})
        rec = self.srv.execute(sid, py("""
import urllib.request, urllib.error
try:
    urllib.request.urlopen("https://api.test/gone", timeout=30)
except urllib.error.URLError as e:
    out["gone"] = str(e.reason)
"""))
        self.assertIn("403", last_json(rec)["gone"])
        self.assertEqual(self.srv.ok("GET", "/v1/sessions/" + sid)["network"]["allow"],
                         ["127.0.0.2", "other.test", "127.0.0.3"])
        # Bad changes say what is wrong and change nothing.
        for change, message in [
                ({"allow_remove": ["nope.test"]}, "'nope.test' is not on the allowlist"),
                ({"secrets_add": [{"host": "api.test", "header": "X", "value": VALUE}]},
                 "api.test port 443 is not on the network allowlist"),
                ({"allow": [], "allow_add": ["a.test"]}, "give either \"allow\""),
                ({"colour": "blue"}, "unknown field 'colour'")]:
            r = self.srv.request("PATCH", path, change)
            self.assertEqual(r.status, 400, r)
            self.assertIn(message, r.json()["error"]["message"])
        none = self.srv.create_session()
        r = self.srv.request("PATCH", "/v1/sessions/%s/network" % none, {"allow_add": ["a.test"]})
        self.assertEqual(r.status, 400)
        self.assertIn("this session has no network (mode none)", r.json()["error"]["message"])
        r = self.srv.request("PATCH", "/v1/sessions/nosuch/network", {"allow_add": ["a.test"]})
        self.assertEqual(r.status, 404)

    def test_forks_have_the_network_in_force_with_its_secrets(self):
        """A fork is the session as it is now: the allowlist and the secrets its source has
        after run-time changes, not those it was created with; the secrets' values shown
        nowhere."""
        sid = self.create(None, allow=["api.test", "127.0.0.2"])["id"]
        self.srv.ok("PATCH", "/v1/sessions/%s/network" % sid, {
            "allow_add": ["other.test", "127.0.0.3"],
            "secrets_add": [{"host": "api.test", "header": "X-Key", "value": VALUE}]})
        r = self.srv.ok("POST", "/v1/sessions/%s/fork" % sid, {"count": 2}, status=201)
        self.assertNotIn(VALUE, json.dumps(r))
        for n, fork in enumerate(r["sessions"]):
            fid = fork["id"]
            self.addCleanup(self.srv.request, "DELETE", "/v1/sessions/" + fid)
            info = self.srv.ok("GET", "/v1/sessions/" + fid)
            self.assertEqual(info["network"]["allow"],
                             ["api.test", "127.0.0.2", "other.test", "127.0.0.3"])
            self.assertEqual([x["header"] for x in info["network"]["secrets"]], ["X-Key"])
            rec = self.srv.execute(fid, py(
                'import urllib.request\nout["s"] = urllib.request.urlopen('
                '"https://api.test/fork/%d", timeout=30).status' % n))
            self.assertEqual(last_json(rec), {"s": 200}, rec)
            self.assertEqual(dict(self.lab.api.seen("x-key"))["/fork/%d" % n], VALUE)
            self.assertNotIn(VALUE, json.dumps(rec))
        self.assertNotIn(VALUE, self.srv.log())

    def test_curl_git_pip_and_node_use_the_session_ca(self):
        info = self.create([{"host": "api.test", "basic": {"user": "u", "password": VALUE}}])
        node = r"""
const http = require('http'), tls = require('tls');
const req = http.request({host: '127.0.0.1', port: 3128, method: 'CONNECT', path: 'api.test:443'});
req.on('connect', (res, socket) => {
  const t = tls.connect({socket, servername: 'api.test'}, () => {
    t.write('GET /node HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n');
  });
  let data = '';
  t.on('data', d => data += d);
  t.on('end', () => console.log('node ' + data.split('\r\n')[0]));
  t.on('error', e => console.log('node error ' + e.message));
});
req.end();
"""
        rec = self.srv.execute(info["id"], """
curl -sS -o /dev/null -w 'curl %{http_code}\\n' https://api.test/curl
git ls-remote https://api.test/repo.git >/dev/null 2>&1; echo "git done"
pip download --no-deps --index-url https://api.test/simple/ nosuchpkg -d /tmp/p >/dev/null 2>&1
echo "pip done"
cat > /tmp/n.js <<'EOF'
""" + node + """
EOF
node /tmp/n.js
""", language="bash")
        self.assertStatus(rec, "ok")
        self.assertIn("curl 200", rec["stdout"])
        self.assertIn("node HTTP/1.1 200 OK", rec["stdout"])
        basic = "Basic " + base64.b64encode(("u:" + VALUE).encode()).decode()
        seen = self.lab.api.seen("authorization")
        paths = {p.split("?")[0]: v for p, v in seen}
        for p in ("/curl", "/repo.git/info/refs", "/simple/nosuchpkg/", "/node"):
            self.assertEqual(paths.get(p), basic, (p, seen))


class Cli(LabCase):
    def run_cli(self, *args, env=None):
        e = dict(os.environ, **self.lab.env, TEST_TOKEN=VALUE, **(env or {}))
        return subprocess.run([RUNCELL, "run", *args], capture_output=True, text=True,
                              env=e, timeout=180)

    def test_run_reads_the_value_from_the_environment(self):
        code = py("""
import os, urllib.request
out["status"] = urllib.request.urlopen("https://api.test/cli", timeout=30).status
out["env"] = sorted(os.environ)
""")
        p = self.run_cli("--json", "--net", "allow:api.test,127.0.0.2", "--secret",
                         "api.test=TEST_TOKEN:X-Api-Key", "-c", code)
        self.assertEqual(p.returncode, 0, p.stderr)
        rec = json.loads(p.stdout.splitlines()[-1])
        out = last_json(rec)
        self.assertEqual(out["status"], 200)
        self.assertNotIn("TEST_TOKEN", out["env"])
        self.assertEqual(dict(self.lab.api.seen("x-api-key"))["/cli"], VALUE)
        self.assertNotIn(VALUE, p.stdout + p.stderr)
        # Without --net, the secrets' hosts are the allowlist (the address is named too:
        # api.test is a loopback address here, which must be named exactly).
        p = self.run_cli("--net", "allow:api.test,127.0.0.2", "--secret", "api.test=TEST_TOKEN",
                         "-c", "import urllib.request as u; print(u.urlopen("
                         "'https://api.test/bearer', timeout=30).status)")
        self.assertEqual((p.returncode, p.stdout), (0, "200\n"), p.stderr)
        self.assertEqual(dict(self.lab.api.seen("authorization"))["/bearer"], "Bearer " + VALUE)
        p = self.run_cli("--secret", "api.test=TEST_TOKEN", "-c", "print('alone')")
        self.assertEqual((p.returncode, p.stdout), (0, "alone\n"), p.stderr)

    def test_runcell_mcp_gives_its_sessions_the_secret_and_says_what_the_code_reaches(self):
        from mcpclient import StdioClient
        c = StdioClient(RUNCELL, "--net", "allow:api.test,127.0.0.2", "--secret",
                        "api.test=TEST_TOKEN", env=dict(self.lab.env, TEST_TOKEN=VALUE))
        try:
            c.initialize()
            tools = {t["name"]: t for t in c.request("tools/list")["result"]["tools"]}
            text = tools["run_code"]["description"]
            self.assertIn("The network reaches only api.test, 127.0.0.2", text)
            self.assertIn("Requests to api.test get their credentials (Authorization)", text)
            self.assertNotIn(VALUE, json.dumps(tools))
            r = c.tool_result("run_code", {"code": py("""
import os, urllib.request
out["status"] = urllib.request.urlopen("https://api.test/mcp", timeout=30).status
out["env"] = sorted(os.environ)
""")})
            self.assertFalse(r["isError"], r)
            out = last_json(r["structuredContent"])
            self.assertEqual(out["status"], 200)
            self.assertNotIn("TEST_TOKEN", out["env"])
            self.assertEqual(dict(self.lab.api.seen("authorization"))["/mcp"], "Bearer " + VALUE)
            self.assertNotIn(VALUE, json.dumps(r))
        finally:
            c.close()
        # What MCP sessions cannot have is refused with why.
        p = subprocess.run([RUNCELL, "mcp", "--package", "x"], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--package is not supported by runcell mcp", p.stderr)

    def test_bad_secret_options_never_echo_a_value(self):
        for args, message in [
                (["--secret", "api.test=" + VALUE], "after '=' comes the name of an environment"),
                (["--secret", "api.test=NOT_SET_ANYWHERE"],
                 "the environment variable NOT_SET_ANYWHERE is not set"),
                (["--net", "allow:other.test", "--secret", "api.test=TEST_TOKEN"],
                 "api.test port 443 is not on the network allowlist"),
                (["--secret", "api.test=TEST_TOKEN:Content-Length"],
                 "a secret cannot set 'Content-Length'"),
                (["--secret", "noequals"], "give HOST=ENVNAME[:HEADER]")]:
            p = self.run_cli(*args, "-c", "print(1)")
            self.assertEqual(p.returncode, 2, (args, p.stderr))
            self.assertIn(message, p.stderr)
            self.assertNotIn(VALUE, p.stderr)


if __name__ == "__main__":
    unittest.main()


# The model's key, in two halves: whole only in the agent's environment.
MODEL_HEAD, MODEL_TAIL = "sk-model-5a4b3c", "2d1e0f9a8b7c"
PLACEHOLDER = "runcell-egress-proxy-adds-the-key"


def tool_json(model, request_index):
    """The JSON line the last tool message of a request shows (a cell made with py())."""
    text = model.tool_messages(request_index)[-1]["content"]
    lines = [l for l in text.splitlines() if l.startswith('{"')]
    if not lines:
        raise AssertionError("no JSON in the tool message: " + text)
    return json.loads(lines[-1])


class Agent(LabCase):
    """`runcell agent` and the server's agent runs: the code calls the model with a key it
    never holds, and other hosts with --secret; the model is told which hosts it reaches."""

    def setUp(self):
        super().setUp()
        self.data = self.tmp

    # The code the model runs: it calls the model and api.test, then looks for the key
    # everywhere it can (its memory, files, processes' environments and command lines).
    @staticmethod
    def probe(api):
        return py(SANDBOX_SCAN + """
import os, urllib.request
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps({"model": os.environ["RUNCELL_MODEL"],
                     "messages": [{"role": "user", "content": "a word?"}]}).encode(),
    headers={"Content-Type": "application/json",
             "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
reply = json.load(urllib.request.urlopen(req, timeout=60))
out["model_said"] = reply["choices"][0]["message"]["content"]
if %r:
    out["api"] = urllib.request.urlopen("https://api.test/agent", timeout=30).status
out["key_var"] = os.environ["OPENAI_API_KEY"]
h, t = %r, %r
out["memory"] = scan_memory(h, t)
out["files"] = scan_files(h, t, ["/"], {"/proc", "/sys", "/usr", "/dev"})
out["processes"] = scan_processes(h, t)
""" % (api, MODEL_HEAD.encode(), MODEL_TAIL.encode()))

    def check_probe(self, m, out):
        self.assertEqual(out["model_said"], "a word")
        self.assertEqual(out["key_var"], PLACEHOLDER)
        self.assertEqual(out["memory"]["hits"], [])
        self.assertGreater(out["memory"]["scanned_mb"], 5)
        self.assertEqual(out["files"]["hits"], [])
        self.assertEqual(out["processes"]["hits"], [])
        # The code's request reached the model with the key in the placeholder's place.
        code_request = m.requests[1]
        self.assertEqual(code_request["body"]["messages"][0]["content"], "a word?")
        self.assertEqual(code_request["headers"]["Authorization"],
                         "Bearer " + MODEL_HEAD + MODEL_TAIL)

    def test_runcell_agent_lets_the_code_call_the_model_with_a_key_it_never_holds(self):
        script = [{"tool": "run_python", "code": self.probe(True)}, {"answer": "a word"},
                  {"answer": "done"}]
        env = dict(os.environ, **self.lab.env, OPENAI_API_KEY=MODEL_HEAD + MODEL_TAIL,
                   TEST_TOKEN=VALUE)
        with ScriptedModel(script) as m:
            p = subprocess.run([RUNCELL, "agent", "--base-url", m.base_url, "--model", "scripted",
                                "--data", self.data, "--model-access", "--net",
                                "allow:api.test,127.0.0.2", "--secret", "api.test=TEST_TOKEN",
                                "--json", "use the model from code"],
                               capture_output=True, text=True, env=env, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        outcome = json.loads(p.stdout.splitlines()[-1])
        self.assertEqual(outcome["answer"], "done")
        out = tool_json(m, 2)
        self.check_probe(m, out)
        self.assertEqual(out["api"], 200)
        self.assertEqual(dict(self.lab.api.seen("authorization"))["/agent"], "Bearer " + VALUE)
        # The model is told what the code reaches, which hosts get credentials, and how to
        # call it; never a value.
        system = m.requests[0]["body"]["messages"][0]["content"]
        port = m.base_url.split(":")[2].split("/")[0]
        self.assertIn("only these hosts: api.test, 127.0.0.2, 127.0.0.1:%s can be reached"
                      % port, system)
        self.assertIn("Credentials for api.test, 127.0.0.1:%s are added" % port, system)
        self.assertIn("$OPENAI_BASE_URL/chat/completions", system)
        everything = [p.stdout, p.stderr] + [json.dumps(r["body"]) for r in m.requests]
        for name in os.listdir(self.data):
            with open(os.path.join(self.data, name), "rb") as f:
                everything.append(f.read().decode("latin-1"))
        for text in everything:
            self.assertNotIn(MODEL_HEAD + MODEL_TAIL, text)
            self.assertNotIn(VALUE, text)

    def test_a_network_error_is_not_called_unfixable_in_a_sandbox_with_a_network(self):
        """What a sandbox without network learns (a name that does not resolve cannot work)
        is not applied where the allowlist may reach the host."""
        bad = py("import urllib.request\n"
                 "urllib.request.urlopen('https://nowhere.test/', timeout=30)")
        script = [{"tool": "run_python", "code": bad}, {"answer": "gave up"}]
        env = dict(os.environ, **self.lab.env, OPENAI_API_KEY="k")
        with ScriptedModel(script) as m:
            p = subprocess.run([RUNCELL, "agent", "--base-url", m.base_url, "--model", "scripted",
                                "--data", self.data, "--net", "allow:api.test,127.0.0.2",
                                "--json", "fetch it"],
                               capture_output=True, text=True, env=env, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        seen = m.tool_messages(1)[-1]["content"]
        self.assertIn("nowhere.test", seen)
        self.assertNotIn("knows this cannot work here", seen)

    def test_a_server_agent_run_with_model_access(self):
        script = [{"tool": "run_python", "code": self.probe(False)}, {"answer": "a word"},
                  {"answer": "done"}]
        with ScriptedModel(script) as m:
            srv = Server("--pool", "0", "--base-url", m.base_url, "--model", "scripted",
                         env=dict(self.lab.env, OPENAI_API_KEY=MODEL_HEAD + MODEL_TAIL)).start()
            try:
                out = srv.ok("POST", "/v1/agent/runs", {
                    "task": "use the model from code",
                    "options": {"model_access": True,
                                "session": {"network": {"mode": "allowlist",
                                                        "allow": ["api.test", "127.0.0.2"]}}}})
                bad = srv.request("POST", "/v1/agent/runs", {
                    "task": "t", "options": {"model_access": True, "session_id": "s-none"}})
                log = srv.log()
            finally:
                srv.close()
        self.assertEqual(out["answer"], "done")
        self.check_probe(m, tool_json(m, 2))
        self.assertEqual(bad.status, 400, bad)
        self.assertIn("model_access applies to a new session", bad.json()["error"]["message"])
        self.assertNotIn(MODEL_HEAD + MODEL_TAIL, log + json.dumps(out))


VALUE2 = "sk-kept-9a8b7c6d5e4f30211203"


class Kept(LabCase):
    """serve --secrets-key: a session's secrets, as they are after run-time changes, are kept
    in its record sealed with the operator's key, and a resume after a kill -9 has them back;
    without that key, or with another, the resume is refused saying what to do; no value is
    in the data directory."""

    def setUp(self):
        super().setUp()
        self.data = os.path.join(self.tmp, "data")
        self.keys = []
        for name in ("key", "other-key"):
            path = os.path.join(self.tmp, name)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            os.write(fd, os.urandom(32).hex().encode() + b"\n")
            os.close(fd)
            self.keys.append(path)

    def server(self, *args):
        srv = RestartableServer(self.data, "--pool", "0", *args, env=self.lab.env).start()
        self.addCleanup(srv.stop)
        return srv

    def create(self, srv, body, status=201):
        st, r = srv.request("POST", "/v1/sessions", body)
        self.assertEqual(st, status, r)
        self.assertNotIn(VALUE, json.dumps(r))
        return r

    def fetch_both(self, srv, sid, tag):
        st, rec = srv.request("POST", "/v1/sessions/%s/execute" % sid, {"code": py("""
import urllib.request
for host in ("api.test", "other.test"):
    out[host] = urllib.request.urlopen("https://%%s/%s" %% host, timeout=30).status
""" % tag)})
        self.assertEqual(st, 200, rec)
        return last_json(rec)

    def data_files(self):
        return self.data_files_under(self.data)

    @staticmethod
    def data_files_under(top):
        for d, _, files in os.walk(top):
            for f in files:
                with open(os.path.join(d, f), "rb") as fh:
                    yield os.path.join(d, f), fh.read()

    def test_a_resume_after_a_kill_has_the_secrets_kept_sealed(self):
        srv = self.server("--secrets-key", self.keys[0])
        sid = self.create(srv, {"network": {"mode": "allowlist", "allow": ALLOW}, "secrets": [
            {"host": "api.test", "header": "Authorization", "value": "Bearer " + VALUE}]})["id"]
        # A secret added while the session runs is kept as well.
        st, r = srv.request("PATCH", "/v1/sessions/%s/network" % sid, {"secrets_add": [
            {"host": "other.test", "header": "X-Key", "value": VALUE2}]})
        self.assertEqual(st, 200, r)
        self.assertEqual(self.fetch_both(srv, sid, "before"), {"api.test": 200, "other.test": 200})
        st, rec = srv.request("POST", "/v1/sessions/%s/execute" % sid,
                              {"code": "open('kept.txt', 'w').write('k')"})
        self.assertEqual(st, 200, rec)
        srv.kill9()
        sealed = False
        for path, data in self.data_files():
            for value in (VALUE, VALUE2):
                self.assertNotIn(value.encode(), data, path)
            sealed |= b"secrets_sealed" in data
        self.assertTrue(sealed, "no record keeps the secrets sealed")

        srv = self.server("--secrets-key", self.keys[0])
        st, info = srv.request("GET", "/v1/sessions/" + sid)
        self.assertNotIn(VALUE, json.dumps(info))
        resumed = self.create(srv, {"resume_from": sid})
        rid = resumed["id"]
        st, live = srv.request("GET", "/v1/sessions/" + rid)
        self.assertEqual(sorted(x["header"] for x in live["network"]["secrets"]),
                         ["Authorization", "X-Key"])
        self.assertEqual(self.fetch_both(srv, rid, "after"), {"api.test": 200, "other.test": 200})
        self.assertEqual(dict(self.lab.api.seen("authorization"))["/after"], "Bearer " + VALUE)
        self.assertEqual(dict(self.lab.other.seen("x-key"))["/after"], VALUE2)
        srv.stop()  # the resumed session is kept, its secrets sealed for its own record

        # Without the key, or with another one: refused, saying what to do; nothing is lost.
        for args, words in [((), "this server has no key to open them"),
                            (("--secrets-key", self.keys[1]), "does not open with this key")]:
            srv = self.server(*args)
            st, r = srv.request("POST", "/v1/sessions", {"resume_from": rid})
            self.assertEqual(st, 400, r)
            self.assertIn(words, r["error"]["message"])
            self.assertIn("--secrets-key", r["error"]["message"])
            srv.stop()
        # Secrets given in the request replace the kept ones.
        srv = self.server()
        again = self.create(srv, {"resume_from": rid, "secrets": []})
        st, live = srv.request("GET", "/v1/sessions/" + again["id"])
        self.assertEqual(live["network"]["secrets"], [])
        self.assertIn("other.test", live["network"]["allow"])
        self.assertNotIn(VALUE, srv.log() + json.dumps(again))

    def test_a_takeover_in_a_fleet_has_the_secrets_kept_sealed(self):
        store = os.path.join(self.tmp, "store")
        nodes = []
        for name in ("na", "nb"):
            srv = RestartableServer(os.path.join(self.tmp, name), "--pool", "0", "--fleet",
                                    "--node", name, "--lease-ttl", "3", "--store", store,
                                    "--secrets-key", self.keys[0], env=self.lab.env).start()
            self.addCleanup(srv.stop)
            nodes.append(srv)
        a, b = nodes
        sid = self.create(a, {"network": {"mode": "allowlist", "allow": ALLOW}, "secrets": [
            {"host": "api.test", "header": "Authorization", "value": "Bearer " + VALUE}]})["id"]
        st, r = a.request("PATCH", "/v1/sessions/%s/network" % sid, {"secrets_add": [
            {"host": "other.test", "header": "X-Key", "value": VALUE2}]})
        self.assertEqual(st, 200, r)
        st, rec = a.request("POST", "/v1/sessions/%s/execute" % sid,
                            {"code": "open('kept.txt', 'w').write('k')"})
        self.assertEqual(st, 200, rec)
        with open(os.path.join(store, "sessions", sid, "lease.json")) as f:
            lease = f.read()
        self.assertIn("secrets_sealed", lease)
        self.assertNotIn(VALUE, lease)
        self.assertNotIn(VALUE2, lease)
        a.kill9()
        # The other node takes it over once the dead node's lease lapses, secrets and all.
        self.assertEqual(self.fetch_both(b, sid, "taken"), {"api.test": 200, "other.test": 200})
        self.assertEqual(dict(self.lab.api.seen("authorization"))["/taken"], "Bearer " + VALUE)
        self.assertEqual(dict(self.lab.other.seen("x-key"))["/taken"], VALUE2)
        for path, data in self.data_files_under(self.tmp):
            for value in (VALUE, VALUE2):
                self.assertNotIn(value.encode(), data, path)

    def test_a_bad_key_file_stops_the_server_saying_why(self):
        lax = os.path.join(self.tmp, "lax")
        with open(lax, "w") as f:
            f.write(os.urandom(32).hex())
        os.chmod(lax, 0o644)
        short = os.path.join(self.tmp, "short")
        fd = os.open(short, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, b"abc")
        os.close(fd)
        for path, words in [(lax, "may be read by others (mode 644): chmod 600 it"),
                            (short, "openssl rand -hex 32"),
                            (os.path.join(self.tmp, "missing"), "cannot open the key file")]:
            p = subprocess.run([RUNCELL, "serve", "--listen", "127.0.0.1:1", "--data",
                                os.path.join(self.tmp, "d"), "--secrets-key", path],
                               capture_output=True, text=True, timeout=60)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("--secrets-key", p.stderr)
            self.assertIn(words, p.stderr)
