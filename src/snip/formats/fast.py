"""Fused CPU kernels for block quantization (numba), bit-identical to the PyTorch path.

The PyTorch path of :func:`snip.formats.quantize` is a dozen elementwise passes over memory
(abs, amax, scale, exponent extraction, magic-number rounding, saturation, sign, rescale).  Here
the same arithmetic runs in two fused passes -- one read for the block amax, one read and one
write for scale -> round -> rescale -- parallel over blocks.  Scales themselves are still computed
by :mod:`snip.formats.scaling` from the amax (they are few), so the only code duplicated here is
the per-element rounding, and the test suite checks that both paths agree bit for bit on every
preset, rounding mode and edge case.

All arithmetic is fp32 (``np.float32`` constants everywhere: a Python float literal would promote
to float64 and change the rounding).  If numba is missing, or ``SNIP_FAST=0`` is set, callers fall
back to the PyTorch path.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from snip.formats.cast import Rounding, uniform_like
from snip.formats.element import ElementFormat, Kind

try:  # numba is a core dependency, but the library must work without it
    import numba
    from numba import njit, prange

    AVAILABLE = True
except ImportError:  # pragma: no cover - exercised only on platforms without numba
    AVAILABLE = False

_CHUNK = 4096  # elements per parallel task when one scale covers a long row


_launched = False


def _follow_torch_threads() -> None:
    """Use as many numba threads as torch does: on a busy machine oversubscribed thread pools
    make small kernels 10-60x slower, and users already tune ``torch.set_num_threads``.

    Launching numba's OpenMP pool calls ``omp_set_num_threads(NUMBA_NUM_THREADS)``, which
    silently resets torch's own thread count (they share libgomp); so the first call launches
    the pool and then restores torch's setting.
    """
    global _launched
    want = torch.get_num_threads()
    if not _launched:
        numba.get_num_threads()  # launches the threading layer
        torch.set_num_threads(want)
        _launched = True
    n = max(1, min(want, numba.config.NUMBA_NUM_THREADS))
    if numba.get_num_threads() != n:
        numba.set_num_threads(n)


def enabled() -> bool:
    return AVAILABLE and os.environ.get("SNIP_FAST", "1") != "0"


def supports(fmt: ElementFormat) -> bool:
    """Small float formats (emax <= 15) and integer formats run in the fused kernel."""
    return fmt.kind is Kind.INT or (fmt.emax <= 15 and fmt.mbits <= 10)


if AVAILABLE:

    @njit(inline="always")
    def _pow2(e):
        return np.int32((e + 127) << 23).view(np.float32)

    @njit(inline="always")
    def _round_elem(v, is_int, mbits, emin, emax, maxn, step, inv_step, sr, u):
        a = np.float32(abs(v))
        if is_int:
            t = a * inv_step
            if sr:
                n = np.float32(np.floor(t))
                if u < t - n:
                    n += np.float32(1.0)
            else:
                n = np.float32(np.rint(t))
            q = n * step
        else:
            e = (a.view(np.int32) >> 23) - 127
            e = min(max(e, emin), emax + 1)
            if sr:
                t = a * _pow2(mbits - e)
                n = np.float32(np.floor(t))
                if u < t - n:
                    n += np.float32(1.0)
                q = n * _pow2(e - mbits)
            else:
                magic = _pow2(e + 23 - mbits)
                q = (a + magic) - magic
        if q > maxn:
            q = maxn
        return np.float32(np.copysign(q, v))

    @njit(parallel=True, cache=True)
    def _quant_rows_rne_float(x, enc, dec, out, mbits, emin, emax, maxn, dequant):
        """The hot case (RNE onto a float grid) without the branches of ``_quant_rows``: about
        25% faster, because the inner loop vectorizes."""
        n, k = x.shape
        for i in prange(n):
            ei = enc[i]
            di = dec[i]
            for j in range(k):
                v = x[i, j] * ei
                a = np.float32(abs(v))
                e = min(max((a.view(np.int32) >> 23) - 127, emin), emax + 1)
                magic = _pow2(e + 23 - mbits)
                q = (a + magic) - magic
                q = np.float32(np.copysign(maxn if q > maxn else q, v))
                out[i, j] = q * di if dequant else q

    @njit(parallel=True, cache=True)
    def _amax_rows(x):
        n, k = x.shape
        out = np.empty(n, np.float32)
        for i in prange(n):
            m = np.float32(0.0)
            bad = False
            for j in range(k):
                a = abs(x[i, j])
                m = a if a > m else m
                bad |= a != a
            out[i] = np.float32(np.nan) if bad else m
        return out

    @njit(parallel=True, cache=True)
    def _quant_rows(
        x, enc, dec, u, out, is_int, mbits, emin, emax, maxn, step, inv_step, sr, dequant
    ):
        n, k = x.shape
        for i in prange(n):
            ei = enc[i]
            di = dec[i]
            for j in range(k):
                uj = u[i, j] if sr else np.float32(0.0)
                q = _round_elem(
                    x[i, j] * ei, is_int, mbits, emin, emax, maxn, step, inv_step, sr, uj
                )
                out[i, j] = q * di if dequant else q


if AVAILABLE:

    @njit(parallel=True, cache=True)
    def _amax_cols(x, k):
        """Per-column amax of each group of ``k`` rows: shape ``(ceil(R/k), C)``."""
        r, c = x.shape
        nb = (r + k - 1) // k
        out = np.zeros((nb, c), np.float32)
        for b in prange(nb):
            bad = np.zeros(c, np.bool_)
            for i in range(b * k, min(r, (b + 1) * k)):
                for j in range(c):
                    a = abs(x[i, j])
                    out[b, j] = a if a > out[b, j] else out[b, j]
                    bad[j] |= a != a
            for j in range(c):
                if bad[j]:
                    out[b, j] = np.float32(np.nan)
        return out

    @njit(parallel=True, cache=True)
    def _quant_cols(x, k, enc, dec, u, out, is_int, mbits, emin, emax, maxn, step, inv_step, sr):
        """Dequantized output for blocks of ``k`` rows per column; scales indexed ``[block, col]``
        (contiguous along the inner loop, so it vectorizes), uniforms ``u[col, row]`` (the torch
        path's draw order)."""
        r, c = x.shape
        nb = enc.shape[0]
        for b in prange(nb):
            for i in range(b * k, min(r, (b + 1) * k)):
                for j in range(c):
                    uj = u[j, i] if sr else np.float32(0.0)
                    q = _round_elem(x[i, j] * enc[b, j], is_int, mbits, emin, emax, maxn, step,
                                    inv_step, sr, uj)
                    out[i, j] = q * dec[b, j]


def quantize_columns(x: torch.Tensor, k: int, scales_fn, fmt: ElementFormat, rounding: Rounding,
                     generator: torch.Generator | None) -> torch.Tensor:
    """Fake-quantize a 2-D tensor with blocks of ``k`` consecutive rows in each column (axis 0),
    without transposing it; same result, bit for bit, as the blocked path."""
    _follow_torch_threads()
    x = x.contiguous()
    r, c = x.shape
    nb = -(-r // k)
    amax = torch.from_numpy(_amax_cols(x.numpy(), k)).T.reshape(-1, 1)
    scales = scales_fn(amax)
    sr = rounding is Rounding.STOCHASTIC
    u = uniform_like(torch.empty(c * nb, k), generator).view(c, nb * k) if sr else torch.empty(1, 1)
    out = torch.empty_like(x)
    f32 = np.float32
    _quant_cols(x.numpy(), k, scales.encode.reshape(c, nb).T.contiguous().numpy(),
                scales.decode.reshape(c, nb).T.contiguous().numpy(), u.numpy(), out.numpy(),
                fmt.kind is Kind.INT, fmt.mbits, fmt.emin, fmt.emax, f32(fmt.max_normal),
                f32(fmt.step), f32(1.0 / fmt.step), sr)
    return out


def _chunked(blocks: torch.Tensor) -> tuple[torch.Tensor, int]:
    """View few long rows as many chunks so that the kernels can run in parallel."""
    n, k = blocks.shape
    if n < 64 and k >= 2 * _CHUNK and k % _CHUNK == 0:
        return blocks.reshape(-1, _CHUNK), k // _CHUNK
    return blocks, 1


def block_amax(blocks: torch.Tensor) -> torch.Tensor:
    """``(n_blocks, 1)`` amax, NaN where a block holds a NaN (same as the PyTorch path)."""
    _follow_torch_threads()
    chunks, per_row = _chunked(blocks.contiguous())
    amax = torch.from_numpy(_amax_rows(chunks.numpy()))
    if per_row > 1:
        amax = amax.view(-1, per_row).amax(dim=1)
    return amax.view(-1, 1)


def quantize_blocks(
    blocks: torch.Tensor,
    encode: torch.Tensor,
    decode: torch.Tensor,
    fmt: ElementFormat,
    rounding: Rounding,
    generator: torch.Generator | None,
    dequant: bool,
) -> torch.Tensor:
    """Round ``blocks * encode`` onto ``fmt`` (saturating); multiply by ``decode`` if asked."""
    _follow_torch_threads()
    blocks = blocks.contiguous()
    sr = rounding is Rounding.STOCHASTIC
    u = uniform_like(blocks, generator) if sr else torch.empty(1, 1)
    chunks, per_row = _chunked(blocks)
    enc = encode.reshape(-1).float()
    dec = decode.reshape(-1).float()
    if per_row > 1:
        enc, dec = enc.repeat_interleave(per_row), dec.repeat_interleave(per_row)
        u = u.reshape(chunks.shape) if sr else u
    out = torch.empty_like(chunks)
    is_int = fmt.kind is Kind.INT
    f32 = np.float32
    if not sr and not is_int:
        _quant_rows_rne_float(
            chunks.numpy(),
            enc.contiguous().numpy(),
            dec.contiguous().numpy(),
            out.numpy(),
            fmt.mbits,
            fmt.emin,
            fmt.emax,
            f32(fmt.max_normal),
            dequant,
        )
        return out.view(blocks.shape)
    _quant_rows(
        chunks.numpy(),
        enc.contiguous().numpy(),
        dec.contiguous().numpy(),
        u.numpy(),
        out.numpy(),
        is_int,
        fmt.mbits,
        fmt.emin,
        fmt.emax,
        f32(fmt.max_normal),
        f32(fmt.step),
        f32(1.0 / fmt.step),
        sr,
        dequant,
    )
    return out.view(blocks.shape)
