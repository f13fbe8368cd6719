"""Run the casebox CLI in-process and capture what it says."""

from __future__ import annotations

from executor.cli.main import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``casebox ARGV...``."""
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err
