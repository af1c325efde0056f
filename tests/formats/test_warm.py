"""``python -m snip.formats.warm`` (run by ``make setup``) must reach every parallel kernel of
:mod:`snip.formats.fast` with every input and output dtype a run uses: a kernel it misses is
compiled (tens of seconds) by the first training process that needs it."""

import numpy as np
import pytest

from snip.formats import fast, warm

pytestmark = pytest.mark.skipif("not fast.enabled()",
                                reason="fast path off (numba not installed or SNIP_FAST=0)")

FUSED = ("_fused_rows", "_fused_cols", "_fused_short_rows", "_fused_tiles")


def test_warm_reaches_every_parallel_kernel_with_each_dtype(monkeypatch) -> None:
    kernels = {name: v for name, v in vars(fast).items()
               if hasattr(v, "py_func") and v.targetoptions.get("parallel")}
    assert set(FUSED) <= set(kernels)
    seen: set[tuple[str, str, str]] = set()
    for name, real in kernels.items():
        def wrapper(*args, _name=name, _real=real):
            arrays = [a for a in args if isinstance(a, np.ndarray)]
            seen.add((_name, str(arrays[0].dtype), str(arrays[1].dtype) if len(arrays) > 1
                      else ""))
            if _name == "_fused_rows":  # kt: a compile-time block size (16, 32) or none
                seen.add((_name, "kt", str(len(args[5]))))
            return _real(*args)
        monkeypatch.setattr(fast, name, wrapper)
    fast._PLANS.clear()  # the plans bind the kernels when made
    assert warm.warm() > 0
    fast._PLANS.clear()
    called = {s[0] for s in seen}
    assert called == set(kernels), f"warm misses {set(kernels) - called}"
    for name in ("_fused_rows", "_fused_cols", "_fused_short_rows"):  # fp32 / bf16 (uint16)
        for io in (("float32", "float32"), ("float32", "uint16"), ("uint16", "uint16")):
            assert (name, *io) in seen, (name, io)
    assert {("_fused_rows", "kt", n) for n in ("0", "16", "32")} <= seen
    assert ("_bf16_rows", "uint32", "uint16") in seen and ("_bf16_rows", "uint32", "uint32") in seen
