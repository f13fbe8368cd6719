"""The candidate identity digest: golden vectors, tree and bundle agree (DESIGN T5, T3, J6-style golden)."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys

import pytest

import tarforge
from executor.transport import bundle, identity, ustar
from journal.errors import Refused

REPO = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = REPO / "golden" / "identity"
VECTORS = json.loads((GOLDEN / "vectors.json").read_text())["vectors"]


def encode(records) -> tuple[bytes, str]:
    stream = bytearray()
    hasher = hashlib.sha256()

    def both(chunk):
        stream.extend(chunk)
        hasher.update(chunk)

    writer = identity.IdentityWriter(len(records), both)
    for record in records:
        assert record["state"] == "present"
        content = bytes.fromhex(record["content_hex"])
        writer.present(record["path"], executable=record["executable"], length=len(content))
        for start in range(0, len(content), 1000):
            writer.content(content[start : start + 1000])
    writer.finish()
    return bytes(stream), identity.digest_name(hasher)


@pytest.mark.parametrize("vector", VECTORS, ids=[vector["name"] for vector in VECTORS])
def test_casebox_reproduces_each_golden_vector(vector):
    """T5: casebox's streaming encoder writes the reference stream byte for byte and its digest."""
    stream, digest = encode(vector["records"])
    assert stream == (GOLDEN / f"{vector['name']}.stream").read_bytes()
    assert digest == vector["digest"]


def test_golden_files_are_what_the_independent_script_writes(tmp_path):
    """T5: golden/identity/ is exactly the output of scripts/golden_identity.py, which imports nothing of ours."""
    subprocess.run([sys.executable, "-I", str(REPO / "scripts/golden_identity.py"), str(tmp_path)], check=True)
    committed = sorted(path.name for path in GOLDEN.iterdir())
    assert sorted(path.name for path in tmp_path.iterdir()) == committed
    for name in committed:
        assert (tmp_path / name).read_bytes() == (GOLDEN / name).read_bytes(), name


def test_the_reference_script_imports_nothing_of_ours():
    """T5: the reference encoder is independent of casebox."""
    text = (REPO / "scripts/golden_identity.py").read_text()
    assert not any(word in text for word in ("import executor", "from executor", "import journal", "from journal"))


def test_vectors_pin_state_exec_bit_and_length_prefixes():
    """T5: state, the exec bit and the length prefixes each change the digest."""
    digests = {vector["name"]: vector["digest"] for vector in VECTORS}
    assert digests["executable"] != digests["not-executable"]
    assert digests["split-a-bc"] != digests["split-ab-c"]
    assert len(set(digests.values())) == len(digests)


def write_tree(root: pathlib.Path, files: dict[str, bytes]) -> int:
    root.mkdir()
    for name, data in files.items():
        (root / name).write_bytes(data)
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY)


def test_directory_digest_matches_the_golden_vector(tmp_path):
    """T5: the trusted recomputation over a directory gives the reference digest."""
    vector = next(v for v in VECTORS if v["name"] == "sorted-three")
    fd = write_tree(tmp_path / "c", {r["path"]: bytes.fromhex(r["content_hex"]) for r in vector["records"]})
    try:
        assert identity.digest_directory(fd) == vector["digest"]
    finally:
        os.close(fd)


def test_directory_digest_ignores_mtime_and_follows_the_exec_bit(tmp_path):
    """T5: the digest is independent of modification times and bound to the executable bit."""
    fd = write_tree(tmp_path / "c", {"run.sh": b"#!/bin/sh\nexit 0\n"})
    try:
        before = identity.digest_directory(fd)
        os.utime(tmp_path / "c" / "run.sh", (1, 1))
        assert identity.digest_directory(fd) == before
        os.chmod(tmp_path / "c" / "run.sh", 0o755)
        executable = next(v for v in VECTORS if v["name"] == "executable")["digest"]
        assert identity.digest_directory(fd) == executable != before
    finally:
        os.close(fd)


@pytest.mark.parametrize("kind", ["symlink", "directory", "fifo"])
def test_directory_digest_refuses_anything_but_regular_files(tmp_path, kind):
    """T5: records are regular files only; a symlink is never followed."""
    root = tmp_path / "c"
    fd = write_tree(root, {"a": b"a"})
    {"symlink": lambda p: p.symlink_to("/etc/passwd"), "directory": lambda p: p.mkdir(), "fifo": lambda p: os.mkfifo(p)}[kind](root / "b")
    try:
        with pytest.raises(Refused, match="regular file"):
            identity.digest_directory(fd)
    finally:
        os.close(fd)


def test_directory_digest_refuses_too_many_files(tmp_path):
    """T2: the trusted recomputation keeps the member cap."""
    fd = write_tree(tmp_path / "c", {f"f{i}": b"" for i in range(5)})
    try:
        with pytest.raises(Refused, match="more than 4 files"):
            identity.digest_directory(fd)
    finally:
        os.close(fd)


def test_writer_refuses_unsorted_or_duplicate_paths():
    """T5: records are in strictly ascending path order."""
    writer = identity.IdentityWriter(2, lambda chunk: None)
    writer.present("b", executable=False, length=0)
    with pytest.raises(Refused, match="ascending path order"):
        writer.present("a", executable=False, length=0)
    writer = identity.IdentityWriter(2, lambda chunk: None)
    writer.present("a", executable=False, length=0)
    with pytest.raises(Refused, match="ascending path order"):
        writer.present("a", executable=False, length=0)


def test_writer_refuses_an_unnormalized_path():
    """T5: an identity path obeys the one relative-path rule."""
    with pytest.raises(Refused, match="'..' segment"):
        identity.IdentityWriter(1, lambda chunk: None).present("../x", executable=False, length=0)


def test_writer_enforces_lengths_and_count():
    """T5: each record's content is exactly its announced length, and the count is exact."""
    writer = identity.IdentityWriter(1, lambda chunk: None)
    writer.present("a", executable=False, length=2)
    with pytest.raises(ValueError):
        writer.content(b"abc")
    writer.content(b"ab")
    with pytest.raises(ValueError):
        writer.present("b", executable=False, length=0)
    short = identity.IdentityWriter(2, lambda chunk: None)
    short.present("a", executable=False, length=0)
    with pytest.raises(ValueError):
        short.finish()


def test_bundle_identity_equals_the_extracted_tree_identity(tmp_path):
    """T5, T3: bundle check's streamed digest equals the trusted recomputation over the files."""
    wheels = {"a-1.0-py3-none-any.whl": b"A" * 3000, "b-2.0-py3-none-any.whl": os.urandom(70000)}
    checked = bundle.open_bundle(tarforge.memfd(tarforge.candidate(wheels)))
    files = dict(wheels, **{"manifest.json": tarforge.manifest_bytes(wheels)})
    for name in files:
        (tmp_path / "c").mkdir(exist_ok=True)
        (tmp_path / "c" / name).write_bytes(files[name])
        os.chmod(tmp_path / "c" / name, 0o444)
    fd = os.open(tmp_path / "c", os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert bundle.identity_of(checked) == identity.digest_directory(fd)
    finally:
        os.close(fd)


def sparse(path: pathlib.Path, size: int) -> None:
    with open(path, "wb") as handle:
        handle.truncate(size)


def count_reads(monkeypatch) -> list[int]:
    reads: list[int] = []
    real_readv = os.readv
    monkeypatch.setattr(os, "readv", lambda fd, buffers: reads.append(fd) or real_readv(fd, buffers))
    return reads


def refused_before_reading(tmp_path, monkeypatch, sizes: dict[str, int], rule: str) -> None:
    root = tmp_path / "c"
    root.mkdir()
    for name, size in sizes.items():
        sparse(root / name, size)
    reads = count_reads(monkeypatch)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(Refused, match=rule):
            identity.digest_directory(fd)
    finally:
        os.close(fd)
    assert reads == []


def test_directory_digest_refuses_a_file_over_the_member_cap_before_reading(tmp_path, monkeypatch):
    """T2: the trusted recomputation refuses a file over the member cap from its size."""
    refused_before_reading(tmp_path, monkeypatch, {"big": ustar.MEMBER_MAX_BYTES + 1}, "member cap")


def test_directory_digest_refuses_a_total_over_the_cap_before_reading(tmp_path, monkeypatch):
    """T2: files that each fit but together exceed the total cap are refused before any read."""
    sizes = {"a": ustar.MEMBER_MAX_BYTES, "b": ustar.MEMBER_MAX_BYTES, "c": ustar.MEMBER_MAX_BYTES, "d": 1}
    refused_before_reading(tmp_path, monkeypatch, sizes, "total cap")


def test_writer_refuses_a_path_over_its_length_cap():
    """T2, T5: a record's path is at most PATH_MAX_BYTES; a longer one is refused, never hashed."""
    writer = identity.IdentityWriter(2, lambda data: None)
    writer.present("d/" * (identity.PATH_MAX_BYTES // 2 - 1) + "ab", executable=False, length=0)
    with pytest.raises(Refused, match=f"at most {identity.PATH_MAX_BYTES} bytes"):
        writer.present("e/" * (identity.PATH_MAX_BYTES // 2) + "a", executable=False, length=0)


@pytest.mark.parametrize("change, rule", [(b"more", "grew"), (None, "shrank")])
def test_directory_digest_refuses_a_file_that_changes_while_it_is_hashed(tmp_path, monkeypatch, change, rule):
    """T5: the digest covers exactly the length its record announced; a file that grows or shrinks after it
    was sized is refused, never hashed with other bytes than its record says."""
    (tmp_path / "a.whl").write_bytes(b"wheel bytes")
    opened = identity._open_regular

    def open_then_change(dir_fd, name):
        fd, status = opened(dir_fd, name)
        if change is None:
            os.truncate(tmp_path / name, 3)
        else:
            with open(tmp_path / name, "ab") as file:
                file.write(change)
        return fd, status

    monkeypatch.setattr(identity, "_open_regular", open_then_change)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(Refused, match=f"a.whl: the file {rule} while it was hashed"):
            identity.digest_directory(fd)
    finally:
        os.close(fd)
