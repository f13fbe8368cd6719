"""``casebox journal verify|show|replay`` (J4, F1): verdict lines, exit codes, JSON, tombstones, HTML."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from executor.cli import main
from journal.reader import read_journal
from journal_support import GOLDEN, REPO, golden


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["journal", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("name", "verdict", "code"),
    [
        ("every_kind.bin", "VALID", 0),
        ("torn_payload.bin", "TORN", 1),
        ("flip_payload_middle.bin", "CORRUPT", 1),
        ("over_cap_file.bin", "OVER_CAP", 1),
        ("reserve_plus_8.bin", "OVER_CAP", 1),
    ],
)
def test_verify_exits_zero_only_for_valid(capsys, name, verdict, code):
    """J4: verify prints one verdict line and exits 0 only for VALID, 1 for any other verdict."""
    result, out, err = run(capsys, "verify", str(GOLDEN / name))
    assert (result, err) == (code, "")
    assert out.count("\n") == 1 and f": {verdict}, " in out


def test_verify_json_fields(capsys):
    """J4: verify --json prints verdict, records, valid_bytes, head and reason."""
    result, out, _ = run(capsys, "verify", "--json", str(GOLDEN / "torn_header.bin"))
    reading = read_journal(golden("torn_header.bin"))
    assert result == 1
    assert json.loads(out) == {
        "verdict": "TORN", "records": len(reading.records), "valid_bytes": reading.valid_bytes,
        "head": reading.head, "reason": reading.reason,
    }


def test_verify_expect_head_and_stage(capsys):
    """J4: a head or stage other than the expected one is SUBSTITUTED, exit 1."""
    path = str(GOLDEN / "every_kind.bin")
    head = read_journal(golden("every_kind.bin")).head
    assert run(capsys, "verify", path, "--expect-head", head, "--expect-stage", "stage-1")[0] == 0
    code, out, _ = run(capsys, "verify", path, "--expect-head", "0" * 64)
    assert code == 1 and "SUBSTITUTED" in out
    code, out, _ = run(capsys, "verify", path, "--expect-stage", "stage-2")
    assert code == 1 and "SUBSTITUTED" in out


@pytest.mark.parametrize("argv", [["verify", "/nonexistent/journal"], ["show", "/nonexistent/journal"],
                                  ["replay", "/nonexistent/journal"]])
def test_unreadable_path_exits_64(capsys, argv):
    """F1: a path that cannot be read is exit 64 with one sentence naming it."""
    code, out, err = run(capsys, *argv)
    assert (code, out) == (64, "")
    assert err.count("\n") == 1 and "/nonexistent/journal" in err


def test_bad_expect_head_exits_64(capsys):
    """F1: --expect-head must be 64 lowercase hex digits."""
    code, _, err = run(capsys, "verify", str(GOLDEN / "minimal.bin"), "--expect-head", "ABC")
    assert code == 64 and "64 lowercase hex" in err


def test_tombstone_directory(capsys, tmp_path):
    """J4: a stage or tombstone directory names its journal 'journal'; without one the verdict is MISSING."""
    code, out, _ = run(capsys, "verify", str(tmp_path))
    assert code == 1 and "MISSING" in out and str(tmp_path / "journal") in out
    shutil.copy(GOLDEN / "every_kind.bin", tmp_path / "journal")
    code, out, _ = run(capsys, "verify", "--json", str(tmp_path))
    assert code == 0 and json.loads(out)["verdict"] == "VALID"


def test_tombstone_journal_symlink_is_refused(capsys, tmp_path):
    """F3: a tombstone's journal is read without following a symlink."""
    os.symlink(GOLDEN / "every_kind.bin", tmp_path / "journal")
    code, _, err = run(capsys, "verify", str(tmp_path))
    assert code == 64 and "symlink" in err


def test_show_prints_each_record_with_its_offset(capsys):
    """J4: show prints every record of the valid prefix on its own line with its offset, then the verdict."""
    reading = read_journal(golden("every_kind.bin"))
    code, out, _ = run(capsys, "show", str(GOLDEN / "every_kind.bin"))
    lines = out.splitlines()
    assert code == 0 and len(lines) == len(reading.records) + 1
    for line, record in zip(lines, reading.records):
        offset, kind = line.split()[:2]
        assert (int(offset), kind) == (record.offset, record.kind.name)
    assert 'note="cleanup CLEANED; retiring"' in out
    code, out, _ = run(capsys, "show", "--json", str(GOLDEN / "torn_payload.bin"))
    shown = json.loads(out)
    assert code == 1 and shown["verdict"] == "TORN"
    assert [entry["offset"] for entry in shown["entries"]] == [record.offset for record in reading.records[:-1]]


def test_replay_prints_the_timeline(capsys):
    """J4: replay shows processes with their wait status, mounts and unmounts, durations and the final verdict."""
    code, out, _ = run(capsys, "replay", str(GOLDEN / "every_kind.bin"))
    assert code == 0
    assert "proc-1  launcher  pid 4242" in out and "exit 0 (raw 0), reaped by steward" in out and "lived 5.000 ms" in out
    assert "mnt-1  tmpfs /sandbox/tmp" in out and "unmount umnt-1" in out and "mounted 6.250 ms" in out
    assert "helper attempt 2: CLEANED" in out
    assert out.rstrip().endswith("verdict   cleanup CLEANED, journal VALID")


def test_replay_of_a_torn_journal_claims_nothing(capsys):
    """J4: only a VALID journal supports a cleanup claim; a torn one preserves the stage."""
    code, out, _ = run(capsys, "replay", str(GOLDEN / "torn_payload.bin"))
    assert code == 1 and "journal TORN: no cleanup claim is authorized" in out


def test_replay_html_is_one_self_contained_file(capsys, tmp_path):
    """replay --html writes one HTML file with an inline SVG timeline and no network or script assets."""
    out_path = tmp_path / "timeline.html"
    code, out, _ = run(capsys, "replay", str(GOLDEN / "every_kind.bin"), "--html", str(out_path))
    page = out_path.read_text()
    assert code == 0 and "verdict   cleanup CLEANED" in out
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") == 1 and "<rect" in page
    for banned in ("http:", "https:", "//", "<script", "src=", "href=", "url(", "@import"):
        assert banned not in page.replace("<!DOCTYPE", ""), banned
    assert ["listdir", *sorted(os.listdir(tmp_path))] == ["listdir", "timeline.html"]


def test_replay_html_escapes_journal_strings(capsys, tmp_path):
    """Strings from an untrusted journal are escaped in the page."""
    from journal.format import Kind
    from journal_support import Chain

    chain = Chain().add(Kind.MOUNT_INTENT, op_id="m", target='/<script>"&', kind="bind")
    (tmp_path / "journal").write_bytes(chain.bytes())
    run(capsys, "replay", str(tmp_path), "--html", str(tmp_path / "page.html"))
    page = (tmp_path / "page.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;&quot;&amp;" in page


def test_replay_html_never_overwrites_a_different_file(capsys, tmp_path):
    """E4, F1: an existing identical page is accepted, a different one refused with 64 and left alone."""
    out_path = tmp_path / "timeline.html"
    assert run(capsys, "replay", str(GOLDEN / "every_kind.bin"), "--html", str(out_path))[0] == 0
    assert run(capsys, "replay", str(GOLDEN / "every_kind.bin"), "--html", str(out_path))[0] == 0
    before = out_path.read_bytes()
    code, _, err = run(capsys, "replay", str(GOLDEN / "minimal.bin"), "--html", str(out_path))
    assert code == 64 and "different bytes" in err and out_path.read_bytes() == before


def interpreter_for(uid: int, gid: int) -> str:
    """A Python of at least 3.11 that ``uid`` may execute (the venv's may live under root's home)."""
    for candidate in (os.path.realpath(sys.executable), shutil.which("python3") or "", "/usr/bin/python3"):
        if not candidate:
            continue
        try:
            probe = subprocess.run([candidate, "-I", "-c", "import sys; assert sys.version_info >= (3, 11)"],
                                   capture_output=True, user=uid, group=gid, extra_groups=[], timeout=30)
        except PermissionError:
            continue
        if probe.returncode == 0:
            return candidate
    pytest.skip("no Python 3.11 on this host is executable by the unprivileged test uid")


@pytest.mark.root
def test_verify_runs_unprivileged(sandbox_ids):
    """The reviewer tools need no privileges: verify runs as the unprivileged sandbox uid."""
    uid, gid = sandbox_ids
    python = interpreter_for(uid, gid)
    directory = tempfile.mkdtemp()
    try:
        os.chmod(directory, 0o755)
        shutil.copy(GOLDEN / "every_kind.bin", os.path.join(directory, "journal"))
        os.chmod(os.path.join(directory, "journal"), 0o644)
        program = f"import sys; sys.path.insert(0, {str(REPO)!r}); from executor.cli import main; sys.exit(main(sys.argv[1:]))"
        result = subprocess.run(
            [python, "-I", "-c", program, "journal", "verify", "--json", directory],
            capture_output=True, text=True, cwd="/", user=uid, group=gid, extra_groups=[], timeout=60,
        )
    finally:
        shutil.rmtree(directory)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["verdict"] == "VALID"


def test_an_oversized_file_is_read_only_one_byte_past_the_cap(capsys, tmp_path):
    """J2: the tools read at most 262,145 bytes, enough to call a longer file OVER_CAP without reading it whole."""
    from journal.files import load_for_review
    from journal.format import CAP

    path = tmp_path / "journal"
    path.write_bytes(golden("full_to_cap.bin") + b"\x01" * 100_000)
    assert len(load_for_review(str(path))[1]) == CAP + 1
    code, out, _ = run(capsys, "verify", "--json", str(tmp_path))
    assert code == 1 and json.loads(out)["verdict"] == "OVER_CAP" and json.loads(out)["records"] == 65
