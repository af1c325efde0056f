"""PNG plots of one or several runs (several runs are overlaid on shared axes).

* ``loss.png``: training loss (thin) and validation loss (markers) against step;
* ``lr.png``: the learning-rate schedule;
* ``fp4_fraction.png``: share of linear-layer GEMM FLOPs in a 4-bit format over time;
* ``throughput.png``: training tokens per second;
* ``precision_map[_RUN].png``: the precision map, rows = layer x GEMM, columns = steps, each
  cell coloured by the element width of the format in force (from ``plans/step_<N>.json``).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import BoundaryNorm, ListedColormap  # noqa: E402

from snip.report.runs import GEMMS, RunData, plan_formats, plan_layers  # noqa: E402

_WIDTHS = (4, 6, 8, 16, 32)  # element bits, each its own colour
_COLOURS = ("#d7301f", "#fc8d59", "#fdcc8a", "#91bfdb", "#4575b4")


def _line_plot(runs: list[RunData], keys: list[tuple[str, str]], ylabel: str, title: str,
               path: Path, logy: bool = False) -> Path | None:
    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = False
    for i, run in enumerate(runs):
        colour = f"C{i}"
        for key, style in keys:
            s = run.s(key)
            if not s.steps:
                continue
            label = f"{run.name} {key}" if len(runs) > 1 or len(keys) > 1 else run.name
            if style == "markers":
                ax.plot(s.steps, s.values, "o-", color=colour, ms=4, lw=1.5, label=label)
            else:
                ax.plot(s.steps, s.values, "-", color=colour, lw=1, alpha=0.6, label=label)
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set(xlabel="step", ylabel=ylabel, title=title)
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _bits(preset: str) -> int:
    from snip.formats import get_spec

    try:
        return get_spec(preset).element.bits
    except (KeyError, ValueError, AttributeError):
        return 32


def precision_map(run: RunData, path: Path) -> Path | None:
    """Heat map of element bits per (layer, GEMM) over the steps of the run."""
    layers = plan_layers(run.plans)
    if not run.plans or not layers:
        return None
    last = max([run.plans[-1][0] + 1, *run.s("loss").steps, *run.s("val_loss").steps])
    edges = [step for step, _ in run.plans] + [last]
    grid = np.array([[_bits(plan_formats(plan, layers)[(layer, g)]) for _, plan in run.plans]
                     for layer in layers for g in GEMMS], dtype=float)
    fig, ax = plt.subplots(figsize=(8, max(3.0, 0.12 * len(grid) + 1.5)))
    cmap = ListedColormap(_COLOURS)
    norm = BoundaryNorm([0, 5, 7, 12, 24, 64], cmap.N)
    mesh = ax.pcolormesh(edges, np.arange(len(grid) + 1), grid, cmap=cmap, norm=norm)
    ax.set_yticks(np.arange(len(grid)) + 0.5)
    ax.set_yticklabels([f"{layer} {g}" for layer in layers for g in GEMMS], fontsize=5)
    ax.invert_yaxis()
    ax.set(xlabel="step", title=f"precision map: {run.name}")
    bar = fig.colorbar(mesh, ax=ax, ticks=[2.5, 6, 9.5, 18, 44])
    bar.ax.set_yticklabels([f"{w}-bit" for w in _WIDTHS])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def all_plots(runs: list[RunData], out: Path) -> list[Path]:
    """Every plot that has data, written to ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    made = [
        _line_plot(runs, [("loss", "line"), ("val_loss", "markers")], "loss (nats/token)",
                   "training and validation loss", out / "loss.png"),
        _line_plot(runs, [("lr", "line")], "learning rate", "learning rate", out / "lr.png"),
        _line_plot(runs, [("fp4_flop_fraction", "line")], "FP4 FLOP fraction",
                   "share of GEMM FLOPs in FP4", out / "fp4_fraction.png"),
        _line_plot(runs, [("tokens_per_s", "line")], "tokens / s", "training throughput",
                   out / "throughput.png"),
    ]
    for run in runs:
        suffix = "" if len(runs) == 1 else f"_{run.name}"
        made.append(precision_map(run, out / f"precision_map{suffix}.png"))
    return [p for p in made if p is not None]
