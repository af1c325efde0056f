"""Exploratory: median CPU us per ``quantize_operand`` call for a few presets and shapes, under
whatever LLVM CPU model numba is given (``NUMBA_CPU_NAME``; see README.md here).

    ISA_PRESETS=mxfp4,fp8_e4m3,nvfp4 NUMBA_CPU_NAME=<model> PYTHONPATH=src \
        python benchmarks/results/issue21/xeon/cpu_model/explore/scan.py OUT.json
"""

import json
import os
import statistics
import sys
import time

import torch

from snip.formats import Rounding, get_spec
from snip.nn.gemm import quantize_operand

PRESETS = "mxfp4,nvfp4,fp8_e4m3,fp4_e2m1_tile128,mxfp8_e4m3"
COLS = (64, 192)  # the first version also had 704
ROUNDS, CALLS = 7, 20


def main() -> None:
    torch.set_num_threads(1)
    cases = [(p, c, ax, r) for p in os.environ.get("ISA_PRESETS", PRESETS).split(",")
             for c in COLS for ax in (-1, 0) for r in (Rounding.RNE, Rounding.STOCHASTIC)]
    xs = {c: torch.randn(1024, c) for c in COLS}
    for p, c, ax, r in cases:  # compile or load every kernel first
        quantize_operand(xs[c], get_spec(p), ax, r, 7)
    times: dict[int, list[float]] = {i: [] for i in range(len(cases))}
    for _ in range(ROUNDS):
        for i, (p, c, ax, r) in enumerate(cases):
            spec, x = get_spec(p), xs[c]
            t = time.process_time()
            for _ in range(CALLS):
                quantize_operand(x, spec, ax, r, 7)
            times[i].append((time.process_time() - t) / CALLS * 1e6)
    out = {f"{p} {c} {ax} {r.value}": statistics.median(times[i])
           for i, (p, c, ax, r) in enumerate(cases)}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
