"""Fake quantization (``quantize``) and real packed storage (``encode`` -> ``QTensor``).

Both run the same pipeline, so ``encode(x, s).dequantize()`` equals ``quantize(x, s)`` bit for bit:

1. optional randomized Hadamard rotation along the axis (:mod:`snip.formats.hadamard`);
2. cut the tensor into blocks, one per scale (:class:`~snip.formats.scaling.BlockLayout`);
3. compute each block's scale from its amax (:func:`~snip.formats.scaling.scales_from_amax`);
4. multiply by the encode scale and round onto the element grid, saturating
   (:func:`~snip.formats.cast.cast`);
5. multiply the grid values by the decode scale, reassemble, rotate back.

``quantize`` returns step 5 in the input's dtype; ``encode`` stops after step 4 and keeps the
element codes packed (:mod:`snip.formats.codes`) beside the scales in their own storage format.

Entry-point contracts (the same on the fast numba path and the torch reference path):

* a tensor that requires grad: ``quantize`` is differentiable with a straight-through estimator
  (the gradient passes through unchanged, as in quantization-aware training); ``encode`` and
  ``cast`` treat the values as data (no gradient flows into packed codes);
* float64 input is rounded exactly, once (on the float64 reference path, never through float32
  first); block scales are computed from the block amax rounded to float32, as they are stored;
* empty tensors give empty results (``encode`` returns an empty ``QTensor``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from snip.errors import UserError
from snip.formats import codes as C
from snip.formats import fast
from snip.formats.cast import (
    DEFAULT_COUNTERS,
    Counters,
    Rounding,
    as_rounding,
    cast,
    check_float_tensor,
    make_generator,
)
from snip.formats.hadamard import irht, rht
from snip.formats.scaling import (
    BlockLayout,
    RowShard,
    Scales,
    block_amax,
    e4m3_decode,
    e8m0_decode,
    scales_from_amax,
)
from snip.formats.spec import QuantSpec, ScaleFormat, Scaling, get_spec

_NATIVE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _grid(
    x: torch.Tensor,
    spec: QuantSpec,
    axis: int,
    rounding: Rounding,
    generator: torch.Generator | None,
    dequant: bool,
    shard: RowShard | None = None,
) -> tuple[BlockLayout, torch.Tensor, Scales]:
    """Steps 2-4 (and 5's multiply when ``dequant``) on an fp32 tensor, block by block."""
    layout = BlockLayout.of(x, spec, axis)
    blocks = layout.to_blocks(x)
    counters = _counters(layout, rounding, shard)
    if (fast.enabled() and fast.supports(spec.element) and x.device.type == "cpu"
            and blocks.numel() and x.dtype == torch.float32):
        scales = scales_from_amax(fast.block_amax(blocks), spec)
        q = fast.quantize_blocks(blocks, scales.encode, scales.decode, spec.element, rounding,
                                 generator, dequant, counters)
        return layout, q, scales
    scales = scales_from_amax(block_amax(blocks), spec)
    q = cast(blocks * scales.encode, spec.element, rounding, saturate=True, generator=generator,
             counters=counters)
    return layout, (q * scales.decode if dequant else q), scales


def grid_values(
    x: torch.Tensor,
    spec: QuantSpec | str,
    *,
    axis: int = -1,
    rounding: Rounding | str | None = None,
    generator: torch.Generator | int | None = None,
    shard: RowShard | None = None,
) -> tuple[BlockLayout, torch.Tensor, Scales]:
    """Steps 2-4 of :func:`quantize` without the decode multiply: the fp32 grid values in the
    ``(n_blocks, block)`` layout and the block scales (``layout.from_blocks(q * scales.decode)``
    is ``quantize(x, spec)``, bit for bit).  For native low-precision GEMMs, which take the
    element codes and scales apart; specs with a Hadamard rotation are refused."""
    x = x.detach()
    spec, mode, gen = _resolve(x, spec, rounding, generator)
    if spec.hadamard or spec.scaling is Scaling.NONE:
        raise ValueError(f"grid_values: spec {spec.name!r} has no plain block grid")
    return _grid(_working(x), spec, axis, mode, gen, dequant=False, shard=shard)


def _counters(layout: BlockLayout | Callable[[], BlockLayout], rounding: Rounding,
              shard: RowShard | None) -> Counters:
    """The SR counters of ``layout``'s blocks view (only stochastic rounding draws any);
    ``layout`` may be a function making it, called only when needed."""
    if shard is None or rounding is not Rounding.STOCHASTIC:
        return DEFAULT_COUNTERS
    return (layout if isinstance(layout, BlockLayout) else layout()).counters(shard)


def _flat_counters(x: torch.Tensor, rounding: Rounding, shard: RowShard | None) -> Counters:
    """The SR counters of ``x`` in its own element order (unscaled casts)."""
    return _counters(BlockLayout(tuple(x.shape), 0, Scaling.TENSOR, 1), rounding, shard)


def _columns(x: torch.Tensor, spec: QuantSpec, axis: int) -> bool:
    """Blocks along axis 0 of a matrix (the weight-gradient operands) run without a transpose."""
    return (fast.enabled() and fast.supports(spec.element) and x.device.type == "cpu"
            and x.dim() == 2 and axis in (0, -2) and spec.scaling is Scaling.BLOCK
            and not spec.hadamard and x.numel() > 0 and x.dtype == torch.float32)


def _resolve(
    x: torch.Tensor,
    spec: QuantSpec | str,
    rounding: Rounding | str | None,
    generator: torch.Generator | int | None,
) -> tuple[QuantSpec, Rounding, torch.Generator | None]:
    check_float_tensor(x)
    spec = get_spec(spec)
    if spec.hadamard and x.dim() == 0:
        raise UserError(f"{spec.name} rotates blocks along an axis, and a 0-d tensor has none; "
                        "pass it as a 1-element tensor (x.reshape(1))")
    mode = spec.rounding if rounding is None else as_rounding(rounding)
    return spec, mode, make_generator(generator, x.device)


class _StraightThrough(torch.autograd.Function):
    """Forward: the quantized values; backward: the incoming gradient unchanged."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return q

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def _working(x: torch.Tensor) -> torch.Tensor:
    """The tensor the pipeline computes on: float64 stays float64 (rounded exactly, once)."""
    return x if x.dtype == torch.float64 else x.float()


def quantize(
    x: torch.Tensor,
    spec: QuantSpec | str,
    *,
    axis: int = -1,
    rounding: Rounding | str | None = None,
    generator: torch.Generator | int | None = None,
    shard: RowShard | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Fake-quantize ``x`` (quantize, then dequantize) with a preset name or ``QuantSpec``.

    Scales are shared along ``axis`` (the GEMM contraction axis); ``rounding`` overrides the
    spec's rounding; ``generator`` (or an int seed) drives stochastic rounding.  ``shard``
    (a :class:`~snip.formats.scaling.RowShard`) says that ``x`` is some rows of a larger tensor:
    stochastic rounding then draws the coins the larger tensor draws at those rows.  ``dtype``:
    the result's dtype (default ``x``'s); the values are those of ``x``'s dtype converted to it
    (fp32 input to bf16: stored rounded in the same pass, for a bf16 GEMM).  If ``x`` requires
    grad, the result does too, with a straight-through gradient (identity).
    """
    check_float_tensor(x)  # (a numpy array: a TypeError that says so)
    if dtype is not None and not dtype.is_floating_point:
        raise UserError(f"dtype={dtype}: quantize returns floating-point values; use encode for "
                        "integer codes")
    if x.requires_grad and torch.is_grad_enabled():
        q = quantize(x.detach(), spec, axis=axis, rounding=rounding, generator=generator,
                     shard=shard, dtype=dtype)
        return _StraightThrough.apply(x, q)
    return _quantize(x, spec, axis, rounding, generator, shard, dtype)


def _quantize(
    x: torch.Tensor,
    spec: QuantSpec | str,
    axis: int,
    rounding: Rounding | str | None,
    generator: torch.Generator | int | None,
    shard: RowShard | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    x = x.detach()
    spec, mode, gen = _resolve(x, spec, rounding, generator)
    dtype = dtype or x.dtype
    # one pass, stored in dtype: x's own, or bf16 from fp32 (a rounding at the store); a wider
    # dtype than x's would skip the rounding to x's dtype, so it converts after
    if x.numel() > 0 and (dtype == x.dtype or (x.dtype, dtype) == _TO_BF16):
        kernel = fast.kernel_for(x, spec, mode)
        if kernel is fast.Kernel.BF16:
            return fast.round_bf16(x, dtype)
        if kernel is fast.Kernel.FUSED:
            return fast.quantize_fused(x, spec, axis, mode, gen, _counters(
                lambda: BlockLayout.of(x, spec, axis), mode, shard), dtype)
    return _quantize_torch(x, spec, axis, mode, gen, shard).to(dtype)


_TO_BF16 = (torch.float32, torch.bfloat16)  # (x's dtype, result dtype) the kernels store too


def _quantize_torch(x: torch.Tensor, spec: QuantSpec, axis: int, mode: Rounding,
                    gen: torch.Generator | None, shard: RowShard | None) -> torch.Tensor:
    """:func:`quantize` in ``x``'s dtype where no fused kernel applies (or ``SNIP_FAST=0``)."""
    if x.numel() == 0 or spec.is_identity and x.dtype == torch.float32:
        return x.clone()
    if spec.scaling is Scaling.NONE:
        return cast(x, spec.element, mode, saturate=True, generator=gen,
                    counters=_flat_counters(x, mode, shard))
    xf = _working(x)
    if spec.hadamard:
        xf = rht(xf, spec.hadamard, spec.hadamard_seed, axis)
    if _columns(xf, spec, axis):
        out = fast.quantize_columns(xf, spec.block, lambda a: scales_from_amax(a, spec),
                                    spec.element, mode, gen,
                                    _counters(BlockLayout.of(xf, spec, axis), mode, shard))
    else:
        layout, deq, _ = _grid(xf, spec, axis, mode, gen, dequant=True, shard=shard)
        out = layout.from_blocks(deq)
    if spec.hadamard:
        out = irht(out, spec.hadamard, spec.hadamard_seed, axis, x.shape[axis])
    return out.to(x.dtype)


@dataclass(frozen=True)
class QTensor:
    """A tensor in real low-precision storage: packed element codes plus scales.

    ``codes`` is a flat uint8 buffer (two FP4 codes per byte, even element in the low nibble);
    ``scales`` holds one scale per block in the spec's scale format (fp32, e8m0 biased exponents
    as uint8, or float8_e4m3fn); ``tensor_scale`` is NVFP4's fp32 per-tensor decode scale.
    """

    codes: torch.Tensor
    scales: torch.Tensor | None
    tensor_scale: torch.Tensor | None
    spec: QuantSpec
    layout: BlockLayout | None
    grid_shape: tuple[int, ...]  # (n_blocks, elements per block) of the codes, padding included
    shape: tuple[int, ...]
    dtype: torch.dtype
    axis: int

    @property
    def nbytes(self) -> int:
        parts = (self.codes, self.scales, self.tensor_scale)
        return sum(p.numel() * p.element_size() for p in parts if p is not None)

    @property
    def bits_per_element(self) -> float:
        n = max(1, torch.Size(self.shape).numel())
        return 8.0 * self.nbytes / n

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        dtype = dtype or self.dtype
        if torch.Size(self.shape).numel() == 0:
            return torch.empty(self.shape, dtype=dtype, device=self.codes.device)
        if self.layout is None:  # bf16 / fp16 / fp32 storage
            native = _NATIVE[self.spec.element.name]
            return self.codes.view(native).reshape(self.shape).to(dtype)
        fmt = self.spec.element
        n = torch.Size(self.grid_shape).numel()
        q = C.decode_codes(C.unpack(self.codes, fmt.bits, n), fmt).view(self.grid_shape)
        decode = self._scales().decode
        if self.dtype == torch.float64:  # as quantize computes a float64 tensor: exact products
            q, decode = q.double(), decode.double()
        out = self.layout.from_blocks(q * decode)
        if self.spec.hadamard:
            out = irht(
                out, self.spec.hadamard, self.spec.hadamard_seed, self.axis, self.shape[self.axis]
            )
        return out.to(dtype)

    def _scales(self) -> Scales:
        stored = self.scales.view(-1, 1)
        if self.spec.scale_format is ScaleFormat.E8M0:
            return e8m0_decode(stored)
        if self.spec.scale_format is ScaleFormat.E4M3:
            return e4m3_decode(stored, self.tensor_scale)
        return Scales(stored, 1.0 / stored, stored)


def encode(
    x: torch.Tensor,
    spec: QuantSpec | str,
    *,
    axis: int = -1,
    rounding: Rounding | str | None = None,
    generator: torch.Generator | int | None = None,
    shard: RowShard | None = None,
) -> QTensor:
    """Quantize ``x`` into real packed storage; ``QTensor.dequantize()`` equals :func:`quantize`
    (with the same arguments)."""
    spec, mode, gen = _resolve(x, spec, rounding, generator)  # (a non-tensor: TypeError)
    x = x.detach()  # packed codes carry no gradient
    shape, dtype = tuple(x.shape), x.dtype
    if x.numel() == 0:
        empty = torch.empty(0, dtype=torch.uint8, device=x.device)
        return QTensor(empty, None, None, spec, None, (0,), shape, dtype, axis % max(1, x.dim()))
    if spec.scaling is Scaling.NONE:
        native = _NATIVE[spec.element.name]
        q = cast(x, spec.element, mode, saturate=True, generator=gen,
                 counters=_flat_counters(x, mode, shard)).to(native)
        return QTensor(
            q.reshape(-1).view(torch.uint8).clone(),
            None,
            None,
            spec,
            None,
            tuple(q.shape),
            shape,
            dtype,
            0,
        )
    xf = _working(x)
    if spec.hadamard and x.numel():
        xf = rht(xf, spec.hadamard, spec.hadamard_seed, axis)
    layout, q, scales = _grid(xf, spec, axis, mode, gen, dequant=False, shard=shard)
    codes = C.pack(C.encode_codes(q, spec.element), spec.element.bits)
    stored = scales.stored.reshape(-1)
    return QTensor(
        codes,
        stored,
        scales.tensor_scale,
        spec,
        layout,
        tuple(q.shape),
        shape,
        dtype,
        axis % max(1, x.dim()),
    )


def replace_spec(spec: QuantSpec | str, **changes) -> QuantSpec:
    """A copy of a preset with some fields changed, e.g. ``replace_spec("mxfp4", block=16)``."""
    return dataclasses.replace(get_spec(spec), **changes)
