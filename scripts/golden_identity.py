#!/usr/bin/env python3
"""Independent reference encoder for the candidate identity digest (docs/transport.md).

It imports nothing of casebox. For each vector it writes NAME.stream, the exact
bytes that are hashed, and it lists every vector's records and digest in
vectors.json. Usage:

    scripts/golden_identity.py [OUTDIR]     (default: golden/identity)
"""

import hashlib
import json
import pathlib
import struct
import sys

TAG = b"casebox.candidate-identity"
VERSION = 1
PRESENT, TYPE_REGULAR = 0x01, 0x01


def present(path, content, executable=False):
    return {"state": "present", "path": path, "executable": executable, "content_hex": content.hex()}


VECTORS = (
    ("empty", []),
    ("one-empty-file", [present("a", b"")]),
    ("one-file", [present("manifest.json", b'{"schema":"casebox.manifest.v1"}')]),
    ("executable", [present("run.sh", b"#!/bin/sh\nexit 0\n", executable=True)]),
    ("not-executable", [present("run.sh", b"#!/bin/sh\nexit 0\n")]),
    ("two-files", [present("gone.txt", b""), present("kept.txt", b"kept\n")]),
    ("split-a-bc", [present("a", b"bc")]),
    ("split-ab-c", [present("ab", b"c")]),
    (
        "sorted-three",
        [present("Alpha-1.0-py3-none-any.whl", b"A"), present("beta-1.0-py3-none-any.whl", b"B"), present("manifest.json", b"{}")],
    ),
    ("binary-4096", [present("blob.bin", bytes(range(256)) * 16)]),
)


def encode(records):
    out = bytearray(struct.pack(">H", len(TAG)) + TAG + struct.pack(">IQ", VERSION, len(records)))
    paths = [record["path"].encode("ascii") for record in records]
    assert paths == sorted(paths) and len(set(paths)) == len(paths), "records must be sorted and unique"
    for record, path in zip(records, paths):
        content = bytes.fromhex(record["content_hex"])
        out += struct.pack(">BH", PRESENT, len(path)) + path
        out += struct.pack(">BBQ", TYPE_REGULAR, int(record["executable"]), len(content)) + content
    return bytes(out)


def main(argv):
    outdir = pathlib.Path(argv[1] if len(argv) > 1 else pathlib.Path(__file__).resolve().parent.parent / "golden/identity")
    outdir.mkdir(parents=True, exist_ok=True)
    listing = []
    for name, records in VECTORS:
        stream = encode(records)
        (outdir / f"{name}.stream").write_bytes(stream)
        listing.append({"name": name, "records": records, "digest": "sha256:" + hashlib.sha256(stream).hexdigest()})
    (outdir / "vectors.json").write_text(json.dumps({"vectors": listing}, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
