"""One GEMM operand's quantizer call (``fast.planned``, 1 thread) writing fp32 and writing
bf16, per preset, shape, axis and rounding: median us of 200 calls after 20, and the ratio
(descriptive; how session 19 found the bf16 column calls' slowdown, RESULTS §7an).

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session19/bf16_cols/calls.py [PRESETS]
"""
import statistics
import sys
import time

import torch

from snip.formats import Rounding, fast, get_spec

torch.set_num_threads(1)
torch.manual_seed(0)
PRESETS = ["bf16", "fp4_e2m1_tensor", "mxfp4", "nvfp4", "fp4_e2m1_tile128", "mxfp8_e4m3"]
presets = sys.argv[1].split(",") if len(sys.argv) > 1 else PRESETS
shapes = [(1024, 64), (1024, 192), (64, 64)]
for p in presets:
    spec = get_spec(p)
    for shp in shapes:
        x = torch.randn(*shp)
        for axis in (-1, 0):
            for rnd in (Rounding.RNE, Rounding.STOCHASTIC):
                row = []
                for dt in (torch.float32, torch.bfloat16):
                    call = fast.planned(x, spec, axis, rnd, dt)
                    if call is None:
                        row.append(float("nan"))
                        continue
                    for _ in range(20):
                        call(x, 123, False)
                    ts = []
                    for _ in range(200):
                        t = time.perf_counter()
                        call(x, 123, False)
                        ts.append(time.perf_counter() - t)
                    row.append(statistics.median(ts) * 1e6)
                print(f"{p:18s} {str(shp):12s} {axis:2d} {rnd.value:10s} f32 {row[0]:7.1f} "
                      f"bf16 {row[1]:7.1f}  x{row[1] / row[0]:.2f}", flush=True)
