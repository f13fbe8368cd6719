"""The runtime: the interpreter the cases run on, the installer wheel, and their inventory digest (docs/pipeline.md).

The **case runtime** is the interpreter every case, the resolver, the fetch
and pip run on. By default it is an interpreter under ``/usr`` (a sandbox
always sees the host's ``/usr`` read-only): the one casebox itself runs on
when its real path lies there, else the real path of ``/usr/bin/python3``.
``verify --python PATH`` selects another: PATH's real interpreter, CPython
3.9 or later, such as the one a CI job's ``actions/setup-python`` installed
under ``/opt/hostedtoolcache``. When its installation prefix
(``sys.base_prefix``) lies outside ``/usr``, that prefix is a directory
capability: it passes F4 and every sandbox sees it read-only at the same
absolute path (toolcache builds have their prefix compiled in).

casebox's own extractor keeps running on the **tools interpreter**, the
``/usr`` one, which must be 3.11 or later.

The installer is pip, run from its wheel (unpacked in the sandbox that runs
it, executor/inside.py), never from the network, and chosen deliberately:
the wheel named by ``verify --installer``, else the newest pip wheel the
case runtime bundles (``<stdlib>/ensurepip/_bundled/``, ``<stdlib>/ensurepip/``
or Debian's ``/usr/share/python-wheels/``). A ``pip-*.whl`` in the index is
just another wheel there: it never becomes the installer. pip resolves as
well as installs (its own resolver, with ``--dry-run --report``), so it must
be 22.2 or later.

The case runtime's search path without site (``sys.path`` of ``python -I
-S``: the standard library's zip, directory and extension modules) and its
standard-library module names are asked of the interpreter too: a case's
search path starts with the former (E7), and a candidate module named like
one of the latter is refused.

The runtime inventory (docs/pipeline.md) is a canonical JSON document naming
the interpreter (real path, size, SHA-256, implementation, version, cache
tag), its tree (the standard library directory of a ``/usr`` runtime, or
the whole prefix of a mounted one: every regular file and symlink below it,
except bytecode caches, ``site-packages``, ``dist-packages`` and
``config-*``) and the installer wheel. Its digest, ``sha256:`` and 64 hex,
binds every receipt (E1). It is computed on the trusted side by reading files
as data, on a thread of its own while the session's first sandboxes run; the
interpreter is run only to ask what it is. Before the stage retires, the tree
is listed again (:meth:`Runtime.changed`): any file or directory added,
removed or touched since the inventory began makes the attempt UNVERIFIED.
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
import threading

from executor.environ import trusted_env
from executor.cli.frontend import InternalFailure
from journal.errors import Refused
from journal.files import read_evidence
from journal.strictjson import canonical
from launcher.rendezvous import is_mount_target

SCHEMA = "casebox.runtime-inventory.v2"
FALLBACK = "/usr/bin/python3"
# casebox's own sandboxed extractor runs on the /usr interpreter; the cases, the resolver, the fetch and pip on
# the case runtime, for which CPython 3.9 is the oldest supported (the resolver and fetch tools run there too).
TOOLS_MINIMUM = (3, 11)
CASE_MINIMUM = (3, 9)
IMPLEMENTATIONS = ("cpython",)
CAPABILITY = "runtime"
SKIPPED = ("__pycache__", "site-packages", "dist-packages")
DEBIAN_WHEELS = "/usr/share/python-wheels"
INSTALLER = re.compile(r"pip-([0-9]+(?:\.[0-9]+){1,2})-py3-none-any\.whl\Z")
# The first pip with ``install --dry-run --report``, which the resolver runs.
INSTALLER_MINIMUM = (22, 2)
# A pip wheel is a few MiB; the cap bounds what an index can make the trusted side read into memory.
INSTALLER_MAX_BYTES = 64 << 20
# What an interpreter says of itself. sys.stdlib_module_names is 3.10's; on 3.9 the names are read off its
# standard library directory and its built-in modules.
_QUERY = """
import json, os, sys, sysconfig
stdlib = sysconfig.get_path("stdlib")
names = getattr(sys, "stdlib_module_names", None)
if names is None:
    names = set(sys.builtin_module_names)
    for place in (stdlib, os.path.join(stdlib, "lib-dynload")):
        for name in os.listdir(place) if os.path.isdir(place) else ():
            if name.endswith(".py"):
                names.add(name[:-3])
            elif name.endswith(".so"):
                names.add(name.split(".")[0])
            elif os.path.isdir(os.path.join(place, name)) and name not in ("site-packages", "__pycache__", "lib-dynload"):
                names.add(name)
print(json.dumps({
    "version": "%d.%d.%d" % sys.version_info[:3], "implementation": sys.implementation.name,
    "cache_tag": sys.implementation.cache_tag, "stdlib": stdlib, "prefix": sys.base_prefix,
    "executable": os.path.realpath(sys.executable), "path": [entry for entry in sys.path if entry],
    "modules": sorted(names),
}))
"""
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


class Inventory:
    """A runtime's inventory document. Its tree is read on a thread of its own: :meth:`document` waits for it;
    :meth:`changed` lists the tree again (names and ``stat``, no reading) and says what differs from when the
    inventory began."""

    def __init__(self, head: dict, tree: str, *, mounted: bool) -> None:
        self.head, self.tree, self.mounted = head, tree, mounted
        self._result: tuple[dict, list] | None = None
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="casebox-runtime-inventory", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            snapshot = tree_snapshot(self.tree)
            self._result = (tree_inventory(self.tree), snapshot)
        except BaseException as error:
            self._failure = error

    def _wait(self) -> tuple[dict, list]:
        self._thread.join()
        if self._failure is not None:
            if isinstance(self._failure, OSError):
                raise InternalFailure(f"the runtime's tree {self.tree} cannot be read ({self._failure}).")
            raise self._failure
        return self._result

    def document(self) -> dict:
        return {**self.head, "tree": {**self._wait()[0], "mounted": self.mounted}}

    def changed(self) -> str | None:
        """None when the tree is as it was when its inventory began, else one sentence saying what changed."""
        before = self._wait()[1]
        try:
            after = tree_snapshot(self.tree)
        except OSError as error:
            return f"the runtime's tree {self.tree} can no longer be listed ({os.strerror(error.errno)})"
        if after == before:
            return None
        old, new = dict(before), dict(after)
        difference = sorted(set(old) ^ set(new)) or sorted(path for path in old if old[path] != new[path])
        return f"the runtime's tree {self.tree} changed during the attempt (first at {difference[0] or '.'})"


@dataclasses.dataclass(frozen=True)
class Runtime:
    """The case runtime: its interpreter, installer and inventory, what it says of its stdlib, and the
    interpreter casebox's extractor runs on."""

    interpreter: str
    version: str
    installer: Installer
    inventory: Inventory | dict
    # sys.path of ``python -I -S``: where the standard library is found, first on every case's search path (E7).
    stdlib_path: tuple[str, ...] = ()
    # The standard library's module names: no candidate module may take one of these names.
    stdlib_modules: frozenset[str] = frozenset()
    implementation: str = "cpython"
    # The interpreter under /usr casebox's own extractor runs on (3.11 or later); the case runtime when that is one.
    tools_interpreter: str = ""
    # The installation prefix mounted at its own path in every sandbox, or None for a runtime under /usr.
    prefix: str | None = None

    def __post_init__(self) -> None:
        if not self.tools_interpreter:
            object.__setattr__(self, "tools_interpreter", self.interpreter)

    @property
    def document(self) -> dict:
        return self.inventory.document() if isinstance(self.inventory, Inventory) else self.inventory

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(canonical(self.document)).hexdigest()

    @property
    def capabilities(self) -> tuple[str, ...]:
        """The capability names every sandbox reads: the prefix of a runtime outside /usr."""
        return () if self.prefix is None else (CAPABILITY,)

    @property
    def label(self) -> str:
        """What a report prints: ``cpython 3.12.1 at /path/to/python3.12``."""
        return f"{self.implementation} {self.version} at {self.interpreter}"

    def changed(self) -> str | None:
        """Why the runtime is not what it was when the attempt began, or None (docs/pipeline.md, "The runtime")."""
        return self.inventory.changed() if isinstance(self.inventory, Inventory) else None


def choose_interpreter(running: str = sys.executable) -> str:
    """The real path of the /usr runtime: casebox's own interpreter when it lies under /usr, else /usr/bin/python3's."""
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


def _query(interpreter: str, where: str) -> dict:
    try:
        answer = subprocess.run(
            [interpreter, "-I", "-S", "-c", _QUERY], env=trusted_env(), stdin=subprocess.DEVNULL,
            capture_output=True, timeout=20, check=True,
        )
        values = json.loads(answer.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as error:
        raise Refused(where, f"{interpreter} could not say what it is: it is not a Python interpreter casebox can use ({error})") from None
    return values


def _version(values: dict) -> tuple[int, ...]:
    return tuple(int(part) for part in values["version"].split("."))


def tools_interpreter() -> tuple[str, dict]:
    """The /usr interpreter casebox's extractor runs on, and what it says of itself."""
    interpreter = choose_interpreter()
    values = _query(interpreter, "the runtime")
    if _version(values)[:2] < TOOLS_MINIMUM:
        raise InternalFailure(
            f"the runtime {interpreter} is Python {values['version']}; the sandbox needs 3.11 or later under /usr "
            "(on Ubuntu 22.04: apt-get install python3.11)."
        )
    return interpreter, values


def case_interpreter(path: str) -> tuple[str, dict]:
    """The interpreter ``verify --python PATH`` names: its real path, CPython 3.9 or later, and what it says."""
    real = os.path.realpath(path)
    if not os.path.isfile(real) or not os.access(real, os.X_OK):
        raise Refused("--python", f"{path} is not an executable file")
    values = _query(real, "--python")
    if values.get("implementation") not in IMPLEMENTATIONS or _version(values)[:2] < CASE_MINIMUM:
        raise Refused(
            "--python", f"{path} is {values.get('implementation')} {values.get('version')}; casebox runs cases on "
            f"CPython {'.'.join(map(str, CASE_MINIMUM))} or later",
        )
    return real, values


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


def tree_inventory(path: str) -> dict:
    """The tree below ``path``: its file count, bytes and the SHA-256 of its canonical listing."""
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


def _snapshot(directory_fd: int, relative: str, found: list) -> None:
    with os.scandir(directory_fd) as listing:
        entries = sorted(listing, key=lambda entry: entry.name)
    for entry in entries:
        path = f"{relative}/{entry.name}" if relative else entry.name
        info = entry.stat(follow_symlinks=False)
        found.append((path, (info.st_mode, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)))
        if entry.is_dir(follow_symlinks=False) and entry.name not in SKIPPED and not entry.name.startswith("config-"):
            child = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory_fd)
            try:
                _snapshot(child, path, found)
            finally:
                os.close(child)


def tree_snapshot(path: str) -> list:
    """Every entry the inventory of ``path`` covers, with its mode, inode, size and times: a change of any
    (the change time included, which no one but root can set back) is a change of the tree."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        found = [("", (info.st_mode, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns))]
        _snapshot(fd, "", found)
    finally:
        os.close(fd)
    return found


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


def bundled_installer(stdlib: str, prefix: str | None = None) -> Installer:
    """The newest pip wheel the runtime bundles, read whole."""
    places = [os.path.join(stdlib, "ensurepip", "_bundled"), os.path.join(stdlib, "ensurepip")]
    if prefix in (None, "/usr"):
        places.append(DEBIAN_WHEELS)
    for path in places:
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


def inspect(installer_path: str | None = None, python: str | None = None) -> Runtime:
    """The case runtime (``python``, else the /usr one), with its installer (the one named, else the runtime's
    own) and its inventory, whose tree is read on a thread of its own."""
    tools, tools_values = tools_interpreter()
    interpreter, values = (tools, tools_values) if python is None else case_interpreter(python)
    prefix = None if values["prefix"] == "/usr" or values["prefix"].startswith("/usr/") else values["prefix"]
    if prefix is not None and not is_mount_target(prefix):
        raise Refused(
            "--python", f"{python} is installed in {prefix}, which a sandbox cannot see at the same path (an absolute "
            "path of printable ASCII without spaces or quotes, at most 16 segments, outside /usr, /cap, /out, /proc, "
            "/dev, /tmp, /work, /etc, /bin and /lib)",
        )
    if prefix is not None and not (interpreter + "/").startswith(prefix.rstrip("/") + "/"):
        raise Refused("--python", f"{python} resolves to {interpreter}, outside its own installation {prefix}")
    installer = bundled_installer(values["stdlib"], values["prefix"]) if installer_path is None else chosen_installer(installer_path)
    directory, name = os.path.split(interpreter)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        binary = _file_entry(fd, name, interpreter)
    finally:
        os.close(fd)
    head = {
        "schema": SCHEMA,
        "interpreter": {
            "path": interpreter,
            "size": binary["size"],
            "sha256": binary["sha256"],
            "implementation": values["implementation"],
            "version": values["version"],
            "cache_tag": values["cache_tag"],
        },
        "installer": installer.as_dict(),
    }
    return Runtime(
        interpreter, values["version"], installer, Inventory(head, prefix or values["stdlib"], mounted=prefix is not None),
        stdlib_path=tuple(values["path"]), stdlib_modules=frozenset(values["modules"]),
        implementation=values["implementation"], tools_interpreter=tools, prefix=prefix,
    )
