"""Fill numba's on-disk cache with every quantizer kernel a run can call (once, after install).

Why: compiling the kernels takes about 90 s, which the first training process (or test run)
would otherwise spend.  It was first added for a second reason that did not hold up: bf16-output
row calls (``accum="auto"``/``"bf16"``) ran up to 8x slower in a process that had compiled the
kernels than in one that loaded them from the cache, but a second pair of runs was as slow when
loading from the cache (RESULTS §7g).  The cause of that slowdown is not known, and this warm-up
does not prevent it.  ``make setup`` runs::

    python -m snip.formats.warm

which calls every quantizer path on small tensors -- every preset, both axes, both roundings,
fp32 and bf16 inputs and outputs, whole and partial blocks, weight tiles and packed encoding --
so that every later process loads the compiled kernels instead of compiling them.  Without it
everything still works (and is bit-identical); only the first process pays the compile time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from snip.formats import fast
from snip.formats.quantize import encode, quantize
from snip.formats.rounding import Rounding
from snip.formats.spec import PRESETS, QuantSpec, Scaling

# (64, 64): whole blocks of every size (the compile-time block-size kernels); (16, 200): partial
# blocks, and rows shorter than half a task with 1x128 blocks
SHAPES = ((64, 64), (16, 200))
# (input, output): bf16 in, fp32 out takes the PyTorch path's column kernels
_DTYPES = ((torch.float32, torch.float32), (torch.float32, torch.bfloat16),
           (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32))


def calls() -> Iterator[tuple[QuantSpec, tuple[int, int], int, Rounding, torch.dtype,
                              torch.dtype]]:
    """Every (spec, shape, axis, rounding, input dtype, output dtype) :func:`warm` runs through
    :func:`~snip.formats.quantize`: every preset's spec, and its 2-D spec for weight tiles."""
    for name, spec in PRESETS.items():
        if spec.scaling is Scaling.NONE and name != "bf16":
            continue  # fp32 is the identity, fp16 runs in torch
        specs = [spec] + ([spec.for_weight()] if spec.weight_2d else [])
        for s in specs:
            for shape in SHAPES:
                for axis in (-1, 0):
                    for rounding in Rounding:
                        for dt_in, dt_out in _DTYPES:
                            if s.scaling is Scaling.NONE and dt_in != torch.float32:
                                continue  # the bf16 cast of a bf16 tensor: no kernel
                            yield s, shape, axis, rounding, dt_in, dt_out


def warm() -> int:
    """Run every call of :func:`calls` (and :func:`~snip.formats.encode` of the scaled specs in
    fp32); return how many calls it made."""
    g = torch.Generator().manual_seed(0)
    n = 0
    for spec, shape, axis, rounding, dt_in, dt_out in calls():
        x = torch.randn(shape, generator=g).to(dt_in)
        quantize(x, spec, axis=axis, rounding=rounding, generator=0, dtype=dt_out)
        n += 1
        if dt_in == dt_out == torch.float32 and spec.scaling is not Scaling.NONE:
            encode(x, spec, axis=axis, rounding=rounding, generator=0)
            n += 1
    return n


def main() -> None:
    if not fast.enabled():
        print("snip.formats.warm: the fused kernels are off (numba missing or SNIP_FAST=0)")
        return
    t = time.perf_counter()
    n = warm()
    seconds = time.perf_counter() - t
    print(f"snip.formats.warm: {n} quantizer calls, kernels in numba's cache ({seconds:.0f} s)")


if __name__ == "__main__":
    main()
