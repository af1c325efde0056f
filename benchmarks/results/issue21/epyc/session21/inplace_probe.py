"""How much of the copy floor (RESULTS §7au) is writing a *new* buffer: the preset's step with
every quantizer call answered by *ident*, its input itself; *rewrite*, its input after its
memory was read and written in place (numpy, values unchanged, no version bump: the bytes a
quantizer that overwrote a dead input would touch); *copy*, a fresh copy
(``profile_step_calls.copy_operand``); and *real*, the real call.  Ratios of medians to the
fp32 step of the same process (8 rounds after 2, the four modes rotating their order), 1
thread, CPU time.  Exploratory and descriptive: one process per model; fp32-GEMM presets only
(a bf16 GEMM's operand is a new tensor whatever the quantizer does).

    PYTHONPATH=src:benchmarks python benchmarks/results/issue21/epyc/session21/inplace_probe.py \
        small nvfp4 OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys

import numpy as np
import torch

import profile_step_calls as p
import snip.nn.gemm as gemm
from bench_train_step import Arm
from snip.formats import fast


def ident(*a, **k) -> torch.Tensor:
    return p._SIGNATURE.bind(*a, **k).arguments["x"].float()


def rewrite(*a, **k) -> torch.Tensor:
    x = p._SIGNATURE.bind(*a, **k).arguments["x"].float().contiguous()
    view = fast._np(x)
    view *= np.float32(1.0)  # reads and writes x's memory in place
    return x


def main() -> None:
    model, preset, out = sys.argv[1], sys.argv[2], sys.argv[3]
    assert "@" not in preset, "fp32-GEMM presets only"
    torch.set_num_threads(1)
    batch = p._batch(model, 1024)
    arms = {a: Arm(model, a, batch) for a in ("fp32", "snip_fp32")}
    q = Arm(model, preset, batch)
    modes = {"real": p._REAL, "ident": ident, "rewrite": rewrite, "copy": p.copy_operand}
    times: dict[str, list[float]] = {k: [] for k in ("fp32", "snip_fp32", *modes)}
    for r in range(10):
        for k in ("fp32", "snip_fp32"):
            t = arms[k].step()[1]
            if r >= 2:
                times[k].append(t)
        order = list(modes.items())
        for m, f in order[r % 4:] + order[:r % 4]:
            gemm.quantize_operand = f
            try:
                t = q.step()[1]
            finally:
                gemm.quantize_operand = p._REAL
            if r >= 2:
                times[m].append(t)
    base = statistics.median(times["fp32"])
    ratios = {k: statistics.median(v) / base for k, v in times.items()}
    print(model, preset, "  ".join(f"{k} {v:.3f}" for k, v in ratios.items()),
          f"(fp32 {base * 1e3:.1f} ms)")
    with open(out, "w") as f:
        json.dump({"command": " ".join(sys.argv), "cpu": p.cpu_info(), "model": model,
                   "preset": preset, "fp32_ms": base * 1e3, "ratios": ratios,
                   "times_s": times}, f, indent=1)


if __name__ == "__main__":
    main()
