#!/usr/bin/env python3
"""Independent reference encoder for the cleanup journal (DESIGN J6).

Written from docs/journal-format.md alone, with the Python standard library
and no casebox code, so the golden vectors it writes check casebox's writer
and reader rather than repeat them. It writes golden/journal/*.bin and
golden/journal/vectors.json; with --check it writes nothing and exits 1 when
the committed files differ from what it would write.

Usage: scripts/golden_reference.py [--out DIR] [--check]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import struct
import sys

OUT = pathlib.Path(__file__).resolve().parent.parent / "golden" / "journal"

CAP = 262_144
MAX_PAYLOAD = 4_096
MAX_FRAME = 8 + MAX_PAYLOAD
RESERVE_START = CAP - 2 * MAX_FRAME

KINDS = {
    "GENESIS": 1,
    "PROCESS_INTENT": 2,
    "PROCESS_RELEASED": 3,
    "PROCESS_TERMINAL": 4,
    "DESCENDANTS_TERMINAL": 5,
    "MOUNT_INTENT": 6,
    "MOUNT_DONE": 7,
    "UNMOUNT_INTENT": 8,
    "UNMOUNT_DONE": 9,
    "HELPER_ATTEMPT": 10,
    "CLEANUP_EVIDENCE": 11,
    "RETIREMENT_INTENT": 12,
    "RETIRED": 13,
    "SANDBOX_READY": 14,
}

CREATED = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z in microseconds
STEP_US = 1_250


def canonical(obj: dict) -> bytes:
    """RFC 8785 for a flat object of ASCII strings and integers: sorted keys, no spaces."""
    parts = []
    for key in sorted(obj):
        value = obj[key]
        if isinstance(value, str):
            text = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        else:
            text = str(value)
        parts.append(f'"{key}":{text}')
    return ("{" + ",".join(parts) + "}").encode("ascii")


def genesis_digest(journal_id: str, stage_id: str) -> bytes:
    j, s = journal_id.encode("ascii"), stage_id.encode("ascii")
    return hashlib.sha256(b"casebox.journal.v1 genesis\x00" + bytes([len(j)]) + j + bytes([len(s)]) + s).digest()


def header(length: int, kind: int, version: int = 1, reserved: int = 0) -> bytes:
    return struct.pack(">IHBB", length, kind, version, reserved)


def pad(length: int) -> bytes:
    return bytes((8 - length % 8) % 8)


class Journal:
    """Encodes records in order, keeping each frame's offset and each head."""

    def __init__(self, journal_id: str = "journal-1", stage_id: str = "stage-1", attempt_id: str = "attempt-1") -> None:
        self.data = bytearray()
        self.previous = genesis_digest(journal_id, stage_id)
        self.offsets: list[int] = []
        self.heads: list[str] = []
        self.time = CREATED
        self.add("GENESIS", journal_id=journal_id, stage_id=stage_id, attempt_id=attempt_id)

    def payload(self, kind: str, fields: dict) -> bytes:
        body = dict(fields, prev=self.previous.hex())
        body["created" if kind == "GENESIS" else "at"] = self.time
        return canonical(body)

    def add(self, record_kind: str, /, **fields) -> "Journal":
        payload = self.payload(record_kind, fields)
        return self.add_raw(header(len(payload), KINDS[record_kind]), payload)

    def add_raw(self, head: bytes, payload: bytes, padding: bytes | None = None) -> "Journal":
        self.offsets.append(len(self.data))
        self.data += head + payload + (pad(len(payload)) if padding is None else padding)
        self.previous = hashlib.sha256(b"\x01" + self.previous + head + payload).digest()
        self.heads.append(self.previous.hex())
        self.time += STEP_US
        return self

    def sized_mount(self, op_id: str, frame_bytes: int) -> "Journal":
        """A MOUNT_INTENT whose frame is exactly ``frame_bytes`` (a multiple of 8) long."""
        base = len(self.payload("MOUNT_INTENT", {"op_id": op_id, "target": "/", "kind": "tmpfs"}))
        target = "/" + "f" * (frame_bytes - 8 - base)
        return self.add("MOUNT_INTENT", op_id=op_id, target=target, kind="tmpfs")

    def sized_note(self, kind: str, frame_bytes: int) -> "Journal":
        base = len(self.payload(kind, {"note": ""}))
        return self.add(kind, note="n" * (frame_bytes - 8 - base))

    def fill_to(self, end: int) -> "Journal":
        """MOUNT_INTENT records until the journal is exactly ``end`` bytes long."""
        number = 0
        while len(self.data) < end:
            remaining = end - len(self.data)
            size = MAX_FRAME if remaining >= MAX_FRAME + 256 else remaining if remaining <= MAX_FRAME else remaining // 16 * 8
            number += 1
            self.sized_mount(f"fill-{number}", size)
        return self

    def prefix(self, records: int) -> tuple[bytes, str | None]:
        end = self.offsets[records] if records < len(self.offsets) else len(self.data)
        return bytes(self.data[:end]), self.heads[records - 1] if records else None


def lifecycle(journal: Journal) -> Journal:
    """One launcher and one mount, from intent to terminal."""
    return (
        journal.add("PROCESS_INTENT", op_id="proc-1", role="launcher", pid=4242, starttime=987654, pgid=4242)
        .add("MOUNT_INTENT", op_id="mnt-1", target="/sandbox/tmp", kind="tmpfs")
        .add("MOUNT_DONE", op_id="mnt-1", target="/sandbox/tmp", kind="tmpfs")
        .add("PROCESS_RELEASED", op_id="proc-1")
        .add("PROCESS_TERMINAL", op_id="proc-1", wait_status=0, reaper="steward")
    )


def every_kind() -> Journal:
    journal = lifecycle(Journal())
    first_head = journal.heads[0]
    return (
        journal.add("DESCENDANTS_TERMINAL", op_id="proc-1", count=3)
        .add("UNMOUNT_INTENT", op_id="umnt-1", target="/sandbox/tmp", kind="tmpfs")
        .add("UNMOUNT_DONE", op_id="umnt-1", target="/sandbox/tmp", kind="tmpfs")
        .add("PROCESS_INTENT", op_id="sbx-1.init", role="namespace", pid=4243, starttime=987655, pgid=4242)
        .add("SANDBOX_READY", op_id="sbx-1.init", filter_digest="44" * 32)
        .add("PROCESS_TERMINAL", op_id="sbx-1.init", wait_status=0, reaper="steward")
        .add("HELPER_ATTEMPT", attempt=1, response_digest="ab" * 32, outcome="MISSING")
        .add("HELPER_ATTEMPT", attempt=2, response_digest="cd" * 32, outcome="CLEANED")
        .add(
            "CLEANUP_EVIDENCE",
            outcome="CLEANED",
            journal_head=first_head,
            process_inventory_digest="11" * 32,
            mount_inventory_digest="22" * 32,
            preceding_process_digest="33" * 32,
        )
        .add("RETIREMENT_INTENT", note="cleanup CLEANED; retiring")
        .add("RETIRED", note="")
    )


def flip(data: bytes, offset: int) -> bytes:
    changed = bytearray(data)
    changed[offset] ^= 0xFF
    return bytes(changed)


def vector(id_: str, comment: str, data: bytes | None, verdict: str, records: int, valid_bytes: int, head: str | None, **expect) -> dict:
    return {
        "id": id_,
        "comment": comment,
        "data": data,
        "expect_stage_id": expect.get("expect_stage_id"),
        "expect_journal_id": expect.get("expect_journal_id"),
        "expect_head": expect.get("expect_head"),
        "verdict": verdict,
        "records": records,
        "valid_bytes": valid_bytes,
        "head": head,
    }


def valid(id_: str, comment: str, journal: Journal, **expect) -> dict:
    return vector(id_, comment, bytes(journal.data), "VALID", len(journal.offsets), len(journal.data), journal.heads[-1], **expect)


def broken(id_: str, comment: str, data: bytes, verdict: str, journal: Journal, records: int, **expect) -> dict:
    """A vector whose valid prefix is the first ``records`` records of ``journal``."""
    prefix, head = journal.prefix(records)
    return vector(id_, comment, data, verdict, records, len(prefix), head, **expect)


def vectors() -> list[dict]:
    out = []
    minimal = Journal()
    out.append(valid("minimal", "GENESIS alone", minimal))
    full_kinds = every_kind()
    out.append(valid("every_kind", "one of every record kind in a legal order, ending RETIRED", full_kinds, expect_stage_id="stage-1"))
    out.append(valid("lifecycle_expected_head", "a launcher and a mount, with the expected head given", lifecycle(Journal()), expect_head=lifecycle(Journal()).heads[-1]))

    full = Journal().fill_to(RESERVE_START).sized_note("RETIREMENT_INTENT", MAX_FRAME).sized_note("RETIRED", MAX_FRAME)
    assert len(full.data) == CAP
    out.append(valid("full_to_cap", "non-retirement records end at byte 253,936; two 4,104-byte retirement records fill the cap exactly", full))
    for delta, name in ((-8, "minus_8"), (0, "exact")):
        journal = Journal().fill_to(RESERVE_START + delta)
        out.append(valid(f"reserve_{name}", f"the last non-retirement record ends {abs(delta)} bytes before the reserve" if delta else "the last non-retirement record ends exactly where the reserve starts", journal))
    over = Journal().fill_to(RESERVE_START + 8)
    out.append(broken("reserve_plus_8", "the last non-retirement record ends 8 bytes inside the reserve (8 is the alignment step)", bytes(over.data), "OVER_CAP", over, len(over.offsets) - 1))
    out.append(broken("torn_inside_reserve", "reserve_plus_8 less its last byte: placement judges records, so the cut last frame is TORN by its shape although it reaches into the reserve", bytes(over.data[:-1]), "TORN", over, len(over.offsets) - 1))
    out.append(broken("over_cap_file", "a full journal with 8 more bytes: over the 262,144-byte cap", bytes(full.data) + bytes(8), "OVER_CAP", full, len(full.offsets)))

    data = bytes(full_kinds.data)
    last = full_kinds.offsets[-1]
    count = len(full_kinds.offsets)
    out.append(broken("empty", "an empty file: GENESIS never written", b"", "TORN", full_kinds, 0))
    out.append(broken("torn_header", "cut 3 bytes into the last frame's header", data[: last + 3], "TORN", full_kinds, count - 1))
    out.append(broken("torn_payload", "cut in the middle of the last payload", data[: last + 20], "TORN", full_kinds, count - 1))
    minimal_data = bytes(minimal.data)
    out.append(broken("torn_genesis", "cut in the middle of the GENESIS payload", minimal_data[:50], "TORN", minimal, 0))
    padded_journal = Journal().add("MOUNT_INTENT", op_id="m", target="/abcdef", kind="bind")
    start = padded_journal.offsets[-1]
    payload_end = start + 8 + struct.unpack(">I", padded_journal.data[start : start + 4])[0]
    assert len(padded_journal.data) - payload_end >= 2, "the last frame needs at least 2 padding bytes"
    out.append(broken("torn_padding", "cut inside the last frame's zero padding", bytes(padded_journal.data[: payload_end + 1]), "TORN", padded_journal, 1))
    out.append(broken("torn_zero_tail", "a zero-filled last frame of 64 bytes after a valid journal", data + bytes(64), "TORN", full_kinds, count))
    out.append(broken("zero_tail_too_long", "4,112 zero bytes after a valid journal: longer than any one frame", data + bytes(4_112), "CORRUPT", full_kinds, count))
    sector = Journal().fill_to(1_024)
    sector.sized_mount("spans", 1_200)
    zeroed = bytearray(sector.data)
    zeroed[1_536 : 1_536 + 512] = bytes(512)
    out.append(broken("torn_zero_sector", "the last frame's second sector (offsets 1,536 to 2,047) reads zero", bytes(zeroed), "TORN", sector, len(sector.offsets) - 1))
    zeroed_middle = bytearray(sector.data)
    zeroed_middle[512:1_024] = bytes(512)
    intact = sum(1 for offset in sector.offsets[1:] + [len(sector.data)] if offset <= 512)
    out.append(broken("zero_sector_middle", "a sector that is not in the last frame (offsets 512 to 1,023) reads zero", bytes(zeroed_middle), "CORRUPT", sector, intact))

    second = full_kinds.offsets[1]
    out.append(broken("flip_payload_middle", "one byte of record 2's payload inverted", flip(data, second + 20), "CORRUPT", full_kinds, 1))
    out.append(broken("flip_payload_last", "one byte of the last payload inverted", flip(data, last + 20), "CORRUPT", full_kinds, count - 1))
    out.append(broken("flip_reserved", "record 2's reserved header byte set", flip(data, second + 7), "CORRUPT", full_kinds, 1))
    out.append(broken("flip_padding", "a padding byte of record 2 set", nonzero_padding(full_kinds, 1), "CORRUPT", full_kinds, 1))
    out.append(broken("bad_version", "record 2 says version 2", set_header(data, second, version=2), "CORRUPT", full_kinds, 1))
    out.append(broken("length_zero", "record 2's length is 0", set_header(data, second, length=0), "CORRUPT", full_kinds, 1))
    out.append(broken("length_4097", "record 2's length is 4,097", set_header(data, second, length=4_097), "CORRUPT", full_kinds, 1))
    out.append(broken("unknown_kind", "record 2's kind is 15", set_header(data, second, kind=15), "CORRUPT", full_kinds, 1))

    broken_chain = Journal()
    payload = canonical({"op_id": "p", "role": "launcher", "pid": 7, "starttime": 1, "pgid": 7, "prev": "00" * 32, "at": broken_chain.time})
    broken_chain.add_raw(header(len(payload), KINDS["PROCESS_INTENT"]), payload)
    out.append(broken("chain_break", "record 2's prev is not d1", bytes(broken_chain.data), "CORRUPT", broken_chain, 1))

    other = lifecycle(Journal(journal_id="journal-2", stage_id="stage-2"))
    base = lifecycle(Journal())
    spliced = bytes(base.data[: base.offsets[2]]) + bytes(other.data[other.offsets[2] : other.offsets[3]]) + bytes(base.data[base.offsets[3] :])
    out.append(broken("spliced_frame", "record 3 taken from stage-2's journal", spliced, "CORRUPT", base, 2))
    out.append(broken("spliced_journals", "stage-2's whole journal appended to stage-1's", bytes(base.data) + bytes(other.data), "CORRUPT", base, len(base.offsets)))
    out.append(broken("substituted_stage", "a valid journal of stage-2 where stage-1 is expected", bytes(other.data), "SUBSTITUTED", other, len(other.offsets), expect_stage_id="stage-1"))
    out.append(broken("substituted_journal_id", "a valid journal of journal-2 where journal-1 is expected", bytes(other.data), "SUBSTITUTED", other, len(other.offsets), expect_journal_id="journal-1"))
    stale, stale_head = base.prefix(3)
    out.append(broken("stale_head", "cut at a frame boundary while the evidence holds the later head", stale, "SUBSTITUTED", base, 3, expect_head=base.heads[-1]))

    spaced = Journal()
    payload = spaced.payload("PROCESS_RELEASED", {"op_id": "p"}).replace(b",", b", ", 1)
    spaced.add_raw(header(len(payload), KINDS["PROCESS_RELEASED"]), payload)
    out.append(broken("non_canonical", "a space after a comma in record 2's payload", bytes(spaced.data), "CORRUPT", spaced, 1))
    extra = Journal()
    payload = extra.payload("PROCESS_RELEASED", {"op_id": "p", "zz": 1})
    extra.add_raw(header(len(payload), KINDS["PROCESS_RELEASED"]), payload)
    out.append(broken("unknown_key", "record 2 has a key its kind does not freeze", bytes(extra.data), "CORRUPT", extra, 1))
    orphan = Journal().add("PROCESS_RELEASED", op_id="nobody")
    out.append(broken("unknown_operation", "PROCESS_RELEASED names no earlier PROCESS_INTENT", bytes(orphan.data), "CORRUPT", orphan, 1))
    retry = Journal().add("HELPER_ATTEMPT", attempt=1, response_digest="ab" * 32, outcome="INVALID").add("HELPER_ATTEMPT", attempt=2, response_digest="cd" * 32, outcome="CLEANED")
    out.append(broken("helper_after_invalid", "a second helper attempt after an INVALID one", bytes(retry.data), "CORRUPT", retry, 2))
    dead = lifecycle(Journal()).add("SANDBOX_READY", op_id="proc-1", filter_digest="44" * 32)
    out.append(broken("ready_after_terminal", "SANDBOX_READY for a process already terminal", bytes(dead.data), "CORRUPT", dead, len(dead.offsets) - 1))
    third = every_kind().add("RETIRED", note="again")
    out.append(broken("third_retirement", "a RETIRED record after RETIRED", bytes(third.data), "CORRUPT", third, len(third.offsets) - 1))
    late = Journal().add("PROCESS_RELEASED", op_id="x")
    no_genesis = bytes(late.data[late.offsets[1] :])
    out.append(vector("genesis_not_first", "a journal whose first record is not GENESIS", no_genesis, "CORRUPT", 0, 0, None))
    out.append(vector("missing", "no journal file at all", None, "MISSING", 0, 0, None))
    return out


def nonzero_padding(journal: Journal, record: int) -> bytes:
    data = bytearray(journal.data)
    start = journal.offsets[record]
    length = struct.unpack(">I", data[start : start + 4])[0]
    assert length % 8, "the record needs padding"
    data[start + 8 + length] = 0x01
    return bytes(data)


def set_header(data: bytes, offset: int, **fields) -> bytes:
    length, kind, version, reserved = struct.unpack(">IHBB", data[offset : offset + 8])
    new = header(fields.get("length", length), fields.get("kind", kind), fields.get("version", version), reserved)
    return data[:offset] + new + data[offset + 8 :]


def render(cases: list[dict]) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    tests = []
    for number, case in enumerate(cases, 1):
        case = dict(case)
        data = case.pop("data")
        name = None
        if data is not None:
            name = f"{case['id']}.bin"
            files[name] = data
        tests.append({"tcId": number, "id": case.pop("id"), "comment": case.pop("comment"), "file": name, **case})
    document = {
        "algorithm": "casebox-journal-v1",
        "generator": "scripts/golden_reference.py",
        "spec": "docs/journal-format.md",
        "numberOfTests": len(tests),
        "tests": tests,
    }
    files["vectors.json"] = (json.dumps(document, indent=1, sort_keys=False) + "\n").encode("ascii")
    return files


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Write the journal golden vectors from docs/journal-format.md.")
    parser.add_argument("--out", type=pathlib.Path, default=OUT, help=f"output directory (default {OUT})")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the files in --out differ")
    args = parser.parse_args(argv)
    files = render(vectors())
    if args.check:
        present = {path.name for path in args.out.iterdir()} if args.out.is_dir() else set()
        stale = sorted(present ^ set(files)) + sorted(name for name in files if name in present and (args.out / name).read_bytes() != files[name])
        for name in stale:
            print(f"golden_reference: {args.out / name} differs from what the spec gives", file=sys.stderr)
        return 1 if stale else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for path in args.out.iterdir():
        if path.name not in files:
            path.unlink()
    for name, data in files.items():
        (args.out / name).write_bytes(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
