"""Ablation of the SNIP objective: loss-only, weight-only, combined (nats), old sum-normalised.

1. Train the ``tiny`` model in fp32 for ``--steps`` steps (the checkpoint), as
   ``validate_sensitivity.py`` does.
2. Predict with one statistics cycle (:func:`snip.sensitivity.measure`, ``--micro-batches``).
3. Ground truth, in nats, for every linear layer ``l``: continue ``--k`` AdamW steps with *all
   three* GEMMs of ``l`` in ``fp4_e2m1_tile128`` (the rest fp32), then evaluate the held-out
   loss with ``l`` still quantized; subtract the fp32 continuation on the same batches.
   Averaged over ``--repeats`` continuations on different batches (and rounding draws).
4. Spearman rank correlation over layers of each predictor with that damage, and the ratio of
   predicted to measured total nats.  Writes ``benchmarks/out/ablate_sensitivity.json``.

    NUMBA_NUM_THREADS=1 python benchmarks/ablate_sensitivity.py [--steps 300 --k 30]
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _util import write_json  # noqa: E402
from snip.nn import convert  # noqa: E402
from snip.sensitivity import Normalization, SensitivityConfig, measure  # noqa: E402
from validate_sensitivity import held_out_loss, one_layer_plan  # noqa: E402


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warm-up, cosine decay to 10% (the schedule the ablation was measured with)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    r = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * r)))


def train_steps(model, opt, ds, args, start: int, n: int) -> None:
    """Plain AdamW steps on the training split (the loop this ablation was measured with)."""
    for step in range(start, start + n):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps + args.k, args.lr, 30)
        x, y = ds.get_batch("train", args.batch, args.seq, step)
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

FP4 = "fp4_e2m1_tile128"
CANDS = ("fp8_e4m3_tile128", FP4)


def predictors(table) -> dict[str, dict[str, float]]:
    """Per layer: FP4 minus FP8 of each objective (what the planner trades)."""
    out: dict[str, dict[str, float]] = {"loss_only": {}, "weight_only": {}, "combined_nats": {},
                                        "sum_normalised": {}}
    tot_l = sum(max(e.metric("fprop", FP4).loss_div, 0) for e in table.layers.values())
    tot_w = sum(e.metric(g, FP4).weight_div for e in table.layers.values()
                for g in ("dgrad", "wgrad"))
    for n, e in table.layers.items():
        def d(f, e=e):
            return f(e, FP4) - f(e, CANDS[0])
        dl = d(lambda e, c: max(e.metric("fprop", c).loss_div, 0.0))
        dwn = d(lambda e, c: sum(e.metric(g, c).weight_div_nats for g in ("dgrad", "wgrad")))
        dw = d(lambda e, c: sum(e.metric(g, c).weight_div for g in ("dgrad", "wgrad")))
        out["loss_only"][n], out["weight_only"][n] = dl, dwn
        out["combined_nats"][n] = dl + dwn
        out["sum_normalised"][n] = dl / max(tot_l, 1e-30) + dw / max(tot_w, 1e-30)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--k", type=int, default=30)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--eval-batches", type=int, default=32)
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
    table = measure(model, lambda i: ds.get_batch("train", args.batch, args.seq, 5_000_000 + i),
                    optimizer=opt, step=args.steps,
                    config=SensitivityConfig(candidates=CANDS, micro_batches=args.micro_batches,
                                             normalization=Normalization.NATS))
    val = [ds.get_batch("val", args.batch, args.seq, 997 * i) for i in range(args.eval_batches)]

    def continued(plan, start: int) -> float:
        m = copy.deepcopy(model)
        m = convert(m, plan) if plan is not None else m  # shares the Parameters, same order
        o = torch.optim.AdamW(m.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
        o.load_state_dict(opt.state_dict())
        train_steps(m, o, ds, args, start, args.k)
        return held_out_loss(m, val)

    starts = [args.steps + 10_000 * r for r in range(args.repeats)]
    ref = [continued(None, s) for s in starts]
    per_repeat = {n: [continued(one_layer_plan(n, FP4, FP4), s) - r
                      for s, r in zip(starts, ref, strict=True)] for n in table.layers}
    damage = {n: float(np.mean(v)) for n, v in per_repeat.items()}
    preds = predictors(table)
    names = list(damage)
    truth = [damage[n] for n in names]
    rows = {}
    half = args.repeats // 2
    split = float(spearmanr([np.mean(per_repeat[n][:half]) for n in names],
                            [np.mean(per_repeat[n][half:]) for n in names])[0]) \
        if half else float("nan")
    print(f"tiny, {args.steps} fp32 steps, k={args.k}, repeats={args.repeats}, "
          f"{len(names)} layers; total measured damage {sum(truth):+.4f} nats; "
          f"ground-truth split-half Spearman {split:+.2f}")
    for key, pr in preds.items():
        rho = float(spearmanr([pr[n] for n in names], truth)[0])
        rows[key] = {"spearman": rho, "predicted_total": sum(pr.values())}
        print(f"{key:16s} Spearman {rho:+.2f}   predicted total {sum(pr.values()):.4g}")
    write_json("ablate_sensitivity.json", {"args": vars(args), "damage": damage,
                                           "per_repeat": per_repeat, "predictors": preds,
                                           "summary": rows, "split_half": split,
                                           "seconds": time.perf_counter() - t0})


if __name__ == "__main__":
    main()
