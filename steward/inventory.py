"""C1, C4: process identities from a journal, and the two inventories cleanup evidence binds.

- The **process inventory** lists every live process of the dedicated UID or
  GID (psutil), and every process identity the journal recorded with its C1
  state and whether it is still present, plus the C3 claim on each sandbox's
  outer process group, and the keys the dedicated UID owns (S13,
  /proc/key-users): anything beyond its two base keyrings outlived its case.
- The **mount inventory** lists the ``/proc/self/mountinfo`` entries at or
  under the state root, and those at or under the stage.

Each is a canonical JSON document (D2) whose SHA-256 is its digest; the
builders here are pure, the collectors below them read the host.
"""

from __future__ import annotations

import dataclasses
import re

from journal.format import Kind, sandbox_of
from journal.reader import Record
from journal.strictjson import decode_lossy
from steward import procfs

PROCESSES_VERSION = "casebox.processes.v3"
# The keyrings every UID that ran a sandbox owns for good: its user keyring and its user session keyring
# (pid 1 makes sure both exist, launcher/kernel.py). The kernel keeps them while the user namespace lives.
BASE_KEYRINGS = 2
MOUNTS_VERSION = "casebox.mounts.v1"
TERMINATED, STARTED, NEVER_STARTED, UNKNOWN = "TERMINATED", "STARTED", "NEVER_STARTED", "UNKNOWN"
# The roles that run with privilege; C8 asks raw status 0 of each one started. ``descendant`` is an op,
# which runs as the dedicated UID: its status is the case's result, not a privileged failure.
PRIVILEGED_ROLES = ("launcher", "stage", "outer", "helper", "root_peer", "namespace")
_ESCAPED = re.compile(rb"\\([0-7]{3})")


@dataclasses.dataclass(frozen=True)
class Identity:
    """One recorded process (C1): its identity at intent, and the raw status its parent read, if any."""

    op_id: str
    role: str
    pid: int
    starttime: int
    pgid: int
    released: bool = False
    wait_status: int | None = None
    reaper: str | None = None
    descendants: int | None = None

    @property
    def state(self) -> str:
        return TERMINATED if self.wait_status is not None else STARTED


def identities(records: tuple[Record, ...]) -> list[Identity]:
    """Every PROCESS_INTENT of a journal's valid prefix with what later records say about it, in order."""
    found: dict[str, Identity] = {}
    for record in records:
        fields = record.fields
        if record.kind is Kind.PROCESS_INTENT:
            found[fields["op_id"]] = Identity(
                fields["op_id"], fields["role"], fields["pid"], fields["starttime"], fields["pgid"]
            )
        elif record.kind is Kind.PROCESS_RELEASED:
            found[fields["op_id"]] = dataclasses.replace(found[fields["op_id"]], released=True)
        elif record.kind is Kind.PROCESS_TERMINAL:
            found[fields["op_id"]] = dataclasses.replace(
                found[fields["op_id"]], wait_status=fields["wait_status"], reaper=fields["reaper"]
            )
        elif record.kind is Kind.DESCENDANTS_TERMINAL:
            found[fields["op_id"]] = dataclasses.replace(found[fields["op_id"]], descendants=fields["count"])
    return list(found.values())


def namespace_state(recorded: list[Identity], sandbox: str) -> str:
    """C1 state of a sandbox's pid 1: recorded, or never started, or UNKNOWN until discovery says otherwise.

    A pid 1 is recorded when its CHILD report arrived. Without that record,
    stage 1's DESCENDANTS_TERMINAL says how many clones the starter found and
    reaped among its own children: none means pid 1 never started; without
    that record (the steward died first) the answer is UNKNOWN. NEVER_STARTED
    is never used in its place.
    """
    for identity in recorded:
        if identity.op_id == f"{sandbox}.init":
            return identity.state
    for identity in recorded:
        if identity.op_id == f"{sandbox}.launcher" and identity.descendants is not None:
            return NEVER_STARTED if identity.descendants == 0 else TERMINATED
    return UNKNOWN


def process_document(
    uid: int,
    gid: int,
    dedicated: list[dict],
    recorded: list[tuple[Identity, bool]],
    outer: list[tuple[str, int, bool]],
    keys: int,
    cgroups: list[tuple[str, bool]] = (),
) -> dict:
    """The process inventory (C4): ``dedicated`` processes, each recorded identity with its presence, outer
    claims, the number of keys the dedicated UID owns (S13), and every sandbox cgroup of the stage still on the
    host with whether a process is in it (S14)."""
    sandboxes = sorted({sandbox for identity, _ in recorded if (sandbox := sandbox_of(identity.op_id))})
    return {
        "version": PROCESSES_VERSION,
        "uid": uid,
        "gid": gid,
        "dedicated": sorted(dedicated, key=lambda entry: entry["pid"]),
        "identities": [
            {
                "op_id": identity.op_id,
                "role": identity.role,
                "pid": identity.pid,
                "starttime": identity.starttime,
                "pgid": identity.pgid,
                "state": identity.state,
                "wait_status": identity.wait_status,
                "present": present,
            }
            for identity, present in recorded
        ],
        "sandboxes": [
            {"sandbox": sandbox, "namespace": namespace_state([identity for identity, _ in recorded], sandbox)}
            for sandbox in sandboxes
        ],
        "outer_groups": [
            {"sandbox": sandbox, "pgid": pgid, "claim": "ABSENT" if absent else "UNPROVEN"}
            for sandbox, pgid, absent in sorted(outer)
        ],
        "keys": {"owned": keys, "base_keyrings": BASE_KEYRINGS},
        "cgroups": [{"path": path, "populated": full} for path, full in sorted(cgroups)],
    }


def residue(document: dict) -> list[str]:
    """What a process inventory shows still alive, one phrase each; empty when nothing is."""
    found = [f"process {entry['pid']} of the dedicated ids" for entry in document["dedicated"]]
    found += [f"{entry['role']} {entry['op_id']} (pid {entry['pid']})" for entry in document["identities"] if entry["present"]]
    extra = document["keys"]["owned"] - document["keys"]["base_keyrings"]
    if extra > 0:
        found.append(f"{extra} key(s) of the dedicated UID beyond its base keyrings")
    found += [f"cgroup {entry['path']}" + (" with a process in it" if entry["populated"] else "") for entry in document["cgroups"]]
    return found


def _unescape(field: bytes) -> str:
    return decode_lossy(_ESCAPED.sub(lambda match: bytes((int(match.group(1), 8),)), field))


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def mount_document(mountinfo: bytes, state_root: str, stage: str) -> dict:
    """The mount inventory (C4): the mountinfo entries at or under the state root, and under the stage."""
    entries = []
    for line in mountinfo.splitlines():
        fields = line.split(b" ")
        try:
            separator = fields.index(b"-")
        except ValueError:
            continue
        point = _unescape(fields[4])
        fstype = _unescape(fields[separator + 1]) if len(fields) > separator + 1 else ""
        source = _unescape(fields[separator + 2]) if len(fields) > separator + 2 else ""
        if _under(point, state_root):
            entries.append({"mount_point": point, "fstype": fstype, "source": source})
    entries.sort(key=lambda entry: (entry["mount_point"], entry["fstype"], entry["source"]))
    return {
        "version": MOUNTS_VERSION,
        "state_root": state_root,
        "stage": stage,
        "under_state_root": entries,
        "under_stage": [entry for entry in entries if _under(entry["mount_point"], stage)],
    }


# Collectors: the thin shell that reads the host.

def dedicated_processes(uid: int, gid: int) -> list[dict]:
    """Every live process whose real, effective or saved UID or GID is the dedicated pair (S6's own scan), with
    its parent, state and ids as psutil reads them; one that exits meanwhile is gone, not listed."""
    import psutil

    from steward.dedicated import processes_using

    found = []
    for pid, _ in processes_using(uid, gid):
        try:
            info = psutil.Process(pid).as_dict(["ppid", "uids", "gids", "status"])
        except psutil.NoSuchProcess:
            continue
        found.append({
            "pid": pid,
            "ppid": info.get("ppid") or 0,
            "status": str(info.get("status") or "?"),
            "uids": list(info.get("uids") or ()),
            "gids": list(info.get("gids") or ()),
        })
    return found


def owned_keys(key_users: str, uid: int) -> int:
    """How many keys ``uid`` owns, from /proc/key-users text (``uid: usage nkeys/nikeys ...``); 0 when absent."""
    for line in key_users.splitlines():
        owner, _, rest = line.partition(":")
        if owner.strip() == str(uid):
            return int(rest.split()[1].split("/")[0])
    return 0


def dedicated_keys(uid: int) -> int:
    with open("/proc/key-users") as file:
        return owned_keys(file.read(), uid)


def present_now(identity: Identity) -> bool:
    """Whether a recorded identity is alive, judged through a fresh ``/proc/<pid>`` (same pid, same start time)."""
    try:
        handle = procfs.ProcessHandle.open(identity.pid, identity.starttime)
    except (LookupError, FileNotFoundError, ProcessLookupError):
        return False
    handle.close()
    return True


def read_mountinfo() -> bytes:
    with open("/proc/self/mountinfo", "rb") as file:
        return file.read()
