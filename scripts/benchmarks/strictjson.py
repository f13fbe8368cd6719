"""strict_loads_mib_ms: the strict reader on a 1 MiB document, against the stdlib parser on the same bytes."""

from __future__ import annotations

import json

from timing import median_seconds

from journal.strictjson import MAX_NODES, loads

CAP = 1 << 20


def _document() -> bytes:
    # A plan-like document at the reader's limits: 1 MiB, 50,000 values, strings
    # with escapes and brackets (which the depth pre-scan must skip), integers, nesting.
    item = {"id": "case-0000", "args": ["-k", 'a [b] {c} "d"\\'], "timeout_ms": 60000, "ok": True}
    per_item = 1 + 1 + 1 + 2 + 1 + 1
    items = [dict(item, id=f"case-{index:04d}") for index in range((MAX_NODES - 2) // per_item)]
    data = json.dumps({"items": items}).encode()
    padding = CAP - len(data)
    assert padding >= 0, len(data)
    return data + b" " * padding


def strict_loads_mib_ms() -> dict:
    data = _document()
    value = median_seconds(lambda: loads(data, max_bytes=CAP), repeat=15)
    anchor = median_seconds(lambda: json.loads(data), repeat=15)
    return {
        "metric": "strict_loads_mib_ms",
        "value": round(value * 1000, 2),
        "unit": "ms",
        "anchor": "json.loads on the same 1 MiB",
        "anchor_value": round(anchor * 1000, 2),
    }


METRICS = {"strict_loads_mib_ms": strict_loads_mib_ms}
