"""The forwarder: the one way out of the resolver's and fetch's sandboxes of a network index (S9; docs/pipeline.md).

Such a sandbox has a network namespace of its own, like every sandbox, with
only ``lo``. The starter adds one thing to it: a TCP socket listening on
``127.0.0.1:3128`` *inside that namespace*, made by the steward on a thread
that enters the namespace (``setns``) just long enough to create and bind it
(:func:`listen_in_namespace`; ``SIOCGSKNS`` then proves the socket is in pid
1's namespace). Connections to it come from the sandbox; every connection the
forwarder opens in turn is the steward's own, from the host's namespace,
after the destination rule below. There is no interface, route, address or
NAT rule to add, journal and remove, and nothing of the sandbox can reach
anything else: not the host's loopback, not its abstract Unix sockets (they
belong to a network namespace), not the local network.

pip (``--proxy``) and casebox's fetch tool (a ``ProxyHandler``) use it as
their HTTP proxy, named on their command line, never through the
environment. It answers the two requests of an HTTP proxy, one per
connection:

- ``CONNECT host:port`` (https): a tunnel of raw bytes; TLS stays end to end,
  verified by the client against the installer's CA bundle. Its first bytes
  must be one TLS ClientHello asking for the tunnel's own host (no name for
  an IP address, no Encrypted ClientHello): read whole before any byte is
  carried (steward/client_hello.py), so no other site behind the same
  addresses (a CDN's) is reached by a tunnel to an allowed one;
- ``GET`` or ``HEAD http://host[:port]/path`` (http, absolute form): sent on
  in origin form with ``Host`` rewritten from the target (RFC 9112 §3.2.2),
  the hop-by-hop and proxy headers dropped and ``Connection: close``, then
  the answer relayed as it comes until the server closes. No request body.

**The destination rule** (:meth:`Destinations.addresses`), before any
connection is opened:

1. the index's own host and port (the ``--index`` URL's): whatever its name
   resolves to, since that is the address the user named (a mirror on
   loopback or the local network included);
2. an allowed file host (``index_file_hosts`` in the configuration: PyPI
   serves its files from another host than its pages): only when every
   address its name resolves to is a public unicast address, never
   loopback, link-local (the cloud metadata address 169.254.169.254),
   private, shared, reserved or multicast; IPv6 forms that embed an IPv4
   address are judged by it;
3. anything else is refused without resolving the name, so DNS is asked
   only about the index and the allowed file hosts.

The forwarder connects to exactly the addresses it checked, never to a name
resolved again. A refusal answers ``403`` with its reason (pip shows it) and
is logged, escaped (E8).
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import ipaddress
import os
import re
import select
import selectors
import socket
import threading
from typing import Callable, Sequence
from urllib.parse import urlsplit

from journal.errors import Refused
from steward import client_hello

FORWARDER_HOST = "127.0.0.1"
FORWARDER_PORT = 3128
PROXY_URL = f"http://{FORWARDER_HOST}:{FORWARDER_PORT}"
HEAD_MAX_BYTES = 16_384
HEAD_SECONDS = 30.0
CONNECT_SECONDS = 30.0
IDLE_SECONDS = 120.0
CLOSE_SECONDS = 5.0
MAX_CONNECTIONS = 16
HTTPS_PORT = 443
URL_MAX_BYTES = 2_048
# Starts the reason phrase of every answer the forwarder makes itself, so pip's log shows whose answer it is
# (executor/deps/resolver.py reads it as FORWARDER_MARK).
MARK = "casebox forwarder:"
SCHEME_PORTS = {"http": 80, "https": 443}
# RFC 3986's unreserved and reserved characters and '%', less '?', '#' and '@': no query, no fragment, no
# user information, and nothing a parser could read two ways (no space, no backslash, no quote).
_URL_CHARS = re.compile(r"[A-Za-z0-9\-._~:/\[\]%!$&'()*+,;=]+\Z")
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\Z")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_PORT = re.compile(r"[0-9]{1,5}\Z")
# Headers that belong to one hop (RFC 9110 §7.6.1) or to the proxy, and Host, which is set from the target.
_NOT_FORWARDED = frozenset(
    {"connection", "proxy-connection", "keep-alive", "proxy-authorization", "proxy-authenticate", "te", "trailer", "upgrade", "host"}
)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SIOCGSKNS = 0x894C
_CHUNK = 1 << 16

Resolve = Callable[..., list]
Log = Callable[[str], None]


class Refusal(Exception):
    """A request the forwarder does not carry out: the HTTP status it answers and why."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def check_index_url(url: str, where: str) -> str:
    """The index URL, normalized to end with '/'; Refused (exit 64) for anything but a plain http(s) URL.

    The CLI applies it to ``--index`` before anything is written, and the
    steward again to the index a client names for a sandbox's forwarder."""
    if len(url.encode("utf-8")) > URL_MAX_BYTES or not _URL_CHARS.match(url):
        raise Refused(
            where,
            f"{url!r} is not a plain index URL: no user information (user:pass@), no query, no fragment, "
            f"no spaces or quotes, at most {URL_MAX_BYTES} bytes",
        )
    try:
        parts = urlsplit(url)
    except ValueError:
        raise Refused(where, f"{url!r} is not a URL") from None
    if parts.scheme.lower() not in SCHEME_PORTS:
        raise Refused(where, f"{url!r} is not an http or https URL; a local index is given as a directory path")
    try:
        port = parts.port
    except ValueError:
        port = -1
    if not parts.hostname or normal_host(parts.hostname) is None or port == -1 or port == 0:
        raise Refused(where, f"{url!r} names no host, or an invalid port, or a host that is neither a DNS name nor an IP address")
    url = parts.scheme.lower() + url[len(parts.scheme):]
    return url if url.endswith("/") else url + "/"


def normal_host(text: str) -> str | None:
    """A host as the forwarder compares it: an IP address in its standard form, or a lowercase DNS name
    of letters, digits and hyphens; None for anything else."""
    text = text.lower()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
        try:
            return str(ipaddress.IPv6Address(text))
        except ValueError:
            return None
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    return text if len(text) <= 253 and _NAME.match(text) else None


def split_host_port(text: str, default_port: int | None) -> tuple[str, int] | None:
    """``host:port``, ``[v6]:port`` or, with a ``default_port``, a bare host, as (normal host, port); else None."""
    if text.startswith("["):
        end = text.find("]")
        host, rest = text[: end + 1], text[end + 1:]
        if end < 0 or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else None
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    elif ":" not in text:
        host, port_text = text, None
    else:
        return None
    if port_text is None:
        port = default_port
    else:
        port = int(port_text) if _PORT.match(port_text) else 0
    normal = normal_host(host)
    if normal is None or port is None or not 1 <= port <= 65_535:
        return None
    return normal, port


def check_file_host(entry: object, where: str) -> str:
    """One ``index_file_hosts`` entry, ``HOST`` (port 443) or ``HOST:PORT``, normalized to ``host:port``."""
    found = split_host_port(entry, HTTPS_PORT) if type(entry) is str else None
    if found is None:
        raise Refused(where, "must be a list of HOST or HOST:PORT (a DNS name or an IP address, port 443 by default)")
    host, port = found
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """A public unicast address: not loopback, link-local, private, shared, reserved, documentation or multicast.
    An IPv6 address that embeds an IPv4 one (mapped, NAT64, 6to4) is judged by that IPv4 address."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is None and address in _NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
        if embedded is not None:
            return public(embedded)
        if address.is_site_local:
            return False
    return address.is_global and not address.is_multicast


@dataclasses.dataclass(frozen=True)
class Destinations:
    """Where a sandbox's forwarder may connect: the index's (host, port), and the allowed file hosts'."""

    index: tuple[str, int]
    file_hosts: frozenset[tuple[str, int]] = frozenset()

    @classmethod
    def of(cls, index_url: str, file_hosts: Sequence[str] = ()) -> "Destinations":
        """The destinations of the index at ``index_url`` (checked here) and of ``file_hosts`` (config entries)."""
        url = check_index_url(index_url, "index")
        parts = urlsplit(url)
        index = (normal_host(parts.hostname), parts.port or SCHEME_PORTS[parts.scheme])
        hosts = frozenset(split_host_port(check_file_host(entry, "index_file_hosts"), None) for entry in file_hosts)
        return cls(index, hosts)

    def addresses(self, host: str, port: int, resolve: Resolve = socket.getaddrinfo) -> list[tuple[int, tuple]]:
        """(family, socket address) for each address the forwarder may connect to for ``host:port``;
        :class:`Refusal` when it may not connect at all (the rule in the module docstring)."""
        target = (host, port)
        if target != self.index and target not in self.file_hosts:
            raise Refusal(403, f"{_shown(host, port)} is neither the index nor an allowed file host")
        try:
            found = resolve(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as error:
            raise Refusal(502, f"{_shown(host, port)} does not resolve ({error})") from None
        addresses = [(family, sockaddr) for family, _, _, _, sockaddr in found if family in (socket.AF_INET, socket.AF_INET6)]
        if not addresses:
            raise Refusal(502, f"{_shown(host, port)} resolves to no IP address")
        if target != self.index:
            for _, sockaddr in addresses:
                address = ipaddress.ip_address(sockaddr[0].partition("%")[0])
                if not public(address):
                    raise Refusal(403, f"{_shown(host, port)} resolves to {address}, which is not a public address")
        return addresses


def _shown(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclasses.dataclass(frozen=True)
class Request:
    """One parsed proxy request: where to, whether it is a tunnel, and (absolute form) the head to send on."""

    host: str
    port: int
    tunnel: bool
    head: bytes = b""


def parse_request(head: bytes) -> Request:
    """The request head a sandbox sent (up to and without the blank line); :class:`Refusal` for anything else
    than a CONNECT or a body-less GET/HEAD in absolute form."""
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        raise Refusal(400, "the request head is not ASCII") from None
    request_line, *lines = text.split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
        raise Refusal(400, "the request line is not METHOD TARGET HTTP/1.x")
    method, target, version = parts
    headers = []
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.match(name) or any(ord(char) < 32 and char != "\t" for char in value):
            raise Refusal(400, "a request header is malformed")
        headers.append((name, value.strip()))
    if method == "CONNECT":
        found = split_host_port(target, None)
        if found is None:
            raise Refusal(400, "CONNECT needs HOST:PORT")
        return Request(*found, tunnel=True)
    if method not in ("GET", "HEAD"):
        raise Refusal(405, f"{method[:16]} is not forwarded, only GET, HEAD and CONNECT")
    if not target.lower().startswith("http://"):
        raise Refusal(400, "an http request names its target as http://HOST[:PORT]/PATH; https goes through CONNECT")
    target_parts = urlsplit(target)
    found = split_host_port(target_parts.netloc, SCHEME_PORTS["http"])
    if found is None or "@" in target_parts.netloc or target_parts.fragment:
        raise Refusal(400, "the request target names no plain host (no user information, no fragment)")
    for name, value in headers:
        if name.lower() == "transfer-encoding" or (name.lower() == "content-length" and value != "0"):
            raise Refusal(400, "a request with a body is not forwarded")
    path = (target_parts.path or "/") + (f"?{target_parts.query}" if target_parts.query else "")
    kept = [f"{name}: {value}" for name, value in headers if name.lower() not in _NOT_FORWARDED]
    forwarded = "\r\n".join([f"{method} {path} {version}", f"Host: {target_parts.netloc}", *kept, "Connection: close", "", ""])
    return Request(*found, tunnel=False, head=forwarded.encode("ascii"))


def _read_head(client: socket.socket) -> tuple[bytes, bytes]:
    """(the request head without its blank line, whatever came after it), at most HEAD_MAX_BYTES."""
    data = b""
    while True:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            return data[:end], data[end + 4:]
        if len(data) > HEAD_MAX_BYTES:
            raise Refusal(431, f"the request head is over {HEAD_MAX_BYTES} bytes")
        chunk = client.recv(_CHUNK)
        if not chunk:
            raise ConnectionAbortedError("the client closed before its request head ended")
        data += chunk


def check_server_name(host: str, port: int, name: str | None) -> None:
    """The tunnel rule: a ClientHello asks for exactly the tunnel's own host, and for no name when that host is
    an IP address (RFC 6066 §3 has no name for an address); :class:`Refusal` otherwise."""
    literal = _is_address(host)
    if literal and name is not None:
        raise Refusal(403, f"the tunnel to {_shown(host, port)} asked TLS for server name {name!r}; an IP address has none")
    if not literal and (name is None or normal_host(name) != host):
        asked = "no server name" if name is None else f"server name {name!r}"
        raise Refusal(403, f"the tunnel to {_shown(host, port)} asked TLS for {asked}, not its own host")


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class _Incoming:
    """What the client sends: first what was read with its request head, then from the socket."""

    def __init__(self, client: socket.socket, buffered: bytes) -> None:
        self.client = client
        self.buffered = buffered

    def exactly(self, count: int) -> bytes:
        while len(self.buffered) < count:
            chunk = self.client.recv(_CHUNK)
            if not chunk:
                raise ConnectionAbortedError("the client closed inside its ClientHello")
            self.buffered += chunk
        taken, self.buffered = self.buffered[:count], self.buffered[count:]
        return taken


def _checked_hello(client: socket.socket, rest: bytes, request: Request) -> bytes:
    """The tunnel's first bytes, its ClientHello and whatever followed it, once the hello is read whole and asks
    for the tunnel's own host (:func:`check_server_name`); :class:`Refusal` for anything else."""
    incoming = _Incoming(client, rest)
    try:
        records, name = client_hello.read_hello(incoming.exactly)
    except client_hello.NotClientHello as refusal:
        raise Refusal(400, f"the tunnel to {_shown(request.host, request.port)} did not open with a ClientHello: {refusal.reason}") from None
    check_server_name(request.host, request.port, name)
    return records + incoming.buffered


def _answer(client: socket.socket, status: int, reason: str) -> None:
    """A short error response: its reason phrase is the refusal's sentence (pip shows it)."""
    phrase = reason.encode("ascii", "replace").replace(b"\r", b" ").replace(b"\n", b" ")[:400]
    body = phrase + b"\n"
    try:
        client.sendall(
            b"HTTP/1.1 %d %s %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
            % (status, MARK.encode("ascii"), phrase, len(body), body)
        )
    except OSError:
        pass


def network_namespace_of(sock: socket.socket) -> tuple[int, int]:
    """(device, inode) of the network namespace ``sock`` belongs to (SIOCGSKNS)."""
    fd = fcntl.ioctl(sock.fileno(), _SIOCGSKNS)
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    return info.st_dev, info.st_ino


def listen_in_namespace(netns_fd: int) -> socket.socket:
    """A TCP socket listening on FORWARDER_HOST:FORWARDER_PORT in the network namespace ``netns_fd`` (a
    sandbox's, which the steward opened at its handover; the caller keeps and closes the descriptor).

    A thread of its own enters that namespace, creates and binds the socket
    and returns to the steward's namespace; a socket keeps the namespace it
    was made in. The caller's threads never leave the steward's namespace.
    ``SIOCGSKNS`` then proves the socket is in ``pid``'s namespace, not the
    steward's (S9), or it is closed and the start fails.
    """
    from launcher import syscalls

    target = netns_fd
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    made: dict[str, object] = {}

    def make() -> None:
        try:
            syscalls.setns(target, syscalls.CLONE_NEWNET)
            try:
                listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
                made["socket"] = listener
                listener.bind((FORWARDER_HOST, FORWARDER_PORT))
                listener.listen(MAX_CONNECTIONS)
            finally:
                syscalls.setns(home, syscalls.CLONE_NEWNET)
        except BaseException as error:
            made["error"] = error

    try:
        thread = threading.Thread(target=make, name="casebox-forwarder-setns")
        thread.start()
        thread.join()
        listener = made.get("socket")
        try:
            if "error" in made:
                raise made["error"]
            expected = os.fstat(target)
            if network_namespace_of(listener) != (expected.st_dev, expected.st_ino):
                raise OSError(errno.EXDEV, "the forwarder's socket is not in the network namespace of the sandbox's pid 1")
        except BaseException:
            if listener is not None:
                listener.close()
            raise
    finally:
        os.close(home)
    return listener


class Forwarder:
    """Serves one sandbox's listening socket until :meth:`close`: one thread accepts, one per connection relays.

    ``name`` (the sandbox) names its log lines; ``log`` gets each refusal's sentence.
    """

    def __init__(
        self, listener: socket.socket, destinations: Destinations, *, name: str, log: Log, resolve: Resolve = socket.getaddrinfo,
    ) -> None:
        self.listener = listener
        # Never blocks the acceptor: a connection the client dropped between select and accept is skipped.
        listener.setblocking(False)
        self.destinations = destinations
        self.name = name
        self.log = log
        self.resolve = resolve
        self._lock = threading.Lock()
        self._closing = False
        self._sockets: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._wake_read, self._wake_write = os.pipe2(os.O_CLOEXEC)
        self._acceptor = threading.Thread(target=self._serve, name=f"casebox-forwarder-{name}", daemon=True)

    @classmethod
    def open(cls, netns_fd: int, destinations: Destinations, *, name: str, log: Log) -> "Forwarder":
        """A running forwarder listening in the network namespace ``netns_fd``."""
        return cls(listen_in_namespace(netns_fd), destinations, name=name, log=log).start()

    def start(self) -> "Forwarder":
        self._acceptor.start()
        return self

    def close(self) -> None:
        """Stop accepting, end every connection, and wait (at most CLOSE_SECONDS each) for the threads."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            for sock in self._sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            threads = list(self._threads)
        os.write(self._wake_write, b"x")
        if self._acceptor.is_alive():
            self._acceptor.join(CLOSE_SECONDS)
        for thread in threads:
            thread.join(CLOSE_SECONDS)
        self.listener.close()
        os.close(self._wake_read)
        os.close(self._wake_write)

    def _serve(self) -> None:
        while True:
            readable = select.select([self.listener, self._wake_read], [], [])[0]
            if self._wake_read in readable:
                return
            try:
                client, _ = self.listener.accept()
            except OSError:
                continue
            with self._lock:
                if self._closing:
                    client.close()
                    return
                if len(self._threads) >= MAX_CONNECTIONS:
                    busy = True
                else:
                    busy = False
                    self._sockets.add(client)
                    thread = threading.Thread(target=self._connection, args=(client,), daemon=True)
                    self._threads.add(thread)
                    thread.start()
            if busy:
                self._refuse(client, Refusal(503, f"more than {MAX_CONNECTIONS} connections at once"))
                client.close()

    def _refuse(self, client: socket.socket, refusal: Refusal) -> None:
        """Answer the refusal; log it unless it is a destination that could not be reached (502)."""
        if refusal.status != 502:
            self.log(f"forwarder of sandbox {self.name} refused a connection: {refusal.reason}")
        _answer(client, refusal.status, refusal.reason)

    def _connection(self, client: socket.socket) -> None:
        upstream = None
        tunnelled = False
        try:
            client.settimeout(HEAD_SECONDS)
            head, rest = _read_head(client)
            request = parse_request(head)
            addresses = self.destinations.addresses(request.host, request.port, self.resolve)
            upstream = self._connect(request, addresses)
            if request.tunnel:
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                tunnelled = True
                upstream.sendall(_checked_hello(client, rest, request))
            else:
                upstream.sendall(request.head)
            client.settimeout(IDLE_SECONDS)
            _relay(client, upstream, tunnel=request.tunnel)
        except Refusal as refusal:
            if tunnelled:
                # Past the 200 the client speaks TLS to the host: no HTTP answer, the tunnel is closed.
                self.log(f"forwarder of sandbox {self.name} closed a tunnel: {refusal.reason}")
            else:
                self._refuse(client, refusal)
        except OSError:
            pass
        finally:
            with self._lock:
                self._sockets.discard(client)
                if upstream is not None:
                    self._sockets.discard(upstream)
                self._threads.discard(threading.current_thread())
            client.close()
            if upstream is not None:
                upstream.close()

    def _connect(self, request: Request, addresses: list[tuple[int, tuple]]) -> socket.socket:
        """A connection to the first of the checked ``addresses`` that answers (never the name resolved again)."""
        failure: OSError | None = None
        for family, sockaddr in addresses:
            upstream = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            with self._lock:
                if self._closing:
                    upstream.close()
                    raise ConnectionAbortedError("the forwarder is closing")
                self._sockets.add(upstream)
            try:
                upstream.settimeout(CONNECT_SECONDS)
                upstream.connect(sockaddr)
                upstream.settimeout(IDLE_SECONDS)
                return upstream
            except OSError as error:
                failure = error
                with self._lock:
                    self._sockets.discard(upstream)
                upstream.close()
        raise Refusal(502, f"{_shown(request.host, request.port)} cannot be reached ({failure})")


def _relay(client: socket.socket, upstream: socket.socket, *, tunnel: bool) -> None:
    """Bytes both ways (a tunnel) or the answer only (absolute form), until the server closes or IDLE_SECONDS pass
    with nothing to carry. Bytes a client sends after an absolute-form request go nowhere."""
    selector = selectors.DefaultSelector()
    selector.register(client, selectors.EVENT_READ, upstream if tunnel else None)
    selector.register(upstream, selectors.EVENT_READ, client)
    try:
        while True:
            events = selector.select(IDLE_SECONDS)
            if not events:
                return
            for key, _ in events:
                data = key.fileobj.recv(_CHUNK)
                if key.fileobj is upstream:
                    if not data:
                        return
                    client.sendall(data)
                elif not data:
                    if not tunnel:
                        return
                    selector.unregister(client)
                    upstream.shutdown(socket.SHUT_WR)
                elif tunnel:
                    upstream.sendall(data)
    finally:
        selector.close()
