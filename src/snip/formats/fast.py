"""Fused CPU kernels for quantization (numba), bit-identical to the PyTorch path.

The PyTorch path of :func:`snip.formats.quantize` is a dozen elementwise passes over memory
(abs, amax, scale, exponent extraction, magic-number rounding, saturation, sign, rescale) and as
many temporaries.  :func:`quantize_fused` does the same arithmetic in one pass for tensor,
per-channel and 1-D block scaling along any axis, on fp32 or bf16 input:

* each parallel task takes a run of blocks (~16 KiB), computes their amaxes (as integer maxima
  of ``|x|`` bit patterns in LLVM vector IR, eight blocks at a time: :func:`_maxima`), their
  scales (:func:`_block_scale` repeats :mod:`snip.formats.scaling` operation for operation:
  fp32, e8m0 floor/rceil, NVFP4's e4m3 under an fp32 tensor scale -- the latter two in
  branch-free loops over blocks), and rounds and rescales the run, storing straight into the
  output (bf16 stores round to nearest even like torch): whole blocks of 16, 32 or 128 block by
  block with scalar scales in loops of constant trip count (one branch per size), other blocks
  of 64 or more block by block, shorter ones after broadcasting the scales into L1 (one straight
  vectorized loop); rows shorter than half a run with blocks of 64 or more (1x128 blocks over a
  64-wide row) go several rows a task (:func:`_fused_short_rows`), not one task and three
  allocations per row.  Per-tensor scaling and NVFP4 read the input twice (the tensor amax
  first); NVFP4's first pass also stores every block's maximum, so the second pass only computes
  scales and rounds;
* blocks along a middle axis (axis 0 of a matrix: the weight-gradient operands) are handled
  without a transpose: a task takes ``k`` rows and keeps one scale per column; 2-D weight tiles
  (NVFP4 16x16, 128x128) likewise, one row of tiles per task (round-to-nearest-even only);
* the element's binade and grid step are computed in i32 LLVM IR (:func:`_pow2_up`): numba
  widens small-integer arithmetic to i64, which cost more vector instructions than the rounding;
* stochastic rounding draws a 16-bit ``u`` from a keyed counter hash of the element's index in
  the padded blocks layout, one 32-bit hash per pair of elements (:func:`sr_uniform_reference`
  is the definition; here as i32 LLVM IR so that it vectorizes): the same numbers whatever the
  thread count, and the reference path (:func:`snip.formats.cast.counter_uniforms`) draws them
  too.  The kernels hash up to 64 pairs (or a row pair's columns) into an L1 buffer that the
  rounding loops read, on a 32-bit counter within runs that share the counter's high word,
  and round up as ``ceil(t - u)`` (the reference's ``floor(t) + (u < frac(t))``, exactly);
* the output (the only large allocation) comes from :class:`_BufferCache`, which recycles
  snip's own freed output buffers: a fresh 64 MiB allocation page-faults for 5-20x longer than
  the quantization takes in this project's VMs, and library users do not call
  ``snip.runtime.tune_malloc()``.

Everything a call needs besides the data is worked out once per kind of call (spec, shape, axis,
rounding, SR counters, dtypes) and kept (:class:`_FusedCall`); :func:`planned` keeps the choice
of kernel with it, so that a GEMM operand's call is one look-up before the kernel runs.  A call
on one thread runs its kernel's one-thread twin (:func:`_one_thread_twin`: the same code
compiled without numba's parallel region), the same bits.

The older two-pass kernels (``_amax_rows``/``_quant_rows``/``_quant_cols``) still serve
:func:`snip.formats.encode` and stochastically rounded 2-D weight tiles.  All arithmetic is
fp32 (``np.float32`` constants everywhere: a Python float literal would promote to float64 and
change the rounding), with IEEE division (``error_model="numpy"``).  If numba is missing, or
``SNIP_FAST=0`` is set, callers fall back to the PyTorch path; the test suite checks that both
paths agree bit for bit on every preset, rounding mode, axis, input dtype and edge case.

The CPU model LLVM tunes the kernels for (:func:`numba_cpu`): ``x86-64-v3`` (AVX2-era scheduling
and cost model) where the host's own model is an Intel AVX-512 one, with the host's instruction
set either way.  On a Sapphire Rapids Xeon that made 88 of 140 kinds of call 6-36 % faster and none
slower (RESULTS §7i); ``SNIP_NUMBA_CPU=host`` keeps numba's default.
"""

from __future__ import annotations

import ctypes
import enum
import functools
import math
import os
import statistics
import threading
import time
import weakref
from collections.abc import Callable
from types import FunctionType

import numpy as np
import torch

from snip.formats.cast import DEFAULT_COUNTERS, Counters, Rounding, draw_key
from snip.formats.cast import seed_key as torch_seed_key
from snip.formats.element import ElementFormat, Kind
from snip.formats.scaling import BlockLayout, RowShard, fp32_scales
from snip.formats.spec import E8M0Rule, QuantSpec, ScaleFormat, Scaling

# LLVM's host-CPU models of Intel CPUs with AVX-512: numba's code tuned for them was slower
# than tuned for x86-64-v3 on a Sapphire Rapids Xeon (detected as rocketlake; RESULTS §7i)
_INTEL_AVX512_MODELS = frozenset({
    "skylake-avx512", "cascadelake", "cooperlake", "cannonlake", "icelake-client",
    "icelake-server", "tigerlake", "rocketlake", "sapphirerapids", "emeraldrapids",
    "graniterapids", "graniterapids-d", "diamondrapids"})


def _host_cpu_model() -> str:
    """LLVM's name for this CPU (what numba tunes for by default); "" if unknown."""
    try:
        import llvmlite.binding as ll
        return ll.get_host_cpu_name()
    except Exception:  # noqa: BLE001 - no llvmlite (no numba): nothing to tune
        return ""


def numba_cpu() -> str | None:
    """Set the LLVM CPU model numba compiles for, ``NUMBA_CPU_NAME``, before numba is imported
    (it rereads the variable before each compilation, and keys its cache on it).

    By default ``x86-64-v3`` where numba would tune for an Intel AVX-512 model (measured slower:
    :data:`_INTEL_AVX512_MODELS`), else numba's own choice.  ``SNIP_NUMBA_CPU`` overrides: a
    model name, or ``host`` (numba's choice, the host CPU's model); a ``NUMBA_CPU_NAME`` the user
    set wins over both.  Only the tuning changes (instruction scheduling, the vectorizer's
    costs): numba still enables exactly the host's instruction-set features, so the code runs
    on this CPU and computes the same bits.  Returns the model set (``None``: the host's)."""
    choice = os.environ.get("SNIP_NUMBA_CPU")
    if "NUMBA_CPU_NAME" in os.environ or choice == "host":
        return os.environ.get("NUMBA_CPU_NAME")
    if choice is None:
        if _host_cpu_model() not in _INTEL_AVX512_MODELS:
            return None
        choice = "x86-64-v3"
    os.environ["NUMBA_CPU_NAME"] = choice
    return choice


numba_cpu()

try:  # numba is a core dependency, but the library must work without it
    import numba
    from llvmlite import ir
    from numba import njit, prange, types
    from numba.core import cgutils
    from numba.extending import intrinsic, overload

    AVAILABLE = True
except ImportError:  # pragma: no cover - exercised only on platforms without numba
    AVAILABLE = False

_CHUNK = 4096  # elements per parallel task when one scale covers a long row
_SR_GROUP = 64  # pairs hashed into an L1 buffer at a time by the SR span
_LONG_BLOCK = 64  # blocks at least this long are rounded block by block (no broadcast scales)


_launched = False
# elements from which a kernel uses torch's thread count (below: one thread).  2^20 protects a
# loaded machine, where waking a second thread can cost more than a small tensor's work; on a
# quiet one 2^16 makes a 2-thread training step 11-17 % faster (benchmarks/bench_parallel_min.py,
# RESULTS §7e).  So by default a call of ``_ADAPT_MIN`` elements or more but under
# ``_PARALLEL_MIN`` tries both ways and keeps the faster (:class:`_ThreadChoice`);
# ``SNIP_PARALLEL_MIN`` fixes the threshold instead, for a user who knows their machine.
_PARALLEL_MIN = int(os.environ.get("SNIP_PARALLEL_MIN", str(1 << 20)))
_ADAPT = "SNIP_PARALLEL_MIN" not in os.environ
_ADAPT_MIN = 1 << 14  # below: ~10 us of work, which a second thread cannot shorten
# one-thread fused calls (:class:`_FusedCall`, :func:`round_bf16`: every GEMM operand's) run
# their kernel's one-thread twin (:func:`_one_thread_twin`), not the parallel build with a
# one-thread region; ``SNIP_SERIAL_KERNELS=0`` runs the parallel builds
_TWINS = os.environ.get("SNIP_SERIAL_KERNELS", "1") != "0"
_set_here = threading.local()  # .n: the numba thread count this thread last set (thread-local)


class _ThreadChoice:
    """One kind of quantizer call (a plan) of middle size: one thread or all of torch's?

    The first two calls warm both ways up, untimed (a kind's first call pays for cold buffers
    and caches: at times thousands of times its later cost).  The next ``2 * PROBES`` calls
    alternate the two, timed (wall clock, the kernel call alone); then all threads run unless
    their median call took over ``TIE`` x the median one-thread call, or one of their calls
    waited for a thread: over ``STALL`` x their median and ``STALL_S`` seconds above it (on a
    loaded machine a parallel region now and then waits a scheduler tick for a thread, 4-40 ms
    in RESULTS §7ba, and a one-thread call is the safe side).  Medians, because one lucky or
    unlucky call must not decide it.  A tie goes to all threads: a call that keeps torch's
    other threads busy saves their wake-up in the ops around it, so that on a quiet 2-thread
    machine every call on all threads was 0.04-0.08 of the fp32 step faster than choosing each
    kind by its own calls' time with a 0.8 margin, the rule before (RESULTS §7ba).  Every
    ``EVERY`` calls both are tried again, so a machine that gets busy (or quiet) is followed.
    The result does not depend on the thread count (the kernels' contract), so this only
    moves time."""

    PROBES = 4  # timed calls of each kind
    WARM = 2  # untimed calls before the first probes (one each way)
    EVERY = 256  # calls between two rounds of probes
    TIE = 1.25  # all threads unless their median probe took over TIE x the one-thread median
    STALL, STALL_S = 2.0, 5e-4  # a probe over STALL x the parallel median and STALL_S above it

    __slots__ = ("times", "calls", "parallel")

    def __init__(self) -> None:
        self.times: tuple[list[float], list[float]] = ([], [])  # one thread, all threads
        self.calls = -self.WARM
        self.parallel = False

    def pick(self) -> bool:
        """Whether this call runs on all threads."""
        k = self.calls % self.EVERY
        if k < 2 * self.PROBES or self.calls < 0:
            return k % 2 == 1
        return self.parallel

    def record(self, parallel: bool, seconds: float) -> None:
        k = self.calls % self.EVERY
        self.calls += 1
        if k >= 2 * self.PROBES:  # (and the warm-up calls: their k is EVERY - WARM and up)
            return
        if k == 0:
            self.times = ([], [])
        self.times[parallel].append(seconds)
        one, every = self.times
        # both lists are checked: two Python threads sharing this plan can interleave probes
        if k == 2 * self.PROBES - 1 and one and every:
            mid = statistics.median(every)
            waited = max(every) > max(self.STALL * mid, mid + self.STALL_S)
            self.parallel = not waited and mid <= self.TIE * statistics.median(one)

    def threads(self, n: int) -> tuple[bool | None, bool]:
        """Set numba's thread count for a call of ``n`` elements (all of torch's threads from
        ``_PARALLEL_MIN`` up; between ``_ADAPT_MIN`` and it, as this choice says).  Returns
        whether it runs on all threads when the call is to be timed for :meth:`record` (else
        ``None``), and whether it is to run the one-thread twins (:data:`_TWINS` and one
        thread)."""
        adapt = _ADAPT and _ADAPT_MIN <= n < _PARALLEL_MIN and torch.get_num_threads() > 1
        parallel = self.pick() if adapt else n >= _PARALLEL_MIN
        one = _follow_torch_threads(n, parallel) == 1 and _TWINS
        return (parallel if adapt else None), one


def _follow_torch_threads(numel: int | None = None, parallel: bool | None = None) -> int:
    """Use as many numba threads as torch does: on a busy machine oversubscribed thread pools
    make small kernels 10-60x slower, and users already tune ``torch.set_num_threads``.
    Returns the count set.

    Launching numba's OpenMP pool calls ``omp_set_num_threads(NUMBA_NUM_THREADS)``, which
    silently resets torch's own thread count (they share libgomp); so the first call launches
    the pool and then restores torch's setting.  numba's count is per thread; each thread
    remembers what it last set, so a call that changes nothing costs one attribute read.
    """
    global _launched
    want = torch.get_num_threads()
    if parallel is None:
        parallel = numel is None or numel >= _PARALLEL_MIN
    if not parallel:
        # a parallel region costs a wake-up of every thread; on a loaded machine the slowest
        # thread's scheduling delay (ms) dwarfs a small tensor's work (tens of us)
        n = 1
    else:
        n = max(1, min(want, numba.config.NUMBA_NUM_THREADS))
    if _launched and getattr(_set_here, "n", None) == n:
        return n
    if not _launched:
        numba.get_num_threads()  # launches the threading layer
        torch.set_num_threads(want)
        _launched = True
    if numba.get_num_threads() != n:
        numba.set_num_threads(n)
    _set_here.n = n
    return n


# ---------------------------------------------------------------------------------------------
# The stochastic-rounding random stream (one definition; every implementation must match it)
# ---------------------------------------------------------------------------------------------

SR_MIX_A, SR_MIX_B = 0x21F0AAAD, 0x735A2D97  # C. Wellons' "lowbias32" multipliers
SR_GOLDEN = 0x9E3779B9
SR_BITS = 16  # random bits per element
SR_U_SCALE = 2.0**-SR_BITS


def _mix32(h: int) -> int:
    h ^= h >> 16
    h = (h * SR_MIX_A) & 0xFFFFFFFF
    h ^= h >> 15
    h = (h * SR_MIX_B) & 0xFFFFFFFF
    return h ^ (h >> 15)


def sr_uniform_reference(key: tuple[int, int] | int, index: int) -> float:
    """The stochastic-rounding coin ``u`` in [0, 1) of element ``index`` under ``key``.

    This is *the* definition (pure Python); the numba kernels (``_u16`` per element,
    ``_pair_hash32`` per pair on a 32-bit counter),
    :func:`snip.formats.cast.counter_uniforms` (torch) and any GPU port must return the same
    bits.  ``key = (k0, k1)`` is drawn once per quantize call by
    :func:`snip.formats.cast.draw_key` (two ``torch.randint(0, 2**31)`` words from the call's
    generator); an ``int`` seed here means ``draw_key(torch.Generator().manual_seed(seed))``.
    ``index`` is the element's position in the padded blocks layout (row-major, int64).
    All arithmetic is on unsigned 32-bit words, wrapping::

        p      = index >> 1                   # two elements share one hash ("pair counter")
        lo, hi = p & 0xFFFFFFFF, p >> 32
        h      = mix32(lo ^ k0)
        h      = mix32((h + k1 + hi * 0x9E3779B9) mod 2^32)
        bits   = (h >> (16 * (index & 1))) & 0xFFFF    # even index: low half, odd: high half
        u      = bits * 2^-16

    ``mix32`` is lowbias32: ``h ^= h >> 16; h *= 0x21F0AAAD; h ^= h >> 15; h *= 0x735A2D97;
    h ^= h >> 15``.  Element ``x`` rounds up iff ``u < frac(x / ulp)`` (the fractional part
    computed exactly in fp32).

    Why 16 bits are enough: the probability of rounding up becomes ``ceil(frac * 2^16) /
    2^16`` instead of ``frac``, a bias below ``2^-16`` of one step of the target grid.  For
    FP8/FP4 elements (at most 3 mantissa bits) that is ``2^-19`` of the value or less, below
    the fp32 rounding of the scaled inputs' fractions for most values, and far below the
    ``step / sqrt(n)`` noise of any mean the tests (or training) can observe; for bf16 targets
    (7 bits) the fraction itself has at most 16 bits, so the coin is exact.  Sharing one 32-bit
    hash between two elements halves the hashing work, which was as large as the rounding.
    """
    if isinstance(key, int):
        key = draw_key(torch.Generator().manual_seed(key))
    k0, k1 = key
    p = index >> 1
    lo, hi = p & 0xFFFFFFFF, (p >> 32) & 0xFFFFFFFF
    h = _mix32(lo ^ k0)
    h = _mix32((h + k1 + hi * SR_GOLDEN) & 0xFFFFFFFF)
    return ((h >> (16 * (index & 1))) & 0xFFFF) * SR_U_SCALE


def seed_key(seed: int) -> tuple[int, int]:
    """:func:`snip.formats.cast.seed_key` (the key a CPU generator seeded with ``seed`` draws),
    computed without the generator: about 0.9 us instead of 3.3, and several times that saved
    in a training step, where every stochastically rounded operand makes one (RESULTS §7k).

    Torch's CPU generator is MT19937: ``manual_seed(seed)`` initialises it from ``seed mod
    2^32`` (the reference ``init_genrand``), and ``randint(0, 2^31)`` into int64 draws 64 bits
    (two 32-bit outputs) per element and keeps the low 31 bits of the second.  So the key's
    words are outputs 2 and 4, which need only state words 1-4, 398 and 400
    (:func:`_mt19937_key`).  A test checks this against torch's generator."""
    if not AVAILABLE:
        return torch_seed_key(seed)
    return _mt19937_key(seed & 0xFFFFFFFF)


if AVAILABLE:

    @njit(inline="always", error_model="numpy")
    def _mt_output(u, v, w):
        """MT19937's output for the new state word ``w ^ twist(u, v)``, tempered, mod 2^31
        (uint64 arithmetic masked to 32 bits)."""
        y = ((u & np.uint64(0x80000000)) | (v & np.uint64(0x7FFFFFFF))) >> np.uint64(1)
        if v & np.uint64(1):
            y ^= np.uint64(0x9908B0DF)
        y ^= w
        y ^= y >> np.uint64(11)
        y ^= (y << np.uint64(7)) & np.uint64(0x9D2C5680)
        y ^= (y << np.uint64(15)) & np.uint64(0xEFC60000)
        y ^= y >> np.uint64(18)
        return y & np.uint64(0x7FFFFFFF)

    @njit(cache=True, error_model="numpy")
    def _mt19937_key(seed):
        """Outputs 2 and 4 of MT19937 after ``init_genrand(seed)``, each mod 2^31."""
        m32 = np.uint64(0xFFFFFFFF)
        x = np.uint64(seed) & m32
        s1, s2, s3, s4, s398 = x, x, x, x, x
        for j in range(1, 401):  # init_genrand up to word 400
            x = (np.uint64(1812433253) * (x ^ (x >> np.uint64(30))) + np.uint64(j)) & m32
            if j == 1:
                s1 = x
            elif j == 2:
                s2 = x
            elif j == 3:
                s3 = x
            elif j == 4:
                s4 = x
            elif j == 398:
                s398 = x
        return int(_mt_output(s1, s2, s398)), int(_mt_output(s3, s4, x))


def _env_reader(name: str) -> Callable[[], str | None]:
    """A function reading environment variable ``name`` now, as ``os.environ.get`` does.

    ``os.environ.get`` encodes the key and decodes the value in Python on every call: 0.6 us
    alone, several times that in a training step, and :func:`enabled` runs once per quantizer
    call.  So where CPython's ``os.environ`` keeps its encoded dictionary (``_data``), the read
    is one dictionary look-up there; every change through ``os.environ`` (``monkeypatch.setenv``
    included) lands in that dictionary."""
    env = os.environ
    data = getattr(env, "_data", None)
    try:
        key, decode = env.encodekey(name), env.decodevalue  # type: ignore[attr-defined]
    except AttributeError:
        data = None
    if not isinstance(data, dict):
        return lambda: env.get(name)

    def read() -> str | None:
        v = data.get(key)
        return None if v is None else decode(v)
    return read


_snip_fast_env = _env_reader("SNIP_FAST")


def enabled() -> bool:
    """Whether the fused kernels run (numba is there and ``SNIP_FAST`` is not ``0``, read on
    every call)."""
    return AVAILABLE and _snip_fast_env() != "0"


def supports(fmt: ElementFormat) -> bool:
    """Small float formats (emax <= 15) and integer formats run in the fused kernel."""
    return fmt.kind is Kind.INT or (fmt.emax <= 15 and fmt.mbits <= 10)


if AVAILABLE:

    @njit(inline="always", error_model="numpy")
    def _pow2(e):
        return np.int32((e + 127) << 23).view(np.float32)

    @njit(inline="always", error_model="numpy")
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

    @njit(parallel=True, cache=True, error_model="numpy")
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

    @njit(parallel=True, cache=True, error_model="numpy")
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

    @njit(parallel=True, cache=True, error_model="numpy")
    def _quant_rows(
        x, enc, dec, k0, k1, out, is_int, mbits, emin, emax, maxn, step, inv_step, sr, dequant,
        c_off, c_row, c_stride
    ):
        """SR counter of flat element ``p``: ``c_off + (p // c_row) * c_stride + p % c_row``
        (``c_row == 0``: ``c_off + p``); a row of ``x`` never crosses a ``c_row`` boundary."""
        n, k = x.shape
        for i in prange(n):
            ei = enc[i]
            di = dec[i]
            p0 = i * k
            base = c_off + (p0 // c_row) * c_stride + p0 % c_row if c_row > 0 else c_off + p0
            for j in range(k):
                uj = _u01(base + j, k0, k1) if sr else np.float32(0.0)
                q = _round_elem(
                    x[i, j] * ei, is_int, mbits, emin, emax, maxn, step, inv_step, sr, uj
                )
                out[i, j] = q * di if dequant else q


if AVAILABLE:

    @njit(parallel=True, cache=True, error_model="numpy")
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

    @njit(parallel=True, cache=True, error_model="numpy")
    def _quant_cols(x, k, enc, dec, k0, k1, out, is_int, mbits, emin, emax, maxn, step, inv_step,
                    sr, c_off, c_stride):
        """Dequantized output for blocks of ``k`` rows per column; scales indexed ``[block, col]``
        (contiguous along the inner loop, so it vectorizes); SR counter
        ``c_off + col * c_stride + row`` (by default ``col * padded + row``, the index in the
        torch path's blocks layout)."""
        r, c = x.shape
        nb = enc.shape[0]
        for b in prange(nb):
            for i in range(b * k, min(r, (b + 1) * k)):
                for j in range(c):
                    uj = _u01(c_off + j * c_stride + i, k0, k1) if sr else np.float32(0.0)
                    q = _round_elem(x[i, j] * enc[b, j], is_int, mbits, emin, emax, maxn, step,
                                    inv_step, sr, uj)
                    out[i, j] = q * dec[b, j]


if AVAILABLE:

    # ---- counter-based uniforms: the IR form of sr_uniform_reference (defined below) ----
    # Written as LLVM IR on i32: numba would widen uint32 products to 64 bits, and 64-bit
    # vector multiplies made stochastic rounding 2.5x slower than RNE.

    def _mix32_ir(builder, h):
        i32 = ir.IntType(32)
        h = builder.xor(h, builder.lshr(h, ir.Constant(i32, 16)))
        h = builder.mul(h, ir.Constant(i32, SR_MIX_A))
        h = builder.xor(h, builder.lshr(h, ir.Constant(i32, 15)))
        h = builder.mul(h, ir.Constant(i32, SR_MIX_B))
        return builder.xor(h, builder.lshr(h, ir.Constant(i32, 15)))

    def _pair_hash_ir(builder, p, a, b):
        """``mix(mix(lo ^ k0) + k1 + hi * golden)`` of the pair counter ``p`` (i64), as i32."""
        i32, i64 = ir.IntType(32), ir.IntType(64)
        lo = builder.trunc(p, i32)
        hi = builder.trunc(builder.lshr(p, ir.Constant(i64, 32)), i32)
        h = _mix32_ir(builder, builder.xor(lo, builder.trunc(a, i32)))
        h = builder.add(builder.add(h, builder.trunc(b, i32)),
                        builder.mul(hi, ir.Constant(i32, SR_GOLDEN)))
        return _mix32_ir(builder, h)

    def _run_hash_ir(builder, q, lo0, a, c):
        """:func:`_pair_hash_ir` of pair ``hi * 2^32 + lo0 + q`` (i64 arguments) in i32 only,
        with the high word folded by the caller into ``c = k1 + hi * golden``."""
        i32 = ir.IntType(32)
        q, lo0, a, c = [builder.trunc(v, i32) for v in (q, lo0, a, c)]
        h = _mix32_ir(builder, builder.xor(builder.add(lo0, q), a))
        return _mix32_ir(builder, builder.add(h, c))

    @intrinsic
    def _u16(typingctx, index, k0, k1):
        """Element ``index``'s 16 random bits: its half of the hash of pair ``index >> 1``."""
        sig = types.int32(types.int64, types.int64, types.int64)

        def codegen(context, builder, signature, args):
            i32, i64 = ir.IntType(32), ir.IntType(64)
            idx, a, b = args
            h = _pair_hash_ir(builder, builder.ashr(idx, ir.Constant(i64, 1)), a, b)
            shift = builder.mul(builder.trunc(builder.and_(idx, ir.Constant(i64, 1)), i32),
                                ir.Constant(i32, 16))
            return builder.and_(builder.lshr(h, shift), ir.Constant(i32, 0xFFFF))

        return sig, codegen

    @njit(inline="always", error_model="numpy")
    def _u01(index, k0, k1):
        """One element's uniform (scalar form; the span kernels hash pairs with
        :func:`_pair_hash32`)."""
        return np.float32(_u16(index, k0, k1)) * np.float32(SR_U_SCALE)

    @intrinsic
    def _pair_hash32(typingctx, q, lo0, k0, c):
        """The 32-bit hash of pair ``hi * 2^32 + lo0 + q`` when the caller folds the pair's
        high word into ``c = k1 + hi * golden`` (mod 2^32): i32 only, so that it vectorizes.
        Its low half is the even element's coin, its high half the odd one's: a buffer of
        them, read back as uint16, gives the coins in element order."""
        sig = types.uint32(types.int64, types.int64, types.int64, types.int64)

        def codegen(context, builder, signature, args):
            return _run_hash_ir(builder, *args)

        return sig, codegen

    @intrinsic
    def _sub_coin(typingctx, t, uu):
        """``t - uu * 2^-16`` rounded once (one fused multiply-add; ``uu * 2^-16`` is exact, so
        this is the fp32 subtraction ``t - u``)."""
        sig = types.float32(types.float32, types.float32)

        def codegen(context, builder, signature, args):
            t, uu = args
            return builder.fma(uu, ir.Constant(ir.FloatType(), -SR_U_SCALE), t)

        return sig, codegen

    # ---- the element grid's step, in i32 (numba would widen the exponent arithmetic to i64,
    # which costs more vector instructions than the rounding itself) ----

    def _binade_field_ir(builder, x, lo, hi):
        """The exponent field of fp32 ``x`` (sign ignored) clamped to that of ``2^lo`` ..
        ``2^(hi + 1)``: ``(e + 127) << 23`` for ``e = clamp(floor(log2 |x|), lo, hi + 1)``, i32."""
        i32 = ir.IntType(32)
        sh = ir.Constant(i32, 23)
        ef = builder.and_(builder.bitcast(x, i32), ir.Constant(i32, 0x7F800000))
        lo32 = builder.shl(builder.add(builder.trunc(lo, i32), ir.Constant(i32, 127)), sh)
        hi32 = builder.shl(builder.add(builder.trunc(hi, i32), ir.Constant(i32, 128)), sh)
        ef = builder.select(builder.icmp_signed("<", ef, lo32), lo32, ef)
        return builder.select(builder.icmp_signed(">", ef, hi32), hi32, ef)

    @intrinsic
    def _pow2_up(typingctx, a, emin, emax, off):
        """``2^(e + off)`` for ``e = clamp(floor(log2 |a|), emin, emax + 1)``: the exponent field
        of ``|a|`` clamped as it stands (``(e + 127) << 23``), then ``off << 23`` added: five
        vector instructions in the RNE loop (LLVM splits the add of ``(23 - mbits) << 23`` in
        two) where shifting the field down and back up took seven."""
        sig = types.float32(types.float32, types.int64, types.int64, types.int64)

        def codegen(context, builder, signature, args):
            x, lo, hi, c = args
            ef = _binade_field_ir(builder, x, lo, hi)
            k = builder.add(ef, builder.shl(builder.trunc(c, ef.type), ir.Constant(ef.type, 23)))
            return builder.bitcast(k, ir.FloatType())

        return sig, codegen

    @intrinsic
    def _grid_pow2s(typingctx, a, emin, emax, mbits):
        """``(2^(mbits - e), 2^(e - mbits))`` for ``e = clamp(floor(log2 a), emin, emax + 1)``
        (``a >= 0`` or NaN), both from one clamped exponent field (two integer subtractions
        instead of two shift-and-add chains)."""
        sig = types.UniTuple(types.float32, 2)(types.float32, types.int64, types.int64,
                                               types.int64)

        def codegen(context, builder, signature, args):
            i32, f32 = ir.IntType(32), ir.FloatType()
            x, lo, hi, mb = args
            ef = _binade_field_ir(builder, x, lo, hi)
            m = builder.shl(builder.trunc(mb, i32), ir.Constant(i32, 23))
            dn = builder.sub(builder.add(ir.Constant(i32, 254 << 23), m), ef)
            up = builder.sub(ef, m)
            return context.make_tuple(builder, signature.return_type,
                                      (builder.bitcast(dn, f32), builder.bitcast(up, f32)))

        return sig, codegen

    # ---- loads and stores of fp32 or bf16 (held as uint16) elements ----

    def _ld(a, i):  # pragma: no cover - replaced by the overload below
        raise NotImplementedError

    def _st(a, i, v):  # pragma: no cover
        raise NotImplementedError

    @overload(_ld, inline="always")
    def _ld_impl(a, i):
        if a.dtype == types.uint16:
            return lambda a, i: np.uint32(np.uint32(a[i]) << np.uint32(16)).view(np.float32)
        return lambda a, i: np.float32(a[i])

    @overload(_st, inline="always")
    def _st_impl(a, i, v):
        if a.dtype == types.uint16:
            def st(a, i, v):  # torch's fp32 -> bf16: round to nearest even, NaN -> 0x7FC0
                b = np.uint32(np.float32(v).view(np.uint32))
                if v != v:
                    a[i] = np.uint16(0x7FC0)
                else:
                    bias = np.uint32(((b >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF))
                    a[i] = np.uint16((b + bias) >> np.uint32(16))
            return st

        def st32(a, i, v):
            a[i] = v
        return st32

    def _at(s, j):  # pragma: no cover - replaced by the overload below
        raise NotImplementedError

    @overload(_at, inline="always")
    def _at_impl(s, j):
        """A scale for element ``j``: ``s[j]`` of a per-element array, or the scalar ``s``."""
        if isinstance(s, types.Array):
            return lambda s, j: s[j]
        return lambda s, j: s

    def _tail(s, j):  # pragma: no cover - replaced by the overload below
        raise NotImplementedError

    @overload(_tail, inline="always")
    def _tail_impl(s, j):
        """``s[j:]`` of a per-element array of scales, or the scalar ``s``."""
        if isinstance(s, types.Array):
            return lambda s, j: s[j:]
        return lambda s, j: s

    # ---- per-block scales (same arithmetic as snip.formats.scaling) ----

    @njit(inline="always", error_model="numpy")
    def _exp2_int(k):
        """Exact fp32 2^k for integer k in [-149, 127]: both bit patterns (normal, subnormal)
        and a select, not a branch, so that the e8m0 scales' loop over blocks vectorizes (MX
        kernels 2-10 % faster; the subnormal one's shift is clamped so that both are
        defined)."""
        sub = np.int32(1) << np.int32(min(max(k + 149, 0), 31))
        return np.int32(np.int32((k + 127) << 23) if k >= -126 else sub).view(np.float32)

    @njit(inline="always", error_model="numpy")
    def _ceil_log2(v):
        bits = np.float32(v).view(np.int32)
        ex = (bits >> 23) & 0xFF
        man = bits & 0x7FFFFF
        if ex == 0:
            return -126 if man > 0x400000 else -127
        return ex - 127 + (1 if man != 0 else 0)

    @njit(inline="always", error_model="numpy")
    def _block_scale(amax, sfmt, pow2, emax_elem, maxn, mul, t_dec):
        """(encode, decode) of one block from its amax (NaN if the block holds NaN/inf).

        sfmt: 0 fp32, 1 e8m0 floor, 2 e8m0 rceil, 3 e4m3 under a tensor scale (``mul`` is
        ``S_enc * (1/elem_max)``, ``t_dec`` the tensor decode scale ``1/S_enc``)."""
        finite = amax <= np.float32(3.4028234663852886e38)
        if sfmt == 0:
            s = np.float32(amax / maxn)
            if pow2:
                s = _exp2_int(min(max(_ceil_log2(s), -126), 127))
            if amax == np.float32(0.0):
                s = np.float32(1.0)
            elif s < np.float32(1.1754943508222875e-38):
                s = np.float32(1.1754943508222875e-38)
            if not finite:
                s = np.float32(np.nan)
            return np.float32(np.float32(1.0) / s), s
        if sfmt == 1 or sfmt == 2:
            if sfmt == 1:
                k = ((np.float32(amax).view(np.int32) >> 23) & 0xFF) - 127 - emax_elem
            else:
                k = _ceil_log2(np.float32(amax / maxn))
            k = min(max(k, -127), 127)
            if not finite:
                return _exp2_int(-128), np.float32(np.nan)
            return _exp2_int(-k), _exp2_int(k)
        # e4m3: S_dec_b = e4m3(min(amax * mul, 448)), decode = S_dec_b * t_dec
        b = np.float32(amax * mul)
        b = np.float32(448.0) if b > np.float32(448.0) else b
        be = _round_elem(b, False, 3, -6, 8, np.float32(448.0), np.float32(1.0), np.float32(1.0),
                         False, np.float32(0.0))
        dec = np.float32(be * t_dec)
        enc = np.float32(np.float32(1.0) / dec)
        if enc > np.float32(3.4028234663852886e38):
            enc = np.float32(3.4028234663852886e38)
        if not finite:
            dec = np.float32(np.nan)
        return enc, dec

    _FINITE_BITS = 0x7F800000  # |x| bit patterns at or above this are inf or NaN

    def _absbits(a, i):  # pragma: no cover - replaced by the overload below
        raise NotImplementedError

    @overload(_absbits, inline="always")
    def _absbits_impl(a, i):
        """|x| as an int32 bit pattern (orders like the float; >= 0x7F800000: inf/NaN).  Typed
        int32 (numba widens int32 & int32 to int64): with an int64 ``bi``, the column kernels'
        ``m[i] = bi if bi > m[i] else m[i]`` compiled, in their one-thread builds only, to a
        loop that widened every lane to 64 bits (RESULTS §7ag, §7ai)."""
        if a.dtype == types.uint16:
            return lambda a, i: np.int32((np.int32(a[i]) & np.int32(0x7FFF)) << np.int32(16))
        return lambda a, i: np.int32(np.float32(a[i]).view(np.int32) & np.int32(0x7FFFFFFF))

    # ---- block maxima of |x| bits, in LLVM vector IR (eight i32 lanes) ----

    _V8 = ir.VectorType(ir.IntType(32), 8)

    def _maxable(xs):
        """A 1-D contiguous fp32 or bf16 (uint16) array: what the vector IR below reads."""
        return (isinstance(xs, types.Array) and xs.ndim == 1 and xs.layout == "C"
                and xs.dtype in (types.float32, types.uint16))

    class _BitsIR:
        """IR for ``|x|`` bit patterns (:func:`_absbits`) of one array's elements: scalars or
        eight lanes loaded from element ``at``, and the i32 lane-wise and horizontal maxima."""

        def __init__(self, context, builder, aryty, ary):
            self.b = builder
            self.wide = aryty.dtype == types.float32
            self.ety = ir.IntType(32 if self.wide else 16)
            arr = context.make_array(aryty)(context, builder, value=ary)
            self.n = builder.extract_value(arr.shape, 0)
            self.p = builder.bitcast(arr.data, self.ety.as_pointer())
            self.align = 4 if self.wide else 2
            self.smax = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_V8, [_V8, _V8]), "llvm.smax.v8i32")
            self.reduce = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.IntType(32), [_V8]),
                "llvm.vector.reduce.smax.v8i32")

        def _abs(self, v, ty, const):
            b = self.b
            if self.wide:
                return b.and_(v, const(0x7FFFFFFF))
            return b.shl(b.and_(b.zext(v, ty), const(0x7FFF)), const(16))

        def scalar(self, at):
            v = self.b.load(self.b.gep(self.p, [at]), align=self.align)
            return self._abs(v, ir.IntType(32), lambda c: ir.Constant(ir.IntType(32), c))

        def lanes(self, at):
            ptr = self.b.bitcast(self.b.gep(self.p, [at]), ir.VectorType(self.ety, 8).as_pointer())
            return self._abs(self.b.load(ptr, align=self.align), _V8,
                             lambda c: ir.Constant(_V8, [c] * 8))

        def lanes_max(self, start, nvec):
            """Lane-wise maximum of the ``nvec`` vectors from element ``start`` (zeros if none)."""
            b = self.b
            acc = cgutils.alloca_once_value(b, ir.Constant(_V8, [0] * 8))
            three = ir.Constant(start.type, 3)
            with cgutils.for_range(b, nvec) as loop:
                v = self.lanes(b.add(start, b.shl(loop.index, three)))
                b.store(b.call(self.smax, [v, b.load(acc)]), acc)
            return b.load(acc)

    @intrinsic
    def _max_bits(typingctx, xs):
        """The largest ``|x|`` bit pattern (:func:`_absbits`) of a 1-D contiguous fp32 or bf16
        (uint16) array, 0 if it is empty: eight lanes at a time in LLVM vector IR, then one
        horizontal maximum, then the last ``n % 8`` elements one by one.  (The same loop in
        Python-level numba code compiled, for a block of 16 or 32, into a fully unrolled chain
        of scalar compares: 0.46-0.63 ns an element against 0.14-0.24 here.)"""
        if not _maxable(xs):
            return None

        def codegen(context, builder, signature, args):
            ir_ = _BitsIR(context, builder, signature.args[0], args[0])
            n = ir_.n
            three = ir.Constant(n.type, 3)
            nv = builder.lshr(n, three)
            acc = ir_.lanes_max(ir.Constant(n.type, 0), nv)
            m = cgutils.alloca_once_value(builder, builder.call(ir_.reduce, [acc]))
            one = ir.Constant(n.type, 1)
            with cgutils.for_range_slice(builder, builder.shl(nv, three), n, one) as (j, _):
                b = ir_.scalar(j)
                cur = builder.load(m)
                builder.store(builder.select(builder.icmp_signed(">", b, cur), b, cur), m)
            return builder.load(m)

        return types.int32(xs), codegen

    # lanes (i, j) of two vectors -> their maxima, level by level, for 8 vectors -> 8 maxima
    _PAIRS = (((0, 8, 2, 10, 4, 12, 6, 14), (1, 9, 3, 11, 5, 13, 7, 15)),
              ((0, 1, 8, 9, 4, 5, 12, 13), (2, 3, 10, 11, 6, 7, 14, 15)),
              ((0, 1, 2, 3, 8, 9, 10, 11), (4, 5, 6, 7, 12, 13, 14, 15)))

    @intrinsic
    def _block_maxima(typingctx, xs, m, k):
        """``m[b] = _max_bits(xs[b * k:(b + 1) * k])`` for every ``b < len(m)``, ``k`` a multiple
        of 8 and ``xs`` at least ``len(m) * k`` long (the caller checks both): eight blocks at a
        time, each block's vectors maxed lane-wise, then the eight vectors reduced together by
        three levels of shuffles and maxima (7 maxima and 14 shuffles for eight blocks, where
        eight horizontal maxima took about 48 instructions); the last ``len(m) % 8`` blocks one
        by one.  NVFP4's first pass over blocks of 16: 0.35 -> 0.16 ns an element."""
        if not (_maxable(xs) and isinstance(m, types.Array) and m.ndim == 1
                and m.layout == "C" and m.dtype == types.int32
                and isinstance(k, types.Integer)):
            return None

        def codegen(context, builder, signature, args):
            ir_ = _BitsIR(context, builder, signature.args[0], args[0])
            i64 = ir.IntType(64)
            ma = context.make_array(signature.args[1])(context, builder, value=args[1])
            nb = builder.extract_value(ma.shape, 0)
            pm = builder.bitcast(ma.data, ir.IntType(32).as_pointer())
            k = context.cast(builder, args[2], signature.args[2], types.int64)
            three = ir.Constant(i64, 3)
            nvec = builder.lshr(k, three)

            def pair_max(a, b, lo_hi):
                lo, hi = (builder.shuffle_vector(a, b, ir.Constant(_V8, list(ix)))
                          for ix in lo_hi)
                return builder.call(ir_.smax, [lo, hi])

            ngroups = builder.lshr(nb, three)
            with cgutils.for_range(builder, ngroups) as g:
                b0 = builder.shl(g.index, three)
                v = [ir_.lanes_max(builder.mul(builder.add(b0, ir.Constant(i64, j)), k), nvec)
                     for j in range(8)]
                for lo_hi in _PAIRS:
                    v = [pair_max(v[2 * j], v[2 * j + 1], lo_hi) for j in range(len(v) // 2)]
                builder.store(v[0], builder.bitcast(builder.gep(pm, [b0]), _V8.as_pointer()),
                              align=4)
            one = ir.Constant(i64, 1)
            with cgutils.for_range_slice(builder, builder.shl(ngroups, three), nb, one) as (b, _):
                last = builder.call(ir_.reduce, [ir_.lanes_max(builder.mul(b, k), nvec)])
                builder.store(last, builder.gep(pm, [b]))
            return context.get_dummy_value()

        return types.none(xs, m, k), codegen

    @njit(inline="always", error_model="numpy")
    def _maxima(xs, m, k):
        """``m[b]`` = the ``|x|`` bit maximum of block ``b`` of ``k`` consecutive elements of
        ``xs`` (the last block may be short) for every ``b < len(m)``: whole blocks of a
        multiple of 8 by :func:`_block_maxima`, the rest by :func:`_max_bits`."""
        n = xs.shape[0]
        whole = min(m.shape[0], n // k) if k % 8 == 0 else 0
        _block_maxima(xs[:whole * k], m[:whole], k)
        for b in range(whole, m.shape[0]):
            m[b] = _max_bits(xs[b * k:min(n, (b + 1) * k)])

    @njit(inline="always", error_model="numpy")
    def _amax_of_bits(m):
        """Block amax for the scale rules: inf stands for any NaN/inf in the block."""
        return np.float32(np.inf) if m >= _FINITE_BITS else np.int32(m).view(np.float32)

    @njit(cache=True, error_model="numpy")  # (cached: the tests call it directly)
    def _scales(m, enc, dec, sfmt, pow2, emax_elem, maxn, mul, t_dec):
        """Scales of a run of blocks from their amax bits (the format branch is taken once)."""
        n = m.shape[0]
        if sfmt == 1:  # e8m0 floor (OCP MX): straight-line code over blocks
            for i in range(n):
                bits = m[i]
                kk = min(max(((bits >> 23) & 0xFF) - 127 - emax_elem, -127), 127)
                fin = bits < _FINITE_BITS
                enc[i] = _exp2_int(-kk) if fin else _exp2_int(-128)
                dec[i] = _exp2_int(kk) if fin else np.float32(np.nan)
        elif sfmt == 3:  # NVFP4: the e4m3 rounding of _block_scale, branch-free (vectorizes)
            for i in range(n):
                bits = m[i]
                fin = bits < _FINITE_BITS
                amax = np.int32(bits).view(np.float32) if fin else np.float32(np.inf)
                b = np.float32(amax * mul)
                b = np.float32(448.0) if b > np.float32(448.0) else b
                a = np.float32(abs(b))
                magic = _pow2_up(a, -6, 8, 20)
                be = (a + magic) - magic
                be = np.float32(448.0) if be > np.float32(448.0) else be
                be = np.float32(np.copysign(be, b))
                d = np.float32(be * t_dec)
                e = np.float32(np.float32(1.0) / d)
                enc[i] = np.float32(3.4028234663852886e38) if e > np.float32(
                    3.4028234663852886e38) else e
                dec[i] = d if fin else np.float32(np.nan)
        else:
            for i in range(n):
                enc[i], dec[i] = _block_scale(_amax_of_bits(m[i]), sfmt, pow2, emax_elem, maxn,
                                              mul, t_dec)

    @njit(inline="always", error_model="numpy")
    def _rne_elem(xv, enc, dec, mbits, emin, emax, maxn):
        """Round-to-nearest-even of one element onto a float grid (the FPU's own rounding drops
        the bits below the grid step: ``(a + magic) - magic``), saturating; branch-free."""
        v = xv * enc
        a = np.float32(abs(v))
        magic = _pow2_up(a, emin, emax, 23 - mbits)
        q = (a + magic) - magic
        q = np.float32(np.copysign(maxn if q > maxn else q, v))
        return q * dec

    @njit(error_model="numpy")
    def _rne_span(xs, os_, enc, dec, mbits, emin, emax, maxn):
        """The hot loop (RNE onto a float grid, one scale): branch-free, so it vectorizes."""
        for j in range(xs.shape[0]):
            _st(os_, j, _rne_elem(_ld(xs, j), enc, dec, mbits, emin, emax, maxn))

    @njit(inline="always", error_model="numpy")
    def _sr_elem(xv, uu, enc, dec, mbits, emin, emax, maxn):
        """Stochastic rounding of one element with coin ``u = uu * 2^-16``.

        The reference rounds ``t = |v| / ulp`` up iff ``u < t - floor(t)``; that is ``ceil(t -
        u)``: ``t`` is exact (a power-of-two multiple of ``|v|``), and ``t - u`` is exact, or
        rounds without reaching an integer, or (``t >= 2^(mbits + 1)``) saturates either way.
        """
        v = xv * enc
        a = np.float32(abs(v))
        dn, up = _grid_pow2s(a, emin, emax, mbits)
        q = np.float32(np.ceil(_sub_coin(a * dn, uu))) * up
        q = np.float32(np.copysign(maxn if q > maxn else q, v))
        return q * dec

    @njit(cache=True, error_model="numpy")  # (cached: the tests call it directly)
    def _sr_span(xs, os_, enc, dec, base, mbits, emin, emax, maxn, k0, k1):
        """Stochastic rounding onto a float grid, SR counter ``base + j``; ``enc``/``dec``: one
        scale, or one per element (:func:`_sr_span_buf` with a buffer of its own)."""
        _sr_span_buf(xs, os_, enc, dec, base, mbits, emin, emax, maxn, k0, k1,
                     np.empty(_SR_GROUP, np.uint32))

    @njit(error_model="numpy")
    def _sr_span_buf(xs, os_, enc, dec, base, mbits, emin, emax, maxn, k0, k1, hb):
        """:func:`_sr_span` with the caller's L1 buffer ``hb`` (``_SR_GROUP`` words).  Each pair
        is hashed once, on a 32-bit counter: up to ``_SR_GROUP`` pairs at a time into ``hb``,
        which the rounding loop then reads in element order (both loops vectorize; a loop
        over pairs that rounds both elements of each, which served the last partial group
        before, made the 1x128 rows of a width-64 model 2.5x slower per call)."""
        n = xs.shape[0]
        j = 0
        u16 = hb.view(np.uint16)
        if n > 0 and base & 1:  # odd start: the high half of the first pair
            u = np.float32(_u16(base, k0, k1))
            _st(os_, 0, _sr_elem(_ld(xs, 0), u, _at(enc, 0), _at(dec, 0), mbits, emin, emax,
                                 maxn))
            j = 1
        while n - j >= 2:  # whole pairs, in runs whose pair counters share the high word
            p = (base + j) >> 1
            hi = p >> 32
            lo0 = p & 0xFFFFFFFF
            npair = min((n - j) >> 1, (1 << 32) - lo0)
            c = k1 + hi * SR_GOLDEN
            x2, o2, e2, d2 = xs[j:], os_[j:], _tail(enc, j), _tail(dec, j)  # indices from range
            ngrp = npair // _SR_GROUP
            for g in range(ngrp):  # whole groups: constant trip counts
                g0 = g * _SR_GROUP
                for q in range(_SR_GROUP):
                    hb[q] = _pair_hash32(g0 + q, lo0, k0, c)
                gx = x2[2 * g0:2 * (g0 + _SR_GROUP)]
                go = o2[2 * g0:2 * (g0 + _SR_GROUP)]
                ge = _tail(e2, 2 * g0)
                gd = _tail(d2, 2 * g0)
                for i in range(2 * _SR_GROUP):
                    _st(go, i, _sr_elem(_ld(gx, i), np.float32(u16[i]), _at(ge, i), _at(gd, i),
                                        mbits, emin, emax, maxn))
            # the last, partial group: the same steps with a run-time count (one inline helper
            # for both was slower: +20 % [+8, +31] per call on 1x128 rows of 192 columns, paired
            # n = 2, benchmarks/results/issue21/xeon/calls/helper_*)
            g0 = ngrp * _SR_GROUP
            m = npair - g0
            for q in range(m):
                hb[q] = _pair_hash32(g0 + q, lo0, k0, c)
            gx = x2[2 * g0:2 * npair]
            go = o2[2 * g0:2 * npair]
            ge = _tail(e2, 2 * g0)
            gd = _tail(d2, 2 * g0)
            for i in range(2 * m):
                _st(go, i, _sr_elem(_ld(gx, i), np.float32(u16[i]), _at(ge, i), _at(gd, i),
                                    mbits, emin, emax, maxn))
            j += 2 * npair
        if j < n:  # odd end: the low half of the last pair
            u = np.float32(_u16(base + j, k0, k1))
            _st(os_, j, _sr_elem(_ld(xs, j), u, _at(enc, j), _at(dec, j), mbits, emin, emax,
                                 maxn))

    @njit(error_model="numpy")
    def _sr_rows(xs, os_, nrows, length, k, nb, base, padded, enc, dec, mbits, emin, emax, maxn,
                 k0, k1):
        """Stochastic rounding of ``nrows`` whole rows of ``length`` in blocks of ``k`` (row
        ``i``'s block ``b`` with the scales ``enc[i * nb + b]``, ``dec[i * nb + b]``; SR counters
        ``base + i * padded + l``; ``length``, ``padded`` and ``base`` even, and every pair
        counter of the rows under one high word): all the rows' pair hashes first, then block
        by block rounding.  Block by block through :func:`_sr_span_buf`, a 64-wide row (the 1x128
        tiles of a width-64 model) paid that span's set-up and partial-group loops for 32
        pairs: a call on such rows, or 192- and 704-wide ones, now takes 0.67-0.74x the time
        (RESULTS §7aa)."""
        half = length >> 1
        p0 = base >> 1
        lo0 = p0 & 0xFFFFFFFF
        c = k1 + (p0 >> 32) * SR_GOLDEN
        step = padded >> 1
        hb = np.empty(nrows * half, np.uint32)
        for i in range(nrows):
            t = i * step
            h = hb[i * half:(i + 1) * half]
            for q in range(half):
                h[q] = _pair_hash32(t + q, lo0, k0, c)
        u16 = hb.view(np.uint16)  # element l of row i: half (l & 1) of pair hash i * half + l >> 1
        for i in range(nrows):
            for b in range(nb):
                e, d = enc[i * nb + b], dec[i * nb + b]
                lo = i * length + b * k
                hi = i * length + min(length, (b + 1) * k)
                xr, orow, ur = xs[lo:hi], os_[lo:hi], u16[lo:hi]
                for j in range(hi - lo):
                    _st(orow, j, _sr_elem(_ld(xr, j), np.float32(ur[j]), e, d, mbits, emin,
                                          emax, maxn))

    @njit(error_model="numpy")
    def _run_rows(xs, os_, nrows, length, k, base, padded, sfmt, pow2, emax_elem, maxn, mul,
                  t_dec, mbits, emin, emax, maxne, sr, k0, k1):
        """:func:`_run` for ``nrows`` whole rows of ``length`` (the last block of a row may be
        short) with blocks of ``k >= _LONG_BLOCK`` onto a float grid: the block maxima and
        scales of all the rows at once, then block by block with scalar scales; row ``i``'s SR
        counters start at ``base + i * padded``.  Short rows (a 128-block over a 64-wide row)
        would otherwise pay a task, three allocations and a call per row."""
        nb = (length + k - 1) // k
        m = np.empty(nrows * nb, np.int32)
        for i in range(nrows):
            _maxima(xs[i * length:(i + 1) * length], m[i * nb:(i + 1) * nb], k)
        enc = np.empty(nrows * nb, np.float32)
        dec = np.empty(nrows * nb, np.float32)
        _scales(m, enc, dec, sfmt, pow2, emax_elem, maxn, mul, t_dec)
        if sr and (length | padded | base) & 1 == 0 and (
                ((base >> 1) & 0xFFFFFFFF) + (nrows - 1) * (padded >> 1) + (length >> 1)
                <= 0xFFFFFFFF):
            _sr_rows(xs, os_, nrows, length, k, nb, base, padded, enc, dec, mbits, emin, emax,
                     maxne, k0, k1)
            return
        hb = np.empty(_SR_GROUP, np.uint32)
        for i in range(nrows):
            for b in range(nb):
                lo = i * length + b * k
                hi = i * length + min(length, (b + 1) * k)
                if sr:
                    _sr_span_buf(xs[lo:hi], os_[lo:hi], enc[i * nb + b], dec[i * nb + b],
                                 base + i * padded + b * k, mbits, emin, emax, maxne, k0, k1,
                                 hb)
                else:
                    _rne_span(xs[lo:hi], os_[lo:hi], enc[i * nb + b], dec[i * nb + b], mbits,
                              emin, emax, maxne)

    @njit(error_model="numpy")
    def _any_span(xs, os_, enc, dec, base, is_int, mbits, emin, emax, maxn, step, inv_step, sr,
                  k0, k1):
        """Any format and rounding (the integer formats), one scale; SR counter ``base + j``."""
        for j in range(xs.shape[0]):
            uj = _u01(base + j, k0, k1) if sr else np.float32(0.0)
            q = _round_elem(_ld(xs, j) * enc, is_int, mbits, emin, emax, maxn, step, inv_step,
                            sr, uj)
            _st(os_, j, q * dec)

    @njit(error_model="numpy")
    def _span(xs, os_, enc, dec, base, is_int, mbits, emin, emax, maxn, step, inv_step, sr,
              k0, k1):
        if is_int:
            _any_span(xs, os_, enc, dec, base, is_int, mbits, emin, emax, maxn, step, inv_step,
                      sr, k0, k1)
        elif sr:
            _sr_span(xs, os_, enc, dec, base, mbits, emin, emax, maxn, k0, k1)
        else:
            _rne_span(xs, os_, enc, dec, mbits, emin, emax, maxn)

    @njit(error_model="numpy")
    def _rne_span_vec(xs, os_, enc, dec, mbits, emin, emax, maxn):
        for j in range(xs.shape[0]):
            _st(os_, j, _rne_elem(_ld(xs, j), enc[j], dec[j], mbits, emin, emax, maxn))

    @njit(error_model="numpy")
    def _sr_span_vec(xs, os_, enc, dec, base, stride, mbits, emin, emax, maxn, k0, k1):
        if stride == 1:  # the rows kernel: no 64-bit vector multiply for the counter
            _sr_span(xs, os_, enc, dec, base, mbits, emin, emax, maxn, k0, k1)
            return
        for j in range(xs.shape[0]):
            u = np.float32(_u16(base + j * stride, k0, k1))
            _st(os_, j, _sr_elem(_ld(xs, j), u, enc[j], dec[j], mbits, emin, emax, maxn))

    @njit(inline="always", error_model="numpy")
    def _sr_row_pair(x0, x1, o0, o1, enc, dec, t, half, lo0, k0, c, mbits, emin, emax, maxn,
                     hb):
        """Stochastic rounding of two rows of a column-blocked matrix whose elements in column
        ``i`` are the two halves of pair ``hi * 2^32 + lo0 + i * half + t`` (``c`` folds ``hi``):
        one hash per column for both rows, in 32-bit arithmetic (it vectorizes), where the
        row-by-row loop of :func:`_sr_span_vec` computes a 64-bit hash per element.  The hashes
        go into ``hb`` (a word per column) first, then each row takes its half: 10-20 % faster
        at 192-704 columns than hashing inside one loop over both rows (scratch timing)."""
        n = x0.shape[0]
        for i in range(n):
            hb[i] = _pair_hash32(i * half + t, lo0, k0, c)
        for i in range(n):
            _st(o0, i, _sr_elem(_ld(x0, i), np.float32(hb[i] & np.uint32(0xFFFF)), enc[i],
                                dec[i], mbits, emin, emax, maxn))
        for i in range(n):
            _st(o1, i, _sr_elem(_ld(x1, i), np.float32(hb[i] >> np.uint32(16)), enc[i], dec[i],
                                mbits, emin, emax, maxn))

    @njit(cache=True, error_model="numpy")  # (cached: the tests call it directly)
    def _any_span_vec(xs, os_, enc, dec, base, stride, is_int, mbits, emin, emax, maxn, step,
                      inv_step, sr, k0, k1):
        """One scale per element; SR counter ``base + j * stride``."""
        if not is_int and not sr:
            _rne_span_vec(xs, os_, enc, dec, mbits, emin, emax, maxn)
            return
        if not is_int:
            _sr_span_vec(xs, os_, enc, dec, base, stride, mbits, emin, emax, maxn, k0, k1)
            return
        for j in range(xs.shape[0]):
            uj = _u01(base + j * stride, k0, k1) if sr else np.float32(0.0)
            q = _round_elem(_ld(xs, j) * enc[j], is_int, mbits, emin, emax, maxn, step,
                            inv_step, sr, uj)
            _st(os_, j, q * dec[j])

    @njit(inline="always", error_model="numpy")
    def _const_blocks(xs, os_, enc, dec, k, nblk, base, sr, mbits, emin, emax, maxn, k0, k1):
        """``nblk`` whole blocks of ``k`` (a literal at the call: constant trip counts) onto a
        float grid, block ``b`` with the scalar scales ``enc[b]``, ``dec[b]``; SR counter ``base
        + j`` with ``base`` even and one high word for all pair counters (the caller checks)."""
        if sr:
            p0 = base >> 1
            lo0 = p0 & 0xFFFFFFFF
            c = k1 + (p0 >> 32) * SR_GOLDEN
            # the hashes of a group of blocks (>= _SR_GROUP pairs) into L1, then the elements
            # block by block in order (no shuffles); the last few blocks one by one
            h = k >> 1
            grp = max(1, _SR_GROUP // h)
            hb = np.empty(grp * h, np.uint32)
            u16 = hb.view(np.uint16)
            nfull = nblk // grp
            for g in range(nfull):
                for q in range(grp * h):
                    hb[q] = _pair_hash32(g * grp * h + q, lo0, k0, c)
                for bb in range(grp):
                    b = g * grp + bb
                    e = enc[b]
                    d = dec[b]
                    xb = xs[b * k:(b + 1) * k]
                    ob = os_[b * k:(b + 1) * k]
                    ub = u16[bb * k:(bb + 1) * k]
                    for j in range(k):
                        _st(ob, j, _sr_elem(_ld(xb, j), np.float32(ub[j]), e, d, mbits, emin,
                                            emax, maxn))
            for b in range(nfull * grp, nblk):
                e = enc[b]
                d = dec[b]
                xb = xs[b * k:(b + 1) * k]
                ob = os_[b * k:(b + 1) * k]
                for q in range(h):
                    hb[q] = _pair_hash32(b * h + q, lo0, k0, c)
                for j in range(k):
                    _st(ob, j, _sr_elem(_ld(xb, j), np.float32(u16[j]), e, d, mbits, emin, emax,
                                        maxn))
            return
        for b in range(nblk):
            e = enc[b]
            d = dec[b]
            xb = xs[b * k:(b + 1) * k]
            ob = os_[b * k:(b + 1) * k]
            for j in range(k):
                _st(ob, j, _rne_elem(_ld(xb, j), e, d, mbits, emin, emax, maxn))

    @njit(cache=True, error_model="numpy")  # (cached: the tests call it directly)
    def _run(xs, os_, k, nblk, base, sfmt, pow2, emax_elem, maxn, mul, t_dec, is_int, mbits,
             emin, emax, maxne, step, inv_step, sr, k0, k1):
        """``nblk`` consecutive blocks of ``k`` (the last may be short): their amaxes, then
        :func:`_round_run`."""
        m = np.empty(nblk, np.int32)
        _maxima(xs, m, k)
        _round_run(xs, os_, k, nblk, base, m, sfmt, pow2, emax_elem, maxn, mul, t_dec, is_int,
                   mbits, emin, emax, maxne, step, inv_step, sr, k0, k1)

    @njit(error_model="numpy")
    def _round_run(xs, os_, k, nblk, base, m, sfmt, pow2, emax_elem, maxn, mul, t_dec, is_int,
                   mbits, emin, emax, maxne, step, inv_step, sr, k0, k1):
        """``nblk`` consecutive blocks of ``k`` (the last may be short) whose |x| bit maxima
        are ``m`` (:func:`_run`'s, or NVFP4's first pass): scales, then the rounding, block by
        block with scalar scales (whole blocks of 16/32/128 in constant-trip-count loops; any
        block of ``_LONG_BLOCK`` or more), else one scale per element broadcast into L1 and one
        straight vectorized pass over the run.  (One function for both sources of ``m``,
        binding it to the argument in one branch and to a fresh array in the other, compiled
        the whole run ~1.8x slower.)"""
        n = xs.shape[0]
        enc = np.empty(nblk, np.float32)
        dec = np.empty(nblk, np.float32)
        _scales(m, enc, dec, sfmt, pow2, emax_elem, maxn, mul, t_dec)
        if (not is_int and n == nblk * k and base & 1 == 0 and k & 1 == 0
                and base >> 33 == (base + n - 1) >> 33):
            # whole blocks of a compile-time size, one pair-counter high word: the inner loops
            # have constant trip counts (whole vectors, no remainder code, no broadcast scales)
            if k == 16:
                _const_blocks(xs, os_, enc, dec, 16, nblk, base, sr, mbits, emin, emax, maxne,
                              k0, k1)
                return
            if k == 32:
                _const_blocks(xs, os_, enc, dec, 32, nblk, base, sr, mbits, emin, emax, maxne,
                              k0, k1)
                return
            if k == 128:
                _const_blocks(xs, os_, enc, dec, 128, nblk, base, sr, mbits, emin, emax, maxne,
                              k0, k1)
                return
        if k >= _LONG_BLOCK and not is_int:  # long blocks: block by block, scalar scales
            for b in range(nblk):
                lo = b * k
                hi = min(n, lo + k)
                if sr:
                    _sr_span(xs[lo:hi], os_[lo:hi], enc[b], dec[b], base + lo, mbits, emin,
                             emax, maxne, k0, k1)
                else:
                    _rne_span(xs[lo:hi], os_[lo:hi], enc[b], dec[b], mbits, emin, emax, maxne)
            return
        enc_e = np.empty(n, np.float32)
        dec_e = np.empty(n, np.float32)
        for b in range(nblk):
            enc_e[b * k:min(n, (b + 1) * k)] = enc[b]
            dec_e[b * k:min(n, (b + 1) * k)] = dec[b]
        _any_span_vec(xs, os_, enc_e, dec_e, base, 1, is_int, mbits, emin, emax, maxne, step,
                      inv_step, sr, k0, k1)

    @njit(parallel=True, cache=True, error_model="numpy")
    def _fused_rows(x, out, n_rows, length, k_rt, kt, padded, c_off, bmax, sfmt, pow2,
                    emax_elem, maxn,
                    mul, t_dec, fix_enc, fix_dec, is_int, mbits, emin, emax, maxne, step, inv_step,
                    sr, k0, k1):
        """Fake-quantize blocks of ``k`` along the last axis of ``x`` viewed ``(n_rows, length)``.

        Each parallel task takes a run of blocks of one row (about ``_CHUNK`` elements): their
        amaxes, then their scales, then block by block rounding and rescaling -- all while the
        run is in L1/L2, so memory sees one read and one write per element.  ``sfmt == -1``: one
        given scale (``fix_enc``, ``fix_dec``); blocks then only split the work.  The SR counter
        is ``c_off + row * padded + l`` (by default the element's index in the padded blocks
        layout; a row shard passes its place in the whole tensor, ``padded`` its row stride).

        ``kt`` is a tuple whose *length* is the block size when that is small (16, 32): numba
        then compiles the kernel for that size, with constant trip counts that LLVM unrolls into
        whole vectors; ``kt == ()`` means "use ``k_rt``".  ``bmax``: the int32 |x| bit maxima of
        all ``n_rows * nb`` blocks when a first pass computed them (NVFP4), else empty.
        """
        k = len(kt) if len(kt) > 0 else k_rt
        nb = (length + k - 1) // k
        group = max(1, _CHUNK // k)
        ng = (nb + group - 1) // group
        for u in prange(n_rows * ng):
            r = u // ng
            g = u - r * ng
            b0 = g * group
            b1 = min(nb, b0 + group)
            start = r * length + b0 * k
            stop = r * length + min(length, b1 * k)
            base = c_off + r * padded + b0 * k
            if sfmt < 0:
                _span(x[start:stop], out[start:stop], fix_enc, fix_dec, base, is_int, mbits,
                      emin, emax, maxne, step, inv_step, sr, k0, k1)
                continue
            if bmax.shape[0] > 0:
                _round_run(x[start:stop], out[start:stop], k, b1 - b0, base,
                           bmax[r * nb + b0:r * nb + b1], sfmt, pow2, emax_elem, maxn, mul,
                           t_dec, is_int, mbits, emin, emax, maxne, step, inv_step, sr, k0, k1)
            else:
                _run(x[start:stop], out[start:stop], k, b1 - b0, base, sfmt, pow2, emax_elem,
                     maxn, mul, t_dec, is_int, mbits, emin, emax, maxne, step, inv_step, sr, k0,
                     k1)

    @njit(parallel=True, cache=True, error_model="numpy")
    def _fused_short_rows(x, out, n_rows, length, k, padded, c_off, sfmt, pow2, emax_elem, maxn,
                          mbits, emin, emax, maxne, sr, k0, k1):
        """:func:`_fused_rows` for rows shorter than half a task (``2 * length <= _CHUNK``) with
        long blocks (``k >= _LONG_BLOCK``, float grid, per-block scales): each task takes
        ``_CHUNK // length`` whole rows (:func:`_run_rows`), where ``_fused_rows`` would take
        one.  Same arithmetic, same SR counters (``c_off + row * padded + l``)."""
        rpt = _CHUNK // length
        for u in prange((n_rows + rpt - 1) // rpt):
            r0 = u * rpt
            r1 = min(n_rows, r0 + rpt)
            _run_rows(x[r0 * length:r1 * length], out[r0 * length:r1 * length], r1 - r0, length,
                      k, c_off + r0 * padded, padded, sfmt, pow2, emax_elem, maxn, _Z, _Z, mbits,
                      emin, emax, maxne, sr, k0, k1)

    @njit(parallel=True, cache=True, error_model="numpy")
    def _fused_cols(x, out, n_outer, length, inner, k, padded, c_off, sfmt, pow2, emax_elem,
                    maxn, mul, t_dec, is_int, mbits, emin, emax, maxne, step, inv_step, sr, k0,
                    k1):
        """Blocks of ``k`` along the middle axis of ``x`` viewed ``(n_outer, length, inner)``
        (e.g. axis 0 of a matrix), without transposing: each task takes ``k`` rows of ``inner``
        columns, keeps their ``inner`` scales, and sweeps the rows again while they are in cache.
        SR counter: ``c_off + (o * inner + i) * padded + l`` (by default the padded blocks
        layout; a row shard passes its place in the whole tensor, ``padded`` its row stride)."""
        nb = (length + k - 1) // k
        for u in prange(n_outer * nb):
            o = u // nb
            b = u - o * nb
            l0 = b * k
            l1 = min(length, l0 + k)
            m = np.zeros(inner, np.int32)
            for li in range(l0, l1):
                xs = x[(o * length + li) * inner:(o * length + li + 1) * inner]
                for i in range(inner):
                    bi = _absbits(xs, i)
                    m[i] = bi if bi > m[i] else m[i]
            enc = np.empty(inner, np.float32)
            dec = np.empty(inner, np.float32)
            _scales(m, enc, dec, sfmt, pow2, emax_elem, maxn, mul, t_dec)
            first = l0  # the rows not rounded as pairs below
            base = c_off + o * inner * padded + l0  # SR counter of (o, column 0, row l0)
            if sr and not is_int and base & 1 == 0 and padded & 1 == 0:
                # rows l0 + 2t and l0 + 2t + 1 of column i have counters 2p and 2p + 1 of one
                # pair p = base / 2 + i * padded / 2 + t: one 32-bit hash gives both coins, if
                # every pair of the block shares the high word of the first
                p0 = base >> 1
                half = padded >> 1
                npr = (l1 - l0) >> 1
                if npr > 0 and (p0 & 0xFFFFFFFF) + (inner - 1) * half + npr - 1 < (1 << 32):
                    lo0 = p0 & 0xFFFFFFFF
                    c = k1 + (p0 >> 32) * SR_GOLDEN
                    hb = np.empty(inner, np.uint32)
                    for t in range(npr):
                        lo = (o * length + l0 + 2 * t) * inner
                        _sr_row_pair(x[lo:lo + inner], x[lo + inner:lo + 2 * inner],
                                     out[lo:lo + inner], out[lo + inner:lo + 2 * inner], enc,
                                     dec, t, half, lo0, k0, c, mbits, emin, emax, maxne, hb)
                    first = l0 + 2 * npr
            if not is_int and not sr:  # RNE onto a float grid: the row loop inline (a call
                # per row cost as much as the rounding at 64 columns)
                for li in range(l0, l1):
                    lo = (o * length + li) * inner
                    xr = x[lo:lo + inner]
                    orow = out[lo:lo + inner]
                    for i in range(inner):
                        _st(orow, i, _rne_elem(_ld(xr, i), enc[i], dec[i], mbits, emin, emax,
                                               maxne))
                continue
            for li in range(first, l1):
                lo = (o * length + li) * inner
                _any_span_vec(x[lo:lo + inner], out[lo:lo + inner], enc, dec,
                              c_off + o * inner * padded + li, padded, is_int, mbits, emin, emax,
                              maxne, step, inv_step, sr, k0, k1)

    @njit(parallel=True, cache=True, error_model="numpy")
    def _block_max_bits(x, kt, bmax):
        """NVFP4's first pass over whole blocks of ``len(kt)`` (a compile-time block size) of the
        flat ``x``: every block's |x| bit maximum into ``bmax``; returns the tensor amax of the
        blocks that hold no NaN/inf (0 if none), which the second pass (:func:`_fused_rows`
        with ``bmax``) needs before it can scale any block, and the largest |x| bits of all
        (at or above ``_FINITE_BITS``: some NaN/inf)."""
        k = len(kt)
        nb = bmax.shape[0]
        group = max(1, _CHUNK // k)
        ng = (nb + group - 1) // group
        part = np.zeros(ng, np.int32)
        raw = np.zeros(ng, np.int32)
        for g in prange(ng):
            b0 = g * group
            b1 = min(nb, b0 + group)
            _maxima(x[b0 * k:b1 * k], bmax[b0:b1], k)
            best = np.int32(0)
            top = np.int32(0)
            for b in range(b0, b1):
                v = bmax[b]
                top = v if v > top else top
                v = v if v < _FINITE_BITS else np.int32(0)
                best = v if v > best else best
            part[g] = best
            raw[g] = top
        return np.int32(part.max()).view(np.float32), raw.max()

    @njit(parallel=True, cache=True, error_model="numpy")
    def _tile_max_bits(x, r, c, k, bmax):
        """Square ``k x k`` tiles of the matrix ``x`` (flat, ``r x c``; edge tiles partial):
        every tile's |x| bit maximum into ``bmax`` (row-major over tiles), and the tensor amax
        of the tiles that hold no NaN/inf (NVFP4's tensor scale needs it first)."""
        rb = (r + k - 1) // k
        cb = (c + k - 1) // k
        part = np.zeros(rb, np.int32)
        for tb in prange(rb):
            m = bmax[tb * cb:(tb + 1) * cb]
            m[:] = 0
            for i in range(tb * k, min(r, (tb + 1) * k)):
                for t in range(cb):
                    v = _max_bits(x[i * c + t * k:i * c + min(c, (t + 1) * k)])
                    m[t] = v if v > m[t] else m[t]
            best = np.int32(0)
            for t in range(cb):
                v = m[t] if m[t] < _FINITE_BITS else np.int32(0)
                best = v if v > best else best
            part[tb] = best
        return np.int32(part.max()).view(np.float32)

    @njit(parallel=True, cache=True, error_model="numpy")
    def _fused_tiles(x, out, r, c, k, bmax, sfmt, pow2, emax_elem, maxn, mul, t_dec, mbits, emin,
                     emax, maxne):
        """RNE fake-quantization of ``x`` (flat ``r x c``) with one scale per ``k x k`` tile (the
        2-D weight tiles), without the tile transpose: each task takes one row of tiles, computes
        (or, with ``bmax``, reads) their maxima and scales, broadcasts the scales along a row
        once, and rounds the ``k`` rows while they are in cache."""
        rb = (r + k - 1) // k
        cb = (c + k - 1) // k
        for tb in prange(rb):
            i0 = tb * k
            i1 = min(r, i0 + k)
            if bmax.shape[0] > 0:
                m = bmax[tb * cb:(tb + 1) * cb]
            else:
                m = np.zeros(cb, np.int32)
                for i in range(i0, i1):
                    for t in range(cb):
                        v = _max_bits(x[i * c + t * k:i * c + min(c, (t + 1) * k)])
                        m[t] = v if v > m[t] else m[t]
            enc = np.empty(cb, np.float32)
            dec = np.empty(cb, np.float32)
            _scales(m, enc, dec, sfmt, pow2, emax_elem, maxn, mul, t_dec)
            enc_e = np.empty(c, np.float32)
            dec_e = np.empty(c, np.float32)
            for t in range(cb):
                enc_e[t * k:min(c, (t + 1) * k)] = enc[t]
                dec_e[t * k:min(c, (t + 1) * k)] = dec[t]
            for i in range(i0, i1):
                _rne_span_vec(x[i * c:(i + 1) * c], out[i * c:(i + 1) * c], enc_e, dec_e, mbits,
                              emin, emax, maxne)

    @njit(parallel=True, cache=True, error_model="numpy")
    def _clean_amax(x, n_rows, length, inner, k):
        """Max |x| over the blocks that hold no NaN/inf (NVFP4's tensor amax), 0 if none, and
        the largest |x| bits of all (at or above ``_FINITE_BITS``: some NaN/inf)."""
        nb = (length + k - 1) // k
        n_units = n_rows * nb
        part = np.zeros(n_units, np.int32)
        raw = np.zeros(n_units, np.int32)
        for u in prange(n_units):
            o = u // nb
            b = u - o * nb
            l1 = min(length, (b + 1) * k)
            if inner == 1:
                mb = _max_bits(x[o * length + b * k:o * length + l1])
                part[u] = mb if mb < _FINITE_BITS else 0
                raw[u] = mb
                continue
            m = np.zeros(inner, np.int32)
            for li in range(b * k, l1):
                xs = x[(o * length + li) * inner:(o * length + li + 1) * inner]
                for i in range(inner):
                    bi = _absbits(xs, i)
                    m[i] = bi if bi > m[i] else m[i]
            best = np.int32(0)
            top = np.int32(0)
            for i in range(inner):
                top = m[i] if m[i] > top else top
                if m[i] < _FINITE_BITS and m[i] > best:
                    best = m[i]
            part[u] = best
            raw[u] = top
        return np.int32(part.max()).view(np.float32), raw.max()

    @njit(parallel=True, cache=True, error_model="numpy")
    def _tensor_amax(x, chunk):
        """Max |x| of the whole tensor: NaN if it holds a NaN, else inf if it holds an inf."""
        n = x.shape[0]
        nc = (n + chunk - 1) // chunk
        part = np.zeros(nc, np.int32)
        for c in prange(nc):
            part[c] = _max_bits(x[c * chunk:min(n, (c + 1) * chunk)])
        return np.int32(part.max()).view(np.float32)


def quantize_columns(x: torch.Tensor, k: int, scales_fn, fmt: ElementFormat, rounding: Rounding,
                     generator: torch.Generator | None,
                     counters: Counters = DEFAULT_COUNTERS) -> torch.Tensor:
    """Fake-quantize a 2-D tensor with blocks of ``k`` consecutive rows in each column (axis 0),
    without transposing it; same result, bit for bit, as the blocked path (``counters``: the SR
    counters of that path's blocks view)."""
    _follow_torch_threads()
    x = x.contiguous()
    r, c = x.shape
    nb = -(-r // k)
    xs = _np(x).reshape(r, c)
    amax = torch.from_numpy(_amax_cols(xs, k)).T.reshape(-1, 1)
    scales = scales_fn(amax)
    sr = rounding is Rounding.STOCHASTIC
    k0, k1 = draw_key(generator) if sr else (0, 0)
    out = empty_like(x, torch.float32)
    f32 = np.float32
    _quant_cols(xs, k, scales.encode.reshape(c, nb).T.contiguous().numpy(),
                scales.decode.reshape(c, nb).T.contiguous().numpy(), k0, k1, out.numpy(),
                fmt.kind is Kind.INT, fmt.mbits, fmt.emin, fmt.emax, f32(fmt.max_normal),
                f32(fmt.step), f32(1.0 / fmt.step), sr, counters.offset,
                counters.stride if counters.row else nb * k)
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
    amax = torch.from_numpy(_amax_rows(_np(chunks).reshape(chunks.shape)))
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
    counters: Counters = DEFAULT_COUNTERS,
) -> torch.Tensor:
    """Round ``blocks * encode`` onto ``fmt`` (saturating); multiply by ``decode`` if asked.
    ``counters``: the SR counters of ``blocks`` in row-major order."""
    _follow_torch_threads()
    blocks = blocks.contiguous()
    sr = rounding is Rounding.STOCHASTIC
    k0, k1 = draw_key(generator) if sr else (0, 0)
    chunks, per_row = _chunked(blocks)
    enc = encode.reshape(-1).float()
    dec = decode.reshape(-1).float()
    if per_row > 1:
        enc, dec = enc.repeat_interleave(per_row), dec.repeat_interleave(per_row)
    out = torch.empty_like(chunks)
    is_int = fmt.kind is Kind.INT
    f32 = np.float32
    if not sr and not is_int:
        _quant_rows_rne_float(
            _np(chunks).reshape(chunks.shape),
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
        _np(chunks).reshape(chunks.shape),
        enc.contiguous().numpy(),
        dec.contiguous().numpy(),
        k0,
        k1,
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
        counters.offset,
        counters.row,
        counters.stride,
    )
    return out.view(blocks.shape)


if AVAILABLE:

    @njit(inline="always", error_model="numpy")
    def _bf16_bits(b):
        """fp32 bits -> fp32 bits of the nearest bf16 (ties to even), saturating at the bf16
        maximum (infinities too); NaN becomes 0xFFFF0000, the NaN torch's vectorized conversion
        writes (its scalar tail writes 0x7FC00000: NaN payloads are not part of the contract)."""
        a = b & np.uint32(0x7FFFFFFF)
        r = (b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) \
            & np.uint32(0xFFFF0000)
        sat = (b & np.uint32(0x80000000)) | np.uint32(0x7F7F0000)
        r = sat if a > np.uint32(0x7F7F0000) else r
        return np.uint32(0xFFFF0000) if a > np.uint32(0x7F800000) else r

    @njit(parallel=True, cache=True, error_model="numpy")
    def _bf16_rows(x, out, chunk):
        """:func:`_bf16_bits` of every element (``out``: uint32, fp32 bits; or uint16, the bf16
        bits themselves)."""
        n = x.shape[0]
        nc = (n + chunk - 1) // chunk
        for c in prange(nc):
            xs = x[c * chunk:min(n, (c + 1) * chunk)]
            os_ = out[c * chunk:min(n, (c + 1) * chunk)]
            for i in range(xs.shape[0]):
                _st_bits(os_, i, _bf16_bits(xs[i]))

    def _st_bits(a, i, r):  # pragma: no cover - replaced by the overload below
        raise NotImplementedError

    @overload(_st_bits, inline="always")
    def _st_bits_impl(a, i, r):
        """Store fp32 bits ``r`` whose low half is zero: as they are, or (uint16) the high half
        (not :func:`_st`: its rounding and NaN test, which these bits do not need, made the bf16
        store about 25 % slower)."""
        if a.dtype == types.uint16:
            def st16(a, i, r):
                a[i] = np.uint16(r >> np.uint32(16))
            return st16

        def st32(a, i, r):
            a[i] = r
        return st32


def round_bf16(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``cast(x, "bf16")`` of an fp32 CPU tensor (saturating, round to nearest even) in one pass:
    the torch path's clamp, bf16 conversion, conversion back and clamp, bit for bit; returned
    in ``dtype`` (fp32, or bf16: the same numbers in half the bytes), on one thread or torch's
    thread count (:class:`_ThreadChoice` per size for middle sizes, as :func:`quantize_fused`)."""
    x = x.contiguous()
    n = x.numel()
    choice = _BF16_CHOICES.get(n)
    if choice is None:
        if len(_BF16_CHOICES) >= _PLANS_MAX:
            _BF16_CHOICES.clear()
        choice = _BF16_CHOICES[n] = _ThreadChoice()
    timed, one = choice.threads(n)
    out = empty_like(x, dtype)
    t = 0.0 if timed is None else time.perf_counter()
    (_bf16_rows_1t if one else _bf16_rows)(_np(x, True), _np(out, dtype == torch.float32),
                                           _CHUNK * 4)
    if timed is not None:
        choice.record(timed, time.perf_counter() - t)
    return out


_BF16_CHOICES: dict[int, _ThreadChoice] = {}  # round_bf16's thread choice per element count


# ---------------------------------------------------------------------------------------------
# Output buffers
# ---------------------------------------------------------------------------------------------

_CACHE_MIN = 1 << 20  # smaller outputs come from torch.empty: glibc recycles those by itself


class _BufferCache:
    """Recycles the memory of snip's own large outputs once the caller drops them.

    A fresh large allocation is a fresh ``mmap`` whose pages fault in on first write: measured
    at 21-94 ms for 64 MiB in this project's VMs, 5-20x the cost of writing the data.  So each
    output of at least 1 MiB is a view of a buffer from this cache; when the tensor dies, a
    ``weakref.finalize`` returns the buffer (up to ``limit`` bytes of idle buffers are kept,
    ``SNIP_BUFFER_CACHE_MB``, default 1024; 0 turns recycling off).  Nothing process-wide
    changes: other allocations still go to the system allocator.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.idle: dict[int, list[np.ndarray]] = {}
        self.idle_bytes = 0
        self.lock = threading.RLock()  # a finalizer may run inside a locked section (GC)

    def _give_back(self, buf: np.ndarray) -> None:
        with self.lock:
            if self.idle_bytes + buf.nbytes <= self.limit:
                self.idle.setdefault(buf.nbytes, []).append(buf)
                self.idle_bytes += buf.nbytes

    def take(self, nbytes: int) -> np.ndarray:
        with self.lock:
            bufs = self.idle.get(nbytes)
            if bufs:
                self.idle_bytes -= nbytes
                return bufs.pop()
        return np.empty(nbytes, np.uint8)

    def empty(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        nbytes = shape.numel() * dtype.itemsize
        if self.limit <= 0 or nbytes < _CACHE_MIN:
            return torch.empty(shape, dtype=dtype)
        buf = self.take(nbytes)
        view = buf[:]  # the tensor owns this view; its death hands ``buf`` back
        weakref.finalize(view, self._give_back, buf)
        return torch.from_numpy(view).view(dtype).view(shape)

    def clear(self) -> None:
        with self.lock:
            self.idle.clear()
            self.idle_bytes = 0


_buffers = _BufferCache(int(float(os.environ.get("SNIP_BUFFER_CACHE_MB", "1024")) * (1 << 20)))


def empty_like(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An uninitialised CPU tensor of ``x``'s shape (contiguous) and dtype (or ``dtype``):
    recycled from snip's output-buffer cache when large, else from ``torch.empty_like`` (a
    third of ``torch.empty``'s per-call cost)."""
    dtype = dtype or x.dtype
    if _buffers.limit > 0 and x.numel() * dtype.itemsize >= _CACHE_MIN:
        return _buffers.empty(x.shape, dtype)
    if dtype == x.dtype and x.is_contiguous():  # (keywords cost ~0.5 us a call)
        return torch.empty_like(x)
    return torch.empty_like(x, dtype=dtype, memory_format=torch.contiguous_format)


def release_buffers() -> None:
    """Drop the idle output buffers this process keeps for reuse."""
    _buffers.clear()


# ---------------------------------------------------------------------------------------------
# One-call fused quantization (the default path of snip.formats.quantize)
# ---------------------------------------------------------------------------------------------

_IO_DTYPES = (torch.float32, torch.bfloat16)
_NO_BMAX = np.empty(0, np.int32)  # "no first pass": the kernels compute block maxima themselves


def fusable(x: torch.Tensor, spec: QuantSpec, rounding: Rounding | None = None) -> bool:
    """Whether :func:`quantize_fused` handles this input and spec (else: the blocked path).

    2-D tiles (``Scaling.BLOCK2D``: NVFP4 and 128x128 weight tiles) are fused for matrices
    with round-to-nearest-even when the caller says so (``rounding``); stochastic rounding of
    tiles (whose SR counter follows the transposed tile layout) takes the blocked path."""
    return kernel_for(x, spec, rounding) is Kernel.FUSED


class Kernel(enum.Enum):
    """Which one-pass kernel quantizes a call (:func:`kernel_for`)."""

    NONE = 0   # none: the blocked PyTorch path
    BF16 = 1   # round_bf16 (the bf16 preset)
    FUSED = 2  # quantize_fused


def kernel_for(x: torch.Tensor, spec: QuantSpec, rounding: Rounding | None) -> Kernel:
    """The kernel for ``quantize(x, spec, rounding=rounding)`` on this input: one dictionary
    look-up for the spec's part, then the input's dtype, device and shape (the two callers,
    :func:`snip.formats.quantize` and the GEMM operands, make this choice on every call)."""
    if not x.is_cpu or x.numel() == 0 or not enabled():
        return Kernel.NONE
    return _static_kernel(spec, rounding, x.dtype, x.dim())


def _static_kernel(spec: QuantSpec, rounding: Rounding | None, dtype: torch.dtype,
                   dim: int) -> Kernel:
    """:func:`kernel_for` for a non-empty CPU input with the kernels enabled: what the spec,
    the rounding and the input's dtype and dimension decide."""
    kind = _SPEC_KERNEL.get((spec, rounding))
    if kind is None:
        kind = _SPEC_KERNEL[(spec, rounding)] = _spec_kernel(spec, rounding)
    if kind == 0:
        return Kernel.NONE
    if kind == _BF16:
        return Kernel.BF16 if dtype == torch.float32 else Kernel.NONE
    if dtype not in _IO_DTYPES or dim == 0 or (kind == _RNE_MATRIX and dim != 2):
        return Kernel.NONE
    return Kernel.FUSED


_ANY, _RNE_MATRIX, _BF16 = 1, 2, 3  # the spec's part: any input, RNE matrices, bf16 cast
# a plain dictionary, not functools.cache: torch.compile traces this path (SNIP_FAST=0) and
# warns at every cache-wrapped call it meets
_SPEC_KERNEL: dict[tuple[QuantSpec, Rounding | None], int] = {}


def _spec_kernel(spec: QuantSpec, rounding: Rounding | None) -> int:
    """The part of :func:`kernel_for` that depends on the spec and rounding alone: 0 (none),
    ``_BF16`` (the bf16 cast, round-to-nearest), ``_ANY`` (fused for any input) or
    ``_RNE_MATRIX`` (2-D tiles: fused for matrices, round-to-nearest only)."""
    if spec.scaling is Scaling.NONE and spec.element.name == "bf16":
        return _BF16 if rounding is Rounding.RNE else 0
    if not supports(spec.element) or spec.hadamard:
        return 0
    if spec.scaling is Scaling.BLOCK2D:
        return _RNE_MATRIX if spec.element.kind is not Kind.INT and rounding is Rounding.RNE \
            else 0
    return _ANY if spec.scaling in (Scaling.TENSOR, Scaling.CHANNEL, Scaling.BLOCK) else 0


_NP_VIEW = {torch.float32: np.dtype(np.float32), torch.bfloat16: np.dtype(np.uint16)}
_U32 = np.dtype(np.uint32)
_CHAR = ctypes.c_char


def _np(t: torch.Tensor, bits32: bool = False) -> np.ndarray:
    """Flat numpy view of a contiguous CPU tensor: fp32 as float32 (``bits32``: as its uint32
    bits), bf16 as its uint16 bits.

    Made from the data pointer, not ``Tensor.numpy()``: that marks the tensor's storage
    non-resizable for good, and FSDP2 frees a gathered weight by resizing its storage to 0.
    The view does not keep ``t`` alive; callers hold ``t`` while a kernel runs on it.

    Making a view costs ~1.5 us, two per quantizer call; a training step passes the same few
    addresses again and again (the allocator recycles them), so views are kept by (address,
    element count, dtype) in :data:`_VIEWS`.  A kept view is a bare pointer and length that owns
    nothing: for a live tensor at that address and size it is exactly the view that would be
    made anew."""
    key = (t.data_ptr(), t.numel(), t.dtype, bits32)
    view = _VIEWS.get(key)
    if view is None:
        n = key[1]
        dtype = _U32 if bits32 and t.dtype == torch.float32 else _NP_VIEW[t.dtype]
        if n == 0:
            return np.empty(0, dtype)
        buf = (_CHAR * (n * t.element_size())).from_address(key[0])
        view = np.frombuffer(buf, dtype, n)  # (positional: keywords cost ~0.6 us more)
        if len(_VIEWS) >= _VIEWS_MAX:
            _VIEWS.clear()
        _VIEWS[key] = view
    return view


_VIEWS: dict[tuple, np.ndarray] = {}  # _np's views by (address, elements, dtype, bits32)
_VIEWS_MAX = 1024


@functools.cache
def _elem_params(fmt: ElementFormat) -> tuple[bool, int, int, int, np.float32, np.float32,
                                              np.float32]:
    """The element format's kernel arguments (made once per format: ~1 us per scalar)."""
    f32 = np.float32
    return (fmt.kind is Kind.INT, fmt.mbits, fmt.emin, fmt.emax, f32(fmt.max_normal),
            f32(fmt.step), f32(1.0 / fmt.step))


@functools.cache
def _scale_params(spec: QuantSpec) -> tuple[int, bool, int, np.float32]:
    fmt = spec.element
    if spec.scale_format is ScaleFormat.E8M0:
        sfmt = 1 if spec.e8m0_rule is E8M0Rule.FLOOR else 2
    else:
        sfmt = 3 if spec.scale_format is ScaleFormat.E4M3 else 0
    return sfmt, bool(spec.pow2_scales), int(fmt.emax), np.float32(fmt.max_normal)


_F32_MAX, _F32_TINY = np.finfo(np.float32).max, np.finfo(np.float32).tiny


if AVAILABLE:

    @njit(cache=True, error_model="numpy")
    def _tensor_scale_f32(amax, maxn):
        """:func:`_tensor_scale` on float32 scalars, in numba (numpy's fp32 scalar operations
        cost about 0.5 us each: several microseconds a call)."""
        one = np.float32(1.0)
        if not np.isfinite(amax):
            return np.float32(np.nan), np.float32(np.nan)
        s = one if amax == 0 else max(np.float32(amax / maxn), _F32_TINY)
        return one / s, s

    @njit(cache=True, error_model="numpy")
    def _nvfp4_tensor_scale_f32(x_amax, maxn):
        """:func:`_nvfp4_tensor_scale` on float32 scalars, in numba (each fp32 operation is
        correctly rounded, as numpy's and torch's are)."""
        one = np.float32(1.0)
        if x_amax == 0:
            s_enc = one
        else:
            s_enc = np.float32(np.float32(448.0) * maxn) / x_amax
            if s_enc > _F32_MAX:
                s_enc = _F32_MAX
            if s_enc == 0:
                s_enc = one
        inv_elem = np.float32(1.0 / np.float64(maxn))
        return s_enc * inv_elem, one / s_enc

    # NVFP4's two passes in one call from Python: the first pass, the tensor scale and the
    # rounding pass, each a kernel above, called from compiled code (a parallel kernel called
    # from a serial one runs its own parallel region, as from Python).  Against three calls
    # from Python this saves two dispatches, the scale's fp32 scalars and the block-maxima
    # array's allocation there: ~6 us a call (RESULTS §7ad).

    @njit(cache=True, error_model="numpy")
    def _rows_nvfp4(x, out, n_rows, length, k_rt, kt, padded, c_off, sfmt, pow2, emax_elem,
                    maxn, is_int, mbits, emin, emax, maxne, step, inv_step, sr, k0, k1):
        """:func:`_fused_rows` over whole blocks of ``len(kt)`` after :func:`_block_max_bits`
        (block maxima and tensor amax in one pass) and the tensor scale; returns the tensor
        amax, the largest |x| bits (at or above ``_FINITE_BITS``: some NaN/inf), ``mul`` and
        ``t_dec``."""
        bmax = np.empty(x.shape[0] // len(kt), np.int32)
        x_amax, top = _block_max_bits(x, kt, bmax)
        mul, t_dec = _nvfp4_tensor_scale_f32(x_amax, maxn)
        _fused_rows(x, out, n_rows, length, k_rt, kt, padded, c_off, bmax, sfmt, pow2,
                    emax_elem, maxn, mul, t_dec, np.float32(0), np.float32(0), is_int, mbits,
                    emin, emax, maxne, step, inv_step, sr, k0, k1)
        return x_amax, top, mul, t_dec

    @njit(cache=True, error_model="numpy")
    def _tiles_nvfp4(x, out, r, c, k, sfmt, pow2, emax_elem, maxn, mbits, emin, emax, maxne):
        """:func:`_fused_tiles` after :func:`_tile_max_bits` and the tensor scale (NVFP4's
        2-D weight tiles, round to nearest)."""
        bmax = np.empty(((r + k - 1) // k) * ((c + k - 1) // k), np.int32)
        x_amax = _tile_max_bits(x, r, c, k, bmax)
        mul, t_dec = _nvfp4_tensor_scale_f32(x_amax, maxn)
        _fused_tiles(x, out, r, c, k, bmax, sfmt, pow2, emax_elem, maxn, mul, t_dec, mbits,
                     emin, emax, maxne)

    def _one_thread_twin(kernel, **calls):
        """The one-thread build of an entry kernel: the same Python function compiled without
        ``parallel=True`` (its ``prange`` loops run in order on the calling thread), under a
        name of its own (``<name>_1t``: numba names its cache files after it), with ``calls``
        in place of the module's functions of those names (a compiled caller's parallel
        kernels).  The tasks do the same operations on the same elements, and the kernels'
        only cross-task results are integer maxima, so the bits are the parallel build's.  A
        parallel build called on one thread still opens a parallel region, which the twin does
        not (RESULTS §7ag: less time a call alone on most kinds; §7al: a ``tiny-deep`` training
        step lower for two presets of three, the rest unresolved on a noisy host).  The builds
        are separate compilations, so a loop one of them vectorizes may compile worse in the
        other: the column kernel's twin was the slower until :func:`_absbits` was typed int32
        (§7ag, §7ai)."""
        py = kernel.py_func
        scope = {**py.__globals__, **calls} if calls else py.__globals__
        twin = FunctionType(py.__code__, scope, py.__name__ + "_1t", py.__defaults__,
                            py.__closure__)
        twin.__qualname__ = py.__qualname__ + "_1t"
        return njit(cache=True, error_model="numpy")(twin)

    _fused_rows_1t = _one_thread_twin(_fused_rows)
    _fused_short_rows_1t = _one_thread_twin(_fused_short_rows)
    _fused_cols_1t = _one_thread_twin(_fused_cols)
    _fused_tiles_1t = _one_thread_twin(_fused_tiles)
    _clean_amax_1t = _one_thread_twin(_clean_amax)
    _tensor_amax_1t = _one_thread_twin(_tensor_amax)
    _bf16_rows_1t = _one_thread_twin(_bf16_rows)
    _rows_nvfp4_1t = _one_thread_twin(
        _rows_nvfp4, _fused_rows=_fused_rows_1t,
        _block_max_bits=_one_thread_twin(_block_max_bits))
    _tiles_nvfp4_1t = _one_thread_twin(
        _tiles_nvfp4, _fused_tiles=_fused_tiles_1t,
        _tile_max_bits=_one_thread_twin(_tile_max_bits))


def _tensor_scale(amax: np.float32, maxn: np.float32) -> tuple[np.float32, np.float32]:
    """(encode, decode) of :func:`snip.formats.scaling.fp32_scales` (no power-of-two rounding)
    for one amax, as numpy fp32 scalars: the same IEEE operations in the same order, without
    the eight tensor ops (~50 us) that a 1x1 tensor costs."""
    enc, dec = _tensor_scale_f32(np.float32(amax), np.float32(maxn))
    return np.float32(enc), np.float32(dec)  # (numba returns Python floats: exact, fp32 values)


def _nvfp4_tensor_scale(x_amax: np.float32, maxn: np.float32) -> tuple[np.float32, np.float32]:
    """NVFP4's (``S_enc / elem_max``, ``1 / S_enc``) from the tensor amax, as numpy fp32 scalars:
    :func:`snip.formats.scaling.nvfp4_encode_scale`'s operations in the same order."""
    mul, t_dec = _nvfp4_tensor_scale_f32(np.float32(x_amax), np.float32(maxn))
    return np.float32(mul), np.float32(t_dec)


def quantize_fused(x: torch.Tensor, spec: QuantSpec, axis: int, rounding: Rounding,
                   generator: torch.Generator | int | None,
                   counters: Counters = DEFAULT_COUNTERS,
                   dtype: torch.dtype | None = None, reuse_amax: bool = False) -> torch.Tensor:
    """``quantize(x, spec, axis=axis).to(dtype)`` in one output allocation and (mostly) one
    pass (``dtype``: fp32 or bf16, default ``x``'s), on one thread or torch's thread count
    (:class:`_ThreadChoice` for middle sizes).

    ``reuse_amax``: the caller vouches that ``x`` changes only through writes its version
    counter sees (an activation or a gradient inside a training step, not a weight written
    through ``.data``).  NVFP4's tensor amax, once computed for ``x`` with no NaN/inf in it, is
    then kept on ``x`` for its version with its block scales' ``mul`` and ``t_dec``, and a
    later call on ``x`` along the other axis skips the pass and the scale that would compute
    them again (the amax of all elements does not depend on the blocks).

    Same bits as the PyTorch path: the block scales follow :mod:`snip.formats.scaling`
    operation for operation, the SR coin is :func:`snip.formats.cast.counter_uniforms` of the
    element's index in the padded blocks layout mapped by ``counters``, and the fp32 -> bf16
    store rounds as torch.  ``generator``: a generator, an int seed (the key
    :func:`~snip.formats.cast.seed_key` gives, as ``quantize`` would draw it) or ``None`` (the
    global RNG).  Everything a call needs besides the data and the SR key is worked out once per
    (spec, shape, axis, rounding, counters, dtypes) (:class:`_FusedCall`).
    """
    dtype = dtype or x.dtype
    sr = rounding is Rounding.STOCHASTIC
    key = (spec, x.shape, axis, sr, None if counters is DEFAULT_COUNTERS else counters,
           x.dtype, dtype)
    call = _PLANS.get(key)
    if call is None:
        call = _fused_call(key, x, spec, axis, sr, counters, dtype)
    return call(x, generator, reuse_amax)


def _fused_call(key: tuple, x: torch.Tensor, spec: QuantSpec, axis: int, sr: bool,
                counters: Counters, dtype: torch.dtype) -> _FusedCall:
    """The :class:`_FusedCall` for ``key`` (:func:`quantize_fused`'s key of the other
    arguments), from :data:`_PLANS` or made and kept there."""
    call = _PLANS.get(key)
    if call is not None:
        return call
    if not -x.dim() <= axis < x.dim():
        raise ValueError(f"axis {axis} is out of range for a {x.dim()}-D tensor")
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.clear()
    run = _plan(spec, tuple(x.shape), axis % x.dim(), sr, counters)
    call = _PLANS[key] = _FusedCall(run, x, dtype, sr, spec.scale_format is ScaleFormat.E4M3)
    return call


class _FusedCall:
    """One kind of :func:`quantize_fused` call (spec, shape, axis, rounding, counters, input
    and output dtypes): the planned kernel run (:func:`_plan`), its thread choice, and how its
    output is allocated, all decided when the kind is first seen.  Calling it with the input
    (of that shape and dtype), the SR generator or seed, and ``reuse_amax`` quantizes."""

    __slots__ = ("run", "choice", "n", "dtype", "plain", "sr", "nvfp4")

    def __init__(self, run: _Run, x: torch.Tensor, dtype: torch.dtype, sr: bool,
                 nvfp4: bool) -> None:
        self.run, self.choice, self.n, self.dtype = run, _ThreadChoice(), x.numel(), dtype
        # a small output of the input's dtype: torch.empty_like of the contiguous input
        self.plain = dtype == x.dtype and self.n * dtype.itemsize < _CACHE_MIN
        self.sr, self.nvfp4 = sr, nvfp4

    def __call__(self, x: torch.Tensor, generator: torch.Generator | int | None,
                 reuse_amax: bool = False) -> torch.Tensor:
        src = x
        x = x.contiguous()
        timed, one = self.choice.threads(self.n)
        out = torch.empty_like(x) if self.plain else empty_like(x, self.dtype)
        if not self.sr:
            k0 = k1 = 0
        elif isinstance(generator, int) and not isinstance(generator, bool):
            k0, k1 = seed_key(generator)
        else:
            k0, k1 = draw_key(generator)
        t = 0.0 if timed is None else time.perf_counter()
        run = self.run
        if not self.nvfp4:
            run(_np(x), _np(out), k0, k1, one)
        elif not reuse_amax or src.is_inference():  # (an inference tensor has no version counter)
            run(_np(x), _np(out), k0, k1, one, None)
        else:
            kept = getattr(src, _AMAX_ATTR, None)
            known = kept[1:] if kept is not None and kept[0] == src._version else None
            found = run(_np(x), _np(out), k0, k1, one, known)
            if known is None and found is not None:
                setattr(src, _AMAX_ATTR, (src._version, *found))
        if timed is not None:
            self.choice.record(timed, time.perf_counter() - t)
        return out


class _Bf16Call:
    """:func:`round_bf16` into one output dtype, called as a :class:`_FusedCall` is."""

    __slots__ = ("dtype",)

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __call__(self, x: torch.Tensor, generator: torch.Generator | int | None,
                 reuse_amax: bool = False) -> torch.Tensor:
        return round_bf16(x, self.dtype)


def planned(x: torch.Tensor, spec: QuantSpec, axis: int, rounding: Rounding,
            dtype: torch.dtype, shard: RowShard | None = None) -> _FusedCall | _Bf16Call | None:
    """The one-pass kernel call for ``quantize(x, spec, axis=axis, rounding=rounding,
    shard=shard)`` stored in ``dtype`` (``x``'s, or bf16 for fp32 ``x``), or ``None`` where
    none applies (then the caller takes :func:`snip.formats.quantize`'s general path).  Call the
    result with ``x``, the SR seed or generator and ``reuse_amax`` (:func:`quantize_fused`).

    The GEMM operands' entry: the choice :func:`kernel_for` makes and the plan
    :func:`quantize_fused` looks up are kept together per (spec, shape, axis, rounding,
    dtypes, and for stochastic rounding the row shard), so that a call in a training step costs
    one dictionary look-up here and the device and ``SNIP_FAST`` checks (a 64 x 64 operand's
    call about 2 us less than those two functions one after the other, RESULTS §7v; a 1024 x
    128 operand of one rank's tokens, or of a micro-batch, about 40 us less than ``quantize``
    with its shard, RESULTS §7y).  A shard that does not fit ``x`` raises as ``quantize`` does,
    on every call (nothing is kept for it)."""
    sr = rounding is Rounding.STOCHASTIC
    if not sr:
        shard = None  # round-to-nearest draws no coins: the shard changes nothing
    key = (spec, x.shape, axis, sr, x.dtype, dtype, shard)
    call = _CALLS.get(key)
    if call is None:
        call = False
        # stored in x's dtype, or fp32 data stored in bf16 (a rounding at the store)
        stores = dtype == x.dtype or (x.dtype, dtype) == (torch.float32, torch.bfloat16)
        kernel = Kernel.NONE if x.numel() == 0 or not stores else _static_kernel(
            spec, rounding, x.dtype, x.dim())
        if kernel is Kernel.BF16:
            call = _Bf16Call(dtype)
        elif kernel is Kernel.FUSED:
            counters = DEFAULT_COUNTERS if shard is None else BlockLayout.of(
                x, spec, axis).counters(shard)  # (raises for a shard that does not fit)
            placed = None if counters is DEFAULT_COUNTERS else counters
            call = _fused_call((spec, x.shape, axis, sr, placed, x.dtype, dtype), x, spec, axis,
                               sr, counters, dtype)
        if len(_CALLS) >= _PLANS_MAX:
            _CALLS.clear()
        _CALLS[key] = call
    return call if call and x.is_cpu and enabled() else None


# NVFP4's tensor amax and the (mul, t_dec) of its block scales, as fp32 scalars
_Known = tuple[np.float32, np.float32, np.float32]
# (x, out, SR key words, one thread?) -> None; one thread: the one-thread twins.  NVFP4's runs
# take one more argument, the _Known of the tensor if known, and return the one they computed
# where the tensor holds no NaN/inf (else None)
_Run = Callable[..., _Known | None]
_PLANS: dict[tuple, _FusedCall] = {}  # quantize_fused's calls by kind
_PLANS_MAX = 4096  # distinct calls remembered (a training run makes a few dozen)
# planned's choice by kind: the call, or False (no one-pass kernel)
_CALLS: dict[tuple, _FusedCall | _Bf16Call | bool] = {}
_Z = np.float32(0)
_AMAX_ATTR = "_snip_nvfp4_amax"  # (version, *_Known) kept on a tensor (``reuse_amax``)


def _plan(spec: QuantSpec, shape: tuple[int, ...], axis: int, sr: bool,
          counters: Counters) -> _Run:
    """The kernel call of :func:`quantize_fused` for one spec, shape, axis, rounding and SR
    counter map, with every argument that does not depend on the data fixed; what does (a
    tensor amax, NVFP4's first pass) is computed by the returned function on each call."""
    f32 = np.float32
    fmt = spec.element
    elem = (*_elem_params(fmt), sr)
    sfmt, pow2, emax_elem, maxn = _scale_params(spec)
    n = math.prod(shape)
    if spec.scaling is Scaling.BLOCK2D:  # RNE with square tiles (fusable's condition)
        return _tiles_plan(spec, shape, sfmt, pow2, emax_elem, maxn)
    if spec.scaling is Scaling.TENSOR:
        head = (1, n, _CHUNK, (), n, counters.offset, _NO_BMAX, -1, pow2, emax_elem, maxn, _Z, _Z)

        def tensor(xs: np.ndarray, os_: np.ndarray, k0: int, k1: int, one: bool) -> None:
            t_amax = (_tensor_amax_1t if one else _tensor_amax)(xs, _CHUNK)
            if spec.pow2_scales:
                sc = fp32_scales(torch.tensor([[float(t_amax)]], dtype=torch.float32), spec)
                t_enc, t_dec = f32(sc.encode.item()), f32(sc.decode.item())
            else:
                t_enc, t_dec = _tensor_scale(t_amax, maxn)  # (it makes both fp32 scalars)
            (_fused_rows_1t if one else _fused_rows)(xs, os_, *head, t_enc, t_dec, *elem, k0, k1)
        return tensor
    outer = math.prod(shape[:axis])
    length = shape[axis]
    inner = n // (outer * length)
    k = length if spec.scaling is Scaling.CHANNEL else spec.block
    padded = -(-length // k) * k
    whole = inner == 1 and length % k == 0
    kt = (0,) * k if k in (16, 32) and length % k == 0 else ()
    first = _nvfp4_first_pass(fmt, outer, length, inner, k) if sfmt == 3 else None
    stride = counters.stride if counters.row else padded  # the SR counters' row stride
    if inner == 1:
        if whole and stride == padded:  # whole blocks: one long row balances best
            outer, length, padded = 1, outer * length, outer * length
            stride = padded
        if first is None and k >= _LONG_BLOCK and 2 * length <= _CHUNK and not elem[0]:
            short = (outer, length, k, stride, counters.offset, sfmt, pow2, emax_elem, maxn,
                     *elem[1:5], sr)

            def short_rows(xs: np.ndarray, os_: np.ndarray, k0: int, k1: int, one: bool) -> None:
                (_fused_short_rows_1t if one else _fused_short_rows)(xs, os_, *short, k0, k1)
            return short_rows
        head = (outer, length, k, kt, stride, counters.offset)
        mid = (sfmt, pow2, emax_elem, maxn)
        if first is None:
            args = (*head, _NO_BMAX, *mid, _Z, _Z, _Z, _Z, *elem)

            def rows(xs: np.ndarray, os_: np.ndarray, k0: int, k1: int, one: bool) -> None:
                (_fused_rows_1t if one else _fused_rows)(xs, os_, *args, k0, k1)
            return rows

        if kt:  # whole blocks: block maxima, scale and rounding in one call
            def rows_nvfp4_whole(xs: np.ndarray, os_: np.ndarray, k0: int, k1: int, one: bool,
                                 known: _Known | None) -> _Known | None:
                x_amax, top, mul, t_dec = (_rows_nvfp4_1t if one else _rows_nvfp4)(
                    xs, os_, *head, *mid, *elem, k0, k1)
                return (f32(x_amax), f32(mul), f32(t_dec)) if top < _FINITE_BITS else None
            return rows_nvfp4_whole

        def rows_nvfp4(xs: np.ndarray, os_: np.ndarray, k0: int, k1: int, one: bool,
                       known: _Known | None) -> _Known | None:
            mul, t_dec, amax = first(xs, one, known)
            (_fused_rows_1t if one else _fused_rows)(xs, os_, *head, _NO_BMAX, *mid, mul, t_dec,
                                                     _Z, _Z, *elem, k0, k1)
            return amax
        return rows_nvfp4
    head = (outer, length, inner, k, stride, counters.offset, sfmt, pow2, emax_elem, maxn)
    if first is None:
        args = (*head, _Z, _Z, *elem)

        def cols(xs: np.ndarray, os_: np.ndarray, k0: int, k1: int, one: bool) -> None:
            _cols_kernel(one, os_)(xs, os_, *args, k0, k1)
        return cols

    def cols_nvfp4(xs: np.ndarray, os_: np.ndarray, k0: int, k1: int, one: bool,
                   known: _Known | None) -> _Known | None:
        mul, t_dec, amax = first(xs, one, known)
        _cols_kernel(one, os_)(xs, os_, *head, mul, t_dec, *elem, k0, k1)
        return amax
    return cols_nvfp4


def _cols_kernel(one: bool, out: np.ndarray) -> Callable[..., None]:
    """The column kernel build a call runs: the one-thread twin for a one-thread call writing
    fp32, else the parallel build (on one thread too for a bf16 output, itemsize 2: the column
    twin stored bf16 elements 1.9-24x slower than fp32 ones, the parallel build 0.8-2.3x; why
    is not found, RESULTS §7an)."""
    return _fused_cols_1t if one and out.itemsize == 4 else _fused_cols


def _nvfp4_first_pass(fmt: ElementFormat, outer: int, length: int, inner: int,
                      k: int) -> Callable[[np.ndarray, bool, _Known | None], tuple]:
    """NVFP4's pass before the rounding where the blocks are not whole rows of a compile-time
    size (those take :func:`_rows_nvfp4`): the tensor amax, turned into the (``mul``,
    ``t_dec``) of the block scales; returned with what the caller keeps (:data:`_Known`;
    ``None`` where some element is NaN/inf: the amax of the blocks without one depends on the
    blocks).  With it ``known``, there is no pass and no scale to compute."""
    maxn = np.float32(fmt.max_normal)

    def first(xs: np.ndarray, one: bool, known: _Known | None) -> tuple:
        if known is not None:
            return known[1], known[2], known
        x_amax, top = (_clean_amax_1t if one else _clean_amax)(xs, outer, length, inner, k)
        amax = np.float32(x_amax)
        mul, t_dec = _nvfp4_tensor_scale(amax, maxn)
        return mul, t_dec, (amax, mul, t_dec) if top < _FINITE_BITS else None
    return first


def _tiles_plan(spec: QuantSpec, shape: tuple[int, ...], sfmt: int, pow2: bool,
                emax_elem: int, maxn: np.float32) -> _Run:
    """RNE with square 2-D tiles (same tiles whatever the axis: a tile's scale is its amax)."""
    fmt = spec.element
    r, c = shape
    k = spec.block
    tail = (fmt.mbits, fmt.emin, fmt.emax, np.float32(fmt.max_normal))
    if sfmt != 3:
        def tiles(xs: np.ndarray, os_: np.ndarray, k0: int, k1: int, one: bool) -> None:
            (_fused_tiles_1t if one else _fused_tiles)(xs, os_, r, c, k, _NO_BMAX, sfmt, pow2,
                                                       emax_elem, maxn, _Z, _Z, *tail)
        return tiles

    def tiles_nvfp4(xs: np.ndarray, os_: np.ndarray, k0: int, k1: int, one: bool,
                    known: _Known | None) -> None:
        # (the tile maxima are needed whatever is known: ``known`` would save nothing)
        (_tiles_nvfp4_1t if one else _tiles_nvfp4)(xs, os_, r, c, k, sfmt, pow2, emax_elem,
                                                   maxn, *tail)
    return tiles_nvfp4
