#!/usr/bin/env python3
"""Independent reference for golden/transport/: fixture wheels and their bundle.

It follows docs/transport.md and imports nothing of casebox, so a mistake in
casebox's encoder cannot hide in the golden bytes. Usage:

    scripts/golden_transport.py [OUTDIR]     (default: golden/transport)

It writes three tiny wheels (stored zips with fixed times and modes, so they
are the same on every machine), candidate.tar (what `casebox pack` must write
for them) and candidate.tar.sha256.
"""

import hashlib
import io
import json
import pathlib
import sys
import zipfile

ZIP_TIME = (1980, 1, 1, 0, 0, 0)
# (wheel file name, dist-info directory, module file, module text); chosen so that
# the manifest sorts between the wheels and one wheel has a build tag.
WHEELS = (
    ("Alpha_Tool-1.0-py3-none-any.whl", "Alpha_Tool-1.0.dist-info", "alpha_tool.py", "def hello():\n    return 'alpha'\n"),
    ("beta-2.0.1-py3-none-any.whl", "beta-2.0.1.dist-info", "beta.py", "VALUE = 2\n"),
    ("zeta_cli-0.1-1-py3-none-any.whl", "zeta_cli-0.1.dist-info", "zeta_cli.py", "def main():\n    print('zeta')\n"),
)


def wheel_bytes(dist_info, module, text):
    name, version = dist_info[: -len(".dist-info")].rsplit("-", 1)
    files = (
        (module, text),
        (f"{dist_info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"),
        (f"{dist_info}/WHEEL", "Wheel-Version: 1.0\nGenerator: casebox-golden\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
        (f"{dist_info}/RECORD", f"{module},,\n{dist_info}/METADATA,,\n{dist_info}/WHEEL,,\n{dist_info}/RECORD,,\n"),
    )
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        for path, content in files:
            info = zipfile.ZipInfo(path, ZIP_TIME)
            info.create_system = 3
            info.external_attr = 0o100644 << 16
            archive.writestr(info, content.encode("ascii"))
    return out.getvalue()


def octal(value, width):
    return b"%0*o\x00" % (width - 1, value)


def header(name, directory, size):
    """One ustar header as docs/transport.md fixes it (every name here fits the name field)."""
    raw = (name + "/" if directory else name).encode("ascii")
    assert len(raw) <= 100
    block = bytearray(512)
    block[0:100] = raw.ljust(100, b"\x00")
    block[100:108] = octal(0o755 if directory else 0o644, 8)
    block[108:116] = octal(0, 8)
    block[116:124] = octal(0, 8)
    block[124:136] = octal(size, 12)
    block[136:148] = octal(0, 12)
    block[148:156] = b" " * 8
    block[156:157] = b"5" if directory else b"0"
    block[257:263] = b"ustar\x00"
    block[263:265] = b"00"
    block[329:337] = octal(0, 8)
    block[337:345] = octal(0, 8)
    block[148:156] = b"%06o\x00 " % sum(block)
    return bytes(block)


def bundle(wheels):
    listed = [
        {"file": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in sorted(wheels)
    ]
    manifest = json.dumps(
        {"schema": "casebox.manifest.v1", "wheels": listed}, sort_keys=True, separators=(",", ":"), ensure_ascii=True
    ).encode("ascii")
    entries = [("candidate", True, b""), ("candidate/manifest.json", False, manifest)]
    entries += [("candidate/" + name, False, data) for name, data in wheels]
    out = bytearray()
    for name, directory, data in sorted(entries, key=lambda entry: entry[0].encode("ascii")):
        out += header(name, directory, len(data)) + data + bytes(-len(data) % 512)
    out += bytes(1024)
    out += bytes(-len(out) % 10240)
    return bytes(out)


def main(argv):
    outdir = pathlib.Path(argv[1] if len(argv) > 1 else pathlib.Path(__file__).resolve().parent.parent / "golden/transport")
    (outdir / "wheels").mkdir(parents=True, exist_ok=True)
    wheels = []
    for name, dist_info, module, text in WHEELS:
        data = wheel_bytes(dist_info, module, text)
        (outdir / "wheels" / name).write_bytes(data)
        wheels.append((name, data))
    tar = bundle(wheels)
    (outdir / "candidate.tar").write_bytes(tar)
    (outdir / "candidate.tar.sha256").write_text(f"{hashlib.sha256(tar).hexdigest()}  candidate.tar\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
