"""Per-tensor-type frozen-fraction curves and their predicted-vs-measured plot."""

from __future__ import annotations

import numpy as np
import pytest

from snip.audit import ALL, by_type, plot_frozen_by_type, tensor_types

NAMES = ["layers.0.attention.wq.weight", "layers.1.attention.wq.weight",
         "layers.0.feed_forward.w1.weight", "output.weight"]


def test_tensor_types_group_layers_by_last_component():
    assert tensor_types(NAMES) == {"wq": NAMES[:2], "w1": [NAMES[2]], "output": [NAMES[3]]}


def test_by_type_is_numel_weighted():
    curves = {NAMES[0]: [0.0, 1.0], NAMES[1]: [1.0, 1.0], NAMES[2]: [0.5, 0.5],
              NAMES[3]: [0.0, 0.0]}
    numel = {NAMES[0]: 3, NAMES[1]: 1, NAMES[2]: 2, NAMES[3]: 2}
    out = by_type(curves, numel)
    assert list(out) == [ALL, "wq", "w1", "output"]
    np.testing.assert_allclose(out["wq"], [0.25, 1.0])
    np.testing.assert_allclose(out[ALL], [(1 + 1) / 8, (3 + 1 + 1) / 8])


def test_plot_frozen_by_type_marks_crossings(tmp_path):
    pytest.importorskip("matplotlib")
    steps = np.arange(0, 100, 5)
    ramp = np.clip((steps - 40) / 40, 0, 1)  # > 1/2 first (and for good) at step 65
    spiky = ramp.copy()
    spiky[1] = 0.9  # a warm-up transient above 1/2 at step 5
    pred = (steps, {ALL: spiky, "wq": ramp, "w1": np.zeros_like(ramp)})
    meas = (steps, {ALL: np.clip((steps - 45) / 40, 0, 1), "wq": ramp})  # ALL: 70
    path = tmp_path / "f.png"
    crossings = plot_frozen_by_type(pred, meas, path, title="synthetic")
    assert crossings == {ALL: {"first": (5, 70), "permanent": (65, 70)},
                         "wq": {"first": (65, 65), "permanent": (65, 65)},
                         "w1": {"first": (None, None), "permanent": (None, None)}}
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    # predicted only (no measured run): measured crossings None
    only = plot_frozen_by_type(pred, None, tmp_path / "g.png", title="p")
    assert only[ALL] == {"first": (5, None), "permanent": (65, None)}
