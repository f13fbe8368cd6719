"""The server name a TLS ClientHello asks for: what the forwarder holds a tunnel's first bytes to (S9).

A tunnel (``CONNECT host:443``) is checked by its host and port, but the
bytes inside it choose the virtual host: a CDN that serves an allowed file
host also serves every other site on the same addresses, picked by the
ClientHello's ``server_name`` (RFC 6066 §3). The forwarder therefore reads
the client's first flight before it carries a byte of it, and hands it on
only when the name in it is the tunnel's own host (``domain fronting`` is
refused). This module is the pure part: the record and handshake framing
(RFC 8446 §5.1 and §4) and the extensions of one ClientHello (§4.1.2).

It is strict where a client has no reason to vary: a record of the
handshake type and TLS version 3.x, one ClientHello message in one or more
records and nothing after it, every length inside its container, no
extension twice, at most one name of type ``host_name``, and no Encrypted
ClientHello (its inner name is hidden from the forwarder, so it is refused).
"""

from __future__ import annotations

from typing import Callable

RECORD_HEADER_BYTES = 5
HANDSHAKE_HEADER_BYTES = 4
# The largest record fragment TLS allows (RFC 8446 §5.1); a hello never needs more, post-quantum key shares included.
MAX_FRAGMENT_BYTES = 1 << 14
MAX_HELLO_BYTES = 1 << 14
_HANDSHAKE = 22
_CLIENT_HELLO = 1
_SERVER_NAME = 0
_HOST_NAME = 0
_ENCRYPTED_CLIENT_HELLO = 0xFE0D


class NotClientHello(Exception):
    """Bytes that are not one well-formed TLS ClientHello; the reason says which rule they broke."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def record_length(header: bytes) -> int:
    """The fragment length of a record header that opens or continues the ClientHello."""
    content_type, major, minor = header[0], header[1], header[2]
    length = int.from_bytes(header[3:5], "big")
    if content_type != _HANDSHAKE:
        raise NotClientHello("the tunnel did not begin with a TLS handshake record")
    if major != 3 or minor > 4:
        raise NotClientHello(f"the TLS record states version {major}.{minor}, not 3.0 to 3.4")
    if not 1 <= length <= MAX_FRAGMENT_BYTES:
        raise NotClientHello(f"a TLS record of {length} bytes is outside 1 to {MAX_FRAGMENT_BYTES}")
    return length


def message_length(start: bytes) -> int:
    """The whole length (header included) of the handshake message whose first four bytes are ``start``."""
    if start[0] != _CLIENT_HELLO:
        raise NotClientHello("the first TLS handshake message is not a ClientHello")
    length = int.from_bytes(start[1:4], "big")
    if length > MAX_HELLO_BYTES:
        raise NotClientHello(f"the ClientHello is {length} bytes, over {MAX_HELLO_BYTES}")
    return HANDSHAKE_HEADER_BYTES + length


def read_hello(exactly: Callable[[int], bytes]) -> tuple[bytes, str | None]:
    """(the records that carry the client's ClientHello, as read, and the server name it asks for), reading
    through ``exactly(n)``, which returns the next ``n`` bytes of the tunnel. Records are read whole, one
    after another, so the work is linear in what the client sends and bounded by the hello's cap."""
    records, message, whole = bytearray(), bytearray(), None
    while whole is None or len(message) < whole:
        header = exactly(RECORD_HEADER_BYTES)
        fragment = exactly(record_length(header))
        records += header + fragment
        message += fragment
        if whole is None and len(message) >= HANDSHAKE_HEADER_BYTES:
            whole = message_length(message)
    if len(message) != whole:
        raise NotClientHello("the ClientHello's records hold more than the ClientHello")
    return bytes(records), server_name(bytes(message))


class _Cursor:
    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.at, self.what = data, 0, what

    def take(self, count: int) -> bytes:
        if self.at + count > len(self.data):
            raise NotClientHello(f"the ClientHello's {self.what} runs past its end")
        taken = self.data[self.at : self.at + count]
        self.at += count
        return taken

    def number(self, size: int) -> int:
        return int.from_bytes(self.take(size), "big")

    def vector(self, size: int, what: str) -> "_Cursor":
        return _Cursor(self.take(self.number(size)), what)

    def end(self) -> None:
        if self.at != len(self.data):
            raise NotClientHello(f"the ClientHello's {self.what} has bytes after its last field")


def server_name(message: bytes) -> str | None:
    """The ``host_name`` the whole ClientHello ``message`` (its handshake header included) asks for, as sent
    (ASCII); None when it carries no server_name extension."""
    hello = _Cursor(message, "message")
    if hello.number(1) != _CLIENT_HELLO or hello.number(3) != len(message) - HANDSHAKE_HEADER_BYTES:
        raise NotClientHello("the handshake message is not one whole ClientHello")
    hello.take(2 + 32)  # legacy_version, random
    if len(hello.vector(1, "session id").data) > 32:
        raise NotClientHello("the ClientHello's session id is over 32 bytes")
    suites = hello.vector(2, "cipher suites").data
    if not suites or len(suites) % 2:
        raise NotClientHello("the ClientHello's cipher suites are not a nonempty list of two-byte codes")
    if not hello.vector(1, "compression methods").data:
        raise NotClientHello("the ClientHello lists no compression method")
    if hello.at == len(message):
        return None  # no extensions at all (a TLS 1.2 client may send none)
    extensions = hello.vector(2, "extensions")
    hello.end()
    seen: set[int] = set()
    name = None
    while extensions.at < len(extensions.data):
        kind = extensions.number(2)
        body = extensions.vector(2, "extension")
        if kind in seen:
            raise NotClientHello(f"the ClientHello holds extension {kind} twice")
        seen.add(kind)
        if kind == _ENCRYPTED_CLIENT_HELLO:
            raise NotClientHello("the ClientHello is an Encrypted ClientHello, whose server name the forwarder cannot read")
        if kind == _SERVER_NAME:
            name = _host_name(body)
    return name


def _host_name(body: _Cursor) -> str:
    names = body.vector(2, "server name list")
    body.end()
    if names.number(1) != _HOST_NAME:
        raise NotClientHello("the ClientHello's server name is not of type host_name")
    name = names.vector(2, "host name").data
    names.end()
    if not name or not name.isascii():
        raise NotClientHello("the ClientHello's host name is empty or not ASCII")
    return name.decode("ascii")
