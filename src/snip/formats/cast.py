"""Element rounding: put every number of a tensor onto an element format's value set.

No scaling happens here: ``cast(x, "e2m1")`` maps 0.8 to 1.0 and 100 to 6.0 (saturating).  Block
scaling (MX, NVFP4, 1x128 tiles) is built on top of this in :mod:`snip.formats.quantize`.

The math.  For a float format with ``M`` mantissa bits and smallest normal exponent ``emin``, a
magnitude ``a`` in binade ``e = max(floor(log2 a), emin)`` lives on the grid ``n * 2^(e - M)``.
Rounding is therefore "scale by ``2^(M - e)``, round to an integer, scale back", and both scalings
are exact (powers of two).  Round-to-nearest-even uses ``torch.round`` (ties to even); stochastic
rounding rounds up with probability ``frac(t)``, compared with a 16-bit uniform ``u`` that is a
keyed hash of the element's index (:func:`uniform_like`: counter-based like Philox, so the fused
kernels draw the same ``u`` on any number of threads; the stream differs from ``torch.rand``'s).
Rounding up out of the top binade gives a value above ``max_normal``: that is overflow, which
either saturates or becomes inf/NaN as the format's ``Special`` policy says (the ml_dtypes rules).

Two implementations, one contract:

* :func:`cast_reference` computes in float64, where every step above is exact for every format up
  to fp32.  It is slow and obviously correct.
* :func:`cast` is the fast path: native casts for bf16/fp16/fp8 where PyTorch has them, and for
  the other small formats the fp32 "magic number" trick ``(a + C) - C`` with ``C = 2^(e - M + 23)``,
  which makes the FPU's own round-to-nearest-even drop exactly the bits below ``2^(e - M)``.
  Tests check it is bit-identical to the reference and to ml_dtypes.

NaN in gives NaN out, always -- also for formats with no NaN code, where ml_dtypes would return
-0.0: a fake number would hide a bug, the caller's dtype can carry the NaN.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

import torch

from snip.formats.element import ElementFormat, Kind, Special, get_element
from snip.formats.rounding import Rounding, as_rounding


def check_float_tensor(x: torch.Tensor) -> None:
    """Integer and bool tensors are rejected: rounding them onto a float grid is a caller bug."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"snip quantizes floating-point tensors; got dtype {x.dtype}")


def make_generator(
    generator: torch.Generator | int | None, device: torch.device
) -> torch.Generator | None:
    """Accept a ``torch.Generator``, an integer seed, or ``None`` (global RNG).

    An integer seed always makes a *CPU* generator, whatever ``device`` the data is on: the
    generator only draws the two-word key of the counter hash (:func:`draw_key`), so the same
    seed gives the same stochastic rounding on CPU and CUDA, bit for bit.
    """
    if generator is None or isinstance(generator, torch.Generator):
        return generator
    if isinstance(generator, bool) or not isinstance(generator, int):
        raise TypeError(
            f"generator must be a torch.Generator, an int seed or None, not {generator!r}"
        )
    g = torch.Generator(device="cpu")
    g.manual_seed(generator)
    return g


# Counter-based uniforms: u = hash(key, element index), so that the fused kernels
# (snip.formats.fast) can draw the same numbers in any order, on any number of threads.
_M32 = 0xFFFFFFFF
_HASH_A, _HASH_B = 0x21F0AAAD, 0x735A2D97  # C. Wellons' low-bias 32-bit mixer (both < 2^31)
_GOLDEN = 0x9E3779B9


def _hash32(h: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer on int64 tensors holding values in ``[0, 2^32)``; products stay
    below 2^63 (both multipliers are < 2^31), so no int64 arithmetic overflows."""
    h = h ^ (h >> 16)
    h = (h * _HASH_A) & _M32
    h = h ^ (h >> 15)
    h = (h * _HASH_B) & _M32
    return h ^ (h >> 15)


def draw_key(generator: torch.Generator | None) -> tuple[int, int]:
    """Two 31-bit words from ``generator``: one call's key.

    ``None`` draws from the global *CPU* RNG whatever device the data is on (``torch.manual_seed``
    seeds it), so a seeded run rounds identically on CPU and CUDA; a CUDA generator draws on its
    own device (a different stream than a CPU generator with the same seed).
    """
    device = generator.device if generator is not None else torch.device("cpu")
    k = torch.randint(0, 1 << 31, (2,), generator=generator, device=device).tolist()
    return int(k[0]), int(k[1])


_SEEDED = threading.local()  # .g: this thread's generator for seed_key


def seed_key(seed: int) -> tuple[int, int]:
    """The key an integer seed gives, ``draw_key(make_generator(seed))``, from one generator
    per thread re-seeded (making a fresh ``torch.Generator`` per call costs more)."""
    g = getattr(_SEEDED, "g", None)
    if g is None:
        g = _SEEDED.g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return draw_key(g)


def counter_uniforms(index: torch.Tensor, key: tuple[int, int]) -> torch.Tensor:
    """U[0, 1) fp32 with 16 random bits for each int64 ``index``: a keyed hash, no state.

    Two elements share one 32-bit hash of their pair counter ``p = index >> 1``:
    ``h = mix(mix(lo ^ k0) + k1 + hi * golden)`` (``lo``/``hi`` the 32-bit halves of ``p``), and
    ``u = ((h >> (16 * (index & 1))) & 0xFFFF) * 2^-16``.  The definition, and why 16 bits are
    enough, is :func:`snip.formats.fast.sr_uniform_reference`; the fused kernels compute the same.
    """
    k0, k1 = key
    p = index >> 1
    lo, hi = p & _M32, p >> 32
    h = _hash32(lo ^ k0)
    h = _hash32((h + k1 + ((hi * _GOLDEN) & _M32)) & _M32)
    return ((h >> ((index & 1) * 16)) & 0xFFFF).to(torch.float32) * (2.0**-16)


@dataclass(frozen=True)
class Counters:
    """Which stochastic-rounding counter each element of a tensor draws.

    Element ``p`` (row-major) of a tensor viewed as rows of ``row`` elements gets the counter
    ``offset + (p // row) * stride + p % row``; ``row == 0`` means one row (``offset + p``).
    The default, ``Counters()``, is ``p`` itself.  A shard of a larger tensor passes its place
    in the larger one, and then draws exactly the coins the whole tensor draws there
    (:class:`snip.formats.scaling.RowShard` computes these for a block layout).
    """

    offset: int = 0
    row: int = 0
    stride: int = 0

    def __post_init__(self) -> None:
        if self.offset < 0 or self.row < 0 or (self.row and self.stride < self.row):
            raise ValueError(f"invalid SR counters {self}: need offset >= 0 and stride >= row")

    def index(self, n: int, device: torch.device | str) -> torch.Tensor:
        """The int64 counters of elements ``0 .. n - 1``."""
        p = torch.arange(n, device=device, dtype=torch.int64)
        if self.row == 0 or self.stride == self.row:
            return p + self.offset
        return self.offset + torch.div(p, self.row, rounding_mode="floor") * self.stride \
            + p % self.row


DEFAULT_COUNTERS = Counters()


def uniform_like(x: torch.Tensor, generator: torch.Generator | None,
                 counters: Counters = DEFAULT_COUNTERS) -> torch.Tensor:
    """U[0, 1) draws in fp32, one per element: the stochastic-rounding coin.

    Counter-based: element ``p`` of ``x`` (row-major order) gets ``counter_uniforms(c(p), key)``
    with one key drawn from ``generator`` per call, where ``c`` is ``counters`` (by default
    ``c(p) = p``).  Reproducible from a seed and identical however the work is split across
    threads; the stream is *not* ``torch.rand``'s.
    """
    key = draw_key(generator)
    return counter_uniforms(counters.index(x.numel(), x.device), key).view(x.shape)


_NATIVE = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
    "e4m3": torch.float8_e4m3fn,
    "e5m2": torch.float8_e5m2,
}


# --------------------------------------------------------------------------------------------
# Reference path (float64, exact)
# --------------------------------------------------------------------------------------------


def _grid_round(t: torch.Tensor, rounding: Rounding, u: torch.Tensor | None) -> torch.Tensor:
    """Round ``t >= 0`` (already expressed in grid units) to an integer."""
    if rounding is Rounding.RNE:
        return torch.round(t)
    n = torch.floor(t)
    return n + (u.to(t.dtype) < (t - n)).to(t.dtype)


def _overflow(q: torch.Tensor, a: torch.Tensor, fmt: ElementFormat, saturate: bool) -> torch.Tensor:
    """Apply the overflow policy to rounded magnitudes ``q`` of inputs ``a`` (both >= 0 or NaN)."""
    over = q > fmt.max_normal  # inf inputs land here too
    if saturate or fmt.special is Special.NONE:
        return torch.where(over, torch.full_like(q, fmt.max_normal), q)
    if fmt.special is Special.IEEE:
        return torch.where(over, torch.full_like(q, float("inf")), q)
    return torch.where(over, torch.full_like(q, float("nan")), q)


def _ldexp_f64(a: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``a * 2^k`` for float64 ``a`` and int64 ``k`` in [-2044, 2046], exactly (barring under- and
    overflow of the result), as two multiplications by powers of two built from bits: the same
    bits on every device (``torch.ldexp`` goes through ``pow``, whose accuracy is the device's)."""
    k1 = k >> 1
    k2 = k - k1
    return a * ((k1 + 1023) << 52).view(torch.float64) * ((k2 + 1023) << 52).view(torch.float64)


def cast_reference(
    x: torch.Tensor,
    element: ElementFormat | str,
    rounding: Rounding | str = "rne",
    saturate: bool = True,
    generator: torch.Generator | int | None = None,
    counters: Counters = DEFAULT_COUNTERS,
) -> torch.Tensor:
    """Slow, obviously-correct :func:`cast` (float64 arithmetic)."""
    check_float_tensor(x)
    fmt, mode = get_element(element), as_rounding(rounding)
    u = (
        uniform_like(x, make_generator(generator, x.device), counters)
        if mode is Rounding.STOCHASTIC
        else None
    )
    a = x.double().abs()
    if fmt.kind is Kind.INT:
        q = _grid_round(a / fmt.step, mode, u).clamp(max=fmt.int_max) * fmt.step
    else:
        safe = torch.where(torch.isfinite(a) & (a > 0), a, torch.ones_like(a))
        e = (torch.frexp(safe).exponent - 1).clamp(min=fmt.emin)
        k = (fmt.mbits - e).to(torch.int64)
        q = _ldexp_f64(_grid_round(_ldexp_f64(a, k), mode, u), -k)
        q = torch.where(torch.isinf(a), a, q)
        q = _overflow(q, a, fmt, saturate)
    return torch.copysign(q, x.double()).to(x.dtype)


# --------------------------------------------------------------------------------------------
# Fast path
# --------------------------------------------------------------------------------------------


def _pow2_f32(exponent: torch.Tensor) -> torch.Tensor:
    """``2.0 ** exponent`` for int32 exponents in the normal fp32 range, built from bits."""
    return ((exponent + 127) << 23).view(torch.float32)


def _round_small_float(
    a: torch.Tensor, fmt: ElementFormat, mode: Rounding, u: torch.Tensor | None
) -> torch.Tensor:
    """Round fp32 magnitudes ``a`` onto a small float format (emax <= 15), before overflow."""
    e = ((a.view(torch.int32) >> 23) - 127).clamp_(fmt.emin, fmt.emax + 1)
    if mode is Rounding.RNE:
        magic = _pow2_f32(e + (23 - fmt.mbits))
        return (a + magic) - magic
    t = a * _pow2_f32(fmt.mbits - e)
    return _grid_round(t, mode, u) * _pow2_f32(e - fmt.mbits)


_MANTISSA_BITS = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23}


@functools.cache
def saturation(fmt: ElementFormat, dtype: torch.dtype) -> float:
    """What ``saturate=True`` clamps to for a result held in ``dtype``: the largest value on
    both ``fmt``'s grid and ``dtype``'s, i.e. the smaller max rounded toward zero onto the
    coarser mantissa: ``fmt``'s max where ``dtype`` holds it, 65280 for bf16 held in fp16 and
    for fp16 held in bf16, the bf16 max for fp32 held in bf16."""
    carrier = _MANTISSA_BITS.get(dtype)
    if not fmt.is_float or carrier is None:  # (float64 holds every format's max exactly)
        return fmt.max_normal
    top = min(fmt.max_normal, torch.finfo(dtype).max)
    bits = torch.tensor(top, dtype=torch.float32).view(torch.int32).item()
    drop = 23 - min(fmt.mbits, carrier)
    return torch.tensor(bits >> drop << drop, dtype=torch.int32).view(torch.float32).item()


def cast(
    x: torch.Tensor,
    element: ElementFormat | str,
    rounding: Rounding | str = "rne",
    saturate: bool = True,
    generator: torch.Generator | int | None = None,
    counters: Counters = DEFAULT_COUNTERS,
) -> torch.Tensor:
    """Round each element of ``x`` onto ``element``'s value set; same shape and dtype as ``x``.

    ``saturate=True`` clamps overflow (and +/-inf) to +/-max; ``saturate=False`` follows ml_dtypes:
    inf for IEEE formats, NaN for e4m3, clamping for formats without special values.  Integer
    formats always clamp.  ``generator`` (a ``torch.Generator`` or an int seed) makes stochastic
    rounding reproducible; ``counters`` says which SR coin each element draws (:class:`Counters`).
    The values are data: the result carries no gradient (``snip.quantize`` is the one with a
    straight-through gradient).  Where ``x``'s dtype cannot hold ``element``'s max (bf16 in
    fp16, fp32 in bf16), saturation stops at the largest grid value it can (`saturation`).
    """
    check_float_tensor(x)
    x = x.detach()
    fmt, mode = get_element(element), as_rounding(rounding)
    native = _NATIVE.get(fmt.name)
    if x.dtype == torch.float64:
        # torch rounds float64 -> fp16/bf16/fp8 through float32 (double rounding); the
        # reference computes in float64, where each value is rounded once, exactly.
        return cast_reference(x, fmt, mode, saturate, generator, counters)
    if mode is Rounding.RNE and native is not None and (saturate or native.itemsize >= 2):
        top = saturation(fmt, x.dtype)
        if native is torch.float32 and x.dtype in (torch.float32, torch.bfloat16, torch.float16):
            y = x
        else:
            # torch's fp8 casts saturate finite overflow; clamping first makes that explicit and
            # maps inf to max as well, matching the reference.
            src = x.clamp(-top, top) if saturate else x
            y = src.to(native).to(x.dtype)
        return y.clamp(-top, top) if saturate else y
    if fmt.is_float and fmt.emax > 15:
        y = cast_reference(x, fmt, mode, saturate, generator, counters)
        top = saturation(fmt, x.dtype)  # (below fmt's max: what x.dtype holds of its grid)
        return y.clamp(-top, top) if saturate and top < fmt.max_normal else y
    xf = x.float()
    u = (
        uniform_like(xf, make_generator(generator, x.device), counters)
        if mode is Rounding.STOCHASTIC
        else None
    )
    a = xf.abs()
    if fmt.kind is Kind.INT:
        q = _grid_round(a * (1.0 / fmt.step), mode, u).clamp_(max=fmt.int_max) * fmt.step
    else:
        q = _overflow(_round_small_float(a, fmt, mode, u), a, fmt, saturate)
    return torch.copysign(q, xf).to(x.dtype)
