"""The steward daemon: ``casebox steward serve`` (docs/steward-protocol.md, docs/operations.md).

It listens on a Unix SOCK_SEQPACKET socket (mode 0660 with the group
``socket_group``, by default ``casebox``, when that group exists, else 0600,
root only), authenticates each peer with
SO_PEERCRED against ``client_uids``, and serves one session per connection,
each in its own thread, through the same :class:`~steward.session.Session`
the embedded mode uses. A refused peer and every protocol failure are
logged on stderr. A client that disconnects before CLOSE abandons its
session: it is cleaned up and retired as UNVERIFIED. With ``NOTIFY_SOCKET``
set it tells systemd ``READY=1`` once it listens. SIGTERM or SIGINT stops
accepting, abandons the sessions still open and exits 0.
"""

from __future__ import annotations

import base64
import binascii
import errno
import grp
import os
import selectors
import signal
import socket
import stat
import sys
import threading
import time
import traceback

from journal import strictjson
from journal.closed import ClosedObject
from journal.errors import SENTENCE_LIMIT, Refused
from journal.untrusted import escape
from steward import api
from steward.failure import SandboxFailure
from steward.session import Session, Steward
from steward.wire import SOCKET_BUFFER, STEWARD, Endpoint, WireError, peer_credentials

SOCKET_GROUP = "casebox"
BACKLOG = 16
STOP_SECONDS = 60.0
REFUSAL_SECONDS = 5.0
_ENV_NAME = "must be a variable name of A-Z a-z 0-9 _, not starting with a digit"
_SO_SNDBUFFORCE = 32


def log(text: str) -> None:
    print(f"casebox-steward: {escape(text, limit=SENTENCE_LIMIT)}", file=sys.stderr, flush=True)


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


class Connection:
    """One client's connection: at most one session, driven by its requests in order."""

    def __init__(self, server: "Server", sock: socket.socket, peer: tuple[int, int, int]) -> None:
        self.server = server
        self.sock = sock
        self.peer = peer
        self.endpoint = Endpoint(sock, STEWARD)
        self.session: Session | None = None

    def describe(self) -> str:
        pid, uid, gid = self.peer
        return f"client pid {pid} uid {uid} gid {gid}"

    def serve(self) -> None:
        try:
            while self._one():
                pass
        except WireError as error:
            if self.session is None or not self.session.ended:
                log(f"{self.describe()}: {error}")
        finally:
            self._end()

    def _end(self) -> None:
        session = self.session
        if session is not None and not session.ended:
            log(f"{self.describe()} left stage {session.stage_id} before CLOSE; cleaning up and retiring it as UNVERIFIED")
            try:
                closed = session.abandon()
                log(f"stage {closed.stage_id} retired: {closed.cleanup}, {closed.diagnostic}")
            except Exception as error:  # the stage stays for `casebox stage recover`
                log(f"abandoning stage {session.stage_id} failed: {type(error).__name__}: {error}; run casebox stage recover")
        try:
            self.sock.close()
        except OSError:
            pass

    def _one(self) -> bool:
        """Serve one request; False once the connection is finished."""
        message = self.endpoint.receive()
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
            self.endpoint.send("FAILED", {"reason": str(failure), "open": not self.session.ended}, re=message.seq)
            return not self.session.ended
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
        return message.type != "CLOSE"

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
        fields.done()
        return self.session.start_sandbox(read=read, write=write, limits=limits, network=network).to_wire(), ()

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
        log(f"{self.describe()} closed stage {closed.stage_id}: {closed.cleanup}, {closed.diagnostic}")
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


def _refuse(connection: Connection) -> None:
    """Answer a peer whose uid is not allowed: REFUSED to its first request, then close; nothing else is read."""
    sock = connection.sock
    try:
        sock.settimeout(REFUSAL_SECONDS)
        request = connection.endpoint.receive()
        request.close_fds()
        rule = f"{connection.peer[1]} is not allowed to use this steward (client_uids)"
        connection.endpoint.send("REFUSED", {"where": "client uid", "rule": rule}, re=request.seq)
    except (WireError, OSError):
        pass
    finally:
        sock.close()


def socket_gid(group: str | int) -> int | None:
    """The gid that may connect to the socket: ``group`` as a gid, or the gid of the group so named (None if none)."""
    if type(group) is int:
        return group
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        return None


class Server:
    """The listening socket and its connections."""

    def __init__(
        self, steward: Steward, *, socket_path: str, client_uids: tuple[int, ...], socket_group: str | int = SOCKET_GROUP,
    ) -> None:
        self.steward = steward
        self.socket_path = socket_path
        self.client_uids = frozenset(client_uids)
        self.socket_group = socket_group
        self.listener: socket.socket | None = None
        self.connections: set[Connection] = set()
        self.threads: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._stop_read, self._stop_write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)

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

    def serve_forever(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.listener, selectors.EVENT_READ)
        selector.register(self._stop_read, selectors.EVENT_READ)
        try:
            while True:
                ready = {key.fileobj for key, _ in selector.select()}
                if self._stop_read in ready:
                    break
                if self.listener in ready:
                    self._accept()
        finally:
            selector.close()
            self._shut_down()

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        peer = peer_credentials(sock)
        if peer[1] not in self.client_uids:
            log(f"refused client pid {peer[0]} uid {peer[1]} gid {peer[2]}: uid {peer[1]} is not in client_uids")
            target = _refuse
        else:
            target = self._run
        try:
            sock.setsockopt(socket.SOL_SOCKET, _SO_SNDBUFFORCE, SOCKET_BUFFER)
        except OSError:
            pass
        connection = Connection(self, sock, peer)
        thread = threading.Thread(target=target, args=(connection,), name=f"casebox-client-{peer[0]}", daemon=True)
        with self._lock:
            self.connections.add(connection)
            self.threads.add(thread)
        thread.start()

    def _run(self, connection: Connection) -> None:
        try:
            connection.serve()
        finally:
            with self._lock:
                self.connections.discard(connection)
                self.threads.discard(threading.current_thread())

    def _shut_down(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
            try:
                os.unlink(self.socket_path)
            except FileNotFoundError:
                pass
        with self._lock:
            connections, threads = list(self.connections), list(self.threads)
        for connection in connections:
            try:
                connection.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + STOP_SECONDS
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        os.close(self._stop_read)
        os.close(self._stop_write)


def serve(steward: Steward, *, socket_path: str, client_uids: tuple[int, ...], socket_group: str | int = SOCKET_GROUP) -> int:
    """Run the daemon until SIGTERM or SIGINT; the exit code."""
    server = Server(steward, socket_path=socket_path, client_uids=client_uids, socket_group=socket_group)
    access = server.listen()
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: server.stop())
    log(f"serving on {socket_path} ({access}); state root {steward.settings.state_root}; client uids {sorted(client_uids)}")
    notify("READY=1")
    try:
        server.serve_forever()
    finally:
        notify("STOPPING=1")
        log("stopped")
    return 0
