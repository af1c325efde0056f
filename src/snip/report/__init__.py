"""Reports of training runs: PNG plots and one self-contained HTML page.

    from snip.report import write_report
    write_report(["runs/a"])                                    # runs/a/report.html + PNGs
    write_report(["runs/bf16", "runs/fp4_s1", "runs/fp4_s2"], out="cmp", baseline="bf16")

Reads only run directories (``config.toml``, ``metrics.jsonl``, ``plans/``); see
`snip.report.runs` for the files, `snip.report.precision` for how a run's precision is named,
coloured and costed, `snip.report.compare` for repeats, baselines and the config diff,
`snip.report.plots` for the figures and `snip.report.html` for the page and its sections.
Look at the result as a reader does: ``python -m snip.report.screenshot report.html shot.png``
(headless Chromium; `snip.report.screenshot`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from snip import atomic
from snip.errors import UserError
from snip.report.compare import config_diff, group_repeats, pick_baseline
from snip.report.html import Section, page, sections, summary
from snip.report.plots import all_plots
from snip.report.precision import precision_label, projected_gemm_time
from snip.report.runs import RunData, load_run


def write_report(run_dirs: Sequence[str | Path], out: str | Path | None = None, *,
                 baseline: str | None = None,
                 extra_sections: Sequence[Section] = ()) -> Path:
    """Write the plots and ``report.html`` to ``out`` (default: the only run's directory);
    returns the HTML path.  ``baseline`` (a run name or path) is what differences are taken
    from; ``extra_sections`` (e.g. the `snip compare` table) open the page."""
    if not run_dirs:
        raise UserError("give at least one run directory")
    runs = [load_run(d) for d in run_dirs]
    names = [r.name for r in runs]
    if len(set(names)) < len(names):
        raise UserError(f"run names must differ to be told apart: {', '.join(names)}")
    if out is None:
        if len(runs) > 1:
            raise UserError("comparing several runs needs --out DIR")
        out = runs[0].path
    out = Path(out)
    _check_out(out, runs)
    labels = {r.name: precision_label(r) for r in runs}
    base = pick_baseline(runs, baseline, labels)
    groups = group_repeats(runs)
    try:
        plots = all_plots(runs, out, groups=[g.runs for g in groups], labels=labels)
    except OSError as e:  # a full disk or read-only --out: one line
        raise atomic.write_error(e, out) from None
    parts = sections(runs, plots, baseline=base, groups=groups)
    parts[0:0] = list(extra_sections)
    path = out / "report.html"
    (path.parent / "report.html.tmp").unlink(missing_ok=True)  # left by older versions
    atomic.write_text(path, page(runs, parts))
    return path


def _check_out(out: Path, runs: Sequence[RunData]) -> None:
    """``out`` may be the one run's own directory, or a directory outside every run, checkpoint
    and `snip compare` sweep (:func:`snip.atomic.check_outside`): report.html and plots there
    would replace theirs, or go with a rotated checkpoint.  Refused before any write."""
    atomic.check_outside(out, "--out", own=(runs[0].path, "run") if len(runs) == 1 else None)


__all__ = ["RunData", "Section", "config_diff", "group_repeats", "load_run", "pick_baseline",
           "precision_label", "projected_gemm_time", "summary", "write_report"]
