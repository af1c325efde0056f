"""Do the predicted divergences rank layers the way real quantization damage does?

1. Train the ``tiny`` model in fp32 for ``--steps`` steps (AdamW): the checkpoint.
2. Predict: one statistics cycle (:func:`snip.sensitivity.measure`) at that checkpoint.
3. Measure, for every linear layer ``l`` alone switched to FP4 (fp4_e2m1_tile128):
   (a) the loss increase on fixed held-out batches with ``l``'s fprop in FP4 (the rest fp32);
   (b) the weight drift ``||theta_k - theta_k^ref||^2`` after ``k`` AdamW steps with ``l``'s
       backward GEMMs (dgrad, wgrad) in FP4, against the fp32 continuation on the same batches.
   (a') the same with *stochastic* rounding of X and W, averaged over ``--sr-seeds`` draws:
       the expected loss increase under unbiased rounding error, which is exactly what the
       second-order metric models (RNE error on one fixed W also has a first-order part).
4. Print Spearman rank correlations: predicted loss divergence vs (a), predicted weight
   divergence vs (b), and the relative-quantization-error score (the ``min_rel_err`` baseline's
   ranking) vs each.  Writes ``benchmarks/out/validate_sensitivity.json``.

    python benchmarks/validate_sensitivity.py [--steps 300 --k 10 --micro-batches 4]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parent))
from snip.plan import PrecisionPlan  # noqa: E402
from snip.sensitivity import SensitivityConfig, measure  # noqa: E402
from snip_experiment import convert, lr_at  # noqa: E402

FP4 = "fp4_e2m1_tile128"
HP = "fp32"


def one_layer_plan(name: str, fprop: str, back: str) -> PrecisionPlan:
    return PrecisionPlan(default=dict.fromkeys(("fprop", "dgrad", "wgrad"), HP),
                         layers={name: {"fprop": fprop, "dgrad": back, "wgrad": back}})


def train_steps(model, opt, ds, args, start: int, n: int) -> None:
    for step in range(start, start + n):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps + args.k, args.lr, 30)
        x, y = ds.get_batch("train", args.batch, args.seq, step)
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


@torch.no_grad()
def held_out_loss(model, batches) -> float:
    return float(np.mean([model(x, y)[1].item() for x, y in batches]))


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
    torch.set_num_threads(args.threads)
    from snip.data import load_dataset
    from snip.models import build_model, get_config

    t0 = time.perf_counter()
    ds = load_dataset()
    torch.manual_seed(0)
    model = build_model(get_config("tiny", vocab_size=ds.vocab_size, max_seq_len=args.seq))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    train_steps(model, opt, ds, args, 0, args.steps)
    t_train = time.perf_counter() - t0

    def batch_fn(i: int):
        return ds.get_batch("train", args.batch, args.seq, 5_000_000 + i)

    t1 = time.perf_counter()
    tables = {fo: measure(model, batch_fn, optimizer=opt, step=args.steps,
                          config=SensitivityConfig(candidates=(FP4,), first_order=fo,
                                                   micro_batches=args.micro_batches,
                                                   noise_groups=args.noise_groups))
              for fo in (False, True)}
    t_stats = (time.perf_counter() - t1) / 2
    batches = list(ds.iter_eval_batches("val", args.batch, args.seq,
                                        max_batches=args.eval_batches))
    ref_loss = held_out_loss(model, batches)
    ref_model = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(ref_model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                weight_decay=0.1)
    ref_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # load_state_dict aliases
    train_steps(ref_model, ref_opt, ds, args, args.steps, args.k)
    ref_theta = flat(ref_model)

    names = tables[False].names
    dloss, drift, dloss_sr = [], [], []
    for name in names:
        dloss_sr.append(sr_loss(model, name, batches, args.sr_seeds) - ref_loss)
        m = convert(copy.deepcopy(model), one_layer_plan(name, FP4, HP))
        dloss.append(held_out_loss(m, batches) - ref_loss)
        m = convert(copy.deepcopy(model), one_layer_plan(name, HP, FP4))
        o = torch.optim.AdamW(m.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
        o.load_state_dict(copy.deepcopy(opt.state_dict()))
        train_steps(m, o, ds, args, args.steps, args.k)
        drift.append(float(((flat(m) - ref_theta) ** 2).sum()))

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
