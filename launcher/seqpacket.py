"""One SOCK_SEQPACKET datagram and the descriptors it carries, sent or received whole: the transport under
both the launcher protocol (launcher/protocol.py) and the steward protocol (steward/wire.py).

Each protocol keeps its own envelope, numbering and sentences; what is shared
here is what a datagram must be to cross at all: sent in one call, never
truncated (the payload or its descriptors), an empty one meaning the peer has
gone, every received descriptor close-on-exec and closed again when the
datagram is refused.
"""

import _socket
import _struct
import os

_UCRED = _struct.Struct("iII")
_FD = _struct.Struct("i")
# SO_SNDBUFFORCE (Linux): root may set a send buffer above net.core.wmem_max.
_SO_SNDBUFFORCE = 32
# Room for four of the largest datagram either protocol allows (1 MiB), so a send never waits on the buffer's
# own size, only on a peer that does not read.
SEND_BUFFER = 4 << 20


class TransportError(Exception):
    """A datagram did not cross whole; ``errno`` is the kernel's refusal where there was one."""

    def __init__(self, sentence: str, errno: int | None = None) -> None:
        super().__init__(sentence)
        self.errno = errno


class PeerClosed(TransportError):
    """The peer closed its end: an empty datagram."""


def peer_credentials(sock) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process that connected or listened, from SO_PEERCRED."""
    return _UCRED.unpack(sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, _UCRED.size))


def force_send_buffer(sock) -> None:
    """A send buffer of SEND_BUFFER bytes whatever the host's net.core.wmem_max; root only."""
    sock.setsockopt(_socket.SOL_SOCKET, _SO_SNDBUFFORCE, SEND_BUFFER)


def send(sock, data: bytes, fds=()) -> None:
    """Send ``data`` as one datagram with ``fds`` as SCM_RIGHTS, or raise TransportError."""
    ancillary = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, b"".join(_FD.pack(fd) for fd in fds))] if fds else []
    try:
        sent = sock.sendmsg([data], ancillary)
    except OSError as error:
        raise TransportError(f"failed: {error.strerror}", error.errno) from None
    if sent != len(data):
        raise TransportError("was sent short")


def receive(sock, max_bytes: int, max_fds: int) -> tuple[bytes, list[int]]:
    """The next whole datagram and its descriptors (close-on-exec, the caller's to close), or TransportError.

    ``max_bytes`` and ``max_fds`` are what the protocol allows; one byte and
    one descriptor more are received, so a larger datagram is seen as
    truncated and refused, never cut.
    """
    try:
        data, ancillary, flags, _ = sock.recvmsg(max_bytes + 1, _socket.CMSG_SPACE(_FD.size * (max_fds + 1)), _socket.MSG_CMSG_CLOEXEC)
    except OSError as error:
        raise TransportError(f"receiving failed: {error.strerror}", error.errno) from None
    fds = []
    for level, kind, payload in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds.extend(fd for (fd,) in _FD.iter_unpack(payload[: len(payload) - len(payload) % _FD.size]))
    refusal = None
    if not data:
        refusal = PeerClosed("the peer closed its end")
    elif flags & (_socket.MSG_TRUNC | _socket.MSG_CTRUNC) or len(data) > max_bytes:
        refusal = TransportError("a message or its descriptors were truncated")
    if refusal is not None:
        close_all(fds)
        raise refusal
    return data, fds


def close_all(fds) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
