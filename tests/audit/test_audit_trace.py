"""Reference trace: recording, projection, save/load round trip, forecast helpers."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from snip.audit import (
    ReferenceRecorder,
    ReferenceTrace,
    compare_crossings,
    first_crossing,
    freeze_only_mask,
    measured_series,
    reference_mask,
)
from snip.optim import WritebackOptimizer, eligible_parameters


def _run(n_steps: int = 5):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    rec = ReferenceRecorder(eligible_parameters(m), formats=("e4m3", "bf16"), tile_size=64,
                            score_steps=3, tiles=True)
    g = torch.Generator().manual_seed(1)
    for _ in range(n_steps):
        opt.zero_grad()
        nn.functional.mse_loss(m(torch.randn(8, 16, generator=g)), torch.zeros(8, 8)).backward()
        rec.step(opt)
    return rec.trace(meta={"model": "mlp"})


def test_trace_round_trip(tmp_path):
    tr = _run()
    back = ReferenceTrace.load(tr.save(tmp_path / "t.npz"))
    assert back.names == tr.names and back.shapes == tr.shapes and back.score_steps == 3
    np.testing.assert_array_equal(back.projected("e4m3"), tr.projected("e4m3"))
    np.testing.assert_array_equal(back.score["0.weight"], tr.score["0.weight"])
    np.testing.assert_array_equal(back.tile_frozen["bf16"]["2.weight"],
                                  tr.tile_frozen["bf16"]["2.weight"])
    assert back.meta == {"model": "mlp"} and len(back.steps) == 5
    # e4m3 at lr 1e-3 on std ~0.1 weights: mostly frozen; bf16 mostly not
    assert tr.projected("e4m3")[-1] > 0.5 > tr.projected("bf16")[-1]
    assert reference_mask(back, 0.25).protected == round(0.25 * (16 * 32 + 32 * 8))
    assert freeze_only_mask(back, "e4m3", 0.25).protected == reference_mask(back, 0.25).protected


def test_crossings_and_measured_series():
    assert first_crossing([1, 2, 3, 4], [0.1, 0.6, 0.4, 0.7]) == 2
    assert first_crossing([1, 2, 3, 4], [0.1, 0.6, 0.4, 0.7], permanent=True) == 4
    assert first_crossing([1, 2], [0.1, 0.2]) is None
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(100, 8) * 0.02)
    opt = WritebackOptimizer(torch.optim.AdamW([w], lr=1e-3), [("w", w)], tile_size=64)
    for _ in range(3):
        w.grad = torch.randn_like(w)
        opt.step()
    steps, f = measured_series(opt.history)
    assert list(steps) == [1, 2, 3] and f.shape == (3,)
    c = compare_crossings(steps, f, steps, f)
    assert c["error_steps"] == 0 and c["mean_abs_gap"] == 0.0
