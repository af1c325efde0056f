"""Element codes and bit packing: the storage side of a quantized tensor.

A code is the format's raw bit pattern as an unsigned integer: sign | exponent | mantissa for
floats (sign-magnitude, so positive codes increase with value), two's complement for integers.
Codes of formats up to 8 bits decode through a lookup table of all ``2^bits`` values; encoding is
a search in the sorted positive half of that table (exact, because quantized values lie on the
grid).  Packing: FP4/INT4 put two codes in a byte with the *even* element in the low nibble
(torchao, Transformer Engine); 6-bit codes go four to three bytes, little-endian.
"""

from __future__ import annotations

import functools

import torch

from snip.errors import UserError
from snip.formats.element import ElementFormat, Kind, Special


@functools.lru_cache(maxsize=64)
def code_table(fmt: ElementFormat) -> torch.Tensor:
    """fp32 value of every code ``0 .. 2^bits - 1`` (NaN where the code is NaN)."""
    if fmt.bits > 8:
        raise UserError(f"{fmt.name}: code tables exist only for formats of at most 8 bits")
    codes = torch.arange(2**fmt.bits, dtype=torch.int64)
    half = 2 ** (fmt.bits - 1)
    if fmt.kind is Kind.INT:
        return torch.where(codes >= half, codes - 2 * half, codes).double().mul(fmt.step).float()
    sign = torch.where(codes >= half, -1.0, 1.0).double()
    mag = codes % half
    exp, man = mag >> fmt.mbits, mag % 2**fmt.mbits
    frac = man.double() / 2**fmt.mbits
    val = torch.where(
        exp == 0, frac * 2.0**fmt.emin, (1 + frac) * torch.exp2((exp - fmt.bias).double())
    )
    top = exp == 2**fmt.ebits - 1
    if fmt.special is Special.IEEE:
        val = torch.where(top, torch.where(man == 0, float("inf"), float("nan")), val)
    elif fmt.special is Special.FN:
        val = torch.where(top & (man == 2**fmt.mbits - 1), float("nan"), val)
    return (sign * val).float()


def encode_codes(q: torch.Tensor, fmt: ElementFormat) -> torch.Tensor:
    """uint8 codes of fp32 values ``q`` that already lie on ``fmt``'s grid."""
    table = code_table(fmt).to(q.device)
    half = 2 ** (fmt.bits - 1)
    if fmt.kind is Kind.INT:
        k = torch.nan_to_num(q / fmt.step).round().to(torch.int64)
        return (k % (2 * half)).to(torch.uint8)
    positive = table[:half]
    n_finite = int(torch.isfinite(positive).sum())
    mag = torch.searchsorted(positive[:n_finite].contiguous(), q.abs().contiguous())
    nan_code = int(torch.nonzero(torch.isnan(positive)).min()) if n_finite < half else 0
    mag = torch.where(torch.isnan(q), torch.full_like(mag, nan_code), mag)
    if fmt.has_inf:
        mag = torch.where(torch.isinf(q), torch.full_like(mag, n_finite), mag)
    sign = torch.signbit(q).to(torch.int64) * half
    return (mag + sign).to(torch.uint8)


def decode_codes(codes: torch.Tensor, fmt: ElementFormat) -> torch.Tensor:
    return code_table(fmt).to(codes.device)[codes.long()]


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack a flat uint8 code vector into bytes (4-bit: even element in the low nibble)."""
    c = codes.reshape(-1)
    if bits == 4:
        if c.numel() % 2:
            c = torch.cat([c, c.new_zeros(1)])
        pair = c.view(-1, 2)
        return pair[:, 0] | (pair[:, 1] << 4)
    if bits == 6:
        c = torch.cat([c, c.new_zeros(-c.numel() % 4)]).view(-1, 4).to(torch.int32)
        word = c[:, 0] | (c[:, 1] << 6) | (c[:, 2] << 12) | (c[:, 3] << 18)
        return torch.stack([(word >> s) & 0xFF for s in (0, 8, 16)], 1).reshape(-1).to(torch.uint8)
    return c.clone()


def unpack(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Inverse of :func:`pack`: the first ``n`` codes."""
    if bits == 4:
        return torch.stack([packed & 0xF, packed >> 4], 1).reshape(-1)[:n]
    if bits == 6:
        b = packed.view(-1, 3).to(torch.int32)
        word = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        return (
            torch.stack([(word >> s) & 0x3F for s in (0, 6, 12, 18)], 1)
            .reshape(-1)[:n]
            .to(torch.uint8)
        )
    return packed[:n]
