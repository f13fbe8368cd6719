"""Positive evidence for a pytest case: counts from its junit XML report (DESIGN E5, docs/receipts.md).

pytest writes the report in the sandbox's work directory; the trusted side
reads it after the op. The candidate runs in that sandbox and can write any
bytes there, so the report is hostile input and its counts may only ever
downgrade a status (the evaluator's rule). Reading it:

- at most its byte cap (:data:`REPORT_MAX_BYTES` unless the plan sets
  another, docs/plan.md), from a regular file opened without following a
  symlink;
- UTF-8 only, and no ``<!DOCTYPE`` or ``<!ENTITY`` anywhere, so no entity is
  ever declared or expanded;
- one streaming pass of the stdlib's expat with handlers for elements alone:
  no tree is built, nesting is bounded by :data:`MAX_DEPTH` and the number of
  test cases by its cap (:data:`MAX_TESTCASES` unless the plan sets another).

Counts come from the ``<testcase>`` elements themselves, never from a
suite's summary attributes. The same pass can keep the first failing test
cases (their ids and the first line of their messages), for display only:
that text is the candidate's, shown through the one untrusted-text rule.
"""

from __future__ import annotations

import dataclasses
import os
from xml.parsers import expat

from executor.plan import DEFAULT_JUNIT
from journal.errors import Refused
from journal.files import read_evidence

REPORT_NAME = "junit.xml"
# The caps of a plan that sets none (docs/plan.md, "junit").
REPORT_MAX_BYTES, MAX_TESTCASES = DEFAULT_JUNIT
MAX_DEPTH = 8
# pytest's junitxml plugin reports a module that failed to collect as a
# testcase holding <error message="collection failure">.
COLLECTION_FAILURE = "collection failure"
_FORBIDDEN = (b"<!doctype", b"<!entity")
_SUITES = ("testsuites", "testsuite")
_OUTCOMES = ("skipped", "failure", "error")

READ = "read"
MISSING = "missing"
REFUSED = "refused"
REPORT_STATES = (READ, MISSING, REFUSED)
# How many failing test cases a report keeps for display, and how much of each id and message.
SHOWN_FAILURES = 3
SHOWN_TEXT = 300


@dataclasses.dataclass(frozen=True)
class JunitCounts:
    """How many test cases the report lists, and how many were skipped, failed, errored or failed to collect."""

    tests: int
    skipped: int
    failures: int
    errors: int
    collection_errors: int

    @property
    def executed(self) -> int:
        return self.tests - self.skipped - self.collection_errors

    @property
    def vacuous(self) -> bool:
        """No test ran, every test was skipped, or a module failed to collect (E5)."""
        return self.executed <= 0 or self.collection_errors > 0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class PytestEvidence:
    """What the trusted side found: the report's state (read, missing, refused), when read its counts, the
    report's size when it was a regular file (None when missing or not a regular file), and the cap it was
    read under."""

    report: str
    counts: JunitCounts | None
    bytes: int | None = None
    cap: int = REPORT_MAX_BYTES

    def as_dict(self) -> dict:
        return {
            "report": self.report,
            "counts": None if self.counts is None else self.counts.as_dict(),
            "bytes": self.bytes,
            "cap": self.cap,
        }

    @property
    def over_cap(self) -> bool:
        return self.bytes is not None and self.bytes > self.cap


@dataclasses.dataclass(frozen=True)
class FailingTest:
    """A test case the report lists with a failure or an error: its id and the first line of its message."""

    test: str
    message: str


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")[:SHOWN_TEXT]


class _Tally:
    def __init__(self, keep: int = 0, max_testcases: int = MAX_TESTCASES) -> None:
        self.max_testcases = max_testcases
        self.stack: list[str] = []
        self.tests = self.skipped = self.failures = self.errors = self.collection_errors = 0
        self.current: set[str] | None = None
        self.keep = keep
        self.failing: list[FailingTest] = []
        self.test_id = ""
        self.message: str | None = None
        self.text: list[str] = []

    def start(self, name: str, attributes: dict[str, str]) -> None:
        parent = self.stack[-1] if self.stack else None
        self.stack.append(name)
        if len(self.stack) > MAX_DEPTH:
            raise Refused("the junit report", f"nests deeper than {MAX_DEPTH} elements")
        if parent is None:
            if name not in _SUITES:
                raise Refused("the junit report", f"has root element <{name[:32]}>, not <testsuites> or <testsuite>")
        elif name == "testsuite" and parent != "testsuites":
            raise Refused("the junit report", "has a <testsuite> outside <testsuites>")
        elif name == "testcase":
            if parent != "testsuite":
                raise Refused("the junit report", "has a <testcase> outside a <testsuite>")
            self.tests += 1
            if self.tests > self.max_testcases:
                raise Refused("the junit report", f"lists more than {self.max_testcases} test cases")
            self.current = set()
            if len(self.failing) < self.keep:
                classname, test = attributes.get("classname", ""), attributes.get("name", "")
                self.test_id = (f"{classname}::{test}" if classname else test)[:SHOWN_TEXT]
                self.message, self.text = None, []
        elif name in _OUTCOMES and parent == "testcase":
            self.current.add(name)
            if name == "error" and attributes.get("message", "").startswith(COLLECTION_FAILURE):
                self.current.add("collection")
            if name != "skipped" and self.message is None and "message" in attributes:
                self.message = _first_line(attributes["message"])

    def characters(self, data: str) -> None:
        # Only the text of a failure or an error, and only while a failing test may still be kept.
        if len(self.failing) < self.keep and self.stack and self.stack[-1] in ("failure", "error") and sum(map(len, self.text)) < SHOWN_TEXT:
            self.text.append(data)

    def end(self, name: str) -> None:
        self.stack.pop()
        if name == "testcase" and self.current is not None:
            outcomes, self.current = self.current, None
            self.skipped += "skipped" in outcomes
            self.failures += "failure" in outcomes
            self.errors += "error" in outcomes
            self.collection_errors += "collection" in outcomes
            if len(self.failing) < self.keep and outcomes & {"failure", "error"}:
                message = self.message if self.message else _first_line("".join(self.text))
                self.failing.append(FailingTest(self.test_id, message))


def _refuse_declaration(*_: object) -> None:
    raise Refused("the junit report", "declares a DOCTYPE or an entity")


def _tally(data: bytes, keep: int, cap: int, max_testcases: int) -> _Tally:
    if len(data) > cap:
        raise Refused("the junit report", f"is larger than its {cap}-byte cap")
    lowered = data.lower()
    if any(marker in lowered for marker in _FORBIDDEN):
        raise Refused("the junit report", "holds a DOCTYPE or ENTITY declaration")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        raise Refused("the junit report", "is not valid UTF-8") from None
    tally = _Tally(keep, max_testcases)
    parser = expat.ParserCreate(encoding="UTF-8")
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.StartDoctypeDeclHandler = _refuse_declaration
    parser.EntityDeclHandler = _refuse_declaration
    parser.ExternalEntityRefHandler = _refuse_declaration
    parser.StartElementHandler = tally.start
    parser.EndElementHandler = tally.end
    if keep:
        parser.CharacterDataHandler = tally.characters
    try:
        parser.Parse(data, True)
    except expat.ExpatError as error:
        raise Refused("the junit report", f"is not well-formed XML ({expat.ErrorString(error.code)})") from None
    return tally


def counts_from_report(data: bytes, cap: int = REPORT_MAX_BYTES, max_testcases: int = MAX_TESTCASES) -> JunitCounts:
    """The counts in a junit report's bytes, or Refused for a report this reader does not accept."""
    tally = _tally(data, 0, cap, max_testcases)
    return JunitCounts(tally.tests, tally.skipped, tally.failures, tally.errors, tally.collection_errors)


def failing_tests(data: bytes, cap: int = REPORT_MAX_BYTES, max_testcases: int = MAX_TESTCASES) -> tuple[FailingTest, ...]:
    """The first :data:`SHOWN_FAILURES` failing test cases of a report, for display; Refused like the counts."""
    return tuple(_tally(data, SHOWN_FAILURES, cap, max_testcases).failing)


def evidence_from_bytes(data: bytes | None, cap: int = REPORT_MAX_BYTES, max_testcases: int = MAX_TESTCASES) -> PytestEvidence:
    """The evidence for a pytest op whose report held ``data`` (None: there was no report)."""
    if data is None:
        return PytestEvidence(MISSING, None, None, cap)
    try:
        return PytestEvidence(READ, counts_from_report(data, cap, max_testcases), len(data), cap)
    except Refused:
        return PytestEvidence(REFUSED, None, len(data), cap)


@dataclasses.dataclass(frozen=True)
class Report:
    """A case's junit report as the trusted side read it: the evidence, and the bytes when they are a regular
    file within the cap (what the case service publishes beside the receipt)."""

    evidence: PytestEvidence
    data: bytes | None


def report_from_directory(
    dir_fd: int, name: str = REPORT_NAME, cap: int = REPORT_MAX_BYTES, max_testcases: int = MAX_TESTCASES,
) -> Report:
    """Read the report ``name`` in the work directory ``dir_fd`` as hostile data, and judge it.

    A symlink, anything but a regular file, or a file over the cap is refused
    without reading past the cap; the size of a regular file over the cap is
    taken from its inode, so the refusal can say it.
    """
    try:
        data = read_evidence(dir_fd, name, cap)
    except Refused:
        return Report(PytestEvidence(REFUSED, None, None, cap), None)
    if data is not None and len(data) > cap:
        size = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_size
        return Report(PytestEvidence(REFUSED, None, max(size, len(data)), cap), None)
    return Report(evidence_from_bytes(data, cap, max_testcases), data)


def evidence_from_directory(
    dir_fd: int, name: str = REPORT_NAME, cap: int = REPORT_MAX_BYTES, max_testcases: int = MAX_TESTCASES,
) -> PytestEvidence:
    """The evidence of :func:`report_from_directory`."""
    return report_from_directory(dir_fd, name, cap, max_testcases).evidence
