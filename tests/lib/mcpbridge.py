"""mcpbridge - puts runcell's MCP server behind a plain Streamable HTTP URL on 127.0.0.1, for
clients that take nothing but a URL (the official conformance suite):

    AuthProxy(upstream, token)   forwards every request to `runcell serve`'s /mcp as it came
                                 (Host and Origin included) with the bearer token added
    StdioBridge(runcell)         serves Streamable HTTP in front of `runcell mcp`: initialize
                                 starts a process of its own for the new Mcp-Session-Id, each
                                 message goes to its stdin as one line, and what comes back on
                                 stdout (progress, then the response) is the answer, as SSE
                                 or JSON; a request of protocol 2026-07-28 (no session) goes
                                 to one process shared by all. Nothing is rewritten.

Both are context managers (stdlib only).
"""
import http.client
import json
import queue
import subprocess
import threading
import uuid
from http.server import BaseHTTPRequestHandler

from rctest import LocalHttpServer

HOP = {"connection", "transfer-encoding", "keep-alive", "content-length"}
TIMEOUT = 600


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def reply(self, status, body=b"", ctype="application/json", headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        if body:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class AuthProxy(LocalHttpServer):
    def __init__(self, upstream_port, token):
        class Handler(_Handler):
            def forward(self):
                data = self.body()
                conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=TIMEOUT)
                conn.putrequest(self.command, self.path, skip_host=True,
                                skip_accept_encoding=True)
                for k, v in self.headers.items():
                    if k.lower() not in HOP:
                        conn.putheader(k, v)
                if not self.headers.get("Authorization"):
                    conn.putheader("Authorization", "Bearer " + token)
                conn.putheader("Content-Length", str(len(data)))
                conn.endheaders(data)
                resp = conn.getresponse()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP:
                        self.send_header(k, v)
                self.send_header("Connection", "close")
                self.end_headers()
                try:
                    while True:  # streams SSE as it comes
                        chunk = resp.read1(65536)
                        if not chunk:
                            break
                        self.wfile.write(chunk)
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError, http.client.IncompleteRead):
                    pass  # one side left: the other goes too
                conn.close()
                self.close_connection = True

            do_GET = do_POST = do_DELETE = do_PUT = do_OPTIONS = forward

        super().__init__(Handler)
        self.url = "http://127.0.0.1:%d/mcp" % self.port


class _Child:
    """One `runcell mcp` and the requests waiting for its answers."""

    def __init__(self, argv):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)
        self.lock = threading.Lock()
        self.waiting = {}  # request id (as JSON) -> queue of messages for it
        self.tokens = {}   # progress token (as JSON) -> request id (as JSON)
        threading.Thread(target=self.read, daemon=True).start()

    def read(self):
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                if "method" in msg:
                    key = self.tokens.get(json.dumps(
                        msg.get("params", {}).get("progressToken")))
                else:
                    key = json.dumps(msg.get("id"))
                q = self.waiting.get(key)
            if q:
                q.put(msg)
        with self.lock:
            for q in self.waiting.values():
                q.put(None)

    def send(self, msg):
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()

    def request(self, msg):
        """A queue that gets the request's notifications, then its response (None: the
        process ended)."""
        q = queue.Queue()
        key = json.dumps(msg["id"])
        token = (msg.get("params") or {}).get("_meta", {}).get("progressToken")
        with self.lock:
            self.waiting[key] = q
            if token is not None:
                self.tokens[json.dumps(token)] = key
        self.send(msg)
        return q

    def done(self, msg):
        with self.lock:
            self.waiting.pop(json.dumps(msg["id"]), None)

    def close(self):
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class StdioBridge(LocalHttpServer):
    def __init__(self, runcell, *args):
        argv = [runcell, "mcp", *args]
        sessions = {}
        shared = []
        lock = threading.Lock()

        class Handler(_Handler):
            def do_GET(self):
                self.reply(405, b"", headers=[("Allow", "POST, DELETE")])

            def do_DELETE(self):
                with lock:
                    child = sessions.pop(self.headers.get("Mcp-Session-Id"), None)
                if child:
                    child.close()
                self.reply(204 if child else 404)

            def do_POST(self):
                try:
                    msg = json.loads(self.body())
                except ValueError:
                    return self.reply(400, b'{"jsonrpc":"2.0","error":{"code":-32700,'
                                      b'"message":"Parse error"}}')
                sid = self.headers.get("Mcp-Session-Id")
                new = None
                modern = "io.modelcontextprotocol/protocolVersion" in (
                    (msg.get("params") or {}).get("_meta") or {})
                with lock:
                    if msg.get("method") == "initialize" and not sid:
                        sid, new = uuid.uuid4().hex, _Child(argv)
                        sessions[sid] = child = new
                    elif modern and not sid:
                        if not shared:
                            shared.append(_Child(argv))
                        child = shared[0]
                    else:
                        child = sessions.get(sid)
                if not child:
                    return self.reply(404, b'{"jsonrpc":"2.0","error":{"code":-32600,'
                                      b'"message":"no such MCP session"}}')
                if "id" not in msg:  # a notification
                    child.send(msg)
                    return self.reply(202)
                q = child.request(msg)
                headers = [("Mcp-Session-Id", sid)] if new else []
                sse = "text/event-stream" in (self.headers.get("Accept") or "")
                try:
                    self.answer(q, sse, headers)
                finally:
                    child.done(msg)

            def answer(self, q, sse, headers):
                if not sse:
                    while True:
                        m = q.get(timeout=TIMEOUT)
                        if m is None or "method" not in m:
                            break
                    body = json.dumps(m).encode() if m else b""
                    return self.reply(200 if m else 502, body, headers=headers)
                self.send_response(200)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                while True:
                    m = q.get(timeout=TIMEOUT)
                    if m is None:
                        break
                    self.wfile.write(b"event: message\ndata: " + json.dumps(m).encode() +
                                     b"\n\n")
                    self.wfile.flush()
                    if "method" not in m:
                        break
                self.close_connection = True

        super().__init__(Handler)
        self.sessions = sessions
        self.shared = shared
        self.url = "http://127.0.0.1:%d/mcp" % self.port

    def __exit__(self, *exc):
        super().__exit__(*exc)
        for child in list(self.sessions.values()) + self.shared:
            child.close()
