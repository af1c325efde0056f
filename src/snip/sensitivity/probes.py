"""Statistics probes: forward hooks on linear layers that exist only while a probe is active.

A probe costs nothing when off: hooks are registered on entering ``with probe.attach(model)``
and removed on exit, so ordinary training steps run through no snip hook at all.  While on, a
:class:`Capture` records, per linear layer ``l``, its input operand ``X_l`` and output ``Y_l``
(graph tensors, so gradients can be taken with respect to them) and can *perturb* the operands
seen by that layer only:

* input noise ``X_l -> X_l + eps_X`` through a forward pre-hook (other consumers of the same
  tensor, e.g. ``wk``/``wv`` beside ``wq``, are untouched: quantizing ``wq`` only changes what
  ``wq`` sees);
* weight noise ``W_l -> W_l + eps_W`` by adding ``(X_l + eps_X) eps_W^T`` to the output.

The perturbed input is kept, so ``d loss / d (X_l + eps_X)`` is exactly the gradient through
this layer alone, ``G_l' (W_l + eps_W)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from snip.nn import disabled


@dataclass
class Noise:
    """Per-layer operand perturbations for one forward-noise pass."""

    x: torch.Tensor | None = None  # same shape as the layer input
    w: torch.Tensor | None = None  # same shape as the weight


@dataclass
class Capture:
    """Inputs and outputs of the named linear layers during one forward pass."""

    layers: Mapping[str, nn.Linear]
    noise: Mapping[str, Noise] | None = None
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    enabled: bool = True

    def _pre_hook(self, name: str):
        def hook(module: nn.Module, args: tuple) -> tuple | None:
            x = args[0]
            if self.noise is not None and self.noise[name].x is not None:
                x = x + self.noise[name].x.to(x.dtype)
                if not x.requires_grad and torch.is_grad_enabled():
                    x.requires_grad_()  # a model input: the curvature still needs d loss / dX
                self.inputs[name] = x
                return (x, *args[1:])
            self.inputs[name] = x
            return None
        return hook

    def _post_hook(self, name: str):
        def hook(module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor | None:
            if self.noise is not None and self.noise[name].w is not None:
                out = out + F.linear(args[0], self.noise[name].w.to(out.dtype))
            self.outputs[name] = out
            return out
        return hook

    @contextlib.contextmanager
    def attach(self) -> Iterator[Capture]:
        """Register the hooks for the duration of the block (nothing when disabled)."""
        handles = []
        if self.enabled:
            for name, m in self.layers.items():
                handles.append(m.register_forward_pre_hook(self._pre_hook(name)))
                handles.append(m.register_forward_hook(self._post_hook(name)))
        try:
            yield self
        finally:
            for h in handles:
                h.remove()


def high_precision(model: nn.Module) -> contextlib.AbstractContextManager:
    """Run the statistics passes unquantized (``snip.nn.disabled``; a no-op on a plain model)."""
    return disabled(model)
