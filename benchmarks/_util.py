"""Shared helpers for the benchmark scripts: robust timing and JSON output."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"


def preset_and_accum(arm: str) -> tuple[str, str]:
    """An arm's preset and GEMM arithmetic: ``"mxfp4@auto"`` -> ``("mxfp4", "auto")``
    (``accum="auto"``, `--precision.accum auto`); a bare preset runs fp32 GEMMs (the default)."""
    preset, _, accum = arm.partition("@")
    return preset, accum or "fp32"


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


def warm_kernels() -> None:
    """Fill numba's cache in a child process (``python -m snip.formats.warm``), so that this
    process loads every quantizer kernel and every run of a benchmark starts the same way,
    whether or not an earlier process compiled them (RESULTS §7g)."""
    subprocess.run([sys.executable, "-m", "snip.formats.warm"], check=True)


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


def cpu_info() -> dict[str, object]:
    """CPU model and the flags that decide kernel speed (AVX2/AVX-512/bf16/AMX), from lscpu."""
    import platform
    import subprocess

    model, flags = platform.processor() or platform.machine(), []
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model name":
                model = value.strip()
            elif key.strip() == "Flags":
                flags = value.split()
    except (OSError, subprocess.SubprocessError):
        pass
    wanted = ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "avx512_vnni", "avx512_fp16",
              "amx_bf16", "amx_tile", "amx_int8")
    have = [f for f in wanted if f in flags]
    import os

    cores = os.cpu_count()
    return {"model": model, "cores": cores, "flags": have,
            "summary": f"{model}, {cores} cores, {' '.join(have) or 'no AVX2'}"}
