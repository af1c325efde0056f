"""``Controller``: SNIP's re-planning loop inside training (paper section 3, steps 1-6).

The trainer calls :meth:`Controller.on_step_end` after every optimizer step
(:class:`snip.train.PrecisionController` protocol).  The controller

1. does nothing during the warm-up (``warmup`` steps; start the run in ``bf16`` for a real
   high-precision warm-up) -- statistics of a random network say little;
2. at step ``warmup`` and every ``every`` steps after it runs one statistics cycle
   (:func:`snip.sensitivity.measure`, unquantized, weights and optimizer untouched) on
   ``calib_batches`` *fresh* calibration batches: cycle ``k`` reads ``batch_fn(k * calib_batches
   + j)``, so no two cycles see the same data (the trainer's ``batch_fn`` is a deterministic
   function of its index, which keeps resumed runs identical);
3. folds the new table into an exponential moving average of the raw divergences
   (:func:`snip.sensitivity.blend`, weight ``ema_decay`` on the past), so one noisy table cannot
   flip the plan;
4. solves for the budget (:func:`snip.planner.solution`) and returns the plan, whose GEMMs run
   as ``gemm`` says (the run's execution mode, emulated or native, kept across plans); the
   trainer applies it between steps and saves it to ``plans/step_<N>.json``.  The averaged
   table goes to ``out_dir/step_<N>.json``, this cycle's own measurement to
   ``out_dir/step_<N>_cycle.json``.

**Cost.**  Each cycle is logged to ``out_dir/controller.jsonl`` and kept in :attr:`history`:
statistics and solve seconds, the share of wall time since the previous cycle, and
``cycle_step_equivalents`` -- statistics seconds over the seconds of one training step.  The
step time is the median interval between the trainer's recent ``on_step_end`` calls (real
training steps, whatever their precision), or ``step_seconds`` if the trainer sets it; before
any interval is known (a cycle at step 1) it is the cycle's own clean forward+backward scaled
to the full batch (``step_seconds_source`` says which).

**Oracle** (``method="oracle"``, :func:`oracle_damage`).  The same cycle also *measures* each
layer's damage -- the forward loss on the cycle's calibration batches (all their rows) with that
layer alone in the low candidate, minus the all-high loss, every ``QLinear`` step counter reset
before each evaluation so all of them round alike -- and solves the ILP's knapsack on it at
exactly the ILP's FP4 FLOPs (:func:`snip.planner.solve` with ``damage=``), as ``snip plan
--method oracle --damage`` does.  One evaluation per layer plus one; per layer only (a forward
loss cannot see a dgrad or wgrad format), two candidates only.  Saved as
``out_dir/step_<N>_damage.json``; its seconds count as statistics time.

**Any model.**  ``loss_fn(model, batch) -> loss`` (default
:func:`snip.sensitivity.loss.default_loss`: snip models and Hugging Face causal LMs).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from snip.errors import UserError
from snip.nn.specs import GemmImpl, as_gemm_impl
from snip.plan import PrecisionPlan
from snip.planner.baselines import Method
from snip.planner.oracle import Damage, measure_damage
from snip.planner.problem import DEFAULT_CANDIDATES, Budget
from snip.planner.solve import solution
from snip.sensitivity import (
    Normalization,
    Propagation,
    SensitivityConfig,
    SensitivityTable,
    Terms,
    blend,
    measure,
)
from snip.sensitivity.loss import BatchFn, LossFn, batch_to, default_loss

log = logging.getLogger("snip.planner")

_INTERVALS = 16  # recent step intervals kept for the median step time


@dataclass(frozen=True)
class Cycle:
    """Bookkeeping of one re-planning cycle."""

    step: int
    stats_seconds: float
    solve_seconds: float
    train_seconds: float
    fp4_flop_fraction: float
    objective: float
    step_seconds: float = float("nan")
    step_seconds_source: str = ""
    batch_offset: int = 0

    @property
    def overhead_share(self) -> float:
        spent = self.stats_seconds + self.solve_seconds
        total = spent + self.train_seconds
        return spent / total if total > 0 else 0.0

    @property
    def step_equivalents(self) -> float:
        """Statistics cost in training steps (``stats_seconds / step_seconds``)."""
        return self.stats_seconds / self.step_seconds if self.step_seconds > 0 else float("nan")


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
    calib_batches: int = 1
    calib_rows: int | None = 2         # sequences used from each calibration batch (None: all)
    ema_decay: float = 0.5
    normalization: Normalization | str = Normalization.NATS
    terms: Terms | str = Terms.BOTH
    propagation: Propagation | str = Propagation.JOINT
    noise_scale: float = 0.05
    step_tokens: int | None = None     # tokens per optimizer step (None: calibration batch's)
    loss_fn: LossFn | None = None
    seed: int = 0
    plan_seed: int | None = None  # seed of the random baseline's plan (None: ``seed``)
    top: int = 1  # random_top: SNIP's most sensitive units kept high
    plans_dir: Path | str | None = None
    gemm: GemmImpl | str = GemmImpl.EMULATED  # how the plans it returns run their GEMMs
    step_seconds: float | None = None  # set by a trainer that measures its own step time
    history: list[Cycle] = field(default_factory=list)
    ema: SensitivityTable | None = field(default=None, repr=False)
    _last_time: float | None = field(default=None, repr=False)
    _prev_call: float = field(default=0.0, repr=False)
    _since_cycle: bool = field(default=False, repr=False)
    _intervals: deque = field(default_factory=lambda: deque(maxlen=_INTERVALS), repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise UserError(f"every={self.every!r} must be an integer >= 1 (re-plan every N "
                            f"steps)")
        if self.warmup is None:
            self.warmup = self.every
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 1:
            raise UserError(f"warmup={self.warmup!r} must be an integer >= 1 (plans "
                             f"need one optimizer step of AdamW state)")
        if not 0 <= self.ema_decay < 1:
            raise UserError(f"ema_decay={self.ema_decay!r} must be in [0, 1) (0: no averaging "
                             f"across cycles)")
        self.budget = Budget.of(self.budget)
        self.method = Method.parse(self.method)
        self.gemm = as_gemm_impl(self.gemm)
        self.stats = SensitivityConfig(
            candidates=tuple(self.candidates), calib_batches=self.calib_batches,
            calib_rows=self.calib_rows, noise_scale=self.noise_scale,
            normalization=self.normalization, terms=self.terms,
            propagation=self.propagation, step_tokens=self.step_tokens, seed=self.seed)
        self._check_oracle()

    def due(self, step: int) -> bool:
        return step >= self.warmup and (step - self.warmup) % self.every == 0

    def on_step_end(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                    batch_fn: BatchFn) -> PrecisionPlan | None:
        now = time.perf_counter()
        if self._last_time is not None and not self._since_cycle:
            self._intervals.append(now - self._prev_call)
        self._prev_call, self._since_cycle = now, False
        if self._last_time is None:
            self._last_time = now
        if not self.due(step):
            return None
        train_seconds = now - self._last_time
        offset = len(self.history) * self.calib_batches
        t0 = time.perf_counter()
        table = measure(model, batch_fn, optimizer=optimizer, config=self._config(step),
                        step=step, batch_offset=offset, loss_fn=self.loss_fn)
        damage = self._oracle_cycle(step, model, batch_fn, table, offset)
        t1 = time.perf_counter()
        self.ema = blend(self.ema, table, self.ema_decay)
        solved = solution(self.ema, self.budget, method=self.method, per_gemm=self.per_gemm,
                          candidates=self.candidates, damage=damage, top=self.top,
                          seed=self.seed if self.plan_seed is None else self.plan_seed)
        t2 = time.perf_counter()
        step_s, source = self._step_time(table)
        cycle = Cycle(step=step, stats_seconds=t1 - t0, solve_seconds=t2 - t1,
                      train_seconds=train_seconds,
                      fp4_flop_fraction=solved.achieved.fp4_flop_fraction,
                      objective=solved.objective, step_seconds=step_s,
                      step_seconds_source=source, batch_offset=offset)
        self.history.append(cycle)
        plan = dataclasses.replace(solved.plan, gemm=self.gemm).with_meta(overhead={
            "stats_seconds": cycle.stats_seconds, "solve_seconds": cycle.solve_seconds,
            "share": cycle.overhead_share, "cycle_step_equivalents": cycle.step_equivalents})
        self._save(step, table, plan, cycle)
        log.info("step %d: re-planned (fp4 %.3f, stats %.2fs = %.1f steps, solve %.3fs, "
                 "overhead %.1f%%)", step, cycle.fp4_flop_fraction, cycle.stats_seconds,
                 cycle.step_equivalents, cycle.solve_seconds, 100 * cycle.overhead_share)
        self._last_time = self._prev_call = time.perf_counter()
        self._since_cycle = True  # the next interval includes applying the plan: skip it
        return plan

    # -- the oracle arm (method="oracle"; module docstring) --------------------------------------

    def _check_oracle(self) -> None:
        if self.method is not Method.ORACLE:
            return
        if self.per_gemm:
            raise UserError("precision.method=oracle measures the forward loss, which cannot "
                            "see dgrad/wgrad formats; plan per layer (precision.per_gemm=false)")
        if len(self.candidates) != 2:
            raise UserError(f"precision.method=oracle needs exactly two candidates (high, low), "
                            f"got {len(self.candidates)}: {', '.join(self.candidates)}")

    def _oracle_cycle(self, step: int, model: nn.Module, batch_fn: BatchFn,
                      table: SensitivityTable, offset: int) -> Damage | None:
        """This cycle's measured damage (None unless the method is the oracle)."""
        if self.method is not Method.ORACLE:
            return None
        high, low = self.candidates
        damage = oracle_damage(model, batch_fn, table.names, high=high, low=low,
                               batch_offset=offset, batches=self.calib_batches,
                               loss_fn=self.loss_fn)
        if self.out_dir is not None:
            out = Path(self.out_dir)
            out.mkdir(parents=True, exist_ok=True)
            (out / f"step_{step}_damage.json").write_text(
                json.dumps(damage.to_dict(), indent=1) + "\n")
        return damage

    def _step_time(self, table: SensitivityTable) -> tuple[float, str]:
        if self.step_seconds is not None:
            return float(self.step_seconds), "trainer"
        if self._intervals:
            return statistics.median(self._intervals), "median_interval"
        scale = table.meta["calib_batch_tokens"] / table.tokens
        return float(table.meta["clean_pass_seconds"]) * scale, "clean_pass"

    def _config(self, step: int) -> SensitivityConfig:
        return dataclasses.replace(self.stats, seed=self.seed + step)

    def _save(self, step: int, table: SensitivityTable, plan: PrecisionPlan,
              cycle: Cycle) -> None:
        if self.out_dir is not None:
            out = Path(self.out_dir)
            out.mkdir(parents=True, exist_ok=True)
            assert self.ema is not None
            self.ema.to_json(out / f"step_{step}.json")
            table.to_json(out / f"step_{step}_cycle.json")
            with (out / "controller.jsonl").open("a") as f:
                f.write(json.dumps({
                    "step": step, "stats_seconds": cycle.stats_seconds,
                    "solve_seconds": cycle.solve_seconds, "train_seconds": cycle.train_seconds,
                    "overhead_share": cycle.overhead_share,
                    "step_seconds": cycle.step_seconds,
                    "step_seconds_source": cycle.step_seconds_source,
                    "cycle_step_equivalents": cycle.step_equivalents,
                    "batch_offset": cycle.batch_offset,
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
        """Cycle history and the averaged table: enough to re-plan identically on resume."""
        return {"history": [dataclasses.asdict(c) for c in self.history],
                "ema": None if self.ema is None else self.ema.to_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = [Cycle(**c) for c in state.get("history", [])]
        ema = state.get("ema")
        self.ema = None if ema is None else SensitivityTable.from_dict(ema)


def oracle_damage(model: nn.Module, batch_fn: BatchFn, layers: Sequence[str], *, high: str,
                  low: str, batch_offset: int = 0, batches: int = 1,
                  loss_fn: LossFn | None = None) -> Damage:
    """Measured single-layer damage of a converted model (:func:`snip.planner.measure_damage`).

    The loss is the mean forward loss (no gradients, eval mode) over ``batch_fn(batch_offset +
    i)``, ``i < batches``, with every row; before each evaluation every ``QLinear`` step counter
    is reset, so stochastic rounding (if any) draws the same numbers in every evaluation and
    the result is a deterministic function of the model and the batches.  Formats, step
    counters and the train/eval mode are restored afterwards.
    """
    from snip.nn import qlinear_layers

    converted = dict(qlinear_layers(model))
    missing = [n for n in layers if n not in converted]
    if missing:
        raise UserError(f"the oracle switches layers to {low}: {missing[0]!r} is not a "
                        "converted (QLinear) layer; snip.convert the model first")
    if batches < 1:
        raise UserError(f"the oracle needs at least one calibration batch, got {batches}")
    device = next(model.parameters()).device
    data = [batch_to(batch_fn(batch_offset + i), device) for i in range(batches)]
    loss = loss_fn or default_loss
    saved = {n: (m.specs, m.step) for n, m in converted.items()}
    training = model.training

    def loss_of(plan: PrecisionPlan) -> float:
        for n, m in converted.items():
            m.step = saved[n][1]
        plan.apply(model)
        with torch.no_grad():
            return sum(float(loss(model, b)) for b in data) / len(data)

    model.eval()
    try:
        return measure_damage(layers, loss_of, high=high, low=low, per_gemm=False)
    finally:
        model.train(training)
        for n, m in converted.items():
            m.specs, m.step = saved[n]
