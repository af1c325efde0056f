"""``QuantSpec``: everything needed to fake-quantize or encode one GEMM operand, and the presets.

A spec combines an element format (:mod:`snip.formats.element`) with a *scaling* rule -- how many
elements share one scale, and in which format that scale is stored:

==========  ===========================================================================
``NONE``     element cast only (bf16, fp16, fp32)
``TENSOR``   one fp32 scale for the whole tensor: ``s = amax / elem_max``
``CHANNEL``  one scale per slice along the quantization axis (per row for ``axis=-1``)
``BLOCK``    one scale per ``block`` consecutive elements along the axis (MX: 32, NVFP4: 16,
             DeepSeek/SNIP tiles: 128)
``BLOCK2D``  one scale per ``block x block`` tile of a matrix, so that ``Q(W).T == Q(W.T)``
==========  ===========================================================================

Scale formats: ``FP32`` (optionally rounded up to a power of two), ``E8M0`` (MX: a bare power of
two, OCP ``floor`` rule or NVIDIA's round-up ``rceil`` rule) and ``E4M3`` (NVFP4: an FP8 block
scale under an fp32 per-tensor scale).  ``weight_2d`` asks GEMM code to quantize *weights* with
``BLOCK2D`` tiles (:meth:`QuantSpec.for_weight`); ``grad_rounding`` is the rounding used for
gradient operands (stochastic for FP4 recipes); ``hadamard`` applies a seeded randomized
Hadamard transform of that size along the axis before quantizing.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from dataclasses import dataclass

from snip.errors import UserError
from snip.formats.element import ElementFormat, get_element
from snip.formats.rounding import Rounding, as_rounding


class Scaling(enum.Enum):
    NONE = "none"
    TENSOR = "tensor"
    CHANNEL = "channel"
    BLOCK = "block"
    BLOCK2D = "block2d"


class ScaleFormat(enum.Enum):
    FP32 = "fp32"
    E8M0 = "e8m0"
    E4M3 = "e4m3"  # NVFP4: e4m3 block scale times one fp32 tensor scale


class E8M0Rule(enum.Enum):
    FLOOR = "floor"  # OCP MX v1.0: 2^(floor(log2 amax) - emax_elem); elements saturate
    RCEIL = "rceil"  # NVIDIA/cuBLAS: 2^ceil(log2(amax / elem_max)); never saturates


_SCALE_BITS = {ScaleFormat.FP32: 32, ScaleFormat.E8M0: 8, ScaleFormat.E4M3: 8}
_HADAMARD_SIZES = (16, 32, 64, 128)


@dataclass(frozen=True, kw_only=True)
class QuantSpec:
    """How one tensor is quantized.  Build presets with :func:`get_spec`."""

    name: str
    element: ElementFormat
    scaling: Scaling = Scaling.TENSOR
    block: int = 0
    scale_format: ScaleFormat = ScaleFormat.FP32
    e8m0_rule: E8M0Rule = E8M0Rule.FLOOR
    pow2_scales: bool = False
    rounding: Rounding = Rounding.RNE
    grad_rounding: Rounding = Rounding.RNE
    weight_2d: bool = False
    hadamard: int = 0
    hadamard_seed: int = 0

    def __hash__(self) -> int:
        """The name's hash (cached by ``str``): specs are dictionary keys of per-spec kernel
        parameters on every quantizer call, and hashing all twelve fields cost ~1 us there.
        Equal specs have equal names, so this agrees with ``==``."""
        return hash(self.name)

    def __post_init__(self) -> None:
        object.__setattr__(self, "element", get_element(self.element))
        # "stochastic" given as a string must compare like the enum (GEMM code tests `is`)
        object.__setattr__(self, "rounding", as_rounding(self.rounding))
        object.__setattr__(self, "grad_rounding", as_rounding(self.grad_rounding))
        if self.scaling in (Scaling.BLOCK, Scaling.BLOCK2D):
            if not isinstance(self.block, int) or self.block < 1:
                raise UserError(
                    f"spec {self.name!r}: block size must be a positive int, got {self.block!r}"
                )
        elif self.block:
            raise UserError(
                f"spec {self.name!r}: block={self.block} only applies to BLOCK/BLOCK2D scaling"
            )
        if self.scale_format is ScaleFormat.E4M3 and self.scaling not in (
            Scaling.BLOCK,
            Scaling.BLOCK2D,
        ):
            raise UserError(f"spec {self.name!r}: e4m3 scales need BLOCK or BLOCK2D scaling")
        if self.weight_2d and self.scaling is not Scaling.BLOCK:
            raise UserError(f"spec {self.name!r}: weight_2d needs BLOCK scaling")
        if self.hadamard and self.hadamard not in _HADAMARD_SIZES:
            raise UserError(
                f"spec {self.name!r}: hadamard size must be one of {_HADAMARD_SIZES}, "
                f"got {self.hadamard}"
            )
        if self.scaling is Scaling.NONE and self.element.bits < 16:
            raise UserError(f"spec {self.name!r}: a {self.element.bits}-bit element needs a scale")

    @property
    def is_identity(self) -> bool:
        """True for fp32: quantizing an fp32 tensor returns it unchanged."""
        return self.scaling is Scaling.NONE and self.element.name == "fp32"

    @property
    def bits(self) -> int:
        """Element width in bits (4 for every FP4 variant)."""
        return self.element.bits

    @property
    def bits_per_element(self) -> float:
        """Storage bits per element including block scales (per-tensor/per-row scales excluded)."""
        if self.scaling is Scaling.BLOCK:
            return self.element.bits + _SCALE_BITS[self.scale_format] / self.block
        if self.scaling is Scaling.BLOCK2D:
            return self.element.bits + _SCALE_BITS[self.scale_format] / self.block**2
        return float(self.element.bits)

    def for_weight(self) -> QuantSpec:
        """The spec to use on a weight operand (2-D tiles when ``weight_2d``)."""
        if not self.weight_2d:
            return self
        return _tiled(self)

    def describe_scaling(self) -> str:
        if self.scaling is Scaling.NONE:
            return "-"
        if self.scaling in (Scaling.TENSOR, Scaling.CHANNEL):
            return f"{self.scaling.value} {self.scale_format.value}"
        shape = f"1x{self.block}" if self.scaling is Scaling.BLOCK else f"{self.block}x{self.block}"
        scale = self.scale_format.value
        if self.scale_format is ScaleFormat.E8M0:
            scale += f" {self.e8m0_rule.value}"
        if self.scale_format is ScaleFormat.E4M3:
            scale += "+fp32"
        if self.pow2_scales:
            scale += " pow2"
        extra = f" (W {self.block}x{self.block})" if self.weight_2d else ""
        return f"{shape} {scale}{extra}"


@functools.cache
def _tiled(spec: QuantSpec) -> QuantSpec:
    """``spec`` with 2-D weight tiles, made once per spec (a ``dataclasses.replace`` validates
    every field again: several microseconds on each GEMM call)."""
    return dataclasses.replace(spec, scaling=Scaling.BLOCK2D, weight_2d=False)


def _p(name: str, element: str, scaling: Scaling = Scaling.TENSOR, **kw) -> QuantSpec:
    return QuantSpec(name=name, element=get_element(element), scaling=scaling, **kw)


_SR = Rounding.STOCHASTIC
_MX = dict(scaling=Scaling.BLOCK, block=32, scale_format=ScaleFormat.E8M0)
_NV = dict(scaling=Scaling.BLOCK, block=16, scale_format=ScaleFormat.E4M3, weight_2d=True,
           grad_rounding=_SR)

PRESETS: dict[str, QuantSpec] = {
    s.name: s
    for s in (
        _p("fp32", "fp32", Scaling.NONE),
        _p("bf16", "bf16", Scaling.NONE),
        _p("fp16", "fp16", Scaling.NONE),
        _p("fp8_e4m3", "e4m3"),
        _p("fp8_e5m2", "e5m2"),
        # one fp32 scale per row along the contraction axis: torch._scaled_mm's rowwise scaling
        _p("fp8_e4m3_row", "e4m3", Scaling.CHANNEL),
        _p("fp8_e4m3_tile128", "e4m3", Scaling.BLOCK, block=128, weight_2d=True),
        _p("fp4_e2m1_tile128", "e2m1", Scaling.BLOCK, block=128, weight_2d=True, grad_rounding=_SR),
        # one fp32 scale per tensor: the harsh FP4 contrast of SNIP's decisive experiment
        _p("fp4_e2m1_tensor", "e2m1", grad_rounding=_SR),
        _p("mxfp8_e4m3", "e4m3", **_MX),
        _p("mxfp8_e4m3_rceil", "e4m3", **_MX, e8m0_rule=E8M0Rule.RCEIL),
        _p("mxfp8_e5m2", "e5m2", **_MX),
        _p("mxfp6_e3m2", "e3m2", **_MX),
        _p("mxfp6_e2m3", "e2m3", **_MX),
        _p("mxfp4", "e2m1", **_MX, grad_rounding=_SR),
        _p("mxfp4_rht", "e2m1", **_MX, grad_rounding=_SR, hadamard=32),
        _p("mxint8", "mxint8", **_MX),
        _p("nvfp4", "e2m1", **_NV),
        _p("nvfp4_rht", "e2m1", **_NV, hadamard=16),
        _p("int8", "int8", Scaling.CHANNEL),
        _p("int4_g32", "int4", Scaling.BLOCK, block=32),
    )
}


def get_spec(spec: QuantSpec | str) -> QuantSpec:
    """Resolve a preset name (or pass a ``QuantSpec`` through)."""
    if isinstance(spec, QuantSpec):
        return spec
    if isinstance(spec, str) and spec.lower() in PRESETS:
        return PRESETS[spec.lower()]
    raise UserError(f"unknown quantization preset {spec!r}; valid presets: {', '.join(PRESETS)}")


def is_fp4(spec: QuantSpec | str) -> bool:
    """True for 4-bit element formats (the 'FP4' side of SNIP's FLOP budget)."""
    return get_spec(spec).element.bits <= 4
