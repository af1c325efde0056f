"""Fair, paired comparisons of precision recipes (``snip compare``).

* `snip.compare.arms` -- what an ``--arm`` string means (a preset, a plan, SNIP or a baseline at
  a budget, K fixed random plans);
* `snip.compare.sweep` -- every arm branched from the same checkpoints under the same data
  orders, evaluated on the same windows; resumable;
* `snip.compare.stats` -- paired differences, t intervals, sign and Wilcoxon tests; declared
  hypotheses with verdicts over independent bases (`HypothesisResult`, for reports), power;
* `snip.compare.halves` -- losses on two halves of the windows (the search oracle);
* `snip.compare.diagnostics` -- does a win come from the outlier layer alone?
* `snip.compare.table` -- the Markdown/HTML tables.
"""

from snip.compare.arms import Arm, Kind, parse_arm, parse_arms
from snip.compare.stats import (
    Contrast,
    ContrastVerdict,
    HypothesisResult,
    HypothesisSpec,
    Paired,
    Verdict,
    evaluate_hypotheses,
    gap_closed,
    paired,
    percentile_among,
)
from snip.compare.sweep import Summary, Sweep, load_sweep, run_sweep, summarize
from snip.compare.table import html_tables, markdown, write_summary

__all__ = ["Arm", "Contrast", "ContrastVerdict", "HypothesisResult", "HypothesisSpec", "Kind",
           "Paired", "Summary", "Sweep", "Verdict", "evaluate_hypotheses", "gap_closed",
           "html_tables", "load_sweep", "markdown", "paired", "parse_arm", "parse_arms",
           "percentile_among", "run_sweep", "summarize", "write_summary"]
