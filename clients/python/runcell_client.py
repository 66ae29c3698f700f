r"""runcell_client - a client for runcell's HTTP API (docs/API.md), standard library only.

Drop this one file into a project; it needs Python 3.8 or later and nothing else. With
RUNCELL_URL and RUNCELL_TOKEN set (see README.md beside this file), this runs as it is:

    from runcell_client import Session

    with Session() as s:                # or Session("http://HOST:8080", token="...")
        rec = s.run("x = 6 * 7\nx")
        print(rec["status"], rec["results"][0]["text/plain"])            # ok 42
        s.run("for i in range(3): print(i)", on_stdout=lambda text: print(text, end=""))
        s.upload("data/in.csv", b"a,b\n1,2\n")
        s.run("import pandas as pd\npd.read_csv('data/in.csv').to_csv('out.csv', index=False)")
        print(s.download("out.csv"))                                     # b'a,b\n1,2\n'

Every call returns the server's JSON as plain dicts and lists (the result record is
described in docs/API.md). Errors from the server raise RuncellError, which carries the
HTTP status, the error code ("not_found", "busy", "bad_path", ...) and the message.

Sessions and Clients may be shared between threads: each request takes a connection of
its own from a small pool of kept-alive ones.
"""
import base64
import http.client
import json
import os
import threading
import urllib.parse

__all__ = ["Client", "Session", "RuncellError", "decode_outputs"]

DEFAULT_URL = "http://127.0.0.1:8080"
_CHUNK = 1 << 16


class RuncellError(Exception):
    """An error reply of the server (or a transport failure, with status 0)."""

    def __init__(self, status, code, message):
        super().__init__("%s (HTTP %d %s)" % (message, status, code))
        self.status, self.code, self.message = status, code, message


def _error_of(status, body):
    try:
        err = json.loads(body)["error"]
        return RuncellError(status, err["code"], err["message"])
    except (ValueError, KeyError, TypeError):
        text = body.decode("utf-8", "replace").strip()[:500]
        return RuncellError(status, "http_%d" % status, text or "HTTP %d" % status)


def decode_outputs(record):
    """The files a one-shot run created or modified, as {path: bytes}."""
    return {name: base64.b64decode(b64) for name, b64 in record.get("outputs", {}).items()}


class Client:
    """A runcell server: sessions, one-shot runs, health.

    url: "http://HOST:PORT" (default RUNCELL_URL, then http://127.0.0.1:8080); token: the
    API token (default RUNCELL_TOKEN); timeout: seconds a single request may take on the
    wire, beyond the execution's own timeout.
    """

    def __init__(self, url=None, token=None, timeout=300.0):
        url = url or os.environ.get("RUNCELL_URL") or DEFAULT_URL
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError("url must look like http://HOST:PORT, not %r" % url)
        self._https = u.scheme == "https"
        self._host, self._port = u.hostname, u.port
        self._prefix = u.path.rstrip("/")
        self.token = token if token is not None else os.environ.get("RUNCELL_TOKEN", "")
        self.timeout = timeout
        self._idle = []
        self._lock = threading.Lock()

    # ---- transport ----

    def _connect(self):
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return cls(self._host, self._port, timeout=self.timeout)

    def _take(self):
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return self._connect(), False

    def _give(self, conn):
        with self._lock:
            if len(self._idle) < 8:
                self._idle.append(conn)
                return
        conn.close()

    def _headers(self, extra):
        h = {"Authorization": "Bearer " + self.token} if self.token else {}
        h.update(extra or {})
        return h

    def _send(self, method, path, body=None, headers=None):
        """Sends a request and returns (connection, response) with the body unread. A kept-
        alive connection that the server has closed meanwhile is replaced once."""
        url = self._prefix + path
        while True:
            conn, reused = self._take()
            try:
                conn.request(method, url, body=body, headers=self._headers(headers))
                return conn, conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                # The server may have refused a large body (413) and hung up while it was
                # still being sent: its reply is then waiting to be read.
                early = _early_reply(conn) if isinstance(e, BrokenPipeError) else None
                if early is not None:
                    return conn, early
                conn.close()
                # A kept-alive connection the server had closed: try once more on a new one,
                # when the body can be sent again.
                if reused and (body is None or isinstance(body, (bytes, str))):
                    continue
                raise RuncellError(0, "connection", "%s %s: %s" % (method, path, e)) from e
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                raise RuncellError(0, "connection", "%s %s: %s" % (method, path, e)) from e

    def _finish(self, conn, resp):
        if resp.will_close:
            conn.close()
        else:
            self._give(conn)

    def request(self, method, path, body=None, headers=None, raw=False):
        """One request; body: a dict (sent as JSON), bytes, or a binary file object. Returns
        the decoded JSON reply (the bytes when raw); raises RuncellError."""
        if isinstance(body, dict):
            body = json.dumps(body).encode()
            headers = dict(headers or {}, **{"Content-Type": "application/json"})
        conn, resp = self._send(method, path, body, headers)
        try:
            data = resp.read()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise RuncellError(0, "connection", "%s %s: %s" % (method, path, e)) from e
        self._finish(conn, resp)
        if resp.status >= 400:
            raise _error_of(resp.status, data)
        return data if raw else json.loads(data)

    def close(self):
        """Closes the kept-alive connections (sessions stay open on the server)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()

    # ---- the API ----

    def health(self):
        return self.request("GET", "/healthz")

    def metrics(self):
        """The Prometheus text of GET /metrics."""
        return self.request("GET", "/metrics", raw=True).decode()

    def sessions(self):
        """Every live session's description."""
        return self.request("GET", "/v1/sessions")["sessions"]

    def session(self, **opts):
        """Creates a session (see Session for the options) on this client's server."""
        return Session(client=self, **opts)

    def execute(self, code, files=None, language=None, timeout=None, **limits):
        """A one-shot run in a fresh sandbox, nothing kept. files: {path: bytes or str} put
        in the workspace first; limits: memory_mb, pids, disk_mb, cpus. Returns the record,
        with "outputs" ({path: base64}, see decode_outputs) for created and modified files."""
        body = {"code": code}
        if files:
            body["files"] = {name: base64.b64encode(
                data.encode() if isinstance(data, str) else data).decode()
                for name, data in files.items()}
        if language:
            body["language"] = language
        if timeout is not None:
            body["timeout_s"] = timeout
        body.update(limits)
        return self.request("POST", "/v1/execute", body)


def _quote_path(path):
    return urllib.parse.quote(path, safe="/")


class Session:
    """A stateful sandboxed interpreter on the server: variables, files and installed
    packages persist between run() calls until close() (or the idle timeout).

    Session(url, token, language="python", timeout=..., idle_timeout=..., memory_mb=...,
    pids=..., disk_mb=..., cpus=...) creates one; Session(url, token, id=ID) attaches to an
    existing one; Session(client=c, ...) uses an existing Client. Use it as a context manager
    to close it at the end.
    """

    def __init__(self, url=None, token=None, *, client=None, id=None, language=None,
                 timeout=None, idle_timeout=None, **limits):
        self._own_client = client is None
        self.client = client or Client(url, token)
        try:
            self._open(id, language, timeout, idle_timeout, limits)
        except BaseException:
            if self._own_client:
                self.client.close()
            raise

    def _open(self, id, language, timeout, idle_timeout, limits):
        if id is not None:
            self.id = id
            self.info()  # fails now if there is no such session
            return
        body = dict(limits)
        if language:
            body["language"] = language
        if timeout is not None:
            body["timeout_s"] = timeout
        if idle_timeout is not None:
            body["idle_timeout_s"] = idle_timeout
        self.id = self.client.request("POST", "/v1/sessions", body)["id"]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "<runcell Session %s>" % self.id

    def _path(self, rest=""):
        return "/v1/sessions/%s%s" % (self.id, rest)

    def info(self):
        """The session's description: status, limits, execution count, expiry."""
        return self.client.request("GET", self._path())

    def run(self, code, timeout=None, language=None, on_stdout=None, on_stderr=None,
            on_result=None, on_error=None, idempotency_key=None):
        """Runs one cell and returns its result record (a dict: status, stdout, stderr,
        results, error, files, state, usage, ...). With any on_* callback the output is
        streamed: on_stdout(text) and on_stderr(text) are called with each chunk while the
        cell runs, on_result(bundle) with each MIME bundle, on_error(error) with the
        exception. A failed cell is not an exception: look at record["status"].
        idempotency_key: a string of your choosing; run() again with the same key (after a
        lost connection, say) gives the first run's record and never runs the cell twice."""
        body = {"code": code}
        if timeout is not None:
            body["timeout_s"] = timeout
        if language:
            body["language"] = language
        key = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        if not (on_stdout or on_stderr or on_result or on_error):
            return self.client.request("POST", self._path("/execute"), body, headers=key)
        callbacks = {"stdout": on_stdout, "stderr": on_stderr, "result": on_result,
                     "error": on_error}
        return self._stream(body, callbacks, key)

    def start(self, code, timeout=None, language=None):
        """Submits a cell that runs on whatever the client does (on_disconnect "continue"):
        returns {"execution_id", "phase"} at once; read its events with attach()."""
        body = {"code": code, "on_disconnect": "continue"}
        if timeout is not None:
            body["timeout_s"] = timeout
        if language:
            body["language"] = language
        conn, resp = self.client._send("POST", self._path("/execute"), json.dumps(body).encode(),
                                       {"Content-Type": "application/json",
                                        "Accept": "application/x-ndjson"})
        try:
            if resp.status >= 400:
                raise _error_of(resp.status, resp.read())
            start = _next_event(resp)
            return {"execution_id": start["execution_id"], "phase": start["phase"]}
        finally:
            conn.close()  # the cell runs on: it was submitted to continue

    def attach(self, execution_id, after=0, on_stdout=None, on_stderr=None, on_result=None,
               on_error=None):
        """Reads an execution's events again (those after seq `after`), live until it ends,
        calling the on_* callbacks as run() does; returns its record."""
        callbacks = {"stdout": on_stdout, "stderr": on_stderr, "result": on_result,
                     "error": on_error}
        conn, resp = self.client._send(
            "GET", self._path("/executions/%s/events?after=%d" % (execution_id, after)))
        return self._read_events(conn, resp, callbacks)

    def executions(self):
        """The executions the session keeps, oldest first: [{id, phase, status, ...}]."""
        return self.client.request("GET", self._path("/executions"))["executions"]

    def cancel(self, execution_id):
        """Takes a waiting execution out of the queue, or interrupts it while it runs."""
        return self.client.request("POST", self._path("/executions/%s/cancel" % execution_id))

    def _stream(self, body, callbacks, headers=None):
        conn, resp = self.client._send("POST", self._path("/execute"), json.dumps(body).encode(),
                                       dict(headers or {}, **{"Content-Type": "application/json",
                                                              "Accept": "application/x-ndjson"}))
        return self._read_events(conn, resp, callbacks)

    def _read_events(self, conn, resp, callbacks):
        try:
            if resp.status >= 400:
                raise _error_of(resp.status, resp.read())
            while True:
                ev = _next_event(resp)
                kind = ev.get("type")
                if kind == "done":
                    if "error" in ev:
                        e = ev["error"]
                        raise RuncellError(200, e.get("code", "error"), e.get("message", ""))
                    resp.read()
                    self.client._finish(conn, resp)
                    conn = None
                    return ev["record"]
                fn = callbacks.get(kind)
                if fn:
                    fn(ev["error"] if kind == "error" else ev["data"])
        finally:
            if conn is not None:
                conn.close()  # an abandoned stream interrupts the cell on the server

    def interrupt(self):
        """Interrupts the running cell (KeyboardInterrupt); True when one was running."""
        return self.client.request("POST", self._path("/interrupt"))["interrupted"]

    def restart(self):
        """A fresh interpreter on the same files; returns the session's description."""
        return self.client.request("POST", self._path("/restart"))

    def files(self):
        """Every file in the workspace: [{path, size, mtime, type}, ...]."""
        return self.client.request("GET", self._path("/files"))["files"]

    def upload(self, path, data):
        """Writes data (bytes, str, or a binary file object, streamed) to path in the
        workspace, creating directories on the way. Returns {path, size}."""
        headers = {"Content-Type": "application/octet-stream"}
        if isinstance(data, str):
            data = data.encode()
        if hasattr(data, "read"):
            try:
                size = os.fstat(data.fileno()).st_size - data.tell()
                headers["Content-Length"] = str(size)
            except (AttributeError, OSError, ValueError):
                read = data.read
                data = iter(lambda: read(_CHUNK), b"")  # sent chunked
        return self.client.request("PUT", self._path("/files/" + _quote_path(path)), data,
                                   headers)

    def download(self, path, dest=None):
        """The bytes of a workspace file; with dest (a local path or a binary file object)
        they are streamed there instead and the byte count is returned."""
        url = self._path("/files/" + _quote_path(path))
        if dest is None:
            return self.client.request("GET", url, raw=True)
        conn, resp = self.client._send("GET", url)
        try:
            if resp.status >= 400:
                raise _error_of(resp.status, resp.read())
            if hasattr(dest, "write"):
                n = _copy(resp, dest)
            else:
                with open(dest, "wb") as f:
                    n = _copy(resp, f)
            self.client._finish(conn, resp)
            conn = None
            return n
        finally:
            if conn is not None:
                conn.close()

    def delete_file(self, path):
        self.client.request("DELETE", self._path("/files/" + _quote_path(path)))

    def close(self):
        """Closes the session and removes its sandbox and files. A session that is already
        gone (closed, expired) is not an error."""
        try:
            self.client.request("DELETE", self._path())
        except RuncellError as e:
            if e.status != 404:
                raise
        finally:
            if self._own_client:
                self.client.close()


def _early_reply(conn):
    try:
        return conn.getresponse()
    except (OSError, http.client.HTTPException):
        return None


def _next_event(resp):
    try:
        line = resp.readline()
        if line:
            return json.loads(line)
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise RuncellError(0, "connection", "reading the stream: %s" % e) from e
    raise RuncellError(0, "connection", "the stream ended before the cell did")


def _copy(resp, f):
    n = 0
    while True:
        chunk = resp.read(_CHUNK)
        if not chunk:
            return n
        f.write(chunk)
        n += len(chunk)


if __name__ == "__main__":  # a smoke test: python3 runcell_client.py 'print(1)'
    import sys
    with Session() as s:
        rec = s.run(sys.argv[1] if len(sys.argv) > 1 else "print('hello from runcell')",
                    on_stdout=lambda t: print(t, end=""), on_stderr=lambda t: print(t, end="",
                                                                                  file=sys.stderr))
        print(json.dumps({k: rec[k] for k in ("status", "results", "error")}, indent=1))
