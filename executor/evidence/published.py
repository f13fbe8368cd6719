"""A case's published output files in an evidence directory (docs/receipts.md, "Published output").

The case service publishes each case's stdout and stderr (whole, or their
first and last 64 KiB) and its junit report beside its receipt, and the
receipt binds each by SHA-256 and size. The evaluator reads them as
untrusted data at rest. It checks them against the bindings: a missing,
extra, unreadable or different file makes the case UNVERIFIED
(``output_mismatch``). It trusts their content for two things only:

- what a reviewer is shown of a case that is not PASS (:class:`Detail`):
  the failing tests of its junit report with the first line of each
  message, the last line its op wrote, why its report was refused;
- the E5 downgrade (:func:`recomputed_evidence`): counts recomputed from the
  published report may only ever lower a status, never raise one.
"""

from __future__ import annotations

import dataclasses

from executor.evidence.junit import SHOWN_TEXT, FailingTest, PytestEvidence, counts_from_report, evidence_from_bytes, failing_tests
from executor.plan import Case
from executor.evidence.receipts import OUTPUT_MAX_BYTES, Bound, Published, Receipt
from journal.errors import Refused
from journal.files import read_evidence
from journal.strictjson import decode_lossy

MISMATCH = "output_mismatch"


def read_output(dir_fd: int, name: str, kind: str) -> bytes | None:
    """The bytes of a published output file, or None when it is not a regular file within its kind's cap."""
    try:
        data = read_evidence(dir_fd, name, OUTPUT_MAX_BYTES[kind])
    except Refused:
        return None
    return None if data is None or len(data) > OUTPUT_MAX_BYTES[kind] else data


def _bindings(published: Published | None) -> dict[str, Bound]:
    if published is None:
        return {}
    bound = {"stdout": published.stdout, "stderr": published.stderr, "junit": published.junit}
    return {kind: binding for kind, binding in bound.items() if binding is not None}


def matches(published: Published | None, files: dict[str, bytes | None]) -> bool:
    """Whether the case's published files are exactly the ones its receipt binds, byte for byte."""
    bound = _bindings(published)
    return set(files) == set(bound) and all(files[kind] is not None and Bound.of(files[kind]) == bound[kind] for kind in bound)


def recomputed_evidence(receipt: Receipt, files: dict[str, bytes | None]) -> PytestEvidence | None:
    """E5 again, from the published report: the evidence its bytes give under the receipt's cap, or None."""
    data = files.get("junit")
    if data is None or receipt.pytest is None:
        return None
    return evidence_from_bytes(data, receipt.pytest.cap)


@dataclasses.dataclass(frozen=True)
class Detail:
    """Why a case that is not PASS got its reason, beyond the code: casebox's own sentence, the failing tests
    its junit report lists and the last line its op wrote. The tests and the line are the candidate's text,
    shown only through journal.untrusted."""

    sentence: str | None = None
    failing: tuple[FailingTest, ...] = ()
    output_tail: str | None = None

    def as_dict(self) -> dict:
        return {
            "sentence": self.sentence,
            "failing_tests": [{"test": test.test, "message": test.message} for test in self.failing],
            "output_tail": self.output_tail,
        }


def _last_line(data: bytes | None) -> str | None:
    if not data:
        return None
    lines = [line.strip() for line in decode_lossy(data).splitlines() if line.strip()]
    return lines[-1][:SHOWN_TEXT] if lines else None


def _sentence(case: Case, receipt: Receipt, reason: str, files: dict[str, bytes | None]) -> str | None:
    evidence, observed = receipt.pytest, receipt.outcome.observed
    if reason == "junit_refused" and evidence is not None:
        if evidence.bytes is None:
            return "the junit report is not a regular file the case service could read"
        if evidence.over_cap:
            return f"the junit report is {evidence.bytes} bytes, over its {evidence.cap}-byte cap"
        data = files.get("junit")
        if data is not None:
            try:
                counts_from_report(data, evidence.cap)
            except Refused as refusal:
                return f"the junit report ({evidence.bytes} bytes, cap {evidence.cap}) {refusal.rule}"
        return f"the junit report ({evidence.bytes} bytes, cap {evidence.cap}) was refused"
    if reason == "output" and observed is not None:
        cut = [f"{name} was cut at {stream.bytes} bytes" for name, stream in (("stdout", observed.stdout), ("stderr", observed.stderr)) if stream.truncated]
        return "; ".join(cut) or None
    if reason == "timeout" and observed is not None:
        return f"killed after {observed.wall_ms} ms; its timeout_ms is {case.timeout_ms}"
    if reason == "exit_mismatch" and receipt.exit_code is not None:
        return f"exit code {receipt.exit_code}, expected {case.expect_exit}"
    return None


def detail(case: Case, receipt: Receipt, reason: str, files: dict[str, bytes | None]) -> Detail:
    """What a reviewer is shown of a case that is not PASS, from its authenticated receipt and verified files."""
    failing: tuple[FailingTest, ...] = ()
    if files.get("junit") is not None and receipt.pytest is not None:
        try:
            failing = failing_tests(files["junit"], receipt.pytest.cap)
        except Refused:
            failing = ()
    tail = _last_line(files.get("stderr")) or _last_line(files.get("stdout"))
    return Detail(_sentence(case, receipt, reason, files), failing, tail)
