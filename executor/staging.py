"""The trusted side's private staging: the directories it makes to hand into sandboxes.

A verification makes a few directories of its own: the bundle (a private
copy of the user's file, preflighted after it was copied, so the bytes the
extractor reads are the bytes that were hashed), the tools (casebox's own
sandboxed modules), the resolver's request and the ACKed pins. They live in
one private directory (0700, made with ``mkdtemp``) outside the state root;
each is filled, its files made 0444 and the directory 0755, then opened
once, and its descriptor is a :class:`~executor.ownership.DirectoryCapability`
that passes F4 when the session accepts it. Nothing here runs or parses
candidate bytes.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from executor import preflight
from executor.frontend import open_regular
from executor.ownership import DirectoryCapability
from executor.ustar import ARCHIVE_MAX_BYTES
from journal.errors import Refused

BUNDLE_NAME = "candidate.tar"
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


class Staging:
    """One private directory per verification; :meth:`close` removes it."""

    def __init__(self) -> None:
        self.path = tempfile.mkdtemp(prefix="casebox-staging-")

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
