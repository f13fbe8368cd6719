"""The tests' own ustar forge: any header, hostile or not, built by hand from the field table.

It shares no code with executor/transport/ustar.py, so a mistake in the casebox encoder
is not mirrored here. Defaults are the closed profile's fixed values; every
field can be overridden with raw bytes.
"""

from __future__ import annotations

import hashlib
import json
import os

OFFSETS = {
    "name": (0, 100),
    "mode": (100, 8),
    "uid": (108, 8),
    "gid": (116, 8),
    "size": (124, 12),
    "mtime": (136, 12),
    "chksum": (148, 8),
    "typeflag": (156, 1),
    "linkname": (157, 100),
    "magic": (257, 6),
    "version": (263, 2),
    "uname": (265, 32),
    "gname": (297, 32),
    "devmajor": (329, 8),
    "devminor": (337, 8),
    "prefix": (345, 155),
    "pad": (500, 12),
}


def octal(value: int, width: int) -> bytes:
    return ("%0*o" % (width - 1, value)).encode() + b"\x00"


def header(name: str | bytes, *, typeflag: bytes = b"0", length: int = 0, **raw: bytes) -> bytes:
    """A 512-byte header; ``raw`` replaces whole fields (NUL-padded), ``chksum`` included."""
    if isinstance(name, str):
        name = name.encode("utf-8")
    fields = {
        "name": name,
        "mode": octal(0o755 if typeflag == b"5" else 0o644, 8),
        "uid": octal(0, 8),
        "gid": octal(0, 8),
        "size": octal(length, 12),
        "mtime": octal(0, 12),
        "typeflag": typeflag,
        "magic": b"ustar\x00",
        "version": b"00",
        "devmajor": octal(0, 8),
        "devminor": octal(0, 8),
    }
    fields.update(raw)
    block = bytearray(512)
    for field, value in fields.items():
        if field == "chksum":
            continue
        offset, width = OFFSETS[field]
        assert len(value) <= width, (field, value)
        block[offset : offset + len(value)] = value
    if "chksum" in raw:
        block[148:156] = raw["chksum"].ljust(8, b"\x00")
    else:
        block[148:156] = b" " * 8
        block[148:156] = ("%06o" % sum(block)).encode() + b"\x00 "
    return bytes(block)


def member(name: str | bytes, data: bytes = b"", *, typeflag: bytes = b"0", **raw: bytes) -> bytes:
    block = header(name, typeflag=typeflag, length=len(data), **raw)
    return block + data + bytes(-len(data) % 512)


def directory(name: str | bytes, **raw: bytes) -> bytes:
    return member(name, typeflag=b"5", **raw)


def archive(*members: bytes) -> bytes:
    body = b"".join(members) + bytes(1024)
    return body + bytes(-len(body) % 10240)


def manifest_bytes(wheels: dict[str, bytes]) -> bytes:
    listed = [
        {"file": name, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        for name, data in sorted(wheels.items())
    ]
    return json.dumps({"schema": "casebox.manifest.v1", "wheels": listed}, sort_keys=True, separators=(",", ":")).encode()


WHEEL = "demo-1.0-py3-none-any.whl"


def candidate(wheels: dict[str, bytes] | None = None, *, manifest: bytes | None = None, extra: tuple = ()) -> bytes:
    """A bundle in the closed profile, with optional extra (name, member bytes) entries sorted in."""
    wheels = {WHEEL: b"wheel bytes\n"} if wheels is None else wheels
    entries = [("candidate", directory("candidate/")), ("candidate/manifest.json", member("candidate/manifest.json", manifest or manifest_bytes(wheels)))]
    entries += [(f"candidate/{name}", member(f"candidate/{name}", data)) for name, data in wheels.items()]
    entries += list(extra)
    entries.sort(key=lambda entry: entry[0].encode())
    return archive(*(block for _, block in entries))


def memfd(data: bytes) -> int:
    """An anonymous in-memory file holding ``data``, positioned at 0."""
    fd = os.memfd_create("bundle", os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
