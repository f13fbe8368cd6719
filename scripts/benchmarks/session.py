"""A whole verification session's overhead: ten trivial cases through casebox verify (run as root).

The candidate is one wheel whose module does nothing (``python -S -m
bench_true`` exits 0 at once), the plan ten python-module cases of it, and
the index holds only the installer (pip), so there is nothing to resolve.
Each repetition is one full ``verify``: preflight, extraction in a sandbox,
resolution in a sandbox, install with pip in a sandbox, ten case sandboxes,
cleanup, retirement and evaluation, in a fresh state root.

- session_ten_trivial: the whole session's wall time minus the ten ops' own
  wall time, against ten cold sandboxes (start, ``true``, teardown) through
  the starter alone, measured in this run: the floor of one sandbox per case.
- session_per_case: the case phase's wall time minus the ops' own, per case,
  against the bwrap run of sandbox_cold's anchor, measured in this run (goal:
  at most 4x); the line also gives ``sandbox_hot`` (one more op in a READY
  sandbox), the floor of an op with no sandbox of its own, and the same
  sessions with no sandbox started ahead (``none_ahead_ms``, sandboxes_ahead 0).

Both lines carry the phase breakdown in ms.

- session_real: a plan of ten pytest cases over a verifier tree that uses
  the hypothesis plugin (scripts/benchmarks/real: the candidate, the
  verifier tree and the offline index), the whole ``verify`` against the
  same work in a plain venv, in this run: ``python -m venv``, ``pip install
  --no-index`` of the same wheels, and the same ten ``python -m pytest``
  runs. The line also gives the cases alone (each op's wall time against
  each venv run's).
"""

from __future__ import annotations

import functools
import glob
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

import sandbox as sandbox_bench

from executor.cli import config as configuration
from executor.transport import pack, wheelbuild
from executor.cli.commands.demo import DEMO_INSTALLER
from executor.cli.reporting import Progress
from executor.cases.runtime import choose_interpreter
from executor.attempt import Attempt, run_attempt
from timing import HOST_ENV

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = 10
REPEAT = 3
REAL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "real")
REAL_TESTS = ("round_trip", "runs_differ", "counts_positive", "merge_sorted", "merge_empty", "clamp_bounds",
              "clamp_identity", "chunks_join", "chunks_size", "chunks_count")
PHASES = ("preflight", "opening", "extracting", "resolving", "installing", "running", "cleanup", "evaluating")


def _candidate(directory: str) -> tuple[str, str]:
    source = os.path.join(directory, "bench-true")
    os.makedirs(os.path.join(source, "bench_true"))
    with open(os.path.join(source, "pyproject.toml"), "w") as file:
        file.write('[project]\nname = "bench-true"\nversion = "1.0.0"\ndescription = "does nothing"\nrequires-python = ">=3.8"\n')
    for name in ("__init__.py", "__main__.py"):
        with open(os.path.join(source, "bench_true", name), "w") as file:
            file.write("")
    name, data = wheelbuild.build_wheel(source)
    bundle = pack.build([(name, data)])
    path = os.path.join(directory, "candidate.tar")
    with open(path, "wb") as file:
        file.write(bundle)
    return path, pack.coordinate(bundle).sha256


def _inputs(directory: str) -> dict:
    bundle, sha256 = _candidate(directory)
    plan = os.path.join(directory, "plan.json")
    cases = [{"id": f"true-{n}", "op": "python-module", "args": ["bench_true"], "timeout_ms": 30_000, "applicable": True,
              "expect_exit": 0} for n in range(CASES)]
    with open(plan, "w") as file:
        json.dump({"schema": "casebox.plan.v1", "cases": cases}, file)
    index = os.path.join(directory, "index")
    os.mkdir(index)
    verifier = os.path.join(directory, "verifier")
    os.mkdir(verifier)
    installer = os.path.join(REPO, "examples", "index", DEMO_INSTALLER)
    return {"bundle": bundle, "sha256": sha256, "plan": plan, "index": index, "verifier_tree": verifier, "installer": installer}


def _config(directory: str, ahead: int | None = None) -> configuration.Config:
    defaults = configuration.load()
    uid = int(os.environ.get("CASEBOX_TEST_UID", defaults.sandbox_uid))
    gid = int(os.environ.get("CASEBOX_TEST_GID", os.environ.get("CASEBOX_TEST_UID", defaults.sandbox_gid)))
    return defaults.overridden(state_root=os.path.join(directory, "state"), sandbox_uid=uid, sandbox_gid=gid, sandboxes_ahead=ahead)


def _one(directory: str, inputs: dict, number: int, python: str | None = None, ahead: int | None = None) -> dict:
    marks: list[tuple[str, float]] = []

    class Marks(Progress):
        def __call__(self, step: str) -> None:
            marks.append((step, time.perf_counter()))

    progress = Marks(quiet=True)

    start = time.perf_counter()
    attempt = Attempt(attempt_id=f"bench-{number}", evidence=os.path.join(directory, f"evidence-{number}"), python=python, **inputs)
    verified = run_attempt(_config(directory, ahead), attempt, progress=progress)
    end = time.perf_counter()
    if verified.report.verdict != "PASS":
        raise SystemExit(f"session benchmark: the trivial plan was {verified.report.verdict}: {verified.notes}")
    ops = sum(result.wall_ms for result in verified.report.cases) / 1000
    times = {}
    for phase in PHASES:
        times[phase] = next(moment for line, moment in marks if line.startswith(phase))
    breakdown = {}
    for here, after in zip(PHASES, PHASES[1:] + ("end",)):
        breakdown["cases" if here == "running" else here] = round(((times.get(after) or end) - times[here]) * 1000, 1)
    cases = times["cleanup"] - times["running"]
    return {"whole": end - start - ops, "per_case": (cases - ops) / CASES, "breakdown": breakdown}


@functools.lru_cache(maxsize=3)
def _measure(python: str | None = None, ahead: int | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="casebox-bench-") as directory:
        inputs = _inputs(directory)
        _one(directory, inputs, 0, python, ahead)
        runs = [_one(directory, inputs, number, python, ahead) for number in range(1, REPEAT + 1)]
    middle = sorted(runs, key=lambda run: run["whole"])[len(runs) // 2]
    return {
        "whole": statistics.median(run["whole"] for run in runs),
        "per_case": statistics.median(run["per_case"] for run in runs),
        "breakdown": middle["breakdown"],
    }


def _ten_cold_ms() -> float:
    return sandbox_bench.sandbox_cold()["value"] * CASES


def session_ten_trivial() -> dict:
    measured = _measure()
    return {"metric": "session_ten_trivial", "value": round(measured["whole"] * 1000, 1), "unit": "ms",
            "anchor": "ten cold sandboxes (start, true, teardown) through the starter alone", "anchor_value": round(_ten_cold_ms(), 1),
            "goal_ms": 1000, "breakdown_ms": measured["breakdown"]}


def session_per_case() -> dict:
    measured = _measure()
    alone = _measure(ahead=0)
    return {"metric": "session_per_case", "value": round(measured["per_case"] * 1000, 2), "unit": "ms",
            "anchor": sandbox_bench.BWRAP_NAME, "anchor_value": round(sandbox_bench.bwrap_ms(), 2), "goal_ratio": 4,
            "sandboxes_ahead": _config("/").sandboxes_ahead, "none_ahead_ms": round(alone["per_case"] * 1000, 2),
            "sandbox_hot_ms": sandbox_bench.sandbox_hot()["value"], "breakdown_ms": measured["breakdown"]}


def _outside_usr() -> str | None:
    """A CPython outside /usr to stand in for a CI job's setup-python one: CASEBOX_BENCH_PYTHON, else the newest
    pyenv 3.12 or 3.13 of this machine."""
    chosen = os.environ.get("CASEBOX_BENCH_PYTHON")
    if chosen:
        return chosen
    found = sorted(glob.glob("/root/.pyenv/versions/3.1[23].*/bin/python3.1[23]"))
    return found[-1] if found else None


def session_ten_trivial_python() -> dict:
    """The same session with --python set to a runtime outside /usr (its prefix mounted at its own path, its
    inventory on a thread of its own) against the default runtime's, in this run. Goal: within 10%."""
    python = _outside_usr()
    if python is None:
        raise SystemExit("session_ten_trivial_python: no CPython outside /usr; set CASEBOX_BENCH_PYTHON")
    measured = _measure(python)
    return {"metric": "session_ten_trivial_python", "value": round(measured["whole"] * 1000, 1), "unit": "ms",
            "anchor": "session_ten_trivial on the /usr runtime, this run", "anchor_value": round(_measure()["whole"] * 1000, 1),
            "python": python, "goal_ratio": 1.1, "breakdown_ms": measured["breakdown"]}


def _real_inputs(directory: str) -> dict:
    name, data = wheelbuild.build_wheel(os.path.join(REAL, "candidate"))
    bundle = pack.build([(name, data)])
    path = os.path.join(directory, "candidate.tar")
    with open(path, "wb") as file:
        file.write(bundle)
    cases = [{"id": test.replace("_", "-"), "op": "pytest", "args": [f"tests/test_props.py::test_{test}"], "applicable": True,
              "expect_exit": 0} for test in REAL_TESTS]
    plan = os.path.join(directory, "plan.json")
    with open(plan, "w") as file:
        json.dump({"schema": "casebox.plan.v2", "runner": ["pytest", "hypothesis"], "plugins": ["hypothesispytest"],
                   "cases": cases}, file)
    wheel = os.path.join(directory, name)
    with open(wheel, "wb") as file:
        file.write(data)
    return {"bundle": path, "sha256": pack.coordinate(bundle).sha256, "plan": plan, "index": os.path.join(REAL, "index"),
            "verifier_tree": os.path.join(REAL, "verifier"),
            "installer": os.path.join(REPO, "examples", "index", DEMO_INSTALLER)}, wheel


def _real_casebox(directory: str, inputs: dict, number: int) -> tuple[float, float]:
    start = time.perf_counter()
    attempt = Attempt(attempt_id=f"bench-real-{number}", evidence=os.path.join(directory, f"evidence-real-{number}"), **inputs)
    verified = run_attempt(_config(directory), attempt, progress=Progress(quiet=True))
    whole = time.perf_counter() - start
    if verified.report.verdict != "PASS":
        raise SystemExit(f"session_real: the plan was {verified.report.verdict}: {verified.notes}")
    return whole, sum(result.wall_ms for result in verified.report.cases) / 1000


def _real_venv(directory: str, wheel: str, number: int) -> tuple[float, float]:
    """The same work as a user does it by hand: a venv, pip install from the same index, the ten cases."""
    venv = os.path.join(directory, f"venv-{number}")
    quiet = {"check": True, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": HOST_ENV}
    start = time.perf_counter()
    subprocess.run([choose_interpreter(), "-m", "venv", venv], **quiet)
    python = os.path.join(venv, "bin", "python")
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", os.path.join(REAL, "index"),
                    "pytest", "hypothesis", wheel], **quiet)
    verifier = os.path.join(directory, f"verifier-{number}")
    shutil.copytree(os.path.join(REAL, "verifier"), verifier)
    cases = 0.0
    for test in REAL_TESTS:
        begin = time.perf_counter()
        subprocess.run([python, "-m", "pytest", "-q", f"tests/test_props.py::test_{test}"],
                       cwd=verifier, **quiet)
        cases += time.perf_counter() - begin
    return time.perf_counter() - start, cases


def session_real() -> dict:
    with tempfile.TemporaryDirectory(prefix="casebox-bench-real-") as directory:
        inputs, wheel = _real_inputs(directory)
        _real_casebox(directory, inputs, 0)
        casebox = [_real_casebox(directory, inputs, number) for number in range(1, REPEAT + 1)]
        venv = [_real_venv(directory, wheel, number) for number in range(REPEAT)]
    cases, venv_cases = statistics.median(run[1] for run in casebox), statistics.median(run[1] for run in venv)
    return {"metric": "session_real", "value": round(statistics.median(run[0] for run in casebox) * 1000, 1), "unit": "ms",
            "anchor": "a plain venv: python -m venv, pip install --no-index of the same wheels, the same ten pytest runs",
            "anchor_value": round(statistics.median(run[0] for run in venv) * 1000, 1), "goal_ratio": 1.2,
            "cases_ms": round(cases * 1000, 1), "venv_cases_ms": round(venv_cases * 1000, 1),
            "cases_ratio": round(cases / venv_cases, 3)}


METRICS = {"session_ten_trivial": session_ten_trivial, "session_per_case": session_per_case,
           "session_ten_trivial_python": session_ten_trivial_python, "session_real": session_real}
