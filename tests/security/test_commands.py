"""Programs beside the cells (E2B's commands, src/session/procs.c, started by the sandbox's
process spawner, src/sandbox/helper/execd.c) attacked from inside: each has the payload's
whole lockdown and nothing more, cannot reach the spawner's channel, init or the host, and
what it does to the daemon (a flood of output, a fork bomb, a child that outlives it, more
programs than allowed) stays within the caps while the daemon answers everyone else. Runs
from fresh sandboxes and, under [template], from template-made ones."""
import base64
import json
import os
import time
import unittest

from rctest import HANG, RuncellTestCase, Server, wait_until
from seclib import PRELUDE

MiB = 1 << 20


def server_args(*extra):
    return (() if os.environ.get("RUNCELL_TEMPLATE") else ("--no-template",)) + extra


def envelope(msg, flags=0):
    body = json.dumps(msg).encode()
    return bytes([flags]) + len(body).to_bytes(4, "big") + body


def proc_status(pid):
    with open("/proc/%d/status" % pid) as f:
        return {k: int(v.split()[0]) * 1024 for k, v in
                (line.split(":", 1) for line in f) if v.strip().endswith("kB")}


class Command:
    """One process.Process/Start stream, read envelope by envelope."""

    def __init__(self, srv, h, argv, stdin=False, timeout_ms=None):
        self.conn = srv.connection()
        headers = dict(h, **{"Content-Type": "application/connect+json"})
        if timeout_ms:
            headers["Connect-Timeout-Ms"] = str(timeout_ms)
        msg = {"process": {"cmd": argv[0], "args": argv[1:]}, "stdin": stdin}
        self.conn.request("POST", "/process.Process/Start", body=envelope(msg), headers=headers)
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200, self.resp.status
        first = self.frame()
        self.pid = first[1].get("event", {}).get("start", {}).get("pid")
        self.error = first[1].get("error")

    def frame(self):
        head = self.resp.read(5)
        if len(head) < 5:
            return None
        return head[0], json.loads(self.resp.read(int.from_bytes(head[1:], "big")))

    def rest(self):
        """stdout, stderr, and the end (the EndEvent or the stream's error)."""
        out, err, end = b"", b"", None
        while True:
            f = self.frame()
            if f is None or f[0] & 2:
                end = end or (f[1] if f else None)
                break
            ev = f[1]["event"]
            if "data" in ev:
                d = ev["data"]
                if "stdout" in d:
                    out += base64.b64decode(d["stdout"])
                else:
                    err += base64.b64decode(d["stderr"])
            elif "end" in ev:
                end = ev["end"]
        self.conn.close()
        return out, err, end

    def close(self):
        self.conn.close()


class Commands(RuncellTestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = Server(*server_args("--e2b", "--pool", "0")).start()

    @classmethod
    def tearDownClass(cls):
        cls.srv.close()

    def box(self):
        return self.srv.e2b_box(self)

    def rpc(self, h, method, msg):
        return self.srv.request("POST", "/process.Process/" + method, msg, token=False,
                                headers=dict(h, **{"Content-Type": "application/json"}))

    def run_cmd(self, h, script, **kw):
        return Command(self.srv, h, ["/bin/bash", "-c", script], **kw).rest()

    def cell(self, h, code):
        r = self.srv.request("POST", "/execute", {"code": code}, headers=h, token=False)
        msgs = [json.loads(line) for line in r.body.splitlines()]
        return "".join(m.get("text", "") for m in msgs if m["type"] == "stdout")

    def assertAnswering(self):
        self.assertEqual(self.srv.request("GET", "/healthz", token=False).status, 200)

    def test_a_command_has_the_payloads_lockdown_and_nothing_more(self):
        h = self.box()
        # a listener a cell opens on the sandbox's loopback: the command shares its network
        self.assertEqual(self.cell(h, "import socket\nlsn = socket.socket()\n"
                                      "lsn.bind(('127.0.0.1', 7070))\nlsn.listen()\n"
                                      "print('listening')"), "listening\n")
        probe = PRELUDE + r'''
import signal, socket
def status(pid, key):
    for line in open("/proc/%s/status" % pid):
        if line.startswith(key + ":"):
            return line.split()[1]
def comm(pid):
    try:
        return open("/proc/%d/comm" % pid).read().strip()
    except OSError:
        return ""
pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
spawner = [p for p in pids if comm(p) == "runcell-exec"]
kernel = [p for p in pids if comm(p) == "python3" and p != os.getpid() and p != os.getppid()]
def connect(port):
    s = socket.socket()
    s.settimeout(5)
    return oserr(s.connect, ("127.0.0.1", port))
report({"uid": os.getuid(), "caps": status("self", "CapEff"), "bnd": status("self", "CapBnd"),
        "nnp": status("self", "NoNewPrivs"), "seccomp": status("self", "Seccomp"),
        "fds": sorted(int(n) for n in os.listdir("/proc/self/fd")),
        "init_fds": oserr(os.listdir, "/proc/1/fd"),
        "init_mem": oserr(open, "/proc/1/mem", "rb"),
        "spawner": len(spawner),
        "spawner_fds": oserr(os.listdir, "/proc/%d/fd" % spawner[0]) if spawner else None,
        "spawner_mem": oserr(open, "/proc/%d/mem" % spawner[0], "rb") if spawner else None,
        "ptrace": sc(101, 16, spawner[0] if spawner else 1, 0, 0),
        "kill_init": oserr(os.kill, 1, 0),
        "kill_kernel": oserr(os.kill, kernel[0], 0) if kernel else "no kernel",
        "etc": oserr(open, "/etc/runcell-probe", "w"),
        "unshare": sc(272, 0x10000000),
        "cell_listener": connect(7070), "host_port": connect(HOST_PORT)})
'''.replace("HOST_PORT", str(self.srv.port))
        out, err, end = self.run_cmd(h, "exec python3 -c " + _sh(probe))
        self.assertEqual(end["exitCode"], 0, (out, err))
        res = json.loads(out.decode().strip().splitlines()[-1])
        self.assertEqual(res["uid"], 1000)
        self.assertEqual((res["caps"], res["bnd"], res["nnp"], res["seccomp"]),
                         ("0000000000000000", "0000000000000000", "1", "2"))
        self.assertEqual(res["fds"][:3], [0, 1, 2])
        self.assertLessEqual(len(res["fds"]), 4, res["fds"])  # 0-2 and the listing's own
        self.assertEqual(res["init_fds"], "EACCES")
        self.assertEqual(res["init_mem"], "EACCES")
        self.assertEqual(res["spawner"], 1, res)
        self.assertEqual(res["spawner_fds"], "EACCES")  # undumpable: its channel is its own
        self.assertEqual(res["spawner_mem"], "EACCES")
        self.assertEqual(res["ptrace"], "EPERM")
        self.assertEqual(res["kill_init"], "EPERM")
        self.assertIn(res["etc"], ("EROFS", "EACCES"))
        self.assertEqual(res["unshare"], "EPERM")
        self.assertEqual(res["cell_listener"], "ok")
        self.assertEqual(res["host_port"], "ECONNREFUSED")
        # Killing the spawner (same user, same Landlock domain: allowed) only stops it; init
        # starts another at the next request.
        out, _, end = self.run_cmd(h, "pkill -KILL -x runcell-exec; echo tried")
        self.assertEqual(out, b"tried\n")  # read to its end, though its spawner went
        self.assertEqual(end["status"], "lost")
        out, _, end = self.run_cmd(h, "echo again")
        self.assertEqual((out, end["exitCode"]), (b"again\n", 0))

    def test_a_flood_of_output_is_read_within_its_bounds(self):
        h = self.box()
        pid = self.srv.pid
        before = proc_status(pid)["VmRSS"]
        with open("/proc/%d/clear_refs" % pid, "w") as f:
            f.write("5")
        flood = Command(self.srv, h, ["/bin/bash", "-c", "cat /dev/zero"])
        # Nobody reads its stream for now: the daemon reads the pipe all the same, keeping only
        # the last MiB of it, and stops reading past SESSION_PROC_OUTPUT_MAX.
        out, _, end = self.run_cmd(h, "echo beside")  # a command beside it answers, and a cell
        self.assertEqual(out, b"beside\n")
        self.assertEqual(self.cell(h, "print(6 * 7)"), "42\n")
        said = b""
        while b"is not read" not in said:
            f = flood.frame()
            self.assertIsNotNone(f, "the flood's stream ended")
            said += base64.b64decode(f[1]["event"].get("data", {}).get("stderr", ""))
        self.assertIn(b"output was dropped before it was read", said)
        r = self.rpc(h, "SendSignal", {"process": {"pid": flood.pid}, "signal": "SIGNAL_SIGKILL"})
        self.assertEqual(r.status, 200, r)
        _, _, end = flood.rest()
        self.assertEqual(end["status"], "signal: killed")
        growth = proc_status(pid)["VmHWM"] - before
        self.assertLess(growth, 96 * MiB)
        self.assertAnswering()

    def test_a_fork_bomb_in_a_command_stays_in_its_sandbox(self):
        h = self.box()
        # It runs on past its timeout, which kills it with its process group: every copy.
        bomb = Command(self.srv, h, ["/bin/bash", "-c", "b() { b | b & }; b; sleep 600"],
                       timeout_ms=3000)
        _, _, end = bomb.rest()
        self.assertEqual(end["error"]["code"], "deadline_exceeded", end)
        self.assertAnswering()
        # The sandbox recovers: its pids come back as the group dies.
        self.assertTrue(wait_until(lambda: self.run_cmd(h, "echo ok")[0] == b"ok\n"))
        self.assertEqual(self.cell(h, "print('cell')"), "cell\n")

    def test_a_child_that_outlives_its_command_does_not_hold_it(self):
        h = self.box()
        t0 = time.monotonic()
        out, _, end = self.run_cmd(h, "(setsid sleep 313.25 &); echo left")
        self.assertEqual((out, end["exitCode"]), (b"left\n", 0))
        self.assertLess(time.monotonic() - t0, HANG)
        # the orphan lives in the sandbox, and goes with it
        self.assertIn("313.25", self.run_cmd(h, "ps -eo args")[0].decode())
        sid = h["E2b-Sandbox-Id"]
        self.srv.request("DELETE", "/sandboxes/" + sid, headers={"X-API-KEY": self.srv.token},
                         token=False)
        self.assertTrue(wait_until(lambda: not _host_processes("sleep 313.25")))

    def test_a_program_has_at_most_16_readers_at_once(self):
        """Its Start stream and 15 Connects read it at once; a 17th reader is refused with
        resource_exhausted, saying so."""
        h = self.box()
        cmd = Command(self.srv, h, ["/bin/sleep", "600"])
        self.assertIsNone(cmd.error)

        def connect():
            conn = self.srv.connection()
            conn.request("POST", "/process.Process/Connect",
                         body=envelope({"process": {"pid": cmd.pid}}),
                         headers=dict(h, **{"Content-Type": "application/connect+json"}))
            resp = conn.getresponse()
            self.assertEqual(resp.status, 200)
            head = resp.read(5)
            return conn, head[0], json.loads(resp.read(int.from_bytes(head[1:], "big")))
        readers = [connect() for _ in range(15)]
        for _, flags, frame in readers:
            self.assertFalse(flags & 2, frame)  # its start: it reads
        conn, flags, frame = connect()
        self.assertTrue(flags & 2, frame)  # the stream's end, with the error
        self.assertEqual(frame["error"]["code"], "resource_exhausted", frame)
        self.assertIn("has its maximum of 16 readers", frame["error"]["message"])
        conn.close()
        for c, _, _ in readers:
            c.close()
        cmd.close()
        self.assertAnswering()

    def test_programs_past_the_cap_are_refused(self):
        h = self.box()
        held = [Command(self.srv, h, ["/bin/sleep", "600"]) for _ in range(64)]
        for c in held:
            c.close()
        extra = Command(self.srv, h, ["/bin/sleep", "600"])
        self.assertEqual(extra.error["code"], "resource_exhausted", extra.error)
        self.assertIn("maximum of 64", extra.error["message"])
        big = Command(self.srv, h, ["/bin/echo", "x" * (200 << 10)])
        self.assertEqual(big.error["code"], "resource_exhausted", big.error)
        extra.close()
        big.close()
        procs = self.rpc(h, "List", {}).json()["processes"]
        self.assertEqual(len(procs), 64)
        self.assertAnswering()


HOSTILE_SERVER = r"""
import socket, sys, threading
lsn = socket.socket()
lsn.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lsn.bind(("127.0.0.1", 8080))
lsn.listen(16)
print("listening", flush=True)
def serve(c):
    head = b""
    while b"\r\n\r\n" not in head:
        head += c.recv(4096)
    path = head.split(b" ")[1].split(b"?")[0]
    if path == b"/inject":
        c.sendall(b"HTTP/1.1 200 OK\r\nX-Ok: fine\r\nX-Bad: a\rSet-Cookie: stolen=1\r\n"
                  b"Bad Name: x\r\nContent-Length: 2\r\n\r\nok")
    elif path == b"/huge-head":
        c.sendall(b"HTTP/1.1 200 OK\r\n" + b"X-Fill: " + b"a" * 200000 + b"\r\n\r\n")
    elif path == b"/endless":
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
        try:
            while True:
                c.sendall(b"x" * 65536)
        except OSError:
            pass
    elif path == b"/echo":
        c.sendall(b"HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(head), head))
    c.close()
while True:
    c, _ = lsn.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


class Previews(RuncellTestCase):
    """A sandbox's port reached through its host PORT-ID.DOMAIN: the server behind it is the
    sandbox's, so what it answers is hostile."""

    def test_a_hostile_server_behind_a_preview_host(self):
        with Server(*server_args("--e2b", "--e2b-domain", "box.test", "--pool", "0")) as srv:
            r = srv.request("POST", "/sandboxes", {}, headers={"X-API-KEY": srv.token},
                            token=False)
            b = r.json()
            self.assertEqual(b["domain"], "box.test")
            sid = b["sandboxID"]
            h = {"E2b-Sandbox-Id": sid, "X-Access-Token": b["envdAccessToken"]}
            server = Command(srv, h, ["/usr/bin/python3", "-c", HOSTILE_SERVER])
            f = server.frame()
            self.assertIn("stdout", f[1]["event"]["data"], f)  # "listening"
            host = {"Host": "8080-%s.box.test" % sid}
            r = srv.request("GET", "/echo?q=1&x=%2F", headers=host, token=False)
            self.assertEqual(r.status, 201, r)
            self.assertIn(b"GET /echo?q=1&x=%2F HTTP/1.1", r.body)  # the URI as sent
            self.assertIn(("Host: 8080-%s.box.test" % sid).encode(), r.body)
            self.assertNotIn(b"Authorization", r.body)
            r = srv.request("GET", "/inject", headers=host, token=False)
            self.assertEqual((r.status, r.body), (200, b"ok"))
            self.assertEqual(r.headers["X-Ok"], "fine")
            self.assertIsNone(r.headers.get("Set-Cookie"))  # a CR in a line splits nothing
            self.assertIsNone(r.headers.get("X-Bad"))
            r = srv.request("GET", "/huge-head", headers=host, token=False)
            self.assertEqual(r.status, 502, r)
            self.assertIn(b"64 KiB", r.body)
            # an endless body, read slowly: the daemon holds a bounded buffer of it
            pid = srv.pid
            before = proc_status(pid)["VmRSS"]
            conn = srv.connection()
            conn.request("GET", "/endless", headers=host)
            resp = conn.getresponse()
            self.assertEqual(resp.status, 200)
            got = 0
            while got < 64 * MiB:
                got += len(resp.read(1 << 20))
            conn.close()
            self.assertLess(proc_status(pid)["VmHWM"] - before, 96 * MiB)
            # a WebSocket upgrade is refused, saying so; another host is runcell's own
            r = srv.request("GET", "/", headers=dict(host, Upgrade="websocket",
                                                     Connection="Upgrade"), token=False)
            self.assertEqual(r.status, 501, r)
            self.assertIn(b"WebSocket", r.body)
            r = srv.request("GET", "/health", token=False, headers={
                "Host": "49983-%s.box.test" % sid, "X-Access-Token": b["envdAccessToken"]})
            self.assertEqual(r.status, 204, r)  # envd's own route, the sandbox from the host
            r = srv.request("GET", "/", headers={"Host": "8080-nosuch.box.test"}, token=False)
            self.assertEqual(r.status, 502, r)
            self.assertEqual(srv.request("GET", "/healthz", token=False).status, 200)
            server.close()


def _sh(s):
    return "'" + s.replace("'", "'\\''") + "'"


def _host_processes(needle):
    found = []
    for p in os.listdir("/proc"):
        try:
            with open("/proc/%s/cmdline" % p, "rb") as f:
                if needle.encode() in f.read().replace(b"\0", b" "):
                    found.append(p)
        except OSError:
            pass
    return found


if __name__ == "__main__":
    unittest.main()
