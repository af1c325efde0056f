"""Exploratory (descriptive, one process): where a quantizer call's in-step cost goes.

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session14/explore/run_twice.py \\
        MODEL PRESET

Eight training steps of ``bench_train_step``'s quick setup (1 thread).  Every planned kernel
run of the step is timed as it happens (``first``), then run again at once on the same data
(``again``: its code and data just touched), then on one of 64 copies of that operand made
when its kind was first seen, into a scratch output (``cold data``: the code just touched, the
input elsewhere in the cache hierarchy).  The repeated run writes the same output again and
the third a scratch one: the step computes what it would without them.  Mean microseconds per
call by kind (shape, stochastic, kernel); the step times are not measured.
"""

import collections
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))  # benchmarks/
import bench_train_step as B  # noqa: E402
import snip.formats.fast as FF  # noqa: E402

B.SHAPES.update(B.QUICK_SHAPES)
torch.set_num_threads(1)
model, preset = sys.argv[1], sys.argv[2]
arm = B.Arm(model, preset, B.batch_for(model))
for _ in range(3):
    arm.step()
stats: dict = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
copies: dict = {}
call = FF._FusedCall.__call__


def timed(self, x, gen, reuse_amax=False):
    run = self.run
    key = (tuple(x.shape), self.sr, getattr(run, "__name__", "?"))
    if key not in copies:
        copies[key] = ([torch.randn(x.shape) for _ in range(64)],
                       torch.empty(x.shape, dtype=self.dtype))

    def three(*a):
        t0 = time.perf_counter()
        r = run(*a)
        t1 = time.perf_counter()
        run(*a)
        t2 = time.perf_counter()
        s = stats[key]
        inputs, scratch = copies[key]
        other = (FF._np(inputs[s[0] % 64]), FF._np(scratch)) + a[2:]
        t3 = time.perf_counter()
        run(*other)
        t4 = time.perf_counter()
        s[0] += 1
        s[1] += t1 - t0
        s[2] += t2 - t1
        s[3] += t4 - t3
        return r

    self.run = three
    try:
        return call(self, x, gen, reuse_amax)
    finally:
        self.run = run


FF._FusedCall.__call__ = timed
for _ in range(8):
    arm.step()
print(f"{model} {preset}, 8 steps")
print(f"{'kind':45s} {'n/step':>6s} {'first':>7s} {'again':>7s} {'cold data':>9s}  (us)")
for k in sorted(stats, key=lambda k: -stats[k][1]):
    n, a, b, c = stats[k]
    print(f"{str(k):45s} {n // 8:6d} {a / n * 1e6:7.1f} {b / n * 1e6:7.1f} {c / n * 1e6:9.1f}")
