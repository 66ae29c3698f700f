"""A TCP proxy on 127.0.0.1 for fault tests and benches: it passes bytes to an upstream
address, adds a delay to what the upstream answers (a slow store: each answer reaches the
client that much later; what the client sent has arrived, as on a slow network, and a client
that gave up meanwhile does not know whether it was done), and can be paused (a store cut off: the connections it carries
are cut, new ones are accepted and then held without a byte read, as a network that drops
everything would hold them; once resumed, the held ones are closed unanswered and new ones
pass again). It counts the requests it passed."""
import select
import socket
import threading
import time

from rctest import free_port


class TcpProxy:
    def __init__(self, upstream_port, upstream_host="127.0.0.1"):
        self.upstream = (upstream_host, upstream_port)
        self.port = free_port()
        self.delay = 0.0
        self.requests = 0  # bursts of client bytes passed (about one per HTTP request)
        self._open = threading.Event()
        self._open.set()
        self._stop = False
        self._lock = threading.Lock()
        self._conns = []
        self._srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._srv.bind(("127.0.0.1", self.port))
        self._srv.listen(4096)
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def endpoint(self):
        return "http://127.0.0.1:%d" % self.port

    def pause(self):
        """Nothing passes from now on (a store cut off)."""
        self._open.clear()
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def resume(self):
        self._open.set()

    def set_delay(self, seconds):
        self.delay = seconds

    def close(self):
        self._stop = True
        self._open.set()
        try:
            self._srv.close()
        except OSError:
            pass
        with self._lock:
            for s in self._conns:
                try:
                    s.close()
                except OSError:
                    pass

    def _accept(self):
        while not self._stop:
            try:
                c, _ = self._srv.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        if not self._open.is_set():
            # Held: nothing is read. Its client times out; what it sent never arrives.
            self._open.wait()
            c.close()
            return
        if self._stop:
            c.close()
            return
        try:
            u = socket.create_connection(self.upstream, timeout=10)
        except OSError:
            c.close()
            return
        u.settimeout(None)
        with self._lock:
            self._conns += [c, u]
        asked = threading.Event()  # the client sent a request its answer has not begun for
        threading.Thread(target=self._pump, args=(u, c, False, asked), daemon=True).start()
        self._pump(c, u, True, asked)

    def _pump(self, src, dst, from_client, asked):
        """Copies src to dst. Each burst from the client (its first bytes after a quiet spell)
        counts as a request; the first bytes of each answer wait self.delay."""
        last = 0.0
        try:
            while True:
                r, _, _ = select.select([src], [], [], 0.5)
                if self._stop:
                    break
                if not r:
                    continue
                data = src.recv(65536)
                if not data or not self._open.is_set():
                    break
                now = time.monotonic()
                if from_client:
                    if now - last > 0.005:
                        with self._lock:
                            self.requests += 1
                    asked.set()
                elif asked.is_set():
                    asked.clear()
                    if self.delay:
                        time.sleep(self.delay)
                last = time.monotonic()
                dst.sendall(data)
        except (OSError, ValueError):  # cut by pause(), or closed by the other pump
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except (OSError, ValueError):
                pass
        if from_client:  # the client's side closes both
            with self._lock:
                for s in (src, dst):
                    if s in self._conns:
                        self._conns.remove(s)
            for s in (src, dst):
                s.close()
