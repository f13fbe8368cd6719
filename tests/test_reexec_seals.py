"""S3: the launcher runs only from a memfd that carries every seal and the authenticated bytes."""

from __future__ import annotations

import fcntl
import hashlib
import os

import pytest

from launcher import reexec

SOURCE = b"launcher bytes " * 100
DIGEST = hashlib.sha256(SOURCE).digest()


@pytest.fixture
def source_fd(tmp_path):
    path = tmp_path / "launcher.pyc"
    path.write_bytes(SOURCE)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    yield fd
    os.close(fd)


def test_sealed_copy_holds_the_bytes_and_all_four_seals(source_fd):
    """S3: SEAL|SHRINK|GROW|WRITE, checked on the memfd itself."""
    memfd = reexec.sealed_copy(source_fd, DIGEST)
    try:
        assert fcntl.fcntl(memfd, fcntl.F_GET_SEALS) & reexec.REQUIRED_SEALS == reexec.REQUIRED_SEALS
        assert os.pread(memfd, len(SOURCE) + 1, 0) == SOURCE
        with pytest.raises(PermissionError):
            os.pwrite(memfd, b"x", 0)
        with pytest.raises(PermissionError):
            os.ftruncate(memfd, 1)
    finally:
        os.close(memfd)


def test_sealed_copy_refuses_bytes_that_are_not_the_authenticated_launcher(source_fd):
    """S3: the sealed copy runs only if its bytes are the launcher the starter authenticated (its digest)."""
    with pytest.raises(reexec.SealError, match="digest mismatch"):
        reexec.sealed_copy(source_fd, hashlib.sha256(b"other").digest())


@pytest.mark.parametrize("missing", [fcntl.F_SEAL_SEAL, fcntl.F_SEAL_SHRINK, fcntl.F_SEAL_GROW, fcntl.F_SEAL_WRITE])
def test_a_memfd_missing_any_seal_is_refused(missing):
    """S3: each of the four seals is required."""
    fd = os.memfd_create("test", os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
    try:
        os.write(fd, SOURCE)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, reexec.REQUIRED_SEALS & ~missing)
        with pytest.raises(reexec.SealError, match="not all of"):
            reexec.verify_sealed(fd, DIGEST)
    finally:
        os.close(fd)


def test_a_plain_file_is_not_a_sealed_memfd(source_fd):
    with pytest.raises(reexec.SealError, match="not a sealable memfd"):
        reexec.verify_sealed(source_fd, DIGEST)


def test_reentry_requires_running_from_the_sealed_descriptor(source_fd):
    """S3 on re-entry: the code must have been loaded from /proc/self/fd/N of that memfd."""
    memfd = reexec.sealed_copy(source_fd, DIGEST)
    try:
        here = f"/proc/self/fd/{memfd}"
        reexec.verify_reentry(memfd, DIGEST, here, f"{here}/launcher/reexec.pyc")
        with pytest.raises(reexec.SealError, match="not from its sealed memfd"):
            reexec.verify_reentry(memfd, DIGEST, "/var/lib/casebox/staging/launcher.pyc", f"{here}/launcher/reexec.pyc")
        with pytest.raises(reexec.SealError, match="not from its sealed memfd"):
            reexec.verify_reentry(memfd, DIGEST, here, "/usr/lib/python3/launcher/reexec.py")
        with pytest.raises(reexec.SealError, match="not a sealable memfd"):
            reexec.verify_reentry(source_fd, DIGEST, f"/proc/self/fd/{source_fd}", f"/proc/self/fd/{source_fd}/launcher/x.pyc")
    finally:
        os.close(memfd)
