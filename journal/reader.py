"""The journal reader: one verdict for the bytes as stored (J4, docs/journal-format.md, "Verdicts").

It is pure: it takes bytes, never a path, needs no privileges, and never
repairs, re-encodes or skips anything. The first frame that fails decides the
verdict; the records before it are the valid prefix it reports.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, NamedTuple

from journal.errors import Refused
from journal.format import (
    CAP,
    HEADER,
    HEADER_BYTES,
    MAX_FRAME,
    RESERVE_START,
    SECTOR,
    FrameError,
    Kind,
    chain_step,
    check_header,
    decode_payload,
    genesis_digest,
    padded,
)
from journal.sequence import OverCap, Sequence

_ZERO_HEADER = bytes(HEADER_BYTES)
_GENESIS = Kind.GENESIS


class Verdict(enum.StrEnum):
    VALID = "VALID"
    TORN = "TORN"
    CORRUPT = "CORRUPT"
    SUBSTITUTED = "SUBSTITUTED"
    OVER_CAP = "OVER_CAP"
    MISSING = "MISSING"


class Record(NamedTuple):
    offset: int
    kind: Kind
    version: int
    payload: bytes
    fields: dict[str, Any]
    digest: str

    @property
    def end(self) -> int:
        return self.offset + HEADER_BYTES + padded(len(self.payload))


@dataclasses.dataclass(frozen=True)
class Anchor:
    """Values kept outside a journal that it must match (docs/journal-format.md, "Anchors"): from a seal
    marker, a receipt or the caller; ``source`` names where they came from, for the reason."""

    source: str
    stage_id: str | None = None
    journal_id: str | None = None
    head: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Reading:
    verdict: Verdict
    records: tuple[Record, ...]
    valid_bytes: int
    head: str | None
    reason: str
    # The rules' state after the valid prefix, for a writer that continues this journal.
    sequence: Sequence = dataclasses.field(repr=False, compare=False)
    # What the journal was checked against; it is anchored when one of them fixed its head.
    anchors: tuple[Anchor, ...] = ()

    @property
    def genesis(self) -> dict[str, Any] | None:
        return self.records[0].fields if self.records else None

    @property
    def anchored(self) -> bool:
        return any(anchor.head is not None for anchor in self.anchors)

    @property
    def stated(self) -> str:
        """The verdict as the tools print it: a VALID one says what anchored its head, or that nothing did."""
        if self.verdict is not Verdict.VALID:
            return str(self.verdict)
        sources = [anchor.source for anchor in self.anchors if anchor.head is not None]
        return f"VALID (anchored by {', '.join(sources)})" if sources else "VALID (unanchored)"


class _Stop(Exception):
    def __init__(self, verdict: Verdict, reason: str) -> None:
        super().__init__(reason)
        self.verdict = verdict
        self.reason = reason


def _sector_chunks(data: bytes, start: int, stop: int):
    """``data[start:stop]`` cut at every multiple of 512 of the file offset."""
    while start < stop:
        cut = min(stop, (start // SECTOR + 1) * SECTOR)
        yield bytes(data[start:cut])
        start = cut


def _torn_shape(data: bytes, offset: int, length: int, stop: int) -> tuple[bool, bool]:
    """(could these bytes be one frame's torn write, does a payload sector read all zero).

    A torn write leaves each 512-byte sector of the frame either written or
    zero. A payload never holds a zero byte, so a payload chunk must be wholly
    zero or hold no zero at all, and any padding present must be zero.
    """
    payload_stop = min(stop, offset + HEADER_BYTES + length)
    zero_chunk = False
    for chunk in _sector_chunks(data, offset + HEADER_BYTES, payload_stop):
        if not chunk.strip(b"\x00"):
            zero_chunk = True
        elif b"\x00" in chunk:
            return False, zero_chunk
    if any(data[payload_stop:stop]):
        return False, zero_chunk
    return True, zero_chunk


class _Walk:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.offset = 0
        self.records: list[Record] = []
        self.sequence = Sequence()

    def _where(self) -> str:
        return f"offset {self.offset}, record {len(self.records) + 1}"

    def _stop(self, offset: int, verdict: Verdict, reason: str) -> _Stop:
        """The verdict on the frame at ``offset``; ``reason`` follows its place (offset and record number)."""
        self.offset = offset
        return _Stop(verdict, f"{self._where()}{reason}")

    def run(self) -> None:
        # One loop with its names bound locally: a method call, an attribute lookup or a Record built through
        # its Python-level __new__ costs about as much as a payload's match, once per record (issue 14).
        data = self.data
        end = len(data)
        # Each byte one character, so a payload's layout is matched in place, without a slice and a decode.
        text = data.decode("latin-1")
        unpack = HEADER.unpack_from
        sequence = self.sequence
        check_order, admit = sequence.check_order, sequence.admit
        records = self.records
        append = records.append
        make_record = tuple.__new__
        previous, previous_hex = b"", ""
        offset = 0
        while offset < end:
            rest = end - offset
            if rest < HEADER_BYTES:
                raise self._stop(offset, Verdict.TORN, f": the last frame's header is incomplete ({rest} of 8 bytes)")
            payload_start = offset + HEADER_BYTES
            length, kind_number, version, reserved = unpack(data, offset)
            try:
                kind = check_header(length, kind_number, version, reserved)
            except FrameError as error:
                # A zero header breaks the length rule, so it is told apart only once the header is refused.
                if data[offset:payload_start] == _ZERO_HEADER:
                    if any(data[offset:end]):
                        raise self._stop(offset, Verdict.CORRUPT, ": a zero header is followed by nonzero bytes") from None
                    if rest <= MAX_FRAME:
                        raise self._stop(offset, Verdict.TORN, f": the last frame is zero-filled ({rest} bytes)") from None
                    raise self._stop(offset, Verdict.CORRUPT, f": the zero-filled tail ({rest} bytes) is longer than any one frame ({MAX_FRAME})") from None
                raise self._stop(offset, Verdict.CORRUPT, f": {error.reason}") from None
            frame_end = payload_start + padded(length)
            if frame_end > end:
                if _torn_shape(data, offset, length, end)[0]:
                    raise self._stop(offset, Verdict.TORN, f": the last {kind.name} frame is incomplete ({rest} of {frame_end - offset} bytes)")
                raise self._stop(offset, Verdict.CORRUPT, f": the {kind.name} frame runs past the end, over bytes no torn write leaves")
            payload_end = payload_start + length
            payload = data[payload_start:payload_end]
            try:
                if data.count(0, payload_end, frame_end) != frame_end - payload_end:
                    raise FrameError("the padding after the payload is not all zero")
                try:
                    fields = decode_payload(kind, payload, text, payload_start)
                except Refused as refusal:
                    raise FrameError(f"payload {refusal.sentence()}") from None
                try:
                    check_order(kind, fields)
                except Refused as refusal:
                    raise FrameError(refusal.rule if refusal.where == kind.name else refusal.sentence()) from None
                if kind is _GENESIS:
                    previous = genesis_digest(fields["journal_id"], fields["stage_id"])
                    previous_hex = previous.hex()
                if fields["prev"] != previous_hex:
                    raise FrameError("prev does not match the digest of the chain before it; the chain is broken")
            except FrameError as error:
                consistent, zero_chunk = _torn_shape(data, offset, length, frame_end)
                if frame_end == end and zero_chunk and consistent:
                    raise self._stop(offset, Verdict.TORN, f": the last {kind.name} frame holds a zero-filled sector") from None
                raise self._stop(offset, Verdict.CORRUPT, f" ({kind.name}): {error.reason}") from None
            if frame_end > RESERVE_START:
                # Every bound of check_bounds is past RESERVE_START, so a frame ending before it passes them all.
                try:
                    sequence.check_bounds(kind, frame_end)
                except OverCap as refusal:
                    raise self._stop(offset, Verdict.OVER_CAP, f" ({kind.name}): {refusal.rule}") from None
            digest = chain_step(previous, data[offset:payload_start], payload)
            head = digest.hex()
            admit(kind, fields, head)
            append(make_record(Record, (offset, kind, version, payload, fields, head)))
            previous, previous_hex = digest, head
            offset = frame_end
        self.offset = offset
        if not records:
            raise _Stop(Verdict.TORN, "the journal is empty; its GENESIS record was never written")


def _differences(genesis: dict[str, Any], head: str | None, anchor: Anchor) -> list[str]:
    """How the chain differs from one anchor, each difference as a clause naming the anchor's source."""
    differences = []
    if anchor.stage_id is not None and genesis["stage_id"] != anchor.stage_id:
        differences.append(f"the chain is bound to stage {genesis['stage_id']!r}, not {anchor.stage_id!r} as {anchor.source} says")
    if anchor.journal_id is not None and genesis["journal_id"] != anchor.journal_id:
        differences.append(f"the chain is journal {genesis['journal_id']!r}, not {anchor.journal_id!r} as {anchor.source} says")
    if anchor.head is not None and head != anchor.head:
        differences.append(f"the head is {head}, not {anchor.head} as {anchor.source} says")
    return differences


def read_journal(
    data: bytes | None,
    *,
    expect_stage_id: str | None = None,
    expect_journal_id: str | None = None,
    expect_head: str | None = None,
    anchors: tuple[Anchor, ...] = (),
) -> Reading:
    """The verdict on a journal's stored bytes; ``None`` means there is no journal (MISSING).

    The ``expect_*`` values are one anchor, the caller's; ``anchors`` adds
    others (a seal marker). A chain that differs from any of them is
    SUBSTITUTED, and the reason lists every difference with its source.
    """
    if (expect_stage_id, expect_journal_id, expect_head) != (None, None, None):
        anchors = (Anchor("the caller", expect_stage_id, expect_journal_id, expect_head), *anchors)
    if data is None:
        return Reading(Verdict.MISSING, (), 0, None, "there is no journal", Sequence(), anchors)
    walk = _Walk(bytes(data[:CAP]))
    verdict, reason = Verdict.VALID, ""
    try:
        walk.run()
    except _Stop as stop:
        verdict, reason = stop.verdict, stop.reason
    records = tuple(walk.records)
    head = records[-1].digest if records else None
    if len(data) > CAP:
        verdict, reason = Verdict.OVER_CAP, f"the journal is {len(data)} bytes or more, over the {CAP}-byte cap"
    elif verdict in (Verdict.VALID, Verdict.TORN) and records:
        differences = [clause for anchor in anchors for clause in _differences(records[0].fields, head, anchor)]
        if differences:
            verdict, reason = Verdict.SUBSTITUTED, "; ".join(differences)
    if verdict is Verdict.VALID:
        reason = f"{len(records)} records verify; the chain ends at the head"
    return Reading(verdict, records, walk.offset, head, reason, walk.sequence, anchors)
