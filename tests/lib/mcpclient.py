"""mcpclient - a small scripted MCP client for runcell's tests (stdlib only).

StdioClient runs `runcell mcp` and speaks newline-delimited JSON-RPC on its stdin/stdout;
HttpClient speaks Streamable HTTP to /mcp of a `runcell serve`. Both offer the same calls:

    c.initialize(version)                 -> the initialize result
    c.request(method, params)             -> the whole response message
    c.call_tool(name, args, progress=...) -> the response; notifications land in c.notifications
    c.notify(method, params)

A client made with modern=True speaks revision 2026-07-28: no initialize, and every request
carries _meta with the version and c.capabilities (over HTTP also the MCP-Protocol-Version,
Mcp-Method and Mcp-Name headers). Every message a client receives is validated against the
official JSON schema of the revision it speaks (mcpschema); c.schema_errors lists what did
not fit, and a request whose answer does not fit fails.
"""
import http.client
import json
import os
import queue
import subprocess
import threading
import time

import mcpschema

TIMEOUT = 120  # anti-hang: no single exchange takes longer
MODERN = "2026-07-28"
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPS = "io.modelcontextprotocol/clientCapabilities"
META_CLIENT = "io.modelcontextprotocol/clientInfo"
TASKS = "io.modelcontextprotocol/tasks"


class McpError(AssertionError):
    pass


class _Base:
    def __init__(self, modern=False):
        self.next_id = 1
        self.notifications = []
        self.version = None
        self.modern = modern
        self.capabilities = {}  # modern: sent as clientCapabilities with every request
        self.pending = {}       # request id -> method, for validating the responses
        self.schema_errors = []

    def new_id(self):
        self.next_id += 1
        return self.next_id

    def meta(self, extra=None):
        m = {META_VERSION: MODERN, META_CAPS: self.capabilities,
             META_CLIENT: {"name": "runcell-tests", "version": "1"}}
        m.update(extra or {})
        return m

    def with_meta(self, method, params):
        """params with the modern era's _meta added (for requests of a modern client)."""
        if not self.modern or method.startswith("notifications/"):
            return params
        params = dict(params or {})
        params["_meta"] = self.meta(params.get("_meta"))
        return params

    def revision(self):
        return MODERN if self.modern else (self.version or "2025-11-25")

    def validate(self, msg):
        """Checks a received message against its revision's schema; raises on a misfit."""
        method, revision = None, self.revision()
        if isinstance(msg, dict) and "method" not in msg:
            method, revision = self.pending.pop(msg.get("id"), (None, revision))
            if method == "initialize" and "result" in msg:
                self.version = msg["result"].get("protocolVersion", self.version)
                revision = self.version
        try:
            mcpschema.check(revision, msg, method)
        except mcpschema.SchemaError as e:
            self.schema_errors.append(str(e))
            raise McpError(str(e))

    def initialize(self, version="2025-11-25", notify=True):
        resp = self.request("initialize", {
            "protocolVersion": version, "capabilities": {},
            "clientInfo": {"name": "runcell-tests", "version": "1"}})
        if "result" not in resp:
            raise McpError("initialize failed: %s" % resp)
        self.version = resp["result"]["protocolVersion"]
        if notify:
            self.notify("notifications/initialized")
        return resp["result"]

    def call_tool(self, name, args=None, progress_token=None, **kw):
        params = {"name": name, "arguments": args or {}}
        if progress_token is not None:
            params["_meta"] = {"progressToken": progress_token}
        return self.request("tools/call", params, **kw)

    def new_session(self):
        """modern: a new session's id (the handle the tools take)."""
        return self.tool_result("create_session")["structuredContent"]["session_id"]

    def tool_result(self, name, args=None, **kw):
        """Calls a tool and returns its result, failing on a JSON-RPC error."""
        resp = self.call_tool(name, args, **kw)
        if "result" not in resp:
            raise McpError("%s failed: %s" % (name, resp))
        return resp["result"]


def texts(result):
    """The text items of a tool result, joined, but the last part of a run's result that only
    names its session and cell ("[runcell] session ...")."""
    return "\n".join(c["text"] for c in result["content"] if c["type"] == "text" and
                     not c["text"].startswith("[runcell] session "))


class StdioClient(_Base):
    def __init__(self, runcell, *args, env=None, modern=False):
        super().__init__(modern)
        e = dict(os.environ)
        e.update(env or {})
        self.proc = subprocess.Popen([runcell, "mcp", *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e)
        self.messages = queue.Queue()
        self.bad_lines = []  # stdout lines that were not JSON-RPC messages
        self.stderr = b""
        self.readers = [threading.Thread(target=self._read_stdout, daemon=True),
                        threading.Thread(target=self._read_stderr, daemon=True)]
        for t in self.readers:
            t.start()

    def _read_stdout(self):
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
                if not isinstance(msg, (dict, list)) or not line.endswith(b"\n"):
                    raise ValueError
                self.messages.put(msg)
            except ValueError:
                self.bad_lines.append(line)
        self.messages.put(None)

    def _read_stderr(self):
        for chunk in iter(lambda: self.proc.stderr.read1(65536), b""):
            self.stderr += chunk

    def send_raw(self, data):
        self.proc.stdin.write(data if isinstance(data, bytes) else data.encode())
        self.proc.stdin.flush()

    def send(self, msg):
        self.send_raw(json.dumps(msg) + "\n")

    def notify(self, method, params=None):
        msg = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)

    def next_message(self, timeout=TIMEOUT):
        try:
            msg = self.messages.get(timeout=timeout)
        except queue.Empty:
            raise McpError("no message within %s s; stderr: %s" % (timeout, self.stderr[-2000:]))
        if msg is None:
            raise McpError("runcell mcp closed stdout; stderr: %s" % self.stderr[-2000:])
        self.validate(msg)
        return msg

    def wait_for(self, pred, timeout=TIMEOUT):
        """Reads messages until pred(msg); notifications on the way are kept."""
        deadline = time.time() + timeout
        while True:
            msg = self.next_message(max(0.1, deadline - time.time()))
            if isinstance(msg, dict) and "method" in msg and "id" not in msg:
                self.notifications.append(msg)
            if pred(msg):
                return msg
            if time.time() > deadline:
                raise McpError("timed out waiting")

    def response_to(self, rid, timeout=TIMEOUT):
        return self.wait_for(lambda m: isinstance(m, dict) and m.get("id") == rid and
                             "method" not in m, timeout)

    def request(self, method, params=None, rid=None, timeout=TIMEOUT, meta=True, revision=None,
                headers=None):
        """revision: the one to validate the answer against (default: the client's); headers
        are HTTP's, and stdio has none."""
        rid = self.new_id() if rid is None else rid
        msg = {"jsonrpc": "2.0", "id": rid, "method": method}
        params = self.with_meta(method, params) if meta else params
        if params is not None:
            msg["params"] = params
        self.pending[rid] = (method, revision or self.revision())
        self.send(msg)
        return self.response_to(rid, timeout)

    def pipeline(self, calls, timeout=TIMEOUT):
        """Writes tools/call requests for calls [(name, args), ...] to stdin at once, in one
        write, then reads until every one has its response. Returns the responses in the
        order of calls and the ids in the order their responses came."""
        ids = [self.new_id() for _ in calls]
        for rid in ids:
            self.pending[rid] = ("tools/call", self.revision())
        data = "".join(json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                                   "params": self.with_meta("tools/call", {
                                       "name": name, "arguments": args})}) + "\n"
                       for rid, (name, args) in zip(ids, calls))
        self.send_raw(data)
        got, order = {}, []

        def done(m):
            if isinstance(m, dict) and m.get("id") in ids and "method" not in m:
                got[m["id"]] = m
                order.append(m["id"])
            return len(got) == len(ids)
        self.wait_for(done, timeout)
        return [got[rid] for rid in ids], [ids.index(rid) for rid in order]

    def close(self, timeout=TIMEOUT):
        """Closes stdin and waits for the exit; returns the exit status."""
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            return self.proc.wait(timeout)
        finally:
            self.kill()

    def kill(self):
        """Ends the process if it still runs and releases its pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for t in self.readers:
            t.join(TIMEOUT)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except BrokenPipeError:
                pass


class HttpResponse:
    def __init__(self, status, headers, body, messages):
        self.status = status
        self.headers = headers
        self.body = body
        self.messages = messages  # JSON-RPC messages, from a JSON body or SSE events

    def header(self, name):
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return None


def parse_sse(data):
    """The data of each SSE event as JSON; comments and empty events are skipped."""
    out = []
    for event in data.replace("\r\n", "\n").split("\n\n"):
        lines = [l[5:].lstrip() for l in event.split("\n") if l.startswith("data:")]
        if lines and "".join(lines):
            out.append(json.loads("\n".join(lines)))
    return out


class HttpClient(_Base):
    def __init__(self, port, token, path="/mcp", accept="application/json, text/event-stream",
                 modern=False):
        super().__init__(modern)
        self.port = port
        self.token = token
        self.path = path
        self.accept = accept
        self.session = None

    def headers(self, extra=None):
        h = {"Content-Type": "application/json", "Accept": self.accept}
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        if self.session:
            h["Mcp-Session-Id"] = self.session
        if self.version or self.modern:
            h["MCP-Protocol-Version"] = MODERN if self.modern else self.version
        h.update(extra or {})
        return {k: v for k, v in h.items() if v is not None}

    def http(self, method, body=None, headers=None, timeout=TIMEOUT, on_event=None):
        """One HTTP exchange; an SSE body is read event by event (on_event sees each)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, (bytes, type(None))) else (
            body.encode() if isinstance(body, str) else json.dumps(body).encode())
        conn.request(method, self.path, body=data, headers=self.headers(headers))
        resp = conn.getresponse()
        ctype = resp.getheader("Content-Type") or ""
        messages = []
        if ctype.startswith("text/event-stream"):
            raw = b""
            buf = b""
            while True:
                chunk = resp.read1(65536)
                if not chunk:
                    break
                raw += chunk
                buf += chunk
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    for msg in parse_sse(event.decode() + "\n\n"):
                        messages.append(msg)
                        if on_event:
                            on_event(msg)
            text = raw.decode()
        else:
            text = resp.read().decode()
            if ctype.startswith("application/json") and text:
                messages.append(json.loads(text))
        conn.close()
        return HttpResponse(resp.status, resp.getheaders(), text, messages)

    def notify(self, method, params=None):
        msg = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        r = self.http("POST", msg)
        if r.status != 202:
            raise McpError("notification got HTTP %d: %s" % (r.status, r.body))

    def modern_headers(self, method, params):
        """The request metadata headers of revision 2026-07-28."""
        h = {"Mcp-Method": method}
        name = (params or {}).get("taskId" if method.startswith("tasks/") else "name")
        if isinstance(name, str):
            h["Mcp-Name"] = name
        return h

    def request(self, method, params=None, rid=None, timeout=TIMEOUT, on_event=None,
                headers=None, meta=True):
        rid = self.new_id() if rid is None else rid
        msg = {"jsonrpc": "2.0", "id": rid, "method": method}
        params = self.with_meta(method, params) if meta else params
        if params is not None:
            msg["params"] = params
        h = self.modern_headers(method, params) if self.modern else {}
        h.update(headers or {})
        self.pending[rid] = (method, self.revision())
        r = self.http("POST", msg, timeout=timeout, on_event=on_event, headers=h)
        for m in r.messages:
            self.validate(m)
        if method == "initialize" and r.header("Mcp-Session-Id"):
            self.session = r.header("Mcp-Session-Id")
        for m in r.messages:
            if "method" in m and "id" not in m:
                self.notifications.append(m)
        responses = [m for m in r.messages if m.get("id") == rid and "method" not in m]
        if len(responses) != 1:
            raise McpError("HTTP %d: expected one response to %s, got: %s" %
                           (r.status, rid, r.body[:2000]))
        self.last_http = r
        return responses[0]

    def delete(self):
        return self.http("DELETE")
