"""The reader's one-pass payload check (journal.format.Layout) against the exact reading (J3, D1, D2).

The reader takes a payload its kind's layout matches without parsing it; any
other payload takes the exact path (strict parse, schema, re-encoding). So a
layout must never admit a payload the exact path refuses, and must give the
same fields when both admit it.
"""

from __future__ import annotations

import pytest

from journal.errors import Refused
from journal.format import Kind, decode_payload, layout, parse_payload
from journal.reader import Verdict, read_journal
from journal_support import Chain, golden, vectors

# Characters that matter to the layouts: quotes, escapes, separators, digits,
# id and path characters, a control, DEL and a non-ASCII byte.
ALPHABET = b'"\\:,{}0159aAfz-._/ \t\x7f\xc3'


def _payloads(name: str) -> list[tuple[Kind, bytes]]:
    return [(record.kind, record.payload) for record in read_journal(golden(name)).records]


def _exact(kind: Kind, payload: bytes) -> dict | None:
    try:
        return parse_payload(kind, payload)
    except Refused:
        return None


def _mutations(payload: bytes):
    for index in range(len(payload)):
        yield payload[:index] + payload[index + 1 :]
        yield payload[:index] + payload[index : index + 1] * 2 + payload[index + 1 :]
        for byte in ALPHABET:
            yield payload[:index] + bytes((byte,)) + payload[index + 1 :]


def test_layouts_admit_every_escape_free_canonical_payload():
    """J3: every record of the golden journals takes the one pass, with the exact reading's fields."""
    payloads = [pair for vector in vectors() if vector["verdict"] == "VALID" for pair in _payloads(vector["file"])]
    assert {kind for kind, _ in payloads} == set(Kind) and len(payloads) > 100
    for kind, payload in payloads:
        assert layout(kind).fields(payload) == parse_payload(kind, payload)


def test_a_layout_never_admits_what_the_exact_reading_refuses():
    """J3, D2: each single-byte deletion, doubling and substitution of every golden payload is admitted by its
    layout only when the exact reading admits it too, with the same fields."""
    admitted = 0
    for kind, payload in _payloads("every_kind.bin"):
        for mutated in _mutations(payload):
            fields = layout(kind).fields(mutated)
            if fields is not None:
                admitted += 1
                assert fields == _exact(kind, mutated), mutated
    assert admitted > 100


def test_a_value_cannot_swallow_a_later_key():
    """J3: a target that reaches over a closing quote into an unknown key is CORRUPT (the layout counts quotes)."""
    chain = Chain()
    payload = chain.payload(Kind.MOUNT_INTENT, op_id="m", target="/t", kind="bind")
    assert payload.endswith(b'"target":"/t"}')
    chain.raw(Kind.MOUNT_INTENT, payload[:-1] + b',"x":"y"}')
    reading = read_journal(chain.bytes())
    assert reading.verdict is Verdict.CORRUPT and "not a known field" in reading.reason, reading.reason


def test_an_escaped_character_is_read_through_the_exact_path():
    """D2: a note holding a needless escape is CORRUPT, since the layout never reads an escape as it stands."""
    chain = Chain()
    payload = chain.payload(Kind.RETIREMENT_INTENT, note="aA")
    chain.raw(Kind.RETIREMENT_INTENT, payload.replace(b'"aA"', b'"a\\u0041"'))
    reading = read_journal(chain.bytes())
    assert reading.verdict is Verdict.CORRUPT and "canonical" in reading.reason, reading.reason


@pytest.mark.parametrize("target", ['/a"b', "/a\\b", '/"/\\\\'])
def test_a_target_with_a_quote_or_backslash_reads_back_as_written(target):
    """J3: a value whose canonical form has an escape decodes to the value written, not to its escaped text."""
    chain = Chain().add(Kind.MOUNT_INTENT, op_id="m", target=target, kind="bind")
    reading = read_journal(chain.bytes())
    assert reading.verdict is Verdict.VALID and reading.records[1].fields["target"] == target


def test_an_overlong_value_is_refused_in_one_pass_too():
    """J3: a layout bounds each string by its type's byte limit, even past the payload cap."""
    payload = Chain().payload(Kind.RETIREMENT_INTENT, note="n" * 5_000)
    assert layout(Kind.RETIREMENT_INTENT).fields(payload) is None
    with pytest.raises(Refused):
        decode_payload(Kind.RETIREMENT_INTENT, payload)


def test_a_long_number_is_refused_not_raised():
    """D1: an integer of thousands of digits is a refusal naming the rule, never an exception from int()."""
    payload = Chain().payload(Kind.PROCESS_RELEASED, op_id="p-1").replace(b'"at":', b'"at":' + b"9" * 5_000, 1)
    with pytest.raises(Refused):
        decode_payload(Kind.PROCESS_RELEASED, payload)
