"""How the statistics passes get a scalar loss from any model: ``loss_fn(model, batch) -> loss``.

Every pass of a statistics cycle (:mod:`snip.sensitivity.estimate`) needs the training loss of
one calibration batch as a differentiable scalar.  Models disagree on how to produce it, so the
estimator and the controller take a ``loss_fn``.  :func:`default_loss` covers the two contracts
this project meets:

* snip's own models: ``model(tokens, targets) -> (logits, loss)`` (the loss is the second item);
* Hugging Face causal LMs (``transformers.PreTrainedModel``): called as ``model(input_ids=x)``
  and scored with cross entropy against the *already shifted* targets ``y`` of our batches, so
  the loss is exactly the one our trainer minimises (passing ``labels=x`` would make HF shift
  again and drop the last position).  A ``ModelOutput`` that carries ``.loss`` (a batch given
  as a mapping of keyword arguments, e.g. ``{"input_ids": ..., "labels": ...}``) is used as is.

Anything else: pass your own ``loss_fn``.  A model output that is none of the above raises
:class:`LossContractError`, a ``ValueError`` that names the fix.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

Batch = Any  # (tokens, targets), or a mapping of keyword arguments for the model
BatchFn = Callable[[int], Batch]  # the i-th calibration batch
LossFn = Callable[[nn.Module, Batch], torch.Tensor]


class LossContractError(ValueError):
    """The model's output is not a loss this module knows how to read."""


def is_hf_model(model: nn.Module) -> bool:
    """True for a ``transformers.PreTrainedModel`` (without importing transformers)."""
    tf = sys.modules.get("transformers")
    return tf is not None and isinstance(model, tf.PreTrainedModel)


def _read_loss(out: Any, targets: torch.Tensor | None) -> torch.Tensor:
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, Mapping):
        loss = out.get("loss")
    if loss is not None:
        return loss
    logits = getattr(out, "logits", None)
    if logits is not None and targets is not None:
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
    if isinstance(out, tuple) and len(out) >= 2 and isinstance(out[1], torch.Tensor):
        return out[1]
    if isinstance(out, torch.Tensor) and out.dim() == 0:
        return out
    raise LossContractError(
        f"cannot read a loss from a model output of type {type(out).__name__}; pass "
        "loss_fn=lambda model, batch: <scalar loss> to measure()/Controller()")


def default_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """The scalar training loss of ``batch`` (see the module docstring for the contracts)."""
    if isinstance(batch, Mapping):
        return _read_loss(model(**batch), batch.get("labels"))
    x, y = batch
    if is_hf_model(model):
        return _read_loss(model(input_ids=x), y)
    return _read_loss(model(x, y), y)


def batch_tokens(batch: Batch) -> int:
    """Tokens in a batch (the first tensor's element count: ids are (batch, sequence))."""
    first = next(iter(batch.values())) if isinstance(batch, Mapping) else batch[0]
    return int(first.numel())


def batch_to(batch: Batch, device: torch.device) -> Batch:
    if isinstance(batch, Mapping):
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    return tuple(t.to(device) for t in batch)


def take_rows(batch: Batch, rows: int | None) -> Batch:
    """The first ``rows`` sequences of every tensor in the batch (all of them for None)."""
    if rows is None:
        return batch
    if isinstance(batch, Mapping):
        return {k: v[:rows] if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    return tuple(t[:rows] for t in batch)
