"""The hardened extractor: a checked bundle into an empty directory, by descriptor only.

It runs in the sandbox as the dedicated UID (DESIGN T4): the trusted side
never calls it on candidate bytes. It takes an already-open archive descriptor
and an already-open empty target directory descriptor, and never builds or
resolves a path: every entry is created with ``dir_fd`` relative to its parent's
descriptor, files with ``O_CREAT|O_EXCL|O_NOFOLLOW``. Every header, bound and
the manifest listing pass before the first byte is written. A wheel digest
that differs is found while its bytes stream, and then everything written is
removed, so a refused extraction leaves the target empty. Files end 0444 and
directories 0555 once filled.

It imports only the stdlib and the modules in :data:`SANDBOX_MODULES`, so the
sandbox is handed just those files; the case service runs it through
executor/inside.py, which opens the archive and the target and calls
:func:`main` with their descriptors.
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

from executor.transport import bundle as reader
from executor.cli.frontend import EXIT_OK, run_command
from executor.transport.ustar import Member
from journal.errors import Refused

# Every casebox module the extractor imports, directly or not.
SANDBOX_MODULES = (
    "journal/__init__.py",
    "journal/errors.py",
    "journal/untrusted.py",
    "journal/strictjson.py",
    "journal/closed.py",
    "executor/__init__.py",
    "executor/cli/__init__.py",
    "executor/cli/frontend.py",
    "executor/transport/__init__.py",
    "executor/transport/ustar.py",
    "executor/transport/manifest.py",
    "executor/transport/identity.py",
    "executor/transport/bundle.py",
    "executor/transport/extract.py",
)
FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FINAL_MODE = 0o444
DIRECTORY_FINAL_MODE = 0o555


class _Written:
    """What this extraction created, so a refusal can remove exactly that."""

    def __init__(self, target_fd: int) -> None:
        self.directories: dict[str, int] = {"": target_fd}
        self.entries: list[tuple[int, str, bool]] = []

    def parent(self, member: Member) -> tuple[int, str]:
        parent, _, name = member.path.rpartition("/")
        return self.directories[parent], name

    def undo(self) -> None:
        # Directories are still 0700 here: they become 0555 only after the last write.
        for parent_fd, name, directory in reversed(self.entries):
            if directory:
                os.rmdir(name, dir_fd=parent_fd)
            else:
                os.unlink(name, dir_fd=parent_fd)

    def close(self) -> None:
        for path, fd in self.directories.items():
            if path:
                os.close(fd)


def create_file(parent_fd: int, name: str) -> int:
    """A new file's descriptor; an existing name, symlink or not, is refused, never reused."""
    try:
        return os.open(name, FILE_FLAGS, 0o600, dir_fd=parent_fd)
    except FileExistsError:
        raise Refused(name, "already exists in the target; extraction never replaces or follows an entry") from None


def _make_directory(written: _Written, member: Member) -> None:
    parent_fd, name = written.parent(member)
    os.mkdir(name, 0o700, dir_fd=parent_fd)
    written.entries.append((parent_fd, name, True))
    written.directories[member.path] = os.open(name, DIRECTORY_FLAGS, dir_fd=parent_fd)


def _write_file(written: _Written, checked: reader.Bundle, member: Member, buffer: memoryview) -> None:
    parent_fd, name = written.parent(member)
    fd = create_file(parent_fd, name)
    written.entries.append((parent_fd, name, False))
    try:
        for chunk in reader.member_chunks(checked, member, buffer):
            while chunk:
                chunk = chunk[os.write(fd, chunk):]
        os.fchmod(fd, FILE_FINAL_MODE)
    finally:
        os.close(fd)


def extract(archive_fd: int, target_fd: int) -> reader.Bundle:
    """Extract the bundle on ``archive_fd`` into the empty directory ``target_fd``."""
    if os.listdir(target_fd):
        raise Refused("the target directory", "must be empty")
    checked = reader.open_bundle(archive_fd)
    written = _Written(target_fd)
    buffer = memoryview(bytearray(reader.CHUNK_BYTES))
    try:
        for member in checked.members:
            if member.directory:
                _make_directory(written, member)
            else:
                _write_file(written, checked, member, buffer)
        for path, fd in written.directories.items():
            if path:
                os.fchmod(fd, DIRECTORY_FINAL_MODE)
    except BaseException:
        written.undo()
        raise
    finally:
        written.close()
    return checked


def main(argv: Sequence[str]) -> int:
    """``ARCHIVE_FD TARGET_FD``: exit 0, 64 with one sentence for a refused bundle, 70 otherwise."""

    def run() -> int:
        if len(argv) != 2 or not all(arg.isdigit() for arg in argv):
            raise Refused("extract", "takes exactly two arguments: ARCHIVE_FD TARGET_FD")
        extract(int(argv[0]), int(argv[1]))
        return EXIT_OK

    return run_command(run, debug=False)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
