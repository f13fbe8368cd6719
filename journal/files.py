"""Where a journal lives on disk and how evidence bytes are read, for the writer, the reviewer tools and the evaluator.

A stage directory, and the tombstone it is renamed into, hold their journal
as the file ``journal`` directly inside it (docs/journal-format.md,
"Journals on disk"). Reading never takes more than one byte past the cap, so
an oversized file is judged OVER_CAP without being read whole; every other
evidence file (a receipt, a seal marker, a junit report) is read the same
way by :func:`read_evidence`.
"""

from __future__ import annotations

import errno
import os
import stat

from journal.errors import Refused
from journal.format import CAP
from journal.seal import NAME as SEAL_NAME
from journal.seal import SEAL_MAX_BYTES

JOURNAL_NAME = "journal"
_READ_CHUNK = 1 << 16


def _read_up_to(fd: int, limit: int) -> bytes:
    """The first ``limit`` bytes of the open file ``fd`` (fewer if it is shorter), from offset 0."""
    chunks = []
    offset = 0
    while offset < limit:
        chunk = os.pread(fd, min(_READ_CHUNK, limit - offset), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def read_stored(fd: int) -> bytes:
    """The first ``CAP + 1`` bytes of the open file ``fd``, from offset 0."""
    return _read_up_to(fd, CAP + 1)


def read_evidence(dir_fd: int, name: str, cap: int) -> bytes | None:
    """At most ``cap + 1`` bytes of the regular file ``name`` in ``dir_fd``; None when there is no such entry.

    The file is opened without following a symlink and without blocking, so
    a symlink, a FIFO, a directory or a device is refused, and so is a file
    that cannot be read; the caller judges a result longer than ``cap``.
    """
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise Refused(name, "is a symlink; evidence is a regular file") from None
        raise Refused(name, f"cannot be opened ({os.strerror(error.errno)})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Refused(name, "must be a regular file")
        return _read_up_to(fd, cap + 1)
    except OSError as error:
        raise Refused(name, f"cannot be read ({os.strerror(error.errno)})") from None
    finally:
        os.close(fd)


def _read_regular(fd: int, shown: str) -> bytes:
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Refused(shown, "must be a regular file")
        return read_stored(fd)
    except OSError as error:
        raise Refused(shown, f"cannot be read ({os.strerror(error.errno)})") from None
    finally:
        os.close(fd)


def _open_directory(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        raise Refused(path, f"cannot be read ({os.strerror(error.errno)})") from None


def load_for_review(path: str) -> tuple[str, bytes | None]:
    """The journal named by ``path`` (a journal file, or a stage or tombstone directory) and its bytes.

    The bytes are None when a directory holds no journal: that journal is
    MISSING. A path that cannot be read at all is refused.
    """
    try:
        is_directory = stat.S_ISDIR(os.stat(path).st_mode)
    except OSError as error:
        raise Refused(path, f"cannot be read ({os.strerror(error.errno)})") from None
    if not is_directory:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
        except OSError as error:
            raise Refused(path, f"cannot be read ({os.strerror(error.errno)})") from None
        return path, _read_regular(fd, path)
    shown = os.path.join(path, JOURNAL_NAME)
    dir_fd = _open_directory(path)
    try:
        fd = os.open(JOURNAL_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except FileNotFoundError:
        return shown, None
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise Refused(shown, "is a symlink; a stage's journal is a regular file in its directory") from None
        raise Refused(shown, f"cannot be read ({os.strerror(error.errno)})") from None
    finally:
        os.close(dir_fd)
    return shown, _read_regular(fd, shown)


def seal_beside(path: str) -> tuple[str, bytes | None]:
    """The seal marker that anchors the journal ``path`` names: ``seal.json`` in a stage, tombstone or evidence
    directory, or beside a file named ``journal``; its shown path and bytes (None when there is none).

    It is read like any evidence file (no symlink, regular, at most one byte past its cap); the caller
    judges a result longer than ``SEAL_MAX_BYTES``.
    """
    if os.path.isdir(path):
        directory = path
    elif os.path.basename(path) == JOURNAL_NAME:
        directory = os.path.dirname(path) or os.curdir
    else:
        return path, None
    shown = os.path.join(directory, SEAL_NAME)
    dir_fd = _open_directory(directory)
    try:
        return shown, read_evidence(dir_fd, SEAL_NAME, SEAL_MAX_BYTES)
    except Refused as refusal:
        raise refusal.under(directory) from None
    finally:
        os.close(dir_fd)
