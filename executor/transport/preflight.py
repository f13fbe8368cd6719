"""The trusted, data-only preflight of a bundle and the coordinates it hands on (DESIGN T3).

The trusted side only sizes and hashes a bundle: it reads at most the archive
cap plus one byte, streams them through SHA-256, and compares with the digest
it was told to expect. It never parses the archive. ``bundle preflight``
prints its result as a closed coordinate (docs/transport.md) for the trusted
runner's own records; ``verify`` preflights the bundle itself.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os

from executor.inputs import open_regular
from executor.transport.ustar import ARCHIVE_MAX_BYTES
from journal.closed import SHA256_HEX, check_str
from journal.errors import Refused
from journal.format import check_id
from journal.strictjson import canonical

SCHEMA = "casebox.handoff.v1"
_READ_CHUNK = 1 << 20


@dataclasses.dataclass(frozen=True)
class BundleCoordinate:
    """What pack prints and preflight checks: the bundle's sha256 and size."""

    sha256: str
    size: int

    def as_dict(self) -> dict:
        return {"sha256": self.sha256, "size": self.size}


@dataclasses.dataclass(frozen=True)
class Handoff:
    """The handoff coordinate: the bundle, and the attempt and plan it was checked for."""

    attempt: str | None
    bundle: BundleCoordinate
    plan: str | None

    def as_dict(self) -> dict:
        return {"schema": SCHEMA, "attempt": self.attempt, "bundle": self.bundle.as_dict(), "plan": self.plan}

    def canonical_bytes(self) -> bytes:
        return canonical(self.as_dict())


def check_attempt(value: str, where: str) -> str:
    return check_id(value, where)


def check_sha256(value: str, where: str) -> str:
    return check_str(value, where, max_bytes=64, pattern=SHA256_HEX, rule="must be 64 lowercase hex digits")


def measure(fd: int, cap: int = ARCHIVE_MAX_BYTES) -> BundleCoordinate:
    """Size and sha256 of everything ``fd`` yields, reading at most ``cap + 1`` bytes."""
    hasher = hashlib.sha256()
    size = 0
    while size <= cap:
        chunk = os.read(fd, min(_READ_CHUNK, cap + 1 - size))
        if not chunk:
            return BundleCoordinate(hasher.hexdigest(), size)
        hasher.update(chunk)
        size += len(chunk)
    raise Refused("the bundle", f"is larger than the {cap}-byte archive cap")


def preflight(path: str, expected_sha256: str) -> BundleCoordinate:
    """The coordinate of the bundle at ``path`` if it is within the cap and hashes to ``expected_sha256``."""
    check_sha256(expected_sha256, "--sha256")
    fd = open_regular(path)
    try:
        status = os.fstat(fd)
        if status.st_size > ARCHIVE_MAX_BYTES:
            raise Refused(path, f"is {status.st_size} bytes, larger than the {ARCHIVE_MAX_BYTES}-byte archive cap")
        try:
            coordinate = measure(fd)
        except Refused as refusal:
            raise Refused(path, refusal.rule) from None
    finally:
        os.close(fd)
    if coordinate.sha256 != expected_sha256:
        raise Refused(path, f"has sha256 {coordinate.sha256}, not the expected {expected_sha256}")
    return coordinate
