"""Strict closed JSON: the reader refuses (D1), the writer is canonical (D2).

The corpora are JSONTestSuite's test_parsing and test_transform, and the RFC
8785 vectors of json-canonicalization, read through the ``corpora`` fixture.
"""

from __future__ import annotations

import collections
import enum
import json
import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal import strictjson
from journal.closed import ClosedObject
from journal.strictjson import MAX_DEPTH, MAX_NODES, MAX_SAFE_INTEGER, StrictJSONError, canonical, loads

CAP = 1 << 20

ACCEPTED = "accepted"
NON_OBJECT = "non-object top level"


def refused(rule: str) -> tuple[str, str]:
    return ("refused", rule)


FLOAT = refused("floats are refused")
NONCHARACTER = refused("noncharacter")
LONE_SURROGATE = refused("lone surrogate")
DUPLICATE = refused("duplicate key")
NOT_UTF8 = refused("not valid UTF-8")
OUT_OF_RANGE = refused("outside ±(2^53−1)")

# Every y_ file, classified for a casebox document: the reader's answer, then
# the schema's top-level rule (every casebox document is a closed object).
Y_FILES = {
    "y_array_arraysWithSpaces": NON_OBJECT,
    "y_array_empty-string": NON_OBJECT,
    "y_array_empty": NON_OBJECT,
    "y_array_ending_with_newline": NON_OBJECT,
    "y_array_false": NON_OBJECT,
    "y_array_heterogeneous": NON_OBJECT,
    "y_array_null": NON_OBJECT,
    "y_array_with_1_and_newline": NON_OBJECT,
    "y_array_with_leading_space": NON_OBJECT,
    "y_array_with_several_null": NON_OBJECT,
    "y_array_with_trailing_space": NON_OBJECT,
    "y_number": FLOAT,
    "y_number_0e+1": FLOAT,
    "y_number_0e1": FLOAT,
    "y_number_after_space": NON_OBJECT,
    "y_number_double_close_to_zero": FLOAT,
    "y_number_int_with_exp": FLOAT,
    "y_number_minus_zero": NON_OBJECT,
    "y_number_negative_int": NON_OBJECT,
    "y_number_negative_one": NON_OBJECT,
    "y_number_negative_zero": NON_OBJECT,
    "y_number_real_capital_e": FLOAT,
    "y_number_real_capital_e_neg_exp": FLOAT,
    "y_number_real_capital_e_pos_exp": FLOAT,
    "y_number_real_exponent": FLOAT,
    "y_number_real_fraction_exponent": FLOAT,
    "y_number_real_neg_exp": FLOAT,
    "y_number_real_pos_exponent": FLOAT,
    "y_number_simple_int": NON_OBJECT,
    "y_number_simple_real": FLOAT,
    "y_object": ACCEPTED,
    "y_object_basic": ACCEPTED,
    "y_object_duplicated_key": DUPLICATE,
    "y_object_duplicated_key_and_value": DUPLICATE,
    "y_object_empty": ACCEPTED,
    "y_object_empty_key": ACCEPTED,
    "y_object_escaped_null_in_key": ACCEPTED,
    "y_object_extreme_numbers": FLOAT,
    "y_object_long_strings": ACCEPTED,
    "y_object_simple": ACCEPTED,
    "y_object_string_unicode": ACCEPTED,
    "y_object_with_newlines": ACCEPTED,
    "y_string_1_2_3_bytes_UTF-8_sequences": NON_OBJECT,
    "y_string_accepted_surrogate_pair": NON_OBJECT,
    "y_string_accepted_surrogate_pairs": NON_OBJECT,
    "y_string_allowed_escapes": NON_OBJECT,
    "y_string_backslash_and_u_escaped_zero": NON_OBJECT,
    "y_string_backslash_doublequotes": NON_OBJECT,
    "y_string_comments": NON_OBJECT,
    "y_string_double_escape_a": NON_OBJECT,
    "y_string_double_escape_n": NON_OBJECT,
    "y_string_escaped_control_character": NON_OBJECT,
    "y_string_escaped_noncharacter": NONCHARACTER,
    "y_string_in_array": NON_OBJECT,
    "y_string_in_array_with_leading_space": NON_OBJECT,
    "y_string_last_surrogates_1_and_2": NONCHARACTER,  # \uDBFF\uDFFF is U+10FFFF
    "y_string_nbsp_uescaped": NON_OBJECT,
    "y_string_nonCharacterInUTF-8_U+10FFFF": NONCHARACTER,
    "y_string_nonCharacterInUTF-8_U+FFFF": NONCHARACTER,
    "y_string_null_escape": NON_OBJECT,
    "y_string_one-byte-utf-8": NON_OBJECT,
    "y_string_pi": NON_OBJECT,
    "y_string_reservedCharacterInUTF-8_U+1BFFF": NON_OBJECT,  # reserved, not a noncharacter
    "y_string_simple_ascii": NON_OBJECT,
    "y_string_space": NON_OBJECT,
    "y_string_surrogates_U+1D11E_MUSICAL_SYMBOL_G_CLEF": NON_OBJECT,
    "y_string_three-byte-utf-8": NON_OBJECT,
    "y_string_two-byte-utf-8": NON_OBJECT,
    "y_string_u+2028_line_sep": NON_OBJECT,
    "y_string_u+2029_par_sep": NON_OBJECT,
    "y_string_uEscape": NON_OBJECT,
    "y_string_uescaped_newline": NON_OBJECT,
    "y_string_unescaped_char_delete": NON_OBJECT,
    "y_string_unicode": NON_OBJECT,
    "y_string_unicodeEscapedBackslash": NON_OBJECT,
    "y_string_unicode_2": NON_OBJECT,
    "y_string_unicode_U+10FFFE_nonchar": NONCHARACTER,
    "y_string_unicode_U+1FFFE_nonchar": NONCHARACTER,
    "y_string_unicode_U+200B_ZERO_WIDTH_SPACE": NON_OBJECT,
    "y_string_unicode_U+2064_invisible_plus": NON_OBJECT,
    "y_string_unicode_U+FDD0_nonchar": NONCHARACTER,
    "y_string_unicode_U+FFFE_nonchar": NONCHARACTER,
    "y_string_unicode_escaped_double_quote": NON_OBJECT,
    "y_string_utf8": NON_OBJECT,
    "y_string_with_del_character": NON_OBJECT,
    "y_structure_lonely_false": NON_OBJECT,
    "y_structure_lonely_int": NON_OBJECT,
    "y_structure_lonely_negative_real": FLOAT,
    "y_structure_lonely_null": NON_OBJECT,
    "y_structure_lonely_string": NON_OBJECT,
    "y_structure_lonely_true": NON_OBJECT,
    "y_structure_string_empty": NON_OBJECT,
    "y_structure_trailing_newline": NON_OBJECT,
    "y_structure_true_in_array": NON_OBJECT,
    "y_structure_whitespace_array": NON_OBJECT,
}

# Every i_ file is refused; this names the rule each one breaks.
I_FILES = {
    "i_number_double_huge_neg_exp": FLOAT,
    "i_number_huge_exp": FLOAT,
    "i_number_neg_int_huge_exp": FLOAT,
    "i_number_pos_double_huge_exp": FLOAT,
    "i_number_real_neg_overflow": FLOAT,
    "i_number_real_pos_overflow": FLOAT,
    "i_number_real_underflow": FLOAT,
    "i_number_too_big_neg_int": OUT_OF_RANGE,
    "i_number_too_big_pos_int": OUT_OF_RANGE,
    "i_number_very_big_negative_int": OUT_OF_RANGE,
    "i_object_key_lone_2nd_surrogate": LONE_SURROGATE,
    "i_string_1st_surrogate_but_2nd_missing": LONE_SURROGATE,
    "i_string_1st_valid_surrogate_2nd_invalid": LONE_SURROGATE,
    "i_string_UTF-16LE_with_BOM": NOT_UTF8,
    "i_string_UTF-8_invalid_sequence": NOT_UTF8,
    "i_string_UTF8_surrogate_U+D800": NOT_UTF8,
    "i_string_incomplete_surrogate_and_escape_valid": LONE_SURROGATE,
    "i_string_incomplete_surrogate_pair": LONE_SURROGATE,
    "i_string_incomplete_surrogates_escape_valid": LONE_SURROGATE,
    "i_string_invalid_lonely_surrogate": LONE_SURROGATE,
    "i_string_invalid_surrogate": LONE_SURROGATE,
    "i_string_invalid_utf-8": NOT_UTF8,
    "i_string_inverted_surrogates_U+1D11E": LONE_SURROGATE,
    "i_string_iso_latin_1": NOT_UTF8,
    "i_string_lone_second_surrogate": LONE_SURROGATE,
    "i_string_lone_utf8_continuation_byte": NOT_UTF8,
    "i_string_not_in_unicode_range": NOT_UTF8,
    "i_string_overlong_sequence_2_bytes": NOT_UTF8,
    "i_string_overlong_sequence_6_bytes": NOT_UTF8,
    "i_string_overlong_sequence_6_bytes_null": NOT_UTF8,
    "i_string_truncated-utf-8": NOT_UTF8,
    "i_string_utf16BE_no_BOM": NOT_UTF8,
    "i_string_utf16LE_no_BOM": NOT_UTF8,
    "i_structure_500_nested_arrays": refused("nests deeper than 32 levels"),
    "i_structure_UTF-8_BOM_empty_object": refused("byte order mark"),
}

# test_transform: inputs parsers may read differently. Each answer is fixed here.
TRANSFORM_FILES = {
    "number_-9223372036854775808": OUT_OF_RANGE,
    "number_-9223372036854775809": OUT_OF_RANGE,
    "number_1.0": FLOAT,
    "number_1.000000000000000005": FLOAT,
    "number_1000000000000000": NON_OBJECT,
    "number_10000000000000000999": OUT_OF_RANGE,
    "number_1e-999": FLOAT,
    "number_1e6": FLOAT,
    "number_9223372036854775807": OUT_OF_RANGE,
    "number_9223372036854775808": OUT_OF_RANGE,
    "object_key_nfc_nfd": ACCEPTED,  # two keys: no normalization, so not duplicates
    "object_key_nfd_nfc": ACCEPTED,
    "object_same_key_different_values": DUPLICATE,
    "object_same_key_same_value": DUPLICATE,
    "object_same_key_unclear_values": DUPLICATE,
    "string_1_escaped_invalid_codepoint": LONE_SURROGATE,
    "string_1_invalid_codepoint": NOT_UTF8,
    "string_2_escaped_invalid_codepoints": LONE_SURROGATE,
    "string_2_invalid_codepoints": NOT_UTF8,
    "string_3_escaped_invalid_codepoints": LONE_SURROGATE,
    "string_3_invalid_codepoints": NOT_UTF8,
    "string_with_escaped_NULL": NON_OBJECT,
}


def refusal(data: bytes, *, max_bytes: int = CAP) -> StrictJSONError:
    with pytest.raises(StrictJSONError) as caught:
        loads(data, max_bytes=max_bytes)
    return caught.value


def same(left: object, right: object) -> bool:
    """Equal values of identical types all the way down (True is not 1); member order aside."""
    if type(left) is not type(right):
        return False
    if type(left) is dict:
        return left.keys() == right.keys() and all(same(left[key], right[key]) for key in left)
    if type(left) is list:
        return len(left) == len(right) and all(same(a, b) for a, b in zip(left, right))
    return left == right


def classify(data: bytes) -> object:
    """What casebox does with a document: the reader, then the schema's top-level rule."""
    try:
        value = loads(data, max_bytes=CAP)
    except StrictJSONError as error:
        return ("refused", error.rule)
    if type(value) is dict:
        ClosedObject(value)
        return ACCEPTED
    with pytest.raises(StrictJSONError, match="must be an object"):
        ClosedObject(value)
    return NON_OBJECT


def check_table(directory, table: dict, prefix: str = "") -> None:
    present = {path.stem for path in directory.glob(prefix + "*.json")}
    assert present == set(table), "the table must classify exactly the corpus files"
    wrong = []
    for name, expected in sorted(table.items()):
        answer = classify((directory / f"{name}.json").read_bytes())
        if isinstance(expected, tuple):
            if not (isinstance(answer, tuple) and expected[1] in answer[1]):
                wrong.append((name, expected, answer))
        elif answer != expected:
            wrong.append((name, expected, answer))
    assert not wrong


def test_every_n_file_is_refused(corpora):
    """D1: every n_ file of JSONTestSuite is refused with the one refusal type."""
    directory = corpora / "JSONTestSuite" / "test_parsing"
    files = sorted(directory.glob("n_*.json"))
    assert len(files) == 188
    accepted = []
    for path in files:
        try:
            loads(path.read_bytes(), max_bytes=CAP)
        except StrictJSONError as error:
            assert error.where.startswith("$") and error.rule
        else:
            accepted.append(path.name)
    assert not accepted


def test_every_i_file_is_refused_with_its_rule(corpora):
    """D1: every i_ file (implementation-defined) is refused, each for the rule named in I_FILES."""
    check_table(corpora / "JSONTestSuite" / "test_parsing", I_FILES, "i_")


def test_every_y_file_is_classified(corpora):
    """D1: each y_ file is accepted, or refused by the rule its row names (float, duplicate key,
    noncharacter, non-object top level)."""
    check_table(corpora / "JSONTestSuite" / "test_parsing", Y_FILES, "y_")


def test_transform_files_are_classified(corpora):
    """D1: inputs other parsers read differently get one fixed answer here (no key normalization,
    duplicates refused, no integer past 2^53−1)."""
    check_table(corpora / "JSONTestSuite" / "test_transform", TRANSFORM_FILES)


def test_the_corpus_holds_no_unclassified_test_file(corpora):
    """D1: test_parsing holds only y_/n_/i_ files (and its LICENSE), so no file escapes the tests above."""
    names = {path.name for path in (corpora / "JSONTestSuite" / "test_parsing").iterdir()}
    assert {name for name in names if not re.match(r"[yni]_.*\.json\Z", name)} == {"LICENSE"}
    assert len(names) == 319


# RFC 8785 vectors. Our profile reads integers only, so a vector whose input
# holds a number with a fraction or exponent (structures: 56.0; values: 4.50,
# 1E30...) cannot go through our reader. For those the test builds the value
# with the stdlib parser, turning an integral float such as 56.0 into the
# integer it denotes (JCS writes 56 for it), and checks the writer's bytes; a
# non-integral number is refused by the writer, and that member is compared
# with the expected output removed.
JCS_VECTORS = ("arrays", "french", "structures", "unicode", "values", "weird")
JCS_READABLE = {"arrays", "french", "unicode", "weird"}


def _integral(text: str) -> object:
    number = float(text)
    return int(number) if number.is_integer() else number


@pytest.mark.parametrize("name", JCS_VECTORS)
def test_rfc8785_vectors(corpora, name):
    """D2: the writer matches RFC 8785 byte for byte on every vector within the profile."""
    base = corpora / "json-canonicalization" / "testdata"
    source = (base / "input" / f"{name}.json").read_bytes()
    expected = (base / "output" / f"{name}.json").read_bytes()
    assert bytes.fromhex((base / "outhex" / f"{name}.txt").read_text()) == expected
    value = json.loads(source, parse_float=_integral)
    if name in JCS_READABLE:
        assert same(loads(source, max_bytes=CAP), value)
        assert canonical(value) == expected
        assert canonical(loads(expected, max_bytes=CAP)) == expected
        return
    assert "floats are refused" in refusal(source).rule
    if name == "structures":
        assert canonical(value) == expected
    else:
        with pytest.raises(StrictJSONError, match="cannot be written canonically") as caught:
            canonical(value)
        assert caught.value.where == "$.numbers[0]"
        del value["numbers"]
        assert canonical(value) == re.sub(rb',"numbers":\[[^\]]*\]', b"", expected)


def test_writer_orders_keys_by_utf16_code_units():
    """D2: keys sort by UTF-16 code units (RFC 8785 3.2.3), so an astral key sorts before U+FB33."""
    expected = '{"":4,"a":3,"\U0001f602":2,"\ufb33":1}'.encode()
    assert canonical({"\ufb33": 1, "\U0001f602": 2, "a": 3, "": 4}) == expected


def test_writer_escapes_minimally():
    """D2: only quote, backslash and C0 controls are escaped, with short forms first and lowercase hex."""
    text = "\b\f\n\r\t\x00\x0f\x1f\"\\/\x7f\u2028é"
    assert canonical(text) == b'"\\b\\f\\n\\r\\t\\u0000\\u000f\\u001f\\"\\\\/\x7f' + "\u2028é".encode() + b'"'


def test_writer_emits_no_whitespace():
    """D2: separators are bare ',' and ':'."""
    assert canonical({"b": [1, True, None], "a": {"c": "d"}}) == b'{"a":{"c":"d"},"b":[1,true,null]}'


@pytest.mark.parametrize(
    ("value", "where", "rule"),
    [
        (1.5, "$", "cannot be written canonically (float)"),
        ({"a": [float("nan")]}, "$.a[0]", "cannot be written canonically (float)"),
        (MAX_SAFE_INTEGER + 1, "$", "outside"),
        (-MAX_SAFE_INTEGER - 1, "$", "outside"),
        ({1: 2}, "$", "non-string key"),
        ({"k": "\ud800"}, "$.k", "lone surrogate"),
        ({"\ufffe": 1}, '$["\\ufffe"]', "noncharacter"),
        (b"bytes", "$", "cannot be written canonically (bytes)"),
        ({"a": {1, 2}}, "$.a", "cannot be written canonically (set)"),
        ([enum.IntEnum("Level", "LOW").LOW], "$[0]", "cannot be written canonically (Level)"),
        (collections.UserString("s"), "$", "cannot be written canonically (UserString)"),
        (collections.OrderedDict(a=1), "$", "cannot be written canonically (OrderedDict)"),
    ],
)
def test_writer_refuses_values_outside_the_profile(value, where, rule):
    """D2: the writer refuses what the reader would refuse, naming the path."""
    with pytest.raises(StrictJSONError) as caught:
        canonical(value)
    assert caught.value.where == where
    assert rule in caught.value.rule


@pytest.mark.parametrize("wrap", [lambda inner: [inner], lambda inner: {"a": inner}], ids=["array", "object"])
def test_writer_depth_limit_matches_the_reader(wrap):
    """D2: the writer writes 32 levels and refuses 33, so whatever it writes the reader reads."""
    value: object = 0
    for _ in range(MAX_DEPTH):
        value = wrap(value)
    assert loads(canonical(value), max_bytes=CAP) == value
    with pytest.raises(StrictJSONError, match="nests deeper"):
        canonical(wrap(value))


def test_writer_refuses_a_container_that_holds_itself():
    """D2: a cycle is refused as too deep, never a RecursionError."""
    looped: list = []
    looped.append(looped)
    with pytest.raises(StrictJSONError, match="nests deeper"):
        canonical(looped)


def test_writer_node_limit_matches_the_reader():
    """D2: the writer writes 50,000 values and refuses 50,001."""
    assert loads(canonical([0] * (MAX_NODES - 1)), max_bytes=CAP) == [0] * (MAX_NODES - 1)
    with pytest.raises(StrictJSONError, match=f"limit of {MAX_NODES} values"):
        canonical([0] * MAX_NODES)


def test_writer_keeps_bool_apart_from_int():
    """D2: True is written as true, never as 1, and 1 never as true."""
    assert canonical([True, 1, False, 0]) == b"[true,1,false,0]"


# --- the reader's rules, each with its own hand-written bytes -----------------


def nested(depth: int, *, kind: str = "array") -> bytes:
    if kind == "array":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"0" + b"}" * depth if depth else b"0"


@pytest.mark.parametrize("kind", ["array", "object"])
def test_depth_32_is_read_and_33_refused(kind):
    """D1: 32 nested arrays or objects are read; 33 are refused as too deep."""
    loads(nested(MAX_DEPTH, kind=kind), max_bytes=CAP)
    assert "nests deeper than 32 levels" in refusal(nested(MAX_DEPTH + 1, kind=kind)).rule


def test_depth_counts_mixed_containers():
    """D1: arrays and objects count alike toward the depth."""
    loads(b'[{"a":' * 16 + b"0" + b"}]" * 16, max_bytes=CAP)
    assert "nests deeper" in refusal(b'[{"a":' * 16 + b"[]" + b"}]" * 16).rule


def test_brackets_inside_strings_do_not_count_toward_depth():
    """D1: the depth pre-scan skips strings, escaped quotes included."""
    text = '["' + "[" * 100 + '\\"' + "{" * 100 + '"]'
    assert loads(text.encode(), max_bytes=CAP) == ["[" * 100 + '"' + "{" * 100]


@pytest.mark.parametrize(
    "data",
    [
        b"[" * 100_000,
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a":' * 100_000,
        b'[{"a":' * 50_000,
        b'{"' + b"[" * 100_000,
        b'"\\"' + b"[" * 100_000,
    ],
    ids=["open-arrays", "closed-arrays", "open-objects", "mixed", "unterminated-key", "escaped-quote"],
)
def test_very_deep_nesting_never_raises_recursion_error(data):
    """D1: 100,000 brackets are refused with the refusal type; RecursionError never escapes."""
    refusal(data)


@pytest.mark.parametrize("text", ['"', '"\\', '"\\"', '"a\\"b', '[" \\\\"', '"' + '\\"' * 1000, "x" * 10 + '"'])
def test_depth_prescan_string_pattern_matches_at_every_quote(text):
    """D1: the pre-scan's string pattern matches at any opening quote, terminated or not, so the
    scan is linear: a quote never restarts a scan over text already passed."""
    start = text.index('"')
    found = strictjson._STRING.match(text, start)
    assert found is not None
    assert found.end() == len(text) or text[found.end() - 1] == '"'


@given(st.text(alphabet='"\\[]{}ab \n', max_size=200))
def test_depth_prescan_string_pattern_always_matches(text):
    """D1: on any text, the string pattern matches at every quote (the linear pre-scan's premise)."""
    for index, char in enumerate(text):
        if char == '"':
            assert strictjson._STRING.match(text, index) is not None


def test_node_limit_is_50000_values():
    """D1: 50,000 values (containers and scalars) are read; 50,001 are refused."""
    loads(b"[" + b",".join([b"0"] * (MAX_NODES - 1)) + b"]", max_bytes=CAP)
    error = refusal(b"[" + b",".join([b"0"] * MAX_NODES) + b"]")
    assert "limit of 50000 values" in error.rule
    assert error.where == f"$[{MAX_NODES - 1}]"
    objects = b"[" + b",".join([b"{}"] * MAX_NODES) + b"]"
    assert "limit of 50000 values" in refusal(objects).rule


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_finite_numbers_are_refused(constant):
    """D1: NaN and the infinities are refused by name."""
    error = refusal(b'{"a":[' + constant + b"]}")
    assert error.where == "$.a[0]"
    assert "non-finite number" in error.rule


@pytest.mark.parametrize("number", [b"1e400", b"-1e400", b"1.5", b"1.0", b"0e0", b"-0.0", b"1E2"])
def test_floats_are_refused(number):
    """D1: any number with a fraction or exponent is a float, and floats are refused."""
    assert "floats are refused" in refusal(b"[" + number + b"]").rule


def test_integer_range_is_the_safe_range():
    """D1: ±(2^53−1) are read; one past either end, and huge digit strings, are refused."""
    assert loads(b"[9007199254740991,-9007199254740991,-0]", max_bytes=CAP) == [MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER, 0]
    for text in (b"9007199254740992", b"-9007199254740992", b"99999999999999999", b"1" * 5000):
        assert "outside ±(2^53−1)" in refusal(b"[" + text + b"]").rule


def test_duplicate_keys_are_compared_after_unescaping():
    """D1: "a" and "\\u0061" are the same key, so the second is a duplicate."""
    error = refusal(b'{"a":1,"\\u0061":2}')
    assert error.where == "$.a"
    assert "duplicate key" in error.rule
    assert "duplicate key" in refusal(b'{"x":{"k":1,"k":1}}').rule


@pytest.mark.parametrize(
    ("data", "where", "rule"),
    [
        (b'["\\ud800"]', "$[0]", "the string holds a lone surrogate (U+D800)"),
        (b'["\\udfff x"]', "$[0]", "lone surrogate"),
        (b'["\\ude00\\ud83d"]', "$[0]", "lone surrogate"),
        (b'{"\\ud800":1}', '$["\\ud800"]', "the key holds a lone surrogate"),
        (b'["\\ufdd0"]', "$[0]", "noncharacter (U+FDD0)"),
        (b'["\\ufdef"]', "$[0]", "noncharacter (U+FDEF)"),
        (b'{"\\uffff":1}', '$["\\uffff"]', "the key holds a noncharacter"),
        ('["\U0003fffe"]'.encode(), "$[0]", "noncharacter (U+3FFFE)"),
    ],
)
def test_lone_surrogates_and_noncharacters_are_refused(data, where, rule):
    """D1: a lone surrogate or a noncharacter in a string or a key is refused, naming the path."""
    error = refusal(data)
    assert error.where == where
    assert rule in error.rule


def _forbidden(code: int) -> bool:
    return 0xD800 <= code <= 0xDFFF or 0xFDD0 <= code <= 0xFDEF or code & 0xFFFE == 0xFFFE


def test_every_code_point_is_judged_by_the_rule():
    """D1: across all of Unicode, exactly the surrogates and the 66 noncharacters are refused."""
    forbidden = [code for code in range(0x110000) if _forbidden(code)]
    assert len(forbidden) == 2048 + 66
    for plane in range(17):
        allowed = "".join(chr(code) for code in range(plane << 16, (plane + 1) << 16) if not _forbidden(code))
        document = json.dumps([allowed], ensure_ascii=False).encode()
        assert loads(document, max_bytes=1 << 22) == [allowed]
    for code in forbidden:
        error = refusal(b'["\\u%04x"]' % code if code <= 0xFFFF else json.dumps([chr(code)], ensure_ascii=False).encode())
        assert ("lone surrogate" if code <= 0xDFFF and code >= 0xD800 else "noncharacter") in error.rule


@pytest.mark.parametrize(
    ("data", "rule"),
    [
        (b"\xef\xbb\xbf{}", "byte order mark"),
        ("{}".encode("utf-16"), "not valid UTF-8"),
        ('{"a":1}'.encode("utf-16-le"), "is not JSON"),  # no BOM: valid UTF-8, full of NULs
        ('{"a":1}'.encode("utf-16-be"), "is not JSON"),
        ('{"a":1}'.encode("utf-32"), "not valid UTF-8"),
        (b'{"a":"\xff"}', "not valid UTF-8 (byte 6)"),
        (b'{"a":"\xed\xa0\x80"}', "not valid UTF-8"),  # a surrogate encoded as UTF-8
        (b'{"a":"\xc0\xaf"}', "not valid UTF-8"),  # overlong
        (b"", "the document is empty"),
        (b" \n\t\r", "the document is empty"),
        (b"{} x", "has data after the JSON value"),
        (b"{}{}", "has data after the JSON value"),
        (b"{}\x00", "has data after the JSON value"),
        (b"{}\xc2\xa0", "has data after the JSON value"),  # NBSP is not JSON whitespace
        (b"\x0c{}", "is not JSON"),  # nor is form feed
        (b"{'a':1}", "is not JSON"),
        (b'{"a":1,}', "is not JSON"),
        (b'["a\nb"]', "is not JSON"),  # a raw control character in a string
        (b'"abc', "is not JSON: unterminated string"),
    ],
)
def test_malformed_documents_are_refused(data, rule):
    """D1: encodings other than UTF-8, a BOM, trailing data, empty input and broken syntax are refused."""
    error = refusal(data)
    assert error.where == "$"
    assert rule in error.rule


def test_size_cap_is_exact():
    """D1: a document of exactly max_bytes is read; one byte more is refused before parsing."""
    document = b'{"a":"' + b"x" * 94 + b'"}'
    assert len(document) == 102
    loads(document, max_bytes=102)
    assert "larger than its 101-byte cap" in refusal(document, max_bytes=101).rule
    assert "cap" in refusal(b"\xff" * 200, max_bytes=100).rule


def test_reader_takes_bytes_only():
    """D1: text is refused by type, so no caller can hand over something already decoded or sniffed."""
    with pytest.raises(TypeError):
        loads("{}", max_bytes=CAP)  # type: ignore[arg-type]


def test_refusals_name_the_json_path():
    """D1: a refusal deep inside names the full path, with awkward keys quoted."""
    error = refusal(b'{"a":[{"b c":[0,1.5]}]}')
    assert error.where == '$.a[0]["b c"][1]'
    assert error.sentence() == '$.a[0]["b c"][1]: is a non-integer number (1.5); floats are refused.'


def test_reader_returns_plain_types():
    """D1: only dict, list, str, int, bool and None come out, in document order."""
    value = loads(b'{"z":[true,false,null,-3,"s"],"a":{}}', max_bytes=CAP)
    assert same(value, {"z": [True, False, None, -3, "s"], "a": {}})
    assert list(value) == ["z", "a"]


# --- properties ---------------------------------------------------------------

profile_text = st.text(st.characters(codec="utf-8").filter(lambda char: not _forbidden(ord(char))), max_size=12)
profile_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER), profile_text
)
profile_values = st.recursive(
    profile_scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(profile_text, children, max_size=5),
    max_leaves=40,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(profile_values)
def test_round_trip(value):
    """D2: canonical then read gives back the same value, and canonical bytes are a fixed point."""
    encoded = canonical(value)
    decoded = loads(encoded, max_bytes=CAP)
    assert same(decoded, value)
    assert canonical(decoded) == encoded


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(profile_values, st.randoms(use_true_random=False))
def test_any_layout_gives_the_same_canonical_bytes(value, rng):
    """D2: other whitespace and another key order read to the same value and the same bytes."""

    def shuffled(item):
        if type(item) is dict:
            keys = list(item)
            rng.shuffle(keys)
            return {key: shuffled(item[key]) for key in keys}
        if type(item) is list:
            return [shuffled(child) for child in item]
        return item

    layout = json.dumps(shuffled(value), indent=rng.choice([None, 0, 2, "\t"]), ensure_ascii=rng.random() < 0.5)
    assert canonical(loads(layout.encode(), max_bytes=CAP)) == canonical(value)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(profile_values)
def test_canonical_bytes_agree_with_an_independent_encoder(value):
    """D2: an independent reader (the stdlib's) reads the canonical bytes back to the same value."""
    assert same(json.loads(canonical(value)), value)


def _read_or_refuse(data: bytes) -> None:
    try:
        value = loads(data, max_bytes=CAP)
    except StrictJSONError as error:
        assert error.where.startswith("$") and error.rule
        return
    assert same(loads(canonical(value), max_bytes=CAP), value)


@settings(max_examples=500)
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(data):
    """D1: on random bytes the reader returns a value or raises StrictJSONError, nothing else."""
    _read_or_refuse(data)


JSONISH = b'[]{}",:0123456789-+.eEtrufalsn \\u\n\x00\xff\xc3\xa9'


@settings(max_examples=500)
@given(st.lists(st.sampled_from(list(JSONISH)), max_size=300))
def test_fuzz_jsonish_bytes(codes):
    """D1: bytes drawn from JSON's own alphabet reach deep into the scanner; still only StrictJSONError."""
    _read_or_refuse(bytes(codes))


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(profile_values, st.randoms(use_true_random=False))
def test_fuzz_mutated_documents(value, rng):
    """D1: a valid document with bytes flipped, cut, inserted or repeated gives a value or StrictJSONError."""
    data = bytearray(canonical(value))
    for _ in range(rng.randint(1, 4)):
        where = rng.randrange(len(data) + 1)
        action = rng.randrange(4)
        if action == 0 and data:
            data[min(where, len(data) - 1)] = rng.randrange(256)
        elif action == 1:
            del data[where : where + rng.randint(1, 8)]
        elif action == 2:
            data[where:where] = bytes([rng.choice(JSONISH)])
        else:
            data[where:where] = data[where : where + rng.randint(1, 16)] * rng.randint(1, 40)
    _read_or_refuse(bytes(data))


def test_fuzz_seeded_random_documents():
    """D1: a fixed-seed sweep of random JSON-like documents, large and small, gives only StrictJSONError."""
    rng = random.Random(8785)
    for _ in range(2_000):
        size = rng.choice([1, 8, 64, 512, 4096])
        _read_or_refuse(bytes(rng.choice(JSONISH) for _ in range(size)))
