"""The mechanism of PLAN.md on its own: an NVFP4 column call (wgrad's ``X`` or ``dY``) with the
tensor amax computed in its own pass against the same call taking the amax the row call kept
(``reuse_amax``), on the operand shapes of the ``--quick`` steps (1024 tokens) and one
4096-token shape; 1 thread, interleaved rounds, medians and their ratio.  Exploratory (not part
of the pre-registered analysis): it shows what the step comparison can at most see.

    PYTHONPATH=src python benchmarks/results/issue21/xeon/session6/amax_calls.py OUT.json
"""

import json
import statistics
import sys
import time

import torch

from snip.formats import fast, get_spec

try:
    from benchmarks._util import cpu_info
except ImportError:
    sys.path.insert(0, "benchmarks")
    from _util import cpu_info

NV = get_spec("nvfp4")
SHAPES = [(1024, 64), (1024, 128), (1024, 192), (1024, 256), (1024, 384), (1024, 704),
          (4096, 256)]
ROUNDS, CALLS = 15, 20


def per_call(fn) -> float:
    t = time.perf_counter()
    for _ in range(CALLS):
        fn()
    return (time.perf_counter() - t) / CALLS * 1e6


def main() -> None:
    torch.set_num_threads(1)
    rows = []
    for shape in SHAPES:
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
        fast.quantize_fused(x, NV, -1, fast.Rounding.RNE, None, reuse_amax=True)  # keeps it
        def own(x=x):
            return fast.quantize_fused(x, NV, 0, fast.Rounding.RNE, None)

        def kept(x=x):
            return fast.quantize_fused(x, NV, 0, fast.Rounding.RNE, None, reuse_amax=True)
        own(), kept()
        a, b = [], []
        for _ in range(ROUNDS):
            a.append(per_call(own))
            b.append(per_call(kept))
        ma, mb = statistics.median(a), statistics.median(b)
        rows.append({"shape": list(shape), "own_amax_us": ma, "kept_amax_us": mb,
                     "ratio": mb / ma, "own_rounds": a, "kept_rounds": b})
        print(f"{shape!s:12s} own amax {ma:8.1f} us   kept {mb:8.1f} us   ratio {mb / ma:.3f}")
    out = {"command": " ".join(sys.argv), "cpu": cpu_info(), "torch": torch.__version__,
           "rounds": ROUNDS, "calls_per_round": CALLS, "rows": rows}
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
