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
suite's summary attributes.
"""

from __future__ import annotations

import dataclasses

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
    """What the trusted side found: the report's state (read, missing, refused) and, when read, its counts."""

    report: str
    counts: JunitCounts | None

    def as_dict(self) -> dict:
        return {"report": self.report, "counts": None if self.counts is None else self.counts.as_dict()}


class _Tally:
    def __init__(self, max_testcases: int) -> None:
        self.max_testcases = max_testcases
        self.stack: list[str] = []
        self.tests = self.skipped = self.failures = self.errors = self.collection_errors = 0
        self.current: set[str] | None = None

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
        elif name in _OUTCOMES and parent == "testcase":
            self.current.add(name)
            if name == "error" and attributes.get("message", "").startswith(COLLECTION_FAILURE):
                self.current.add("collection")

    def end(self, name: str) -> None:
        self.stack.pop()
        if name == "testcase" and self.current is not None:
            outcomes, self.current = self.current, None
            self.skipped += "skipped" in outcomes
            self.failures += "failure" in outcomes
            self.errors += "error" in outcomes
            self.collection_errors += "collection" in outcomes


def _refuse_declaration(*_: object) -> None:
    raise Refused("the junit report", "declares a DOCTYPE or an entity")


def counts_from_report(data: bytes, *, max_bytes: int = REPORT_MAX_BYTES, max_testcases: int = MAX_TESTCASES) -> JunitCounts:
    """The counts in a junit report's bytes, or Refused for a report this reader does not accept."""
    from xml.parsers import expat  # here, so that importing the caps (executor/plan.py) costs nothing

    if len(data) > max_bytes:
        raise Refused("the junit report", f"is larger than its {max_bytes}-byte cap")
    lowered = data.lower()
    if any(marker in lowered for marker in _FORBIDDEN):
        raise Refused("the junit report", "holds a DOCTYPE or ENTITY declaration")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        raise Refused("the junit report", "is not valid UTF-8") from None
    tally = _Tally(max_testcases)
    parser = expat.ParserCreate(encoding="UTF-8")
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.StartDoctypeDeclHandler = _refuse_declaration
    parser.EntityDeclHandler = _refuse_declaration
    parser.ExternalEntityRefHandler = _refuse_declaration
    parser.StartElementHandler = tally.start
    parser.EndElementHandler = tally.end
    try:
        parser.Parse(data, True)
    except expat.ExpatError as error:
        raise Refused("the junit report", f"is not well-formed XML ({expat.ErrorString(error.code)})") from None
    return JunitCounts(tally.tests, tally.skipped, tally.failures, tally.errors, tally.collection_errors)


def evidence_from_bytes(data: bytes | None, *, max_bytes: int = REPORT_MAX_BYTES, max_testcases: int = MAX_TESTCASES) -> PytestEvidence:
    """The evidence for a pytest op whose report held ``data`` (None: there was no report)."""
    if data is None:
        return PytestEvidence(MISSING, None)
    try:
        return PytestEvidence(READ, counts_from_report(data, max_bytes=max_bytes, max_testcases=max_testcases))
    except Refused:
        return PytestEvidence(REFUSED, None)


def evidence_from_directory(
    dir_fd: int, name: str = REPORT_NAME, *, max_bytes: int = REPORT_MAX_BYTES, max_testcases: int = MAX_TESTCASES,
) -> PytestEvidence:
    """Read the report ``name`` in the work directory ``dir_fd`` as hostile data, and judge it.

    A symlink, anything but a regular file, or a file over the cap is refused
    without reading past the cap.
    """
    try:
        data = read_evidence(dir_fd, name, max_bytes)
    except Refused:
        return PytestEvidence(REFUSED, None)
    return evidence_from_bytes(data, max_bytes=max_bytes, max_testcases=max_testcases)
