"""The study's prerequisites: cadence / objective / seeding arms, random_top, verdicts over base
means, the search oracle on half windows, diagnostics, and a sweep of them end to end."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from snip.cli import main
from snip.compare import parse_arm, parse_arms
from snip.compare.arms import ONCE, Arm, Kind, unit_seed
from snip.compare.diagnostics import regress
from snip.compare.stats import (
    Contrast,
    HypothesisSpec,
    Verdict,
    by_base,
    contrast,
    evaluate_hypotheses,
    n_for_power,
    pilot_n,
    search_oracle,
    verdict,
)
from snip.compare.sweep import Sweep
from snip.errors import UserError
from snip.train import from_sources, train

# -- arms ---------------------------------------------------------------------------------------


def test_cadence_objective_and_top_arms() -> None:
    (every,) = parse_arm("snip@0.75/every:100")
    (once,) = parse_arm("snip@0.75/once")
    assert (every.label, every.every, every.overrides()["precision.every"]) == \
        ("snip@0.75/every:100", 100, 100)
    assert once.label == "snip@0.75/once" and once.overrides()["precision.every"] == ONCE
    (plain,) = parse_arm("snip@0.75")
    assert "precision.every" not in plain.overrides()  # the base's own cadence
    (paper,) = parse_arm("snip@0.875/sum/every:50")
    assert paper.overrides()["precision.normalization"] == "sum"
    assert paper.overrides()["precision.every"] == 50
    (top,) = parse_arm("random_top@0.75:1")
    assert (top.method, top.top, top.per_unit) == ("random_top", 1, True)
    assert top.overrides((2, 0))["precision.keep_top"] == 1
    assert top.dirname == "random_top@0.75-1" and every.dirname == "snip@0.75+every-100"
    (rev,) = parse_arm("layer_type_rev@0.875")
    (rid,) = parse_arm("layer_id_rev@0.875")
    assert (rev.method, rid.method) == ("layer_type_rev", "layer_id_rev")
    # every arm of the study is one sweep: labels distinct
    parse_arms(["snip@0.75/every:100", "snip@0.75/once", "snip@0.75", "random_top@0.75:1",
                "random@0.75x2/unit", "random@0.75x2"])


def test_unit_seeded_draws_differ_per_unit_and_fixed_draws_do_not() -> None:
    unit = parse_arm("random@0.75x3/unit")
    fixed = parse_arm("random@0.75x3")
    assert [a.label for a in unit] == [f"random@0.75/unit#{k}" for k in range(3)]
    assert {a.family for a in unit} == {"random@0.75/unit"}
    units = [(b, o) for b in range(4) for o in range(2)]
    seeds = {(u, a.draw): a.overrides(u)["precision.plan_seed"] for a in unit for u in units}
    assert len(set(seeds.values())) == len(seeds)  # every (unit, k) its own plan
    assert seeds[((1, 0), 2)] == unit_seed((1, 0), 2)
    for a in fixed:
        assert {a.overrides(u)["precision.plan_seed"] for u in units} == {a.draw}
    (top_fixed,) = parse_arm("random_top@0.75:2/fixed")
    assert top_fixed.overrides((3, 1))["precision.plan_seed"] == 0


def test_new_fields_leave_old_definitions_unchanged() -> None:
    old = {"label": "snip@0.75", "kind": "adaptive", "preset": "", "plan": "", "method": "ilp",
           "budget": 0.75, "draw": -1}
    (a,) = parse_arm("snip@0.75")
    assert a.to_dict() == old  # a sweep.json written before the new fields still extends
    (b,) = parse_arm("random_top@0.5:1/every:7")
    back = Arm(**{**b.to_dict(), "kind": Kind(b.to_dict()["kind"])})
    assert back == b


@pytest.mark.parametrize("bad, message", [
    ("snip@0.75/every:0", "N >= 1"), ("snip@0.75/twice", "unknown modifier"),
    ("snip@0.75/once/every:5", "same thing"), ("random_top@0.75", "random_top needs it"),
    ("snip@0.75:1", "belongs to random_top"), ("layer_type@0.5/unit", "has none"),
    ("random_top@0.75:0", "M >= 1"),
])
def test_bad_study_arm_is_a_user_error(bad: str, message: str) -> None:
    with pytest.raises(UserError, match=re.escape(message)):
        parse_arm(bad)


# -- statistics ---------------------------------------------------------------------------------


def _c(lo: float, hi: float) -> Contrast:
    return Contrast(arm="a", comparator="c", metric="m", n=8, mean=(lo + hi) / 2, ci_low=lo,
                    ci_high=hi, diffs=())


def test_verdict_rule() -> None:
    d = 0.002
    assert verdict(_c(-0.01, -0.003), _c(-0.01, -0.001), d) == (Verdict.SUPPORTED, False)
    # supported in high precision only: not supported
    assert verdict(_c(-0.01, -0.003), _c(-0.01, 0.001), d) == (Verdict.INCONCLUSIVE, False)
    assert verdict(_c(-0.0015, 0.004), _c(-0.01, 0.001), d) == (Verdict.FALSIFIED, False)
    assert verdict(_c(-0.003, 0.004), _c(-0.01, 0.001), d) == (Verdict.INCONCLUSIVE, False)
    # real but smaller than delta_min: supported, flagged
    assert verdict(_c(-0.0015, -0.0005), _c(-0.01, -0.001), d) == (Verdict.SUPPORTED, True)


def test_interval_is_over_base_means() -> None:
    # 3 bases x 2 orders; the orders of a base share its offset
    diffs = {(b, o): [0.01, -0.02, 0.03][b] + (0.001 if o else -0.001) for b in range(3)
             for o in range(2)}
    assert by_base(diffs) == pytest.approx([0.01, -0.02, 0.03], abs=1e-15)
    values = {"a": {u: {"val_loss_hp": 1.0 + d, "val_loss": 1.0 + d} for u, d in diffs.items()},
              "c": {u: {"val_loss_hp": 1.0, "val_loss": 1.0} for u in diffs}}
    c = contrast(values, "a", "c", "val_loss_hp")
    assert c.n == 3  # not 6: orders of one base are not independent
    assert c.mean == pytest.approx(np.mean([0.01, -0.02, 0.03]), abs=1e-12)


def _values(gain: float, n: int, seed: int, sd: float = 0.003) -> dict:
    """Bases where "rule" is ``gain`` worse than "snip" and "tie" is as good."""
    rng = np.random.default_rng(seed)
    out: dict = {"snip": {}, "rule": {}, "tie": {}}
    for b in range(n):
        base = rng.normal(3.0, 0.5)
        for arm, e in (("snip", 0.0), ("rule", gain), ("tie", 0.0)):
            v = base + e + rng.normal(0, sd)
            out[arm][(b, 0)] = {"val_loss_hp": v, "val_loss": v}
    return out


def test_fixed_sequence_stops_at_the_first_hypothesis_not_supported() -> None:
    vals = _values(0.01, 32, seed=0)  # snip beats "rule" by 0.01, ties "tie"
    hs = [HypothesisSpec("H1", "beats rule", (("snip", "rule"),)),
          HypothesisSpec("H2", "beats tie", (("snip", "tie"),)),
          HypothesisSpec("H3", "beats rule again", (("snip", "rule"),))]
    r = evaluate_hypotheses(vals, hs, delta_min=0.002)
    assert [h.verdict for h in r] == [Verdict.SUPPORTED, Verdict.FALSIFIED, Verdict.SUPPORTED]
    assert [h.confirmatory for h in r] == [True, True, False]
    both = evaluate_hypotheses(vals, [HypothesisSpec("H", "both", (("snip", "rule"),
                                                                   ("snip", "tie")))], 0.002)
    assert both[0].verdict is Verdict.FALSIFIED  # one tied rule falsifies "beats every rule"
    assert json.dumps(r[0].to_dict())  # the typed record serialises for the report
    extra = HypothesisSpec("E1", "exploratory", (("snip", "tie"),), exploratory=True)
    r = evaluate_hypotheses(vals, [hs[0], extra, hs[2]], delta_min=0.002)
    assert [h.confirmatory for h in r] == [True, False, True]  # E1 does not stop the sequence


def test_search_oracle_selects_on_half_a_and_reports_half_b() -> None:
    vals = {"d#0": {(0, 0): {"val_loss_hp_a": 1.0, "val_loss_hp_b": 3.0}},
            "d#1": {(0, 0): {"val_loss_hp_a": 2.0, "val_loss_hp_b": 1.5}}}
    # the lowest loss on half b (1.5) is not what the oracle reports: it chose on half a
    assert search_oracle(vals, ["d#0", "d#1"], "val_loss_hp") == {(0, 0): 3.0}
    vals["snip"] = {(0, 0): {"val_loss_hp": 9.0, "val_loss_hp_b": 2.0}}
    c = contrast(vals, "snip", "search:d", "val_loss_hp", {"d": ["d#0", "d#1"]})
    assert c.diffs == (2.0 - 3.0,)  # both sides on half b


def test_power_and_pilot_rule() -> None:
    # the power numbers: 0.0024 nats at SD 0.0049 needs about 35 units for 80 % power
    assert 34 <= n_for_power(0.0049, 0.0024) <= 36
    assert n_for_power(0.005, 0.51 * 0.005) in (32, 33)
    assert pilot_n([0.001], 0.002) == 32  # never fewer than 32
    assert pilot_n([0.02], 0.002) == 48  # never more than 48
    assert n_for_power(0.005, 0.002) > 48 and pilot_n([0.005], 0.002) == 48
    assert pilot_n([0.0045, 0.003], 0.002) == n_for_power(0.0045, 0.002) > 32  # largest SD
    assert pilot_n([0.001], 0.002, current=40) == 40  # n never decreases


def test_regression_on_the_keeps_top_high_indicator() -> None:
    kept = [True, False] * 6
    diffs = [0.001 * (i % 3) + (0.0 if k else 0.02) for i, k in enumerate(kept)]
    r = regress("snip", "rule", diffs, kept)
    assert r.n == 12 and r.n_kept == 6
    assert r.beta == pytest.approx(np.mean(np.array(diffs)[::2]) - np.mean(np.array(diffs)[1::2]),
                                   abs=1e-12)
    assert r.beta_high < 0 and math.isfinite(r.mean_kept)
    assert math.isnan(regress("a", "b", [0.1, 0.2, 0.3], [True] * 3).beta)


# -- a sweep end to end -------------------------------------------------------------------------


@pytest.fixture
def base(tiny: dict) -> Path:
    train(from_sources(overrides={**tiny, "run.name": "base", "precision.preset": "bf16"}))
    return Path(tiny["run.dir"]) / "base" / "checkpoints" / "step_000012"


def test_study_arms_end_to_end(base: Path, tmp_path: Path,
                               capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "cmp"
    hyp = tmp_path / "h.json"
    hyp.write_text(json.dumps({"delta_min": 0.002, "diagnostics": {"damage_arm": "oracle@0.75"},
                               "hypotheses": [
        {"id": "H1", "statement": "beats a rule", "contrasts": [["snip@0.75/every:2",
                                                                 "layer_type_rev@0.75"]]},
        {"id": "H3", "statement": "adaptive", "contrasts": [["snip@0.75/every:2",
                                                             "snip@0.75/once"]]},
        {"id": "C", "statement": "ceiling", "contrasts": [["snip@0.75/every:2",
                                                           "search:random@0.75/unit"]]}]}))
    argv = ["compare", "--base", str(base), "--steps", "4", "--orders", "2", "--eval-batches",
            "4", "--precision.candidates", "bf16,fp4_e2m1_tensor", "--out", str(out),
            "--threads", "1",
            "--hypotheses", str(hyp), "--reference", "bf16",
            *(x for a in ["bf16", "snip@0.75/every:2", "snip@0.75/once", "random_top@0.75:1",
                          "layer_type_rev@0.75", "oracle@0.75", "random@0.75x2/unit"]
              for x in ("--arm", a))]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "Pre-registered hypotheses" in printed and "H3: adaptive" in printed
    runs = out / "runs" / "b0_o0"

    def plans(arm: str) -> list[dict]:
        paths = sorted((runs / arm / "plans").glob("step_*.json"))
        return [json.loads(p.read_text()) for p in paths
                if json.loads(p.read_text())["meta"].get("method")]

    assert [p["meta"]["step"] for p in plans("snip@0.75+every-2")] == [12, 14]
    assert [p["meta"]["step"] for p in plans("snip@0.75+once")] == [12]
    top = plans("random_top@0.75-1")[0]
    (name,) = top["meta"]["top_units"]
    assert not any("fp4" in v for v in top["layers"][name].values())
    # unit-seeded: another plan seed (and here another plan) in the other data order
    seeds = {json.loads(p.read_text())["meta"].get("seed") for o in (0, 1)
             for p in (out / "runs" / f"b0_o{o}" / "random@0.75+unit#0" / "plans").glob("*")}
    assert len(seeds - {None}) == 2
    # every branch keeps its plans and tables; the half losses average to the full loss
    for arm in ("snip@0.75+every-2", "oracle@0.75"):
        assert list((runs / arm / "sensitivity").glob("step_12.json"))
    assert list((runs / "oracle@0.75" / "sensitivity").glob("step_12_damage.json"))
    r = json.loads((runs / "bf16" / "result.json").read_text())
    # float32 means of 2+2 vs 4 window losses: equal up to float32 rounding of the sums
    assert (r["val_loss_hp_a"] + r["val_loss_hp_b"]) / 2 == pytest.approx(r["val_loss_hp"],
                                                                          rel=1e-6)
    summary = json.loads((out / "compare.json").read_text())
    h = {x["id"]: x for x in summary["hypotheses"]}
    assert h["H1"]["contrasts"][0]["primary"]["n"] == 1  # one base: its two orders averaged
    assert h["C"]["contrasts"][0]["primary"]["metric"] == "val_loss_hp"
    diag = summary["diagnostics"]
    assert len(diag["top_units"]) == 2 and diag["regressions"]
    assert set(diag["keeps_top_high"]["bf16"]["b0_o0"]) == {"first", "share"}
    assert diag["keeps_top_high"]["bf16"]["b0_o0"]["first"] is True
    # the hypotheses of a sweep do not change
    hyp.write_text(json.dumps({"delta_min": 0.001, "hypotheses": []}))
    assert main(["compare", "--summarize", str(out), "--hypotheses", str(hyp)]) == 2
    assert "holds other hypotheses" in capsys.readouterr().err


def test_gap_closed_is_measured_from_the_sweeps_own_reference(tmp_path: Path) -> None:
    from snip.compare.sweep import RESULT_FILE, summarize

    arms = tuple(parse_arms(["bf16", "low=preset:mxfp4", "mid=preset:fp8_e4m3"]))
    sweep = Sweep(bases=("a",), arms=arms, steps=1, orders=2, reference="bf16", gap="low",
                  out=str(tmp_path))
    losses = {"bf16": [1.0, 1.1], "low": [2.0, 2.1], "mid": [1.5, 1.6]}
    for arm in arms:
        for o in range(2):
            d = sweep.run_dir((0, o), arm)
            d.mkdir(parents=True)
            v = losses[arm.label][o]
            (d / RESULT_FILE).write_text(json.dumps({"val_loss": v, "val_loss_hp": v,
                                                     "fp4_flop_fraction": 0.0}))
    for ref in ("bf16", "mid"):  # a table against "mid" keeps the bf16 -> low gap
        rows = {r["arm"]: r for r in summarize(sweep, reference=ref).rows["val_loss_hp"]}
        gap = rows["bf16" if ref == "mid" else "mid"].get("gap_closed")
        want = 1.0 if ref == "mid" else (2.05 - 1.55) / (2.05 - 1.05)
        assert gap == pytest.approx(want)


def test_summarize_can_stop_at_the_first_n_bases(tmp_path: Path) -> None:
    from snip.compare.sweep import RESULT_FILE, summarize

    arms = tuple(parse_arms(["bf16", "mxfp4"]))
    sweep = Sweep(bases=("a", "b", "c"), arms=arms, steps=1, out=str(tmp_path))
    for unit in sweep.units:
        for k, arm in enumerate(arms):
            d = sweep.run_dir(unit, arm)
            d.mkdir(parents=True)
            (d / RESULT_FILE).write_text(json.dumps({"val_loss": 1.0 + k + unit[0],
                                                     "val_loss_hp": 1.0 + k,
                                                     "fp4_flop_fraction": 0.0}))
    assert {r["n"] for r in summarize(sweep).rows["val_loss_hp"]} == {3}
    assert {r["n"] for r in summarize(sweep, bases=2).rows["val_loss_hp"]} == {2}


def test_objective_and_top_arms_reach_the_controller(tmp_path: Path) -> None:
    from snip.sensitivity import Normalization
    from snip.train.precision import make_controller

    (paper,) = parse_arm("snip@0.875/sum/every:50")
    (top,) = parse_arm("random_top@0.75:2")
    (once,) = parse_arm("snip@0.75/once")
    ctl = make_controller(from_sources(overrides=paper.overrides()).precision, tmp_path, True,
                          start=10)
    assert Normalization(ctl.stats.normalization) is Normalization.SUM and ctl.every == 50
    assert ctl.due(10) and ctl.due(60) and not ctl.due(59)
    ctl = make_controller(from_sources(overrides=top.overrides((1, 0))).precision, tmp_path,
                          True, start=10)
    assert ctl.top == 2 and ctl.plan_seed == unit_seed((1, 0), 0)
    ctl = make_controller(from_sources(overrides=once.overrides()).precision, tmp_path, True,
                          start=10)
    assert ctl.due(10) and not any(ctl.due(s) for s in range(11, 100_000))
