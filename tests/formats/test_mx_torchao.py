"""MX presets against torchao's reference ``to_mx`` + ``to_dtype`` (FLOOR scale mode), bit for bit.

Known, deliberate difference: for blocks whose amax is below ~2^-125 torchao quantizes with a
scale clamped to 2^-126 but dequantizes with 2^-127 (its e8m0 byte 0), halving those values; we
use 2^-127 both ways.  The inputs below stay above that range (see test_tiny_blocks_documented).
"""

import pytest
import torch

pytest.importorskip("torchao")
from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx  # noqa: E402

from snip.formats import quantize  # noqa: E402

ELEM = {
    "mxfp8_e4m3": torch.float8_e4m3fn,
    "mxfp8_e5m2": torch.float8_e5m2,
    "mxfp6_e3m2": "fp6_e3m2",
    "mxfp6_e2m3": "fp6_e2m3",
    "mxfp4": torch.float4_e2m1fn_x2,
}


def torchao_fake_quant(x: torch.Tensor, elem) -> torch.Tensor:
    scale, data = to_mx(x, elem, 32)
    return to_dtype(data, scale, elem, 32, torch.float32)


def adversarial(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rows = [
        torch.randn(8, 256, generator=g),
        torch.randn(8, 256, generator=g)
        * torch.logspace(-20, 20, 256).view(1, -1),  # varied blocks
        torch.zeros(2, 256),  # zero blocks
        torch.randn(4, 256, generator=g).sign() * 7.999,  # amax mantissa all ones
        torch.randint(-12, 13, (4, 256), generator=g).float() / 4,  # many exact ties
        (torch.randn(4, 256, generator=g) * 1e-3).where(
            torch.rand(4, 256, generator=g) < 0.9, torch.full((4, 256), 1e3)
        ),  # huge dynamic range
        -torch.zeros(1, 256),
    ]
    return torch.cat(rows)


@pytest.mark.parametrize("preset", list(ELEM))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mx_equals_torchao(preset, seed):
    x = adversarial(seed)
    want = torchao_fake_quant(x, ELEM[preset])
    got = quantize(x, preset)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))  # bit for bit, -0 too


def test_mx_bf16_input_equals_torchao():
    x = torch.randn(16, 128).bfloat16()
    want = torchao_fake_quant(x, torch.float4_e2m1fn_x2)
    assert torch.equal(quantize(x.float(), "mxfp4"), want)


def test_tiny_blocks_documented():
    """torchao halves blocks with amax < 2^-125 (scale clamp asymmetry); we keep them exact."""
    x = torch.full(
        (1, 32), 1.5 * 2.0**-126
    )  # e8m0 scale 2^-127, element 3.0: exactly representable
    assert torch.equal(quantize(x, "mxfp4"), x)
    assert torch.equal(torchao_fake_quant(x, torch.float4_e2m1fn_x2), x / 2)
