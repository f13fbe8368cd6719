"""The user's input files, read as data: a regular file only, within a cap, inside a perimeter (F1, F3)."""

from __future__ import annotations

import os
import stat

from journal.errors import Refused


def open_regular(path: str) -> int:
    """A read-only descriptor for the regular file at ``path``; anything else is refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as error:
        raise Refused(path, f"cannot be read ({os.strerror(error.errno)})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Refused(path, "must be a regular file")
    return fd


def read_capped(path: str, cap: int) -> bytes:
    """The bytes of the regular file at ``path``, reading at most ``cap + 1`` of them."""
    fd = open_regular(path)
    try:
        chunks = []
        remaining = cap + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
    except OSError as error:
        raise Refused(path, f"cannot be read ({os.strerror(error.errno)})") from None
    finally:
        os.close(fd)
    if len(data) > cap:
        raise Refused(path, f"is larger than its {cap}-byte cap")
    return data


def resolve_inside(path: str, root: str, where: str) -> str:
    """The real path of ``path``, refused unless it lies at or below the real path of ``root`` (F3).

    Symlinks are resolved first, so a link that points outward is outside.
    """
    real, perimeter = os.path.realpath(path), os.path.realpath(root)
    if real != perimeter and not real.startswith(perimeter.rstrip("/") + "/"):
        raise Refused(where, f"{path} resolves to {real}, outside the perimeter {perimeter}")
    return real
