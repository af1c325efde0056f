"""Precision planning: sensitivity table + efficiency budget -> :class:`~snip.plan.PrecisionPlan`.

* :func:`solve` -- the ILP of SNIP (paper section 5) or a baseline, at an FP4-FLOP fraction,
  a relative-GEMM-time budget, a memory cap and optional per-pipeline-stage targets.
* :class:`Budget`, :class:`Method` -- what to meet and how to choose.
* :class:`Controller` -- re-plans during training (statistics -> metrics -> ILP -> apply).
"""

from snip.planner.baselines import Method
from snip.planner.controller import Controller, Cycle
from snip.planner.problem import DEFAULT_CANDIDATES, Budget, Problem, build_problem
from snip.planner.solve import solve

__all__ = ["DEFAULT_CANDIDATES", "Budget", "Controller", "Cycle", "Method", "Problem",
           "build_problem", "solve"]
