"""S6: the sandbox UID/GID is dedicated, so no live process may already use it."""

from __future__ import annotations

import os

from journal.errors import Refused
from steward.cgroups import sandbox_name


def processes_using(uid: int, gid: int) -> list[tuple[int, str]]:
    """(pid, name) of every live process whose real, effective or saved UID or GID is the pair's."""
    return processes_using_any([(uid, gid)])


def processes_using_any(pairs) -> list[tuple[int, str]]:
    """(pid, name) of every live process using any (uid, gid) of ``pairs`` (a sandbox pool), in one scan."""
    # Compared as the decimal text procfs shows, so a process costs one read and no int().
    wanted = {b"Uid": {str(uid).encode() for uid, _ in pairs}, b"Gid": {str(gid).encode() for _, gid in pairs}}
    found = []
    # One read of /proc/PID/status per process: a third of what psutil's iteration costs (it builds a
    # Process and reads stat too), and every sandbox pays it before its release.
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            status = _status(entry)
            if status is not None and _uses(status, wanted):
                found.append((int(entry), _name(status)))
    return found


_STATUS_BYTES = 4096  # Name, Uid and Gid are among its first ten lines, a few hundred bytes


def _status(pid: str) -> bytes | None:
    """The start of a process's /proc/PID/status, or None when the process is gone."""
    try:
        fd = os.open(f"/proc/{pid}/status", os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError):
        return None
    try:
        return os.read(fd, _STATUS_BYTES)
    except ProcessLookupError:
        return None
    finally:
        os.close(fd)


def _uses(status: bytes, wanted: dict[bytes, set[bytes]]) -> bool:
    """Whether the real, effective or saved id of a status line is wanted. A line that is not there or not
    four ids counts as a use: S6 fails closed."""
    for label, ids in wanted.items():
        start = status.find(b"\n" + label + b":")
        fields = status[start + len(label) + 2 : status.find(b"\n", start + 1)].split() if start >= 0 else []
        if len(fields) != 4 or not ids.isdisjoint(fields[:3]):
            return True
    return False


def _name(status: bytes) -> str:
    """The command name of the status's first line (``Name:\tsleep``); the kernel escapes it."""
    line = status.partition(b"\n")[0]
    return line.removeprefix(b"Name:").strip().decode("utf-8", "replace") or "?"


_PF_EXITING = 0x4  # include/linux/sched.h


def require_unused(uid: int, gid: int, *, beside: tuple[str, ...] = ()) -> None:
    """Refuse the session when any live process already runs as the dedicated pair.

    ``beside``: the ids of the session's own live sandboxes (one open while the next starts ahead); a process
    in one of their cgroups, which it cannot leave, is theirs and tolerated. Every other user is refused.
    """
    users = processes_using(uid, gid)
    if beside:
        names = {sandbox_name(sandbox_id) for sandbox_id in beside}
        users = [(pid, name) for pid, name in users if not _in_cgroup_named(pid, names)]
    if users:
        pid, name = users[0]
        more = f" and {len(users) - 1} more" if len(users) > 1 else ""
        raise Refused(
            f"sandbox uid {uid} / gid {gid}",
            f"process {pid} ({name}){more} already runs as it; the sandbox ids must be dedicated and unused "
            "(stop those processes or configure another sandbox_uid/sandbox_gid)",
        )


def _in_cgroup_named(pid: int, names: set[str]) -> bool:
    """Whether ``pid`` is a process of one of the sandboxes ``names``: in one of their cgroups in any hierarchy,
    or gone, or exiting (a sandbox being closed beside this start: the kernel has taken its cgroup from it,
    and it never runs again)."""
    try:
        with open(f"/proc/{pid}/cgroup") as file:
            text = file.read()
        if any(names.intersection(line.split(":", 2)[-1].split("/")) for line in text.splitlines()):
            return True
        with open(f"/proc/{pid}/stat", "rb") as file:
            flags = int(file.read().rpartition(b")")[2].split()[6])
    except (FileNotFoundError, ProcessLookupError):
        return True
    return bool(flags & _PF_EXITING)


# The stage's own sandbox id pair, written once right after its GENESIS: recovery cleans up as the ids the
# stage's sandboxes ran as, whichever pair of the pool its session was bound to.
IDS_NAME = "sandbox-ids"
_IDS_MAX_BYTES = 64


def record_ids(stage_fd: int, uid: int, gid: int, shown: str) -> None:
    from journal.createonly import publish_once

    publish_once(stage_fd, IDS_NAME, f"{uid} {gid}\n".encode("ascii"), mode=0o400, shown=f"{shown}/{IDS_NAME}")


def recorded_ids(stage_fd: int, default: tuple[int, int], shown: str) -> tuple[int, int]:
    """The pair the stage recorded; ``default`` (the pool's first) when it has none, which only a stage made
    before the pool or one whose steward stopped before any sandbox could start lacks."""
    from journal.files import read_evidence

    data = read_evidence(stage_fd, IDS_NAME, _IDS_MAX_BYTES)
    if data is None:
        return default
    parts = data.decode("ascii", "replace").split()
    if len(parts) != 2 or not all(part.isdigit() and 1 <= int(part) <= 2**32 - 2 for part in parts):
        raise Refused(f"{shown}/{IDS_NAME}", "must hold a sandbox uid and gid")
    return int(parts[0]), int(parts[1])
