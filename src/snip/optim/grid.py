"""Storage grids: the value set a low-precision weight is written back onto.

A weight kept "in e4m3" without a master copy lives on a finite grid ``G``.  After every optimizer
step the fp32 result ``x = q + d`` (stored value plus the optimizer's proposal) is written back as
``Q(x)``, and ``Q`` is the only place where precision is lost.  Two kinds of grid:

* **analytic grid** (``spec=None``): the element format's own value set with scale 1, e.g. the
  exact E4M3 values ``{0, 2^-9, ..., 448}``.  This is the "analytic scale-1 grid" of the reference
  traces paper: with GPT-style init (std 0.02) the grid spacing near a weight is ~2^-9..2^-8, so
  an Adam proposal of size ~lr is often below half a spacing and disappears.
* **scaled grid** (``spec=QuantSpec``): block-scaled fake quantization with
  :func:`snip.formats.quantize` (per-tensor, per-row or per-block scales).  The grid then moves
  with the tensor's amax, which is recomputed at every write-back.

Data flow: :class:`~snip.optim.writeback.WritebackOptimizer` calls :meth:`StorageGrid.round` once
per managed tensor per step; the audit reproduces the same rounding to decide which coordinates
were frozen.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from snip.errors import UserError
from snip.formats import (
    PRESETS,
    ElementFormat,
    QuantSpec,
    Rounding,
    Scaling,
    cast,
    get_element,
    quantize,
)
from snip.formats.spec import get_spec


@dataclass(frozen=True, kw_only=True)
class StorageGrid:
    """Where stored weights live: an element format, optionally with a block-scaling spec."""

    element: ElementFormat
    spec: QuantSpec | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "element", get_element(self.element))
        if self.spec is not None:
            spec = get_spec(self.spec)
            if spec.element != self.element:
                raise UserError(f"storage grid: element {self.element.name!r} differs from spec "
                                f"{spec.name!r} element {spec.element.name!r}; pass one of them")
            object.__setattr__(self, "spec", spec)

    @classmethod
    def parse(cls, name: str | ElementFormat | QuantSpec | StorageGrid) -> StorageGrid:
        """``"e4m3"`` -> analytic grid; a preset name (``"fp8_e4m3"``) -> scaled grid.

        The one precedence rule for a name that is both a preset and an element (stored weights
        and optimizer states alike): a preset that scales wins (``"int8"``: per-channel int8,
        ``"mxint8"``: 32-blocks, not the integers at scale 1); the unscaled presets ``bf16``,
        ``fp16``, ``fp32`` hold the element's own values and give its analytic grid.
        """
        if isinstance(name, StorageGrid):
            return name
        if isinstance(name, QuantSpec):
            return cls(element=name.element, spec=name)
        if isinstance(name, ElementFormat):
            return cls(element=name)
        spec = PRESETS.get(name.lower()) if isinstance(name, str) else None
        if spec is not None and spec.scaling is not Scaling.NONE:
            return cls(element=spec.element, spec=spec)
        try:
            return cls(element=get_element(name))
        except ValueError:
            if spec is not None:
                return cls(element=spec.element, spec=spec)
            valid = ", ".join(PRESETS)
            raise UserError(f"unknown storage format {name!r}: use an element name (e4m3, "
                            f"e5m2, e2m1, bf16, any 'eXmY') or a preset ({valid})") from None

    @property
    def is_identity(self) -> bool:
        """True for the fp32 analytic grid: writing back an fp32 tensor changes nothing."""
        return self.spec is None and self.element.name == "fp32"

    @property
    def bits_per_element(self) -> float:
        return float(self.element.bits) if self.spec is None else self.spec.bits_per_element

    @property
    def name(self) -> str:
        return self.element.name if self.spec is None else self.spec.name

    def round(self, x: torch.Tensor, rounding: Rounding | str = Rounding.RNE,
              generator: torch.Generator | None = None) -> torch.Tensor:
        """``Q(x)``: a new fp32 tensor whose values lie on the grid (saturating at the edges)."""
        if self.is_identity:
            return x.clone()
        if self.spec is None:
            return cast(x, self.element, rounding, saturate=True, generator=generator)
        return quantize(x, self.spec, rounding=rounding, generator=generator)
