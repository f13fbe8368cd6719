"""Per-sandbox cgroups: the memory and process caps, and the counters that name the MEMORY and PIDS classes.

Memory is the cgroup's (S14): no address-space rlimit stands in for it, so a
host without the memory and pids controllers gets no sandbox. Each sandbox
gets its own cgroup, and its ops a child cgroup of their own, ``ops``, which
alone carries the memory cap: an op's memory (its tmpfs pages too) is charged
there and the OOM killer there chooses among the op's processes only, never
pid 1, whose own allocations stay outside the cap. Each op joins ``ops`` before
it execs by writing ``0`` into a descriptor of the cgroup's process file that
the starter opened and pid 1 holds (launcher/ops.py). The starter reads the
counters before and after every op: the OOM kills and the failed charges at
the cap (``oom_kill`` and ``memory.failcnt`` / ``max``) and the forks refused
at ``pids.max``.

- cgroup v2 (Ubuntu CI runners): ``<root>/casebox/<sandbox>`` with the memory
  and pids controllers enabled down that path; pid 1 (and stage 1 before it)
  in its leaf ``init``, the ops in ``ops`` (no process may sit in a cgroup
  whose children have controllers). ``memory.max`` charges socket buffers.
- cgroup v1 (separate memory and pids hierarchies): a child of the starter's
  own cgroup in each hierarchy, so any limit already on the starter still
  applies, with ``ops`` under the memory one. Writing ``0`` to ``tasks``
  moves the writing thread alone, which the kernel does without the global
  lock a process move waits on (an RCU grace period, about 10 ms).
  ``memory.kmem.tcp.limit_in_bytes`` makes v1 charge TCP buffers too; a
  socket at that cap is refused more buffer without a failure being counted
  (recent kernels keep no failcnt for it), so its high-water mark, reset
  before each op, says whether an op reached it.
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


OPS = "ops"
INIT = "init"


@dataclasses.dataclass(frozen=True)
class Counters:
    """What the kernel counted in a sandbox's cgroups so far."""

    oom_kills: int
    memory_failures: int
    pids_refused: int


def _counter_if_present(path: str, key: str | None = None) -> int:
    """A counter file that not every kernel has (v1 swap and TCP accounting): 0 when it is absent."""
    if not os.path.exists(path):
        return 0
    return _counter(path, key) if key else _number(path)


def _number(path: str) -> int:
    with open(path) as file:
        return int(file.read())


@dataclasses.dataclass
class SandboxCgroup:
    """One sandbox's cgroups: caps in, counters out, removed at teardown.

    ``directories`` lists every directory made, parents before children;
    ``sandbox`` is where stage 1 (and so pid 1) is placed, ``ops`` where every
    op is, ``pids`` where ``pids.max`` is.
    """

    hierarchy: Hierarchy
    directories: tuple[str, ...]
    sandbox: tuple[str, ...] = ()
    ops: str = ""
    pids: str = ""

    @classmethod
    def create(cls, hierarchy: Hierarchy, name: str, *, memory_bytes: int, pids_max: int) -> "SandboxCgroup":
        """Make the cgroups with their caps; nothing is left behind if a step fails."""
        group = cls(hierarchy, ())
        try:
            if hierarchy.version == 2:
                _enable(os.path.dirname(hierarchy.memory_dir))
                os.makedirs(hierarchy.memory_dir, mode=0o755, exist_ok=True)
                _enable(hierarchy.memory_dir)
                top = group._make(os.path.join(hierarchy.memory_dir, name))
                _enable(top)
                group.sandbox = (group._make(os.path.join(top, INIT)),)
                group.ops = group._make(os.path.join(top, OPS))
                group.pids = top
                _write(os.path.join(group.ops, "memory.max"), str(memory_bytes))
                if os.path.exists(os.path.join(group.ops, "memory.swap.max")):
                    _write(os.path.join(group.ops, "memory.swap.max"), "0")
            else:
                memory = group._make(os.path.join(hierarchy.memory_dir, name))
                group.pids = group._make(os.path.join(hierarchy.pids_dir, name))
                group.sandbox = (memory, group.pids)
                group.ops = group._make(os.path.join(memory, OPS))
                _write(os.path.join(group.ops, "memory.limit_in_bytes"), str(memory_bytes))
                for cap in ("memory.memsw.limit_in_bytes", "memory.kmem.tcp.limit_in_bytes"):
                    if os.path.exists(os.path.join(group.ops, cap)):
                        _write(os.path.join(group.ops, cap), str(memory_bytes))
            _write(os.path.join(group.pids, "pids.max"), str(pids_max))
        except BaseException:
            group.remove()
            raise
        return group

    def _make(self, directory: str) -> str:
        os.mkdir(directory, 0o755)
        self.directories += (directory,)
        return directory

    def attach(self, pid: int) -> None:
        """Move process ``pid`` (stage 1, still blocked) into the sandbox's cgroup."""
        for directory in self.sandbox:
            _write(os.path.join(directory, "cgroup.procs"), str(pid))

    def open_ops(self) -> int:
        """A write-only descriptor of the ops cgroup's process file, for pid 1 (an op writes ``0`` into it)."""
        name = "cgroup.procs" if self.hierarchy.version == 2 else "tasks"
        return os.open(os.path.join(self.ops, name), os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)

    def reset_peaks(self) -> None:
        """Before an op: v1's TCP high-water mark back to the current usage (v2 counts every refused charge)."""
        if self.hierarchy.version == 1 and os.path.exists(os.path.join(self.ops, "memory.kmem.tcp.max_usage_in_bytes")):
            _write(os.path.join(self.ops, "memory.kmem.tcp.max_usage_in_bytes"), "0")

    def _tcp_cap_reached(self) -> int:
        peak = os.path.join(self.ops, "memory.kmem.tcp.max_usage_in_bytes")
        if not os.path.exists(peak):
            return 0
        return int(_number(peak) >= _number(os.path.join(self.ops, "memory.kmem.tcp.limit_in_bytes")))

    def counters(self) -> Counters:
        if self.hierarchy.version == 2:
            events = os.path.join(self.ops, "memory.events")
            return Counters(
                # The sandbox's memory.events counts every OOM kill below it, pid 1's leaf included.
                oom_kills=_counter(os.path.join(os.path.dirname(self.ops), "memory.events"), "oom_kill"),
                memory_failures=_counter(events, "max"),
                pids_refused=_counter(os.path.join(self.pids, "pids.events"), "max"),
            )
        sandbox = self.sandbox[0]
        return Counters(
            oom_kills=sum(_counter(os.path.join(directory, "memory.oom_control"), "oom_kill") for directory in (sandbox, self.ops)),
            memory_failures=self._tcp_cap_reached() + sum(
                _counter_if_present(os.path.join(self.ops, name))
                for name in ("memory.failcnt", "memory.memsw.failcnt", "memory.kmem.tcp.failcnt")
            ),
            pids_refused=_counter(os.path.join(self.pids, "pids.events"), "max"),
        )

    def remove(self) -> None:
        """rmdir each directory, children first; a cgroup stays busy for a moment after its last task is reaped."""
        for directory in reversed(self.directories):
            remove_directory(directory)


def remove_sandbox_directory(directory: str) -> None:
    """rmdir a sandbox's cgroup a killed starter left (recovery): its ``ops`` and ``init`` children first."""
    for child in (OPS, INIT):
        if os.path.isdir(os.path.join(directory, child)):
            remove_directory(os.path.join(directory, child))
    remove_directory(directory)


def remove_directory(directory: str) -> None:
    """rmdir one empty cgroup, retrying while the kernel still counts a task that was just reaped."""
    for attempt in range(_REMOVE_ATTEMPTS):
        try:
            os.rmdir(directory)
            return
        except FileNotFoundError:
            return
        except OSError as error:
            if error.errno != errno.EBUSY or attempt == _REMOVE_ATTEMPTS - 1:
                raise
            time.sleep(0.01)
