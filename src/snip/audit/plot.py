"""Predicted vs measured frozen-fraction curves, one panel per tensor type, as a PNG.

The forecast is read from a plot like this: for each tensor type (all layers' ``wq`` in one
numel-weighted curve, see :func:`snip.audit.forecast.by_type`) the *predicted* frozen fraction,
projected from the fp32 reference trace alone, is drawn dashed and the *measured* one, the exact
event of the low-precision run, solid, in the same colour.  A vertical tick marks each curve's
first-majority crossing (``F > 1/2``, :func:`snip.audit.forecast.first_crossing`) and the panel
title names both steps, so "forecast step 1065, measured 1060" is read off without a ruler.

matplotlib is imported lazily (Agg backend): importing :mod:`snip.audit` stays light.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from snip.audit.forecast import ALL, first_crossing

Curves = tuple[Sequence[int], Mapping[str, Sequence[float]]]  # (steps, {panel: frozen})


def _crossing(steps: Sequence[int], values: Sequence[float]) -> int | None:
    return first_crossing(steps, values) if len(steps) else None


def plot_frozen_by_type(predicted: Curves, measured: Curves | None, path: str | Path, *,
                        title: str, cols: int = 3) -> dict[str, tuple[int | None, int | None]]:
    """One panel per key of ``predicted[1]`` (the :data:`~snip.audit.forecast.ALL` panel first
    when present): predicted dashed, measured solid, first-majority crossings ticked; saved as
    the PNG ``path``.  Returns each panel's (predicted, measured) crossing step (None: never,
    or not measured)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps_p, pred = predicted
    keys = sorted(pred, key=lambda k: k != ALL)  # stable: ALL first, then the given order
    cols = min(cols, len(keys))
    rows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.5 * rows), squeeze=False,
                             sharex=True, sharey=True)
    crossings: dict[str, tuple[int | None, int | None]] = {}
    for ax, key in zip(axes.flat, keys, strict=False):
        tp = _crossing(steps_p, pred[key])
        tm = None
        ax.plot(steps_p, np.asarray(pred[key]), "--", color="C0", label="predicted (fp32 trace)")
        parts = [f"forecast {tp if tp is not None else 'never'}"]
        if measured is not None and key in measured[1]:
            steps_m, meas = measured
            tm = _crossing(steps_m, meas[key])
            ax.plot(steps_m, np.asarray(meas[key]), "-", color="C1", linewidth=1.2,
                    label="measured (exact event)")
            if tm is not None:
                ax.axvline(tm, color="C1", linewidth=0.8)
            parts.append(f"measured {tm if tm is not None else 'never'}")
        if tp is not None:
            ax.axvline(tp, color="C0", linewidth=0.8, linestyle="--")
        crossings[key] = (tp, tm)
        ax.axhline(0.5, color="grey", linewidth=0.5)
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"{key}\nmajority: {', '.join(parts)}", fontsize=8)
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
