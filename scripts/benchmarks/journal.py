"""journal_append and journal_verify: the journal's durable write path and its reader, each against its anchor.

Both run on the filesystem of the checkout (a real disk, not tmpfs), in one run
with their anchors so the ratio is fair:
- journal_append: durable 512-byte appends per second through JournalWriter
  (its cap reserved on disk, as every journal is), against a bare
  pwrite+fdatasync of the same 512-byte frames into a plain file. The two
  alternate append by append, each pair in turn order, and each rate is one
  over the median time of one append, so a burst of other load on the host
  weighs on neither. It also reports the same bare appends into a file
  reserved like the journal (``reserved_anchor_value``): the reservation
  itself costs nothing per append. Goal ≥ 0.8.
- journal_verify: milliseconds to read_journal a full 262,144-byte journal of
  steward-like records, against hashlib.sha256 over the same bytes. Goal ≤ 10.
  It also reports chain_only_ms: the same walk doing nothing but unpack each
  header, slice its payload and compute its chain digest, the floor of any
  per-record reader in CPython (docs/journal-format.md, "Reading cost").
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import statistics
import tempfile
import time
from typing import Callable

from journal.format import CAP, HEADER, HEADER_BYTES, MAX_FRAME, MAX_PAYLOAD, RESERVE_START, Kind, chain_step, padded
from journal.reader import read_journal
from journal.writer import JournalWriter, reserve
from timing import median_seconds

REPO = pathlib.Path(__file__).resolve().parent.parent.parent
FRAME = 512
APPENDS = 480


def _mount_fields(number: int) -> dict:
    """A MOUNT_INTENT whose frame is exactly 512 bytes (16-digit time, 64-hex prev)."""
    op = f"m{number:05d}"
    base = len('{"at":1700000000000000,"kind":"tmpfs","op_id":"","prev":"","target":"/"}') + len(op) + 64
    return {"op_id": op, "target": "/" + "x" * (FRAME - 8 - base), "kind": "tmpfs"}


def journal_append() -> dict:
    """Journal appends and bare appends, alternating one by one so all see the same disk at the same moments."""
    fields = [_mount_fields(number) for number in range(APPENDS)]
    frame = b"\x00" * FRAME
    seconds: dict[str, list[float]] = {"journal": [], "raw": [], "reserved": []}
    with tempfile.TemporaryDirectory(prefix=".bench-journal-", dir=REPO) as directory:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        files = {
            name: os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
            for name in ("raw", "reserved")
        }
        reserve(files["reserved"])
        try:
            with JournalWriter.create(dir_fd, "journal", journal_id="bench", stage_id="bench", attempt_id="bench") as writer:
                genesis_end = writer.size
                turns = ("journal", "raw", "reserved")
                for number in range(APPENDS):
                    for what in turns[number % 3:] + turns[: number % 3]:
                        began = time.perf_counter()
                        if what == "journal":
                            writer.append(Kind.MOUNT_INTENT, fields[number])
                        else:
                            os.pwrite(files[what], frame, number * FRAME)
                            os.fdatasync(files[what])
                        seconds[what].append(time.perf_counter() - began)
                assert writer.size == genesis_end + APPENDS * FRAME, "every appended frame is 512 bytes"
        finally:
            for fd in files.values():
                os.close(fd)
            os.close(dir_fd)
    rate = {what: round(1 / statistics.median(times), 1) for what, times in seconds.items()}
    return {
        "metric": "journal_append",
        "value": rate["journal"],
        "unit": "appends/s",
        "anchor": "pwrite+fdatasync of the same 512-byte frames",
        "anchor_value": rate["raw"],
        "reserved_anchor_value": rate["reserved"],
    }


def lifecycle(writer: JournalWriter, number: int) -> None:
    """A launcher and a mount, from intent to terminal."""
    op, mount = f"p{number}", f"m{number}"
    writer.process_intent(op, "launcher", 1000 + number, 5_000_000 + number, 1000 + number)
    writer.mount_intent(mount, f"/sandbox/case-{number}/tmp", "tmpfs")
    writer.mount_done(mount, f"/sandbox/case-{number}/tmp", "tmpfs")
    writer.process_released(op)
    writer.process_terminal(op, 0, "steward")


def _pad(writer: JournalWriter, number: int, frame: int) -> None:
    """A MOUNT_INTENT whose frame is exactly ``frame`` bytes (a multiple of 8; 16-digit times)."""
    op = f"pad-{number}"
    base = len('{"at":1700000000000000,"kind":"tmpfs","op_id":"","prev":"","target":"/"}') + len(op) + 64
    writer.mount_intent(op, "/" + "x" * (frame - 8 - base), "tmpfs")


def full_journal(case: Callable[[JournalWriter, int], None] = lifecycle) -> bytes:
    """A journal of ``case`` records while a whole one fits before the reserve, padding up to the reserve,
    then both retirement records: exactly 262,144 bytes."""
    with tempfile.TemporaryDirectory(prefix=".bench-journal-", dir=REPO) as directory:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            writer = JournalWriter.create(dir_fd, "journal", journal_id="bench", stage_id="bench", attempt_id="bench")
            number, case_bytes = 0, 0
            while RESERVE_START - writer.size >= case_bytes + 512:
                number += 1
                before = writer.size
                case(writer, number)
                case_bytes = max(case_bytes, writer.size - before)
            pads = 0
            while writer.size < RESERVE_START:
                remaining = RESERVE_START - writer.size
                pads += 1
                frame = MAX_FRAME if remaining >= MAX_FRAME + 256 else remaining if remaining <= MAX_FRAME else remaining // 16 * 8
                _pad(writer, pads, frame)
            note = MAX_PAYLOAD - len('{"at":1700000000000000,"note":"","prev":""}') - 64
            writer.retirement_intent("n" * note)
            writer.retired("n" * note)
            writer.close()
        finally:
            os.close(dir_fd)
        return (pathlib.Path(directory) / "journal").read_bytes()


def _chain_only(data: bytes) -> str:
    """Each frame's header unpacked, its payload sliced and its digest chained, and nothing checked."""
    offset, previous = 0, b""
    while offset < len(data):
        length = HEADER.unpack_from(data, offset)[0]
        header, payload = data[offset : offset + HEADER_BYTES], data[offset + HEADER_BYTES : offset + HEADER_BYTES + length]
        previous = chain_step(previous, header, payload)
        head = previous.hex()
        offset += HEADER_BYTES + padded(length)
    return head


def journal_verify() -> dict:
    data = full_journal()
    reading = read_journal(data)
    assert len(data) == CAP and reading.verdict == "VALID"
    value = median_seconds(lambda: read_journal(data), repeat=15)
    anchor = median_seconds(lambda: hashlib.sha256(data).digest(), repeat=200)
    floor = median_seconds(lambda: _chain_only(data), repeat=15)
    return {
        "metric": "journal_verify",
        "value": round(value * 1000, 3),
        "unit": "ms",
        "anchor": f"hashlib.sha256 over the same {len(data)} bytes",
        "anchor_value": round(anchor * 1000, 4),
        "records": len(reading.records),
        "chain_only_ms": round(floor * 1000, 3),
    }


METRICS = {"journal_append": journal_append, "journal_verify": journal_verify}
