"""``QConv1D``: quantized GEMMs for Hugging Face's GPT-2 style ``Conv1D`` layers.

GPT-2 (and GPT-J-era models derived from it) do not use ``nn.Linear``: their projections are
``transformers.pytorch_utils.Conv1D``, a linear layer whose weight is stored *transposed*,
``(in_features, out_features)``, and applied as ``y = x @ W + b``.  Since ``x @ W == x @ (W^T)^T``,
the layer is ``F.linear(x, W^T, b)``, so a ``QLinear`` that hands ``W.t()`` (a view, no copy) to
the GEMM Function computes exactly the same three GEMMs in the same formats, and autograd routes
the weight gradient back through the view into the original ``(in, out)`` Parameter.

``QConv1D`` therefore *is* a ``QLinear`` (every tool that lists, plans or re-specs ``QLinear``
layers sees it) that shares the ``Conv1D``'s Parameters unchanged: same shapes, same
``state_dict`` keys, so HF checkpoints, optimizer state and weight tying are untouched.  Its
``weight`` is ``(in, out)``; :meth:`linear_weight` is the ``(out, in)`` view the GEMMs use.

``transformers`` is never imported here: a ``Conv1D`` is recognised by its class name and its
``nf`` attribute (see :func:`is_conv1d`), and :meth:`QConv1D.to_conv1d` rebuilds the original
class from the type remembered at conversion.
"""

from __future__ import annotations

import torch
from torch import nn

from snip.formats import QuantSpec
from snip.nn.qlinear import QLinear
from snip.nn.specs import Accum, GemmSpecs, SaveMode


def is_conv1d(module: nn.Module) -> bool:
    """True for a Hugging Face ``Conv1D`` (GPT-2's transposed linear layer)."""
    weight = getattr(module, "weight", None)
    return (type(module).__name__ == "Conv1D" and hasattr(module, "nf")
            and isinstance(weight, torch.Tensor) and weight.dim() == 2)


class QConv1D(QLinear):
    """A ``QLinear`` over a ``Conv1D``'s transposed ``(in, out)`` weight."""

    _conv1d_cls: type[nn.Module]

    @classmethod
    def from_conv1d(cls, conv: nn.Module, specs: GemmSpecs | QuantSpec | str, *, seed: int = 0,
                    save: SaveMode | str = SaveMode.HP,
                    accum: Accum | str = Accum.FP32) -> QConv1D:
        """A ``QConv1D`` sharing ``conv``'s Parameter objects (nothing is copied)."""
        n_in, n_out = conv.weight.shape
        with torch.device("meta"):
            q = cls(n_in, n_out, conv.bias is not None, specs=specs, seed=seed, save=save,
                    accum=accum)
        q.weight = conv.weight
        q.bias = conv.bias
        q.train(conv.training)
        q._conv1d_cls = type(conv)
        return q

    def linear_weight(self) -> torch.Tensor:
        return self.weight.t()

    def to_conv1d(self) -> nn.Module:
        """The original ``Conv1D`` class again, sharing this layer's Parameters."""
        with torch.device("meta"):
            conv = self._conv1d_cls(self.out_features, self.in_features)
        conv.weight = self.weight
        conv.bias = self.bias
        conv.train(self.training)
        return conv

    def to_linear(self) -> nn.Module:  # what unconvert calls: give back a Conv1D, not a Linear
        return self.to_conv1d()
