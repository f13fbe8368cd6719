"""Round trip (J3): any legal sequence of ledger calls, written and read back, is VALID with the same records."""

from __future__ import annotations

import inspect
import os
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal.format import CLEANUP_OUTCOMES, HELPER_OUTCOMES, MOUNT_KINDS, REAPERS, ROLES, Kind
from journal.reader import Verdict, read_journal
from journal.writer import JournalWriter
from journal_support import golden

ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True)
segments = st.from_regex(r"[!-.0-~]{1,12}", fullmatch=True).filter(lambda segment: segment not in (".", ".."))
targets = st.lists(segments, max_size=4).map(lambda parts: "/" + "/".join(parts))
wait_statuses = st.one_of(
    st.integers(0, 255).map(lambda code: code << 8),
    st.integers(1, 0x7E),
    st.integers(1, 0x7E).map(lambda number: number | 0x80),
)
digests = st.binary(min_size=32, max_size=32).map(bytes.hex)
notes = st.from_regex(r"[ -~]{0,60}", fullmatch=True)

LEDGER = {
    Kind.PROCESS_INTENT: "process_intent",
    Kind.PROCESS_RELEASED: "process_released",
    Kind.PROCESS_TERMINAL: "process_terminal",
    Kind.DESCENDANTS_TERMINAL: "descendants_terminal",
    Kind.MOUNT_INTENT: "mount_intent",
    Kind.MOUNT_DONE: "mount_done",
    Kind.UNMOUNT_INTENT: "unmount_intent",
    Kind.UNMOUNT_DONE: "unmount_done",
    Kind.HELPER_ATTEMPT: "helper_attempt",
    Kind.CLEANUP_EVIDENCE: "cleanup_evidence",
    Kind.RETIREMENT_INTENT: "retirement_intent",
    Kind.RETIRED: "retired",
}


class Player:
    """Draws legal ledger calls from the state of the journal so far."""

    def __init__(self, writer: JournalWriter, data) -> None:
        self.writer, self.data = writer, data
        self.appended: list[tuple[Kind, dict]] = []
        self.processes: dict[str, set[Kind]] = {}
        self.mounts: dict[str, tuple[Kind, dict]] = {}
        self.finished: set[str] = set()
        self.attempts, self.last_outcome = 0, None
        self.heads = [writer.head]

    def call(self, record_kind: Kind, /, **fields) -> None:
        getattr(self.writer, LEDGER[record_kind])(**fields)
        self.appended.append((record_kind, fields))
        self.heads.append(self.writer.head)

    def step(self) -> None:
        draw = self.data.draw
        choice = draw(st.sampled_from(["process", "follow", "mount", "done", "helper", "cleanup"]))
        if choice == "process":
            # The dash ends the counter, so two processes never share an id ("p1"+"00" vs "p10"+"0").
            op = f"p{len(self.processes)}-{draw(ids)}"
            self.call(Kind.PROCESS_INTENT, op_id=op, role=draw(st.sampled_from(ROLES)), pid=draw(st.integers(1, 4_194_304)),
                      starttime=draw(st.integers(0, 2**53 - 1)), pgid=draw(st.integers(1, 4_194_304)))
            self.processes[op] = set()
        elif choice == "follow" and self.processes:
            op = draw(st.sampled_from(sorted(self.processes)))
            seen = self.processes[op]
            legal = [kind for kind in (Kind.PROCESS_RELEASED, Kind.PROCESS_TERMINAL, Kind.DESCENDANTS_TERMINAL) if kind not in seen]
            if Kind.PROCESS_TERMINAL in seen and Kind.PROCESS_RELEASED in legal:
                legal.remove(Kind.PROCESS_RELEASED)
            if legal:
                kind = draw(st.sampled_from(legal))
                extra = {
                    Kind.PROCESS_RELEASED: {},
                    Kind.PROCESS_TERMINAL: {"wait_status": draw(wait_statuses), "reaper": draw(st.sampled_from(REAPERS))},
                    Kind.DESCENDANTS_TERMINAL: {"count": draw(st.integers(0, 2**32 - 1))},
                }[kind]
                self.call(kind, op_id=op, **extra)
                seen.add(kind)
        elif choice == "mount":
            op = f"m{len(self.mounts)}"
            intent = draw(st.sampled_from([Kind.MOUNT_INTENT, Kind.UNMOUNT_INTENT]))
            fields = {"op_id": op, "target": draw(targets), "kind": draw(st.sampled_from(MOUNT_KINDS))}
            self.call(intent, **fields)
            self.mounts[op] = (intent, fields)
        elif choice == "done" and set(self.mounts) - self.finished:
            op = draw(st.sampled_from(sorted(set(self.mounts) - self.finished)))
            intent, fields = self.mounts[op]
            self.call(Kind.MOUNT_DONE if intent is Kind.MOUNT_INTENT else Kind.UNMOUNT_DONE, **fields)
            self.finished.add(op)
        elif choice == "helper" and self.last_outcome in (None, "MISSING"):
            self.attempts += 1
            self.last_outcome = draw(st.sampled_from(HELPER_OUTCOMES))
            self.call(Kind.HELPER_ATTEMPT, attempt=self.attempts, response_digest=draw(digests), outcome=self.last_outcome)
        elif choice == "cleanup":
            self.call(Kind.CLEANUP_EVIDENCE, outcome=draw(st.sampled_from(CLEANUP_OUTCOMES)), journal_head=draw(st.sampled_from(self.heads)),
                      process_inventory_digest=draw(digests), mount_inventory_digest=draw(digests),
                      preceding_process_digest=draw(digests))


def test_ledger_methods_take_exactly_the_frozen_keys():
    """J3: each ledger method's parameters are its record kind's frozen keys, nothing more or less."""
    records = read_journal(golden("every_kind.bin")).records
    keys = {record.kind: set(record.fields) - {"prev", "at"} for record in records}
    for kind, method in LEDGER.items():
        assert set(list(inspect.signature(getattr(JournalWriter, method)).parameters)[1:]) == keys[kind], kind


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.integers(0, 60), st.integers(0, 2**53 - 10**9), st.booleans())
def test_random_ledger_sequences_round_trip(data, length, start, retire):
    """J3: written and read back, a random legal sequence is VALID with the same records and the same head."""
    times = iter(range(start, start + 10**9, 997))
    with tempfile.TemporaryDirectory() as directory:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with JournalWriter.create(dir_fd, "journal", journal_id="j", stage_id="s", attempt_id="a", clock=times.__next__) as writer:
                player = Player(writer, data)
                for _ in range(length):
                    player.step()
                if retire:
                    player.call(Kind.RETIREMENT_INTENT, note=data.draw(notes))
                    player.call(Kind.RETIRED, note=data.draw(notes))
                head, count = writer.head, writer.records
        finally:
            os.close(dir_fd)
        with open(os.path.join(directory, "journal"), "rb") as file:
            stored = file.read()
    reading = read_journal(stored, expect_stage_id="s", expect_journal_id="j", expect_head=head)
    assert (reading.verdict, len(reading.records), reading.valid_bytes) == (Verdict.VALID, count, len(stored))
    decoded = [(record.kind, {k: v for k, v in record.fields.items() if k not in ("prev", "at")}) for record in reading.records[1:]]
    assert decoded == player.appended
    assert [record.digest for record in reading.records] == player.heads


def _exact(kind: Kind, fields: dict):
    """The schema path alone: the reader's field check, then RFC 8785 bytes (or the refusal it raises)."""
    from journal import strictjson
    from journal.errors import Refused
    from journal.format import check_fields

    try:
        checked = check_fields(kind, dict(fields))
    except Refused as refusal:
        return refusal.sentence()
    return strictjson.canonical(checked), checked


def _values(value_type):
    """Values for one schema type: mostly of its kind and range, sometimes just outside, sometimes another type."""
    from journal.format import Integer, OneOf, Sha256

    if isinstance(value_type, Integer):
        typed = st.integers(max(0, value_type.low - 2), min(value_type.high + 2, 2**53))
    elif isinstance(value_type, OneOf):
        typed = st.one_of(st.sampled_from(value_type.members), st.from_regex(r"[ -~]{0,8}", fullmatch=True))
    elif isinstance(value_type, Sha256):
        typed = st.one_of(digests, st.from_regex(r"[0-9a-fA-F]{63,65}", fullmatch=True))
    else:
        typed = st.one_of(ids, targets, notes, st.from_regex(r'[ -~]{0,12}["\\][ -~]{0,4}', fullmatch=True))
    return st.one_of(typed, typed, typed, st.booleans(), st.none(), st.text(max_size=6), st.integers(-3, 3))


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from([kind for kind in Kind]), data=st.data())
def test_the_one_pass_writer_encodes_exactly_what_the_schema_path_would(kind, data):
    """J3, D2: the writer's one-pass payload (each value written as its canonical text, then the reader's
    one-pass layout check) gives the same bytes and fields as the schema path whenever it accepts, and accepts
    nothing the schema path refuses; what it declines (an escape, a wrong type) is left to the schema path."""
    from journal.format import KEYS, _one_pass_payload

    fields = {key: data.draw(_values(value_type)) for key, value_type in KEYS[kind]}
    if data.draw(st.integers(0, 9)) == 0:
        fields.pop(data.draw(st.sampled_from(sorted(fields))))
    elif data.draw(st.integers(0, 9)) == 0:
        fields["extra"] = 1
    fast = _one_pass_payload(kind, fields)
    exact = _exact(kind, fields)
    if fast is not None:
        assert fast == exact
    elif not isinstance(exact, str):
        assert b"\\" in exact[0], "the one-pass path declines only what needs an escape, or what is refused"


def test_the_one_pass_writer_takes_every_ordinary_record():
    """Every record the steward writes in the ordinary way (no escape needed) takes the one-pass path."""
    from journal.format import _one_pass_payload

    reading = read_journal(golden("every_kind.bin"))
    assert reading.verdict is Verdict.VALID and reading.records
    for record in reading.records:
        fast = _one_pass_payload(record.kind, record.fields)
        assert fast == (record.payload, record.fields), record.kind


@given(note=st.from_regex(r'[ -~]*["\\][ -~]*', fullmatch=True))
def test_a_note_that_needs_an_escape_is_written_escaped_by_the_schema_path(note):
    """D2: a quote or backslash in a note has one canonical form, escaped; the one-pass path never writes it."""
    from journal.format import _one_pass_payload, encode_payload

    fields = {"note": note, "prev": "a" * 64, "at": 1}
    assert _one_pass_payload(Kind.RETIRED, fields) is None
    payload, checked = encode_payload(Kind.RETIRED, fields)
    assert (payload, checked) == _exact(Kind.RETIRED, fields)
