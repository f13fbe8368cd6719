"""The ``casebox`` command: one argparse tree, one module per command group."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from executor import VERSION
from executor.cli.frontend import remember_invocation, run_command, say_refused
from journal.errors import Refused

# Each module defines register(subparsers); a command sets ``handler`` with
# set_defaults and the handler returns the exit code. The module
# executor.cli.commands.NAME registers the command NAME, so ``casebox NAME ...``
# imports that module alone; help and unknown commands import them all.
COMMAND_MODULES = (
    "executor.cli.commands.plan",
    "executor.cli.commands.pack",
    "executor.cli.commands.bundle",
    "executor.cli.commands.journal",
    "executor.cli.commands.sandbox",
    "executor.cli.commands.doctor",
    "executor.cli.commands.evaluate",
    "executor.cli.commands.verify",
    "executor.cli.commands.demo",
    "executor.cli.commands.steward",
    "executor.cli.commands.stage",
)


class _Parser(argparse.ArgumentParser):
    """Usage errors are bad input too: exit 64 with one sentence, never exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse names the argument in ``message``; ``where`` adds the subcommand, if any.
        raise Refused(self.prog.removeprefix("casebox").strip(), message)


def _global_parser(*, add_help: bool) -> _Parser:
    parser = _Parser(
        prog="casebox",
        add_help=add_help,
        description="Run an untrusted Python candidate against a closed case plan in namespace sandboxes, "
        "and check the evidence it leaves.",
    )
    parser.add_argument("--debug", action="store_true", help="print a traceback for an internal error (exit 70)")
    parser.add_argument("--version", action="version", version=f"casebox {VERSION}", help="print the casebox version and exit")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="configuration file (default: /etc/casebox/casebox.toml when it exists); flags override it; "
        "a file named here must exist",
    )
    return parser


def _modules_for(argv: Sequence[str]) -> Sequence[str]:
    # Read with the global options alone, so --config's value is never taken for the command.
    _, rest = _global_parser(add_help=False).parse_known_args(argv)
    word = rest[0] if rest and not rest[0].startswith("-") else None
    chosen = [name for name in COMMAND_MODULES if name.rpartition(".")[2] == word]
    return chosen or COMMAND_MODULES


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv``: only the named command's module when it has one, else every command."""
    parser = _global_parser(add_help=True)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    subparsers.required = True
    for name in COMMAND_MODULES if argv is None else _modules_for(argv):
        importlib.import_module(name).register(subparsers)
    return parser


def _run(args: argparse.Namespace) -> int:
    if args.config is not None:
        # A file the user named is checked whether or not this command reads settings.
        from executor.cli import config

        config.load(args.config)
    return args.handler(args)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    remember_invocation(argv)
    try:
        args = build_parser(argv).parse_args(argv)
    except Refused as refusal:
        return say_refused(refusal)
    return run_command(lambda: _run(args), debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
