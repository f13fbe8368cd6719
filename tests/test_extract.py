"""The hardened extractor: descriptor-relative, preflight first, all or nothing (DESIGN T4, F3)."""

from __future__ import annotations

import os
import pathlib
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest

import tarforge
from executor.transport import bundle, extract, identity
from journal.errors import Refused

REPO = pathlib.Path(__file__).resolve().parent.parent
GOLDEN_BUNDLE = REPO / "golden" / "transport" / "candidate.tar"
WHEELS = {"a-1.0-py3-none-any.whl": b"A" * 5000, "b-2.0-py3-none-any.whl": os.urandom(3 * 1024 * 1024 + 7)}


def open_dir(path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


def extract_bytes(data: bytes, target: pathlib.Path) -> bundle.Bundle:
    target.mkdir(exist_ok=True)
    archive_fd, target_fd = tarforge.memfd(data), open_dir(target)
    try:
        return extract.extract(archive_fd, target_fd)
    finally:
        os.close(archive_fd)
        os.close(target_fd)


def tree(root: pathlib.Path) -> dict[str, tuple[int, bytes | None]]:
    result = {}
    for path in sorted(root.rglob("*")):
        status = path.lstat()
        result[str(path.relative_to(root))] = (stat.S_IMODE(status.st_mode), path.read_bytes() if path.is_file() else None)
    return result


def test_extracts_files_read_only_and_directories_sealed_once_filled(tmp_path):
    """T4: files are 0444 and directories 0555, with exactly the bundle's bytes."""
    data = tarforge.candidate(WHEELS)
    extract_bytes(data, tmp_path / "t")
    got = tree(tmp_path / "t")
    assert got == {
        "candidate": (0o555, None),
        "candidate/a-1.0-py3-none-any.whl": (0o444, WHEELS["a-1.0-py3-none-any.whl"]),
        "candidate/b-2.0-py3-none-any.whl": (0o444, WHEELS["b-2.0-py3-none-any.whl"]),
        "candidate/manifest.json": (0o444, tarforge.manifest_bytes(WHEELS)),
    }
    candidate_fd = open_dir(tmp_path / "t" / "candidate")
    try:
        assert identity.digest_directory(candidate_fd) == bundle.identity_of(bundle.open_bundle(tarforge.memfd(data)))
    finally:
        os.close(candidate_fd)


def test_the_golden_bundle_extracts(tmp_path):
    """T1, T4: what pack writes, the extractor accepts."""
    checked = extract_bytes(GOLDEN_BUNDLE.read_bytes(), tmp_path / "t")
    assert sorted(p.name for p in (tmp_path / "t" / "candidate").iterdir()) == sorted(
        [w.file for w in checked.manifest.wheels] + ["manifest.json"]
    )


def test_target_must_be_empty(tmp_path):
    """T4: extraction only into an empty directory, whose contents it never touches."""
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "keep").write_bytes(b"keep")
    with pytest.raises(Refused, match="must be empty"):
        extract_bytes(tarforge.candidate(), tmp_path / "t")
    assert tree(tmp_path / "t") == {"keep": (0o644, b"keep")}


def test_a_planted_symlink_is_never_followed(tmp_path):
    """F3: a symlink named candidate pointing outward is outside; nothing is written through it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "candidate").symlink_to(outside)
    with pytest.raises(Refused):
        extract_bytes(tarforge.candidate(), tmp_path / "t")
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("kind", ["file", "symlink"])
def test_file_creation_never_reuses_or_follows_an_existing_name(tmp_path, kind):
    """T4, F3: files are created O_CREAT|O_EXCL|O_NOFOLLOW relative to their directory's descriptor."""
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious")
    (tmp_path / "d").mkdir()
    if kind == "file":
        (tmp_path / "d" / "x").write_bytes(b"existing")
    else:
        (tmp_path / "d" / "x").symlink_to(outside)
    dir_fd = open_dir(tmp_path / "d")
    try:
        with pytest.raises(Refused, match="already exists"):
            extract.create_file(dir_fd, "x")
    finally:
        os.close(dir_fd)
    assert outside.read_bytes() == b"precious"
    assert kind == "symlink" or (tmp_path / "d" / "x").read_bytes() == b"existing"


def test_a_digest_mismatch_in_the_last_wheel_leaves_the_target_empty(tmp_path):
    """T4: a wheel that fails its digest after others were written: everything written is removed."""
    lying = dict(WHEELS)
    lying["b-2.0-py3-none-any.whl"] = b"B" * len(WHEELS["b-2.0-py3-none-any.whl"])
    data = tarforge.candidate(WHEELS, manifest=tarforge.manifest_bytes(lying))
    with pytest.raises(Refused, match="member candidate/b-2.0-py3-none-any.whl: has sha256"):
        extract_bytes(data, tmp_path / "t")
    assert list((tmp_path / "t").iterdir()) == []


def test_nothing_is_written_before_the_whole_preflight_passes(tmp_path, monkeypatch):
    """T4: a bad last header refuses the bundle before the first directory or file is created."""
    extra = ("candidate/zz", tarforge.member("candidate/zz", typeflag=b"2", linkname=b"/etc/passwd"))
    archive_fd, target_fd = tarforge.memfd(tarforge.candidate(extra=(extra,))), open_dir(tmp_path)
    created = []
    real_mkdir, real_open = os.mkdir, os.open
    monkeypatch.setattr(os, "mkdir", lambda *a, **k: (created.append(a[0]), real_mkdir(*a, **k))[1])
    monkeypatch.setattr(os, "open", lambda path, flags, *a, **k: (created.append(path) if flags & os.O_CREAT else None, real_open(path, flags, *a, **k))[1])
    try:
        with pytest.raises(Refused, match="symbolic link"):
            extract.extract(archive_fd, target_fd)
    finally:
        os.close(archive_fd)
        os.close(target_fd)
    assert created == []


@pytest.mark.parametrize(
    "data",
    [
        tarforge.candidate(extra=(("candidate/zz", tarforge.member("candidate/zz", typeflag=b"1", linkname=b"candidate/manifest.json")),)),
        tarforge.candidate(extra=(("candidate/zz", tarforge.member("candidate/zz", uid=tarforge.octal(1, 8))),)),
        tarforge.candidate() + b"\x01" + bytes(511),
        tarforge.candidate(manifest=b"{}"),
    ],
    ids=["hardlink", "uid", "trailing-data", "bad-manifest"],
)
def test_refused_extractions_leave_the_target_empty(tmp_path, data):
    """T4: any refusal leaves the target directory as empty as it was."""
    with pytest.raises(Refused):
        extract_bytes(data, tmp_path / "t")
    assert list((tmp_path / "t").iterdir()) == []


def sandbox_copy() -> pathlib.Path:
    """Only the files the extractor declares, in a directory any UID can read."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="casebox-extractor-"))
    os.chmod(root, 0o755)
    for relative in extract.SANDBOX_MODULES:
        (root / relative).parent.mkdir(exist_ok=True)
        os.chmod((root / relative).parent, 0o755)
        shutil.copy(REPO / relative, root / relative)
        os.chmod(root / relative, 0o644)
    return root


RUNNER = (
    "import sys; sys.path[:0] = [sys.argv[1]]; from executor.transport.extract import main; code = main(sys.argv[2:]); "
    "print(sorted(m for m in sys.modules if m.split('.')[0] in ('executor', 'journal', 'launcher', 'steward')), file=sys.stderr) if code == 0 else None; "
    "sys.exit(code)"
)


def run_isolated(data: bytes, target: pathlib.Path, python: str = os.path.realpath(sys.executable), **kwargs) -> subprocess.CompletedProcess:
    root = sandbox_copy()
    archive_fd, target_fd = tarforge.memfd(data), open_dir(target)
    try:
        return subprocess.run(
            [python, "-I", "-S", "-c", RUNNER, str(root), str(archive_fd), str(target_fd)],
            pass_fds=(archive_fd, target_fd), capture_output=True, text=True, **kwargs,
        )
    finally:
        os.close(archive_fd)
        os.close(target_fd)
        shutil.rmtree(root)


def test_the_declared_module_set_is_all_the_extractor_needs(tmp_path):
    """T4: under python -I -S, with only SANDBOX_MODULES on its path, the extractor runs and imports exactly them."""
    (tmp_path / "t").mkdir()
    result = run_isolated(tarforge.candidate(WHEELS), tmp_path / "t")
    assert result.returncode == 0, result.stderr
    imported = {name.replace(".", "/") for name in eval(result.stderr)}
    declared = {relative.removesuffix(".py").removesuffix("/__init__") for relative in extract.SANDBOX_MODULES}
    assert imported == declared
    assert sorted(p.name for p in (tmp_path / "t" / "candidate").iterdir()) == sorted([*WHEELS, "manifest.json"])


def test_the_entry_point_refuses_with_64_and_one_sentence(tmp_path):
    """F1: a refused bundle ends the extractor with exit 64 and one sentence naming the member and rule."""
    (tmp_path / "t").mkdir()
    extra = ("candidate/zz", tarforge.member("candidate/zz", typeflag=b"2", linkname=b"/etc"))
    result = run_isolated(tarforge.candidate(extra=(extra,)), tmp_path / "t")
    assert result.returncode == 64 and result.stdout == ""
    assert result.stderr == "casebox: member candidate/zz: typeflag '2' (symbolic link) is not allowed; only '0' regular file and '5' directory are.\n"
    assert list((tmp_path / "t").iterdir()) == []


def test_the_entry_point_refuses_bad_arguments():
    """F1: the entry point takes exactly two descriptors."""
    assert extract.main(["3"]) == 64
    assert extract.main(["x", "y"]) == 64


HOST_PYTHON = "/usr/bin/python3"


@pytest.mark.root
@pytest.mark.skipif(not os.path.exists(HOST_PYTHON), reason="no host /usr runtime")
def test_extraction_as_the_dedicated_uid_leaves_a_tree_it_cannot_change(tmp_path, sandbox_ids):
    """T4: under the host /usr runtime and the dedicated UID, the extracted tree is read-only to that UID."""
    uid, gid = sandbox_ids
    target = pathlib.Path(tempfile.mkdtemp(prefix="casebox-target-"))
    try:
        os.chown(target, uid, gid)
        result = run_isolated(tarforge.candidate(WHEELS), target, HOST_PYTHON, user=uid, group=gid, extra_groups=[])
        assert result.returncode == 0, result.stderr
        candidate = target / "candidate"
        assert candidate.stat().st_uid == uid and stat.S_IMODE(candidate.stat().st_mode) == 0o555
        probe = subprocess.run(
            [HOST_PYTHON, "-I", "-S", "-c", "import sys; open(sys.argv[1], 'w')", str(candidate / "new")],
            user=uid, group=gid, extra_groups=[], capture_output=True,
        )
        assert probe.returncode != 0 and b"PermissionError" in probe.stderr
    finally:
        shutil.rmtree(target)
