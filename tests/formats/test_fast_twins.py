"""One-thread calls run each entry kernel's one-thread twin (``<name>_1t``: the same Python
function compiled without ``parallel=True``), which must give the parallel build's bits on every
kind of call, and be what one-thread calls actually run (issue 21)."""

import os
import subprocess
import sys

import pytest
import torch

from snip.formats import fast, quantize, warm

pytestmark = pytest.mark.skipif("not fast.enabled()",
                                reason="fast path off (numba not installed or SNIP_FAST=0)")

TWINS = ("_fused_rows", "_fused_short_rows", "_fused_cols", "_fused_tiles", "_clean_amax",
         "_tensor_amax", "_bf16_rows", "_rows_nvfp4", "_tiles_nvfp4")
# shapes of several parallel tasks each way (rows of 4096-element runs, 32-row column blocks,
# 128 x 128 tiles), and the warm-up's small shapes (one task)
SHAPES = ((256, 384), *warm.SHAPES)


def _calls():
    """Every kind of call the warm-up makes (every preset, weight tiles, both axes and
    roundings, each input/output dtype), at :data:`SHAPES`."""
    kinds = dict.fromkeys((s, a, r, i, o) for s, _, a, r, i, o in warm.calls())
    for spec, axis, rounding, dt_in, dt_out in kinds:
        for shape in SHAPES:
            yield spec, shape, axis, rounding, dt_in, dt_out


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


def _run(x, spec, axis, rounding, dt_out, *, twins: bool, threads: int, monkeypatch):
    monkeypatch.setattr(fast, "_TWINS", twins)
    monkeypatch.setattr(fast, "_PARALLEL_MIN", 0)  # (all threads from the first element)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return quantize(x, spec, axis=axis, rounding=rounding, generator=7, dtype=dt_out)
    finally:
        torch.set_num_threads(before)


def test_twins_give_the_parallel_builds_bits_on_every_kind_of_call(monkeypatch) -> None:
    """The twin on one thread against the parallel build on two threads (and on one, its
    region of one thread), bit for bit, NaN/inf included."""
    g = torch.Generator().manual_seed(3)
    n = 0
    for spec, shape, axis, rounding, dt_in, dt_out in _calls():
        x = (torch.randn(shape, generator=g) * 4).to(dt_in)
        x.view(-1)[5] = float("nan")
        x.view(-1)[-3] = float("inf")
        twin = _run(x, spec, axis, rounding, dt_out, twins=True, threads=1,
                    monkeypatch=monkeypatch)
        for threads in (2, 1):
            par = _run(x, spec, axis, rounding, dt_out, twins=False, threads=threads,
                       monkeypatch=monkeypatch)
            assert torch.equal(_bits(twin), _bits(par)), (spec.name, shape, axis, rounding)
        n += 1
    assert n > 500


@pytest.mark.parametrize("preset, kernel, axis", [
    ("mxfp4", "_fused_rows", -1), ("mxfp4", "_fused_cols", 0), ("bf16", "_bf16_rows", -1),
    ("nvfp4", "_rows_nvfp4", -1), ("nvfp4", "_clean_amax", 0), ("fp8_e4m3", "_tensor_amax", -1)])
def test_one_thread_calls_run_the_twin_and_more_threads_the_parallel_build(
        monkeypatch, preset, kernel, axis) -> None:
    """Which build runs: the twin on one thread; the parallel build on two threads, and on one
    thread with the twins off (``SNIP_SERIAL_KERNELS=0``)."""
    ran = []
    for name in (kernel, kernel + "_1t"):
        real = getattr(fast, name)
        monkeypatch.setattr(fast, name, lambda *a, real=real, name=name: ran.append(name)
                            or real(*a))
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(1))
    for twins, threads, want in ((True, 1, kernel + "_1t"), (True, 2, kernel),
                                 (False, 1, kernel)):
        ran.clear()
        _run(x, preset, axis, "rne", torch.float32, twins=twins, threads=threads,
             monkeypatch=monkeypatch)
        assert ran == [want], (twins, threads)


@pytest.mark.parametrize("preset", ["mxfp4", "nvfp4", "fp4_e2m1_tile128"])
def test_one_thread_column_calls_into_bf16_run_the_parallel_build(monkeypatch, preset) -> None:
    """The exception: a column call that writes bf16 runs the parallel build on one thread too
    (the column twin stored bf16 elements 1.9-24x slower, RESULTS §7an); one that writes fp32
    runs the twin.  Same bits either way (the test above)."""
    ran = []
    for name in ("_fused_cols", "_fused_cols_1t"):
        real = getattr(fast, name)
        monkeypatch.setattr(fast, name, lambda *a, real=real, name=name: ran.append(name)
                            or real(*a))
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(1))
    for dt_out, want in ((torch.bfloat16, "_fused_cols"), (torch.float32, "_fused_cols_1t")):
        for rounding in ("rne", "stochastic"):
            ran.clear()
            _run(x, preset, 0, rounding, dt_out, twins=True, threads=1, monkeypatch=monkeypatch)
            assert ran == [want], (dt_out, rounding)


def test_twins_are_serial_builds_under_names_of_their_own() -> None:
    """Not parallel; cached under ``<name>_1t`` (a cache file of the parallel build's name
    would be overwritten by it); NVFP4's compiled callers call the twins of their kernels."""
    for name in TWINS:
        twin, par = getattr(fast, name + "_1t"), getattr(fast, name)
        assert twin.py_func.__code__ is par.py_func.__code__
        assert twin.py_func.__qualname__ == name + "_1t"
        assert not twin.targetoptions.get("parallel")
        assert twin._cache.__class__.__name__ == "FunctionCache"
    for caller, inner in (("_rows_nvfp4", ("_fused_rows", "_block_max_bits")),
                          ("_tiles_nvfp4", ("_fused_tiles", "_tile_max_bits"))):
        scope = getattr(fast, caller + "_1t").py_func.__globals__
        for name in inner:
            assert not scope[name].targetoptions.get("parallel"), (caller, name)
            assert scope[name].py_func.__qualname__ == name + "_1t"
        assert fast._rows_nvfp4.py_func.__globals__["_fused_rows"] is fast._fused_rows


def test_serial_kernels_env_turns_the_twins_off() -> None:
    code = "from snip.formats import fast; print(fast._TWINS)"
    for value, want in ((None, "True"), ("0", "False")):
        env = {k: v for k, v in os.environ.items() if k != "SNIP_SERIAL_KERNELS"}
        if value is not None:
            env["SNIP_SERIAL_KERNELS"] = value
        out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                             capture_output=True, text=True)
        assert out.stdout.strip() == want


@pytest.mark.parametrize("preset", ["bf16", "fp8_e4m3", "mxfp4", "nvfp4", "fp4_e2m1_tile128"])
def test_a_one_thread_layer_step_runs_only_twins(monkeypatch, preset) -> None:
    """Every quantizer call of a layer's forward and backward on one thread (rows, columns,
    weight tiles, tensor and NVFP4 amax passes, short 1x128 rows, the bf16 rounding) runs a
    twin, never a parallel build."""
    from snip.nn import GemmConfig, GemmSpecs, quantized_linear

    ran = []
    for name in TWINS:
        for build in (name, name + "_1t"):
            real = getattr(fast, build)
            monkeypatch.setattr(fast, build, lambda *a, real=real, build=build:
                                ran.append(build) or real(*a))
    monkeypatch.setattr(fast, "_TWINS", True)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(4, 32, 64, generator=g, requires_grad=True)
    w = torch.randn(48, 64, generator=g, requires_grad=True)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        y = quantized_linear(x, w, None, GemmConfig(specs=GemmSpecs.uniform(preset), seed=2,
                                                    step=1))
        y.backward(torch.randn(y.shape, generator=g))
    finally:
        torch.set_num_threads(before)
    assert ran and all(r.endswith("_1t") for r in ran), ran
