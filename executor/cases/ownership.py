"""C9: every capability is a close-once object, and each kind of start has exactly one owner.

A :class:`CloseOnce` object is either **taken** exactly once, which transfers
what it holds to the taker, or **closed** exactly once; cancelling is
closing. A second take, a take after close, or a second close is a casebox
bug and raises :class:`OwnershipError` (exit 70), so no second consumer ever
sees what the first one got.

- :class:`DirectoryCapability`: a directory descriptor the trusted side
  opened. Taking it hands the descriptor to the session
  (``add_capability``), which then closes it exactly once; closing it
  untaken closes the descriptor.
- :class:`Started` and :class:`StartFailed`: the outcome of one sandbox
  start, owned by whoever asked for it. A READY sandbox is taken by its owner
  to run ops, then closed; closed untaken, it is shut down. A failed start
  can only be closed, and closing it hands its lifecycle evidence (the
  starter's sentence) back to its owner.
- :class:`Ahead`: a sandbox started ahead of its op (it comes to READY while
  the open one runs). Taking it waits for READY and gives its owner the
  :class:`Started` or :class:`StartFailed`; closed untaken, it is shut down
  like a READY sandbox, or its failure handed back.
- :class:`Gate`: the session's two start rights, each handed out once: the
  case service alone starts sandboxes (extraction, install, cases), the
  dependency preparer alone starts resolvers (resolve and fetch).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

from journal.strictjson import decode_lossy
from journal.untrusted import escape
from steward.api import LOOPBACK, Limits, OpOutcome, Ready
from steward.failure import SandboxFailure

OPEN, TAKEN, CLOSED = "open", "taken", "closed"
CASE_SERVICE = "case service"
PREPARER = "dependency preparer"


class OwnershipError(Exception):
    """A close-once object used a second time, or by someone who does not own it."""


class CloseOnce:
    """Open until taken or closed, exactly once; ``with`` cancels (closes) it if it is still open."""

    def __init__(self, what: str, owner: object = None) -> None:
        self.what = what
        self.owner = owner
        self.state = OPEN

    def _check(self, verb: str, owner: object) -> None:
        if owner is not self.owner:
            raise OwnershipError(f"{self.what} belongs to {self.owner!r}; {owner!r} cannot {verb} it")
        if self.state != OPEN:
            raise OwnershipError(f"{self.what} was already {self.state}; it is taken or closed exactly once")

    def take(self, owner: object = None):
        self._check("take", owner)
        given = self._taken()
        self.state = TAKEN
        return given

    def close(self, owner: object = None):
        self._check("close", owner)
        self.state = CLOSED
        return self._closed()

    cancel = close

    def _taken(self):
        raise OwnershipError(f"{self.what} cannot be taken")

    def _closed(self):
        return None

    def __enter__(self) -> "CloseOnce":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.state == OPEN:
            self.close(self.owner)


class DirectoryCapability(CloseOnce):
    """A read-only directory descriptor to hand into a session under ``name``, seen in a sandbox at /cap/NAME or
    at ``mount``, a path of its own (a case runtime's prefix)."""

    def __init__(self, name: str, fd: int, mount: str | None = None) -> None:
        super().__init__(f"capability {name}")
        self.name = name
        self.mount = mount
        self._fd = fd

    def _taken(self) -> tuple[str, int]:
        fd, self._fd = self._fd, -1
        return self.name, fd

    def _closed(self) -> None:
        fd, self._fd = self._fd, -1
        os.close(fd)

    def copy(self) -> "DirectoryCapability":
        """Another capability on a duplicate of the same descriptor: for another stage's session (verify --jobs)."""
        if self.state != OPEN:
            raise OwnershipError(f"{self.what} was already {self.state}; only an open capability is copied")
        return DirectoryCapability(self.name, os.dup(self._fd), self.mount)

    def hand_to(self, session) -> None:
        """Take it and give the descriptor to ``session``, which owns it from now on (and closes it)."""
        name, fd = self.take()
        if self.mount is None:
            session.add_capability(name, fd)
        else:
            session.add_capability(name, fd, self.mount)


class Running:
    """A taken READY sandbox: one op per command, then :meth:`close`."""

    def __init__(self, session, ready: Ready) -> None:
        self.session = session
        self.ready = ready
        self.open = True

    def run(self, argv: Sequence[str], **op) -> OpOutcome:
        if not self.open:
            raise OwnershipError(f"sandbox {self.ready.sandbox} is closed")
        try:
            return self.session.run(argv, **op)
        except SandboxFailure:
            self.open = False
            raise

    def close(self) -> str | None:
        """Shut the sandbox down; the journal head, or None when a failed op had already torn it down."""
        if not self.open:
            return None
        self.open = False
        return self.session.close_sandbox()


class Started(CloseOnce):
    """A READY sandbox; its owner takes it (a :class:`Running`) or closes it untaken (the journal head)."""

    def __init__(self, owner: object, session, ready: Ready) -> None:
        super().__init__(f"sandbox {ready.sandbox}", owner)
        self.session = session
        self.ready = ready

    def _taken(self) -> Running:
        return Running(self.session, self.ready)

    def _closed(self) -> str:
        return self.session.close_sandbox()


@dataclasses.dataclass(frozen=True)
class LifecycleEvidence:
    """What a sandbox that failed to start, or failed under an op, leaves its owner: the starter's sentence.

    Its records (the launcher's and pid 1's identities and wait statuses) are in the journal.
    """

    reason: str


class StartFailed(CloseOnce):
    """A start that failed: it cannot be taken; closing it returns its :class:`LifecycleEvidence` to its owner."""

    def __init__(self, owner: object, reason: str) -> None:
        super().__init__("a failed sandbox start", owner)
        self.evidence = LifecycleEvidence(reason)

    def _closed(self) -> LifecycleEvidence:
        return self.evidence


class Starter:
    """The right to start sandboxes in one session, held by one owner in one role.

    Only the dependency preparer may ask for the index network (the resolver and fetch of a network index);
    every sandbox the case service starts has loopback only (S9).
    """

    def __init__(self, session, owner: object, role: str, started: list | None = None, always: Sequence[str] = ()) -> None:
        self.session = session
        self.owner = owner
        self.role = role
        # Where each READY sandbox is noted as (role, sandbox, read, write): the gate's record of the session.
        self.started = started
        # The capabilities every sandbox of the session reads (the case runtime's prefix, when it is one).
        self.always = tuple(always)

    def start(
        self, *, read: Sequence[str] = (), write: Sequence[str] = (), limits: Limits = Limits(), network: str = LOOPBACK,
        index: str | None = None,
    ) -> Started | StartFailed:
        if (network != LOOPBACK or index is not None) and self.role != PREPARER:
            raise OwnershipError(f"the {self.role} starts sandboxes with loopback only, never the {network} network")
        read = self._with_always(read)
        return self._outcome(
            lambda: self.session.start_sandbox(read=read, write=list(write), limits=limits, network=network, index=index),
            read, write,
        )

    def start_ahead(self, *, read: Sequence[str] = (), write: Sequence[str] = (), limits: Limits = Limits()) -> "Ahead | StartFailed":
        """A loopback sandbox that comes to READY while the caller goes on (the open sandbox runs its op)."""
        read = self._with_always(read)
        try:
            self.session.start_ahead(read=read, write=list(write), limits=limits)
        except SandboxFailure as failure:
            return StartFailed(self.owner, str(failure))
        return Ahead(self, read, write)

    def _with_always(self, read: Sequence[str]) -> list[str]:
        return [*self.always, *(name for name in read if name not in self.always)]

    def _outcome(self, start, read: Sequence[str], write: Sequence[str]) -> Started | StartFailed:
        try:
            ready = start()
        except SandboxFailure as failure:
            return StartFailed(self.owner, str(failure))
        if self.started is not None:
            self.started.append((self.role, ready.sandbox, tuple(read), tuple(write)))
        return Started(self.owner, self.session, ready)

    def run_one(
        self, argv: Sequence[str], *, read: Sequence[str] = (), write: Sequence[str] = (), limits: Limits = Limits(),
        network: str = LOOPBACK, index: str | None = None, ahead: "Ahead | None" = None, when_ready=None, **op,
    ) -> OpOutcome | LifecycleEvidence:
        """Start a sandbox, take it, run one op, close it: the op's outcome, or the lifecycle evidence of a failure.

        ``ahead``: the sandbox started ahead for this op (the same read, write and limits); when its start
        failed, a fresh one is started here, so a start that overlapped another case's op never costs this
        op its sandbox. ``when_ready`` is called once the sandbox is taken, before its op is sent: where the
        caller starts the next sandboxes ahead.
        """
        outcome = None
        if ahead is not None:
            outcome = ahead.take(self.owner)
            if isinstance(outcome, StartFailed):
                outcome.close(self.owner)
                outcome = None
        if outcome is None:
            outcome = self.start(read=read, write=write, limits=limits, network=network, index=index)
        if isinstance(outcome, StartFailed):
            return outcome.close(self.owner)
        running = outcome.take(self.owner)
        try:
            if when_ready is not None:
                when_ready()
            try:
                return running.run(argv, **op)
            except SandboxFailure as failure:
                return LifecycleEvidence(str(failure))
        finally:
            running.close()


class Ahead(CloseOnce):
    """A sandbox started ahead: taken, the :class:`Started` or :class:`StartFailed` of its start, once READY."""

    def __init__(self, starter: Starter, read: Sequence[str], write: Sequence[str]) -> None:
        super().__init__("a sandbox started ahead", starter.owner)
        self.starter = starter
        self.read, self.write = tuple(read), tuple(write)

    def _taken(self) -> Started | StartFailed:
        return self.starter._outcome(self.starter.session.take_sandbox, self.read, self.write)

    def _closed(self) -> str | LifecycleEvidence:
        return self._taken().close(self.starter.owner)


def failure_of(result: OpOutcome | LifecycleEvidence) -> str | None:
    """Why an infrastructure op (extraction, resolution, fetch, install) did not succeed, or None if it exited 0."""
    if isinstance(result, LifecycleEvidence):
        return f"the sandbox failed: {result.reason}"
    observation = result.observation
    if not result.started:
        return f"the op did not start ({observation.step} failed with errno {observation.errno})"
    if observation.limit == "OK":
        return None
    lines = decode_lossy(observation.stderr).strip().splitlines()
    said = f": {escape(lines[-1])}" if lines else ""
    return f"the op ended {observation.limit} with wait status {observation.wait_status:#06x}{said}"


class Gate:
    """Hands out the session's start rights: each role's :class:`Starter` exactly once, to its one owner."""

    ROLES = (CASE_SERVICE, PREPARER)

    def __init__(self, session, always: Sequence[str] = ()) -> None:
        self.session = session
        self.always = tuple(always)
        self.given: dict[str, object] = {}
        # (role, sandbox, read, write) of every sandbox that became READY, in order.
        self.started: list[tuple[str, str, tuple[str, ...], tuple[str, ...]]] = []

    def starter(self, role: str, owner: object) -> Starter:
        if role not in self.ROLES:
            raise OwnershipError(f"{role!r} is not a role that starts sandboxes")
        if role in self.given:
            raise OwnershipError(f"the {role}'s starter was already given to {self.given[role]!r}")
        self.given[role] = owner
        return Starter(self.session, owner, role, self.started, self.always)
