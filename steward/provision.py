"""S1: build the shipped launcher as one deterministic file, and provision it create-only.

The launcher is the ``launcher/`` package compiled into one .pyc:
``launcher/onefile.py`` is its top-level code, and every other module of the
package is compiled here and stored in it as a code object (so neither stage
spends ~10 ms compiling, and neither needs ``runpy`` or a zip reader).
``python -I -S FILE`` runs such a file directly (the interpreter recognizes
the .pyc magic number). The same package and interpreter always give the
same bytes, and the digest of those bytes is the shipped launcher's digest.

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
import marshal
import os
import pathlib
import stat

import launcher
from journal.createonly import write_durably
from journal.errors import Refused
from launcher import onefile, seccomp
from launcher.digest import sha256_of_fd
from steward.failure import SandboxFailure
from steward.stateroot import STAGING, StateRoot

TOP_LEVEL = "onefile.py"
LAUNCHER_MODE = 0o500
# Marshal's format 2, the last without back-references: from format 3 an object is written as one that may be
# referred to again exactly when its reference count is above one, so the same code gave other bytes (and
# another digest) in a process that held more references to one of its constants, such as a long test run.
MARSHAL_VERSION = 2


def _compile(source: bytes, name: str):
    return compile(source, name, "exec", dont_inherit=True, optimize=0)


def build(package_dir: pathlib.Path) -> bytes:
    """The launcher package in ``package_dir`` as one unchecked hash-based .pyc (PEP 552), deterministically.

    Its code is ``onefile.py``'s, with the placeholder constant MODULES replaced
    by (name, is_package, code) for every other module, sorted by file name.
    """
    modules = tuple(
        (
            "launcher" if path.name == "__init__.py" else f"launcher.{path.stem}",
            path.name == "__init__.py",
            _compile(path.read_bytes(), f"launcher/{path.name}"),
        )
        for path in sorted(package_dir.glob("*.py"))
        if path.name != TOP_LEVEL
    )
    source = (package_dir / TOP_LEVEL).read_bytes()
    top = _compile(source, f"launcher/{TOP_LEVEL}")
    slots = [index for index, const in enumerate(top.co_consts) if isinstance(const, str) and const == onefile.MODULES]
    if len(slots) != 1:
        raise RuntimeError(f"launcher/{TOP_LEVEL} must hold its MODULES placeholder exactly once")
    constants = list(top.co_consts)
    constants[slots[0]] = modules
    code = top.replace(co_consts=tuple(constants))
    return importlib.util.MAGIC_NUMBER + (1).to_bytes(4, "little") + importlib.util.source_hash(source) + marshal.dumps(code, MARSHAL_VERSION)


@functools.lru_cache(maxsize=1)
def shipped() -> tuple[bytes, bytes]:
    """(bytes, SHA-256) of the launcher shipped with this installation, built once per process."""
    data = build(pathlib.Path(launcher.__file__).resolve().parent)
    return data, hashlib.sha256(data).digest()


@functools.lru_cache(maxsize=1)
def shipped_filter() -> bytes:
    """The syscall filter's program every sandbox of this process loads (S12), built once; a host whose
    libseccomp is missing or builds other bytes than the shipped digest gets a sentence, never a sandbox."""
    try:
        return seccomp.shipped_program()
    except seccomp.FilterError as error:
        raise SandboxFailure(str(error)) from None


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
        if sha256_of_fd(fd, hashlib.sha256) != digest:
            raise Refused(shown, "does not match the shipped launcher's SHA-256")
    except BaseException:
        os.close(fd)
        raise
    return fd
