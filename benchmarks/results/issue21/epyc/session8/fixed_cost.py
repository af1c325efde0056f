"""A quantizer call's fixed cost alone (§7s): best of 7 rounds of 5000 ``quantize_operand``
calls on a 1 x 32 row and a 64 x 64 matrix, per preset, process CPU time, 1 thread.  Run it
with each tree's ``src`` on ``PYTHONPATH``:

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session8/fixed_cost.py
"""

import time

import torch

from snip.formats import PRESETS, Rounding
from snip.nn.gemm import quantize_operand

torch.set_num_threads(1)


def best_us(f, n: int = 5000) -> float:
    for _ in range(100):
        f()
    rounds = []
    for _ in range(7):
        t0 = time.process_time()
        for _ in range(n):
            f()
        rounds.append((time.process_time() - t0) / n * 1e6)
    return min(rounds)


for preset in ("mxfp4", "nvfp4", "bf16"):
    spec = PRESETS[preset]
    for shape in ((1, 32), (64, 64)):
        x = torch.randn(*shape)
        us = best_us(lambda x=x, spec=spec: quantize_operand(x, spec, -1, Rounding.RNE, 0))
        print(f"{preset:6s} {shape!s:9s} {us:6.1f} us")
