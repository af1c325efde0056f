"""Element casts against ml_dtypes, bit for bit, and fast path against the float64 reference."""

import ml_dtypes
import numpy as np
import pytest
import torch

import snip
from snip.formats import ELEMENTS, cast, cast_reference, code_table, get_element

ML = {
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "e3m2": ml_dtypes.float6_e3m2fn,
    "e2m3": ml_dtypes.float6_e2m3fn,
    "e2m1": ml_dtypes.float4_e2m1fn,
    "bf16": ml_dtypes.bfloat16,
    "fp16": np.float16,
    "fp32": np.float32,
}


def all_bf16() -> torch.Tensor:
    return (
        torch.arange(-(2**15), 2**15, dtype=torch.int32)
        .to(torch.int16)
        .view(torch.bfloat16)
        .float()
    )


def all_fp16() -> torch.Tensor:
    return (
        torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    )


def edge_cases(name: str) -> torch.Tensor:
    """Named fp32 edge cases for one format: every grid value, every tie, both neighbours of
    every tie, subnormal boundaries, max, overflow thresholds, +-0, +-inf, NaN."""
    fmt = get_element(name)
    if fmt.bits <= 8:
        grid = code_table(fmt).double()
    else:  # bf16 / fp16 / fp32: grid values from the exhaustive patterns (fp32: a sample)
        grid = (all_bf16() if name in ("bf16", "fp32") else all_fp16()).double()
    grid = torch.unique(grid[torch.isfinite(grid)])
    mids = (grid[1:] + grid[:-1]) / 2  # ties; exact in fp32 for all these formats
    top = torch.tensor(
        [
            fmt.max_normal,
            fmt.max_normal * (1 + 2.0 ** -(fmt.mbits + 1)),
            fmt.min_subnormal / 2,
            fmt.min_subnormal,
            fmt.min_normal,
        ]
    )
    base = torch.cat([grid, mids, top, -top]).float()
    base = base[torch.isfinite(base)]
    up = torch.nextafter(base, torch.full_like(base, float("inf")))
    down = torch.nextafter(base, torch.full_like(base, float("-inf")))
    special = torch.tensor(
        [
            0.0,
            -0.0,
            float("inf"),
            float("-inf"),
            float("nan"),
            3.4028235e38,
            -3.4028235e38,
            1e-45,
            -1e-45,
        ]
    )
    return torch.cat([base, up, down, special])


def expected_ml(x: torch.Tensor, name: str, saturate: bool) -> torch.Tensor:
    fmt = get_element(name)
    a = x.numpy()
    if saturate:
        a = np.where(np.isnan(a), a, np.clip(a, -fmt.max_normal, fmt.max_normal)).astype(np.float32)
    return torch.from_numpy(a.astype(ML[name]).astype(np.float32))


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor) -> None:
    nan_in = torch.isnan(x)
    assert torch.isnan(got[nan_in]).all(), "NaN in must give NaN out"
    g, w = got[~nan_in], want[~nan_in]
    both_nan = torch.isnan(g) & torch.isnan(w)
    same = (g.view(torch.int32) == w.view(torch.int32)) | both_nan
    if not same.all():
        i = torch.nonzero(~same)[:5, 0]
        raise AssertionError(
            f"mismatch at x={x[~nan_in][i].tolist()}: got {g[i].tolist()}, want {w[i].tolist()}"
        )


@pytest.mark.parametrize("saturate", [False, True])
@pytest.mark.parametrize("name", list(ML))
@pytest.mark.parametrize("source", ["bf16", "fp16", "edges"])
def test_rne_matches_ml_dtypes(name, saturate, source):
    x = {"bf16": all_bf16, "fp16": all_fp16}.get(source, lambda: edge_cases(name))()
    want = expected_ml(x, name, saturate)
    assert_bits_equal(cast(x, name, "rne", saturate=saturate), want, x)
    assert_bits_equal(cast_reference(x, name, "rne", saturate=saturate), want, x)


@pytest.mark.parametrize("name", list(ELEMENTS))
@pytest.mark.parametrize("saturate", [False, True])
def test_fast_equals_reference(name, saturate):
    x = torch.cat([all_bf16(), edge_cases("e4m3"), torch.randn(4096) * 10])
    for rounding in ("rne", "stochastic"):
        fast = cast(x, name, rounding, saturate=saturate, generator=7)
        ref = cast_reference(x, name, rounding, saturate=saturate, generator=7)
        assert_bits_equal(fast, ref, x)


def test_integer_formats():
    x = torch.tensor([0.4, 0.5, 1.5, 2.5, -2.5, 126.6, 200.0, -300.0, float("inf"), -0.0])
    assert cast(x, "int8").tolist() == [0, 0, 2, 2, -2, 127, 127, -127, 127, 0]
    assert cast(x, "int4").tolist() == [0, 0, 2, 2, -2, 7, 7, -7, 7, 0]
    # mxint8: 1 sign, 1 integer, 6 fraction bits, symmetric: max 127/64
    assert cast(torch.tensor([1.0 / 128, 3.0 / 128, 5.0]), "mxint8").tolist() == [
        0.0,
        2 / 64,
        127 / 64,
    ]
    assert torch.isnan(cast(torch.tensor([float("nan")]), "int8")).all()


def test_dtype_and_shape_preserved():
    x = torch.randn(3, 5, 7, dtype=torch.bfloat16)
    y = cast(x, "e2m1")
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    assert torch.equal(y.float(), cast(x.float(), "e2m1"))
    x64 = torch.randn(100, dtype=torch.float64)
    assert cast(x64, "e4m3").dtype == torch.float64
    assert torch.equal(cast(x64, "e4m3"), cast_reference(x64, "e4m3"))


def test_e2m1_ties_alternate():
    # RNE midpoints go to the even code: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 100.0])
    assert cast(x, "e2m1").tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0]
    assert cast(-x, "e2m1").tolist() == [-0.0, -1.0, -1.0, -2.0, -2.0, -4.0, -4.0, -6.0, -6.0]


def test_e4m3_overflow_policy():
    x = torch.tensor([448.0, 463.99, 464.0, 465.0, 1e6, float("inf")])
    assert cast(x, "e4m3").tolist() == [448.0] * 6
    got = cast(x, "e4m3", saturate=False)
    assert got[:3].tolist() == [448.0] * 3 and torch.isnan(got[3:]).all()
    e5 = cast(torch.tensor([57344.0, 61440.0, 1e6]), "e5m2", saturate=False)
    assert e5.tolist() == [57344.0, float("inf"), float("inf")]


def test_generic_exmy_format():
    f = get_element("e3m4")
    assert f.bias == 3 and f.bits == 8
    x = all_bf16()
    want = torch.from_numpy(x.numpy().astype(ml_dtypes.float8_e3m4).astype(np.float32))
    finite = torch.isfinite(x) & (x.abs() <= 15.5)
    assert_bits_equal(cast(x[finite], "e3m4", saturate=False), want[finite], x[finite])


def test_cast_is_exported_at_top_level():
    assert snip.cast is cast


@pytest.mark.parametrize("saturate", [False, True])
@pytest.mark.parametrize("carrier", [torch.float16, torch.bfloat16])
def test_a_bf16_or_fp16_tensor_casts_to_every_format_as_ml_dtypes_does(carrier, saturate):
    """Every bit pattern of a bf16 or fp16 tensor, cast to each format in its own dtype: the
    ml_dtypes value, held in that dtype; saturation stops at the largest grid value the dtype
    holds where it cannot hold the format's max (bf16 in fp16: 65280; fp32 in bf16: the bf16
    max). fp32 and bf16 in a narrower dtype raised 'cannot be converted without overflow'."""
    from snip.formats.cast import saturation

    x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(carrier)
    for name in ML:
        got = cast(x, name, saturate=saturate)
        assert got.dtype == carrier
        want = expected_ml(x.float(), name, saturate)
        if saturate:
            top = saturation(get_element(name), carrier)
            want = torch.where(torch.isnan(want), want, want.clamp(-top, top))
        assert_bits_equal(got.float(), want.to(carrier).float(), x.float())
        if saturate:  # not circular: on the format's grid and within its max, whatever top is
            finite = got[torch.isfinite(got)].float()
            assert finite.abs().max() <= get_element(name).max_normal
            assert torch.equal(cast(finite, name), finite)
    assert saturation(get_element("bf16"), torch.float16) == 65280.0
    assert saturation(get_element("fp16"), torch.bfloat16) == 65280.0  # (65504 is not bf16)
    assert saturation(get_element("fp32"), torch.bfloat16) == torch.finfo(torch.bfloat16).max
    assert saturation(get_element("e4m3"), torch.float16) == 448.0


def test_cast_carries_no_gradient():
    """Its values are data (snip.quantize is the differentiable one): e2m1 gave a gradient
    pattern of 0s and 1s, e4m3 all 1s."""
    x = torch.tensor([0.1, 0.3, 7.0, -0.2, -3.0], requires_grad=True)
    for name in ("e2m1", "e4m3", "bf16", "fp32"):
        assert not cast(x, name).requires_grad
