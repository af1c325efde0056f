"""What a layer's ``tokens`` switching costs (descriptive scratch, session 13): setting
``QLinear.tokens`` and making the forward's config, 20000 times, with the same shard every time
("stable") and with two shards in turn ("alternating": what ``--train.grad_accum 2`` does to
every layer each micro-batch).  Run it on each tree:

    PYTHONPATH=<tree>/src python benchmarks/results/issue21/epyc/session13/explore/config_switch.py
"""

import time

import torch

from snip.formats import RowShard
from snip.nn import convert

model = torch.nn.Sequential(torch.nn.Linear(64, 64))
convert(model, "mxfp4")
layer = model[0]
first, second = RowShard(0, 2048), RowShard(1024, 2048)


def per_call(alternate: bool, n: int = 20000) -> float:
    t = time.perf_counter()
    for i in range(n):
        layer.tokens = first if (alternate and i & 1) else second
        layer._config(torch.float32)
    return (time.perf_counter() - t) / n * 1e6


print(f"stable {per_call(False):.1f} us, alternating {per_call(True):.1f} us a switch")
