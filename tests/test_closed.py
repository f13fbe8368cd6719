"""Closed objects: every field popped with its exact type, nothing left over (D1)."""

from __future__ import annotations

import re

import pytest

from journal.closed import ClosedObject, check_str
from journal.strictjson import StrictJSONError, loads


def closed(document: bytes, path: str = "$") -> ClosedObject:
    return ClosedObject(loads(document, max_bytes=4096), path)


def refused_by(action) -> StrictJSONError:
    with pytest.raises(StrictJSONError) as caught:
        action()
    return caught.value


@pytest.mark.parametrize(
    ("value", "noun"),
    [([], "an array"), ("s", "a string"), (1, "an integer"), (True, "a bool"), (None, "null")],
)
def test_top_level_must_be_an_object(value, noun):
    """D1: a document whose top level is not an object is refused at its path."""
    error = refused_by(lambda: ClosedObject(value, "$.x"))
    assert error.where == "$.x"
    assert error.rule == f"must be an object, not {noun}"


@pytest.mark.parametrize("document", [b'{"n":true}', b'{"n":false}'])
def test_a_bool_is_not_an_int(document):
    """D1: true and false are refused where an integer is expected (type(x) is int, not isinstance)."""
    error = refused_by(lambda: closed(document).pop_int("n", low=0, high=10))
    assert error.where == "$.n"
    assert error.rule == "must be an integer, not a bool"


@pytest.mark.parametrize(("document", "noun"), [(b'{"b":1}', "an integer"), (b'{"b":0}', "an integer"), (b'{"b":"true"}', "a string"), (b'{"b":null}', "null")])
def test_an_int_is_not_a_bool(document, noun):
    """D1: 1, 0, "true" and null are refused where a bool is expected."""
    error = refused_by(lambda: closed(document).pop_bool("b"))
    assert error.where == "$.b"
    assert error.rule == f"must be a bool, not {noun}"


@pytest.mark.parametrize(
    ("pop", "document", "rule"),
    [
        (lambda fields: fields.pop_str("k", max_bytes=9), b'{"k":1}', "must be a string, not an integer"),
        (lambda fields: fields.pop_list("k", min_items=0, max_items=9), b'{"k":{}}', "must be an array, not an object"),
        (lambda fields: fields.pop_object("k"), b'{"k":[]}', "must be an object, not an array"),
        (lambda fields: fields.pop_const("k", "v1"), b'{"k":["v1"]}', "must be a string, not an array"),
        (lambda fields: fields.pop_sha256("k"), b'{"k":null}', "must be a string, not null"),
    ],
)
def test_each_pop_checks_the_exact_type(pop, document, rule):
    """D1: every typed pop refuses a value of another JSON type, naming the field."""
    error = refused_by(lambda: pop(closed(document)))
    assert (error.where, error.rule) == ("$.k", rule)


def test_a_missing_field_is_named():
    """D1: a field that is absent is refused as missing, with its full path."""
    fields = closed(b'{"a":{"b":1}}').pop_object("a")
    error = refused_by(lambda: fields.pop_int("c", low=0, high=1))
    assert (error.where, error.rule) == ("$.a.c", "is missing")
    assert refused_by(lambda: closed(b"{}").pop_nullable("n")).rule == "is missing"


def test_a_leftover_field_is_refused():
    """D1: done() refuses any field nobody popped, naming the first in sorted order."""
    fields = closed(b'{"known":1,"zz":2,"extra":3}')
    fields.pop_int("known", low=0, high=1)
    error = refused_by(fields.done)
    assert (error.where, error.rule) == ("$.extra", "is not a known field")


def test_done_accepts_when_every_field_was_popped():
    """D1: an object whose every field was popped passes done()."""
    fields = closed(b'{"a":1,"b":null}')
    assert fields.has("a") and not fields.has("c")
    assert fields.pop_int("a", low=1, high=1) == 1
    assert fields.pop_nullable("b") is None
    assert not fields.has("a")
    fields.done()


def test_a_field_cannot_be_popped_twice():
    """D1: popping consumes the field, so a second pop of the same name is missing."""
    fields = closed(b'{"a":1}')
    fields.pop_int("a", low=0, high=1)
    assert refused_by(lambda: fields.pop_int("a", low=0, high=1)).rule == "is missing"


def test_the_caller_value_is_not_consumed():
    """D1: popping works on a copy, so the parsed value stays whole for hashing."""
    value = loads(b'{"a":1}', max_bytes=64)
    ClosedObject(value).pop_int("a", low=0, high=1)
    assert value == {"a": 1}


def test_integer_bounds_are_inclusive():
    """D1: an integer field accepts its bounds and refuses one past each."""
    assert closed(b'{"n":1}').pop_int("n", low=1, high=5) == 1
    assert closed(b'{"n":5}').pop_int("n", low=1, high=5) == 5
    for text in (b"0", b"6", b"-1"):
        error = refused_by(lambda: closed(b'{"n":' + text + b"}").pop_int("n", low=1, high=5))
        assert error.rule == f"must be from 1 to 5, not {int(text)}"


def test_list_length_bounds():
    """D1: an array field is refused with too few or too many items, and its items carry paths."""
    items = list(closed(b'{"l":[7,8]}').pop_list("l", min_items=1, max_items=2))
    assert items == [("$.l[0]", 7), ("$.l[1]", 8)]
    assert refused_by(lambda: closed(b'{"l":[]}').pop_list("l", min_items=1, max_items=2)).rule == (
        "must hold 1 to 2 items, not 0"
    )
    assert refused_by(lambda: closed(b'{"l":[1,2,3]}').pop_list("l", min_items=1, max_items=2)).rule == (
        "must hold 1 to 2 items, not 3"
    )


def test_const_must_match_exactly():
    """D1: a constant field (a schema name) must equal its one value."""
    assert closed(b'{"s":"v1"}').pop_const("s", "v1") == "v1"
    error = refused_by(lambda: closed(b'{"s":"v2"}').pop_const("s", "v1"))
    assert (error.where, error.rule) == ("$.s", "must be 'v1'")


def test_sha256_field():
    """D1: a digest field is exactly 64 lowercase hex digits."""
    digest = "0123456789abcdef" * 4
    assert closed(b'{"d":"' + digest.encode() + b'"}').pop_sha256("d") == digest
    for bad in (digest.upper(), digest[:-1], digest + "0", digest[:-1] + "g"):
        error = refused_by(lambda: closed(b'{"d":"' + bad.encode() + b'"}').pop_sha256("d"))
        assert error.where == "$.d"


def test_string_size_is_counted_in_utf8_bytes():
    """D1: max_bytes counts UTF-8 bytes, not characters."""
    assert check_str("é" * 2, "$.s", max_bytes=4) == "éé"
    error = refused_by(lambda: check_str("é" * 3, "$.s", max_bytes=5))
    assert error.rule == "must be at most 5 bytes, not 6"


def test_string_rules():
    """D1: NUL is refused unless allowed; ascii_only and pattern are enforced with the caller's rule."""
    assert refused_by(lambda: check_str("a\x00b", "$.s", max_bytes=9)).rule == "must not contain NUL"
    assert check_str("a\x00b", "$.s", max_bytes=9, allow_nul=True) == "a\x00b"
    assert refused_by(lambda: check_str("é", "$.s", max_bytes=9, ascii_only=True)).rule == "must be ASCII"
    pattern = re.compile(r"[a-z]+\Z")
    assert refused_by(lambda: check_str("A", "$.s", max_bytes=9, pattern=pattern, rule="must be lowercase")).rule == (
        "must be lowercase"
    )
    assert "must match" in refused_by(lambda: check_str("A", "$.s", max_bytes=9, pattern=pattern)).rule
    assert refused_by(lambda: check_str(5, "$.s", max_bytes=9)).rule == "must be a string, not an integer"


def test_nested_paths_are_named():
    """D1: refusals inside nested objects and arrays name the full JSON path."""
    root = closed(b'{"outer":{"list":[{"x":"1"}]}}')
    inner = root.pop_object("outer")
    (path, item), = inner.pop_list("list", min_items=1, max_items=1)
    error = refused_by(lambda: ClosedObject(item, path).pop_int("x", low=0, high=9))
    assert error.where == "$.outer.list[0].x"
    odd = ClosedObject({"a b": 1}, "$.o")
    assert refused_by(odd.done).where == '$.o["a b"]'
