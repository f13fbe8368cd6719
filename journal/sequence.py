"""The ordering and placement rules of a journal, one record at a time (docs/journal-format.md, "Sequence").

The writer asks :meth:`Sequence.check` before it writes, so it refuses what the
reader would reject; the reader asks the same question of every stored record.
Every rule holds for each prefix of a journal, so cutting a valid journal at a
frame boundary leaves a valid journal.
"""

from __future__ import annotations

from typing import Any

from journal.errors import Refused
from journal.format import CAP, RESERVE, RESERVE_START, RETIREMENT_KINDS, Kind

# Module names for the kinds every record is compared with: an enum attribute
# lookup costs about as much as the comparison itself, once per record.
_GENESIS, _RETIREMENT_INTENT, _RETIRED = Kind.GENESIS, Kind.RETIREMENT_INTENT, Kind.RETIRED
_HELPER_ATTEMPT = Kind.HELPER_ATTEMPT
_PROCESS_FOLLOW_UPS = frozenset({Kind.PROCESS_RELEASED, Kind.PROCESS_TERMINAL, Kind.DESCENDANTS_TERMINAL, Kind.SANDBOX_READY})
# A process is released, and proves its sandbox ready, only while it lives.
_BEFORE_TERMINAL = frozenset({Kind.PROCESS_RELEASED, Kind.SANDBOX_READY})
_DONE_OF = {Kind.MOUNT_DONE: Kind.MOUNT_INTENT, Kind.UNMOUNT_DONE: Kind.UNMOUNT_INTENT}
_INTENTS = frozenset({Kind.PROCESS_INTENT, Kind.MOUNT_INTENT, Kind.UNMOUNT_INTENT})
_FOLLOW_UPS = _PROCESS_FOLLOW_UPS | _DONE_OF.keys()


class OutOfSequence(Refused):
    """A record that is well formed but may not stand at this place in the journal."""


class OverCap(Refused):
    """A record that would end past the cap, or a non-retirement record ending inside the reserve (J2)."""


class _Operation:
    __slots__ = ("intent", "fields", "seen")

    def __init__(self, intent: Kind, fields: dict[str, Any]) -> None:
        self.intent = intent
        self.fields = fields
        self.seen: set[Kind] = set()


class Sequence:
    """What the records so far allow next."""

    def __init__(self) -> None:
        self.count = 0
        self.last: Kind | None = None
        self.operations: dict[str, _Operation] = {}
        self.helper_attempts = 0
        self.last_helper_outcome: str | None = None
        self.heads: set[str] = set()

    def check(self, kind: Kind, fields: dict[str, Any], end: int) -> None:
        """Raise OverCap or OutOfSequence unless a ``kind`` record ending at byte ``end`` may come next."""
        self.check_order(kind, fields)
        self.check_bounds(kind, end)

    def check_bounds(self, kind: Kind, end: int) -> None:
        """J2: nothing ends past the cap, and only the two retirement records end inside the reserve."""
        if end > CAP:
            raise OverCap(kind.name, f"would end at byte {end}, past the {CAP}-byte cap")
        if kind not in RETIREMENT_KINDS and end > RESERVE_START:
            raise OverCap(
                kind.name,
                f"would end at byte {end}, inside the {RESERVE}-byte reserve kept for the two retirement records",
            )

    def check_order(self, kind: Kind, fields: dict[str, Any]) -> None:
        """Raise OutOfSequence unless a ``kind`` record with ``fields`` may follow the records so far."""
        last = self.last
        if last is None:
            if kind is not _GENESIS:
                raise OutOfSequence(kind.name, "cannot be the first record; a journal starts with GENESIS")
            return
        if kind is _GENESIS:
            raise OutOfSequence(kind.name, "may only be the first record")
        if last is _RETIRED:
            raise OutOfSequence(kind.name, "cannot follow RETIRED; a retired journal takes no more records")
        if last is _RETIREMENT_INTENT:
            if kind is not _RETIRED:
                raise OutOfSequence(kind.name, "cannot follow RETIREMENT_INTENT; only RETIRED may")
        elif kind is _RETIRED:
            raise OutOfSequence(kind.name, "must follow RETIREMENT_INTENT directly")
        rule = _ORDER_RULES.get(kind)
        if rule is not None:
            rule(self, kind, fields)

    def _intent(self, kind: Kind, fields: dict[str, Any]) -> None:
        if fields["op_id"] in self.operations:
            raise OutOfSequence("op_id", f"{fields['op_id']!r} is already the id of an earlier operation")

    def _process_follow_up(self, kind: Kind, fields: dict[str, Any]) -> None:
        operation = self._operation(kind, fields, Kind.PROCESS_INTENT)
        if kind in operation.seen:
            raise OutOfSequence("op_id", f"{fields['op_id']!r} already has a {kind.name} record")
        if kind in _BEFORE_TERMINAL and Kind.PROCESS_TERMINAL in operation.seen:
            raise OutOfSequence("op_id", f"{fields['op_id']!r} is already terminal")

    def _done(self, kind: Kind, fields: dict[str, Any]) -> None:
        operation = self._operation(kind, fields, _DONE_OF[kind])
        if kind in operation.seen:
            raise OutOfSequence("op_id", f"{fields['op_id']!r} already has a {kind.name} record")
        for key in ("target", "kind"):
            if fields[key] != operation.fields[key]:
                raise OutOfSequence(key, f"differs from the {key} of its {operation.intent.name}")

    def _helper_attempt(self, kind: Kind, fields: dict[str, Any]) -> None:
        if fields["attempt"] != self.helper_attempts + 1:
            raise OutOfSequence("attempt", f"must be {self.helper_attempts + 1}, attempts are numbered in order")
        if self.helper_attempts and self.last_helper_outcome != "MISSING":
            raise OutOfSequence(
                kind.name,
                f"cannot follow an attempt whose outcome was {self.last_helper_outcome}; only MISSING permits a successor",
            )

    def _cleanup_evidence(self, kind: Kind, fields: dict[str, Any]) -> None:
        if fields["journal_head"] not in self.heads:
            raise OutOfSequence("journal_head", "is not a head this journal had before this record")

    def _operation(self, kind: Kind, fields: dict[str, Any], intent: Kind) -> _Operation:
        operation = self.operations.get(fields["op_id"])
        if operation is None or operation.intent is not intent:
            raise OutOfSequence("op_id", f"{fields['op_id']!r} names no earlier {intent.name}")
        return operation

    def admit(self, kind: Kind, fields: dict[str, Any], head: str) -> None:
        """Record that a checked ``kind`` record is now part of the journal, leaving ``head``."""
        if kind in _INTENTS:
            self.operations[fields["op_id"]] = _Operation(kind, fields)
        elif kind in _FOLLOW_UPS:
            self.operations[fields["op_id"]].seen.add(kind)
        elif kind is _HELPER_ATTEMPT:
            self.helper_attempts += 1
            self.last_helper_outcome = fields["outcome"]
        self.count += 1
        self.last = kind
        self.heads.add(head)


_ORDER_RULES = {
    **{kind: Sequence._intent for kind in _INTENTS},
    **{kind: Sequence._process_follow_up for kind in _PROCESS_FOLLOW_UPS},
    **{kind: Sequence._done for kind in _DONE_OF},
    Kind.HELPER_ATTEMPT: Sequence._helper_attempt,
    Kind.CLEANUP_EVIDENCE: Sequence._cleanup_evidence,
}
