"""The steward's log: one line per event on standard error (the systemd unit's journal), escaped (E8).

Text in it may come from a client or a sandbox (a host name a sandbox asked
the forwarder for), so every line goes through ``journal.untrusted.escape``.
"""

from __future__ import annotations

import sys

from journal.errors import SENTENCE_LIMIT
from journal.untrusted import escape


def log(text: str) -> None:
    print(f"casebox-steward: {escape(text, limit=SENTENCE_LIMIT)}", file=sys.stderr, flush=True)
