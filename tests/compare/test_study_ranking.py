"""benchmarks/snip_study_ranking.py: the conditional ranking analysis of the SNIP study."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

from _benchmarks import load
from snip.compare.arms import parse_arms
from snip.compare.sweep import Sweep
from snip.sensitivity.table import synthetic_table

script = load("snip_study_ranking", "snip_study_ranking")

CANDS = ("bf16", "fp4_e2m1_tensor")


def _sweep(tmp_path: Path, measured_of) -> Path:
    """Two units; each gets a synthetic SNIP table and a damage map ``measured_of(unit, pred)``."""
    out = tmp_path / "sweep"
    arms = parse_arms(["oracle@0.875", "snip@0.875/every:100"])
    sweep = Sweep(bases=("b0", "b1"), arms=tuple(arms), steps=1, out=str(out))
    out.mkdir()
    (out / "sweep.json").write_text(json.dumps(sweep.to_dict()))
    oracle, snip = arms
    for u in sweep.units:
        table = synthetic_table(2, CANDS, seed=u[0])
        s = sweep.run_dir(u, snip) / "sensitivity"
        s.mkdir(parents=True)
        (s / "step_600.json.gz").write_bytes(gzip.compress(b"not the first table"))
        (s / "step_500.json.gz").write_bytes(gzip.compress(table.to_json().encode()))
        pred = script.predicted_damage(table, *CANDS)
        o = sweep.run_dir(u, oracle) / "sensitivity"
        o.mkdir(parents=True)
        (o / "step_500_damage.json").write_text(json.dumps({"values": measured_of(u, pred)}))
        (o / "step_600_damage.json").write_text("not the first map")
    return out


def test_predicted_damage_is_the_objective_gap() -> None:
    table = synthetic_table(1, CANDS, seed=3)
    pred = script.predicted_damage(table, *CANDS)
    e = table.layers["layers.0.wq"]
    want = sum(e.metric(g, CANDS[1]).objective - e.metric(g, CANDS[0]).objective
               for g in ("fprop", "dgrad", "wgrad"))
    assert pred["layers.0.wq"] == want and len(pred) == 7


def test_correlation_leaves_the_top_unit_out(tmp_path: Path) -> None:
    """Unit 0 measures what was predicted (rho 1 either way); unit 1 gets the top unit right
    (an outlier) and every other layer in reverse, so only its rho over all layers is lifted."""
    def measured(u, pred):
        if u[0] == 0:
            return dict(pred)
        m = {k: -v for k, v in pred.items()}
        m[max(pred, key=pred.get)] = 1e6  # the most predicted layer is the top unit
        return m

    res = script.ranking(_sweep(tmp_path, measured), 2, "snip@0.875/every:100",
                         "oracle@0.875", *CANDS)
    rows = res["units"]
    assert [r["rho_without_top"] for r in rows] == [1.0, -1.0]
    assert rows[0]["rho_all"] == 1.0 and -1.0 < rows[1]["rho_all"] < 0.0
    assert res["without_top"]["n"] == 2 and res["without_top"]["mean"] == 0.0
    assert res["without_top"]["median"] == 0.0
    lo, hi = res["without_top"]["ci95"]
    assert lo < -1 and hi > 1 and not math.isnan(lo)


def test_units_beyond_n_are_left_out_and_the_cli_writes_json(tmp_path: Path, capsys) -> None:
    sweep = _sweep(tmp_path, lambda u, pred: dict(pred))
    out = tmp_path / "ranking.json"
    assert script.main([str(sweep), "--units", "1", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert [r["unit"] for r in res["units"]] == [[0, 0]]
    assert "without the top unit: mean +1.000" in capsys.readouterr().out


def test_missing_damage_map_is_an_error(tmp_path: Path, capsys) -> None:
    sweep = _sweep(tmp_path, lambda u, pred: dict(pred))
    for p in sweep.rglob("step_*_damage.json"):
        p.unlink()
    assert script.main([str(sweep), "--units", "2"]) == 1
    assert "no damage map" in capsys.readouterr().err
