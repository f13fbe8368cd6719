"""plan_check_ms: `casebox plan check` on the reference plan, against a bare interpreter start."""

from __future__ import annotations

import pathlib

from timing import REAL_PYTHON, median_seconds, run_quietly

REPO = pathlib.Path(__file__).resolve().parent.parent.parent


def plan_check_ms() -> dict:
    casebox = [str(REPO / ".venv/bin/casebox"), "plan", "check", str(REPO / "examples/plan.json")]
    value = median_seconds(lambda: run_quietly(casebox), repeat=15)
    anchor = median_seconds(lambda: run_quietly([REAL_PYTHON, "-I", "-S", "-c", "pass"]), repeat=15)
    return {
        "metric": "plan_check_ms",
        "value": round(value * 1000, 2),
        "unit": "ms",
        "anchor": "python -I -S -c pass",
        "anchor_value": round(anchor * 1000, 2),
    }


METRICS = {"plan_check_ms": plan_check_ms}
