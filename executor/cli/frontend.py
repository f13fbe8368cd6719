"""Front-end conventions shared by every subcommand (DESIGN F1).

Every command answers by one rule (README.md, "Exit codes"). A refusal is
exit 64 and one sentence on stderr naming the path or field and the rule. A
command that needs root, run without it, is exit 77 (EX_NOPERM) and one
sentence giving the command to run instead, this very command line under
sudo (so a ``--config`` the caller gave is kept). Anything else that escapes
is an internal error: exit 70 and one line, with the traceback only under
``--debug``. Output is flushed before the exit code is decided, so an answer
that could not be delivered is never exit 0.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Sequence

from journal.errors import SENTENCE_LIMIT, Refused
from journal.untrusted import LIMIT, escape, json_line

EXIT_OK = 0
EXIT_NOT_OK = 1
EXIT_UNVERIFIED = 3
EXIT_REFUSED = 64
EXIT_INTERNAL = 70
EXIT_NOPERM = 77
EXIT_INTERRUPTED = 130


class InternalFailure(Exception):
    """A failure of casebox or the host, not of the input: exit 70 with this sentence."""


class NeedsRoot(Exception):
    """A command that needs root was run without it: exit 77 with this sentence."""


# The arguments of this casebox command line (after the program name), for the command a NeedsRoot suggests.
_invocation: list[str] = []


def remember_invocation(argv: Sequence[str]) -> None:
    _invocation[:] = list(argv)


def as_root_command() -> str:
    """This very command line under sudo, the program as the caller named it when it is casebox."""
    program = sys.argv[0] if sys.argv and os.path.basename(sys.argv[0]) == "casebox" else "casebox"
    return shlex.join(["sudo", program, *_invocation])


def require_root(what: str) -> None:
    """Exit 77 unless this process runs as root; ``what`` says what needs it."""
    if os.geteuid() != 0:
        raise NeedsRoot(f"{what}, which needs root; run it as root: {as_root_command()}")


# A line casebox prints is made of its own words and of fields each bounded where they were escaped.
LINE_LIMIT = 8 * LIMIT


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def is_interrupt(error: BaseException) -> bool:
    """Whether ``error`` is Ctrl-C or SIGTERM (a KeyboardInterrupt, see :func:`interrupt_on_sigterm`), or an error
    the interpreter raised in its place. An interrupt lands wherever the main thread is, and Python 3.11 wraps
    an exception from a descriptor's ``__set_name__`` in a RuntimeError caused by it: an interrupt that lands
    while a module defining a dataclass is first imported reaches the command as such an error."""
    seen = 0
    while error is not None and seen < 16:  # a chain of causes, bounded: code may set a cycle by hand
        if isinstance(error, KeyboardInterrupt):
            return True
        error, seen = error.__cause__, seen + 1
    return False


def interrupt_on_sigterm() -> None:
    """SIGTERM (a cancelled CI job, a service stop) ends the command as Ctrl-C does: what it opened is closed on
    the way out (an embedded session is retired INTERRUPTED), then exit 130."""
    import signal

    signal.signal(signal.SIGTERM, _interrupted)


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


def _say_interrupted() -> int:
    print("casebox: interrupted.", file=sys.stderr)
    return EXIT_INTERRUPTED


def run_command(handler: Callable[[], int], *, debug: bool) -> int:
    try:
        code = handler()
        sys.stdout.flush()
        return code
    except Refused as refusal:
        return say_refused(refusal)
    except InternalFailure as failure:
        return _say_internal(str(failure), debug=debug)
    except NeedsRoot as needs:
        sentence = escape(str(needs), limit=SENTENCE_LIMIT)
        print(f"casebox: {sentence}{'' if sentence.endswith('.') else '.'}", file=sys.stderr)
        return EXIT_NOPERM
    except KeyboardInterrupt:
        return _say_interrupted()
    except BrokenPipeError:
        # The reader of stdout went away; point stdout at /dev/null so the
        # interpreter's final flush cannot fail a second time.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return _say_internal("standard output was closed before the answer was written.", debug=debug)
    except Exception as error:  # the one place an unexpected error becomes exit 70
        if is_interrupt(error):
            return _say_interrupted()
        detail = str(error) or type(error).__name__
        return _say_internal(
            f"internal error: {type(error).__name__}: {detail} (rerun with --debug for a traceback).", debug=debug
        )
