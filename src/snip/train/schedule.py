"""The learning-rate schedule, continuous across resumes and branches that change the length.

A schedule is a linear warm-up to ``lr`` over ``warmup_steps`` followed by a decay shaped by
``train.schedule`` as a function of the *progress* ``p`` in [0, 1] through the decay phase::

    cosine     floor + (1 - floor) * (1 + cos(pi p)) / 2
    linear     floor + (1 - floor) * (1 - p)
    constant   1
    wsd        1 until p = 0.8 (warm-up, stable), then linear to floor (decay): WSD
               of MiniCPM / "scaling laws and compute-optimal training beyond fixed durations"

(times ``lr``; ``floor = min_lr_ratio``).  Without an anchor, ``p = (step - warmup) / (steps -
warmup)``.

Continuing a run for a different number of steps (``--resume`` with a larger ``train.steps``, or a
branch by ``--init-from`` that trains N more steps) would make the learning rate jump: the
original schedule at the resume step and a fresh one of the new length disagree.  An *anchor*
``(step a, progress p_a)`` fixes that: from ``a`` on, progress runs linearly from ``p_a`` to 1 at
the new end, so the learning rate at ``a`` is exactly what it was and decays smoothly to the
floor at the new last step.  The anchor travels in checkpoints (``meta["schedule"]``).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

WSD_DECAY_START = 0.8  # share of the decay phase spent stable under "wsd"


class Shape(enum.Enum):
    COSINE = "cosine"
    LINEAR = "linear"
    CONSTANT = "constant"
    WSD = "wsd"


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """``lr(step)`` for a run of ``steps`` optimizer steps (see the module docstring)."""

    lr: float
    steps: int
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    shape: Shape = Shape.COSINE
    anchor_step: int = 0
    anchor_progress: float = 0.0

    def progress(self, step: int) -> float:
        """Progress through the decay phase at ``step`` (0 during warm-up, 1 at the end)."""
        if self.anchor_step == 0:
            start, p0 = self.warmup_steps, 0.0
        else:
            start, p0 = self.anchor_step, self.anchor_progress
        ratio = (step - start) / max(1, self.steps - start)
        return min(1.0, max(0.0, p0 + (1.0 - p0) * ratio))

    def factor(self, p: float) -> float:
        """The decay multiplier of ``lr`` at progress ``p``."""
        floor = self.min_lr_ratio
        if self.shape is Shape.COSINE:
            coeff = 0.5 * (1.0 + math.cos(math.pi * p))
        elif self.shape is Shape.LINEAR:
            coeff = 1.0 - p
        elif self.shape is Shape.CONSTANT:
            return 1.0
        else:  # WSD: stable, then a linear decay over the last part
            coeff = min(1.0, (1.0 - p) / (1.0 - WSD_DECAY_START))
        return floor + (1.0 - floor) * coeff

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps and step >= self.anchor_step:
            return self.lr * (step + 1) / (self.warmup_steps + 1)
        return self.lr * self.factor(self.progress(step))

    def continued(self, step: int, steps: int) -> Schedule:
        """This schedule stretched (or shrunk) to end at ``steps``, unchanged up to ``step``."""
        if steps == self.steps:
            return self
        if step < self.warmup_steps:  # nothing decayed yet: the new length simply applies
            return Schedule(lr=self.lr, steps=steps, warmup_steps=self.warmup_steps,
                            min_lr_ratio=self.min_lr_ratio, shape=self.shape)
        return Schedule(lr=self.lr, steps=steps, warmup_steps=self.warmup_steps,
                        min_lr_ratio=self.min_lr_ratio, shape=self.shape, anchor_step=step,
                        anchor_progress=self.progress(step))

    def to_dict(self) -> dict[str, float | int | str]:
        return {"steps": self.steps, "anchor_step": self.anchor_step,
                "anchor_progress": self.anchor_progress}
