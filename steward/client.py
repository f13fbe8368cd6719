"""The steward's client: the session API over the daemon's socket (docs/steward-protocol.md).

:class:`RemoteSession` has exactly the methods and return values of
:class:`steward.session.Session`; its requests are the protocol's one
encoder. A REFUSED reply raises ``Refused``, FAILED raises
``SandboxFailure``; anything that breaks the protocol raises ``WireError``.
This module is light (the standard library and journal/), for unprivileged
callers.

The client obeys the steward's end of a session: after a FAILED reply with
``open`` false (the steward ended the session: idle, shutting down, its state
root full, an internal error) it sends nothing more, and every later call
raises :class:`SessionEnded` with the steward's own reason. The steward may
say so before it is asked (idle, shutdown, a refused connection) and close
the connection: a request that can no longer be sent then reads the answer
already waiting for it.
"""

from __future__ import annotations

import base64
import errno
import os
import socket
from typing import Sequence

from journal.closed import ClosedObject
from journal.errors import Refused
from journal.format import pop_id
from steward import api
from steward.failure import SandboxFailure
from steward.wire import CLIENT, Endpoint, PeerGone, WireError


class Unreachable(Exception):
    """No steward answers on the socket."""


class SessionEnded(SandboxFailure):
    """The steward ended the session (FAILED with ``open`` false); the message is its reason."""


class RemoteSession:
    """One session served by the daemon; the same calls as an in-process Session."""

    def __init__(self, endpoint: Endpoint, opened: api.Opened) -> None:
        self._endpoint = endpoint
        self._opened = opened
        self.stage_id = opened.stage_id
        self.journal_id = opened.journal_id
        self.attempt_id = opened.attempt_id
        self.ended = False
        self._ended_by_steward: SessionEnded | None = None

    def info(self) -> api.Opened:
        return self._opened

    def _call(self, kind: str, body: dict, *, fds: tuple[int, ...] = (), expect_fd: bool = False) -> tuple[ClosedObject, list[int]]:
        if self._ended_by_steward is not None:
            raise SessionEnded(str(self._ended_by_steward))
        if self.ended:
            raise Refused("session", "is already closed")
        try:
            return _call(self._endpoint, kind, body, fds=fds, expect_fd=expect_fd)
        except SessionEnded as ended:
            self._ended_by_steward = ended
            self._hang_up()
            raise

    def add_capability(self, name: str, fd: int, mount: str | None = None) -> None:
        """Send the capability; like the in-process call, this takes ownership of ``fd`` (it is closed here)."""
        try:
            fields, _ = self._call("CAPABILITY", {"name": name, "mount": mount}, fds=(fd,))
        finally:
            os.close(fd)
        fields.done()

    def set_interpreter(self, fd: int, path: str) -> None:
        """Send the interpreter to copy execute-only; like the in-process call, this takes ownership of ``fd``."""
        try:
            fields, _ = self._call("INTERPRETER", {"path": path}, fds=(fd,))
        finally:
            os.close(fd)
        fields.done()

    def create_output(self, name: str, *, max_bytes: int = 256 * api.MIB, max_inodes: int = 16_384) -> None:
        fields, _ = self._call("OUTPUT", {"name": name, "max_bytes": max_bytes, "max_inodes": max_inodes})
        fields.done()

    def start_sandbox(
        self, *, read: Sequence[str] = (), write: Sequence[str] = (), limits: api.Limits = api.Limits(), network: str = api.LOOPBACK,
        index: str | None = None,
    ) -> api.Ready:
        request = {"read": list(read), "write": list(write), "limits": limits.to_wire(), "network": network}
        if index is not None:
            request["index"] = index
        fields, _ = self._call("START", request)
        return api.Ready.from_wire(fields)

    def start_ahead(self, *, read: Sequence[str] = (), write: Sequence[str] = (), limits: api.Limits = api.Limits()) -> str:
        fields, _ = self._call("START_AHEAD", {"read": list(read), "write": list(write), "limits": limits.to_wire()})
        sandbox = pop_id(fields, "sandbox")
        fields.done()
        return sandbox

    def take_sandbox(self) -> api.Ready:
        fields, _ = self._call("TAKE", {})
        return api.Ready.from_wire(fields)

    def run(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str],
        cwd: str = "/work",
        timeout_ms: int,
        stdout_cap: int,
        stderr_cap: int,
    ) -> api.OpOutcome:
        fields, _ = self._call("RUN", {
            "argv": list(argv), "env": dict(env), "cwd": cwd, "timeout_ms": timeout_ms,
            "stdout_cap": stdout_cap, "stderr_cap": stderr_cap,
        })
        return api.OpOutcome.from_wire(fields)

    def close_sandbox(self) -> str:
        fields, _ = self._call("STOP", {})
        head = fields.pop_sha256("head")
        fields.done()
        return head

    def seal_output(self, name: str) -> api.Sealed:
        fields, _ = self._call("SEAL", {"name": name})
        return api.Sealed.from_wire(fields)

    def open_output(self, name: str) -> int:
        fields, fds = self._call("OPEN_OUTPUT", {"name": name}, expect_fd=True)
        fields.done()
        return fds[0]

    def publish(self, name: str, data: bytes) -> None:
        fields, _ = self._call("PUBLISH", {"name": name, "data": base64.b64encode(data).decode("ascii")})
        fields.done()

    def close(self, evidence_fd: int | None = None) -> api.Closed:
        fields, _ = self._call("CLOSE", {}, fds=() if evidence_fd is None else (evidence_fd,))
        return self._finished(fields)

    def halt(self) -> None:
        """Interrupted, from another thread: shut the connection down, which ends the call waiting on it. The
        daemon, its client gone, kills the op and retires the stage UNVERIFIED, as after abandon."""
        try:
            self._endpoint.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed: the session has ended

    def end(self, ending: str) -> api.Closed:
        """End the session without exporting anything, for a reason of the client's (api.CLIENT_ENDINGS): the
        daemon cleans up and retires the stage as UNVERIFIED, that reason its diagnostic."""
        fields, _ = self._call("END", {"ending": ending})
        return self._finished(fields)

    def _finished(self, fields: ClosedObject) -> api.Closed:
        """The daemon's answer to the session's last request; the connection ends with it."""
        closed = api.Closed.from_wire(fields)
        self._hang_up()
        return closed

    def abandon(self) -> None:
        """Go away without CLOSE: the daemon cleans up and retires the stage as UNVERIFIED (if it has not already)."""
        self._hang_up()

    def _hang_up(self) -> None:
        self.ended = True
        self._endpoint.sock.close()


def _call(endpoint: Endpoint, kind: str, body: dict, *, fds: tuple[int, ...] = (), expect_fd: bool = False):
    seq = endpoint.send_seq
    try:
        endpoint.send(kind, body, fds=fds)
    except PeerGone:
        # The steward closed the connection; what it said before that (its answer to this request,
        # sent before it was asked) is still there to read, else the receive says the peer is gone.
        pass
    try:
        reply = endpoint.receive()
    except PeerGone:
        # It closed with this request unread: the reset is reported first, its answer comes next.
        reply = endpoint.receive()
    try:
        if reply.re != seq:
            raise WireError(f"the reply names request {reply.re}, not {seq}")
        fields = ClosedObject(reply.body, "$.body")
        if reply.type == "REFUSED":
            where, rule = fields.pop_str("where", max_bytes=4_096), fields.pop_str("rule", max_bytes=4_096)
            fields.done()
            raise Refused(where, rule)
        if reply.type == "FAILED":
            reason = fields.pop_str("reason", max_bytes=8_192)
            still_open = fields.pop_bool("open")
            fields.done()
            raise SandboxFailure(reason) if still_open else SessionEnded(reason)
        if len(reply.fds) != (1 if expect_fd else 0):
            raise WireError(f"the reply to {kind} carried {len(reply.fds)} descriptors")
    except BaseException:
        reply.close_fds()
        raise
    return fields, reply.fds


class Connection:
    """A connection to the daemon, before its session is opened."""

    def __init__(self, sock: socket.socket) -> None:
        self._endpoint = Endpoint(sock, CLIENT)

    def open_session(self, attempt_id: str) -> RemoteSession:
        try:
            fields, _ = _call(self._endpoint, "OPEN", {"attempt_id": attempt_id})
        except BaseException:
            self._endpoint.sock.close()
            raise
        return RemoteSession(self._endpoint, api.Opened.from_wire(fields))

    def close(self) -> None:
        self._endpoint.sock.close()


def connect(socket_path: str) -> Connection:
    """A connection to the daemon at ``socket_path``; Unreachable when no steward listens there."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        sock.connect(socket_path)
    except OSError as error:
        sock.close()
        if error.errno in (errno.ENOENT, errno.ECONNREFUSED, errno.ENOTDIR):
            raise Unreachable(f"no steward listens on {socket_path}") from None
        if error.errno == errno.EACCES:
            raise Refused(socket_path, "is not accessible to this user (the socket is root only or group casebox)") from None
        raise
    return Connection(sock)
