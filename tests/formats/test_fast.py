"""The fused numba path is bit-identical to the PyTorch path (which the other tests pin)."""

import pytest
import torch

from snip.formats import PRESETS, Scaling, encode, fast, get_spec, quantize

pytestmark = pytest.mark.skipif("not fast.enabled()",
                                reason="fast path off (numba not installed or SNIP_FAST=0)")

BLOCKED = [n for n, s in PRESETS.items() if s.scaling is not Scaling.NONE]


def inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 256, generator=g) * torch.logspace(-8, 8, 256)
    x[3, :40] = 0.0
    x[5, 7] = float("nan")
    x[6, 9] = float("inf")
    x[7] = torch.randint(-24, 25, (256,), generator=g) / 4  # ties
    x[8, :] = 1e-41  # fp32 subnormals
    return [x, torch.randn(3, 5, 70, generator=g), torch.randn(2, 16384, generator=g)]


def both_paths(fn, monkeypatch):
    fast_out = fn()
    monkeypatch.setattr(fast, "enabled", lambda: False)
    slow_out = fn()
    monkeypatch.undo()
    return fast_out, slow_out


@pytest.mark.parametrize("preset", BLOCKED)
@pytest.mark.parametrize("rounding", ["rne", "stochastic"])
def test_fast_equals_torch_path(preset, rounding, monkeypatch):
    for x in inputs():
        for axis in (-1, 0):
            a, b = both_paths(
                lambda x=x, axis=axis: quantize(
                    x, preset, axis=axis, rounding=rounding, generator=3
                ),
                monkeypatch,
            )
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("preset", ["mxfp4", "nvfp4", "fp8_e4m3", "mxint8"])
def test_fast_encode_equals_torch_path(preset, monkeypatch):
    x = inputs()[1]
    a, b = both_paths(lambda: encode(x, preset), monkeypatch)
    assert torch.equal(a.codes, b.codes) and torch.equal(
        a.scales.view(torch.uint8), b.scales.view(torch.uint8)
    )


def test_weight_tiles_fast(monkeypatch):
    w = torch.randn(200, 300)
    spec = get_spec("fp4_e2m1_tile128").for_weight()
    a, b = both_paths(lambda: quantize(w, spec), monkeypatch)
    assert torch.equal(a, b)


def test_kernels_leave_torch_thread_count_alone():
    """numba's OpenMP launch resets omp threads; the fast path must restore torch's setting.
    A fresh process, because the launch happens once per process."""
    import subprocess
    import sys

    code = ("import torch, snip; torch.set_num_threads(1); "
            "snip.quantize(torch.randn(64, 64), 'mxfp4'); print(torch.get_num_threads())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"
