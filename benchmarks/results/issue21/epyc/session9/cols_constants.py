"""Scratch study behind §7t's last note: how much of the column kernel's time is its format
parameters being run-time values.  Three replicas of ``_fused_cols``'s RNE path for MXFP4 (blocks
of 32 rows, e8m0 scales), each checked bit for bit against the real kernel, timed with it on a
1024 x 64 operand, one thread, best of 7 rounds, ns an element:

- ``constants``: the format and scale parameters written as constants (what a kernel compiled
  for one format would see);
- ``runtime``: the same code with them as arguments, as the real kernel takes them;
- ``branch_free``: ``runtime`` with the e8m0 scales' ``2^k`` computed without a branch.

RESULTS §7t quotes a run on ``756b795a``.  From ``759f2b99`` on, ``fast._scales`` itself has
the branch-free ``2^k``, so there ``runtime`` already includes the fix and sits near
``branch_free``.

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session9/cols_constants.py
"""

import numba
import numpy as np
from kernels import best  # (this folder's kernels.py: the script's own folder is on sys.path)
from numba import njit, prange

from snip.formats import fast
from snip.formats.cast import DEFAULT_COUNTERS
from snip.formats.spec import get_spec

f32 = np.float32
ROWS, COLS, K = 1024, 64, 32


@njit(inline="always", error_model="numpy")
def _col_maxima(x, l0, l1, inner):
    m = np.zeros(inner, np.int32)
    for li in range(l0, l1):
        xs = x[li * inner:(li + 1) * inner]
        for i in range(inner):
            bi = fast._absbits(xs, i)
            m[i] = bi if bi > m[i] else m[i]
    return m


@njit(inline="always", error_model="numpy")
def _round_rows(x, out, l0, l1, inner, enc, dec, mbits, emin, emax, maxne):
    for li in range(l0, l1):
        xr = x[li * inner:(li + 1) * inner]
        orow = out[li * inner:(li + 1) * inner]
        for i in range(inner):
            orow[i] = fast._rne_elem(xr[i], enc[i], dec[i], mbits, emin, emax, maxne)


@njit(parallel=True, error_model="numpy")
def constants(x, out, length, inner, k):
    for b in prange((length + k - 1) // k):
        l0, l1 = b * k, min(length, (b + 1) * k)
        m = _col_maxima(x, l0, l1, inner)
        enc, dec = np.empty(inner, np.float32), np.empty(inner, np.float32)
        fast._scales(m, enc, dec, 1, True, 2, f32(6), f32(0), f32(0))
        _round_rows(x, out, l0, l1, inner, enc, dec, 1, 0, 2, f32(6))


@njit(parallel=True, error_model="numpy")
def runtime(x, out, length, inner, k, sfmt, pow2, emax_elem, maxn, mbits, emin, emax, maxne):
    for b in prange((length + k - 1) // k):
        l0, l1 = b * k, min(length, (b + 1) * k)
        m = _col_maxima(x, l0, l1, inner)
        enc, dec = np.empty(inner, np.float32), np.empty(inner, np.float32)
        fast._scales(m, enc, dec, sfmt, pow2, emax_elem, maxn, f32(0), f32(0))
        _round_rows(x, out, l0, l1, inner, enc, dec, mbits, emin, emax, maxne)


@njit(inline="always", error_model="numpy")
def _exp2_branch_free(k):
    """``fast._exp2_int`` as a select of both results (shift clamped so both are defined)."""
    b = np.int32(1) << np.int32(min(max(k + 149, 0), 31))
    return np.int32(np.int32((k + 127) << 23) if k >= -126 else b).view(np.float32)


@njit(error_model="numpy")
def _e8m0_scales(m, enc, dec, emax_elem):
    for i in range(m.shape[0]):
        bits = m[i]
        kk = min(max(((bits >> 23) & 0xFF) - 127 - emax_elem, -127), 127)
        fin = bits < fast._FINITE_BITS
        e, d = _exp2_branch_free(-kk), _exp2_branch_free(kk)
        enc[i] = e if fin else _exp2_branch_free(-128)
        dec[i] = d if fin else np.float32(np.nan)


@njit(parallel=True, error_model="numpy")
def branch_free(x, out, length, inner, k, emax_elem, mbits, emin, emax, maxne):
    for b in prange((length + k - 1) // k):
        l0, l1 = b * k, min(length, (b + 1) * k)
        m = _col_maxima(x, l0, l1, inner)
        enc, dec = np.empty(inner, np.float32), np.empty(inner, np.float32)
        _e8m0_scales(m, enc, dec, emax_elem)
        _round_rows(x, out, l0, l1, inner, enc, dec, mbits, emin, emax, maxne)


def main() -> None:
    numba.set_num_threads(1)
    x = np.random.default_rng(0).standard_normal(ROWS * COLS).astype(np.float32)
    want, got = np.empty_like(x), np.empty_like(x)
    real = fast._plan(get_spec("mxfp4"), (ROWS, COLS), 0, False, DEFAULT_COUNTERS)
    real(x, want, 1, 2)
    fmt = (1, 0, 2, f32(6))
    arms = {
        "real kernel": lambda: real(x, got, 1, 2),
        "constants": lambda: constants(x, got, ROWS, COLS, K),
        "runtime": lambda: runtime(x, got, ROWS, COLS, K, 1, True, 2, f32(6), *fmt),
        "branch_free": lambda: branch_free(x, got, ROWS, COLS, K, 2, *fmt),
    }
    for name, f in arms.items():
        got[:] = 0
        f()
        assert np.array_equal(got.view(np.int32), want.view(np.int32)), name
    for _ in range(2):
        for name, f in arms.items():
            print(f"{name:12s} {best(f) / x.size * 1e9:.3f} ns/el")


if __name__ == "__main__":
    main()
