"""Case receipts: closed canonical JSON, one per case, written on the trusted side (DESIGN E1, E4; docs/receipts.md).

A receipt records what the launcher observed of one case's op, bound to the
attempt, the plan, the candidate, the bundle, the dependency and runtime
inventories, the stage, the syscall filter the op ran under and the journal
head at the moment it was written.
It also binds, by SHA-256 and size, the case's output files published
beside it (its stdout and stderr, each capped to its first and last 64 KiB,
and its junit report), and names the casebox version that wrote it.
:func:`build_receipt` makes one from the observation; :func:`receipt_from_bytes`
reads one back strictly, refusing any field it does not know, any missing
field, any wrong type and any encoding but the canonical one. The steward
session stores each one create-once under :attr:`Receipt.name` (E4).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

from executor import VERSION
from executor.evidence.junit import READ, REPORT_STATES, JunitCounts, PytestEvidence
from executor.plan import CASE_ID
from journal.closed import SHA256_HEX, ClosedObject, check_digest, check_str
from journal.format import ID, MAX_COUNT, MAX_PID, is_terminated_status, pop_id
from journal.strictjson import MAX_SAFE_INTEGER, StrictJSONError, canonical, child_path, loads
from launcher import vocabulary

SCHEMA = "casebox.receipt.v3"
SUFFIX = ".receipt.json"
# A casebox version as receipts and reports name it (executor.VERSION).
VERSION_PATTERN = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,31}\Z")
RECEIPT_MAX_BYTES = 16_384
MAX_ATTEMPT_NUMBER = 1_000_000
MAX_TEST_COUNT = 1_000_000
NOT_STARTED = "NOT_STARTED"
# The not_started.step of a case that never had a process (docs/receipts.md): the
# dependencies could not be resolved, the install failed, the runner could not be
# prepared (a pytest case), or its sandbox failed. A dependency failure with a
# reason of its own is recorded under that reason's code (DEPENDENCY_STEPS).
STEP_DEPENDENCIES = "dependencies"
STEP_INSTALL = "install"
STEP_RUNNER = "runner"
STEP_SANDBOX = "sandbox"
DEPENDENCY_STEPS = (
    "conflict", "candidate_conflict", "no_match", "direct_url", "candidate_shadows_runner", "candidate_shadows_stdlib",
)
STEPS = (STEP_DEPENDENCIES, STEP_INSTALL, STEP_RUNNER, STEP_SANDBOX, *DEPENDENCY_STEPS)
# The limit classes of docs/launcher.md (S10), then the class of an op that never reached exec.
LIMIT_CLASSES = (*vocabulary.CLASSES, NOT_STARTED)
# How the journal records a case op (journal/format.py's closed sets): the role
# of its PROCESS_INTENT and the reaper of its PROCESS_TERMINAL. The op is a
# descendant of the sandbox's pid 1, the launcher, which reaps it. The case
# service records ops this way and the evaluator checks exactly this pair.
OP_ROLE = "descendant"
OP_REAPER = "launcher"
# A case's published output files (docs/receipts.md, "Published output"): its stdout and stderr, each kept
# whole up to twice OUTPUT_EDGE_BYTES and otherwise as its first and last OUTPUT_EDGE_BYTES, and its junit
# report whole when it is at most PUBLISHED_JUNIT_MAX_BYTES (base64-encoded, it fits one steward message).
OUTPUT_EDGE_BYTES = 64 * 1024
PUBLISHED_JUNIT_MAX_BYTES = 512 * 1024
OUTPUTS = {"stdout": ".stdout", "stderr": ".stderr", "junit": ".junit.xml"}
OUTPUT_MAX_BYTES = {"stdout": 2 * OUTPUT_EDGE_BYTES, "stderr": 2 * OUTPUT_EDGE_BYTES, "junit": PUBLISHED_JUNIT_MAX_BYTES}
# The sandboxes that prepared what every case of a stage ran on, by phase (a case's own sandbox is the one
# its process op id names).
PHASES = ("extract", "resolve", "fetch", "install")
MAX_PHASES = 16
RUNTIME_VERSION = re.compile(r"[a-z]{1,16} [0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\Z")
# S12: the SHA-256 of every syscall filter program this casebox ships, of every machine.
SHIPPED_FILTER_DIGESTS = frozenset().union(*vocabulary.SHIPPED_DIGESTS.values())


@dataclasses.dataclass(frozen=True)
class Binding:
    """What every receipt of one stage shares: the attempt, its inputs and the stage."""

    attempt_id: str
    attempt_number: int
    plan_digest: str
    candidate_digest: str
    bundle_sha256: str
    dependency_inventory_digest: str
    runtime_inventory_digest: str
    # What the case runtime is, as its inventory names it: ``cpython 3.12.1`` (for display; bound like the rest).
    runtime_version: str
    # The sealed runner tree the case's search path held (E7); None for an attempt with no pytest case.
    runner_inventory_digest: str | None
    stage_id: str
    # (phase, sandbox) of each preparing sandbox, in the order they started.
    phases: tuple[tuple[str, str], ...] = ()

    def as_dict(self) -> dict:
        value = dataclasses.asdict(self)
        value["phases"] = [{"phase": phase, "sandbox": sandbox} for phase, sandbox in self.phases]
        return value


def dependency_step(code: str) -> str:
    """The not_started.step of the cases of an attempt whose dependencies failed with ``code``."""
    return code if code in DEPENDENCY_STEPS else STEP_DEPENDENCIES


@dataclasses.dataclass(frozen=True)
class ProcessIdentity:
    """The op's process as its PROCESS_INTENT recorded it (C1)."""

    op_id: str
    pid: int
    starttime: int
    pgid: int


@dataclasses.dataclass(frozen=True)
class Stream:
    """A captured output stream: the SHA-256 and length of the bytes kept, and whether the cap cut it."""

    sha256: str
    bytes: int
    truncated: bool

    @classmethod
    def of(cls, data: bytes, truncated: bool) -> "Stream":
        return cls(hashlib.sha256(data).hexdigest(), len(data), truncated)


@dataclasses.dataclass(frozen=True)
class Observed:
    """What pid 1 and the cgroup measured of an op that ran."""

    wall_ms: int
    cpu_ms: int
    max_rss_kib: int
    # The ops cgroup's memory high-water mark over the op; None where the kernel keeps none (docs/receipts.md).
    memory_peak_bytes: int | None
    stdout: Stream
    stderr: Stream


@dataclasses.dataclass(frozen=True)
class NotStarted:
    """An op that never reached exec: the step that failed and its errno (0 when there was none)."""

    step: str
    errno: int


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How an op ended, in the receipt's terms."""

    limit: str
    wait_status: int | None
    descendants_reaped: int | None
    observed: Observed | None
    not_started: NotStarted | None


def outcome_from_launcher(observation: object) -> Outcome:
    """The one mapping from the starter's observation (``steward.starter.OpResult`` or ``OpNotStarted``).

    An ``OpNotStarted`` (it has ``step``) is an op child that failed before
    exec: it was forked, so it has a wait status, but no exit code of its own.
    """
    if hasattr(observation, "step"):
        return Outcome(
            NOT_STARTED,
            observation.wait_status,
            observation.descendants_reaped,
            None,
            NotStarted(observation.step, observation.errno),
        )
    observed = Observed(
        wall_ms=observation.wall_ms,
        cpu_ms=observation.cpu_ms,
        max_rss_kib=observation.max_rss_kib,
        memory_peak_bytes=observation.memory_peak_bytes,
        stdout=Stream.of(observation.stdout, observation.stdout_truncated),
        stderr=Stream.of(observation.stderr, observation.stderr_truncated),
    )
    return Outcome(observation.limit, observation.wait_status, observation.descendants_reaped, observed, None)


def kept_output(data: bytes) -> bytes:
    """The part of a captured stream that is published: all of it, or its first and last OUTPUT_EDGE_BYTES."""
    if len(data) <= 2 * OUTPUT_EDGE_BYTES:
        return data
    return data[:OUTPUT_EDGE_BYTES] + data[-OUTPUT_EDGE_BYTES:]


@dataclasses.dataclass(frozen=True)
class Bound:
    """A published file as its receipt binds it: the SHA-256 and the size of its bytes."""

    sha256: str
    bytes: int

    @classmethod
    def of(cls, data: bytes) -> "Bound":
        return cls(hashlib.sha256(data).hexdigest(), len(data))


@dataclasses.dataclass(frozen=True)
class Published:
    """The bindings of a case's published output files; ``junit`` only for a pytest report kept whole."""

    stdout: Bound
    stderr: Bound
    junit: Bound | None

    def as_dict(self) -> dict:
        return {
            "stdout": dataclasses.asdict(self.stdout),
            "stderr": dataclasses.asdict(self.stderr),
            "junit": None if self.junit is None else dataclasses.asdict(self.junit),
        }


@dataclasses.dataclass(frozen=True)
class CaseOutput:
    """The bytes a case publishes beside its receipt."""

    stdout: bytes
    stderr: bytes
    junit: bytes | None = None

    @classmethod
    def of(cls, observation: object, junit: bytes | None) -> "CaseOutput":
        """From the starter's ``OpResult``: each stream as :func:`kept_output` keeps it; the report when it is
        small enough to publish."""
        kept = junit if junit is not None and len(junit) <= PUBLISHED_JUNIT_MAX_BYTES else None
        return cls(kept_output(observation.stdout), kept_output(observation.stderr), kept)

    def bound(self) -> Published:
        return Published(Bound.of(self.stdout), Bound.of(self.stderr), None if self.junit is None else Bound.of(self.junit))

    def files(self, attempt_id: str, case_id: str) -> dict[str, bytes]:
        """Each published file's evidence name and bytes."""
        files = {output_name(attempt_id, case_id, "stdout"): self.stdout, output_name(attempt_id, case_id, "stderr"): self.stderr}
        if self.junit is not None:
            files[output_name(attempt_id, case_id, "junit")] = self.junit
        return files


def output_name(attempt_id: str, case_id: str, kind: str) -> str:
    """``ATTEMPT.CASE.stdout``, ``ATTEMPT.CASE.stderr`` or ``ATTEMPT.CASE.junit.xml``."""
    return f"{attempt_id}.{case_id}{OUTPUTS[kind]}"


def output_name_parts(name: str) -> tuple[str, str, str] | None:
    """(attempt id, case id, kind) of a published output's file name, or None for any other name."""
    for kind, suffix in OUTPUTS.items():
        if name.endswith(suffix):
            parts = name_parts(name[: -len(suffix)] + SUFFIX)
            return None if parts is None else (*parts, kind)
    return None


def never_started(step: str) -> Outcome:
    """The outcome of a case whose op never had a process (its sandbox or its install failed at ``step``)."""
    return Outcome(NOT_STARTED, None, None, None, NotStarted(step, 0))


@dataclasses.dataclass(frozen=True)
class Receipt:
    binding: Binding
    case_id: str
    process: ProcessIdentity | None
    outcome: Outcome
    pytest: PytestEvidence | None
    journal_head: str
    published: Published | None = None
    casebox_version: str = VERSION
    # The syscall filter the op's sandbox proved at READY (S12); null when the case had no process.
    filter_digest: str | None = None

    @property
    def name(self) -> str:
        return receipt_name(self.binding.attempt_id, self.case_id)

    @property
    def exit_code(self) -> int | None:
        status = self.outcome.wait_status
        if status is None or self.outcome.limit == NOT_STARTED or status & 0x7F:
            return None
        return status >> 8

    def as_dict(self) -> dict:
        outcome = self.outcome
        value = {"schema": SCHEMA, "casebox_version": self.casebox_version, **self.binding.as_dict()}
        value.update(
            case_id=self.case_id,
            process=None if self.process is None else dataclasses.asdict(self.process),
            wait_status=outcome.wait_status,
            descendants_reaped=outcome.descendants_reaped,
            limit=outcome.limit,
            not_started=None if outcome.not_started is None else dataclasses.asdict(outcome.not_started),
            observed=None if outcome.observed is None else dataclasses.asdict(outcome.observed),
            pytest=None if self.pytest is None else self.pytest.as_dict(),
            published=None if self.published is None else self.published.as_dict(),
            journal_head=self.journal_head,
            filter_digest=self.filter_digest,
        )
        return value

    def canonical_bytes(self) -> bytes:
        return canonical(self.as_dict())


def receipt_name(attempt_id: str, case_id: str) -> str:
    """``ATTEMPT.CASE.receipt.json``; a case id holds no dot, so the last dot splits the two."""
    return f"{attempt_id}.{case_id}{SUFFIX}"


def name_parts(name: str) -> tuple[str, str] | None:
    """(attempt id, case id) of a receipt file name, or None for any other name."""
    if not name.endswith(SUFFIX):
        return None
    attempt_id, dot, case_id = name[: -len(SUFFIX)].rpartition(".")
    if not dot or not ID.match(attempt_id) or not CASE_ID.match(case_id):
        return None
    return attempt_id, case_id


def build_receipt(
    binding: Binding,
    case_id: str,
    process: ProcessIdentity | None,
    outcome: Outcome,
    pytest: PytestEvidence | None,
    journal_head: str,
    output: CaseOutput | None = None,
    filter_digest: str | None = None,
) -> Receipt:
    """A receipt from what the launcher observed, binding ``output`` (given exactly when the op ran);
    refused unless :func:`receipt_from_bytes` would accept it."""
    receipt = Receipt(
        binding, case_id, process, outcome, pytest, journal_head, None if output is None else output.bound(),
        filter_digest=filter_digest,
    )
    receipt_from_bytes(receipt.canonical_bytes())
    return receipt


# Reading

def _nullable_object(fields: ClosedObject, key: str) -> ClosedObject | None:
    value = fields.pop_nullable(key)
    return None if value is None else ClosedObject(value, child_path(fields.path, key))


def _nullable_digest(fields: ClosedObject, key: str) -> str | None:
    value = fields.pop_nullable(key)
    return None if value is None else check_digest(value, child_path(fields.path, key))


def _phase(path: str, item: object) -> tuple[str, str]:
    fields = ClosedObject(item, path)
    phase = fields.pop_str("phase", max_bytes=16)
    if phase not in PHASES:
        raise StrictJSONError(child_path(path, "phase"), f"must be one of {', '.join(PHASES)}")
    sandbox = pop_id(fields, "sandbox")
    fields.done()
    return phase, sandbox


def _nullable_sha256(fields: ClosedObject, key: str) -> str | None:
    value = fields.pop_nullable(key)
    if value is None:
        return None
    return check_str(value, child_path(fields.path, key), max_bytes=64, pattern=SHA256_HEX, rule="must be null or 64 lowercase hex digits")


def _binding(fields: ClosedObject) -> Binding:
    return Binding(
        attempt_id=pop_id(fields, "attempt_id"),
        attempt_number=fields.pop_int("attempt_number", low=1, high=MAX_ATTEMPT_NUMBER),
        plan_digest=fields.pop_digest("plan_digest"),
        candidate_digest=fields.pop_digest("candidate_digest"),
        bundle_sha256=fields.pop_sha256("bundle_sha256"),
        dependency_inventory_digest=fields.pop_digest("dependency_inventory_digest"),
        runtime_inventory_digest=fields.pop_digest("runtime_inventory_digest"),
        runtime_version=fields.pop_str("runtime_version", max_bytes=40, pattern=RUNTIME_VERSION, rule="must be an implementation and a version, such as cpython 3.12.1"),
        runner_inventory_digest=_nullable_digest(fields, "runner_inventory_digest"),
        stage_id=pop_id(fields, "stage_id"),
        phases=tuple(_phase(path, item) for path, item in fields.pop_list("phases", min_items=0, max_items=MAX_PHASES)),
    )


def _process(fields: ClosedObject | None) -> ProcessIdentity | None:
    if fields is None:
        return None
    process = ProcessIdentity(
        op_id=pop_id(fields, "op_id"),
        pid=fields.pop_int("pid", low=1, high=MAX_PID),
        starttime=fields.pop_int("starttime", low=0, high=MAX_SAFE_INTEGER),
        pgid=fields.pop_int("pgid", low=1, high=MAX_PID),
    )
    fields.done()
    return process


def _stream(fields: ClosedObject) -> Stream:
    stream = Stream(
        sha256=fields.pop_sha256("sha256"),
        bytes=fields.pop_int("bytes", low=0, high=MAX_SAFE_INTEGER),
        truncated=fields.pop_bool("truncated"),
    )
    fields.done()
    return stream


def _observed(fields: ClosedObject | None) -> Observed | None:
    if fields is None:
        return None
    observed = Observed(
        wall_ms=fields.pop_int("wall_ms", low=0, high=MAX_SAFE_INTEGER),
        cpu_ms=fields.pop_int("cpu_ms", low=0, high=MAX_SAFE_INTEGER),
        max_rss_kib=fields.pop_int("max_rss_kib", low=0, high=MAX_SAFE_INTEGER),
        memory_peak_bytes=fields.pop_nullable_int("memory_peak_bytes", high=MAX_SAFE_INTEGER),
        stdout=_stream(fields.pop_object("stdout")),
        stderr=_stream(fields.pop_object("stderr")),
    )
    fields.done()
    return observed


def _not_started(fields: ClosedObject | None) -> NotStarted | None:
    if fields is None:
        return None
    result = NotStarted(
        step=pop_id(fields, "step"),
        errno=fields.pop_int("errno", low=0, high=4_095),
    )
    fields.done()
    return result


def _pytest(fields: ClosedObject | None) -> PytestEvidence | None:
    if fields is None:
        return None
    report = fields.pop_str("report", max_bytes=16)
    if report not in REPORT_STATES:
        raise StrictJSONError(child_path(fields.path, "report"), f"must be one of {', '.join(REPORT_STATES)}")
    counts_fields = _nullable_object(fields, "counts")
    size = fields.pop_nullable_int("bytes", high=MAX_SAFE_INTEGER)
    cap = fields.pop_int("cap", low=1, high=MAX_SAFE_INTEGER)
    fields.done()
    if (report == READ) != (counts_fields is not None):
        raise StrictJSONError(child_path(fields.path, "counts"), "is given exactly when the report was read")
    if (report == "missing" and size is not None) or (report == READ and (size is None or size > cap)):
        raise StrictJSONError(child_path(fields.path, "bytes"), "is null for a missing report and at most cap for one that was read")
    if counts_fields is None:
        return PytestEvidence(report, None, size, cap)
    counts = JunitCounts(
        *(counts_fields.pop_int(key, low=0, high=MAX_TEST_COUNT) for key in ("tests", "skipped", "failures", "errors", "collection_errors"))
    )
    counts_fields.done()
    for key in ("skipped", "failures", "errors", "collection_errors"):
        if getattr(counts, key) > counts.tests:
            raise StrictJSONError(child_path(counts_fields.path, key), "cannot exceed tests")
    if counts.collection_errors > counts.errors:
        raise StrictJSONError(child_path(counts_fields.path, "collection_errors"), "cannot exceed errors")
    return PytestEvidence(report, counts, size, cap)


def _bound(fields: ClosedObject | None, high: int) -> Bound | None:
    if fields is None:
        return None
    bound = Bound(sha256=fields.pop_sha256("sha256"), bytes=fields.pop_int("bytes", low=0, high=high))
    fields.done()
    return bound


def _published(fields: ClosedObject | None) -> Published | None:
    if fields is None:
        return None
    published = Published(
        stdout=_bound(fields.pop_object("stdout"), OUTPUT_MAX_BYTES["stdout"]),
        stderr=_bound(fields.pop_object("stderr"), OUTPUT_MAX_BYTES["stderr"]),
        junit=_bound(_nullable_object(fields, "junit"), OUTPUT_MAX_BYTES["junit"]),
    )
    fields.done()
    return published


def _check_published(published: Published | None, observed: Observed | None, pytest: PytestEvidence | None) -> None:
    """The published files match what the receipt says was captured: given exactly when the op ran; a stream
    kept whole has the captured stream's digest; a junit file is the report the counts came from, whole."""
    if (published is None) != (observed is None):
        raise StrictJSONError("$.published", "is given exactly when observed is")
    if published is None:
        return
    for name in ("stdout", "stderr"):
        bound, stream = getattr(published, name), getattr(observed, name)
        if bound.bytes != min(stream.bytes, 2 * OUTPUT_EDGE_BYTES) or (
            stream.bytes <= 2 * OUTPUT_EDGE_BYTES and bound.sha256 != stream.sha256
        ):
            raise StrictJSONError(f"$.published.{name}", f"is not the published part of the captured {name}")
    junit = published.junit
    if junit is not None and (pytest is None or pytest.bytes != junit.bytes or pytest.over_cap):
        raise StrictJSONError("$.published.junit", "is given only for a pytest report within its cap, with the report's size")


def _check_outcome(outcome: Outcome, process: ProcessIdentity | None, filter_digest: str | None) -> None:
    if process is None and filter_digest is not None:
        raise StrictJSONError("$.filter_digest", "is null when the case had no process")
    status = outcome.wait_status
    if (process is None) != (status is None) or (status is None) != (outcome.descendants_reaped is None):
        raise StrictJSONError("$.process", "process, wait_status and descendants_reaped are all null or all given")
    if (outcome.limit == NOT_STARTED) != (outcome.not_started is not None):
        raise StrictJSONError("$.not_started", f"is given exactly when limit is {NOT_STARTED}")
    if (outcome.limit == NOT_STARTED) == (outcome.observed is not None):
        raise StrictJSONError("$.observed", f"is given exactly when limit is not {NOT_STARTED}")
    if status is None:
        return
    if not is_terminated_status(status):
        raise StrictJSONError("$.wait_status", f"{status:#06x} is not the raw status of a terminated process")
    exited = status & 0x7F == 0
    consistent = {
        "OK": status == 0,
        "EXIT_NONZERO": exited and status != 0,
        "SIGNALLED": not exited,
    }.get(outcome.limit, True)
    if not consistent:
        raise StrictJSONError("$.limit", f"{outcome.limit} does not match wait status {status:#06x}")


def receipt_from_value(value: object) -> Receipt:
    fields = ClosedObject(value)
    fields.pop_const("schema", SCHEMA)
    version = fields.pop_str("casebox_version", max_bytes=32, pattern=VERSION_PATTERN, rule="must be a casebox version")
    binding = _binding(fields)
    case_id = fields.pop_str("case_id", max_bytes=64, pattern=CASE_ID, rule=f"must match ^{CASE_ID.pattern[:-2]}$")
    process = _process(_nullable_object(fields, "process"))
    wait_status = fields.pop_nullable_int("wait_status", high=0xFFFF)
    descendants = fields.pop_nullable_int("descendants_reaped", high=MAX_COUNT)
    limit = fields.pop_str("limit", max_bytes=16)
    if limit not in LIMIT_CLASSES:
        raise StrictJSONError("$.limit", f"must be one of {', '.join(LIMIT_CLASSES)}")
    not_started = _not_started(_nullable_object(fields, "not_started"))
    observed = _observed(_nullable_object(fields, "observed"))
    pytest = _pytest(_nullable_object(fields, "pytest"))
    published = _published(_nullable_object(fields, "published"))
    journal_head = fields.pop_sha256("journal_head")
    filter_digest = _nullable_sha256(fields, "filter_digest")
    fields.done()
    outcome = Outcome(limit, wait_status, descendants, observed, not_started)
    _check_outcome(outcome, process, filter_digest)
    _check_published(published, observed, pytest)
    return Receipt(binding, case_id, process, outcome, pytest, journal_head, published, version, filter_digest)


def receipt_from_bytes(data: bytes) -> Receipt:
    """The receipt in ``data``: closed, valid, consistent, and in its one canonical encoding."""
    receipt = receipt_from_value(loads(data, max_bytes=RECEIPT_MAX_BYTES))
    if receipt.canonical_bytes() != data:
        raise StrictJSONError("$", "the receipt is not in canonical JSON form (RFC 8785, no trailing newline)")
    return receipt

