"""The case service: the only starter of the candidate's sandboxes, and the writer of receipts (C9, E4, E6, E7).

Everything that parses or runs candidate bytes runs in a sandbox it starts,
as the dedicated UID (docs/pipeline.md):

- **extract**: the hardened extractor (executor/transport/extract.py, through
  executor/inside.py) reads the private bundle copy at ``/cap/bundle`` and
  writes ``/out/candidate``; the output is then sealed and the trusted side
  recomputes the candidate identity digest from the sealed files
  (``identity.digest_directory``), never from the tar;
- **install**: two sealed trees, each installed once by PyPA's ``installer``
  in a sandbox of its own (executor/inside.py, ``install``): the **runner**
  (the verifier's test tools from the index, never from the bundle) at
  ``/cap/runner`` and the **candidate** (its wheels and their dependencies)
  at ``/cap/site``, each with its modules in ``site-packages/`` as a venv
  has them. The shadowing rule (executor/deps/shadowing.py) is applied to
  the listing of each sealed tree's modules;
- **cases**: one sandbox per case, one op: the plan's op materialized
  (:func:`case_argv`), with the verifier tree read-only and, for a pytest
  case, a writable output of its own for the junit report, sealed before the
  next case starts. The search path is the standard library, then the
  runner, then the candidate (E7). No fail-fast (E6): every applicable case
  gets a receipt whatever happened to the others, and a case whose op could
  not start gets a receipt that says so, with no process and no wait status.

Receipts are built on the trusted side from the session's ``OpOutcome``
(executor/evidence/receipts.py) and stored with ``session.publish`` (E4), each after
the case's output files it binds (stdout, stderr, the junit report). Cases the
plan declares not applicable are not run and get no receipt: the evaluator
reports them N/A (docs/receipts.md).
"""

from __future__ import annotations

import collections
import configparser
import dataclasses
import os
from typing import Callable, Sequence

from executor.transport import identity
from executor.environ import SANDBOX_ENV
from executor.inside import BOOT, MODULES_DIRECTORY, RUNNER_BOOT_NAME
from executor.evidence.junit import MISSING, REFUSED, REPORT_NAME, PytestEvidence, Report, report_from_directory
from executor.transport.manifest import wheel_project
from executor.cases.ownership import CASE_SERVICE, Ahead, Gate, LifecycleEvidence, StartFailed, failure_of
from executor.plan import KIB, Case, Plan
from executor.deps.preparer import DEPS, Dependencies, install_argv
from executor.evidence.receipts import (
    STEP_INSTALL,
    STEP_RUNNER,
    STEP_SANDBOX,
    Binding,
    CaseOutput,
    ProcessIdentity,
    Receipt,
    build_receipt,
    never_started,
    outcome_from_launcher,
)
from executor.deps.protocol import CANDIDATE as CANDIDATE_TREE
from executor.deps.protocol import RUNNER as RUNNER_TREE
from executor.cases.runtime import Runtime
from executor.cases.runner_boot import SETTINGS as RUNNER_BOOT_SETTINGS
from executor.deps.shadowing import modules, shadowed
from executor.scratch import BUNDLE_NAME
from executor.transport.ustar import TOP, TOTAL_MAX_BYTES
from journal.errors import Refused
from journal.files import read_evidence
from launcher.protocol import MAX_OUTPUT_CAP
from steward.api import MIB, Limits, OpOutcome, Sealed
from steward.failure import SandboxFailure

CANDIDATE = "candidate"
SITE = "site"
RUNNER = "runner"
VERIFIER = "verifier"
SITE_PATH = f"/cap/{SITE}"
RUNNER_PATH = f"/cap/{RUNNER}"
# Where each tree's modules are, on the search path (executor/inside.py, "install").
SITE_MODULES = f"{SITE_PATH}/{MODULES_DIRECTORY}"
RUNNER_MODULES = f"{RUNNER_PATH}/{MODULES_DIRECTORY}"
EXTRACT_TIMEOUT_MS = 120_000
INSTALL_TIMEOUT_MS = 600_000
SITE_MAX_BYTES = 1024 * MIB
SITE_MAX_INODES = 65_536
REPORT_OUTPUT_BYTES = 2 * MIB
ENTRY_POINTS_MAX_BYTES = 64 * KIB
PYTEST_PLUGINS = "pytest11"
# Three ways the candidate's code could enter the runner's process, or another of the verifier's, without a test
# importing it (E7), each closed: pytest's plugin autoload and hypothesis's, each of which runs the entry points
# of every distribution on the search path, the candidate's among them; and the user site, which site reads in
# every interpreter started without -S from HOME, the case's writable /work, where the candidate's process could
# leave a .pth.
CASE_ENV = {
    **SANDBOX_ENV,
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    "HYPOTHESIS_NO_PLUGINS": "1",
    "PYTHONNOUSERSITE": "1",
}
# The runner's boot (executor/cases/runner_boot.py) is the runner tree's sitecustomize, so every interpreter of a
# pytest case that starts with site (a plugin's worker, the verifier's checker) runs it; the runner itself starts
# with -S and loads it by path. It makes the runner non-dumpable, puts its finder first (a module of the
# candidate's own projects is found only for an import by the verifier's code or the candidate's), checks that an
# interpreter started with site would load the same file, then runs pytest as ``python -m pytest`` would. Should
# a step fail it exits 3, pytest's own "internal error": never a status a case could pass or be blamed with (the
# evaluator reads it as an incomplete run).
RUNNER_BOOT_FILE = f"{RUNNER_MODULES}/{RUNNER_BOOT_NAME}"
RUNNER_BOOT = (
    "import importlib.util, runpy, sys\n"
    "try:\n"
    f"    spec = importlib.util.spec_from_file_location('casebox_runner_boot', {RUNNER_BOOT_FILE!r})\n"
    "    boot = importlib.util.module_from_spec(spec)\n"
    "    spec.loader.exec_module(boot)\n"
    "    boot.boot_runner()\n"
    "except Exception as error:\n"
    "    print(f'casebox: the runner could not boot: {error}', file=sys.stderr)\n"
    "    sys.exit(3)\n"
    "runpy.run_module('pytest', run_name='__main__', alter_sys=True)\n"
)


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
    """No case (or no pytest case) can start: the step that failed (a receipt's not_started.step) and why."""

    step: str
    sentence: str


@dataclasses.dataclass(frozen=True)
class Trees:
    """The sealed trees the cases run on: the candidate's, and the runner's with the pytest plugin modules the
    plan named; or why the cases (``blocked``) or only the pytest cases (``runner_blocked``) cannot run."""

    site: Sealed | None = None
    runner: Sealed | None = None
    plugins: tuple[str, ...] = ()
    # The top-level modules of the candidate's own projects, as the resolver listed them from the bundle's wheels.
    candidate_modules: tuple[str, ...] = ()
    blocked: Blocked | None = None
    runner_blocked: Blocked | None = None

    def blocking(self, case: Case) -> Blocked | None:
        if self.blocked is not None:
            return self.blocked
        return self.runner_blocked if case.op == "pytest" else None


@dataclasses.dataclass(frozen=True)
class CaseRun:
    """A case's receipt, and why its sandbox failed when it did (a blocked case's reason is the attempt's note)."""

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


def case_argv(interpreter: str, case: Case, report: str | None, plugins: Sequence[str] = ()) -> list[str]:
    """The plan's op, materialized (docs/plan.md): no shell, ``-S`` so nothing of the host's site-packages;
    a pytest case runs the runner's pytest through :data:`RUNNER_BOOT`, loading only the plan's plugins."""
    if case.op == "python-module":
        return [interpreter, "-S", "-m", *case.args]
    if case.op == "console-script":
        return [interpreter, "-S", f"{SITE_PATH}/bin/{case.args[0]}", *case.args[1:]]
    loads = [argument for module in plugins for argument in ("-p", module)]
    return [interpreter, "-S", "-c", RUNNER_BOOT, f"--junitxml={report}", *loads, *case.args]


def search_path(runtime: Runtime, case: Case) -> str:
    """E7: the standard library, then the runner (a pytest case), then the candidate; nothing can come before
    the standard library, because PYTHONPATH itself starts with it."""
    trees = [RUNNER_MODULES, SITE_MODULES] if case.op == "pytest" else [SITE_MODULES]
    return ":".join([*runtime.stdlib_path, *trees])


def case_env(runtime: Runtime, case: Case, verifier: str = f"/cap/{VERIFIER}", candidate_modules: Sequence[str] = ()) -> dict[str, str]:
    """The op's whole environment: the sandbox allowlist, the search path, the plan's allowlisted names, and for a
    pytest case the runner boot's settings: the verifier tree's path, the candidate tree's, the candidate's own
    top-level modules (executor/cases/runner_boot.py)."""
    bins = [f"{RUNNER_PATH}/bin"] if case.op == "pytest" else []
    env = {**CASE_ENV, "PATH": ":".join([*bins, f"{SITE_PATH}/bin", "/usr/bin", "/bin"]), "PYTHONPATH": search_path(runtime, case)}
    env.update(case.env)
    if case.op == "pytest":
        env[RUNNER_BOOT_SETTINGS] = "\n".join([verifier, f"{SITE_PATH}/", ",".join(sorted(candidate_modules))])
    return env


def case_limits(case: Case) -> Limits:
    caps = case.limits
    return Limits(tmp_bytes=caps.tmp_mb * MIB, memory_bytes=caps.memory_mb * MIB, processes=caps.pids)


def listing(directory_fd: int) -> list[str]:
    """A sealed tree's top-level names, each directory with a trailing ``/`` (read by name, never opened)."""
    with os.scandir(directory_fd) as entries:
        return sorted(entry.name + ("/" if entry.is_dir(follow_symlinks=False) else "") for entry in entries)


def open_modules(tree_fd: int) -> int:
    """The modules directory of a sealed tree (:data:`MODULES_DIRECTORY`), opened without following a link."""
    return os.open(MODULES_DIRECTORY, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=tree_fd)


def plugin_modules(modules_fd: int, names: Sequence[str], runner_modules: Sequence[str]) -> tuple[tuple[str, ...], str | None]:
    """The module each plugin the plan names loads from the runner (``modules_fd``, its modules directory): its
    ``pytest11`` entry point, or a top-level module of the runner. (modules, None), or ((), the first name the
    runner does not hold)."""
    entry_points: dict[str, str] = {}
    for name in listing(modules_fd):
        if not name.endswith(".dist-info/"):
            continue
        directory = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=modules_fd)
        try:
            data = read_evidence(directory, "entry_points.txt", ENTRY_POINTS_MAX_BYTES)
        except Refused:
            data = None
        finally:
            os.close(directory)
        if data is None or len(data) > ENTRY_POINTS_MAX_BYTES:
            continue
        parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
        try:
            parser.read_string(data.decode("utf-8"))
        except (configparser.Error, UnicodeDecodeError):
            continue
        if parser.has_section(PYTEST_PLUGINS):
            for key, value in parser.items(PYTEST_PLUGINS):
                entry_points.setdefault(key, value.split(":", 1)[0].strip())
    chosen = []
    for name in names:
        module = entry_points.get(name.lower(), name)
        if module.split(".", 1)[0] not in runner_modules:
            return (), name
        chosen.append(module)
    return tuple(chosen), None


class CaseService:
    """The case service of one session: it alone starts the candidate's sandboxes."""

    def __init__(
        self, gate: Gate, session, *, runtime: Runtime, plan: Plan, progress: Callable[[str], None],
        finished: Callable[[Case, Receipt], None] | None = None,
    ) -> None:
        self.starter = gate.starter(CASE_SERVICE, self)
        self.session = session
        self.runtime = runtime
        self.plan = plan
        self.progress = progress
        # Told of each case as soon as its receipt is stored (the progress lines of executor/cli/reporting.py).
        self.finished = finished
        opened = session.info()
        self.head = opened.head
        # How many case sandboxes are started ahead of their ops while the case before them runs.
        self.ahead = opened.ahead

    def __repr__(self) -> str:
        return CASE_SERVICE

    @property
    def verifier(self) -> str:
        """The verifier tree's capability name: the plan's mount name, else ``verifier`` (v1)."""
        return self.plan.mount or VERIFIER

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
            self.runtime.tools_interpreter, "-I", "-S", "-B", "-c", BOOT, "extract", f"/cap/bundle/{BUNDLE_NAME}", f"/out/{CANDIDATE}",
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

    def _install(self, what: str, output: str, wheels: list[str], read: list[str]) -> Sealed | str:
        """Exactly ``wheels`` installed into ``/out/OUTPUT``, compiled for where the cases mount it, and sealed;
        or why not."""
        self.progress(f"installing {what} in a sandbox")
        self.session.create_output(output, max_bytes=SITE_MAX_BYTES, max_inodes=SITE_MAX_INODES)
        argv = install_argv(self.runtime, output, wheels, runner=output == RUNNER)
        result = self._observe(
            self.starter.run_one(
                argv, read=["tools", *read], write=[output], limits=Limits(tmp_bytes=512 * MIB),
                env=SANDBOX_ENV, cwd="/work", timeout_ms=INSTALL_TIMEOUT_MS,
                stdout_cap=MAX_OUTPUT_CAP, stderr_cap=MAX_OUTPUT_CAP,
            )
        )
        problem = failure_of(result)
        if problem is not None:
            return f"the install of {what} failed: {problem}"
        try:
            return self.session.seal_output(output)
        except Refused as refusal:
            return f"the installed {what} cannot be sealed: {refusal.sentence()}"

    def _open_modules(self, output: str) -> int:
        fd = self.session.open_output(output)
        try:
            return open_modules(fd)
        finally:
            os.close(fd)

    def _listing(self, output: str) -> list[str]:
        fd = self._open_modules(output)
        try:
            return modules(listing(fd))
        finally:
            os.close(fd)

    def install(self, extraction: Extraction, dependencies: Dependencies, *, runner: bool) -> Trees:
        """The runner's tree (when a pytest case needs it) and the candidate's, each installed once and sealed."""
        sealed_runner, plugins, runner_blocked, runner_modules = None, (), None, ()
        if runner:
            installed = self._install("the runner", RUNNER, [f"/cap/{DEPS}/{file}" for file in dependencies.files(RUNNER_TREE)], [DEPS])
            if isinstance(installed, str):
                runner_blocked = Blocked(STEP_RUNNER, installed)
            else:
                sealed_runner, runner_modules = installed, self._listing(RUNNER)
                refusal = shadowed(candidate_modules=dependencies.modules, runner_modules=runner_modules)
                if refusal is not None:
                    return Trees(blocked=Blocked(*refusal))
                fd = self._open_modules(RUNNER)
                try:
                    plugins, missing = plugin_modules(fd, self.plan.plugins, runner_modules)
                finally:
                    os.close(fd)
                if missing is not None:
                    runner_blocked = Blocked(STEP_RUNNER, f"the plugin {missing} the plan names is not in the runner")
        wheels = [f"/cap/{CANDIDATE}/{TOP}/{wheel}" for wheel in extraction.wheels]
        wheels += [f"/cap/{DEPS}/{file}" for file in dependencies.files(CANDIDATE_TREE)]
        installed = self._install("the candidate and its dependencies", SITE, wheels, [CANDIDATE, DEPS])
        if isinstance(installed, str):
            return Trees(blocked=Blocked(STEP_INSTALL, installed))
        refusal = shadowed(candidate_modules={"the installed candidate tree": self._listing(SITE)}, stdlib_modules=self.runtime.stdlib_modules)
        if refusal is not None:
            return Trees(blocked=Blocked(*refusal))
        own = tuple(sorted({module for names in dependencies.modules.values() for module in names}))
        return Trees(site=installed, runner=sealed_runner, plugins=plugins, candidate_modules=own, runner_blocked=runner_blocked)

    # -- cases --------------------------------------------------------------------------------------

    def run_cases(self, cases: Sequence[tuple[int, Case]], binding: Binding, trees: Trees) -> list[CaseRun]:
        """Every applicable case of ``cases`` (plan index, case), each with its receipt; none stops the others (E6).

        Each case has a fresh sandbox of its own; the next ones (``ahead``) are started while a case's op
        runs, each with its own launcher, rendezvous, records and report output (docs/pipeline.md).
        """
        runnable = [(index, case) for index, case in cases if case.applicable and trees.blocking(case) is None]
        pipeline = _CasePipeline(self, runnable)
        runs = []
        for index, case in cases:
            if not case.applicable:
                continue
            blocked = trees.blocking(case)
            if blocked is not None:
                run, output = self._never_ran(case, binding, blocked.step, None), None
            else:
                run, output = self._run_case(case, binding, trees, pipeline)
            if output is not None:
                for name, data in output.files(binding.attempt_id, case.id).items():
                    self.session.publish(name, data)
            self.session.publish(run.receipt.name, run.receipt.canonical_bytes())
            runs.append(run)
            if self.finished is not None:
                self.finished(case, run.receipt)
        return runs

    def _never_ran(self, case: Case, binding: Binding, step: str, sentence: str | None) -> CaseRun:
        pytest = PytestEvidence(MISSING, None) if case.op == "pytest" else None
        return CaseRun(case.id, build_receipt(binding, case.id, None, never_started(step), pytest, self.head), sentence)

    def _case_start(self, index: int, case: Case) -> "_CaseStart":
        """What a case's sandbox is started with; its report output (a pytest case) is made here."""
        report = report_output(index) if case.op == "pytest" else None
        write = []
        if report is not None:
            self.session.create_output(report, max_bytes=max(REPORT_OUTPUT_BYTES, self.plan.junit.max_bytes + MIB), max_inodes=16)
            write.append(report)
        read = [SITE, self.verifier] + ([RUNNER] if case.op == "pytest" else [])
        return _CaseStart(report, read, write, case_limits(case))

    def _run_case(self, case: Case, binding: Binding, trees: Trees, pipeline: "_CasePipeline") -> tuple[CaseRun, CaseOutput | None]:
        start = pipeline.start_of(case)
        report = start.report
        argv = case_argv(self.runtime.interpreter, case, f"/out/{report}/{REPORT_NAME}" if report else None, trees.plugins)
        cwd = f"/cap/{VERIFIER}" if self.plan.mount is None else "/cap"
        output_cap = min(case.limits.output_kib * KIB, MAX_OUTPUT_CAP)
        result = self._observe(
            self.starter.run_one(
                argv, read=start.read, write=start.write, limits=start.limits, ahead=start.ahead,
                when_ready=pipeline.start_ahead, env=case_env(self.runtime, case, f"/cap/{self.verifier}", trees.candidate_modules), cwd=cwd,
                timeout_ms=case.timeout_ms, stdout_cap=output_cap, stderr_cap=output_cap,
            )
        )
        junit = None if report is None else self._junit(report)
        pytest = None if junit is None else junit.evidence
        if isinstance(result, LifecycleEvidence):
            return self._never_ran(case, binding, STEP_SANDBOX, result.reason), None
        process = ProcessIdentity(result.op_id, result.pid, result.starttime, result.pgid)
        outcome = outcome_from_launcher(result.observation)
        output = None if outcome.observed is None else CaseOutput.of(result.observation, None if junit is None else junit.data)
        receipt = build_receipt(binding, case.id, process, outcome, pytest, result.head, output, result.filter_digest)
        return CaseRun(case.id, receipt, None), output

    def _junit(self, report: str) -> Report:
        """E5: seal the case's own report output, then read the report as hostile data; only ever a downgrade."""
        try:
            self.session.seal_output(report)
        except Refused:
            return Report(PytestEvidence(REFUSED, None), None)
        fd = self.session.open_output(report)
        try:
            caps = self.plan.junit
            return report_from_directory(fd, cap=caps.max_bytes, max_testcases=caps.max_testcases)
        finally:
            os.close(fd)


@dataclasses.dataclass
class _CaseStart:
    """One case's sandbox request, and the sandbox started ahead for it, if any."""

    report: str | None
    read: list[str]
    write: list[str]
    limits: Limits
    ahead: Ahead | None = None


class _CasePipeline:
    """The runnable cases in plan order; each case's sandbox is started ahead while an earlier case's op runs,
    at most ``service.ahead`` at once. Every case still gets a sandbox of its own, and a case's receipt
    binds only its own op (E2, E6); one never taken is closed with the session (C9)."""

    def __init__(self, service: CaseService, runnable: list[tuple[int, Case]]) -> None:
        self.service = service
        self.upcoming = collections.deque(runnable)
        self.started: dict[str, _CaseStart] = {}

    def start_of(self, case: Case) -> _CaseStart:
        """The case's sandbox request: started ahead for it, or made now (the case is the next runnable one)."""
        if case.id in self.started:
            return self.started.pop(case.id)
        index, _ = self.upcoming.popleft()
        return self.service._case_start(index, case)

    def start_ahead(self) -> None:
        """While a case's sandbox is READY and its op not yet sent: start the next cases' sandboxes ahead."""
        while len(self.started) < self.service.ahead and self.upcoming:
            index, case = self.upcoming[0]
            try:
                start = self.service._case_start(index, case)
            except SandboxFailure:
                return  # the case's own start meets it again, where its receipt can say so
            self.upcoming.popleft()
            ahead = self.service.starter.start_ahead(read=start.read, write=start.write, limits=start.limits)
            if isinstance(ahead, StartFailed):
                ahead.close(self.service)  # the case gets a fresh start when it runs
            else:
                start.ahead = ahead
            self.started[case.id] = start
