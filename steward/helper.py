"""The REMOVE_AND_PROVE helper (C6): a separate root process per attempt; ``python -I -m steward.helper``.

It reads one closed request on stdin, to end of file (reading it is the
helper's release: the steward writes it only once the helper's identity is
durable, J1). It then

1. kills every process of the dedicated UID or GID, and every recorded
   identity still alive (same pid and start time), through a pidfd opened and
   checked against the scan, until none is left or its budget runs out;
2. unmounts, relative to the stage's directory descriptor, each host mount the
   journal says the stage made (``MNT_DETACH|UMOUNT_NOFOLLOW``);
3. proves both absent: a fresh procfs scan finds no such process and
   ``/proc/self/mountinfo`` holds no mount at or under the stage;

and writes one closed response to stdout, closes it, and exits 0. The
response is data only: it excludes what the runner owns (the helper's pid,
its wait status, the attempt history), which the steward records itself.

Both messages are canonical JSON (D2) and are read back strictly (D1); this
module is their one encoder and decoder.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import signal
import sys
import time

from journal import strictjson
from journal.closed import ClosedObject
from journal.format import pop_id
from steward import inventory, procfs

REQUEST_VERSION = "casebox.helper-request.v1"
RESPONSE_VERSION = "casebox.helper-response.v1"
REQUEST_CAP = 1 << 20
RESPONSE_CAP = 16 << 10
MAX_COUNT = 1_000_000
MAX_ITEMS = 4_096
MAX_DIAGNOSTIC = 1_000
OUTCOMES = ("CLEANED", "UNVERIFIED")
_POLL_SECONDS = 0.01
_UMOUNT_NOFOLLOW = 0x8


@dataclasses.dataclass(frozen=True)
class Request:
    stage_id: str
    state_root: str
    area: str
    uid: int
    gid: int
    mounts: tuple[str, ...]
    identities: tuple[tuple[int, int], ...]
    budget_ms: int

    def encode(self) -> bytes:
        return strictjson.canonical({
            "version": REQUEST_VERSION,
            "stage_id": self.stage_id,
            "state_root": self.state_root,
            "area": self.area,
            "uid": self.uid,
            "gid": self.gid,
            "mounts": list(self.mounts),
            "identities": [{"pid": pid, "starttime": starttime} for pid, starttime in self.identities],
            "budget_ms": self.budget_ms,
        })

    @classmethod
    def decode(cls, data: bytes) -> "Request":
        fields = ClosedObject(strictjson.loads(data, max_bytes=REQUEST_CAP))
        fields.pop_const("version", REQUEST_VERSION)
        stage_id = pop_id(fields, "stage_id")
        state_root = fields.pop_str("state_root", max_bytes=4_096)
        area = fields.pop_str("area", max_bytes=16)
        if area not in ("stages", "tombstones") or not state_root.startswith("/"):
            raise strictjson.StrictJSONError("$", "the stage must be in stages/ or tombstones/ of an absolute state root")
        uid = fields.pop_int("uid", low=1, high=2**32 - 2)
        gid = fields.pop_int("gid", low=1, high=2**32 - 2)
        mounts = []
        for path, item in fields.pop_list("mounts", min_items=0, max_items=MAX_ITEMS):
            relative = item if type(item) is str else ""
            if not relative or relative.startswith("/") or any(part in ("", ".", "..") for part in relative.split("/")):
                raise strictjson.StrictJSONError(path, "must be a relative path inside the stage")
            mounts.append(relative)
        found = []
        for path, item in fields.pop_list("identities", min_items=0, max_items=MAX_ITEMS):
            entry = ClosedObject(item, path)
            found.append((entry.pop_int("pid", low=1, high=4_194_304), entry.pop_int("starttime", low=0, high=strictjson.MAX_SAFE_INTEGER)))
            entry.done()
        budget_ms = fields.pop_int("budget_ms", low=1, high=3_600_000)
        fields.done()
        return cls(stage_id, state_root, area, uid, gid, tuple(mounts), tuple(found), budget_ms)


@dataclasses.dataclass(frozen=True)
class Response:
    """The helper-response DTO; its SHA-256 over the exact bytes is the journal's ``response_digest``."""

    stage_id: str
    outcome: str
    killed: int
    unmounted: int
    remaining_processes: int
    remaining_mounts: int
    diagnostic: str

    def encode(self) -> bytes:
        return strictjson.canonical({"version": RESPONSE_VERSION, **dataclasses.asdict(self)})

    @classmethod
    def decode(cls, data: bytes, *, stage_id: str) -> "Response":
        """The response in ``data``, refused unless it is exactly a canonical response about ``stage_id``."""
        value = strictjson.loads(data, max_bytes=RESPONSE_CAP)
        fields = ClosedObject(value)
        fields.pop_const("version", RESPONSE_VERSION)
        fields.pop_const("stage_id", stage_id)
        outcome = fields.pop_str("outcome", max_bytes=16)
        if outcome not in OUTCOMES:
            raise strictjson.StrictJSONError("$.outcome", f"must be one of {', '.join(OUTCOMES)}")
        counts = {key: fields.pop_int(key, low=0, high=MAX_COUNT) for key in ("killed", "unmounted", "remaining_processes", "remaining_mounts")}
        diagnostic = fields.pop_str("diagnostic", max_bytes=MAX_DIAGNOSTIC)
        fields.done()
        if strictjson.canonical(value) != data:
            raise strictjson.StrictJSONError("$", "the response is not in canonical form")
        if outcome == "CLEANED" and (counts["remaining_processes"] or counts["remaining_mounts"]):
            raise strictjson.StrictJSONError("$.outcome", "CLEANED contradicts what the response says remains")
        return cls(stage_id, outcome, diagnostic=diagnostic, **counts)


# The helper process.

def _targets(request: Request) -> list[procfs.Entry]:
    recorded = set(request.identities)
    return [
        entry for entry in procfs.scan()
        if request.uid in entry.uids or request.gid in entry.gids or (entry.pid, entry.starttime) in recorded
    ]


def _kill(entry: procfs.Entry) -> bool:
    """SIGKILL exactly the process the scan saw: through a pidfd whose start time is checked first."""
    try:
        pidfd = os.pidfd_open(entry.pid)
    except ProcessLookupError:
        return False
    try:
        if procfs.identity(entry.pid).starttime != entry.starttime:
            return False
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        return True
    except (ProcessLookupError, FileNotFoundError):
        return False
    finally:
        os.close(pidfd)


def _remove_processes(request: Request, deadline: float) -> tuple[int, int]:
    """(processes killed, processes still present when the budget ran out or none was left)."""
    killed: set[tuple[int, int]] = set()
    while True:
        targets = _targets(request)
        if not targets or time.monotonic() >= deadline:
            return len(killed), len(targets)
        for entry in targets:
            # A zombie is already dead; it is gone once its parent reaps it.
            if entry.state != "Z" and (entry.pid, entry.starttime) not in killed and _kill(entry):
                killed.add((entry.pid, entry.starttime))
        time.sleep(_POLL_SECONDS)


def _unmount(request: Request) -> int:
    from launcher import syscalls

    unmounted = 0
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    root = os.open(request.state_root, flags)
    try:
        area = os.open(request.area, flags, dir_fd=root)
        try:
            stage = os.open(request.stage_id, flags, dir_fd=area)
        finally:
            os.close(area)
        try:
            for relative in request.mounts:
                parent, _, name = relative.rpartition("/")
                parent_fd = os.open(parent, flags, dir_fd=stage) if parent else os.dup(stage)
                try:
                    syscalls.umount2(f"/proc/self/fd/{parent_fd}/{name}", syscalls.MNT_DETACH | _UMOUNT_NOFOLLOW)
                    unmounted += 1
                except OSError as error:
                    if error.errno not in (errno.EINVAL, errno.ENOENT):
                        raise
                finally:
                    os.close(parent_fd)
        finally:
            os.close(stage)
    finally:
        os.close(root)
    return unmounted


def remove_and_prove(request: Request) -> Response:
    deadline = time.monotonic() + request.budget_ms / 1000
    problems = []
    killed, remaining_processes = _remove_processes(request, deadline)
    unmounted = 0
    try:
        unmounted = _unmount(request)
    except OSError as error:
        problems.append(f"unmounting failed: {error.strerror}")
    stage = os.path.join(request.state_root, request.area, request.stage_id)
    remaining_mounts = len(inventory.mount_document(inventory.read_mountinfo(), request.state_root, stage)["under_stage"])
    if remaining_processes:
        problems.append(f"{remaining_processes} process(es) of the dedicated ids or recorded identities remain")
    if remaining_mounts:
        problems.append(f"{remaining_mounts} mount(s) remain at or under the stage")
    return Response(
        stage_id=request.stage_id,
        outcome="UNVERIFIED" if problems else "CLEANED",
        killed=killed,
        unmounted=unmounted,
        remaining_processes=remaining_processes,
        remaining_mounts=remaining_mounts,
        diagnostic="; ".join(problems)[:MAX_DIAGNOSTIC] or "no process of the dedicated ids and no stage mount remains",
    )


def _read_request() -> bytes:
    chunks, total = [], 0
    while True:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > REQUEST_CAP:
            raise ValueError("the request is over its cap")
        chunks.append(chunk)


def main() -> None:
    request = Request.decode(_read_request())
    data = remove_and_prove(request).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]
    os.close(1)
    sys.exit(0)


if __name__ == "__main__":
    main()
