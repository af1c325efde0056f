"""NVFP4's tensor amax kept on an activation for its other axis (issue 21): the second call
skips the pass that would compute it and changes no bit, and nothing stale or layout-bound is
ever reused (an in-place write, a NaN/inf, a caller that did not vouch for the tensor)."""

import numpy as np
import pytest
import torch

from snip.formats import fast, get_spec, quantize

pytestmark = pytest.mark.skipif("not fast.enabled()",
                                reason="fast path off (numba not installed or SNIP_FAST=0)")

NV = get_spec("nvfp4")


def _reference(x: torch.Tensor, axis: int, rounding: str, monkeypatch) -> torch.Tensor:
    """The PyTorch path (``SNIP_FAST=0``), which computes every amax afresh."""
    with monkeypatch.context() as m:
        m.setattr(fast, "enabled", lambda: False)
        return quantize(x, NV, axis=axis, rounding=rounding, generator=7)


def _fused(x: torch.Tensor, axis: int, rounding: str) -> torch.Tensor:
    return fast.quantize_fused(x, NV, axis, fast.Rounding(rounding), 7, reuse_amax=True)


def _kept_is_the_amax(x: torch.Tensor) -> None:
    """What ``x`` keeps: its version, its amax and that amax's (``mul``, ``t_dec``)."""
    version, amax, mul, t_dec = getattr(x, fast._AMAX_ATTR)
    assert (version, amax) == (x._version, x.abs().max().item())
    assert (mul, t_dec) == fast._nvfp4_tensor_scale(amax, np.float32(6.0))


def _no_amax_pass(*args):
    raise AssertionError("the tensor amax was computed again")


@pytest.mark.parametrize("rounding", ["rne", "stochastic"])
def test_second_axis_takes_the_kept_amax(rounding, monkeypatch):
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(0)) * 3
    rows = _fused(x, -1, rounding)  # whole blocks of 16: block maxima and amax in one pass
    _kept_is_the_amax(x)
    monkeypatch.setattr(fast, "_clean_amax", _no_amax_pass)
    monkeypatch.setattr(fast, "_nvfp4_tensor_scale", _no_amax_pass)
    cols = _fused(x, 0, rounding)
    monkeypatch.undo()
    assert torch.equal(rows, _reference(x, -1, rounding, monkeypatch))
    assert torch.equal(cols, _reference(x, 0, rounding, monkeypatch))


def test_columns_first_keep_it_too(monkeypatch):
    """The column pass records the amax as well; the row pass needs its block maxima anyway
    and leaves the kept value as it is."""
    x = torch.randn(48, 64, generator=torch.Generator().manual_seed(1))
    cols = _fused(x, 0, "rne")
    kept = getattr(x, fast._AMAX_ATTR)
    rows = _fused(x, -1, "rne")
    assert getattr(x, fast._AMAX_ATTR) == kept
    _kept_is_the_amax(x)
    assert torch.equal(cols, _reference(x, 0, "rne", monkeypatch))
    assert torch.equal(rows, _reference(x, -1, "rne", monkeypatch))


def test_an_in_place_write_makes_it_stale(monkeypatch):
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(2))
    _fused(x, -1, "rne")
    x.mul_(3.0)  # bumps the version counter
    assert torch.equal(_fused(x, 0, "rne"), _reference(x, 0, "rne", monkeypatch))
    _kept_is_the_amax(x)


def test_nan_or_inf_is_never_kept(monkeypatch):
    """The amax of the blocks without NaN/inf depends on the blocks: an inf at (0, 0) hides the
    large (0, 5) from the row blocks but not from the column blocks."""
    x = torch.randn(32, 32, generator=torch.Generator().manual_seed(3))
    x[0, 0] = float("inf")
    x[0, 5] = 1000.0
    for first, second in ((-1, 0), (0, -1)):
        y = x.clone()
        a = _fused(y, first, "rne")
        assert not hasattr(y, fast._AMAX_ATTR)
        b = _fused(y, second, "rne")
        # bitwise (rtol = atol = 0; assert_close only so that NaN equals NaN): both paths do the
        # same IEEE fp32 operations per element, whatever the CPU's vector width
        torch.testing.assert_close(a, _reference(y, first, "rne", monkeypatch), rtol=0, atol=0,
                                   equal_nan=True)
        torch.testing.assert_close(b, _reference(y, second, "rne", monkeypatch), rtol=0,
                                   atol=0, equal_nan=True)


def test_kept_only_where_the_caller_vouches():
    x = torch.randn(32, 64)
    fast.quantize_fused(x, NV, -1, fast.Rounding.RNE, None)  # reuse_amax defaults to False
    fast.quantize_fused(x, get_spec("mxfp4"), -1, fast.Rounding.RNE, None, reuse_amax=True)
    assert not hasattr(x, fast._AMAX_ATTR)
    with torch.inference_mode():  # no version counter: nothing kept, no error
        y = torch.randn(32, 64)
        _fused(y, -1, "rne")
        assert not hasattr(y, fast._AMAX_ATTR)
