"""The resolver protocol, ``casebox.resolver.v2``: numbered closed leaves, each validated and ACKed (docs/pipeline.md).

The resolver runs in its own sandbox as the dedicated UID and answers on its
standard output with one **leaf** per line: canonical JSON (RFC 8785) and a
newline, numbered from 0 by ``seq``.

    BEGIN  seq 0        protocol, python (the runtime's version), candidate (each wheel's project, version and
                        the top-level modules it installs)
    PIN    seq 1..n     tree (runner or candidate), name, version, file, sha256, url: one wheel pip's resolver chose
    END    seq n+1      pins (= n): nothing follows
    FAIL   seq k        reason, requirement: resolution failed; nothing follows

The runner's pins come from resolving the plan's runner requirements alone,
against the index: never from the bundle (E7). The candidate's pins come from
resolving the candidate's wheels against the same index; the candidate's own
projects are never pinned.

The dependency preparer, on the trusted side, feeds the lines in order to an
:class:`Acceptor`. Each leaf is validated before the next is read, and an
accepted PIN is ACKed: its ``seq`` becomes the ack number of a pin in the
ack document (``pins.json``), which the preparer materializes as a new
read-only capability for the fetch op. Anything unknown, out of order, extra,
a wheel whose SHA-256 differs from the trusted side's own hash of the index
file, or a URL that is not the index's aborts the resolution with an
:class:`Abort` naming a fixed code. This module is pure: the encoder the
resolver uses, the decoder and the acceptor the preparer uses.
"""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
from typing import Callable, Iterable

from executor.transport.manifest import canonical_project, check_wheel_name, wheel_project
from journal.closed import ClosedObject, check_str
from journal.errors import Refused
from journal.strictjson import canonical, loads

PROTOCOL = "casebox.resolver.v2"
REQUEST_SCHEMA = "casebox.resolver-request.v2"
ACKS_SCHEMA = "casebox.resolver-acks.v2"
MAX_LEAF_BYTES = 8_192
MAX_PINS = 256
MAX_CANDIDATES = 3
MAX_MODULES = 256
MAX_REQUIREMENTS = 32
MAX_REQUIREMENT_BYTES = 512
MAX_URL_BYTES = 2_048
LEAVES = ("BEGIN", "PIN", "END", "FAIL")
RUNNER, CANDIDATE = "runner", "candidate"
TREES = (RUNNER, CANDIDATE)
# Where the resolver and fetch sandboxes see a find-links index; a PIN from it names its file there.
LOCAL_INDEX = "/cap/index"
# The proxy argument of the resolve and fetch tools when they reach the index directly (no forwarder).
NO_PROXY = "-"
# Why the resolver itself gives up (a FAIL leaf).
FAIL_REASONS = {
    "no_match": "no wheel of the index satisfies a requirement for this runtime",
    "conflict": "the requirements admit no common set of versions, even after pip's resolver backtracked",
    "candidate_conflict": "a requirement on one of the candidate's own projects excludes the candidate's version",
    "direct_url": "a requirement names a direct URL: only names and versions resolved through the index are fetched",
    "metadata": "a wheel's METADATA is missing, unreadable, names another project or version, or an invalid requirement",
    "layout": f"a candidate wheel holds a member name that is not a clean relative path, or more than {MAX_MODULES} top-level modules",
    "index": "a network index could not be read: unreachable, an HTTP error, a page it cannot parse, over a cap",
    "index_hash": "the index states no sha256 for a wheel pip chose and pip did not hash it",
    "resolver": "pip's resolver failed for another reason (its last error line says which)",
}
# Why the preparer aborts the protocol.
ABORTS = {
    "unknown": "a line is not a closed canonical leaf of a known kind",
    "out_of_order": "a leaf's seq is not the next number, or its kind cannot come at that point",
    "extra": "a leaf follows END or FAIL",
    "incomplete": "the output ended before END or FAIL",
    "count": "END's pin count differs from the PINs that came before it",
    "too_many": f"more than {MAX_PINS} pins",
    "runtime_mismatch": "BEGIN names another Python version than the runtime's",
    "candidate_mismatch": "BEGIN's candidate projects are not the sealed extraction's wheels",
    "candidate_pin": "a candidate PIN names one of the candidate's own projects",
    "duplicate": "a PIN names a project already pinned in its tree",
    "file_mismatch": "a PIN's file is not a wheel of its name and version",
    "not_in_index": "a PIN's file is not a regular file of the index",
    "hash_mismatch": "a PIN's sha256 differs from the trusted side's hash of the index file, or from another PIN of that file",
    "url_mismatch": "a PIN's URL is not its file in the find-links index, or not an http(s) URL of its file",
}
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]{0,63}\Z")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}\Z")
_PROJECT = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,98}[a-z0-9])?\Z")


class Abort(Exception):
    """The preparer stops the protocol: ``code`` is one of :data:`ABORTS`, ``detail`` says where."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


@dataclasses.dataclass(frozen=True)
class Pin:
    """One accepted wheel of the runner's or the candidate's tree; ``ack`` is the seq of the PIN leaf that named it."""

    ack: int
    tree: str
    name: str
    version: str
    file: str
    sha256: str
    url: str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


# The encoder (the resolver's side) ------------------------------------------------------------------


def leaf(kind: str, seq: int, **fields: object) -> bytes:
    """One leaf line: canonical JSON and a newline."""
    return canonical({"leaf": kind, "seq": seq, **fields}) + b"\n"


def request_bytes(plan_digest: str, runner: Iterable[str], installer: dict) -> bytes:
    """The resolver's input document, ``request.json`` in the request capability: the runner's requirements."""
    return canonical({"schema": REQUEST_SCHEMA, "plan_digest": plan_digest, "runner": list(runner), "installer": installer})


@dataclasses.dataclass(frozen=True)
class Request:
    plan_digest: str
    runner: tuple[str, ...]
    installer_file: str
    installer_sha256: str


def request_from_bytes(data: bytes) -> Request:
    fields = ClosedObject(loads(data, max_bytes=MAX_LEAF_BYTES * 4))
    fields.pop_const("schema", REQUEST_SCHEMA)
    plan_digest = fields.pop_digest("plan_digest")
    runner = tuple(
        check_str(item, path, max_bytes=MAX_REQUIREMENT_BYTES)
        for path, item in fields.pop_list("runner", min_items=0, max_items=MAX_REQUIREMENTS)
    )
    installer = fields.pop_object("installer")
    installer_file = check_wheel_name(installer.pop_str("file", max_bytes=100), "$.installer.file")
    installer_sha256 = installer.pop_sha256("sha256")
    installer.pop_str("source", max_bytes=16)
    installer.done()
    fields.done()
    return Request(plan_digest, runner, installer_file, installer_sha256)


# The decoder and the acceptor (the preparer's side) ---------------------------------------------------


def _decode(line: bytes, seq: int) -> tuple[str, ClosedObject]:
    where = f"leaf {seq}"
    if len(line) > MAX_LEAF_BYTES:
        raise Abort("unknown", f"{where} is longer than {MAX_LEAF_BYTES} bytes")
    try:
        value = loads(line, max_bytes=MAX_LEAF_BYTES)
        fields = ClosedObject(value)
        kind = fields.pop_str("leaf", max_bytes=8)
        number = fields.pop_int("seq", low=0, high=MAX_PINS + 2)
    except Refused as refusal:
        raise Abort("unknown", f"{where}: {refusal.sentence()}") from None
    if kind not in LEAVES or canonical(value) != line:
        raise Abort("unknown", f"{where} is not a canonical leaf of a known kind")
    if number != seq:
        raise Abort("out_of_order", f"{where} carries seq {number}")
    return kind, fields


def _pop_project(fields: ClosedObject, key: str) -> str:
    name = fields.pop_str(key, max_bytes=100)
    if not _PROJECT.match(name) or canonical_project(name) != name:
        raise Refused(f"$.{key}", "must be a project name in canonical form")
    return name


def _pop_version(fields: ClosedObject, key: str) -> str:
    return fields.pop_str(key, max_bytes=64, pattern=_VERSION, rule="must be a version")


@dataclasses.dataclass(frozen=True)
class Failed:
    """The resolver's own FAIL leaf: a reason of :data:`FAIL_REASONS` and the requirement it concerns."""

    reason: str
    requirement: str


class Acceptor:
    """Validates the resolver's leaves in order and ACKs each accepted PIN.

    ``candidate`` maps each candidate project (canonical name) to its version,
    taken by the trusted side from the sealed extraction's wheel file names;
    :attr:`modules` is, once BEGIN is accepted, what the resolver says each
    project installs at the top level (a claim: the trusted side never opens
    a wheel; the sealed tree is listed again after the install).
    ``index_sha256(file)`` is the trusted side's SHA-256 of a regular file of
    a find-links index, or None when there is no such file. For a network
    index it is None: the trusted side has no network, so a PIN's file and
    hash are ACKed as claims, the fetch is pinned to them (pip
    ``--require-hashes`` against the index), and the sealed dependencies are
    hashed again on the trusted side.
    """

    def __init__(
        self, *, python: str, candidate: dict[str, str], index_sha256: Callable[[str], str | None] | None,
        local_index: str = LOCAL_INDEX,
    ) -> None:
        self.python = python
        self.local_index = local_index
        self.candidate = dict(candidate)
        self.index_sha256 = index_sha256
        self.seq = 0
        self.pins: list[Pin] = []
        self.modules: dict[str, tuple[str, ...]] = {}
        self.ended: Failed | bool = False

    def feed(self, line: bytes) -> Pin | None:
        """Accept one leaf line (with or without its newline); the ACKed pin for a PIN, else None."""
        line = line.removesuffix(b"\n")
        if self.ended:
            raise Abort("extra", f"leaf {self.seq} follows {'END' if self.ended is True else 'FAIL'}")
        kind, fields = _decode(line, self.seq)
        try:
            pin = self._leaf(kind, fields)
        except Refused as refusal:
            raise Abort("unknown", f"leaf {self.seq} ({kind}): {refusal.sentence()}") from None
        self.seq += 1
        return pin

    def _leaf(self, kind: str, fields: ClosedObject) -> Pin | None:
        if (kind == "BEGIN") != (self.seq == 0):
            raise Abort("out_of_order", f"leaf {self.seq} is {kind}; BEGIN comes first and only first")
        return {"BEGIN": self._begin, "PIN": self._pin, "END": self._end, "FAIL": self._fail}[kind](fields)

    def _end(self, fields: ClosedObject) -> None:
        count = fields.pop_int("pins", low=0, high=MAX_PINS)
        fields.done()
        if count != len(self.pins):
            raise Abort("count", f"END says {count} pins after {len(self.pins)}")
        self.ended = True

    def _fail(self, fields: ClosedObject) -> None:
        reason = fields.pop_str("reason", max_bytes=32)
        requirement = fields.pop_str("requirement", max_bytes=MAX_REQUIREMENT_BYTES)
        fields.done()
        if reason not in FAIL_REASONS:
            raise Abort("unknown", f"FAIL leaf {self.seq} gives the unknown reason {reason!r}")
        self.ended = Failed(reason, requirement)

    def _begin(self, fields: ClosedObject) -> None:
        fields.pop_const("protocol", PROTOCOL)
        python = fields.pop_str("python", max_bytes=16)
        candidate = {}
        for path, item in fields.pop_list("candidate", min_items=1, max_items=MAX_CANDIDATES):
            entry = ClosedObject(item, path)
            name = _pop_project(entry, "name")
            candidate[name] = _pop_version(entry, "version")
            self.modules[name] = tuple(
                check_str(module, module_path, max_bytes=100, pattern=_MODULE, rule="must be a module name")
                for module_path, module in entry.pop_list("modules", min_items=0, max_items=MAX_MODULES)
            )
            entry.done()
        fields.done()
        if python != self.python:
            raise Abort("runtime_mismatch", f"BEGIN names Python {python}, the runtime is {self.python}")
        if candidate != self.candidate:
            raise Abort("candidate_mismatch", f"BEGIN names {sorted(candidate.items())}, the extraction holds {sorted(self.candidate.items())}")

    def _pin(self, fields: ClosedObject) -> Pin:
        tree = fields.pop_str("tree", max_bytes=16)
        name = _pop_project(fields, "name")
        version = _pop_version(fields, "version")
        file = fields.pop_str("file", max_bytes=100)
        digest = fields.pop_sha256("sha256")
        url = fields.pop_str("url", max_bytes=MAX_URL_BYTES, ascii_only=True)
        fields.done()
        where = f"PIN leaf {self.seq}"
        if tree not in TREES:
            raise Abort("unknown", f"{where} names the tree {tree!r}, not one of {', '.join(TREES)}")
        if len(self.pins) >= MAX_PINS:
            raise Abort("too_many", f"{where} is pin {MAX_PINS + 1}")
        if tree == CANDIDATE and name in self.candidate:
            raise Abort("candidate_pin", f"{where} pins the candidate's own project {name}")
        if any(pin.tree == tree and pin.name == name for pin in self.pins):
            raise Abort("duplicate", f"{where} pins {name} a second time in the {tree} tree")
        try:
            named = wheel_project(file, "$.file")
        except Refused:
            named = None
        if named != (name, version):
            raise Abort("file_mismatch", f"{where}: {file} is not a wheel of {name} {version}")
        if any(pin.file == file and pin.sha256 != digest for pin in self.pins):
            raise Abort("hash_mismatch", f"{where}: {file} was pinned before with another sha256")
        if self.index_sha256 is not None:
            if not is_local_url(url, file, self.local_index):
                raise Abort("url_mismatch", f"{where}: {url} is not {file} in the find-links index")
            trusted = self.index_sha256(file)
            if trusted is None:
                raise Abort("not_in_index", f"{where}: {file} is not a regular file of the index")
            if trusted != digest:
                raise Abort("hash_mismatch", f"{where}: {file} hashes to {trusted}, the leaf says {digest}")
        elif not is_file_url(url, file):
            raise Abort("url_mismatch", f"{where}: {url} is not an http(s) URL of {file} without user information")
        pin = Pin(self.seq, tree, name, version, file, digest, url)
        self.pins.append(pin)
        return pin

    def finish(self) -> tuple[Pin, ...] | Failed:
        """After the last line: the ACKed pins after END, the FAIL leaf after FAIL; an abort otherwise."""
        if not self.ended:
            raise Abort("incomplete", f"the output ended after {self.seq} leaves, before END or FAIL")
        return tuple(self.pins) if self.ended is True else self.ended


def accept(output: bytes, acceptor: Acceptor) -> tuple[Pin, ...] | Failed:
    """Feed every line of the resolver's output, in order, then finish."""
    if output and not output.endswith(b"\n"):
        raise Abort("incomplete", "the output's last line has no newline")
    for line in output.splitlines(keepends=True):
        acceptor.feed(line)
    return acceptor.finish()


def acks_bytes(pins: Iterable[Pin]) -> bytes:
    """``pins.json``: the ACKed pins, in ack order."""
    return canonical({"schema": ACKS_SCHEMA, "pins": [pin.as_dict() for pin in pins]})


def is_local_url(url: str, file: str, index: str = LOCAL_INDEX) -> bool:
    """A ``file:`` URL of ``file`` in the find-links index at ``index`` (as the resolver's sandbox sees it)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return False
    return parts.scheme == "file" and not parts.netloc and urllib.parse.unquote(parts.path) == f"{index}/{file}"


def is_file_url(url: str, file: str) -> bool:
    """An http(s) URL without user information whose path ends in ``file`` (percent-decoded; a fragment is ignored)."""
    if not all(char.isascii() and char.isprintable() and char not in " \\\"" for char in url):
        return False
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname
    except ValueError:
        return False
    return (
        parts.scheme in ("http", "https") and bool(host) and "@" not in parts.netloc
        and urllib.parse.unquote(parts.path.rsplit("/", 1)[-1]) == file
    )


def acks_from_bytes(data: bytes) -> tuple[Pin, ...]:
    """The pins of an ack document, as the fetch tool reads it in its sandbox (the trusted side wrote it)."""
    fields = ClosedObject(loads(data, max_bytes=MAX_PINS * MAX_LEAF_BYTES))
    fields.pop_const("schema", ACKS_SCHEMA)
    pins = []
    for path, item in fields.pop_list("pins", min_items=0, max_items=MAX_PINS):
        entry = ClosedObject(item, path)
        pins.append(Pin(
            ack=entry.pop_int("ack", low=1, high=MAX_PINS), tree=entry.pop_str("tree", max_bytes=16),
            name=_pop_project(entry, "name"), version=_pop_version(entry, "version"),
            file=check_wheel_name(entry.pop_str("file", max_bytes=100), f"{path}.file"),
            sha256=entry.pop_sha256("sha256"), url=entry.pop_str("url", max_bytes=MAX_URL_BYTES, ascii_only=True),
        ))
        entry.done()
    fields.done()
    return tuple(pins)
