"""kernel.py - runcell's in-sandbox kernel: runs cells one at a time in one persistent
namespace, driven by the daemon over a framed protocol on fd 3.

Frames are [u32 big-endian payload length][u8 kind][payload]:
  daemon -> kernel  b"M"  JSON request: {"type": "execute", "code": ..., "lang": "python"|"bash"}
  kernel -> daemon  b"O"  stdout bytes written by Python code (sys.stdout)
                    b"E"  stderr bytes written by Python code (sys.stderr)
                    b"M"  JSON message: hello, display (MIME bundle), done
Output of child processes and C code goes to fds 1 and 2, which are pipes the daemon reads
directly. The daemon treats everything arriving here as untrusted: user code runs in this
very process and may change any of it.
"""
import ast
import base64
import builtins
import io
import json
import linecache
import os
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
import types

CHANNEL_FD = 3
MAX_REQUEST = 64 << 20
STREAM_CHUNK = 32 << 10
KERNEL_FILE = os.path.abspath(__file__)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_exact(fd, n):
    chunks = []
    while n:
        b = os.read(fd, min(n, 1 << 20))
        if not b:
            return None
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


class _HoldInterrupts:
    """Holds off KeyboardInterrupt in the main thread while a frame is being written, and
    raises it once the frame is out: a frame cut short (a header without its payload)
    would desynchronise the channel. Re-entrant; other threads never get KeyboardInterrupt,
    so for them it does nothing."""

    def __init__(self):
        self.depth, self.hit, self.old = 0, False, None

    def _note(self, signum, frame):
        self.hit = True

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            if not self.depth:
                self.hit = False
                self.old = signal.signal(signal.SIGINT, self._note)
            self.depth += 1
        return self

    def __exit__(self, exc_type, exc, tb):
        if threading.current_thread() is not threading.main_thread():
            return
        self.depth -= 1
        if self.depth:
            return
        signal.signal(signal.SIGINT, self.old)
        if self.hit and exc_type is None and self.old is signal.default_int_handler:
            raise KeyboardInterrupt


_hold_interrupts = _HoldInterrupts()


class Channel:
    """The framed control channel; frames from threads are serialised by a lock."""

    def __init__(self, fd):
        import fcntl
        # Out of the way of user code, and not inherited by programs the code runs.
        self.fd = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100)
        os.close(fd)
        self.lock = threading.Lock()

    def send(self, kind, payload):
        frame = struct.pack(">IB", len(payload), kind) + payload
        with _hold_interrupts, self.lock:
            _write_all(self.fd, frame)

    def send_json(self, obj):
        self.send(ord("M"), json.dumps(obj, ensure_ascii=False,
                                       default=repr).encode("utf-8", "surrogatepass"))

    def recv(self):
        header = _read_exact(self.fd, 5)
        if header is None:
            return None, None
        length, kind = struct.unpack(">IB", header)
        if length > MAX_REQUEST:
            raise SystemExit("runcell kernel: request too large")
        payload = _read_exact(self.fd, length) if length else b""
        return kind, payload


class FrameStream(io.TextIOBase):
    """sys.stdout / sys.stderr: line-buffered text sent as frames to the daemon."""

    def __init__(self, channel, kind, fd):
        self._channel = channel
        self._kind = kind
        self._fd = fd
        self._pending = []
        self._size = 0
        self._lock = threading.RLock()
        self.buffer = _BinaryFrameStream(self)

    encoding = "utf-8"
    errors = "surrogateescape"
    name = property(lambda self: "<stdout>" if self._fd == 1 else "<stderr>")

    def writable(self):
        return True

    def isatty(self):
        return False

    def fileno(self):
        return self._fd

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not %s" % type(s).__name__)
        self.write_bytes(s.encode("utf-8", "surrogateescape"))
        return len(s)

    def write_bytes(self, b):
        with self._lock:
            self._pending.append(bytes(b))
            self._size += len(b)
            if b"\n" in b or self._size >= STREAM_CHUNK:
                self.flush()

    def flush(self):
        # Held across taking the text and sending it, so that an interrupt neither loses
        # the text nor cuts its frame.
        with _hold_interrupts, self._lock:
            if not self._pending:
                return
            data = b"".join(self._pending)
            self._pending, self._size = [], 0
            for i in range(0, len(data), STREAM_CHUNK):
                self._channel.send(self._kind, data[i:i + STREAM_CHUNK])


class _BinaryFrameStream(io.RawIOBase):
    def __init__(self, text):
        self._text = text

    def writable(self):
        return True

    def write(self, b):
        self._text.write_bytes(bytes(b))
        return len(b)

    def flush(self):
        self._text.flush()

    def fileno(self):
        return self._text.fileno()


# ---- rich output ----

_REPR_METHODS = [
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
]
_BINARY = {"image/png", "image/jpeg"}


def _encode_mime(mime, value):
    if mime in _BINARY:
        if isinstance(value, str):
            return value  # already base64
        return base64.b64encode(bytes(value)).decode("ascii")
    if mime == "application/json":
        return value
    return value if isinstance(value, str) else str(value)


def _figure_png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _is_figure(obj):
    mod = sys.modules.get("matplotlib.figure")
    return mod is not None and isinstance(obj, mod.Figure)


def mime_bundle(obj):
    """Jupyter-style MIME bundle: text/plain always, rich forms where the object has them."""
    data = {}
    if _is_figure(obj):
        data["image/png"] = _figure_png(obj)
    method = getattr(type(obj), "_repr_mimebundle_", None)
    if callable(method):
        try:
            r = obj._repr_mimebundle_(include=None, exclude=None)
            if isinstance(r, tuple):
                r = r[0]
            for mime, value in (r or {}).items():
                data[mime] = _encode_mime(mime, value)
        except Exception:
            pass
    for name, mime in _REPR_METHODS:
        if mime in data or not callable(getattr(type(obj), name, None)):
            continue
        try:
            value = getattr(obj, name)()
        except Exception:
            continue
        if isinstance(value, tuple):
            value = value[0]
        if value is not None:
            data[mime] = _encode_mime(mime, value)
    if "text/plain" not in data:
        try:
            data["text/plain"] = repr(obj)
        except Exception as e:
            data["text/plain"] = "<repr failed: %s: %s>" % (type(e).__name__, e)
    return data


class Kernel:
    def __init__(self, channel):
        self.channel = channel
        self.count = 0
        self.stdout = FrameStream(channel, ord("O"), 1)
        self.stderr = FrameStream(channel, ord("E"), 2)
        self.main = types.ModuleType("__main__")
        self.main.__dict__["__builtins__"] = builtins
        self.ns = self.main.__dict__

    # -- output --
    def flush_streams(self):
        self.stdout.flush()
        self.stderr.flush()

    def display(self, obj, result=False):
        self.flush_streams()
        self.channel.send_json({"type": "display", "result": result, "data": mime_bundle(obj)})

    def flush_figures(self):
        """Every figure still open goes out as image/png, then is closed (Jupyter inline)."""
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        for num in plt.get_fignums():
            fig = plt.figure(num)
            try:
                self.display(fig)
            except Exception as e:
                print("runcell: cannot render figure %s: %s" % (num, e), file=self.stderr)
        plt.close("all")

    # -- errors --
    def error_record(self, etype, value, tb, filename):
        # Drop the kernel's own frames: the traceback starts at the cell.
        while tb is not None and tb.tb_frame.f_code.co_filename == KERNEL_FILE:
            tb = tb.tb_next
        text = "".join(traceback.format_exception(etype, value, tb))
        err = {"name": etype.__name__, "value": str(value), "traceback": text}
        if isinstance(value, SyntaxError):
            err["lineno"] = value.lineno
            err["offset"] = value.offset
            err["value"] = value.msg
        return err

    # -- execution --
    def run_python(self, code, filename):
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        try:
            tree = ast.parse(code, filename, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
            body = compile(tree, filename, "exec", flags=flags, dont_inherit=True)
            expr = compile(last, filename, "eval", flags=flags, dont_inherit=True) if last else None
        except SyntaxError as e:
            return self.error_record(type(e), e, None, filename), None
        try:
            self._eval(body)
            value = self._eval(expr) if expr is not None else None
        except BaseException as e:  # noqa: B902 - KeyboardInterrupt and SystemExit included
            return self.error_record(type(e), e, e.__traceback__, filename), e
        if value is not None:
            self.ns["_"] = value
            self.display(value, result=True)
        return None, None

    def _eval(self, code):
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            result = eval(code, self.ns)
            if code.co_flags & 0x80:  # CO_COROUTINE: the cell used top-level await
                import asyncio
                result = asyncio.run(result)
            return result
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    def run_bash(self, code):
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            status = subprocess.run(["/bin/bash", "-c", code], stdin=subprocess.DEVNULL).returncode
        except KeyboardInterrupt as e:
            return self.error_record(KeyboardInterrupt, e, None, ""), None
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        if status == 0:
            return None, None
        what = "exit status %d" % status if status > 0 else "killed by signal %d" % -status
        return {"name": "ShellError", "value": what, "traceback": "bash: " + what + "\n",
                "exit_code": status if status > 0 else 128 - status}, None

    def execute(self, req):
        self.count += 1
        reply = {"type": "done", "execution_count": self.count, "status": "ok", "error": None}
        exc = None
        try:
            importlib_invalidate()
            if req.get("lang", "python") == "bash":
                err, exc = self.run_bash(req.get("code", ""))
            else:
                err, exc = self.run_python(req.get("code", ""), "<cell %d>" % self.count)
            self.flush_figures()
        except BaseException as e:  # the kernel must survive anything the cell does
            err = self.error_record(type(e), e, e.__traceback__, "")
        if err:
            reply["status"] = "error"
            reply["error"] = err
            if isinstance(exc, SystemExit):
                code = exc.code
                reply["exit_code"] = code if isinstance(code, int) else (0 if code is None else 1)
            elif "exit_code" in err:
                reply["exit_code"] = err.pop("exit_code")
        try:
            self.flush_streams()
        except Exception:
            pass
        self.channel.send_json(reply)

    def serve(self):
        self.channel.send_json({"type": "hello", "python": sys.version.split()[0],
                                "pid": os.getpid(), "cwd": os.getcwd()})
        while True:
            kind, payload = self.channel.recv()
            if kind is None:
                return
            try:
                req = json.loads(payload)
            except ValueError:
                continue
            if req.get("type") == "execute":
                self.execute(req)


def importlib_invalidate():
    # Packages installed by a previous cell (pip install --user) become importable.
    import importlib
    importlib.invalidate_caches()
    user_site = os.path.join(os.environ.get("PYTHONUSERBASE", ""), "lib",
                             "python%d.%d" % sys.version_info[:2], "site-packages")
    if os.path.isdir(user_site) and user_site not in sys.path:
        import site
        site.addsitedir(user_site)


def _no_input(prompt=""):
    raise EOFError("input() is not available: code runs without a terminal or a user to "
                   "answer; pass data in files or variables instead")


class _PyplotHook:
    """Meta-path hook: once matplotlib.pyplot is imported, plt.show() displays the open
    figures (and closes them) instead of warning that Agg cannot show."""

    def __init__(self, kernel):
        self.kernel = kernel

    def find_spec(self, name, path=None, target=None):
        if name != "matplotlib.pyplot":
            return None
        import importlib.machinery
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        loader, kernel = spec.loader, self.kernel

        class Loader:
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)

                def show(*args, **kwargs):
                    kernel.flush_figures()
                module.show = show

        spec.loader = Loader()
        return spec


def main():
    channel = Channel(CHANNEL_FD)
    kernel = Kernel(channel)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stdout, sys.stderr = kernel.stdout, kernel.stderr
    # sys.stdin stays on fd 0, which the sandbox points at /dev/null.
    builtins.input = _no_input

    def display(*objs):
        """Shows each object as a result (a MIME bundle), like IPython's display()."""
        for obj in objs:
            kernel.display(obj)
    builtins.display = display
    sys.meta_path.insert(0, _PyplotHook(kernel))
    # The workspace (cwd) is importable, as in Jupyter; the kernel's own directory is not.
    sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(KERNEL_FILE)]
    sys.path.insert(0, "")
    importlib_invalidate()

    def after_fork_in_child():
        # A forked child (multiprocessing) writes to the real pipes, never to the channel.
        try:
            os.close(channel.fd)
        except OSError:
            pass
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
    os.register_at_fork(after_in_child=after_fork_in_child)
    sys.modules["__main__"] = kernel.main
    # Arguments given after the code (runcell run -c CODE ARGS...), as python -c has them.
    sys.argv = ["-c"] + sys.argv[1:]
    kernel.serve()


if __name__ == "__main__":
    main()
