"""The pure-PyTorch quantizer (``SNIP_FAST=0``'s path) traces under ``torch.compile`` without a
graph break and gives the eager bits: Inductor's generated loops do the same IEEE operations
(``benchmarks/probe_compiled_quantizer.py`` times it against the numba kernels, RESULTS §7e)."""

import pytest
import torch

from snip.formats.quantize import _quantize


@pytest.mark.parametrize("preset", ["mxfp4", "nvfp4"])
def test_compiled_torch_path_equals_eager(preset, monkeypatch):
    monkeypatch.setenv("SNIP_FAST", "0")
    torch._dynamo.reset()
    x = torch.randn(64, 48, generator=torch.Generator().manual_seed(0))
    x[0, 0] = 2.0**-140  # a block whose scale needs a subnormal power of two: the where branch
    x[1, :32] = 2.0**-135

    def q(t: torch.Tensor) -> torch.Tensor:
        return _quantize(t, preset, -1, None, None)

    got = torch.compile(q, fullgraph=True, dynamic=False)(x)
    assert torch.equal(got.view(torch.int32), q(x).view(torch.int32))
