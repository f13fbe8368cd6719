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
  At teardown (and in recovery, for a cgroup a killed starter left)
  ``cgroup.kill`` ends whatever is still in the sandbox's cgroup before the
  directories are removed.
- cgroup v1 (separate memory and pids hierarchies): a child of the starter's
  own cgroup in each hierarchy, so any limit already on the starter still
  applies, with ``ops`` under the memory one. Writing ``0`` to ``tasks``
  moves the writing thread alone, which the kernel does without the global
  lock a process move waits on (an RCU grace period, about 10 ms).
  ``memory.kmem.tcp.limit_in_bytes`` makes v1 charge TCP buffers too; a
  socket at that cap is refused more buffer without a failure being counted
  (recent kernels keep no failcnt for it), so its high-water mark, reset
  before each op, says whether an op reached it.

Each op's memory high-water mark (its receipt's ``memory_peak_bytes``) is the
``ops`` cgroup's, reset to the current usage before the op: v1's
``memory.max_usage_in_bytes`` (a write resets it), v2's ``memory.peak``
(kernel 5.19 and later; from 6.12 a write resets it for reads through the
same descriptor, which the starter holds open). On 5.19 to 6.11 it cannot be
reset, so it is the peak since the sandbox began (a case sandbox runs one
op); before 5.19 there is none and the peak is null. Pages an earlier op left
charged (its files in ``/tmp`` and ``/work``) count in the next op's peak.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import time

REQUIRED = ("memory", "pids")
_REMOVE_ATTEMPTS = 50
# A killed process leaves its cgroup once the kernel has torn it down: under emulation that takes seconds.
_EMPTY_ATTEMPTS = 1000


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


def _counter(text: str, key: str, shown: str) -> int:
    """The value of ``key`` in a flat-keyed cgroup file (``memory.events``, ``pids.events``, ``memory.oom_control``)."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    raise OSError(errno.ENODATA, f"{shown} has no {key} counter")


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


# Each counter read: (directory attribute, file, key in the file or None for a lone number). v1 files that
# not every kernel has (swap and TCP accounting) are read where they exist.
_V2_COUNTERS = {
    # The sandbox's memory.events counts every OOM kill below it, pid 1's leaf included.
    "oom_kills": (("top", "memory.events", "oom_kill"),),
    "memory_failures": (("ops", "memory.events", "max"),),
    # Kernels up to 6.12 count a refused fork in the forking task's own cgroup (init or ops), later ones in the
    # cgroup at its limit: the sum over the three counts it once either way.
    "pids_refused": (("pids", "pids.events", "max"), ("init", "pids.events", "max"), ("ops", "pids.events", "max")),
}
_V1_COUNTERS = {
    "oom_kills": (("top", "memory.oom_control", "oom_kill"), ("ops", "memory.oom_control", "oom_kill")),
    "memory_failures": (("ops", "memory.failcnt", None), ("ops", "memory.memsw.failcnt", None), ("ops", "memory.kmem.tcp.failcnt", None)),
    "pids_refused": (("pids", "pids.events", "max"),),
}
_V1_TCP_PEAK = "memory.kmem.tcp.max_usage_in_bytes"
_MEMORY_PEAK = {1: "memory.max_usage_in_bytes", 2: "memory.peak"}
_V1_TCP_CAP = "memory.kmem.tcp.limit_in_bytes"


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
    # The counter files, opened once: a pread costs a tenth of an open and a read, twice per op.
    counter_files: dict = dataclasses.field(default_factory=dict)
    tcp_cap: int = 0
    # The ops cgroup's memory high-water mark, opened once for reading and, where the kernel lets a write
    # reset it, for writing: on v2 the reset holds only for reads through the descriptor that wrote.
    peak_fd: int = -1
    peak_resets: bool = False

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
                for cap in ("memory.memsw.limit_in_bytes", _V1_TCP_CAP):
                    if os.path.exists(os.path.join(group.ops, cap)):
                        _write(os.path.join(group.ops, cap), str(memory_bytes))
                if os.path.exists(os.path.join(group.ops, _V1_TCP_PEAK)):
                    with open(os.path.join(group.ops, _V1_TCP_CAP)) as file:
                        group.tcp_cap = int(file.read())  # as the kernel rounded it
            _write(os.path.join(group.pids, "pids.max"), str(pids_max))
            group._open_counters()
        except BaseException:
            group.remove()
            raise
        return group

    def _make(self, directory: str) -> str:
        os.mkdir(directory, 0o755)
        self.directories += (directory,)
        return directory

    def attach(self, pid: int) -> None:
        """v1: move process ``pid`` (stage 1, still blocked) into the sandbox's cgroups, so pid 1, its clone,
        is born there. v2 needs no move: pid 1 is cloned into :meth:`open_birthplace`."""
        for directory in self.sandbox:
            _write(os.path.join(directory, "cgroup.procs"), str(pid))

    def open_birthplace(self) -> int | None:
        """v2: a descriptor of the sandbox's init cgroup, for stage 1 to clone pid 1 into (CLONE_INTO_CGROUP);
        None on v1, whose hierarchies that clone cannot name."""
        if self.hierarchy.version != 2:
            return None
        return os.open(self.sandbox[0], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)

    def open_ops(self) -> int:
        """A write-only descriptor of the ops cgroup's process file, for pid 1 (an op writes ``0`` into it)."""
        name = "cgroup.procs" if self.hierarchy.version == 2 else "tasks"
        return os.open(os.path.join(self.ops, name), os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)

    def _open_counters(self) -> None:
        places = {"top": os.path.dirname(self.ops), "ops": self.ops, "pids": self.pids, "init": self.sandbox[0]}
        table = _V2_COUNTERS if self.hierarchy.version == 2 else _V1_COUNTERS
        reads = [read for reads in table.values() for read in reads]
        if self.tcp_cap:
            reads.append(("ops", _V1_TCP_PEAK, None))
        for place, name, _ in reads:
            path = os.path.join(places[place], name)
            if (place, name) not in self.counter_files and (self.hierarchy.version == 2 or os.path.exists(path)):
                self.counter_files[(place, name)] = (os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW), path)
        self._open_peak(os.path.join(self.ops, _MEMORY_PEAK[self.hierarchy.version]))

    def _open_peak(self, path: str) -> None:
        """Open the ops cgroup's high-water mark: read-write where a write resets it, read-only on v2 kernels
        5.19 to 6.11, and not at all where the kernel keeps none (v2 before 5.19). Whether a write resets it is
        learnt by writing once, here: root may open the read-only file of 6.1 for writing, and only the write
        fails (EINVAL, measured in the platform-check guest), so the open's success proves nothing."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            return
        except PermissionError:
            pass
        else:
            try:
                os.pwrite(fd, b"0", 0)
            except OSError:
                os.close(fd)
            else:
                self.peak_fd, self.peak_resets = fd, True
                return
        self.peak_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)

    def _read(self, place: str, name: str, key: str | None) -> int:
        found = self.counter_files.get((place, name))
        if found is None:
            return 0  # a v1 counter this kernel does not keep
        fd, path = found
        text = os.pread(fd, 4096, 0).decode("ascii")
        return int(text) if key is None else _counter(text, key, path)

    def reset_peaks(self) -> None:
        """Before an op: the memory high-water mark and v1's TCP one back to the current usage (v2 counts
        every refused charge, so it needs no TCP mark)."""
        if self.peak_resets:
            os.pwrite(self.peak_fd, b"0", 0)
        if self.tcp_cap:
            _write(os.path.join(self.ops, _V1_TCP_PEAK), "0")

    def memory_peak(self) -> int | None:
        """The ops cgroup's memory high-water mark in bytes since the last reset (or since it was made, where
        the kernel cannot reset it); None where the kernel keeps none."""
        if self.peak_fd < 0:
            return None
        return int(os.pread(self.peak_fd, 64, 0))

    def counters(self) -> Counters:
        table = _V2_COUNTERS if self.hierarchy.version == 2 else _V1_COUNTERS
        found = {field: sum(self._read(*read) for read in reads) for field, reads in table.items()}
        if self.tcp_cap and self._read("ops", _V1_TCP_PEAK, None) >= self.tcp_cap:
            found["memory_failures"] += 1
        return Counters(**found)

    def remove(self) -> None:
        """Close the counter files, kill whatever is left in the sandbox's cgroup (v2), then rmdir each
        directory, children first; a cgroup stays busy for a moment after its last task is reaped."""
        for fd, _ in self.counter_files.values():
            os.close(fd)
        self.counter_files = {}
        if self.peak_fd >= 0:
            os.close(self.peak_fd)
            self.peak_fd = -1
        if self.hierarchy.version == 2 and self.ops:
            kill_all(os.path.dirname(self.ops))
        for directory in reversed(self.directories):
            remove_directory(directory)


def kill_all(directory: str) -> None:
    """cgroup v2: SIGKILL every process in ``directory`` and below at once (``cgroup.kill``, which no process
    can outrun by forking), then wait until ``cgroup.events`` says it is no longer populated. Kernels before
    5.14 have no ``cgroup.kill``; there the processes must already be gone, and rmdir says if they are not."""
    kill = os.path.join(directory, "cgroup.kill")
    if not os.path.exists(kill):
        return
    _write(kill, "1")
    for _ in range(_EMPTY_ATTEMPTS):
        with open(os.path.join(directory, "cgroup.events")) as file:
            if "populated 0" in file.read().splitlines():
                return
        time.sleep(0.01)


def sandbox_name(sandbox_id: str) -> str:
    """A sandbox's cgroup directory name: ``casebox-<stage>-<n>...``, so every cgroup of a stage is found by
    its stage id alone (recovery, the cleanup's inventory)."""
    return f"casebox-{sandbox_id}"


def stage_directories(stage_id: str) -> list[str]:
    """Every sandbox cgroup of ``stage_id`` that still exists on this host, sorted."""
    hierarchy = detect()
    found = []
    for directory in sorted({hierarchy.memory_dir, hierarchy.pids_dir} if hierarchy else ()):
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            continue
        found += [os.path.join(directory, name) for name in names if name.startswith(sandbox_name(f"{stage_id}-"))]
    return sorted(found)


def populated(directory: str) -> bool:
    """Whether any process is in the cgroup ``directory`` or below it (a cgroup that went meanwhile holds none):
    v2's ``cgroup.events`` counts the whole subtree; v1 keeps no such count, so each ``cgroup.procs`` is read."""
    try:
        with open(os.path.join(directory, "cgroup.events")) as file:
            return "populated 1" in file.read().splitlines()
    except FileNotFoundError:
        pass
    for place, _, _ in os.walk(directory):
        try:
            with open(os.path.join(place, "cgroup.procs")) as file:
                if file.read().strip():
                    return True
        except FileNotFoundError:
            continue
    return False


def remove_sandbox_directory(directory: str) -> None:
    """rmdir a sandbox's cgroup a killed starter left (recovery): what still runs in it killed (v2), then its
    ``ops`` and ``init`` children first."""
    kill_all(directory)
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
