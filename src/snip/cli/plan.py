"""``snip plan``: a precision plan from a saved checkpoint or a measured sensitivity table.

    snip plan --checkpoint runs/NAME --precision.budget 0.75 --out plan.json --save-table sens.json
    snip plan --table sens.json --precision.method layer_type --out layer_type.json
    snip plan --table sens.json --relative-time 0.4 --profile blackwell --precision.per_gemm

From a checkpoint it loads the weights *and the AdamW state* (weight divergence is measured
through Adam's update gain, so a checkpoint without optimizer state is refused), runs one
statistics cycle on calibration batches from the run's training split, and solves.  From
``--table`` (no ``--checkpoint``) it reuses a table measured earlier, so every method can be
planned from one measurement.  Planner options share their names with ``snip train``
(``--precision.budget``, ``--precision.method``, ``--precision.per_gemm``,
``--precision.candidates``, ``--precision.seed``); the short forms (``--budget``, ``--method``,
``--per-gemm``, ``--candidates``, ``--seed``) still work.

Baselines are held at exactly the FP4 fraction the ILP reaches on the same table and budget
(:mod:`snip.planner.baselines`); a warning is printed when that is impossible, when a plan
exceeds the budget (``uniform``; granularity), and when a candidate can never be chosen.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from snip.errors import MissingFileError, UserError

COMMAND = "plan"
HELP = ("plan per-layer precision (SNIP ILP or a baseline) from a saved training checkpoint or "
        "a measured sensitivity table")

METHOD_HELP = {
    "ilp": "SNIP: minimise normalised loss + weight divergence under the budget",
    "uniform": "every unit in the 4-bit format",
    "layer_id": "first/last blocks kept high, middle blocks low first",
    "layer_type": "MLP gate/up low first, then q/k, v, o; MLP down last",
    "min_rel_err": "lowest relative quantization error low first",
    "random": "a fixed random order per --precision.plan_seed",
    "oracle": "knapsack on measured single-unit damage (needs --damage)",
    "layer_id_rev": "layer_id with mirrored ties (last block low first)",
    "layer_type_rev": "layer_type with mirrored ties (last block low first)",
    "random_top": "SNIP's most sensitive unit kept high, the rest in the random order of "
                  "--precision.plan_seed",
}


def _bool(value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from snip.plan.profiles import PROFILES
    from snip.planner import DEFAULT_CANDIDATES, Method

    src = parser.add_argument_group("source (one of)")
    src.add_argument("--checkpoint", type=Path, default=None,
                     help="run directory (its newest checkpoint) or a checkpoint directory: "
                          "measure a sensitivity table from it")
    src.add_argument("--table", type=Path, default=None,
                     help="sensitivity table JSON: without --checkpoint, plan from it (no "
                          "measuring); with --checkpoint, write the measured table here "
                          "(prefer --save-table)")
    parser.add_argument("--save-table", type=Path, default=None,
                        help="write the measured sensitivity table JSON here")
    parser.add_argument("--budget", "--precision.budget", dest="budget", type=float,
                        default=None,
                        help="minimum share of linear-layer GEMM FLOPs in a 4-bit format "
                             "(default 0.75 unless only --relative-time is given)")
    parser.add_argument("--relative-time", type=float, default=None,
                        help="instead (or also): maximum GEMM time relative to all-BF16")
    parser.add_argument("--profile", default="blackwell",
                        help=f"throughput profile for --relative-time: one of "
                             f"{', '.join(PROFILES)}, or a JSON profile file")
    methods = "; ".join(f"{m.value}: {METHOD_HELP[m.value]}" for m in Method)
    parser.add_argument("--method", "--precision.method", dest="method", default="ilp",
                        choices=[m.value for m in Method], metavar="METHOD",
                        help=f"how to choose ({methods}). Baselines are held at exactly the "
                             f"FP4 fraction the ILP reaches")
    parser.add_argument("--per-gemm", dest="per_gemm", action="store_true", default=False,
                        help="decide each GEMM separately (default: one format per layer)")
    parser.add_argument("--precision.per_gemm", dest="per_gemm", type=_bool, nargs="?",
                        const=True, metavar="BOOL", help="same as --per-gemm (true/false)")
    parser.add_argument("--candidates", "--precision.candidates", dest="candidates", nargs="+",
                        default=None,
                        help=f"candidate presets (default {' '.join(DEFAULT_CANDIDATES)} when "
                             f"measuring; with --table, the table's candidates)")
    parser.add_argument("--precision.calib_batches", "--micro-batches", dest="calib_batches",
                        type=int, default=None,
                        help="calibration batches the statistics average over (default: the "
                             "run's precision.calib_batches, what its controller measures)")
    parser.add_argument("--precision.calib_rows", dest="calib_rows", type=int, default=None,
                        help="sequences used from each calibration batch, 0: all (default: "
                             "the run's precision.calib_rows)")
    parser.add_argument("--seed", "--precision.seed", dest="seed", type=int, default=0,
                        help="seed of the statistics' noise probes and of the random "
                             "baseline's draw (one fixed plan per seed)")
    parser.add_argument("--damage", type=Path, default=None,
                        help="measured single-unit damage JSON (snip.planner.Damage.to_dict) "
                             "for --precision.method oracle")
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
    model = build_model(ModelConfig(**ckpt.meta.model))
    ckpt.load_weights(model)
    optimizer = make_optimizer(model, cfg.train)
    optimizer.load_state_dict(ckpt.optimizer)
    return ckpt, cfg, data, model, optimizer


def _measure(args: argparse.Namespace, candidates: tuple[str, ...]):
    """The checkpoint's sensitivity table, with a progress bar on a terminal (stderr)."""
    from tqdm import tqdm

    from snip.plan.cost import linear_layers
    from snip.sensitivity import SensitivityConfig, measure
    from snip.train.loop import CALIBRATION_KEY

    path = _checkpoint_dir(args.checkpoint)
    ckpt, cfg, data, model, optimizer = _load(path)
    micro = cfg.train.batch_size // cfg.train.grad_accum

    def batch_fn(i: int):  # the calibration batches the trainer's controller measures on
        return data.train_batch(CALIBRATION_KEY + i, micro, cfg.train.seq_len)

    p = cfg.precision
    config = SensitivityConfig(
        candidates=candidates, seed=args.seed,
        calib_batches=p.calib_batches if args.calib_batches is None else args.calib_batches,
        calib_rows=(p.calib_rows if args.calib_rows is None else args.calib_rows) or None)
    with tqdm(total=config.steps(len(linear_layers(model))), unit="step", desc="measuring",
              leave=False, disable=not sys.stderr.isatty()) as bar:
        table = measure(model, batch_fn, optimizer=optimizer, config=config, step=ckpt.step,
                        done=bar.update)
    return table, path


def warnings_for(table, budget, sol, per_gemm: bool, candidates) -> list[str]:
    """What a user should know about a solved plan (printed to stderr by ``snip plan``)."""
    from snip.planner import Method, build_problem
    from snip.planner.ilp import never_chosen

    out = []
    problem = build_problem(table, budget, candidates=candidates, per_gemm=per_gemm)
    for c, why in never_chosen(problem).items():
        out.append(f"candidate {c} can never be chosen for this table and budget ({why}); "
                   f"drop it from --precision.candidates or check its throughput profile")
    got = sol.achieved.fp4_flop_fraction
    if sol.method is Method.UNIFORM and budget.fp4_fraction is not None and \
            got > budget.fp4_fraction + 1e-9:
        out.append(f"uniform puts every unit in 4 bits: FP4 fraction {got:.4f} exceeds the "
                   f"budget {budget.fp4_fraction} (not a budget-matched comparison)")
    elif sol.method.matched and not sol.exact:
        want = "the ILP's value" if sol.target is None else f"the ILP's {sol.target:.4f}"
        out.append(f"{sol.method.value} could not hit {want} exactly (FP4 fraction {got:.4f}, "
                   f"relative time {sol.achieved.relative_gemm_time:.4f}); it is within one "
                   f"unit's FLOPs")
    elif budget.fp4_fraction is not None and got > budget.fp4_fraction + 1e-9:
        out.append(f"FP4 fraction {got:.4f} exceeds the budget {budget.fp4_fraction}: no set of "
                   f"{'GEMMs' if per_gemm else 'layers'} reaches it exactly"
                   + ("" if per_gemm else " (--per-gemm plans finer)"))
    return out


def _check_outputs(args: argparse.Namespace) -> None:
    """Every file the command writes (the plan; the measured table) lies outside runs,
    checkpoints and sweeps (:func:`snip.atomic.check_outside`), and none is a file it reads or
    another output: ``--out sens.json --table sens.json`` would replace the table with the
    plan."""
    from snip import atomic

    writes = [("--out", args.out), ("--save-table", args.save_table)]
    reads = [("--damage", args.damage)]
    # with --checkpoint, --table names where the measured table goes
    (writes if args.checkpoint is not None else reads).append(("--table", args.table))
    taken = {os.path.realpath(p): f for f, p in reads if p is not None}
    for flag, path in writes:
        if path is None:
            continue
        atomic.check_outside(path, flag)
        real = os.path.realpath(path)
        if real in taken:
            raise UserError(f"{flag} {path} is also {taken[real]}; give each its own file")
        taken[real] = flag


def run(args: argparse.Namespace) -> int:
    import json

    from snip import atomic
    from snip.planner import DEFAULT_CANDIDATES, Budget, Damage, solution
    from snip.sensitivity import SensitivityTable
    from snip.train.config import split_names

    if args.calib_batches is not None and args.calib_batches < 1:
        raise UserError(f"--precision.calib_batches={args.calib_batches} must be >= 1")
    if args.calib_rows is not None and args.calib_rows < 0:
        raise UserError(f"--precision.calib_rows={args.calib_rows} must be >= 0 (0: all)")
    if args.out.is_dir():  # before the measurement, not after
        raise UserError(f"--out {args.out} is a directory; name the plan file to write")
    _check_outputs(args)
    if args.checkpoint is None and args.table is None:
        raise UserError("give --checkpoint (measure a sensitivity table) or --table (reuse "
                         "one measured earlier)")
    fp4 = 0.75 if args.budget is None and args.relative_time is None else args.budget
    budget = Budget(fp4_fraction=fp4, relative_time=args.relative_time, profile=args.profile)
    damage = None
    if args.damage is not None:
        if not args.damage.is_file():
            raise MissingFileError(f"--damage {args.damage} does not exist")
        damage = Damage.from_dict(json.loads(args.damage.read_text()))
    elif args.method == "oracle":
        raise UserError("--precision.method oracle needs --damage DAMAGE.json (measured "
                        "single-unit damage, snip.planner.measure_damage)")
    source: dict = {}
    if args.checkpoint is not None:
        cands = split_names(args.candidates or DEFAULT_CANDIDATES)
        table, path = _measure(args, cands)
        source["checkpoint"] = str(path)
        save = args.save_table or args.table
        if save is not None:
            save.parent.mkdir(parents=True, exist_ok=True)
            table.to_json(save)
    else:
        table = SensitivityTable.from_json(args.table)
        cands = split_names(args.candidates) if args.candidates else None
        source["table"] = str(args.table)
        if args.save_table is not None:
            table.to_json(args.save_table)
    sol = solution(table, budget, method=args.method, per_gemm=args.per_gemm, candidates=cands,
                   seed=args.seed, damage=damage)
    plan = sol.plan.with_meta(**source)
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise atomic.write_error(e, args.out) from None
    plan.to_json(args.out)  # atomic: whole or not at all
    for w in warnings_for(table, budget, sol, args.per_gemm, cands):
        print(f"snip plan: warning: {w}", file=sys.stderr)
    got = sol.achieved
    match = "" if sol.target is None else \
        f" (held at the ILP's {sol.target:.4f}{'' if sol.exact else ', not exactly'})"
    print(f"wrote {args.out}: {args.method} plan for {len(plan.layers)} layers at step "
          f"{table.step}, fp4 FLOP fraction {got.fp4_flop_fraction:.4f}{match}, relative GEMM "
          f"time {got.relative_gemm_time:.4f} ({got.profile}), objective {sol.objective:.4f}")
    return 0
