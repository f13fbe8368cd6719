"""The candidate identity digest (DESIGN T5, seed 002; byte layout in docs/transport.md).

A versioned, length-prefixed, streaming SHA-256 over the candidate's records in
sorted path order. Each record binds state, normalized path, type, executable
bit, content length and content bytes, so the digest changes with any byte,
name, state, type or mode bit, and never with a modification time.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
from typing import Callable

from executor.transport import ustar
from journal.errors import Refused

TAG = b"casebox.candidate-identity"
VERSION = 1
# The only state and type a candidate's record has: its files are all present and regular (docs/transport.md
# keeps seed 002's deleted state and absent type reserved, and casebox never writes them).
PRESENT = 0x01
TYPE_REGULAR = 0x01
PATH_MAX_BYTES = 4_096
_READ_CHUNK = 1 << 20


class IdentityWriter:
    """Streams the identity encoding of ``count`` sorted records into ``update``.

    ``update`` is a hash's ``update`` in production and a byte collector in the
    golden tests. Each present record is its header then exactly ``length``
    content bytes through :meth:`content`; :meth:`finish` checks the count.
    """

    def __init__(self, count: int, update: Callable[[bytes], object]) -> None:
        self._update = update
        self._expected = count
        self._written = 0
        self._previous: bytes | None = None
        self._owed = 0
        update(struct.pack(">H", len(TAG)) + TAG + struct.pack(">IQ", VERSION, count))

    def _record(self, state: int, path: str, kind: int, executable: bool, length: int) -> None:
        if self._owed:
            raise ValueError(f"the previous record still owes {self._owed} content bytes")
        if self._written == self._expected:
            raise ValueError(f"more than the {self._expected} records announced")
        encoded = ustar.check_relative_path(path, path).encode("ascii")
        if len(encoded) > PATH_MAX_BYTES:
            raise Refused(path, f"an identity path is at most {PATH_MAX_BYTES} bytes")
        if self._previous is not None and encoded <= self._previous:
            raise Refused(path, "identity records must be in strictly ascending path order")
        self._previous = encoded
        self._written += 1
        self._owed = length
        self._update(
            struct.pack(">BH", state, len(encoded)) + encoded + struct.pack(">BBQ", kind, int(executable), length)
        )

    def present(self, path: str, *, executable: bool, length: int) -> None:
        self._record(PRESENT, path, TYPE_REGULAR, executable, length)

    def content(self, chunk: bytes | memoryview) -> None:
        if len(chunk) > self._owed:
            raise ValueError("more content bytes than the record's length")
        self._owed -= len(chunk)
        self._update(chunk)

    def finish(self) -> None:
        if self._owed or self._written != self._expected:
            raise ValueError("the identity stream ended before its announced records and content")


def digest_name(hasher: "hashlib._Hash") -> str:
    return "sha256:" + hasher.hexdigest()


def _read_exactly(fd: int, length: int, where: str, writer: IdentityWriter) -> None:
    buffer = bytearray(min(length, _READ_CHUNK) or 1)
    view = memoryview(buffer)
    remaining = length
    while remaining:
        count = os.readv(fd, [view[: min(remaining, len(buffer))]])
        if not count:
            raise Refused(where, "the file shrank while it was hashed")
        writer.content(view[:count])
        remaining -= count
    if os.read(fd, 1):
        raise Refused(where, "the file grew while it was hashed")


def _open_regular(dir_fd: int, name: str) -> tuple[int, os.stat_result]:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as error:
        raise Refused(name, f"cannot be opened as a regular file ({os.strerror(error.errno)})") from None
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode):
        os.close(fd)
        raise Refused(name, "is not a regular file")
    return fd, status


def digest_directory(dir_fd: int) -> str:
    """The identity of a flat directory of regular files, read descriptor-relative.

    This is how the trusted side recomputes the identity of a sealed extraction:
    it reads files as data and never parses an archive (DESIGN T3). Anything but
    a regular file is refused, and every bound of DESIGN T2 is checked from the
    files' sizes before the first byte is read.
    """
    names = sorted(os.listdir(dir_fd), key=os.fsencode)
    if len(names) > ustar.MAX_MEMBERS - 1:
        raise Refused("the candidate directory", f"holds more than {ustar.MAX_MEMBERS - 1} files")
    opened: list[tuple[str, int, os.stat_result]] = []
    try:
        for name in names:
            fd, status = _open_regular(dir_fd, name)
            opened.append((name, fd, status))
            if status.st_size > ustar.MEMBER_MAX_BYTES:
                raise Refused(name, f"is over the {ustar.MEMBER_MAX_BYTES}-byte member cap")
        if sum(status.st_size for _, _, status in opened) > ustar.TOTAL_MAX_BYTES:
            raise Refused("the candidate directory", f"its files exceed the {ustar.TOTAL_MAX_BYTES}-byte total cap")
        hasher = hashlib.sha256()
        writer = IdentityWriter(len(opened), hasher.update)
        for name, fd, status in opened:
            writer.present(name, executable=bool(status.st_mode & stat.S_IXUSR), length=status.st_size)
            _read_exactly(fd, status.st_size, name, writer)
        writer.finish()
    finally:
        for _, fd, _ in opened:
            os.close(fd)
    return digest_name(hasher)
