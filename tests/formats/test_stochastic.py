"""Stochastic rounding: unbiased, error of the mean shrinks like 1/sqrt(n), reproducible by seed."""

import pytest
import torch

from snip.formats import cast, quantize


@pytest.mark.parametrize("element", ["e2m1", "e4m3", "e5m2", "e3m2", "int4", "bf16"])
def test_unbiased_and_sqrt_n(element):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(512, generator=g) * 3 + 0.1  # inside every format's range
    errs = []
    for n in (16, 256, 4096):
        draws = cast(x.expand(n, -1).contiguous(), element, "stochastic", generator=n)
        errs.append((draws.mean(0) - x).pow(2).mean().sqrt().item())
    assert errs[0] > 0, errs  # x has bits below every format's grid: one draw must round
    # 16x more samples -> 4x smaller RMS error of the mean (allow 2.5x..6.5x for noise)
    for a, b in zip(errs, errs[1:], strict=False):
        assert 2.5 < a / b < 6.5, errs


def test_mean_converges_to_value():
    x = torch.full((200_000,), 0.3)  # between e2m1 codes 0 and 0.5: P(0.5) = 0.6
    y = cast(x, "e2m1", "stochastic", generator=3)
    assert set(y.unique().tolist()) == {0.0, 0.5}
    assert abs(y.mean().item() - 0.3) < 4 * (0.25 * 0.24 / 200_000) ** 0.5 * 2


def test_seed_reproducible_and_different():
    x = torch.randn(1000)
    a = cast(x, "e2m1", "stochastic", generator=5)
    b = cast(x, "e2m1", "stochastic", generator=torch.Generator().manual_seed(5))
    c = cast(x, "e2m1", "stochastic", generator=6)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_grid_values_are_fixed_points():
    x = torch.tensor([0.0, 0.5, -1.5, 6.0, -6.0])
    assert torch.equal(cast(x, "e2m1", "stochastic", generator=1), x)


def test_stochastic_block_quantization_is_unbiased():
    x = torch.randn(64, 64)
    mean = torch.stack(
        [quantize(x, "nvfp4", rounding="stochastic", generator=s) for s in range(64)]
    ).mean(0)
    rne = quantize(x, "nvfp4")
    assert (mean - x).pow(2).mean() < (rne - x).pow(2).mean() / 4
