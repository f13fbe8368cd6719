"""One verification attempt, end to end: ``casebox verify`` and ``casebox demo`` (docs/pipeline.md).

1. **preflight** (trusted, data only): the plan, the shard, every path inside
   its perimeter (F3), the verifier tree and the index through F4, the
   bundle copied privately and then sized and hashed (T3);
2. **extract** in a sandbox, then seal; the candidate identity digest is
   recomputed from the sealed files;
3. **resolve** and fetch in the dependency preparer's sandboxes, then seal;
4. **install** once, then **the cases**, one sandbox each, a receipt each (E6);
5. **cleanup and retirement**: the session closes, proving every process and
   mount gone, retires the stage into a sealed tombstone and exports the
   journal, the seal marker and the receipts into the evidence directory;
6. **evaluate** that directory, exactly as an unprivileged ``casebox
   evaluate`` would.

The session is the daemon's when its socket answers, else an embedded
steward's (executor/cli/sessions.py); an explicit ``--state-root`` always runs
the steward embedded. A failure after the session opened abandons it, which
still cleans up and retires the stage, and then re-raises. A failure of the
steward or its host (its state root full, the daemon stopping) ends the
attempt with the steward's own sentence (exit 70). An interrupt (Ctrl-C, or
SIGTERM, which the command treats as one) goes the same way out, so the
private scratch directory is removed on every path but SIGKILL; what a
SIGKILL leaves there the next verification removes first
(executor/scratch.py).
"""

from __future__ import annotations

import dataclasses
import errno
import importlib.util
import os
import sys

import executor
from executor.cases import runtime as runtimes
from executor.cli import sessions
from executor.capability import open_capability
from executor.cases.service import CANDIDATE, RUNNER, SITE, VERIFIER, Blocked, CaseRun, CaseService, Trees, check_materializable
from executor.cli.config import Config
from executor.evidence.evaluate import Expected, Report, evaluate
from executor.cli.frontend import InternalFailure, is_interrupt
from executor.inputs import read_capped
from executor.inside import LIBRARIES, modules
from executor.cases.ownership import CASE_SERVICE, PREPARER, DirectoryCapability, Gate
from executor.plan import PLAN_MAX_BYTES, Case, Plan, plan_from_bytes
from executor.deps.preparer import DEPS, Preparer, Unresolved
from executor.evidence.receipts import Binding, dependency_step
from executor.cli.reporting import Progress
from executor.shard import cases_for_shard
from executor.scratch import Scratch, remove_abandoned
from journal.errors import Refused
from journal.format import RESERVE_START
from steward.api import RUNTIME_CHANGED
from steward.failure import SandboxFailure

# A stage's journal holds RESERVE_START bytes before the retirement reserve (J2). Measured on the demo
# (docs/pipeline.md, "The journal budget"): one case sandbox with its junit output costs 6,592 bytes
# with a 15-byte state root and the 19-byte /usr/bin/python3.11, and everything else (genesis,
# extraction, resolution, fetch, install, their outputs, a helper attempt, cleanup evidence) 28,528.
# Output mount records name their target under the state root: 4 per case and 12 in all grow by a
# byte per byte of its path; the interpreter's mount records name its path: 2 per sandbox, so 2 per
# case and 10 in all. The constants add margin for longer pids and start times, more helper
# attempts, and twice the fixed growth.
CASE_JOURNAL_BYTES = 7_008
FIXED_JOURNAL_BYTES = 32_768


def cases_per_stage(state_root: str, interpreter: str) -> int:
    """How many applicable cases one stage's journal has room for with this state root and case interpreter."""
    root, path = len(state_root.encode("utf-8")), len(interpreter.encode("utf-8"))
    return (RESERVE_START - FIXED_JOURNAL_BYTES - 24 * root - 10 * path) // (CASE_JOURNAL_BYTES + 4 * root + 2 * path)


@dataclasses.dataclass(frozen=True)
class Attempt:
    """What one ``verify`` is asked to do; every path already resolved inside its perimeter."""

    bundle: str
    sha256: str
    plan: str
    verifier_tree: str
    attempt_id: str
    evidence: str
    index: str | None = None
    shard: tuple[int, int] | None = None
    attempt_number: int = 1
    index_url: str | None = None
    installer: str | None = None
    python: str | None = None
    # How many stages run at once (verify --jobs); the caller checked it against the sandbox pool.
    jobs: int = 1


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage of an attempt: its evidence directory and its sealed tombstone."""

    evidence: str
    tombstone: str


@dataclasses.dataclass(frozen=True)
class Verified:
    """The end of an attempt: the report, the evidence directory and every stage, the cases' runs and any notes.

    With one stage ``evidence`` is that stage's evidence directory; with more it holds one directory per stage."""

    report: Report
    evidence: str
    stages: tuple[Stage, ...]
    runs: tuple[CaseRun, ...]
    notes: tuple[str, ...]
    steward: str
    runtime: str = ""

    @property
    def tombstone(self) -> str | None:
        """The one stage's tombstone; None when the attempt ran as several stages (each has its own)."""
        return self.stages[0].tombstone if len(self.stages) == 1 else None


def preparation_phases(started) -> tuple[tuple[str, str], ...]:
    """(phase, sandbox) of every sandbox the gate saw start that prepared what the cases run on: the receipts
    carry them, so a reviewer's replay can name each sandbox (docs/receipts.md, ``phases``)."""
    phases = []
    for role, sandbox, _, write in started:
        if role == PREPARER:
            phases.append(("fetch" if DEPS in write else "resolve", sandbox))
        elif role == CASE_SERVICE and (CANDIDATE in write or SITE in write or RUNNER in write):
            phases.append(("extract" if CANDIDATE in write else "install", sandbox))
    return tuple(phases)


def load_plan(path: str) -> Plan:
    try:
        plan = plan_from_bytes(read_capped(path, PLAN_MAX_BYTES))
    except Refused as refusal:
        raise refusal.under(path) from None
    check_materializable(plan)
    return plan


def attempt_cases(plan: Plan, shard: tuple[int, int] | None) -> list[tuple[int, Case]]:
    """(plan index, case) of every case this attempt runs: the plan's, or its shard's."""
    chosen = plan.cases if shard is None else cases_for_shard(plan, *shard)
    return [(plan.cases.index(case), case) for case in chosen]


def split_stages(cases: list[tuple[int, Case]], jobs: int, state_root: str, interpreter: str) -> list[list[tuple[int, Case]]]:
    """The attempt's cases as stages, one session each (verify --jobs): the fewest stages, at least ``jobs``
    (never more than there are cases), such that no stage holds more applicable cases than its journal has
    room for (J2). Case k of the attempt goes to stage k mod s + 1, the rule a shard uses (executor/shard.py)."""
    room = cases_per_stage(state_root, interpreter)
    count = max(1, min(jobs, len(cases)))
    while True:
        stages = [cases[index::count] for index in range(count)]
        if count >= len(cases) or all(sum(1 for _, case in stage if case.applicable) <= room for stage in stages):
            return stages
        count += 1


def _tool_sources() -> list[tuple[str, str]]:
    """Each file of the tools capability: its path there, and where casebox's installation keeps it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(executor.__file__)))
    sources = [(relative, os.path.join(root, relative)) for relative in modules()]
    for library in LIBRARIES:
        spec = importlib.util.find_spec(library)
        if spec is None or spec.origin is None:
            raise InternalFailure(f"the {library} library is not installed beside casebox; reinstall casebox (scripts/bootstrap).")
        package = os.path.dirname(spec.origin)
        for directory, _, names in os.walk(package):
            for name in sorted(names):
                if name.endswith(".py"):
                    path = os.path.join(directory, name)
                    sources.append((os.path.join(library, os.path.relpath(path, package)), path))
    return sources


def _tools() -> dict[str, bytes]:
    """casebox's own sandboxed modules, exactly the files they import, and the libraries they use
    (executor/inside.py), each with the installation's checked bytecode where it has some for that source."""
    files = {}
    for relative, path in _tool_sources():
        with open(path, "rb") as file:
            files[relative] = source = file.read()
        bytecode = _installed_bytecode(path, source)
        if bytecode is not None:
            # Not cache_from_source: under a pycache_prefix it names a path outside the capability.
            directory, name = os.path.split(relative)
            files[os.path.join(directory, "__pycache__", f"{name[:-3]}.{sys.implementation.cache_tag}.pyc")] = bytecode
    return files


# The .pyc flags word of PEP 552: bit 0, hash-based; bit 1, checked against the source on every import.
CHECKED_HASH_FLAGS = 0b11


def _installed_bytecode(path: str, source: bytes) -> bytes | None:
    """The .pyc casebox's installation keeps for ``path`` when it is checked-hash bytecode of exactly ``source``
    for this interpreter; None for none, for a timestamp or unchecked one, and for a stale one.

    The tools capability is read-only, so a tool op compiles every module
    that has no bytecode there, some 30 ms of each extract, resolve, fetch
    and install op (docs/pipeline.md, "Bytecode for the tools"). Only
    checked-hash bytecode is taken: the op's interpreter hashes the source
    beside it on import and compiles that source when they differ, so a
    stale .pyc never runs; one of another version finds none under its own
    cache tag, or refuses the magic number, and compiles from source.
    """
    try:
        with open(importlib.util.cache_from_source(path), "rb") as file:
            bytecode = file.read()
    except OSError:
        return None
    header = importlib.util.MAGIC_NUMBER + CHECKED_HASH_FLAGS.to_bytes(4, "little") + importlib.util.source_hash(source)
    return bytecode if bytecode[:len(header)] == header else None


def compile_tools() -> None:
    """Compile every file of the tools capability to checked-hash bytecode where casebox's installation keeps
    it, for :func:`_tools` to find (scripts/bootstrap and scripts/install run this once)."""
    import py_compile

    for _, path in _tool_sources():
        py_compile.compile(path, doraise=True, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)


def _evidence_directory(path: str) -> tuple[int, bool]:
    """The empty evidence directory at ``path`` (created when absent): its descriptor, and whether it was made.

    ``path`` was resolved inside its perimeter (F3) with no symlink in it; root
    walks it again one descriptor at a time without following any link, so a
    directory swapped for a link after that check is refused, never followed.
    """
    parts = [part for part in path.split("/") if part]
    if not path.startswith("/") or not parts or any(part in (".", "..") for part in parts):
        raise Refused(path, "must be a resolved absolute path")
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    parent = os.open("/", flags)
    try:
        for part in parts[:-1]:
            try:
                child = os.open(part, flags, dir_fd=parent)
            except OSError as error:
                raise Refused(path, f"changed after it was resolved: {part} cannot be opened without following a link ({os.strerror(error.errno)})") from None
            os.close(parent)
            parent = child
        made = True
        try:
            os.mkdir(parts[-1], 0o755, dir_fd=parent)
        except FileExistsError:
            made = False
        except OSError as error:
            raise Refused(path, f"cannot be created as the evidence directory ({os.strerror(error.errno)})") from None
        try:
            fd = os.open(parts[-1], flags, dir_fd=parent)
        except OSError as error:
            if error.errno in (errno.ELOOP, errno.ENOTDIR):
                raise Refused(path, "is not a directory; the evidence directory must be a directory or absent") from None
            raise
    finally:
        os.close(parent)
    if os.listdir(fd):
        os.close(fd)
        raise Refused(path, "is not empty; an evidence directory holds exactly one stage's evidence")
    return fd, made


def stage_evidence(evidence: str, count: int) -> list[str]:
    """Where each stage's evidence goes: ``evidence`` itself for one stage, else ``evidence/stage-i`` (1 to count)."""
    return [evidence] if count == 1 else [os.path.join(evidence, f"stage-{index}") for index in range(1, count + 1)]


def run_attempt(config: Config, request: Attempt, *, progress: Progress, embedded: bool = False) -> Verified:
    """Run the attempt; refusals (exit 64) come before anything is written. ``embedded``: never the daemon."""
    for path in remove_abandoned():
        progress(f"removed {path}: a verification that was killed left it")
    plan = load_plan(request.plan)
    cases = attempt_cases(plan, request.shard)
    progress.expect([case for _, case in cases])
    capabilities: list[DirectoryCapability] = []
    scratch = Scratch()
    index_fd = None
    try:
        verifier = open_capability(request.verifier_tree, state_root=config.state_root)
        capabilities.append(DirectoryCapability(plan.mount or VERIFIER, verifier))
        if request.index is not None:
            index = open_capability(request.index, state_root=config.state_root)
            capabilities.append(DirectoryCapability("index", index))
            index_fd = os.dup(index)
        capabilities.append(scratch.bundle(request.bundle, request.sha256))
        runtime = runtimes.inspect(request.installer, request.python)
        stages = split_stages(cases, request.jobs, config.state_root, runtime.interpreter)
        if runtime.prefix is not None:
            # F4, then every sandbox sees it read-only at the path it has here (docs/pipeline.md, "The runtime").
            prefix = open_capability(runtime.prefix, state_root=config.state_root)
            capabilities.append(DirectoryCapability(runtimes.CAPABILITY, prefix, mount=runtime.prefix))
        if len(stages) == 1:
            capabilities.append(scratch.directory("tools", _tools()))
        paths = stage_evidence(request.evidence, len(stages))
        made: list[str] = []
        evidence_fds: list[int] = []
        try:
            if len(stages) > 1:
                parent_fd, parent_made = _evidence_directory(request.evidence)
                os.close(parent_fd)
                made += [request.evidence] if parent_made else []
            for path in paths:
                fd, was_made = _evidence_directory(path)
                evidence_fds.append(fd)
                made += [path] if was_made else []
            # Only now: a refusal above is the one sentence on stderr (F1), with no progress line before it.
            progress("preflight passed: the bundle copied privately and hashed, the evidence directory empty")
            if len(stages) > 1:
                progress(f"running the attempt as {len(stages)} stages, {min(request.jobs, len(stages))} at once, "
                         f"each with its own session, sandbox uid, journal, tombstone and evidence in {request.evidence}")
            return _stages(config, request, plan, cases, stages, capabilities, scratch, runtime, index_fd, paths,
                           evidence_fds, progress, embedded)
        except BaseException as error:
            # What this attempt made and left empty goes again, deepest first.
            for path in reversed(made):
                try:
                    os.rmdir(path)
                except OSError:
                    pass
            if isinstance(error, SandboxFailure):
                raise InternalFailure(str(error)) from None
            raise
        finally:
            for fd in evidence_fds:
                os.close(fd)
    finally:
        for capability in capabilities:
            if capability.state == "open":
                capability.close()
        if index_fd is not None:
            os.close(index_fd)
        scratch.close()


def _stages(config, request, plan, cases, stages, capabilities, scratch, runtime, index_fd, paths, evidence_fds,
            progress, embedded) -> Verified:
    """Every stage (one session each, at most ``request.jobs`` at once), then one evaluation of all their evidence."""
    if len(stages) == 1:
        ran = [_attempt(config, request, plan, stages[0], capabilities, scratch, runtime, index_fd, evidence_fds[0], progress, embedded)]
    else:
        ran = _parallel(config, request, plan, stages, capabilities, runtime, index_fd, evidence_fds, progress, embedded)
    progress("evaluating the evidence")
    # One rule for one stage and for many: evaluate folds every stage's receipts, each checked against its own
    # sealed journal; a stage whose evidence is missing or forged leaves its cases UNVERIFIED.
    judged = frozenset(case.id for _, case in cases)
    expected = Expected(plan, request.attempt_id, request.sha256, request.attempt_number, judged)
    report = evaluate(expected, paths)
    progress.judged(report)
    return Verified(
        report, request.evidence, tuple(Stage(path, closed.tombstone) for path, (closed, _, _, _) in zip(paths, ran)),
        tuple(run for _, runs, _, _ in ran for run in runs), tuple(note for _, _, notes, _ in ran for note in notes),
        ran[0][3], runtime.label,
    )


def _parallel(config, request, plan, stages, capabilities, runtime, index_fd, evidence_fds, progress, embedded) -> list:
    """The stages on worker threads, each with copies of the shared capabilities and a scratch directory of its own.

    Every stage runs to its end (closed, or abandoned on its own failure) before the first failure is raised,
    so no session is left open. An interrupt halts every open session's ops; each stage then ends as interrupted
    (its halted ops' receipts are never exported as a closed stage's)."""
    import concurrent.futures
    import threading

    sessions_open: list = []
    interrupted = threading.Event()

    def opened(session) -> None:
        sessions_open.append(session)
        # A session opened while the main thread halts the others: the interrupt is set before their halt, so
        # either that halt sees this session or this check sees the interrupt.
        if interrupted.is_set():
            session.halt()

    def one(index: int):
        own = Scratch()
        try:
            copies = [capability.copy() for capability in capabilities]
            try:
                copies.append(own.directory("tools", _tools()))
                return _attempt(config, request, plan, stages[index], copies, own, runtime, index_fd, evidence_fds[index],
                                progress, embedded, opened=opened, label=f"stage {index + 1}/{len(stages)}: ",
                                interrupted=interrupted)
            finally:
                for copy in copies:
                    if copy.state == "open":
                        copy.close()
        finally:
            own.close()

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(request.jobs, len(stages))) as pool:
        futures = [pool.submit(one, index) for index in range(len(stages))]
        try:
            concurrent.futures.wait(futures)
        except BaseException:
            for future in futures:
                future.cancel()
            interrupted.set()
            for session in list(sessions_open):
                session.halt()
            concurrent.futures.wait(futures)
            raise
    failures = [future.exception() for future in futures if future.exception() is not None]
    if failures:
        raise failures[0]
    return [future.result() for future in futures]


def _attempt(config, request, plan, cases, capabilities, scratch, runtime, index_fd, evidence_fd, progress, embedded,
             *, opened=None, label: str = "", interrupted=None):
    """One stage: its session, its cases, its close and export; (closed, runs, notes, steward)."""
    def say(line: str) -> None:
        progress(label + line)

    say(f"opening a session for attempt {request.attempt_id}")
    session = sessions.open_session(config, request.attempt_id, embedded=embedded)
    if opened is not None:
        opened(session)
    steward = sessions.steward_of(session, config)
    say(f"steward: {steward}")
    closing = False
    try:
        for capability in capabilities:
            capability.hand_to(session)
        # E7: every process of a sandbox that runs the case interpreter is non-dumpable, since the dedicated UID
        # may only execute the copy mounted over its path, never read it.
        session.set_interpreter(os.open(runtime.interpreter, os.O_RDONLY | os.O_CLOEXEC), runtime.interpreter)
        gate = Gate(session, always=runtime.capabilities)
        service = CaseService(gate, session, runtime=runtime, plan=plan, progress=say, finished=progress.finished)
        preparer = Preparer(
            gate, session, scratch=scratch, runtime=runtime, index_fd=index_fd, index_url=request.index_url, progress=say,
        )
        runs, notes = _cases(session, gate, service, preparer, request, plan, cases, runtime)
        if preparer.networked:
            notes.append(
                f"the index network (the steward's forwarder to {request.index_url} and its file hosts, nothing else) "
                f"was given to the resolver and fetch sandboxes only ({', '.join(preparer.networked)})"
            )
        if interrupted is not None and interrupted.is_set():
            # The interrupt reached the main thread, and this stage's ops were halted (killed): they are not cases
            # that failed, so the stage ends as the interrupted session it is, not CLOSED with their receipts.
            raise KeyboardInterrupt
        say("cleanup and retirement")
        closing = True
        changed = runtime.changed()
        if changed is None:
            closed = session.close(evidence_fd)
        else:
            # Its receipts name the runtime as it was: the stage retires without exporting them.
            notes.append(f"{changed}; the stage is ended as RUNTIME_CHANGED and its receipts are not exported, so no case is judged")
            closed = session.end(RUNTIME_CHANGED)
    except BaseException as error:
        if not closing:
            # Clean up and retire all the same, then report what went wrong: INTERRUPTED for Ctrl-C or
            # SIGTERM (a daemon's session has no such call and is abandoned), SESSION_ABANDONED otherwise.
            interrupt = getattr(session, "interrupt", None) if is_interrupt(error) else None
            try:
                (interrupt or session.abandon)()
            except Exception:
                pass
        raise
    return closed, runs, [label + note for note in notes], steward


def _cases(session, gate, service, preparer, request, plan, cases, runtime) -> tuple[list[CaseRun], list[str]]:
    extraction = service.extract()
    if isinstance(extraction, Blocked):
        return [], [f"{extraction.sentence}; no case can run, so none has a receipt"]
    notes = []
    # The runner is installed only for an attempt that runs a pytest case: no other op imports it.
    runner = any(case.op == "pytest" and case.applicable for _, case in cases)
    dependencies = preparer.prepare(plan_digest=plan.digest, runner=plan.runner if runner else (), candidate=extraction.projects)
    if isinstance(dependencies, Unresolved):
        notes.append(f"dependencies unresolved ({dependencies.code}): {dependencies.sentence}")
        trees = Trees(blocked=Blocked(dependency_step(dependencies.code), dependencies.sentence))
        if dependencies.sealed is None:
            return [], notes + ["the dependency output could not be sealed, so no receipt can name its digest"]
    else:
        trees = service.install(extraction, dependencies, runner=runner)
        for blocked in (trees.blocked, trees.runner_blocked):
            if blocked is not None:
                notes.append(f"{blocked.step}: {blocked.sentence}")
    binding = Binding(
        attempt_id=request.attempt_id,
        attempt_number=request.attempt_number,
        plan_digest=plan.digest,
        candidate_digest=extraction.candidate_digest,
        bundle_sha256=request.sha256,
        dependency_inventory_digest=dependencies.sealed.inventory_digest,
        runtime_inventory_digest=runtime.digest,
        runtime_version=f"{runtime.implementation} {runtime.version}",
        runner_inventory_digest=None if trees.runner is None else trees.runner.inventory_digest,
        stage_id=session.info().stage_id,
        phases=preparation_phases(gate.started),
    )
    applicable = sum(1 for _, case in cases if case.applicable)
    service.progress(f"running {applicable} applicable cases of {len(cases)}, each in a sandbox of its own")
    runs = service.run_cases(cases, binding, trees)
    notes += [f"case {run.case_id}: {run.sentence}" for run in runs if run.sentence]
    return runs, notes
