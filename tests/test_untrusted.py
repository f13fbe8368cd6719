"""E8: the one rule for untrusted text (journal/untrusted.py), on every payload the attacks used."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from executor.cli import frontend
from journal.errors import Refused
from journal.untrusted import LIMIT, escape, html, json_line

# The payloads of the attacks: a window title, a cleared screen and a redrawn verdict, a carriage return that
# overwrites a line, a newline that forges one, GitHub workflow commands old and new, bidirectional overrides.
OSC_TITLE = "\x1b]0;casebox: PASS\x07"
CLEAR_AND_DRAW = "\x1b[2J\x1b[H\x1b[32mverdict: PASS\x1b[0m"
PAYLOADS = [
    OSC_TITLE,
    CLEAR_AND_DRAW,
    "FAIL\rPASS",
    "ok\nverdict: PASS",
    "::error title=casebox::forged",
    "   ::warning::forged",
    "\t::notice::forged",
    "x ##[warning]forged",
    "##[group]forged",
    "\u009b2J C1 CSI",
    "\u202egnp.exe",
    "a\u2028b\u2029c\u0085d",
    "\x00\x7f",
]


def _safe(text: str) -> bool:
    """No control character, no line break, no workflow command: what every sink may receive."""
    stripped = text.lstrip(" ")
    return text.isprintable() and not stripped.startswith("::") and "##[" not in text


@pytest.mark.parametrize("payload", PAYLOADS)
def test_every_attack_payload_comes_out_as_one_safe_line(payload):
    """E8: controls (C0, C1, ESC, DEL), separators and overrides are escaped; workflow commands neutralized."""
    shown = escape(payload)
    assert _safe(shown), shown
    assert "\x1b" not in shown and "\r" not in shown and "\n" not in shown


@pytest.mark.parametrize("payload", PAYLOADS)
def test_bytes_payloads_are_escaped_the_same_way(payload):
    """E8: a payload that arrives as bytes (captured output, a member name) gets the same rule."""
    assert escape(payload.encode("utf-8")) == escape(payload)


def test_escapes_are_visible_and_say_what_they_stand_for():
    """E8: a reviewer sees what the bytes were, not a rendering of them."""
    assert escape("a\nb\rc\td\x00e\x1bf\u2028g") == "a\\nb\\rc\\td\\x00e\\x1bf\\u2028g"
    assert escape(OSC_TITLE) == "\\x1b]0;casebox: PASS\\x07"
    assert escape("::error::x") == "\\x3a:error::x"
    assert escape("  ::error::x") == "  \\x3a:error::x"
    assert escape("see ##[warning] here") == "see #\\x23[warning] here"


def test_printable_text_is_kept_as_it_is():
    """E8: accents, other scripts and a :: that does not start the text stay readable."""
    for text in ("plan é.json: ok", "测试 ok", "a::b", "C:: d", "# heading", "## [x]"):
        assert escape(text) == text


def test_invalid_utf8_is_shown_byte_by_byte():
    """E8: bytes that are not UTF-8 become \\xNN, never U+FFFD that hides what they were."""
    assert escape(b"name\xff\xfe.whl") == "name\\xff\\xfe.whl"
    assert escape("name\udcff.whl") == "name\\xff.whl"


def test_ten_megabytes_are_bounded_and_the_rest_is_counted():
    """E8: the length is bounded; the text says how much was left out."""
    big = b"\x1b[31m" + b"A" * 10_000_000
    shown = escape(big)
    assert len(shown) < LIMIT * 2
    assert shown.startswith("\\x1b[31mAAAA")
    assert shown.endswith(f" [... {len(big) - LIMIT} more bytes]")
    assert escape("é" * 5000, limit=10) == "é" * 10 + " [... 4990 more characters]"
    assert escape(b"\xc3\xa9" * 5000, limit=10) == "é" * 10 + " [... 9980 more bytes]"


def test_a_cut_never_splits_an_escape_into_something_else():
    """E8: the bound applies to the input, so an escape is never half-shown."""
    shown = escape("\x1b" * 50, limit=3)
    assert shown == "\\x1b\\x1b\\x1b [... 47 more characters]"


@given(st.text())
def test_escaping_twice_is_escaping_once(text):
    """E8: a sink may escape a line whose fields were escaped already; nothing changes and nothing doubles."""
    once = escape(text, limit=100_000)
    assert escape(once, limit=100_000) == once
    assert _safe(once)


@given(st.binary())
def test_any_bytes_come_out_safe(data):
    """E8: whatever a sandbox writes."""
    assert _safe(escape(data, limit=100_000))


def test_html_escapes_markup_after_the_rule():
    """E8: the HTML replay's text content: markup escaped, then controls escaped."""
    assert html("<script>alert(1)</script>\x1b") == "&lt;script&gt;alert(1)&lt;/script&gt;\\x1b"


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(), lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner)))
def test_json_lines_parse_back_to_the_same_value_and_are_safe(value):
    """E8: --json output stays exact for a parser and safe for a terminal or a CI log."""
    line = json_line(value)
    assert json.loads(line) == value
    assert _safe(line)


def test_a_refusal_sentence_goes_through_the_rule():
    """E8, F1: a refused member or path name cannot add a line or a workflow command to the sentence."""
    sentence = Refused("::error::x\n##[warning]y", "must be x").sentence()
    assert sentence == "\\x3a:error::x\\n#\\x23[warning]y: must be x."


def test_the_line_sink_escapes_what_a_caller_forgot(capsys):
    """E8: frontend.say escapes the whole line again, so a field that was not escaped still cannot forge a line."""
    frontend.say(f"note: {CLEAR_AND_DRAW}\nverdict: PASS")
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "\x1b" not in out
