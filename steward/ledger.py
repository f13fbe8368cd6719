"""J1: the intent ledger the starter calls before every effect it releases or permits.

Every method returns only once its record is durable. The starter calls
``process_intent`` before it releases a blocked process (the launcher's
nonce, pid 1's release, an op child's release), ``mount_intent`` before it
ACKs a mount, and records each wait status from the process's own parent.
The values are the journal's frozen vocabulary (docs/journal-format.md):
roles ``launcher`` (stage 1), ``namespace`` (the sandbox's pid 1) and
``descendant`` (an op), and ``sandbox_ready`` for a pid 1 whose READY (its
syscall filter's digest, S12) the starter checked; reapers ``steward`` (the starter reaps stage 1 and
pid 1) and ``launcher`` (pid 1 reaps ops); mount kinds ``tree`` (a cloned
capability, and the old root's detach), ``tmpfs`` and ``proc``; op ids
``<sandbox>.<what>``. ``journal.writer.JournalWriter`` satisfies this
protocol and is the production ledger; ``RecordingLedger`` keeps the records
in memory for ``casebox sandbox run`` and the tests. A method may return a
value (the writer returns its new head); the starter ignores it.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol


class IntentLedger(Protocol):
    def process_intent(self, op_id: str, role: str, pid: int, starttime: int, pgid: int) -> object: ...

    def process_released(self, op_id: str) -> object: ...

    def process_terminal(self, op_id: str, wait_status: int, reaper: str) -> object: ...

    def descendants_terminal(self, op_id: str, count: int) -> object: ...

    def mount_intent(self, op_id: str, target: str, kind: str) -> object: ...

    def mount_done(self, op_id: str, target: str, kind: str) -> object: ...

    def unmount_intent(self, op_id: str, target: str, kind: str) -> object: ...

    def unmount_done(self, op_id: str, target: str, kind: str) -> object: ...

    def sandbox_ready(self, op_id: str, filter_digest: str) -> object: ...


@dataclasses.dataclass
class RecordingLedger:
    """An in-memory ledger: each call appends (method, arguments...) to ``records``."""

    records: list[tuple] = dataclasses.field(default_factory=list)

    def process_intent(self, op_id: str, role: str, pid: int, starttime: int, pgid: int) -> None:
        self.records.append(("process_intent", op_id, role, pid, starttime, pgid))

    def process_released(self, op_id: str) -> None:
        self.records.append(("process_released", op_id))

    def process_terminal(self, op_id: str, wait_status: int, reaper: str) -> None:
        self.records.append(("process_terminal", op_id, wait_status, reaper))

    def descendants_terminal(self, op_id: str, count: int) -> None:
        self.records.append(("descendants_terminal", op_id, count))

    def mount_intent(self, op_id: str, target: str, kind: str) -> None:
        self.records.append(("mount_intent", op_id, target, kind))

    def mount_done(self, op_id: str, target: str, kind: str) -> None:
        self.records.append(("mount_done", op_id, target, kind))

    def unmount_intent(self, op_id: str, target: str, kind: str) -> None:
        self.records.append(("unmount_intent", op_id, target, kind))

    def unmount_done(self, op_id: str, target: str, kind: str) -> None:
        self.records.append(("unmount_done", op_id, target, kind))

    def sandbox_ready(self, op_id: str, filter_digest: str) -> None:
        self.records.append(("sandbox_ready", op_id, filter_digest))
