"""Ablation of the SNIP objective: loss-only, weight-only, combined (nats), old sum-normalised.

1. Train the ``tiny`` model in fp32 for ``--steps`` steps (the checkpoint) with ``snip.train``
   (the product's training loop), on a schedule of ``--steps + --k`` steps.
2. Predict with one statistics cycle (:func:`snip.sensitivity.measure`, ``--calib-batches``).
3. Ground truth, in nats, for every linear layer ``l``: continue ``--k`` AdamW steps with *all
   three* GEMMs of ``l`` in ``fp4_e2m1_tile128`` (the rest fp32) as an ``--init-from`` branch
   of the checkpoint, then evaluate the held-out loss with ``l`` still quantized; subtract the
   fp32 branch on the same batches. Averaged over ``--repeats`` branches, each on its own data
   order (``data.order_seed``), so on different batches and rounding draws.
4. Spearman rank correlation over layers of each predictor with that damage, and the ratio of
   predicted to measured total nats.  Writes ``benchmarks/out/ablate_sensitivity.json``.

    NUMBA_NUM_THREADS=1 python benchmarks/ablate_sensitivity.py [--steps 300 --k 30]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _util import write_json  # noqa: E402
from snip.sensitivity import Normalization, SensitivityConfig, measure  # noqa: E402
from snip.train import from_sources, train  # noqa: E402
from snip.train.loop import CALIBRATION_KEY, Trainer  # noqa: E402
from validate_sensitivity import one_layer_plan  # noqa: E402

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
    p.add_argument("--calib-batches", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--eval-batches", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    t0 = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="ablate_"))
    common = {"run.dir": str(root), "train.threads": args.threads, "log.progress": False,
              "train.eval_batches": args.eval_batches}
    # the checkpoint: fp32 on the schedule of steps + k, stopped at steps (the trainer's loop)
    base = train(from_sources(overrides={
        **common, "run.name": "base", "model.name": "tiny", "precision.mode": "fixed",
        "precision.preset": "fp32", "train.batch_size": args.batch, "train.seq_len": args.seq,
        "train.lr": args.lr, "train.steps": args.steps + args.k, "train.warmup_steps": 30,
        "train.ckpt_every": args.steps, "train.eval_every": args.steps + args.k}),
        until=args.steps)
    ckpt = base.run_dir / "checkpoints" / f"step_{args.steps:06d}"
    probe = Trainer(from_sources(overrides={**common, "run.name": "probe"}, init_from=ckpt),
                    init_from=ckpt)
    probe.close()
    t = probe.cfg.train
    table = measure(probe.model,
                    lambda i: probe.data.train_batch(CALIBRATION_KEY + i, t.batch_size, t.seq_len),
                    optimizer=probe.optimizer, step=args.steps,
                    config=SensitivityConfig(candidates=CANDS, calib_batches=args.calib_batches,
                                             normalization=Normalization.NATS))

    def continued(layer: str | None, repeat: int) -> float:
        """A --init-from branch: k more steps on data order ``repeat`` with ``layer`` (None: no
        layer) in FP4, evaluated on the trainer's strided validation windows, still quantized."""
        name = f"r{repeat}_{layer or 'ref'}"
        prec = {"precision.preset": "fp32"}
        if layer is not None:
            path = root / f"{name}.json"
            one_layer_plan(layer, FP4, FP4).to_json(path)
            prec = {"precision.preset": "", "precision.plan": str(path)}
        cfg = from_sources(overrides={**common, **prec, "run.name": name,
                                      "data.order_seed": repeat}, init_from=ckpt)
        return train(cfg, init_from=ckpt).val_loss  # its final evaluation, plan applied

    orders = list(range(args.repeats))  # one data order per repeat
    ref = [continued(None, o) for o in orders]
    per_repeat = {n: [continued(n, o) - r
                      for o, r in zip(orders, ref, strict=True)] for n in table.layers}
    shutil.rmtree(root, ignore_errors=True)
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
