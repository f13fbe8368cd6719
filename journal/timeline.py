"""A journal's valid prefix folded into a reviewer's timeline: sandboxes, host lanes and cleanup events.

Pure: it reads :class:`~journal.reader.Record` values and nothing else. A
sandbox's operations share the id prefix ``<sandbox>.`` (:func:`sandbox_of`),
so one sandbox's launcher, pid 1, ops and in-namespace mounts form one lane;
every operation without a dot is the steward's own, on the host (output
mounts, helpers). Nothing is inferred that the records do not hold: a
process without PROCESS_TERMINAL has no wait status, a mount without
UNMOUNT_DONE is not unmounted, and an in-namespace mount ends with its
namespace only when a PROCESS_TERMINAL of that sandbox's pid 1 says so.

:class:`Labels` carry what evidence beside the journal says of its lanes
(``casebox journal replay --evidence`` reads it from the receipts): a
sandbox's phase or case, an op's limit class. They name lanes for the
reader; they never add a record, a status or a claim.
"""

from __future__ import annotations

import dataclasses
import datetime
import signal

from journal import strictjson
from journal.format import Kind, networked_sandbox, sandbox_of, time_key
from journal.reader import Reading, Record, Verdict

PID1_ROLE = "namespace"


@dataclasses.dataclass
class Process:
    op_id: str
    role: str
    pid: int
    pgid: int
    starttime: int
    intent_at: int
    released_at: int | None = None
    terminal_at: int | None = None
    wait_status: int | None = None
    reaper: str | None = None
    descendants: int | None = None
    # The limit class evidence gives this op (a receipt's ``limit``), when there is any.
    limit: str | None = None
    # A pid 1's READY: the digest of the syscall filter its ops run under (S12).
    filter_digest: str | None = None

    @property
    def first_at(self) -> int:
        return self.intent_at


@dataclasses.dataclass
class Mount:
    """One mount from intent to done, and its unmount; ``intent_at`` is None for an unmount with no recorded mount."""

    target: str
    kind: str
    op_id: str | None = None
    intent_at: int | None = None
    done_at: int | None = None
    unmount_op_id: str | None = None
    unmount_intent_at: int | None = None
    unmount_done_at: int | None = None

    @property
    def first_at(self) -> int:
        return self.intent_at if self.intent_at is not None else self.unmount_intent_at

    @property
    def unmounted(self) -> bool:
        return self.unmount_done_at is not None


@dataclasses.dataclass(frozen=True)
class Labels:
    """Names for lanes from evidence beside the journal: sandbox name -> what it was (``extract``,
    ``case pass``), op id -> its limit class."""

    sandboxes: dict[str, str] = dataclasses.field(default_factory=dict)
    limits: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Sandbox:
    name: str
    first_at: int
    processes: list[Process] = dataclasses.field(default_factory=list)
    mounts: list[Mount] = dataclasses.field(default_factory=list)
    label: str | None = None

    @property
    def title(self) -> str:
        """``sandbox NAME`` and, when evidence says what it was, ``(case pass)``."""
        return f"sandbox {self.name}" + (f" ({self.label})" if self.label else "")

    @property
    def pid1(self) -> Process | None:
        return next((process for process in self.processes if process.role == PID1_ROLE), None)

    @property
    def namespace_end(self) -> int | None:
        """When the sandbox's mount namespace ended: the PROCESS_TERMINAL of its pid 1, if the journal holds one."""
        pid1 = self.pid1
        return None if pid1 is None else pid1.terminal_at

    @property
    def networked(self) -> bool:
        """The steward names a sandbox that had the index network (the forwarder to a network index, its
        only way out of its own network namespace) ``<stage>-<n>-net`` (docs/launcher.md)."""
        return networked_sandbox(self.name)

    @property
    def namespace(self) -> str:
        """What the records say of the mount namespace: ``ended`` (pid 1's PROCESS_TERMINAL is recorded),
        ``open`` (pid 1 is recorded, not reaped) or ``unrecorded`` (no pid 1 record at all)."""
        pid1 = self.pid1
        return "unrecorded" if pid1 is None else "open" if pid1.terminal_at is None else "ended"

    @property
    def lasting_mounts(self) -> list[Mount]:
        """The mounts no unmount record ends: they last as long as the namespace."""
        return [mount for mount in self.mounts if mount.intent_at is not None and not mount.unmounted]

    @property
    def ops(self) -> list[Process]:
        return [process for process in self.processes if process.role not in ("launcher", PID1_ROLE)]

    @property
    def last_at(self) -> int:
        times = [self.first_at]
        for process in self.processes:
            times += [at for at in (process.intent_at, process.released_at, process.terminal_at) if at is not None]
        for mount in self.mounts:
            times += [at for at in (mount.intent_at, mount.done_at, mount.unmount_intent_at, mount.unmount_done_at) if at is not None]
        return max(times)

    def local(self, op_id: str) -> str:
        """An op id without the sandbox's prefix (``launcher``, ``init``, ``op-1``)."""
        return op_id[len(self.name) + 1:]


@dataclasses.dataclass
class Event:
    at: int
    kind: Kind
    label: str
    outcome: str
    detail: str


Lane = Sandbox | Process | Mount


@dataclasses.dataclass
class Timeline:
    reading: Reading
    start: int
    end: int
    lanes: list[Lane]
    events: list[Event]
    cleanup: dict | None

    @property
    def genesis(self) -> dict:
        return self.reading.records[0].fields

    @property
    def sandboxes(self) -> list[Sandbox]:
        return [lane for lane in self.lanes if isinstance(lane, Sandbox)]

    @property
    def host_mounts(self) -> list[Mount]:
        return [lane for lane in self.lanes if isinstance(lane, Mount)]

    @property
    def host_processes(self) -> list[Process]:
        return [lane for lane in self.lanes if isinstance(lane, Process)]

    def conclusion(self) -> str:
        """The final word: only a VALID journal with cleanup evidence supports a cleanup claim (J4)."""
        verdict = self.reading.verdict
        if verdict is not Verdict.VALID:
            return f"journal {verdict}: no cleanup claim is authorized; the stage is preserved"
        if self.cleanup is None:
            return "journal VALID, but it holds no cleanup evidence"
        return f"cleanup {self.cleanup['outcome']}, journal VALID"


def at_of(record: Record) -> int:
    return record.fields[time_key(record.kind)]


class _Fold:
    def __init__(self) -> None:
        self.lanes: list[Lane] = []
        self.sandboxes: dict[str, Sandbox] = {}
        self.processes: dict[str, Process] = {}
        self.mounts: dict[str, Mount] = {}
        self.events: list[Event] = []
        self.cleanup: dict | None = None

    def sandbox(self, op_id: str, at: int) -> Sandbox | None:
        name = sandbox_of(op_id)
        if name is None:
            return None
        if name not in self.sandboxes:
            self.sandboxes[name] = Sandbox(name, at)
            self.lanes.append(self.sandboxes[name])
        return self.sandboxes[name]

    def add(self, record: Record) -> None:
        fields, kind, at = record.fields, record.kind, at_of(record)
        if kind is Kind.PROCESS_INTENT:
            process = Process(fields["op_id"], fields["role"], fields["pid"], fields["pgid"], fields["starttime"], at)
            self.processes[process.op_id] = process
            sandbox = self.sandbox(process.op_id, at)
            (self.lanes if sandbox is None else sandbox.processes).append(process)
        elif kind is Kind.PROCESS_RELEASED:
            self.processes[fields["op_id"]].released_at = at
        elif kind is Kind.PROCESS_TERMINAL:
            process = self.processes[fields["op_id"]]
            process.terminal_at, process.wait_status, process.reaper = at, fields["wait_status"], fields["reaper"]
        elif kind is Kind.DESCENDANTS_TERMINAL:
            self.processes[fields["op_id"]].descendants = fields["count"]
        elif kind is Kind.SANDBOX_READY:
            self.processes[fields["op_id"]].filter_digest = fields["filter_digest"]
        elif kind is Kind.MOUNT_INTENT:
            mount = Mount(fields["target"], fields["kind"], fields["op_id"], at)
            self.mounts[mount.op_id] = mount
            sandbox = self.sandbox(mount.op_id, at)
            (self.lanes if sandbox is None else sandbox.mounts).append(mount)
        elif kind is Kind.MOUNT_DONE:
            self.mounts[fields["op_id"]].done_at = at
        elif kind is Kind.UNMOUNT_INTENT:
            sandbox = self.sandbox(fields["op_id"], at)
            siblings = self.lanes if sandbox is None else sandbox.mounts
            mount = _mounted(siblings, fields["target"], fields["kind"])
            if mount is None:
                mount = Mount(fields["target"], fields["kind"])
                siblings.append(mount)
            mount.unmount_op_id, mount.unmount_intent_at = fields["op_id"], at
            self.mounts[fields["op_id"]] = mount
        elif kind is Kind.UNMOUNT_DONE:
            self.mounts[fields["op_id"]].unmount_done_at = at
        elif kind is not Kind.GENESIS:
            self.events.append(_event(record, at))
            if kind is Kind.CLEANUP_EVIDENCE:
                self.cleanup = fields


def timeline(reading: Reading, labels: Labels | None = None) -> Timeline:
    """The lanes of a reading with at least one record, in the order their first record appears."""
    fold = _Fold()
    for record in reading.records:
        fold.add(record)
    if labels is not None:
        for name, sandbox in fold.sandboxes.items():
            sandbox.label = labels.sandboxes.get(name)
        for op_id, process in fold.processes.items():
            process.limit = labels.limits.get(op_id)
    times = [at_of(record) for record in reading.records]
    return Timeline(reading, min(times), max(times), fold.lanes, fold.events, fold.cleanup)


def _mounted(lanes: list, target: str, kind: str) -> Mount | None:
    """The latest recorded mount of ``target`` and ``kind`` among ``lanes`` that no unmount has claimed yet."""
    for lane in reversed(lanes):
        if (
            isinstance(lane, Mount)
            and (lane.target, lane.kind) == (target, kind)
            and lane.op_id is not None
            and lane.unmount_op_id is None
        ):
            return lane
    return None


def _event(record: Record, at: int) -> Event:
    fields, kind = record.fields, record.kind
    if kind is Kind.HELPER_ATTEMPT:
        return Event(at, kind, f"helper attempt {fields['attempt']}", fields["outcome"], f"response {fields['response_digest']}")
    if kind is Kind.CLEANUP_EVIDENCE:
        return Event(
            at,
            kind,
            "cleanup evidence",
            fields["outcome"],
            f"journal head {fields['journal_head']}, process inventory {fields['process_inventory_digest']}, "
            f"mount inventory {fields['mount_inventory_digest']}, preceding process {fields['preceding_process_digest']}",
        )
    label = "retirement intent" if kind is Kind.RETIREMENT_INTENT else "retired"
    note = fields["note"]
    return Event(at, kind, label, "", f"note {strictjson.canonical(note).decode('ascii')}" if note else "no note")


# Words for values, shared by the text and the HTML renderings.


def describe_wait(status: int) -> str:
    """A raw wait status in words; the raw value is always shown beside it."""
    if status & 0x7F == 0:
        return f"exit {status >> 8}"
    return f"killed by {signal_name(status)} ({status & 0x7F})" + (", core dumped" if status & 0x80 else "")


def signal_name(status: int) -> str:
    number = status & 0x7F
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def short_wait(process: Process) -> str:
    """A terminal status in a word or two (``exit 0``, ``SIGKILL``), or ``not reaped`` without PROCESS_TERMINAL."""
    status = process.wait_status
    if status is None:
        return "not reaped"
    if status & 0x7F == 0:
        return f"exit {status >> 8}" + _limited(process)
    return signal_name(status) + (" core" if status & 0x80 else "") + _limited(process)


def _limited(process: Process) -> str:
    """The limit class evidence gives an op that did not end OK: a timeout kill and an output-cap kill are
    both SIGKILL to the journal."""
    return "" if process.limit in (None, "OK") else f" ({process.limit})"


def full_wait(process: Process) -> str:
    if process.wait_status is None:
        return "not reaped in this journal"
    text = f"{describe_wait(process.wait_status)} (raw {process.wait_status}), reaped by {process.reaper}"
    return text + ("" if process.limit is None else f", limit class {process.limit}")


def since(start: int, at: int | None) -> str:
    return "-" if at is None else f"+{(at - start) / 1e6:.6f}s"


def duration(start: int | None, stop: int | None) -> str:
    if start is None or stop is None:
        return "open"
    micros = stop - start
    if abs(micros) >= 1_000_000:
        return f"{micros / 1e6:.3f} s"
    if abs(micros) >= 1_000:
        return f"{micros / 1e3:.3f} ms"
    return f"{micros} µs"


def wall_time(micros: int) -> str:
    moment = datetime.datetime.fromtimestamp(micros / 1e6, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def mount_groups(mounts: list[Mount]) -> list[tuple[str, list[str]]]:
    """Targets grouped by mount kind, kinds and targets in the order they first appear."""
    groups: dict[str, list[str]] = {}
    for mount in mounts:
        groups.setdefault(mount.kind, []).append(mount.target)
    return list(groups.items())


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "es" if noun.endswith(("s", "x")) else "s")


def contents(line: Timeline) -> str:
    """What the journal holds, in one line."""
    parts = [plural(len(line.sandboxes), "sandbox"), plural(len(line.host_mounts), "host mount"),
             plural(len(line.host_processes), "host process")]
    counts: dict[str, int] = {}
    for event in line.events:
        counts[event.kind.name] = counts.get(event.kind.name, 0) + 1
    words = {"HELPER_ATTEMPT": "helper attempt", "CLEANUP_EVIDENCE": "cleanup evidence record",
             "RETIREMENT_INTENT": "retirement intent", "RETIRED": "retired record"}
    parts += [plural(count, words[name]) for name, count in counts.items()]
    return ", ".join(parts)
