"""The runtime: the interpreter every sandboxed op runs on, the installer wheel, and their inventory digest.

A sandbox sees the host's ``/usr`` read-only and nothing else of the host
(docs/launcher.md), so the runtime is an interpreter under ``/usr``: the one
casebox itself runs on when its real path lies there, else the real path of
``/usr/bin/python3``. It must be Python 3.11 or later, because casebox's own
sandboxed tools (the extractor and the resolver) run on it.

The installer is pip, run from its wheel (unpacked in the sandbox that runs
it, executor/inside.py), never from the network, and chosen deliberately:
the wheel named by ``verify --installer`` (or the ``installer`` setting),
else the newest pip wheel the runtime bundles (``<stdlib>/ensurepip/_bundled/``,
``<stdlib>/ensurepip/`` or Debian's ``/usr/share/python-wheels/``). A
``pip-*.whl`` in the index is just another wheel there: it never becomes
the installer. pip resolves as well as installs (its own resolver, with
``--dry-run --report``), so it must be 22.2 or later.

The runtime's search path without site (``sys.path`` of ``python -I -S``:
the standard library's zip, directory and extension modules) and its
standard-library module names (``sys.stdlib_module_names``) are asked of the
interpreter too: a case's search path starts with the former (E7), and a
candidate module named like one of the latter is refused.

The runtime inventory (docs/pipeline.md) is a canonical JSON document naming
the interpreter (path, size, SHA-256, version, cache tag), the standard
library (every regular file and symlink below it, except bytecode caches,
``site-packages``, ``dist-packages`` and ``config-*``) and the installer
wheel (file name, SHA-256, where it came from). Its digest, ``sha256:`` and
64 hex, binds every receipt (E1). It is computed on the trusted side by
reading files as data; the interpreter is run only to ask its version.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import stat
import subprocess
import sys

from executor.environ import trusted_env
from executor.frontend import InternalFailure
from journal.errors import Refused
from journal.files import read_evidence
from journal.strictjson import canonical

SCHEMA = "casebox.runtime-inventory.v1"
FALLBACK = "/usr/bin/python3"
MINIMUM = (3, 11)
SKIPPED = ("__pycache__", "site-packages", "dist-packages")
DEBIAN_WHEELS = "/usr/share/python-wheels"
INSTALLER = re.compile(r"pip-([0-9]+(?:\.[0-9]+){1,2})-py3-none-any\.whl\Z")
# The first pip with ``install --dry-run --report``, which the resolver runs.
INSTALLER_MINIMUM = (22, 2)
# A pip wheel is a few MiB; the cap bounds what an index can make the trusted side read into memory.
INSTALLER_MAX_BYTES = 64 << 20
_QUERY = (
    "import json, sys, sysconfig; print(json.dumps({'version': '%d.%d.%d' % sys.version_info[:3], "
    "'cache_tag': sys.implementation.cache_tag, 'stdlib': sysconfig.get_path('stdlib'), "
    "'path': [entry for entry in sys.path if entry], 'modules': sorted(sys.stdlib_module_names)}))"
)
_CHUNK = 1 << 20


@dataclasses.dataclass(frozen=True)
class Installer:
    """The pip wheel every install and fetch op runs from: its file name, digest, and where it was found."""

    file: str
    sha256: str
    source: str
    data: bytes = dataclasses.field(repr=False)

    def as_dict(self) -> dict:
        return {"file": self.file, "sha256": self.sha256, "source": self.source}


@dataclasses.dataclass(frozen=True)
class Runtime:
    """The case runtime: its interpreter, installer and inventory document, and what it says of its stdlib."""

    interpreter: str
    version: str
    installer: Installer
    document: dict
    # sys.path of ``python -I -S``: where the standard library is found, first on every case's search path (E7).
    stdlib_path: tuple[str, ...] = ()
    # sys.stdlib_module_names: no candidate module may take one of these names.
    stdlib_modules: frozenset[str] = frozenset()

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(canonical(self.document)).hexdigest()


def choose_interpreter(running: str = sys.executable) -> str:
    """The real path of the runtime: casebox's own interpreter when it lies under /usr, else /usr/bin/python3's."""
    real = os.path.realpath(running)
    if real.startswith("/usr/"):
        return real
    real = os.path.realpath(FALLBACK)
    if not real.startswith("/usr/") or not os.access(real, os.X_OK):
        raise InternalFailure(
            f"no Python interpreter under /usr for the sandbox ({FALLBACK} resolves to {real}); "
            "install the distribution's python3 (3.11 or later)."
        )
    return real


def _query(interpreter: str) -> dict:
    try:
        answer = subprocess.run(
            [interpreter, "-I", "-S", "-c", _QUERY], env=trusted_env(), stdin=subprocess.DEVNULL,
            capture_output=True, timeout=20, check=True,
        )
        values = json.loads(answer.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as error:
        raise InternalFailure(f"the runtime {interpreter} could not report its version ({error}).") from None
    version = tuple(int(part) for part in values["version"].split("."))
    if version[:2] < MINIMUM:
        raise InternalFailure(
            f"the runtime {interpreter} is Python {values['version']}; the sandbox needs 3.11 or later under /usr "
            "(on Ubuntu 22.04: apt-get install python3.11)."
        )
    return values


def _file_entry(directory_fd: int, name: str, relative: str) -> dict:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory_fd)
    try:
        hasher, size = hashlib.sha256(), 0
        while chunk := os.read(fd, _CHUNK):
            hasher.update(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    return {"path": relative, "size": size, "sha256": hasher.hexdigest()}


def _walk(directory_fd: int, relative: str, entries: list[dict]) -> None:
    with os.scandir(directory_fd) as listing:
        found = sorted(listing, key=lambda entry: entry.name)
    for entry in found:
        path = f"{relative}/{entry.name}" if relative else entry.name
        if entry.is_symlink():
            entries.append({"path": path, "link": os.readlink(entry.name, dir_fd=directory_fd)})
        elif entry.is_dir(follow_symlinks=False):
            if entry.name in SKIPPED or entry.name.startswith("config-"):
                continue
            child = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory_fd)
            try:
                _walk(child, path, entries)
            finally:
                os.close(child)
        elif entry.is_file(follow_symlinks=False):
            entries.append(_file_entry(directory_fd, entry.name, path))


def stdlib_inventory(path: str) -> dict:
    """The standard library below ``path``: its file count, bytes and the SHA-256 of its canonical listing."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        entries: list[dict] = []
        _walk(fd, "", entries)
    finally:
        os.close(fd)
    entries.sort(key=lambda entry: entry["path"].encode("utf-8", "surrogateescape"))
    return {
        "path": path,
        "files": sum(1 for entry in entries if "sha256" in entry),
        "bytes": sum(entry.get("size", 0) for entry in entries),
        "sha256": hashlib.sha256(canonical(entries)).hexdigest(),
    }


def installer_version(name: str) -> tuple[int, ...] | None:
    """The version of a pip wheel named ``pip-X.Y[.Z]-py3-none-any.whl``, or None for any other name."""
    match = INSTALLER.match(name)
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


def _newest_installer(directory_fd: int) -> str | None:
    versions = []
    for name in os.listdir(directory_fd):
        version = installer_version(name)
        if version and stat.S_ISREG(os.stat(name, dir_fd=directory_fd, follow_symlinks=False).st_mode):
            versions.append((version, name))
    return max(versions)[1] if versions else None


def _read_installer(directory_fd: int, name: str, place: str) -> bytes:
    """The installer wheel's bytes: a regular file (no symlink, never blocking on a FIFO), within its cap."""
    data = read_evidence(directory_fd, name, INSTALLER_MAX_BYTES)
    if data is None:
        raise Refused(f"{place} {name}", "disappeared while the installer was chosen")
    if len(data) > INSTALLER_MAX_BYTES:
        raise Refused(f"{place} {name}", f"is larger than the {INSTALLER_MAX_BYTES}-byte cap of an installer wheel")
    return data


def _checked(name: str, data: bytes, source: str, where: str) -> Installer:
    if installer_version(name) < INSTALLER_MINIMUM:
        raise Refused(
            where, f"{name} is older than pip {'.'.join(map(str, INSTALLER_MINIMUM))}, the first with the "
            "`install --dry-run --report` that casebox resolves with",
        )
    return Installer(name, hashlib.sha256(data).hexdigest(), source, data)


def chosen_installer(path: str) -> Installer:
    """The pip wheel at ``path``, named by ``--installer``: a regular file called pip-X.Y[.Z]-py3-none-any.whl."""
    directory, name = os.path.split(path)
    if installer_version(name) is None:
        raise Refused("--installer", f"{path} is not named pip-X.Y[.Z]-py3-none-any.whl")
    fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        data = _read_installer(fd, name, "--installer")
    finally:
        os.close(fd)
    return _checked(name, data, "chosen", "--installer")


def bundled_installer(stdlib: str) -> Installer:
    """The newest pip wheel the runtime bundles, read whole."""
    for path in (os.path.join(stdlib, "ensurepip", "_bundled"), os.path.join(stdlib, "ensurepip"), DEBIAN_WHEELS):
        if not os.path.isdir(path):
            continue
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            name = _newest_installer(fd)
            if name is not None:
                return _checked(name, _read_installer(fd, name, path), "runtime", os.path.join(path, name))
        finally:
            os.close(fd)
    raise Refused(
        "--installer",
        "is not given and the runtime bundles no pip wheel (pip-X.Y-py3-none-any.whl); casebox resolves and installs "
        "with pip run from its wheel, never from the network: install the runtime's (python3-pip-whl on Debian and "
        "Ubuntu) or name one with --installer",
    )


def inspect(installer_path: str | None = None) -> Runtime:
    """The runtime this host hands to sandboxes, with its installer (the one named, else the runtime's) and inventory."""
    interpreter = choose_interpreter()
    values = _query(interpreter)
    installer = bundled_installer(values["stdlib"]) if installer_path is None else chosen_installer(installer_path)
    directory, name = os.path.split(interpreter)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        binary = _file_entry(fd, name, interpreter)
    finally:
        os.close(fd)
    document = {
        "schema": SCHEMA,
        "interpreter": {
            "path": interpreter,
            "size": binary["size"],
            "sha256": binary["sha256"],
            "version": values["version"],
            "cache_tag": values["cache_tag"],
        },
        "stdlib": stdlib_inventory(values["stdlib"]),
        "installer": installer.as_dict(),
    }
    return Runtime(
        interpreter, values["version"], installer, document,
        stdlib_path=tuple(values["path"]), stdlib_modules=frozenset(values["modules"]),
    )
