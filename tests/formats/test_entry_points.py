"""Entry-point contracts of cast / quantize / encode (issue 14), on the fast and reference paths.

* a tensor that requires grad: ``quantize`` uses a straight-through estimator on both paths;
* empty tensors: ``encode`` returns an empty QTensor like ``quantize`` returns an empty tensor;
* float64 is rounded exactly, once (never through float32 first);
* element formats whose values are not all float32 are refused with the supported range.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import snip
from snip.errors import UserError
from snip.formats import fast


@pytest.fixture(params=["fast", "reference"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "reference":
        monkeypatch.setattr(fast, "enabled", lambda: False)
    elif not fast.enabled():
        pytest.skip("numba fast path not available")
    return request.param


@pytest.mark.parametrize("spec", ["mxfp4", "nvfp4", "int8", "mxfp8_e4m3", "fp8_e4m3"])
def test_quantize_of_a_tensor_that_requires_grad(spec: str, path: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 64, requires_grad=True)
    y = snip.quantize(x, spec)
    assert y.requires_grad
    assert torch.equal(y.detach(), snip.quantize(x.detach(), spec))
    (y * torch.arange(64.0)).sum().backward()
    assert torch.equal(x.grad, torch.arange(64.0).expand(4, 64))  # straight through
    with torch.no_grad():
        assert not snip.quantize(x, spec).requires_grad
    assert torch.equal(snip.encode(x, spec).dequantize(), y.detach())


@pytest.mark.parametrize("spec", ["int8", "mxfp4", "nvfp4", "mxfp8_e4m3", "fp8_e4m3", "bf16"])
@pytest.mark.parametrize("shape", [(0,), (0, 32), (3, 0)])
def test_encode_of_empty_tensors(spec: str, shape: tuple[int, ...], path: str) -> None:
    x = torch.zeros(shape)
    q = snip.encode(x, spec)
    assert q.nbytes == 0
    out = q.dequantize()
    assert out.shape == shape and out.dtype == torch.float32
    assert snip.quantize(x, spec).shape == shape


def test_float64_is_rounded_once_exactly(path: str) -> None:
    x = torch.tensor([1 + 2**-11 + 2**-40], dtype=torch.float64)
    assert snip.cast(x, "fp16").item() == float(np.float64(x.item()).astype(np.float16))
    assert snip.cast(x, "fp16").item() == 1.0009765625
    x = torch.full((2, 32), 1.25 + 2**-40, dtype=torch.float64)
    x[:, 0] = 6.0  # scale 1: the e2m1 grid around 1.25 is {1, 1.5}; above the tie -> 1.5
    q = snip.quantize(x, "mxfp4")
    assert q.dtype == torch.float64 and q[0, 1].item() == 1.5
    assert torch.equal(snip.encode(x, "mxfp4").dequantize(), q)
    # float32 input is unaffected
    assert snip.quantize(x.float(), "mxfp4")[0, 1].item() == 1.0


@pytest.mark.parametrize("name", ["e9m9", "e8m24", "e8m3", "e12m3"])
def test_unrepresentable_element_formats_name_the_range(name: str) -> None:
    with pytest.raises(UserError, match="ebits must be 1..7 and mbits 0..23"):
        snip.cast(torch.ones(3), name)


@pytest.mark.parametrize("name", ["e7m16", "e1m0", "e5m10", "e3m2"])
def test_representable_generic_formats_still_work(name: str) -> None:
    x = torch.randn(100)
    assert torch.equal(snip.cast(x, name), snip.formats.cast_reference(x, name))
