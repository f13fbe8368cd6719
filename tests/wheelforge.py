"""Wheels built in the tests with zipfile: honest ones, and hostile ones that try to get past a guard.

A wheel here is the smallest thing pip installs: its files, a ``.dist-info``
with METADATA, WHEEL, RECORD and optionally entry_points.txt. Nothing is
built by a build backend, so a test says exactly which bytes the candidate
(or the index) ships.
"""

from __future__ import annotations

import base64
import hashlib
import pathlib
import re
import zipfile


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name)


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")
    return f"{path},sha256={digest},{len(data)}"


def wheel(
    directory: pathlib.Path | str,
    name: str,
    version: str,
    *requires: str,
    files: dict[str, bytes | str] | None = None,
    requires_python: str | None = None,
    entry_points: str | None = None,
    extras: tuple[str, ...] = (),
    metadata: bytes | None = None,
    tag: str = "py3-none-any",
) -> pathlib.Path:
    """Write ``NAME-VERSION-TAG.whl`` into ``directory`` and return its path.

    ``files`` maps archive paths to contents; without it the wheel holds one
    package ``NAME/__init__.py``. ``metadata`` replaces the whole METADATA.
    """
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stem = _normalized(name)
    dist_info = f"{stem}-{version}.dist-info"
    if files is None:
        files = {f"{stem.lower()}/__init__.py": f"VERSION = {version!r}\n"}
    if metadata is None:
        lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
        if requires_python:
            lines.append(f"Requires-Python: {requires_python}")
        lines += [f"Provides-Extra: {extra}" for extra in extras]
        lines += [f"Requires-Dist: {requirement}" for requirement in requires]
        metadata = ("\n".join(lines) + "\n").encode("utf-8")
    members = {path: data.encode("utf-8") if isinstance(data, str) else data for path, data in files.items()}
    members[f"{dist_info}/METADATA"] = metadata
    members[f"{dist_info}/WHEEL"] = f"Wheel-Version: 1.0\nGenerator: wheelforge\nRoot-Is-Purelib: true\nTag: {tag}\n".encode()
    if entry_points is not None:
        members[f"{dist_info}/entry_points.txt"] = entry_points.encode("utf-8")
    record = [_record_line(path, data) for path, data in members.items()] + [f"{dist_info}/RECORD,,"]
    members[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode("utf-8")
    path = directory / f"{stem}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for member, data in members.items():
            archive.writestr(zipfile.ZipInfo(member, date_time=(1980, 1, 1, 0, 0, 0)), data)
    return path
