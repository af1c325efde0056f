"""The isolated cost of the per-call reads §7k replaced, old against new, in one process.

    PYTHONPATH=src python benchmarks/results/issue21/xeon/session3/per_call_reads.py

Each pair (old way, new way) is timed in interleaved rounds (wall clock, 20,000 calls a
round, 7 rounds; medians in microseconds per call), and the JSON beside this script keeps
every round.  Isolated figures only: in a training step each such call costs several times
as much (cold caches), which is what the pre-registered step comparison measures.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from snip.formats import fast

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))  # the repository root
from benchmarks._util import cpu_info  # noqa: E402

CAST = importlib.import_module("snip.formats.cast")  # the module (snip.formats.cast is a function)
OUT = Path(__file__).with_name("per_call_reads.json")


def per_call_us(fn, calls: int = 20_000) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    x = torch.randn(1024, 64)
    seed = 0x1234_5678_9ABC
    pairs = {
        "seed_key": (lambda: CAST.seed_key(seed), lambda: fast.seed_key(seed)),
        "SNIP_FAST read": (lambda: os.environ.get("SNIP_FAST", "1"), fast.enabled),
        "autocast check": (lambda: torch.is_autocast_enabled(x.device.type),
                           lambda: torch.is_autocast_enabled("cpu" if x.is_cpu else "")),
        "no-autocast context": (contextlib.nullcontext, lambda: None),
        "float() of fp32": (x.float, lambda: x if x.dtype == torch.float32 else x.float()),
    }
    rounds: dict[str, list[tuple[float, float]]] = {k: [] for k in pairs}
    for fns in pairs.values():  # warm-up (numba loads seed_key from its cache)
        for f in fns:
            per_call_us(f, 1000)
    for _ in range(7):
        for name, (old, new) in pairs.items():
            rounds[name].append((per_call_us(old), per_call_us(new)))
    result = {}
    for name, rs in rounds.items():
        old = statistics.median(r[0] for r in rs)
        new = statistics.median(r[1] for r in rs)
        result[name] = {"old_us": old, "new_us": new, "rounds": rs}
        print(f"{name:20s} old {old:6.3f} us   new {new:6.3f} us")
    doc = {"command": "PYTHONPATH=src python " + str(Path(__file__).relative_to(Path.cwd())),
           "cpu": cpu_info(), "torch": torch.__version__, "results": result}
    OUT.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
