"""Benchmark runner: discovers METRICS in scripts/benchmarks/*.py and prints JSON lines."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
FIELDS = ("metric", "value", "unit", "anchor", "anchor_value")


def discover() -> dict:
    sys.path[:0] = [str(REPO), str(HERE)]
    metrics = {}
    for path in sorted(HERE.glob("*.py")):
        if path.name in ("run.py", "timing.py"):
            continue
        spec = importlib.util.spec_from_file_location(f"benchmarks_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for name, function in module.METRICS.items():
            if name in metrics:
                raise SystemExit(f"scripts/bench: metric {name} is defined twice")
            metrics[name] = function
    return metrics


def main(names: list[str]) -> int:
    metrics = discover()
    unknown = [name for name in names if name not in metrics]
    if unknown:
        print(f"scripts/bench: unknown metric {unknown[0]}; known: {', '.join(sorted(metrics))}.", file=sys.stderr)
        return 64
    for name in names or sorted(metrics):
        result = metrics[name]()
        missing = [field for field in FIELDS if field not in result]
        if missing:
            raise SystemExit(f"scripts/bench: {name} did not report {missing[0]}")
        result["ratio"] = round(result["value"] / result["anchor_value"], 4) if result["anchor_value"] else None
        print(json.dumps(result, sort_keys=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
