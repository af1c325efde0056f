"""Numerics anchors from research/landscape.md section 6.1 (anchor_numerics_check.py output).

Measured here (fixed seed, 4096 x 4096 Gaussian): NVFP4 RTN relative MSE 9.04e-3 (3.39 effective
bits), MXFP4 (OCP floor) 13.2e-3, MXFP4 rceil 13.3e-3, NVFP4 stochastic ~18.9e-3.
"""

import pytest
import torch

from snip.formats import E8M0Rule, quantize, replace_spec


# Tolerances: the anchors were measured on a 4096^2 draw by research/anchor_numerics_check.py;
# here a 1024^2 draw (another sample of the same Gaussian) gives the same relative MSE to its
# sampling error, ~1/sqrt(2^20 / 16) ~ 0.4% per block statistic, so 2% (3% for the noisier SR and
# 2-D blocks) says "the same algorithm"; the quantization itself is bit-exact on every CPU.
def rel_mse(preset, **kw) -> float:
    x = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(0))
    return ((quantize(x, preset, **kw) - x).pow(2).mean() / x.pow(2).mean()).item()


def test_nvfp4_anchor():
    assert rel_mse("nvfp4") == pytest.approx(9.04e-3, rel=0.02)


def test_mxfp4_anchor():
    assert rel_mse("mxfp4") == pytest.approx(13.22e-3, rel=0.02)
    rceil = replace_spec("mxfp4", name="mxfp4_rceil", e8m0_rule=E8M0Rule.RCEIL)
    assert rel_mse(rceil) == pytest.approx(13.32e-3, rel=0.02)


def test_nvfp4_stochastic_anchor():
    # generator seed != data seed: torch.rand and torch.randn from one seed share a stream
    assert rel_mse("nvfp4", rounding="stochastic", generator=1) == pytest.approx(18.86e-3, rel=0.03)


def test_nvfp4_2d_anchor():
    from snip.formats import get_spec

    assert rel_mse(get_spec("nvfp4").for_weight()) == pytest.approx(12.40e-3, rel=0.03)
