"""``casebox pack``: wheels into one deterministic ustar bundle, written create-once."""

from __future__ import annotations

import argparse
import os

from executor.transport import pack
from executor.cli.frontend import EXIT_OK
from journal.createonly import open_directory, publish_once
from journal.strictjson import canonical


def _pack(args: argparse.Namespace) -> int:
    bundle = pack.build(pack.read_wheels(args.wheels))
    directory, name = os.path.split(args.out)
    dir_fd = open_directory(directory or ".")
    try:
        publish_once(dir_fd, name, bundle, shown=args.out)
    finally:
        os.close(dir_fd)
    print(canonical(pack.coordinate(bundle).as_dict()).decode("ascii"))
    return EXIT_OK


def register(subparsers: argparse._SubParsersAction) -> None:
    command = subparsers.add_parser(
        "pack",
        help="pack 1 to 3 wheels and their manifest into a deterministic ustar bundle",
        description="Pack 1 to 3 wheels and their manifest v1 into FILE: plain POSIX ustar, one top-level "
        "candidate/ directory, entries sorted, every mode, owner and time fixed, so the same wheels give the "
        "same bytes on any machine (docs/transport.md). Each wheel must have a valid wheel file name and be a "
        "zip with a *.dist-info/METADATA. FILE is created once: an identical existing file is accepted, a "
        "different one is refused. Prints the coordinate {\"sha256\": ..., \"size\": ...} as canonical JSON.",
    )
    command.add_argument("wheels", metavar="WHEEL", nargs="+", help="a wheel file; its name is kept in the bundle")
    command.add_argument("--out", metavar="FILE", required=True, help="the bundle to create")
    command.set_defaults(handler=_pack)
