"""Write-back experiment: gap recovery of each write-back policy on the tiny model.

Weights of every linear layer are stored on the analytic (scale-1) e4m3 / e5m2 grid with no
master copy, and the tiny Llama-style model is trained on the built-in byte corpus with AdamW +
cosine from the same initialisation and data order under each policy.  Score:

    R(X) = (L_rne - L_X) / (L_rne - L_fp32)          (L: final validation loss)

Arms per (format, seed): rne, stochastic, eco (stochastic rounding inside its quantizer, the
ECO paper's setting), eco_rne (round to nearest inside), master (blanket fp32 master), and four 10 %
selective-master masks: ``mask_ref`` (top |g*u| tiles from a short fp32 source trace of a
*different* seed, sealed before the targets run), ``mask_target`` (same score from the target
seed's own fp32 run), ``mask_random`` and ``mask_layers`` (fixed controls) and ``mask_freeze``
(freeze-only ranking from the source trace's proxy), and ``mask_matched``: ``--matched-draws``
composition-matched random masks per seed (``matched_random_mask`` of ``mask_ref``: the same
number of tiles in every tensor, drawn at random), reported as a distribution
(:func:`control_distribution`) with the other masks placed in it.  Tiles are ``--tile-size``
coordinates, by default the model width.  The fp32 run of each seed is also the reference trace
for the audit (projected vs measured frozen fraction of the rne arm, in total and per tensor
type: ``projected_by_type`` / ``measured_by_type`` in its JSON).

The script probes steps/s for ~30 s first and sizes the step count to ``--budget-min``.  Each
arm's result is written to ``benchmarks/out/writeback/<arm>.json`` as it finishes; the final
table goes to ``table.md`` and ``summary.json`` there.

    nohup .venv/bin/python benchmarks/writeback_experiment.py > benchmarks/out/writeback/log.txt &
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from snip.audit import (
    ReferenceRecorder,
    by_type,
    compare_crossings,
    freeze_only_mask,
    layer_mask,
    matched_random_mask,
    measured_series,
    random_mask,
    reference_mask,
)
from snip.models import get_config
from snip.optim import eligible_parameters

OUT = Path(__file__).parent / "out" / "writeback"


@dataclass(frozen=True, kw_only=True)
class Setup:
    model: str = "tiny"
    seq_len: int = 64
    batch: int = 16
    lr: float = 1e-3
    min_lr_frac: float = 0.1
    warmup_frac: float = 0.05
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    clip: float = 1.0
    steps: int = 300
    score_frac: float = 0.06  # paper: 600 of 10,000 steps
    mask_fraction: float = 0.1
    tile_size: int = 64  # --tile-size, default the model width (the paper: 768 = GPT-2's)
    matched_draws: int = 10
    eval_batches: int = 8
    source_seed: int = 100
    threads: int = 1

    @property
    def score_steps(self) -> int:
        return max(10, round(self.score_frac * self.steps))


def config(s: Setup, seed: int, name: str, steps: int, policy: str | None, element: str,
           mask_path: Path | None, eco_rounding: str = "stochastic"):
    """The trainer's config of one run (``policy=None``: the fp32 baseline)."""
    from snip.train import from_sources

    values = {"model.name": s.model, "train.seq_len": s.seq_len, "train.batch_size": s.batch,
              "train.lr": s.lr, "train.min_lr_ratio": s.min_lr_frac,
              "train.warmup_steps": max(1, round(s.warmup_frac * steps)),
              "train.weight_decay": s.weight_decay, "train.beta1": s.betas[0],
              "train.beta2": s.betas[1], "train.grad_clip": s.clip, "train.steps": steps,
              "train.eval_every": steps, "train.eval_batches": 2 * s.eval_batches,
              "train.ckpt_every": steps, "train.keep_checkpoints": 1, "log.every": 5,
              "log.progress": False, "precision.preset": "fp32", "seed": seed,
              "train.threads": s.threads,
              "run.dir": str(OUT / "runs"), "run.name": name}
    if policy is not None:
        values |= {"writeback.policy": policy, "writeback.format": element,
                   "writeback.tile_size": s.tile_size, "writeback.eco_rounding": eco_rounding}
        if mask_path is not None:
            values["writeback.mask"] = str(mask_path)
    return from_sources(overrides=values)


def train(s: Setup, seed: int, name: str, *, steps: int | None = None,
          policy: str | None = None, element: str = "e4m3", mask=None, recorder_formats=(),
          max_seconds: float = 0.0, eco_rounding: str = "stochastic", per_type: bool = False):
    """One run through the trainer; returns (result dict, trace or None).  ``per_type``: also the
    measured frozen fraction per tensor type (``measured_by_type``)."""
    import shutil

    from snip.train.hooks import RecorderHook
    from snip.train.loop import Trainer

    steps = steps or s.steps
    shutil.rmtree(OUT / "runs" / name, ignore_errors=True)
    mask_path = None
    if mask is not None:
        mask_path = mask.save(OUT / "masks" / f"{name}.json")
    trainer = Trainer(config(s, seed, name, steps, policy, element, mask_path, eco_rounding))
    named = eligible_parameters(trainer.model)
    rec = (ReferenceRecorder(named, formats=recorder_formats, tile_size=s.tile_size,
                             score_steps=s.score_steps, every=5, tiles=False)
           if recorder_formats else None)
    if rec is not None:
        trainer.hooks.append(RecorderHook(rec))
    if trainer.writeback is not None:
        trainer.writeback.keep_history = True
    t0 = time.perf_counter()
    try:
        if max_seconds:  # a probe of the step rate: bare steps, no bookkeeping
            while time.perf_counter() - t0 < max_seconds and trainer.step_count < steps:
                trainer.step()
            done, val, losses = trainer.step_count, math.nan, [math.nan]
        else:
            result = trainer.run()
            done, val, losses = result.step, result.val_loss, list(result.losses.values())
    finally:
        trainer.close()
    secs = time.perf_counter() - t0
    res = {"seed": seed, "policy": policy or "fp32", "format": element if policy else "fp32",
           "steps": done, "seconds": secs, "steps_per_s": done / secs,
           "train_loss_last50": float(np.mean(losses[-50:])), "val_loss": val}
    if trainer.writeback is not None:
        wb = trainer.writeback.wb
        st, fz = measured_series(wb.history)
        res["measured_frozen"] = {"steps": st.tolist(), "frozen": fz.tolist()}
        nm = wb.never_moved()
        n = {nme: p.numel() for nme, p in named}
        res["never_moved"] = sum(nm[k] * n[k] for k in nm) / sum(n.values())
        res["never_moved_per_tensor"] = nm
        if per_type:
            per = {nme: measured_series(wb.history, nme)[1] for nme, _ in named}
            res["measured_by_type"] = {"steps": st.tolist(), "frozen": _rounded(
                by_type(per, n))}
        if mask is not None:
            res["mask"] = {"method": mask.method, "protected": mask.protected,
                           "eligible": mask.eligible}
    return res, (rec.trace(meta={"seed": seed}) if rec else None)


def _rounded(curves: dict) -> dict:
    return {k: [round(float(x), 5) for x in v] for k, v in curves.items()}


def forecast_fields(trace, fmt: str, res: dict) -> dict:
    """The forecast of an rne arm: predicted vs measured first-majority crossing (all weights)
    and the projected frozen fraction, in total and per tensor type."""
    m = res["measured_frozen"]
    numel = {k: math.prod(v) for k, v in trace.shapes.items()}
    per = {k: trace.projected(fmt, k) for k in trace.names}
    return {"forecast": compare_crossings(trace.steps, trace.projected(fmt), m["steps"],
                                          m["frozen"]),
            "projected_frozen": {"steps": trace.steps.tolist(),
                                 "frozen": trace.projected(fmt).tolist()},
            "projected_by_type": {"steps": trace.steps.tolist(),
                                  "frozen": _rounded(by_type(per, numel))}}


def plot_forecast(rne_json: Path, png: Path) -> dict:
    """The per-tensor-type forecast figure of one rne arm's result file; returns the crossings
    (predicted, measured) per panel."""
    from snip.audit import plot_frozen_by_type

    res = json.loads(rne_json.read_text())
    p, m = res["projected_by_type"], res["measured_by_type"]
    title = (f"{res['format']} storage, round to nearest, seed {res['seed']}: frozen fraction "
             "predicted from the fp32 trace (dashed) vs measured (solid)")
    return plot_frozen_by_type((p["steps"], p["frozen"]), (m["steps"], m["frozen"]), png,
                               title=title)


def save(name: str, res: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(res, indent=1))
    print(f"[{time.strftime('%H:%M:%S')}] {name}: val {res['val_loss']:.4f} "
          f"({res['steps']} steps, {res['seconds']:.0f}s)", flush=True)


def probe(s: Setup, seconds: float) -> float:
    res, _ = train(s, 0, "probe", steps=10**6, policy="rne", element="e4m3",
                   max_seconds=seconds)
    return res["steps_per_s"]


ARMS = ("rne", "stochastic", "eco", "eco_rne", "master", "mask_ref", "mask_target", "mask_random",
        "mask_layers", "mask_freeze", "mask_matched")
FORMATS = ("e4m3", "e5m2")


def n_runs(seeds: int, draws: int) -> float:
    # fp32 runs (with tracing, ~1.5x) + source trace (score_frac) + arms (+ the random draws)
    arms = len(ARMS) + (draws - 1 if "mask_matched" in ARMS else 0)
    return seeds * 1.5 + 0.1 + seeds * len(FORMATS) * arms


def masks_for(s: Setup, source, target, fmt: str, seed: int) -> dict:
    shapes = source.shapes
    f = s.mask_fraction
    return {"mask_ref": reference_mask(source, f), "mask_target": reference_mask(target, f),
            "mask_random": random_mask(shapes, f, seed=seed, tile_size=s.tile_size),
            "mask_layers": layer_mask(shapes, f, tile_size=s.tile_size),
            "mask_freeze": freeze_only_mask(source, fmt, f)}


def matched_masks(s: Setup, reference, seed: int) -> list:
    """``s.matched_draws`` composition-matched random masks for target ``seed`` (draw ``k`` has
    mask seed ``1000 * (seed + 1) + k``: distinct across draws and target seeds)."""
    return [matched_random_mask(reference, seed=1000 * (seed + 1) + k)
            for k in range(s.matched_draws)]


def arm_losses(results: dict, fmt: str, arm: str, seeds: list[int]) -> dict[int, float]:
    """Validation loss per seed of one arm; for ``mask_matched`` the mean over its draws."""
    if arm != "mask_matched":
        return {sd: results[f"{fmt}_{arm}_s{sd}"]["val_loss"] for sd in seeds
                if f"{fmt}_{arm}_s{sd}" in results}
    return {sd: float(np.mean(v)) for sd, v in draw_losses(results, fmt, seeds).items()}


def draw_losses(results: dict, fmt: str, seeds: list[int]) -> dict[int, list[float]]:
    """Validation losses of the composition-matched random draws, per target seed."""
    out = {}
    for sd in seeds:
        v = [r["val_loss"] for k, r in results.items()
             if k.startswith(f"{fmt}_mask_matched") and k.endswith(f"_s{sd}")
             and k.removeprefix(f"{fmt}_mask_matched").removesuffix(f"_s{sd}").isdigit()]
        if v:
            out[sd] = v
    return out


def control_distribution(draws: dict[int, list[float]],
                         arms: dict[str, dict[int, float]]) -> dict:
    """The random-draw control as a distribution, and where each arm sits in it.

    ``draws[seed]``: one value per random draw for that target seed; ``arms[name][seed]``: one
    value per seed; lower is better (excess loss).  Returns the pooled draws' ``n``, ``mean``,
    ``min``, ``max`` and per-seed means, and per arm: its mean, ``beats`` (percent of the
    same-seed draws it is below, ties half, averaged over seeds), ``below_all_in`` (seeds where
    it is below every draw) and ``minus_draw_mean``, the paired difference arm - (mean of the
    same-seed draws) with its 95 % t interval over the seeds both have (n)."""
    from snip.compare import paired, percentile_among

    pooled = [x for v in draws.values() for x in v]
    if not pooled:
        raise ValueError("control_distribution needs at least one draw")
    out: dict = {"draws": {"n": len(pooled), "per_seed_n": {sd: len(v) for sd, v in draws.items()},
                           "mean": float(np.mean(pooled)), "min": float(np.min(pooled)),
                           "max": float(np.max(pooled)),
                           "per_seed_mean": {sd: float(np.mean(v)) for sd, v in draws.items()}},
                 "arms": {}}
    for name, vals in arms.items():
        common = [sd for sd in draws if sd in vals]
        if not common:
            continue
        d = paired(name, [vals[sd] for sd in common], "draw mean",
                   [float(np.mean(draws[sd])) for sd in common])
        beats = [percentile_among(vals[sd], draws[sd]) for sd in common]
        out["arms"][name] = {"mean": float(np.mean([vals[sd] for sd in common])),
                             "beats": float(np.mean(beats)),
                             "below_all_in": sum(vals[sd] < min(draws[sd]) for sd in common),
                             "minus_draw_mean": {"mean": d.mean, "ci95": [d.ci_low, d.ci_high],
                                                 "n": d.n}}
    return out


PAIRS = (("mask_ref", "mask_target"), ("mask_ref", "mask_matched"), ("mask_target", "mask_matched"),
         ("mask_ref", "mask_random"), ("mask_ref", "mask_layers"), ("mask_ref", "mask_freeze"),
         ("eco", "eco_rne"), ("eco", "stochastic"), ("stochastic", "master"), ("eco", "master"),
         ("eco_rne", "stochastic"))


def summarize(results: dict, seeds: list[int]) -> tuple[str, dict]:
    """Per arm: the absolute excess validation loss over the fp32 run of the same seed (paired
    mean, 95 % t interval, n seeds) next to the recovery ratio R; ``mask_matched`` is the mean of
    its draws per seed.  Then the draws as a distribution (:func:`control_distribution`) and the
    paired differences of :data:`PAIRS` (loss and R)."""
    from snip.compare import paired

    table, summary = [], {}
    pair_rows, dist_rows = [], []
    for fmt in FORMATS:
        l32_all = {sd: results[f"fp32_s{sd}"]["val_loss"] for sd in seeds
                   if f"fp32_s{sd}" in results}
        lrn_all = arm_losses(results, fmt, "rne", seeds)
        base = [sd for sd in seeds if sd in l32_all and sd in lrn_all]
        excess, recov = {}, {}
        for arm in ARMS:
            lx_all = arm_losses(results, fmt, arm, seeds)
            ok = [sd for sd in base if sd in lx_all]
            if not ok:
                continue
            l32 = [l32_all[sd] for sd in ok]
            lrn = [lrn_all[sd] for sd in ok]
            lx = [lx_all[sd] for sd in ok]
            r = [100 * (b - x) / (b - a) if b != a else float("nan")
                 for a, b, x in zip(l32, lrn, lx, strict=True)]
            excess[arm] = {sd: x - a for sd, x, a in zip(ok, lx, l32, strict=True)}
            recov[arm] = dict(zip(ok, r, strict=True))
            if arm == "mask_matched":
                nm = [float(np.mean([results[k].get("never_moved", np.nan) for k in results
                                     if k.startswith(f"{fmt}_mask_matched")
                                     and k.endswith(f"_s{sd}")])) for sd in ok]
            else:
                nm = [results[f"{fmt}_{arm}_s{sd}"].get("never_moved", float("nan"))
                      for sd in ok]
            ex = paired(arm, lx, "fp32", l32)
            summary[f"{fmt}_{arm}"] = {"R_mean": float(np.mean(r)), "R_per_seed": r,
                                       "val_loss_mean": float(np.mean(lx)),
                                       "excess_over_fp32": {"mean": ex.mean, "ci95": [ex.ci_low,
                                                            ex.ci_high], "n": ex.n},
                                       "never_moved_mean": float(np.mean(nm))}
            per_seed = " / ".join(f"{v:.1f}" for v in r)
            label = arm if arm != "mask_matched" else "mask_matched (mean of draws)"
            table.append(f"| {fmt} | {label} | {np.mean(lx):.4f} | {ex.mean:+.4f} "
                         f"[{ex.ci_low:+.4f}, {ex.ci_high:+.4f}] | {ex.n} | {np.mean(r):6.1f} % | "
                         f"{per_seed} | {np.mean(nm):.3f} |")
        draws = {sd: [x - l32_all[sd] for x in v]
                 for sd, v in draw_losses(results, fmt, base).items()}
        if draws:
            arms = {a: v for a, v in excess.items() if a.startswith("mask") and a != "mask_matched"}
            dist = control_distribution(draws, arms)
            rdraws = {sd: [100 * (lrn_all[sd] - l32_all[sd] - x) / (lrn_all[sd] - l32_all[sd])
                           for x in v] for sd, v in draws.items()}
            dist["draws_R"] = {"mean": float(np.mean([x for v in rdraws.values() for x in v])),
                               "min": float(np.min([x for v in rdraws.values() for x in v])),
                               "max": float(np.max([x for v in rdraws.values() for x in v]))}
            summary[f"{fmt}_matched_distribution"] = dist
            dd = dist["draws"]
            dist_rows.append(f"| {fmt} | {dd['n']} draws ({len(draws)} seeds) | {dd['mean']:+.4f} "
                             f"| [{dd['min']:+.4f}, {dd['max']:+.4f}] | "
                             f"{dist['draws_R']['mean']:.1f} % [{dist['draws_R']['min']:.1f}, "
                             f"{dist['draws_R']['max']:.1f}] | | |")
            for a, v in dist["arms"].items():
                c = v["minus_draw_mean"]
                dist_rows.append(f"| {fmt} | {a} | {v['mean']:+.4f} | | "
                                 f"{np.mean(list(recov[a].values())):.1f} % | {v['beats']:.0f} % "
                                 f"(below all in {v['below_all_in']}/{c['n']} seeds) | "
                                 f"{c['mean']:+.4f} [{c['ci95'][0]:+.4f}, {c['ci95'][1]:+.4f}] |")
        for a, b in PAIRS:
            common = [sd for sd in excess.get(a, {}) if sd in excess.get(b, {})]
            if not common:
                continue
            dl = paired(a, [excess[a][sd] for sd in common], b, [excess[b][sd] for sd in common])
            dr = paired(a, [recov[a][sd] for sd in common], b, [recov[b][sd] for sd in common])
            summary[f"{fmt}_{a}_minus_{b}"] = {
                "loss": {"mean": dl.mean, "ci95": [dl.ci_low, dl.ci_high], "n": dl.n},
                "R": {"mean": dr.mean, "ci95": [dr.ci_low, dr.ci_high], "n": dr.n}}
            pair_rows.append(f"| {fmt} | {a} - {b} | {dl.mean:+.4f} [{dl.ci_low:+.4f}, "
                             f"{dl.ci_high:+.4f}] | {dr.mean:+.1f} [{dr.ci_low:+.1f}, "
                             f"{dr.ci_high:+.1f}] pts | {dl.n} |")
    l32 = [results[f"fp32_s{sd}"]["val_loss"] for sd in seeds if f"fp32_s{sd}" in results]
    head = ["| format | arm | val loss | excess over fp32 [95% CI] | n | R (mean) | R per seed | "
            "never-moved |", "|---|---|---|---|---|---|---|---|"]
    text = head + table
    if dist_rows:
        text += ["", "Composition-matched random masks as a distribution (excess loss over fp32), "
                 "and where the other masks sit in it:", "",
                 "| format | arm | excess (mean) | draws min-max | R | beats % of same-seed draws"
                 " | arm - draw mean [95% CI] |", "|---|---|---|---|---|---|---|", *dist_rows]
    if pair_rows:
        text += ["", "Paired differences (negative loss: the first arm is better):", "",
                 "| format | pair | loss difference [95% CI] | R difference [95% CI] | n |",
                 "|---|---|---|---|---|", *pair_rows]
    foot = [f"\nfp32 baseline val loss: {np.mean(l32):.4f} (per seed {l32})"] if l32 else []
    return "\n".join(text + foot), summary


def main() -> None:
    global OUT, FORMATS, ARMS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-min", type=float, default=22.0, help="wall-clock budget (minutes)")
    ap.add_argument("--probe-s", type=float, default=30.0)
    ap.add_argument("--steps", type=int, default=0, help="fixed step count (skip sizing)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(OUT), help="output directory")
    ap.add_argument("--formats", nargs="+", default=list(FORMATS),
                    choices=(*FORMATS, "bf16", "fp16"))
    ap.add_argument("--lr", type=float, default=Setup.lr, help="peak learning rate")
    ap.add_argument("--min-lr-frac", type=float, default=Setup.min_lr_frac,
                    help="final learning rate as a fraction of the peak (cosine floor)")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    ap.add_argument("--tile-size", type=int, default=0,
                    help="mask tile size in coordinates (default 0: the model width, d_model)")
    ap.add_argument("--matched-draws", type=int, default=Setup.matched_draws,
                    help="composition-matched random masks per seed (arm mask_matched)")
    ap.add_argument("--summarize", action="store_true",
                    help="only rebuild table.md and summary.json from the JSON files in --out")
    ap.add_argument("--plot-forecast", metavar="RNE_JSON",
                    help="only plot an rne arm's predicted vs measured frozen fraction per tensor "
                         "type (its projected_by_type / measured_by_type) to --png")
    ap.add_argument("--png", help="output of --plot-forecast")
    args = ap.parse_args()
    OUT, FORMATS, ARMS = Path(args.out), tuple(args.formats), tuple(args.arms)
    if args.plot_forecast:
        print(plot_forecast(Path(args.plot_forecast), Path(args.png)))
        return
    if args.summarize:
        results = {f.stem: json.loads(f.read_text()) for f in sorted(OUT.glob("*.json"))
                   if f.stem not in ("setup", "summary")}
        table, summary = summarize(results, args.seeds)
        (OUT / "table.md").write_text(table + "\n")
        (OUT / "summary.json").write_text(json.dumps(summary, indent=1))
        print(table)
        return
    t_start = time.perf_counter()
    base = Setup(threads=args.threads)
    if args.steps:
        steps = args.steps
    else:
        rate = probe(base, args.probe_s)
        left = args.budget_min * 60 - (time.perf_counter() - t_start)
        per_run = 0.85 * left / n_runs(len(args.seeds), args.matched_draws)
        steps = max(50, int(rate * per_run))
        print(f"probe: {rate:.1f} steps/s (rne e4m3); {left:.0f}s left -> {steps} steps per run",
              flush=True)
    s = Setup(steps=steps, threads=args.threads, lr=args.lr, min_lr_frac=args.min_lr_frac,
              tile_size=args.tile_size or get_config(base.model).dim,
              matched_draws=args.matched_draws)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "setup.json").write_text(json.dumps({**asdict(s), "seeds": args.seeds}, indent=1))
    results, traces = {}, {}
    for sd in args.seeds:
        res, traces[sd] = train(s, sd, f"fp32_s{sd}", recorder_formats=FORMATS)
        traces[sd].save(OUT / f"trace_s{sd}.npz")
        results[f"fp32_s{sd}"] = res
        save(f"fp32_s{sd}", res)
    res, source = train(s, s.source_seed, "source", steps=s.score_steps,
                        recorder_formats=FORMATS)
    source.save(OUT / "source_trace.npz")
    for fmt in FORMATS:
        for sd in args.seeds:
            masks = masks_for(s, source, traces[sd], fmt, sd)
            for arm in ARMS:
                pol = {"eco_rne": "eco"}.get(arm, "selective_master" if arm.startswith("mask")
                                             else arm)
                runs = ([(f"{fmt}_{arm}_s{sd}", masks.get(arm))] if arm != "mask_matched" else
                        [(f"{fmt}_mask_matched{k}_s{sd}", m)
                         for k, m in enumerate(matched_masks(s, masks["mask_ref"], sd))])
                for name, mask in runs:
                    res, _ = train(s, sd, name, policy=pol, element=fmt, mask=mask,
                                   eco_rounding="rne" if arm == "eco_rne" else "stochastic",
                                   per_type=arm == "rne")
                    if arm == "rne":
                        res |= forecast_fields(traces[sd], fmt, res)
                    results[name] = res
                    save(name, res)
                table, summary = summarize(results, args.seeds)
                (OUT / "table.md").write_text(table + "\n")
                (OUT / "summary.json").write_text(json.dumps(summary, indent=1))
    print(table)
    print(f"total {time.perf_counter() - t_start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
