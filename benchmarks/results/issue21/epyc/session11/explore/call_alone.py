"""Scratch (session 11, descriptive): one quantizer call alone, and its parts.

For an mxfp4 operand at 64 x 64 and 1024 x 64, both axes, RNE and SR: the planned numba run
alone, ``fast.quantize_fused`` and ``snip.nn.gemm.quantize_operand`` (best of 5 x 3000 calls,
us), then the small pieces of a call.  Run in each tree (before/after the planned calls):

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session11/explore/call_alone.py
"""
import time

import torch

from snip.formats import Rounding, fast, get_spec
from snip.nn.gemm import quantize_operand

torch.set_num_threads(1)
spec = get_spec("mxfp4")


def bench(f, n=3000):
    for _ in range(200):
        f()
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
    return best


def planned_run(x, axis, rnd):
    """The numba run of this kind of call, in either tree's plan cache."""
    sr = rnd is Rounding.STOCHASTIC
    for key, entry in fast._PLANS.items():
        if key[0] == spec and key[1] == x.shape and key[2] == axis and key[3] == sr:
            return entry.run if hasattr(entry, "run") else entry[0]
    raise KeyError


for shape in [(64, 64), (1024, 64)]:
    x = torch.randn(*shape)
    for axis in (-1, 0):
        for rnd in (Rounding.RNE, Rounding.STOCHASTIC):
            out = torch.empty_like(x)
            fast.quantize_fused(x, spec, axis, rnd, 5)
            run = planned_run(x, axis, rnd)
            xs, os_ = fast._np(x), fast._np(out)
            a = bench(lambda run=run, xs=xs, os_=os_: run(xs, os_, 1, 2))
            b = bench(lambda x=x, axis=axis, rnd=rnd: fast.quantize_fused(x, spec, axis, rnd, 5))
            c = bench(lambda x=x, axis=axis, rnd=rnd: quantize_operand(x, spec, axis, rnd, 5,
                                                                       activation=True))
            print(shape, axis, rnd.name,
                  f"run {a:.2f}  quantize_fused {b:.2f}  quantize_operand {c:.2f}")
x = torch.randn(64, 64)
print("torch.empty_like", bench(lambda: torch.empty_like(x)))
print("fast.empty_like", bench(lambda: fast.empty_like(x, None)))
print("fast.seed_key", bench(lambda: fast.seed_key(12345678901)))
print("fast._np", bench(lambda: fast._np(x)))
print("fast.kernel_for", bench(lambda: fast.kernel_for(x, spec, Rounding.RNE)))
