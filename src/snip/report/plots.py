"""PNG plots of one or several runs (several runs are overlaid on shared axes).

* ``loss.png``: training loss (thin) and validation loss (markers) against step, next to a
  zoomed panel of the last half of training -- the first losses (5.5 nats) would otherwise
  squash the differences that matter at the end (2.19 vs 2.25).  Repeats of one recipe (see
  `snip.report.compare`) share a colour, and the zoom adds their mean validation loss (dashed,
  squares) inside a band from their min to their max;
* ``lr.png``: the learning-rate schedule;
* ``fp4_fraction.png``: share of linear-layer GEMM FLOPs in a 4-bit format over time;
* ``throughput.png``: training tokens per second (on a CPU: emulation speed, not hardware speed);
* ``writeback.png``: with a write-back policy, the frozen fraction (managed weights whose update
  was invisible this step) and the never-moved fraction (weights not changed since the start);
* ``precision_map[_RUN].png``: rows = layer x GEMM (fprop, dgrad, wgrad), columns = steps, each
  cell coloured by the *format* in force (every preset its own colour, families by width), rows
  labelled per projection and separated per block, plan changes marked with dashed lines.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from snip.report.precision import format_colour, sort_formats  # noqa: E402
from snip.report.runs import GEMMS, RunData, plan_formats, plan_layers  # noqa: E402

Colours = dict[str, str]  # run name -> matplotlib colour


def run_colours(groups: list[list[RunData]]) -> Colours:
    """One colour per group of repeats."""
    return {r.name: f"C{i % 10}" for i, g in enumerate(groups) for r in g}


def _draw_series(ax, runs: list[RunData], keys: list[tuple[str, str]], colours: Colours,
                 labels: dict[str, str], x_from: float = -np.inf) -> list[float]:
    shown: list[float] = []
    for run in runs:
        for key, style in keys:
            s = run.s(key)
            pts = [(x, y) for x, y in zip(s.steps, s.values, strict=True) if x >= x_from]
            if not pts:
                continue
            xs, ys = zip(*pts, strict=True)
            shown += ys
            label = run.name + (f" ({labels[run.name]})" if run.name in labels else "")
            label += "" if len(keys) == 1 else f" {key}"
            if style == "markers":
                ax.plot(xs, ys, "o-", color=colours[run.name], ms=4, lw=1.5, label=label)
            else:
                ax.plot(xs, ys, "-", color=colours[run.name], lw=1, alpha=0.55, label=label)
    return shown


def _finish(fig, ax, path: Path) -> Path:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _line_plot(runs: list[RunData], keys: list[tuple[str, str]], ylabel: str, title: str,
               path: Path, colours: Colours, labels: dict[str, str],
               note: str | None = None) -> Path | None:
    if not any(run.s(k).steps for run in runs for k, _ in keys):
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    _draw_series(ax, runs, keys, colours, labels)
    ax.set(xlabel="step", ylabel=ylabel, title=title)
    if note:
        ax.text(0.01, 0.01, note, transform=ax.transAxes, fontsize=7, color="#a00",
                va="bottom")
    return _finish(fig, ax, path)


def _smooth(values: list[float], alpha: float = 0.3) -> list[float]:
    """Exponential moving average (training loss is one noisy batch per point)."""
    out, m = [], None
    for v in values:
        m = v if m is None else alpha * v + (1 - alpha) * m
        out.append(m)
    return out


def _legend(fig, runs: list[RunData], colours: Colours, labels: dict[str, str]) -> None:
    """One entry per colour (repeats share one): 'run, run: precision'."""
    by_colour: dict[str, list[str]] = {}
    for run in runs:
        by_colour.setdefault(colours[run.name], []).append(run.name)
    handles = [Line2D([], [], color=c, lw=2, marker="o", ms=4,
                      label=", ".join(names) + f": {labels.get(names[0], '')}".rstrip(": "))
               for c, names in by_colour.items()]
    fig.legend(handles=handles, loc="lower center", ncol=min(2, len(handles)), fontsize=8,
               frameon=False)


def _last_step(runs: list[RunData]) -> int:
    return max(s for run in runs for k in ("loss", "val_loss") for s in run.s(k).steps or [0])


def _zoom_series(run: RunData, last: int) -> list[tuple[list[int], list[float], str]]:
    """(steps, values, style) of the smoothed training loss and the validation loss, for the
    steps in the last half of training."""
    out = []
    for key, style in (("loss", "-"), ("val_loss", "o-")):
        s = run.s(key)
        values = _smooth(s.values) if key == "loss" else s.values
        pts = [(x, y) for x, y in zip(s.steps, values, strict=True) if x >= last / 2]
        if pts:
            xs, ys = zip(*pts, strict=True)
            out.append((list(xs), list(ys), style))
    return out


def zoom_range(runs: list[RunData]) -> tuple[float, float] | None:
    """y-limits of the zoomed panel: what the last half of training shows, plus 8 %."""
    last = _last_step(runs)
    shown = [y for run in runs for _, ys, _ in _zoom_series(run, last) for y in ys]
    if not shown:
        return None
    lo, hi = min(shown), max(shown)
    pad = 0.08 * (hi - lo or 1e-3)
    return lo - pad, hi + pad


def repeat_band(group: list[RunData], from_step: float = 0
                ) -> tuple[list[int], list[float], list[float], list[float]] | None:
    """Validation loss of repeats at their common steps: (steps, mean, min, max)."""
    if len(group) < 2:
        return None
    series = [dict(zip(r.s("val_loss").steps, r.s("val_loss").values, strict=True))
              for r in group]
    steps = sorted(set.intersection(*(set(s) for s in series)))
    steps = [x for x in steps if x >= from_step]
    if not steps:
        return None
    vals = [[s[x] for s in series] for x in steps]
    return (steps, [sum(v) / len(v) for v in vals], [min(v) for v in vals],
            [max(v) for v in vals])


def loss_plot(runs: list[RunData], path: Path, colours: Colours,
              labels: dict[str, str], groups: list[list[RunData]] | None = None) -> Path | None:
    """Full-length loss curves and a zoom on the last half of training, side by side."""
    keys = [("loss", "line"), ("val_loss", "markers")]
    if not any(run.s(k).steps for run in runs for k, _ in keys):
        return None
    n_legend = len(set(colours[r.name] for r in runs))
    fig, (full, zoom) = plt.subplots(1, 2, figsize=(11, 4.2 + 0.2 * ((n_legend + 1) // 2)))
    _draw_series(full, runs, keys, colours, labels)
    full.set(xlabel="step", ylabel="loss (nats/token)",
             title="loss (thin: training, dots: validation)")
    last = _last_step(runs)
    for run in runs:  # zoom: smoothed training loss and validation loss, last half only
        for xs, ys, style in _zoom_series(run, last):
            zoom.plot(xs, ys, style, color=colours[run.name], ms=4,
                      lw=1.5 if style == "o-" else 1, alpha=1 if style == "o-" else 0.6)
    for group in groups or []:  # repeats: their mean, and a band from min to max
        band = repeat_band(group, last / 2)
        if band is not None:
            steps, mean, lo, hi = band
            colour = colours[group[0].name]
            zoom.fill_between(steps, lo, hi, color=colour, alpha=0.15, lw=0)
            zoom.plot(steps, mean, "s--", color=colour, lw=2, ms=5)
            zoom.annotate(f"mean of {len(group)}", (steps[-1], mean[-1]), fontsize=7,
                          xytext=(4, 0), textcoords="offset points", va="center")
    limits = zoom_range(runs)
    if limits is not None:
        zoom.set_ylim(*limits)
    zoom.set(xlabel="step", title="last half, zoomed (training loss smoothed, EMA 0.3)")
    for ax in (full, zoom):
        ax.grid(alpha=0.3)
    _legend(fig, runs, colours, labels)
    fig.tight_layout(rect=(0, 0.025 + 0.04 * ((n_legend + 1) // 2), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def precision_map(run: RunData, path: Path) -> Path | None:
    """Format per (layer, GEMM) over the steps of the run, one colour per preset."""
    layers = plan_layers(run.plans)
    if not run.plans or not layers:
        return None
    last = max([run.plans[-1][0] + 1, *run.s("loss").steps, *run.s("val_loss").steps])
    edges = [step for step, _ in run.plans] + [last]
    cells = [[plan_formats(plan, layers)[(layer, g)] for _, plan in run.plans]
             for layer in layers for g in GEMMS]
    formats = sort_formats({f for row in cells for f in row})
    grid = np.array([[formats.index(f) for f in row] for row in cells], dtype=float)
    fig, ax = plt.subplots(figsize=(9, max(3.0, 0.11 * len(grid) + 1.8)))
    cmap = ListedColormap([format_colour(f) for f in formats])
    ax.pcolormesh(edges, np.arange(len(grid) + 1), grid, cmap=cmap, vmin=-0.5,
                  vmax=len(formats) - 0.5)
    _label_rows(ax, layers, len(GEMMS))
    for step, n in zip(run.s("plan_changes").steps, run.s("plan_changes").values, strict=True):
        if n > 0:
            ax.axvline(step, color="k", ls="--", lw=1)
            ax.text(step, -0.3, f" @{step}: {int(n)}", fontsize=7, va="bottom")
    ax.set_ylim(len(grid), -0.3 - 0.03 * len(grid))
    ax.set(xlabel="step  (dashed: a new plan, with the number of layer x GEMM cells changed)",
           title=f"precision map: {run.name}  (rows per layer: {', '.join(GEMMS)})")
    ax.legend(handles=[Patch(color=format_colour(f), label=f) for f in formats],
              loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, title="format")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _label_rows(ax, layers: list[str], per: int) -> None:
    """One label per projection (centred on its GEMM rows), a thicker line between blocks."""
    ax.set_yticks(np.arange(len(layers)) * per + per / 2)
    ax.set_yticklabels([_short(layer) for layer in layers], fontsize=7 if len(layers) < 60 else 5)
    block = None
    for i, layer in enumerate(layers):
        b = layer.split(".")[:2]
        ax.axhline(i * per, color="white", lw=2.0 if b != block else 0.4)
        block = b


def _short(layer: str) -> str:
    """``layers.3.attention.wq`` -> ``L3 attention.wq``."""
    parts = layer.split(".")
    if len(parts) > 2 and parts[0] == "layers" and parts[1].isdigit():
        return f"L{parts[1]} " + ".".join(parts[2:])
    return layer


def all_plots(runs: list[RunData], out: Path, *, groups: list[list[RunData]] | None = None,
              labels: dict[str, str] | None = None) -> list[Path]:
    """Every plot that has data, written to ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    colours = run_colours(groups or [[r] for r in runs])
    labels = labels or {}
    cpu = "measured on this machine: CPU emulation speed is not hardware speed"
    made = [
        loss_plot(runs, out / "loss.png", colours, labels, groups),
        _line_plot(runs, [("lr", "line")], "learning rate", "learning rate", out / "lr.png",
                   colours, labels),
        _line_plot(runs, [("fp4_flop_fraction", "line")], "FP4 FLOP fraction",
                   "share of GEMM FLOPs in FP4", out / "fp4_fraction.png", colours, labels),
        _line_plot(runs, [("tokens_per_s", "line")], "tokens / s", "training throughput",
                   out / "throughput.png", colours, labels, note=cpu),
        _line_plot(runs, [("writeback_frozen", "line"), ("writeback_never_moved", "markers")],
                   "fraction of managed weights", "write-back: frozen this step / never moved",
                   out / "writeback.png", colours, labels),
    ]
    for run in runs:
        suffix = "" if len(runs) == 1 else f"_{run.name}"
        made.append(precision_map(run, out / f"precision_map{suffix}.png"))
    return [p for p in made if p is not None]
