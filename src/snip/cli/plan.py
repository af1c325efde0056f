"""``snip plan``: a precision plan from a saved checkpoint (statistics -> metrics -> ILP).

    snip plan --checkpoint runs/NAME --budget 0.75 --out plan.json
    snip plan --checkpoint runs/NAME/checkpoints/step_000500 --method min_rel_err --per-gemm

Loads the weights *and the AdamW state* (weight divergence is measured through Adam's update
gain, so a checkpoint without optimizer state is refused), runs one statistics cycle on
calibration batches from the run's training split, solves, and writes the plan (and, with
``--table``, the sensitivity table).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from snip.errors import MissingFileError, UserError

COMMAND = "plan"
HELP = "plan per-layer precision (SNIP ILP or a baseline) from a saved training checkpoint"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from snip.planner import DEFAULT_CANDIDATES, Method

    parser.add_argument("--checkpoint", required=True, type=Path,
                        help="run directory (its newest checkpoint) or a checkpoint directory")
    parser.add_argument("--budget", type=float, default=None,
                        help="minimum share of linear-layer GEMM FLOPs in a 4-bit format "
                             "(default 0.75 unless only --relative-time is given)")
    parser.add_argument("--relative-time", type=float, default=None,
                        help="instead (or also): maximum GEMM time relative to all-BF16")
    parser.add_argument("--profile", default="blackwell", help="throughput profile for time")
    parser.add_argument("--method", default="ilp", choices=[m.value for m in Method])
    parser.add_argument("--per-gemm", action="store_true",
                        help="decide each GEMM separately (default: one format per layer)")
    parser.add_argument("--candidates", nargs="+", default=list(DEFAULT_CANDIDATES),
                        help="candidate presets")
    parser.add_argument("--micro-batches", type=int, default=2,
                        help="calibration micro-batches the statistics average over")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--table", type=Path, default=None,
                        help="also write the sensitivity table JSON here")
    parser.add_argument("--out", type=Path, default=Path("plan.json"), help="plan JSON path")


def _checkpoint_dir(path: Path) -> Path:
    from snip.train import checkpoint

    if not path.exists():
        raise MissingFileError(f"--checkpoint {path} does not exist; pass a run directory "
                               f"(runs/NAME) or one of its checkpoints/step_<N> directories")
    found = path if (path / "meta.json").is_file() else None
    if found is None:
        ckpts = checkpoint.list_checkpoints(path / "checkpoints")
        if not ckpts:
            raise MissingFileError(f"--checkpoint {path} has no checkpoints (expected "
                                   f"{path / 'checkpoints'}/step_<N>)")
        found = ckpts[-1]
    if not (found / "optimizer.pt").is_file():
        raise UserError(f"checkpoint {found} has no optimizer state (optimizer.pt is missing): "
                        f"the weight divergence needs the AdamW moments; plan from a checkpoint "
                        f"written by `snip train`, which saves them")
    return found


def _load(path: Path):
    """Model with weights, AdamW with state, the run config and its data."""
    from snip.models import ModelConfig, build_model
    from snip.train import checkpoint, make_optimizer
    from snip.train import config as C
    from snip.train.batches import open_data

    ckpt = checkpoint.load(path)
    if not ckpt.optimizer.get("state"):
        raise UserError(f"checkpoint {path} has an empty optimizer state (no AdamW moments; "
                        f"saved before the first step?); plan from a later checkpoint")
    cfg = C.load(path / "config.toml")
    data = open_data(cfg.data, cfg.seed)
    model = build_model(ModelConfig(**ckpt.meta["model"]))
    ckpt.load_weights(model)
    optimizer = make_optimizer(model, cfg.train)
    optimizer.load_state_dict(ckpt.optimizer)
    return ckpt, cfg, data, model, optimizer


def run(args: argparse.Namespace) -> int:
    from snip.planner import Budget, solve
    from snip.sensitivity import SensitivityConfig, measure
    from snip.train.loop import CALIBRATION_KEY

    if args.micro_batches < 1:
        raise UserError(f"--micro-batches={args.micro_batches} must be >= 1")
    fp4 = 0.75 if args.budget is None and args.relative_time is None else args.budget
    budget = Budget(fp4_fraction=fp4, relative_time=args.relative_time, profile=args.profile)
    path = _checkpoint_dir(args.checkpoint)
    ckpt, cfg, data, model, optimizer = _load(path)
    micro = cfg.train.batch_size // cfg.train.grad_accum

    def batch_fn(i: int):  # the calibration batches the trainer's controller measures on
        return data.train_batch(CALIBRATION_KEY + i, micro, cfg.train.seq_len)

    config = SensitivityConfig(candidates=tuple(args.candidates), seed=args.seed,
                               micro_batches=args.micro_batches)
    table = measure(model, batch_fn, optimizer=optimizer, config=config, step=ckpt.step)
    plan = solve(table, budget, method=args.method, per_gemm=args.per_gemm,
                 candidates=args.candidates, seed=args.seed)
    plan = plan.with_meta(checkpoint=str(path))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plan.to_json(args.out)
    if args.table is not None:
        table.to_json(args.table)
    got = plan.meta["achieved"]
    print(f"wrote {args.out}: {args.method} plan for {len(plan.layers)} layers at step "
          f"{ckpt.step}, fp4 FLOP fraction {got['fp4_flop_fraction']:.3f}, relative GEMM time "
          f"{got['relative_gemm_time']:.3f} ({got['profile']}), objective "
          f"{plan.meta['objective']:.4f}")
    return 0
