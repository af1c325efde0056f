"""Scratch (session 11, descriptive): are the weights' small quantizer calls dearer because they
run between GEMMs?

``profile_step_calls.py`` times each call inside the step at about 2-3x its cost alone (a
64 x 64 weight: ~45 us against ~19).  If that were the price of running between GEMMs (cold
caches, a cold Python path), quantizing every layer's weight along both axes in one tight loop
at the start of the step would save most of it.  One process, ``tiny-deep``: the preset's step
as it is against the same step with all 84 weight calls done first in a loop (the layers then
take the stored results), 40 alternated rounds; prints medians, ratios to fp32, the mean
difference +- 2.02 SE, and the loop alone.

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session11/explore/weights_prepass.py mxfp4
"""
import statistics
import sys
import time

import torch

import snip.nn.gemm as gemm
from snip.nn import QLinear

sys.path.insert(0, "benchmarks")
from bench_train_step import Arm  # noqa: E402
from profile_step_calls import _batch  # noqa: E402

torch.set_num_threads(1)
_REAL = gemm.quantize_operand
stash: dict = {}


def patched(x, spec, axis, rounding, seed, tokens=None, bf16=False, activation=False):
    if not activation:
        e = stash.get((x.data_ptr(), axis))
        if e is not None:
            return e
    return _REAL(x, spec, axis, rounding, seed, tokens, bf16=bf16, activation=activation)


preset = sys.argv[1]
batch = _batch("tiny-deep", 1024)
base = Arm("tiny-deep", "fp32", batch)
q = Arm("tiny-deep", preset, batch)
layers = [m for m in q.model.modules() if isinstance(m, QLinear)]


def prepass():
    stash.clear()
    for m in layers:
        w = m.weight
        f, d = m.specs.fprop.for_weight(), m.specs.dgrad.for_weight()
        stash[(w.data_ptr(), -1)] = _REAL(w, f, -1, f.rounding, 0)
        stash[(w.data_ptr(), 0)] = _REAL(w, d, 0, d.rounding, 0)


def step_pre():
    t0 = time.process_time()
    prepass()
    gemm.quantize_operand = patched
    try:
        q.step()
    finally:
        gemm.quantize_operand = _REAL
    return time.process_time() - t0


T: dict[str, list[float]] = {"fp32": [], "real": [], "pre": []}
for r in range(42):
    t = base.step()[1]
    if r >= 2:
        T["fp32"].append(t)
    for m in (("real", "pre") if r % 2 == 0 else ("pre", "real")):
        t = step_pre() if m == "pre" else q.step()[1]
        if r >= 2:
            T[m].append(t)
f = statistics.median(T["fp32"])
for k, v in T.items():
    print(k, round(statistics.median(v) * 1e3, 2), round(statistics.median(v) / f, 3))
d = [(a - b) / f for a, b in zip(T["pre"], T["real"], strict=True)]
print("pre-real", round(statistics.mean(d), 4), "+-",
      round(2.02 * statistics.stdev(d) / len(d) ** 0.5, 4))
t0 = time.perf_counter()
for _ in range(50):
    prepass()
print("prepass alone ms", (time.perf_counter() - t0) / 50 * 1e3)
