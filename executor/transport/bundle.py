"""The bundle reader: lexical preflight, manifest check and verified member streams.

Everything that can be decided without reading member data is decided by
:func:`open_bundle` before anyone writes a byte: every header, every bound,
the manifest and the member list. Wheel digests are checked as the bytes
stream through :func:`member_chunks`, so a consumer that writes them must undo
its work on a refusal (the extractor does). This module runs where candidate
bytes may be parsed: in the sandbox, or in a producer's or reviewer's
``bundle check``; never on the trusted side of a verification (DESIGN T3).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
from typing import Iterator

from executor.transport import identity, manifest, ustar
from journal.errors import Refused

CHUNK_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class Bundle:
    fd: int
    members: tuple[ustar.Member, ...]
    manifest: manifest.Manifest

    def files(self) -> tuple[ustar.Member, ...]:
        return tuple(member for member in self.members if not member.directory)


def _reader(fd: int):
    def read_at(offset: int, length: int) -> bytes:
        return os.pread(fd, length, offset)

    return read_at


def archive_size(fd: int) -> int:
    """The size of a regular archive file, refused over the cap before any read."""
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode):
        raise Refused("the archive", "must be a regular file")
    if status.st_size > ustar.ARCHIVE_MAX_BYTES:
        raise Refused("the archive", f"is {status.st_size} bytes, over the {ustar.ARCHIVE_MAX_BYTES}-byte cap")
    return status.st_size


def open_bundle(fd: int) -> Bundle:
    """The checked bundle on ``fd``: every header, bound and the manifest listing passed."""
    read_at = _reader(fd)
    members = ustar.scan(read_at, archive_size(fd))
    entry = next((member for member in members if member.path == manifest.PATH), None)
    if entry is None or entry.directory:
        raise Refused(f"member {manifest.PATH}", "the manifest is missing")
    if entry.size > manifest.MANIFEST_MAX_BYTES:
        raise Refused(f"member {manifest.PATH}", f"is over the {manifest.MANIFEST_MAX_BYTES}-byte manifest cap")
    data = read_at(entry.data_offset, entry.size)
    if len(data) != entry.size:
        raise Refused(f"member {manifest.PATH}", "the member is truncated")
    try:
        listed = manifest.manifest_from_bytes(data)
    except Refused as refusal:
        raise refusal.under(f"member {manifest.PATH}") from None
    manifest.check_listing(listed, members)
    return Bundle(fd, members, listed)


def member_chunks(bundle: Bundle, member: ustar.Member, buffer: memoryview) -> Iterator[memoryview]:
    """The member's bytes in chunks read into ``buffer``; a listed wheel's sha256 is checked at its end.

    A chunk is only valid until the next one is read. The refusal for a digest
    mismatch comes after the last chunk, so a writer must be ready to undo.
    """
    wheel = bundle.manifest.wheel_at(member.path)
    hasher = hashlib.sha256()
    offset, remaining = member.data_offset, member.size
    while remaining:
        count = os.preadv(bundle.fd, [buffer[: min(remaining, len(buffer))]], offset)
        if not count:
            raise Refused(f"member {member.path}", "the member is truncated")
        chunk = buffer[:count]
        hasher.update(chunk)
        yield chunk
        offset += count
        remaining -= count
    if wheel is not None:
        manifest.check_digest(wheel, hasher.hexdigest())


def relative(member: ustar.Member) -> str:
    """A member's path inside candidate/, as the identity digest names it."""
    return member.path.removeprefix(ustar.TOP + "/")


def identity_of(bundle: Bundle) -> str:
    """The candidate identity digest of the bundle's files, streamed without writing."""
    files = bundle.files()
    hasher = hashlib.sha256()
    writer = identity.IdentityWriter(len(files), hasher.update)
    buffer = memoryview(bytearray(CHUNK_BYTES))
    for member in files:
        writer.present(relative(member), executable=bool(ustar.FILE_MODE & stat.S_IXUSR), length=member.size)
        for chunk in member_chunks(bundle, member, buffer):
            writer.content(chunk)
    writer.finish()
    return identity.digest_name(hasher)
