"""Shared timing helpers for the benchmarks."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from typing import Callable

REAL_PYTHON = os.path.realpath(sys.executable)


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
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kwargs)
