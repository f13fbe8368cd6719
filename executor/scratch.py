"""The trusted side's private scratch: the directories it makes to hand into sandboxes.

A verification makes a few directories of its own: the bundle (a private
copy of the user's file, preflighted after it was copied, so the bytes the
extractor reads are the bytes that were hashed), the tools (casebox's own
sandboxed modules), the resolver's request and the ACKed pins. They live in
one private directory (0700, made with ``mkdtemp``) outside the state root;
each is filled, its files made 0444 and the directory 0755, then opened
once, and its descriptor is a :class:`~executor.cases.ownership.DirectoryCapability`
that passes F4 when the session accepts it. Nothing here runs or parses
candidate bytes.

The directory is removed on every way out of a verification; only a SIGKILL
can leave it. So its name carries its maker's process identity
(``casebox-scratch-<pid>-<start time>-``) and its maker holds an exclusive
``flock`` on it: :func:`remove_abandoned` (run by the next ``verify`` and by
``stage recover``) removes every such directory of this user whose maker is
gone and whose lock is free, and says which.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import stat
import tempfile

from executor.transport import preflight
from executor.inputs import open_regular
from executor.cases.ownership import DirectoryCapability
from executor.transport.ustar import ARCHIVE_MAX_BYTES
from journal.errors import Refused

BUNDLE_NAME = "candidate.tar"
PREFIX = "casebox-scratch-"
_NAME = re.compile(rf"{PREFIX}([0-9]+)-([0-9]+)-[A-Za-z0-9_]+\Z")
_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20


def _write(path: str, data: bytes) -> None:
    fd = os.open(path, _FILE, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, 0o444)
    finally:
        os.close(fd)


def _start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat``: with the pid, which process this is (None when there is none)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            return int(file.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def remove_abandoned(directory: str | None = None) -> list[str]:
    """Remove the scratch directories of this user in ``directory`` (the temporary directory) whose maker
    was killed: its process identity is gone and its lock is free. The paths removed."""
    directory = directory or tempfile.gettempdir()
    removed = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return removed
    for name in names:
        match = _NAME.match(name)
        if match is None or _start_time(int(match.group(1))) == int(match.group(2)):
            continue
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            info = os.fstat(fd)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its lock is held: a verification still uses it
        else:
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.lexists(path):
                removed.append(path)
        finally:
            os.close(fd)
    return removed


class Scratch:
    """One private directory per verification, locked while it lives; :meth:`close` removes it."""

    def __init__(self) -> None:
        identity = f"{os.getpid()}-{_start_time(os.getpid())}-"
        self.path = tempfile.mkdtemp(prefix=PREFIX + identity)
        self._lock = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        fcntl.flock(self._lock, fcntl.LOCK_EX)

    def _finish(self, name: str, path: str) -> DirectoryCapability:
        for directory, subdirectories, _ in os.walk(path):
            for subdirectory in subdirectories:
                os.chmod(os.path.join(directory, subdirectory), 0o755)
        os.chmod(path, 0o755)
        return DirectoryCapability(name, os.open(path, _DIRECTORY))

    def directory(self, name: str, files: dict[str, bytes]) -> DirectoryCapability:
        """A new directory ``name`` holding ``files`` (relative paths, '/' for subdirectories), sealed 0444/0755."""
        path = os.path.join(self.path, name)
        os.mkdir(path, 0o700)
        for relative, data in sorted(files.items()):
            parent = os.path.dirname(relative)
            if parent:
                os.makedirs(os.path.join(path, parent), mode=0o700, exist_ok=True)
            _write(os.path.join(path, relative), data)
        return self._finish(name, path)

    def bundle(self, source: str, expected_sha256: str) -> DirectoryCapability:
        """A private copy of the bundle at ``source``, preflighted after the copy (size cap, sha256): T3."""
        preflight.check_sha256(expected_sha256, "--sha256")
        path = os.path.join(self.path, "bundle")
        os.mkdir(path, 0o700)
        copy = os.path.join(path, BUNDLE_NAME)
        reader = open_regular(source)
        try:
            writer = os.open(copy, _FILE, 0o600)
            try:
                copied = 0
                while chunk := os.read(reader, min(_CHUNK, ARCHIVE_MAX_BYTES + 1 - copied)):
                    copied += len(chunk)
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(writer, view):]
                    if copied > ARCHIVE_MAX_BYTES:
                        raise Refused(source, f"is larger than the {ARCHIVE_MAX_BYTES}-byte archive cap")
                os.fchmod(writer, 0o444)
            finally:
                os.close(writer)
        finally:
            os.close(reader)
        try:
            preflight.preflight(copy, expected_sha256)
        except Refused as refusal:
            raise Refused(source, refusal.rule) from None
        return self._finish("bundle", path)

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock >= 0:
            os.close(self._lock)
            self._lock = -1
