"""The new network and UTS namespaces' contents: loopback up, a fixed hostname (S4, S9).

Loopback is raised with SIOCGIFFLAGS/SIOCSIFFLAGS from inside the namespace,
as nsjail does. scripts/benchmarks/sandbox.py measures this against pyroute2
driving the namespace from the long-lived side (loopback_up_ms); the ioctl
costs microseconds and needs no import, so it is the one used.
"""

import _socket
import _struct
import fcntl

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
IFF_RUNNING = 0x40
_IFREQ = _struct.Struct("16sh22x")


def loopback_up() -> None:
    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM | _socket.SOCK_CLOEXEC)
    try:
        current = fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, _IFREQ.pack(b"lo", 0))
        flags = _IFREQ.unpack(current)[1] | IFF_UP | IFF_RUNNING
        fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, _IFREQ.pack(b"lo", flags))
    finally:
        sock.close()


def set_hostname(name: str) -> None:
    _socket.sethostname(name)
