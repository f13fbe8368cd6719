"""The ClientHello reader (steward/client_hello.py): the server name a tunnel's TLS asks for (S9), read from
real hellos made by the ssl module and from hand-written hostile bytes."""

from __future__ import annotations

import ssl

import pytest

from steward.client_hello import NotClientHello, read_hello, server_name


def real_hello(server_hostname: str) -> bytes:
    """The first flight Python's own TLS client (as pip's urllib3 uses it) sends to ``server_hostname``."""
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def reading(data: bytes):
    """``exactly(n)`` over ``data``: the next n bytes, or a stand-in for the client closing early."""
    position = 0

    def exactly(count: int) -> bytes:
        nonlocal position
        if position + count > len(data):
            raise ConnectionAbortedError("closed")
        position += count
        return data[position - count : position]

    return exactly


def read(data: bytes) -> tuple[bytes, str | None]:
    return read_hello(reading(data))


def records(message: bytes, sizes: tuple[int, ...] | None = None, version: bytes = b"\x03\x01") -> bytes:
    """``message`` framed as handshake records, cut at ``sizes`` (one record by default)."""
    sizes = sizes or (len(message),)
    out, at = b"", 0
    for size in sizes:
        out += b"\x16" + version + size.to_bytes(2, "big") + message[at : at + size]
        at += size
    assert at == len(message)
    return out


def hello(extensions: list[tuple[int, bytes]] | None, *, suites: bytes = b"\x13\x01", session: bytes = b"",
          compression: bytes = b"\x00") -> bytes:
    """A ClientHello message (its handshake header included) with exactly these parts."""
    body = b"\x03\x03" + bytes(32) + bytes([len(session)]) + session
    body += len(suites).to_bytes(2, "big") + suites + bytes([len(compression)]) + compression
    if extensions is not None:
        listed = b"".join(kind.to_bytes(2, "big") + len(data).to_bytes(2, "big") + data for kind, data in extensions)
        body += len(listed).to_bytes(2, "big") + listed
    return b"\x01" + len(body).to_bytes(3, "big") + body


def sni(*names: bytes, name_type: int = 0) -> tuple[int, bytes]:
    listed = b"".join(bytes([name_type]) + len(name).to_bytes(2, "big") + name for name in names)
    return 0, len(listed).to_bytes(2, "big") + listed


def test_a_real_hello_names_the_host_it_was_made_for_and_is_read_whole():
    data = real_hello("files.pythonhosted.org")
    assert read(data) == (data, "files.pythonhosted.org")


def test_a_real_hello_to_an_ip_address_names_nothing():
    data = real_hello("127.0.0.1")
    assert read(data) == (data, None)


def test_a_hello_cut_across_records_is_joined():
    message = hello([sni(b"index.example")])
    data = records(message, (1, 3, len(message) - 4))
    assert read(data) == (data, "index.example")


def test_a_hello_without_extensions_or_without_a_name_asks_for_none():
    assert server_name(hello(None)) is None
    assert server_name(hello([(10, b"\x00\x02\x00\x1d")])) is None


@pytest.mark.parametrize(
    "data, rule",
    [
        (b"GET / HTTP/1.1\r\n\r\n", "did not begin with a TLS handshake record"),
        (b"\x17\x03\x03\x00\x01x", "did not begin with a TLS handshake record"),
        (b"\x16\x02\x00\x00\x01\x01", "version 2.0"),
        (b"\x16\x03\x01\x00\x00", "0 bytes is outside"),
        (b"\x16\x03\x01\x40\x01", "16385 bytes is outside"),
        (records(b"\x02\x00\x00\x00"), "is not a ClientHello"),
        (records(b"\x01\x00\x40\x01"), "over 16384"),
        (records(hello([sni(b"a.example")]) + b"\x00"), "hold more than the ClientHello"),
    ],
)
def test_what_is_not_one_client_hello_is_refused(data, rule):
    """A tunnel that opens with anything but a ClientHello (plain HTTP, application data, SSL 2, empty or
    oversized records, another handshake message, bytes after the hello in its records) carries nothing."""
    with pytest.raises(NotClientHello, match=rule):
        read(data)


@pytest.mark.parametrize(
    "message, rule",
    [
        (hello([sni(b"a.example"), sni(b"b.example")]), "extension 0 twice"),
        (hello([sni(b"a.example", b"b.example")]), "server name list has bytes after"),
        (hello([sni(b"a.example", name_type=1)]), "not of type host_name"),
        (hello([sni(b"")]), "empty or not ASCII"),
        (hello([sni("bücher.example".encode())]), "empty or not ASCII"),
        (hello([sni(b"a.example"), (0xFE0D, b"\x00" * 8)]), "Encrypted ClientHello"),
        (hello([sni(b"a.example")], suites=b""), "cipher suites"),
        (hello([sni(b"a.example")], suites=b"\x13"), "cipher suites"),
        (hello([sni(b"a.example")], compression=b""), "no compression method"),
        (hello([sni(b"a.example")], session=bytes(33)), "session id is over 32"),
        (hello([sni(b"a.example")])[:-3], "not one whole ClientHello"),
    ],
)
def test_a_malformed_or_ambiguous_hello_is_refused(message, rule):
    """S9: a hello that could be read two ways (a second name, the extension twice, a hidden inner name) or
    whose lengths do not nest is refused, never guessed at."""
    with pytest.raises(NotClientHello, match=rule):
        server_name(message)


def test_an_extension_longer_than_the_extensions_is_refused():
    message = bytearray(hello([sni(b"a.example")]))
    message[-len(b"a.example") - 7] += 1  # the server_name extension's length, 256 bytes past the block
    with pytest.raises(NotClientHello, match="runs past its end"):
        server_name(bytes(message))


def test_a_client_that_stops_inside_its_hello_is_not_read_as_one():
    data = real_hello("files.pythonhosted.org")
    with pytest.raises(ConnectionAbortedError):
        read(data[:-1])
