"""`SnipCallback`: SNIP's adaptive precision inside a `transformers.Trainer`.

    import snip
    from snip.integrations.hf import SnipCallback
    from snip.planner import Controller

    snip.convert(model, "fp8_e4m3_tile128")          # QLinear layers, plans apply to them
    controller = Controller(budget=0.75, every=50, warmup=10)
    callback = SnipCallback(controller, batch_fn=lambda k: calib[k % len(calib)])
    Trainer(model=model, args=args, train_dataset=ds, callbacks=[callback]).train()

After every optimizer step the callback hands the step to the controller
(`snip.planner.Controller.on_step_end`); on the controller's schedule (``warmup``, then every
``every`` steps) it measures sensitivities on ``batch_fn(k)`` (a batch of ``input_ids`` /
``labels``, or a mapping the model accepts), solves the plan and the callback applies it to the
model between steps.  Each new plan is logged (``snip_fp4_flop_fraction`` and ``snip_plans`` in
the Trainer's logs, and one line on the ``snip.integrations.hf`` logger).

Checkpoints: on every Trainer save the controller's state (`Controller.state_dict`: cycle history
and averaged sensitivity table) and the plan in force go into the checkpoint folder
(``snip_controller.pt``, ``snip_plan.json``); when the Trainer resumes from ``checkpoint-N``
the callback restores both before the first step, so the resumed run plans exactly as the
uninterrupted one would.  Needs ``pip install transformers accelerate`` (what ``Trainer``
itself needs).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from snip.models.hf import _transformers
from snip.plan import PrecisionPlan
from snip.plan.cost import fp4_flop_fraction
from snip.planner import Controller

log = logging.getLogger("snip.integrations.hf")
STATE_FILE, PLAN_FILE = "snip_controller.pt", "snip_plan.json"

TrainerCallback = _transformers().TrainerCallback


class SnipCallback(TrainerCallback):
    """Re-plans precision on the controller's schedule (module docstring)."""

    def __init__(self, controller: Controller, batch_fn: Callable[[int], Any]) -> None:
        self.controller, self.batch_fn = controller, batch_fn
        self.plan: PrecisionPlan | None = None  # the plan in force (None: the converted one)
        self.plans: dict[int, PrecisionPlan] = {}  # step -> plan made there (this process)
        self.fp4_flop_fraction: float | None = None

    # -- Trainer events --------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, model: nn.Module | None = None,  # noqa: ANN001
                       **kwargs: Any) -> None:
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.global_step > 0 and model is not None and (folder / STATE_FILE).is_file():
            self.restore(folder, model)  # resumed from that checkpoint

    def on_step_end(self, args, state, control, model: nn.Module | None = None,  # noqa: ANN001
                    optimizer: torch.optim.Optimizer | None = None, **kwargs: Any) -> None:
        plan = self.controller.on_step_end(state.global_step, model, optimizer, self.batch_fn)
        if plan is None:
            return
        plan.apply(model)
        self.plan, self.plans[state.global_step] = plan, plan
        self.fp4_flop_fraction = float(fp4_flop_fraction(plan, model))
        log.info("step %d: new precision plan, FP4 share of linear FLOPs %.3f",
                 state.global_step, self.fp4_flop_fraction)

    def on_log(self, args, state, control, logs: dict | None = None,  # noqa: ANN001
               **kwargs: Any) -> None:
        if logs is not None and self.fp4_flop_fraction is not None:
            logs["snip_fp4_flop_fraction"] = self.fp4_flop_fraction
            logs["snip_plans"] = len(self.controller.history)

    def on_save(self, args, state, control, **kwargs: Any) -> None:  # noqa: ANN001
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if folder.is_dir():
            self.save(folder)

    # -- the state that travels with a checkpoint ------------------------------------------------

    def save(self, folder: str | Path) -> None:
        """The controller state and the plan in force, into ``folder``."""
        folder = Path(folder)
        torch.save(self.controller.state_dict(), folder / STATE_FILE)
        if self.plan is not None:
            (folder / PLAN_FILE).write_text(json.dumps(self.plan.to_dict(), indent=1) + "\n")

    def restore(self, folder: str | Path, model: nn.Module) -> None:
        """Back to what `save` wrote: the controller's state, and the plan applied to
        ``model``."""
        folder = Path(folder)
        self.controller.load_state_dict(torch.load(folder / STATE_FILE, weights_only=False))
        if (folder / PLAN_FILE).is_file():
            self.plan = PrecisionPlan.from_dict(json.loads((folder / PLAN_FILE).read_text()))
            self.plan.apply(model)
            self.fp4_flop_fraction = float(fp4_flop_fraction(self.plan, model))
