"""scripted_model - an OpenAI-compatible Chat Completions server for tests (stdlib only).

It listens on 127.0.0.1 (a free port), answers POST /v1/chat/completions from a script, as
plain JSON or as server-sent events when the request asks for "stream": true, and records
every request it got (headers and parsed body). POSTs to /webhook are recorded too.

Script items (consumed in order; `repeat_last=True` keeps answering with the last one):
  {"tool": "run_python", "code": "..."}        one tool call (run_shell: {"command": ...})
  {"calls": [{"tool": ..., "code"/"command": ..., "raw_arguments": "..."}, ...]}
  {"answer": "text"}                           a final answer, no tool call
  {"status": 500, "error": "message"}          an HTTP error
  {"sleep": 3, ...}                            wait before answering (timeouts)
Per item: "no_id": true (tool calls without ids), "finish_reason": "tool" (the quirk),
"usage": {...} (default: a small usage block), "content": "text beside tool calls".
Server options: reject_tool_choice=True answers 400 to any request carrying tool_choice.
"""
import json
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
    if call.get("tool") == "run_shell":
        return json.dumps({"command": call["command"]})
    return json.dumps({"code": call["code"]})


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
                if self.path != "/v1/chat/completions":
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
                item = model._next()
                if item.get("sleep"):
                    time.sleep(item["sleep"])
                if "status" in item:
                    return self._send(item["status"], "application/json", json.dumps(
                        {"error": {"message": item.get("error", "scripted error")}}).encode())
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

    def _next(self):
        with self.lock:
            self.served += 1
            if self.script:
                item = self.script.pop(0) if (len(self.script) > 1 or not self.repeat_last) \
                    else self.script[0]
                return item
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
