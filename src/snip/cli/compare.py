"""``snip compare``: fair, paired comparisons of precision recipes from shared checkpoints.

    snip compare --base runs/bf16/checkpoints/step_000400 --steps 200 --orders 2 \\
        --arm bf16 --arm fp4=preset:fp4_e2m1_tile128 --arm snip@0.75 --arm layer_type@0.75 \\
        --arm random@0.75x8 --reference bf16 --gap fp4 --out runs/cmp
    snip compare --resume runs/cmp                     # continue an interrupted sweep
    snip compare --summarize runs/cmp --reference snip@0.75   # other reference, no training

Every arm branches from each base checkpoint under each data order, trains ``--steps`` steps
and is evaluated on the same strided validation windows; the table gives each arm's paired
difference to the reference with a 95% interval (`snip.compare`). Writes ``compare.md``,
``compare.json`` and ``report.html`` in ``--out``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

COMMAND = "compare"
HELP = "branch precision recipes from the same checkpoints and compare them with paired statistics"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--base", action="append", default=[], metavar="CHECKPOINT",
      help="base checkpoint (or run directory: its newest checkpoint); repeat for several")
    a("--arm", action="append", default=[], metavar="SPEC",
      help="an arm: PRESET, LABEL=preset:PRESET, [LABEL=]plan:FILE, METHOD@BUDGET (snip, "
           "uniform, layer_id, layer_type, min_rel_err, random, ...) or random@BUDGETxK")
    a("--steps", type=int, default=None,
      help="training steps of every branch (default: 200)")
    a("--orders", type=int, default=None, help="data orders per base (order 0: the parent's "
                                               "own, k: its order seed + k; default: 1)")
    a("--reference", default="", metavar="ARM", help="the arm differences are taken against "
                                                    "(default: the first arm)")
    a("--gap", default="", metavar="ARM",
      help="report the share of the reference-to-ARM gap each arm closes (when it resolves)")
    a("--eval-batches", type=int, default=None,
      help="validation batches, spread over the whole split, for every arm's final evaluation "
           "(default: 32)")
    a("--precision.candidates", "--candidates", dest="candidates", nargs="+", default=None,
      metavar="PRESET", help="candidate presets of the adaptive arms, high precision first "
      "(NAME NAME or NAME,NAME; default: the planner's, fp8_e4m3_tile128 fp4_e2m1_tile128)")
    a("--out", default="runs/compare", metavar="DIR", help="output directory")
    a("--threads", type=int, default=0, help="torch CPU threads (0: the trainer's default)")
    a("--arm-major", action="store_true",
      help="train arm by arm (every unit of an arm, random draws last) instead of unit by "
           "unit, so a sweep cut short leaves whole arms")
    a("--resume", metavar="DIR", help="continue the comparison in DIR (its sweep.json)")
    a("--summarize", metavar="DIR",
      help="recompute the table and report of DIR from its finished arms, without training")
    a("--units", type=int, default=0, metavar="N",
      help="summarize only the first N bases (0: all; e.g. the n an internal pilot fixed)")
    a("--hypotheses", metavar="FILE",
      help="pre-registered hypotheses (JSON: delta_min and hypotheses [{id, statement, "
           "contrasts: [[ARM, COMPARATOR], ...]}], in test order); kept as OUT/hypotheses.json, "
           "and their verdicts are printed with the table")


def run(args: argparse.Namespace) -> int:
    from snip import atomic
    from snip.compare import Sweep, load_sweep, parse_arms, run_sweep
    from snip.compare.sweep import Outcome, check_new_out, keep_hypotheses
    from snip.errors import UserError
    from snip.train.config import split_names

    if args.resume and args.summarize:
        raise UserError("give either --resume DIR or --summarize DIR, not both")
    if args.units < 0:
        raise UserError(f"--units {args.units} must be >= 0 (0: all bases)")
    existing = args.resume or args.summarize
    # the options that define a sweep, given (None: not given; the default is Sweep's)
    sized = {"steps": args.steps, "orders": args.orders, "eval_batches": args.eval_batches}
    definition = {"--base": args.base, "--arm": args.arm, "--steps": args.steps,
                  "--orders": args.orders, "--train.eval_batches": args.eval_batches,
                  "--precision.candidates": args.candidates}
    if existing:
        given = [flag for flag, value in definition.items() if value not in (None, [])]
        if given:  # the definition is the sweep's (its sweep.json); it does not change
            raise UserError(f"--resume/--summarize read the comparison from DIR; drop "
                            f"{', '.join(given)} (to change them, start another --out)")
        sweep = load_sweep(Path(existing), args.threads)
    else:
        atomic.check_outside(args.out, "--out", own=(args.out, "snip compare sweep"))  # rerun
        check_new_out(Path(args.out))
        # bases by absolute path: the sweep can be resumed from any working directory
        sweep = Sweep(bases=tuple(os.path.abspath(b) for b in args.base),
                      arms=tuple(parse_arms(args.arm)),
                      **{k: v for k, v in sized.items() if v is not None},
                      reference=args.reference or "", gap=args.gap,
                      candidates=",".join(split_names(args.candidates or [])),
                      out=args.out, threads=args.threads)
    hypotheses = Path(args.hypotheses) if args.hypotheses else None
    if args.summarize:
        if hypotheses is not None:
            keep_hypotheses(hypotheses, sweep)
        outcome = Outcome.FINISHED
    else:
        outcome = run_sweep(sweep, arm_major=args.arm_major, hypotheses=hypotheses)
    md, js, report = _write(sweep, args.reference or None, args.gap or None, args.units)
    print(md.read_text())
    print(f"wrote {md}, {js}" + (f" and {report}" if report else ""))
    if outcome is Outcome.INTERRUPTED:
        print(f"snip compare: interrupted; continue with: snip compare --resume {sweep.out}",
              file=sys.stderr)
        return 130
    if outcome is Outcome.INCOMPLETE:
        print(f"snip compare: the table is incomplete (branches held by another worker); when "
              f"it finishes, run: snip compare --summarize {sweep.out}", file=sys.stderr)
        return 3
    return 0


def compare_report(out: Path) -> Path | None:
    """Rewrite the table and report of the comparison in ``out`` (`snip report OUT`)."""
    from snip.compare import load_sweep

    return _write(load_sweep(out))[2]


def _write(sweep, reference: str | None = None,  # noqa: ANN001
           gap: str | None = None, bases: int = 0) -> tuple[Path, Path, Path | None]:
    """Summarize ``sweep``: compare.md, compare.json and report.html (paths)."""
    from snip.compare import summarize, write_summary

    summary = summarize(sweep, reference=reference, gap=gap, bases=bases)
    js, md = write_summary(summary)
    return md, js, _report(sweep, summary)


def _report(sweep, summary) -> Path | None:  # noqa: ANN001
    """report.html: the answer (paired table, forest plot), then the curves of every unit
    (`snip.report.sweep`)."""
    from snip.report.sweep import write_compare_report

    return write_compare_report(summary)
