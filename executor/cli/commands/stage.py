"""``casebox stage list|show|recover``: the operator's view of stages and tombstones (docs/operations.md)."""

from __future__ import annotations

import argparse

from executor import VERSION
from executor.cli import config as configuration
from executor.cli.frontend import EXIT_NOT_OK, EXIT_OK, require_root, say, say_json
from executor.cli.sessions import settings_from
from journal.errors import Refused
from journal.format import ID, ID_RULE, Kind


# The JSON documents of --json (docs/operations.md, "JSON output").
LIST_SCHEMA = "casebox.stage-list.v1"
STAGE_SCHEMA = "casebox.stage.v1"
RECOVER_SCHEMA = "casebox.stage-recover.v1"


def _id(text: str) -> str:
    if not ID.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} {ID_RULE}")
    return text


def _config(args: argparse.Namespace) -> configuration.Config:
    config = configuration.load(args.config).overridden(state_root=args.state_root)
    require_root(f"the state root {config.state_root} is root's (mode 0700)")
    return config


def describe(assessment) -> dict:
    """One stage or tombstone as the operator sees it."""
    from steward import recovery

    reading = assessment.reading
    cleanup = None
    if reading is not None:
        evidence = [record for record in reading.records if record.kind is Kind.CLEANUP_EVIDENCE]
        cleanup = evidence[-1].fields["outcome"] if evidence else None
    return {
        "stage_id": assessment.stage_id,
        "location": assessment.location,
        "state": assessment.state,
        "journal": assessment.verdict or None,
        "records": len(reading.records) if reading is not None else 0,
        "head": reading.head if reading is not None else None,
        "attempt_id": reading.genesis["attempt_id"] if reading is not None and reading.records else None,
        "cleanup": cleanup,
        "diagnostic": recovery.diagnostic_of(reading) if reading is not None else None,
        "sealed_head": assessment.marker.head if assessment.marker is not None else None,
        "in_use": assessment.in_use,
        "reason": assessment.reason,
    }


def _open_root(config: configuration.Config):
    """The state root, or None when there is none yet; refused when something else is there."""
    from steward import stateroot

    if not stateroot.exists(config.state_root):
        return None
    return stateroot.StateRoot.open(config.state_root, create=False)


def _assess(root, stage_id: str):
    """One stage or tombstone; an id that is neither is refused (exit 64), never reported as PRESERVED."""
    from steward import retirement

    assessment = retirement.assess(root, stage_id)
    if assessment.location == "none":
        raise Refused(stage_id, f"is no stage or tombstone of the state root {root.path}; casebox stage list shows them")
    return assessment


def _list(args: argparse.Namespace) -> int:
    from steward import recovery, retirement

    config = _config(args)
    root = _open_root(config)
    rows = []
    if root is not None:
        with root:
            rows = [describe(retirement.assess(root, stage_id)) for stage_id in recovery.stage_ids(root)]
    if args.json:
        say_json({"schema": LIST_SCHEMA, "casebox_version": VERSION, "state_root": config.state_root, "stages": rows})
        return EXIT_OK
    if not rows:
        say(f"casebox stage list: no stage or tombstone in {config.state_root}")
        return EXIT_OK
    say(f"{'STAGE':<18} {'WHERE':<10} {'STATE':<10} {'JOURNAL':<12} {'CLEANUP':<11} {'DIAGNOSTIC':<20} ATTEMPT")
    for row in rows:
        say(
            f"{row['stage_id']:<18} {row['location']:<10} {row['state']:<10} {row['journal'] or '-':<12} "
            f"{row['cleanup'] or '-':<11} {row['diagnostic'] or '-':<20} {row['attempt_id'] or '-'}"
        )
    return EXIT_OK


def _show(args: argparse.Namespace) -> int:
    from steward.stateroot import StateRoot

    config = _config(args)
    with StateRoot.open(config.state_root, create=False) as root:
        row = describe(_assess(root, args.stage))
    if args.json:
        say_json({"schema": STAGE_SCHEMA, "casebox_version": VERSION, **row})
    else:
        say(f"stage {row['stage_id']}: {row['state']} ({row['location']})")
        say(f"  journal: {row['journal'] or 'unreadable'}, {row['records']} records, head {row['head'] or '-'}")
        say(f"  attempt: {row['attempt_id'] or '-'}")
        say(f"  cleanup evidence: {row['cleanup'] or 'none'}")
        say(f"  diagnostic: {row['diagnostic'] or '-'}")
        if row["sealed_head"]:
            say(f"  seal marker: head {row['sealed_head']}")
        if row["in_use"]:
            say("  in use by a running steward")
        say(f"  {row['reason']}")
    return EXIT_OK if row["state"] != "PRESERVED" else EXIT_NOT_OK


def _recover(args: argparse.Namespace) -> int:
    from executor.scratch import remove_abandoned
    from steward import recovery
    from steward.stateroot import StateRoot

    if (args.stage is None) == (not args.all):
        raise Refused("stage recover", "give one stage id or --all")
    config = _config(args)
    with StateRoot.open(config.state_root, create=False) as root:
        if args.stage is not None:
            _assess(root, args.stage)
        work = recovery.Recovery(root, settings_from(config))
        reports = work.recover_all() if args.all else [work.recover(args.stage)]
    residue = remove_abandoned() if args.all else []
    if args.json:
        say_json({
            "schema": RECOVER_SCHEMA, "casebox_version": VERSION, "reports": [report.as_dict() for report in reports],
            "scratch_removed": residue,
        })
    else:
        for report in reports:
            mark = "ok  " if report.ok else "FAIL"
            diagnostic = f" ({report.diagnostic})" if report.diagnostic else ""
            say(f"{mark} {report.stage_id}: {report.before} -> {report.after}{diagnostic}: {report.detail}")
        if not reports:
            say(f"casebox stage recover: no stage or tombstone in {config.state_root}")
        for path in residue:
            say(f"ok   scratch {path}: a verification that was killed left it; removed")
    return EXIT_OK if all(report.ok for report in reports) else EXIT_NOT_OK


def register(subparsers: argparse._SubParsersAction) -> None:
    group = subparsers.add_parser(
        "stage", help="list, show and recover stages and tombstones (root)", description="Stages and tombstones (docs/operations.md)."
    )
    commands = group.add_subparsers(dest="stage_command", metavar="COMMAND")
    commands.required = True
    listing = commands.add_parser(
        "list",
        help="every stage and tombstone with its state and journal verdict",
        description="List every stage and tombstone of the state root: its retirement state (ACTIVE, INTENT, "
        "RENAMED, RETIRED, SEALED, or PRESERVED), its journal verdict, its cleanup evidence, its diagnostic "
        "and its attempt. Changes nothing. Exit 0.",
    )
    listing.add_argument("--json", action="store_true", help=f"print one JSON object ({LIST_SCHEMA}): schema, casebox_version, state_root, stages")
    show = commands.add_parser(
        "show",
        help="one stage or tombstone in detail",
        description="Show one stage or tombstone: state, journal verdict and head, attempt, cleanup evidence, "
        "diagnostic, seal marker, and why it is in that state. Changes nothing. Exit 0, or 1 when it is PRESERVED; "
        "64 for an id that is neither a stage nor a tombstone.",
    )
    show.add_argument("stage", type=_id, metavar="ID", help="a stage or tombstone id (as stage list shows it)")
    show.add_argument("--json", action="store_true", help=f"print one JSON object ({STAGE_SCHEMA})")
    recover = commands.add_parser(
        "recover",
        help="drive stages to sealed tombstones, or say why each is preserved",
        description="Drive one stage (ID) or every stage (--all) to a sealed tombstone: cleanup proof, "
        "retirement, seal, each step only if still needed, so running it twice is safe. A stage whose journal "
        "is missing, torn, corrupt, substituted or over the cap is preserved untouched (only its processes and "
        "mounts on the host are removed); a stage whose journal was never begun is removed. A stage a running "
        "steward holds is left alone. A stage it cannot finish (the state root full) is reported and the next one "
        "tried. With --all, scratch directories a killed verify left in the temporary directory are removed and "
        "listed too. Exit 0 when every stage is sealed, removed or deliberately preserved, 1 otherwise.",
    )
    recover.add_argument("stage", type=_id, nargs="?", metavar="ID", help="one stage or tombstone id (as stage list shows it)")
    recover.add_argument("--all", action="store_true", help="every stage and tombstone")
    recover.add_argument("--json", action="store_true", help=f"print one JSON object ({RECOVER_SCHEMA}): schema, casebox_version, reports, scratch_removed")
    for command in (listing, show, recover):
        command.add_argument("--state-root", metavar="DIR", help="the state root (default: configuration)")
    listing.set_defaults(handler=_list)
    show.set_defaults(handler=_show)
    recover.set_defaults(handler=_recover)
