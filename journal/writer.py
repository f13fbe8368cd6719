"""The durable journal writer: the steward's intent ledger (J1, J2, J5; docs/journal-format.md, "Writing").

A journal is created once, ``O_CREAT|O_EXCL|O_NOFOLLOW`` relative to its stage
directory's descriptor, mode 0600, with its GENESIS record; the file and then
the directory are fsynced before :meth:`JournalWriter.create` returns. Before
the first byte is written, the whole 262,144-byte cap is reserved on disk with
``fallocate(FALLOC_FL_KEEP_SIZE)`` (the file's size and bytes stay exactly
what the format says), so no append up to the cap can fail for want of space
and leave a torn frame; a journal whose cap cannot be reserved is removed
again while it holds nothing, and :class:`Unreserved` says how much was
needed. A reopened journal is reserved again before anything is appended.
Each append is one ``pwrite`` of the whole frame at the end, then
``fdatasync``: a method returns the new head only once its record is durable.
Any failed write or sync poisons the writer for good; it never retries, since
after a failed fsync the kernel may already have dropped the dirty pages it
would retry.

A test may pass ``hook``, called with the name of each kill point the writer
passes (``KILL_POINTS``); with a hook, a frame is written as two pwrites so a
kill can land between its header and its payload. Without one, the writer
does exactly what production needs and nothing else.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import os
import stat
import threading
import time
from typing import Any, Callable, Mapping

from journal.errors import Refused
from journal.files import read_stored
from journal.format import (
    CAP,
    HEADER_BYTES,
    Kind,
    chain_step,
    check_id,
    encode_frame,
    encode_payload,
    genesis_digest,
    time_key,
)
from journal.reader import Verdict, read_journal
from journal.sequence import Sequence

MODE = 0o600

GENESIS_BEFORE_WRITE = "genesis_before_write"
GENESIS_AFTER_WRITE = "genesis_after_write"
GENESIS_AFTER_FSYNC = "genesis_after_fsync"
GENESIS_AFTER_DIR_FSYNC = "genesis_after_dir_fsync"
BETWEEN_HEADER_AND_PAYLOAD = "between_header_and_payload"
AFTER_WRITE = "after_write"
AFTER_FSYNC = "after_fsync"
KILL_POINTS = (
    GENESIS_BEFORE_WRITE,
    GENESIS_AFTER_WRITE,
    GENESIS_AFTER_FSYNC,
    GENESIS_AFTER_DIR_FSYNC,
    BETWEEN_HEADER_AND_PAYLOAD,
    AFTER_WRITE,
    AFTER_FSYNC,
)

Hook = Callable[[str], None]


class JournalPoisoned(Exception):
    """A write or sync failed; the writer refuses every later call and the session fails closed (J5)."""


class Unreserved(Exception):
    """The journal's cap could not be reserved on disk (``needed`` bytes); nothing was written."""

    def __init__(self, name: str, needed: int, error: OSError) -> None:
        super().__init__(f"{name}: {needed} bytes could not be reserved on disk ({error.strerror})")
        self.needed = needed
        self.errno = error.errno
        self.strerror = error.strerror


FALLOC_FL_KEEP_SIZE = 1


@functools.cache
def _fallocate():
    """libc's fallocate(2), which os does not offer with a mode (os.posix_fallocate would grow the file)."""
    import ctypes  # only where a journal is written: readers never pay for it

    libc = ctypes.CDLL(None, use_errno=True)
    call = getattr(libc, "fallocate64", None) or libc.fallocate
    call.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    call.restype = ctypes.c_int
    return call, ctypes.get_errno


def reserve(fd: int, length: int = CAP) -> None:
    """Allocate the first ``length`` bytes of ``fd`` on disk without changing its size (FALLOC_FL_KEEP_SIZE)."""
    call, get_errno = _fallocate()
    if call(fd, FALLOC_FL_KEEP_SIZE, 0, length) != 0:
        number = get_errno()
        raise OSError(number, os.strerror(number))


def wall_clock_us() -> int:
    return time.time_ns() // 1_000


def _check_name(name: str) -> None:
    if "/" in name or name in ("", ".", ".."):
        raise Refused(name or "journal name", "a journal name must be one plain path segment")


def _lock(fd: int, name: str) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise Refused(name, "is held by another writer; a journal has exactly one writer (J1)") from None


class JournalWriter:
    """The only writer of one journal. Use :meth:`create` or :meth:`reopen`."""

    def __init__(
        self, fd: int, name: str, sequence: Sequence, head: bytes, size: int, clock: Callable[[], int], hook: Hook | None
    ) -> None:
        self._fd: int | None = fd
        self._name = name
        self._sequence = sequence
        self._head = head
        self._head_hex = head.hex()
        self._size = size
        self._clock = clock
        self._hook = hook
        self._poisoned: str | None = None
        # Appends may come from two threads (a sandbox brought to READY on a thread of its own while another
        # runs an op): each record is admitted, written and synced before the next is admitted.
        self._appending = threading.Lock()

    # Opening

    @classmethod
    def create(
        cls,
        dir_fd: int,
        name: str,
        *,
        journal_id: str,
        stage_id: str,
        attempt_id: str,
        clock: Callable[[], int] = wall_clock_us,
        hook: Hook | None = None,
    ) -> "JournalWriter":
        """Create journal ``name`` in the directory ``dir_fd`` with its durable GENESIS record (J5)."""
        _check_name(name)
        for key, value in (("journal_id", journal_id), ("stage_id", stage_id)):
            check_id(value, key)
        start = genesis_digest(journal_id, stage_id)
        fields = {"prev": start.hex(), "journal_id": journal_id, "stage_id": stage_id, "attempt_id": attempt_id, "created": clock()}
        payload, checked = encode_payload(Kind.GENESIS, fields)
        frame = encode_frame(Kind.GENESIS, payload)
        sequence = Sequence()
        sequence.check(Kind.GENESIS, checked, len(frame))
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, MODE, dir_fd=dir_fd)
        except FileExistsError:
            raise Refused(name, "already exists; a journal is created exactly once (J5)") from None
        except OSError as error:
            raise Refused(name, f"cannot be created ({os.strerror(error.errno)})") from None
        writer = cls(fd, name, sequence, start, 0, clock, hook)
        try:
            os.fchmod(fd, MODE)
            _lock(fd, name)
            writer._reserve(dir_fd)
        except BaseException:
            writer.close()
            raise
        writer._pass(GENESIS_BEFORE_WRITE)
        head, head_hex = writer._admit(Kind.GENESIS, fields, payload, frame)
        try:
            writer._pwrite(frame, 0)
            writer._pass(GENESIS_AFTER_WRITE)
            os.fsync(fd)
            writer._pass(GENESIS_AFTER_FSYNC)
            os.fsync(dir_fd)
        except BaseException as error:
            writer._interrupted(error)
        writer._advance(head, head_hex, frame)
        writer._pass(GENESIS_AFTER_DIR_FSYNC)
        return writer

    @classmethod
    def reopen(
        cls,
        dir_fd: int,
        name: str,
        *,
        stage_id: str,
        journal_id: str | None = None,
        expect_head: str | None = None,
        clock: Callable[[], int] = wall_clock_us,
        hook: Hook | None = None,
    ) -> "JournalWriter":
        """Continue an existing journal after a crash; only a VALID one of this stage is ever reopened."""
        _check_name(name)
        try:
            fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise Refused(name, "is a symlink; a journal is a regular file") from None
            raise Refused(name, f"cannot be opened for writing ({os.strerror(error.errno)})") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise Refused(name, "must be a regular file")
            if stat.S_IMODE(info.st_mode) != MODE or info.st_uid != os.geteuid() or info.st_nlink != 1:
                raise Refused(name, f"must be mode 0600, owned by uid {os.geteuid()} and singly linked")
            _lock(fd, name)
            reading = read_journal(read_stored(fd), expect_stage_id=stage_id, expect_journal_id=journal_id, expect_head=expect_head)
            if reading.verdict is not Verdict.VALID:
                raise Refused(name, f"is {reading.verdict}, and only a VALID journal is ever appended to ({reading.reason})")
        except BaseException:
            os.close(fd)
            raise
        head = bytes.fromhex(reading.head)
        writer = cls(fd, name, reading.sequence, head, reading.valid_bytes, clock, hook)
        try:
            writer._reserve(None)
        except BaseException:
            writer.close()
            raise
        return writer

    def _reserve(self, created_in: int | None) -> None:
        """Reserve the cap before anything is appended; a journal this writer just created (in the directory
        ``created_in``) and could not reserve is removed again, since it holds no byte yet."""
        try:
            reserve(self._fd, CAP)
        except OSError as error:
            if created_in is not None:
                os.unlink(self._name, dir_fd=created_in)
            raise Unreserved(self._name, CAP, error) from None

    # State

    @property
    def head(self) -> str:
        """The digest after the last durable record, as 64 lowercase hex digits."""
        return self._head_hex

    @property
    def size(self) -> int:
        return self._size

    @property
    def records(self) -> int:
        return self._sequence.count

    @property
    def poisoned(self) -> bool:
        return self._poisoned is not None

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __enter__(self) -> "JournalWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Appending

    def append(self, kind: Kind, fields: Mapping[str, Any]) -> str:
        """Append one ``kind`` record with the caller's ``fields`` and return the new head once durable.

        The writer supplies ``prev`` and ``at``; a record the reader would not
        accept at this place (schema, order, cap or reserve) is refused before
        anything is written.
        """
        with self._appending:
            return self._append(kind, fields)

    def _append(self, kind: Kind, fields: Mapping[str, Any]) -> str:
        self._usable()
        if kind is Kind.GENESIS:
            raise Refused(kind.name, "is written only by create")
        full = {**fields, "prev": self._head_hex, time_key(kind): self._clock()}
        try:
            payload, checked = encode_payload(kind, full)
            frame = encode_frame(kind, payload)
            self._sequence.check(kind, checked, self._size + len(frame))
        except Refused as refusal:
            raise refusal.under(f"{self._name} {kind.name}") from None
        return self._durable(kind, full, payload, frame)

    def _usable(self) -> None:
        if self._poisoned is not None:
            raise JournalPoisoned(f"{self._name}: the writer is poisoned by an earlier failure ({self._poisoned}); it never retries")
        if self._fd is None:
            raise Refused(self._name, "is closed")

    def _pass(self, point: str) -> None:
        if self._hook is not None:
            self._hook(point)

    def _durable(self, kind: Kind, fields: Mapping[str, Any], payload: bytes, frame: bytes) -> str:
        head, head_hex = self._admit(kind, fields, payload, frame)
        try:
            if self._hook is None:
                self._pwrite(frame, self._size)
            else:
                self._pwrite(frame[:HEADER_BYTES], self._size)
                self._pass(BETWEEN_HEADER_AND_PAYLOAD)
                self._pwrite(frame[HEADER_BYTES:], self._size + HEADER_BYTES)
            self._pass(AFTER_WRITE)
            os.fdatasync(self._fd)
        except BaseException as error:
            self._interrupted(error)
        self._advance(head, head_hex, frame)
        self._pass(AFTER_FSYNC)
        return head_hex

    def _pwrite(self, data: bytes, offset: int) -> None:
        written = os.pwrite(self._fd, data, offset)
        if written != len(data):
            raise OSError(errno.EIO, f"short write: {written} of {len(data)} bytes")

    def _admit(self, kind: Kind, fields: Mapping[str, Any], payload: bytes, frame: bytes) -> tuple[bytes, str]:
        """The record's head (and its hex), and the record admitted to the sequence, before it is written:
        done while the process runs warm rather than after it wakes from the sync. Only :meth:`_advance`
        makes it the writer's head, once the record is durable; a write or sync that fails poisons the
        writer, which never appends again, so what it admitted early is never used."""
        head = chain_step(self._head, frame[:HEADER_BYTES], payload)
        head_hex = head.hex()
        self._sequence.admit(kind, fields, head_hex)
        return head, head_hex

    def _advance(self, head: bytes, head_hex: str, frame: bytes) -> None:
        self._head, self._head_hex = head, head_hex
        self._size += len(frame)

    def _interrupted(self, error: BaseException) -> None:
        """Between a record's admission and its sync: a failed write or sync poisons the writer (J5); anything
        else that stops it there (a test's simulated crash) leaves it unusable too, then goes on."""
        if isinstance(error, OSError):
            self._poison(error)
        self._poisoned = f"interrupted before the record was durable ({type(error).__name__})"
        raise error

    def _poison(self, error: OSError) -> None:
        self._poisoned = error.strerror or str(error)
        self.close()
        raise JournalPoisoned(f"{self._name}: a write or sync failed ({self._poisoned}); the writer is poisoned") from error

    # The steward's intent ledger: one method per record kind, each returning only once durable.

    def process_intent(self, op_id: str, role: str, pid: int, starttime: int, pgid: int) -> str:
        return self.append(Kind.PROCESS_INTENT, {"op_id": op_id, "role": role, "pid": pid, "starttime": starttime, "pgid": pgid})

    def process_released(self, op_id: str) -> str:
        return self.append(Kind.PROCESS_RELEASED, {"op_id": op_id})

    def process_terminal(self, op_id: str, wait_status: int, reaper: str) -> str:
        return self.append(Kind.PROCESS_TERMINAL, {"op_id": op_id, "wait_status": wait_status, "reaper": reaper})

    def descendants_terminal(self, op_id: str, count: int) -> str:
        return self.append(Kind.DESCENDANTS_TERMINAL, {"op_id": op_id, "count": count})

    def mount_intent(self, op_id: str, target: str, kind: str) -> str:
        return self.append(Kind.MOUNT_INTENT, {"op_id": op_id, "target": target, "kind": kind})

    def mount_done(self, op_id: str, target: str, kind: str) -> str:
        return self.append(Kind.MOUNT_DONE, {"op_id": op_id, "target": target, "kind": kind})

    def unmount_intent(self, op_id: str, target: str, kind: str) -> str:
        return self.append(Kind.UNMOUNT_INTENT, {"op_id": op_id, "target": target, "kind": kind})

    def unmount_done(self, op_id: str, target: str, kind: str) -> str:
        return self.append(Kind.UNMOUNT_DONE, {"op_id": op_id, "target": target, "kind": kind})

    def sandbox_ready(self, op_id: str, filter_digest: str) -> str:
        return self.append(Kind.SANDBOX_READY, {"op_id": op_id, "filter_digest": filter_digest})

    def helper_attempt(self, attempt: int, response_digest: str, outcome: str) -> str:
        return self.append(Kind.HELPER_ATTEMPT, {"attempt": attempt, "response_digest": response_digest, "outcome": outcome})

    def cleanup_evidence(
        self,
        outcome: str,
        journal_head: str,
        process_inventory_digest: str,
        mount_inventory_digest: str,
        preceding_process_digest: str,
    ) -> str:
        return self.append(
            Kind.CLEANUP_EVIDENCE,
            {
                "outcome": outcome,
                "journal_head": journal_head,
                "process_inventory_digest": process_inventory_digest,
                "mount_inventory_digest": mount_inventory_digest,
                "preceding_process_digest": preceding_process_digest,
            },
        )

    def retirement_intent(self, note: str = "") -> str:
        return self.append(Kind.RETIREMENT_INTENT, {"note": note})

    def retired(self, note: str = "") -> str:
        return self.append(Kind.RETIRED, {"note": note})
