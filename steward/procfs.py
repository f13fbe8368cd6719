"""Process identities from the host's procfs (C1): (pid, start time, pgid), and pid translation."""

from __future__ import annotations

import dataclasses
import os


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


def identity(pid: int) -> Identity:
    with open(f"/proc/{pid}/stat") as file:
        ppid, pgid, starttime = parse_stat(file.read())
    return Identity(pid, starttime, pgid, ppid)


def namespace_pids(pid: int) -> list[int]:
    """The NSpid line of /proc/PID/status: this pid in each pid namespace, outermost first."""
    with open(f"/proc/{pid}/status") as file:
        for line in file:
            if line.startswith("NSpid:"):
                return [int(item) for item in line.split()[1:]]
    raise OSError(f"/proc/{pid}/status has no NSpid line")


def children(pid: int) -> list[int]:
    """Host pids of the children of every thread of ``pid``."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as file:
            found.extend(int(item) for item in file.read().split())
    return found


def host_pid_of_child(parent: int, inner_pid: int) -> int:
    """The host pid of ``parent``'s child whose pid in its own (innermost) namespace is ``inner_pid``."""
    for child in children(parent):
        if namespace_pids(child)[-1] == inner_pid:
            return child
    raise LookupError(f"process {parent} has no child that is pid {inner_pid} in its namespace")
