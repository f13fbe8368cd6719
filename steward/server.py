"""The steward daemon: ``casebox steward serve`` (docs/steward-protocol.md, docs/operations.md).

It listens on a Unix SOCK_SEQPACKET socket (mode 0660 with the group
``socket_group``, by default ``casebox``, when that group exists, else 0600,
root only), authenticates each peer with SO_PEERCRED against
``client_uids``, and serves one session per connection through the same
:class:`~steward.session.Session` the embedded mode uses.

One thread, the selector loop, accepts, reads every request, counts idle
time and refuses: a connection costs a descriptor, not a thread, until its
first request. From then on the session has a thread of its own that runs
its requests in order and finally retires it: a sandbox's pid 1 is that
thread's child and gets its parent-death signal when that thread ends
(prctl(2)), so the thread lives exactly as long as the session. Bounded:

- connections are capped per client uid (``max_connections_per_uid``) and in
  total (``max_connections``; root's are not counted, so root is always
  served); beyond a cap, and for a uid not in ``client_uids``, the client is
  answered REFUSED at once and the connection closed;
- a connection that sends nothing for ``idle_seconds`` between requests is
  ended: before OPEN it is closed, after it its session is retired as
  UNVERIFIED (SESSION_IDLE), and the dedicated UID's lease it held is free;
- with no descriptor left, a spare one is given up to refuse the connection,
  so the loop never spins on a listener it cannot accept from.

A session that ends without CLOSE is told why first: FAILED with ``open``
false in answer to the request its client would send next. A refused peer and
every protocol failure are logged on stderr. With ``NOTIFY_SOCKET`` set it
tells systemd ``READY=1`` once it listens.

SIGTERM or SIGINT: stop accepting and remove the socket; end each running op
(SIGKILL, so pid 1 reports its raw wait status as for any op); retire every
open session as UNVERIFIED (SHUTDOWN). :func:`serve` returns 0 once all are
retired within ``stop_seconds``, else it names each one left in the log and
returns 1.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import errno
import grp
import os
import queue
import resource
import selectors
import signal
import socket
import stat
import threading
import time
import traceback

from journal import strictjson
from journal.closed import ClosedObject
from journal.errors import Refused
from journal.format import RESERVE_START, Kind, encode_frame, encode_payload
from steward import api
from steward.failure import SandboxFailure
from steward.log import log
from steward.session import MAX_CAPABILITIES, Session, Steward
from launcher import seqpacket
from steward.wire import STEWARD, Endpoint, Message, WireError

SOCKET_GROUP = "casebox"
BACKLOG = 128
ACCEPTS_PER_TURN = 64
# A reply (at most 1 MiB) waits this long for room in the client's socket, then the client is taken as gone.
SEND_SECONDS = 10.0
_ENV_NAME = "must be a variable name of A-Z a-z 0-9 _, not starting with a digit"
ROOT = 0


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The daemon's bounds; their defaults are the configuration's (executor/cli/config.py, docs/configuration.md)."""

    idle_seconds: float
    max_connections: int
    max_connections_per_uid: int
    stop_seconds: float


def _smallest_process_record() -> int:
    payload, _ = encode_payload(
        Kind.PROCESS_INTENT, {"op_id": "x", "role": "stage", "pid": 1, "starttime": 0, "pgid": 1, "prev": "0" * 64, "at": 0}
    )
    return len(encode_frame(Kind.PROCESS_INTENT, payload))


# What one session may hold open at once: its socket, its stage's five directories and its journal, its
# capabilities, the lease, a /proc handle for every process its journal has room to record (C2), and an open
# sandbox or helper with its pipes, sockets and pidfds, and as much again for each sandbox started ahead.
SESSION_DESCRIPTORS = 1 + 6 + MAX_CAPABILITIES + 1 + RESERVE_START // _smallest_process_record() + 32 * (1 + api.MAX_AHEAD)
# The daemon's own: standard streams, the listener, the selector, its pipes, the spare, libraries.
BASE_DESCRIPTORS = 64


def descriptors_needed(bounds: Bounds) -> int:
    """The descriptor limit the bounds need: every connection they admit (root's beside the total) at its most."""
    return BASE_DESCRIPTORS + (bounds.max_connections + bounds.max_connections_per_uid) * SESSION_DESCRIPTORS


def notify(state: str) -> None:
    """Tell systemd ``state`` when it started us with NOTIFY_SOCKET (an abstract name starts with '@')."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.sendto(state.encode("ascii"), address)


# Request bodies: one decoder per request type (the client in steward/client.py is their one encoder).

def _name(fields: ClosedObject, key: str = "name") -> str:
    return api.check_name(fields.pop_str(key, max_bytes=40), f"{fields.path}.{key}")


def _names(fields: ClosedObject, key: str) -> list[str]:
    return [api.check_name(item, path) for path, item in fields.pop_list(key, min_items=0, max_items=64)]


def _strings(fields: ClosedObject, key: str, *, min_items: int, max_items: int) -> list[str]:
    found = []
    for path, item in fields.pop_list(key, min_items=min_items, max_items=max_items):
        if type(item) is not str or "\x00" in item or len(item.encode("utf-8")) > 131_072:
            raise strictjson.StrictJSONError(path, "must be a string without NUL of at most 128 KiB")
        found.append(item)
    return found


def _environment(fields: ClosedObject) -> dict[str, str]:
    env = fields.pop_object("env")
    values = {}
    for key in env.keys():
        if not key or not (key[0].isalpha() or key[0] == "_") or not all(c.isascii() and (c.isalnum() or c == "_") for c in key):
            raise strictjson.StrictJSONError(f"{env.path}.{key}", _ENV_NAME)
        values[key] = env.pop_str(key, max_bytes=131_072)
    env.done()
    return values


@dataclasses.dataclass(frozen=True)
class Ending:
    """Why a session's thread stops taking requests: ABANDONED, IDLE or SHUTDOWN, and what its client is told."""

    ending: str
    reason: str


def _turn_away(sock: socket.socket, kind: str, body: dict) -> None:
    """Answer the first request (seq 0) before it is even sent, then close: nothing is read and nothing waits;
    the client reads the answer when its OPEN cannot be sent. REFUSED for a uid that may not connect, FAILED
    (``open`` false) for a connection over a cap."""
    try:
        sock.setblocking(False)
        Endpoint(sock, STEWARD).send(kind, body, re=0)
    except (WireError, OSError):
        pass
    finally:
        sock.close()


@dataclasses.dataclass(frozen=True)
class _Served:
    """A selector key's data: this connection has a request being served (see Server._watch)."""

    connection: "Connection"


class Connection:
    """One client's connection: at most one session, driven by its requests in order on the session's thread."""

    def __init__(self, server: "Server", sock: socket.socket, peer: tuple[int, int, int]) -> None:
        self.server = server
        self.sock = sock
        self.peer = peer
        self.endpoint = Endpoint(sock, STEWARD)
        self.session: Session | None = None
        self.inbox: queue.SimpleQueue | None = None
        self.thread: threading.Thread | None = None
        # The selector loop's own: whether it waits for the next request, and since when; whether it watches
        # for the client hanging up while a request is served.
        self.waiting = False
        self.watching = False
        self.idle_since = time.monotonic()
        # None while the session's thread runs; then "retired", or why it could not be.
        self.outcome: str | None = None

    def describe(self) -> str:
        pid, uid, gid = self.peer
        return f"client pid {pid} uid {uid} gid {gid}"

    def tell(self, reason: str) -> None:
        """FAILED with ``open`` false in answer to the request the client would send next: why it ends."""
        try:
            self.endpoint.send("FAILED", {"reason": reason, "open": False}, re=self.endpoint.recv_seq)
        except WireError:
            pass

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def hang_up(self) -> None:
        """The session's thread is done: the client sees the end at once, while the descriptor stays open (the
        selector loop may still watch it) until the loop forgets the connection and closes it, so its number is
        never reused under a stale registration."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # -- the session's thread -------------------------------------------------

    def start(self, first: Message) -> None:
        self.inbox = queue.SimpleQueue()
        self.inbox.put(first)
        self.thread = threading.Thread(target=self._work, name=f"casebox-client-{self.peer[0]}", daemon=True)
        self.thread.start()

    def _work(self) -> None:
        ending = Ending("ABANDONED", "")
        try:
            while True:
                item = self.inbox.get()
                if isinstance(item, Ending):
                    ending = item
                    break
                if not self.handle(item):
                    break
                self.server.notice(self, ready=True)
        except WireError as error:
            if self.session is None or not self.session.ended:
                log(f"{self.describe()}: {error}")
        except Exception as error:  # the session is still retired below; the daemon goes on
            log(f"{self.describe()}: {type(error).__name__}: {error}\n{traceback.format_exc()}")
        finally:
            try:
                self._end(ending)
            finally:
                self.hang_up()
                self.server.notice(self, ready=False)

    def _end(self, ending: Ending) -> None:
        session = self.session
        if session is None or session.ended:
            if self.outcome is None:
                self.outcome = "retired"
            return
        if ending.ending == "ABANDONED":
            log(f"{self.describe()} left stage {session.stage_id} before CLOSE; cleaning up and retiring it as UNVERIFIED")
        else:
            self.tell(ending.reason)
            log(f"{self.describe()}: stage {session.stage_id}: {ending.reason}")
        try:
            closed = session.end(ending.ending)
        except Exception as error:  # the stage stays for `casebox stage recover`
            self.outcome = f"{type(error).__name__}: {error}"
            log(f"ending stage {session.stage_id} failed: {self.outcome}; run casebox stage recover")
            return
        self.outcome = "retired"
        log(f"stage {closed.stage_id} retired: {closed.cleanup}, {closed.diagnostic}")

    def handle(self, message: Message) -> bool:
        """Serve one request; False once the connection is finished."""
        handler = getattr(self, f"_do_{message.type.lower()}")
        if (self.session is None) != (message.type == "OPEN") or (self.session is not None and self.session.ended):
            message.close_fds()
            raise WireError(f"{message.type} arrived where {'OPEN' if self.session is None else 'a session request'} was expected")
        fields = ClosedObject(message.body, "$.body")
        reply_fds: tuple[int, ...] = ()
        try:
            body, reply_fds = handler(fields, message.fds)
        except Refused as refusal:
            self.endpoint.send("REFUSED", {"where": refusal.where, "rule": refusal.rule}, re=message.seq)
            return True
        except SandboxFailure as failure:
            still = self.session is not None and not self.session.ended
            if not still and self.session is not None:
                self.outcome = str(failure)
            self.endpoint.send("FAILED", {"reason": str(failure), "open": still}, re=message.seq)
            return still
        except Exception as error:
            log(f"{self.describe()}: {message.type} failed: {type(error).__name__}: {error}\n{traceback.format_exc()}")
            self.endpoint.send("FAILED", {"reason": f"internal error: {type(error).__name__}: {error}", "open": False}, re=message.seq)
            return False
        finally:
            for fd in message.fds:
                os.close(fd)
            message.fds = []
        try:
            self.endpoint.send("OK", body, fds=reply_fds, re=message.seq)
        finally:
            for fd in reply_fds:
                os.close(fd)
        return message.type not in ("CLOSE", "END")

    # Each handler returns (OK body, descriptors to send); descriptors it takes over it removes from ``fds``.

    def _do_open(self, fields: ClosedObject, fds: list[int]):
        attempt_id = fields.pop_str("attempt_id", max_bytes=64)
        fields.done()
        self.session = self.server.steward.open_session(attempt_id, client_uid=self.peer[1])
        log(f"{self.describe()} opened stage {self.session.stage_id} for attempt {attempt_id}")
        return self.session.info().to_wire(), ()

    def _do_capability(self, fields: ClosedObject, fds: list[int]):
        name = _name(fields)
        mount = fields.pop_nullable("mount")
        fields.done()
        if mount is not None:
            api.check_mount(mount, "$.mount")
        self.session.add_capability(name, fds.pop(), mount)
        return {}, ()

    def _do_interpreter(self, fields: ClosedObject, fds: list[int]):
        path = fields.pop_str("path", max_bytes=4096)
        fields.done()
        self.session.set_interpreter(fds.pop(), path)
        return {}, ()

    def _do_output(self, fields: ClosedObject, fds: list[int]):
        name = _name(fields)
        max_bytes = fields.pop_int("max_bytes", low=1, high=2**40)
        max_inodes = fields.pop_int("max_inodes", low=1, high=2**32)
        fields.done()
        self.session.create_output(name, max_bytes=max_bytes, max_inodes=max_inodes)
        return {}, ()

    def _do_start(self, fields: ClosedObject, fds: list[int]):
        read, write = _names(fields, "read"), _names(fields, "write")
        limits = api.Limits.from_wire(fields.pop_object("limits"))
        network = api.check_network(fields.pop_str("network", max_bytes=16), f"{fields.path}.network")
        index = fields.pop_str("index", max_bytes=4_096) if fields.has("index") else None
        fields.done()
        return self.session.start_sandbox(read=read, write=write, limits=limits, network=network, index=index).to_wire(), ()

    def _do_start_ahead(self, fields: ClosedObject, fds: list[int]):
        read, write = _names(fields, "read"), _names(fields, "write")
        limits = api.Limits.from_wire(fields.pop_object("limits"))
        fields.done()
        return {"sandbox": self.session.start_ahead(read=read, write=write, limits=limits)}, ()

    def _do_take(self, fields: ClosedObject, fds: list[int]):
        fields.done()
        return self.session.take_sandbox().to_wire(), ()

    def _do_run(self, fields: ClosedObject, fds: list[int]):
        argv = _strings(fields, "argv", min_items=1, max_items=4_096)
        env = _environment(fields)
        cwd = fields.pop_str("cwd", max_bytes=4_096)
        timeout_ms = fields.pop_int("timeout_ms", low=1, high=86_400_000)
        stdout_cap = fields.pop_int("stdout_cap", low=0, high=api.MAX_OUTPUT)
        stderr_cap = fields.pop_int("stderr_cap", low=0, high=api.MAX_OUTPUT)
        fields.done()
        outcome = self.session.run(argv, env=env, cwd=cwd, timeout_ms=timeout_ms, stdout_cap=stdout_cap, stderr_cap=stderr_cap)
        return outcome.to_wire(), ()

    def _do_stop(self, fields: ClosedObject, fds: list[int]):
        fields.done()
        return {"head": self.session.close_sandbox()}, ()

    def _do_seal(self, fields: ClosedObject, fds: list[int]):
        name = _name(fields)
        fields.done()
        return self.session.seal_output(name).to_wire(), ()

    def _do_open_output(self, fields: ClosedObject, fds: list[int]):
        name = _name(fields)
        fields.done()
        return {}, (self.session.open_output(name),)

    def _do_publish(self, fields: ClosedObject, fds: list[int]):
        name = fields.pop_str("name", max_bytes=255)
        text = fields.pop_str("data", max_bytes=(api.MAX_EVIDENCE_BYTES + 2) // 3 * 4, ascii_only=True)
        fields.done()
        try:
            data = base64.b64decode(text.encode("ascii"), validate=True)
        except (binascii.Error, ValueError):
            raise Refused("$.body.data", "must be base64") from None
        self.session.publish(name, data)
        return {}, ()

    def _do_close(self, fields: ClosedObject, fds: list[int]):
        fields.done()
        closed = self.session.close(fds[0] if fds else None)
        self.outcome = "retired"
        log(f"{self.describe()} closed stage {closed.stage_id}: {closed.cleanup}, {closed.diagnostic}")
        return closed.to_wire(), ()

    def _do_end(self, fields: ClosedObject, fds: list[int]):
        ending = fields.pop_str("ending", max_bytes=32)
        fields.done()
        if ending not in api.CLIENT_ENDINGS:
            raise Refused("$.body.ending", f"must be one of {', '.join(api.CLIENT_ENDINGS)}")
        closed = self.session.end(ending)
        self.outcome = "retired"
        log(f"{self.describe()} ended stage {closed.stage_id} as {ending}: {closed.cleanup}, {closed.diagnostic}")
        return closed.to_wire(), ()


def _check_socket_directory(directory: str) -> None:
    """The socket's directory is root's alone to write (F3): anyone else could swap the socket for a link."""
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise Refused(directory, "must be a directory, not a symlink or a file; it holds the steward's socket")
    if info.st_uid != 0 or info.st_mode & 0o022:
        raise Refused(
            directory,
            f"is owned by uid {info.st_uid} with mode {stat.S_IMODE(info.st_mode):04o}; the steward's socket lives "
            "only in a directory root owns and no one else can write",
        )


def socket_gid(group: str | int) -> int | None:
    """The gid that may connect to the socket: ``group`` as a gid, or the gid of the group so named (None if none)."""
    if type(group) is int:
        return group
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        return None


def raise_descriptor_limit(needed: int) -> int:
    """Raise the soft RLIMIT_NOFILE towards ``needed`` (as far as the hard limit allows); the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        soft = wanted
    return soft


class Server:
    """The listening socket, the selector loop and the connections; every method but :meth:`notice` and
    :meth:`stop` runs on the loop's thread."""

    def __init__(
        self, steward: Steward, *, socket_path: str, client_uids: tuple[int, ...], bounds: Bounds,
        socket_group: str | int = SOCKET_GROUP,
    ) -> None:
        self.steward = steward
        self.socket_path = socket_path
        self.client_uids = frozenset(client_uids)
        self.socket_group = socket_group
        self.bounds = bounds
        self.listener: socket.socket | None = None
        self.connections: set[Connection] = set()
        self.per_uid: dict[int, int] = {}
        self._selector = selectors.DefaultSelector()
        self._stop_read, self._stop_write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._wake_read, self._wake_write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._notices: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_lock = threading.Lock()
        self._spare: int | None = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self._stopping = False

    def listen(self) -> str:
        """Bind the socket with its access mode; a description of who may connect."""
        directory = os.path.dirname(self.socket_path)
        os.makedirs(directory, mode=0o755, exist_ok=True)
        _check_socket_directory(directory)
        self._remove_stale()
        group = socket_gid(self.socket_group)
        mode = 0o600 if group is None else 0o660
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            # bind() makes the socket with this mode; nothing is changed through the path afterwards but its
            # group, never following a symlink, so the path cannot be turned into another file's.
            old = os.umask(0o777 & ~mode)
            try:
                listener.bind(self.socket_path)
            finally:
                os.umask(old)
            if group is None:
                access = f"mode 0600, root only (no group {self.socket_group})"
            else:
                os.chown(self.socket_path, 0, group, follow_symlinks=False)
                access = f"mode 0660, group {self.socket_group}"
            listener.listen(BACKLOG)
        except BaseException:
            listener.close()
            raise
        self.listener = listener
        return access

    def _remove_stale(self) -> None:
        try:
            info = os.lstat(self.socket_path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(info.st_mode):
            raise Refused(self.socket_path, "exists and is not a socket; the steward will not replace it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            probe.connect(self.socket_path)
        except OSError as error:
            if error.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                raise
            os.unlink(self.socket_path)
            return
        finally:
            probe.close()
        raise Refused(self.socket_path, "another steward is already serving on it")

    def stop(self) -> None:
        """Ask serve_forever to stop (safe from a signal handler or another thread)."""
        try:
            os.write(self._stop_write, b"x")
        except BlockingIOError:
            pass

    def notice(self, connection: Connection, *, ready: bool) -> None:
        """From a session's thread: its connection waits for its next request (``ready``), or it is finished."""
        self._notices.put((connection, ready))
        with self._wake_lock:
            if self._wake_write is None:
                return  # the loop has ended; a session's thread may outlive it only until the process exits
            try:
                os.write(self._wake_write, b"x")
            except BlockingIOError:
                pass  # the loop is already woken

    def serve_forever(self) -> int:
        """Serve until stop(); the exit code of the shutdown (0 when every open session was retired in time)."""
        self.listener.setblocking(False)
        self._selector.register(self.listener, selectors.EVENT_READ)
        self._selector.register(self._stop_read, selectors.EVENT_READ)
        self._selector.register(self._wake_read, selectors.EVENT_READ)
        try:
            while not self._stopping:
                for key, _ in self._selector.select(self._timeout()):
                    if key.fileobj is self.listener:
                        self._accept()
                    elif key.fileobj == self._stop_read:
                        self._stopping = True
                    elif key.fileobj == self._wake_read:
                        self._take_notices()
                    elif isinstance(key.data, _Served):
                        self._hung_up(key.data.connection)
                    else:
                        self._receive(key.data)
                self._end_idle()
            return self._shut_down()
        finally:
            self.close()

    def close(self) -> None:
        """Release the loop's own descriptors (once; serve_forever does it when it returns)."""
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        self._selector.close()
        with self._wake_lock:
            if self._wake_write is not None:
                for fd in (self._stop_read, self._stop_write, self._wake_read, self._wake_write):
                    os.close(fd)
                self._wake_write = None
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None

    # -- connections ------------------------------------------------------------

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_TURN):
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as error:
                if error.errno in (errno.EMFILE, errno.ENFILE):
                    self._shed()
                return
            self._admit(sock)

    def _shed(self) -> None:
        """No descriptor is left: give up the spare to take the waiting connection and refuse it."""
        if self._spare is None:
            return
        os.close(self._spare)
        self._spare = None
        try:
            sock, _ = self.listener.accept()
        except OSError:
            sock = None
        if sock is not None:
            log(f"refused client pid {seqpacket.peer_credentials(sock)[0]}: no descriptor is left (RLIMIT_NOFILE)")
            reason = "the steward has no descriptor left for another connection; try again later"
            _turn_away(sock, "FAILED", {"reason": reason, "open": False})
        try:
            self._spare = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._spare = None

    def _admit(self, sock: socket.socket) -> None:
        peer = seqpacket.peer_credentials(sock)
        pid, uid, gid = peer
        if uid not in self.client_uids:
            log(f"refused client pid {pid} uid {uid} gid {gid}: uid {uid} is not in client_uids")
            rule = f"{uid} is not allowed to use this steward (client_uids)"
            _turn_away(sock, "REFUSED", {"where": "client uid", "rule": rule})
            return
        reason = self._over_cap(uid)
        if reason is not None:
            log(f"refused client pid {pid} uid {uid} gid {gid}: {reason}")
            _turn_away(sock, "FAILED", {"reason": reason, "open": False})
            return
        try:
            seqpacket.force_send_buffer(sock)
        except OSError:
            pass
        sock.settimeout(SEND_SECONDS)
        connection = Connection(self, sock, peer)
        self.connections.add(connection)
        self.per_uid[uid] = self.per_uid.get(uid, 0) + 1
        self._wait_for_request(connection)

    def _over_cap(self, uid: int) -> str | None:
        """Why one more connection from ``uid`` would pass a cap, or None to admit it (root's never count
        against max_connections, so root is always served)."""
        bounds = self.bounds
        if self.per_uid.get(uid, 0) >= bounds.max_connections_per_uid:
            return (
                f"uid {uid} already has {bounds.max_connections_per_uid} connections to this steward "
                "(max_connections_per_uid); try again once one has ended"
            )
        others = sum(count for owner, count in self.per_uid.items() if owner != ROOT)
        if uid != ROOT and others >= bounds.max_connections:
            return (
                f"the steward already serves {bounds.max_connections} connections (max_connections); "
                "try again once one has ended"
            )
        return None

    def _wait_for_request(self, connection: Connection) -> None:
        self._busy(connection)
        connection.waiting = True
        connection.idle_since = time.monotonic()
        self._selector.register(connection.sock, selectors.EVENT_READ, connection)

    def _busy(self, connection: Connection) -> None:
        if connection.waiting or connection.watching:
            self._selector.unregister(connection.sock)
            connection.waiting = connection.watching = False

    def _watch(self, connection: Connection) -> None:
        """While its request is served: a client that hangs up (interrupted) ends its op at once, not at the op's
        timeout. A client sends nothing else while it waits for a reply."""
        self._selector.register(connection.sock, selectors.EVENT_READ, _Served(connection))
        connection.watching = True

    def _hung_up(self, connection: Connection) -> None:
        if not connection.watching:
            return  # an event of the same turn as the request's end: it waits for the next request again
        self._busy(connection)
        try:
            early = connection.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            self._watch(connection)  # nothing to read after all: keep watching
            return
        except OSError:
            early = b""
        # A request sent early stays for the session's thread, which reads it after its reply, as always.
        if early == b"" and connection.session is not None and not connection.session.ended:
            log(f"{connection.describe()} hung up during a request; ending its op")
            connection.session.halt()

    def _forget(self, connection: Connection) -> None:
        self._busy(connection)
        connection.close()
        if connection in self.connections:
            self.connections.discard(connection)
            uid = connection.peer[1]
            self.per_uid[uid] -= 1
            if not self.per_uid[uid]:
                del self.per_uid[uid]

    def _receive(self, connection: Connection) -> None:
        self._busy(connection)
        try:
            message = connection.endpoint.receive()
        except WireError as error:
            log(f"{connection.describe()}: {error}")
            if connection.thread is None:
                self._forget(connection)
            else:
                connection.inbox.put(Ending("ABANDONED", str(error)))
            return
        if connection.thread is None:
            connection.start(message)
        else:
            connection.inbox.put(message)
        self._watch(connection)

    def _take_notices(self) -> None:
        try:
            while os.read(self._wake_read, 4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                connection, ready = self._notices.get_nowait()
            except queue.Empty:
                return
            if not ready:
                self._forget(connection)
            elif not self._stopping and connection in self.connections:
                self._wait_for_request(connection)

    def _timeout(self) -> float | None:
        waiting = [connection.idle_since for connection in self.connections if connection.waiting]
        if not waiting:
            return None
        return max(0.0, min(waiting) + self.bounds.idle_seconds - time.monotonic())

    def _end_idle(self) -> None:
        now = time.monotonic()
        idle = self.bounds.idle_seconds
        for connection in [each for each in self.connections if each.waiting and now - each.idle_since >= idle]:
            self._busy(connection)
            if connection.thread is None:
                log(f"{connection.describe()} sent nothing for {idle:g} s (idle_seconds); closed")
                connection.tell(f"the connection sent nothing for {idle:g} s (idle_seconds); the steward closed it")
                self._forget(connection)
            else:
                connection.inbox.put(Ending(
                    "IDLE",
                    f"the session sent nothing for {idle:g} s (idle_seconds); the steward ended it and retires its "
                    "stage as UNVERIFIED (SESSION_IDLE)",
                ))

    # -- stopping ---------------------------------------------------------------

    def _shut_down(self) -> int:
        """Stop accepting, end every running op, retire every open session; 0 only if all were retired in time."""
        self._selector.unregister(self.listener)
        self.listener.close()
        self.listener = None
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        self.steward.stopping.set()
        deadline = time.monotonic() + self.bounds.stop_seconds
        reason = ("the steward is shutting down; it ended the running op, if any, and retires this session as "
                  "UNVERIFIED (SHUTDOWN)")
        open_sessions = []
        for connection in list(self.connections):
            self._busy(connection)
            if connection.thread is None:
                connection.tell("the steward is shutting down")
                self._forget(connection)
                continue
            if connection.session is not None:
                connection.session.halt()
            connection.inbox.put(Ending("SHUTDOWN", reason))
            open_sessions.append(connection)
        left = []
        for connection in open_sessions:
            connection.thread.join(max(0.0, deadline - time.monotonic()))
            if connection.thread.is_alive():
                left.append((connection, f"was not retired within {self.bounds.stop_seconds:g} s (stop_seconds)"))
            elif connection.outcome != "retired":
                left.append((connection, f"could not be retired: {connection.outcome}"))
            if not connection.thread.is_alive():
                self._forget(connection)
        for connection, why in left:
            stage = connection.session.stage_id if connection.session is not None else "(none yet)"
            log(f"stage {stage} of {connection.describe()} {why}; casebox stage recover --all finishes it")
        return 0 if not left else 1


def serve(
    steward: Steward, *, socket_path: str, client_uids: tuple[int, ...], bounds: Bounds, socket_group: str | int = SOCKET_GROUP,
) -> int:
    """Run the daemon until SIGTERM or SIGINT; the exit code (0 when every open session was retired in time)."""
    server = Server(steward, socket_path=socket_path, client_uids=client_uids, socket_group=socket_group, bounds=bounds)
    access = server.listen()
    needed = descriptors_needed(bounds)
    limit = raise_descriptor_limit(needed)
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: server.stop())
    log(
        f"serving on {socket_path} ({access}); state root {steward.settings.state_root}; client uids {sorted(client_uids)}; "
        f"at most {bounds.max_connections_per_uid} connections per uid and {bounds.max_connections} in all besides root's, "
        f"idle after {bounds.idle_seconds:g} s"
    )
    if limit != resource.RLIM_INFINITY and limit < needed:
        log(f"the descriptor limit is {limit}, below the {needed} these connection caps may need; raise LimitNOFILE")
    notify("READY=1")
    code = 1
    try:
        code = server.serve_forever()
    finally:
        notify("STOPPING=1")
        log("stopped: every open session was retired" if code == 0 else "stopped with sessions left for recovery")
    return code
