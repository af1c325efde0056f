"""Validation: the loss with the run's precision plan and in high precision, on strided windows.

Two numbers per evaluation, both on the same held-out windows:

* ``loss``: the model as it trains, every GEMM in the format its plan gives it (what the
  quantized model computes);
* ``loss_hp``: the same weights with every quantized GEMM run as a plain fp32 ``F.linear``
  (`snip.nn.disabled`): the quality of the weights themselves, independent of the format they
  are evaluated in.  Where the model's forward already is that (`snip.nn.plain_forward`: the
  ``fp32`` preset, outside bf16 autocast) the second pass would repeat the first bit for bit,
  so ``loss_hp`` is ``loss`` and the windows run once.

A recipe can look good on one and bad on the other (FP4 noise in evaluation versus damage done
to the weights while training), so a user deciding a recipe needs both.

The windows are ``train.eval_batches`` batches spread evenly over the whole validation split
(`snip.data.TokenDataset.strided_batches`), identical for every evaluation, run and arm, so that
paired comparisons (``snip compare``) difference out the windows' own difficulty. Every rank
evaluates the same windows (no communication) under a forked RNG, so evaluating never shifts the
global random streams; it does advance each quantized layer's forward counter (`snip.nn.QLinear`),
which seeds its stochastic rounding, so the evaluation cadence is part of a run's numerics (the
same settings give the same bits).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from snip.nn import disabled, plain_forward


@dataclass(frozen=True)
class EvalResult:
    """One evaluation: mean loss with the plan and in high precision, at ``step``."""

    step: int
    loss: float
    loss_hp: float

    @property
    def ppl(self) -> float:
        return math.exp(min(self.loss, 50.0))


def autocast(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager:
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


@torch.no_grad()
def mean_loss(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
              device: torch.device, bf16: bool = False,
              done: Callable[[], None] | None = None) -> float:
    """Mean next-token loss of ``model`` over ``batches`` (each batch weighs the same);
    ``done`` is called after each batch (progress)."""
    losses = []
    for x, y in batches:
        with autocast(device, bf16):
            _, loss = model(x.to(device), y.to(device))
        losses.append(loss.float())
        if done is not None:
            done()
    return torch.stack(losses).mean().item()


def passes(model: nn.Module, bf16: bool = False) -> int:
    """Forward passes per batch that :func:`evaluate` makes: 1 where the quantized forward is
    the plain fp32 one (both losses are that pass), else 2."""
    return 1 if not bf16 and plain_forward(model) else 2


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
             device: torch.device, step: int, bf16: bool = False,
             done: Callable[[], None] | None = None) -> EvalResult:
    """Both losses of ``model`` on ``batches`` (see the module docstring; iterated once per
    pass: a list, or an object that makes them anew); ``done`` is called after each forward
    pass of a batch (:func:`passes` times per batch)."""
    devices = [device.index or 0] if device.type == "cuda" else []
    was_training = model.training
    with torch.random.fork_rng(devices=devices):
        model.eval()
        try:
            loss = mean_loss(model, batches, device, bf16, done)
            if passes(model, bf16) == 1:
                loss_hp = loss  # the same fp32 forward: one pass, not two
            else:
                with disabled(model):
                    loss_hp = mean_loss(model, batches, device, bf16, done)
        finally:
            model.train(was_training)
    return EvalResult(step=step, loss=loss, loss_hp=loss_hp)
