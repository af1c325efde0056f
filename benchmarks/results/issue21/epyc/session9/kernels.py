"""Session 9's kernel figures: numba's quantizer kernels called directly (no snip Python), one
thread, best of 7 rounds, in ns an element; and the block-maxima and rounding pieces alone.

Run it in each tree (``PYTHONPATH=<tree>/src``) to compare two commits; its output for
``c5dfe8a8`` and ``52e1ac6e`` is in ``kernels.txt``.

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session9/kernels.py
"""

import time

import numba
import numpy as np
import torch

from snip.formats import fast
from snip.formats.cast import DEFAULT_COUNTERS
from snip.formats.spec import ScaleFormat, Scaling, get_spec

f32 = np.float32


def best(f, n: int = 300) -> float:
    """Best mean seconds per call over 7 rounds of ``n`` calls (after 20 untimed)."""
    for _ in range(20):
        f()
    out = float("inf")
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(n):
            f()
        out = min(out, (time.perf_counter() - t) / n)
    return out


def main() -> None:
    numba.set_num_threads(1)
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    for shape in [(1024, 64), (1024, 192)]:
        xs = rng.standard_normal(shape[0] * shape[1]).astype(np.float32)
        os_ = np.empty_like(xs)
        for name in ["mxfp4", "mxfp8_e4m3", "nvfp4", "fp8_e4m3"]:
            spec = get_spec(name)
            two = spec.scale_format is ScaleFormat.E4M3 and spec.scaling is not Scaling.TENSOR
            for axis in (1, 0):
                for sr in (False, True):
                    run = fast._plan(spec, shape, axis, sr, DEFAULT_COUNTERS)
                    extra = (None,) if two else ()
                    t = best(lambda run=run, a=xs, o=os_, extra=extra: run(a, o, 1, 2, *extra))
                    print(f"{shape[0]}x{shape[1]:<4d} {name:11s} axis {axis} "
                          f"{'SR ' if sr else 'RNE'} {t / xs.size * 1e9:6.3f} ns/el")
    xs = rng.standard_normal(1 << 16).astype(np.float32)
    os_ = np.empty_like(xs)
    for k in (16, 32):
        bmax = np.empty(xs.size // k, np.int32)
        t = best(lambda k=k, bmax=bmax: fast._block_max_bits(xs, (0,) * k, bmax))
        print(f"block maxima, blocks of {k:2d}    {t / xs.size * 1e9:6.3f} ns/el")
    t = best(lambda: fast._tensor_amax(xs, 4096))
    print(f"tensor amax                  {t / xs.size * 1e9:6.3f} ns/el")
    t = best(lambda: fast._rne_span(xs, os_, f32(1), f32(1), 1, 0, 2, f32(6)))
    print(f"RNE span (e2m1, one scale)   {t / xs.size * 1e9:6.3f} ns/el")


if __name__ == "__main__":
    main()
