"""The steward session API's values: the same objects in process and over the socket (docs/steward-protocol.md).

Each result type converts to and from its closed wire form (``to_wire`` and
``from_wire``): canonical JSON values, bytes as base64 text. This module is
light (the standard library and journal/) so an unprivileged client can use
it without the root side's dependencies.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os
import re

from collections.abc import Mapping

from journal.closed import ClosedObject, check_str
from journal.format import pop_id
from journal.strictjson import MAX_SAFE_INTEGER, StrictJSONError, child_path
from launcher.protocol import MESSAGES

MIB = 1 << 20
# The one end without CLOSE a client may ask for itself (END): its receipts name a case runtime that changed
# under them (docs/pipeline.md, "The runtime"), so nothing is exported and the tombstone says why.
RUNTIME_CHANGED = "RUNTIME_CHANGED"
CLIENT_ENDINGS = (RUNTIME_CHANGED,)
NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}\Z")
NAME_RULE = "must be a name: 1 to 40 of a-z 0-9 _ -, starting with a letter or digit"
MAX_OUTPUT = 256 << 10
# An evidence file the client stores in its stage (a receipt, a case's published output) and gets back at close
# with the journal and seal.json. The largest is a published junit report (executor.evidence.receipts), whose base64
# fits one wire message (steward.wire.MAX_MESSAGE); a stage of the most cases stores at most the files count.
EVIDENCE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}\Z")
EVIDENCE_RULE = "must be one file name of A-Z a-z 0-9 . _ -, starting with a letter or digit, at most 255 bytes"
MAX_EVIDENCE_BYTES = 512 << 10
MAX_EVIDENCE_FILES = 254
# How many sandboxes one session may start ahead of their ops (docs/launcher.md, "Started ahead").
MAX_AHEAD = 3


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a CI job or a container may narrow): the one
    count that sizes both the sandboxes started ahead and verify's default --jobs."""
    return len(os.sched_getaffinity(0))


def ahead_for_host() -> int:
    """The sandboxes a session starts ahead: as many as the cores this process may run on, at most MAX_AHEAD.

    A start is mostly waiting (the cgroup move, the rendezvous, each record's sync), not computing, so even
    one core gains from one start beside an op, and two cores from two (docs/pipeline.md, "Started ahead")."""
    return min(usable_cores(), MAX_AHEAD)

# A sandbox's network (docs/launcher.md, S9): always a namespace of its own with lo; ``index`` adds the steward's
# forwarder to one network index (steward/forwarder.py), for the resolver and fetch of that index only.
LOOPBACK = "loopback"
INDEX_NETWORK = "index"
NETWORKS = (LOOPBACK, INDEX_NETWORK)
DEFAULT_PROCESSES = 512


def check_name(name: object, where: str) -> str:
    """A capability or output name: it becomes /cap/NAME or /out/NAME in a sandbox."""
    if type(name) is not str or not NAME.match(name):
        raise StrictJSONError(where, NAME_RULE)
    return name


def check_mount(path: object, where: str) -> str:
    """A path of its own where a capability is mounted in every sandbox (launcher.rendezvous.is_mount_target)."""
    from launcher.rendezvous import is_mount_target

    if type(path) is not str or not is_mount_target(path):
        raise StrictJSONError(
            where, "must be an absolute, normalized path of printable ASCII without spaces or quotes, at most 16 "
            "segments, outside the sandbox's own tree (/usr, /cap, /out, /proc, /dev, /tmp, /work, /etc, /bin, /lib...)",
        )
    return path


def check_network(network: object, where: str) -> str:
    if network not in NETWORKS:
        raise StrictJSONError(where, f"must be one of {', '.join(NETWORKS)}")
    return network


def _int(fields: ClosedObject, key: str, high: int = MAX_SAFE_INTEGER) -> int:
    return fields.pop_int(key, low=0, high=high)


def _bytes(fields: ClosedObject, key: str, cap: int) -> bytes:
    text = fields.pop_str(key, max_bytes=(cap + 2) // 3 * 4, ascii_only=True)
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, ValueError):
        raise StrictJSONError(f"{fields.path}.{key}", "must be base64") from None


@dataclasses.dataclass(frozen=True)
class Limits:
    """A sandbox's caps. ``processes`` counts the op's processes; pid 1 is one more."""

    tmp_bytes: int = 64 * MIB
    work_bytes: int = 256 * MIB
    memory_bytes: int = 512 * MIB
    # Thread pools in real test suites need a few hundred tasks (a thread counts as one); a fork bomb still
    # reaches pids.max and names PIDS.
    processes: int = DEFAULT_PROCESSES
    files: int = 256

    @property
    def file_size(self) -> int:
        return max(self.tmp_bytes, self.work_bytes)

    def to_wire(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls, fields: ClosedObject) -> "Limits":
        limits = cls(
            tmp_bytes=fields.pop_int("tmp_bytes", low=MIB, high=64 << 30),
            work_bytes=fields.pop_int("work_bytes", low=MIB, high=64 << 30),
            memory_bytes=fields.pop_int("memory_bytes", low=16 * MIB, high=64 << 30),
            processes=fields.pop_int("processes", low=1, high=4_096),
            files=fields.pop_int("files", low=16, high=65_536),
        )
        fields.done()
        return limits


@dataclasses.dataclass(frozen=True)
class Opened:
    """A new session: its stage, its journal, the head after GENESIS, and how many sandboxes it may start
    ahead of their ops at once (Session.start_ahead)."""

    stage_id: str
    journal_id: str
    attempt_id: str
    head: str
    ahead: int = 0

    def to_wire(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls, fields: ClosedObject) -> "Opened":
        value = cls(
            pop_id(fields, "stage_id"), pop_id(fields, "journal_id"), pop_id(fields, "attempt_id"), fields.pop_sha256("head"),
            fields.pop_int("ahead", low=0, high=MAX_AHEAD),
        )
        fields.done()
        return value


# READY's fields as launcher/protocol.py defines them, the one list of what the launcher proves: the
# steward's wire carries them as they came, in JSON (a u8 as a boolean, bytes as lowercase hex).
READY_PROOF = MESSAGES["READY"][3]
_PROOF_STRINGS, _PROOF_STRING_BYTES, _PROOF_BYTES = 16, 4_096, 64
_WORDS = {"u32": 0xFFFF_FFFF, "u64": MAX_SAFE_INTEGER}


@dataclasses.dataclass(frozen=True)
class Ready:
    """A READY sandbox: its id, the journal head, the launcher's proof of the drop (S5) and of its syscall
    filter (S12), every field of READY (``READY_PROOF``) as the starter checked it, and its network
    (``loopback``, or ``index`` with the forwarder listening in it), in a namespace of pid 1's own as the
    starter observed it (S9)."""

    sandbox: str
    head: str
    proof: Mapping[str, object]
    network: str = LOOPBACK

    def to_wire(self) -> dict:
        def wire(kind: str, value):
            if kind == "bytes":
                return value.hex()
            return list(value) if kind == "strs" else value

        proof = {name: wire(kind, self.proof[name]) for name, kind in READY_PROOF}
        return {"sandbox": self.sandbox, "head": self.head, "proof": proof, "network": self.network}

    @classmethod
    def from_wire(cls, fields: ClosedObject) -> "Ready":
        sandbox, head = pop_id(fields, "sandbox"), fields.pop_sha256("head")
        wire = fields.pop_object("proof")
        proof = {name: _pop_proof_field(wire, name, kind) for name, kind in READY_PROOF}
        wire.done()
        value = cls(sandbox, head, proof, check_network(fields.pop_str("network", max_bytes=16), f"{fields.path}.network"))
        fields.done()
        return value


def _pop_proof_field(fields: ClosedObject, name: str, kind: str):
    if kind == "u8":
        return fields.pop_bool(name)
    if kind in _WORDS:
        return fields.pop_int(name, low=0, high=_WORDS[kind])
    if kind == "str":
        return fields.pop_str(name, max_bytes=_PROOF_STRING_BYTES)
    if kind == "strs":
        items = fields.pop_list(name, min_items=0, max_items=_PROOF_STRINGS)
        return tuple(check_str(item, where, max_bytes=_PROOF_STRING_BYTES) for where, item in items)
    text = fields.pop_str(name, max_bytes=2 * _PROOF_BYTES, ascii_only=True)
    if not re.fullmatch(r"(?:[0-9a-f]{2})*", text):
        raise StrictJSONError(child_path(fields.path, name), "must be lowercase hex")
    return bytes.fromhex(text)


@dataclasses.dataclass(frozen=True)
class OpResult:
    """An op that ran: its raw wait status and what pid 1 and the cgroup observed (docs/launcher.md, S10)."""

    limit: str
    wait_status: int
    descendants_reaped: int
    wall_ms: int
    cpu_ms: int
    max_rss_kib: int
    # The ops cgroup's memory high-water mark over the op (steward/cgroups.py); None where the kernel keeps none.
    memory_peak_bytes: int | None
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    op_id: str = ""

    @property
    def exit_code(self) -> int | None:
        return os.WEXITSTATUS(self.wait_status) if os.WIFEXITED(self.wait_status) else None

    @property
    def signal(self) -> int | None:
        return os.WTERMSIG(self.wait_status) if os.WIFSIGNALED(self.wait_status) else None


@dataclasses.dataclass(frozen=True)
class OpNotStarted:
    """An op whose child failed before exec: the failing step and errno; it has no exit code."""

    step: str
    errno: int
    wait_status: int
    descendants_reaped: int
    op_id: str = ""


def _observation_to_wire(observation: OpResult | OpNotStarted) -> dict:
    values = dataclasses.asdict(observation)
    del values["op_id"]
    if isinstance(observation, OpResult):
        values["stdout"] = base64.b64encode(observation.stdout).decode("ascii")
        values["stderr"] = base64.b64encode(observation.stderr).decode("ascii")
    return values


def _observation_from_wire(fields: ClosedObject, op_id: str) -> OpResult | OpNotStarted:
    wait_status = _int(fields, "wait_status", 0xFFFF)
    descendants = _int(fields, "descendants_reaped", 2**32 - 1)
    if fields.has("step"):
        observation: OpResult | OpNotStarted = OpNotStarted(
            step=fields.pop_str("step", max_bytes=64), errno=_int(fields, "errno", 4_095),
            wait_status=wait_status, descendants_reaped=descendants, op_id=op_id,
        )
    else:
        observation = OpResult(
            limit=fields.pop_str("limit", max_bytes=32, ascii_only=True),
            wait_status=wait_status,
            descendants_reaped=descendants,
            wall_ms=_int(fields, "wall_ms"),
            cpu_ms=_int(fields, "cpu_ms"),
            max_rss_kib=_int(fields, "max_rss_kib"),
            memory_peak_bytes=fields.pop_nullable_int("memory_peak_bytes", high=MAX_SAFE_INTEGER),
            stdout=_bytes(fields, "stdout", MAX_OUTPUT),
            stderr=_bytes(fields, "stderr", MAX_OUTPUT),
            stdout_truncated=fields.pop_bool("stdout_truncated"),
            stderr_truncated=fields.pop_bool("stderr_truncated"),
            op_id=op_id,
        )
    fields.done()
    return observation


@dataclasses.dataclass(frozen=True)
class OpOutcome:
    """One op: the launcher's observation exactly as the starter got it, and the op's process identity
    exactly as the journal recorded it.

    ``observation`` is an :class:`OpResult`, or an :class:`OpNotStarted` for an
    op whose child failed before exec (it has a wait status but no limit class
    and no exit code). ``terminal_head`` is the journal head right after the
    op's PROCESS_TERMINAL, ``head`` the head after its DESCENDANTS_TERMINAL.
    ``filter_digest`` is the syscall filter the op ran under, as its sandbox's
    READY proved and the journal's SANDBOX_READY recorded (S12).
    """

    sandbox: str
    op_id: str
    pid: int
    starttime: int
    pgid: int
    observation: OpResult | OpNotStarted
    terminal_head: str
    head: str
    filter_digest: str

    @property
    def started(self) -> bool:
        return isinstance(self.observation, OpResult)

    @property
    def wait_status(self) -> int:
        return self.observation.wait_status

    @property
    def exit_code(self) -> int | None:
        return self.observation.exit_code if isinstance(self.observation, OpResult) else None

    def to_wire(self) -> dict:
        return {
            "sandbox": self.sandbox, "op_id": self.op_id, "pid": self.pid, "starttime": self.starttime, "pgid": self.pgid,
            "observation": _observation_to_wire(self.observation),
            "terminal_head": self.terminal_head, "head": self.head, "filter_digest": self.filter_digest,
        }

    @classmethod
    def from_wire(cls, fields: ClosedObject) -> "OpOutcome":
        op_id = pop_id(fields, "op_id")
        value = cls(
            sandbox=pop_id(fields, "sandbox"),
            op_id=op_id,
            pid=fields.pop_int("pid", low=1, high=4_194_304),
            starttime=_int(fields, "starttime"),
            pgid=fields.pop_int("pgid", low=1, high=4_194_304),
            observation=_observation_from_wire(fields.pop_object("observation"), op_id),
            terminal_head=fields.pop_sha256("terminal_head"),
            head=fields.pop_sha256("head"),
            filter_digest=fields.pop_sha256("filter_digest"),
        )
        fields.done()
        return value


@dataclasses.dataclass(frozen=True)
class Sealed:
    """A sealed output: its inventory digest (``sha256:`` and 64 hex), its counts and total bytes."""

    name: str
    inventory_digest: str
    files: int
    directories: int
    bytes: int

    def to_wire(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls, fields: ClosedObject) -> "Sealed":
        value = cls(
            name=check_name(fields.pop_str("name", max_bytes=40), f"{fields.path}.name"),
            inventory_digest=fields.pop_digest("inventory_digest"),
            files=_int(fields, "files"),
            directories=_int(fields, "directories"),
            bytes=_int(fields, "bytes"),
        )
        fields.done()
        return value


@dataclasses.dataclass(frozen=True)
class Closed:
    """A retired session: the sealed tombstone, the final head, the cleanup outcome and the diagnostic (C7)."""

    stage_id: str
    journal_id: str
    attempt_id: str
    head: str
    tombstone: str
    cleanup: str
    diagnostic: str
    exported: tuple[str, ...]

    def to_wire(self) -> dict:
        values = dataclasses.asdict(self)
        values["exported"] = list(self.exported)
        return values

    @classmethod
    def from_wire(cls, fields: ClosedObject) -> "Closed":
        cleanup = fields.pop_str("cleanup", max_bytes=16)
        if cleanup not in ("CLEANED", "UNVERIFIED"):
            raise StrictJSONError(f"{fields.path}.cleanup", "must be CLEANED or UNVERIFIED")
        value = cls(
            stage_id=pop_id(fields, "stage_id"),
            journal_id=pop_id(fields, "journal_id"),
            attempt_id=pop_id(fields, "attempt_id"),
            head=fields.pop_sha256("head"),
            tombstone=fields.pop_str("tombstone", max_bytes=4_096),
            cleanup=cleanup,
            diagnostic=fields.pop_str("diagnostic", max_bytes=64, pattern=re.compile(r"[A-Z_]{1,64}\Z"), rule="must be a diagnostic code"),
            exported=tuple(
                check_str(item, path, max_bytes=255, pattern=EVIDENCE_NAME, rule=EVIDENCE_RULE)
                for path, item in fields.pop_list("exported", min_items=0, max_items=MAX_EVIDENCE_FILES)
            ),
        )
        fields.done()
        return value

