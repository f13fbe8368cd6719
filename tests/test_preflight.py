"""The trusted, data-only preflight and its coordinates (DESIGN T3, T2, F1)."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys

import pytest

from executor.transport import preflight, ustar
from casebox_cli import run
from journal.errors import Refused

REPO = pathlib.Path(__file__).resolve().parent.parent
PLAN = REPO / "examples" / "plan.json"


def test_preflight_prints_the_handoff_coordinate(tmp_path, capsys):
    """T3: a bundle within the cap and with the expected sha256 gives canonical coordinate JSON."""
    path = tmp_path / "b.tar"
    path.write_bytes(b"x" * 10240)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    code, out, err = run(capsys, "bundle", "preflight", str(path), "--sha256", digest)
    assert (code, err) == (0, "")
    expected = {"schema": "casebox.handoff.v1", "attempt": None, "bundle": {"sha256": digest, "size": 10240}, "plan": None}
    assert out == json.dumps(expected, sort_keys=True, separators=(",", ":")) + "\n"


def test_preflight_binds_attempt_and_plan(tmp_path, capsys):
    """T3: with --attempt and --plan the coordinate names the attempt and the plan's digest."""
    path = tmp_path / "b.tar"
    path.write_bytes(b"y")
    digest = hashlib.sha256(b"y").hexdigest()
    code, out, _ = run(capsys, "bundle", "preflight", str(path), "--sha256", digest, "--attempt", "run-42.1", "--plan", str(PLAN))
    assert code == 0
    plan_digest = run(capsys, "plan", "check", str(PLAN))[1].strip()
    assert json.loads(out) == {"schema": "casebox.handoff.v1", "attempt": "run-42.1", "bundle": {"sha256": digest, "size": 1}, "plan": plan_digest}


def test_preflight_never_parses_the_archive(tmp_path, capsys):
    """T3: bytes that are no archive at all pass preflight when their size and sha256 are right."""
    path = tmp_path / "not-a-tar"
    path.write_bytes(os.urandom(777))
    code, out, _ = run(capsys, "bundle", "preflight", str(path), "--sha256", hashlib.sha256(path.read_bytes()).hexdigest())
    assert code == 0 and json.loads(out)["bundle"]["size"] == 777


def test_the_preflight_module_loads_no_reader():
    """T3: the trusted preflight's module imports no tar reader, manifest or wheel code."""
    probe = "import sys, executor.transport.preflight; print(sorted(m for m in sys.modules if m.startswith('executor')))"
    result = subprocess.run([sys.executable, "-I", "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert eval(result.stdout) == ["executor", "executor.inputs", "executor.transport", "executor.transport.preflight", "executor.transport.ustar"]


def test_sha256_mismatch_exits_64(tmp_path, capsys):
    """T3, F1: a streaming sha256 other than the expected one is refused with one sentence."""
    path = tmp_path / "b.tar"
    path.write_bytes(b"z")
    code, out, err = run(capsys, "bundle", "preflight", str(path), "--sha256", "0" * 64)
    assert code == 64 and out == ""
    assert err == f"casebox: {path}: has sha256 {hashlib.sha256(b'z').hexdigest()}, not the expected {'0' * 64}.\n"


def test_file_over_the_cap_is_refused_without_reading(tmp_path, capsys, monkeypatch):
    """T2, T3: a regular file whose size is over the cap is refused from fstat alone."""
    path = tmp_path / "big.tar"
    with open(path, "wb") as handle:
        handle.truncate(ustar.ARCHIVE_MAX_BYTES + 1)
    reads = []
    real_read = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: reads.append(n) or real_read(fd, n))
    code, _, err = run(capsys, "bundle", "preflight", str(path), "--sha256", "0" * 64)
    assert code == 64 and "larger than the 268435456-byte archive cap" in err
    assert reads == []


def test_measure_reads_at_most_cap_plus_one_byte(tmp_path, monkeypatch):
    """T2, T3: a stream longer than the cap is refused after reading at most cap + 1 bytes."""
    path = tmp_path / "long"
    path.write_bytes(b"a" * 65536)
    total = 0
    real_read = os.read

    def counting(fd, n):
        nonlocal total
        chunk = real_read(fd, n)
        total += len(chunk)
        return chunk

    fd = os.open(path, os.O_RDONLY)
    monkeypatch.setattr(os, "read", counting)
    try:
        with pytest.raises(Refused, match="larger than the 1000-byte archive cap"):
            preflight.measure(fd, 1000)
    finally:
        os.close(fd)
    assert total == 1001


def test_measure_accepts_exactly_the_cap():
    """T2: a bundle of exactly the cap is within it."""
    read_end, write_end = os.pipe()
    os.write(write_end, b"b" * 1000)
    os.close(write_end)
    try:
        assert preflight.measure(read_end, 1000) == preflight.BundleCoordinate(hashlib.sha256(b"b" * 1000).hexdigest(), 1000)
    finally:
        os.close(read_end)


@pytest.mark.parametrize("target", ["directory", "/dev/zero", "missing"])
def test_only_a_regular_file_is_preflighted(tmp_path, capsys, target):
    """T3, F1: a directory, a device or a missing path is refused with one sentence."""
    path = {"directory": str(tmp_path), "/dev/zero": "/dev/zero", "missing": str(tmp_path / "nope")}[target]
    code, out, err = run(capsys, "bundle", "preflight", path, "--sha256", "0" * 64)
    assert code == 64 and out == "" and err.count("\n") == 1 and path in err


@pytest.mark.parametrize(
    "argv, rule",
    [
        (["--sha256", "ABC"], "--sha256: must be 64 lowercase hex digits"),
        (["--sha256", "0" * 64, "--attempt", "a1"], "are given together or not at all"),
        (["--sha256", "0" * 64, "--attempt", "../x", "--plan", str(PLAN)], "--attempt: must be an id"),
    ],
)
def test_bad_preflight_arguments_exit_64(tmp_path, capsys, argv, rule):
    """F1: malformed arguments are refused input."""
    path = tmp_path / "b.tar"
    path.write_bytes(b"")
    code, out, err = run(capsys, "bundle", "preflight", str(path), *argv)
    assert code == 64 and out == "" and rule in err


def test_the_bundle_is_hashed_as_its_private_copy_never_as_the_file_it_was_copied_from(tmp_path, monkeypatch):
    """T3: the trusted side sizes and hashes its private copy of the bundle, the bytes the extractor will read:
    a bundle file rewritten once its bytes were copied (here to the bytes the expected sha256 names) is refused,
    never handed into a sandbox holding other bytes than were hashed."""
    from executor import scratch

    given, hostile, good = tmp_path / "b.tar", b"h" * 10240, b"g" * 10240
    given.write_bytes(hostile)
    real_fchmod = os.fchmod

    def swap_after_the_copy(fd, mode):
        given.write_bytes(good)
        real_fchmod(fd, mode)

    monkeypatch.setattr(scratch.tempfile, "tempdir", str(tmp_path))
    place = scratch.Scratch()
    try:
        monkeypatch.setattr(os, "fchmod", swap_after_the_copy)
        with pytest.raises(Refused, match=f"has sha256 {hashlib.sha256(hostile).hexdigest()}, not the expected"):
            place.bundle(str(given), hashlib.sha256(good).hexdigest())
    finally:
        monkeypatch.setattr(os, "fchmod", real_fchmod)
        place.close()
