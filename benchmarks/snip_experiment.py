"""SNIP vs uniform precision and heuristic baselines, trained from scratch on the embedded corpus.

Arms (each trained with the same data order, init and schedule per seed):

* ``bf16``, ``fp8`` (fp8_e4m3_tile128 everywhere), ``fp4`` (fp4_e2m1_tile128 everywhere);
* ``snip@r`` -- the ILP planner at FP4-FLOP fraction ``r`` (warm-up in BF16, then the
  controller re-plans every ``--every`` steps);
* ``<baseline>@r`` for layer_id, layer_type, min_rel_err, random, at the same budgets and cadence.

Reports final validation loss and the share of the uniform-FP4-to-BF16 gap each arm closes,
``(L_fp4 - L_arm) / (L_fp4 - L_bf16)``.  Every arm's result is written as soon as it finishes to
``benchmarks/out/snip/<arm>_s<seed>.json``; ``--summarize`` prints the table and draws
``benchmarks/out/snip/snip_experiment.png``.

    python benchmarks/snip_experiment.py --steps 300 --seeds 0 1            # run
    python benchmarks/snip_experiment.py --summarize                         # table + plot
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
from torch import nn

from snip.nn import convert, disabled
from snip.plan import PrecisionPlan, fp4_flop_fraction
from snip.planner import Controller
from snip.train.loop import CALIBRATION_KEY

OUT = Path(__file__).resolve().parent / "out" / "snip"
FP8, FP4 = "fp8_e4m3_tile128", "fp4_e2m1_tile128"
BASELINES = ("layer_id", "layer_type", "min_rel_err", "random")


# -- one arm ------------------------------------------------------------------------------------

def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    r = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * r)))


@torch.no_grad()
def evaluate(model: nn.Module, ds, args) -> float:
    losses = [model(x, y)[1].item() for x, y in
              ds.iter_eval_batches("val", args.batch, args.seq, max_batches=args.eval_batches)]
    return sum(losses) / len(losses)


def arm_plan(arm: str) -> tuple[PrecisionPlan, Controller | None, dict]:
    """Starting plan and controller of an arm name like ``bf16``, ``snip@0.75``, ``random@0.5``."""
    if arm in ("bf16", "fp8", "fp4"):
        return PrecisionPlan.uniform({"bf16": "bf16", "fp8": FP8, "fp4": FP4}[arm]), None, {}
    method, budget = arm.split("@")
    return PrecisionPlan.uniform("bf16"), (method if method != "snip" else "ilp", float(budget)), {}


def run_arm(arm: str, seed: int, ds, args) -> dict:
    from snip.models import build_model, get_config

    plan, spec, _ = arm_plan(arm)
    torch.manual_seed(seed)
    cfg = get_config(args.model, vocab_size=ds.vocab_size, max_seq_len=args.seq)
    model = convert(build_model(cfg), plan)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    ctl = None
    if spec is not None:
        ctl = Controller(budget=spec[1], method=spec[0], every=args.every, warmup=args.warmup,
                         micro_batches=args.micro_batches, seed=seed)

    def batch_fn(i: int):
        return ds.get_batch("train", args.batch, args.seq, CALIBRATION_KEY + i)

    losses, fractions, t0 = {}, {}, time.perf_counter()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr, args.lr_warmup)
        x, y = ds.get_batch("train", args.batch, args.seq, seed * 1_000_000 + step)
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses[step] = loss.item()
        if ctl is not None:
            with disabled(model):
                new = ctl.on_step_end(step + 1, model, opt, batch_fn)
            if new is not None:
                new.apply(model)
                plan = new
                fractions[step + 1] = fp4_flop_fraction(plan, model)
    seconds = time.perf_counter() - t0
    val = evaluate(model, ds, args)
    return {"arm": arm, "seed": seed, "model": args.model, "steps": args.steps, "val_loss": val,
            "final_train_loss": sum(list(losses.values())[-20:]) / min(20, len(losses)),
            "train_loss": losses, "fp4_fractions": fractions, "seconds": seconds,
            "overhead_share": ctl.overhead_share if ctl is not None else 0.0,
            "final_plan": plan.to_dict() if ctl is not None else None}


def all_arms(budgets: list[float], baselines: tuple[str, ...]) -> list[str]:
    arms = ["bf16", "fp8", "fp4"] + [f"snip@{b}" for b in budgets]
    return arms + [f"{m}@{b}" for b in budgets for m in baselines]


# -- summary ------------------------------------------------------------------------------------

def summarize(out: Path = OUT) -> str:
    rows: dict[str, dict[int, float]] = {}
    for f in sorted(out.glob("*_s*.json")):
        r = json.loads(f.read_text())
        rows.setdefault(r["arm"], {})[r["seed"]] = r["val_loss"]
    if not rows:
        return "no results yet"
    mean = {a: sum(v.values()) / len(v) for a, v in rows.items()}
    lb, l4 = mean.get("bf16"), mean.get("fp4")
    lines = ["| arm | seeds | val loss (mean) | per seed | vs bf16 | gap closed |",
             "|---|---|---|---|---|---|"]
    for arm in sorted(rows, key=_arm_key):
        gap = "n/a (FP4 not worse than BF16)"
        if lb is not None and l4 is not None and l4 > lb:
            gap = f"{100 * (l4 - mean[arm]) / (l4 - lb):.0f}%"
        delta = f"{mean[arm] - lb:+.4f}" if lb is not None else ""
        per = ", ".join(f"{rows[arm][s]:.4f}" for s in sorted(rows[arm]))
        lines.append(f"| {arm} | {len(rows[arm])} | {mean[arm]:.4f} | {per} | {delta} | {gap} |")
    _plot(rows, out)
    return "\n".join(lines)


def _arm_key(arm: str) -> tuple:
    order = {"bf16": 0, "fp8": 1, "fp4": 2}
    if arm in order:
        return (order[arm], 0.0, "")
    m, b = arm.split("@")
    return (3, float(b), "" if m == "snip" else m)


def _plot(rows: dict, out: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    arms = sorted(rows, key=_arm_key)
    vals = [sum(rows[a].values()) / len(rows[a]) for a in arms]
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(arms)), 4))
    colors = ["tab:green" if a.startswith("snip") else "tab:gray" if "@" in a else "tab:blue"
              for a in arms]
    ax.bar(range(len(arms)), vals, color=colors)
    ax.set_xticks(range(len(arms)), arms, rotation=70, ha="right", fontsize=8)
    lo = min(vals)
    ax.set_ylim(lo - 0.05 * abs(lo), max(vals) + 0.02 * abs(lo))
    ax.set_ylabel("validation loss (mean over seeds)")
    ax.set_title("SNIP vs baselines (green: SNIP ILP; gray: heuristics)")
    fig.tight_layout()
    fig.savefig(out / "snip_experiment.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--lr-warmup", type=int, default=30)
    p.add_argument("--warmup", type=int, default=50, help="BF16 steps before the first plan")
    p.add_argument("--every", type=int, default=100, help="re-plan every N steps")
    p.add_argument("--micro-batches", type=int, default=2)
    p.add_argument("--eval-batches", type=int, default=16)
    p.add_argument("--budgets", type=float, nargs="+", default=[0.5, 0.75, 0.8])
    p.add_argument("--baselines", nargs="*", default=list(BASELINES))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--arms", nargs="*", help="run only these arms")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--summarize", action="store_true")
    p.add_argument("--time-steps", type=int, default=0, help="only time N steps of each kind")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.summarize:
        print(summarize(args.out))
        return 0
    torch.set_num_threads(args.threads)
    from snip.data import load_dataset
    ds = load_dataset()
    arms = args.arms or all_arms(args.budgets, tuple(args.baselines))
    if args.time_steps:
        args.steps = args.time_steps
        for arm in ("bf16", "fp4", "snip@0.75"):
            t0 = time.perf_counter()
            r = run_arm(arm, 0, ds, args)
            print(f"{arm}: {args.time_steps / (time.perf_counter() - t0):.2f} steps/s "
                  f"(train {r['seconds']:.1f}s)", flush=True)
        return 0
    for seed in args.seeds:
        for arm in arms:
            path = args.out / f"{arm}_s{seed}.json"
            if path.exists():
                continue
            r = run_arm(arm, seed, ds, args)
            path.write_text(json.dumps(r) + "\n")
            print(f"{arm} seed {seed}: val {r['val_loss']:.4f} ({r['seconds']:.0f}s, overhead "
                  f"{100 * r['overhead_share']:.1f}%)", flush=True)
    print(summarize(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
