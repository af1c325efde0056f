"""``benchmarks/validate_sensitivity.py``: its summary statistics on a synthetic case with a
known answer (fast), and a reduced end-to-end run through the product's trainer (slow).

Tolerances: every ``approx`` here compares float64 arithmetic on the same numbers summed in
another order (an ILP's objective against brute force's, a fraction of integer FLOPs, a JSON
round trip); Python floats round the same on every CPU, so ``rel=1e-9`` (or approx's default
1e-6) is millions of times wider than the ~n x 2^-53 such a sum can differ by."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import validate_sensitivity as V  # noqa: E402
from snip.sensitivity import stats as S  # noqa: E402


def _fake_checkpoint(rng, step, units=30, draws=6, tables=4, noise=0.3):
    names = [f"l{i}" for i in range(units)]
    signal = rng.gamma(2.0, size=units)
    truth_reps = signal[:, None] + noise * rng.normal(size=(units, draws))
    pred_reps = signal[:, None] * np.exp(0.2 * rng.normal(size=(units, tables)))
    pred = {"snip": pred_reps.mean(1).tolist(),
            "snip_objective": (pred_reps.mean(1) + rng.normal(size=units)).tolist(),
            "rel_err": rng.normal(size=units).tolist(),
            "rel_err_fprop": (-signal).tolist()}
    truth = truth_reps.mean(1)
    plans = []
    for _ in range(8):
        sel = rng.choice(units, size=5, replace=False)
        plans.append({"units": [names[i] for i in sel], "measured": float(signal[sel].sum()),
                      "measured_se": 0.0, "predicted_sum": float(pred_reps.mean(1)[sel].sum()),
                      "truth_sum": float(truth[sel].sum())})
    regret = {k: {"fp4_fraction": 0.75, "fp4_units": [], "measured": list(v),
                  "measured_mean": float(np.mean(v))}
              for k, v in {"snip": [2.0, 2.2, 2.1], "oracle": [1.0, 1.1, 1.3],
                           "min_rel_err": [3.0, 3.0, 3.0], "random": [4.0, 4.0, 4.0]}.items()}
    return {"step": step, "names": names, "pred": pred, "pred_reps": pred_reps.tolist(),
            "truth": truth.tolist(), "truth_reps": truth_reps.tolist(), "plans": plans,
            "regret": regret}


def test_summary_on_synthetic_checkpoints():
    rng = np.random.default_rng(0)
    ck = [_fake_checkpoint(rng, s) for s in (1, 2, 3)]
    out = V.summarize(ck, n_boot=200)
    r = out["ranking"]
    # pooled value = mean of the per-checkpoint Spearman correlations
    per = [S.spearman(c["pred"]["snip"], c["truth"]) for c in ck]
    assert r["snip"]["spearman"]["value"] == pytest.approx(np.mean(per))
    assert r["snip"]["spearman"]["value"] > 0.8
    assert r["rel_err_fprop"]["spearman"]["high"] < -0.8   # anti-ranked, resolved
    assert abs(r["rel_err"]["spearman"]["value"]) < 0.3     # unrelated
    for v in r.values():
        for iv in v.values():
            assert iv["low"] <= iv["value"] <= iv["high"] and iv["n"] == 90
    assert out["paired_vs_snip"]["rel_err"]["low"] > 0.5
    for c in out["per_checkpoint"]:
        assert 0.5 < c["rel_truth"] <= 1 and 0.5 < c["rel_pred"] <= 1
        assert c["noise_ceiling"] == pytest.approx(np.sqrt(c["rel_truth"] * c["rel_pred"]))
    ad = out["additivity"]
    assert ad["plans"] == 24 and ad["pearson_pred_sum"]["value"] > 0.8
    assert ad["ratio_measured_to_truth_sum"] == pytest.approx(
        sum(p["measured"] for c in ck for p in c["plans"])
        / sum(p["truth_sum"] for c in ck for p in c["plans"]))
    rg = out["regret"]["snip_minus_oracle"]
    assert rg["value"] == pytest.approx(np.mean([1.0, 1.1, 0.8]))
    assert rg["low"] < rg["value"] < rg["high"] and rg["n"] == 3
    assert "snip" in V.markdown({"args": {"model": "m", "low": "x", "budget": 0.75},
                                 "units": 30, "checkpoints": ck, "command": "c", "date": "d",
                                 "seconds": 1.0, "summary": out})


@pytest.mark.slow
def test_reduced_validation_end_to_end(tmp_path):
    out = tmp_path / "v"
    res = V.main(["--checkpoints", "4,8,12", "--tables", "2", "--sr-draws", "2",
                  "--eval-batches", "2", "--stack", "2", "--plans", "2", "--boot", "50",
                  "--out", str(out)])
    data = json.loads(Path(f"{out}.json").read_text())
    assert Path(f"{out}.md").read_text().startswith("# validate_sensitivity")
    assert data["units"] == 42 and len(data["checkpoints"]) == 3 == len(res["checkpoints"])
    assert [c["step"] for c in data["checkpoints"]] == [4, 8, 12]
    for c in data["checkpoints"]:
        assert np.array(c["truth_reps"]).shape == (42, 2)
        assert np.array(c["pred_reps"]).shape == (42, 2)
        assert np.allclose(np.mean(c["truth_reps"], 1), c["truth"])
        assert np.all(np.isfinite(c["truth"])) and len(c["plans"]) == 2
        # the oracle and every baseline sit at the ILP's FP4 fraction
        fr = {k: v["fp4_fraction"] for k, v in c["regret"].items()}
        assert all(abs(f - fr["snip"]) < 1e-9 for f in fr.values()), fr
        assert fr["snip"] >= 0.75
    s = data["summary"]
    sp = s["ranking"]["snip"]["spearman"]
    assert -1 <= sp["low"] <= sp["value"] <= sp["high"] <= 1 and sp["n"] == 126
    assert s["additivity"]["plans"] == 6
