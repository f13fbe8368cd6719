"""Manifest v1: the closed list of a candidate's wheels (DESIGN T5, docs/transport.md).

The manifest names each wheel's file name, size and sha256. Inside a bundle
it is ``candidate/manifest.json`` in canonical JSON, and the bundle must hold
exactly the wheels it lists, with those sizes and digests. What it says about
the candidate is self-description (DESIGN T6): it binds the bundle's own bytes
and grants no authority.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable

from executor.transport import ustar
from journal.closed import ClosedObject
from journal.errors import Refused
from journal.strictjson import StrictJSONError, canonical, loads

SCHEMA = "casebox.manifest.v1"
NAME = "manifest.json"
PATH = f"{ustar.TOP}/{NAME}"
MANIFEST_MAX_BYTES = 65_536
MAX_WHEELS = ustar.MAX_MEMBERS - 2
WHEEL_NAME_MAX_BYTES = 100

# The wheel file name convention: distribution-version(-build)?-python-abi-platform.whl,
# each component already escaped by the builder so it holds no '-'.
WHEEL_NAME = re.compile(
    r"[A-Za-z0-9](?:[A-Za-z0-9._]*[A-Za-z0-9])?"  # distribution
    r"-[A-Za-z0-9_.!+]+"  # version
    r"(?:-[0-9][A-Za-z0-9_.]*)?"  # build tag
    r"-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+"  # python, abi and platform tags
    r"\.whl\Z"
)


def check_wheel_name(name: str, where: str) -> str:
    """The one wheel file name rule, used by pack and by the manifest reader."""
    if not name.isascii():
        raise Refused(where, "a wheel file name must be ASCII")
    if len(name) > WHEEL_NAME_MAX_BYTES:
        raise Refused(where, f"a wheel file name is at most {WHEEL_NAME_MAX_BYTES} bytes, not {len(name)}")
    if not WHEEL_NAME.match(name):
        raise Refused(where, "is not a valid wheel file name (name-version[-build]-python-abi-platform.whl)")
    return name


def canonical_project(name: str) -> str:
    """A project name in its one comparable spelling (PEP 503): runs of ``-_.`` become ``-``, lowercase."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_project(name: str, where: str) -> tuple[str, str]:
    """(canonical project, version) of a valid wheel file name: its first two ``-`` fields."""
    check_wheel_name(name, where)
    project, version = name.split("-")[:2]
    return canonical_project(project), version


@dataclasses.dataclass(frozen=True)
class Wheel:
    file: str
    size: int
    sha256: str

    @property
    def path(self) -> str:
        return f"{ustar.TOP}/{self.file}"

    def as_dict(self) -> dict:
        return {"file": self.file, "size": self.size, "sha256": self.sha256}


@dataclasses.dataclass(frozen=True)
class Manifest:
    wheels: tuple[Wheel, ...]

    def as_dict(self) -> dict:
        return {"schema": SCHEMA, "wheels": [wheel.as_dict() for wheel in self.wheels]}

    def canonical_bytes(self) -> bytes:
        return canonical(self.as_dict())

    def wheel_at(self, path: str) -> Wheel | None:
        return next((wheel for wheel in self.wheels if wheel.path == path), None)


def check_wheel_set(names: Iterable[str], where: str) -> None:
    """Wheels are sorted by file name, and no two collide after case folding."""
    seen: set[str] = set()
    previous = ""
    for name in names:
        if ustar.fold(name) in seen:
            raise Refused(where, f"lists {name} twice (compared without regard to case)")
        if name.encode("ascii") < previous.encode("ascii"):
            raise Refused(where, f"lists {name} after {previous}; wheels must be sorted by file name")
        seen.add(ustar.fold(name))
        previous = name


def manifest_from_value(value: object) -> Manifest:
    fields = ClosedObject(value)
    fields.pop_const("schema", SCHEMA)
    wheels = []
    for path, item in fields.pop_list("wheels", min_items=1, max_items=MAX_WHEELS):
        entry = ClosedObject(item, path)
        name = check_wheel_name(entry.pop_str("file", max_bytes=WHEEL_NAME_MAX_BYTES * 4), f"{path}.file")
        size = entry.pop_int("size", low=0, high=ustar.MEMBER_MAX_BYTES)
        digest = entry.pop_sha256("sha256")
        entry.done()
        wheels.append(Wheel(name, size, digest))
    fields.done()
    check_wheel_set((wheel.file for wheel in wheels), "$.wheels")
    return Manifest(tuple(wheels))


def manifest_from_bytes(data: bytes) -> Manifest:
    """The manifest in ``data``, which must be closed, valid and in canonical form."""
    manifest = manifest_from_value(loads(data, max_bytes=MANIFEST_MAX_BYTES))
    if manifest.canonical_bytes() != data:
        raise StrictJSONError("$", "the manifest is not in canonical JSON form (RFC 8785, no trailing newline)")
    return manifest


def check_listing(manifest: Manifest, members: Iterable[ustar.Member]) -> None:
    """The archive holds candidate/, the manifest and exactly the listed wheels at their sizes."""
    found = set()
    for member in members:
        where = f"member {member.path}"
        if member.path in (ustar.TOP, PATH):
            continue
        wheel = manifest.wheel_at(member.path)
        if wheel is None or member.directory:
            raise Refused(where, "is not listed in the manifest")
        if member.size != wheel.size:
            raise Refused(where, f"is {member.size} bytes but the manifest lists {wheel.size}")
        found.add(member.path)
    for wheel in manifest.wheels:
        if wheel.path not in found:
            raise Refused(f"member {wheel.path}", "is listed in the manifest but absent from the archive")


def check_digest(wheel: Wheel, digest: str) -> None:
    """A wheel's bytes hash to the sha256 its manifest entry lists."""
    if digest != wheel.sha256:
        raise Refused(f"member {wheel.path}", f"has sha256 {digest}, not the {wheel.sha256} the manifest lists")
