"""The trusted, data-only preflight of a bundle and the coordinates it hands on (DESIGN T3).

The trusted side only sizes and hashes a bundle: it reads at most the archive
cap plus one byte, streams them through SHA-256, and compares with the digest
it was told to expect. It never parses the archive. Its result is a closed
coordinate (docs/transport.md) that later steps re-read strictly with
:func:`handoff_from_bytes` and bind to their own attempt and plan.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os

from executor.frontend import open_regular
from executor.ustar import ARCHIVE_MAX_BYTES
from journal.closed import SHA256_HEX, ClosedObject, check_digest, check_str
from journal.errors import Refused
from journal.format import check_id
from journal.strictjson import canonical, loads

SCHEMA = "casebox.handoff.v1"
HANDOFF_MAX_BYTES = 4_096
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

    def bound_to(self, attempt: str, plan: str) -> "Handoff":
        """This coordinate, if it was made for exactly this attempt and plan."""
        if self.attempt != attempt:
            raise Refused("$.attempt", f"the coordinate is for attempt {self.attempt}, not {attempt}")
        if self.plan != plan:
            raise Refused("$.plan", f"the coordinate is for plan {self.plan}, not {plan}")
        return self


def check_attempt(value: str, where: str) -> str:
    return check_id(value, where)


def check_sha256(value: str, where: str) -> str:
    return check_str(value, where, max_bytes=64, pattern=SHA256_HEX, rule="must be 64 lowercase hex digits")


def handoff_from_bytes(data: bytes) -> Handoff:
    """Strictly re-read a handoff coordinate; attempt and plan are both set or both null."""
    fields = ClosedObject(loads(data, max_bytes=HANDOFF_MAX_BYTES))
    fields.pop_const("schema", SCHEMA)
    attempt = fields.pop_nullable("attempt")
    bundle = fields.pop_object("bundle")
    coordinate = BundleCoordinate(bundle.pop_sha256("sha256"), bundle.pop_int("size", low=0, high=ARCHIVE_MAX_BYTES))
    bundle.done()
    plan = fields.pop_nullable("plan")
    fields.done()
    if (attempt is None) != (plan is None):
        raise Refused("$.attempt", "attempt and plan are both given or both null")
    if attempt is not None:
        check_attempt(attempt, "$.attempt")
        check_digest(plan, "$.plan")
    return Handoff(attempt, coordinate, plan)


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
