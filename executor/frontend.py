"""Front-end conventions shared by every subcommand (DESIGN F1).

A refusal is exit 64 and one sentence on stderr naming the path or field and
the rule. Anything else that escapes is an internal error: exit 70 and one
line, with the traceback only under ``--debug``.
"""

from __future__ import annotations

import os
import stat
import sys
import traceback
from typing import Callable

from journal.errors import Refused

EXIT_OK = 0
EXIT_NOT_OK = 1
EXIT_UNVERIFIED = 3
EXIT_REFUSED = 64
EXIT_INTERNAL = 70


class InternalFailure(Exception):
    """A failure of casebox or the host, not of the input: exit 70 with this sentence."""


def say_refused(refusal: Refused) -> int:
    print(f"casebox: {refusal.sentence()}", file=sys.stderr)
    return EXIT_REFUSED


def run_command(handler: Callable[[], int], *, debug: bool) -> int:
    try:
        return handler()
    except Refused as refusal:
        return say_refused(refusal)
    except InternalFailure as failure:
        if debug:
            traceback.print_exc()
        print(f"casebox: {' '.join(str(failure).split())}", file=sys.stderr)
        return EXIT_INTERNAL
    except KeyboardInterrupt:
        print("casebox: interrupted.", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away; nothing more can be said on stdout.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_INTERNAL
    except Exception as error:  # the one place an unexpected error becomes exit 70
        if debug:
            traceback.print_exc()
        detail = " ".join(str(error).split()) or type(error).__name__
        print(f"casebox: internal error: {type(error).__name__}: {detail} (rerun with --debug for a traceback).", file=sys.stderr)
        return EXIT_INTERNAL


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
    finally:
        os.close(fd)
    if len(data) > cap:
        raise Refused(path, f"is larger than its {cap}-byte cap")
    return data
