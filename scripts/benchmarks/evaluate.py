"""evaluate_64_cases_ms: `casebox evaluate` on a 64-case plan in 8 shards, against `casebox plan check` of that plan.

The evidence is real: journals from the JournalWriter, receipts from the
builder and seal markers, made with the evaluator tests' own builder
(tests/evidence_support.py). The anchor starts the same CLI and reads the
same plan, so the ratio shows the cost of checking 64 receipts against 8
journals and writing the report.
"""

from __future__ import annotations

import json
import pathlib
import sys
import tempfile

from timing import median_seconds, run_quietly

REPO = pathlib.Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "tests"))

from evidence_support import ATTEMPT, BUNDLE, Run, build_attempt, junit  # noqa: E402

from executor.plan import plan_from_bytes  # noqa: E402

CASES = 64
SHARDS = 8


def evaluate_64_cases_ms() -> dict:
    with tempfile.TemporaryDirectory() as directory:
        base = pathlib.Path(directory)
        cases = [
            {"id": f"case-{index}", "op": "pytest", "args": [f"tests/test_{index}.py"], "timeout_ms": 60000,
             "applicable": True, "expect_exit": 0}
            for index in range(CASES)
        ]
        plan_path = base / "plan.json"
        plan_path.write_text(json.dumps({"schema": "casebox.plan.v1", "cases": cases}))
        plan = plan_from_bytes(plan_path.read_bytes())
        shards = build_attempt(base / "evidence", plan, {case.id: Run(pytest=junit(5)) for case in plan.cases}, shards=SHARDS)
        (base / "reports").mkdir()
        casebox = str(REPO / ".venv/bin/casebox")
        # Every case passes (exit 0); from the second run on, the identical report already there is accepted.
        evaluate = [casebox, "evaluate", "--plan", str(plan_path), "--attempt", ATTEMPT, "--bundle-sha256", BUNDLE,
                    "--report-dir", str(base / "reports"), "--evidence", *map(str, shards)]
        value = median_seconds(lambda: run_quietly(evaluate), repeat=9)
        anchor = median_seconds(lambda: run_quietly([casebox, "plan", "check", str(plan_path)]), repeat=9)
    return {
        "metric": "evaluate_64_cases_ms",
        "value": round(value * 1000, 2),
        "unit": "ms",
        "anchor": "casebox plan check (same plan)",
        "anchor_value": round(anchor * 1000, 2),
    }


METRICS = {"evaluate_64_cases_ms": evaluate_64_cases_ms}
