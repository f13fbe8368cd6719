"""`casebox pack`: deterministic bytes, golden identity, producer checks, caps, create-once (DESIGN T1, T2, F1)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

from executor.transport import pack, ustar
from casebox_cli import run
from journal.errors import Refused

REPO = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = REPO / "golden" / "transport"
GOLDEN_WHEELS = sorted((GOLDEN / "wheels").iterdir())


def wheel_bytes(dist_info: str = "demo-1.0.dist-info", extra: bytes = b"") -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr(f"{dist_info}/METADATA", "Metadata-Version: 2.1\nName: demo\n")
        if extra:
            archive.writestr("demo/data.bin", extra)
    return out.getvalue()


def test_pack_of_the_golden_wheels_is_the_golden_bundle(tmp_path, capsys):
    """T1: the fixture wheels pack to the committed bundle, byte for byte, and its sha256."""
    out = tmp_path / "candidate.tar"
    code, stdout, _ = run(capsys, "pack", *map(str, GOLDEN_WHEELS), "--out", str(out))
    assert code == 0
    expected = (GOLDEN / "candidate.tar").read_bytes()
    assert out.read_bytes() == expected
    digest = (GOLDEN / "candidate.tar.sha256").read_text().split()[0]
    assert hashlib.sha256(expected).hexdigest() == digest
    assert json.loads(stdout) == {"sha256": digest, "size": len(expected)}
    assert stdout == json.dumps({"sha256": digest, "size": len(expected)}, separators=(",", ":")) + "\n"


def test_golden_transport_files_are_what_the_independent_script_writes(tmp_path):
    """T1: golden/transport/ is the output of scripts/golden_transport.py, an encoder that imports nothing of ours."""
    subprocess.run([sys.executable, "-I", str(REPO / "scripts/golden_transport.py"), str(tmp_path)], check=True)
    for path in [GOLDEN / "candidate.tar", GOLDEN / "candidate.tar.sha256", *GOLDEN_WHEELS]:
        assert (tmp_path / path.relative_to(GOLDEN)).read_bytes() == path.read_bytes(), path.name
    text = (REPO / "scripts/golden_transport.py").read_text()
    assert not any(word in text for word in ("from executor", "import executor", "from journal", "import journal"))


def test_pack_ignores_argument_order_times_modes_owner_and_umask(tmp_path):
    """T1: the same wheels give the same bytes whatever the order, mtimes, modes, umask, TZ or directory."""
    copies = tmp_path / "copies"
    copies.mkdir()
    for path in GOLDEN_WHEELS:
        shutil.copy(path, copies / path.name)
        os.utime(copies / path.name, (123456789, 123456789))
        os.chmod(copies / path.name, 0o600)
    env = dict(os.environ, TZ="Asia/Kathmandu", LC_ALL="C")
    out = tmp_path / "b.tar"
    subprocess.run(
        ["sh", "-c", 'umask 077 && exec "$@"', "sh", str(REPO / ".venv/bin/casebox"), "pack",
         *map(str, reversed(sorted(copies.iterdir()))), "--out", str(out)],
        check=True, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
    )
    assert out.read_bytes() == (GOLDEN / "candidate.tar").read_bytes()


def test_build_writes_only_fixed_fields():
    """T1: every header pack writes has the fixed mode, owner, names, time and devices, read back by the
    standard library's own tar reader (no pax or GNU record among them), and the entries come in sorted
    order under the one top-level directory, so the same wheels give the same bytes."""
    wheels = [("zeta-1.0-py3-none-any.whl", wheel_bytes()), ("alpha-1.0-py3-none-any.whl", wheel_bytes())]
    data = pack.build(wheels)
    members = ustar.scan(lambda offset, length: data[offset : offset + length], len(data))
    assert [member.path for member in members] == [
        "candidate", "candidate/alpha-1.0-py3-none-any.whl", "candidate/manifest.json", "candidate/zeta-1.0-py3-none-any.whl",
    ]
    assert len(data) % ustar.RECORD == 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        read = archive.getmembers()
        assert archive.pax_headers == {}
    assert [(info.name, info.type) for info in read] == [(member.path, tarfile.DIRTYPE if member.path == "candidate" else tarfile.REGTYPE) for member in members]
    for info in read:
        fixed = (info.mode, info.uid, info.gid, info.uname, info.gname, info.mtime, info.devmajor, info.devminor, info.pax_headers)
        assert fixed == (0o755 if info.isdir() else 0o644, 0, 0, "", "", 0, 0, 0, {}), info.name
    assert pack.build(list(reversed(wheels))) == data


def refused_pack(capsys, tmp_path, wheels: dict[str, bytes], rule: str) -> str:
    paths = []
    for name, data in wheels.items():
        (tmp_path / name).write_bytes(data)
        paths.append(str(tmp_path / name))
    out = tmp_path / "out.tar"
    code, stdout, stderr = run(capsys, "pack", *paths, "--out", str(out))
    assert code == 64 and stdout == "" and not out.exists()
    assert stderr.count("\n") == 1 and rule in stderr, stderr
    return stderr


def test_too_many_wheels_exit_64(tmp_path, capsys):
    """T2, F1: at most three wheels."""
    wheels = {f"w{i}-1.0-py3-none-any.whl": wheel_bytes() for i in range(4)}
    refused_pack(capsys, tmp_path, wheels, "takes 1 to 3 wheels, not 4")


def test_no_wheel_exits_64(capsys):
    """F1: a usage error is refused input too."""
    code, _, stderr = run(capsys, "pack", "--out", "x.tar")
    assert code == 64 and "required: WHEEL" in stderr


def test_name_too_long_exits_64(tmp_path, capsys):
    """T2, F1: a wheel name that would not fit ustar's 100-byte name field."""
    refused_pack(capsys, tmp_path, {"a" * 81 + "-1.0-py3-none-any.whl": wheel_bytes()}, "at most 100 bytes")


def test_non_ascii_name_exits_64(tmp_path, capsys):
    """T1, F1: names are ASCII."""
    refused_pack(capsys, tmp_path, {"caf\u00e9-1.0-py3-none-any.whl": wheel_bytes()}, "must be ASCII")


def test_invalid_wheel_name_exits_64(tmp_path, capsys):
    """T5, F1: pack uses the manifest's wheel-name rule."""
    refused_pack(capsys, tmp_path, {"demo.whl": wheel_bytes()}, "not a valid wheel file name")


def test_names_equal_after_case_folding_exit_64(tmp_path, capsys):
    """T4, F1: pack never writes what the reader refuses as a case-folded duplicate."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "Demo-1.0-py3-none-any.whl").write_bytes(wheel_bytes())
    (b / "demo-1.0-py3-none-any.whl").write_bytes(wheel_bytes())
    code, _, stderr = run(capsys, "pack", str(a / "Demo-1.0-py3-none-any.whl"), str(b / "demo-1.0-py3-none-any.whl"), "--out", str(tmp_path / "o"))
    assert code == 64 and "without regard to case" in stderr


def test_not_a_zip_exits_64(tmp_path, capsys):
    """Pack (producer side only) checks each wheel is a valid zip."""
    refused_pack(capsys, tmp_path, {"demo-1.0-py3-none-any.whl": b"not a zip"}, "is not a valid zip archive")


def test_zip_without_metadata_exits_64(tmp_path, capsys):
    """Pack checks each wheel has a *.dist-info/METADATA."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("demo/__init__.py", "")
        archive.writestr("deep/demo-1.0.dist-info/METADATA", "")
    refused_pack(capsys, tmp_path, {"demo-1.0-py3-none-any.whl": out.getvalue()}, "has no *.dist-info/METADATA")


def test_corrupt_metadata_exits_64(tmp_path, capsys):
    """Pack reads METADATA, so a corrupt member is a refusal, not a traceback."""
    data = bytearray(wheel_bytes())
    data[data.index(b"Metadata-Version")] ^= 0xFF
    refused_pack(capsys, tmp_path, {"demo-1.0-py3-none-any.whl": bytes(data)}, "is not a valid zip archive")


def test_wheel_over_the_member_cap_exits_64_reading_at_most_the_cap(tmp_path, capsys):
    """T2: a wheel over the member cap is refused by its size (a sparse file keeps this cheap)."""
    path = tmp_path / "big-1.0-py3-none-any.whl"
    with open(path, "wb") as handle:
        handle.truncate(ustar.MEMBER_MAX_BYTES + 1)
    code, _, stderr = run(capsys, "pack", str(path), "--out", str(tmp_path / "o.tar"))
    assert code == 64 and f"larger than its {ustar.MEMBER_MAX_BYTES}-byte cap" in stderr


def test_total_over_the_cap_is_refused(monkeypatch):
    """T2: the members' total is capped (the cap is lowered here to keep the test small)."""
    monkeypatch.setattr(ustar, "TOTAL_MAX_BYTES", 3000)
    wheels = [(f"w{i}-1.0-py3-none-any.whl", wheel_bytes(extra=bytes(1500))) for i in range(2)]
    with pytest.raises(Refused, match="over the 3000-byte cap"):
        pack.build(wheels)


def test_existing_different_output_is_refused_and_kept(tmp_path, capsys):
    """F1, E4: the bundle is created once; a different file already there is never replaced."""
    out = tmp_path / "candidate.tar"
    out.write_bytes(b"someone else's file")
    code, stdout, stderr = run(capsys, "pack", *map(str, GOLDEN_WHEELS), "--out", str(out))
    assert code == 64 and stdout == "" and "different bytes" in stderr
    assert out.read_bytes() == b"someone else's file"


def test_existing_identical_output_is_accepted(tmp_path, capsys):
    """E4: packing the same wheels again to the same file is idempotent."""
    out = tmp_path / "candidate.tar"
    assert run(capsys, "pack", *map(str, GOLDEN_WHEELS), "--out", str(out))[0] == 0
    assert run(capsys, "pack", *map(str, GOLDEN_WHEELS), "--out", str(out))[0] == 0
    assert out.read_bytes() == (GOLDEN / "candidate.tar").read_bytes()


def test_output_symlink_is_never_followed(tmp_path, capsys):
    """F3: --out naming a symlink that points outward does not write through it."""
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "b.tar").symlink_to(outside)
    code, _, stderr = run(capsys, "pack", *map(str, GOLDEN_WHEELS), "--out", str(tmp_path / "work" / "b.tar"))
    assert code == 64 and "b.tar" in stderr
    assert outside.read_bytes() == b"precious"


def test_output_directory_symlink_is_refused(tmp_path, capsys):
    """F3: the output's directory is opened without following a final symlink."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    code, _, stderr = run(capsys, "pack", *map(str, GOLDEN_WHEELS), "--out", str(tmp_path / "link" / "b.tar"))
    assert code == 64 and "not a symlink" in stderr
    assert list((tmp_path / "real").iterdir()) == []


def test_build_refuses_a_member_over_the_cap(monkeypatch):
    """T2: build itself keeps the member cap, whoever read the bytes (the cap is lowered to keep this small)."""
    monkeypatch.setattr(ustar, "MEMBER_MAX_BYTES", 1000)
    with pytest.raises(Refused, match="over the 1000-byte member cap"):
        pack.build([("demo-1.0-py3-none-any.whl", wheel_bytes(extra=bytes(2000)))])


def test_metadata_over_its_cap_is_refused(tmp_path, capsys):
    """Pack reads METADATA within a 1 MiB cap."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("demo-1.0.dist-info/METADATA", b"x" * (pack.METADATA_MAX_BYTES + 1))
    refused_pack(capsys, tmp_path, {"demo-1.0-py3-none-any.whl": out.getvalue()}, "METADATA is over 1048576 bytes")
