"""Front-end conventions (F1): a refusal is exit 64 and one sentence, an internal error
exit 70 and one line, a traceback only with --debug."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pipeline_support import interrupt_while_a_class_is_made

from executor.cli import main
from executor.cli.frontend import InternalFailure, run_command
from executor.inputs import read_capped
from journal.errors import Refused

REPO_EXAMPLE = "examples/plan.json"
# Runs the real CLI in a child with one fault injected: checking a plan raises ZeroDivisionError.
FAULTY_CLI = (
    "import sys, executor.cli.commands.plan as plan;"
    "plan.load_plan = lambda path: 1 // 0;"
    "from executor.cli.main import main; sys.exit(main())"
)


def run_faulty(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", FAULTY_CLI, *args],
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )


def test_refusal_is_exit_64_with_one_sentence(casebox, tmp_path):
    """F1: a refused input exits 64, prints nothing on stdout and one sentence naming the path."""
    missing = tmp_path / "absent.json"
    sentence = casebox.refused("plan", "check", str(missing), naming=str(missing))
    assert sentence == f"{missing}: cannot be read (No such file or directory)."


@pytest.mark.parametrize(
    ("args", "naming"),
    [
        ((), "the following arguments are required: COMMAND"),
        (("plan",), "plan: the following arguments are required: COMMAND"),
        (("plan", "check"), "plan check: the following arguments are required: PLAN"),
        (("plam",), "invalid choice: 'plam'"),
        (("--no-such-flag", "plan", "check", REPO_EXAMPLE), "unrecognized arguments: --no-such-flag"),
        (("plan", "check", "a.json", "b.json"), "unrecognized arguments: b.json"),
        (("--config",), "argument --config: expected one argument"),
        (("plan", "check", "--debug", REPO_EXAMPLE), "unrecognized arguments: --debug"),
    ],
)
def test_usage_errors_are_exit_64(casebox, args, naming):
    """F1: argparse usage errors are refusals too: exit 64 and one sentence, never exit 2 with usage text."""
    casebox.refused(*args, naming=naming)


def test_internal_error_is_exit_70_with_one_line():
    """F1: an unexpected exception exits 70 with one line naming it, and no traceback."""
    result = run_faulty("plan", "check", REPO_EXAMPLE)
    assert result.returncode == 70
    assert result.stdout == b""
    assert result.stderr == (
        b"casebox: internal error: ZeroDivisionError: integer division or modulo by zero "
        b"(rerun with --debug for a traceback).\n"
    )


def test_debug_adds_the_traceback():
    """F1: with --debug the same internal error prints its traceback, then the same one line."""
    result = run_faulty("--debug", "plan", "check", REPO_EXAMPLE)
    assert result.returncode == 70
    text = result.stderr.decode()
    assert text.startswith("Traceback (most recent call last):")
    assert "ZeroDivisionError" in text
    assert text.endswith("casebox: internal error: ZeroDivisionError: integer division or modulo by zero "
                         "(rerun with --debug for a traceback).\n")


def test_internal_error_message_stays_on_one_line(capsys):
    """F1: an exception message with newlines or escapes is still one line on stderr."""

    def fail() -> int:
        raise ValueError("first\nsecond\x1b[2J")

    assert run_command(fail, debug=False) == 70
    assert capsys.readouterr().err == (
        "casebox: internal error: ValueError: first\\nsecond\\x1b[2J (rerun with --debug for a traceback).\n"
    )


def test_internal_failure_sentence_is_exit_70(capsys):
    """F1: InternalFailure carries its own sentence and exits 70; a traceback only under debug."""

    def fail() -> int:
        raise InternalFailure("the steward socket is gone.")

    assert run_command(fail, debug=False) == 70
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", "casebox: the steward socket is gone.\n")
    assert run_command(fail, debug=True) == 70
    assert "Traceback" in capsys.readouterr().err


def test_refusal_inside_a_handler_is_exit_64(capsys):
    """F1: a Refused raised anywhere in a command becomes exit 64 and its sentence."""

    def refuse() -> int:
        raise Refused("$.cases[0].id", "must match ^[a-z0-9][a-z0-9_-]{0,63}$")

    assert run_command(refuse, debug=True) == 64
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "casebox: $.cases[0].id: must match ^[a-z0-9][a-z0-9_-]{0,63}$.\n"


def test_interrupt_is_exit_130(capsys):
    """F1: Ctrl-C ends with one line and exit 130, no traceback."""

    def interrupted() -> int:
        raise KeyboardInterrupt

    assert run_command(interrupted, debug=False) == 130
    assert capsys.readouterr().err == "casebox: interrupted.\n"


def test_an_interrupt_the_interpreter_wrapped_is_still_exit_130(capsys):
    """F1: SIGTERM (a cancelled CI job) that lands while a class is made reaches the command as the error Python
    3.11 raises in its place (a RuntimeError caused by it); it is still an interrupt, exit 130, not an internal
    error (exit 70)."""

    def interrupted() -> int:
        interrupt_while_a_class_is_made()
        return 0

    assert run_command(interrupted, debug=False) == 130
    assert capsys.readouterr().err == "casebox: interrupted.\n"


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_a_closed_stdout_is_not_exit_0(casebox, buffered):
    """F1: when the answer cannot be written (stdout closed), the exit is 70 with one line, never 0,
    whether the write fails at once (unbuffered) or only at the flush."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = casebox("plan", "check", REPO_EXAMPLE, stdout=write_end, env=env)
    finally:
        os.close(write_end)
    assert result.returncode == 70
    assert result.stderr == b"casebox: standard output was closed before the answer was written.\n"


def test_sentence_is_one_line_whatever_the_file_name(casebox, tmp_path):
    """F1: a file name with a newline or a terminal escape is shown escaped, on one line."""
    hostile = tmp_path / "plan\n\x1b[2Jname.json"
    hostile.write_bytes(b"[]")
    sentence = casebox.refused("plan", "check", str(hostile), naming="plan\\n\\x1b[2Jname.json")
    assert sentence.endswith("at $: must be an object, not an array.")


def test_refused_under_keeps_type_and_rule():
    """F1: locating a refusal inside a file keeps its type and rule and prefixes the location."""
    from journal.strictjson import StrictJSONError

    inner = StrictJSONError("$.a", "is missing")
    outer = inner.under("plan.json")
    assert type(outer) is StrictJSONError
    assert (outer.where, outer.rule, outer.path) == ("plan.json at $.a", "is missing", "plan.json at $.a")
    assert str(outer) == "plan.json at $.a: is missing."


def test_read_capped_limits(tmp_path):
    """F1: a capped read accepts exactly the cap and refuses one byte more, a non-file, and a missing file."""
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    assert read_capped(str(path), 10) == b"x" * 10
    with pytest.raises(Refused, match="larger than its 9-byte cap"):
        read_capped(str(path), 9)
    with pytest.raises(Refused, match="must be a regular file"):
        read_capped(str(tmp_path), 9)
    with pytest.raises(Refused, match="must be a regular file"):
        read_capped("/dev/zero", 9)
    with pytest.raises(Refused, match="cannot be read"):
        read_capped(str(tmp_path / "absent"), 9)


def test_a_fifo_is_refused_not_waited_on(casebox, tmp_path):
    """F1: a FIFO with no writer is refused at once; the open does not block waiting for one."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    casebox.refused("plan", "check", str(fifo), naming=f"{fifo}: must be a regular file", timeout=20)


def test_read_error_is_a_refusal():
    """F1: a file that opens but cannot be read is a refusal naming it, not an internal error."""
    with pytest.raises(Refused, match="cannot be read"):
        read_capped("/proc/self/mem", 9)


def test_help_is_exit_0_and_lists_the_commands(casebox):
    """F1: --help is an answer, not an error: exit 0, on stdout."""
    result = casebox("--help")
    assert result.returncode == 0 and result.stderr == b""
    assert b"plan" in result.stdout and b"--config FILE" in result.stdout and b"--debug" in result.stdout
    result = casebox("plan", "check", "--help")
    assert result.returncode == 0
    assert b"casebox.plan.v1" in result.stdout and b"1 MiB" in result.stdout


def _commands(parser, words=()):
    """(command words, its long options but --help) of every leaf command of the parser."""
    import argparse

    nested = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    if not nested:
        yield " ".join(words), {option for action in parser._actions for option in action.option_strings
                                if option.startswith("--") and option != "--help"}
        return
    for name, child in nested[0].choices.items():
        yield from _commands(child, (*words, name))


def test_the_readme_command_table_matches_every_commands_options(repo):
    """Docs move with code: the README's command table has one row per command, naming exactly the options
    its --help offers."""
    import re

    rows = {}
    for line in (repo / "README.md").read_text().splitlines():
        match = re.match(r"\| `casebox ([a-z ]+?)(?= [A-Z\[-]|`)(.*?)` \|", line)
        if match:
            rows[match.group(1)] = set(re.findall(r"--[a-z][a-z0-9-]*", match.group(2)))
    commands = dict(_commands(main.build_parser()))
    assert set(rows) == set(commands)
    for command, options in commands.items():
        assert rows[command] == options, command


def test_a_command_imports_only_its_own_module(monkeypatch):
    """casebox NAME imports executor.cli.commands.NAME alone; help and unknown names see every command."""
    monkeypatch.setattr(main, "COMMAND_MODULES", ("executor.cli.commands.plan", "executor.cli.commands.absent_for_test"))
    assert main._modules_for(["--config", "x.toml", "plan", "check", "p.json"]) == ["executor.cli.commands.plan"]
    assert main._modules_for(["--config", "plan", "absent_for_test"]) == ["executor.cli.commands.absent_for_test"]
    assert main._modules_for(["--help"]) == main.COMMAND_MODULES
    assert main._modules_for(["nonesuch"]) == main.COMMAND_MODULES


# Modules that `casebox plan check` must not import: pyroute2 alone costs ~170 ms,
# and the rest are several milliseconds each on a ~25 ms command (scripts/bench
# plan_check_ms). A command that needs one imports it in its own module.
KEPT_OFF_THE_PLAN_CHECK_PATH = {
    "pyroute2", "psutil", "cffi", "_cffi_backend", "prctl", "_prctl",
    "tomllib", "dataclasses", "typing", "inspect", "traceback", "pathlib", "subprocess",
}


def test_plan_check_start_path_imports_nothing_heavy(casebox, repo):
    """A short-lived command's start path stays light: `plan check` imports none of the heavy modules."""
    result = casebox.run_python("-X", "importtime", str(repo / ".venv" / "bin" / "casebox"), "plan", "check", REPO_EXAMPLE)
    assert result.returncode == 0, result.stderr
    imported = {line.rsplit("|", 1)[1].strip() for line in result.stderr.decode().splitlines() if line.startswith("import time:")}
    assert "executor.plan" in imported
    assert imported & KEPT_OFF_THE_PLAN_CHECK_PATH == set()
