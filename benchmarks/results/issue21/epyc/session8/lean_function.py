"""How much of ``snip_fp32``'s step overhead is a Python autograd Function as such (§7s)?

Three arms of ``tiny-deep``, one process, 1 thread, interleaved rounds (2 warm-up, 10 timed),
process CPU time, medians of the per-round ratio to plain fp32: plain fp32; ``snip_fp32``
(converted, nothing quantized); and *lean*, every converted layer's forward replaced by
``profile_layer_step.MinimalLinearFn``, the same three fp32 GEMMs and nothing else.  Exploratory,
one run:

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session8/lean_function.py
"""

import statistics
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # benchmarks/
from bench_train_step import Arm, batch_for  # noqa: E402
from profile_layer_step import MinimalLinearFn  # noqa: E402
from snip.nn import QLinear  # noqa: E402

torch.set_num_threads(1)


class LeanLinear(nn.Linear):
    """A layer whose forward is profile_layer_step.py's minimal Function."""

    def forward(self, x):
        return MinimalLinearFn.apply(x, self.weight)


def main() -> None:
    batch = batch_for("tiny-deep")
    arms = {a: Arm("tiny-deep", a, batch) for a in ("fp32", "snip_fp32")}
    arms["lean"] = Arm("tiny-deep", "fp32", batch)
    converted = {n for n, m in arms["snip_fp32"].model.named_modules() if isinstance(m, QLinear)}
    for name, m in arms["lean"].model.named_modules():
        if name in converted:
            assert type(m) is nn.Linear and m.bias is None
            m.__class__ = LeanLinear
    print(f"tiny-deep, {len(converted)} layers, 1 thread, CPU time")
    times: dict[str, list[float]] = {a: [] for a in arms}
    for r in range(12):
        for a, arm in arms.items():
            t = arm.step()[1]
            if r >= 2:
                times[a].append(t)
    for a, ts in times.items():
        ratio = statistics.median(t / b for t, b in zip(ts, times["fp32"], strict=True))
        print(f"{a:10s} {statistics.median(ts) * 1e3:6.1f} ms  {ratio:.3f}")


if __name__ == "__main__":
    main()
