"""Process identities from the host's procfs (C1): (pid, start time, pgid), and pid translation."""

from __future__ import annotations

import dataclasses
import errno
import os
from collections.abc import Callable, Iterator


@dataclasses.dataclass(frozen=True)
class Identity:
    pid: int
    starttime: int
    pgid: int
    ppid: int


def parse_stat(text: str) -> tuple[int, int, int]:
    """(ppid, pgid, starttime) from /proc/PID/stat; the command name may hold spaces and parentheses."""
    rest = text[text.rindex(")") + 2:].split()
    # rest[0] is field 3 (state): ppid is field 4, pgrp field 5, starttime field 22.
    return int(rest[1]), int(rest[2]), int(rest[19])


def _read(path: str, *, dir_fd: int | None = None) -> str:
    """A whole procfs file, read with plain reads (no buffered text layer: a scan reads hundreds)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    # A command name is the process's own bytes; parse_stat reads only what follows it.
    return b"".join(chunks).decode("utf-8", "replace")


def identity(pid: int) -> Identity:
    ppid, pgid, starttime = parse_stat(_read(f"/proc/{pid}/stat"))
    return Identity(pid, starttime, pgid, ppid)


def namespace_pids(pid: int) -> list[int]:
    """The NSpid line of /proc/PID/status: this pid in each pid namespace, outermost first."""
    for line in _read(f"/proc/{pid}/status").splitlines():
        if line.startswith("NSpid:"):
            return [int(item) for item in line.split()[1:]]
    raise OSError(f"/proc/{pid}/status has no NSpid line")


def children(pid: int) -> list[int]:
    """Host pids of the children of every thread of ``pid``.

    A thread may end between the listing and the read (the steward's
    forwarder threads come and go); it is skipped: those threads start no
    process, and a thread that ends hands its children to another thread of
    the group anyway.
    """
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as file:
                found.extend(int(item) for item in file.read().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def open_network_namespace(pid: int) -> int:
    """A descriptor of process ``pid``'s network namespace.

    The kernel lets a caller open it only with ptrace read access: the same
    credentials and a dumpable target, or CAP_SYS_PTRACE. So the steward
    opens a sandbox's while its pid 1 is still root's, before the drop.
    """
    return os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)


def shares_network_namespace(netns_fd: int) -> bool:
    """True when the network namespace ``netns_fd`` is this process's (S9: no sandbox's ever is)."""
    theirs, ours = os.fstat(netns_fd), os.stat("/proc/self/ns/net")
    return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)


def host_pid_of_child(parent: int, inner_pid: int) -> int:
    """The host pid of ``parent``'s child whose pid in its own (innermost) namespace is ``inner_pid``."""
    for child in children(parent):
        if namespace_pids(child)[-1] == inner_pid:
            return child
    raise LookupError(f"process {parent} has no child that is pid {inner_pid} in its namespace")


def _ended(error: OSError) -> bool:
    return error.errno in (errno.ESRCH, errno.ENOENT)


class ProcessHandle:
    """A ``/proc/<pid>`` directory descriptor opened when an identity is recorded (C2).

    The descriptor stays bound to that one process: once it has been reaped,
    reading through it fails with ESRCH even if the pid is reused, so a
    non-child is proved absent without any wait call and without trusting a
    pid number alone. ``close`` releases it.
    """

    def __init__(self, pid: int, starttime: int, fd: int) -> None:
        self.pid = pid
        self.starttime = starttime
        self._fd: int | None = fd

    @classmethod
    def open(cls, pid: int, starttime: int) -> "ProcessHandle":
        """Open the handle of ``pid`` and check that it is the process that started at ``starttime``."""
        fd = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        handle = cls(pid, starttime, fd)
        if handle.gone():
            handle.close()
            raise LookupError(f"process {pid} with start time {starttime} is not running")
        return handle

    def gone(self) -> bool:
        """True when the recorded process no longer exists (not even as a zombie)."""
        if self._fd is None:
            raise ValueError("the process handle is closed")
        try:
            text = _read("stat", dir_fd=self._fd)
        except OSError as error:
            if _ended(error):
                return True
            raise
        if not text:
            return True
        return parse_stat(text)[2] != self.starttime

    def set_oom_score(self, score: int) -> None:
        """Write ``score`` as the process's ``oom_score_adj`` through its own directory, so it reaches this process
        and no other. Written by a process holding CAP_SYS_RESOURCE, the score is also the floor below which the
        process, and whatever it forks, can never set its own again (proc(5))."""
        if self._fd is None:
            raise ValueError("the process handle is closed")
        fd = os.open("oom_score_adj", os.O_WRONLY | os.O_CLOEXEC, dir_fd=self._fd)
        try:
            os.write(fd, str(score).encode("ascii"))
        finally:
            os.close(fd)

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One process as a procfs scan saw it."""

    pid: int
    ppid: int
    pgid: int
    starttime: int
    state: str
    uids: tuple[int, ...]
    gids: tuple[int, ...]


def _ids(status: str, key: str) -> tuple[int, ...]:
    for line in status.splitlines():
        if line.startswith(key):
            return tuple(int(item) for item in line.split()[1:])
    return ()


def _each_process(read: Callable[[int, str], object]) -> Iterator[tuple[int, object]]:
    """(pid, ``read(proc_fd, PID)``) for every process, relative to one ``/proc`` descriptor; a process that
    ends meanwhile (or whose read gives None) is skipped."""
    proc_fd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in os.listdir(proc_fd):
            if not name.isdigit():
                continue
            try:
                found = read(proc_fd, name)
            except OSError as error:
                if _ended(error):
                    continue
                raise
            if found is not None:
                yield int(name), found
    finally:
        os.close(proc_fd)


def _stat_and_status(proc_fd: int, name: str) -> tuple[str, str] | None:
    """Both files read through a descriptor of the process's own ``/proc/PID`` directory, so they come from
    that one process."""
    pid_fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=proc_fd)
    try:
        texts = (_read("stat", dir_fd=pid_fd), _read("status", dir_fd=pid_fd))
    finally:
        os.close(pid_fd)
    return texts if all(texts) else None


def _stat(proc_fd: int, name: str) -> str | None:
    """One file needs no descriptor of its process's directory: ``PID/stat`` is opened under ``/proc`` itself
    (a third of a scan's system calls)."""
    return _read(f"{name}/stat", dir_fd=proc_fd) or None


def scan() -> list[Entry]:
    """Every process of the host (stat and status)."""
    found = []
    for pid, (stat_text, status_text) in _each_process(_stat_and_status):
        ppid, pgid, starttime = parse_stat(stat_text)
        state = stat_text[stat_text.rindex(")") + 2:].split(" ", 1)[0]
        found.append(Entry(pid, ppid, pgid, starttime, state, _ids(status_text, "Uid:"), _ids(status_text, "Gid:")))
    return sorted(found, key=lambda entry: entry.pid)


def group_members(pgid: int) -> list[int]:
    """Every host pid whose process group is ``pgid``, from a scan of stat alone."""
    return sorted(pid for pid, stat_text in _each_process(_stat) if parse_stat(stat_text)[1] == pgid)
