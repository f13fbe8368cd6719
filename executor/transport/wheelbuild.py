"""A small deterministic builder of pure-Python wheels, for the demo candidate (examples/candidate/).

The same sources give the same wheel bytes on any machine and at any time:
entries are stored (not deflated, so no zlib version can change a byte) in
sorted order with the ``.dist-info`` files last and ``RECORD`` at the very
end; every timestamp is 1980-01-01 00:00:00, the zip epoch; every file is
mode 0644; and ``METADATA``, ``WHEEL``, ``entry_points.txt`` and ``RECORD``
are written in a fixed layout. It reads a closed subset of each project's
``pyproject.toml`` and never runs code from the sources.

``scripts/build-demo [OUT]`` builds every project under examples/candidate/.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import sys
import tomllib
import zipfile

from journal.createonly import open_directory, publish_once
from journal.errors import Refused

GENERATOR = "casebox-wheelbuild 1"
TAG = "py3-none-any"
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
FILE_MODE = 0o100644
MAX_SOURCE_FILES = 256
MAX_SOURCE_BYTES = 1 << 20
NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?\Z")
VERSION = re.compile(r"[0-9]+(?:\.[0-9]+)*\Z")
ENTRY_POINT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*\Z")
PROJECT_KEYS = ("name", "version", "description", "requires-python", "dependencies", "scripts")
_LINE = re.compile(r"[ -~]*\Z")


def _text(value: object, where: str) -> str:
    if type(value) is not str or not _LINE.match(value):
        raise Refused(where, "must be one line of printable ASCII")
    return value


class Project:
    """The closed subset of ``[project]`` a demo wheel needs; ``[build-system]`` is for other builders."""

    def __init__(self, source: str) -> None:
        shown = os.path.join(source, "pyproject.toml")
        with open(shown, "rb") as file:
            try:
                table = tomllib.load(file)
            except tomllib.TOMLDecodeError as error:
                raise Refused(shown, f"is not valid TOML ({error})") from None
        unknown = sorted(set(table) - {"project", "build-system"})
        if unknown:
            raise Refused(f"{shown}: {unknown[0]}", "is not a table this builder reads")
        project = table.get("project")
        if type(project) is not dict:
            raise Refused(f"{shown}: project", "must be a table")
        unknown = sorted(set(project) - set(PROJECT_KEYS))
        if unknown:
            raise Refused(f"{shown}: project.{unknown[0]}", "is not a key this builder reads")
        self.source = source
        self.name = _text(project.get("name"), f"{shown}: project.name")
        self.version = _text(project.get("version"), f"{shown}: project.version")
        if not NAME.match(self.name) or not VERSION.match(self.version):
            raise Refused(f"{shown}: project", "needs a plain name and a dotted numeric version")
        self.summary = _text(project.get("description", ""), f"{shown}: project.description")
        self.requires_python = _text(project.get("requires-python", ""), f"{shown}: project.requires-python")
        dependencies = project.get("dependencies", [])
        if type(dependencies) is not list:
            raise Refused(f"{shown}: project.dependencies", "must be an array of strings")
        self.dependencies = [_text(item, f"{shown}: project.dependencies") for item in dependencies]
        scripts = project.get("scripts", {})
        if type(scripts) is not dict:
            raise Refused(f"{shown}: project.scripts", "must be a table")
        for key, value in scripts.items():
            if not NAME.match(key) or not ENTRY_POINT.match(_text(value, f"{shown}: project.scripts.{key}")):
                raise Refused(f"{shown}: project.scripts.{key}", "must name a script and a module:function")
        self.scripts = dict(sorted(scripts.items()))

    @property
    def escaped(self) -> str:
        """The name as wheel file names spell it: runs of - _ . become one _, lowercased."""
        return re.sub(r"[-_.]+", "_", self.name).lower()

    @property
    def package(self) -> str:
        return self.escaped

    @property
    def dist_info(self) -> str:
        return f"{self.escaped}-{self.version}.dist-info"

    @property
    def wheel_name(self) -> str:
        return f"{self.escaped}-{self.version}-{TAG}.whl"

    def metadata(self) -> bytes:
        lines = ["Metadata-Version: 2.1", f"Name: {self.name}", f"Version: {self.version}"]
        if self.summary:
            lines.append(f"Summary: {self.summary}")
        if self.requires_python:
            lines.append(f"Requires-Python: {self.requires_python}")
        lines += [f"Requires-Dist: {dependency}" for dependency in self.dependencies]
        return ("\n".join(lines) + "\n").encode("ascii")

    def wheel(self) -> bytes:
        return f"Wheel-Version: 1.0\nGenerator: {GENERATOR}\nRoot-Is-Purelib: true\nTag: {TAG}\n".encode("ascii")

    def entry_points(self) -> bytes | None:
        if not self.scripts:
            return None
        lines = ["[console_scripts]"] + [f"{name} = {target}" for name, target in self.scripts.items()]
        return ("\n".join(lines) + "\n").encode("ascii")


def _package_files(project: Project) -> list[tuple[str, bytes]]:
    """Every regular file of the package, sorted by path; bytecode caches are skipped, anything else refused."""
    root = os.path.join(project.source, project.package)
    found: list[tuple[str, bytes]] = []
    total = 0

    def walk(directory: str, prefix: str) -> None:
        nonlocal total
        for entry in sorted(os.scandir(directory), key=lambda item: item.name):
            path = f"{prefix}/{entry.name}"
            if entry.is_dir(follow_symlinks=False):
                if entry.name != "__pycache__":
                    walk(entry.path, path)
            elif entry.name.endswith(".pyc"):
                continue
            elif entry.is_file(follow_symlinks=False):
                with open(entry.path, "rb") as file:
                    data = file.read(MAX_SOURCE_BYTES + 1)
                total += len(data)
                if len(found) >= MAX_SOURCE_FILES or total > MAX_SOURCE_BYTES:
                    raise Refused(root, f"holds more than {MAX_SOURCE_FILES} files or {MAX_SOURCE_BYTES} bytes")
                found.append((path, data))
            else:
                raise Refused(entry.path, "must be a regular file or a directory, not a symlink or a device")

    if not os.path.isdir(root) or os.path.islink(root):
        raise Refused(root, f"must be the package directory of {project.name}")
    walk(root, project.package)
    found.sort(key=lambda item: item[0].encode("utf-8"))
    return found


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")


def build_wheel(source: str) -> tuple[str, bytes]:
    """The wheel of the project in ``source``: its file name and its bytes."""
    project = Project(source)
    entries = _package_files(project)
    info = [("METADATA", project.metadata()), ("WHEEL", project.wheel())]
    if project.entry_points() is not None:
        info.append(("entry_points.txt", project.entry_points()))
    entries += sorted((f"{project.dist_info}/{name}", data) for name, data in info)
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in entries)
    entries.append((f"{project.dist_info}/RECORD", (record + f"{project.dist_info}/RECORD,,\n").encode("utf-8")))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for path, data in entries:
            info_entry = zipfile.ZipInfo(path, date_time=ZIP_EPOCH)
            info_entry.create_system = 3
            info_entry.external_attr = FILE_MODE << 16
            info_entry.compress_type = zipfile.ZIP_STORED
            archive.writestr(info_entry, data)
    return project.wheel_name, buffer.getvalue()


def projects(candidate_dir: str) -> list[str]:
    """The project directories under ``candidate_dir`` (each holds a pyproject.toml), sorted."""
    return sorted(
        os.path.join(candidate_dir, name)
        for name in os.listdir(candidate_dir)
        if os.path.isfile(os.path.join(candidate_dir, name, "pyproject.toml"))
    )


def build_demo(candidate_dir: str, out_dir: str) -> list[str]:
    """Build every project under ``candidate_dir`` into ``out_dir``, each wheel created once; their paths.

    A wheel already there with the same bytes is accepted; one with other
    bytes is refused, since the same sources always give the same bytes.
    """
    os.makedirs(out_dir, exist_ok=True)
    dir_fd = open_directory(out_dir)
    paths = []
    try:
        for source in projects(candidate_dir):
            name, data = build_wheel(source)
            path = os.path.join(out_dir, name)
            publish_once(dir_fd, name, data, mode=0o644, shown=path)
            paths.append(path)
    finally:
        os.close(dir_fd)
    return paths


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m executor.transport.wheelbuild CANDIDATE_DIR OUT_DIR", file=sys.stderr)
        return 64
    try:
        for path in build_demo(argv[0], argv[1]):
            with open(path, "rb") as file:
                print(hashlib.sha256(file.read()).hexdigest(), path)
    except Refused as refusal:
        print(f"build-demo: {refusal.sentence()}", file=sys.stderr)
        return 64
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
