"""``snip report``: plots and a self-contained HTML page for one run, or several overlaid.

    snip report runs/NAME                      # runs/NAME/report.html and PNGs
    snip report runs/A runs/B --out compare/   # A and B on shared axes
    snip report runs/bf16 runs/fp4_s1 runs/fp4_s2 --out cmp/ --baseline bf16
                                               # differences from bf16; fp4_s* averaged
    snip report runs/cmp                       # a `snip compare` directory: its paired table
                                               # and the curves of all arms

The page names each run's precision, takes differences from the baseline, marks a recipe best
only when it beats the others by more than their seed spread, groups seeds, zooms on the last
half of the loss curves and shows only the configuration
keys that differ (see `snip.report`).
"""

from __future__ import annotations

import argparse

COMMAND = "report"
HELP = "write PNG plots and report.html for a run directory (or overlay several with --out)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories")
    parser.add_argument("--out", metavar="DIR", default=None,
                        help="output directory (default: the run directory; required for "
                             "several runs)")
    parser.add_argument("--baseline", metavar="RUN", default=None,
                        help="run (name or directory) to take differences from (default: the "
                             "first bf16 run, else the first run)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from snip.report import load_run, summary, write_report
    from snip.report.html import fmt_number

    if len(args.runs) == 1 and (Path(args.runs[0]) / "sweep.json").is_file():
        from snip.cli.compare import compare_report

        print(f"report: {compare_report(Path(args.runs[0]))}")
        return 0

    path = write_report(args.runs, out=args.out, baseline=args.baseline)
    for d in args.runs:
        s = summary(load_run(d))
        numbers = ", ".join(f"{k} {fmt_number(v)}" for k, v in s.items() if v is not None)
        print(f"{d}: {numbers}")
    print(f"report: {path}")
    return 0
