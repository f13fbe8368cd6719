"""Sealing an output (steward/outputs.py): what a sandbox wrote is hostile data, copied only within its bounds.

These run unprivileged on plain directories: ``seal_copy`` works on two
directory descriptors, whatever is mounted there.
"""

from __future__ import annotations

import os
import pathlib

import pytest

from journal.errors import Refused
from steward import outputs


@pytest.fixture
def places(tmp_path):
    source, sealed = tmp_path / "live", tmp_path / "outputs"
    source.mkdir()
    sealed.mkdir()
    return source, sealed


def seal(source: pathlib.Path, sealed: pathlib.Path) -> dict:
    source_fd = os.open(source, os.O_RDONLY | os.O_DIRECTORY)
    outputs_fd = os.open(sealed, os.O_RDONLY | os.O_DIRECTORY)
    try:
        inventory, *_ = outputs.seal_copy(source_fd, outputs_fd, "out", shown="live/out")
        return inventory
    finally:
        os.close(source_fd)
        os.close(outputs_fd)


@pytest.mark.parametrize("name", [b"line\nbreak", b"esc\x1b[2J", b"\xff\xfe", b"tab\there"])
def test_a_name_that_is_not_printable_utf8_refuses_the_seal(places, name):
    """F1 for outputs: a file name the candidate chose is shown in refusals and inventories, so a name with a
    control character or bytes that are not UTF-8 refuses the seal."""
    source, sealed = places
    os.close(os.open(os.path.join(os.fsencode(source), name), os.O_CREAT | os.O_WRONLY, 0o600))
    with pytest.raises(Refused, match="is not a printable UTF-8 name"):
        seal(source, sealed)


def test_an_output_past_its_entry_cap_refuses_the_seal(places, monkeypatch):
    """Bounded copies: no more than MAX_ENTRIES entries are sealed from one output."""
    monkeypatch.setattr(outputs, "MAX_ENTRIES", 3)
    source, sealed = places
    for index in range(4):
        (source / f"f{index}").write_bytes(b"x")
    with pytest.raises(Refused, match="past the 3-entry cap"):
        seal(source, sealed)
    (source / "f3").unlink()
    (sealed.parent / "again").mkdir()
    assert len(seal(source, sealed.parent / "again")["entries"]) == 3


def test_an_output_deeper_than_its_cap_refuses_the_seal(places, monkeypatch):
    """Bounded copies: the walk never goes more than MAX_DEPTH directories down."""
    monkeypatch.setattr(outputs, "MAX_DEPTH", 2)
    source, sealed = places
    (source / "a" / "b" / "c").mkdir(parents=True)
    with pytest.raises(Refused, match="live/out/a/b/c: is more than 2 directories deep"):
        seal(source, sealed)


def test_a_file_swapped_for_a_fifo_while_it_is_sealed_is_refused_not_read(places, monkeypatch):
    """TOCTOU: the entry is checked again on the descriptor that is read; a FIFO put in place of a regular
    file between the listing and the open is refused, and the seal never blocks on it."""
    source, sealed = places
    (source / "a.whl").write_bytes(b"wheel")
    copy_file = outputs._Copy._file

    def swapped(self, source_fd, target_fd, name, path):
        os.unlink(name, dir_fd=source_fd)
        os.mkfifo(name, dir_fd=source_fd)
        return copy_file(self, source_fd, target_fd, name, path)

    monkeypatch.setattr(outputs._Copy, "_file", swapped)
    with pytest.raises(Refused, match="live/out/a.whl: changed while it was sealed"):
        seal(source, sealed)


def test_a_directory_that_is_not_a_mount_is_no_live_output(tmp_path):
    """An output is read only from its own tmpfs: a plain directory in its place (never mounted, or already
    unmounted) is refused, so nothing of the stage directory itself is ever sealed as an output."""
    (tmp_path / "out").mkdir()
    live_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(Refused, match="is not mounted"):
            outputs.open_live(live_fd, "out")
    finally:
        os.close(live_fd)


def test_a_seal_is_durable_before_it_returns(places, monkeypatch):
    """J1 for outputs: the seal is recorded only once its copy is durable, so the copy's filesystem is synced
    after the last file is written and before seal_copy returns."""
    source, sealed = places
    (source / "sub").mkdir()
    (source / "sub" / "a.py").write_bytes(b"a = 1\n")
    synced = []

    def syncfs(fd):
        synced.append(sorted(os.listdir(os.path.join(f"/proc/self/fd/{fd}", "sub"))))

    monkeypatch.setattr(outputs.sc, "syncfs", syncfs)
    seal(source, sealed)
    assert synced == [["a.py"]]
