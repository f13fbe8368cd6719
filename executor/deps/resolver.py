"""The resolver: pip's own resolver, run in its sandbox, answering in ``casebox.resolver.v2`` (docs/pipeline.md).

It runs only in its own sandbox, as the dedicated UID, started by the
dependency preparer::

    python -I -S -B -c BOOT resolve /cap/request /cap/candidate/candidate INDEX PROXY

``INDEX`` is ``/cap/index`` (a find-links directory, read-only; the sandbox
has loopback only), ``-`` (no index), or an http(s) URL of a simple
repository (PEP 503/691), which pip reaches through ``PROXY``, the steward's
forwarder (``--proxy``: pip then ignores proxy variables and ``.netrc``).

pip is the installer wheel of the request, unpacked on the sandbox's /tmp
(executor/inside.py). It resolves twice in one process, each time with
``install --dry-run --ignore-installed --report`` and wheels only
(``--only-binary=:all:``), so nothing is built and no candidate code runs:

1. **the runner**: the plan's runner requirements alone, against the index.
   The bundle is never offered, so no candidate project can stand in for a
   runner distribution (E7);
2. **the candidate**: the candidate's wheels, given as files, against the
   same index, so each of its projects is the bundle's own and its
   dependencies come from the index. A candidate whose wheels require
   nothing needs no resolution, and pip is not run for it. With no runner
   either, pip's resolver is never imported: only its vendored
   ``packaging``, to check a ``Requires-Python``, and not even that when no
   wheel states one.

Before either, each candidate wheel's ``*.dist-info/METADATA`` is read as data
(the name and version must be the file name's) and every ``Requires-Dist``
parsed with pip's vendored ``packaging``: one that names a direct URL is
refused (``direct_url``) before any resolver runs. A dependency from the
index that requires a direct URL is refused the same way, inside pip, as
pip makes that requirement and before it fetches anything for it
(:func:`guard_dependencies`). The top-level modules
each wheel installs are listed from its member names, for the preparer's
shadowing rules. pip's report gives every pin's file, URL and SHA-256; a
conflict is answered with the requirements pip names as its cause.
"""

from __future__ import annotations

import contextlib
import email.parser
import email.policy
import io
import json
import os
import platform
import re
import stat
import sys
import tempfile
import urllib.parse
import zipfile
from email.message import Message
from typing import Iterator, Sequence

from executor.transport.manifest import canonical_project, wheel_project
from executor.deps.protocol import CANDIDATE, MAX_MODULES, MAX_REQUIREMENT_BYTES, NO_PROXY, PROTOCOL, RUNNER, leaf, request_from_bytes
from executor.deps.shadowing import modules
from executor.transport.ustar import check_relative_path
from journal.errors import Refused

SANDBOX_MODULES = (
    "executor/__init__.py",
    "executor/deps/__init__.py",
    "executor/transport/__init__.py",
    "executor/deps/resolver.py",
    "executor/deps/protocol.py",
    "executor/deps/shadowing.py",
    "executor/transport/manifest.py",
    "executor/transport/ustar.py",
    "journal/__init__.py",
    "journal/errors.py",
    "journal/untrusted.py",
    "journal/strictjson.py",
    "journal/closed.py",
)
REQUEST = "request.json"
METADATA_MAX_BYTES = 1 << 20
REPORT_MAX_BYTES = 16 << 20
PIP_OPTIONS = (
    "--dry-run", "--ignore-installed", "--isolated", "--only-binary=:all:", "--no-cache-dir",
    "--disable-pip-version-check", "--no-input", "--progress-bar", "off", "--timeout", "60", "--retries", "1",
)
# What pip says of a resolution that cannot succeed (pip's messages since 20.3; docs/pipeline.md).
_CAUSES = "The conflict is caused by:"
_NO_MATCH = re.compile(r"No matching distribution found for (\S+)")
_DEPENDS_ON = re.compile(r"depends on ([A-Za-z0-9][A-Za-z0-9._-]*)")
_UNREACHABLE = ("Failed to establish a new connection", "Max retries exceeded", "Could not fetch URL", "SSLError")
_HASHES = "DO NOT MATCH THE HASHES"
# A wheel given as a file (the candidate's own) whose Requires-Python excludes the runtime.
_OTHER_PYTHON = re.compile(r"Package '([^']+)' requires a different Python: (\S+) not in '([^']+)'")
# What steward/forwarder.py puts in the reason phrase of every answer it makes itself (a refusal, an
# unreachable destination); pip logs it only in its verbose log, which the resolver asks for with --log.
FORWARDER_MARK = "casebox forwarder:"
# What the forwarder's answers to a page fetch become in pip's verbose log, once its retries are spent.
_GAVE_UP = "Max retries exceeded"
LOG_MAX_BYTES = 4 << 20


class Failure(Exception):
    def __init__(self, reason: str, requirement: str) -> None:
        super().__init__(f"{reason}: {requirement}")
        self.reason = reason
        self.requirement = requirement


def metadata(path: str) -> Message:
    """The headers of the one top-level ``*.dist-info/METADATA`` of the wheel at ``path``, read as data."""
    with zipfile.ZipFile(path) as archive:
        names = [name for name in archive.namelist() if name.count("/") == 1 and name.endswith(".dist-info/METADATA")]
        if len(names) != 1:
            raise Failure("metadata", f"{os.path.basename(path)} holds {len(names)} top-level METADATA files, not one")
        with archive.open(names[0]) as member:
            data = member.read(METADATA_MAX_BYTES + 1)
    if len(data) > METADATA_MAX_BYTES:
        raise Failure("metadata", f"{os.path.basename(path)} has a METADATA over {METADATA_MAX_BYTES} bytes")
    return email.parser.BytesHeaderParser(policy=email.policy.compat32).parsebytes(data)


def _wheels(directory: str) -> list[str]:
    return [
        name for name in sorted(os.listdir(directory))
        if name.endswith(".whl") and stat.S_ISREG(os.stat(os.path.join(directory, name), follow_symlinks=False).st_mode)
    ]


def wheel_modules(file: str, names: Sequence[str]) -> list[str]:
    """The top-level modules the candidate wheel ``file`` installs, from its member ``names``, every one of them.

    A member name must be a clean relative path (the bundle's own rule for names): the installer writes
    ``calc/../typing_extensions.py`` at the top of the tree, beside the modules a listing of ``calc/`` names,
    and the runner's boot and the shadowing rule know a candidate module only by this listing. A wheel with
    more top-level modules than BEGIN may list is refused too, never listed in part.
    """
    for name in names:
        try:
            check_relative_path(name.removesuffix("/"), name)
        except Refused as refusal:
            raise Failure("layout", f"{file} holds the member {name[:200]!r}: {refusal.rule}") from None
    found = modules(names)
    if len(found) > MAX_MODULES:
        raise Failure("layout", f"{file} installs {len(found)} top-level modules, more than the {MAX_MODULES} BEGIN may list")
    return found


class Candidate:
    """One candidate wheel, read as data: its project, version, requirement lines and top-level modules."""

    def __init__(self, directory: str, file: str) -> None:
        self.path = os.path.join(directory, file)
        self.file = file
        self.project, self.version = wheel_project(file, file)
        self.requires: list[str] = []
        self.requires_python: str | None = None
        self.modules: list[str] = []
        self.problem: Failure | None = None
        try:
            with zipfile.ZipFile(self.path) as archive:
                self.modules = wheel_modules(file, archive.namelist())
            message = metadata(self.path)
        except (OSError, zipfile.BadZipFile, RuntimeError, EOFError, NotImplementedError, ValueError, KeyError) as error:
            self.problem = Failure("metadata", f"{file} cannot be read as a wheel ({error})")
            return
        except Failure as failure:
            self.problem = failure
            return
        named = canonical_project(message.get("Name") or "")
        stated = message.get("Version") or ""
        if named != self.project or stated != self.version:
            self.problem = Failure("metadata", f"{file} declares {named or '?'} {stated or '?'}")
        self.requires = list(message.get_all("Requires-Dist") or [])
        self.requires_python = message.get("Requires-Python")

    def check_requirements(self, packaging) -> None:
        """Refuse a runtime the wheel's Requires-Python excludes, a requirement that is not PEP 508, or one that
        names a direct URL (only the index is ever fetched)."""
        if self.requires_python:
            try:
                allowed = packaging.specifiers.SpecifierSet(self.requires_python)
            except packaging.specifiers.InvalidSpecifier:
                raise Failure("metadata", f"{self.project} declares the invalid Requires-Python {self.requires_python[:100]!r}") from None
            if not allowed.contains(platform.python_version(), prereleases=True):
                raise Failure("conflict", f"{self.project} requires Python {self.requires_python}; the runtime is {platform.python_version()}"[:MAX_REQUIREMENT_BYTES])
        for line in self.requires:
            try:
                requirement = packaging.requirements.Requirement(line)
            except packaging.requirements.InvalidRequirement:
                raise Failure("metadata", f"{self.project} declares the invalid requirement {line[:200]!r}") from None
            if requirement.url:
                raise Failure("direct_url", f"{self.project} requires {canonical_project(requirement.name)} from a direct URL")


# What of pip checking a Requires-Python needs; the whole package is some 75 ms more to unpack.
PACKAGING_ONLY = ("pip/__init__.py", "pip/_vendor/__init__.py", "pip/_vendor/packaging/")


def load_pip(wheel: str, *, resolving: bool, requirements: bool):
    """pip, unpacked from the installer wheel (executor/inside.py), all of it when it will ``resolve``; its
    vendored packaging, for a Requires-Python and, when there are ``requirements``, for them."""
    from executor.inside import load_pip as unpack

    unpack(wheel, ("pip/",) if resolving else PACKAGING_ONLY)
    import pip._vendor.packaging.specifiers

    if requirements:
        # Its tokenizer and parser compile some forty regular expressions: 40-60 ms a resolve op needs
        # only when there is a requirement to parse.
        import pip._vendor.packaging.requirements

    return pip._vendor.packaging


# Direct-URL requirements of dependencies that guard_dependencies refused in pip's current run.
_REFUSED: list[Failure] = []


def guard_dependencies() -> None:
    """Refuse, inside pip, every requirement of a distribution pip chose that names a direct URL (``direct_url``).

    pip makes each ``Requires-Dist`` of a distribution it resolves into a
    requirement with the ``install_req_from_req_string`` its resolver was
    built with (``pip._internal.cli.req_command``, pip 20.3 to 24); wrapped
    here, one with a URL stops the resolution before pip opens that URL, and
    :func:`resolve` reports it naming the project that required it. A pip
    without that function is refused rather than run unguarded.
    """
    from pip._internal.cli import req_command
    from pip._internal.exceptions import InstallationError

    make = getattr(req_command, "install_req_from_req_string", None)
    if make is None:
        raise Failure("resolver", "the installer's pip offers no install_req_from_req_string to refuse direct URLs with")

    def refusing(req_string, comes_from=None, **options):
        made = make(req_string, comes_from, **options)
        if made.req is not None and made.req.url:
            by = canonical_project(comes_from.name) if comes_from is not None and comes_from.name else "a dependency"
            _REFUSED.append(Failure("direct_url", f"{by} requires {canonical_project(made.req.name)} from a direct URL"))
            raise InstallationError(f"casebox: {by} requires a direct URL, which is never fetched")
        return made

    req_command.install_req_from_req_string = refusing


def index_options(index: str, proxy: str) -> list[str]:
    """pip's options for ``index``: a simple index reached through ``proxy`` (the forwarder), or a find-links
    directory, or none."""
    if index.startswith(("http://", "https://")):
        return ["--index-url", index] + ([] if proxy == NO_PROXY else ["--proxy", proxy])
    if index == "-":
        return ["--no-index"]
    return ["--no-index", "--find-links", index]


def _run_pip(arguments: list[str]) -> tuple[int, str]:
    """pip's own command line in this process, its output captured (our standard output is the protocol)."""
    from pip._internal.cli.main import main as pip_main

    captured = io.StringIO()
    with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
        try:
            code = pip_main(arguments)
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 1
    return code, captured.getvalue()


def explain(output: str, candidate: set[str], log: str = "") -> Failure:
    """Why pip's resolution failed, from what pip said: a conflict names its causes, a missing match its requirement.

    ``log`` is pip's verbose log of the run: through the forwarder, an index
    page that could not be fetched is only a debug line there, and pip says
    no more than that no version was found, so the forwarder's own sentence
    (a refusal, an unreachable index) is looked for in it first."""
    lines = output.splitlines()
    if _CAUSES in lines:
        causes = []
        for line in lines[lines.index(_CAUSES) + 1:]:
            if not line.strip():
                break
            causes.append(line.strip())
        depended = {canonical_project(match.group(1)) for cause in causes for match in _DEPENDS_ON.finditer(cause)}
        reason = "candidate_conflict" if depended & candidate else "conflict"
        return Failure(reason, "; ".join(causes)[:MAX_REQUIREMENT_BYTES])
    python = _OTHER_PYTHON.search(output)
    if python:
        return Failure("conflict", f"{python.group(1)} requires Python {python.group(3)}; the runtime is {python.group(2)}"[:MAX_REQUIREMENT_BYTES])
    if _HASHES in output:
        return Failure("index_hash", "a wheel the index served does not have the sha256 the index states")
    forwarded = next((line for line in log.splitlines() if FORWARDER_MARK in line), None)
    if forwarded is not None:
        return Failure("index", "the index could not be read (" + forwarded[forwarded.index(FORWARDER_MARK):][:300] + ")")
    given_up = next((line.strip() for line in log.splitlines() if _GAVE_UP in line), None)
    if given_up is not None:
        return Failure("index", "the index could not be read (pip: " + given_up[-300:] + ")")
    if any(marker in output for marker in _UNREACHABLE):
        return Failure("index", "the index could not be read (pip: " + next(line for line in lines if any(m in line for m in _UNREACHABLE))[:300] + ")")
    missing = _NO_MATCH.search(output)
    if missing:
        return Failure("no_match", missing.group(1))
    errors = [line for line in lines if line.startswith("ERROR:")]
    return Failure("resolver", (errors[-1] if errors else "pip exited without saying why")[:MAX_REQUIREMENT_BYTES])


def _tail(path: str) -> str:
    """The last LOG_MAX_BYTES of pip's log (empty when pip wrote none)."""
    try:
        with open(path, "rb") as file:
            file.seek(max(0, os.fstat(file.fileno()).st_size - LOG_MAX_BYTES))
            return file.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _sha256(archive: dict) -> str | None:
    hashes = archive.get("hashes") or {}
    if isinstance(hashes.get("sha256"), str):
        return hashes["sha256"]
    stated = archive.get("hash")
    if isinstance(stated, str) and stated.startswith("sha256="):
        return stated[len("sha256="):]
    return None


def _file_of(url: str) -> str:
    return urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])


def resolve(requirements: list[str], index: list[str], *, scratch: str, direct: dict[str, str]) -> list[tuple[str, str, str, str, str]]:
    """(name, version, file, sha256, url) of every wheel pip's resolver chose for ``requirements`` with the
    ``index`` options (:func:`index_options`).

    ``direct`` maps the path of each wheel given as a file to its project: those
    are the candidate's own, never pinned. Any other direct URL is refused.
    """
    run = len(os.listdir(scratch))
    report, log = os.path.join(scratch, f"report-{run}.json"), os.path.join(scratch, f"pip-{run}.log")
    # Through the forwarder, what went wrong is in pip's verbose log only (explain); it costs pip 0.1 s or more,
    # so it is kept only then.
    logged = ["--log", log] if "--proxy" in index else []
    del _REFUSED[:]
    code, output = _run_pip(["install", *PIP_OPTIONS, "--report", report, *logged, *index, *requirements])
    if _REFUSED:
        raise _REFUSED[0]
    if code != 0:
        raise explain(output, set(direct.values()), _tail(log))
    with open(report, "rb") as file:
        document = json.loads(file.read(REPORT_MAX_BYTES))
    chosen = []
    for item in document.get("install", []):
        info, stated = item.get("download_info") or {}, item.get("metadata") or {}
        url, name = info.get("url", ""), canonical_project(str(stated.get("name", "")))
        parts = urllib.parse.urlsplit(url)
        if parts.scheme == "file" and urllib.parse.unquote(parts.path) in direct:
            continue
        if item.get("is_direct") or "archive_info" not in info:
            raise Failure("direct_url", f"{name} would come from {url[:200]}, not from the index")
        digest = _sha256(info["archive_info"])
        if digest is None:
            raise Failure("index_hash", f"the index states no sha256 for {_file_of(url)} and pip did not hash it")
        chosen.append((name, str(stated.get("version", "")), _file_of(url), digest, url))
    return chosen


def leaves(request, candidate_dir: str, index: list[str], installer: str, scratch: str) -> Iterator[bytes]:
    """The leaves for ``request``: the candidate's wheels in ``candidate_dir`` read, then pip run with the
    ``index`` options (:func:`index_options`) from the ``installer`` wheel."""
    wheels = [Candidate(candidate_dir, file) for file in _wheels(candidate_dir)]
    yield leaf(
        "BEGIN", 0, protocol=PROTOCOL, python=platform.python_version(),
        candidate=[{"name": wheel.project, "version": wheel.version, "modules": wheel.modules} for wheel in wheels],
    )
    seq = 1
    pins = []
    try:
        for wheel in wheels:
            if wheel.problem is not None:
                raise wheel.problem
        if not request.runner and not any(wheel.requires or wheel.requires_python for wheel in wheels):
            yield leaf("END", seq, pins=0)
            return
        requirements = any(wheel.requires for wheel in wheels)
        resolving = bool(request.runner) or requirements
        packaging = load_pip(installer, resolving=resolving, requirements=requirements)
        for wheel in wheels:
            wheel.check_requirements(packaging)
        if resolving:
            # Only pip's resolver needs its guard, and importing what it wraps is most of a second.
            guard_dependencies()
        if request.runner:
            pins += [(RUNNER, *pin) for pin in resolve(list(request.runner), index, scratch=scratch, direct={})]
        if any(wheel.requires for wheel in wheels):
            direct = {wheel.path: wheel.project for wheel in wheels}
            pins += [(CANDIDATE, *pin) for pin in resolve([wheel.path for wheel in wheels], index, scratch=scratch, direct=direct)]
    except Failure as failure:
        yield leaf("FAIL", seq, reason=failure.reason, requirement=failure.requirement[:MAX_REQUIREMENT_BYTES])
        return
    for tree, name, version, file, digest, url in pins:
        yield leaf("PIN", seq, tree=tree, name=name, version=version, file=file, sha256=digest, url=url)
        seq += 1
    yield leaf("END", seq, pins=seq - 1)


def main(argv: Sequence[str]) -> int:
    """``REQUEST_DIR CANDIDATE_DIR INDEX PROXY``: the leaves on stdout; exit 0 when every leaf was written."""
    request_dir, candidate_dir, index, proxy = argv
    with open(os.path.join(request_dir, REQUEST), "rb") as file:
        request = request_from_bytes(file.read(1 << 16))
    scratch = tempfile.mkdtemp(prefix="resolver-")
    out = sys.stdout.buffer
    options = index_options(index, proxy)
    for line in leaves(request, candidate_dir, options, os.path.join(request_dir, request.installer_file), scratch):
        out.write(line)
    out.flush()
    return 0
