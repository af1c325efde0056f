"""Block layouts and scale computation.

A :class:`BlockLayout` turns a tensor into a 2-D ``(n_blocks, block_numel)`` view, one row per
scale, padding with zeros where the axis length is not a multiple of the block (zeros never change
a block's amax, and the padding is cropped on the way back).

Scales are *decode* scales ``s`` (``x ~ q * s``) computed from each block's ``amax``; data is
encoded by multiplying with ``1/s`` computed once per block, which for power-of-two scales is the
same as dividing.  Rules:

* fp32:   ``s = amax / elem_max``, optionally rounded *up* to a power of two (so nothing
          saturates).  ``amax == 0`` gives ``s = 1``; a positive ``s`` below the smallest normal
          fp32 is raised to it, so ``1/s`` is finite.
* e8m0:   ``floor``: ``s = 2^(floor(log2 amax) - emax_elem)`` (OCP MX; ``amax/s`` can reach
          ``2^(emax+1)``, elements saturate); ``rceil``: ``s = 2^ceil(log2(amax / elem_max))``.
          Exponent clamped to ``[-127, 127]``; log2 floor/ceil come exactly from fp32 bits.
* e4m3:   NVFP4 / Transformer Engine chain.  ``S_enc = min(448*6 / amax_tensor, FLT_MAX)``
          (1 when that is 0 or amax is 0); per block ``S_dec_b = e4m3(min(amax_b * (S_enc * (1/6)),
          448))``; the block's decode scale is ``f32(S_dec_b) * (1/S_enc)`` and its encode scale
          ``min(1 / that, FLT_MAX)``.  Underflowing blocks get ``S_dec_b = 0`` and decode to 0.

A NaN or inf anywhere in a block gives that block a NaN scale: the whole block decodes to NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from snip.errors import UserError
from snip.formats.cast import DEFAULT_COUNTERS, Counters
from snip.formats.spec import E8M0Rule, QuantSpec, ScaleFormat, Scaling

FLT_MAX = torch.finfo(torch.float32).max
FLT_MIN_NORMAL = torch.finfo(torch.float32).tiny


@dataclass(frozen=True)
class RowShard:
    """A tensor's place in a larger one: it is rows ``start .. start + len - 1`` (along dim 0)
    of a tensor of ``total`` rows, every other dim whole -- e.g. one rank's tokens of the global
    batch.

    Passed to :func:`snip.formats.quantize` (``shard=``), it makes stochastic rounding draw the
    coins the whole tensor would draw at these rows, so that ranks that each quantize their own
    rows together round exactly like one process quantizing all of them.  Block scales are
    still the shard's own: they equal the whole tensor's when no block straddles the shard's
    edges (blocks along other axes, or along dim 0 with ``start`` and the shard's length
    multiples of the block); a per-tensor scale is the shard's own amax.
    """

    start: int
    total: int

    def check(self, rows: int) -> None:
        if not (self.start >= 0 and self.start + rows <= self.total):
            raise ValueError(f"row shard {self}: rows {self.start}..{self.start + rows - 1}"
                             f" do not fit in {self.total}")

    def covers(self, rows: int) -> bool:
        """True when a tensor of ``rows`` rows is the whole larger one: its coins are then the
        ones it draws unplaced (default counters)."""
        return self.start == 0 and self.total == rows


@dataclass(frozen=True)
class BlockLayout:
    """Where the blocks of one tensor are; ``to_blocks`` and ``from_blocks`` are inverses."""

    shape: tuple[int, ...]
    axis: int  # normalised, non-negative
    scaling: Scaling
    block: int  # elements per block along the axis (or tile side for BLOCK2D)

    @staticmethod
    def of(x: torch.Tensor, spec: QuantSpec, axis: int) -> BlockLayout:
        if x.dim() == 0:
            return BlockLayout((), 0, Scaling.TENSOR, 1)
        if not -x.dim() <= axis < x.dim():
            raise UserError(f"axis {axis} is out of range for a {x.dim()}-D tensor")
        axis %= x.dim()
        if spec.scaling is Scaling.BLOCK2D and x.dim() < 2:
            raise UserError(f"spec {spec.name!r} uses 2-D blocks; got a {x.dim()}-D tensor")
        block = {Scaling.CHANNEL: x.shape[axis], Scaling.TENSOR: 1}.get(spec.scaling, spec.block)
        return BlockLayout(tuple(x.shape), axis, spec.scaling, block)

    def counters(self, shard: RowShard | None) -> Counters:
        """The SR counters (:class:`~snip.formats.cast.Counters`) of this layout's blocks view
        (``to_blocks``, row-major) when the tensor is ``shard`` of a larger one."""
        if shard is None or not self.shape:
            return DEFAULT_COUNTERS
        rows, n = self.shape[0], math.prod(self.shape)
        shard.check(rows)
        if shard.covers(rows):
            return DEFAULT_COUNTERS
        if self.scaling is Scaling.TENSOR:  # one row, in the original element order
            return Counters(offset=shard.start * (n // max(1, rows)))
        if self.scaling is Scaling.BLOCK2D:
            raise ValueError("stochastic rounding of a row shard with 2-D tiles is not supported")
        length = self._padded_len(self.shape[self.axis])
        if self.axis != 0:  # dim 0 leads the rows of the blocks view: a plain offset
            per_row0 = n // (rows * self.shape[self.axis]) if n else 0
            return Counters(offset=shard.start * per_row0 * length)
        # blocks along dim 0: each row of the blocks view is a column of the whole tensor
        block = shard.total if self.scaling is Scaling.CHANNEL else self.block
        whole = -(-shard.total // block) * block
        return Counters(offset=shard.start, row=length, stride=whole)

    def _moved(self) -> tuple[int, ...]:
        s = list(self.shape)
        s.append(s.pop(self.axis))
        return tuple(s)

    def _padded_len(self, n: int) -> int:
        return -(-n // self.block) * self.block

    def to_blocks(self, x: torch.Tensor) -> torch.Tensor:
        if self.scaling is Scaling.TENSOR:
            return x.reshape(1, -1)
        x = x.movedim(self.axis, -1)
        if self.scaling is Scaling.BLOCK2D:
            return self._to_tiles(x)
        n = x.shape[-1]
        if n % self.block:
            x = F.pad(x, (0, self._padded_len(n) - n))
        return x.reshape(-1, self.block)

    def _to_tiles(self, x: torch.Tensor) -> torch.Tensor:
        k = self.block
        x = x.reshape(-1, x.shape[-1])
        r, c = x.shape
        x = F.pad(x, (0, self._padded_len(c) - c, 0, self._padded_len(r) - r))
        rb, cb = x.shape[0] // k, x.shape[1] // k
        return x.reshape(rb, k, cb, k).transpose(1, 2).reshape(rb * cb, k * k)

    def from_blocks(self, b: torch.Tensor) -> torch.Tensor:
        if self.scaling is Scaling.TENSOR:
            return b.reshape(self.shape)
        moved = self._moved()
        if self.scaling is Scaling.BLOCK2D:
            k = self.block
            c = moved[-1]
            r = math.prod(moved[:-1])
            rb, cb = self._padded_len(r) // k, self._padded_len(c) // k
            x = b.reshape(rb, cb, k, k).transpose(1, 2).reshape(rb * k, cb * k)[:r, :c]
        else:
            x = b.reshape(*moved[:-1], -1)[..., : moved[-1]]
        return x.reshape(moved).movedim(-1, self.axis)


@dataclass(frozen=True)
class Scales:
    """Per-block scales: ``decode`` multiplies grid values, ``encode`` multiplies data.

    ``stored`` is what real storage keeps (fp32 values, e8m0 biased exponents as uint8, or e4m3
    block scales), ``tensor_scale`` the fp32 second level (NVFP4) or ``None``.
    """

    decode: torch.Tensor  # (n_blocks, 1) fp32
    encode: torch.Tensor  # (n_blocks, 1) fp32
    stored: torch.Tensor
    tensor_scale: torch.Tensor | None = None


def _poison_nonfinite(amax: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(amax), s, torch.full_like(s, float("nan")))


def exp2_int(k: torch.Tensor) -> torch.Tensor:
    """Exact fp32 ``2^k`` for integer ``k`` in [-149, 127], built from bits (no libm)."""
    k = k.to(torch.int32)
    normal = ((k.clamp(min=-126) + 127) * (1 << 23)).view(torch.float32)  # multiply: vectorizes
    if not torch.compiler.is_compiling() and bool((k >= -126).all()):  # eager shortcut only:
        return normal  # a data-dependent branch would stop torch.compile tracing this path
    sub = (torch.ones_like(k) << (k.clamp(-149, -127) + 149)).view(torch.float32)
    return torch.where(k >= -126, normal, sub)


def floor_log2(v: torch.Tensor) -> torch.Tensor:
    """``floor(log2 v)`` from the fp32 exponent field (subnormals and 0 give -127, as torchao)."""
    return ((v.float().view(torch.int32) >> 23) & 0xFF) - 127


def ceil_log2(v: torch.Tensor) -> torch.Tensor:
    """Exact ``ceil(log2 v)`` for finite fp32 ``v >= 0``, clamped below at -127 (0 gives -127)."""
    bits = v.float().view(torch.int32)
    exp, man = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    normal = exp - 127 + (man != 0).to(torch.int32)
    sub = torch.where(man > 0x400000, -126, -127).to(torch.int32)  # v in (2^-127, 2^-126) -> -126
    return torch.where(exp == 0, sub, normal)


def fp32_scales(amax: torch.Tensor, spec: QuantSpec) -> Scales:
    s = amax / spec.element.max_normal
    if spec.pow2_scales:
        s = exp2_int(ceil_log2(s).clamp(-126, 127))
    s = torch.where(amax == 0, torch.ones_like(s), s.clamp(min=FLT_MIN_NORMAL))
    s = _poison_nonfinite(amax, s)
    return Scales(s, 1.0 / s, s)


def e8m0_exponent(amax: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """Unbiased e8m0 exponent per block (int32), clamped to [-127, 127]; exact bit arithmetic."""
    if spec.e8m0_rule is E8M0Rule.FLOOR:
        k = floor_log2(amax) - spec.element.emax
    else:
        k = ceil_log2(amax / spec.element.max_normal)
    return k.clamp(-127, 127)


def e8m0_scales(amax: torch.Tensor, spec: QuantSpec) -> Scales:
    k = e8m0_exponent(amax, spec)
    biased = torch.where(torch.isfinite(amax), k + 127, torch.full_like(k, 255)).to(torch.uint8)
    return e8m0_decode(biased)


def e8m0_decode(biased: torch.Tensor) -> Scales:
    """Scales from stored e8m0 bytes; 0xFF is NaN."""
    k = biased.to(torch.int32) - 127
    s = torch.where(biased == 255, torch.full(k.shape, float("nan"), device=k.device), exp2_int(k))
    return Scales(s, exp2_int(-k), biased)


def nvfp4_encode_scale(x_amax: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """NVFP4's fp32 per-tensor encode scale ``S_enc = min(448*6 / amax, FLT_MAX)`` (1 if 0)."""
    # torch.div, not ``2688.0 / t``: a Python scalar divided by a tensor is computed as
    # ``t.reciprocal() * 2688`` (two roundings), which disagrees with the chain in the last bit.
    num = torch.tensor(448.0 * spec.element.max_normal, dtype=torch.float32, device=x_amax.device)
    s_enc = torch.div(num, x_amax.float()).clamp(max=FLT_MAX)
    return torch.where((x_amax == 0) | (s_enc == 0), torch.ones_like(s_enc), s_enc)


def e4m3_scales(amax: torch.Tensor, s_enc: torch.Tensor, spec: QuantSpec) -> Scales:
    inv_elem = torch.tensor(1.0 / spec.element.max_normal, dtype=torch.float32,
                            device=amax.device)
    block = (amax * (s_enc * inv_elem)).clamp(max=448.0)
    block = torch.where(torch.isfinite(amax), block, torch.full_like(block, float("nan")))
    block = block.to(torch.float8_e4m3fn)
    return e4m3_decode(block, 1.0 / s_enc, amax)


def e4m3_decode(
    block: torch.Tensor, tensor_decode: torch.Tensor, amax: torch.Tensor | None = None
) -> Scales:
    dec = block.float() * tensor_decode
    enc = (1.0 / dec).clamp(max=FLT_MAX)
    if amax is not None:
        dec = _poison_nonfinite(amax, dec)
    return Scales(dec, enc, block, tensor_decode)


def block_amax(blocks: torch.Tensor) -> torch.Tensor:
    """``(n_blocks, 1)`` max-abs of each block (NaN if the block holds a NaN)."""
    if not blocks.numel():
        return blocks.new_zeros(blocks.shape[0], 1)
    return blocks.abs().amax(dim=-1, keepdim=True)


def scales_from_amax(amax: torch.Tensor, spec: QuantSpec) -> Scales:
    """Scales for blocks with the given ``(n_blocks, 1)`` fp32 amax."""
    if spec.scale_format is ScaleFormat.E8M0:
        return e8m0_scales(amax, spec)
    if spec.scale_format is ScaleFormat.E4M3:
        # NaN/inf blocks poison only themselves (as in MX), not the tensor scale of the rest
        finite = torch.where(torch.isfinite(amax), amax, torch.zeros_like(amax))
        x_amax = finite.max() if amax.numel() else amax.new_zeros(())
        return e4m3_scales(amax, nvfp4_encode_scale(x_amax, spec), spec)
    return fp32_scales(amax, spec)
