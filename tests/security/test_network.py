"""Network attacks: reaching services on the host's loopback, its other addresses, or its
abstract unix sockets from inside the sandbox (which has its own network namespace with
only a loopback interface)."""
import fcntl
import socket
import struct
import unittest
import uuid

from seclib import probe
from rctest import RuncellTestCase

SIOCGIFADDR = 0x8915


def host_ipv4_addresses():
    """The host's IPv4 addresses other than loopback."""
    addrs = []
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            try:
                req = struct.pack("256s", name.encode()[:15])
                addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), SIOCGIFADDR, req)[20:24])
            except OSError:
                continue
            if not addr.startswith("127."):
                addrs.append(addr)
    finally:
        s.close()
    return addrs


class Listener:
    """A TCP server on the host, counting connections without blocking."""

    def __init__(self, host):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]

    def accepted(self):
        n = 0
        while True:
            try:
                c, _ = self.sock.accept()
            except BlockingIOError:
                return n
            c.close()
            n += 1

    def close(self):
        self.sock.close()


CONNECT = """
import socket
def connect(host, port, family=socket.AF_INET):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(10)
    try:
        s.connect((host, port))
        return "connected"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e))
    finally:
        s.close()
"""


class HostServices(RuncellTestCase):
    def test_service_on_host_loopback_is_unreachable(self):
        srv = Listener("127.0.0.1")
        self.addCleanup(srv.close)
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind(("127.0.0.1", 0))
        udp.setblocking(False)
        self.addCleanup(udp.close)
        # Control: the service is up and reachable from the host.
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10):
            pass
        self.assertEqual(srv.accepted(), 1)
        res, _ = probe(self, CONNECT + """
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
report({"tcp": connect("127.0.0.1", PORT), "tcp_localhost": connect("localhost", PORT),
        "tcp6": connect("::1", PORT, socket.AF_INET6),
        "udp_sent": u.sendto(b"hello host", ("127.0.0.1", UDPPORT))})
""".replace("UDPPORT", str(udp.getsockname()[1])).replace("PORT", str(srv.port)))
        self.assertEqual(res["tcp"], "ECONNREFUSED")
        self.assertEqual(res["tcp_localhost"], "ECONNREFUSED")
        self.assertEqual(res["tcp6"], "ECONNREFUSED")
        self.assertEqual(srv.accepted(), 0)
        # The datagram left the sandbox's own loopback and went nowhere on the host.
        self.assertEqual(res["udp_sent"], 10)
        with self.assertRaises(BlockingIOError):
            udp.recv(100)

    def test_host_addresses_are_unreachable(self):
        addrs = host_ipv4_addresses()
        if not addrs:
            self.skipTest("the host has no IPv4 address besides loopback")
        srv = Listener("0.0.0.0")
        self.addCleanup(srv.close)
        res, _ = probe(self, CONNECT + """
report({a: connect(a, PORT) for a in ADDRS})
""".replace("ADDRS", repr(addrs)).replace("PORT", str(srv.port)))
        self.assertEqual(res, {a: "ENETUNREACH" for a in addrs})
        self.assertEqual(srv.accepted(), 0)

    def test_host_abstract_unix_socket_is_unreachable(self):
        name = "\0rc-abstract-" + uuid.uuid4().hex
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(name)
        srv.listen(1)
        srv.setblocking(False)
        self.addCleanup(srv.close)
        res, _ = probe(self, """
import socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
report({"connect": oserr(s.connect, NAME)})
""".replace("NAME", repr(name)))
        self.assertEqual(res["connect"], "ECONNREFUSED")
        with self.assertRaises(BlockingIOError):
            srv.accept()


class Interfaces(RuncellTestCase):
    def test_only_loopback_exists_and_it_cannot_be_reconfigured(self):
        res, _ = probe(self, """
import fcntl, socket
lines = open("/proc/net/dev").read().splitlines()[2:]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
ifr = b"lo" + bytes(14) + bytes(2) + bytes(22)     # struct ifreq: name, then flags = 0
report({"ifaces": sorted(l.split(":")[0].strip() for l in lines),
        "lo_down": oserr(fcntl.ioctl, s.fileno(), 0x8914, ifr)})   # SIOCSIFFLAGS
""")
        self.assertEqual(res["ifaces"], ["lo"])
        self.assertEqual(res["lo_down"], "EPERM")

    def test_names_do_not_resolve(self):
        res, _ = probe(self, """
import socket
try:
    socket.getaddrinfo("example.com", 80)
    out = "resolved"
except socket.gaierror as e:
    out = "gaierror"
report({"dns": out, "resolv_conf": oserr(os.stat, "/etc/resolv.conf")})
""")
        self.assertEqual(res, {"dns": "gaierror", "resolv_conf": "ENOENT"})


if __name__ == "__main__":
    unittest.main()
