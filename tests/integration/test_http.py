"""test_http - `runcell serve` over real HTTP (DESIGN.md "HTTP API", docs/API.md): every
route and status code, authentication and the token's life, validation errors that name the
field, NDJSON streaming (order, early output), a client that hangs up interrupting its cell,
traversal and symlink attacks on the file API, big uploads and downloads in flat memory,
parallel sessions, a slow client, limits, idle expiry, isolation between sessions, metrics,
the request log, and graceful shutdown leaving nothing behind.

Every server here listens on 127.0.0.1 (a free port) with its own data and run directories.
No test depends on how fast this machine is: timeouts below only stop hangs.
"""
import base64
import hashlib
import json
import os
import re
import select
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest
import uuid

import rctest
from rctest import (HANG, RUNCELL, TOKEN, RuncellTestCase, Server, TempDir, cgroups_of, free_port,
                    is_root, mounts_below, procs_with, run_dir_entries, wait_until)

NDJSON = {"Accept": "application/x-ndjson"}
WAIT_FOR_GO = ("import os, time\n"
               "while not os.path.exists('go'):\n"
               "    time.sleep(0.01)\n")


def path_of(sid, rest=""):
    return "/v1/sessions/%s%s" % (sid, rest)


class Stream:
    """A streamed execute: the events as they arrive, on a connection of its own. Its first
    line (type "start", the execution's id) is read at once, into self.start; each event
    after it carries a "seq" one above the last, which next() checks and takes off."""

    def __init__(self, srv, sid, code, **fields):
        self.conn = srv.connection()
        self.conn.request("POST", path_of(sid, "/execute"),
                          body=json.dumps(dict(fields, code=code)), headers=srv.headers(NDJSON))
        self.resp = self.conn.getresponse()
        self.start, self.seq = None, 0
        if self.resp.status == 200:
            self.start = json.loads(self.resp.readline())
            if self.start.get("type") != "start" or self.start.get("seq") != 0:
                raise AssertionError("the stream did not begin with its start: %r" % self.start)
            self.execution_id = self.start["execution_id"]

    def next(self):
        line = self.resp.readline()
        if not line:
            raise AssertionError("the stream ended without a done event")
        event = json.loads(line)
        if event.pop("seq", None) != self.seq + 1:
            raise AssertionError("event out of sequence after %d: %s" % (self.seq, line))
        self.seq += 1
        return event

    def rest(self):
        """Every event up to and including done."""
        events = []
        while not events or events[-1]["type"] != "done":
            events.append(self.next())
        self.assertEnded()
        self.conn.close()
        return events

    def assertEnded(self):
        if self.resp.readline():
            raise AssertionError("more after the done event")

    def hang_up(self):
        self.conn.sock.shutdown(socket.SHUT_RDWR)
        self.conn.close()


def raw_request(port, head, body=b""):
    """A socket with head (and body) sent; the caller reads or closes it."""
    s = socket.create_connection(("127.0.0.1", port), timeout=HANG)
    s.sendall(head.encode() + body)
    return s


def read_response(s):
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), head.decode(errors="replace"), body


def file_names(srv, sid):
    return [f["path"] for f in srv.ok("GET", path_of(sid, "/files"))["files"]]


def process_holds_file(name):
    """Whether some process on the host has a file open whose path ends with name (what a
    sandboxed cell opened shows in its /proc/PID/fd links)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            for fd in os.listdir("/proc/%s/fd" % pid):
                if os.readlink("/proc/%s/fd/%s" % (pid, fd)).endswith("/" + name):
                    return True
        except OSError:
            continue
    return False


def metrics(srv):
    r = srv.request("GET", "/metrics")
    assert r.status == 200, r
    values = {}
    for line in r.body.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values, r


def vm_hwm_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM for %d" % pid)


class ServerCase(rctest.ServerCase):
    """Tests that share one server with default options."""

    def assertError(self, r, status, code, *needles):
        self.assertEqual(r.status, status, r)
        self.assertEqual(r.headers.get_content_type(), "application/json", r)
        self.assertEqual(r.error_code, code, r)
        msg = r.json()["error"]["message"]
        for n in needles:
            self.assertIn(n, msg)
        return msg

    def session(self, **opts):
        sid = self.srv.create_session(**opts)
        self.addCleanup(self.srv.request, "DELETE", path_of(sid))
        return sid


# ---- authentication and the token ----

ROUTES = [("GET", "/metrics"), ("POST", "/v1/sessions"), ("GET", "/v1/sessions"),
          ("GET", "/v1/sessions/ID"), ("DELETE", "/v1/sessions/ID"),
          ("POST", "/v1/sessions/ID/execute"), ("POST", "/v1/sessions/ID/interrupt"),
          ("POST", "/v1/sessions/ID/restart"), ("GET", "/v1/sessions/ID/files"),
          ("GET", "/v1/sessions/ID/files/a.txt"), ("PUT", "/v1/sessions/ID/files/a.txt"),
          ("DELETE", "/v1/sessions/ID/files/a.txt"), ("POST", "/v1/execute")]


class Auth(ServerCase):
    def test_healthz_needs_no_token(self):
        r = self.srv.request("GET", "/healthz", token=False)
        self.assertEqual(r.status, 200)
        self.assertEqual(r.json()["status"], "ok")

    def test_every_other_route_needs_the_token(self):
        sid = self.session()
        self.srv.ok("PUT", path_of(sid, "/files/a.txt"), b"keep", status=201)
        for method, route in ROUTES:
            path = route.replace("ID", sid)
            for token, word in ((False, "no token"), ("x" * 32, "wrong token"),
                                (TOKEN + "x", "wrong token"), (TOKEN[:-1], "wrong token")):
                r = self.srv.request(method, path, {"code": "1"} if method == "POST" else None,
                                     token=token)
                self.assertError(r, 401, "unauthorized", word)
        # None of those reached the session.
        self.assertEqual(file_names(self.srv, sid), ["a.txt"])
        self.assertEqual(self.srv.ok("GET", path_of(sid))["execution_count"], 0)

    def test_other_schemes_are_refused(self):
        for value in ("Basic " + TOKEN, TOKEN, "Bearer", "Bearer" + TOKEN):
            r = self.srv.request("GET", "/v1/sessions", token=False,
                                 headers={"Authorization": value})
            self.assertError(r, 401, "unauthorized")

    def test_right_token(self):
        r = self.srv.request("GET", "/v1/sessions")
        self.assertEqual(r.status, 200, r)

    def test_unknown_route_without_token_is_401(self):
        # Nothing about the server's routes is told to a client without the token.
        self.assertError(self.srv.request("GET", "/v2/nothing", token=False), 401,
                         "unauthorized")


class TokenSources(RuncellTestCase):
    def test_generated_once_saved_0600_and_reused(self):
        with Server(token=None) as srv:
            path = os.path.join(srv.data_dir, "token")
            self.assertEqual(os.stat(path).st_mode & 0o777, 0o600)
            self.assertGreaterEqual(len(srv.token), 32)
            self.assertIn(srv.token, srv.log())  # printed once, for the operator
            self.assertEqual(srv.request("GET", "/v1/sessions").status, 200)
            self.assertEqual(srv.stop(), 0)
            # The second start reads the file and prints nothing of it.
            argv = [RUNCELL, "serve", "--listen", "127.0.0.1:%d" % free_port(),
                    "--data", srv.data_dir]
            p = subprocess.Popen(argv, env=dict(os.environ, RUNCELL_RUNDIR=srv.run_dir),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            try:
                line = b""
                while b"listening on" not in line:
                    line = p.stdout.readline()
                    self.assertNotEqual(line, b"", "runcell serve exited")
                    self.assertNotIn(srv.token.encode(), line)
            finally:
                p.send_signal(signal.SIGTERM)
                rest = p.communicate(timeout=HANG)[0]
            self.assertNotIn(srv.token.encode(), rest)
            with open(path) as f:
                self.assertEqual(f.read().strip(), srv.token)

    def test_environment_token(self):
        token = uuid.uuid4().hex
        with Server(token=None, env={"RUNCELL_TOKEN": token}) as srv:
            # The file is never written when the token comes from the environment...
            self.assertFalse(os.path.exists(os.path.join(srv.data_dir, "token")))
            self.assertEqual(srv.token, token)
            self.assertEqual(srv.request("GET", "/v1/sessions").status, 200)
            self.assertEqual(srv.request("GET", "/v1/sessions", token=TOKEN).status, 401)

    def test_flag_beats_environment(self):
        with Server(env={"RUNCELL_TOKEN": uuid.uuid4().hex}) as srv:
            self.assertEqual(srv.request("GET", "/v1/sessions").status, 200)

    def serve_fails(self, args, env=None):
        with tempfile.TemporaryDirectory() as d:
            e = dict(os.environ, RUNCELL_RUNDIR=d)
            e.pop("RUNCELL_TOKEN", None)
            e.update(env or {})
            p = subprocess.run([RUNCELL, "serve", "--data", os.path.join(d, "data"), *args],
                               env=e, capture_output=True, text=True, timeout=HANG)
            self.assertNotEqual(p.returncode, 0, p.stderr)
            return p.stderr

    def test_non_loopback_without_token_is_refused(self):
        for addr in ("0.0.0.0", "[::]"):
            err = self.serve_fails(["--listen", "%s:%d" % (addr, free_port())])
            self.assertIn("refusing to listen", err)
            self.assertIn("--token", err)

    def test_short_or_bad_tokens_are_refused(self):
        self.assertIn("shorter than", self.serve_fails(["--listen", "127.0.0.1:%d" % free_port(),
                                                        "--token", "short"]))
        self.assertIn("RUNCELL_TOKEN", self.serve_fails(
            ["--listen", "127.0.0.1:%d" % free_port()], env={"RUNCELL_TOKEN": "has a space in it"}))

    def test_bad_listen(self):
        self.assertIn("HOST:PORT", self.serve_fails(["--listen", "nonsense"]))


# ---- routes and their statuses ----

class Sessions(ServerCase):
    def test_life_of_a_session(self):
        r = self.srv.request("POST", "/v1/sessions", {"timeout_s": 30, "memory_mb": 512})
        self.assertEqual(r.status, 201, r)
        info = r.json()
        sid = info["id"]
        # The node that made it (the host name, no --node given here), then 24 hex digits.
        node = r.headers.get("X-Runcell-Node")
        self.assertTrue(node, r.headers)
        self.assertRegex(sid, r"^%s-[0-9a-f]{24}$" % re.escape(node))
        self.assertEqual((info["language"], info["status"], info["execution_count"]),
                         ("python", "idle", 0))
        self.assertEqual(info["timeout_s"], 30)
        self.assertEqual(info["limits"]["memory_mb"], 512)
        for k in ("created_at", "last_used_at", "expires_at", "python_version",
                  "idle_timeout_s", "limits_degraded"):
            self.assertIn(k, info)
        listed = self.srv.ok("GET", "/v1/sessions")["sessions"]
        self.assertIn(sid, [s["id"] for s in listed])
        self.assertEqual(self.srv.ok("GET", path_of(sid))["id"], sid)

        self.assertEqual(self.srv.execute(sid, "x = 41")["status"], "ok")
        rec = self.srv.execute(sid, "x += 1\nx")
        self.assertEqual(rec["results"], [{"text/plain": "42"}])
        self.assertEqual(rec["execution_count"], 2)
        self.assertEqual(self.srv.ok("GET", path_of(sid))["execution_count"], 2)

        closed = self.srv.ok("DELETE", path_of(sid))
        self.assertEqual((closed["id"], closed["closed"]), (sid, True))
        self.assertError(self.srv.request("GET", path_of(sid)), 404, "not_found", sid)
        self.assertError(self.srv.request("DELETE", path_of(sid)), 404, "not_found")
        self.assertError(self.srv.request("POST", path_of(sid, "/execute"), {"code": "x"}),
                         404, "not_found")
        self.assertNotIn(sid, [s["id"] for s in self.srv.ok("GET", "/v1/sessions")["sessions"]])

    def test_record_of_an_error(self):
        sid = self.session()
        rec = self.srv.execute(sid, "print('out')\nimport sys; print('err', file=sys.stderr)\n"
                               "{}['fare']")
        self.assertStatus(rec, "error")
        self.assertEqual((rec["stdout"], rec["stderr"]), ("out\n", "err\n"))
        self.assertEqual(rec["error"]["name"], "KeyError")
        self.assertIn("'fare'", rec["error"]["value"])
        self.assertIn("Traceback", rec["error"]["traceback"])
        self.assertEqual(rec["state"], "kept")
        for k in ("truncated", "results", "files", "usage", "limits_degraded", "exit_code",
                  "signal"):
            self.assertIn(k, rec)

    def test_timeout_per_execution(self):
        sid = self.session()
        self.srv.execute(sid, "y = 'kept'")
        rec = self.srv.execute(sid, "import time\ntime.sleep(60)", timeout_s=0.5)
        self.assertStatus(rec, "timeout")
        self.assertEqual(rec["state"], "kept")
        self.assertEqual(self.srv.execute(sid, "y")["results"], [{"text/plain": "'kept'"}])

    def test_bash_cell(self):
        sid = self.session()
        rec = self.srv.execute(sid, "echo $((6*7))", language="bash")
        self.assertStatus(rec, "ok")
        self.assertEqual(rec["stdout"], "42\n")
        bash = self.session(language="bash")
        self.assertEqual(self.srv.ok("GET", path_of(bash))["language"], "bash")
        self.assertEqual(self.srv.execute(bash, "echo hi")["stdout"], "hi\n")

    def test_interrupt(self):
        sid = self.session()
        self.srv.execute(sid, "kept = 1")
        r = self.srv.ok("POST", path_of(sid, "/interrupt"))
        self.assertEqual(r, {"id": sid, "interrupted": False})  # nothing ran
        st = Stream(self.srv, sid, "import time\nprint('up', flush=True)\ntime.sleep(300)")
        self.assertEqual(st.next(), {"type": "stdout", "data": "up\n"})
        self.assertEqual(self.srv.ok("POST", path_of(sid, "/interrupt")),
                         {"id": sid, "interrupted": True})
        rec = st.rest()[-1]["record"]
        self.assertStatus(rec, "error")
        self.assertEqual(rec["error"]["name"], "KeyboardInterrupt")
        self.assertEqual(rec["state"], "kept")
        self.assertEqual(self.srv.execute(sid, "kept")["results"], [{"text/plain": "1"}])

    def test_an_interrupt_before_the_code_starts_keeps_state(self):
        # A cell that takes a moment to compile before its code runs. An interrupt in that
        # time once found SIGINT ignored, and the kill after the grace cost the session its
        # variables.
        sid = self.session()
        self.srv.execute(sid, "kept = 1")
        code = "y = 0\n" * 25000 + "import time\ntime.sleep(300)"
        out = {}
        t = threading.Thread(target=lambda: out.update(rec=self.srv.execute(sid, code)))
        t.start()
        self.assertTrue(wait_until(lambda: self.srv.ok("POST", path_of(sid, "/interrupt"))
                                   ["interrupted"]), "the cell never ran")
        t.join(HANG)
        rec = out["rec"]
        self.assertStatus(rec, "error")
        self.assertEqual(rec["error"]["name"], "KeyboardInterrupt")
        self.assertEqual(rec["state"], "kept")
        self.assertEqual(self.srv.execute(sid, "kept")["results"], [{"text/plain": "1"}])

    def test_a_cell_larger_than_the_channel_runs(self):
        sid = self.session()
        rec = self.srv.execute(sid, "s = 0\n" + "s += 1\n" * 60000 + "s")
        self.assertStatus(rec, "ok")
        self.assertEqual(rec["results"], [{"text/plain": "60000"}])

    def test_restart_keeps_files_not_variables(self):
        sid = self.session()
        self.srv.execute(sid, "v = 5\nopen('f.txt', 'w').write('still here')")
        info = self.srv.ok("POST", path_of(sid, "/restart"))
        self.assertEqual((info["id"], info["execution_count"]), (sid, 0))
        rec = self.srv.execute(sid, "print(open('f.txt').read())\nv")
        self.assertEqual(rec["stdout"], "still here\n")
        self.assertEqual(rec["error"]["name"], "NameError")
        self.assertEqual(rec["execution_count"], 1)

    def test_interrupts_racing_the_end_of_cells(self):
        # An interrupt that lands while the kernel writes a frame must not cut the frame
        # short (which once desynchronised the channel and cost the session its state).
        sid = self.session()
        self.srv.execute(sid, "kept = 1")
        for i in range(300):
            out = {}
            t = threading.Thread(target=lambda: out.update(
                rec=self.srv.execute(sid, "print('x' * 10)")))
            t.start()
            self.srv.ok("POST", path_of(sid, "/interrupt"))
            t.join(HANG)
            rec = out["rec"]
            self.assertEqual(rec["state"], "kept", rec)
            # print writes the text and its end in two writes; an interrupt between them
            # leaves the text without the newline, as it does in any Python. Each write
            # arrives whole or not at all.
            self.assertIn(rec["stdout"], ("x" * 10 + "\n", "x" * 10, ""), rec)
            if rec["stdout"] == "x" * 10 + "\n":
                self.assertIn(rec["status"], ("ok", "error"), rec)
            else:
                self.assertEqual(rec["status"], "error", rec)
                self.assertEqual(rec["error"]["name"], "KeyboardInterrupt", rec)
        self.assertEqual(self.srv.execute(sid, "kept")["results"], [{"text/plain": "1"}])
        self.assertNotIn("protocol violation", self.srv.log())

    def test_a_busy_session_queues_in_order(self):
        """Executions sent while one runs wait their turn, first come first run, as a
        Jupyter kernel's do; a restart is still refused while a cell runs."""
        sid = self.session()
        st = Stream(self.srv, sid, "order = []\nprint('up', flush=True)\n" + WAIT_FOR_GO)
        self.assertEqual(st.next()["type"], "stdout")
        queued = [Stream(self.srv, sid, "order.append(%d); order" % i) for i in range(3)]
        for q in queued:
            self.assertEqual(q.start["phase"], "queued")
        self.assertError(self.srv.request("POST", path_of(sid, "/restart")), 409, "busy")
        info = self.srv.ok("GET", path_of(sid))
        self.assertEqual((info["status"], info["queued"]), ("busy", 3), info)
        # JSON, not streamed: it waits too, on a thread of its own.
        reply = {}
        waiter = threading.Thread(target=lambda: reply.update(
            r=self.srv.ok("POST", path_of(sid, "/execute"), {"code": "order"})))
        waiter.start()
        self.srv.ok("PUT", path_of(sid, "/files/go"), b"", status=201)
        self.assertStatus(st.rest()[-1]["record"], "ok")
        for i, q in enumerate(queued):
            record = q.rest()[-1]["record"]
            self.assertEqual(record["results"], [{"text/plain": repr(list(range(i + 1)))}])
        waiter.join(HANG)
        self.assertEqual(reply["r"]["results"], [{"text/plain": "[0, 1, 2]"}])

    def test_unknown_session(self):
        for method, route in ROUTES:
            if "ID" not in route:
                continue
            r = self.srv.request(method, route.replace("ID", "0" * 24),
                                 {"code": "1"} if method == "POST"
                                 else b"" if method == "DELETE" else b"x")
            self.assertError(r, 404, "not_found", "0" * 24)

    def test_unknown_route_and_wrong_method(self):
        self.assertError(self.srv.request("GET", "/v1/nothing"), 404, "not_found",
                         "/v1/nothing")
        self.assertError(self.srv.request("GET", "/nothing"), 404, "not_found")
        # "/" is the web console's (test_console.py): a redirect to it, not an unknown route.
        self.assertEqual(self.srv.request("GET", "/").status, 302)
        self.assertError(self.srv.request("GET", "/v1/sessions/a/b/c"), 404, "not_found")
        for method, path, allowed in (("PATCH", "/v1/sessions", "POST, GET, HEAD"),
                                      ("GET", "/v1/execute", "POST"),
                                      ("POST", "/healthz", "GET, HEAD"),
                                      ("PUT", "/v1/sessions/abc", "GET, HEAD, DELETE"),
                                      ("GET", "/v1/sessions/abc/execute", "POST"),
                                      ("POST", "/v1/sessions/abc/files/x",
                                       "GET, HEAD, PUT, DELETE")):
            r = self.srv.request(method, path, b"")
            self.assertError(r, 405, "method_not_allowed", method, allowed)
            self.assertEqual(r.headers["Allow"], allowed)

    def test_healthz_counts_sessions(self):
        sid = self.session()
        n = self.srv.ok("GET", "/healthz")["sessions"]
        self.assertGreaterEqual(n, 1)
        self.srv.ok("DELETE", path_of(sid))
        self.assertEqual(self.srv.ok("GET", "/healthz")["sessions"], n - 1)


class Validation(ServerCase):
    def bad(self, method, path, body, *needles, status=400, code="bad_request"):
        r = self.srv.request(method, path, body)
        return self.assertError(r, status, code, *needles)

    def test_bad_json(self):
        sid = self.session()
        for body in (b"{", b"{'a': 1}", b"[1, 2]", b"42", b'"code"', b"\xff\xfe",
                     b'{"code": "1", "code": "2"}', b'{"code": "a\\u0000b"}'):
            for path in ("/v1/sessions", path_of(sid, "/execute"), "/v1/execute"):
                self.bad("POST", path, body, "JSON" if body[:1] != b"[" else "object")

    def test_unknown_fields_are_named(self):
        sid = self.session()
        self.bad("POST", "/v1/sessions", {"memroy_mb": 5}, "'memroy_mb'", "memory_mb")
        self.bad("POST", "/v1/sessions", {"network": {"mode": "none", "alow": []}}, "'alow'")
        self.bad("POST", path_of(sid, "/execute"), {"code": "1", "timeout": 5}, "'timeout'",
                 "timeout_s")
        self.bad("POST", "/v1/execute", {"code": "1", "file": {}}, "'file'", "files")

    def test_wrong_types_are_named(self):
        sid = self.session()
        cases = [("/v1/sessions", {"memory_mb": "512"}, "'memory_mb'", "an integer", "a string"),
                 ("/v1/sessions", {"memory_mb": 1.5}, "'memory_mb'", "an integer"),
                 ("/v1/sessions", {"timeout_s": True}, "'timeout_s'", "a number", "a boolean"),
                 ("/v1/sessions", {"language": 3}, "'language'", "a string"),
                 ("/v1/sessions", {"network": "none"}, "'network'", "an object"),
                 ("/v1/sessions", {"network": {"allow": "x"}}, "'allow'", "an array"),
                 (path_of(sid, "/execute"), {"code": ["print(1)"]}, "'code'", "a string",
                  "an array"),
                 (path_of(sid, "/execute"), {"code": "1", "timeout_s": "5"}, "'timeout_s'"),
                 ("/v1/execute", {"code": "1", "files": []}, "'files'", "an object"),
                 ("/v1/execute", {"code": "1", "files": {"a": 1}}, "'a'", "base64")]
        for path, body, *needles in cases:
            self.bad("POST", path, body, *needles)

    def test_missing_and_bad_values(self):
        sid = self.session()
        self.bad("POST", path_of(sid, "/execute"), {}, "'code'", "required")
        self.bad("POST", path_of(sid, "/execute"), b"", "'code'", "required")
        self.bad("POST", "/v1/execute", {"files": {}}, "'code'", "required")
        self.bad("POST", path_of(sid, "/execute"), {"code": "1", "language": "cobol"},
                 "'language'", "cobol")
        self.bad("POST", "/v1/sessions", {"language": "ruby"}, "'language'", "python")
        self.bad("POST", "/v1/sessions", {"timeout_s": 0}, "'timeout_s'", "more than 0")
        self.bad("POST", "/v1/sessions", {"timeout_s": -1}, "'timeout_s'")
        self.bad("POST", "/v1/sessions", {"memory_mb": 0}, "'memory_mb'", "positive")
        self.bad("POST", "/v1/sessions", {"cpus": 0}, "'cpus'")
        # Below a thousandth of a core the share would round to nothing (once: a whole core).
        for tiny in (0.0004, 0.0009, 1e-300):
            self.bad("POST", "/v1/sessions", {"cpus": tiny}, "'cpus'", "0.001 of a core")
            self.bad("POST", "/v1/execute", {"code": "1", "cpus": tiny}, "'cpus'",
                     "0.001 of a core")
        self.bad("POST", "/v1/sessions", {"network": {"mode": "sometimes"}}, "'network.mode'")
        self.bad("POST", "/v1/sessions", {"network": {"mode": "allowlist", "allow": [1]}},
                 "'network.allow'")
        self.bad("POST", "/v1/execute", {"code": "1", "files": {"../x": ""}}, "'../x'")
        self.bad("POST", "/v1/execute", {"code": "1", "files": {"/etc/x": ""}}, "'/etc/x'")
        self.bad("POST", "/v1/execute", {"code": "1", "files": {"a": "!!!"}}, "'a'", "base64")

    def test_null_means_the_default(self):
        info = self.srv.ok("POST", "/v1/sessions", {"memory_mb": None, "timeout_s": None},
                           status=201)
        self.addCleanup(self.srv.request, "DELETE", path_of(info["id"]))
        self.assertEqual((info["limits"]["memory_mb"], info["timeout_s"]), (1024, 60))

    def test_over_the_server_maxima(self):
        sid = self.session()
        for field, value, limit in (("memory_mb", 10 ** 6, "8192"), ("pids", 10 ** 6, "4096"),
                                    ("disk_mb", 10 ** 6, "8192"),
                                    ("timeout_s", 10 ** 6, "3600"),
                                    ("idle_timeout_s", 10 ** 8, "604800"),
                                    ("cpus", 4096, str(os.cpu_count()))):
            msg = self.bad("POST", "/v1/sessions", {field: value}, "'%s'" % field, limit)
            self.assertIn("at most" if field == "cpus" else "more than this server allows", msg)
        self.bad("POST", path_of(sid, "/execute"), {"code": "1", "timeout_s": 10 ** 6},
                 "'timeout_s'", "3600")
        self.bad("POST", "/v1/execute", {"code": "1", "memory_mb": 10 ** 6}, "'memory_mb'")


# ---- streaming ----

class Streaming(ServerCase):
    def test_events_in_order_and_done_carries_the_record(self):
        sid = self.session()
        code = ("import sys\nprint('one', flush=True)\nprint('two', file=sys.stderr, flush=True)\n"
                "print('three', flush=True)\n6 * 7")
        st = Stream(self.srv, sid, code)
        self.assertEqual(st.resp.status, 200)
        self.assertEqual(st.resp.headers.get_content_type(), "application/x-ndjson")
        events = st.rest()
        self.assertEqual([e["type"] for e in events],
                         ["stdout", "stderr", "stdout", "result", "done"])
        self.assertEqual([e.get("data") for e in events[:4]],
                         ["one\n", "two\n", "three\n", {"text/plain": "42"}])
        rec = events[-1]["record"]
        self.assertStatus(rec, "ok")
        self.assertEqual((rec["stdout"], rec["stderr"]), ("one\nthree\n", "two\n"))
        self.assertEqual(rec["results"], [{"text/plain": "42"}])

    def test_error_event_before_done(self):
        sid = self.session()
        events = Stream(self.srv, sid, "print('before')\n1/0").rest()
        self.assertEqual([e["type"] for e in events], ["stdout", "error", "done"])
        self.assertEqual(events[1]["error"]["name"], "ZeroDivisionError")
        self.assertEqual(events[2]["record"]["error"], events[1]["error"])

    def test_output_arrives_while_the_cell_runs(self):
        # The cell cannot end before the test has seen its first line: it waits for a file
        # that the test writes only then.
        sid = self.session()
        st = Stream(self.srv, sid, "print('first', flush=True)\n" + WAIT_FOR_GO +
                    "print('second')")
        self.assertEqual(st.next(), {"type": "stdout", "data": "first\n"})
        self.assertEqual(self.srv.ok("GET", path_of(sid))["status"], "busy")
        self.srv.ok("PUT", path_of(sid, "/files/go"), b"", status=201)
        events = st.rest()
        self.assertEqual(events[0], {"type": "stdout", "data": "second\n"})
        self.assertEqual(events[-1]["record"]["stdout"], "first\nsecond\n")

    def test_output_below_python_streams_too(self):
        sid = self.session()
        st = Stream(self.srv, sid, "import os\nos.system('echo from-a-child')\n" + WAIT_FOR_GO)
        self.assertEqual(st.next(), {"type": "stdout", "data": "from-a-child\n"})
        self.srv.ok("PUT", path_of(sid, "/files/go"), b"", status=201)
        self.assertStatus(st.rest()[-1]["record"], "ok")

    def test_an_execution_has_at_most_16_readers_at_once(self):
        """Its events are read by up to 16 streams at once (the execute's own among them); a
        17th is a 429 saying so, and a reader that leaves makes room for another."""
        sid = self.session()
        st = Stream(self.srv, sid, "print('first', flush=True)\n" + WAIT_FOR_GO + "print('end')")
        self.assertEqual(st.next(), {"type": "stdout", "data": "first\n"})
        events = path_of(sid, "/executions/%s/events?after=0" % st.execution_id)
        readers = []
        for _ in range(15):
            conn = self.srv.connection()
            conn.request("GET", events, headers=self.srv.headers(NDJSON))
            resp = conn.getresponse()
            self.assertEqual(resp.status, 200)
            seen = [json.loads(resp.readline())["type"] for _ in range(2)]
            self.assertEqual(seen, ["start", "stdout"])  # it reads
            readers.append((conn, resp))
        r = self.srv.request("GET", events, headers=NDJSON)
        self.assertEqual(r.status, 429, r)
        self.assertIn("has its maximum of 16 readers", r.json()["error"]["message"])
        conn, _ = readers.pop()
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        # The server notices the reader gone at its next write or keep-alive: wait for the
        # place to be free, as a client retrying after a 429 would.
        def another():
            c = self.srv.connection()
            c.request("GET", events, headers=self.srv.headers(NDJSON))
            resp = c.getresponse()
            if resp.status == 200:
                readers.append((c, resp))
                return True
            resp.read()
            c.close()
            return False
        self.assertTrue(wait_until(another, 60))
        self.srv.ok("PUT", path_of(sid, "/files/go"), b"", status=201)
        self.assertEqual(st.rest()[-1]["record"]["stdout"], "first\nend\n")
        for conn, resp in readers:
            lines = [json.loads(l) for l in resp.read().splitlines()]
            self.assertEqual(lines[-1]["type"], "done")
            conn.close()

    def test_without_accept_one_record(self):
        sid = self.session()
        r = self.srv.request("POST", path_of(sid, "/execute"), {"code": "print(1)"},
                             headers={"Accept": "application/json"})
        self.assertEqual(r.status, 200)
        self.assertEqual(r.headers.get_content_type(), "application/json")
        self.assertEqual(r.json()["stdout"], "1\n")

    def test_invalid_utf8_output_is_repaired(self):
        sid = self.session()
        events = Stream(self.srv, sid, "import sys\nsys.stdout.buffer.write(b'a\\xffb\\n')").rest()
        self.assertEqual(events[0]["data"], "a\ufffdb\n")


class Disconnect(ServerCase):
    CELL = ("import time\nmarker = 'kept'\n"
            "try:\n"
            "    open('started', 'w').close()\n"
            "    print('up', flush=True)\n"
            "    time.sleep(300)\n"
            "except KeyboardInterrupt:\n"
            "    open('interrupted', 'w').close()\n"
            "    raise\n")

    def assertInterrupted(self, sid):
        self.assertTrue(wait_until(lambda: "interrupted" in file_names(self.srv, sid)),
                        "the cell was not interrupted")
        self.assertTrue(wait_until(lambda: self.srv.ok("GET", path_of(sid))["status"] == "idle"))
        rec = self.srv.execute(sid, "marker")
        self.assertEqual(rec["results"], [{"text/plain": "'kept'"}])
        _, m = metrics(self.srv)
        self.assertIn(b"runcell_executions_running 0", m.body)

    def test_streaming_client_hangs_up(self):
        sid = self.session()
        st = Stream(self.srv, sid, self.CELL)
        self.assertEqual(st.next(), {"type": "stdout", "data": "up\n"})
        st.hang_up()
        self.assertInterrupted(sid)

    def test_waiting_client_hangs_up(self):
        sid = self.session()
        body = json.dumps({"code": self.CELL}).encode()
        s = raw_request(self.srv.port, "POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s"
                        "\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                        % (path_of(sid, "/execute"), TOKEN, len(body)), body)
        self.assertTrue(wait_until(lambda: "started" in file_names(self.srv, sid)))
        s.shutdown(socket.SHUT_RDWR)
        s.close()
        self.assertInterrupted(sid)

    def test_log_says_aborted(self):
        sid = self.session()
        st = Stream(self.srv, sid, self.CELL)
        st.next()
        st.hang_up()
        self.assertTrue(wait_until(lambda: re.search(
            r"route=/v1/sessions/\{id\}/execute status=200 .*session=\"%s\".* aborted=1" % sid,
            self.srv.log())), self.srv.log()[-3000:])


# ---- files ----

class Files(ServerCase):
    def test_upload_download_list_delete(self):
        sid = self.session()
        data = bytes(range(256)) * 100
        r = self.srv.ok("PUT", path_of(sid, "/files/data/raw.bin"), data, status=201)
        self.assertEqual(r, {"path": "data/raw.bin", "size": len(data)})
        r = self.srv.request("GET", path_of(sid, "/files/data/raw.bin"))
        self.assertEqual((r.status, r.body), (200, data))
        self.assertEqual(r.headers["Content-Type"], "application/octet-stream")
        self.assertEqual(r.headers["Content-Length"], str(len(data)))
        # The code sees what was uploaded, and the API sees what the code wrote.
        rec = self.srv.execute(sid, "import os\nprint(os.path.getsize('data/raw.bin'))\n"
                               "os.makedirs('out/deep', exist_ok=True)\n"
                               "open('out/deep/r.csv', 'w').write('a,b\\n1,2\\n')")
        self.assertEqual(rec["stdout"], "%d\n" % len(data))
        self.assertEqual(rec["files"]["created"], ["out/deep/r.csv"])
        listing = self.srv.ok("GET", path_of(sid, "/files"))
        self.assertFalse(listing["truncated"])
        by_path = {f["path"]: f for f in listing["files"]}
        self.assertEqual(sorted(by_path), ["data/raw.bin", "out/deep/r.csv"])
        self.assertEqual(by_path["out/deep/r.csv"]["size"], 8)
        self.assertEqual(by_path["out/deep/r.csv"]["type"], "file")
        self.assertRegex(by_path["data/raw.bin"]["mtime"],
                         r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
        r = self.srv.request("GET", path_of(sid, "/files/out/deep/r.csv"))
        self.assertEqual((r.body, r.headers["Content-Type"]),
                         (b"a,b\n1,2\n", "text/csv; charset=utf-8"))
        self.srv.ok("PUT", path_of(sid, "/files/s.py"), b"x = 1\n", status=201)
        self.assertEqual(self.srv.request("GET", path_of(sid, "/files/s.py"))
                         .headers["Content-Type"], "text/x-python; charset=utf-8")
        # Replacing is allowed; empty files too.
        self.srv.ok("PUT", path_of(sid, "/files/data/raw.bin"), b"", status=200)  # replaced
        self.assertEqual(self.srv.request("GET", path_of(sid, "/files/data/raw.bin")).body, b"")
        self.assertEqual(self.srv.ok("DELETE", path_of(sid, "/files/data/raw.bin")),
                         {"path": "data/raw.bin", "deleted": True})
        self.assertError(self.srv.request("GET", path_of(sid, "/files/data/raw.bin")), 404,
                         "not_found", "data/raw.bin")
        self.assertError(self.srv.request("DELETE", path_of(sid, "/files/data/raw.bin")), 404,
                         "not_found")
        self.assertError(self.srv.request("GET", path_of(sid, "/files/out")), 400, "bad_path",
                         "directory")
        self.assertError(self.srv.request("DELETE", path_of(sid, "/files/out")), 400, "bad_path",
                         "directory")
        self.assertError(self.srv.request("PUT", path_of(sid, "/files/out"), b"x"), 400,
                         "bad_path", "directory")

    def test_names_with_spaces_and_unicode(self):
        sid = self.session()
        from urllib.parse import quote
        name = "my report é.txt"
        self.srv.ok("PUT", path_of(sid, "/files/" + quote(name)), "ü".encode(), status=201)
        self.assertEqual(file_names(self.srv, sid), [name])
        rec = self.srv.execute(sid, "print(open(%r).read())" % name)
        self.assertEqual(rec["stdout"], "ü\n")

    def test_uploads_belong_to_the_sandbox_user(self):
        sid = self.session()
        self.srv.ok("PUT", path_of(sid, "/files/a/b/c.txt"), b"1", status=201)
        rec = self.srv.execute(sid, "import os\nopen('a/b/c.txt', 'a').write('2')\n"
                               "open('a/b/new.txt', 'w').write('3')\n"
                               "print(os.stat('a/b/c.txt').st_uid, os.getuid())")
        self.assertStatus(rec, "ok")
        uid, me = rec["stdout"].split()
        self.assertEqual(uid, me)


class PathAttacks(ServerCase):
    """The file API refuses to leave the workspace, whatever the path or the links the
    sandboxed code planted, and never writes or reads through a link."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.outside = tempfile.mkdtemp(prefix="runcell-outside-")
        os.chmod(cls.outside, 0o777)
        with open(os.path.join(cls.outside, "secret"), "w") as f:
            f.write("host secret")

    @classmethod
    def tearDownClass(cls):
        subprocess.run(["rm", "-rf", cls.outside])
        super().tearDownClass()

    def setUp(self):
        self.sid = self.session()
        o = self.outside
        rec = self.srv.execute(self.sid, (
            "import os\n"
            "open('real.txt', 'w').write('inside')\n"
            "os.makedirs('sub')\n"
            "os.symlink('/etc/passwd', 'passwd')\n"
            "os.symlink('/etc', 'etc')\n"
            "os.symlink(%r, 'out')\n"
            "os.symlink(%r, 'out-secret')\n"
            "os.symlink('real.txt', 'inner')\n"
            "os.symlink('..', 'sub/up')\n"
            "os.symlink('/proc/self/root', 'root')\n"
            "os.mkfifo('fifo')\n"
            "import socket\n"
            "socket.socket(socket.AF_UNIX).bind('sub/sock')\n") % (o, o + "/secret"))
        self.assertStatus(rec, "ok")

    def files(self, method, rest, body=None):
        return self.srv.request(method, path_of(self.sid, "/files/" + rest), body)

    def assertOutsideUntouched(self):
        self.assertEqual(os.listdir(self.outside), ["secret"])
        with open(os.path.join(self.outside, "secret")) as f:
            self.assertEqual(f.read(), "host secret")
        with open("/etc/passwd") as f:
            self.assertTrue(f.read().startswith("root:"))

    def test_traversal_is_400(self):
        for rest in ("..", "../x", "../../../../etc/passwd", "sub/../real.txt", "./real.txt",
                     "sub//x", "sub/", "%2e%2e/%2e%2e/etc/passwd", "..%2F..%2Fetc%2Fpasswd",
                     "%2Fetc%2Fpasswd", "/etc/passwd", "sub%2F..%2F..%2Fx", "real.txt%00.png",
                     "a%00/../../x"):
            for method in ("GET", "PUT", "DELETE"):
                r = self.files(method, rest, b"pwned" if method == "PUT" else None)
                self.assertError(r, 400, "bad_path")
        self.assertOutsideUntouched()
        self.assertEqual(self.files("GET", "real.txt").body, b"inside")

    def test_links_are_never_read(self):
        for rest in ("passwd", "etc/passwd", "out/secret", "out-secret", "inner", "sub/up/real.txt",
                     "root/etc/passwd"):
            r = self.files("GET", rest)
            msg = self.assertError(r, 400, "bad_path", rest)
            self.assertIn("symbolic link", msg)
            self.assertNotIn(b"root:", r.body)
            self.assertNotIn(b"host secret", r.body)

    def test_links_are_never_written_through(self):
        for rest in ("passwd", "out-secret", "inner", "out/new", "out/secret", "etc/x",
                     "sub/up/x", "root/tmp/x"):
            r = self.files("PUT", rest, b"pwned")
            msg = self.assertError(r, 400, "bad_path", rest)
            self.assertIn("symbolic link", msg)
        self.assertOutsideUntouched()
        # Nothing half-written was left behind in the workspace either.
        names = file_names(self.srv, self.sid)
        self.assertFalse([n for n in names if "upload" in n], names)
        self.assertEqual(self.files("GET", "real.txt").body, b"inside")

    def test_delete_removes_the_link_not_its_target(self):
        for rest in ("out-secret", "passwd", "inner"):
            self.assertEqual(self.files("DELETE", rest).status, 200)
        for rest in ("out/secret", "etc/hostname", "sub/up/real.txt"):
            self.assertError(self.files("DELETE", rest), 400, "bad_path")
        self.assertOutsideUntouched()
        self.assertEqual(self.files("GET", "real.txt").body, b"inside")

    def test_listing_shows_links_as_links(self):
        listing = {f["path"]: f for f in self.srv.ok("GET", path_of(self.sid, "/files"))["files"]}
        self.assertEqual(listing["passwd"]["type"], "symlink")
        self.assertEqual(listing["passwd"]["size"], len("/etc/passwd"))  # the link, not passwd
        self.assertEqual(listing["real.txt"]["type"], "file")
        self.assertNotIn("out/secret", listing)  # links to directories are not walked
        self.assertNotIn("fifo", listing)

    def test_special_files_are_refused(self):
        # Opening a FIFO for reading would block: the server must refuse it, not hang.
        self.assertError(self.files("GET", "fifo"), 400, "bad_path", "regular file",
                         "'fifo' is a named pipe (FIFO)")
        # A socket cannot be opened at all (ENXIO): a 400 that says what it is, not a 500.
        self.assertError(self.files("GET", "sub/sock"), 400, "bad_path",
                         "'sub/sock' is a socket, not a regular file")


class BigFiles(RuncellTestCase):
    """50 MB each way, streamed: the server's peak memory must not grow by the file's size."""
    SIZE = 50 << 20

    def test_50mb_up_and_down_in_flat_memory(self):
        with Server() as srv, tempfile.TemporaryFile() as f:
            sid = srv.create_session()
            h = hashlib.sha256()
            block = os.urandom(1 << 20)
            for i in range(self.SIZE >> 20):
                chunk = bytes([i]) + block[1:]
                h.update(chunk)
                f.write(chunk)
            f.seek(0)
            srv.execute(sid, "1")  # the first cell's allocations are not the upload's
            hwm0 = vm_hwm_kb(srv.pid)

            conn = srv.connection()
            conn.request("PUT", path_of(sid, "/files/big.bin"), body=f,
                         headers=srv.headers({"Content-Length": str(self.SIZE)}))
            r = conn.getresponse()
            self.assertEqual((r.status, json.loads(r.read())["size"]), (201, self.SIZE))
            conn.close()

            rec = srv.execute(sid, "import hashlib\nprint(hashlib.sha256("
                              "open('big.bin', 'rb').read()).hexdigest())")
            self.assertEqual(rec["stdout"].strip(), h.hexdigest())

            conn = srv.connection()
            conn.request("GET", path_of(sid, "/files/big.bin"), headers=srv.headers())
            r = conn.getresponse()
            self.assertEqual(r.status, 200)
            self.assertEqual(int(r.headers["Content-Length"]), self.SIZE)
            got, n = hashlib.sha256(), 0
            while True:
                chunk = r.read(1 << 16)
                if not chunk:
                    break
                got.update(chunk)
                n += len(chunk)
            conn.close()
            self.assertEqual((n, got.hexdigest()), (self.SIZE, h.hexdigest()))
            grew_kb = vm_hwm_kb(srv.pid) - hwm0
            self.assertLess(grew_kb, 10 * 1024, "peak RSS grew by %d KiB" % grew_kb)


# ---- limits ----

class Limits(RuncellTestCase):
    def test_max_sessions_is_429(self):
        with Server("--max-sessions", "2") as srv:
            a = srv.create_session()
            srv.create_session()
            r = srv.request("POST", "/v1/sessions", {})
            self.assertEqual((r.status, r.error_code), (429, "limit_exceeded"), r)
            self.assertIn("maximum of 2 live sessions", r.json()["error"]["message"])
            srv.ok("DELETE", path_of(a))
            srv.create_session()

    def test_out_of_open_files_is_503_and_loses_nothing(self):
        # The server's own limit, lowered under it: sessions are refused before they are
        # begun, with what to do; those it has go on, the template is kept, and a closed
        # session's descriptors serve the next one (no ready pool, whose refill would take
        # them first).
        with Server("--max-sessions", "500", "--pool", "0") as srv:
            first = srv.create_session()
            srv.execute(first, "x = 41")
            limit = len(os.listdir("/proc/%d/fd" % srv.pid)) + 150
            subprocess.run(["prlimit", "--pid", str(srv.pid), "--nofile=%d:%d" % (limit, limit)],
                           check=True)
            made = []
            for _ in range(100):
                r = srv.request("POST", "/v1/sessions", {})
                if r.status != 201:
                    break
                made.append(r.json()["id"])
            self.assertEqual((r.status, r.error_code), (503, "sandbox_error"), r)
            message = r.json()["error"]["message"]
            self.assertIn("out of open files", message)
            self.assertIn("(its limit is %d)" % limit, message)
            self.assertIn("ulimit -n", message)
            self.assertGreater(len(made), 3)
            self.assertEqual(srv.execute(first, "x + 1")["results"], [{"text/plain": "42"}])
            self.assertEqual(srv.request("GET", "/healthz").status, 200)
            for sid in made[:3]:
                srv.ok("DELETE", path_of(sid))
            again = srv.create_session()
            self.assertEqual(srv.execute(again, "1 + 1")["results"], [{"text/plain": "2"}])
            log = srv.log()
            for sign in ("replacing the template", "starting from scratch"):
                self.assertNotIn(sign, log)

    def test_the_open_files_limit_is_raised_for_max_sessions_or_named(self):
        # 1000 sessions need ~14000 descriptors: a hard limit of 2048 is raised where the
        # server may (CAP_SYS_RESOURCE), and else named in a warning with what to set.
        def read(path):
            with open(path) as f:
                return f.read()

        with TempDir() as d:
            log_path = os.path.join(d, "log")
            with open(log_path, "wb") as log:
                p = subprocess.Popen(
                    ["prlimit", "--nofile=2048:2048", RUNCELL, "serve", "--listen",
                     "127.0.0.1:0", "--data", os.path.join(d, "data"), "--token", TOKEN,
                     "--no-template", "--max-sessions", "1000"],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    env=dict(os.environ, RUNCELL_RUNDIR=d))
            try:
                deadline = time.monotonic() + HANG
                while "listening" not in read(log_path):
                    self.assertIsNone(p.poll(), read(log_path))
                    self.assertLess(time.monotonic(), deadline, read(log_path))
                    time.sleep(0.05)
                limits = read("/proc/%d/limits" % p.pid)
                soft = int(re.search(r"Max open files\s+(\d+)", limits).group(1))
                text = read(log_path)
                if soft < 14088:
                    self.assertEqual(soft, 2048, limits)
                    self.assertRegex(text, r'open files limit allows fewer sessions.*'
                                           r'open_files_max=2048 sessions_max=1000 '
                                           r'sessions_about=73 fix="raise the limit .* to 14088"')
                else:
                    self.assertNotIn("open files limit allows fewer", text)
            finally:
                p.terminate()
                self.assertEqual(p.wait(timeout=HANG), 0)

    def test_an_idle_session_gives_back_its_usage_files_and_measures_its_next_cell(self):
        # A session idle for 10 s closes the cgroup files it keeps open to measure a cell
        # (what lets 2500 idle sessions fit in 20000 descriptors); its next cell opens them
        # again and is measured as before.
        def usage_files(pid):
            n = 0
            for fd in os.listdir("/proc/%d/fd" % pid):
                try:
                    target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
                except OSError:
                    continue
                n += target.startswith("/sys/fs/cgroup/")
            return n

        with Server("--pool", "0") as srv:
            sid = srv.create_session()
            srv.execute(sid, "x = 1")
            held = usage_files(srv.pid)
            self.assertGreaterEqual(held, 3)
            # three of them: v1 cpuacct.usage, memory.max_usage_in_bytes, memory.oom_control;
            # v2 cpu.stat, memory.events, memory.peak
            self.assertTrue(wait_until(lambda: usage_files(srv.pid) == held - 3, HANG),
                            "still %d cgroup files open of %d" % (usage_files(srv.pid), held))
            rec = srv.execute(sid, "big = bytearray(60 << 20)\n"
                                   "for i in range(0, len(big), 4096): big[i] = 1\n"
                                   "sum(range(3000000))")
            self.assertEqual(rec["results"], [{"text/plain": str(sum(range(3000000)))}])
            self.assertGreaterEqual(rec["usage"]["memory_peak_kb"], 60 << 10, rec)
            self.assertGreater(rec["usage"]["cpu_ms"], 0, rec)
            self.assertEqual(usage_files(srv.pid), held)

    def test_max_executions_waits_and_max_queued_is_429(self):
        """Past --max-executions an execution waits for a place; past
        --max-queued-executions waiting ones, a new one is refused with 429."""
        with Server("--max-executions", "1", "--max-queued-executions", "1") as srv:
            a, b, c = srv.create_session(), srv.create_session(), srv.create_session()
            st = Stream(srv, a, "print('up', flush=True)\n" + WAIT_FOR_GO)
            st.next()
            waiting = Stream(srv, b, "print('b ran')")
            self.assertEqual(waiting.start["phase"], "queued")
            for path, body in ((path_of(c, "/execute"), {"code": "1"}),
                               ("/v1/execute", {"code": "1"})):
                r = srv.request("POST", path, body)
                self.assertEqual((r.status, r.error_code), (429, "limit_exceeded"), r)
                self.assertIn("maximum of 1 executions waiting", r.json()["error"]["message"])
            metrics = srv.request("GET", "/metrics").body.decode()
            self.assertIn("runcell_executions_running 1\n", metrics)
            self.assertIn("runcell_executions_queued 1\n", metrics)
            srv.ok("PUT", path_of(a, "/files/go"), b"", status=201)
            st.rest()
            self.assertEqual(waiting.rest()[-1]["record"]["stdout"], "b ran\n")
            self.assertStatus(srv.execute(c, "1"), "ok")

    def test_max_body_is_413(self):
        with Server("--max-body", "1") as srv:
            sid = srv.create_session()
            code = "x = '%s'\nprint(len(x))" % ("a" * (1 << 20))
            r = srv.request("POST", path_of(sid, "/execute"), {"code": code})
            self.assertEqual((r.status, r.error_code), (413, "too_large"), r)
            self.assertIn("1048576", r.json()["error"]["message"])
            # Chunked, so the size is known only at the end.
            conn = srv.connection()
            conn.request("POST", path_of(sid, "/execute"), headers=srv.headers(),
                         body=iter([json.dumps({"code": code}).encode()]), encode_chunked=True)
            r = conn.getresponse()
            self.assertEqual(r.status, 413)
            conn.close()
            self.assertEqual(srv.execute(sid, "print(1)")["stdout"], "1\n")

    def test_max_upload_is_413_and_leaves_nothing(self):
        with Server("--max-upload", "1") as srv:
            sid = srv.create_session()
            srv.ok("PUT", path_of(sid, "/files/keep.bin"), b"old", status=201)
            big = b"x" * ((1 << 20) + 1)
            for path in ("keep.bin", "new.bin", "d/new.bin"):
                r = srv.request("PUT", path_of(sid, "/files/" + path), big)
                self.assertEqual((r.status, r.error_code), (413, "too_large"), r)
                conn = srv.connection()
                conn.request("PUT", path_of(sid, "/files/" + path), headers=srv.headers(),
                             body=iter([big[:1 << 19], big[1 << 19:]]), encode_chunked=True)
                r = conn.getresponse()
                self.assertEqual(r.status, 413)
                self.assertIn(b"1048576", r.read())
                conn.close()
            self.assertEqual(srv.request("GET", path_of(sid, "/files/keep.bin")).body, b"old")
            names = file_names(srv, sid)
            self.assertEqual(sorted(n for n in names if n != "d"), ["keep.bin"], names)
            rec = srv.execute(sid, "import os\nprint(sorted(os.listdir('.')))")
            self.assertNotIn("upload", rec["stdout"])
            self.assertEqual(srv.ok("PUT", path_of(sid, "/files/ok.bin"), big[:1 << 20],
                                    status=201)["size"], 1 << 20)

    def test_early_413_without_the_body(self):
        # A client that states a large Content-Length hears 413 without sending the body.
        with Server("--max-upload", "1") as srv:
            sid = srv.create_session()
            s = raw_request(srv.port, "PUT %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                            "Content-Length: %d\r\nExpect: 100-continue\r\n\r\n"
                            % (path_of(sid, "/files/big"), TOKEN, 50 << 20))
            status, _, body = read_response(s)
            s.close()
            self.assertEqual(status, 413)
            self.assertIn(b"too_large", body)

    def test_workspace_full_is_413(self):
        with Server() as srv:
            sid = srv.create_session(disk_mb=2)
            r = srv.request("PUT", path_of(sid, "/files/f"), b"x" * (3 << 20))
            self.assertEqual((r.status, r.error_code), (413, "too_large"), r)
            self.assertIn("full", r.json()["error"]["message"])
            self.assertEqual(file_names(srv, sid), [])

    def test_sandbox_failure_is_503_and_counted(self):
        with Server() as srv:
            r = srv.request("POST", "/v1/sessions", {"memory_mb": 1})
            if r.status == 201 and r.json()["limits_degraded"]:
                self.skipTest("no cgroup memory limit here (degraded mode)")
            self.assertEqual((r.status, r.error_code), (503, "sandbox_error"), r)
            self.assertIn("cannot create the session", r.json()["error"]["message"])
            values, _ = metrics(srv)
            self.assertEqual(values["runcell_sandbox_failures_total"], 1)
            self.assertEqual(values["runcell_sessions_live"], 0)

    def test_defaults_above_maxima_are_refused(self):
        p = subprocess.run([RUNCELL, "serve", "--memory", "2048", "--max-memory", "1024"],
                           capture_output=True, text=True, timeout=HANG)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--max-memory", p.stderr)


# ---- many clients ----

def nice_of(pid, tid):
    with open("/proc/%d/task/%d/stat" % (pid, tid)) as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])


def lowered_threads(pid):
    """The threads of pid whose nice is above its main thread's (session work, nice +5);
    a thread that ends while they are read (a closed connection's) is left out."""
    base = nice_of(pid, pid)
    found = {}
    for t in map(int, os.listdir("/proc/%d/task" % pid)):
        try:
            n = nice_of(pid, t)
        except FileNotFoundError:
            continue
        if n != base:
            found[t] = n - base
    return found


class WorkPriority(RuncellTestCase):
    """Session work runs 5 nice steps below the rest of the daemon. The thread of an HTTP
    connection keeps that between executions and gets its priority back before any other
    request, on the same connection."""

    def test_an_execution_leaves_its_connection_lowered_and_any_other_request_restores_it(self):
        with Server("--pool", "0") as srv:  # no refill thread: only this connection works
            sid = srv.create_session()
            conn = srv.connection()
            self.addCleanup(conn.close)

            def call(method, path, body=None):
                conn.request(method, path, body=json.dumps(body) if body else None,
                             headers=srv.headers())
                r = conn.getresponse()
                data = r.read()
                self.assertEqual(r.status, 200, data)
            base = nice_of(srv.pid, srv.pid)
            if base >= 19:
                self.skipTest("the server runs at nice 19 (inherited): nothing is lower")
            step = min(19, base + 5) - base  # nice stops at 19
            self.assertEqual(lowered_threads(srv.pid), {})
            call("POST", path_of(sid, "/execute"), {"code": "x = 1"})
            self.assertEqual(list(lowered_threads(srv.pid).values()), [step])
            call("POST", path_of(sid, "/execute"), {"code": "x += 1"})
            self.assertEqual(list(lowered_threads(srv.pid).values()), [step])
            call("GET", "/healthz")
            self.assertEqual(lowered_threads(srv.pid), {})
            call("POST", path_of(sid, "/execute"), {"code": "x += 1"})
            call("GET", path_of(sid))
            self.assertEqual(lowered_threads(srv.pid), {})


class Idempotency(ServerCase):
    COUNT = "import os\nopen('runs', 'a').write('x')\nruns = os.path.getsize('runs')\nruns"

    def keyed(self, sid, code, key, **kw):
        return self.srv.request("POST", path_of(sid, "/execute"), {"code": code},
                                headers={"Idempotency-Key": key}, **kw)

    def test_a_retried_execute_with_its_key_never_runs_twice(self):
        sid = self.session()
        first = self.keyed(sid, self.COUNT, "k-1")
        self.assertEqual(first.status, 200, first)
        self.assertEqual(first.json()["results"], [{"text/plain": "1"}])
        again = self.keyed(sid, self.COUNT, "k-1")
        self.assertEqual(again.status, 200, again)
        self.assertEqual(again.json()["results"], [{"text/plain": "1"}])
        self.assertTrue(again.json()["replayed"])
        self.assertEqual(again.headers["X-Runcell-Execution"],
                         first.headers["X-Runcell-Execution"])
        # streamed: the same execution's events again, from its start
        conn = self.srv.connection()
        conn.request("POST", path_of(sid, "/execute"), body=json.dumps({"code": self.COUNT}),
                     headers=self.srv.headers(dict(NDJSON, **{"Idempotency-Key": "k-1"})))
        lines = [json.loads(l) for l in conn.getresponse().read().splitlines()]
        conn.close()
        self.assertTrue(lines[0]["replayed"])
        self.assertEqual(lines[-1]["record"]["results"], [{"text/plain": "1"}])
        # without a key, or with a new one, it runs
        self.assertEqual(self.srv.execute(sid, self.COUNT)["results"], [{"text/plain": "2"}])
        self.assertEqual(self.keyed(sid, self.COUNT, "k-2").json()["results"],
                         [{"text/plain": "3"}])

    def test_two_requests_at_once_with_one_key_run_once(self):
        sid = self.session()
        code = "import time\ntime.sleep(0.3)\n" + self.COUNT
        out = [None, None]

        def send(i):
            out[i] = self.keyed(sid, code, "same")
        threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(HANG)
        self.assertEqual([r.status for r in out], [200, 200], out)
        self.assertEqual([r.json()["results"] for r in out], [[{"text/plain": "1"}]] * 2)
        self.assertEqual(sorted(bool(r.json().get("replayed")) for r in out), [False, True])

    def test_a_key_for_other_code_or_out_of_shape_is_refused(self):
        sid = self.session()
        self.assertEqual(self.keyed(sid, "1", "k").status, 200)
        r = self.keyed(sid, "2", "k")
        self.assertEqual((r.status, r.error_code), (409, "exists"), r)
        self.assertIn("other code", r.json()["error"]["message"])
        for bad in ("x" * 65, "has space"):
            r = self.keyed(sid, "1", bad)
            self.assertEqual((r.status, r.error_code), (400, "bad_request"), r)
            self.assertIn("idempotency key", r.json()["error"]["message"])


class Concurrency(ServerCase):
    def test_20_sessions_execute_in_parallel(self):
        n = 20
        ids = [None] * n
        errors = []

        def create(i):
            try:
                ids[i] = self.srv.create_session()
            except Exception as e:  # reported below, in the test's thread
                errors.append(e)
        threads = [threading.Thread(target=create, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(HANG)
        self.assertEqual(errors, [])
        for sid in ids:
            self.addCleanup(self.srv.request, "DELETE", path_of(sid))

        records = [None] * n

        def run(i):
            try:
                records[i] = self.srv.execute(ids[i], WAIT_FOR_GO + "print('cell', %d)" % i)
            except Exception as e:
                errors.append(e)
        threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        # All twenty run at once: each waits for a file only the test writes, once it has
        # seen every one of them running.
        self.assertTrue(wait_until(lambda: metrics(self.srv)[0]["runcell_executions_running"]
                                   == n), metrics(self.srv)[1])
        busy = [s for s in self.srv.ok("GET", "/v1/sessions")["sessions"]
                if s["id"] in ids and s["status"] == "busy"]
        self.assertEqual(len(busy), n)
        for sid in ids:
            self.srv.ok("PUT", path_of(sid, "/files/go"), b"", status=201)
        for t in threads:
            t.join(HANG)
        self.assertEqual(errors, [])
        for i, rec in enumerate(records):
            self.assertStatus(rec, "ok")
            self.assertEqual(rec["stdout"], "cell %d\n" % i)

    def test_a_slow_client_blocks_nobody(self):
        sid = self.session()
        body = json.dumps({"code": "print('slow')"}).encode()
        s = raw_request(self.srv.port, "POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                        "Connection: close\r\nContent-Length: %d\r\n\r\n"
                        % (path_of(sid, "/execute"), TOKEN, len(body)), body[:5])
        # While the slow request is half sent, others are served, one byte at a time.
        for i in range(5, len(body) - 1):
            s.sendall(body[i:i + 1])
            if i % 5 == 0:
                other = self.session()
                self.assertEqual(self.srv.execute(other, "print(%d)" % i)["stdout"], "%d\n" % i)
                self.assertEqual(self.srv.request("GET", "/healthz").status, 200)
        s.sendall(body[-1:])
        status, _, resp = read_response(s)
        s.close()
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(resp)["stdout"], "slow\n")

    def test_keep_alive_connection_serves_many_requests(self):
        sid = self.session()
        conn = self.srv.connection()
        for i in range(20):
            conn.request("POST", path_of(sid, "/execute"), body=json.dumps({"code": "%d" % i}),
                         headers=self.srv.headers())
            r = conn.getresponse()
            self.assertEqual(json.loads(r.read())["results"], [{"text/plain": str(i)}])
        conn.close()


# ---- one-shot runs ----

class OneShot(ServerCase):
    def test_files_in_record_and_outputs_out(self):
        csv = b"a,b\n1,2\n3,4\n"
        r = self.srv.ok("POST", "/v1/execute", {
            "code": "import csv\nrows = list(csv.DictReader(open('in/data.csv')))\n"
                    "print(sum(int(r['b']) for r in rows))\n"
                    "open('sum.txt', 'w').write('6')\nlen(rows)",
            "files": {"in/data.csv": base64.b64encode(csv).decode()},
            "timeout_s": 30, "memory_mb": 256})
        self.assertStatus(r, "ok")
        self.assertEqual(r["stdout"], "6\n")
        self.assertEqual(r["results"], [{"text/plain": "2"}])
        self.assertEqual(r["files"]["created"], ["sum.txt"])
        self.assertEqual(r["outputs"], {"sum.txt": base64.b64encode(b"6").decode()})
        self.assertEqual(r["outputs_omitted"], [])

    def test_stateless_and_nothing_left(self):
        before = self.srv.ok("GET", "/v1/sessions")["sessions"]
        self.srv.ok("POST", "/v1/execute", {"code": "x = 1"})
        r = self.srv.ok("POST", "/v1/execute", {"code": "x"})
        self.assertEqual(r["error"]["name"], "NameError")
        self.assertEqual(self.srv.ok("GET", "/v1/sessions")["sessions"], before)
        r = self.srv.ok("POST", "/v1/execute", {"code": "echo $((6 * 7))", "language": "bash"})
        self.assertEqual(r["stdout"], "42\n")

    def test_timeout(self):
        r = self.srv.ok("POST", "/v1/execute", {"code": "while True: pass", "timeout_s": 0.5})
        self.assertStatus(r, "timeout")


# ---- sessions over time, and between each other ----

class Expiry(ServerCase):
    def test_idle_session_expires(self):
        sid = self.srv.create_session(idle_timeout_s=1)
        self.assertEqual(self.srv.ok("GET", path_of(sid))["idle_timeout_s"], 1)
        self.assertTrue(wait_until(lambda: self.srv.request("GET", path_of(sid)).status == 404))
        for method, route in ROUTES:
            if "ID" in route and method != "DELETE":
                r = self.srv.request(method, route.replace("ID", sid),
                                     {"code": "1"} if method == "POST" else b"x")
                self.assertError(r, 404, "expired", sid, "idle")
        # The server keeps sessions (docs/PERSISTENCE.md): an expired one can be resumed,
        # and DELETE removes what is stored of it; after that it is simply unknown.
        self.assertEqual(self.srv.ok("DELETE", path_of(sid))["deleted"], True)
        self.assertError(self.srv.request("DELETE", path_of(sid)), 404, "not_found", sid)
        self.assertNotIn(sid, [s["id"] for s in self.srv.ok("GET", "/v1/sessions")["sessions"]])
        self.assertTrue(re.search(r'msg="session expired" session=%s' % sid, self.srv.log()))

    def test_a_running_cell_is_not_idle(self):
        sid = self.session(idle_timeout_s=1)
        rec = self.srv.execute(sid, "import time\ntime.sleep(3)\nprint('lived')")
        self.assertStatus(rec, "ok")
        self.assertEqual(rec["stdout"], "lived\n")

    def test_each_use_restarts_the_idle_clock(self):
        sid = self.session(idle_timeout_s=30)
        info = self.srv.ok("GET", path_of(sid))
        self.srv.execute(sid, "1")
        later = self.srv.ok("GET", path_of(sid))
        self.assertGreaterEqual(later["expires_at"], info["expires_at"])
        self.assertGreaterEqual(later["last_used_at"], info["last_used_at"])


class Isolation(ServerCase):
    def test_two_sessions_see_nothing_of_each_other(self):
        a, b = self.session(), self.session()
        token = uuid.uuid4().hex
        # Popen returns when the exec begins, before the new program's command line is in
        # place (bash's, then sleep's): the cell waits until /proc shows the token, the state
        # the probes below look for.
        rec = self.srv.execute(a, "import subprocess, time\nsecret = 'a-only'\n"
                               "open('a-secret.txt', 'w').write('a')\n"
                               "p = subprocess.Popen(['bash', '-c', 'exec -a %s sleep 300'])\n"
                               "end = time.monotonic() + 60\n"
                               "while not open('/proc/%%d/cmdline' %% p.pid, 'rb').read()"
                               ".startswith(%r.encode()) and time.monotonic() < end:\n"
                               "    time.sleep(0.01)\n"
                               "print(p.pid)" % (token, token))
        self.assertStatus(rec, "ok")
        a_pid = int(rec["stdout"])
        self.srv.ok("PUT", path_of(a, "/files/uploaded-to-a"), b"a", status=201)

        find = ("import os\nfound = []\n"
                "for d in os.listdir('/proc'):\n"
                "    try:\n"
                "        if %r in open('/proc/%%s/cmdline' %% d).read(): found.append(d)\n"
                "    except OSError: pass\n"
                "print(found)" % token)
        self.assertNotEqual(self.srv.execute(a, find)["stdout"], "[]\n")  # the probe works
        self.assertEqual(self.srv.execute(b, find)["stdout"], "[]\n")
        rec = self.srv.execute(b, "import os, signal\n"
                               "try:\n    os.kill(%d, signal.SIGKILL)\n"
                               "except ProcessLookupError:\n    print('no such process')\n"
                               "print(sorted(os.listdir('.')))\n"
                               "secret" % a_pid)
        self.assertIn("[]", rec["stdout"])
        self.assertEqual(rec["error"]["name"], "NameError")
        self.assertEqual(file_names(self.srv, b), [])
        self.assertEqual(self.srv.request("GET", path_of(b, "/files/a-secret.txt")).status, 404)
        self.assertNotEqual(self.srv.execute(a, find)["stdout"], "[]\n")  # still alive in a
        self.assertEqual(sorted(file_names(self.srv, a)), ["a-secret.txt", "uploaded-to-a"])
        if is_root():
            # Distinct host uids own the two workspaces (defence in depth).
            rec_a = self.srv.execute(a, "import os\nprint(os.stat('.').st_dev)")
            rec_b = self.srv.execute(b, "import os\nprint(os.stat('.').st_dev)")
            self.assertNotEqual(rec_a["stdout"], rec_b["stdout"])
        self.srv.ok("DELETE", path_of(a))
        self.assertTrue(wait_until(lambda: not procs_with(token)), procs_with(token))


# ---- metrics and logs ----

class Observability(ServerCase):
    def test_metrics(self):
        before, _ = metrics(self.srv)
        sid = self.session()
        self.srv.execute(sid, "1")
        self.srv.execute(sid, "1/0")
        Stream(self.srv, sid, "print(1)").rest()
        after, r = metrics(self.srv)
        self.assertTrue(r.headers["Content-Type"].startswith("text/plain"))
        text = r.body.decode()
        for name, kind in (("runcell_sessions_live", "gauge"),
                           ("runcell_executions_total", "counter"),
                           ("runcell_execution_duration_seconds", "histogram"),
                           ("runcell_session_create_duration_seconds", "histogram"),
                           ("runcell_sandbox_failures_total", "counter")):
            self.assertIn("# TYPE %s %s\n" % (name, kind), text)
            self.assertIn("# HELP %s " % name, text)
        d = lambda k: after[k] - before.get(k, 0)  # noqa: E731
        self.assertEqual(d('runcell_executions_total{status="ok"}'), 2)
        self.assertEqual(d('runcell_executions_total{status="error"}'), 1)
        self.assertEqual(d("runcell_execution_duration_seconds_count"), 3)
        self.assertEqual(d('runcell_execution_duration_seconds_bucket{le="+Inf"}'), 3)
        self.assertGreater(d("runcell_execution_duration_seconds_sum"), 0)
        self.assertEqual(d("runcell_session_create_duration_seconds_count"), 1)
        self.assertEqual(after["runcell_sessions_live"],
                         len(self.srv.ok("GET", "/v1/sessions")["sessions"]))
        self.assertEqual(after["runcell_sandbox_failures_total"], 0)
        # Buckets are cumulative.
        buckets = [v for k, v in sorted(after.items()) if k.startswith(
            "runcell_execution_duration_seconds_bucket")]
        self.assertTrue(all(v <= after["runcell_execution_duration_seconds_count"]
                            for v in buckets))

    def test_one_log_line_per_request_without_secrets(self):
        marker = "code-marker-" + uuid.uuid4().hex
        sid = self.session()
        self.srv.execute(sid, "s = %r" % marker)
        self.srv.request("GET", "/v1/sessions", token="wrong-" + marker)
        self.srv.request("PUT", path_of(sid, "/files/" + marker), marker.encode())
        self.srv.request("GET", "/nothing")
        # Values from outside are quoted ("GET", "ID"); a field never given is -.
        line = re.compile(r'^\S+ level=info method="(\S+)" route=(\S+) status=(\d+) '
                          r'duration_ms=[\d.]+ session="?([^" ]+)"? client=127\.0\.0\.1')

        def seen():
            return [m.groups() for m in map(line.match, self.srv.log().splitlines()) if m]
        want = [("POST", "/v1/sessions", "201", sid),
                ("POST", "/v1/sessions/{id}/execute", "200", sid),
                ("PUT", "/v1/sessions/{id}/files/{path}", "201", sid),
                ("GET", "-", "404", "-")]

        def all_there():
            got = seen()
            return all(w in got for w in want) and any(g[2] == "401" for g in got)
        # A request's line is written by its own thread once its reply has gone out, so the
        # line of one request can come after the next request's: wait for every one.
        self.assertTrue(wait_until(all_there), "missing from %s: %s" % (
            seen(), [w for w in want if w not in seen()]))
        log = self.srv.log()
        self.assertNotIn(marker, log)
        self.assertNotIn(TOKEN, log)


# ---- shutdown ----

class Shutdown(RuncellTestCase):
    def assertNothingLeft(self, srv, tokens=()):
        self.assertEqual(run_dir_entries(srv.run_dir), [], "left in %s" % srv.run_dir)
        self.assertEqual(mounts_below(srv.run_dir), [])
        self.assertEqual(cgroups_of(srv.pid), [])
        for t in tokens:
            self.assertEqual(procs_with(t), [], "processes left")
        self.assertIn('msg="stopped"', srv.log())

    def test_running_cell_finishes_within_the_grace(self):
        token = uuid.uuid4().hex
        with Server("--shutdown-grace", "100") as srv:
            sid = srv.create_session()
            srv.create_session()  # an idle one, closed too
            srv.ok("PUT", path_of(sid, "/files/f"), b"x", status=201)
            srv.execute(sid, "import subprocess\n"
                        "subprocess.Popen(['bash', '-c', 'exec -a %s sleep 300'])" % token)
            st = Stream(srv, sid, "import time\nprint('up', flush=True)\ntime.sleep(1)\n"
                        "print('finished')")
            self.assertEqual(st.next()["data"], "up\n")
            srv.proc.send_signal(signal.SIGTERM)
            self.assertTrue(wait_until(lambda: "shutting down" in srv.log()))
            # New connections are refused (or told 503) while the cell finishes.
            try:
                r = srv.request("GET", "/healthz", timeout=10)
                self.assertEqual(r.status, 503)
            except OSError:
                pass
            events = st.rest()
            self.assertEqual(events[0]["data"], "finished\n")
            self.assertStatus(events[-1]["record"], "ok")
            self.assertEqual(srv.proc.wait(HANG), 0)
            self.assertNothingLeft(srv, [token])

    def test_cells_past_the_grace_are_interrupted(self):
        with Server("--shutdown-grace", "0.5") as srv:
            sid = srv.create_session()
            st = Stream(srv, sid, "import time\nprint('up', flush=True)\n"
                        "while True: time.sleep(0.05)")
            self.assertEqual(st.next()["data"], "up\n")
            result = {}
            marker = "oneshot-running-" + uuid.uuid4().hex
            oneshot = threading.Thread(target=lambda: result.update(r=srv.request(
                "POST", "/v1/execute", {"code": "f = open(%r, 'w')\n"
                                                "import time\ntime.sleep(300)" % marker})))
            oneshot.start()
            # The one-shot holds its slot while its sandbox starts; what is interrupted is a
            # cell, so wait until its code runs: a host process holds the file it opened.
            self.assertTrue(wait_until(lambda: process_holds_file(marker)))
            self.assertEqual(metrics(srv)[0]["runcell_executions_running"], 2)
            self.assertEqual(srv.stop(signal.SIGTERM), 0)
            rec = st.rest()[-1]["record"]
            self.assertEqual(rec["error"]["name"], "KeyboardInterrupt")
            oneshot.join(HANG)
            self.assertEqual(result["r"].status, 200, result)
            self.assertEqual(result["r"].json()["error"]["name"], "KeyboardInterrupt")
            self.assertIn("grace period over", srv.log())
            self.assertNothingLeft(srv)

    def test_a_cell_that_ignores_the_interrupt_is_killed_with_a_record(self):
        # Interrupt first, kill after the interrupt grace, as for a timeout: the stream
        # still ends with the cell's record, not with a connection cut.
        with Server("--shutdown-grace", "0.2") as srv:
            sid = srv.create_session()
            st = Stream(srv, sid, "import time\nprint('up', flush=True)\nwhile True:\n"
                        "    try:\n        time.sleep(0.05)\n"
                        "    except KeyboardInterrupt:\n        pass")
            self.assertEqual(st.next()["data"], "up\n")
            self.assertEqual(srv.stop(signal.SIGTERM), 0)
            rec = st.rest()[-1]["record"]
            self.assertEqual((rec["status"], rec["state"]), ("killed", "lost"), rec)
            self.assertIn("killing the cells that did not stop", srv.log())
            self.assertNothingLeft(srv)

    def test_a_one_shot_not_yet_running_is_interrupted_too(self):
        # The grace ends while the one-shot starts its sandbox or compiles its cell: the
        # interrupt waits for the cell instead of being lost (the final wait once cut the
        # run off, and the client got no reply).
        with Server("--shutdown-grace", "0.001") as srv:
            result = {}
            code = "y = 0\n" * 20000 + "import time\ntime.sleep(300)"
            oneshot = threading.Thread(target=lambda: result.update(r=srv.request(
                "POST", "/v1/execute", {"code": code})))
            oneshot.start()
            self.assertTrue(wait_until(
                lambda: metrics(srv)[0]["runcell_executions_running"] == 1))
            self.assertEqual(srv.stop(signal.SIGTERM), 0)
            oneshot.join(HANG)
            self.assertEqual(result["r"].status, 200, "%s\n%s" % (result, srv.log()))
            rec = result["r"].json()
            # Interrupted as its cell starts; or, when the start and the interrupt took longer
            # than the interrupt grace (a loaded machine), killed: a record either way.
            if rec["status"] == "killed":
                self.assertIn("killing the cells that did not stop", srv.log())
            else:
                self.assertEqual(rec["status"], "error", rec)
                self.assertEqual(rec["error"]["name"], "KeyboardInterrupt", rec)
            self.assertNothingLeft(srv)

    def test_sigint_too(self):
        with Server() as srv:
            sid = srv.create_session()
            srv.execute(sid, "open('f', 'w').write('x')")
            self.assertEqual(srv.stop(signal.SIGINT), 0)
            self.assertIn("received SIGINT", srv.log())
            self.assertNothingLeft(srv)

    def test_no_route_served_while_stopping(self):
        with Server("--shutdown-grace", "100") as srv:
            sid = srv.create_session()
            conn = srv.connection()  # a kept-alive connection survives the listener
            conn.request("GET", "/healthz")
            conn.getresponse().read()
            st = Stream(srv, sid, "print('up', flush=True)\n" + WAIT_FOR_GO)
            st.next()
            srv.proc.send_signal(signal.SIGTERM)
            self.assertTrue(wait_until(lambda: "shutting down" in srv.log()))
            conn.request("POST", "/v1/sessions", body="{}", headers=srv.headers())
            r = conn.getresponse()
            self.assertEqual(r.status, 503)
            self.assertEqual(json.loads(r.read())["error"]["code"], "shutting_down")
            conn.request("GET", "/healthz")
            r = conn.getresponse()
            self.assertEqual((r.status, json.loads(r.read())["status"]), (503, "shutting_down"))
            conn.close()
            st.hang_up()  # the cell is interrupted; the server can finish
            self.assertEqual(srv.proc.wait(HANG), 0)
            self.assertNothingLeft(srv)


if __name__ == "__main__":
    unittest.main()


def server_connections(port):
    """How many connections to the server on port it still holds open (ESTABLISHED, or
    CLOSE_WAIT: the client has closed, the server not yet), from /proc/net/tcp."""
    n = 0
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if int(local.split(":")[1], 16) == port and state in ("01", "08"):
                n += 1
    return n


def half_open(port, n, source="127.0.0.1"):
    """n connections that start a request head and never finish it, as a client without
    the token would to hold the server's connections."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind((source, 0))
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /v1/sessions HTTP/1.1\r\nHost: x\r\n")
        socks.append(s)
    return socks


def is_closed(s):
    """Whether the server has closed s (without waiting)."""
    try:
        return s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def keep_alive_request(s, path, token=TOKEN):
    """One request on s, which stays open; returns the status. Reads exactly the answer."""
    s.sendall(("GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n"
               % (path, token)).encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            raise ConnectionError("closed before an answer: %r" % data)
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(re.search(rb"(?im)^content-length: *(\d+)", head).group(1))
    while len(body) < length:
        body += s.recv(4096)
    return int(head.split()[1])


class ConnectionCaps(RuncellTestCase):
    """Connections that never show the token cannot hold the server: a short header
    timeout, a cap on unauthenticated connections that closes the oldest to make room, and
    a cap per client address."""

    def setUp(self):
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < 4096 <= hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (4096, hard))
        elif soft < 4096:
            self.skipTest("the test needs 4096 open files; the hard limit is %d" % hard)

    def test_half_open_connections_do_not_lock_out_authenticated_clients(self):
        with Server() as srv:
            flood = half_open(srv.port, 1100)  # more than the server's 1024 connections
            try:
                # A client with the token, from the same address, is answered at once...
                r = srv.request("GET", "/v1/sessions", timeout=HANG)
                self.assertEqual(r.status, 200)
                # ...because the flood holds at most 128 connections (an eighth of 1024).
                deadline = time.monotonic() + HANG
                while sum(not is_closed(s) for s in flood) > 128:
                    self.assertLess(time.monotonic(), deadline, "the flood is still open")
                    poll = select.poll()
                    for s in flood:
                        poll.register(s, select.POLLIN)
                    poll.poll(1000)
                self.assertEqual(srv.request("GET", "/healthz").status, 200)
                m, _ = metrics(srv)
                self.assertGreater(m["runcell_http_connections_evicted_total"], 0)
            finally:
                for s in flood:
                    s.close()

    def test_a_head_that_never_ends_is_closed_after_the_header_timeout(self):
        with Server("--header-timeout", "1") as srv:
            [stranger] = half_open(srv.port, 1)
            wrong = socket.create_connection(("127.0.0.1", srv.port))
            known = socket.create_connection(("127.0.0.1", srv.port))
            try:
                self.assertEqual(keep_alive_request(wrong, "/v1/sessions", token="wrong"), 401)
                self.assertEqual(keep_alive_request(known, "/v1/sessions"), 200)
                for s in (stranger, wrong):  # a 401 does not lift the header timeout
                    s.settimeout(HANG)
                    try:
                        self.assertEqual(s.recv(4096), b"")
                    except ConnectionResetError:
                        pass
                # The connection that showed the token has the idle timeout of before.
                time.sleep(3)
                self.assertFalse(is_closed(known))
                self.assertEqual(keep_alive_request(known, "/v1/sessions"), 200)
            finally:
                for s in (stranger, wrong, known):
                    s.close()

    def test_one_address_cannot_take_every_connection(self):
        with Server("--max-connections", "16", "--max-connections-per-peer", "4") as srv:
            # The connection that found the server ready counts against the cap until the
            # server has closed its end: wait for that, or the fourth would be the fifth.
            self.assertTrue(wait_until(lambda: server_connections(srv.port) == 0))
            held = []
            try:
                for _ in range(4):  # one by one: strangers past two close the oldest
                    held.append(socket.create_connection(("127.0.0.1", srv.port)))
                    self.assertEqual(keep_alive_request(held[-1], "/v1/sessions"), 200)
                # A fifth from 127.0.0.1 is closed unanswered...
                [fifth] = half_open(srv.port, 1)
                fifth.settimeout(HANG)
                try:
                    self.assertEqual(fifth.recv(4096), b"")
                except ConnectionResetError:
                    pass
                fifth.close()
                # ...while another address is served.
                other = socket.socket()
                other.bind(("127.0.0.2", 0))
                other.settimeout(HANG)
                other.connect(("127.0.0.1", srv.port))
                self.assertEqual(keep_alive_request(other, "/v1/sessions"), 200)
                other.close()
            finally:
                for s in held:
                    s.close()

    def test_caps_that_do_not_fit_are_usage_errors(self):
        for args, needle in ((["--max-connections", "8", "--max-unauthenticated", "9"],
                              "--max-unauthenticated (9) is more than --max-connections (8)"),
                             (["--max-connections-per-peer", "2000"],
                              "--max-connections-per-peer (2000) is more than"),
                             (["--header-timeout", "301"], "at most 300"),
                             (["--max-connections", "0"], "positive whole number")):
            p = subprocess.run([RUNCELL, "serve", "--data", "/nonexistent/x"] + args,
                               capture_output=True, text=True, timeout=HANG)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn(needle, p.stderr)
