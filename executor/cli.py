"""The ``casebox`` command: one argparse tree, one module per command group."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from executor.frontend import run_command, say_refused
from journal.errors import Refused

# Each module defines register(subparsers); a command sets ``handler`` with
# set_defaults and the handler returns the exit code.
COMMAND_MODULES = (
    "executor.commands.plan",
    "executor.commands.pack",
    "executor.commands.bundle",
    "executor.commands.journal",
)


class _Parser(argparse.ArgumentParser):
    """Usage errors are bad input too: exit 64 with one sentence, never exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise Refused(self.prog.removeprefix("casebox").strip() or "casebox", message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="casebox",
        description="Run an untrusted Python candidate against a closed case plan in namespace sandboxes, "
        "and check the evidence it leaves.",
    )
    parser.add_argument("--debug", action="store_true", help="print a traceback for an internal error (exit 70)")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="configuration file (default: /etc/casebox/casebox.toml when it exists); flags override it",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    subparsers.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except Refused as refusal:
        return say_refused(refusal)
    return run_command(lambda: args.handler(args), debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
