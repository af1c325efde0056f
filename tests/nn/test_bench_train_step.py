"""benchmarks/bench_train_step.py's adaptive arms: with ``--auto`` the adaptive step has an
``@auto`` twin whose layers keep ``accum="auto"`` through the controller's re-plans (what
``snip train --precision.accum auto`` runs), and the summary reads each arm's own row."""

import pytest

from _benchmarks import load
from snip.nn import qlinear_layers
from snip.nn.specs import Accum

script = load("bench_train_step", "bench_train_step_script")


def test_the_adaptive_auto_arm_keeps_accum_auto_through_a_replan() -> None:
    batch = script.batch_for("tiny-deep")
    arms = {"fp32": script.Arm("tiny-deep", "fp32", batch),
            "snip_adaptive": script.AdaptiveArm("tiny-deep", batch),
            "snip_adaptive@auto": script.AdaptiveArm("tiny-deep", batch, auto=True)}
    for name, accum in (("snip_adaptive", Accum.FP32), ("snip_adaptive@auto", Accum.AUTO)):
        layers = qlinear_layers(arms[name].model)
        assert layers and all(m.accum is accum for _, m in layers), name
    rows = script.interleaved(arms, rounds=1, warmup=0)
    summary = script.adaptive_summary(arms["snip_adaptive@auto"], rows, name="snip_adaptive@auto")
    every = arms["snip_adaptive@auto"].every
    assert summary["every"] == every
    # the period's step is this arm's own step plus its cycle spread over the period.  Not
    # bitwise: the script computes in seconds, this in ms (a few more IEEE double operations,
    # each correctly rounded: a relative difference of ~1e-15 on any CPU; Python floats, no
    # ATen kernel involved), so 1e-9 holds with a wide margin.
    want = (rows["snip_adaptive@auto"]["ms"] + summary["cycle_ms"] / every) / rows["fp32"]["ms"]
    assert summary["amortized_vs_fp32"] == pytest.approx(want, rel=1e-9)
    layers = qlinear_layers(arms["snip_adaptive@auto"].model)  # after 1 + 1 + CYCLES re-plans
    assert all(m.accum is Accum.AUTO for _, m in layers)
    assert len({m.specs for _, m in layers}) > 1  # a mixed plan: the re-plans took effect
