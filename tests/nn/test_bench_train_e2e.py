"""benchmarks/bench_train_e2e.py's arms: an ``@auto`` preset converts the loop's model and sets
`snip train`'s precision with ``accum="auto"``, a bare one with fp32 GEMMs (the default)."""

import pytest

from _benchmarks import load
from snip.nn import qlinear_layers
from snip.nn.specs import Accum
from snip.train import from_sources

script = load("bench_train_e2e", "bench_train_e2e_script")


@pytest.mark.parametrize(("arm", "preset", "accum"), [("mxfp4", "mxfp4", Accum.FP32),
                                                      ("mxfp4@auto", "mxfp4", Accum.AUTO)])
def test_an_arm_preset_converts_the_loop_model_as_snip_train_would(arm, preset, accum) -> None:
    name, acc = script.preset_and_accum(arm)
    cfg = from_sources(overrides={"model.name": "tiny", "precision.mode": "fixed",
                                  "precision.preset": name, "precision.accum": acc})
    assert cfg.precision.accum is accum
    layers = qlinear_layers(script.loop_model(cfg, arm))
    assert layers and all(m.accum is accum and m.specs.fprop.name == preset for _, m in layers)
    assert not qlinear_layers(script.loop_model(cfg, None))  # loop_plain: not converted
