"""The case service: the only starter of the candidate's sandboxes, and the writer of receipts (C9, E4, E6).

Everything that parses or runs candidate bytes runs in a sandbox it starts,
as the dedicated UID (docs/pipeline.md):

- **extract**: the hardened extractor (executor/extract.py, through
  executor/inside.py) reads the private bundle copy at ``/cap/bundle`` and
  writes ``/out/candidate``; the output is then sealed and the trusted side
  recomputes the candidate identity digest from the sealed files
  (``identity.digest_directory``), never from the tar;
- **install**: once per session, ``pip install --no-index --no-deps
  --target /out/site`` from the sealed candidate and the sealed
  dependencies, pip unpacked from its wheel in the sandbox
  (executor/inside.py); ``site`` is sealed and mounted read-only at
  ``/cap/site`` in every case sandbox;
- **cases**: one sandbox per case, one op: the plan's op materialized
  (:func:`case_argv`), with the verifier tree at ``/cap/verifier`` and, for a
  pytest case, a writable output of its own for the junit report, sealed
  before the next case starts. No fail-fast (E6): every applicable case gets
  a receipt whatever happened to the others, and a case whose op could not
  start gets a receipt that says so, with no process and no wait status.

Receipts are built on the trusted side from the session's ``OpOutcome``
(executor/receipts.py) and stored with ``session.publish`` (E4), each after
the case's output files it binds (stdout, stderr, the junit report). Cases the
plan declares not applicable are not run and get no receipt: the evaluator
reports them N/A (docs/receipts.md).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Sequence

from executor import identity
from executor.environ import SANDBOX_ENV
from executor.inside import BOOT
from executor.junit import MISSING, REFUSED, REPORT_NAME, PytestEvidence, Report, report_from_directory
from executor.manifest import wheel_project
from executor.ownership import CASE_SERVICE, Gate, LifecycleEvidence, failure_of
from executor.plan import Case, Plan
from executor.preparer import DEPS, PIP_ENV, REQUEST, Dependencies, pip_argv
from executor.receipts import (
    STEP_INSTALL,
    STEP_SANDBOX,
    Binding,
    CaseOutput,
    ProcessIdentity,
    Receipt,
    build_receipt,
    never_started,
    outcome_from_launcher,
)
from executor.runtime import Runtime
from executor.staging import BUNDLE_NAME
from executor.ustar import TOP, TOTAL_MAX_BYTES
from journal.errors import Refused
from launcher.protocol import MAX_OUTPUT_CAP
from steward.api import MIB, Limits, OpOutcome, Sealed

CANDIDATE = "candidate"
SITE = "site"
VERIFIER = "verifier"
SITE_PATH = f"/cap/{SITE}"
EXTRACT_TIMEOUT_MS = 120_000
INSTALL_TIMEOUT_MS = 600_000
SITE_MAX_BYTES = 1024 * MIB
SITE_MAX_INODES = 65_536
REPORT_OUTPUT_BYTES = 2 * MIB
# pip compiles the installed sources with checked-hash .pyc files when SOURCE_DATE_EPOCH is set, so
# the sealed site needs no writable cache and no timestamps (1980-01-01, the earliest a zip can hold).
INSTALL_ENV = {**PIP_ENV, "SOURCE_DATE_EPOCH": "315532800"}
CASE_ENV = {
    **SANDBOX_ENV,
    "PATH": f"{SITE_PATH}/bin:/usr/bin:/bin",
    "PYTHONPATH": SITE_PATH,
    "PYTHONDONTWRITEBYTECODE": "1",
}


@dataclasses.dataclass(frozen=True)
class Extraction:
    """The sealed extraction: its output, the recomputed identity digest and the candidate's wheels."""

    sealed: Sealed
    candidate_digest: str
    wheels: tuple[str, ...]

    @property
    def projects(self) -> dict[str, str]:
        return dict(wheel_project(wheel, wheel) for wheel in self.wheels)


@dataclasses.dataclass(frozen=True)
class Blocked:
    """No case can start: the step that failed (a receipt's not_started.step) and why."""

    step: str
    sentence: str


@dataclasses.dataclass(frozen=True)
class CaseRun:
    case_id: str
    receipt: Receipt
    sentence: str | None


def check_materializable(plan: Plan) -> None:
    """Refuse a plan whose ops cannot be materialized: a python-module needs a module, a console script a name."""
    for index, case in enumerate(plan.cases):
        where = f"$.cases[{index}].args"
        if case.op == "python-module" and not case.args:
            raise Refused(where, "a python-module case names its module as args[0]")
        if case.op == "console-script" and (not case.args or "/" in case.args[0] or case.args[0] in ("", ".", "..")):
            raise Refused(where, "a console-script case names the installed script as args[0], a plain file name")


def report_output(index: int) -> str:
    """The writable output of the pytest case at plan index ``index``: /out/junit-N."""
    return f"junit-{index}"


def case_argv(interpreter: str, case: Case, report: str | None) -> list[str]:
    """The plan's op, materialized (docs/plan.md): no shell, site from /cap/site, ``-S`` so nothing of the host's site-packages."""
    if case.op == "python-module":
        return [interpreter, "-S", "-m", *case.args]
    if case.op == "console-script":
        return [interpreter, "-S", f"{SITE_PATH}/bin/{case.args[0]}", *case.args[1:]]
    return [interpreter, "-S", "-m", "pytest", f"--junitxml={report}", *case.args]


class CaseService:
    """The case service of one session: it alone starts the candidate's sandboxes."""

    def __init__(
        self, gate: Gate, session, *, runtime: Runtime, progress: Callable[[str], None],
        finished: Callable[[Case, Receipt], None] | None = None,
    ) -> None:
        self.starter = gate.starter(CASE_SERVICE, self)
        self.session = session
        self.runtime = runtime
        self.progress = progress
        # Told of each case as soon as its receipt is stored (the progress lines of executor/reporting.py).
        self.finished = finished
        self.head = session.info().head

    def __repr__(self) -> str:
        return CASE_SERVICE

    def _observe(self, result: OpOutcome | LifecycleEvidence) -> OpOutcome | LifecycleEvidence:
        if isinstance(result, OpOutcome):
            self.head = result.head
        return result

    # -- extraction and install ---------------------------------------------------------------------

    def extract(self) -> Extraction | Blocked:
        """Extract the bundle in a sandbox, seal it, and recompute its identity digest on the trusted side (T3, T4)."""
        self.progress("extracting the candidate in a sandbox")
        self.session.create_output(CANDIDATE, max_bytes=TOTAL_MAX_BYTES + MIB, max_inodes=16)
        argv = [
            self.runtime.interpreter, "-I", "-S", "-B", "-c", BOOT, "extract", f"/cap/bundle/{BUNDLE_NAME}", f"/out/{CANDIDATE}",
        ]
        result = self._observe(
            self.starter.run_one(
                argv, read=["bundle", "tools"], write=[CANDIDATE], env=SANDBOX_ENV, cwd="/work",
                timeout_ms=EXTRACT_TIMEOUT_MS, stdout_cap=MAX_OUTPUT_CAP, stderr_cap=MAX_OUTPUT_CAP,
            )
        )
        problem = failure_of(result)
        if problem is not None:
            return Blocked("extraction", f"the extractor refused or failed: {problem}")
        try:
            return self._identify(self.session.seal_output(CANDIDATE))
        except Refused as refusal:
            return Blocked("extraction", f"the extraction cannot be sealed or identified: {refusal.sentence()}")

    def _identify(self, sealed: Sealed) -> Extraction:
        """The candidate identity digest, recomputed from the sealed files as data (never the tar), and the wheels."""
        fd = self.session.open_output(CANDIDATE)
        try:
            top = os.open(TOP, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        finally:
            os.close(fd)
        try:
            digest = identity.digest_directory(top)
            wheels = tuple(sorted(name for name in os.listdir(top) if name.endswith(".whl")))
        finally:
            os.close(top)
        for wheel in wheels:
            wheel_project(wheel, f"the sealed candidate's {wheel}")
        return Extraction(sealed, digest, wheels)

    def install(self, extraction: Extraction, dependencies: Dependencies) -> Sealed | Blocked:
        """Install the candidate and its dependencies once, into ``site``, and seal it."""
        self.progress("installing the candidate and its dependencies with pip in a sandbox")
        self.session.create_output(SITE, max_bytes=SITE_MAX_BYTES, max_inodes=SITE_MAX_INODES)
        wheels = [f"/cap/{CANDIDATE}/{TOP}/{wheel}" for wheel in extraction.wheels]
        wheels += [f"/cap/{DEPS}/{file}" for file in dependencies.files]
        argv = pip_argv(self.runtime, "install", "--no-index", "--no-deps", "--target", f"/out/{SITE}", *wheels)
        result = self._observe(
            self.starter.run_one(
                argv, read=["tools", REQUEST, CANDIDATE, DEPS], write=[SITE], limits=Limits(tmp_bytes=512 * MIB),
                env={**SANDBOX_ENV, **INSTALL_ENV}, cwd="/work", timeout_ms=INSTALL_TIMEOUT_MS,
                stdout_cap=MAX_OUTPUT_CAP, stderr_cap=MAX_OUTPUT_CAP,
            )
        )
        problem = failure_of(result)
        if problem is not None:
            return Blocked(STEP_INSTALL, f"pip install failed: {problem}")
        try:
            return self.session.seal_output(SITE)
        except Refused as refusal:
            return Blocked(STEP_INSTALL, f"the installed site cannot be sealed: {refusal.sentence()}")

    # -- cases --------------------------------------------------------------------------------------

    def run_cases(self, cases: Sequence[tuple[int, Case]], binding: Binding, blocked: Blocked | None) -> list[CaseRun]:
        """Every applicable case of ``cases`` (plan index, case), each with its receipt; none stops the others (E6)."""
        runs = []
        for index, case in cases:
            if not case.applicable:
                continue
            if blocked is not None:
                run, output = self._never_ran(case, binding, blocked.step, blocked.sentence), None
            else:
                run, output = self._run_case(index, case, binding)
            if output is not None:
                for name, data in output.files(binding.attempt_id, case.id).items():
                    self.session.publish(name, data)
            self.session.publish(run.receipt.name, run.receipt.canonical_bytes())
            runs.append(run)
            if self.finished is not None:
                self.finished(case, run.receipt)
        return runs

    def _never_ran(self, case: Case, binding: Binding, step: str, sentence: str) -> CaseRun:
        pytest = PytestEvidence(MISSING, None) if case.op == "pytest" else None
        return CaseRun(case.id, build_receipt(binding, case.id, None, never_started(step), pytest, self.head), sentence)

    def _run_case(self, index: int, case: Case, binding: Binding) -> tuple[CaseRun, CaseOutput | None]:
        report = report_output(index) if case.op == "pytest" else None
        write = []
        if report is not None:
            self.session.create_output(report, max_bytes=REPORT_OUTPUT_BYTES, max_inodes=16)
            write.append(report)
        argv = case_argv(self.runtime.interpreter, case, f"/out/{report}/{REPORT_NAME}" if report else None)
        result = self._observe(
            self.starter.run_one(
                argv, read=[SITE, VERIFIER], write=write, env=CASE_ENV, cwd=f"/cap/{VERIFIER}",
                timeout_ms=case.timeout_ms, stdout_cap=MAX_OUTPUT_CAP, stderr_cap=MAX_OUTPUT_CAP,
            )
        )
        junit = None if report is None else self._junit(report)
        pytest = None if junit is None else junit.evidence
        if isinstance(result, LifecycleEvidence):
            return self._never_ran(case, binding, STEP_SANDBOX, result.reason), None
        process = ProcessIdentity(result.op_id, result.pid, result.starttime, result.pgid)
        outcome = outcome_from_launcher(result.observation)
        output = None if outcome.observed is None else CaseOutput.of(result.observation, None if junit is None else junit.data)
        receipt = build_receipt(binding, case.id, process, outcome, pytest, result.head, output)
        return CaseRun(case.id, receipt, None), output

    def _junit(self, report: str) -> Report:
        """E5: seal the case's own report output, then read the report as hostile data; only ever a downgrade."""
        try:
            self.session.seal_output(report)
        except Refused:
            return Report(PytestEvidence(REFUSED, None), None)
        fd = self.session.open_output(report)
        try:
            return report_from_directory(fd)
        finally:
            os.close(fd)
