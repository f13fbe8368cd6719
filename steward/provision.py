"""S1: build the shipped launcher as one deterministic file, and provision it create-only.

The launcher is the ``launcher/`` package zipped as an executable zip: each
module's source and its unchecked hash-based .pyc (compiled here, so neither
stage spends ~10 ms compiling), sorted by name, stored uncompressed, with
fixed timestamps and permissions, plus a two-line ``__main__.py``. The same
package and interpreter always give the same bytes, and the digest of those
bytes is the shipped launcher's digest. ``python -I -S FILE`` runs such a zip
directly.

A launcher is provisioned into ``<state root>/staging``, a root-owned 0700
directory (steward/stateroot.py), with ``O_CREAT|O_EXCL|O_NOFOLLOW``, mode 0500, then fsynced with
its directory. Before it is started it is reopened and checked: a regular
file, root-owned, mode 0500, one link, and the shipped digest. The descriptor
that was checked is the one the interpreter runs (``/proc/self/fd/N``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import io
import marshal
import os
import pathlib
import stat
import zipfile

import launcher
from journal.createonly import write_durably
from journal.errors import Refused
from launcher.digest import sha256_of_fd
from steward.stateroot import STAGING, StateRoot

ENTRY = b"from launcher.__main__ import main\nmain()\n"
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
LAUNCHER_MODE = 0o500


def _entry(archive: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
    info.compress_type = zipfile.ZIP_STORED
    info.create_system = 3
    info.external_attr = (stat.S_IFREG | 0o444) << 16
    archive.writestr(info, data)


def _pyc(source: bytes, name: str) -> bytes:
    """An unchecked hash-based .pyc (PEP 552): magic, flags=0b01, source hash, marshalled code."""
    code = compile(source, name, "exec", dont_inherit=True, optimize=0)
    return importlib.util.MAGIC_NUMBER + (1).to_bytes(4, "little") + importlib.util.source_hash(source) + marshal.dumps(code)


def build(package_dir: pathlib.Path) -> bytes:
    """The deterministic executable zip of the launcher package in ``package_dir``."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        _entry(archive, "__main__.py", ENTRY)
        for path in sorted(package_dir.glob("*.py")):
            name = f"launcher/{path.name}"
            source = path.read_bytes()
            _entry(archive, name, source)
            _entry(archive, name + "c", _pyc(source, name))
    return buffer.getvalue()


@functools.lru_cache(maxsize=1)
def shipped() -> tuple[bytes, bytes]:
    """(bytes, SHA-256) of the launcher shipped with this installation, built once per process."""
    data = build(pathlib.Path(launcher.__file__).resolve().parent)
    return data, hashlib.sha256(data).digest()


def open_staging(state_root: "StateRoot | str") -> tuple[int, str]:
    """(a descriptor for ``<state root>/staging``, the state root's path), after the state root's checks.

    ``state_root`` is an open :class:`~steward.stateroot.StateRoot` or its path;
    the staging directory is root-owned 0700 (steward/stateroot.py).
    """
    if isinstance(state_root, StateRoot):
        return os.dup(state_root.area(STAGING)), state_root.path
    with StateRoot.open(state_root) as root:
        return os.dup(root.area(STAGING)), root.path


def provision(staging_fd: int, name: str, data: bytes, *, shown: str) -> None:
    """Create ``name`` holding ``data``: create-only, root-owned, mode 0500, fsynced with its directory."""
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, LAUNCHER_MODE, dir_fd=staging_fd)
    except FileExistsError:
        raise Refused(shown, "already exists; a launcher is provisioned create-only") from None
    try:
        write_durably(fd, data, LAUNCHER_MODE)
    finally:
        os.close(fd)
    os.fsync(staging_fd)


def open_verified(staging_fd: int, name: str, digest: bytes, *, shown: str) -> int:
    """A read-only descriptor for the provisioned launcher, after every S1 check; the caller runs this one."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=staging_fd)
    except OSError as error:
        raise Refused(shown, f"cannot be opened ({error.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Refused(shown, "is not a regular file")
        if info.st_uid != 0:
            raise Refused(shown, f"is owned by uid {info.st_uid}; a launcher must be owned by root")
        if stat.S_IMODE(info.st_mode) != LAUNCHER_MODE:
            raise Refused(shown, f"has mode {stat.S_IMODE(info.st_mode):04o}; a launcher must be 0500")
        if info.st_nlink != 1:
            raise Refused(shown, f"has {info.st_nlink} links; a launcher has exactly one")
        if sha256_of_fd(fd) != digest:
            raise Refused(shown, "does not match the shipped launcher's SHA-256")
    except BaseException:
        os.close(fd)
        raise
    return fd
