"""Scratch (session 12, descriptive): one planned quantizer call's time per element, median of
repeated calls on the same 128-wide operand, 1 thread, for 2^13-2^21 elements; whether the
kernels are bound by their arithmetic (flat ns/element while the operand stays in cache) or by
memory.

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session12/explore/ns_per_element.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from snip.formats import Rounding, fast, get_spec


def median_s(f: Callable[[], object], n: int) -> float:
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return sorted(ts)[n // 2]


def main() -> None:
    torch.set_num_threads(1)
    for name in ("mxfp4", "nvfp4", "mxfp8_e4m3"):
        spec = get_spec(name)
        for rnd in (Rounding.RNE, Rounding.STOCHASTIC):
            for axis in (-1, 0):
                line = f"{name:10s} {rnd.value:10s} ax{axis:2d}"
                for rows in (64, 256, 1024, 4096, 16384):
                    x = torch.randn(rows, 128)
                    call = fast.planned(x, spec, axis, rnd, torch.float32)
                    t = median_s(lambda x=x, call=call: call(x, 123),
                                 max(20, int(2e6 / x.numel())))
                    line += f"  {x.numel():>8d}:{t / x.numel() * 1e9:5.2f}"
                print(line, flush=True)


if __name__ == "__main__":
    main()
