"""Front-end conventions shared by every subcommand (DESIGN F1).

A refusal is exit 64 and one sentence on stderr naming the path or field and
the rule. Anything else that escapes is an internal error: exit 70 and one
line, with the traceback only under ``--debug``. Output is flushed before the
exit code is decided, so an answer that could not be delivered is never exit 0.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable

from journal.errors import SENTENCE_LIMIT, Refused
from journal.untrusted import LIMIT, escape, json_line

EXIT_OK = 0
EXIT_NOT_OK = 1
EXIT_UNVERIFIED = 3
EXIT_REFUSED = 64
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130


class InternalFailure(Exception):
    """A failure of casebox or the host, not of the input: exit 70 with this sentence."""


# A line casebox prints is made of its own words and of fields each bounded where they were escaped.
LINE_LIMIT = 8 * LIMIT


def say(line: str = "", *, file=None) -> None:
    """Print one line of human-readable output, through the one untrusted-text rule (E8).

    Each field that came from the candidate, an index or a sandbox is escaped
    where it is interpolated; the whole line is escaped again here (the rule
    is idempotent), so a field that was missed still cannot add a line, move
    the cursor or start a workflow command. A caller prints a block of lines
    one ``say`` at a time.
    """
    print(escape(line, limit=LINE_LIMIT), file=sys.stdout if file is None else file)


def say_json(value: object) -> None:
    """Print ``value`` as one line of terminal-safe JSON (E8; journal.untrusted.json_line)."""
    print(json_line(value))


def say_refused(refusal: Refused) -> int:
    print(f"casebox: {refusal.sentence()}", file=sys.stderr)
    return EXIT_REFUSED


def _say_internal(text: str, *, debug: bool) -> int:
    if debug:
        import traceback  # only here: it costs a few milliseconds on every start

        traceback.print_exc()
    print(f"casebox: {escape(text, limit=SENTENCE_LIMIT)}", file=sys.stderr)
    return EXIT_INTERNAL


def run_command(handler: Callable[[], int], *, debug: bool) -> int:
    try:
        code = handler()
        sys.stdout.flush()
        return code
    except Refused as refusal:
        return say_refused(refusal)
    except InternalFailure as failure:
        return _say_internal(str(failure), debug=debug)
    except KeyboardInterrupt:
        print("casebox: interrupted.", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of stdout went away; point stdout at /dev/null so the
        # interpreter's final flush cannot fail a second time.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return _say_internal("standard output was closed before the answer was written.", debug=debug)
    except Exception as error:  # the one place an unexpected error becomes exit 70
        detail = str(error) or type(error).__name__
        return _say_internal(
            f"internal error: {type(error).__name__}: {detail} (rerun with --debug for a traceback).", debug=debug
        )


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
