"""The evaluator: receipts checked against sealed journals, folded into one verdict (DESIGN E1–E4, E6; docs/receipts.md).

It runs unprivileged and reads evidence as untrusted data. Every expected
value comes from the plan and the command line: the attempt, the plan
digest, the bundle sha256. Each evidence directory is one stage (one shard):
its receipts, a byte copy of its sealed journal and its seal marker. A
case's status is decided in a fixed order, and the first check that fails
names the case's reason code (:data:`REASONS`); a reason never carries text
from the evidence.

1. Presence (E2): exactly one receipt of this attempt for the case, across
   every directory.
2. The stage: its seal marker, its journal VALID and bound to the marker,
   of this attempt, sealed (RETIRED last) and CLEANED.
3. The receipt (E1): strict parse, then bound to the attempt, the case, the
   plan, the bundle and the stage; its journal head a head of the journal,
   at or after its op's terminal records; its process identity the
   PROCESS_INTENT, its raw wait status the PROCESS_TERMINAL and its
   descendant count the DESCENDANTS_TERMINAL of its op, recorded with the
   op's role and reaper; its syscall filter digest the one this casebox
   ships and the one its sandbox's SANDBOX_READY recorded (S12).
4. Across receipts: one candidate, dependency and runtime inventory, one
   attempt number, and no op id used twice in a stage.
   Its published output files are exactly the ones it binds, byte for byte
   (executor/evidence/published.py).
5. The outcome: a limit class is UNVERIFIED (S10); an exit is PASS when it
   equals ``expect_exit`` and FAIL otherwise; a pytest case's junit counts,
   the receipt's and those recomputed from its published report, then only
   ever downgrade (E5).

A case that is not PASS also gets a :class:`~executor.evidence.published.Detail`
for display: its failing tests and the last line of its output, from the
verified published files; that text never decides anything.

The fold puts UNVERIFIED over FAIL over PASS (E3); N/A is only a plan's
``applicable: false``. The report is created once (E4).
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import os
from collections import Counter
from typing import Sequence

from executor import VERSION
from executor.evidence import published
from executor.evidence.junit import MISSING, REFUSED
from executor.plan import Case, Plan
from executor.evidence.receipts import (
    NOT_STARTED,
    OP_REAPER,
    OP_ROLE,
    RECEIPT_MAX_BYTES,
    DEPENDENCY_STEPS,
    SHIPPED_FILTER_DIGESTS,
    STEP_DEPENDENCIES,
    STEP_INSTALL,
    STEP_RUNNER,
    STEP_SANDBOX,
    Receipt,
    name_parts,
    output_name_parts,
    receipt_from_bytes,
)
from journal.createonly import EvidenceConflict, open_directory, publish_once
from journal.errors import Refused
from journal.files import JOURNAL_NAME, read_evidence
from journal.format import CAP, Kind, networked_op, sandbox_of
from journal.reader import Reading, Verdict, read_journal
from journal.seal import NAME as SEAL_NAME
from journal.seal import SEAL_MAX_BYTES, SealMarker, seal_from_bytes
from journal.strictjson import canonical, loads
from launcher.vocabulary import ENDED_BY_ITSELF

REPORT_SCHEMA = "casebox.report.v2"
# An evidence directory holds a journal, a seal marker and at most one receipt per case.
MAX_EVIDENCE_ENTRIES = 256

PASS = "PASS"
FAIL = "FAIL"
UNVERIFIED = "UNVERIFIED"
NOT_APPLICABLE = "N/A"

# Every reason code, with the sentence docs/receipts.md gives it.
REASONS = {
    "passed": "the exit matched expect_exit, authenticated by the journal, with positive evidence",
    "exit_mismatch": "the op exited, authenticated by the journal, with a code other than expect_exit",
    "not_applicable": "the plan declares the case not applicable",
    "missing": "no receipt of this attempt names the case",
    "duplicated": "more than one receipt of this attempt names the case",
    "stale": "the evidence is from another attempt",
    "unexpected_receipt": "a receipt names a case the plan declares not applicable",
    "malformed": "the receipt is unreadable or refused by the strict parser",
    "binding_mismatch": "the receipt is bound to another case, plan, bundle, stage, op kind or inventory",
    "seal_missing": "the stage has no seal marker",
    "seal_malformed": "the stage's seal marker is unreadable or refused by the strict parser",
    "journal_missing": "the stage's journal is absent or not a regular file",
    "journal_torn": "the stage's journal is TORN",
    "journal_corrupt": "the stage's journal is CORRUPT",
    "journal_substituted": "the stage's journal is SUBSTITUTED: another stage, journal or head than the marker's",
    "journal_over_cap": "the stage's journal is OVER_CAP",
    "journal_unsealed": "the stage's journal does not end with RETIRED",
    "cleanup_unverified": "the stage's last cleanup evidence is not CLEANED",
    "head_mismatch": "the receipt's journal head is not a head the journal had after the op ended",
    "identity_mismatch": "the receipt's process identity is not its op's PROCESS_INTENT, or two receipts share an op",
    "network_sandbox": "the receipt's op ran in a sandbox that had the index network (S9: a case has loopback only)",
    "filter_mismatch": "the receipt names no syscall filter, one this casebox does not ship, or one its sandbox's SANDBOX_READY did not record (S12)",
    "wait_status_mismatch": "the receipt's wait status is not its op's PROCESS_TERMINAL",
    "descendants_mismatch": "the receipt's descendant count is not its op's DESCENDANTS_TERMINAL",
    published.MISMATCH: "the case's published output files are missing, unreadable, extra or not the bytes its receipt binds",
    "not_started": "the op never reached exec",
    "dependencies_unresolved": "the case never ran: the candidate's dependencies could not be resolved",
    "conflict": "the case never ran: the requirements admit no common set of versions, even with backtracking",
    "candidate_conflict": "the case never ran: a requirement on a candidate project excludes the candidate's version",
    "no_match": "the case never ran: no wheel of the index satisfies a requirement for this runtime",
    "direct_url": "the case never ran: a requirement names a direct URL; only the index is ever fetched",
    "candidate_shadows_runner": "the case never ran: the candidate ships a project or module of the runner (E7)",
    "candidate_shadows_stdlib": "the case never ran: the candidate ships a module named like the standard library's (E7)",
    "install_failed": "the case never ran: installing the candidate and its dependencies failed",
    "runner_failed": "the case never ran: the runner could not be installed, or a plugin the plan names is not in it",
    "sandbox_failed": "the case never ran: its sandbox failed to start or failed under the op",
    "timeout": "the op reached its timeout",
    "memory": "the op hit the memory limit",
    "pids": "the op hit the process limit",
    "output": "the op wrote past its output cap",
    "disk": "the op hit the disk limit",
    "signalled": "the op was killed by a signal",
    "junit_missing": "the pytest case left no junit report",
    "junit_refused": "the pytest case's junit report was refused",
    "vacuous": "the pytest case executed no test, skipped every test, or failed to collect",
    "junit_contradicts": "the junit counts contradict the exit code",
    "pytest_incomplete": "pytest ended with a code other than 0 or 1: the run did not complete",
}
# Problems of the evaluation as a whole; any of them makes the verdict UNVERIFIED.
PROBLEMS = {
    "unexpected_receipt": "a receipt of this attempt names a case that is not in the plan",
    "unexpected_file": "an evidence directory holds a file that is not a journal, a seal marker, a receipt or a case's output",
    "evidence_overflow": f"an evidence directory holds more than {MAX_EVIDENCE_ENTRIES} entries",
    "nothing_applicable": "no case of the plan is applicable, so nothing was verified",
}
# A receipt with no process names the step that kept its case from running.
_NEVER_STARTED_REASONS = {
    STEP_DEPENDENCIES: "dependencies_unresolved",
    STEP_INSTALL: "install_failed",
    STEP_RUNNER: "runner_failed",
    STEP_SANDBOX: "sandbox_failed",
    **{step: step for step in DEPENDENCY_STEPS},
}


@dataclasses.dataclass(frozen=True)
class Expected:
    """What the evidence must be bound to, from the plan and the command line alone."""

    plan: Plan
    attempt_id: str
    bundle_sha256: str
    attempt_number: int | None = None
    # The ids of the plan cases this evaluation judges (one shard's, for ``verify --shard``); None: every case.
    cases: frozenset[str] | None = None

    @property
    def judged(self) -> tuple[Case, ...]:
        return tuple(case for case in self.plan.cases if self.cases is None or case.id in self.cases)

    @functools.cached_property
    def plan_digest(self) -> str:
        return self.plan.digest


@dataclasses.dataclass
class _Stage:
    """One evidence directory: its marker, its journal's reading and the ops the journal recorded."""

    marker: SealMarker | None = None
    reading: Reading | None = None
    problem: str | None = None
    records: dict[tuple[Kind, str], tuple[int, dict]] = dataclasses.field(default_factory=dict)
    heads: dict[str, int] = dataclasses.field(default_factory=dict)
    # case id -> output kind -> its bytes (None: not a regular file within its cap), for this attempt.
    outputs: dict[str, dict[str, bytes | None]] = dataclasses.field(default_factory=dict)

    def summary(self) -> dict:
        marker = self.marker
        return {
            "stage_id": marker.stage_id if marker else None,
            "journal_id": marker.journal_id if marker else None,
            "head": marker.head if marker else None,
            "journal": str(self.reading.verdict) if self.reading else None,
            "problem": self.problem,
        }


def _read_marker(dir_fd: int) -> tuple[SealMarker | None, str | None]:
    try:
        data = read_evidence(dir_fd, SEAL_NAME, SEAL_MAX_BYTES)
    except Refused:
        return None, "seal_malformed"
    if data is None:
        return None, "seal_missing"
    try:
        return seal_from_bytes(data), None
    except Refused:
        return None, "seal_malformed"


def _judge_stage(dir_fd: int, expected: Expected) -> _Stage:
    stage = _Stage()
    stage.marker, stage.problem = _read_marker(dir_fd)
    marker = stage.marker
    if marker is None:
        return stage
    if marker.attempt_id != expected.attempt_id:
        stage.problem = "stale"
        return stage
    try:
        data = read_evidence(dir_fd, JOURNAL_NAME, CAP)
    except Refused:
        data = None
    reading = read_journal(data, expect_stage_id=marker.stage_id, expect_journal_id=marker.journal_id, expect_head=marker.head)
    stage.reading = reading
    if reading.verdict is not Verdict.VALID:
        stage.problem = f"journal_{reading.verdict.lower()}"
    elif reading.genesis["attempt_id"] != expected.attempt_id:
        stage.problem = "stale"
    elif reading.records[-1].kind is not Kind.RETIRED:
        stage.problem = "journal_unsealed"
    else:
        cleanups = [record.fields["outcome"] for record in reading.records if record.kind is Kind.CLEANUP_EVIDENCE]
        if not cleanups or cleanups[-1] != "CLEANED":
            stage.problem = "cleanup_unverified"
    for index, record in enumerate(reading.records):
        stage.heads[record.digest] = index
        if record.kind in (Kind.PROCESS_INTENT, Kind.PROCESS_TERMINAL, Kind.DESCENDANTS_TERMINAL, Kind.SANDBOX_READY):
            stage.records[(record.kind, record.fields["op_id"])] = (index, record.fields)
    return stage


@dataclasses.dataclass
class _Found:
    """One receipt file: where it was and what it held."""

    stage: _Stage
    case_id: str
    data: bytes | None


@dataclasses.dataclass
class _Evidence:
    stages: list[_Stage] = dataclasses.field(default_factory=list)
    fresh: dict[str, list[_Found]] = dataclasses.field(default_factory=dict)
    stale: set[str] = dataclasses.field(default_factory=set)
    problems: set[str] = dataclasses.field(default_factory=set)


def _collect(dir_fd: int, expected: Expected, evidence: _Evidence) -> None:
    stage = _judge_stage(dir_fd, expected)
    evidence.stages.append(stage)
    names = []
    with os.scandir(dir_fd) as listing:
        for entry in listing:
            names.append(entry.name)
            if len(names) > MAX_EVIDENCE_ENTRIES:
                evidence.problems.add("evidence_overflow")
                return
    cases = {case.id for case in expected.plan.cases}
    for name in sorted(names):
        if name in (JOURNAL_NAME, SEAL_NAME):
            continue
        parts = name_parts(name)
        if parts is None:
            output = output_name_parts(name)
            if output is None or output[1] not in cases:
                evidence.problems.add("unexpected_file")
            elif output[0] == expected.attempt_id:
                stage.outputs.setdefault(output[1], {})[output[2]] = published.read_output(dir_fd, name, output[2])
            continue
        attempt_id, case_id = parts
        if attempt_id != expected.attempt_id:
            evidence.stale.add(case_id)
            continue
        if case_id not in cases:
            evidence.problems.add("unexpected_receipt")
            continue
        try:
            data = read_evidence(dir_fd, name, RECEIPT_MAX_BYTES)
        except Refused:
            data = None
        evidence.fresh.setdefault(case_id, []).append(_Found(stage, case_id, data))


def _journal_reason(receipt: Receipt, stage: _Stage) -> str | None:
    """E1: the receipt's head, process identity, wait status and descendant count against the journal."""
    head = stage.heads.get(receipt.journal_head)
    if head is None:
        return "head_mismatch"
    process = receipt.process
    if process is None:
        return None
    if networked_op(process.op_id):
        return "network_sandbox"
    ready = stage.records.get((Kind.SANDBOX_READY, f"{sandbox_of(process.op_id)}.init"))
    if receipt.filter_digest not in SHIPPED_FILTER_DIGESTS or ready is None or ready[1]["filter_digest"] != receipt.filter_digest:
        return "filter_mismatch"
    intent = stage.records.get((Kind.PROCESS_INTENT, process.op_id))
    if intent is None or intent[1]["role"] != OP_ROLE or (
        intent[1]["pid"], intent[1]["starttime"], intent[1]["pgid"]
    ) != (process.pid, process.starttime, process.pgid):
        return "identity_mismatch"
    terminal = stage.records.get((Kind.PROCESS_TERMINAL, process.op_id))
    if terminal is None or terminal[1]["reaper"] != OP_REAPER or terminal[1]["wait_status"] != receipt.outcome.wait_status:
        return "wait_status_mismatch"
    descendants = stage.records.get((Kind.DESCENDANTS_TERMINAL, process.op_id))
    if descendants is None or descendants[1]["count"] != receipt.outcome.descendants_reaped:
        return "descendants_mismatch"
    if head < max(terminal[0], descendants[0]):
        return "head_mismatch"
    return None


def _receipt_reason(found: _Found, case: Case, expected: Expected) -> tuple[Receipt | None, str | None]:
    if found.stage.problem is not None:
        return None, found.stage.problem
    if found.data is None:
        return None, "malformed"
    try:
        receipt = receipt_from_bytes(found.data)
    except Refused:
        return None, "malformed"
    binding = receipt.binding
    if binding.attempt_id != expected.attempt_id or expected.attempt_number not in (None, binding.attempt_number):
        return None, "stale"
    if (
        receipt.case_id != found.case_id
        or binding.plan_digest != expected.plan_digest
        or binding.bundle_sha256 != expected.bundle_sha256
        or binding.stage_id != found.stage.marker.stage_id
        or (receipt.pytest is None) != (case.op != "pytest")
        or (case.op == "pytest" and receipt.process is not None and binding.runner_inventory_digest is None)
    ):
        return None, "binding_mismatch"
    reason = _journal_reason(receipt, found.stage)
    if reason is None and not published.matches(receipt.published, found.stage.outputs.get(case.id, {})):
        reason = published.MISMATCH
    return (None, reason) if reason else (receipt, None)


def _inventories(receipt: Receipt) -> tuple[str, str, str, str]:
    binding = receipt.binding
    return binding.candidate_digest, binding.dependency_inventory_digest, binding.runtime_inventory_digest, binding.runtime_version


def _cross_check(accepted: dict[str, tuple[Receipt, _Stage]], reasons: dict[str, str]) -> None:
    """Step 4: every accepted receipt agrees on the inventories and the attempt number; no op is claimed twice."""
    inventories = {case_id: _inventories(r) for case_id, (r, _) in accepted.items()}
    runners = {r.binding.runner_inventory_digest for r, _ in accepted.values()} - {None}
    numbers = {case_id: r.binding.attempt_number for case_id, (r, _) in accepted.items()}
    ops = Counter((r.binding.stage_id, r.process.op_id) for r, _ in accepted.values() if r.process is not None)
    for case_id, (receipt, _) in list(accepted.items()):
        if len(set(inventories.values())) > 1 or len(runners) > 1:
            reasons[case_id] = "binding_mismatch"
        elif len(set(numbers.values())) > 1:
            reasons[case_id] = "stale"
        elif receipt.process is not None and ops[(receipt.binding.stage_id, receipt.process.op_id)] > 1:
            reasons[case_id] = "identity_mismatch"
        else:
            continue
        del accepted[case_id]


def outcome_status(case: Case, receipt: Receipt) -> tuple[str, str]:
    """Step 5: the status and reason of an authenticated receipt; junit counts only ever downgrade (E5)."""
    limit = receipt.outcome.limit
    if limit == NOT_STARTED:
        never = receipt.outcome.not_started
        if receipt.process is None and never is not None:
            return UNVERIFIED, _NEVER_STARTED_REASONS.get(never.step, "not_started")
        return UNVERIFIED, "not_started"
    if limit not in ENDED_BY_ITSELF:
        # S14: an op stopped by a limit, or by a signal, is never judged by its exit code.
        return UNVERIFIED, limit.lower()
    exit_code = receipt.exit_code
    status, reason = (PASS, "passed") if exit_code == case.expect_exit else (FAIL, "exit_mismatch")
    if case.op != "pytest":
        return status, reason
    evidence = receipt.pytest
    if evidence.report == MISSING:
        return UNVERIFIED, "junit_missing"
    if evidence.report == REFUSED:
        return UNVERIFIED, "junit_refused"
    counts = evidence.counts
    if counts.vacuous:
        return UNVERIFIED, "vacuous"
    failed = counts.failures + counts.errors
    if (exit_code == 0 and failed) or (exit_code == 1 and not failed):
        return UNVERIFIED, "junit_contradicts"
    if status == FAIL and exit_code not in (0, 1):
        return UNVERIFIED, "pytest_incomplete"
    return status, reason


_SEVERITY = {PASS: 0, FAIL: 1, UNVERIFIED: 2}


def judged_status(case: Case, receipt: Receipt, files: dict[str, bytes | None]) -> tuple[str, str]:
    """Step 5 on the receipt, then again with the counts of its published report: the worse of the two (E5)."""
    status, reason = outcome_status(case, receipt)
    recomputed = published.recomputed_evidence(receipt, files)
    if recomputed is not None and (recomputed.report, recomputed.counts) != (receipt.pytest.report, receipt.pytest.counts):
        again = outcome_status(case, dataclasses.replace(receipt, pytest=recomputed))
        if _SEVERITY[again[0]] > _SEVERITY[status]:
            return again
    return status, reason


@dataclasses.dataclass(frozen=True)
class CaseResult:
    case_id: str
    status: str
    reason: str
    stage_id: str | None = None
    limit: str | None = None
    exit_code: int | None = None
    wall_ms: int | None = None
    # For a case that is not PASS with an authenticated receipt: what a reviewer is shown beside the reason.
    detail: published.Detail | None = None

    def as_dict(self) -> dict:
        return {
            "id": self.case_id,
            "status": self.status,
            "reason": self.reason,
            "stage_id": self.stage_id,
            "limit": self.limit,
            "exit_code": self.exit_code,
            "wall_ms": self.wall_ms,
            "detail": None if self.detail is None else self.detail.as_dict(),
        }


@dataclasses.dataclass(frozen=True)
class Report:
    expected: Expected
    cases: tuple[CaseResult, ...]
    stages: tuple[dict, ...]
    problems: tuple[str, ...]
    inventories: tuple[str | None, str | None, str | None, str | None]
    runner_inventory: str | None
    attempt_number: int | None

    @property
    def verdict(self) -> str:
        statuses = {result.status for result in self.cases}
        if self.problems or UNVERIFIED in statuses:
            return UNVERIFIED
        return FAIL if FAIL in statuses else PASS

    @property
    def name(self) -> str:
        return report_name(self.expected.attempt_id)

    def as_dict(self) -> dict:
        candidate, dependency, runtime, runtime_version = self.inventories
        return {
            "schema": REPORT_SCHEMA,
            "casebox_version": VERSION,
            "attempt_id": self.expected.attempt_id,
            "attempt_number": self.attempt_number,
            "plan_digest": self.expected.plan_digest,
            "bundle_sha256": self.expected.bundle_sha256,
            "candidate_digest": candidate,
            "dependency_inventory_digest": dependency,
            "runtime_inventory_digest": runtime,
            "runtime_version": runtime_version,
            "runner_inventory_digest": self.runner_inventory,
            "stages": list(self.stages),
            "cases": [result.as_dict() for result in self.cases],
            "problems": list(self.problems),
            "verdict": self.verdict,
        }

    def canonical_bytes(self) -> bytes:
        return canonical(self.as_dict())


def report_name(attempt_id: str) -> str:
    return f"report-{attempt_id}.json"


def _open_evidence(paths: Sequence[str]) -> list[int]:
    fds: list[int] = []
    seen: dict[tuple[int, int], str] = {}
    try:
        for path in paths:
            fd = open_directory(path)
            fds.append(fd)
            status = os.fstat(fd)
            identity = (status.st_dev, status.st_ino)
            if identity in seen:
                raise Refused(path, f"is the same directory as {seen[identity]}; give each evidence directory once")
            seen[identity] = path
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def evaluate(expected: Expected, evidence_paths: Sequence[str]) -> Report:
    """Fold the evidence in ``evidence_paths`` (one directory per stage) into a report for ``expected``."""
    evidence = _Evidence()
    fds = _open_evidence(evidence_paths)
    try:
        for fd in fds:
            try:
                _collect(fd, expected, evidence)
            except OSError as error:
                raise Refused("--evidence", f"an evidence directory cannot be read ({os.strerror(error.errno or errno.EIO)})") from None
    finally:
        for fd in fds:
            os.close(fd)
    reasons: dict[str, str] = {}
    accepted: dict[str, tuple[Receipt, _Stage]] = {}
    for case in expected.judged:
        found = evidence.fresh.get(case.id, [])
        if not case.applicable:
            reasons[case.id] = "unexpected_receipt" if found else "not_applicable"
        elif len(found) > 1:
            reasons[case.id] = "duplicated"
        elif not found:
            reasons[case.id] = "stale" if case.id in evidence.stale else "missing"
        else:
            receipt, reason = _receipt_reason(found[0], case, expected)
            if receipt is None:
                reasons[case.id] = reason
            else:
                accepted[case.id] = (receipt, found[0].stage)
    _cross_check(accepted, reasons)
    results = []
    for case in expected.judged:
        if case.id in accepted:
            receipt, stage = accepted[case.id]
            files = stage.outputs.get(case.id, {})
            status, reason = judged_status(case, receipt, files)
            observed = receipt.outcome.observed
            results.append(
                CaseResult(
                    case.id, status, reason, receipt.binding.stage_id, receipt.outcome.limit, receipt.exit_code,
                    observed.wall_ms if observed else None,
                    None if status == PASS else published.detail(case, receipt, reason, files),
                )
            )
        else:
            reason = reasons[case.id]
            results.append(CaseResult(case.id, NOT_APPLICABLE if reason == "not_applicable" else UNVERIFIED, reason))
    problems = set(evidence.problems)
    if all(result.status == NOT_APPLICABLE for result in results):
        problems.add("nothing_applicable")
    receipts = [receipt for receipt, _ in accepted.values()]
    inventories = {_inventories(r) for r in receipts}
    runners = {r.binding.runner_inventory_digest for r in receipts} - {None}
    numbers = {r.binding.attempt_number for r in receipts}
    return Report(
        expected=expected,
        cases=tuple(results),
        stages=tuple(sorted((stage.summary() for stage in evidence.stages), key=canonical)),
        problems=tuple(sorted(problems)),
        inventories=inventories.pop() if len(inventories) == 1 else (None, None, None, None),
        runner_inventory=runners.pop() if len(runners) == 1 else None,
        attempt_number=numbers.pop() if len(numbers) == 1 else expected.attempt_number,
    )


def _differences(existing: bytes, report: Report) -> str:
    """Which top-level fields of the report already there differ from ``report``'s, and its verdict."""
    try:
        value = loads(existing, max_bytes=len(existing))
    except Refused:
        return "it is not a casebox report"
    if not isinstance(value, dict):
        return "it is not a casebox report"
    ours = report.as_dict()
    fields = sorted(key for key in set(value) | set(ours) if value.get(key) != ours.get(key))
    return f"it differs in {', '.join(fields)}; its verdict is {value.get('verdict')!s:.16}"


def publish_report(report_dir: str, report: Report) -> str:
    """Create ``report-<attempt>.json`` in ``report_dir`` once (E4); its path.

    A different report already there is kept, and the refusal says how it
    differs and what this evaluation's verdict is, so the answer is not lost.
    """
    dir_fd = open_directory(report_dir)
    path = os.path.join(report_dir, report.name)
    try:
        publish_once(dir_fd, report.name, report.canonical_bytes(), shown=path)
    except EvidenceConflict as conflict:
        existing = read_evidence(dir_fd, report.name, 4 * len(report.canonical_bytes()) + 65_536)
        why = _differences(existing, report) if existing is not None else "it cannot be read"
        raise Refused(
            path,
            f"already holds another evaluation of attempt {report.expected.attempt_id} ({why}) and is kept; this "
            f"evaluation's verdict is {report.verdict} and was not written; give another --report-dir",
        ) from conflict
    finally:
        os.close(dir_fd)
    return path
