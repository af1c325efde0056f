"""Do the predicted divergences rank layers the way real quantization damage does?

Everything trains through the product's own core (`snip.train`):

1. Train the ``tiny`` model in fp32 for ``--steps + --k`` steps, saving the checkpoint at
   ``--steps`` (the base) and continuing to ``--steps + --k`` (the fp32 continuation).
2. Predict: one statistics cycle (:func:`snip.sensitivity.measure`) on the base's model and
   AdamW state (a trainer branched from the base, not run).
3. Measure, for every linear layer ``l`` alone switched to FP4 (fp4_e2m1_tile128):
   (a) the loss increase on the trainer's strided held-out batches with ``l``'s fprop in FP4
       (the rest fp32);
   (b) the weight drift ``||theta_k - theta_k^ref||^2`` after ``k`` steps of a branch of the
       base with ``l``'s backward GEMMs (dgrad, wgrad) in FP4, against the fp32 continuation
       (same batches, same schedule);
   (a') the same as (a) with *stochastic* rounding of X and W, averaged over ``--sr-seeds``
       draws: the expected loss increase under unbiased rounding error, which is exactly what
       the second-order metric models (RNE error on one fixed W also has a first-order part).
4. Print Spearman rank correlations: predicted loss divergence vs (a), predicted weight
   divergence vs (b), and the relative-quantization-error score (the ``min_rel_err`` baseline's
   ranking) vs each.  Writes ``benchmarks/out/validate_sensitivity_*.json``; the runs go to
   ``benchmarks/out/validate/``.

    python benchmarks/validate_sensitivity.py [--steps 300 --k 10 --micro-batches 4]
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

from snip.plan import PrecisionPlan
from snip.sensitivity import SensitivityConfig, measure
from snip.train import from_sources, train
from snip.train.evaluation import mean_loss
from snip.train.loop import CALIBRATION_KEY, Trainer

FP4 = "fp4_e2m1_tile128"
HP = "fp32"
OUT = Path(__file__).resolve().parent / "out"


def one_layer_plan(name: str, fprop: str, back: str) -> PrecisionPlan:
    return PrecisionPlan(default=dict.fromkeys(("fprop", "dgrad", "wgrad"), HP),
                         layers={name: {"fprop": fprop, "dgrad": back, "wgrad": back}})


def held_out_loss(model, batches) -> float:
    return mean_loss(model, batches, torch.device("cpu"))


@torch.no_grad()
def sr_loss(model, name: str, batches, seeds: int) -> float:
    """Held-out loss with layer ``name``'s fprop operands stochastically rounded to FP4."""
    import torch.nn.functional as F

    from snip.formats import get_spec, quantize

    layer = model.get_submodule(name)
    out = []
    for s in range(seeds):
        gen = torch.Generator().manual_seed(s)

        def hook(mod, args, _y, gen=gen):
            x = quantize(args[0], FP4, rounding="stochastic", generator=gen)
            w = quantize(mod.weight, get_spec(FP4).for_weight(), rounding="stochastic",
                         generator=gen)
            return F.linear(x, w)
        h = layer.register_forward_hook(hook)
        try:
            out.append(held_out_loss(model, batches))
        finally:
            h.remove()
    return float(np.mean(out))


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def checkpoint_weights(run: Path, step: int) -> torch.Tensor:
    from safetensors.torch import load_file

    state = load_file(run / "checkpoints" / f"step_{step:06d}" / "model.safetensors")
    return torch.cat([state[k].flatten() for k in sorted(state)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--noise-groups", type=int, default=1)
    p.add_argument("--sr-seeds", type=int, default=4)
    p.add_argument("--eval-batches", type=int, default=48)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    root = OUT / "validate"
    shutil.rmtree(root, ignore_errors=True)
    common = {"model.name": "tiny", "train.batch_size": args.batch, "train.seq_len": args.seq,
              "train.lr": args.lr, "train.steps": args.steps + args.k, "train.warmup_steps": 30,
              "train.eval_batches": args.eval_batches, "train.threads": args.threads,
              "log.progress": False, "run.dir": str(root), "seed": 0}

    t0 = time.perf_counter()
    base = train(from_sources(overrides={
        **common, "run.name": "base", "precision.preset": HP, "train.ckpt_every": args.steps,
        "train.eval_every": args.steps + args.k, "train.keep_checkpoints": 2}))
    t_train = time.perf_counter() - t0
    ckpt = base.run_dir / "checkpoints" / f"step_{args.steps:06d}"
    ref_theta = checkpoint_weights(base.run_dir, args.steps + args.k)

    probe = Trainer(from_sources(overrides={"run.name": "probe"}, init_from=ckpt),
                    init_from=ckpt)
    model, opt, batches = probe.model, probe.optimizer, probe.eval_data
    probe.close()

    def batch_fn(i: int):
        return probe.data.train_batch(CALIBRATION_KEY + i, args.batch, args.seq)

    t1 = time.perf_counter()
    tables = {fo: measure(model, batch_fn, optimizer=opt, step=args.steps,
                          config=SensitivityConfig(candidates=(FP4,), first_order=fo,
                                                   micro_batches=args.micro_batches,
                                                   noise_groups=args.noise_groups))
              for fo in (False, True)}
    t_stats = (time.perf_counter() - t1) / 2
    ref_loss = held_out_loss(model, batches)

    names = tables[False].names
    dloss, drift, dloss_sr = [], [], []
    for name in names:
        dloss_sr.append(sr_loss(model, name, batches, args.sr_seeds) - ref_loss)
        m = copy.deepcopy(model)
        one_layer_plan(name, FP4, HP).apply(m)
        dloss.append(held_out_loss(m, batches) - ref_loss)
        plan = root / f"plan_{name}.json"
        one_layer_plan(name, HP, FP4).to_json(plan)
        branch = train(from_sources(overrides={"run.name": f"back_{name}",
                                               "precision.plan": str(plan)}, init_from=ckpt),
                       init_from=ckpt)
        theta = checkpoint_weights(branch.run_dir, args.steps + args.k)
        drift.append(float(((theta - ref_theta) ** 2).sum()))

    t = tables[False]
    pred_l = [t.layers[n].metric("fprop", FP4).loss_div for n in names]
    pred_l1 = [tables[True].layers[n].metric("fprop", FP4).loss_div for n in names]
    pred_w = [t.layers[n].metric("dgrad", FP4).weight_div + t.layers[n].metric("wgrad", FP4)
              .weight_div for n in names]
    rel_f = [t.layers[n].rel_err[FP4]["x"] + t.layers[n].rel_err[FP4]["w"] for n in names]
    rel_b = [2 * t.layers[n].rel_err[FP4]["dy"] + t.layers[n].rel_err[FP4]["w"]
             + t.layers[n].rel_err[FP4]["x"] for n in names]
    rho = {
        "loss_div (2nd order) vs actual loss increase": spearmanr(pred_l, dloss)[0],
        "loss_div (+1st order) vs actual loss increase": spearmanr(pred_l1, dloss)[0],
        "rel err (fprop X+W) vs actual loss increase": spearmanr(rel_f, dloss)[0],
        "loss_div (2nd order) vs SR expected loss increase": spearmanr(pred_l, dloss_sr)[0],
        "rel err (fprop X+W) vs SR expected loss increase": spearmanr(rel_f, dloss_sr)[0],
        "weight_div vs actual weight drift": spearmanr(pred_w, drift)[0],
        "rel err (dY,W,X) vs actual weight drift": spearmanr(rel_b, drift)[0],
    }
    print(f"tiny model, {args.steps} fp32 steps ({t_train:.0f}s), statistics cycle {t_stats:.1f}s "
          f"({args.micro_batches} micro-batches), {len(names)} layers, k={args.k}")
    print(f"{'layer':<28} {'pred dL':>10} {'actual dL':>10} {'SR dL':>10} {'pred dW':>10} "
          f"{'drift':>10}")
    for i, n in enumerate(names):
        print(f"{n:<28} {pred_l[i]:10.3e} {dloss[i]:10.3e} {dloss_sr[i]:10.3e} "
              f"{pred_w[i]:10.3e} {drift[i]:10.3e}")
    for k, v in rho.items():
        print(f"Spearman {k:<48} {v:+.3f}")
    out = Path(__file__).resolve().parent / "out" / (
        f"validate_sensitivity_mb{args.micro_batches}_g{args.noise_groups}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "layers": names, "pred_loss": pred_l,
                               "pred_loss_first_order": pred_l1, "actual_loss": dloss,
                               "actual_loss_sr": dloss_sr,
                               "pred_weight": pred_w, "actual_drift": drift,
                               "rel_err_fprop": rel_f, "rel_err_backward": rel_b,
                               "spearman": rho, "stats_seconds": t_stats}, indent=1))


if __name__ == "__main__":
    main()
