"""Strict closed JSON: one reader that refuses, one canonical writer (DESIGN D1, D2).

The reader takes bytes, never text, so nothing upstream can sniff an
encoding. It returns plain ``dict``/``list``/``str``/``int``/``bool``/``None``
values, or raises :class:`StrictJSONError` naming the JSON path and the rule.
Whether the top level must be an object is the schema's rule
(:class:`journal.closed.ClosedObject`), not the reader's.

The writer emits RFC 8785 (JCS) bytes for this profile: integers only, keys
sorted by UTF-16 code units, minimal escapes, no whitespace. It refuses every
value the reader would refuse, so whatever casebox writes it can read back.
"""

from __future__ import annotations

import json
import re

from journal.errors import Refused

MAX_DEPTH = 32
MAX_NODES = 50_000
MAX_SAFE_INTEGER = 2**53 - 1

_BOM = b"\xef\xbb\xbf"
# Longest decimal text of a safe integer, sign included; longer text cannot be in range
# and must never reach int(), which refuses more than 4,300 digits with a ValueError.
_MAX_INT_TEXT = len(str(-MAX_SAFE_INTEGER))
_WHITESPACE = re.compile(r"[ \t\n\r]*")
# A string from its opening quote to its closing quote, or to the end of an
# unterminated document. It always matches at a quote, so a scan never restarts
# inside a string it has already passed: the depth pre-scan stays linear.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _forbidden_code_points() -> re.Pattern[str]:
    ranges = ["\ud800-\udfff", "\ufdd0-\ufdef"]
    for plane in range(17):
        base = plane << 16
        ranges.append(chr(base | 0xFFFE) + "-" + chr(base | 0xFFFF))
    return re.compile("[" + "".join(ranges) + "]")


_FORBIDDEN = _forbidden_code_points()


class StrictJSONError(Refused):
    """A JSON document broke a rule of the closed profile."""

    @property
    def path(self) -> str:
        return self.where


class _Token:
    """A number or constant the profile refuses, kept until its path is known."""

    __slots__ = ("kind", "text")

    def __init__(self, kind: str, text: str) -> None:
        self.kind = kind
        self.text = text


class _Pairs(list):
    """An object's members in document order, before duplicates are checked."""


def _parse_int(text: str) -> int | _Token:
    if len(text) > _MAX_INT_TEXT:
        return _Token("range", text)
    return int(text)


_DECODER = json.JSONDecoder(
    object_pairs_hook=_Pairs,
    parse_float=lambda text: _Token("float", text),
    parse_int=_parse_int,
    parse_constant=lambda text: _Token("constant", text),
    strict=True,
)


def child_path(path: str, key: str | int) -> str:
    """The JSON path of member ``key`` (a name or an index) below ``path``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _IDENTIFIER.match(key):
        return f"{path}.{key}"
    return f"{path}[{json.dumps(key)}]"


# Where a value sits: (parent, key) links up to the root, which is None. The text
# of a path is built only for a refusal, so reading 50,000 values formats none.
_Where = tuple | None


def _path(where: _Where) -> str:
    keys = []
    while where is not None:
        where, key = where
        keys.append(key)
    path = "$"
    for key in reversed(keys):
        path = child_path(path, key)
    return path


def _refused(where: _Where, rule: str) -> StrictJSONError:
    return StrictJSONError(_path(where), rule)


def _too_deep(where: _Where) -> StrictJSONError:
    return _refused(where, f"nests deeper than {MAX_DEPTH} levels of arrays and objects")


def _out_of_range(where: _Where) -> StrictJSONError:
    return _refused(where, "is an integer outside ±(2^53−1)")


class _Budget:
    """Counts values, containers and scalars alike, against MAX_NODES."""

    def __init__(self) -> None:
        self.nodes = 0

    def spend(self, where: _Where) -> None:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise _refused(where, f"is past the document's limit of {MAX_NODES} values")


def _check_depth(text: str) -> None:
    # Measured before parsing so the recursive scanner never gets deep enough to
    # raise RecursionError. Strings are dropped first so their brackets do not count.
    depth = 0
    for bracket in _NOT_BRACKET.sub("", _STRING.sub("", text)):
        if bracket in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise _too_deep(None)
        else:
            depth -= 1


def _check_text(value: str, where: _Where, what: str) -> None:
    if value.isascii():
        # Every forbidden code point is above U+D7FF; ASCII text, the common case, holds none.
        return
    found = _FORBIDDEN.search(value)
    if found is not None:
        code = ord(found.group())
        kind = "a lone surrogate" if 0xD800 <= code <= 0xDFFF else "a noncharacter"
        raise _refused(where, f"{what} holds {kind} (U+{code:04X})")


def _build(raw: object, where: _Where, budget: _Budget) -> object:
    budget.spend(where)
    if isinstance(raw, _Pairs):
        result: dict[str, object] = {}
        for key, member in raw:
            member_where = (where, key)
            _check_text(key, member_where, "the key")
            if key in result:
                raise _refused(member_where, "is a duplicate key")
            result[key] = _build(member, member_where, budget)
        return result
    if type(raw) is list:
        return [_build(item, (where, index), budget) for index, item in enumerate(raw)]
    if type(raw) is str:
        _check_text(raw, where, "the string")
        return raw
    if type(raw) is int:
        if not -MAX_SAFE_INTEGER <= raw <= MAX_SAFE_INTEGER:
            raise _out_of_range(where)
        return raw
    if isinstance(raw, _Token):
        if raw.kind == "range":
            raise _out_of_range(where)
        if raw.kind == "constant":
            raise _refused(where, f"is the non-finite number {raw.text}")
        raise _refused(where, f"is a non-integer number ({raw.text[:24]}); floats are refused")
    if raw is None or raw is True or raw is False:
        return raw
    raise _refused(where, f"holds an unexpected {type(raw).__name__}")


def _not_json(error: json.JSONDecodeError) -> StrictJSONError:
    return StrictJSONError("$", f"is not JSON: {error.msg.lower()} (line {error.lineno}, column {error.colno})")


def loads(data: bytes, *, max_bytes: int) -> object:
    """Parse one closed JSON document of at most ``max_bytes`` bytes."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("strictjson.loads takes bytes")
    data = bytes(data)
    if len(data) > max_bytes:
        raise StrictJSONError("$", f"the document is larger than its {max_bytes}-byte cap")
    if data.startswith(_BOM):
        raise StrictJSONError("$", "the document starts with a byte order mark")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise StrictJSONError("$", f"the document is not valid UTF-8 (byte {error.start})") from None
    start = _WHITESPACE.match(text).end()
    if start == len(text):
        raise StrictJSONError("$", "the document is empty")
    _check_depth(text)
    try:
        raw, end = _DECODER.raw_decode(text, start)
    except json.JSONDecodeError as error:
        raise _not_json(error) from None
    end = _WHITESPACE.match(text, end).end()
    if end != len(text):
        raise StrictJSONError("$", f"has data after the JSON value (at character {end})")
    return _build(raw, None, _Budget())


# The stdlib's C encoder writes exactly RFC 8785's string escapes for this
# profile (only '"', '\\' and C0 controls, as \\b \\t \\n \\f \\r or lowercase
# \\u00xx), so the only rules left to casebox are the profile checks and the key
# order, both applied by _ordered before the encoder sees the value.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False, check_circular=False)


def _utf16_order(key: str) -> bytes:
    return key.encode("utf-16-be", "surrogatepass")


def _ordered(value: object, where: _Where, depth: int, budget: _Budget) -> object:
    """``value`` checked against the profile, each object's members in RFC 8785 key order."""
    budget.spend(where)
    kind = type(value)
    if kind is str:
        _check_text(value, where, "the string")
        return value
    if kind is int:
        if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            raise _out_of_range(where)
        return value
    if value is None or value is True or value is False:
        return value
    if kind is dict:
        if depth == MAX_DEPTH:
            raise _too_deep(where)
        for key in value:
            if type(key) is not str:
                raise _refused(where, f"has a non-string key {key!r}")
            _check_text(key, (where, key), "the key")
        # Code point order is UTF-16 order except above U+FFFF; ASCII keys, the common case, sort as they are.
        keys = sorted(value) if all(key.isascii() for key in value) else sorted(value, key=_utf16_order)
        return {key: _ordered(value[key], (where, key), depth + 1, budget) for key in keys}
    if kind is list or kind is tuple:
        if depth == MAX_DEPTH:
            raise _too_deep(where)
        return [_ordered(item, (where, index), depth + 1, budget) for index, item in enumerate(value)]
    raise _refused(where, f"cannot be written canonically ({kind.__name__})")


def canonical(value: object) -> bytes:
    """RFC 8785 bytes of ``value`` within the profile; raises StrictJSONError outside it."""
    return _ENCODER.encode(_ordered(value, None, 0, _Budget())).encode("utf-8")


def decode_lossy(data: bytes) -> str:
    """Untrusted bytes as profile text: invalid UTF-8, and any code point the profile refuses, become U+FFFD."""
    return _FORBIDDEN.sub("\ufffd", data.decode("utf-8", "replace"))
