"""Sensitivity statistics: hooks free when off, table shape, no side effects, Adam gain."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch

from snip.models import build_model, get_config
from snip.sensitivity import SensitivityConfig, SensitivityTable, measure
from snip.sensitivity.adam import update_gain
from snip.sensitivity.probes import Capture

FP8, FP4 = "fp8_e4m3_tile128", "fp4_e2m1_tile128"


def tiny():
    torch.manual_seed(0)
    return build_model(get_config("tiny", n_layers=1, max_seq_len=32))


def batch_fn(i: int):
    g = torch.Generator().manual_seed(i)
    x = torch.randint(0, 256, (2, 32), generator=g)
    return x, torch.roll(x, -1, 1)


def trained(steps: int = 2):
    m = tiny()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    for i in range(steps):
        _, loss = m(*batch_fn(100 + i))
        loss.backward()
        opt.step()
        opt.zero_grad()
    return m, opt


def hook_count(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_probes_register_nothing_when_off_or_after() -> None:
    m = tiny()
    layers = {n: mod for n, mod in m.named_modules() if isinstance(mod, torch.nn.Linear)}
    with Capture(layers, enabled=False).attach():
        assert hook_count(m) == 0
    with Capture(layers).attach() as cap:
        assert hook_count(m) == 2 * len(layers)
        m(*batch_fn(0))
        assert set(cap.inputs) == set(layers)
    assert hook_count(m) == 0


@pytest.fixture(scope="module")
def table_and_model():
    m, opt = trained()
    before = copy.deepcopy((m.state_dict(), opt.state_dict()))
    t = measure(m, batch_fn, optimizer=opt, step=2,
                config=SensitivityConfig(candidates=(FP8, FP4), calib_batches=2))
    return t, m, opt, before


def test_table_complete_and_finite(table_and_model) -> None:
    t, m, _, _ = table_and_model
    assert t.names == [n for n, mod in m.named_modules()
                       if isinstance(mod, torch.nn.Linear) and n != "output"]
    for e in t.layers.values():
        for g in ("fprop", "dgrad", "wgrad"):
            for c in (FP8, FP4):
                met = e.metric(g, c)
                assert math.isfinite(met.loss_div) and math.isfinite(met.weight_div)
                assert met.loss_div_norm >= 0 and met.weight_div_norm >= 0
        assert e.rel_err[FP4]["x"] > e.rel_err[FP8]["x"] > 0
        assert e.stats["adam"]["step"] == 2


def test_fp4_diverges_more_than_fp8(table_and_model) -> None:
    t = table_and_model[0]
    for g in ("dgrad", "wgrad"):
        w8 = sum(e.metric(g, FP8).weight_div for e in t.layers.values())
        w4 = sum(e.metric(g, FP4).weight_div for e in t.layers.values())
        assert w4 > 10 * w8 > 0
    # FP4's element spacing is 4x FP8's (1 vs 3 mantissa bits): ~16x the error energy.  The
    # curvature estimate is stochastic and an untrained net's Hessian indefinite, so a layer's
    # sum can cancel differently per format: compare the median layer, with margin.  (The
    # quadratic-model test in test_estimators.py checks the value itself.)
    ratios = sorted(abs(e.metric("fprop", FP4).loss_div) /
                    max(abs(e.metric("fprop", FP8).loss_div), 1e-30) for e in t.layers.values())
    assert ratios[len(ratios) // 2] > 4


def test_measure_has_no_side_effects(table_and_model) -> None:
    _, m, opt, (sd, osd) = table_and_model
    for k, v in m.state_dict().items():
        assert torch.equal(v, sd[k])
    assert all(p.grad is None for p in m.parameters())
    for i, s in opt.state_dict()["state"].items():
        assert torch.equal(s["exp_avg"], osd["state"][i]["exp_avg"])


def test_table_json_roundtrip(table_and_model, tmp_path) -> None:
    t = table_and_model[0]
    t.to_json(tmp_path / "t.json")
    assert SensitivityTable.from_json(tmp_path / "t.json").to_dict() == t.to_dict()


def test_adam_gain_matches_a_real_adamw_step() -> None:
    torch.manual_seed(1)
    p = torch.nn.Parameter(torch.randn(64, dtype=torch.float64))
    opt = torch.optim.AdamW([p], lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    for _ in range(3):
        p.grad = torch.randn(64, dtype=torch.float64)
        opt.step()
    g = torch.randn(64, dtype=torch.float64)
    dg = 1e-6 * torch.randn(64, dtype=torch.float64)
    gain = update_gain(opt, p, g)

    def step_with(grad):
        q = torch.nn.Parameter(p.detach().clone())
        o = torch.optim.AdamW([q], lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
        o.load_state_dict(copy.deepcopy(opt.state_dict()))
        q.grad = grad.clone()
        o.step()
        return q.detach().double()

    du = step_with(g + dg) - step_with(g)
    # float64; the gain is AdamW's derivative, so the finite difference of size 1e-6 differs
    # from it by the second-order term, ~|dg| / |g| ~ 1e-6 relative: rtol 2e-3 is the margin for
    # elements where Adam's denominator is small, not a machine-dependent quantity
    torch.testing.assert_close(du, -(gain * dg).double(), rtol=2e-3, atol=1e-12)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="calib_batches"):
        SensitivityConfig(calib_batches=0)
    with pytest.raises(ValueError, match="noise_scale"):
        SensitivityConfig(noise_scale=2.0)
    with pytest.raises(ValueError, match="unknown quantization preset"):
        SensitivityConfig(candidates=("fp5",))


def test_measure_on_converted_model_runs_unquantized() -> None:
    from snip.nn import convert

    m, opt = trained(1)
    ref = measure(m, batch_fn, optimizer=opt, config=SensitivityConfig(calib_batches=1))
    q = convert(copy.deepcopy(m), "fp4_e2m1_tile128")
    opt_q = torch.optim.AdamW(q.parameters(), lr=1e-3)
    opt_q.load_state_dict(copy.deepcopy(opt.state_dict()))
    t = measure(q, batch_fn, optimizer=opt_q, config=SensitivityConfig(calib_batches=1))
    assert t.names == ref.names
    assert t.loss == pytest.approx(ref.loss, rel=1e-6)


def test_done_is_called_once_per_step_of_the_work() -> None:
    """``measure(done=...)`` (the progress bar of ``snip plan --checkpoint``) is called
    ``config.steps(layers)`` times: per batch the clean pass, each noise pass, each layer and
    the propagation."""
    m, opt = trained(1)
    two = ["layers.0.attention.wq", "layers.0.feed_forward.w2"]
    for cfg, layers, expected in ((SensitivityConfig(), None, 1 * (2 + 1 + 7)),
                                  (SensitivityConfig(calib_batches=2, noise_groups=3), two,
                                   2 * (2 + 2 + 2))):
        ticks = itertools.count()
        measure(m, batch_fn, optimizer=opt, config=cfg, layers=layers, done=ticks.__next__)
        assert next(ticks) == cfg.steps(len(layers or range(7))) == expected
