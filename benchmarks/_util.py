"""Shared helpers for the benchmark scripts: robust timing and JSON output."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"


def wall_times(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> list[float]:
    """Wall time in seconds of each of ``repeats`` calls of ``fn``, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def best_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    """Minimum wall time (the least-disturbed run on a shared machine)."""
    return min(wall_times(fn, repeats, warmup))


def median_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    return statistics.median(wall_times(fn, repeats, warmup))


def write_json(name: str, data: dict) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / name
    path.write_text(json.dumps(data, indent=2))
    return path
