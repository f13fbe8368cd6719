"""The resolver: the candidate's dependency wheels from an index, for the runtime (docs/pipeline.md).

It runs only in its own sandbox, as the dedicated UID, started by the
dependency preparer::

    python -I -S -B -c BOOT resolve /cap/request /cap/candidate/candidate INDEX

``INDEX`` is ``/cap/index`` (a find-links directory, read-only; the sandbox
has loopback only), ``-`` (no index), or an http(s) URL of a simple
repository (PEP 503/691; only then does the sandbox have the host's network,
and the index is read with executor/simpleindex.py).

It reads wheels as data: each wheel's ``*.dist-info/METADATA`` (``Name``,
``Version``, ``Requires-Python``, ``Requires-Dist``), with every marker
evaluated for the runtime it runs on, which is the runtime the cases run
on. It never imports candidate code. Requirement, marker, specifier, version
and tag logic is ``packaging``, taken from the installer wheel (pip's
vendored copy, imported from the zip in the request capability).

Resolution is breadth first from the candidate's requirements and the
plan's (``pytest`` when the shard has a pytest case), in sorted order: a
project is pinned to the highest version of the index that is compatible
with the runtime's tags and ``Requires-Python`` (the page's, when a network
index states one, and the wheel's own), is not yanked, and satisfies the
requirements seen when it is first needed. There is no backtracking: a later
requirement that excludes a pin is a ``conflict``. The answer is the leaves of
``casebox.resolver.v1`` (executor/resolverproto.py) on standard output; each
PIN carries the SHA-256 of the bytes the resolver read.
"""

from __future__ import annotations

import collections
import dataclasses
import email.parser
import email.policy
import hashlib
import os
import platform
import stat
import sys
import zipfile
from email.message import Message
from typing import Iterator, Sequence

from executor.manifest import canonical_project, wheel_project
from executor.resolverproto import PROTOCOL, leaf, request_from_bytes
from journal.errors import Refused

SANDBOX_MODULES = (
    "executor/resolver.py",
    "executor/resolverproto.py",
    "executor/simpleindex.py",
    "executor/manifest.py",
    "executor/ustar.py",
    "journal/__init__.py",
    "journal/errors.py",
    "journal/untrusted.py",
    "journal/strictjson.py",
    "journal/closed.py",
)
REQUEST = "request.json"
METADATA_MAX_BYTES = 1 << 20
PLAN = "plan"


class MetadataError(Exception):
    """A wheel whose METADATA cannot be used."""


def metadata(path: str) -> Message:
    """The headers of the one top-level ``*.dist-info/METADATA`` of the wheel at ``path``, read as data."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = [name for name in archive.namelist() if name.count("/") == 1 and name.endswith(".dist-info/METADATA")]
            if len(names) != 1:
                raise MetadataError(f"{os.path.basename(path)} holds {len(names)} top-level METADATA files, not one")
            with archive.open(names[0]) as member:
                data = member.read(METADATA_MAX_BYTES + 1)
    except (OSError, zipfile.BadZipFile, RuntimeError, EOFError, NotImplementedError, ValueError, KeyError) as error:
        raise MetadataError(f"{os.path.basename(path)} cannot be read as a wheel ({error})") from None
    if len(data) > METADATA_MAX_BYTES:
        raise MetadataError(f"{os.path.basename(path)} has a METADATA over {METADATA_MAX_BYTES} bytes")
    return email.parser.BytesHeaderParser(policy=email.policy.compat32).parsebytes(data)


def _sha256(path: str) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            hasher.update(chunk)
    return hasher.hexdigest()


class Failure(Exception):
    def __init__(self, reason: str, requirement: str) -> None:
        super().__init__(f"{reason}: {requirement}")
        self.reason = reason
        self.requirement = requirement


def _wheels(directory: str) -> list[str]:
    names = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".whl") and stat.S_ISREG(os.stat(os.path.join(directory, name), follow_symlinks=False).st_mode):
            names.append(name)
    return names


@dataclasses.dataclass(frozen=True)
class Offer:
    """A wheel an index offers: its file name, what the index says of it, and where to get it."""

    file: str
    requires_python: str | None = None
    yanked: bool = False
    link: object = None


class LocalIndex:
    """A find-links directory (or none): every regular ``*.whl`` in it."""

    def __init__(self, directory: str | None) -> None:
        self.directory = directory
        self.by_project: dict[str, list[Offer]] = collections.defaultdict(list)
        for file in _wheels(directory) if directory else []:
            try:
                project, _ = wheel_project(file, file)
            except Refused:
                continue
            self.by_project[project].append(Offer(file))

    def offers(self, project: str) -> list[Offer]:
        return self.by_project.get(project, [])

    def fetch(self, offer: Offer) -> tuple[str, str]:
        path = os.path.join(self.directory, offer.file)
        return path, _sha256(path)

    def release(self, path: str) -> None:
        """A local file stays where it is."""


class NetworkIndex:
    """A simple repository over http(s): pages read and wheels downloaded into the sandbox's /tmp."""

    def __init__(self, client) -> None:
        self.client = client

    def offers(self, project: str) -> list[Offer]:
        from executor.simpleindex import IndexFailure

        try:
            links = self.client.links(project)
        except IndexFailure as failure:
            raise Failure(failure.reason, failure.detail) from None
        return [Offer(link.file, link.requires_python, link.yanked, link) for link in links]

    def fetch(self, offer: Offer) -> tuple[str, str]:
        from executor.simpleindex import IndexFailure

        try:
            return self.client.download(offer.link)
        except IndexFailure as failure:
            raise Failure(failure.reason, failure.detail) from None

    def release(self, path: str) -> None:
        os.unlink(path)


class Resolution:
    """One breadth-first resolution; :meth:`leaves` yields the protocol's lines as it goes."""

    def __init__(self, packaging, *, candidate_dir: str, index, requirements: Sequence[str]) -> None:
        self.packaging = packaging
        self.environment = packaging.markers.default_environment()
        self.python = platform.python_version()
        self.candidate_dir = candidate_dir
        self.index = index
        self.requirements = list(requirements)
        self.supported = set(packaging.tags.sys_tags())
        self.available: dict[str, list[tuple[object, str, Offer]]] = {}

    def _offers(self, project: str) -> list[tuple[object, str, Offer]]:
        """The index's wheels of ``project`` this runtime can use, newest first: tags, Requires-Python, not yanked."""
        if project not in self.available:
            found = []
            for offer in self.index.offers(project):
                try:
                    _, _, _, tags = self.packaging.utils.parse_wheel_filename(offer.file)
                    named, version = wheel_project(offer.file, offer.file)
                    parsed = self.packaging.version.Version(version)
                except (Refused, ValueError):
                    continue
                if named != project or offer.yanked or not tags & self.supported:
                    continue
                if offer.requires_python is not None and not self._python_in(offer.requires_python):
                    continue
                found.append((parsed, version, offer))
            found.sort(key=lambda item: (item[0], item[2].file), reverse=True)
            self.available[project] = found
        return self.available[project]

    def _applies(self, requirement, extras: set[str]) -> bool:
        if requirement.marker is None:
            return True
        return any(requirement.marker.evaluate({**self.environment, "extra": extra}) for extra in extras)

    def _requirements_of(self, message, extras: set[str], by: str) -> list[tuple[object, str]]:
        found = []
        for line in sorted(message.get_all("Requires-Dist") or []):
            try:
                requirement = self.packaging.requirements.Requirement(line)
            except self.packaging.requirements.InvalidRequirement:
                raise Failure("metadata", f"{by} declares the invalid requirement {line!r}") from None
            if self._applies(requirement, extras):
                found.append((requirement, by))
        return found

    def _read(self, path: str, project: str, version: str):
        try:
            message = metadata(path)
        except MetadataError as error:
            raise Failure("metadata", str(error)) from None
        named = canonical_project(message.get("Name") or "")
        stated = message.get("Version") or ""
        try:
            same = named == project and self.packaging.version.Version(stated) == self.packaging.version.Version(version)
        except ValueError:
            same = False
        if not same:
            raise Failure("metadata", f"{os.path.basename(path)} declares {named or '?'} {stated or '?'}")
        return message

    def _python_in(self, declared: str) -> bool:
        try:
            return self.packaging.specifiers.SpecifierSet(declared).contains(self.python, prereleases=True)
        except self.packaging.specifiers.InvalidSpecifier:
            return False

    def _python_allows(self, message) -> bool:
        declared = message.get("Requires-Python")
        return not declared or self._python_in(declared)

    def _choose(self, project: str, requirement) -> tuple[str, str, str, object]:
        """(version, file, sha256, METADATA) of the newest usable wheel that satisfies ``requirement``."""
        for parsed, version, offer in self._offers(project):
            if not requirement.specifier.contains(parsed):
                continue
            path, digest = self.index.fetch(offer)
            try:
                message = self._read(path, project, version)
            finally:
                self.index.release(path)
            if self._python_allows(message):
                return version, offer.file, digest, message
        raise Failure("no_match", str(requirement))

    def leaves(self) -> Iterator[bytes]:
        candidate = {}
        for file in _wheels(self.candidate_dir):
            project, version = wheel_project(file, file)
            candidate[project] = (version, file)
        yield leaf(
            "BEGIN", 0, protocol=PROTOCOL, python=self.python,
            candidate=[{"name": project, "version": version} for project, (version, _) in sorted(candidate.items())],
        )
        seq = 1
        try:
            pending: collections.deque = collections.deque()
            for project, (version, file) in sorted(candidate.items()):
                message = self._read(os.path.join(self.candidate_dir, file), project, version)
                pending.extend(self._requirements_of(message, {""}, project))
            for line in self.requirements:
                pending.append((self.packaging.requirements.Requirement(line), PLAN))
            pinned: dict[str, tuple[object, object, set[str]]] = {}
            while pending:
                requirement, by = pending.popleft()
                project = canonical_project(requirement.name)
                extras = set(requirement.extras)
                if project in candidate:
                    if not requirement.specifier.contains(candidate[project][0], prereleases=True):
                        raise Failure("candidate_conflict", f"{by} requires {requirement}")
                    continue
                if project in pinned:
                    version, message, done = pinned[project]
                    if not requirement.specifier.contains(version, prereleases=True):
                        raise Failure("conflict", f"{by} requires {requirement}, but {project} {version} is pinned")
                    if extras - done:
                        done |= extras
                        pending.extend(self._requirements_of(message, extras, project))
                    continue
                version, file, digest, message = self._choose(project, requirement)
                pinned[project] = (version, message, extras | {""})
                yield leaf("PIN", seq, name=project, version=version, file=file, sha256=digest, required_by=by)
                seq += 1
                pending.extend(self._requirements_of(message, extras | {""}, project))
        except Failure as failure:
            yield leaf("FAIL", seq, reason=failure.reason, requirement=failure.requirement[:512])
            return
        yield leaf("END", seq, pins=seq - 1)


def vendored_packaging():
    """packaging as pip vendors it; in the sandbox pip is the installer wheel, imported from its zip."""
    import pip._vendor.packaging.markers
    import pip._vendor.packaging.requirements
    import pip._vendor.packaging.specifiers
    import pip._vendor.packaging.tags
    import pip._vendor.packaging.utils
    import pip._vendor.packaging.version

    return pip._vendor.packaging


def _certificates(installer: str) -> str | None:
    """The CA bundle pip vendors (certifi), read from the installer wheel: what https is verified against."""
    from executor.simpleindex import CERTIFI

    try:
        with zipfile.ZipFile(installer) as archive:
            return archive.read(CERTIFI).decode("ascii")
    except (OSError, KeyError, zipfile.BadZipFile, UnicodeDecodeError):
        return None


def open_index(index: str, installer: str):
    """The index the resolver reads: a network index for an http(s) URL, else a directory or none (``-``)."""
    if index.startswith(("http://", "https://")):
        from executor.simpleindex import SimpleIndex

        return NetworkIndex(SimpleIndex(index, cadata=_certificates(installer), scratch=os.environ.get("TMPDIR", "/tmp")))
    return LocalIndex(None if index == "-" else index)


def main(argv: Sequence[str]) -> int:
    """``REQUEST_DIR CANDIDATE_DIR INDEX``: the leaves on stdout; exit 0 when every leaf was written."""
    request_dir, candidate_dir, index = argv
    with open(os.path.join(request_dir, REQUEST), "rb") as file:
        request = request_from_bytes(file.read(1 << 16))
    installer = os.path.join(request_dir, request.installer_file)
    sys.path.insert(0, installer)
    packaging = vendored_packaging()
    resolution = Resolution(
        packaging, candidate_dir=candidate_dir, index=open_index(index, installer), requirements=request.requirements,
    )
    out = sys.stdout.buffer
    for line in resolution.leaves():
        out.write(line)
    out.flush()
    return 0
