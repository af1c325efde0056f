"""The bf16-output MX row call (mxfp4, 1024x192, axis -1) with its output placed at byte offsets
0..3840 from a 4 KiB boundary, the input fixed: us per call (200 calls after 5).

    PYTHONPATH=src python benchmarks/results/issue21/xeon/calls/out_offset.py
"""

import time

import numpy as np
import torch

from snip.formats import fast
from snip.formats.cast import Rounding
from snip.formats.spec import PRESETS

torch.set_num_threads(1)
x = torch.randn(1024, 192)
fast.quantize_fused(x, PRESETS["mxfp4"], -1, Rounding.RNE, 0, dtype=torch.bfloat16)
run = next(v for k, v in fast._PLANS.items() if k[1] == x.shape and k[2] == -1)[0]
xs = fast._np(x)
big = np.empty(1024 * 192 + 8192, np.uint16)
start = (-big.ctypes.data) % 4096 // 2
for off in range(0, 4096, 256):
    o = big[start + off // 2:start + off // 2 + 1024 * 192]
    for _ in range(5):
        run(xs, o, 0, 0)
    t0 = time.perf_counter()
    for _ in range(200):
        run(xs, o, 0, 0)
    us = (time.perf_counter() - t0) / 200 * 1e6
    print(f"out offset {off:5d} B (x at {xs.ctypes.data % 4096:4d} mod 4K): {us:7.1f} us")
