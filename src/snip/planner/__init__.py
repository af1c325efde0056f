"""Precision planning: sensitivity table + efficiency budget -> :class:`~snip.plan.PrecisionPlan`.

* :func:`solve` / :func:`solution` -- the ILP of SNIP (paper section 5) or a baseline held at
  exactly the ILP's FP4 fraction, under an FP4-FLOP fraction, a relative-GEMM-time budget, a
  memory cap and optional per-pipeline-stage targets; :class:`Solution` is the typed result.
* :class:`Budget`, :class:`Method` -- what to meet and how to choose.
* :func:`measure_damage`, :class:`Damage` -- measured single-unit damage for the ``oracle``.
* :class:`Controller` -- re-plans during training (statistics -> metrics -> ILP -> apply).
"""

from snip.planner.baselines import Method
from snip.planner.controller import Controller, Cycle
from snip.planner.oracle import Damage, measure_damage
from snip.planner.problem import DEFAULT_CANDIDATES, Budget, Problem, build_problem
from snip.planner.solve import Achieved, Solution, solution, solve

__all__ = ["DEFAULT_CANDIDATES", "Achieved", "Budget", "Controller", "Cycle", "Damage", "Method",
           "Problem", "Solution", "build_problem", "measure_damage", "solution", "solve"]
