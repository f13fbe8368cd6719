"""Synthetic evidence for the evaluator tests: real journals (JournalWriter), real receipts, real seal markers.

A :class:`Stage` is one evidence directory as the steward and the case
service will leave it (docs/receipts.md, "Evidence directory"). Each
:meth:`Stage.run` journals one op the way the starter does (intent,
release, terminal by the launcher, descendants) and publishes its receipt;
:meth:`Stage.seal` writes cleanup evidence, retires the journal and leaves
the seal marker. Tests then tamper with the files.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import pathlib

from executor.evidence.junit import READ, JunitCounts, PytestEvidence, evidence_from_bytes
from executor.plan import Plan
from executor.evidence.receipts import (
    OP_REAPER,
    OP_ROLE,
    SHIPPED_FILTER_DIGESTS,
    Binding,
    CaseOutput,
    NotStarted,
    Observed,
    Outcome,
    ProcessIdentity,
    Stream,
    build_receipt,
    receipt_name,
)
from executor.shard import cases_for_shard
from journal.createonly import publish_once
from journal.seal import NAME as SEAL_NAME
from journal.seal import SealMarker
from journal.strictjson import canonical
from journal.writer import JournalWriter

ATTEMPT = "run-42-1"
BUNDLE = "b" * 64
CANDIDATE = "sha256:" + "c" * 64
DEPENDENCIES = "sha256:" + "d" * 64
RUNTIME = "sha256:" + "e" * 64
RUNNER = "sha256:" + "7" * 64
SHIPPED_FILTER = min(SHIPPED_FILTER_DIGESTS)
T0 = 1_767_225_600_000_000
_pids = itertools.count(4100)


def report_xml(counts: JunitCounts) -> bytes:
    """A junit report with exactly these counts: test case k has each outcome whose count is above k."""
    cases = []
    for k in range(counts.tests):
        inner = b"<skipped/>" if k < counts.skipped else b""
        inner += b'<failure message="assert %d == %d">E  assert</failure>' % (k, k + 1) if k < counts.failures else b""
        if k < counts.errors:
            inner += b'<error message="collection failure"/>' if k < counts.collection_errors else b'<error message="boom"/>'
        cases.append(b'<testcase classname="tests.test_x" name="test_%d">%s</testcase>' % (k, inner))
    return b"<testsuites><testsuite>" + b"".join(cases) + b"</testsuite></testsuites>"


def junit(tests: int = 1, skipped: int = 0, failures: int = 0, errors: int = 0, collection_errors: int = 0) -> PytestEvidence:
    """The evidence of a report with these counts, as the case service reads it (its size included)."""
    counts = JunitCounts(tests, skipped, failures, errors, collection_errors)
    evidence = evidence_from_bytes(report_xml(counts))
    assert evidence.counts == counts
    return evidence


def exited(code: int) -> int:
    return code << 8


@dataclasses.dataclass(frozen=True)
class Run:
    """How one case's op ends: its class, raw wait status and evidence."""

    limit: str = "OK"
    wait_status: int = 0
    pytest: PytestEvidence | None = None
    descendants: int = 0
    wall_ms: int = 120

    stdout: bytes = b"out"
    stderr: bytes = b""
    # The report bytes when a test needs its own (its evidence then comes from them: evidence_from_bytes).
    report: bytes | None = None

    def outcome(self) -> Outcome:
        if self.limit == "NOT_STARTED":
            return Outcome("NOT_STARTED", self.wait_status, self.descendants, None, NotStarted("exec", 2))
        observed = Observed(self.wall_ms, self.wall_ms // 2, 20_480, 24 << 20, Stream.of(self.stdout, False), Stream.of(self.stderr, False))
        return Outcome(self.limit, self.wait_status, self.descendants, observed, None)

    def output(self) -> CaseOutput | None:
        """What the case service publishes beside the receipt: the streams, and the report when one was read."""
        if self.limit == "NOT_STARTED":
            return None
        if self.report is not None:
            return CaseOutput(self.stdout, self.stderr, self.report)
        read = self.pytest is not None and self.pytest.report == READ
        return CaseOutput(self.stdout, self.stderr, report_xml(self.pytest.counts) if read else None)


# The designed outcome of each case of examples/plan.json, as the case service would observe it.
DESIGNED_RUNS = {
    "pass": Run(pytest=junit(1)),
    "assertion-failure": Run("EXIT_NONZERO", exited(1), junit(1, failures=1)),
    "import-core": Run(),
    "import-greet": Run(),
    "import-extra": Run(),
    "console-script": Run(),
    "timeout": Run("TIMEOUT", 9, PytestEvidence("missing", None), wall_ms=2000),
    "output-cap": Run("OUTPUT", 9, PytestEvidence("missing", None)),
    "network-denied": Run(pytest=junit(1)),
}
DESIGNED_STATUS = {
    "pass": ("PASS", "passed"),
    "assertion-failure": ("FAIL", "exit_mismatch"),
    "import-core": ("PASS", "passed"),
    "import-greet": ("PASS", "passed"),
    "import-extra": ("PASS", "passed"),
    "console-script": ("PASS", "passed"),
    "timeout": ("UNVERIFIED", "timeout"),
    "not-applicable": ("N/A", "not_applicable"),
    "output-cap": ("UNVERIFIED", "output"),
    "network-denied": ("PASS", "passed"),
}


class Stage:
    """One evidence directory: a stage's journal, receipts and seal marker."""

    def __init__(self, directory: pathlib.Path, plan: Plan, *, attempt: str = ATTEMPT, stage_id: str = "stage-1", **binding) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.plan = plan
        self.stage_id = stage_id
        self.journal_id = f"journal-{stage_id}"
        self.dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        clock = itertools.count(T0, 1_000).__next__
        self.writer = JournalWriter.create(
            self.dir_fd, "journal", journal_id=self.journal_id, stage_id=stage_id, attempt_id=attempt, clock=clock
        )
        fields = dict(
            attempt_id=attempt,
            attempt_number=1,
            plan_digest=plan.digest,
            candidate_digest=CANDIDATE,
            bundle_sha256=BUNDLE,
            dependency_inventory_digest=DEPENDENCIES,
            runtime_inventory_digest=RUNTIME,
            runtime_version="cpython 3.11.2",
            runner_inventory_digest=RUNNER,
            stage_id=stage_id,
        )
        fields.update(binding)
        self.binding = Binding(**fields)
        self.ops = 0

    def journal_op(
        self,
        run: Run,
        *,
        journal_wait: int | None = None,
        journal_descendants: int | None = None,
        journal_role: str = OP_ROLE,
        journal_reaper: str = OP_REAPER,
        journal_filter: str | None = SHIPPED_FILTER,
        sandbox: str | None = None,
    ) -> ProcessIdentity:
        """Journal an op as the starter does, in a sandbox of its own whose pid 1 proved the shipped syscall filter
        (SANDBOX_READY); the ``journal_*`` options make the journal disagree with the receipt (``journal_filter``
        None: no SANDBOX_READY at all). ``sandbox`` names it, so its op is ``<sandbox>.op-N``."""
        self.ops += 1
        sandbox = sandbox or f"{self.stage_id}-{self.ops}"
        pid = next(_pids)
        self.writer.process_intent(f"{sandbox}.init", "namespace", pid, 90_000 + pid, pid)
        if journal_filter is not None:
            self.writer.sandbox_ready(f"{sandbox}.init", journal_filter)
        pid = next(_pids)
        process = ProcessIdentity(f"{sandbox}.op-{self.ops}", pid, 90_000 + pid, pid)
        self.writer.process_intent(process.op_id, journal_role, process.pid, process.starttime, process.pgid)
        self.writer.process_released(process.op_id)
        wait = run.wait_status if journal_wait is None else journal_wait
        self.writer.process_terminal(process.op_id, wait, journal_reaper)
        count = run.descendants if journal_descendants is None else journal_descendants
        self.writer.descendants_terminal(process.op_id, count)
        return process

    def run(self, case_id: str, run: Run, *, receipt_filter: str | None = SHIPPED_FILTER, **journal) -> str:
        """Journal the case's op as the starter does, then publish its receipt (naming ``receipt_filter``); the
        receipt's file name."""
        process = self.journal_op(run, **journal)
        output = run.output()
        receipt = build_receipt(
            self.binding, case_id, process, run.outcome(), run.pytest, self.writer.head, output, receipt_filter
        )
        for name, data in ({} if output is None else output.files(self.binding.attempt_id, case_id)).items():
            publish_once(self.dir_fd, name, data)
        publish_once(self.dir_fd, receipt.name, receipt.canonical_bytes())
        return receipt.name

    def seal(self, *, cleanup: str = "CLEANED", retire: bool = True) -> SealMarker:
        head = self.writer.head
        self.writer.cleanup_evidence(cleanup, head, "1" * 64, "2" * 64, "3" * 64)
        if retire:
            self.writer.retirement_intent("retiring")
            self.writer.retired("sealed")
        marker = SealMarker(self.binding.attempt_id, self.stage_id, self.journal_id, self.writer.head)
        self.writer.close()
        publish_once(self.dir_fd, SEAL_NAME, marker.canonical_bytes())
        os.close(self.dir_fd)
        return marker

    # Tampering

    def path(self, name: str) -> pathlib.Path:
        return self.directory / name

    def receipt_path(self, case_id: str, attempt: str = ATTEMPT) -> pathlib.Path:
        return self.directory / receipt_name(attempt, case_id)


def rewrite_json(path: pathlib.Path, change) -> None:
    """Re-encode the JSON file at ``path`` canonically after ``change(value)``; the file keeps its name."""
    value = json.loads(path.read_bytes())
    change(value)
    os.chmod(path, 0o644)
    path.write_bytes(canonical(value))


def build_attempt(
    base: pathlib.Path,
    plan: Plan,
    runs: dict[str, Run],
    *,
    shards: int = 1,
    attempt: str = ATTEMPT,
) -> list[pathlib.Path]:
    """Evidence directories for every applicable case of ``plan`` split over ``shards``; their paths."""
    directories = []
    for index in range(1, shards + 1):
        directory = base / f"evidence-{attempt}-{index}"
        stage = Stage(directory, plan, attempt=attempt, stage_id=f"{attempt}-stage-{index}")
        for case in cases_for_shard(plan, index, shards):
            if case.applicable:
                stage.run(case.id, runs[case.id])
        stage.seal()
        directories.append(directory)
    return directories
