"""``casebox evaluate``: fold an attempt's receipts, checked against its sealed journals, into one verdict."""

from __future__ import annotations

import argparse

from executor.cli.frontend import EXIT_NOT_OK, EXIT_OK, EXIT_UNVERIFIED, say, say_json
from journal.errors import Refused

# The exit code of each verdict, for evaluate and for verify (which ends by evaluating).
EXIT_BY_VERDICT = {"PASS": EXIT_OK, "FAIL": EXIT_NOT_OK, "UNVERIFIED": EXIT_UNVERIFIED}


def _seconds(wall_ms: int | None) -> str:
    return "-" if wall_ms is None else f"{wall_ms / 1000:.3f} s"


def table(report, designed: dict[str, str] | None = None) -> list[str]:
    """The case, status, reason and time of every case (and, given ``designed``, the status it was designed to get)."""
    head = ("case", "status", "reason", "time") if designed is None else ("case", "designed", "status", "reason", "time")
    rows = [head]
    for r in report.cases:
        cells = (r.case_id, r.status, r.reason, _seconds(r.wall_ms))
        rows.append(cells if designed is None else (r.case_id, designed.get(r.case_id, "-"), *cells[1:]))
    widths = [max(len(row[column]) for row in rows) for column in range(len(head) - 1)]
    lines = ["  ".join([*(f"{cell:<{width}}" for cell, width in zip(row, widths)), row[-1]]).rstrip() for row in rows]
    lines += [f"problem: {problem}" for problem in report.problems]
    return lines


def _evaluate(args: argparse.Namespace) -> int:
    import sys

    from executor.cli.commands.plan import load_plan
    from executor.evidence.evaluate import Expected, evaluate, publish_report
    from executor.transport.preflight import check_attempt, check_sha256
    from executor.evidence.receipts import MAX_ATTEMPT_NUMBER
    from executor.cli.reporting import detail_lines, publish_ci
    from journal.createonly import check_creatable

    if args.summary is not None:
        check_creatable(args.summary)
    attempt_id = check_attempt(args.attempt, "--attempt")
    bundle_sha256 = check_sha256(args.bundle_sha256, "--bundle-sha256")
    if args.attempt_number is not None and not 1 <= args.attempt_number <= MAX_ATTEMPT_NUMBER:
        raise Refused("--attempt-number", f"must be from 1 to {MAX_ATTEMPT_NUMBER}")
    expected = Expected(load_plan(args.plan), attempt_id, bundle_sha256, args.attempt_number)
    report = evaluate(expected, args.evidence)
    path = publish_report(args.report_dir, report)
    if args.json:
        say_json(report.as_dict())
    else:
        for line in table(report) + detail_lines(report):
            say(line)
        say(f"verdict: {report.verdict} (report: {path})")
    publish_ci(report, evidence=args.evidence, command="casebox evaluate", summary=args.summary,
               annotate_to=sys.stderr if args.json else sys.stdout)
    return EXIT_BY_VERDICT[report.verdict]


def register(subparsers: argparse._SubParsersAction) -> None:
    command = subparsers.add_parser(
        "evaluate",
        help="fold an attempt's receipts, checked against its sealed journals, into PASS, FAIL or UNVERIFIED",
        description="Check every receipt in the evidence directories (one per stage or shard: receipts, a copy "
        "of the sealed journal, the seal marker; docs/receipts.md) against the plan, the attempt, the bundle "
        "sha256 and the journal, and fold the cases into one verdict: UNVERIFIED over FAIL over PASS; N/A only "
        "where the plan says applicable: false. Writes report-ATTEMPT.json once into --report-dir (an identical "
        "existing report is accepted; a different one is kept, and the refusal says how the two differ and what "
        "this evaluation's verdict is), then prints a table of case, status, reason and time, why each case that "
        "is not PASS got its reason (failing tests and the last output line, from the published output), and "
        "the verdict. Under GITHUB_ACTIONS=true it also appends a Markdown summary to $GITHUB_STEP_SUMMARY and "
        "prints one ::error (FAIL) or ::warning (UNVERIFIED) per case. Runs unprivileged. Exit 0 PASS, 1 FAIL, "
        "3 UNVERIFIED, 64 refused input.",
    )
    command.add_argument(
        "--evidence", metavar="DIR", nargs="+", action="extend", required=True,
        help="an evidence directory; give one per shard, all of the same attempt",
    )
    command.add_argument("--plan", metavar="PLAN", required=True, help="the plan the attempt ran")
    command.add_argument("--attempt", metavar="ID", required=True, help="the attempt id every piece of evidence must carry")
    command.add_argument("--bundle-sha256", metavar="HEX", required=True, help="the sha256 of the candidate bundle")
    command.add_argument(
        "--attempt-number", metavar="N", type=int,
        help="the attempt number every receipt must carry (default: any, but one for all receipts)",
    )
    command.add_argument("--report-dir", metavar="DIR", default=".", help="where report-ATTEMPT.json is created (default: .)")
    command.add_argument("--json", action="store_true", help="print the report as canonical JSON instead of the table; "
                         "annotations then go to stderr")
    command.add_argument("--summary", metavar="FILE", help="also write the Markdown job summary to FILE, a new file")
    command.set_defaults(handler=_evaluate)
