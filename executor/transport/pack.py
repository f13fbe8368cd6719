"""``pack``: wheels and their manifest as one deterministic ustar bundle (DESIGN T1).

The output depends on the wheels' names and bytes alone: entries are sorted,
and every field that could carry the machine, the user or the time is fixed.
Pack is the producer checking its own data, so it, and only it, opens each
wheel as a zip to find ``*.dist-info/METADATA``; the consumer never opens one.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import zipfile
from typing import Sequence

from executor.transport import manifest, ustar
from executor.inputs import read_capped
from executor.transport.preflight import BundleCoordinate
from journal.errors import Refused

METADATA = re.compile(r"[^/]+\.dist-info/METADATA\Z")
METADATA_MAX_BYTES = 1 << 20


def check_wheel_archive(name: str, data: bytes) -> None:
    """The wheel is a readable zip with a top-level ``*.dist-info/METADATA``."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            entry = next((info for info in archive.infolist() if METADATA.match(info.filename)), None)
            if entry is None:
                raise Refused(name, "the wheel has no *.dist-info/METADATA")
            if entry.file_size > METADATA_MAX_BYTES:
                raise Refused(name, f"its METADATA is over {METADATA_MAX_BYTES} bytes")
            archive.read(entry)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError, ValueError) as error:
        raise Refused(name, f"is not a valid zip archive ({error})") from None


def build(wheels: Sequence[tuple[str, bytes]]) -> bytes:
    """The bundle for ``(file name, bytes)`` pairs; refused if it would break the format or a cap."""
    if not 1 <= len(wheels) <= manifest.MAX_WHEELS:
        raise Refused("pack", f"takes 1 to {manifest.MAX_WHEELS} wheels, not {len(wheels)}")
    for name, _ in wheels:
        manifest.check_wheel_name(name, name)
    wheels = sorted(wheels, key=lambda wheel: wheel[0].encode("ascii"))
    entries = []
    for name, data in wheels:
        if len(data) > ustar.MEMBER_MAX_BYTES:
            raise Refused(name, f"is over the {ustar.MEMBER_MAX_BYTES}-byte member cap")
        check_wheel_archive(name, data)
        entries.append(manifest.Wheel(name, len(data), hashlib.sha256(data).hexdigest()))
    manifest.check_wheel_set((entry.file for entry in entries), "pack")
    listed = manifest.Manifest(tuple(entries))
    members = [(ustar.TOP, True, b""), (manifest.PATH, False, listed.canonical_bytes())]
    members += [(entry.path, False, data) for entry, (_, data) in zip(entries, wheels)]
    members.sort(key=lambda member: member[0].encode("ascii"))
    total = sum(len(data) for _, _, data in members)
    if total > ustar.TOTAL_MAX_BYTES:
        raise Refused("pack", f"the wheels total {total} bytes, over the {ustar.TOTAL_MAX_BYTES}-byte cap")
    parts = []
    length = 0
    for path, directory, data in members:
        raw = (path + "/" if directory else path).encode("ascii")
        ustar.check_member_path(raw, directory=directory, where=path)
        parts += [ustar.encode_header(path, directory=directory, size=len(data)), data]
        parts.append(bytes(ustar.round_up(len(data), ustar.BLOCK) - len(data)))
        length += ustar.BLOCK + ustar.round_up(len(data), ustar.BLOCK)
    parts.append(ustar.end_of_archive(length))
    # The total cap plus every header and padding stays under the archive cap, so a
    # bundle that passed the total cap passes the archive cap too.
    return b"".join(parts)


def read_wheels(paths: Sequence[str]) -> list[tuple[str, bytes]]:
    """Each wheel's file name (its path's last segment) and bytes, read within the member cap."""
    return [(os.path.basename(path), read_capped(path, ustar.MEMBER_MAX_BYTES)) for path in paths]


def coordinate(bundle: bytes) -> BundleCoordinate:
    return BundleCoordinate(hashlib.sha256(bundle).hexdigest(), len(bundle))
