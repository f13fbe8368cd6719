"""Per-sandbox cgroups: where present, they observe the MEMORY and PIDS limit classes.

rlimits contain every sandbox on every host. A kernel counter is what makes a
limit class honest, and only cgroups have one: ``oom_kill`` in memory.events
(v2) or memory.oom_control (v1), and ``max`` in pids.events. So the starter,
on the host side, gives each sandbox its own cgroup when the memory and pids
controllers are available, sets memory and pids caps there, and reads the two
counters before and after every op. Without them those two classes are not
observed (docs/launcher.md, "Limit classes").

- cgroup v2 (Ubuntu CI runners): ``<root>/casebox/<sandbox>``; the memory and
  pids controllers are enabled down that path.
- cgroup v1 (separate memory and pids hierarchies): a child of the starter's
  own cgroup in each hierarchy, so any limit already on the starter still
  applies.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import time

REQUIRED = ("memory", "pids")
_REMOVE_ATTEMPTS = 50


@dataclasses.dataclass(frozen=True)
class Hierarchy:
    """Where the memory and pids controllers live on this host."""

    version: int
    memory_dir: str
    pids_dir: str

    def describe(self) -> str:
        if self.version == 2:
            return f"cgroup v2 at {self.memory_dir} with the memory and pids controllers"
        return f"cgroup v1 memory at {self.memory_dir} and pids at {self.pids_dir}"


def _mounts(mountinfo: str) -> list[tuple[str, str, str]]:
    """(mount point, filesystem type, super options) for each cgroup mount."""
    found = []
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        try:
            separator = fields.index("-")
        except ValueError:
            continue
        fstype, options = fields[separator + 1], fields[separator + 3] if len(fields) > separator + 3 else ""
        if fstype in ("cgroup", "cgroup2"):
            found.append((fields[4].replace("\\040", " "), fstype, options))
    return found


def _own_path(proc_cgroup: str, controller: str | None) -> str:
    for line in proc_cgroup.splitlines():
        number, controllers, path = line.split(":", 2)
        if controller is None and number == "0" and controllers == "":
            return path
        if controller is not None and controller in controllers.split(","):
            return path
    return "/"


def choose(mountinfo: str, proc_cgroup: str, controllers_of) -> Hierarchy | None:
    """The hierarchy to use, from mountinfo and /proc/self/cgroup text (pure but for ``controllers_of``)."""
    mounts = _mounts(mountinfo)
    for point, fstype, _ in mounts:
        if fstype == "cgroup2" and set(REQUIRED) <= set(controllers_of(point)):
            base = os.path.join(point, "casebox")
            return Hierarchy(2, base, base)
    v1 = {}
    for point, fstype, options in mounts:
        if fstype != "cgroup":
            continue
        for controller in REQUIRED:
            if controller in options.split(","):
                v1[controller] = os.path.normpath(point + _own_path(proc_cgroup, controller))
    if len(v1) == len(REQUIRED):
        return Hierarchy(1, v1["memory"], v1["pids"])
    return None


def _controllers_of(point: str) -> list[str]:
    try:
        with open(os.path.join(point, "cgroup.controllers")) as file:
            return file.read().split()
    except OSError:
        return []


def detect() -> Hierarchy | None:
    # A mount point is any bytes a directory name can hold; one that is not UTF-8 must not stop every sandbox.
    with open("/proc/self/mountinfo", errors="surrogateescape") as mountinfo, open("/proc/self/cgroup") as proc_cgroup:
        return choose(mountinfo.read(), proc_cgroup.read(), _controllers_of)


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _counter(path: str, key: str) -> int:
    with open(path) as file:
        for line in file:
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    raise OSError(errno.ENODATA, f"{path} has no {key} counter")


def _enable(parent: str) -> None:
    """Make the memory and pids controllers available to children of ``parent`` (v2)."""
    with open(os.path.join(parent, "cgroup.subtree_control")) as file:
        enabled = set(file.read().split())
    missing = [controller for controller in REQUIRED if controller not in enabled]
    if missing:
        _write(os.path.join(parent, "cgroup.subtree_control"), " ".join(f"+{name}" for name in missing))


@dataclasses.dataclass
class SandboxCgroup:
    """One sandbox's cgroup(s): caps in, counters out, removed at teardown."""

    hierarchy: Hierarchy
    directories: tuple[str, ...]

    @classmethod
    def create(cls, hierarchy: Hierarchy, name: str, *, memory_bytes: int, pids_max: int) -> "SandboxCgroup":
        """Make the cgroup(s) with their caps; nothing is left behind if a step fails."""
        group = cls(hierarchy, ())
        try:
            if hierarchy.version == 2:
                _enable(os.path.dirname(hierarchy.memory_dir))
                os.makedirs(hierarchy.memory_dir, mode=0o755, exist_ok=True)
                _enable(hierarchy.memory_dir)
                directory = group._make(os.path.join(hierarchy.memory_dir, name))
                _write(os.path.join(directory, "memory.max"), str(memory_bytes))
                if os.path.exists(os.path.join(directory, "memory.swap.max")):
                    _write(os.path.join(directory, "memory.swap.max"), "0")
                _write(os.path.join(directory, "pids.max"), str(pids_max))
            else:
                memory = group._make(os.path.join(hierarchy.memory_dir, name))
                pids = group._make(os.path.join(hierarchy.pids_dir, name))
                _write(os.path.join(memory, "memory.limit_in_bytes"), str(memory_bytes))
                if os.path.exists(os.path.join(memory, "memory.memsw.limit_in_bytes")):
                    _write(os.path.join(memory, "memory.memsw.limit_in_bytes"), str(memory_bytes))
                _write(os.path.join(pids, "pids.max"), str(pids_max))
        except BaseException:
            group.remove()
            raise
        return group

    def _make(self, directory: str) -> str:
        os.mkdir(directory, 0o755)
        self.directories += (directory,)
        return directory

    def attach(self, pid: int) -> None:
        for directory in self.directories:
            _write(os.path.join(directory, "cgroup.procs"), str(pid))

    def counters(self) -> tuple[int, int]:
        """(OOM kills, forks refused at pids.max) so far."""
        if self.hierarchy.version == 2:
            (directory,) = self.directories
            return (
                _counter(os.path.join(directory, "memory.events"), "oom_kill"),
                _counter(os.path.join(directory, "pids.events"), "max"),
            )
        memory, pids = self.directories
        return _counter(os.path.join(memory, "memory.oom_control"), "oom_kill"), _counter(os.path.join(pids, "pids.events"), "max")

    def remove(self) -> None:
        """rmdir each directory; a cgroup stays busy for a moment after its last task is reaped."""
        for directory in self.directories:
            for attempt in range(_REMOVE_ATTEMPTS):
                try:
                    os.rmdir(directory)
                    break
                except FileNotFoundError:
                    break
                except OSError as error:
                    if error.errno != errno.EBUSY or attempt == _REMOVE_ATTEMPTS - 1:
                        raise
                    time.sleep(0.01)
