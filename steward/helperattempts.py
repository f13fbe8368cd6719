"""C6: REMOVE_AND_PROVE attempts, in order, each behind its exact response DTO and that DTO's digest.

One attempt: start the helper blocked on its stdin, make its identity durable
(PROCESS_INTENT, J1), release it by writing the request, read its stdout until
end of file or the response deadline, reap that exact child (waiting a
bounded time for it to exit, then SIGKILL and a bounded wait), record its raw
wait status (PROCESS_TERMINAL), then classify and record HELPER_ATTEMPT.

The rules (:func:`classify`, :func:`may_follow`, :func:`projection`) are pure:

- a response is accepted only with a raw-zero exit and a complete,
  EOF-terminated body read before the deadline; its outcome (CLEANED or
  UNVERIFIED) is the helper's;
- a raw-zero exit with a body still incomplete at the deadline is MISSING;
- a complete body that is not exactly a valid response is INVALID;
- otherwise the attempt is UNREAPED (no wait status could be read), SIGNALLED
  or NONZERO, in that order;
- only a MISSING attempt permits a successor, and a successor starts only
  after its predecessor was reaped (classification needs the wait status);
- an attempt without an accepted response contributes zero progress; an
  accepted one, UNVERIFIED included, is copied unchanged.
"""

from __future__ import annotations

import dataclasses
import os
import select
import signal
import subprocess
import sys
import time
from typing import Callable

from journal.errors import Refused
from steward import documents, procfs
from steward.helper import RESPONSE_CAP, Request, Response

MAX_ATTEMPTS = 3
HELPER_COMMAND = (sys.executable, "-I", "-m", "steward.helper")
UNREAPED, SIGNALLED, NONZERO, MISSING, INVALID = "UNREAPED", "SIGNALLED", "NONZERO", "MISSING", "INVALID"


@dataclasses.dataclass(frozen=True)
class Timing:
    """How long the runner waits: for the response, then for the exit, then after SIGKILL."""

    response_seconds: float = 20.0
    exit_seconds: float = 10.0
    kill_seconds: float = 5.0


@dataclasses.dataclass(frozen=True)
class Observation:
    """What the runner saw of one helper: its raw wait status (None: it could not be reaped), its stdout
    bytes, and whether they ended with end of file before the deadline."""

    status: int | None
    body: bytes
    complete: bool


@dataclasses.dataclass(frozen=True)
class Attempt:
    number: int
    outcome: str
    digest: str
    body: bytes
    response: Response | None
    status: int | None


@dataclasses.dataclass(frozen=True)
class Progress:
    """What cleanup takes from the attempts: the last accepted response's counts, or zero progress."""

    accepted: bool
    killed: int
    unmounted: int
    remaining_processes: int | None
    remaining_mounts: int | None
    diagnostic: str


def classify(observation: Observation, *, stage_id: str) -> tuple[str, Response | None]:
    """The outcome of one attempt, and its response when accepted (C6)."""
    status = observation.status
    if status is None:
        return UNREAPED, None
    if os.WIFSIGNALED(status):
        return SIGNALLED, None
    if status != 0:
        return NONZERO, None
    if not observation.complete:
        return MISSING, None
    try:
        response = Response.decode(observation.body, stage_id=stage_id)
    except Refused:
        return INVALID, None
    return response.outcome, response


def may_follow(outcome: str) -> bool:
    """Only a raw-zero MISSING attempt permits a successor."""
    return outcome == MISSING


def projection(attempts: list[Attempt]) -> Progress:
    """The progress cleanup records: an accepted response copied unchanged, else zero progress."""
    last = attempts[-1] if attempts else None
    if last is None or last.response is None:
        outcome = last.outcome if last is not None else "not run"
        return Progress(False, 0, 0, None, None, f"no accepted helper response (last attempt: {outcome})")
    response = last.response
    return Progress(
        True, response.killed, response.unmounted, response.remaining_processes, response.remaining_mounts, response.diagnostic
    )


def _read_response(stream, deadline: float) -> tuple[bytes, bool]:
    """stdout until end of file (complete) or the deadline (not); reading stops one byte past the cap."""
    fd = stream.fileno()
    chunks, total = [], 0
    while total <= RESPONSE_CAP:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            return b"".join(chunks), False
        chunk = os.read(fd, RESPONSE_CAP + 1 - total)
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks), True


def _wait_exit(pidfd: int, seconds: float) -> bool:
    return bool(select.select([pidfd], [], [], max(seconds, 0))[0])


class HelperRunner:
    """Runs the attempts of one stage's cleanup; ``ledger`` is that stage's journal writer (or its wrapper)."""

    def __init__(
        self,
        ledger,
        *,
        documents_fd: int,
        shown: str,
        reaper: str,
        timing: Timing = Timing(),
        command: tuple[str, ...] = HELPER_COMMAND,
        hook: Callable[[str], None] | None = None,
    ) -> None:
        self.ledger = ledger
        self.documents_fd = documents_fd
        self.shown = shown
        self.reaper = reaper
        self.timing = timing
        self.command = command
        self.hook = hook
        self.unreaped: dict[int, tuple[str, subprocess.Popen]] = {}

    def run(self, request: Request, *, first: int = 1, previous: str | None = None) -> list[Attempt]:
        """Attempts ``first``, ``first + 1``… while the previous one permits a successor, at most MAX_ATTEMPTS in all."""
        attempts: list[Attempt] = []
        number = first
        while number <= MAX_ATTEMPTS and (previous is None or may_follow(previous)):
            attempt = self._attempt(number, request)
            attempts.append(attempt)
            previous = attempt.outcome
            number += 1
        return attempts

    def _pass(self, point: str) -> None:
        if self.hook is not None:
            self.hook(point)

    def _attempt(self, number: int, request: Request) -> Attempt:
        op_id = f"helper-{number}"
        process = subprocess.Popen(
            list(self.command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env={}, cwd="/", start_new_session=True,
        )
        try:
            found = procfs.identity(process.pid)
            self.ledger.process_intent(op_id, "helper", found.pid, found.starttime, found.pgid)
        except BaseException:
            process.kill()
            process.wait()
            raise
        self._pass("helper_after_intent")
        try:
            process.stdin.write(request.encode())
            process.stdin.close()
        except BrokenPipeError:
            pass
        self.ledger.process_released(op_id)
        body, complete = _read_response(process.stdout, time.monotonic() + self.timing.response_seconds)
        process.stdout.close()
        status = self._reap(process)
        if status is None:
            self.unreaped[process.pid] = (op_id, process)
        else:
            self.ledger.process_terminal(op_id, status, self.reaper)
        outcome, response = classify(Observation(status, body, complete), stage_id=request.stage_id)
        digest = documents.keep(self.documents_fd, body, shown=self.shown)
        self.ledger.helper_attempt(number, digest, outcome)
        self._pass("helper_after_attempt")
        return Attempt(number, outcome, digest, body, response, status)

    def _reap(self, process: subprocess.Popen) -> int | None:
        """The raw wait status of this exact child, or None when it cannot be reaped in the bounded time."""
        pidfd = os.pidfd_open(process.pid)
        try:
            if not _wait_exit(pidfd, self.timing.exit_seconds):
                os.kill(process.pid, signal.SIGKILL)
                if not _wait_exit(pidfd, self.timing.kill_seconds):
                    return None
            status = os.waitpid(process.pid, 0)[1]
        finally:
            os.close(pidfd)
        process.returncode = os.waitstatus_to_exitcode(status)
        return status

    def reap_late(self, seconds: float) -> None:
        """Reap helpers that were UNREAPED at classification; their statuses are recorded, their outcome stands."""
        deadline = time.monotonic() + seconds
        for pid, (op_id, process) in list(self.unreaped.items()):
            pidfd = os.pidfd_open(pid)
            try:
                if not _wait_exit(pidfd, deadline - time.monotonic()):
                    continue
                status = os.waitpid(pid, 0)[1]
            finally:
                os.close(pidfd)
            process.returncode = os.waitstatus_to_exitcode(status)
            del self.unreaped[pid]
            self.ledger.process_terminal(op_id, status, self.reaper)
