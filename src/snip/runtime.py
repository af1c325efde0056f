"""Process-level tuning for CPU runs (called by the CLI and the benchmarks, never on import).

glibc serves every allocation above ~128 KiB-32 MiB with a fresh ``mmap`` and unmaps it on free,
so each large PyTorch temporary pays first-touch page faults again.  In the VMs this project runs
on that costs ~80 ms per 64 MiB tensor -- six times the memory-bandwidth cost of filling it.
Raising the mmap and trim thresholds keeps freed blocks in the heap for reuse, the same effect
users get from jemalloc/tcmalloc or ``MALLOC_MMAP_THRESHOLD_``.  Set ``SNIP_MALLOPT=0`` to skip.

The quantizers do not need it: :func:`snip.formats.quantize` makes one output allocation per
call from a cache of its own recycled buffers (:mod:`snip.formats.fast`), with no page faults
per call either way.  It still helps code that creates large torch temporaries every step (the
autograd graph, optimizer states), a little: in ``snip train``'s default run it removes a third
of the page faults and ~5 ms of system time per step (``benchmarks/bench_malloc.py``,
RESULTS.md section 1), so ``snip train`` keeps calling it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_done = False


def tune_malloc(threshold: int = 1 << 30) -> bool:
    """Keep large freed blocks for reuse (glibc only). Returns whether the setting took effect."""
    global _done
    if _done or os.environ.get("SNIP_MALLOPT", "1") == "0" or not sys.platform.startswith("linux"):
        return _done
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, threshold) == 1
        ok = ok and libc.mallopt(_M_TRIM_THRESHOLD, 2 * threshold) == 1
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        return False
    _done = ok
    return ok


def mem_available() -> int | None:
    """Bytes of memory free for a new allocation now (Linux ``MemAvailable``; None: unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
