"""The cleanup journal's bytes: frame header, record kinds, payload schemas, chain (docs/journal-format.md).

Everything here is pure. The writer and the reader both go through
:func:`decode_payload`, so a record the writer accepts is exactly a record the
reader accepts (J3), and :func:`chain_step` is the one definition of the chain.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import re
import struct
from typing import Any, Mapping

from journal import strictjson
from journal.closed import SHA256_HEX, ClosedObject, check_str
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

ID_BODY = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
ID_RULE = "must be an id: 1 to 64 of A-Z a-z 0-9 . _ -, starting alphanumeric"
# "/", or segments of 0x21-0x7e but "/", none of them "." or "..": a segment
# starts with up to two dots and then another character, or with three dots.
TARGET_BODY = r"/|(?:/(?:\.{0,2}[!-\-0-~]|\.{3})[!-.0-~]*)+"
NOTE_BODY = r"[ -~]*"
ID = re.compile(f"(?:{ID_BODY})\\Z")
TARGET = re.compile(f"(?:{TARGET_BODY})\\Z")
NOTE = re.compile(f"(?:{NOTE_BODY})\\Z")
# The steward names a sandbox that had the index network <stage>-<n>-net (docs/launcher.md), so every op
# id of it (<sandbox>.launcher, .init, .mount-N, .op-N) tells a reviewer and the evaluator so.
NETWORK_SANDBOX_SUFFIX = "-net"

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
    """True when the sandbox so named had the index network (the forwarder to a network index)."""
    return sandbox.endswith(NETWORK_SANDBOX_SUFFIX)


def networked_op(op_id: str) -> bool:
    """True when ``op_id`` belongs to a sandbox that had the index network."""
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
    SANDBOX_READY = 14


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


# The chain's hash with its domain byte already fed: copying it costs half of what a new hashlib.sha256()
# does (OpenSSL 3 looks the algorithm up for each new object), once per record read (issue 14).
_RECORD_HASH = hashlib.sha256(RECORD_DOMAIN)


def chain_step(previous: bytes, header: bytes, payload: bytes) -> bytes:
    """d_i = SHA-256(0x01 ‖ d_{i-1} ‖ header ‖ payload); padding is not hashed, it is checked zero."""
    step = _RECORD_HASH.copy()
    step.update(previous)
    step.update(header)
    step.update(payload)
    return step.digest()


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


# Payload schemas (docs/journal-format.md, "Value types" and "Record kinds").
#
# Each value type is one rule read two ways. ``pop`` takes the field from a
# parsed object: the writer's check, and the reader's exact diagnosis of a
# payload. ``fragment`` is the regular expression of the field's canonical
# encoding; the reader's one-pass check of a kind (Layout) is built from the
# fragments of that kind's keys, so it is the same table, not a second schema.


def is_terminated_status(status: int) -> bool:
    """Whether ``status`` is the raw wait status of an exit or a signal death (not stopped, not continued)."""
    exited = status & 0xFF == 0
    signalled = status >> 8 == 0 and 1 <= status & 0x7F <= 0x7E
    return 0 <= status <= MAX_WAIT_STATUS and (exited or signalled)


class Integer:
    """An integer from ``low`` (at least 0) to ``high``; canonical text is its shortest decimal."""

    quotes = 0

    def __init__(self, low: int, high: int) -> None:
        assert 0 <= low <= high
        self.low = low
        self.high = high

    def admits(self, value: int) -> bool:
        return self.low <= value <= self.high

    def pop(self, fields: ClosedObject, key: str) -> int:
        return fields.pop_int(key, low=self.low, high=self.high)

    def fragment(self, group: str) -> str:
        # No more digits than ``high`` has: int() refuses a text over 4,300 digits with a ValueError.
        return f"(?P<{group}>0|[1-9][0-9]{{0,{len(str(self.high)) - 1}}})"


class WaitStatus(Integer):
    """A raw wait status of a terminated process (an exit or a signal death)."""

    def __init__(self) -> None:
        super().__init__(0, MAX_WAIT_STATUS)

    def admits(self, value: int) -> bool:
        return is_terminated_status(value)

    def pop(self, fields: ClosedObject, key: str) -> int:
        status = super().pop(fields, key)
        if not is_terminated_status(status):
            raise StrictJSONError(f"{fields.path}.{key}", f"{status:#06x} is not the raw status of a terminated process")
        return status


class Text:
    """A string of printable ASCII matching ``body``, at most ``max_bytes`` long."""

    quotes = 2

    def __init__(self, body: str, max_bytes: int, rule: str) -> None:
        self.body = body
        self.max_bytes = max_bytes
        self.rule = rule
        self.pattern = re.compile(f"(?:{body})\\Z")

    def pop(self, fields: ClosedObject, key: str) -> str:
        return fields.pop_str(key, max_bytes=self.max_bytes, pattern=self.pattern, rule=self.rule)

    def fragment(self, group: str) -> str:
        # The lookahead bounds the length: the one-pass check admits no '"' inside a value.
        return f'"(?=[^"]{{0,{self.max_bytes}}}")(?P<{group}>{self.body})"'


class OneOf:
    """One string of a closed set."""

    quotes = 2

    def __init__(self, members: tuple[str, ...]) -> None:
        assert all(NOTE.match(member) and len(member) <= 32 for member in members)
        self.members = members

    def pop(self, fields: ClosedObject, key: str) -> str:
        value = fields.pop_str(key, max_bytes=32)
        if value not in self.members:
            raise StrictJSONError(f"{fields.path}.{key}", f"must be one of {', '.join(self.members)}")
        return value

    def fragment(self, group: str) -> str:
        return f'"(?P<{group}>{"|".join(re.escape(member) for member in self.members)})"'


class Sha256(Text):
    """A SHA-256 as 64 lowercase hex digits: the one digest rule (``ClosedObject.pop_sha256``), its pattern the fragment."""

    def __init__(self) -> None:
        super().__init__(SHA256_HEX.pattern.removesuffix("\\Z"), 64, "")

    def pop(self, fields: ClosedObject, key: str) -> str:
        return fields.pop_sha256(key)


IDENTIFIER = Text(ID_BODY, 64, ID_RULE)
DIGEST = Sha256()
TIME = Integer(0, MAX_TIME_US)
PID = Integer(1, MAX_PID)
_STARTTIME = Integer(0, strictjson.MAX_SAFE_INTEGER)
_TARGET = Text(TARGET_BODY, MAX_TARGET_BYTES, "must be a normalized absolute path of printable ASCII without spaces")
_MOUNT = (("op_id", IDENTIFIER), ("target", _TARGET), ("kind", OneOf(MOUNT_KINDS)))
_NOTE = (("note", Text(NOTE_BODY, MAX_PAYLOAD, "must be printable ASCII")),)


def check_id(value: object, where: str) -> str:
    """The one id rule: journal, stage, attempt and op ids, here, in receipts, seal markers and the steward."""
    return check_str(value, where, max_bytes=64, pattern=ID, rule=ID_RULE)


def pop_id(fields: ClosedObject, key: str) -> str:
    return IDENTIFIER.pop(fields, key)


# The caller-owned keys of each kind; the writer adds "prev" and the time key.
SCHEMAS: Mapping[Kind, tuple[tuple[str, Integer | Text | OneOf], ...]] = {
    Kind.GENESIS: (("attempt_id", IDENTIFIER), ("created", TIME), ("journal_id", IDENTIFIER), ("stage_id", IDENTIFIER)),
    Kind.PROCESS_INTENT: (
        ("op_id", IDENTIFIER),
        ("role", OneOf(ROLES)),
        ("pid", PID),
        ("starttime", _STARTTIME),
        ("pgid", PID),
    ),
    Kind.PROCESS_RELEASED: (("op_id", IDENTIFIER),),
    Kind.PROCESS_TERMINAL: (("op_id", IDENTIFIER), ("wait_status", WaitStatus()), ("reaper", OneOf(REAPERS))),
    Kind.DESCENDANTS_TERMINAL: (("op_id", IDENTIFIER), ("count", Integer(0, MAX_COUNT))),
    Kind.MOUNT_INTENT: _MOUNT,
    Kind.MOUNT_DONE: _MOUNT,
    Kind.UNMOUNT_INTENT: _MOUNT,
    Kind.UNMOUNT_DONE: _MOUNT,
    Kind.HELPER_ATTEMPT: (
        ("attempt", Integer(1, MAX_HELPER_ATTEMPT)),
        ("response_digest", DIGEST),
        ("outcome", OneOf(HELPER_OUTCOMES)),
    ),
    Kind.CLEANUP_EVIDENCE: (
        ("outcome", OneOf(CLEANUP_OUTCOMES)),
        ("journal_head", DIGEST),
        ("process_inventory_digest", DIGEST),
        ("mount_inventory_digest", DIGEST),
        ("preceding_process_digest", DIGEST),
    ),
    Kind.RETIREMENT_INTENT: _NOTE,
    Kind.RETIRED: _NOTE,
    Kind.SANDBOX_READY: (("op_id", IDENTIFIER), ("filter_digest", DIGEST)),
}


def time_key(kind: Kind) -> str:
    """GENESIS carries its creation time as ``created``; every other record as ``at``."""
    return "created" if kind is Kind.GENESIS else "at"


def _keys(kind: Kind) -> tuple[tuple[str, Integer | Text | OneOf], ...]:
    """Every key of a kind's payload with its type, in the payload's order (code-point order, all ASCII)."""
    keys = (("prev", DIGEST),) + ((("at", TIME),) if kind is not Kind.GENESIS else ()) + SCHEMAS[kind]
    assert all(key.isidentifier() and key.isascii() for key, _ in keys)
    return tuple(sorted(keys, key=lambda pair: pair[0]))


KEYS = {kind: _keys(kind) for kind in Kind}


def check_fields(kind: Kind, value: Any) -> dict[str, Any]:
    """The fields of a decoded payload value, checked against the kind's frozen schema."""
    fields = ClosedObject(value, "$")
    checked = {key: value_type.pop(fields, key) for key, value_type in KEYS[kind]}
    fields.done()
    return checked


class Layout:
    """One kind's canonical payload as one regular expression over its text.

    A payload matches when it is the canonical encoding of an object with
    exactly the kind's keys, each value of its type: the keys in code-point
    order, no whitespace, integers in their shortest decimal, strings without
    escapes. Two conditions make the fragments exact: the payload holds no
    backslash (so no string is escaped) and exactly the quotes the keys and
    string values account for (so no value holds a quote). The integers'
    bounds are checked after the match.
    """

    def __init__(self, kind: Kind) -> None:
        keys = KEYS[kind]
        self.quotes = sum(2 + value_type.quotes for _, value_type in keys)
        self.integers = tuple((key, value_type) for key, value_type in keys if isinstance(value_type, Integer))
        self.pattern = re.compile("{" + ",".join(f'"{key}":{value_type.fragment(key)}' for key, value_type in keys) + "}")

    def fields(self, payload: bytes) -> dict[str, Any] | None:
        """The payload's fields when it matches, else None (the exact path then decides)."""
        return self.fields_at(payload.decode("latin-1"), 0, len(payload))

    def _match(self, text: str, start: int, stop: int) -> re.Match | None:
        if text.find("\\", start, stop) >= 0 or text.count('"', start, stop) != self.quotes:
            return None
        # No fragment holds ^ or a lookbehind, so matching inside the bounds is matching the slice.
        return self.pattern.fullmatch(text, start, stop)

    def fields_at(self, text: str, start: int, stop: int) -> dict[str, Any] | None:
        """The same check of a payload held as ``text[start:stop]`` (each byte one character), read in place."""
        match = self._match(text, start, stop)
        if match is None:
            return None
        fields = match.groupdict()
        for key, number in self.integers:
            value = int(fields[key])
            if not number.admits(value):
                return None
            fields[key] = value
        return fields

    def admits(self, text: str, fields: Mapping[str, Any]) -> bool:
        """Whether ``text``, written from ``fields`` with each value as its canonical text, is their canonical
        payload: the same match as :meth:`fields`, and each integer of ``fields`` within its bounds (the
        match then says the text holds exactly these values, so they need not be read back out of it)."""
        if self._match(text, 0, len(text)) is None:
            return False
        for key, number in self.integers:
            if not number.admits(fields[key]):
                return False
        return True


@functools.cache
def layout(kind: Kind) -> Layout:
    """The kind's layout, compiled on its first use: compiling all of them when this module is imported would
    cost every command that imports it about 2 ms."""
    return Layout(kind)


def parse_payload(kind: Kind, payload: bytes) -> dict[str, Any]:
    """The exact reading of a payload: strict parse, schema check, then re-encoding to compare (names the rule broken)."""
    value = strictjson.loads(payload, max_bytes=MAX_PAYLOAD)
    checked = check_fields(kind, value)
    if strictjson.canonical(value) != payload:
        raise StrictJSONError("$", "the payload is not in canonical form (RFC 8785, no whitespace, sorted keys)")
    return checked


def decode_payload(kind: Kind, payload: bytes, text: str | None = None, start: int = 0) -> dict[str, Any]:
    """The fields of a stored payload, checked against the kind's frozen schema.

    The bytes must be exactly the canonical encoding of their value (J3, D2), so
    each record has one encoding; the digest is taken over these bytes as stored.
    A payload its kind's layout matches is that, in one pass; any other (a
    string with an escape, or a payload the reader refuses) takes the exact
    reading, which accepts it or names the rule it breaks. ``text`` may hold the payload
    as ``text[start:start + len(payload)]``, each byte one character (the reader's whole journal), so the
    one pass reads it in place.
    """
    if text is None:
        fields = layout(kind).fields(payload)
    else:
        fields = layout(kind).fields_at(text, start, start + len(payload))
    return parse_payload(kind, payload) if fields is None else fields


def _one_pass_payload(kind: Kind, fields: Mapping[str, Any]) -> tuple[bytes, dict[str, Any]] | None:
    """The payload of ``fields`` written in one pass and accepted by the reader's own one-pass check (the
    kind's layout), or None when that check does not accept it (then the exact path decides).

    Each value is written as its canonical text would be if it needs no
    escape: an integer in decimal, a string between quotes. A text the layout
    matches is the canonical encoding of exactly the kind's keys with values
    of their types, and its fields are the values written; anything else (a
    bool, a quote or backslash in a note, a missing or extra key) does not
    match, so this path never accepts what the reader would not.
    """
    template, keys, types = _writing_plan(kind)
    if len(fields) != len(keys):
        return None
    values = tuple(map(fields.get, keys))
    if tuple(map(type, values)) != types:
        return None
    text = template % values
    if not text.isascii() or not layout(kind).admits(text, fields):
        return None
    return text.encode("ascii"), dict(fields)


@functools.cache
def _writing_plan(kind: Kind) -> tuple[str, tuple[str, ...], tuple[type, ...]]:
    """A kind's payload as a %-template (an integer's text bare, a string's between quotes), its keys in
    payload order, and the Python type each value must have to be written so."""
    keys = tuple(key for key, _ in KEYS[kind])
    types = tuple(int if isinstance(value_type, Integer) else str for _, value_type in KEYS[kind])
    template = "{" + ",".join(f'"{key}":%s' if wanted is int else f'"{key}":"%s"' for key, wanted in zip(keys, types)) + "}"
    return template, keys, types


def encode_payload(kind: Kind, fields: Mapping[str, Any]) -> tuple[bytes, dict[str, Any]]:
    """Canonical payload bytes for ``fields`` and the checked fields; refused unless the reader would accept them.

    The check is the reader's own: its one-pass layout for a payload written
    in one pass, else the schema check, whose canonical bytes of a value of
    this profile decode back to that value, so the reader sees exactly these
    fields. A payload over the frame limit is refused either way.
    """
    fast = _one_pass_payload(kind, fields)
    if fast is not None:
        payload, checked = fast
    else:
        checked = check_fields(kind, dict(fields))
        payload = strictjson.canonical(checked)
    if len(payload) > MAX_PAYLOAD:
        raise StrictJSONError("$", f"the {kind.name} payload is {len(payload)} bytes, over the {MAX_PAYLOAD}-byte frame limit")
    return payload, checked
