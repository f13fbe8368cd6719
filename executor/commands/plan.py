"""``casebox plan``: check a case plan and print its canonical digest."""

from __future__ import annotations

import argparse

from executor.frontend import EXIT_OK, read_capped
from executor.plan import PLAN_MAX_BYTES, Plan, plan_from_bytes
from journal.errors import Refused


def load_plan(path: str) -> Plan:
    """The plan at ``path``; a refusal names the file and the JSON path."""
    data = read_capped(path, PLAN_MAX_BYTES)
    try:
        return plan_from_bytes(data)
    except Refused as refusal:
        raise refusal.under(path) from None


def _check(args: argparse.Namespace) -> int:
    print(load_plan(args.plan).digest)
    return EXIT_OK


def register(subparsers: argparse._SubParsersAction) -> None:
    group = subparsers.add_parser("plan", help="check case plans", description="Check case plans (docs/plan.md).")
    commands = group.add_subparsers(dest="plan_command", metavar="COMMAND")
    commands.required = True
    check = commands.add_parser(
        "check",
        help="validate a plan against schema v1 and print its digest",
        description="Validate PLAN against the closed plan schema casebox.plan.v1 and print its canonical "
        "digest, sha256: followed by 64 hex digits. A refused plan exits 64 with one sentence on stderr "
        "and prints nothing on stdout.",
    )
    check.add_argument("plan", metavar="PLAN", help="the plan file (JSON, at most 1 MiB)")
    check.set_defaults(handler=_check)
