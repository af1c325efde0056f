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

numba compiles on one thread, so the calls are split by their (input, output) dtypes, which
decide the kernels' signatures, over ``--jobs`` processes (default: one per CPU, at most
four; each peaks at about 800 MiB while compiling).  numba's cache is not safe for two
processes saving entries of one function at once: each rewrites the function's index, and
both may take the same data file name.  So those processes hold a file lock around each save
(:func:`_locked_saves`).  Last, this process runs every call once more, loading what they
saved and compiling anything they did not.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
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


def part_of(dt_in: torch.dtype, dt_out: torch.dtype, parts: int) -> int:
    """Which of ``parts`` processes runs the calls of these dtypes: the dtype pairs in
    :data:`_DTYPES` order, in contiguous groups (two parts: by input dtype, so that no kernel
    signature is compiled in both)."""
    return _DTYPES.index((dt_in, dt_out)) * parts // len(_DTYPES)


def warm(part: int = 0, parts: int = 1) -> int:
    """Run every call of :func:`calls` (and :func:`~snip.formats.encode` of the scaled specs in
    fp32), or only part ``part`` of ``parts`` (:func:`part_of`); return how many calls it
    made.  The quantizer calls run twice: on the entry kernels' parallel builds, and on their
    one-thread twins, which calls on one thread take (``fast._TWINS``)."""
    g = torch.Generator().manual_seed(0)
    n = 0
    twins = fast._TWINS
    try:
        for spec, shape, axis, rounding, dt_in, dt_out in calls():
            if parts > 1 and part_of(dt_in, dt_out, parts) != part:
                continue
            x = torch.randn(shape, generator=g).to(dt_in)
            for fast._TWINS in (False, True):
                quantize(x, spec, axis=axis, rounding=rounding, generator=0, dtype=dt_out)
                n += 1
            if dt_in == dt_out == torch.float32 and spec.scaling is not Scaling.NONE:
                encode(x, spec, axis=axis, rounding=rounding, generator=0)
                n += 1
    finally:
        fast._TWINS = twins
    return n


def _locked_saves() -> bool:
    """Make each of numba's cache saves exclusive among the processes that call this (an
    ``flock`` on a file beside the cache's index): a save reads the function's index, picks a
    free data file name and rewrites the index, which two processes must not interleave.
    False where that cannot be done here (no ``fcntl``, or a numba without that method): then
    the warm-up runs in one process.  A second call changes nothing: a save wrapped twice would
    open the lock file twice and wait on itself (``flock`` locks per open file)."""
    try:
        import fcntl

        from numba.core import caching
        real = caching.IndexDataCacheFile.save
    except (ImportError, AttributeError):
        return False
    if getattr(real, "_snip_locked", False):
        return True

    def save(self, key, data) -> None:
        with open(os.path.join(self._cache_path, ".snip-warm.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            real(self, key, data)

    save._snip_locked = True
    caching.IndexDataCacheFile.save = save
    return True


def default_jobs() -> int:
    """One process per CPU this process may use, at most one per dtype pair (four)."""
    affinity = getattr(os, "sched_getaffinity", None)  # (Linux; elsewhere the CPU count)
    cpus = len(affinity(0)) if affinity else os.cpu_count() or 1
    return max(1, min(len(_DTYPES), cpus))


def warm_parallel(jobs: int) -> int:
    """:func:`warm` split over ``jobs`` processes (:func:`part_of`), then all of it once more
    here (loading what they saved; compiling what they did not); returns the calls made here.
    A failing process raises ``RuntimeError`` with its output."""
    if jobs > 1 and _locked_saves():  # (checks here that the children can lock their saves)
        procs = [subprocess.Popen([sys.executable, "-m", "snip.formats.warm", "--part",
                                   f"{i}/{jobs}"], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
                 for i in range(jobs)]
        for i, proc in enumerate(procs):
            out, _ = proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"snip.formats.warm part {i}/{jobs} failed "
                                   f"(exit {proc.returncode}):\n{out}")
    return warm()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m snip.formats.warm",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=default_jobs(),
                    help="processes that compile at once (default: one per CPU, at most 4)")
    ap.add_argument("--part", help=argparse.SUPPRESS)  # "i/n": one part, in a child process
    args = ap.parse_args(argv)
    if not fast.enabled():
        print("snip.formats.warm: the fused kernels are off (numba missing or SNIP_FAST=0)")
        return
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    if args.part is not None:
        part, parts = (int(v) for v in args.part.split("/"))
        if not _locked_saves():
            raise SystemExit("snip.formats.warm: cannot lock numba's cache saves here")
        warm(part, parts)
        return
    procs = f"{args.jobs} process{'es' if args.jobs > 1 else ''}"
    print(f"snip.formats.warm: compiling the quantizer kernels into numba's cache ({procs}; "
          "minutes the first time)", flush=True)
    t = time.perf_counter()
    n = warm_parallel(args.jobs)
    seconds = time.perf_counter() - t
    print(f"snip.formats.warm: {n} quantizer calls, kernels in numba's cache ({seconds:.0f} s)")


if __name__ == "__main__":
    main()
