"""``casebox journal verify|show|replay``: a reviewer's view of a cleanup journal (docs/journal-format.md).

Each command takes a journal file, or a stage or tombstone directory holding
one as ``journal``. A seal marker there (``seal.json`` beside the journal)
anchors it: its stage, journal id and head must be the journal's, or it is
SUBSTITUTED; ``--expect-head``, ``--expect-stage`` and ``--expect-journal``
add the caller's own anchor. They run unprivileged anywhere, and exit 0 only
when the journal is VALID, 1 for any other verdict, and 64 when the path or
its seal marker cannot be read.
"""

from __future__ import annotations

import argparse
import os

from executor import VERSION
from executor.cli.frontend import EXIT_NOT_OK, EXIT_OK, say, say_json
from journal.closed import SHA256_HEX
from journal.createonly import open_directory, publish_once
from journal.errors import Refused
from journal.files import load_for_review, seal_beside
from journal.format import ID, ID_RULE
from journal.reader import Anchor, Reading, Verdict, read_journal
from journal.replay import render_text
from journal.replay_html import render_html
from journal.seal import SEAL_MAX_BYTES, seal_from_bytes
from journal.strictjson import canonical
from journal.timeline import Labels, timeline, wall_time

_PATH_HELP = "a journal file, or a stage, tombstone or evidence directory holding one as 'journal' (and seal.json)"
VERIFY_SCHEMA = "casebox.journal-verify.v1"
SHOW_SCHEMA = "casebox.journal-show.v1"
_TIMES = ("at", "created")


def _hex(text: str) -> str:
    if not SHA256_HEX.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not 64 lowercase hex digits")
    return text


def _id(text: str) -> str:
    if not ID.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} {ID_RULE}")
    return text


def _anchors(args: argparse.Namespace) -> tuple[Anchor, ...]:
    """The seal marker beside the journal, then the caller's --expect-* flags, each an anchor."""
    anchors = []
    seal_shown, seal_data = seal_beside(args.path)
    if seal_data is not None:
        if len(seal_data) > SEAL_MAX_BYTES:
            raise Refused(seal_shown, f"is larger than its {SEAL_MAX_BYTES}-byte cap")
        try:
            marker = seal_from_bytes(seal_data)
        except Refused as refusal:
            raise refusal.under(seal_shown) from None
        anchors.append(Anchor(seal_shown, marker.stage_id, marker.journal_id, marker.head))
    given = {"--expect-stage": getattr(args, "expect_stage", None), "--expect-journal": getattr(args, "expect_journal", None),
             "--expect-head": getattr(args, "expect_head", None)}
    if any(value is not None for value in given.values()):
        source = " and ".join(flag for flag, value in given.items() if value is not None)
        anchors.append(Anchor(source, *given.values()))
    return tuple(anchors)


def _read(args: argparse.Namespace) -> tuple[str, Reading]:
    shown, data = load_for_review(args.path)
    return shown, read_journal(data, anchors=_anchors(args))


def _exit(reading: Reading) -> int:
    return EXIT_OK if reading.verdict is Verdict.VALID else EXIT_NOT_OK


def _summary(reading: Reading, schema: str) -> dict:
    return {
        "schema": schema,
        "casebox_version": VERSION,
        "verdict": str(reading.verdict),
        "records": len(reading.records),
        "valid_bytes": reading.valid_bytes,
        "head": reading.head,
        "reason": reading.reason,
        "anchored": reading.anchored,
        "anchors": [anchor.as_dict() for anchor in reading.anchors],
    }


def _verdict_line(shown: str, reading: Reading) -> str:
    return (f"{shown}: {reading.stated}, {len(reading.records)} records, {reading.valid_bytes} bytes, "
            f"head {reading.head or '(none)'}: {reading.reason}")


def _verify(args: argparse.Namespace) -> int:
    shown, reading = _read(args)
    if args.json:
        say_json(_summary(reading, VERIFY_SCHEMA))
    else:
        say(_verdict_line(shown, reading))
    return _exit(reading)


def _shown(key: str, value: object) -> str:
    """A field value on one line: a time in ISO 8601 (UTC), a string with a space, or an empty one, quoted."""
    if key in _TIMES:
        return wall_time(value)
    if type(value) is str and (not value or " " in value):
        return canonical(value).decode("ascii")
    return str(value)


def _show(args: argparse.Namespace) -> int:
    shown, reading = _read(args)
    if args.json:
        entries = [
            {"offset": record.offset, "kind": record.kind.name, "version": record.version,
             "length": len(record.payload), "digest": record.digest, "fields": record.fields,
             "time": wall_time(next(record.fields[key] for key in _TIMES if key in record.fields))}
            for record in reading.records
        ]
        say_json({**_summary(reading, SHOW_SCHEMA), "entries": entries})
        return _exit(reading)
    for record in reading.records:
        fields = " ".join(f"{key}={_shown(key, value)}" for key, value in record.fields.items() if key != "prev")
        say(f"{record.offset:>7}  {record.kind.name:<20}  {fields}")
    say(_verdict_line(shown, reading))
    return _exit(reading)


def evidence_labels(directory: str, reading: Reading) -> Labels:
    """What the receipts in an evidence directory say of the journal's sandboxes: each preparing sandbox's
    phase, each case's sandbox and its op's limit class. Only receipts of the journal's own stage count; a
    receipt that is unreadable or refused labels nothing (labels name lanes; they prove nothing)."""
    from executor.evidence.receipts import RECEIPT_MAX_BYTES, name_parts, receipt_from_bytes
    from journal.files import read_evidence
    from journal.format import sandbox_of

    stage_id = reading.genesis["stage_id"] if reading.records else None
    sandboxes: dict[str, str] = {}
    limits: dict[str, str] = {}
    dir_fd = open_directory(directory)
    try:
        for name in sorted(os.listdir(dir_fd)):
            if name_parts(name) is None:
                continue
            try:
                data = read_evidence(dir_fd, name, RECEIPT_MAX_BYTES)
                receipt = receipt_from_bytes(data) if data is not None else None
            except Refused:
                continue
            if receipt is None or receipt.binding.stage_id != stage_id:
                continue
            for phase, sandbox in receipt.binding.phases:
                sandboxes[sandbox] = phase
            if receipt.process is not None:
                sandbox = sandbox_of(receipt.process.op_id)
                if sandbox is not None:
                    sandboxes[sandbox] = f"case {receipt.case_id}"
                limits[receipt.process.op_id] = receipt.outcome.limit
    finally:
        os.close(dir_fd)
    return Labels(sandboxes, limits)


def _replay(args: argparse.Namespace) -> int:
    shown, reading = _read(args)
    labels = None if args.evidence is None else evidence_labels(args.evidence, reading)
    if args.html is None:
        for line in render_text(reading, shown, labels).splitlines():
            say(line)
        return _exit(reading)
    directory, name = os.path.split(os.path.abspath(args.html))
    dir_fd = open_directory(directory)
    try:
        publish_once(dir_fd, name, render_html(reading, shown, labels).encode("utf-8"), mode=0o644, shown=args.html)
    finally:
        os.close(dir_fd)
    conclusion = timeline(reading).conclusion() if reading.records else f"journal {reading.verdict}: {reading.reason}"
    say(f"{args.html}: {conclusion}")
    return _exit(reading)


def register(subparsers: argparse._SubParsersAction) -> None:
    group = subparsers.add_parser(
        "journal",
        help="verify, show and replay cleanup journals",
        description="Review a cleanup journal (docs/journal-format.md). Every command exits 0 only for a VALID "
        "journal, 1 for any other verdict (TORN, CORRUPT, SUBSTITUTED, OVER_CAP, MISSING) and 64 when the "
        "path cannot be read.",
    )
    commands = group.add_subparsers(dest="journal_command", metavar="COMMAND")
    commands.required = True

    verify = commands.add_parser(
        "verify",
        help="print the journal's verdict",
        description="Decode every frame, check the chain and print one verdict line. A seal marker beside the "
        "journal (seal.json in a tombstone or evidence directory) anchors it: its stage, journal id and head "
        "must be the journal's, or the journal is SUBSTITUTED and the reason says what differed. A VALID "
        "journal that nothing outside it anchored by its head is 'VALID (unanchored)': its chain is whole, but "
        "nothing shows it is complete and unaltered (docs/journal-format.md, \"Anchors\"). With --json print "
        f"one object ({VERIFY_SCHEMA}): schema, casebox_version, verdict, records, valid_bytes, head, reason, "
        "anchored and anchors (each with its source, stage_id, journal_id and head).",
    )
    verify.add_argument("path", metavar="PATH", help=_PATH_HELP)
    verify.add_argument("--expect-head", metavar="HEX", type=_hex,
                        help="the head the evidence holds (receipts, seal); a different head is SUBSTITUTED")
    verify.add_argument("--expect-stage", metavar="ID", type=_id,
                        help="the stage the journal must be bound to; another stage is SUBSTITUTED")
    verify.add_argument("--expect-journal", metavar="ID", type=_id,
                        help="the journal id the chain must be; another journal is SUBSTITUTED")
    verify.add_argument("--json", action="store_true", help="print one JSON object")
    verify.set_defaults(handler=_verify)

    show = commands.add_parser(
        "show",
        help="print every record with its offset",
        description="Print each record of the valid prefix on one line with its offset, kind and fields "
        "(prev omitted; the at and created times in ISO 8601, UTC), then the verdict line, anchored like "
        f"journal verify. With --json print one object ({SHOW_SCHEMA}): the verify fields plus entries, each "
        "with offset, kind, version, length, digest, fields (times in microseconds) and time (ISO 8601).",
    )
    show.add_argument("path", metavar="PATH", help=_PATH_HELP)
    show.add_argument("--json", action="store_true", help="print one JSON object")
    show.set_defaults(handler=_show)

    replay = commands.add_parser(
        "replay",
        help="print the journal as a timeline",
        description="Print the journal as a timeline: one block per sandbox (its launcher, pid 1 and ops with "
        "intent, release, terminal wait status and durations; its in-namespace mounts summarised, ending with "
        "the namespace only when its pid 1's terminal record says so), the host mounts with their unmounts, "
        "helper attempts, cleanup evidence, retirement and the final cleanup verdict. With --html OUT, write "
        "one self-contained HTML page (an SVG timeline and the records; no scripts or network assets) instead, "
        "and print one line naming OUT and the verdict; an existing OUT is kept if identical and refused if "
        "different. Either way it exits 0 only for a VALID journal and 1 for any other verdict.",
    )
    replay.add_argument("path", metavar="PATH", help=_PATH_HELP)
    replay.add_argument("--html", metavar="OUT",
                        help="write the timeline as one self-contained HTML file instead of printing it")
    replay.add_argument("--evidence", metavar="DIR",
                        help="an evidence directory of the same stage: its receipts name each sandbox (its phase: "
                        "extract, resolve, fetch, install; or its case) and give each case op's limit class, so a "
                        "timeout kill and an output-cap kill read differently")
    replay.set_defaults(handler=_replay)
