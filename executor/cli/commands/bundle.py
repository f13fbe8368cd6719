"""``casebox bundle``: the trusted data-only preflight, and the producer's and reviewer's check."""

from __future__ import annotations

import argparse
import os

from executor.transport import bundle as reader
from executor.cli.commands.plan import load_plan
from executor.cli.frontend import EXIT_OK, say, say_json
from executor.inputs import open_regular
from journal.untrusted import escape
from executor.transport.preflight import Handoff, check_attempt, preflight
from journal.errors import Refused


def _preflight(args: argparse.Namespace) -> int:
    if (args.attempt is None) != (args.plan is None):
        raise Refused("--attempt and --plan", "are given together or not at all")
    attempt = check_attempt(args.attempt, "--attempt") if args.attempt is not None else None
    plan = load_plan(args.plan).digest if args.plan is not None else None
    coordinate = preflight(args.file, args.sha256)
    print(Handoff(attempt, coordinate, plan).canonical_bytes().decode("ascii"))
    return EXIT_OK


def _check(args: argparse.Namespace) -> int:
    fd = open_regular(args.file)
    try:
        checked = reader.open_bundle(fd)
        digest = reader.identity_of(checked)
    except Refused as refusal:
        raise refusal.under(args.file) from None
    finally:
        os.close(fd)
    members = [
        {"path": member.path, "type": "directory" if member.directory else "file", "size": member.size}
        for member in checked.members
    ]
    if args.json:
        say_json({"schema": "casebox.bundle-check.v1", "identity": digest, "members": members})
        return EXIT_OK
    for member in members:
        say(f"{member['type']:<9} {member['size']:>10}  {escape(member['path'])}")
    say(f"identity  {digest}")
    return EXIT_OK


def register(subparsers: argparse._SubParsersAction) -> None:
    group = subparsers.add_parser(
        "bundle", help="preflight or check a candidate bundle", description="Preflight or check a candidate bundle."
    )
    commands = group.add_subparsers(dest="bundle_command", metavar="COMMAND")
    commands.required = True
    pre = commands.add_parser(
        "preflight",
        help="trusted, data-only: check a bundle's size and sha256 and print the handoff coordinate",
        description="The trusted side's only look at a bundle: refuse FILE over the 256 MiB archive cap "
        "(reading at most the cap plus one byte) or whose streaming sha256 is not HEX, never parse it, and "
        "print the handoff coordinate as canonical JSON (docs/transport.md). --attempt and --plan, given "
        "together, bind the coordinate to a verification attempt and a plan's digest; without them both are null.",
    )
    pre.add_argument("file", metavar="FILE", help="the bundle")
    pre.add_argument("--sha256", metavar="HEX", required=True, help="the expected sha256, 64 lowercase hex digits")
    pre.add_argument("--attempt", metavar="ID", help="the attempt id ([A-Za-z0-9][A-Za-z0-9._-]{0,63})")
    pre.add_argument("--plan", metavar="PLAN", help="the case plan; its canonical digest goes into the coordinate")
    pre.set_defaults(handler=_preflight)
    check = commands.add_parser(
        "check",
        help="for producers and reviewers: check a bundle without writing and print its members and identity",
        description="Run the reader's lexical preflight of every header and the manifest check on FILE, "
        "verify every wheel's size and sha256 against the manifest, write nothing, and print the member list "
        "and the candidate identity digest. This parses candidate bytes: it is a producer's and reviewer's "
        "tool, never a step of the trusted side of a verification.",
    )
    check.add_argument("file", metavar="FILE", help="the bundle")
    check.add_argument("--json", action="store_true", help="print canonical JSON instead of a table")
    check.set_defaults(handler=_check)
