"""The write-back experiment's control summary: random draws as a distribution, paired arms.

Tolerances: every ``approx`` here compares float64 arithmetic on the same numbers summed in
another order (an ILP's objective against brute force's, a fraction of integer FLOPs, a JSON
round trip); Python floats round the same on every CPU, so ``rel=1e-9`` (or approx's default
1e-6) is millions of times wider than the ~n x 2^-53 such a sum can differ by."""

from __future__ import annotations

import math

import pytest

from _benchmarks import load

pytest.importorskip("scipy")
wx = load("writeback_experiment", "writeback_experiment")


def test_control_distribution_places_arms_among_draws():
    draws = {0: [0.30, 0.40, 0.50], 1: [0.20, 0.30, 0.40], 2: [0.35, 0.45, 0.55]}
    arms = {"ref": {0: 0.10, 1: 0.05, 2: 0.15},        # below every draw of its seed
            "mid": {0: 0.40, 1: 0.30, 2: 0.45},        # ties the middle draw: beats 50 %
            "partial": {0: 0.10}}                      # only one seed in common
    out = wx.control_distribution(draws, arms)
    d = out["draws"]
    assert d["n"] == 9 and d["per_seed_n"] == {0: 3, 1: 3, 2: 3}
    assert d["min"] == pytest.approx(0.20) and d["max"] == pytest.approx(0.55)
    assert d["mean"] == pytest.approx(sum(sum(v) for v in draws.values()) / 9)
    assert d["per_seed_mean"][1] == pytest.approx(0.30)
    ref = out["arms"]["ref"]
    assert ref["beats"] == 100.0 and ref["below_all_in"] == 3
    diff = ref["minus_draw_mean"]  # (0.1-0.4, 0.05-0.3, 0.15-0.45) = (-0.3, -0.25, -0.3)
    assert diff["n"] == 3 and diff["mean"] == pytest.approx(-0.85 / 3)
    assert diff["ci95"][0] < diff["mean"] < diff["ci95"][1] < 0
    mid = out["arms"]["mid"]
    assert mid["beats"] == pytest.approx(50.0) and mid["below_all_in"] == 0
    assert mid["minus_draw_mean"]["mean"] == pytest.approx(0.0, abs=1e-12)
    part = out["arms"]["partial"]
    assert part["minus_draw_mean"]["n"] == 1 and math.isnan(part["minus_draw_mean"]["ci95"][0])
    with pytest.raises(ValueError):
        wx.control_distribution({}, arms)


def test_summarize_pairs_arms_and_pools_the_draws(monkeypatch):
    monkeypatch.setattr(wx, "FORMATS", ("e4m3",))
    monkeypatch.setattr(wx, "ARMS", ("rne", "mask_ref", "mask_target", "mask_matched"))
    res = {}
    for sd, (l32, lrn, ref, tgt) in enumerate([(2.0, 4.0, 2.5, 2.4), (2.1, 4.1, 2.7, 2.5),
                                               (2.2, 4.2, 2.6, 2.6)]):
        res[f"fp32_s{sd}"] = {"val_loss": l32}
        res[f"e4m3_rne_s{sd}"] = {"val_loss": lrn}
        res[f"e4m3_mask_ref_s{sd}"] = {"val_loss": ref}
        res[f"e4m3_mask_target_s{sd}"] = {"val_loss": tgt}
        for k in range(4):
            res[f"e4m3_mask_matched{k}_s{sd}"] = {"val_loss": l32 + 1.0 + 0.1 * k}
    table, summary = wx.summarize(res, [0, 1, 2])
    # the draws' mean per seed is the mask_matched arm: excess 1.15, R = (2 - 1.15) / 2
    mm = summary["e4m3_mask_matched"]
    assert mm["excess_over_fp32"]["mean"] == pytest.approx(1.15)
    assert mm["R_mean"] == pytest.approx(42.5)
    dist = summary["e4m3_matched_distribution"]
    assert dist["draws"]["n"] == 12 and dist["draws"]["min"] == pytest.approx(1.0)
    assert dist["draws_R"]["max"] == pytest.approx(50.0)
    assert dist["arms"]["mask_ref"]["below_all_in"] == 3
    pair = summary["e4m3_mask_ref_minus_mask_target"]
    assert pair["loss"]["mean"] == pytest.approx((0.1 + 0.2 + 0.0) / 3)
    assert pair["loss"]["n"] == 3
    assert pair["R"]["mean"] == pytest.approx(-100 * 0.1 / 2)
    assert "mask_ref - mask_matched" in table and "12 draws (3 seeds)" in table
