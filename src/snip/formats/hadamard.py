"""Randomized Hadamard transform (RHT), applied blockwise along one axis.

``R = D H / sqrt(n)`` with ``H`` the n x n Sylvester Hadamard matrix and ``D`` a diagonal of
seeded random signs is orthogonal, so rotating *both* operands of a GEMM along the contraction
axis leaves the product unchanged: ``(X R)(R^T Y) = X Y``.  Quantizing the rotated operands
spreads outliers across the block, which tightens block scales; the NVFP4 recipe applies a 16-point
RHT to the weight-gradient operands and MXFP4 recipes a 32..128-point one.

In fake quantization we rotate, quantize, and rotate back (``R^T``), so the result is an estimate
of ``x`` in its own basis and can be fed to an ordinary matmul.  The axis is zero-padded to a
multiple of ``n``; the padding is cropped after the inverse.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from snip.errors import UserError


@functools.lru_cache(maxsize=32)
def rht_matrix(size: int, seed: int) -> torch.Tensor:
    """The orthogonal matrix ``D H / sqrt(size)`` (fp32, cached)."""
    if size < 1 or size & (size - 1):
        raise UserError(f"Hadamard size must be a power of two, got {size}")
    h = torch.ones(1, 1)
    while h.shape[0] < size:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    g = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (size,), generator=g).float() * 2 - 1
    return (signs[:, None] * h) / size**0.5


@functools.lru_cache(maxsize=32)
def rht_signs(size: int, seed: int) -> torch.Tensor:
    """The diagonal ``D`` of :func:`rht_matrix` (fp32 +-1, cached, on the CPU)."""
    return rht_matrix(size, seed)[:, 0].sign().contiguous()  # column 0 of H is all ones


def _fwht(x: torch.Tensor, size: int) -> torch.Tensor:
    """``x @ H`` over blocks of ``size`` along the last axis, as log2(size) butterfly stages.

    Elementwise adds and subtracts only: the same bits on every device and thread count (a
    matmul's summation order is the BLAS's), which keeps CUDA emulation equal to CPU.
    """
    lead = x.shape[:-1]
    y = x.reshape(-1, x.shape[-1] // size, size)
    h = 1
    while h < size:
        v = y.reshape(y.shape[0], y.shape[1], size // (2 * h), 2, h)
        a, b = v[..., 0, :], v[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2).reshape(y.shape)
        h *= 2
    return y.reshape(*lead, -1)


def _norm(size: int) -> float:
    return 1.0 / size**0.5  # exact for 16 and 64 (powers of two)


def rht(x: torch.Tensor, size: int, seed: int, axis: int) -> torch.Tensor:
    """Rotate ``x`` (fp32) in blocks of ``size`` along ``axis`` (padded to a multiple):
    ``x R = fwht(x D) / sqrt(size)``."""
    x = x.movedim(axis, -1)
    n = x.shape[-1]
    pad = -n % size
    if pad:
        x = F.pad(x, (0, pad))
    d = rht_signs(size, seed).to(device=x.device, dtype=x.dtype)
    blocks = x.reshape(*x.shape[:-1], -1, size) * d
    y = _fwht(blocks.reshape(x.shape), size) * _norm(size)
    return y.movedim(-1, axis)


def irht(y: torch.Tensor, size: int, seed: int, axis: int, length: int) -> torch.Tensor:
    """Inverse of :func:`rht`, cropping the axis to ``length``: ``y R^T = fwht(y) D / sqrt``."""
    y = y.movedim(axis, -1)
    d = rht_signs(size, seed).to(device=y.device, dtype=y.dtype)
    x = _fwht(y, size) * _norm(size)
    x = (x.reshape(*x.shape[:-1], -1, size) * d).reshape(x.shape)[..., :length]
    return x.movedim(-1, axis)
