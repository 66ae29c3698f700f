"""scripted_model - an OpenAI-compatible model server for tests (stdlib only).

It listens on 127.0.0.1 (a free port), answers POST /v1/chat/completions from a script, as
plain JSON or as server-sent events when the request asks for "stream": true, and POST
/v1/responses (the Responses API, without streaming) from the same script, and records every
request it got (headers and parsed body). POSTs to /webhook are recorded too.

Script items (consumed in order; `repeat_last=True` keeps answering with the last one):
  {"tool": "run_python", "code": "..."}        one tool call (run_shell: {"command": ...})
  {"calls": [{"tool": ..., "code"/"command": ..., "raw_arguments": "..."}, ...]}
  {"tool": ..., "args": {...}}                 a call with exactly these arguments
     with "session": true, session_id is added: the id of the latest runcell session the
     conversation's tool messages show ("Created session ID (...)"), as a model would
  {"tool": "wait_for_cell", "while_running": true}
                                               while the latest tool message says a cell still
     runs ("Call wait_for_cell with run_id \"ID\""), a wait_for_cell for it, the item kept;
     otherwise the item is skipped
Tool names are matched against the request's tools, so a framework's prefix ("runcell__")
is added as the framework expects.
  {"answer": "text"}                           a final answer, no tool call
  {"status": 500, "error": "message"}          an HTTP error
  {"sleep": 3, ...}                            wait before answering (timeouts)
Per item: "no_id": true (tool calls without ids), "finish_reason": "tool" (the quirk),
"usage": {...} (default: a small usage block), "content": "text beside tool calls".
Server options: reject_tool_choice=True answers 400 to any request carrying tool_choice.
"""
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler

from rctest import LocalHttpServer

DEFAULT_USAGE = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}


def _calls_of(item):
    if "calls" in item:
        return item["calls"]
    if "tool" in item:
        return [item]
    return []


def _arguments(call):
    if "raw_arguments" in call:
        return call["raw_arguments"]
    if "args" in call:
        return json.dumps(call["args"])
    if call.get("tool") == "run_shell":
        return json.dumps({"command": call["command"]})
    return json.dumps({"code": call["code"]})


def message_text(message):
    """The text of a chat message (or a Responses function_call_output), whatever shape its
    content has."""
    content = message.get("content", message.get("output"))
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def tool_results(body):
    """The tool results a request shows the model, oldest first: Chat Completions' tool
    messages, or the Responses API's function_call_output items."""
    if "messages" in body:
        return [m for m in body["messages"] if m.get("role") == "tool"]
    return [i for i in body.get("input", []) if isinstance(i, dict) and
            i.get("type") == "function_call_output"]


def tool_texts(body):
    """The text of the tool results of a request, oldest first."""
    return [message_text(m) for m in tool_results(body)]


def _tool_names(body):
    return [t.get("function", t).get("name", "") for t in body.get("tools", [])]


def _resolve(body, item):
    """item's calls with tool names as the request offers them and session ids filled in."""
    names = _tool_names(body)
    texts = tool_texts(body)
    sessions = re.findall(r"Created session (\S+) \(", "\n".join(texts))
    calls = []
    for c in _calls_of(item):
        c = dict(c)
        want = c["tool"]
        c["tool"] = next((n for n in names if n == want), None) or next(
            (n for n in names if n.endswith("_" + want) or n.endswith("." + want)), want)
        if c.get("session"):
            c["args"] = dict(c.get("args", {}), session_id=sessions[-1] if sessions else "none")
        calls.append(c)
    return dict(item, calls=calls) if calls else item


class ScriptedModel(LocalHttpServer):
    def __init__(self, script, repeat_last=False, reject_tool_choice=False):
        self.script = list(script)
        self.repeat_last = repeat_last
        self.reject_tool_choice = reject_tool_choice
        self.requests = []   # chat requests: {"headers": {...}, "body": {...}, "raw": str}
        self.webhooks = []   # bodies POSTed to /webhook
        self.lock = threading.Lock()
        self.served = 0
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                try:
                    self._post()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test): nothing to answer

            def _post(self):
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n).decode()
                if self.path == "/webhook":
                    with model.lock:
                        model.webhooks.append(json.loads(raw))
                    return self._send(200, "application/json", b"{}")
                if self.path not in ("/v1/chat/completions", "/v1/responses"):
                    return self._send(404, "application/json",
                                      b'{"error":{"message":"no such route"}}')
                body = json.loads(raw)
                with model.lock:
                    model.requests.append({"headers": dict(self.headers), "body": body,
                                           "raw": raw})
                if model.reject_tool_choice and "tool_choice" in body:
                    return self._send(400, "application/json", json.dumps(
                        {"error": {"message": "tool_choice is not supported by this server"}}
                    ).encode())
                item = model._next(body)
                if item.get("sleep"):
                    time.sleep(item["sleep"])
                if "status" in item:
                    return self._send(item["status"], "application/json", json.dumps(
                        {"error": {"message": item.get("error", "scripted error")}}).encode())
                if self.path == "/v1/responses":
                    if body.get("stream"):
                        return self._send(400, "application/json", json.dumps({"error": {
                            "message": "this scripted model streams Chat Completions only"}
                        }).encode())
                    return self._send(200, "application/json",
                                      json.dumps(model.response(item)).encode())
                if body.get("stream"):
                    return self._stream(item)
                return self._send(200, "application/json", json.dumps(model.plain(item)).encode())

            def _send(self, status, ctype, data):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, item):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for chunk in model.chunks(item):
                    self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        super().__init__(Handler)
        self.base_url = "http://127.0.0.1:%d/v1" % self.port
        self.webhook_url = "http://127.0.0.1:%d/webhook" % self.port

    def _next(self, body=None):
        body = body or {}
        with self.lock:
            self.served += 1
            while self.script and self.script[0].get("while_running"):
                texts = tool_texts(body)
                running = re.search(r'Call wait_for_cell with run_id "(\w+)"',
                                    texts[-1] if texts else "")
                if running:
                    return _resolve(body, {"tool": "wait_for_cell",
                                           "args": {"run_id": running.group(1)}})
                self.script.pop(0)
            if self.script:
                item = self.script.pop(0) if (len(self.script) > 1 or not self.repeat_last) \
                    else self.script[0]
                return _resolve(body, item)
        return {"answer": "(the script ran out)"}

    def _finish(self, item):
        if "finish_reason" in item:
            return item["finish_reason"]
        return "tool_calls" if _calls_of(item) else "stop"

    def plain(self, item):
        calls = _calls_of(item)
        msg = {"role": "assistant", "content": item.get("answer", item.get("content"))}
        if calls:
            msg["tool_calls"] = []
            for i, c in enumerate(calls):
                tc = {"type": "function", "function": {"name": c["tool"],
                                                       "arguments": _arguments(c)}}
                if not item.get("no_id"):
                    tc["id"] = "call_%d_%d" % (self.served, i)
                msg["tool_calls"].append(tc)
        return {"id": "chatcmpl-%d" % self.served, "object": "chat.completion",
                "created": int(time.time()), "model": "scripted",
                "choices": [{"index": 0, "message": msg, "finish_reason": self._finish(item)}],
                "usage": item.get("usage", DEFAULT_USAGE)}

    def response(self, item):
        """A Responses API answer for item."""
        output = []
        text = item.get("answer", item.get("content"))
        if text:
            output.append({"type": "message", "id": "msg_%d" % self.served, "role": "assistant",
                           "status": "completed", "content": [
                               {"type": "output_text", "text": text, "annotations": []}]})
        for i, c in enumerate(_calls_of(item)):
            output.append({"type": "function_call", "id": "fc_%d_%d" % (self.served, i),
                           "call_id": "call_%d_%d" % (self.served, i), "name": c["tool"],
                           "arguments": _arguments(c), "status": "completed"})
        usage = item.get("usage", DEFAULT_USAGE)
        return {"id": "resp_%d" % self.served, "object": "response",
                "created_at": int(time.time()), "model": "scripted", "status": "completed",
                "output": output, "usage": {
                    "input_tokens": usage["prompt_tokens"],
                    "output_tokens": usage["completion_tokens"],
                    "total_tokens": usage["total_tokens"],
                    "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens_details": {"reasoning_tokens": 0}}}

    def chunks(self, item):
        """Stream chunks: content in pieces, each call's arguments in 7-character pieces."""
        base = {"id": "chatcmpl-%d" % self.served, "object": "chat.completion.chunk",
                "model": "scripted"}

        def chunk(delta, finish=None):
            return dict(base, choices=[{"index": 0, "delta": delta, "finish_reason": finish}])

        yield chunk({"role": "assistant", "content": ""})
        text = item.get("answer", item.get("content")) or ""
        for i in range(0, len(text), 10):
            yield chunk({"content": text[i:i + 10]})
        for i, c in enumerate(_calls_of(item)):
            first = {"index": i, "type": "function",
                     "function": {"name": c["tool"], "arguments": ""}}
            if not item.get("no_id"):
                first["id"] = "call_%d_%d" % (self.served, i)
            yield chunk({"tool_calls": [first]})
            args = _arguments(c)
            for j in range(0, len(args), 7):
                yield chunk({"tool_calls": [{"index": i,
                                             "function": {"arguments": args[j:j + 7]}}]})
        yield chunk({}, self._finish(item))
        yield dict(base, choices=[], usage=item.get("usage", DEFAULT_USAGE))

    def tool_messages(self, request_index):
        """The tool messages the model was shown in one request."""
        return [m for m in self.requests[request_index]["body"]["messages"]
                if m["role"] == "tool"]
