"""The vocabulary of ``snip.nn``: the GEMM roles, how a layer runs them, and per-GEMM precision.

* `Gemm`: the three GEMMs of a linear layer (below); `GemmSpecs`: one format per GEMM.
* `GemmImpl`: emulated (fake-quantized operands, fp32 matmul: the reference) or native (FP8
  codes through ``torch._scaled_mm``); `SaveMode`: what forward keeps for backward; `Accum`:
  the precision of the matmul itself.  Each has one parser (``as_*``), raising `UserError`.

A linear layer ``Y = X W^T`` runs three GEMMs in training, each of which may use its own format:

* ``fprop``  ``Y  = Q(X) Q(W)^T``      (contraction over in_features)
* ``dgrad``  ``dX = Q(dY) Q(W)``       (contraction over out_features)
* ``wgrad``  ``dW = Q(dY)^T Q(X)``     (contraction over tokens)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from snip.errors import parse_enum
from snip.formats import QuantSpec, get_spec


class Gemm(enum.Enum):
    FPROP = "fprop"
    DGRAD = "dgrad"
    WGRAD = "wgrad"


GEMM_NAMES = tuple(g.value for g in Gemm)  # ("fprop", "dgrad", "wgrad"), the plan-file keys


class GemmImpl(enum.Enum):
    """How a QLinear runs its quantized GEMMs."""

    EMULATED = "emulated"  # fake-quantized fp32 operands, torch matmul: the reference
    NATIVE = "native"      # FP8 codes and scales through torch._scaled_mm where possible


def as_gemm_impl(value: GemmImpl | str) -> GemmImpl:
    return parse_enum(GemmImpl, value, "gemm implementation")


class SaveMode(enum.Enum):
    """What the forward pass keeps for backward."""

    HP = "hp"            # high-precision X and W; re-quantized in backward
    ENCODED = "encoded"  # packed QTensors in the backward GEMMs' formats


class Accum(enum.Enum):
    """Precision of the GEMM itself (the operands are already on their format's grid)."""

    FP32 = "fp32"
    BF16 = "bf16"
    AUTO = "auto"  # BF16 where bf16 GEMMs are native (bf16_gemm_native), else FP32


def as_save_mode(value: SaveMode | str) -> SaveMode:
    return parse_enum(SaveMode, value, "save mode")


def as_accum(value: Accum | str) -> Accum:
    return parse_enum(Accum, value, "accumulation")


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
