"""The trainer's glue to the safe weight write-back of :mod:`snip.optim` (``--writeback.*``).

With ``writeback.policy`` other than ``none`` the run's AdamW is wrapped in a
:class:`~snip.optim.WritebackOptimizer` right after it is created: the eligible weights (2-D
linear weights, not the embedding or a head tied to it) are written onto the
``writeback.format`` grid, and every optimizer step goes through the wrapper, which writes the
AdamW result back with the chosen policy.  The loop keeps setting the learning rate on the
*inner* AdamW (the wrapper shares its ``param_groups``), and the precision controller also sees
the inner optimizer.

Checkpoints: the inner AdamW state stays in ``optimizer.pt``; the rest of ``wb.state_dict()``
(masters, the stochastic-rounding generator, step and never-moved counters) goes to
``writeback.pt``, so a resumed run continues bit for bit.

Metrics: on log steps only, the wrapper records its audit of that step (one reduction per
managed tensor), summarised here as two numbers for ``metrics.jsonl``:

* ``writeback_frozen``: share of the managed coordinates whose stored value did not change in
  this step (the invisible-update event ``Q(q + d) == q``), numel-weighted;
* ``writeback_never_moved``: share that never changed since the wrapper was built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from snip.errors import UserError
from snip.optim import StepRecord, WritebackOptimizer
from snip.train import config as C


@dataclass
class Writeback:
    """A run's write-back wrapper and the summary of its last recorded step."""

    wb: WritebackOptimizer
    policy: str
    last: dict[str, float] = field(default_factory=dict)
    keep_history: bool = False  # keep every record in ``wb.history`` (`snip audit` reads it)

    def step(self, record: bool) -> None:
        """One optimizer step through the wrapper; ``record``: keep the audit of this step."""
        self.wb.record_every = 1 if record else 0  # recording costs syncs: log steps only
        self.wb.step()
        if record:  # without keep_history nothing is kept: the history stays empty
            rec = self.wb.history[-1] if self.keep_history else self.wb.history.pop()
            self.last = summarize(rec)

    def metrics(self) -> dict[str, float]:
        """The last recorded summary (once; empty when this step was not recorded)."""
        out, self.last = self.last, {}
        return out

    def state_dict(self) -> dict[str, Any]:
        """The write-back part of ``wb.state_dict()`` (the inner AdamW is saved on its own)."""
        return self.wb.state_dict()["writeback"]

    def load_state_dict(self, state: dict[str, Any], optimizer_state: dict[str, Any]) -> None:
        self.wb.load_state_dict({"optimizer": optimizer_state, "writeback": state})


def summarize(record: StepRecord) -> dict[str, float]:
    """Numel-weighted frozen and never-moved fractions of one ``wb.history`` record."""
    tensors = record.tensors.values()
    total = sum(t.numel for t in tensors)
    return {"writeback_frozen": sum(t.frozen * t.numel for t in tensors) / total,
            "writeback_never_moved": sum(t.never_moved * t.numel for t in tensors) / total}


def attach(section: C.WritebackSection, model: nn.Module, optimizer: torch.optim.Optimizer,
           seed: int) -> Writeback | None:
    """Wrap ``optimizer`` as ``section`` says (None for policy 'none').

    Writes the eligible weights onto the grid; loads the mask and rejects one made for another
    model or tile size (``ValueError``).  Every rank uses the same seed, so stochastic rounding
    keeps the ranks' weights identical."""
    if section.policy is C.WritebackPolicy.NONE:
        return None
    cfg = section.to_config(seed=seed, record_every=0)
    return Writeback(wb=cfg.build(model, optimizer), policy=section.policy.value)


def restore(writeback: Writeback | None, optimizer: torch.optim.Optimizer,
            ckpt_optimizer: dict[str, Any], ckpt_writeback: dict[str, Any] | None,
            where: object, fresh_wrapper: bool = False) -> None:
    """Load the inner optimizer state and, with write-back, the wrapper's state.

    ``fresh_wrapper`` (a branch with other write-back settings): load only the inner optimizer
    state; the wrapper starts anew from the checkpoint's weights. Otherwise a checkpoint and a
    config that disagree on whether write-back is on are rejected: continuing would silently
    drop masters, or start them from the stored (rounded) weights."""
    if fresh_wrapper:
        optimizer.load_state_dict(ckpt_optimizer)
        return
    if writeback is None:
        if ckpt_writeback is not None:
            raise UserError(f"cannot resume {where}: it was trained with --writeback.policy "
                            f"{ckpt_writeback.get('policy')!r}; resume with that policy")
        optimizer.load_state_dict(ckpt_optimizer)
        return
    if ckpt_writeback is None:
        raise UserError(f"cannot resume {where} with --writeback.policy {writeback.policy!r}: "
                        "it was trained without write-back (policy 'none')")
    writeback.load_state_dict(ckpt_writeback, ckpt_optimizer)
