"""Per-GEMM precision of one linear layer.

A linear layer ``Y = X W^T`` runs three GEMMs in training, each of which may use its own format:

* ``fprop``  ``Y  = Q(X) Q(W)^T``      (contraction over in_features)
* ``dgrad``  ``dX = Q(dY) Q(W)``       (contraction over out_features)
* ``wgrad``  ``dW = Q(dY)^T Q(X)``     (contraction over tokens)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from snip.formats import QuantSpec, get_spec


class Gemm(enum.Enum):
    FPROP = "fprop"
    DGRAD = "dgrad"
    WGRAD = "wgrad"


GEMM_NAMES = tuple(g.value for g in Gemm)  # ("fprop", "dgrad", "wgrad"), the plan-file keys


@dataclass(frozen=True, kw_only=True)
class GemmSpecs:
    """The three ``QuantSpec`` of one linear layer (names are resolved through the presets)."""

    fprop: QuantSpec
    dgrad: QuantSpec
    wgrad: QuantSpec

    def __post_init__(self) -> None:
        for g in Gemm:
            object.__setattr__(self, g.value, get_spec(getattr(self, g.value)))

    @classmethod
    def uniform(cls, spec: QuantSpec | str) -> GemmSpecs:
        return cls(fprop=spec, dgrad=spec, wgrad=spec)

    def get(self, gemm: Gemm | str) -> QuantSpec:
        return getattr(self, Gemm(gemm).value)

    def names(self) -> dict[str, str]:
        """``{"fprop": name, "dgrad": name, "wgrad": name}`` as in a plan file."""
        return {g.value: self.get(g).name for g in Gemm}

    def __str__(self) -> str:
        n = self.names()
        if len(set(n.values())) == 1:
            return n["fprop"]
        return ", ".join(f"{k}={v}" for k, v in n.items())
