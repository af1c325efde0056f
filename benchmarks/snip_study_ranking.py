"""The conditional ranking analysis of `benchmarks/prereg/snip_study.md` §3 (run only if H2 is
not supported): does SNIP's estimator rank the layers beyond the top unit?

Per unit (base, order), over the model's linear layers:

* **predicted damage** of a layer: what the planner's objective charges for putting all of the
  layer's GEMMs in the low format rather than the high one -- the sum over its GEMMs of
  ``Metric.objective`` at the low candidate minus at the high candidate -- from the first
  sensitivity table of the SNIP arm (``--arm``, ``sensitivity/step_<N>.json.gz`` at the branch
  point, the table its first plan was solved from);
* **measured damage**: the loss increase of that layer alone in the low format, from the
  oracle arm's first damage map (``sensitivity/step_<N>_damage.json``: the same model and
  calibration batch every arm of the unit starts from);
* the Spearman correlation of the two over every layer but the *top unit* (the largest
  measured damage, ties broken by name: `snip.compare.diagnostics.top_of`), and, for
  reference, over all layers.

Reported: per unit the two correlations; over units their mean with a 95 % t interval, the
median and n.  Nothing else is computed (no verdict: the prereg asks RESULTS to *show* what
the estimator would need).

    PYTHONPATH=src python benchmarks/snip_study_ranking.py benchmarks/results/snip_study/stage1 \\
        --units 48 --out benchmarks/results/snip_study/stage1/ranking.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from scipy import stats

from snip.compare.diagnostics import first_damage_map, top_of
from snip.compare.stats import t_interval
from snip.compare.sweep import load_sweep
from snip.sensitivity.table import SensitivityTable


def first_table(run_dir: Path) -> SensitivityTable:
    """The branch's earliest sensitivity table (gzipped as collected, or plain in a sweep)."""
    paths = [p for p in (run_dir / "sensitivity").glob("step_*.json*")
             if "damage" not in p.name]
    if not paths:
        raise FileNotFoundError(f"{run_dir}: no sensitivity table")
    path = min(paths, key=lambda p: int(p.name.split("_")[1].split(".")[0]))
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return SensitivityTable.from_dict(json.load(f))


def predicted_damage(table: SensitivityTable, high: str, low: str) -> dict[str, float]:
    """Per layer: the planner's objective for the layer in ``low`` minus in ``high``."""
    out = {}
    for name in table.names:
        entry = table.layers[name]
        out[name] = sum(entry.metric(g, low).objective - entry.metric(g, high).objective
                        for g in entry.metrics)
    return out


def spearman(a: dict[str, float], b: dict[str, float], drop: str | None = None) -> float:
    names = sorted(n for n in a if n in b and n != drop)
    if len(names) < 3:
        return math.nan
    return float(stats.spearmanr([a[n] for n in names], [b[n] for n in names]).statistic)


def summary(values: list[float]) -> dict[str, Any]:
    v = [x for x in values if math.isfinite(x)]
    if not v:
        return {"n": 0}
    mean, low, high = t_interval(v) if len(v) >= 2 else (v[0], math.nan, math.nan)
    return {"n": len(v), "mean": mean, "ci95": [low, high], "median": statistics.median(v)}


def ranking(sweep_dir: Path, units: int, arm: str, oracle: str, high: str, low: str
            ) -> dict[str, Any]:
    sweep = load_sweep(sweep_dir)
    arms = {a.label: a for a in sweep.arms}
    for label in (arm, oracle):
        if label not in arms:
            raise SystemExit(f"{sweep_dir}: no arm {label!r} (arms: {', '.join(arms)})")
    rows = []
    for u in [u for u in sweep.units if u[0] < units]:
        measured = first_damage_map(sweep.run_dir(u, arms[oracle]))
        if measured is None:
            raise FileNotFoundError(f"{sweep.run_dir(u, arms[oracle])}: no damage map")
        top = top_of(measured, u).layer
        pred = predicted_damage(first_table(sweep.run_dir(u, arms[arm])), high, low)
        rows.append({"unit": list(u), "top_unit": top,
                     "rho_without_top": spearman(pred, measured, top),
                     "rho_all": spearman(pred, measured)})
    return {"arm": arm, "oracle": oracle, "high": high, "low": low, "units": rows,
            "without_top": summary([r["rho_without_top"] for r in rows]),
            "all_layers": summary([r["rho_all"] for r in rows])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep", type=Path, help="a sweep directory, or its collected copy")
    p.add_argument("--units", type=int, required=True, help="the n fixed by the pilot")
    p.add_argument("--arm", default="snip@0.875/every:100")
    p.add_argument("--oracle", default="oracle@0.875")
    p.add_argument("--high", default="bf16")
    p.add_argument("--low", default="fp4_e2m1_tensor")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    try:
        res = ranking(args.sweep, args.units, args.arm, args.oracle, args.high, args.low)
    except FileNotFoundError as e:
        print(f"ranking: {e}", file=sys.stderr)
        return 1
    for key, title in (("without_top", "without the top unit"), ("all_layers", "all layers")):
        s = res[key]
        if s["n"]:
            print(f"Spearman(predicted, measured damage), {title}: mean {s['mean']:+.3f} "
                  f"[{s['ci95'][0]:+.3f}, {s['ci95'][1]:+.3f}], median {s['median']:+.3f}, "
                  f"n={s['n']}")
    if args.out:
        args.out.write_text(json.dumps(res, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
