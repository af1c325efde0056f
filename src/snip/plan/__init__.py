"""Precision plans and the cost model.

* :class:`PrecisionPlan` -- per-layer, per-GEMM formats (exact names or ``re:`` regexes over a
  default), the versioned JSON file format, resolution against a model, ``apply``, ``diff``.
* :mod:`snip.plan.cost` -- FLOPs per GEMM from module shapes (meta-device friendly), the
  FP4-FLOP fraction SNIP budgets, relative GEMM time under a throughput profile, memory.
* :mod:`snip.plan.profiles` -- named hardware throughput tables (hopper, blackwell, ...).
"""

from snip.plan.cost import (
    LayerMemory,
    MemoryEstimate,
    fp4_flop_fraction,
    gemm_flops,
    is_head,
    layer_flops,
    linear_layers,
    memory,
    relative_gemm_time,
    total_flops,
)
from snip.plan.plan import PLAN_VERSION, PlanChange, PrecisionPlan, diff
from snip.plan.profiles import PROFILES, ThroughputProfile, get_profile

__all__ = [
    "PLAN_VERSION", "PROFILES", "LayerMemory", "MemoryEstimate", "PlanChange", "PrecisionPlan",
    "ThroughputProfile", "diff", "fp4_flop_fraction", "gemm_flops", "get_profile", "is_head",
    "layer_flops", "linear_layers", "memory", "relative_gemm_time", "total_flops",
]
