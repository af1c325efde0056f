"""Session 17's measurement of the one-thread twins on single quantizer calls (PLAN.md here):
one process, 1 thread; for each kind of call, blocks of 200 calls with the twins off and on by
turns (``snip.formats.fast._TWINS``), the median us of each block; per kind, the mean over
blocks of (on - off).  Writes the process's JSON.

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session17/calls_ab/calls_ab.py OUT
"""

import json
import statistics
import sys
import time
from pathlib import Path

import torch

from snip.formats import Rounding, fast, get_spec
from snip.nn.gemm import quantize_operand

KINDS = [("mxfp4", (64, 128), -1, Rounding.RNE), ("mxfp4", (1024, 128), -1, Rounding.RNE),
         ("mxfp4", (64, 128), -1, Rounding.STOCHASTIC), ("mxfp4", (1024, 128), 0,
                                                          Rounding.STOCHASTIC),
         ("nvfp4", (1024, 128), -1, Rounding.RNE), ("bf16", (1024, 128), -1, Rounding.RNE)]
BLOCKS, CALLS = 10, 200


def block(call) -> float:
    ts = []
    for _ in range(CALLS):
        t = time.perf_counter()
        call()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6


def main() -> None:
    torch.set_num_threads(1)
    out = {"command": " ".join(sys.argv), "blocks": BLOCKS, "calls": CALLS, "kinds": {}}
    for preset, shape, axis, rounding in KINDS:
        x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
        spec = get_spec(preset)

        def call(x=x, spec=spec, axis=axis, rounding=rounding):
            return quantize_operand(x, spec, axis, rounding, 3)
        us = {False: [], True: []}
        for b in range(BLOCKS + 1):
            for on in ((False, True) if b % 2 == 0 else (True, False)):
                fast._TWINS = on
                m = block(call)
                if b > 0:  # (the first pair of blocks warms both builds up)
                    us[on].append(m)
        fast._TWINS = True
        name = f"{preset} {shape[0]}x{shape[1]} axis {axis} {rounding.value}"
        out["kinds"][name] = {"off_us": us[False], "on_us": us[True],
                              "diff_us": statistics.mean(t - f for f, t in zip(
                                  us[False], us[True], strict=True))}
        print(name, round(out["kinds"][name]["diff_us"], 2), flush=True)
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
