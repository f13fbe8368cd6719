"""Golden vectors (J6): written by an independent encoder from the spec, checked against casebox both ways."""

from __future__ import annotations

import ast
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from journal.format import Kind, time_key
from journal.reader import Verdict, read_journal
from journal.writer import JournalWriter
from journal_support import GOLDEN, REPO, vectors

VECTORS = vectors()
VALID = [vector for vector in VECTORS if vector["verdict"] == "VALID"]


def load(vector: dict) -> bytes | None:
    return (GOLDEN / vector["file"]).read_bytes() if vector["file"] else None


@pytest.mark.parametrize("vector", VECTORS, ids=[vector["id"] for vector in VECTORS])
def test_reader_gives_each_expected_verdict(vector):
    """J4, J6: the reader gives every golden vector its expected verdict, record count, valid bytes and head."""
    reading = read_journal(
        load(vector),
        expect_stage_id=vector["expect_stage_id"],
        expect_journal_id=vector["expect_journal_id"],
        expect_head=vector["expect_head"],
    )
    assert (str(reading.verdict), len(reading.records), reading.valid_bytes, reading.head) == (
        vector["verdict"], vector["records"], vector["valid_bytes"], vector["head"]
    ), reading.reason


@pytest.mark.parametrize("vector", VALID, ids=[vector["id"] for vector in VALID])
def test_writer_reproduces_each_valid_vector(tmp_path, vector):
    """J3, J6: the casebox writer, given the same records and times, writes every valid vector byte for byte."""
    data = load(vector)
    records = read_journal(data).records
    times = iter(record.fields[time_key(record.kind)] for record in records)
    genesis = records[0].fields
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with JournalWriter.create(
            dir_fd, "journal", journal_id=genesis["journal_id"], stage_id=genesis["stage_id"],
            attempt_id=genesis["attempt_id"], clock=times.__next__,
        ) as writer:
            for record in records[1:]:
                fields = {key: value for key, value in record.fields.items() if key not in ("prev", "at")}
                writer.append(record.kind, fields)
            assert writer.head == vector["head"]
    finally:
        os.close(dir_fd)
    assert (tmp_path / "journal").read_bytes() == data


def _reference_check(out: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-I", str(REPO / "scripts" / "golden_reference.py"), "--check", "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )


def test_committed_golden_files_are_what_the_reference_writes(tmp_path):
    """J6: golden/journal/ holds exactly what scripts/golden_reference.py writes from the spec now, and the
    reference's check tells a copy with one byte changed, one file missing and one file too many apart,
    naming each, so a pass of the check means the committed vectors are the spec's."""
    committed = REPO / "golden" / "journal"
    result = _reference_check(committed)
    assert result.returncode == 0, result.stderr
    spoiled = tmp_path / "journal"
    shutil.copytree(committed, spoiled)
    changed, missing = sorted(path.name for path in spoiled.glob("*.bin"))[:2]
    data = bytearray((spoiled / changed).read_bytes())
    data[-1] ^= 1
    (spoiled / changed).write_bytes(bytes(data))
    (spoiled / missing).unlink()
    (spoiled / "extra.bin").write_bytes(b"")
    result = _reference_check(spoiled)
    assert result.returncode == 1
    assert sorted(line.split(": ")[1].split(" ")[0] for line in result.stderr.splitlines()) == sorted(
        str(spoiled / name) for name in (changed, missing, "extra.bin")
    )


def test_reference_encoder_imports_only_the_standard_library():
    """J6: the reference encoder imports no casebox code, only the standard library."""
    tree = ast.parse((REPO / "scripts" / "golden_reference.py").read_text())
    modules = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    modules |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 0}
    assert modules <= set(sys.stdlib_module_names), modules - set(sys.stdlib_module_names)


def test_vectors_cover_what_the_spec_promises():
    """J6: valid vectors cover a minimal journal, every kind, the full cap and the reserve boundary; invalid
    ones cover torn tails, flips, a bad length, an unknown kind, splices, and every verdict."""
    ids = {vector["id"] for vector in VECTORS}
    assert {"minimal", "every_kind", "full_to_cap", "reserve_minus_8", "reserve_exact", "reserve_plus_8"} <= ids
    assert {"torn_header", "torn_payload", "torn_padding", "torn_zero_tail", "torn_zero_sector"} <= ids
    assert {"flip_payload_middle", "flip_payload_last", "length_4097", "unknown_kind", "spliced_frame", "spliced_journals"} <= ids
    assert {vector["verdict"] for vector in VECTORS} == {str(verdict) for verdict in Verdict}
    every = read_journal(load(next(vector for vector in VECTORS if vector["id"] == "every_kind"))).records
    assert {record.kind for record in every} == set(Kind)
    full = next(vector for vector in VECTORS if vector["id"] == "full_to_cap")
    assert full["valid_bytes"] == 262_144


def test_spec_worked_examples_match_the_golden_files():
    """J6: the hex examples in docs/journal-format.md are the golden bytes and their digests."""
    spec = (REPO / "docs" / "journal-format.md").read_text()
    minimal = read_journal((GOLDEN / "minimal.bin").read_bytes())
    every = read_journal((GOLDEN / "every_kind.bin").read_bytes())
    assert minimal.head in spec and every.records[1].digest in spec
    assert minimal.records[0].payload.decode() in spec
    assert minimal.records[0].fields["prev"] in spec
