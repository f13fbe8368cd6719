"""``casebox journal verify|show|replay``: a reviewer's view of a cleanup journal (docs/journal-format.md).

Each command takes a journal file, or a stage or tombstone directory holding
one as ``journal``. They run unprivileged anywhere, and exit 0 only when the
journal is VALID, 1 for any other verdict, and 64 when the path cannot be read.
"""

from __future__ import annotations

import argparse
import os

from executor.frontend import EXIT_NOT_OK, EXIT_OK, say, say_json
from journal.createonly import open_directory, publish_once
from journal.files import load_for_review
from journal.closed import SHA256_HEX
from journal.format import ID, ID_RULE
from journal.reader import Reading, Verdict, read_journal
from journal.replay import render_text
from journal.replay_html import render_html
from journal.strictjson import canonical
from journal.timeline import timeline

_PATH_HELP = "a journal file, or a stage or tombstone directory holding one as 'journal'"


def _hex(text: str) -> str:
    if not SHA256_HEX.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not 64 lowercase hex digits")
    return text


def _id(text: str) -> str:
    if not ID.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} {ID_RULE}")
    return text


def _read(args: argparse.Namespace) -> tuple[str, Reading]:
    shown, data = load_for_review(args.path)
    reading = read_journal(
        data,
        expect_stage_id=getattr(args, "expect_stage", None),
        expect_head=getattr(args, "expect_head", None),
    )
    return shown, reading


def _exit(reading: Reading) -> int:
    return EXIT_OK if reading.verdict is Verdict.VALID else EXIT_NOT_OK


def _summary(reading: Reading) -> dict:
    return {
        "verdict": str(reading.verdict),
        "records": len(reading.records),
        "valid_bytes": reading.valid_bytes,
        "head": reading.head,
        "reason": reading.reason,
    }


def _verify(args: argparse.Namespace) -> int:
    shown, reading = _read(args)
    if args.json:
        say_json(_summary(reading))
    else:
        say(f"{shown}: {reading.verdict}, {len(reading.records)} records, {reading.valid_bytes} bytes, "
              f"head {reading.head or '(none)'}: {reading.reason}")
    return _exit(reading)


def _shown(value: object) -> str:
    """A field value on one line; a string with a space, or an empty one, is quoted."""
    if type(value) is str and (not value or " " in value):
        return canonical(value).decode("ascii")
    return str(value)


def _show(args: argparse.Namespace) -> int:
    shown, reading = _read(args)
    if args.json:
        entries = [
            {"offset": record.offset, "kind": record.kind.name, "version": record.version,
             "length": len(record.payload), "digest": record.digest, "fields": record.fields}
            for record in reading.records
        ]
        say_json({**_summary(reading), "entries": entries})
        return _exit(reading)
    for record in reading.records:
        fields = " ".join(f"{key}={_shown(value)}" for key, value in record.fields.items() if key != "prev")
        say(f"{record.offset:>7}  {record.kind.name:<20}  {fields}")
    say(f"{shown}: {reading.verdict}, {len(reading.records)} records, {reading.valid_bytes} bytes, "
          f"head {reading.head or '(none)'}: {reading.reason}")
    return _exit(reading)


def _replay(args: argparse.Namespace) -> int:
    shown, reading = _read(args)
    if args.html is None:
        for line in render_text(reading, shown).splitlines():
            say(line)
        return _exit(reading)
    directory, name = os.path.split(os.path.abspath(args.html))
    dir_fd = open_directory(directory)
    try:
        publish_once(dir_fd, name, render_html(reading, shown).encode("utf-8"), mode=0o644, shown=args.html)
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
        description="Decode every frame, check the chain and print one verdict line. With --json print an "
        "object with verdict, records, valid_bytes, head and reason.",
    )
    verify.add_argument("path", metavar="PATH", help=_PATH_HELP)
    verify.add_argument("--expect-head", metavar="HEX", type=_hex,
                        help="the head the evidence holds (receipts, seal); a different head is SUBSTITUTED")
    verify.add_argument("--expect-stage", metavar="ID", type=_id,
                        help="the stage the journal must be bound to; another stage is SUBSTITUTED")
    verify.add_argument("--json", action="store_true", help="print one JSON object")
    verify.set_defaults(handler=_verify)

    show = commands.add_parser(
        "show",
        help="print every record with its offset",
        description="Print each record of the valid prefix on one line with its offset, kind and fields "
        "(prev omitted), then the verdict line. With --json print one object: the verify fields plus "
        "entries, each with offset, kind, version, length, digest and fields.",
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
    replay.set_defaults(handler=_replay)
