"""Frozen-fraction time series and the first-majority-crossing forecast.

The *measured* series comes from a low-precision run
(:attr:`snip.optim.WritebackOptimizer.history`: the exact event ``Q(q + d) == q`` on the stored
codes); the *projected* series from an fp32 reference trace alone (proxy (P-a),
:class:`snip.audit.trace.ReferenceTrace`).  The forecast compares their first-majority crossings

    t* = min{ t : F(t) > threshold }      (threshold 1/2: a majority of coordinates frozen)

optionally requiring permanence (``F(t') > threshold`` for every later recorded ``t'``).  If the
series starts above the threshold, ``t*`` is the first recorded step ("frozen at init").
:func:`by_type` folds per-tensor curves into one numel-weighted curve per tensor type (all
layers' ``wq`` together), which is what the plots show.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from snip.optim.writeback import StepRecord


def first_crossing(steps: Sequence[int], frozen: Sequence[float], threshold: float = 0.5,
                   permanent: bool = False) -> int | None:
    """First recorded step with ``frozen > threshold`` (``None`` if never)."""
    f = np.asarray(frozen, dtype=np.float64)
    above = f > threshold
    if permanent:
        above = np.flip(np.logical_and.accumulate(np.flip(above)))
    hits = np.flatnonzero(above)
    return int(np.asarray(steps)[hits[0]]) if hits.size else None


def measured_series(history: Sequence[StepRecord], name: str | None = None,
                    key: str = "frozen") -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of one tensor's ``key`` field (of its `TensorRecord`), or the
    numel-weighted mean over tensors."""
    steps = np.array([h.step for h in history], dtype=np.int64)
    if name is not None:
        return steps, np.array([getattr(h.tensors[name], key) for h in history])
    vals = []
    for h in history:
        t = h.tensors.values()
        n = sum(r.numel for r in t)
        vals.append(sum(getattr(r, key) * r.numel for r in t) / max(n, 1))
    return steps, np.array(vals)


def compare_crossings(steps_proj: Sequence[int], proj: Sequence[float],
                      steps_meas: Sequence[int], meas: Sequence[float],
                      threshold: float = 0.5, permanent: bool = False) -> dict:
    """Predicted vs measured first-majority crossing, plus the mean |F_proj - F_meas|."""
    tp = first_crossing(steps_proj, proj, threshold, permanent)
    tm = first_crossing(steps_meas, meas, threshold, permanent)
    common, ip, im = np.intersect1d(np.asarray(steps_proj), np.asarray(steps_meas),
                                    return_indices=True)
    gap = (float(np.mean(np.abs(np.asarray(proj)[ip] - np.asarray(meas)[im])))
           if common.size else None)
    return {"predicted": tp, "measured": tm,
            "error_steps": None if tp is None or tm is None else tp - tm,
            "ratio": None if not tp or not tm else tp / tm, "mean_abs_gap": gap,
            "threshold": threshold, "permanent": permanent}


ALL = "all eligible weights"


def tensor_types(names: Sequence[str]) -> dict[str, list[str]]:
    """Tensor names grouped by type, the last name component: ``layers.0.attention.wq.weight``
    -> ``wq`` (all layers' ``wq`` together), ``output.weight`` -> ``output``; in first-seen
    order."""
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(n.removesuffix(".weight").rsplit(".", 1)[-1], []).append(n)
    return groups


def by_type(curves: Mapping[str, Sequence[float]], numel: Mapping[str, int]) -> dict[str,
                                                                                   np.ndarray]:
    """Numel-weighted frozen-fraction curve of all tensors (key :data:`ALL`) and of each tensor
    type (:func:`tensor_types`), from one curve per tensor (all of the same length)."""
    groups = {ALL: list(curves), **tensor_types(list(curves))}
    return {k: np.average(np.stack([np.asarray(curves[n], dtype=np.float64) for n in names]),
                          axis=0, weights=[numel[n] for n in names])
            for k, names in groups.items()}
