"""Ready-made `Hook`s for the trainer (`snip.train.loop.Hook`).

* `RecorderHook` -- an fp32 reference trace (`snip.audit.ReferenceRecorder`) around every
  optimizer update: what ``snip audit`` and the write-back experiments record.
"""

from __future__ import annotations

from snip.audit import ReferenceRecorder
from snip.train.loop import Hook, Trainer


class RecorderHook(Hook):
    """Feeds the weights and gradients before each update, and the weights after it, to a
    `ReferenceRecorder` (which then holds the run's reference trace)."""

    def __init__(self, recorder: ReferenceRecorder) -> None:
        self.recorder = recorder

    def before_update(self, trainer: Trainer) -> None:
        self.recorder.begin()

    def after_update(self, trainer: Trainer) -> None:
        self.recorder.end(trainer.optimizer)
