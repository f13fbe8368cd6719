"""``casebox plan``: check a case plan and print its canonical digest; shard it across a CI matrix."""

from __future__ import annotations

import argparse

from executor.cli.frontend import EXIT_OK
from executor.inputs import read_capped
from executor.plan import PLAN_MAX_BYTES, Plan, plan_from_bytes
from journal.errors import Refused
from journal.strictjson import canonical


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


def _shard(args: argparse.Namespace) -> int:
    from executor import shard

    plan = load_plan(args.plan)
    count = shard.check_count(plan, args.count, "--count")
    if args.json:
        print(canonical({"shard": shard.labels(count)}).decode("ascii"))
        return EXIT_OK
    for label in shard.labels(count):
        index = int(label.partition("/")[0])
        print(label, " ".join(case.id for case in shard.cases_for_shard(plan, index, count)))
    return EXIT_OK


def register(subparsers: argparse._SubParsersAction) -> None:
    group = subparsers.add_parser(
        "plan", help="check case plans and shard them", description="Check case plans and shard them across runners (docs/plan.md)."
    )
    commands = group.add_subparsers(dest="plan_command", metavar="COMMAND")
    commands.required = True
    check = commands.add_parser(
        "check",
        help="validate a plan against schema v1 or v2 and print its digest",
        description="Validate PLAN against the closed plan schema casebox.plan.v1 or casebox.plan.v2 (docs/plan.md) "
        "and print its canonical digest, sha256: followed by 64 hex digits. A refused plan exits 64 with one sentence on stderr "
        "and prints nothing on stdout.",
    )
    check.add_argument("plan", metavar="PLAN", help="the plan file (JSON, at most 1 MiB)")
    check.set_defaults(handler=_check)
    shard = commands.add_parser(
        "shard",
        help="split a plan's cases across N runners for a CI matrix",
        description="Split PLAN's cases across N runners: case k (from 0, in plan order) goes to shard "
        "k mod N + 1, so every case is in exactly one shard and every runner computes the same split. "
        "Prints one line per shard, its label i/N and its case ids; with --json, the GitHub Actions "
        "matrix {\"shard\": [\"1/N\", ...]} as canonical JSON. Each runner then runs "
        "`casebox verify --shard i/N`.",
    )
    shard.add_argument("plan", metavar="PLAN", help="the plan file (JSON, at most 1 MiB)")
    shard.add_argument("--count", metavar="N", type=int, required=True, help="the number of runners, 1 to the number of cases")
    shard.add_argument("--json", action="store_true", help="print the matrix as canonical JSON")
    shard.set_defaults(handler=_shard)
