"""SNIP against uniform precision, heuristics and random plans: a paired `snip compare` sweep.

Everything runs through the product's own path:

1. base checkpoints: for each ``--seeds`` s, ``snip train`` in the high format (bf16) with seed
   s on a schedule of ``--base-steps + --steps`` steps, stopped (with a checkpoint) at
   ``--base-steps`` (`snip.train.train(..., until=...)`): weights and AdamW state;
2. ``snip compare`` from those bases under ``--orders`` data orders: arms = high, uniform low,
   ``snip@r`` and the baselines at every ``--budgets`` r (adaptive arms choose between
   ``high,low``), and ``--random K`` fixed random plans per budget. Every arm continues the
   base's schedule for ``--steps`` steps on the same batches, and is evaluated on the same
   strided validation windows.

The table (paired differences to the high arm, and SNIP's difference to each baseline with
``snip compare --summarize OUT/compare_<budgets> --reference snip@r``) lands in
``OUT/compare_<budgets>/compare.md``; ``compare.json`` there holds the raw per-unit numbers.
Sweeps of different budgets share the bases and can run side by side. Re-running the same
command resumes a sweep (finished branches are kept); re-running it with more arms (``--oracle``)
trains only the new ones.

    python benchmarks/snip_compare.py --model tiny --seeds 0 1 2 --orders 2 \\
        --low fp4_e2m1_tensor --out benchmarks/out/snip_compare
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from snip.cli import main as snip
from snip.train import from_sources, train

BASELINES = ("layer_id", "layer_type", "min_rel_err")


def base_checkpoints(args: argparse.Namespace) -> list[Path]:
    """One high-precision base per seed (reused when it exists)."""
    out = []
    for seed in args.seeds:
        run = Path(args.bases or Path(args.out) / "bases") / f"s{seed}"
        ckpt = run / "checkpoints" / f"step_{args.base_steps:06d}"
        if not ckpt.is_dir():
            cfg = from_sources(overrides={
                "model.name": args.model, "seed": seed, "precision.preset": args.high,
                "train.steps": args.base_steps + args.steps, "train.lr": args.lr,
                "train.batch_size": args.batch, "train.seq_len": args.seq_len,
                "train.ckpt_every": args.base_steps, "train.eval_every": args.base_steps,
                "train.threads": args.threads, "log.progress": False,
                "run.dir": str(run.parent), "run.name": run.name})
            train(cfg, until=args.base_steps)
        out.append(ckpt)
    return out


def arms(args: argparse.Namespace) -> list[str]:
    out = [args.high, f"low=preset:{args.low}"]
    for r in args.budgets:
        out += [f"snip@{r}", *(f"{m}@{r}" for m in args.baselines)]
        if args.random:
            out.append(f"random@{r}x{args.random}")
    if args.oracle:  # last, so that adding it to a finished sweep keeps the other arms
        out += [f"oracle@{r}" for r in args.budgets]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--base-steps", type=int, default=300)
    p.add_argument("--steps", type=int, default=120, help="steps of every branch")
    p.add_argument("--orders", type=int, default=2)
    p.add_argument("--budgets", nargs="+", default=["0.75"])
    p.add_argument("--baselines", nargs="*", default=list(BASELINES))
    p.add_argument("--random", type=int, default=8, help="fixed random plans per budget")
    p.add_argument("--oracle", action="store_true",
                   help="add oracle@r arms (knapsack on measured single-layer damage); re-run "
                        "a finished sweep with it to train only the oracle arms")
    p.add_argument("--arm-major", action="store_true",
                   help="train arm by arm, random draws last (snip compare --arm-major)")
    p.add_argument("--bases", default="", metavar="DIR",
                   help="directory of existing bases s<seed>/ (default: OUT/bases; trained "
                        "there when missing)")
    p.add_argument("--high", default="bf16")
    p.add_argument("--low", default="fp4_e2m1_tensor")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--eval-batches", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="benchmarks/out/snip_compare")
    args = p.parse_args(argv)
    bases = base_checkpoints(args)
    argv_compare = ["compare", *(a for b in bases for a in ("--base", str(b))),
                    "--steps", str(args.steps), "--orders", str(args.orders),
                    "--reference", args.high, "--gap", "low", "--candidates",
                    f"{args.high},{args.low}", "--eval-batches", str(args.eval_batches),
                    "--threads", str(args.threads), *(["--arm-major"] if args.arm_major else []),
                    "--out", str(Path(args.out) / f"compare_{'_'.join(args.budgets)}"),
                    *(a for arm in arms(args) for a in ("--arm", arm))]
    return snip(argv_compare)


if __name__ == "__main__":
    sys.exit(main())
