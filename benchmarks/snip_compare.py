"""SNIP against uniform precision, heuristics and random plans: a paired `snip compare` sweep.

Everything runs through the product's own path:

1. base checkpoints: for each ``--seeds`` s, ``snip train`` in the high format (bf16) with seed
   s on a schedule of ``--total-steps`` (default ``--base-steps + --steps``) steps, stopped
   (with a checkpoint) at ``--base-steps`` (`snip.train.train(..., until=...)`): weights and
   AdamW state;
2. ``snip compare`` from those bases under ``--orders`` data orders: arms = high, uniform low,
   ``snip@r`` and the baselines at every ``--budgets`` r (adaptive arms choose between
   ``high,low``), and ``--random K`` fixed random plans per budget -- or exactly the ``--arm``
   values given. Every arm continues the base's schedule for ``--steps`` steps on the same
   batches, and is evaluated on the same strided validation windows.

The table (paired differences to the high arm, and SNIP's difference to each baseline with
``snip compare --summarize OUT/compare_<budgets> --reference snip@r``) lands in
``OUT/compare_<budgets>/compare.md`` (or ``OUT/<--name>``); ``compare.json`` there holds the raw
per-unit numbers. Sweeps of different budgets share the bases and can run side by side.
Re-running the same command resumes a sweep (finished branches are kept); re-running it with
more arms (``--oracle``) trains only the new ones.

    python benchmarks/snip_compare.py --model tiny --seeds 0 1 2 --orders 2 \\
        --low fp4_e2m1_tensor --out benchmarks/out/snip_compare

For a long study (`benchmarks/prereg/snip_study.md`): ``--bases-only --shard i/n`` trains every
n-th base (run n of them side by side), ``--hypotheses FILE`` declares the pre-registered
hypotheses, and ``--collect DEST`` copies the small JSON of every branch (result, plans,
sensitivity tables, damage maps, controller log, config) and the sweep's own files to DEST, so
the committed results can be audited without the checkpoints; ``--restore SRC`` copies the
complete units back into OUT on a fresh machine, so that the study resumes after them (a unit
with a branch missing is rerun whole: its base is retrained, possibly on another CPU).
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sys
from pathlib import Path

from snip.cli import main as snip
from snip.compare.sweep import RESULT_FILE, load_sweep
from snip.train import Config, from_sources, train
from snip.train.checkpoint import list_checkpoints

BASELINES = ("layer_id", "layer_type", "min_rel_err")


def base_checkpoints(args: argparse.Namespace, shard: tuple[int, int] = (0, 1)) -> list[Path]:
    """One high-precision base per seed (reused when it exists); with ``shard`` (i, n) only
    every n-th seed from the i-th is trained ((0, 0): none, only the paths)."""
    out = []
    for idx, seed in enumerate(args.seeds):
        run = Path(args.bases or Path(args.out) / "bases") / f"s{seed}"
        ckpt = run / "checkpoints" / f"step_{args.base_steps:06d}"
        out.append(ckpt)
        if ckpt.is_dir() or not shard[1] or idx % shard[1] != shard[0]:
            continue
        if list_checkpoints(run / "checkpoints"):  # interrupted: continue from its checkpoint
            result = train(from_sources(resume=run), resume=run, until=args.base_steps)
        else:
            result = train(_base_config(args, seed, run), until=args.base_steps)
        if result.interrupted:  # Ctrl-C / SIGTERM: the base saved a checkpoint; stop here
            sys.exit(130)
    return out


def _base_config(args: argparse.Namespace, seed: int, run: Path) -> Config:
    return from_sources(overrides={
        "model.name": args.model, "seed": seed, "precision.preset": args.high,
        "train.steps": args.total_steps or args.base_steps + args.steps,
        "train.warmup_steps": args.warmup_steps, "train.lr": args.lr,
        "train.batch_size": args.batch, "train.seq_len": args.seq_len,
        "train.ckpt_every": min(100, args.base_steps), "train.eval_every": args.base_steps,
        "train.threads": args.threads, "log.progress": False,
        "run.dir": str(run.parent), "run.name": run.name})


def _finished(sweep_dir: Path) -> bool:
    """Whether every (unit, arm) branch of the sweep in ``sweep_dir`` has its result."""
    sweep = load_sweep(sweep_dir)
    return all((sweep.run_dir(u, a) / RESULT_FILE).is_file()
               for u in sweep.units for a in sweep.arms)


def collect(sweep_dir: Path, dest: Path, bases: tuple[Path, ...] = ()) -> int:
    """Copy the small JSON of a sweep and of every finished branch to ``dest``: results,
    plans, damage maps and controller logs as they are; the sensitivity tables the plans were
    made from (``sensitivity/step_<N>.json``, the averaged ones), the config and the metrics
    log gzipped (``.gz``: 60 KB tables compress ~8x); the per-cycle tables stay in the sweep's
    output only. The statistics (``compare.json``, ``compare.md``) are copied only once every
    branch has finished: a pre-registered study is not analysed part way, so its interim
    tables are not committed either. Returns the number of files."""
    keep = ["sweep.json", "hypotheses.json"]
    if _finished(sweep_dir):
        keep += ["compare.json", "compare.md"]
    plain = ("result.json", "plans/*.json", "sensitivity/*_damage.json",
             "sensitivity/controller.jsonl")
    packed = ("config.toml", "metrics.jsonl", "sensitivity/step_*.json")
    copies = [(sweep_dir / k, False) for k in keep if (sweep_dir / k).is_file()]
    for branch in sorted((sweep_dir / "runs").glob("*/*")):
        if (branch / "result.json").is_file():  # finished branches only
            copies += [(f, False) for pat in plain for f in sorted(branch.glob(pat))]
            copies += [(f, True) for pat in packed for f in sorted(branch.glob(pat))
                       if not f.name.endswith(("_cycle.json", "_damage.json"))]
    copies = [(f, pack, f.relative_to(sweep_dir)) for f, pack in copies]
    for ckpt in bases:  # finished bases: their config and loss curve, as bases/s<seed>/
        if ckpt.is_dir():
            run = ckpt.parent.parent
            copies += [(run / n, True, Path("bases") / run.name / n)
                       for n in ("config.toml", "metrics.jsonl")]
    for f, pack, rel in copies:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if pack:
            # mtime 0: the same file gives the same bytes (re-collecting changes nothing)
            target.with_name(target.name + ".gz").write_bytes(
                gzip.compress(f.read_bytes(), mtime=0))
        else:
            shutil.copyfile(f, target)
    return len(copies)


def _partial_units(src: Path) -> set[str]:
    """The unit directories (``b<i>_o<j>``) of the collected sweep in ``src`` that miss a
    branch's result."""
    sweep = load_sweep(src)
    return {f"b{u[0]}_o{u[1]}" for u in sweep.units for a in sweep.arms
            if not (sweep.run_dir(u, a) / RESULT_FILE).is_file()}


def restore(src: Path, sweep_dir: Path) -> int:
    """The inverse of :func:`collect` for resuming on a fresh machine: copy the sweep
    definition and the branches of every *complete* unit from ``src`` into ``sweep_dir``,
    unpacking ``.gz``, so that ``snip compare --resume`` skips them. The bases are not restored
    (no checkpoints are collected; the study's runner retrains them), so a unit with a branch
    missing is not restored either: its base, retrained on another machine, need not have the
    same bits (Stage 2's fp8 bases differ between an AMD EPYC and an Intel Xeon even with
    ATen, oneDNN and MKL pinned to AVX2), and all branches of a unit must start from one base
    to be paired. A file already in ``sweep_dir`` is never overwritten. Returns the number of
    files written."""
    partial = _partial_units(src)
    written = 0
    for f in sorted(src.rglob("*")):
        rel = f.relative_to(src)
        if not f.is_file() or rel.parts[0] == "bases" or (
                len(rel.parts) == 1 and rel.name not in ("sweep.json", "hypotheses.json")) or (
                rel.parts[0] == "runs" and rel.parts[1] in partial):
            continue
        packed = f.suffix == ".gz"
        target = sweep_dir / (rel.with_suffix("") if packed else rel)
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(gzip.decompress(f.read_bytes()) if packed else f.read_bytes())
        written += 1
    if partial:
        print(f"restore: not restored, to be rerun whole from a retrained base: "
              f"{', '.join(sorted(partial))}", file=sys.stderr)
    return written


def arms(args: argparse.Namespace) -> list[str]:
    if args.arm:
        return list(args.arm)
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
    p.add_argument("--n-seeds", type=int, default=0, help="seeds 0..N-1 (replaces --seeds)")
    p.add_argument("--base-steps", type=int, default=300)
    p.add_argument("--total-steps", type=int, default=0,
                   help="length of the bases' schedule (0: --base-steps + --steps)")
    p.add_argument("--warmup-steps", type=int, default=20, help="the bases' lr warm-up")
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
    p.add_argument("--name", default="", help="the sweep's directory in OUT (default: "
                                              "compare_<budgets>)")
    p.add_argument("--arm", action="append", default=[],
                   help="the arms, exactly (repeat; replaces the generated list)")
    p.add_argument("--hypotheses", default="", metavar="FILE",
                   help="pre-registered hypotheses (snip compare --hypotheses)")
    p.add_argument("--bases-only", action="store_true", help="train the bases, then stop")
    p.add_argument("--shard", default="0/1", metavar="I/N",
                   help="with --bases-only: train every N-th base from the I-th")
    p.add_argument("--restore", default="", metavar="SRC",
                   help="copy a --collect'ed sweep back into OUT to resume it (no training)")
    p.add_argument("--collect", default="", metavar="DEST",
                   help="copy the sweep's small JSON to DEST (no training)")
    args = p.parse_args(argv)
    if args.n_seeds:
        args.seeds = list(range(args.n_seeds))
    sweep_dir = Path(args.out) / (args.name or f"compare_{'_'.join(args.budgets)}")
    if args.restore:
        print(f"restored {restore(Path(args.restore), sweep_dir)} files into {sweep_dir}")
        return 0
    if args.collect:
        bases = tuple(base_checkpoints(args, (0, 0)))
        print(f"copied {collect(sweep_dir, Path(args.collect), bases)} files to {args.collect}")
        return 0
    i, _, n = args.shard.partition("/")
    bases = base_checkpoints(args, (int(i), int(n or 1)) if args.bases_only else (0, 1))
    if args.bases_only:
        return 0
    argv_compare = ["compare", *(a for b in bases for a in ("--base", str(b))),
                    "--steps", str(args.steps), "--orders", str(args.orders),
                    "--reference", args.high, "--gap", "low", "--precision.candidates",
                    f"{args.high},{args.low}", "--eval-batches", str(args.eval_batches),
                    "--threads", str(args.threads), *(["--arm-major"] if args.arm_major else []),
                    "--out", str(sweep_dir),
                    *(["--hypotheses", args.hypotheses] if args.hypotheses else []),
                    *(a for arm in arms(args) for a in ("--arm", arm))]
    return snip(argv_compare)


if __name__ == "__main__":
    sys.exit(main())
