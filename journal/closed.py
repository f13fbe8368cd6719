"""Closed-object field popping, in python-tuf's ``from_dict`` style, one step stricter.

Each field is popped with its exact type (``type(x) is int``, so a bool is not
an int) and its bounds; a missing field is refused, and so is any field still
left when the caller calls :meth:`ClosedObject.done`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from journal.strictjson import StrictJSONError, child_path

_MISSING = object()
SHA256_HEX = re.compile(r"[0-9a-f]{64}\Z")
# A digest named with its algorithm, as plans, inventories and receipts write it.
SHA256_DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")


def _type_name(value: object) -> str:
    return {bool: "a bool", int: "an integer", str: "a string", list: "an array", dict: "an object"}.get(
        type(value), "null" if value is None else type(value).__name__
    )


class ClosedObject:
    """One JSON object whose every field must be popped exactly once."""

    def __init__(self, value: object, path: str = "$") -> None:
        if type(value) is not dict:
            raise StrictJSONError(path, f"must be an object, not {_type_name(value)}")
        self._rest = dict(value)
        self.path = path

    def _pop(self, key: str, expected: type, noun: str) -> object:
        value = self._rest.pop(key, _MISSING)
        if value is _MISSING:
            raise StrictJSONError(child_path(self.path, key), "is missing")
        if type(value) is not expected:
            raise StrictJSONError(child_path(self.path, key), f"must be {noun}, not {_type_name(value)}")
        return value

    def has(self, key: str) -> bool:
        return key in self._rest

    def keys(self) -> list[str]:
        """The fields not popped yet, sorted (for an object whose keys are data, such as an environment)."""
        return sorted(self._rest)

    def pop_int(self, key: str, *, low: int, high: int) -> int:
        value = self._pop(key, int, "an integer")
        if not low <= value <= high:
            raise StrictJSONError(child_path(self.path, key), f"must be from {low} to {high}, not {value}")
        return value

    def pop_bool(self, key: str) -> bool:
        return self._pop(key, bool, "a bool")

    def pop_str(
        self,
        key: str,
        *,
        max_bytes: int,
        pattern: re.Pattern[str] | None = None,
        rule: str = "",
        ascii_only: bool = False,
        allow_nul: bool = False,
    ) -> str:
        value = self._pop(key, str, "a string")
        return check_str(
            value,
            child_path(self.path, key),
            max_bytes=max_bytes,
            pattern=pattern,
            rule=rule,
            ascii_only=ascii_only,
            allow_nul=allow_nul,
        )

    def pop_const(self, key: str, expected: str) -> str:
        value = self._pop(key, str, "a string")
        if value != expected:
            raise StrictJSONError(child_path(self.path, key), f"must be {expected!r}")
        return value

    def pop_sha256(self, key: str) -> str:
        return self.pop_str(key, max_bytes=64, pattern=SHA256_HEX, rule="must be 64 lowercase hex digits")

    def pop_digest(self, key: str) -> str:
        return check_digest(self._pop(key, str, "a string"), child_path(self.path, key))

    def pop_list(self, key: str, *, min_items: int, max_items: int) -> Iterator[tuple[str, object]]:
        """Each item of an array field, with its path, after the length is checked."""
        value = self._pop(key, list, "an array")
        path = child_path(self.path, key)
        if not min_items <= len(value) <= max_items:
            raise StrictJSONError(path, f"must hold {min_items} to {max_items} items, not {len(value)}")
        return ((child_path(path, index), item) for index, item in enumerate(value))

    def pop_object(self, key: str) -> "ClosedObject":
        value = self._pop(key, dict, "an object")
        return ClosedObject(value, child_path(self.path, key))

    def pop_nullable(self, key: str) -> object:
        """Pop a field whose value may be null; the caller checks a non-null value."""
        value = self._rest.pop(key, _MISSING)
        if value is _MISSING:
            raise StrictJSONError(child_path(self.path, key), "is missing")
        return value

    def pop_nullable_int(self, key: str, *, high: int) -> int | None:
        """Pop a field that is null or an integer from 0 to ``high``."""
        value = self.pop_nullable(key)
        if value is not None and (type(value) is not int or not 0 <= value <= high):
            raise StrictJSONError(child_path(self.path, key), f"must be null or an integer from 0 to {high}")
        return value

    def done(self) -> None:
        if self._rest:
            key = sorted(self._rest)[0]
            raise StrictJSONError(child_path(self.path, key), "is not a known field")


def check_str(
    value: object,
    path: str,
    *,
    max_bytes: int,
    pattern: re.Pattern[str] | None = None,
    rule: str = "",
    ascii_only: bool = False,
    allow_nul: bool = False,
) -> str:
    """Refuse a string that is too long, holds NUL, is not ASCII or misses its pattern."""
    if type(value) is not str:
        raise StrictJSONError(path, f"must be a string, not {_type_name(value)}")
    size = len(value.encode("utf-8"))
    if size > max_bytes:
        raise StrictJSONError(path, f"must be at most {max_bytes} bytes, not {size}")
    if not allow_nul and "\x00" in value:
        raise StrictJSONError(path, "must not contain NUL")
    if ascii_only and not value.isascii():
        raise StrictJSONError(path, "must be ASCII")
    if pattern is not None and not pattern.match(value):
        raise StrictJSONError(path, rule or f"must match {pattern.pattern}")
    return value


def check_digest(value: object, path: str) -> str:
    """Refuse anything but ``sha256:`` followed by 64 lowercase hex digits."""
    return check_str(value, path, max_bytes=71, pattern=SHA256_DIGEST, rule="must be sha256: and 64 lowercase hex digits")
