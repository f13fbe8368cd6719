"""journal.files.read_evidence: the one capped, descriptor-relative reader of evidence files (E1, E5)."""

from __future__ import annotations

import os
import stat

import pytest

from journal.errors import Refused
from journal.files import read_evidence


@pytest.fixture
def directory(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    yield tmp_path, fd
    os.close(fd)


def test_a_regular_file_is_read_up_to_one_byte_past_the_cap(directory, counted_reads):
    path, fd = directory
    (path / "small").write_bytes(b"abc")
    (path / "large").write_bytes(b"x" * 100_000)
    assert read_evidence(fd, "small", 10) == b"abc"
    assert read_evidence(fd, "large", 10) == b"x" * 11
    assert sum(counted_reads) == 3 + 11


def test_an_absent_file_is_none(directory):
    assert read_evidence(directory[1], "absent", 10) is None


def test_a_symlink_is_refused_never_followed(directory):
    path, fd = directory
    (path / "target").write_bytes(b"PASS")
    (path / "link").symlink_to(path / "target")
    with pytest.raises(Refused, match="symlink"):
        read_evidence(fd, "link", 10)


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_fifo_or_a_directory_is_refused(directory, kind):
    path, fd = directory
    if kind == "fifo":
        os.mkfifo(path / "entry")
    else:
        (path / "entry").mkdir()
    with pytest.raises(Refused) as caught:
        read_evidence(fd, "entry", 10)
    assert caught.value.where == "entry"


@pytest.mark.root
def test_a_device_is_refused_not_read(directory, counted_reads):
    """A device node in an evidence directory (root can make one) is never read, whatever it would yield."""
    path, fd = directory
    os.mknod(path / "zero", stat.S_IFCHR | 0o644, os.makedev(1, 5))
    with pytest.raises(Refused, match="must be a regular file"):
        read_evidence(fd, "zero", 10)
    assert counted_reads == []


def _publish_with_a_deadline(directory, name: str, data: bytes) -> None:
    """publish_once in a child with a 10 s alarm, so a hang is a failure instead of a stuck suite."""
    import signal

    from journal.createonly import publish_once

    pid = os.fork()
    if pid == 0:
        signal.alarm(10)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            publish_once(fd, name, data)
            os._exit(0)
        except Refused as refusal:
            os._exit(64 if "already exists and is not a regular file" in refusal.rule else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 64, f"wait status {status:#x}"


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_create_once_refuses_a_fifo_or_directory_under_its_name_without_waiting(tmp_path, kind):
    """E4, F1: evidence is never written over something else; a FIFO or a directory already holding the name
    (a report directory is the caller's) is refused at once, never opened and waited on."""
    target = tmp_path / "report-run-1.json"
    os.mkfifo(target) if kind == "fifo" else target.mkdir()
    _publish_with_a_deadline(tmp_path, "report-run-1.json", b"{}")


@pytest.mark.parametrize("name", ["a/b", "", ".", ".."])
def test_create_once_takes_one_plain_name(tmp_path, name):
    """E4: an evidence name is one path segment under the directory descriptor, never a path."""
    from journal.createonly import publish_once

    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(Refused, match="one plain path segment"):
            publish_once(fd, name, b"x")
    finally:
        os.close(fd)
    assert os.listdir(tmp_path) == []
