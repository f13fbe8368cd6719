"""Shared timing helpers for the benchmarks."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from typing import Callable

REAL_PYTHON = os.path.realpath(sys.executable)
# Commands are timed as a host runs them: with the bytecode cache written on
# the first run. A session that sets PYTHONDONTWRITEBYTECODE would otherwise
# time a recompile of every casebox module on every start.
HOST_ENV = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}


def median_seconds(function: Callable[[], object], *, repeat: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        function()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def run_quietly(argv: list[str], **kwargs) -> None:
    kwargs.setdefault("env", HOST_ENV)
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kwargs)
