"""Where the trainer's precision comes from: a fixed plan, or a controller that re-plans.

* ``precision.mode = "fixed"``: one `PrecisionPlan` for the whole run, from ``precision.preset``
  (every GEMM of every linear layer in that preset) or ``precision.plan`` (a plan JSON file).
* ``precision.mode = "adaptive"``: the plan above is the starting point and a
  `PrecisionController` (SNIP's is ``snip.planner.Controller``) may return a new plan at the end
  of any step; the trainer applies it between steps with ``plan.apply(model)`` and saves it to
  ``plans/step_<N>.json``.

The controller is a protocol so that baselines and experiments can plug in their own; its state
travels in checkpoints so that adaptive runs resume exactly too.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from snip.nn.specs import GemmImpl
from snip.plan import PrecisionPlan, fp4_flop_fraction
from snip.sensitivity.loss import BatchFn
from snip.train.config import PrecisionMode, PrecisionSection


@runtime_checkable
class PrecisionController(Protocol):
    """Re-plans precision during training.

    ``on_step_end`` is called on every rank after optimizer step ``step`` (steps completed) with
    the model, the optimizer and ``batch_fn(i)``, which returns the i-th (tokens, targets)
    calibration micro-batch of this rank (a deterministic function of ``i``, drawn from the
    training split). It returns a new plan to apply now, or None. Every rank must return the
    same plan, and a complete one: the trainer applies it as it is, so its ``gemm`` (emulated or
    native) is the run's. Files it writes go under ``out_dir`` (``runs/NAME/sensitivity/``).

    ``due(step)`` says whether that call will measure and re-plan (the trainer gathers FSDP's
    whole weights only then, and warns when no call of a run is due); ``step_seconds`` is set
    by the trainer, before each call, to its median step time (the controller's cost log).
    """

    step_seconds: float | None

    def due(self, step: int) -> bool: ...

    def on_step_end(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                    batch_fn: BatchFn) -> PrecisionPlan | None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def initial_plan(cfg: PrecisionSection) -> PrecisionPlan:
    """The plan a run starts with: the plan file if given, else the preset; ``precision.gemm =
    "native"`` overrides the file's ``gemm`` key (the file's key stands otherwise)."""
    plan = PrecisionPlan.from_json(cfg.plan) if cfg.plan else PrecisionPlan.uniform(cfg.preset)
    return replace(plan, gemm=cfg.gemm) if cfg.gemm is not GemmImpl.EMULATED else plan


def make_controller(cfg: PrecisionSection, out_dir: Path, is_main: bool, seed: int = 0,
                    start: int = 0, step_tokens: int | None = None,
                    gemm: GemmImpl = GemmImpl.EMULATED) -> PrecisionController | None:
    """The adaptive controller, or None for fixed precision.

    ``start``: the step a branch (``--init-from``) starts at; its warm-up counts from there and
    defaults to 0 (the parent is warmed up: plan at once). A fresh run's defaults to
    ``precision.every``. ``step_tokens``: tokens per optimizer step (all micro-batches and
    ranks), the scale of the weight divergence of one update. ``gemm``: how the run's GEMMs
    run (its starting plan's), which every plan the controller returns keeps."""
    if cfg.mode is not PrecisionMode.ADAPTIVE:
        return None
    from snip.planner import DEFAULT_CANDIDATES, Controller  # here: the planner pulls in scipy

    warmup = cfg.warmup if cfg.warmup >= 0 else (0 if start > 0 else cfg.every)
    return Controller(budget=cfg.budget, every=cfg.every, out_dir=out_dir if is_main else None,
                      seed=seed, plan_seed=cfg.plan_seed, warmup=max(1, start + warmup),
                      method=cfg.method,
                      per_gemm=cfg.per_gemm, candidates=cfg.candidates or DEFAULT_CANDIDATES,
                      calib_batches=cfg.calib_batches, calib_rows=cfg.calib_rows or None,
                      ema_decay=cfg.ema_decay, terms=cfg.terms, step_tokens=step_tokens,
                      top=cfg.keep_top, normalization=cfg.normalization, gemm=gemm)


def explicit(plan: PrecisionPlan, model: nn.Module, step: int) -> PrecisionPlan:
    """``plan`` with every layer written out by name (what the run saves to plans/), so the
    report can draw the precision map without rebuilding the model."""
    table = plan.resolve(model)
    meta = {**plan.meta, "step": step, "fp4_flop_fraction": fp4_flop_fraction(table, model)}
    return replace(PrecisionPlan.from_table(table, default=plan.default, meta=meta),
                   gemm=plan.gemm)
