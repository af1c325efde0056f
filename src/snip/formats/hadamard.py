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


def rht(x: torch.Tensor, size: int, seed: int, axis: int) -> torch.Tensor:
    """Rotate ``x`` (fp32) in blocks of ``size`` along ``axis`` (padded to a multiple)."""
    x = x.movedim(axis, -1)
    n = x.shape[-1]
    pad = -n % size
    if pad:
        x = F.pad(x, (0, pad))
    r = rht_matrix(size, seed).to(x.device)
    y = (x.reshape(*x.shape[:-1], -1, size) @ r).reshape(x.shape)
    return y.movedim(-1, axis)


def irht(y: torch.Tensor, size: int, seed: int, axis: int, length: int) -> torch.Tensor:
    """Inverse of :func:`rht`, cropping the axis back to ``length``."""
    y = y.movedim(axis, -1)
    r = rht_matrix(size, seed).to(y.device)
    x = (y.reshape(*y.shape[:-1], -1, size) @ r.T).reshape(y.shape)[..., :length]
    return x.movedim(-1, axis)
