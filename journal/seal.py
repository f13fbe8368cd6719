"""The seal marker of a retired stage (docs/receipts.md, "Seal marker").

When the cleanup writer seals a tombstone it leaves ``seal.json`` beside the
journal: closed canonical JSON naming the attempt, the stage, the journal and
the journal's final head. An evaluator reads the journal bound to exactly
these values, so a journal from another stage, a shortened one or a longer
one does not verify against the marker (J4 SUBSTITUTED). The marker is
written create-once like every evidence file (E4).
"""

from __future__ import annotations

import dataclasses

from journal.closed import ClosedObject
from journal.format import pop_id
from journal.strictjson import StrictJSONError, canonical, loads

SCHEMA = "casebox.seal.v1"
NAME = "seal.json"
SEAL_MAX_BYTES = 4_096


@dataclasses.dataclass(frozen=True)
class SealMarker:
    attempt_id: str
    stage_id: str
    journal_id: str
    head: str

    def as_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "attempt_id": self.attempt_id,
            "stage_id": self.stage_id,
            "journal_id": self.journal_id,
            "head": self.head,
        }

    def canonical_bytes(self) -> bytes:
        return canonical(self.as_dict())


def seal_from_value(value: object) -> SealMarker:
    fields = ClosedObject(value)
    fields.pop_const("schema", SCHEMA)
    marker = SealMarker(
        attempt_id=pop_id(fields, "attempt_id"),
        stage_id=pop_id(fields, "stage_id"),
        journal_id=pop_id(fields, "journal_id"),
        head=fields.pop_sha256("head"),
    )
    fields.done()
    return marker


def seal_from_bytes(data: bytes) -> SealMarker:
    """The marker in ``data``: closed, valid, and in its one canonical encoding."""
    marker = seal_from_value(loads(data, max_bytes=SEAL_MAX_BYTES))
    if marker.canonical_bytes() != data:
        raise StrictJSONError("$", "the seal marker is not in canonical JSON form (RFC 8785, no trailing newline)")
    return marker
