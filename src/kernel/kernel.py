"""kernel.py - runcell's in-sandbox kernel: runs cells one at a time in one persistent
namespace, driven by the daemon over a framed protocol on fd 3.

Frames are [u32 big-endian payload length][u8 kind][payload]:
  daemon -> kernel  b"M"  JSON request: {"type": "execute", "code": ..., "lang": "python"|"bash",
                                         "execution_count": N, "sync": true}
                    b"I"  interrupt (see Channel.interrupted)
                    b"A"  the answer to a sync message (see Kernel.sync_output)
                          {"type": "checkpoint" | "restore", "path": ...} (variables, see below)
                          {"type": "set_home", "path": ...} (HOME and the working directory)
                          {"type": "start_shell"} (the bash shell, before its first cell)
                          {"type": "history", "path": DEPTH} (keep the state before cells)
                          {"type": "undo", "path": N} (back to the state before cell N)
  kernel -> daemon  b"O"  stdout bytes written by Python code (sys.stdout)
                    b"E"  stderr bytes written by Python code (sys.stderr)
                    b"M"  JSON message: hello, display (MIME bundle), done, checkpoint_done,
                          restore_done, set_home_done, start_shell_done, history_done,
                          undo_done, sync
Output of child processes and C code goes to fds 1 and 2, which are pipes the daemon reads
directly. The daemon treats everything arriving here as untrusted: user code runs in this
very process and may change any of it.

A fresh kernel (`runcell run -c`, sessions without the template) pays for every module it
imports before its first cell, so at start it imports only what a cell needs, and C modules
where the Python ones would bring `re` and `enum` along: `_ast` for `ast`, `_signal` for
`signal`, `_json` through the small codec below for `json`, `binascii` for `base64`,
`_thread` for `threading`. The rest (`traceback`, `pickle`, `subprocess`, ...) is imported
where it is used. `linecache` is fed from the kernel's own table of cell sources once
anything imports it (_AfterImport).
"""
import _ast
import _json
import _signal
import _thread
import binascii
import builtins
import io
import marshal
import os
import struct
import sys
import time
import types

CHANNEL_FD = 3
MAX_REQUEST = 48 << 20  # KERNEL_MAX_FRAME in kernel.h: one cap for both directions
_os_fork = os.fork  # before _sync_before_programs wraps it: the kernel's own forks
STREAM_CHUNK = 32 << 10
KERNEL_FILE = os.path.abspath(__file__)


# ---- JSON without the json package (which imports re): the same C scanner and encoder ----

class _JsonContext:
    """What _json's scanner reads from a decoder: json.loads' defaults."""
    strict = True
    object_hook = object_pairs_hook = None
    parse_float, parse_int = float, int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"),
                      "NaN": float("nan")}.__getitem__
    memo = {}


_json_scan = _json.make_scanner(_JsonContext())
_JSON_SPACE = " \t\n\r"


def _json_default(obj):
    raise TypeError("Object of type %s is not JSON serializable" % type(obj).__name__)


def json_loads(text):
    """json.loads(text) for str or UTF-8 bytes: ValueError on anything that is not one JSON
    value with optional whitespace around it."""
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8")
    start = len(text) - len(text.lstrip(_JSON_SPACE))
    try:
        value, end = _json_scan(text, start)
    except StopIteration as e:
        raise ValueError("not JSON at character %d" % e.value) from None
    if text[end:].strip(_JSON_SPACE):
        raise ValueError("extra data after JSON at character %d" % end)
    return value


def json_dumps(obj):
    """json.dumps(obj, ensure_ascii=False, allow_nan=False)."""
    # A new encoder each time, as json.dumps makes: its table of the objects being written
    # (which finds a cycle) is left holding them when a value cannot be written.
    enc = _json.make_encoder({}, _json_default, _json.encode_basestring, None, ": ", ", ",
                             False, False, False)
    return "".join(enc(obj, 0))


# ---- sources of cells, for tracebacks; given to linecache when it is imported ----

_sources = {}


def _remember_source(filename, code):
    entry = (len(code), None, code.splitlines(True), filename)
    _sources[filename] = entry
    lc = sys.modules.get("linecache")
    if lc is not None:
        lc.cache[filename] = entry


def _fill_linecache(module):
    module.cache.update(_sources)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class _Interrupts:
    """SIGINT in the kernel. It raises KeyboardInterrupt in the main thread while a cell's
    code runs (live), and only then: a SIGINT that comes as a cell ends, or between cells,
    is dropped by the handler, so the kernel never dies of one while it waits. The handler
    decides when it runs, not when the signal came, which leaves no window in which a
    switch of handlers (signal.signal) could be caught half done.

    Used as a context manager, it holds KeyboardInterrupt off while a frame is written and
    raises it once the frame is out: a frame cut short (a header without its payload) would
    desynchronise the channel. Re-entrant; other threads never get KeyboardInterrupt, so for
    them it does nothing."""

    def __init__(self):
        self.live, self.depth, self.hit = False, 0, False

    def handler(self, signum, frame):
        if not self.live:
            return
        if self.depth:
            self.hit = True
            return
        raise KeyboardInterrupt

    def __enter__(self):
        if _in_main_thread():
            if not self.depth:
                self.hit = False
            self.depth += 1
        return self

    def __exit__(self, exc_type, exc, tb):
        if not _in_main_thread():
            return
        self.depth -= 1
        if not self.depth and self.hit and exc_type is None and self.live:
            self.hit = False
            raise KeyboardInterrupt


# The thread that runs cells, as threading.main_thread() names it but without importing
# threading (~2 ms of CPU at a fresh kernel's start, with _weakrefset): the thread the
# kernel started in, and in a child of os.fork the thread that forked, as threading has it
# there. A template's clone runs its kernel on the template's main thread.
_main_ident = _thread.get_ident()


def _in_main_thread():
    return _thread.get_ident() == _main_ident


def _forked_from_this_thread():
    global _main_ident
    _main_ident = _thread.get_ident()


os.register_at_fork(after_in_child=_forked_from_this_thread)
_interrupts = _Interrupts()
_sigint_handler = _interrupts.handler  # one bound method, so that `is` can recognise it


def _own_sigint():
    """The kernel's SIGINT handler back, where a cell's code installed its own (a library
    that sets the default handler would otherwise leave the waiting kernel killable)."""
    while _signal.getsignal(_signal.SIGINT) is not _sigint_handler:
        try:
            _signal.signal(_signal.SIGINT, _sigint_handler)
        except KeyboardInterrupt:
            pass  # a pending SIGINT, run by the cell's handler as it was replaced


class Channel:
    """The framed control channel; frames from threads are serialised by a lock."""

    def __init__(self, fd):
        import fcntl
        # Out of the way of user code, and not inherited by programs the code runs.
        self.fd = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100)
        os.close(fd)
        self.lock = _thread.allocate_lock()
        self.held = None  # a frame read while looking for an interrupt, for recv
        # What was read of the channel and not yet taken: a frame's header and payload come
        # in one read, and a frame the daemon sent right after it (an interrupt) waits here.
        self.buf = bytearray()

    def send(self, kind, payload):
        frame = struct.pack(">IB", len(payload), kind) + payload
        with _interrupts, self.lock:
            _write_all(self.fd, frame)

    def send_json(self, obj, plain=False):
        """plain: obj holds only the kernel's own strings and small integers (no user data),
        which the daemon takes as they are."""
        text = json_dumps(obj if plain else _wire_safe(obj))
        self.send(ord("M"), text.encode("utf-8"))

    def recv(self):
        """The next request, past interrupt frames and sync answers: one that comes before a
        request was meant for the cell before it, which had ended (or was interrupted while
        it waited for the answer)."""
        while True:
            kind, payload = self._recv_frame()
            if kind not in (ord("I"), ord("A")):
                return kind, payload

    def sync(self):
        """Sends a sync message and waits for the daemon's answer (an "A" frame), which it
        sends once it has taken every frame before it and what the pipes hold. Interruptible
        while it waits, never in the middle of a frame."""
        import select
        self.send_json({"type": "sync"})
        while True:
            if self.held is None:
                if not self.buf:
                    select.select([self.fd], [], [])
                with _interrupts:
                    self.held = self._recv_frame()
            kind, _ = self.held
            if kind == ord("I"):
                self.held = None  # its SIGINT raises KeyboardInterrupt here, or has
            elif kind == ord("A"):
                self.held = None
                return
            else:
                return  # not an answer (the daemon has gone, or a request): recv's

    def interrupted(self):
        """True when the daemon sent an interrupt frame after the request being run. The
        daemon writes the frame, then signals: called once SIGINT is live, this sees every
        interrupt whose signal came too early to raise KeyboardInterrupt."""
        import select
        while self.held is None and (self.buf or select.select([self.fd], [], [], 0)[0]):
            kind, payload = self._recv_frame()
            if kind == ord("I"):
                return True
            self.held = (kind, payload)
        return False

    def _recv_frame(self):
        if self.held is not None:
            frame, self.held = self.held, None
            return frame
        if not self._fill(5):
            return None, None
        length, kind = struct.unpack_from(">IB", self.buf)
        if length > MAX_REQUEST:
            raise SystemExit("runcell kernel: request too large")
        if not self._fill(5 + length):
            return None, None
        payload = bytes(self.buf[5:5 + length])
        del self.buf[:5 + length]
        return kind, payload

    def _fill(self, n):
        """Reads until buf holds n bytes; False at the end of the channel."""
        while len(self.buf) < n:
            b = os.read(self.fd, max(65536, min(n - len(self.buf), 1 << 20)))
            if not b:
                return False
            self.buf += b
        return True


def _wire_text(s):
    # The daemon accepts only valid UTF-8 without NUL: lone surrogates (from user strings
    # or surrogateescape) become U+FFFD, and pairs written as two code points are joined.
    if s.isascii():
        return s.replace("\0", "\ufffd")
    s = s.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return s.replace("\0", "\ufffd")


def _wire_safe(obj, depth=0):
    """obj with every value the daemon's JSON parser would refuse made acceptable: strings
    cleaned, NaN and infinities as null, integers beyond 64 bits as strings, anything else
    as its repr. Messages carry user data (reprs, error text, _repr_json_ values), and a
    message the daemon cannot parse costs the session its kernel."""
    if obj is None or obj is True or obj is False:
        return obj
    if isinstance(obj, str):
        return _wire_text(obj)
    if isinstance(obj, int):
        obj = int(obj)
        return obj if -(1 << 63) <= obj < (1 << 63) else str(obj)
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if depth > 100:
        return _wire_text(repr(obj))
    if isinstance(obj, dict):
        return {_wire_text(k if isinstance(k, str) else str(k)): _wire_safe(v, depth + 1)
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_wire_safe(v, depth + 1) for v in obj]
    try:
        return _wire_text(repr(obj))
    except Exception as e:
        return "<repr failed: %s>" % type(e).__name__


class FrameStream(io.TextIOBase):
    """sys.stdout / sys.stderr: line-buffered text sent as frames to the daemon."""

    def __init__(self, channel, kind, fd):
        self._channel = channel
        self._kind = kind
        self._fd = fd
        self._pending = []
        self._size = 0
        self._lock = _thread.RLock()
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
        # Nothing pending: nothing written since the last flush, and no flush under way in
        # another thread (the text leaves _pending only once it is sent), so nothing this
        # flush could have to wait for. The common case, without the locks.
        if not self._pending:
            return
        # Held across taking the text and sending it, so that an interrupt neither loses
        # the text nor cuts its frame.
        with _interrupts, self._lock:
            if not self._pending:
                return
            data = b"".join(self._pending)
            for i in range(0, len(data), STREAM_CHUNK):
                self._channel.send(self._kind, data[i:i + STREAM_CHUNK])
            self._pending, self._size = [], 0


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
    ("_repr_javascript_", "application/javascript"),
]
_BINARY = {"image/png", "image/jpeg"}


def _encode_mime(mime, value):
    if mime in _BINARY:
        if isinstance(value, str):
            return value  # already base64
        return binascii.b2a_base64(bytes(value), newline=False).decode("ascii")
    if mime == "application/json":
        return value
    return value if isinstance(value, str) else str(value)


def _figure_png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return binascii.b2a_base64(buf.getvalue(), newline=False).decode("ascii")


def _is_figure(obj):
    mod = sys.modules.get("matplotlib.figure")
    return mod is not None and isinstance(obj, mod.Figure)


# ---- charts: what a matplotlib figure shows, as data (E2B's results[].chart) ----
#
# A figure's bundle carries, beside its PNG, CHART_MIME: the figure's type (line, scatter,
# bar, pie, box_and_whisker, or a superchart of several axes), title, axis labels, units
# and scales, and its elements, in the schema of E2B's chart extraction (which E2B's SDKs
# read from a result's "chart"). Read from the figure once it is drawn (tick labels exist
# only then); a figure of more than CHART_MAX_POINTS values, or one this cannot read, has
# none (never a cut one).

CHART_MIME = "application/vnd.runcell.chart+json"
CHART_MAX_POINTS = 10000


class _TooBig(Exception):
    pass


def _chart_value(v):
    """A point's coordinate as JSON has it: numbers as floats, dates as ISO text."""
    import datetime
    if isinstance(v, (datetime.date, datetime.datetime)):
        return v.isoformat()
    np = sys.modules.get("numpy")
    if np is not None and isinstance(v, np.datetime64):
        return str(v.astype("datetime64[s]"))
    if isinstance(v, (int, float)) or (np is not None and isinstance(v, np.number)):
        f = float(v)
        return f if f == f and f not in (float("inf"), float("-inf")) else None
    return str(v)


def _chart_label(text):
    return text if text else None


def _chart_unit(label):
    """The unit a label names at its end, as 'Speed (m/s)' or 'Mass [kg]'."""
    if not label:
        return None
    label = label.rstrip()
    for open_, close in (("(", ")"), ("[", "]")):
        if label.endswith(close) and open_ in label:
            unit = label[label.rindex(open_) + 1:-1].strip()
            if unit and label[:label.rindex(open_)].strip():
                return unit
    return None


def _axis_info(ax, which):
    import matplotlib.category
    import matplotlib.dates
    axis = ax.xaxis if which == "x" else ax.yaxis
    converter = axis.converter
    ticks = list(axis.get_ticklocs())
    labels = [t.get_text() for t in axis.get_ticklabels()]
    if isinstance(converter, matplotlib.dates.DateConverter) or \
            type(converter).__name__ == "_SwitchableDateConverter":
        scale = "datetime"
        ticks = [matplotlib.dates.num2date(t).isoformat() for t in ticks]
    elif isinstance(converter, matplotlib.category.StrCategoryConverter):
        scale = "categorical"
        ticks = [_chart_value(t) for t in ticks]
    else:
        scale = (ax.get_xscale if which == "x" else ax.get_yscale)()
        ticks = [_chart_value(t) for t in ticks]
    return ticks, labels, scale


def _chart_2d(ax, kind, swap=False):
    x, y = _chart_label(ax.get_xlabel()), _chart_label(ax.get_ylabel())
    if swap:  # the category axis is "x" whichever way the bars or boxes lie
        x, y = y, x
    return {"type": kind, "title": _chart_label(ax.get_title()), "x_label": x, "y_label": y,
            "x_unit": _chart_unit(x), "y_unit": _chart_unit(y), "elements": []}


def _is_grid_line(line):
    xs, ys = line.get_xdata(), line.get_ydata()
    return len(xs) == 2 and len(ys) == 2 and (xs[0] == xs[1] or ys[0] == ys[1])


def _point_chart(ax, kind, series, budget):
    chart = _chart_2d(ax, kind)
    for which in ("x", "y"):
        ticks, labels, scale = _axis_info(ax, which)
        chart[which + "_ticks"], chart[which + "_tick_labels"] = ticks, labels
        chart[which + "_scale"] = scale
    for i, (label, xs, ys) in enumerate(series):
        budget[0] -= len(xs)
        if budget[0] < 0:
            raise _TooBig()
        if not label or label.startswith("_"):
            label = "%s %d" % ("Line" if kind == "line" else "Series", i)
        chart["elements"].append({"label": label, "points": [
            [_chart_value(a), _chart_value(b)] for a, b in zip(xs, ys)]})
    return chart


def _tick_label_at(ax, which, pos):
    """The tick label nearest pos on an axis (a bar's or box's category)."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    best, label = None, ""
    for loc, tick in zip(axis.get_ticklocs(), axis.get_ticklabels()):
        if best is None or abs(loc - pos) < best:
            best, label = abs(loc - pos), tick.get_text()
    return label


def _bar_chart(ax, budget):
    horizontal = any(getattr(c, "orientation", "vertical") == "horizontal"
                     for c in ax.containers)
    chart = _chart_2d(ax, "bar", swap=horizontal)
    for i, container in enumerate(ax.containers):
        group = container.get_label()
        if not group or group.startswith("_"):
            group = "Group %d" % i
        for rect in container:
            budget[0] -= 1
            if budget[0] < 0:
                raise _TooBig()
            if horizontal:
                where, value = rect.get_y() + rect.get_height() / 2, rect.get_width()
            else:
                where, value = rect.get_x() + rect.get_width() / 2, rect.get_height()
            chart["elements"].append({"label": _tick_label_at(ax, "y" if horizontal else "x",
                                                              where),
                                      "group": group, "value": _chart_value(value)})
    return chart


def _pie_chart(ax):
    chart = {"type": "pie", "title": _chart_label(ax.get_title()), "elements": []}
    for w in ax.patches:
        chart["elements"].append({"label": w.get_label(),
                                  "angle": round(abs(float(w.theta2) - float(w.theta1)), 8),
                                  "radius": _chart_value(w.r)})
    return chart


def _rects(ax):
    """The boxes of a box plot: the 5-point closed outlines of its lines (patch_artist
    False) or its patches' paths, as (x0, x1, y0, y1)."""
    out = []
    shapes = [line.get_xydata() for line in ax.lines if len(line.get_xdata()) == 5]
    shapes += [p.get_path().vertices for p in ax.patches if hasattr(p, "get_path")]
    for v in shapes:
        xs, ys = sorted(set(float(a) for a in v[:, 0])), sorted(set(float(b) for b in v[:, 1]))
        if len(xs) == 2 and len(ys) == 2 and len(v) >= 4:
            out.append((xs[0], xs[1], ys[0], ys[1]))
    return out


def _box_chart(ax, boxes):
    # Vertical boxes share their width; horizontal ones their height.
    vertical = len({round(b[1] - b[0], 9) for b in boxes}) == 1
    chart = _chart_2d(ax, "box_and_whisker", swap=not vertical)
    for x0, x1, y0, y1 in boxes:
        if not vertical:  # read a horizontal box as a vertical one
            x0, x1, y0, y1 = y0, y1, x0, x1
        e = {"label": _tick_label_at(ax, "x" if vertical else "y", (x0 + x1) / 2),
             "min": y0, "first_quartile": y0, "median": None, "third_quartile": y1,
             "max": y1, "outliers": []}
        for line in ax.lines:
            xs = [float(a) for a in line.get_xdata()]
            ys = [float(b) for b in line.get_ydata()]
            if not vertical:
                xs, ys = ys, xs
            if len(xs) == 5 or not xs or not all(x0 <= a <= x1 for a in xs):
                continue
            if line.get_linestyle() in ("None", "none", " ", ""):  # fliers: markers only
                e["outliers"] += ys
            elif len(ys) == 2 and ys[0] == ys[1] and y0 <= ys[0] <= y1 and len(set(xs)) == 2:
                e["median"] = ys[0]
            elif len(ys) == 2 and ys[0] != ys[1]:  # a whisker, from the box outwards
                e["min"], e["max"] = min(e["min"], *ys), max(e["max"], *ys)
        chart["elements"].append(e)
    return chart


def _axes_chart(ax, budget):
    import matplotlib.collections
    import matplotlib.container
    import matplotlib.patches
    lines = [line for line in ax.lines if not _is_grid_line(line)]
    bars = [c for c in ax.containers if isinstance(c, matplotlib.container.BarContainer)]
    if bars:
        return _bar_chart(ax, budget)
    if ax.patches and all(isinstance(p, matplotlib.patches.Wedge) for p in ax.patches):
        return _pie_chart(ax)
    boxes = _rects(ax)
    if boxes:
        return _box_chart(ax, boxes)
    points = [c for c in ax.collections if isinstance(c, matplotlib.collections.PathCollection)]
    if points and not lines:
        return _point_chart(ax, "scatter", [(c.get_label(), list(c.get_offsets()[:, 0]),
                                             list(c.get_offsets()[:, 1])) for c in points],
                            budget)
    if lines and not ax.collections and not ax.patches:
        return _point_chart(ax, "line", [(line.get_label(), line.get_xdata(),
                                          line.get_ydata()) for line in lines], budget)
    return {"type": "unknown", "title": _chart_label(ax.get_title()), "elements": []}


def _figure_chart(fig):
    """The figure's chart, or None (no data, too much of it, or not read)."""
    try:
        axes = [ax for ax in fig.get_axes() if ax.has_data()]
        if not axes:
            return None
        budget = [CHART_MAX_POINTS]
        if len(axes) == 1:
            return _wire_safe(_axes_chart(axes[0], budget))
        title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) else None
        return _wire_safe({"type": "superchart", "title": title or None,
                           "elements": [_axes_chart(ax, budget) for ax in axes]})
    except Exception:
        return None


def mime_bundle(obj):
    """Jupyter-style MIME bundle: text/plain always, rich forms where the object has them."""
    data = {}
    if _is_figure(obj):
        data["image/png"] = _figure_png(obj)  # draws it: tick labels exist from here on
        chart = _figure_chart(obj)
        if chart is not None:
            data[CHART_MIME] = chart
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

# ---- variables: checkpoint and restore ----
#
# A checkpoint file is a magic line, a JSON line, then one record per global, in the order
# of the namespace (the order names were first bound, so that what a global needs was
# restored before it):
#   u32 name length, name (UTF-8), u8 kind, u64 payload length, payload
# kinds: b"m" a module's name (imported again on restore); b"b" the bash shell's state, a
# script of declare/cd/alias lines (under the name "<bash>", after the globals: loaded into
# the next shell the kernel starts); b"s" the source of a top-level
# def or class statement, as JSON {"source"} (run again on restore: decorators, dataclasses
# and super() come back as they were); b"p" a pickle; b"c" a pickle holding code objects
# (lambdas and nested functions defined in cells, valid for this Python only). A name length
# of 0 ends the file. Each global is written on its own, so one that cannot be pickled is
# listed and skipped while the rest are kept. The daemon only copies these bytes: they are
# unpickled in a sandbox, never by the daemon.

CHECKPOINT_MAGIC = b"RUNCELL-VARIABLES 1\n"
_INTERNAL_NAMES = frozenset(("__builtins__", "__name__", "__doc__", "__loader__", "__spec__",
                             "__package__", "__warningregistry__"))
_EMPTY_CELL = "<runcell: empty cell>"


def _code_tag():
    import importlib.util
    return "%s %s" % (sys.implementation.cache_tag, importlib.util.MAGIC_NUMBER.hex())


# The rebuilder of functions pickled by value lives in a module of its own, so that a pickle
# names it _runcell_vars._make_function, importable in any kernel.
_vars_module = types.ModuleType("_runcell_vars")
sys.modules["_runcell_vars"] = _vars_module


def _make_function(code, name, qualname, defaults, kwdefaults, closure, attrs, doc):
    cells = None
    if closure is not None:
        cells = tuple(types.CellType() if v == _EMPTY_CELL else types.CellType(v)
                      for v in closure)
    fn = types.FunctionType(marshal.loads(code), sys.modules["__main__"].__dict__, name,
                            defaults, cells)
    fn.__qualname__ = qualname
    fn.__kwdefaults__ = kwdefaults
    fn.__doc__ = doc
    if attrs:
        fn.__dict__.update(attrs)
    return fn


_make_function.__module__ = "_runcell_vars"
_vars_module._make_function = _make_function


def _cell_value(cell):
    try:
        return cell.cell_contents
    except ValueError:
        return _EMPTY_CELL


def _var_pickler(f):
    """A pickler that pickles functions defined in cells by value (their code); everything
    else as pickle does (classes defined in cells by reference: their source is restored
    first). Its class is made at the first checkpoint: pickle is not imported before."""
    global _VarPickler
    if _VarPickler is None:
        import pickle

        class _VarPickler(pickle.Pickler):
            def __init__(self, f):
                super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
                self.has_code = False

            def reducer_override(self, obj):
                if not (isinstance(obj, types.FunctionType) and obj.__module__ == "__main__"):
                    return NotImplemented
                self.has_code = True
                closure = None
                if obj.__closure__ is not None:
                    closure = tuple(_cell_value(c) for c in obj.__closure__)
                return _make_function, (marshal.dumps(obj.__code__), obj.__name__,
                                        obj.__qualname__, obj.__defaults__, obj.__kwdefaults__,
                                        closure, dict(obj.__dict__) or None, obj.__doc__)
    return _VarPickler(f)


_VarPickler = None


def top_definitions(tree, code):
    """(name, source, is_class) of each top-level def and class statement of a cell."""
    lines = code.splitlines(True)
    defs = []
    for node in tree.body:
        if isinstance(node, (_ast.FunctionDef, _ast.AsyncFunctionDef, _ast.ClassDef)):
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            defs.append((node.name, "".join(lines[start - 1:node.end_lineno]),
                         isinstance(node, _ast.ClassDef)))
    return defs


def _defined_by(value, name, is_class):
    """Whether value is what a top-level `def name` / `class name` statement makes."""
    if is_class:
        return isinstance(value, type) and value.__module__ == "__main__" and \
            value.__qualname__ == name
    import inspect
    try:
        fn = inspect.unwrap(value)
    except Exception:
        return False
    return isinstance(fn, types.FunctionType) and fn.__module__ == "__main__" and \
        fn.__qualname__ == name


def _write_record(f, name, kind, write_payload):
    """Writes one record; write_payload(f) writes the payload (and may return another kind)
    or raises, in which case the file is cut back to where the record began."""
    start = f.tell()
    raw = name.encode("utf-8", "surrogatepass")
    f.write(struct.pack(">I", len(raw)) + raw)
    kind_pos = f.tell()
    f.write(kind + struct.pack(">Q", 0))
    try:
        other = write_payload(f)
    except BaseException:
        f.seek(start)
        f.truncate()
        raise
    if isinstance(other, bytes):
        kind = other
    end = f.tell()
    f.seek(kind_pos)
    f.write(kind + struct.pack(">Q", end - kind_pos - 9))
    f.seek(end)


def _reason(e):
    text = str(e) or type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _pickle_payload(value):
    def write(f):
        p = _var_pickler(f)
        p.dump(value)
        return b"c" if p.has_code else None
    return write


def _save_one(f, name, value, definitions, out):
    if isinstance(value, types.ModuleType):
        modname = getattr(value, "__name__", None)
        if not (isinstance(modname, str) and sys.modules.get(modname) is value):
            raise TypeError("a module that cannot be imported again by name")
        _write_record(f, name, b"m", lambda f: f.write(modname.encode()))
        out["modules"][name] = modname
        return
    d = definitions.get(name)
    if d is not None and _defined_by(value, name, d[1]):
        import json
        source = json.dumps({"source": d[0]}).encode()
        _write_record(f, name, b"s", lambda f: f.write(source))
    else:
        _write_record(f, name, b"p", _pickle_payload(value))
    out["saved"].append(name)


def checkpoint_variables(ns, definitions, path, extra=()):
    """extra: (name, kind, payload) records written after the globals (the bash shell's
    state, under a name no global can have)."""
    import json
    out = {"saved": [], "modules": {}, "skipped": []}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(CHECKPOINT_MAGIC)
        f.write(json.dumps({"python": sys.version.split()[0], "code": _code_tag()})
                .encode() + b"\n")
        for name, value in list(ns.items()):
            if name in _INTERNAL_NAMES:
                continue
            try:
                _save_one(f, name, value, definitions, out)
            except KeyboardInterrupt:
                raise
            except BaseException as e:  # noqa: B902 - a __reduce__ may raise anything
                kind = type(value)
                out["skipped"].append({"name": name,
                                       "type": "%s.%s" % (kind.__module__, kind.__qualname__),
                                       "reason": _reason(e)})
        for name, kind, payload in extra:
            _write_record(f, name, kind, lambda f, payload=payload: f.write(payload))
        f.write(struct.pack(">I", 0))
        out["bytes"] = f.tell()
    return out


def _read_exact_file(f, n):
    data = f.read(n)
    if len(data) != n:
        raise ValueError("the checkpoint file is cut short")
    return data


def _restore_one(f, ns, name, kind, length, same_code, definitions, out):
    import importlib
    if kind == b"m":
        ns[name] = importlib.import_module(_read_exact_file(f, length).decode())
        out["modules"].append(name)
        return
    if kind == b"s":
        source = json_loads(_read_exact_file(f, length))["source"]
        filename = "<restored %s>" % name
        _remember_source(filename, source)
        exec(compile(source, filename, "exec", dont_inherit=True), ns)
        tree = compile(source, filename, "exec", _ast.PyCF_ONLY_AST, dont_inherit=True)
        for dname, dsource, is_class in top_definitions(tree, source):
            definitions[dname] = (dsource, is_class)
    elif kind == b"c" and not same_code:
        raise ValueError("it holds code compiled by another Python version")
    elif kind in (b"p", b"c"):
        import pickle
        ns[name] = pickle.Unpickler(f).load()
    else:
        raise ValueError("unknown record kind %r" % kind)
    out["restored"].append(name)


def restore_variables(ns, definitions, path):
    out = {"restored": [], "modules": [], "failed": []}
    with open(path, "rb") as f:
        if f.read(len(CHECKPOINT_MAGIC)) != CHECKPOINT_MAGIC:
            raise ValueError("not a runcell variables checkpoint")
        header = json_loads(f.readline())
        same_code = header.get("code") == _code_tag()
        while True:
            (n,) = struct.unpack(">I", _read_exact_file(f, 4))
            if n == 0:
                break
            name = _read_exact_file(f, n).decode("utf-8", "surrogatepass")
            kind = _read_exact_file(f, 1)
            (length,) = struct.unpack(">Q", _read_exact_file(f, 8))
            end = f.tell() + length
            if kind == BASH_RECORD_KIND and name == BASH_RECORD_NAME:
                out["bash_snapshot"] = _read_exact_file(f, length)
                continue
            try:
                _restore_one(f, ns, name, kind, length, same_code, definitions, out)
            except KeyboardInterrupt:
                raise
            except BaseException as e:  # noqa: B902 - unpickling may raise anything
                out["failed"].append({"name": name,
                                      "reason": "%s: %s" % (type(e).__name__, _reason(e))})
            f.seek(end)
    return out


def _user_frames(tb):
    """A copy of the traceback chain tb without the kernel's frames."""
    kept = []
    while tb is not None:
        if tb.tb_frame.f_code.co_filename != KERNEL_FILE:
            kept.append(tb)
        tb = tb.tb_next
    out = None
    for t in reversed(kept):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


def _strip_chained(value):
    """Removes the kernel's frames from the exceptions chained to value (__cause__ and
    __context__), which format_exception prints from their own __traceback__."""
    seen = {id(value)}
    exc = value
    while exc is not None:
        nxt = exc.__cause__ if exc.__cause__ is not None else exc.__context__
        if nxt is None or id(nxt) in seen:
            return
        seen.add(id(nxt))
        try:
            nxt.__traceback__ = _user_frames(nxt.__traceback__)
        except Exception:
            pass
        exc = nxt


# ---- bash: one long-lived shell per kernel ----
#
# Bash cells run in one interactive bash (no job control, no line editing, no history),
# started at the first bash cell, so that variables, cwd, exports, functions and aliases
# carry over. The shell is interactive because only an interactive bash stops the whole
# command on SIGINT and goes back to reading the next one: a script would die of it, or
# with an INT trap go on with the rest of the cell.
#
# Nothing of the protocol goes through the cell's output. The kernel writes each cell to a
# file and two command lines to the shell's stdin (a pipe nothing else reads: every cell
# runs with stdin on /dev/null): one sources the file, the next reports $? with a nonce on
# a status pipe (a private fd, closed for the cell's commands). An interrupt that stops the
# first line also stops nothing after it, so the second still reports; and each interrupt
# the kernel forwards is followed by one more report line, in case the SIGINT cut a report
# short. Reports that carry another cell's nonce are stale and dropped. The shell's own
# stderr is /dev/null (its prompts, the newline it prints on SIGINT); cells get the real
# stderr from a private fd.

BASH_RECORD_NAME = "<bash>"  # its state in a checkpoint file: no global has this name
BASH_RECORD_KIND = b"b"
_BASH_SAVED_MAX = 1000  # entries of the list of what a snapshot holds, in a reply
_NAME_STARTS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_"
_BASH_FD_BASE = 200  # the shell's private fds: far above the ones scripts use (3-9, 10+)

_BASH_DRIVER = r'''
builtin set +o history +H +m
builtin unset HISTFILE PROMPT_COMMAND MAILCHECK MAIL MAILPATH
PS1= PS2= PS0= PS4='+ '
__runcell_done() {
    builtin printf '%s %d\n' "$1" "$?" >&@STATUS@
    builtin return 0  # a cell's $? does not outlive it: under set -e it would end the shell
}
__runcell_base=" @NAMES@ "
builtin declare -A __runcell_env
for __runcell_n in $__runcell_base; do  # the environment's values, as the shell got them
    [[ ${!__runcell_n@a} == *x* ]] && __runcell_env[$__runcell_n]=${!__runcell_n}
done
builtin unset __runcell_n
__runcell_snapshot() {
    builtin local - n IFS=$' \t\n'
    builtin set +eu +o pipefail +x  # the options a cell set, for this function only
    {
        builtin printf '# cwd %s\nbuiltin cd -- %q\n' "$PWD" "$PWD"
        for n in $(builtin compgen -v); do
            case $n in
            __runcell_* | BASH* | PWD | OLDPWD | SHLVL | _ | PIPESTATUS | FUNCNAME | \
            COLUMNS | LINES | HISTCMD | RANDOM | SRANDOM | SECONDS | LINENO | EPOCH* | \
            GROUPS | DIRSTACK | COMP_* | PPID | UID | EUID | SHELLOPTS) continue ;;
            esac
            # bash's own variables and the environment stay behind, unless a cell changed
            # or exported them (PATH=$PATH:...)
            if [[ $__runcell_base == *" $n "* ]]; then
                [[ ${!n@a} != *x* ]] && continue
                [[ ${__runcell_env[$n]+set} && ${__runcell_env[$n]} == "${!n}" ]] && continue
            fi
            builtin printf '# variable %s\n' "$n"
            builtin declare -p -- "$n"
        done
        for n in $(builtin compgen -A function); do
            [[ $n == __runcell_* ]] && continue
            builtin printf '# function %s\n' "$n"
            builtin declare -f -- "$n"
        done
        for n in $(builtin compgen -a); do
            builtin printf '# alias %s\n' "$n"
            builtin alias -- "$n"
        done
    } >"$1"
}
builtin readonly -f __runcell_done __runcell_snapshot  # a cell's unset -f would hang the next
'''


def _sh_quote(s):
    """s as one bash word: a path under $TMPDIR may hold spaces or quotes, and a quote left
    open would have the shell read the report line as part of the cell's."""
    return "'" + s.replace("'", "'\\''") + "'"


class ShellGone(Exception):
    """The shell exited (exit, set -e, a signal) while it ran a cell: status as $?."""

    def __init__(self, status):
        super().__init__(status)
        self.status = status


class BashShell:
    def __init__(self, cwd, tmpdir):
        import fcntl
        import subprocess
        # The sandbox's /tmp is its own: a fixed name reads well in bash's messages
        self.dir = os.path.join(os.path.abspath(tmpdir), ".runcell-bash")  # the shell cd's
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        st_r, st_w = os.pipe2(os.O_CLOEXEC)
        cmd_r, cmd_w = os.pipe2(os.O_CLOEXEC)
        self.status_fd, self.cmd_fd = st_r, cmd_w
        # pass_fds keeps numbers: the shell's ends go above the fds scripts use
        self.fd_status = fcntl.fcntl(st_w, fcntl.F_DUPFD_CLOEXEC, _BASH_FD_BASE)
        self.fd_err = fcntl.fcntl(2, fcntl.F_DUPFD_CLOEXEC, _BASH_FD_BASE)
        os.close(st_w)
        try:
            self.proc = subprocess.Popen(
                ["/bin/bash", "--norc", "--noprofile", "--noediting", "+m", "-i"],
                stdin=cmd_r, stderr=subprocess.DEVNULL, cwd=cwd, process_group=0,
                pass_fds=(self.fd_status, self.fd_err))
        finally:
            os.close(cmd_r)
            os.close(self.fd_status)
            os.close(self.fd_err)
        self.buf = b""
        self.count = 0
        self.environ = dict(os.environ)  # what the shell took; see environ_changes
        # the names of the variables the shell starts with: ${!A*} ${!B*} ... (no fork)
        names = " ".join("${!%s*}" % c for c in _NAME_STARTS)
        self.send(_BASH_DRIVER.replace("@STATUS@", str(self.fd_status)).replace("@NAMES@", names))

    def send(self, text):
        _write_all(self.cmd_fd, text.encode("utf-8", "surrogateescape"))

    def close_inherited(self):
        """A copy of the kernel lets go of the shell it inherited (the kernel's child, not
        its own): its pipes' ends close, nothing is waited for."""
        for fd in (self.status_fd, self.cmd_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.proc.returncode = 0  # never waited for here

    def interrupt(self):
        """SIGINT to the shell's process group (the shell and its foreground commands; its
        background jobs ignore it), then one more report line."""
        try:
            os.killpg(self.proc.pid, _signal.SIGINT)
            self.send("\\__runcell_done %s\n" % self.nonce)
        except OSError:
            pass  # it is gone: the status pipe says so

    def run(self, line):
        """Runs one command line and returns (its status, whether it was interrupted); raises
        ShellGone when the shell ends meanwhile. SIGINT (live) is forwarded to the shell."""
        self.nonce = os.urandom(8).hex()  # (secrets would load OpenSSL through hmac)
        interrupted = pending = sent = False
        while True:
            try:
                if not sent:
                    with _interrupts:  # a line cut short would garble the shell's input
                        sent = True
                        self.send("%s\n\\__runcell_done %s\n" % (line, self.nonce))
                if pending:
                    with _interrupts:
                        pending = False
                        self.interrupt()
                status = self._report()
                if status is not None:
                    return status, interrupted
                import select
                select.select([self.status_fd], [], [])
                with _interrupts:
                    data = os.read(self.status_fd, 4096)
                    self.buf += data
                if not data:
                    raise ShellGone(self._reap())  # outside: the wait is interruptible
            except KeyboardInterrupt:
                pending = interrupted = True
            except BrokenPipeError:
                raise ShellGone(self._reap())  # it ended before it read the line

    def _report(self):
        """The status of the current nonce's report, when one has come; stale ones go."""
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            nonce, _, status = line.decode("ascii", "replace").partition(" ")
            if nonce == self.nonce and status.isdigit():
                return int(status)
        if len(self.buf) > 4096:
            self.buf = b""  # not a report: someone wrote to the status fd
        return None

    def _reap(self):
        while True:
            try:
                code = self.proc.wait()
                break
            except KeyboardInterrupt:
                # the status pipe closed, yet the shell runs on: a cell exec'd a program
                try:
                    os.killpg(self.proc.pid, _signal.SIGINT)
                except OSError:
                    pass
        self.close()
        return code if code >= 0 else 128 - code

    def path(self, name):
        """A file of the shell's directory, made again if a cell deleted it (rm -rf /tmp/.*)."""
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        return os.path.join(self.dir, name)

    def environ_changes(self):
        """Commands that bring the shell's environment up to the kernel's os.environ: what
        Python changed since the shell started or was last told (a sandbox's envVars, set
        after a pooled session's shell started), as one line's prefix; "" for none."""
        now = dict(os.environ)
        if now == self.environ:
            return ""
        words = ["\\builtin unset -v %s;" % k for k in self.environ
                 if k not in now and k.isascii() and k.isidentifier()]
        words += ["\\builtin export %s;" % _sh_quote("%s=%s" % (k, v)) for k, v in now.items()
                  if self.environ.get(k) != v and k.isascii() and k.isidentifier()]
        self.environ = now
        return " ".join(words) + " "

    def run_cell(self, code):
        self.count += 1
        path = self.path("cell-%d" % self.count)
        with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(code)
        try:
            return self.run("%s\\builtin source %s </dev/null 2>&%d %d>&- %d>&-" % (
                self.environ_changes(), _sh_quote(path), self.fd_err, self.fd_err,
                self.fd_status))
        finally:
            try:
                os.unlink(path)
            except OSError:
                pass

    def snapshot(self):
        """The shell's state as a bash script (cwd, variables, functions, aliases)."""
        path = self.path("snapshot")
        try:
            status, interrupted = self.run("\\__runcell_snapshot %s" % _sh_quote(path))
            if interrupted:
                raise KeyboardInterrupt  # the daemon stops the checkpoint: it goes on
            if status:
                raise OSError("the shell's snapshot ended with status %d" % status)
            with open(path, "rb") as f:
                return f.read()
        finally:
            try:
                os.unlink(path)
            except OSError:
                pass

    def restore(self, script):
        path = self.path("restore")
        with open(path, "wb") as f:
            f.write(script)
        try:
            # what fails (a cwd whose directory was not kept: the store keeps files) is
            # said on the stderr of the cell that started the shell
            status, interrupted = self.run("\\builtin source %s </dev/null >/dev/null 2>&%d"
                                           % (_sh_quote(path), self.fd_err))
            if interrupted:
                raise KeyboardInterrupt  # the cell that started the shell is stopped
            return status
        finally:
            try:
                os.unlink(path)
            except OSError:
                pass

    def close(self):
        for fd in (self.status_fd, self.cmd_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.status_fd = self.cmd_fd = -1
        import shutil
        shutil.rmtree(self.dir, ignore_errors=True)


def _shell_error(status, what, lost=False):
    """The record of a bash cell that failed: exit_code is $? (128+N for a signal)."""
    if what is None:
        what = "exit status %d" % status
        if status > 128:
            what += " (signal %d, %s)" % (status - 128, _signal_name(status - 128))
    if lost:
        what += ("; the shell exited, so its variables, functions, aliases and working "
                 "directory are gone, and the next bash cell starts a new one")
    return {"name": "ShellError", "value": what, "traceback": "bash: " + what + "\n",
            "exit_code": status}


def _signal_name(n):
    try:
        import signal
        return signal.Signals(n).name
    except ValueError:
        return "unknown"


def _bash_saved(script):
    """What a snapshot holds, from its comment lines: ["cwd /x", "variable A", ...]."""
    out = []
    for line in script.split(b"\n"):
        if line.startswith(b"# "):
            if len(out) == _BASH_SAVED_MAX:
                out.append("...")  # all of it is in the snapshot; the list is for people
                break
            out.append(line[2:200].decode("utf-8", "replace"))
    return out


class Kernel:
    def __init__(self, channel):
        self.channel = channel
        self.count = 0
        self.stdout = FrameStream(channel, ord("O"), 1)
        self.stderr = FrameStream(channel, ord("E"), 2)
        self.main = types.ModuleType("__main__")
        self.main.__dict__["__builtins__"] = builtins
        self.ns = self.main.__dict__
        # name -> (source, is_class) of the def/class statement that made each global
        self.definitions = {}
        self.home = os.getcwd()  # the workspace: where the shell starts
        self.bash = None  # BashShell, from the first bash cell on
        self.bash_pending = None  # a restored snapshot, for the next shell to load
        self.sync = False  # the daemon answers sync messages (the request said so)
        self.pid = os.getpid()  # a process forked from the kernel's never syncs
        self.reserve = _memory_reserve()
        self.history = None  # _History, once a "history" request asked for one

    # -- output --
    def sync_output(self):
        """Called as the cell's code starts a program (subprocess, os.system, os.fork,
        os.posix_spawn): what the program writes goes to the pipes, which the daemon reads
        apart from this channel, so it could overtake what the cell printed just before.
        The cell's text is sent and the daemon confirms it has it first. Only from the
        cell's own thread, while its code runs, and when the daemon asked for it (other
        threads' programs run alongside the cell anyway)."""
        if (self.sync and _interrupts.live and os.getpid() == self.pid
                and _in_main_thread()):
            self.flush_streams()
            self.channel.sync()

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
        if issubclass(etype, MemoryError):
            # The cell's objects still hold what it took: the reserve makes room for the
            # report (formatting it imports traceback, which a lean start left out).
            self.reserve = None
        # Drop the kernel's own frames wherever they are: the traceback starts at the cell,
        # and the builtins the kernel provides (input) raise from kernel.py.
        tb = _user_frames(tb)
        _strip_chained(value)
        import traceback
        text = "".join(traceback.format_exception(etype, value, tb))
        err = {"name": etype.__name__, "value": str(value), "traceback": text}
        if isinstance(value, SyntaxError):
            err["lineno"] = value.lineno
            err["offset"] = value.offset
            err["value"] = value.msg
        return err

    # -- execution --
    def run_python(self, code, filename):
        _remember_source(filename, code)
        try:
            try:
                tree = compile(code, filename, "exec", _ast.PyCF_ONLY_AST, dont_inherit=True)
            except SyntaxError:
                # IPython's lines (!cmd, %magic, %%magic): rewritten, else the first error
                ipy = _ipython_transform(code)
                if ipy is None:
                    raise
                tree = compile(ipy, filename, "exec", _ast.PyCF_ONLY_AST, dont_inherit=True)
            last = None
            if tree.body and isinstance(tree.body[-1], _ast.Expr):
                last = _ast.Expression(tree.body.pop().value)
            flags = _ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
            body = compile(tree, filename, "exec", flags=flags, dont_inherit=True)
            expr = compile(last, filename, "eval", flags=flags, dont_inherit=True) if last else None
        except SyntaxError as e:
            return self.error_record(type(e), e, None, filename), None
        defs = top_definitions(tree, code)
        before = {name: self.ns.get(name) for name, _, _ in defs}
        try:
            self._eval(body)
            value = self._eval(expr) if expr is not None else None
        except BaseException as e:  # noqa: B902 - KeyboardInterrupt and SystemExit included
            return self.error_record(type(e), e, e.__traceback__, filename), e
        finally:
            self.note_definitions(defs, before)
        if value is not None:
            self.ns["_"] = value
            self.display(value, result=True)
            plt = sys.modules.get("matplotlib.pyplot")
            if plt is not None and _is_figure(value):
                plt.close(value)  # shown as the result: not a second time as an open figure
        return None, None

    def note_definitions(self, defs, before):
        """Remembers the source of the def/class statements that ran (for checkpoints)."""
        for name, source, is_class in defs:
            value = self.ns.get(name)
            if value is not before.get(name) and _defined_by(value, name, is_class):
                self.definitions[name] = (source, is_class)

    def _eval(self, code):
        try:
            _interrupts.live = True  # inside the try: no KeyboardInterrupt outside it
            if self.channel.interrupted():
                raise KeyboardInterrupt
            result = eval(code, self.ns)
            if code.co_flags & 0x80:  # CO_COROUTINE: the cell used top-level await
                import asyncio
                result = asyncio.run(result)
            return result
        finally:
            _interrupts.live = False
            _own_sigint()

    def run_bash(self, code):
        try:
            _interrupts.live = True  # inside the try, as in _eval
            if self.channel.interrupted():
                raise KeyboardInterrupt
            if "\0" in code:
                return _shell_error(2, "the cell holds a NUL character, which bash cannot "
                                       "run"), None
            status, interrupted = self.shell().run_cell(code)
        except KeyboardInterrupt as e:
            return self.error_record(KeyboardInterrupt, e, None, ""), None
        except ShellGone as gone:
            self.bash = None
            if gone.status == 0:  # `exit` that says success is one; the loss is still said
                _write_all(2, b"runcell: the shell exited (status 0), so its variables, "
                              b"functions, aliases and working directory are gone; the next "
                              b"bash cell starts a new one\n")
                return None, None
            return _shell_error(gone.status, None, lost=True), None
        except OSError as e:  # the shell could not start, or its cell file be written
            return _shell_error(126, "bash: %s" % e), None
        finally:
            _interrupts.live = False
        if interrupted and status:
            return {"name": "KeyboardInterrupt", "value": "bash was interrupted (exit status "
                    "%d); the shell and its state are kept" % status,
                    "traceback": "bash: interrupted\n", "exit_code": status}, None
        return (_shell_error(status, None), None) if status else (None, None)

    def shell(self):
        """The kernel's bash, started at its first bash cell, in the workspace."""
        if self.bash is not None and self.bash.proc.poll() is not None:
            # it ended between cells (a background job killed it, or a report under set -e)
            status = self.bash._reap()
            self.bash = None
            _write_all(2, ("runcell: the shell had exited (status %d) after the last bash cell; "
                           "this cell runs in a new one, without the old one's variables, "
                           "functions and working directory\n" % status).encode())
        if self.bash is None:
            with _interrupts:  # not half started
                self.bash = BashShell(self.home, os.environ.get("TMPDIR") or "/tmp")
        if self.bash_pending is not None:
            # a restored snapshot: into the new shell, or the one a pooled session started
            # before it was restored
            script, self.bash_pending = self.bash_pending, None
            self.bash.restore(script)
        return self.bash

    def execute(self, req):
        # The session numbers cells: after a kernel was lost, its successor goes on counting.
        count = req.get("execution_count")
        self.count = count if type(count) is int and count > 0 else self.count + 1
        reply = {"type": "done", "execution_count": self.count, "status": "ok", "error": None}
        exc = None
        try:
            add_user_site()
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
                reply["exit_code"] = _exit_status(exc.code)
            elif "exit_code" in err:
                reply["exit_code"] = err.pop("exit_code")
        try:
            self.flush_streams()
        except Exception:
            pass
        # Without an error, the reply holds nothing of the cell's.
        self.channel.send_json(reply, plain=not err)
        if self.reserve is None:
            self.reserve = _memory_reserve()  # once the cell's memory is free again

    def variables(self, req):
        """checkpoint or restore: the work runs with SIGINT live, so that the daemon can stop
        one that takes too long."""
        kind = req.get("type")
        reply = {"type": kind + "_done", "ok": True}
        try:
            _interrupts.live = True  # inside the try, as in _eval
            path = req.get("path", "")
            if kind == "checkpoint":
                extra = self.bash_checkpoint(reply)
                reply.update(checkpoint_variables(self.ns, self.definitions, path, extra))
            else:
                try:
                    reply.update(restore_variables(self.ns, self.definitions, path))
                finally:
                    os.unlink(path)
                script = reply.pop("bash_snapshot", None)
                if script is not None:
                    # loaded into the shell when the first bash cell starts it
                    self.bash_pending = script
                    reply["bash"] = _bash_saved(script)
        except BaseException as e:  # noqa: B902 - the kernel must answer whatever happened
            reply = {"type": kind + "_done", "ok": False,
                     "error": "%s: %s" % (type(e).__name__, _reason(e))}
        finally:
            _interrupts.live = False
        try:
            self.flush_streams()
        except Exception:
            pass
        self.channel.send_json(reply)

    def bash_checkpoint(self, reply):
        """The shell's state as checkpoint records (none when no shell ran); what it holds
        goes in the reply, as "bash"."""
        script = self.bash_pending
        if self.bash is not None:
            try:
                script = self.bash.snapshot()
            except ShellGone:
                self.bash, script = None, None
            except OSError as e:
                reply["bash_error"] = "the shell's state could not be saved: %s" % e
        if script is None:
            return ()
        reply["bash"] = _bash_saved(script)
        return ((BASH_RECORD_NAME, BASH_RECORD_KIND, script),)

    def serve(self):
        self.channel.send_json({"type": "hello", "python": sys.version.split()[0],
                                "pid": os.getpid(), "cwd": os.getcwd()})
        while True:
            kind, payload = self.channel.recv()
            if kind is None:
                return
            try:
                req = json_loads(payload)
            except ValueError:
                continue
            if req.get("type") == "execute":
                if self.history is not None and self.history.take(self):
                    self.resumed()
                    continue  # woken by an undo: the request that was about to run is done
                self.sync = req.get("sync") is True
                try:
                    self.execute(req)
                finally:
                    self.sync = False
                if self.history is not None:
                    self.history.fresh = False
                    if self.history.take(self):  # the state before the next cell
                        self.resumed()
            elif req.get("type") == "history":
                self.start_history(req.get("path", ""))
            elif req.get("type") == "undo":
                self.undo(req.get("path", ""))
            elif req.get("type") in ("checkpoint", "restore"):
                self.variables(req)
                if req.get("type") == "restore" and self.history is not None:
                    self.history.fresh = False
            elif req.get("type") == "set_home":
                self.set_home(req.get("path", ""))
                if self.history is not None:
                    self.history.fresh = False
            elif req.get("type") == "start_shell":
                self.start_shell()

    def start_history(self, depth):
        """Keeps the state before each of the next cells, depth of them (see _History)."""
        reply = {"type": "history_done", "ok": True}
        try:
            depth = int(depth)
            if depth < 0 or depth > 1000:
                raise ValueError("depth %d is out of range" % depth)
            if self.history is None and depth > 0:
                ctl_r, ctl_w = os.pipe()
                pid = _kernel_fork()
                if pid:
                    os.close(ctl_w)
                    _anchor(ctl_r, pid)  # never returns
                os.close(ctl_r)
                self.pid = os.getpid()
                self.history = _History(depth, ctl_w)
            elif self.history is not None:
                self.history.depth = depth
                while len(self.history.copies) > depth + 1:
                    self.history._drop(self.history.copies.pop(0))
        except (OSError, ValueError) as e:
            reply = {"type": "history_done", "ok": False, "error": str(e)}
        self.channel.send_json(reply)

    def undo(self, before):
        try:
            before = int(before)
        except ValueError:
            before = -1
        if self.history is None:
            reply = {"type": "undo_done", "ok": False, "kept": [],
                     "error": "this kernel keeps no history"}
        else:
            reply = self.history.undo(self, before)  # exits when it woke a copy
        self.channel.send_json(reply)

    def resumed(self):
        """The copy woken by an undo says so, and goes on as the kernel."""
        self.channel.send_json({"type": "undo_done", "ok": True, "execution_count": self.count,
                                "pid": os.getpid(),
                                "kept": [c[0] + 1 for c in self.history.copies]})

    def start_shell(self):
        """Starts the shell now, before its first cell (a session made ahead, in the pool):
        that cell, or command, then costs what a later one does."""
        reply = {"type": "start_shell_done", "ok": True}
        try:
            if self.bash is None:
                with _interrupts:
                    self.bash = BashShell(self.home, os.environ.get("TMPDIR") or "/tmp")
        except (OSError, ShellGone) as e:
            reply = {"type": "start_shell_done", "ok": False, "error": str(e)}
        self.channel.send_json(reply)

    def set_home(self, home):
        """HOME and the working directory become home (the workspace by another path), for
        the kernel, for its shell if one runs, and so for what they start."""
        reply = {"type": "set_home_done", "ok": True}
        try:
            os.chdir(home)
            os.environ["HOME"] = self.home = home
            if self.bash is not None:
                status, _ = self.bash.run("\\builtin cd -- %s && \\builtin export HOME=%s"
                                          % (_sh_quote(home), _sh_quote(home)))
                if status:
                    raise OSError("the shell could not enter %s (status %d)" % (home, status))
        except (OSError, ShellGone) as e:
            reply = {"type": "set_home_done", "ok": False, "error": str(e)}
        self.channel.send_json(reply)


def _memory_reserve():
    """Address space held for the report of a MemoryError (under an address-space limit,
    where a cell can take all there is): an anonymous mapping, never touched, so it costs no
    memory, only room. None when even that is not there."""
    import mmap
    try:
        return mmap.mmap(-1, 8 << 20)
    except (OSError, MemoryError):
        return None


def _sync_before_programs():
    """Wraps the ways Python code starts a program so that the kernel's sync_output runs
    first: os's now, subprocess's by the function returned.
    (A before-fork hook cannot raise the KeyboardInterrupt that stops a wait for the daemon,
    and subprocess forks without running the hooks.)"""
    def before(fn):
        def wrapper(*args, **kwargs):
            if _kernel is not None:
                _kernel.sync_output()
            return fn(*args, **kwargs)
        wrapper.__name__, wrapper.__qualname__ = fn.__name__, fn.__qualname__
        wrapper.__doc__, wrapper.__wrapped__ = fn.__doc__, fn
        return wrapper
    for name in ("fork", "system", "posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            setattr(os, name, before(getattr(os, name)))

    def patch_subprocess(module):
        module.Popen._execute_child = before(module.Popen._execute_child)
    return patch_subprocess  # for subprocess, once something imports it


def _exit_status(code):
    """The exit status SystemExit(code) stands for, as in CPython: None is 0, an int is
    itself, anything else (a message) is 1. An int too large for the record (CPython cannot
    convert it either) is -1, which a process reports as 255."""
    if code is None:
        return 0
    if isinstance(code, int):
        code = int(code)
        return code if -(1 << 31) <= code < (1 << 31) else -1
    return 1


_user_site_probe = None  # (the user site's deepest existing ancestor, its mtime_ns)
_user_site_of = (None, None)  # (PYTHONUSERBASE, the user site under it)


def add_user_site():
    """The user site (pip install --user) on sys.path once it exists. Checked before each
    cell, but by one stat of its deepest existing ancestor (a directory made below it
    changes its mtime), not of the missing path itself: the workspace is a tmpfs, which
    keeps no negative dentries, so each lookup of a missing name is a slow one."""
    global _user_site_probe, _user_site_of
    base = os.environ.get("PYTHONUSERBASE", "")
    if _user_site_of[0] != base:
        _user_site_of = (base, os.path.join(base, "lib", "python%d.%d" % sys.version_info[:2],
                                            "site-packages"))
    user_site = _user_site_of[1]
    if user_site in sys.path:
        return
    probe = _user_site_probe
    if probe is not None:
        try:
            if os.stat(probe[0]).st_mtime_ns == probe[1]:
                return
        except OSError:
            pass
    _user_site_probe = None
    d = user_site
    while d and d != os.path.dirname(d):  # the ancestor first: a change after it is seen
        d = os.path.dirname(d)
        try:
            _user_site_probe = (d, os.stat(d).st_mtime_ns)
            break
        except OSError:
            continue
    if os.path.isdir(user_site):
        _user_site_probe = None
        import site
        site.addsitedir(user_site)


def importlib_invalidate():
    add_user_site()
    import importlib
    importlib.invalidate_caches()


class _RetryAfterInvalidate:
    """Last on sys.meta_path: an import that every finder missed is looked for once more
    after the import system's caches are dropped. A directory's listing is cached until its
    mtime changes, and a file written within the same clock tick (a package installed, a
    module uploaded or written by a cell, in the workspace) leaves it unchanged. Dropping
    the caches before every cell did the same at ~30 us a cell with the data stack loaded;
    here only a miss pays."""

    def __init__(self):
        self.local = _thread._local()

    def find_spec(self, name, path=None, target=None):
        if getattr(self.local, "busy", False):
            return None
        self.local.busy = True
        try:
            importlib_invalidate()
            import importlib.machinery
            return importlib.machinery.PathFinder.find_spec(name, path, target)
        finally:
            self.local.busy = False


def _no_input(prompt=""):
    raise EOFError("input() is not available: code runs without a terminal or a user to "
                   "answer; pass data in files or variables instead")


def _patch_pyplot(module):
    """plt.show() displays the open figures (and closes them) instead of warning that Agg
    cannot show."""
    def show(*args, **kwargs):
        _kernel.flush_figures()
    module.show = show


def _display(*objs):
    """Shows each object as a result (a MIME bundle), like IPython's display()."""
    for obj in objs:
        _kernel.display(obj)


# ---- IPython's syntax and display, as Jupyter's users write them ----
#
# Cells written for Jupyter (and so for E2B, whose interpreter is one) use IPython's syntax:
# `!cmd` and `x = !cmd` run a shell command, `%pip install`, `%timeit`, `%time`, `%cd`, ...
# are line magics, `%%bash`, `%%timeit`, `%%writefile` cell magics. A cell that does not
# parse as Python has those lines rewritten into calls of __runcell_ipy__ (one line for one,
# so that tracebacks keep their line numbers) and is compiled again; valid Python is never
# touched. `import IPython` (and IPython.display, IPython.core.display) is a shim of the
# kernel's: display(), HTML, Markdown, Image, SVG, JSON, Latex, Javascript, clear_output,
# get_ipython() (None). Debian's IPython costs ~250 ms and ~500 modules to import, and
# without its shell its display() only prints a repr.

class UsageError(Exception):
    """A magic that does not exist, or was called wrong (IPython's name for it)."""


def _var_expand(cmd, ns):
    """IPython's expansion in shell lines: {expression} and $name from the namespace ($$ is
    a $); what cannot be expanded is left as it is."""
    import re

    def brace(m):
        try:
            return str(eval(m.group(1), ns))
        except Exception:
            return m.group(0)

    def dollar(m):
        if m.group(0) == "$$":
            return "$"
        return str(ns[m.group(1)]) if m.group(1) in ns else m.group(0)
    cmd = re.sub(r"\{([^{}]+)\}", brace, cmd)
    return re.sub(r"\$\$|\$([A-Za-z_]\w*)", dollar, cmd)


def _format_time(seconds):
    for unit, scale in (("s", 1.0), ("ms", 1e3), ("\u00b5s", 1e6), ("ns", 1e9)):
        if seconds >= 1.0 / scale or unit == "ns":
            return "%.3g %s" % (seconds * scale, unit)


class _IPythonLines:
    """What the rewritten lines call (builtins.__runcell_ipy__)."""

    def system(self, cmd, ns):
        import subprocess
        _kernel.flush_streams()
        code = subprocess.call(["/bin/bash", "-c", _var_expand(cmd, ns)],
                               stdin=subprocess.DEVNULL)
        ns["_exit_code"] = code

    def getoutput(self, cmd, ns):
        import subprocess
        p = subprocess.run(["/bin/bash", "-c", _var_expand(cmd, ns)], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        ns["_exit_code"] = p.returncode
        return p.stdout.decode("utf-8", "replace").splitlines()

    def magic(self, name, line, ns):
        fn = getattr(self, "line_" + name, None)
        if fn is None:
            raise UsageError("Line magic function `%%%s` not found (runcell knows %s)."
                             % (name, ", ".join("%" + n[5:] for n in dir(self)
                                                if n.startswith("line_"))))
        return fn(line.strip(), ns)

    def cell_magic(self, name, line, body, ns):
        fn = getattr(self, "cell_" + name, None)
        if fn is None:
            raise UsageError("Cell magic `%%%%%s` not found (runcell knows %s)."
                             % (name, ", ".join("%%" + n[5:] for n in dir(self)
                                                if n.startswith("cell_"))))
        return fn(line.strip(), body, ns)

    # -- line magics --
    def line_pip(self, line, ns):
        self.system("%s -m pip %s" % (sys.executable, line), ns)
        importlib_invalidate()
        print("Note: you may need to restart the kernel to use updated packages.")

    def line_conda(self, line, ns):
        raise UsageError("conda is not available here; use %pip install instead")

    def _timeit(self, line, body, ns):
        import shlex
        import timeit
        words = shlex.split(line)
        number = repeat = None
        while words and words[0] in ("-n", "-r", "-q", "-o"):
            flag = words.pop(0)
            if flag in ("-n", "-r") and words:
                value = int(words.pop(0))
                number, repeat = (value, repeat) if flag == "-n" else (number, value)
        setup, stmt = (" ".join(words), body) if body is not None else ("pass", " ".join(words))
        timer = timeit.Timer(stmt, setup or "pass", globals=ns)
        if number is None:
            number, _ = timer.autorange()
        runs = [t / number for t in timer.repeat(repeat or 7, number)]
        mean = sum(runs) / len(runs)
        std = (sum((r - mean) ** 2 for r in runs) / len(runs)) ** 0.5
        print("%s \u00b1 %s per loop (mean \u00b1 std. dev. of %d run%s, %d loop%s each)"
              % (_format_time(mean), _format_time(std), len(runs), "s" * (len(runs) != 1),
                 number, "s" * (number != 1)))

    def line_timeit(self, line, ns):
        self._timeit(line, None, ns)

    def _time(self, code, ns):
        t0, c0 = time.perf_counter(), time.process_time()
        tree = compile(code, "<timed>", "exec", _ast.PyCF_ONLY_AST)
        value = None
        if tree.body and isinstance(tree.body[-1], _ast.Expr):
            last = _ast.Expression(tree.body.pop().value)
            exec(compile(tree, "<timed>", "exec"), ns)
            value = eval(compile(last, "<timed>", "eval"), ns)
        else:
            exec(compile(tree, "<timed>", "exec"), ns)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        print("CPU times: total: %s\nWall time: %s" % (_format_time(cpu), _format_time(wall)))
        return value

    def line_time(self, line, ns):
        return self._time(line, ns)

    def line_matplotlib(self, line, ns):
        pass  # figures are shown inline already

    def line_load_ext(self, line, ns):
        pass  # autoreload and the like: nothing to load here

    line_reload_ext = line_autoreload = line_config = line_load_ext

    def line_cd(self, line, ns):
        os.chdir(os.path.expanduser(_var_expand(line, ns) or "~"))
        print(os.getcwd())

    def line_pwd(self, line, ns):
        return os.getcwd()

    def line_env(self, line, ns):
        if not line:
            return dict(os.environ)
        key, sep, value = line.partition("=") if "=" in line else line.partition(" ")
        if not sep:
            return os.environ.get(key.strip())
        os.environ[key.strip()] = _var_expand(value.strip(), ns)

    def line_sx(self, line, ns):
        return self.getoutput(line, ns)

    line_system = line_sx

    # -- cell magics --
    def cell_bash(self, line, body, ns):
        self.system(body, ns)

    cell_sh = cell_script = cell_bash

    def cell_timeit(self, line, body, ns):
        self._timeit(line, body, ns)

    def cell_time(self, line, body, ns):
        return self._time(body, ns)

    def cell_writefile(self, line, body, ns):
        append = line.startswith("-a ")
        name = os.path.expanduser(line[3:].strip() if append else line)
        with open(name, "a" if append else "w") as f:
            f.write(body if body.endswith("\n") else body + "\n")
        print("%s %s" % ("Appending to" if append else "Writing", name))

    def cell_html(self, line, body, ns):
        _display(_ipython_module("IPython.display").HTML(body))

    def cell_markdown(self, line, body, ns):
        _display(_ipython_module("IPython.display").Markdown(body))

    def reset(self):
        """The default context made new (E2B's restartCodeContext('default')): its names go,
        the figures close; the kernel, its shell, the other contexts and the programs beside
        stay."""
        ns = _kernel.ns
        for name in [n for n in ns if n not in ("__builtins__", "__name__")]:
            del ns[name]
        _kernel.definitions.clear()
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is not None:
            plt.close("all")


def _ipython_transform(code):
    """code with IPython's lines made calls, or None when it has none."""
    import re
    lines = code.split("\n")
    first = lines[0].lstrip() if lines else ""
    if first.startswith("%%"):
        name, _, args = first[2:].partition(" ")
        return "__runcell_ipy__.cell_magic(%r, %r, %r, globals())" % (
            name.strip(), args, "\n".join(lines[1:]))
    assign = re.compile(r"^(\s*)([A-Za-z_][\w.]*(?:\s*,\s*[A-Za-z_][\w.]*)*)\s*=\s*([!%])(.*)$")
    out, changed = [], False
    for line in lines:
        body = line.lstrip()
        indent = line[:len(line) - len(body)]
        m = assign.match(line)
        if m:
            call = ("__runcell_ipy__.getoutput(%r, globals())" % m.group(4) if m.group(3) == "!"
                    else "__runcell_ipy__.magic(%r, %r, globals())"
                    % tuple(m.group(4).partition(" ")[::2]))
            out.append("%s%s = %s" % (m.group(1), m.group(2), call))
        elif body.startswith("!"):
            out.append("%s__runcell_ipy__.system(%r, globals())" % (indent, body[1:]))
        elif body.startswith("%") and not body.startswith("%%"):
            name, _, args = body[1:].partition(" ")
            out.append("%s__runcell_ipy__.magic(%r, %r, globals())" % (indent, name, args))
        else:
            out.append(line)
            continue
        changed = True
    return "\n".join(out) if changed else None


def _ipython_module(name):
    """The shim's module name, made once (sys.modules keeps it)."""
    mod = sys.modules.get(name)
    if mod is None:
        import importlib
        mod = importlib.import_module(name)
    return mod


class _DisplayObject:
    """IPython.display's rich objects: data (or a file's, or a URL), shown by its repr."""

    def __init__(self, data=None, url=None, filename=None, metadata=None, **kwargs):
        if data is not None and isinstance(data, str) and filename is None and url is None \
                and type(self).__name__ == "Image" and os.path.exists(data):
            filename, data = data, None
        if filename is not None:
            with open(filename, "rb" if type(self).__name__ == "Image" else "r") as f:
                data = f.read()
        self.data, self.url, self.filename, self.metadata = data, url, filename, metadata

    def __repr__(self):
        return "<IPython.core.display.%s object>" % type(self).__name__


def _display_class(name, method, wrap=None):
    def fn(self):
        if self.data is None:
            return None
        return wrap(self.data) if wrap else self.data
    return type(name, (_DisplayObject,), {method: fn})


class _Image(_DisplayObject):
    def __init__(self, data=None, url=None, filename=None, format=None, embed=None,
                 width=None, height=None, **kwargs):
        super().__init__(data, url, filename)
        self.format = (format or (filename or url or "").rsplit(".", 1)[-1]).lower()
        if isinstance(self.data, bytes) and self.data[:3] == b"\xff\xd8\xff":
            self.format = "jpeg"
        elif isinstance(self.data, bytes) and self.data[:8] == b"\x89PNG\r\n\x1a\n":
            self.format = "png"
        self.width, self.height = width, height

    def _repr_png_(self):
        return self.data if isinstance(self.data, bytes) and self.format == "png" else None

    def _repr_jpeg_(self):
        ok = isinstance(self.data, bytes) and self.format in ("jpeg", "jpg")
        return self.data if ok else None

    def _repr_html_(self):
        if self.data is None and self.url:
            return '<img src="%s"/>' % self.url
        return None


_Image.__name__ = _Image.__qualname__ = "Image"


def _ipython_fill(module):
    """The shim's names in module (IPython, IPython.display or IPython.core.display)."""
    if module.__name__ in ("IPython", "IPython.core"):
        module.__path__ = []
        module.__version__ = "8.5.0+runcell"
        module.version_info = (8, 5, 0, "runcell")
        module.get_ipython = lambda: None
        if module.__name__ == "IPython":
            module.display = _display
        return
    for name, method, wrap in (("HTML", "_repr_html_", None),
                               ("Markdown", "_repr_markdown_", None),
                               ("Latex", "_repr_latex_", None),
                               ("Math", "_repr_latex_", lambda d: "$\\displaystyle %s$" % d),
                               ("SVG", "_repr_svg_", None), ("JSON", "_repr_json_", None),
                               ("Javascript", "_repr_javascript_", None)):
        setattr(module, name, _display_class(name, method, wrap))
    module.Image = _Image
    module.display = lambda *objs, **kwargs: _display(*objs)
    module.update_display = module.display
    module.clear_output = lambda wait=False: None
    module.DisplayObject = _DisplayObject


class _IPythonShim:
    """Meta-path finder: `import IPython` (and its display modules) is the kernel's shim."""
    NAMES = ("IPython", "IPython.display", "IPython.core", "IPython.core.display")

    def find_spec(self, name, path=None, target=None):
        if name not in self.NAMES:
            return None
        import importlib.util
        return importlib.util.spec_from_loader(name, self,
                                               is_package=name in ("IPython", "IPython.core"))

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        _ipython_fill(module)


# ---- undo: the kernel as it was before each of its last cells ----
#
# A "history" request turns the process the sandbox started into an anchor: it forks the
# kernel that goes on serving, and from then on only reaps, forwards the signals the
# sandbox's init sends it to whichever process is the kernel now, and at that kernel's end
# ends the same way (so init reports what the daemon expects). Before each cell the kernel
# forks a copy of itself that waits (copy-on-write: a copy costs the pages later cells
# change); an "undo" request wakes the copy taken before that cell, which answers and goes
# on as the kernel, while the kernel that got the request (and every newer copy) exits.
# What is not in a Python process does not go back: its shell restarts, threads a cell
# started are not in the copies, programs it started run on.

_snapshotting = False  # a fork of the kernel's own: the at-fork hooks leave it alone
_ANCHOR_FORWARDS = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT,
                    _signal.SIGUSR1, _signal.SIGUSR2)


def _kernel_fork():
    """fork() without the kernel's at-fork hooks (the child keeps the channel)."""
    global _snapshotting
    _snapshotting = True
    try:
        return _os_fork()
    finally:
        _snapshotting = False


def _anchor(ctl_r, live):
    """The anchor's life: never returns. ctl_r carries "PID\n" lines, each naming the new
    kernel (any process of the sandbox may write them: a wrong one only misdirects its own
    signals)."""
    import ctypes
    import select
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    keep = sorted({0, 1, 2, ctl_r})
    for lo, hi in zip(keep, keep[1:] + [1 << 20]):
        os.closerange(lo + 1, hi)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    _signal.set_wakeup_fd(wake_w)
    state = {"live": live}

    def forward(signum, frame):
        try:
            os.kill(state["live"], signum)
        except OSError:
            pass
    for sig in _ANCHOR_FORWARDS:
        _signal.signal(sig, forward)
    _signal.signal(_signal.SIGCHLD, lambda signum, frame: None)
    buf = b""
    while True:
        try:
            ready, _, _ = select.select([ctl_r, wake_r], [], [])
        except InterruptedError:
            ready = []
        if ctl_r in ready:
            data = os.read(ctl_r, 256)
            buf = (buf + data)[-256:]
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if line.strip().isdigit():
                    state["live"] = int(line)
        if wake_r in ready:
            try:
                os.read(wake_r, 256)
            except BlockingIOError:
                pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pid = 0
            if pid == 0:
                break
            if pid == state["live"]:
                if os.WIFSIGNALED(status):
                    sig = os.WTERMSIG(status)
                    for s_ in (sig,):
                        _signal.signal(s_, _signal.SIG_DFL)
                    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, [sig])
                    os.kill(os.getpid(), sig)
                os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


class _History:
    """The kernel's copies of itself, oldest first: (the count of the cells it had run, its
    pid, the write end of the pipe it waits on). At most depth of them. The copy of the
    state before the next cell is taken as soon as the last one is done (fresh), so that its
    fork (~1 ms with the data stack loaded) falls while the daemon sends the reply, not in
    the next cell; a request that changes the state in between (a restore, a new home) takes
    it again before that cell."""

    def __init__(self, depth, ctl_w):
        self.depth = depth
        self.ctl_w = ctl_w  # tells the anchor the kernel's pid
        self.copies = []
        self.fresh = False  # the newest copy is of the kernel as it is now

    def take(self, kernel):
        """Forks the copy of the kernel as it is now. Returns True in the copy once it is woken
        to go on as the kernel, False in the kernel."""
        if self.depth <= 0 or self.fresh:
            return False
        # Trimmed first: the copy inherits the list as it stands, and names no copy that is
        # gone. depth cells can be undone: the copies before each of them, and this one (the
        # state before the next cell).
        while len(self.copies) >= self.depth + 1:
            self._drop(self.copies.pop(0))
        r, w = os.pipe()
        pid = _kernel_fork()
        if pid == 0:
            os.close(w)
            return self._wait(kernel, r)
        os.close(r)
        self.copies.append((kernel.count, pid, w))
        self.fresh = True
        return False

    @staticmethod
    def _alive(pid):
        """Whether a copy still waits (one the out-of-memory killer took is gone)."""
        try:
            return os.waitpid(pid, os.WNOHANG) == (0, 0)
        except ChildProcessError:  # not this process's child: the anchor reaps it
            try:
                os.kill(pid, 0)
                return True
            except OSError:
                return False

    @staticmethod
    def _drop(copy):
        _, pid, w = copy
        try:
            os.kill(pid, _signal.SIGKILL)
            os.waitpid(pid, 0)
        except (OSError, ChildProcessError):
            pass  # gone already, or the anchor's to reap
        os.close(w)

    def _wait(self, kernel, r):
        """The copy's life until it is woken: it takes no signal the kernel would, dies
        first when the sandbox is out of memory, and reads its pipe: "resume", or end of
        file (its kernel gone: the copy too)."""
        for sig in _ANCHOR_FORWARDS:
            _signal.signal(sig, _signal.SIG_IGN)
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("1000")
        except OSError:
            pass
        try:
            word = os.read(r, 16)
        except OSError:
            word = b""
        if word != b"resume":
            os._exit(0)
        os.close(r)
        _signal.signal(_signal.SIGINT, _sigint_handler)
        _signal.signal(_signal.SIGTERM, _signal.SIG_DFL)
        kernel.pid = os.getpid()
        self.fresh = False
        # The shell was the kernel's child, in the state of its last cell: not this copy's.
        if kernel.bash is not None:
            kernel.bash.close_inherited()
            kernel.bash = None
        return True

    def undo(self, kernel, before):
        """Wakes the copy taken before cell `before` (the one with `before - 1` cells run) and
        exits; answers (in this kernel) only when there is no such copy."""
        at = [i for i, c in enumerate(self.copies) if c[0] == before - 1]
        if not at:
            kept = [c[0] + 1 for c in self.copies]
            return {"type": "undo_done", "ok": False, "kept": kept,
                    "error": "no state before cell %s is kept (this kernel keeps the state "
                             "before each of cells %s)" % (before, kept or "none")}
        i = at[0]
        count, pid, w = self.copies[i]
        if not self._alive(pid):
            del self.copies[i]
            return {"type": "undo_done", "ok": False, "kept": [c[0] + 1 for c in self.copies],
                    "error": "the state before cell %d was dropped to free memory (the "
                             "sandbox ran out of memory: copies go first)" % before}
        for copy in self.copies[i + 1:]:
            self._drop(copy)
        _write_all(self.ctl_w, b"%d\n" % pid)
        _write_all(w, b"resume")
        kernel.flush_streams()
        os._exit(0)


_kernel = None  # this process's Kernel, from main() on
_prepared = False


def _prepare():
    """What main() sets up the same way in every session. The template does it before it
    freezes its heap, so that its clones share it rather than each writing its own (~0.3 MB
    of pages); a kernel started afresh does it in main()."""
    global _prepared
    if _prepared:
        return
    _prepared = True
    # sys.stdin stays on fd 0, which the sandbox points at /dev/null.
    builtins.input = _no_input
    builtins.display = _display
    builtins.__runcell_ipy__ = _IPythonLines()
    sys.meta_path.insert(0, _IPythonShim())
    patches = {"matplotlib.pyplot": _patch_pyplot, "linecache": _fill_linecache,
               "subprocess": _sync_before_programs()}
    for name in list(patches):
        if name in sys.modules:  # imported ahead (by the template, or at start)
            patches.pop(name)(sys.modules[name])
    if patches:
        sys.meta_path.insert(0, _AfterImport(patches))
    # The workspace (cwd) is importable, as in Jupyter; the kernel's own directory is not.
    sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(KERNEL_FILE)]
    sys.path.insert(0, "")
    sys.meta_path.append(_RetryAfterInvalidate())


class _AfterImport:
    """Meta-path hook: runs a patch on a module once it is imported (patches: name -> fn of
    the module), for the modules the kernel adapts but does not import itself."""

    def __init__(self, patches):
        self.patches = patches

    def find_spec(self, name, path=None, target=None):
        patch = self.patches.get(name)
        if patch is None:
            return None
        import importlib.machinery
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader

        class Loader:
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                patch(module)

        spec.loader = Loader()
        return spec


def main(template_argv=False):
    global _kernel
    channel = Channel(CHANNEL_FD)
    kernel = _kernel = Kernel(channel)
    _signal.signal(_signal.SIGINT, _sigint_handler)
    sys.stdout, sys.stderr = kernel.stdout, kernel.stderr
    _prepare()
    # No caches are dropped here. A clone of the template keeps the template's directory
    # listings (of /usr, which its sandbox sees as the template did); each is checked
    # against its directory's mtime at every import, and a miss drops them all
    # (_RetryAfterInvalidate). Dropping them at start had every listing read again and the
    # old one freed: ~1 MB of the pages a clone shares with the template written.
    add_user_site()

    def after_fork_in_child():
        # A forked child (multiprocessing) writes to the real pipes, never to the channel,
        # and the programs it starts need no sync (the channel is not its to use). The
        # kernel's own forks (its copies for undo, its anchor) keep it all.
        if _snapshotting:
            return
        kernel.sync = False
        try:
            os.close(channel.fd)
        except OSError:
            pass
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
    os.register_at_fork(after_in_child=after_fork_in_child)
    sys.modules["__main__"] = kernel.main
    # Arguments given after the code (runcell run -c CODE ARGS...), as python -c has them.
    if not template_argv:
        sys.argv = ["-c"] + sys.argv[1:]
    kernel.serve()


# ---- the template: a kernel-to-be with the data stack imported, forked per session ----

TEMPLATE_PRELOAD = ["numpy", "pandas", "matplotlib", "matplotlib.pyplot", "openpyxl"]


def template_main():
    """Serves spawn requests from the daemon on fd 3 (a SOCK_SEQPACKET socket): each is a
    session sandbox configuration (JSON) with its fds, which the clone made for it reads; the
    reply names the clone's pid and carries its pidfd. The clone's child returns here as the
    session's kernel."""
    import gc
    import json
    import socket
    import threading
    t0 = time.monotonic()
    failed = {}
    for name in TEMPLATE_PRELOAD:
        try:
            __import__(name)
        except Exception as e:  # a missing package is reported, not fatal
            failed[name] = "%s: %s" % (type(e).__name__, e)
    sys.path.append(os.path.dirname(KERNEL_FILE))
    import _runcell_template
    _prepare()
    ctl = socket.socket(fileno=CHANNEL_FD)
    if threading.active_count() != 1:
        raise SystemExit("runcell template: a preloaded module started threads; cannot fork")
    _warm_up()
    gc.collect()
    gc.freeze()  # the imported heap stays shared with the sessions' kernels
    ctl.send(json.dumps({"type": "ready", "python": sys.version.split()[0],
                         "import_ms": round((time.monotonic() - t0) * 1000, 1),
                         "failed": failed}).encode())
    # The loop is C's (_runcell_template.serve): between two clones the template runs no
    # Python, which would write pages the last clone then kept as its own copies. It
    # returns None when the daemon closes the channel, and (env, argv) in a session's
    # kernel, which the clone made for it has read its request.
    request = _runcell_template.serve(CHANNEL_FD)
    if request is None:
        return
    # The session's kernel: the template's socket is already closed (forget it without
    # closing a reused fd), the rest is an ordinary kernel.
    ctl.detach()
    env, argv = request
    _set_environ(dict(e.split("=", 1) for e in env if "=" in e))
    sys.argv = ["-c"] + argv[2:]
    # The working directory is the session's (its lockdown entered it: /workspace or
    # /home/user, the same files).
    _reseed_after_clone()
    # The pages the first cell's path writes (shared with the template until then) are
    # written here, while the clone waits in the pool, rather than in the user's first cell.
    # Only a saving: a clone that cannot (no descriptor left under the session's limits)
    # starts as it did without.
    try:
        _warm_up(CLONE_WARM_UP_CELLS)
    except Exception:
        pass
    gc.collect()  # the throwaway kernel's cycles (the frozen heap is not traversed)
    main(template_argv=True)
    os._exit(0)


WARM_UP_CELLS = 64
CLONE_WARM_UP_CELLS = 1


def _warm_up(cells=WARM_UP_CELLS):
    """Runs a kernel on CELLS throwaway cells over a socketpair: in the template before it
    freezes its heap (WARM_UP_CELLS), and in each clone before its main loop (one: the
    pages of the per-cell path it shares with the template are written while it waits in
    the pool, not in the user's first cell). CPython 3.11 counts the calls of each
    function, then rewrites its bytecode in place (quickened, then specialised): without
    this, each session's kernel rewrote the code objects of its per-cell path (execute, mime_bundle,
    _wire_safe, the channel's) in the pages it shares with the template. Leaves nothing
    behind: the kernel and its namespace are dropped, the SIGINT handler its cells set is
    put back, and the cells' source and the user site's probe are forgotten."""
    global _user_site_probe
    import socket
    sigint = _signal.getsignal(_signal.SIGINT)
    here, there = socket.socketpair()
    try:
        request = json_dumps({"type": "execute", "code": "_ = 1\n_ + 1", "execution_count": 1})
        request = request.encode("utf-8")
        # ~6 kB in all, and the replies ~10 kB: both fit the socket's buffers
        there.sendall((struct.pack(">IB", len(request), ord("M")) + request) * cells)
        there.shutdown(socket.SHUT_WR)
        kernel = Kernel(Channel(os.dup(here.fileno())))
        kernel.serve()  # returns at the end of the requests
        os.close(kernel.channel.fd)
    finally:
        here.close()
        there.close()
        _signal.signal(_signal.SIGINT, sigint)
        _sources.pop("<cell 1>", None)
        if "linecache" in sys.modules:
            sys.modules["linecache"].cache.pop("<cell 1>", None)
        _user_site_probe = None  # the template's workspace, not a session's


def _set_environ(env):
    """os.environ becomes env, by single keys: os.environ.update(pairs) asks whether pairs
    is a Mapping, and that check (an ABC's, through every class registered with it) wrote
    ~0.5 MB of the pages a clone shares with the template."""
    for key in [k for k in os.environ if k not in env]:
        del os.environ[key]
    for key, value in env.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def _reseed_after_clone():
    """A clone starts with the template's generators, so without this every session would
    draw the same numbers: each one a user can reach gets a seed from the kernel's entropy.
    (default_rng(), uuid4, secrets and SystemRandom read os.urandom at each call already.)"""
    import random
    random.seed()  # also done by the fork hook random registers; said here for clarity
    np = sys.modules.get("numpy")
    if np is not None:
        # The legacy global RandomState (np.random.rand, pandas' sample) gets a whole MT19937
        # state from the kernel's entropy: np.random.seed() makes one through SeedSequence,
        # whose numpy arithmetic wrote ~0.4 MB of the pages the clone shares.
        np.random.set_state(("MT19937", np.frombuffer(os.urandom(624 * 4), np.uint32), 624))
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None:
        # Its name generator is renewed when the pid changes; a session's kernel may have
        # the template's pid (each is 2 in its own PID namespace).
        tempfile._name_sequence = None
    if "_ssl" in sys.modules:
        # OpenSSL also notices forks by the pid.
        import ssl
        ssl.RAND_add(os.urandom(32), 32.0)
    mp = sys.modules.get("multiprocessing.process")
    if mp is not None:
        mp.current_process().authkey = os.urandom(32)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--template"]:
        template_main()
    else:
        main()
