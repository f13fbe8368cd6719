"""The cleanup journal's bytes: frame header, record kinds, payload schemas, chain (docs/journal-format.md).

Everything here is pure. The writer and the reader both go through
:func:`decode_payload`, so a record the writer accepts is exactly a record the
reader accepts (J3), and :func:`chain_step` is the one definition of the chain.
"""

from __future__ import annotations

import enum
import hashlib
import re
import struct
from typing import Any, Callable, Mapping

from journal import strictjson
from journal.closed import ClosedObject, check_str
from journal.strictjson import StrictJSONError

HEADER = struct.Struct(">IHBB")
HEADER_BYTES = HEADER.size
ALIGN = 8
MAX_PAYLOAD = 4_096
MAX_FRAME = HEADER_BYTES + MAX_PAYLOAD
CAP = 262_144
RESERVE = 2 * MAX_FRAME
RESERVE_START = CAP - RESERVE
SECTOR = 512
DIGEST_BYTES = 32
GENESIS_DOMAIN = b"casebox.journal.v1 genesis\x00"
RECORD_DOMAIN = b"\x01"
VERSION = 1

MAX_TIME_US = strictjson.MAX_SAFE_INTEGER
MAX_PID = 4_194_304
MAX_WAIT_STATUS = 0xFFFF
MAX_COUNT = 2**32 - 1
MAX_HELPER_ATTEMPT = 255
MAX_TARGET_BYTES = 4_095

ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
ID_RULE = "must be an id: 1 to 64 of A-Z a-z 0-9 . _ -, starting alphanumeric"
# The steward names a sandbox that had the host's network <stage>-<n>-net (docs/launcher.md), so every op
# id of it (<sandbox>.launcher, .init, .mount-N, .op-N) tells a reviewer and the evaluator so.
NETWORK_SANDBOX_SUFFIX = "-net"
TARGET = re.compile(r"(?:/\Z|(?:/(?!\.\.?(?:/|\Z))[!-.0-~]+)+\Z)")
NOTE = re.compile(r"[ -~]*\Z")

ROLES = ("launcher", "stage", "outer", "helper", "root_peer", "namespace", "descendant")
REAPERS = ("steward", "launcher", "runner", "cleanup")
MOUNT_KINDS = ("bind", "tree", "tmpfs", "proc")
HELPER_OUTCOMES = ("CLEANED", "UNVERIFIED", "MISSING", "INVALID", "NONZERO", "SIGNALLED", "UNREAPED")
CLEANUP_OUTCOMES = ("CLEANED", "UNVERIFIED")


def sandbox_of(op_id: str) -> str | None:
    """The sandbox an op id belongs to (``<sandbox>.<what>``), or None for the steward's own operations,
    whose ids hold no dot (``helper-N``, ``output-NAME-mount``)."""
    sandbox, dot, _ = op_id.partition(".")
    return sandbox if dot else None


def networked_sandbox(sandbox: str) -> bool:
    """True when the sandbox so named had the host's network."""
    return sandbox.endswith(NETWORK_SANDBOX_SUFFIX)


def networked_op(op_id: str) -> bool:
    """True when ``op_id`` belongs to a sandbox that had the host's network."""
    sandbox = sandbox_of(op_id)
    return sandbox is not None and networked_sandbox(sandbox)


class Kind(enum.IntEnum):
    GENESIS = 1
    PROCESS_INTENT = 2
    PROCESS_RELEASED = 3
    PROCESS_TERMINAL = 4
    DESCENDANTS_TERMINAL = 5
    MOUNT_INTENT = 6
    MOUNT_DONE = 7
    UNMOUNT_INTENT = 8
    UNMOUNT_DONE = 9
    HELPER_ATTEMPT = 10
    CLEANUP_EVIDENCE = 11
    RETIREMENT_INTENT = 12
    RETIRED = 13


RETIREMENT_KINDS = frozenset({Kind.RETIREMENT_INTENT, Kind.RETIRED})
KINDS_BY_NUMBER = {int(kind): kind for kind in Kind}


class FrameError(Exception):
    """One frame broke a format rule; ``reason`` is the sentence a reviewer reads."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def padded(length: int) -> int:
    """``length`` rounded up to the next multiple of 8."""
    return -(-length // ALIGN) * ALIGN


def genesis_digest(journal_id: str, stage_id: str) -> bytes:
    """d0: the chain's starting value, bound to the journal and the stage."""
    journal = journal_id.encode("ascii")
    stage = stage_id.encode("ascii")
    return hashlib.sha256(
        GENESIS_DOMAIN + bytes((len(journal),)) + journal + bytes((len(stage),)) + stage
    ).digest()


def chain_step(previous: bytes, header: bytes, payload: bytes) -> bytes:
    """d_i = SHA-256(0x01 ‖ d_{i-1} ‖ header ‖ payload); padding is not hashed, it is checked zero."""
    return hashlib.sha256(RECORD_DOMAIN + previous + header + payload).digest()


def encode_header(kind: Kind, length: int) -> bytes:
    return HEADER.pack(length, kind, VERSION, 0)


def check_header(length: int, kind_number: int, version: int, reserved: int) -> Kind:
    """The record kind named by a header, or FrameError for any header rule broken."""
    if reserved != 0:
        raise FrameError(f"the header's reserved byte is {reserved}, not 0")
    if not 1 <= length <= MAX_PAYLOAD:
        raise FrameError(f"the header's payload length is {length}, outside 1 to {MAX_PAYLOAD}")
    kind = KINDS_BY_NUMBER.get(kind_number)
    if kind is None:
        raise FrameError(f"the header names unknown record kind {kind_number}")
    if version != VERSION:
        raise FrameError(f"the header gives {kind.name} unknown version {version}")
    return kind


def encode_frame(kind: Kind, payload: bytes) -> bytes:
    """Header, payload and zero padding: the bytes one append writes."""
    return encode_header(kind, len(payload)) + payload + bytes(padded(len(payload)) - len(payload))


# Payload schemas: each kind's frozen keys, every one required, none other allowed.

def check_id(value: object, where: str) -> str:
    """The one id rule: journal, stage, attempt and op ids, here, in receipts, seal markers and the steward."""
    return check_str(value, where, max_bytes=64, pattern=ID, rule=ID_RULE)


def pop_id(fields: ClosedObject, key: str) -> str:
    return fields.pop_str(key, max_bytes=64, pattern=ID, rule=ID_RULE)


def _time(fields: ClosedObject, key: str) -> int:
    return fields.pop_int(key, low=0, high=MAX_TIME_US)


def _pid(fields: ClosedObject, key: str) -> int:
    return fields.pop_int(key, low=1, high=MAX_PID)


def _one_of(fields: ClosedObject, key: str, allowed: tuple[str, ...]) -> str:
    value = fields.pop_str(key, max_bytes=32)
    if value not in allowed:
        raise StrictJSONError(f"{fields.path}.{key}", f"must be one of {', '.join(allowed)}")
    return value


def is_terminated_status(status: int) -> bool:
    """Whether ``status`` is the raw wait status of an exit or a signal death (not stopped, not continued)."""
    exited = status & 0xFF == 0
    signalled = status >> 8 == 0 and 1 <= status & 0x7F <= 0x7E
    return 0 <= status <= MAX_WAIT_STATUS and (exited or signalled)


def _wait_status(fields: ClosedObject, key: str) -> int:
    status = fields.pop_int(key, low=0, high=MAX_WAIT_STATUS)
    if not is_terminated_status(status):
        raise StrictJSONError(f"{fields.path}.{key}", f"{status:#06x} is not the raw status of a terminated process")
    return status


def _target(fields: ClosedObject, key: str) -> str:
    return fields.pop_str(
        key,
        max_bytes=MAX_TARGET_BYTES,
        pattern=TARGET,
        rule="must be a normalized absolute path of printable ASCII without spaces",
    )


def _note(fields: ClosedObject, key: str) -> str:
    return fields.pop_str(key, max_bytes=MAX_PAYLOAD, pattern=NOTE, rule="must be printable ASCII")


def _genesis(fields: ClosedObject) -> dict:
    return {
        "attempt_id": pop_id(fields, "attempt_id"),
        "created": _time(fields, "created"),
        "journal_id": pop_id(fields, "journal_id"),
        "stage_id": pop_id(fields, "stage_id"),
    }


def _process_intent(fields: ClosedObject) -> dict:
    return {
        "op_id": pop_id(fields, "op_id"),
        "role": _one_of(fields, "role", ROLES),
        "pid": _pid(fields, "pid"),
        "starttime": fields.pop_int("starttime", low=0, high=strictjson.MAX_SAFE_INTEGER),
        "pgid": _pid(fields, "pgid"),
    }


def _op_only(fields: ClosedObject) -> dict:
    return {"op_id": pop_id(fields, "op_id")}


def _process_terminal(fields: ClosedObject) -> dict:
    return {
        "op_id": pop_id(fields, "op_id"),
        "wait_status": _wait_status(fields, "wait_status"),
        "reaper": _one_of(fields, "reaper", REAPERS),
    }


def _descendants_terminal(fields: ClosedObject) -> dict:
    return {"op_id": pop_id(fields, "op_id"), "count": fields.pop_int("count", low=0, high=MAX_COUNT)}


def _mount(fields: ClosedObject) -> dict:
    return {
        "op_id": pop_id(fields, "op_id"),
        "target": _target(fields, "target"),
        "kind": _one_of(fields, "kind", MOUNT_KINDS),
    }


def _helper_attempt(fields: ClosedObject) -> dict:
    return {
        "attempt": fields.pop_int("attempt", low=1, high=MAX_HELPER_ATTEMPT),
        "response_digest": fields.pop_sha256("response_digest"),
        "outcome": _one_of(fields, "outcome", HELPER_OUTCOMES),
    }


def _cleanup_evidence(fields: ClosedObject) -> dict:
    return {
        "outcome": _one_of(fields, "outcome", CLEANUP_OUTCOMES),
        "journal_head": fields.pop_sha256("journal_head"),
        "process_inventory_digest": fields.pop_sha256("process_inventory_digest"),
        "mount_inventory_digest": fields.pop_sha256("mount_inventory_digest"),
        "preceding_process_digest": fields.pop_sha256("preceding_process_digest"),
    }


def _retirement(fields: ClosedObject) -> dict:
    return {"note": _note(fields, "note")}


# The caller-owned keys of each kind; the writer adds "prev" and the time key.
SCHEMAS: Mapping[Kind, Callable[[ClosedObject], dict]] = {
    Kind.GENESIS: _genesis,
    Kind.PROCESS_INTENT: _process_intent,
    Kind.PROCESS_RELEASED: _op_only,
    Kind.PROCESS_TERMINAL: _process_terminal,
    Kind.DESCENDANTS_TERMINAL: _descendants_terminal,
    Kind.MOUNT_INTENT: _mount,
    Kind.MOUNT_DONE: _mount,
    Kind.UNMOUNT_INTENT: _mount,
    Kind.UNMOUNT_DONE: _mount,
    Kind.HELPER_ATTEMPT: _helper_attempt,
    Kind.CLEANUP_EVIDENCE: _cleanup_evidence,
    Kind.RETIREMENT_INTENT: _retirement,
    Kind.RETIRED: _retirement,
}


def time_key(kind: Kind) -> str:
    """GENESIS carries its creation time as ``created``; every other record as ``at``."""
    return "created" if kind is Kind.GENESIS else "at"


def check_fields(kind: Kind, value: Any) -> dict[str, Any]:
    """The fields of a decoded payload value, checked against the kind's frozen schema."""
    fields = ClosedObject(value, "$")
    checked = {"prev": fields.pop_sha256("prev")}
    if kind is not Kind.GENESIS:
        checked["at"] = _time(fields, "at")
    checked.update(SCHEMAS[kind](fields))
    fields.done()
    return checked


def decode_payload(kind: Kind, payload: bytes) -> dict[str, Any]:
    """The fields of a stored payload, checked against the kind's frozen schema.

    The bytes must be exactly the canonical encoding of their value (J3, D2), so
    each record has one encoding; the digest is taken over these bytes as stored.
    """
    value = strictjson.loads(payload, max_bytes=MAX_PAYLOAD)
    checked = check_fields(kind, value)
    if strictjson.canonical(value) != payload:
        raise StrictJSONError("$", "the payload is not in canonical form (RFC 8785, no whitespace, sorted keys)")
    return checked


def encode_payload(kind: Kind, fields: Mapping[str, Any]) -> tuple[bytes, dict[str, Any]]:
    """Canonical payload bytes for ``fields`` and the checked fields; refused unless the reader would accept them.

    The schema check is the reader's own; the canonical bytes of a value of this
    profile decode back to that value, so the reader sees exactly these fields.
    """
    checked = check_fields(kind, dict(fields))
    payload = strictjson.canonical(checked)
    if len(payload) > MAX_PAYLOAD:
        raise StrictJSONError("$", f"the {kind.name} payload is {len(payload)} bytes, over the {MAX_PAYLOAD}-byte frame limit")
    return payload, checked
