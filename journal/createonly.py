"""Create-once evidence files (DESIGN E4), relative to a directory descriptor.

A file is written whole into an anonymous ``O_TMPFILE`` inode, fsynced, and only
then linked under its name, so a reader never sees a half-written file and a
crash leaves either nothing or the complete bytes. An existing name is never
replaced: identical bytes are accepted after they are re-read and fsynced with
their parent; different bytes are refused.
"""

from __future__ import annotations

import errno
import os
import stat

from journal.errors import Refused

_READ_CHUNK = 1 << 16
# Why a file cannot be created in a directory that opened: the caller's input, not the host (exit 64).
_NOT_CREATABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


class EvidenceConflict(Refused):
    """A different file already holds an evidence name."""


def _read_all(fd: int, limit: int) -> bytes | None:
    chunks = []
    total = 0
    while True:
        chunk = os.read(fd, _READ_CHUNK)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > limit:
            return None
        chunks.append(chunk)


def _accept_existing(dir_fd: int, name: str, data: bytes, shown: str) -> None:
    try:
        # O_NONBLOCK: a FIFO planted under the name must be refused, not waited on at open.
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as error:
        raise EvidenceConflict(shown, f"already exists and cannot be re-read ({os.strerror(error.errno)})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise EvidenceConflict(shown, "already exists and is not a regular file")
        if _read_all(fd, len(data)) != data:
            raise EvidenceConflict(shown, "already exists with different bytes; evidence is never rewritten")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.fsync(dir_fd)


def write_durably(fd: int, data: bytes, mode: int) -> None:
    """Write all of ``data`` to the new file ``fd``, set its mode (the umask never applies), then fsync it."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fchmod(fd, mode)
    os.fsync(fd)


def publish_once(dir_fd: int, name: str, data: bytes, *, mode: int = 0o444, shown: str | None = None) -> bool:
    """Create ``name`` under ``dir_fd`` holding exactly ``data``; True if this call created it."""
    shown = shown or name
    if "/" in name or name in ("", ".", ".."):
        raise Refused(shown, "an evidence name must be one plain path segment")
    try:
        fd = os.open(".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    except OSError as error:
        if error.errno in _NOT_CREATABLE:
            raise Refused(shown, f"cannot be created ({os.strerror(error.errno)})") from None
        raise
    try:
        write_durably(fd, data, mode)
        try:
            os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dir_fd, follow_symlinks=True)
        except FileExistsError:
            _accept_existing(dir_fd, name, data, shown)
            return False
    finally:
        os.close(fd)
    os.fsync(dir_fd)
    return True


def open_directory(path: str, *, dir_fd: int | None = None) -> int:
    """A directory descriptor for ``path`` that never follows a final symlink."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as error:
        if error.errno in (errno.ENOTDIR, errno.ELOOP):
            raise Refused(path, "must be a directory, not a symlink or a file") from None
        raise Refused(path, f"cannot be opened as a directory ({os.strerror(error.errno)})") from None


def check_creatable(path: str) -> None:
    """Refuse, before any work, a new file at ``path`` that :func:`publish_once` could not create later: its
    directory is missing, not a directory or not writable, or the name is taken."""
    directory = os.path.dirname(os.path.abspath(path))
    fd = open_directory(directory)
    try:
        if not os.access(f"/proc/self/fd/{fd}", os.W_OK):
            raise Refused(path, f"cannot be created: its directory {directory} is not writable")
    finally:
        os.close(fd)
    if os.path.lexists(path):
        raise Refused(path, "already exists; it is created new")
