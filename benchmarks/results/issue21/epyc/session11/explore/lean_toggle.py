"""Scratch (session 11, descriptive): what a minimal ``quantize_operand`` would save in the step.

One process, ``tiny-deep``: the plain fp32 step, then the given preset's step with the real
``quantize_operand`` and with a minimal one (no identity, device, ``SNIP_FAST``, dtype or
thread checks: not a candidate for the code, only a bound), alternated for 40 rounds; prints
medians, ratios to fp32 and the mean lean - real difference of the fp32 step, +- 2.02 SE.

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session11/explore/lean_toggle.py mxfp4

It finds the plan of a call in either tree's cache layout (before: ``(run, choice, nvfp4)``
tuples keyed by (spec, shape, axis, sr, counters); after: ``_FusedCall`` objects).
"""
import statistics
import sys

import torch

import snip.nn.gemm as gemm
from snip.formats import Rounding, ScaleFormat, fast

sys.path.insert(0, "benchmarks")
from bench_train_step import Arm  # noqa: E402
from profile_step_calls import _batch  # noqa: E402

torch.set_num_threads(1)
_REAL = gemm.quantize_operand
_C: dict = {}
_np = fast._np


def _run_of(x, spec, axis, sr):
    fast.quantize_fused(x.contiguous(), spec, axis, Rounding.STOCHASTIC if sr else Rounding.RNE, 1)
    for key, entry in fast._PLANS.items():
        if key[0] == spec and key[1] == x.shape and key[2] == axis and key[3] == sr:
            return entry.run if hasattr(entry, "run") else entry[0]
    raise KeyError


def lean(x, spec, axis, rounding, seed, tokens=None, bf16=False, activation=False):
    if tokens is None and not bf16 and x.dtype is torch.float32:
        key = (spec, axis, rounding, x.shape)
        c = _C.get(key)
        if c is None:
            c = False
            if (fast.kernel_for(x, spec, rounding) is fast.Kernel.FUSED
                    and spec.scale_format is not ScaleFormat.E4M3):
                sr = rounding is Rounding.STOCHASTIC
                c = (_run_of(x, spec, axis, sr), sr)
            _C[key] = c
        if c:
            run, sr = c
            x = x.contiguous()
            out = torch.empty_like(x)
            k0, k1 = fast.seed_key(seed) if sr else (0, 0)
            run(_np(x), _np(out), k0, k1)
            return out
    return _REAL(x, spec, axis, rounding, seed, tokens, bf16=bf16, activation=activation)


preset = sys.argv[1]
batch = _batch("tiny-deep", 1024)
base = Arm("tiny-deep", "fp32", batch)
q = Arm("tiny-deep", preset, batch)
T: dict[str, list[float]] = {"fp32": [], "real": [], "lean": []}
for r in range(42):
    t = base.step()[1]
    if r >= 2:
        T["fp32"].append(t)
    for m in (("real", "lean") if r % 2 == 0 else ("lean", "real")):
        gemm.quantize_operand = lean if m == "lean" else _REAL
        t = q.step()[1]
        gemm.quantize_operand = _REAL
        if r >= 2:
            T[m].append(t)
f = statistics.median(T["fp32"])
for k, v in T.items():
    print(k, round(statistics.median(v) * 1e3, 2), round(statistics.median(v) / f, 3))
d = [(a - b) / f for a, b in zip(T["lean"], T["real"], strict=True)]
print("lean-real", round(statistics.mean(d), 4), "+-",
      round(2.02 * statistics.stdev(d) / len(d) ** 0.5, 4), "kinds", len(_C))
