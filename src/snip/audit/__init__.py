"""Audit of low-precision weight write-back: invisible updates, traces, forecasts and masks.

* :mod:`snip.audit.events`: the exact event ``Q(q + d) == q``, its SR probability, rho.
* :mod:`snip.audit.trace`: fp32 reference traces (record, save, load) with the projected proxy.
* :mod:`snip.audit.forecast`: measured vs projected frozen fraction, first-majority crossing.
* :mod:`snip.audit.allocate`: exact-budget fp32-master tile masks and same-budget controls.
* :mod:`snip.audit.plot`: predicted vs measured frozen fraction per tensor type (PNG).

The audit reads what :mod:`snip.optim` records and builds masks that it consumes.
"""

from snip.audit.allocate import (
    budget,
    freeze_only_mask,
    layer_mask,
    mask_from_scores,
    matched_random_mask,
    random_mask,
    reference_mask,
)
from snip.audit.events import (
    RHO_STAR,
    freeze_probability,
    grid_gaps,
    invisible,
    invisible_probability,
    projected_frozen,
    rho,
    unit_roundoff,
)
from snip.audit.forecast import (
    ALL,
    by_type,
    compare_crossings,
    first_crossing,
    measured_series,
    tensor_types,
)
from snip.audit.plot import plot_frozen_by_type
from snip.audit.trace import ReferenceRecorder, ReferenceTrace

__all__ = [
    "ALL", "RHO_STAR", "ReferenceRecorder", "ReferenceTrace", "budget", "by_type",
    "compare_crossings", "first_crossing", "freeze_only_mask", "freeze_probability", "grid_gaps",
    "invisible", "invisible_probability", "layer_mask", "mask_from_scores", "matched_random_mask",
    "measured_series", "plot_frozen_by_type", "projected_frozen", "random_mask", "reference_mask",
    "rho", "tensor_types", "unit_roundoff",
]
