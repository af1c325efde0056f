"""Predicted vs measured frozen-fraction curves, one panel per tensor type, as a PNG.

The forecast is read from a plot like this: for each tensor type (all layers' ``wq`` in one
numel-weighted curve, see :func:`snip.audit.forecast.by_type`) the *predicted* frozen fraction,
projected from the fp32 reference trace alone, is drawn dashed and the *measured* one, the exact
event of the low-precision run, solid.  The panel title names both curves' first-majority
crossing (``F > 1/2`` first, :func:`snip.audit.forecast.first_crossing`) and their permanent one
(``F > 1/2`` from then on), so "forecast 1065, measured 1060" is read off without a ruler; the
vertical ticks mark the permanent crossings (a warm-up transient above 1/2 makes the first
crossing step 5 for several tensors, while the lasting majority comes hundreds of steps later).

matplotlib is imported lazily (Agg backend): importing :mod:`snip.audit` stays light.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from snip.audit.forecast import ALL, first_crossing

Curves = tuple[Sequence[int], Mapping[str, Sequence[float]]]  # (steps, {panel: frozen})


Crossings = dict[str, tuple[int | None, int | None]]  # "first"/"permanent" -> (pred, meas)


def _crossing(steps: Sequence[int], values: Sequence[float], permanent: bool) -> int | None:
    return first_crossing(steps, values, permanent=permanent) if len(steps) else None


def _step(t: int | None) -> str:
    return "never" if t is None else str(t)


def plot_frozen_by_type(predicted: Curves, measured: Curves | None, path: str | Path, *,
                        title: str, cols: int = 3) -> dict[str, Crossings]:
    """One panel per key of ``predicted[1]`` (the :data:`~snip.audit.forecast.ALL` panel first
    when present): predicted dashed, measured solid, crossings named and ticked; saved as the
    PNG ``path``.  Returns each panel's ``{"first": (predicted, measured), "permanent": (...)}``
    crossing steps (None: never, or not measured)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps_p, pred = predicted
    keys = sorted(pred, key=lambda k: k != ALL)  # stable: ALL first, then the given order
    cols = min(cols, len(keys))
    rows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.8 * rows), squeeze=False,
                             sharex=True, sharey=True)
    crossings: dict[str, Crossings] = {}
    for ax, key in zip(axes.flat, keys, strict=False):
        ax.plot(steps_p, np.asarray(pred[key]), "--", color="C0", label="predicted (fp32 trace)",
                zorder=3)
        c = {kind: (_crossing(steps_p, pred[key], kind == "permanent"), None)
             for kind in ("first", "permanent")}
        if measured is not None and key in measured[1]:
            steps_m, meas = measured
            ax.plot(steps_m, np.asarray(meas[key]), "-", color="C1", linewidth=1.0,
                    label="measured (exact event)")
            c = {kind: (tp, _crossing(steps_m, meas[key], kind == "permanent"))
                 for kind, (tp, _) in c.items()}
            if c["permanent"][1] is not None:
                ax.axvline(c["permanent"][1], color="C1", linewidth=0.8)
        if c["permanent"][0] is not None:
            ax.axvline(c["permanent"][0], color="C0", linewidth=0.8, linestyle="--")
        crossings[key] = c
        (fp, fm), (pp, pm) = c["first"], c["permanent"]
        meas_txt = measured is not None and key in measured[1]
        ax.set_title(f"{key}\nmajority first: forecast {_step(fp)}"
                     + (f", measured {_step(fm)}" if meas_txt else "")
                     + f"\nfor good: forecast {_step(pp)}"
                     + (f", measured {_step(pm)}" if meas_txt else ""), fontsize=8)
        ax.axhline(0.5, color="grey", linewidth=0.5)
        ax.set_ylim(-0.02, 1.02)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("step", fontsize=8)
    axes.flat[0].set_ylabel("frozen fraction", fontsize=8)
    axes.flat[0].legend(fontsize=6, loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(Path(path), dpi=80)
    plt.close(fig)
    return crossings
