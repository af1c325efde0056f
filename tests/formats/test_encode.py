"""Real packed storage: round trip, byte layout, storage cost.

Tolerances: every ``approx`` here compares float64 arithmetic on the same numbers summed in
another order (an ILP's objective against brute force's, a fraction of integer FLOPs, a JSON
round trip); Python floats round the same on every CPU, so ``rel=1e-9`` (or approx's default
1e-6) is millions of times wider than the ~n x 2^-53 such a sum can differ by."""

import pytest
import torch

from snip.formats import PRESETS, code_table, encode, get_element, pack, quantize, unpack


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("shape,axis", [((64, 96), -1), ((33, 70), 0), ((2, 5, 48), 1), ((7,), 0)])
def test_dequantize_equals_quantize(preset, shape, axis, dtype):
    """Bit for bit, float64 too (nvfp4's scale products were rounded to fp32 in dequantize,
    exact in quantize: 2e-7 apart)."""
    x = torch.randn(shape, dtype=dtype) * 3
    q = encode(x, preset, axis=axis)
    assert torch.equal(q.dequantize(), quantize(x, preset, axis=axis))
    assert q.codes.dtype == torch.uint8


def test_weight_2d_spec_round_trip():
    from snip.formats import get_spec

    w = torch.randn(130, 260)
    for name in ("nvfp4", "fp4_e2m1_tile128"):
        spec = get_spec(name).for_weight()
        assert torch.equal(encode(w, spec).dequantize(), quantize(w, spec))


def test_fp4_byte_layout_by_hand():
    # e2m1 codes: 0.5 -> 0x1, 1.0 -> 0x2, -6 -> 0xF, 0 -> 0x0, 3 -> 0x5, -0.5 -> 0x9
    x = torch.tensor([[0.5, 1.0, -6.0, 0.0, 3.0, -0.5] + [0.0] * 26])
    q = encode(x, "mxfp4")  # amax 6 -> e8m0 scale 2^0 (biased 127)
    assert q.scales.tolist() == [127]
    assert q.codes[:3].tolist() == [0x21, 0x0F, 0x95]  # even element in the low nibble


def test_code_tables_match_formats():
    assert code_table(get_element("e2m1"))[:8].tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    e4 = code_table(get_element("e4m3"))
    assert e4[0x7E] == 448 and torch.isnan(e4[0x7F]) and e4[0x01] == 2.0**-9
    e5 = code_table(get_element("e5m2"))
    assert e5[0x7B] == 57344 and e5[0x7C] == float("inf") and torch.isnan(e5[0x7D])


@pytest.mark.parametrize("bits", [4, 6, 8])
def test_pack_unpack_inverse(bits):
    codes = torch.randint(0, 2**bits, (1001,), dtype=torch.uint8)
    packed = pack(codes, bits)
    assert packed.numel() == {4: 501, 6: 753, 8: 1001}[bits]
    assert torch.equal(unpack(packed, bits, 1001), codes)


def test_storage_cost_is_what_the_format_promises():
    x = torch.randn(256, 1024)
    n = x.numel()
    assert encode(x, "mxfp4").bits_per_element == pytest.approx(4.25)
    assert encode(x, "nvfp4").bits_per_element == pytest.approx(4.5 + 32 / n)
    assert encode(x, "fp8_e4m3").bits_per_element == pytest.approx(8 + 32 / n)
    assert encode(x, "mxfp6_e3m2").bits_per_element == pytest.approx(6.25)
    assert encode(x, "mxfp8_e4m3").bits_per_element == pytest.approx(8.25)
    assert encode(x, "bf16").bits_per_element == 16


def test_nan_survives_encoding():
    x = torch.randn(2, 32)
    x[1, 0] = float("nan")
    y = encode(x, "mxfp4").dequantize()
    assert torch.isnan(y[1]).all() and torch.isfinite(y[0]).all()
    z = encode(x, "nvfp4").dequantize()
    assert torch.isnan(z[1, :16]).all() and torch.isfinite(z[1, 16:]).all()
    torch.testing.assert_close(z, quantize(x, "nvfp4"), rtol=0, atol=0, equal_nan=True)
