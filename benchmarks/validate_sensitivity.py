"""Does SNIP's predicted loss divergence rank decision units the way real FP4 damage does?

A validation that can decide (issue 10): both sides averaged, both sides' reliability measured,
every correlation with a bootstrap 95% interval.  Everything trains and evaluates through the
product's own core (:mod:`snip.train`).

1. **Checkpoints.** One BF16 run of ``--model`` (default ``tiny-deep``: 6 blocks x 7 linears =
   42 decision units) through :func:`snip.train.train`, checkpoints at ``--checkpoints``.
2. **Predictor.** On each checkpoint (model + AdamW state, via :class:`snip.train.loop.Trainer`),
   ``--tables`` independent statistics cycles (:func:`snip.sensitivity.measure`, the controller's
   default ``calib_rows``, fresh calibration batches each), candidates ``(high, low)``.  The
   predictor of unit ``l`` is the mean over tables of its fprop loss divergence at ``low`` minus
   ``high`` (nats) -- what a forward-only loss measurement can see.  The relative-error score
   (``min_rel_err``'s per-layer score, sum of the operand errors of all three GEMMs, and its
   fprop part ``x + w``) is averaged the same way.
3. **Ground truth.** On the trainer's strided held-out batches (``--eval-batches``), the loss with
   unit ``l`` alone computing its forward GEMM from ``low``-quantized X and W with *stochastic
   rounding*, minus the unquantized (fp32) loss on the same batches, averaged over ``--sr-draws``
   independent rounding draws (the expectation the second-order metric models).
4. **Reliability.** Split-half (Spearman-Brown) of the truth over draws and of the predictor
   over tables; noise ceiling ``sqrt(rel_truth * rel_pred)``.
5. **Ranking.** Spearman and Kendall of predictor vs truth per checkpoint and pooled (mean of
   per-checkpoint correlations; bootstrap resamples units within each checkpoint); the paired
   difference SNIP - relative error of Spearman on identical resamples.
6. **Additivity.** ``--plans`` random multi-unit plans per checkpoint: measured loss change of
   the plan (same SR protocol) vs the sum of the predictions (and vs the sum of the measured
   single-unit damages).
7. **Regret.** At FP4 budget ``--budget``: SNIP's plan (ILP on the averaged table) vs the oracle
   (the same knapsack on measured damage, :mod:`snip.planner.oracle`), min_rel_err and a random
   plan, each held at the ILP's FP4 fraction; measured loss change of each plan, and the regret
   SNIP - oracle.

Writes ``<out>.json`` and ``<out>.md`` (default ``benchmarks/out/validate_sensitivity``); the
training run goes to ``<out>_runs/``.

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 PYTHONPATH=src nice -n 5 python \
        benchmarks/validate_sensitivity.py [--steps 600 --checkpoints 200,400,600]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from snip.compare.stats import t_interval
from snip.formats import get_spec, quantize
from snip.plan import PrecisionPlan
from snip.planner import solution
from snip.planner.oracle import Damage
from snip.sensitivity import SensitivityConfig, SensitivityTable, measure
from snip.sensitivity import stats as S
from snip.sensitivity.table import GEMMS, blend
from snip.train import from_sources, train
from snip.train.loop import CALIBRATION_KEY, Trainer

OUT = Path(__file__).resolve().parent / "out"
_REL_OPS = {"fprop": ("x", "w"), "dgrad": ("dy", "w"), "wgrad": ("dy", "x")}


def one_layer_plan(name: str, fprop: str, back: str, high: str = "fp32") -> PrecisionPlan:
    """Every GEMM ``high`` except ``name``'s (fprop ``fprop``, dgrad/wgrad ``back``)."""
    return PrecisionPlan(default=dict.fromkeys(GEMMS, high),
                         layers={name: {"fprop": fprop, "dgrad": back, "wgrad": back}})


@torch.no_grad()
def held_out_loss(model, batches) -> float:
    """Mean loss over ``batches`` (each weighs the same)."""
    return float(np.mean([float(model(x, y)[1]) for x, y in batches]))


def stack(batches, group: int) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """Equal-shape batches stacked ``group`` at a time (one forward each): ``(x, y, count)``."""
    out = []
    for i in range(0, len(batches), group):
        part = batches[i:i + group]
        out.append((torch.cat([b[0] for b in part]), torch.cat([b[1] for b in part]), len(part)))
    return out


@dataclass(frozen=True)
class SRProbe:
    """Forward hooks that recompute chosen linears from stochastically rounded X and W.

    Batches are stacked for speed, but every original batch keeps its own quantization (its
    own scale and its own rounding draw of X and W), exactly as if it ran alone."""

    low: str
    rows: int  # rows of one original batch

    @torch.no_grad()
    def loss(self, model, names: Sequence[str], stacked, seed: int | None) -> float:
        """Mean loss over all batches with every layer in ``names`` SR-quantized (one draw;
        ``seed=None``: no quantization)."""
        gen = torch.Generator().manual_seed(seed or 0)
        wspec = get_spec(self.low).for_weight()

        def hook(mod, args, _y):
            x, outs = args[0], []
            for g in range(0, x.shape[0], self.rows):
                xq = quantize(x[g:g + self.rows], self.low, rounding="stochastic", generator=gen)
                wq = quantize(mod.weight, wspec, rounding="stochastic", generator=gen)
                outs.append(F.linear(xq, wq, getattr(mod, "bias", None)))
            return torch.cat(outs)
        handles = [] if seed is None else \
            [model.get_submodule(n).register_forward_hook(hook) for n in names]
        try:
            tot = sum(float(model(x, y)[1]) * k for x, y, k in stacked)
            return tot / sum(k for *_, k in stacked)
        finally:
            for h in handles:
                h.remove()


def average_tables(tables: Sequence[SensitivityTable]) -> SensitivityTable:
    """The equal-weight mean of ``tables`` (a running :func:`blend`)."""
    avg = tables[0]
    for i, t in enumerate(tables[1:], start=1):
        avg = blend(avg, t, decay=i / (i + 1))
    return avg


def predictions(table: SensitivityTable, high: str, low: str) -> dict[str, dict[str, float]]:
    """Per unit: SNIP's fprop loss divergence (low - high, nats), its full objective
    difference, and the relative-error scores."""
    out: dict[str, dict[str, float]] = {"snip": {}, "snip_objective": {}, "rel_err": {},
                                        "rel_err_fprop": {}}
    for n, e in table.layers.items():
        out["snip"][n] = (e.metric("fprop", low).loss_div - e.metric("fprop", high).loss_div)
        out["snip_objective"][n] = sum(e.metric(g, low).objective - e.metric(g, high).objective
                                       for g in GEMMS)
        errs = e.rel_err[low]
        out["rel_err"][n] = sum(errs[op] for g in GEMMS for op in _REL_OPS[g])
        out["rel_err_fprop"][n] = errs["x"] + errs["w"]
    return out


def train_checkpoints(args, root: Path) -> list[Path]:
    steps = sorted(args.checkpoints)
    every = int(np.gcd.reduce(steps))
    run = train(from_sources(overrides={
        "model.name": args.model, "precision.preset": "bf16", "train.batch_size": args.batch,
        "train.seq_len": args.seq, "train.lr": args.lr, "train.steps": steps[-1],
        "train.warmup_steps": min(30, steps[0]), "train.eval_batches": 4,
        "train.eval_every": steps[-1], "train.threads": args.threads, "train.ckpt_every": every,
        "train.keep_checkpoints": steps[-1] // every, "log.progress": False,
        "run.dir": str(root), "run.name": "base", "seed": args.seed}))
    return [run.run_dir / "checkpoints" / f"step_{s:06d}" for s in steps]


def study_checkpoint(args, ckpt: Path, idx: int, root: Path) -> dict:
    """Predictor tables, SR ground truth, additivity plans and regret on one checkpoint."""
    t0 = time.perf_counter()
    trainer = Trainer(from_sources(overrides={"run.name": f"probe{idx}", "run.dir": str(root),
                                              "train.eval_batches": args.eval_batches,
                                              "train.threads": args.threads},
                                   init_from=ckpt), init_from=ckpt)
    trainer.close()
    model, opt, batches = trainer.model, trainer.optimizer, trainer.eval_data
    step = trainer.step_count
    PrecisionPlan(default=dict.fromkeys(GEMMS, "fp32")).apply(model)  # unquantized reference
    t = trainer.cfg.train

    def batch_fn(i: int):
        return trainer.data.train_batch(CALIBRATION_KEY + i, t.batch_size, t.seq_len)

    cfg = dict(candidates=(args.high, args.low), calib_batches=args.calib_batches,
               calib_rows=args.calib_rows)
    tables = [measure(model, batch_fn, optimizer=opt, step=step,
                      config=SensitivityConfig(**cfg, seed=1000 * idx + k),
                      batch_offset=k * args.calib_batches) for k in range(args.tables)]
    t_pred = time.perf_counter() - t0
    names = list(tables[0].layers)
    per_table = [predictions(tb, args.high, args.low) for tb in tables]
    pred = {key: [float(np.mean([p[key][n] for p in per_table])) for n in names]
            for key in per_table[0]}
    pred_reps = np.array([[p["snip"][n] for p in per_table] for n in names])

    probe = SRProbe(args.low, rows=batches[0][0].shape[0])
    stacked = stack(batches, args.stack)
    base = probe.loss(model, [], stacked, None)

    def damage_draws(units: Sequence[str], tag: int) -> np.ndarray:
        return np.array([probe.loss(model, units, stacked, seed=hash((idx, tag, s)) % 2**31)
                         - base for s in range(args.sr_draws)])

    truth_reps = np.array([damage_draws([n], j) for j, n in enumerate(names)])
    truth = truth_reps.mean(1)
    t_truth = time.perf_counter() - t0 - t_pred

    rng = np.random.default_rng(10_000 + idx)
    plans = []
    for p in range(args.plans):
        size = int(rng.integers(2, max(3, len(names) // 2 + 1)))
        sel = sorted(rng.choice(len(names), size=size, replace=False).tolist())
        meas = damage_draws([names[i] for i in sel], 1000 + p)
        plans.append({"units": [names[i] for i in sel], "measured": float(meas.mean()),
                      "measured_se": float(meas.std(ddof=1) / np.sqrt(len(meas))),
                      "predicted_sum": float(sum(pred["snip"][i] for i in sel)),
                      "truth_sum": float(truth[sel].sum())})

    avg = average_tables(tables)
    damage = Damage(high=args.high, low=args.low, per_gemm=False, base_loss=base,
                    values=dict(zip(names, truth.tolist(), strict=True)))
    cands = (args.high, args.low)
    ilp = solution(avg, args.budget, candidates=cands)
    sols = {"snip": ilp,
            "oracle": solution(avg, args.budget, method="oracle", damage=damage, reference=ilp,
                               candidates=cands),
            "min_rel_err": solution(avg, args.budget, method="min_rel_err", reference=ilp,
                                    candidates=cands),
            "random": solution(avg, args.budget, method="random", reference=ilp,
                               candidates=cands, seed=idx)}
    regret = {}
    for k, sol in sols.items():
        low_units = [n for n in names if sol.plan.layers[n]["fprop"] == get_spec(args.low).name]
        meas = damage_draws(low_units, 5000 + list(sols).index(k))
        regret[k] = {"fp4_fraction": sol.achieved.fp4_flop_fraction, "fp4_units": low_units,
                     "measured": meas.tolist(), "measured_mean": float(meas.mean())}
    trainer_seconds = time.perf_counter() - t0
    return {"checkpoint": str(ckpt), "step": step, "names": names, "pred": pred,
            "pred_reps": pred_reps.tolist(), "truth": truth.tolist(),
            "truth_reps": truth_reps.tolist(), "base_loss": base, "plans": plans,
            "regret": regret, "seconds": {"predictor": t_pred, "truth": t_truth,
                                          "total": trainer_seconds}}


def summarize(ckpts: list[dict], *, n_boot: int = 2000, seed: int = 0) -> dict:
    """All statistics of the validation from the per-checkpoint raw results."""
    strata = np.concatenate([[i] * len(c["names"]) for i, c in enumerate(ckpts)])
    truth = np.concatenate([c["truth"] for c in ckpts])
    preds = {k: np.concatenate([c["pred"][k] for c in ckpts]) for k in ckpts[0]["pred"]}
    kw = dict(strata=strata, n_boot=n_boot, seed=seed)
    ranking = {k: {"spearman": S.bootstrap_ci(S.spearman, v, truth, **kw).to_dict(),
                   "kendall": S.bootstrap_ci(S.kendall, v, truth, **kw).to_dict()}
               for k, v in preds.items()}
    per_ckpt = [{"step": c["step"], "units": len(c["names"]),
                 "spearman": S.bootstrap_ci(S.spearman, c["pred"]["snip"], c["truth"],
                                            n_boot=n_boot, seed=seed).to_dict(),
                 "kendall": S.kendall(c["pred"]["snip"], c["truth"]),
                 "rel_truth": S.split_half(np.array(c["truth_reps"]), seed=seed),
                 "rel_pred": S.split_half(np.array(c["pred_reps"]), seed=seed)}
                for c in ckpts]
    for r in per_ckpt:
        r["noise_ceiling"] = S.noise_ceiling(r["rel_truth"], r["rel_pred"])
    paired = {other: S.paired_difference_ci(S.spearman, preds["snip"], preds[other], truth,
                                            **kw).to_dict()
              for other in ("rel_err", "rel_err_fprop", "snip_objective")}
    plans = [p for c in ckpts for p in c["plans"]]
    pstrata = np.concatenate([[i] * len(c["plans"]) for i, c in enumerate(ckpts)])
    meas = np.array([p["measured"] for p in plans])
    pkw = dict(strata=pstrata, n_boot=n_boot, seed=seed)
    additivity = {
        "plans": len(plans),
        "pearson_pred_sum": S.bootstrap_ci(S.pearson, [p["predicted_sum"] for p in plans], meas,
                                           **pkw).to_dict(),
        "spearman_pred_sum": S.bootstrap_ci(S.spearman, [p["predicted_sum"] for p in plans],
                                            meas, **pkw).to_dict(),
        "pearson_truth_sum": S.bootstrap_ci(S.pearson, [p["truth_sum"] for p in plans], meas,
                                            **pkw).to_dict(),
        "ratio_measured_to_truth_sum": float(meas.sum() / sum(p["truth_sum"] for p in plans)),
        "ratio_predicted_to_measured": float(sum(p["predicted_sum"] for p in plans)
                                             / meas.sum()),
    }
    regret = {}
    for k in ckpts[0]["regret"]:
        vals = np.array([c["regret"][k]["measured_mean"] for c in ckpts])
        regret[k] = {"measured_per_checkpoint": vals.tolist(), "mean": float(vals.mean())}
    for other in [k for k in ckpts[0]["regret"] if k != "snip"]:
        diffs = np.array([np.array(c["regret"]["snip"]["measured"])
                          - np.array(c["regret"][other]["measured"]) for c in ckpts])
        regret[f"snip_minus_{other}"] = _mean_ci(diffs.mean(0))
        regret[f"snip_minus_{other}_per_checkpoint"] = [float(d.mean()) for d in diffs]
    return {"ranking": ranking, "per_checkpoint": per_ckpt, "paired_vs_snip": paired,
            "additivity": additivity, "regret": regret,
            "mean_noise_ceiling": float(np.nanmean([r["noise_ceiling"] for r in per_ckpt]))}


def _mean_ci(x: np.ndarray) -> dict[str, float]:
    """Mean with a 95% t interval over independent rounding draws."""
    m, low, high = t_interval(x)
    return {"value": m, "low": low, "high": high, "n": len(x)}


def _iv(d: dict) -> str:
    return f"{d['value']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"


def markdown(result: dict) -> str:
    a, s = result["args"], result["summary"]
    lines = [f"# validate_sensitivity ({a['model']}, low {a['low']}, {result['units']} units x "
             f"{len(result['checkpoints'])} checkpoints)", "",
             f"Command: `{result['command']}`  ", f"Date: {result['date']}, "
             f"{result['seconds']:.0f} s", "",
             "| predictor | Spearman [95% CI] | Kendall [95% CI] |", "|---|---|---|"]
    for k, v in s["ranking"].items():
        lines.append(f"| {k} | {_iv(v['spearman'])} | {_iv(v['kendall'])} |")
    lines += ["", "| step | Spearman (snip) | Kendall | truth split-half | predictor split-half "
              "| noise ceiling |", "|---|---|---|---|---|---|"]
    for r in s["per_checkpoint"]:
        lines.append(f"| {r['step']} | {_iv(r['spearman'])} | {r['kendall']:+.3f} | "
                     f"{r['rel_truth']:+.3f} | {r['rel_pred']:+.3f} | {r['noise_ceiling']:.3f} |")
    lines += ["", "Paired difference of Spearman, snip - other (same resamples): "]
    lines += [f"- vs {k}: {_iv(v)}" for k, v in s["paired_vs_snip"].items()]
    ad = s["additivity"]
    lines += ["", f"Additivity ({ad['plans']} random plans): Pearson(predicted sum, measured) "
              f"{_iv(ad['pearson_pred_sum'])}, Spearman {_iv(ad['spearman_pred_sum'])}; "
              f"Pearson(sum of measured single-unit damage, measured) "
              f"{_iv(ad['pearson_truth_sum'])}; measured / sum of singles "
              f"{ad['ratio_measured_to_truth_sum']:.3f}; predicted / measured "
              f"{ad['ratio_predicted_to_measured']:.3f}."]
    rg = s["regret"]
    lines += ["", f"Regret at FP4 budget {a['budget']} (measured loss change, mean over "
              "checkpoints): " + ", ".join(f"{k} {v['mean']:+.5f}" for k, v in rg.items()
                                            if "mean" in v)
              + "; " + ", ".join(f"snip - {k[len('snip_minus_'):]} {_iv(v)}" for k, v in rg.items()
                                 if k.startswith("snip_minus_") and "per_checkpoint" not in k)
              + " (t interval over the SR draws, fixed plans).",
              "", "`python benchmarks/validate_sensitivity.py --resummarize JSON` re-derives "
              "every statistic from the raw per-checkpoint results."]
    return "\n".join(lines) + "\n"


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-deep")
    p.add_argument("--checkpoints", type=lambda s: [int(x) for x in s.split(",")],
                   default=[200, 400, 600])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--high", default="bf16")
    p.add_argument("--low", default="fp4_e2m1_tensor")
    p.add_argument("--tables", type=int, default=16)
    p.add_argument("--calib-batches", type=int, default=1)
    p.add_argument("--calib-rows", type=int, default=2)
    p.add_argument("--sr-draws", type=int, default=8)
    p.add_argument("--eval-batches", type=int, default=32)
    p.add_argument("--stack", type=int, default=16, help="eval batches per forward")
    p.add_argument("--plans", type=int, default=10, help="random plans per checkpoint")
    p.add_argument("--budget", type=float, default=0.75)
    p.add_argument("--boot", type=int, default=2000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resummarize", type=Path, default=None,
                   help="recompute the statistics of a saved <out>.json and exit")
    p.add_argument("--reuse", action="store_true",
                   help="reuse the checkpoints of an earlier run with the same --out")
    p.add_argument("--out", type=Path, default=OUT / "validate_sensitivity")
    return p.parse_args(argv)


def resummarize(path: Path, n_boot: int, seed: int) -> dict:
    """Recompute the summary and markdown of a saved run from its raw per-checkpoint data."""
    result = json.loads(Path(path).read_text())
    result["summary"] = summarize(result["checkpoints"], n_boot=n_boot, seed=seed)
    Path(path).write_text(json.dumps(result, indent=1))
    Path(path).with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return result


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse(argv)
    if args.resummarize is not None:
        return resummarize(args.resummarize, args.boot, args.seed)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    root = Path(f"{args.out}_runs")
    for probe in root.glob("probe*"):
        shutil.rmtree(probe)
    saved = [root / "base" / "checkpoints" / f"step_{s:06d}" for s in sorted(args.checkpoints)]
    if not (args.reuse and all(p.is_dir() for p in saved)):
        shutil.rmtree(root, ignore_errors=True)
        saved = train_checkpoints(args, root)
    ckpts = [study_checkpoint(args, c, i, root) for i, c in enumerate(saved)]
    result = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "command": " ".join(["python", "benchmarks/validate_sensitivity.py",
                                   *(sys.argv[1:] if argv is None else argv)]),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "units": len(ckpts[0]["names"]), "checkpoints": ckpts,
              "summary": summarize(ckpts, n_boot=args.boot, seed=args.seed)}
    result["seconds"] = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.json").write_text(json.dumps(result, indent=1))
    Path(f"{args.out}.md").write_text(markdown(result))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
