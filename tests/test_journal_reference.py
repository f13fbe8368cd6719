"""The reader's walk against a straightforward reference, frame by frame (J4, issue 14).

``journal.reader`` walks a journal in one loop with its names bound locally
and matches payloads in place in one text of the whole journal, for speed.
The reference here reads each frame the plain way: slice the header, check
it, slice and decode the payload on its own, ask the sequence, chain with
``chain_step``. Over the golden journals and byte-level mutations of them
both must give the same verdict, reason, valid prefix, head and records.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from journal.errors import Refused
from journal.format import (
    CAP,
    HEADER,
    HEADER_BYTES,
    MAX_FRAME,
    FrameError,
    Kind,
    chain_step,
    check_header,
    decode_payload,
    genesis_digest,
    padded,
)
from journal.reader import Verdict, _torn_shape, read_journal
from journal.sequence import OverCap, Sequence
from journal_support import golden, vectors


def _reference(data: bytes) -> tuple[str, str, int, list[tuple]]:
    """(verdict, reason, valid bytes, records) read one frame at a time, each rule in the order J4 states them."""
    data = bytes(data[:CAP])
    offset, previous, previous_hex, records, sequence = 0, b"", "", [], Sequence()

    def where() -> str:
        return f"offset {offset}, record {len(records) + 1}"

    while offset < len(data):
        rest = len(data) - offset
        if rest < HEADER_BYTES:
            return "TORN", f"{where()}: the last frame's header is incomplete ({rest} of 8 bytes)", offset, records
        header = data[offset : offset + HEADER_BYTES]
        if header == bytes(HEADER_BYTES):
            if any(data[offset:]):
                return "CORRUPT", f"{where()}: a zero header is followed by nonzero bytes", offset, records
            if rest <= MAX_FRAME:
                return "TORN", f"{where()}: the last frame is zero-filled ({rest} bytes)", offset, records
            return "CORRUPT", f"{where()}: the zero-filled tail ({rest} bytes) is longer than any one frame ({MAX_FRAME})", offset, records
        length, kind_number, version, reserved = HEADER.unpack(header)
        try:
            kind = check_header(length, kind_number, version, reserved)
        except FrameError as error:
            return "CORRUPT", f"{where()}: {error.reason}", offset, records
        frame_end = offset + HEADER_BYTES + padded(length)
        if frame_end > len(data):
            if _torn_shape(data, offset, length, len(data))[0]:
                return "TORN", f"{where()}: the last {kind.name} frame is incomplete ({rest} of {frame_end - offset} bytes)", offset, records
            return "CORRUPT", f"{where()}: the {kind.name} frame runs past the end, over bytes no torn write leaves", offset, records
        payload = data[offset + HEADER_BYTES : offset + HEADER_BYTES + length]
        try:
            if any(data[offset + HEADER_BYTES + length : frame_end]):
                raise FrameError("the padding after the payload is not all zero")
            try:
                fields = decode_payload(kind, payload)
            except Refused as refusal:
                raise FrameError(f"payload {refusal.sentence()}") from None
            try:
                sequence.check_order(kind, fields)
            except Refused as refusal:
                raise FrameError(refusal.rule if refusal.where == kind.name else refusal.sentence()) from None
            if kind is Kind.GENESIS:
                previous = genesis_digest(fields["journal_id"], fields["stage_id"])
                previous_hex = previous.hex()
            if fields["prev"] != previous_hex:
                raise FrameError("prev does not match the digest of the chain before it; the chain is broken")
        except FrameError as error:
            consistent, zero_chunk = _torn_shape(data, offset, length, frame_end)
            if frame_end == len(data) and zero_chunk and consistent:
                return "TORN", f"{where()}: the last {kind.name} frame holds a zero-filled sector", offset, records
            return "CORRUPT", f"{where()} ({kind.name}): {error.reason}", offset, records
        try:
            sequence.check_bounds(kind, frame_end)
        except OverCap as refusal:
            return "OVER_CAP", f"{where()} ({kind.name}): {refusal.rule}", offset, records
        previous = chain_step(previous, header, payload)
        previous_hex = previous.hex()
        sequence.admit(kind, fields, previous_hex)
        records.append((offset, kind, version, payload, fields, previous_hex))
        offset = frame_end
    if not records:
        return "TORN", "the journal is empty; its GENESIS record was never written", offset, records
    return "VALID", f"{len(records)} records verify; the chain ends at the head", offset, records


def _same(data: bytes) -> None:
    reading = read_journal(data)
    verdict, reason, valid_bytes, records = _reference(data)
    if len(data) > CAP:
        verdict, reason = "OVER_CAP", f"the journal is {len(data)} bytes or more, over the {CAP}-byte cap"
    assert (reading.verdict, reading.reason, reading.valid_bytes) == (Verdict(verdict), reason, valid_bytes)
    assert [tuple(record) for record in reading.records] == records


def test_every_golden_journal_reads_as_the_reference_reads_it():
    """J4, issue 14: each golden vector (valid, torn, corrupt, over the cap) gets the reference's verdict and reason."""
    names = [vector["file"] for vector in vectors() if vector["file"] is not None]
    assert len(names) > 10
    for name in names:
        _same(golden(name))


_BASES = [golden(vector["file"]) for vector in vectors() if vector["file"] is not None]
_EDIT = st.tuples(
    st.sampled_from(("set", "delete", "insert_zeros", "cut")),
    st.integers(min_value=0, max_value=CAP),
    st.sampled_from((0x00, 0x22, 0x5C, 0x30, 0x7B, 0x01, 0xFF)),
    st.sampled_from((1, 8, 512)),
)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_BASES), st.lists(_EDIT, min_size=1, max_size=3))
def test_mutated_journals_read_as_the_reference_reads_them(base, edits):
    """J4, issue 14: a byte set, bytes deleted, zeros inserted or a cut anywhere in a golden journal: the fast walk's
    verdict, first-error reason, valid prefix and records are the reference's."""
    data = bytearray(base)
    for edit, position, byte, size in edits:
        position %= max(len(data), 1)
        if edit == "set" and data:
            data[position] = byte
        elif edit == "delete":
            del data[position : position + size]
        elif edit == "insert_zeros":
            data[position:position] = bytes(size)
        else:
            del data[position:]
    _same(bytes(data))
