"""`casebox bundle check`: members and identity, nothing written (DESIGN T4, T5, F1)."""

from __future__ import annotations

import json
import os
import pathlib

import tarforge
from casebox_cli import run
from executor.transport import bundle
from executor.cli.main import main

REPO = pathlib.Path(__file__).resolve().parent.parent
GOLDEN_BUNDLE = REPO / "golden" / "transport" / "candidate.tar"


def golden_identity() -> str:
    fd = os.open(GOLDEN_BUNDLE, os.O_RDONLY)
    try:
        return bundle.identity_of(bundle.open_bundle(fd))
    finally:
        os.close(fd)


def test_check_prints_members_and_identity_as_json(capsys):
    """T5: the member list and the candidate identity digest, as canonical JSON."""
    code, out, err = run(capsys, "bundle", "check", "--json", str(GOLDEN_BUNDLE))
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert report["identity"] == golden_identity()
    assert [member["path"] for member in report["members"]] == [
        "candidate",
        "candidate/Alpha_Tool-1.0-py3-none-any.whl",
        "candidate/beta-2.0.1-py3-none-any.whl",
        "candidate/manifest.json",
        "candidate/zeta_cli-0.1-1-py3-none-any.whl",
    ]
    assert out == json.dumps(report, sort_keys=True, separators=(",", ":")) + "\n"


def test_check_prints_a_table(capsys):
    """F1: the human form names every member and ends with the identity."""
    code, out, _ = run(capsys, "bundle", "check", str(GOLDEN_BUNDLE))
    lines = out.splitlines()
    assert code == 0 and lines[-1] == f"identity  {golden_identity()}" and len(lines) == 6
    assert lines[0].split() == ["directory", "0", "candidate"]


def test_check_writes_nothing(tmp_path, capsys, monkeypatch):
    """T4: check reads the bundle and creates no file."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "b.tar"
    path.write_bytes(GOLDEN_BUNDLE.read_bytes())
    assert run(capsys, "bundle", "check", str(path))[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.tar"]


def test_check_verifies_wheel_digests(tmp_path, capsys):
    """T5: a wheel whose bytes differ from the manifest is refused with the member named."""
    path = tmp_path / "b.tar"
    path.write_bytes(tarforge.candidate(manifest=tarforge.manifest_bytes({tarforge.WHEEL: b"WHEEL BYTES\n"})))
    code, out, err = run(capsys, "bundle", "check", str(path))
    assert code == 64 and out == ""
    assert err.startswith(f"casebox: {path} at member candidate/{tarforge.WHEEL}: has sha256 ")


def test_check_refuses_what_is_not_a_regular_file(tmp_path, capsys):
    """F1: a directory or a missing path is refused with one sentence."""
    for path in (str(tmp_path), str(tmp_path / "missing")):
        code, out, err = run(capsys, "bundle", "check", path)
        assert code == 64 and out == "" and err.count("\n") == 1 and path in err


def test_help_is_accurate(capsys):
    """F1: each command's help names its arguments."""
    for argv, words in (
        (["pack", "--help"], ["WHEEL", "--out FILE", "create"]),
        (["bundle", "preflight", "--help"], ["--sha256 HEX", "--attempt ID", "--plan PLAN", "never parse"]),
        (["bundle", "check", "--help"], ["--json", "identity digest", "write nothing"]),
    ):
        try:
            main(argv)
        except SystemExit as exit:
            assert exit.code == 0
        out = " ".join(capsys.readouterr().out.split())
        assert all(word in out for word in words), (argv, out)
