"""E8: the one rule for untrusted text.

Text that comes from the candidate, an index or a sandbox (file and member
names, wheel metadata, pip's messages, captured output, junit messages, the
fields of a receipt or a journal handed in for review) can hold terminal
control sequences, carriage returns that overwrite a line, newlines that
forge one, or GitHub Actions workflow commands (``::error ...`` at the start
of a line, ``##[warning]`` anywhere). Shown raw, it could set a window
title, clear the screen and draw a fake verdict, or make a CI log raise an
annotation in casebox's name.

So every such text reaches a terminal, a log line, a job summary, an
annotation or an HTML page through :func:`escape` (or :func:`html`,
:func:`json_line`, :func:`workflow_command` and :func:`markdown_text`, which
apply it first). The result is one line of printable characters:

- every character that is not printable (C0 and C1 controls, ESC, DEL, line
  and paragraph separators, bidirectional overrides and other format
  characters) becomes a visible escape such as ``\\x1b``, ``\\n`` or
  ``\\u202e``; bytes that are not UTF-8 become ``\\xNN``;
- a ``::`` that starts the text, after any spaces, becomes ``\\x3a:``, and
  every ``##[`` becomes ``#\\x23[``, so no workflow command survives;
- at most ``limit`` characters of the input are kept, then the text says how
  much was left out.

Applying the rule twice gives the same text as applying it once, so a sink
may escape a line whose fields were already escaped. Escaping is for
display only: nothing ever parses the result back.

Two sinks need more than one safe line, and get it here, on top of the rule:

- a GitHub Actions workflow command (``::error title=...::message``) is built
  whole by :func:`workflow_command`: the command and the property names are
  casebox's own, every property value and message line goes through the rule
  and then GitHub's own escaping (``%``, ``\r``, ``\n``, and in a property
  ``:`` and ``,`` too), so no text can end the properties, start a second
  command or smuggle an escape that the runner would decode into a line;
- Markdown text of a job summary (a table cell, a list item) gets
  :func:`markdown_text`: every ASCII punctuation character backslash-escaped
  (GitHub Flavored Markdown allows that for each of them), so no ``|`` ends
  a cell, and no link, image, HTML tag, emphasis or code span can start.
"""

from __future__ import annotations

import html as _html
import json
import re

LIMIT = 1000
# A UTF-8 character is at most four bytes: this many bytes always hold ``limit`` characters.
_BYTES_PER_CHARACTER = 4
_LEADING_COMMAND = re.compile(r"\A( *)::")
_LEGACY_COMMAND = "##["
_SHOWN = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# The workflow commands casebox prints, and the properties it gives them.
WORKFLOW_COMMANDS = ("error", "warning", "notice")
_WORKFLOW_PROPERTIES = ("title",)
_DATA_ESCAPES = {"%": "%25", "\r": "%0D", "\n": "%0A"}
_PROPERTY_ESCAPES = {**_DATA_ESCAPES, ":": "%3A", ",": "%2C"}
_MARKDOWN_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")


def _visible(char: str) -> str:
    if char.isprintable():
        return char
    shown = _SHOWN.get(char)
    if shown is not None:
        return shown
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:
        return f"\\x{code - 0xDC00:02x}"  # a byte that was not UTF-8, kept by surrogateescape
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _neutralized(text: str) -> str:
    text = _LEADING_COMMAND.sub(lambda match: f"{match.group(1)}\\x3a:", text)
    return text.replace(_LEGACY_COMMAND, "#\\x23[")


def escape(value: str | bytes, *, limit: int = LIMIT) -> str:
    """``value`` as one line that is safe on a terminal, in a CI log and in an annotation (E8)."""
    if isinstance(value, bytes):
        kept = value[: limit * _BYTES_PER_CHARACTER + _BYTES_PER_CHARACTER].decode("utf-8", "surrogateescape")[:limit]
        left = len(value) - len(kept.encode("utf-8", "surrogateescape"))
        unit = "bytes"
    else:
        kept = value[:limit]
        left = len(value) - len(kept)
        unit = "characters"
    if not kept.isprintable():
        kept = "".join(_visible(char) for char in kept)
    shown = _neutralized(kept)
    if left:
        shown += f" [... {left} more {unit}]"
    return shown


def html(value: str | bytes, *, limit: int = LIMIT) -> str:
    """:func:`escape`, then HTML-escaped for an element's text content (``<``, ``>`` and ``&``).

    Quotes are kept as they are, so this is for text content only: untrusted
    text never goes into an attribute."""
    return _html.escape(escape(value, limit=limit), quote=False)


def json_line(value: object) -> str:
    """``value`` as one line of JSON for a terminal or a CI log: ASCII only, so no control character or
    bidirectional override is ever raw, and ``##[`` written as ``#\\u0023[`` (the same string to a parser).
    A JSON text starts with ``{``, ``[``, a quote or a digit, never with ``::``."""
    text = json.dumps(value, ensure_ascii=True, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return text.replace(_LEGACY_COMMAND, "#\\u0023[")


def _percent(text: str, escapes: dict[str, str]) -> str:
    return "".join(escapes.get(char, char) for char in text)


def workflow_command(command: str, properties: dict[str, str | bytes], lines: "list[str | bytes]", *, limit: int = LIMIT) -> str:
    """One GitHub Actions workflow command line: ``::COMMAND name=value,...::line1%0Aline2``.

    Each property value and each message line is escaped by :func:`escape`
    first, so it is one line with no control character; then ``%``, CR and LF
    are percent-escaped as GitHub's runner expects in a message, and ``:`` and
    ``,`` in a property value too, so a value cannot close the property list.
    The line breaks between ``lines`` are the only ``%0A`` the runner decodes.
    """
    if command not in WORKFLOW_COMMANDS:
        raise ValueError(f"{command!r} is not a workflow command casebox prints")
    unknown = set(properties) - set(_WORKFLOW_PROPERTIES)
    if unknown:
        raise ValueError(f"{sorted(unknown)} are not workflow command properties casebox gives")
    given = ",".join(f"{name}={_percent(escape(value, limit=limit), _PROPERTY_ESCAPES)}" for name, value in properties.items())
    message = "%0A".join(_percent(escape(line, limit=limit), _DATA_ESCAPES) for line in lines)
    return f"::{command}{' ' + given if given else ''}::{message}"


def markdown_text(value: str | bytes, *, limit: int = LIMIT) -> str:
    """:func:`escape`, then every ASCII punctuation character backslash-escaped: text for one cell of a
    GitHub Flavored Markdown table that can neither end the cell nor start any markup."""
    return _MARKDOWN_PUNCTUATION.sub(r"\\\1", escape(value, limit=limit))
