"""A small filesystem of the test's own, to run out of space on: a tmpfs mounted at a path in its directory."""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib

from launcher import syscalls as sc

FILLER = "filler"


@contextlib.contextmanager
def small_tmpfs(point: pathlib.Path, size: int):
    """A tmpfs of ``size`` bytes at ``point`` (made if missing), unmounted (lazily, if still busy) at the end."""
    point.mkdir(parents=True, exist_ok=True)
    sc.mount("casebox-test-disk", str(point), "tmpfs", 0, f"size={size},mode=0755")
    try:
        yield point
    finally:
        sc.umount2(str(point), sc.MNT_DETACH)


def fill(directory: pathlib.Path) -> pathlib.Path:
    """Write a file in ``directory`` until its filesystem has no byte left; the file."""
    path = directory / FILLER
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    os.write(fd, b"\xff" * size)
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)
    assert free_bytes(directory) == 0
    return path


def free_bytes(directory: pathlib.Path) -> int:
    usage = os.statvfs(directory)
    return usage.f_bavail * usage.f_frsize
