"""The forwarder (steward/forwarder.py), the one way out of a network index's sandboxes (S9; docs/pipeline.md,
"A network index"): its destination rule, its request parser, and a live forwarder on loopback.

The live forwarder here listens on the test's own loopback; tests/test_network_index.py runs it where the
steward does, inside a sandbox's network namespace.
"""

from __future__ import annotations

import contextlib
import socket
import threading

import pytest
from index_support import IndexServer, Listener, build_simple
from test_client_hello import real_hello
from wheelforge import wheel

from journal.errors import Refused
from steward.forwarder import (
    Destinations,
    Forwarder,
    Refusal,
    check_file_host,
    check_index_url,
    parse_request,
    public,
    split_host_port,
)

INDEX = "http://127.0.0.1:8080/simple/"
FILES = "files.example.org"


def resolving(*addresses: str, seen: list | None = None):
    """A stand-in for getaddrinfo: every name resolves to ``addresses``; ``seen`` records each name asked."""

    def resolve(host, port, type=0):
        if seen is not None:
            seen.append(host)
        return [
            (socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM, 6, "",
             (address, port, 0, 0) if ":" in address else (address, port))
            for address in addresses
        ]

    return resolve


def refusal(call) -> Refusal:
    with pytest.raises(Refusal) as caught:
        call()
    return caught.value


# --- the destination rule (pure) ---------------------------------------------------------------------------


def test_the_index_on_loopback_is_reached_and_every_other_loopback_port_is_refused():
    """S9: the index the user named is reached wherever it listens (the tests' is on 127.0.0.1), and no other
    port of loopback is: not by its address, not by another name for the same host, whatever it resolves to."""
    destinations = Destinations.of(INDEX)
    assert destinations.addresses("127.0.0.1", 8080) == [(socket.AF_INET, ("127.0.0.1", 8080))]
    seen: list[str] = []
    for host, port in (("127.0.0.1", 8081), ("127.0.0.1", 80), ("localhost", 8080), ("::1", 8080)):
        found = refusal(lambda: destinations.addresses(host, port, resolving("127.0.0.1", seen=seen)))
        assert found.status == 403 and "neither the index nor an allowed file host" in found.reason
    assert seen == []


@pytest.mark.parametrize("address", [
    "127.0.0.1", "127.8.9.10", "169.254.169.254", "10.0.0.1", "172.16.5.4", "192.168.1.1", "100.64.0.1", "0.0.0.0",
    "224.0.0.251", "255.255.255.255", "::1", "::", "fe80::1", "fd00:ec2::254", "fc00::1", "ff02::1", "fec0::1",
    "::ffff:127.0.0.1", "::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe", "2002:a00:1::1", "2001:db8::1",
])
def test_an_allowed_file_host_that_resolves_to_a_non_public_address_is_refused(address):
    """S9: a file host is reached only at public addresses: a name that resolves to loopback, the metadata
    address, a private or shared range, multicast, or an IPv6 form embedding one of those, is refused before any
    connection, whatever the configuration allows by name."""
    destinations = Destinations.of(INDEX, [FILES])
    found = refusal(lambda: destinations.addresses(FILES, 443, resolving(address)))
    assert found.status == 403 and "which is not a public address" in found.reason


def test_one_non_public_address_among_public_ones_refuses_the_name():
    """S9: an answer mixing a public address with the metadata address is refused whole, so no order of trying
    addresses can reach it."""
    destinations = Destinations.of(INDEX, [FILES])
    found = refusal(lambda: destinations.addresses(FILES, 443, resolving("151.101.0.223", "169.254.169.254")))
    assert "169.254.169.254" in found.reason


def test_an_allowed_file_host_with_public_addresses_is_reached_at_exactly_those():
    destinations = Destinations.of(INDEX, [FILES, "mirror.example.org:8443"])
    found = destinations.addresses(FILES, 443, resolving("151.101.0.223", "2a04:4e42::223"))
    assert found == [(socket.AF_INET, ("151.101.0.223", 443)), (socket.AF_INET6, ("2a04:4e42::223", 443, 0, 0))]
    assert destinations.addresses("mirror.example.org", 8443, resolving("151.101.0.223"))
    assert refusal(lambda: destinations.addresses("mirror.example.org", 443, resolving("151.101.0.223"))).status == 403
    assert refusal(lambda: destinations.addresses(FILES, 80, resolving("151.101.0.223"))).status == 403


def test_a_name_that_is_not_allowed_is_never_resolved():
    """DNS is asked about the index and the allowed file hosts only: any other name is refused unresolved."""
    seen: list[str] = []
    destinations = Destinations.of(INDEX, [FILES])
    for host in ("metadata.google.internal", "exfiltrate-this.attacker.example", "files.example.org.evil.example"):
        assert refusal(lambda: destinations.addresses(host, 443, resolving("151.101.0.223", seen=seen))).status == 403
    destinations.addresses(FILES, 443, resolving("151.101.0.223", seen=seen))
    assert seen == [FILES]


def test_public_judges_embedded_ipv4_addresses_by_the_ipv4_address():
    import ipaddress

    assert public(ipaddress.ip_address("151.101.0.223")) and public(ipaddress.ip_address("::ffff:151.101.0.223"))
    assert not public(ipaddress.ip_address("::ffff:10.1.2.3")) and not public(ipaddress.ip_address("64:ff9b::7f00:1"))


# --- the configuration's file hosts, the index URL -----------------------------------------------------------


def test_file_hosts_are_normalized_to_host_and_port():
    assert check_file_host("Files.PythonHosted.org", "k") == "files.pythonhosted.org:443"
    assert check_file_host("mirror.example.org:8443", "k") == "mirror.example.org:8443"
    assert check_file_host("[2001:DB8::1]:444", "k") == "[2001:db8::1]:444"
    assert check_file_host("198.51.100.7", "k") == "198.51.100.7:443"


@pytest.mark.parametrize("entry", ["", "a b", "host:0", "host:65536", "host:x", "user@host", "http://host", "[::1", "h_st", 443])
def test_a_file_host_that_is_not_host_or_host_port_is_refused(entry):
    with pytest.raises(Refused, match="index_file_hosts"):
        check_file_host(entry, "index_file_hosts")


def test_split_host_port_needs_a_port_unless_there_is_a_default():
    assert split_host_port("example.org:80", None) == ("example.org", 80)
    assert split_host_port("example.org", None) is None
    assert split_host_port("example.org", 443) == ("example.org", 443)
    assert split_host_port("::1:80", None) is None and split_host_port("[::1]:80", None) == ("::1", 80)


def test_the_steward_refuses_an_index_url_the_cli_would_refuse():
    """The steward checks the index a client names with the CLI's own rule (a client can be anyone in client_uids)."""
    with pytest.raises(Refused, match="index"):
        Destinations.of("http://user:token@127.0.0.1:8080/simple/")
    assert check_index_url("HTTP://127.0.0.1:8080/simple", "--index") == "http://127.0.0.1:8080/simple/"


# --- the request parser (pure) --------------------------------------------------------------------------------


def test_an_absolute_form_request_is_sent_on_in_origin_form_with_host_from_the_target():
    """RFC 9112 §3.2.2: the Host the sandbox sent is replaced by the target's; proxy and hop-by-hop headers are
    dropped; the server is told to close, so one connection carries one request."""
    head = (b"GET http://127.0.0.1:8080/simple/lib/?x=1 HTTP/1.1\r\nHost: 169.254.169.254\r\nUser-Agent: pip\r\n"
            b"Proxy-Authorization: Basic dG9rZW4=\r\nConnection: keep-alive\r\nAccept: */*")
    request = parse_request(head)
    assert (request.host, request.port, request.tunnel) == ("127.0.0.1", 8080, False)
    assert request.head == (b"GET /simple/lib/?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: pip\r\nAccept: */*\r\n"
                            b"Connection: close\r\n\r\n")


def test_a_connect_names_its_host_and_port():
    request = parse_request(b"CONNECT files.pythonhosted.org:443 HTTP/1.1\r\nHost: files.pythonhosted.org:443")
    assert (request.host, request.port, request.tunnel) == ("files.pythonhosted.org", 443, True)


@pytest.mark.parametrize("head, status", [
    (b"POST http://127.0.0.1:8080/x HTTP/1.1", 405),
    (b"GET http://127.0.0.1:8080/x HTTP/1.1\r\nContent-Length: 5", 400),
    (b"GET http://127.0.0.1:8080/x HTTP/1.1\r\nTransfer-Encoding: chunked", 400),
    (b"GET https://127.0.0.1:8080/x HTTP/1.1", 400),
    (b"GET /x HTTP/1.1", 400),
    (b"GET http://user:pw@127.0.0.1:8080/x HTTP/1.1", 400),
    (b"GET http://127.0.0.1:8080/x HTTP/2", 400),
    (b"GET http://127.0.0.1:8080/\xc3\xa9 HTTP/1.1", 400),
    (b"GET http://127.0.0.1:8080/x HTTP/1.1\r\nbad header", 400),
    (b"CONNECT 127.0.0.1 HTTP/1.1", 400),
])
def test_anything_but_connect_or_a_bodyless_get_is_refused(head, status):
    assert refusal(lambda: parse_request(head)).status == status


# --- a live forwarder on loopback ----------------------------------------------------------------------------


@contextlib.contextmanager
def forwarding(destinations: Destinations, resolve=socket.getaddrinfo):
    """A forwarder on an ephemeral loopback port of the test's own network: (its proxy URL, its log lines)."""
    listener = socket.create_server(("127.0.0.1", 0))
    logged: list[str] = []
    forwarder = Forwarder(listener, destinations, name="test", log=logged.append, resolve=resolve).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", logged
    finally:
        forwarder.close()


def exchange(proxy: str, data: bytes, *, stop_sending: bool = False) -> bytes:
    """Send ``data`` to the forwarder (then shut the sending side when ``stop_sending``) and read until it closes."""
    host, port = proxy.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(data)
        if stop_sending:
            connection.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := connection.recv(65_536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.fixture
def index(tmp_path):
    source = tmp_path / "wheels"
    wheel(source, "lib", "1.0")
    with IndexServer(build_simple(source, tmp_path / "web")) as server:
        yield server


def test_a_request_to_the_index_is_carried_and_one_to_another_loopback_port_is_refused_and_logged(index):
    """S9: through the forwarder the index answers; a listener on another loopback port (a metadata service
    stands in) gets no connection, the sandbox gets a 403 saying why, and the steward logs it."""
    with Listener() as trap, forwarding(Destinations.of(index.url)) as (proxy, logged):
        answer = exchange(proxy, f"GET {index.url}lib/ HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic eA==\r\n\r\n".encode())
        assert answer.startswith(b"HTTP/1.0 200") and b"lib-1.0-py3-none-any.whl" in answer
        refused = exchange(proxy, f"GET http://127.0.0.1:{trap.port}/latest/meta-data/ HTTP/1.1\r\n\r\n".encode())
    assert refused.startswith(b"HTTP/1.1 403 casebox forwarder: 127.0.0.1:%d is neither the index" % trap.port)
    assert trap.connections == 0
    assert logged == [f"forwarder of sandbox test refused a connection: 127.0.0.1:{trap.port} is neither the index nor an allowed file host"]
    (path, headers), = index.requests
    assert path == "/simple/lib/" and headers["Host"] == f"127.0.0.1:{index.port}" and "Proxy-Authorization" not in headers


class Recorder:
    """A TCP server on 127.0.0.1 standing in for a TLS host: it keeps the bytes of each connection until the
    other side stops sending, then answers ``b"answer"`` and closes."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.received: list[bytes] = []
        self.recorded = threading.Condition()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            with connection:
                connection.settimeout(10)
                chunks = []
                while chunk := connection.recv(65_536):
                    chunks.append(chunk)
                with self.recorded:
                    self.received.append(b"".join(chunks))
                    self.recorded.notify_all()
                with contextlib.suppress(OSError):
                    connection.sendall(b"answer")

    def connections(self, count: int) -> list[bytes]:
        """What the first ``count`` connections carried, once they have all ended (the forwarder may close the
        client's side of a refused tunnel before this server has read the end of its own)."""
        with self.recorded:
            self.recorded.wait_for(lambda: len(self.received) >= count, timeout=10)
            return list(self.received)

    def __enter__(self) -> "Recorder":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.socket.shutdown(socket.SHUT_RDWR)
        self.socket.close()
        self.thread.join(10)


def tunnel(proxy: str, target: str, data: bytes) -> bytes:
    """CONNECT ``target``, send ``data`` through the tunnel, stop sending, and read until the forwarder closes."""
    return exchange(proxy, f"CONNECT {target} HTTP/1.1\r\n\r\n".encode() + data, stop_sending=True)


ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"


def test_a_tunnel_opens_only_to_the_index():
    """CONNECT (https) opens a byte tunnel to the index's host and port, and to nothing else; a ClientHello for
    the index's address (no server name) is carried as it was sent."""
    hello = real_hello("127.0.0.1")
    with Recorder() as upstream, Listener() as trap:
        with forwarding(Destinations.of(f"https://127.0.0.1:{upstream.port}/simple/")) as (proxy, logged):
            tunnelled = tunnel(proxy, f"127.0.0.1:{upstream.port}", hello)
            refused = exchange(proxy, f"CONNECT 127.0.0.1:{trap.port} HTTP/1.1\r\n\r\n".encode())
    assert tunnelled == ESTABLISHED + b"answer" and upstream.connections(1) == [hello]
    assert refused.startswith(b"HTTP/1.1 403") and trap.connections == 0 and len(logged) == 1


def test_a_tunnel_carries_a_hello_for_its_own_host():
    """S9: the index by name (resolved by the forwarder alone): a ClientHello naming it reaches it byte for
    byte, and so does what the client sent after it (here a ChangeCipherSpec record)."""
    url = "https://index.casebox.test:{port}/simple/"
    hello = real_hello("index.casebox.test")
    with Recorder() as upstream, forwarding(Destinations.of(url.format(port=upstream.port)), resolve=resolving("127.0.0.1")) as (proxy, logged):
        tunnelled = tunnel(proxy, f"index.casebox.test:{upstream.port}", hello + b"\x14\x03\x03\x00\x01\x01")
    assert tunnelled == ESTABLISHED + b"answer" and logged == []
    assert upstream.connections(1) == [hello + b"\x14\x03\x03\x00\x01\x01"]


@pytest.mark.parametrize(
    "hello, logged_rule",
    [
        (lambda: real_hello("evil.example"), "asked TLS for server name 'evil.example', not its own host"),
        (lambda: real_hello("127.0.0.1"), "asked TLS for no server name, not its own host"),
        (lambda: b"GET /simple/ HTTP/1.1\r\nHost: evil.example\r\n\r\n", "did not open with a ClientHello"),
    ],
    ids=["another_name", "no_name", "plain_http"],
)
def test_a_tunnel_whose_tls_asks_for_another_host_carries_nothing(hello, logged_rule):
    """S9, domain fronting: a sandbox tunnels to an allowed name and asks TLS, inside, for another site behind
    the same addresses (a CDN's), for none, or speaks plain HTTP with its own Host; not one byte reaches the
    host, the tunnel is closed and the steward logs why."""
    url = "https://index.casebox.test:{port}/simple/"
    with Recorder() as upstream, forwarding(Destinations.of(url.format(port=upstream.port)), resolve=resolving("127.0.0.1")) as (proxy, logged):
        tunnelled = tunnel(proxy, f"index.casebox.test:{upstream.port}", hello())
    assert tunnelled == ESTABLISHED
    assert upstream.connections(1) == [b""]
    assert len(logged) == 1 and logged[0].startswith("forwarder of sandbox test closed a tunnel: the tunnel to index.casebox.test:")
    assert logged_rule in logged[0]


def test_a_tunnel_to_an_address_whose_tls_names_a_host_carries_nothing():
    """S9: an IP address has no server name, so a hello to the index's address that names one (any CDN site)
    is refused."""
    with Recorder() as upstream, forwarding(Destinations.of(f"https://127.0.0.1:{upstream.port}/simple/")) as (proxy, logged):
        tunnelled = tunnel(proxy, f"127.0.0.1:{upstream.port}", real_hello("evil.example"))
    assert tunnelled == ESTABLISHED and upstream.connections(1) == [b""]
    assert len(logged) == 1 and "asked TLS for server name 'evil.example'; an IP address has none" in logged[0]


def test_the_forwarder_connects_to_the_addresses_it_checked_never_to_the_name_resolved_again(index):
    """The destination rule judges addresses, so the connection must go to exactly those: here the index's
    name exists only in the forwarder's resolver (a stand-in for DNS), and the request still arrives."""
    url = f"http://index.casebox.test:{index.port}/simple/"
    with forwarding(Destinations.of(url), resolve=resolving("127.0.0.1")) as (proxy, logged):
        answer = exchange(proxy, f"GET {url}lib/ HTTP/1.1\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.0 200") and logged == []
    assert index.requests[0][1]["Host"] == f"index.casebox.test:{index.port}"


def test_an_allowed_file_host_whose_real_name_resolves_to_loopback_is_refused(index):
    """S9 with the host's own resolver: ``localhost`` allowed as a file host (a configuration mistake, or a DNS
    name pointed at 127.0.0.1) still never reaches the listener on that port."""
    with Listener() as trap, forwarding(Destinations.of(index.url, [f"localhost:{trap.port}"])) as (proxy, logged):
        refused = exchange(proxy, f"GET http://localhost:{trap.port}/latest/meta-data/ HTTP/1.1\r\n\r\n".encode())
    assert refused.startswith(b"HTTP/1.1 403") and trap.connections == 0
    assert len(logged) == 1 and "which is not a public address" in logged[0]


def test_the_resolver_looks_for_the_forwarder_s_own_mark():
    """The resolver reads the forwarder's answers out of pip's log by the mark every one of them carries; the two
    sides (the resolver runs in a sandbox and cannot import the steward) name the same mark."""
    from executor.deps.resolver import FORWARDER_MARK
    from steward.forwarder import MARK

    assert FORWARDER_MARK == MARK
