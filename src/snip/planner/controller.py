"""``Controller``: SNIP's re-planning loop inside training (paper section 3, steps 1-6).

The trainer calls :meth:`Controller.on_step_end` after every optimizer step
(:class:`snip.train.PrecisionController` protocol).  The controller

1. does nothing during the high-precision warm-up (``warmup`` steps; start the run in
   ``bf16`` for a real warm-up) -- statistics of a random network say little;
2. at step ``warmup`` and every ``every`` steps after it runs one statistics cycle
   (:func:`snip.sensitivity.measure`: clean pass, backward noise pass, forward noise pass on
   ``micro_batches`` calibration batches, all unquantized, weights and optimizer untouched);
3. solves the ILP (:func:`snip.planner.solve`) for the budget;
4. returns the plan, which the trainer applies between steps and saves to
   ``plans/step_<N>.json``; the table goes to ``out_dir/step_<N>.json``.

Its cost is logged as a share of wall time (statistics + solve over everything since the
previous cycle) to ``out_dir/controller.jsonl`` and kept in :attr:`history`.  With the paper's
cadence (every ~100k steps) the share is negligible; for short runs pick ``every`` so that it
stays under ~5% (one cycle costs about ``3 x micro_batches`` training steps plus quantization).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from snip.errors import UserError
from snip.plan import PrecisionPlan
from snip.planner.baselines import Method
from snip.planner.problem import DEFAULT_CANDIDATES, Budget
from snip.planner.solve import solve
from snip.sensitivity.estimate import SensitivityConfig, measure

log = logging.getLogger("snip.planner")

BatchFn = Callable[[int], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Cycle:
    """Bookkeeping of one re-planning cycle."""

    step: int
    stats_seconds: float
    solve_seconds: float
    train_seconds: float
    fp4_flop_fraction: float
    objective: float

    @property
    def overhead_share(self) -> float:
        spent = self.stats_seconds + self.solve_seconds
        total = spent + self.train_seconds
        return spent / total if total > 0 else 0.0


@dataclass
class Controller:
    """Re-plans precision every ``every`` steps after ``warmup`` (module docstring)."""

    budget: Budget | float = 0.75
    every: int = 200
    out_dir: Path | str | None = None
    warmup: int | None = None  # None: same as ``every``
    method: Method | str = Method.ILP
    per_gemm: bool = False
    candidates: Sequence[str] = DEFAULT_CANDIDATES
    micro_batches: int = 2
    noise_scale: float = 0.05
    seed: int = 0
    plans_dir: Path | str | None = None
    history: list[Cycle] = field(default_factory=list)
    _last_time: float | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise UserError(f"precision.every={self.every!r} must be an integer >= 1 (re-plan "
                            f"every N steps)")
        if self.warmup is None:
            self.warmup = self.every
        if not isinstance(self.warmup, int) or self.warmup < 1:
            raise UserError(f"warmup={self.warmup!r} must be an integer >= 1 (plans need one "
                            f"optimizer step of AdamW state)")
        self.budget = Budget.of(self.budget)
        self.method = Method.parse(self.method)
        self.stats = SensitivityConfig(candidates=tuple(self.candidates),
                                       micro_batches=self.micro_batches,
                                       noise_scale=self.noise_scale, seed=self.seed)

    def due(self, step: int) -> bool:
        return step >= self.warmup and (step - self.warmup) % self.every == 0

    def on_step_end(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                    batch_fn: BatchFn) -> PrecisionPlan | None:
        now = time.perf_counter()
        train_seconds = now - self._last_time if self._last_time is not None else 0.0
        if not self.due(step):
            self._last_time = self._last_time if self._last_time is not None else now
            return None
        t0 = time.perf_counter()
        table = measure(model, batch_fn, optimizer=optimizer, config=self._config(step),
                        step=step)
        t1 = time.perf_counter()
        plan = solve(table, self.budget, method=self.method, per_gemm=self.per_gemm,
                     candidates=self.candidates, seed=self.seed + step)
        t2 = time.perf_counter()
        cycle = Cycle(step=step, stats_seconds=t1 - t0, solve_seconds=t2 - t1,
                      train_seconds=train_seconds,
                      fp4_flop_fraction=plan.meta["achieved"]["fp4_flop_fraction"],
                      objective=plan.meta["objective"])
        self.history.append(cycle)
        plan = plan.with_meta(overhead={"stats_seconds": cycle.stats_seconds,
                                        "solve_seconds": cycle.solve_seconds,
                                        "share": cycle.overhead_share})
        self._save(step, table, plan, cycle)
        log.info("step %d: re-planned (fp4 %.3f, stats %.2fs, solve %.3fs, overhead %.1f%%)",
                 step, cycle.fp4_flop_fraction, cycle.stats_seconds, cycle.solve_seconds,
                 100 * cycle.overhead_share)
        self._last_time = time.perf_counter()
        return plan

    def _config(self, step: int) -> SensitivityConfig:
        import dataclasses
        return dataclasses.replace(self.stats, seed=self.seed + step)

    def _save(self, step: int, table, plan: PrecisionPlan, cycle: Cycle) -> None:
        if self.out_dir is not None:
            out = Path(self.out_dir)
            out.mkdir(parents=True, exist_ok=True)
            table.to_json(out / f"step_{step}.json")
            with (out / "controller.jsonl").open("a") as f:
                f.write(json.dumps({"step": step, "stats_seconds": cycle.stats_seconds,
                                    "solve_seconds": cycle.solve_seconds,
                                    "train_seconds": cycle.train_seconds,
                                    "overhead_share": cycle.overhead_share,
                                    "fp4_flop_fraction": cycle.fp4_flop_fraction}) + "\n")
        if self.plans_dir is not None:
            Path(self.plans_dir).mkdir(parents=True, exist_ok=True)
            plan.to_json(Path(self.plans_dir) / f"step_{step}.json")

    @property
    def overhead_share(self) -> float:
        """Statistics + solve time over all wall time the controller has seen."""
        spent = sum(c.stats_seconds + c.solve_seconds for c in self.history)
        total = spent + sum(c.train_seconds for c in self.history)
        return spent / total if total > 0 else 0.0

    def state_dict(self) -> dict[str, Any]:
        return {"history": [c.__dict__ for c in self.history]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = [Cycle(**c) for c in state.get("history", [])]
