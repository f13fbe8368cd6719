"""The reader's verdicts (J2, J3, J4): hand-written bytes, truncation, byte flips, zeroed sectors, splicing."""

from __future__ import annotations

import struct

import pytest

from journal.format import CAP, HEADER, MAX_FRAME, RESERVE_START, SECTOR, Kind, encode_header, genesis_digest, padded
from journal.reader import Verdict, read_journal
from journal.sequence import OverCap, Sequence
from journal.strictjson import canonical
from journal_support import T0, Chain, golden

CLEANED = dict(
    outcome="CLEANED",
    process_inventory_digest="1" * 64,
    mount_inventory_digest="2" * 64,
    preceding_process_digest="3" * 64,
)


def verdict(data: bytes, **expect) -> Verdict:
    return read_journal(data, **expect).verdict


def frame_ends(data: bytes) -> list[int]:
    """Offsets where each frame of a well-formed journal ends."""
    ends, offset = [], 0
    while offset < len(data):
        length = struct.unpack_from(">I", data, offset)[0]
        offset += 8 + -(-length // 8) * 8
        ends.append(offset)
    return ends


# Hand-written bytes


def test_minimal_journal_by_hand():
    """J2: a GENESIS frame is an 8-byte big-endian header, the canonical payload and zero padding."""
    chain = Chain()
    data = chain.bytes()
    length, kind, version, reserved = HEADER.unpack(data[:8])
    assert (kind, version, reserved) == (1, 1, 0)
    assert data[8 : 8 + length].startswith(b'{"attempt_id":"a-1","created":')
    assert len(data) % 8 == 0 and not any(data[8 + length :])
    reading = read_journal(data)
    assert (reading.verdict, len(reading.records), reading.valid_bytes, reading.head) == (Verdict.VALID, 1, len(data), chain.heads[0])


def test_reserved_byte_must_be_zero():
    """J2: a nonzero reserved header byte is CORRUPT."""
    chain = Chain().process()
    payload = chain.payload(Kind.PROCESS_RELEASED, op_id="p-1")
    chain.raw(Kind.PROCESS_RELEASED, payload, header=struct.pack(">IHBB", len(payload), 3, 1, 1)).process("p-2")
    reading = read_journal(chain.bytes())
    assert reading.verdict is Verdict.CORRUPT and "reserved" in reading.reason and len(reading.records) == 2


def test_padding_must_be_zero():
    """J2: padding after the payload is zero; anything else is CORRUPT, even in the last frame."""
    chain = Chain()
    payload = chain.payload(Kind.PROCESS_INTENT, op_id="p-1", role="launcher", pid=7, starttime=12, pgid=7)
    assert len(payload) % 8, "the test needs a padded payload"
    pad = bytearray(-(-len(payload) // 8) * 8 - len(payload))
    pad[-1] = 0x20
    chain.raw(Kind.PROCESS_INTENT, payload, padding=bytes(pad))
    reading = read_journal(chain.bytes())
    assert reading.verdict is Verdict.CORRUPT and "padding" in reading.reason


@pytest.mark.parametrize("length", [0, 4_097, 0xFFFF_FFFF])
def test_length_outside_one_to_4096_is_corrupt(length):
    """J2: a header length of 0 or over 4,096 is CORRUPT, also when it is the last frame."""
    chain = Chain()
    data = chain.bytes() + struct.pack(">IHBB", length, 3, 1, 0) + b'{"x":1}\x00'
    reading = read_journal(data)
    assert reading.verdict is Verdict.CORRUPT and "length" in reading.reason


@pytest.mark.parametrize("kind", [0, 15, 255, 0xFFFF])
def test_unknown_kind_is_corrupt(kind):
    """J3: an unknown record kind makes the journal CORRUPT."""
    chain = Chain()
    payload = chain.payload(Kind.PROCESS_RELEASED, op_id="p-1")
    chain.raw(kind, payload).process("p-9")
    reading = read_journal(chain.bytes())
    assert reading.verdict is Verdict.CORRUPT and "unknown record kind" in reading.reason


@pytest.mark.parametrize("version", [0, 2, 255])
def test_unknown_version_is_corrupt(version):
    """J3: any version but 1 makes the journal CORRUPT."""
    chain = Chain().process()
    payload = chain.payload(Kind.PROCESS_RELEASED, op_id="p-1")
    chain.raw(Kind.PROCESS_RELEASED, payload, header=struct.pack(">IHBB", len(payload), 3, version, 0))
    reading = read_journal(chain.bytes())
    assert reading.verdict is Verdict.CORRUPT and "version" in reading.reason


def test_chain_break_is_corrupt():
    """J2: a record whose prev is not the digest before it is CORRUPT."""
    chain = Chain().process()
    chain.add(Kind.PROCESS_RELEASED, op_id="p-1", prev="0" * 64).process("p-2")
    reading = read_journal(chain.bytes())
    assert reading.verdict is Verdict.CORRUPT and "chain is broken" in reading.reason and len(reading.records) == 2


def test_header_is_inside_the_chain():
    """J2: the header is hashed, so the same payload under another header gives another head."""
    one = Chain().add(Kind.MOUNT_INTENT, op_id="m", target="/t", kind="bind")
    two = Chain().add(Kind.MOUNT_DONE, op_id="m", target="/t", kind="bind")
    assert one.data[-len(one.data) + one.offsets[1] + 8 :] == two.data[two.offsets[1] + 8 :]
    assert one.heads[-1] != two.heads[-1]


def test_genesis_binds_journal_and_stage():
    """J2: d0 binds the journal id and the stage id, so a GENESIS whose prev is d0 of other ids is CORRUPT."""
    payload = canonical(
        {"journal_id": "j-1", "stage_id": "s-1", "attempt_id": "a-1", "created": T0, "prev": genesis_digest("j-1", "s-2").hex()}
    )
    data = encode_header(Kind.GENESIS, len(payload)) + payload + bytes(padded(len(payload)) - len(payload))
    reading = read_journal(data)
    assert reading.verdict is Verdict.CORRUPT and "chain is broken" in reading.reason


@pytest.mark.parametrize(
    "mangle",
    [
        lambda p: p.replace(b",", b", ", 1),
        lambda p: p.replace(b'{"at"', b'{ "at"', 1),
        lambda p: p + b" ",
        lambda p: p.replace(b'"op_id":"p-1"', b'"op_id":"p\\u002d1"'),
        lambda p: b'{"op_id":"p-1",' + p[1:].replace(b',"op_id":"p-1"', b""),
    ],
    ids=["space-after-comma", "space-after-brace", "trailing-space", "needless-escape", "unsorted-keys"],
)
def test_payload_must_be_canonical(mangle):
    """J3, D2: a payload that decodes but is not byte-for-byte canonical is CORRUPT."""
    chain = Chain().process()
    payload = mangle(chain.payload(Kind.PROCESS_RELEASED, op_id="p-1"))
    chain.raw(Kind.PROCESS_RELEASED, payload).process("p-2")
    reading = read_journal(chain.bytes())
    assert reading.verdict is Verdict.CORRUPT and len(reading.records) == 2, reading.reason


@pytest.mark.parametrize(
    ("kind", "fields", "rule"),
    [
        (Kind.PROCESS_RELEASED, {"op_id": "p-1", "extra": 1}, "not a known field"),
        (Kind.PROCESS_TERMINAL, {"op_id": "p-1", "reaper": "steward"}, "missing"),
        (Kind.PROCESS_TERMINAL, {"op_id": "p-1", "reaper": "steward", "wait_status": 0x7F}, "not the raw status"),
        (Kind.PROCESS_TERMINAL, {"op_id": "p-1", "reaper": "steward", "wait_status": 0x0109}, "not the raw status"),
        (Kind.PROCESS_TERMINAL, {"op_id": "p-1", "reaper": "nobody", "wait_status": 0}, "one of"),
        (Kind.PROCESS_TERMINAL, {"op_id": "p-1", "reaper": "steward", "wait_status": True}, "an integer"),
        (Kind.PROCESS_INTENT, {"op_id": "p-2", "role": "launcher", "pid": 0, "starttime": 1, "pgid": 1}, "from 1"),
        (Kind.PROCESS_INTENT, {"op_id": "p-2", "role": "launcher", "pid": 4_194_305, "starttime": 1, "pgid": 1}, "from 1"),
        (Kind.PROCESS_INTENT, {"op_id": "p 2", "role": "launcher", "pid": 9, "starttime": 1, "pgid": 9}, "an id"),
        (Kind.PROCESS_INTENT, {"op_id": "p-2", "role": "root", "pid": 9, "starttime": 1, "pgid": 9}, "one of"),
        (Kind.MOUNT_INTENT, {"op_id": "m", "target": "/a/../b", "kind": "bind"}, "normalized"),
        (Kind.MOUNT_INTENT, {"op_id": "m", "target": "/a/", "kind": "bind"}, "normalized"),
        (Kind.MOUNT_INTENT, {"op_id": "m", "target": "a/b", "kind": "bind"}, "normalized"),
        (Kind.MOUNT_INTENT, {"op_id": "m", "target": "/a b", "kind": "bind"}, "normalized"),
        (Kind.MOUNT_INTENT, {"op_id": "m", "target": "/a", "kind": "overlay"}, "one of"),
        (Kind.HELPER_ATTEMPT, {"attempt": 1, "response_digest": "A" * 64, "outcome": "MISSING"}, "hex"),
        (Kind.HELPER_ATTEMPT, {"attempt": 0, "response_digest": "a" * 64, "outcome": "MISSING"}, "from 1"),
        (Kind.RETIREMENT_INTENT, {"note": "tab\there"}, "printable"),
    ],
)
def test_payload_schema_is_frozen(kind, fields, rule):
    """J3: every key of every kind is frozen with its type and limits; a payload outside them is CORRUPT."""
    chain = Chain().process()
    chain.add(kind, **fields)
    reading = read_journal(chain.bytes())
    assert reading.verdict is Verdict.CORRUPT and rule in reading.reason, reading.reason
    assert len(reading.records) == 2


def test_non_ascii_payload_is_corrupt():
    """J3: every payload string is ASCII in this version."""
    chain = Chain().process().add(Kind.RETIREMENT_INTENT, note="café")
    assert verdict(chain.bytes()) is Verdict.CORRUPT


# Sequence rules


@pytest.mark.parametrize(
    ("build", "rule"),
    [
        (lambda c: c.add(Kind.GENESIS, journal_id="j-1", stage_id="s-1", attempt_id="a-1"), "only be the first"),
        (lambda c: c.process("p-1").process("p-1"), "already the id"),
        (lambda c: c.process().add(Kind.MOUNT_INTENT, op_id="p-1", target="/t", kind="bind"), "already the id"),
        (lambda c: c.add(Kind.PROCESS_RELEASED, op_id="p-1"), "names no earlier PROCESS_INTENT"),
        (lambda c: c.process().add(Kind.PROCESS_TERMINAL, op_id="p-1", wait_status=0, reaper="steward")
            .add(Kind.PROCESS_TERMINAL, op_id="p-1", wait_status=0, reaper="steward"), "already has a PROCESS_TERMINAL"),
        (lambda c: c.process().add(Kind.PROCESS_TERMINAL, op_id="p-1", wait_status=9, reaper="steward")
            .add(Kind.PROCESS_RELEASED, op_id="p-1"), "already terminal"),
        (lambda c: c.process().add(Kind.DESCENDANTS_TERMINAL, op_id="p-1", count=1)
            .add(Kind.DESCENDANTS_TERMINAL, op_id="p-1", count=2), "already has a DESCENDANTS_TERMINAL"),
        (lambda c: c.add(Kind.MOUNT_INTENT, op_id="m", target="/t", kind="bind")
            .add(Kind.MOUNT_DONE, op_id="m", target="/u", kind="bind"), "differs from the target"),
        (lambda c: c.add(Kind.MOUNT_INTENT, op_id="m", target="/t", kind="bind")
            .add(Kind.MOUNT_DONE, op_id="m", target="/t", kind="tmpfs"), "differs from the kind"),
        (lambda c: c.add(Kind.MOUNT_INTENT, op_id="m", target="/t", kind="bind")
            .add(Kind.MOUNT_DONE, op_id="m", target="/t", kind="bind")
            .add(Kind.MOUNT_DONE, op_id="m", target="/t", kind="bind"), "already has a MOUNT_DONE"),
        (lambda c: c.add(Kind.MOUNT_INTENT, op_id="m", target="/t", kind="bind")
            .add(Kind.UNMOUNT_DONE, op_id="m", target="/t", kind="bind"), "names no earlier UNMOUNT_INTENT"),
        (lambda c: c.process().add(Kind.MOUNT_DONE, op_id="p-1", target="/t", kind="bind"), "names no earlier MOUNT_INTENT"),
        (lambda c: c.add(Kind.HELPER_ATTEMPT, attempt=2, response_digest="a" * 64, outcome="MISSING"), "must be 1"),
        (lambda c: c.add(Kind.HELPER_ATTEMPT, attempt=1, response_digest="a" * 64, outcome="UNVERIFIED")
            .add(Kind.HELPER_ATTEMPT, attempt=2, response_digest="a" * 64, outcome="MISSING"), "only MISSING permits"),
        (lambda c: c.add(Kind.CLEANUP_EVIDENCE, journal_head="f" * 64, **CLEANED), "not a head this journal had"),
        (lambda c: c.add(Kind.RETIRED, note=""), "must follow RETIREMENT_INTENT"),
        (lambda c: c.add(Kind.RETIREMENT_INTENT, note="").add(Kind.RETIREMENT_INTENT, note=""), "only RETIRED may"),
        (lambda c: c.add(Kind.RETIREMENT_INTENT, note="").process(), "only RETIRED may"),
        (lambda c: c.add(Kind.RETIREMENT_INTENT, note="").add(Kind.RETIRED, note="").add(Kind.RETIRED, note=""), "cannot follow RETIRED"),
        (lambda c: c.add(Kind.RETIREMENT_INTENT, note="").add(Kind.RETIRED, note="")
            .add(Kind.RETIREMENT_INTENT, note=""), "cannot follow RETIRED"),
    ],
    ids=[
        "second-genesis", "reused-process-op", "reused-op-across-kinds", "release-unknown-op", "double-terminal",
        "release-after-terminal", "double-descendants", "done-other-target", "done-other-kind", "double-mount-done",
        "unmount-done-for-mount", "mount-done-for-process", "helper-starts-at-2", "helper-after-unverified",
        "cleanup-foreign-head", "retired-without-intent", "two-intents", "record-after-intent",
        "third-retirement-record", "intent-after-retired",
    ],
)
def test_sequence_rules(build, rule):
    """J1, C5, C6, C4: a well-formed record in a place the sequence forbids makes the journal CORRUPT."""
    chain = build(Chain())
    reading = read_journal(chain.bytes())
    assert reading.verdict is Verdict.CORRUPT and rule in reading.reason, reading.reason
    assert len(reading.records) == len(chain.offsets) - 1


def test_first_record_must_be_genesis():
    """J2: a journal that does not start with GENESIS is CORRUPT."""
    chain = Chain().process()
    reading = read_journal(chain.bytes()[chain.offsets[1] :])
    assert reading.verdict is Verdict.CORRUPT and "starts with GENESIS" in reading.reason


def test_cleanup_evidence_binds_an_earlier_head():
    """C4: CLEANUP_EVIDENCE may bind any head the journal had before it."""
    chain = Chain().process()
    chain.add(Kind.CLEANUP_EVIDENCE, journal_head=chain.heads[0], **CLEANED)
    assert verdict(chain.bytes()) is Verdict.VALID


# Caps


def filled(end: int) -> Chain:
    """A journal of MOUNT_INTENT records ending exactly at ``end``."""
    chain = Chain()
    number = 0
    while len(chain.data) < end:
        remaining = end - len(chain.data)
        size = MAX_FRAME if remaining >= MAX_FRAME + 256 else remaining if remaining <= MAX_FRAME else remaining // 16 * 8
        number += 1
        base = len(chain.payload(Kind.MOUNT_INTENT, op_id=f"f{number}", target="/", kind="tmpfs"))
        chain.add(Kind.MOUNT_INTENT, op_id=f"f{number}", target="/" + "x" * (size - 8 - base), kind="tmpfs")
    return chain


def test_non_retirement_record_inside_the_reserve_is_over_cap():
    """J2: a record other than the two retirement records ending inside the 8,208-byte reserve is OVER_CAP."""
    inside = filled(RESERVE_START + 8)
    reading = read_journal(inside.bytes())
    assert reading.verdict is Verdict.OVER_CAP and "reserve" in reading.reason
    assert reading.valid_bytes == inside.offsets[-1]
    assert verdict(filled(RESERVE_START).bytes()) is Verdict.VALID


def test_a_cut_last_frame_is_judged_by_its_shape_not_by_the_end_it_declares():
    """J2, J4: placement judges records, complete frames; a last frame cut short is TORN by its shape even when
    its header declares a non-retirement record ending inside the reserve, or a record ending past the cap."""
    valid = filled(RESERVE_START)
    cut = struct.pack(">IHBB", 3_400, Kind.MOUNT_INTENT, 1, 0) + b'{"at":1,"kind":"bind","op_id":"m"'
    reading = read_journal(valid.bytes() + cut)
    assert (reading.verdict, len(reading.records), reading.valid_bytes, reading.head) == (
        Verdict.TORN, len(valid.offsets), RESERVE_START, valid.heads[-1]
    ), reading.reason
    retired = filled(RESERVE_START)
    base = len(retired.payload(Kind.RETIREMENT_INTENT, note=""))
    retired.add(Kind.RETIREMENT_INTENT, note="n" * (MAX_FRAME - 8 - base)).add(Kind.RETIRED, note="")
    cut = struct.pack(">IHBB", 4_096, Kind.RETIRED, 1, 0) + b'{"at":1,"note":"nn'
    assert len(retired.data) + HEADER.size + 4_096 > CAP >= len(retired.data) + len(cut)
    reading = read_journal(retired.bytes() + cut)
    assert (reading.verdict, len(reading.records), reading.valid_bytes) == (Verdict.TORN, len(retired.offsets), len(retired.data))


def test_retirement_records_may_use_the_reserve():
    """J2: RETIREMENT_INTENT and RETIRED of 4,104 bytes each fill the journal to exactly 262,144 bytes."""
    chain = filled(RESERVE_START)
    for kind in (Kind.RETIREMENT_INTENT, Kind.RETIRED):
        base = len(chain.payload(kind, note=""))
        chain.add(kind, note="n" * (MAX_FRAME - 8 - base))
    assert len(chain.data) == CAP
    assert verdict(chain.bytes()) is Verdict.VALID


def test_file_over_the_cap_is_over_cap():
    """J2: more than 262,144 bytes is OVER_CAP whatever they hold, and the prefix within the cap is still reported."""
    data = filled(RESERVE_START).bytes()
    reading = read_journal(data + bytes(CAP + 1 - len(data)))
    assert reading.verdict is Verdict.OVER_CAP and reading.valid_bytes == RESERVE_START


def test_no_record_ends_past_the_cap():
    """J2: the sequence refuses any record, retirement included, that would end past byte 262,144."""
    sequence = Sequence()
    sequence.check_bounds(Kind.RETIRED, CAP)
    with pytest.raises(OverCap):
        sequence.check_bounds(Kind.RETIRED, CAP + 8)


# Expectations


def test_substituted_stage_journal_and_head():
    """J4: a chain bound to another stage or journal id, or ending at another head, is SUBSTITUTED."""
    chain = Chain().process()
    data = chain.bytes()
    assert verdict(data, expect_stage_id="s-1", expect_journal_id="j-1", expect_head=chain.heads[-1]) is Verdict.VALID
    assert verdict(data, expect_stage_id="s-2") is Verdict.SUBSTITUTED
    assert verdict(data, expect_journal_id="j-2") is Verdict.SUBSTITUTED
    assert verdict(data, expect_head=chain.heads[0]) is Verdict.SUBSTITUTED


def test_torn_journal_of_another_stage_is_substituted():
    """J4: binding is checked on a torn journal too; the wrong stage outranks TORN."""
    data = Chain().process().bytes()[:-5]
    assert verdict(data) is Verdict.TORN
    assert verdict(data, expect_stage_id="s-2") is Verdict.SUBSTITUTED


def test_missing():
    """J4: no journal at all is MISSING."""
    reading = read_journal(None)
    assert (reading.verdict, reading.records, reading.head) == (Verdict.MISSING, (), None)


# Torn or corrupt: what a crash can leave, and what it cannot


def test_zero_filled_tail_is_torn_but_only_up_to_one_frame():
    """J4: zeros after the last frame are a torn frame only while they could be one frame."""
    data = Chain().process().bytes()
    assert verdict(data + bytes(MAX_FRAME)) is Verdict.TORN
    reading = read_journal(data + bytes(MAX_FRAME + 8))
    assert reading.verdict is Verdict.CORRUPT and reading.reason.endswith(
        f": the zero-filled tail ({MAX_FRAME + 8} bytes) is longer than any one frame ({MAX_FRAME})"
    ), reading.reason


def test_zero_header_before_nonzero_bytes_is_corrupt():
    """J4: a zero header followed by data is damage, not a torn tail."""
    chain = Chain().process().process("p-2")
    data = bytearray(chain.data)
    data[chain.offsets[1] : chain.offsets[1] + 8] = bytes(8)
    assert verdict(bytes(data)) is Verdict.CORRUPT


def test_incomplete_frame_over_foreign_bytes_is_corrupt():
    """J4: a length that runs past the end over another frame's header is not a torn write."""
    chain = Chain().process().process("p-2")
    data = bytearray(chain.data)
    data[chain.offsets[1] + 2 : chain.offsets[1] + 4] = struct.pack(">H", 4_000)
    reading = read_journal(bytes(data))
    assert reading.verdict is Verdict.CORRUPT and "past the end" in reading.reason


def test_zeroed_sector_counts_as_torn_only_in_the_last_frame():
    """J4: a zero sector in a complete frame is TORN only when that frame is the last one."""
    chain = Chain()
    chain.add(Kind.MOUNT_INTENT, op_id="m", target="/" + "x" * 1_200, kind="bind")
    data = bytearray(chain.data)
    data[SECTOR : SECTOR * 2] = bytes(SECTOR)
    assert verdict(bytes(data)) is Verdict.TORN
    chain.process()
    data = bytearray(chain.data)
    data[SECTOR : SECTOR * 2] = bytes(SECTOR)
    assert verdict(bytes(data)) is Verdict.CORRUPT


def test_damaged_last_frame_without_a_zero_sector_is_corrupt():
    """J4: a complete last frame that fails its checks with no zero sector is CORRUPT, not TORN."""
    chain = Chain().process()
    data = bytearray(chain.data)
    data[chain.offsets[1] + 12] = ord("Z")
    assert verdict(bytes(data)) is Verdict.CORRUPT


def test_empty_file_is_torn():
    """J4: an empty journal file is a GENESIS that was never written: TORN, with no head."""
    reading = read_journal(b"")
    assert (reading.verdict, reading.records, reading.head) == (Verdict.TORN, (), None)


# Torture: every offset, every byte, every sector


def test_truncation_at_every_offset():
    """J4: a golden journal cut at a frame boundary is VALID with fewer records; cut anywhere else it is TORN."""
    data = golden("every_kind.bin")
    ends = frame_ends(data)
    full = read_journal(data)
    for size in range(len(data) + 1):
        reading = read_journal(data[:size])
        if size in ends:
            count = ends.index(size) + 1
            assert (reading.verdict, len(reading.records), reading.head) == (Verdict.VALID, count, full.records[count - 1].digest)
        else:
            assert reading.verdict is Verdict.TORN, size
            assert len(reading.records) == sum(1 for end in ends if end <= size)


def test_flip_every_byte():
    """J4: inverting any one byte never leaves a VALID journal; TORN only when the byte is in the last frame."""
    data = golden("every_kind.bin")
    last = frame_ends(data)[-2]
    for offset in range(len(data)):
        changed = bytearray(data)
        changed[offset] ^= 0xFF
        result = verdict(bytes(changed))
        if offset < last:
            assert result is Verdict.CORRUPT, offset
        else:
            assert result in (Verdict.CORRUPT, Verdict.TORN), offset


def test_flip_every_bit_with_the_expected_head():
    """J4: with the head kept outside the file, no single-bit change anywhere is VALID."""
    data = golden("lifecycle_expected_head.bin")
    head = read_journal(data).head
    for offset in range(len(data)):
        for bit in range(8):
            changed = bytearray(data)
            changed[offset] ^= 1 << bit
            assert verdict(bytes(changed), expect_head=head) is not Verdict.VALID, (offset, bit)


def test_zero_each_sector():
    """J4: zeroing any 512-byte sector is never VALID; it is CORRUPT before the last frame and TORN inside it."""
    chain = Chain()
    for number in range(12):
        chain.process(f"p-{number}").add(Kind.MOUNT_INTENT, op_id=f"m-{number}", target="/" + "t" * (40 * number), kind="bind")
    chain.add(Kind.RETIREMENT_INTENT, note="n" * 1_500)
    data = chain.bytes()
    last = chain.offsets[-1]
    for start in range(0, len(data), SECTOR):
        changed = bytearray(data)
        changed[start : start + SECTOR] = bytes(len(changed[start : start + SECTOR]))
        reading = read_journal(bytes(changed))
        assert reading.verdict is not Verdict.VALID, start
        if start + SECTOR <= last:
            assert reading.verdict is Verdict.CORRUPT, start
        elif start >= last + 8:
            assert (reading.verdict, reading.valid_bytes) == (Verdict.TORN, last), start
        else:
            assert reading.verdict in (Verdict.TORN, Verdict.CORRUPT) and reading.valid_bytes <= start, start


def test_splicing_two_stages_is_never_valid():
    """J2: frames of two valid journals of different stages, spliced at any frame boundaries, never read VALID."""
    one = Chain(stage_id="s-1").process().add(Kind.MOUNT_INTENT, op_id="m", target="/t", kind="bind")
    two = Chain(stage_id="s-2").process().add(Kind.MOUNT_INTENT, op_id="m", target="/t", kind="bind")
    a, b = one.bytes(), two.bytes()
    cuts_a = [*one.offsets, len(a)]
    cuts_b = [*two.offsets, len(b)]
    for i in cuts_a:
        for j in cuts_b:
            for k in cuts_b:
                if j < k:
                    inserted = a[:i] + b[j:k] + a[i:]
                    assert verdict(inserted) is not Verdict.VALID, (i, j, k)
            if 0 < i and 0 < j < len(b):
                assert verdict(a[:i] + b[j:]) is not Verdict.VALID, (i, j)
