"""S6: the sandbox UID/GID is dedicated, so no live process may already use it."""

from __future__ import annotations

import psutil

from journal.errors import Refused


def processes_using(uid: int, gid: int) -> list[tuple[int, str]]:
    """(pid, name) of every live process whose real, effective or saved UID or GID is the pair's."""
    found = []
    # Only the ids are read for every process (one /proc/PID/status each); the
    # name, which costs another read, only for a process that uses the pair.
    for process in psutil.process_iter(["uids", "gids"]):
        info = process.info
        uids, gids = info.get("uids"), info.get("gids")
        if (uids is not None and uid in tuple(uids)) or (gids is not None and gid in tuple(gids)):
            found.append((process.pid, _name(process)))
    return found


def _name(process: psutil.Process) -> str:
    try:
        return process.name() or "?"
    except psutil.Error:
        return "?"


def require_unused(uid: int, gid: int) -> None:
    """Refuse the session when any live process already runs as the dedicated pair."""
    users = processes_using(uid, gid)
    if users:
        pid, name = users[0]
        more = f" and {len(users) - 1} more" if len(users) > 1 else ""
        raise Refused(
            f"sandbox uid {uid} / gid {gid}",
            f"process {pid} ({name}){more} already runs as it; the sandbox ids must be dedicated and unused "
            "(stop those processes or configure another sandbox_uid/sandbox_gid)",
        )
