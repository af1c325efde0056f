"""Reports of training runs: PNG plots and one self-contained HTML page.

    from snip.report import write_report
    write_report(["runs/a"])                          # runs/a/report.html + PNGs
    write_report(["runs/a", "runs/b"], out="cmp")     # overlaid comparison in cmp/

Reads only run directories (``config.toml``, ``metrics.jsonl``, ``plans/``); see
`snip.report.runs` for the files and `snip.report.plots` for the figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from snip.errors import UserError
from snip.report.html import page, summary
from snip.report.plots import all_plots
from snip.report.runs import RunData, load_run


def write_report(run_dirs: Sequence[str | Path], out: str | Path | None = None) -> Path:
    """Write the plots and ``report.html`` to ``out`` (default: the only run's directory);
    returns the HTML path."""
    if not run_dirs:
        raise UserError("give at least one run directory")
    runs = [load_run(d) for d in run_dirs]
    if out is None:
        if len(runs) > 1:
            raise UserError("comparing several runs needs --out DIR")
        out = runs[0].path
    out = Path(out)
    plots = all_plots(runs, out)
    path = out / "report.html"
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(page(runs, plots))
    tmp.replace(path)
    return path


__all__ = ["RunData", "load_run", "summary", "write_report"]
